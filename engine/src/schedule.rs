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

use crate::error::CompileError;
use crate::footprint;
use crate::fusion::SEQUENCE_FLOPS;
pub use crate::fusion::{
    class, inlined_region, is_free, is_scatter_view_copy, reads, reads_value, reads_values,
    scatter_view, Class, Fused, Schedule,
};
use crate::index::Affine;
use kiln_functionalize::graph::{Def, Graph, NodeId, ValueId};
use kiln_functionalize::ops::{self, Elem, Lowering, Rule};
use kiln_functionalize::schema::Arg;
use kiln_functionalize::DType;
use std::collections::{HashMap, HashSet};

/// `attention`: fuse `softmax(f(Q K)) V` into attention kernels
/// (`CompileOptions::fuse_attention`).
pub fn schedule(
    g: &Graph,
    outputs: &[ValueId],
    pinned: HashSet<ValueId>,
    force: &HashSet<ValueId>,
    options: &crate::CompileOptions,
    narrow_norms: &HashSet<ValueId>,
) -> Result<Schedule, CompileError> {
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
        alias_of: HashMap::new(),
        host_views: HashMap::new(),
        uses,
        pinned,
        pos: g.order.iter().enumerate().map(|(i, &n)| (n, i)).collect(),
        fused: HashMap::new(),
        permuted: HashMap::new(),
        twins: HashMap::new(),
        chains: HashMap::new(),
        norm_operands: HashSet::new(),
    };
    for &v in &g.inputs {
        s.is_materialized.insert(v);
    }
    // Values computed inline from no buffer at all (index arithmetic from
    // `arange`, fills): every reader recomputes them, no kernel stores
    // them (upsampling's source indices and weights).
    let mut pure: HashSet<ValueId> = HashSet::new();
    for &n in &g.order {
        let c = class(g, n)?;
        if let Some(input) = reshape_of(g, &s, n) {
            let r = g.nodes[n].results[0];
            s.alias_of.insert(r, input);
            s.is_materialized.insert(r);
            continue;
        }
        for &r in &g.nodes[n].results {
            let uses = s.uses.get(&r).cloned().unwrap_or_default();
            let host_view = if out_set.contains(&r) && !force.contains(&r) {
                view_chain_base(g, &s, n, r)
            } else {
                None
            };
            if let Some(input) = host_view {
                s.host_views.insert(r, input);
                continue;
            }
            // A link of a chain of region updates of a fresh copy is
            // computed inside the chain's last kernel, element by element,
            // instead of copied and then updated region by region.
            let link = c == Class::Map
                && !out_set.contains(&r)
                && !force.contains(&r)
                && whole_chain_root(g, &s, &out_set, r)
                && (chain_link(g, &s, r) || fresh_chain_link(g, &s, r));
            let readers = uses.iter().filter(|&&u| reads_values(g, u, r)).count();
            let computed = c == Class::Map
                && g.nodes[n]
                    .args
                    .iter()
                    .flat_map(|a| a.tensors())
                    .all(|t| pure.contains(t) || !reads_values(g, n, *t));
            let mut mat = c == Class::Kernel
                || out_set.contains(&r)
                || (readers > 1 && !is_free(g, n) && !link && !computed)
                || force.contains(&r);
            // A scatter whose base dies here writes only its region into the
            // base's buffer: worth a buffer of its own when it has one
            // anyway, or when it feeds another scatter (a chain of writes).
            if let Some(base) = inplace_base(g, &s, &out_set, n) {
                let feeds_scatter = matches!(uses[..], [u] if scatter_view(g, u).is_some() && g.nodes[u].args[0] == Arg::Tensor(r));
                if !link && (mat || feeds_scatter) {
                    mat = true;
                    s.inplace.insert(r, base);
                    if out_set.contains(&r) {
                        src_as_host_view(g, &mut s, force, &out_set, n);
                    }
                }
            }
            if mat {
                s.materialized.push(r);
                s.is_materialized.insert(r);
                src_in_permuted_store(g, &mut s, force, &out_set, n);
            } else if computed {
                pure.insert(r);
            }
        }
    }
    recompute_cheap_maps(g, &mut s, &out_set, force);
    fuse_rows(g, &mut s, &out_set, force, options.workgroup_rows);
    fuse_products(g, &mut s, &out_set, force, options.fuse_attention);
    // CPU adapters' row kernel computes projections with subgroups alone
    // (`codegen::attention`); GPUs' tiled kernel always can.
    if options.attention_projections
        && (!options.attention_rows
            || options
                .subgroup
                .is_some_and(|sg| (options.workgroup as usize).is_multiple_of(sg)))
    {
        fuse_attention_projections(g, &mut s, &out_set, force, options);
    }
    fuse_twin_products(g, &mut s, &out_set, force);
    fuse_norm_operands(g, &mut s, &out_set, force, narrow_norms);
    Ok(s)
}

/// Evaluations of an element, on average, above which a value several
/// kernels read is stored rather than recomputed by each.
const MAX_REEVALUATIONS: usize = 4;

/// Elementwise values stored only because several readers need them,
/// evaluated at most `MAX_REEVALUATIONS` times per element of the value or
/// of the stored values its readers compute when every reader recomputes
/// it instead: inlined (the passes of a bilinear or trilinear resize, each
/// reading the previous one at two rows, become one kernel with no
/// intermediate in memory: 4 evaluations of the first pass per output of a
/// trilinear one, its 8 loads, as eager's kernel). Values read through windows
/// (a convolution's unfold) or by products and reductions stay stored.
/// Later values first, so each one's readers are settled.
fn recompute_cheap_maps(
    g: &Graph,
    s: &mut Schedule,
    out: &HashSet<ValueId>,
    force: &HashSet<ValueId>,
) {
    // Buffers other values write into or view; a value's reshapes (buffer
    // aliases of it) are inlined with it (`evaluations`).
    let written: HashSet<ValueId> = s
        .inplace
        .iter()
        .chain(&s.host_views)
        .flat_map(|(&a, &b)| [a, b])
        .collect();
    let shared: HashSet<ValueId> = written
        .iter()
        .copied()
        .chain(s.alias_of.keys().copied())
        .collect();
    for v in s.materialized.clone().into_iter().rev() {
        let Some(n) = g.node_of(v) else {
            continue;
        };
        let node = &g.nodes[n];
        if node.results.len() != 1
            || !matches!(node.op.def().lowering, Lowering::Map(e) if reads_once(e))
            || out.contains(&v)
            || force.contains(&v)
            || shared.contains(&v)
        {
            continue;
        }
        let elements = g.meta(v).numel();
        let mut last = 0;
        let mut stored = HashMap::new();
        // Paths through inlined readers can multiply: the walk is bounded.
        let mut budget = 1024;
        let mut reshapes = vec![];
        let evaluated = evaluations(g, s, v, &mut budget, &mut last, &mut stored, &mut reshapes);
        if reshapes
            .iter()
            .any(|r| out.contains(r) || force.contains(r) || written.contains(r))
        {
            continue;
        }
        // Loads readers make of `v` stored: a reader looping over it
        // (`index_add`'s index) loads it once an iteration either way.
        let results: usize = stored.iter().map(|(&r, &l)| g.meta(r).numel() * l).sum();
        let cheap = evaluated.is_some_and(|e| e <= MAX_REEVALUATIONS * elements.max(results));
        // The buffers `v` reads now live until its last reader: no more
        // memory than `v`'s own buffer held over that span. A buffer that
        // last reader's kernel reads anyway lives no longer.
        let read_last: HashSet<ValueId> = stored
            .keys()
            .filter_map(|&r| g.node_of(r))
            .filter(|m| s.pos[m] == last)
            .flat_map(|m| reads(g, s, m))
            .collect();
        let mut extended: Vec<ValueId> = node
            .inputs()
            .into_iter()
            .flat_map(|t| reads_value(g, s, t))
            .filter(|b| {
                !out.contains(b)
                    && !read_last.contains(b)
                    && s.uses
                        .get(b)
                        .is_none_or(|us| us.iter().all(|u| *u == n || s.pos[u] < last))
            })
            .collect();
        extended.sort();
        extended.dedup();
        let bytes = |x: ValueId| g.meta(x).numel() * g.meta(x).dtype.size_bytes();
        let fits = extended.iter().map(|&b| bytes(b)).sum::<usize>() <= bytes(v);
        if cheap && fits {
            s.materialized.retain(|&w| w != v);
            s.is_materialized.remove(&v);
            // Its reshapes become views of the inlined value again.
            for r in reshapes {
                s.alias_of.remove(&r);
                s.is_materialized.remove(&r);
            }
        }
    }
}

/// Does each element of a map read each of its inputs once (rather than
/// looping over a source: `index_add`, `scatter`)?
fn reads_once(e: Elem) -> bool {
    !matches!(e, Elem::IndexAdd | Elem::ScatterInto { .. })
}

/// How many times kernels would evaluate elements of `v` were it inlined
/// into every reader (`last`: the latest of the kernels reading it;
/// `stored`: the stored values they compute, each with the times an
/// element of it loads the inlined chain; `reshapes`: its reshapes,
/// buffer aliases now, inlined with it): `None` when a reader is no
/// elementwise map or needs `v`'s buffer, or past `budget` values visited.
fn evaluations(
    g: &Graph,
    s: &Schedule,
    v: ValueId,
    budget: &mut usize,
    last: &mut usize,
    stored: &mut HashMap<ValueId, usize>,
    reshapes: &mut Vec<ValueId>,
) -> Option<usize> {
    *budget = budget.checked_sub(1)?;
    let mut uses = s.uses.get(&v).cloned().unwrap_or_default();
    uses.dedup();
    let mut total = 0usize;
    for u in uses {
        let node = &g.nodes[u];
        match node.op.def().lowering {
            Lowering::Map(e) | Lowering::Free(e) if reads_once(e) => {}
            // `index_add` reads its index and source once per element of
            // the index for each element it computes (`Gen::index_add_at`).
            Lowering::Map(Elem::IndexAdd) => {}
            // An element of a region update reads its base or its source once.
            Lowering::RegionScatter { .. } => {}
            // A product narrow enough for a row kernel loads its operands
            // where they are (`inline_product_operands`), as often from a
            // stored copy as through an index map (`repeat`, `flip`, a
            // transpose): such an operand costs no more inline than
            // staged, once per element.
            Lowering::MatMul(_) if crate::fusion::narrow_product(g, u) && index_only(g, s, v) => {
                let [r] = node.results[..] else {
                    return None;
                };
                if !s.is_materialized.contains(&r) || s.fused.contains_key(&r) {
                    return None;
                }
                *last = (*last).max(s.pos[&u]);
                stored.insert(r, 1);
                total = total.checked_add(g.meta(v).numel())?;
                continue;
            }
            _ => return None,
        }
        let looped = |i: usize| match node.op.def().lowering {
            Lowering::Map(Elem::IndexAdd) if i > 0 => node
                .args
                .get(2)
                .and_then(|a| a.tensors().first().map(|&&t| g.meta(t).numel())),
            _ => Some(1),
        };
        let (mut reads, mut loads) = (0usize, 1usize);
        for (i, a) in node.args.iter().enumerate() {
            let n = a.tensors().into_iter().filter(|&&t| t == v).count();
            if n > 0 {
                loads = loads.max(looped(i)?);
            }
            reads = reads.checked_add(n.checked_mul(looped(i)?)?)?;
        }
        for &r in &node.results {
            let e = if s.alias_of.get(&r) == Some(&v) && !s.inplace.contains_key(&r) {
                reshapes.push(r);
                evaluations(g, s, r, budget, last, stored, reshapes)?
            } else if s.inplace.contains_key(&r) || s.alias_of.contains_key(&r) {
                return None;
            } else if s.is_materialized.contains(&r) {
                *last = (*last).max(s.pos[&u]);
                let l = stored.entry(r).or_insert(loads);
                *l = (*l).max(loads);
                g.meta(r).numel()
            } else {
                evaluations(g, s, r, budget, last, stored, reshapes)?
            };
            // A region update evaluates its source only inside the region.
            let e = match (node.op.def().lowering, node.args.get(1)) {
                (Lowering::RegionScatter { .. }, Some(&Arg::Tensor(src))) if src == v => {
                    let whole = g.meta(r).numel().max(1);
                    e.checked_mul(g.meta(src).numel())?.div_ceil(whole)
                }
                _ => e,
            };
            total = total.checked_add(e.checked_mul(reads)?)?;
        }
    }
    Some(total)
}

