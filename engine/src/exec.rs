//! Running compiled programs through wgpu: adapter selection, pipelines
//! and bind groups made once per program, one submit per run, readback.

use crate::{compile_with, CompileOptions, EngineError, Program};
use kiln_functionalize::ValueId;
use kiln_functionalize::{DType, Graph, RTensor};
use std::collections::HashMap;
use std::sync::Arc;

/// A GPU device.
pub struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    pub limits: wgpu::Limits,
}

const INSTALL_HINT: &str =
    "install a Vulkan, Metal or DX12 driver; on Debian or Ubuntu without a GPU, \
     `apt-get install mesa-vulkan-drivers libvulkan1` gives the software adapter lavapipe";

impl Gpu {
    /// The high-performance adapter, or the first whose name contains
    /// `KILN_ADAPTER`; `WGPU_BACKEND` picks backends.
    pub fn new() -> Result<Gpu, EngineError> {
        pollster::block_on(Gpu::new_async())
    }

    pub async fn new_async() -> Result<Gpu, EngineError> {
        let instance =
            wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        let adapter = match std::env::var("KILN_ADAPTER") {
            Ok(want) => {
                let all = instance.enumerate_adapters(wgpu::Backends::all()).await;
                let names: Vec<String> = all.iter().map(|a| a.get_info().name).collect();
                all.into_iter()
                    .find(|a| {
                        a.get_info()
                            .name
                            .to_lowercase()
                            .contains(&want.to_lowercase())
                    })
                    .ok_or_else(|| {
                        EngineError::NoAdapter(format!(
                            "KILN_ADAPTER={want:?} matches none of the adapters {names:?}"
                        ))
                    })?
            }
            Err(_) => instance
                .request_adapter(&wgpu::RequestAdapterOptions {
                    power_preference: wgpu::PowerPreference::HighPerformance,
                    force_fallback_adapter: false,
                    compatible_surface: None,
                    apply_limit_buckets: false,
                })
                .await
                .map_err(|e| EngineError::NoAdapter(format!("{e}; {INSTALL_HINT}")))?,
        };
        let info = adapter.get_info();
        let limits = adapter.limits();
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("kiln"),
                required_limits: limits.clone(),
                ..Default::default()
            })
            .await
            .map_err(|e| EngineError::Device(e.to_string()))?;
        Ok(Gpu {
            device,
            queue,
            info,
            limits,
        })
    }

    /// Compilation choices for this device.
    pub fn compile_options(&self) -> CompileOptions {
        CompileOptions {
            tiled_matmul: self.info.device_type != wgpu::DeviceType::Cpu,
        }
    }

    /// "name (backend, device type)".
    pub fn describe(&self) -> String {
        format!(
            "{} ({:?}, {:?})",
            self.info.name, self.info.backend, self.info.device_type
        )
    }

    /// Creates the buffers, pipelines and bind group of `program`.
    pub fn load(&self, program: Program) -> Result<Loaded, EngineError> {
        let max_binding = self.limits.max_storage_buffer_binding_size as usize;
        for (what, words) in [
            ("parameters", program.io_words),
            ("intermediates", program.arena_words),
        ] {
            if words * 4 > max_binding {
                return Err(EngineError::Unsupported(format!(
                    "{what} need {} bytes in one binding; this device allows {max_binding}",
                    words * 4
                )));
            }
        }
        let d = &self.device;
        let storage = |label, words: usize| {
            d.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: (words.max(1) * 4) as u64,
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_DST
                    | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            })
        };
        let io = storage("kiln io", program.io_words);
        let arena = storage("kiln arena", program.arena_words);
        let entry = |binding| wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Storage { read_only: false },
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        };
        let bgl = d.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("kiln pools"),
            entries: &[entry(0), entry(1)],
        });
        let bind_group = d.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("kiln pools"),
            layout: &bgl,
            entries: &[
                wgpu::BindGroupEntry {
                    binding: 0,
                    resource: io.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 1,
                    resource: arena.as_entire_binding(),
                },
            ],
        });
        let layout = d.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some("kiln"),
            bind_group_layouts: &[Some(&bgl)],
            immediate_size: 0,
        });
        let scope = d.push_error_scope(wgpu::ErrorFilter::Validation);
        let mut pipelines = vec![];
        for k in &program.kernels {
            let module = d.create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(&k.code.label),
                source: wgpu::ShaderSource::Wgsl(k.code.wgsl.as_str().into()),
            });
            let p = d.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(&k.code.label),
                layout: Some(&layout),
                module: &module,
                entry_point: Some("main"),
                compilation_options: Default::default(),
                cache: None,
            });
            pipelines.push((p, k.code.grid));
        }
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(EngineError::Internal(format!(
                "a generated kernel was rejected: {e}"
            )));
        }
        // Outputs, packed one after another, for readback.
        let mut out_ranges = vec![];
        let mut total = 0u64;
        for &v in &program.readback {
            let loc = program
                .locs
                .get(&v)
                .copied()
                .ok_or_else(|| EngineError::Internal("an output without a buffer".into()))?;
            let m = program.graph.meta(v);
            let bytes = (crate::wgsl::words(m.dtype, m.numel(), loc.packed) * 4) as u64;
            out_ranges.push((loc, total, bytes));
            total += bytes;
        }
        let staging = d.create_buffer(&wgpu::BufferDescriptor {
            label: Some("kiln readback"),
            size: total.max(4),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        Ok(Loaded {
            program: Arc::new(program),
            pipelines,
            bind_group,
            io,
            arena,
            staging,
            out_ranges,
        })
    }
}

