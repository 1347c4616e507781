//! Which elements of a buffer a scatter kernel reads, invocation by
//! invocation. Re-inplacing a scatter (writing only its region into the
//! base's buffer) is race-free when every invocation reads that buffer
//! only at the element it writes itself, or at elements no invocation
//! writes. This module checks exactly that by following the index
//! arithmetic of the inlined ops (the same arithmetic the code generator
//! emits) for each invocation, so a read through `t_copy` of the written
//! slice is caught and a read of another row is allowed.

use crate::schedule::Schedule;
use kiln_functionalize::graph::{Def, Graph, NodeId, ValueId};
use kiln_functionalize::meta::{broadcast_strides, Meta};
use kiln_functionalize::ops::{self, Lowering, Rule};
use kiln_functionalize::schema::Arg;
use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};

/// Kernels above this many invocations are not traced (compile time):
/// their scatters stay out of place when they read their own base.
const MAX_TRACED: usize = 1 << 22;

/// The storage offset of element `i` (row-major over `sizes`) of a view
/// with `strides` and `offset`.
fn ravel(mut i: usize, sizes: &[usize], strides: &[usize], offset: usize) -> usize {
    let mut at = offset;
    for (&s, &st) in sizes.iter().zip(strides).rev() {
        if s > 0 {
            at += (i % s) * st;
            i /= s;
        }
    }
    at
}

/// The view `view` (an op id) with `args` applied to a contiguous tensor
/// of `base`'s shape: result `k`'s sizes, strides and offset.
fn view_meta(
    g: &Graph,
    view: ops::OpId,
    base: &Meta,
    args: &[Arg<ValueId>],
    k: usize,
) -> Option<Meta> {
    let cm = Meta::contiguous(base.dtype, base.sizes.clone());
    let mut va: Vec<Arg<&Meta>> = vec![Arg::Tensor(&cm)];
    va.extend(args.iter().map(|a| a.map(&mut |v| g.meta(*v))));
    let mut metas = ops::infer(view, &va).ok()?;
    (k < metas.len()).then(|| metas.swap_remove(k))
}

struct Tracer<'a> {
    g: &'a Graph,
    s: &'a Schedule,
    root: ValueId,
    views: HashMap<(NodeId, usize), Meta>,
    /// For inlined scatters: output element -> source element.
    scatters: HashMap<NodeId, HashMap<usize, usize>>,
}

impl Tracer<'_> {
    /// Pushes the elements of `root`'s buffer read to compute element
    /// `idx` of `v`; `None` when an op's index arithmetic is not known here.
    fn reads(&mut self, v: ValueId, idx: usize, out: &mut Vec<usize>) -> Option<()> {
        let g = self.g;
        if self.s.is_materialized.contains(&v) {
            // Values sharing the buffer (in-place versions, reshapes) are
            // all stored contiguously from its start.
            if self.s.root(v) == self.root {
                out.push(idx);
            }
            return Some(());
        }
        let Def::Node(n, k) = g.values[v].def else {
            return Some(());
        };
        let node = &g.nodes[n];
        let def = node.op.def();
        let om = g.meta(v);
        let tensor = |i: usize| match node.args.get(i) {
            Some(Arg::Tensor(t)) => Some(*t),
            _ => None,
        };
        // Element `idx` of the result read from operand `t` broadcast to it.
        let bcast = |t: ValueId| -> usize {
            let tm = g.meta(t);
            if tm.sizes == om.sizes {
                idx
            } else if tm.numel() == 1 {
                0
            } else {
                let st =
                    broadcast_strides(&Meta::contiguous(tm.dtype, tm.sizes.clone()), &om.sizes);
                ravel(idx, &om.sizes, &st, 0)
            }
        };
        match (&def.rule, def.name.as_str()) {
            (Rule::Pointwise(_), _) | (_, "copy" | "masked_fill") => {
                let skip = usize::from(def.name == "copy");
                for t in node.args.iter().skip(skip).filter_map(|a| match a {
                    Arg::Tensor(t) => Some(*t),
                    _ => None,
                }) {
                    let i = bcast(t);
                    self.reads(t, i, out)?;
                }
                Some(())
            }
            (Rule::ViewCopy(view), _) => {
                let input = tensor(0)?;
                let key = (n, k);
                if let Entry::Vacant(e) = self.views.entry(key) {
                    e.insert(view_meta(g, *view, g.meta(input), &node.args[1..], k)?);
                }
                let vm = &self.views[&key];
                let at = ravel(idx, &vm.sizes, &vm.strides, vm.offset);
                self.reads(input, at, out)
            }
            (_, "clone") => self.reads(tensor(0)?, idx, out),
            (_, "fill") => match tensor(1) {
                Some(t) => self.reads(t, 0, out),
                None => Some(()),
            },
            // Factories and fills of a literal read nothing.
            _ if def.lowering == Lowering::Free => Some(()),
            (_, _) if matches!(def.lowering, Lowering::RegionScatter(_)) => {
                let (base, src) = (tensor(0)?, tensor(1)?);
                if let Entry::Vacant(e) = self.scatters.entry(n) {
                    let view = def.lowering.scatter_view()?;
                    let vm = view_meta(g, view, om, &node.args[2..], 0)?;
                    let map = (0..vm.numel())
                        .map(|j| (ravel(j, &vm.sizes, &vm.strides, vm.offset), j))
                        .collect();
                    e.insert(map);
                }
                match self.scatters[&n].get(&idx).copied() {
                    Some(j) => self.reads(src, j, out),
                    None => self.reads(base, idx, out),
                }
            }
            _ => None,
        }
    }
}

