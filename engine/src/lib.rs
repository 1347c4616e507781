//! Kiln's GPU engine: lowers a program to a schedule of fused WGSL
//! kernels over planned memory and runs it through wgpu.
//!
//! `compile` functionalizes (`mutations_and_views`), schedules (fusion and
//! re-inplacing, `schedule.rs`), plans memory (`plan.rs`) and generates
//! WGSL (`codegen/`, `wgsl.rs`); `runtime/` runs the result.
// Without the compiler, its passes are unused: the linker drops them.
#![cfg_attr(not(feature = "compiler"), allow(dead_code, unused_imports))]

pub mod codegen;
pub mod export;
mod footprint;
pub mod index;
pub mod plan;
pub mod runtime;
pub mod schedule;
pub mod wgsl;

pub use runtime::{
    DeviceTensor, Engine, EngineRun, Executable, Fetch, Gpu, HostTensor, Input, Output, RunOptions,
    RunResult, RunStats, Session, SessionTotals, Timing,
};

use codegen::{BindingRules, Gen, KernelCode, Loc};
use kiln_functionalize::graph::{Def, Graph, ValueId};
use kiln_functionalize::ops::OpKind;
use kiln_functionalize::{functionalize, Remove};
use std::collections::{HashMap, HashSet};
use wgsl::Buf;

pub use kiln_functionalize as functionalize;
pub use wgpu;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Program(#[from] kiln_functionalize::Error),
    #[error("the gpu backend does not support this program: {0}")]
    Unsupported(String),
    #[error("no GPU adapter: {0}")]
    NoAdapter(String),
    #[error("GPU device error: {0}")]
    Device(String),
    #[error("input {index}: {msg}")]
    Input { index: usize, msg: String },
    #[error("tensor: {0}")]
    Tensor(String),
    #[error("{0}")]
    Usage(String),
    /// A run's value left its range: an i64 beyond the device's 32 bits
    /// (`wgsl::ty`), or an index out of bounds.
    #[error("{0}")]
    Range(String),
    #[error("internal error in the gpu backend: {0}")]
    Internal(String),
}

/// A kernel of a compiled program.
#[derive(Clone, Debug)]
pub struct Kernel {
    pub code: KernelCode,
    /// The source ops this kernel computes (fused producers included).
    pub ops: Vec<String>,
    pub bytes_read: usize,
    pub bytes_written: usize,
    /// Arithmetic operations: 2 M N K for matrix products, one per element
    /// and fused op otherwise.
    pub flops: usize,
}

/// Memory figures of a compiled program, in bytes (4 bytes an element on
/// the GPU, whatever the dtype).
#[derive(Clone, Debug, Default)]
pub struct MemoryStats {
    /// Parameters (inputs and constants).
    pub io: usize,
    /// The planned arena of intermediates and outputs.
    pub arena: usize,
    /// The most arena bytes alive at once: no plan can do better.
    pub lower_bound: usize,
    /// One buffer per materialized value.
    pub naive: usize,
    /// Every value of the functional graph in its own buffer.
    pub naive_unfused: usize,
    /// What eager execution of the source program holds at its peak.
    pub eager_peak: usize,
}

impl MemoryStats {
    pub fn planned_peak(&self) -> usize {
        self.io + self.arena
    }
}

/// A program ready to load on a device.
pub struct Program {
    /// The functional, view-free graph the kernels compute.
    pub graph: Graph,
    /// What a run returns: the program's outputs, then the final value of
    /// each mutated parameter.
    pub outputs: Vec<ValueId>,
    /// What a run reads back: materialized outputs, and the buffers the
    /// other outputs are views of (taken on the host).
    pub readback: Vec<ValueId>,
    /// Output -> the buffer it is a view of.
    pub host_views: HashMap<ValueId, ValueId>,
    pub n_outputs: usize,
    /// The parameter index each extra output writes back to.
    pub mutated_inputs: Vec<usize>,
    pub kernels: Vec<Kernel>,
    pub locs: HashMap<ValueId, Loc>,
    /// Words of each parameter's buffer.
    pub param_words: Vec<usize>,
    /// Parameters bound to session constants (never written).
    pub constants: Vec<usize>,
    /// Parameters whose buffer a kernel writes (results written over a
    /// dying input): a run fills them anew each time.
    pub written_params: Vec<usize>,
    pub arena_words: usize,
    /// The arena word where kernels record a fault (`codegen::Fault`: an
    /// i64 result beyond the device's 32 bits, an index out of bounds) and
    /// the statement's position; `None` when no kernel can fault.
    pub status_word: Option<usize>,
    pub memory: MemoryStats,
    /// Bytes a run must move at least: every parameter read once, every
    /// output written once.
    pub min_bytes: usize,
}

