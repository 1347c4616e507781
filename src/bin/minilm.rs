//! Sentence embeddings with all-MiniLM-L6-v2 on Kiln.
//!
//!     cargo run --release --bin minilm -- [--backend gpu|reference] [--arithmetic f32|f16] [--model DIR] [--output FILE] SENTENCE...
//!     cargo run --release --bin minilm -- --print-model-dir [--model DIR]
//!     cargo run --release --bin minilm -- --export FILE [--bucket BxT] [--f16-weights] [--web] [--weights-file NAME] SENTENCE...
//!
//! Finds the model (`--model DIR`, `KILN_MODEL_DIR`, or the per-user
//! cache) and fetches it there when missing, prints the adapter, the
//! sentences' cosine similarity matrix, and with `--output` writes a
//! safetensors file holding `embeddings`, f32 [n, 384].

use clap::{Parser, ValueEnum};
use kiln::engine::export::WeightsDtype;
use kiln::engine::{HostTensor, Session};
use kiln::minilm::{fetch, MiniLm, HIDDEN};
use kiln::DType;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Clone, Copy, ValueEnum)]
enum WeightsDtypeArg {
    F32,
    F16,
    I8,
}

#[derive(Clone, Copy, ValueEnum)]
enum ArithmeticArg {
    F32,
    F16,
}

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
    /// Profile one bucket instead (`BATCHxTOKENS`, e.g. `32x128`): the
    /// sentences repeated to fill the batch, padded to the tokens; prints
    /// each kernel's GPU time, bytes and FLOPs (`--json` for one object).
    #[arg(long, value_parser = parse_bucket)]
    profile: Option<(usize, usize)>,
    /// With `--profile`: runs timed after a warm-up.
    #[arg(long, default_value = "5")]
    runs: usize,
    /// With `--profile`: print JSON.
    #[arg(long)]
    json: bool,
    /// Compile the model for one bucket (`--bucket`) into this export file
    /// (every weight inside), and write the sentences' token inputs beside
    /// it (`FILE.inputs.safetensors`) for `kiln run` or `kiln-run`.
    #[arg(long)]
    export: Option<PathBuf>,
    /// With `--export`: the bucket, `BATCHxTOKENS` (default: the
    /// sentences' own).
    #[arg(long, value_parser = parse_bucket)]
    bucket: Option<(usize, usize)>,
    /// With `--export`: store the weights as f16 (half the file; the
    /// same as `--weights-dtype f16`).
    #[arg(long, conflicts_with = "weights_dtype")]
    f16_weights: bool,
    /// With `--export`: how to store the weights: f32, f16 (half the
    /// file, widened at load) or i8 (matrices as int8 with an f32 scale
    /// per output channel: a quarter of the file and of the device
    /// memory, dequantized where kernels load them).
    #[arg(long, value_enum)]
    weights_dtype: Option<WeightsDtypeArg>,
    /// Compute in f16 (sentence-transformers' `model.half()`: f16 weights
    /// and activations, products and reductions accumulating in f32; half
    /// the weight memory and the bytes moved) instead of f32. Natively, in
    /// `--profile` and in `--export` (whose weights are then f16).
    #[arg(long, value_enum, default_value = "f32")]
    arithmetic: ArithmeticArg,
    /// With `--export`: compile for browsers (WebGPU's default limits, no
    /// optional feature) instead of for this machine's adapter.
    #[arg(long)]
    web: bool,
    /// With `--export --web`: this adapter's own kernel choices instead of
    /// GPU-class ones (made on a CPU adapter: the page's variant for
    /// software fallback adapters).
    #[arg(long, requires = "web")]
    web_cpu: bool,
    /// With `--export`: keep the weights in a file of this name beside the
    /// export (format version 3); exports of several buckets with the same
    /// name share it.
    #[arg(long)]
    weights_file: Option<String>,
    /// Run the model this many times on one session from `--threads`
    /// threads, the buckets of `--soak-buckets` alternating, and report
    /// resident and device memory after the warm-up and at the end, the
    /// longest run and any output that changed.
    #[arg(long)]
    soak: Option<u64>,
    /// With `--soak`: threads sharing the session.
    #[arg(long, default_value = "4")]
    threads: usize,
    /// With `--soak`: the buckets, `BATCHxTOKENS` separated by commas.
    #[arg(long, value_delimiter = ',', value_parser = parse_bucket, default_values = ["1x16", "4x32"])]
    soak_buckets: Vec<(usize, usize)>,
    sentences: Vec<String>,
}

