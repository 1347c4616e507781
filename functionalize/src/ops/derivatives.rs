//! Derivative rules: a VJP and a JVP rule per differentiable op, written
//! with ops of the table and following PyTorch's `derivatives.yaml`
//! (its conventions at ties and kinks: `relu` and `threshold_backward` at
//! 0 give 0, `abs` at 0 gives 0, `maximum`/`minimum` split ties evenly,
//! `amax`/`amin` share the gradient between equal maxima, `clamp` passes
//! it at its bounds).
//!
//! A VJP rule may return a gradient in the broadcast shape and dtype of
//! the result; the transform sums it to its argument's shape and casts it
//! (`Emitter::sum_to`). A JVP rule may likewise return a tangent that
//! broadcasts to its result. Elementwise ops have a diagonal Jacobian, so
//! their JVP is their VJP applied to each argument's tangent (`jvp_diag`);
//! ops linear in their floating arguments apply themselves to the tangents
//! (`jvp_linear`).
//!
//! Ops without rules: data-dependent integer results (`argmax`,
//! comparisons, `sort`'s indices) have no derivative and need none;
//! `embedding` with `scale_grad_by_freq`, `sdpa` with dropout or GQA, and
//! `remainder(Scalar, Tensor)` are refused with a message.

use crate::id::ValueId;
use crate::ops::{Elem, Lowering, Reduction};
use crate::rule::{float, int, ints, sizes_arg, t, Call, Emit, Grads, Tangents, R};
use crate::schema::Arg;

type G<'a> = &'a [Option<ValueId>];

/// Scalar argument `i` of a bound call, as a number.
pub(crate) fn num(c: &Call, i: usize) -> Option<f64> {
    match c.args.get(i) {
        Some(Arg::Int(x)) => Some(*x as f64),
        Some(Arg::Float(x)) => Some(*x),
        Some(Arg::Bool(b)) => Some(*b as i64 as f64),
        _ => None,
    }
}

/// The op's lowering (its declared form: rules read it, never the name).
fn lowering(c: &Call) -> Lowering {
    c.op.def().lowering
}

fn int_at(c: &Call, i: usize) -> R<i64> {
    match c.args.get(i) {
        Some(Arg::Int(x)) => Ok(*x),
        _ => Err(format!(
            "internal error: argument {i} of {} is not an integer",
            c.op.name()
        )),
    }
}

fn list_at(c: &Call, i: usize) -> Option<Vec<i64>> {
    match c.args.get(i) {
        Some(Arg::IntList(l)) => Some(l.clone()),
        _ => None,
    }
}

fn wrap(d: i64, rank: usize) -> R<usize> {
    crate::meta::wrap_dim(d, rank.max(1))
}

/// Reduced dimensions of a `dim` argument (`None` or `[]`: all of them).
fn reduced_dims(c: &Call, i: usize, rank: usize) -> R<Vec<usize>> {
    let mut d: Vec<usize> = match list_at(c, i) {
        Some(l) if !l.is_empty() => l.iter().map(|&x| wrap(x, rank)).collect::<R<_>>()?,
        _ => (0..rank).collect(),
    };
    d.sort_unstable();
    d.dedup();
    Ok(d)
}

/// `self`'s shape with 1 at the reduced dimensions (keepdim).
fn kept_shape(sizes: &[usize], dims: &[usize]) -> Vec<usize> {
    let mut s = sizes.to_vec();
    for &d in dims {
        if d < s.len() {
            s[d] = 1;
        }
    }
    s
}

/// A reduction's gradient (or result) put back in the kept shape.
fn keep(e: &mut dyn Emit, v: ValueId, sizes: &[usize], dims: &[usize]) -> R<ValueId> {
    e.view(v, &kept_shape(sizes, dims))
}

fn one(pos: usize, g: ValueId) -> Grads {
    vec![(pos, None, g)]
}

macro_rules! g0 {
    ($gs:expr) => {
        match $gs.first().copied().flatten() {
            Some(g) => g,
            None => return Ok(vec![]),
        }
    };
}

// ------------------------------------------------------------ elementwise

pub(crate) fn add(e: &mut dyn Emit, c: &Call, gs: G) -> R<Grads> {
    let g = g0!(gs);
    let alpha = num(c, 2).unwrap_or(1.0);
    let mut out = one(0, g);
    if c.opt_tensor(1).is_some() {
        out.push((1, None, e.scale(g, alpha)?));
    }
    Ok(out)
}

pub(crate) fn sub(e: &mut dyn Emit, c: &Call, gs: G) -> R<Grads> {
    let g = g0!(gs);
    let alpha = num(c, 2).unwrap_or(1.0);
    let mut out = one(0, g);
    if c.opt_tensor(1).is_some() {
        out.push((1, None, e.scale(g, -alpha)?));
    }
    Ok(out)
}

pub(crate) fn mul(e: &mut dyn Emit, c: &Call, gs: G) -> R<Grads> {
    let g = g0!(gs);
    let x = c.tensor(0)?;
    match c.opt_tensor(1) {
        Some(y) => Ok(vec![(0, None, e.mul(g, y)?), (1, None, e.mul(g, x)?)]),
        None => Ok(one(0, e.call("mul", vec![t(g), c.args[1].clone()])?)),
    }
}

pub(crate) fn div(e: &mut dyn Emit, c: &Call, gs: G) -> R<Grads> {
    let g = g0!(gs);
    if matches!(c.args.get(2), Some(Arg::Str(_))) {
        return Ok(vec![]); // rounded division: zero almost everywhere
    }
    match c.opt_tensor(1) {
        Some(y) => {
            let gx = e.div(g, y)?;
            // -grad * ((self / other) / other), as derivatives.yaml
            let r = e.div(c.outs[0], y)?;
            let gy = e.mul(g, r)?;
            Ok(vec![(0, None, gx), (1, None, e.neg(gy)?)])
        }
        None => Ok(one(0, e.call("div", vec![t(g), c.args[1].clone()])?)),
    }
}

/// The unary elementwise ops with a derivative (`unary`).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Unary {
    Neg,
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Abs,
    Relu,
    Sigmoid,
    Tanh,
    Silu,
    Gelu,
    Sin,
    Cos,
    Reciprocal,
    Erf,
    Log1p,
    Expm1,
    Log2,
    Log10,
    Tan,
    Asin,
    Acos,
    Atan,
    Sinh,
    Cosh,
    Asinh,
    Acosh,
    Atanh,
}

