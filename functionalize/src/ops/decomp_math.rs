//! More composite ops, as ATen's own decompositions (`torch/_decomp`,
//! `torch/_refs`) compute them: elementwise math (`logaddexp`, `addcmul`,
//! `fmax`, `isclose`, ...), reductions that return several results
//! (`var_mean`, `aminmax`, `cummax`, `kthvalue`), products with an addend
//! (`addmv`, `addr`, `addbmm`), losses (`cross_entropy_loss`,
//! `nll_loss`), factories (`linspace`, `logspace`), and shapes
//! (`broadcast_tensors`, `diag`, `diag_embed`, `cross`, max pooling
//! back and forth). Each checks what eager checks first, naming the op.

use super::args::ArgsExt;
use crate::dtype::DType;
use crate::id::ValueId;
use crate::rule::{float, int, ints, t, Emit, R};
use crate::schema::Arg;

type A = [Arg<ValueId>];
type Out = R<Vec<ValueId>>;

fn one(v: ValueId) -> Out {
    Ok(vec![v])
}

fn usizes(v: &[usize]) -> Arg<ValueId> {
    Arg::IntList(v.iter().map(|&x| x as i64).collect())
}

fn floats(e: &dyn Emit, v: ValueId, op: &str) -> R<()> {
    match e.dtype(v) {
        DType::F32 | DType::F16 => Ok(()),
        d => Err(format!(
            "{op} of {} is not supported (floats are)",
            d.name()
        )),
    }
}

/// `alpha * v` (`v` itself for 1).
fn scaled(e: &mut dyn Emit, v: ValueId, alpha: &Arg<ValueId>) -> R<ValueId> {
    match alpha {
        Arg::Int(1) | Arg::None => Ok(v),
        Arg::Float(x) if *x == 1.0 => Ok(v),
        a => e.call("mul", vec![t(v), a.clone()]),
    }
}

// ------------------------------------------------------------ elementwise

/// `logaddexp(a, b)`: `max + log1p(exp(-|a - b|))`; equal infinities give
/// themselves. `logaddexp2` in base 2.
pub fn logaddexp(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    logaddexp_base(e, a, false)
}

pub fn logaddexp2(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    logaddexp_base(e, a, true)
}

fn logaddexp_base(e: &mut dyn Emit, a: &A, two: bool) -> Out {
    let (x, y) = (*a.tensor(0)?, *a.tensor(1)?);
    floats(e, x, "logaddexp")?;
    let m = e.call("maximum", vec![t(x), t(y)])?;
    let d = e.call("sub", vec![t(x), t(y)])?;
    let ad = e.call("abs", vec![t(d)])?;
    let nd = e.call("neg", vec![t(ad)])?;
    let r = if two {
        // log2(1 + 2^-|d|)
        let p = e.call("mul", vec![t(nd), float(std::f64::consts::LN_2)])?;
        let ex = e.call("exp", vec![t(p)])?;
        let l = e.call("log1p", vec![t(ex)])?;
        e.call("div", vec![t(l), float(std::f64::consts::LN_2)])?
    } else {
        let ex = e.call("exp", vec![t(nd)])?;
        e.call("log1p", vec![t(ex)])?
    };
    let s = e.call("add", vec![t(m), t(r)])?;
    // Equal infinities: the difference is NaN, the answer the infinity.
    let inf = e.call("isinf", vec![t(m)])?;
    let same = e.call("eq", vec![t(x), t(y)])?;
    let both = e.call("logical_and", vec![t(inf), t(same)])?;
    one(e.call("where", vec![t(both), t(m), t(s)])?)
}

/// `addcmul(self, t1, t2, value)`: `self + value * t1 * t2`;
/// `addcdiv`: `self + value * t1 / t2`.
pub fn addcmul(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let p = e.call("mul", vec![a[1].clone(), a[2].clone()])?;
    let p = scaled(e, p, &a[3])?;
    one(e.call("add", vec![a[0].clone(), t(p)])?)
}

pub fn addcdiv(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let p = e.call("div", vec![a[1].clone(), a[2].clone()])?;
    let p = scaled(e, p, &a[3])?;
    one(e.call("add", vec![a[0].clone(), t(p)])?)
}

/// `fmax` / `fmin`: the larger / smaller, a NaN losing to a number.
pub fn fmax(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    nan_ignoring(e, a, "maximum")
}

pub fn fmin(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    nan_ignoring(e, a, "minimum")
}

fn nan_ignoring(e: &mut dyn Emit, a: &A, op: &str) -> Out {
    let (x, y) = (*a.tensor(0)?, *a.tensor(1)?);
    let m = e.call(op, vec![t(x), t(y)])?;
    if !e.dtype(m).is_float() {
        return one(m);
    }
    let xn = e.call("isnan", vec![t(x)])?;
    let yn = e.call("isnan", vec![t(y)])?;
    let r = e.call("where", vec![t(yn), t(x), t(m)])?;
    one(e.call("where", vec![t(xn), t(y), t(r)])?)
}

/// `heaviside(self, values)`: 0 below zero, 1 above, `values` at zero.
pub fn heaviside(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let (x, v) = (*a.tensor(0)?, *a.tensor(1)?);
    let pos = e.call("gt", vec![t(x), int(0)])?;
    let pos = e.cast(pos, e.dtype(x))?;
    let z = e.call("eq", vec![t(x), int(0)])?;
    one(e.call("where", vec![t(z), t(v), t(pos)])?)
}

