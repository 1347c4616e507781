//! The `kiln` command line (see `docs/program-format.md`).

use clap::{Parser, Subcommand, ValueEnum};
use kiln::functionalize::{functionalize, interp, parse, print, Graph, Remove};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "kiln",
    version,
    about = "Functionalize tensor programs with views and mutations, and run them"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, ValueEnum)]
enum Backend {
    /// The eager reference interpreter on the CPU (real strides and aliasing).
    Reference,
    /// The wgpu engine.
    Gpu,
}

#[derive(Clone, Copy, ValueEnum)]
enum Mode {
    /// Remove in-place ops; keep views.
    Mutations,
    /// Remove in-place ops and views (every tensor contiguous).
    #[value(name = "mutations_and_views")]
    MutationsAndViews,
}

impl From<Mode> for Remove {
    fn from(m: Mode) -> Remove {
        match m {
            Mode::Mutations => Remove::Mutations,
            Mode::MutationsAndViews => Remove::MutationsAndViews,
        }
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a program on inputs from a safetensors file.
    Run {
        prog: PathBuf,
        /// Safetensors file with one tensor per parameter, by name.
        #[arg(long)]
        inputs: PathBuf,
        /// Where to write `output.N` and the final value of every parameter.
        #[arg(long)]
        output: PathBuf,
        #[arg(long, value_enum, default_value = "reference")]
        backend: Backend,
        /// Functionalize the program first, then run the result.
        #[arg(long, value_enum)]
        functionalize: Option<Mode>,
    },
    /// Compile a program for the GPU and print its kernels and memory plan.
    Compile {
        prog: PathBuf,
        /// Print kernels, bytes moved and the planner's figures.
        #[arg(long)]
        stats: bool,
        /// Print the generated WGSL too.
        #[arg(long)]
        wgsl: bool,
        /// Compile with the choices of the adapter at hand (what `run` and
        /// `profile` compile) instead of a GPU-class target's.
        #[arg(long)]
        adapter: bool,
    },
    /// Compile a program for the GPU at hand, run it and measure: GPU time
    /// per kernel, full run time, bytes uploaded and read back per run.
    Profile {
        prog: PathBuf,
        /// Inputs by parameter name (seeded random values without it).
        #[arg(long)]
        inputs: Option<PathBuf>,
        /// Parameters found here are constants: uploaded once, before the
        /// timed runs, never read back.
        #[arg(long)]
        weights: Option<PathBuf>,
        #[arg(long, default_value_t = 20)]
        runs: usize,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Measure the device's copy bandwidth with hand-written WGSL copies
    /// (the kernel shapes Kiln's elementwise kernels choose between): the
    /// ceiling for memory-bound kernels.
    Bandwidth {
        /// MiB copied (fewer where the device binds less per buffer).
        #[arg(long, default_value_t = 256)]
        mib: u64,
        #[arg(long, default_value_t = 20)]
        runs: usize,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Run a program many times on one session from several threads
    /// (seeded random inputs, or `--inputs`) and report resident and
    /// device memory after a warm-up and at the end, the longest run and
    /// any run whose outputs differed from the first: leaks and stalls.
    Soak {
        prog: PathBuf,
        #[arg(long)]
        inputs: Option<PathBuf>,
        #[arg(long, default_value_t = 100_000)]
        runs: u64,
        #[arg(long, default_value_t = 4)]
        threads: usize,
    },
    /// Print the functionalized program.
    Functionalize {
        prog: PathBuf,
        #[arg(long, value_enum, default_value = "mutations")]
        remove: Mode,
    },
    /// Parse a program and print it back in canonical form.
    Print { prog: PathBuf },
    /// Print the vector-Jacobian product program: parameters, then a
    /// cotangent `%ct_K` per floating output; returns the outputs, then the
    /// gradient of each `--wrt` parameter (`torch.func.vjp`).
    Vjp {
        prog: PathBuf,
        /// Parameters to differentiate, comma separated (default: every
        /// floating point one).
        #[arg(long, value_delimiter = ',')]
        wrt: Option<Vec<String>>,
    },
    /// Print the Jacobian-vector product program: parameters, then a
    /// tangent `%t_NAME` per `--wrt` parameter; returns the outputs, then a
    /// tangent per floating output (`torch.func.jvp`).
    Jvp {
        prog: PathBuf,
        #[arg(long, value_delimiter = ',')]
        wrt: Option<Vec<String>>,
    },
    /// Print the gradient program of a program whose first output is a 0-d
    /// loss (`torch.func.grad`).
    Grad {
        prog: PathBuf,
        #[arg(long, value_delimiter = ',')]
        wrt: Option<Vec<String>>,
        /// Return the program's other outputs after the gradients.
        #[arg(long)]
        has_aux: bool,
    },
    /// Print the batched program (`torch.func.vmap`).
    Vmap {
        prog: PathBuf,
        /// One per parameter: the batch dimension's position (negative
        /// counts from the end) or `none`, comma separated.
        #[arg(long, value_delimiter = ',', allow_hyphen_values = true)]
        in_dims: Vec<String>,
        #[arg(long)]
        batch_size: usize,
        /// One per output (or one for all); default 0.
        #[arg(long, value_delimiter = ',', allow_hyphen_values = true)]
        out_dims: Option<Vec<i64>>,
    },
    /// Compile a program for the GPU at hand into one file with its
    /// weights (parameters found in the weights file become constants).
    Export {
        prog: PathBuf,
        /// Parameters found here become constants (a `.pt2` archive's own
        /// weights without it).
        #[arg(long)]
        weights: Option<PathBuf>,
        #[arg(long)]
        output: PathBuf,
        /// Store f32 weights as f16 (half the file; widened at load), or
        /// as i8 (weights of two dimensions or more: int8 with an f32
        /// scale per output channel, a quarter of the file and of the
        /// device memory, dequantized where kernels load them).
        #[arg(long, value_enum)]
        weights_dtype: Option<WeightsDtype>,
        /// Compile for browsers (WebGPU's default limits, no optional
        /// feature) instead of for this machine's adapter.
        #[arg(long)]
        web: bool,
        /// Keep the weights in a file of this name beside OUTPUT instead
        /// of inside it (format version 3): exports of one model at
        /// several shapes share it, and it is downloaded or read once.
        #[arg(long)]
        weights_file: Option<String>,
    },
    /// Print an export's manifest and program.
    Inspect {
        file: PathBuf,
        /// Print each kernel's WGSL too.
        #[arg(long)]
        wgsl: bool,
        /// Print only what the export needs of an adapter, as JSON (the
        /// manifest's `requires`: features and limits).
        #[arg(long, conflicts_with = "wgsl")]
        requires: bool,
    },
    /// Convert a `torch.export` archive (`.pt2`) into a Kiln program and
    /// a safetensors file of its weights.
    Import {
        model: PathBuf,
        /// Where to write the program (standard output without it).
        #[arg(long)]
        output: Option<PathBuf>,
        /// Where to write the weights (parameters, buffers, constants), by
        /// parameter name.
        #[arg(long)]
        weights_output: Option<PathBuf>,
    },
    /// List the op table: each op's overloads, kind, lowering class and
    /// which rules it has (vjp, jvp, batching, GPU).
    Ops {
        /// As JSON, one object per op.
        #[arg(long)]
        json: bool,
        /// As the Markdown page `docs/ops.md`.
        #[arg(long, conflicts_with = "json")]
        markdown: bool,
        /// The coverage table of docs/import.md: how each op of a core
        /// opset list (`tests/fixtures/core_aten_ops.json`) runs.
        #[arg(long, conflicts_with_all = ["json", "markdown"])]
        core: Option<PathBuf>,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum WeightsDtype {
    F32,
    F16,
    I8,
}

/// Imports a `.pt2` archive.
fn import(path: &Path) -> Result<kiln::import::Imported, String> {
    kiln::import::open(path).map_err(|e| e.to_string())
}

/// Is the file a `.pt2` archive (rather than a program's text)?
fn is_pt2(path: &Path) -> bool {
    path != Path::new("-") && kiln::import::is_pt2(path)
}

/// Reads a program's text; `-` is standard input (the spec's CLI); a
/// `.pt2` archive is imported.
fn read_source(path: &Path) -> Result<String, String> {
    if is_pt2(path) {
        Ok(import(path)?.text)
    } else if path == Path::new("-") {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)
            .map_err(|e| format!("cannot read standard input: {e}"))?;
        Ok(s)
    } else {
        let bytes =
            std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        program_text(path, bytes)
    }
}

/// A file's bytes as a program's text, or an error naming what the file
/// is not, by its content: a `.pt2` archive is a zip (`PK`), an export
/// starts with Kiln's magic, a program is UTF-8 text starting `graph`.
fn program_text(path: &Path, bytes: Vec<u8>) -> Result<String, String> {
    let p = path.display();
    let takes =
        "a program in the text format (`graph NAME(...) { ... }`, docs/program-format.md), \
                 a `.pt2` archive from torch.export.save, or, for `run`, `profile` and \
                 `inspect`, a `.kiln` export";
    if bytes.is_empty() {
        return Err(format!("{p} is empty; Kiln takes {takes}"));
    }
    if bytes.starts_with(&kiln::engine::export::MAGIC) {
        return Err(format!(
            "{p} is a compiled Kiln export: `run`, `profile` and `inspect` take it, other \
             commands need the program (`kiln inspect {p}` prints it)"
        ));
    }
    let head: Vec<String> = bytes.iter().take(8).map(|b| format!("{b:02x}")).collect();
    let pt2 = path.extension().is_some_and(|e| e == "pt2");
    match String::from_utf8(bytes) {
        Ok(text) if !pt2 => Ok(text),
        _ if pt2 => Err(format!(
            "{p} is named `.pt2` but is not a zip archive (it starts with bytes {}, where \
             torch.export.save writes `50 4b 03 04`, \"PK\"): an incomplete download or another \
             format? Kiln takes {takes}",
            head.join(" ")
        )),
        _ => Err(format!(
            "{p} is not text (it starts with bytes {}), nor a zip archive, nor a Kiln export; \
             Kiln takes {takes}",
            head.join(" ")
        )),
    }
}

/// A program and, for a `.pt2` archive, the import (its weights).
fn load(path: &Path) -> Result<(Graph, Option<kiln::import::Imported>), String> {
    if is_pt2(path) {
        let i = import(path)?;
        return Ok((i.graph.clone(), Some(i)));
    }
    Ok((read_program(path)?, None))
}

/// Reads and parses a program (or imports an archive's).
fn read_program(path: &Path) -> Result<Graph, String> {
    if is_pt2(path) {
        return Ok(import(path)?.graph);
    }
    parse(&read_source(path)?).map_err(|e| format!("{}:{e}", path.display()))
}

/// Reads a program, transforms it and prints the result.
fn transformed(
    prog: &Path,
    f: impl FnOnce(&Graph) -> kiln::functionalize::Result<Graph>,
) -> Result<(), String> {
    let g = read_program(prog)?;
    let r = f(&g).map_err(|e| format!("{}:{e}", prog.display()))?;
    print!("{}", print(&r));
    Ok(())
}

fn main_result(cli: Cli) -> Result<(), String> {
    match cli.cmd {
        Cmd::Export {
            prog,
            weights,
            output,
            weights_dtype,
            web,
            weights_file,
        } => {
            let (g, imported) = load(&prog)?;
            let session = if web {
                kiln::engine::Session::open_web_like()
            } else {
                kiln::engine::Session::open()
            }
            .map_err(|e| e.to_string())?;
            let opts = kiln::engine::export::ExportOptions {
                weights_dtype: match weights_dtype {
                    None | Some(WeightsDtype::F32) => kiln::engine::export::WeightsDtype::F32,
                    Some(WeightsDtype::F16) => kiln::engine::export::WeightsDtype::F16,
                    Some(WeightsDtype::I8) => kiln::engine::export::WeightsDtype::I8,
                },
                weights_file,
            };
            let n = match (&weights, &imported) {
                (Some(w), _) => kiln::export::write(&session, &g, w, &output, &opts),
                // The archive's weights, except the buffers the program
                // writes: those stay inputs.
                (None, Some(i)) => i.constants(&g).and_then(|found| {
                    kiln::export::write_found(&session, &g, found, &output, &opts)
                }),
                (None, None) => {
                    Err("--weights is needed (only a .pt2 archive brings its own weights)".into())
                }
            }
            .map_err(|e| format!("{}: {e}", prog.display()))?;
            eprintln!(
                "wrote {} ({n} bytes, for {})",
                output.display(),
                session.gpu().describe()
            );
            Ok(())
        }
        Cmd::Ops {
            json,
            markdown,
            core,
        } => list_ops(json, markdown, core.as_deref()),
        Cmd::Import {
            model,
            output,
            weights_output,
        } => import_cmd(&model, output.as_deref(), weights_output.as_deref()),
        Cmd::Inspect {
            file,
            wgsl,
            requires,
        } => {
            let f = kiln::export::ExportFile::open(&file)?;
            let e = f.read()?;
            if requires {
                let json = serde_json::to_string_pretty(&e.manifest.requires)
                    .map_err(|e| e.to_string())?;
                println!("{json}");
            } else {
                print!("{}", kiln::export::inspect(&e, f.bytes().len(), wgsl));
            }
            Ok(())
        }
        Cmd::Print { prog } => {
            print!("{}", print(&read_program(&prog)?));
            Ok(())
        }
        Cmd::Compile {
            prog,
            stats,
            wgsl,
            adapter,
        } => {
            let g = read_program(&prog)?;
            let options = if adapter {
                kiln::engine::Gpu::new()
                    .map_err(|e| e.to_string())?
                    .compile_options()
            } else {
                kiln::engine::CompileOptions::default()
            };
            let p = kiln::engine::compile_with(&g, &options)
                .map_err(|e| format!("{}: {e}", prog.display()))?;
            if stats || !wgsl {
                print!("{}", p.stats());
            }
            if wgsl {
                // What this adapter runs (its own f16 conversions where it
                // has them).
                for k in &p.kernels {
                    println!(
                        "// ---- {} (grid {:?})\n{}",
                        k.code.label,
                        k.code.grid,
                        k.code.source(options.shader_f16)
                    );
                }
            }
            Ok(())
        }
        Cmd::Profile {
            prog,
            inputs,
            weights,
            runs,
            json,
        } => profile(&prog, inputs.as_deref(), weights.as_deref(), runs, json),
        Cmd::Bandwidth { mib, runs, json } => {
            let gpu = kiln::engine::Gpu::new().map_err(|e| e.to_string())?;
            let p = kiln::probe::copy_probe(&gpu, mib, runs).map_err(|e| e.to_string())?;
            if json {
                println!("{}", p.to_json());
            } else {
                print!("{}", p.table());
            }
            Ok(())
        }
        Cmd::Soak {
            prog,
            inputs,
            runs,
            threads,
        } => soak(&prog, inputs.as_deref(), runs, threads),
        Cmd::Vjp { prog, wrt } => transformed(&prog, |g| {
            kiln::functionalize::transform::vjp(g, wrt.as_deref())
        }),
        Cmd::Jvp { prog, wrt } => transformed(&prog, |g| {
            kiln::functionalize::transform::jvp(g, wrt.as_deref())
        }),
        Cmd::Grad { prog, wrt, has_aux } => transformed(&prog, |g| {
            kiln::functionalize::transform::grad(g, wrt.as_deref(), has_aux)
        }),
        Cmd::Vmap {
            prog,
            in_dims,
            batch_size,
            out_dims,
        } => vmap(&prog, &in_dims, batch_size, out_dims.as_deref()),
        Cmd::Functionalize { prog, remove } => {
            // Each statement is functionalized as soon as it is parsed.
            let (g, f) =
                kiln::functionalize::parse_functionalized(&read_source(&prog)?, remove.into())
                    .map_err(|e| format!("{}:{e}", prog.display()))?;
            let text = f.print().map_err(|e| format!("{}:{e}", prog.display()))?;
            let mut out = std::io::stdout().lock();
            std::io::Write::write_all(&mut out, text.as_bytes())
                .and_then(|()| std::io::Write::flush(&mut out))
                .map_err(|e| format!("cannot write the program: {e}"))?;
            exit_now((g, f))
        }
        Cmd::Run {
            prog,
            inputs,
            output,
            backend,
            functionalize: mode,
        } => run(&prog, &inputs, &output, backend, mode),
    }
}

/// `kiln import`: the program, and its weights by parameter name.
fn import_cmd(model: &Path, output: Option<&Path>, weights: Option<&Path>) -> Result<(), String> {
    // The program as exported, every weight kept (the other commands fold
    // batch norms into convolutions).
    let imp = kiln::import::open_as_exported(model).map_err(|e| e.to_string())?;
    match output {
        Some(p) => std::fs::write(p, &imp.text)
            .map_err(|e| format!("cannot write {}: {e}", p.display()))?,
        None => print!("{}", imp.text),
    }
    if let Some(w) = weights {
        let named: Vec<(String, kiln::engine::HostTensor)> = imp
            .weights
            .iter()
            .map(|(n, t)| (n.to_string(), t))
            .collect();
        kiln::io::save_host(w, &named).map_err(|e| e.to_string())?;
    }
    let params = imp.roles.len();
    let users = imp
        .roles
        .iter()
        .filter(|r| matches!(r, kiln::import::Role::User(_)))
        .count();
    eprintln!(
        "imported {}: {} statements, {} weights, {users} inputs",
        model.display(),
        imp.graph.order.len(),
        params - users
    );
    Ok(())
}

/// `kiln ops`: the op table as text, JSON or Markdown.
fn list_ops(json: bool, markdown: bool, core: Option<&Path>) -> Result<(), String> {
    use kiln::functionalize::ops::catalog;
    if let Some(path) = core {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let (torch, ops) = kiln::import::coverage::parse(&text).map_err(|e| {
            format!(
                "{} is not a core op list as tests/torch_ref/core_aten_ops.py writes it: {e}",
                path.display()
            )
        })?;
        print!("{}", kiln::import::coverage::markdown(&torch, &ops));
        return Ok(());
    }
    if json {
        let mut ops: Vec<serde_json::Value> = catalog::entries()
            .into_iter()
            .map(|e| {
                serde_json::json!({
                    "name": e.name,
                    "overloads": e.overloads,
                    "kind": e.kind,
                    "lowering": e.lowering,
                    "vjp": e.vjp,
                    "jvp": e.jvp,
                    "batching": e.batching,
                    "gpu": e.gpu,
                    "via": e.via,
                })
            })
            .collect();
        // What the import rewrites or refuses, by ATen name.
        for r in kiln::import::REWRITES {
            for name in r.ops {
                ops.push(serde_json::json!({
                    "name": name,
                    "kind": "import rewrite",
                    "how": r.how,
                }));
            }
        }
        for (names, why) in kiln::import::REFUSED {
            for name in *names {
                ops.push(serde_json::json!({
                    "name": name,
                    "kind": "refused",
                    "reason": why,
                }));
            }
        }
        let json = serde_json::to_string_pretty(&ops).map_err(|e| e.to_string())?;
        println!("{json}");
    } else if markdown {
        print!("{}", catalog::markdown());
    } else {
        print!("{}", catalog::text());
    }
    Ok(())
}

/// `kiln vmap`: `--in-dims` parsed (integers or `none`), then the transform.
fn vmap(
    prog: &Path,
    in_dims: &[String],
    batch_size: usize,
    out_dims: Option<&[i64]>,
) -> Result<(), String> {
    let dims = in_dims
        .iter()
        .map(|d| match d.trim() {
            "none" => Ok(None),
            x => x
                .parse::<i64>()
                .map(Some)
                .map_err(|_| format!("--in-dims: `{x}` is neither an integer nor `none`")),
        })
        .collect::<Result<Vec<_>, String>>()?;
    transformed(prog, |g| {
        kiln::functionalize::transform::vmap(g, &dims, batch_size, out_dims)
    })
}

/// An error unless `path` can be opened: files named on the command line
/// are checked before the adapter opens and shaders compile.
fn readable(path: &Path) -> Result<(), String> {
    std::fs::File::open(path)
        .map(drop)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))
}

/// `kiln run`: an export (on the GPU or the reference), or a program.
fn run(
    prog: &Path,
    inputs: &Path,
    output: &Path,
    backend: Backend,
    mode: Option<Mode>,
) -> Result<(), String> {
    readable(inputs)?;
    if kiln::export::is_export(prog) {
        let f = kiln::export::ExportFile::open(prog)?;
        let e = f.read()?;
        return kiln::export::run(&e, inputs, output, matches!(backend, Backend::Gpu))
            .map_err(|e| format!("{}: {e}", prog.display()));
    }
    let (mut g, imported) = load(prog)?;
    if let Some(m) = mode {
        g = functionalize(&g, m.into())
            .map_err(|e| format!("{}:{e}", prog.display()))?
            .graph;
    }
    if let Some(imp) = &imported {
        return kiln::import::run(imp, &g, inputs, output, matches!(backend, Backend::Gpu))
            .map_err(|e| format!("{}: {e}", prog.display()));
    }
    match backend {
        Backend::Reference => {
            let ins = kiln::io::load_inputs(&g, inputs).map_err(|e| e.to_string())?;
            let r = interp::run(&g, ins).map_err(|e| format!("{}:{e}", prog.display()))?;
            kiln::io::save_results(&g, &r, output).map_err(|e| e.to_string())
        }
        Backend::Gpu => run_gpu(&g, prog, inputs, output),
    }
}

/// `run --backend gpu`: typed inputs straight from the mapped file, one
/// session run, results written as they come back.
fn run_gpu(g: &Graph, prog: &Path, inputs: &Path, output: &Path) -> Result<(), String> {
    use kiln::engine::{Fetch, Input, Output, Session};
    let at = |e: &dyn std::fmt::Display| format!("{}: {e}", prog.display());
    let file = kiln::io::MappedTensors::open(inputs).map_err(|e| e.to_string())?;
    let ins = file.inputs_for(g, &|_| false).map_err(|e| e.to_string())?;
    let session = Session::open().map_err(|e| e.to_string())?;
    eprintln!("adapter: {}", session.gpu().describe());
    let exe = session.compile(g).map_err(|e| at(&e))?;
    let feeds: Vec<Input> = ins.iter().map(Input::Host).collect();
    let r = session
        .run(&exe, &feeds, &exe.options(Fetch::Host, Fetch::Host))
        .map_err(|e| at(&e))?;
    let host = |o: Output| {
        o.host()
            .ok_or_else(|| "a result was not read back".to_string())
    };
    let mut named = vec![];
    for (i, o) in r.outputs.into_iter().enumerate() {
        named.push((format!("output.{i}"), host(o)?));
    }
    let mut finals: Vec<kiln::engine::HostTensor> = ins;
    for (i, o) in r.mutated {
        finals[i] = host(o)?;
    }
    let names = kiln::functionalize::text::Names::of(g);
    for (&v, t) in g.inputs.iter().zip(finals) {
        named.push((names.get(v), t));
    }
    kiln::io::save_host(output, &named).map_err(|e| e.to_string())
}

fn profile(
    prog: &Path,
    inputs: Option<&Path>,
    weights: Option<&Path>,
    runs: usize,
    json: bool,
) -> Result<(), String> {
    use kiln::engine::Session;
    let at = |e: &dyn std::fmt::Display| format!("{}: {e}", prog.display());
    for p in inputs.iter().chain(&weights) {
        readable(p)?;
    }
    if kiln::export::is_export(prog) {
        // An export: loading (checks, constants, pipelines) stands where
        // compiling would.
        let session = Session::open().map_err(|e| e.to_string())?;
        let f = kiln::export::ExportFile::open(prog)?;
        let t = std::time::Instant::now();
        let e = f.read()?;
        let exe = session.load_exported(&e).map_err(|e| at(&e))?;
        let load_ms = t.elapsed().as_secs_f64() * 1e3;
        // The parameters' names and types (inputs are read by name).
        let g = e.graph().map_err(|e| at(&e))?;
        return measure(&session, &exe, &g, None, inputs, runs, load_ms, json).map_err(|e| at(&e));
    }
    let (g, imported) = load(prog)?;
    let session = Session::open().map_err(|e| e.to_string())?;
    let opened = weights
        .map(kiln::io::MappedTensors::open)
        .transpose()
        .map_err(|e| e.to_string())?;
    // Parameters found in --weights are constants; without it, an
    // archive's weights (except the buffers the program writes).
    let constants = match (&opened, &imported) {
        (Some(w), _) => {
            let names = kiln::functionalize::text::Names::of(&g);
            g.inputs
                .iter()
                .filter_map(|&v| {
                    let n = names.get(v);
                    w.get(&n).map(|t| (n, t))
                })
                .collect()
        }
        (None, Some(i)) => i.constants(&g)?,
        (None, None) => vec![],
    };
    for (n, t) in &constants {
        session.add_constant(n, t).map_err(|e| e.to_string())?;
    }
    let t = std::time::Instant::now();
    let exe = session.compile(&g).map_err(|e| at(&e))?;
    let compile_ms = t.elapsed().as_secs_f64() * 1e3;
    measure(
        &session,
        &exe,
        &g,
        imported.as_ref(),
        inputs,
        runs,
        compile_ms,
        json,
    )
    .map_err(|e| at(&e))
}

/// Runs `exe` (the program `g`) `runs` times on the inputs from the file or
/// seeded random ones, and prints `kiln profile`'s table or JSON. An
/// archive's buffers the program writes (inputs, not constants) start
/// from the archive's values, as `kiln run` does.
#[allow(clippy::too_many_arguments)]
fn measure(
    session: &kiln::engine::Session,
    exe: &kiln::engine::Executable,
    g: &Graph,
    imported: Option<&kiln::import::Imported>,
    inputs: Option<&Path>,
    runs: usize,
    prepare_ms: f64,
    json: bool,
) -> Result<(), String> {
    let wanted = exe.input_params();
    let file = inputs
        .map(kiln::io::MappedTensors::open)
        .transpose()
        .map_err(|e| e.to_string())?;
    let ins: Vec<kiln::engine::HostTensor> = match (&file, imported) {
        (Some(f), Some(imp)) => {
            let all = kiln::import::feeds(imp, g, f)?;
            wanted.iter().map(|&i| all[i].clone()).collect()
        }
        (Some(f), None) => f
            .inputs_for(g, &|i| !wanted.contains(&i))
            .map_err(|e| e.to_string())?,
        (None, _) => kiln::profile::random_inputs(g, &wanted, 0x5eed),
    };
    let p =
        kiln::profile::profile(session, exe, &ins, runs, prepare_ms).map_err(|e| e.to_string())?;
    if json {
        println!("{}", p.to_json());
    } else {
        print!("{}", p.table());
    }
    Ok(())
}

/// `kiln soak`: the program's runs on one session, memory watched.
fn soak(prog: &Path, inputs: Option<&Path>, runs: u64, threads: usize) -> Result<(), String> {
    let at = |e: &dyn std::fmt::Display| format!("{}: {e}", prog.display());
    let g = read_program(prog)?;
    let session = kiln::engine::Session::open().map_err(|e| e.to_string())?;
    let exe = session.compile(&g).map_err(|e| at(&e))?;
    let wanted = exe.input_params();
    let ins: Vec<kiln::engine::HostTensor<'static>> = match inputs {
        Some(p) => {
            let f = kiln::io::MappedTensors::open(p).map_err(|e| e.to_string())?;
            f.inputs_for(&g, &|i| !wanted.contains(&i))
                .map_err(|e| e.to_string())?
                .into_iter()
                .map(|t| t.into_owned())
                .collect()
        }
        None => kiln::profile::random_inputs(&g, &wanted, 0x5eed),
    };
    let job = kiln::soak::Job {
        name: prog.display().to_string(),
        exe,
        inputs: ins,
    };
    println!("adapter: {}", session.gpu().describe());
    let r = kiln::soak::soak(&session, &[job], runs, threads, &|n| {
        eprintln!("{n} of {runs} runs")
    })
    .map_err(|e| at(&e))?;
    println!("{}", r.to_text());
    Ok(())
}

/// Ends the process at once, successfully, without freeing `big` or
/// anything else: freeing a large graph piece by piece, then the
/// allocator's walk over every page at exit, are a tenth of a large
/// `functionalize` and change nothing. Standard output must be flushed.
fn exit_now<T>(big: T) -> ! {
    std::mem::forget(big);
    // SAFETY: `_exit` ends the process without running exit handlers;
    // nothing is left to write (the caller flushed standard output, and
    // standard error is unbuffered).
    unsafe { libc::_exit(0) }
}

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // Keep freed memory for reuse (mimalloc's `purge_delay` -1): a 1 M
    // statement functionalize otherwise spends a fifth of its time having
    // the kernel zero pages it just gave back.
    // `mi_option_purge_delay` in mimalloc.h (v2 and v3 alike); the sys
    // crate does not name it.
    const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
    // SAFETY: sets a process-wide allocator option before any thread starts.
    unsafe {
        libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1);
    }
    kiln::engine::quiet_headless_vulkan();
    kiln::engine::show_pipeline_progress_on_terminal();
    match main_result(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
