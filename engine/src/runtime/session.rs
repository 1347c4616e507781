//! Sessions: programs compiled once per graph (keyed by a structural
//! hash), constants uploaded once and shared by every program of the
//! session, pipelines shared between identical kernels, and runs that move
//! only per-run data.
//!
//! A run takes a `RunContext` (per-run input buffers, an arena, a staging
//! buffer and the bind groups over them) from the executable's pool, so
//! several threads can run one executable at once, each in its own
//! buffers; the pool grows to the number of concurrent runs.

use super::buffers::DeviceTensor;
use super::host::{device_bytes, from_words, HostTensor};
use super::Gpu;
#[cfg(feature = "compiler")]
use crate::compile_with;
use crate::kernel::{self, Binding, Buf, Val};
use crate::{EngineError, Program};
#[cfg(feature = "compiler")]
use kiln_functionalize::Graph;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

static NEXT_SESSION: AtomicU64 = AtomicU64::new(1);

/// A parameter's value for one run.
#[derive(Clone, Copy, Debug)]
pub enum Input<'a> {
    /// Uploaded for this run (`queue.write_buffer` from the bytes).
    Host(&'a HostTensor<'a>),
    /// Already on the device (a result of an earlier run, or uploaded with
    /// `Session::upload`): copied on the device, never through the host.
    Device(&'a DeviceTensor),
}

/// What a run does with one of its results.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fetch {
    /// Read back to the host.
    Host,
    /// Kept on the device, as a `DeviceTensor` of its own.
    Device,
    /// Not wanted: nothing is copied.
    Skip,
}

/// A run's result.
#[derive(Clone, Debug)]
pub enum Output {
    Host(HostTensor<'static>),
    Device(DeviceTensor),
    Skipped,
}

impl Output {
    pub fn host(self) -> Option<HostTensor<'static>> {
        match self {
            Output::Host(t) => Some(t),
            _ => None,
        }
    }

    pub fn device(self) -> Option<DeviceTensor> {
        match self {
            Output::Device(t) => Some(t),
            _ => None,
        }
    }
}

/// GPU time measurement of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Timing {
    #[default]
    Off,
    /// The kernels of the run, from the first to the last (timestamp
    /// queries around one compute pass).
    Total,
    /// Each kernel in a compute pass of its own with its timestamps.
    PerKernel,
}

/// What a run returns, and whether it is timed.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// One per program output.
    pub outputs: Vec<Fetch>,
    /// One per mutated parameter (`Program::mutated_inputs`).
    pub mutated: Vec<Fetch>,
    pub timing: Timing,
}

/// Counters of one run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunStats {
    /// Host to device (`write_buffer`) bytes.
    pub uploaded_bytes: u64,
    /// Device to host bytes.
    pub readback_bytes: u64,
    pub kernels: usize,
    /// GPU time of the kernels (timestamp queries), when timed and the
    /// adapter has them.
    pub gpu_ms: Option<f64>,
    /// Per kernel, with `Timing::PerKernel`.
    pub kernel_ms: Vec<f64>,
}

/// The results of a run: the program's outputs, then each mutated
/// parameter's final value with the parameter's index.
#[derive(Debug)]
pub struct RunResult {
    pub outputs: Vec<Output>,
    pub mutated: Vec<(usize, Output)>,
    pub stats: RunStats,
}

/// Totals over a session's runs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SessionTotals {
    pub runs: u64,
    pub uploaded_bytes: u64,
    pub readback_bytes: u64,
    pub kernels: u64,
}

/// A program's structural hash and each constant-bound parameter with the
/// identity of the tensor bound to it (a replaced constant is another
/// tensor, so programs bound to the old one are not found for the new).
type ProgramKey = (u128, Vec<(usize, usize)>);

/// A constant of a shared weights file: the file's CRC-32 and length, the
/// constant's offset there, its dtype on the device.
pub(crate) type SharedWeight = (u32, u64, u64, kiln_dtype::DType);

/// A device, the constants uploaded to it, and the programs compiled for it.
/// `Send + Sync`: share it (in an `Arc`) between threads.
pub struct Session {
    id: u64,
    gpu: Arc<Gpu>,
    /// The device's choices (`Gpu::compile_options`), or the caller's.
    options: crate::CompileOptions,
    constants: RwLock<HashMap<String, DeviceTensor>>,
    /// Constants of exports with a weights file of their own, by (the
    /// file's CRC-32 and length, the constant's offset there, its dtype on
    /// the device): uploaded once for every export sharing the file.
    shared_weights: Mutex<HashMap<SharedWeight, DeviceTensor>>,
    programs: Mutex<HashMap<ProgramKey, Arc<Executable>>>,
    pipelines: Mutex<HashMap<String, Arc<wgpu::ComputePipeline>>>,
    totals: Mutex<SessionTotals>,
}

impl Session {
    pub fn new(gpu: Arc<Gpu>) -> Session {
        let options = gpu.compile_options();
        Session::with_options(gpu, options)
    }

    /// A session compiling with `options` (its `constants` are ignored:
    /// the session binds its own); e.g. the tiled matrix product on a CPU
    /// adapter, to test it there.
    pub fn with_options(gpu: Arc<Gpu>, options: crate::CompileOptions) -> Session {
        Session {
            id: NEXT_SESSION.fetch_add(1, Ordering::Relaxed),
            gpu,
            options,
            constants: RwLock::new(HashMap::new()),
            shared_weights: Mutex::new(HashMap::new()),
            programs: Mutex::new(HashMap::new()),
            pipelines: Mutex::new(HashMap::new()),
            totals: Mutex::new(SessionTotals::default()),
        }
    }

