//! Elementwise ops. Each op's `plan` decides, from argument metadata alone,
//! its operands (tensors or constants, each with the dtype it is read as),
//! the result dtype and the scalar function; the interpreter, and later the
//! GPU code generator, run the plan.

use super::args::{ArgsExt, Scalar};
use super::expr::{self as ex, lit, operand as arg, x, Expr};
use crate::dtype::{result_type, Category, DType, PromoOperand};
use crate::meta::{broadcast_shapes, Dims, Meta};
use crate::schema::Arg;

pub type A<'a> = [Arg<&'a Meta>];
pub type ScalarFn = Box<dyn Fn(&[f64]) -> Result<f64, String> + Send + Sync>;

#[derive(Clone, Copy, Debug)]
pub enum Src {
    /// The tensor in argument `i`.
    Arg(usize),
    /// A literal; `wrapped` when ATen turns it into a 0-d tensor operand.
    Const { value: f64, wrapped: bool },
}

#[derive(Clone, Copy, Debug)]
pub struct Operand {
    pub src: Src,
    /// The dtype the operand is converted to before `f` sees it.
    pub cast: DType,
}

pub struct PwPlan {
    /// The element as an expression over the operands (already converted
    /// to their `Operand::cast` dtypes), for code generators; `f` is the
    /// reference's (float-only ops evaluate `expr` itself).
    pub expr: Expr,
    /// Up to three inline (no allocation per shape inference).
    pub operands: smallvec::SmallVec<[Operand; 3]>,
    pub out_dtype: DType,
    pub f: ScalarFn,
}

impl PwPlan {
    /// Result shape: the operands' shapes broadcast together.
    pub fn out_shape(&self, a: &A) -> Result<Dims, String> {
        let mut shape = Dims::new();
        for op in &self.operands {
            if let Src::Arg(i) = op.src {
                shape = broadcast_shapes(&shape, &a.tensor(i)?.sizes)?;
            }
        }
        Ok(shape)
    }

    /// The layout ATen's TensorIterator gives the result.
    pub fn out_meta(&self, a: &A) -> Result<Meta, String> {
        let shape = self.out_shape(a)?;
        let scalar = Meta::contiguous(DType::F32, Dims::new());
        let mut ins: smallvec::SmallVec<[&Meta; 4]> = smallvec::SmallVec::new();
        for op in &self.operands {
            match op.src {
                Src::Arg(i) => ins.push(a.tensor(i)?),
                Src::Const { wrapped: true, .. } => ins.push(&scalar),
                Src::Const { .. } => {}
            }
        }
        Ok(super::layout::iterator_output(&shape, &ins, self.out_dtype))
    }
}

pub type PlanFn = fn(&A) -> Result<PwPlan, String>;

fn promo(m: &Meta) -> PromoOperand {
    if m.dim() == 0 {
        PromoOperand::ZeroDim(m.dtype)
    } else {
        PromoOperand::Dim(m.dtype)
    }
}

/// An operand that is either a tensor argument or a scalar literal.
enum TOrS<'a> {
    T(usize, &'a Meta),
    S(Scalar),
}

fn t_or_s<'a>(a: &A<'a>, i: usize) -> Result<TOrS<'a>, String> {
    if a.is_tensor(i) {
        Ok(TOrS::T(i, a.tensor(i)?))
    } else {
        Ok(TOrS::S(a.scalar(i)?))
    }
}

fn promo_of(x: &TOrS) -> PromoOperand {
    match x {
        TOrS::T(_, m) => promo(m),
        TOrS::S(s) => PromoOperand::Scalar(s.category()),
    }
}

fn operand(x: &TOrS, cast: DType) -> Operand {
    match x {
        TOrS::T(i, _) => Operand {
            src: Src::Arg(*i),
            cast,
        },
        TOrS::S(s) => Operand {
            src: Src::Const {
                value: cast.cast(s.to_f64()),
                wrapped: true,
            },
            cast,
        },
    }
}

fn float_of(d: DType) -> DType {
    if d.is_float() {
        d
    } else {
        DType::F32
    }
}

// ---------------------------------------------------------------- unary

