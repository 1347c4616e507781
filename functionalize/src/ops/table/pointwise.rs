//! Elementwise ops (each with its in-place form where ATen has one) and the backward ops of derivatives.yaml that transforms emit.

use super::*;
use d::{Backward, Unary};

pub(super) fn declare(b: &mut Builder) {
    // Elementwise ops, each with its in-place form.
    let bin = |n: &str| {
        [
            format!("{n}.Tensor(Tensor self, Tensor other) -> Tensor"),
            format!("{n}.Scalar(Tensor self, Scalar other) -> Tensor"),
        ]
    };
    let unary = |n: &str| format!("{n}(Tensor self) -> Tensor");
    b.pointwise(
        "add",
        &[
            "add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor",
            "add.Scalar(Tensor self, Scalar other, Scalar alpha=1) -> Tensor",
        ],
        p::add,
        true,
    )
    .rules(d::add, d::jvp_diag, bt::elementwise);
    b.pointwise(
        "sub",
        &[
            "sub.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor",
            "sub.Scalar(Tensor self, Scalar other, Scalar alpha=1) -> Tensor",
        ],
        p::sub,
        true,
    )
    .rules(d::sub, d::jvp_diag, bt::elementwise);
    let [m0, m1] = bin("mul");
    b.pointwise("mul", &[&m0, &m1], p::mul, true)
        .rules(d::mul, d::jvp_diag, bt::elementwise);
    b.pointwise(
        "div",
        &[
            "div.Tensor(Tensor self, Tensor other) -> Tensor",
            "div.Scalar(Tensor self, Scalar other) -> Tensor",
            "div.Tensor_mode(Tensor self, Tensor other, *, str? rounding_mode) -> Tensor",
            "div.Scalar_mode(Tensor self, Scalar other, *, str? rounding_mode) -> Tensor",
        ],
        p::div,
        true,
    )
    .rules(d::div, d::jvp_diag, bt::elementwise);
    // Each with its VJP and JVP (`logical_not`'s: none flows).
    let unaries: [(&str, p::PlanFn, VjpFn, JvpFn); 28] = [
        (
            "silu",
            p::silu,
            |e, c, g| d::unary(e, c, g, Unary::Silu),
            d::jvp_diag,
        ),
        (
            "neg",
            p::neg,
            |e, c, g| d::unary(e, c, g, Unary::Neg),
            d::jvp_diag,
        ),
        (
            "exp",
            p::exp,
            |e, c, g| d::unary(e, c, g, Unary::Exp),
            d::jvp_diag,
        ),
        (
            "log",
            p::log,
            |e, c, g| d::unary(e, c, g, Unary::Log),
            d::jvp_diag,
        ),
        (
            "sqrt",
            p::sqrt,
            |e, c, g| d::unary(e, c, g, Unary::Sqrt),
            d::jvp_diag,
        ),
        (
            "rsqrt",
            p::rsqrt,
            |e, c, g| d::unary(e, c, g, Unary::Rsqrt),
            d::jvp_diag,
        ),
        (
            "abs",
            p::abs,
            |e, c, g| d::unary(e, c, g, Unary::Abs),
            d::jvp_diag,
        ),
        (
            "relu",
            p::relu,
            |e, c, g| d::unary(e, c, g, Unary::Relu),
            d::jvp_diag,
        ),
        (
            "sigmoid",
            p::sigmoid,
            |e, c, g| d::unary(e, c, g, Unary::Sigmoid),
            d::jvp_diag,
        ),
        (
            "tanh",
            p::tanh,
            |e, c, g| d::unary(e, c, g, Unary::Tanh),
            d::jvp_diag,
        ),
        ("logical_not", p::logical_not, d::no_grad, d::jvp_none),
        (
            "sin",
            p::sin,
            |e, c, g| d::unary(e, c, g, Unary::Sin),
            d::jvp_diag,
        ),
        (
            "cos",
            p::cos,
            |e, c, g| d::unary(e, c, g, Unary::Cos),
            d::jvp_diag,
        ),
        (
            "reciprocal",
            p::reciprocal,
            |e, c, g| d::unary(e, c, g, Unary::Reciprocal),
            d::jvp_diag,
        ),
        (
            "erf",
            p::erf,
            |e, c, g| d::unary(e, c, g, Unary::Erf),
            d::jvp_diag,
        ),
        (
            "log1p",
            p::log1p,
            |e, c, g| d::unary(e, c, g, Unary::Log1p),
            d::jvp_diag,
        ),
        (
            "expm1",
            p::expm1,
            |e, c, g| d::unary(e, c, g, Unary::Expm1),
            d::jvp_diag,
        ),
        (
            "log2",
            p::log2,
            |e, c, g| d::unary(e, c, g, Unary::Log2),
            d::jvp_diag,
        ),
        (
            "log10",
            p::log10,
            |e, c, g| d::unary(e, c, g, Unary::Log10),
            d::jvp_diag,
        ),
        (
            "tan",
            p::tan,
            |e, c, g| d::unary(e, c, g, Unary::Tan),
            d::jvp_diag,
        ),
        (
            "asin",
            p::asin,
            |e, c, g| d::unary(e, c, g, Unary::Asin),
            d::jvp_diag,
        ),
        (
            "acos",
            p::acos,
            |e, c, g| d::unary(e, c, g, Unary::Acos),
            d::jvp_diag,
        ),
        (
            "atan",
            p::atan,
            |e, c, g| d::unary(e, c, g, Unary::Atan),
            d::jvp_diag,
        ),
        (
            "sinh",
            p::sinh,
            |e, c, g| d::unary(e, c, g, Unary::Sinh),
            d::jvp_diag,
        ),
        (
            "cosh",
            p::cosh,
            |e, c, g| d::unary(e, c, g, Unary::Cosh),
            d::jvp_diag,
        ),
        (
            "asinh",
            p::asinh,
            |e, c, g| d::unary(e, c, g, Unary::Asinh),
            d::jvp_diag,
        ),
        (
            "acosh",
            p::acosh,
            |e, c, g| d::unary(e, c, g, Unary::Acosh),
            d::jvp_diag,
        ),
        (
            "atanh",
            p::atanh,
            |e, c, g| d::unary(e, c, g, Unary::Atanh),
            d::jvp_diag,
        ),
    ];
    for (n, plan, vjp, jvp) in unaries {
        b.pointwise(n, &[&unary(n)], plan, true)
            .rules(vjp, jvp, bt::elementwise);
    }
    b.pointwise(
        "gelu",
        &["gelu(Tensor self, *, str approximate='none') -> Tensor"],
        p::gelu,
        true,
    )
    .rules(
        |e, c, g| d::unary(e, c, g, Unary::Gelu),
        d::jvp_diag,
        bt::elementwise,
    );
    b.pointwise(
        "pow",
        &[
            "pow.Tensor_Tensor(Tensor self, Tensor exponent) -> Tensor",
            "pow.Tensor_Scalar(Tensor self, Scalar exponent) -> Tensor",
            "pow.Scalar(Scalar self, Tensor exponent) -> Tensor",
        ],
        p::pow,
        true,
    )
    .rules(d::pow, d::jvp_diag, bt::elementwise);
    b.pointwise(
        "maximum",
        &["maximum(Tensor self, Tensor other) -> Tensor"],
        p::maximum,
        false, // ATen has no `maximum_`
    )
    .rules(d::maximum, d::jvp_diag, bt::elementwise);
    b.pointwise(
        "minimum",
        &["minimum(Tensor self, Tensor other) -> Tensor"],
        p::minimum,
        false, // ATen has no `minimum_`
    )
    .rules(d::minimum, d::jvp_diag, bt::elementwise);
    b.pointwise(
        "where",
        &[
            "where.self(Tensor condition, Tensor self, Tensor other) -> Tensor",
            "where.ScalarSelf(Tensor condition, Scalar self, Tensor other) -> Tensor",
            "where.ScalarOther(Tensor condition, Tensor self, Scalar other) -> Tensor",
            "where.Scalar(Tensor condition, Scalar self, Scalar other) -> Tensor",
        ],
        p::where_,
        false,
    )
    .rules(d::where_, d::jvp_diag, bt::elementwise);
    b.pointwise(
        "clamp",
        &[
            "clamp(Tensor self, Scalar? min=None, Scalar? max=None) -> Tensor",
            "clamp.Tensor(Tensor self, Tensor? min=None, Tensor? max=None) -> Tensor",
        ],
        p::clamp,
        true,
    )
    .rules(d::clamp, d::jvp_diag, bt::elementwise);
    let cmps: [(&str, p::PlanFn); 6] = [
        ("eq", p::eq),
        ("ne", p::ne),
        ("lt", p::lt),
        ("le", p::le),
        ("gt", p::gt),
        ("ge", p::ge),
    ];
    for (n, plan) in cmps {
        let [s0, s1] = bin(n);
        b.pointwise(n, &[&s0, &s1], plan, true)
            .rules(d::no_grad, d::jvp_none, bt::elementwise);
    }
    for (n, plan) in [
        ("logical_and", p::logical_and as p::PlanFn),
        ("logical_or", p::logical_or),
    ] {
        b.pointwise(
            n,
            &[&format!("{n}(Tensor self, Tensor other) -> Tensor")],
            plan,
            true,
        )
        .rules(d::no_grad, d::jvp_none, bt::elementwise);
    }
    for (n, plan) in [
        ("bitwise_and", p::bitwise_and as p::PlanFn),
        ("bitwise_or", p::bitwise_or),
        ("bitwise_xor", p::bitwise_xor),
    ] {
        let [s0, s1] = bin(n);
        b.pointwise(n, &[&s0, &s1], plan, true)
            .rules(d::no_grad, d::jvp_none, bt::elementwise);
    }
    b.pointwise(
        "bitwise_not",
        &[&unary("bitwise_not")],
        p::bitwise_not,
        true,
    )
    .rules(d::no_grad, d::jvp_none, bt::elementwise);
    b.pointwise(
        "remainder",
        &[
            "remainder.Tensor(Tensor self, Tensor other) -> Tensor",
            "remainder.Scalar(Tensor self, Scalar other) -> Tensor",
            "remainder.Scalar_Tensor(Scalar self, Tensor other) -> Tensor",
        ],
        p::remainder,
        true,
    )
    .rules(d::remainder, d::jvp_diag, bt::elementwise);
    b.pointwise(
        "fmod",
        &[
            "fmod.Tensor(Tensor self, Tensor other) -> Tensor",
            "fmod.Scalar(Tensor self, Scalar other) -> Tensor",
        ],
        p::fmod,
        true,
    )
    .rules(d::fmod, d::jvp_diag, bt::elementwise);
    b.pointwise(
        "atan2",
        &["atan2(Tensor self, Tensor other) -> Tensor"],
        p::atan2,
        true,
    )
    .rules(d::atan2, d::jvp_diag, bt::elementwise);
    b.pointwise(
        "logical_xor",
        &["logical_xor(Tensor self, Tensor other) -> Tensor"],
        p::logical_xor,
        true,
    )
    .rules(d::no_grad, d::jvp_none, bt::elementwise);
    // Float-class tests: bool, no in-place form.
    for (n, plan) in [
        ("isnan", p::isnan as p::PlanFn),
        ("isinf", p::isinf),
        ("isposinf", p::isposinf),
        ("isneginf", p::isneginf),
        ("isfinite", p::isfinite),
    ] {
        b.pointwise(n, &[&unary(n)], plan, false)
            .rules(d::no_grad, d::jvp_none, bt::elementwise);
    }
    b.pointwise("sign", &["sign(Tensor self) -> Tensor"], p::sign, true)
        .rules(d::no_grad, d::jvp_none, bt::elementwise);
    // Rounding: a zero derivative almost everywhere (derivatives.yaml's
    // `zeros_like`), none flows.
    let roundings: [(&str, p::PlanFn); 4] = [
        ("floor", p::floor),
        ("ceil", p::ceil),
        ("trunc", p::trunc),
        ("round", p::round),
    ];
    for (n, plan) in roundings {
        let decimals = format!("{n}.decimals(Tensor self, *, int decimals) -> Tensor");
        let schemas: &[&str] = if n == "round" {
            &[&unary(n), &decimals]
        } else {
            &[&unary(n)]
        };
        b.pointwise(n, schemas, plan, true)
            .rules(d::no_grad, d::jvp_none, bt::elementwise);
    }
    // Backward ops of derivatives.yaml that transforms emit.
    b.pointwise(
        "threshold_backward",
        &["threshold_backward(Tensor grad_output, Tensor self, Scalar threshold) -> Tensor"],
        p::threshold_backward,
        false,
    )
    .rules(
        |e, c, g| d::backward_op(e, c, g, Backward::Threshold),
        d::jvp_diag,
        bt::elementwise,
    );
    b.pointwise(
        "gelu_backward",
        &["gelu_backward(Tensor grad_output, Tensor self, *, str approximate='none') -> Tensor"],
        p::gelu_backward,
        false,
    )
    .rules(
        |e, c, g| d::backward_op(e, c, g, Backward::Gelu),
        d::jvp_diag,
        bt::elementwise,
    );
    b.pointwise(
        "silu_backward",
        &["silu_backward(Tensor grad_output, Tensor self) -> Tensor"],
        p::silu_backward,
        false,
    )
    .rules(
        |e, c, g| d::backward_op(e, c, g, Backward::Silu),
        d::jvp_diag,
        bt::elementwise,
    );
    b.pointwise(
        "sigmoid_backward",
        &["sigmoid_backward(Tensor grad_output, Tensor output) -> Tensor"],
        p::sigmoid_backward,
        false,
    )
    .rules(
        |e, c, g| d::backward_op(e, c, g, Backward::Sigmoid),
        d::jvp_diag,
        bt::elementwise,
    );
    b.pointwise(
        "tanh_backward",
        &["tanh_backward(Tensor grad_output, Tensor output) -> Tensor"],
        p::tanh_backward,
        false,
    )
    .rules(
        |e, c, g| d::backward_op(e, c, g, Backward::Tanh),
        d::jvp_diag,
        bt::elementwise,
    );
    b.pointwise(
        "floor_divide",
        &[
            "floor_divide(Tensor self, Tensor other) -> Tensor",
            "floor_divide.Scalar(Tensor self, Scalar other) -> Tensor",
        ],
        p::floor_divide,
        true,
    )
    .rules(d::no_grad, d::jvp_none, bt::elementwise);
    b.pointwise(
        "softplus",
        &["softplus(Tensor self, Scalar beta=1, Scalar threshold=20) -> Tensor"],
        softplus,
        false, // ATen has no `softplus_`
    )
    .rules(softplus_vjp, d::jvp_diag, bt::elementwise);
    b.pointwise(
        "leaky_relu",
        &["leaky_relu(Tensor self, Scalar negative_slope=0.01) -> Tensor"],
        leaky_relu,
        true,
    )
    .rules(leaky_relu_vjp, d::jvp_diag, bt::elementwise);
    b.pointwise(
        "elu",
        &["elu(Tensor self, Scalar alpha=1, Scalar scale=1, Scalar input_scale=1) -> Tensor"],
        elu,
        true,
    )
    .rules(elu_vjp, d::jvp_diag, bt::elementwise);
}

