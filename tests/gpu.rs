//! The GPU backend against PyTorch's results, on a real wgpu adapter
//! (lavapipe in CI): every example and op program, outputs and final
//! inputs. A machine without an adapter fails here with what to install.

mod common;

use common::{programs, root};
use kiln::engine::{Engine, EngineError};
use kiln::functionalize::compare::Tolerance;
use kiln::functionalize::{parse, DType, RTensor};

/// `g` compiled with `options`, a launch per kernel where a small program
/// would run them in sequence in one workgroup
/// (`CompileOptions::sequence`): the kernels these tests look at.
fn launched(
    g: &kiln::functionalize::Graph,
    options: &kiln::engine::CompileOptions,
) -> Result<kiln::engine::Program, kiln::engine::EngineError> {
    let options = kiln::engine::CompileOptions {
        sequence: false,
        ..options.clone()
    };
    kiln::engine::compile_with(g, &options)
}

fn engine() -> Engine {
    match Engine::new() {
        Ok(e) => e,
        Err(e) => panic!("the GPU tests need a wgpu adapter: {e}"),
    }
}

/// `assert_close`'s tolerances (`kiln::functionalize::compare`): the
/// dtype's defaults for `rel == 0`; for results accumulated over many
/// terms (products, reductions: GPU f32 against the f64 reference), `rel`
/// of the largest expected magnitude as well. Elements PyTorch computes as
/// inf or NaN are not compared: WGSL lets shader compilers assume finite
/// arithmetic (lavapipe folds `inf - inf` and `x / 0`), so Kiln guarantees
/// finite results only.
fn close_gpu(what: &str, a: &RTensor, b: &RTensor, rel: f64) -> Result<(), String> {
    common::same_type(what, a, b)?;
    let bv = b.values();
    let scale = bv
        .iter()
        .filter(|x| x.is_finite())
        .fold(1.0f64, |m, x| m.max(x.abs()));
    let tol = if rel == 0.0 {
        Tolerance::of(a.dtype())
    } else {
        Tolerance::accumulated(a.dtype(), rel, scale)
    };
    for (i, (x, y)) in a.values().iter().zip(&bv).enumerate() {
        if y.is_finite() && !tol.accepts(*x, *y) {
            return Err(format!(
                "{what}: element {i} is {x}, expected {y} ({tol:?})"
            ));
        }
    }
    Ok(())
}

/// Every output and final input of a GPU run against the reference's
/// (`close_gpu`), the first mismatch named `what` and its position.
fn close_run(
    what: &str,
    got: &kiln::engine::EngineRun,
    want: &kiln::functionalize::RunResult,
    rel: f64,
) -> Result<(), String> {
    for (i, (a, b)) in got
        .outputs
        .iter()
        .zip(&want.outputs)
        .chain(got.inputs.iter().zip(&want.inputs))
        .enumerate()
    {
        close_gpu(&format!("{what}: value {i}"), a, b, rel)?;
    }
    Ok(())
}

fn check_dir(dir: &str) {
    check_dir_on(dir, engine());
}

fn check_dir_on(dir: &str, mut e: Engine) {
    eprintln!("adapter: {}", e.gpu().describe());
    let mut failures = vec![];
    let mut unsupported = vec![];
    let mut n = 0;
    for prog in programs(&root().join(dir)) {
        let rel = prog.strip_prefix(root()).unwrap().with_extension("");
        let fix = root().join("tests/fixtures").join(&rel);
        let g = parse(&std::fs::read_to_string(&prog).unwrap()).unwrap();
        let ins = kiln::io::load_inputs(&g, &fix.with_extension("inputs.safetensors")).unwrap();
        let want = kiln::io::load_all(&fix.with_extension("expected.safetensors")).unwrap();
        let r = match e.run(&g, ins) {
            Ok(r) => r,
            Err(EngineError::Compile(c)) if c.is_unsupported() => {
                unsupported.push(format!("{}: {c}", rel.display()));
                continue;
            }
            Err(err) => {
                failures.push(format!("{}: {err}", rel.display()));
                continue;
            }
        };
        n += 1;
        let names = kiln::functionalize::text::Names::of(&g);
        let mut got: Vec<(String, RTensor)> = r
            .outputs
            .into_iter()
            .enumerate()
            .map(|(i, t)| (format!("output.{i}"), t))
            .collect();
        got.extend(
            g.inputs
                .iter()
                .zip(r.inputs)
                .map(|(&v, t)| (names.get(v), t)),
        );
        got.sort_by(|a, b| a.0.cmp(&b.0));
        let heavy = common::accumulates(&std::fs::read_to_string(&prog).unwrap());
        let rtol = if heavy { 1e-4 } else { 0.0 };
        for ((n1, a), (n2, b)) in got.iter().zip(&want) {
            if n1 != n2 {
                failures.push(format!("{}: tensor {n1} vs {n2}", rel.display()));
                break;
            }
            if let Err(m) = close_gpu(n1, a, b, rtol) {
                failures.push(format!("{}: {m}", rel.display()));
                break;
            }
        }
    }
    eprintln!(
        "{n} programs ran on the GPU; {} unsupported",
        unsupported.len()
    );
    assert!(
        failures.is_empty(),
        "{} programs differ on the GPU:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(
        unsupported.is_empty(),
        "unsupported on the GPU:\n{}",
        unsupported.join("\n")
    );
}

#[test]
fn example_programs_on_the_gpu() {
    check_dir("examples/programs");
}

#[test]
fn op_programs_on_the_gpu() {
    check_dir("tests/programs/ops");
}

/// The default (GPU) options with a launch per kernel, none merged into
/// a row kernel: for tests that count kernels of a form.
fn apart() -> kiln::engine::CompileOptions {
    kiln::engine::CompileOptions {
        share_launches: false,
        chain_rows: false,
        ..Default::default()
    }
}

fn limited_engine(adjust: impl FnOnce(&mut kiln::engine::wgpu::Limits)) -> Engine {
    let gpu = pollster::block_on(kiln::engine::Gpu::with_limits(adjust))
        .unwrap_or_else(|e| panic!("the GPU tests need a wgpu adapter: {e}"));
    Engine::on(kiln::engine::Session::new(std::sync::Arc::new(gpu)))
}

/// Every op program again on the same adapter limited to 1 KiB bindings:
/// tensors over 256 words are bound in pieces (accessor functions pick
/// the piece), as a tensor over a real device's limit is.
#[test]
fn op_programs_with_one_kib_bindings() {
    check_dir_on(
        "tests/programs/ops",
        limited_engine(|l| l.max_storage_buffer_binding_size = 1024),
    );
}

/// The kernel variants for real GPUs, which a CPU adapter would not pick
/// (row reductions through workgroup memory, 256-invocation workgroups,
/// vec4 elementwise kernels looping over the grid; the tiled matrix
/// product is every device's),
/// on every op program and the example programs.
#[test]
fn op_programs_with_the_gpu_variants() {
    for dir in ["tests/programs/ops", "examples/programs"] {
        check_dir_on(dir, gpu_variants());
    }
}

/// Four elements an invocation: a bias row broadcast over rows and a
/// slice at a multiple of 4 are read lane to lane in aligned quads, one
/// vector load a quad; a column broadcast and a slice at an odd offset
/// are read element by element. As the reference computes, on the
/// adapter's options and the GPU variant's.
#[test]
fn broadcast_rows_load_as_quads() {
    let src = "graph f(%x: f32[6, 8], %b: f32[8], %c: f32[6, 1], %e: f32[16], %h: f32[16]) {
  %s = slice(%e, 0, 4, 12)
  %s2 = slice(%h, 0, 3, 11)
  %a = add(%x, %b)
  %m = mul(%a, %c)
  %y = add(%m, %s)
  %z = sub(%y, %s2)
  return %z
}";
    let g = parse(src).unwrap();
    let ins = kiln::functionalize::random::random_inputs(&g, 3, 1.0);
    let want = kiln::run(&g, ins.clone()).unwrap();
    let gpu = std::sync::Arc::new(kiln::engine::Gpu::new().unwrap());
    for options in [gpu.compile_options(), common::gpu_variant_options(&gpu)] {
        let p = launched(&g, &options).unwrap();
        assert_eq!(p.kernels.len(), 1, "{}", p.stats());
        let wgsl = &p.kernels[0].code.wgsl;
        let quads = wgsl
            .lines()
            .filter(|l| l.contains(": vec4<u32> = b") && l.contains(">> 2u]"))
            .count();
        assert_eq!(quads, 2, "{wgsl}");
        let mut e = Engine::on(kiln::engine::Session::with_options(gpu.clone(), options));
        let got = e.run(&g, ins.clone()).unwrap();
        close_gpu("z", &got.outputs[0], &want.outputs[0], 0.0).unwrap();
    }
}

/// The adapter at hand compiling as for a real GPU.
fn gpu_variants() -> Engine {
    Engine::on(common::gpu_variant_session())
}

/// And with a browser's 8 storage buffers per kernel: fusion stays within
/// them. Compiled as for a browser without `shader-f16`: f16 conversions
/// in integer arithmetic (the other variants use the adapter's own).
#[test]
fn op_programs_with_eight_storage_buffers() {
    for dir in ["tests/programs/ops", "examples/programs"] {
        let e = limited_engine(|l| l.max_storage_buffers_per_shader_stage = 8);
        let gpu = e.session.gpu().clone();
        let mut options = gpu.compile_options();
        options.shader_f16 = false;
        // WebGPU's 256-byte binding offsets, as browsers bind: small
        // tensors counted as one binding share windows.
        options.rules.align_words = 64;
        check_dir_on(
            dir,
            Engine::on(kiln::engine::Session::with_options(gpu, options)),
        );
    }
}

/// `e`'s adapter compiling without the native f16 conversion variants.
fn soft_f16(e: Engine) -> Engine {
    let gpu = e.session.gpu().clone();
    let mut options = gpu.compile_options();
    options.shader_f16 = false;
    Engine::on(kiln::engine::Session::with_options(gpu, options))
}

/// Random programs of views and mutations: eager reference vs GPU, on
/// outputs and final inputs.
/// `vjp`, `jvp` and `vmap` of every transform case run on the GPU as
/// on the reference.
#[test]
fn transformed_programs_on_the_gpu() {
    use kiln::functionalize::transform;
    let mut e = engine();
    let mut n = 0;
    for src in common::transform_cases::CASES {
        let g = parse(src).unwrap();
        let dims = vec![Some(0); g.inputs.len()];
        let programs = [
            transform::vjp(&g, None),
            transform::jvp(&g, None),
            transform::vmap(&g, &dims, 3, None),
        ];
        for (k, t) in programs.into_iter().enumerate() {
            let t = t.unwrap_or_else(|err| panic!("{}: {err}", g.name));
            let ins = || kiln::functionalize::random::random_inputs(&t, 7 + k as u64, 1.0);
            let want = kiln::run(&t, ins()).unwrap_or_else(|err| panic!("{}: {err}", g.name));
            if !want
                .outputs
                .iter()
                .all(|o| o.values().iter().all(|x| x.is_finite()))
            {
                continue;
            }
            let got = e
                .run(&t, ins())
                .unwrap_or_else(|err| panic!("{} ({k}): {err}\n{}", g.name, kiln::print(&t)));
            close_run(&g.name, &got, &want, 1e-4)
                .unwrap_or_else(|m| panic!("{} ({k}): {m}\n{}", g.name, kiln::print(&t)));
            n += 1;
        }
    }
    assert!(
        n >= 3 * common::transform_cases::CASES.len() - 6,
        "only {n} transformed programs compared"
    );
}

/// `torch.func` on the example programs (fixtures), on the GPU.
#[test]
fn torch_func_fixtures_on_the_gpu() {
    let mut e = engine();
    let (mut n, mut failures) = (0, vec![]);
    for name in common::example_names() {
        let mut exec = |g: &kiln::functionalize::Graph, ins: Vec<RTensor>| {
            e.run(g, ins)
                .map(|r| r.outputs)
                .map_err(|err| err.to_string())
        };
        match common::check_torch_transforms(&name, &mut exec, 1e-4) {
            Ok(k) => n += k,
            Err(m) => failures.push(format!("{name}: {m}")),
        }
    }
    assert!(
        failures.is_empty(),
        "{} differ from torch.func:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(n >= 100, "only {n} transforms compared");
}

#[test]
fn random_programs_match_the_reference_on_the_gpu() {
    use kiln::functionalize::random::{random_program, Seeded};
    // Odd seeds compile as for a real GPU.
    let mut engines = [engine(), gpu_variants()];
    let mut checked = 0;
    // KILN_GPU_RANDOM=N runs more.
    let n: u64 = std::env::var("KILN_GPU_RANDOM")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(150);
    for seed in 0..n {
        let g = random_program(&mut Seeded(seed), 25);
        // Every third program given one tensor for two of its parameters.
        let g = match common::aliased_variant(&g) {
            Some(a) if seed % 3 == 0 => a,
            _ => g,
        };
        let ins =
            || kiln::functionalize::random::random_inputs(&g, seed.wrapping_mul(2654435761), 2.0);
        let Ok(want) = kiln::run(&g, ins()) else {
            continue;
        };
        // GPUs need not produce inf/NaN (see close_gpu): programs that go
        // through a non-finite value on the reference are not compared.
        // (On the functionalized graph, where no later write hides a value.)
        let mut all = kiln::functionalize(&g, kiln::Remove::MutationsAndViews)
            .unwrap()
            .graph;
        all.outputs = all
            .order
            .iter()
            .flat_map(|&n| all.nodes[n].results.clone())
            .collect();
        let finite = kiln::run(&all, ins()).is_ok_and(|r| {
            r.outputs
                .iter()
                .all(|t| t.values().iter().all(|x| x.is_finite()))
        });
        if !finite {
            continue;
        }
        let got = engines[(seed % 2) as usize]
            .run(&g, ins())
            .unwrap_or_else(|err| panic!("seed {seed}: {err}\n{}", kiln::print(&g)));
        close_run("random", &got, &want, 1e-4)
            .unwrap_or_else(|m| panic!("seed {seed}: {m}\n{}", kiln::print(&g)));
        checked += 1;
    }
    assert!(
        checked * 3 > n * 2,
        "only {checked} of {n} random programs ran"
    );
}

#[test]
fn a_missing_adapter_is_a_clear_error() {
    // KILN_ADAPTER picks an adapter by name; one that matches nothing says
    // which adapters there are.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args([
            "run",
            "examples/programs/mlp_block.txt",
            "--backend",
            "gpu",
            "--inputs",
        ])
        .arg(root().join("tests/fixtures/examples/programs/mlp_block.inputs.safetensors"))
        .args(["--output", "/dev/null"])
        .env("KILN_ADAPTER", "no-such-adapter")
        .current_dir(root())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("no-such-adapter") && err.contains("matches none"),
        "{err}"
    );
}

/// Size 4096 (more than one row of workgroups) for every kind of kernel,
/// against the reference interpreter.
#[test]
fn large_operands_match_the_reference() {
    let mut e = engine();
    let progs = [
        ("%y = exp(%x)\n%t = t(%m)\n%z = add(%t, 1)", "(%y, %z)"),
        ("%y = softmax(%x, 0)\n%s = softmax(%m, 1)", "(%y, %s)"),
        ("%y = layer_norm(%m, [64])\n%s = sum(%x)", "(%y, %s)"),
        ("%t = t(%m)\n%y = matmul(%m, %t)\n%a = amax(%x, [0])", "(%y, %a)"),
        // Writes into a slice of a base that read the base: another region
        // (written in place), and the written region transposed (a race in
        // place: must be written out of place).
        ("%b = clone(%m)\n%s = slice(%b, 0, 0, 32)\n%r = slice(%b, 0, 32, 64)\n%c = copy_(%s, %r)\n%e = exp_(%r)", "(%b, %x)"),
        ("%b = clone(%m)\n%q = slice(%b, 0, 0, 32)\n%q2 = slice(%q, 1, 0, 32)\n%t = t(%q2)\n%c = clone(%t)\n%w = copy_(%q2, %c)", "(%b, %x)"),
        // Bools packed four to a word, read back and read by other kernels.
        ("%p = gt(%x, 0.0)\n%n = logical_not(%p)\n%w = where(%n, %x, 0.0)\n%s = sum(%n)", "(%n, %w, %s)"),
        ("%i = arange(0, 4096, 64, i32)\n%y = index_select(%x, 0, %i)\n%s = slice(%x, 0, 100, 4000, 3)\n%w = mul_(%s, 2)", "(%y, %x)"),
    ];
    for (body, ret) in progs {
        let src = format!("graph f(%x: f32[4096], %m: f32[64, 64]) {{\n{body}\nreturn {ret}\n}}");
        let g = parse(&src).unwrap();
        let ins = || {
            vec![
                RTensor::new(
                    DType::F32,
                    vec![4096],
                    &(0..4096)
                        .map(|i| ((i * 37 % 101) as f64) / 50.0 - 1.0)
                        .collect::<Vec<_>>(),
                ),
                RTensor::new(
                    DType::F32,
                    vec![64, 64],
                    &(0..4096)
                        .map(|i| ((i * 53 % 97) as f64) / 48.0 - 1.0)
                        .collect::<Vec<_>>(),
                ),
            ]
        };
        let want = kiln::run(&g, ins()).unwrap();
        let got = e.run(&g, ins()).unwrap();
        close_run(body, &got, &want, 1e-4).unwrap();
    }
}