/// `isclose(self, other, rtol, atol, equal_nan)`: `|a - b| <= atol + rtol
/// |b|`, or equal (infinities), or both NaN with `equal_nan`.
pub fn isclose(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let (x, y) = (*a.tensor(0)?, *a.tensor(1)?);
    let (rtol, atol, eq_nan) = (a.float(2)?, a.float(3)?, a.bool(4)?);
    let same = e.call("eq", vec![t(x), t(y)])?;
    if !e.dtype(x).is_float() {
        return one(same);
    }
    let d = e.call("sub", vec![t(x), t(y)])?;
    let d = e.call("abs", vec![t(d)])?;
    let ay = e.call("abs", vec![t(y)])?;
    let tol = e.call("mul", vec![t(ay), float(rtol)])?;
    let tol = e.call("add", vec![t(tol), float(atol)])?;
    let close = e.call("le", vec![t(d), t(tol)])?;
    let fin = e.call("isfinite", vec![t(d)])?;
    let close = e.call("logical_and", vec![t(close), t(fin)])?;
    let mut r = e.call("logical_or", vec![t(close), t(same)])?;
    if eq_nan {
        let xn = e.call("isnan", vec![t(x)])?;
        let yn = e.call("isnan", vec![t(y)])?;
        let both = e.call("logical_and", vec![t(xn), t(yn)])?;
        r = e.call("logical_or", vec![t(r), t(both)])?;
    }
    one(r)
}

/// `ldexp(self, other)`: `self * 2^other`.
pub fn ldexp(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let (x, y) = (*a.tensor(0)?, *a.tensor(1)?);
    let p = e.call("pow", vec![float(2.0), t(y)])?;
    one(e.call("mul", vec![t(x), t(p)])?)
}

// ------------------------------------------------------------ products

/// `addmv(self, mat, vec, beta, alpha)`: `beta self + alpha mat @ vec`;
/// `addr(self, v1, v2, beta, alpha)` with the outer product;
/// `addbmm(self, b1, b2, beta, alpha)` with the batch's products summed.
pub fn addmv(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let p = e.call("matmul", vec![a[1].clone(), a[2].clone()])?;
    with_addend(e, a, p)
}

pub fn addr(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let (v1, v2) = (*a.tensor(1)?, *a.tensor(2)?);
    for (v, name) in [(v1, "vec1"), (v2, "vec2")] {
        if e.rank(v) != 1 {
            return Err(format!(
                "addr: Expected 1-D argument {name}, but got {}-D",
                e.rank(v)
            ));
        }
    }
    let c = e.call("unsqueeze", vec![t(v1), int(1)])?;
    let r = e.call("unsqueeze", vec![t(v2), int(0)])?;
    let p = e.call("mul", vec![t(c), t(r)])?;
    with_addend(e, a, p)
}

pub fn addbmm(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let p = e.call("bmm", vec![a[1].clone(), a[2].clone()])?;
    let p = e.call("sum", vec![t(p), ints(&[0])])?;
    with_addend(e, a, p)
}

/// `beta self + alpha p` (arguments 3 and 4); `beta = 0` ignores `self`
/// (NaN included), as eager does.
fn with_addend(e: &mut dyn Emit, a: &A, p: ValueId) -> Out {
    let p = scaled(e, p, &a[4])?;
    let beta = a.opt_scalar(3)?.map_or(1.0, |s| s.to_f64());
    if beta == 0.0 {
        let ps = e.sizes(p);
        let s = e.sizes(*a.tensor(0)?);
        let full = crate::meta::broadcast_shapes(&s, &ps)?;
        return one(e
            .expand(p, &full)
            .and_then(|v| e.call("clone", vec![t(v)]))?);
    }
    let s = scaled(e, *a.tensor(0)?, &a[3])?;
    one(e.call("add", vec![t(s), t(p)])?)
}

// ------------------------------------------------------------ reductions

/// `var_mean` / `std_mean(self, dim, *, correction, keepdim)`: both.
pub fn var_mean(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    moments(e, a, "var")
}

pub fn std_mean(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    moments(e, a, "std")
}

fn moments(e: &mut dyn Emit, a: &A, op: &str) -> Out {
    let x = *a.tensor(0)?;
    let v = e.call(op, vec![t(x), a[1].clone(), a[2].clone(), a[3].clone()])?;
    let dims = match a.opt_int_list(1)? {
        Some(d) => ints(d),
        None => ints(&[]),
    };
    let m = e.call("mean", vec![t(x), dims, a[3].clone()])?;
    Ok(vec![v, m])
}

/// `aminmax(self, dim, keepdim)`: the smallest and the largest.
pub fn aminmax(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let x = *a.tensor(0)?;
    let dims = match a.get(1) {
        Some(Arg::Int(d)) => ints(&[*d]),
        _ => ints(&[]),
    };
    let lo = e.call("amin", vec![t(x), dims.clone(), a[2].clone()])?;
    let hi = e.call("amax", vec![t(x), dims, a[2].clone()])?;
    Ok(vec![lo, hi])
}

/// `kthvalue(self, k, dim, keepdim)`: the `k`-th smallest along `dim` and
/// its index, from `sort`.
pub fn kthvalue(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let x = *a.tensor(0)?;
    let k = a.int(1)?;
    let s = e.sizes(x);
    let d = crate::meta::wrap_dim(a.int(2)?, s.len())?;
    let len = s.get(d).copied().unwrap_or(1) as i64;
    if k < 1 || k > len {
        return Err(format!(
            "kthvalue(): selected number k out of range for dimension {d} (k = {k}, size {len})"
        ));
    }
    let keep = a.bool(3)?;
    if s.is_empty() {
        let v = e.call("clone", vec![t(x)])?;
        let i = e.call("zeros", vec![usizes(&[]), Arg::Dtype(DType::I64)])?;
        return Ok(vec![v, i]);
    }
    let r = e.call_all("sort", vec![t(x), int(d as i64), Arg::Bool(false)])?;
    let mut out = vec![];
    for v in [r[0], r[1]] {
        let n = e.call("narrow", vec![t(v), int(d as i64), int(k - 1), int(1)])?;
        out.push(if keep {
            e.call("clone", vec![t(n)])?
        } else {
            e.call("squeeze", vec![t(n), int(d as i64)])?
        });
    }
    Ok(out)
}