    /// A session on the default device (`Gpu::new`).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn open() -> Result<Session, EngineError> {
        Ok(Session::new(Arc::new(Gpu::new()?)))
    }

    /// A session on `Gpu::web_like`: what it compiles (and exports) runs
    /// in a browser's WebGPU. It compiles for a GPU-class target
    /// (`CompileOptions::default()`: tiled products through workgroup
    /// memory, rows reduced by workgroups, attention in one kernel,
    /// grid-stride loops, WebGPU's default limits) whatever adapter this
    /// machine has: a page's user most often runs it on a GPU, and a CPU
    /// adapter's choices (a row per invocation, loop products) would be
    /// slow there.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn open_web_like() -> Result<Session, EngineError> {
        let gpu = pollster::block_on(Gpu::web_like())?;
        Ok(Session::with_options(
            Arc::new(gpu),
            crate::CompileOptions::default(),
        ))
    }

    /// `open_web_like` with this adapter's own kernel choices (on a CPU
    /// adapter: a row per invocation, loop products, 64-wide groups) within
    /// WebGPU's limits: the variant a page gives software fallback adapters
    /// (SwiftShader ran the MiniLM page's corpus in 62 s this way, 152 s
    /// with GPU-class kernels, 2026-11-27).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn open_web_like_adapter() -> Result<Session, EngineError> {
        Ok(Session::new(Arc::new(pollster::block_on(Gpu::web_like())?)))
    }

    /// The choices programs are compiled with on this session.
    pub fn compile_options(&self) -> &crate::CompileOptions {
        &self.options
    }

    /// Loads `program` with parameters bound to device tensors
    /// (`program.constants` must list exactly those).
    pub(crate) async fn load_bound(
        &self,
        program: Program,
        constants: Vec<(usize, DeviceTensor)>,
    ) -> Result<Executable, EngineError> {
        self.load_with(program, constants).await
    }

    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    pub fn totals(&self) -> SessionTotals {
        self.totals.lock().map(|t| t.clone()).unwrap_or_default()
    }

    /// Uploads `t` into a device tensor of this session.
    pub fn upload(&self, t: &HostTensor) -> Result<DeviceTensor, EngineError> {
        pollster::block_on(self.upload_async(t))
    }

    pub async fn upload_async(&self, t: &HostTensor<'_>) -> Result<DeviceTensor, EngineError> {
        self.uploading("uploading a tensor", |put| put(t)).await
    }

    /// Runs `f` with a function uploading one tensor, all its uploads
    /// under one error scope: one wait for the device, not one per tensor
    /// (a model's hundred weights are a hundred round trips to a browser's
    /// GPU process otherwise).
    pub(crate) async fn uploading<T, E: From<EngineError>>(
        &self,
        doing: &str,
        f: impl FnOnce(&dyn Fn(&HostTensor) -> Result<DeviceTensor, EngineError>) -> Result<T, E>,
    ) -> Result<T, E> {
        self.gpu.check()?;
        let put = |t: &HostTensor| {
            let d = super::buffers::upload_unscoped(&self.gpu, self.id, t)?;
            if let Ok(mut tot) = self.totals.lock() {
                tot.uploaded_bytes += d.buffer().size();
            }
            Ok(d)
        };
        self.gpu.scoped(doing, || Ok(f(&put))).await?
    }

    /// Uploads `t` once as the constant `name`: every program of the
    /// session whose parameter is named `name` (without `%`) reads it from
    /// the device instead of taking it as an input. Replacing a constant
    /// drops the compiled programs (they bind the old one); executables
    /// already handed out keep the old tensor.
    pub fn add_constant(&self, name: &str, t: &HostTensor) -> Result<(), EngineError> {
        pollster::block_on(self.add_constant_async(name, t))
    }

    pub async fn add_constant_async(
        &self,
        name: &str,
        t: &HostTensor<'_>,
    ) -> Result<(), EngineError> {
        let d = self.upload_async(t).await?;
        let old = self
            .constants
            .write()
            .map_err(|_| EngineError::Internal("constants lock poisoned".into()))?
            .insert(name.to_string(), d);
        if old.is_some() {
            if let Ok(mut p) = self.programs.lock() {
                p.clear();
            }
        }
        Ok(())
    }

    pub fn constant(&self, name: &str) -> Option<DeviceTensor> {
        self.constants.read().ok()?.get(name).cloned()
    }

    pub(crate) fn shared_weight(&self, k: &SharedWeight) -> Option<DeviceTensor> {
        self.shared_weights.lock().ok()?.get(k).cloned()
    }

    pub(crate) fn keep_shared_weight(&self, k: SharedWeight, t: DeviceTensor) {
        if let Ok(mut m) = self.shared_weights.lock() {
            m.insert(k, t);
        }
    }

    /// Compiles `g` for this device (once: later calls with the same
    /// program find it by its structural hash). Parameters named like a
    /// constant of the session are bound to it.
    #[cfg(feature = "compiler")]
    pub fn compile(&self, g: &Graph) -> Result<Arc<Executable>, EngineError> {
        pollster::block_on(self.compile_async(g))
    }

    #[cfg(feature = "compiler")]
    pub async fn compile_async(&self, g: &Graph) -> Result<Arc<Executable>, EngineError> {
        let bound = self.bind_constants(g)?;
        let key: ProgramKey = (
            g.structural_hash(),
            bound.iter().map(|(i, t)| (*i, t.identity())).collect(),
        );
        if let Some(e) = self.programs.lock().ok().and_then(|p| p.get(&key).cloned()) {
            return Ok(e);
        }
        let mut options = self.options.clone();
        options.constants = bound.iter().map(|(i, _)| *i).collect();
        let program = compile_with(g, &options)?;
        let mut exe = self.load_with(program, bound).await?;
        exe.source = Some(Arc::new(g.clone()));
        let exe = Arc::new(exe);
        if let Ok(mut p) = self.programs.lock() {
            p.insert(key, exe.clone());
        }
        Ok(exe)
    }

    /// The session constants `g`'s parameters are named after, checked
    /// against the parameters' types.
    #[cfg(feature = "compiler")]
    fn bind_constants(&self, g: &Graph) -> Result<Vec<(usize, DeviceTensor)>, EngineError> {
        let constants = self
            .constants
            .read()
            .map_err(|_| EngineError::Internal("constants lock poisoned".into()))?;
        let mut bound = vec![];
        for (i, &v) in g.inputs.iter().enumerate() {
            let Some(name) = &g.values[v].name else {
                continue;
            };
            if let Some(c) = constants.get(name.as_str()) {
                let m = g.meta(v);
                if c.dtype() != m.dtype || c.sizes() != m.sizes.as_slice() {
                    return Err(EngineError::Input {
                        index: i,
                        msg: format!(
                            "parameter %{name} is {}, but the session's constant {name} is {}",
                            m.type_string(),
                            c.type_string()
                        ),
                    });
                }
                bound.push((i, c.clone()));
            }
        }
        Ok(bound)
    }

    /// Loads a program compiled with `Gpu::compile_options` and no
    /// constants: every parameter is an input.
    pub fn load(&self, program: Program) -> Result<Executable, EngineError> {
        pollster::block_on(self.load_with(program, vec![]))
    }

    async fn load_with(
        &self,
        program: Program,
        constants: Vec<(usize, DeviceTensor)>,
    ) -> Result<Executable, EngineError> {
        self.gpu.check()?;
        let limit = self.gpu.limits.max_buffer_size;
        let arena_bytes = (program.arena_words as u64 + 1) * 4;
        if arena_bytes > limit {
            return Err(EngineError::Unsupported(format!(
                "the intermediates need {arena_bytes} bytes in one buffer; this device's \
                 largest buffer is {limit} bytes"
            )));
        }
        for (i, &w) in program.param_words.iter().enumerate() {
            if w as u64 * 4 > limit {
                return Err(EngineError::Input {
                    index: i,
                    msg: format!(
                        "parameter {} takes {} bytes; this device's largest buffer is {limit} bytes",
                        program.param(i).type_string(),
                        w * 4
                    ),
                });
            }
        }
        let pipelines = self.pipelines_of(&program).await?;
        let mut consts: Vec<Option<DeviceTensor>> = vec![None; program.params.len()];
        for (i, t) in constants {
            consts[i] = Some(t);
        }
        let slots: Vec<kernel::ParamSlot> = (0..program.params.len())
            .map(|i| program.param_slot(i))
            .collect();
        let packs = constant_packs(&self.gpu, &program, &slots, &consts);
        // Staging: every readback value, one after another.
        let mut staging_at = HashMap::new();
        let mut total = 0u64;
        for &v in &program.readback {
            staging_at.insert(v, total);
            total += value_bytes(&program, v)?;
        }
        // The i64 overflow word last: every run reads it back.
        let status_at = program.status_word.map(|_| total);
        total += status_at.map_or(0, |_| 4);
        Ok(Executable {
            session: self.id,
            gpu: self.gpu.clone(),
            program: Arc::new(program),
            pipelines,
            constants: consts,
            packs,
            slots,
            staging_at,
            status_at,
            staging_bytes: total,
            contexts: Mutex::new(vec![]),
            #[cfg(feature = "compiler")]
            source: None,
            #[cfg(feature = "compiler")]
            variants: Default::default(),
        })
    }

    /// The pipeline of each kernel of `program`: from the session's cache,
    /// or made (and then cached).
    pub(crate) async fn pipelines_of(
        &self,
        program: &Program,
    ) -> Result<Vec<Arc<wgpu::ComputePipeline>>, EngineError> {
        // Pipelines of identical kernels are shared session-wide; new ones
        // join the cache only once they compiled.
        let f16 = self.gpu.native_f16();
        let known: HashMap<String, Arc<wgpu::ComputePipeline>> = {
            let cache = self
                .pipelines
                .lock()
                .map_err(|_| EngineError::Internal("pipeline cache poisoned".into()))?;
            program
                .kernels
                .iter()
                .filter_map(|k| {
                    cache
                        .get(k.code.source(f16))
                        .map(|p| (k.code.source(f16).clone(), p.clone()))
                })
                .collect()
        };
        let checks = ShaderChecks::from_env();
        // Each distinct new shader once, in program order.
        let mut fresh: Vec<&crate::kernel::KernelCode> = vec![];
        for k in &program.kernels {
            if !known.contains_key(k.code.source(f16))
                && !fresh.iter().any(|f| f.source(f16) == k.code.source(f16))
            {
                fresh.push(&k.code);
            }
        }
        let made = self.make_pipelines(&fresh, &checks).await?;
        if let Some(c) = &self.gpu.disk_cache {
            c.save();
        }
        let mut pipelines = vec![];
        for k in &program.kernels {
            let w = k.code.source(f16);
            let p = known.get(w).or_else(|| made.get(w));
            pipelines.push(
                p.ok_or_else(|| EngineError::Internal("a kernel without a pipeline".into()))?
                    .clone(),
            );
        }
        if let Ok(mut cache) = self.pipelines.lock() {
            cache.extend(made);
        }
        Ok(pipelines)
    }

    /// Pipelines of `kernels`, by WGSL. Natively they compile on several
    /// threads at once (drivers compile each shader on the calling thread;
    /// wgpu's error scopes are per thread, so each thread has its own); in
    /// a browser one after another.
    async fn make_pipelines(
        &self,
        kernels: &[&crate::kernel::KernelCode],
        checks: &ShaderChecks,
    ) -> Result<HashMap<String, Arc<wgpu::ComputePipeline>>, EngineError> {
        const DOING: &str = "a generated kernel was rejected";
        let f16 = self.gpu.native_f16();
        #[cfg(not(target_arch = "wasm32"))]
        {
            // `KILN_PIPELINE_THREADS=1` compiles them one after another.
            let threads = std::env::var("KILN_PIPELINE_THREADS")
                .ok()
                .and_then(|t| t.parse().ok())
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
                .min(kernels.len());
            if threads > 1 {
                // Each thread takes the next shader not yet taken (their
                // compile times differ widely).
                let next = std::sync::atomic::AtomicUsize::new(0);
                let made = std::sync::atomic::AtomicUsize::new(0);
                let made: Vec<Result<Vec<_>, EngineError>> = std::thread::scope(|sc| {
                    let workers: Vec<_> = (0..threads)
                        .map(|_| {
                            sc.spawn(|| {
                                pollster::block_on(self.gpu.scoped(DOING, || {
                                    let mut mine = vec![];
                                    loop {
                                        let i =
                                            next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                        let Some(k) = kernels.get(i) else {
                                            return Ok(mine);
                                        };
                                        mine.push((
                                            k.source(f16).clone(),
                                            self.pipeline(k, checks),
                                        ));
                                        let n = 1 + made
                                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                        super::pipelines::progress(n, kernels.len());
                                    }
                                }))
                            })
                        })
                        .collect();
                    workers
                        .into_iter()
                        .map(|w| {
                            w.join().unwrap_or_else(|_| {
                                Err(EngineError::Internal("a pipeline thread panicked".into()))
                            })
                        })
                        .collect()
                });
                let mut out = HashMap::new();
                for ps in made {
                    out.extend(ps?);
                }
                return Ok(out);
            }
        }
        self.gpu
            .scoped(DOING, || {
                Ok(kernels
                    .iter()
                    .enumerate()
                    .map(|(i, k)| {
                        let p = self.pipeline(k, checks);
                        super::pipelines::progress(i + 1, kernels.len());
                        (k.source(f16).clone(), p)
                    })
                    .collect())
            })
            .await
    }

    /// The compute pipeline of one kernel (errors go to the error scope).
    fn pipeline(
        &self,
        k: &crate::kernel::KernelCode,
        checks: &ShaderChecks,
    ) -> Arc<wgpu::ComputePipeline> {
        let d = &self.gpu.device;
        let f16 = self.gpu.native_f16();
        let desc = wgpu::ShaderModuleDescriptor {
            label: Some(&k.label),
            source: wgpu::ShaderSource::Wgsl(k.source(f16).as_str().into()),
        };
        let module = if checks.all() {
            d.create_shader_module(desc)
        } else {
            // SAFETY: see `ShaderChecks`.
            unsafe { d.create_shader_module_trusted(desc, checks.runtime()) }
        };
        Arc::new(d.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(&k.label),
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: wgpu::PipelineCompilationOptions {
                zero_initialize_workgroup_memory: checks.zero_workgroup_memory,
                ..Default::default()
            },
            cache: self.gpu.disk_cache.as_ref().map(|c| {
                c.touched();
                &c.cache
            }),
        }))
    }

    /// Runs `exe` on `inputs` (one per non-constant parameter, in order,
    /// see `Executable::input_params`).
    pub fn run(
        &self,
        exe: &Executable,
        inputs: &[Input],
        options: &RunOptions,
    ) -> Result<RunResult, EngineError> {
        pollster::block_on(self.run_async(exe, inputs, options))
    }

    pub async fn run_async(
        &self,
        exe: &Executable,
        inputs: &[Input<'_>],
        options: &RunOptions,
    ) -> Result<RunResult, EngineError> {
        if exe.session != self.id {
            return Err(EngineError::Usage(
                "the executable was compiled by another session: compile the program with this \
                 one"
                .into(),
            ));
        }
        #[cfg(feature = "compiler")]
        if let Some(pairs) = exe.shared_written_inputs(inputs) {
            if let Some(src) = exe.source.clone() {
                return Box::pin(self.run_aliased(exe, &src, &pairs, inputs, options)).await;
            }
        }
        let mut ctx = exe.take_context().await?;
        let r = exe.run_in(&mut ctx, self.id, inputs, options).await;
        // A failed run may leave a buffer mapped: its context is dropped.
        if r.is_ok() {
            exe.give_back(ctx);
        }
        if let (Ok(r), Ok(mut t)) = (&r, self.totals.lock()) {
            t.runs += 1;
            t.uploaded_bytes += r.stats.uploaded_bytes;
            t.readback_bytes += r.stats.readback_bytes;
            t.kernels += r.stats.kernels as u64;
        }
        r
    }
}

