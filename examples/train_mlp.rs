//! Trains a small MLP on the GPU with a compiled step program: `grad` of
//! the loss program, then an SGD update written as in-place `sub_` on the
//! weight parameters, which functionalization turns into the program's
//! `copy_` epilogue: the weights stay on the device from step to step.
//! The loss curve is printed beside the reference interpreter's and, when
//! PyTorch is installed, PyTorch eager's on the same data and initial
//! weights (`tests/torch_ref/train_mlp.py`).
//!
//!     cargo run --release --example train_mlp [-- --steps 50 --lr 0.5 --json --print]

use kiln::engine::{HostTensor, Session};
use kiln::functionalize::transform::sgd_step;
use kiln::functionalize::{parse, print, DType, Graph, RTensor};

/// Cross-entropy of a two-layer MLP on a batch (what
/// `torch.nn.functional.cross_entropy` computes).
pub const LOSS: &str = "graph mlp_loss(%w1: f32[32, 8], %b1: f32[32], %w2: f32[4, 32], %b2: f32[4], %x: f32[64, 8], %y: i64[64]) {
  %h = linear(%x, %w1, %b1)
  %a = relu(%h)
  %o = linear(%a, %w2, %b2)
  %l = log_softmax(%o, 1)
  %yi = view(%y, [64, 1])
  %p = gather(%l, 1, %yi)
  %m = mean(%p)
  %loss = neg(%m)
  return (%loss)
}";

pub const WEIGHTS: [&str; 4] = ["w1", "b1", "w2", "b2"];

/// The training step (`transform::sgd_step`): the loss's gradient, then
/// `w.sub_(grad, alpha=lr)` for every weight. Returns the loss.
pub fn step_program(lr: f64) -> Result<Graph, String> {
    let loss = parse(LOSS).map_err(|e| e.to_string())?;
    let wrt: Vec<String> = WEIGHTS.iter().map(|s| s.to_string()).collect();
    sgd_step(&loss, &wrt, lr).map_err(|e| e.to_string())
}

/// Deterministic data and initial weights: inputs uniform in [-1, 1),
/// labels from a fixed random linear map, weights uniform in
/// `+-1/sqrt(fan_in)` (PyTorch's `Linear` initialization).
pub fn init() -> Vec<(String, RTensor)> {
    let mut s = 0x2545_f491_4f6c_dd1du64;
    let mut uniform = |n: usize, bound: f64| -> Vec<f64> {
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) * bound
            })
            .collect()
    };
    let x = uniform(64 * 8, 1.0);
    let teacher = uniform(4 * 8, 1.0);
    let y: Vec<f64> = (0..64)
        .map(|r| {
            let score = |c: usize| {
                (0..8)
                    .map(|k| x[r * 8 + k] * teacher[c * 8 + k])
                    .sum::<f64>()
            };
            (0..4)
                .max_by(|&a, &b| score(a).total_cmp(&score(b)))
                .unwrap_or(0) as f64
        })
        .collect();
    let t = |d, s: &[usize], v: &[f64]| RTensor::new(d, s.to_vec(), v);
    let b1 = 1.0 / 8f64.sqrt();
    let b2 = 1.0 / 32f64.sqrt();
    vec![
        ("w1".into(), t(DType::F32, &[32, 8], &uniform(256, b1))),
        ("b1".into(), t(DType::F32, &[32], &uniform(32, b1))),
        ("w2".into(), t(DType::F32, &[4, 32], &uniform(128, b2))),
        ("b2".into(), t(DType::F32, &[4], &uniform(4, b2))),
        ("x".into(), t(DType::F32, &[64, 8], &x)),
        ("y".into(), t(DType::I64, &[64], &y)),
    ]
}

/// Losses of `steps` SGD steps on the GPU, the weights kept on the
/// device; and the mean time of a step (ms, loss read back included).
pub fn train_gpu(session: &Session, step: &Graph, steps: usize) -> Result<(Vec<f64>, f64), String> {
    let data: Vec<HostTensor> = init()
        .iter()
        .map(|(_, t)| HostTensor::from_rtensor(t))
        .collect();
    kiln::train::run_steps(session, step, &data, steps)
}

/// The same steps on the reference interpreter (eager semantics: `sub_`
/// writes the weights in place).
pub fn train_reference(step: &Graph, steps: usize) -> Result<Vec<f64>, String> {
    let mut ins: Vec<RTensor> = init().into_iter().map(|(_, t)| t).collect();
    let mut losses = vec![];
    for _ in 0..steps {
        let r = kiln::run(step, ins).map_err(|e| e.to_string())?;
        losses.push(r.outputs[0].values()[0]);
        ins = r.inputs;
    }
    Ok(losses)
}

/// PyTorch eager's losses and ms per step, when PyTorch is installed.
pub fn train_torch(
    steps: usize,
    lr: f64,
    dir: &std::path::Path,
) -> Result<(Vec<f64>, f64), String> {
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let path = dir.join("train_mlp_init.safetensors");
    kiln::io::save_all(&path, &init()).map_err(|e| e.to_string())?;
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/torch_ref/train_mlp.py");
    let out = std::process::Command::new("python3")
        .arg(&script)
        .arg(&path)
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
    let losses = v["losses"]
        .as_array()
        .ok_or("no losses")?
        .iter()
        .filter_map(|x| x.as_f64())
        .collect();
    Ok((losses, v["ms_per_step"].as_f64().unwrap_or(f64::NAN)))
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
    let (steps, lr) = (opt("--steps", 50.0) as usize, opt("--lr", 0.5));
    let json = args.iter().any(|a| a == "--json");
    let step = step_program(lr)?;
    if args.iter().any(|a| a == "--print") {
        println!("{}", print(&step));
    }
    let session = Session::open().map_err(|e| e.to_string())?;
    let (gpu, gpu_ms) = train_gpu(&session, &step, steps)?;
    let reference = train_reference(&step, steps)?;
    let torch = train_torch(
        steps,
        lr,
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/train_mlp"),
    );
    if json {
        let (t, tms) = torch
            .as_ref()
            .map(|(l, m)| (Some(l.clone()), Some(*m)))
            .unwrap_or((None, None));
        let v = serde_json::json!({
            "adapter": session.gpu().describe(),
            "steps": steps, "lr": lr,
            "kiln_gpu": gpu, "kiln_ms_per_step": gpu_ms,
            "reference": reference,
            "torch": t, "torch_ms_per_step": tms,
        });
        println!("{v}");
        return Ok(());
    }
    println!("adapter: {}", session.gpu().describe());
    match &torch {
        Ok(_) => println!("step  kiln (GPU)   reference    PyTorch eager  |GPU - PyTorch|"),
        Err(e) => println!("PyTorch not available ({e}); step  kiln (GPU)   reference"),
    }
    for i in 0..steps {
        match &torch {
            Ok((t, _)) => println!(
                "{i:4}  {:.7}   {:.7}    {:.7}      {:.2e}",
                gpu[i],
                reference[i],
                t[i],
                (gpu[i] - t[i]).abs()
            ),
            Err(_) => println!("{i:4}  {:.7}   {:.7}", gpu[i], reference[i]),
        }
    }
    print!("ms per step: kiln GPU {gpu_ms:.3}");
    if let Ok((_, tms)) = &torch {
        print!(", PyTorch eager CPU {tms:.3}");
    }
    println!();
    Ok(())
}