/// Elementwise results written over an input that dies in the same kernel
/// (the in-place ops of eager execution): each invocation reads the input
/// at its own index before writing the result there, so they can share a
/// buffer. Recorded as buffer aliases in the schedule.
fn reuse_dying_inputs(
    g: &Graph,
    sched: &mut schedule::Schedule,
    groups: &[Vec<ValueId>],
    step: &HashMap<ValueId, usize>,
    last: &HashMap<ValueId, usize>,
    outputs: &[ValueId],
    packed: &dyn Fn(ValueId) -> bool,
) {
    let empty = HashMap::new();
    for grp in groups {
        if !grp.iter().all(|&v| is_map(g, sched, v)) {
            continue;
        }
        let here = step[&grp[0]];
        let mut taken: Vec<ValueId> = vec![];
        for (i, &v) in grp.iter().enumerate() {
            let Def::Node(n, _) = g.values[v].def else {
                continue;
            };
            if !sched.is_materialized.contains(&v) {
                continue; // kept in registers
            }
            for u in schedule::reads(g, sched, n) {
                let root = sched.root(u);
                if sched.pinned.contains(&root) {
                    continue;
                }
                // Same elements in the same layout (a packed bool result
                // cannot take an f32 buffer: one word would hold others'
                // elements).
                let same_layout =
                    packed(root) == packed(v) && (!packed(v) || g.meta(u).dtype == g.meta(v).dtype);
                if taken.contains(&root) || g.meta(u).numel() != g.meta(v).numel() || !same_layout {
                    continue;
                }
                // Everything living in the buffer dies in this kernel and is
                // no output.
                let dies = sched
                    .sharing(root)
                    .iter()
                    .all(|w| !outputs.contains(w) && last.get(w).is_none_or(|&l| l <= here));
                // No other member of the kernel reads it.
                let others_read = grp.iter().enumerate().any(|(j, &w)| {
                    j != i
                        && g.node_of(w).is_some_and(|m| {
                            schedule::reads(g, sched, m)
                                .iter()
                                .any(|r| sched.root(*r) == root)
                        })
                });
                if !dies || others_read || step.get(&root).is_some_and(|&s| s == here) {
                    continue;
                }
                // v reads it only at its own index.
                let mut trial = codegen::Gen::new(g, sched, &empty);
                if !trial.reads_only_at_own_index(v, root) {
                    continue;
                }
                sched.alias_of.insert(v, u);
                taken.push(root);
                break;
            }
        }
    }
}

/// Members of fused elementwise kernels that nothing outside their kernel
/// reads: they stay in registers (no store, no buffer). Returned, and
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
    let shared: HashSet<ValueId> = sched
        .alias_of
        .iter()
        .chain(&sched.inplace)
        .chain(&sched.host_views)
        .flat_map(|(&a, &b)| [a, b])
        .collect();
    let mut out = HashSet::new();
    for grp in groups.iter().filter(|grp| grp.len() > 1) {
        for &v in grp {
            let kept =
                outputs.contains(&v) || shared.contains(&v) || sched.inplace.contains_key(&v);
            let rs = readers.get(&v).map(Vec::as_slice).unwrap_or(&[]);
            if !kept && !rs.is_empty() && rs.iter().all(|w| grp.contains(w)) {
                out.insert(v);
            }
        }
    }
    sched.materialized.retain(|v| !out.contains(v));
    for v in &out {
        sched.is_materialized.remove(v);
    }
    out
}