/// A matrix product of a sum of seven parameters reads eight buffers
/// through its inlined producers: with four allowed, producers get kernels
/// of their own until every kernel fits, and the result is unchanged.
#[test]
fn kernels_over_the_storage_buffer_limit_materialize_producers() {
    let src = "graph wide(%a: f32[8, 8], %b: f32[8, 8], %c: f32[8, 8], %d: f32[8, 8], %e: f32[8, 8], %f: f32[8, 8], %w: f32[8, 8]) {
  %s1 = add(%a, %b)
  %s2 = add(%s1, %c)
  %s3 = mul(%s2, %d)
  %s4 = sub(%s3, %e)
  %s5 = add(%s4, %f)
  %y = mm(%s5, %w)
  return %y
}";
    let g = parse(src).unwrap();
    let options = kiln::engine::CompileOptions {
        max_bindings: 4,
        ..Default::default()
    };
    let p = launched(&g, &options).unwrap();
    assert!(p.kernels.len() > 1, "{}", p.stats());
    for k in &p.kernels {
        assert!(k.code.bindings.len() <= 4, "{}", p.stats());
    }
    let mut e = limited_engine(|l| l.max_storage_buffers_per_shader_stage = 4);
    let ins = kiln::functionalize::random::random_inputs(&g, 3, 1.0);
    let want = kiln::run(&g, ins.clone()).unwrap();
    let got = e.run(&g, ins).unwrap();
    close_gpu("y", &got.outputs[0], &want.outputs[0], 1e-5).unwrap();
}

/// Small tensors a kernel binds count as one binding when kernels are
/// grouped (placed a word apart, their windows overlap and are bound
/// once): ten outputs and three inputs are one kernel within WebGPU's 8
/// storage buffers at its 256-byte offsets (`comparisons_inplace`: 3
/// kernels before). Where a plan finds a kernel over the limit after all
/// (attention_block with 3 allowed), its kernels are grouped again
/// counting a binding per buffer, and the program still compiles.
#[test]
fn small_tensors_share_a_binding_when_kernels_are_grouped() {
    let src =
        std::fs::read_to_string(root().join("examples/programs/comparisons_inplace.txt")).unwrap();
    let g = parse(&src).unwrap();
    let gpu = std::sync::Arc::new(kiln::engine::Gpu::new().unwrap());
    let mut options = common::gpu_variant_options(&gpu);
    options.max_bindings = 8;
    let p = launched(&g, &options).unwrap();
    assert_eq!(p.kernels.len(), 1, "{}", p.stats());
    assert!(p.kernels[0].code.bindings.len() <= 8, "{}", p.stats());
    assert_eq!(p.bytes_moved(), p.min_bytes, "{}", p.stats());
    let mut e = Engine::on(kiln::engine::Session::with_options(
        gpu.clone(),
        options.clone(),
    ));
    let ins = kiln::functionalize::random::random_inputs(&g, 7, 1.0);
    let want = kiln::run(&g, ins.clone()).unwrap();
    close_run("comparisons_inplace", &e.run(&g, ins).unwrap(), &want, 0.0).unwrap();

    let src =
        std::fs::read_to_string(root().join("examples/programs/attention_block.txt")).unwrap();
    let g = parse(&src).unwrap();
    options.max_bindings = 3;
    let p = launched(&g, &options).unwrap();
    for k in &p.kernels {
        assert!(k.code.bindings.len() <= 3, "{}", p.stats());
    }
    let mut e = Engine::on(kiln::engine::Session::with_options(gpu, options));
    let ins = kiln::functionalize::random::random_inputs(&g, 7, 1.0);
    let want = kiln::run(&g, ins.clone()).unwrap();
    close_run("attention_block", &e.run(&g, ins).unwrap(), &want, 1e-5).unwrap();
}

/// Matrix products at sizes that are not multiples of the tiles or of 16
/// along K, with a transposed weight, a broadcast batch, a bias and a
/// short product (9 rows: 16-row tiles), on both variants.
#[test]
fn matrix_products_at_awkward_sizes_on_both_variants() {
    // K = 36: vec4 loads of the blocks (B along K, then along columns).
    let src = "graph f(%x: f32[3, 70, 37], %w: f32[130, 37], %b: f32[130], %p: f32[3, 17, 66], %q: f32[65, 17], %r: f32[9, 37], %x4: f32[3, 70, 36], %w4: f32[130, 36], %p4: f32[3, 36, 68]) {
  %y = linear(%x, %w, %b)
  %s = linear(%r, %w, %b)
  %z = matmul(%q, %p)
  %t = transpose(%p, 1, 2)
  %v = matmul(%t, %p)
  %y4 = linear(%x4, %w4, %b)
  %z4 = matmul(%x4, %p4)
  %e = exp(%x4)
  %u4 = matmul(%e, %p4)
  return (%y, %z, %v, %s, %y4, %z4, %u4)
}";
    let g = parse(src).unwrap();
    let gpu = std::sync::Arc::new(kiln::engine::Gpu::new().unwrap());
    for (tiled, tall, wide) in [
        (true, false, false),
        (true, true, false),
        (true, true, true),
        (false, false, false),
    ] {
        let mut options = gpu.compile_options();
        options.tile_min_rows = if tiled { 0 } else { usize::MAX };
        options.tall_tiles_from = if tall { 0 } else { usize::MAX };
        options.wide_blocks = wide;
        // A launch each but for sibling products (y4 and z4: one left
        // operand): the counts below are of products, a launch's parts.
        options.share_launches = false;
        options.contiguous_operands = false;
        let p = launched(&g, &options).unwrap();
        let vec4 = parts_where(&p, |w| w.contains("bitcast<vec4<f32>>"));
        // y4 and z4; u4 reads exp(x4) inline, element by element (its
        // B tiles, staged through workgroup memory, are still vectors).
        assert_eq!(vec4, if tiled { 3 } else { 2 });
        // Tiles kept as vectors, the next K step prefetched: y (K = 37:
        // element loads of both), y4 (vector loads along k), z4 (B
        // row-major, vectors of its columns), u4 (exp(x4) element by
        // element, B's vectors); z's 66 columns and v's transposed A keep
        // the scalar tiles.
        // (Tall: A's tiles of 128 rows, 640 vectors; wide: 8x16
        // invocations.)
        if wide {
            let narrow = p
                .kernels
                .iter()
                .filter(|k| k.code.wgsl.contains("array<vec4<f32>, 640>"))
                .filter(|k| !k.code.wgsl.contains("@workgroup_size(8, 16, 1)"))
                .count();
            assert_eq!(narrow, 0);
        }
        let tile = if tall { 640 } else { 320 };
        let vec4_tiles = parts_where(&p, |w| w.contains(&format!("array<vec4<f32>, {tile}>")));
        assert_eq!(vec4_tiles, if tiled { 4 } else { 0 });
        let mut e = Engine::on(kiln::engine::Session::with_options(gpu.clone(), options));
        let ins = kiln::functionalize::random::random_inputs(&g, 5, 1.0);
        let want = kiln::run(&g, ins.clone()).unwrap();
        let got = e.run(&g, ins).unwrap();
        for (a, b) in got.outputs.iter().zip(&want.outputs) {
            close_gpu(
                &format!("tiled {tiled}, tall {tall}, wide {wide}"),
                a,
                b,
                1e-5,
            )
            .unwrap();
        }
    }
}

/// SwiGLU-style pairs of products of one left operand, one read by the
/// other's epilogue, are one kernel accumulating both (`Schedule::twins`):
/// `linear` with biases (vec4 tiles along k), a skinny pair with the
/// second product first, batched `matmul`s with row-major weights (vector
/// tiles of B's columns), K = 37 (element loads), a transposed A (scalar
/// tiles); tiled, tall-tiled (a
/// twin is never tall) and per-invocation blocks; results as the
/// reference computes them.
#[test]
fn twin_products_are_one_kernel() {
    let src = "graph f(%x: f32[70, 36], %w1: f32[48, 36], %w3: f32[48, 36], %b1: f32[48], %b3: f32[48], %x5: f32[5, 37], %v1: f32[20, 37], %v3: f32[20, 37], %a: f32[2, 70, 36], %m1: f32[36, 68], %m3: f32[36, 68], %y: f32[40, 37], %u1: f32[24, 37], %u3: f32[24, 37], %xt: f32[37, 40], %n1: f32[37, 24], %n3: f32[37, 24]) {
  %g = linear(%x, %w1, %b1)
  %gs = silu(%g)
  %u = linear(%x, %w3, %b3)
  %h = mul(%gs, %u)
  %u5 = linear(%x5, %v3)
  %g5 = linear(%x5, %v1)
  %ge5 = gelu(%g5)
  %h5 = mul(%u5, %ge5)
  %gm = matmul(%a, %m1)
  %um = matmul(%a, %m3)
  %sm = sigmoid(%gm)
  %hm = mul(%um, %sm)
  %gy = linear(%y, %u1)
  %uy = linear(%y, %u3)
  %ry = relu(%gy)
  %hy = mul(%ry, %uy)
  %t = t(%xt)
  %gt = mm(%t, %n1)
  %ut = mm(%t, %n3)
  %ht = add(%gt, %ut)
  return (%h, %h5, %hm, %hy, %ht)
}";
    let g = parse(src).unwrap();
    let gpu = std::sync::Arc::new(kiln::engine::Gpu::new().unwrap());
    for (tiled, tall, wide) in [
        (true, false, false),
        (true, true, false),
        (true, true, true),
        (false, false, false),
    ] {
        let mut options = gpu.compile_options();
        options.tile_min_rows = if tiled { 0 } else { usize::MAX };
        options.tall_tiles_from = if tall { 0 } else { usize::MAX };
        options.wide_blocks = wide;
        options.share_launches = false;
        options.contiguous_operands = false;
        let p = launched(&g, &options).unwrap();
        let what = format!("tiled {tiled}, tall {tall}");
        assert_eq!(p.kernels.len(), 5, "{what}: {}", p.stats());
        // The tiled pairs stage the twin's B in a tile of its own; the
        // skinny one adds both sums through `red` in turn.
        let tb2 = p
            .kernels
            .iter()
            .filter(|k| k.code.wgsl.contains("var<workgroup> tb2"))
            .count();
        assert_eq!(tb2, if tiled { 4 } else { 0 }, "{what}");
        let mut e = Engine::on(kiln::engine::Session::with_options(gpu.clone(), options));
        let ins = kiln::functionalize::random::random_inputs(&g, 11, 1.0);
        let want = kiln::run(&g, ins.clone()).unwrap();
        let got = e.run(&g, ins).unwrap();
        for (k, (a, b)) in got.outputs.iter().zip(&want.outputs).enumerate() {
            close_gpu(&format!("{what}, output {k}"), a, b, 1e-5).unwrap();
        }
    }
}

/// Independent kernels share a launch (`codegen::siblings`): reductions
/// of one tensor (a sum, an amax and a mean, whatever their workgroups),
/// and writes into a K and a V cache in place, on the GPU
/// variant (grid-stride loops, rows through workgroup memory) and on this
/// adapter's; results and mutated caches as the reference computes them.
#[test]
fn independent_kernels_share_a_launch() {
    let src = "graph f(%x: f32[64, 256], %kc: f32[2, 8, 4], %vc: f32[2, 8, 4], %k: f32[2, 3, 4], %v: f32[2, 3, 4]) {
  %s = sum(%x, [1])
  %m = amax(%x, [1])
  %n = mean(%x, [1])
  %ks = slice(%kc, 1, 2, 5)
  %kw = copy_(%ks, %k)
  %vs = slice(%vc, 1, 2, 5)
  %vw = copy_(%vs, %v)
  return (%s, %m, %n)
}";
    let g = parse(src).unwrap();
    let gpu = std::sync::Arc::new(kiln::engine::Gpu::new().unwrap());
    // GPU variant: the sum and the mean reduce rows in workgroups of 64,
    // the amax and the scatters run 256 invocations a workgroup, each
    // spread over four of the launch's. This CPU adapter's variant: 64
    // throughout. One launch.
    for (options, launches) in [
        (kiln::engine::CompileOptions::default(), 1),
        (gpu.compile_options(), 1),
    ] {
        let p = launched(&g, &options).unwrap();
        let labels: Vec<&str> = p.kernels.iter().map(|k| k.code.label.as_str()).collect();
        let parts: usize = labels.iter().map(|l| l.split(" | ").count()).sum();
        assert_eq!(parts, 5, "{labels:?}");
        assert_eq!(labels.len(), launches, "{labels:?}");
        assert_eq!(launches_apart(&g, &options), 5);
        let mut e = Engine::on(kiln::engine::Session::with_options(gpu.clone(), options));
        let ins = kiln::functionalize::random::random_inputs(&g, 9, 1.0);
        let want = kiln::run(&g, ins.clone()).unwrap();
        let got = e.run(&g, ins).unwrap();
        for (a, b) in got.outputs.iter().zip(&want.outputs) {
            close_gpu("output", a, b, 1e-5).unwrap();
        }
        for (a, b) in got.inputs.iter().zip(&want.inputs) {
            close_gpu("parameter", a, b, 0.0).unwrap();
        }
    }
}

/// Kernels of other grids and workgroup shapes share a launch
/// (`codegen::siblings::join`): a `bmm` of two batches, a `matmul`
/// broadcasting them over eight and a `mm` (grids of other depths, one
/// row of workgroups each unfolds its own), and an `amax`: on the GPU
/// variant of 256 lanes beside products in 32 x 8 tiles (each part
/// unfolds its own `lid`), on this adapter's of 64 lanes beside products
/// of 256 invocations (four of its workgroups in one of the launch's).
/// One read of `b`; results as the reference.
#[test]
fn kernels_of_other_grids_share_a_launch() {
    let src = "graph f(%a: f32[3, 8], %b: f32[2, 8, 5], %d: f32[4, 1, 3, 8], %x: f32[40, 70]) {
  %at = t(%a)
  %g = mm(%a, %at)
  %bs = slice(%b, 2, 0, none, 2)
  %bt = transpose(%bs, 1, 2)
  %bb = bmm(%bt, %b)
  %bc = matmul(%d, %b)
  %m = amax(%x, [1])
  return (%g, %bb, %bc, %m)
}";
    let g = parse(src).unwrap();
    let gpu = std::sync::Arc::new(kiln::engine::Gpu::new().unwrap());
    for (options, launches, packed) in [
        (kiln::engine::CompileOptions::default(), 1, false),
        (gpu.compile_options(), 1, true),
    ] {
        let p = launched(&g, &options).unwrap();
        let labels: Vec<&str> = p.kernels.iter().map(|k| k.code.label.as_str()).collect();
        assert_eq!(labels.len(), launches, "{labels:?}");
        assert_eq!(p.kernels[0].code.wgsl.contains("if (part_wg < "), packed);
        assert!(
            labels[0].starts_with("mm#mm | bmm#bmm | matmul#matmul"),
            "{labels:?}"
        );
        assert_eq!(launches_apart(&g, &options), 4);
        let mut e = Engine::on(kiln::engine::Session::with_options(gpu.clone(), options));
        for seed in 0..3 {
            let ins = kiln::functionalize::random::random_inputs(&g, seed, 1.0);
            let want = kiln::run(&g, ins.clone()).unwrap();
            let got = e.run(&g, ins).unwrap();
            for (a, b) in got.outputs.iter().zip(&want.outputs) {
                close_gpu("output", a, b, 1e-5).unwrap();
            }
        }
    }
}

