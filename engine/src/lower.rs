//! Lowering a functional graph to a program: schedule, kernel groups,
//! lifetimes, packing, the arena layout, then code generation, each a
//! stage of its own (`lower`).

use crate::codegen::siblings::Shape;
use crate::codegen::{Gen, Loc, Window};
use crate::error::{statement_with, CompileError, Stage};
use crate::fusion::{independent, is_map, may_fault_in, JOIN_MAX_ELEMENTS};
use crate::kernel::{HostView, Val, ValueInfo};
use crate::wgsl::{self, Buf};
use crate::{plan, schedule, CompileOptions, Kernel, MemoryStats, Program};
use kiln_functionalize::graph::{Def, Graph, NodeId, ValueId};
use kiln_functionalize::ops::{Elem, Lowering};
use std::collections::{HashMap, HashSet};

mod sequence;

/// Elementwise results written over an input that dies in the same kernel
/// (the in-place ops of eager execution): each invocation reads the input
/// at its own index before writing the result there, so they can share a
/// buffer; or over a parameter no later kernel reads. Recorded as buffer
/// aliases in the schedule.
fn reuse_dying_inputs(
    g: &Graph,
    sched: &mut schedule::Schedule,
    groups: &[Vec<ValueId>],
    life: &Lifetimes,
    outputs: &[ValueId],
    packed: &dyn Fn(ValueId) -> bool,
    kept: &HashSet<ValueId>,
) {
    let (step, last) = (&life.step, &life.last);
    for grp in groups {
        if let Some(&rows) = sched.chains.get(&grp[0]) {
            reuse_in_row_kernel(g, sched, grp, rows, life, outputs, packed, kept);
            continue;
        }
        if !grp.iter().all(|&v| is_map(g, sched, v)) && folded_reduction(g, sched, grp).is_none() {
            continue;
        }
        let here = step[&grp[0]];
        let mut taken: Vec<ValueId> = vec![];
        for (i, &v) in grp.iter().enumerate() {
            let Def::Node(n, _) = g.values[v].def else {
                continue;
            };
            if !is_map(g, sched, v) {
                continue; // a folded reduction's result
            }
            if !sched.is_materialized.contains(&v) {
                continue; // kept in registers
            }
            // The inputs it reads, then parameters read only by earlier
            // kernels (dead here, their buffers idle until the end).
            let reads = schedule::reads(g, sched, n);
            let dead = g
                .inputs
                .iter()
                .copied()
                .filter(|p| !reads.contains(p) && last.get(p).is_some_and(|&l| l < here));
            let candidates: Vec<ValueId> = reads.iter().copied().chain(dead).collect();
            for u in candidates {
                let root = sched.root(u);
                if taken.contains(&root)
                    || !takeable(g, sched, life, outputs, packed, kept, here, u, v)
                {
                    continue;
                }
                // Other members of the kernel read it only at their own
                // element (codegen stores `v` after every member of that
                // element is computed) and do not read `v`.
                let others_read = grp.iter().enumerate().any(|(j, &w)| {
                    j != i
                        && g.node_of(w).is_some_and(|m| {
                            let reads = schedule::reads(g, sched, m);
                            reads.iter().any(|r| sched.root(*r) == root)
                                && (reads.contains(&v)
                                    || !crate::index::reads_only_at_own_index(g, sched, w, root))
                        })
                });
                if others_read {
                    continue;
                }
                // v reads it only at its own index.
                if !crate::index::reads_root_at_own_element(g, sched, v, root)
                    && !crate::footprint::reads_own_traced(g, sched, v, root)
                {
                    continue;
                }
                sched.alias_of.insert(v, u);
                taken.push(root);
                break;
            }
        }
    }
}

/// Can result `v` of the kernel at step `here` take input `u`'s buffer as
/// far as the buffer goes: not pinned or kept, the same elements in the
/// same layout (a packed bool result cannot take an f32 buffer: one word
/// would hold others' elements), everything living in it dying here and
/// no output, not made by this kernel. How the kernel reads it is the
/// caller's to check.
#[allow(clippy::too_many_arguments)]
fn takeable(
    g: &Graph,
    sched: &schedule::Schedule,
    life: &Lifetimes,
    outputs: &[ValueId],
    packed: &dyn Fn(ValueId) -> bool,
    kept: &HashSet<ValueId>,
    here: usize,
    u: ValueId,
    v: ValueId,
) -> bool {
    let root = sched.root(u);
    let same_layout = packed(root) == packed(v)
        && (!packed(v) || g.meta(u).dtype == g.meta(v).dtype)
        && g.meta(u).numel() == g.meta(v).numel();
    let dies = sched
        .sharing(root)
        .iter()
        .all(|w| !outputs.contains(w) && life.last.get(w).is_none_or(|&l| l <= here));
    !sched.pinned.contains(&root)
        && !kept.contains(&root)
        && same_layout
        && dies
        && life.step.get(&root).is_none_or(|&s| s != here)
}

/// `reuse_dying_inputs` for row kernel `grp` (`chain::chain_rows`, in
/// `rows` blocks): a stored value takes the buffer of an input of as many
/// elements, in its layout, dying here, that the kernel reads only within
/// each invocation's block (it stores its blocks last).
#[allow(clippy::too_many_arguments)]
fn reuse_in_row_kernel(
    g: &Graph,
    sched: &mut schedule::Schedule,
    grp: &[ValueId],
    rows: usize,
    life: &Lifetimes,
    outputs: &[ValueId],
    packed: &dyn Fn(ValueId) -> bool,
    kept: &HashSet<ValueId>,
) {
    let (step, last) = (&life.step, &life.last);
    let here = step[&grp[0]];
    let mut reads: Vec<ValueId> = grp
        .iter()
        .filter_map(|&v| g.node_of(v))
        .flat_map(|n| schedule::reads(g, sched, n))
        .filter(|r| !grp.contains(r))
        .collect();
    let dead: Vec<ValueId> = g
        .inputs
        .iter()
        .copied()
        .filter(|p| !reads.contains(p) && last.get(p).is_some_and(|&l| l < here))
        .collect();
    reads.extend(dead);
    let mut taken: Vec<ValueId> = vec![];
    for &v in grp {
        // Kept in registers, or stored through permuting copies at other
        // invocations' rows.
        if !sched.is_materialized.contains(&v) || sched.permuted.contains_key(&v) {
            continue;
        }
        for &u in &reads {
            let root = sched.root(u);
            if taken.contains(&root)
                || !takeable(g, sched, life, outputs, packed, kept, here, u, v)
                || !crate::chain::reads_by_rows(g, sched, grp, rows, root)
            {
                continue;
            }
            sched.alias_of.insert(v, u);
            taken.push(root);
            break;
        }
    }
}

/// Members of fused elementwise kernels and row kernels
/// (`chain::chain_rows`) that nothing outside their kernel reads: they stay in registers (no store, no buffer). Returned, and
/// taken out of the schedule's materialized values.
fn register_only(
    g: &Graph,
    sched: &mut schedule::Schedule,
    groups: &[Vec<ValueId>],
    outputs: &[ValueId],
) -> HashSet<ValueId> {
    let mut readers: HashMap<ValueId, Vec<ValueId>> = HashMap::new();
    for &w in &sched.materialized {
        if let Some(n) = g.node_of(w) {
            for r in schedule::reads(g, sched, n) {
                readers.entry(r).or_default().push(w);
            }
        }
    }
    let shared = sched.shared_buffers();
    let mut out = HashSet::new();
    let mut reshapes: Vec<ValueId> = vec![];
    for grp in groups.iter().filter(|grp| {
        grp.len() > 1 && (is_map(g, sched, grp[0]) || sched.chains.contains_key(&grp[0]))
    }) {
        for &v in grp {
            // A row kernel's value with reshapes sharing its buffer, read
            // only inside the kernel: the reshapes are read from its
            // registers too (`Gen::value_at`), and none is stored.
            let aliases: Vec<ValueId> = if sched.chains.contains_key(&grp[0]) {
                reshapes_alone(sched, v)
            } else {
                vec![]
            };
            let kept = outputs.contains(&v)
                || (shared.contains(&v) && aliases.is_empty())
                || sched.inplace.contains_key(&v)
                || aliases.iter().any(|a| outputs.contains(a));
            let rs: Vec<ValueId> = std::iter::once(v)
                .chain(aliases.iter().copied())
                .flat_map(|x| readers.get(&x).cloned().unwrap_or_default())
                .collect();
            if !kept && !rs.is_empty() && rs.iter().all(|w| grp.contains(w)) {
                out.insert(v);
                reshapes.extend(aliases);
            }
        }
    }
    for a in &reshapes {
        sched.alias_of.remove(a);
        sched.is_materialized.remove(a);
    }
    sched
        .materialized
        .retain(|v| !out.contains(v) && !reshapes.contains(v));
    for v in &out {
        sched.is_materialized.remove(v);
    }
    out
}

/// The reshapes sharing `v`'s buffer (`alias_of`) where that is all `v`
/// shares: no in-place write, host view or alias of `v` itself, none of
/// its reshapes shared further. Empty otherwise.
fn reshapes_alone(sched: &schedule::Schedule, v: ValueId) -> Vec<ValueId> {
    let aliases: Vec<ValueId> = sched
        .alias_of
        .iter()
        .filter(|(_, &b)| b == v)
        .map(|(&a, _)| a)
        .collect();
    let elsewhere = |x: ValueId| {
        sched.inplace.iter().any(|(&a, &b)| a == x || b == x)
            || sched.host_views.iter().any(|(&a, &b)| a == x || b == x)
    };
    let alone = !aliases.is_empty()
        && !sched.alias_of.contains_key(&v)
        && !elsewhere(v)
        && aliases
            .iter()
            .all(|&a| !elsewhere(a) && !sched.alias_of.values().any(|&b| b == a));
    if alone {
        aliases
    } else {
        vec![]
    }
}

/// Bindings the kernel computing `vals` takes, before placement
/// (`fusion::bindings_of` of the buffers it touches).
fn buffers_touched(
    g: &Graph,
    sched: &schedule::Schedule,
    vals: &[ValueId],
    window: Option<usize>,
) -> usize {
    crate::fusion::bindings_of(g, &roots_touched(g, sched, vals), window)
}

/// Those buffers (roots).
fn roots_touched(g: &Graph, sched: &schedule::Schedule, vals: &[ValueId]) -> HashSet<ValueId> {
    let mut roots: HashSet<ValueId> = HashSet::new();
    for &v in vals {
        roots.insert(sched.root(v));
        if let Some(n) = g.node_of(v) {
            roots.extend(
                schedule::reads(g, sched, n)
                    .into_iter()
                    .map(|r| sched.root(r)),
            );
        }
    }
    roots
}

/// The tensors (buffer, word, words) the kernels computing `grp` bind.
fn bound_ranges(
    g: &Graph,
    sched: &schedule::Schedule,
    grp: &[ValueId],
    registers: &HashSet<ValueId>,
    locs: &HashMap<ValueId, Loc>,
) -> HashSet<(Buf, usize, usize)> {
    let mut ranges: HashSet<(Buf, usize, usize)> = HashSet::new();
    let mut range = |v: ValueId| {
        if let Some(l) = locs.get(&v) {
            let m = g.meta(v);
            ranges.insert((l.buf, l.word, wgsl::words(m.dtype, m.numel(), l.packed)));
        }
    };
    for &v in grp {
        if !registers.contains(&v) {
            range(v);
        }
        let Some(n) = g.node_of(v) else { continue };
        for r in schedule::reads(g, sched, n) {
            range(r);
        }
    }
    ranges
}

