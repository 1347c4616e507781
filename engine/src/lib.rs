//! Kiln's GPU engine: lowers a program to a schedule of fused WGSL
//! kernels over planned memory and runs it through wgpu.
//!
//! `compile` functionalizes (`mutations_and_views`), schedules (fusion and
//! re-inplacing, `schedule.rs`), plans memory (`plan.rs`) and generates
//! WGSL (`codegen/`, `wgsl.rs`) into a `kernel::Program`; `runtime/` runs
//! it. Without the `compiler` feature the crate is the runtime alone
//! (`kernel`, `runtime`, `export`'s loader): no functionalizer, no code
//! generator.

#[cfg(feature = "compiler")]
mod chain;
#[cfg(feature = "compiler")]
pub mod codegen;
#[cfg(feature = "compiler")]
pub mod error;
pub mod export;
#[cfg(feature = "compiler")]
mod footprint;
#[cfg(feature = "compiler")]
pub mod fusion;
#[cfg(feature = "compiler")]
pub mod index;
pub mod kernel;
#[cfg(feature = "compiler")]
mod lower;
#[cfg(feature = "compiler")]
pub mod plan;
pub mod runtime;
#[cfg(feature = "compiler")]
pub mod schedule;
#[cfg(feature = "compiler")]
pub mod wgsl;

pub use kernel::{HostView, Kernel, MemoryStats, Program, Val, ValueInfo};
#[cfg(not(target_arch = "wasm32"))]
pub use runtime::{quiet_headless_vulkan, show_pipeline_progress_on_terminal, user_cache_dir};
pub use runtime::{report_pipeline_progress, Progress};
pub use runtime::{
    DeviceTensor, Executable, Fetch, Gpu, Held, HostTensor, Input, Output, RunOptions, RunResult,
    RunStats, Session, SessionTotals, Timing,
};
#[cfg(feature = "compiler")]
pub use runtime::{Engine, EngineRun};

#[cfg(feature = "compiler")]
pub use error::{CompileError, Stage};
pub use kernel::BindingRules;
pub use kiln_dtype::DType;
#[cfg(feature = "compiler")]
use kiln_functionalize::graph::{Graph, ValueId};
#[cfg(feature = "compiler")]
use kiln_functionalize::ops::OpKind;
#[cfg(feature = "compiler")]
use kiln_functionalize::{functionalize_decomposed, Remove};
#[cfg(feature = "compiler")]
use std::collections::HashSet;

