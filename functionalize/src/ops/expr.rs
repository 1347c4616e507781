//! Scalar expressions of elementwise ops, as a small typed tree: declared
//! once in an op's entry and rendered by code generators (WGSL for the
//! GPU); float-only ops are evaluated from it by the reference interpreter
//! too. Written with the usual operators: `x() / (lit(1.0) + exp(-x()))`.
//!
//! Types follow the operands (each in the dtype its plan casts it to):
//! arithmetic keeps its operands' type, comparisons and logic give bool,
//! `select` its branches' type; a literal takes the type of what it meets.
//! Each function means what its ATen namesake does for that type (`add`
//! of bools is `or`; integer `div_floor` rounds down; i64 arithmetic that
//! leaves the range is an error, not a wrap).

use std::ops;

/// A function of an expression's nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Func {
    Neg,
    Add,
    Sub,
    Mul,
    Div,
    Exp,
    Log,
    /// `log(1 + x)`, accurate for small `x`.
    Log1p,
    /// `exp(x) - 1`, accurate for small `x`.
    Expm1,
    Log2,
    Log10,
    /// Rounding to an integral value: down, up, toward zero, to the
    /// nearest (ties to even, as `torch.round`).
    Floor,
    Ceil,
    Trunc,
    Round,
    Sqrt,
    /// `1 / sqrt(x)`.
    Rsqrt,
    Abs,
    Tanh,
    Sin,
    Cos,
    Erf,
    /// The other trigonometric and hyperbolic functions and their inverses.
    Tan,
    Asin,
    Acos,
    Atan,
    Sinh,
    Cosh,
    Asinh,
    Acosh,
    Atanh,
    /// The larger / smaller of two (NaN if either is).
    Max,
    Min,
    /// Comparisons: bool (false for NaN; `Ne` true).
    Gt,
    Lt,
    Ge,
    Le,
    Eq,
    Ne,
    /// Logic on truth values (non-zero is true): bool.
    And,
    Or,
    Not,
    /// `select(c, a, b)`: `a` where `c` is non-zero, else `b`.
    Select,
    /// Division rounded toward zero / down (integers: exact).
    DivTrunc,
    DivFloor,
    /// Python's `%`: the sign of the divisor.
    Rem,
    /// `a ** b`.
    Pow,
    /// Bitwise logic of integers (of bools: logic).
    BitAnd,
    BitOr,
    BitXor,
    BitNot,
    /// -1, 0 or 1 by the sign (NaN and signed zeros kept).
    Sign,
    /// Tests of a float's class: bool (false for integers).
    IsNan,
    IsInf,
    /// `atan2(y, x)`: the angle of the point `(x, y)`.
    Atan2,
    /// C's `fmod`: the remainder of division rounded toward zero (the
    /// sign of the dividend).
    Fmod,
}