/// Is `v` computed inline by index maps alone (views, `Remap`s: `flip`,
/// `repeat`, `constant_pad_nd`) from stored values: loads, no arithmetic?
fn index_only(g: &Graph, s: &Schedule, v: ValueId) -> bool {
    if s.is_materialized.contains(&v) {
        return true;
    }
    let Some(n) = g.node_of(v) else {
        return true;
    };
    matches!(
        g.nodes[n].op.def().lowering,
        Lowering::Free(_) | Lowering::Map(Elem::Remap(_))
    ) && g.nodes[n].inputs().into_iter().all(|t| index_only(g, s, t))
}

/// An output that in-place scatter `n` (itself read back) writes into its
/// buffer, read by nothing else: computed inside the scatter's kernel and
/// taken on the host as the scatter's view of that buffer (`x[0].add_(y)`
/// returning the row and `x`), where the race check still passes with it
/// inlined.
fn src_as_host_view(
    g: &Graph,
    s: &mut Schedule,
    force: &HashSet<ValueId>,
    out_set: &HashSet<ValueId>,
    n: NodeId,
) {
    let node = &g.nodes[n];
    let (Some(&Arg::Tensor(base)), Some(&Arg::Tensor(src))) = (node.args.first(), node.args.get(1))
    else {
        return;
    };
    let r = node.results[0];
    let map = g
        .node_of(src)
        .is_some_and(|m| class(g, m).is_ok_and(|c| c == Class::Map));
    if !map
        || !out_set.contains(&src)
        || force.contains(&src)
        || g.meta(src).dtype != g.meta(r).dtype
        || s.uses.get(&src).is_none_or(|u| u[..] != [n])
        || !matches!(node.op.def().lowering, Lowering::RegionScatter { .. })
    {
        return;
    }
    s.is_materialized.remove(&src);
    if !footprint::inplace_race_free(g, s, n, base, s.root(base)) {
        s.is_materialized.insert(src);
        return;
    }
    s.materialized.retain(|&v| v != src);
    s.host_views.insert(src, r);
}

/// An output a region update writes into a value stored only through a
/// permutation of it, read by nothing else (a transposed base updated
/// in a slice, both returned): computed inside the stored copy's kernel
/// and taken on the host as a strided view of its buffer
/// (`permuted_scatter_src_layout`).
fn src_in_permuted_store(
    g: &Graph,
    s: &mut Schedule,
    force: &HashSet<ValueId>,
    out_set: &HashSet<ValueId>,
    n: NodeId,
) {
    let node = &g.nodes[n];
    let (Rule::ViewCopy(_), Some(&Arg::Tensor(updated)), &[r]) =
        (&node.op.def().rule, node.args.first(), &node.results[..])
    else {
        return;
    };
    let Some(u) = g.node_of(updated) else {
        return;
    };
    let Some(&Arg::Tensor(src)) = g.nodes[u].args.get(1) else {
        return;
    };
    let map = g
        .node_of(src)
        .is_some_and(|m| class(g, m).is_ok_and(|c| c == Class::Map));
    if !map
        || s.is_materialized.contains(&updated)
        || s.inplace.contains_key(&r)
        || !matches!(g.nodes[u].op.def().lowering, Lowering::RegionScatter { .. })
        || !out_set.contains(&src)
        || force.contains(&src)
        || s.host_views.contains_key(&src)
        || s.uses.get(&src).is_none_or(|us| us[..] != [u])
        || permuted_scatter_src_layout(g, src, r).is_none()
    {
        return;
    }
    s.materialized.retain(|&v| v != src);
    s.is_materialized.remove(&src);
    s.host_views.insert(src, r);
}

/// The strided layout over `base` (contiguous) of `src`, the source of
/// the region update that view copy `base` permutes
/// (`src_in_permuted_store`).
pub fn permuted_scatter_src_layout(
    g: &Graph,
    src: ValueId,
    base: ValueId,
) -> Option<kiln_functionalize::Meta> {
    let updated = match g.nodes[g.node_of(base)?].args.first() {
        Some(&Arg::Tensor(x)) => x,
        _ => return None,
    };
    let u = g.node_of(updated)?;
    let node = &g.nodes[u];
    if node.args.get(1) != Some(&Arg::Tensor(src)) {
        return None;
    }
    let view = node.op.def().lowering.scatter_view()?;
    let l = source_layout(g, updated, base)?;
    let mut args: Vec<Arg<&kiln_functionalize::Meta>> = vec![Arg::Tensor(&l)];
    args.extend(node.args[2..].iter().map(|a| a.map(&mut |v| g.meta(*v))));
    let m = ops::infer(view, &args).ok()?.into_iter().next()?;
    (m.sizes == g.meta(src).sizes).then_some(m)
}

/// The strided layout of `x` over contiguous `y`, where view copy `y` of
/// `x` holds every element of it once, its dims permuted.
fn source_layout(g: &Graph, x: ValueId, y: ValueId) -> Option<kiln_functionalize::Meta> {
    let n = g.node_of(y)?;
    let node = &g.nodes[n];
    let Rule::ViewCopy(view) = node.op.def().rule else {
        return None;
    };
    if node.args.first() != Some(&Arg::Tensor(x)) || node.results.len() != 1 {
        return None;
    }
    let xm = g.meta(x);
    let contiguous = kiln_functionalize::Meta::contiguous(xm.dtype, xm.sizes.to_vec());
    let mut args: Vec<Arg<&kiln_functionalize::Meta>> = vec![Arg::Tensor(&contiguous)];
    args.extend(node.args[1..].iter().map(|a| a.map(&mut |v| g.meta(*v))));
    let l = ops::infer(view, &args).ok()?.into_iter().next()?;
    let perm = permutation_of(&contiguous, &l)?;
    let ys = kiln_functionalize::meta::contiguous_strides(&l.sizes);
    let mut strides = vec![0; perm.len()];
    for (d, &k) in perm.iter().enumerate() {
        strides[k] = ys[d];
    }
    let mut m = contiguous;
    m.strides = strides.into();
    Some(m)
}