/// `grad * f'(x)` for the unary elementwise op `f`.
pub(crate) fn unary(e: &mut dyn Emit, c: &Call, gs: G, f: Unary) -> R<Grads> {
    let g = g0!(gs);
    let x = c.tensor(0)?;
    let y = c.outs[0];
    let gx = match f {
        Unary::Neg => e.neg(g)?,
        Unary::Exp => e.mul(g, y)?,
        Unary::Log => e.div(g, x)?,
        Unary::Sqrt => {
            let d = e.scale(y, 2.0)?;
            e.div(g, d)?
        }
        Unary::Rsqrt => {
            let y2 = e.mul(y, y)?;
            let y3 = e.mul(y2, y)?;
            let p = e.mul(g, y3)?;
            e.scale(p, -0.5)?
        }
        Unary::Abs => {
            let s = e.call("sign", vec![t(x)])?;
            e.mul(g, s)?
        }
        Unary::Relu => e.call("threshold_backward", vec![t(g), t(y), int(0)])?,
        Unary::Sigmoid => e.call("sigmoid_backward", vec![t(g), t(y)])?,
        Unary::Tanh => e.call("tanh_backward", vec![t(g), t(y)])?,
        Unary::Silu => e.call("silu_backward", vec![t(g), t(x)])?,
        Unary::Gelu => e.call("gelu_backward", vec![t(g), t(x), c.args[1].clone()])?,
        Unary::Sin => {
            let d = e.call("cos", vec![t(x)])?;
            e.mul(g, d)?
        }
        Unary::Cos => {
            let d = e.call("sin", vec![t(x)])?;
            let p = e.mul(g, d)?;
            e.neg(p)?
        }
        Unary::Reciprocal => {
            let y2 = e.mul(y, y)?;
            let p = e.mul(g, y2)?;
            e.neg(p)?
        }
        Unary::Erf => {
            let x2 = e.mul(x, x)?;
            let n = e.neg(x2)?;
            let d = e.call("exp", vec![t(n)])?;
            let d = e.scale(d, 2.0 / std::f64::consts::PI.sqrt())?;
            e.mul(g, d)?
        }
        // grad / (self + 1), grad * (result + 1), grad / (self * ln 2),
        // grad / (self * ln 10): derivatives.yaml's.
        Unary::Log1p => {
            let d = e.add_scalar(x, 1.0)?;
            e.div(g, d)?
        }
        Unary::Expm1 => {
            let d = e.add_scalar(y, 1.0)?;
            e.mul(g, d)?
        }
        Unary::Log2 => {
            let d = e.scale(x, std::f64::consts::LN_2)?;
            e.div(g, d)?
        }
        Unary::Log10 => {
            let d = e.scale(x, std::f64::consts::LN_10)?;
            e.div(g, d)?
        }
        // derivatives.yaml: tan grad * (1 + result^2); asin and acos
        // +-grad * rsqrt(1 - self^2); atan grad / (1 + self^2); sinh grad *
        // cosh(self), cosh grad * sinh(self); asinh grad * rsqrt(self^2 +
        // 1), acosh grad * rsqrt(self^2 - 1); atanh grad / (1 - self^2).
        Unary::Tan => {
            let y2 = e.mul(y, y)?;
            let d = e.add_scalar(y2, 1.0)?;
            e.mul(g, d)?
        }
        Unary::Asin | Unary::Acos => {
            let x2 = e.mul(x, x)?;
            let n = e.neg(x2)?;
            let d = e.add_scalar(n, 1.0)?;
            let r = e.call("rsqrt", vec![t(d)])?;
            let p = e.mul(g, r)?;
            match f {
                Unary::Acos => e.neg(p)?,
                _ => p,
            }
        }
        Unary::Atan => {
            let x2 = e.mul(x, x)?;
            let d = e.add_scalar(x2, 1.0)?;
            e.div(g, d)?
        }
        Unary::Sinh => {
            let d = e.call("cosh", vec![t(x)])?;
            e.mul(g, d)?
        }
        Unary::Cosh => {
            let d = e.call("sinh", vec![t(x)])?;
            e.mul(g, d)?
        }
        Unary::Asinh | Unary::Acosh => {
            let x2 = e.mul(x, x)?;
            let s = if matches!(f, Unary::Asinh) { 1.0 } else { -1.0 };
            let d = e.add_scalar(x2, s)?;
            let r = e.call("rsqrt", vec![t(d)])?;
            e.mul(g, r)?
        }
        Unary::Atanh => {
            let x2 = e.mul(x, x)?;
            let n = e.neg(x2)?;
            let d = e.add_scalar(n, 1.0)?;
            e.div(g, d)?
        }
    };
    Ok(one(0, gx))
}

pub(crate) fn pow(e: &mut dyn Emit, c: &Call, gs: G) -> R<Grads> {
    let g = g0!(gs);
    let y = c.outs[0];
    match (c.opt_tensor(0), c.opt_tensor(1)) {
        (Some(x), None) => {
            let p = num(c, 1).unwrap_or(1.0);
            if p == 0.0 {
                return Ok(vec![]);
            }
            let xp = e.call("pow", vec![t(x), float(p - 1.0)])?;
            let d = e.scale(xp, p)?;
            Ok(one(0, e.mul(g, d)?))
        }
        (Some(x), Some(p)) => {
            // self: where(exponent == 0, 0, grad * exponent * self^(exponent - 1))
            let pm1 = e.add_scalar(p, -1.0)?;
            let xp = e.call("pow", vec![t(x), t(pm1)])?;
            let d = e.mul(p, xp)?;
            let gd = e.mul(g, d)?;
            let p0 = e.call("ne", vec![t(p), int(0)])?;
            let gx = e.keep_where(p0, gd)?;
            // exponent: grad * where(self == 0 & exponent >= 0, 0, result * log(self))
            let lx = e.call("log", vec![t(x)])?;
            let rl = e.mul(y, lx)?;
            let gr = e.mul(g, rl)?;
            let x0 = e.call("eq", vec![t(x), int(0)])?;
            let pn = e.call("ge", vec![t(p), int(0)])?;
            let zero = e.call("logical_and", vec![t(x0), t(pn)])?;
            let gp = e.call("where", vec![t(zero), float(0.0), t(gr)])?;
            Ok(vec![(0, None, gx), (1, None, gp)])
        }
        (None, Some(_)) => {
            let base = num(c, 0).unwrap_or(0.0);
            let gy = e.mul(g, y)?;
            Ok(one(1, e.scale(gy, base.ln())?))
        }
        (None, None) => Ok(vec![]),
    }
}

pub(crate) fn maximum(e: &mut dyn Emit, c: &Call, gs: G) -> R<Grads> {
    extreme2(e, c, gs, true)
}

pub(crate) fn minimum(e: &mut dyn Emit, c: &Call, gs: G) -> R<Grads> {
    extreme2(e, c, gs, false)
}

/// `maximum` (`max`) / `minimum`: ties share the gradient evenly.
fn extreme2(e: &mut dyn Emit, c: &Call, gs: G, max: bool) -> R<Grads> {
    let g = g0!(gs);
    let (x, y) = (c.tensor(0)?, c.tensor(1)?);
    let eq = e.call("eq", vec![t(x), t(y)])?;
    let half = e.scale(g, 0.5)?;
    let shared = e.where_(eq, half, g)?;
    let (lose_x, lose_y) = if max { ("lt", "gt") } else { ("gt", "lt") };
    let mx = e.call(lose_x, vec![t(x), t(y)])?;
    let my = e.call(lose_y, vec![t(x), t(y)])?;
    Ok(vec![
        (
            0,
            None,
            e.call("masked_fill", vec![t(shared), t(mx), float(0.0)])?,
        ),
        (
            1,
            None,
            e.call("masked_fill", vec![t(shared), t(my), float(0.0)])?,
        ),
    ])
}

pub(crate) fn where_(e: &mut dyn Emit, c: &Call, gs: G) -> R<Grads> {
    let g = g0!(gs);
    let cond = c.tensor(0)?;
    let mut out = vec![];
    if c.opt_tensor(1).is_some() {
        out.push((1, None, e.keep_where(cond, g)?));
    }
    if c.opt_tensor(2).is_some() {
        out.push((2, None, e.call("where", vec![t(cond), float(0.0), t(g)])?));
    }
    Ok(out)
}

/// `clamp` (ATen's clamp_backward and clamp_backward_min_max).
pub(crate) fn clamp(e: &mut dyn Emit, c: &Call, gs: G) -> R<Grads> {
    let g = g0!(gs);
    let x = c.tensor(0)?;
    let bound = |i: usize| -> Option<Arg<ValueId>> {
        match c.args.get(i) {
            Some(Arg::None) | None => None,
            Some(a) => Some(a.clone()),
        }
    };
    let (lo, hi) = (bound(1), bound(2));
    let mut conds = vec![];
    if let Some(lo) = &lo {
        conds.push(e.call("ge", vec![t(x), lo.clone()])?);
    }
    if let Some(hi) = &hi {
        conds.push(e.call("le", vec![t(x), hi.clone()])?);
    }
    let mut out = vec![];
    let inside = match conds[..] {
        [a] => a,
        [a, b] => e.call("logical_and", vec![t(a), t(b)])?,
        _ => return Ok(one(0, g)),
    };
    out.push((0, None, e.keep_where(inside, g)?));
    if let Some(Arg::Tensor(lo)) = lo {
        let below = e.call("lt", vec![t(x), t(lo)])?;
        let m = match &hi {
            Some(hi) => {
                let ok = e.call("lt", vec![t(lo), hi.clone()])?;
                e.call("logical_and", vec![t(below), t(ok)])?
            }
            None => below,
        };
        out.push((1, None, e.keep_where(m, g)?));
    }
    if let Some(Arg::Tensor(hi)) = hi {
        let above = e.call("gt", vec![t(x), t(hi)])?;
        let m = match &lo {
            Some(lo) => {
                let crossed = e.call("lt", vec![t(hi), lo.clone()])?;
                e.call("logical_or", vec![t(above), t(crossed)])?
            }
            None => above,
        };
        out.push((2, None, e.keep_where(m, g)?));
    }
    Ok(out)
}

