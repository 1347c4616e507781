//! The schedule's decisions as data, and the queries over them that index
//! maps, race checks, lowering and codegen share: which values have
//! buffers (materialized) or are recomputed inline, which share a buffer,
//! which kernels absorb products. `schedule.rs` makes the decisions; this
//! module depends on none of the passes that read them.

use crate::error::CompileError;
use kiln_functionalize::graph::{Def, Graph, NodeId, ValueId};
use kiln_functionalize::meta::Meta;
use kiln_functionalize::ops::{self, Elem, Lowering, OpKind};
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

pub fn class(g: &Graph, n: NodeId) -> Result<Class, CompileError> {
    let def = g.nodes[n].op.def();
    match def.lowering {
        Lowering::None | Lowering::NoKernel | Lowering::Composite => {
            let kind = match def.kind {
                _ if def.lowering == Lowering::Composite => {
                    "a composite op (functionalize first: it becomes its parts)"
                }
                OpKind::View | OpKind::MultiView | OpKind::ViewOrCopy => {
                    "a view (functionalize with mutations_and_views first)"
                }
                OpKind::InPlace => "an in-place op (functionalize first)",
                _ => "not supported by the gpu backend yet",
            };
            Err(CompileError::no_kernel(format!("`{}` is {kind}", def.name)).at(g, n))
        }
        l if l.is_map() => Ok(Class::Map),
        // `as_strided_scatter` is a predicated map where its view's
        // positions invert in closed form; else a copy, then the writes.
        Lowering::StridedScatter(_) if nested_strided_view(g, n).is_some() => Ok(Class::Map),
        Lowering::IndexPut if index_put_map(g, n).is_some() => Ok(Class::Map),
        _ => Ok(Class::Kernel),
    }
}

/// (dim, size, stride) of a strided view's dims.
pub type StridedDims = Vec<(usize, usize, usize)>;

/// `as_strided_scatter` node `n`'s view over its contiguous result when no
/// two of its elements share a position and its strides nest (each at
/// least the span of the smaller ones: a strided block, a diagonal), so a
/// position's place in the view follows by division
/// (`index::Region::Strided`): its offset, rank, and (dim, size, stride)
/// of its dims longer than 1, largest stride first.
pub fn nested_strided_view(g: &Graph, n: NodeId) -> Option<(usize, usize, StridedDims)> {
    let node = &g.nodes[n];
    let view = node.op.def().lowering.scatter_view()?;
    let out = g.meta(node.results[0]);
    let om = Meta::contiguous(out.dtype, out.sizes.clone());
    let mut va: Vec<Arg<&Meta>> = vec![Arg::Tensor(&om)];
    va.extend(
        node.args
            .get(2..)?
            .iter()
            .map(|a| a.map(&mut |x| g.meta(*x))),
    );
    let vm = ops::infer(view, &va).ok()?.remove(0);
    let mut dims: Vec<(usize, usize, usize)> = (0..vm.dim())
        .filter(|&d| vm.sizes[d] > 1)
        .map(|d| (d, vm.sizes[d], vm.strides[d]))
        .collect();
    dims.sort_by_key(|&(_, _, st)| std::cmp::Reverse(st));
    let nests = dims.windows(2).all(|w| w[0].2 >= w[1].1 * w[1].2);
    (nests && dims.iter().all(|&(_, _, st)| st > 0)).then_some((vm.offset, vm.dim(), dims))
}

/// Positions an `index_put` index may hold for the put to be computed
/// element by element (each element scanning them all); longer indices
/// keep the kernel walking the positions once.
pub const MAX_PUT_SCAN: usize = 256;

/// `index_put` node `n` with one integer index tensor (a dim picked, the
/// others whole) of at most `MAX_PUT_SCAN` positions: a map, element `i`
/// being self there, then each position naming it, in order (the last
/// wins, or all accumulate). Its dim and index.
pub fn index_put_map(g: &Graph, n: NodeId) -> Option<(usize, ValueId)> {
    let Some(Arg::TensorList(idx)) = g.nodes[n].args.get(1) else {
        return None;
    };
    let [(d, t)] = idx
        .iter()
        .enumerate()
        .filter_map(|(d, t)| t.map(|t| (d, t)))
        .collect::<Vec<_>>()[..]
    else {
        return None;
    };
    let m = g.meta(t);
    (m.dtype.is_integral() && m.numel() <= MAX_PUT_SCAN).then_some((d, t))
}

