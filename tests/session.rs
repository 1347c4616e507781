//! The runtime's contract on a real adapter (lavapipe in CI): a session
//! shared by threads, device tensors feeding later runs, constants, a
//! tensor larger than the device's binding limit, and errors for bad
//! inputs.

use kiln::engine::{
    DeviceTensor, EngineError, Fetch, Gpu, HostTensor, Input, Output, RunOptions, Session, Timing,
};
use kiln::functionalize::random::random_inputs;
use kiln::functionalize::{parse, DType, Graph};
use std::sync::Arc;

fn session() -> Session {
    Session::open().unwrap_or_else(|e| panic!("the GPU tests need a wgpu adapter: {e}"))
}

fn host(o: Output) -> HostTensor<'static> {
    o.host().expect("read back")
}

/// `assert_close` for f32 results accumulated on the GPU (products,
/// softmax): `rel` of the largest expected magnitude allowed as well.
fn close(got: &[f32], want: &[f64], rel: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(1.0f64, |m, x| m.max(x.abs()));
    let tol = kiln::functionalize::compare::Tolerance::accumulated(DType::F32, rel, scale);
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(
            tol.accepts(*a as f64, *b),
            "{what}: element {i} is {a}, expected {b} ({tol:?})"
        );
    }
}

/// A block with a weight, a mutated input and a view output.
const BLOCK: &str = "graph block(%x: f32[16, 32], %w: f32[24, 32], %acc: f32[16, 24]) {
  %h = linear(%x, %w)
  %g = gelu(%h)
  %s = softmax(%g, -1)
  %a = add_(%acc, %s)
  %t = t(%s)
  return (%s, %t)
}";

#[test]
fn one_session_serves_four_threads() {
    let g = parse(BLOCK).unwrap();
    let s = Arc::new(session());
    let exe = s.compile(&g).unwrap();
    // The same program again: the structural hash finds it.
    let again = s.compile(&parse(&kiln::print(&g)).unwrap()).unwrap();
    assert!(Arc::ptr_eq(&exe, &again));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let (s, exe, g) = (s.clone(), exe.clone(), g.clone());
            std::thread::spawn(move || {
                for r in 0..5 {
                    let (mutated, want) =
                        run_against_reference(&s, &exe, &g, random_inputs(&g, 100 * t + r, 1.0));
                    let (i, acc) = mutated.into_iter().next().unwrap();
                    assert_eq!(i, 2);
                    close(
                        &host(acc).to_vec::<f32>().unwrap(),
                        &want.inputs[2].values(),
                        1e-5,
                        "mutated %acc",
                    );
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a thread failed");
    }
    assert_eq!(s.totals().runs, 20);
}

#[test]
fn device_results_feed_the_next_run_and_constants_stay() {
    let s = session();
    let step = parse(
        "graph step(%x: f32[64, 32], %w: f32[32, 32], %b: f32[32]) {
           %y = linear(%x, %w, %b)
           %z = tanh(%y)
           return %z
         }",
    )
    .unwrap();
    let ins = random_inputs(&step, 7, 0.5);
    s.add_constant("w", &HostTensor::from_rtensor(&ins[1]))
        .unwrap();
    s.add_constant("b", &HostTensor::from_rtensor(&ins[2]))
        .unwrap();
    let exe = s.compile(&step).unwrap();
    assert_eq!(exe.input_params(), vec![0]);
    // Three steps on the device, one readback at the end.
    let x0 = HostTensor::from_rtensor(&ins[0]);
    let mut cur: Option<DeviceTensor> = None;
    for _ in 0..3 {
        let input = match &cur {
            None => Input::Host(&x0),
            Some(d) => Input::Device(d),
        };
        let r = s
            .run(&exe, &[input], &exe.options(Fetch::Device, Fetch::Skip))
            .unwrap();
        assert_eq!(r.stats.readback_bytes, 0);
        cur = r.outputs.into_iter().next().unwrap().device();
    }
    let got = cur.unwrap().to_host().unwrap().to_vec::<f32>().unwrap();
    let mut x = ins[0].clone();
    for _ in 0..3 {
        x = kiln::run(&step, vec![x, ins[1].clone(), ins[2].clone()])
            .unwrap()
            .outputs
            .remove(0);
    }
    close(&got, &x.values(), 1e-5, "three steps");
    // A program of the same structure bound to other constants is another
    // program (the cache key holds which tensors are bound).
    let other = parse(
        "graph step(%x: f32[64, 32], %w2: f32[32, 32], %b2: f32[32]) {
           %y = linear(%x, %w2, %b2)
           %z = tanh(%y)
           return %z
         }",
    )
    .unwrap();
    let zeros = HostTensor::from_slice(&[32, 32], &[0f32; 1024]).unwrap();
    s.add_constant("w2", &zeros).unwrap();
    s.add_constant("b2", &HostTensor::from_slice(&[32], &[0.5f32; 32]).unwrap())
        .unwrap();
    let exe2 = s.compile(&other).unwrap();
    assert!(!Arc::ptr_eq(&exe, &exe2));
    let r = s
        .run(
            &exe2,
            &[Input::Host(&x0)],
            &exe2.options(Fetch::Host, Fetch::Skip),
        )
        .unwrap();
    let y = host(r.outputs.into_iter().next().unwrap())
        .to_vec::<f32>()
        .unwrap();
    assert!(y.iter().all(|&v| (v - 0.5f32.tanh()).abs() < 1e-6));
    // Only the first run uploaded x (and the check above x again); the
    // weights went up once, before.
    assert_eq!(
        s.totals().uploaded_bytes,
        (2 * (32 * 32 + 32) + 2 * 64 * 32) as u64 * 4
    );
    // Timestamps, where the adapter has them, time the kernels.
    let r = s
        .run(
            &exe,
            &[Input::Host(&x0)],
            &RunOptions {
                timing: Timing::PerKernel,
                ..exe.options(Fetch::Skip, Fetch::Skip)
            },
        )
        .unwrap();
    if s.gpu().has_timestamps() {
        assert_eq!(r.stats.kernel_ms.len(), exe.program.kernels.len());
        assert!(r.stats.gpu_ms.is_some_and(|t| t >= 0.0));
    }
}