fn main() -> ExitCode {
    kiln::engine::quiet_headless_vulkan();
    kiln::engine::show_pipeline_progress_on_terminal();
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn parse_bucket(s: &str) -> Result<(usize, usize), String> {
    let bad = || format!("`{s}`: expected BATCHxTOKENS, e.g. 32x128");
    let (b, t) = s.split_once('x').ok_or_else(bad)?;
    let (b, t): (usize, usize) = (b.parse().map_err(|_| bad())?, t.parse().map_err(|_| bad())?);
    if b == 0 || t == 0 || t > kiln::minilm::MAX_LEN {
        return Err(format!(
            "`{s}`: batch and tokens from 1, tokens at most {}",
            kiln::minilm::MAX_LEN
        ));
    }
    Ok((b, t))
}

/// `--export`: the model for one bucket in one file, and the sentences'
/// token inputs beside it.
fn export(
    model: &mut MiniLm,
    sentences: &[String],
    bucket: Option<(usize, usize)>,
    weights_dtype: WeightsDtype,
    web: (bool, bool),
    weights_file: Option<String>,
    path: &std::path::Path,
) -> Result<(), Box<dyn std::error::Error>> {
    let session = if web.1 {
        Session::open_web_like_adapter()?
    } else if web.0 {
        Session::open_web_like()?
    } else {
        Session::open()?
    };
    let mut ids = sentences
        .iter()
        .map(|s| model.tokenize(s))
        .collect::<Result<Vec<_>, _>>()?;
    let (batch, seq) = bucket.unwrap_or_else(|| MiniLm::bucket_of(&ids));
    if ids.len() > batch {
        return Err(format!("{} sentences do not fit a batch of {batch}", ids.len()).into());
    }
    for (i, t) in ids.iter_mut().enumerate() {
        if t.len() > seq {
            eprintln!(
                "note: sentence {i} has {} word pieces; the {batch}x{seq} bucket keeps the first {}",
                t.len(),
                seq
            );
        }
        kiln::minilm::fit(t, seq);
    }
    let t = std::time::Instant::now();
    let opts = kiln::engine::export::ExportOptions {
        weights_dtype,
        weights_file: weights_file.clone(),
    };
    let (bytes, weights) = model.export_parts(&session, batch, seq, &opts)?;
    std::fs::write(path, &bytes)?;
    if let Some(name) = &weights_file {
        let w = kiln::export::weights_beside(path, name)?;
        std::fs::write(&w, &weights)?;
        println!("wrote {} ({} bytes of weights)", w.display(), weights.len());
    }
    println!(
        "wrote {} ({} bytes, {batch} x {seq} tokens, {}, for {}) in {:.0} ms",
        path.display(),
        bytes.len(),
        if model.arithmetic() == DType::F16 {
            "f16 weights and arithmetic".to_string()
        } else {
            format!("weights {}", weights_dtype.name())
        },
        session.gpu().describe(),
        t.elapsed().as_secs_f64() * 1e3
    );
    let [id, mask] = MiniLm::token_inputs(&ids, batch, seq)?;
    let inputs = path.with_extension("inputs.safetensors");
    kiln::io::save_host(
        &inputs,
        &[
            ("input_ids".to_string(), id),
            ("attention_mask".to_string(), mask),
        ],
    )?;
    println!(
        "wrote {} (the sentences' token ids and mask)",
        inputs.display()
    );
    Ok(())
}

/// Profiles the model at `batch` sentences of `seq` tokens.
fn profile_bucket(
    model: &mut MiniLm,
    sentences: &[String],
    (batch, seq): (usize, usize),
    runs: usize,
    json: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let session = Session::open()?;
    model.upload_weights(&session)?;
    let ids = (0..batch)
        .map(|i| {
            let mut t = model.tokenize(&sentences[i % sentences.len()])?;
            kiln::minilm::fit(&mut t, seq);
            Ok(t)
        })
        .collect::<Result<Vec<_>, kiln::minilm::ModelError>>()?;
    let [id, mask] = MiniLm::token_inputs(&ids, batch, seq)?;
    let t = std::time::Instant::now();
    let exe = session.compile(model.graph(batch, seq)?)?;
    let compile_ms = t.elapsed().as_secs_f64() * 1e3;
    let p = kiln::profile::profile(&session, &exe, &[id, mask], runs, compile_ms)?;
    if json {
        println!("{}", p.to_json());
    } else {
        println!("adapter: {}", session.gpu().describe());
        print!("{}", p.table());
    }
    Ok(())
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
    if let ArithmeticArg::F16 = args.arithmetic {
        if matches!(args.weights_dtype, Some(WeightsDtypeArg::I8)) {
            return Err(
                "--weights-dtype i8 computes in f32 (the weights dequantized to f32 \
                        where loaded); leave out --arithmetic f16, or export f16 weights"
                    .into(),
            );
        }
        model.set_arithmetic(DType::F16)?;
    }
    if let Some(runs) = args.soak {
        let session = Session::open()?;
        let texts: Vec<&str> = sentences.iter().map(String::as_str).collect();
        let jobs = kiln::soak::minilm_jobs(&mut model, &session, &texts, &args.soak_buckets)?;
        println!("adapter: {}", session.gpu().describe());
        let report = kiln::soak::soak(&session, &jobs, runs, args.threads, &|n| {
            eprintln!("{n} of {runs} runs")
        })?;
        println!("{}", report.to_text());
        return Ok(());
    }
    if let Some(bucket) = args.profile {
        return profile_bucket(&mut model, &sentences, bucket, args.runs, args.json);
    }
    if let Some(path) = &args.export {
        return export(
            &mut model,
            &sentences,
            args.bucket,
            match (args.weights_dtype, args.f16_weights) {
                (Some(WeightsDtypeArg::F16), _) | (None, true) => WeightsDtype::F16,
                (Some(WeightsDtypeArg::I8), _) => WeightsDtype::I8,
                (Some(WeightsDtypeArg::F32), _) | (None, false) => WeightsDtype::F32,
            },
            (args.web, args.web_cpu),
            args.weights_file.clone(),
            path,
        );
    }
    let texts: Vec<&str> = sentences.iter().map(String::as_str).collect();
    // Say what the model leaves out: text past MAX_LEN word pieces.
    for (i, s) in texts.iter().enumerate() {
        let (_, full) = model.tokenize_counted(s)?;
        if full > kiln::minilm::MAX_LEN {
            eprintln!(
                "note: sentence {i} is {full} tokens, over the model's {}: truncated as \
                 sentence-transformers truncates it ([CLS], its first {} word pieces, [SEP])",
                kiln::minilm::MAX_LEN,
                kiln::minilm::MAX_LEN - 2
            );
        }
    }
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