/// Index maps and factories: free to recompute in every consumer.
pub fn is_free(g: &Graph, n: NodeId) -> bool {
    g.nodes[n].op.def().lowering.is_free()
}

/// Which of its input's `rank` dims a reduction (`Lowering::Reduce`)
/// with arguments `args` reduces: those it names, all where it names none.
pub fn reduced_dims<T>(
    red_op: ops::Reduction,
    args: &[Arg<T>],
    rank: usize,
) -> Result<Vec<bool>, String> {
    use kiln_functionalize::ops::args::ArgsExt;
    use ops::Reduction as Red;
    let one;
    let dims: Option<&[i64]> = match red_op {
        Red::Amax | Red::Amin => Some(args.int_list(1)?),
        Red::Var { .. } => args.opt_int_list(1)?,
        _ if args.len() <= 2 => None,
        // `prod.dim_int`: one dim.
        Red::Prod => {
            one = [args.int(1)?];
            Some(&one)
        }
        _ => args.opt_int_list(1)?,
    };
    let mut red = vec![rank == 0; rank];
    match dims {
        Some(l) if !l.is_empty() => {
            for &d in l {
                let d = kiln_functionalize::meta::wrap_dim(d, rank).map_err(|e| e.to_string())?;
                if rank > 0 {
                    red[d] = true;
                }
            }
        }
        _ => red.iter_mut().for_each(|x| *x = true),
    }
    Ok(red)
}

/// The view a scatter node writes through.
pub fn scatter_view(g: &Graph, n: NodeId) -> Option<kiln_functionalize::ops::OpId> {
    g.nodes[n].op.def().lowering.scatter_view()
}

/// Is `v` a view copy of scatter `sc`'s base through the region `sc`
/// writes (`select(b, 0, 2)` or `unbind(b)[2]` for `select_scatter(b, s,
/// 0, 2)`, a `split` piece for the matching `slice_scatter`)? There `v`
/// at the source's element is the base at the scatter's element: a chain
/// of region updates reads each base once per element.
pub fn is_scatter_view_copy(g: &Graph, sc: NodeId, v: ValueId) -> bool {
    let node = &g.nodes[sc];
    let (Some(view), Some(&Arg::Tensor(base))) = (scatter_view(g, sc), node.args.first()) else {
        return false;
    };
    let Def::Node(m, k) = g.values[v].def else {
        return false;
    };
    let copy = &g.nodes[m];
    let ops::Rule::ViewCopy(op) = copy.op.def().rule else {
        return false;
    };
    if copy.args.first() != Some(&Arg::Tensor(base)) {
        return false;
    }
    if op == view && copy.args[1..] == node.args[2..] {
        return copy.results.len() == 1;
    }
    // Another view op: the same layout over the base.
    let bm = g.meta(base);
    let whole = Meta::contiguous(bm.dtype, bm.sizes.clone());
    let layout = |op, rest: &[Arg<ValueId>]| {
        let mut args: Vec<Arg<&Meta>> = vec![Arg::Tensor(&whole)];
        args.extend(rest.iter().map(|a| a.map(&mut |x| g.meta(*x))));
        ops::infer(op, &args).ok()
    };
    let (Some(region), Some(mut pieces)) =
        (layout(view, &node.args[2..]), layout(op, &copy.args[1..]))
    else {
        return false;
    };
    let (Some(r), true) = (region.first(), k < pieces.len()) else {
        return false;
    };
    let p = pieces.swap_remove(k);
    p.sizes == r.sizes && p.strides == r.strides && p.offset == r.offset
}