fn unary(
    a: &A,
    name: &str,
    expr: Expr,
    to_float: bool,
    no_bool: bool,
    f: fn(f64) -> f64,
) -> Result<PwPlan, String> {
    let m = a.tensor(0)?;
    if no_bool && m.dtype == DType::Bool {
        return Err(format!("{name} is not supported for bool tensors"));
    }
    let dt = if to_float { float_of(m.dtype) } else { m.dtype };
    Ok(PwPlan {
        expr,
        operands: smallvec::smallvec![Operand {
            src: Src::Arg(0),
            cast: dt,
        }],
        out_dtype: dt,
        f: Box::new(move |x| Ok(f(x[0]))),
    })
}

/// A unary op declared by its expression over `self` (operand 0),
/// integers and bools promoted to f32 as eager's float ops do.
fn promoting_expr(a: &A, expr: Expr) -> Result<PwPlan, String> {
    let d = float_of(a.tensor(0)?.dtype);
    Ok(expr_plan(expr, d))
}

fn expr_plan(expr: Expr, d: DType) -> PwPlan {
    let e = expr.clone();
    PwPlan {
        expr,
        operands: smallvec::smallvec![Operand {
            src: Src::Arg(0),
            cast: d,
        }],
        out_dtype: d,
        f: Box::new(move |v| Ok(e.eval(v))),
    }
}

pub fn exp(a: &A) -> Result<PwPlan, String> {
    promoting_expr(a, ex::exp(x()))
}

pub fn log(a: &A) -> Result<PwPlan, String> {
    promoting_expr(a, ex::log(x()))
}

pub fn sqrt(a: &A) -> Result<PwPlan, String> {
    promoting_expr(a, ex::sqrt(x()))
}

pub fn rsqrt(a: &A) -> Result<PwPlan, String> {
    promoting_expr(a, ex::rsqrt(x()))
}

pub fn sigmoid(a: &A) -> Result<PwPlan, String> {
    promoting_expr(a, lit(1.0) / (lit(1.0) + ex::exp(-x())))
}

pub fn tanh(a: &A) -> Result<PwPlan, String> {
    promoting_expr(a, ex::tanh(x()))
}

pub fn sin(a: &A) -> Result<PwPlan, String> {
    promoting_expr(a, ex::sin(x()))
}

pub fn cos(a: &A) -> Result<PwPlan, String> {
    promoting_expr(a, ex::cos(x()))
}

pub fn reciprocal(a: &A) -> Result<PwPlan, String> {
    promoting_expr(a, lit(1.0) / x())
}

pub fn erf(a: &A) -> Result<PwPlan, String> {
    promoting_expr(a, ex::erf(x()))
}

pub fn tan(a: &A) -> Result<PwPlan, String> {
    promoting_expr(a, ex::tan(x()))
}

pub fn asin(a: &A) -> Result<PwPlan, String> {
    promoting_expr(a, ex::asin(x()))
}

pub fn acos(a: &A) -> Result<PwPlan, String> {
    promoting_expr(a, ex::acos(x()))
}

pub fn atan(a: &A) -> Result<PwPlan, String> {
    promoting_expr(a, ex::atan(x()))
}

pub fn sinh(a: &A) -> Result<PwPlan, String> {
    promoting_expr(a, ex::sinh(x()))
}

pub fn cosh(a: &A) -> Result<PwPlan, String> {
    promoting_expr(a, ex::cosh(x()))
}

pub fn asinh(a: &A) -> Result<PwPlan, String> {
    promoting_expr(a, ex::asinh(x()))
}

pub fn acosh(a: &A) -> Result<PwPlan, String> {
    promoting_expr(a, ex::acosh(x()))
}

pub fn atanh(a: &A) -> Result<PwPlan, String> {
    promoting_expr(a, ex::atanh(x()))
}

pub fn log1p(a: &A) -> Result<PwPlan, String> {
    promoting_expr(a, ex::log1p(x()))
}

pub fn expm1(a: &A) -> Result<PwPlan, String> {
    promoting_expr(a, ex::expm1(x()))
}

pub fn log2(a: &A) -> Result<PwPlan, String> {
    promoting_expr(a, ex::log2(x()))
}

pub fn log10(a: &A) -> Result<PwPlan, String> {
    promoting_expr(a, ex::log10(x()))
}

/// A rounding op: floats rounded by `f`, integers as they are (eager
/// copies them), bools refused as eager refuses them.
fn rounding(a: &A, name: &str, f: fn(Expr) -> Expr) -> Result<PwPlan, String> {
    let d = a.tensor(0)?.dtype;
    if d == DType::Bool {
        return Err(format!("\"{name}\" not implemented for 'Bool'"));
    }
    if d.is_float() {
        return Ok(expr_plan(f(x()), d));
    }
    unary(a, name, x(), false, true, |x| x)
}

