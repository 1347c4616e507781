//! Lowering a functional, view-free graph into a kernel schedule.
//!
//! Every value is either *materialized* (it has a buffer) or *inlined*
//! (recomputed inside each kernel that reads it). Elementwise ops, view
//! copies (index maps), broadcasts, fills and factories are inlined into
//! their consumer when they have one consumer, and view copies and
//! factories even when they have several (they cost no memory traffic).
//! Reductions, normalizations, matrix products, gathers and `index_put`
//! are kernels of their own, whose loads read inlined producers directly.
//! A scatter whose base dies at the scatter writes only its region into
//! the base's buffer (re-inplacing).

use crate::EngineError;
use kiln_functionalize::graph::{Def, Graph, NodeId, ValueId};
use kiln_functionalize::ops::{OpKind, Rule};
use kiln_functionalize::schema::Arg;
use std::collections::{HashMap, HashSet};

/// How a node is computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// Element `i` of the result is an expression of its inputs.
    Map,
    /// A kernel of its own (reductions, matmuls, gathers, ...).
    Kernel,
}

pub fn class(g: &Graph, n: NodeId) -> Result<Class, EngineError> {
    let def = g.nodes[n].op.def();
    Ok(match (&def.rule, def.name.as_str()) {
        (Rule::Pointwise(_), _) | (Rule::ViewCopy(_), _) => Class::Map,
        (
            _,
            "clone" | "copy" | "fill" | "zero" | "masked_fill" | "zeros" | "ones" | "full"
            | "arange" | "zeros_like" | "ones_like" | "full_like" | "slice_scatter"
            | "select_scatter" | "diagonal_scatter",
        ) => Class::Map,
        (
            _,
            "sum" | "mean" | "amax" | "amin" | "softmax" | "log_softmax" | "_softmax"
            | "_log_softmax" | "layer_norm" | "mm" | "bmm" | "matmul" | "addmm" | "linear"
            | "embedding" | "index_select" | "index_put" | "as_strided_scatter",
        ) => Class::Kernel,
        _ => {
            let kind = match def.kind {
                OpKind::View | OpKind::MultiView | OpKind::ViewOrCopy => {
                    "a view (functionalize with mutations_and_views first)"
                }
                OpKind::InPlace => "an in-place op (functionalize first)",
                _ => "not supported by the gpu backend yet",
            };
            return Err(EngineError::Unsupported(format!(
                "`{}` is {kind}",
                def.name
            )));
        }
    })
}

/// Index maps and factories: free to recompute in every consumer.
pub fn is_free(g: &Graph, n: NodeId) -> bool {
    let def = g.nodes[n].op.def();
    matches!(def.rule, Rule::ViewCopy(_))
        || matches!(
            def.name.as_str(),
            "zeros"
                | "ones"
                | "full"
                | "arange"
                | "zeros_like"
                | "ones_like"
                | "full_like"
                | "zero"
                | "fill"
        )
}

/// The schedule: which values have buffers, in which kernels they are made.
pub struct Schedule {
    /// Materialized values, in the order their kernels run.
    pub materialized: Vec<ValueId>,
    pub is_materialized: HashSet<ValueId>,
    /// Scatters that write into their dying base's buffer: scatter value ->
    /// base value.
    pub inplace: HashMap<ValueId, ValueId>,
    pub uses: HashMap<ValueId, Vec<NodeId>>,
}

pub fn schedule(g: &Graph, outputs: &[ValueId]) -> Result<Schedule, EngineError> {
    let mut uses: HashMap<ValueId, Vec<NodeId>> = HashMap::new();
    for &n in &g.order {
        for v in g.nodes[n].inputs() {
            uses.entry(v).or_default().push(n);
        }
    }
    let out_set: HashSet<ValueId> = outputs.iter().copied().collect();
    let mut s = Schedule {
        materialized: vec![],
        is_materialized: HashSet::new(),
        inplace: HashMap::new(),
        uses,
    };
    for &v in &g.inputs {
        s.is_materialized.insert(v);
    }
    for &n in &g.order {
        let c = class(g, n)?;
        for &r in &g.nodes[n].results {
            let n_uses = s.uses.get(&r).map_or(0, |u| u.len());
            let mat = c == Class::Kernel || out_set.contains(&r) || (n_uses > 1 && !is_free(g, n));
            if mat {
                s.materialized.push(r);
                s.is_materialized.insert(r);
            }
        }
    }
    // Re-inplace scatters whose base dies at the scatter.
    for &r in &s.materialized.clone() {
        let Def::Node(n, _) = g.values[r].def else {
            continue;
        };
        let node = &g.nodes[n];
        let name = node.op.name();
        let Some(view) = name.strip_suffix("_scatter") else {
            continue;
        };
        let Some(&Arg::Tensor(base)) = node.args.first() else {
            continue;
        };
        if !s.is_materialized.contains(&base)
            || out_set.contains(&base)
            || s.inplace.values().any(|&b| b == base)
        {
            continue;
        }
        let region = inlined_region(g, &s, n);
        let copy_name = format!("{view}_copy");
        let ok = s.uses[&base].iter().all(|&u| {
            u == n || {
                let un = &g.nodes[u];
                // Reads of the region being overwritten, by the thread that
                // overwrites it, inside this kernel.
                region.contains(&u) && un.op.name() == copy_name && un.args[1..] == node.args[2..]
            }
        });
        if ok && s.uses[&base].iter().filter(|&&u| u == n).count() == 1 {
            s.inplace.insert(r, base);
        }
    }
    Ok(s)
}

/// Nodes inlined into the kernel that computes node `n`'s results.
pub fn inlined_region(g: &Graph, s: &Schedule, n: NodeId) -> HashSet<NodeId> {
    let mut seen = HashSet::new();
    let mut stack: Vec<ValueId> = g.nodes[n].inputs();
    while let Some(v) = stack.pop() {
        if s.is_materialized.contains(&v) {
            continue;
        }
        if let Def::Node(m, _) = g.values[v].def {
            if seen.insert(m) {
                stack.extend(g.nodes[m].inputs());
            }
        }
    }
    seen
}

/// Materialized values a kernel for node `n` reads.
pub fn reads(g: &Graph, s: &Schedule, n: NodeId) -> Vec<ValueId> {
    let mut out = vec![];
    let mut seen = HashSet::new();
    let mut stack: Vec<ValueId> = g.nodes[n].inputs();
    while let Some(v) = stack.pop() {
        if !seen.insert(v) {
            continue;
        }
        if s.is_materialized.contains(&v) {
            out.push(v);
        } else if let Def::Node(m, _) = g.values[v].def {
            stack.extend(g.nodes[m].inputs());
        }
    }
    out.sort();
    out
}
