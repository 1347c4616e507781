//! The `kiln` command line: results on disk, and a clear error with a
//! non-zero exit (never a panic) for every kind of bad input.

mod common;

use common::{iota, kiln, root, t};
use kiln::functionalize::DType;
use std::path::{Path, PathBuf};
use std::process::Command;

fn dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("kiln-cli-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn write(name: &str, text: &str) -> PathBuf {
    let p = dir().join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn inputs(name: &str, tensors: &[(&str, kiln::RTensor)]) -> PathBuf {
    let p = dir().join(name);
    let named: Vec<(String, kiln::RTensor)> = tensors
        .iter()
        .map(|(n, t)| (n.to_string(), t.clone()))
        .collect();
    kiln::io::save_all(&p, &named).unwrap();
    p
}

const PROG: &str = "graph f(%x: f32[2, 3], %m: bool[2, 3]) {
  %r = select(%x, 0, 1)
  %a = add_(%r, 10)
  %y = masked_fill(%x, %m, 0.5)
  return (%y, %a)
}
";

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn run_writes_outputs_and_final_inputs() {
    let prog = write("ok.txt", PROG);
    let mask = t(DType::Bool, &[2, 3], &[1.0, 0.0, 0.0, 0.0, 0.0, 1.0]);
    let ins = inputs("ok.in.safetensors", &[("x", iota(&[2, 3])), ("m", mask)]);
    for backend in ["reference", "gpu"] {
        let out = dir().join(format!("ok.{backend}.safetensors"));
        let (ok, _, err) = kiln(&[
            "run",
            s(&prog),
            "--inputs",
            s(&ins),
            "--output",
            s(&out),
            "--backend",
            backend,
        ]);
        assert!(ok, "{backend}: {err}");
        let got = kiln::io::load_all(&out).unwrap();
        let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["m", "output.0", "output.1", "x"], "{backend}");
        assert_eq!(got[1].1.values(), vec![0.5, 1.0, 2.0, 13.0, 14.0, 0.5]);
        assert_eq!(got[2].1.values(), vec![13.0, 14.0, 15.0]);
        assert_eq!(got[3].1.values(), vec![0.0, 1.0, 2.0, 13.0, 14.0, 15.0]);
    }
}

/// `profile --json`: the keys the spec names, per-run byte counters, and
/// weights as constants (uploaded once: only the other inputs per run).
#[test]
fn profile_reports_kernels_times_and_bytes_per_run() {
    let prog = write(
        "prof.txt",
        "graph p(%x: f32[8, 16], %w: f32[4, 16], %b: f32[4]) {
  %y = linear(%x, %w, %b)
  %z = relu(%y)
  return %z
}
",
    );
    let w = inputs(
        "prof.w.safetensors",
        &[("w", iota(&[4, 16])), ("b", iota(&[4]))],
    );
    for (args, uploaded) in [
        (vec![], (8 * 16 + 4 * 16 + 4) * 4),
        (vec!["--weights", s(&w)], 8 * 16 * 4),
    ] {
        let mut all = vec!["profile", s(&prog), "--runs", "2", "--json"];
        all.extend(args);
        let (ok, out, err) = kiln(&all);
        assert!(ok, "{err}");
        let j: serde_json::Value = serde_json::from_str(&out).unwrap();
        for key in [
            "adapter",
            "kernels",
            "kernels_ms",
            "full_ms",
            "uploaded_bytes",
            "readback_bytes",
            "compile_ms",
            "timing",
        ] {
            assert!(!j[key].is_null(), "no {key} in {out}");
        }
        let k = &j["kernels"][0];
        for key in ["name", "ms", "bytes", "flops"] {
            assert!(k.get(key).is_some(), "kernel without {key}: {out}");
        }
        // The product, and the relu in its epilogue.
        assert_eq!(k["flops"], 2 * 8 * 4 * 16 + 8 * 4, "{out}");
        assert_eq!(j["uploaded_bytes"], uploaded, "{out}");
        assert_eq!(j["readback_bytes"], 8 * 4 * 4, "{out}");
    }
}

#[test]
fn soak_reports_memory_and_runs() {
    let prog = write(
        "soak.txt",
        "graph s(%x: f32[4, 6], %y: f32[6]) {
  %a = add(%x, %y)
  %m = sum(%a, [1])
  return (%a, %m)
}
",
    );
    let (ok, out, err) = kiln(&["soak", s(&prog), "--runs", "300", "--threads", "2"]);
    assert!(ok, "{err}");
    for needle in [
        "300 runs of",
        "after warm-up (30 runs): resident",
        "at the end (300 runs)",
        "buffers",
        "0 mismatched outputs",
    ] {
        assert!(out.contains(needle), "{needle:?} not in:\n{out}");
    }
    // A missing program is an error naming it, not a panic.
    let (ok, _, err) = kiln(&["soak", "/nonexistent/p.txt", "--runs", "3"]);
    assert!(!ok && err.contains("/nonexistent/p.txt"), "{err}");
}