/// The bindings of the kernel computing `grp`, decided on the IR before
/// any WGSL exists: the windows of the tensor ranges it reads or writes
/// (as codegen binds them: by location and size; `binding_windows`), and
/// how many storage bindings it takes: those, tensors past the device's
/// largest binding in pieces, and the status word where a statement of
/// the kernel may fault (i64 results, indices read from tensors). Codegen
/// binds at most this many.
fn planned_bindings(
    g: &Graph,
    sched: &schedule::Schedule,
    grp: &[ValueId],
    registers: &HashSet<ValueId>,
    locs: &HashMap<ValueId, Loc>,
    rules: crate::codegen::BindingRules,
) -> (Vec<Window>, usize) {
    let ranges = bound_ranges(g, sched, grp, registers, locs);
    let (windows, split) = binding_windows(&ranges, rules);
    let n = windows.len() + split + usize::from(may_fault_in(g, sched, grp));
    (windows, n)
}

/// The bindings of a kernel binding tensors `ranges` (buffer, word,
/// words): a tensor's binding starts at its word rounded down to the
/// device's alignment, and bindings of one buffer that overlap become one
/// covering them all (WebGPU forbids a writable binding overlapping
/// another of the dispatch; tensors packed closer than the alignment
/// share it). Tensors past the largest binding are bound in pieces of
/// their own: those bindings are counted, not listed.
fn binding_windows(
    ranges: &HashSet<(Buf, usize, usize)>,
    rules: crate::codegen::BindingRules,
) -> (Vec<Window>, usize) {
    let mut split = 0;
    let mut whole: Vec<Window> = vec![];
    for &(buf, word, words) in ranges {
        let span = rules.span(word, words);
        if span.chunks > 1 {
            split += span.chunks;
        } else {
            whole.push(Window {
                buf,
                start: span.start,
                end: word + words.max(1),
                tensors: 1,
            });
        }
    }
    whole.sort();
    let mut out: Vec<Window> = vec![];
    for w in whole {
        match out.last_mut() {
            Some(last) if last.buf == w.buf && w.start < last.end => {
                last.end = last.end.max(w.end);
                last.tensors += 1;
            }
            _ => out.push(w),
        }
    }
    (out, split)
}

/// Tensor ranges (buffer, word, words) the elementwise kernel computing
/// `grp` may bind as `vec4<u32>`, four elements an invocation: word-sized
/// tensors at a binding-aligned word in one binding, read by every member
/// only at the invocation's own element, or lane to lane in aligned quads
/// where the kernel writes no element of theirs (decided on the index
/// maps).
/// Empty when the kernel is no elementwise one or cannot take vectors
/// (packed values, a count not a multiple of 4).
fn vec4_ranges(
    g: &Graph,
    sched: &schedule::Schedule,
    grp: &[ValueId],
    registers: &HashSet<ValueId>,
    locs: &HashMap<ValueId, Loc>,
    windows: &[Window],
    options: &CompileOptions,
) -> HashSet<(Buf, usize, usize)> {
    let mut out = HashSet::new();
    let count = g.meta(grp[0]).numel();
    let word_sized = grp
        .iter()
        .all(|&v| wgsl::per_word(g.meta(v).dtype) == 1 && !locs.get(&v).is_some_and(|l| l.packed));
    if !options.vectorize
        || !is_map(g, sched, grp[0])
        || folded_reduction(g, sched, grp).is_some()
        || !word_sized
        || count < 4
        || !count.is_multiple_of(4)
    {
        return out;
    }
    let rules = options.rules;
    let key = |v: ValueId| -> Option<(Buf, usize, usize)> {
        let l = locs.get(&v)?;
        let words = g.meta(v).numel();
        let span = rules.span(l.word, words);
        // A binding of its own, from its first word.
        let alone = Window {
            buf: l.buf,
            start: l.word,
            end: l.word + words.max(1),
            tensors: 1,
        };
        let aligned = span.start == l.word && span.chunks == 1 && windows.contains(&alone);
        (aligned && !l.packed && wgsl::per_word(g.meta(v).dtype) == 1)
            .then_some((l.buf, l.word, words))
    };
    // Sources of transposing views read as a block's column quads.
    let blocked: Vec<ValueId> = if options.blocks_transposes() {
        crate::codegen::transposed_blocks(g, sched, locs, grp)
            .map(|b| b.sources().collect())
            .unwrap_or_default()
    } else {
        vec![]
    };
    let mut refused = HashSet::new();
    let mut consider =
        |k: Option<(Buf, usize, usize)>, ok: bool, at: Option<(Buf, usize, usize)>| match k {
            Some(k) if ok => {
                out.insert(k);
            }
            _ => {
                refused.extend(at);
            }
        };
    for &v in grp {
        if !registers.contains(&v) {
            let at = locs.get(&v).map(|l| (l.buf, l.word, g.meta(v).numel()));
            consider(key(v), true, at);
        }
        let Some(n) = g.node_of(v) else { continue };
        for r in schedule::reads(g, sched, n) {
            // Members are read from registers; every other value living in
            // the buffer is loaded (as a vector, before any store).
            let root = sched.root(r);
            let own = grp
                .iter()
                .all(|&w| crate::index::reads_only_at_own_index(g, sched, w, root));
            // A buffer the kernel does not write, read lane to lane in
            // aligned quads (a row broadcast): a vector load a quad.
            let quads = || {
                g.meta(r).numel().is_multiple_of(4)
                    && grp.iter().all(|&w| sched.root(w) != root)
                    && grp
                        .iter()
                        .all(|&w| crate::index::reads_in_quads(g, sched, w, root))
            };
            let at = locs.get(&r).map(|l| (l.buf, l.word, g.meta(r).numel()));
            consider(key(r), own || quads() || blocked.contains(&r), at);
        }
    }
    out.retain(|k| !refused.contains(k));
    out
}

/// The inlined producer, in the kernel computing `grp`, whose
/// materialization saves the most bindings: the buffers it reads that the
/// kernel does not otherwise read directly, less the one it adds. `None`
/// when no producer saves any.
fn producer_to_materialize(
    g: &Graph,
    sched: &schedule::Schedule,
    grp: &[ValueId],
    force: &HashSet<ValueId>,
) -> Option<ValueId> {
    let mut direct: HashSet<ValueId> = grp.iter().map(|&v| sched.root(v)).collect();
    let mut stack = vec![];
    for &v in grp {
        if let Some(n) = g.node_of(v) {
            for u in g.nodes[n].inputs() {
                if sched.is_materialized.contains(&u) {
                    direct.insert(sched.root(u));
                } else {
                    stack.push(u);
                }
            }
        }
    }
    let mut best: Option<(usize, ValueId)> = None;
    let mut seen = HashSet::new();
    while let Some(u) = stack.pop() {
        if sched.is_materialized.contains(&u) || grp.contains(&u) || !seen.insert(u) {
            continue;
        }
        let own: HashSet<ValueId> = schedule::reads_value(g, sched, u)
            .into_iter()
            .map(|r| sched.root(r))
            .filter(|r| !direct.contains(r))
            .collect();
        // A producer asked for before and still inlined (an operand the
        // product reads in place whatever is asked) is passed over.
        if own.len() >= 2 && !force.contains(&u) && best.is_none_or(|(b, _)| own.len() > b) {
            best = Some((own.len(), u));
        }
        if let Some(m) = g.node_of(u) {
            stack.extend(g.nodes[m].inputs());
        }
    }
    best.map(|(_, u)| u)
}

/// Arithmetic of the kernel computing `grp`: 2 M N K for matrix products
/// (M N = output elements, K the contracted size), one operation per
/// element and source op otherwise.
fn kernel_flops(
    g: &Graph,
    sched: &schedule::Schedule,
    grp: &[ValueId],
    ops: usize,
    elements: usize,
) -> usize {
    if let [v] = grp {
        match sched.fused.get(v) {
            Some(
                &schedule::Fused::Epilogue { product }
                | &schedule::Fused::Rows { reduction: product },
            ) => {
                // A product's 2 M N K (and its twin's), or one operation per
                // element for a row kernel or reduction; then one per element
                // and tail op.
                let twin = sched
                    .twins
                    .get(&product)
                    .map(|&t| crate::fusion::product_flops(g, t));
                return crate::fusion::product_flops(g, product).unwrap_or(elements)
                    + twin.flatten().unwrap_or(0)
                    + ops.saturating_sub(1 + twin.is_some() as usize) * elements;
            }
            Some(&schedule::Fused::Attention {
                scores,
                product,
                q_proj,
                o_proj,
                ..
            }) => {
                let projections: usize = q_proj
                    .into_iter()
                    .chain(o_proj)
                    .filter_map(|p| crate::fusion::product_flops(g, p))
                    .sum();
                return crate::fusion::product_flops(g, scores).unwrap_or(0)
                    + crate::fusion::product_flops(g, product).unwrap_or(0)
                    + projections
                    + ops.saturating_sub(2) * g.meta(g.nodes[scores].results[0]).numel();
            }
            None => {}
        }
        if let Some(n) = g.node_of(*v) {
            if let Some(f) = crate::fusion::product_flops(g, n) {
                return f;
            }
            let node = &g.nodes[n];
            // Reductions and row kernels: per input element.
            if let Some(&x) = node.args.first().and_then(|a| a.tensors().first().copied()) {
                return ops * g.meta(x).numel().max(g.meta(*v).numel());
            }
        }
    }
    ops * elements
}

/// What the compiled program answers for: the source program (for its
/// eager peak), the values returned (outputs, then mutated parameters'
/// final values), how many are outputs, the parameter each of the rest
/// writes back to.
#[derive(Clone, Copy)]
pub(crate) struct Interface<'a> {
    pub src: &'a Graph,
    pub outputs: &'a [ValueId],
    pub n_outputs: usize,
    pub mutated_inputs: &'a [usize],
}

/// Where each value lives and how big the arena is.
struct Layout {
    locs: HashMap<ValueId, Loc>,
    /// Buffers (roots) given no arena words (`Grouping::workgroup_only`):
    /// their locations are placeholders no kernel binds.
    workgroup_only: HashSet<ValueId>,
    /// Words of each parameter's buffer.
    param_words: Vec<usize>,
    plan: plan::MemoryPlan,
}

/// Lifetimes in steps (one step per kernel group).
struct Lifetimes {
    /// The step computing each kernel result.
    step: HashMap<ValueId, usize>,
    /// The last step reading each value (outputs: past the end).
    last: HashMap<ValueId, usize>,
    /// What a run reads back: materialized outputs, and the buffers the
    /// other outputs are views of.
    readback: Vec<ValueId>,
}

/// Bools, int8 and f16 values are packed (bytes and half words, as in
/// eager memory): inputs (uploaded by the host), elementwise results
/// (each invocation owns whole words), and the results of products, row
/// kernels and reductions (a word gathered and stored once where an
/// invocation stores whole rows or blocks, `Gen::stores_runs`; else each
/// lane set in an atomic binding, `wgsl::store_lane`). Scatters and the
/// other kernels write a word per element.
struct Packing {
    written: HashSet<ValueId>,
}