/// A program on a device, ready to run.
pub struct Loaded {
    pub program: Arc<Program>,
    pipelines: Vec<(wgpu::ComputePipeline, [u32; 3])>,
    bind_group: wgpu::BindGroup,
    io: wgpu::Buffer,
    arena: wgpu::Buffer,
    staging: wgpu::Buffer,
    out_ranges: Vec<(crate::codegen::Loc, u64, u64)>,
}

/// Encodes elements as the GPU's 32-bit words: one per element, or packed
/// little-endian (bools a byte each, f16 values half a word each).
fn to_words(t: &RTensor, packed: bool) -> Vec<u32> {
    let d = t.dtype();
    let bits: Vec<u32> = t
        .values()
        .into_iter()
        .map(|v| match (d, packed) {
            (DType::F16, true) => half::f16::from_f64(v).to_bits() as u32,
            (DType::F32 | DType::F16, _) => (v as f32).to_bits(),
            (DType::I32, _) => (v as i32) as u32,
            (DType::U32, _) => v as u32,
            (DType::Bool, _) => (v != 0.0) as u32,
        })
        .collect();
    let per = if packed { crate::wgsl::per_word(d) } else { 1 };
    let width = 32 / per;
    bits.chunks(per)
        .map(|c| {
            c.iter()
                .enumerate()
                .fold(0u32, |w, (i, &b)| w | (b << (i * width)))
        })
        .collect()
}

fn from_words(dtype: DType, sizes: Vec<usize>, words: &[u32], packed: bool) -> RTensor {
    let per = if packed {
        crate::wgsl::per_word(dtype)
    } else {
        1
    };
    let width = 32 / per;
    let mask = if per == 1 {
        u32::MAX
    } else {
        (1u32 << width) - 1
    };
    let n: usize = sizes.iter().product();
    let vals: Vec<f64> = (0..n)
        .map(|i| {
            let w = (words[i / per] >> ((i % per) * width)) & mask;
            match (dtype, packed) {
                (DType::F16, true) => half::f16::from_bits(w as u16).to_f64(),
                (DType::F32 | DType::F16, _) => f32::from_bits(w) as f64,
                (DType::I32, _) => w as i32 as f64,
                (DType::U32, _) => w as f64,
                (DType::Bool, _) => (w != 0) as u8 as f64,
            }
        })
        .collect();
    RTensor::new(dtype, sizes, &vals)
}

impl Loaded {
    /// Runs on `inputs` (one per parameter) and returns the outputs, then
    /// the final values of mutated parameters.
    pub fn run(&self, gpu: &Gpu, inputs: &[RTensor]) -> Result<Vec<RTensor>, EngineError> {
        pollster::block_on(self.run_async(gpu, inputs))
    }

    /// Encodes every kernel into one command buffer, submits once, and
    /// reads the outputs back.
    pub async fn run_async(
        &self,
        gpu: &Gpu,
        inputs: &[RTensor],
    ) -> Result<Vec<RTensor>, EngineError> {
        let p = &self.program;
        let g = &p.graph;
        if inputs.len() != g.inputs.len() {
            return Err(EngineError::Input {
                index: inputs.len(),
                msg: format!("the program takes {} inputs", g.inputs.len()),
            });
        }
        let mut words = vec![0u32; p.io_words.max(1)];
        for (i, (&v, t)) in g.inputs.iter().zip(inputs).enumerate() {
            let m = g.meta(v);
            if t.dtype() != m.dtype || t.sizes() != m.sizes.as_slice() {
                return Err(EngineError::Input {
                    index: i,
                    msg: format!("expected {}, got {}", m.type_string(), t.meta.type_string()),
                });
            }
            let loc = p.locs[&v];
            let w = to_words(t, loc.packed);
            words[loc.word..loc.word + w.len()].copy_from_slice(&w);
        }
        gpu.queue
            .write_buffer(&self.io, 0, bytemuck::cast_slice(&words));
        self.submit(gpu);
        self.read_back(gpu).await
    }

    /// Encodes every kernel and the output copies into one command buffer
    /// and submits it (the host-side cost of a run).
    pub fn submit(&self, gpu: &Gpu) -> wgpu::SubmissionIndex {
        self.submit_with(gpu, true)
    }

