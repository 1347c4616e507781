//! The `kiln` command line (see `../shared/spec/program-format.md`).

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
    },
    /// Print the functionalized program.
    Functionalize {
        prog: PathBuf,
        #[arg(long, value_enum, default_value = "mutations")]
        remove: Mode,
    },
    /// Parse a program and print it back in canonical form.
    Print { prog: PathBuf },
}

fn read_program(path: &Path) -> Result<Graph, String> {
    let src = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    parse(&src).map_err(|e| format!("{}:{e}", path.display()))
}

fn main_result(cli: Cli) -> Result<(), String> {
    match cli.cmd {
        Cmd::Print { prog } => {
            print!("{}", print(&read_program(&prog)?));
            Ok(())
        }
        Cmd::Compile { prog, stats, wgsl } => {
            let g = read_program(&prog)?;
            let p = kiln::engine::compile(&g).map_err(|e| format!("{}: {e}", prog.display()))?;
            if stats || !wgsl {
                print!("{}", p.stats());
            }
            if wgsl {
                for k in &p.kernels {
                    println!(
                        "// ---- {} (grid {:?})\n{}",
                        k.code.label, k.code.grid, k.code.wgsl
                    );
                }
            }
            Ok(())
        }
        Cmd::Functionalize { prog, remove } => {
            let g = read_program(&prog)?;
            let f =
                functionalize(&g, remove.into()).map_err(|e| format!("{}:{e}", prog.display()))?;
            print!("{}", print(&f.graph));
            Ok(())
        }
        Cmd::Run {
            prog,
            inputs,
            output,
            backend,
            functionalize: mode,
        } => {
            let mut g = read_program(&prog)?;
            if let Some(m) = mode {
                g = functionalize(&g, m.into())
                    .map_err(|e| format!("{}:{e}", prog.display()))?
                    .graph;
            }
            let ins = kiln::io::load_inputs(&g, &inputs).map_err(|e| e.to_string())?;
            let r = match backend {
                Backend::Reference => {
                    interp::run(&g, ins).map_err(|e| format!("{}:{e}", prog.display()))?
                }
                Backend::Gpu => {
                    let mut engine = kiln::engine::Engine::new().map_err(|e| e.to_string())?;
                    eprintln!("adapter: {}", engine.gpu.describe());
                    let r = engine
                        .run(&g, ins)
                        .map_err(|e| format!("{}: {e}", prog.display()))?;
                    interp::RunResult {
                        outputs: r.outputs,
                        inputs: r.inputs,
                        peak_bytes: 0,
                    }
                }
            };
            kiln::io::save_results(&g, &r, &output).map_err(|e| e.to_string())
        }
    }
}

fn main() -> ExitCode {
    match main_result(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