impl Session {
    /// Runs `exe`'s program with parameter pairs `(i, j)` given one device
    /// tensor: the program recompiled with `j` an alias of `i` (cached like
    /// any program), its results mapped back to `exe`'s signature.
    #[cfg(feature = "compiler")]
    async fn run_aliased(
        &self,
        exe: &Executable,
        src: &Graph,
        pairs: &[(usize, usize)],
        inputs: &[Input<'_>],
        options: &RunOptions,
    ) -> Result<RunResult, EngineError> {
        let p = &exe.program;
        let known = exe.variants.lock().ok().and_then(|v| v.get(pairs).cloned());
        let vexe = match known {
            Some(v) => v,
            None => {
                let variant = src.with_aliased_params(pairs).map_err(EngineError::Usage)?;
                let v = self.compile_async(&variant).await?;
                if let Ok(mut m) = exe.variants.lock() {
                    m.insert(pairs.to_vec(), v.clone());
                }
                v
            }
        };
        let dropped: Vec<usize> = pairs.iter().map(|&(_, j)| j).collect();
        // Variant parameter index of original parameter `k` (a dropped one
        // maps to its partner).
        let vindex = |k: usize| -> usize {
            let k = pairs.iter().find(|&&(_, j)| j == k).map_or(k, |&(i, _)| i);
            k - dropped.iter().filter(|&&d| d < k).count()
        };
        let wanted = exe.input_params();
        let vinputs: Vec<Input> = wanted
            .iter()
            .zip(inputs)
            .filter(|(k, _)| !dropped.contains(k))
            .map(|(_, x)| *x)
            .collect();
        let vm = &vexe.program.mutated_inputs;
        let slot = |t: usize| vm.iter().position(|&m| m == vindex(p.mutated_inputs[t]));
        let mut mutated = vec![Fetch::Skip; vm.len()];
        for (t, &f) in options.mutated.iter().enumerate() {
            if let Some(s) = slot(t) {
                if mutated[s] == Fetch::Skip {
                    mutated[s] = f;
                }
            }
        }
        let vopts = RunOptions {
            outputs: options.outputs.clone(),
            mutated,
            ..options.clone()
        };
        let r = self.run_async(&vexe, &vinputs, &vopts).await?;
        let by_slot: Vec<Output> = r.mutated.into_iter().map(|(_, o)| o).collect();
        let mutated = (0..p.mutated_inputs.len())
            .map(|t| {
                let o = match (slot(t), options.mutated[t]) {
                    (_, Fetch::Skip) | (None, _) => Output::Skipped,
                    (Some(s), _) => by_slot[s].clone(),
                };
                (p.mutated_inputs[t], o)
            })
            .collect();
        Ok(RunResult {
            outputs: r.outputs,
            mutated,
            stats: r.stats,
        })
    }
}

/// A buffer for each pack of small constants of `program` (by its
/// first parameter, whose buffer other parameters' `slots` name), each
/// constant copied into its place once.
fn constant_packs(
    gpu: &Gpu,
    program: &Program,
    slots: &[kernel::ParamSlot],
    constants: &[Option<DeviceTensor>],
) -> Vec<Option<wgpu::Buffer>> {
    let d = &gpu.device;
    let mut packs: Vec<Option<wgpu::Buffer>> = vec![None; slots.len()];
    for (i, s) in slots.iter().enumerate() {
        let o = s.buffer;
        if o != i && constants[o].is_some() && packs[o].is_none() {
            packs[o] = Some(d.create_buffer(&wgpu::BufferDescriptor {
                label: Some("kiln constants"),
                size: (program.param_words[o] as u64 * 4).max(4),
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }));
        }
    }
    if packs.iter().all(Option::is_none) {
        return packs;
    }
    let mut enc = d.create_command_encoder(&wgpu::CommandEncoderDescriptor {
        label: Some("kiln constant packs"),
    });
    for (s, c) in slots.iter().zip(constants) {
        if let (Some(c), Some(pack)) = (c, &packs[s.buffer]) {
            if s.words > 0 {
                enc.copy_buffer_to_buffer(
                    c.buffer(),
                    0,
                    pack,
                    s.word as u64 * 4,
                    s.words as u64 * 4,
                );
            }
        }
    }
    gpu.queue.submit([enc.finish()]);
    packs
}

/// Bytes of `v`'s buffer contents.
fn value_bytes(p: &Program, v: Val) -> Result<u64, EngineError> {
    let loc = p
        .locs
        .get(&v)
        .ok_or_else(|| EngineError::Internal("an output without a buffer".into()))?;
    let m = p.value(v);
    Ok((kernel::words(m.dtype, m.numel(), loc.packed) * 4) as u64)
}

/// The buffers of one run in flight.
struct RunContext {
    /// Per non-constant parameter.
    params: Vec<Option<wgpu::Buffer>>,
    arena: wgpu::Buffer,
    /// Made on the first run that reads anything back.
    staging: Option<wgpu::Buffer>,
    bind_groups: Vec<wgpu::BindGroup>,
    timer: Option<Timer>,
}

struct Timer {
    queries: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    read: wgpu::Buffer,
    count: u32,
}

/// Recompiled programs by the parameter pairs they alias.
#[cfg(feature = "compiler")]
type Variants = HashMap<Vec<(usize, usize)>, Arc<Executable>>;

/// A program loaded on a session's device.
pub struct Executable {
    session: u64,
    gpu: Arc<Gpu>,
    pub program: Arc<Program>,
    pipelines: Vec<Arc<wgpu::ComputePipeline>>,
    /// The constant bound to each parameter, if any.
    constants: Vec<Option<DeviceTensor>>,
    /// The buffer of each pack of small constants (by its first
    /// parameter, `Program::param_slot`), filled once from the constants.
    packs: Vec<Option<wgpu::Buffer>>,
    /// Where each parameter's contents go (`Program::param_slot`).
    slots: Vec<kernel::ParamSlot>,
    staging_at: HashMap<Val, u64>,
    /// Where the i64 overflow word lands in the staging buffer.
    status_at: Option<u64>,
    staging_bytes: u64,
    contexts: Mutex<Vec<RunContext>>,
    /// The program as compiled (`Session::compile`), for variants: a run
    /// passing one device tensor as two written parameters recompiles it
    /// with those parameters aliased.
    #[cfg(feature = "compiler")]
    source: Option<Arc<Graph>>,
    /// The recompiled variants, by aliased parameter pairs.
    #[cfg(feature = "compiler")]
    variants: Mutex<Variants>,
}

impl Executable {
    /// Pairs of parameters `(i, j)`, `i < j`, given the same device tensor
    /// where the program writes either: eager would show the write through
    /// the other. `None` when there are none.
    fn shared_written_inputs(&self, inputs: &[Input]) -> Option<Vec<(usize, usize)>> {
        let wanted = self.input_params();
        let p = &self.program;
        let mut pairs: Vec<(usize, usize)> = vec![];
        for (a, (&i, x)) in wanted.iter().zip(inputs).enumerate() {
            for (&j, y) in wanted.iter().zip(inputs).skip(a + 1) {
                let same = match (x, y) {
                    (Input::Device(x), Input::Device(y)) => std::ptr::eq(x.buffer(), y.buffer()),
                    _ => false,
                };
                let written = p.mutated_inputs.contains(&i) || p.mutated_inputs.contains(&j);
                if same && written && !pairs.iter().any(|&(_, d)| d == j || d == i) {
                    pairs.push((i, j));
                }
            }
        }
        (!pairs.is_empty()).then_some(pairs)
    }

