//! The GPU engine on every example program and on larger MLP and
//! attention blocks: kernels, bytes moved against the minimum, planned
//! peak against eager execution and against the lower bound, and the
//! host-side time per kernel of a compiled run (encode and submit).
//!
//!     cargo bench --bench engine

use kiln::engine::{compile_with, Gpu};
use kiln::functionalize::{parse, Graph, RTensor};
use std::time::Instant;

mod common;
use common::{ATTENTION, MLP};

fn inputs(g: &Graph) -> Vec<RTensor> {
    kiln::functionalize::random::random_inputs(g, 1, 0.05)
}

fn main() {
    // `cargo test --all-targets` runs bench targets without `--bench`: the
    // measurements take minutes on a software adapter, so only `cargo bench` runs them.
    if !std::env::args().any(|a| a == "--bench") {
        println!("engine benchmark: run it with `cargo bench --bench engine`");
        return;
    }
    std::env::set_var(
        "XDG_RUNTIME_DIR",
        std::env::var("XDG_RUNTIME_DIR").unwrap_or("/tmp".into()),
    );
    let gpu = Gpu::new().expect("a wgpu adapter");
    println!("adapter: {}", gpu.describe());
    if gpu.info.device_type == wgpu::DeviceType::Cpu {
        println!("(a software adapter: times are CPU times, not GPU numbers)");
    }
    let mut programs: Vec<(String, String)> = vec![
        ("mlp_block_256x512x1024".into(), MLP.into()),
        ("attention_128x256_4heads".into(), ATTENTION.into()),
    ];
    let mut paths: Vec<_> = std::fs::read_dir("examples/programs")
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    paths.sort();
    for p in paths {
        programs.push((
            p.file_stem().unwrap().to_string_lossy().into(),
            std::fs::read_to_string(&p).unwrap(),
        ));
    }
    println!("| program | kernels | bytes moved / min | planned peak / eager | arena / lower bound | host us/kernel | run ms |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (name, src) in programs {
        let g = parse(&src).unwrap();
        let p = compile_with(&g, gpu.compile_options()).unwrap();
        let (k, moved, min, m) = (
            p.kernels.len(),
            p.bytes_moved(),
            p.min_bytes,
            p.memory.clone(),
        );
        let loaded = gpu.load(p).unwrap();
        let ins = inputs(&g);
        loaded.run(&gpu, &ins).unwrap(); // warm-up: first dispatches compile shaders
        let reps = 10;
        let mut host = 0.0;
        let t_all = Instant::now();
        for _ in 0..reps {
            let t = Instant::now();
            loaded.submit(&gpu);
            host += t.elapsed().as_secs_f64();
            pollster::block_on(loaded.read_back(&gpu)).unwrap();
        }
        let run_ms = t_all.elapsed().as_secs_f64() * 1e3 / reps as f64;
        let per_kernel = host * 1e6 / reps as f64 / k.max(1) as f64;
        let ratio = |a: usize, b: usize| {
            if b == 0 {
                "-".to_string()
            } else {
                format!("{:.3}", a as f64 / b as f64)
            }
        };
        println!(
            "| {name} | {k} | {} | {} | {} | {per_kernel:.1} | {run_ms:.2} |",
            ratio(moved, min),
            ratio(m.planned_peak(), m.eager_peak),
            ratio(m.arena, m.lower_bound),
        );
    }
}
