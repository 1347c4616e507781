//! WGSL for each kernel of a schedule. A value is read either from its
//! buffer or by generating its defining expression at the index wanted
//! (inlining), so view copies and broadcasts become index arithmetic and
//! elementwise chains fuse into one kernel.

mod attention;
mod chain;
mod custom;
mod elementwise;
mod expr;
mod gather;
mod maps;
mod matmul;
mod reduction;
mod scatter;
mod select;
pub(crate) mod sequence;
pub(crate) mod siblings;
mod template;

use crate::error::{CompileError, Stage};
use crate::index::{Affine, Region};
use crate::schedule::{Fused, Schedule};
use crate::wgsl::{self, cast, literal, load, store, ty, Binding, Body, Buf, Slot};
use kiln_functionalize::graph::{Def, Graph, NodeId, ValueId};
use kiln_functionalize::meta::{contiguous_strides, numel, Meta};
use kiln_functionalize::ops::args::ArgsExt;
use kiln_functionalize::ops::kernels::Advanced;
use kiln_functionalize::ops::pointwise::Src;
use kiln_functionalize::ops::{self, Elem, Lowering, Rule};
use kiln_functionalize::schema::Arg;
use kiln_functionalize::DType;
use std::collections::{HashMap, HashSet};

pub use crate::kernel::{BindingRules, Fault, KernelCode, Loc, Window};
pub(crate) use elementwise::transposed_blocks;

/// Elementwise kernels reading and writing four consecutive elements an
/// invocation as `vec4<u32>` (GPUs: wider memory transactions).
#[derive(Default)]
pub(crate) struct Vectorize {
    /// Bindings accessed only at the invocation's own four elements.
    slots: std::collections::HashSet<String>,
    /// Lane index expressions -> lane.
    lanes: HashMap<String, usize>,
    /// Bindings whose vector at the current quad this invocation has
    /// loaded, and the variable holding it.
    loaded: HashMap<String, String>,
    /// The vector index of the quad the lanes are elements of (`gid`
    /// where empty).
    quad: String,
    /// In a kernel of blocks (`Gen::map_group_blocked`).
    block: Option<BlockState>,
    /// Indices read lane to lane in aligned quads (`Affine::keeps_quads`)
    /// -> the quad's first index and the lane.
    quads: HashMap<String, (String, usize)>,
    /// A quad-keeping map applied to the first lane's index, once.
    firsts: HashMap<(crate::index::Affine, String), String>,
    /// Quads loaded as vectors: (binding, first index) -> the vector.
    quad_loads: HashMap<(String, String), String>,
    /// The body's block depth where the invocation's elements are
    /// computed, and how far `Gen::depth` has counted: quads are mapped
    /// and loaded there only, where every later lane sees them.
    top: usize,
    counted: (usize, usize),
}

/// How far map `a` moves its image for a step of one row (`cols`
/// elements) inside a block of `height` rows (rows `hr..hr+h-1` of a
/// matrix whose rows number a multiple of `height`): the stride of the
/// dim whose inner dims span exactly a row, where that dim's size is a
/// multiple of `height` (so the block's rows never carry into the dim
/// above). `None` where no dim is a row.
fn row_step(a: &Affine, cols: usize, height: usize) -> Option<usize> {
    let s = a.simplified();
    let mut inner = 1;
    for p in (0..s.sizes.len()).rev() {
        if inner == cols {
            return s.sizes[p].is_multiple_of(height).then_some(s.strides[p]);
        }
        inner *= s.sizes[p];
        if inner > cols {
            return None;
        }
    }
    None
}

/// The block an invocation of `Gen::map_group_blocked` computes.
struct BlockState {
    /// Each element's index expression -> its (row, column) in the block.
    at: HashMap<String, (usize, usize)>,
    /// The elements of the first row of each quad of the block's rows
    /// (the first row first).
    quad_rows: Vec<Vec<String>>,
    /// The result's columns (a row's elements).
    cols: usize,
    /// The block's rows: 4 or 8.
    height: usize,
    /// The transposing view copies read four rows at a time -> their
    /// stored source.
    views: HashMap<(NodeId, usize), ValueId>,
}

impl Vectorize {
    /// The lane of `idx` when `var` is read as vectors.
    fn component(&self, var: &str, idx: &str) -> Option<usize> {
        if !self.slots.contains(var) {
            return None;
        }
        self.lanes.get(idx).copied()
    }

    /// The first index of the aligned quad holding `idx`, and its lane:
    /// an invocation's own elements, or what a quad-keeping map takes them to.
    fn quad_of(&self, idx: &str) -> Option<(String, usize)> {
        if let Some(&l) = self.lanes.get(idx) {
            let first = self.lanes.iter().find(|(_, &k)| k == 0)?.0.clone();
            return Some((first, l));
        }
        self.quads.get(idx).cloned()
    }
}

/// A tensor bound by the kernel being generated.
struct SlotInfo {
    loc: Loc,
    words: usize,
    /// First word of the first binding (aligned down from `loc.word`).
    start: usize,
    chunks: usize,
    chunk_words: usize,
    written: bool,
    /// Bound as `array<vec4<u32>>` (an elementwise kernel reading and
    /// writing it four elements at a time).
    vec4: bool,
    /// Bound as `array<atomic<u32>>` (`Gen::lane_stores`).
    atomic: bool,
}