    /// Parameters a run takes as inputs (those not bound to constants).
    pub fn input_params(&self) -> Vec<usize> {
        (0..self.constants.len())
            .filter(|&i| self.constants[i].is_none())
            .collect()
    }

    /// Options reading every output back and every mutated parameter too
    /// (`mutated`: Fetch::Host) or not (Fetch::Skip).
    pub fn options(&self, outputs: Fetch, mutated: Fetch) -> RunOptions {
        RunOptions {
            outputs: vec![outputs; self.program.n_outputs],
            mutated: vec![mutated; self.program.mutated_inputs.len()],
            timing: Timing::Off,
        }
    }

    /// Distinct pipelines (identical kernels share one).
    pub fn distinct_pipelines(&self) -> usize {
        let mut ptrs: Vec<*const wgpu::ComputePipeline> =
            self.pipelines.iter().map(Arc::as_ptr).collect();
        ptrs.sort();
        ptrs.dedup();
        ptrs.len()
    }

    /// Makes run buffers now for `n` runs at once (`n` threads running
    /// this executable together, with `options`), so none is allocated
    /// while they run.
    pub fn reserve_runs(&self, n: usize, options: &RunOptions) -> Result<(), EngineError> {
        let mut ready = self
            .contexts
            .lock()
            .map(|mut c| std::mem::take(&mut *c))
            .unwrap_or_default();
        while ready.len() < n {
            ready.push(pollster::block_on(self.new_context())?);
        }
        let prepared = ready
            .iter_mut()
            .try_for_each(|c| self.prepare(c, options).map(|_| ()));
        for c in ready {
            self.give_back(c);
        }
        prepared
    }

