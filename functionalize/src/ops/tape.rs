//! Reverse mode inside a decomposition: the gradient of a table op at
//! given arguments, emitted as table ops. The backward ops that joint
//! graphs hold (`convolution_backward`, `avg_pool2d_backward`, ...) are
//! composites of it: the op's own decomposition run once more on a tape,
//! then each recorded call's VJP rule in reverse, as the `vjp` transform
//! runs them over a graph.

use super::{bind, OpKind, Rule};
use crate::id::{Results, ValueId};
use crate::meta::Meta;
use crate::rule::{Call, Emit, R};
use crate::schema::Arg;
use std::collections::{HashMap, HashSet};

use super::OpId;

/// A call the tape recorded: op, overload, bound arguments, results.
struct Recorded {
    op: OpId,
    overload: usize,
    args: Vec<Arg<ValueId>>,
    outs: Vec<ValueId>,
}

/// An `Emit` that forwards to `inner`, expanding composites itself and
/// recording every other call.
struct Tape<'a> {
    inner: &'a mut dyn Emit,
    calls: Vec<Recorded>,
}

impl Emit for Tape<'_> {
    fn meta(&self, v: ValueId) -> &Meta {
        self.inner.meta(v)
    }
    fn call_id(&mut self, op: OpId, args: Vec<Arg<ValueId>>) -> R<Results> {
        // Views as their copies, whose rules the transforms use.
        let op = match (op.def().kind, op.def().counterpart) {
            (OpKind::View | OpKind::MultiView | OpKind::ViewOrCopy, Some(copy)) => copy,
            // `contiguous`: a copy, whose value is its input's.
            (OpKind::ViewOrCopy, None) => super::lookup("clone").unwrap_or(op),
            _ => op,
        };
        let (overload, bound) = bind(op, &args)?;
        if let Rule::Composite(f) = op.def().rule {
            let name = op.def().schemas[overload].overload.clone();
            return Ok(f(self, &name, &bound)?.into_iter().collect());
        }
        let outs = self.inner.call_id(op, bound.clone())?;
        self.calls.push(Recorded {
            op,
            overload,
            args: bound,
            outs: outs.to_vec(),
        });
        Ok(outs)
    }
    fn call_all(&mut self, name: &str, args: Vec<Arg<ValueId>>) -> R<Results> {
        let op = super::lookup(name).ok_or_else(|| format!("internal error: no op {name}"))?;
        self.call_id(op, args)
    }
}

/// The gradients of `op(args)` with respect to its tensor arguments at
/// `wrt` (positions in `args`), given cotangents `cts` of its results
/// (`None`: zero). A gradient nothing reaches is `None`.
pub fn vjp_of(
    e: &mut dyn Emit,
    op: &str,
    args: Vec<Arg<ValueId>>,
    wrt: &[usize],
    cts: &[Option<ValueId>],
) -> R<Vec<Option<ValueId>>> {
    let primals: Vec<ValueId> = wrt
        .iter()
        .map(|&i| match args.get(i) {
            Some(Arg::Tensor(v)) => Ok(*v),
            _ => Err(format!("internal error: {op} argument {i} is not a tensor")),
        })
        .collect::<R<_>>()?;
    let mut tape = Tape {
        inner: e,
        calls: vec![],
    };
    let outs = tape.call_all(op, args)?;
    let Tape { inner: e, calls } = tape;
    // Values that depend on the primals through floating values.
    let mut active: HashSet<ValueId> = primals.iter().copied().collect();
    for c in &calls {
        if c.args
            .iter()
            .any(|a| a.tensors().iter().any(|v| active.contains(v)))
        {
            for &r in &c.outs {
                if e.dtype(r).is_float() {
                    active.insert(r);
                }
            }
        }
    }
    let mut grads: HashMap<ValueId, ValueId> = HashMap::new();
    let accumulate =
        |e: &mut dyn Emit, grads: &mut HashMap<ValueId, ValueId>, v: ValueId, g: ValueId| {
            let g = if e.sizes(g) != e.sizes(v) || e.dtype(g) != e.dtype(v) {
                e.sum_like(g, v)?
            } else {
                g
            };
            let sum = match grads.get(&v) {
                Some(&old) => e.add(old, g)?,
                None => g,
            };
            grads.insert(v, sum);
            R::Ok(())
        };
    for (&o, ct) in outs.iter().zip(cts) {
        if let (Some(ct), true) = (ct, active.contains(&o)) {
            accumulate(e, &mut grads, o, *ct)?;
        }
    }
    for c in calls.iter().rev() {
        let gs: Vec<Option<ValueId>> = c.outs.iter().map(|r| grads.get(r).copied()).collect();
        let reads_active = c
            .args
            .iter()
            .any(|a| a.tensors().iter().any(|v| active.contains(v)));
        if gs.iter().all(Option::is_none) || !reads_active {
            continue;
        }
        let rule = c.op.def().rules.vjp.ok_or_else(|| {
            format!(
                "`{}` has no derivative rule (its gradient is not implemented)",
                c.op.name()
            )
        })?;
        let call = Call {
            op: c.op,
            overload: c.overload,
            args: &c.args,
            outs: &c.outs,
        };
        for (pos, j, g) in rule(e, &call, &gs)? {
            let v = match (&c.args[pos], j) {
                (Arg::Tensor(v), None) => *v,
                (Arg::TensorList(l), Some(j)) => match l.get(j).copied().flatten() {
                    Some(v) => v,
                    None => continue,
                },
                _ => return Err("internal error: a gradient for a non-tensor argument".into()),
            };
            if active.contains(&v) {
                accumulate(e, &mut grads, v, g)?;
            }
        }
    }
    Ok(primals.iter().map(|p| grads.get(p).copied()).collect())
}