/// Scalar argument `i` of a bound call (defaults are bound).
fn scalar_arg(c: &crate::rule::Call, i: usize) -> Result<f64, String> {
    d::num(c, i).ok_or_else(|| {
        format!(
            "internal error: {} without scalar argument {i}",
            c.op.name()
        )
    })
}

/// `x` where `x > 0`, else `x * negative_slope` (eager's formula; NaN
/// stays NaN).
fn leaky_relu(a: &p::A) -> Result<p::PwPlan, String> {
    use crate::ops::args::ArgsExt;
    use crate::ops::expr::{gt, lit, select, x};
    let slope = a.opt_scalar(1)?.map_or(0.01, |s| s.to_f64());
    p::float_expr(
        a,
        "leaky_relu",
        select(gt(x(), lit(0.0)), x(), x() * lit(slope)),
    )
}

/// `grad` where `x > 0`, else `grad * negative_slope`
/// (derivatives.yaml's `leaky_relu_backward`).
fn leaky_relu_vjp(
    e: &mut dyn crate::rule::Emit,
    c: &crate::rule::Call,
    gs: &[Option<crate::id::ValueId>],
) -> Result<crate::rule::Grads, String> {
    use crate::rule::{float, t};
    let Some(g) = gs.first().copied().flatten() else {
        return Ok(vec![]);
    };
    let x = c.tensor(0)?;
    let slope = scalar_arg(c, 1)?;
    let pos = e.call("gt", vec![t(x), float(0.0)])?;
    let d = e.call("where", vec![t(pos), float(1.0), float(slope)])?;
    Ok(vec![(0, None, e.mul(g, d)?)])
}

