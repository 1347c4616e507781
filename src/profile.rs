//! `kiln profile`: a program's run on the GPU at hand, measured. Full
//! runs (host inputs to host outputs) by wall clock; kernels by timestamp
//! queries where the adapter has them (else wall time around submit and
//! wait, and the report says so); bytes uploaded and read back per run
//! from the session's counters. The benchmark report uses the same code.

use kiln_engine::{EngineError, Executable, Fetch, HostTensor, Input, RunOptions, Session, Timing};
use kiln_functionalize::{DType, Graph};
use std::time::Instant;

/// One kernel's figures (medians over the runs).
#[derive(Clone, Debug)]
pub struct KernelProfile {
    pub name: String,
    pub ms: Option<f64>,
    pub bytes: usize,
    pub flops: usize,
}

#[derive(Clone, Debug)]
pub struct Profile {
    pub adapter: String,
    pub backend: String,
    pub device_type: String,
    /// "timestamp" or "wall".
    pub timing: &'static str,
    pub kernels: Vec<KernelProfile>,
    pub kernels_ms: f64,
    pub full_ms: f64,
    pub uploaded_bytes: u64,
    pub readback_bytes: u64,
    pub compile_ms: f64,
    pub runs: usize,
    /// Distinct pipelines among the kernels (identical kernels share one).
    pub pipelines: usize,
}

/// The median (0 for none).
pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Seeded inputs for the parameters `which`: floats in [-1, 1), integers
/// in [0, 2), bools random.
pub fn random_inputs(g: &Graph, which: &[usize], seed: u64) -> Vec<HostTensor<'static>> {
    let mut s = seed;
    let mut next = move || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        s >> 33
    };
    which
        .iter()
        .map(|&i| {
            let m = g.meta(g.inputs[i]);
            let n = m.numel();
            let sizes = m.sizes.clone();
            let t = match m.dtype {
                DType::F32 => HostTensor::from_slice(
                    &sizes,
                    &(0..n)
                        .map(|_| (next() % 2000) as f32 / 1000.0 - 1.0)
                        .collect::<Vec<_>>(),
                ),
                DType::F16 => HostTensor::from_slice(
                    &sizes,
                    &(0..n)
                        .map(|_| half::f16::from_f32((next() % 2000) as f32 / 1000.0 - 1.0))
                        .collect::<Vec<_>>(),
                ),
                DType::I32 => HostTensor::from_slice(
                    &sizes,
                    &(0..n).map(|_| (next() % 2) as i32).collect::<Vec<_>>(),
                ),
                DType::I64 => HostTensor::from_slice(
                    &sizes,
                    &(0..n).map(|_| (next() % 2) as i64).collect::<Vec<_>>(),
                ),
                DType::U32 => HostTensor::from_slice(
                    &sizes,
                    &(0..n).map(|_| (next() % 2) as u32).collect::<Vec<_>>(),
                ),
                DType::I8 => HostTensor::from_slice(
                    &sizes,
                    &(0..n).map(|_| (next() % 2) as i8).collect::<Vec<_>>(),
                ),
                DType::Bool => HostTensor::from_bools(
                    &sizes,
                    &(0..n).map(|_| next() % 2 == 1).collect::<Vec<_>>(),
                ),
            };
            t.expect("sizes match by construction")
        })
        .collect()
}