pub fn floor(a: &A) -> Result<PwPlan, String> {
    rounding(a, "floor", ex::floor)
}

pub fn ceil(a: &A) -> Result<PwPlan, String> {
    rounding(a, "ceil", ex::ceil)
}

pub fn trunc(a: &A) -> Result<PwPlan, String> {
    rounding(a, "trunc", ex::trunc)
}

/// `round(self)` and `round.decimals(self, decimals)`: to a multiple of
/// `10^-decimals`, scaled as eager scales (`x * 10^d` rounded, then
/// divided; for negative `d`, divided, rounded, multiplied).
pub fn round(a: &A) -> Result<PwPlan, String> {
    let decimals = match a.get(1) {
        Some(Arg::Int(d)) => *d,
        _ => 0,
    };
    if decimals == 0 {
        return rounding(a, "round", ex::round);
    }
    let d = a.tensor(0)?.dtype;
    if !d.is_float() {
        return Err(format!(
            "round with decimals is not implemented for {d} tensors"
        ));
    }
    let p = lit(10f64.powi(decimals.unsigned_abs().min(300) as i32));
    let e = if decimals > 0 {
        ex::round(x() * p.clone()) / p
    } else {
        ex::round(x() / p.clone()) * p
    };
    Ok(expr_plan(e, d))
}

/// A unary float op declared by its expression over `self` (operand 0),
/// as eager's float-only ops are: integer and bool tensors are refused
/// ("not implemented for"), like `silu`'s.
pub fn float_expr(a: &A, name: &str, expr: Expr) -> Result<PwPlan, String> {
    let d = a.tensor(0)?.dtype;
    if !d.is_float() {
        return Err(format!("{name} is not implemented for {d} tensors"));
    }
    Ok(expr_plan(expr, d))
}

/// `silu`: floats only (eager: "silu_cpu" not implemented for integers
/// and bools, unlike `sigmoid`, which promotes).
pub fn silu(a: &A) -> Result<PwPlan, String> {
    float_expr(a, "silu", x() / (lit(1.0) + ex::exp(-x())))
}

pub fn neg(a: &A) -> Result<PwPlan, String> {
    if a.tensor(0)?.dtype == DType::Bool {
        return Err("Negation, the `-` operator, on a bool tensor is not supported. If you are trying to invert a mask, use the `~` or `logical_not()` operator instead.".into());
    }
    unary(a, "neg", -x(), false, true, |x| -x)
}

pub fn abs(a: &A) -> Result<PwPlan, String> {
    unary(a, "abs", ex::abs(x()), false, true, f64::abs)
}

pub fn relu(a: &A) -> Result<PwPlan, String> {
    // NaN stays; -0 becomes 0.
    let e = ex::select(ex::le(x(), lit(0.0)), lit(0.0), x());
    unary(a, "relu", e, false, true, |x| {
        if x > 0.0 || x.is_nan() {
            x
        } else {
            0.0
        }
    })
}

pub fn logical_not(a: &A) -> Result<PwPlan, String> {
    let m = a.tensor(0)?;
    Ok(PwPlan {
        expr: ex::not(x()),
        operands: smallvec::smallvec![Operand {
            src: Src::Arg(0),
            cast: m.dtype,
        }],
        out_dtype: DType::Bool,
        f: Box::new(|x| Ok(if x[0] == 0.0 { 1.0 } else { 0.0 })),
    })
}

/// `sqrt(2 / pi)`, of gelu's tanh approximation.
const GELU_K: f64 = 0.797_884_560_802_865_4;

pub fn gelu(a: &A) -> Result<PwPlan, String> {
    let e = match a.opt_str(1)?.unwrap_or("none") {
        "none" => lit(0.5) * x() * (lit(1.0) + ex::erf(x() * lit(std::f64::consts::FRAC_1_SQRT_2))),
        "tanh" => {
            let cube = lit(0.044715) * x() * x() * x();
            lit(0.5) * x() * (lit(1.0) + ex::tanh(lit(GELU_K) * (x() + cube)))
        }
        other => {
            return Err(format!(
                "approximate argument must be either none or tanh, got \"{other}\""
            ))
        }
    };
    float_expr(a, "gelu", e)
}

// --------------------------------------------------------------- binary

