//! ATen ops Kiln imports through their decompositions into ops of the
//! table, as PyTorch's own `run_decompositions` would: convolution as an
//! unfolded input times the weight (the compiler fuses the unfold into the
//! product's operand loads, so no column buffer exists), pooling as a
//! reduction over unfolded windows, batch norm as a per-channel scale and
//! shift, the hard activations as clamps. Ops that only name an existing
//! tensor (eval-mode `dropout`, `detach_`, `to` of the same dtype) bind
//! their result to it, as eager returns the tensor itself.

use super::convert::{float, ints, usizes, Meta, Node, Out, A};
use kiln_functionalize::DType;

/// A decomposition: writes the node's statements, returns its outputs'
/// Kiln values.
pub type Decomp = fn(&mut Out, &Node) -> Result<Vec<String>, String>;

type R = Result<Vec<String>, String>;

pub fn find(op: &str) -> Option<Decomp> {
    Some(match op {
        "conv1d" | "conv2d" | "conv3d" | "convolution" | "_convolution" | "conv_transpose1d"
        | "conv_transpose2d" | "conv_transpose3d" => conv,
        "batch_norm" | "_native_batch_norm_legit_no_training" => batch_norm,
        "max_pool1d" | "max_pool2d" | "max_pool3d" => max_pool,
        "avg_pool1d" | "avg_pool2d" | "avg_pool3d" => avg_pool,
        "adaptive_avg_pool1d" | "adaptive_avg_pool2d" | "_adaptive_avg_pool2d" => adaptive_avg_pool,
        "hardswish" | "hardswish_" => hardswish,
        "hardsigmoid" | "hardsigmoid_" => hardsigmoid,
        "hardtanh" | "hardtanh_" | "relu6" | "relu6_" => hardtanh,
        "dropout"
        | "dropout_"
        | "feature_dropout"
        | "feature_dropout_"
        | "alpha_dropout"
        | "alpha_dropout_"
        | "feature_alpha_dropout"
        | "feature_alpha_dropout_" => dropout,
        "detach" | "detach_" => detach,
        "lift_fresh_copy" => lift_fresh_copy,
        "_assert_tensor_metadata" => assert_metadata,
        "to" | "type_as" => to,
        "flatten" => flatten,
        "unflatten" => unflatten,
        "new_zeros" | "new_ones" | "new_full" | "new_empty" => new_fill,
        "pad" => pad,
        "diff" => diff,
        "upsample_nearest1d"
        | "upsample_nearest2d"
        | "upsample_nearest3d"
        | "upsample_linear1d"
        | "upsample_bilinear2d" => upsample,
        "roll" => roll,
        "mish" | "mish_" => mish,
        "logsumexp" => logsumexp,
        "rms_norm" => rms_norm,
        "group_norm" => group_norm,
        "min" | "max" => min_max,
        "__and__" | "bitwise_and" | "__or__" | "bitwise_or" | "__xor__" | "bitwise_xor"
        | "__invert__" | "bitwise_not" => bitwise,
        "expand_as" => expand_as,
        "view_as" | "reshape_as" => view_as,
        "t_" | "transpose_" | "swapdims_" | "swapaxes_" | "unsqueeze_" | "squeeze_"
        | "as_strided_" => view_in_place,
        _ => return None,
    })
}

/// In-place forms (`hardswish_`): the functional result written into
/// `self`; the node's result is `self`.
fn in_place(o: &mut Out, n: &Node, self_: &str, result: String) -> R {
    if n.op.ends_with('_') {
        Ok(vec![o.emit_out(
            n,
            0,
            "copy_",
            &[self_.to_string(), result],
        )])
    } else {
        Ok(vec![result])
    }
}

/// The last statement of a functional decomposition: named after the
/// node's output, or (in place) a temporary then written into `self`.
fn last(o: &mut Out, n: &Node, self_: &str, op: &str, args: &[String]) -> R {
    if n.op.ends_with('_') {
        let r = o.emit(&n.name, op, args);
        in_place(o, n, self_, r)
    } else {
        Ok(vec![o.emit_out(n, 0, op, args)])
    }
}

fn hardswish(o: &mut Out, n: &Node) -> R {
    // ATen: x * min(max(x + 3, 0), 6) / 6.
    let x = o.val(n.tensor("self")?)?;
    let p = o.emit(&n.name, "add", &[x.clone(), "3".into()]);
    let c = o.emit(&n.name, "clamp", &[p, "0".into(), "6".into()]);
    let m = o.emit(&n.name, "mul", &[x.clone(), c]);
    last(o, n, &x, "div", &[m, "6".into()])
}

fn hardsigmoid(o: &mut Out, n: &Node) -> R {
    // ATen: min(max(x + 3, 0), 6) / 6.
    let x = o.val(n.tensor("self")?)?;
    let p = o.emit(&n.name, "add", &[x.clone(), "3".into()]);
    let c = o.emit(&n.name, "clamp", &[p, "0".into(), "6".into()]);
    last(o, n, &x, "div", &[c, "6".into()])
}

fn hardtanh(o: &mut Out, n: &Node) -> R {
    let x = o.val(n.tensor("self")?)?;
    let (lo, hi) = if n.op.starts_with("relu6") {
        (0.0, 6.0)
    } else {
        (n.float("min_val", -1.0)?, n.float("max_val", 1.0)?)
    };
    last(o, n, &x, "clamp", &[x.clone(), float(lo), float(hi)])
}

fn dropout(o: &mut Out, n: &Node) -> R {
    let x = o.val(n.tensor("input").or_else(|_| n.tensor("self"))?)?;
    if n.bool("train", false)? && n.float("p", 0.0)? > 0.0 {
        return Err(
            "dropout in training mode draws random numbers, which Kiln does not \
                    reproduce; export the model after model.eval()"
                .into(),
        );
    }
    // Eager returns the input itself.
    Ok(vec![x])
}

fn detach(o: &mut Out, n: &Node) -> R {
    let x = o.val(n.tensor("self")?)?;
    if n.op == "detach_" {
        return Ok(vec![x]);
    }
    Ok(vec![o.emit_out(n, 0, "alias", &[x])])
}

fn lift_fresh_copy(o: &mut Out, n: &Node) -> R {
    let x = o.val(n.tensor("self")?)?;
    Ok(vec![o.emit_out(n, 0, "clone", &[x])])
}

/// Checked here, against the archive's static metadata.
fn assert_metadata(o: &mut Out, n: &Node) -> R {
    let t = n.tensor("a")?;
    let m = o.meta(t)?.clone();
    if let Some(d) = n.dtype("dtype")? {
        if d != m.dtype {
            return Err(format!(
                "`{t}` is {}, the program asserts {}",
                m.dtype.name(),
                d.name()
            ));
        }
    }
    if let Some(A::Ints(s)) = n.get("size") {
        if s.iter().map(|&x| x as usize).ne(m.sizes.iter().copied()) {
            return Err(format!(
                "`{t}` has sizes {:?}, the program asserts {s:?}",
                m.sizes
            ));
        }
    }
    Ok(vec![])
}

