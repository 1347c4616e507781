//! What functionalization refuses (exactly what eager refuses, plus writes
//! whose result depends on visiting order), and programs that look
//! dangerous but are fine: each fine one is functionalized in both modes
//! and checked against the reference interpreter.

mod common;

use common::{close, iota};
use kiln::functionalize::{functionalize, interp, parse, Remove};

fn prog(params: &str, body: &str, ret: &str) -> String {
    format!("graph f({params}) {{\n{body}\nreturn {ret}\n}}")
}

/// Refused while parsing (the op table's rules) or by functionalize, with a
/// message naming the statement; the reference refuses it too.
fn refused(src: &str, needle: &str) {
    let msg = match parse(src) {
        Err(e) => e.to_string(),
        Ok(g) => {
            let ins = g.inputs.iter().map(|&v| iota(&g.meta(v).sizes)).collect();
            assert!(interp::run(&g, ins).is_err(), "the reference runs:\n{src}");
            let a = functionalize(&g, Remove::Mutations)
                .err()
                .map(|e| e.to_string());
            let b = functionalize(&g, Remove::MutationsAndViews)
                .err()
                .map(|e| e.to_string());
            assert_eq!(a.is_some(), b.is_some(), "modes disagree:\n{src}");
            a.unwrap_or_else(|| panic!("functionalize accepts:\n{src}"))
        }
    };
    assert!(msg.contains(needle), "{msg:?} should mention {needle:?}");
}

#[test]
fn refusals_name_the_statement() {
    let p = "%x: f32[3]";
    refused(
        &prog(p, "%e = expand(%x, [2, 3])\n%a = add_(%e, 1)", "()"),
        "add_(%e, 1)",
    );
    refused(
        &prog(
            p,
            "%e = expand(%x, [2, 3])\n%o = ones([2, 3])\n%a = copy_(%e, %o)",
            "()",
        ),
        "more than one element",
    );
    refused(
        &prog(p, "%u = unfold(%x, 0, 2, 1)\n%a = mul_(%u, 2)", "()"),
        "mul_(%u, 2)",
    );
    refused(
        &prog(
            p,
            "%a = slice(%x, 0, 1, 3)\n%b = slice(%x, 0, 0, 2)\n%c = add_(%a, %b)",
            "()",
        ),
        "add_(%a, %b)",
    );
    refused(
        &prog("%x: f32[3, 3]", "%t = t(%x)\n%c = add_(%x, %t)", "()"),
        "single memory location",
    );
    refused(&prog("%x: f32[4]", "%s = slice(%x, 0, 1, 3)\n%i = full([1], 0, i32)\n%v = slice(%x, 0, 2, 3)\n%c = index_put_(%s, [%i], %v)", "()"), "index_put_");
    refused(
        &prog("%x: i32[3]", "%a = add_(%x, 0.5)", "()"),
        "can't be cast",
    );
    refused(
        &prog(p, "%y = ones([2, 3])\n%a = add_(%x, %y)", "()"),
        "doesn't match the broadcast shape",
    );
}

/// Run by the reference (eager can), refused by functionalize in both
/// modes naming the statement: what a program cannot express.
fn kiln_refuses(src: &str, needle: &str) {
    let g = parse(src).unwrap_or_else(|e| panic!("{e}\n{src}"));
    let ins = g.inputs.iter().map(|&v| iota(&g.meta(v).sizes)).collect();
    interp::run(&g, ins).unwrap_or_else(|e| panic!("the reference refuses: {e}\n{src}"));
    for mode in [Remove::Mutations, Remove::MutationsAndViews] {
        let msg = match functionalize(&g, mode) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("{mode:?}: functionalize accepts:\n{src}"),
        };
        assert!(msg.contains(needle), "{msg:?} should mention {needle:?}");
    }
}

#[test]
fn metadata_changes_kiln_cannot_express() {
    let p = "%x: f32[3]";
    // The caller's tensor would change shape.
    refused_here(p, "%u = unsqueeze_(%x, 0)", "program input `%x`");
    refused_here(p, "%a = add_(%x, 1)\n%t = t_(%a)", "t_(%a)");
    refused_here(p, "%r = resize_(%x, [2])", "resize_(%x, [2])");
    // Growing a view, or a tensor whose views would keep the old storage.
    refused_here(
        p,
        "%c = clone(%x)\n%v = slice(%c, 0, 0, 2)\n%r = resize_(%v, [5])",
        "it is a view",
    );
    refused_here(
        p,
        "%c = clone(%x)\n%r = resize_(%c, [2])\n%g = resize_(%r, [5])",
        "resized smaller before",
    );
    refused_here(
        p,
        "%c = clone(%x)\n%v = slice(%c, 0, 0, 2)\n%r = resize_(%c, [5])",
        "it has views",
    );
}

#[test]
fn metadata_changed_in_place() {
    let p = "%x: f32[2, 3]";
    // A view of an input changes shape; writes through it reach the input.
    fine(&prog(
        p,
        "%v = select(%x, 0, 1)\n%u = unsqueeze_(%v, 0)\n%m = mul_(%v, 2)",
        "(%v)",
    ));
    fine(&prog(
        p,
        "%t = alias(%x)\n%q = t_(%t)\n%w = add_(%t, 1)\n%s = squeeze_(%q)",
        "(%t, %w)",
    ));
    // Shrink, write, grow back: the tail kept its elements.
    fine(&prog(
        p,
        "%c = clone(%x)\n%r = resize_(%c, [2])\n%m = mul_(%c, 3)\n%a = as_strided_(%c, [3], [2], 0)",
        "(%c, %r)",
    ));
}