#[test]
fn print_is_canonical_and_stable() {
    let prog = write("p.txt", PROG);
    let (ok, first, err) = kiln(&["print", s(&prog)]);
    assert!(ok, "{err}");
    let again = write("p2.txt", &first);
    let (_, second, _) = kiln(&["print", s(&again)]);
    assert_eq!(first, second);
}

/// Runs a bad case and checks the message names the problem.
fn expect_error(args: &[&str], needles: &[&str]) {
    let (ok, _, err) = kiln(args);
    assert!(!ok, "{args:?} should fail");
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    for n in needles {
        assert!(
            err.contains(n),
            "{args:?}: message {err:?} should mention {n:?}"
        );
    }
}

#[test]
fn bad_programs_are_reported_with_location() {
    let out = dir().join("unused.safetensors");
    let ins = inputs("bad.in.safetensors", &[("x", iota(&[2, 3]))]);
    let cases: &[(&str, &str, &[&str])] = &[
        ("syntax.txt", "graph f(%x: f32[2, 3]) {\n  %y = add(%x 1)\n  return %y\n}\n", &["2:15", "expected `,`"]),
        ("unknown.txt", "graph f(%x: f32[2, 3]) {\n  %y = frobnicate(%x)\n  return %y\n}\n", &["line 2", "unknown op `frobnicate`"]),
        (
            "shape.txt",
            "graph f(%x: f32[2, 3]) {\n  %y = view(%x, [4, 2])\n  return %y\n}\n",
            &["line 2", "view(%x, [4, 2])", "invalid for input of size 6"],
        ),
        (
            "dtype.txt",
            "graph f(%x: f32[2, 3]) {\n  %i = full([2, 3], 1)\n  %y = add_(%i, %x)\n  return %y\n}\n",
            &["line 3", "add_(%i, %x)", "can't be cast"],
        ),
        ("undefined.txt", "graph f(%x: f32[2, 3]) {\n  %y = add(%z, 1)\n  return %y\n}\n", &["2:12", "`%z` is not defined"]),
        ("arity.txt", "graph f(%x: f32[2, 3]) {\n  %a, %b = unbind(%x, 0, 5)\n  return %a\n}\n", &["line 2", "unbind"]),
    ];
    for (name, text, needles) in cases {
        let p = write(name, text);
        expect_error(
            &["run", s(&p), "--inputs", s(&ins), "--output", s(&out)],
            needles,
        );
        expect_error(&["print", s(&p)], needles);
    }
}

#[test]
fn bad_inputs_are_reported() {
    let prog = write("in.txt", PROG);
    let out = dir().join("unused.safetensors");
    let mask = t(DType::Bool, &[2, 3], &[0.0; 6]);
    let missing = inputs("missing.safetensors", &[("x", iota(&[2, 3]))]);
    expect_error(
        &[
            "run",
            s(&prog),
            "--inputs",
            s(&missing),
            "--output",
            s(&out),
        ],
        &["`m`", "missing"],
    );
    let shape = inputs(
        "shape.safetensors",
        &[("x", iota(&[3, 2])), ("m", mask.clone())],
    );
    expect_error(
        &["run", s(&prog), "--inputs", s(&shape), "--output", s(&out)],
        &["`x`", "shape [3, 2]", "f32[2, 3]"],
    );
    let dtype = inputs(
        "dtype.safetensors",
        &[("x", t(DType::I32, &[2, 3], &[0.0; 6])), ("m", mask)],
    );
    expect_error(
        &["run", s(&prog), "--inputs", s(&dtype), "--output", s(&out)],
        &["`x`", "dtype I32"],
    );
    let garbage = write("garbage.safetensors", "not a safetensors file");
    expect_error(
        &[
            "run",
            s(&prog),
            "--inputs",
            s(&garbage),
            "--output",
            s(&out),
        ],
        &["not a valid safetensors file"],
    );
    expect_error(
        &[
            "run",
            s(&prog),
            "--inputs",
            "/nonexistent/in.safetensors",
            "--output",
            s(&out),
        ],
        &["cannot read"],
    );
    expect_error(
        &["print", "/nonexistent/prog.txt"],
        &["cannot read /nonexistent/prog.txt"],
    );
}