fn to(o: &mut Out, n: &Node) -> R {
    let x = n.tensor("self")?;
    let have = o.meta(x)?.dtype;
    let want = match n.get("other") {
        Some(A::Tensor(other)) => o.meta(other)?.dtype,
        _ => n.dtype("dtype")?.unwrap_or(have),
    };
    let v = o.val(x)?;
    if want == have && !n.bool("copy", false)? {
        // Eager returns `self` itself.
        return Ok(vec![v]);
    }
    Ok(vec![o.emit_out(n, 0, "_to_copy", &[v, want.name().into()])])
}

fn flatten(o: &mut Out, n: &Node) -> R {
    let x = n.tensor("self")?;
    let sizes = o.meta(x)?.sizes.clone();
    let v = o.val(x)?;
    if sizes.is_empty() {
        return Ok(vec![o.emit_out(n, 0, "reshape", &[v, "[1]".into()])]);
    }
    let rank = sizes.len() as i64;
    let norm = |d: i64| -> Result<usize, String> {
        let r = if d < 0 { d + rank } else { d };
        usize::try_from(r)
            .ok()
            .filter(|&r| r < sizes.len())
            .ok_or_else(|| format!("dimension {d} out of range for rank {rank}"))
    };
    let (s, e) = (norm(n.int("start_dim", 0)?)?, norm(n.int("end_dim", -1)?)?);
    if s > e {
        return Err("flatten: start_dim after end_dim".into());
    }
    if s == e {
        return Ok(vec![v]);
    }
    let mut new: Vec<usize> = sizes[..s].to_vec();
    new.push(sizes[s..=e].iter().product());
    new.extend_from_slice(&sizes[e + 1..]);
    Ok(vec![o.emit_out(n, 0, "reshape", &[v, usizes(&new)])])
}

fn unflatten(o: &mut Out, n: &Node) -> R {
    let x = n.tensor("self")?;
    let sizes = o.meta(x)?.sizes.clone();
    let rank = sizes.len() as i64;
    let d = n.int("dim", 0)?;
    let d = usize::try_from(if d < 0 { d + rank } else { d })
        .ok()
        .filter(|&d| d < sizes.len())
        .ok_or_else(|| format!("dimension {d} out of range for rank {rank}"))?;
    let parts = n.ints("sizes", 0, &[])?;
    let mut new: Vec<i64> = sizes[..d].iter().map(|&s| s as i64).collect();
    new.extend(parts);
    new.extend(sizes[d + 1..].iter().map(|&s| s as i64));
    let v = o.val(x)?;
    Ok(vec![o.emit_out(n, 0, "view", &[v, ints(&new)])])
}

fn new_fill(o: &mut Out, n: &Node) -> R {
    let x = n.tensor("self")?;
    let dtype = n.dtype("dtype")?.unwrap_or(o.meta(x)?.dtype);
    let size = match n.get("size") {
        Some(A::Ints(s)) => ints(s),
        _ => return Err("argument `size` is not a list of integers".into()),
    };
    let d = dtype.name().to_string();
    Ok(vec![match n.op.as_str() {
        "new_ones" => o.emit_out(n, 0, "ones", &[size, d]),
        "new_full" => {
            let v = super::convert::render(o, n.get("fill_value").unwrap_or(&A::Int(0)))?;
            o.emit_out(n, 0, "full", &[size, v, d])
        }
        // `new_empty`'s values are unspecified: zeros are one choice.
        _ => o.emit_out(n, 0, "zeros", &[size, d]),
    }])
}

/// `diff`: differences of neighbours along `dim`, `n` times, after
/// `prepend` and `append` are joined (bools: `ne`, as ATen).
fn diff(o: &mut Out, n: &Node) -> R {
    let x = n.tensor("self")?;
    let m = o.meta(x)?.clone();
    let rank = m.sizes.len() as i64;
    let d = n.int("dim", -1)?;
    let d = if d < 0 { d + rank } else { d };
    if d < 0 || d >= rank {
        return Err(format!("dimension {d} out of range for rank {rank}"));
    }
    let mut v = o.val(x)?;
    let mut len = m.sizes[d as usize];
    let pre = n.opt_tensor("prepend")?;
    let app = n.opt_tensor("append")?;
    if pre.is_some() || app.is_some() {
        let mut parts = vec![];
        for t in [pre, Some(x), app].into_iter().flatten() {
            parts.push(o.val(t)?);
            if t != x {
                len += o.meta(t)?.sizes.get(d as usize).copied().unwrap_or(1);
            }
        }
        v = o.emit(
            &n.name,
            "cat",
            &[format!("[{}]", parts.join(", ")), d.to_string()],
        );
    }
    let times = n.int("n", 1)?;
    if times < 1 {
        return Ok(vec![v]);
    }
    let op = if m.dtype == DType::Bool { "ne" } else { "sub" };
    for k in 0..times {
        if len == 0 {
            break;
        }
        let hi = o.emit(
            &n.name,
            "narrow",
            &[v.clone(), d.to_string(), "1".into(), (len - 1).to_string()],
        );
        let lo = o.emit(
            &n.name,
            "narrow",
            &[v, d.to_string(), "0".into(), (len - 1).to_string()],
        );
        v = if k + 1 == times {
            o.emit_out(n, 0, op, &[hi, lo])
        } else {
            o.emit(&n.name, op, &[hi, lo])
        };
        len -= 1;
    }
    Ok(vec![v])
}

