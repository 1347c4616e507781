//! Function transforms (`../shared/spec/transforms.md`) checked on the
//! reference interpreter with floats held exactly in f64: every op's VJP
//! and JVP against central finite differences, every batching rule
//! against a loop over the batch, compositions, and the refusals.

use kiln::functionalize::dtype::with_exact_floats;
use kiln::functionalize::transform::{grad, jvp, vjp, vmap};
use kiln::functionalize::{parse, run, DType, Graph, RTensor};

mod common;
use common::fd::*;
use common::transform_cases::CASES;

fn case(name: &str) -> &'static str {
    let head = format!("graph {name}(");
    CASES
        .iter()
        .find(|s| s.starts_with(&head))
        .unwrap_or_else(|| panic!("no case {name}"))
}

#[test]
fn every_vjp_rule_matches_finite_differences() {
    for src in CASES {
        check_vjp(src);
    }
}

#[test]
fn every_jvp_rule_matches_finite_differences() {
    for src in CASES {
        check_jvp(src);
    }
}

#[test]
fn every_batching_rule_matches_a_loop() {
    for src in CASES {
        check_vmap(src, &|_, _, _| Some(0));
        // First parameter unbatched, the others batched at their last dim.
        check_vmap(src, &|i, _, n| {
            if i == 0 && n > 1 {
                None
            } else {
                Some(-1)
            }
        });
        // Every parameter batched in the middle.
        check_vmap(src, &|_, r, _| Some((r / 2) as i64));
    }
}

/// Runs a transformed program and returns its outputs' values.
fn outs(g: &Graph, ins: &[RTensor]) -> Vec<Vec<f64>> {
    exec(g, ins).iter().map(|t| t.values()).collect()
}

/// The Jacobian of output `k` by parameter `i`, by central differences.
fn fd_jacobian(g: &Graph, x: &[RTensor], k: usize, i: usize) -> Vec<f64> {
    let n = x[i].meta.numel();
    let m = exec(g, x)[k].meta.numel();
    let mut jac = vec![0.0; m * n];
    for e in 0..n {
        let mut d = vec![0.0; n];
        d[e] = 1.0;
        let p = exec(g, &bumped(x, i, &d, H))[k].values();
        let q = exec(g, &bumped(x, i, &d, -H))[k].values();
        for r in 0..m {
            jac[r * n + e] = (p[r] - q[r]) / (2.0 * H);
        }
    }
    jac
}

#[test]
fn jacrev_and_jacfwd_are_the_jacobian() {
    use kiln::functionalize::transform::{jacfwd, jacrev};
    for name in ["linear", "softmax", "layer_norm", "attention", "views"] {
        let src = case(name);
        let g = parse(src).unwrap();
        let x = inputs(&g, 5);
        let (r, f) = (jacrev(&g, None).unwrap(), jacfwd(&g, None).unwrap());
        let (jr, jf) = (outs(&r, &x), outs(&f, &x));
        let mut n = 0;
        for k in float_outputs(&g) {
            for i in 0..g.inputs.len() {
                let fd = fd_jacobian(&g, &x, k, i);
                let want_shape: Vec<usize> = exec(&g, &x)[k]
                    .sizes()
                    .iter()
                    .chain(x[i].sizes())
                    .copied()
                    .collect();
                assert_eq!(
                    exec(&r, &x)[n].sizes(),
                    &want_shape[..],
                    "{}: jacrev block {n} shape",
                    g.name
                );
                for (e, w) in fd.iter().enumerate() {
                    near(
                        &format!("{}: jacrev d out {k} / d param {i} [{e}]", g.name),
                        jr[n][e],
                        *w,
                    );
                    near(
                        &format!("{}: jacfwd d out {k} / d param {i} [{e}]", g.name),
                        jf[n][e],
                        *w,
                    );
                }
                n += 1;
            }
        }
    }
}