pub(crate) fn remainder(e: &mut dyn Emit, c: &Call, gs: G) -> R<Grads> {
    let g = g0!(gs);
    match (c.opt_tensor(0), c.opt_tensor(1)) {
        (Some(x), Some(y)) => {
            let q = e.call("div", vec![t(x), t(y), Arg::Str("floor".into())])?;
            let p = e.mul(g, q)?;
            Ok(vec![(0, None, g), (1, None, e.neg(p)?)])
        }
        (Some(_), None) => Ok(one(0, g)),
        _ => Err("the derivative of remainder(Scalar, Tensor) is not implemented".into()),
    }
}

/// `fmod`: derivatives.yaml's `grad` and `-grad * trunc(self / other)`.
pub(crate) fn fmod(e: &mut dyn Emit, c: &Call, gs: G) -> R<Grads> {
    let g = g0!(gs);
    match (c.opt_tensor(0), c.opt_tensor(1)) {
        (Some(x), Some(y)) => {
            let q = e.call("div", vec![t(x), t(y), Arg::Str("trunc".into())])?;
            let p = e.mul(g, q)?;
            Ok(vec![(0, None, g), (1, None, e.neg(p)?)])
        }
        _ => Ok(one(0, g)),
    }
}

/// `atan2(y, x)`: `grad * x / (x^2 + y^2)` and `-grad * y / (x^2 + y^2)`.
pub(crate) fn atan2(e: &mut dyn Emit, c: &Call, gs: G) -> R<Grads> {
    let g = g0!(gs);
    let (y, x) = (c.tensor(0)?, c.tensor(1)?);
    let yy = e.mul(y, y)?;
    let xx = e.mul(x, x)?;
    let r = e.add(xx, yy)?;
    let gr = e.div(g, r)?;
    let gy = e.mul(gr, x)?;
    let gx = e.mul(gr, y)?;
    Ok(vec![(0, None, gy), (1, None, e.neg(gx)?)])
}

pub(crate) fn masked_fill(e: &mut dyn Emit, c: &Call, gs: G) -> R<Grads> {
    let g = g0!(gs);
    let mask = c.tensor(1)?;
    let mut out = one(0, e.call("masked_fill", vec![t(g), t(mask), float(0.0)])?);
    if c.opt_tensor(2).is_some() {
        out.push((2, None, e.keep_where(mask, g)?));
    }
    Ok(out)
}

/// Ops whose gradient passes through unchanged to one argument (the
/// transform sums and casts it to that argument): `clone`, `_to_copy`,
/// `alias_copy`, `expand_copy`, `copy`'s `src`, `fill`'s `value`.
fn pass_to(pos: usize) -> impl Fn(&mut dyn Emit, &Call, G) -> R<Grads> {
    move |_, c, gs| {
        let g = g0!(gs);
        Ok(match c.opt_tensor(pos) {
            Some(_) => one(pos, g),
            None => vec![],
        })
    }
}

pub(crate) fn identity(e: &mut dyn Emit, c: &Call, gs: G) -> R<Grads> {
    pass_to(0)(e, c, gs)
}
pub(crate) fn second(e: &mut dyn Emit, c: &Call, gs: G) -> R<Grads> {
    pass_to(1)(e, c, gs)
}

/// The backward ops of derivatives.yaml (`backward_op`).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Backward {
    Threshold,
    Sigmoid,
    Tanh,
    Silu,
    Gelu,
}

/// The backward ops themselves, for second derivatives.
pub(crate) fn backward_op(e: &mut dyn Emit, c: &Call, gs: G, op: Backward) -> R<Grads> {
    let g = g0!(gs);
    let (go, x) = (c.tensor(0)?, c.tensor(1)?);
    let mut rest: Vec<Arg<ValueId>> = c.args[1..].to_vec();
    rest.insert(0, t(g));
    let d_go = e.call_id(c.op, rest)?[0];
    let ggo = e.mul(g, go)?;
    // d/dx of grad_output * f'(x): grad * grad_output * f''(x).
    let f2 = match op {
        Backward::Threshold => None,
        Backward::Sigmoid => {
            let two = e.scale(x, -2.0)?;
            Some(e.add_scalar(two, 1.0)?)
        }
        Backward::Tanh => Some(e.scale(x, -2.0)?),
        Backward::Silu => {
            // s (1 - s) (2 + x (1 - 2 s))
            let s = e.call("sigmoid", vec![t(x)])?;
            let oms = e.rsub_scalar(1.0, s)?;
            let a = e.mul(s, oms)?;
            let s2 = e.scale(s, -2.0)?;
            let b = e.add_scalar(s2, 1.0)?;
            let xb = e.mul(x, b)?;
            let k = e.add_scalar(xb, 2.0)?;
            Some(e.mul(a, k)?)
        }
        Backward::Gelu => Some(gelu_second(
            e,
            x,
            matches!(c.args.get(2), Some(Arg::Str(s)) if s == "tanh"),
        )?),
    };
    let mut out = one(0, d_go);
    if let Some(f2) = f2 {
        out.push((1, None, e.mul(ggo, f2)?));
    }
    Ok(out)
}

/// `gelu''(x)`.
fn gelu_second(e: &mut dyn Emit, x: ValueId, tanh: bool) -> R<ValueId> {
    let x2 = e.mul(x, x)?;
    if !tanh {
        // phi(x) (2 - x^2)
        let h = e.scale(x2, -0.5)?;
        let ex = e.call("exp", vec![t(h)])?;
        let phi = e.scale(ex, 1.0 / (2.0 * std::f64::consts::PI).sqrt())?;
        let k = e.rsub_scalar(2.0, x2)?;
        return e.mul(phi, k);
    }
    // (1 - th^2) (u' + x/2 (u'' - 2 th u'^2)), u = k (x + c x^3)
    let (k, cc) = ((2.0 / std::f64::consts::PI).sqrt(), 0.044715);
    let x3 = e.mul(x2, x)?;
    let cx3 = e.scale(x3, cc)?;
    let inner = e.add(x, cx3)?;
    let u = e.scale(inner, k)?;
    let th = e.call("tanh", vec![t(u)])?;
    let th2 = e.mul(th, th)?;
    let sech2 = e.rsub_scalar(1.0, th2)?;
    let du0 = e.scale(x2, 3.0 * cc)?;
    let du1 = e.add_scalar(du0, 1.0)?;
    let du = e.scale(du1, k)?;
    let ddu = e.scale(x, 6.0 * k * cc)?;
    let du2 = e.mul(du, du)?;
    let tdu2 = e.mul(th, du2)?;
    let tdu2 = e.scale(tdu2, -2.0)?;
    let s = e.add(ddu, tdu2)?;
    let hx = e.scale(x, 0.5)?;
    let hs = e.mul(hx, s)?;
    let w = e.add(du, hs)?;
    e.mul(sech2, w)
}

// ------------------------------------------------------------ reductions

pub(crate) fn sum(e: &mut dyn Emit, c: &Call, gs: G) -> R<Grads> {
    let g = g0!(gs);
    let x = c.tensor(0)?;
    let s = e.sizes(x);
    let dims = if c.overload_name().is_empty() {
        (0..s.len()).collect()
    } else {
        reduced_dims(c, 1, s.len())?
    };
    let gk = keep(e, g, &s, &dims)?;
    let mut ge = e.expand(gk, &s)?;
    if lowering(c) == Lowering::Reduce(Reduction::Mean) {
        let n: usize = dims.iter().map(|&d| s[d]).product();
        ge = e.scale(ge, 1.0 / n.max(1) as f64)?;
    }
    Ok(one(0, ge))
}

/// `var`/`std`: `2 (x - mean) / (N - correction)` times the gradient.
pub(crate) fn var(e: &mut dyn Emit, c: &Call, gs: G) -> R<Grads> {
    let g = g0!(gs);
    let x = c.tensor(0)?;
    let s = e.sizes(x);
    let dims = reduced_dims(c, 1, s.len())?;
    let n: usize = dims.iter().map(|&d| s[d]).product();
    let corr = num(c, 2).unwrap_or(1.0);
    let m = e.call(
        "mean",
        vec![
            t(x),
            ints(&dims.iter().map(|&d| d as i64).collect::<Vec<_>>()),
            Arg::Bool(true),
        ],
    )?;
    let xc = e.sub(x, m)?;
    let gk = keep(e, g, &s, &dims)?;
    let mut gx = e.mul(gk, xc)?;
    if lowering(c) == Lowering::Reduce(Reduction::Var { sqrt: true }) {
        let rk = keep(e, c.outs[0], &s, &dims)?;
        let q = e.div(gx, rk)?;
        let z = e.call("eq", vec![t(rk), int(0)])?;
        gx = e.call("masked_fill", vec![t(q), t(z), float(0.0)])?;
        gx = e.scale(gx, 1.0 / (n as f64 - corr))?;
    } else {
        gx = e.scale(gx, 2.0 / (n as f64 - corr))?;
    }
    Ok(one(0, gx))
}