/// `roll`: per dimension, the last `shift` elements moved first (`cat` of
/// two `narrow`s); without dimensions, of the flattened tensor.
fn roll(o: &mut Out, n: &Node) -> R {
    let x = n.tensor("self")?;
    let sizes = o.meta(x)?.sizes.clone();
    let shifts = n.ints("shifts", 0, &[])?;
    let dims = n.ints("dims", 0, &[])?;
    let mut v = o.val(x)?;
    let (sizes_now, pairs): (Vec<usize>, Vec<(i64, usize)>) = if dims.is_empty() {
        if shifts.len() != 1 {
            return Err("roll without dims takes one shift".into());
        }
        let numel = sizes.iter().product();
        v = o.emit(&n.name, "reshape", &[v, "[-1]".into()]);
        (vec![numel], vec![(shifts[0], 0)])
    } else {
        if dims.len() != shifts.len() {
            return Err("roll: as many shifts as dims".into());
        }
        let rank = sizes.len() as i64;
        let mut pairs = vec![];
        for (&s, &d) in shifts.iter().zip(&dims) {
            let d = if d < 0 { d + rank } else { d };
            let d = usize::try_from(d)
                .ok()
                .filter(|&d| d < sizes.len())
                .ok_or_else(|| format!("dimension {d} out of range"))?;
            pairs.push((s, d));
        }
        (sizes.clone(), pairs)
    };
    for (s, d) in pairs {
        let len = sizes_now[d] as i64;
        if len == 0 {
            continue;
        }
        let k = s.rem_euclid(len);
        if k == 0 {
            continue;
        }
        let tail = o.emit(
            &n.name,
            "narrow",
            &[
                v.clone(),
                d.to_string(),
                (len - k).to_string(),
                k.to_string(),
            ],
        );
        let head = o.emit(
            &n.name,
            "narrow",
            &[v, d.to_string(), "0".into(), (len - k).to_string()],
        );
        v = o.emit(
            &n.name,
            "cat",
            &[format!("[{tail}, {head}]"), d.to_string()],
        );
    }
    if dims.is_empty() {
        v = o.emit(&n.name, "reshape", &[v, usizes(&sizes)]);
    }
    Ok(vec![o.emit_out(n, 0, "clone", &[v])])
}

/// ATen: `x * tanh(softplus(x))`.
fn mish(o: &mut Out, n: &Node) -> R {
    let x = o.val(n.tensor("self")?)?;
    let sp = o.emit(&n.name, "softplus", std::slice::from_ref(&x));
    let t = o.emit(&n.name, "tanh", &[sp]);
    last(o, n, &x, "mul", &[x.clone(), t])
}

/// ATen: `m + log(sum(exp(x - m)))`, `m` the maximum (0 where infinite).
fn logsumexp(o: &mut Out, n: &Node) -> R {
    let x = o.val(n.tensor("self")?)?;
    let dims = ints(&n.ints("dim", 0, &[])?);
    let keep = n.bool("keepdim", false)?;
    let b = &n.name;
    let m = o.emit(b, "amax", &[x.clone(), dims.clone(), "true".into()]);
    let a = o.emit(b, "abs", std::slice::from_ref(&m));
    let inf = o.emit(b, "eq", &[a, "inf".into()]);
    let m = o.emit(b, "masked_fill", &[m, inf, "0.0".into()]);
    let d = o.emit(b, "sub", &[x, m.clone()]);
    let e = o.emit(b, "exp", &[d]);
    let s = o.emit(b, "sum", &[e, dims.clone(), keep.to_string()]);
    let l = o.emit(b, "log", &[s]);
    let m = if keep {
        m
    } else {
        o.emit(b, "squeeze", &[m, dims])
    };
    Ok(vec![o.emit_out(n, 0, "add", &[l, m])])
}

/// ATen: `x * rsqrt(mean(x^2) + eps) * weight` over the normalized
/// dimensions (`eps` default: the dtype's epsilon).
fn rms_norm(o: &mut Out, n: &Node) -> R {
    let x = n.tensor("input")?;
    let m = o.meta(x)?.clone();
    let shape = n.ints("normalized_shape", 0, &[])?;
    let k = shape.len() as i64;
    let dims: Vec<i64> = (1..=k).map(|i| -i).collect();
    let eps = n.opt_float("eps")?.unwrap_or(match m.dtype {
        DType::F16 => 0.0009765625,
        _ => f32::EPSILON as f64,
    });
    let v = o.val(x)?;
    let b = &n.name;
    let sq = o.emit(b, "mul", &[v.clone(), v.clone()]);
    let mean = o.emit(b, "mean", &[sq, ints(&dims), "true".into()]);
    let pe = o.emit(b, "add", &[mean, float(eps)]);
    let r = o.emit(b, "rsqrt", &[pe]);
    match n.opt_tensor("weight")? {
        Some(w) => {
            let y = o.emit(b, "mul", &[v, r]);
            let w = o.val(w)?;
            Ok(vec![o.emit_out(n, 0, "mul", &[y, w])])
        }
        None => Ok(vec![o.emit_out(n, 0, "mul", &[v, r])]),
    }
}

/// ATen: statistics over each group of channels (and the spatial
/// dimensions), then the per-channel affine.
fn group_norm(o: &mut Out, n: &Node) -> R {
    let x = n.tensor("input")?;
    let m = o.meta(x)?.clone();
    if m.sizes.len() < 2 {
        return Err("group norm needs N, C, ...".into());
    }
    let g = usize::try_from(n.int("num_groups", 1)?).unwrap_or(0);
    let (batch, c) = (m.sizes[0], m.sizes[1]);
    if g == 0 || c % g != 0 {
        return Err(format!("{c} channels in {g} groups"));
    }
    let eps = float(n.float("eps", 1e-5)?);
    let b = &n.name;
    let v = o.val(x)?;
    let grouped = o.emit(
        b,
        "reshape",
        &[
            v,
            usizes(&[
                batch,
                g,
                m.sizes.iter().product::<usize>() / (batch * g).max(1),
            ]),
        ],
    );
    let mean = o.emit(b, "mean", &[grouped.clone(), "[-1]".into(), "true".into()]);
    let var = o.emit(
        b,
        "var",
        &[grouped.clone(), "[-1]".into(), "0".into(), "true".into()],
    );
    let ve = o.emit(b, "add", &[var, eps]);
    let r = o.emit(b, "rsqrt", &[ve]);
    let d = o.emit(b, "sub", &[grouped, mean]);
    let nrm = o.emit(b, "mul", &[d, r]);
    let mut y = o.emit(b, "reshape", &[nrm, usizes(&m.sizes)]);
    let rank = m.sizes.len();
    if let Some(w) = n.opt_tensor("weight")? {
        let w = o.val(w)?;
        let w = channel(o, b, w, c, rank);
        y = o.emit(b, "mul", &[y, w]);
    }
    if let Some(bias) = n.opt_tensor("bias")? {
        let bias = o.val(bias)?;
        let bias = channel(o, b, bias, c, rank);
        y = o.emit(b, "add", &[y, bias]);
    }
    Ok(vec![o.emit_out(n, 0, "alias", &[y])])
}

/// `min.other` / `max.other` are the elementwise `minimum` / `maximum`;
/// the other overloads are the table's.
fn min_max(o: &mut Out, n: &Node) -> R {
    if n.overload != "other" {
        return super::convert::call_table(o, n).map_err(|e| e.to_string());
    }
    let x = o.val(n.tensor("self")?)?;
    let y = o.val(n.tensor("other")?)?;
    let op = if n.op == "min" { "minimum" } else { "maximum" };
    Ok(vec![o.emit_out(n, 0, op, &[x, y])])
}

