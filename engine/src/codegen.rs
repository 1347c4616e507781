//! WGSL for each kernel of a schedule. A value is read either from its
//! buffer or by generating its defining expression at the index wanted
//! (inlining), so view copies and broadcasts become index arithmetic and
//! elementwise chains fuse into one kernel.

use crate::schedule::Schedule;
use crate::wgsl::{self, cast, literal, load, store, ty, Binding, Body, Buf, Slot};
use crate::EngineError;
use kiln_functionalize::graph::{Def, Graph, NodeId, ValueId};
use kiln_functionalize::meta::{broadcast_strides, contiguous_strides, numel, Meta};
use kiln_functionalize::ops::args::ArgsExt;
use kiln_functionalize::ops::pointwise::{Code, Src};
use kiln_functionalize::ops::{self, Lowering, Rule};
use kiln_functionalize::schema::Arg;
use kiln_functionalize::DType;
use std::collections::HashMap;

/// Where a materialized value lives: a buffer and a word offset in it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Loc {
    pub buf: Buf,
    pub word: usize,
    /// Bools and f16 values packed 4 and 2 to a word (`wgsl::per_word`);
    /// values written by kernels other than elementwise ones take a word
    /// per element (their invocations cannot own whole words).
    pub packed: bool,
}

/// One generated kernel. Its WGSL names no absolute offset (tensors are
/// bound range by range), so identical kernels of identical layers or
/// shape buckets are one pipeline.
#[derive(Clone, Debug)]
pub struct KernelCode {
    pub label: String,
    pub wgsl: String,
    pub grid: [u32; 3],
    /// Storage bindings in binding order.
    pub bindings: Vec<Binding>,
}

/// How tensors are bound, from the device's limits.
#[derive(Clone, Copy, Debug)]
pub struct BindingRules {
    /// Words a binding's offset must be a multiple of.
    pub align_words: usize,
    /// The most words one binding may cover.
    pub max_words: usize,
}

impl Default for BindingRules {
    /// WebGPU's defaults: 256-byte offsets, 128 MiB bindings.
    fn default() -> Self {
        BindingRules {
            align_words: 64,
            max_words: (128 << 20) / 4,
        }
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
}

pub struct Gen<'a> {
    pub g: &'a Graph,
    pub s: &'a Schedule,
    pub locs: &'a HashMap<ValueId, Loc>,
    body: Body,
    memo: HashMap<(ValueId, String), String>,
    shared: Vec<String>,
    /// Values computed by the kernel being generated: readable only at the
    /// invocation's own index (another invocation's write is not visible).
    group: Vec<ValueId>,
    /// The index expression of the element the invocation computes now.
    own: String,
    /// See `CompileOptions::tile_min_rows`.
    pub tile_min_rows: usize,
    /// Fused kernel members only their own kernel reads: computed, never
    /// stored.
    pub registers: std::collections::HashSet<ValueId>,
    /// See `CompileOptions::workgroup_rows`.
    pub workgroup_rows: bool,
    /// Invocations per workgroup of 1-D kernels.
    pub workgroup: u32,
    pub rules: BindingRules,
    slots: Vec<SlotInfo>,
}

type R<T> = Result<T, EngineError>;

/// Output rows each invocation of a tiled product computes: 4, or 1 when
/// the product has at most 16 rows.
fn matmul_rows_per_invocation(rows: usize) -> usize {
    if rows <= 16 {
        1
    } else {
        4
    }
}

/// Rows of `width` contiguous elements reduced by `lanes` invocations each
/// (a power of two up to 64; `64 / lanes` rows per workgroup), every
/// invocation holding `per` elements (strided by `lanes`) in registers.
struct RowTile {
    width: usize,
    rows: usize,
    lanes: usize,
    per: usize,
}

impl RowTile {
    /// Rows up to 1024 wide (16 elements an invocation).
    fn new(width: usize, rows: usize) -> Option<RowTile> {
        let lanes = width.next_power_of_two().clamp(1, 64);
        let per = width.div_ceil(lanes);
        (width > 0 && per <= 16).then_some(RowTile {
            width,
            rows,
            lanes,
            per,
        })
    }

    fn workgroups(&self) -> usize {
        self.rows.div_ceil(64 / self.lanes).max(1)
    }
}

/// A row kernel's lane and its elements: (value, in range, column, index).
struct RowCtx {
    lane: String,
    xs: Vec<(String, String, String, String)>,
}

/// A matrix product operand: value, batch strides over the output batch,
/// row stride, column stride.
struct Operand {
    v: ValueId,
    batch: Vec<usize>,
    rs: usize,
    cs: usize,
}