fn refused_here(params: &str, body: &str, needle: &str) {
    kiln_refuses(&prog(params, body, "()"), needle)
}

/// Functionalizes `src` in both modes and compares with the reference.
fn fine(src: &str) {
    let g = parse(src).unwrap_or_else(|e| panic!("{e}\n{src}"));
    let ins = || {
        g.inputs
            .iter()
            .map(|&v| iota(&g.meta(v).sizes))
            .collect::<Vec<_>>()
    };
    let want = interp::run(&g, ins()).unwrap_or_else(|e| panic!("{e}\n{src}"));
    for mode in [Remove::Mutations, Remove::MutationsAndViews] {
        let f = functionalize(&g, mode).unwrap_or_else(|e| panic!("{mode:?}: {e}\n{src}"));
        let got = interp::run(&f.graph, ins()).unwrap();
        let text = kiln::print(&f.graph);
        for (a, b) in got
            .outputs
            .iter()
            .zip(&want.outputs)
            .chain(got.inputs.iter().zip(&want.inputs))
        {
            close("value", a, b).unwrap_or_else(|e| panic!("{mode:?}: {e}\n{src}\n{text}"));
        }
    }
}

#[test]
fn dangerous_looking_but_fine() {
    // In-place on a slice with a step.
    fine(&prog(
        "%x: f32[8]",
        "%s = slice(%x, 0, 1, none, 3)\n%a = mul_(%s, -1)",
        "%x",
    ));
    // copy_ between two rows of one base.
    fine(&prog(
        "%x: f32[3, 4]",
        "%r0 = select(%x, 0, 0)\n%r2 = select(%x, 0, 2)\n%c = copy_(%r2, %r0)",
        "%x",
    ));
    // Disjoint rows of one base read and written.
    fine(&prog(
        "%x: f32[3, 4]",
        "%r0 = select(%x, 0, 0)\n%r1 = select(%x, 0, 1)\n%c = add_(%r1, %r0)",
        "(%x, %r1)",
    ));
    // A tensor times itself: every element read where it is written.
    fine(&prog("%x: f32[3, 4]", "%c = mul_(%x, %x)", "%x"));
    // fill_ and zero_ through an expand write each element once.
    fine(&prog(
        "%x: f32[4]",
        "%e = expand(%x, [3, 4])\n%f = fill_(%e, 2.5)\n%y = add(%e, 1)",
        "(%x, %y)",
    ));
    fine(&prog(
        "%x: f32[4, 1]",
        "%e = expand(%x, [4, 5])\n%z = zero_(%e)",
        "%e",
    ));
    // A window of an overlapping unfold does not overlap itself.
    fine(&prog(
        "%x: f32[6]",
        "%u = unfold(%x, 0, 3, 1)\n%w = select(%u, 0, 2)\n%a = add_(%w, 10)",
        "(%u, %x)",
    ));
    // fill_ through a whole overlapping unfold.
    fine(&prog(
        "%x: f32[6]",
        "%u = unfold(%x, 0, 3, 1)\n%f = fill_(%u, 7)",
        "%x",
    ));
    // as_strided on a view addresses the whole storage.
    fine(&prog(
        "%x: f32[4, 5]",
        "%s = slice(%x, 0, 1)\n%a = as_strided(%s, [2, 2], [5, 1], 2)\n%m = mul_(%a, 10)",
        "(%x, %s)",
    ));
    // reshape / contiguous of a non-contiguous tensor copy: the write stays.
    fine(&prog("%x: f32[3, 4]", "%t = t(%x)\n%r = reshape(%t, [12])\n%z = zero_(%r)\n%c = contiguous(%t)\n%f = fill_(%c, 1)", "(%x, %r, %c)"));
    // ... while of a contiguous one they alias.
    fine(&prog(
        "%x: f32[3, 4]",
        "%r = reshape(%x, [2, 6])\n%z = zero_(%r)\n%c = contiguous(%x)\n%f = add_(%c, 1)",
        "%x",
    ));
    // Mutated pieces of split / unbind and a multi-step chain.
    fine(&prog("%x: f32[6, 4]", "%a, %b, %c = split(%x, 2)\n%t = t(%b)\n%d = diagonal(%t)\n%m = mul_(%d, 0)\n%u0, %u1 = unbind(%c, 0)\n%f = fill_(%u1, 3)", "(%x, %a)"));
    // An input mutated, then read through another alias, then returned.
    fine(&prog(
        "%x: f32[2, 3]",
        "%v = view(%x, [6])\n%a = add_(%v, 1)\n%t = t(%x)\n%s = sum(%t, [0])",
        "(%s, %x, %v)",
    ));
}

#[test]
fn traced_closures_functionalize() {
    use kiln::functionalize::{DType, TensorSpec};
    let f = kiln::functionalize_traced(
        "f",
        &[TensorSpec::new("x", DType::F32, &[2, 3])],
        |x| {
            x[0].select(0, 1).mul_(2.0);
            vec![x[0].sum(&[0], false)]
        },
        Remove::MutationsAndViews,
    )
    .unwrap();
    assert_eq!(f.mutated_inputs.len(), 1);
    assert_eq!(f.mutated_inputs[0].input, 0);
    let r = interp::run(&f.graph, vec![iota(&[2, 3])]).unwrap();
    assert_eq!(r.outputs[0].values(), vec![6.0, 9.0, 12.0]);
    assert_eq!(r.inputs[0].values(), vec![0.0, 1.0, 2.0, 6.0, 8.0, 10.0]);
}