/// Bitwise ops of bools are the logical ones (masks); of integers Kiln
/// has none yet.
fn bitwise(o: &mut Out, n: &Node) -> R {
    let x = n.tensor("self")?;
    if o.meta(x)?.dtype != DType::Bool {
        return Err(format!(
            "bitwise ops of {} tensors are not supported yet (of bool tensors they are)",
            o.meta(x)?.dtype.name()
        ));
    }
    let v = o.val(x)?;
    let op = match n.op.trim_start_matches("__").trim_start_matches("bitwise_") {
        "and__" | "and" => "logical_and",
        "or__" | "or" => "logical_or",
        "xor__" | "xor" => "ne",
        _ => return Ok(vec![o.emit_out(n, 0, "logical_not", &[v])]),
    };
    let other = match n.get("other") {
        Some(A::Tensor(t)) => o.val(t)?,
        Some(a) => super::convert::render(o, a)?,
        None => return Err("argument `other` is missing".into()),
    };
    Ok(vec![o.emit_out(n, 0, op, &[v, other])])
}

fn pad(o: &mut Out, n: &Node) -> R {
    let mode = n.str("mode", "constant")?;
    if mode != "constant" {
        return Err(format!(
            "pad mode `{mode}` is not supported yet (Kiln imports constant padding)"
        ));
    }
    let x = o.val(n.tensor("self")?)?;
    let p = ints(&n.ints("pad", 0, &[])?);
    let value = float(n.opt_float("value")?.unwrap_or(0.0));
    Ok(vec![o.emit_out(n, 0, "constant_pad_nd", &[x, p, value])])
}

fn expand_as(o: &mut Out, n: &Node) -> R {
    let x = o.val(n.tensor("self")?)?;
    let s = usizes(&o.meta(n.tensor("other")?)?.sizes.clone());
    Ok(vec![o.emit_out(n, 0, "expand", &[x, s])])
}

fn view_as(o: &mut Out, n: &Node) -> R {
    let x = o.val(n.tensor("self")?)?;
    let s = usizes(&o.meta(n.tensor("other")?)?.sizes.clone());
    let op = if n.op == "view_as" { "view" } else { "reshape" };
    Ok(vec![o.emit_out(n, 0, op, &[x, s])])
}

/// In-place view ops change only a tensor's sizes and strides: the view
/// of the same storage, and the tensor's name now means it (eager's
/// object is the same, its metadata changed).
fn view_in_place(o: &mut Out, n: &Node) -> R {
    let x = n.tensor("self")?;
    let v = o.val(x)?;
    let mut args = vec![v];
    let op = match n.op.as_str() {
        "t_" => "t",
        "unsqueeze_" => {
            args.push(n.int("dim", 0)?.to_string());
            "unsqueeze"
        }
        "squeeze_" => {
            match n.get("dim") {
                Some(A::Int(d)) => args.push(d.to_string()),
                Some(A::Ints(d)) => args.push(ints(d)),
                _ => {}
            }
            "squeeze"
        }
        "as_strided_" => {
            args.push(ints(&n.ints("size", 0, &[])?));
            args.push(ints(&n.ints("stride", 0, &[])?));
            if let Some(off) = n.get("storage_offset") {
                args.push(super::convert::render(o, off)?);
            }
            "as_strided"
        }
        _ => {
            args.push(n.int("dim0", 0)?.to_string());
            args.push(n.int("dim1", 0)?.to_string());
            "transpose"
        }
    };
    let r = o.emit_out(n, 0, op, &args);
    o.bind(x, r.clone());
    Ok(vec![r])
}

/// `[C]` per-channel values shaped to broadcast along dimension 1 of a
/// rank-`rank` tensor.
fn channel(o: &mut Out, base: &str, v: String, c: usize, rank: usize) -> String {
    if rank <= 2 {
        return v;
    }
    let mut s = vec![c];
    s.resize(rank - 1, 1);
    o.emit(base, "reshape", &[v, usizes(&s)])
}

fn batch_norm(o: &mut Out, n: &Node) -> R {
    let x = n.tensor("input")?;
    let m = o.meta(x)?.clone();
    if m.sizes.len() < 2 {
        return Err(format!(
            "input of rank {} (batch norm needs N, C, ...)",
            m.sizes.len()
        ));
    }
    let (c, rank) = (m.sizes[1], m.sizes.len());
    let xv = o.val(x)?;
    let eps = float(n.float("eps", 1e-5)?);
    let training = n.op == "batch_norm" && n.bool("training", false)?;
    let rm = n.opt_tensor("running_mean")?;
    let rv = n.opt_tensor("running_var")?;
    let b = &n.name;
    let (mean, var) = if training {
        // Batch statistics; the running ones (when given) move towards them.
        let dims: Vec<i64> = std::iter::once(0).chain(2..rank as i64).collect();
        let mean = o.emit(b, "mean", &[xv.clone(), ints(&dims)]);
        let var = o.emit(b, "var", &[xv.clone(), ints(&dims), "0".into()]);
        let count: usize = m.sizes.iter().product::<usize>() / c.max(1);
        let mom = n.float("momentum", 0.1)?;
        if let (Some(rm), Some(rv)) = (rm, rv) {
            let (rm, rv) = (o.val(rm)?, o.val(rv)?);
            let keep = float(1.0 - mom);
            let a = o.emit(b, "mul", &[rm.clone(), keep.clone()]);
            let bm = o.emit(b, "mul", &[mean.clone(), float(mom)]);
            let nm = o.emit(b, "add", &[a, bm]);
            o.emit_void("copy_", &[rm, nm]);
            let unbiased = count as f64 / (count.max(2) - 1) as f64;
            let a = o.emit(b, "mul", &[rv.clone(), keep]);
            let bv = o.emit(b, "mul", &[var.clone(), float(mom * unbiased)]);
            let nv = o.emit(b, "add", &[a, bv]);
            o.emit_void("copy_", &[rv, nv]);
        }
        (mean, var)
    } else {
        let (Some(rm), Some(rv)) = (rm, rv) else {
            return Err("batch norm in eval mode without running statistics".into());
        };
        (o.val(rm)?, o.val(rv)?)
    };
    // ATen: scale = weight / sqrt(var + eps), shift = bias - mean * scale.
    let ve = o.emit(b, "add", &[var, eps]);
    let mut scale = o.emit(b, "rsqrt", &[ve]);
    if let Some(w) = n.opt_tensor("weight")? {
        let w = o.val(w)?;
        scale = o.emit(b, "mul", &[w, scale]);
    }
    let ms = o.emit(b, "mul", &[mean, scale.clone()]);
    let shift = match n.opt_tensor("bias")? {
        Some(bias) => {
            let bias = o.val(bias)?;
            o.emit(b, "sub", &[bias, ms])
        }
        None => o.emit(b, "neg", &[ms]),
    };
    let scale = channel(o, b, scale, c, rank);
    let shift = channel(o, b, shift, c, rank);
    let y = o.emit(b, "mul", &[xv, scale]);
    let mut outs = vec![o.emit_out(n, 0, "add", &[y, shift])];
    // `_native_batch_norm_legit_no_training`'s saved statistics are empty.
    for i in 1..n.outputs.len() {
        outs.push(o.emit_out(n, i, "zeros", &["[0]".into(), m.dtype.name().into()]));
    }
    Ok(outs)
}