/// An elementwise value computed by a plain map kernel.
fn is_map(g: &Graph, s: &schedule::Schedule, v: ValueId) -> bool {
    match g.values[v].def {
        Def::Node(n, _) => {
            schedule::class(g, n).is_ok_and(|c| c == schedule::Class::Map)
                && !s.inplace.contains_key(&v)
                && !s.fused.contains_key(&v)
        }
        Def::Input(_) => false,
    }
}

/// Choices that depend on the device, and the parameters bound to
/// constants.
#[derive(Clone, Debug)]
pub struct CompileOptions {
    /// Matrix products with at least this many output rows run in 64x64
    /// tiles through workgroup memory (products of at most 16 rows: K
    /// split over 32 lanes per column instead); fewer give each invocation
    /// a 4x4 block, looping over K (no workgroup memory or barriers; `vec4`
    /// loads of f32 operands laid out for them). GPUs: 0 (always tiled).
    /// CPU adapters: never tiled (lavapipe, linear 128x384x1536: 11.5
    /// GFLOP/s in vec4 blocks, 4.0 tiled, 3.6 in scalar blocks).
    pub tile_min_rows: usize,
    /// Softmax and layer norm over contiguous rows of up to 1024: a row per
    /// 1-64 invocations reducing through workgroup memory (GPUs: coalesced
    /// reads, one pass over the data); `false` gives each invocation a
    /// whole row (CPU adapters, where lavapipe's barriers cost more than
    /// they save: 72 vs 21 ms for softmax over 49152 rows of 128).
    pub workgroup_rows: bool,
    /// Invocations per workgroup of elementwise and other 1-D kernels: 256
    /// on GPUs (an H100 copies 1868 GB/s with 256, 799 with 64), 64 on CPU
    /// adapters (lavapipe: a 16M-element chain in 54 ms with 64, 75 with
    /// 256).
    pub workgroup: u32,
    /// Elementwise kernels compute four elements an invocation, binding
    /// the buffers they touch only there as `vec4<u32>` (an H100 copies
    /// 2478 GB/s with vec4 loads, 1868 with one f32 an invocation; lavapipe
    /// runs a 16M-element chain in 42 ms instead of 51).
    pub vectorize: bool,
    /// Row reductions combine lanes with subgroup shuffles (no workgroup
    /// memory, no barrier) within blocks of this many invocations, the
    /// device's smallest subgroup size; `None` where the device has no
    /// subgroup operations (workgroup memory throughout).
    pub subgroup: Option<usize>,
    /// `softmax(f(Q K)) V` as one attention kernel (online softmax over
    /// tiles of keys; no score tensor in memory). GPUs: `true`. CPU
    /// adapters: `false` (lavapipe runs a query row per SIMD lane, its
    /// dot products through per-lane loads; MiniLM 32 x 128 per layer:
    /// 356 ms fused, 120 ms as two vec4 products, a softmax and three
    /// operand copies).
    pub fuse_attention: bool,
    /// Matrix-product operands that would be computed inline (a
    /// transpose, a head merge, an elementwise expression) get a buffer of
    /// their own first, so the product reads contiguous rows (CPU
    /// adapters, whose register blocks load those as `vec4`: MiniLM's
    /// attention-output projection on lavapipe 12.8 ms -> 3.4 ms plus a
    /// copy). GPUs: `false` (tiles stage any layout through workgroup
    /// memory).
    pub contiguous_operands: bool,
    /// Elementwise, gather and scatter-copy kernels launch at most this
    /// many workgroups, each invocation looping over the grid (GPUs: 8192,
    /// about 62 workgroups of 256 per multiprocessor of an H100, where
    /// `kiln bandwidth`'s vec4 copy of 256 MiB reached 2857 GB/s this way,
    /// 2818 with 4096, 2753 with 2048, 2452 with one workgroup per 1024
    /// elements, 2026-11-26; this default, 2048, is what exports for
    /// browsers get); `None`: one invocation per element (or four).
    pub grid_stride: Option<usize>,
    /// The largest buffer the device allows: no tensor may be larger.
    pub max_buffer_bytes: usize,
    /// Binding offsets and sizes the device allows.
    pub rules: BindingRules,
    /// Storage buffers a kernel may bind (WebGPU's default, and browsers: 8).
    pub max_bindings: usize,
    /// Parameter indices bound to constants: uploaded once, never written.
    pub constants: Vec<usize>,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            tile_min_rows: 0,
            workgroup_rows: true,
            workgroup: wgsl::WORKGROUP,
            vectorize: true,
            grid_stride: Some(2048),
            contiguous_operands: false,
            fuse_attention: true,
            subgroup: None,
            max_buffer_bytes: 256 << 20,
            rules: BindingRules::default(),
            max_bindings: 8,
            constants: vec![],
        }
    }
}

