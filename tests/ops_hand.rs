//! Ops against expectations worked out by hand or by identities, not by the
//! op table (the PyTorch fixtures are the other independent check), on
//! awkward sizes and non-contiguous operands.

mod common;

use common::{iota, run_text, t};
use kiln::functionalize::{ops, DType};

fn run1(src: &str, x: kiln::RTensor) -> Vec<f64> {
    run_text(src, vec![x]).outputs[0].values()
}

#[test]
fn hand_computed_small_cases() {
    let x = iota(&[2, 3]); // [[0,1,2],[3,4,5]]
    let cases: &[(&str, &[f64])] = &[
        (
            "%y = transpose(%x, 0, 1)\n %o = contiguous(%y)",
            &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0],
        ),
        ("%o = sum(%x, [0])", &[3.0, 5.0, 7.0]),
        ("%o = mean(%x, [1], true)", &[1.0, 4.0]),
        ("%o = amax(%x, [0])", &[3.0, 4.0, 5.0]),
        ("%o = amin(%x)", &[0.0]),
        ("%o = slice(%x, 1, 0, none, 2)", &[0.0, 2.0, 3.0, 5.0]),
        ("%o = select(%x, 1, -1)", &[2.0, 5.0]),
        ("%o = diagonal(%x, 1)", &[1.0, 5.0]),
        (
            "%o = as_strided(%x, [2, 2], [1, 2], 1)",
            &[1.0, 3.0, 2.0, 4.0],
        ),
        (
            "%o = unfold(%x, 1, 2, 1)",
            &[0.0, 1.0, 1.0, 2.0, 3.0, 4.0, 4.0, 5.0],
        ),
        ("%o = narrow(%x, 1, -2, 2)", &[1.0, 2.0, 4.0, 5.0]),
        (
            "%o = expand(%x, [2, 2, 3])",
            &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0],
        ),
        ("%o = mm(%x, %x_t)\n %x_t = t(%x)", &[]),
        ("%w = t(%x)\n %o = mm(%x, %w)", &[5.0, 14.0, 14.0, 50.0]),
        ("%o = clamp(%x, 1, 3.5)", &[1.0, 1.0, 2.0, 3.0, 3.5, 3.5]),
        (
            "%o = div(%x, 2, \"floor\")",
            &[0.0, 0.0, 1.0, 1.0, 2.0, 2.0],
        ),
        ("%o = pow(2, %x)", &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0]),
        ("%o = where(%m, %x, -1)\n %m = gt(%x, 2)", &[]),
        (
            "%m = gt(%x, 2)\n %o = where(%m, %x, -1)",
            &[-1.0, -1.0, -1.0, 3.0, 4.0, 5.0],
        ),
        (
            "%s = slice(%x, 0, 0, 1)\n %o = slice_scatter(%x, %s, 0, 1, 2)",
            &[0.0, 1.0, 2.0, 0.0, 1.0, 2.0],
        ),
        (
            "%s = select(%x, 1, 2)\n %o = select_scatter(%x, %s, 1, 0)",
            &[2.0, 1.0, 2.0, 5.0, 4.0, 5.0],
        ),
        (
            "%d = zeros([2])\n %o = diagonal_scatter(%x, %d)",
            &[0.0, 1.0, 2.0, 3.0, 0.0, 5.0],
        ),
        (
            "%i = arange(0, 3, 2, i32)\n %o = index_select(%x, 1, %i)",
            &[0.0, 2.0, 3.0, 5.0],
        ),
        (
            "%i = arange(2, i32)\n %o = embedding(%x, %i)",
            &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0],
        ),
        (
            "%i = full([2], 1, i32)\n %v = ones([2, 3])\n %o = index_put(%x, [%i], %v, true)",
            &[0.0, 1.0, 2.0, 5.0, 6.0, 7.0],
        ),
    ];
    for (body, want) in cases {
        let src = format!("graph f(%x: f32[2, 3]) {{\n {body}\n return %o\n}}");
        match kiln::parse(&src) {
            Ok(g) if !want.is_empty() => {
                let got = kiln::run(&g, vec![x.clone()]).unwrap().outputs[0].values();
                assert_eq!(&got, want, "{body}");
            }
            Ok(_) => panic!("{body}: should not parse (use before definition)"),
            Err(e) => assert!(want.is_empty(), "{body}: {e}"),
        }
    }
}

