//! An op's element expression (`ops::expr`) rendered as WGSL: each call a
//! `let` of its type. Types follow the operands (floats compute in f32,
//! f16 included; i64 in i32 with every result outside the range flagged
//! in the status word; u32; bool); a literal takes the type of what it
//! meets. What each function means per type is written here once.

use super::*;
use kiln_functionalize::ops::expr::{Expr, Func};

/// The type an expression's values compute in on the device: f16 in
/// f32 and i8 in i32, rounded or wrapped where a result is made.
fn compute(d: DType) -> DType {
    match d {
        DType::F16 => DType::F32,
        DType::I8 => DType::I32,
        d => d,
    }
}

impl Gen<'_> {
    /// `e` over operand values `vals` (of dtypes `types`, carrying i64
    /// range fault codes `codes`: `Gen::settle`) for node `n`: the value,
    /// its dtype and the fault code it carries.
    pub(super) fn render(
        &mut self,
        n: NodeId,
        e: &Expr,
        vals: &[String],
        types: &[DType],
        codes: &[Option<String>],
    ) -> R<Rendered> {
        self.render_as(n, e, &Operands { vals, types, codes }, DType::F32)
    }

    /// As `render`; a literal alone takes `want`.
    fn render_as(&mut self, n: NodeId, e: &Expr, o: &Operands, want: DType) -> R<Rendered> {
        let (func, args) = match e {
            Expr::Operand(i) => {
                let (Some(v), Some(d)) = (o.vals.get(*i), o.types.get(*i)) else {
                    return Err(bug(format!("an expression reads operand {i}")));
                };
                let code = o.codes.get(*i).cloned().flatten();
                return Ok((v.clone(), compute(*d), code));
            }
            Expr::Lit(v) => return Ok((lit(*v, want)?, want, None)),
            Expr::Call(func, args) if args.len() == func.arity() => (*func, args),
            Expr::Call(func, _) => return Err(bug(format!("{func:?} with wrong arity"))),
        };
        // The operands' type: the first that is not a literal (a select's
        // condition aside); literals take it.
        let first = usize::from(func == Func::Select);
        let mut done: Vec<Option<(String, DType)>> = vec![None; args.len()];
        let mut codes: Vec<Option<String>> = vec![None; args.len()];
        for (i, a) in args.iter().enumerate() {
            if !matches!(a, Expr::Lit(_)) {
                let (s, d, c) = self.render_as(n, a, o, want)?;
                done[i] = Some((s, d));
                codes[i] = c;
            }
        }
        let t = done[first..]
            .iter()
            .flatten()
            .map(|(_, d)| *d)
            .find(|d| *d != DType::Bool || func_keeps_bool(func))
            .or_else(|| done[first..].iter().flatten().map(|(_, d)| *d).next())
            .unwrap_or(want);
        let mut a = vec![];
        for (i, x) in args.iter().enumerate() {
            let (s, d) = match (done[i].take(), x) {
                (Some(r), _) => r,
                (None, Expr::Lit(v)) => (lit(*v, t)?, t),
                (None, _) => return Err(bug("an operand left unrendered")),
            };
            // A select's condition and logic's operands keep their type.
            let keep = (func == Func::Select && i == 0)
                || matches!(func, Func::And | Func::Or | Func::Not);
            a.push(if keep { (s, d) } else { (cast(&s, d, t), t) });
        }
        let rendered = if func == Func::Log1p && t == DType::F32 {
            // log(u) * x / (u - 1) with u = 1 + x, the rounding of u
            // undone (Goldberg); plain log(u) where x is large or infinite.
            // (It binds a temporary, so it is rendered here.)
            let x = &a[0].0;
            let u = self.body.bind("f32", format!("1.0 + {x}"));
            Some((
                format!("select(select(log({u}) * ({x} / ({u} - 1.0)), log({u}), {x} > 1.0e4), {x}, {u} == 1.0)"),
                t,
            ))
        } else if func == Func::Expm1 && t == DType::F32 {
            // (u - 1) * x / log(u) with u = exp(x), the rounding of u
            // undone (Kahan); plain u - 1 where x is large, x itself
            // where u rounds to 1.
            let x = &a[0].0;
            let u = self.body.bind("f32", format!("exp({x})"));
            Some((
                format!("select(select(({u} - 1.0) * ({x} / log({u})), {u} - 1.0, abs({x}) > 0.5), {x}, {u} == 1.0)"),
                t,
            ))
        } else {
            element(func, &a, t)
        };
        let (text, out) = rendered.ok_or_else(|| {
            CompileError::no_kernel(format!(
                "`{}` on {t:?} values has no GPU kernel yet",
                self.g.nodes[n].op.name()
            ))
        })?;
        let r = self.body.bind(ty(out), text);
        // The operands' faults: a select keeps the chosen branch's.
        let mut code = if func == Func::Select && (codes[1].is_some() || codes[2].is_some()) {
            let pick = |c: &Option<String>| c.clone().unwrap_or_else(|| "0u".into());
            let cond = &a[0].0;
            let chosen = format!("select({}, {}, {cond})", pick(&codes[2]), pick(&codes[1]));
            either(codes[0].take(), Some(chosen))
        } else {
            codes.into_iter().fold(None, either)
        };
        if t == DType::I64 {
            if let Some(c) = i64_overflow(func, &a, &r) {
                code = either(code, Some(self.overflow_code(n, &c)));
            }
        }
        Ok((r, out, code))
    }
}