/// The 64M-element chain: input and output are 256 MiB each, over
/// lavapipe's 128 MiB binding limit, so each is bound in pieces.
#[test]
fn a_chain_over_the_binding_limit_runs_in_pieces() {
    let s = session();
    let n: usize = 1 << 26;
    let chain = |n: usize| {
        parse(&format!(
            "graph chain(%x: f32[{n}]) {{
               %a = mul(%x, 2.0)
               %b = add(%a, 1.0)
               %c = tanh(%b)
               %d = mul(%c, 0.5)
               %e = sub(%d, %x)
               return %e
             }}"
        ))
        .unwrap()
    };
    let g = chain(n);
    let exe = s.compile(&g).unwrap();
    let limit = s.gpu().limits.max_storage_buffer_binding_size as usize;
    if n * 4 > limit {
        // The result is written over the dying input: one tensor, two pieces.
        assert!(
            exe.bindings(0).len() >= 2,
            "the input is split: {:?}",
            exe.bindings(0)
        );
    }
    let x: Vec<f32> = (0..n)
        .map(|i| ((i % 2001) as f32 - 1000.0) / 500.0)
        .collect();
    let xt = HostTensor::from_slice(&[n], &x).unwrap();
    let r = s
        .run(
            &exe,
            &[Input::Host(&xt)],
            &exe.options(Fetch::Host, Fetch::Host),
        )
        .unwrap();
    let got = host(r.outputs.into_iter().next().unwrap())
        .to_vec::<f32>()
        .unwrap();
    // The reference's arithmetic (f32 after every op), element by element.
    let small = chain(2001);
    let xs = HostTensor::from_slice(&[2001], &x[..2001])
        .unwrap()
        .to_rtensor();
    let want = kiln::run(&small, vec![xs])
        .unwrap()
        .outputs
        .remove(0)
        .values();
    for (i, &v) in got.iter().enumerate() {
        let w = want[i % 2001];
        assert!(
            (v as f64 - w).abs() <= 1e-6,
            "element {i}: {v}, expected {w}"
        );
    }
}