pub struct Gen<'a> {
    pub g: &'a Graph,
    pub s: &'a Schedule,
    pub locs: &'a HashMap<ValueId, Loc>,
    body: Body,
    memo: HashMap<(ValueId, String), String>,
    /// i64 range faults carried with a value instead of raised where it
    /// is computed (`settle`): its variable -> a `u32` variable holding the
    /// fault's status code, 0 where none.
    pending: HashMap<String, String>,
    shared: Vec<String>,
    /// Values computed by the elementwise kernel being generated: readable
    /// only at the invocation's own index (another invocation's write is
    /// not visible); `index::fits_group` decides, this checks.
    group: Vec<ValueId>,
    /// The index expression of the element the invocation computes now.
    own: String,
    /// The elementwise members a reduction kernel computes and stores at
    /// each element of its input it visits (`lower::folds_into`).
    pub prologue: Vec<ValueId>,
    /// See `CompileOptions::tile_min_rows`.
    pub tile_min_rows: usize,
    /// See `CompileOptions::tall_tiles_from`.
    pub tall_tiles_from: usize,
    /// Fused kernel members only their own kernel reads: computed, never
    /// stored.
    pub registers: std::collections::HashSet<ValueId>,
    /// See `CompileOptions::workgroup_rows`.
    pub workgroup_rows: bool,
    /// See `CompileOptions::tile_transposes`.
    pub tile_transposes: bool,
    /// See `CompileOptions::transpose_tile`.
    pub transpose_tile: usize,
    /// See `CompileOptions::transpose_blocks` (off where tiles are on).
    pub transpose_blocks: bool,
    /// See `CompileOptions::wide_blocks`.
    pub wide_blocks: bool,
    /// In a transposed tile kernel (`map_group_tiled`): view copies read
    /// at the invocation's element from workgroup memory, by the array
    /// holding them.
    tiles: HashMap<(NodeId, usize), String>,
    /// The index into those arrays of the element computed now.
    tile_at: String,
    /// See `CompileOptions::vectorize`.
    pub vectorize: bool,
    vec: Vectorize,
    /// Invocations per workgroup of 1-D kernels.
    pub workgroup: u32,
    /// See `CompileOptions::grid_stride`.
    pub grid_stride: Option<usize>,
    /// See `CompileOptions::subgroup`.
    pub subgroup: Option<usize>,
    /// See `CompileOptions::attention_rows`.
    pub attention_rows: bool,
    /// The kernel being generated uses subgroup operations.
    uses_subgroup: bool,
    /// See `CompileOptions::shader_f16`.
    pub shader_f16: bool,
    /// In an epilogue kernel: (the kernel's own result, the elementwise
    /// tail stored in its place).
    epilogue: Option<(ValueId, ValueId)>,
    /// In a reduction kernel with a `Fused::Rows` tail: (the reduction's
    /// result, the tail stored over its rows instead).
    rows: Option<(ValueId, ValueId)>,
    /// While a `Fused::Rows` tail is computed at one element: the
    /// reduction's result and its value for that element's row (the tail
    /// reads it only broadcast, at that row: `schedule::fuse_rows`).
    row_result: Option<(ValueId, String)>,
    /// The element count of the 1-D kernel being generated when its
    /// invocations loop over the grid (`guard`).
    stride_over: Option<usize>,
    /// While the branches of a sibling-product kernel are generated
    /// (`siblings`): each finished kernel body, kept to be joined.
    parts: Option<Vec<siblings::Part>>,
    /// The launch shape (`siblings::Shape`) of each value of a group of
    /// kernels that could not all share one launch: the plan is made
    /// again with groups of one shape.
    pub apart: HashMap<ValueId, siblings::Shape>,
    pub rules: BindingRules,
    slots: Vec<SlotInfo>,
    /// Tensor ranges (buffer, word, words) the elementwise kernel being
    /// generated binds as `vec4<u32>`: the plan's choice.
    pub vec4_ranges: HashSet<(Buf, usize, usize)>,
    /// The bindings of the kernel being generated
    /// (`lower::binding_windows`): tensors in a window several share are
    /// bound together, each at its own base in it.
    pub windows: Vec<Window>,
    /// Packed tensors (where they start) the kernel being generated
    /// stores element by element, its invocations owning no whole words:
    /// the bindings holding them are atomic (`wgsl::store_lane`).
    pub lane_stores: Vec<Loc>,
    /// The kernel being generated stores only whole words per invocation
    /// (each element's neighbours in its word are the same invocation's):
    /// its packed stores need no atomic binding. Set by a kernel family
    /// before it binds anything; `finish` clears it.
    owns_words: bool,
    /// The kernel being generated as a part of a shared launch stores
    /// packed words another part's stores may share (`stores_runs`):
    /// whole words alone, lane by lane there.
    words_shared: bool,
    /// The kernel declares `pk`, the var gathering the lanes of a word
    /// such a kernel stores.
    run_word: bool,
    /// In a row kernel (`Gen::row_chain`): each value computed so far ->
    /// the array holding this invocation's block of it and the block's
    /// first element.
    resident: HashMap<ValueId, (String, String)>,
    /// In a product kernel whose left operand is a norm it computes
    /// (`Schedule::norm_operands`): that norm, its rows' (mean, rstd) in
    /// workgroup array `NORM_STATS` from row `NORM_FIRST` on.
    norm_rows: Option<ValueId>,
    /// The row kernel value being computed: its stores fill its array
    /// (memory is written once the block is complete).
    filling: Option<ValueId>,
    /// Kernels in sequence in one workgroup (`sequence`): each kept as a
    /// part, run alone (its packed stores whole words where it owns them).
    sequential: bool,
    /// In kernels in sequence: values kept in workgroup memory, each at
    /// its word of `sequence::WSM`, `wsm_words` long.
    in_workgroup: HashMap<ValueId, usize>,
    /// Values of `in_workgroup` also stored in memory (read back).
    written_through: HashSet<ValueId>,
    wsm_words: usize,
    /// The arena word where kernels record a fault (`Fault`): see
    /// `flag`, read back after the run.
    pub status: Option<usize>,
    /// Some kernel records i64 overflow in the status word.
    pub status_used: bool,
}

type R<T> = Result<T, CompileError>;

fn bug(msg: impl Into<String>) -> CompileError {
    CompileError::internal(Stage::Codegen, msg)
}

/// Either of two status codes (a nonzero one wins).
fn either(a: Option<String>, b: Option<String>) -> Option<String> {
    match (a, b) {
        (Some(a), Some(b)) => Some(format!("max({a}, {b})")),
        (a, b) => a.or(b),
    }
}

/// The side of a transposed tile (`Gen::map_group_tiled`): 16x16
/// invocations, rows of 16 elements read and written together.
const TILE: usize = 16;

fn u(v: usize) -> String {
    format!("{v}u")
}

