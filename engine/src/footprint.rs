//! Which elements of a buffer a scatter kernel reads, invocation by
//! invocation. Re-inplacing a scatter (writing only its region into the
//! base's buffer) is race-free when every invocation reads that buffer
//! only at the element it writes itself, or at elements no invocation
//! writes. This module checks exactly that by following the index
//! maps of the inlined ops (`index`, the maps the code generator emits)
//! for each invocation, so a read through `t_copy` of the written
//! slice is caught and a read of another row is allowed.

use crate::fusion::Schedule;
use crate::index::{self, Affine, Read};
use kiln_functionalize::graph::{Def, Graph, NodeId, ValueId};
use kiln_functionalize::meta::contiguous_strides;
use kiln_functionalize::ops::{Lowering, Rule};
use kiln_functionalize::schema::Arg;
use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::rc::Rc;

/// Kernels above this many invocations are not traced (compile time):
/// their scatters stay out of place when they read their own base.
const MAX_TRACED: usize = 1 << 22;

struct Tracer<'a> {
    g: &'a Graph,
    s: &'a Schedule,
    root: ValueId,
    /// Each inlined node result's reads (`index::reads`), computed once.
    maps: HashMap<(NodeId, usize), Rc<[Read]>>,
}

impl Tracer<'_> {
    /// Pushes the elements of `root`'s buffer read to compute element
    /// `idx` of `v`; `None` when an op is not computed inline.
    fn reads(&mut self, v: ValueId, idx: usize, out: &mut Vec<usize>) -> Option<()> {
        if self.s.is_materialized.contains(&v) {
            // Values sharing the buffer (in-place versions, reshapes) are
            // all stored contiguously from its start.
            if self.s.root(v) == self.root {
                out.push(idx);
            }
            return Some(());
        }
        self.node_reads(v, idx, out)
    }

    /// `reads` of `v` computed inline at `idx`, stored or not.
    fn node_reads(&mut self, v: ValueId, idx: usize, out: &mut Vec<usize>) -> Option<()> {
        let g = self.g;
        let Def::Node(n, k) = g.values[v].def else {
            return Some(());
        };
        if let Entry::Vacant(e) = self.maps.entry((n, k)) {
            e.insert(index::reads(g, n, k).ok()?.into());
        }
        let maps = self.maps[&(n, k)].clone();
        // Region reads (a scatter's source, a join's inputs): the source
        // whose region holds the element; else a scatter's base (the kernel
        // loads the others too, but discards them).
        if maps.iter().any(|r| matches!(r, Read::Source(..))) {
            let m = index::unravel(idx, &g.meta(v).sizes);
            for r in maps.iter() {
                if let Read::Source(src, region) = r {
                    if let Some(sm) = region.eval(&m) {
                        let st = contiguous_strides(&g.meta(*src).sizes);
                        let si = sm.iter().zip(&st).map(|(a, b)| a * b).sum();
                        return self.reads(*src, si, out);
                    }
                }
            }
            return match maps.first() {
                Some(Read::At(base, _)) => self.reads(*base, idx, out),
                _ => Some(()),
            };
        }
        for r in maps.iter() {
            match r {
                Read::At(t, a) => self.reads(*t, a.eval(idx), out)?,
                Read::First(t) => self.reads(*t, 0, out)?,
                // `index_put`'s indices and values, read anywhere: fine
                // where nothing on the way reads the buffer (not even a
                // branch the kernel discards: an index read there is
                // still checked against its bounds). Other ops read so
                // (`index_select`'s table) stop the trace.
                Read::Other(t) if matches!(g.nodes[n].op.def().lowering, Lowering::IndexPut) => {
                    let reads = crate::fusion::reads_value(g, self.s, *t);
                    if reads.iter().any(|&x| self.s.root(x) == self.root) {
                        return None;
                    }
                }
                Read::Other(_) => return None,
                Read::Source(..) => return None,
            }
        }
        Some(())
    }
}

/// Can scatter node `n` write its source into the buffer of `base`
/// (whose owner is `root`) in place, with every invocation reading that
/// buffer only at its own target element or outside the written region?
/// `x[view] = f(x[view], ...)`, decided without tracing (any size): every
/// read of `root`'s buffer in the source `v` is the scatter's own view of
/// `base` (`fusion::is_scatter_view_copy`), reached through elementwise
/// ops of one shape, so element `j` reads only the element it writes.
fn same_view_reads(
    g: &Graph,
    s: &Schedule,
    v: ValueId,
    sc: NodeId,
    root: ValueId,
    memo: &mut HashMap<ValueId, bool>,
) -> bool {
    if let Some(&b) = memo.get(&v) {
        return b;
    }
    let reads_root = |x: ValueId| {
        crate::fusion::reads_value(g, s, x)
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
            Rule::ViewCopy(_) => crate::fusion::is_scatter_view_copy(g, sc, v),
            Rule::Pointwise(_) => {
                let out = &g.meta(v).sizes;
                node.args.iter().all(|a| match a {
                    Arg::Tensor(x) if g.meta(*x).sizes == *out => {
                        same_view_reads(g, s, *x, sc, root, memo)
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
    let reads_root = crate::fusion::reads_value(g, s, src)
        .iter()
        .any(|&r| s.root(r) == root);
    if !reads_root {
        return true;
    }
    let Some(view) = crate::fusion::scatter_view(g, n) else {
        return false;
    };
    if same_view_reads(g, s, src, n, root, &mut HashMap::new()) {
        return true;
    }
    let Ok(vm) = Affine::view(g, view, g.meta(base), &node.args[2..], 0) else {
        return false;
    };
    let count = vm.sizes.iter().product::<usize>();
    if count > MAX_TRACED || g.meta(base).numel() > MAX_TRACED {
        return false;
    }
    let target = |j: usize| vm.eval(j);
    let written: HashSet<usize> = (0..count).map(target).collect();
    let mut t = Tracer {
        g,
        s,
        root,
        maps: HashMap::new(),
    };
    let mut seen = vec![];
    (0..count).all(|j| {
        seen.clear();
        let mine = target(j);
        t.reads(src, j, &mut seen).is_some()
            && seen.iter().all(|&e| e == mine || !written.contains(&e))
    })
}

/// Does the invocation computing element `i` of elementwise value `v` read
/// `root`'s buffer at `i` alone, traced element by element (region updates
/// read at the positions they keep; the loads a scatter discards do not
/// count)? Then `v` may be written over that buffer. For chains the index
/// maps alone cannot decide (`index::reads_only_at_own_index`): a region
/// rewritten through `split` and updated through `slice`.
pub fn reads_own_traced(g: &Graph, s: &Schedule, v: ValueId, root: ValueId) -> bool {
    let count = g.meta(v).numel();
    if count > MAX_TRACED {
        return false;
    }
    let mut t = Tracer {
        g,
        s,
        root,
        maps: HashMap::new(),
    };
    let mut seen = vec![];
    (0..count).all(|i| {
        seen.clear();
        t.node_reads(v, i, &mut seen).is_some() && seen.iter().all(|&e| e == i)
    })
}