/// Distinct buffers the kernel computing `vals` binds (each value's
/// buffer and every buffer its inlined producers read).
fn buffers_touched(g: &Graph, sched: &schedule::Schedule, vals: &[ValueId]) -> usize {
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
    roots.len()
}

/// Compiles `src` (any program: it is functionalized first).
#[cfg(feature = "compiler")]
pub fn compile(src: &Graph) -> Result<Program, EngineError> {
    compile_with(src, &CompileOptions::default())
}

/// Compiles `src` with device-specific choices.
#[cfg(feature = "compiler")]
pub fn compile_with(src: &Graph, options: &CompileOptions) -> Result<Program, EngineError> {
    if let Some(&i) = options.constants.iter().find(|&&i| i >= src.inputs.len()) {
        return Err(EngineError::Input {
            index: i,
            msg: format!("no such parameter (the program has {})", src.inputs.len()),
        });
    }
    let f = functionalize(src, Remove::MutationsAndViews)?;
    if let Some(m) = f
        .mutated_inputs
        .iter()
        .find(|m| options.constants.contains(&m.input))
    {
        let name = src.values[src.inputs[m.input]]
            .name
            .clone()
            .unwrap_or_default();
        return Err(EngineError::Input {
            index: m.input,
            msg: format!(
                "parameter %{name} is bound to a constant (uploaded once) but the program \
                 writes it; pass it as an ordinary input instead"
            ),
        });
    }
    let mut g = f.graph;
    // Refused before anything is allocated: kernels index elements with
    // 32-bit integers (and a buffer's size is checked once scheduled).
    for (v, val) in g.values.iter() {
        let n = val.meta.numel();
        let name = || {
            format!(
                "%{} ({})",
                kiln_functionalize::text::Names::of(&g).get(v),
                val.meta.type_string()
            )
        };
        if n > u32::MAX as usize {
            return Err(EngineError::Unsupported(format!(
                "{} has {n} elements; GPU kernels index at most {} (split the tensor, \
                 or run it with --backend reference)",
                name(),
                u32::MAX
            )));
        }
    }
    // The copy_ epilogue becomes extra outputs the runtime writes back.
    let epilogue: Vec<_> = g
        .order
        .iter()
        .copied()
        .filter(|&n| g.nodes[n].op.def().kind == OpKind::InPlace)
        .collect();
    g.order.retain(|n| !epilogue.contains(n));
    let n_outputs = g.outputs.len();
    let mut outputs = g.outputs.clone();
    outputs.extend(f.mutated_inputs.iter().map(|m| m.value));
    let mutated_inputs: Vec<usize> = f.mutated_inputs.iter().map(|m| m.input).collect();
    // A kernel binding more buffers than the device allows gets one of its
    // inlined producers computed by a kernel of its own, until all fit.
    let mut force: HashSet<ValueId> = if options.contiguous_operands {
        let pinned = options.constants.iter().map(|&i| g.inputs[i]).collect();
        let s = schedule::schedule(
            &g,
            &outputs,
            pinned,
            &HashSet::new(),
            options.fuse_attention,
        )?;
        schedule::inline_product_operands(&g, &s)
    } else {
        HashSet::new()
    };
    loop {
        let lowered = lower(
            &g,
            src,
            &outputs,
            n_outputs,
            &mutated_inputs,
            options,
            &force,
        )?;
        match lowered {
            Lowered::Done(p) => {
                dump_wgsl(&p);
                return Ok(*p);
            }
            Lowered::Materialize(v) => {
                if !force.insert(v) {
                    return Err(EngineError::Internal(
                        "materializing a producer did not reduce a kernel's buffers".into(),
                    ));
                }
            }
        }
    }
}