/// `x * scale` where `x > 0`, else `expm1(x * input_scale) * alpha *
/// scale` (eager's formula).
fn elu(a: &p::A) -> Result<p::PwPlan, String> {
    use crate::ops::args::ArgsExt;
    use crate::ops::expr::{expm1, gt, lit, select, x};
    let arg =
        |i: usize| -> Result<f64, String> { Ok(a.opt_scalar(i)?.map_or(1.0, |s| s.to_f64())) };
    let (alpha, scale, input_scale) = (arg(1)?, arg(2)?, arg(3)?);
    let neg = expm1(x() * lit(input_scale)) * lit(alpha * scale);
    p::float_expr(a, "elu", select(gt(x(), lit(0.0)), x() * lit(scale), neg))
}

/// `grad * scale` where `x > 0`, else `grad * alpha * scale * input_scale
/// * exp(x * input_scale)` (derivatives.yaml's `elu_backward` of `self`).
fn elu_vjp(
    e: &mut dyn crate::rule::Emit,
    c: &crate::rule::Call,
    gs: &[Option<crate::id::ValueId>],
) -> Result<crate::rule::Grads, String> {
    use crate::rule::{float, t};
    let Some(g) = gs.first().copied().flatten() else {
        return Ok(vec![]);
    };
    let x = c.tensor(0)?;
    let (alpha, scale, input_scale) = (scalar_arg(c, 1)?, scalar_arg(c, 2)?, scalar_arg(c, 3)?);
    let xs = e.scale(x, input_scale)?;
    let ex = e.call("exp", vec![t(xs)])?;
    let neg = e.scale(ex, alpha * scale * input_scale)?;
    let pos = e.call("gt", vec![t(x), float(0.0)])?;
    let d = e.call("where", vec![t(pos), float(scale), t(neg)])?;
    Ok(vec![(0, None, e.mul(g, d)?)])
}