/// A binary op whose second operand (argument 1) is a tensor or a scalar.
fn binary(
    a: &A,
    expr: Expr,
    out_of: impl Fn(DType) -> Result<(DType, DType), String>,
    f: impl Fn(DType, f64, f64) -> Result<f64, String> + Send + Sync + 'static,
) -> Result<PwPlan, String> {
    let x = t_or_s(a, 0)?;
    let y = t_or_s(a, 1)?;
    let common = result_type(&[promo_of(&x), promo_of(&y)])?;
    let (compute, out) = out_of(common)?;
    Ok(PwPlan {
        expr,
        operands: smallvec::smallvec![operand(&x, compute), operand(&y, compute)],
        out_dtype: out,
        f: Box::new(move |v| f(compute, v[0], v[1])),
    })
}

fn same(d: DType) -> Result<(DType, DType), String> {
    Ok((d, d))
}

fn alpha_of(a: &A, common: DType) -> Result<f64, String> {
    let alpha = a.opt_scalar(2)?.unwrap_or(Scalar::Int(1));
    if common.is_integral() && alpha.category() == Category::Float {
        return Err(
            "For integral input tensors, argument alpha must not be a floating point number."
                .into(),
        );
    }
    if common != DType::Bool && alpha.category() == Category::Bool && alpha != Scalar::Bool(true) {
        return Err("Boolean alpha only supported for Boolean results.".into());
    }
    Ok(alpha.to_f64())
}

fn common_of(a: &A) -> Result<DType, String> {
    result_type(&[promo_of(&t_or_s(a, 0)?), promo_of(&t_or_s(a, 1)?)])
}

/// `alpha * other` (`other` itself for 1).
fn scaled(alpha: f64) -> Expr {
    if alpha == 1.0 {
        arg(1)
    } else {
        lit(alpha) * arg(1)
    }
}

pub fn add(a: &A) -> Result<PwPlan, String> {
    let alpha = alpha_of(a, common_of(a)?)?;
    binary(a, x() + scaled(alpha), same, move |_, x, y| {
        Ok(x + alpha * y)
    })
}

pub fn sub(a: &A) -> Result<PwPlan, String> {
    let common = common_of(a)?;
    if common == DType::Bool {
        return Err("Subtraction, the `-` operator, with two bool tensors is not supported. Use the `^` or `logical_xor()` operator instead.".into());
    }
    let alpha = alpha_of(a, common)?;
    binary(a, x() - scaled(alpha), same, move |_, x, y| {
        Ok(x - alpha * y)
    })
}

pub fn mul(a: &A) -> Result<PwPlan, String> {
    binary(a, x() * arg(1), same, |dt, x, y| {
        Ok(if dt.is_integral() {
            (x as i64).wrapping_mul(y as i64) as f64
        } else {
            x * y
        })
    })
}

pub fn div(a: &A) -> Result<PwPlan, String> {
    let mode = a.opt_str(2)?.map(str::to_string);
    match mode.as_deref() {
        None => binary(
            a,
            x() / arg(1),
            |d| Ok((float_of(d), float_of(d))),
            |_, x, y| Ok(x / y),
        ),
        Some(m @ ("trunc" | "floor")) => {
            let floor = m == "floor";
            binary(
                a,
                if floor {
                    ex::div_floor(x(), arg(1))
                } else {
                    ex::div_trunc(x(), arg(1))
                },
                same,
                move |dt, x, y| {
                    if dt.is_integral() || dt == DType::Bool {
                        if y == 0.0 {
                            return Err("ZeroDivisionError".into());
                        }
                        let (x, y) = (x as i64, y as i64);
                        let q = x / y;
                        Ok(if floor && (x % y != 0) && ((x < 0) != (y < 0)) {
                            q - 1
                        } else {
                            q
                        } as f64)
                    } else {
                        let q = x / y;
                        Ok(if floor { q.floor() } else { q.trunc() })
                    }
                },
            )
        }
        Some(other) => Err(format!(
            "div expected rounding_mode to be one of None, 'trunc', or 'floor' but found '{other}'"
        )),
    }
}

fn int_pow(b: i64, e: i64) -> Result<f64, String> {
    if e < 0 {
        if b == 1 {
            return Ok(1.0);
        }
        if b == -1 {
            return Ok(if e % 2 == 0 { 1.0 } else { -1.0 });
        }
        return Err("Integers to negative integer powers are not allowed.".into());
    }
    let mut r: i64 = 1;
    for _ in 0..e.min(64) {
        r = r.wrapping_mul(b);
    }
    Ok(r as f64)
}