/// `cummax` / `cummin(self, dim)`: the running extreme and the last index
/// holding it, over the lower triangle of each line against itself.
pub fn cummax(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    running_extreme(e, a, true)
}

pub fn cummin(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    running_extreme(e, a, false)
}

fn running_extreme(e: &mut dyn Emit, a: &A, max: bool) -> Out {
    let x = *a.tensor(0)?;
    let s = e.sizes(x);
    if s.is_empty() {
        let v = e.call("clone", vec![t(x)])?;
        let i = e.call("zeros", vec![usizes(&[]), Arg::Dtype(DType::I64)])?;
        return Ok(vec![v, i]);
    }
    let d = crate::meta::wrap_dim(a.int(1)?, s.len())?;
    let last = s.len() as i64 - 1;
    let len = s[d];
    let xt = if d as i64 == last {
        x
    } else {
        e.call("transpose", vec![t(x), int(d as i64), int(last)])?
    };
    // [.., i, j]: x_j for j <= i.
    let row = e.call("unsqueeze", vec![t(xt), int(-2)])?;
    let ones = e.call("ones", vec![usizes(&[len, len]), Arg::Dtype(DType::Bool)])?;
    let lower = e.call("tril", vec![t(ones)])?;
    let ident = if e.dtype(x).is_float() {
        float(if max {
            f64::NEG_INFINITY
        } else {
            f64::INFINITY
        })
    } else {
        int(if max {
            i32::MIN as i64
        } else {
            i32::MAX as i64
        })
    };
    let vals = e.call("where", vec![t(lower), t(row), ident])?;
    let v = e.call(
        if max { "amax" } else { "amin" },
        vec![t(vals), ints(&[-1])],
    )?;
    // The last j <= i where x_j is the extreme (NaN: where x_j is NaN).
    let vk = e.call("unsqueeze", vec![t(v), int(-1)])?;
    let hit = e.call("eq", vec![t(row), t(vk)])?;
    let both_nan = if e.dtype(x).is_float() {
        let rn = e.call("isnan", vec![t(row)])?;
        let vn = e.call("isnan", vec![t(vk)])?;
        Some(e.call("logical_and", vec![t(rn), t(vn)])?)
    } else {
        None
    };
    let hit = match both_nan {
        Some(b) => e.call("logical_or", vec![t(hit), t(b)])?,
        None => hit,
    };
    let hit = e.call("logical_and", vec![t(hit), t(lower)])?;
    let j = e.call("arange", vec![int(len as i64), Arg::Dtype(DType::I64)])?;
    let js = e.call("where", vec![t(hit), t(j), int(-1)])?;
    let i = e.call("amax", vec![t(js), ints(&[-1])])?;
    let back = |e: &mut dyn Emit, v: ValueId| -> R<ValueId> {
        if d as i64 == last {
            Ok(v)
        } else {
            let b = e.call("transpose", vec![t(v), int(d as i64), int(last)])?;
            e.call("contiguous", vec![t(b)])
        }
    };
    Ok(vec![back(e, v)?, back(e, i)?])
}

/// `_softmax_backward_data(grad_output, output, dim, input_dtype)`:
/// `output * (grad - sum(grad * output, dim))`; `_log_softmax_backward_data`:
/// `grad - exp(output) * sum(grad, dim)`.
pub fn softmax_backward(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let (g, y) = (*a.tensor(0)?, *a.tensor(1)?);
    let d = a.int(2)?;
    let gy = e.call("mul", vec![t(g), t(y)])?;
    let s = e.call("sum", vec![t(gy), ints(&[d]), Arg::Bool(true)])?;
    let c = e.call("sub", vec![t(g), t(s)])?;
    one(e.call("mul", vec![t(y), t(c)])?)
}

pub fn log_softmax_backward(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let (g, y) = (*a.tensor(0)?, *a.tensor(1)?);
    let d = a.int(2)?;
    let s = e.call("sum", vec![t(g), ints(&[d]), Arg::Bool(true)])?;
    let p = e.call("exp", vec![t(y)])?;
    let ps = e.call("mul", vec![t(p), t(s)])?;
    one(e.call("sub", vec![t(g), t(ps)])?)
}

// ------------------------------------------------------------ losses

/// `nll_loss(self, target, weight, reduction, ignore_index)` (and
/// `nll_loss2d`, `nll_loss_nd`): minus the log-probability of each
/// target class (dimension 1), weighted, ignored where the target is
/// `ignore_index`; reductions 0 none, 1 mean (over the weights), 2 sum.
pub fn nll_loss(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let (x, tg) = (*a.tensor(0)?, *a.tensor(1)?);
    let w = a.opt_tensor(2)?.copied();
    let (red, ignore) = (a.int(3)?, a.int(4)?);
    one(nll(e, x, tg, w, red, ignore)?.0)
}