impl<'a> Gen<'a> {
    pub fn new(g: &'a Graph, s: &'a Schedule, locs: &'a HashMap<ValueId, Loc>) -> Gen<'a> {
        Gen {
            g,
            s,
            locs,
            body: Body::default(),
            memo: HashMap::new(),
            pending: HashMap::new(),
            shared: vec![],
            group: vec![],
            own: "gid".into(),
            prologue: vec![],
            tile_min_rows: 0,
            tall_tiles_from: 512,
            registers: Default::default(),
            workgroup_rows: true,
            tile_transposes: false,
            transpose_tile: TILE,
            transpose_blocks: false,
            wide_blocks: false,
            tiles: HashMap::new(),
            tile_at: String::new(),
            vectorize: false,
            vec: Vectorize::default(),
            workgroup: wgsl::WORKGROUP,
            grid_stride: None,
            subgroup: None,
            attention_rows: false,
            uses_subgroup: false,
            shader_f16: false,
            epilogue: None,
            rows: None,
            row_result: None,
            stride_over: None,
            parts: None,
            apart: HashMap::new(),
            rules: BindingRules::default(),
            slots: vec![],
            vec4_ranges: HashSet::new(),
            windows: vec![],
            lane_stores: vec![],
            owns_words: false,
            words_shared: false,
            run_word: false,
            resident: HashMap::new(),
            norm_rows: None,
            filling: None,
            sequential: false,
            in_workgroup: HashMap::new(),
            written_through: HashSet::new(),
            wsm_words: 0,
            // `lower` places it.
            status: None,
            status_used: false,
        }
    }

    /// The status code of `fault` at statement `n`: its 1-based position
    /// times 2, plus the fault.
    fn fault_pos(&self, n: NodeId, fault: Fault) -> usize {
        (self.g.order.iter().position(|&m| m == n).unwrap_or(0) + 1) * 2 + fault as usize
    }

    /// An i64 range fault of statement `n` where `cond` holds, as a status
    /// code expression (0 where it does not).
    pub(super) fn overflow_code(&self, n: NodeId, cond: &str) -> String {
        format!(
            "select(0u, {}u, {cond})",
            self.fault_pos(n, Fault::I64Range)
        )
    }

    /// Where the range faults `code` of value `r` (node `n`'s result) go.
    /// Eager computes i64 in 64 bits, so a value out of the device's range
    /// only matters if it reaches a result: when every consumer of `n` is
    /// an elementwise map computed inline, the code travels with `r` into
    /// them (a `where` drops the branch it discards: T5's position buckets
    /// cast `log(0)` to i64, then select it away); anything else (a store,
    /// an index, a reduction) records it now.
    pub(super) fn settle(&mut self, n: NodeId, r: &str, code: Option<String>) -> R<()> {
        let Some(code) = code else {
            return Ok(());
        };
        if self.carries(n) {
            let c = self.body.bind("u32", code);
            self.pending.insert(r.to_string(), c);
            return Ok(());
        }
        self.raise(&code)
    }

    /// The pending fault code of value variable `x`, if any.
    pub(super) fn fault_of(&self, x: &str) -> Option<String> {
        self.pending.get(x).cloned()
    }

    /// Node `n`'s results are never stored and only elementwise maps and
    /// casts read their values (each computes them inline, so it takes
    /// the code; `full_like` and the like read only their sizes).
    fn carries(&self, n: NodeId) -> bool {
        let g = self.g;
        g.nodes[n].results.iter().all(|&r| {
            (!self.s.is_materialized.contains(&r) || self.registers.contains(&r))
                && self.s.uses.get(&r).is_some_and(|us| {
                    !us.is_empty()
                        && us.iter().all(|&u| {
                            !crate::schedule::reads_values(g, u, r)
                                || matches!(
                                    g.nodes[u].op.def().lowering.elem(),
                                    Some(ops::Elem::Pointwise | ops::Elem::Cast)
                                )
                        })
                })
        })
    }

    /// Records `code` (a `u32` status code expression) in the status word
    /// where it is not 0.
    fn raise(&mut self, code: &str) -> R<()> {
        let word = self
            .status
            .ok_or_else(|| bug("i64 arithmetic in a program without a status word"))?;
        self.status_used = true;
        let loc = Loc {
            buf: Buf::Arena,
            word,
            packed: false,
        };
        let slot = self.slot(loc, 1, true);
        let c = self.body.bind("u32", code.to_string());
        self.body
            .stmt(format!("if ({c} != 0u) {{ {} }}", slot.set_word("0u", &c)));
        Ok(())
    }

    /// Records at run time that statement `n` produced an i64 value outside
    /// the device's 32-bit range where `cond` holds (`wgsl::ty`).
    pub(super) fn flag_overflow(&mut self, n: NodeId, cond: &str) -> R<()> {
        self.flag(n, cond, Fault::I64Range)
    }

    /// Records at run time that statement `n` read index `i` (an i32
    /// expression) outside `lo..len` (`lo` 0, or `-len` where negative
    /// indices wrap), as eager refuses it.
    pub(super) fn flag_index(&mut self, n: NodeId, i: &str, len: usize, wraps: bool) -> R<()> {
        let lo = if wraps { -(len as i64) } else { 0 };
        self.flag(
            n,
            &format!("{i} < {lo}i || {i} >= {}i", len as i64),
            Fault::IndexRange,
        )
    }

    /// Records `fault` of statement `n` in the status word where `cond`
    /// holds.
    fn flag(&mut self, n: NodeId, cond: &str, fault: Fault) -> R<()> {
        let word = self
            .status
            .ok_or_else(|| bug("i64 arithmetic in a program without a status word"))?;
        self.status_used = true;
        let pos = self.fault_pos(n, fault);
        let loc = Loc {
            buf: Buf::Arena,
            word,
            packed: false,
        };
        let slot = self.slot(loc, 1, true);
        self.body.stmt(format!(
            "if ({cond}) {{ {} }}",
            slot.set_word("0u", &u(pos))
        ));
        Ok(())
    }

    /// The slot of the tensor at `loc` (`words` long), bound once per kernel.
    fn slot(&mut self, loc: Loc, words: usize, write: bool) -> Slot {
        self.slot_as(loc, words, write, false)
    }

    /// `slot`, bound as `vec4<u32>` when `vec4` is asked for (and the
    /// tensor is new to this kernel, in one binding).
    fn slot_as(&mut self, loc: Loc, words: usize, write: bool, vec4: bool) -> Slot {
        let i = match self
            .slots
            .iter()
            .position(|s| s.loc.buf == loc.buf && s.loc.word == loc.word && s.words == words)
        {
            Some(i) => i,
            None => {
                let crate::kernel::Span {
                    start,
                    chunks,
                    chunk_words,
                } = self.rules.span(loc.word, words);
                if let Some(i) = self.shared_window(loc, words, chunks) {
                    let info = &mut self.slots[i];
                    info.written |= write;
                    return Slot {
                        var: format!("b{i}"),
                        base: loc.word - info.start,
                        copy: None,
                        chunk: None,
                        vec4: false,
                        atomic: info.atomic,
                    };
                }
                let planned = start == loc.word
                    && chunks == 1
                    && self.vec4_ranges.contains(&(loc.buf, loc.word, words));
                if planned {
                    self.vec.slots.insert(format!("b{}", self.slots.len()));
                }
                let atomic = !self.owns_words
                    && self.holds_lane_stores(loc.buf, start, loc.word + words.max(1));
                let vec4 = !atomic
                    && (planned
                        || chunks == 1
                            && vec4
                            && (loc.word - start).is_multiple_of(4)
                            && words.is_multiple_of(4));
                self.slots.push(SlotInfo {
                    loc,
                    words,
                    start,
                    chunks,
                    chunk_words,
                    written: false,
                    vec4,
                    atomic,
                });
                self.slots.len() - 1
            }
        };
        let info = &mut self.slots[i];
        info.written |= write;
        Slot {
            var: format!("b{i}"),
            base: info.loc.word - info.start,
            copy: None,
            chunk: (info.chunks > 1).then_some(info.chunk_words),
            vec4: info.vec4,
            atomic: info.atomic,
        }
    }

    /// Declares that each invocation of the kernel being generated stores
    /// the elements of `v` (its stored value) at `len` consecutive
    /// positions from a multiple of `len` (a row, a block's columns), in
    /// order, nothing else stored in between: whole packed words where
    /// `len` fills words. Not in a launch shared with other kernels (their
    /// stores may not own words), nor through a permuting epilogue that
    /// moves the last dim (it scatters a run).
    fn stores_runs(&mut self, v: ValueId, len: usize) {
        let stored = match self.epilogue {
            Some((src, t)) if src == v => t,
            _ => v,
        };
        let owns = self.keeps_last_dim(stored)
            && len.is_multiple_of(wgsl::per_word(self.meta(stored).dtype));
        let alone = self.parts.is_none() || self.sequential;
        self.owns_words = alone && owns;
        // Packed words it would have stored whole, alone.
        self.words_shared |= !alone && owns && wgsl::per_word(self.meta(stored).dtype) > 1;
    }

    /// Do the permuting copies `v` is stored through (`Schedule::permuted`)
    /// keep the last dim innermost? Then a run along it stays a run, and
    /// every other stride is a multiple of its length.
    fn keeps_last_dim(&self, v: ValueId) -> bool {
        let g = self.g;
        self.s.permuted.get(&v).into_iter().flatten().all(|&p| {
            // A reshape keeps every element's flat place.
            self.permuted_link(p).is_ok_and(|(input, a)| {
                a.is_identity()
                    || (a.strides.last() == Some(&1)
                        && a.sizes.last() == g.meta(input).sizes.last())
            })
        })
    }

    /// Permuting copy `p` (`schedule::permuted_copy`): the value it copies
    /// and the map from its elements to that value's.
    fn permuted_link(&self, p: ValueId) -> R<(ValueId, Affine)> {
        let g = self.g;
        let Def::Node(n, k) = g.values[p].def else {
            return Err(bug("a permuted epilogue without a node"));
        };
        let node = &g.nodes[n];
        let (&Rule::ViewCopy(view), Some(&Arg::Tensor(input))) =
            (&node.op.def().rule, node.args.first())
        else {
            return Err(bug("a permuted epilogue through no view copy"));
        };
        let a = Affine::view(g, view, g.meta(input), &node.args[1..], k).map_err(bug)?;
        Ok((input, a))
    }

    /// Does words `start..end` of `buf` hold a tensor of `lane_stores`?
    fn holds_lane_stores(&self, buf: Buf, start: usize, end: usize) -> bool {
        self.lane_stores
            .iter()
            .any(|l| l.buf == buf && start <= l.word && l.word < end)
    }

    /// The slot of the window (`windows`) tensor `loc` of `words` words
    /// shares with others, bound as one range of words: `None` where the
    /// tensor's binding is its own.
    fn shared_window(&mut self, loc: Loc, words: usize, chunks: usize) -> Option<usize> {
        let end = loc.word + words.max(1);
        let &Window {
            buf,
            start: lo,
            end: hi,
            ..
        } = self.windows.iter().find(|w| {
            chunks == 1 && w.tensors > 1 && w.buf == loc.buf && w.start <= loc.word && end <= w.end
        })?;
        let i = self.slots.iter().position(|s| {
            s.loc.buf == buf && s.start == lo && s.loc.word + s.words.max(1) == hi && !s.vec4
        });
        let atomic = !self.owns_words && self.holds_lane_stores(buf, lo, hi);
        Some(i.unwrap_or_else(|| {
            self.slots.push(SlotInfo {
                loc: Loc {
                    buf,
                    word: lo,
                    packed: false,
                },
                words: hi - lo,
                start: lo,
                chunks: 1,
                chunk_words: hi - lo,
                written: false,
                vec4: false,
                atomic,
            });
            self.slots.len() - 1
        }))
    }

    /// The slot of materialized f32 value `v` bound as `vec4<u32>`, when it
    /// can be: `None` for inlined values, packed or split tensors, and
    /// tensors this kernel already binds as words.
    fn vec4_slot_of(&mut self, v: ValueId) -> R<Option<Slot>> {
        if !self.s.is_materialized.contains(&v)
            || self.meta(v).dtype != DType::F32
            || self.in_workgroup.contains_key(&v)
        {
            return Ok(None);
        }
        let loc = self.loc_of(v)?;
        let words = self.meta(v).numel();
        let known = self
            .slots
            .iter()
            .any(|s| s.loc.buf == loc.buf && s.loc.word == loc.word && s.words == words);
        let slot = self.slot_as(loc, words, false, !known);
        Ok(slot.vec4.then_some(slot))
    }

    /// How many blocks the body has open at its end (counted from where the
    /// last count stopped).
    fn depth(&mut self) -> usize {
        let (mut at, mut depth) = self.vec.counted;
        for line in &self.body.lines[at.min(self.body.lines.len())..] {
            depth += line.matches('{').count();
            depth = depth.saturating_sub(line.matches('}').count());
            at += 1;
        }
        self.vec.counted = (at, depth);
        depth
    }

    /// Lane `lane` of the aligned quad starting at element-word `first` of
    /// `slot` (bound as vectors), loaded once.
    fn quad_word(&mut self, slot: &Slot, first: &str, lane: usize) -> String {
        let key = (slot.var.clone(), first.to_string());
        let q = match self.vec.quad_loads.get(&key) {
            Some(q) => q.clone(),
            None => {
                let at = if slot.base == 0 {
                    first.to_string()
                } else {
                    format!("{}u + {first}", slot.base)
                };
                let q = self
                    .body
                    .bind("vec4<u32>", format!("{}[({at}) >> 2u]", slot.var));
                self.vec.quad_loads.insert(key, q.clone());
                q
            }
        };
        format!("{q}.{}", ["x", "y", "z", "w"][lane])
    }

    /// Lane `c` of binding `var`'s vector for this invocation (loaded once).
    fn vec_word(&mut self, var: &str, c: usize) -> String {
        let v = match self.vec.loaded.get(var) {
            Some(v) => v.clone(),
            None => {
                let q = match self.vec.quad.as_str() {
                    "" => "gid",
                    q => q,
                };
                let v = self.body.bind("vec4<u32>", format!("{var}[{q}]"));
                self.vec.loaded.insert(var.to_string(), v.clone());
                v
            }
        };
        format!("{v}.{}", ["x", "y", "z", "w"][c])
    }

    /// Where materialized value `v` lives (the plan's layout).
    fn loc_of(&self, v: ValueId) -> R<Loc> {
        match self.locs.get(&v) {
            Some(l) => Ok(*l),
            None => Err(bug("a materialized value without a buffer")),
        }
    }

    /// The slot of materialized value `v`.
    fn slot_of(&mut self, v: ValueId, write: bool) -> R<(Slot, Loc)> {
        let loc = self.loc_of(v)?;
        if let Some(slot) = self.workgroup_slot(v, loc, write) {
            return Ok((slot, loc));
        }
        let m = self.meta(v);
        let words = wgsl::words(m.dtype, m.numel(), loc.packed);
        Ok((self.slot(loc, words, write), loc))
    }

    /// The bindings of the kernel generated so far, with their declarations.
    fn take_bindings(&mut self) -> (Vec<String>, Vec<Binding>) {
        let slots = std::mem::take(&mut self.slots);
        // One buffer is writable in every binding of a dispatch or in none.
        let writable: Vec<Buf> = slots
            .iter()
            .filter(|s| s.written)
            .map(|s| s.loc.buf)
            .collect();
        let mut bindings = vec![];
        let mut vars = vec![];
        for (i, s) in slots.iter().enumerate() {
            let total = s.loc.word - s.start + s.words.max(1);
            for c in 0..s.chunks {
                let lo = c * s.chunk_words;
                let words = if s.chunks == 1 {
                    total
                } else {
                    s.chunk_words.min(total - lo)
                };
                bindings.push(Binding {
                    buf: s.loc.buf,
                    offset: ((s.start + lo) * 4) as u64,
                    size: (words * 4) as u64,
                    write: writable.contains(&s.loc.buf),
                });
            }
            vars.push(wgsl::BindingVar {
                var: format!("b{i}"),
                chunks: s.chunks,
                chunk_words: (s.chunks > 1).then_some(s.chunk_words),
                vec4: s.vec4,
                atomic: s.atomic,
            });
        }
        (wgsl::declarations(&vars, &bindings), bindings)
    }

    fn meta(&self, v: ValueId) -> &'a Meta {
        self.g.meta(v)
    }