/// Profiles `exe` (compiled by `session` in `compile_ms`) over `runs` runs
/// after a warm-up, on `inputs` (one per `exe.input_params()`).
pub fn profile(
    session: &Session,
    exe: &Executable,
    inputs: &[HostTensor],
    runs: usize,
    compile_ms: f64,
) -> Result<Profile, EngineError> {
    let runs = runs.max(1);
    let feeds: Vec<Input> = inputs.iter().map(Input::Host).collect();
    let full = exe.options(Fetch::Host, Fetch::Host);
    let timed = |timing: Timing| RunOptions {
        timing,
        ..exe.options(Fetch::Skip, Fetch::Skip)
    };
    // Warm-up: pipelines, buffers, first-dispatch shader compilation.
    session.run(exe, &feeds, &full)?;
    let mut full_ms = vec![];
    let mut last = None;
    for _ in 0..runs {
        let t = Instant::now();
        let r = session.run(exe, &feeds, &full)?;
        full_ms.push(t.elapsed().as_secs_f64() * 1e3);
        last = Some(r.stats);
    }
    let stats = last.expect("at least one run");
    let gpu = session.gpu();
    let p = &exe.program;
    let (timing, kernels_ms, per_kernel) = if gpu.has_timestamps() {
        let mut total = vec![];
        for _ in 0..runs {
            let r = session.run(exe, &feeds, &timed(Timing::Total))?;
            total.push(r.stats.gpu_ms.unwrap_or(0.0));
        }
        let mut each: Vec<Vec<f64>> = vec![vec![]; p.kernels.len()];
        for _ in 0..runs {
            let r = session.run(exe, &feeds, &timed(Timing::PerKernel))?;
            for (k, ms) in r.stats.kernel_ms.iter().enumerate() {
                each[k].push(*ms);
            }
        }
        (
            "timestamp",
            median(total),
            each.into_iter().map(|v| Some(median(v))).collect(),
        )
    } else {
        let mut total = vec![];
        for _ in 0..runs {
            let t = Instant::now();
            exe.dispatch_and_wait()?;
            total.push(t.elapsed().as_secs_f64() * 1e3);
        }
        ("wall", median(total), vec![None; p.kernels.len()])
    };
    Ok(Profile {
        adapter: gpu.info.name.clone(),
        backend: format!("{:?}", gpu.info.backend),
        device_type: format!("{:?}", gpu.info.device_type),
        timing,
        kernels: p
            .kernels
            .iter()
            .zip(per_kernel)
            .map(|(k, ms)| KernelProfile {
                name: k.code.label.clone(),
                ms,
                bytes: k.bytes_read + k.bytes_written,
                flops: k.flops,
            })
            .collect(),
        kernels_ms,
        full_ms: median(full_ms),
        uploaded_bytes: stats.uploaded_bytes,
        readback_bytes: stats.readback_bytes,
        compile_ms,
        runs,
        pipelines: exe.distinct_pipelines(),
    })
}

impl Profile {
    pub fn to_json(&self) -> serde_json::Value {
        let rate = |x: f64, ms: Option<f64>| ms.filter(|&m| m > 0.0).map(|m| x / (m * 1e-3));
        serde_json::json!({
            "adapter": { "name": self.adapter, "backend": self.backend, "device_type": self.device_type },
            "timing": self.timing,
            "kernels": self.kernels.iter().map(|k| serde_json::json!({
                "name": k.name,
                "ms": k.ms,
                "bytes": k.bytes,
                "flops": k.flops,
                "gb_per_s": rate(k.bytes as f64 / 1e9, k.ms),
                "gflop_per_s": rate(k.flops as f64 / 1e9, k.ms),
            })).collect::<Vec<_>>(),
            "kernels_ms": self.kernels_ms,
            "full_ms": self.full_ms,
            "full_over_kernels": self.full_ms / self.kernels_ms.max(1e-9),
            "uploaded_bytes": self.uploaded_bytes,
            "readback_bytes": self.readback_bytes,
            "compile_ms": self.compile_ms,
            "runs": self.runs,
            "pipelines": self.pipelines,
        })
    }

    /// A table for people.
    pub fn table(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "adapter: {} ({}, {}); GPU times from {}",
            self.adapter, self.backend, self.device_type, self.timing
        );
        let _ = writeln!(
            s,
            "{:>4} {:<32} {:>10} {:>12} {:>12} {:>9} {:>9}",
            "#", "kernel", "ms", "bytes", "flops", "GB/s", "GFLOP/s"
        );
        for (i, k) in self.kernels.iter().enumerate() {
            let ms = k.ms.map_or("-".into(), |m| format!("{m:.4}"));
            let per = |x: usize| {
                k.ms.filter(|&m| m > 0.0).map_or("-".into(), |m| {
                    format!("{:.2}", x as f64 / 1e9 / (m * 1e-3))
                })
            };
            let _ = writeln!(
                s,
                "{i:>4} {:<32} {ms:>10} {:>12} {:>12} {:>9} {:>9}",
                k.name.chars().take(32).collect::<String>(),
                k.bytes,
                k.flops,
                per(k.bytes),
                per(k.flops)
            );
        }
        let _ = writeln!(
            s,
            "kernels {:.3} ms, full run {:.3} ms (ratio {:.2}); per run: uploaded {} B, read back {} B; compile {:.1} ms; {} kernels, {} pipelines",
            self.kernels_ms,
            self.full_ms,
            self.full_ms / self.kernels_ms.max(1e-9),
            self.uploaded_bytes,
            self.readback_bytes,
            self.compile_ms,
            self.kernels.len(),
            self.pipelines
        );
        s
    }
}