/// A pooling or convolution window along one dimension.
#[derive(Clone, Copy, Debug)]
struct Window {
    size: usize,
    kernel: usize,
    stride: usize,
    pad: usize,
    dilation: usize,
}

impl Window {
    /// Positions a window starts at, ATen's `pooling_output_shape`.
    fn outputs(&self, ceil: bool) -> Result<usize, String> {
        let span = self.dilation * (self.kernel - 1) + 1;
        let avail = self.size + 2 * self.pad;
        if avail < span {
            return Err(format!(
                "window of {span} larger than the padded input ({avail})"
            ));
        }
        let mut out = (avail - span + if ceil { self.stride - 1 } else { 0 }) / self.stride + 1;
        if ceil && (out - 1) * self.stride >= self.size + self.pad {
            out -= 1;
        }
        Ok(out)
    }
}

/// `size`, `stride`, `padding`, `dilation` of the last `sp` dimensions.
fn windows(
    n: &Node,
    sizes: &[usize],
    sp: usize,
    kernel: &str,
    dilation: bool,
) -> Result<Vec<Window>, String> {
    let k = n.ints(kernel, sp, &[])?;
    if k.len() != sp {
        return Err(format!("argument `{kernel}` must have {sp} entries"));
    }
    let mut s = n.ints("stride", sp, &[])?;
    if s.is_empty() {
        s = k.clone();
    }
    let p = n.ints("padding", sp, &vec![0; sp])?;
    let d = if dilation {
        n.ints("dilation", sp, &vec![1; sp])?
    } else {
        vec![1; sp]
    };
    let at = sizes.len() - sp;
    (0..sp)
        .map(|i| {
            let pos = |v: i64, what: &str, min: i64| {
                usize::try_from(v)
                    .ok()
                    .filter(|&x| x as i64 >= min)
                    .ok_or_else(|| format!("{what} {v} out of range"))
            };
            Ok(Window {
                size: sizes[at + i],
                kernel: pos(k[i], "kernel size", 1)?,
                stride: pos(s[i], "stride", 1)?,
                pad: pos(p[i], "padding", 0)?,
                dilation: pos(d[i], "dilation", 1)?,
            })
        })
        .collect()
}

/// The input padded with `value` and unfolded into `outs` windows along
/// each of the last `ws.len()` dimensions: the window elements become new
/// trailing dimensions (`[..., o1, o2, k1, k2]`).
fn unfold_windows(
    o: &mut Out,
    base: &str,
    mut v: String,
    rank: usize,
    ws: &[Window],
    outs: &[usize],
    value: &str,
) -> String {
    let sp = ws.len();
    // Right padding: enough for the last window (ceil mode), at least the
    // left padding.
    let rights: Vec<usize> = ws
        .iter()
        .zip(outs)
        .map(|(w, &out)| {
            let need = (out - 1) * w.stride + w.dilation * (w.kernel - 1) + 1;
            need.saturating_sub(w.size + w.pad).max(w.pad)
        })
        .collect();
    if ws.iter().zip(&rights).any(|(w, &r)| w.pad > 0 || r > 0) {
        let mut pads = vec![];
        for (w, &r) in ws.iter().zip(&rights).rev() {
            pads.push(w.pad as i64);
            pads.push(r as i64);
        }
        v = o.emit(base, "constant_pad_nd", &[v, ints(&pads), value.into()]);
    }
    for (i, (w, &out)) in ws.iter().zip(outs).enumerate() {
        let d = rank - sp + i;
        let span = w.dilation * (w.kernel - 1) + 1;
        v = o.emit(
            base,
            "unfold",
            &[v, d.to_string(), span.to_string(), w.stride.to_string()],
        );
        // Right padding may leave room for more windows than eager has.
        let have = (w.size + w.pad + rights[i] - span) / w.stride + 1;
        if have > out {
            v = o.emit(
                base,
                "narrow",
                &[v, d.to_string(), "0".into(), out.to_string()],
            );
        }
        if w.dilation > 1 {
            let last = rank + i;
            v = o.emit(
                base,
                "slice",
                &[
                    v,
                    last.to_string(),
                    "0".into(),
                    span.to_string(),
                    w.dilation.to_string(),
                ],
            );
        }
    }
    v
}

/// The trailing window dimensions of `unfold_windows`' result.
fn window_dims(sp: usize) -> String {
    ints(&(1..=sp as i64).map(|i| -i).collect::<Vec<_>>())
}

/// The spatial rank of a pooling op, and whether its input has a batch.
fn pool_rank(n: &Node, rank: usize) -> Result<usize, String> {
    let sp = match n.op.trim_start_matches('_') {
        o if o.ends_with("1d") => 1,
        o if o.ends_with("3d") => 3,
        _ => 2,
    };
    if rank != sp + 1 && rank != sp + 2 {
        return Err(format!(
            "input of rank {rank}; a {sp}-d pool takes rank {} or {}",
            sp + 1,
            sp + 2
        ));
    }
    Ok(sp)
}

/// A pooling node's input, spatial rank, windows and output sizes.
fn pool_windows(
    o: &Out,
    n: &Node,
    what: &str,
    dilation: bool,
) -> Result<(Meta, usize, Vec<Window>, Vec<usize>), String> {
    let m = o.meta(n.tensor("self")?)?.clone();
    if !matches!(m.dtype, DType::F32 | DType::F16) {
        return Err(format!("{what} of {} (Kiln pools floats)", m.dtype.name()));
    }
    let sp = pool_rank(n, m.sizes.len())?;
    let ws = windows(n, &m.sizes, sp, "kernel_size", dilation)?;
    let ceil = n.bool("ceil_mode", false)?;
    let outs = ws
        .iter()
        .map(|w| w.outputs(ceil))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((m, sp, ws, outs))
}

fn max_pool(o: &mut Out, n: &Node) -> R {
    let (m, sp, ws, outs) = pool_windows(o, n, "max pooling", true)?;
    if ws.iter().any(|w| w.pad * 2 > w.kernel) {
        return Err("padding should be at most half of the kernel size".into());
    }
    let v = o.val(n.tensor("self")?)?;
    let u = unfold_windows(o, &n.name, v, m.sizes.len(), &ws, &outs, "-inf");
    Ok(vec![o.emit_out(n, 0, "amax", &[u, window_dims(sp)])])
}