const LOSS: &str = "graph loss(%w: f32[3, 2], %b: f32[3], %x: f32[4, 2]) {
  %h = linear(%x, %w, %b)
  %a = gelu(%h)
  %s = softmax(%a, 1)
  %l = log(%s)
  %m = mean(%l)
  %n = neg(%m)
  return (%n, %a)
}";

#[test]
fn hessian_and_hessian_vector_products_match_finite_differences() {
    use kiln::functionalize::transform::hessian;
    let g = parse(LOSS).unwrap();
    let x = inputs(&g, 6);
    let wrt = ["w".to_string(), "b".to_string()];
    let gr = grad(&g, Some(&wrt), false).unwrap();
    // Hessian blocks against differences of the gradient program.
    let h = outs(&hessian(&g, Some(&wrt)).unwrap(), &x);
    let mut n = 0;
    for k in 0..2 {
        for i in 0..2 {
            let fd = fd_jacobian(&gr, &x, k, i);
            for (e, w) in fd.iter().enumerate() {
                near(&format!("hessian block ({k}, {i}) [{e}]"), h[n][e], *w);
            }
            n += 1;
        }
    }
    // jvp(grad): H v in one pass.
    let hvp = jvp(&gr, Some(&wrt)).unwrap();
    let v = inputs(&g, 7);
    let mut ins = x.clone();
    ins.extend([v[0].clone(), v[1].clone()]);
    let got = outs(&hvp, &ins);
    let plus = bumped(&bumped(&x, 0, &v[0].values(), H), 1, &v[1].values(), H);
    let minus = bumped(&bumped(&x, 0, &v[0].values(), -H), 1, &v[1].values(), -H);
    let (p, m) = (outs(&gr, &plus), outs(&gr, &minus));
    for k in 0..2 {
        for (e, (a, b)) in p[k].iter().zip(&m[k]).enumerate() {
            near(
                &format!("hvp {k} [{e}]"),
                got[2 + k][e],
                (a - b) / (2.0 * H),
            );
        }
    }
}

#[test]
fn grad_of_grad_and_per_example_gradients() {
    // grad(grad) of a scalar function: d2/dx2 (x^3 sin x).
    let g =
        parse("graph f(%x: f32[]) { %c = pow(%x, 3) %s = sin(%x) %y = mul(%c, %s) return (%y) }")
            .unwrap();
    let gg = grad(&grad(&g, None, false).unwrap(), None, false).unwrap();
    for x0 in [-1.3, 0.4, 2.0] {
        let x = vec![RTensor::new(DType::F32, vec![], &[x0])];
        let x0 = x[0].values()[0];
        let want = 6.0 * x0 * x0.sin() + 6.0 * x0 * x0 * x0.cos() - x0.powi(3) * x0.sin();
        near("grad(grad(x^3 sin x))", outs(&gg, &x)[0][0], want);
    }
    // vmap(grad): per-example gradients of the loss over rows of %x.
    let g = parse(LOSS).unwrap();
    let gr = grad(&g, Some(&["w".to_string(), "b".to_string()]), true).unwrap();
    let per = vmap(&gr, &[None, None, Some(0)], 5, None).unwrap();
    let x = inputs(&g, 8);
    let rows: Vec<Vec<RTensor>> = (0..5).map(|k| inputs(&g, 20 + k)).collect();
    let batched = stack_at(&rows.iter().map(|r| r[2].clone()).collect::<Vec<_>>(), 0);
    let got = outs(&per, &[x[0].clone(), x[1].clone(), batched]);
    for (k, r) in rows.iter().enumerate() {
        let want = outs(&gr, &[x[0].clone(), x[1].clone(), r[2].clone()]);
        for o in 0..3 {
            let n = want[o].len();
            for e in 0..n {
                let a = got[o][k * n + e];
                assert!(
                    (a - want[o][e]).abs() <= 1e-9 * (1.0 + a.abs()),
                    "per-example output {o}, example {k} [{e}]: {a} vs {}",
                    want[o][e]
                );
            }
        }
    }
}

