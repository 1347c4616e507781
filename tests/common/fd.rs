//! Derivative checks shared by the transform tests: central finite
//! differences in exact f64 on the reference interpreter, and loops over a
//! batch.

use kiln::functionalize::dtype::with_exact_floats;
use kiln::functionalize::transform::{jvp, vjp, vmap};
use kiln::functionalize::{parse, run, Graph, RTensor};

/// Deterministic values in (-1, 1) with all 53 bits random (no ties).
pub fn values(n: usize, seed: &mut u64) -> Vec<f64> {
    (0..n)
        .map(|_| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            ((*seed >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
        })
        .collect()
}

pub fn inputs(g: &Graph, seed: u64) -> Vec<RTensor> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    g.inputs
        .iter()
        .map(|&v| {
            let m = g.meta(v);
            assert!(
                m.dtype.is_float(),
                "{}: case parameters are floating",
                g.name
            );
            RTensor::new(m.dtype, m.sizes.to_vec(), &values(m.numel(), &mut s))
        })
        .collect()
}

pub fn exec(g: &Graph, ins: &[RTensor]) -> Vec<RTensor> {
    // Fresh storages: a program may write its parameters.
    with_exact_floats(|| {
        let ins: Vec<RTensor> = ins
            .iter()
            .map(|x| RTensor::new(x.dtype(), x.sizes().to_vec(), &x.values()))
            .collect();
        run(g, ins)
    })
    .unwrap_or_else(|e| panic!("{}: {e}\n{}", g.name, kiln::functionalize::print(g)))
    .outputs
}

pub fn bumped(ins: &[RTensor], i: usize, dir: &[f64], h: f64) -> Vec<RTensor> {
    let mut out = ins.to_vec();
    let v: Vec<f64> = ins[i]
        .values()
        .iter()
        .zip(dir)
        .map(|(x, d)| x + h * d)
        .collect();
    out[i] = with_exact_floats(|| RTensor::new(ins[i].dtype(), ins[i].sizes().to_vec(), &v));
    out
}

/// Every parameter moved by `h` times its direction in `ts`.
pub fn along(x: &[RTensor], ts: &[RTensor], h: f64) -> Vec<RTensor> {
    (0..x.len()).fold(x.to_vec(), |acc, i| bumped(&acc, i, &ts[i].values(), h))
}

pub fn near(what: &str, got: f64, want: f64) {
    let ok = (got - want).abs() <= 1e-6 + 1e-5 * want.abs() || (got.is_nan() && want.is_nan());
    assert!(ok, "{what}: got {got}, finite differences give {want}");
}

pub const H: f64 = 1e-6;

pub fn float_outputs(g: &Graph) -> Vec<usize> {
    (0..g.outputs.len())
        .filter(|&k| g.meta(g.outputs[k]).dtype.is_float())
        .collect()
}

/// VJP: the gradient of `<ct, f(x)>`, element by element, against central
/// differences; the forward outputs against the program's.
pub fn check_vjp(src: &str) {
    let g = parse(src).unwrap_or_else(|e| panic!("{e}\n{src}"));
    let v = vjp(&g, None).unwrap_or_else(|e| panic!("{}: vjp: {e}", g.name));
    let x = inputs(&g, 1);
    let fouts = float_outputs(&g);
    let mut s = 77u64;
    let base = exec(&g, &x);
    let cts: Vec<RTensor> = fouts
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
    let out = exec(&v, &vin);
    for (k, b) in base.iter().enumerate() {
        for (a, w) in out[k].values().iter().zip(b.values()) {
            near(&format!("{}: forward output {k}", g.name), *a, w);
        }
    }
    let dot = |o: &[RTensor]| -> f64 {
        fouts
            .iter()
            .zip(&cts)
            .map(|(&k, c)| {
                o[k].values()
                    .iter()
                    .zip(c.values())
                    .map(|(a, b)| a * b)
                    .sum::<f64>()
            })
            .sum()
    };
    for (i, xi) in x.iter().enumerate() {
        let got = out[g.outputs.len() + i].values();
        for e in 0..xi.meta.numel() {
            let mut d = vec![0.0; xi.meta.numel()];
            d[e] = 1.0;
            let fd = (dot(&exec(&g, &bumped(&x, i, &d, H)))
                - dot(&exec(&g, &bumped(&x, i, &d, -H))))
                / (2.0 * H);
            near(&format!("{}: d/d param {i} [{e}]", g.name), got[e], fd);
        }
    }
}

