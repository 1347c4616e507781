//! `kiln bandwidth`: what a plain WGSL copy reaches on the device at hand,
//! the ceiling Kiln's memory-bound kernels are measured against. The
//! kernels (`shaders/copy_probe.wgsl`) are the shapes Kiln's elementwise
//! codegen chooses between: vec4 with a grid-stride loop over a few
//! workgroup counts, one vec4 per invocation, one 32-bit word per
//! invocation. Each is checked (the copy must be exact) and timed with
//! timestamp queries (wall time around submit and wait without them).

use crate::profile::median;
use kiln_engine::wgpu;
use kiln_engine::{EngineError, Gpu};
use std::sync::{Arc, Mutex};
use std::time::Instant;

const SHADER: &str = include_str!("../shaders/copy_probe.wgsl");

/// One kernel shape's figures.
#[derive(Clone, Debug)]
pub struct ProbeRow {
    pub kernel: String,
    /// Median GPU time of one copy.
    pub ms: f64,
    /// Bytes read + written over `ms`.
    pub gb_per_s: f64,
}

#[derive(Clone, Debug)]
pub struct Probe {
    pub adapter: String,
    pub timing: &'static str,
    /// Bytes copied (each read once and written once).
    pub bytes: u64,
    pub runs: usize,
    pub rows: Vec<ProbeRow>,
}

impl Probe {
    /// The fastest shape's GB/s: the ceiling for memory-bound kernels.
    pub fn best_gb_per_s(&self) -> f64 {
        self.rows.iter().map(|r| r.gb_per_s).fold(0.0, f64::max)
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "adapter": self.adapter,
            "timing": self.timing,
            "bytes": self.bytes,
            "runs": self.runs,
            "best_gb_per_s": self.best_gb_per_s(),
            "kernels": self.rows.iter().map(|r| serde_json::json!({
                "kernel": r.kernel, "ms": r.ms, "gb_per_s": r.gb_per_s,
            })).collect::<Vec<_>>(),
        })
    }

    pub fn table(&self) -> String {
        use std::fmt::Write;
        let mut s = format!(
            "adapter: {}; copy of {} MiB (read + written: {} MiB), median of {} runs, GPU times from {}\n",
            self.adapter,
            self.bytes >> 20,
            self.bytes >> 19,
            self.runs,
            self.timing
        );
        for r in &self.rows {
            let _ = writeln!(
                s,
                "{:<28} {:>9.4} ms {:>9.1} GB/s",
                r.kernel, r.ms, r.gb_per_s
            );
        }
        let _ = writeln!(s, "best: {:.1} GB/s", self.best_gb_per_s());
        s
    }
}

/// The shapes measured: (label, entry point, workgroups of a grid-stride
/// loop or `None` for one element per invocation, elements per invocation).
const SHAPES: [(&str, &str, Option<u32>, u64); 6] = [
    ("vec4 grid-stride 1024 wg", "copy_vec4_grid", Some(1024), 4),
    ("vec4 grid-stride 2048 wg", "copy_vec4_grid", Some(2048), 4),
    ("vec4 grid-stride 4096 wg", "copy_vec4_grid", Some(4096), 4),
    ("vec4 grid-stride 8192 wg", "copy_vec4_grid", Some(8192), 4),
    ("vec4 per invocation", "copy_vec4", None, 4),
    ("u32 per invocation", "copy_u32", None, 1),
];

fn device_err(e: impl std::fmt::Display) -> EngineError {
    EngineError::Device(e.to_string())
}