/// A program that mutates its parameters through views.
const MUTATES: &str = "graph m(%a: f32[3, 4], %b: f32[4]) {
  %r = select(%a, 0, 1)
  %w = mul_(%r, %b)
  %t = transpose(%a, 0, 1)
  %s = sum(%t, 1)
  %u = exp_(%b)
  %y = mul(%s, %u)
  return (%y)
}";

#[test]
fn mutated_parameters_keep_their_epilogue() {
    let g = parse(MUTATES).unwrap();
    let x = inputs(&g, 9);
    let eager = with_exact_floats(|| {
        let ins: Vec<RTensor> = x
            .iter()
            .map(|t| RTensor::new(t.dtype(), t.sizes().to_vec(), &t.values()))
            .collect();
        run(&g, ins).unwrap()
    });
    // vjp: final parameters as eager's, gradients as finite differences.
    check_vjp(MUTATES);
    check_jvp(MUTATES);
    let v = vjp(&g, None).unwrap();
    let mut ins = x.clone();
    ins.push(RTensor::new(DType::F32, vec![4], &[0.5, -1.0, 2.0, 0.25]));
    let r = with_exact_floats(|| {
        run(
            &v,
            ins.iter()
                .map(|t| RTensor::new(t.dtype(), t.sizes().to_vec(), &t.values()))
                .collect(),
        )
        .unwrap()
    });
    for i in 0..2 {
        assert_eq!(
            r.inputs[i].values(),
            eager.inputs[i].values(),
            "vjp: final value of parameter {i}"
        );
    }
    // vmap: a batched parameter written back batched, as a loop would.
    check_vmap(MUTATES, &|_, _, _| Some(0));
    let b = vmap(&g, &[Some(1), Some(0)], 2, None).unwrap();
    let per: Vec<Vec<RTensor>> = (0..2).map(|k| inputs(&g, 30 + k)).collect();
    let ins = vec![
        stack_at(&[per[0][0].clone(), per[1][0].clone()], 1),
        stack_at(&[per[0][1].clone(), per[1][1].clone()], 0),
    ];
    let r = with_exact_floats(|| run(&b, ins).unwrap());
    for (k, p) in per.iter().enumerate() {
        let e = with_exact_floats(|| {
            run(
                &g,
                p.iter()
                    .map(|t| RTensor::new(t.dtype(), t.sizes().to_vec(), &t.values()))
                    .collect(),
            )
            .unwrap()
        });
        let a = r.inputs[0].values();
        let want = e.inputs[0].values();
        // Parameter 0 is [3, 2, 4] with the batch at 1.
        for i in 0..3 {
            for j in 0..4 {
                let got = a[i * 8 + k * 4 + j];
                assert!(
                    (got - want[i * 4 + j]).abs() < 1e-9,
                    "vmap: final %a, example {k} [{i}, {j}]"
                );
            }
        }
    }
}

fn err_of(r: kiln::functionalize::Result<Graph>) -> String {
    match r {
        Ok(g) => panic!(
            "expected a refusal, got\n{}",
            kiln::functionalize::print(&g)
        ),
        Err(e) => e.to_string(),
    }
}

#[test]
fn refusals_say_what_and_where() {
    let g = parse(LOSS).unwrap();
    let e = err_of(grad(&g, Some(&["q".into()]), false));
    assert!(
        e.contains("no parameter `q`") && e.contains("w, b, x"),
        "{e}"
    );
    let i = parse(
        "graph f(%x: f32[3], %i: i64[2]) { %y = index_select(%x, 0, %i) %s = sum(%y) return (%s) }",
    )
    .unwrap();
    let e = err_of(vjp(&i, Some(&["i".into()])));
    assert!(
        e.contains("parameter `i` is i64") && e.contains("floating point"),
        "{e}"
    );
    let e = err_of(grad(
        &parse("graph f(%x: f32[3]) { %y = exp(%x) return (%y) }").unwrap(),
        None,
        false,
    ));
    assert!(
        e.contains("0-d floating point") && e.contains("f32[3]"),
        "{e}"
    );
    let d = parse("graph f(%w: f32[4, 2]) { %i = arange(3, i64) %a = embedding(%w, %i, -1, true) return (%a) }").unwrap();
    let e = err_of(vjp(&d, None));
    assert!(
        e.contains("line 1: `%embedding = embedding(%w, %arange, -1, true)`")
            && e.contains("scale_grad_by_freq")
            && e.contains("vjp"),
        "{e}"
    );
    let m = parse("graph f(%x: f32[3], %y: f32[3]) { %a = add_(%x, %y) return (%a) }").unwrap();
    let e = err_of(vmap(&m, &[None, Some(0)], 2, None));
    assert!(
        e.contains("parameter `x` is not batched") && e.contains("batched value"),
        "{e}"
    );
    let e = err_of(vmap(&m, &[Some(0)], 2, None));
    assert!(e.contains("1 in-dims given for 2 parameters"), "{e}");
    let e = err_of(vmap(&m, &[Some(2), Some(0)], 2, None));
    assert!(e.contains("in-dim of parameter `x`"), "{e}");
}

