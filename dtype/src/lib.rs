//! Element types and PyTorch's type promotion rules.
//!
//! `i64` is PyTorch's index and default integer type (an integer literal's
//! tensor type, `sum` of integers, `arange` of integers, `argmax`). The
//! reference holds elements as `f64`, exact for i64 values within 2^53
//! (`I64_EXACT`); values beyond are refused where they enter. The default
//! float type is `f32` (Kiln has no f64).

use std::fmt;

/// The largest magnitude up to which every integer is an `f64`: the range of
/// i64 values the reference holds exactly.
pub const I64_EXACT: f64 = 9_007_199_254_740_992.0;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    Bool,
    I8,
    U32,
    I32,
    I64,
    F16,
    F32,
}

/// The three promotion categories of PyTorch (complex aside).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Category {
    Bool,
    Int,
    Float,
}

impl DType {
    pub const ALL: [DType; 7] = [
        DType::F32,
        DType::F16,
        DType::I32,
        DType::I64,
        DType::U32,
        DType::I8,
        DType::Bool,
    ];

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U32 => "u32",
            DType::I8 => "i8",
            DType::Bool => "bool",
        }
    }

    pub fn parse(s: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == s)
    }

    pub fn size_bytes(self) -> usize {
        match self {
            DType::I64 => 8,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F16 => 2,
            DType::I8 | DType::Bool => 1,
        }
    }

    pub fn category(self) -> Category {
        match self {
            DType::Bool => Category::Bool,
            DType::I8 | DType::U32 | DType::I32 | DType::I64 => Category::Int,
            DType::F16 | DType::F32 => Category::Float,
        }
    }

    pub fn is_float(self) -> bool {
        self.category() == Category::Float
    }

    pub fn is_integral(self) -> bool {
        self.category() == Category::Int
    }

    /// Rounds an `f64` to the nearest value representable in this dtype, the
    /// way a store of that element type would (float to int truncates toward
    /// zero and wraps, anything non-zero is `true`).
    pub fn cast(self, v: f64) -> f64 {
        match self {
            DType::F32 | DType::F16 if EXACT.get() => v,
            DType::F32 => v as f32 as f64,
            DType::F16 => half::f16::from_f64(v).to_f64(),
            DType::I32 => (v as i64) as i32 as f64,
            // Saturating: beyond 2^53 the reference refuses values anyway.
            DType::I64 => (v as i64) as f64,
            DType::U32 => (v as i64) as u32 as f64,
            DType::I8 => (v as i64) as i8 as f64,
            DType::Bool => {
                if v != 0.0 {
                    1.0
                } else {
                    0.0
                }
            }
        }
    }

    /// PyTorch's `can_cast`: may a result of type `self` be written into a
    /// tensor of type `to` by an in-place op?
    pub fn can_cast_to(self, to: DType) -> bool {
        !(self.is_float() && to.is_integral()
            || self.is_float() && to == DType::Bool
            || self.is_integral() && to == DType::Bool)
    }
}