    async fn take_context(&self) -> Result<RunContext, EngineError> {
        if let Some(c) = self.contexts.lock().ok().and_then(|mut c| c.pop()) {
            return Ok(c);
        }
        self.new_context().await
    }

    fn give_back(&self, ctx: RunContext) {
        if let Ok(mut c) = self.contexts.lock() {
            c.push(ctx);
        }
    }

    async fn new_context(&self) -> Result<RunContext, EngineError> {
        self.gpu
            .scoped("making a run's buffers and bind groups", || {
                self.make_context()
            })
            .await
    }

    fn make_context(&self) -> Result<RunContext, EngineError> {
        let p = &self.program;
        let d = &self.gpu.device;
        let storage = |label: &str, bytes: u64| {
            d.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: bytes.max(4),
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_DST
                    | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            })
        };
        // A buffer for each input with one of its own (or the first of a
        // pack of small inputs); the others are written into theirs.
        let params: Vec<Option<wgpu::Buffer>> = (0..p.param_words.len())
            .map(|i| {
                (self.constants[i].is_none()
                    && self.packs[i].is_none()
                    && self.slots[i].buffer == i)
                    .then(|| storage("kiln input", p.param_words[i] as u64 * 4))
            })
            .collect();
        // One word past the end: a zero-size value there still binds a word.
        let arena = storage("kiln arena", (p.arena_words as u64 + 1) * 4);
        let mut bind_groups = vec![];
        for (k, pipeline) in p.kernels.iter().zip(&self.pipelines) {
            let entries: Vec<wgpu::BindGroupEntry> = k
                .code
                .bindings
                .iter()
                .enumerate()
                .map(|(i, b)| wgpu::BindGroupEntry {
                    binding: i as u32,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: self.buffer(b.buf, &params, &arena),
                        offset: b.offset,
                        size: wgpu::BufferSize::new(b.size),
                    }),
                })
                .collect();
            bind_groups.push(d.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(&k.code.label),
                layout: &pipeline.get_bind_group_layout(0),
                entries: &entries,
            }));
        }
        Ok(RunContext {
            params,
            arena,
            staging: None,
            bind_groups,
            timer: None,
        })
    }

    fn buffer<'b>(
        &'b self,
        buf: Buf,
        params: &'b [Option<wgpu::Buffer>],
        arena: &'b wgpu::Buffer,
    ) -> &'b wgpu::Buffer {
        match buf {
            Buf::Arena => arena,
            Buf::Param(i) => match (&self.packs[i], &self.constants[i], &params[i]) {
                (Some(pack), _, _) => pack,
                (None, Some(c), _) => c.buffer(),
                (None, None, Some(b)) => b,
                (None, None, None) => unreachable!("every bound parameter has a buffer"),
            },
        }
    }

    fn check_input(&self, session: u64, index: usize, input: &Input) -> Result<(), EngineError> {
        let m = self.program.param(index);
        let name = &m.name;
        let (dtype, sizes, ty) = match input {
            Input::Host(t) => (t.dtype(), t.sizes().to_vec(), t.type_string()),
            Input::Device(t) => {
                if t.session() != session {
                    return Err(EngineError::Input {
                        index,
                        msg: format!(
                            "%{name}: the device tensor belongs to another session (or device); \
                             read it with to_host() or upload it to this session"
                        ),
                    });
                }
                if !t.is_packed() {
                    return Err(EngineError::Input {
                        index,
                        msg: format!(
                            "%{name}: this {} device tensor holds a word per element (a \
                             reduction or product result); read it with to_host() and pass the \
                             host tensor",
                            t.type_string()
                        ),
                    });
                }
                (t.dtype(), t.sizes().to_vec(), t.type_string())
            }
        };
        if dtype != m.dtype || sizes[..] != m.sizes[..] {
            return Err(EngineError::Input {
                index,
                msg: format!("%{name}: expected {}, got {ty}", m.type_string()),
            });
        }
        Ok(())
    }

    /// The values `to_read` from the mapped staging buffer (`None`: nothing
    /// was read back, every value empty); a fault recorded by a kernel is
    /// the error it names.
    fn read_back(
        &self,
        staging: Option<&wgpu::Buffer>,
        read_end: u64,
        to_read: &[Val],
    ) -> Result<HashMap<Val, HostTensor<'static>>, EngineError> {
        let p = &self.program;
        let mut read: HashMap<Val, HostTensor<'static>> = HashMap::new();
        let mut overflow = 0u32;
        if let Some(staging) = staging {
            {
                let view = staging
                    .slice(..read_end)
                    .get_mapped_range()
                    .map_err(|e| EngineError::Device(e.to_string()))?;
                if let Some(at) = self.status_at.map(|a| a as usize) {
                    overflow = u32::from_le_bytes(view[at..at + 4].try_into().expect("4 bytes"));
                }
                for &v in to_read {
                    let at = self.staging_at[&v] as usize;
                    let bytes = value_bytes(p, v)? as usize;
                    let m = p.value(v);
                    read.insert(
                        v,
                        from_words(
                            m.dtype,
                            m.sizes.to_vec(),
                            &view[at..at + bytes],
                            p.locs[&v].packed,
                        ),
                    );
                }
            }
            staging.unmap();
            if overflow > 0 {
                return Err(fault(p, overflow as usize));
            }
        } else {
            for &v in to_read {
                let m = p.value(v);
                read.insert(
                    v,
                    HostTensor::new(m.dtype, m.sizes.to_vec(), vec![])?.into_owned(),
                );
            }
        }

        Ok(read)
    }

    /// The run's timing (what the device can time) with its number of
    /// timestamps, and the staging buffer and query set it needs, made
    /// once per context.
    fn prepare(
        &self,
        ctx: &mut RunContext,
        options: &RunOptions,
    ) -> Result<(Timing, u32), EngineError> {
        let (gpu, p) = (&self.gpu, &self.program);
        let d = &gpu.device;
        let timing = if gpu.has_timestamps() {
            options.timing
        } else {
            Timing::Off
        };
        // A query set holds at most 4096 timestamps: longer programs are
        // timed as a whole.
        let timing = match timing {
            Timing::PerKernel if 2 * p.kernels.len() > wgpu::QUERY_SET_MAX_QUERIES as usize => {
                Timing::Total
            }
            t => t,
        };
        let queries = match timing {
            Timing::Off => 0,
            Timing::Total => 2,
            Timing::PerKernel => 2 * p.kernels.len().max(1) as u32,
        };
        let reads_host = options
            .outputs
            .iter()
            .chain(&options.mutated)
            .any(|&f| f == Fetch::Host)
            || !p.host_views.is_empty() && options.outputs.contains(&Fetch::Device)
            || self.status_at.is_some();
        if reads_host && ctx.staging.is_none() {
            let limit = gpu.limits.max_buffer_size;
            if self.staging_bytes > limit {
                return Err(EngineError::Unsupported(format!(
                    "reading every result back takes {} bytes, more than this device's largest \
                     buffer ({limit} bytes): fetch some results as Fetch::Device or Skip",
                    self.staging_bytes
                )));
            }
            ctx.staging = Some(d.create_buffer(&wgpu::BufferDescriptor {
                label: Some("kiln readback"),
                size: self.staging_bytes.max(4),
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }));
        }
        if queries > 0 && ctx.timer.as_ref().is_none_or(|t| t.count != queries) {
            ctx.timer = Some(Timer::new(d, queries));
        }
        Ok((timing, queries))
    }

    /// The parameters `inputs` bind, checked against the program: their
    /// number, each one's dtype and shape, the run options' shape, no
    /// device tensor passed for two parameters one of which is written.
    fn checked_inputs(
        &self,
        session: u64,
        inputs: &[Input<'_>],
        options: &RunOptions,
    ) -> Result<Vec<usize>, EngineError> {
        let p = &self.program;
        let wanted = self.input_params();
        if inputs.len() != wanted.len() {
            return Err(EngineError::Input {
                index: inputs.len(),
                msg: format!(
                    "the program takes {} inputs ({} of its {} parameters are constants), got {}",
                    wanted.len(),
                    p.params.len() - wanted.len(),
                    p.params.len(),
                    inputs.len()
                ),
            });
        }
        if options.outputs.len() != p.n_outputs || options.mutated.len() != p.mutated_inputs.len() {
            return Err(EngineError::Usage(format!(
                "run options name {} outputs and {} mutated parameters; the program has {} and {} \
                 (Executable::options makes matching ones)",
                options.outputs.len(),
                options.mutated.len(),
                p.n_outputs,
                p.mutated_inputs.len()
            )));
        }
        for (&i, input) in wanted.iter().zip(inputs) {
            self.check_input(session, i, input)?;
        }
        // The program was compiled for distinct parameters: one device
        // tensor passed for two, one of them written, would hide the write
        // from the other (eager would show it). Session-compiled programs
        // are recompiled for it before this (`run_aliased`).
        if let Some(&(i, j)) = self
            .shared_written_inputs(inputs)
            .as_deref()
            .and_then(|p| p.first())
        {
            let name = |k: usize| &p.param(k).name;
            return Err(EngineError::Input {
                index: j,
                msg: format!(
                    "%{} and %{} are the same device tensor and the program writes one of them; \
                     trace them as views of one input (TensorSpec::view), compile the program \
                     with Session::compile, or pass a copy",
                    name(i),
                    name(j)
                ),
            });
        }
        Ok(wanted)
    }

    /// Writes host inputs into their parameter buffers (counted in
    /// `stats`) and copies device inputs in `enc`.
    fn upload(
        &self,
        ctx: &RunContext,
        enc: &mut wgpu::CommandEncoder,
        wanted: &[usize],
        inputs: &[Input<'_>],
        stats: &mut RunStats,
    ) -> Result<(), EngineError> {
        let (gpu, p) = (&self.gpu, &self.program);
        for (&i, input) in wanted.iter().zip(inputs) {
            let slot = self.slots[i];
            let dst = ctx.params[slot.buffer]
                .as_ref()
                .ok_or_else(|| EngineError::Internal("an input without a buffer".into()))?;
            let (at, bytes) = (slot.word as u64 * 4, slot.words as u64 * 4);
            match input {
                Input::Host(t) => {
                    let data = device_bytes(t).map_err(|e| EngineError::Input {
                        index: i,
                        msg: format!("%{}: {e}", p.param(i).name),
                    })?;
                    if !t.bytes().is_empty() {
                        gpu.queue.write_buffer(dst, at, &data);
                        stats.uploaded_bytes += data.len() as u64;
                    }
                }
                Input::Device(t) => {
                    if bytes > 0 {
                        enc.copy_buffer_to_buffer(t.buffer(), 0, dst, at, bytes);
                    }
                }
            }
        }
        Ok(())
    }

    async fn run_in(
        &self,
        ctx: &mut RunContext,
        session: u64,
        inputs: &[Input<'_>],
        options: &RunOptions,
    ) -> Result<RunResult, EngineError> {
        let gpu = &self.gpu;
        gpu.check()?;
        let p = &self.program;
        let wanted = self.checked_inputs(session, inputs, options)?;
        let mut stats = RunStats {
            kernels: p.kernels.len(),
            ..Default::default()
        };
        let d = &gpu.device;
        let mut enc = d.create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("kiln run"),
        });
        self.upload(ctx, &mut enc, &wanted, inputs, &mut stats)?;
        let (timing, queries) = self.prepare(ctx, options)?;
        let ctx = &*ctx;
        let staging = ctx.staging.as_ref();
        let timer = if queries > 0 {
            ctx.timer.as_ref()
        } else {
            None
        };
        if let Some(w) = p.status_word {
            enc.clear_buffer(&ctx.arena, (w * 4) as u64, Some(4));
        }
        self.encode(&mut enc, ctx, timing, timer);
        if let Some(t) = timer {
            enc.resolve_query_set(&t.queries, 0..t.count, &t.resolve, 0);
            enc.copy_buffer_to_buffer(&t.resolve, 0, &t.read, 0, t.count as u64 * 8);
        }

        // Results: what the caller asked for, and bases of host views.
        let fetch = |k: usize| -> Fetch {
            if k < p.n_outputs {
                options.outputs[k]
            } else {
                options.mutated[k - p.n_outputs]
            }
        };
        let to_read = self.values_to_read(&fetch);
        let mut device_out = self.copy_device_results(&mut enc, ctx, session, &fetch)?;
        let read_end = self.copy_to_staging(&mut enc, ctx, &to_read, &mut stats)?;
        // Encoding errors surface when the command buffer is finished.
        gpu.scoped("a run was rejected", || {
            gpu.queue.submit([enc.finish()]);
            Ok(())
        })
        .await?;

        // Map what was read back (and the timestamps), wait once.
        let map = |buf: &wgpu::Buffer, end: u64| {
            let (tx, rx) = futures::channel::oneshot::channel();
            buf.slice(..end).map_async(wgpu::MapMode::Read, move |r| {
                let _ = tx.send(r);
            });
            rx
        };
        let staging_rx = staging.filter(|_| read_end > 0).map(|b| map(b, read_end));
        let timer_rx = timer.map(|t| map(&t.read, t.count as u64 * 8));
        // Results kept on the device need no wait: later work on the
        // queue runs after this run.
        if staging_rx.is_some() || timer_rx.is_some() {
            gpu.wait()?;
        }
        for rx in [staging_rx, timer_rx].into_iter().flatten() {
            rx.await
                .map_err(|_| EngineError::Device("a readback was dropped".into()))?
                .map_err(|e| EngineError::Device(e.to_string()))?;
        }
        if let Some(t) = timer {
            read_timestamps(gpu, t, timing, &mut stats)?;
        }
        let read = self.read_back(staging.filter(|_| read_end > 0), read_end, &to_read)?;
        let mut results = vec![];
        for (k, &v) in p.outputs.iter().enumerate() {
            let out = match (fetch(k), p.host_views.get(&v)) {
                (Fetch::Skip, _) => Output::Skipped,
                (Fetch::Device, None) => {
                    Output::Device(device_out.remove(&k).ok_or_else(|| {
                        EngineError::Internal("a device result went missing".into())
                    })?)
                }
                (Fetch::Host, None) => Output::Host(read[&v].clone()),
                (f, Some(h)) => {
                    let t = read[&h.base].gather(&h.sizes, &h.strides, h.offset);
                    if f == Fetch::Device {
                        let dt = super::buffers::upload_in(gpu, session, &t).await?;
                        stats.uploaded_bytes += t.bytes().len() as u64;
                        Output::Device(dt)
                    } else {
                        Output::Host(t)
                    }
                }
            };
            results.push(out);
        }
        let mutated_out = results.split_off(p.n_outputs);
        Ok(RunResult {
            outputs: results,
            mutated: p.mutated_inputs.iter().copied().zip(mutated_out).collect(),
            stats,
        })
    }

    /// Values a run reads back: outputs fetched to the host, and the
    /// buffers of host views fetched anywhere.
    fn values_to_read(&self, fetch: &dyn Fn(usize) -> Fetch) -> Vec<Val> {
        let p = &self.program;
        let mut to_read: Vec<Val> = vec![];
        for (k, &v) in p.outputs.iter().enumerate() {
            let f = fetch(k);
            let base = p.host_views.get(&v).map(|h| h.base);
            if f == Fetch::Skip || (f == Fetch::Device && base.is_none()) {
                continue;
            }
            let r = base.unwrap_or(v);
            if !to_read.contains(&r) {
                to_read.push(r);
            }
        }
        to_read
    }

    /// Outputs kept on the device, each copied into a buffer of its own
    /// (by output position).
    fn copy_device_results(
        &self,
        enc: &mut wgpu::CommandEncoder,
        ctx: &RunContext,
        session: u64,
        fetch: &dyn Fn(usize) -> Fetch,
    ) -> Result<HashMap<usize, DeviceTensor>, EngineError> {
        let p = &self.program;
        let mut device_out: HashMap<usize, DeviceTensor> = HashMap::new();
        for (k, &v) in p.outputs.iter().enumerate() {
            if fetch(k) != Fetch::Device || p.host_views.contains_key(&v) {
                continue;
            }
            let loc = p.locs[&v];
            let bytes = value_bytes(p, v)?;
            let buf = self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("kiln result"),
                size: bytes.max(4),
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_DST
                    | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            });
            if bytes > 0 {
                let src = self.buffer(loc.buf, &ctx.params, &ctx.arena);
                enc.copy_buffer_to_buffer(src, (loc.word * 4) as u64, &buf, 0, bytes);
            }
            let m = p.value(v);
            device_out.insert(
                k,
                DeviceTensor::new(
                    self.gpu.clone(),
                    session,
                    Arc::new(buf),
                    m.dtype,
                    m.sizes.to_vec(),
                    loc.packed,
                ),
            );
        }
        Ok(device_out)
    }

    /// Copies `to_read` (and the status word) into the staging buffer;
    /// returns the bytes of it to map.
    fn copy_to_staging(
        &self,
        enc: &mut wgpu::CommandEncoder,
        ctx: &RunContext,
        to_read: &[Val],
        stats: &mut RunStats,
    ) -> Result<u64, EngineError> {
        let p = &self.program;
        let staging = ctx.staging.as_ref();
        let mut read_end = 0u64;
        for &v in to_read {
            let loc = p.locs[&v];
            let at = self.staging_at[&v];
            let bytes = value_bytes(p, v)?;
            if bytes > 0 {
                let src = self.buffer(loc.buf, &ctx.params, &ctx.arena);
                let staging = staging.ok_or_else(|| {
                    EngineError::Internal("a readback without a staging buffer".into())
                })?;
                enc.copy_buffer_to_buffer(src, (loc.word * 4) as u64, staging, at, bytes);
                stats.readback_bytes += bytes;
            }
            read_end = read_end.max(at + bytes);
        }
        if let (Some(w), Some(at), Some(staging)) = (p.status_word, self.status_at, staging) {
            enc.copy_buffer_to_buffer(&ctx.arena, (w * 4) as u64, staging, at, 4);
            read_end = read_end.max(at + 4);
        }
        Ok(read_end)
    }

    fn encode(
        &self,
        enc: &mut wgpu::CommandEncoder,
        ctx: &RunContext,
        timing: Timing,
        timer: Option<&Timer>,
    ) {
        let p = &self.program;
        let dispatch = |pass: &mut wgpu::ComputePass, i: usize| {
            let grid = p.kernels[i].code.grid;
            pass.set_pipeline(&self.pipelines[i]);
            pass.set_bind_group(0, &ctx.bind_groups[i], &[]);
            pass.dispatch_workgroups(grid[0], grid[1], grid[2]);
        };
        let writes = |i: u32| {
            timer.map(|t| wgpu::ComputePassTimestampWrites {
                query_set: &t.queries,
                beginning_of_pass_write_index: Some(2 * i),
                end_of_pass_write_index: Some(2 * i + 1),
            })
        };
        if timing == Timing::PerKernel && timer.is_some() {
            for i in 0..p.kernels.len() {
                let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some(&p.kernels[i].code.label),
                    timestamp_writes: writes(i as u32),
                });
                dispatch(&mut pass, i);
            }
            return;
        }
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("kiln"),
            timestamp_writes: writes(0),
        });
        for i in 0..p.kernels.len() {
            dispatch(&mut pass, i);
        }
    }

    /// Runs the kernels alone on whatever a context's buffers hold (inputs
    /// a run consumed are not restored) and waits: device time by wall
    /// clock, for adapters without timestamp queries.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn dispatch_and_wait(&self) -> Result<(), EngineError> {
        let ctx = pollster::block_on(self.take_context())?;
        let mut enc = self
            .gpu
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("kiln kernels"),
            });
        self.encode(&mut enc, &ctx, Timing::Off, None);
        self.gpu.queue.submit([enc.finish()]);
        let r = self.gpu.wait();
        self.give_back(ctx);
        r
    }

    /// The bindings of kernel `i` (for tests and reports).
    pub fn bindings(&self, i: usize) -> &[Binding] {
        &self.program.kernels[i].code.bindings
    }
}