/// A kernel of larger workgroups that needs none of its invocations'
/// others (no workgroup memory, barrier or subgroup) spreads each over
/// several of a launch's smaller ones, beside reductions of 64 lanes
/// sharing workgroup memory (`reductions`: the twelve reductions and
/// softmaxes of one tensor in one launch on the GPU variant).
#[test]
fn wider_kernels_spread_over_a_launchs_workgroups() {
    let src = std::fs::read_to_string(root().join("examples/programs/reductions.txt")).unwrap();
    let g = parse(&src).unwrap();
    let gpu = std::sync::Arc::new(kiln::engine::Gpu::new().unwrap());
    let options = common::gpu_variant_options(&gpu);
    let p = launched(&g, &options).unwrap();
    assert_eq!(p.kernels.len(), 1, "{}", p.stats());
    let wgsl = &p.kernels[0].code.wgsl;
    assert!(wgsl.contains("let part_lid = "), "{wgsl}");
    assert!(wgsl.contains("@workgroup_size(64, 1, 1)"), "{wgsl}");
    let mut e = Engine::on(kiln::engine::Session::with_options(gpu, options.clone()));
    for seed in 0..3 {
        let ins = kiln::functionalize::random::random_inputs(&g, seed, 1.0);
        let want = kiln::run(&g, ins.clone()).unwrap();
        close_run("reductions", &e.run(&g, ins).unwrap(), &want, 1e-5).unwrap();
    }
    // Many workgroups of the wider kernel: a column max of 3072 columns
    // (a column an invocation; its result a whole number of binding
    // windows, so the sums' results, bound with it, take no more memory
    // than apart) beside sums of 100-wide rows.
    let src = "graph f(%x: f32[4, 3072], %y: f32[8, 100]) {
  %m = amax(%x, [0])
  %s = sum(%y, [1])
  return (%m, %s)
}";
    let g = parse(src).unwrap();
    let p = launched(&g, &options).unwrap();
    assert_eq!(p.kernels.len(), 1, "{}", p.stats());
    assert!(p.kernels[0].code.wgsl.contains("let part_lid = "));
    for seed in 0..3 {
        let ins = kiln::functionalize::random::random_inputs(&g, seed, 1.0);
        let want = kiln::run(&g, ins.clone()).unwrap();
        close_run(src, &e.run(&g, ins).unwrap(), &want, 1e-5).unwrap();
    }
}

/// An elementwise kernel shares a launch with one kernel of another kind
/// it is independent of (`u32_buffers`: an in-place row update of one
/// parameter beside a lookup into a copy of another), on both variants.
#[test]
fn elementwise_kernels_join_a_launch_of_another_kind() {
    let src = std::fs::read_to_string(root().join("examples/programs/u32_buffers.txt")).unwrap();
    let g = parse(&src).unwrap();
    let gpu = std::sync::Arc::new(kiln::engine::Gpu::new().unwrap());
    for options in [gpu.compile_options(), common::gpu_variant_options(&gpu)] {
        let p = launched(&g, &options).unwrap();
        let labels: Vec<&str> = p.kernels.iter().map(|k| k.code.label.as_str()).collect();
        assert!(
            labels
                .iter()
                .any(|l| l.contains("select_scatter") && l.contains(" | index_select")),
            "{labels:?}"
        );
        assert_eq!(launches_apart(&g, &options), 3);
        let mut e = Engine::on(kiln::engine::Session::with_options(gpu.clone(), options));
        for seed in 0..3u64 {
            // Fresh tensors for each run: the program updates `%v` in
            // place, and clones share storage.
            let ins = || {
                let vals = |n: usize, k: u64| -> Vec<f64> {
                    (0..n as u64)
                        .map(|i| ((i * 7 + seed * 3 + k) % 6) as f64)
                        .collect()
                };
                vec![
                    RTensor::new(DType::U32, vec![6], &vals(6, 100)),
                    RTensor::new(DType::U32, vec![2, 3], &vals(6, 200)),
                    RTensor::new(DType::I32, vec![4], &vals(4, 1)),
                ]
            };
            let want = kiln::run(&g, ins()).unwrap();
            close_run("u32_buffers", &e.run(&g, ins()).unwrap(), &want, 0.0).unwrap();
        }
    }
}

/// The kernels' parts (`a | b` in a label: kernels sharing a launch) of
/// the launches whose WGSL satisfies `has`.
fn parts_where(p: &kiln::engine::Program, has: impl Fn(&str) -> bool) -> usize {
    p.kernels
        .iter()
        .filter(|k| has(&k.code.wgsl))
        .map(|k| k.code.label.split(" | ").count())
        .sum()
}

/// Launches of `g` compiled with `options` but no launch shared.
fn launches_apart(g: &kiln::functionalize::Graph, options: &kiln::engine::CompileOptions) -> usize {
    let apart = kiln::engine::CompileOptions {
        share_launches: false,
        ..options.clone()
    };
    launched(g, &apart).unwrap().kernels.len()
}

/// Products of at most 16 rows on GPUs (`skinny_product`: K split over
/// 32 lanes per column, partial sums through workgroup memory) in every
/// operand form: vec4 loads of both (`linear` at 1 and 16 rows), of A
/// alone (B along its columns, batched), neither (K = 37; a transposed A;
/// an inline producer), integers.
#[test]
fn skinny_products_in_every_operand_form() {
    let src = "graph f(%x1: f32[1, 384], %w: f32[96, 384], %b: f32[96], %x16: f32[16, 384], %x5: f32[5, 37], %w37: f32[20, 37], %a: f32[3, 12, 40], %bb: f32[40, 24], %xt: f32[40, 7], %i: i32[4, 6], %j: i32[6, 5], %v: f32[2, 3, 1, 64]) {
  %y1 = linear(%x1, %w, %b)
  %y16 = linear(%x16, %w, %b)
  %y5 = linear(%x5, %w37)
  %z = matmul(%a, %bb)
  %t = t(%xt)
  %zt = mm(%t, %bb)
  %e = exp(%x16)
  %ye = linear(%e, %w)
  %ii = mm(%i, %j)
  %vt = transpose(%v, -2, -1)
  %o = matmul(%v, %vt)
  return (%y1, %y16, %y5, %z, %zt, %ye, %ii, %o)
}";
    let g = parse(src).unwrap();
    let gpu = std::sync::Arc::new(kiln::engine::Gpu::new().unwrap());
    let mut options = gpu.compile_options();
    options.tile_min_rows = 0;
    options.contiguous_operands = false;
    // Each product its own launch but for siblings (one left operand),
    // counted by their parts.
    options.share_launches = false;
    let p = launched(&g, &options).unwrap();
    let skinny = parts_where(&p, |w| w.contains("var<workgroup> red"));
    assert_eq!(skinny, 8, "{}", p.stats());
    let mut e = Engine::on(kiln::engine::Session::with_options(gpu, options));
    let ins = kiln::functionalize::random::random_inputs(&g, 7, 1.0);
    let want = kiln::run(&g, ins.clone()).unwrap();
    let got = e.run(&g, ins).unwrap();
    for (k, (a, b)) in got.outputs.iter().zip(&want.outputs).enumerate() {
        close_gpu(&format!("output {k}"), a, b, 1e-5).unwrap();
    }
}

/// Float sums and means over trailing dims on GPUs: a row per 1-64
/// invocations (`sum_rows`), with and without subgroup shuffles, at
/// awkward widths, keepdim or not, an inline producer, an f16 input, and
/// a fused elementwise tail; other reductions keep a row per invocation.
#[test]
fn sums_over_trailing_dims_in_row_kernels() {
    let gpu = std::sync::Arc::new(kiln::engine::Gpu::new().unwrap());
    let mut options = gpu.compile_options();
    options.workgroup_rows = true;
    options.tile_min_rows = 0;
    for sg in [options.subgroup, None] {
        let options = kiln::engine::CompileOptions {
            subgroup: sg,
            ..options.clone()
        };
        for w in [1usize, 3, 17, 64, 65, 512, 1000] {
            let src = format!(
                "graph f(%x: f32[6, {w}], %h: f16[2, 3, {w}], %y: f32[4, 5, {w}]) {{
  %p = pow(%x, 2)
  %m = mean(%p, [-1], true)
  %s = sum(%x, [1])
  %r = rsqrt(%m)
  %hs = sum(%h, [-1])
  %a = sum(%y, [1, 2])
  %c = sum(%y, [1])
  return (%m, %s, %r, %hs, %a, %c)
}}"
            );
            let g = parse(&src).unwrap();
            let counted = kiln::engine::CompileOptions {
                share_launches: false,
                chain_rows: false,
                ..options.clone()
            };
            let p = launched(&g, &counted).unwrap();
            let rows = p
                .kernels
                .iter()
                .filter(|k| k.code.wgsl.contains("var<workgroup> red"))
                .count();
            // m (with r's rsqrt fused), s, hs, and a where its 5w fit the
            // registers' 1024; c sums a middle dim.
            let want_rows = if 5 * w <= 1024 { 4 } else { 3 };
            assert!(rows >= want_rows, "width {w}: {}", p.stats());
            let mut e = Engine::on(kiln::engine::Session::with_options(
                gpu.clone(),
                options.clone(),
            ));
            let ins = kiln::functionalize::random::random_inputs(&g, 3, 1.0);
            let want = kiln::run(&g, ins.clone()).unwrap();
            let got = e.run(&g, ins).unwrap();
            for (k, (a, b)) in got.outputs.iter().zip(&want.outputs).enumerate() {
                close_gpu(&format!("width {w}, output {k}"), a, b, 1e-5).unwrap();
            }
        }
    }
}

/// Softmax, log_softmax and layer norm along contiguous rows at awkward
/// widths: a row per 1 to 64 invocations reducing through workgroup
/// memory (in registers up to 1024 wide, in passes past that), the same
/// combining lanes by subgroup shuffles first (the adapter has them:
/// lavapipe does), and the CPU adapters' row per invocation.
#[test]
fn row_kernels_at_awkward_widths() {
    let gpu = std::sync::Arc::new(kiln::engine::Gpu::new().unwrap());
    let mut options = gpu.compile_options();
    options.workgroup_rows = true;
    let sg = options.subgroup;
    assert!(sg.is_some(), "the adapter has no subgroup operations");
    let mut shuffled = Engine::on(kiln::engine::Session::with_options(
        gpu.clone(),
        options.clone(),
    ));
    options.subgroup = None;
    let mut e = Engine::on(kiln::engine::Session::with_options(
        gpu.clone(),
        options.clone(),
    ));
    let mut looped = Engine::on(kiln::engine::Session::new(gpu));
    for w in [1usize, 3, 17, 64, 65, 384, 783, 1024, 1025, 5000] {
        let src = format!(
            "graph f(%x: f32[5, {w}], %g: f32[{w}], %b: f32[{w}]) {{
  %s = softmax(%x, 1)
  %l = log_softmax(%x, -1)
  %y = add(%x, 1.0)
  %n = layer_norm(%y, [{w}], %g, %b, 1e-05)
  return (%s, %l, %n)
}}"
        );
        let g = parse(&src).unwrap();
        // Counted with a launch each (the engines below share launches).
        let p = launched(&g, &apart()).unwrap();
        let rows = p
            .kernels
            .iter()
            .filter(|k| k.code.wgsl.contains("red["))
            .count();
        assert_eq!(rows, 3, "width {w}");
        let with_sg = launched(
            &g,
            &kiln::engine::CompileOptions {
                subgroup: sg,
                share_launches: false,
                ..options.clone()
            },
        )
        .unwrap();
        let shuffles = with_sg
            .kernels
            .iter()
            .filter(|k| k.code.wgsl.contains("subgroupShuffleXor("))
            .count();
        assert_eq!(shuffles, if w > 1 { 3 } else { 0 }, "width {w}");
        let ins = kiln::functionalize::random::random_inputs(&g, w as u64, 2.0);
        let want = kiln::run(&g, ins.clone()).unwrap();
        for e in [&mut e, &mut shuffled, &mut looped] {
            let got = e.run(&g, ins.clone()).unwrap();
            for (a, b) in got.outputs.iter().zip(&want.outputs) {
                close_gpu(&format!("width {w}"), a, b, 1e-5).unwrap();
            }
        }
    }
}

/// Zero-size dimensions: valid kernels (no `% 0u`), and the results eager
/// gives (sums of nothing are 0, products over K = 0 are zeros).
#[test]
fn zero_size_dimensions_run() {
    let src = "graph z(%x: f32[3, 0], %y: f32[0, 4]) {
  %s = sum(%x, [1])
  %p = mm(%x, %y)
  %q = linear(%y, %y)
  %t = softmax(%x, 1)
  return (%s, %p, %q, %t)
}";
    valid_and_as_the_reference(src, "zero-size");
}

/// Maps of the same shape that read elsewhere (a zero `constant_pad_nd`, a
/// `flip`) after a row kernel or a product are not its epilogue (Swin's
/// window shift once failed to compile: "layer_norm cannot be computed
/// inline").
#[test]
fn remaps_after_kernels_are_not_epilogues() {
    let src = "graph f(%x: f32[1, 8, 8, 8], %w: f32[8], %b: f32[8], %m: f32[8, 8]) {
  %l = layer_norm(%x, [8], %w, %b)
  %p = constant_pad_nd(%l, [0, 0, 0, 0, 0, 0], 0.0)
  %a = narrow(%p, 1, 2, 6)
  %c = narrow(%p, 1, 0, 2)
  %k = cat([%a, %c], 1)
  %q = matmul(%x, %m)
  %f = flip(%q, [3])
  %g = add(%f, 1)
  %h = mul(%f, 2)
  return (%k, %g, %h)
}";
    valid_and_as_the_reference(src, "remap after a kernel");
}

/// Every kernel of `src` passes naga, and its outputs on random inputs are
/// the reference's.
fn valid_and_as_the_reference(src: &str, what: &str) {
    let g = parse(src).unwrap();
    for k in &launched(&g, &Default::default()).unwrap().kernels {
        kiln::engine::wgsl::validate(&k.code.wgsl).unwrap();
    }
    let ins = kiln::functionalize::random::random_inputs(&g, 1, 1.0);
    let want = kiln::run(&g, ins.clone()).unwrap();
    let got = engine().run(&g, ins).unwrap();
    for (a, b) in got.outputs.iter().zip(&want.outputs) {
        close_gpu(what, a, b, 0.0).unwrap();
    }
}

/// f32 to f16 rounds to nearest, ties to even, on every path (a word per
/// element, packed pairs, a round trip inside a kernel), exactly as the
/// reference: ties, the largest finite f16 and what overflows, subnormals
/// and their ties. WGSL leaves `pack2x16float`'s rounding to the driver
/// (on the H200 it rounded the other way).
#[test]
fn f16_conversions_round_to_nearest_even() {
    let p = |e: i32| 2f64.powi(e);
    let vals = [
        1.0 + p(-11),
        1.0 + 3.0 * p(-11),
        1.0 + p(-11) + p(-23),
        -(1.0 + p(-11)),
        65504.0,
        65519.0,
        65520.0,
        -70000.0,
        1e-8,
        p(-25),
        3.0 * p(-25),
        1.5 * p(-24),
        2.5 * p(-24),
        p(-14) - p(-26),
        p(-14) - p(-25),
        -0.0,
        0.1,
        2.71831,
        -1234.567,
        6.0e-5,
    ];
    let n = vals.len();
    let x = common::t(DType::F32, &[n], &vals);
    let src = format!(
        "graph f(%x: f32[{n}]) {{
  %h = _to_copy(%x, f16)
  %y = _to_copy(%h, f32)
  %v = mul(%x, 1)
  %k = _to_copy(%v, f16)
  return (%h, %y, %k)
}}"
    );
    let g = parse(&src).unwrap();
    let want = kiln::run(&g, vec![x.clone()]).unwrap();
    // lavapipe has `shader-f16`: the first two run its f16 instructions.
    let native = engine();
    assert!(
        native.session.gpu().native_f16(),
        "this adapter ({}) has no shader-f16: the native conversions go untested",
        native.session.gpu().describe()
    );
    let soft = soft_f16(engine());
    for (what, mut e, f16) in [
        ("this adapter", native, true),
        ("GPU variants", gpu_variants(), true),
        ("integer conversions", soft, false),
    ] {
        let exe = e.session.compile(&g).unwrap();
        assert_eq!(
            exe.program
                .kernels
                .iter()
                .any(|k| k.code.wgsl_f16.is_some()),
            f16,
            "{what}: native f16 variants"
        );
        let got = e.run(&g, vec![x.clone()]).unwrap();
        for (i, (a, b)) in got.outputs.iter().zip(&want.outputs).enumerate() {
            common::same_type(what, a, b).unwrap();
            for (j, (u, v)) in a.values().iter().zip(b.values()).enumerate() {
                assert!(
                    u == &v || (u.is_nan() && v.is_nan()),
                    "{what}: output {i}[{j}] ({}) is {u}, the reference {v}",
                    vals[j]
                );
            }
        }
    }
}

