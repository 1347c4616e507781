//! Row kernels: consecutive kernels over narrow rows computed by one
//! kernel, an invocation per block of rows holding each value's block in
//! registers (fully fused MLPs do this for narrow layers). A layer or RMS
//! norm, the products with weights after it, their bias and activation, a
//! softmax: one kernel, the intermediates never in memory. Decided on the
//! kernel groups (`chain_rows`), before buffers are placed.

use crate::fusion::{CHAIN_GPU_MAX_ELEMENTS, CHAIN_MAX_PRODUCT, CHAIN_MAX_WIDTH};
use crate::schedule::{self, Fused, Schedule};
use crate::CompileOptions;
use kiln_functionalize::graph::{Graph, NodeId, ValueId};
use kiln_functionalize::ops::Lowering;
use kiln_functionalize::schema::Arg;
use std::collections::{HashMap, HashSet};

/// How a row kernel computes one of its values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Link {
    /// An elementwise value.
    Map,
    /// A matrix product whose right operand (a weight, a cache) reads no
    /// value of the kernel, its result or its elementwise tail stored.
    Product(NodeId),
    /// `softmax` or `log_softmax` along the last dim (or its tail).
    Softmax(NodeId),
    /// `layer_norm` (or its tail).
    LayerNorm(NodeId),
    /// A reduction over trailing dims kept as size 1 (or its tail, or a
    /// tail broadcasting it over the rows reduced, `Fused::Rows`).
    Reduce(NodeId),
}

impl Link {
    /// The node computing the kernel's result, before any tail.
    pub(crate) fn node(self) -> Option<NodeId> {
        match self {
            Link::Map => None,
            Link::Product(n) | Link::Softmax(n) | Link::LayerNorm(n) | Link::Reduce(n) => Some(n),
        }
    }
}

/// How kernel value `v` joins a row kernel, and the most row blocks it
/// splits into (the kernel's count divides it): a product's rows, a row
/// kernel's lines, any element of an elementwise value.
pub(crate) fn link(g: &Graph, s: &Schedule, v: ValueId) -> Option<(Link, usize)> {
    // (A value stored over a dying input, `alias_of`, is decided after.)
    // One stored through permuting copies (a head merge) is held in its
    // product's order and stored where the copies have it: 32-bit
    // elements, one a word.
    if s.inplace.contains_key(&v)
        || s.permuted.contains_key(&v) && crate::wgsl::per_word(g.meta(v).dtype) != 1
    {
        return None;
    }
    let numel = g.meta(v).numel();
    if numel == 0 {
        return None;
    }
    if crate::fusion::is_map(g, s, v) {
        return Some((Link::Map, numel));
    }
    let (n, over_rows) = match s.fused.get(&v) {
        Some(&Fused::Epilogue { product }) => (product, false),
        Some(&Fused::Rows { reduction }) => (reduction, true),
        Some(_) => return None,
        None => (g.node_of(v)?, false),
    };
    let node = &g.nodes[n];
    let [r] = node.results[..] else {
        return None;
    };
    let rm = g.meta(r);
    if (rm.numel() != numel && !over_rows) || !rm.dtype.is_float() {
        return None;
    }
    let last = *rm.sizes.last()?;
    match node.op.def().lowering {
        Lowering::MatMul(form) => {
            let tensor = |i: usize| match node.args.get(i) {
                Some(Arg::Tensor(t)) => Some(*t),
                _ => None,
            };
            let (left, right) = (tensor(form.left)?, tensor(form.right)?);
            // (A norm operand is computed by the product's own kernel.)
            if s.norm_operands.contains(&left) {
                return None;
            }
            let (lm, k) = (g.meta(left), *g.meta(left).sizes.last()?);
            // Each output row reads its own row of the left operand (not
            // broadcast over batches): the same block.
            let own_rows = lm.dim() >= 2 && lm.numel() * last == numel * k;
            // (A twin, `Schedule::twins`, is computed with its product.)
            let twin = s.twins.values().any(|&t| t == n);
            (own_rows && g.meta(right).dim() >= 2 && !twin)
                .then_some((Link::Product(n), numel / last.max(1)))
        }
        Lowering::Softmax { .. } => {
            let im = g.meta(**node.args[0].tensors().first()?);
            let Some(&Arg::Int(d)) = node.args.get(1) else {
                return None;
            };
            let d = kiln_functionalize::meta::wrap_dim(d, im.dim()).ok()?;
            let inner: usize = im.sizes[d + 1..].iter().product();
            let len = im.sizes[d];
            (inner == 1 && len > 0).then_some((Link::Softmax(n), numel / len))
        }
        Lowering::LayerNorm => {
            let width = crate::fusion::norm_width(g, n)?.max(1);
            numel
                .is_multiple_of(width)
                .then_some((Link::LayerNorm(n), numel / width))
        }
        Lowering::Reduce(red_op) => {
            // Kept dims first, then the reduced ones (kept as size 1 or
            // not): each output is a block of the input's elements.
            let xm = g.meta(**node.args[0].tensors().first()?);
            let red = crate::fusion::reduced_dims(red_op, &node.args, xm.dim()).ok()?;
            let first = red.iter().position(|&r| r)?;
            red[first..]
                .iter()
                .all(|&r| r)
                .then_some((Link::Reduce(n), rm.numel()))
        }
        _ => None,
    }
}