impl Packing {
    fn of(g: &Graph, sched: &schedule::Schedule, groups: &[Vec<ValueId>]) -> Packing {
        let written = groups
            .iter()
            .flat_map(|grp| {
                let map = is_map(g, sched, grp[0]);
                grp.iter()
                    .copied()
                    .filter(move |&v| map || stores_lanes(g, sched, v))
            })
            .collect();
        Packing { written }
    }

    fn packed(&self, g: &Graph, v: ValueId) -> bool {
        wgsl::per_word(g.meta(v).dtype) > 1 && (g.inputs.contains(&v) || self.written.contains(&v))
    }

    /// Bytes of `v`'s buffer (its root's packing).
    fn bytes(&self, g: &Graph, sched: &schedule::Schedule, v: ValueId) -> usize {
        wgsl::words(
            g.meta(v).dtype,
            g.meta(v).numel(),
            self.packed(g, sched.root(v)),
        ) * 4
    }
}

/// Is `v` stored by a product, row or reduction kernel (its own, or the
/// one it is the epilogue of), whose stores go through `Gen::store_plain`
/// and so may set single lanes of packed words?
fn stores_lanes(g: &Graph, sched: &schedule::Schedule, v: ValueId) -> bool {
    let n = match sched.fused.get(&v) {
        Some(schedule::Fused::Epilogue { product: n } | schedule::Fused::Rows { reduction: n }) => {
            Some(*n)
        }
        Some(schedule::Fused::Attention { product, .. }) => Some(*product),
        None => g.node_of(v),
    };
    n.is_some_and(|n| {
        !sched.inplace.contains_key(&v)
            && matches!(
                g.nodes[n].op.def().lowering,
                Lowering::Reduce(_)
                    | Lowering::Softmax { .. }
                    | Lowering::LayerNorm
                    | Lowering::MatMul(_)
                    | Lowering::Attention
            )
    })
}

/// The kernel plan of a functional graph: the schedule, kernel groups,
/// values kept in registers, lifetimes, packing, the arena layout and the
/// storage bindings of every kernel, all decided before any WGSL exists.
/// Code generation renders it and fails for no legality reason.
pub(crate) struct KernelPlan {
    sched: schedule::Schedule,
    groups: Vec<Vec<ValueId>>,
    /// Elementwise kernels sharing a launch (`join_map_launches`): their
    /// groups, by index, and the windows they bind together.
    launches: Vec<Launch>,
    /// Dying inputs whose buffers a result took, keeping kernels that read
    /// them from sharing a launch with it (`join_map_launches`).
    joins_blocked: HashSet<ValueId>,
    /// Values read by a kernel whose buffer a later kernel's result took
    /// (placed over them once they died), keeping the two from sharing a
    /// launch: each -> that result.
    joins_overlapped: HashMap<ValueId, ValueId>,
    registers: HashSet<ValueId>,
    life: Lifetimes,
    packing: Packing,
    layout: Layout,
    /// Storage bindings each group's kernels take at most.
    bindings: Vec<usize>,
    /// The windows each group's kernels bind (`binding_windows`).
    windows: Vec<Vec<Window>>,
    /// Tensor ranges each group's kernel binds as vectors (`vec4_ranges`).
    vec4: Vec<HashSet<(Buf, usize, usize)>>,
    /// See `Grouping::workgroup_words`.
    workgroup_words: HashMap<ValueId, usize>,
}

impl KernelPlan {
    /// Kernels it runs (kernels sharing a launch counted as one).
    pub fn kernels(&self) -> usize {
        self.launches.len()
    }

    /// Layer norms computed by a kernel of their own (no row kernel, no
    /// other value with them).
    pub fn lone_norms(&self, g: &Graph) -> HashSet<ValueId> {
        self.groups
            .iter()
            .filter_map(|grp| match grp[..] {
                [v] if !self.sched.chains.contains_key(&v) => Some(v),
                _ => None,
            })
            .filter(|&v| {
                g.node_of(v)
                    .is_some_and(|n| matches!(g.nodes[n].op.def().lowering, Lowering::LayerNorm))
            })
            .collect()
    }

    /// See `KernelPlan::joins_blocked`.
    pub fn joins_blocked(&self) -> &HashSet<ValueId> {
        &self.joins_blocked
    }

    /// See `KernelPlan::joins_overlapped`.
    pub fn joins_overlapped(&self) -> &HashMap<ValueId, ValueId> {
        &self.joins_overlapped
    }

    /// Bytes its kernels move (`Program::bytes_moved` of the result).
    pub fn bytes_moved(&self, g: &Graph) -> usize {
        self.launches
            .iter()
            .map(|Launch { members, .. }| {
                let c = launch_cost(
                    g,
                    &self.sched,
                    &self.groups,
                    members,
                    &self.registers,
                    &self.packing,
                );
                c.bytes_read + c.written
            })
            .sum()
    }

    /// The planned peak: parameters and outputs' own buffers (io) and
    /// the arena (`MemoryStats::planned_peak`).
    pub fn planned_peak(&self) -> usize {
        self.layout.param_words.iter().sum::<usize>() * 4 + self.layout.plan.arena_bytes
    }
}

pub(crate) enum Planned {
    Ready(Box<KernelPlan>),
    /// A kernel binds more buffers than the device allows: plan again with
    /// this inlined producer computed by a kernel of its own.
    Materialize(ValueId),
    /// Kernels grouped into one launch bind more buffers than the device
    /// allows together: plan again with each in a launch of its own.
    Apart(Vec<ValueId>),
    /// Kernels grouped counting their small tensors as one binding bind
    /// more: group them again counting a binding per buffer.
    Counted(Vec<ValueId>),
}

/// Plans the kernels of functional graph `g` (the stages below), checking
/// each kernel's bindings against the device's limit.
pub(crate) fn plan(
    g: &Graph,
    io: &Interface,
    options: &CompileOptions,
    force: &HashSet<ValueId>,
    grouping: &Grouping,
) -> Result<Planned, CompileError> {
    let outputs = io.outputs;
    let pinned: HashSet<ValueId> = options.constants.iter().map(|&i| g.inputs[i]).collect();
    let mut sched = schedule::schedule(g, outputs, pinned, force, options, &grouping.narrow_norms)?;
    check_buffer_sizes(g, &sched, options)?;
    let mut groups = group_kernels(g, &sched, options, grouping)?;
    let out_set: HashSet<ValueId> = outputs.iter().copied().collect();
    sched.chains = crate::chain::chain_rows(
        g,
        &sched,
        options,
        &|v| {
            grouping.apart.contains_key(&v)
                || grouping.rows_in_order && sched.permuted.contains_key(&v)
        },
        &|vals| grouping.window(options, vals),
        &out_set,
        &mut groups,
    );
    let registers = register_only(g, &mut sched, &groups, outputs);
    let life = lifetimes(g, &sched, &groups, outputs, &grouping.live_until);
    let packing = Packing::of(g, &sched, &groups);
    reuse_dying_inputs(
        g,
        &mut sched,
        &groups,
        &life,
        outputs,
        &|v| packing.packed(g, v),
        &grouping.keep_inputs,
    );
    let layout = place(
        g,
        &sched,
        &groups,
        &life,
        &packing,
        options,
        &grouping.workgroup_only,
    )?;
    let mut bindings = vec![];
    let mut windows: Vec<Vec<Window>> = vec![];
    for grp in &groups {
        let (w, n) = planned_bindings(g, &sched, grp, &registers, &layout.locs, options.rules);
        if n > options.max_bindings {
            if grp.iter().any(|v| !grouping.counted.contains(v)) {
                return Ok(Planned::Counted(grp.clone()));
            }
            if grp.len() > 1
                && (!is_map(g, &sched, grp[0]) || folded_reduction(g, &sched, grp).is_some())
            {
                return Ok(Planned::Apart(grp.clone()));
            }
            if let Some(u) = producer_to_materialize(g, &sched, grp, force) {
                return Ok(Planned::Materialize(u));
            }
            // Last, every kernel counting a binding per buffer (a plan
            // placing this kernel's tensors closer).
            let rest: Vec<ValueId> = (sched.materialized.iter().copied())
                .filter(|v| !grouping.counted.contains(v))
                .collect();
            if !rest.is_empty() {
                return Ok(Planned::Counted(rest));
            }
            let names = kiln_functionalize::text::Names::of(g);
            return Err(CompileError::TooManyBindings {
                values: grp.iter().map(|&v| format!("%{}", names.get(v))).collect(),
                bindings: n,
                limit: options.max_bindings,
            });
        }
        bindings.push(n);
        windows.push(w);
    }
    let vec4: Vec<_> = groups
        .iter()
        .zip(&windows)
        .map(|(grp, w)| vec4_ranges(g, &sched, grp, &registers, &layout.locs, w, options))
        .collect();
    let (launches, joins_blocked, joins_overlapped) = join_map_launches(
        g,
        &sched,
        options,
        grouping,
        &groups,
        &registers,
        &layout.locs,
        &vec4,
    );
    Ok(Planned::Ready(Box::new(KernelPlan {
        sched,
        groups,
        launches,
        joins_blocked,
        joins_overlapped,
        registers,
        life,
        packing,
        layout,
        bindings,
        windows,
        vec4,
        workgroup_words: grouping.workgroup_words.clone(),
    })))
}

/// Generated kernel `code` with its cost, checked against its plan: no
/// writable binding overlapping another, at most `planned` bindings.
fn checked_kernel(
    code: crate::kernel::KernelCode,
    planned: usize,
    cost: &KernelCost,
    flops: usize,
) -> Result<Kernel, CompileError> {
    check_bindings_apart(&code)?;
    if code.bindings.len() > planned {
        return Err(CompileError::internal(
            Stage::Codegen,
            format!(
                "kernel {} binds {} storage buffers, its plan {planned}",
                code.label,
                code.bindings.len()
            ),
        ));
    }
    Ok(Kernel {
        code,
        ops: cost.ops.clone(),
        bytes_read: cost.bytes_read,
        bytes_written: cost.written,
        flops,
    })
}