/// `prod`'s reduced dims, and the partial derivative of the product at
/// each element: the product of the others. Where the line has no zero
/// that is `prod / x`; where it has one, the zero's partial is the product
/// of the rest and the others' are 0; with two or more, all are 0.
fn prod_partials(e: &mut dyn Emit, c: &Call) -> R<(Vec<usize>, ValueId)> {
    let x = c.tensor(0)?;
    let s = e.sizes(x);
    let dims = match c.args.get(1) {
        Some(Arg::Int(d)) => vec![wrap(*d, s.len())?],
        _ => (0..s.len()).collect(),
    };
    let d: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
    let z = e.call("eq", vec![t(x), int(0)])?;
    let zeros = e.call("sum", vec![t(z), ints(&d), Arg::Bool(true)])?;
    let others = e.call("masked_fill", vec![t(x), t(z), float(1.0)])?;
    let rest = match c.args.get(1) {
        Some(Arg::Int(_)) => e.call("prod", vec![t(others), int(d[0]), Arg::Bool(true)])?,
        _ => {
            let all = e.call("prod", vec![t(others)])?;
            keep(e, all, &s, &dims)?
        }
    };
    let lone = e.call("ne", vec![t(zeros), int(1)])?;
    let at_zero = e.call("masked_fill", vec![t(rest), t(lone), float(0.0)])?;
    let y = keep(e, c.outs[0], &s, &dims)?;
    let q = e.div(y, x)?;
    Ok((dims, e.call("where", vec![t(z), t(at_zero), t(q)])?))
}

/// `prod`: the gradient times each element's partial (`prod_partials`).
pub(crate) fn prod(e: &mut dyn Emit, c: &Call, gs: G) -> R<Grads> {
    let g = g0!(gs);
    let x = c.tensor(0)?;
    let s = e.sizes(x);
    let (dims, partial) = prod_partials(e, c)?;
    let gk = keep(e, g, &s, &dims)?;
    Ok(one(0, e.mul(gk, partial)?))
}

pub(crate) fn jvp_prod(e: &mut dyn Emit, c: &Call, ts: &Tangents) -> R<Vec<Option<ValueId>>> {
    let Some(tv) = ts.get(0) else {
        return Ok(vec![None]);
    };
    let (dims, partial) = prod_partials(e, c)?;
    let p = e.mul(tv, partial)?;
    let d: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
    let sm = e.call("sum", vec![t(p), ints(&d), Arg::Bool(true)])?;
    let ys = e.sizes(c.outs[0]);
    Ok(vec![Some(e.view(sm, &ys)?)])
}

/// `amax`/`amin`/`max()`/`min()`: the gradient shared evenly between the
/// elements equal to the extreme.
pub(crate) fn amax(e: &mut dyn Emit, c: &Call, gs: G) -> R<Grads> {
    let g = g0!(gs);
    let x = c.tensor(0)?;
    let s = e.sizes(x);
    // `max()` / `min()` (an extreme's full overload) reduce everything.
    let dims = if matches!(lowering(c), Lowering::Extreme { .. }) {
        (0..s.len()).collect()
    } else {
        reduced_dims(c, 1, s.len())?
    };
    let (mask, count) = extreme_mask(e, x, c.outs[0], &s, &dims)?;
    let gk = keep(e, g, &s, &dims)?;
    let gm = e.mul(gk, mask)?;
    Ok(one(0, e.div(gm, count)?))
}

fn extreme_mask(
    e: &mut dyn Emit,
    x: ValueId,
    y: ValueId,
    s: &[usize],
    dims: &[usize],
) -> R<(ValueId, ValueId)> {
    let yk = keep(e, y, s, dims)?;
    let mask = e.call("eq", vec![t(x), t(yk)])?;
    let d: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
    let count = e.call("sum", vec![t(mask), ints(&d), Arg::Bool(true)])?;
    Ok((mask, count))
}

/// The dimension `max.dim`/`min.dim`, `sort` and `topk` select along,
/// and whether the values keep it.
fn selected_dim(c: &Call, rank: usize) -> R<(usize, bool)> {
    let (dim, keepdim) = match lowering(c) {
        Lowering::Sort { topk: false } => (int_at(c, 1)?, true),
        Lowering::Sort { topk: true } => (int_at(c, 2)?, true),
        _ => (
            int_at(c, 1)?,
            matches!(c.args.get(2), Some(Arg::Bool(true))),
        ),
    };
    Ok((wrap(dim, rank)?, keepdim))
}

/// `max.dim`/`min.dim`, `sort`, `topk`: the values' gradient scattered
/// back to where the indices say they came from.
pub(crate) fn select_values(e: &mut dyn Emit, c: &Call, gs: G) -> R<Grads> {
    let g = g0!(gs);
    let x = c.tensor(0)?;
    let s = e.sizes(x);
    let (d, keepdim) = selected_dim(c, s.len())?;
    let idx = c.outs[1];
    let (gk, ik) = if keepdim || s.is_empty() {
        (g, idx)
    } else {
        (keep(e, g, &s, &[d])?, keep(e, idx, &s, &[d])?)
    };
    let z = e.zeros_like(x)?;
    Ok(one(
        0,
        e.call("scatter", vec![t(z), int(d as i64), t(ik), t(gk)])?,
    ))
}

pub(crate) fn softmax(e: &mut dyn Emit, c: &Call, gs: G) -> R<Grads> {
    let g = g0!(gs);
    let y = c.outs[0];
    let dim = int_at(c, 1)?;
    let gy = e.mul(g, y)?;
    let s = e.call("sum", vec![t(gy), ints(&[dim]), Arg::Bool(true)])?;
    let d = e.sub(g, s)?;
    Ok(one(0, e.mul(y, d)?))
}

pub(crate) fn log_softmax(e: &mut dyn Emit, c: &Call, gs: G) -> R<Grads> {
    let g = g0!(gs);
    let y = c.outs[0];
    let dim = int_at(c, 1)?;
    let p = e.call("exp", vec![t(y)])?;
    let s = e.call("sum", vec![t(g), ints(&[dim]), Arg::Bool(true)])?;
    let ps = e.mul(p, s)?;
    Ok(one(0, e.sub(g, ps)?))
}

pub(crate) fn cumsum(e: &mut dyn Emit, c: &Call, gs: G) -> R<Grads> {
    let g = g0!(gs);
    let dim = int_at(c, 1)?;
    let f = e.call("flip", vec![t(g), ints(&[dim])])?;
    let s = e.call("cumsum", vec![t(f), int(dim)])?;
    Ok(one(0, e.call("flip", vec![t(s), ints(&[dim])])?))
}

// ------------------------------------------------------------ linear algebra

fn mt(e: &mut dyn Emit, v: ValueId) -> R<ValueId> {
    e.transpose(v, -2, -1)
}

pub(crate) fn mm(e: &mut dyn Emit, c: &Call, gs: G) -> R<Grads> {
    let g = g0!(gs);
    let (a, b) = (c.tensor(0)?, c.tensor(1)?);
    let (bt, at) = (mt(e, b)?, mt(e, a)?);
    Ok(vec![
        (0, None, e.call_id(c.op, vec![t(g), t(bt)])?[0]),
        (1, None, e.call_id(c.op, vec![t(at), t(g)])?[0]),
    ])
}