    /// Guards a 1-D kernel over `n` invocation indices (`gid`): each
    /// invocation handles one, or, with `grid_stride`, loops over the grid
    /// (`finish` wraps the body and caps the workgroups).
    fn guard(&mut self, n: usize) {
        if self.grid_stride.is_some() {
            self.stride_over = Some(n);
        } else {
            self.body
                .stmt(format!("if (gid >= {}) {{ return; }}", u(n)));
        }
    }

    fn finish(&mut self, label: String, mut grid: [u32; 3], wg: [u32; 3]) -> KernelCode {
        self.owns_words = false;
        let words_shared = std::mem::take(&mut self.words_shared);
        self.run_word = false;
        let mut body = std::mem::take(&mut self.body);
        if let (Some(n), Some(cap)) = (self.stride_over.take(), self.grid_stride) {
            // Enough workgroups to fill the device, each invocation
            // striding over the rest: fewer workgroups to schedule, and
            // index setup amortized over several elements.
            grid = wgsl::fold(n.div_ceil(wg[0] as usize).min(cap.max(1)));
            let stride = "nwg.x * nwg.y * nwg.z";
            let mut lines = vec![format!(
                "for (var gid: u32 = (wid.y * nwg.x + wid.x) * {w}u + lid.x; gid < {n}u; gid = gid + {stride} * {w}u) {{",
                w = wg[0]
            )];
            lines.append(&mut body.lines);
            lines.push("}".into());
            body.lines = lines;
        }
        let shared = std::mem::take(&mut self.shared);
        self.memo.clear();
        self.pending.clear();
        self.vec = Vectorize::default();
        if let Some(parts) = &mut self.parts {
            // A branch of a sibling-product kernel: its bindings stay for
            // the joined kernel.
            parts.push(siblings::Part {
                label: label.clone(),
                grid,
                wg,
                lines: body.lines,
                shared,
                words_shared,
            });
            return KernelCode {
                label,
                wgsl: String::new(),
                grid,
                bindings: vec![],
                subgroup: false,
                wgsl_f16: None,
            };
        }
        let (decls, bindings) = self.take_bindings();
        KernelCode {
            label,
            wgsl: wgsl::shader(&decls, &body.lines, wg, &shared, false),
            wgsl_f16: (self.shader_f16 && wgsl::converts_to_f16(&body.lines))
                .then(|| wgsl::shader(&decls, &body.lines, wg, &shared, true)),
            grid,
            bindings,
            subgroup: std::mem::take(&mut self.uses_subgroup),
        }
    }