/// Runs `exe` on `ins` from the host and the reference on the same
/// inputs; the f32 outputs must agree (within 1e-5). Returns the run's
/// mutated parameters and the reference run.
fn run_against_reference(
    s: &Session,
    exe: &kiln::engine::Executable,
    g: &Graph,
    ins: Vec<kiln::functionalize::RTensor>,
) -> (Vec<(usize, Output)>, kiln::functionalize::RunResult) {
    // Before the reference run, which writes mutated inputs in place.
    let host_ins: Vec<HostTensor> = ins.iter().map(HostTensor::from_rtensor).collect();
    let want = kiln::run(g, ins).unwrap();
    let feeds: Vec<Input> = host_ins.iter().map(Input::Host).collect();
    let got = s
        .run(exe, &feeds, &exe.options(Fetch::Host, Fetch::Host))
        .unwrap();
    for (o, w) in got.outputs.into_iter().zip(&want.outputs) {
        close(
            &host(o).to_vec::<f32>().unwrap(),
            &w.values(),
            1e-5,
            "output",
        );
    }
    (got.mutated, want)
}

fn err_of<T>(r: Result<T, EngineError>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_inputs_are_errors_that_name_the_parameter() {
    let s = session();
    let g: Graph = parse(
        "graph f(%x: f32[2, 3], %m: bool[3]) {\n  %y = masked_fill(%x, %m, 0.0)\n  return %y\n}",
    )
    .unwrap();
    let exe = s.compile(&g).unwrap();
    let m = HostTensor::from_bools(&[3], &[true, false, true]).unwrap();
    let all = exe.options(Fetch::Host, Fetch::Host);
    let wrong_shape = HostTensor::from_slice(&[3, 2], &[0f32; 6]).unwrap();
    let e = err_of(s.run(&exe, &[Input::Host(&wrong_shape), Input::Host(&m)], &all));
    assert!(
        e.contains("%x") && e.contains("f32[2, 3]") && e.contains("f32[3, 2]"),
        "{e}"
    );
    let wrong_dtype = HostTensor::from_slice(&[2, 3], &[0i32; 6]).unwrap();
    let e = err_of(s.run(&exe, &[Input::Host(&wrong_dtype), Input::Host(&m)], &all));
    assert!(e.contains("%x") && e.contains("i32[2, 3]"), "{e}");
    let e = err_of(s.run(&exe, &[Input::Host(&m)], &all));
    assert!(e.contains("takes 2 inputs"), "{e}");
    // A device tensor of another session.
    let other = session();
    let x = HostTensor::from_slice(&[2, 3], &[1f32; 6]).unwrap();
    let foreign = other.upload(&x).unwrap();
    let e = err_of(s.run(&exe, &[Input::Device(&foreign), Input::Host(&m)], &all));
    assert!(e.contains("another session"), "{e}");
    // The right inputs work, through host and device alike.
    let mine = s.upload(&x).unwrap();
    let r = s
        .run(&exe, &[Input::Device(&mine), Input::Host(&m)], &all)
        .unwrap();
    assert_eq!(
        host(r.outputs.into_iter().next().unwrap())
            .to_vec::<f32>()
            .unwrap(),
        vec![0., 1., 0., 0., 1., 0.]
    );
    // A constant of the wrong type names both.
    s.add_constant("m", &HostTensor::from_bools(&[4], &[true; 4]).unwrap())
        .unwrap();
    let e = err_of(s.compile(&g));
    assert!(
        e.contains("%m") && e.contains("bool[3]") && e.contains("bool[4]"),
        "{e}"
    );
    // A constant the program writes.
    let s2 = session();
    s2.add_constant("x", &x).unwrap();
    let e = err_of(s2.compile(
        &parse("graph f(%x: f32[2, 3]) {\n  %y = add_(%x, 1.0)\n  return ()\n}").unwrap(),
    ));
    assert!(e.contains("%x") && e.contains("constant"), "{e}");
    // A tensor larger than the device allows.
    let small = pollster::block_on(Gpu::with_limits(|l| l.max_buffer_size = 1 << 20)).unwrap();
    let s3 = Session::new(Arc::new(small));
    let big = HostTensor::from_slice(&[1 << 19], &vec![0f32; 1 << 19]).unwrap();
    let e = err_of(s3.upload(&big));
    assert!(e.contains("2097152") && e.contains("1048576"), "{e}");
}

#[test]
fn sessions_and_tensors_cross_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Session>();
    send_sync::<kiln::engine::Executable>();
    send_sync::<DeviceTensor>();
    send_sync::<HostTensor<'static>>();
}