/// `nll_loss2d` / `nll_loss2d_forward`: as `nll_loss`, for images only
/// (input `[N, C, H, W]`, targets `[N, H, W]`), as eager checks.
fn images_only(e: &dyn Emit, a: &A) -> R<()> {
    let t = *a.tensor(1)?;
    if e.rank(t) != 3 {
        return Err(format!(
            "only batches of spatial targets supported (3D tensors) but got targets of dimension: {}",
            e.rank(t)
        ));
    }
    Ok(())
}

pub fn nll_loss2d(e: &mut dyn Emit, o: &str, a: &A) -> Out {
    images_only(e, a)?;
    nll_loss(e, o, a)
}

pub fn nll_loss2d_forward(e: &mut dyn Emit, o: &str, a: &A) -> Out {
    images_only(e, a)?;
    nll_loss_forward(e, o, a)
}

/// `nll_loss_forward` / `nll_loss2d_forward`: the loss and the total
/// weight.
pub fn nll_loss_forward(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let (x, tg) = (*a.tensor(0)?, *a.tensor(1)?);
    let w = a.opt_tensor(2)?.copied();
    let (red, ignore) = (a.int(3)?, a.int(4)?);
    let (l, total) = nll(e, x, tg, w, red, ignore)?;
    Ok(vec![l, total])
}

fn nll(
    e: &mut dyn Emit,
    x: ValueId,
    tg: ValueId,
    w: Option<ValueId>,
    red: i64,
    ignore: i64,
) -> R<(ValueId, ValueId)> {
    let xs = e.sizes(x);
    let ts = e.sizes(tg);
    floats(e, x, "nll_loss")?;
    if !(1..=5).contains(&xs.len()) {
        return Err(format!("nll_loss: input of sizes {xs:?}"));
    }
    let cdim = usize::from(xs.len() > 1);
    let c = xs[cdim];
    let mut want = xs.clone();
    want.remove(cdim);
    if ts != want {
        return Err(format!(
            "nll_loss: expected target of sizes {want:?} for input {xs:?}, got {ts:?}"
        ));
    }
    let valid = e.call("ne", vec![t(tg), int(ignore)])?;
    // Each target's class as a mask over the class dimension (elementwise,
    // where a gather of the log-probabilities would read them elsewhere).
    let ti = e.call("unsqueeze", vec![t(tg), int(cdim as i64)])?;
    let mut cs = vec![1; xs.len()];
    cs[cdim] = c;
    let classes = e.call("arange", vec![int(c as i64), Arg::Dtype(DType::I64)])?;
    let classes = e.call("reshape", vec![t(classes), usizes(&cs)])?;
    let hot = e.call("eq", vec![t(ti), t(classes)])?;
    let zero = e.call("zeros_like", vec![t(x)])?;
    let sel = e.call("where", vec![t(hot), t(x), t(zero)])?;
    let picked = e.call("sum", vec![t(sel), ints(&[cdim as i64])])?;
    let mut wt = e.cast(valid, e.dtype(x))?;
    if let Some(w) = w {
        if e.sizes(w) != [c] {
            return Err(format!(
                "nll_loss: weight of sizes {:?} for {c} classes",
                e.sizes(w)
            ));
        }
        let wc = e.call("reshape", vec![t(w), usizes(&cs)])?;
        let wz = e.call("where", vec![t(hot), t(wc), float(0.0)])?;
        let per = e.call("sum", vec![t(wz), ints(&[cdim as i64])])?;
        wt = e.call("mul", vec![t(wt), t(per)])?;
    }
    let l = e.call("mul", vec![t(picked), t(wt)])?;
    // Ignored targets add nothing, even where their picked value is not
    // finite.
    let l = e.call("where", vec![t(valid), t(l), float(0.0)])?;
    let l = e.call("neg", vec![t(l)])?;
    let total = e.call("sum", vec![t(wt)])?;
    let r = match red {
        0 => l,
        2 => e.call("sum", vec![t(l)])?,
        1 => {
            let s = e.call("sum", vec![t(l)])?;
            e.call("div", vec![t(s), t(total)])?
        }
        r => return Err(format!("nll_loss: reduction {r} is not 0, 1 or 2")),
    };
    Ok((r, total))
}

/// `cross_entropy_loss(self, target, weight, reduction, ignore_index,
/// label_smoothing)`: `log_softmax` over the classes, then `nll_loss` of
/// class indices, or minus the (smoothed) target probabilities' weighted
/// sum for probability targets.
pub fn cross_entropy(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let (x, tg) = (*a.tensor(0)?, *a.tensor(1)?);
    let w = a.opt_tensor(2)?.copied();
    let (red, ignore, smooth) = (a.int(3)?, a.int(4)?, a.float(5)?);
    floats(e, x, "cross_entropy")?;
    let xs = e.sizes(x);
    let cdim = usize::from(xs.len() > 1);
    let c = xs[cdim];
    let lp = e.call("log_softmax", vec![t(x), int(cdim as i64)])?;
    let wb = match w {
        Some(w) if xs.len() > 1 => {
            let mut s = vec![1; xs.len()];
            s[cdim] = c;
            Some(e.call("reshape", vec![t(w), usizes(&s)])?)
        }
        other => other,
    };
    if e.dtype(tg).is_float() {
        // Probabilities per class.
        let mut p = tg;
        if smooth > 0.0 {
            let q = e.call("mul", vec![t(p), float(1.0 - smooth)])?;
            p = e.call("add", vec![t(q), float(smooth / c as f64)])?;
        }
        let mut terms = e.call("mul", vec![t(lp), t(p)])?;
        if let Some(wb) = wb {
            terms = e.call("mul", vec![t(terms), t(wb)])?;
        }
        let per = e.call("sum", vec![t(terms), ints(&[cdim as i64])])?;
        let per = e.call("neg", vec![t(per)])?;
        return one(match red {
            0 => per,
            2 => e.call("sum", vec![t(per)])?,
            _ => {
                let n = e.meta(per).numel().max(1);
                let s = e.call("sum", vec![t(per)])?;
                e.call("div", vec![t(s), float(n as f64)])?
            }
        });
    }
    let (l, total) = nll(e, lp, tg, w, red, ignore)?;
    if smooth <= 0.0 {
        return one(l);
    }
    // Label smoothing: the mean over classes of minus the (weighted)
    // log-probabilities, ignored targets left out.
    let valid = e.call("ne", vec![t(tg), int(ignore)])?;
    let mut lw = lp;
    if let Some(wb) = wb {
        lw = e.call("mul", vec![t(lw), t(wb)])?;
    }
    let sm = e.call("sum", vec![t(lw), ints(&[cdim as i64])])?;
    let sm = e.call("neg", vec![t(sm)])?;
    let vz = e.cast(valid, e.dtype(x))?;
    let sm = e.call("mul", vec![t(sm), t(vz)])?;
    let smooth_loss = match red {
        0 => sm,
        2 => e.call("sum", vec![t(sm)])?,
        _ => {
            let s = e.call("sum", vec![t(sm)])?;
            e.call("div", vec![t(s), t(total)])?
        }
    };
    let a1 = e.call("mul", vec![t(l), float(1.0 - smooth)])?;
    let a2 = e.call("mul", vec![t(smooth_loss), float(smooth / c as f64)])?;
    one(e.call("add", vec![t(a1), t(a2)])?)
}