    /// Per-dimension indices of flat row-major `idx` over `sizes`.
    fn unravel(&mut self, idx: &str, sizes: &[usize]) -> Vec<String> {
        // A shape with no elements has no index to unravel (and `% 0u` is
        // not valid WGSL): the code runs for no element.
        if sizes.contains(&0) {
            return vec!["0u".to_string(); sizes.len()];
        }
        let strides = contiguous_strides(sizes);
        sizes
            .iter()
            .zip(&strides)
            .map(|(&s, &st)| {
                if s == 1 {
                    "0u".to_string()
                } else if st == 1 {
                    self.body.bind("u32", format!("{idx} % {}", u(s)))
                } else {
                    self.body
                        .bind("u32", format!("({idx} / {}) % {}", u(st), u(s)))
                }
            })
            .collect()
    }

    /// `offset + Σ m_d * strides_d`.
    fn ravel(&mut self, m: &[String], strides: &[usize], offset: usize) -> String {
        let mut terms = vec![];
        if offset > 0 {
            terms.push(u(offset));
        }
        for (x, &st) in m.iter().zip(strides) {
            if st != 0 && x != "0u" {
                terms.push(if st == 1 {
                    x.clone()
                } else {
                    format!("{x} * {}", u(st))
                });
            }
        }
        if terms.is_empty() {
            return "0u".into();
        }
        self.body.bind("u32", terms.join(" + "))
    }

