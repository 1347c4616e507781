//! Property test: on random programs of views, in-place ops and elementwise
//! ops over one to three inputs, the functionalized graph (both modes)
//! computes what eager execution computes, outputs and final inputs alike,
//! and passes the verifier; a program the reference refuses is refused.

mod common;

use common::close;
use kiln::functionalize::random::{random_program, Listed};
use kiln::functionalize::{functionalize, interp, verify, Graph, RTensor, Remove};
use proptest::prelude::*;

fn inputs(g: &Graph, seed: u64) -> Vec<RTensor> {
    kiln::functionalize::random::random_inputs(g, seed, 2.0)
}

fn check(g: &Graph, seed: u64) -> Result<(), String> {
    let want = interp::run(g, inputs(g, seed));
    for mode in [Remove::Mutations, Remove::MutationsAndViews] {
        let f = functionalize(g, mode);
        match (&want, f) {
            (Err(_), Err(_)) => {}
            (Err(e), Ok(f)) => {
                if interp::run(&f.graph, inputs(g, seed)).is_ok() {
                    return Err(format!(
                        "{mode:?}: eager refuses ({e}) but the functionalized graph runs"
                    ));
                }
            }
            (Ok(_), Err(e)) => return Err(format!("{mode:?}: functionalize failed: {e}")),
            (Ok(w), Ok(f)) => {
                verify::verify_functional(&f.graph, mode)?;
                let got =
                    interp::run(&f.graph, inputs(g, seed)).map_err(|e| format!("{mode:?}: {e}"))?;
                for (i, (a, b)) in got.outputs.iter().zip(&w.outputs).enumerate() {
                    close(&format!("{mode:?} output {i}"), a, b)?;
                }
                for (i, (a, b)) in got.inputs.iter().zip(&w.inputs).enumerate() {
                    close(&format!("{mode:?} input {i}"), a, b)?;
                }
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn functionalized_programs_match_eager(choices in proptest::collection::vec(any::<u32>(), 0..300), n in 3usize..60, seed in any::<u64>()) {
        let g = random_program(&mut Listed { list: &choices, pos: 0 }, n);
        if let Err(e) = check(&g, seed) {
            prop_assert!(false, "{e}\n{}", kiln::print(&g));
        }
        // The same program given one tensor for two of its parameters.
        if let Some(a) = common::aliased_variant(&g) {
            if let Err(e) = check(&a, seed) {
                prop_assert!(false, "aliased: {e}\n{}", kiln::print(&a));
            }
        }
    }
}