fn bug(msg: impl Into<String>) -> EngineError {
    EngineError::Internal(msg.into())
}

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
            shared: vec![],
            group: vec![],
            own: "gid".into(),
            tile_min_rows: 0,
            registers: Default::default(),
            workgroup_rows: true,
            workgroup: wgsl::WORKGROUP,
            rules: BindingRules::default(),
            slots: vec![],
        }
    }

    /// The slot of the tensor at `loc` (`words` long), bound once per kernel.
    fn slot(&mut self, loc: Loc, words: usize, write: bool) -> Slot {
        let i = match self
            .slots
            .iter()
            .position(|s| s.loc.buf == loc.buf && s.loc.word == loc.word && s.words == words)
        {
            Some(i) => i,
            None => {
                let r = self.rules;
                let start = loc.word / r.align_words * r.align_words;
                let total = loc.word - start + words.max(1);
                let chunk_words = (r.max_words / r.align_words * r.align_words).max(r.align_words);
                let chunks = if total <= r.max_words {
                    1
                } else {
                    total.div_ceil(chunk_words)
                };
                self.slots.push(SlotInfo {
                    loc,
                    words,
                    start,
                    chunks,
                    chunk_words,
                    written: false,
                });
                self.slots.len() - 1
            }
        };
        let info = &mut self.slots[i];
        info.written |= write;
        Slot {
            var: format!("b{i}"),
            base: info.loc.word - info.start,
            chunk: (info.chunks > 1).then_some(info.chunk_words),
        }
    }

    /// The slot of materialized value `v`.
    fn slot_of(&mut self, v: ValueId, write: bool) -> R<(Slot, Loc)> {
        // Before memory planning (fusion trials) any location will do.
        let loc = match self.locs.get(&v) {
            Some(l) => *l,
            None if self.locs.is_empty() => Loc {
                buf: Buf::Arena,
                word: 0,
                packed: false,
            },
            None => return Err(bug("a materialized value without a buffer")),
        };
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
            vars.push((
                format!("b{i}"),
                s.chunks,
                (s.chunks > 1).then_some(s.chunk_words),
            ));
        }
        (wgsl::declarations(&vars, &bindings), bindings)
    }

    fn meta(&self, v: ValueId) -> &'a Meta {
        self.g.meta(v)
    }

    fn finish(&mut self, label: String, grid: [u32; 3], wg: [u32; 3]) -> KernelCode {
        let body = std::mem::take(&mut self.body);
        let shared = std::mem::take(&mut self.shared);
        self.memo.clear();
        let (decls, bindings) = self.take_bindings();
        KernelCode {
            label,
            wgsl: wgsl::shader(&decls, &body.lines, wg, &shared),
            grid,
            bindings,
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
        if operand.sizes == out {
            return idx.to_string();
        }
        if operand.numel() == 1 {
            return "0u".into();
        }
        let m = self.unravel(idx, out);
        let st = broadcast_strides(&Meta::contiguous(operand.dtype, operand.sizes.clone()), out);
        self.ravel(&m, &st, 0)
    }

    /// Element `idx` of value `v`, as a shader value of `v`'s dtype.
    pub fn value_at(&mut self, v: ValueId, idx: &str) -> R<String> {
        let key = (v, idx.to_string());
        if let Some(x) = self.memo.get(&key) {
            return Ok(x.clone());
        }
        if idx != self.own && self.group.contains(&self.s.root(v)) {
            return Err(EngineError::Internal(
                "a fused kernel reads its own output at another index".into(),
            ));
        }
        let m = self.meta(v);
        let x = if self.s.is_materialized.contains(&v) {
            let (slot, loc) = self.slot_of(v, false)?;
            self.body
                .bind(ty(m.dtype), load(&slot, idx, m.dtype, loc.packed))
        } else {
            let Def::Node(n, k) = self.g.values[v].def else {
                return Err(bug("an input without a buffer"));
            };
            self.node_at(n, k, idx)?
        };
        self.memo.insert(key, x.clone());
        Ok(x)
    }

    /// Element `idx` of result `k` of node `n`, computed inline.
    pub fn node_at(&mut self, n: NodeId, k: usize, idx: &str) -> R<String> {
        let g = self.g;
        let node = &g.nodes[n];
        let def = node.op.def();
        let out = g.meta(node.results[k]).clone();
        let margs: Vec<Arg<&Meta>> = node
            .args
            .iter()
            .map(|a| a.map(&mut |v| g.meta(*v)))
            .collect();
        let tensor = |i: usize| -> R<ValueId> {
            match node.args.get(i) {
                Some(Arg::Tensor(v)) => Ok(*v),
                _ => Err(bug(format!("{}: argument {i} is not a tensor", def.name))),
            }
        };
        match (&def.rule, def.name.as_str()) {
            (Rule::Pointwise(plan), _) => {
                let p = plan(&margs).map_err(bug)?;
                let mut vals = vec![];
                for o in &p.operands {
                    vals.push(match o.src {
                        Src::Arg(i) => {
                            let t = tensor(i)?;
                            let tm = g.meta(t);
                            let ti = self.broadcast_index(idx, &out.sizes, tm);
                            let x = self.value_at(t, &ti)?;
                            cast(&x, tm.dtype, o.cast)
                        }
                        Src::Const { value, .. } => literal(value, o.cast),
                    });
                }
                let compute = p.operands.last().map_or(out.dtype, |o| o.cast);
                let (e, e_dtype) = pointwise(
                    p.code,
                    &vals,
                    compute,
                    &p.operands.iter().map(|o| o.cast).collect::<Vec<_>>(),
                );
                let r = self.body.bind(ty(e_dtype), e);
                Ok(self.body.bind(ty(out.dtype), cast(&r, e_dtype, out.dtype)))
            }
            (Rule::ViewCopy(view), _) => {
                let input = tensor(0)?;
                let im = Meta::contiguous(g.meta(input).dtype, g.meta(input).sizes.clone());
                let mut va: Vec<Arg<&Meta>> = vec![Arg::Tensor(&im)];
                va.extend(margs[1..].iter().cloned());
                let vm = ops::infer(*view, &va).map_err(bug)?.remove(k);
                let mi = self.unravel(idx, &vm.sizes);
                let at = self.ravel(&mi, &vm.strides, vm.offset);
                self.value_at(input, &at)
            }
            (_, "clone") => self.value_at(tensor(0)?, idx),
            (_, "copy") => {
                let src = tensor(1)?;
                let sm = g.meta(src);
                let si = self.broadcast_index(idx, &out.sizes, sm);
                let x = self.value_at(src, &si)?;
                Ok(self.body.bind(ty(out.dtype), cast(&x, sm.dtype, out.dtype)))
            }
            (_, "fill" | "masked_fill") => {
                let vi = if def.name == "fill" { 1 } else { 2 };
                let value = match node.args.get(vi) {
                    Some(Arg::Tensor(t)) => {
                        let x = self.value_at(*t, "0u")?;
                        cast(&x, g.meta(*t).dtype, out.dtype)
                    }
                    _ => literal(margs.scalar(vi).map_err(bug)?.to_f64(), out.dtype),
                };
                if def.name == "fill" {
                    return Ok(self.body.bind(ty(out.dtype), value));
                }
                let (this, mask) = (tensor(0)?, tensor(1)?);
                let ti = self.broadcast_index(idx, &out.sizes, g.meta(this));
                let x = self.value_at(this, &ti)?;
                let mi = self.broadcast_index(idx, &out.sizes, g.meta(mask));
                let mv = self.value_at(mask, &mi)?;
                Ok(self
                    .body
                    .bind(ty(out.dtype), format!("select({x}, {value}, {mv})")))
            }
            (_, "zero" | "zeros" | "zeros_like") => Ok(literal(0.0, out.dtype)),
            (_, "ones" | "ones_like") => Ok(literal(1.0, out.dtype)),
            (_, "full" | "full_like") => {
                Ok(literal(margs.scalar(1).map_err(bug)?.to_f64(), out.dtype))
            }
            (_, "arange") => {
                let vals: Vec<f64> = (0..node.args.len())
                    .filter_map(|i| margs.scalar(i).ok())
                    .map(|s| s.to_f64())
                    .collect();
                let (start, step) = match vals[..] {
                    [_] => (0.0, 1.0),
                    [s, _] => (s, 1.0),
                    [s, _, st, ..] => (s, st),
                    _ => return Err(bug("arange arguments")),
                };
                let e = if out.dtype.is_float() {
                    format!("f32(f64_start) + f32(f64_step) * f32({idx})")
                        .replace("f32(f64_start)", &literal(start, DType::F32))
                        .replace("f32(f64_step)", &literal(step, DType::F32))
                } else {
                    format!(
                        "{} + {} * {}({idx})",
                        literal(start, out.dtype),
                        literal(step, out.dtype),
                        ty(out.dtype)
                    )
                };
                let r = self.body.bind(ty(out.dtype), e);
                Ok(self.body.bind(
                    ty(out.dtype),
                    cast(
                        &r,
                        if out.dtype.is_float() {
                            DType::F32
                        } else {
                            out.dtype
                        },
                        out.dtype,
                    ),
                ))
            }
            (_, _) if matches!(def.lowering, Lowering::RegionScatter(_)) => {
                let (base, src) = (tensor(0)?, tensor(1)?);
                let bv = self.value_at(base, idx)?;
                let m = self.unravel(idx, &out.sizes);
                let (pred, src_m) = scatter_predicate(def.name.as_str(), &margs, &out, &m)?;
                let pred = self.body.bind("bool", pred);
                let sm = g.meta(src).clone();
                let si = self.ravel(&src_m, &contiguous_strides(&sm.sizes), 0);
                let si = self.body.bind("u32", format!("select(0u, {si}, {pred})"));
                // The same view of the base, read by the source at `si`, is
                // the base at `idx` (where the predicate holds): a chain of
                // region updates evaluates each base once per element.
                let view = def
                    .lowering
                    .scatter_view()
                    .ok_or_else(|| bug("scatter without a view"))?;
                for &u in self.s.uses.get(&base).map(Vec::as_slice).unwrap_or(&[]) {
                    let c = &g.nodes[u];
                    if matches!(c.op.def().rule, Rule::ViewCopy(op) if op == view)
                        && c.args[1..] == node.args[2..]
                        && c.results.len() == 1
                    {
                        self.memo.insert((c.results[0], si.clone()), bv.clone());
                    }
                }
                let sv = self.value_at(src, &si)?;
                let sv = cast(&sv, sm.dtype, out.dtype);
                Ok(self
                    .body
                    .bind(ty(out.dtype), format!("select({bv}, {sv}, {pred})")))
            }
            _ => Err(bug(format!("{} cannot be computed inline", def.name))),
        }
    }

    fn store_to(&mut self, v: ValueId, idx: &str, value: &str) -> R<()> {
        if !self.locs.contains_key(&v) {
            return Err(bug("a materialized value without a buffer"));
        }
        let (slot, loc) = self.slot_of(v, true)?;
        if loc.packed {
            return Err(bug("an element store into a packed buffer"));
        }
        let d = self.meta(v).dtype;
        self.body.stmt(store(&slot, idx, d, value));
        Ok(())
    }

    /// The kernel that materializes value `v` (result `k` of node `n`).
    pub fn kernel(&mut self, v: ValueId) -> R<Vec<KernelCode>> {
        let g = self.g;
        let Def::Node(n, k) = g.values[v].def else {
            return Ok(vec![]);
        };
        let node = &g.nodes[n];
        let name = node.op.name();
        let out = g.meta(v).clone();
        let label = format!("{name}#{}", g.values[v].name.clone().unwrap_or_default());
        if out.numel() == 0 {
            return Ok(vec![]);
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
            Lowering::Reduce => Ok(vec![self.reduce(n, v, &margs, label)?]),
            Lowering::Softmax { log } => Ok(vec![self.softmax(n, v, log, label)?]),
            Lowering::LayerNorm => Ok(vec![self.layer_norm(n, v, label)?]),
            Lowering::MatMul => Ok(vec![self.matmul(n, v, label)?]),
            Lowering::Gather => Ok(vec![self.gather(n, v, label)?]),
            Lowering::Map | Lowering::Free | Lowering::RegionScatter(_) => {
                Ok(vec![self.map_kernel(v, label, |s, i| s.node_at(n, k, i))?])
            }
            Lowering::None => Err(EngineError::Unsupported(format!(
                "`{name}` has no kernel (functionalize first)"
            ))),
        }
    }

    /// Whether elementwise value `v` can join the fused kernel computing
    /// `group` (same shape; reads group members only at its own index).
    pub fn fits_group(&mut self, group: &[ValueId], v: ValueId) -> bool {
        let Some(&first) = group.first() else {
            return true;
        };
        let g = self.g;
        let Def::Node(n, k) = g.values[v].def else {
            return false;
        };
        if g.meta(first).sizes != g.meta(v).sizes
            || self.s.inplace.contains_key(&v)
            || self.s.inplace.contains_key(&first)
        {
            return false;
        }
        let saved = (
            std::mem::take(&mut self.body),
            std::mem::take(&mut self.memo),
            std::mem::take(&mut self.shared),
            std::mem::take(&mut self.slots),
        );
        self.group = group.to_vec();
        for &m in group {
            self.memo.insert((m, "gid".into()), "0".into());
        }
        let ok = self.node_at(n, k, "gid").is_ok();
        self.group.clear();
        (self.body, self.memo, self.shared, self.slots) = saved;
        ok
    }

    /// Does computing `v` read the buffer of `root` only at the
    /// invocation's own index?
    pub fn reads_only_at_own_index(&mut self, v: ValueId, root: ValueId) -> bool {
        let Def::Node(n, k) = self.g.values[v].def else {
            return false;
        };
        let saved = (
            std::mem::take(&mut self.body),
            std::mem::take(&mut self.memo),
            std::mem::take(&mut self.shared),
            std::mem::take(&mut self.slots),
        );
        self.group = vec![root];
        self.memo.insert((root, "gid".into()), "0".into());
        let ok = self.node_at(n, k, "gid").is_ok();
        self.group.clear();
        (self.body, self.memo, self.shared, self.slots) = saved;
        ok
    }

    /// One kernel computing every value of `group` (elementwise values of
    /// one shape): inputs are read once, and later members read earlier
    /// ones from registers. With packed outputs each invocation computes
    /// the elements of whole words (4 per bool word, 2 per f16 word), so
    /// no two invocations write one word.
    pub fn map_group(&mut self, group: &[ValueId]) -> R<KernelCode> {
        let g = self.g;
        let count = g.meta(group[0]).numel();
        let packed: Vec<(ValueId, Loc)> = group
            .iter()
            .filter_map(|&v| self.locs.get(&v).filter(|l| l.packed).map(|l| (v, *l)))
            .collect();
        let lanes = packed
            .iter()
            .map(|(v, _)| wgsl::per_word(g.meta(*v).dtype))
            .max()
            .unwrap_or(1);
        self.body.stmt(format!(
            "if (gid >= {}) {{ return; }}",
            u(count.div_ceil(lanes))
        ));
        // One accumulator per packed output word this invocation writes.
        let mut acc: HashMap<ValueId, Vec<String>> = HashMap::new();
        for (v, _) in &packed {
            let per = wgsl::per_word(g.meta(*v).dtype);
            let words = (0..lanes / per)
                .map(|_| self.body.var("u32", "0u".into()))
                .collect();
            acc.insert(*v, words);
        }
        for lane in 0..lanes {
            let idx = if lanes == 1 {
                "gid".to_string()
            } else {
                self.body
                    .bind("u32", format!("gid * {} + {}", u(lanes), u(lane)))
            };
            self.own = idx.clone();
            for &v in group {
                let Def::Node(n, k) = g.values[v].def else {
                    return Err(bug("a kernel for an input"));
                };
                let x = self.node_at(n, k, &idx)?;
                match acc.get(&v) {
                    Some(words) => {
                        let per = wgsl::per_word(g.meta(v).dtype);
                        let w = &words[lane / per];
                        let bits = wgsl::pack_lane(g.meta(v).dtype, &x, lane % per);
                        self.body.stmt(format!("{w} = {w} | {bits};"));
                    }
                    None if self.registers.contains(&v) => {}
                    // Lanes past the end compute garbage and store nothing.
                    None if lanes > 1 => {
                        let (slot, _) = self.slot_of(v, true)?;
                        let st = store(&slot, &idx, g.meta(v).dtype, &x);
                        self.body
                            .stmt(format!("if ({idx} < {}) {{ {st} }}", u(count)));
                    }
                    None => self.store_to(v, &idx, &x)?,
                }
                self.memo.insert((v, idx.clone()), x);
            }
        }
        self.own = "gid".into();
        for (v, _) in &packed {
            let per = wgsl::per_word(g.meta(*v).dtype);
            let total = wgsl::words(g.meta(*v).dtype, count, true);
            let (slot, _) = self.slot_of(*v, true)?;
            for (i, w) in acc[v].iter().enumerate() {
                let at = self
                    .body
                    .bind("u32", format!("gid * {} + {}", u(lanes / per), u(i)));
                let st = slot.set_word(&at, w);
                self.body
                    .stmt(format!("if ({at} < {}) {{ {st} }}", u(total)));
            }
        }
        let label = group
            .iter()
            .map(|&v| g.values[v].name.clone().unwrap_or_default())
            .collect::<Vec<_>>()
            .join("+");
        Ok(self.finish(
            label,
            wgsl::grid(count.div_ceil(lanes), self.workgroup),
            [self.workgroup, 1, 1],
        ))
    }

    fn map_kernel(
        &mut self,
        v: ValueId,
        label: String,
        f: impl FnOnce(&mut Self, &str) -> R<String>,
    ) -> R<KernelCode> {
        let n = self.meta(v).numel();
        self.body
            .stmt(format!("if (gid >= {}) {{ return; }}", u(n)));
        let x = f(self, "gid")?;
        self.store_to(v, "gid", &x)?;
        Ok(self.finish(label, wgsl::grid(n, self.workgroup), [self.workgroup, 1, 1]))
    }

    /// Writes `src` through the scatter's view of buffer `target`
    /// (element `j` of `src` goes to the view's `j`-th position).
    fn scatter_write(
        &mut self,
        n: NodeId,
        target: ValueId,
        out: ValueId,
        label: String,
    ) -> R<Option<KernelCode>> {
        let g = self.g;
        let node = &g.nodes[n];
        let src = *node.args[1].tensors()[0];
        let sm = g.meta(src).clone();
        let view = node
            .op
            .def()
            .lowering
            .scatter_view()
            .ok_or_else(|| bug("scatter without a view"))?;
        let tm = Meta::contiguous(g.meta(target).dtype, g.meta(target).sizes.clone());
        let mut va: Vec<Arg<&Meta>> = vec![Arg::Tensor(&tm)];
        va.extend(node.args[2..].iter().map(|a| a.map(&mut |x| g.meta(*x))));
        let vm = ops::infer(view, &va).map_err(bug)?.remove(0);
        let count = sm.numel();
        if count == 0 {
            return Ok(None);
        }
        self.body
            .stmt(format!("if (gid >= {}) {{ return; }}", u(count)));
        let x = self.value_at(src, "gid")?;
        let x = cast(&x, sm.dtype, tm.dtype);
        let m = self.unravel("gid", &vm.sizes);
        let at = self.ravel(&m, &vm.strides, vm.offset);
        if !self.locs.contains_key(&out) {
            return Err(bug("scatter target without a buffer"));
        }
        let (slot, loc) = self.slot_of(out, true)?;
        if loc.packed {
            return Err(bug("a scatter into a packed buffer"));
        }
        self.body.stmt(store(&slot, &at, tm.dtype, &x));
        Ok(Some(self.finish(
            label,
            wgsl::grid(count, self.workgroup),
            [self.workgroup, 1, 1],
        )))
    }

    /// `index_put` with integer indices, after `out` holds a copy of self:
    /// one invocation walks every indexed position in order, so duplicate
    /// indices resolve as in eager (last write wins, or all accumulate).
    fn index_put(&mut self, n: NodeId, out: ValueId, label: String) -> R<KernelCode> {
        let g = self.g;
        let node = &g.nodes[n];
        let om = g.meta(out).clone();
        let idx: Vec<Option<ValueId>> = match &node.args[1] {
            Arg::TensorList(l) => l.clone(),
            _ => return Err(bug("index_put indices")),
        };
        let values = *node.args[2].tensors()[0];
        if idx
            .iter()
            .flatten()
            .any(|&t| g.meta(t).dtype == DType::Bool)
        {
            return self.index_put_mask(n, out, &idx, values, label);
        }
        let accumulate = matches!(node.args.get(3), Some(Arg::Bool(true)));
        let mut bshape: Vec<usize> = vec![];
        for t in idx.iter().flatten() {
            bshape = kiln_functionalize::meta::broadcast_shapes(&bshape, &g.meta(*t).sizes)
                .map_err(bug)?;
        }
        let dims = om.dim();
        let adv: Vec<usize> = (0..dims)
            .filter(|&d| idx.get(d).copied().flatten().is_some())
            .collect();
        let rest: Vec<usize> = (0..dims).filter(|d| !adv.contains(d)).collect();
        let adjacent = adv.windows(2).all(|w| w[1] == w[0] + 1);
        let (before, after): (Vec<usize>, Vec<usize>) = if adjacent && !adv.is_empty() {
            (
                rest.iter().copied().filter(|&d| d < adv[0]).collect(),
                rest.iter().copied().filter(|&d| d > adv[0]).collect(),
            )
        } else {
            (vec![], rest.clone())
        };
        let mut rshape: Vec<usize> = before.iter().map(|&d| om.sizes[d]).collect();
        rshape.extend(&bshape);
        rshape.extend(after.iter().map(|&d| om.sizes[d]));
        let total = numel(&rshape);
        let cstr = contiguous_strides(&om.sizes);
        self.body.stmt("if (gid != 0u) { return; }".into());
        self.body
            .stmt(format!("for (var r = 0u; r < {}; r = r + 1u) {{", u(total)));
        let saved = std::mem::take(&mut self.memo);
        let m = self.unravel("r", &rshape);
        let vm = g.meta(values).clone();
        let vi = self.broadcast_index("r", &rshape, &vm);
        let val = self.value_at(values, &vi)?;
        let val = cast(&val, vm.dtype, om.dtype);
        let nb = before.len();
        let bpos = self.ravel(&m[nb..nb + bshape.len()], &contiguous_strides(&bshape), 0);
        let mut terms = vec![];
        for (j, &d) in before.iter().enumerate() {
            terms.push(format!("{} * {}", m[j], u(cstr[d])));
        }
        for (j, &d) in after.iter().enumerate() {
            terms.push(format!("{} * {}", m[nb + bshape.len() + j], u(cstr[d])));
        }
        for &d in &adv {
            let t = idx[d].expect("advanced dim has an index");
            let ti = self.broadcast_index(&bpos, &bshape, g.meta(t));
            let iv = self.value_at(t, &ti)?;
            let size = om.sizes[d] as i32;
            let w = self
                .body
                .bind("i32", format!("select({iv}, {iv} + {size}i, {iv} < 0i)"));
            terms.push(format!(
                "u32(clamp({w}, 0i, {}i)) * {}",
                size - 1,
                u(cstr[d])
            ));
        }
        let at = self.body.bind(
            "u32",
            if terms.is_empty() {
                "0u".into()
            } else {
                terms.join(" + ")
            },
        );
        self.put(out, &at, &val, accumulate)?;
        self.body.stmt("}".into());
        self.memo = saved;
        Ok(self.finish(label, [1, 1, 1], [self.workgroup, 1, 1]))
    }

    /// `out[at] = val`, or `out[at] += val` when accumulating.
    fn put(&mut self, out: ValueId, at: &str, val: &str, accumulate: bool) -> R<()> {
        let d = self.meta(out).dtype;
        if !self.locs.contains_key(&out) {
            return Err(bug("index_put without a buffer"));
        }
        let (slot, loc) = self.slot_of(out, true)?;
        if loc.packed {
            return Err(bug("index_put into a packed buffer"));
        }
        let value = if !accumulate {
            val.to_string()
        } else if d == DType::Bool {
            format!("({} || {val})", load(&slot, at, d, false))
        } else {
            format!("({} + {val})", load(&slot, at, d, false))
        };
        self.body.stmt(store(&slot, at, d, &value));
        Ok(())
    }

    /// `index_put` with one bool mask (`x[mask] = v`): the masked
    /// positions, in order, take the values' consecutive rows.
    fn index_put_mask(
        &mut self,
        n: NodeId,
        out: ValueId,
        idx: &[Option<ValueId>],
        values: ValueId,
        label: String,
    ) -> R<KernelCode> {
        let g = self.g;
        let om = g.meta(out).clone();
        let accumulate = matches!(g.nodes[n].args.get(3), Some(Arg::Bool(true)));
        let used: Vec<(usize, ValueId)> = idx
            .iter()
            .enumerate()
            .filter_map(|(d, t)| t.map(|t| (d, t)))
            .collect();
        let [(d0, mask)] = used[..] else {
            return Err(EngineError::Unsupported(
                "index_put mixing a bool mask with other indices".into(),
            ));
        };
        let mm = g.meta(mask).clone();
        let k = mm.dim();
        if om.sizes.get(d0..d0 + k) != Some(&mm.sizes[..]) {
            return Err(EngineError::Unsupported(
                "index_put with a mask whose shape does not match the indexed dims".into(),
            ));
        }
        let before: Vec<usize> = om.sizes[..d0].to_vec();
        let after: Vec<usize> = om.sizes[d0 + k..].to_vec();
        let (nb, np, na) = (numel(&before), mm.numel(), numel(&after));
        // The values, right-aligned against [before..., nnz, after...].
        let vm = g.meta(values).clone();
        let rank = before.len() + 1 + after.len();
        if vm.dim() > rank {
            return Err(EngineError::Unsupported(
                "index_put values of higher rank than the indexing result".into(),
            ));
        }
        let vstr = contiguous_strides(&vm.sizes);
        let mut vs = vec![0usize; rank];
        for (j, (&size, &st)) in vm.sizes.iter().zip(&vstr).enumerate() {
            vs[rank - vm.dim() + j] = if size == 1 { 0 } else { st };
        }
        self.body.stmt("if (gid != 0u) { return; }".into());
        self.body
            .stmt(format!("for (var b = 0u; b < {}; b = b + 1u) {{", u(nb)));
        self.body.stmt("var c = 0u;".into());
        self.body
            .stmt(format!("for (var p = 0u; p < {}; p = p + 1u) {{", u(np)));
        let saved = std::mem::take(&mut self.memo);
        let hit = self.value_at(mask, "p")?;
        self.body.stmt(format!("if ({hit}) {{"));
        self.body
            .stmt(format!("for (var a = 0u; a < {}; a = a + 1u) {{", u(na)));
        self.memo.clear();
        let bm = self.unravel("b", &before);
        let am = self.unravel("a", &after);
        let mut m = bm;
        m.push("c".into());
        m.extend(am);
        let vi = self.ravel(&m, &vs, 0);
        let val = self.value_at(values, &vi)?;
        let val = cast(&val, vm.dtype, om.dtype);
        let at = self
            .body
            .bind("u32", format!("(b * {} + p) * {} + a", u(np), u(na)));
        self.put(out, &at, &val, accumulate)?;
        self.body.stmt("}".into());
        self.body.stmt("c = c + 1u;".into());
        self.body.stmt("}".into());
        self.body.stmt("}".into());
        self.body.stmt("}".into());
        self.memo = saved;
        Ok(self.finish(label, [1, 1, 1], [self.workgroup, 1, 1]))
    }

    fn reduce(
        &mut self,
        n: NodeId,
        v: ValueId,
        margs: &[Arg<&Meta>],
        label: String,
    ) -> R<KernelCode> {
        let g = self.g;
        let node = &g.nodes[n];
        let name = node.op.name();
        let input = *node.args[0].tensors()[0];
        let im = g.meta(input).clone();
        let om = g.meta(v).clone();
        let dims: Option<Vec<i64>> = match name {
            "amax" | "amin" => Some(margs.int_list(1).map_err(bug)?),
            _ if node.args.len() <= 2 => None,
            _ => margs.opt_int_list(1).map_err(bug)?,
        };
        let mut red = vec![im.dim() == 0; im.dim()];
        match dims {
            Some(l) if !l.is_empty() => {
                for d in l {
                    let d = kiln_functionalize::meta::wrap_dim(d, im.dim()).map_err(bug)?;
                    if im.dim() > 0 {
                        red[d] = true;
                    }
                }
            }
            _ => red.iter_mut().for_each(|x| *x = true),
        }
        let kept: Vec<usize> = (0..im.dim()).filter(|&d| !red[d]).collect();
        let reduced: Vec<usize> = (0..im.dim()).filter(|&d| red[d]).collect();
        let ks: Vec<usize> = kept.iter().map(|&d| im.sizes[d]).collect();
        let rs: Vec<usize> = reduced.iter().map(|&d| im.sizes[d]).collect();
        let istr = contiguous_strides(&im.sizes);
        let count = numel(&rs);
        let nout = om.numel();
        let acc_dt = om.dtype;
        let acc_ty = ty(acc_dt);
        self.body
            .stmt(format!("if (gid >= {}) {{ return; }}", u(nout)));
        let km = self.unravel("gid", &ks);
        let kst: Vec<usize> = kept.iter().map(|&d| istr[d]).collect();
        let kbase = self.ravel(&km, &kst, 0);
        let float = acc_dt.is_float();
        let (init, is_sum) = match name {
            "amax" => (extreme_literal(acc_dt, false), false),
            "amin" => (extreme_literal(acc_dt, true), false),
            _ => (literal(0.0, acc_dt), true),
        };
        let acc = self.body.var(acc_ty, init);
        let comp = if is_sum && float {
            Some(self.body.var("f32", "0.0".into()))
        } else {
            None
        };
        let nan = if float && !is_sum {
            Some(self.body.var("bool", "false".into()))
        } else {
            None
        };
        self.body
            .stmt(format!("for (var r = 0u; r < {}; r = r + 1u) {{", u(count)));
        let saved = std::mem::take(&mut self.memo);
        let rm = self.unravel("r", &rs);
        let rst: Vec<usize> = reduced.iter().map(|&d| istr[d]).collect();
        let roff = self.ravel(&rm, &rst, 0);
        let at = self.body.bind("u32", format!("{kbase} + {roff}"));
        let x = self.value_at(input, &at)?;
        let x = self.body.bind(acc_ty, cast(&x, im.dtype, acc_dt));
        match (name, &comp, &nan) {
            (_, Some(c), _) => {
                // Kahan summation keeps f32 sums close to the reference.
                let y = self.body.bind("f32", format!("{x} - {c}"));
                let t = self.body.bind("f32", format!("{acc} + {y}"));
                self.body.stmt(format!("{c} = ({t} - {acc}) - {y};"));
                self.body.stmt(format!("{acc} = {t};"));
            }
            (_, None, _) if is_sum => self.body.stmt(format!("{acc} = {acc} + {x};")),
            ("amax", _, _) if acc_dt == DType::Bool => {
                self.body.stmt(format!("{acc} = {acc} || {x};"))
            }
            (_, _, _) if acc_dt == DType::Bool => self.body.stmt(format!("{acc} = {acc} && {x};")),
            ("amax", _, _) => self.body.stmt(format!("{acc} = max({acc}, {x});")),
            _ => self.body.stmt(format!("{acc} = min({acc}, {x});")),
        }
        if let Some(nv) = &nan {
            self.body.stmt(format!("{nv} = {nv} || k_isnan({x});"));
        }
        self.body.stmt("}".into());
        self.memo = saved;
        let mut res = acc.clone();
        if name == "mean" {
            res = self.body.bind(acc_ty, format!("{acc} / f32({})", u(count)));
        }
        if let Some(nv) = nan {
            res = self.body.bind(
                acc_ty,
                format!("select({res}, bitcast<f32>(0x7fc00000u), {nv})"),
            );
        }
        self.store_to(v, "gid", &res)?;
        Ok(self.finish(
            label,
            wgsl::grid(nout, self.workgroup),
            [self.workgroup, 1, 1],
        ))
    }

    /// One invocation per line along `dim`: max, sum of exponentials, write.
    fn softmax(&mut self, n: NodeId, v: ValueId, log: bool, label: String) -> R<KernelCode> {
        let g = self.g;
        let node = &g.nodes[n];
        let input = *node.args[0].tensors()[0];
        let im = g.meta(input).clone();
        let om = g.meta(v).clone();
        let dim = match node.args[1] {
            Arg::Int(d) => kiln_functionalize::meta::wrap_dim(d, im.dim()).map_err(bug)?,
            _ => return Err(bug("softmax dim")),
        };
        let len = if im.dim() == 0 { 1 } else { im.sizes[dim] };
        let inner: usize = if im.dim() == 0 {
            1
        } else {
            im.sizes[dim + 1..].iter().product()
        };
        let lines = im.numel() / len.max(1);
        if let Some(t) = RowTile::new(len, lines).filter(|_| inner == 1 && self.workgroup_rows) {
            return self.softmax_rows(input, v, log, t, label);
        }
        self.body
            .stmt(format!("if (gid >= {}) {{ return; }}", u(lines)));
        let base = self.body.bind(
            "u32",
            format!("(gid / {i}) * {} + gid % {i}", u(len * inner), i = u(inner)),
        );
        let read = |s: &mut Self, k: &str| -> R<String> {
            let at = s.body.bind("u32", format!("{base} + {k} * {}", u(inner)));
            let x = s.value_at(input, &at)?;
            Ok(s.body.bind("f32", cast(&x, im.dtype, DType::F32)))
        };
        let mx = self.body.var("f32", literal(f64::NEG_INFINITY, DType::F32));
        self.body
            .stmt(format!("for (var k = 0u; k < {}; k = k + 1u) {{", u(len)));
        let saved = std::mem::take(&mut self.memo);
        let x = read(self, "k")?;
        self.body.stmt(format!("{mx} = max({mx}, {x});"));
        self.body.stmt("}".into());
        self.memo = std::mem::take(&mut HashMap::new());
        let sum = self.body.var("f32", "0.0".into());
        self.body
            .stmt(format!("for (var k = 0u; k < {}; k = k + 1u) {{", u(len)));
        let x = read(self, "k")?;
        self.body.stmt(format!("{sum} = {sum} + exp({x} - {mx});"));
        self.body.stmt("}".into());
        self.memo.clear();
        self.body
            .stmt(format!("for (var k = 0u; k < {}; k = k + 1u) {{", u(len)));
        let x = read(self, "k")?;
        let y = if log {
            format!("{x} - {mx} - log({sum})")
        } else {
            format!("exp({x} - {mx}) / {sum}")
        };
        let y = self.body.bind("f32", y);
        let at = self.body.bind("u32", format!("{base} + k * {}", u(inner)));
        let y = cast(&y, DType::F32, om.dtype);
        self.store_to(v, &at, &y)?;
        self.body.stmt("}".into());
        self.memo = saved;
        Ok(self.finish(
            label,
            wgsl::grid(lines, self.workgroup),
            [self.workgroup, 1, 1],
        ))
    }

    fn layer_norm(&mut self, n: NodeId, v: ValueId, label: String) -> R<KernelCode> {
        let g = self.g;
        let node = &g.nodes[n];
        let input = *node.args[0].tensors()[0];
        let im = g.meta(input).clone();
        let width: usize = match &node.args[1] {
            Arg::IntList(l) => l.iter().product::<i64>() as usize,
            _ => return Err(bug("layer_norm shape")),
        };
        let weight = node
            .args
            .get(2)
            .and_then(|a| a.tensors().first().map(|x| **x));
        let bias = node
            .args
            .get(3)
            .and_then(|a| a.tensors().first().map(|x| **x));
        let eps = match node.args.get(4) {
            Some(Arg::Float(e)) => *e,
            _ => 1e-5,
        };
        let rows = im.numel() / width.max(1);
        if let Some(t) = RowTile::new(width, rows).filter(|_| self.workgroup_rows) {
            return self.layer_norm_rows(input, v, weight, bias, eps, t, label);
        }
        self.body
            .stmt(format!("if (gid >= {}) {{ return; }}", u(rows)));
        let base = self.body.bind("u32", format!("gid * {}", u(width)));
        let read = |s: &mut Self| -> R<String> {
            let at = s.body.bind("u32", format!("{base} + k"));
            let x = s.value_at(input, &at)?;
            Ok(s.body.bind("f32", cast(&x, im.dtype, DType::F32)))
        };
        let saved = std::mem::take(&mut self.memo);
        let sum = self.body.var("f32", "0.0".into());
        let c = self.body.var("f32", "0.0".into());
        self.body
            .stmt(format!("for (var k = 0u; k < {}; k = k + 1u) {{", u(width)));
        let x = read(self)?;
        let y = self.body.bind("f32", format!("{x} - {c}"));
        let t = self.body.bind("f32", format!("{sum} + {y}"));
        self.body.stmt(format!("{c} = ({t} - {sum}) - {y};"));
        self.body.stmt(format!("{sum} = {t};"));
        self.body.stmt("}".into());
        self.memo.clear();
        let mean0 = self.body.bind("f32", format!("{sum} / f32({})", u(width)));
        // The corrected two-pass algorithm: the deviations' sum refines the
        // mean (exact for constant rows), their squares give the variance.
        let dev = self.body.var("f32", "0.0".into());
        let sq = self.body.var("f32", "0.0".into());
        self.body
            .stmt(format!("for (var k = 0u; k < {}; k = k + 1u) {{", u(width)));
        let x = read(self)?;
        let d = self.body.bind("f32", format!("{x} - {mean0}"));
        self.body.stmt(format!("{dev} = {dev} + {d};"));
        self.body.stmt(format!("{sq} = {sq} + {d} * {d};"));
        self.body.stmt("}".into());
        self.memo.clear();
        let corr = self.body.bind("f32", format!("{dev} / f32({})", u(width)));
        let mean = self.body.bind("f32", format!("{mean0} + {corr}"));
        let var = self.body.bind(
            "f32",
            format!("max({sq} / f32({}) - {corr} * {corr}, 0.0)", u(width)),
        );
        let rstd = self.body.bind(
            "f32",
            format!("inverseSqrt({var} + {})", literal(eps, DType::F32)),
        );
        self.body
            .stmt(format!("for (var k = 0u; k < {}; k = k + 1u) {{", u(width)));
        let x = read(self)?;
        let mut y = self.body.bind("f32", format!("({x} - {mean}) * {rstd}"));
        if let Some(w) = weight {
            let wv = self.value_at(w, "k")?;
            y = self.body.bind(
                "f32",
                format!("{y} * {}", cast(&wv, g.meta(w).dtype, DType::F32)),
            );
        }
        if let Some(b) = bias {
            let bv = self.value_at(b, "k")?;
            y = self.body.bind(
                "f32",
                format!("{y} + {}", cast(&bv, g.meta(b).dtype, DType::F32)),
            );
        }
        let at = self.body.bind("u32", format!("{base} + k"));
        let y = cast(&y, DType::F32, im.dtype);
        self.store_to(v, &at, &y)?;
        self.body.stmt("}".into());
        self.memo = saved;
        Ok(self.finish(
            label,
            wgsl::grid(rows, self.workgroup),
            [self.workgroup, 1, 1],
        ))
    }

    /// Shared setup of a row kernel: this invocation's row (`None` when
    /// past the last), its lane, and its elements of the row in registers
    /// as (value, in range, column) triples.
    fn row_elements(&mut self, input: ValueId, t: &RowTile) -> R<RowCtx> {
        let im = self.meta(input).clone();
        self.shared
            .push("var<workgroup> red: array<f32, 64>;".into());
        let per_wg = 64 / t.lanes;
        let row = self.body.bind(
            "u32",
            format!(
                "(wid.y * nwg.x + wid.x) * {} + lid.x / {}",
                u(per_wg),
                u(t.lanes)
            ),
        );
        let lane = self.body.bind("u32", format!("lid.x % {}", u(t.lanes)));
        let valid = self.body.bind("bool", format!("{row} < {}", u(t.rows)));
        let base = self.body.bind("u32", format!("{row} * {}", u(t.width)));
        let mut xs = vec![];
        for e in 0..t.per {
            let k = self
                .body
                .bind("u32", format!("{lane} + {}", u(e * t.lanes)));
            let inr = self
                .body
                .bind("bool", format!("{valid} && {k} < {}", u(t.width)));
            let at = self
                .body
                .bind("u32", format!("select(0u, {base} + {k}, {inr})"));
            let x = self.value_at(input, &at)?;
            let x = self.body.bind("f32", cast(&x, im.dtype, DType::F32));
            xs.push((x, inr, k, at));
        }
        Ok(RowCtx { lane, xs })
    }

    /// `partial` combined over the lanes of each row through workgroup
    /// memory (a tree of `lanes`); every lane gets the result. Barriers
    /// are reached by every invocation (uniform control flow).
    fn row_reduce(&mut self, t: &RowTile, lane: &str, partial: &str, max: bool) -> String {
        let op = |a: &str, b: &str| {
            if max {
                format!("max({a}, {b})")
            } else {
                format!("{a} + {b}")
            }
        };
        self.body.stmt(format!("red[lid.x] = {partial};"));
        self.body.stmt("workgroupBarrier();".into());
        let mut s = t.lanes / 2;
        while s >= 1 {
            self.body.stmt(format!(
                "if ({lane} < {}) {{ red[lid.x] = {}; }}",
                u(s),
                op("red[lid.x]", &format!("red[lid.x + {}]", u(s)))
            ));
            self.body.stmt("workgroupBarrier();".into());
            s /= 2;
        }
        let r = self.body.bind("f32", format!("red[lid.x - {lane}]"));
        // Later reductions reuse `red`.
        self.body.stmt("workgroupBarrier();".into());
        r
    }

    /// Softmax along contiguous rows: a row per `lanes` invocations, its
    /// elements read once into registers, max and sum reduced across the
    /// lanes, one write.
    fn softmax_rows(
        &mut self,
        input: ValueId,
        v: ValueId,
        log: bool,
        t: RowTile,
        label: String,
    ) -> R<KernelCode> {
        let od = self.meta(v).dtype;
        let RowCtx { lane, xs } = self.row_elements(input, &t)?;
        let ninf = literal(f64::NEG_INFINITY, DType::F32);
        let mut m = ninf.clone();
        for (x, inr, _, _) in &xs {
            m = self
                .body
                .bind("f32", format!("max({m}, select({ninf}, {x}, {inr}))"));
        }
        let mx = self.row_reduce(&t, &lane, &m, true);
        let mut sum = "0.0".to_string();
        let mut es = vec![];
        for (x, inr, _, _) in &xs {
            let e = self.body.bind("f32", format!("exp({x} - {mx})"));
            sum = self
                .body
                .bind("f32", format!("{sum} + select(0.0, {e}, {inr})"));
            es.push(e);
        }
        let total = self.row_reduce(&t, &lane, &sum, false);
        for ((x, inr, _, at), e) in xs.iter().zip(&es) {
            let y = if log {
                format!("{x} - {mx} - log({total})")
            } else {
                format!("{e} / {total}")
            };
            let y = self.body.bind("f32", y);
            self.body.stmt(format!("if ({inr}) {{"));
            self.store_to(v, at, &cast(&y, DType::F32, od))?;
            self.body.stmt("}".into());
        }
        Ok(self.finish(label, wgsl::fold(t.workgroups()), [64, 1, 1]))
    }

    /// Layer norm over contiguous rows, a row per `lanes` invocations: the
    /// row read once into registers, the corrected two-pass mean and
    /// variance reduced across the lanes, one write.
    #[allow(clippy::too_many_arguments)]
    fn layer_norm_rows(
        &mut self,
        input: ValueId,
        v: ValueId,
        weight: Option<ValueId>,
        bias: Option<ValueId>,
        eps: f64,
        t: RowTile,
        label: String,
    ) -> R<KernelCode> {
        let g = self.g;
        let od = self.meta(v).dtype;
        let RowCtx { lane, xs } = self.row_elements(input, &t)?;
        let w = u(t.width);
        let mut sum = "0.0".to_string();
        for (x, inr, _, _) in &xs {
            sum = self
                .body
                .bind("f32", format!("{sum} + select(0.0, {x}, {inr})"));
        }
        let total = self.row_reduce(&t, &lane, &sum, false);
        let mean0 = self.body.bind("f32", format!("{total} / f32({w})"));
        // The corrected two-pass algorithm: the deviations' sum refines the
        // mean (exact for constant rows), their squares give the variance.
        let (mut dev, mut sq) = ("0.0".to_string(), "0.0".to_string());
        for (x, inr, _, _) in &xs {
            let d = self
                .body
                .bind("f32", format!("select(0.0, {x} - {mean0}, {inr})"));
            dev = self.body.bind("f32", format!("{dev} + {d}"));
            sq = self.body.bind("f32", format!("{sq} + {d} * {d}"));
        }
        let dev = self.row_reduce(&t, &lane, &dev, false);
        let sq = self.row_reduce(&t, &lane, &sq, false);
        let corr = self.body.bind("f32", format!("{dev} / f32({w})"));
        let mean = self.body.bind("f32", format!("{mean0} + {corr}"));
        let var = self.body.bind(
            "f32",
            format!("max({sq} / f32({w}) - {corr} * {corr}, 0.0)"),
        );
        let rstd = self.body.bind(
            "f32",
            format!("inverseSqrt({var} + {})", literal(eps, DType::F32)),
        );
        for (x, inr, k, at) in &xs {
            self.body.stmt(format!("if ({inr}) {{"));
            let saved = std::mem::take(&mut self.memo);
            let mut y = self.body.bind("f32", format!("({x} - {mean}) * {rstd}"));
            if let Some(wv) = weight {
                let c = self.value_at(wv, k)?;
                let c = cast(&c, g.meta(wv).dtype, DType::F32);
                y = self.body.bind("f32", format!("{y} * {c}"));
            }
            if let Some(bv) = bias {
                let c = self.value_at(bv, k)?;
                let c = cast(&c, g.meta(bv).dtype, DType::F32);
                y = self.body.bind("f32", format!("{y} + {c}"));
            }
            self.store_to(v, at, &cast(&y, DType::F32, od))?;
            self.memo = saved;
            self.body.stmt("}".into());
        }
        Ok(self.finish(label, wgsl::fold(t.workgroups()), [64, 1, 1]))
    }

    /// Element `(b, i, j)` accessors of a batched product `C = A B`, with
    /// every matrix op lowered onto it; tiles of 16x16 in workgroup memory.
    fn matmul(&mut self, n: NodeId, v: ValueId, label: String) -> R<KernelCode> {
        let g = self.g;
        let node = &g.nodes[n];
        let name = node.op.name();
        let om = g.meta(v).clone();
        let t = |i: usize| *node.args[i].tensors()[0];
        let (a, b, batch, nn, kk, mm, extra) = match name {
            "linear" => {
                let (x, w) = (t(0), t(1));
                let (xm, wm) = (g.meta(x), g.meta(w));
                let k = *wm.sizes.last().unwrap();
                let rows = xm.numel() / k.max(1);
                let outf = if wm.dim() == 2 { wm.sizes[0] } else { 1 };
                let bias = node
                    .args
                    .get(2)
                    .and_then(|a| a.tensors().first().map(|x| **x));
                (
                    Operand {
                        v: x,
                        batch: vec![],
                        rs: k,
                        cs: 1,
                    },
                    Operand {
                        v: w,
                        batch: vec![],
                        rs: 1,
                        cs: k,
                    },
                    vec![],
                    rows,
                    k,
                    outf,
                    bias.map(|b| (b, 1.0, 1.0)),
                )
            }
            _ => {
                let (xi, yi) = if name == "addmm" { (1, 2) } else { (0, 1) };
                let (x, y) = (t(xi), t(yi));
                let (xm, ym) = (g.meta(x).clone(), g.meta(y).clone());
                let (xb, n_, k_) = if xm.dim() == 1 {
                    (vec![], 1, xm.sizes[0])
                } else {
                    (
                        xm.sizes[..xm.dim() - 2].to_vec(),
                        xm.sizes[xm.dim() - 2],
                        xm.sizes[xm.dim() - 1],
                    )
                };
                let (yb, m_) = if ym.dim() == 1 {
                    (vec![], 1)
                } else {
                    (ym.sizes[..ym.dim() - 2].to_vec(), ym.sizes[ym.dim() - 1])
                };
                let batch = kiln_functionalize::meta::broadcast_shapes(&xb, &yb).map_err(bug)?;
                // Strides of an operand's own batch dims over the output batch
                // (0 where it broadcasts).
                let bstr = |own: &[usize], rows: usize, cols: usize| -> Vec<usize> {
                    let mut full = own.to_vec();
                    full.extend([rows, cols]);
                    let st = contiguous_strides(&full);
                    (0..batch.len())
                        .map(|i| {
                            let lead = batch.len() - own.len();
                            if i < lead || own[i - lead] != batch[i] || own[i - lead] == 1 {
                                0
                            } else {
                                st[i - lead]
                            }
                        })
                        .collect()
                };
                let xa = Operand {
                    v: x,
                    batch: bstr(&xb, n_, k_),
                    rs: if xm.dim() == 1 { 0 } else { k_ },
                    cs: 1,
                };
                let yo = Operand {
                    v: y,
                    batch: bstr(&yb, k_, m_),
                    rs: if ym.dim() == 1 { 1 } else { m_ },
                    cs: if ym.dim() == 1 { 0 } else { 1 },
                };
                let extra = if name == "addmm" {
                    let beta = node.args.get(3).and_then(|a| {
                        if let Arg::Int(i) = a {
                            Some(*i as f64)
                        } else if let Arg::Float(f) = a {
                            Some(*f)
                        } else {
                            None
                        }
                    });
                    let alpha = node.args.get(4).and_then(|a| {
                        if let Arg::Int(i) = a {
                            Some(*i as f64)
                        } else if let Arg::Float(f) = a {
                            Some(*f)
                        } else {
                            None
                        }
                    });
                    Some((t(0), beta.unwrap_or(1.0), alpha.unwrap_or(1.0)))
                } else {
                    None
                };
                (xa, yo, batch, n_, k_, m_, extra)
            }
        };
        let acc_dt = if om.dtype.is_float() {
            DType::F32
        } else {
            om.dtype
        };
        let at = ty(acc_dt);
        let nb = numel(&batch).max(1);
        let tiled = nn >= self.tile_min_rows;
        let acc = if tiled {
            self.tiled_product(&a, &b, &batch, nn, kk, mm, acc_dt)?
        } else {
            // Each invocation computes a 4x4 block: 16 multiply-adds per 8
            // loads, no workgroup memory, no barriers.
            self.body
                .stmt("let r0 = (wid.y * 16u + lid.y) * 4u;".into());
            self.body
                .stmt("let c0 = (wid.x * 16u + lid.x) * 4u;".into());
            self.body.stmt("let bz = wid.z;".into());
            self.body.stmt(format!(
                "if (r0 >= {} || c0 >= {}) {{ return; }}",
                u(nn),
                u(mm)
            ));
            let bm = self.unravel("bz", &batch);
            let aoff = self.ravel(&bm, &a.batch, 0);
            let boff = self.ravel(&bm, &b.batch, 0);
            self.body.stmt(format!("var accs: array<{at}, 16>;"));
            self.body.stmt(format!("var av: array<{at}, 4>;"));
            self.body.stmt(format!("var bv: array<{at}, 4>;"));
            self.body
                .stmt(format!("for (var q = 0u; q < {}; q = q + 1u) {{", u(kk)));
            self.body
                .stmt("for (var i = 0u; i < 4u; i = i + 1u) {".into());
            let saved = std::mem::take(&mut self.memo);
            let ia = self.body.bind(
                "u32",
                format!(
                    "{aoff} + min(r0 + i, {}) * {} + q * {}",
                    u(nn - 1),
                    u(a.rs),
                    u(a.cs)
                ),
            );
            let xa = self.value_at(a.v, &ia)?;
            let xa = cast(&xa, g.meta(a.v).dtype, acc_dt);
            self.body.stmt(format!("av[i] = {xa};"));
            self.memo.clear();
            let ib = self.body.bind(
                "u32",
                format!(
                    "{boff} + q * {} + min(c0 + i, {}) * {}",
                    u(b.rs),
                    u(mm - 1),
                    u(b.cs)
                ),
            );
            let xb = self.value_at(b.v, &ib)?;
            let xb = cast(&xb, g.meta(b.v).dtype, acc_dt);
            self.body.stmt(format!("bv[i] = {xb};"));
            self.body.stmt("}".into());
            self.memo = saved;
            self.body.stmt(
                "for (var i = 0u; i < 4u; i = i + 1u) { for (var j = 0u; j < 4u; j = j + 1u) { accs[i * 4u + j] = accs[i * 4u + j] + av[i] * bv[j]; } }"
                    .into(),
            );
            self.body.stmt("}".into());
            self.body
                .stmt("for (var ij = 0u; ij < 16u; ij = ij + 1u) {".into());
            self.body.stmt("let row = r0 + ij / 4u;".into());
            self.body.stmt("let col = c0 + ij % 4u;".into());
            self.body.stmt(format!(
                "if (row >= {} || col >= {}) {{ continue; }}",
                u(nn),
                u(mm)
            ));
            self.body.bind(at, "accs[ij]".into())
        };
        let saved_epilogue = std::mem::take(&mut self.memo);
        let oi = self.body.bind(
            "u32",
            format!("bz * {} + row * {} + col", u(nn * mm), u(mm)),
        );
        let mut res = acc.clone();
        if let Some((c, beta, alpha)) = extra {
            let cm = g.meta(c).clone();
            let out2 = [nn, mm];
            let ci = self.broadcast_index(&format!("(row * {} + col)", u(mm)), &out2, &cm);
            let cv = self.value_at(c, &ci)?;
            let cv = cast(&cv, cm.dtype, acc_dt);
            res = if beta == 0.0 {
                self.body
                    .bind(at, format!("{} * {acc}", literal(alpha, acc_dt)))
            } else {
                self.body.bind(
                    at,
                    format!(
                        "{} * {acc} + {} * {cv}",
                        literal(alpha, acc_dt),
                        literal(beta, acc_dt)
                    ),
                )
            };
        }
        let res = cast(&res, acc_dt, om.dtype);
        self.store_to(v, &oi, &res)?;
        self.memo = saved_epilogue;
        // Both variants end in a loop over the invocation's outputs; a
        // workgroup covers 64 columns and 64 rows (16 for short tiled
        // products).
        self.body.stmt("}".into());
        let rows = if tiled {
            16 * matmul_rows_per_invocation(nn)
        } else {
            64
        };
        let grid = [mm.div_ceil(64) as u32, nn.div_ceil(rows) as u32, nb as u32];
        if grid.iter().any(|&x| x > 65535) {
            return Err(EngineError::Unsupported(format!(
                "{name} of {nb} batches of {nn}x{mm}: too many workgroups"
            )));
        }
        Ok(self.finish(label, grid, [16, 16, 1]))
    }

    /// Stores element `index` of `v` (zero where `pred` is false) at `slot`
    /// of workgroup tile `tile`.
    fn load_tile(
        &mut self,
        tile: &str,
        slot: &str,
        v: ValueId,
        index: &str,
        pred: &str,
        acc_dt: DType,
    ) -> R<()> {
        let i = self
            .body
            .bind("u32", format!("select(0u, {index}, {pred})"));
        let x = self.value_at(v, &i)?;
        let x = cast(&x, self.meta(v).dtype, acc_dt);
        self.body.stmt(format!(
            "{tile}[{slot}] = select({}, {x}, {pred});",
            literal(0.0, acc_dt)
        ));
        Ok(())
    }

    /// The GPU matrix product: a 64x64 output tile per workgroup of 16x16
    /// invocations, each accumulating a 4x4 block in registers (rows and
    /// columns strided by 16, so workgroup-memory reads are broadcasts or
    /// consecutive), K in steps of 16 through workgroup memory. Operand
    /// tiles are loaded along whichever operand dimension is contiguous, so
    /// global reads coalesce for row-major and transposed operands alike
    /// (`linear`'s weight). Opens the epilogue loop over the 16 outputs
    /// (`row`, `col`, `bz` in scope) and returns its accumulator.
    #[allow(clippy::too_many_arguments)]
    fn tiled_product(
        &mut self,
        a: &Operand,
        b: &Operand,
        batch: &[usize],
        nn: usize,
        kk: usize,
        mm: usize,
        acc_dt: DType,
    ) -> R<String> {
        let at = ty(acc_dt);
        let zero = literal(0.0, acc_dt);
        // Rows per invocation: 4 (64-row tiles), or 1 for products of at
        // most 16 rows (batch-1 inference), where bigger tiles would idle.
        let tm = matmul_rows_per_invocation(nn);
        let bm = 16 * tm;
        // ta[k * bm + row], tb[k * 64 + col]
        self.shared
            .push(format!("var<workgroup> ta: array<{at}, {}>;", 16 * bm));
        self.shared
            .push(format!("var<workgroup> tb: array<{at}, 1024>;"));
        self.body.stmt("let bz = wid.z;".into());
        self.body.stmt("let lin = lid.y * 16u + lid.x;".into());
        let bzm = self.unravel("bz", batch);
        let aoff = self.ravel(&bzm, &a.batch, 0);
        let boff = self.ravel(&bzm, &b.batch, 0);
        let accs: Vec<String> = (0..4 * tm)
            .map(|_| self.body.var(at, zero.clone()))
            .collect();
        self.body.stmt(format!(
            "for (var t0 = 0u; t0 < {}; t0 = t0 + 16u) {{",
            u(kk)
        ));
        // A: bm rows x 16 k, `tm` elements an invocation; along k when k is
        // contiguous, else along rows.
        self.body
            .stmt(format!("for (var e = 0u; e < {}; e = e + 1u) {{", u(tm)));
        let saved = std::mem::take(&mut self.memo);
        let idx = self.body.bind("u32", "lin + e * 256u".into());
        let (r, k) = if a.cs == 1 {
            (format!("{idx} / 16u"), format!("{idx} % 16u"))
        } else {
            (format!("{idx} % {}", u(bm)), format!("{idx} / {}", u(bm)))
        };
        let (r, k) = (self.body.bind("u32", r), self.body.bind("u32", k));
        let (row, ka) = (
            self.body.bind("u32", format!("wid.y * {} + {r}", u(bm))),
            self.body.bind("u32", format!("t0 + {k}")),
        );
        let pa = self
            .body
            .bind("bool", format!("{row} < {} && {ka} < {}", u(nn), u(kk)));
        let ia = format!("{aoff} + {row} * {} + {ka} * {}", u(a.rs), u(a.cs));
        let slot = format!("{k} * {} + {r}", u(bm));
        self.load_tile("ta", &slot, a.v, &ia, &pa, acc_dt)?;
        self.memo = saved;
        self.body.stmt("}".into());
        // B: 16 k x 64 columns, 4 elements an invocation; along columns
        // when they are contiguous.
        self.body
            .stmt("for (var e = 0u; e < 4u; e = e + 1u) {".into());
        let saved = std::mem::take(&mut self.memo);
        let idx = self.body.bind("u32", "lin + e * 256u".into());
        let (k, c) = if b.cs == 1 || b.rs != 1 {
            (format!("{idx} / 64u"), format!("{idx} % 64u"))
        } else {
            (format!("{idx} % 16u"), format!("{idx} / 16u"))
        };
        let (k, c) = (self.body.bind("u32", k), self.body.bind("u32", c));
        let (kb, col) = (
            self.body.bind("u32", format!("t0 + {k}")),
            self.body.bind("u32", format!("wid.x * 64u + {c}")),
        );
        let pb = self
            .body
            .bind("bool", format!("{kb} < {} && {col} < {}", u(kk), u(mm)));
        let ib = format!("{boff} + {kb} * {} + {col} * {}", u(b.rs), u(b.cs));
        self.load_tile("tb", &format!("{k} * 64u + {c}"), b.v, &ib, &pb, acc_dt)?;
        self.memo = saved;
        self.body.stmt("}".into());
        self.body.stmt("workgroupBarrier();".into());
        self.body
            .stmt("for (var q = 0u; q < 16u; q = q + 1u) {".into());
        for i in 0..tm {
            self.body.stmt(format!(
                "let a{i} = ta[q * {} + lid.y + {}u];",
                u(bm),
                16 * i
            ));
        }
        for j in 0..4 {
            self.body
                .stmt(format!("let b{j} = tb[q * 64u + lid.x + {}u];", 16 * j));
        }
        for i in 0..tm {
            for j in 0..4 {
                let c = &accs[i * 4 + j];
                self.body.stmt(format!("{c} = {c} + a{i} * b{j};"));
            }
        }
        self.body.stmt("}".into());
        self.body.stmt("workgroupBarrier();".into());
        self.body.stmt("}".into());
        // Epilogue over the invocation's outputs; the accumulator picked by
        // selects (a dynamic index would move the accumulators out of
        // registers).
        self.body.stmt(format!(
            "for (var ij = 0u; ij < {}; ij = ij + 1u) {{",
            u(4 * tm)
        ));
        self.body.stmt(format!(
            "let row = wid.y * {} + lid.y + 16u * (ij / 4u);",
            u(bm)
        ));
        self.body
            .stmt("let col = wid.x * 64u + lid.x + 16u * (ij % 4u);".into());
        self.body.stmt(format!(
            "if (row >= {} || col >= {}) {{ continue; }}",
            u(nn),
            u(mm)
        ));
        let mut pick = accs[0].clone();
        for (i, c) in accs.iter().enumerate().skip(1) {
            pick = format!("select({pick}, {c}, ij == {i}u)");
        }
        Ok(self.body.bind(at, pick))
    }

    fn gather(&mut self, n: NodeId, v: ValueId, label: String) -> R<KernelCode> {
        let g = self.g;
        let node = &g.nodes[n];
        let om = g.meta(v).clone();
        let count = om.numel();
        self.body
            .stmt(format!("if (gid >= {}) {{ return; }}", u(count)));
        let (src, idx, dim) = match node.op.name() {
            "embedding" => (
                *node.args[0].tensors()[0],
                *node.args[1].tensors()[0],
                0usize,
            ),
            _ => {
                let s = *node.args[0].tensors()[0];
                let d = match node.args[1] {
                    Arg::Int(d) => {
                        kiln_functionalize::meta::wrap_dim(d, g.meta(s).dim()).map_err(bug)?
                    }
                    _ => return Err(bug("index_select dim")),
                };
                (s, *node.args[2].tensors()[0], d)
            }
        };
        let sm = g.meta(src).clone();
        let sizes = &sm.sizes;
        let (outer, len, inner) = if sizes.is_empty() {
            (1, 1, 1)
        } else {
            (
                sizes[..dim].iter().product::<usize>(),
                sizes[dim],
                sizes[dim + 1..].iter().product::<usize>(),
            )
        };
        let nidx = g.meta(idx).numel();
        // out = [outer, nidx, inner]
        let o = self.body.bind("u32", format!("gid / {}", u(nidx * inner)));
        let p = self
            .body
            .bind("u32", format!("(gid / {}) % {}", u(inner), u(nidx)));
        let q = self.body.bind("u32", format!("gid % {}", u(inner)));
        let iv = self.value_at(idx, &p)?;
        let iv = self
            .body
            .bind("i32", cast(&iv, g.meta(idx).dtype, DType::I32));
        let r = self.body.bind(
            "u32",
            format!("u32(clamp({iv}, 0i, {}i))", len.max(1) as i32 - 1),
        );
        let at = self.body.bind(
            "u32",
            format!("({o} * {} + {r}) * {} + {q}", u(len), u(inner)),
        );
        let _ = outer;
        let x = self.value_at(src, &at)?;
        self.store_to(v, "gid", &x)?;
        Ok(self.finish(
            label,
            wgsl::grid(count, self.workgroup),
            [self.workgroup, 1, 1],
        ))
    }
}