/// View copies equal to an earlier one (the same view of the same value:
/// functionalization regenerates a view after each write through it)
/// read the earlier one instead, outputs included, so that a value has
/// one name wherever it is read (`src_in_permuted_store` finds a
/// returned view that a region update writes). A rewrite of `g` before
/// scheduling.
pub fn merge_equal_views(g: &mut Graph, outputs: &mut [ValueId]) {
    // By op and viewed value; the other arguments compared in a scan.
    let mut first: HashMap<(&'static str, ValueId), Vec<ValueId>> = HashMap::new();
    let mut same: HashMap<ValueId, ValueId> = HashMap::new();
    for &n in &g.order.clone() {
        if !same.is_empty() {
            let args = g.nodes[n]
                .args
                .iter()
                .map(|a| a.map(&mut |&x| same.get(&x).copied().unwrap_or(x)))
                .collect();
            g.nodes[n].args = args;
        }
        let node = &g.nodes[n];
        let (Rule::ViewCopy(_), Some(&Arg::Tensor(x)), &[r]) =
            (&node.op.def().rule, node.args.first(), &node.results[..])
        else {
            continue;
        };
        let seen = first.entry((node.op.name(), x)).or_default();
        let equal = seen.iter().copied().find(|&e| {
            g.node_of(e)
                .is_some_and(|m| g.nodes[m].args == node.args && g.meta(e) == g.meta(r))
        });
        match equal {
            Some(e) => {
                same.insert(r, e);
            }
            None => seen.push(r),
        }
    }
    for o in outputs.iter_mut() {
        if let Some(&e) = same.get(o) {
            *o = e;
        }
    }
    // The merged copies read nothing now: out of the order, so that no
    // reader count includes them.
    g.order
        .retain(|&n| !g.nodes[n].results.iter().any(|r| same.contains_key(r)));
}

/// New values of mutated parameters that are a permuting view copy of an
/// elementwise value other nodes read too (`p.t().index_put_(...)` then
/// `p` read again: `t(index_put(t(p), ..))` written back): the copy is
/// what is stored, in the parameter's layout, so it can take the
/// parameter's buffer, and the other readers read the value through the
/// inverse permutation of it. Else the value would be stored and the
/// parameter's new value taken from a view of it: a buffer beside the
/// one eager mutates. A rewrite of `g` before scheduling.
pub fn store_permuted_updates(g: &mut Graph, updates: &[ValueId], outputs: &[ValueId]) {
    let Some(permute) = ops::lookup("permute_copy") else {
        return;
    };
    for &o in updates {
        let Some(m) = g.node_of(o) else { continue };
        let (Rule::ViewCopy(_), Some(&Arg::Tensor(v))) =
            (&g.nodes[m].op.def().rule, g.nodes[m].args.first())
        else {
            continue;
        };
        let elementwise = g.node_of(v).is_some_and(|n| {
            matches!(class(g, n), Ok(Class::Map)) && g.nodes[n].results.len() == 1
        });
        if !elementwise || outputs.contains(&v) || g.nodes[m].results.len() != 1 {
            continue;
        }
        let Some(perm) = view_chain_layout(g, o, v).and_then(|l| permutation_of(g.meta(v), &l))
        else {
            continue;
        };
        let readers: Vec<NodeId> = g
            .order
            .iter()
            .copied()
            .filter(|&n| n != m && g.nodes[n].inputs().contains(&v))
            .collect();
        if readers.is_empty() {
            continue;
        }
        let mut inverse = vec![0i64; perm.len()];
        for (d, &k) in perm.iter().enumerate() {
            inverse[k] = d as i64;
        }
        let Ok(r) = g.call(permute, &[Arg::Tensor(o), Arg::IntList(inverse)]) else {
            continue;
        };
        // The copy moves up to just after `v` (it reads nothing else), the
        // inverse just after it: before every reader of `v`.
        let (back, node) = (r[0], g.order.pop().expect("the node just added"));
        g.order.retain(|&n| n != m);
        let at = g
            .node_of(v)
            .and_then(|vn| g.order.iter().position(|&n| n == vn))
            .map_or(0, |i| i + 1);
        g.order.insert(at, m);
        g.order.insert(at + 1, node);
        for n in readers {
            let args = g.nodes[n]
                .args
                .iter()
                .map(|a| a.map(&mut |&x| if x == v { back } else { x }))
                .collect();
            g.nodes[n].args = args;
        }
    }
}

/// The dims of contiguous `base` that strided layout `l` over it takes
/// in order, where `l` is a permutation of them (every element once);
/// `None` for any other layout, and for `base`'s own order.
fn permutation_of(
    base: &kiln_functionalize::Meta,
    l: &kiln_functionalize::Meta,
) -> Option<Vec<usize>> {
    let a = Affine {
        sizes: l.sizes.to_vec(),
        strides: l.strides.to_vec(),
        offset: l.offset,
    };
    let perm = crate::index::permuted_dims(&a, &base.sizes)?;
    perm.iter()
        .enumerate()
        .any(|(d, &k)| d != k && base.sizes[k] > 1)
        .then_some(perm)
}

/// The materialized buffer an output computed by view copy `n` is a view
/// of, through a chain of view copies none of which has a buffer (each
/// recomputed inline wherever it is read), where the chain is one strided
/// view of it: the output is then taken on the host from that buffer, and
/// readers on the device read through the chain.
fn view_chain_base(g: &Graph, s: &Schedule, n: NodeId, v: ValueId) -> Option<ValueId> {
    let mut m = n;
    let base = loop {
        let node = &g.nodes[m];
        let (Rule::ViewCopy(_), Some(&Arg::Tensor(input))) =
            (&node.op.def().rule, node.args.first())
        else {
            return None;
        };
        if s.is_materialized.contains(&input) {
            break input;
        }
        m = g.node_of(input)?;
    };
    view_chain_layout(g, v, base).map(|_| base)
}

/// The strided layout over `base` (contiguous) of `v`, computed from it by
/// a chain of view copies; `None` where a link is no strided view of its
/// input's layout (a reshape across strides copies in eager).
pub fn view_chain_layout(g: &Graph, v: ValueId, base: ValueId) -> Option<kiln_functionalize::Meta> {
    use kiln_functionalize::Meta;
    let mut chain = vec![];
    let mut x = v;
    while x != base {
        let n = g.node_of(x)?;
        let k = g.nodes[n].results.iter().position(|&r| r == x)?;
        let Rule::ViewCopy(_) = g.nodes[n].op.def().rule else {
            return None;
        };
        chain.push((n, k));
        x = match g.nodes[n].args.first() {
            Some(&Arg::Tensor(input)) => input,
            _ => return None,
        };
    }
    let bm = g.meta(base);
    let mut m = Meta::contiguous(bm.dtype, bm.sizes.to_vec());
    for &(n, k) in chain.iter().rev() {
        let node = &g.nodes[n];
        let Rule::ViewCopy(view) = node.op.def().rule else {
            return None;
        };
        let mut args: Vec<Arg<&Meta>> = vec![Arg::Tensor(&m)];
        args.extend(node.args[1..].iter().map(|a| a.map(&mut |x| g.meta(*x))));
        let r = ops::infer(view, &args).ok()?.into_iter().nth(k)?;
        // A fresh contiguous layout from a strided one is a copy's.
        let fresh = r.is_contiguous() && r.offset == 0;
        if fresh && !m.is_contiguous() && r.numel() > 1 {
            return None;
        }
        m = r;
    }
    Some(m)
}

/// Reductions whose result only elementwise ops read, broadcast back over
/// the reduced rows, up to a stored value of the rows' shape (RMS norm,
/// `x - amax(x)`, a mean subtracted): `Fused::Rows`, one kernel where
/// there were a reduction and an elementwise kernel. On GPUs only where
/// the reduction is a row-tiled sum or mean (`codegen::reduction`), whose
/// lanes each hold their row's elements; a row per invocation (CPU
/// adapters) loops over the row a second time.
fn fuse_rows(
    g: &Graph,
    s: &mut Schedule,
    out: &HashSet<ValueId>,
    force: &HashSet<ValueId>,
    workgroup_rows: bool,
) {
    for &n in &g.order {
        let Lowering::Reduce(red) = g.nodes[n].op.def().lowering else {
            continue;
        };
        let Some(r) = absorbable(g, s, out, force, n) else {
            continue;
        };
        let Some(&Arg::Tensor(input)) = g.nodes[n].args.first() else {
            continue;
        };
        let rows = &g.meta(input).sizes;
        if workgroup_rows && !row_tiled(g, n, red) {
            continue;
        }
        // A tail two reductions reach stays with the first: the second's
        // result is read from memory.
        let Some(t) = broadcast_tail(g, s, r, rows).filter(|t| !s.fused.contains_key(t)) else {
            continue;
        };
        let tail_node = g.node_of(t).unwrap_or(n);
        if written_between(g, s, &[n], tail_node) {
            continue;
        }
        s.fused.insert(t, Fused::Rows { reduction: n });
        s.is_materialized.remove(&r);
        s.materialized.retain(|&v| v != r);
    }
}

/// Is reduction `n` a float sum or mean over trailing dimensions at most
/// 1024 wide (`codegen::reduction::RowTile`, not looped)?
fn row_tiled(g: &Graph, n: NodeId, red: kiln_functionalize::ops::Reduction) -> bool {
    use kiln_functionalize::ops::Reduction as Red;
    let node = &g.nodes[n];
    let (Some(&Arg::Tensor(x)), [r]) = (node.args.first(), &node.results[..]) else {
        return false;
    };
    let (xs, rs) = (&g.meta(x).sizes, &g.meta(*r).sizes);
    // Kept dims first, reduced (size 1) last: trailing rows.
    let width: usize = xs
        .iter()
        .zip(rs)
        .skip_while(|(a, b)| a == b)
        .map(|(a, b)| if *b == 1 { *a } else { 0 })
        .product();
    matches!(red, Red::Sum | Red::Mean)
        && g.meta(*r).dtype.is_float()
        && xs.len() == rs.len()
        && (1..=1024).contains(&width)
}

/// The stored value of shape `rows` ending the chain of elementwise ops
/// from reduction result `r` (kept dims: `rows` with the reduced ones 1):
/// each link the only use of the one before, of its shape or broadcast
/// up to `rows`, never stored before the end.
fn broadcast_tail(g: &Graph, s: &Schedule, r: ValueId, rows: &[usize]) -> Option<ValueId> {
    let rs = &g.meta(r).sizes;
    if rs.len() != rows.len() || rs.iter().zip(rows).any(|(&a, &b)| a != b && a != 1) {
        return None;
    }
    let mut x = r;
    loop {
        if x != r && s.is_materialized.contains(&x) {
            return (g.meta(x).sizes[..] == *rows
                && !s.alias_of.contains_key(&x)
                && !s.inplace.contains_key(&x))
            .then_some(x);
        }
        let [u] = s.uses.get(&x).map(Vec::as_slice).unwrap_or(&[])[..] else {
            return None;
        };
        let node = &g.nodes[u];
        let [y] = node.results[..] else {
            return None;
        };
        let ys = &g.meta(y).sizes;
        let pointwise = matches!(node.op.def().lowering, Lowering::Map(Elem::Pointwise));
        if !pointwise || (ys != &g.meta(x).sizes && ys[..] != *rows) {
            return None;
        }
        x = y;
    }
}

/// The end of the chain of elementwise ops that starts at `r`: each link
/// is the previous one's shape, reads it at its own index and is its only
/// use, or is a pure reshape of it (a convolution's product reshaped to
/// NCHW before its bias: element `i` is still element `i`). A link with a
/// buffer of its own ends the chain; `r` when there is none.
fn elementwise_tail(g: &Graph, s: &Schedule, r: ValueId, permute: bool) -> ValueId {
    let mut sizes = &g.meta(r).sizes;
    let (mut x, mut end) = (r, r);
    loop {
        let alias = s.alias_of.contains_key(&x);
        if x != r && s.is_materialized.contains(&x) && !alias {
            return x;
        }
        if !alias {
            end = x;
        }
        let [u] = s.uses.get(&x).map(Vec::as_slice).unwrap_or(&[])[..] else {
            return end;
        };
        let node = &g.nodes[u];
        match node.results[..] {
            [y] if s.alias_of.get(&y) == Some(&x) => {
                x = y;
                sizes = &g.meta(y).sizes;
            }
            [y] if node.op.def().lowering.is_plain_map()
                && node
                    .op
                    .def()
                    .lowering
                    .elem()
                    .is_some_and(|e| e.reads_in_place())
                && g.meta(y).sizes == *sizes =>
            {
                x = y
            }
            [y] if permute && permuted_copy(g, u, x) => {
                x = y;
                sizes = &g.meta(y).sizes;
            }
            // A reshape computed inline (windows split into a batch and
            // back, around Swin's shifted-window mask): the same element.
            [y] if !s.is_materialized.contains(&y) && contiguous_reshape(g, u) == Some(x) => {
                x = y;
                sizes = &g.meta(y).sizes;
            }
            _ => return end,
        }
    }
}

/// Is node `u` a copy of `x` through a view that permutes its elements
/// (a transpose, a head split or merge, a reshape: every element read
/// once)? An epilogue stores `x`'s element `i` where the copy has it
/// (`Schedule::permuted`): no copy kernel.
fn permuted_copy(g: &Graph, u: NodeId, x: ValueId) -> bool {
    let node = &g.nodes[u];
    let Rule::ViewCopy(view) = node.op.def().rule else {
        return false;
    };
    if node.args.first() != Some(&Arg::Tensor(x)) || node.results.len() != 1 {
        return false;
    }
    let y = node.results[0];
    g.meta(y).numel() == g.meta(x).numel()
        && Affine::view(g, view, g.meta(x), &node.args[1..], 0).is_ok_and(|a| a.is_permutation())
}

/// The values from product result `r` (excluded) to its epilogue's tail
/// `t` (`elementwise_tail`), each the only use of the one before.
fn chain_between(g: &Graph, s: &Schedule, r: ValueId, t: ValueId) -> Vec<ValueId> {
    let mut out = vec![];
    let mut x = r;
    while x != t {
        let Some(&[u]) = s.uses.get(&x).map(Vec::as_slice) else {
            break;
        };
        let [y] = g.nodes[u].results[..] else {
            break;
        };
        out.push(y);
        x = y;
    }
    out
}

/// Does `v` reach only matrix-product operands, through index maps? Such
/// a product reads each operand element many times (once per tile), so
/// an expression inlined there is recomputed each time.
fn feeds_products_only(g: &Graph, s: &Schedule, v: ValueId) -> bool {
    let uses = s.uses.get(&v).map(Vec::as_slice).unwrap_or(&[]);
    !uses.is_empty()
        && uses.iter().all(|&u| {
            let node = &g.nodes[u];
            match node.op.def().lowering {
                Lowering::MatMul(_) => true,
                Lowering::Free(_) => node
                    .results
                    .iter()
                    .all(|&y| !s.is_materialized.contains(&y) && feeds_products_only(g, s, y)),
                _ => false,
            }
        })
}

/// Fuses kernels with what follows them: `softmax(f(Q K)) V` into one
/// attention kernel, and an elementwise tail into the epilogue of a
/// product, row kernel, reduction or gather when the tail has a buffer
/// anyway (an output, several readers) or feeds only products (which
/// would recompute it per tile). The absorbed results lose their buffers.
fn fuse_products(
    g: &Graph,
    s: &mut Schedule,
    out: &HashSet<ValueId>,
    force: &HashSet<ValueId>,
    attention: bool,
) {
    let mut absorbed: Vec<ValueId> = vec![];
    let mut added: Vec<ValueId> = vec![];
    let mut claimed = HashSet::new();
    for &n in &g.order {
        if !matches!(
            g.nodes[n].op.def().lowering,
            Lowering::MatMul(_)
                | Lowering::Attention
                | Lowering::Softmax { .. }
                | Lowering::LayerNorm
                | Lowering::Reduce(_)
        ) {
            continue;
        }
        let Some(r) = absorbable(g, s, out, force, n) else {
            continue;
        };
        if absorbed.contains(&r) || s.fused.contains_key(&r) {
            continue;
        }
        let t = elementwise_tail(g, s, r, false);
        // A tail two products reach stays with the first (or with a
        // reduction: `fuse_rows`).
        if s.fused.contains_key(&t) || !claimed.insert(t) {
            continue;
        }
        if attention {
            store_score_operands(g, s, out, force, n, t);
        }
        if let Some((p, o, on)) = attention
            .then(|| attention_of(g, s, out, force, n, t))
            .flatten()
            .filter(|&(p, _, on)| !written_between(g, s, &[n, p, on], on))
        {
            absorbed.extend([r, g.nodes[p].results[0]]);
            // What follows the weighted sum (the head merge before the
            // output projection): stored where it has each element.
            let t = elementwise_tail(g, s, o, true);
            let tail = (!s.fused.contains_key(&t) && !claimed.contains(&t))
                .then(|| stored_tail(g, s, out, &[n, p, on], o, t))
                .flatten();
            let key = match tail {
                Some(tail) => {
                    claimed.insert(t);
                    absorbed.push(o);
                    tail.apply(s, &mut absorbed, &mut added);
                    t
                }
                None => o,
            };
            s.fused.insert(
                key,
                Fused::Attention {
                    scores: n,
                    softmax: p,
                    product: on,
                    q_proj: None,
                    o_proj: None,
                },
            );
            continue;
        }
        // Not an attention's scores: the tail may go on through a
        // permuting copy (a head split), stored where the copy has it.
        let t = match elementwise_tail(g, s, r, true) {
            t2 if t2 != t && (s.fused.contains_key(&t2) || !claimed.insert(t2)) => continue,
            t2 => t2,
        };
        let Some(tail) = stored_tail(g, s, out, &[n], r, t) else {
            continue;
        };
        s.fused.insert(t, Fused::Epilogue { product: n });
        absorbed.push(r);
        tail.apply(s, &mut absorbed, &mut added);
    }
    for v in &absorbed {
        s.is_materialized.remove(v);
    }
    s.materialized.retain(|v| !absorbed.contains(v));
    for &t in &added {
        s.is_materialized.insert(t);
        s.materialized.push(t);
    }
    // Kernels run in program order.
    let pos = |v: &ValueId| match g.values[*v].def {
        Def::Node(n, k) => (s.pos[&n], k),
        Def::Input(_) => (0, 0),
    };
    s.materialized.sort_by_key(pos);
}

/// Attention kernels that compute their projections: the query rows from
/// the `linear` whose head split they are (`Q` never stored), and the
/// output projection of the head merge (the merge never stored), for
/// which one invocation of CPU adapters' row kernel, or one workgroup of
/// GPUs' tiled kernel, owns every head of its rows. Only the standard
/// layouts: the split `Q[b, i, h dk + d]` read as `q[b, h, i, d]` and
/// the merge storing `o[b, h, i, e]` at `[b, i, h dv + e]`, through
/// copies alone.
fn fuse_attention_projections(
    g: &Graph,
    s: &mut Schedule,
    out: &HashSet<ValueId>,
    force: &HashSet<ValueId>,
    options: &crate::CompileOptions,
) {
    let (chain_rows, sequence) = (options.chain_rows, options.sequence);
    // A product narrow enough for a row kernel is computed there with
    // its neighbours (`chain::chain_rows`), its result in registers.
    let apart = |n: NodeId| !(chain_rows && crate::fusion::narrow_product(g, n));
    // An attention small enough for kernels in sequence keeps its values
    // in workgroup memory there, projections apart.
    let flops = |ns: &[NodeId]| -> usize {
        ns.iter()
            .filter_map(|&n| crate::fusion::product_flops(g, n))
            .sum()
    };
    let mut keys: Vec<ValueId> = s
        .fused
        .iter()
        .filter(|(_, f)| matches!(f, Fused::Attention { .. }))
        .map(|(&k, _)| k)
        .collect();
    keys.sort();
    for key in keys {
        let Some(Fused::Attention {
            scores,
            softmax,
            product,
            ..
        }) = s.fused.get(&key).copied()
        else {
            continue;
        };
        let o = g.nodes[product].results[0];
        let om = g.meta(o).clone();
        if om.dim() < 3 {
            continue; // no heads
        }
        let (sq, dv) = (om.sizes[om.dim() - 2], om.sizes[om.dim() - 1]);
        let heads = om.sizes[om.dim() - 3];
        // Workgroups with the output projection and apart (a head each):
        // CPU adapters' row kernel has one subgroup of row blocks walk
        // every head, GPUs' tiled kernel a workgroup own every head of its
        // rows (where their tiles fit).
        let entries = om.numel() / (sq * dv).max(1);
        let dk = crate::fusion::product_depth(g, scores).unwrap_or(0);
        let (together, alone) = if options.attention_rows {
            let sg = options.subgroup.unwrap_or(1);
            (
                Some(attention_row_workgroups(sq, entries / heads, sg)),
                attention_row_workgroups(sq, entries, options.workgroup as usize),
            )
        } else {
            let tiles = |merged| {
                AttentionTiles::new(options.subgroup, options.workgroup, sq, dk, dv, merged)
            };
            (
                tiles(Some(heads)).map(|t| t.workgroups(sq, entries)),
                tiles(None).map_or(0, |t| t.workgroups(sq, entries)),
            )
        };
        // GPUs' kernel reads the projections' weights once a workgroup of
        // a few rows (a product apart, once a tile of 64-128): from cache,
        // worth it while those reads cost less than what the merge saves.
        let q_split = query_projection(g, s, out, force, scores, heads, sq);
        let cached_reads_pay = |lo: NodeId| {
            let lq = q_split.map(|(lq, _)| lq);
            let bytes = |v: ValueId| g.meta(v).numel() * 4;
            let weights = |n: NodeId| g.nodes[n].inputs().get(1).map_or(0, |&w| bytes(w));
            let reads = together.unwrap_or(0) * (weights(lo) + lq.map_or(0, weights));
            let saved = 2 * (bytes(key) + lq.map_or(0, |n| bytes(g.nodes[n].results[0])));
            options.attention_rows || reads <= ATTENTION_LAUNCH_BYTES + 2 * saved
        };
        let o_proj =
            output_projection(g, s, out, force, key, o, heads, sq, dv).filter(|&(lo, t)| {
                let end = g.node_of(t).unwrap_or(lo);
                apart(lo)
                    && together.is_some_and(|w| w >= alone.min(ATTENTION_MIN_WORKGROUPS))
                    && cached_reads_pay(lo)
                    && !written_between(g, s, &[scores, lo], end)
            });
        // The kernel runs where it stores: nothing in between may write
        // what the projection reads in place.
        let end = o_proj
            .and_then(|(_, t)| g.node_of(t))
            .or(g.node_of(key))
            .unwrap_or(product);
        let q_proj = q_split.filter(|&(lq, _)| apart(lq) && !written_between(g, s, &[lq], end));
        let projections: Vec<NodeId> = q_proj.iter().chain(&o_proj).map(|p| p.0).collect();
        if projections.is_empty()
            || sequence && flops(&[&[scores, product][..], &projections].concat()) <= SEQUENCE_FLOPS
        {
            continue;
        }
        if let Some((_, qv)) = q_proj {
            // The head split is computed inline, its product in the kernel.
            s.fused.remove(&qv);
            s.permuted.remove(&qv);
            s.is_materialized.remove(&qv);
            s.materialized.retain(|&v| v != qv);
        }
        let mut new_key = key;
        if let Some((_, t)) = o_proj {
            s.fused.remove(&key);
            s.permuted.remove(&key);
            s.is_materialized.remove(&key);
            s.materialized.retain(|&v| v != key);
            new_key = t;
        }
        s.fused.insert(
            new_key,
            Fused::Attention {
                scores,
                softmax,
                product,
                q_proj: q_proj.map(|(n, _)| n),
                o_proj: o_proj.map(|(n, _)| n),
            },
        );
    }
}

/// A plain 2-D `linear` (weight `[N, K]`, bias or none) of f32.
fn plain_linear(g: &Graph, n: NodeId) -> bool {
    let node = &g.nodes[n];
    let Some(form) = node.op.def().lowering.product() else {
        return false;
    };
    let w = node
        .args
        .get(1)
        .and_then(|a| a.tensors().first().map(|t| **t));
    form.linear
        && w.is_some_and(|w| g.meta(w).dim() == 2)
        && node
            .inputs()
            .iter()
            .chain(&node.results)
            .all(|&v| g.meta(v).dtype == DType::F32)
}

/// Does each element of `to` read `from` (flat, row major) where `want`
/// says, through a chain of copies (reshape aliases or view copies), each
/// the only use of the one before? A chain of one view copy is compared in
/// closed form (maps in their fewest dimensions are equal exactly when
/// they are the same function), so a head split of a large batch costs
/// nothing; longer chains are composed element by element.
fn copies_as(g: &Graph, s: &Schedule, from: ValueId, to: ValueId, want: &Affine) -> bool {
    let chain = chain_between(g, s, from, to);
    if chain.last() != Some(&to) {
        return false;
    }
    let n = g.meta(to).numel();
    if g.meta(from).numel() != n || want.sizes.iter().product::<usize>() != n {
        return false;
    }
    let mut links: Vec<Affine> = vec![]; // those not the identity
    for (i, &y) in chain.iter().enumerate() {
        let x = if i == 0 { from } else { chain[i - 1] };
        if s.alias_of.get(&y) == Some(&x) {
            continue;
        }
        let Some(u) = g.node_of(y) else {
            return false;
        };
        let node = &g.nodes[u];
        let Rule::ViewCopy(view) = node.op.def().rule else {
            return false;
        };
        if node.args.first() != Some(&Arg::Tensor(x)) || node.results.len() != 1 {
            return false;
        }
        // A reshape of a contiguous tensor copied (`view_copy`) reads
        // each element in place.
        match Affine::view(g, view, g.meta(x), &node.args[1..], 0) {
            Ok(a) if a.is_identity() => {}
            Ok(a) => links.push(a),
            Err(_) => return false,
        }
    }
    match &links[..] {
        [] => Affine::identity(&[n]).simplified() == want.simplified(),
        [a] => a.simplified() == want.simplified(),
        _ if n > 1 << 24 => false,
        _ => (0..n).all(|i| links.iter().rev().fold(i, |j, a| a.eval(j)) == want.eval(i)),
    }
}

/// The `linear` whose result the attention's query operand (of node
/// `scores`) is the head split of, and that operand: `q[b, h, i, d]`
/// reads `Q[b, i, h dk + d]`, Q read nowhere else.
fn query_projection(
    g: &Graph,
    s: &Schedule,
    out: &HashSet<ValueId>,
    force: &HashSet<ValueId>,
    scores: NodeId,
    heads: usize,
    sq: usize,
) -> Option<(NodeId, ValueId)> {
    let Arg::Tensor(qv) = *g.nodes[scores].args.first()? else {
        return None;
    };
    let Some(&Fused::Epilogue { product: lq }) = s.fused.get(&qv) else {
        return None;
    };
    let q = g.nodes[lq].results[0];
    let qm = g.meta(qv);
    let dk = *qm.sizes.last()?;
    let nq = *g.meta(q).sizes.last()?;
    if !plain_linear(g, lq)
        || s.twins.contains_key(&lq)
        || s.twins.values().any(|&t| t == lq)
        || out.contains(&qv)
        || force.contains(&qv)
        || s.uses.get(&qv).map(Vec::as_slice) != Some(&[scores][..])
        || nq != heads * dk
        || qm.dim() < 3
        || qm.sizes[qm.dim() - 2] != sq
        || qm.sizes[qm.dim() - 3] != heads
    {
        return None;
    }
    let outer = qm.numel() / (heads * sq * dk).max(1);
    let split = Affine {
        sizes: vec![outer, heads, sq, dk],
        strides: vec![sq * nq, dk, nq, 1],
        offset: 0,
    };
    copies_as(g, s, q, qv, &split).then_some((lq, qv))
}

/// The `linear` taking the attention's head merge `key` (of `o`) as its
/// left operand, and what its kernel stores (its result, or its
/// epilogue's tail): the merge stores `o[b, h, i, e]` at
/// `[b, i, h dv + e]`, read by that product alone.
#[allow(clippy::too_many_arguments)]
fn output_projection(
    g: &Graph,
    s: &Schedule,
    out: &HashSet<ValueId>,
    force: &HashSet<ValueId>,
    key: ValueId,
    o: ValueId,
    heads: usize,
    sq: usize,
    dv: usize,
) -> Option<(NodeId, ValueId)> {
    let [lo] = s.uses.get(&key)?[..] else {
        return None;
    };
    let kc = *g.meta(key).sizes.last()?;
    if key == o
        || !plain_linear(g, lo)
        || s.twins.contains_key(&lo)
        || s.twins.values().any(|&t| t == lo)
        || out.contains(&key)
        || force.contains(&key)
        || g.nodes[lo].args.first() != Some(&Arg::Tensor(key))
        || kc != heads * dv
        || !dv.is_multiple_of(4)
    {
        return None;
    }
    let r = g.nodes[lo].results[0];
    if g.meta(r)
        .sizes
        .last()
        .is_none_or(|&n| n > ATTENTION_MAX_PROJECTION)
    {
        return None;
    }
    let t = match s
        .fused
        .iter()
        .find(|(_, f)| **f == Fused::Epilogue { product: lo })
    {
        Some((&t, _)) => t,
        None if s.is_materialized.contains(&r) && !s.fused.contains_key(&r) => r,
        None => return None,
    };
    // Element [b, i, h dv + e] of the merge holds o[b, h, i, e].
    let outer = g.meta(key).numel() / (sq * kc).max(1);
    let merge = Affine {
        sizes: vec![outer, sq, heads, dv],
        strides: vec![heads * sq * dv, dv, sq * dv, 1],
        offset: 0,
    };
    copies_as(g, s, o, key, &merge).then_some((lo, t))
}

/// The tail a kernel stores in place of its result (`elementwise_tail`).
struct StoredTail {
    t: ValueId,
    /// The permuting copies it is stored through (`Schedule::permuted`).
    permuted: Vec<ValueId>,
    /// Reshapes within it, computed inline rather than aliased.
    reshapes: Vec<ValueId>,
    /// Not materialized before: it gets a buffer.
    added: bool,
}

impl StoredTail {
    fn apply(self, s: &mut Schedule, absorbed: &mut Vec<ValueId>, added: &mut Vec<ValueId>) {
        if self.added {
            added.push(self.t);
        }
        if !self.permuted.is_empty() {
            s.permuted.insert(self.t, self.permuted);
        }
        for y in self.reshapes {
            s.alias_of.remove(&y);
            absorbed.push(y);
        }
    }
}

/// Can the kernel of `nodes` (result `r`) store tail `t` instead? It runs
/// where the tail is: no kernel in between may write a buffer it reads (a
/// re-inplaced scatter). A tail without a buffer of its own gets one only
/// where it feeds products alone (which would recompute it per tile).
fn stored_tail(
    g: &Graph,
    s: &Schedule,
    out: &HashSet<ValueId>,
    nodes: &[NodeId],
    r: ValueId,
    t: ValueId,
) -> Option<StoredTail> {
    let tail_node = g.node_of(t).unwrap_or(nodes[0]);
    if t == r || written_between(g, s, nodes, tail_node) {
        return None;
    }
    let chain = chain_between(g, s, r, t);
    let reshapes: Vec<ValueId> = chain
        .iter()
        .copied()
        .filter(|y| s.alias_of.contains_key(y))
        .collect();
    if reshapes.iter().any(|y| out.contains(y)) {
        return None;
    }
    // Each link reads the one before: `r`, then the chain.
    let permuted: Vec<ValueId> = std::iter::once(r)
        .chain(chain.iter().copied())
        .zip(chain.iter().copied())
        .filter(|&(x, y)| {
            !s.alias_of.contains_key(&y) && g.node_of(y).is_some_and(|u| permuted_copy(g, u, x))
        })
        .map(|(_, y)| y)
        .collect();
    let added = !s.is_materialized.contains(&t);
    if added && !feeds_products_only(g, s, t) {
        return None;
    }
    Some(StoredTail {
        t,
        permuted,
        reshapes,
        added,
    })
}

/// Layer norms whose every reader is a product too wide for a row kernel
/// (`fusion::narrow_product`; any product for the norms of `narrow`,
/// which an earlier plan's row kernels left apart:
/// `lower::Grouping::narrow_norms`) taking the norm's rows whole as its left
/// operand (`linear`, `mm`: each row of the operand one row of the
/// norm): computed by those products where they load the operand, from
/// row statistics each workgroup computes for its rows first
/// (`Schedule::norm_operands`). Pre-norm transformers' norms before the
/// projections and the MLP; the norm's result (as large as its input)
/// never written and read back.
fn fuse_norm_operands(
    g: &Graph,
    s: &mut Schedule,
    out: &HashSet<ValueId>,
    force: &HashSet<ValueId>,
    narrow: &HashSet<ValueId>,
) {
    let attention = attention_products(s);
    let with_tail: HashSet<NodeId> = s
        .fused
        .values()
        .filter_map(|f| match *f {
            Fused::Epilogue { product } | Fused::Rows { reduction: product } => Some(product),
            Fused::Attention { .. } => None,
        })
        .collect();
    let mut found = vec![];
    for &n in &g.order {
        let node = &g.nodes[n];
        if !matches!(node.op.def().lowering, Lowering::LayerNorm) || with_tail.contains(&n) {
            continue;
        }
        let [r] = node.results[..] else { continue };
        let rm = g.meta(r);
        let Some(width) = crate::fusion::norm_width(g, n) else {
            continue;
        };
        let operands_ok = node.args.iter().flat_map(|a| a.tensors()).all(|t| {
            s.is_materialized.contains(t)
                && !s.inplace.contains_key(t)
                && g.meta(*t).dtype == DType::F32
        });
        if out.contains(&r)
            || force.contains(&r)
            || !s.is_materialized.contains(&r)
            || s.fused.contains_key(&r)
            || s.chains.contains_key(&r)
            || rm.dtype != DType::F32
            || rm.sizes.last() != Some(&width)
            || width == 0
            || !operands_ok
        {
            continue;
        }
        let uses = s.uses.get(&r).map(Vec::as_slice).unwrap_or(&[]);
        let readers_ok = !uses.is_empty()
            && uses.iter().all(|&u| {
                let un = &g.nodes[u];
                let Some(form) = un.op.def().lowering.product() else {
                    return false;
                };
                let only_left = un
                    .args
                    .iter()
                    .enumerate()
                    .all(|(i, a)| (i == form.left) == a.tensors().contains(&&r));
                // Rows of the operand are rows of the norm: a linear's
                // input, or a matrix of `mm`.
                let rows = form.linear || (rm.dim() == 2 && g.meta(un.results[0]).dim() == 2);
                // Computed where the product runs: no kernel in between
                // may write the norm's input in place.
                only_left
                    && rows
                    && !attention.contains(&u)
                    && !written_between(g, s, &[n], u)
                    && (narrow.contains(&r) || !crate::fusion::narrow_product(g, u))
            });
        if readers_ok {
            found.push(r);
        }
    }
    for r in found {
        s.is_materialized.remove(&r);
        s.materialized.retain(|&v| v != r);
        s.norm_operands.insert(r);
    }
}

/// Computes a product in the kernel of another product's epilogue that
/// reads it (SwiGLU's `silu(x W1^T) * (x W3^T)`): both share their left
/// operand and their shapes, so one kernel accumulates both from one
/// pass over the left operand's tiles (`Schedule::twins`), and the first
/// result never reaches memory. The twin's result must be read by that
/// epilogue alone, element by element at the element being stored.
fn fuse_twin_products(
    g: &Graph,
    s: &mut Schedule,
    out: &HashSet<ValueId>,
    force: &HashSet<ValueId>,
) {
    let mut tails: Vec<(ValueId, NodeId)> = s
        .fused
        .iter()
        .filter_map(|(&t, f)| match *f {
            Fused::Epilogue { product } => Some((t, product)),
            _ => None,
        })
        .collect();
    tails.sort_by_key(|&(_, n)| s.pos[&n]);
    for (t, n2) in tails {
        if s.permuted.contains_key(&t) {
            continue;
        }
        let r2 = g.nodes[n2].results[0];
        let chain = chain_between(g, s, r2, t);
        let chain_nodes: HashSet<NodeId> = chain.iter().filter_map(|&y| g.node_of(y)).collect();
        let twin = chain_nodes
            .iter()
            .flat_map(|&c| g.nodes[c].inputs())
            .filter(|y| *y != r2 && !chain.contains(y))
            .flat_map(|y| reads_value(g, s, y))
            .filter(|&x| twin_product(g, s, out, force, x, n2, &chain_nodes))
            .min();
        let Some(x) = twin else { continue };
        let Some(n1) = g.node_of(x) else { continue };
        let tail_node = g.node_of(t).unwrap_or(n2);
        if written_between(g, s, &[n1], tail_node) {
            continue;
        }
        s.twins.insert(n2, n1);
        s.is_materialized.remove(&x);
        s.materialized.retain(|&v| v != x);
    }
}

/// Is materialized `x` the result of a product like node `n2`'s (the same
/// op, left operand, shapes and scalars), read only by `n2`'s epilogue
/// (`chain`) through elementwise maps, each at its own element?
fn twin_product(
    g: &Graph,
    s: &Schedule,
    out: &HashSet<ValueId>,
    force: &HashSet<ValueId>,
    x: ValueId,
    n2: NodeId,
    chain: &HashSet<NodeId>,
) -> bool {
    let Some(n1) = g.node_of(x) else {
        return false;
    };
    let (a, b) = (&g.nodes[n1], &g.nodes[n2]);
    let Some(form) = a.op.def().lowering.product() else {
        return false;
    };
    let same_args = a.args.len() == b.args.len()
        && a.args
            .iter()
            .zip(&b.args)
            .enumerate()
            .all(|(i, (p, q))| match (p, q) {
                (Arg::Tensor(p), Arg::Tensor(q)) if i == form.left => p == q,
                (Arg::Tensor(p), Arg::Tensor(q)) => g.meta(*p) == g.meta(*q),
                (Arg::Tensor(_), _) | (_, Arg::Tensor(_)) => false,
                (p, q) => p == q,
            });
    n1 != n2
        && a.op == b.op
        && same_args
        && a.results.len() == 1
        && g.meta(x) == g.meta(b.results[0])
        && s.is_materialized.contains(&x)
        && !out.contains(&x)
        && !force.contains(&x)
        && !s.pinned.contains(&x)
        && !s.fused.contains_key(&x)
        && !s.twins.values().any(|&m| m == n1)
        && !s.twins.contains_key(&n1)
        && s.sharing(x) == [x]
        && read_at_own_element(g, s, x, chain, &g.meta(x).sizes)
}

/// Does every use of `v` read it elementwise at its own element (a map of
/// `sizes`), ending in `chain`, through values only this path reads?
fn read_at_own_element(
    g: &Graph,
    s: &Schedule,
    v: ValueId,
    chain: &HashSet<NodeId>,
    sizes: &[usize],
) -> bool {
    let uses = s.uses.get(&v).map(Vec::as_slice).unwrap_or(&[]);
    !uses.is_empty()
        && uses.iter().all(|&u| {
            let node = &g.nodes[u];
            let [y] = node.results[..] else {
                return false;
            };
            let elementwise = node.op.def().lowering.is_plain_map()
                && node
                    .op
                    .def()
                    .lowering
                    .elem()
                    .is_some_and(|e| e.reads_in_place())
                && g.meta(y).sizes[..] == *sizes;
            elementwise
                && (chain.contains(&u)
                    || (!s.is_materialized.contains(&y)
                        && !s.fused.contains_key(&y)
                        && read_at_own_element(g, s, y, chain, sizes)))
        })
}

/// The products attention kernels compute (scores and weighted sums,
/// and the projections they absorb).
fn attention_products(s: &Schedule) -> HashSet<NodeId> {
    s.fused
        .values()
        .flat_map(|f| match *f {
            Fused::Attention {
                scores,
                product,
                q_proj,
                o_proj,
                ..
            } => [scores, product]
                .into_iter()
                .chain(q_proj)
                .chain(o_proj)
                .collect(),
            Fused::Epilogue { .. } | Fused::Rows { .. } => vec![],
        })
        .collect()
}

/// Matrix-product operands computed inline (index maps such as a
/// transpose or a head merge, elementwise expressions) in schedule `s`:
/// given a buffer of their own, the product reads them as contiguous rows.
/// Attention kernels stage their operands through workgroup memory
/// anyway, products narrow enough for a row kernel read theirs by rows:
/// theirs are left alone.
pub fn inline_product_operands(g: &Graph, s: &Schedule) -> HashSet<ValueId> {
    let attention = attention_products(s);
    let mut out = HashSet::new();
    for &n in &g.order {
        let node = &g.nodes[n];
        let Some(form) = node.op.def().lowering.product() else {
            continue;
        };
        // Products a row kernel may compute (`chain::chain_rows`) read
        // their operands by rows there: staging buys nothing.
        if attention.contains(&n) || crate::fusion::narrow_product(g, n) {
            continue;
        }
        // An addend or bias is read once per output, not per tile.
        for i in [form.left, form.right] {
            if let Some(&Arg::Tensor(v)) = node.args.get(i) {
                if g.node_of(v).is_some_and(|m| {
                    matches!(
                        g.nodes[m].op.def().lowering,
                        Lowering::Free(_) | Lowering::Map(_)
                    )
                }) && !dequantizes(g, s, v)
                {
                    out.insert(v);
                }
            }
        }
    }
    out
}

/// Is `v` computed inline from an int8 tensor (weights exported with
/// `--weights-dtype i8`)? Such an operand is dequantized where the
/// product loads it: a buffer of its own would be the f32 copy that int8
/// weights exist to avoid.
fn dequantizes(g: &Graph, s: &Schedule, v: ValueId) -> bool {
    let mut stack = vec![v];
    let mut seen = HashSet::new();
    while let Some(x) = stack.pop() {
        if !seen.insert(x) {
            continue;
        }
        if g.meta(x).dtype == DType::I8 {
            return true;
        }
        let Some(n) = g.node_of(x) else { continue };
        let node = &g.nodes[n];
        if x != v && s.is_materialized.contains(&x)
            || !matches!(node.op.def().lowering, Lowering::Free(_) | Lowering::Map(_))
        {
            continue;
        }
        stack.extend(node.args.iter().filter_map(|a| match a {
            Arg::Tensor(t) => Some(*t),
            _ => None,
        }));
    }
    false
}

/// The largest query and value width an attention kernel holds in
/// registers.
pub const ATTENTION_MAX_HEAD: usize = 128;

/// Query rows an invocation of CPU adapters' attention kernel owns
/// (`codegen::attention`).
pub const ATTENTION_ROW_BLOCK: usize = 2;

/// Workgroups of CPU adapters' attention kernel over `entries` batch
/// entries of `sq` query rows, `per_workgroup` row blocks a workgroup.
pub fn attention_row_workgroups(sq: usize, entries: usize, per_workgroup: usize) -> usize {
    sq.div_ceil(ATTENTION_ROW_BLOCK).div_ceil(per_workgroup) * entries
}

/// How GPUs' tiled attention kernel (`codegen::attention`) splits its
/// work: a workgroup owns `rows` query rows of `heads` consecutive batch
/// entries (1, or every head of the rows when it computes their output
/// projection), `lanes` invocations a row, and stages `keys` keys and
/// values of each of its heads at a time through workgroup memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionTiles {
    pub lanes: usize,
    pub keys: usize,
    pub rows: usize,
    pub heads: usize,
}