// ------------------------------------------------------------ factories

/// `linspace(start, end, steps, dtype)`: ATen's symmetric steps (the
/// first half from `start`, the second back from `end`).
pub fn linspace(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let (s0, s1) = (a.scalar(0)?.to_f64(), a.scalar(1)?.to_f64());
    let n = usize::try_from(a.int(2)?).map_err(|_| "number of steps must be non-negative")?;
    let dt = a.opt_dtype(3)?.unwrap_or(DType::F32);
    one(spaced(e, s0, s1, n, dt, None)?)
}

/// `logspace(start, end, steps, base, dtype)`: `base ^ linspace`.
pub fn logspace(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let (s0, s1) = (a.scalar(0)?.to_f64(), a.scalar(1)?.to_f64());
    let n = usize::try_from(a.int(2)?).map_err(|_| "number of steps must be non-negative")?;
    let base = a.float(3)?;
    let dt = a.opt_dtype(4)?.unwrap_or(DType::F32);
    one(spaced(e, s0, s1, n, dt, Some(base))?)
}

fn spaced(
    e: &mut dyn Emit,
    s0: f64,
    s1: f64,
    n: usize,
    dt: DType,
    base: Option<f64>,
) -> R<ValueId> {
    let f = DType::F32;
    if n == 0 {
        return e.call("zeros", vec![usizes(&[0]), Arg::Dtype(dt)]);
    }
    if n == 1 {
        let v = match base {
            Some(b) => b.powf(s0),
            None => s0,
        };
        return e.call("full", vec![usizes(&[1]), float(v), Arg::Dtype(dt)]);
    }
    let step = if n > 1 {
        (s1 - s0) / (n as f64 - 1.0)
    } else {
        0.0
    };
    let i = e.call("arange", vec![int(n as i64), Arg::Dtype(f)])?;
    let lo = e.call("mul", vec![t(i), float(step)])?;
    let lo = e.call("add", vec![t(lo), float(s0)])?;
    let ni = e.call("neg", vec![t(i)])?;
    let back = e.call("add", vec![t(ni), float((n - 1) as f64)])?;
    let hi = e.call("mul", vec![t(back), float(-step)])?;
    let hi = e.call("add", vec![t(hi), float(s1)])?;
    let first = e.call("lt", vec![t(i), float((n / 2) as f64)])?;
    let mut v = e.call("where", vec![t(first), t(lo), t(hi)])?;
    if let Some(b) = base {
        v = e.call("pow", vec![float(b), t(v)])?;
    }
    e.cast(v, dt)
}

// ------------------------------------------------------------ shapes

/// `broadcast_tensors(tensors)`: each expanded to their broadcast shape.
pub fn broadcast_tensors(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let ts: Vec<ValueId> = match a.first() {
        Some(Arg::TensorList(l)) => l.iter().flatten().copied().collect(),
        _ => return Err("broadcast_tensors expects a list of tensors".into()),
    };
    let mut shape: Vec<usize> = vec![];
    for &v in &ts {
        shape = crate::meta::broadcast_shapes(&shape, &e.sizes(v))?.to_vec();
    }
    ts.iter()
        .map(|&v| e.call("expand", vec![t(v), usizes(&shape)]))
        .collect()
}

/// `diag(self, diagonal)`: a vector on a matrix's diagonal, or a
/// matrix's diagonal as a vector.
pub fn diag(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let x = *a.tensor(0)?;
    let k = a.int(1)?;
    match e.rank(x) {
        1 => {
            let n = e.sizes(x)[0] + k.unsigned_abs() as usize;
            let z = e.call("zeros", vec![usizes(&[n, n]), Arg::Dtype(e.dtype(x))])?;
            one(e.call("diagonal_scatter", vec![t(z), t(x), int(k), int(0), int(1)])?)
        }
        2 => {
            let d = e.call("diagonal", vec![t(x), int(k), int(0), int(1)])?;
            one(e.call("clone", vec![t(d)])?)
        }
        r => Err(format!("diag(): Supports 1D or 2D tensors. Got {r}D")),
    }
}

