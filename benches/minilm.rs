//! all-MiniLM-L6-v2 on the GPU engine: sentences per second at batch 1, 8
//! and 32 (real lengths, and padded to 128 tokens), kernels per forward,
//! planned peak memory beside the weights, compile time per shape.
//!
//!     cargo bench --bench minilm            # every configuration
//!     KILN_BENCH_QUICK=1 cargo bench --bench minilm   # batch 1 and 8 at real lengths

use kiln::engine::{compile_with, Gpu};
use kiln::minilm::{bucket, fetch, MiniLm, SEQ_BUCKETS};
use std::time::Instant;

mod common;
use common::SENTENCES;

fn main() {
    // `cargo test --all-targets` runs bench targets without `--bench`: the
    // measurements take minutes on a software adapter, so only `cargo bench` runs them.
    if !std::env::args().any(|a| a == "--bench") {
        println!("minilm benchmark: run it with `cargo bench --bench minilm`");
        return;
    }
    std::env::set_var(
        "XDG_RUNTIME_DIR",
        std::env::var("XDG_RUNTIME_DIR").unwrap_or("/tmp".into()),
    );
    let quick = std::env::var("KILN_BENCH_QUICK").is_ok();
    let gpu = Gpu::new().expect("a wgpu adapter");
    println!("adapter: {}", gpu.describe());
    if gpu.info.device_type == wgpu::DeviceType::Cpu {
        println!("(a software adapter: times are CPU times, not GPU numbers)");
    }
    let mut model = MiniLm::load(&fetch().expect("the model")).expect("loads");
    println!("| batch | tokens | kernels | compile s | load s | ms / forward | sentences / s | planned peak MB | weights MB |");
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|");
    let configs: &[(usize, bool)] = if quick {
        &[(1, false), (8, false)]
    } else {
        &[
            (1, false),
            (8, false),
            (32, false),
            (1, true),
            (8, true),
            (32, true),
        ]
    };
    for &(batch, full) in configs {
        let texts: Vec<&str> = (0..batch).map(|i| SENTENCES[i % SENTENCES.len()]).collect();
        let ids: Vec<Vec<u32>> = texts.iter().map(|t| model.tokenize(t).unwrap()).collect();
        let seq = if full {
            128
        } else {
            bucket(ids.iter().map(|t| t.len()).max().unwrap(), &SEQ_BUCKETS)
        };
        let inputs = model.inputs(&ids, batch, seq);
        let weights: usize = inputs[2..].iter().map(|t| t.meta.numel() * 4).sum();
        let t = Instant::now();
        let g = model.graph(batch, seq).unwrap().clone();
        let program = compile_with(&g, gpu.compile_options()).unwrap();
        let compile_s = t.elapsed().as_secs_f64();
        let (kernels, planned) = (program.kernels.len(), program.memory.planned_peak());
        let t = Instant::now();
        let loaded = gpu.load(program).unwrap();
        loaded.run(&gpu, &inputs).unwrap(); // first run compiles the shaders
        let load_s = t.elapsed().as_secs_f64();
        let reps = if batch * seq > 1024 { 1 } else { 3 };
        let t = Instant::now();
        for _ in 0..reps {
            loaded.run(&gpu, &inputs).unwrap();
        }
        let ms = t.elapsed().as_secs_f64() * 1e3 / reps as f64;
        println!(
            "| {batch} | {} ({seq}) | {kernels} | {compile_s:.2} | {load_s:.2} | {ms:.0} | {:.2} | {:.1} | {:.1} |",
            if full { "padded" } else { "real" },
            batch as f64 / (ms / 1e3),
            planned as f64 / 1e6,
            weights as f64 / 1e6
        );
    }
}
