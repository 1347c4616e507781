//! Functionalization keeps meaning: for every example and op program, the
//! functionalized graph (both modes) computes on the reference interpreter
//! what the original computes, outputs and final inputs alike, and passes
//! the verifier.

mod common;

use common::{close, programs, root};
use kiln::functionalize::{functionalize, interp, parse, verify, Remove};

fn check_dir(dir: &str) {
    let mut failures = vec![];
    let mut n = 0;
    for prog in programs(&root().join(dir)) {
        let rel = prog.strip_prefix(root()).unwrap().with_extension("");
        let inputs = root()
            .join("tests/fixtures")
            .join(&rel)
            .with_extension("inputs.safetensors");
        let g = parse(&std::fs::read_to_string(&prog).unwrap()).unwrap();
        // Runs mutate their inputs: each gets a fresh copy.
        let ins = || kiln::io::load_inputs(&g, &inputs).unwrap();
        let want = match interp::run(&g, ins()) {
            Ok(r) => r,
            Err(e) => panic!("{}: reference run failed: {e}", rel.display()),
        };
        for mode in [Remove::Mutations, Remove::MutationsAndViews] {
            n += 1;
            let res = functionalize(&g, mode)
                .map_err(|e| e.to_string())
                .and_then(|f| {
                    verify::verify_functional(&f.graph, mode)?;
                    let text = kiln::print(&f.graph);
                    let g2 = parse(&text)
                        .map_err(|e| format!("printed result does not parse: {e}\n{text}"))?;
                    let got = interp::run(&g2, ins()).map_err(|e| format!("{e}\n{text}"))?;
                    for (i, (a, b)) in got.outputs.iter().zip(&want.outputs).enumerate() {
                        close(&format!("output.{i}"), a, b).map_err(|e| format!("{e}\n{text}"))?;
                    }
                    for (i, (a, b)) in got.inputs.iter().zip(&want.inputs).enumerate() {
                        close(&format!("input {i}"), a, b).map_err(|e| format!("{e}\n{text}"))?;
                    }
                    Ok(())
                });
            if let Err(e) = res {
                failures.push(format!("{} ({mode:?}): {e}", rel.display()));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {n} functionalizations differ:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

#[test]
fn example_programs_functionalize() {
    check_dir("examples/programs");
}

#[test]
fn op_programs_functionalize() {
    check_dir("tests/programs/ops");
}