    /// The index into `operand` (broadcast to `out`) of output element `idx`.
    fn broadcast_index(&mut self, idx: &str, out: &[usize], operand: &Meta) -> String {
        self.index_at(&Affine::broadcast(out, operand), idx)
    }

    /// Index map `a` applied to element `idx`, as WGSL.
    pub(crate) fn index_at(&mut self, a: &Affine, idx: &str) -> String {
        if a.is_identity() {
            return idx.to_string();
        }
        // Four elements an invocation: a map keeping quads takes lane `l`
        // to its image of the first lane plus `l` (`quad_word` then loads
        // the quad once).
        let top = !self.vec.lanes.is_empty() && self.depth() == self.vec.top;
        if let Some((first, lane)) = self.vec.quad_of(idx).filter(|_| top && a.keeps_quads()) {
            let i0 = self.quad_first(a, &first);
            let at = if lane == 0 {
                i0.clone()
            } else {
                self.body.bind("u32", format!("{i0} + {}", u(lane)))
            };
            self.vec.quads.insert(i0.clone(), (i0.clone(), 0));
            self.vec.quads.insert(at.clone(), (i0, lane));
            return at;
        }
        self.mapped_index(a, idx)
    }

    /// Map `a` applied to `first` (an element of the invocation's, the
    /// first of an aligned quad or of a block's column), once. In a block,
    /// a later row's image follows from the first row's, same column,
    /// where the map steps evenly down the rows (`row_step`): a row
    /// broadcast reads the same quad for all the rows, a transposing view
    /// the next quad of its source four rows down.
    fn quad_first(&mut self, a: &Affine, first: &str) -> String {
        let key = (a.clone(), first.to_string());
        if let Some(x) = self.vec.firsts.get(&key) {
            return x.clone();
        }
        let below = self.vec.block.as_ref().and_then(|b| {
            let &(i, j) = b.at.get(first).filter(|&&(i, _)| i > 0)?;
            Some((b.quad_rows[0][j].clone(), i, row_step(a, b.cols, b.height)?))
        });
        let x = match below {
            Some((top, i, step)) => {
                let x0 = self.quad_first(a, &top);
                if step == 0 {
                    x0
                } else {
                    self.body.bind("u32", format!("{x0} + {}", u(i * step)))
                }
            }
            None => self.mapped_index(a, first),
        };
        self.vec.firsts.insert(key, x.clone());
        x
    }

    /// `index_at` for a map that is not the identity.
    fn mapped_index(&mut self, a: &Affine, idx: &str) -> String {
        if a.is_constant() {
            return if a.offset == 0 {
                "0u".into()
            } else {
                u(a.offset)
            };
        }
        let a = a.simplified();
        let m = self.unravel(idx, &a.sizes);
        self.ravel(&m, &a.strides, a.offset)
    }

    /// `r` (of dtype `from`, carrying range faults `code`) converted to
    /// `to` as node `n`'s result, with the faults of values an i64 result
    /// cannot hold on the device (`wgsl::ty`) settled.
    fn narrowed(
        &mut self,
        n: NodeId,
        r: &str,
        from: DType,
        to: DType,
        code: Option<String>,
    ) -> R<String> {
        let own = match (to, from) {
            (DType::I64, f) if f.is_float() => Some(
                self.overflow_code(n, &format!("!({r} >= -2147483648.0 && {r} < 2147483648.0)")),
            ),
            (DType::I64, DType::U32) => Some(self.overflow_code(n, &format!("{r} > 2147483647u"))),
            _ => None,
        };
        let x = self.body.bind(ty(to), cast(r, from, to));
        self.settle(n, &x, either(code, own))?;
        Ok(x)
    }

    /// The row kernel value whose registers hold `v`: `v` itself, or the
    /// value a reshape sharing its buffer (`alias_of`) is of.
    pub(super) fn held(&self, v: ValueId) -> ValueId {
        match self.s.alias_of.get(&v) {
            Some(&b) if self.resident.contains_key(&b) && !self.resident.contains_key(&v) => b,
            _ => v,
        }
    }