/// Negative fill values meet prefix operators (`neg` of `-1i` once made
/// `--1i`, which WGSL refuses): fills and factories of every kind.
#[test]
fn negative_fills_under_prefix_operators() {
    let src = "graph f(%x: i32[4], %m: bool[4], %z: f32[4]) {
  %a = full([4], -1, i32)
  %b = neg(%a)
  %c = fill(%x, -2)
  %d = neg(%c)
  %e = masked_fill(%x, %m, -3)
  %f = neg(%e)
  %g = full_like(%z, -1.5)
  %h = neg(%g)
  %i = add(%x, %b)
  return (%i, %d, %f, %h)
}";
    valid_and_as_the_reference(src, "negative fills");
}

/// Region updates of a fresh copy, fused into one kernel, match the
/// reference (and on a parameter, in place).
#[test]
fn fused_region_updates_match_the_reference() {
    let mut e = engine();
    for base in [
        "%c = clone(%x)",
        "%c = alias(%x)",
        "%d = exp(%x)\n  %c = alias(%d)",
    ] {
        let src = format!(
            "graph blocks(%x: f32[40, 24]) {{
  {base}
  %s0 = slice(%c, 0, 0, 10)
  %a0 = add_(%s0, 1)
  %s1 = slice(%c, 1, 4, 20, 3)
  %a1 = mul_(%s1, %s1)
  %s2 = select(%c, 0, 33)
  %a2 = sub_(%s2, 0.5)
  return %c
}}"
        );
        let g = parse(&src).unwrap();
        // Fresh inputs for each run: the reference writes %x in place.
        let ins = || kiln::functionalize::random::random_inputs(&g, 9, 1.0);
        let want = kiln::run(&g, ins()).unwrap();
        let got = e.run(&g, ins()).unwrap();
        close_run(base, &got, &want, 1e-6).unwrap();
    }
    // Updates reading other rows of the copy, through views of views and
    // a transpose of the region they write, and one read half-way (an
    // output of its own): every link recomputed by the kernels reading it.
    for base in ["%c = clone(%x)", "%d = exp(%x)\n  %c = alias(%d)"] {
        let src = format!(
            "graph rows(%x: f32[40, 24], %v: f32[24]) {{
  {base}
  %r0 = select(%c, 0, 0)
  %r2 = select(%c, 0, 2)
  %k = copy_(%r2, %r0)
  %mid = mul(%c, 2.0)
  %q = slice(%c, 0, 4, 28)
  %q2 = slice(%q, 1, 0, 24)
  %t = t(%q2)
  %tc = clone(%t)
  %w = copy_(%q2, %tc)
  %r1 = select(%c, 0, 1)
  %n = narrow(%r1, 0, 3, 5)
  %r2n = narrow(%r2, 0, 10, 5)
  %e = copy_(%n, %r2n)
  %l = select(%c, 0, -1)
  %f = add_(%l, %v)
  return (%c, %mid)
}}"
        );
        let g = parse(&src).unwrap();
        let ins = || kiln::functionalize::random::random_inputs(&g, 11, 1.0);
        let want = kiln::run(&g, ins()).unwrap();
        let got = e.run(&g, ins()).unwrap();
        close_run(base, &got, &want, 1e-6).unwrap();
    }
}

/// Outputs taken on the host as views of buffers a run reads back anyway
/// (no kernel, no arena): through a chain of view copies whose links other
/// kernels read inline, and the region an in-place scatter wrote (a row
/// updated in place and returned with its tensor). A buffer such a view is
/// taken from is not then written in place by a later scatter.
#[test]
fn outputs_viewed_from_read_back_buffers() {
    let mut e = engine();
    for (src, views) in [
        (
            "graph row(%x: f32[2, 3], %y: f32[3]) {
  %r = select(%x, 0, 1)
  %a = add_(%r, %y)
  return (%x, %r)
}",
            1,
        ),
        (
            "graph chain(%x: f32[3, 4], %w: f32[3, 5]) {
  %m = exp(%x)
  %t = t(%m)
  %u = unsqueeze(%t, 0)
  %e = expand(%u, [2, 4, 3])
  %y = mm(%t, %w)
  return (%m, %e, %y)
}",
            1,
        ),
        (
            // %t is taken from %b's buffer: the row's update is a kernel
            // writing a new buffer, not %b's.
            "graph kept(%x: f32[3, 4], %w: f32[4, 4]) {
  %b = mm(%x, %w)
  %t = transpose_copy(%b, 0, 1)
  %s = select(%b, 0, 0)
  %z = zero_(%s)
  return (%t, %b)
}",
            1,
        ),
        (
            // %s is updated inside %t, stored only as its transpose %b:
            // one kernel computes %b, %s is taken from its buffer.
            "graph permuted(%x: f32[2, 3, 4], %y: f32[2, 2]) {
  %b = mul(%x, 1.5)
  %t = transpose(%b, 0, 2)
  %s = slice(%t, 1, 1, none)
  %n = neg_(%s)
  %k = sub_(%s, %y)
  return (%b, %s)
}",
            1,
        ),
    ] {
        let g = parse(src).unwrap();
        let p = launched(&g, &e.gpu().compile_options()).unwrap();
        assert_eq!(p.host_views.len(), views, "{src}");
        let ins = || kiln::functionalize::random::random_inputs(&g, 3, 1.0);
        let want = kiln::run(&g, ins()).unwrap();
        let got = e.run(&g, ins()).unwrap();
        close_run(src, &got, &want, 1e-5).unwrap();
    }
}

/// A value several readers take, evaluated at most a few times per element
/// of it or of what its readers store were it recomputed by every reader,
/// is not stored: the passes of a bilinear or trilinear resize (each reads
/// the one before at two rows) are one kernel, on both variants, and match
/// the reference; so is a value broadcast over rows (one evaluation per
/// element its readers write). One a reduction reads is stored and
/// computed once.
#[test]
fn cheap_values_are_recomputed_by_their_readers() {
    let mut e = engine();
    for (src, kernels, exps) in [
        (
            "graph up(%x: f32[1, 3, 8, 10]) {
  %b = upsample_bilinear2d(%x, [13, 17], false)
  return %b
}",
            Some(1),
            0,
        ),
        (
            "graph up3(%v: f32[1, 2, 3, 4, 3]) {
  %t = upsample_trilinear3d(%v, [6, 5, 4], true)
  return %t
}",
            Some(1),
            0,
        ),
        (
            "graph wide(%x: f32[8], %y: f32[64, 8]) {
  %h = exp(%x)
  %a = add(%h, %y)
  %b = mul(%h, 2)
  return (%a, %b)
}",
            None,
            2,
        ),
        (
            "graph summed(%x: f32[8], %y: f32[64, 8]) {
  %h = exp(%x)
  %a = add(%h, %y)
  %s = sum(%h, [0])
  return (%a, %s)
}",
            None,
            1,
        ),
    ] {
        let g = parse(src).unwrap();
        for options in [
            kiln::engine::CompileOptions::default(),
            e.gpu().compile_options(),
        ] {
            let p = launched(&g, &options).unwrap();
            if let Some(k) = kernels {
                assert_eq!(p.kernels.len(), k, "{src}\n{}", p.stats());
            }
            // Kernels sharing a launch are one shader, a part each
            // (`codegen/siblings.rs` names its workgroup at the top of each).
            let computing_exp: usize = p
                .kernels
                .iter()
                .map(|k| {
                    k.code
                        .wgsl
                        .split("let part_wg = ")
                        .filter(|part| part.contains(": f32 = exp("))
                        .count()
                })
                .sum();
            assert_eq!(computing_exp, exps, "{src}\n{}", p.stats());
        }
        let ins = kiln::functionalize::random::random_inputs(&g, 5, 1.0);
        let want = kiln::run(&g, ins.clone()).unwrap();
        let got = e.run(&g, ins).unwrap();
        close_run(src, &got, &want, 1e-5).unwrap();
    }
}

/// An index that a map and an `index_add` both read is recomputed in the
/// `index_add`'s loop over it (it loads an element of it an iteration,
/// stored or not): the two kernels are then independent and share a
/// launch reading `pos` and `x` once (`decoder_ops`).
#[test]
fn looped_index_operands_are_recomputed_by_their_readers() {
    let src = "graph f(%x: f32[4, 6], %pos: i32[6]) {
  %half = floor_divide(%pos, 2)
  %big = gt(%half, 2)
  %ha = index_add(%x, 1, %half, %x, 0.5)
  return (%big, %ha)
}";
    let g = parse(src).unwrap();
    let gpu = std::sync::Arc::new(kiln::engine::Gpu::new().unwrap());
    for options in [
        kiln::engine::CompileOptions::default(),
        gpu.compile_options(),
    ] {
        let p = launched(&g, &options).unwrap();
        assert_eq!(p.kernels.len(), 1, "{}", p.stats());
        assert_eq!(launches_apart(&g, &options), 2);
        assert_eq!(p.bytes_moved(), p.min_bytes, "{}", p.stats());
        let mut e = Engine::on(kiln::engine::Session::with_options(gpu.clone(), options));
        for pos in [[0, 11, 3, 4, 7, 2], [5, 5, 0, 1, 10, 9]] {
            let pos: Vec<f64> = pos.iter().map(|&p| p as f64).collect();
            let ins = vec![
                kiln::functionalize::random::random_inputs(&g, 3, 1.0).remove(0),
                RTensor::new(DType::I32, vec![6], &pos),
            ];
            let want = kiln::run(&g, ins.clone()).unwrap();
            close_run(src, &e.run(&g, ins).unwrap(), &want, 1e-5).unwrap();
        }
    }
}

/// A dying input takes an output of the kernel that reads it last even
/// where other members of that kernel read it too, each at its own
/// element: the output is stored after every member has loaded it (`a`
/// and `b` take the buffers of `x` and `y`, which `gt` and `where` read).
#[test]
fn dying_inputs_take_outputs_their_kernel_reads_at_each_element() {
    let src = "graph members(%x: f32[6, 5], %y: f32[6, 5]) {
  %a = add(%x, %y)
  %b = mul(%x, %y)
  %c = gt(%x, 0.0)
  %d = where(%c, %x, %y)
  return (%a, %b, %c, %d)
}";
    let g = parse(src).unwrap();
    let mut e = engine();
    for options in [
        kiln::engine::CompileOptions::default(),
        e.gpu().compile_options(),
    ] {
        let p = launched(&g, &options).unwrap();
        assert_eq!(p.kernels.len(), 1, "{}", p.stats());
        // io: x and y (240 B); arena: `where`'s 120 B and the bools' 32.
        assert_eq!(p.memory.planned_peak(), 392, "{}", p.stats());
    }
    let ins = kiln::functionalize::random::random_inputs(&g, 3, 1.0);
    let want = kiln::run(&g, ins.clone()).unwrap();
    let got = e.run(&g, ins).unwrap();
    close_run(src, &got, &want, 0.0).unwrap();
}

/// A parameter updated through its transpose (`p.t().index_put_(...)`,
/// then read again through the transpose): the update is stored in the
/// parameter's own layout, over its buffer, and the later read goes
/// through the inverse transpose; no buffer beside the parameter. The
/// parameter and the outputs as the reference computes them.
#[test]
fn updates_through_a_transpose_write_the_parameter_in_place() {
    let src = "graph f(%p: f32[6, 4], %cols: i32[3], %blk: f32[4, 3], %q: f32[5, 3, 2]) {
  %tt = t(%p)
  %b = index_put_(%tt, [none, %cols], %blk)
  %sel = index_select(%tt, 1, %cols)
  %qp = permute(%q, [2, 0, 1])
  %m = mul_(%qp, 2.0)
  %s = sum(%qp, [0])
  return (%sel, %s)
}";
    let g = parse(src).unwrap();
    let mut e = engine();
    for options in [
        kiln::engine::CompileOptions::default(),
        e.gpu().compile_options(),
    ] {
        let p = launched(&g, &options).unwrap();
        assert!(
            p.memory.planned_peak() <= p.memory.eager_peak,
            "{}",
            p.stats()
        );
    }
    let mut ins = kiln::functionalize::random::random_inputs(&g, 7, 1.0);
    ins[1] = RTensor::from_values(
        kiln::functionalize::Meta::contiguous(DType::I32, vec![3]),
        &[4.0, 0.0, 2.0],
    );
    // The reference mutates its inputs' storage (`q` here), which clones
    // share: the GPU run gets copies.
    let copies: Vec<RTensor> = ins
        .iter()
        .map(|t| RTensor::new(t.dtype(), t.sizes().to_vec(), &t.values()))
        .collect();
    let want = kiln::run(&g, ins).unwrap();
    let got = e.run(&g, copies).unwrap();
    close_run(src, &got, &want, 0.0).unwrap();
}

/// Products, row kernels and reductions store f16 and bool results packed:
/// at odd row lengths each invocation sets its lane of a word neighbours
/// also write (a row's last element and the next row's first), at even
/// ones (`%d`, `%e`) an invocation storing whole rows or blocks gathers a
/// word's lanes and stores it once (`%d` reads its own left operand: a
/// sibling of `%c` would share its launch, and store lanes). The same elements as the reference
/// on every variant.
#[test]
fn packed_results_of_products_rows_and_reductions() {
    let src = "graph packed(%a: f16[33, 64], %b: f16[64, 31], %x: f32[33, 7], %w: f16[64, 32], %a2: f16[33, 64]) {
  %c = mm(%a, %b)
  %s = softmax(%c, -1)
  %n = layer_norm(%c, [31])
  %m = gt(%x, 0.0)
  %any = amax(%m, [1])
  %h = sum(%s, [1])
  %d = mm(%a2, %w)
  %e = softmax(%d, -1)
  %f = layer_norm(%d, [32])
  return (%c, %s, %n, %any, %h, %e, %f)
}";
    let g = parse(src).unwrap();
    let gpu = std::sync::Arc::new(kiln::engine::Gpu::new().unwrap());
    let mut rows = gpu.compile_options();
    rows.workgroup_rows = true;
    let ins = kiln::functionalize::random::random_inputs(&g, 5, 1.0);
    let want = kiln::run(&g, ins.clone()).unwrap();
    for mut options in [
        kiln::engine::CompileOptions::default(),
        gpu.compile_options(),
        rows,
    ] {
        // A launch each: shared launches (softmax and norm of `%d` as
        // siblings, where the plan stays within eager's peak) would take
        // `%d`'s row kernel apart, and these stores with it.
        options.share_launches = false;
        let p = launched(&g, &options).unwrap();
        let atomic = p
            .kernels
            .iter()
            .filter(|k| k.code.wgsl.contains("atomic<u32>"))
            .count();
        assert!(atomic >= 3, "{}", p.stats());
        // `%d` is stored whole words at a time: by the CPU adapter's 4x4
        // blocks, or on GPUs by the row kernel of its product, softmax
        // and norm.
        let whole = p
            .kernels
            .iter()
            .any(|k| k.code.wgsl.contains("var pk: u32"));
        assert!(whole, "{}", p.stats());
        let mut e = Engine::on(kiln::engine::Session::with_options(gpu.clone(), options));
        let got = e.run(&g, ins.clone()).unwrap();
        close_run(src, &got, &want, 2e-3).unwrap();
    }
}