/// Every op a functionalized program can hold has its three rules, and
/// every op whose derivative flows is exercised by a case above or by an
/// example program (whose transforms are checked against torch.func's,
/// `torch_func_fixtures_on_the_reference`).
#[test]
fn every_op_has_rules_and_a_case() {
    use kiln::functionalize::ops::{OpKind, TABLE};
    use kiln::functionalize::{functionalize, Remove};
    let mut seen = std::collections::BTreeSet::new();
    let examples: Vec<String> = common::example_names()
        .iter()
        .map(|name| {
            let p = common::root().join(format!("examples/programs/{name}.txt"));
            std::fs::read_to_string(p).unwrap()
        })
        .collect();
    for src in CASES
        .iter()
        .copied()
        .chain(examples.iter().map(String::as_str))
    {
        let f = functionalize(&parse(src).unwrap(), Remove::MutationsAndViews).unwrap();
        for &n in &f.graph.order {
            seen.insert(f.graph.nodes[n].op.name().to_string());
        }
    }
    // Results that are integers, bools or constants: no derivative flows.
    let constant = [
        "zeros",
        "ones",
        "full",
        "arange",
        "zeros_like",
        "ones_like",
        "full_like",
        "zero",
        "sign",
        "floor_divide",
        "argmax",
        "argmin",
        "eq",
        "ne",
        "lt",
        "le",
        "gt",
        "ge",
        "logical_not",
        "logical_and",
        "logical_or",
        "logical_xor",
        "isnan",
        "isinf",
        "isposinf",
        "isneginf",
        "isfinite",
    ];
    let mut missing = vec![];
    for op in &TABLE.ops {
        let functional = matches!(op.kind, OpKind::Functional | OpKind::Factory);
        if matches!(op.rule, kiln::functionalize::ops::Rule::Composite(_)) {
            // Transformed as its parts (`functionalize_decomposed`).
            continue;
        }
        let r = op.rules;
        if !functional {
            assert!(
                r.vjp.is_none() && r.jvp.is_none() && r.batch.is_none(),
                "{}: views and in-place ops are functionalized before any transform",
                op.name
            );
            continue;
        }
        assert!(
            r.vjp.is_some() && r.jvp.is_some(),
            "{} has no derivative rules",
            op.name
        );
        assert!(
            r.batch.is_some() || op.kind == OpKind::Factory,
            "{} has no batching rule",
            op.name
        );
        if !constant.contains(&op.name.as_str()) && !seen.contains(&op.name) {
            missing.push(op.name.clone());
        }
    }
    assert!(
        missing.is_empty(),
        "ops with derivative rules that no case exercises: {missing:?}"
    );
}