/// One device tensor passed for two parameters of a program that writes
/// one of them: the session recompiles the program with the second an
/// alias of the first, so the write shows through both, as in eager
/// (whichever of the two is written); read-only sharing runs as compiled.
#[test]
fn one_device_tensor_for_two_written_parameters_aliases_them() {
    let s = session();
    let x = s
        .upload(&HostTensor::from_slice(&[4], &[1.0f32, 2.0, 3.0, 4.0]).unwrap())
        .unwrap();
    for (src, written) in [
        ("%w = mul_(%a, 2.0)\n  %y = add(%b, 1.0)", 0),
        ("%w = mul_(%b, 2.0)\n  %y = add(%a, 1.0)", 1),
    ] {
        let g = parse(&format!(
            "graph f(%a: f32[4], %b: f32[4]) {{\n  {src}\n  return %y\n}}"
        ))
        .unwrap();
        let exe = s.compile(&g).unwrap();
        let r = s
            .run(
                &exe,
                &[Input::Device(&x), Input::Device(&x)],
                &exe.options(Fetch::Host, Fetch::Host),
            )
            .unwrap();
        let y = r.outputs.into_iter().next().unwrap().host().unwrap();
        assert_eq!(
            y.to_vec::<f32>().unwrap(),
            vec![3.0, 5.0, 7.0, 9.0],
            "{src}"
        );
        let (i, m) = r.mutated.into_iter().next().unwrap();
        assert_eq!(i, written);
        assert_eq!(
            m.host().unwrap().to_vec::<f32>().unwrap(),
            vec![2.0, 4.0, 6.0, 8.0]
        );
    }
    let reads =
        parse("graph f(%a: f32[4], %b: f32[4]) {\n  %y = add(%a, %b)\n  return %y\n}").unwrap();
    let exe = s.compile(&reads).unwrap();
    let r = s
        .run(
            &exe,
            &[Input::Device(&x), Input::Device(&x)],
            &exe.options(Fetch::Host, Fetch::Skip),
        )
        .unwrap();
    let y = r.outputs.into_iter().next().unwrap().host().unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![2.0, 4.0, 6.0, 8.0]);
}