/// Can scatter node `n` write its source into the buffer of `base`
/// (whose owner is `root`) in place, with every invocation reading that
/// buffer only at its own target element or outside the written region?
/// `x[view] = f(x[view], ...)`, decided without tracing (any size): every
/// read of `root`'s buffer in the source `v` is the scatter's own view of
/// `base` (the same view op and arguments), reached through elementwise
/// ops of one shape, so element `j` reads only the element it writes.
#[allow(clippy::too_many_arguments)]
fn same_view_reads(
    g: &Graph,
    s: &Schedule,
    v: ValueId,
    view: ops::OpId,
    base: ValueId,
    root: ValueId,
    view_args: &[Arg<ValueId>],
    memo: &mut HashMap<ValueId, bool>,
) -> bool {
    if let Some(&b) = memo.get(&v) {
        return b;
    }
    let reads_root = |x: ValueId| {
        crate::schedule::reads_value(g, s, x)
            .iter()
            .any(|&r| s.root(r) == root)
    };
    let ok = if !reads_root(v) {
        true
    } else if s.is_materialized.contains(&v) {
        false
    } else if let Def::Node(m, _) = g.values[v].def {
        let node = &g.nodes[m];
        match node.op.def().rule {
            Rule::ViewCopy(op) => {
                op == view
                    && node.args.first() == Some(&Arg::Tensor(base))
                    && node.args[1..] == *view_args
            }
            Rule::Pointwise(_) => {
                let out = &g.meta(v).sizes;
                node.args.iter().all(|a| match a {
                    Arg::Tensor(x) if g.meta(*x).sizes == *out => {
                        same_view_reads(g, s, *x, view, base, root, view_args, memo)
                    }
                    Arg::Tensor(x) => !reads_root(*x),
                    _ => true,
                })
            }
            _ => false,
        }
    } else {
        false
    };
    memo.insert(v, ok);
    ok
}

pub fn inplace_race_free(g: &Graph, s: &Schedule, n: NodeId, base: ValueId, root: ValueId) -> bool {
    let node = &g.nodes[n];
    let Some(Arg::Tensor(src)) = node.args.get(1).cloned() else {
        return false;
    };
    let reads_root = crate::schedule::reads_value(g, s, src)
        .iter()
        .any(|&r| s.root(r) == root);
    if !reads_root {
        return true;
    }
    let Some(view) = crate::schedule::scatter_view(g, n) else {
        return false;
    };
    if same_view_reads(
        g,
        s,
        src,
        view,
        base,
        root,
        &node.args[2..],
        &mut HashMap::new(),
    ) {
        return true;
    }
    let Some(vm) = view_meta(g, view, g.meta(base), &node.args[2..], 0) else {
        return false;
    };
    let count = vm.numel();
    if count > MAX_TRACED || g.meta(base).numel() > MAX_TRACED {
        return false;
    }
    let target = |j: usize| ravel(j, &vm.sizes, &vm.strides, vm.offset);
    let written: HashSet<usize> = (0..count).map(target).collect();
    let mut t = Tracer {
        g,
        s,
        root,
        views: HashMap::new(),
        scatters: HashMap::new(),
    };
    let mut seen = vec![];
    (0..count).all(|j| {
        seen.clear();
        let mine = target(j);
        t.reads(src, j, &mut seen).is_some()
            && seen.iter().all(|&e| e == mine || !written.contains(&e))
    })
}

#[cfg(test)]
mod tests {
    use super::ravel;

    #[test]
    fn ravel_follows_strides() {
        // Column 1 of a 3x4 row-major matrix.
        let at: Vec<usize> = (0..3).map(|i| ravel(i, &[3], &[4], 1)).collect();
        assert_eq!(at, vec![1, 5, 9]);
        // A transposed 2x3 view of a 3x2 matrix.
        let at: Vec<usize> = (0..6).map(|i| ravel(i, &[2, 3], &[1, 2], 0)).collect();
        assert_eq!(at, vec![0, 2, 4, 1, 3, 5]);
    }
}