/// The schedule: which values have buffers, in which kernels they are made.
pub struct Schedule {
    /// Materialized values, in the order their kernels run.
    pub materialized: Vec<ValueId>,
    pub is_materialized: HashSet<ValueId>,
    /// Scatters that write into their dying base's buffer: scatter value ->
    /// base value.
    pub inplace: HashMap<ValueId, ValueId>,
    /// Pure reshapes of a materialized value (a contiguous view copy with
    /// every element in place): they share its buffer, no kernel.
    pub alias_of: HashMap<ValueId, ValueId>,
    /// Outputs that are views of a buffer: read back the buffer, take the
    /// view on the host (no copy kernel, no arena).
    pub host_views: HashMap<ValueId, ValueId>,
    pub uses: HashMap<ValueId, Vec<NodeId>>,
    /// Buffers no kernel may write (parameters bound to constants).
    pub pinned: HashSet<ValueId>,
    /// Each node's position in program order.
    pub pos: HashMap<NodeId, usize>,
    /// Materialized values computed in one kernel with matrix products
    /// whose results never reach memory.
    pub fused: HashMap<ValueId, Fused>,
    /// Epilogue tails whose chain permutes the kernel's result (tail ->
    /// the permuting copies, in order): element `i` is stored where the
    /// last copy has it.
    pub permuted: HashMap<ValueId, Vec<ValueId>>,
    /// Products computed in the kernel of another product's epilogue
    /// (epilogue product -> its twin): the same left operand and shapes,
    /// both accumulated from one pass over the left operand, the twin's
    /// result read by the epilogue from registers.
    pub twins: HashMap<NodeId, NodeId>,
    /// Kernel groups computed by one row kernel (`chain::chain_rows`):
    /// their first value -> the row blocks an invocation each computes.
    pub chains: HashMap<ValueId, usize>,
    /// Layer norms read only as the left operand of products too wide for
    /// a row kernel: each product computes its workgroup's row statistics
    /// first and normalizes the operand where it loads it
    /// (`Gen::norm_rows`), the normalized rows never in memory.
    pub norm_operands: HashSet<ValueId>,
}

/// A kernel computing a value together with products it absorbs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fused {
    /// An elementwise tail of a kernel's result (a product's bias, GELU,
    /// residual add or scale; a scale after a softmax or a norm) computed
    /// where the kernel stores, in place of its result.
    Epilogue { product: NodeId },
    /// `softmax(f(Q K)) V` with `f` elementwise (scale, mask): tiles of
    /// keys with an online softmax, no score tensor in memory. With
    /// `q_proj`, the kernel computes its query rows itself from the
    /// projection `linear` whose head split Q is; with `o_proj`, it owns
    /// every head of its rows and computes the output projection of their
    /// merge, storing that `linear`'s result (or its epilogue's tail)
    /// instead (`schedule::fuse_attention_projections`).
    Attention {
        scores: NodeId,
        softmax: NodeId,
        product: NodeId,
        q_proj: Option<NodeId>,
        o_proj: Option<NodeId>,
    },
    /// Elementwise work over the rows a reduction reduces, reading the
    /// reduction's result broadcast along them (RMS norm's
    /// `x * rsqrt(mean(x^2) + eps) * w`): computed by the reduction's
    /// kernel once the row's result is known, the result never stored.
    Rows { reduction: NodeId },
}

impl Schedule {
    /// Every value stored in the buffer owned by `root`, `root` included.
    pub fn sharing(&self, root: ValueId) -> Vec<ValueId> {
        let mut out: Vec<ValueId> = self
            .inplace
            .keys()
            .chain(self.alias_of.keys())
            .copied()
            .filter(|&v| self.root(v) == root)
            .collect();
        out.push(root);
        out
    }

    /// Values sharing a buffer with another (in-place writes, aliases)
    /// or read back through another's (host views), on either side.
    pub fn shared_buffers(&self) -> HashSet<ValueId> {
        self.inplace
            .iter()
            .chain(&self.alias_of)
            .chain(&self.host_views)
            .flat_map(|(&a, &b)| [a, b])
            .collect()
    }

    /// The value owning `v`'s buffer (through in-place writes and aliases).
    pub fn root(&self, mut v: ValueId) -> ValueId {
        loop {
            match self.inplace.get(&v).or_else(|| self.alias_of.get(&v)) {
                Some(&b) => v = b,
                None => return v,
            }
        }
    }
}

/// Nodes inlined into the kernel that computes node `n`'s results.
pub fn inlined_region(g: &Graph, s: &Schedule, n: NodeId) -> HashSet<NodeId> {
    let mut seen = HashSet::new();
    let mut stack: Vec<ValueId> = g.nodes[n].inputs().into_vec();
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
    reads_from(g, s, read_inputs(g, n))
}

/// Does node `u` read the elements of its input `r`? (`full_like`,
/// `zeros_like`, `arange` read only sizes.)
pub fn reads_values(g: &Graph, u: NodeId, r: ValueId) -> bool {
    let node = &g.nodes[u];
    match node.op.def().lowering.elem() {
        Some(ops::Elem::Fill { value }) => {
            matches!(node.args.get(value), Some(Arg::Tensor(t)) if *t == r)
        }
        Some(ops::Elem::Constant { .. } | ops::Elem::Arange) => false,
        _ => true,
    }
}

/// The inputs whose elements node `n` reads.
fn read_inputs(g: &Graph, n: NodeId) -> Vec<ValueId> {
    let mut ins = g.nodes[n].inputs().into_vec();
    ins.retain(|&t| reads_values(g, n, t));
    ins
}