/// JVP: the tangent of every floating output against a central
/// difference along the tangent direction.
pub fn check_jvp(src: &str) {
    let g = parse(src).unwrap();
    let j = jvp(&g, None).unwrap_or_else(|e| panic!("{}: jvp: {e}", g.name));
    let x = inputs(&g, 2);
    let ts = inputs(&g, 3);
    let mut jin = x.clone();
    jin.extend(ts.iter().cloned());
    let out = exec(&j, &jin);
    let plus = along(&x, &ts, H);
    let minus = along(&x, &ts, -H);
    let (p, m) = (exec(&g, &plus), exec(&g, &minus));
    for (n, &k) in float_outputs(&g).iter().enumerate() {
        let got = out[g.outputs.len() + n].values();
        for (e, (a, b)) in p[k].values().iter().zip(m[k].values()).enumerate() {
            near(
                &format!("{}: tangent of output {k} [{e}]", g.name),
                got[e],
                (a - b) / (2.0 * H),
            );
        }
    }
}

/// `per[n]` stacked with the new dimension at `d`.
pub fn stack_at(per: &[RTensor], d: usize) -> RTensor {
    let s = per[0].sizes().to_vec();
    let mut bs = s.clone();
    bs.insert(d, per.len());
    let vals: Vec<Vec<f64>> = per.iter().map(|t| t.values()).collect();
    let outer: usize = s[..d].iter().product();
    let inner: usize = s[d..].iter().product();
    let mut out = vec![];
    for o in 0..outer {
        for p in &vals {
            out.extend_from_slice(&p[o * inner..(o + 1) * inner]);
        }
    }
    with_exact_floats(|| RTensor::new(per[0].dtype(), bs, &out))
}

/// vmap against a loop: each batch element run alone, results stacked.
pub fn check_vmap(src: &str, dims: &dyn Fn(usize, usize, usize) -> Option<i64>) {
    let g = parse(src).unwrap();
    let n = 3;
    let in_dims: Vec<Option<i64>> = (0..g.inputs.len())
        .map(|i| dims(i, g.meta(g.inputs[i]).dim(), g.inputs.len()))
        .collect();
    let bg =
        vmap(&g, &in_dims, n, None).unwrap_or_else(|e| panic!("{}: vmap {in_dims:?}: {e}", g.name));
    let per: Vec<Vec<RTensor>> = (0..n).map(|k| inputs(&g, 10 + k as u64)).collect();
    let batched: Vec<RTensor> = (0..g.inputs.len())
        .map(|i| match in_dims[i] {
            Some(d) => {
                let r = g.meta(g.inputs[i]).dim() as i64 + 1;
                let d = if d < 0 { d + r } else { d } as usize;
                stack_at(&per.iter().map(|p| p[i].clone()).collect::<Vec<_>>(), d)
            }
            None => per[0][i].clone(),
        })
        .collect();
    let got = exec(&bg, &batched);
    let want: Vec<Vec<RTensor>> = (0..n)
        .map(|k| {
            let ins: Vec<RTensor> = (0..g.inputs.len())
                .map(|i| {
                    if in_dims[i].is_some() {
                        per[k][i].clone()
                    } else {
                        per[0][i].clone()
                    }
                })
                .collect();
            exec(&g, &ins)
        })
        .collect();
    for k in 0..g.outputs.len() {
        let w = stack_at(&want.iter().map(|o| o[k].clone()).collect::<Vec<_>>(), 0);
        assert_eq!(
            got[k].sizes(),
            w.sizes(),
            "{}: vmap {in_dims:?} output {k} shape",
            g.name
        );
        for (e, (a, b)) in got[k].values().iter().zip(w.values()).enumerate() {
            assert!(
                (a - b).abs() <= 1e-9 * (1.0 + b.abs()) || (a.is_nan() && b.is_nan()),
                "{}: vmap {in_dims:?} output {k} [{e}]: got {a}, the loop gives {b}\n{}",
                g.name,
                kiln::functionalize::print(&bg)
            );
        }
    }
}