/// `index_copy_` and `scatter_` into parameters that die there (a KV
/// cache) write only their source's elements, in place,
/// duplicates resolved as the reference does (the last along `dim` wins);
/// out-of-range positions are a run error, not a silent write.
#[test]
fn index_copies_and_scatters_write_in_place() {
    let src = "graph kv(%cache: f32[2, 16, 8], %pos: i64[3], %k: f32[2, 3, 8], %idx: i64[3, 8], %vals: f32[3, 8], %x: f32[5, 8]) {
  %c = index_copy_(%cache, 1, %pos, %k)
  %s = scatter_(%x, 0, %idx, %vals)
  %t = mul(%cache, 2)
  return (%t, %x)
}";
    let g = parse(src).unwrap();
    let mut e = engine();
    for options in [
        kiln::engine::CompileOptions::default(),
        e.gpu().compile_options(),
    ] {
        let p = launched(&g, &options).unwrap();
        // Kernels sharing a launch are one, with their labels joined.
        let in_place: Vec<_> = p
            .kernels
            .iter()
            .filter(|k| k.code.label.contains("(in place)"))
            .collect();
        let count: usize = in_place
            .iter()
            .map(|k| k.code.label.matches("(in place)").count())
            .sum();
        assert_eq!(count, 2, "{}", p.stats());
        // The cache's 3 new rows of 2 x 8, and the 24 scattered values.
        let written: usize = in_place.iter().map(|k| k.bytes_written).sum();
        assert_eq!(written, (2 * 3 * 8 + 24) * 4, "{}", p.stats());
    }
    let mut ins = kiln::functionalize::random::random_inputs(&g, 11, 1.0);
    // Position 5 twice: the later row wins.
    ins[1] = RTensor::new(DType::I64, vec![3], &[5.0, 0.0, 5.0]);
    let idx: Vec<f64> = (0..24).map(|i| ((i * 7) % 5) as f64).collect();
    ins[3] = RTensor::new(DType::I64, vec![3, 8], &idx);
    let want = kiln::run(&g, ins.clone()).unwrap();
    let got = e.run(&g, ins.clone()).unwrap();
    close_run("in-place scatters", &got, &want, 1e-6).unwrap();
    ins[1] = RTensor::new(DType::I64, vec![3], &[5.0, 16.0, 1.0]);
    let Err(err) = e.run(&g, ins) else {
        panic!("an index past the cache ran");
    };
    let err = err.to_string();
    assert!(err.contains("index_copy"), "{err}");
}

/// `softmax(Q K^T * scale + mask) V` compiles to one attention kernel (no
/// score tensor in memory) and matches the reference at awkward sizes:
/// one query, fewer keys than a tile, keys past a tile, head widths 1 to
/// 128, rows masked with -inf entirely (NaN, as eager gives, not
/// compared), a value operand broadcast over the batch; in the tiled
/// kernel (the GPU variants) and in the CPU adapters' row kernel
/// (`CompileOptions::attention_rows`: each lane of a subgroup loads a
/// share of the keys and values and broadcasts it).
#[test]
fn attention_is_one_kernel_at_awkward_sizes() {
    let gpu = std::sync::Arc::new(kiln::engine::Gpu::new().unwrap());
    let rows_options = kiln::engine::CompileOptions {
        fuse_attention: true,
        attention_rows: true,
        ..gpu.compile_options()
    };
    let rows_engine = Engine::on(kiln::engine::Session::with_options(gpu, rows_options));
    let mut engines = [engine(), gpu_variants(), rows_engine];
    for (b, h, sq, sk, d, dv) in [
        (1, 1, 1, 1, 1, 1),
        (2, 3, 3, 17, 5, 7),
        (1, 2, 17, 33, 64, 64),
        (2, 2, 70, 40, 128, 3),
    ] {
        let src = format!(
            "graph attn(%q: f32[{b}, {h}, {sq}, {d}], %k: f32[{b}, {h}, {sk}, {d}], %v: f32[{b}, {h}, {sk}, {dv}], %m: bool[{b}, 1, {sq}, {sk}], %w: f32[{sk}, {dv}]) {{
  %kt = transpose(%k, -1, -2)
  %s = matmul(%q, %kt)
  %t = mul(%s, 0.125)
  %u = masked_fill(%t, %m, -inf)
  %p = softmax(%u, -1)
  %o = matmul(%p, %v)
  %s2 = matmul(%q, %kt)
  %p2 = softmax(%s2, 3)
  %o2 = matmul(%p2, %w)
  %r = add(%o2, 1.0)
  return (%o, %r)
}}"
        );
        let g = parse(&src).unwrap();
        let p = launched(&g, &Default::default()).unwrap();
        let labels: Vec<&str> = p.kernels.iter().map(|k| k.code.label.as_str()).collect();
        // The two attentions (independent) share one launch, the second
        // storing its tail (`add`) in place of its result.
        assert_eq!(labels, ["attention#matmul_1 | attention#add"]);
        // Nothing of [b, h, sq, sk] is written.
        let out = 4 * b * h * sq * dv;
        assert_eq!(p.kernels[0].bytes_written, 2 * out, "{labels:?}");
        // With subgroups, four invocations share a query row where both
        // head widths divide by four (both attention kernels here).
        let sg = kiln::engine::CompileOptions {
            subgroup: Some(8),
            ..Default::default()
        };
        let p = launched(&g, &sg).unwrap();
        let shared: usize = p
            .kernels
            .iter()
            .map(|k| k.code.wgsl.matches("subgroupShuffleXor(s, 2u)").count())
            .sum();
        assert_eq!(shared, if d % 4 == 0 && dv % 4 == 0 { 2 } else { 0 });
        // The row kernel: no workgroup memory, nothing of [b, h, sq, sk]
        // written either.
        let rows = kiln::engine::CompileOptions {
            subgroup: Some(8),
            attention_rows: true,
            workgroup: 64,
            ..Default::default()
        };
        let p = launched(&g, &rows).unwrap();
        let attention: Vec<_> = p
            .kernels
            .iter()
            .filter(|k| k.code.label.contains("attention"))
            .collect();
        let labels: Vec<&str> = p.kernels.iter().map(|k| k.code.label.as_str()).collect();
        assert_eq!(attention.len(), 1, "{labels:?}");
        let k = attention[0];
        assert!(
            k.code.wgsl.contains("subgroupBroadcast(") && !k.code.wgsl.contains("var<workgroup>")
        );
        assert!(k.code.subgroup);
        assert_eq!(k.bytes_written, 2 * out, "{labels:?}");
        let ins = kiln::functionalize::random::random_inputs(&g, (sq * sk) as u64, 2.0);
        let want = kiln::run(&g, ins.clone()).unwrap();
        for e in &mut engines {
            let got = e.run(&g, ins.clone()).unwrap();
            for (a, w) in got.outputs.iter().zip(&want.outputs) {
                close_gpu(&format!("attention {b}x{h}x{sq}x{sk}x{d}x{dv}"), a, w, 1e-5).unwrap();
            }
        }
    }
}

/// Engines for attention tests: the adapter's choices, the GPU-class
/// variants and the row kernel forced on (on any adapter).
fn attention_engines() -> [Engine; 3] {
    let gpu = std::sync::Arc::new(kiln::engine::Gpu::new().unwrap());
    let rows_options = kiln::engine::CompileOptions {
        fuse_attention: true,
        attention_rows: true,
        ..gpu.compile_options()
    };
    [
        engine(),
        gpu_variants(),
        Engine::on(kiln::engine::Session::with_options(gpu, rows_options)),
    ]
}

/// Attention's result stored through the head merge that follows it
/// (`transpose(o, 1, 2)` and a reshape before the output projection),
/// with an elementwise tail before the merge or none, for the decomposed
/// attention and `scaled_dot_product_attention`: one attention kernel
/// writing the merged rows, no copy kernel, the projection reading them
/// contiguous (on CPU adapters too, whose products stage permuted
/// operands otherwise); results as the reference on every variant.
#[test]
fn attention_stores_through_the_head_merge() {
    let mut engines = attention_engines();
    let attention = [
        "%kt = transpose(%k, -2, -1)
  %s = matmul(%q, %kt)
  %t = mul(%s, 0.125)
  %p = softmax(%t, -1)
  %o = matmul(%p, %v)",
        "%o = scaled_dot_product_attention(%q, %k, %v)",
    ];
    for (a, tail) in attention
        .iter()
        .flat_map(|a| [(a, "%o2 = mul(%o, 0.5)"), (a, "%o2 = clone(%o)")])
    {
        let src = format!(
            "graph f(%q: f32[2, 3, 9, 8], %k: f32[2, 3, 11, 8], %v: f32[2, 3, 11, 8], %w: f32[40, 24]) {{
  {a}
  {tail}
  %ot = transpose(%o2, 1, 2)
  %om = reshape(%ot, [2, 9, 24])
  %y = linear(%om, %w)
  return %y
}}"
        );
        let g = parse(&src).unwrap();
        // The merge stored (`attention_computes_its_projections` has the
        // projection in the kernel).
        let cpu = kiln::engine::CompileOptions {
            subgroup: Some(8),
            attention_rows: true,
            attention_projections: false,
            contiguous_operands: true,
            workgroup: 64,
            ..Default::default()
        };
        for options in [Default::default(), cpu] {
            let p = launched(&g, &options).unwrap();
            let labels: Vec<&str> = p
                .kernels
                .iter()
                .flat_map(|k| k.code.label.split(" | "))
                .collect();
            assert_eq!(labels.len(), 2, "{tail}: {labels:?}");
            assert!(labels[0].starts_with("attention#"), "{labels:?}");
            assert!(labels[1].starts_with("linear#"), "{labels:?}");
            // The merged rows, once: 2 x 9 x 24 f32.
            assert_eq!(p.kernels[0].bytes_written, 4 * 2 * 9 * 24, "{labels:?}");
        }
        let ins = kiln::functionalize::random::random_inputs(&g, 5, 1.0);
        let want = kiln::run(&g, ins.clone()).unwrap();
        for e in &mut engines {
            let got = e.run(&g, ins.clone()).unwrap();
            close_gpu(
                &format!("{a} {tail}"),
                &got.outputs[0],
                &want.outputs[0],
                1e-5,
            )
            .unwrap();
        }
    }
}

/// The attention kernel computes the query projection whose head split
/// its queries are, and the output projection of its head merge with
/// that projection's epilogue (bias, GELU): neither Q nor the merge
/// reaches memory, the kernel stores the block's output. With and
/// without biases, with heads over a batch and alone; a Q read elsewhere
/// too stays a kernel's result. CPU adapters' row kernel and GPUs' tiled
/// one (a workgroup owning every head of its rows), with subgroups and
/// without; results as the reference on every variant.
#[test]
fn attention_computes_its_projections() {
    let [a, b, c] = attention_engines();
    let gpu = b.session.gpu().clone();
    let tiled = common::gpu_variant_options(&gpu);
    let tiled_plain = kiln::engine::CompileOptions {
        subgroup: None,
        ..tiled.clone()
    };
    let mut engines = [
        a,
        b,
        c,
        Engine::on(kiln::engine::Session::with_options(
            gpu,
            tiled_plain.clone(),
        )),
    ];
    let cpu = kiln::engine::CompileOptions {
        subgroup: Some(8),
        attention_rows: true,
        contiguous_operands: true,
        workgroup: 64,
        ..Default::default()
    };
    // (program, linears the attention kernel computes, whether one is
    // the output projection, elements it writes); products too wide for row kernels (`fusion::narrow_product`),
    // attention past the budget of kernels in sequence and with workgroups
    // enough (`schedule::ATTENTION_MIN_WORKGROUPS`): the plan checked is
    // the one the adapter's engine runs.
    let merged = |x: &str, split: &str, merge: &str, bias: &str, ret: &str, ct: &str| {
        format!(
            "graph f(%x: f32[{x}], %wq: f32[96, 96], %wk: f32[96, 96], %wv: f32[96, 96], %wo: f32[80, 96], %bq: f32[96], %bo: f32[80], %mask: bool[40, 40]) {{
  %q = linear(%x, %wq{bias})
  %k = linear(%x, %wk)
  %v = linear(%x, %wv)
  %qh = view(%q, [{split}])
  %kh = view(%k, [{split}])
  %vh = view(%v, [{split}])
  %qt = transpose(%qh, -3, -2)
  %kt = permute(%kh, [{kperm}])
  %vt = transpose(%vh, -3, -2)
  %s = matmul(%qt, %kt)
  %s2 = mul(%s, 0.35)
  %m = masked_fill(%s2, %mask, -10000.0)
  %p = softmax(%m, -1)
  %c = matmul(%p, %vt)
  %ct = {ct}
  %cm = reshape(%ct, [{merge}])
  %o = linear(%cm, %wo{obias})
  %y = gelu(%o)
  return {ret}
}}",
            kperm = if split.split(',').count() == 4 { "0, 2, 3, 1" } else { "1, 2, 0" },
            obias = if bias.is_empty() { "" } else { ", %bo" },
        )
    };
    let block = |x: &str, split: &str, merge: &str, bias: &str, ret: &str| {
        merged(x, split, merge, bias, ret, "transpose(%c, -3, -2)")
    };
    let cases = [
        (
            block("4, 40, 96", "4, 40, 3, 32", "4, 40, 96", ", %bq", "%y"),
            2,
            true,
            4 * 40 * 80,
        ),
        (
            block("40, 96", "40, 3, 32", "40, 96", "", "%y"),
            2,
            true,
            40 * 80,
        ),
        // Q is an output too: computed by its own kernel.
        (
            block(
                "4, 40, 96",
                "4, 40, 3, 32",
                "4, 40, 96",
                ", %bq",
                "(%y, %q)",
            ),
            1,
            true,
            4 * 40 * 80,
        ),
        // Columns merged head-minor (`[b, i, e, h]`), not the head merge:
        // the output projection stays apart, the merge stored.
        (
            merged(
                "4, 40, 96",
                "4, 40, 3, 32",
                "4, 40, 96",
                ", %bq",
                "%y",
                "permute(%c, [0, 2, 3, 1])",
            ),
            1,
            false,
            4 * 40 * 96,
        ),
    ];
    for (src, linears, out_proj, written) in &cases {
        let g = parse(src).unwrap();
        for options in [&cpu, &tiled, &tiled_plain] {
            let p = kiln::engine::compile_with(&g, options).unwrap();
            let att: Vec<_> = p
                .kernels
                .iter()
                .filter(|k| k.code.label.contains("attention#"))
                .collect();
            assert_eq!(att.len(), 1, "{src}");
            let ops = &att[0].ops;
            assert_eq!(
                ops.iter().filter(|o| *o == "linear").count(),
                *linears,
                "{src}: {ops:?}"
            );
            assert_eq!(ops.iter().any(|o| o == "gelu"), *out_proj, "{ops:?}");
            assert_eq!(att[0].bytes_written, 4 * written, "{src}");
            // GPUs' kernel stages tiles (and the merge) in workgroup memory.
            assert_eq!(
                att[0].code.wgsl.contains("workgroupBarrier"),
                !options.attention_rows,
                "{src}"
            );
            // Besides, K and V's projections (one launch).
            if *linears == 2 {
                assert_eq!(p.kernels.len(), 2, "{src}");
            }
        }
        let ins = kiln::functionalize::random::random_inputs(&g, 7, 1.0);
        let want = kiln::run(&g, ins.clone()).unwrap();
        // lavapipe takes 12-20 s to compile the tiled kernel without
        // subgroups (a lane a row: its loops unrolled 4 times wider) with
        // a cold shader cache, as CI has: that variant runs the first
        // case alone.
        let variants = if std::ptr::eq(src, &cases[0].0) { 4 } else { 3 };
        for e in engines.iter_mut().take(variants) {
            let got = e.run(&g, ins.clone()).unwrap();
            for (i, w) in want.outputs.iter().enumerate() {
                close_gpu(src, &got.outputs[i], w, 1e-5).unwrap();
            }
        }
    }
}