/// The tensor arguments of row kernel node `n` read whole by every
/// invocation (a product's weight and addend, a norm's weight and bias),
/// and the one read by rows (the left operand, the normalized input).
fn operands(g: &Graph, s: &Schedule, link: Link) -> (Option<ValueId>, Vec<ValueId>) {
    let Some(n) = link.node() else {
        return (None, vec![]);
    };
    let node = &g.nodes[n];
    let tensor = |i: usize| match node.args.get(i) {
        Some(Arg::Tensor(t)) => Some(*t),
        _ => None,
    };
    match node.op.def().lowering {
        Lowering::MatMul(form) => {
            // A twin (the same left operand) reads its own weight too.
            let whole = |m: NodeId| {
                let node = &g.nodes[m];
                [Some(form.right), form.addend]
                    .into_iter()
                    .flatten()
                    .filter_map(|i| match node.args.get(i) {
                        Some(Arg::Tensor(t)) => Some(*t),
                        _ => None,
                    })
                    .collect::<Vec<_>>()
            };
            let mut all = whole(n);
            all.extend(s.twins.get(&n).map(|&t| whole(t)).unwrap_or_default());
            (tensor(form.left), all)
        }
        Lowering::LayerNorm => (tensor(0), [2, 3].into_iter().filter_map(tensor).collect()),
        _ => (tensor(0), vec![]),
    }
}

/// The row blocks one kernel can compute `vals` in (kernel values in
/// program order, the first no elementwise one): each value a `link`, the
/// block count dividing every value's most, no block wider than
/// `CHAIN_MAX_WIDTH`, every value reading the others only within its
/// block, packed values in whole words a block, within the device's
/// bindings. `None` where they cannot.
fn rows_of(
    g: &Graph,
    s: &Schedule,
    options: &CompileOptions,
    window: Option<usize>,
    outputs: &HashSet<ValueId>,
    vals: &[ValueId],
) -> Option<usize> {
    if crate::fusion::is_map(g, s, vals[0]) {
        return None;
    }
    let links: Vec<(Link, usize)> = vals.iter().map(|&v| link(g, s, v)).collect::<Option<_>>()?;
    let rows = links.iter().fold(0, |acc, &(_, most)| gcd(acc, most));
    if rows == 0 {
        return None;
    }
    let narrow = vals.iter().all(|&v| {
        let m = g.meta(v);
        let width = m.numel() / rows;
        width <= CHAIN_MAX_WIDTH
            && width.is_multiple_of(crate::wgsl::per_word(m.dtype))
            && (!options.workgroup_rows || m.numel() <= CHAIN_GPU_MAX_ELEMENTS)
    });
    if !narrow || !reads_ok(g, s, vals, &links, rows, None) {
        return None;
    }
    // Bindings: what the values read, and the values something outside
    // reads (the rest stay in registers).
    let mut bound: HashSet<ValueId> = HashSet::new();
    for &v in vals {
        if let Some(n) = g.node_of(v) {
            bound.extend(
                schedule::reads(g, s, n)
                    .into_iter()
                    .filter(|r| !vals.contains(r))
                    .map(|r| s.root(r)),
            );
        }
        let inside = s.uses.get(&v).into_iter().flatten().all(|&u| {
            g.nodes[u].results.iter().all(|r| {
                vals.contains(r) || !s.is_materialized.contains(r) && reads_only_in(g, s, *r, vals)
            })
        });
        if outputs.contains(&v) || !inside {
            bound.insert(s.root(v));
        }
    }
    // A fault (i64 range) carried with a value is not carried through
    // registers: such kernels stay apart.
    let faults = crate::fusion::may_fault_in(g, s, vals);
    (!faults && crate::fusion::bindings_of(g, &bound, window) <= options.max_bindings)
        .then_some(rows)
}