/// With `KILN_DUMP_WGSL=DIR`, writes each kernel's shader there
/// (`<index>_<label>.wgsl`) for reading or for external tools.
fn dump_wgsl(p: &Program) {
    let Some(dir) = std::env::var_os("KILN_DUMP_WGSL").filter(|d| !d.is_empty()) else {
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    if let Err(e) = std::fs::create_dir_all(&dir) {
        log::warn!("KILN_DUMP_WGSL: {}: {e}", dir.display());
        return;
    }
    for (i, k) in p.kernels.iter().enumerate() {
        let name: String = k
            .code
            .label
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        let path = dir.join(format!("{i:03}_{name}.wgsl"));
        if let Err(e) = std::fs::write(&path, &k.code.wgsl) {
            log::warn!("KILN_DUMP_WGSL: {}: {e}", path.display());
        }
    }
}

enum Lowered {
    Done(Box<Program>),
    /// Retry with this inlined value materialized.
    Materialize(ValueId),
}

/// The inlined producer, in the kernel computing `grp`, whose
/// materialization saves the most bindings: the buffers it reads that the
/// kernel does not otherwise read directly, less the one it adds. `None`
/// when no producer saves any.
fn producer_to_materialize(
    g: &Graph,
    sched: &schedule::Schedule,
    grp: &[ValueId],
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
        if own.len() >= 2 && best.is_none_or(|(b, _)| own.len() > b) {
            best = Some((own.len(), u));
        }
        if let Some(m) = g.node_of(u) {
            stack.extend(g.nodes[m].inputs());
        }
    }
    best.map(|(_, u)| u)
}