/// `diag_embed(self, offset, dim1, dim2)`: the last dimension on the
/// diagonal of two new ones.
pub fn diag_embed(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let x = *a.tensor(0)?;
    let (k, d1, d2) = (a.int(1)?, a.int(2)?, a.int(3)?);
    let s = e.sizes(x);
    let Some((&len, lead)) = s.split_last() else {
        return Err("diag_embed needs a tensor of rank 1 or more".into());
    };
    let n = len + k.unsigned_abs() as usize;
    let rank = s.len() + 1;
    let (p1, p2) = (
        crate::meta::wrap_dim(d1, rank)?,
        crate::meta::wrap_dim(d2, rank)?,
    );
    if p1 == p2 {
        return Err("diagonal dimensions cannot be identical".into());
    }
    // Zeros with the two new dimensions at p1, p2 and the rest in order.
    let mut out = vec![0; rank];
    let mut rest = lead.iter();
    for (i, o) in out.iter_mut().enumerate() {
        *o = if i == p1 || i == p2 {
            n
        } else {
            *rest.next().unwrap_or(&1)
        };
    }
    let z = e.call("zeros", vec![usizes(&out), Arg::Dtype(e.dtype(x))])?;
    one(e.call(
        "diagonal_scatter",
        vec![t(z), t(x), int(k), int(p1 as i64), int(p2 as i64)],
    )?)
}

/// `linalg_cross(self, other, dim)` / `cross`: the cross product of the
/// 3-vectors along `dim` (broadcast).
pub fn cross(e: &mut dyn Emit, overload: &str, a: &A) -> Out {
    let (x, y) = (*a.tensor(0)?, *a.tensor(1)?);
    if e.rank(x) != e.rank(y) {
        return Err("linalg.cross: inputs must have the same number of dimensions.".into());
    }
    let shape = crate::meta::broadcast_shapes(&e.sizes(x), &e.sizes(y))?.to_vec();
    let d = match a.get(2) {
        Some(Arg::Int(d)) => crate::meta::wrap_dim(*d, shape.len())?,
        // `cross` without dim: the first dimension of size 3.
        _ if overload.is_empty() => shape
            .iter()
            .position(|&s| s == 3)
            .ok_or("no dimension of size 3 in input")?,
        _ => crate::meta::wrap_dim(-1, shape.len())?,
    };
    if shape.get(d) != Some(&3) {
        return Err(format!(
            "linalg.cross: inputs dimension {d} must have length 3. Got sizes {shape:?}"
        ));
    }
    let xb = e.expand(x, &shape)?;
    let yb = e.expand(y, &shape)?;
    let c = |e: &mut dyn Emit, v: ValueId, i: i64| {
        e.call("narrow", vec![t(v), int(d as i64), int(i), int(1)])
    };
    let mut parts = vec![];
    for (i, j) in [(1, 2), (2, 0), (0, 1)] {
        let (xi, yj, xj, yi) = (c(e, xb, i)?, c(e, yb, j)?, c(e, xb, j)?, c(e, yb, i)?);
        let p = e.call("mul", vec![t(xi), t(yj)])?;
        let q = e.call("mul", vec![t(xj), t(yi)])?;
        parts.push(Some(e.call("sub", vec![t(p), t(q)])?));
    }
    one(e.call("cat", vec![Arg::TensorList(parts), int(d as i64)])?)
}

/// `cosine_similarity(x1, x2, dim, eps)`: `x1 . x2 / sqrt(max(|x1|^2
/// |x2|^2, eps^2))`, as ATen computes it.
pub fn cosine_similarity(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let (x, y) = (*a.tensor(0)?, *a.tensor(1)?);
    let (d, eps) = (a.int(2)?, a.float(3)?);
    let xy = e.call("mul", vec![t(x), t(y)])?;
    let dot = e.call("sum", vec![t(xy), ints(&[d])])?;
    let xx = e.call("mul", vec![t(x), t(x)])?;
    let nx = e.call("sum", vec![t(xx), ints(&[d])])?;
    let yy = e.call("mul", vec![t(y), t(y)])?;
    let ny = e.call("sum", vec![t(yy), ints(&[d])])?;
    let p = e.call("mul", vec![t(nx), t(ny)])?;
    let p = e.call("clamp", vec![t(p), float(eps * eps)])?;
    let r = e.call("sqrt", vec![t(p)])?;
    one(e.call("div", vec![t(dot), t(r)])?)
}

/// `pairwise_distance(x1, x2, p, eps, keepdim)`: the `p`-norm of `x1 - x2
/// + eps` along the last dimension.
pub fn pairwise_distance(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let (x, y) = (*a.tensor(0)?, *a.tensor(1)?);
    let (p, eps, keep) = (a.float(2)?, a.float(3)?, a.bool(4)?);
    let d = e.call("sub", vec![t(x), t(y)])?;
    let d = e.call("add", vec![t(d), float(eps)])?;
    one(e.call(
        "linalg_vector_norm",
        vec![t(d), float(p), ints(&[-1]), Arg::Bool(keep)],
    )?)
}