/// Does each of `vals` (a row kernel's values, their `links`) read the
/// others, and `extra`'s buffer, only within its row block of `rows`,
/// and what every invocation reads whole (weights) none of them? Products
/// within `CHAIN_MAX_PRODUCT`.
fn reads_ok(
    g: &Graph,
    s: &Schedule,
    vals: &[ValueId],
    links: &[(Link, usize)],
    rows: usize,
    extra: Option<ValueId>,
) -> bool {
    // Members, their kernels' results and twins' (read in registers).
    let mut members: Vec<ValueId> = vals.to_vec();
    members.extend(
        links
            .iter()
            .filter_map(|(l, _)| l.node())
            .flat_map(|n| std::iter::once(n).chain(s.twins.get(&n).copied()))
            .map(|n| g.nodes[n].results[0])
            .filter(|r| !s.is_materialized.contains(r)),
    );
    // Reshapes of members sharing their buffers (`alias_of`): the same
    // elements in the same order, read from the same registers.
    let aliases: Vec<ValueId> = s
        .alias_of
        .iter()
        .filter(|(_, b)| vals.contains(b))
        .map(|(&a, _)| a)
        .collect();
    members.extend(aliases);
    members.extend(extra);
    let roots: HashSet<ValueId> = vals.iter().chain(&extra).map(|&v| s.root(v)).collect();
    // A value read whole (a weight) may read no member.
    let reads_none = |x: ValueId| {
        crate::fusion::reads_value(g, s, x)
            .iter()
            .all(|r| !roots.contains(&s.root(*r)))
            && !members.contains(&x)
    };
    vals.iter().zip(links).all(|(&v, &(link, _))| {
        let width = g.meta(v).numel() / rows;
        let (by_rows, whole) = operands(g, s, link);
        let k = by_rows.map_or(0, |a| *g.meta(a).sizes.last().unwrap_or(&0));
        let product_fits = !matches!(link, Link::Product(_)) || width * k <= CHAIN_MAX_PRODUCT;
        // The value's own reads: an elementwise value's, a tail's (its
        // kernel's result read at the element). A tail through permuting
        // copies reads its result at the element in the result's order,
        // and no member reads it (its registers hold that order).
        let own = link.node().map(|n| g.nodes[n].results[0]) != Some(v);
        let permuted = s.permuted.contains_key(&v);
        let unread = || {
            s.uses
                .get(&v)
                .into_iter()
                .flatten()
                .all(|&u| g.nodes[u].results.iter().all(|r| !members.contains(r)))
        };
        product_fits
            && (!permuted || unread())
            && whole.iter().all(|&x| reads_none(x))
            && by_rows.is_none_or(|a| crate::index::reads_rows_only(g, s, a, &members, rows))
            && (!own || permuted || crate::index::node_reads_rows_only(g, s, v, &members, rows))
    })
}

/// Does row kernel `vals` (in `rows` blocks) read the buffer of `root`
/// only within each invocation's block (and never whole)? Then a value
/// of it with as many elements may be stored over it: an invocation
/// stores its blocks after computing them all (`Gen::row_chain`).
pub(crate) fn reads_by_rows(
    g: &Graph,
    s: &Schedule,
    vals: &[ValueId],
    rows: usize,
    root: ValueId,
) -> bool {
    let Some(links) = vals
        .iter()
        .map(|&v| link(g, s, v))
        .collect::<Option<Vec<_>>>()
    else {
        return false;
    };
    reads_ok(g, s, vals, &links, rows, Some(root))
}

/// Is inlined value `v` read only by kernels computing `vals`?
fn reads_only_in(g: &Graph, s: &Schedule, v: ValueId, vals: &[ValueId]) -> bool {
    let mut stack = vec![v];
    let mut seen = HashSet::new();
    while let Some(x) = stack.pop() {
        if !seen.insert(x) {
            continue;
        }
        for &u in s.uses.get(&x).into_iter().flatten() {
            for &r in &g.nodes[u].results {
                if vals.contains(&r) {
                    continue;
                }
                if s.is_materialized.contains(&r) {
                    return false;
                }
                stack.push(r);
            }
        }
    }
    true
}