/// Materialized values read to compute `v` inline (`v` itself if it has a
/// buffer).
pub fn reads_value(g: &Graph, s: &Schedule, v: ValueId) -> Vec<ValueId> {
    reads_from(g, s, vec![v])
}

fn reads_from(g: &Graph, s: &Schedule, mut stack: Vec<ValueId>) -> Vec<ValueId> {
    let mut out = vec![];
    let mut seen = HashSet::new();
    while let Some(v) = stack.pop() {
        if !seen.insert(v) {
            continue;
        }
        if s.is_materialized.contains(&v) {
            out.push(v);
        } else if let Def::Node(m, _) = g.values[v].def {
            stack.extend(read_inputs(g, m));
        }
    }
    out.sort();
    out
}

/// An elementwise value computed by a plain map kernel.
pub fn is_map(g: &Graph, s: &Schedule, v: ValueId) -> bool {
    match g.values[v].def {
        Def::Node(n, _) => {
            class(g, n).is_ok_and(|c| c == Class::Map)
                && !s.inplace.contains_key(&v)
                && !s.fused.contains_key(&v)
        }
        Def::Input(_) => false,
    }
}

/// Whether a statement of the kernels computing `vals` (inlined producers
/// included) may record a fault: the kernel binds the status word.
pub fn may_fault_in(g: &Graph, sched: &Schedule, vals: &[ValueId]) -> bool {
    vals.iter().filter_map(|&v| g.node_of(v)).any(|n| {
        may_fault(g, n)
            || inlined_region(g, sched, n)
                .into_iter()
                .any(|m| may_fault(g, m))
    })
}

/// Whether statement `n` may record a fault at run time (`codegen::Fault`):
/// it produces or accumulates i64 values (beyond the device's 32 bits), or
/// reads positions from an index tensor (out of bounds).
pub fn may_fault(g: &Graph, n: NodeId) -> bool {
    let node = &g.nodes[n];
    // Fills, copies, views and indices (argmax) make no new i64 value.
    let i64_arithmetic = node
        .results
        .iter()
        .any(|&r| g.meta(r).dtype == kiln_functionalize::DType::I64)
        && matches!(
            node.op.def().lowering,
            Lowering::Map(Elem::Pointwise | Elem::Cast)
                | Lowering::Free(Elem::Pointwise | Elem::Cast)
                | Lowering::Reduce(_)
                | Lowering::Scan
                | Lowering::MatMul(_)
        );
    let indexed = matches!(
        node.op.def().lowering,
        Lowering::IndexPut
            | Lowering::Map(
                Elem::Index
                    | Elem::IndexAdd
                    | Elem::GatherAlong { .. }
                    | Elem::IndexSelect { .. }
                    | Elem::ScatterInto { .. }
            )
            | Lowering::Free(
                Elem::Index
                    | Elem::IndexAdd
                    | Elem::GatherAlong { .. }
                    | Elem::IndexSelect { .. }
                    | Elem::ScatterInto { .. }
            )
    );
    i64_arithmetic || indexed
}

/// `v`'s kernel and the kernels of `grp` can run in either order (as one
/// launch, or `v` first): `v` reads no buffer the group writes, and
/// writes none the group reads (an in-place write into a buffer a member
/// reads first must wait for it).
pub fn independent(g: &Graph, sched: &Schedule, grp: &[ValueId], v: ValueId) -> bool {
    let reads = |w: ValueId| -> HashSet<ValueId> {
        g.node_of(w)
            .map(|n| {
                reads(g, sched, n)
                    .into_iter()
                    .map(|r| sched.root(r))
                    .collect()
            })
            .unwrap_or_default()
    };
    let written: HashSet<ValueId> = grp.iter().map(|&w| sched.root(w)).collect();
    let mine = sched.root(v);
    reads(v).is_disjoint(&written) && grp.iter().all(|&w| !reads(w).contains(&mine))
}

/// The most elements of one value a row kernel's invocation holds: its
/// work runs serially in the invocation, and its blocks live in
/// registers. Past narrow rows the kernels apart (tiled products,
/// workgroup rows) win on a GPU.
pub const CHAIN_MAX_WIDTH: usize = 64;

/// The most multiply-adds of one product an invocation runs (a block of
/// 64 outputs over 64 contracted elements).
pub const CHAIN_MAX_PRODUCT: usize = 4096;