/// `softplus(x, beta, threshold)`: `log1p(exp(x * beta)) / beta`, and `x`
/// itself where `x * beta > threshold` (eager's formula).
fn softplus(a: &p::A) -> Result<p::PwPlan, String> {
    use crate::ops::args::ArgsExt;
    use crate::ops::expr::{gt, lit, log1p, select, x};
    let beta = a.opt_scalar(1)?.map_or(1.0, |s| s.to_f64());
    let threshold = a.opt_scalar(2)?.map_or(20.0, |s| s.to_f64());
    let xb = x() * lit(beta);
    let soft = log1p(crate::ops::expr::exp(xb.clone())) / lit(beta);
    p::float_expr(a, "softplus", select(gt(xb, lit(threshold)), x(), soft))
}

/// `grad * sigmoid(x * beta)`, and `grad` where `x * beta > threshold`
/// (derivatives.yaml's `softplus_backward`).
fn softplus_vjp(
    e: &mut dyn crate::rule::Emit,
    c: &crate::rule::Call,
    gs: &[Option<crate::id::ValueId>],
) -> Result<crate::rule::Grads, String> {
    use crate::rule::t;
    let Some(g) = gs.first().copied().flatten() else {
        return Ok(vec![]);
    };
    let x = c.tensor(0)?;
    let xb = e.call("mul", vec![t(x), c.args[1].clone()])?;
    let s = e.call("sigmoid", vec![t(xb)])?;
    let linear = e.call("gt", vec![t(xb), c.args[2].clone()])?;
    let d = e.call("where", vec![t(linear), crate::rule::float(1.0), t(s)])?;
    Ok(vec![(0, None, e.mul(g, d)?)])
}