/// i64 on a device whose kernels compute it in 32 bits: exact within the
/// range, and every way out of it (an input, a constant, arithmetic, a sum,
/// a float conversion) an error naming the value or the statement; an
/// index out of bounds an error too, as in eager, never a result.
#[test]
fn i64_beyond_32_bits_and_bad_indices_are_errors() {
    let s = session();
    let g: Graph = parse(
        "graph f(%i: i64[4], %x: f32[4]) {
  %a = mul(%i, 3)
  %b = add(%a, %i)
  %p = cumsum(%i, 0)
  %n = sum(%b)
  %c = _to_copy(%x, i64)
  return (%b, %p, %n, %c)
}",
    )
    .unwrap();
    let exe = s.compile(&g).unwrap();
    let all = exe.options(Fetch::Host, Fetch::Host);
    let run = |i: &[i64], x: &[f32]| {
        let i = HostTensor::from_slice(&[4], i).unwrap();
        let x = HostTensor::from_slice(&[4], x).unwrap();
        s.run(&exe, &[Input::Host(&i), Input::Host(&x)], &all)
    };
    let r = run(&[1, -2, 100_000_000, 7], &[1.5, -2.5, 3e9 / 4.0, 0.0]).unwrap();
    let outs: Vec<Vec<i64>> = r
        .outputs
        .into_iter()
        .map(|o| host(o).to_vec::<i64>().unwrap())
        .collect();
    assert_eq!(outs[0], vec![4, -8, 400_000_000, 28]);
    assert_eq!(outs[1], vec![1, -1, 99_999_999, 100_000_006]);
    assert_eq!(outs[2], vec![400_000_024]);
    assert_eq!(outs[3], vec![1, -2, 750_000_000, 0]);
    // An input that does not fit.
    let e = err_of(run(&[1, 1 << 40, 0, 0], &[0.0; 4]));
    assert!(e.contains("%i") && e.contains("1099511627776"), "{e}");
    // Arithmetic leaving the range: 3 * 800M, then 3 * 600M + 600M.
    let e = err_of(run(&[800_000_000, 0, 0, 0], &[0.0; 4]));
    assert!(e.contains("%mul = mul") && e.contains("2147483647"), "{e}");
    let e = err_of(run(&[600_000_000, 0, 0, 0], &[0.0; 4]));
    assert!(e.contains("%add = add"), "{e}");
    // A sum leaving it (each term fits).
    let e = err_of(run(&[500_000_000, 500_000_000, 0, 0], &[0.0; 4]));
    assert!(e.contains("= sum("), "{e}");
    // A float beyond it converted.
    let e = err_of(run(&[0; 4], &[0.0, 3e9, 0.0, 0.0]));
    assert!(e.contains("= _to_copy("), "{e}");
    // The same program runs again after errors.
    assert!(run(&[1, 2, 3, 4], &[0.0; 4]).is_ok());
    // Indices out of bounds: refused as eager refuses them, on every
    // indexing kernel family.
    for (body, bad) in [
        ("%y = gather(%x, 0, %i)", 7i64),
        ("%y = index_select(%x, 0, %i)", -1),
        ("%y = index(%x, [%i])", -5),
        ("%y = scatter(%x, 0, %i, 1.0)", 4),
        ("%z = zeros([4])\n  %y = index_put_(%z, [%i], %x)", 9),
    ] {
        let src = format!("graph f(%x: f32[4], %i: i64[4]) {{\n  {body}\n  return %y\n}}");
        let g = parse(&src).unwrap();
        let exe = s.compile(&g).unwrap();
        let all = exe.options(Fetch::Host, Fetch::Host);
        let x = HostTensor::from_slice(&[4], &[1f32, 2., 3., 4.]).unwrap();
        let ok = HostTensor::from_slice(&[4], &[3i64, 0, 1, 2]).unwrap();
        assert!(
            s.run(&exe, &[Input::Host(&x), Input::Host(&ok)], &all)
                .is_ok(),
            "{body}"
        );
        let i = HostTensor::from_slice(&[4], &[0i64, bad, 1, 2]).unwrap();
        let e = err_of(s.run(&exe, &[Input::Host(&x), Input::Host(&i)], &all));
        assert!(e.contains("out of bounds"), "{body}: {e}");
    }
    // A constant beyond the range is refused at compile time.
    let big = parse("graph f(%i: i64[2]) {\n  %y = add(%i, 3000000000)\n  return %y\n}").unwrap();
    let e = err_of(s.compile(&big));
    assert!(e.contains("3000000000"), "{e}");
}

/// An i64 value out of the device's range that a `where` discards is no
/// error (eager computes it, then drops it: T5's position buckets cast
/// `log(0)` to i64); chosen, or read by anything but elementwise ops, it is.
#[test]
fn i64_out_of_range_values_a_where_discards_are_no_error() {
    let s = session();
    let g: Graph = parse(
        "graph f(%x: f32[4], %k: i64[4]) {
  %m = ne(%k, 0)
  %c = _to_copy(%x, i64)
  %d = add(%c, 8)
  %f = full_like(%d, 15)
  %e = minimum(%d, %f)
  %w = where(%m, %e, 0)
  %n = sum(%w)
  return (%w, %n)
}",
    )
    .unwrap();
    let exe = s.compile(&g).unwrap();
    let all = exe.options(Fetch::Host, Fetch::Host);
    let run = |x: &[f32], m: &[i64]| {
        let x = HostTensor::from_slice(&[4], x).unwrap();
        let m = HostTensor::from_slice(&[4], m).unwrap();
        s.run(&exe, &[Input::Host(&x), Input::Host(&m)], &all)
    };
    let r = run(&[1.0, f32::NEG_INFINITY, 3e9, 2.5], &[1, 0, 0, 1]).unwrap();
    let outs: Vec<Vec<i64>> = r
        .outputs
        .into_iter()
        .map(|o| host(o).to_vec::<i64>().unwrap())
        .collect();
    assert_eq!(outs, vec![vec![9, 0, 0, 10], vec![19]]);
    let e = err_of(run(&[1.0, f32::NEG_INFINITY, 0.0, 0.0], &[1, 1, 1, 1]));
    assert!(e.contains("= _to_copy(") && e.contains("2147483647"), "{e}");
    // Stored before the `where`: the value itself reaches memory.
    let g: Graph = parse(
        "graph f(%x: f32[4], %k: i64[4]) {
  %m = ne(%k, 0)
  %c = _to_copy(%x, i64)
  %w = where(%m, %c, 0)
  return (%w, %c)
}",
    )
    .unwrap();
    let exe = s.compile(&g).unwrap();
    let x = HostTensor::from_slice(&[4], &[1.0f32, 3e9, 0.0, 0.0]).unwrap();
    let m = HostTensor::from_slice(&[4], &[1i64, 0, 1, 1]).unwrap();
    let e = err_of(s.run(
        &exe,
        &[Input::Host(&x), Input::Host(&m)],
        &exe.options(Fetch::Host, Fetch::Host),
    ));
    assert!(e.contains("= _to_copy("), "{e}");
}