/// Renders the kernels of `plan` as WGSL and assembles the program.
pub(crate) fn generate(
    g: &Graph,
    options: &CompileOptions,
    plan: KernelPlan,
) -> Result<Generated, CompileError> {
    let KernelPlan {
        sched,
        groups,
        launches,
        joins_blocked: _,
        joins_overlapped: _,
        registers,
        life,
        packing,
        layout,
        bindings,
        windows,
        vec4,
        workgroup_words,
    } = plan;
    let mut gen = Gen::new(g, &sched, &layout.locs);
    gen.registers = registers.clone();
    gen.tile_min_rows = options.tile_min_rows;
    gen.tall_tiles_from = options.tall_tiles_from;
    gen.workgroup_rows = options.workgroup_rows;
    gen.tile_transposes = options.tile_transposes;
    gen.transpose_tile = options.transpose_tile;
    gen.transpose_blocks = options.blocks_transposes();
    gen.wide_blocks = options.wide_blocks;
    gen.workgroup = options.workgroup;
    gen.grid_stride = options.grid_stride;
    gen.subgroup = options.subgroup;
    gen.attention_rows = options.attention_rows;
    gen.shader_f16 = options.shader_f16;
    gen.vectorize = options.vectorize;
    gen.rules = options.rules;
    // The i64 overflow word (`wgsl::ty`) in a binding-aligned slot of its
    // own after the intermediates.
    let align = options.rules.align_words;
    gen.status = Some(layout.plan.arena_bytes.div_ceil(4).div_ceil(align) * align);
    let mut kernels = vec![];
    let mut vec4: Vec<Option<_>> = vec4.into_iter().map(Some).collect();
    let mut windows: Vec<Option<_>> = windows.into_iter().map(Some).collect();
    // Workgroup memory placed by this plan's arena words, or by those of
    // the plan it was made again from.
    let words = match workgroup_words.is_empty() {
        true => arena_words_of(&layout),
        false => workgroup_words,
    };
    let e = Emit {
        g,
        sched: &sched,
        groups: &groups,
        registers: &registers,
        packing: &packing,
        layout: &layout,
        workgroup_words: &words,
    };
    // Small programs' kernels in sequence in one workgroup where they
    // can (`sequence`), the others a launch each.
    let members: Vec<Vec<usize>> = launches.iter().map(|l| l.members.clone()).collect();
    let segments = match options.sequence {
        true => sequence::segments(&e, &members, options),
        false => vec![],
    };
    let mut arena_end = 0;
    let mut workgroup_only = HashSet::new();
    let mut launches: Vec<Option<Launch>> = launches.into_iter().map(Some).collect();
    let mut at = 0;
    while at < launches.len() {
        let seg = segments.iter().find(|s| s.contains(&at) && s.end - at > 1);
        if let Some(seg) = seg {
            if let Some(done) = sequence::emit(&e, &mut gen, &life, &members, at..seg.end, options)?
            {
                kernels.push(done.kernel);
                arena_end = arena_end.max(done.arena_words);
                workgroup_only.extend(done.alone);
                at = done.end;
                continue;
            }
        }
        let Some(l) = launches[at].take() else {
            return Err(CompileError::internal(
                Stage::Codegen,
                "a launch generated twice",
            ));
        };
        kernels.extend(e.launch(&mut gen, l, &bindings, &mut vec4, &mut windows)?);
        at += 1;
    }
    let status_word = gen.status.filter(|_| gen.status_used);
    let apart = std::mem::take(&mut gen.apart);
    drop(gen);
    Ok(Generated {
        kernels,
        readback: life.readback,
        layout,
        status_word,
        sched,
        apart,
        arena_end,
        workgroup_only,
        workgroup_words: words,
    })
}

/// The arena word of every value placed there (a version at its buffer's).
fn arena_words_of(layout: &Layout) -> HashMap<ValueId, usize> {
    layout
        .locs
        .iter()
        .filter(|(_, l)| l.buf == Buf::Arena)
        .map(|(&v, l)| (v, l.word))
        .collect()
}

/// Tensor ranges a kernel binds as vectors (`vec4_ranges`).
type VectorRanges = HashSet<(Buf, usize, usize)>;

/// What generating a plan's launches reads of it.
struct Emit<'p> {
    g: &'p Graph,
    sched: &'p schedule::Schedule,
    groups: &'p [Vec<ValueId>],
    registers: &'p HashSet<ValueId>,
    packing: &'p Packing,
    layout: &'p Layout,
    /// Where kernels in sequence keep each arena value in workgroup memory
    /// (`Grouping::workgroup_words`).
    workgroup_words: &'p HashMap<ValueId, usize>,
}

impl Emit<'_> {
    /// The kernels of one launch.
    fn launch(
        &self,
        gen: &mut Gen,
        launch: Launch,
        bindings: &[usize],
        vec4: &mut [Option<VectorRanges>],
        windows: &mut [Option<Vec<Window>>],
    ) -> Result<Vec<Kernel>, CompileError> {
        let Emit {
            g,
            sched,
            groups,
            registers,
            packing,
            layout,
            workgroup_words: _,
        } = *self;
        let Launch {
            members,
            windows: launch_windows,
            bindings: launch_bindings,
        } = launch;
        let mut kernels = vec![];
        if let [_, _, ..] = members[..] {
            // Elementwise kernels sharing a launch (and at most one of
            // another kind).
            gen.vec4_ranges = HashSet::new();
            gen.windows = launch_windows;
            gen.lane_stores = vec![];
            let units: Vec<&[ValueId]> = members.iter().map(|&i| &groups[i][..]).collect();
            let launched = gen
                .map_launch(&units)
                .map_err(|e| at_value(e, g, units[0][0]))?;
            for (vals, codes) in launched {
                let mine = || units.iter().filter(|u| vals.contains(&u[0])).copied();
                let cost = KernelCost::launch(g, sched, mine(), registers, packing);
                let flops = mine()
                    .map(|u| {
                        let c = KernelCost::of(g, sched, u, registers, packing);
                        kernel_flops(g, sched, u, c.ops.len(), c.elements)
                    })
                    .sum();
                for code in codes {
                    kernels.push(checked_kernel(code, launch_bindings, &cost, flops)?);
                }
            }
            return Ok(kernels);
        }
        let i = members[0];
        let (grp, planned) = (&groups[i], bindings[i]);
        gen.vec4_ranges = vec4[i].take().unwrap_or_default();
        gen.windows = windows[i].take().unwrap_or_default();
        let folded = folded_reduction(g, sched, grp);
        gen.lane_stores = grp
            .iter()
            .filter(|&&v| stores_lanes_in(g, sched, packing, grp, v))
            .filter_map(|v| layout.locs.get(v).copied())
            .collect();
        // The kernels of the group, each with the values it computes: one
        // launch, or where independent kernels cannot share one, a launch
        // each.
        let units: Vec<(Vec<ValueId>, Vec<crate::kernel::KernelCode>)> =
            if let Some(&rows) = sched.chains.get(&grp[0]) {
                let code = gen
                    .row_chain(grp, rows)
                    .map_err(|e| at_value(e, g, grp[0]))?;
                vec![(grp.clone(), vec![code])]
            } else if let Some(r) = folded {
                gen.prologue = grp[..grp.len() - 1].to_vec();
                let codes = gen.kernel(r).map_err(|e| at_value(e, g, r));
                gen.prologue.clear();
                vec![(grp.clone(), codes?)]
            } else if is_map(g, sched, grp[0]) {
                let codes = if g.meta(grp[0]).numel() == 0 {
                    vec![]
                } else {
                    vec![gen.map_group(grp).map_err(|e| at_value(e, g, grp[0]))?]
                };
                vec![(grp.clone(), codes)]
            } else if grp.len() > 1 {
                gen.siblings(grp).map_err(|e| at_value(e, g, grp[0]))?
            } else {
                vec![(
                    grp.clone(),
                    gen.kernel(grp[0]).map_err(|e| at_value(e, g, grp[0]))?,
                )]
            };
        for (vals, codes) in units {
            let cost = KernelCost::of(g, sched, &vals, registers, packing);
            // Kernels sharing a launch (sibling products) or a row kernel:
            // each value's own.
            let flops = if vals.len() > 1 && !is_map(g, sched, vals[0]) {
                vals.iter()
                    .map(|&v| {
                        let c = KernelCost::of(g, sched, &[v], registers, packing);
                        kernel_flops(g, sched, &[v], c.ops.len(), c.elements)
                    })
                    .sum()
            } else {
                kernel_flops(g, sched, &vals, cost.ops.len(), cost.elements)
            };
            for code in codes {
                kernels.push(checked_kernel(code, planned, &cost, flops)?);
            }
        }
        Ok(kernels)
    }
}

/// `e`, naming the statement computing `v` where it names none.
fn at_value(e: CompileError, g: &Graph, v: ValueId) -> CompileError {
    match g.node_of(v) {
        Some(n) => e.at(g, n),
        None => e,
    }
}

/// Every tensor with a buffer fits in one.
fn check_buffer_sizes(
    g: &Graph,
    sched: &schedule::Schedule,
    options: &CompileOptions,
) -> Result<(), CompileError> {
    for &v in g.inputs.iter().chain(&sched.materialized) {
        let bytes = g.meta(v).numel().saturating_mul(4);
        if bytes > options.max_buffer_bytes {
            return Err(CompileError::TooLarge {
                value: kiln_functionalize::text::Names::of(g).get(v),
                ty: g.meta(v).type_string(),
                what: format!(
                    "takes {bytes} bytes on the GPU (4 an element); this device's largest buffer \
                     is {} bytes",
                    options.max_buffer_bytes
                ),
            });
        }
    }
    Ok(())
}

/// How `group_kernels` groups kernels into launches.
#[derive(Default, Clone)]
pub(crate) struct Grouping {
    /// Kernels an earlier plan found of other launch shapes (`Gen::apart`),
    /// or (`None`) binding too many buffers with their group: a launch of
    /// their own.
    pub apart: HashMap<ValueId, Shape>,
    /// Launches back a kernel may look for one to join (moving ahead of
    /// the independent kernels between): 1, the last only, or more.
    pub lookback: usize,
    /// May an elementwise kernel move ahead of elementwise kernels (or
    /// only of kernels of other kinds)?
    pub maps_past_maps: bool,
    /// Buffers (roots) of inputs dying in a kernel that keep them (no
    /// result written over them, `reuse_dying_inputs`), so that kernels
    /// reading them share a launch with the one they die in.
    pub keep_inputs: HashSet<ValueId>,
    /// Values kept alive (their buffers not reused) until the kernel
    /// computing the value they map to, so that a kernel reading them can
    /// share a launch with that later one (`join_map_launches`).
    pub live_until: HashMap<ValueId, ValueId>,
    /// Row kernels store no value through permuting copies (`chain::link`):
    /// such a value takes no dying input's buffer, which a plan above
    /// eager's peak may need.
    pub rows_in_order: bool,
    /// Values of kernels an earlier plan found over the device's bindings
    /// though their small tensors were counted as one binding
    /// (`buffers_touched`): grouped counting a binding per buffer.
    pub counted: HashSet<ValueId>,
    /// Kernels other than elementwise ones and sibling products take a
    /// launch each (as without `CompileOptions::share_launches`): where
    /// the results of kernels sharing a launch, alive together, hold more
    /// memory than eager's peak.
    pub launch_each: bool,
    /// Layer norms computed by the products reading them even where those
    /// are narrow (`Schedule::norm_operands`): norms an earlier plan ran
    /// as kernels of their own (`KernelPlan::lone_norms`).
    pub narrow_norms: HashSet<ValueId>,
    /// Buffers (roots) an earlier plan's kernels in sequence kept in
    /// workgroup memory alone (`Generated::workgroup_only`): no arena words
    /// of their own.
    pub workgroup_only: HashSet<ValueId>,
    /// That earlier plan's arena word of every buffer (root): where kernels
    /// in sequence keep values in workgroup memory (buffers alive together
    /// are apart there), so that planning the arena again without the
    /// buffers above moves none of them. Empty: this plan's own words.
    pub workgroup_words: HashMap<ValueId, usize>,
}

impl Grouping {
    /// The binding alignment in bytes under which kernels computing
    /// `vals` count their small tensors as one binding
    /// (`fusion::bindings_of`): `None` where one of them is `counted`.
    pub fn window(&self, options: &CompileOptions, vals: &[ValueId]) -> Option<usize> {
        (!vals.iter().any(|v| self.counted.contains(v))).then_some(options.rules.align_words * 4)
    }
}