/// The most elements of an elementwise kernel that gives up its vector
/// loads to share a launch (`lower::join_map_launches`), or of a base
/// whose region updates join a kernel reading it whole
/// (`schedule::chain_better_whole`): a launch costs microseconds, more
/// than such a kernel's memory traffic takes at GPU bandwidth (256 KiB of
/// f32 in and out: under a microsecond at 1 TB/s).
pub const JOIN_MAX_ELEMENTS: usize = 1 << 16;

/// On GPUs (`CompileOptions::workgroup_rows`), the most elements of a
/// value a row kernel computes: past that the kernels apart (rows reduced
/// by workgroups, tiled products) keep more invocations busy with
/// coalesced loads; below it a launch costs more than their traffic (as
/// `JOIN_MAX_ELEMENTS`).
pub const CHAIN_GPU_MAX_ELEMENTS: usize = 1 << 16;

/// The elements layer norm node `n` normalizes together (the product of
/// its normalized shape).
pub fn norm_width(g: &Graph, n: NodeId) -> Option<usize> {
    match g.nodes[n].args.get(1) {
        Some(Arg::IntList(l)) => usize::try_from(l.iter().product::<i64>()).ok(),
        _ => None,
    }
}

/// Kernels in sequence compute at most this many flops and move at most
/// this many bytes as launches of their own: work one workgroup does in
/// about the time a launch takes to start (a multiprocessor of an H100,
/// about 0.5 TFLOP/s and 25 GB/s of its share of memory: 2-3 us; lavapipe
/// runs one workgroup on one thread: 0.1 ms, about a launch there).
pub const SEQUENCE_FLOPS: usize = 1 << 20;
pub const SEQUENCE_BYTES: usize = 1 << 16;

/// 2 M N K for a matrix product node (M N output elements, K the
/// contracted size); `None` for other nodes.
pub fn product_flops(g: &Graph, n: NodeId) -> Option<usize> {
    let node = &g.nodes[n];
    if node.op.def().lowering == Lowering::Attention {
        // q k^T and p v: 2 L S (E + Ev) per batch entry.
        let (q, k) = (*node.args[0].tensors()[0], *node.args[1].tensors()[0]);
        let (qm, km) = (g.meta(q), g.meta(k));
        let om = g.meta(node.results[0]);
        let s = km.sizes[km.dim() - 2];
        let e = qm.sizes[qm.dim() - 1];
        let ev = om.sizes[om.dim() - 1];
        return Some(2 * (om.numel() / ev.max(1)) * s * (e + ev));
    }
    Some(2 * g.meta(node.results[0]).numel() * product_depth(g, n)?)
}

/// K of product node `n`: its left operand holds K last.
pub fn product_depth(g: &Graph, n: NodeId) -> Option<usize> {
    let node = &g.nodes[n];
    let left = node.op.def().lowering.product()?.left;
    let x = *node.args.get(left)?.tensors().first()?;
    g.meta(*x).sizes.last().copied()
}

/// Is product node `n` narrow enough for a row kernel: a block of its
/// rows within `CHAIN_MAX_WIDTH` outputs and `CHAIN_MAX_PRODUCT`
/// multiply-adds?
pub fn narrow_product(g: &Graph, n: NodeId) -> bool {
    let Some(k) = product_depth(g, n) else {
        return false;
    };
    let width = g
        .meta(g.nodes[n].results[0])
        .sizes
        .last()
        .copied()
        .unwrap_or(1);
    width <= CHAIN_MAX_WIDTH && width * k <= CHAIN_MAX_PRODUCT
}

/// Bindings a kernel binding buffers `roots` takes: one each where
/// `window` is `None`. With the device's binding alignment (`window`
/// bytes), the arena's tensors smaller than a few windows count as one
/// binding together: placement packs them a word apart, and windows that
/// overlap are bound once (`lower::binding_windows`). Parameters and
/// larger tensors are bound alone. Decided before placement; where a
/// plan finds a kernel over the limit after all, its kernels are grouped
/// again counting a binding per buffer (`lower::Grouping::counted`).
pub fn bindings_of(g: &Graph, roots: &HashSet<ValueId>, window: Option<usize>) -> usize {
    let Some(window) = window else {
        return roots.len();
    };
    let alone = |r: &&ValueId| {
        g.inputs.contains(r) || g.meta(**r).numel() * g.meta(**r).dtype.size_bytes() >= 4 * window
    };
    let n = roots.iter().filter(alone).count();
    n + usize::from(n < roots.len())
}
