//! Kiln prints only ATen op names, so PyTorch can run what any command
//! prints (`tests/fixtures/aten_ops.txt`: every `aten::` operator of
//! PyTorch 2.15).

mod common;

use kiln::functionalize::random::{random_program, Seeded};
use kiln::functionalize::{functionalize, ops, Graph, Remove};
use std::collections::HashSet;

fn aten() -> HashSet<String> {
    let text = std::fs::read_to_string(common::root().join("tests/fixtures/aten_ops.txt")).unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(str::to_string)
        .collect()
}

fn names(g: &Graph) -> Vec<&'static str> {
    g.order.iter().map(|&n| g.nodes[n].op.name()).collect()
}

/// Every op of the table (what a program may contain, hence what `print`,
/// `functionalize` and the transforms may print) is an ATen op.
#[test]
fn every_op_in_the_table_is_an_aten_op() {
    let aten = aten();
    let missing: Vec<&str> = ops::TABLE
        .ops
        .iter()
        .map(|o| o.name.as_str())
        .filter(|n| !aten.contains(*n))
        .collect();
    assert!(missing.is_empty(), "not ATen ops: {missing:?}");
}

/// Functionalized programs (both modes) of random programs and of every
/// example use only ATen names; `reshape` and `chunk` of views mode come
/// out as `view_copy` and `split_copy` / `split_with_sizes_copy`.
#[test]
fn functionalized_programs_use_only_aten_names() {
    let aten = aten();
    let mut graphs: Vec<Graph> = (0..300)
        .map(|s| random_program(&mut Seeded(s), 30))
        .collect();
    for p in common::programs(&common::root().join("examples/programs")) {
        graphs.push(kiln::parse(&std::fs::read_to_string(&p).unwrap()).unwrap());
    }
    let mut seen = HashSet::new();
    for g in &graphs {
        for mode in [Remove::Mutations, Remove::MutationsAndViews] {
            let Ok(f) = functionalize(g, mode) else {
                continue;
            };
            for n in names(&f.graph) {
                assert!(aten.contains(n), "{n} is not an ATen op");
                seen.insert(n);
            }
        }
    }
    for n in ["view_copy", "split_copy", "split_with_sizes_copy"] {
        assert!(seen.contains(n), "no program printed {n}");
    }
}