#[test]
fn runtime_errors_name_the_statement() {
    let prog = write(
        "rt.txt",
        "graph f(%w: f32[4, 2], %i: i32[3]) {\n  %e = embedding(%w, %i)\n  return %e\n}\n",
    );
    let ins = inputs(
        "rt.safetensors",
        &[
            ("w", iota(&[4, 2])),
            ("i", t(DType::I32, &[3], &[0.0, 7.0, 1.0])),
        ],
    );
    let out = dir().join("rt.out.safetensors");
    expect_error(
        &["run", s(&prog), "--inputs", s(&ins), "--output", s(&out)],
        &["line 2", "embedding(%w, %i)", "index out of range"],
    );
}

#[test]
fn every_example_program_runs_from_the_command_line() {
    // One end-to-end run through the binary (the fixture test covers all).
    let prog = root().join("examples/programs/mutate_input_through_view.txt");
    let ins = root()
        .join("tests/fixtures/examples/programs/mutate_input_through_view.inputs.safetensors");
    let out = dir().join("mitv.safetensors");
    let (ok, _, err) = kiln(&["run", s(&prog), "--inputs", s(&ins), "--output", s(&out)]);
    assert!(ok, "{err}");
}

#[test]
fn functionalize_prints_a_program_that_runs_to_the_same_result() {
    let prog = write("fz.txt", PROG);
    let mask = t(DType::Bool, &[2, 3], &[1.0, 0.0, 0.0, 0.0, 0.0, 1.0]);
    let ins = inputs("fz.in.safetensors", &[("x", iota(&[2, 3])), ("m", mask)]);
    let eager = dir().join("fz.eager.safetensors");
    let (ok, _, err) = kiln(&["run", s(&prog), "--inputs", s(&ins), "--output", s(&eager)]);
    assert!(ok, "{err}");
    for mode in ["mutations", "mutations_and_views"] {
        let (ok, text, err) = kiln(&["functionalize", s(&prog), "--remove", mode]);
        assert!(ok, "{err}");
        assert!(!text.contains("add_("), "{text}");
        assert_eq!(mode == "mutations", text.contains("select("), "{text}");
        let printed = write(&format!("fz.{mode}.txt"), &text);
        for (p, extra) in [(&printed, None), (&prog, Some(mode))] {
            let out = dir().join(format!("fz.{mode}.out.safetensors"));
            let mut args = vec!["run", s(p), "--inputs", s(&ins), "--output", s(&out)];
            if let Some(m) = extra {
                args.extend(["--functionalize", m]);
            }
            let (ok, _, err) = kiln(&args);
            assert!(ok, "{err}");
            let (a, b) = (
                kiln::io::load_all(&out).unwrap(),
                kiln::io::load_all(&eager).unwrap(),
            );
            assert_eq!(a.len(), b.len());
            for ((n, x), (_, y)) in a.iter().zip(&b) {
                assert_eq!(x.values(), y.values(), "{mode} {n}");
            }
        }
    }
    let bad = write(
        "fz.bad.txt",
        "graph f(%x: f32[3, 3]) {\n  %t = t(%x)\n  %a = add_(%x, %t)\n  return %x\n}\n",
    );
    let (ok, _, err) = kiln(&["functionalize", s(&bad)]);
    assert!(
        !ok && err.contains("line 3") && err.contains("single memory location"),
        "{err}"
    );
}

/// `-` reads the program from standard input, as the spec says.
#[test]
fn a_program_is_read_from_standard_input() {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["functionalize", "-", "--remove", "mutations_and_views"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(
            b"graph f(%x: i64[4]) {\n  %y = view(%x, [2, 2])\n  %z = add_(%y, 1)\n  return %x\n}\n",
        )
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("graph f(%x: i64[4])") && text.contains("view_copy"),
        "{text}"
    );
}

