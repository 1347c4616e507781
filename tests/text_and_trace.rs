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
