//! Fine-tunes the last layer of all-MiniLM-L6-v2 on a handful of sentence
//! pairs, on the GPU: the model's traced program, a cosine-similarity loss
//! (sentence-transformers' `CosineSimilarityLoss`: mean squared error
//! between each pair's cosine and its target) appended to it, `grad` with
//! respect to the 16 parameters of layer 5, and `sub_` on each of them.
//! The losses are printed beside PyTorch's (`tests/torch_ref/finetune_minilm.py`,
//! sentence-transformers with every other parameter frozen) when it is
//! installed.
//!
//!     cargo run --release --example finetune_minilm [-- --steps 10 --lr 0.3 --json]

use kiln::engine::{HostTensor, Session};
use kiln::functionalize::schema::Arg;
use kiln::functionalize::transform::sgd_step;
use kiln::functionalize::{ops, DType, Graph, Meta};
use kiln::minilm::{fetch, MiniLm};

/// Sentence pairs and the similarity the loss pulls their cosine toward.
pub const PAIRS: [(&str, &str, f64); 4] = [
    (
        "A man is playing a guitar.",
        "Someone plays an instrument.",
        0.9,
    ),
    (
        "The stock market fell sharply today.",
        "A cat sleeps on the sofa.",
        0.0,
    ),
    (
        "The weather is cold and rainy.",
        "It is a warm sunny day.",
        0.2,
    ),
    (
        "She is reading a book in the library.",
        "A woman reads in a quiet room.",
        0.8,
    ),
];

/// The parameters fine-tuned: every weight and bias of the last layer.
pub fn last_layer() -> Vec<String> {
    MiniLm::weight_names()
        .into_iter()
        .filter(|n| n.starts_with("encoder_layer_5_"))
        .collect()
}

fn call(
    g: &mut Graph,
    op: &str,
    args: &[Arg<kiln::functionalize::ValueId>],
) -> Result<kiln::functionalize::ValueId, String> {
    let id = ops::lookup(op).ok_or_else(|| format!("no op {op}"))?;
    Ok(g.call(id, args)?[0])
}

/// The step program for `batch` x `seq` tokens: parameters `input_ids`,
/// `attention_mask`, the weights, `target` f32[pairs]; returns the loss and
/// updates the last layer in place (`sub_`).
pub fn step_program(
    model: &mut MiniLm,
    batch: usize,
    seq: usize,
    lr: f64,
) -> Result<Graph, String> {
    use Arg::Tensor as T;
    let mut l = model.graph(batch, seq).map_err(|e| e.to_string())?.clone();
    let n = PAIRS.len() as i64;
    let target = l.add_input(
        Some("target".into()),
        Meta::contiguous(DType::F32, vec![PAIRS.len()]),
    );
    let e = l.outputs[0];
    // Rows 0..n are the first sentences, n..2n the second: unit vectors,
    // so the cosine is the dot product.
    let a = call(
        &mut l,
        "slice",
        &[T(e), Arg::Int(0), Arg::Int(0), Arg::Int(n)],
    )?;
    let b = call(
        &mut l,
        "slice",
        &[T(e), Arg::Int(0), Arg::Int(n), Arg::Int(2 * n)],
    )?;
    let p = call(&mut l, "mul", &[T(a), T(b)])?;
    let cos = call(&mut l, "sum", &[T(p), Arg::IntList(vec![1])])?;
    let d = call(&mut l, "sub", &[T(cos), T(target)])?;
    let sq = call(&mut l, "mul", &[T(d), T(d)])?;
    let loss = call(&mut l, "mean", &[T(sq)])?;
    l.outputs = vec![loss];
    sgd_step(&l, &last_layer(), lr).map_err(|e| e.to_string())
}

/// The step program and its host inputs (ids, mask, weights, target).
pub fn setup(model: &mut MiniLm, lr: f64) -> Result<(Graph, Vec<HostTensor<'static>>), String> {
    let sentences: Vec<&str> = PAIRS
        .iter()
        .map(|p| p.0)
        .chain(PAIRS.iter().map(|p| p.1))
        .collect();
    let ids = sentences
        .iter()
        .map(|s| model.tokenize(s))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let (batch, seq) = MiniLm::bucket_of(&ids);
    if batch != sentences.len() {
        return Err(format!(
            "{} sentences fall in a batch bucket of {batch}",
            sentences.len()
        ));
    }
    let step = step_program(model, batch, seq, lr)?;
    let [id, mask] = MiniLm::token_inputs(&ids, batch, seq).map_err(|e| e.to_string())?;
    let mut ins = vec![id, mask];
    for n in MiniLm::weight_names() {
        ins.push(model.weight(&n).map_err(|e| e.to_string())?.into_owned());
    }
    let target: Vec<f32> = PAIRS.iter().map(|p| p.2 as f32).collect();
    ins.push(HostTensor::from_slice(&[PAIRS.len()], &target).map_err(|e| e.to_string())?);
    Ok((step, ins))
}

/// `steps` fine-tuning steps on the GPU, every tensor on the device: the
/// losses and the mean ms per step.
pub fn train_gpu(
    session: &Session,
    step: &Graph,
    ins: &[HostTensor],
    steps: usize,
) -> Result<(Vec<f64>, f64), String> {
    kiln::train::run_steps(session, step, ins, steps)
}

/// PyTorch's losses (sentence-transformers, layer 5 trainable), when it is
/// installed.
pub fn train_torch(model_dir: &std::path::Path, steps: usize, lr: f64) -> Result<Vec<f64>, String> {
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/torch_ref/finetune_minilm.py");
    let out = std::process::Command::new("python3")
        .arg(&script)
        .arg(model_dir)
        .args(["--steps", &steps.to_string(), "--lr", &lr.to_string()])
        .output()
        .map_err(|e| format!("cannot run python3: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr)
            .lines()
            .last()
            .unwrap_or("failed")
            .to_string());
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
    Ok(v["losses"]
        .as_array()
        .ok_or("no losses")?
        .iter()
        .filter_map(|x| x.as_f64())
        .collect())
}

#[allow(dead_code)]
fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().collect();
    let opt = |name: &str, default: f64| -> f64 {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let (steps, lr) = (opt("--steps", 10.0) as usize, opt("--lr", 0.3));
    let dir = fetch(None).map_err(|e| e.to_string())?;
    let mut model = MiniLm::load(&dir).map_err(|e| e.to_string())?;
    let (step, ins) = setup(&mut model, lr)?;
    let session = Session::open().map_err(|e| e.to_string())?;
    let (gpu, ms) = train_gpu(&session, &step, &ins, steps)?;
    let torch = train_torch(&dir, steps, lr);
    if args.iter().any(|a| a == "--json") {
        println!(
            "{}",
            serde_json::json!({"adapter": session.gpu().describe(), "kiln_gpu": gpu, "ms_per_step": ms, "torch": torch.ok()})
        );
        return Ok(());
    }
    println!(
        "adapter: {}; step program: {} statements",
        session.gpu().describe(),
        step.order.len()
    );
    match &torch {
        Ok(t) => {
            println!("step  kiln (GPU)   PyTorch      |diff|");
            for i in 0..steps {
                println!(
                    "{i:4}  {:.7}    {:.7}    {:.1e}",
                    gpu[i],
                    t[i],
                    (gpu[i] - t[i]).abs()
                );
            }
        }
        Err(e) => {
            println!("PyTorch not available ({e})\nstep  kiln (GPU)");
            for (i, l) in gpu.iter().enumerate() {
                println!("{i:4}  {l:.7}");
            }
        }
    }
    println!("ms per step (GPU): {ms:.1}");
    Ok(())
}