/// Integer element expressions mean what eager computes: floor division
/// and Python's remainder round toward minus infinity, `add` with `alpha`
/// scales before adding (and each step is range-checked for i64), `where`
/// and `clamp` keep integers, bools add as `or`.
#[test]
fn integer_expressions_match_eager() {
    let s = session();
    let g: Graph = parse(
        "graph f(%i: i64[4], %j: i64[4], %k: i32[4], %m: i32[4], %p: bool[4], %q: bool[4]) {
  %a = add(%i, %j, 3)
  %d = div(%k, %m, \"floor\")
  %t = div(%k, %m, \"trunc\")
  %r = remainder(%k, %m)
  %c = clamp(%k, -5, 5)
  %w = where(%p, %k, %m)
  %o = add(%p, %q)
  return (%a, %d, %t, %r, %c, %w, %o)
}",
    )
    .unwrap();
    let exe = s.compile(&g).unwrap();
    let all = exe.options(Fetch::Host, Fetch::Host);
    let run = |i: &[i64], j: &[i64]| {
        let ins = [
            HostTensor::from_slice(&[4], i).unwrap(),
            HostTensor::from_slice(&[4], j).unwrap(),
            HostTensor::from_slice(&[4], &[7i32, -7, 7, -7]).unwrap(),
            HostTensor::from_slice(&[4], &[2i32, 2, -2, -2]).unwrap(),
            HostTensor::from_bools(&[4], &[true, false, true, false]).unwrap(),
            HostTensor::from_bools(&[4], &[false, false, true, true]).unwrap(),
        ];
        let ins: Vec<Input> = ins.iter().map(Input::Host).collect();
        s.run(&exe, &ins, &all)
    };
    let r = run(&[1, -2, 3, 4], &[10, 20, -30, 40]).unwrap();
    let mut outs = r.outputs.into_iter().map(host);
    assert_eq!(
        outs.next().unwrap().to_vec::<i64>().unwrap(),
        vec![31, 58, -87, 124]
    );
    let ints: Vec<Vec<i32>> = (0..5)
        .map(|_| outs.next().unwrap().to_vec::<i32>().unwrap())
        .collect();
    assert_eq!(ints[0], vec![3, -4, -4, 3], "floor division");
    assert_eq!(ints[1], vec![3, -3, -3, 3], "truncating division");
    assert_eq!(ints[2], vec![1, 1, -1, -1], "remainder");
    assert_eq!(ints[3], vec![5, -5, 5, -5], "clamp");
    assert_eq!(ints[4], vec![7, 2, 7, -2], "where");
    let bools = outs.next().unwrap();
    assert_eq!(bools.bytes(), &[1, 0, 1, 1], "bool add");
    // 3 * j leaves the 32-bit range although i + 3 j would not wrap back.
    let e = err_of(run(&[0; 4], &[800_000_000, 0, 0, 0]));
    assert!(e.contains("= add("), "{e}");
}

/// Pipelines compile on several threads at once; a shader the device
/// rejects on any of them is an error of the load (each thread has its own
/// error scope), not a panic, and the session goes on loading good ones.
#[test]
fn a_rejected_shader_is_an_error_on_any_pipeline_thread() {
    let s = session();
    let g: Graph = parse(
        "graph f(%x: f32[64, 32], %w: f32[32, 16]) {
  %a = mm(%x, %w)
  %b = softmax(%a, -1)
  %c = sum(%b, [0])
  %d = tanh(%x)
  return (%b, %c, %d)
}",
    )
    .unwrap();
    // A launch per kernel (not one in sequence): several pipelines.
    let options = kiln::engine::CompileOptions {
        sequence: false,
        ..s.compile_options().clone()
    };
    let good = kiln::engine::compile_with(&g, &options).unwrap();
    assert!(good.kernels.len() >= 3, "{}", good.stats());
    for broken in [0, good.kernels.len() - 1] {
        let mut p = good.clone();
        p.kernels[broken].code.wgsl = format!(
            "{}\nfn kiln_broken() -> f32 {{ return undefined_name; }}\n",
            p.kernels[broken].code.wgsl
        );
        let e = err_of(s.load(p));
        assert!(e.contains("a generated kernel was rejected"), "{e}");
    }
    let exe = s.load(good).unwrap();
    run_against_reference(&s, &exe, &g, random_inputs(&g, 1, 1.0));
}

