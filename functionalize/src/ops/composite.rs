//! Composite ops: entries of the table whose meaning is a decomposition
//! into other table ops (PyTorch's CompositeImplicitAutograd: `conv2d`,
//! `batch_norm`, `hardswish`, ...), written against `Emit` as derivative
//! rules are. Everything else comes from the parts: the shape and dtype
//! rule runs the decomposition on metadata (`infer`), the reference
//! kernel on tensors (`Eager`, driven by the interpreter), and
//! functionalization emits the parts in the op's place, so the compiler
//! and the transforms never see a composite.

use super::{bind, infer as infer_op, OpId};
use crate::id::{Results, ValueId};
use crate::meta::{Meta, Metas};
use crate::rule::{Emit, R};
use crate::schema::Arg;
use crate::tensor::RTensor;

/// A decomposition: the op's bound arguments (every parameter, defaults
/// filled) and the name of the overload that bound them, to the values of
/// its results.
pub type DecompFn = fn(&mut dyn Emit, &str, &[Arg<ValueId>]) -> R<Vec<ValueId>>;

/// Value `i` of a scratch program (no graph: values are numbered).
fn numbered(i: usize) -> ValueId {
    slotmap::KeyData::from_ffi(i as u64).into()
}

fn number(v: ValueId) -> usize {
    use slotmap::Key;
    (v.data().as_ffi() & 0xffff_ffff) as usize
}

/// Numbers the tensors of `args` in order (`values` gets each one).
fn number_args<T: Clone>(args: &[Arg<T>], values: &mut Vec<T>) -> Vec<Arg<ValueId>> {
    args.iter()
        .map(|a| {
            a.map(&mut |t: &T| {
                values.push(t.clone());
                numbered(values.len() - 1)
            })
        })
        .collect()
}

/// The overload name of `overload` of `op`.
fn overload_name(op: OpId, overload: usize) -> &'static str {
    &op.def().schemas[overload].overload
}

/// An `Emit` over metadata alone: what a composite's results are.
struct Shapes {
    metas: Vec<Meta>,
}

impl Emit for Shapes {
    fn meta(&self, v: ValueId) -> &Meta {
        &self.metas[number(v)]
    }
    fn call_id(&mut self, op: OpId, args: Vec<Arg<ValueId>>) -> R<Results> {
        let (_, outs) = bind_infer(&self.metas, op, &args)?;
        Ok(outs
            .into_iter()
            .map(|m| {
                self.metas.push(m);
                numbered(self.metas.len() - 1)
            })
            .collect())
    }
    fn call_all(&mut self, name: &str, args: Vec<Arg<ValueId>>) -> R<Results> {
        self.call_id(by_name(name)?, args)
    }
}

/// `op(args)` bound, and its results' metadata (`metas` by value number).
fn bind_infer(metas: &[Meta], op: OpId, args: &[Arg<ValueId>]) -> R<(Vec<Arg<ValueId>>, Metas)> {
    let (_, bound) = bind(op, args)?;
    let m: Vec<Arg<&Meta>> = bound
        .iter()
        .map(|a| a.map(&mut |v| &metas[number(*v)]))
        .collect();
    let outs = infer_op(op, &m).map_err(|e| format!("{}: {e}", op.name()))?;
    Ok((bound, outs))
}

fn by_name(name: &str) -> R<OpId> {
    super::lookup(name).ok_or_else(|| format!("internal error: no op {name}"))
}

/// The results' metadata of composite `op`: fresh tensors, never views of
/// its arguments.
pub fn infer(op: OpId, f: DecompFn, args: &[Arg<&Meta>]) -> R<Metas> {
    // Bound arguments bind again, by the same overload.
    let (overload, _) = bind(op, args)?;
    let mut metas = vec![];
    let numbered = number_args(args, &mut metas);
    let mut s = Shapes {
        metas: metas.into_iter().cloned().collect(),
    };
    let outs = f(&mut s, overload_name(op, overload), &numbered)?;
    Ok(outs
        .into_iter()
        .map(|v| {
            // Fresh tensors: the parts' layout when it is one of its own
            // (an elementwise op keeps its input's, as TensorIterator
            // does), else contiguous.
            let m = &s.metas[number(v)];
            let own =
                m.offset == 0 && m.storage_numel == m.numel() && m.is_non_overlapping_and_dense();
            match own {
                true => m.clone(),
                false => Meta::contiguous(m.dtype, m.sizes.clone()),
            }
        })
        .collect())
}

/// How the reference runs one op of a decomposition (`interp::eval`).
pub type EvalOp<'a> = &'a dyn Fn(OpId, &[Arg<RTensor>], &[Meta]) -> R<Vec<RTensor>>;

/// An `Emit` that runs each op as it is emitted: the reference kernel of a
/// composite.
struct Eager<'a> {
    metas: Vec<Meta>,
    values: Vec<RTensor>,
    eval: EvalOp<'a>,
}

impl Emit for Eager<'_> {
    fn meta(&self, v: ValueId) -> &Meta {
        &self.metas[number(v)]
    }
    fn call_id(&mut self, op: OpId, args: Vec<Arg<ValueId>>) -> R<Results> {
        let (bound, outs) = bind_infer(&self.metas, op, &args)?;
        let tensors: Vec<Arg<RTensor>> = bound
            .iter()
            .map(|a| a.map(&mut |v| self.values[number(*v)].clone()))
            .collect();
        let results = (self.eval)(op, &tensors, &outs)?;
        Ok(results
            .into_iter()
            .map(|t| {
                self.metas.push(t.meta.clone());
                self.values.push(t);
                numbered(self.values.len() - 1)
            })
            .collect())
    }
    fn call_all(&mut self, name: &str, args: Vec<Arg<ValueId>>) -> R<Results> {
        self.call_id(by_name(name)?, args)
    }
}

/// Composite `op` on tensors, each part run by `eval`; the results are
/// fresh tensors laid out as `outs` (never aliases of the arguments, as
/// inference promised).
pub fn eval(
    op: OpId,
    f: DecompFn,
    args: &[Arg<RTensor>],
    outs: &[Meta],
    eval: EvalOp<'_>,
) -> R<Vec<RTensor>> {
    let (overload, _) = bind(op, args)?;
    let mut values = vec![];
    let numbered = number_args(args, &mut values);
    let mut e = Eager {
        metas: values.iter().map(|t| t.meta.clone()).collect(),
        values,
        eval,
    };
    let results = f(&mut e, overload_name(op, overload), &numbered)?;
    Ok(results
        .into_iter()
        .zip(outs)
        .map(|(v, m)| RTensor::from_values(m.clone(), &e.values[number(v)].values()))
        .collect())
}
