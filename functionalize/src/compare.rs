//! How close two results must be to count as equal: PyTorch's
//! `torch.testing.assert_close` rule and default tolerances, stated once
//! for every comparison Kiln makes (tests, benchmarks, the CLI).
//!
//! An element passes when `|a - b| <= atol + rtol * |b|` (`b` expected);
//! NaN matches NaN and infinities match themselves. Integers and bools
//! compare exactly.

use crate::{DType, RTensor};

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    pub rtol: f64,
    pub atol: f64,
}

impl Tolerance {
    pub const EXACT: Tolerance = Tolerance {
        rtol: 0.0,
        atol: 0.0,
    };

    /// `assert_close`'s defaults for `dtype`: f32 rtol 1.3e-6, atol 1e-5;
    /// f16 rtol 1e-3, atol 1e-5; integers and bools exact.
    pub fn of(dtype: DType) -> Tolerance {
        match dtype {
            DType::F32 => Tolerance {
                rtol: 1.3e-6,
                atol: 1e-5,
            },
            DType::F16 => Tolerance {
                rtol: 1e-3,
                atol: 1e-5,
            },
            _ => Tolerance::EXACT,
        }
    }

    /// The transforms' contract (`docs/transforms.md`): results
    /// equal `torch.func`'s within rtol 1e-4, atol 1e-5 in f32, and
    /// `assert_close`'s defaults in f16.
    pub fn transform(dtype: DType) -> Tolerance {
        match dtype {
            DType::F32 => Tolerance {
                rtol: 1e-4,
                atol: 1e-5,
            },
            d => Tolerance::of(d),
        }
    }

    /// For results accumulated over many terms in an order other than the
    /// reference's (GPU matrix products and reductions, f32 against the
    /// reference's f64): `of(dtype)`, with `atol` raised to `rel` times the
    /// largest expected magnitude `scale` (cancellation makes an element's
    /// own magnitude no measure of its rounding error).
    pub fn accumulated(dtype: DType, rel: f64, scale: f64) -> Tolerance {
        let t = Tolerance::of(dtype);
        if t == Tolerance::EXACT {
            return t;
        }
        Tolerance {
            rtol: t.rtol.max(rel),
            atol: t.atol.max(rel * scale),
        }
    }

    pub fn accepts(&self, got: f64, want: f64) -> bool {
        got == want
            || (got.is_nan() && want.is_nan())
            || (got - want).abs() <= self.atol + self.rtol * want.abs()
    }
}

/// `Ok` when `got` has `want`'s dtype and shape and every element is
/// within `tol` (`Tolerance::of(dtype)` unless the comparison says why
/// not); else the first element that is not, named after `what`.
pub fn assert_close(
    what: &str,
    got: &RTensor,
    want: &RTensor,
    tol: Tolerance,
) -> Result<(), String> {
    if got.dtype() != want.dtype() || got.sizes() != want.sizes() {
        return Err(format!(
            "{what}: got {:?}{:?}, expected {:?}{:?}",
            got.dtype(),
            got.sizes(),
            want.dtype(),
            want.sizes()
        ));
    }
    for (i, (x, y)) in got.values().iter().zip(want.values()).enumerate() {
        if !tol.accepts(*x, y) {
            return Err(format!(
                "{what}: element {i} is {x}, expected {y} (|diff| {:e} > atol {:e} + rtol {:e} * |expected|)",
                (x - y).abs(),
                tol.atol,
                tol.rtol
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_f16_ulp_passes_and_two_do_not() {
        let t = Tolerance::of(DType::F16);
        // f16 ulp at 0.3 is 2^-12 = 2.44e-4.
        assert!(t.accepts(0.3 + 2.44e-4, 0.3));
        assert!(!t.accepts(0.3 + 3.0 * 2.44e-4, 0.3));
        assert!(t.accepts(f64::NAN, f64::NAN));
        assert!(t.accepts(f64::INFINITY, f64::INFINITY));
        assert!(!t.accepts(f64::INFINITY, 1.0));
        assert!(!Tolerance::of(DType::I32).accepts(2.0, 1.0));
        let a = Tolerance::accumulated(DType::F32, 1e-4, 100.0);
        assert!(a.accepts(0.005, 0.0) && !a.accepts(0.02, 0.0));
    }
}