/// `pow(Tensor, Tensor)`, `pow(Tensor, Scalar)` and `pow(Scalar, Tensor)`.
pub fn pow(a: &A) -> Result<PwPlan, String> {
    if common_of(a)? == DType::Bool {
        return Err("\"pow\" not implemented for 'Bool'".into());
    }
    let f = |dt: DType, x: f64, y: f64| {
        if dt.is_integral() {
            int_pow(x as i64, y as i64)
        } else {
            Ok(x.powf(y))
        }
    };
    if a.is_tensor(0) && !a.is_tensor(1) {
        // pow(Tensor, Scalar) is a unary kernel in ATen: the scalar is no operand.
        let m = a.tensor(0)?;
        let e = a.scalar(1)?;
        let dt = result_type(&[promo(m), PromoOperand::Scalar(e.category())])?;
        let ev = dt.cast(e.to_f64());
        if dt.is_integral() && e.to_f64() < 0.0 {
            return Err("Integers to negative integer powers are not allowed.".into());
        }
        return Ok(PwPlan {
            expr: ex::pow(x(), arg(1)),
            // The exponent is an operand ATen does not wrap (no layout effect).
            operands: smallvec::smallvec![
                Operand {
                    src: Src::Arg(0),
                    cast: dt,
                },
                Operand {
                    src: Src::Const {
                        value: ev,
                        wrapped: false,
                    },
                    cast: dt,
                },
            ],
            out_dtype: dt,
            f: Box::new(move |v| f(dt, v[0], v[1])),
        });
    }
    binary(a, ex::pow(x(), arg(1)), same, f)
}

fn tensors_only(a: &A, name: &str) -> Result<(), String> {
    if !a.is_tensor(1) {
        return Err(format!("{name} expects a tensor as its second argument"));
    }
    Ok(())
}

pub fn maximum(a: &A) -> Result<PwPlan, String> {
    tensors_only(a, "maximum")?;
    binary(a, ex::max(x(), arg(1)), same, |_, x, y| {
        Ok(if x.is_nan() || y.is_nan() {
            f64::NAN
        } else {
            x.max(y)
        })
    })
}

pub fn minimum(a: &A) -> Result<PwPlan, String> {
    tensors_only(a, "minimum")?;
    binary(a, ex::min(x(), arg(1)), same, |_, x, y| {
        Ok(if x.is_nan() || y.is_nan() {
            f64::NAN
        } else {
            x.min(y)
        })
    })
}

fn compare(a: &A, cmp: fn(Expr, Expr) -> Expr, f: fn(f64, f64) -> bool) -> Result<PwPlan, String> {
    binary(
        a,
        cmp(x(), arg(1)),
        |d| Ok((d, DType::Bool)),
        move |_, x, y| Ok(f(x, y) as i32 as f64),
    )
}

pub fn eq(a: &A) -> Result<PwPlan, String> {
    compare(a, ex::eq, |x, y| x == y)
}
pub fn ne(a: &A) -> Result<PwPlan, String> {
    compare(a, ex::ne, |x, y| x != y)
}
pub fn lt(a: &A) -> Result<PwPlan, String> {
    compare(a, ex::lt, |x, y| x < y)
}
pub fn le(a: &A) -> Result<PwPlan, String> {
    compare(a, ex::le, |x, y| x <= y)
}
pub fn gt(a: &A) -> Result<PwPlan, String> {
    compare(a, ex::gt, |x, y| x > y)
}
pub fn ge(a: &A) -> Result<PwPlan, String> {
    compare(a, ex::ge, |x, y| x >= y)
}

/// `logical_and` / `logical_or`: nonzero is true, the result is bool.
fn logical(a: &A, op: fn(Expr, Expr) -> Expr, f: fn(bool, bool) -> bool) -> Result<PwPlan, String> {
    binary(
        a,
        op(x(), arg(1)),
        |d| Ok((d, DType::Bool)),
        move |_, x, y| Ok(f(x != 0.0, y != 0.0) as i32 as f64),
    )
}

pub fn logical_and(a: &A) -> Result<PwPlan, String> {
    logical(a, ex::and, |x, y| x && y)
}
pub fn logical_or(a: &A) -> Result<PwPlan, String> {
    logical(a, ex::or, |x, y| x || y)
}