/// The lookback tried first (a bound on the search, not on correctness).
pub(crate) const LAUNCH_LOOKBACK: usize = 8;

/// Kernels: consecutive elementwise values of one shape fuse into one
/// multi-output kernel; other kernels share a launch where they are
/// siblings or independent (`sibling_product`, `independent`), a kernel
/// moving ahead of independent ones to join an earlier launch; everything
/// else is a kernel of its own.
fn group_kernels(
    g: &Graph,
    sched: &schedule::Schedule,
    options: &CompileOptions,
    grouping: &Grouping,
) -> Result<Vec<Vec<ValueId>>, CompileError> {
    let apart = &grouping.apart;
    // Kernels an earlier plan found of other launch shapes stay apart.
    let same_shape = |a: ValueId, b: ValueId| match (apart.get(&a), apart.get(&b)) {
        (None, None) => true,
        (Some(Some(x)), Some(Some(y))) => x == y,
        _ => false,
    };
    let share = options.share_launches && !grouping.launch_each;
    let mut groups: Vec<Vec<ValueId>> = vec![];
    for &v in &sched.materialized {
        let Def::Node(n, _) = g.values[v].def else {
            continue;
        };
        schedule::class(g, n)?;
        let map = is_map(g, sched, v);
        let joins = |grp: &Vec<ValueId>| {
            let mut all = grp.clone();
            all.push(v);
            buffers_touched(g, sched, &all, grouping.window(options, &all))
                + usize::from(!map && may_fault_in(g, sched, &all))
                <= options.max_bindings
                && if map {
                    is_map(g, sched, grp[0])
                        && folded_reduction(g, sched, grp).is_none()
                        && crate::index::fits_group(g, sched, grp, v)
                } else {
                    !is_map(g, sched, grp[0])
                        && same_shape(grp[0], v)
                        && (sibling_product(g, sched, grp, v)
                            || share && independent(g, sched, grp, v))
                }
        };
        // A kernel may join an earlier one, moving ahead of kernels it is
        // independent of: an elementwise one the elementwise kernel before
        // kernels of other kinds (`u32_buffers`: a map past an in-place
        // update of another parameter), any other one a launch.
        let reach = if map || share {
            grouping.lookback.max(1)
        } else {
            1
        };
        // A kernel of another kind goes to the launch reading most of
        // what it reads (`decode_step`: the reductions of the logits
        // together, past a sort of one's result), the latest on ties.
        let read_by = |vs: &[ValueId]| -> HashSet<ValueId> {
            vs.iter()
                .filter_map(|&x| g.node_of(x))
                .flat_map(|m| schedule::reads(g, sched, m))
                .map(|b| sched.root(b))
                .collect()
        };
        let mine = read_by(&[v]);
        let mut at: Option<(usize, usize)> = None;
        // An elementwise kernel joining none goes right after the latest
        // kernel of another kind reading what it reads, to share its
        // launch (`join_map_launches`; `upsampling`: a resize of the skip
        // connection beside the convolution reading it).
        let mut beside: Option<usize> = None;
        for (j, grp) in groups.iter().enumerate().rev().take(reach) {
            if map
                && beside.is_none()
                && options.share_launches
                && !is_map(g, sched, grp[0])
                && !read_by(grp).is_disjoint(&mine)
            {
                beside = Some(j);
            }
            if joins(grp) {
                if map {
                    at = Some((j, 0));
                    break;
                }
                let shared: usize = read_by(grp)
                    .intersection(&mine)
                    .map(|&b| wgsl::words(g.meta(b).dtype, g.meta(b).numel(), false))
                    .sum();
                if at.is_none_or(|(_, most)| shared > most) {
                    at = Some((j, shared));
                }
            }
            let past_map = map && !grouping.maps_past_maps && is_map(g, sched, grp[0]);
            if !independent(g, sched, grp, v) || past_map {
                break;
            }
        }
        let at = at.map(|(j, _)| j);
        match (at, beside) {
            (Some(j), _) => groups[j].push(v),
            (None, Some(j)) => groups.insert(j + 1, vec![v]),
            (None, None) => groups.push(vec![v]),
        }
    }
    fold_reductions(g, sched, options, grouping, &mut groups);
    Ok(groups)
}

/// Moves each reduction kernel into an earlier elementwise kernel it can
/// run in (`folds_into`) and that computes or reads what it reads, past
/// kernels it is independent of. A launch of independent kernels gives
/// up one of them so, the one reading most of those reading nothing the
/// others read (`int_mask_ops`: of a sum of a mask's rows and a sum of
/// the whole of an updated parameter, the latter, so that the parameter
/// is not read back). Not where an earlier plan found the kernel over
/// the device's bindings (`Grouping::apart`).
fn fold_reductions(
    g: &Graph,
    sched: &schedule::Schedule,
    options: &CompileOptions,
    grouping: &Grouping,
    groups: &mut Vec<Vec<ValueId>>,
) {
    // Bytes of the tensor a reduction reduces, as eager holds them.
    let input_bytes = |v: &ValueId| match g.node_of(*v).and_then(|n| g.nodes[n].args.first()) {
        Some(kiln_functionalize::schema::Arg::Tensor(x)) => {
            g.meta(*x).numel() * g.meta(*x).dtype.size_bytes()
        }
        _ => 0,
    };
    let mut i = 0;
    while i < groups.len() {
        // A member of a launch reading a buffer another member reads
        // stays: apart, that buffer would be read twice.
        let alone = |v: ValueId| {
            let others: Vec<ValueId> = groups[i].iter().copied().filter(|&w| w != v).collect();
            roots_touched(g, sched, &[v]).is_disjoint(&roots_touched(g, sched, &others))
        };
        let mut candidates: Vec<ValueId> = match groups[i][..] {
            [v] => vec![v],
            _ if groups[i].iter().all(|&w| !is_map(g, sched, w)) => {
                groups[i].iter().copied().filter(|&v| alone(v)).collect()
            }
            _ => vec![],
        };
        candidates.sort_by_key(|v| std::cmp::Reverse(input_bytes(v)));
        let reach = grouping.lookback.max(1);
        let fold = candidates.into_iter().find_map(|v| {
            let back = (0..i).rev().take(reach);
            for j in back.filter(|_| !grouping.apart.contains_key(&v)) {
                if folds_into(g, sched, options, &groups[j], v) {
                    return Some((j, v));
                }
                if !independent(g, sched, &groups[j], v) {
                    break;
                }
            }
            None
        });
        match fold {
            Some((j, v)) => {
                groups[j].push(v);
                groups[i].retain(|&w| w != v);
                if groups[i].is_empty() {
                    groups.remove(i);
                }
            }
            None => i += 1,
        }
    }
}

/// The most elements a reduction folding an elementwise kernel
/// (`folds_into`) reduces an invocation: the members' work moves from an
/// invocation an element into the reduction's serial loop, which on a GPU
/// loses to the element-parallel kernel beyond short lines.
const FOLD_MAX_LINE: usize = 64;

/// Can reduction `v` run in the kernel of elementwise group `grp` (the
/// kernel before it), the group's members computed and stored where the
/// reduction visits each element of its input (`sum(m)` of a stored mask
/// `m`: one kernel, `m` not read back)? Its input has the members' shape
/// and is a member or computed inline (reading no other member); one
/// invocation an output visits every element once (a single pass, not by
/// workgroup rows), at most `FOLD_MAX_LINE` of them.
fn folds_into(
    g: &Graph,
    sched: &schedule::Schedule,
    options: &CompileOptions,
    grp: &[ValueId],
    v: ValueId,
) -> bool {
    use kiln_functionalize::ops::Reduction as Red;
    use kiln_functionalize::schema::Arg;
    let Def::Node(n, 0) = g.values[v].def else {
        return false;
    };
    let node = &g.nodes[n];
    let (Lowering::Reduce(red), Some(Arg::Tensor(x))) = (node.op.def().lowering, node.args.first())
    else {
        return false;
    };
    let by_rows =
        options.workgroup_rows && matches!(red, Red::Sum | Red::Mean) && g.meta(v).dtype.is_float();
    let sizes = &g.meta(*x).sizes;
    // Worth it where the reduction reads a buffer the kernel touches.
    let shares = !roots_touched(g, sched, &[v]).is_disjoint(&roots_touched(g, sched, grp));
    let line = g.meta(*x).numel() / g.meta(v).numel().max(1);
    !matches!(red, Red::Var { .. })
        && shares
        && line <= FOLD_MAX_LINE
        && !by_rows
        && node.results.len() == 1
        && !sched.fused.contains_key(&v)
        && !sched.inplace.contains_key(&v)
        && folded_reduction(g, sched, grp).is_none()
        && grp
            .iter()
            .all(|&w| is_map(g, sched, w) && g.meta(w).sizes == *sizes)
        && schedule::reads(g, sched, n)
            .iter()
            .all(|r| r == x || !grp.contains(r))
}

/// The reduction an elementwise group's kernel computes after its members
/// (`folds_into`): the group's last value.
pub(crate) fn folded_reduction(
    g: &Graph,
    sched: &schedule::Schedule,
    grp: &[ValueId],
) -> Option<ValueId> {
    let (&last, members) = grp.split_last()?;
    (!members.is_empty() && is_map(g, sched, members[0]) && !is_map(g, sched, last)).then_some(last)
}

/// Kernels sharing a launch (`join_map_launches`).
struct Launch {
    /// Their groups, by index.
    members: Vec<usize>,
    /// The windows they bind together, and how many bindings.
    windows: Vec<Window>,
    bindings: usize,
}

