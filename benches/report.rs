//! Every stage measured in one run, with PyTorch on this machine's CPU
//! beside it (`benches/torch_bench.py`, same run), written to
//! `docs/performance.md`:
//!
//!     cargo bench --bench report            # KILN_REPORT=path writes elsewhere
//!
//! `KILN_REPORT_ONLY=programs|chains|imports|minilm|export|web` runs one
//! part and writes it to target/performance-<part>.md (or `KILN_REPORT`),
//! to be spliced into the report by hand.
//!
//! 1. functionalize: statements per second, random programs of 1k, 10k,
//!    100k statements, both modes (PyTorch: make_fx of functionalize);
//! 2. per program: kernels, bytes moved against the minimum;
//! 3. per program: planned peak against the lower bound, the naive total
//!    and eager's peak;
//! 4. runtime (`kiln profile`'s figures): GPU time of the kernels, full
//!    run from host inputs to host outputs, their ratio, bytes uploaded
//!    and read back per run; an elementwise chain over 1M, 16M, 64M
//!    elements in GB/s;
//! 5. MiniLM: the same figures at batch 1, 8, 32 (real lengths) and
//!    32 x 128, sentences per second, compile time;
//! 6. export: MiniLM's file size (f32, f16 weights), time from the file to
//!    the first result (warm and cold page cache), loading against
//!    compiling, f16's effect on the embeddings, the runtime-only binary's
//!    size beside the CLI's.

use kiln::engine::{compile_with, HostTensor, Session};
use kiln::functionalize::random::{
    random_inputs, random_program, random_program_with, Options, Seeded,
};
use kiln::functionalize::{functionalize, parse, DType, Graph, RTensor, Remove};
use kiln::minilm::{fetch, MiniLm};
use kiln::profile::{median, profile, Profile};
use serde_json::{json, Value};
use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

mod common;
#[path = "../examples/train_mlp.rs"]
mod train_mlp;
use common::{ATTENTION, LAYER_NORM, LINEAR, MLP, SENTENCES, SOFTMAX};

const CHAIN_SIZES: [usize; 3] = [1 << 20, 1 << 24, 1 << 26];
const TRANSPOSED_CHAIN_SIDE: usize = 4096;

/// Imported models (`tests/fixtures/import/NAME.pt2`; `bench/` holds the
/// convolution measured alone), and that convolution's FLOPs: 2 N O OH OW
/// C k k for a 3x3, 64 -> 64 channel convolution of a 56 x 56 image.
const IMPORTED: &[&str] = &[
    "mobilenet_v2",
    "mobilenet_v3_small",
    "efficientnet",
    "tiny_resnet",
    "convnext",
    "vit",
    "swin",
    "bert",
    "gpt2",
    "llama",
    "bench/conv2d_64x56",
];
const CONV_FLOPS: f64 = 2.0 * 64.0 * 56.0 * 56.0 * 64.0 * 9.0;
/// Seeds of the random programs offered to PyTorch's functionalize.
const FUNC_SEEDS: std::ops::RangeInclusive<u64> = 42..=49;
/// The random programs offered to it: without what it refuses where eager
/// runs it.
const TRACEABLE: Options = Options {
    torch_refusals: false,
};

/// A functionalization row: label, program, PyTorch's time (None: not
/// offered to it).
type FuncCase<'a> = (
    String,
    std::borrow::Cow<'a, Graph>,
    Option<Result<f64, String>>,
);

/// Best wall time of `f` in seconds after one warm-up call: up to `reps`
/// calls within about `budget` seconds.
fn best(reps: usize, budget: f64, mut f: impl FnMut()) -> f64 {
    f();
    let start = Instant::now();
    let mut b = f64::INFINITY;
    for _ in 0..reps {
        let t = Instant::now();
        f();
        b = b.min(t.elapsed().as_secs_f64());
        if start.elapsed().as_secs_f64() > budget {
            break;
        }
    }
    b
}

/// `kiln functionalize PROG --remove MODE`, output discarded.
fn cli_functionalize(prog: &Path, mode: &str) {
    let ok = std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["functionalize", &prog.to_string_lossy(), "--remove", mode])
        .stdout(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kiln functionalize failed on {}", prog.display());
}

fn save_inputs(g: &Graph, ins: &[RTensor], path: &Path) {
    let names = kiln::functionalize::text::Names::of(g);
    let named: Vec<(String, RTensor)> = g
        .inputs
        .iter()
        .zip(ins)
        .map(|(&v, t)| (names.get(v), t.clone()))
        .collect();
    kiln::io::save_all(path, &named).expect("writes the inputs");
}

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 && a.is_finite() {
        format!("{:.3}", a / b)
    } else {
        "-".into()
    }
}

/// Seconds from the PyTorch results at `path` (e.g. ["chain", "1024",
/// "eager_s"]), or the error it reported.
fn torch_s(t: &Value, path: &[&str]) -> Result<f64, String> {
    let mut v = t;
    for p in path {
        v = &v[*p];
    }
    if let Some(x) = v.as_f64() {
        return Ok(x);
    }
    let mut e = t;
    for p in &path[..path.len() - 1] {
        e = &e[*p];
    }
    Err(e["error"]
        .as_str()
        .or(e["compile_error"].as_str())
        .or(v.as_str())
        .unwrap_or("not run")
        .to_string())
}

/// pipelines | kernels ms | GFLOP/s | GB/s | full ms | full / kernels |
/// uploaded | read back
fn runtime_cells(p: &Profile) -> String {
    let flops: usize = p.kernels.iter().map(|k| k.flops).sum();
    let bytes: usize = p.kernels.iter().map(|k| k.bytes).sum();
    let rate = |x: usize| x as f64 / 1e9 / (p.kernels_ms.max(1e-9) * 1e-3);
    format!(
        "{} | {:.3} | {:.2} | {:.2} | {:.3} | {:.2} | {} | {}",
        p.pipelines,
        p.kernels_ms,
        rate(flops),
        rate(bytes),
        p.full_ms,
        p.full_ms / p.kernels_ms.max(1e-9),
        p.uploaded_bytes,
        p.readback_bytes
    )
}

fn cell(r: Result<f64, String>, scale: f64, digits: usize) -> String {
    match r {
        Ok(x) => format!("{:.*}", digits, x * scale),
        Err(e) => format!("n/a ({})", e.replace('|', "/")),
    }
}