/// A rendered value, its dtype and the i64 range fault code it carries.
type Rendered = (String, DType, Option<String>);

/// An expression's operands: values, dtypes, fault codes.
struct Operands<'a> {
    vals: &'a [String],
    types: &'a [DType],
    codes: &'a [Option<String>],
}

/// Bool operands of these functions are their own type (else a bool
/// among numbers is a number: `gt(x, 0) * x`).
fn func_keeps_bool(f: Func) -> bool {
    matches!(f, Func::And | Func::Or | Func::Not | Func::Eq | Func::Ne)
}

/// Function `f` over operands `a` of type `t` (a select's condition and
/// logic's operands as they are): the WGSL and its type; `None` where the
/// type has no such function.
fn element(f: Func, a: &[(String, DType)], t: DType) -> Option<(String, DType)> {
    let x = &a[0].0;
    let y = a.get(1).map(|p| p.0.as_str()).unwrap_or("");
    let truth = |(s, d): &(String, DType)| cast(s, *d, DType::Bool);
    let b = DType::Bool;
    if let Some(op) = comparison(f) {
        return Some((compare(op, x, y, t), b));
    }
    match f {
        Func::And => return Some((format!("({} && {})", truth(&a[0]), truth(&a[1])), b)),
        Func::Or => return Some((format!("({} || {})", truth(&a[0]), truth(&a[1])), b)),
        Func::Not => {
            let e = match a[0].1 {
                DType::Bool => format!("!{x}"),
                d => format!("{x} == {}", literal(0.0, d)),
            };
            return Some((e, b));
        }
        Func::Select => {
            let c = truth(&a[0]);
            return Some((format!("select({}, {}, {c})", a[2].0, a[1].0), t));
        }
        // By the bits, as `compare` tests NaN; integers are neither.
        Func::IsNan if t == DType::F32 => return Some((format!("k_isnan({x})"), b)),
        Func::IsInf if t == DType::F32 => {
            let e = format!("((bitcast<u32>({x}) & 0x7fffffffu) == 0x7f800000u)");
            return Some((e, b));
        }
        Func::IsNan | Func::IsInf => return Some(("false".into(), b)),
        _ => {}
    }
    let e = match t {
        DType::F32 => float(f, x, y)?,
        DType::Bool => match f {
            Func::Add | Func::Max => format!("{x} || {y}"),
            Func::Mul | Func::Min => format!("{x} && {y}"),
            Func::Abs | Func::Sign => x.clone(),
            // x ** y: false only for false ** true.
            Func::Pow => format!("{x} || !{y}"),
            Func::BitAnd => format!("{x} && {y}"),
            Func::BitOr => format!("{x} || {y}"),
            Func::BitXor => format!("{x} != {y}"),
            Func::BitNot => format!("!{x}"),
            _ => return None,
        },
        _ => integer(f, x, y, t == DType::U32)?,
    };
    Some((e, t))
}

fn comparison(f: Func) -> Option<&'static str> {
    Some(match f {
        Func::Gt => ">",
        Func::Lt => "<",
        Func::Ge => ">=",
        Func::Le => "<=",
        Func::Eq => "==",
        Func::Ne => "!=",
        _ => return None,
    })
}

/// `x op y`; floats test NaN by its bits (a compiler may assume none).
fn compare(op: &str, x: &str, y: &str, t: DType) -> String {
    let e = format!("{x} {op} {y}");
    match (t == DType::F32, op) {
        (false, _) => e,
        (true, "!=") => format!("({e} || k_isnan({x}) || k_isnan({y}))"),
        (true, _) => format!("({e} && !k_isnan({x}) && !k_isnan({y}))"),
    }
}