/// `max_unpool2d(self, indices, output_size)` / `max_unpool3d(self,
/// indices, output_size, stride, padding)`: each value written at its
/// flat spatial index in zeros.
pub fn max_unpool(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let (x, idx) = (*a.tensor(0)?, *a.tensor(1)?);
    let out = a.int_list(2)?.to_vec();
    let xs = e.sizes(x);
    let sp = out.len();
    if xs.len() < sp + 1 || e.sizes(idx) != xs {
        return Err(format!(
            "max_unpool: input {xs:?}, indices {:?} and output size {out:?} do not fit",
            e.sizes(idx)
        ));
    }
    let lead = &xs[..xs.len() - sp];
    let plane: usize = out.iter().map(|&o| o as usize).product();
    let inner: usize = xs[xs.len() - sp..].iter().product();
    let mut flat = lead.to_vec();
    flat.push(plane);
    let mut src = lead.to_vec();
    src.push(inner);
    let z = e.call("zeros", vec![usizes(&flat), Arg::Dtype(e.dtype(x))])?;
    let v = e.call("reshape", vec![t(x), usizes(&src)])?;
    let i = e.call("reshape", vec![t(idx), usizes(&src)])?;
    let r = e.call("scatter", vec![t(z), int(lead.len() as i64), t(i), t(v)])?;
    let mut shape = lead.to_vec();
    shape.extend(out.iter().map(|&o| o as usize));
    one(e.call("reshape", vec![t(r), usizes(&shape)])?)
}

/// `index_reduce(self, dim, index, source, reduce, include_self)`:
/// `scatter_reduce` with the index spread over `source`'s other
/// dimensions.
pub fn index_reduce(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let (x, idx, src) = (*a.tensor(0)?, *a.tensor(2)?, *a.tensor(3)?);
    let ss = e.sizes(src);
    let d = crate::meta::wrap_dim(a.int(1)?, ss.len().max(1))?;
    if e.rank(idx) != 1 {
        return Err("index_reduce: Index should have dimension 1".into());
    }
    let reduce = a.opt_str(4)?.unwrap_or("prod").to_string();
    let mut shape = vec![1; ss.len().max(1)];
    shape[d] = e.sizes(idx)[0];
    let i = e.call("reshape", vec![t(idx), usizes(&shape)])?;
    let i = e.expand(i, &ss)?;
    one(e.call(
        "scatter_reduce",
        vec![
            t(x),
            int(d as i64),
            t(i),
            t(src),
            Arg::Str(reduce),
            a[5].clone(),
        ],
    )?)
}

// ------------------------------------------------------------ einsum