fn main() {
    // `cargo test --all-targets` runs bench targets without `--bench`.
    if !std::env::args().any(|a| a == "--bench") {
        println!("report benchmark: run it with `cargo bench --bench report`");
        return;
    }
    std::env::set_var(
        "XDG_RUNTIME_DIR",
        std::env::var("XDG_RUNTIME_DIR").unwrap_or("/tmp".into()),
    );
    // A partial run (`KILN_REPORT_ONLY`) writes only its sections: to
    // target/, never over the whole report, unless `KILN_REPORT` says.
    let out_path =
        PathBuf::from(std::env::var("KILN_REPORT").unwrap_or_else(|_| {
            match std::env::var("KILN_REPORT_ONLY") {
                Ok(only) => format!("target/performance-{only}.md"),
                Err(_) => "docs/performance.md".into(),
            }
        }));
    eprintln!("writing {}", out_path.display());
    let tmp = std::env::temp_dir().join(format!("kiln-report-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let session = Session::open().unwrap_or_else(|e| panic!("{e}"));
    let gpu = session.gpu().clone();
    eprintln!("adapter: {}", gpu.describe());

    // `KILN_REPORT_ONLY=imports` (section 9) or `=chains` (the chains of
    // section 4) alone, both sides, without the whole report.
    let only = std::env::var("KILN_REPORT_ONLY").ok();
    if let Some(only) = only
        .as_deref()
        .filter(|o| ["imports", "chains"].contains(o))
    {
        let json = match only {
            "imports" => json!({"imports": import_workloads(&tmp)}),
            _ => json!({"chain": CHAIN_SIZES, "transposed_chain": TRANSPOSED_CHAIN_SIDE}),
        };
        let torch = run_torch_json(&tmp, &json);
        let mut md = String::new();
        header(&mut md, &gpu, &torch);
        if only == "imports" {
            import_section(&mut md, &session, &tmp, &torch);
        } else {
            chain_section(&mut md, &session, &torch);
            transposed_chain_section(&mut md, &session, &torch);
        }
        std::fs::write(&out_path, &md).unwrap();
        println!("{md}");
        return;
    }
    let w = workloads(&tmp);
    // `KILN_REPORT_ONLY=export`: section 6 alone (MiniLM's export per
    // weights format; no PyTorch side).
    if only.as_deref() == Some("export") {
        let mut md = String::new();
        let mut model = MiniLm::load(&w.model_dir).expect("loads");
        export_section(&mut md, &mut model, &tmp);
        std::fs::write(&out_path, &md).unwrap();
        println!("{md}");
        return;
    }
    // `KILN_REPORT_ONLY=web`: section 7 alone (the page per variant in
    // headless Chromium beside the native run of the same files).
    if only.as_deref() == Some("web") {
        let mut md = String::new();
        let model = MiniLm::load(&w.model_dir).expect("loads");
        web_section(&mut md, &model);
        std::fs::write(&out_path, &md).unwrap();
        println!("{md}");
        return;
    }
    // `KILN_REPORT_ONLY=minilm`: section 5 alone, both sides.
    if only.as_deref() == Some("minilm") {
        let torch = run_torch_json(&tmp, &json!({"minilm": w.json["minilm"]}));
        let mut md = String::new();
        header(&mut md, &gpu, &torch);
        minilm_section(&mut md, &session, &w, &torch);
        std::fs::write(&out_path, &md).unwrap();
        println!("{md}");
        return;
    }
    // `KILN_REPORT_ONLY=programs`: sections 2 to 4's per-program tables.
    if only.as_deref() == Some("programs") {
        let json = json!({"programs": w.json["programs"], "blocks": w.json["blocks"]});
        let torch = run_torch_json(&tmp, &json);
        let mut md = String::new();
        header(&mut md, &gpu, &torch);
        programs_section(&mut md, &session, &w, &torch);
        std::fs::write(&out_path, &md).unwrap();
        println!("{md}");
        return;
    }
    let torch = run_torch(&tmp, &w);
    let mut md = String::new();
    header(&mut md, &gpu, &torch);
    functionalize_section(&mut md, &tmp, &w, &torch);
    programs_section(&mut md, &session, &w, &torch);
    chain_section(&mut md, &session, &torch);
    transposed_chain_section(&mut md, &session, &torch);
    let mut model = minilm_section(&mut md, &session, &w, &torch);
    export_section(&mut md, &mut model, &tmp);
    web_section(&mut md, &model);
    transforms_section(&mut md, &w.losses, &torch["transforms"], &session);
    import_section(&mut md, &session, &tmp, &torch);
    std::fs::create_dir_all(out_path.parent().unwrap_or(Path::new("."))).unwrap();
    std::fs::write(&out_path, &md).unwrap();
    let _ = std::fs::remove_dir_all(&tmp);
    println!("{md}");
    eprintln!("wrote {}", out_path.display());
}

/// What the report measures, on both sides: random programs for the pass,
/// the programs, the transforms' losses, MiniLM; with the JSON that tells
/// `benches/torch_bench.py` where their files are.
struct Workloads {
    func_sizes: [usize; 4],
    func_programs: Vec<Graph>,
    graphs: Vec<(String, Graph, Vec<RTensor>)>,
    losses: Vec<(String, Graph)>,
    model_dir: PathBuf,
    batches: [usize; 3],
    json: Value,
}

/// The workloads, their programs and inputs written under `tmp` for the
/// PyTorch side.
fn workloads(tmp: &Path) -> Workloads {
    // Workloads, and their inputs written for the PyTorch side.
    let func_sizes = [1_000usize, 10_000, 100_000, 1_000_000];
    let func_programs: Vec<Graph> = func_sizes
        .iter()
        .map(|&n| random_program(&mut Seeded(42), n))
        .collect();
    // PyTorch's functionalize refuses some random programs that eager
    // runs (`Options::torch_refusals`): it gets candidates without those
    // in seed order, times the first it handles and says which; Kiln then
    // times that same program too.
    let mut w_func = vec![];
    for &n in func_sizes.iter().take(2) {
        for seed in FUNC_SEEDS {
            let g = random_program_with(&mut Seeded(seed), n, TRACEABLE);
            let (p, i) = (
                tmp.join(format!("random{n}_{seed}.txt")),
                tmp.join(format!("random{n}_{seed}.safetensors")),
            );
            std::fs::write(&p, kiln::print(&g)).unwrap();
            save_inputs(&g, &random_inputs(&g, 1, 1.0), &i);
            w_func.push(json!({"n": n, "seed": seed, "program": p, "inputs": i}));
        }
    }
    let mut programs: Vec<(String, String)> = vec![
        ("mlp_block_256x512x1024".into(), MLP.into()),
        ("attention_128x256_4heads".into(), ATTENTION.into()),
        ("linear_4096x384x1536_bias".into(), LINEAR.into()),
        ("softmax_49152x128".into(), SOFTMAX.into()),
        ("layer_norm_4096x384".into(), LAYER_NORM.into()),
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
    let mut w_prog = vec![];
    let mut blocks = serde_json::Map::new();
    let graphs: Vec<(String, Graph, Vec<RTensor>)> = programs
        .iter()
        .map(|(name, src)| {
            let g = parse(src).unwrap();
            let ins = random_inputs(&g, 1, 0.05);
            let (p, i) = (
                tmp.join(format!("{name}.txt")),
                tmp.join(format!("{name}.safetensors")),
            );
            std::fs::write(&p, src).unwrap();
            save_inputs(&g, &ins, &i);
            w_prog.push(json!({"name": name, "program": p, "inputs": i}));
            if name == "mlp_block_256x512x1024" {
                blocks.insert("mlp".into(), json!({"program": p, "inputs": i}));
            } else if name == "attention_128x256_4heads" {
                blocks.insert("attention".into(), json!({"program": p, "inputs": i}));
            }
            (name.clone(), g, ins)
        })
        .collect();
    // Transforms: a loss (the sum of every floating output) over each
    // example program and over random programs of views and mutations.
    let mut w_trans = vec![];
    let mut losses: Vec<(String, Graph)> = vec![];
    let mut loss_sources: Vec<(String, Graph)> = programs
        .iter()
        .filter(|(n, _)| {
            Path::new("examples/programs")
                .join(format!("{n}.txt"))
                .exists()
        })
        .map(|(n, src)| (n.clone(), parse(src).unwrap()))
        .collect();
    for n in [1_000usize, 10_000] {
        loss_sources.push((
            format!("random {n} (seed 42)"),
            random_program_with(&mut Seeded(42), n, TRACEABLE),
        ));
    }
    for (name, g) in loss_sources {
        let Some(l) = loss_program(&g) else { continue };
        let (p, i) = (
            tmp.join(format!("loss_{}.txt", w_trans.len())),
            tmp.join(format!("loss_{}.safetensors", w_trans.len())),
        );
        std::fs::write(&p, kiln::print(&l)).unwrap();
        save_inputs(&l, &random_inputs(&l, 1, 0.5), &i);
        w_trans.push(json!({"name": name, "program": p, "inputs": i}));
        losses.push((name, l));
    }
    let model_dir = fetch(None).expect("the MiniLM model");
    let batches = [1usize, 8, 32];
    let json = json!({
        "imports": import_workloads(tmp),
        "functionalize": w_func,
        "programs": w_prog,
        "blocks": blocks,
        "chain": CHAIN_SIZES,
        "transposed_chain": TRANSPOSED_CHAIN_SIDE,
        "transforms": w_trans,
        "minilm": {"dir": model_dir, "batches": batches, "sentences": SENTENCES},
    });
    Workloads {
        func_sizes,
        func_programs,
        graphs,
        losses,
        model_dir,
        batches,
        json,
    }
}

/// PyTorch's figures for the workloads (`benches/torch_bench.py`), or an
/// error object where python3 with torch is missing.
fn run_torch(tmp: &Path, w: &Workloads) -> Value {
    run_torch_json(tmp, &w.json)
}

fn run_torch_json(tmp: &Path, json: &Value) -> Value {
    let wpath = tmp.join("workloads.json");
    std::fs::write(&wpath, json.to_string()).unwrap();
    eprintln!("PyTorch side (benches/torch_bench.py) ...");
    std::process::Command::new("python3")
        .arg("benches/torch_bench.py")
        .arg(&wpath)
        .output()
        .ok()
        .and_then(|o| {
            if !o.status.success() {
                eprintln!("{}", String::from_utf8_lossy(&o.stderr));
            }
            serde_json::from_slice(&o.stdout).ok()
        })
        .unwrap_or_else(|| json!({"error": "python3 with torch is not available"}))
}

/// The report's title, how to regenerate it, and the machine.
fn header(md: &mut String, gpu: &kiln::engine::Gpu, torch: &Value) {
    let software = gpu.info.device_type == wgpu::DeviceType::Cpu;
    let torch_version = torch["torch"]
        .as_str()
        .unwrap_or("not available")
        .to_string();

    let _ = writeln!(md, "# Performance\n");
    let _ = writeln!(
        md,
        "Regenerate with `cargo bench --bench report` (writes this file; about 20 minutes on the \
         2-core development machine with lavapipe). Kiln and PyTorch run in the same invocation: \
         PyTorch through `benches/torch_bench.py` on this machine's CPU. GPU figures (an H100 \
         beside PyTorch CUDA) are in `docs/performance-gpu.md`, from `scripts/gpu-bench.sh`.\n"
    );
    let _ = writeln!(
        md,
        "- adapter: **{}** (backend {:?}, device type {:?}){}",
        gpu.info.name,
        gpu.info.backend,
        gpu.info.device_type,
        if software {
            " — a software adapter: its times are CPU times, **not GPU numbers**"
        } else {
            ""
        }
    );
    let _ = writeln!(
        md,
        "- machine: {} CPU cores; PyTorch {} ({} threads), CPU eager and `torch.compile`",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        torch_version,
        torch["threads"].as_i64().unwrap_or(0)
    );
    let _ = writeln!(md, "- date: {}\n", date());
}

/// Section 1: the pass on random programs, library and CLI, beside
/// PyTorch's functionalize.
fn functionalize_section(md: &mut String, tmp: &Path, w: &Workloads, torch: &Value) {
    // 1. Functionalization.
    eprintln!("functionalize ...");
    let _ = writeln!(
        md,
        "## 1. Functionalization (random programs of views and mutations)\n"
    );
    let _ = writeln!(md, "Kiln library: `functionalize` on the parsed graph (best of 5 runs, 1 from 100k). Kiln CLI: `kiln functionalize PROG --remove MODE` as a process, wall time including start-up, reading, parsing, the pass and printing (best of 5 runs, 2 at 1M; the machine's speed varies by some 10% from minute to minute). PyTorch: `make_fx(torch.func.functionalize(f, remove=mode))` tracing the same program (one run; not run past 10k). Programs are `random_program(seed, n)` (seed 42; PyTorch's functionalize refuses these, as it refuses any mutation through an `as_strided` view and an `as_strided` past a view's bounds, both of which eager runs). At 1k and 10k also the mix without what PyTorch's functionalize refuses (`Options {{ torch_refusals: false }}`: no `as_strided`, `unfold` windows that do not overlap, `reshape` for `view`): PyTorch is offered seeds 42 to 49 in turn and the first it handles is timed on both sides.\n");
    let _ = writeln!(
        md,
        "| statements | mode | library ms | library statements/s | CLI ms | CLI statements/s | PyTorch ms | PyTorch / CLI time |"
    );
    let _ = writeln!(md, "|---:|---|---:|---:|---:|---:|---:|---:|");
    // Rows: the default mix (seed 42) at every size, PyTorch not timed (it
    // refuses them: see above); at 1k and 10k also the mix without what it
    // refuses, the seed it handled, timed on both sides.
    let mut cli_seed42 = vec![];
    for (&n, g42) in w.func_sizes.iter().zip(&w.func_programs) {
        for (mode, remove) in [
            ("mutations", Remove::Mutations),
            ("mutations_and_views", Remove::MutationsAndViews),
        ] {
            let mut cases: Vec<FuncCase> =
                vec![("seed 42".into(), std::borrow::Cow::Borrowed(g42), None)];
            if n <= 10_000 {
                let seed = torch["functionalize"][n.to_string()][format!("{mode}_seed")]
                    .as_u64()
                    .unwrap_or(42);
                cases.push((
                    format!("PyTorch-traceable, seed {seed}"),
                    std::borrow::Cow::Owned(random_program_with(&mut Seeded(seed), n, TRACEABLE)),
                    Some(torch_s(torch, &["functionalize", &n.to_string(), mode])),
                ));
            }
            for (label, g, t) in cases {
                let text = tmp.join(format!("cli{n}_{}.txt", label.replace([' ', ','], "_")));
                std::fs::write(&text, kiln::print(&g)).unwrap();
                let reps = if n >= 100_000 { 1 } else { 5 };
                let s = best(reps, 30.0, || {
                    functionalize(&g, remove).unwrap();
                });
                // A process at 100k takes a fifth of a second: five runs.
                let cli_reps = if n >= 1_000_000 { 2 } else { 5 };
                let cli = best(cli_reps, 60.0, || cli_functionalize(&text, mode));
                if label == "seed 42" {
                    cli_seed42.push((g.order.len(), mode, cli));
                }
                let (torch_cell, torch_ratio) = match t {
                    None => ("-".to_string(), "-".to_string()),
                    Some(t) => (
                        cell(t.clone(), 1e3, 0),
                        t.map_or("-".into(), |t| ratio(t, cli)),
                    ),
                };
                let _ = writeln!(
                    md,
                    "| {} ({label}) | {mode} | {:.1} | {:.0} | {:.1} | {:.0} | {torch_cell} | {torch_ratio} |",
                    g.order.len(),
                    s * 1e3,
                    g.order.len() as f64 / s,
                    cli * 1e3,
                    g.order.len() as f64 / cli,
                );
            }
        }
    }

    // What a process costs before its first statement: most of the CLI's
    // time at 1k.
    let empty = tmp.join("cli_empty.txt");
    std::fs::write(&empty, "graph f(%x: f32[2]) {\n  return %x\n}\n").unwrap();
    let startup = best(20, 10.0, || cli_functionalize(&empty, "mutations"));
    let net: Vec<String> = cli_seed42
        .iter()
        .map(|&(n, mode, t)| {
            let net = (n as f64 / (t - startup).max(1e-9)).round();
            format!("{n} {mode} {net}")
        })
        .collect();
    let _ = writeln!(
        md,
        "\nStart-up: the CLI on a program of no statements takes {:.1} ms (starting the process, loading the binary, the allocator and the command line). Net of it, the CLI's statements/s (seed 42): {}.",
        startup * 1e3,
        net.join("; ")
    );
}

/// Sections 2 to 4: fusion and memory per program, then its runs.
fn programs_section(md: &mut String, session: &Session, w: &Workloads, torch: &Value) {
    let gpu = session.gpu();
    // 2.-4. Programs: fusion, memory, executor.
    eprintln!("programs ...");
    let _ = writeln!(md, "\n## 2. Fusion and 3. memory, per program\n");
    let _ = writeln!(md, "Minimum bytes: each input read once, each output written once (bools 1 byte, f16 2). Planned peak = parameters and outputs (io) + the planned arena; lower bound = most arena bytes live at once; naive = one buffer per value, unfused; eager = the reference interpreter's peak for the original program.\n");
    let _ = writeln!(md, "| program | kernels | bytes moved | minimum | moved / min | planned peak | lower bound (arena) | naive | eager peak | planned / eager | arena / lower bound |");
    let _ = writeln!(
        md,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    let mut exec_rows = String::new();
    let mut gpu_rows = String::new();
    let (mut over_bytes, mut over_eager) = (vec![], vec![]);
    let (mut gpu_over_bytes, mut gpu_over_eager) = (vec![], vec![]);
    for (name, g, ins) in &w.graphs {
        // What a GPU (and a browser export) compiles, whatever adapter
        // runs this report: deterministic figures.
        let q = compile_with(g, &kiln::engine::CompileOptions::default()).unwrap();
        let (qm, qmoved) = (&q.memory, q.bytes_moved());
        let _ = writeln!(
            gpu_rows,
            "| {name} | {} | {} | {} | {} | {} |",
            q.kernels.len(),
            qmoved,
            ratio(qmoved as f64, q.min_bytes as f64),
            qm.planned_peak(),
            ratio(qm.planned_peak() as f64, qm.eager_peak as f64),
        );
        if qmoved as f64 > 1.05 * q.min_bytes as f64 {
            gpu_over_bytes.push(name.clone());
        }
        if qm.planned_peak() > qm.eager_peak {
            gpu_over_eager.push(name.clone());
        }
        let p = compile_with(g, &gpu.compile_options()).unwrap();
        let m = p.memory.clone();
        let (k, moved, min) = (p.kernels.len(), p.bytes_moved(), p.min_bytes);
        let _ = writeln!(
            md,
            "| {name} | {k} | {moved} | {min} | {} | {} | {} | {} | {} | {} | {} |",
            ratio(moved as f64, min as f64),
            m.planned_peak(),
            m.lower_bound,
            m.naive_unfused,
            m.eager_peak,
            ratio(m.planned_peak() as f64, m.eager_peak as f64),
            ratio(m.arena as f64, m.lower_bound as f64),
        );
        if moved as f64 > 1.05 * min as f64 {
            over_bytes.push(name.clone());
        }
        if m.planned_peak() > m.eager_peak {
            over_eager.push(format!(
                "{name} (+{} B{})",
                m.planned_peak() - m.eager_peak,
                above_eager_reason(name).map_or(String::new(), |r| format!(": {r}"))
            ));
        }
        // The blocks' weights are constants (uploaded once); every
        // parameter of the other programs is an input.
        let constants = matches!(
            name.as_str(),
            "mlp_block_256x512x1024" | "attention_128x256_4heads" | "linear_4096x384x1536_bias"
        );
        let (exe, ins): (_, Vec<HostTensor>) = if constants {
            let names = kiln::functionalize::text::Names::of(g);
            for (&v, t) in g.inputs.iter().zip(ins).skip(1) {
                let c = format!("{name}.{}", names.get(v));
                session
                    .add_constant(&c, &HostTensor::from_rtensor(t))
                    .unwrap();
            }
            let mut renamed = g.clone();
            for &v in g.inputs.iter().skip(1) {
                let c = format!("{name}.{}", names.get(v));
                renamed.values[v].name = Some(c.into());
            }
            (
                session.compile(&renamed).unwrap(),
                vec![HostTensor::from_rtensor(&ins[0])],
            )
        } else {
            (
                std::sync::Arc::new(session.load(p).unwrap()),
                ins.iter().map(HostTensor::from_rtensor).collect(),
            )
        };
        let pr = profile(session, &exe, &ins, 10, 0.0).unwrap();
        let t = torch_s(torch, &["programs", name, "eager_s"]);
        let _ = writeln!(
            exec_rows,
            "| {name} | {k} | {} | {} | {} |",
            runtime_cells(&pr),
            cell(t.clone(), 1e3, 3),
            t.map_or("-".into(), |t| ratio(pr.full_ms / 1e3, t)),
        );
    }
    let _ =
        writeln!(
        md,
        "\nMoving more than 1.05x the minimum: {} of {} ({}). Planned peak above eager: {} ({}).\n",
        over_bytes.len(),
        w.graphs.len(),
        over_bytes.join(", "),
        over_eager.len(),
        if over_eager.is_empty() { "none".into() } else { over_eager.join(", ") }
    );
    let _ = writeln!(md, "The same programs as a GPU compiles them (`CompileOptions::default()`: products in tiles reading their operands in place, attention in one kernel, rows reduced by workgroups, WebGPU's 256-byte binding offsets and 8 storage buffers a kernel; what `kiln compile --stats` and browser exports give, on any machine). Kernels sharing a launch count as one; a buffer read by several kernels of one launch is counted once.\n");
    let _ = writeln!(
        md,
        "| program | kernels | bytes moved | moved / min | planned peak | planned / eager |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|");
    md.push_str(&gpu_rows);
    let _ = writeln!(
        md,
        "\nGPU variant: moving more than 1.05x the minimum: {} of {} ({}). Planned peak above eager: {} ({}).\n",
        gpu_over_bytes.len(),
        w.graphs.len(),
        gpu_over_bytes.join(", "),
        gpu_over_eager.len(),
        if gpu_over_eager.is_empty() { "none".into() } else { gpu_over_eager.join(", ") }
    );
    let _ = writeln!(md, "## 4. Runtime\n");
    let _ = writeln!(md, "`kiln profile` figures (medians of 10 runs after a warm-up, through a `Session`): kernels = GPU time of all kernels of a run ({}); full = wall time of a run from host inputs to host outputs (upload, kernels, readback of every output and mutated input); GFLOP/s and GB/s = the kernels' FLOPs (2 M N K for products, one per element and op otherwise) and bytes read + written over the kernels' time; uploaded / read back = bytes per run. The MLP and attention blocks and the linear take their weights as session constants (uploaded once); the other programs take every parameter as an input. The linear, softmax and layer norm rows are MiniLM's shapes at batch 32 x 128. PyTorch eager: the same program's aten ops from Python, overloads resolved once.\n",
        if gpu.has_timestamps() { "timestamp queries" } else { "wall time around submit and wait: this adapter has no timestamp queries" });
    let _ = writeln!(md, "| program | kernels | pipelines | kernels ms | GFLOP/s | GB/s | full ms | full / kernels | uploaded B | read back B | PyTorch eager ms | Kiln / PyTorch time |");
    let _ = writeln!(
        md,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    md.push_str(&exec_rows);
    for (name, key) in [
        ("mlp_block_256x512x1024", "mlp"),
        ("attention_128x256_4heads", "attention"),
    ] {
        let c = torch_s(torch, &["blocks", key, "compile_s"]);
        let e = torch_s(torch, &["blocks", key, "eager_s"]);
        let _ = writeln!(
            md,
            "\n{name}: PyTorch eager (direct module code) {} ms, torch.compile {} ms.",
            cell(e, 1e3, 2),
            cell(c, 1e3, 2)
        );
    }
}

/// The imported models for the PyTorch side.
fn import_workloads(tmp: &Path) -> Vec<Value> {
    IMPORTED
        .iter()
        .map(|n| {
            let base = PathBuf::from("tests/fixtures/import").join(n);
            json!({"name": n, "pt2": base.with_extension("pt2"),
                   "inputs": import_inputs(tmp, n)})
        })
        .collect()
}

/// The user inputs of imported model `name`: the fixture's, or (`bench/`
/// models) seeded random values written under `tmp`.
fn import_inputs(tmp: &Path, name: &str) -> PathBuf {
    let base = PathBuf::from("tests/fixtures/import").join(name);
    if !name.starts_with("bench/") {
        return base.with_extension("inputs.safetensors");
    }
    let imp = kiln::import::open(&base.with_extension("pt2")).unwrap_or_else(|e| panic!("{e}"));
    let g = &imp.graph;
    let names = kiln::functionalize::text::Names::of(g);
    let ins = random_inputs(g, 7, 1.0);
    let user: Vec<(String, RTensor)> = g
        .inputs
        .iter()
        .zip(ins)
        .enumerate()
        .filter(|(i, _)| !imp.is_weight(*i))
        .map(|(_, (&v, t))| (names.get(v), t))
        .collect();
    let path = tmp.join(format!("{}.inputs.safetensors", name.replace('/', "_")));
    kiln::io::save_all(&path, &user).unwrap();
    path
}

/// Imported `torch.export` models: import and compile time, kernels, bytes
/// against the minimum, and a run with the weights as session constants
/// beside PyTorch eager running the same exported program on the CPU.
fn import_section(md: &mut String, session: &Session, tmp: &Path, torch: &Value) {
    eprintln!("imported models ...");
    let _ = writeln!(md, "\n## 9. Imported models (`.pt2`)\n");
    let _ = writeln!(md, "`torch.export` archives of `tests/fixtures/import/` (small widths, random weights; `docs/import.md`). Import = reading and checking the archive and converting its graph (best of 3); compile = `Session::compile` with the weights as constants; run figures as in section 4 (the weights uploaded once, the user inputs per run). PyTorch eager: the same model (built again by `tests/torch_ref/make_import_fixtures.py`, same weights) on the same inputs, CPU, best of 5. `conv2d_64x56` is one 3x3 convolution, 64 -> 64 channels, 56 x 56, batch 1 ({:.0} MFLOP).\n", CONV_FLOPS / 1e6);
    let _ = writeln!(md, "| model | import ms | compile ms | kernels | bytes moved | minimum | moved / min | pipelines | kernels ms | GFLOP/s | GB/s | full ms | full / kernels | uploaded B | read back B | PyTorch eager ms | Kiln / PyTorch time |");
    let _ = writeln!(
        md,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    let mut conv = None;
    for name in IMPORTED {
        let base = PathBuf::from("tests/fixtures/import").join(name);
        let pt2 = base.with_extension("pt2");
        let row = (|| -> Result<String, String> {
            let t = Instant::now();
            let mut imp = kiln::import::open(&pt2).map_err(|e| e.to_string())?;
            let mut import_ms = t.elapsed().as_secs_f64() * 1e3;
            for _ in 0..2 {
                let t = Instant::now();
                imp = kiln::import::open(&pt2).map_err(|e| e.to_string())?;
                import_ms = import_ms.min(t.elapsed().as_secs_f64() * 1e3);
            }
            let g = &imp.graph;
            let p = compile_with(g, &session.gpu().compile_options()).map_err(|e| e.to_string())?;
            // Constants are named per model: the session holds them all.
            let names = kiln::functionalize::text::Names::of(g);
            let mut renamed = g.clone();
            for (i, &v) in g.inputs.iter().enumerate() {
                if imp.is_weight(i) {
                    let n = names.get(v);
                    let c = format!("{name}.{n}");
                    let w = imp.weights.get(&n).ok_or(format!("weight {n}"))?;
                    session.add_constant(&c, &w).map_err(|e| e.to_string())?;
                    renamed.values[v].name = Some(c.into());
                }
            }
            let t = Instant::now();
            let exe = session.compile(&renamed).map_err(|e| e.to_string())?;
            let compile_ms = t.elapsed().as_secs_f64() * 1e3;
            let file = kiln::io::MappedTensors::open(&import_inputs(tmp, name))
                .map_err(|e| e.to_string())?;
            let ins = file
                .inputs_for(g, &|i| imp.is_weight(i))
                .map_err(|e| e.to_string())?;
            let pr = profile(session, &exe, &ins, 10, compile_ms).map_err(|e| e.to_string())?;
            let tt = torch_s(torch, &["imports", name, "eager_s"]);
            if name.starts_with("bench/") {
                conv = Some((pr.kernels_ms, tt.clone()));
            }
            Ok(format!(
                "| {name} | {import_ms:.1} | {compile_ms:.0} | {} | {} | {} | {} | {} | {} | {} |",
                p.kernels.len(),
                p.bytes_moved(),
                p.min_bytes,
                ratio(p.bytes_moved() as f64, p.min_bytes as f64),
                runtime_cells(&pr),
                cell(tt.clone(), 1e3, 3),
                tt.map_or("-".into(), |t| ratio(pr.full_ms / 1e3, t)),
            ))
        })();
        let _ = writeln!(
            md,
            "{}",
            row.unwrap_or_else(|e| format!("| {name} | error: {e} |"))
        );
    }
    if let Some((ms, t)) = conv {
        let _ = writeln!(
            md,
            "\nconv2d 3x3, 64 -> 64, 56 x 56: Kiln {:.1} GFLOP/s on this adapter (kernels time), PyTorch `conv2d` {} GFLOP/s on this machine's CPU ({} threads).",
            CONV_FLOPS / 1e9 / (ms.max(1e-9) * 1e-3),
            t.map_or("-".into(), |t| format!("{:.1}", CONV_FLOPS / 1e9 / t)),
            torch["threads"].as_u64().map_or("?".into(), |n| n.to_string()),
        );
    }
}

/// The elementwise chain at growing sizes, in GB/s.
fn chain_section(md: &mut String, session: &Session, torch: &Value) {
    let gpu = session.gpu();
    eprintln!("elementwise chain ...");
    let _ = writeln!(
        md,
        "\n### Elementwise chain `tanh(x * 2 + 1) * 0.5 - x` (f32)\n"
    );
    let _ = writeln!(md, "GB/s = (bytes read + written, 8 per element) / time. Kiln: GPU time of the kernels (median of 5, {}); the 64M-element input is larger than lavapipe's 128 MiB binding limit and is bound in pieces. PyTorch: best of 5 calls.\n",
        if gpu.has_timestamps() { "timestamp queries" } else { "wall time around submit and wait" });
    let _ = writeln!(md, "| elements | Kiln ms | Kiln GB/s | PyTorch eager ms | eager GB/s | torch.compile ms | compile GB/s |");
    let _ = writeln!(md, "|---:|---:|---:|---:|---:|---:|---:|");
    for n in CHAIN_SIZES {
        let src = format!(
            "graph chain(%x: f32[{n}]) {{\n  %a = mul(%x, 2.0)\n  %b = add(%a, 1.0)\n  %c = tanh(%b)\n  %d = mul(%c, 0.5)\n  %e = sub(%d, %x)\n  return %e\n}}"
        );
        let g = parse(&src).unwrap();
        let bytes = (n * 8) as f64;
        let x: Vec<f32> = (0..n).map(|i| (i % 1000) as f32 / 1000.0).collect();
        let x = HostTensor::from_slice(&[n], &x).unwrap();
        let kiln = session
            .compile(&g)
            .and_then(|exe| profile(session, &exe, std::slice::from_ref(&x), 5, 0.0))
            .map(|p| p.kernels_ms / 1e3)
            .map_err(|e| e.to_string());
        let gbs = |r: &Result<f64, String>| match r {
            Ok(s) => format!("{:.2}", bytes / s / 1e9),
            Err(_) => "-".into(),
        };
        let e = torch_s(torch, &["chain", &n.to_string(), "eager_s"]);
        let c = torch_s(torch, &["chain", &n.to_string(), "compile_s"]);
        let _ = writeln!(
            md,
            "| {n} | {} | {} | {} | {} | {} | {} |",
            cell(kiln.clone(), 1e3, 2),
            gbs(&kiln),
            cell(e.clone(), 1e3, 2),
            gbs(&e),
            cell(c.clone(), 1e3, 2),
            gbs(&c),
        );
    }
}

/// The transposed chain (examples/programs/transposed_chain.txt) at 4096 x
/// 4096 beside the same chain without the transpose (`mul(x, 1.0)` in its
/// place), tiled and untiled (`tile_transposes` on and off): what a
/// transposed read costs.
fn transposed_chain_section(md: &mut String, session: &Session, torch: &Value) {
    eprintln!("transposed chain ...");
    let n = TRANSPOSED_CHAIN_SIDE;
    let (src, plain) = transposed_chain_programs(n);
    let _ = writeln!(md, "\n### Transposed chain (f32, {n} x {n})\n");
    let _ = writeln!(md, "`examples/programs/transposed_chain.txt` at {n} x {n}: `x.t()` plus a broadcast row, then 8 elementwise ops (tanh, sigmoid, exp among them), one kernel at the minimum bytes either way. Plain: the same chain with `mul(x, 1.0)` for the transpose. Tiled: `tile_transposes` on (the transpose staged through workgroup memory in square tiles); untiled: off, either in blocks (`transpose_blocks`: an invocation computes 4 columns of 8 rows, reading each column's rows as vectors of the source) or element by element (each invocation reads its transposed elements directly). GB/s = 8 bytes per element (the row aside) over the GPU time of the kernels: {CHAIN_ROUNDS} rounds of every row in turn, each row's time the median of its rounds (the median of 3 runs each), its ratio to plain the median of its ratios to the plain chain of the same round. PyTorch: best of 5 calls on the same inputs.\n");
    let _ = writeln!(
        md,
        "| chain | Kiln ms | Kiln GB/s | / plain | PyTorch eager ms | torch.compile ms |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|");
    let xs: Vec<f32> = (0..n * n).map(|i| (i % 1000) as f32 / 1000.0).collect();
    let bs: Vec<f32> = (0..n).map(|i| (i % 7) as f32 / 7.0).collect();
    let ins = [
        HostTensor::from_slice(&[n, n], &xs).unwrap(),
        HostTensor::from_slice(&[n], &bs).unwrap(),
    ];
    let tiling = |tile_transposes, transpose_blocks| {
        Session::with_options(
            session.gpu().clone(),
            kiln::engine::CompileOptions {
                tile_transposes,
                transpose_blocks,
                ..session.compile_options().clone()
            },
        )
    };
    let (tiled, blocks, untiled) = (
        tiling(true, false),
        tiling(false, true),
        tiling(false, false),
    );
    let own = session.compile_options();
    let chosen = |tiles: bool, in_blocks: bool| {
        if own.tile_transposes == tiles && (tiles || own.transpose_blocks == in_blocks) {
            " (this adapter's choice)"
        } else {
            ""
        }
    };
    let compile = |s: &Session, src: &str| -> Result<_, String> {
        let g = parse(src).map_err(|e| e.to_string())?;
        s.compile(&g).map_err(|e| e.to_string())
    };
    let rows = [
        (
            format!("transposed, tiled{}", chosen(true, false)),
            compile(&tiled, &src).map(|e| (&tiled, e)),
            "transposed",
        ),
        (
            format!("transposed, untiled, in blocks{}", chosen(false, true)),
            compile(&blocks, &src).map(|e| (&blocks, e)),
            "transposed",
        ),
        (
            format!(
                "transposed, untiled, element by element{}",
                chosen(false, false)
            ),
            compile(&untiled, &src).map(|e| (&untiled, e)),
            "transposed",
        ),
        (
            "plain".to_string(),
            compile(session, &plain).map(|e| (session, e)),
            "plain",
        ),
    ];
    // Rounds of every row in turn: this machine's speed drifts by a third
    // within minutes, so each row's ratio is the median of its ratios to
    // the plain chain of the same round.
    let mut secs: Vec<Result<Vec<f64>, String>> = rows
        .iter()
        .map(|(_, e, _)| e.as_ref().map(|_| vec![]).map_err(|e| e.clone()))
        .collect();
    for _ in 0..CHAIN_ROUNDS {
        for ((_, exe, _), t) in rows.iter().zip(&mut secs) {
            if let (Ok((s, exe)), Ok(v)) = (exe, t.as_mut()) {
                match profile(s, exe, &ins, 3, 0.0) {
                    Ok(p) => v.push(p.kernels_ms / 1e3),
                    Err(e) => *t = Err(e.to_string()),
                }
            }
        }
    }
    let plain_s = secs[rows.len() - 1].clone();
    let bytes = (n * n * 8) as f64;
    for ((name, _, key), t) in rows.iter().zip(&secs) {
        let ratio = match (t, &plain_s) {
            (Ok(a), Ok(b)) => format!(
                "{:.2}",
                median(a.iter().zip(b).map(|(a, b)| a / b).collect())
            ),
            _ => "-".into(),
        };
        let r = t.clone().map(median);
        let gbs = r
            .as_ref()
            .map_or("-".into(), |s| format!("{:.2}", bytes / s / 1e9));
        let _ = writeln!(
            md,
            "| {name} | {} | {gbs} | {ratio} | {} | {} |",
            cell(r.clone(), 1e3, 1),
            cell(
                torch_s(torch, &["transposed_chain", key, "eager_s"]),
                1e3,
                1
            ),
            cell(
                torch_s(torch, &["transposed_chain", key, "compile_s"]),
                1e3,
                1
            ),
        );
    }
}

/// Rounds of the transposed chain's rows (`transposed_chain_section`).
const CHAIN_ROUNDS: usize = 5;

/// The transposed chain's program at `n` x `n`, and the same without the
/// transpose.
fn transposed_chain_programs(n: usize) -> (String, String) {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/programs/transposed_chain.txt"),
    )
    .unwrap();
    let src = text
        .replace("f32[40, 48]", &format!("f32[{n}, {n}]"))
        .replace("f32[40]", &format!("f32[{n}]"));
    let plain = src.replace("%t = t(%x)", "%t = mul(%x, 1.0)");
    assert!(
        src != text && plain != src,
        "transposed_chain.txt changed shape"
    );
    (src, plain)
}

/// Section 5: MiniLM per batch, beside sentence-transformers; the model,
/// weights uploaded, for the sections after.
fn minilm_section(md: &mut String, session: &Session, w: &Workloads, torch: &Value) -> MiniLm {
    let software = session.gpu().info.device_type == wgpu::DeviceType::Cpu;
    eprintln!("MiniLM ...");
    let _ = writeln!(md, "\n## 5. MiniLM (all-MiniLM-L6-v2)\n");
    let _ = writeln!(md, "Kiln: one `Session`; the weights are uploaded once as constants (straight from the memory-mapped file), each bucket compiles once (compile = trace + functionalize + schedule + codegen + pipelines) and a run uploads the token ids and the mask and reads back only the embeddings. Figures as in section 4 (median of 3 runs, 1 for the padded row). PyTorch: sentence-transformers `encode` (tokenization included) on the CPU.\n");
    let _ = writeln!(md, "Kernels: launches a forward on this adapter; GPU-class: the same model as a GPU compiles it (`CompileOptions::default()`: attention in one kernel, WebGPU's 8 storage buffers a kernel; what browser exports run).\n");
    let _ = writeln!(md, "| batch x tokens | kernels | GPU-class | pipelines | kernels ms | GFLOP/s | GB/s | full ms | full / kernels | uploaded B | read back B | compile s | Kiln sentences/s | PyTorch sentences/s | Kiln / PyTorch throughput |");
    let _ = writeln!(
        md,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    let mut model = MiniLm::load(&w.model_dir).expect("loads");
    model.upload_weights(session).expect("uploads the weights");
    for (b, padded) in w.batches.iter().map(|&b| (b, false)).chain([(32, true)]) {
        let texts: Vec<&str> = (0..b).map(|i| SENTENCES[i % SENTENCES.len()]).collect();
        let ids: Vec<Vec<u32>> = texts.iter().map(|t| model.tokenize(t).unwrap()).collect();
        let (_, mut seq) = MiniLm::bucket_of(&ids);
        if padded {
            seq = kiln::minilm::MAX_LEN;
        }
        let [id, mask] = MiniLm::token_inputs(&ids, b, seq).unwrap();
        let t = Instant::now();
        let g = model.graph(b, seq).unwrap().clone();
        let exe = session.compile(&g).unwrap();
        let compile_s = t.elapsed().as_secs_f64();
        let gpu_class = kiln::engine::compile(&g)
            .map_or_else(|e| format!("({e})"), |p| p.kernels.len().to_string());
        let runs = if b * seq > 1024 { 1 } else { 3 };
        let pr = profile(session, &exe, &[id, mask], runs, compile_s * 1e3).unwrap();
        let sps = b as f64 / (pr.full_ms / 1e3);
        let ts = if padded {
            Err(format!("not run at {} tokens", kiln::minilm::MAX_LEN))
        } else {
            torch_s(torch, &["minilm", &b.to_string(), "eager_s"])
        };
        let _ = writeln!(
            md,
            "| {b} x {seq} | {} | {gpu_class} | {} | {compile_s:.3} | {sps:.2} | {} | {} |",
            exe.program.kernels.len(),
            runtime_cells(&pr),
            ts.clone()
                .map_or_else(|e| format!("n/a ({e})"), |t| format!("{:.2}", b as f64 / t)),
            ts.map_or("-".into(), |t| ratio(sps, b as f64 / t)),
        );
    }
    if software {
        let _ = writeln!(md, "\nOn a software adapter every Kiln time above is lavapipe running the shaders on the same CPU cores PyTorch uses: the ratios compare two CPU implementations, not a GPU with a CPU.");
    }
    model
}

/// The program's loss: the sum of every element of every floating output
/// (`None` without a floating parameter and output).
fn loss_program(g: &Graph) -> Option<Graph> {
    use kiln::functionalize::schema::Arg;
    let floats = |v| g.meta(v).dtype.is_float();
    if !g.inputs.iter().any(|&v| floats(v)) {
        return None;
    }
    let mut l = g.clone();
    let (sum, add, cast) = (
        kiln::functionalize::ops::lookup("sum")?,
        kiln::functionalize::ops::lookup("add")?,
        kiln::functionalize::ops::lookup("_to_copy")?,
    );
    let mut total = None;
    for &o in g.outputs.iter().filter(|&&o| floats(o)) {
        let s = l.call(sum, &[Arg::Tensor(o)]).ok()?[0];
        let s = l
            .call(
                cast,
                &[Arg::Tensor(s), Arg::Dtype(kiln::functionalize::DType::F32)],
            )
            .ok()?[0];
        total = Some(match total {
            None => s,
            Some(t) => l.call(add, &[Arg::Tensor(t), Arg::Tensor(s)]).ok()?[0],
        });
    }
    l.outputs = vec![total?];
    Some(l)
}

/// Section 8: `grad` against `make_fx(torch.func.grad(f))`, and a training
/// step on the GPU against PyTorch eager.
fn transforms_section(
    md: &mut String,
    losses: &[(String, Graph)],
    torch: &Value,
    session: &Session,
) {
    eprintln!("transforms ...");
    let _ = writeln!(md, "\n## 8. Transforms\n");
    let _ = writeln!(md, "`grad` of a loss (the sum of every floating output) with respect to every floating parameter: Kiln `transform::grad` on the parsed program (functionalization included; best of several runs) against `make_fx(torch.func.grad(f, argnums=...))` tracing the same program (one run). Statements: the source program's; nodes: the gradient program's statements (Kiln) and the traced graph's `call_function` nodes (PyTorch).\n");
    let _ = writeln!(md, "| program | statements | Kiln ms | Kiln statements/s | Kiln nodes | PyTorch ms | PyTorch nodes | PyTorch / Kiln time |");
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|---:|---:|");
    for (name, g) in losses {
        let n = g.order.len();
        let (r, t) = {
            let start = Instant::now();
            let r = kiln::functionalize::transform::grad(g, None, false);
            let first = start.elapsed().as_secs_f64();
            let t = if first < 0.5 {
                best(5, 2.0, || {
                    drop(kiln::functionalize::transform::grad(g, None, false))
                })
            } else {
                first
            };
            (r, t)
        };
        let row = &torch[name.as_str()];
        let tms = row["s"].as_f64();
        let (kms, knodes) = match &r {
            Ok(gr) => (format!("{:.2}", t * 1e3), gr.order.len().to_string()),
            Err(e) => (
                format!("refused: {}", e.to_string().lines().next().unwrap_or("")),
                "-".into(),
            ),
        };
        let _ = writeln!(
            md,
            "| {name} | {n} | {kms} | {:.0} | {knodes} | {} | {} | {} |",
            n as f64 / t,
            tms.map_or_else(
                || row["error"]
                    .as_str()
                    .unwrap_or("-")
                    .chars()
                    .take(80)
                    .collect(),
                |s| format!("{:.1}", s * 1e3)
            ),
            row["nodes"].as_i64().map_or("-".into(), |x| x.to_string()),
            tms.map_or("-".into(), |s| ratio(s, t)),
        );
    }
    let steps = 50;
    let step = train_mlp::step_program(0.5).unwrap();
    let _ = writeln!(md, "\nTraining step (`examples/train_mlp.rs`: a 8-32-4 MLP, batch 64, cross-entropy, `grad` then `sub_` on the weights, weights kept on the device, the loss read back every step), mean of {steps} steps:\n");
    let _ = writeln!(md, "| | ms per step | final loss |");
    let _ = writeln!(md, "|---|---:|---:|");
    match train_mlp::train_gpu(session, &step, steps) {
        Ok((l, ms)) => {
            let _ = writeln!(
                md,
                "| Kiln, GPU ({}) | {ms:.3} | {:.6} |",
                session.gpu().info.name,
                l[steps - 1]
            );
        }
        Err(e) => {
            let _ = writeln!(md, "| Kiln, GPU | failed: {e} | |");
        }
    }
    match train_mlp::train_torch(steps, 0.5, &std::env::temp_dir()) {
        Ok((l, ms)) => {
            let _ = writeln!(md, "| PyTorch eager, CPU | {ms:.3} | {:.6} |", l[steps - 1]);
        }
        Err(e) => {
            let _ = writeln!(md, "| PyTorch eager, CPU | not available: {e} | |");
        }
    }
    let _ = writeln!(
        md,
        "| PyTorch CUDA | not measured (no GPU machine in this run) | |"
    );
}

/// The size of `bytes` gzipped at level 6 (what a web server sends).
fn gzipped(bytes: &[u8]) -> usize {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(6));
    e.write_all(bytes).expect("writing to memory");
    e.finish().expect("writing to memory").len()
}

/// Section 6: MiniLM at 8 x 16 written to a file (f32, f16 and int8 weights),
/// then from the file to the first result on a fresh session.
fn export_section(md: &mut String, model: &mut MiniLm, tmp: &Path) {
    use kiln::engine::export::{self, ExportOptions, WeightsDtype};
    use kiln::engine::{Fetch, Input};
    eprintln!("export ...");
    let (b, texts) = (8, &SENTENCES[..]);
    let ids: Vec<Vec<u32>> = (0..b)
        .map(|i| model.tokenize(texts[i % texts.len()]).unwrap())
        .collect();
    let (_, seq) = MiniLm::bucket_of(&ids);
    let [id, mask] = MiniLm::token_inputs(&ids, b, seq).unwrap();
    let _ = writeln!(md, "\n## 6. Export (MiniLM, {b} x {seq} tokens)\n");
    let _ = writeln!(md, "`minilm --export` / `kiln export`: one file, every weight a constant (`docs/export-format.md`). From file to first result: a new session (device), `export::read` (checksums, the manifest, the program text parsed, every shader validated by naga), `load_exported` (constants uploaded, pipelines made) and one run with a read-back; cold: after dropping the page cache. Compile: the same on a new session from the traced model (weights uploaded as constants, then trace + functionalize + schedule + codegen + pipelines), no file. Cosine: the f16- and int8-weights files' embeddings against the f32 file's (the lowest of the batch). The last row also computes in f16 (`--arithmetic f16`: activations f16, products and reductions accumulating in f32; its kernels' f16 conversions in the adapter's instructions where it has `shader-f16`). Gzipped: the file through `gzip -6` (`flate2`), what a server sending it compressed sends.\n");
    let _ = writeln!(md, "| weights | file MB | gzipped MB | file to first result, warm ms | cold ms | of which read + load ms | compile instead, ms | min cosine to f32 |");
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|---:|---:|");
    let gpu = Session::open().unwrap().gpu().clone();
    let first = |path: &Path| -> (f64, f64, Vec<f32>) {
        let t = Instant::now();
        let s = Session::new(gpu.clone());
        let bytes = std::fs::read(path).unwrap();
        let e = export::read(&bytes).unwrap();
        let exe = s.load_exported(&e).unwrap();
        let load = t.elapsed().as_secs_f64() * 1e3;
        let r = s
            .run(
                &exe,
                &[Input::Host(&id), Input::Host(&mask)],
                &exe.options(Fetch::Host, Fetch::Skip),
            )
            .unwrap();
        let out = r
            .outputs
            .into_iter()
            .next()
            .unwrap()
            .host()
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        (t.elapsed().as_secs_f64() * 1e3, load, out)
    };
    let compile_ms = {
        let t = Instant::now();
        let s = Session::new(gpu.clone());
        model.upload_weights(&s).unwrap();
        let g = model.graph(b, seq).unwrap().clone();
        let exe = s.compile(&g).unwrap();
        let _ = s.run(
            &exe,
            &[Input::Host(&id), Input::Host(&mask)],
            &exe.options(Fetch::Host, Fetch::Skip),
        );
        t.elapsed().as_secs_f64() * 1e3
    };
    let mut f32_emb: Vec<f32> = vec![];
    // The last row computes in f16 too (`minilm --arithmetic f16`).
    for (dt, arith) in [
        (WeightsDtype::F32, DType::F32),
        (WeightsDtype::F16, DType::F32),
        (WeightsDtype::I8, DType::F32),
        (WeightsDtype::F16, DType::F16),
    ] {
        model.set_arithmetic(arith).unwrap();
        let path = tmp.join(format!("minilm_{}_{arith}.kiln", dt.name()));
        let s = Session::new(gpu.clone());
        let bytes = model
            .export(
                &s,
                b,
                seq,
                &ExportOptions {
                    weights_dtype: dt,
                    ..Default::default()
                },
            )
            .unwrap();
        std::fs::write(&path, &bytes).unwrap();
        let (warm, load, emb) = {
            let _ = first(&path);
            first(&path)
        };
        // Dropping the page cache needs root; without it, say so.
        let cold = std::fs::write("/proc/sys/vm/drop_caches", "3")
            .ok()
            .map(|_| first(&path).0);
        model.set_arithmetic(DType::F32).unwrap();
        let cos = if dt != WeightsDtype::F32 {
            (0..b)
                .map(|i| {
                    let (x, y) = (
                        &f32_emb[i * 384..(i + 1) * 384],
                        &emb[i * 384..(i + 1) * 384],
                    );
                    let n = |v: &[f32]| v.iter().map(|a| a * a).sum::<f32>().sqrt();
                    x.iter().zip(y).map(|(a, c)| a * c).sum::<f32>() / (n(x) * n(y))
                })
                .fold(1f32, f32::min)
                .to_string()
        } else {
            f32_emb = emb;
            "1 (itself)".into()
        };
        let _ = writeln!(
            md,
            "| {} | {:.1} | {:.1} | {warm:.0} | {} | {load:.0} | {compile_ms:.0} | {cos} |",
            if arith == DType::F16 {
                "f16, f16 arithmetic".to_string()
            } else {
                dt.name().to_string()
            },
            bytes.len() as f64 / 1e6,
            gzipped(&bytes) as f64 / 1e6,
            cold.map_or("n/a (needs root)".into(), |c| format!("{c:.0}")),
        );
    }
    // The binaries, stripped copies measured where `strip` exists.
    let size = |name: &str| -> String {
        let p = Path::new("target/release").join(name);
        if !p.exists() && name == "kiln-run" {
            // `cargo bench` builds only this package's binaries.
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let _ = std::process::Command::new(cargo)
                .args(["build", "--release", "-p", "kiln-runtime"])
                .status();
        }
        if !p.exists() {
            return format!(
                "n/a (not built: cargo build --release -p {})",
                if name == "kiln" {
                    "kiln"
                } else {
                    "kiln-runtime"
                }
            );
        }
        let copy = tmp.join(format!("{name}.stripped"));
        let stripped = std::fs::copy(&p, &copy).is_ok()
            && std::process::Command::new("strip")
                .arg(&copy)
                .status()
                .is_ok_and(|s| s.success());
        let f = if stripped { &copy } else { &p };
        let mb = std::fs::metadata(f).map_or(0.0, |m| m.len() as f64 / 1e6);
        format!("{mb:.1} MB{}", if stripped { " stripped" } else { "" })
    };
    let _ = writeln!(
        md,
        "\nBinaries: `kiln-run` (the runtime alone: loader, session, wgpu; the engine without its `compiler` feature) {}; the `kiln` CLI {}.",
        size("kiln-run"),
        size("kiln")
    );
}

/// Section 7: the web page (`scripts/web.sh bench`: headless Chromium with
/// WebGPU, per model variant) beside the native run of the same files.
fn web_section(md: &mut String, model: &MiniLm) {
    eprintln!("web ...");
    let _ = writeln!(
        md,
        "\n## 7. In the browser (MiniLM exports of `scripts/web.sh build`, per variant)\n"
    );
    let _ = writeln!(md, "Browser: `scripts/web.sh bench` (`tests/web/bench.mjs`): the demo page in headless Chromium with `--enable-unsafe-webgpu`, served from localhost, once per model variant (`?variant=NAME`; the page's variants of this adapter's class and the same with f32 weights, exported for the benchmark only), each in a fresh browser profile. First result: the variant's files (downloaded when cold, from Cache Storage when warm), wasm instantiated, every bucket checked and loaded (weights uploaded, pipelines made), then one query embedded. Per query: `embed` of 1 and of 32 sentences of at most 16 and 128 tokens (the page's bucket choice and tokenization included), best of 3 where a run takes under 20 s. Native: the same files on this machine's adapter through the engine (a new session, `export::read_with`, `load_exported` of every bucket, one query; then the same sentences bucketed as the page buckets them), best of 3.\n");
    // `KILN_WEB_BENCH=FILE`: the browser side from an earlier
    // `scripts/web.sh bench >FILE` (the same files must still be in
    // web/dist).
    let web: Result<Value, String> = match std::env::var("KILN_WEB_BENCH") {
        Ok(f) => std::fs::read(&f)
            .map_err(|e| format!("{f}: {e}"))
            .and_then(|b| serde_json::from_slice(&b).map_err(|e| format!("{f}: {e}"))),
        Err(_) => match std::process::Command::new("scripts/web.sh")
            .arg("bench")
            .stderr(std::process::Stdio::inherit())
            .output()
        {
            Ok(o) if o.status.success() => {
                serde_json::from_slice(&o.stdout).map_err(|e| e.to_string())
            }
            Ok(o) => Err(format!("scripts/web.sh bench failed ({})", o.status)),
            Err(e) => Err(format!("cannot run scripts/web.sh: {e}")),
        },
    };
    let web = match web {
        Ok(v) => v,
        Err(e) => {
            let _ = writeln!(md, "n/a: {e}");
            return;
        }
    };
    let texts = |len: &str| -> Vec<String> {
        web["texts"][len]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|t| t.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    let (short, long) = (texts("16"), texts("128"));
    let gpu = Session::open().unwrap().gpu().clone();
    let _ = writeln!(md, "| variant | weights | arithmetic | download MB (gzipped) | where | first result cold ms | warm ms (download + GPU) | 1 x 16 ms | 32 x 16 ms | 1 x 128 ms | 32 x 128 ms |");
    let _ = writeln!(md, "|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|");
    let ms = |v: &Value| v.as_f64().map_or("n/a".into(), |x| format!("{x:.0}"));
    for row in web["variants"].as_array().into_iter().flatten() {
        let name = row["name"].as_str().unwrap_or("?");
        let head = format!(
            "| {name} | {} | {} | {:.1} ({:.1})",
            row["weights"].as_str().unwrap_or("?"),
            row["arithmetic"].as_str().unwrap_or("?"),
            row["bytes"].as_f64().unwrap_or(0.0) / 1e6,
            row["gzip_bytes"].as_f64().unwrap_or(0.0) / 1e6,
        );
        if let Some(e) = row["error"].as_str() {
            let _ = writeln!(md, "{head} | browser | {e} | | | | | |");
            continue;
        }
        let q = |k: &str| match row["skipped"][k].as_str() {
            Some(why) => format!("skipped ({why})"),
            None => ms(&row["queries"][k]),
        };
        let _ = writeln!(
            md,
            "{head} | browser | {} | {} ({} + {}) | {} | {} | {} | {} |",
            ms(&row["cold"]["first_result_ms"]),
            ms(&row["warm"]["first_result_ms"]),
            ms(&row["warm"]["download_ms"]),
            ms(&row["warm"]["prepare_ms"]),
            q("1x16"),
            q("32x16"),
            q("1x128"),
            q("32x128"),
        );
        match native_variant(&gpu, model, row, &short, &long) {
            Ok(n) => {
                let _ = writeln!(
                    md,
                    "| | | | | native | - | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |",
                    n[0], n[1], n[2], n[3], n[4]
                );
            }
            Err(e) => {
                let _ = writeln!(md, "| | | | | native | {e} | | | | | |");
            }
        }
    }
    let kb = |k: &str| {
        web[k]
            .as_f64()
            .map_or("n/a".into(), |x| format!("{:.0} KB", x / 1e3))
    };
    let _ = writeln!(
        md,
        "\nBrowser adapter: {}; native adapter: {}. Every variant also downloads the wasm module {} ({} gzipped) and the JavaScript {} ({} gzipped). Sentences: the page's own words cut to at most 16 tokens (mean {:.1}) and 128 (mean {:.1}), [CLS] and [SEP] included; a query of 32 sentences the browser would take longer than `KILN_BENCH_MAX_S` (300 s) for, estimated from its single sentence, is skipped.",
        web["adapter"].as_str().unwrap_or("?"),
        gpu.describe(),
        kb("wasm_bytes"),
        kb("wasm_gzip_bytes"),
        kb("js_bytes"),
        kb("js_gzip_bytes"),
        mean_tokens(model, &short),
        mean_tokens(model, &long),
    );
}

fn mean_tokens(model: &MiniLm, texts: &[String]) -> f64 {
    let n: usize = texts
        .iter()
        .map(|t| model.tokenize(t).map_or(0, |v| v.len()))
        .sum();
    n as f64 / texts.len().max(1) as f64
}

/// A variant of section 7 natively: [first result, 1 x 16, 32 x 16,
/// 1 x 128, 32 x 128] in ms on the files the page downloads.
fn native_variant(
    gpu: &std::sync::Arc<kiln::engine::Gpu>,
    model: &MiniLm,
    row: &Value,
    short: &[String],
    long: &[String],
) -> Result<[f64; 5], String> {
    use kiln::engine::export;
    let variants: Value = serde_json::from_slice(
        &std::fs::read("web/dist/bench/models.json").map_err(|e| e.to_string())?,
    )
    .map_err(|e| e.to_string())?;
    let v = variants
        .as_array()
        .and_then(|a| a.iter().find(|v| v["name"] == row["name"]))
        .ok_or("not in web/dist/bench/models.json")?;
    let read = |f: &Value| std::fs::read(Path::new("web/dist").join(f.as_str().unwrap_or("")));
    let load = || -> Result<PageBuckets, String> {
        let weights = read(&v["weights_file"]).map_err(|e| e.to_string())?;
        let session = Session::new(gpu.clone());
        let mut buckets = vec![];
        for f in v["buckets"].as_array().into_iter().flatten() {
            let bytes = read(f).map_err(|e| e.to_string())?;
            let e = export::read_with(&bytes, Some(&weights)).map_err(|e| e.to_string())?;
            let sizes = &e.program.param(0).sizes;
            let (b, t) = (sizes[0], sizes[1]);
            let exe = session.load_exported(&e).map_err(|e| e.to_string())?;
            buckets.push((b, t, exe));
        }
        buckets.sort_by_key(|&(b, t, _)| (t, b));
        Ok(PageBuckets { session, buckets })
    };
    let first = || -> Result<(f64, PageBuckets), String> {
        let t = Instant::now();
        let p = load()?;
        p.embed(model, &["How is the weather today?".to_string()])?;
        Ok((t.elapsed().as_secs_f64() * 1e3, p))
    };
    first()?;
    let (first_ms, p) = first()?;
    let time = |texts: &[String]| best(3, 30.0, || p.embed(model, texts).unwrap()) * 1e3;
    Ok([
        first_ms,
        time(&short[..1.min(short.len())]),
        time(short),
        time(&long[..1.min(long.len())]),
        time(long),
    ])
}

/// An embedder's buckets on one session, embedding as the page does
/// (`Embedder::embed` in web/src/lib.rs): the longest run of sentences some
/// bucket holds, on the bucket of fewest tokens per run that holds it.
struct PageBuckets {
    session: Session,
    buckets: Vec<(usize, usize, kiln::engine::Executable)>,
}

impl PageBuckets {
    fn bucket_for(
        &self,
        n: usize,
        tokens: usize,
    ) -> Option<&(usize, usize, kiln::engine::Executable)> {
        self.buckets
            .iter()
            .filter(|&&(b, t, _)| b >= n && t >= tokens)
            .min_by_key(|&&(b, t, _)| (b * t, t))
    }

    fn embed(&self, model: &MiniLm, texts: &[String]) -> Result<(), String> {
        use kiln::engine::{Fetch, Input};
        let max = self.buckets.iter().map(|b| b.1).max().unwrap_or(0);
        let ids: Vec<Vec<u32>> = texts
            .iter()
            .map(|x| {
                let mut v = model.tokenize(x).map_err(|e| e.to_string())?;
                if v.len() > max {
                    let sep = *v.last().unwrap_or(&0);
                    v.truncate(max - 1);
                    v.push(sep);
                }
                Ok(v)
            })
            .collect::<Result<_, String>>()?;
        let mut start = 0;
        while start < ids.len() {
            let (mut end, mut longest) = (start + 1, ids[start].len());
            while end < ids.len()
                && self
                    .bucket_for(end + 1 - start, longest.max(ids[end].len()))
                    .is_some()
            {
                longest = longest.max(ids[end].len());
                end += 1;
            }
            let (b, t, exe) = self
                .bucket_for(end - start, longest)
                .ok_or("no bucket holds the sentence")?;
            let [id, mask] =
                MiniLm::token_inputs(&ids[start..end], *b, *t).map_err(|e| e.to_string())?;
            self.session
                .run(
                    exe,
                    &[Input::Host(&id), Input::Host(&mask)],
                    &exe.options(Fetch::Host, Fetch::Skip),
                )
                .map_err(|e| e.to_string())?;
            start = end;
        }
        Ok(())
    }
}

/// Today's date (UTC) from the system clock, as YYYY-MM-DD.
fn date() -> String {
    let days = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / 86_400) as i64;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// Why a program's planned peak is above eager's, where that is known and
/// not yet fixed (issue 30 asks for each reason beside its program).
fn above_eager_reason(name: &str) -> Option<&'static str> {
    Some(match name {
        "functional_mutation_forms" => {
            "a WebGPU buffer is whole 4-byte words; a bool tensor of 6 or 15 bytes in eager takes 8 or 16"
        }
        _ => return None,
    })
}