/// `export`, `inspect`, then `run` on the export (GPU and reference) and
/// the runtime-only `kiln-run`: the GPU results bit for bit those of
/// running the program, the reference's within tolerance, constants
/// written back unchanged.
#[test]
fn exports_run_from_the_command_line() {
    let prog = root().join("examples/programs/llama_block.txt");
    let fix = root().join("tests/fixtures/examples/programs/llama_block.inputs.safetensors");
    let all = kiln::io::load_all(&fix).unwrap();
    let weights: Vec<(String, kiln::RTensor)> = all
        .iter()
        .filter(|(n, _)| n.starts_with('w') || n.ends_with("norm"))
        .cloned()
        .collect();
    let w = dir().join("llama_weights.safetensors");
    kiln::io::save_all(&w, &weights).unwrap();
    let export = |out: &Path, extra: &[&str]| {
        let mut a = vec!["export", s(&prog), "--weights", s(&w), "--output", s(out)];
        a.extend(extra);
        let (ok, _, err) = kiln(&a);
        assert!(ok, "{a:?}: {err}");
    };
    let model = dir().join("llama.kiln");
    export(&model, &[]);
    let (ok, out, err) = kiln(&["inspect", s(&model)]);
    assert!(ok, "{err}");
    assert!(
        out.contains("%wq: f32[16, 16]  constant")
            && out.contains("%k_cache")
            && out.contains("kernels:"),
        "{out}"
    );
    let run = |args: &[&str], name: &str| -> Vec<(String, kiln::RTensor)> {
        let o = dir().join(name);
        let mut a = args.to_vec();
        a.extend(["--inputs", s(&fix), "--output", s(&o)]);
        let (ok, _, err) = kiln(&a);
        assert!(ok, "{args:?}: {err}");
        kiln::io::load_all(&o).unwrap()
    };
    let all = run(&["run", s(&prog), "--backend", "gpu"], "prog.safetensors");
    // An export's results are the program's less its constants, which no
    // run writes (an output file holds no copy of the weights).
    let want: Vec<(String, kiln::RTensor)> = all
        .into_iter()
        .filter(|(n, _)| !weights.iter().any(|w| &w.0 == n))
        .collect();
    let names = |r: &[(String, kiln::RTensor)]| r.iter().map(|x| x.0.clone()).collect::<Vec<_>>();
    let got = run(
        &["run", s(&model), "--backend", "gpu"],
        "export.safetensors",
    );
    assert_eq!(names(&got), names(&want));
    assert!(
        names(&want).contains(&"k_cache".to_string()),
        "{:?}",
        names(&want)
    );
    for ((n, a), (_, b)) in want.iter().zip(&got) {
        assert_eq!(a.values(), b.values(), "{n}: the export differs on the GPU");
    }
    let refr = run(&["run", s(&model)], "export_ref.safetensors");
    assert_eq!(names(&refr), names(&want));
    for ((n, a), (_, b)) in want.iter().zip(&refr) {
        common::close_accumulated(n, a, b, 1e-5).unwrap();
    }
    // For browsers: compiled within WebGPU's default limits, which the
    // export records, and still the program's results here.
    let web = dir().join("llama_web.kiln");
    export(&web, &["--web"]);
    let (ok, out, err) = kiln(&["inspect", s(&web), "--requires"]);
    assert!(ok, "{err}");
    let req: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(req["features"], serde_json::json!([]), "{out}");
    assert_eq!(req["min_storage_buffer_offset_alignment"], 256, "{out}");
    // GPU-class kernels whatever adapter compiled them (here lavapipe, a
    // CPU): products and attention stage tiles in workgroup memory,
    // elementwise kernels stride over the grid; in kernels in sequence (a
    // small program's, here one: its small weights share a binding),
    // attention is one kernel (CPU adapters compute it as products and a
    // softmax), its workgroup the sequence's.
    assert!(
        req["max_compute_workgroup_storage_size"].as_u64().unwrap() > 0,
        "{out}"
    );
    let (ok, wgsl, err) = kiln(&["inspect", s(&web), "--wgsl"]);
    assert!(ok, "{err}");
    assert!(
        wgsl.contains("var<workgroup>")
            && (wgsl.contains("nwg.x * nwg.y * nwg.z") || wgsl.contains("// attention#")),
        "the web export holds a CPU adapter's kernels"
    );
    assert!(
        req["max_storage_buffers_per_shader_stage"]
            .as_u64()
            .unwrap()
            <= 8,
        "{out}"
    );
    let on_web = run(&["run", s(&web), "--backend", "gpu"], "web.safetensors");
    for ((n, a), (_, b)) in want.iter().zip(&on_web) {
        common::close_accumulated(n, a, b, 1e-5).unwrap();
    }
    // The runtime alone.
    let kr = common::kiln_run_exe();
    let o = dir().join("kiln_run.safetensors");
    let out = Command::new(&kr)
        .args([s(&model), "--inputs", s(&fix), "--output", s(&o)])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let alone = kiln::io::load_all(&o).unwrap();
    assert_eq!(
        names(&alone),
        names(&want),
        "kiln-run writes what kiln run writes"
    );
    for ((n, a), (_, b)) in want.iter().zip(&alone) {
        assert_eq!(a.values(), b.values(), "{n}: kiln-run differs");
    }
    // The weights in a file of their own beside the export (format
    // version 3): `run`, `inspect` and `kiln-run` find it there; without
    // it the export says which file it needs.
    let apart = dir().join("llama_apart.kiln");
    export(&apart, &["--weights-file", "llama.weights"]);
    assert!(std::fs::metadata(&apart).unwrap().len() < std::fs::metadata(&model).unwrap().len());
    let got = run(&["run", s(&apart), "--backend", "gpu"], "apart.safetensors");
    for ((n, a), (_, b)) in want.iter().zip(&got) {
        assert_eq!(
            a.values(),
            b.values(),
            "{n}: the export with its weights apart differs"
        );
    }
    let out = Command::new(&kr)
        .args([s(&apart), "--inputs", s(&fix), "--output", s(&o)])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_file(dir().join("llama.weights")).unwrap();
    let (ok, _, err) = kiln(&["inspect", s(&apart)]);
    assert!(!ok && err.contains("llama.weights"), "{err}");
    // A damaged file: a clear error, no panic.
    let mut bytes = std::fs::read(&model).unwrap();
    let n = bytes.len();
    bytes[n / 2] ^= 0x40;
    let bad = dir().join("bad.kiln");
    std::fs::write(&bad, &bytes).unwrap();
    let (ok, _, err) = kiln(&["run", s(&bad), "--inputs", s(&fix), "--output", s(&o)]);
    assert!(
        !ok && err.contains("damaged") && !err.contains("panicked"),
        "{err}"
    );
}