impl Timer {
    fn new(d: &wgpu::Device, count: u32) -> Timer {
        Timer {
            queries: d.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("kiln timestamps"),
                ty: wgpu::QueryType::Timestamp,
                count,
            }),
            resolve: d.create_buffer(&wgpu::BufferDescriptor {
                label: Some("kiln timestamps"),
                size: count as u64 * 8,
                usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            }),
            read: d.create_buffer(&wgpu::BufferDescriptor {
                label: Some("kiln timestamps read"),
                size: count as u64 * 8,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
            count,
        }
    }
}

/// The error of a run whose status word says `status` (`Gen::flag`: the
/// statement's 1-based position times 2, plus the fault).
fn fault(p: &Program, status: usize) -> EngineError {
    let what = p
        .statements
        .get((status / 2).saturating_sub(1))
        .map(|st| format!("statement `{st}` of the functionalized program"))
        .unwrap_or_else(|| "a statement".into());
    if status % 2 == kernel::Fault::IndexRange as usize {
        return EngineError::Range(format!(
            "{what}: an index is out of bounds for its dimension (as eager reports it)"
        ));
    }
    EngineError::Range(format!(
        "{what}: an i64 result left the range {} to {} in which this device computes i64 \
         (WGSL has no 64-bit integers); run the program with the reference backend",
        i32::MIN,
        i32::MAX
    ))
}