#[cfg(feature = "compiler")]
pub use kiln_functionalize as functionalize;
pub use wgpu;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[cfg(feature = "compiler")]
    #[error(transparent)]
    Program(#[from] kiln_functionalize::Error),
    /// The compiler cannot lower the program for this device.
    #[cfg(feature = "compiler")]
    #[error(transparent)]
    Compile(#[from] CompileError),
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

/// Choices that depend on the device, and the parameters bound to
/// constants.
#[derive(Clone, Debug)]
pub struct CompileOptions {
    /// Matrix products with at least this many output rows run in 64x64
    /// tiles through workgroup memory (products of at most 16 rows: K
    /// split over 32 lanes per column instead); fewer give each invocation
    /// a block, looping over K (no workgroup memory or barriers): 16x16
    /// where both operands are f32 laid out for `vec4` loads along K (or
    /// B along its columns), else 4x4. GPUs: 0 (always tiled). CPU
    /// adapters: never tiled (lavapipe, linear 128x384x1536: 11.5
    /// GFLOP/s in 4x4 vec4 blocks, 4.0 tiled, 3.6 in scalar blocks, in
    /// one sitting; 512x384x1536 in a slower one: 3.8 in 16x16 blocks,
    /// 1.1 in 4x4).
    pub tile_min_rows: usize,
    /// f32 products whose tiles load as `vec4` run in 128x64 tiles, 8x4
    /// outputs an invocation, instead of 64x64 and 4x4, where that still
    /// gives at least this many workgroups: fewer workgroup-memory reads
    /// per multiply-add, but half the workgroups to spread over the
    /// multiprocessors. GPUs: 512 (H200: linear 4096x384x1536 0.203 ->
    /// 0.168 ms with 768 tall workgroups; MiniLM's 384-wide products, 192
    /// tall workgroups, and an encoder layer at 1024 rows slower tall);
    /// `usize::MAX`: never.
    pub tall_tiles_from: usize,
    /// Softmax and layer norm over contiguous rows of up to 1024: a row per
    /// 1-64 invocations reducing through workgroup memory (GPUs: coalesced
    /// reads, one pass over the data); `false` gives each invocation a
    /// whole row (CPU adapters, where lavapipe's barriers cost more than
    /// they save: 72 vs 21 ms for softmax over 49152 rows of 128).
    pub workgroup_rows: bool,
    /// Elementwise kernels reading a stored tensor through a transposing
    /// view (`x.t()`, a permute moving the innermost dimension) run in
    /// square tiles: each workgroup loads its tile of the source along the
    /// source's rows into workgroup memory, then computes and stores along
    /// the result's rows, so both sides are contiguous (coalesced on GPUs).
    /// Off on CPU adapters, whose caches serve the strided reads and whose
    /// barriers are dear (lavapipe, 2026-11-28: the 4096x4096 transposed
    /// chain in 218-244 ms untiled, 411-586 ms in tiles, 190-195 ms
    /// without the transpose). `KILN_TILE_TRANSPOSES=on|off` overrides a
    /// device's choice, for timing both.
    pub tile_transposes: bool,
    /// The side of those tiles: 32 on GPUs (a workgroup of 32x8, each
    /// invocation four rows, so a warp reads and writes 128 contiguous
    /// bytes; H200, 2026-11-28: see docs/gpu-runs), 16 on CPU adapters
    /// (16x4). `KILN_TRANSPOSE_TILE` overrides it on the machine at hand.
    pub transpose_tile: usize,
    /// Where transposes are not tiled (CPU adapters), an elementwise kernel
    /// reading a stored tensor through a view that swaps its two innermost
    /// dimensions computes a block of 4 columns and 8 (or 4) rows an
    /// invocation: the source's quads under the block are loaded as
    /// vectors and read transposed, and the block stored a vector a row,
    /// instead of a lane-by-lane gather per element; kernels broadcasting a
    /// row down the rows compute 4x4 blocks, loading the row's quad once
    /// for four rows (`Gen::map_group_blocked`). lavapipe, 4096 x 4096
    /// chain (2026-12-01): transposed 106-195 ms -> 34-63, plain 51-55 ->
    /// 41-54. `KILN_TRANSPOSE_BLOCKS=on|off` overrides a device's choice
    /// (blocks serve only where tiles do not), for timing both.
    pub transpose_blocks: bool,
    /// Products in 128x64 tiles (`tall_tiles_from`) accumulate 8x8 blocks
    /// in workgroups of 8x16 invocations instead of 8x4 blocks in 16x16:
    /// 16 multiply-adds a workgroup-memory vector read instead of 10.7.
    /// `KILN_WIDE_BLOCKS=on|off` overrides it on the machine at hand.
    pub wide_blocks: bool,
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
    /// subgroup operations (workgroup memory throughout) and under
    /// `KILN_SUBGROUPS=off` (for timing both).
    pub subgroup: Option<usize>,
    /// Kernels converting to f16 also get a variant with the adapter's own
    /// f16 conversions (`KernelCode::wgsl_f16`), used where the device has
    /// `shader-f16` (lavapipe: yes; SwiftShader: no). `KILN_SHADER_F16=off`
    /// leaves the feature unrequested, for timing both.
    pub shader_f16: bool,
    /// `softmax(f(Q K)) V` as one attention kernel (online softmax over
    /// tiles of keys; no score tensor in memory). GPUs: `true`. CPU
    /// adapters: only with `attention_rows` (the tiled kernel runs a query
    /// row per SIMD lane there, its dot products through per-lane loads:
    /// slower than the products and softmax apart).
    /// `KILN_FUSE_ATTENTION=on|off` overrides a device's choice.
    pub fuse_attention: bool,
    /// Attention kernels give each invocation two query rows and walk the
    /// keys four at a time, each lane of a subgroup loading a share of
    /// them and `subgroupBroadcast` handing them to all (CPU adapters,
    /// where a subgroup is one SIMD register and memory is read lane by
    /// lane: load instructions are the cost; `codegen::attention`), with
    /// no workgroup memory or barrier. Needs `subgroup`. lavapipe, the
    /// 128 x 256 4-head workload (2026-12-04): attention 3.6 ms, against
    /// 55-58 ms tiled, 7.7 ms in rows with every lane loading every key
    /// (8 rows a lane), and 6.8-8.0 ms for its two products and softmax
    /// apart (`KILN_FUSE_ATTENTION=off`).
    /// GPUs: `false` (the tiled kernel, keys staged through workgroup
    /// memory). `KILN_ATTENTION_ROWS=on|off` overrides a device's choice.
    pub attention_rows: bool,
    /// With `attention_rows`, attention kernels also compute the `linear`
    /// whose head split their queries are and the output projection of
    /// their head merge (`schedule::fuse_attention_projections`): neither
    /// Q nor the merge reaches memory. `KILN_ATTENTION_PROJECTIONS=on|off`
    /// overrides it, for timing both.
    pub attention_projections: bool,
    /// Matrix-product operands that would be computed inline (a
    /// transpose, a head merge, an elementwise expression) get a buffer of
    /// their own first, so the product reads contiguous rows (CPU
    /// adapters, whose register blocks load those as `vec4`: MiniLM's
    /// attention-output projection on lavapipe 12.8 ms -> 3.4 ms plus a
    /// copy). GPUs: `false` (tiles stage any layout through workgroup
    /// memory). `KILN_CONTIGUOUS_OPERANDS=on|off` overrides a device's
    /// choice, for timing both.
    pub contiguous_operands: bool,
    /// Elementwise, gather and scatter-copy kernels launch at most this
    /// many workgroups, each invocation looping over the grid (GPUs: 8192,
    /// about 62 workgroups of 256 per multiprocessor of an H100, where
    /// `kiln bandwidth`'s vec4 copy of 256 MiB reached 2857 GB/s this way,
    /// 2818 with 4096, 2753 with 2048, 2452 with one workgroup per 1024
    /// elements, 2026-11-26; this default, 2048, is what exports for
    /// browsers get); `None`: one invocation per element (or four).
    pub grid_stride: Option<usize>,
    /// Independent kernels share one launch where their workgroups have
    /// one shape (the reductions of one tensor, writes into a K and a V
    /// cache; `codegen::siblings`), a kernel moving ahead of independent
    /// ones to join an earlier launch unless that plan needs more memory
    /// than joining neighbours only and more than eager's peak.
    /// `false`: a launch each (sibling products still share theirs);
    /// `KILN_SHARE_LAUNCHES=off` makes that the default, for timing both.
    pub share_launches: bool,
    /// Consecutive kernels over narrow rows (products with weights, layer
    /// norms, softmaxes, reductions over rows and their elementwise
    /// neighbours, at most `fusion::CHAIN_MAX_WIDTH` elements a block) run
    /// as one row kernel, an invocation per block of rows, the
    /// intermediates in registers (`chain::chain_rows`). `false`: a kernel each; `KILN_CHAIN_ROWS=off`
    /// makes that the default, for timing both.
    pub chain_rows: bool,
    /// Small programs run their kernels in sequence in one workgroup, the
    /// values only they read in workgroup memory (`codegen::sequence`):
    /// one launch instead of several. `KILN_SEQUENCE=off` makes `false`
    /// the default, for timing both.
    pub sequence: bool,
    /// The largest buffer the device allows: no tensor may be larger.
    pub max_buffer_bytes: usize,
    /// Binding offsets and sizes the device allows.
    pub rules: BindingRules,
    /// Storage buffers a kernel may bind (WebGPU's default, and browsers: 8).
    pub max_bindings: usize,
    /// Parameter indices bound to constants: uploaded once, never written.
    pub constants: Vec<usize>,
}

#[cfg(feature = "compiler")]
impl CompileOptions {
    /// Transposed reads run in blocks (`transpose_blocks`, never where
    /// tiles serve them).
    pub(crate) fn blocks_transposes(&self) -> bool {
        self.transpose_blocks && !self.tile_transposes
    }
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            tile_min_rows: 0,
            tall_tiles_from: 512,
            workgroup_rows: true,
            tile_transposes: true,
            transpose_tile: 32,
            transpose_blocks: false,
            wide_blocks: false,
            workgroup: kernel::WORKGROUP,
            vectorize: true,
            grid_stride: Some(2048),
            contiguous_operands: false,
            fuse_attention: true,
            attention_rows: false,
            attention_projections: true,
            share_launches: std::env::var("KILN_SHARE_LAUNCHES").map_or(true, |v| v != "off"),
            chain_rows: std::env::var("KILN_CHAIN_ROWS").map_or(true, |v| v != "off"),
            sequence: std::env::var("KILN_SEQUENCE").map_or(true, |v| v != "off"),
            subgroup: None,
            shader_f16: false,
            max_buffer_bytes: 256 << 20,
            rules: BindingRules::default(),
            max_bindings: 8,
            constants: vec![],
        }
    }
}