/// Small parameters share a buffer (constants with constants, inputs with
/// inputs; `Program::param_slot`): on WebGPU's 8 storage buffers a block
/// of 12 parameters is one kernel, each pack one binding, and runs match
/// the reference with host inputs, a device input written into its pack,
/// and constants copied into theirs once.
#[test]
fn small_parameters_share_a_buffer() {
    let s = Session::open_web_like().unwrap();
    let names = [
        "x", "b1", "b2", "b3", "b4", "b5", "b6", "b7", "c1", "c2", "c3", "c4",
    ];
    let params: Vec<String> = names
        .iter()
        .map(|n| match *n {
            "x" => "%x: f32[4, 8]".to_string(),
            n => format!("%{n}: f32[8]"),
        })
        .collect();
    let mut body = vec!["  %h0 = mul(%x, %c1)".to_string()];
    for i in 1..=7 {
        let c = ["c2", "c3", "c4"][i % 3];
        body.push(format!("  %a{i} = add(%h{}, %b{i})", i - 1));
        body.push(format!("  %t{i} = tanh(%a{i})"));
        body.push(format!("  %h{i} = mul(%t{i}, %{c})"));
    }
    let src = format!(
        "graph packs({}) {{\n{}\n  return %h7\n}}",
        params.join(", "),
        body.join("\n")
    );
    let g = parse(&src).unwrap();
    let ins = random_inputs(&g, 3, 1.0);
    for (i, c) in ["c1", "c2", "c3", "c4"].iter().enumerate() {
        s.add_constant(c, &HostTensor::from_rtensor(&ins[8 + i]))
            .unwrap();
    }
    let exe = s.compile(&g).unwrap();
    let p = &exe.program;
    assert_eq!(p.kernels.len(), 1, "{}", p.stats());
    assert!(p.kernels[0].code.bindings.len() <= 8);
    // One buffer for the seven biases, one for the four constants.
    let slots: Vec<_> = (0..names.len()).map(|i| p.param_slot(i)).collect();
    assert!(slots[2..8].iter().all(|sl| sl.buffer == slots[1].buffer));
    assert!(slots[9..].iter().all(|sl| sl.buffer == slots[8].buffer));
    assert_ne!(slots[1].buffer, slots[8].buffer);
    assert_eq!(slots[3].word, 16);
    let want = kiln::run(&g, ins.clone()).unwrap().outputs.remove(0);
    let hosts: Vec<HostTensor> = ins[..8].iter().map(HostTensor::from_rtensor).collect();
    let dev = s.upload(&hosts[4]).unwrap();
    for device in [false, true] {
        let inputs: Vec<Input> = (0..8)
            .map(|i| match (device, i) {
                (true, 4) => Input::Device(&dev),
                _ => Input::Host(&hosts[i]),
            })
            .collect();
        let r = s
            .run(&exe, &inputs, &exe.options(Fetch::Host, Fetch::Skip))
            .unwrap();
        let got = host(r.outputs.into_iter().next().unwrap());
        close(
            &got.to_vec::<f32>().unwrap(),
            &want.values(),
            1e-5,
            "packed parameters",
        );
    }
}