fn avg_pool(o: &mut Out, n: &Node) -> R {
    let (m, sp, ws, outs) = pool_windows(o, n, "average pooling", false)?;
    let include_pad = n.bool("count_include_pad", true)?;
    let v = o.val(n.tensor("self")?)?;
    let u = unfold_windows(o, &n.name, v, m.sizes.len(), &ws, &outs, "0.0");
    let sum = o.emit(&n.name, "sum", &[u, window_dims(sp)]);
    if let Some(d) = n
        .get("divisor_override")
        .map(|_| n.int("divisor_override", 1))
    {
        let d = d?;
        if d == 0 {
            return Err("divisor_override is zero".into());
        }
        return Ok(vec![o.emit_out(n, 0, "div", &[sum, d.to_string()])]);
    }
    // ATen's divisor per output position: the window clipped to the padded
    // input (or to the input without `count_include_pad`).
    let per_dim: Vec<Vec<usize>> = ws
        .iter()
        .zip(&outs)
        .map(|(w, &out)| {
            (0..out)
                .map(|i| {
                    let start = (i * w.stride) as i64 - w.pad as i64;
                    let end = (start + w.kernel as i64).min((w.size + w.pad) as i64);
                    let pool = end - start;
                    let (s, e) = (start.max(0), end.min(w.size as i64));
                    (if include_pad { pool } else { e - s }) as usize
                })
                .collect()
        })
        .collect();
    let total: usize = outs.iter().product();
    let mut div = vec![1usize; total];
    for (i, d) in div.iter_mut().enumerate() {
        let mut rest = i;
        for k in (0..sp).rev() {
            *d *= per_dim[k][rest % outs[k]];
            rest /= outs[k];
        }
    }
    if div.iter().all(|&d| d == div[0]) {
        return Ok(vec![o.emit_out(n, 0, "div", &[sum, div[0].to_string()])]);
    }
    let (dtype, bytes) = float_bytes(m.dtype, div.iter().map(|&d| d as f32));
    let c = o.constant(&format!("{}_divisor", n.name), dtype, outs.clone(), bytes);
    Ok(vec![o.emit_out(n, 0, "div", &[sum, c])])
}

/// Little-endian bytes of floats in `dtype` (f32 or f16).
fn float_bytes(dtype: DType, vals: impl Iterator<Item = f32>) -> (DType, Vec<u8>) {
    let mut out = vec![];
    for v in vals {
        match dtype {
            DType::F16 => out.extend_from_slice(&half::f16::from_f32(v).to_le_bytes()),
            _ => out.extend_from_slice(&v.to_le_bytes()),
        }
    }
    (
        if dtype == DType::F16 {
            DType::F16
        } else {
            DType::F32
        },
        out,
    )
}

fn adaptive_avg_pool(o: &mut Out, n: &Node) -> R {
    let x = n.tensor("self")?;
    let m = o.meta(x)?.clone();
    if !matches!(m.dtype, DType::F32 | DType::F16) {
        return Err(format!(
            "average pooling of {} (Kiln pools floats)",
            m.dtype.name()
        ));
    }
    let sp = pool_rank(n, m.sizes.len())?;
    let outs = n.ints("output_size", sp, &[])?;
    if outs.len() != sp {
        return Err(format!("argument `output_size` must have {sp} entries"));
    }
    let at = m.sizes.len() - sp;
    let ins = &m.sizes[at..];
    let outs: Vec<usize> = outs
        .iter()
        .zip(ins)
        .map(|(&o, &i)| if o < 0 { i } else { o as usize })
        .collect();
    if outs.contains(&0) {
        return Err("an output size of 0".into());
    }
    let v = o.val(x)?;
    if outs.iter().all(|&s| s == 1) {
        let dims = window_dims(sp);
        return Ok(vec![o.emit_out(n, 0, "mean", &[v, dims, "true".into()])]);
    }
    if ins.iter().zip(&outs).all(|(i, o)| i % o == 0) {
        // Equal windows: the mean over each.
        let ws: Vec<Window> = ins
            .iter()
            .zip(&outs)
            .map(|(&i, &o)| Window {
                size: i,
                kernel: i / o,
                stride: i / o,
                pad: 0,
                dilation: 1,
            })
            .collect();
        let u = unfold_windows(o, &n.name, v, m.sizes.len(), &ws, &outs, "0.0");
        return Ok(vec![o.emit_out(n, 0, "mean", &[u, window_dims(sp)])]);
    }
    // Unequal windows (ATen: [floor(i in / out), ceil((i + 1) in / out))):
    // a product with an averaging matrix per dimension, last first.
    let mut v = v;
    for k in (0..sp).rev() {
        let (len, out) = (ins[k], outs[k]);
        // `[len, out]`: column j averages window j.
        let mut mat = vec![0f32; len * out];
        for j in 0..out {
            let s = j * len / out;
            let e = ((j + 1) * len).div_ceil(out);
            for i in s..e {
                mat[i * out + j] = 1.0 / (e - s) as f32;
            }
        }
        let (dtype, bytes) = float_bytes(m.dtype, mat.into_iter());
        let c = o.constant(&format!("{}_pool{k}", n.name), dtype, vec![len, out], bytes);
        let d = (at + k) as i64;
        let last = m.sizes.len() as i64 - 1;
        // Bring dimension k last, multiply, put it back.
        let t = if d == last {
            v
        } else {
            o.emit(&n.name, "transpose", &[v, d.to_string(), last.to_string()])
        };
        let p = o.emit(&n.name, "matmul", &[t, c]);
        v = if d == last {
            p
        } else {
            o.emit(&n.name, "transpose", &[p, d.to_string(), last.to_string()])
        };
    }
    Ok(vec![o.emit_out(n, 0, "contiguous", &[v])])
}

