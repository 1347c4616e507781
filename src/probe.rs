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

/// The probe's buffers: a source holding `pattern`, a destination, and
/// a staging buffer to read the destination back.
struct Buffers {
    src: wgpu::Buffer,
    dst: wgpu::Buffer,
    staging: wgpu::Buffer,
    pattern: Vec<u8>,
    bytes: u64,
}

impl Buffers {
    fn new(gpu: &Gpu, bytes: u64) -> Buffers {
        let d = &gpu.device;
        let pattern: Vec<u8> = (0..(bytes / 4) as u32)
            .flat_map(|i| i.to_le_bytes())
            .collect();
        let buffer = |label, usage| {
            d.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: bytes,
                usage,
                mapped_at_creation: false,
            })
        };
        let usage = wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_SRC
            | wgpu::BufferUsages::COPY_DST;
        let (src, dst) = (buffer("probe src", usage), buffer("probe dst", usage));
        let read = wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST;
        let staging = buffer("probe readback", read);
        gpu.queue.write_buffer(&src, 0, &pattern);
        Buffers {
            src,
            dst,
            staging,
            pattern,
            bytes,
        }
    }
}

/// Timestamp queries around each timed pass (pass `i` writes queries
/// `2 i` and `2 i + 1`; pass 0 is the warm-up), where the device has them.
struct Timer {
    query_set: Option<wgpu::QuerySet>,
    queries: u32,
    resolve: wgpu::Buffer,
    read: wgpu::Buffer,
}

impl Timer {
    fn new(gpu: &Gpu, runs: usize) -> Timer {
        let d = &gpu.device;
        let queries = 2 * (runs as u32 + 1);
        let query_set = gpu.has_timestamps().then(|| {
            d.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("probe timestamps"),
                ty: wgpu::QueryType::Timestamp,
                count: queries,
            })
        });
        let buffer = |label, usage| {
            d.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: queries as u64 * 8,
                usage,
                mapped_at_creation: false,
            })
        };
        Timer {
            query_set,
            queries,
            resolve: buffer(
                "probe timestamps",
                wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            ),
            read: buffer(
                "probe timestamps read",
                wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            ),
        }
    }

    fn writes(&self, i: u32) -> Option<wgpu::ComputePassTimestampWrites<'_>> {
        self.query_set
            .as_ref()
            .map(|q| wgpu::ComputePassTimestampWrites {
                query_set: q,
                beginning_of_pass_write_index: Some(2 * i),
                end_of_pass_write_index: Some(2 * i + 1),
            })
    }

    /// The timed passes' milliseconds, after `enc` (holding them) ran.
    fn resolve(&self, gpu: &Gpu, mut enc: wgpu::CommandEncoder) -> Result<Vec<f64>, EngineError> {
        let q = self.query_set.as_ref().expect("timestamps");
        let bytes = self.queries as u64 * 8;
        enc.resolve_query_set(q, 0..self.queries, &self.resolve, 0);
        enc.copy_buffer_to_buffer(&self.resolve, 0, &self.read, 0, bytes);
        submit_wait(gpu, enc)?;
        let ticks: Vec<u64> = read(gpu, &self.read, bytes)?
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect();
        let period = gpu.queue.get_timestamp_period() as f64 * 1e-6;
        Ok(ticks[2..]
            .chunks(2)
            .map(|c| c[1].saturating_sub(c[0]) as f64 * period)
            .collect())
    }
}

fn submit_wait(gpu: &Gpu, enc: wgpu::CommandEncoder) -> Result<(), EngineError> {
    gpu.queue.submit([enc.finish()]);
    gpu.device
        .poll(wgpu::PollType::wait_indefinitely())
        .map_err(device_err)?;
    gpu.check()
}

/// Copies `mib` MiB (fewer where the device binds less) with each shape,
/// `runs` times after a warm-up.
pub fn copy_probe(gpu: &Gpu, mib: u64, runs: usize) -> Result<Probe, EngineError> {
    let runs = runs.max(1);
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
    let module = gpu
        .device
        .create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("copy probe"),
            source: wgpu::ShaderSource::Wgsl(SHADER.into()),
        });
    let bufs = Buffers::new(gpu, bytes);
    let timer = Timer::new(gpu, runs);
    let rows = SHAPES
        .iter()
        .map(|shape| probe_shape(gpu, &module, &bufs, &timer, *shape, runs))
        .collect::<Result<_, _>>()?;
    Ok(Probe {
        adapter: gpu.describe(),
        timing: if timer.query_set.is_some() {
            "timestamp"
        } else {
            "wall"
        },
        bytes,
        runs,
        rows,
    })
}

/// One kernel shape: a warm-up pass checked to copy exactly, then `runs`
/// timed passes.
fn probe_shape(
    gpu: &Gpu,
    module: &wgpu::ShaderModule,
    bufs: &Buffers,
    timer: &Timer,
    (label, entry, grid, per): (&str, &str, Option<u32>, u64),
    runs: usize,
) -> Result<ProbeRow, EngineError> {
    let d = &gpu.device;
    let pipeline = d.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some(label),
        layout: None,
        module,
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
                resource: bufs.src.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: base + 1,
                resource: bufs.dst.as_entire_binding(),
            },
        ],
    });
    let max_x = gpu.limits.max_compute_workgroups_per_dimension;
    let items = bufs.bytes / 4 / per;
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
            timestamp_writes: timer.writes(i),
        });
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &bind, &[]);
        pass.dispatch_workgroups(dims[0], dims[1], 1);
    };
    // Warm-up (pipeline compilation) and the exactness check.
    let mut enc = d.create_command_encoder(&Default::default());
    enc.clear_buffer(&bufs.dst, 0, None);
    encode_pass(&mut enc, 0);
    enc.copy_buffer_to_buffer(&bufs.dst, 0, &bufs.staging, 0, bufs.bytes);
    submit_wait(gpu, enc)?;
    if read(gpu, &bufs.staging, bufs.bytes)? != bufs.pattern {
        return Err(EngineError::Internal(format!(
            "the copy probe's `{label}` kernel did not copy its input exactly"
        )));
    }
    let ms = if timer.query_set.is_some() {
        let mut enc = d.create_command_encoder(&Default::default());
        for i in 1..=runs as u32 {
            encode_pass(&mut enc, i);
        }
        timer.resolve(gpu, enc)?
    } else {
        let mut v = vec![];
        for i in 1..=runs as u32 {
            let mut enc = d.create_command_encoder(&Default::default());
            encode_pass(&mut enc, i);
            let t = Instant::now();
            submit_wait(gpu, enc)?;
            v.push(t.elapsed().as_secs_f64() * 1e3);
        }
        v
    };
    let ms = median(ms);
    let gb_per_s = if ms > 0.0 {
        2.0 * bufs.bytes as f64 / 1e9 / (ms * 1e-3)
    } else {
        0.0
    };
    Ok(ProbeRow {
        kernel: label.to_string(),
        ms,
        gb_per_s,
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