/// Copies `mib` MiB (fewer where the device binds less) with each shape,
/// `runs` times after a warm-up.
pub fn copy_probe(gpu: &Gpu, mib: u64, runs: usize) -> Result<Probe, EngineError> {
    let runs = runs.max(1);
    let d = &gpu.device;
    let limit = gpu
        .limits
        .max_storage_buffer_binding_size
        .min(gpu.limits.max_buffer_size);
    // A whole number of workgroups' vec4s, within the binding limit.
    let bytes = (mib << 20).min(limit) / (256 * 16) * (256 * 16);
    if bytes == 0 {
        return Err(EngineError::Unsupported(format!(
            "the probe needs at least 4 KiB per buffer; this device binds at most {limit} bytes"
        )));
    }
    let words = bytes / 4;
    let module = d.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some("copy probe"),
        source: wgpu::ShaderSource::Wgsl(SHADER.into()),
    });
    let pattern: Vec<u8> = (0..words as u32).flat_map(|i| i.to_le_bytes()).collect();
    let usage =
        wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
    let buffer = |label| {
        d.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: bytes,
            usage,
            mapped_at_creation: false,
        })
    };
    let (src, dst) = (buffer("probe src"), buffer("probe dst"));
    gpu.queue.write_buffer(&src, 0, &pattern);
    let staging = d.create_buffer(&wgpu::BufferDescriptor {
        label: Some("probe readback"),
        size: bytes,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let timestamps = gpu.has_timestamps();
    let queries = 2 * (runs as u32 + 1);
    let query_set = timestamps.then(|| {
        d.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("probe timestamps"),
            ty: wgpu::QueryType::Timestamp,
            count: queries,
        })
    });
    let ts_bytes = queries as u64 * 8;
    let resolve = d.create_buffer(&wgpu::BufferDescriptor {
        label: Some("probe timestamps"),
        size: ts_bytes,
        usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    let ts_read = d.create_buffer(&wgpu::BufferDescriptor {
        label: Some("probe timestamps read"),
        size: ts_bytes,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let max_x = gpu.limits.max_compute_workgroups_per_dimension;
    let mut rows = vec![];
    for (label, entry, grid, per) in SHAPES {
        let pipeline = d.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(label),
            layout: None,
            module: &module,
            entry_point: Some(entry),
            compilation_options: Default::default(),
            cache: None,
        });
        let base = if per == 4 { 0 } else { 2 };
        let bind = d.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(label),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &[
                wgpu::BindGroupEntry {
                    binding: base,
                    resource: src.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: base + 1,
                    resource: dst.as_entire_binding(),
                },
            ],
        });
        let items = words / per;
        let dims = match grid {
            Some(g) => [g.min(max_x), 1],
            None => {
                let wgs = items.div_ceil(256);
                let x = wgs.min(max_x as u64);
                [x as u32, wgs.div_ceil(x) as u32]
            }
        };
        let encode_pass = |enc: &mut wgpu::CommandEncoder, i: u32| {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some(label),
                timestamp_writes: query_set
                    .as_ref()
                    .map(|q| wgpu::ComputePassTimestampWrites {
                        query_set: q,
                        beginning_of_pass_write_index: Some(2 * i),
                        end_of_pass_write_index: Some(2 * i + 1),
                    }),
            });
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &bind, &[]);
            pass.dispatch_workgroups(dims[0], dims[1], 1);
        };
        let submit_wait = |enc: wgpu::CommandEncoder| -> Result<(), EngineError> {
            gpu.queue.submit([enc.finish()]);
            d.poll(wgpu::PollType::wait_indefinitely())
                .map_err(device_err)?;
            gpu.check()
        };
        // Warm-up (pipeline compilation) and the exactness check.
        let mut enc = d.create_command_encoder(&Default::default());
        enc.clear_buffer(&dst, 0, None);
        encode_pass(&mut enc, 0);
        enc.copy_buffer_to_buffer(&dst, 0, &staging, 0, bytes);
        submit_wait(enc)?;
        let copied = read(gpu, &staging, bytes)?;
        if copied != pattern {
            return Err(EngineError::Internal(format!(
                "the copy probe's `{label}` kernel did not copy its input exactly"
            )));
        }
        let ms = if timestamps {
            let mut enc = d.create_command_encoder(&Default::default());
            for i in 1..=runs as u32 {
                encode_pass(&mut enc, i);
            }
            let q = query_set.as_ref().expect("timestamps");
            enc.resolve_query_set(q, 0..queries, &resolve, 0);
            enc.copy_buffer_to_buffer(&resolve, 0, &ts_read, 0, ts_bytes);
            submit_wait(enc)?;
            let raw = read(gpu, &ts_read, ts_bytes)?;
            let ticks: Vec<u64> = raw
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect();
            let period = gpu.queue.get_timestamp_period() as f64 * 1e-6;
            ticks[2..]
                .chunks(2)
                .map(|c| c[1].saturating_sub(c[0]) as f64 * period)
                .collect::<Vec<_>>()
        } else {
            let mut v = vec![];
            for i in 1..=runs as u32 {
                let mut enc = d.create_command_encoder(&Default::default());
                encode_pass(&mut enc, i);
                let t = Instant::now();
                submit_wait(enc)?;
                v.push(t.elapsed().as_secs_f64() * 1e3);
            }
            v
        };
        let ms = median(ms);
        rows.push(ProbeRow {
            kernel: label.to_string(),
            ms,
            gb_per_s: if ms > 0.0 {
                2.0 * bytes as f64 / 1e9 / (ms * 1e-3)
            } else {
                0.0
            },
        });
    }
    Ok(Probe {
        adapter: gpu.describe(),
        timing: if timestamps { "timestamp" } else { "wall" },
        bytes,
        runs,
        rows,
    })
}

/// The first `bytes` of a mappable buffer.
fn read(gpu: &Gpu, buf: &wgpu::Buffer, bytes: u64) -> Result<Vec<u8>, EngineError> {
    let done: Arc<Mutex<Option<Result<(), wgpu::BufferAsyncError>>>> = Arc::default();
    let flag = done.clone();
    buf.slice(..bytes).map_async(wgpu::MapMode::Read, move |r| {
        if let Ok(mut f) = flag.lock() {
            *f = Some(r);
        }
    });
    gpu.device
        .poll(wgpu::PollType::wait_indefinitely())
        .map_err(device_err)?;
    let r = done.lock().map(|mut f| f.take()).unwrap_or(None);
    match r {
        Some(Ok(())) => {}
        Some(Err(e)) => return Err(device_err(e)),
        None => return Err(device_err("a probe readback never completed")),
    }
    let out = buf
        .slice(..bytes)
        .get_mapped_range()
        .map_err(device_err)?
        .to_vec();
    buf.unmap();
    Ok(out)
}
