//! The outside check: every program in `examples/programs` and
//! `tests/programs/ops` run by `kiln run --backend reference` against what
//! PyTorch eager computed for the same inputs (fixtures made by
//! `tests/torch_ref/make_fixtures.py`), outputs and final inputs alike.

mod common;

use common::{close, programs, root};
use kiln::functionalize::{interp, parse};
use std::path::Path;

fn check_dir(dir: &str) {
    let base = root().join(dir);
    let mut failures = vec![];
    let mut checked = 0;
    for prog in programs(&base) {
        let rel = prog.strip_prefix(root()).unwrap().with_extension("");
        let fix = root().join("tests/fixtures").join(&rel);
        let inputs = fix.with_extension("inputs.safetensors");
        let expected = fix.with_extension("expected.safetensors");
        if !inputs.exists() || !expected.exists() {
            failures.push(format!(
                "{}: no PyTorch fixture (run tests/torch_ref/make_fixtures.py)",
                rel.display()
            ));
            continue;
        }
        checked += 1;
        if let Err(e) = check_one(&prog, &inputs, &expected) {
            failures.push(format!("{}: {e}", rel.display()));
        }
    }
    assert!(checked > 0, "no programs with fixtures under {dir}");
    assert!(
        failures.is_empty(),
        "{} of {} programs differ from PyTorch:\n{}",
        failures.len(),
        checked,
        failures.join("\n")
    );
}

fn check_one(prog: &Path, inputs: &Path, expected: &Path) -> Result<(), String> {
    let g = parse(&std::fs::read_to_string(prog).unwrap()).map_err(|e| e.to_string())?;
    let ins = kiln::io::load_inputs(&g, inputs).map_err(|e| e.to_string())?;
    let r = interp::run(&g, ins).map_err(|e| e.to_string())?;
    let dir = tempdir();
    let out = dir.join(format!(
        "{}.safetensors",
        prog.file_stem().unwrap().to_string_lossy()
    ));
    kiln::io::save_results(&g, &r, &out).map_err(|e| e.to_string())?;
    let got = kiln::io::load_all(&out).map_err(|e| e.to_string())?;
    let want = kiln::io::load_all(expected).map_err(|e| e.to_string())?;
    let got_names: Vec<&String> = got.iter().map(|x| &x.0).collect();
    let want_names: Vec<&String> = want.iter().map(|x| &x.0).collect();
    if got_names != want_names {
        return Err(format!("tensors {got_names:?}, expected {want_names:?}"));
    }
    // PyTorch sums in f32, the reference in f64.
    let summed = common::accumulates(&std::fs::read_to_string(prog).unwrap());
    for ((n, a), (_, b)) in got.iter().zip(&want) {
        if summed {
            common::close_accumulated(n, a, b, 1e-5)?;
        } else {
            close(n, a, b)?;
        }
    }
    Ok(())
}

fn tempdir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("kiln-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn example_programs_match_pytorch() {
    check_dir("examples/programs");
}

#[test]
fn op_programs_match_pytorch() {
    check_dir("tests/programs/ops");
}

/// Programs eager PyTorch refuses are refused too, when parsed or run.
#[test]
fn refused_programs_are_refused() {
    let dir = root().join("tests/programs/errors");
    let mut accepted = vec![];
    let progs = programs(&dir);
    assert!(!progs.is_empty(), "no programs under tests/programs/errors");
    for prog in progs {
        let src = std::fs::read_to_string(&prog).unwrap();
        let refused = match parse(&src) {
            Err(_) => true,
            Ok(g) => {
                let ins = g
                    .inputs
                    .iter()
                    .map(|&v| {
                        let m = g.meta(v);
                        kiln::RTensor::new(m.dtype, m.sizes.clone(), &vec![0.0; m.numel()])
                    })
                    .collect();
                interp::run(&g, ins).is_err()
            }
        };
        if !refused {
            accepted.push(prog.display().to_string());
        }
    }
    assert!(
        accepted.is_empty(),
        "accepted programs PyTorch refuses:\n{}",
        accepted.join("\n")
    );
}