pub fn logical_xor(a: &A) -> Result<PwPlan, String> {
    logical(a, |x, y| ex::ne(ex::not(x), ex::not(y)), |x, y| x != y)
}

/// A float-class test (`isnan`, `isinf`, ...): bool, false for integers.
fn class_test(a: &A, e: Expr, f: fn(f64) -> bool) -> Result<PwPlan, String> {
    let m = a.tensor(0)?;
    Ok(PwPlan {
        expr: e,
        operands: smallvec::smallvec![Operand {
            src: Src::Arg(0),
            cast: m.dtype,
        }],
        out_dtype: DType::Bool,
        f: Box::new(move |x| Ok(f(x[0]) as i32 as f64)),
    })
}

pub fn isnan(a: &A) -> Result<PwPlan, String> {
    class_test(a, ex::is_nan(x()), f64::is_nan)
}

pub fn isinf(a: &A) -> Result<PwPlan, String> {
    class_test(a, ex::is_inf(x()), f64::is_infinite)
}

pub fn isposinf(a: &A) -> Result<PwPlan, String> {
    let e = ex::and(ex::is_inf(x()), ex::gt(x(), lit(0.0)));
    class_test(a, e, |x| x == f64::INFINITY)
}

pub fn isneginf(a: &A) -> Result<PwPlan, String> {
    let e = ex::and(ex::is_inf(x()), ex::lt(x(), lit(0.0)));
    class_test(a, e, |x| x == f64::NEG_INFINITY)
}

pub fn isfinite(a: &A) -> Result<PwPlan, String> {
    let e = ex::not(ex::or(ex::is_inf(x()), ex::is_nan(x())));
    class_test(a, e, f64::is_finite)
}

/// `bitwise_and` / `or` / `xor`: integers and bools (of bools, logic).
fn bitwise(
    a: &A,
    name: &str,
    op: fn(Expr, Expr) -> Expr,
    f: fn(i64, i64) -> i64,
) -> Result<PwPlan, String> {
    let d = common_of(a)?;
    if d.is_float() {
        return Err(format!(
            "\"{name}_cpu\" not implemented for '{}'",
            aten_name(d)
        ));
    }
    binary(a, op(x(), arg(1)), same, move |_, x, y| {
        Ok(f(x as i64, y as i64) as f64)
    })
}

/// ATen's name of a dtype in its kernel errors.
fn aten_name(d: DType) -> &'static str {
    match d {
        DType::F16 => "Half",
        DType::F32 => "Float",
        DType::I32 => "Int",
        DType::I64 => "Long",
        DType::U32 => "UInt32",
        DType::I8 => "Char",
        DType::Bool => "Bool",
    }
}

pub fn bitwise_and(a: &A) -> Result<PwPlan, String> {
    bitwise(a, "bitwise_and", ex::bit_and, |x, y| x & y)
}
pub fn bitwise_or(a: &A) -> Result<PwPlan, String> {
    bitwise(a, "bitwise_or", ex::bit_or, |x, y| x | y)
}
pub fn bitwise_xor(a: &A) -> Result<PwPlan, String> {
    bitwise(a, "bitwise_xor", ex::bit_xor, |x, y| x ^ y)
}

/// `bitwise_not`: `~x` of integers, `not` of bools.
pub fn bitwise_not(a: &A) -> Result<PwPlan, String> {
    let d = a.tensor(0)?.dtype;
    if d.is_float() {
        return Err(format!(
            "\"bitwise_not_cpu\" not implemented for '{}'",
            aten_name(d)
        ));
    }
    Ok(PwPlan {
        expr: ex::bit_not(x()),
        operands: smallvec::smallvec![Operand {
            src: Src::Arg(0),
            cast: d,
        }],
        out_dtype: d,
        f: Box::new(move |v| {
            let x = v[0] as i64;
            Ok(match d {
                DType::Bool => (x == 0) as i64 as f64,
                DType::U32 => (!(x as u32)) as f64,
                _ => !x as f64,
            })
        }),
    })
}

/// `remainder`: `x - floor(x / y) * y`, the divisor's sign (Python's `%`).
pub fn remainder(a: &A) -> Result<PwPlan, String> {
    if common_of(a)? == DType::Bool {
        return Err("\"remainder_cpu\" not implemented for 'Bool'".into());
    }
    binary(a, ex::rem(x(), arg(1)), same, |dt, x, y| {
        if dt.is_integral() {
            if y == 0.0 {
                return Err("ZeroDivisionError".into());
            }
            let (x, y) = (x as i64, y as i64);
            let r = x % y;
            Ok(if r != 0 && ((r < 0) != (y < 0)) {
                r + y
            } else {
                r
            } as f64)
        } else {
            Ok(x - (x / y).floor() * y)
        }
    })
}