/// A scores' tail too long to compute for every score (Swin's
/// shifted-window mask, built in the program from fills of slices of a
/// zero image, then split into windows): the mask goes to memory, a
/// kernel of its own computing each element once, and the attention is
/// still one kernel reading it (`schedule::store_score_operands`);
/// results as the reference's on every variant.
#[test]
fn attention_reads_a_long_built_mask_from_memory() {
    // Swin's image mask: a region number a band of rows by a band of
    // columns, each written through slices of the image.
    let bands = [(0, 4), (4, 6), (6, 8)];
    let mut fills = String::new();
    for (r, (r0, r1)) in bands.iter().enumerate() {
        fills += &format!("  %r{r} = slice(%img, 0, {r0}, {r1})\n");
        for (c, (c0, c1)) in bands.iter().enumerate() {
            fills += &format!("  %a{r}{c} = slice(%r{r}, 1, {c0}, {c1})\n");
            fills += &format!("  %f{r}{c} = fill_(%a{r}{c}, {}.0)\n", 3 * r + c);
        }
    }
    let src = format!(
        "graph shifted(%q: f32[4, 2, 16, 8], %k: f32[4, 2, 16, 8], %v: f32[4, 2, 16, 8]) {{
  %img = zeros([8, 8])
{fills}  %w1 = view(%img, [2, 4, 2, 4])
  %w2 = permute(%w1, [0, 2, 1, 3])
  %mw = reshape(%w2, [4, 16])
  %m1 = unsqueeze(%mw, 1)
  %m2 = unsqueeze(%mw, 2)
  %d = sub(%m1, %m2)
  %nz = ne(%d, 0.0)
  %am = masked_fill(%d, %nz, -100.0)
  %kt = transpose(%k, -1, -2)
  %s = matmul(%q, %kt)
  %s2 = mul(%s, 0.35)
  %mu = unsqueeze(%am, 1)
  %a = add(%s2, %mu)
  %p = softmax(%a, -1)
  %o = matmul(%p, %v)
  return %o
}}"
    );
    let g = parse(&src).unwrap();
    let ins = kiln::functionalize::random::random_inputs(&g, 5, 1.0);
    let want = kiln::run(&g, ins.clone()).unwrap();
    for mut e in attention_engines() {
        let exe = e.session.compile(&g).unwrap();
        let labels: Vec<&str> = exe
            .program
            .kernels
            .iter()
            .flat_map(|k| k.code.label.split(" | "))
            .flat_map(|l| l.split(" ; "))
            .collect();
        let attention = labels.iter().filter(|l| l.starts_with("attention")).count();
        assert_eq!(attention, 1, "{labels:?}");
        assert!(
            !labels.iter().any(|l| l.starts_with("softmax")),
            "{labels:?}"
        );
        let got = e.run(&g, ins.clone()).unwrap();
        close_gpu(
            "built shifted-window mask",
            &got.outputs[0],
            &want.outputs[0],
            1e-5,
        )
        .unwrap();
    }
}

/// Scores reshaped around their mask (Swin's shifted windows: the windows
/// split out of the batch for a per-window mask, then merged back) are
/// still one attention kernel, and an epilogue goes on through a reshape
/// too: no score tensor in memory, results as the reference's.
#[test]
fn attention_goes_through_reshapes_of_its_scores() {
    let src = "graph swin(%q: f32[4, 2, 16, 8], %k: f32[4, 2, 16, 8], %v: f32[4, 2, 16, 8], %bias: f32[2, 16, 16], %mask: f32[4, 16, 16], %w: f32[40, 16], %x: f32[12, 16]) {
  %kt = transpose(%k, -1, -2)
  %s = matmul(%q, %kt)
  %b = add(%s, %bias)
  %s5 = view(%b, [1, 4, 2, 16, 16])
  %m1 = unsqueeze(%mask, 1)
  %m2 = unsqueeze(%m1, 0)
  %a = add(%s5, %m2)
  %s4 = view(%a, [-1, 2, 16, 16])
  %p = softmax(%s4, -1)
  %o = matmul(%p, %v)
  %h = linear(%x, %w)
  %hr = view(%h, [12, 4, 10])
  %y = gelu(%hr)
  return (%o, %y)
}";
    let g = parse(src).unwrap();
    let p = launched(&g, &Default::default()).unwrap();
    let labels: Vec<&str> = p
        .kernels
        .iter()
        .flat_map(|k| k.code.label.split(" | "))
        .collect();
    assert_eq!(labels.len(), 2, "{labels:?}");
    assert!(
        labels.iter().any(|l| l.starts_with("attention")),
        "{labels:?}"
    );
    // Only the results are written: o, and gelu's [12, 40] (not h).
    let written: usize = p.kernels.iter().map(|k| k.bytes_written).sum();
    assert_eq!(written, 4 * (4 * 2 * 16 * 8 + 12 * 40), "{labels:?}");
    let ins = kiln::functionalize::random::random_inputs(&g, 11, 2.0);
    let want = kiln::run(&g, ins.clone()).unwrap();
    for mut e in [engine(), gpu_variants()] {
        let got = e.run(&g, ins.clone()).unwrap();
        for (a, w) in got.outputs.iter().zip(&want.outputs) {
            close_gpu("shifted-window attention", a, w, 1e-5).unwrap();
        }
    }
}

/// Elementwise tails of matrix products run in the product's epilogue: a
/// GELU feeding another product is computed once per element (not once
/// per tile of the next product), a residual add that is an output is
/// stored by the product kernel, and the products' own results never
/// reach memory.
#[test]
fn product_epilogues_fuse() {
    let src = "graph ffn(%x: f32[37, 24], %w1: f32[70, 24], %b1: f32[70], %w2: f32[24, 70], %b2: f32[24]) {
  %h = linear(%x, %w1, %b1)
  %g = gelu(%h)
  %y = linear(%g, %w2, %b2)
  %r = add(%y, %x)
  %z = mul(%r, 0.5)
  return %z
}";
    let g = parse(src).unwrap();
    let p = launched(&g, &Default::default()).unwrap();
    let labels: Vec<&str> = p.kernels.iter().map(|k| k.code.label.as_str()).collect();
    assert_eq!(labels.len(), 2, "{labels:?}");
    assert!(p.kernels[0].code.wgsl.contains("k_erf(t"), "{labels:?}");
    assert!(!p.kernels[1].code.wgsl.contains("k_erf(t"), "{labels:?}");
    // Each kernel writes only its tail: [37, 70] then [37, 24].
    assert_eq!(p.kernels[0].bytes_written, 4 * 37 * 70);
    assert_eq!(p.kernels[1].bytes_written, 4 * 37 * 24);
    let ins = kiln::functionalize::random::random_inputs(&g, 3, 1.0);
    let want = kiln::run(&g, ins.clone()).unwrap();
    for mut e in [engine(), gpu_variants()] {
        let got = e.run(&g, ins.clone()).unwrap();
        close_gpu("ffn", &got.outputs[0], &want.outputs[0], 1e-5).unwrap();
    }
}

/// Products of one left operand with the same rows (Q, K and V
/// projections; two batched products of one tensor) run in one launch,
/// each with its own epilogue and width, at tiled, skinny and CPU-adapter
/// sizes; a product reading a sibling's result (SwiGLU's up projection
/// times its gate) waits for it in a launch of its own.
#[test]
fn sibling_products_share_a_launch() {
    for rows in [3usize, 37, 130] {
        let src = format!(
            "graph sib(%x: f32[{rows}, 24], %wq: f32[16, 24], %bq: f32[16], %wk: f32[40, 24], %wv: f32[72, 24], %bv: f32[72], %y: f32[2, {rows}, 24], %m1: f32[24, 5], %m2: f32[24, 9]) {{
  %q = linear(%x, %wq, %bq)
  %k0 = linear(%x, %wk)
  %k = gelu(%k0)
  %v0 = linear(%x, %wv, %bv)
  %v1 = view(%v0, [{rows}, 8, 9])
  %v = transpose(%v1, 0, 1)
  %g = linear(%x, %wq)
  %u0 = linear(%x, %wq)
  %s = silu(%g)
  %u = mul(%u0, %s)
  %p = matmul(%y, %m1)
  %r = matmul(%y, %m2)
  %r2 = mul(%r, 2.0)
  return (%q, %k, %v, %u, %p, %r2)
}}"
        );
        let g = parse(&src).unwrap();
        // Native limits: the four siblings bind 10 buffers (a browser's 8
        // split them in two launches).
        let options = kiln::engine::CompileOptions {
            max_bindings: 16,
            ..Default::default()
        };
        let p = launched(&g, &options).unwrap();
        let labels: Vec<&str> = p.kernels.iter().map(|k| k.code.label.as_str()).collect();
        // q, k, v and the gated pair (the gate computed in the up
        // projection's kernel: `twin_products_are_one_kernel`) in one
        // launch; the two batched products in one. At 3 rows (skinny
        // products) both in one (another grid: `join`); in tiles the
        // batched products' tiles are of scalars, the others' of vectors,
        // under the same names.
        let mut sizes: Vec<usize> = labels
            .iter()
            .map(|l| l.matches(" | ").count() + 1)
            .collect();
        sizes.sort();
        let want = if rows == 3 { vec![6] } else { vec![2, 4] };
        assert_eq!(sizes, want, "{rows} rows: {labels:?}");
        let ins = kiln::functionalize::random::random_inputs(&g, rows as u64, 1.0);
        let want = kiln::run(&g, ins.clone()).unwrap();
        for mut e in [engine(), gpu_variants()] {
            let got = e.run(&g, ins.clone()).unwrap();
            for (i, (a, b)) in got.outputs.iter().zip(&want.outputs).enumerate() {
                close_gpu(&format!("{rows} rows, output {i}"), a, b, 1e-5).unwrap();
            }
        }
    }
}

/// A product's result split into heads (a view and a transpose or
/// permute) is stored by the product kernel where the heads have each
/// element: no copy kernel, with elementwise work after the split too,
/// on GPUs and on CPU adapters (whose products read such operands from a
/// buffer of their own: the product storing it).
#[test]
fn head_splits_are_stored_by_their_products() {
    let src = "graph heads(%x: f32[2, 6, 16], %wq: f32[16, 16], %bq: f32[16], %wk: f32[16, 16]) {
  %q0 = linear(%x, %wq, %bq)
  %q1 = view(%q0, [2, 6, 2, 8])
  %q = transpose(%q1, 1, 2)
  %qs = mul(%q, 0.5)
  %k0 = linear(%x, %wk)
  %k1 = view(%k0, [2, 6, 2, 8])
  %k = permute(%k1, [0, 2, 3, 1])
  %s = matmul(%qs, %k)
  return (%s, %qs)
}";
    let g = parse(src).unwrap();
    let p = launched(&g, &Default::default()).unwrap();
    let labels: Vec<&str> = p.kernels.iter().map(|k| k.code.label.as_str()).collect();
    // Q and K (siblings: the same x, the same rows) in one launch.
    assert_eq!(labels.len(), 2, "{labels:?}");
    assert!(labels[0].starts_with("linear+"), "{labels:?}");
    assert!(labels[0].contains(" | linear"), "{labels:?}");
    let ins = kiln::functionalize::random::random_inputs(&g, 5, 1.0);
    let want = kiln::run(&g, ins.clone()).unwrap();
    for mut e in [engine(), gpu_variants()] {
        let got = e.run(&g, ins.clone()).unwrap();
        for (a, b) in got.outputs.iter().zip(&want.outputs) {
            close_gpu("heads", a, b, 1e-5).unwrap();
        }
    }
}

/// Attention over narrow heads as one row kernel through the head merge
/// (`chain::link`): scores, softmax and the weighted sum of the values
/// per (head, query) row, the result held in the product's order and
/// stored where the merge's permuting copy has it (`Gen::row_chain`),
/// with and without an elementwise tail before the merge, and as a
/// value the output projection reads. The probabilities never reach
/// memory; results as the reference on both variants. Where attention
/// kernels are off: CPU adapters without subgroups
/// (`CompileOptions::attention_rows`).
#[test]
fn row_kernels_store_through_a_head_merge() {
    for tail in ["%o2 = mul(%o, 0.5)", "%o2 = clone(%o)"] {
        let src = format!(
            "graph f(%q: f32[2, 3, 5, 8], %k: f32[2, 3, 7, 8], %v: f32[2, 3, 7, 8], %w: f32[16, 24]) {{
  %kt = transpose(%k, -2, -1)
  %s = matmul(%q, %kt)
  %p = softmax(%s, -1)
  %o = matmul(%p, %v)
  {tail}
  %ot = transpose(%o2, 1, 2)
  %om = reshape(%ot, [2, 5, 24])
  %y = linear(%om, %w)
  return (%y, %om)
}}"
        );
        let g = parse(&src).unwrap();
        let gpu = std::sync::Arc::new(kiln::engine::Gpu::new().unwrap());
        let unfused = kiln::engine::CompileOptions {
            fuse_attention: false,
            ..gpu.compile_options()
        };
        let p = launched(&g, &unfused).unwrap();
        let labels: Vec<&str> = p.kernels.iter().map(|k| k.code.label.as_str()).collect();
        // Scores, softmax, the second product (stored as the merge).
        assert!(
            labels.iter().any(|l| l.starts_with("rows: matmul#")
                && l.contains(" > softmax#")
                && l.matches(" > ").count() == 2),
            "{tail}: {labels:?}"
        );
        let ins = kiln::functionalize::random::random_inputs(&g, 11, 1.0);
        let want = kiln::run(&g, ins.clone()).unwrap();
        let rows = Engine::on(kiln::engine::Session::with_options(gpu, unfused));
        for mut e in [engine(), gpu_variants(), rows] {
            let got = e.run(&g, ins.clone()).unwrap();
            for (i, (a, b)) in got.outputs.iter().zip(&want.outputs).enumerate() {
                close_gpu(&format!("{tail}: output {i}"), a, b, 1e-5).unwrap();
            }
        }
    }
}

/// Elementwise tails of row kernels and reductions are stored by those
/// kernels (the softmax, norm and sum results themselves never reach
/// memory), in every row-kernel variant: one row per invocation, rows
/// through workgroup memory, wide rows in passes; an embedding is read
/// where its elementwise consumer computes (no kernel of its own).
#[test]
fn row_kernel_and_reduction_epilogues_fuse() {
    for w in [5usize, 300, 1500] {
        let src = format!(
            "graph f(%x: f32[7, {w}], %g: f32[{w}], %b: f32[{w}], %t: f32[9, {w}], %i: i32[4]) {{
  %s = softmax(%x, -1)
  %s2 = mul(%s, 2.0)
  %n = layer_norm(%x, [{w}], %g, %b, 1e-05)
  %r = relu(%n)
  %m = sum(%x, [1])
  %q = sqrt(%m)
  %e = embedding(%t, %i)
  %e2 = mul(%e, 3.0)
  return (%s2, %r, %q, %e2)
}}"
        );
        let g = parse(&src).unwrap();
        let p = launched(&g, &Default::default()).unwrap();
        // Kernels sharing a launch are labelled `a | b`.
        let labels: Vec<&str> = p
            .kernels
            .iter()
            .flat_map(|k| k.code.label.split(" | "))
            .collect();
        assert_eq!(labels.len(), 4, "{labels:?}");
        for head in ["softmax+", "layer_norm+", "sum+"] {
            assert!(
                labels.iter().any(|l| l.starts_with(head)),
                "every row kernel stores its tail: {labels:?}"
            );
        }
        assert!(
            !labels.iter().any(|l| l.contains("embedding")),
            "the lookup is computed inline: {labels:?}"
        );
        let mut ins = kiln::functionalize::random::random_inputs(&g, w as u64, 2.0);
        ins[4] = RTensor::from_values(
            kiln::functionalize::Meta::contiguous(DType::I32, vec![4]),
            &[0.0, 8.0, 3.0, 3.0],
        );
        let want = kiln::run(&g, ins.clone()).unwrap();
        for mut e in [engine(), gpu_variants()] {
            let got = e.run(&g, ins.clone()).unwrap();
            for (a, b) in got.outputs.iter().zip(&want.outputs) {
                close_gpu(&format!("width {w}"), a, b, 1e-5).unwrap();
            }
        }
    }
}