/// `matmul` with its 1-d cases: operands made 2-d, the gradient given the
/// dimensions the result dropped.
pub(crate) fn matmul(e: &mut dyn Emit, c: &Call, gs: G) -> R<Grads> {
    let g = g0!(gs);
    let (a, b) = (c.tensor(0)?, c.tensor(1)?);
    let (ra, rb) = (e.rank(a), e.rank(b));
    let a2 = if ra == 1 { e.unsqueeze(a, 0)? } else { a };
    let b2 = if rb == 1 { e.unsqueeze(b, 1)? } else { b };
    let mut g2 = g;
    if ra == 1 {
        let r = e.rank(g2) as i64;
        g2 = e.unsqueeze(g2, if rb == 1 { 0 } else { r - 1 })?;
    }
    if rb == 1 {
        g2 = e.unsqueeze(g2, -1)?;
    }
    let (bt, at) = (mt(e, b2)?, mt(e, a2)?);
    let ga = e.call("matmul", vec![t(g2), t(bt)])?;
    let gb = e.call("matmul", vec![t(at), t(g2)])?;
    // Sum broadcast batch dimensions, then drop the added ones.
    let ga = e.sum_like(ga, a2)?;
    let gb = e.sum_like(gb, b2)?;
    let (sa, sb) = (e.sizes(a), e.sizes(b));
    Ok(vec![
        (0, None, e.view(ga, &sa)?),
        (1, None, e.view(gb, &sb)?),
    ])
}

/// The plain product of an `addmm`-like op: `bmm` for batched ones.
fn product_of(c: &Call) -> &'static str {
    match lowering(c).product() {
        Some(f) if f.batched => "bmm",
        _ => "mm",
    }
}

pub(crate) fn addmm(e: &mut dyn Emit, c: &Call, gs: G) -> R<Grads> {
    let g = g0!(gs);
    let (m1, m2) = (c.tensor(1)?, c.tensor(2)?);
    let (beta, alpha) = (num(c, 3).unwrap_or(1.0), num(c, 4).unwrap_or(1.0));
    let op = product_of(c);
    let (m2t, m1t) = (mt(e, m2)?, mt(e, m1)?);
    let g1 = e.call(op, vec![t(g), t(m2t)])?;
    let g2 = e.call(op, vec![t(m1t), t(g)])?;
    let mut out = vec![
        (1, None, e.scale(g1, alpha)?),
        (2, None, e.scale(g2, alpha)?),
    ];
    if beta != 0.0 {
        out.push((0, None, e.scale(g, beta)?));
    }
    Ok(out)
}

pub(crate) fn linear(e: &mut dyn Emit, c: &Call, gs: G) -> R<Grads> {
    let g = g0!(gs);
    let (x, w) = (c.tensor(0)?, c.tensor(1)?);
    let ws = e.sizes(w);
    let gx = e.call("matmul", vec![t(g), t(w)])?;
    let g2 = e.view(g, &[e.meta(g).numel() / ws[0].max(1), ws[0]])?;
    let x2 = e.view(x, &[e.meta(x).numel() / ws[1].max(1), ws[1]])?;
    let g2t = e.transpose(g2, 0, 1)?;
    let gw = e.call("mm", vec![t(g2t), t(x2)])?;
    let mut out = vec![(0, None, gx), (1, None, gw)];
    if c.opt_tensor(2).is_some() {
        out.push((2, None, g));
    }
    Ok(out)
}

/// Layer norm's normalized input and `1/sigma` (kept dims).
fn normalized(e: &mut dyn Emit, c: &Call) -> R<(ValueId, ValueId, Vec<i64>)> {
    let x = c.tensor(0)?;
    let k = list_at(c, 1).map_or(0, |l| l.len());
    let r = e.rank(x);
    let dims: Vec<i64> = (r - k..r).map(|d| d as i64).collect();
    let eps = num(c, 4).unwrap_or(1e-5);
    let m = e.call("mean", vec![t(x), ints(&dims), Arg::Bool(true)])?;
    let xc = e.sub(x, m)?;
    let sq = e.mul(xc, xc)?;
    let var = e.call("mean", vec![t(sq), ints(&dims), Arg::Bool(true)])?;
    let ve = e.add_scalar(var, eps)?;
    let rstd = e.call("rsqrt", vec![t(ve)])?;
    Ok((e.mul(xc, rstd)?, rstd, dims))
}

pub(crate) fn layer_norm(e: &mut dyn Emit, c: &Call, gs: G) -> R<Grads> {
    let g = g0!(gs);
    let (xhat, rstd, dims) = normalized(e, c)?;
    let w = c.opt_tensor(2);
    let gw = match w {
        Some(w) => e.mul(g, w)?,
        None => g,
    };
    let m1 = e.call("mean", vec![t(gw), ints(&dims), Arg::Bool(true)])?;
    let gx = e.mul(gw, xhat)?;
    let m2 = e.call("mean", vec![t(gx), ints(&dims), Arg::Bool(true)])?;
    let a = e.sub(gw, m1)?;
    let b = e.mul(xhat, m2)?;
    let d = e.sub(a, b)?;
    let mut out = one(0, e.mul(rstd, d)?);
    if w.is_some() {
        out.push((2, None, e.mul(g, xhat)?));
    }
    if c.opt_tensor(3).is_some() {
        out.push((3, None, g));
    }
    Ok(out)
}

pub(crate) fn embedding(e: &mut dyn Emit, c: &Call, gs: G) -> R<Grads> {
    let g = g0!(gs);
    let (w, idx) = (c.tensor(0)?, c.tensor(1)?);
    if matches!(c.args.get(3), Some(Arg::Bool(true))) {
        return Err(
            "the derivative of embedding with scale_grad_by_freq=True is not implemented".into(),
        );
    }
    let ws = e.sizes(w);
    let n = e.meta(idx).numel();
    let gf = e.view(g, &[n, ws[1]])?;
    let fi = e.view(idx, &[n])?;
    let pad = int_at(c, 2).unwrap_or(-1);
    let gf = if pad >= 0 {
        let hit = e.call("eq", vec![t(fi), int(pad)])?;
        let hit = e.unsqueeze(hit, 1)?;
        e.call("masked_fill", vec![t(gf), t(hit), float(0.0)])?
    } else {
        gf
    };
    let z = e.zeros_like(w)?;
    Ok(one(
        0,
        e.call(
            "index_put",
            vec![
                t(z),
                Arg::TensorList(vec![Some(fi)]),
                t(gf),
                Arg::Bool(true),
            ],
        )?,
    ))
}

/// Scaled dot product attention, spelled out: scores, probabilities.
struct Attention {
    q: ValueId,
    k: ValueId,
    v: ValueId,
    p: ValueId,
    scale: f64,
}

fn attention(e: &mut dyn Emit, c: &Call) -> R<Attention> {
    let (q, k, v) = (c.tensor(0)?, c.tensor(1)?, c.tensor(2)?);
    if num(c, 4).unwrap_or(0.0) != 0.0 {
        return Err("the derivative of scaled_dot_product_attention with dropout is not implemented (dropout is random)".into());
    }
    if matches!(c.args.get(7), Some(Arg::Bool(true))) {
        return Err("the derivative of scaled_dot_product_attention with enable_gqa=True is not implemented".into());
    }
    let qs = e.sizes(q);
    let ks = e.sizes(k);
    let scale = num(c, 6).unwrap_or(1.0 / (qs[qs.len() - 1] as f64).sqrt());
    let kt = mt(e, k)?;
    let s0 = e.call("matmul", vec![t(q), t(kt)])?;
    let mut s = e.scale(s0, scale)?;
    if let Some(m) = c.opt_tensor(3) {
        s = if e.dtype(m) == crate::dtype::DType::Bool {
            let off = e.call("logical_not", vec![t(m)])?;
            e.call("masked_fill", vec![t(s), t(off), float(f64::NEG_INFINITY)])?
        } else {
            e.add(s, m)?
        };
    }
    if matches!(c.args.get(5), Some(Arg::Bool(true))) {
        let (l, sk) = (qs[qs.len() - 2], ks[ks.len() - 2]);
        let ones = e.call(
            "ones",
            vec![sizes_arg(&[l, sk]), Arg::Dtype(crate::dtype::DType::Bool)],
        )?;
        let keep = e.call("tril", vec![t(ones)])?;
        let off = e.call("logical_not", vec![t(keep)])?;
        s = e.call("masked_fill", vec![t(s), t(off), float(f64::NEG_INFINITY)])?;
    }
    let p = e.call("softmax", vec![t(s), int(-1)])?;
    // A row whose every key is masked attends to nothing (PyTorch's safe
    // softmax): zeros, not NaN.
    let top = e.call("amax", vec![t(s), ints(&[-1]), Arg::Bool(true)])?;
    let dead = e.call("eq", vec![t(top), float(f64::NEG_INFINITY)])?;
    let p = e.call("masked_fill", vec![t(p), t(dead), float(0.0)])?;
    Ok(Attention { q, k, v, p, scale })
}