/// `kiln ARGS` with `stdin` piped in: success, stdout, stderr.
fn kiln_piped(args: &[&str], stdin: &str) -> (bool, String, String) {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

const LOSS: &str = "graph loss(%w: f32[3], %x: f32[3], %y: f32[]) {
  %p = mul(%w, %x)
  %s = sum(%p)
  %d = sub(%s, %y)
  %l = mul(%d, %d)
  return (%l, %s)
}
";

/// The spec's pipelines: per-example gradients (`grad | vmap`), rows of a
/// Jacobian (`vjp | vmap`), any pipeline into `functionalize`, and the
/// results run by `kiln run` to what the transforms mean.
#[test]
fn transforms_compose_through_pipes() {
    let prog = write("loss.txt", LOSS);
    let (ok, g, err) = kiln(&["grad", s(&prog), "--wrt", "w"]);
    assert!(ok, "{err}");
    assert!(
        g.starts_with("graph loss(%w: f32[3], %x: f32[3], %y: f32[])"),
        "{g}"
    );
    // Per-example gradients: x and y batched over 4 examples.
    let (ok, per, err) = kiln_piped(
        &["vmap", "-", "--in-dims", "none,0,0", "--batch-size", "4"],
        &g,
    );
    assert!(ok, "{err}");
    let x: Vec<f64> = (0..12).map(|i| i as f64 * 0.25 - 1.0).collect();
    let y = [0.5, -1.0, 2.0, 0.0];
    let w = [0.5, -0.25, 1.0];
    let ins = inputs(
        "per.safetensors",
        &[
            ("w", t(DType::F32, &[3], &w)),
            ("x", t(DType::F32, &[4, 3], &x)),
            ("y", t(DType::F32, &[4], &y)),
        ],
    );
    let (p, out) = (write("per.txt", &per), dir().join("per.out.safetensors"));
    let (ok, _, err) = kiln(&["run", s(&p), "--inputs", s(&ins), "--output", s(&out)]);
    assert!(ok, "{err}");
    let r: std::collections::HashMap<String, kiln::RTensor> =
        kiln::io::load_all(&out).unwrap().into_iter().collect();
    let got = r["output.0"].values();
    for e in 0..4 {
        let s: f64 = (0..3).map(|k| w[k] * x[e * 3 + k]).sum();
        for k in 0..3 {
            let want = 2.0 * (s - y[e]) * x[e * 3 + k];
            assert!(
                (got[e * 3 + k] - want).abs() < 1e-5,
                "example {e}, w[{k}]: {} vs {want}",
                got[e * 3 + k]
            );
        }
    }
    // vjp | vmap: the Jacobian of the second output by rows; jvp |
    // functionalize: any pipeline reads a program on standard input.
    let (ok, v, err) = kiln(&["vjp", s(&prog), "--wrt", "w,x"]);
    assert!(ok, "{err}");
    assert!(
        v.contains("%ct_0: f32[]") && v.contains("%ct_1: f32[]"),
        "{v}"
    );
    let (ok, rows, err) = kiln_piped(
        &[
            "vmap",
            "-",
            "--in-dims",
            "none,none,none,0,0",
            "--batch-size",
            "2",
        ],
        &v,
    );
    assert!(ok, "{err}");
    assert!(rows.contains("%ct_0: f32[2]"), "{rows}");
    let (ok, j, err) = kiln(&["jvp", s(&prog)]);
    assert!(ok, "{err}");
    assert!(j.contains("%t_w: f32[3], %t_x: f32[3], %t_y: f32[]"), "{j}");
    let (ok, f, err) = kiln_piped(
        &["functionalize", "-", "--remove", "mutations_and_views"],
        &j,
    );
    assert!(ok && f.starts_with("graph loss("), "{err}");
    // Refusals: a clear message and a non-zero exit, never a panic.
    expect_error(&["grad", s(&prog), "--wrt", "q"], &["no parameter `q`"]);
    expect_error(
        &[
            "vmap",
            s(&prog),
            "--in-dims",
            "0,x,none",
            "--batch-size",
            "2",
        ],
        &["`x` is neither an integer nor `none`"],
    );
    let vec_out = write(
        "vec.txt",
        "graph f(%x: f32[3]) {\n  %y = exp(%x)\n  return %y\n}\n",
    );
    expect_error(&["grad", s(&vec_out)], &["0-d floating point"]);
}

