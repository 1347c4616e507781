//! Sentence embeddings with all-MiniLM-L6-v2 on Kiln.
//!
//!     cargo run --release --example minilm -- [--backend gpu|reference] [--output FILE] SENTENCE...
//!
//! Fetches the model on first use (scripts/fetch_minilm.sh), prints the
//! adapter, the sentences' cosine similarity matrix, and with `--output`
//! writes a safetensors file holding `embeddings`, f32 [n, 384].

use kiln::minilm::{bucket, fetch, MiniLm, BATCH_BUCKETS, SEQ_BUCKETS};
use kiln::{DType, RTensor};
use std::process::ExitCode;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut backend = "gpu".to_string();
    let mut output = None;
    let mut sentences = vec![];
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--backend" => backend = it.next().ok_or("--backend needs gpu or reference")?,
            "--output" => output = Some(it.next().ok_or("--output needs a file name")?),
            _ => sentences.push(a),
        }
    }
    if sentences.is_empty() {
        sentences = vec![
            "A man is playing a guitar.".into(),
            "Someone plays a guitar.".into(),
            "The stock market fell sharply today.".into(),
        ];
    }
    let dir = fetch()?;
    let mut model = MiniLm::load(&dir)?;
    let ids = sentences
        .iter()
        .map(|s| model.tokenize(s))
        .collect::<Result<Vec<_>, _>>()?;
    let seq = bucket(ids.iter().map(|t| t.len()).max().unwrap_or(1), &SEQ_BUCKETS);
    let batch = bucket(ids.len(), &BATCH_BUCKETS);
    let inputs = model.inputs(&ids, batch, seq);
    let g = model.graph(batch, seq)?.clone();
    let emb = match backend.as_str() {
        "gpu" => {
            let mut engine = kiln::engine::Engine::new()?;
            println!("adapter: {}", engine.gpu.describe());
            engine.run(&g, inputs)?.outputs.remove(0)
        }
        "reference" => kiln::run(&g, inputs)?.outputs.remove(0),
        other => return Err(format!("unknown backend {other:?} (gpu or reference)").into()),
    };
    let vals = emb.values();
    let n = sentences.len();
    let rows: Vec<&[f64]> = (0..n).map(|i| &vals[i * 384..(i + 1) * 384]).collect();
    println!("cosine similarity ({} sentences, bucket {batch}x{seq}):", n);
    for (i, a) in rows.iter().enumerate() {
        let line: Vec<String> = rows
            .iter()
            .map(|b| format!("{:6.3}", a.iter().zip(*b).map(|(x, y)| x * y).sum::<f64>()))
            .collect();
        println!("  [{i}] {}  {}", line.join(" "), sentences[i]);
    }
    if let Some(path) = output {
        let t = RTensor::new(DType::F32, vec![n, 384], &vals[..n * 384]);
        kiln::io::save_all(
            std::path::Path::new(&path),
            &[("embeddings".to_string(), t)],
        )?;
        println!("wrote {path}");
    }
    Ok(())
}