/// Keys a tile of the tiled attention kernel, one head a workgroup.
const ATTENTION_KEYS: usize = 16;

/// WebGPU's least `maxComputeWorkgroupStorageSize`, in f32 words.
const WORKGROUP_WORDS: usize = 16384 / 4;

impl AttentionTiles {
    /// The split for `sq` query rows of widths `dk` and `dv`; with
    /// `merged` heads, the one whose workgroup owns every head of its rows
    /// and keeps their weighted sums (the head merge, `rows` x `merged dv`)
    /// in the tiles' memory after the walk; None where that does not fit
    /// WebGPU's 16 KiB of workgroup memory or the workgroup size.
    pub fn new(
        subgroup: Option<usize>,
        workgroup: u32,
        sq: usize,
        dk: usize,
        dv: usize,
        merged: Option<usize>,
    ) -> Option<AttentionTiles> {
        // Invocations sharing a query row where the device has subgroups.
        const LANES: usize = 4;
        let lanes = match subgroup {
            Some(sg) if sg >= LANES && dk.is_multiple_of(LANES) && dv.is_multiple_of(LANES) => {
                LANES
            }
            _ => 1,
        };
        let workgroup = workgroup.max(8) as usize;
        let Some(heads) = merged else {
            return Some(AttentionTiles {
                lanes,
                keys: ATTENTION_KEYS,
                rows: sq.next_power_of_two().clamp(8, (workgroup / lanes).max(8)),
                heads: 1,
            });
        };
        let per_key = heads * (dk + dv);
        let keys = (1..=ATTENTION_KEYS)
            .rev()
            .find(|k| k.is_power_of_two() && k * per_key <= WORKGROUP_WORDS)?;
        // 8 rows share each weight the projection loads.
        let mut rows = sq.next_power_of_two().min(8);
        while rows > 1 && (heads * rows * lanes > workgroup || rows * dv > keys * (dk + dv)) {
            rows /= 2;
        }
        (heads * rows * lanes <= workgroup && rows * dv <= keys * (dk + dv)).then_some(
            AttentionTiles {
                lanes,
                keys,
                rows,
                heads,
            },
        )
    }

