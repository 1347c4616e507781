//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod fd;
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

/// Runs a program on inputs: its outputs.
pub type Executor<'a> =
    dyn FnMut(&kiln::functionalize::Graph, Vec<RTensor>) -> Result<Vec<RTensor>, String> + 'a;

/// Transforms where PyTorch 2.15's `torch.func` is wrong and Kiln
/// follows the mathematics (checked against finite differences in
/// `tests/transforms.rs`): `as_strided_scatter`'s gradient for `self` has
/// its mask inverted; a `view_copy`'s forward-mode tangent aliases its
/// base's, so a later `zero_` of the base zeroes it; batched `resize_`
/// addresses the whole batch's storage, so every example after the first
/// reads its neighbours' elements (vmap checked against a loop).
pub const TORCH_FUNC_WRONG: [(&str, &str); 3] = [
    ("scatter_ops", "vjp"),
    ("view_copies", "jvp"),
    ("in_place_metadata", "vmap"),
];

/// Kiln's `vjp`, `jvp` and `vmap` of example program `name` against
/// `torch.func`'s (`tests/fixtures/transforms/NAME.safetensors`, made by
/// `tests/torch_ref/make_transform_fixtures.py`), run by `exec` (the
/// reference or the GPU), within the spec's tolerances
/// (`Tolerance::transform`); programs that sum many terms (`accumulates`)
/// within `rel` of their largest magnitude, as two f32 computations
/// summing in different orders differ. Returns how many transforms were
/// compared. Programs with f16 values are held to f16's tolerances
/// throughout.
pub fn check_torch_transforms(name: &str, exec: &mut Executor, rel: f64) -> Result<usize, String> {
    use kiln::functionalize::transform::{jvp, vjp, vmap};
    let prog = root().join("examples/programs").join(format!("{name}.txt"));
    let src = std::fs::read_to_string(&prog).unwrap();
    let g = kiln::functionalize::parse(&src).unwrap();
    let heavy = accumulates(&src);
    // f32 results computed from f16 ones carry f16's rounding.
    let half = src.contains("f16");
    let tol = |d: DType, scale: f64| {
        let d = if half && d.is_float() { DType::F16 } else { d };
        if heavy {
            compare::Tolerance::accumulated(
                d,
                if d == DType::F16 { rel.max(1e-3) } else { rel },
                scale,
            )
        } else {
            compare::Tolerance::transform(d)
        }
    };
    let wrong = |t: &str| TORCH_FUNC_WRONG.contains(&(name, t));
    let ins = kiln::io::load_inputs(
        &g,
        &root().join(format!(
            "tests/fixtures/examples/programs/{name}.inputs.safetensors"
        )),
    )
    .map_err(|e| e.to_string())?;
    let fx: std::collections::HashMap<String, RTensor> =
        kiln::io::load_all(&root().join(format!("tests/fixtures/transforms/{name}.safetensors")))
            .map_err(|e| e.to_string())?
            .into_iter()
            .collect();
    let names = kiln::functionalize::text::Names::of(&g);
    let params: Vec<String> = g.inputs.iter().map(|&v| names.get(v)).collect();
    let floating: Vec<&String> = params
        .iter()
        .zip(&ins)
        .filter(|(_, t)| t.dtype().is_float())
        .map(|(n, _)| n)
        .collect();
    let compare_all = |what: &str, got: &[RTensor], want: &[&RTensor]| -> Result<(), String> {
        for (i, (a, b)) in got.iter().zip(want).enumerate() {
            same_type(&format!("{name}: {what} {i}"), a, b)?;
            let scale = b
                .values()
                .iter()
                .filter(|x| x.is_finite())
                .fold(0.0f64, |m, x| m.max(x.abs()));
            compare::assert_close(&format!("{name}: {what} {i}"), a, b, tol(a.dtype(), scale))?;
        }
        Ok(())
    };
    // Deep copies: a run writes mutated parameters back into its inputs.
    let fresh = |ts: &[RTensor]| -> Vec<RTensor> {
        ts.iter()
            .map(|t| RTensor::new(t.dtype(), t.sizes().to_vec(), &t.values()))
            .collect()
    };
    let mut n = 0;
    let fo: Vec<usize> = (0..g.outputs.len())
        .filter(|&k| g.meta(g.outputs[k]).dtype.is_float())
        .collect();
    if fx.contains_key("vjp.out.0") && !wrong("vjp") {
        let v = vjp(&g, None).map_err(|e| e.to_string())?;
        let mut args = fresh(&ins);
        args.extend(fo.iter().map(|k| fx[&format!("vjp.ct_{k}")].clone()));
        let got = exec(&v, args)?;
        let mut want: Vec<&RTensor> = (0..g.outputs.len())
            .map(|k| &fx[&format!("vjp.out.{k}")])
            .collect();
        want.extend(floating.iter().map(|p| &fx[&format!("vjp.grad.{p}")]));
        compare_all("vjp result", &got, &want)?;
        n += 1;
    }
    if fx.keys().any(|k| k.starts_with("jvp.tangent.")) && !wrong("jvp") {
        let j = jvp(&g, None).map_err(|e| e.to_string())?;
        let mut args = fresh(&ins);
        args.extend(floating.iter().map(|p| fx[&format!("jvp.t_{p}")].clone()));
        let got = exec(&j, args)?;
        let want: Vec<&RTensor> = fo
            .iter()
            .map(|k| &fx[&format!("jvp.tangent.{k}")])
            .collect();
        compare_all("jvp tangent", &got[g.outputs.len()..], &want)?;
        n += 1;
    }
    if fx.contains_key("vmap.out.0") && !wrong("vmap") {
        let b = vmap(&g, &vec![Some(0); g.inputs.len()], 3, None).map_err(|e| e.to_string())?;
        let args: Vec<RTensor> = params
            .iter()
            .map(|p| fx[&format!("vmap.{p}")].clone())
            .collect();
        let got = exec(&b, args)?;
        let want: Vec<&RTensor> = (0..g.outputs.len())
            .map(|k| &fx[&format!("vmap.out.{k}")])
            .collect();
        compare_all("vmap output", &got, &want)?;
        n += 1;
    }
    Ok(n)
}

