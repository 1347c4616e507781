//! Outputs that are views of a buffer (`Schedule::host_views`): the
//! buffer is read back once and the view taken on the host, by the view's
//! strides, with no copy kernel.

use super::host::HostTensor;
use crate::{EngineError, Program};
use kiln_functionalize::ops::{self, Rule};
use kiln_functionalize::schema::Arg;
use kiln_functionalize::{Meta, ValueId};

/// Output `v` (a view copy of a read-back buffer `base`) as a host tensor.
pub fn host_view(
    p: &Program,
    v: ValueId,
    base: &HostTensor,
) -> Result<HostTensor<'static>, EngineError> {
    let g = &p.graph;
    let bug = |m: &str| EngineError::Internal(format!("host view: {m}"));
    let n = g.node_of(v).ok_or_else(|| bug("no node"))?;
    let node = &g.nodes[n];
    let Rule::ViewCopy(view) = node.op.def().rule else {
        return Err(bug("not a view copy"));
    };
    let cm = Meta::contiguous(base.dtype(), base.sizes().to_vec());
    let mut args: Vec<Arg<&Meta>> = vec![Arg::Tensor(&cm)];
    args.extend(node.args[1..].iter().map(|a| a.map(&mut |x| g.meta(*x))));
    let metas = ops::infer(view, &args).map_err(EngineError::Internal)?;
    let k = node
        .results
        .iter()
        .position(|&r| r == v)
        .ok_or_else(|| bug("not a result of its node"))?;
    let m = metas.get(k).ok_or_else(|| bug("no such result"))?;
    Ok(base.gather(&m.sizes, &m.strides, m.offset))
}
