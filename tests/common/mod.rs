//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod transform_cases;

use kiln::functionalize::compare;
use kiln::functionalize::{DType, RTensor};
use std::path::{Path, PathBuf};

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `*.txt` program below `dir`, sorted.
pub fn programs(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in
            std::fs::read_dir(&d).unwrap_or_else(|e| panic!("cannot list {}: {e}", d.display()))
        {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "txt") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// Same dtype and shape, or a message saying how they differ.
pub fn same_type(what: &str, a: &RTensor, b: &RTensor) -> Result<(), String> {
    if a.dtype() != b.dtype() || a.sizes() != b.sizes() {
        return Err(format!(
            "{what}: got {}{:?}, expected {}{:?}",
            a.dtype(),
            a.sizes(),
            b.dtype(),
            b.sizes()
        ));
    }
    Ok(())
}

/// Compares two tensors with `assert_close`'s default tolerances for
/// their dtype (`kiln::functionalize::compare`); NaN matches NaN.
pub fn close(what: &str, a: &RTensor, b: &RTensor) -> Result<(), String> {
    same_type(what, a, b)?;
    compare::assert_close(what, a, b, compare::Tolerance::of(a.dtype()))
}

/// Does program text `src` sum over many terms (products, reductions,
/// normalizations), where two correct implementations round differently?
pub fn accumulates(src: &str) -> bool {
    [
        "matmul",
        "mm(",
        "bmm",
        "linear",
        "addmm",
        "softmax",
        "layer_norm",
        "sum(",
        "mean(",
    ]
    .iter()
    .any(|k| src.contains(k))
}

/// `close`, or for accumulated results (`accumulates`) the f32 rounding
/// of a sum in another order: `rel` of the largest expected magnitude.
pub fn close_accumulated(what: &str, a: &RTensor, b: &RTensor, rel: f64) -> Result<(), String> {
    same_type(what, a, b)?;
    let scale = b
        .values()
        .iter()
        .filter(|x| x.is_finite())
        .fold(1.0f64, |m, x| m.max(x.abs()));
    compare::assert_close(
        what,
        a,
        b,
        compare::Tolerance::accumulated(a.dtype(), rel, scale),
    )
}

/// Parses `src` and runs it on the reference interpreter.
pub fn run_text(src: &str, inputs: Vec<RTensor>) -> kiln::functionalize::RunResult {
    let g = kiln::parse(src).unwrap_or_else(|e| panic!("parse: {e}\n{src}"));
    kiln::run(&g, inputs).unwrap_or_else(|e| panic!("run: {e}\n{src}"))
}

/// `0, 1, 2, ...` as a contiguous f32 tensor.
pub fn iota(sizes: &[usize]) -> RTensor {
    let n: usize = sizes.iter().product();
    RTensor::new(
        DType::F32,
        sizes.to_vec(),
        &(0..n).map(|i| i as f64).collect::<Vec<_>>(),
    )
}

pub fn t(dtype: DType, sizes: &[usize], vals: &[f64]) -> RTensor {
    RTensor::new(dtype, sizes.to_vec(), vals)
}

/// `g` called with one tensor for its first two parameters of equal type
/// (a write through either shows in both), when it has such a pair.
pub fn aliased_variant(g: &kiln::functionalize::Graph) -> Option<kiln::functionalize::Graph> {
    let n = g.inputs.len();
    let (i, j) = (0..n)
        .flat_map(|i| (i + 1..n).map(move |j| (i, j)))
        .find(|&(i, j)| {
            let (a, b) = (g.meta(g.inputs[i]), g.meta(g.inputs[j]));
            a.dtype == b.dtype && a.sizes == b.sizes
        })?;
    g.with_aliased_params(&[(i, j)]).ok()
}
