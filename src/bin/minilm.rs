//! Sentence embeddings with all-MiniLM-L6-v2 on Kiln.
//!
//!     cargo run --release --bin minilm -- [--backend gpu|reference] [--model DIR] [--output FILE] SENTENCE...
//!     cargo run --release --bin minilm -- --print-model-dir [--model DIR]
//!
//! Finds the model (`--model DIR`, `KILN_MODEL_DIR`, or the per-user
//! cache) and fetches it there when missing, prints the adapter, the
//! sentences' cosine similarity matrix, and with `--output` writes a
//! safetensors file holding `embeddings`, f32 [n, 384].

use clap::{Parser, ValueEnum};
use kiln::engine::{HostTensor, Session};
use kiln::minilm::{fetch, MiniLm, HIDDEN};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Clone, Copy, ValueEnum)]
enum Backend {
    Gpu,
    Reference,
}

#[derive(Parser)]
#[command(
    name = "minilm",
    about = "Sentence embeddings with all-MiniLM-L6-v2 on Kiln"
)]
struct Args {
    #[arg(long, value_enum, default_value = "gpu")]
    backend: Backend,
    /// The model folder (model.safetensors, tokenizer.json, ...); fetched
    /// there when missing.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Write the embeddings (f32 [n, 384], `embeddings`) to this file.
    #[arg(long)]
    output: Option<PathBuf>,
    /// Only find (or fetch) the model and print its folder.
    #[arg(long)]
    print_model_dir: bool,
    sentences: Vec<String>,
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let mut sentences = args.sentences;
    if sentences.is_empty() {
        sentences = vec![
            "A man is playing a guitar.".into(),
            "Someone plays a guitar.".into(),
            "The stock market fell sharply today.".into(),
        ];
    }
    let dir = fetch(args.model.as_deref())?;
    if args.print_model_dir {
        println!("{}", dir.display());
        return Ok(());
    }
    let mut model = MiniLm::load(&dir)?;
    let texts: Vec<&str> = sentences.iter().map(String::as_str).collect();
    let rows: Vec<Vec<f32>> = match args.backend {
        Backend::Gpu => {
            let session = Session::open()?;
            println!("adapter: {}", session.gpu().describe());
            let mut rows = vec![];
            for chunk in texts.chunks(32) {
                rows.extend(model.embed(&session, chunk)?.0);
            }
            rows
        }
        Backend::Reference => {
            let mut rows = vec![];
            for chunk in texts.chunks(32) {
                let ids = chunk
                    .iter()
                    .map(|s| model.tokenize(s))
                    .collect::<Result<Vec<_>, _>>()?;
                let (batch, seq) = MiniLm::bucket_of(&ids);
                let inputs = model.reference_inputs(&ids, batch, seq)?;
                let g = model.graph(batch, seq)?.clone();
                let out = kiln::run(&g, inputs)?.outputs.remove(0).values();
                rows.extend((0..chunk.len()).map(|i| {
                    out[i * HIDDEN..(i + 1) * HIDDEN]
                        .iter()
                        .map(|&x| x as f32)
                        .collect()
                }));
            }
            rows
        }
    };
    println!("cosine similarity ({} sentences):", rows.len());
    for (i, a) in rows.iter().enumerate() {
        let line: Vec<String> = rows
            .iter()
            .map(|b| format!("{:6.3}", a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>()))
            .collect();
        println!("  [{i}] {}  {}", line.join(" "), sentences[i]);
    }
    if let Some(path) = args.output {
        let flat: Vec<f32> = rows.concat();
        let t = HostTensor::from_slice(&[rows.len(), HIDDEN], &flat)?;
        kiln::io::save_host(&path, &[("embeddings".to_string(), t)])?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