fn float(f: Func, x: &str, y: &str) -> Option<String> {
    let nan2 = format!("k_isnan({x}) || k_isnan({y})");
    Some(match f {
        Func::Neg => format!("-({x})"),
        Func::Add => format!("{x} + {y}"),
        Func::Sub => format!("{x} - {y}"),
        Func::Mul => format!("{x} * {y}"),
        Func::Div => format!("{x} / {y}"),
        Func::Exp => format!("exp({x})"),
        Func::Log => format!("log({x})"),
        Func::Log2 => format!("log2({x})"),
        Func::Log10 => format!("log2({x}) * 0.30102999566398120"),
        Func::Floor => format!("floor({x})"),
        Func::Ceil => format!("ceil({x})"),
        Func::Trunc => format!("trunc({x})"),
        // WGSL's `round` takes ties to even, as `torch.round` does.
        Func::Round => format!("round({x})"),
        Func::Sqrt => format!("sqrt({x})"),
        Func::Rsqrt => format!("inverseSqrt({x})"),
        Func::Sin => format!("sin({x})"),
        Func::Cos => format!("cos({x})"),
        Func::Abs => format!("abs({x})"),
        Func::Tanh => format!("tanh({x})"),
        Func::Erf => format!("k_erf({x})"),
        Func::Tan => format!("tan({x})"),
        // Through atan2: drivers' asin and acos are coarser (lavapipe's
        // err by 3e-4), their atan2 is not; |x| > 1 gives NaN (sqrt).
        Func::Asin => format!("atan2({x}, sqrt((1.0 - {x}) * (1.0 + {x})))"),
        Func::Acos => format!("atan2(sqrt((1.0 - {x}) * (1.0 + {x})), {x})"),
        Func::Atan => format!("atan({x})"),
        Func::Sinh => format!("sinh({x})"),
        Func::Cosh => format!("cosh({x})"),
        Func::Asinh => format!("asinh({x})"),
        Func::Acosh => format!("acosh({x})"),
        Func::Atanh => format!("atanh({x})"),
        Func::Max => format!("select(max({x}, {y}), {x} + {y}, {nan2})"),
        Func::Min => format!("select(min({x}, {y}), {x} + {y}, {nan2})"),
        Func::DivTrunc => format!("trunc({x} / {y})"),
        Func::DivFloor => format!("floor({x} / {y})"),
        Func::Rem => format!("{x} - floor({x} / {y}) * {y}"),
        Func::Fmod => format!("{x} - trunc({x} / {y}) * {y}"),
        Func::Atan2 => format!("atan2({x}, {y})"),
        Func::Pow => format!("k_powf({x}, {y})"),
        Func::Sign => format!("select(select({x}, -1.0, {x} < 0.0), 1.0, {x} > 0.0)"),
        _ => return None,
    })
}

/// i32 (and i64, held as i32) or, with `unsigned`, u32.
fn integer(f: Func, x: &str, y: &str, unsigned: bool) -> Option<String> {
    let (zero, one) = if unsigned { ("0u", "1u") } else { ("0i", "1i") };
    Some(match f {
        Func::Add => format!("{x} + {y}"),
        Func::Sub => format!("{x} - {y}"),
        Func::Mul => format!("{x} * {y}"),
        Func::Neg if !unsigned => format!("-{x}"),
        Func::Abs if unsigned => x.to_string(),
        Func::Abs => format!("abs({x})"),
        Func::Max => format!("max({x}, {y})"),
        Func::Min => format!("min({x}, {y})"),
        Func::DivTrunc => format!("{x} / {y}"),
        Func::DivFloor if unsigned => format!("{x} / {y}"),
        Func::DivFloor => format!(
            "select({x} / {y}, {x} / {y} - {one}, ({x} % {y} != {zero}) && (({x} < {zero}) != ({y} < {zero})))"
        ),
        Func::Rem if unsigned => format!("{x} % {y}"),
        Func::Rem => format!(
            "select({x} % {y}, {x} % {y} + {y}, ({x} % {y} != {zero}) && (({x} % {y} < {zero}) != ({y} < {zero})))"
        ),
        // WGSL's `%` rounds the quotient toward zero, as C's does.
        Func::Fmod => format!("{x} % {y}"),
        Func::Pow if unsigned => format!("k_powu({x}, {y})"),
        Func::Pow => format!("k_powi({x}, {y})"),
        // Two's complement: i64 values held in i32 keep their bits.
        Func::BitAnd => format!("{x} & {y}"),
        Func::BitOr => format!("{x} | {y}"),
        Func::BitXor => format!("{x} ^ {y}"),
        Func::BitNot => format!("~{x}"),
        Func::Sign if unsigned => format!("min({x}, {one})"),
        Func::Sign => format!("sign({x})"),
        _ => return None,
    })
}

/// When i64 function `f` over `a` (computed in i32 as `r`) left the range.
fn i64_overflow(f: Func, a: &[(String, DType)], r: &str) -> Option<String> {
    let x = &a[0].0;
    let y = a.get(1).map(|p| p.0.as_str()).unwrap_or("");
    Some(match f {
        Func::Add => format!("k_add_ovf({x}, {y}, {r})"),
        Func::Sub => format!("k_sub_ovf({x}, {y}, {r})"),
        Func::Mul => format!("k_mul_ovf({x}, {y})"),
        Func::Neg | Func::Abs => format!("{x} == (-2147483647i - 1i)"),
        Func::DivTrunc | Func::DivFloor => format!("{x} == (-2147483647i - 1i) && {y} == -1i"),
        Func::Pow => format!("abs(pow(f32({x}), f32({y}))) >= 2147483648.0"),
        _ => return None,
    })
}