/// Consecutive elementwise kernels share a launch, each in workgroups of
/// its own (`Gen::map_launch`), where they are independent: neither
/// writes a word the other binds (decided on the placed buffers, so the
/// lifetimes planned apart stay right), and together they fit the
/// device's bindings. One launch instead of several, a buffer several
/// read read once (`decoder_ops`: a stack and an update of one input).
/// One kernel of another kind may join them (`upsampling`: a resize of
/// the skip connection beside the convolution reading it). Kernels
/// sharing a launch bind tensors as words (a shared binding is
/// declared once): those binding vectors join only up to
/// `JOIN_MAX_ELEMENTS`. Each launch: its groups, windows and bindings;
/// and the dying inputs whose buffers, taken by a result, refused a join
/// that fit.
#[allow(clippy::too_many_arguments)]
fn join_map_launches(
    g: &Graph,
    sched: &schedule::Schedule,
    options: &CompileOptions,
    grouping: &Grouping,
    groups: &[Vec<ValueId>],
    registers: &HashSet<ValueId>,
    locs: &HashMap<ValueId, Loc>,
    vec4: &[HashSet<(Buf, usize, usize)>],
) -> (Vec<Launch>, HashSet<ValueId>, HashMap<ValueId, ValueId>) {
    let mut blocked = HashSet::new();
    let mut overlapped = HashMap::new();
    let plain = |i: usize| {
        let grp = &groups[i];
        options.share_launches
            && grp.iter().all(|&v| is_map(g, sched, v))
            && g.meta(grp[0]).numel() > 0
            && (vec4[i].is_empty() || g.meta(grp[0]).numel() <= JOIN_MAX_ELEMENTS)
            && grp.iter().all(|v| !grouping.apart.contains_key(v))
    };
    // A kernel of another kind may share an elementwise launch: one value,
    // no row kernel or folded reduction, no packed result (whose lanes it
    // would store beside the elementwise kernels' whole words).
    let other = |i: usize| match groups[i][..] {
        [v] => {
            options.share_launches
                && !is_map(g, sched, v)
                && g.meta(v).numel() > 0
                && !sched.chains.contains_key(&v)
                && !grouping.apart.contains_key(&v)
                && !locs.get(&v).is_some_and(|l| l.packed)
        }
        _ => false,
    };
    // At most one kernel of another kind a launch, beside elementwise ones.
    let joinable = |members: &[usize], i: usize| {
        let all = || members.iter().copied().chain([i]);
        all().all(|j| plain(j) || other(j)) && all().filter(|&j| !plain(j)).count() <= 1
    };
    let range = |v: &ValueId| -> Option<(Buf, usize, usize)> {
        let (l, m) = (locs.get(v)?, g.meta(*v));
        Some((l.buf, l.word, wgsl::words(m.dtype, m.numel(), l.packed)))
    };
    let values = |of: &[usize]| -> Vec<ValueId> {
        of.iter().flat_map(|&j| groups[j].iter().copied()).collect()
    };
    let bound = |of: &[usize]| bound_ranges(g, sched, &values(of), registers, locs);
    let overlap = |a: (Buf, usize, usize), b: &HashSet<(Buf, usize, usize)>| {
        let (buf, w, n) = a;
        b.iter()
            .any(|&(c, x, m)| c == buf && w < x + m.max(1) && x < w + n.max(1))
    };
    // The results of group `a` stored over a word groups `others` bind.
    let clashes = |a: usize, others: &[usize]| -> Vec<ValueId> {
        let b = bound(others);
        groups[a]
            .iter()
            .copied()
            .filter(|v| !registers.contains(v) && range(v).is_some_and(|r| overlap(r, &b)))
            .collect()
    };
    let mut out: Vec<Launch> = vec![];
    for (i, grp) in groups.iter().enumerate() {
        let joined = out.last().and_then(|Launch { members, .. }| {
            if !joinable(members, i) {
                return None;
            }
            let mut clashing = clashes(i, members);
            for &j in members {
                clashing.extend(clashes(j, &[i]));
            }
            let mut all = members.clone();
            all.push(i);
            // Tensors bound in pieces (past the largest binding) are
            // bound by each kernel as it reads them: not together.
            let (_, split) = binding_windows(&bound(&all), options.rules);
            let (w, n) = planned_bindings(g, sched, &values(&all), registers, locs, options.rules);
            let fits = split == 0 && n <= options.max_bindings;
            if fits {
                // Inputs dying under a result another kernel would read.
                blocked.extend(
                    clashing
                        .iter()
                        .filter_map(|v| sched.alias_of.get(v))
                        .map(|&u| sched.root(u)),
                );
                // Values an earlier member reads, placed under a result of
                // this group once they died.
                // (Keyed by the value read, as `lifetimes` counts reads.)
                let read = read_values(g, sched, &values(members));
                for v in clashing.iter().filter(|v| !sched.alias_of.contains_key(v)) {
                    let Some(r) = range(v) else { continue };
                    let one = HashSet::from([r]);
                    for &u in &read {
                        if !groups[i].contains(&u) && range(&u).is_some_and(|x| overlap(x, &one)) {
                            overlapped.insert(u, *v);
                        }
                    }
                }
            }
            (clashing.is_empty() && fits).then_some((w, n))
        });
        match (joined, out.last_mut()) {
            (Some((windows, bindings)), Some(last)) => {
                last.members.push(i);
                (last.windows, last.bindings) = (windows, bindings);
            }
            _ => {
                let (windows, bindings) =
                    planned_bindings(g, sched, grp, registers, locs, options.rules);
                out.push(Launch {
                    members: vec![i],
                    windows,
                    bindings,
                });
            }
        }
    }
    (out, blocked, overlapped)
}

/// The values the kernels computing `vals` read from memory.
fn read_values(g: &Graph, sched: &schedule::Schedule, vals: &[ValueId]) -> HashSet<ValueId> {
    vals.iter()
        .filter_map(|&v| g.node_of(v))
        .flat_map(|n| schedule::reads(g, sched, n))
        .collect()
}

/// The product whose kernel computes `v` (the product itself, or an
/// elementwise tail stored in its place), with its left operand and its
/// result.
fn product_kernel(g: &Graph, sched: &schedule::Schedule, v: ValueId) -> Option<(ValueId, ValueId)> {
    let n = match sched.fused.get(&v) {
        Some(&schedule::Fused::Epilogue { product }) => product,
        Some(_) => return None,
        None => g.node_of(v)?,
    };
    let node = &g.nodes[n];
    let left = node.op.def().lowering.product()?.left;
    Some((
        *node.args.get(left)?.tensors().first()?.to_owned(),
        node.results[0],
    ))
}

/// `v` joins the products of `grp` in one launch: every one a product (or
/// its epilogue tail) of the same left operand, results of one dtype and
/// the same sizes but the last (the same rows and batches), none written
/// in place, and `v`'s kernel reading nothing the group computes.
fn sibling_product(g: &Graph, sched: &schedule::Schedule, grp: &[ValueId], v: ValueId) -> bool {
    let Some((a, r)) = product_kernel(g, sched, v) else {
        return false;
    };
    let rows = |r: ValueId| {
        let m = g.meta(r);
        (m.dtype, m.sizes[..m.dim().saturating_sub(1)].to_vec())
    };
    let computed: HashSet<ValueId> = grp.iter().map(|&w| sched.root(w)).collect();
    let reads_group = g.node_of(v).is_some_and(|n| {
        schedule::reads(g, sched, n)
            .into_iter()
            .any(|x| computed.contains(&sched.root(x)))
    });
    !reads_group
        && !sched.inplace.contains_key(&v)
        && g.meta(r).dim() > 0
        && grp.iter().all(|&w| {
            !sched.inplace.contains_key(&w)
                && product_kernel(g, sched, w)
                    .is_some_and(|(aw, rw)| aw == a && rows(rw) == rows(r))
        })
}

fn lifetimes(
    g: &Graph,
    sched: &schedule::Schedule,
    groups: &[Vec<ValueId>],
    outputs: &[ValueId],
    live_until: &HashMap<ValueId, ValueId>,
) -> Lifetimes {
    let mut step: HashMap<ValueId, usize> = HashMap::new();
    for (i, grp) in groups.iter().enumerate() {
        for &v in grp {
            step.insert(v, i);
        }
    }
    let end = groups.len();
    let mut last: HashMap<ValueId, usize> = HashMap::new();
    for &v in &sched.materialized {
        if let Def::Node(n, _) = g.values[v].def {
            for r in schedule::reads(g, sched, n) {
                let e = last.entry(r).or_insert(0);
                *e = (*e).max(step[&v]);
            }
        }
    }
    for (u, v) in live_until {
        if let (Some(e), Some(&s)) = (last.get_mut(u), step.get(v)) {
            *e = (*e).max(s);
        }
    }
    let mut readback: Vec<ValueId> = vec![];
    for &o in outputs {
        let r = sched.host_views.get(&o).copied().unwrap_or(o);
        if !readback.contains(&r) {
            readback.push(r);
        }
    }
    for &o in &readback {
        last.insert(o, end);
    }
    Lifetimes {
        step,
        last,
        readback,
    }
}

/// The buffers (roots) kernels computing a matrix product read: loaded
/// as vectors where their layout allows.
fn product_operands(
    g: &Graph,
    sched: &schedule::Schedule,
    groups: &[Vec<ValueId>],
) -> HashSet<ValueId> {
    let is_product = |n: NodeId| matches!(g.nodes[n].op.def().lowering, Lowering::MatMul(_));
    let mut out = HashSet::new();
    for grp in groups {
        for &v in grp {
            let Some(n) = g.node_of(v) else { continue };
            let product = match sched.fused.get(&v) {
                Some(schedule::Fused::Epilogue { product }) => is_product(*product),
                _ => is_product(n),
            };
            if product {
                out.extend(
                    schedule::reads(g, sched, n)
                        .into_iter()
                        .map(|r| sched.root(r)),
                );
            }
        }
    }
    out
}

/// Parameters in buffers of their own; every other buffer planned in the
/// arena by lifetime. A re-inplaced scatter, a reshape and an elementwise
/// result written over its dying input live in the allocation they reuse.
fn place(
    g: &Graph,
    sched: &schedule::Schedule,
    groups: &[Vec<ValueId>],
    life: &Lifetimes,
    packing: &Packing,
    options: &CompileOptions,
    workgroup_only: &HashSet<ValueId>,
) -> Result<Layout, CompileError> {
    let bytes = |v: ValueId| packing.bytes(g, sched, v);
    let root = |v: ValueId| sched.root(v);
    let mut locs: HashMap<ValueId, Loc> = HashMap::new();
    let mut param_words = vec![];
    for (i, &v) in g.inputs.iter().enumerate() {
        locs.insert(
            v,
            Loc {
                buf: Buf::Param(i),
                word: 0,
                packed: packing.packed(g, v),
            },
        );
        param_words.push(bytes(v) / 4);
    }
    let mut roots: Vec<ValueId> = vec![];
    let mut span: HashMap<ValueId, (usize, usize)> = HashMap::new();
    // Every value with a buffer: kernel results and reshapes.
    let mut owners: Vec<ValueId> = sched.materialized.clone();
    owners.extend(sched.alias_of.keys().copied());
    owners.sort_by_key(|&v| {
        g.node_of(v)
            .and_then(|n| g.order.iter().position(|&m| m == n))
    });
    for &v in &owners {
        let r = root(v);
        let own = life
            .step
            .get(&v)
            .or_else(|| life.step.get(&r))
            .copied()
            .unwrap_or(0);
        let first = life.step.get(&r).copied().unwrap_or(0);
        let l = life.last.get(&v).copied().unwrap_or(own).max(own);
        let e = span.entry(r).or_insert((first, l));
        e.1 = e.1.max(l);
        if !roots.contains(&r) && !g.inputs.contains(&r) && !workgroup_only.contains(&r) {
            roots.push(r);
        }
    }
    // A binding starts at the device's alignment, and WebGPU forbids a
    // writable binding that overlaps another binding of the same dispatch.
    // Large tensors start at that alignment themselves (elementwise
    // kernels bind them as vectors from their first word), products'
    // operands of a few windows or more at 16 bytes (their tiles and
    // register blocks load vectors, `Gen::vec4_operand`): each is bound
    // alone, so tensors bound with it stay out of its windows
    // (`plan::plan`). The rest are packed a word apart; a kernel binding
    // several whose windows overlap binds the windows once
    // (`binding_windows`).
    let window = options.rules.align_words * 4;
    let vectors = product_operands(g, sched, groups);
    let requests: Vec<plan::Request> = roots
        .iter()
        .map(|r| {
            let bytes = bytes(*r);
            let large = bytes >= 16 * window;
            // Vector loads pay off on operands of more than a few windows.
            let vector = vectors.contains(r) && bytes >= 4 * window;
            plan::Request {
                bytes,
                first: span[r].0,
                last: span[r].1,
                align: if large {
                    window.max(16)
                } else if vector {
                    16
                } else {
                    4
                },
                own_window: large || vector,
            }
        })
        .collect();
    let index: HashMap<ValueId, usize> = roots.iter().enumerate().map(|(i, &r)| (r, i)).collect();
    let bound: Vec<Vec<usize>> = groups
        .iter()
        .map(|grp| {
            let mut set: Vec<usize> = vec![];
            for &v in grp {
                let reads = g
                    .node_of(v)
                    .map(|n| schedule::reads(g, sched, n))
                    .unwrap_or_default();
                for w in reads.into_iter().chain([v]) {
                    if let Some(&i) = index.get(&root(w)) {
                        if !set.contains(&i) {
                            set.push(i);
                        }
                    }
                }
            }
            set
        })
        .collect();
    let mp = plan::plan(&requests, window, &bound);
    // Buffers in workgroup memory alone: an arena location no kernel
    // binds (kernels in sequence place them by `Grouping::workgroup_words`).
    for &r in workgroup_only {
        locs.insert(
            r,
            Loc {
                buf: Buf::Arena,
                word: 0,
                packed: packing.packed(g, r),
            },
        );
    }
    for (r, off) in roots.iter().zip(&mp.offsets) {
        locs.insert(
            *r,
            Loc {
                buf: Buf::Arena,
                word: off / 4,
                packed: packing.packed(g, *r),
            },
        );
    }
    pack_params(
        g,
        sched,
        life,
        options,
        &owners,
        &mut param_words,
        &mut locs,
    );
    for &v in &owners {
        let r = root(v);
        let l = *locs
            .get(&r)
            .ok_or_else(|| CompileError::internal(Stage::Plan, "a value without a location"))?;
        locs.insert(v, l);
    }
    Ok(Layout {
        locs,
        workgroup_only: workgroup_only.clone(),
        param_words,
        plan: mp,
    })
}