#[allow(clippy::too_many_arguments)]
fn lower(
    g: &Graph,
    src: &Graph,
    outputs: &[ValueId],
    n_outputs: usize,
    mutated_inputs: &[usize],
    options: &CompileOptions,
    force: &HashSet<ValueId>,
) -> Result<Lowered, EngineError> {
    let pinned: HashSet<ValueId> = options.constants.iter().map(|&i| g.inputs[i]).collect();
    let mut sched = schedule::schedule(g, outputs, pinned, force, options.fuse_attention)?;
    // Every tensor with a buffer fits in one.
    for &v in g.inputs.iter().chain(&sched.materialized) {
        let bytes = g.meta(v).numel().saturating_mul(4);
        if bytes > options.max_buffer_bytes {
            return Err(EngineError::Unsupported(format!(
                "%{} ({}) takes {bytes} bytes on the GPU (4 an element); this device's largest \
                 buffer is {} bytes",
                kiln_functionalize::text::Names::of(g).get(v),
                g.meta(v).type_string(),
                options.max_buffer_bytes
            )));
        }
    }

    // Kernels: consecutive elementwise values of one shape fuse into one
    // multi-output kernel; everything else is a kernel of its own.
    let no_locs = HashMap::new();
    let mut groups: Vec<Vec<ValueId>> = vec![];
    {
        let mut trial = Gen::new(g, &sched, &no_locs);
        for &v in &sched.materialized {
            let Def::Node(n, _) = g.values[v].def else {
                continue;
            };
            schedule::class(g, n)?;
            let map = is_map(g, &sched, v);
            let joins = map
                && groups.last().is_some_and(|grp: &Vec<ValueId>| {
                    let mut all = grp.clone();
                    all.push(v);
                    is_map(g, &sched, grp[0])
                        && buffers_touched(g, &sched, &all) <= options.max_bindings
                        && trial.fits_group(grp, v)
                });
            match groups.last_mut() {
                Some(grp) if joins => grp.push(v),
                _ => groups.push(vec![v]),
            }
        }
    }
    let registers = register_only(g, &mut sched, &groups, outputs);
    // Lifetimes in steps (one step per kernel group).
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
            for r in schedule::reads(g, &sched, n) {
                let e = last.entry(r).or_insert(0);
                *e = (*e).max(step[&v]);
            }
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
    // Bools and f16 values are packed (bytes and half words, as in eager
    // memory) where every kernel writing them can own whole words: inputs
    // (uploaded by the host) and elementwise results.
    let map_written: HashSet<ValueId> = groups
        .iter()
        .filter(|grp| grp.len() > 1 || is_map(g, &sched, grp[0]))
        .flatten()
        .copied()
        .collect();
    let packed = |v: ValueId| {
        wgsl::per_word(g.meta(v).dtype) > 1 && (g.inputs.contains(&v) || map_written.contains(&v))
    };
    reuse_dying_inputs(g, &mut sched, &groups, &step, &last, outputs, &packed);
    let bytes =
        |v: ValueId| wgsl::words(g.meta(v).dtype, g.meta(v).numel(), packed(sched.root(v))) * 4;
    // A re-inplaced scatter, a reshape and an elementwise result written
    // over its dying input live in the allocation they reuse.
    let root = |v: ValueId| sched.root(v);
    let mut locs: HashMap<ValueId, Loc> = HashMap::new();
    let mut param_words = vec![];
    for (i, &v) in g.inputs.iter().enumerate() {
        locs.insert(
            v,
            Loc {
                buf: Buf::Param(i),
                word: 0,
                packed: packed(v),
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
        let own = step.get(&v).or_else(|| step.get(&r)).copied().unwrap_or(0);
        let first = step.get(&r).copied().unwrap_or(0);
        let l = last.get(&v).copied().unwrap_or(own).max(own);
        let e = span.entry(r).or_insert((first, l));
        e.1 = e.1.max(l);
        if !roots.contains(&r) && !g.inputs.contains(&r) {
            roots.push(r);
        }
    }
    let requests: Vec<plan::Request> = roots
        .iter()
        .map(|r| plan::Request {
            bytes: bytes(*r),
            first: span[r].0,
            last: span[r].1,
        })
        .collect();
    // Arena tensors start at the device's binding alignment: a kernel binds
    // each tensor's own range, and WebGPU forbids a writable binding that
    // overlaps another binding of the same dispatch.
    let mp = plan::plan(&requests, options.rules.align_words * 4);
    for (r, off) in roots.iter().zip(&mp.offsets) {
        locs.insert(
            *r,
            Loc {
                buf: Buf::Arena,
                word: off / 4,
                packed: packed(*r),
            },
        );
    }
    for &v in &owners {
        let r = root(v);
        let l = *locs
            .get(&r)
            .ok_or_else(|| EngineError::Internal("a value without a location".into()))?;
        locs.insert(v, l);
    }

    let mut kernels = vec![];
    let mut gen = Gen::new(g, &sched, &locs);
    gen.registers = registers.clone();
    gen.tile_min_rows = options.tile_min_rows;
    gen.workgroup_rows = options.workgroup_rows;
    gen.workgroup = options.workgroup;
    gen.grid_stride = options.grid_stride;
    gen.subgroup = options.subgroup;
    gen.vectorize = options.vectorize;
    gen.rules = options.rules;
    // The i64 overflow word (`wgsl::ty`) in a binding-aligned slot of its
    // own after the intermediates.
    let align = options.rules.align_words;
    gen.status = Some(mp.arena_bytes.div_ceil(4).div_ceil(align) * align);
    for grp in &groups {
        let mut ops: Vec<String> = vec![];
        let mut reads: Vec<ValueId> = vec![];
        let mut written = 0;
        let mut elements = 0;
        for &v in grp {
            let Def::Node(n, _) = g.values[v].def else {
                continue;
            };
            // Producers kept in registers are members of their own.
            let members: HashSet<_> = grp.iter().filter_map(|&w| g.node_of(w)).collect();
            let mut region: Vec<_> = schedule::inlined_region(g, &sched, n)
                .into_iter()
                .filter(|m| !members.contains(m))
                .collect();
            region.sort_by_key(|&m| g.order.iter().position(|&x| x == m));
            ops.extend(region.iter().map(|&m| g.nodes[m].op.name().to_string()));
            ops.push(g.nodes[n].op.name().to_string());
            reads.extend(
                schedule::reads(g, &sched, n)
                    .into_iter()
                    .filter(|r| !grp.contains(r)),
            );
            let (w, e) = match sched.inplace.get(&v) {
                _ if registers.contains(&v) => (0, g.meta(v).numel()),
                Some(_) => {
                    let src = g.meta(*g.nodes[n].args[1].tensors()[0]).numel();
                    (src * 4, src)
                }
                None => (bytes(v), g.meta(v).numel()),
            };
            written += w;
            elements = elements.max(e);
        }
        reads.sort();
        reads.dedup();
        // Elementwise kernels and in-place scatters read each buffer at most
        // once per invocation; other kernels are charged whole buffers.
        let per_thread =
            grp.len() > 1 || is_map(g, &sched, grp[0]) || sched.inplace.contains_key(&grp[0]);
        // A gather reads of its table only the rows it copies.
        let table = g.node_of(grp[0]).and_then(|n| {
            matches!(
                g.nodes[n].op.def().lowering,
                kiln_functionalize::ops::Lowering::Gather(_)
            )
            .then(|| g.nodes[n].inputs().first().copied())
            .flatten()
        });
        let bytes_read: usize = reads
            .iter()
            .map(|&r| {
                let whole = bytes(r);
                if Some(r) == table {
                    whole.min(written)
                } else if per_thread {
                    whole.min((elements * whole).div_ceil(g.meta(r).numel().max(1)))
                } else {
                    whole
                }
            })
            .sum();
        let codes = if grp.len() > 1 || is_map(g, &sched, grp[0]) {
            if g.meta(grp[0]).numel() == 0 {
                vec![]
            } else {
                vec![gen.map_group(grp)?]
            }
        } else {
            gen.kernel(grp[0])?
        };
        let flops = kernel_flops(g, &sched, grp, ops.len(), elements);
        for code in codes {
            if code.bindings.len() > options.max_bindings {
                if let Some(u) = producer_to_materialize(g, &sched, grp) {
                    return Ok(Lowered::Materialize(u));
                }
                return Err(EngineError::Unsupported(format!(
                    "kernel {} binds {} storage buffers; this device allows {} per shader \
                     stage (split the expression with an intermediate `clone`)",
                    code.label,
                    code.bindings.len(),
                    options.max_bindings
                )));
            }
            kernels.push(Kernel {
                code,
                ops: ops.clone(),
                bytes_read,
                bytes_written: written,
                flops,
            });
        }
    }
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
        io: param_words.iter().sum::<usize>() * 4,
        arena: mp.arena_bytes,
        lower_bound: mp.lower_bound,
        naive: mp.naive,
        naive_unfused,
        eager_peak: kiln_functionalize::interp::eager_peak_bytes(src),
    };
    let status_word = gen.status.filter(|_| gen.status_used);
    Ok(Lowered::Done(Box::new(Program {
        graph: g.clone(),
        outputs: outputs.to_vec(),
        readback,
        host_views: sched.host_views.clone(),
        n_outputs,
        mutated_inputs: mutated_inputs.to_vec(),
        kernels,
        locs,
        param_words,
        constants: options.constants.clone(),
        written_params,
        arena_words: match status_word {
            Some(w) => w + 1,
            None => mp.arena_bytes.div_ceil(4),
        },
        status_word,
        memory,
        min_bytes,
    })))
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
            Some(&schedule::Fused::Epilogue { product }) => {
                // A product's 2 M N K, or one operation per element for a
                // row kernel or reduction; then one per element and tail op.
                return product_flops(g, product).unwrap_or(elements)
                    + ops.saturating_sub(1) * elements;
            }
            Some(&schedule::Fused::Attention {
                scores, product, ..
            }) => {
                return product_flops(g, scores).unwrap_or(0)
                    + product_flops(g, product).unwrap_or(0)
                    + ops.saturating_sub(2) * g.meta(g.nodes[scores].results[0]).numel();
            }
            None => {}
        }
        if let Some(n) = g.node_of(*v) {
            if let Some(f) = product_flops(g, n) {
                return f;
            }
            let node = &g.nodes[n];
            // Reductions and row kernels: per input element; a gather
            // copies rows (per output element).
            let gather = matches!(
                node.op.def().lowering,
                kiln_functionalize::ops::Lowering::Gather(_)
            );
            if let Some(&x) = node.args.first().and_then(|a| a.tensors().first().copied()) {
                if !gather {
                    return ops * g.meta(x).numel().max(g.meta(*v).numel());
                }
            }
        }
    }
    ops * elements
}