/// The mapped timestamps of a run as milliseconds: the total, and each
/// kernel's with `Timing::PerKernel`.
fn read_timestamps(
    gpu: &Gpu,
    t: &Timer,
    timing: Timing,
    stats: &mut RunStats,
) -> Result<(), EngineError> {
    let ticks: Vec<u64> = {
        let view = t
            .read
            .slice(..t.count as u64 * 8)
            .get_mapped_range()
            .map_err(|e| EngineError::Device(e.to_string()))?;
        bytemuck::pod_collect_to_vec(&view)
    };
    t.read.unmap();
    let period = gpu.queue.get_timestamp_period() as f64 * 1e-6;
    let ms: Vec<f64> = ticks
        .chunks(2)
        .map(|c| c[1].saturating_sub(c[0]) as f64 * period)
        .collect();
    stats.gpu_ms = Some(ms.iter().sum());
    if timing == Timing::PerKernel {
        stats.kernel_ms = ms;
    }
    Ok(())
}

/// What wgpu adds to each generated shader on its way to the driver:
/// indices clamped (workgroup and local arrays; storage buffers the
/// driver's robust access guards either way), a counter bounding every
/// loop, workgroup memory zeroed as each workgroup starts. Kiln's
/// generator clamps every load itself, bounds every loop by a constant or
/// the grid, and writes workgroup memory before reading it, so it keeps
/// only the zeroing: on an H200, MiniLM 32 x 128's kernels take 4.33 ms
/// without the first two, 4.75 with them (llama_block 0.38 vs 0.48).
/// `KILN_SHADER_CHECKS` (`all`, `none`, or a comma list of `bounds`,
/// `loops`, `zero`) says which to keep, to chase a suspected generator
/// bug or time what they cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ShaderChecks {
    bounds: bool,
    loops: bool,
    zero_workgroup_memory: bool,
}

impl ShaderChecks {
    fn from_env() -> Self {
        let keep = std::env::var("KILN_SHADER_CHECKS").unwrap_or_else(|_| "zero".into());
        let keep: Vec<&str> = match keep.trim() {
            "all" => vec!["bounds", "loops", "zero"],
            "none" => vec![],
            k => k.split(',').map(str::trim).collect(),
        };
        for k in &keep {
            if !["bounds", "loops", "zero"].contains(k) {
                log::warn!("KILN_SHADER_CHECKS: no check `{k}` (bounds, loops, zero; all; none)");
            }
        }
        ShaderChecks {
            bounds: keep.contains(&"bounds"),
            loops: keep.contains(&"loops"),
            zero_workgroup_memory: keep.contains(&"zero"),
        }
    }

    fn all(&self) -> bool {
        self.bounds && self.loops
    }

    fn runtime(&self) -> wgpu::ShaderRuntimeChecks {
        wgpu::ShaderRuntimeChecks {
            bounds_checks: self.bounds,
            force_loop_bounding: self.loops,
            ..wgpu::ShaderRuntimeChecks::checked()
        }
    }
}