/// Parameters packed into one buffer are at most this large, and a pack at
/// most `PACK_WORDS` words.
const PACK_MAX_BYTES: usize = 4096;
const PACK_WORDS: usize = 16384;

/// Small parameters of 4-byte elements that no kernel writes and no run
/// reads back share a buffer, constants with constants and inputs with
/// inputs, each at the next word, where a program has more parameters
/// than a kernel has bindings: kernels in sequence bind each buffer once,
/// so a pack takes one of the device's bindings where its members took
/// one each (a browser's 8; a block's biases and norm weights).
/// The first member's buffer holds the pack (`Program::param_slot`).
fn pack_params(
    g: &Graph,
    sched: &schedule::Schedule,
    life: &Lifetimes,
    options: &CompileOptions,
    owners: &[ValueId],
    param_words: &mut [usize],
    locs: &mut HashMap<ValueId, Loc>,
) {
    // Only where the parameters and the arena would not fit one kernel's
    // bindings: a pack's members share binding windows, so a kernel reads
    // them word by word where a buffer of their own would load a
    // broadcast row as vectors (`Gen::quad_word`).
    if g.inputs.len() < options.max_bindings {
        return;
    }
    // Buffers kernel results are written over (a reshape only views its).
    let written: HashSet<ValueId> = owners
        .iter()
        .filter(|v| life.step.contains_key(v))
        .map(|&v| sched.root(v))
        .collect();
    let read_back: HashSet<ValueId> = life.readback.iter().map(|&v| sched.root(v)).collect();
    // A kernel may bind a pack whole (kernels in sequence do).
    let cap = PACK_WORDS.min(options.rules.max_words);
    for constant in [true, false] {
        let mut fit: Vec<usize> = (0..g.inputs.len())
            .filter(|&i| {
                let v = g.inputs[i];
                let words = param_words[i];
                words > 0
                    && words * 4 <= PACK_MAX_BYTES
                    && words <= cap
                    && g.meta(v).dtype.size_bytes() == 4
                    && options.constants.contains(&i) == constant
                    && !written.contains(&v)
                    && !read_back.contains(&v)
            })
            .collect();
        // Whole quads first: each of those starts on a quad of the pack,
        // for vector loads of aligned quads (`Gen::quad_word`).
        fit.sort_by_key(|&i| (!param_words[i].is_multiple_of(4), i));
        let mut pack: Vec<(usize, usize)> = vec![];
        let mut end = 0;
        for i in fit {
            if end + param_words[i] > cap {
                place_pack(g, &pack, end, param_words, locs);
                (pack, end) = (vec![], 0);
            }
            pack.push((i, end));
            end += param_words[i];
        }
        place_pack(g, &pack, end, param_words, locs);
    }
}

/// Parameters `pack` (each at its word) in the buffer of the first, `words`
/// long; a pack of one stays as it is.
fn place_pack(
    g: &Graph,
    pack: &[(usize, usize)],
    words: usize,
    param_words: &mut [usize],
    locs: &mut HashMap<ValueId, Loc>,
) {
    let [(first, _), _, ..] = pack else { return };
    for &(i, word) in pack {
        let v = g.inputs[i];
        let packed = locs.get(&v).is_some_and(|l| l.packed);
        locs.insert(
            v,
            Loc {
                buf: Buf::Param(*first),
                word,
                packed,
            },
        );
        param_words[i] = 0;
    }
    param_words[*first] = words;
}

/// The cost of launch `members` (groups by index): a kernel's own, or
/// that of kernels sharing the launch.
fn launch_cost(
    g: &Graph,
    sched: &schedule::Schedule,
    groups: &[Vec<ValueId>],
    members: &[usize],
    registers: &HashSet<ValueId>,
    packing: &Packing,
) -> KernelCost {
    match members {
        [i] => KernelCost::of(g, sched, &groups[*i], registers, packing),
        _ => KernelCost::launch(
            g,
            sched,
            members.iter().map(|&i| &groups[i][..]),
            registers,
            packing,
        ),
    }
}

/// Does the kernel computing `grp` store its packed member `v` lane by
/// lane (a reduction's or another non-elementwise kernel's store)?
fn stores_lanes_in(
    g: &Graph,
    sched: &schedule::Schedule,
    packing: &Packing,
    grp: &[ValueId],
    v: ValueId,
) -> bool {
    (folded_reduction(g, sched, grp).is_some() || !is_map(g, sched, v)) && packing.packed(g, v)
}

/// What the kernel computing `grp` runs and moves: its ops (inlined
/// producers first), bytes read and written, elements.
struct KernelCost {
    ops: Vec<String>,
    bytes_read: usize,
    written: usize,
    elements: usize,
}

impl KernelCost {
    fn of(
        g: &Graph,
        sched: &schedule::Schedule,
        grp: &[ValueId],
        registers: &HashSet<ValueId>,
        packing: &Packing,
    ) -> KernelCost {
        if is_map(g, sched, grp[0]) || grp.len() == 1 || sched.chains.contains_key(&grp[0]) {
            return Self::one(g, sched, grp, registers, packing).0;
        }
        Self::launch(g, sched, grp.chunks(1), registers, packing)
    }

    /// Kernels sharing a launch, each computing one of `kernels`: each
    /// charged as alone, a buffer several read (sibling products' left
    /// operand, an input of elementwise kernels) once.
    fn launch<'v>(
        g: &Graph,
        sched: &schedule::Schedule,
        kernels: impl Iterator<Item = &'v [ValueId]>,
        registers: &HashSet<ValueId>,
        packing: &Packing,
    ) -> KernelCost {
        let mut cost = KernelCost {
            ops: vec![],
            bytes_read: 0,
            written: 0,
            elements: 0,
        };
        let mut charged: HashMap<ValueId, usize> = HashMap::new();
        for vals in kernels {
            let (one, reads) = Self::one(g, sched, vals, registers, packing);
            cost.ops.extend(one.ops);
            cost.written += one.written;
            cost.elements = cost.elements.max(one.elements);
            for (r, b) in reads {
                let c = charged.entry(r).or_default();
                *c = (*c).max(b);
            }
        }
        cost.bytes_read = charged.values().sum();
        cost
    }

    /// The cost of one kernel's values `grp`, and what it charges for
    /// each buffer it reads.
    fn one(
        g: &Graph,
        sched: &schedule::Schedule,
        grp: &[ValueId],
        registers: &HashSet<ValueId>,
        packing: &Packing,
    ) -> (KernelCost, Vec<(ValueId, usize)>) {
        let bytes = |v: ValueId| packing.bytes(g, sched, v);
        let mut ops: Vec<String> = vec![];
        let mut reads: Vec<ValueId> = vec![];
        let mut written = 0;
        let mut elements = 0;
        // Elements of its input a reduction reads, each once.
        let mut reduced = 0;
        let mut nodes: HashSet<NodeId> = HashSet::new();
        for &v in grp {
            let Def::Node(n, _) = g.values[v].def else {
                continue;
            };
            // Producers kept in registers are members of their own.
            let members: HashSet<_> = grp.iter().filter_map(|&w| g.node_of(w)).collect();
            // A row kernel computes what an earlier value computed inline
            // once (its registers hold it).
            let chain = sched.chains.contains_key(&grp[0]);
            let mut region: Vec<_> = schedule::inlined_region(g, sched, n)
                .into_iter()
                .filter(|m| !members.contains(m) && (!chain || !nodes.contains(m)))
                .collect();
            nodes.insert(n);
            nodes.extend(region.iter().copied());
            region.sort_by_key(|&m| g.order.iter().position(|&x| x == m));
            ops.extend(region.iter().map(|&m| g.nodes[m].op.name().to_string()));
            ops.push(g.nodes[n].op.name().to_string());
            let mut node_reads = schedule::reads(g, sched, n);
            // A region written in place over its base reads the base only
            // where its source does (`x[r] = f(x[r])`, not `x[r] = 7`).
            if let (Some(&base), Lowering::RegionScatter { .. }) =
                (sched.inplace.get(&v), g.nodes[n].op.def().lowering)
            {
                let root = sched.root(base);
                let src_reads_base = g.nodes[n].args[1..]
                    .iter()
                    .flat_map(|a| a.tensors())
                    .flat_map(|&t| crate::fusion::reads_value(g, sched, t))
                    .any(|r| sched.root(r) == root);
                if !src_reads_base {
                    node_reads.retain(|&r| sched.root(r) != root);
                }
            }
            reads.extend(node_reads.into_iter().filter(|r| !grp.contains(r)));
            let (w, e) = match sched.inplace.get(&v) {
                _ if registers.contains(&v) => (0, g.meta(v).numel()),
                Some(_) => {
                    let src = inplace_writes(g, n);
                    (src * 4, src)
                }
                None => (bytes(v), g.meta(v).numel()),
            };
            written += w;
            elements = elements.max(e);
            if let (Lowering::Reduce(_), Some(kiln_functionalize::schema::Arg::Tensor(x))) =
                (g.nodes[n].op.def().lowering, g.nodes[n].args.first())
            {
                reduced = reduced.max(g.meta(*x).numel());
            }
        }
        reads.sort();
        reads.dedup();
        // Elementwise kernels and in-place scatters read each buffer at most
        // once per invocation, reductions at most once per element of their
        // input (a window of a buffer: the window); other kernels are
        // charged whole buffers.
        let per_thread = is_map(g, sched, grp[0]) || sched.inplace.contains_key(&grp[0]);
        let reduction = grp.len() == 1 && reduced > 0;
        let tables = selected_rows(g, sched, &nodes);
        let charges: Vec<(ValueId, usize)> = reads
            .iter()
            .map(|&r| {
                let whole = bytes(r);
                let share = |n: usize| whole.min((n * whole).div_ceil(g.meta(r).numel().max(1)));
                let mut charge = whole;
                if per_thread {
                    charge = share(elements);
                } else if reduction {
                    charge = share(reduced);
                }
                if let Some(&picked) = tables.get(&r) {
                    charge = charge.min(share(picked));
                }
                (r, charge)
            })
            .collect();
        // Values sharing a buffer (a reshape and its source) are one read
        // of it: charged once, the most any of them is charged.
        let mut by_buffer: Vec<(ValueId, usize)> = vec![];
        for (r, c) in charges {
            let root = sched.root(r);
            match by_buffer.iter_mut().find(|(b, _)| *b == root) {
                Some((_, was)) => *was = (*was).max(c),
                None => by_buffer.push((root, c)),
            }
        }
        let charges = by_buffer;
        let cost = KernelCost {
            ops,
            bytes_read: charges.iter().map(|c| c.1).sum(),
            written,
            elements,
        };
        (cost, charges)
    }
}