/// Random programs of views and mutations: the VJP is the adjoint of the
/// JVP (`<ct, J t> = <J^T ct, t>`, no differencing), the JVP matches
/// central differences where the function is smooth, and `vmap` matches a
/// loop over the batch.
#[test]
fn random_programs_through_vjp_jvp_and_vmap() {
    use kiln::functionalize::random::{random_program, Seeded};
    let (mut checked, mut kinks, mut refused) = (0, 0, vec![]);
    for seed in 0..150u64 {
        let g = random_program(&mut Seeded(seed), 10);
        if !g.inputs.iter().all(|&v| g.meta(v).dtype.is_float()) {
            continue;
        }
        let (v, j) = match (vjp(&g, None), jvp(&g, None)) {
            (Ok(v), Ok(j)) => (v, j),
            (Err(e), _) | (_, Err(e)) => {
                refused.push(format!("seed {seed}: {e}"));
                continue;
            }
        };
        let x = inputs(&g, seed);
        let ts = inputs(&g, seed + 1000);
        let fo = float_outputs(&g);
        let base = exec(&g, &x);
        let mut s = seed | 1;
        let cts: Vec<RTensor> = fo
            .iter()
            .map(|&k| {
                RTensor::new(
                    base[k].dtype(),
                    base[k].sizes().to_vec(),
                    &values(base[k].meta.numel(), &mut s),
                )
            })
            .collect();
        let mut vin = x.clone();
        vin.extend(cts.iter().cloned());
        let mut jin = x.clone();
        jin.extend(ts.iter().cloned());
        let (vo, jo) = (outs(&v, &vin), outs(&j, &jin));
        let no = g.outputs.len();
        let lhs: f64 = fo
            .iter()
            .enumerate()
            .map(|(n, _)| {
                jo[no + n]
                    .iter()
                    .zip(cts[n].values())
                    .map(|(a, b)| a * b)
                    .sum::<f64>()
            })
            .sum();
        let rhs: f64 = (0..x.len())
            .map(|i| {
                vo[no + i]
                    .iter()
                    .zip(ts[i].values())
                    .map(|(a, b)| a * b)
                    .sum::<f64>()
            })
            .sum();
        let scale = 1.0 + lhs.abs().max(rhs.abs());
        assert!(
            (lhs - rhs).abs() <= 1e-9 * scale || (lhs.is_nan() && rhs.is_nan()),
            "seed {seed}: <ct, J t> = {lhs} but <J^T ct, t> = {rhs}\n{}",
            kiln::functionalize::print(&g)
        );
        let step = |h: f64| -> Vec<Vec<f64>> {
            let p = along(&x, &ts, h);
            let m = along(&x, &ts, -h);
            let (p, m) = (outs(&g, &p), outs(&g, &m));
            fo.iter()
                .map(|&k| {
                    p[k].iter()
                        .zip(&m[k])
                        .map(|(a, b)| (a - b) / (2.0 * h))
                        .collect()
                })
                .collect()
        };
        let (f1, f2) = (step(1e-6), step(1e-7));
        for (n, _) in fo.iter().enumerate() {
            for e in 0..f1[n].len() {
                let (a, b, got) = (f1[n][e], f2[n][e], jo[no + n][e]);
                if !a.is_finite() || (a - b).abs() > 1e-4 * (1.0 + a.abs()) {
                    kinks += 1; // a discontinuity or kink within reach of the step
                    continue;
                }
                near(
                    &format!("seed {seed}: tangent of floating output {n} [{e}]"),
                    got,
                    a,
                );
            }
        }
        check_vmap_graph(&g, seed);
        checked += 1;
    }
    eprintln!("{checked} random programs checked, {kinks} elements at kinks skipped");
    assert!(
        checked >= 100,
        "only {checked} random programs checked; refused: {refused:#?}"
    );
    assert!(refused.is_empty(), "{refused:#?}");
    assert!(kinks < checked * 4, "{kinks} elements at kinks");
}

fn check_vmap_graph(g: &Graph, seed: u64) {
    let src = kiln::functionalize::print(g);
    let leaked: &'static str = Box::leak(src.into_boxed_str());
    let _ = seed;
    check_vmap(leaked, &|_, _, _| Some(0));
}