/// `kiln ops` lists the table; `docs/ops.md` is its `--markdown` page, kept
/// in step (regenerate with `kiln ops --markdown > docs/ops.md`).
#[test]
fn ops_lists_the_table_and_the_docs_page_is_in_step() {
    use kiln::functionalize::ops::{catalog, TABLE};
    let (ok, out, err) = kiln(&["ops", "--json"]);
    assert!(ok, "{err}");
    let ops: serde_json::Value = serde_json::from_str(&out).unwrap();
    let ops = ops.as_array().unwrap();
    // The table's ops, then what the import rewrites or refuses.
    let table = ops
        .iter()
        .filter(|o| o["kind"] != "import rewrite" && o["kind"] != "refused")
        .count();
    assert_eq!(table, TABLE.ops.len());
    let flatten = ops.iter().find(|o| o["name"] == "flatten").unwrap();
    assert_eq!(flatten["kind"], "import rewrite");
    assert_eq!(flatten["how"], "`reshape`");
    let nonzero = ops.iter().find(|o| o["name"] == "nonzero").unwrap();
    assert_eq!(nonzero["kind"], "refused");
    assert!(nonzero["reason"]
        .as_str()
        .unwrap()
        .contains("depends on the values"));
    let linear = ops.iter().find(|o| o["name"] == "linear").unwrap();
    assert_eq!(linear["lowering"], "matrix product");
    assert_eq!(linear["vjp"], true);
    assert_eq!(linear["gpu"], true);
    let add_ = ops.iter().find(|o| o["name"] == "add_").unwrap();
    assert_eq!(add_["kind"], "in-place");
    assert_eq!(add_["via"], "add");
    let (ok, text, _) = kiln(&["ops"]);
    assert!(ok && text.lines().count() == TABLE.ops.len() + 1);
    let doc = std::fs::read_to_string(root().join("docs/ops.md")).unwrap();
    assert!(
        doc == catalog::markdown(),
        "docs/ops.md is out of step with the op table: run `kiln ops --markdown > docs/ops.md`"
    );
}

/// The runtime alone links neither the functionalizer nor the code
/// generator: `kiln-runtime`'s dependency tree has no `kiln-functionalize`
/// (the engine without its `compiler` feature).
#[test]
fn the_runtime_alone_does_not_link_the_compiler() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let o = Command::new(cargo)
        .args(["tree", "-p", "kiln-runtime", "-e", "normal", "--offline"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    let tree = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        tree.contains("kiln-engine") && tree.contains("kiln-dtype"),
        "{tree}"
    );
    assert!(!tree.contains("kiln-functionalize"), "{tree}");
}

/// The top-level modules a crate's source files name (`crate::m`,
/// `crate::{m, ..}`), comments aside: module -> modules it uses.
fn module_uses(
    src: &Path,
) -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
    let mut uses = std::collections::BTreeMap::<String, std::collections::BTreeSet<String>>::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
                continue;
            }
            let rel = p.strip_prefix(src).unwrap().to_string_lossy().to_string();
            let top = rel
                .split('/')
                .next()
                .unwrap()
                .trim_end_matches(".rs")
                .to_string();
            let text: String = std::fs::read_to_string(&p)
                .unwrap()
                .lines()
                .map(|l| l.split("//").next().unwrap_or(""))
                .collect::<Vec<_>>()
                .join("\n");
            // Unit tests may reach anywhere.
            let text = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
            let set = uses.entry(top.clone()).or_default();
            for (i, _) in text.match_indices("crate::") {
                let rest = &text[i + 7..];
                let names: Vec<&str> = if let Some(group) = rest.strip_prefix('{') {
                    let group = &group[..group.find('}').unwrap_or(group.len())];
                    group
                        .split(',')
                        .filter_map(|s| s.trim().split("::").next())
                        .collect()
                } else {
                    rest.split(|c: char| !(c.is_alphanumeric() || c == '_'))
                        .take(1)
                        .collect()
                };
                for n in names {
                    if !n.is_empty() && n != top && n != "self" && n.starts_with(char::is_lowercase)
                    {
                        set.insert(n.to_string());
                    }
                }
            }
        }
    }
    uses
}