/// Buffers a kernel (its nodes, inlined ones included) reads only as the
/// table of selections (`embedding`, `index_select`), with the elements
/// they pick: those are read, not the whole table.
fn selected_rows(
    g: &Graph,
    sched: &schedule::Schedule,
    nodes: &HashSet<NodeId>,
) -> HashMap<ValueId, usize> {
    let mut rows: HashMap<ValueId, usize> = HashMap::new();
    let mut direct: HashSet<ValueId> = HashSet::new();
    for &m in nodes {
        let node = &g.nodes[m];
        let select = matches!(
            node.op.def().lowering,
            Lowering::Map(Elem::IndexSelect { .. }) | Lowering::Free(Elem::IndexSelect { .. })
        );
        for (i, a) in node.args.iter().enumerate() {
            for &t in a.tensors() {
                if !sched.is_materialized.contains(&t) {
                    continue;
                }
                if select && i == 0 {
                    *rows.entry(t).or_default() += g.meta(node.results[0]).numel();
                } else {
                    direct.insert(t);
                }
            }
        }
    }
    rows.retain(|t, _| !direct.contains(t));
    rows
}

/// Refuses a kernel binding one buffer twice over overlapping bytes
/// where the dispatch writes it: WebGPU rejects such a dispatch (wgpu on
/// Vulkan runs it), so this is checked here, on every adapter.
fn check_bindings_apart(code: &crate::kernel::KernelCode) -> Result<(), CompileError> {
    let b = &code.bindings;
    for (i, x) in b.iter().enumerate() {
        for y in &b[i + 1..] {
            let overlap = x.offset < y.offset + y.size && y.offset < x.offset + x.size;
            if x.buf == y.buf && (x.write || y.write) && overlap {
                return Err(CompileError::internal(
                    Stage::Codegen,
                    format!(
                        "kernel {} binds bytes {}..{} and {}..{} of one written buffer",
                        code.label,
                        x.offset,
                        x.offset + x.size,
                        y.offset,
                        y.offset + y.size
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// What lowering made of the kernel groups.
pub(crate) struct Generated {
    kernels: Vec<Kernel>,
    readback: Vec<ValueId>,
    layout: Layout,
    status_word: Option<usize>,
    sched: schedule::Schedule,
    /// Groups of kernels that could not all share a launch
    /// (`Gen::apart`): empty when every group became one launch.
    pub apart: HashMap<ValueId, Shape>,
    /// Words of the arena kernels bind at least (kernels in sequence bind
    /// it whole, with the status word).
    arena_end: usize,
    /// Buffers (roots) kernels in sequence keep in workgroup memory alone,
    /// never stored in memory: they need no arena words.
    pub workgroup_only: HashSet<ValueId>,
    /// See `Grouping::workgroup_words` (this plan's, or those it kept).
    pub workgroup_words: HashMap<ValueId, usize>,
}

impl Generated {
    /// See `KernelPlan::planned_peak`.
    pub fn planned_peak(&self) -> usize {
        self.layout.param_words.iter().sum::<usize>() * 4 + self.layout.plan.arena_bytes
    }
}

/// The program, with its memory figures.
pub(crate) fn assemble(
    g: &Graph,
    io: &Interface,
    options: &CompileOptions,
    generated: Generated,
) -> Result<Program, CompileError> {
    let Generated {
        kernels,
        readback,
        layout,
        status_word,
        sched,
        apart: _,
        arena_end,
        workgroup_only: _,
        workgroup_words: _,
    } = generated;
    let sched = &sched;
    let Interface {
        src,
        outputs,
        n_outputs,
        mutated_inputs,
    } = *io;
    let mp = &layout.plan;
    // Figures at the packed size of every value (what eager memory holds).
    let least = |m: &kiln_functionalize::Meta| wgsl::words(m.dtype, m.numel(), true) * 4;
    let naive_unfused = g.values.values().map(|v| least(&v.meta)).sum();
    let min_bytes = g.inputs.iter().map(|&v| least(g.meta(v))).sum::<usize>()
        + outputs.iter().map(|&v| least(g.meta(v))).sum::<usize>();
    let written_params: Vec<usize> = (0..g.inputs.len())
        .filter(|&i| {
            kernels.iter().any(|k| {
                k.code
                    .bindings
                    .iter()
                    .any(|b| b.write && b.buf == Buf::Param(i))
            })
        })
        .collect();
    let memory = MemoryStats {
        io: layout.param_words.iter().sum::<usize>() * 4,
        arena: mp.arena_bytes,
        lower_bound: mp.lower_bound,
        naive: mp.naive,
        naive_unfused,
        eager_peak: kiln_functionalize::interp::eager_peak_bytes(src),
    };
    let names = kiln_functionalize::text::Names::of(g);
    let mut values = Values::default();
    let mut val = |v: ValueId| values.of(g, &names, v);
    let params: Vec<Val> = g.inputs.iter().map(|&v| val(v)).collect();
    let outputs_v: Vec<Val> = outputs.iter().map(|&v| val(v)).collect();
    let readback_v: Vec<Val> = readback.iter().map(|&v| val(v)).collect();
    let mut host_views = HashMap::new();
    for (&o, &base) in &sched.host_views {
        let view = host_view(g, o, base)?;
        host_views.insert(
            val(o),
            HostView {
                base: val(base),
                ..view
            },
        );
    }
    // Values in workgroup memory alone have no place in memory to name.
    let mut locs: Vec<(ValueId, Loc)> = (layout.locs.into_iter())
        .filter(|(v, _)| !layout.workgroup_only.contains(&sched.root(*v)))
        .collect();
    locs.sort_by_key(|(v, _)| *v);
    let locs = locs.into_iter().map(|(v, l)| (val(v), l)).collect();
    // Named only by fault messages: none where no kernel can fault.
    let statements = match status_word {
        Some(_) => g
            .order
            .iter()
            .map(|&n| statement_with(&names, g, n))
            .collect(),
        None => vec![],
    };
    Ok(Program {
        name: g.name.to_string(),
        values: values.infos,
        params,
        statements,
        outputs: outputs_v,
        readback: readback_v,
        host_views,
        n_outputs,
        mutated_inputs: mutated_inputs.to_vec(),
        arena_words: match status_word {
            Some(w) => w + 1,
            None => mp.arena_bytes.div_ceil(4),
        }
        .max(arena_end),
        kernels,
        locs,
        param_words: layout.param_words,
        constants: options.constants.clone(),
        written_params,
        status_word,
        memory,
        min_bytes,
    })
}

/// The values a program names, each once, in the order first asked for.
#[derive(Default)]
struct Values {
    index: HashMap<ValueId, Val>,
    infos: Vec<ValueInfo>,
}

impl Values {
    fn of(&mut self, g: &Graph, names: &kiln_functionalize::text::Names, v: ValueId) -> Val {
        *self.index.entry(v).or_insert_with(|| {
            let m = g.meta(v);
            self.infos.push(ValueInfo {
                name: names.get(v),
                dtype: m.dtype,
                sizes: m.sizes.to_vec(),
            });
            self.infos.len() - 1
        })
    }
}

/// Elements an in-place scatter writes: its source's, or for `index_put`
/// the indexed positions'.
fn inplace_writes(g: &Graph, n: NodeId) -> usize {
    use kiln_functionalize::ops::kernels::Advanced;
    use kiln_functionalize::schema::Arg;
    let node = &g.nodes[n];
    match (&node.op.def().lowering, &node.args[1]) {
        // `index_copy` writes its source's elements, `scatter` its index's.
        (Lowering::Map(Elem::ScatterInto { copy, .. }), _) => {
            let at = if *copy { 3 } else { 2 };
            match node.args.get(at) {
                Some(Arg::Tensor(t)) if *copy => g.meta(*t).numel(),
                _ => node
                    .args
                    .get(2)
                    .and_then(|a| a.tensors().first().map(|&&t| g.meta(t).numel()))
                    .unwrap_or(0),
            }
        }
        // A bool mask's positions are known at run time only: at most all.
        (Lowering::IndexPut, Arg::TensorList(idx))
            if !idx
                .iter()
                .flatten()
                .any(|&t| g.meta(t).dtype == kiln_functionalize::DType::Bool) =>
        {
            let shapes: Vec<Option<&[usize]>> = idx
                .iter()
                .map(|t| t.map(|t| &g.meta(t).sizes[..]))
                .collect();
            Advanced::of(&g.meta(node.results[0]).sizes, &shapes)
                .map(|lay| lay.rshape.iter().product())
                .unwrap_or_else(|_| g.meta(node.results[0]).numel())
        }
        (Lowering::IndexPut, _) => g.meta(node.results[0]).numel(),
        (_, a) => a.tensors().first().map_or(0, |&&t| g.meta(t).numel()),
    }
}

/// Output `v`, a view copy of `base`'s buffer (`Schedule::host_views`), as
/// the runtime takes it on the host: the view's sizes, strides and offset
/// over `base` laid out contiguously.
fn host_view(g: &Graph, v: ValueId, base: ValueId) -> Result<HostView, CompileError> {
    use kiln_functionalize::schema::Arg;
    let bug = |m: &str| CompileError::internal(Stage::Assemble, format!("host view: {m}"));
    // The chain of view copies from `base` to `v` (`schedule::view_chain_base`),
    // or the view through which `base`'s scatter wrote `v` into it
    // (`schedule::src_as_host_view`), or into what `base` permutes
    // (`schedule::src_in_permuted_store`).
    if let Some(n) = g.node_of(base).filter(|&n| {
        g.nodes[n].op.def().lowering.scatter_view().is_some()
            && g.nodes[n].args.get(1) == Some(&Arg::Tensor(v))
    }) {
        let view = g.nodes[n].op.def().lowering.scatter_view();
        let view = view.ok_or_else(|| bug("a scatter without a view"))?;
        let a = crate::index::Affine::view(g, view, g.meta(base), &g.nodes[n].args[2..], 0)
            .map_err(|e| bug(&e))?;
        return Ok(HostView {
            base: 0,
            sizes: a.sizes,
            strides: a.strides,
            offset: a.offset,
        });
    }
    let m = schedule::view_chain_layout(g, v, base)
        .or_else(|| schedule::permuted_scatter_src_layout(g, v, base))
        .ok_or_else(|| bug("not a strided view"))?;
    Ok(HostView {
        base: 0,
        sizes: m.sizes.to_vec(),
        strides: m.strides.to_vec(),
        offset: m.offset,
    })
}