    /// Runs the kernels alone (no output copies) on whatever the buffers
    /// hold after the last run (inputs a run consumed are not restored) and
    /// waits for them: the device time of a run, for benchmarks.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn dispatch_and_wait(&self, gpu: &Gpu) -> Result<(), EngineError> {
        let i = self.submit_with(gpu, false);
        gpu.device
            .poll(wgpu::PollType::Wait {
                submission_index: Some(i),
                timeout: None,
            })
            .map(|_| ())
            .map_err(|e| EngineError::Device(e.to_string()))
    }

    fn submit_with(&self, gpu: &Gpu, copy_outputs: bool) -> wgpu::SubmissionIndex {
        let mut enc = gpu
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("kiln run"),
            });
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("kiln"),
                timestamp_writes: None,
            });
            pass.set_bind_group(0, &self.bind_group, &[]);
            for (pipeline, grid) in &self.pipelines {
                pass.set_pipeline(pipeline);
                pass.dispatch_workgroups(grid[0], grid[1], grid[2]);
            }
        }
        for (loc, at, bytes) in self.out_ranges.iter().filter(|_| copy_outputs) {
            let src = match loc.pool {
                crate::wgsl::Pool::Io => &self.io,
                crate::wgsl::Pool::Arena => &self.arena,
            };
            if *bytes > 0 {
                enc.copy_buffer_to_buffer(src, (loc.word * 4) as u64, &self.staging, *at, *bytes);
            }
        }
        gpu.queue.submit([enc.finish()])
    }

    /// Waits for the last submission and decodes the outputs.
    pub async fn read_back(&self, gpu: &Gpu) -> Result<Vec<RTensor>, EngineError> {
        let p = &self.program;
        let g = &p.graph;
        let (tx, rx) = futures::channel::oneshot::channel();
        self.staging
            .slice(..)
            .map_async(wgpu::MapMode::Read, move |r| {
                let _ = tx.send(r);
            });
        #[cfg(not(target_arch = "wasm32"))]
        gpu.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| EngineError::Device(e.to_string()))?;
        rx.await
            .map_err(|_| EngineError::Device("the readback was dropped".into()))?
            .map_err(|e| EngineError::Device(e.to_string()))?;
        let mut out = vec![];
        {
            let view = self
                .staging
                .slice(..)
                .get_mapped_range()
                .map_err(|e| EngineError::Device(e.to_string()))?;
            let all: &[u32] = bytemuck::cast_slice(&view);
            for (&v, (loc, at, bytes)) in p.readback.iter().zip(&self.out_ranges) {
                let m = g.meta(v);
                let s = (*at / 4) as usize;
                let words = &all[s..s + (*bytes / 4) as usize];
                out.push((v, from_words(m.dtype, m.sizes.clone(), words, loc.packed)));
            }
        }
        self.staging.unmap();
        let read: HashMap<ValueId, RTensor> = out.into_iter().collect();
        p.outputs
            .iter()
            .map(|&v| match p.host_views.get(&v) {
                None => Ok(read[&v].clone()),
                Some(base) => {
                    // The view, taken by the reference kernels on the host.
                    let n = g.node_of(v).ok_or_else(|| {
                        EngineError::Internal("a host view without a node".into())
                    })?;
                    let node = &g.nodes[n];
                    let args: Vec<kiln_functionalize::schema::Arg<RTensor>> = node
                        .args
                        .iter()
                        .map(|a| {
                            a.map(&mut |x: &ValueId| {
                                if x == base {
                                    read[base].clone()
                                } else {
                                    read[x].clone()
                                }
                            })
                        })
                        .collect();
                    let outs: Vec<kiln_functionalize::Meta> =
                        node.results.iter().map(|&r| g.meta(r).clone()).collect();
                    let k = node.results.iter().position(|&r| r == v).unwrap_or(0);
                    kiln_functionalize::interp::eval(node.op, &args, &outs)
                        .map(|mut r| r.swap_remove(k))
                        .map_err(EngineError::Internal)
                }
            })
            .collect()
    }
}

/// A device plus the programs compiled for it, by program text (so each
/// input-shape signature compiles once).
pub struct Engine {
    pub gpu: Gpu,
    cache: HashMap<String, Loaded>,
}

/// What a run gives: outputs, and every parameter's final value.
pub struct EngineRun {
    pub outputs: Vec<RTensor>,
    pub inputs: Vec<RTensor>,
}

impl Engine {
    pub fn new() -> Result<Engine, EngineError> {
        Ok(Engine {
            gpu: Gpu::new()?,
            cache: HashMap::new(),
        })
    }

    /// Compiles (once) and runs `g` on `inputs`.
    pub fn run(&mut self, g: &Graph, inputs: Vec<RTensor>) -> Result<EngineRun, EngineError> {
        let key = kiln_functionalize::print(g);
        if !self.cache.contains_key(&key) {
            let loaded = self
                .gpu
                .load(compile_with(g, self.gpu.compile_options())?)?;
            self.cache.insert(key.clone(), loaded);
        }
        let loaded = &self.cache[&key];
        let mut res = loaded.run(&self.gpu, &inputs)?;
        let extra = res.split_off(loaded.program.n_outputs);
        let mut finals = inputs;
        for (&i, t) in loaded.program.mutated_inputs.iter().zip(extra) {
            finals[i] = t;
        }
        Ok(EngineRun {
            outputs: res,
            inputs: finals,
        })
    }
}