/// Modules match the pipeline and import one way: no circle between the
/// top-level modules of the front end or of the engine.
#[test]
fn no_import_circle_between_modules() {
    for krate in ["functionalize/src", "engine/src"] {
        let uses = module_uses(&root().join(krate));
        // Depth-first search for a back edge.
        fn visit<'a>(
            m: &'a str,
            uses: &'a std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
            path: &mut Vec<&'a str>,
            done: &mut std::collections::BTreeSet<&'a str>,
        ) -> Option<String> {
            if let Some(i) = path.iter().position(|p| *p == m) {
                return Some(format!("{} -> {m}", path[i..].join(" -> ")));
            }
            if !done.insert(m) {
                return None;
            }
            path.push(m);
            for d in uses.get(m).into_iter().flatten() {
                if let Some(c) = visit(d, uses, path, done) {
                    return Some(c);
                }
            }
            path.pop();
            None
        }
        let mut done = std::collections::BTreeSet::new();
        for m in uses.keys() {
            if let Some(c) = visit(m, &uses, &mut vec![], &mut done) {
                panic!("{krate}: import circle {c}");
            }
        }
        assert!(
            uses.len() > 10,
            "{krate}: only {} modules found",
            uses.len()
        );
    }
}

/// `kiln ARGS` with environment variables set (`Some`) or removed
/// (`None`): success, stdout, stderr.
fn kiln_env(args: &[&str], env: &[(&str, Option<&str>)]) -> (bool, String, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kiln"));
    c.args(args);
    for (k, v) in env {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    let out = c.output().expect("run kiln");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

/// A safetensors file of f64 tensors (a dtype Kiln does not hold), as
/// `save_file({"x": torch.randn(2, 3, dtype=torch.float64)})` writes.
fn f64_inputs(name: &str, tensors: &[(&str, &[usize])]) -> PathBuf {
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, shape)| {
            let count: usize = shape.iter().product();
            let b = (0..count).flat_map(|i| (i as f64).to_le_bytes()).collect();
            (n.to_string(), shape.to_vec(), b)
        })
        .collect();
    let views = bytes.iter().map(|(n, shape, b)| {
        let v = safetensors::tensor::TensorView::new(safetensors::Dtype::F64, shape.clone(), b);
        (n.clone(), v.unwrap())
    });
    let p = dir().join(name);
    std::fs::write(&p, safetensors::serialize(views, None).unwrap()).unwrap();
    p
}