/// The identity of `max` (`min` when `high`) in a dtype.
fn extreme_literal(d: DType, high: bool) -> String {
    match (d, high) {
        (DType::F32 | DType::F16, false) => literal(f64::NEG_INFINITY, d),
        (DType::F32 | DType::F16, true) => literal(f64::INFINITY, d),
        (DType::I32, false) => "(-2147483647i - 1i)".into(),
        (DType::I32, true) => "2147483647i".into(),
        (DType::U32, false) => "0u".into(),
        (DType::U32, true) => "4294967295u".into(),
        (DType::Bool, high) => high.to_string(),
    }
}

/// For a scatter's output multi-index `m`: whether it lies in the region,
/// and the source multi-index there.
fn scatter_predicate(
    name: &str,
    a: &[Arg<&Meta>],
    out: &Meta,
    m: &[String],
) -> R<(String, Vec<String>)> {
    let wrap = |d: i64| kiln_functionalize::meta::wrap_dim(d, out.dim()).map_err(bug);
    match name {
        "slice_scatter" => {
            let d = wrap(a.int(2).map_err(bug)?)?;
            let size = out.sizes[d] as i64;
            let clampb = |v: i64| -> i64 { (if v < 0 { v + size } else { v }).clamp(0, size) };
            let start = clampb(a.opt_int(3).map_err(bug)?.unwrap_or(0));
            let end = clampb(a.opt_int(4).map_err(bug)?.unwrap_or(i64::MAX)).max(start);
            let step = a.int(5).map_err(bug)?;
            let x = &m[d];
            let pred =
                format!("({x} >= {start}u && {x} < {end}u && ({x} - {start}u) % {step}u == 0u)");
            let mut sm = m.to_vec();
            sm[d] = format!("(({x} - {start}u) / {step}u)");
            Ok((pred, sm))
        }
        "select_scatter" => {
            let d = wrap(a.int(2).map_err(bug)?)?;
            let size = out.sizes[d] as i64;
            let i = a.int(3).map_err(bug)?;
            let i = if i < 0 { i + size } else { i };
            let pred = format!("({} == {i}u)", m[d]);
            let mut sm = m.to_vec();
            sm.remove(d);
            Ok((pred, sm))
        }
        "diagonal_scatter" => {
            let off = a.int(2).map_err(bug)?;
            let (d1, d2) = (wrap(a.int(3).map_err(bug)?)?, wrap(a.int(4).map_err(bug)?)?);
            let (x1, x2) = (&m[d1], &m[d2]);
            let pred = format!("(i32({x2}) - i32({x1}) == {off}i)");
            let k = if off >= 0 { x1.clone() } else { x2.clone() };
            let mut sm: Vec<String> = (0..out.dim())
                .filter(|&d| d != d1 && d != d2)
                .map(|d| m[d].clone())
                .collect();
            sm.push(k);
            Ok((pred, sm))
        }
        _ => Err(bug(format!("{name} has no predicate"))),
    }
}