pub(crate) fn sdpa(e: &mut dyn Emit, c: &Call, gs: G) -> R<Grads> {
    let g = g0!(gs);
    let a = attention(e, c)?;
    let pt = mt(e, a.p)?;
    let gv = e.call("matmul", vec![t(pt), t(g)])?;
    let vt = mt(e, a.v)?;
    let dp = e.call("matmul", vec![t(g), t(vt)])?;
    let dpp = e.mul(dp, a.p)?;
    let s = e.call("sum", vec![t(dpp), ints(&[-1]), Arg::Bool(true)])?;
    let d = e.sub(dp, s)?;
    let ds = e.mul(a.p, d)?;
    let gq0 = e.call("matmul", vec![t(ds), t(a.k)])?;
    let dst = mt(e, ds)?;
    let gk0 = e.call("matmul", vec![t(dst), t(a.q)])?;
    let mut out = vec![
        (0, None, e.scale(gq0, a.scale)?),
        (1, None, e.scale(gk0, a.scale)?),
        (2, None, gv),
    ];
    if let Some(m) = c.opt_tensor(3) {
        if e.dtype(m).is_float() {
            out.push((3, None, ds));
        }
    }
    Ok(out)
}

// ------------------------------------------------------------ shape ops

/// A view copy's gradient: the cotangent written back through the view
/// into zeros (`ops::inverse`, as the pass writes a mutated view back).
pub(crate) fn written_back(e: &mut dyn Emit, c: &Call, gs: G) -> R<Grads> {
    let g = g0!(gs);
    let x = c.tensor(0)?;
    let crate::ops::Rule::ViewCopy(view) = c.op.def().rule else {
        return Err(format!(
            "internal error: {} is not a view copy",
            c.op.name()
        ));
    };
    let needs = view.def().inverse.is_some_and(|i| i.needs_parent());
    let parent = if needs { Some(e.zeros_like(x)?) } else { None };
    let (pm, gm) = (e.meta(x).clone(), e.meta(g).clone());
    let step = crate::ops::inverse::ViewStep {
        view,
        args: &c.args[1..],
        index: 0,
    };
    let call = crate::ops::inverse::write_back(step, parent, &pm, g, &gm, true)?;
    Ok(one(
        0,
        match call {
            Some((op, args)) => e.call_id(op, args)?[0],
            None => g,
        },
    ))
}

/// Views that may repeat elements (`as_strided`, `unfold`): each element
/// of the base collects the gradient of every place it appears in, found
/// by applying the view to the base's element indices.
pub(crate) fn gathered_copy(e: &mut dyn Emit, c: &Call, gs: G) -> R<Grads> {
    let g = g0!(gs);
    let x = c.tensor(0)?;
    let s = e.sizes(x);
    let n = e.meta(x).numel();
    let ar = e.call(
        "arange",
        vec![int(n as i64), Arg::Dtype(crate::dtype::DType::I64)],
    )?;
    let ix = e.view(ar, &s)?;
    let mut args = c.args.to_vec();
    args[0] = t(ix);
    let iv = e.call_id(c.op, args)?[0];
    let m = e.meta(iv).numel();
    let fi = e.view(iv, &[m])?;
    let gf = e.view(g, &[m])?;
    let z = e.zeros(&[n], e.dtype(x))?;
    let acc = e.call(
        "index_put",
        vec![
            t(z),
            Arg::TensorList(vec![Some(fi)]),
            t(gf),
            Arg::Bool(true),
        ],
    )?;
    Ok(one(0, e.view(acc, &s)?))
}

/// `split_copy`, `split_with_sizes_copy`, `unbind_copy`: the pieces'
/// gradients (zeros for pieces without one) put back together.
pub(crate) fn pieces_copy(e: &mut dyn Emit, c: &Call, gs: G) -> R<Grads> {
    if gs.iter().all(Option::is_none) {
        return Ok(vec![]);
    }
    let unbind = matches!(c.op.def().rule, crate::ops::Rule::ViewCopy(v) if v.def().inverse == Some(crate::ops::Inverse::Unbind));
    let dim = if unbind { int_at(c, 1)? } else { int_at(c, 2)? };
    let mut parts = vec![];
    for (k, &o) in c.outs.iter().enumerate() {
        parts.push(Some(e.or_zeros(gs[k], o)?));
    }
    let op = if unbind { "stack" } else { "cat" };
    Ok(one(0, e.call(op, vec![Arg::TensorList(parts), int(dim)])?))
}

pub(crate) fn cat(e: &mut dyn Emit, c: &Call, gs: G) -> R<Grads> {
    let g = g0!(gs);
    let l = c.list(0);
    let dim = int_at(c, 1)?;
    let stack = lowering(c) == Lowering::Map(Elem::Join { stack: true });
    let r = e.rank(g);
    let d = wrap(dim, r)?;
    let mut out = vec![];
    let mut off = 0usize;
    for (j, v) in l.iter().enumerate() {
        let Some(v) = *v else { continue };
        if stack {
            out.push((
                0,
                Some(j),
                e.call("select_copy", vec![t(g), int(d as i64), int(j as i64)])?,
            ));
        } else {
            let vs = e.sizes(v);
            // cat skips 1-d empty tensors.
            if vs.len() == 1 && vs[0] == 0 && r != 1 {
                continue;
            }
            let len = vs[d];
            out.push((
                0,
                Some(j),
                e.call(
                    "slice_copy",
                    vec![
                        t(g),
                        int(d as i64),
                        int(off as i64),
                        int((off + len) as i64),
                        int(1),
                    ],
                )?,
            ));
            off += len;
        }
    }
    Ok(out)
}

pub(crate) fn same_op_on_grad(e: &mut dyn Emit, c: &Call, gs: G) -> R<Grads> {
    let g = g0!(gs);
    let mut args = c.args.to_vec();
    args[0] = t(g);
    Ok(one(0, e.call_id(c.op, args)?[0]))
}

pub(crate) fn repeat(e: &mut dyn Emit, c: &Call, gs: G) -> R<Grads> {
    let g = g0!(gs);
    let x = c.tensor(0)?;
    let s = e.sizes(x);
    let reps = list_at(c, 1).unwrap_or_default();
    let lead = reps.len() - s.len();
    // [r0.., r_i, s_i, ...]: sum over the repeat factors.
    let mut shape = vec![];
    let mut dims = vec![];
    for (i, &r) in reps.iter().enumerate() {
        if i < lead {
            dims.push(shape.len());
            shape.push(r as usize);
        } else {
            dims.push(shape.len());
            shape.push(r as usize);
            shape.push(s[i - lead]);
        }
    }
    let v = e.view(g, &shape)?;
    let r = e.sum_dims(v, &dims, false)?;
    Ok(one(0, e.view(r, &s)?))
}

pub(crate) fn pad(e: &mut dyn Emit, c: &Call, gs: G) -> R<Grads> {
    let g = g0!(gs);
    let p: Vec<i64> = list_at(c, 1)
        .unwrap_or_default()
        .iter()
        .map(|x| -x)
        .collect();
    Ok(one(0, e.call("constant_pad_nd", vec![t(g), ints(&p)])?))
}

/// `<view>_scatter(self, src, ...)`: `self` gets the gradient outside the
/// view, `src` the view of the gradient.
pub(crate) fn scatter_view(e: &mut dyn Emit, c: &Call, gs: G) -> R<Grads> {
    let g = g0!(gs);
    let src = c.tensor(1)?;
    let view =
        c.op.name()
            .strip_suffix("_scatter")
            .unwrap_or_default()
            .to_string();
    let z = e.zeros_like(src)?;
    let mut a = vec![t(g), t(z)];
    a.extend(c.args[2..].iter().cloned());
    let gself = e.call_id(c.op, a)?[0];
    let mut b = vec![t(g)];
    b.extend(c.args[2..].iter().cloned());
    let gsrc = e.call(&format!("{view}_copy"), b)?;
    Ok(vec![(0, None, gself), (1, None, gsrc)])
}

// ------------------------------------------------------------ indexing

pub(crate) fn index_select(e: &mut dyn Emit, c: &Call, gs: G) -> R<Grads> {
    let g = g0!(gs);
    let x = c.tensor(0)?;
    let z = e.zeros_like(x)?;
    Ok(one(
        0,
        e.call(
            "index_add",
            vec![t(z), c.args[1].clone(), c.args[2].clone(), t(g)],
        )?,
    ))
}