    /// Element `idx` of value `v`, as a shader value of `v`'s dtype.
    pub fn value_at(&mut self, v: ValueId, idx: &str) -> R<String> {
        if let Some((_, x)) = self.row_result.as_ref().filter(|(r, _)| *r == v) {
            return Ok(x.clone());
        }
        let held = self.held(v);
        if self.filling != Some(held) {
            if let Some((arr, base)) = self.resident.get(&held) {
                // A row kernel's earlier value, at an element of its block.
                let at = format!("{arr}[{idx} - {base}]");
                return Ok(self.body.bind(ty(self.meta(v).dtype), at));
            }
        }
        let key = (v, idx.to_string());
        if let Some(x) = self.memo.get(&key) {
            return Ok(x.clone());
        }
        if idx != self.own && self.group.contains(&self.s.root(v)) {
            return Err(bug("a fused kernel reads its own output at another index"));
        }
        let m = self.meta(v);
        let x = if self.s.is_materialized.contains(&v) {
            let (slot, loc) = self.slot_of(v, false)?;
            // Packed values (bools, f16) are read by word, and tensors bound
            // in pieces through accessors: never as vectors.
            let quad = self
                .vec
                .quads
                .get(idx)
                .cloned()
                .filter(|_| slot.vec4 && slot.chunk.is_none() && !slot.atomic)
                .filter(|_| slot.base.is_multiple_of(4));
            match self.vec.component(&slot.var, idx).filter(|_| !loc.packed) {
                Some(c) => {
                    let w = self.vec_word(&slot.var, c);
                    self.body.bind(ty(m.dtype), wgsl::from_word(m.dtype, &w))
                }
                None => match quad.filter(|_| !loc.packed && self.depth() == self.vec.top) {
                    Some((first, lane)) => {
                        let w = self.quad_word(&slot, &first, lane);
                        self.body.bind(ty(m.dtype), wgsl::from_word(m.dtype, &w))
                    }
                    None => self
                        .body
                        .bind(ty(m.dtype), load(&slot, idx, m.dtype, loc.packed)),
                },
            }
        } else if self.norm_rows == Some(v) {
            self.norm_at(v, idx)?
        } else {
            let Def::Node(n, k) = self.g.values[v].def else {
                return Err(bug("an input without a buffer"));
            };
            self.node_at(n, k, idx)?
        };
        self.memo.insert(key, x.clone());
        Ok(x)
    }

    fn store_to(&mut self, v: ValueId, idx: &str, value: &str) -> R<()> {
        if let Some((_, target)) = self.epilogue.filter(|(src, _)| *src == v) {
            let saved = self.memo.clone();
            let x = self.body.bind(ty(self.meta(v).dtype), value.to_string());
            // The tail reads `v` at this element only (`schedule`).
            self.memo.insert((v, idx.to_string()), x);
            let Def::Node(tn, tk) = self.g.values[target].def else {
                return Err(bug("an epilogue without a node"));
            };
            // Through permuting copies: the chain before each at the
            // element, then the tail where the last has it.
            let (mut at, mut last) = (idx.to_string(), None);
            for &p in self.s.permuted.get(&target).into_iter().flatten() {
                let (px, j) = self.permuted_at(p, &at)?;
                self.memo.insert((p, j.clone()), px.clone());
                at = j;
                last = Some((p, px));
            }
            let y = match last {
                Some((p, px)) if p == target => px,
                _ => self.node_at(tn, tk, &at)?,
            };
            self.memo = saved;
            // A row kernel holds the tail in the result's order
            // (`Gen::row_chain` stores it through the copies).
            let at = if self.filling == Some(target) {
                idx.to_string()
            } else {
                at
            };
            return self.store_plain(target, &at, &y);
        }
        self.store_plain(v, idx, value)
    }

    /// For permuting copy `p` (`schedule::permuted_copy`) of a value
    /// computed at element `idx`: that value there, and the element of
    /// `p` holding it.
    fn permuted_at(&mut self, p: ValueId, idx: &str) -> R<(String, String)> {
        let (input, _) = self.permuted_link(p)?;
        let x = self.value_at(input, idx)?;
        Ok((x, self.permuted_index(p, idx)?))
    }

    /// The element of permuting copy `p` holding element `idx` of the
    /// value it copies.
    pub(super) fn permuted_index(&mut self, p: ValueId, idx: &str) -> R<String> {
        let (_, a) = self.permuted_link(p)?;
        // `p`'s dims by decreasing stride are the input's contiguous
        // layout: unravel the element there, ravel it in `p`'s.
        let cs = contiguous_strides(&a.sizes);
        let mut dims: Vec<usize> = (0..a.sizes.len()).collect();
        dims.sort_by_key(|&d| std::cmp::Reverse(a.strides[d]));
        let sizes: Vec<usize> = dims.iter().map(|&d| a.sizes[d]).collect();
        let strides: Vec<usize> = dims.iter().map(|&d| cs[d]).collect();
        let m = self.unravel(idx, &sizes);
        let at = self.ravel(&m, &strides, 0);
        Ok(self.body.bind("u32", at))
    }

    fn store_plain(&mut self, v: ValueId, idx: &str, value: &str) -> R<()> {
        if self.filling == Some(v) {
            let (arr, base) = self
                .resident
                .get(&v)
                .ok_or_else(|| bug("a row kernel value without its array"))?;
            let x = match self.meta(v).dtype {
                // Registers hold what memory would: f16 values rounded.
                DType::F16 => format!("k_round_f16({value})"),
                _ => value.to_string(),
            };
            self.body.stmt(format!("{arr}[{idx} - {base}] = {x};"));
            return Ok(());
        }
        if !self.locs.contains_key(&v) {
            return Err(bug("a materialized value without a buffer"));
        }
        let (slot, loc) = self.slot_of(v, true)?;
        let d = self.meta(v).dtype;
        if loc.packed {
            let st = if slot.atomic {
                wgsl::store_lane(&slot, idx, d, value)
            } else if self.owns_words {
                if !self.run_word {
                    // Declared first: it carries lanes across the
                    // iterations of the loops storing them.
                    self.body.lines.insert(0, "var pk: u32 = 0u;".into());
                    self.run_word = true;
                }
                wgsl::store_run_lane(&slot, idx, d, value, "pk")
            } else {
                return Err(bug("an element store into a packed buffer bound as words"));
            };
            self.body.stmt(st);
            return Ok(());
        }
        self.body.stmt(store(&slot, idx, d, value));
        Ok(())
    }