/// 2 M N K for a matrix product node (M N output elements, K the
/// contracted size); `None` for other nodes.
fn product_flops(g: &Graph, n: kiln_functionalize::graph::NodeId) -> Option<usize> {
    let node = &g.nodes[n];
    if node.op.def().lowering == kiln_functionalize::ops::Lowering::Attention {
        // q k^T and p v: 2 L S (E + Ev) per batch entry.
        let (q, k) = (*node.args[0].tensors()[0], *node.args[1].tensors()[0]);
        let (qm, km) = (g.meta(q), g.meta(k));
        let om = g.meta(node.results[0]);
        let s = km.sizes[km.dim() - 2];
        let e = qm.sizes[qm.dim() - 1];
        let ev = om.sizes[om.dim() - 1];
        return Some(2 * (om.numel() / ev.max(1)) * s * (e + ev));
    }
    // The left operand holds K last.
    let a = node.op.def().lowering.product()?.left;
    let x = *node.args.get(a)?.tensors().first()?;
    let k = g.meta(*x).sizes.last().copied()?;
    Some(2 * g.meta(node.results[0]).numel() * k)
}

impl Program {
    pub fn bytes_moved(&self) -> usize {
        self.kernels
            .iter()
            .map(|k| k.bytes_read + k.bytes_written)
            .sum()
    }

