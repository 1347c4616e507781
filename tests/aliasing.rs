//! Aliasing in the reference interpreter: a mutation through any view is
//! seen by the base and by every other view of it, and mutations of
//! parameters show in their final values.

mod common;

use common::{iota, run_text};

#[test]
fn write_through_view_chain_reaches_base_and_siblings() {
    let r = run_text(
        "graph f(%x: f32[4, 6]) {
           %b = clone(%x)
           %v = view(%b, [6, 4])
           %t = transpose(%v, 0, 1)      # [4, 6] view of the same storage
           %row = select(%v, 0, 1)       # elements 4..8
           %col = select(%t, 1, 1)       # the same elements, through another path
           %w = add_(%row, 100)
           %d = diagonal(%v)             # elements 0, 5, 10, 15
           return (%b, %col, %d)
         }",
        vec![iota(&[4, 6])],
    );
    let b = r.outputs[0].values();
    assert_eq!(&b[4..8], &[104.0, 105.0, 106.0, 107.0]);
    assert_eq!(b[3], 3.0);
    assert_eq!(r.outputs[1].values(), vec![104.0, 105.0, 106.0, 107.0]);
    assert_eq!(r.outputs[2].values(), vec![0.0, 105.0, 10.0, 15.0]);
    // The parameter itself was not mutated: `clone` made a copy.
    assert_eq!(r.inputs[0].values(), iota(&[4, 6]).values());
}

#[test]
fn mutating_a_parameter_through_views_shows_in_its_final_value() {
    let r = run_text(
        "graph f(%x: f32[3, 3]) {
           %s = slice(%x, 1, 0, 3, 2)    # columns 0 and 2
           %a = mul_(%s, -1)
           %u0, %u1, %u2 = unbind(%x, 0)
           return ()
         }",
        vec![iota(&[3, 3])],
    );
    assert!(r.outputs.is_empty());
    assert_eq!(
        r.inputs[0].values(),
        vec![-0.0, 1.0, -2.0, -3.0, 4.0, -5.0, -6.0, 7.0, -8.0]
    );
}

#[test]
fn multi_output_views_alias_their_base() {
    let r = run_text(
        "graph f(%x: f32[6]) {
           %a, %b, %c = chunk(%x, 3)
           %z = zero_(%b)
           %p, %q = split(%x, [4, 2])
           %f = fill_(%q, 9)
           return (%a, %p)
         }",
        vec![iota(&[6])],
    );
    assert_eq!(r.inputs[0].values(), vec![0.0, 1.0, 0.0, 0.0, 9.0, 9.0]);
    assert_eq!(r.outputs[0].values(), vec![0.0, 1.0]);
    assert_eq!(r.outputs[1].values(), vec![0.0, 1.0, 0.0, 0.0]);
}

#[test]
fn reshape_aliases_only_when_it_can_view() {
    let r = run_text(
        "graph f(%x: f32[2, 3]) {
           %v = reshape(%x, [3, 2])      # contiguous: a view
           %a = add_(%v, 1)
           %t = t(%x)
           %c = reshape(%t, [6])         # transposed: a copy
           %z = zero_(%c)
           %k = contiguous(%x)           # already contiguous: the same tensor
           %m = mul_(%k, 10)
           return (%c)
         }",
        vec![iota(&[2, 3])],
    );
    assert_eq!(
        r.inputs[0].values(),
        vec![10.0, 20.0, 30.0, 40.0, 50.0, 60.0]
    );
    assert_eq!(r.outputs[0].values(), vec![0.0; 6]);
}

#[test]
fn fill_through_expand_and_copy_between_rows() {
    let r = run_text(
        "graph f(%x: f32[3]) {
           %e = expand(%x, [4, 3])
           %f = fill_(%e, 2.5)           # every row is the same storage
           %m = view(%x, [3, 1])
           %r0 = select(%m, 0, 0)
           %r2 = select(%m, 0, 2)
           %c = copy_(%r2, %r0)
           return (%e)
         }",
        vec![iota(&[3])],
    );
    assert_eq!(r.inputs[0].values(), vec![2.5, 2.5, 2.5]);
    assert_eq!(r.outputs[0].sizes(), &[4, 3]);
}

#[test]
fn overlapping_writes_are_refused() {
    for (src, what) in [
        (
            "%e = expand(%x, [2, 3])\n %a = add_(%e, 1)",
            "add_ into expand",
        ),
        (
            "%u = unfold(%x, 0, 2, 1)\n %a = mul_(%u, 2)",
            "mul_ into overlapping unfold",
        ),
        (
            "%a = slice(%x, 0, 1, 3)\n %b = slice(%x, 0, 0, 2)\n %c = add_(%a, %b)",
            "add_ reading what it overwrites",
        ),
    ] {
        let prog = format!("graph f(%x: f32[3]) {{\n {src}\n return ()\n}}");
        let refused = match kiln::parse(&prog) {
            Err(_) => true,
            Ok(g) => kiln::run(&g, vec![iota(&[3])]).is_err(),
        };
        assert!(refused, "{what} should be refused");
    }
    // A window of an overlapping unfold does not overlap itself: fine.
    let r = run_text(
        "graph f(%x: f32[4]) {
           %u = unfold(%x, 0, 2, 1)
           %w = select(%u, 0, 1)
           %a = add_(%w, 10)
           return (%u)
         }",
        vec![iota(&[4])],
    );
    assert_eq!(r.inputs[0].values(), vec![0.0, 11.0, 12.0, 3.0]);
    assert_eq!(
        r.outputs[0].values(),
        vec![0.0, 11.0, 11.0, 12.0, 12.0, 3.0]
    );
}

#[test]
fn as_strided_on_a_view_addresses_the_whole_storage() {
    let r = run_text(
        "graph f(%x: f32[8]) {
           %s = slice(%x, 0, 4, 8)
           %a = as_strided(%s, [2], [1], 1)   # storage elements 1 and 2, not 5 and 6
           %m = mul_(%a, -1)
           return (%s)
         }",
        vec![iota(&[8])],
    );
    assert_eq!(
        r.inputs[0].values(),
        vec![0.0, -1.0, -2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    );
}

#[test]
fn peak_bytes_follow_eager_lifetimes() {
    // x (4 KiB) lives throughout; a and b (4 KiB each) overlap; c replaces a.
    let r = run_text(
        "graph f(%x: f32[1024]) {
           %a = exp(%x)
           %b = add(%a, 1)
           %c = mul(%b, 2)
           return (%c)
         }",
        vec![iota(&[1024])],
    );
    assert_eq!(r.peak_bytes, 3 * 4096);
    // In-place ops allocate nothing.
    let r = run_text(
        "graph f(%x: f32[1024]) {
           %a = exp(%x)
           %b = add_(%a, 1)
           %c = mul_(%b, 2)
           return (%c)
         }",
        vec![iota(&[1024])],
    );
    assert_eq!(r.peak_bytes, 2 * 4096);
}

#[test]
fn static_eager_peak_matches_the_run() {
    for p in common::programs(&common::root().join("examples/programs")) {
        let g = kiln::parse(&std::fs::read_to_string(&p).unwrap()).unwrap();
        let rel = p.strip_prefix(common::root()).unwrap().with_extension("");
        let ins = kiln::io::load_inputs(
            &g,
            &common::root()
                .join("tests/fixtures")
                .join(rel)
                .with_extension("inputs.safetensors"),
        )
        .unwrap();
        let r = kiln::run(&g, ins).unwrap();
        assert_eq!(
            kiln::functionalize::interp::eager_peak_bytes(&g),
            r.peak_bytes,
            "{}",
            p.display()
        );
    }
}