    /// The kernels that materialize value `v`.
    pub fn kernel(&mut self, v: ValueId) -> R<Vec<KernelCode>> {
        let g = self.g;
        let Def::Node(n, _) = g.values[v].def else {
            return Ok(vec![]);
        };
        let node = &g.nodes[n];
        let name = node.op.name();
        let out = g.meta(v).clone();
        let label = format!("{name}#{}", g.values[v].name.clone().unwrap_or_default());
        if out.numel() == 0 {
            return Ok(vec![]);
        }
        match self.s.fused.get(&v) {
            Some(&(Fused::Epilogue { product: n } | Fused::Rows { reduction: n })) => {
                // The kernel of `n`, storing `v` in place of its result.
                let r = g.nodes[n].results[0];
                let rows = matches!(self.s.fused.get(&v), Some(Fused::Rows { .. }));
                *if rows {
                    &mut self.rows
                } else {
                    &mut self.epilogue
                } = Some((r, v));
                let label = format!("{}+{label}", g.nodes[n].op.name());
                let ks = self.kernel_of(n, r, label);
                (self.rows, self.epilogue) = (None, None);
                return ks;
            }
            Some(&Fused::Attention {
                scores,
                softmax,
                product,
                q_proj,
                o_proj,
            }) => {
                // A tail (the head merge, or the output projection's
                // epilogue) stored in place of the result.
                let o = g.nodes[o_proj.unwrap_or(product)].results[0];
                self.epilogue = (o != v).then_some((o, v));
                let proj = attention::Projections {
                    q: q_proj,
                    o: o_proj,
                };
                let k = self.attention(scores, softmax, product, proj, label);
                self.epilogue = None;
                return Ok(vec![k?]);
            }
            None => {}
        }
        self.kernel_of(n, v, label)
    }

    /// The kernels computing `v`, result `k` of node `n`.
    fn kernel_of(&mut self, n: NodeId, v: ValueId, label: String) -> R<Vec<KernelCode>> {
        let g = self.g;
        let Def::Node(_, k) = g.values[v].def else {
            return Ok(vec![]);
        };
        let node = &g.nodes[n];
        let name = node.op.name();
        let out = g.meta(v).clone();
        if out.numel() == 0 {
            return Ok(vec![]);
        }
        if self.s.inplace.contains_key(&v) {
            // `v` lives in its base's buffer: the writes alone, no copy.
            match node.op.def().lowering {
                Lowering::IndexPut => {
                    return Ok(vec![self.index_put(n, v, format!("{label} (in place)"))?]);
                }
                Lowering::Map(Elem::ScatterInto { add: false, copy }) => {
                    let label = format!("{label} (in place)");
                    return Ok(vec![self.scatter_sources(n, v, copy, label)?]);
                }
                _ => {}
            }
        }
        if let Some(&base) = self.s.inplace.get(&v) {
            // Re-inplaced scatter: write only the region into the base's buffer.
            return Ok(self
                .scatter_write(n, base, v, format!("{label} (in place)"))?
                .into_iter()
                .collect());
        }
        let margs: Vec<Arg<&Meta>> = node
            .args
            .iter()
            .map(|a| a.map(&mut |x| g.meta(*x)))
            .collect();
        match node.op.def().lowering {
            Lowering::StridedScatter(_) => {
                let base = *node.args[0].tensors()[0];
                let copy =
                    self.map_kernel(v, format!("{label} (copy)"), |s, i| s.value_at(base, i))?;
                let mut ks = vec![copy];
                ks.extend(self.scatter_write(n, v, v, label)?);
                Ok(ks)
            }
            Lowering::IndexPut => {
                let base = *node.args[0].tensors()[0];
                let copy =
                    self.map_kernel(v, format!("{label} (copy)"), |s, i| s.value_at(base, i))?;
                Ok(vec![copy, self.index_put(n, v, label)?])
            }
            Lowering::Reduce(_) => Ok(vec![self.reduce(n, v, &margs, label)?]),
            Lowering::Softmax { log } => Ok(vec![self.softmax(n, v, log, label)?]),
            Lowering::LayerNorm => Ok(vec![self.layer_norm(n, v, label)?]),
            Lowering::MatMul(_) => Ok(vec![self.matmul(n, label)?]),
            Lowering::Attention => Ok(vec![self.sdpa(n, label)?]),
            Lowering::Scan => Ok(vec![self.cumsum(n, v, label)?]),
            Lowering::Extreme { .. } => Ok(vec![self.extreme(n, v, label)?]),
            Lowering::Sort { .. } => Ok(vec![self.sort(n, v, label)?]),
            Lowering::Custom => Ok(vec![self.custom(n, v, label)?]),
            Lowering::Map(_) | Lowering::Free(_) | Lowering::RegionScatter { .. } => {
                Ok(vec![self.map_kernel(v, label, |s, i| s.node_at(n, k, i))?])
            }
            Lowering::None | Lowering::Composite => Err(CompileError::no_kernel(format!(
                "`{name}` has no kernel (functionalize first)"
            ))),
            Lowering::NoKernel => Err(CompileError::no_kernel(format!(
                "`{name}` has no GPU kernel yet: run the program with the reference backend"
            ))),
        }
    }
}

/// `literal`, refusing i64 constants the device's i32 cannot hold
/// (`wgsl::ty`).
fn lit(v: f64, d: DType) -> R<String> {
    if d == DType::I64 && !(i32::MIN as f64..=i32::MAX as f64).contains(&v) {
        return Err(CompileError::no_kernel(format!(
            "the i64 constant {v} is outside the range {} to {} in which GPU kernels compute \
             i64 (WGSL has no 64-bit integers); run the program with the reference backend",
            i32::MIN,
            i32::MAX
        )));
    }
    Ok(literal(v, d))
}