/// `fmod`: `x - trunc(x / y) * y`, the dividend's sign (C's `fmod`).
pub fn fmod(a: &A) -> Result<PwPlan, String> {
    if common_of(a)? == DType::Bool {
        return Err("\"fmod_cpu\" not implemented for 'Bool'".into());
    }
    binary(a, ex::fmod(x(), arg(1)), same, |dt, x, y| {
        if dt.is_integral() {
            if y == 0.0 {
                return Err("ZeroDivisionError".into());
            }
            Ok(((x as i64) % (y as i64)) as f64)
        } else {
            Ok(x % y)
        }
    })
}

/// `atan2(self, other)`: the angle of `(other, self)`, in floats.
pub fn atan2(a: &A) -> Result<PwPlan, String> {
    binary(
        a,
        ex::atan2(x(), arg(1)),
        |d| Ok((float_of(d), float_of(d))),
        |_, y, x| Ok(y.atan2(x)),
    )
}

/// `floor_divide`: `div` with `rounding_mode="floor"`.
pub fn floor_divide(a: &A) -> Result<PwPlan, String> {
    if common_of(a)? == DType::Bool {
        return Err("\"div_floor_cpu\" not implemented for 'Bool'".into());
    }
    binary(a, ex::div_floor(x(), arg(1)), same, |dt, x, y| {
        if dt.is_integral() {
            if y == 0.0 {
                return Err("ZeroDivisionError".into());
            }
            let (x, y) = (x as i64, y as i64);
            let q = x / y;
            Ok(if (x % y != 0) && ((x < 0) != (y < 0)) {
                q - 1
            } else {
                q
            } as f64)
        } else {
            Ok((x / y).floor())
        }
    })
}

// ---------------------------------------------------------------- others

/// `where(condition, self, other)` with tensor or scalar `self` / `other`.
pub fn where_(a: &A) -> Result<PwPlan, String> {
    let c = a.tensor(0)?;
    if c.dtype != DType::Bool {
        return Err(format!(
            "where expected condition to be a boolean tensor, but got a tensor with dtype {}",
            c.dtype
        ));
    }
    let x = t_or_s(a, 1)?;
    let y = t_or_s(a, 2)?;
    let dt = result_type(&[promo_of(&x), promo_of(&y)])?;
    Ok(PwPlan {
        expr: ex::select(arg(0), arg(1), arg(2)),
        operands: smallvec::smallvec![
            Operand {
                src: Src::Arg(0),
                cast: DType::Bool,
            },
            operand(&x, dt),
            operand(&y, dt),
        ],
        out_dtype: dt,
        f: Box::new(|v| Ok(if v[0] != 0.0 { v[1] } else { v[2] })),
    })
}

/// `clamp(self, min?, max?)` with scalar or tensor bounds.
pub fn clamp(a: &A) -> Result<PwPlan, String> {
    let m = a.tensor(0)?;
    let bounds = [1, 2].map(|i| {
        if matches!(a.get(i), Some(Arg::None) | None) {
            None
        } else {
            Some(i)
        }
    });
    if bounds.iter().all(Option::is_none) {
        return Err("clamp: At least one of 'min' or 'max' must not be None".into());
    }
    let mut promos = vec![promo(m)];
    let mut parts = vec![];
    for i in bounds.into_iter().flatten() {
        let x = t_or_s(a, i)?;
        promos.push(promo_of(&x));
        parts.push((i, x));
    }
    let dt = result_type(&promos)?;
    if dt == DType::Bool {
        return Err("clamp is not supported for bool tensors".into());
    }
    let has = [bounds[0].is_some(), bounds[1].is_some()];
    let mut operands: smallvec::SmallVec<[Operand; 3]> = smallvec::smallvec![Operand {
        src: Src::Arg(0),
        cast: dt,
    }];
    for (_, x) in &parts {
        let mut o = operand(x, dt);
        if let Src::Const { wrapped, .. } = &mut o.src {
            *wrapped = false;
        }
        operands.push(o);
    }
    // The bounds present follow `self`; NaN anywhere gives NaN.
    let mut expr = x();
    let mut k = 1;
    if has[0] {
        expr = ex::max(expr, arg(k));
        k += 1;
    }
    if has[1] {
        expr = ex::min(expr, arg(k));
    }
    Ok(PwPlan {
        expr,
        operands,
        out_dtype: dt,
        f: Box::new(move |v| {
            let mut x = v[0];
            let mut k = 1;
            if x.is_nan() {
                return Ok(x);
            }
            if has[0] {
                let lo = v[k];
                k += 1;
                x = if lo.is_nan() { lo } else { x.max(lo) };
            }
            if has[1] {
                let hi = v[k];
                x = if hi.is_nan() { hi } else { x.min(hi) };
            }
            Ok(x)
        }),
    })
}