thread_local! {
    static EXACT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with floating point elements held as exact `f64`s (nothing
/// rounded to f32 or f16 on a store), on this thread: derivatives are
/// checked against finite differences in f64.
pub fn with_exact_floats<T>(f: impl FnOnce() -> T) -> T {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            EXACT.set(self.0);
        }
    }
    let _reset = Reset(EXACT.replace(true));
    f()
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `torch.promote_types` restricted to Kiln's dtypes.
pub fn promote_types(a: DType, b: DType) -> Result<DType, String> {
    use DType::*;
    if a == b {
        return Ok(a);
    }
    Ok(match (a.min(b), a.max(b)) {
        (Bool, x) => x,
        (I8, U32) | (U32, I32 | I64) => {
            return Err(format!(
                "promotion of u32 with {} is not supported (as in PyTorch); convert one \
                 operand with _to_copy first",
                if a == U32 { b } else { a }
            ))
        }
        (I8, I32 | I64) | (I32, I64) => a.max(b),
        (I8 | U32 | I32 | I64, F16) => F16,
        (_, F32) => F32,
        (x, y) => unreachable!("promote_types({x}, {y}) is covered above"),
    })
}

/// What an operand contributes to type promotion: a tensor with dimensions, a
/// 0-d tensor, or a Python scalar ("wrapped number").
#[derive(Clone, Copy, Debug)]
pub enum PromoOperand {
    Dim(DType),
    ZeroDim(DType),
    Scalar(Category),
}

/// `at::result_type` over a list of operands: dimensioned tensors win within
/// a category, 0-d tensors next, scalars only lift the category.
pub fn result_type(ops: &[PromoOperand]) -> Result<DType, String> {
    let mut dim: Option<DType> = None;
    let mut zero: Option<DType> = None;
    let mut wrapped: Option<DType> = None;
    let join = |slot: &mut Option<DType>, d: DType| -> Result<(), String> {
        *slot = Some(match *slot {
            None => d,
            Some(s) => promote_types(s, d)?,
        });
        Ok(())
    };
    for op in ops {
        match *op {
            PromoOperand::Dim(d) => join(&mut dim, d)?,
            PromoOperand::ZeroDim(d) => join(&mut zero, d)?,
            PromoOperand::Scalar(c) => join(
                &mut wrapped,
                match c {
                    Category::Bool => DType::Bool,
                    Category::Int => DType::I64,
                    Category::Float => DType::F32,
                },
            )?,
        }
    }
    let combine = |higher: Option<DType>, lower: Option<DType>| -> Result<Option<DType>, String> {
        Ok(match (higher, lower) {
            (None, l) => l,
            (Some(h), None) => Some(h),
            (Some(h), Some(l)) => {
                if h.is_float() {
                    Some(h)
                } else if h == DType::Bool || l.is_float() {
                    Some(promote_types(h, l)?)
                } else {
                    Some(h)
                }
            }
        })
    };
    let lower = combine(zero, wrapped)?;
    combine(dim, lower)?.ok_or_else(|| "type promotion needs at least one operand".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use Category as C;
    use DType::*;
    use PromoOperand::*;

    #[test]
    fn promotion_follows_pytorch() {
        assert_eq!(result_type(&[Dim(I32), Scalar(C::Float)]), Ok(F32));
        assert_eq!(result_type(&[Dim(F16), Scalar(C::Float)]), Ok(F16));
        assert_eq!(result_type(&[Dim(I32), Scalar(C::Int)]), Ok(I32));
        assert_eq!(result_type(&[Dim(U32), Scalar(C::Int)]), Ok(U32));
        assert_eq!(result_type(&[Dim(Bool), Scalar(C::Int)]), Ok(I64));
        assert_eq!(result_type(&[Dim(I64), Scalar(C::Float)]), Ok(F32));
        assert_eq!(result_type(&[Dim(I32), Dim(I64)]), Ok(I64));
        assert_eq!(result_type(&[Dim(I32), ZeroDim(I64)]), Ok(I32));
        assert_eq!(result_type(&[Dim(F16), ZeroDim(F32)]), Ok(F16));
        assert_eq!(result_type(&[Dim(I32), ZeroDim(F16)]), Ok(F16));
        assert_eq!(result_type(&[Dim(F16), Dim(F32)]), Ok(F32));
        assert!(result_type(&[Dim(I32), Dim(U32)]).is_err());
        assert!(result_type(&[Dim(I64), Dim(U32)]).is_err());
        assert!(result_type(&[Dim(I8), Dim(U32)]).is_err());
        assert_eq!(result_type(&[Dim(I8), Dim(I32)]), Ok(I32));
        assert_eq!(result_type(&[Dim(I8), Scalar(C::Int)]), Ok(I8));
        assert_eq!(result_type(&[Dim(I8), Dim(F16)]), Ok(F16));
        assert_eq!(result_type(&[Dim(Bool), Dim(I8)]), Ok(I8));
    }

    #[test]
    fn casts_round_like_stores() {
        assert_eq!(I32.cast(-2.7), -2.0);
        assert_eq!(I32.cast(2147483648.0), -2147483648.0);
        assert_eq!(I8.cast(130.0), -126.0);
        assert_eq!(I8.cast(-3.9), -3.0);
        assert_eq!(Bool.cast(f64::NAN), 1.0);
        assert_eq!(F16.cast(1.0 + 1e-4), 1.0);
        assert!(!F32.can_cast_to(I32) && I32.can_cast_to(F16) && !I32.can_cast_to(Bool));
    }
}