    /// Workgroups over `entries` batch entries (each of `heads` heads).
    pub fn workgroups(&self, sq: usize, entries: usize) -> usize {
        sq.div_ceil(self.rows) * entries / self.heads
    }
}

/// Workgroups an attention kernel computing its output projection needs
/// at least (or as many as it would have apart, if fewer): one
/// invocation walks every head, so a small batch makes few of them
/// (MiniLM at 1 x 16 tokens, 1 workgroup instead of 12: 51-55 ms against
/// 32-37 on lavapipe), and CPU adapters run a workgroup on one thread.
pub const ATTENTION_MIN_WORKGROUPS: usize = 16;

/// Cache reads of projection weights worth a launch of GPUs' attention
/// kernel, against memory traffic at twice the bytes (an H100's L2 serves
/// about 5.5 TB/s, its memory 3.35): about what the L2 serves in the
/// 3 us a launch takes. An estimate: no GPU has timed it (MiniLM 32 x
/// 128, 4 rows a workgroup with subgroups, would read each layer's
/// output projection 1024 times, 604 MB, to save 12.6 MB; the 128 x 256
/// 4-head workload reads 8 MiB to save 512 KiB and a launch).
pub const ATTENTION_LAUNCH_BYTES: usize = 16 << 20;

/// The widest output projection an attention kernel computes: each
/// invocation accumulates its rows of it in a function-scope array.
pub const ATTENTION_MAX_PROJECTION: usize = 1024;