#[test]
fn identities_on_awkward_sizes() {
    for n in [1usize, 3, 50, 783] {
        let x = iota(&[n, 3]);
        let xv = x.values();
        let same = |body: &str| {
            let src = format!("graph f(%x: f32[{n}, 3]) {{\n {body}\n return %o\n}}");
            assert_eq!(run1(&src, x.clone()), xv, "n={n}: {body}");
        };
        same("%a = transpose(%x, 0, 1)\n %o = transpose(%a, 0, 1)");
        same("%a = permute(%x, [1, 0])\n %o = permute(%a, [1, 0])");
        same("%a = t(%x)\n %b = contiguous(%a)\n %c = t(%b)\n %o = contiguous(%c)");
        same("%a = view(%x, [-1])\n %o = view(%a, [-1, 3])");
        same("%a = unsqueeze(%x, 1)\n %o = squeeze(%a, 1)");
        same("%a = neg(%x)\n %o = neg(%a)");
        same("%a, %b = split(%x, [1, 2], 1)\n %o = index_put(%x, [], %x)");
        same("%s = slice(%x, 0, 0, none, 2)\n %o = slice_scatter(%x, %s, 0, 0, none, 2)");
        same("%z = zeros_like(%x)\n %o = add(%z, %x)");
        // Row sums of a softmax are one; a layer norm has mean 0.
        let src = format!(
            "graph f(%x: f32[{n}, 3]) {{\n %s = softmax(%x, 1)\n %o = sum(%s, [1])\n return %o\n}}"
        );
        assert!(run1(&src, x.clone()).iter().all(|v| (v - 1.0).abs() < 1e-6));
        let src = format!("graph f(%x: f32[{n}, 3]) {{\n %s = layer_norm(%x, [3])\n %o = mean(%s, [1])\n return %o\n}}");
        assert!(run1(&src, x.clone()).iter().all(|v| v.abs() < 1e-6));
    }
}

#[test]
fn non_contiguous_operands_read_through_their_strides() {
    // x: [[0,1,2],[3,4,5]]; x.t() + [10, 20] broadcasts over the rows of x.t().
    let src = "graph f(%x: f32[2, 3], %b: f32[2]) {\n %a = t(%x)\n %o = add(%a, %b)\n return %o\n}";
    let r = run_text(src, vec![iota(&[2, 3]), t(DType::F32, &[2], &[10.0, 20.0])]);
    assert_eq!(
        r.outputs[0].values(),
        vec![10.0, 23.0, 11.0, 24.0, 12.0, 25.0]
    );
    // The result keeps the transposed layout, as TensorIterator gives it.
    assert_eq!(r.outputs[0].meta.strides[..], [1, 3]);
    let src = "graph f(%x: f32[2, 3]) {\n %a = slice(%x, 1, 0, none, 2)\n %e = exp(%a)\n %o = log(%e)\n return %o\n}";
    let got = run1(src, iota(&[2, 3]));
    for (g, w) in got.iter().zip([0.0, 2.0, 3.0, 5.0]) {
        assert!((g - w).abs() < 1e-5);
    }
}

#[test]
fn promotion_and_integer_semantics() {
    let i = t(DType::I32, &[4], &[-7.0, -1.0, 5.0, 2147483647.0]);
    let run = |body: &str| {
        let src = format!("graph f(%i: i32[4]) {{\n {body}\n return %o\n}}");
        let r = run_text(&src, vec![i.clone()]);
        (r.outputs[0].dtype(), r.outputs[0].values())
    };
    assert_eq!(
        run("%o = add(%i, 1)"),
        (DType::I32, vec![-6.0, 0.0, 6.0, -2147483648.0])
    );
    assert_eq!(run("%o = add(%i, 0.5)").0, DType::F32);
    assert_eq!(
        run("%o = div(%i, 2)"),
        (DType::F32, vec![-3.5, -0.5, 2.5, 1073741824.0])
    );
    assert_eq!(run("%o = div(%i, 2, \"trunc\")").1[..3], [-3.0, 0.0, 2.0]);
    assert_eq!(run("%o = div(%i, 2, \"floor\")").1[..3], [-4.0, -1.0, 2.0]);
    // Integer sums are i64, as in eager: no wrap.
    assert_eq!(run("%o = sum(%i)"), (DType::I64, vec![2147483644.0]));
    assert_eq!(run("%o = arange(0, 4)").0, DType::I64);
    assert_eq!(run("%o = full([2], 3)").0, DType::I64);
    // A bool mask's result shape depends on its values: refused clearly.
    let e = kiln::functionalize::parse(
        "graph f(%x: f32[4], %m: bool[4]) {\n %o = index(%x, [%m])\n return %o\n}",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("bool mask") && e.contains("line 2"), "{e}");
    assert_eq!(
        run("%o = gt(%i, 0)"),
        (DType::Bool, vec![0.0, 0.0, 1.0, 1.0])
    );
    assert_eq!(run("%o = exp(%i)").0, DType::F32);
    assert_eq!(
        run("%h = full([4], 1.5, f16)\n %o = add(%i, %h)").0,
        DType::F16
    );
}

/// Every op in the table is used by some example program and by some op
/// program, so the PyTorch fixtures cover the whole table.
#[test]
fn every_op_is_exercised() {
    let mut text = String::new();
    for dir in ["examples/programs", "tests/programs/ops"] {
        for p in common::programs(&common::root().join(dir)) {
            text.push_str(&std::fs::read_to_string(p).unwrap());
        }
    }
    let examples: String = common::programs(&common::root().join("examples/programs"))
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    let used = |src: &str, name: &str| {
        src.contains(&format!(" {name}(")) || src.contains(&format!("= {name}("))
    };
    let mut missing = vec![];
    for op in &ops::TABLE.ops {
        if !used(&examples, &op.name) {
            missing.push(format!("{} (examples)", op.name));
        }
        if !used(&text, &op.name) {
            missing.push(op.name.clone());
        }
    }
    assert!(missing.is_empty(), "ops not exercised: {missing:?}");
}