    /// A human-readable report: kernels with the ops each fuses, traffic
    /// against the minimum, and the planner's figures.
    pub fn stats(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(s, "kernels: {}", self.kernels.len());
        for (i, k) in self.kernels.iter().enumerate() {
            let _ = writeln!(
                s,
                "  {i:3} {:<28} read {:>10} B  write {:>10} B  fuses: {}",
                k.code.label,
                k.bytes_read,
                k.bytes_written,
                k.ops.join(" ")
            );
        }
        let moved = self.bytes_moved();
        let _ = writeln!(
            s,
            "bytes moved: {moved} (minimum {}, ratio {:.3})",
            self.min_bytes,
            moved as f64 / self.min_bytes.max(1) as f64
        );
        let m = &self.memory;
        let _ = writeln!(
            s,
            "memory (bytes): planned peak {} = io {} + arena {}",
            m.planned_peak(),
            m.io,
            m.arena
        );
        let _ = writeln!(
            s,
            "  arena lower bound {}  naive (one buffer per materialized value) {}",
            m.lower_bound, m.naive
        );
        let _ = writeln!(
            s,
            "  naive unfused (one buffer per value) {}  eager reference peak {}",
            m.naive_unfused, m.eager_peak
        );
        let _ = writeln!(
            s,
            "  planned/eager {:.3}  arena/lower bound {:.3}",
            m.planned_peak() as f64 / m.eager_peak.max(1) as f64,
            m.arena as f64 / m.lower_bound.max(1) as f64
        );
        s
    }
}