/// The example programs' names (`examples/programs/*.txt`).
pub fn example_names() -> Vec<String> {
    programs(&root().join("examples/programs"))
        .iter()
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect()
}

/// Runs the `kiln` binary: (success, stdout, stderr).
pub fn kiln(args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .output()
        .expect("run kiln");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

/// The runtime-only `kiln-run` of this test build: `cargo test` builds
/// only this package's binaries, so it is built (same target dir and
/// profile) when missing.
pub fn kiln_run_exe() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let kr = exe.parent().unwrap().parent().unwrap().join("kiln-run");
    // Built every time (nothing to do when fresh): `cargo test` builds no
    // other package's binaries, and one left by an earlier checkout in a
    // reused target dir would run today's exports with yesterday's code.
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut build = std::process::Command::new(cargo);
    build.args(["build", "-p", "kiln-runtime", "--bin", "kiln-run"]);
    if kr.parent().is_some_and(|d| d.ends_with("release")) {
        build.arg("--release");
    }
    let st = build.status().unwrap();
    assert!(st.success() && kr.exists(), "cannot build {}", kr.display());
    kr
}

/// A session on the adapter at hand compiling as for a real GPU (the
/// kernels a GPU-class adapter gets, small grids so invocations loop).
pub fn gpu_variant_session() -> kiln::engine::Session {
    let gpu = std::sync::Arc::new(kiln::engine::Gpu::new().unwrap());
    let options = gpu_variant_options(&gpu);
    kiln::engine::Session::with_options(gpu, options)
}

/// The options of `gpu_variant_session` on `gpu`.
pub fn gpu_variant_options(gpu: &kiln::engine::Gpu) -> kiln::engine::CompileOptions {
    let mut options = gpu.compile_options();
    options.tile_min_rows = 0;
    // Products of two 128-row tiles or more in those, smaller in 64.
    options.tall_tiles_from = 2;
    options.workgroup_rows = true;
    options.workgroup = 256;
    options.vectorize = true;
    // Few workgroups, so invocations loop over the grid several times.
    options.grid_stride = Some(3);
    options.fuse_attention = true;
    options.attention_rows = false;
    options.contiguous_operands = false;
    options.transpose_tile = 32;
    // WebGPU's 256-byte binding offsets: small tensors a kernel binds
    // share windows, bound once.
    options.rules.align_words = 64;
    options
}