/// A layer norm read only by products too wide for a row kernel is
/// computed where they load it: each workgroup's row statistics first,
/// the normalized rows never in memory. Every product path: skinny (at
/// most 16 rows), tiled with partial tiles, twins (SwiGLU), `mm`, a 3-D
/// `linear`, no weight or bias. Narrow products too, where a row kernel
/// with them would bind more than 8 buffers (the GPU variant's limit):
/// the norm before a Q, K and V projection with biases.
#[test]
fn norms_read_by_products_are_computed_where_they_load() {
    let qkv = "graph qkv(%x: f32[16, 32], %g: f32[32], %b: f32[32], %wq: f32[32, 32], %bq: f32[32], %wk: f32[32, 32], %bk: f32[32], %wv: f32[32, 32], %bv: f32[32]) {
  %n = layer_norm(%x, [32], %g, %b, 1e-05)
  %q = linear(%n, %wq, %bq)
  %k = linear(%n, %wk, %bk)
  %v = linear(%n, %wv, %bv)
  return (%q, %k, %v)
}";
    let g = parse(qkv).unwrap();
    let ins = kiln::functionalize::random::random_inputs(&g, 7, 2.0);
    let want = kiln::run(&g, ins.clone()).unwrap();
    let gpu = limited_engine(|l| l.max_storage_buffers_per_shader_stage = 8)
        .session
        .gpu()
        .clone();
    let mut options = common::gpu_variant_options(&gpu);
    options.max_bindings = 8;
    let p = launched(&g, &options).unwrap();
    let mut e = Engine::on(kiln::engine::Session::with_options(gpu, options));
    for k in &p.kernels {
        assert!(k.code.label.starts_with("linear"), "{}", p.stats());
    }
    let got = e.run(&g, ins.clone()).unwrap();
    for (i, (a, b)) in got.outputs.iter().zip(&want.outputs).enumerate() {
        close_gpu(&format!("qkv output {i}"), a, b, 1e-4).unwrap();
    }
    // The norm's input written in place before the product: the norm is
    // computed before the write, a kernel of its own.
    let hazard = "graph f(%x: f32[8, 80], %w: f32[96, 80], %u: f32[8, 10]) {
  %n = layer_norm(%x, [80])
  %s = slice(%x, 1, 0, 10)
  %c = copy_(%s, %u)
  %h = linear(%n, %w)
  return %h
}";
    let g = parse(hazard).unwrap();
    let fresh = || kiln::functionalize::random::random_inputs(&g, 5, 2.0);
    let want = kiln::run(&g, fresh()).unwrap();
    for mut e in [engine(), gpu_variants()] {
        let got = e.run(&g, fresh()).unwrap();
        close_gpu(
            "norm before an in-place write",
            &got.outputs[0],
            &want.outputs[0],
            1e-4,
        )
        .unwrap();
    }
    for rows in [5usize, 16, 37, 300] {
        let src = format!(
            "graph f(%x: f32[{rows}, 80], %g: f32[80], %b: f32[80], %w1: f32[96, 80], %b1: f32[96], %w3: f32[96, 80], %m: f32[80, 72], %y: f32[2, {rows}, 80]) {{
  %n = layer_norm(%x, [80], %g, %b, 1e-05)
  %h = linear(%n, %w1, %b1)
  %a = silu(%h)
  %u = linear(%n, %w3)
  %gu = mul(%a, %u)
  %p = mm(%n, %m)
  %n2 = layer_norm(%y, [80])
  %l = linear(%n2, %w1)
  %r = relu(%l)
  return (%gu, %p, %r)
}}"
        );
        let g = parse(&src).unwrap();
        let mut ins = kiln::functionalize::random::random_inputs(&g, rows as u64, 2.0);
        // Rows far from zero mean: the statistics' compensation matters.
        ins[0] = RTensor::from_values(
            kiln::functionalize::Meta::contiguous(DType::F32, vec![rows, 80]),
            &(0..rows * 80)
                .map(|i| 100.0 + ((i * 37 % 101) as f64) / 25.0)
                .collect::<Vec<_>>(),
        );
        let want = kiln::run(&g, ins.clone()).unwrap();
        // The adapter's blocked products (slow to build on lavapipe): one
        // partial and one whole block of rows.
        let mut sessions = vec![("GPU variant", gpu_variants())];
        if rows == 5 || rows == 300 {
            sessions.push(("adapter", engine()));
        }
        for (what, mut e) in sessions {
            let p = launched(&g, e.session.compile_options()).unwrap();
            let labels: Vec<&str> = p
                .kernels
                .iter()
                .flat_map(|k| k.code.label.split(" | "))
                .collect();
            assert!(
                !labels.iter().any(|l| l.starts_with("layer_norm")),
                "{what}, {rows} rows: no norm kernel: {labels:?}"
            );
            let got = e.run(&g, ins.clone()).unwrap();
            for (i, (a, b)) in got.outputs.iter().zip(&want.outputs).enumerate() {
                close_gpu(&format!("{what}, {rows} rows, output {i}"), a, b, 1e-4).unwrap();
            }
        }
    }
}

/// Elementwise work that reads a row sum or mean broadcast back over its
/// rows (RMS norm as LLaMA writes it, a mean subtracted) is computed by
/// the reduction's kernel: one kernel each, the mean never in memory, in
/// the row-tiled GPU kernel (rows up to 1024 wide), and a row per
/// invocation; wider rows and other reductions keep two kernels on GPUs.
#[test]
fn row_reductions_fuse_with_their_broadcast_consumers() {
    for w in [5usize, 300, 1500] {
        let src = format!(
            "graph f(%x: f32[7, {w}], %w: f32[{w}]) {{
  %sq = pow(%x, 2)
  %ms = mean(%sq, [-1], true)
  %e = add(%ms, 1e-06)
  %r = rsqrt(%e)
  %xn = mul(%x, %r)
  %h = mul(%xn, %w)
  %m = mean(%x, [1], true)
  %c = sub(%x, %m)
  %a = amax(%x, [1], true)
  %d = sub(%x, %a)
  return (%h, %c, %d)
}}"
        );
        let g = parse(&src).unwrap();
        let p = launched(&g, &apart()).unwrap();
        let labels: Vec<&str> = p.kernels.iter().map(|k| k.code.label.as_str()).collect();
        if w <= 1024 {
            assert_eq!(labels.len(), 4, "{labels:?}");
            let fused = labels.iter().filter(|l| l.starts_with("mean+")).count();
            assert_eq!(fused, 2, "{labels:?}");
            // Reads x (and w) and writes h and c, nothing else.
            let rows = 4 * 7 * w;
            assert_eq!(p.kernels[0].bytes_written, rows);
        } else {
            assert_eq!(labels.len(), 6, "{labels:?}");
        }
        let ins = kiln::functionalize::random::random_inputs(&g, w as u64, 2.0);
        let want = kiln::run(&g, ins.clone()).unwrap();
        for mut e in [engine(), gpu_variants()] {
            let got = e.run(&g, ins.clone()).unwrap();
            for (a, b) in got.outputs.iter().zip(&want.outputs) {
                close_gpu(&format!("width {w}"), a, b, 1e-5).unwrap();
            }
        }
    }
}

/// Elementwise kernels reading a transposing view run in square tiles
/// (16 and 32 a side) through workgroup memory (`CompileOptions::tile_transposes`): partial
/// tiles, batch dimensions, integers, two views in one kernel and a bare
/// transpose, on both adapter variants, against the reference.
#[test]
fn transposed_reads_are_tiled() {
    let src = "graph f(%x: f32[37, 50], %b: f32[37], %y: i32[3, 40, 33], %z: f32[50, 37], %w: f32[3, 33, 40]) {
  %t = t(%x)
  %a = add(%t, %b)
  %c = tanh(%a)
  %d = sub(%c, %t)
  %zt = t(%z)
  %s = add(%x, %zt)
  %yp = permute(%y, [0, 2, 1])
  %ym = mul(%yp, 3)
  %tt = transpose(%x, 0, 1)
  %wp = permute(%w, [2, 0, 1])
  %wq = mul(%wp, 2.0)
  return (%d, %s, %ym, %tt, %wq)
}";
    let g = parse(src).unwrap();
    for (workgroup, side) in [(256, 32), (256, 16), (64, 16)] {
        let options = kiln::engine::CompileOptions {
            workgroup,
            transpose_tile: side,
            vectorize: workgroup == 256,
            ..Default::default()
        };
        let p = launched(&g, &options).unwrap();
        let tiled = p
            .kernels
            .iter()
            .filter(|k| k.code.wgsl.contains("var<workgroup> tile0"))
            .count();
        // Every kernel: %d with %tt, %s (%x read plainly, %z through
        // the tile), %ym, %wq.
        assert_eq!(
            (tiled, p.kernels.len()),
            (4, 4),
            "{:?}",
            p.kernels.iter().map(|k| &k.code.label).collect::<Vec<_>>()
        );
    }
    let ins = kiln::functionalize::random::random_inputs(&g, 7, 2.0);
    let want = kiln::run(&g, ins.clone()).unwrap();
    for mut e in [engine(), gpu_variants()] {
        let got = e.run(&g, ins.clone()).unwrap();
        close_run("tiled transposes", &got, &want, 0.0).unwrap();
    }
}

/// Where transposes are not tiled (CPU adapters), elementwise kernels
/// reading a transposing view compute 4x4 blocks
/// (`CompileOptions::transpose_blocks`): the source's quad under each
/// block column is one vector load. Two views and a broadcast row in one
/// kernel beside a view at an unaligned offset (read as usual), a plain
/// read of a transposed sum's source, integers, a bare transpose and a
/// batched 4-D one, against the reference with blocks on and off and on
/// the GPU variants (which loop over the grid).
#[test]
fn transposed_reads_run_in_blocks_where_tiles_are_off() {
    let src = "graph f(%x: f32[48, 40], %b: f32[48], %y: i32[2, 24, 16], %z: f32[40, 48], %w: f32[2, 3, 8, 12], %u: f32[48, 41]) {
  %t = t(%x)
  %a = add(%t, %b)
  %c = tanh(%a)
  %d = sub(%c, %t)
  %us = slice(%u, 1, 1, 41)
  %ut = t(%us)
  %e = mul(%d, %ut)
  %zt = t(%z)
  %s = add(%x, %zt)
  %yp = permute(%y, [0, 2, 1])
  %ym = mul(%yp, 3)
  %tt = transpose(%x, 0, 1)
  %wt = transpose(%w, -1, -2)
  %wq = mul(%wt, 2.0)
  return (%e, %s, %ym, %tt, %wq)
}";
    let g = parse(src).unwrap();
    let gpu = std::sync::Arc::new(kiln::engine::Gpu::new().unwrap());
    let ins = kiln::functionalize::random::random_inputs(&g, 11, 2.0);
    let want = kiln::run(&g, ins.clone()).unwrap();
    let base = kiln::engine::CompileOptions {
        tile_transposes: false,
        ..gpu.compile_options()
    };
    for (blocks, options) in [
        (true, base.clone()),
        (
            false,
            kiln::engine::CompileOptions {
                transpose_blocks: false,
                ..base.clone()
            },
        ),
        (true, common::gpu_variant_options(&gpu)),
    ] {
        // Kernels sharing a launch bind no vectors: one launch each.
        let options = kiln::engine::CompileOptions {
            tile_transposes: false,
            transpose_blocks: blocks,
            share_launches: false,
            ..options
        };
        let p = launched(&g, &options).unwrap();
        // A kernel of blocks runs an invocation per 16 or 32 elements (a
        // vector kernel one per 4): %e with %tt, %s, %ym, %wq.
        let per_invocation: Vec<usize> = p
            .kernels
            .iter()
            .map(|k| {
                let wg = if k.code.wgsl.contains("@workgroup_size(256") {
                    256
                } else {
                    64
                };
                let invocations = k.code.grid.iter().map(|&x| x as usize).product::<usize>() * wg;
                1920usize.div_ceil(invocations)
            })
            .collect();
        if options.grid_stride.is_none() {
            let want_per = if blocks { 16 } else { 4 };
            assert!(
                p.kernels.len() == 4 && per_invocation.iter().all(|&e| e >= want_per - 1),
                "{:?} {per_invocation:?}",
                p.kernels.iter().map(|k| &k.code.label).collect::<Vec<_>>()
            );
        }
        for k in &p.kernels {
            kiln::engine::wgsl::validate(&k.code.wgsl).unwrap();
        }
        let mut e = Engine::on(kiln::engine::Session::with_options(gpu.clone(), options));
        let got = e.run(&g, ins.clone()).unwrap();
        close_run("transposes in blocks", &got, &want, 0.0).unwrap();
    }
}

/// Inputs that share memory (`TensorSpec::view`: a synthetic base): the
/// traced program takes the base alone, so a write through one input shows
/// in the other, on the reference, after functionalization (both modes)
/// and on the GPU, and the base comes back updated.
#[test]
fn aliased_inputs_become_views_of_one_base() {
    use kiln::functionalize::trace::{trace, TensorSpec};
    let specs = [
        TensorSpec::view("a", "buf", DType::F32, &[2, 3], &[3, 1], 0),
        TensorSpec::new("buf", DType::F32, &[8]),
        TensorSpec::view("col", "buf", DType::F32, &[2], &[3], 1),
    ];
    let g = trace("aliased", &specs, |p| {
        // Write through `a`, read through `col` (elements 1 and 4 of buf).
        p[0].add_(
            kiln::functionalize::trace::call("ones", kiln::functionalize::args![&[2i64, 3][..]])
                .remove(0),
        );
        vec![p[2].mul(10.0)]
    })
    .unwrap();
    assert_eq!(g.inputs.len(), 1, "{}", kiln::print(&g));
    let buf: Vec<f64> = (0..8).map(|i| i as f64).collect();
    let ins = || vec![RTensor::new(DType::F32, vec![8], &buf)];
    let want = kiln::run(&g, ins()).unwrap();
    assert_eq!(want.outputs[0].values(), vec![20.0, 50.0]);
    assert_eq!(
        want.inputs[0].values(),
        vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 6.0, 7.0]
    );
    for mode in [
        kiln::functionalize::Remove::Mutations,
        kiln::functionalize::Remove::MutationsAndViews,
    ] {
        let f = kiln::functionalize::functionalize(&g, mode).unwrap();
        let r = kiln::run(&f.graph, ins()).unwrap();
        assert_eq!(r.outputs[0].values(), vec![20.0, 50.0], "{mode:?}");
    }
    let got = engine().run(&g, ins()).unwrap();
    close_gpu("col", &got.outputs[0], &want.outputs[0], 0.0).unwrap();
    close_gpu("buf", &got.inputs[0], &want.inputs[0], 0.0).unwrap();
    // A view outside its base is refused, naming the input.
    let bad = [
        TensorSpec::new("buf", DType::F32, &[4]),
        TensorSpec::view("w", "buf", DType::F32, &[3], &[2], 0),
    ];
    let e = trace("bad", &bad, |p| vec![p[1].clone()])
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains('w'), "{e}");
}

/// A reduction of what an elementwise kernel stores runs in that kernel
/// (`lower::folds_into`): the members are computed and stored where the
/// reduction visits each element, packed bools and f16 halves included
/// (lane stores from invocations owning lines, not words), so the
/// reduced tensor is never read back. Float sums on GPUs keep their
/// row kernels (a second kernel there).
#[test]
fn reductions_fold_into_the_elementwise_kernel_they_read() {
    let programs = [
        (
            "graph f(%x: f32[5, 7], %m: bool[5, 7]) {
  %p = gt(%x, 0.25)
  %o = logical_or(%p, %m)
  %y = mul(%x, 2.0)
  %s = sum(%o, [0], true)
  return (%o, %y, %s)
}",
            [1, 1],
        ),
        (
            "graph f(%x: f32[3, 9, 5]) {
  %y = mul(%x, 2.0)
  %h = _to_copy(%y, f16)
  %b = lt(%y, 0.5)
  %mx = amax(%y, [1])
  return (%h, %b, %mx)
}",
            [1, 1],
        ),
        (
            "graph f(%x: f32[6, 11], %w: f32[11]) {
  %y = mul(%x, %w)
  %c = clone(%y)
  %d = diagonal(%c)
  %n = neg_(%d)
  %s = mean(%c, [0])
  return (%y, %c, %s)
}",
            [1, 2],
        ),
    ];
    let gpu = std::sync::Arc::new(kiln::engine::Gpu::new().unwrap());
    let gpu_class = common::gpu_variant_options(&gpu);
    for (src, kernels) in programs {
        let g = parse(src).unwrap();
        let ins = kiln::functionalize::random::random_inputs(&g, 3, 1.0);
        let want = kiln::run(&g, ins.clone()).unwrap();
        for (options, k) in [gpu.compile_options(), gpu_class.clone()]
            .into_iter()
            .zip(kernels)
        {
            let p = launched(&g, &options).unwrap();
            let labels: Vec<&str> = p.kernels.iter().map(|k| k.code.label.as_str()).collect();
            assert_eq!(labels.len(), k, "{src}: {labels:?}");
            let mut e = Engine::on(kiln::engine::Session::with_options(gpu.clone(), options));
            let got = e.run(&g, ins.clone()).unwrap();
            for (a, b) in got.outputs.iter().zip(&want.outputs) {
                close_gpu(src, a, b, 1e-6).unwrap();
            }
        }
    }
}

