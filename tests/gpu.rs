//! The GPU backend against PyTorch's results, on a real wgpu adapter
//! (lavapipe in CI): every example and op program, outputs and final
//! inputs. A machine without an adapter fails here with what to install.

mod common;

use common::{programs, root};
use kiln::engine::{Engine, EngineError};
use kiln::functionalize::{parse, DType, RTensor};

fn engine() -> Engine {
    match Engine::new() {
        Ok(e) => e,
        Err(e) => panic!("the GPU tests need a wgpu adapter: {e}"),
    }
}

/// Float tolerance: relative to the largest expected magnitude, since GPU
/// transcendentals and f32 accumulation differ from the f64 reference by
/// a few ulps. Elements PyTorch computes as inf or NaN are not compared:
/// WGSL lets shader compilers assume finite arithmetic (lavapipe folds
/// `inf - inf` and `x / 0`), so Kiln guarantees finite results only.
fn close_gpu(what: &str, a: &RTensor, b: &RTensor, rtol: f64) -> Result<(), String> {
    if a.dtype() != b.dtype() || a.sizes() != b.sizes() {
        return Err(format!("{what}: got {}{:?}, expected {}{:?}", a.dtype(), a.sizes(), b.dtype(), b.sizes()));
    }
    let bv = b.values();
    let scale = bv.iter().filter(|x| x.is_finite()).fold(1.0f64, |m, x| m.max(x.abs()));
    let tol = match a.dtype() {
        DType::F32 => rtol * scale,
        DType::F16 => 2e-3 * scale,
        _ => 0.0,
    };
    for (i, (x, y)) in a.values().iter().zip(&bv).enumerate() {
        let ok = !y.is_finite() || x == y || (x - y).abs() <= tol;
        if !ok {
            return Err(format!("{what}: element {i} is {x}, expected {y} (tolerance {tol:e})"));
        }
    }
    Ok(())
}

fn check_dir(dir: &str) {
    let mut e = engine();
    eprintln!("adapter: {}", e.gpu.describe());
    let mut failures = vec![];
    let mut unsupported = vec![];
    let mut n = 0;
    for prog in programs(&root().join(dir)) {
        let rel = prog.strip_prefix(root()).unwrap().with_extension("");
        let fix = root().join("tests/fixtures").join(&rel);
        let g = parse(&std::fs::read_to_string(&prog).unwrap()).unwrap();
        let ins = kiln::io::load_inputs(&g, &fix.with_extension("inputs.safetensors")).unwrap();
        let want = kiln::io::load_all(&fix.with_extension("expected.safetensors")).unwrap();
        let r = match e.run(&g, ins) {
            Ok(r) => r,
            Err(EngineError::Unsupported(m)) => {
                unsupported.push(format!("{}: {m}", rel.display()));
                continue;
            }
            Err(err) => {
                failures.push(format!("{}: {err}", rel.display()));
                continue;
            }
        };
        n += 1;
        let names = kiln::functionalize::text::Names::of(&g);
        let mut got: Vec<(String, RTensor)> = r.outputs.into_iter().enumerate().map(|(i, t)| (format!("output.{i}"), t)).collect();
        got.extend(g.inputs.iter().zip(r.inputs).map(|(&v, t)| (names.get(v), t)));
        got.sort_by(|a, b| a.0.cmp(&b.0));
        let heavy = ["matmul", "mm(", "bmm", "linear", "addmm", "softmax", "layer_norm", "sum(", "mean("]
            .iter()
            .any(|k| std::fs::read_to_string(&prog).unwrap().contains(k));
        let rtol = if heavy { 1e-4 } else { 1e-5 };
        for ((n1, a), (n2, b)) in got.iter().zip(&want) {
            if n1 != n2 {
                failures.push(format!("{}: tensor {n1} vs {n2}", rel.display()));
                break;
            }
            if let Err(m) = close_gpu(n1, a, b, rtol) {
                failures.push(format!("{}: {m}", rel.display()));
                break;
            }
        }
    }
    eprintln!("{n} programs ran on the GPU; {} unsupported", unsupported.len());
    assert!(failures.is_empty(), "{} programs differ on the GPU:\n{}", failures.len(), failures.join("\n"));
    assert!(unsupported.is_empty(), "unsupported on the GPU:\n{}", unsupported.join("\n"));
}

#[test]
fn example_programs_on_the_gpu() {
    check_dir("examples/programs");
}

#[test]
fn op_programs_on_the_gpu() {
    check_dir("tests/programs/ops");
}