fn float_ops(code: Code, v: &[String]) -> String {
    let x = &v[0];
    match code {
        Code::Exp => format!("exp({x})"),
        Code::Log => format!("log({x})"),
        Code::Sqrt => format!("sqrt({x})"),
        Code::Rsqrt => format!("inverseSqrt({x})"),
        Code::Sigmoid => format!("1.0 / (1.0 + exp(-{x}))"),
        Code::Tanh => format!("tanh({x})"),
        Code::Sin => format!("sin({x})"),
        Code::Cos => format!("cos({x})"),
        Code::Reciprocal => format!("1.0 / {x}"),
        Code::Erf => format!("k_erf({x})"),
        Code::Neg => format!("-{x}"),
        Code::Abs => format!("abs({x})"),
        Code::Relu => format!("select(0.0, {x}, {x} > 0.0 || k_isnan({x}))"),
        Code::Gelu { tanh: false } => {
            format!("0.5 * {x} * (1.0 + k_erf({x} * 0.70710678118654752))")
        }
        Code::Gelu { tanh: true } => {
            format!("0.5 * {x} * (1.0 + tanh(0.79788456080286536 * ({x} + 0.044715 * {x} * {x} * {x})))")
        }
        Code::Add { alpha } => format!("{x} + {} * {}", literal(alpha, DType::F32), v[1]),
        Code::Sub { alpha } => format!("{x} - {} * {}", literal(alpha, DType::F32), v[1]),
        Code::Mul => format!("{x} * {}", v[1]),
        Code::Div => format!("{x} / {}", v[1]),
        Code::DivTrunc => format!("trunc({x} / {})", v[1]),
        Code::DivFloor => format!("floor({x} / {})", v[1]),
        Code::Pow => format!("k_powf({x}, {})", v[1]),
        Code::Maximum => format!(
            "select(max({x}, {y}), {x} + {y}, k_isnan({x}) || k_isnan({y}))",
            y = v[1]
        ),
        Code::Minimum => format!(
            "select(min({x}, {y}), {x} + {y}, k_isnan({x}) || k_isnan({y}))",
            y = v[1]
        ),
        _ => unreachable!("{code:?} is not a float op"),
    }
}