/// Independent elementwise kernels of different shapes share a launch,
/// each in workgroups of its own (`lower::join_map_launches`): labelled
/// `a | b`, a buffer both read charged once, results as the reference's on
/// both variants. A kernel too large to join (more workgroups than a grid
/// row holds beside the others) runs alone, the next plan keeping it
/// apart.
#[test]
fn independent_elementwise_kernels_share_a_launch() {
    let src = "graph f(%x: f32[6, 5], %y: f32[3, 7], %b: bool[9]) {
  %s = stack([%x, %x], 0)
  %t = tanh(%y)
  %n = logical_not(%b)
  %r = repeat(%x, [1, 3])
  %u = add(%r, 1.0)
  return (%s, %t, %n, %u)
}";
    let g = parse(src).unwrap();
    let gpu = std::sync::Arc::new(kiln::engine::Gpu::new().unwrap());
    let ins = kiln::functionalize::random::random_inputs(&g, 5, 1.0);
    let want = kiln::run(&g, ins.clone()).unwrap();
    for options in [gpu.compile_options(), common::gpu_variant_options(&gpu)] {
        let p = launched(&g, &options).unwrap();
        let labels: Vec<&str> = p.kernels.iter().map(|k| k.code.label.as_str()).collect();
        assert_eq!(labels.len(), 1, "{labels:?}");
        assert_eq!(labels[0].split(" | ").count(), 4, "{labels:?}");
        // x (120 B) read by the stack and the repeat once; y 84, b 12 (a
        // word each 4 bools).
        assert_eq!(p.kernels[0].bytes_read, 120 + 84 + 12, "{labels:?}");
        assert_eq!(launches_apart(&g, &options), 4);
        let mut e = Engine::on(kiln::engine::Session::with_options(gpu.clone(), options));
        let got = e.run(&g, ins.clone()).unwrap();
        for (a, b) in got.outputs.iter().zip(&want.outputs) {
            close_gpu(src, a, b, 0.0).unwrap();
        }
    }
    // `u` could take x's buffer (x dies in its kernel), which would keep
    // the stack from running beside it: x keeps its buffer, within
    // eager's peak, and the four kernels share a launch.
    let src = "graph f(%x: f32[6, 5], %y: f32[3, 7], %b: bool[9]) {
  %s = stack([%x, %x], 0)
  %t = tanh(%y)
  %n = logical_not(%b)
  %d = mul(%x, 2.0)
  %u = add(%d, 1.0)
  return (%s, %t, %n, %u)
}";
    let g = parse(src).unwrap();
    let p = launched(&g, &gpu.compile_options()).unwrap();
    assert_eq!(p.kernels.len(), 1);
    assert!(p.memory.planned_peak() <= p.memory.eager_peak);
    let ins = kiln::functionalize::random::random_inputs(&g, 7, 1.0);
    let want = kiln::run(&g, ins.clone()).unwrap();
    let got = engine().run(&g, ins).unwrap();
    for (a, b) in got.outputs.iter().zip(&want.outputs) {
        close_gpu("kept input", a, b, 0.0).unwrap();
    }
    // 4194305 f32 elements, an odd count (no vector loads): 65537
    // workgroups of 64, two rows of a grid; the small kernel runs apart.
    let src = "graph f(%x: f32[4194305], %y: f32[3, 7]) {
  %a = mul(%x, 3.0)
  %t = tanh(%y)
  return (%a, %t)
}";
    let g = parse(src).unwrap();
    let mut options = gpu.compile_options();
    options.workgroup = 64;
    options.grid_stride = None;
    let p = launched(&g, &options).unwrap();
    assert_eq!(p.kernels.len(), 2);
    let ins = kiln::functionalize::random::random_inputs(&g, 6, 1.0);
    let want = kiln::run(&g, ins.clone()).unwrap();
    let mut e = Engine::on(kiln::engine::Session::with_options(gpu, options));
    let got = e.run(&g, ins).unwrap();
    for (a, b) in got.outputs.iter().zip(&want.outputs) {
        close_gpu("large", a, b, 0.0).unwrap();
    }
}

/// Narrow layers (a norm, products with weights, their biases and
/// activations, a softmax) run as one row kernel, an invocation per block
/// of rows with the intermediates in registers (`chain::chain_rows`):
/// blocks of one row, of three rows under a norm over two dims, f16
/// values stored as whole words, an output stored over a dying input,
/// reductions over rows (stored, or broadcast back: RMS norm), twin
/// products, and a value read through a reshape sharing its buffer.
/// One kernel at the minimum bytes, as the reference computes, on the
/// adapter's options and the GPU variant's; a kernel each without.
#[test]
fn narrow_layers_run_as_one_row_kernel() {
    let programs = [
        // Rows of 24 and 40 (7 of them): every value one row a block.
        "graph mlp(%x: f32[7, 24], %lw: f32[24], %lb: f32[24], %w1: f32[40, 24], %b1: f32[40], %w2: f32[24, 40]) {
  %h = layer_norm(%x, [24], %lw, %lb, 1e-5)
  %u = linear(%h, %w1, %b1)
  %g = gelu(%u, \"tanh\")
  %w2t = t(%w2)
  %o = matmul(%g, %w2t)
  %r = add(%o, %x)
  %p = softmax(%r, -1)
  %lp = log_softmax(%r, 1)
  return (%p, %lp)
}",
        // A norm over [3, 8]: blocks of three product rows.
        "graph blocks(%x: f32[5, 3, 8], %w: f32[8, 8], %b: f32[8], %g: f32[3, 8], %beta: f32[3, 8]) {
  %n = layer_norm(%x, [8], none, none, 1e-6)
  %h = linear(%n, %w, %b)
  %a = relu(%h)
  %s = add(%a, %x)
  %o = layer_norm(%s, [3, 8], %g, %beta)
  return (%o, %a)
}",
        // f16 stored as words (rows of 6: three words), a scale in between.
        "graph half(%x: f16[5, 8], %w: f16[6, 8], %b: f16[6]) {
  %h = linear(%x, %w, %b)
  %n = layer_norm(%h, [6])
  %sc = mul(%n, 0.5)
  %p = softmax(%sc, -1)
  return (%h, %p)
}",
        // The head's result written over `x` (dying here, read by rows).
        "graph head(%x: f32[4, 6], %w: f32[3, 6], %b: f32[3]) {
  %h = linear(%x, %w, %b)
  %rate = softplus(%h)
  %sharp = softplus(%h, 2, 1)
  %out = cat([%rate, %sharp], 1)
  %y = add(%out, %x)
  return %y
}",
        // RMS norm (a mean, kept, and its broadcast tail), SwiGLU's twin
        // products, a residual add, an amax subtracted.
        "graph swiglu(%x: f32[5, 16], %g: f32[16], %w1: f32[24, 16], %w3: f32[24, 16], %w2: f32[16, 24]) {
  %p = pow(%x, 2)
  %ms = mean(%p, [-1], true)
  %e = add(%ms, 1e-6)
  %rs = rsqrt(%e)
  %n = mul(%x, %rs)
  %xn = mul(%n, %g)
  %a = linear(%xn, %w1)
  %s = silu(%a)
  %b = linear(%xn, %w3)
  %m = mul(%s, %b)
  %o = linear(%m, %w2)
  %y = add(%o, %x)
  %mx = amax(%y, [1], true)
  %z = sub(%y, %mx)
  return (%z, %ms)
}",
        // A decode step: attention over a cache (its probabilities an
        // output), its output reshaped (a view sharing its buffer) into
        // the logits' product.
        "graph decode(%q: f32[2, 1, 8], %kc: f32[2, 16, 8], %vc: f32[2, 16, 8], %w: f32[8, 50]) {
  %kt = transpose(%kc, 1, 2)
  %s = bmm(%q, %kt)
  %p = softmax(%s, -1)
  %o = bmm(%p, %vc)
  %h = view(%o, [2, 8])
  %l = mm(%h, %w)
  return (%l, %p)
}",
    ];
    let gpu = std::sync::Arc::new(kiln::engine::Gpu::new().unwrap());
    for (i, src) in programs.iter().enumerate() {
        let g = parse(src).unwrap();
        let ins = kiln::functionalize::random::random_inputs(&g, 11 + i as u64, 1.0);
        let want = kiln::run(&g, ins.clone()).unwrap();
        for options in [gpu.compile_options(), common::gpu_variant_options(&gpu)] {
            let p = launched(&g, &options).unwrap();
            let labels: Vec<&str> = p.kernels.iter().map(|k| k.code.label.as_str()).collect();
            assert_eq!(labels.len(), 1, "program {i}: {labels:?}");
            assert!(labels[0].starts_with("rows: "), "program {i}: {labels:?}");
            assert_eq!(p.bytes_moved(), p.min_bytes, "program {i}:\n{}", p.stats());
            let apart = kiln::engine::CompileOptions {
                chain_rows: false,
                ..options.clone()
            };
            let kernels = launched(&g, &apart).unwrap().kernels.len();
            assert!(
                kernels > 1,
                "program {i}: {kernels} kernels without row kernels"
            );
            let mut e = Engine::on(kiln::engine::Session::with_options(gpu.clone(), options));
            let got = e.run(&g, ins.clone()).unwrap();
            for (k, (a, b)) in got.outputs.iter().zip(&want.outputs).enumerate() {
                close_gpu(&format!("program {i} output {k}"), a, b, 0.0).unwrap();
            }
        }
    }
    // The last one's result took `x`'s buffer: no arena, the io alone.
    let g = parse(programs[3]).unwrap();
    let p = launched(&g, &gpu.compile_options()).unwrap();
    assert_eq!(p.memory.planned_peak(), 4 * (24 + 18 + 3), "{}", p.stats());
}

/// A batched product whose operands are index maps of one input (a
/// transpose, a flip, a repeat: loaded in place), its standard deviation
/// over the trailing dims (not kept), and a variance of another input
/// over its first dim, which shares a launch with the first where no row
/// kernel takes it: the product and its deviation are one row kernel, the
/// variance a kernel of its own, at the minimum bytes, as the reference.
#[test]
fn row_kernels_take_their_reductions_from_a_shared_launch() {
    let src = "graph f(%x: f32[3, 4], %bias: f32[2, 3, 3], %p: f32[4, 5]) {
  %t = transpose(%x, 0, 1)
  %f = flip(%t, [0])
  %r = repeat(%f, [2, 1, 1])
  %rt = transpose(%r, 1, 2)
  %y = baddbmm(%bias, %rt, %r, 0.5, 2.0)
  %sd = std(%y, [1, 2])
  %va = var(%p, [0], 0, true)
  return (%y, %sd, %va)
}";
    let g = parse(src).unwrap();
    let ins = kiln::functionalize::random::random_inputs(&g, 5, 1.0);
    let want = kiln::run(&g, ins.clone()).unwrap();
    let gpu = std::sync::Arc::new(kiln::engine::Gpu::new().unwrap());
    for options in [gpu.compile_options(), common::gpu_variant_options(&gpu)] {
        let p = launched(&g, &options).unwrap();
        let labels: Vec<&str> = p.kernels.iter().map(|k| k.code.label.as_str()).collect();
        assert_eq!(labels.len(), 2, "{labels:?}");
        assert!(labels[0] == "rows: baddbmm#baddbmm > std#std", "{labels:?}");
        assert_eq!(p.bytes_moved(), p.min_bytes, "{}", p.stats());
        let mut e = Engine::on(kiln::engine::Session::with_options(gpu.clone(), options));
        let got = e.run(&g, ins.clone()).unwrap();
        for (k, (a, b)) in got.outputs.iter().zip(&want.outputs).enumerate() {
            close_gpu(&format!("output {k}"), a, b, 0.0).unwrap();
        }
    }
}

/// A small program's kernels run in sequence in one workgroup
/// (`CompileOptions::sequence`): one kernel, the values only it reads in
/// workgroup memory (each input read once, each output written once), an
/// output read again by later kernels read from workgroup memory too
/// (written through) and no arena words for those only it reads, and
/// results as the reference's and as a launch per kernel computes them,
/// on the adapter's options and the GPU variants'.
/// Past the budget (a 256 x 256 softmax) kernels keep their launches;
/// with a browser's 8 storage buffers a program of 11 parameters runs in
/// one sequence where they are small (one buffer), else in several.
#[test]
fn small_programs_run_their_kernels_in_sequence() {
    let src =
        "graph seq(%x: f32[6, 10], %w: f32[12, 10], %b: f32[12], %g: f32[12], %t: f32[6, 12]) {
  %h = linear(%x, %w, %b)
  %n = layer_norm(%h, [12], %g, %g)
  %p = softmax(%n, -1)
  %s = sum(%p, [0])
  %u = mul(%p, %s)
  %m = matmul(%u, %w)
  %c = cumsum(%m, 1)
  %a = add_(%t, %p)
  return (%p, %c)
}";
    let g = parse(src).unwrap();
    let p = kiln::engine::compile(&g).unwrap();
    assert_eq!(p.kernels.len(), 1, "{}", p.stats());
    assert!(p.kernels[0].code.label.contains(" ; "), "{}", p.stats());
    assert!(p.kernels[0].code.wgsl.contains("var<workgroup> wsm"));
    assert!(p.bytes_moved() <= p.min_bytes, "{}", p.stats());
    // The values only the kernel reads take no arena words: the arena
    // holds the two outputs alone.
    assert_eq!(p.memory.arena, (6 * 12 + 6 * 10) * 4, "{}", p.stats());
    assert!(launched(&g, &Default::default()).unwrap().kernels.len() > 2);
    // Fresh inputs each run: a run writes `%t` in place (clones share
    // their storage).
    let ins = || kiln::functionalize::random::random_inputs(&g, 5, 2.0);
    let want = kiln::run(&g, ins()).unwrap();
    let apart = |mut o: kiln::engine::CompileOptions| {
        o.sequence = false;
        o
    };
    let gpu = engine().session.gpu().clone();
    let variant = common::gpu_variant_options(&gpu);
    let sessions = [
        gpu.compile_options(),
        apart(gpu.compile_options()),
        variant.clone(),
        apart(variant),
    ];
    for (i, options) in sessions.into_iter().enumerate() {
        let mut e = Engine::on(kiln::engine::Session::with_options(gpu.clone(), options));
        let got = e.run(&g, ins()).unwrap();
        for (a, w) in got.outputs.iter().zip(&want.outputs) {
            close_gpu(&format!("kernels in sequence ({i})"), a, w, 1e-5).unwrap();
        }
        for (a, w) in got.inputs.iter().zip(&want.inputs) {
            close_gpu(
                &format!("kernels in sequence ({i}): a parameter"),
                a,
                w,
                1e-5,
            )
            .unwrap();
        }
    }
    let big = parse(
        "graph big(%x: f32[256, 256]) {
  %p = softmax(%x, -1)
  %s = sum(%p, [0])
  return %s
}",
    )
    .unwrap();
    let p = kiln::engine::compile(&big).unwrap();
    assert_eq!(p.kernels.len(), 2, "{}", p.stats());
    // 11 parameters: small ones share a buffer (one binding: one kernel),
    // ones too large to share take a binding each (several sequences).
    let e8 = limited_engine(|l| l.max_storage_buffers_per_shader_stage = 8);
    let gpu8 = e8.session.gpu().clone();
    for (shape, kernels) in [("[4, 5]", 1..2), ("[33, 32]", 2..5)] {
        let params: Vec<String> = (0..11).map(|i| format!("%x{i}: f32{shape}")).collect();
        let mut body: Vec<String> = vec!["  %a0 = softmax(%x0, -1)".into()];
        for i in 1..11 {
            body.push(format!("  %s{i} = add(%a{}, %x{i})", i - 1));
            body.push(format!("  %a{i} = softmax(%s{i}, 0)"));
        }
        let wide = format!(
            "graph wide({}) {{\n{}\n  return %a10\n}}",
            params.join(", "),
            body.join("\n")
        );
        let wide = parse(&wide).unwrap();
        let p = kiln::engine::compile_with(&wide, &gpu8.compile_options()).unwrap();
        assert!(kernels.contains(&p.kernels.len()), "{shape}: {}", p.stats());
        for k in &p.kernels {
            assert!(k.code.bindings.len() <= 8, "{}", p.stats());
        }
        let ins = kiln::functionalize::random::random_inputs(&wide, 6, 2.0);
        let want = kiln::run(&wide, ins.clone()).unwrap();
        let got = Engine::on(kiln::engine::Session::new(gpu8.clone()))
            .run(&wide, ins)
            .unwrap();
        close_gpu(
            "sequences of 8 bindings",
            &got.outputs[0],
            &want.outputs[0],
            1e-5,
        )
        .unwrap();
    }
}