/// Compiles `src` (any program: it is functionalized first).
#[cfg(feature = "compiler")]
pub fn compile(src: &Graph) -> Result<Program, EngineError> {
    compile_with(src, &CompileOptions::default())
}

/// Compiles `src` with device-specific choices.
#[cfg(feature = "compiler")]
pub fn compile_with(src: &Graph, options: &CompileOptions) -> Result<Program, EngineError> {
    compile_functional(src, options).map(|(p, _)| p)
}

/// `compile_with`, and the functional graph the kernels compute, returning
/// what a run returns (the outputs, then the mutated parameters' final
/// values): an export's program text.
#[cfg(feature = "compiler")]
pub(crate) fn compile_functional(
    src: &Graph,
    options: &CompileOptions,
) -> Result<(Program, Graph), EngineError> {
    if let Some(&i) = options.constants.iter().find(|&&i| i >= src.inputs.len()) {
        return Err(EngineError::Input {
            index: i,
            msg: format!("no such parameter (the program has {})", src.inputs.len()),
        });
    }
    let f = functionalize_decomposed(src, Remove::MutationsAndViews)?;
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
        if n > u32::MAX as usize {
            return Err(CompileError::TooLarge {
                value: kiln_functionalize::text::Names::of(&g).get(v),
                ty: val.meta.type_string(),
                what: format!(
                    "has {n} elements; GPU kernels index at most {} (split the tensor, or run \
                     it with --backend reference)",
                    u32::MAX
                ),
            }
            .into());
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
    schedule::merge_equal_views(&mut g, &mut outputs);
    schedule::store_permuted_updates(&mut g, &outputs[n_outputs..], &outputs);
    // A kernel binding more buffers than the device allows gets one of its
    // inlined producers computed by a kernel of its own, until all fit:
    // decided on the plan, before any code is generated.
    let staged: HashSet<ValueId> = if options.contiguous_operands {
        let pinned = options.constants.iter().map(|&i| g.inputs[i]).collect();
        let s = schedule::schedule(
            &g,
            &outputs,
            pinned,
            &HashSet::new(),
            options,
            &HashSet::new(),
        )?;
        schedule::inline_product_operands(&g, &s)
    } else {
        HashSet::new()
    };
    let mut force = staged.clone();
    let io = lower::Interface {
        src,
        outputs: &outputs,
        n_outputs,
        mutated_inputs: &mutated_inputs,
    };
    let plan_with = |grouping: &mut lower::Grouping,
                     force: &mut HashSet<ValueId>|
     -> Result<Box<lower::KernelPlan>, EngineError> {
        loop {
            match lower::plan(&g, &io, options, force, grouping)? {
                lower::Planned::Ready(plan) => return Ok(plan),
                lower::Planned::Apart(vals) => {
                    grouping.apart.extend(vals.into_iter().map(|v| (v, None)));
                }
                lower::Planned::Counted(vals) => grouping.counted.extend(vals),
                lower::Planned::Materialize(v) => {
                    if !force.insert(v) {
                        return Err(CompileError::internal(
                            Stage::Plan,
                            "materializing a producer did not reduce a kernel's buffers",
                        )
                        .into());
                    }
                }
            }
        }
    };
    // Kernels move ahead of independent ones to share a launch, unless
    // that plan needs more memory than launches of neighbours only and
    // more than eager execution would.
    // Kernels grouped into one launch that turn out to differ in shape are
    // grouped again by shape (a second plan), so that the plan never keeps
    // alive together what runs apart.
    let mut grouping = lower::Grouping {
        lookback: lower::LAUNCH_LOOKBACK,
        maps_past_maps: true,
        ..Default::default()
    };
    let mut regrouped = false;
    let mut staging = !staged.is_empty();
    let eager = kiln_functionalize::interp::eager_peak_bytes(src);
    let generated = loop {
        let mut plan = plan_with(&mut grouping, &mut force)?;
        // Staged operands (contiguous rows for a CPU adapter's products)
        // are dropped where they would hold more memory than eager
        // execution and the plan without them holds less.
        if staging && plan.planned_peak() > eager {
            staging = false;
            let mut unstaged: HashSet<ValueId> = force.difference(&staged).copied().collect();
            let mut g2 = grouping.clone();
            let p2 = plan_with(&mut g2, &mut unstaged)?;
            if p2.planned_peak() < plan.planned_peak() {
                (plan, grouping, force) = (p2, g2, unstaged);
            }
        }
        // Row kernels storing through permuting copies (a head merge)
        // keep those values off dying inputs' buffers: dropped where the
        // plan holds more memory than eager execution and less without.
        if !grouping.rows_in_order && plan.planned_peak() > eager {
            let mut g2 = lower::Grouping {
                rows_in_order: true,
                ..grouping.clone()
            };
            let p2 = plan_with(&mut g2, &mut force)?;
            if p2.planned_peak() < plan.planned_peak() {
                (plan, grouping) = (p2, g2);
            }
        }
        // Elementwise kernels moved ahead of elementwise kernels fill
        // earlier kernels: kept where that moves fewer bytes or runs
        // fewer kernels, or holds less memory at that.
        if grouping.maps_past_maps {
            let mut ordered = lower::Grouping {
                maps_past_maps: false,
                ..grouping.clone()
            };
            let p2 = plan_with(&mut ordered, &mut force)?;
            let key = |p: &lower::KernelPlan| (p.bytes_moved(&g), p.kernels(), p.planned_peak());
            if key(&p2) <= key(&plan) {
                plan = p2;
                grouping = ordered;
            }
        }
        // Norms before narrow products that row kernels left apart (the
        // device's bindings) computed by the products instead: kept where
        // that moves fewer bytes or runs fewer kernels.
        let lone = plan.lone_norms(&g);
        if grouping.narrow_norms.is_empty() && !lone.is_empty() {
            let mut norms = lower::Grouping {
                narrow_norms: lone,
                ..grouping.clone()
            };
            let p2 = plan_with(&mut norms, &mut force)?;
            let key = |p: &lower::KernelPlan| (p.bytes_moved(&g), p.kernels());
            if key(&p2) < key(&plan) && p2.planned_peak() <= eager.max(plan.planned_peak()) {
                plan = p2;
                grouping = norms;
            }
        }
        if options.share_launches && grouping.lookback > 1 {
            let mut near = lower::Grouping {
                lookback: 1,
                ..grouping.clone()
            };
            let near_plan = plan_with(&mut near, &mut force)?;
            if near_plan.planned_peak() < plan.planned_peak() && plan.planned_peak() > eager {
                plan = near_plan;
                grouping = near;
            }
        }
        // Still above eager's peak: kernels of other kinds a launch each,
        // where their results alive together hold that memory.
        if options.share_launches && !grouping.launch_each && plan.planned_peak() > eager {
            let mut each = lower::Grouping {
                launch_each: true,
                ..grouping.clone()
            };
            let p2 = plan_with(&mut each, &mut force)?;
            if p2.planned_peak() < plan.planned_peak() {
                plan = p2;
                grouping = each;
            }
        }
        // Elementwise kernels kept from sharing a launch only because one
        // writes over a buffer another reads (an input dying there, or a
        // value placed under the result once it died): kept where keeping
        // those buffers moves fewer bytes or runs fewer kernels, within
        // eager's peak (or the plan's, if above).
        // Each round may uncover the next result placed over a kept value:
        // a few rounds, each from the last one's plan.
        let mut kept = grouping.clone();
        let mut last = None;
        for _ in 0..JOIN_ROUNDS {
            let from = last.as_ref().unwrap_or(&plan);
            let longer = from
                .joins_overlapped()
                .iter()
                .any(|(u, v)| kept.live_until.get(u) != Some(v));
            if !longer && from.joins_blocked().is_subset(&kept.keep_inputs) {
                break;
            }
            kept.keep_inputs
                .extend(from.joins_blocked().iter().copied());
            let overlapped = from.joins_overlapped().clone();
            kept.live_until.extend(overlapped);
            let p2 = plan_with(&mut kept, &mut force)?;
            let key = |p: &lower::KernelPlan| (p.bytes_moved(&g), p.kernels());
            if key(&p2) < key(&plan) && p2.planned_peak() <= eager.max(plan.planned_peak()) {
                plan = p2;
                grouping = kept.clone();
                last = None;
            } else {
                last = Some(p2);
            }
        }
        let generated = lower::generate(&g, options, *plan)?;
        if generated.apart.is_empty() || regrouped {
            break generated;
        }
        regrouped = true;
        grouping.apart.extend(generated.apart);
    };
    let generated = without_workgroup_only(&g, options, generated, &grouping, &force, plan_with)?;
    let p = lower::assemble(&g, &io, options, generated)?;
    dump_wgsl(&p);
    g.outputs = outputs;
    Ok((p, g))
}

/// `generated` planned again with the buffers its kernels in sequence
/// keep in workgroup memory alone out of the arena (they are never stored
/// in memory, yet the arena placed them first). Kept where the second
/// plan keeps them there alone too, in one launch shape, and is smaller.
#[cfg(feature = "compiler")]
fn without_workgroup_only(
    g: &Graph,
    options: &CompileOptions,
    generated: lower::Generated,
    grouping: &lower::Grouping,
    force: &HashSet<ValueId>,
    plan_with: impl Fn(
        &mut lower::Grouping,
        &mut HashSet<ValueId>,
    ) -> Result<Box<lower::KernelPlan>, EngineError>,
) -> Result<lower::Generated, EngineError> {
    if generated.workgroup_only.is_empty() {
        return Ok(generated);
    }
    let mut again = lower::Grouping {
        workgroup_only: generated.workgroup_only.clone(),
        workgroup_words: generated.workgroup_words.clone(),
        ..grouping.clone()
    };
    let plan = plan_with(&mut again, &mut force.clone())?;
    if plan.planned_peak() >= generated.planned_peak() {
        return Ok(generated);
    }
    let second = lower::generate(g, options, *plan)?;
    let alone = second.workgroup_only.is_superset(&generated.workgroup_only);
    Ok(match alone && second.apart.is_empty() {
        true => second,
        false => generated,
    })
}

/// Rounds of keeping buffers alive so that elementwise kernels can share
/// a launch (a bound on the search, not on correctness).
#[cfg(feature = "compiler")]
const JOIN_ROUNDS: usize = 4;

/// With `KILN_DUMP_WGSL=DIR`, writes each kernel's shader there
/// (`<index>_<label>.wgsl`) for reading or for external tools.
#[cfg(feature = "compiler")]
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
