//! Typed access to bound arguments. Binding has already checked every kind
//! against the schema, so a mismatch here is a bug in the op table, reported
//! as an error rather than a panic.

use crate::dtype::{Category, DType};
use crate::meta::Meta;
use crate::schema::Arg;

/// A Python-style scalar argument.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scalar {
    Int(i64),
    Float(f64),
    Bool(bool),
}

impl Scalar {
    pub fn to_f64(self) -> f64 {
        match self {
            Scalar::Int(i) => i as f64,
            Scalar::Float(x) => x,
            Scalar::Bool(b) => b as i64 as f64,
        }
    }

    pub fn category(self) -> Category {
        match self {
            Scalar::Int(_) => Category::Int,
            Scalar::Float(_) => Category::Float,
            Scalar::Bool(_) => Category::Bool,
        }
    }

    /// The dtype a tensor filled with this scalar gets by default.
    pub fn default_dtype(self) -> DType {
        match self {
            Scalar::Int(_) => DType::I64,
            Scalar::Float(_) => DType::F32,
            Scalar::Bool(_) => DType::Bool,
        }
    }
}

/// Anything that carries tensor metadata: a `Meta` during shape inference, a
/// real tensor in the interpreter.
pub trait HasMeta {
    fn meta(&self) -> &Meta;
}

impl HasMeta for Meta {
    fn meta(&self) -> &Meta {
        self
    }
}

impl HasMeta for crate::tensor::RTensor {
    fn meta(&self) -> &Meta {
        &self.meta
    }
}

impl<T: HasMeta> HasMeta for &T {
    fn meta(&self) -> &Meta {
        (*self).meta()
    }
}

fn bug(i: usize, want: &str) -> String {
    format!("internal error: argument {} is not {want}", i + 1)
}

pub trait ArgsExt<T> {
    fn tensor(&self, i: usize) -> Result<&T, String>;
    fn opt_tensor(&self, i: usize) -> Result<Option<&T>, String>;
    fn tensor_list(&self, i: usize) -> Result<Vec<Option<&T>>, String>;
    fn int(&self, i: usize) -> Result<i64, String>;
    fn opt_int(&self, i: usize) -> Result<Option<i64>, String>;
    fn int_list(&self, i: usize) -> Result<&[i64], String>;
    fn opt_int_list(&self, i: usize) -> Result<Option<&[i64]>, String>;
    fn float(&self, i: usize) -> Result<f64, String>;
    fn bool(&self, i: usize) -> Result<bool, String>;
    fn scalar(&self, i: usize) -> Result<Scalar, String>;
    fn opt_scalar(&self, i: usize) -> Result<Option<Scalar>, String>;
    fn opt_str(&self, i: usize) -> Result<Option<&str>, String>;
    fn opt_dtype(&self, i: usize) -> Result<Option<DType>, String>;
    fn is_tensor(&self, i: usize) -> bool;
}

impl<T> ArgsExt<T> for [Arg<T>] {
    fn tensor(&self, i: usize) -> Result<&T, String> {
        match self.get(i) {
            Some(Arg::Tensor(t)) => Ok(t),
            _ => Err(bug(i, "a tensor")),
        }
    }
    fn opt_tensor(&self, i: usize) -> Result<Option<&T>, String> {
        match self.get(i) {
            Some(Arg::Tensor(t)) => Ok(Some(t)),
            Some(Arg::None) | None => Ok(None),
            _ => Err(bug(i, "an optional tensor")),
        }
    }
    fn tensor_list(&self, i: usize) -> Result<Vec<Option<&T>>, String> {
        match self.get(i) {
            Some(Arg::TensorList(l)) => Ok(l.iter().map(|x| x.as_ref()).collect()),
            _ => Err(bug(i, "a tensor list")),
        }
    }
    fn int(&self, i: usize) -> Result<i64, String> {
        match self.get(i) {
            Some(Arg::Int(x)) => Ok(*x),
            _ => Err(bug(i, "an integer")),
        }
    }
    fn opt_int(&self, i: usize) -> Result<Option<i64>, String> {
        match self.get(i) {
            Some(Arg::Int(x)) => Ok(Some(*x)),
            Some(Arg::None) | None => Ok(None),
            _ => Err(bug(i, "an optional integer")),
        }
    }
    fn int_list(&self, i: usize) -> Result<&[i64], String> {
        match self.get(i) {
            Some(Arg::IntList(l)) => Ok(l),
            _ => Err(bug(i, "an integer list")),
        }
    }
    fn opt_int_list(&self, i: usize) -> Result<Option<&[i64]>, String> {
        match self.get(i) {
            Some(Arg::IntList(l)) => Ok(Some(l)),
            Some(Arg::None) | None => Ok(None),
            _ => Err(bug(i, "an optional integer list")),
        }
    }
    fn float(&self, i: usize) -> Result<f64, String> {
        match self.get(i) {
            Some(Arg::Float(x)) => Ok(*x),
            Some(Arg::Int(x)) => Ok(*x as f64),
            _ => Err(bug(i, "a float")),
        }
    }
    fn bool(&self, i: usize) -> Result<bool, String> {
        match self.get(i) {
            Some(Arg::Bool(x)) => Ok(*x),
            _ => Err(bug(i, "a bool")),
        }
    }
    fn scalar(&self, i: usize) -> Result<Scalar, String> {
        self.opt_scalar(i)?.ok_or_else(|| bug(i, "a scalar"))
    }
    fn opt_scalar(&self, i: usize) -> Result<Option<Scalar>, String> {
        match self.get(i) {
            Some(Arg::Int(x)) => Ok(Some(Scalar::Int(*x))),
            Some(Arg::Float(x)) => Ok(Some(Scalar::Float(*x))),
            Some(Arg::Bool(x)) => Ok(Some(Scalar::Bool(*x))),
            Some(Arg::None) | None => Ok(None),
            _ => Err(bug(i, "a scalar")),
        }
    }
    fn opt_str(&self, i: usize) -> Result<Option<&str>, String> {
        match self.get(i) {
            Some(Arg::Str(s)) => Ok(Some(s)),
            Some(Arg::None) | None => Ok(None),
            _ => Err(bug(i, "a string")),
        }
    }
    fn opt_dtype(&self, i: usize) -> Result<Option<DType>, String> {
        match self.get(i) {
            Some(Arg::Dtype(d)) => Ok(Some(*d)),
            Some(Arg::None) | None => Ok(None),
            _ => Err(bug(i, "a dtype")),
        }
    }
    fn is_tensor(&self, i: usize) -> bool {
        matches!(self.get(i), Some(Arg::Tensor(_)))
    }
}

/// Metas of a tensor argument list, for shape rules written once for both
/// inference and evaluation.
pub fn metas<T: HasMeta>(args: &[Arg<T>]) -> Vec<Arg<&Meta>> {
    args.iter().map(|a| a.map(&mut |t| t.meta())).collect()
}