pub(crate) fn index(e: &mut dyn Emit, c: &Call, gs: G) -> R<Grads> {
    let g = g0!(gs);
    let z = e.zeros_like(c.tensor(0)?)?;
    Ok(one(
        0,
        e.call(
            "index_put",
            vec![t(z), c.args[1].clone(), t(g), Arg::Bool(true)],
        )?,
    ))
}

pub(crate) fn gather(e: &mut dyn Emit, c: &Call, gs: G) -> R<Grads> {
    let g = g0!(gs);
    let z = e.zeros_like(c.tensor(0)?)?;
    Ok(one(
        0,
        e.call(
            "scatter_add",
            vec![t(z), c.args[1].clone(), c.args[2].clone(), t(g)],
        )?,
    ))
}

pub(crate) fn take_along_dim(e: &mut dyn Emit, c: &Call, gs: G) -> R<Grads> {
    let g = g0!(gs);
    let (x, idx) = (c.tensor(0)?, c.tensor(1)?);
    let gsz = e.sizes(g);
    match c.args.get(2) {
        Some(Arg::Int(d)) => {
            let d = wrap(*d, gsz.len())?;
            let ib = e.expand(idx, &gsz)?;
            let mut zs = gsz.clone();
            zs[d] = e.sizes(x)[d];
            let z = e.zeros(&zs, e.dtype(x))?;
            Ok(one(
                0,
                e.call("scatter_add", vec![t(z), int(d as i64), t(ib), t(g)])?,
            ))
        }
        _ => {
            let n = e.meta(x).numel();
            let m = e.meta(g).numel();
            let z = e.zeros(&[n], e.dtype(x))?;
            let fi = e.view(idx, &[m])?;
            let gf = e.view(g, &[m])?;
            let r = e.call("scatter_add", vec![t(z), int(0), t(fi), t(gf)])?;
            let s = e.sizes(x);
            Ok(one(0, e.view(r, &s)?))
        }
    }
}

pub(crate) fn scatter(e: &mut dyn Emit, c: &Call, gs: G) -> R<Grads> {
    let g = g0!(gs);
    let (dim, idx) = (c.args[1].clone(), c.args[2].clone());
    let gself = e.call("scatter", vec![t(g), dim.clone(), idx.clone(), float(0.0)])?;
    let mut out = one(0, gself);
    if c.opt_tensor(3).is_some() {
        out.push((3, None, e.call("gather", vec![t(g), dim, idx])?));
    }
    Ok(out)
}

pub(crate) fn scatter_add(e: &mut dyn Emit, c: &Call, gs: G) -> R<Grads> {
    let g = g0!(gs);
    let gsrc = e.call("gather", vec![t(g), c.args[1].clone(), c.args[2].clone()])?;
    Ok(vec![(0, None, g), (3, None, gsrc)])
}

pub(crate) fn index_add(e: &mut dyn Emit, c: &Call, gs: G) -> R<Grads> {
    let g = g0!(gs);
    let alpha = num(c, 4).unwrap_or(1.0);
    let sel = e.call(
        "index_select",
        vec![t(g), c.args[1].clone(), c.args[2].clone()],
    )?;
    let src = c.tensor(3)?;
    let sel = if e.rank(src) == 0 {
        e.view(sel, &[])?
    } else {
        sel
    };
    Ok(vec![(0, None, g), (3, None, e.scale(sel, alpha)?)])
}

pub(crate) fn index_copy(e: &mut dyn Emit, c: &Call, gs: G) -> R<Grads> {
    let g = g0!(gs);
    let src = c.tensor(3)?;
    let z = e.zeros_like(src)?;
    let gself = e.call(
        "index_copy",
        vec![t(g), c.args[1].clone(), c.args[2].clone(), t(z)],
    )?;
    let sel = e.call(
        "index_select",
        vec![t(g), c.args[1].clone(), c.args[2].clone()],
    )?;
    let sel = if e.rank(src) == 0 {
        e.view(sel, &[])?
    } else {
        sel
    };
    Ok(vec![(0, None, gself), (3, None, sel)])
}

pub(crate) fn index_put(e: &mut dyn Emit, c: &Call, gs: G) -> R<Grads> {
    let g = g0!(gs);
    let vals = c.tensor(2)?;
    let acc = matches!(c.args.get(3), Some(Arg::Bool(true)));
    let gself = if acc {
        g
    } else {
        let z = e.zeros(&[], e.dtype(vals))?;
        e.call(
            "index_put",
            vec![t(g), c.args[1].clone(), t(z), Arg::Bool(false)],
        )?
    };
    let gv = e.call("index", vec![t(g), c.args[1].clone()])?;
    Ok(vec![(0, None, gself), (2, None, gv)])
}

// ------------------------------------------------------------ JVP rules

/// Elementwise ops: the Jacobian is diagonal, so the tangent is the VJP
/// rule's gradient for each argument, given that argument's tangent.
pub(crate) fn jvp_diag(e: &mut dyn Emit, c: &Call, ts: &Tangents) -> R<Vec<Option<ValueId>>> {
    let vjp =
        c.op.def()
            .rules
            .vjp
            .ok_or("internal error: diagonal JVP without a VJP")?;
    let mut acc = None;
    for i in 0..c.args.len() {
        if let Some(tv) = ts.get(i) {
            let gs = vjp(e, c, &[Some(tv)])?;
            for (pos, _, g) in gs {
                if pos == i {
                    acc = e.add_opt(acc, Some(g))?;
                }
            }
        }
    }
    Ok(vec![acc])
}

/// Ops linear in their floating tensor arguments: the op applied to the
/// tangents (zeros where absent), integer tensors (indices, masks) and
/// other arguments as they are, except fill values, which become 0.
pub(crate) fn jvp_linear(e: &mut dyn Emit, c: &Call, ts: &Tangents) -> R<Vec<Option<ValueId>>> {
    // Fill values (a literal where a tensor would be linear) become 0.
    let zero_at: &[usize] = match lowering(c).elem() {
        Some(Elem::Remap(crate::ops::RemapKind::Pad) | Elem::MaskedFill) => &[2],
        Some(Elem::Fill { value: 1 }) => &[1],
        Some(Elem::ScatterInto {
            add: false,
            copy: false,
        }) => &[3],
        _ => &[],
    };
    let mut args = vec![];
    for (i, a) in c.args.iter().enumerate() {
        args.push(match a {
            Arg::Tensor(v) if e.dtype(*v).is_float() => t(match ts.get(i) {
                Some(tv) => tv,
                None => e.zeros_like(*v)?,
            }),
            Arg::TensorList(l) => {
                let mut nl = vec![];
                for (j, v) in l.iter().enumerate() {
                    nl.push(match v {
                        Some(v) if e.dtype(*v).is_float() => Some(match ts.get_in(i, j) {
                            Some(tv) => tv,
                            None => e.zeros_like(*v)?,
                        }),
                        other => *other,
                    });
                }
                Arg::TensorList(nl)
            }
            Arg::Int(_) | Arg::Float(_) if zero_at.contains(&i) => float(0.0),
            other => other.clone(),
        });
    }
    let rs = e.call_id(c.op, args)?;
    Ok(rs.into_iter().map(Some).collect())
}

/// `op(t_a, b) + op(a, t_b)` for ops linear in each of two arguments.
pub(crate) fn jvp_bilinear(e: &mut dyn Emit, c: &Call, ts: &Tangents) -> R<Vec<Option<ValueId>>> {
    let form = lowering(c)
        .product()
        .ok_or_else(|| format!("internal error: {} is no product", c.op.name()))?;
    let (ia, ib) = (form.left, form.right);
    let mut acc = None;
    for (i, other) in [(ia, ib), (ib, ia)] {
        let _ = other;
        if let Some(tv) = ts.get(i) {
            let mut args = c.args.to_vec();
            args[i] = t(tv);
            let r = match form.addend {
                Some(_) if form.linear => {
                    e.call_id(c.op, vec![args[0].clone(), args[1].clone()])?[0]
                }
                Some(_) => {
                    let p = e.call(product_of(c), vec![args[1].clone(), args[2].clone()])?;
                    e.scale(p, num(c, 4).unwrap_or(1.0))?
                }
                None => e.call_id(c.op, args)?[0],
            };
            acc = e.add_opt(acc, Some(r))?;
        }
    }
    let extra = match form.addend {
        Some(i) if form.linear => ts.get(i),
        Some(i) => match ts.get(i) {
            Some(tv) => Some(e.scale(tv, num(c, 3).unwrap_or(1.0))?),
            None => None,
        },
        None => None,
    };
    Ok(vec![e.add_opt(acc, extra)?])
}