fn conv(o: &mut Out, n: &Node) -> R {
    let x = n.tensor("input")?;
    let w = n.tensor("weight")?;
    let (xm, wm) = (o.meta(x)?.clone(), o.meta(w)?.clone());
    if wm.sizes.len() < 3 {
        return Err(format!("a weight of rank {}", wm.sizes.len()));
    }
    let sp = wm.sizes.len() - 2;
    let batched = match xm.sizes.len() {
        r if r == sp + 2 => true,
        r if r == sp + 1 => false,
        r => {
            return Err(format!(
                "input of rank {r} for a weight of rank {}",
                wm.sizes.len()
            ))
        }
    };
    let groups = usize::try_from(n.int("groups", 1)?)
        .ok()
        .filter(|&g| g > 0)
        .ok_or("groups must be positive")?;
    let mut stride = n.ints("stride", sp, &vec![1; sp])?;
    let dilation = n.ints("dilation", sp, &vec![1; sp])?;
    if stride.iter().chain(&dilation).any(|&x| x < 1) {
        return Err("stride and dilation must be positive".into());
    }
    let mut v = o.val(x)?;
    let mut wv = o.val(w)?;
    let mut w_sizes = wm.sizes.clone();
    let b = n.name.clone();
    let mut sizes = xm.sizes.clone();
    if !batched {
        v = o.emit(&b, "unsqueeze", &[v, "0".into()]);
        sizes.insert(0, 1);
    }
    let transposed = n.op.starts_with("conv_transpose") || n.bool("transposed", false)?;
    let mut explicit_pads = None;
    if transposed {
        let (xv, ws, wvv, pads) = transpose_as_conv(
            o, n, &b, v, &mut sizes, wv, &wm.sizes, groups, &stride, &dilation,
        )?;
        v = xv;
        w_sizes = ws;
        wv = wvv;
        explicit_pads = Some(pads);
        stride = vec![1; sp];
    }
    let kernel = w_sizes[2..].to_vec();
    let (batch, c, o_ch) = (sizes[0], sizes[1], w_sizes[0]);
    if c != w_sizes[1] * groups || o_ch % groups != 0 {
        return Err(format!(
            "input of {c} channels, weight {:?} with {groups} groups",
            wm.sizes
        ));
    }
    // Padding: per dimension (left, right); `same` puts the odd one right.
    let pads: Vec<(usize, usize)> = match (explicit_pads, n.get("padding")) {
        (Some(p), _) => p,
        (None, Some(A::Str(s))) if s == "valid" => vec![(0, 0); sp],
        (None, Some(A::Str(s))) if s == "same" => (0..sp)
            .map(|i| {
                let total = dilation[i] as usize * (kernel[i] - 1);
                (total / 2, total - total / 2)
            })
            .collect(),
        (None, Some(A::Str(s))) => return Err(format!("padding `{s}`")),
        (None, _) => n
            .ints("padding", sp, &vec![0; sp])?
            .into_iter()
            .map(|p| (p as usize, p as usize))
            .collect(),
    };
    let ws: Vec<Window> = (0..sp)
        .map(|i| {
            let pos = |v: i64| usize::try_from(v).ok().filter(|&x| x > 0);
            Ok(Window {
                size: sizes[2 + i] + pads[i].0 + pads[i].1 - 2 * pads[i].0.min(pads[i].1),
                kernel: kernel[i],
                stride: pos(stride[i]).ok_or("stride must be positive")?,
                pad: pads[i].0.min(pads[i].1),
                dilation: pos(dilation[i]).ok_or("dilation must be positive")?,
            })
        })
        .collect::<Result<_, String>>()?;
    // Asymmetric (`same`) padding: the extra column padded first.
    if pads.iter().any(|(l, r)| l != r) {
        let mut p = vec![];
        for (l, r) in pads.iter().rev() {
            p.push((l - l.min(r)) as i64);
            p.push((r - l.min(r)) as i64);
        }
        v = o.emit(&b, "constant_pad_nd", &[v, ints(&p), "0.0".into()]);
    }
    let outs = ws
        .iter()
        .map(|w| w.outputs(false))
        .collect::<Result<Vec<_>, _>>()?;
    let l: usize = outs.iter().product();
    let k: usize = w_sizes[1] * kernel.iter().product::<usize>();
    let pointwise = ws
        .iter()
        .all(|w| w.kernel == 1 && w.stride == 1 && w.pad == 0);
    let cols_shape = if groups == 1 {
        vec![batch, k, l]
    } else {
        vec![batch, groups, k, l]
    };
    let cols = if pointwise {
        o.emit(&b, "reshape", &[v, usizes(&cols_shape)])
    } else {
        let u = unfold_windows(o, &b, v, sp + 2, &ws, &outs, "0.0");
        // [N, C, o..., k...] -> [N, C, k..., o...].
        let mut perm: Vec<i64> = vec![0, 1];
        perm.extend((2 + sp..2 + 2 * sp).map(|d| d as i64));
        perm.extend((2..2 + sp).map(|d| d as i64));
        let p = o.emit(&b, "permute", &[u, ints(&perm)]);
        o.emit(&b, "reshape", &[p, usizes(&cols_shape)])
    };
    let w_shape = if groups == 1 {
        vec![o_ch, k]
    } else {
        vec![groups, o_ch / groups, k]
    };
    let w2 = o.emit(&b, "reshape", &[wv, usizes(&w_shape)]);
    let prod = o.emit(&b, "matmul", &[w2, cols]);
    let mut out_shape = vec![batch, o_ch];
    out_shape.extend(&outs);
    let bias = n.opt_tensor("bias")?;
    let finish = bias.is_none() && batched;
    let mut r = if finish {
        o.emit_out(n, 0, "reshape", &[prod, usizes(&out_shape)])
    } else {
        o.emit(&b, "reshape", &[prod, usizes(&out_shape)])
    };
    if let Some(bias) = bias {
        let bv = o.val(bias)?;
        let bc = channel(o, &b, bv, o_ch, sp + 2);
        r = if batched {
            o.emit_out(n, 0, "add", &[r, bc])
        } else {
            o.emit(&b, "add", &[r, bc])
        };
    }
    if !batched {
        r = o.emit_out(n, 0, "squeeze", &[r, "0".into()]);
    }
    Ok(vec![r])
}

/// The input, the weight's sizes and value, and the padding of a
/// transposed convolution rewritten as a convolution.
type AsConv = (String, Vec<usize>, String, Vec<(usize, usize)>);