/// `torch.func` on the example programs (fixtures), on the reference.
#[test]
fn torch_func_fixtures_on_the_reference() {
    let (mut n, mut failures) = (0, vec![]);
    for name in common::example_names() {
        let mut exec = |g: &Graph, ins: Vec<RTensor>| {
            run(g, ins).map(|r| r.outputs).map_err(|e| e.to_string())
        };
        match common::check_torch_transforms(&name, &mut exec, 1e-4) {
            Ok(k) => n += k,
            Err(m) => failures.push(m),
        }
    }
    assert!(
        failures.is_empty(),
        "{} differ from torch.func:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(n >= 100, "only {n} transforms compared");
    // Where torch.func is wrong, finite differences (or a loop) decide.
    for (name, transform) in common::TORCH_FUNC_WRONG {
        let src =
            std::fs::read_to_string(common::root().join(format!("examples/programs/{name}.txt")))
                .unwrap();
        match transform {
            "vmap" => check_vmap(&src, &|_, _, _| Some(0)),
            _ => {
                check_vjp(&src);
                check_jvp(&src);
            }
        }
    }
}

/// The op table's transform rules as `docs/transforms.md` lists them.
fn rules_table() -> String {
    use kiln::functionalize::ops::{OpKind, TABLE};
    let mut s = String::from("| op | vjp | jvp | batching |\n|---|---|---|---|\n");
    let yes = |b: bool| if b { "yes" } else { "-" };
    for op in TABLE
        .ops
        .iter()
        .filter(|o| matches!(o.kind, OpKind::Functional | OpKind::Factory))
    {
        if matches!(op.rule, kiln::functionalize::ops::Rule::Composite(_)) {
            s += &format!("| `{}` | its parts | its parts | its parts |\n", op.name);
            continue;
        }
        let r = op.rules;
        let batch = match (r.batch.is_some(), op.kind) {
            (_, OpKind::Factory) => "never batched",
            (true, _) => "yes",
            _ => "-",
        };
        s += &format!(
            "| `{}` | {} | {} | {batch} |\n",
            op.name,
            yes(r.vjp.is_some()),
            yes(r.jvp.is_some())
        );
    }
    s
}

#[test]
fn the_docs_list_every_ops_rules() {
    let doc = std::fs::read_to_string(common::root().join("docs/transforms.md")).unwrap();
    let want = rules_table();
    assert!(
        doc.contains(&want),
        "docs/transforms.md must contain the rules table:\n{want}"
    );
}

/// `out_dims` places each output's batch dimension; an unbatched output
/// is broadcast to the batch size there, as `torch.func.vmap` does.
#[test]
fn vmap_out_dims_place_the_batch() {
    let g = parse(
        "graph f(%x: f32[2, 3], %w: f32[3]) { %y = mul(%x, %w) %z = exp(%w) return (%y, %z) }",
    )
    .unwrap();
    let b = vmap(&g, &[Some(0), None], 4, Some(&[-1, 1])).unwrap();
    assert_eq!(b.meta(b.outputs[0]).sizes.to_vec(), vec![2, 3, 4]);
    assert_eq!(b.meta(b.outputs[1]).sizes.to_vec(), vec![3, 4]);
    let per: Vec<Vec<RTensor>> = (0..4).map(|k| inputs(&g, 40 + k)).collect();
    let x = stack_at(&per.iter().map(|p| p[0].clone()).collect::<Vec<_>>(), 0);
    let got = outs(&b, &[x, per[0][1].clone()]);
    for (k, p) in per.iter().enumerate() {
        let want = outs(&g, &[p[0].clone(), per[0][1].clone()]);
        for e in 0..6 {
            assert!(
                (got[0][e * 4 + k] - want[0][e]).abs() < 1e-12,
                "output 0, example {k} [{e}]"
            );
        }
        for e in 0..3 {
            assert!(
                (got[1][e * 4 + k] - want[1][e]).abs() < 1e-12,
                "output 1 (unbatched), example {k} [{e}]"
            );
        }
    }
    let e = err_of(vmap(&g, &[Some(0), None], 4, Some(&[0, 0, 0])));
    assert!(e.contains("3 out-dims given for 2 outputs"), "{e}");
}