pub(crate) fn jvp_softmax(e: &mut dyn Emit, c: &Call, ts: &Tangents) -> R<Vec<Option<ValueId>>> {
    let Some(tv) = ts.get(0) else {
        return Ok(vec![None]);
    };
    let y = c.outs[0];
    let dim = int_at(c, 1)?;
    let r = if lowering(c) == (Lowering::Softmax { log: true }) {
        let p = e.call("exp", vec![t(y)])?;
        let pt = e.mul(p, tv)?;
        let s = e.call("sum", vec![t(pt), ints(&[dim]), Arg::Bool(true)])?;
        e.sub(tv, s)?
    } else {
        let yt = e.mul(y, tv)?;
        let s = e.call("sum", vec![t(yt), ints(&[dim]), Arg::Bool(true)])?;
        let d = e.sub(tv, s)?;
        e.mul(y, d)?
    };
    Ok(vec![Some(r)])
}

pub(crate) fn jvp_var(e: &mut dyn Emit, c: &Call, ts: &Tangents) -> R<Vec<Option<ValueId>>> {
    let Some(tv) = ts.get(0) else {
        return Ok(vec![None]);
    };
    let x = c.tensor(0)?;
    let s = e.sizes(x);
    let dims = reduced_dims(c, 1, s.len())?;
    let n: usize = dims.iter().map(|&d| s[d]).product();
    let corr = num(c, 2).unwrap_or(1.0);
    let keepdim = matches!(c.args.get(3), Some(Arg::Bool(true)));
    let d: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
    let m = e.call("mean", vec![t(x), ints(&d), Arg::Bool(true)])?;
    let xc = e.sub(x, m)?;
    let p = e.mul(xc, tv)?;
    let sm = e.call("sum", vec![t(p), ints(&d), Arg::Bool(keepdim)])?;
    let y = c.outs[0];
    let sm = e.view(sm, &e.sizes(y))?;
    let r = if lowering(c) == Lowering::Reduce(Reduction::Var { sqrt: true }) {
        let q = e.div(sm, y)?;
        let z = e.call("eq", vec![t(y), int(0)])?;
        let q = e.call("masked_fill", vec![t(q), t(z), float(0.0)])?;
        e.scale(q, 1.0 / (n as f64 - corr))?
    } else {
        e.scale(sm, 2.0 / (n as f64 - corr))?
    };
    Ok(vec![Some(r)])
}

pub(crate) fn jvp_amax(e: &mut dyn Emit, c: &Call, ts: &Tangents) -> R<Vec<Option<ValueId>>> {
    let Some(tv) = ts.get(0) else {
        return Ok(vec![None]);
    };
    let x = c.tensor(0)?;
    let s = e.sizes(x);
    let extreme = matches!(lowering(c), Lowering::Extreme { .. });
    let full = extreme && c.outs.len() == 1;
    if extreme && !full {
        return jvp_select_values(e, c, ts);
    }
    let dims = if full {
        (0..s.len()).collect()
    } else {
        reduced_dims(c, 1, s.len())?
    };
    let (mask, count) = extreme_mask(e, x, c.outs[0], &s, &dims)?;
    let tm = e.mul(tv, mask)?;
    let d: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
    let sm = e.call("sum", vec![t(tm), ints(&d), Arg::Bool(true)])?;
    let q = e.div(sm, count)?;
    let ys = e.sizes(c.outs[0]);
    Ok(vec![Some(e.view(q, &ys)?)])
}

/// Values picked by indices (`max.dim`, `sort`, `topk`): the tangent
/// gathered at the same indices.
pub(crate) fn jvp_select_values(
    e: &mut dyn Emit,
    c: &Call,
    ts: &Tangents,
) -> R<Vec<Option<ValueId>>> {
    let Some(tv) = ts.get(0) else {
        return Ok(vec![None, None]);
    };
    let x = c.tensor(0)?;
    let s = e.sizes(x);
    let (d, keepdim) = selected_dim(c, s.len())?;
    let idx = c.outs[1];
    let ik = if keepdim || s.is_empty() {
        idx
    } else {
        keep(e, idx, &s, &[d])?
    };
    let gth = e.call("gather", vec![t(tv), int(d as i64), t(ik)])?;
    let ys = e.sizes(c.outs[0]);
    Ok(vec![Some(e.view(gth, &ys)?), None])
}

pub(crate) fn jvp_layer_norm(e: &mut dyn Emit, c: &Call, ts: &Tangents) -> R<Vec<Option<ValueId>>> {
    let (xhat, rstd, dims) = normalized(e, c)?;
    let w = c.opt_tensor(2);
    let mut acc = None;
    if let Some(tx) = ts.get(0) {
        // rstd (t - mean(t) - xhat mean(t xhat))
        let m1 = e.call("mean", vec![t(tx), ints(&dims), Arg::Bool(true)])?;
        let tx_h = e.mul(tx, xhat)?;
        let m2 = e.call("mean", vec![t(tx_h), ints(&dims), Arg::Bool(true)])?;
        let a = e.sub(tx, m1)?;
        let b = e.mul(xhat, m2)?;
        let d = e.sub(a, b)?;
        let th = e.mul(rstd, d)?;
        acc = Some(match w {
            Some(w) => e.mul(th, w)?,
            None => th,
        });
    }
    if let Some(tw) = ts.get(2) {
        let p = e.mul(xhat, tw)?;
        acc = e.add_opt(acc, Some(p))?;
    }
    acc = e.add_opt(acc, ts.get(3))?;
    Ok(vec![acc])
}

pub(crate) fn jvp_sdpa(e: &mut dyn Emit, c: &Call, ts: &Tangents) -> R<Vec<Option<ValueId>>> {
    let a = attention(e, c)?;
    let (tq, tk, tv) = (ts.get(0), ts.get(1), ts.get(2));
    let mut t_s = None;
    if let Some(tq) = tq {
        let kt = mt(e, a.k)?;
        t_s = Some(e.call("matmul", vec![t(tq), t(kt)])?);
    }
    if let Some(tk) = tk {
        let tkt = mt(e, tk)?;
        let p = e.call("matmul", vec![t(a.q), t(tkt)])?;
        t_s = e.add_opt(t_s, Some(p))?;
    }
    let mut t_s = match t_s {
        Some(x) => Some(e.scale(x, a.scale)?),
        None => None,
    };
    if let Some(tm) = ts.get(3) {
        t_s = e.add_opt(t_s, Some(tm))?;
    }
    let mut out = None;
    if let Some(t_s) = t_s {
        let ps = e.mul(a.p, t_s)?;
        let s = e.call("sum", vec![t(ps), ints(&[-1]), Arg::Bool(true)])?;
        let d = e.sub(t_s, s)?;
        let tp = e.mul(a.p, d)?;
        out = Some(e.call("matmul", vec![t(tp), t(a.v)])?);
    }
    if let Some(tv) = tv {
        let p = e.call("matmul", vec![t(a.p), t(tv)])?;
        out = e.add_opt(out, Some(p))?;
    }
    Ok(vec![out])
}

// ------------------------------------------------------------ shared rules

/// `max` / `min`: of everything (`amax`'s rule), or along a dim (values
/// and indices).
pub(crate) fn max_min(e: &mut dyn Emit, c: &Call, gs: G) -> R<Grads> {
    if c.outs.len() == 1 {
        amax(e, c, gs)
    } else {
        select_values(e, c, gs)
    }
}

/// No derivative flows: constant results (factories, `zero`, `fill` with
/// a scalar), integer results, rounding.
pub(crate) fn no_grad(_: &mut dyn Emit, _: &Call, _: G) -> R<Grads> {
    Ok(vec![])
}

/// No tangent flows (as `no_grad`).
pub(crate) fn jvp_none(_: &mut dyn Emit, c: &Call, _: &Tangents) -> R<Vec<Option<ValueId>>> {
    Ok(vec![None; c.outs.len()])
}