impl Func {
    pub fn arity(self) -> usize {
        match self {
            Func::Neg
            | Func::Exp
            | Func::Log
            | Func::Log1p
            | Func::Expm1
            | Func::Log2
            | Func::Log10
            | Func::Floor
            | Func::Ceil
            | Func::Trunc
            | Func::Round
            | Func::Sqrt
            | Func::Rsqrt
            | Func::Abs
            | Func::Tanh
            | Func::Sin
            | Func::Cos
            | Func::Erf
            | Func::Tan
            | Func::Asin
            | Func::Acos
            | Func::Atan
            | Func::Sinh
            | Func::Cosh
            | Func::Asinh
            | Func::Acosh
            | Func::Atanh
            | Func::Not
            | Func::BitNot
            | Func::Sign
            | Func::IsNan
            | Func::IsInf => 1,
            Func::Select => 3,
            _ => 2,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    /// Operand `i` of the op's plan, in the dtype it computes in.
    Operand(usize),
    Lit(f64),
    Call(Func, Vec<Expr>),
}

/// Operand 0 (the op's `self`).
pub fn x() -> Expr {
    Expr::Operand(0)
}

/// Operand `i`.
pub fn operand(i: usize) -> Expr {
    Expr::Operand(i)
}

pub fn lit(v: f64) -> Expr {
    Expr::Lit(v)
}

macro_rules! funcs {
    ($($name:ident: $f:ident($($a:ident),*);)*) => {$(
        pub fn $name($($a: Expr),*) -> Expr {
            Expr::Call(Func::$f, vec![$($a),*])
        }
    )*};
}

funcs! {
    exp: Exp(a);
    log: Log(a);
    log1p: Log1p(a);
    expm1: Expm1(a);
    log2: Log2(a);
    log10: Log10(a);
    floor: Floor(a);
    ceil: Ceil(a);
    trunc: Trunc(a);
    round: Round(a);
    sqrt: Sqrt(a);
    rsqrt: Rsqrt(a);
    abs: Abs(a);
    tanh: Tanh(a);
    sin: Sin(a);
    cos: Cos(a);
    erf: Erf(a);
    tan: Tan(a);
    asin: Asin(a);
    acos: Acos(a);
    atan: Atan(a);
    sinh: Sinh(a);
    cosh: Cosh(a);
    asinh: Asinh(a);
    acosh: Acosh(a);
    atanh: Atanh(a);
    max: Max(a, b);
    min: Min(a, b);
    gt: Gt(a, b);
    lt: Lt(a, b);
    ge: Ge(a, b);
    le: Le(a, b);
    eq: Eq(a, b);
    ne: Ne(a, b);
    and: And(a, b);
    or: Or(a, b);
    not: Not(a);
    select: Select(cond, then, otherwise);
    div_trunc: DivTrunc(a, b);
    div_floor: DivFloor(a, b);
    rem: Rem(a, b);
    pow: Pow(a, b);
    sign: Sign(a);
    bit_and: BitAnd(a, b);
    bit_or: BitOr(a, b);
    bit_xor: BitXor(a, b);
    bit_not: BitNot(a);
    is_nan: IsNan(a);
    is_inf: IsInf(a);
    atan2: Atan2(a, b);
    fmod: Fmod(a, b);
}

macro_rules! binop {
    ($($tr:ident $m:ident $f:ident;)*) => {$(
        impl ops::$tr for Expr {
            type Output = Expr;
            fn $m(self, rhs: Expr) -> Expr {
                Expr::Call(Func::$f, vec![self, rhs])
            }
        }
    )*};
}

binop! {
    Add add Add;
    Sub sub Sub;
    Mul mul Mul;
    Div div Div;
}

impl ops::Neg for Expr {
    type Output = Expr;
    fn neg(self) -> Expr {
        Expr::Call(Func::Neg, vec![self])
    }
}

impl Expr {
    /// Its value at `operands`, in f64 (the reference interpreter's, for
    /// float ops; integer ops keep their own checked kernels).
    pub fn eval(&self, operands: &[f64]) -> f64 {
        match self {
            Expr::Operand(i) => operands.get(*i).copied().unwrap_or(f64::NAN),
            Expr::Lit(v) => *v,
            Expr::Call(f, args) => {
                let a: smallvec::SmallVec<[f64; 3]> =
                    args.iter().map(|e| e.eval(operands)).collect();
                let b = |c: bool| if c { 1.0 } else { 0.0 };
                match f {
                    Func::Neg => -a[0],
                    Func::Add => a[0] + a[1],
                    Func::Sub => a[0] - a[1],
                    Func::Mul => a[0] * a[1],
                    Func::Div => a[0] / a[1],
                    Func::Exp => a[0].exp(),
                    Func::Log => a[0].ln(),
                    Func::Log1p => a[0].ln_1p(),
                    Func::Expm1 => a[0].exp_m1(),
                    Func::Log2 => a[0].log2(),
                    Func::Log10 => a[0].log10(),
                    Func::Floor => a[0].floor(),
                    Func::Ceil => a[0].ceil(),
                    Func::Trunc => a[0].trunc(),
                    Func::Round => a[0].round_ties_even(),
                    Func::Sqrt => a[0].sqrt(),
                    Func::Rsqrt => 1.0 / a[0].sqrt(),
                    Func::Sin => a[0].sin(),
                    Func::Cos => a[0].cos(),
                    Func::Abs => a[0].abs(),
                    Func::Tanh => a[0].tanh(),
                    Func::Erf => libm::erf(a[0]),
                    Func::Tan => a[0].tan(),
                    Func::Asin => a[0].asin(),
                    Func::Acos => a[0].acos(),
                    Func::Atan => a[0].atan(),
                    Func::Sinh => a[0].sinh(),
                    Func::Cosh => a[0].cosh(),
                    Func::Asinh => a[0].asinh(),
                    Func::Acosh => a[0].acosh(),
                    Func::Atanh => a[0].atanh(),
                    Func::Max if a[0].is_nan() || a[1].is_nan() => f64::NAN,
                    Func::Max => a[0].max(a[1]),
                    Func::Min if a[0].is_nan() || a[1].is_nan() => f64::NAN,
                    Func::Min => a[0].min(a[1]),
                    Func::Gt => b(a[0] > a[1]),
                    Func::Lt => b(a[0] < a[1]),
                    Func::Ge => b(a[0] >= a[1]),
                    Func::Le => b(a[0] <= a[1]),
                    Func::Eq => b(a[0] == a[1]),
                    Func::Ne => b(a[0] != a[1]),
                    Func::And => b(a[0] != 0.0 && a[1] != 0.0),
                    Func::Or => b(a[0] != 0.0 || a[1] != 0.0),
                    Func::Not => b(a[0] == 0.0),
                    Func::DivTrunc => (a[0] / a[1]).trunc(),
                    Func::DivFloor => (a[0] / a[1]).floor(),
                    Func::Rem => a[0] - (a[0] / a[1]).floor() * a[1],
                    Func::Pow => a[0].powf(a[1]),
                    Func::BitAnd => ((a[0] as i64) & (a[1] as i64)) as f64,
                    Func::BitOr => ((a[0] as i64) | (a[1] as i64)) as f64,
                    Func::BitXor => ((a[0] as i64) ^ (a[1] as i64)) as f64,
                    Func::BitNot => !(a[0] as i64) as f64,
                    Func::Sign if a[0] > 0.0 => 1.0,
                    Func::Sign if a[0] < 0.0 => -1.0,
                    Func::Sign => a[0],
                    Func::IsNan => b(a[0].is_nan()),
                    Func::IsInf => b(a[0].is_infinite()),
                    Func::Atan2 => a[0].atan2(a[1]),
                    Func::Fmod => a[0] % a[1],
                    Func::Select => {
                        if a[0] != 0.0 {
                            a[1]
                        } else {
                            a[2]
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expressions_evaluate() {
        let silu = x() / (lit(1.0) + exp(-x()));
        assert!((silu.eval(&[2.0]) - 2.0 / (1.0 + (-2.0f64).exp())).abs() < 1e-15);
        let relu = select(gt(x(), lit(0.0)), x(), lit(0.0));
        assert_eq!(relu.eval(&[-3.0]), 0.0);
        assert_eq!(relu.eval(&[3.0]), 3.0);
        assert!(max(x(), lit(1.0)).eval(&[f64::NAN]).is_nan());
        assert_eq!(log1p(x()).eval(&[1e-20]), 1e-20);
        let y = || operand(1);
        assert_eq!(div_floor(x(), y()).eval(&[-7.0, 2.0]), -4.0);
        assert_eq!(div_trunc(x(), y()).eval(&[-7.0, 2.0]), -3.0);
        assert_eq!(rem(x(), y()).eval(&[-7.0, 2.0]), 1.0);
        assert_eq!(pow(x(), y()).eval(&[2.0, 10.0]), 1024.0);
        assert!(sign(x()).eval(&[f64::NAN]).is_nan());
        assert_eq!(sign(x()).eval(&[-0.5]), -1.0);
        assert_eq!(and(x(), not(y())).eval(&[2.0, 0.0]), 1.0);
        assert_eq!(or(eq(x(), y()), ne(x(), x())).eval(&[1.0, 2.0]), 0.0);
        assert_eq!(ne(x(), x()).eval(&[f64::NAN]), 1.0);
        assert_eq!(
            ge(x(), y()).eval(&[2.0, 2.0]) + le(x(), y()).eval(&[3.0, 2.0]),
            1.0
        );
    }
}
