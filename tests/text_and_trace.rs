//! The text format round-trips, and tracing from Rust builds the same graph
//! as parsing the equivalent text.

mod common;

use common::{programs, root};
use kiln::functionalize::{args, trace::full, DType, TensorSpec};
use kiln::{parse, print, trace};

#[test]
fn every_program_round_trips() {
    let mut n = 0;
    for dir in ["examples/programs", "tests/programs/ops"] {
        for p in programs(&root().join(dir)) {
            let src = std::fs::read_to_string(&p).unwrap();
            let g = parse(&src).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            let text = print(&g);
            let g2 = parse(&text).unwrap_or_else(|e| {
                panic!("{}: printed text does not parse: {e}\n{text}", p.display())
            });
            assert!(
                g.same_as(&g2),
                "{}: round trip changed the graph:\n{text}",
                p.display()
            );
            assert_eq!(text, print(&g2), "{}: printing is not stable", p.display());
            n += 1;
        }
    }
    assert!(n >= 25, "only {n} programs found");
}

#[test]
fn tracing_equals_parsing() {
    let traced = trace(
        "f",
        &[
            TensorSpec::new("x", DType::F32, &[4, 6]),
            TensorSpec::new("m", DType::Bool, &[6, 4]),
        ],
        |i| {
            let (x, m) = (&i[0], &i[1]);
            let v = x.view(&[6, 4]);
            let s = v.slice(0, Some(1), None, 2);
            s.add_(1.0);
            let t = v.t();
            let y = &(&t * 2.0) + &t.exp();
            v.masked_fill_(m, f64::NEG_INFINITY);
            let parts = x.chunk(2, 1);
            parts[1].zero_();
            let k = full(&[4, 6], 3, DType::I32);
            let g = y.gelu().layer_norm(&[6], None, None, 1e-5).softmax(-1);
            let r = x.op(
                "index_put_",
                args![
                    x,
                    vec![Some(&k.select(1, 0))],
                    &x.select(0, 0).unsqueeze(0),
                    true
                ],
            );
            vec![g, parts[0].clone(), r]
        },
    )
    .unwrap();
    let text = "graph f(%x: f32[4, 6], %m: bool[6, 4]) {
      %v = view(%x, [6, 4])
      %s = slice(%v, 0, 1, none, 2)
      %a = add_(%s, 1.0)
      %t = t(%v)
      %t2 = mul(%t, 2.0)
      %e = exp(%t)
      %y = add(%t2, %e)
      %mf = masked_fill_(%v, %m, -inf)
      %p0, %p1 = chunk(%x, 2, 1)
      %z = zero_(%p1)
      %k = full([4, 6], 3, i32)
      %g0 = gelu(%y)
      %g1 = layer_norm(%g0, [6], none, none, 1e-5)
      %g = softmax(%g1, -1)
      %k0 = select(%k, 1, 0)
      %x0 = select(%x, 0, 0)
      %x1 = unsqueeze(%x0, 0)
      %r = index_put_(%x, [%k0], %x1, true)
      return (%g, %p0, %r)
    }";
    let parsed = parse(text).unwrap();
    assert!(
        traced.same_as(&parsed),
        "traced:\n{}\nparsed:\n{}",
        print(&traced),
        print(&parsed)
    );
}

#[test]
fn tracing_errors_are_returned_not_panicked() {
    let r = trace("f", &[TensorSpec::new("x", DType::F32, &[2, 3])], |i| {
        let bad = i[0].view(&[4, 2]);
        vec![bad.exp()]
    });
    let e = r.unwrap_err().to_string();
    assert!(
        e.contains("view") && e.contains("invalid for input of size 6"),
        "{e}"
    );
    let r = trace("f", &[TensorSpec::new("x", DType::I32, &[2])], |i| {
        vec![i[0].add_(1.5)]
    });
    assert!(r.unwrap_err().to_string().contains("can't be cast"));
}

/// Programs past `PARALLEL_LINES` (2000) are parsed on two threads and
/// `parse_functionalized` functionalizes them as they are built: the graph
/// and the result must be those of the one-thread path, in both modes.
#[test]
fn large_programs_parse_and_functionalize_as_small_ones() {
    use kiln::functionalize::random::{random_program, Seeded};
    use kiln::functionalize::{functionalize, parse_functionalized, Remove};
    for seed in [3, 42] {
        let g = random_program(&mut Seeded(seed), 6000);
        let text = print(&g);
        let parsed = parse(&text).unwrap();
        assert!(
            parsed.same_as(&g),
            "seed {seed}: two-thread parse changed the graph"
        );
        assert_eq!(print(&parsed), text, "seed {seed}: names changed");
        for mode in [Remove::Mutations, Remove::MutationsAndViews] {
            let whole = functionalize(&parsed, mode).unwrap();
            let (g2, pruned) = parse_functionalized(&text, mode).unwrap();
            assert!(g2.same_as(&g));
            // Printed with its dead nodes still in the arena, and freed.
            let printed = pruned.print().unwrap();
            let streamed = pruned.verified().unwrap();
            assert_eq!(
                printed,
                print(&whole.graph),
                "seed {seed} {mode:?}: streamed functionalization differs"
            );
            assert_eq!(print(&streamed.graph), printed);
            assert!(streamed.graph.same_as(&whole.graph));
            assert_eq!(streamed.mutated_inputs, whole.mutated_inputs);
        }
    }
}

/// Errors of a large program keep file order across the two threads: a
/// statement the pass refuses is reported (named from the whole graph)
/// unless a parse error follows it anywhere in the file, which comes first,
/// as `parse` then `functionalize` give.
#[test]
fn large_program_errors_keep_file_order() {
    use kiln::functionalize::random::{random_program, Seeded};
    use kiln::functionalize::{parse_functionalized, Remove};
    let text = print(&random_program(&mut Seeded(42), 5000));
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    // A write through a view that partially overlaps the operand.
    let refused = [
        "  %h0 = zeros([4, 6])",
        "  %h1 = slice(%h0, 1, 0, 5)",
        "  %h2 = slice(%h0, 1, 1, 6)",
        "  %h3 = add_(%h1, %h2)",
    ];
    for (i, l) in refused.iter().enumerate() {
        lines.insert(1500 + i, l.to_string());
    }
    let refused_text = lines.join("\n");
    let e = parse_functionalized(&refused_text, Remove::Mutations)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("line 1504: `%h3 = add_(%h1, %h2)`: unsupported operation"),
        "{e}"
    );
    let whole =
        kiln::functionalize::functionalize(&parse(&refused_text).unwrap(), Remove::Mutations)
            .unwrap_err()
            .to_string();
    assert_eq!(e, whole);
    // The same, with a syntax error 3000 lines later.
    lines[4500] = lines[4500].replacen('(', "((", 1);
    let e = parse_functionalized(&lines.join("\n"), Remove::Mutations)
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("4501:"), "{e}");
    assert!(e.contains("expected an argument"), "{e}");
    // A shape error in one statement comes before a syntax error after it.
    lines[4500] = lines[4500].replacen("((", "(", 1);
    lines[2000] = "  %bad = add(%h0, %h0, %h0, %h0, %h0)".into();
    lines[4000] = lines[4000].replacen('(', "((", 1);
    let e = parse(&lines.join("\n")).unwrap_err().to_string();
    assert!(e.starts_with("line 2001: `%bad = add("), "{e}");
}