/// The most ops an attention kernel computes inline for each score
/// (scale, masks, biases and the index maps reading them).
pub const ATTENTION_MAX_SCORE_OPS: usize = 24;

/// Does a kernel between the first of `nodes` and `until` (program order)
/// write in place into a buffer that `nodes` read?
fn written_between(g: &Graph, s: &Schedule, nodes: &[NodeId], until: NodeId) -> bool {
    let roots: HashSet<ValueId> = nodes
        .iter()
        .flat_map(|&m| reads(g, s, m))
        .map(|r| s.root(r))
        .collect();
    let from = s.pos[&nodes[0]];
    let to = s.pos[&until];
    g.order[from + 1..to].iter().any(|&m| {
        g.nodes[m]
            .results
            .iter()
            .any(|r| s.inplace.contains_key(r) && roots.contains(&s.root(*r)))
    })
}

/// Where the softmax over scores `t` (the tail of the product at node
/// `scores`) would compute more than `ATTENTION_MAX_SCORE_OPS` ops inline
/// for every score, the operands of that tail that do not depend on the
/// scores (Swin's shifted-window mask, built from fills of slices) go to
/// memory: a kernel of their own computes each element once, and the
/// attention kernel reads them.
fn store_score_operands(
    g: &Graph,
    s: &mut Schedule,
    out: &HashSet<ValueId>,
    force: &HashSet<ValueId>,
    scores: NodeId,
    t: ValueId,
) {
    let Some(&[p]) = s.uses.get(&t).map(Vec::as_slice) else {
        return;
    };
    if g.nodes[p].op.def().lowering != (Lowering::Softmax { log: false }) {
        return;
    }
    let region = crate::fusion::inlined_region(g, s, p);
    if region.len() <= ATTENTION_MAX_SCORE_OPS {
        return;
    }
    // The region's nodes that read the scores, in program order.
    let mut order: Vec<NodeId> = region.iter().copied().collect();
    order.sort_by_key(|n| s.pos[n]);
    let mut on_scores = HashSet::from([scores]);
    for &n in &order {
        let reads_scores = g.nodes[n]
            .inputs()
            .iter()
            .any(|&v| g.node_of(v).is_some_and(|m| on_scores.contains(&m)));
        if reads_scores {
            on_scores.insert(n);
        }
    }
    // Their operands computed inline but apart from the scores.
    let mut side = vec![];
    for &n in order.iter().filter(|n| on_scores.contains(n)) {
        for v in g.nodes[n].inputs() {
            let apart = g
                .node_of(v)
                .is_some_and(|m| region.contains(&m) && !on_scores.contains(&m));
            let plain = !s.fused.contains_key(&v)
                && !s.alias_of.contains_key(&v)
                && !s.is_materialized.contains(&v)
                && !out.contains(&v)
                && !force.contains(&v);
            if apart && plain && !side.contains(&v) {
                side.push(v);
            }
        }
    }
    // The costliest first, until the rest fits (a bias read through an
    // index map stays inline).
    let cost = |s: &Schedule, v: ValueId| {
        g.node_of(v)
            .map_or(0, |m| crate::fusion::inlined_region(g, s, m).len() + 1)
    };
    side.sort_by_key(|&v| std::cmp::Reverse(cost(s, v)));
    for v in side {
        if crate::fusion::inlined_region(g, s, p).len() <= ATTENTION_MAX_SCORE_OPS {
            break;
        }
        s.is_materialized.insert(v);
        s.materialized.push(v);
    }
}