/// A transposed convolution as a convolution: the input with `stride - 1`
/// zeros between elements, padded by `dilation (k - 1) - padding` (plus
/// `output_padding` on the right; cropped where negative), and the weight
/// flipped with its channel roles swapped per group. Returns the input,
/// the weight's sizes and value, and the padding.
#[allow(clippy::too_many_arguments)]
fn transpose_as_conv(
    o: &mut Out,
    n: &Node,
    b: &str,
    mut v: String,
    sizes: &mut [usize],
    w: String,
    w_sizes: &[usize],
    groups: usize,
    stride: &[i64],
    dilation: &[i64],
) -> Result<AsConv, String> {
    let sp = w_sizes.len() - 2;
    let padding = n.ints("padding", sp, &vec![0; sp])?;
    let extra = n.ints("output_padding", sp, &vec![0; sp])?;
    let (cin, cout_g) = (w_sizes[0], w_sizes[1]);
    if cin != sizes[1] || cin % groups != 0 {
        return Err(format!(
            "input of {} channels, transposed weight {w_sizes:?} with {groups} groups",
            sizes[1]
        ));
    }
    let mut pads = vec![];
    for i in 0..sp {
        let d = 2 + i;
        let s = stride[i] as usize;
        if s > 1 && sizes[d] > 0 {
            // [.., L, ..] -> [.., L, s, ..] with zeros after each element.
            let mut zs: Vec<usize> = sizes[..=d].to_vec();
            zs.push(s - 1);
            zs.extend_from_slice(&sizes[d + 1..]);
            let dt = o.meta(n.tensor("input")?)?.dtype.name();
            let z = o.emit(b, "zeros", &[usizes(&zs), dt.into()]);
            let u = o.emit(b, "unsqueeze", &[v, (d + 1).to_string()]);
            let c = o.emit(b, "cat", &[format!("[{u}, {z}]"), (d + 1).to_string()]);
            let mut merged = sizes.to_vec();
            merged[d] *= s;
            let r = o.emit(b, "reshape", &[c, usizes(&merged)]);
            let len = (sizes[d] - 1) * s + 1;
            v = o.emit(
                b,
                "narrow",
                &[r, d.to_string(), "0".into(), len.to_string()],
            );
            sizes[d] = len;
        }
        let span = dilation[i] * (w_sizes[2 + i] as i64 - 1);
        let (l, r) = (span - padding[i], span - padding[i] + extra[i]);
        if l < 0 || r < 0 {
            // Negative padding crops.
            let (cl, cr) = ((-l).max(0) as usize, (-r).max(0) as usize);
            if cl + cr >= sizes[d] {
                return Err("padding larger than the output".into());
            }
            let len = sizes[d] - cl - cr;
            v = o.emit(
                b,
                "narrow",
                &[v, d.to_string(), cl.to_string(), len.to_string()],
            );
            sizes[d] = len;
        }
        pads.push((l.max(0) as usize, r.max(0) as usize));
    }
    // [Cin, Cout/G, k...] -> flipped, [G, Cin/G, Cout/G, k...] with the
    // channel roles swapped -> [Cout, Cin/G, k...].
    let spatial: Vec<i64> = (2..2 + sp as i64).collect();
    let f = o.emit(b, "flip", &[w, ints(&spatial)]);
    let mut g_shape = vec![groups, cin / groups, cout_g];
    g_shape.extend_from_slice(&w_sizes[2..]);
    let r = o.emit(b, "reshape", &[f, usizes(&g_shape)]);
    let t = o.emit(b, "transpose", &[r, "1".into(), "2".into()]);
    let mut new_sizes = vec![groups * cout_g, cin / groups];
    new_sizes.extend_from_slice(&w_sizes[2..]);
    let wt = o.emit(b, "reshape", &[t, usizes(&new_sizes)]);
    Ok((v, new_sizes, wt, pads))
}

/// `upsample_nearest*` and `upsample_(bi)linear*`, per spatial dimension
/// (last first): nearest as an `index_select` of ATen's source indices,
/// linear as a product with the interpolation matrix (two weights per
/// output), both made at import.
fn upsample(o: &mut Out, n: &Node) -> R {
    let x = n.tensor("input").or_else(|_| n.tensor("self"))?;
    let m = o.meta(x)?.clone();
    let sp = match &n.op {
        op if op.ends_with("1d") => 1,
        op if op.ends_with("3d") => 3,
        _ => 2,
    };
    if m.sizes.len() != sp + 2 {
        return Err(format!(
            "input of rank {}, expected {}",
            m.sizes.len(),
            sp + 2
        ));
    }
    let linear = n.op.contains("linear");
    if linear && !matches!(m.dtype, DType::F32 | DType::F16) {
        return Err(format!("linear upsampling of {}", m.dtype.name()));
    }
    let align = n.bool("align_corners", false)?;
    let ins = &m.sizes[2..];
    // Scales: `scale_factors` (`.vec`), or `scales_h` / `scales_w` / ...
    let factors: Vec<Option<f64>> = match n.get("scale_factors") {
        Some(A::Floats(f)) => f.iter().map(|&x| Some(x)).collect(),
        _ => {
            let names: &[&str] = match sp {
                1 => &["scales"],
                2 => &["scales_h", "scales_w"],
                _ => &["scales_d", "scales_h", "scales_w"],
            };
            names
                .iter()
                .map(|k| n.opt_float(k))
                .collect::<Result<_, _>>()?
        }
    };
    let outs: Vec<usize> = match n.get("output_size") {
        Some(A::Ints(v)) => v.iter().map(|&x| x.max(0) as usize).collect(),
        _ => ins
            .iter()
            .zip(&factors)
            .map(|(&i, f)| (i as f64 * f.unwrap_or(1.0)).floor() as usize)
            .collect(),
    };
    if outs.len() != sp || factors.len() != sp && !factors.is_empty() {
        return Err("output size and scales of the wrong length".into());
    }
    // ATen's `area_pixel_compute_scale`, in f32 as the float kernels do.
    let scale = |k: usize| -> f32 {
        let (i, o) = (ins[k] as f32, outs[k] as f32);
        if align {
            if outs[k] > 1 {
                (i - 1.0) / (o - 1.0)
            } else {
                0.0
            }
        } else {
            match factors.get(k).copied().flatten() {
                Some(f) if f > 0.0 => (1.0 / f) as f32,
                _ => i / o,
            }
        }
    };
    let mut v = o.val(x)?;
    for k in (0..sp).rev() {
        let (len, out, d) = (ins[k], outs[k], 2 + k);
        let sc = scale(k);
        if !linear {
            let idx: Vec<u8> = (0..out)
                .flat_map(|j| {
                    let src = ((j as f32 * sc).floor() as i64).min(len as i64 - 1);
                    src.to_le_bytes()
                })
                .collect();
            let c = o.constant(&format!("{}_index{k}", n.name), DType::I64, vec![out], idx);
            v = o.emit(&n.name, "index_select", &[v, d.to_string(), c]);
            continue;
        }
        // [len, out]: column j mixes the two source elements of output j.
        let mut mat = vec![0f32; len * out];
        for j in 0..out {
            let src = if align {
                j as f32 * sc
            } else {
                ((j as f32 + 0.5) * sc - 0.5).max(0.0)
            };
            let i0 = (src.floor() as usize).min(len - 1);
            let i1 = (i0 + 1).min(len - 1);
            let l1 = src - i0 as f32;
            mat[i0 * out + j] += 1.0 - l1;
            mat[i1 * out + j] += l1;
        }
        let (dtype, bytes) = float_bytes(m.dtype, mat.into_iter());
        let c = o.constant(&format!("{}_lerp{k}", n.name), dtype, vec![len, out], bytes);
        let last = (sp + 1) as i64;
        let t = if d as i64 == last {
            v
        } else {
            o.emit(&n.name, "transpose", &[v, d.to_string(), last.to_string()])
        };
        let p = o.emit(&n.name, "matmul", &[t, c]);
        v = if d as i64 == last {
            p
        } else {
            o.emit(&n.name, "transpose", &[p, d.to_string(), last.to_string()])
        };
    }
    Ok(vec![o.emit_out(n, 0, "contiguous", &[v])])
}