/// Does a value of `b` read one of `a` (directly or through values
/// computed inline)? A row kernel joins only kernels that depend on it.
fn reads_any(g: &Graph, s: &Schedule, b: &[ValueId], a: &[ValueId]) -> bool {
    b.iter().filter_map(|&v| g.node_of(v)).any(|n| {
        schedule::reads(g, s, n)
            .iter()
            .any(|r| a.iter().any(|&x| s.root(x) == s.root(*r)))
    })
}

/// Group `b` of sibling kernels (no elementwise value: reductions
/// sharing a launch) split into those reading group `a` and the others,
/// where neither part reads what the other writes.
fn split_readers(
    g: &Graph,
    s: &Schedule,
    a: &[ValueId],
    b: &[ValueId],
) -> Option<(Vec<ValueId>, Vec<ValueId>)> {
    if b.len() < 2 || b.iter().any(|&v| crate::fusion::is_map(g, s, v)) {
        return None;
    }
    let (readers, rest): (Vec<ValueId>, Vec<ValueId>) =
        b.iter().partition(|&&v| reads_any(g, s, &[v], a));
    let apart =
        |x: &[ValueId], y: &[ValueId]| y.iter().all(|&v| crate::fusion::independent(g, s, x, v));
    (!readers.is_empty() && !rest.is_empty() && apart(&readers, &rest) && apart(&rest, &readers))
        .then_some((readers, rest))
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Merges consecutive kernel groups into row kernels (`rows_of`), each
/// group joining the kernel before it where together they can be one.
/// Returns the row kernels: their first value -> their row blocks.
/// Kernels an earlier plan found over the device's bindings
/// (`Grouping::apart`) stay apart.
pub(crate) fn chain_rows(
    g: &Graph,
    s: &Schedule,
    options: &CompileOptions,
    apart: &dyn Fn(ValueId) -> bool,
    window: &dyn Fn(&[ValueId]) -> Option<usize>,
    outputs: &HashSet<ValueId>,
    groups: &mut Vec<Vec<ValueId>>,
) -> HashMap<ValueId, usize> {
    let mut chains = HashMap::new();
    if !options.chain_rows {
        return chains;
    }
    let joined = |a: &[ValueId], b: &[ValueId]| -> Option<(Vec<ValueId>, usize)> {
        let mut both = a.to_vec();
        both.extend(b.iter().copied());
        if both.iter().any(|&v| apart(v)) || !reads_any(g, s, b, a) {
            return None;
        }
        rows_of(g, s, options, window(&both), outputs, &both).map(|r| (both, r))
    };
    // Group `b` joining `a` whole, or the siblings of `b` reading `a`
    // (reductions sharing a launch) joining it and the others staying a
    // group (`split_readers`): the joined group, its blocks, what is left.
    let join = |a: &[ValueId], b: &[ValueId]| {
        joined(a, b).map(|(both, r)| (both, r, vec![])).or_else(|| {
            let (readers, rest) = split_readers(g, s, a, b)?;
            joined(a, &readers).map(|(both, r)| (both, r, rest))
        })
    };
    let mut i = 0;
    while i + 1 < groups.len() {
        if let Some((both, r, rest)) = join(&groups[i], &groups[i + 1]) {
            chains.insert(both[0], r);
            groups[i] = both;
            if rest.is_empty() {
                groups.remove(i + 1);
            } else {
                groups[i + 1] = rest;
            }
            continue;
        }
        // A kernel in between that the row kernel does not depend on (an
        // operand staged contiguous, `CompileOptions::contiguous_operands`)
        // runs first.
        let past = i + 2 < groups.len()
            && groups[i + 1]
                .iter()
                .all(|&v| crate::fusion::independent(g, s, &groups[i], v));
        match past.then(|| join(&groups[i], &groups[i + 2])).flatten() {
            Some((both, r, rest)) => {
                chains.insert(both[0], r);
                groups.swap(i, i + 1);
                groups[i + 1] = both;
                if rest.is_empty() {
                    groups.remove(i + 2);
                } else {
                    groups[i + 2] = rest;
                }
                i += 1;
            }
            None => i += 1,
        }
    }
    chains
}