/// `o = softmax(t) V` where `t` ends the elementwise chain of the product
/// at node `scores`: the softmax over the last dimension, its result used
/// only as the second product's left operand, f32 throughout. Returns the
/// softmax node, `o` and `o`'s node.
fn attention_of(
    g: &Graph,
    s: &Schedule,
    out: &HashSet<ValueId>,
    force: &HashSet<ValueId>,
    scores: NodeId,
    t: ValueId,
) -> Option<(NodeId, ValueId, NodeId)> {
    // A batched product with nothing added (`bmm`, `matmul`).
    let is_bmm = |n: NodeId| {
        g.nodes[n].op.def().lowering.product()
            == Some(kiln_functionalize::ops::ProductForm::plain(true))
    };
    let sm = g.meta(t);
    if !is_bmm(scores)
        || sm.dim() < 2
        || (t != g.nodes[scores].results[0] && s.is_materialized.contains(&t))
    {
        return None;
    }
    let [p] = s.uses.get(&t)?[..] else {
        return None;
    };
    let pnode = &g.nodes[p];
    let dim_last =
        matches!(pnode.args.get(1), Some(Arg::Int(d)) if (*d == -1 || *d == sm.dim() as i64 - 1));
    if pnode.op.def().lowering != (Lowering::Softmax { log: false }) || !dim_last {
        return None;
    }
    // The scores' tail is evaluated for every score: one computed from
    // a long chain (Swin's shifted-window mask, built from fills of
    // slices) would make a shader of tens of thousands of lines.
    let inlined = crate::fusion::inlined_region(g, s, p).len();
    if inlined > ATTENTION_MAX_SCORE_OPS {
        return None;
    }
    let pr = absorbable(g, s, out, force, p)?;
    let [on] = s.uses.get(&pr)?[..] else {
        return None;
    };
    let onode = &g.nodes[on];
    let [o] = onode.results[..] else {
        return None;
    };
    let f32s = [g.nodes[scores].results[0], t, pr, o]
        .iter()
        .all(|&v| g.meta(v).dtype == kiln_functionalize::DType::F32);
    // The query row and the output row live in registers.
    let head = |v: &Arg<ValueId>| match v {
        Arg::Tensor(x) => g.meta(*x).sizes.last().copied().unwrap_or(0),
        _ => 0,
    };
    let (dk, dv) = (head(g.nodes[scores].args.first()?), head(&Arg::Tensor(o)));
    let om = g.meta(o);
    let batches: usize = om.sizes[..om.dim().saturating_sub(2)].iter().product();
    let fits = (1..=ATTENTION_MAX_HEAD).contains(&dk)
        && (1..=ATTENTION_MAX_HEAD).contains(&dv)
        && batches <= 65535
        && om.dim() == sm.dim()
        && sm.numel() > 0;
    (is_bmm(on) && onode.args.first() == Some(&Arg::Tensor(pr)) && f32s && fits)
        .then_some((p, o, on))
}

/// `n`'s single result when it is materialized, used once, and neither an
/// output nor forced: it may stay out of memory.
fn absorbable(
    g: &Graph,
    s: &Schedule,
    out: &HashSet<ValueId>,
    force: &HashSet<ValueId>,
    n: NodeId,
) -> Option<ValueId> {
    let [r] = g.nodes[n].results[..] else {
        return None;
    };
    (s.is_materialized.contains(&r)
        && s.uses.get(&r).is_some_and(|u| u.len() == 1)
        && !out.contains(&r)
        && !force.contains(&r))
    .then_some(r)
}

/// Is `r` the base of a region update `S = <view>_scatter(r, f(<view>_copy(r, args)), args)`
/// and used nowhere else? `f` is elementwise over one shape, reading `r`
/// only through that view copy, so `S` at element `i` reads `r` at `i`
/// alone (codegen evaluates `r` once there).
pub fn chain_link(g: &Graph, s: &Schedule, r: ValueId) -> bool {
    let uses = s.uses.get(&r).map(Vec::as_slice).unwrap_or(&[]);
    let [sc] = updates_of(g, uses, r)[..] else {
        return false;
    };
    let node = &g.nodes[sc];
    let Some(&Arg::Tensor(src)) = node.args.get(1) else {
        return false;
    };
    // The other uses: that view of `r`, read only by `f` (the other
    // pieces of an `unbind` or `split` unread).
    let copies: Vec<ValueId> = uses
        .iter()
        .filter(|&&u| u != sc)
        .map(|&u| {
            let rs = &g.nodes[u].results;
            let (same, other): (Vec<ValueId>, Vec<ValueId>) =
                rs.iter().partition(|&&c| is_scatter_view_copy(g, sc, c));
            match same[..] {
                [c] if other
                    .iter()
                    .all(|o| s.uses.get(o).is_none_or(Vec::is_empty)) =>
                {
                    Some(c)
                }
                _ => None,
            }
        })
        .collect::<Option<Vec<_>>>()
        .unwrap_or_default();
    if copies.len() + 1 != uses.len() || uses.iter().filter(|&&u| u == sc).count() != 1 {
        return false;
    }
    let mut inside = HashSet::new();
    let dependents = dependents_before(s, g, r, s.pos.get(&sc).copied().unwrap_or(0));
    elementwise_over(
        g,
        src,
        &dependents,
        &copies,
        &mut inside,
        &mut HashMap::new(),
    ) && copies.iter().all(|c| {
        s.uses
            .get(c)
            .is_some_and(|us| us.iter().all(|u| inside.contains(u)))
    }) && inside.iter().all(|&m| {
        g.nodes[m].results.iter().all(|x| {
            copies.contains(x)
                || x == &src
                || s.uses
                    .get(x)
                    .is_some_and(|us| us.iter().all(|u| inside.contains(u) || *u == sc))
        })
    })
}

/// Is `v` an elementwise function (ops of `v`'s shape) of the `copies` and
/// of values that do not depend on `r` (not in `dependents`)? Collects the
/// nodes on the way; `memo` visits shared operands once.
fn elementwise_over(
    g: &Graph,
    v: ValueId,
    dependents: &HashSet<ValueId>,
    copies: &[ValueId],
    inside: &mut HashSet<NodeId>,
    memo: &mut HashMap<ValueId, bool>,
) -> bool {
    if let Some(&b) = memo.get(&v) {
        return b;
    }
    let ok = if copies.contains(&v) {
        if let Some(n) = g.node_of(v) {
            inside.insert(n);
        }
        true
    } else if !dependents.contains(&v) {
        true
    } else if let Some(n) = g
        .node_of(v)
        .filter(|&n| matches!(g.nodes[n].op.def().rule, Rule::Pointwise(_)))
    {
        inside.insert(n);
        let out = &g.meta(v).sizes;
        g.nodes[n].args.iter().all(|a| match a {
            Arg::Tensor(x) if g.meta(*x).sizes == *out => {
                elementwise_over(g, *x, dependents, copies, inside, memo)
            }
            Arg::Tensor(x) => !dependents.contains(x),
            _ => true,
        })
    } else {
        false
    };
    memo.insert(v, ok);
    ok
}

/// Values computed from `r` by nodes before position `limit`.
fn dependents_before(s: &Schedule, g: &Graph, r: ValueId, limit: usize) -> HashSet<ValueId> {
    let mut out = HashSet::from([r]);
    let mut stack = vec![r];
    while let Some(x) = stack.pop() {
        for &u in s.uses.get(&x).map(Vec::as_slice).unwrap_or(&[]) {
            if s.pos.get(&u).is_some_and(|&p| p < limit) {
                for &y in &g.nodes[u].results {
                    if out.insert(y) {
                        stack.push(y);
                    }
                }
            }
        }
    }
    out
}

/// Operations per element a chain link may cost each kernel that
/// recomputes it (`fresh_chain_link`).
const MAX_LINK_OPS: usize = 64;

/// Is `r` the base of one region update of a chain that starts from a
/// fresh whole copy (`copy_between_rows`: a `clone`, then rows rewritten
/// from other rows and through views of views), every reader an
/// elementwise map? Then `r` stays out of memory and each reader
/// recomputes it: the chain's last value is one kernel reading the copy's
/// source once, where in-place updates would copy it whole and then
/// rewrite region after region. Its sources may read `r` anywhere (unlike
/// `chain_link`), so recomputation is bounded by `MAX_LINK_OPS`.
fn fresh_chain_link(g: &Graph, s: &Schedule, r: ValueId) -> bool {
    let uses = s.uses.get(&r).map(Vec::as_slice).unwrap_or(&[]);
    let mut budget = MAX_LINK_OPS;
    updates_of(g, uses, r).len() == 1
        && uses
            .iter()
            .all(|&u| class(g, u).is_ok_and(|c| c == Class::Map))
        && inline_ops(g, s, r, &HashSet::new(), &mut budget).is_some()
}

/// The region updates among `uses` that write over `r` (their base).
fn updates_of(g: &Graph, uses: &[NodeId], r: ValueId) -> Vec<NodeId> {
    uses.iter()
        .copied()
        .filter(|&u| {
            scatter_view(g, u).is_some() && g.nodes[u].args.first() == Some(&Arg::Tensor(r))
        })
        .collect()
}

/// Walking back from `r` through region updates computed inline, does the
/// chain start from a value computed whole anyway: an elementwise value
/// (a `clone`) that would otherwise be copied whole, or an update of a
/// buffer it may not write in place, rather than a buffer that exists
/// anyway (a parameter, a kernel's result), where updating regions in
/// place moves fewer bytes?
fn whole_chain_root(g: &Graph, s: &Schedule, out: &HashSet<ValueId>, r: ValueId) -> bool {
    let mut v = r;
    loop {
        let Some(n) = g.node_of(v) else {
            return false;
        };
        if v != r && s.is_materialized.contains(&v) {
            return false;
        }
        match g.nodes[n].args.first() {
            Some(&Arg::Tensor(base)) if scatter_view(g, n).is_some() => {
                if s.is_materialized.contains(&base) {
                    // An earlier link was computed whole; `r` itself is
                    // unless it can update its base's buffer in place
                    // and that is cheaper (`chain_better_whole`).
                    return v != r
                        || inplace_base(g, s, out, n).is_none()
                        || chain_better_whole(g, s, n, base);
                }
                v = base;
            }
            _ => return class(g, n).is_ok_and(|c| c == Class::Map),
        }
    }
}