/// `einsum(equation, tensors)`: each operand's repeated labels to their
/// diagonal, labels no one else needs summed away, then the operands
/// contracted left to right as batched products (`bmm` over `[batch,
/// left, contracted] x [batch, contracted, right]`), the result permuted
/// to the output's labels. `...` stands for the dimensions an operand has
/// beyond its letters (broadcast alike).
pub fn einsum(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let eq: String = a
        .opt_str(0)?
        .ok_or("einsum(): the equation must be a string")?
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    let ops: Vec<ValueId> = match a.get(1) {
        Some(Arg::TensorList(l)) => l.iter().flatten().copied().collect(),
        _ => return Err("einsum(): expected a list of tensors".into()),
    };
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l.to_string(), Some(r.to_string())),
        None => (eq.clone(), None),
    };
    let terms: Vec<&str> = lhs.split(',').collect();
    if terms.len() != ops.len() {
        return Err(format!(
            "einsum(): more operands were provided than specified in the equation ({} terms, {} operands)",
            terms.len(),
            ops.len()
        ));
    }
    // Ellipsis dimensions: labels '0'.. (as many as the widest operand's).
    let mut ell = 0usize;
    let mut labels: Vec<Vec<char>> = vec![];
    for (term, &v) in terms.iter().zip(&ops) {
        let letters = term.replace("...", "").chars().count();
        let rank = e.rank(v);
        if term.contains("...") {
            let k = rank.checked_sub(letters).ok_or_else(|| {
                format!("einsum(): the term `{term}` has more labels than its operand's {rank} dimensions")
            })?;
            ell = ell.max(k);
        } else if letters != rank {
            return Err(format!(
                "einsum(): the number of subscripts in the equation ({letters}) does not match the number of dimensions ({rank}) for operand"
            ));
        }
    }
    let ell_labels: Vec<char> = (0..ell).map(|i| char::from(b'0' + i as u8)).collect();
    for (term, &v) in terms.iter().zip(&ops) {
        let letters = term.replace("...", "").chars().count();
        let k = e.rank(v) - letters;
        let mut ls = vec![];
        let mut s = String::new();
        for c in term.chars() {
            if c == '.' {
                s.push(c);
                if s == "..." {
                    ls.extend_from_slice(&ell_labels[ell - k..]);
                    s.clear();
                }
                continue;
            }
            if !c.is_ascii_alphabetic() {
                return Err(format!(
                    "einsum(): invalid subscript given in the equation: `{c}`"
                ));
            }
            ls.push(c);
        }
        labels.push(ls);
    }
    let out: Vec<char> = match rhs {
        Some(r) => {
            let mut o = vec![];
            for c in r.replace("...", "\u{0}").chars() {
                if c == '\u{0}' {
                    o.extend_from_slice(&ell_labels);
                } else {
                    o.push(c);
                }
            }
            o
        }
        None => {
            let mut counts = std::collections::BTreeMap::new();
            for l in labels.iter().flatten() {
                if l.is_ascii_alphabetic() {
                    *counts.entry(*l).or_insert(0) += 1;
                }
            }
            let mut o = ell_labels.clone();
            o.extend(counts.into_iter().filter(|(_, n)| *n == 1).map(|(c, _)| c));
            o
        }
    };
    // Sizes per label (1 broadcasts).
    let mut size: std::collections::HashMap<char, usize> = Default::default();
    for (ls, &v) in labels.iter().zip(&ops) {
        for (l, s) in ls.iter().zip(e.sizes(v)) {
            let cur = size.entry(*l).or_insert(s);
            if *cur != s && s != 1 {
                if *cur == 1 {
                    *cur = s;
                } else {
                    return Err(format!(
                        "einsum(): operands do not broadcast with remapped shapes: subscript `{l}` has size {cur} and {s}"
                    ));
                }
            }
        }
    }
    // Each operand: diagonals of repeated labels.
    let mut cur: Vec<(ValueId, Vec<char>)> = vec![];
    for (ls, &v) in labels.iter().zip(&ops) {
        let (mut v, mut ls) = (v, ls.clone());
        loop {
            let dup = (0..ls.len())
                .find_map(|i| (i + 1..ls.len()).find(|&j| ls[j] == ls[i]).map(|j| (i, j)));
            let Some((i, j)) = dup else { break };
            let d = e.call("diagonal", vec![t(v), int(0), int(i as i64), int(j as i64)])?;
            v = e.call("clone", vec![t(d)])?;
            let l = ls[i];
            ls.remove(j);
            ls.remove(i);
            ls.push(l);
        }
        cur.push((v, ls));
    }
    let needed = |k: usize, cur: &[(ValueId, Vec<char>)], l: char| {
        out.contains(&l)
            || cur
                .iter()
                .enumerate()
                .any(|(m, (_, ls))| m != k && ls.contains(&l))
    };
    // Labels only one operand has and the output lacks: summed away.
    for k in 0..cur.len() {
        let (v, ls) = cur[k].clone();
        let gone: Vec<usize> = (0..ls.len()).filter(|&i| !needed(k, &cur, ls[i])).collect();
        if !gone.is_empty() {
            let d: Vec<i64> = gone.iter().map(|&i| i as i64).collect();
            let s = e.call("sum", vec![t(v), ints(&d)])?;
            let kept: Vec<char> = (0..ls.len())
                .filter(|i| !gone.contains(i))
                .map(|i| ls[i])
                .collect();
            cur[k] = (s, kept);
        }
    }
    while cur.len() > 1 {
        let (l, ll) = cur.remove(0);
        let (r, rl) = cur.remove(0);
        let later = |c: char, cur: &[(ValueId, Vec<char>)]| {
            out.contains(&c) || cur.iter().any(|(_, ls)| ls.contains(&c))
        };
        let batch: Vec<char> = ll
            .iter()
            .copied()
            .filter(|c| rl.contains(c) && later(*c, &cur))
            .collect();
        let contr: Vec<char> = ll
            .iter()
            .copied()
            .filter(|c| rl.contains(c) && !later(*c, &cur))
            .collect();
        let lonly: Vec<char> = ll.iter().copied().filter(|c| !rl.contains(c)).collect();
        let ronly: Vec<char> = rl.iter().copied().filter(|c| !ll.contains(c)).collect();
        let arrange = |e: &mut dyn Emit, v: ValueId, ls: &[char], order: &[char]| -> R<ValueId> {
            let perm: Vec<i64> = order
                .iter()
                .map(|c| ls.iter().position(|x| x == c).unwrap_or(0) as i64)
                .collect();
            let p = e.call("permute", vec![t(v), ints(&perm)])?;
            let full: Vec<usize> = order.iter().map(|c| size[c]).collect();
            let x = e.expand(p, &full)?;
            Ok(x)
        };
        let lo: Vec<char> = [batch.clone(), lonly.clone(), contr.clone()].concat();
        let ro: Vec<char> = [batch.clone(), contr.clone(), ronly.clone()].concat();
        let la = arrange(e, l, &ll, &lo)?;
        let ra = arrange(e, r, &rl, &ro)?;
        let n = |cs: &[char]| cs.iter().map(|c| size[c]).product::<usize>();
        let (b, m, k, nn) = (n(&batch), n(&lonly), n(&contr), n(&ronly));
        let l3 = e.call("reshape", vec![t(la), usizes(&[b, m, k])])?;
        let r3 = e.call("reshape", vec![t(ra), usizes(&[b, k, nn])])?;
        let p = e.call("bmm", vec![t(l3), t(r3)])?;
        let rl2: Vec<char> = [batch, lonly, ronly].concat();
        let shape: Vec<usize> = rl2.iter().map(|c| size[c]).collect();
        let p = e.call("reshape", vec![t(p), usizes(&shape)])?;
        cur.insert(0, (p, rl2));
    }
    let (v, ls) = cur.remove(0);
    // Ellipsis labels absent from the output (no `...` there): summed.
    let extra: Vec<i64> = (0..ls.len())
        .filter(|&i| !out.contains(&ls[i]))
        .map(|i| i as i64)
        .collect();
    let (v, ls) = if extra.is_empty() {
        (v, ls)
    } else {
        let s = e.call("sum", vec![t(v), ints(&extra)])?;
        let kept: Vec<char> = ls.iter().copied().filter(|c| out.contains(c)).collect();
        (s, kept)
    };
    let perm: Vec<i64> = out
        .iter()
        .map(|c| {
            ls.iter()
                .position(|x| x == c)
                .map(|p| p as i64)
                .ok_or_else(|| format!("einsum(): output subscript `{c}` does not appear in the equation for any input operand"))
        })
        .collect::<R<_>>()?;
    let p = if perm.is_empty() {
        v
    } else {
        e.call("permute", vec![t(v), ints(&perm)])?
    };
    let full: Vec<usize> = out.iter().map(|c| size[c]).collect();
    let x = e.expand(p, &full)?;
    // A fresh tensor, never an operand itself (`ij->ij`).
    if ops.contains(&x) {
        one(e.call("clone", vec![t(x)])?)
    } else {
        one(e.call("contiguous", vec![t(x)])?)
    }
}