/// The expression of a plan's code over operand values (already cast to
/// their operand dtypes), and the dtype it has.
fn pointwise(code: Code, v: &[String], compute: DType, casts: &[DType]) -> (String, DType) {
    let x = &v[0];
    // Comparisons with NaN test the bits: a compiler may assume no NaNs.
    let float_cmp = matches!(compute, DType::F32 | DType::F16);
    let cmp = |op: &str| {
        let e = format!("{x} {op} {}", v[1]);
        let e = match (float_cmp, op) {
            (false, _) => e,
            (true, "!=") => format!("({e} || k_isnan({x}) || k_isnan({}))", v[1]),
            (true, _) => format!("({e} && !k_isnan({x}) && !k_isnan({}))", v[1]),
        };
        (e, DType::Bool)
    };
    let cdt = if compute == DType::F16 {
        DType::F32
    } else {
        compute
    };
    match code {
        Code::Eq => cmp("=="),
        Code::Ne => cmp("!="),
        Code::Lt => cmp("<"),
        Code::Le => cmp("<="),
        Code::Gt => cmp(">"),
        Code::Ge => cmp(">="),
        Code::LogicalNot => (
            match casts[0] {
                DType::Bool => format!("!{x}"),
                d => format!("{x} == {}", literal(0.0, d)),
            },
            DType::Bool,
        ),
        Code::Where => {
            let d = if casts[1] == DType::F16 {
                DType::F32
            } else {
                casts[1]
            };
            (format!("select({}, {}, {x})", v[2], v[1]), d)
        }
        Code::Clamp { min, max } => {
            let mut e = x.clone();
            let mut k = 1;
            let float = cdt == DType::F32;
            if min {
                e = if float {
                    format!("select(max({e}, {b}), {b}, k_isnan({b}))", b = v[k])
                } else {
                    format!("max({e}, {})", v[k])
                };
                k += 1;
            }
            if max {
                e = if float {
                    format!("select(min({e}, {b}), {b}, k_isnan({b}))", b = v[k])
                } else {
                    format!("min({e}, {})", v[k])
                };
            }
            if float {
                e = format!("select({e}, {x}, k_isnan({x}))");
            }
            (e, cdt)
        }
        _ if cdt == DType::F32 => (float_ops(code, v), DType::F32),
        _ if cdt == DType::Bool => {
            let y = v.get(1).cloned().unwrap_or_default();
            let e = match code {
                Code::Add { .. } | Code::Maximum => format!("{x} || {y}"),
                Code::Mul | Code::Minimum => format!("{x} && {y}"),
                Code::Abs | Code::Relu => x.clone(),
                _ => format!("{x} != {y}"),
            };
            (e, DType::Bool)
        }
        _ => {
            // i32 / u32.
            let t = ty(cdt);
            let y = v.get(1).cloned().unwrap_or_default();
            let e = match code {
                Code::Add { alpha } => format!("{x} + {} * {y}", literal(alpha, cdt)),
                Code::Sub { alpha } => format!("{x} - {} * {y}", literal(alpha, cdt)),
                Code::Mul => format!("{x} * {y}"),
                Code::DivTrunc => format!("{x} / {y}"),
                Code::DivFloor if cdt == DType::I32 => {
                    format!("select({x} / {y}, {x} / {y} - 1i, ({x} % {y} != 0i) && (({x} < 0i) != ({y} < 0i)))")
                }
                Code::DivFloor => format!("{x} / {y}"),
                Code::Pow if cdt == DType::I32 => format!("k_powi({x}, {y})"),
                Code::Pow => format!("k_powu({x}, {y})"),
                Code::Maximum => format!("max({x}, {y})"),
                Code::Minimum => format!("min({x}, {y})"),
                Code::Neg => format!("-{x}"),
                Code::Abs if cdt == DType::I32 => format!("abs({x})"),
                Code::Abs => x.clone(),
                Code::Relu if cdt == DType::I32 => format!("max({x}, 0i)"),
                Code::Relu => x.clone(),
                other => format!("{t}(0) /* {other:?} */"),
            };
            (e, cdt)
        }
    }
}