/// What a new user meets first (issue #73): each message names the
/// problem by what the file holds, and the fix.
#[test]
fn first_hour_messages_say_what_is_wrong_and_the_fix() {
    let prog = write("first.txt", PROG);
    let out = dir().join("first_unused.safetensors");
    let names = root().join("tests/fixtures/import/names");
    let pt2 = names.join("nnnnnnnn.pt2");
    // An f64 tensor where the program takes f32: not "missing", but a
    // dtype Kiln does not hold, with the conversion.
    let f64s = f64_inputs("f64.safetensors", &[("x", &[2, 3]), ("m", &[2, 3])]);
    for backend in ["reference", "gpu"] {
        let args = [
            "run",
            s(&prog),
            "--inputs",
            s(&f64s),
            "--output",
            s(&out),
            "--backend",
            backend,
        ];
        expect_error(&args, &["`x`", "F64", "does not hold", "x.float()"]);
    }
    let f64_pt2 = f64_inputs("f64_pt2.safetensors", &[("input", &[1, 3])]);
    expect_error(
        &["run", s(&pt2), "--inputs", s(&f64_pt2), "--output", s(&out)],
        &["`input`", "F64", "does not hold", "x.float()"],
    );
    // Files that are not what their name says, named by their content.
    let random: Vec<u8> = (0..64u32).map(|i| (i * 97 + 13) as u8 | 0x80).collect();
    let fake = dir().join("model.pt2");
    std::fs::write(&fake, &random).unwrap();
    let binary = dir().join("prog.txt");
    std::fs::write(&binary, &random).unwrap();
    let empty = write("empty.pt2", "");
    let empty_txt = write("empty.txt", "");
    for cmd in ["print", "compile"] {
        expect_error(
            &[cmd, s(&fake)],
            &["model.pt2", "not a zip archive", "8d ee"],
        );
        expect_error(&[cmd, s(&binary)], &["prog.txt", "is not text", "8d ee"]);
        expect_error(
            &[cmd, s(&empty)],
            &["empty.pt2 is empty", "torch.export.save"],
        );
        expect_error(&[cmd, s(&empty_txt)], &["empty.txt is empty", "graph NAME"]);
    }
    // A missing inputs file is reported before any adapter is looked for
    // (a bogus KILN_ADAPTER would fail otherwise), for a program, an
    // archive and the runtime alone.
    let no_adapter = [("KILN_ADAPTER", Some("no adapter has this name"))];
    for p in [&prog, &pt2] {
        let args = [
            "run",
            s(p),
            "--inputs",
            "/nonexistent/in.safetensors",
            "--output",
            s(&out),
            "--backend",
            "gpu",
        ];
        let (ok, _, err) = kiln_env(&args, &no_adapter);
        assert!(
            !ok && err.contains("cannot read /nonexistent/in.safetensors"),
            "{err}"
        );
        assert!(
            !err.contains("KILN_ADAPTER"),
            "the adapter was opened first: {err}"
        );
    }
    let (ok, _, err) = kiln_env(
        &[
            "profile",
            s(&prog),
            "--inputs",
            "/nonexistent/in.safetensors",
        ],
        &no_adapter,
    );
    assert!(
        !ok && err.contains("cannot read /nonexistent/in.safetensors"),
        "{err}"
    );
    // The runtime alone: the inputs file first, then an f64 tensor named
    // with its conversion (before the adapter too).
    let model = dir().join("first.kiln");
    let (ok, _, err) = kiln(&["export", s(&pt2), "--output", s(&model)]);
    assert!(ok, "{err}");
    let kr = |ins: &str| {
        let o = Command::new(common::kiln_run_exe())
            .args([s(&model), "--inputs", ins, "--output", s(&out)])
            .env("KILN_ADAPTER", "no adapter has this name")
            .output()
            .unwrap();
        assert!(!o.status.success());
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let err = kr("/nonexistent/in.safetensors");
    assert!(
        err.contains("cannot read /nonexistent/in.safetensors"),
        "{err}"
    );
    let err = kr(s(&f64_pt2));
    assert!(
        err.contains("`input`") && err.contains("F64") && err.contains("x.float()"),
        "{err}"
    );
}

/// A successful GPU run prints the adapter and nothing else on a machine
/// without `XDG_RUNTIME_DIR` (Mesa's device-select layer looked for
/// Wayland and libwayland complained twice), and an archive's output
/// file holds its outputs, not its weights or the inputs it only reads.
#[test]
fn a_gpu_run_is_quiet_and_writes_only_what_was_asked() {
    let names = root().join("tests/fixtures/import/names");
    let out = dir().join("quiet.safetensors");
    let (pt2, ins) = (names.join("nnnnnnnn.pt2"), names.join("inputs.safetensors"));
    let args = [
        "run",
        s(&pt2),
        "--inputs",
        s(&ins),
        "--output",
        s(&out),
        "--backend",
        "gpu",
    ];
    let (ok, _, err) = kiln_env(
        &args,
        &[("XDG_RUNTIME_DIR", None), ("NODEVICE_SELECT", None)],
    );
    assert!(ok, "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert!(
        lines.len() == 1 && lines[0].starts_with("adapter: "),
        "{err}"
    );
    let got = kiln::io::load_all(&out).unwrap();
    let written: Vec<&str> = got.iter().map(|x| x.0.as_str()).collect();
    assert_eq!(written, ["output.0"]);
}

/// On a terminal, a GPU run counts the pipelines it compiles (a new
/// model's first run on lavapipe takes minutes); elsewhere it prints
/// nothing of it. The terminal is `script`'s (util-linux), as a person's.
#[test]
fn pipeline_progress_shows_on_a_terminal_only() {
    let f = root().join("tests/fixtures/import");
    let out = dir().join("progress.safetensors");
    let args = [
        "run".to_string(),
        s(&f.join("efficientnet.pt2")).to_string(),
        "--inputs".to_string(),
        s(&f.join("efficientnet.inputs.safetensors")).to_string(),
        "--output".to_string(),
        s(&out).to_string(),
        "--backend".to_string(),
        "gpu".to_string(),
    ];
    let (ok, _, err) = kiln(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(ok, "{err}");
    assert!(
        !err.contains("compiling"),
        "progress without a terminal: {err}"
    );
    let line = format!("{} {}", env!("CARGO_BIN_EXE_kiln"), args.join(" "));
    let tty = Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .output()
        .expect("script (util-linux) runs kiln on a terminal");
    let shown = String::from_utf8_lossy(&tty.stdout).replace('\r', "\n");
    assert!(tty.status.success(), "{shown}");
    let last = shown
        .lines()
        .rfind(|l| l.starts_with("compiling "))
        .unwrap_or_else(|| panic!("no progress on a terminal: {shown}"));
    // `compiling N kernels: N done` closes the count.
    let words: Vec<&str> = last.split_whitespace().collect();
    assert_eq!(words.len(), 5, "{last}");
    assert_eq!(words[1], words[3], "{last}");
}