// ---------------------------------------------------------------- derivatives

pub fn sign(a: &A) -> Result<PwPlan, String> {
    unary(a, "sign", ex::sign(x()), false, false, |x| {
        if x > 0.0 {
            1.0
        } else if x < 0.0 {
            -1.0
        } else {
            x
        }
    })
}

/// A backward op `(grad, x)`: floating operands promoted together.
fn backward(a: &A, name: &str, expr: Expr, f: fn(f64, f64) -> f64) -> Result<PwPlan, String> {
    for i in 0..2 {
        if !a.is_tensor(i) || !a.tensor(i)?.dtype.is_float() {
            return Err(format!("{name} takes two floating point tensors"));
        }
    }
    binary(a, expr, same, move |_, g, x| Ok(f(g, x)))
}

/// A backward op declared by its expression over `(grad, x)` (operands 0
/// and 1).
fn backward_expr(a: &A, name: &str, expr: Expr) -> Result<PwPlan, String> {
    let e = expr.clone();
    let mut p = backward(a, name, expr, |g, _| g)?;
    p.f = Box::new(move |v| Ok(e.eval(v)));
    Ok(p)
}

pub fn threshold_backward(a: &A) -> Result<PwPlan, String> {
    let threshold = a.scalar(2)?.to_f64();
    // `(grad, x)`: 0 where x <= threshold.
    let e = ex::select(ex::le(arg(1), lit(threshold)), lit(0.0), x());
    let mut p = backward(a, "threshold_backward", e, |g, _| g)?;
    p.f = Box::new(move |v| Ok(if v[1] <= threshold { 0.0 } else { v[0] }));
    Ok(p)
}

pub fn gelu_backward(a: &A) -> Result<PwPlan, String> {
    let tanh = match a.opt_str(2)?.unwrap_or("none") {
        "none" => false,
        "tanh" => true,
        other => {
            return Err(format!(
                "approximate argument must be either none or tanh, got \"{other}\""
            ))
        }
    };
    let (g, y) = (ex::operand(0), ex::operand(1));
    let d = if tanh {
        let th = || {
            ex::tanh(lit(GELU_K) * (y.clone() + lit(0.044715) * y.clone() * y.clone() * y.clone()))
        };
        lit(0.5) * (lit(1.0) + th())
            + lit(0.5)
                * y.clone()
                * (lit(1.0) - th() * th())
                * lit(GELU_K)
                * (lit(1.0) + lit(0.134145) * y.clone() * y.clone())
    } else {
        let cdf = lit(0.5) * (lit(1.0) + ex::erf(y.clone() * lit(std::f64::consts::FRAC_1_SQRT_2)));
        cdf + y.clone() * ex::exp(lit(-0.5) * y.clone() * y.clone()) * lit(0.398_942_280_401_432_7)
    };
    backward_expr(a, "gelu_backward", g * d)
}

pub fn silu_backward(a: &A) -> Result<PwPlan, String> {
    let (g, y) = (ex::operand(0), ex::operand(1));
    let s = || lit(1.0) / (lit(1.0) + ex::exp(-y.clone()));
    backward_expr(
        a,
        "silu_backward",
        g * s() * (lit(1.0) + y.clone() * (lit(1.0) - s())),
    )
}

pub fn sigmoid_backward(a: &A) -> Result<PwPlan, String> {
    let (g, y) = (ex::operand(0), ex::operand(1));
    backward_expr(a, "sigmoid_backward", g * y.clone() * (lit(1.0) - y))
}

pub fn tanh_backward(a: &A) -> Result<PwPlan, String> {
    let (g, y) = (ex::operand(0), ex::operand(1));
    backward_expr(a, "tanh_backward", g * (lit(1.0) - y.clone() * y))
}