/// Is updating the chain starting at scatter `n` (over `base`) region by
/// region in place no cheaper than computing it whole? Updated in place,
/// each link is a kernel reading and writing its region; computed whole,
/// the chain's last kernel reads the base and writes the result once. So
/// whole when the regions written hold more elements than the base
/// (`chunk_unbind_pieces_mutated`: pieces rewritten twice, a row over
/// them), or when an elementwise map of the base's shape reads the base
/// anyway and the base is small enough that the launches saved cost more
/// than the writes added (`JOIN_MAX_ELEMENTS`): the chain then joins that
/// map's kernel (`inplace_vs_scatter`: the same update through views of a
/// clone and by scatters over the original, one kernel instead of five).
fn chain_better_whole(g: &Graph, s: &Schedule, n: NodeId, base: ValueId) -> bool {
    let whole = g.meta(base).numel();
    chain_region_elements(g, s, n, whole) > whole
        || (whole <= crate::fusion::JOIN_MAX_ELEMENTS && read_whole_elsewhere(g, s, n, base))
}

/// The elements the region updates of the chain starting at scatter `n`
/// write, counted until past `limit`. The chain follows each link's single
/// update while its result can stay out of memory (`chain_link`,
/// `fresh_chain_link`).
fn chain_region_elements(g: &Graph, s: &Schedule, n: NodeId, limit: usize) -> usize {
    let region = |n: NodeId| match g.nodes[n].args.get(1) {
        Some(&Arg::Tensor(src)) => g.meta(src).numel(),
        _ => limit,
    };
    let mut written = region(n);
    let mut link = n;
    while written <= limit {
        let [r] = g.nodes[link].results[..] else {
            break;
        };
        if !(chain_link(g, s, r) || fresh_chain_link(g, s, r)) {
            break;
        }
        let uses = s.uses.get(&r).map(Vec::as_slice).unwrap_or(&[]);
        let [next] = updates_of(g, uses, r)[..] else {
            break;
        };
        written += region(next);
        link = next;
    }
    written
}

/// Does an elementwise map of `base`'s shape other than scatter `n` read
/// `base`?
fn read_whole_elsewhere(g: &Graph, s: &Schedule, n: NodeId, base: ValueId) -> bool {
    let numel = g.meta(base).numel();
    s.uses.get(&base).is_some_and(|us| {
        us.iter().any(|&u| {
            u != n
                && class(g, u).is_ok_and(|c| c == Class::Map)
                && scatter_view(g, u).is_none()
                && g.nodes[u]
                    .results
                    .iter()
                    .all(|&r| g.meta(r).numel() == numel)
        })
    })
}

/// Counts the operations evaluating one element of `v` inline takes (the
/// expression down to stored values) against `budget`: `None` past it. A
/// region update's source reads its base through the updated view at no
/// cost (`free`: codegen reuses the base's element there).
fn inline_ops(
    g: &Graph,
    s: &Schedule,
    v: ValueId,
    free: &HashSet<ValueId>,
    budget: &mut usize,
) -> Option<()> {
    if s.is_materialized.contains(&v) || free.contains(&v) {
        return Some(());
    }
    let Some(n) = g.node_of(v) else {
        return Some(());
    };
    *budget = budget.checked_sub(1)?;
    let node = &g.nodes[n];
    if let (Some(_), Some(&Arg::Tensor(base)), Some(&Arg::Tensor(src))) =
        (scatter_view(g, n), node.args.first(), node.args.get(1))
    {
        inline_ops(g, s, base, free, budget)?;
        let mut same = free.clone();
        same.extend(
            s.uses
                .get(&base)
                .map(Vec::as_slice)
                .unwrap_or(&[])
                .iter()
                .flat_map(|&u| g.nodes[u].results.iter().copied())
                .filter(|&c| is_scatter_view_copy(g, n, c)),
        );
        return inline_ops(g, s, src, &same, budget);
    }
    for t in node.args.iter().flat_map(|a| a.tensors()) {
        inline_ops(g, s, *t, free, budget)?;
    }
    Some(())
}

/// A view copy that is a pure reshape of a materialized value: same
/// elements in the same order, so it can share the value's buffer.
fn reshape_of(g: &Graph, s: &Schedule, n: NodeId) -> Option<ValueId> {
    contiguous_reshape(g, n).filter(|input| s.is_materialized.contains(input))
}

/// The input of view copy `n` when it only reshapes it: every element
/// at the same flat index (its index map the identity).
fn contiguous_reshape(g: &Graph, n: NodeId) -> Option<ValueId> {
    let node = &g.nodes[n];
    let Rule::ViewCopy(view) = node.op.def().rule else {
        return None;
    };
    if node.results.len() != 1 {
        return None;
    }
    let Some(&Arg::Tensor(input)) = node.args.first() else {
        return None;
    };
    let im = g.meta(input);
    let cm = kiln_functionalize::Meta::contiguous(im.dtype, im.sizes.clone());
    let mut va: Vec<Arg<&kiln_functionalize::Meta>> = vec![Arg::Tensor(&cm)];
    va.extend(node.args[1..].iter().map(|a| a.map(&mut |v| g.meta(*v))));
    let vm = kiln_functionalize::ops::infer(view, &va).ok()?.remove(0);
    (vm.offset == 0 && vm.numel() == im.numel() && vm.is_contiguous()).then_some(input)
}

/// The base a scatter node may write into in place: materialized, not an
/// output, read otherwise only before this kernel or inside it, and there
/// only where no other invocation writes (see `footprint`).
fn inplace_base(g: &Graph, s: &Schedule, outputs: &HashSet<ValueId>, n: NodeId) -> Option<ValueId> {
    let node = &g.nodes[n];
    // `index_put`'s one invocation walks the indexed positions in order;
    // `scatter` and `index_copy` in place write each source element once
    // (`Gen::scatter_sources`): in place when neither their indices nor
    // their values read the base's buffer (they would see the writes).
    let index_put = matches!(
        node.op.def().lowering,
        Lowering::IndexPut | Lowering::Map(Elem::ScatterInto { add: false, .. })
    );
    if !index_put {
        scatter_view(g, n)?;
    }
    let Some(&Arg::Tensor(base)) = node.args.first() else {
        return None;
    };
    // Bools and f16 values are packed several to a word, and a scatter's
    // invocations write single elements: they would race on shared words.
    if !s.is_materialized.contains(&base) || crate::wgsl::per_word(g.meta(base).dtype) > 1 {
        return None;
    }
    // Every value living in the base's buffer must be dead after this
    // kernel: read only before it, or here at the positions it overwrites.
    let root = s.root(base);
    // Outputs taken from the buffer at the end of the run must still find
    // their elements there.
    if s.pinned.contains(&root) || s.host_views.values().any(|&b| s.root(b) == root) {
        return None;
    }
    let mut sharing = s.sharing(root);
    if !sharing.contains(&base) {
        sharing.push(base);
    }
    let region = inlined_region(g, s, n);
    let pos = &s.pos;
    let alias_nodes: HashSet<NodeId> = s.alias_of.keys().filter_map(|&a| g.node_of(a)).collect();
    for &w in &sharing {
        if outputs.contains(&w) {
            return None;
        }
        let uses = s.uses.get(&w).cloned().unwrap_or_default();
        if w == base && uses.iter().filter(|&&u| u == n).count() != 1 {
            return None;
        }
        let ok = uses.iter().all(|&u| {
            (u == n && w == base)
                || alias_nodes.contains(&u)
                // Read inside this kernel (where the footprint check below
                // decides) and, through any chain of inlined ops, by
                // nothing outside it.
                || (w == base && region.contains(&u) && feeds_only(g, s, u, n, &region))
                || computed_before(g, s, pos, u, pos[&n])
        });
        if !ok {
            return None;
        }
    }
    if index_put {
        let reads_root = node.args[1..]
            .iter()
            .flat_map(|a| a.tensors())
            .flat_map(|&t| reads_value(g, s, t))
            .any(|r| s.root(r) == root);
        return (!reads_root).then_some(base);
    }
    footprint::inplace_race_free(g, s, n, base, root).then_some(base)
}

/// Do node `u`'s results reach only node `n` and nodes of `region`?
fn feeds_only(g: &Graph, s: &Schedule, u: NodeId, n: NodeId, region: &HashSet<NodeId>) -> bool {
    g.nodes[u].results.iter().all(|r| {
        !s.is_materialized.contains(r)
            && s.uses.get(r).is_none_or(|us| {
                us.iter()
                    .all(|&w| w == n || (region.contains(&w) && feeds_only(g, s, w, n, region)))
            })
    })
}

/// Is every kernel that computes node `u` (its own, or those it is inlined
/// into) one that runs before the node at position `limit`?
fn computed_before(
    g: &Graph,
    s: &Schedule,
    pos: &HashMap<NodeId, usize>,
    u: NodeId,
    limit: usize,
) -> bool {
    pos[&u] < limit
        && g.nodes[u].results.iter().all(|r| {
            s.is_materialized.contains(r)
                || s.uses
                    .get(r)
                    .is_none_or(|us| us.iter().all(|&w| computed_before(g, s, pos, w, limit)))
        })
}

#[cfg(test)]
mod tests {
    use super::AttentionTiles;

    /// The tiled attention kernel's split with the output projection:
    /// tiles and merge within WebGPU's 16 KiB, the workgroup within its
    /// size, none where a head group's tiles cannot fit.
    #[test]
    fn attention_tiles_fit_workgroup_memory() {
        let t = |sg, sq, heads, d| AttentionTiles::new(sg, 256, sq, d, d, Some(heads));
        // The 128 x 256 4-head workload: 8 keys of 4 heads of 64 (16 KiB).
        let w = t(None, 128, 4, 64).unwrap();
        assert_eq!((w.lanes, w.keys, w.rows, w.heads), (1, 8, 8, 4));
        assert_eq!(w.workgroups(128, 4), 16);
        // MiniLM's 12 heads of 32 with subgroups: 4 rows (192 invocations).
        let m = t(Some(32), 128, 12, 32).unwrap();
        assert_eq!((m.lanes, m.keys, m.rows), (4, 4, 4));
        assert_eq!(m.workgroups(128, 12 * 32), 32 * 32);
        // One query row (decoding) owns a workgroup of one row.
        assert_eq!(t(None, 1, 4, 64).unwrap().rows, 1);
        // 32 heads of 128: not even one key of each fits.
        assert_eq!(t(None, 128, 32, 128), None);
        for (sg, sq, heads, d) in [(None, 40, 3, 32), (Some(8), 77, 16, 64), (None, 5, 2, 128)] {
            let a = t(sg, sq, heads, d).unwrap();
            assert!(a.heads * a.keys * 2 * d * 4 <= 16384, "{a:?}");
            assert!(a.rows * d <= a.keys * 2 * d, "{a:?}");
            assert!(a.heads * a.rows * a.lanes <= 256, "{a:?}");
        }
        // One head a workgroup: the rows of a batch entry.
        let one = AttentionTiles::new(Some(32), 256, 128, 64, 64, None).unwrap();
        assert_eq!((one.lanes, one.keys, one.rows, one.heads), (4, 16, 64, 1));
    }
}
