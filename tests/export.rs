//! Export files on a real adapter (lavapipe in CI): every example program
//! exported with weights, checked, loaded and run gives what the same
//! program compiled in memory gives, bit for bit; the reference runs the
//! embedded program to the same values; damaged, truncated and hostile
//! files are errors, never panics (a bounded fuzz run here; set
//! `KILN_FUZZ_CASES` for a longer one).

mod common;

use common::{programs, root};
use kiln::engine::export::{self, ExportError, ExportOptions, WeightsDtype, HEADER_LEN};
use kiln::engine::{Fetch, Gpu, HostTensor, Input, Output, Session};
use kiln::functionalize::{functionalize, parse, Graph, Remove};
use std::sync::Arc;

fn gpu() -> Arc<Gpu> {
    let s = Session::open().unwrap_or_else(|e| panic!("the export tests need a wgpu adapter: {e}"));
    s.gpu().clone()
}

/// An example's PyTorch fixture inputs, and as weights every other
/// parameter the program never writes.
fn example(path: &std::path::Path) -> (Graph, Vec<HostTensor<'static>>, Vec<usize>) {
    let g = parse(&std::fs::read_to_string(path).unwrap()).unwrap();
    let rel = path.strip_prefix(root()).unwrap().with_extension("");
    let fix = root().join("tests/fixtures").join(rel);
    let ins: Vec<HostTensor> = kiln::io::load_inputs(&g, &fix.with_extension("inputs.safetensors"))
        .unwrap()
        .iter()
        .map(HostTensor::from_rtensor)
        .collect();
    let written: Vec<usize> = functionalize(&g, Remove::Mutations)
        .unwrap()
        .mutated_inputs
        .iter()
        .map(|m| m.input)
        .collect();
    let weights = (0..g.inputs.len())
        .filter(|i| i % 2 == 1 && !written.contains(i))
        .collect();
    (g, ins, weights)
}

fn name(g: &Graph, i: usize) -> String {
    g.values[g.inputs[i]]
        .name
        .as_deref()
        .unwrap_or("")
        .to_string()
}

/// Every output and mutated parameter's bytes of one run.
fn run_bytes(s: &Session, exe: &kiln::engine::Executable, params: &[HostTensor]) -> Vec<Vec<u8>> {
    let feeds: Vec<Input> = exe
        .input_params()
        .into_iter()
        .map(|i| Input::Host(&params[i]))
        .collect();
    let r = s
        .run(exe, &feeds, &exe.options(Fetch::Host, Fetch::Host))
        .unwrap();
    let host = |o: Output| o.host().unwrap().bytes().to_vec();
    let mut out: Vec<Vec<u8>> = r.outputs.into_iter().map(host).collect();
    out.extend(r.mutated.into_iter().map(|(_, o)| host(o)));
    out
}

fn export_example(
    s: &Session,
    g: &Graph,
    ins: &[HostTensor],
    weights: &[usize],
    opts: &ExportOptions,
) -> Vec<u8> {
    let w: Vec<(String, HostTensor)> = weights
        .iter()
        .map(|&i| (name(g, i), ins[i].clone()))
        .collect();
    export::export(s, g, &w, opts).unwrap()
}

#[test]
fn every_example_exports_loads_and_runs_bit_for_bit() {
    let gpu = gpu();
    let mut checked = 0;
    for path in programs(&root().join("examples/programs")) {
        let (g, ins, weights) = example(&path);
        let what = path.display().to_string();
        // The export, checked and loaded on a session of its own.
        let s = Session::new(gpu.clone());
        let bytes = export_example(&s, &g, &ins, &weights, &ExportOptions::default());
        let e = export::read(&bytes).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(e.constants.len(), weights.len(), "{what}");
        let exe = s
            .load_exported(&e)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(
            exe.input_params().len(),
            g.inputs.len() - weights.len(),
            "{what}"
        );
        let got = run_bytes(&s, &exe, &ins);
        // The same program compiled in memory with the same constants.
        let m = Session::new(gpu.clone());
        for &i in &weights {
            m.add_constant(&name(&g, i), &ins[i]).unwrap();
        }
        let mem = m.compile(&g).unwrap();
        assert_eq!(
            got,
            run_bytes(&m, &mem, &ins),
            "{what}: export and in-memory differ"
        );
        checked += 1;
    }
    assert!(checked >= 40, "{checked} examples");
}

/// f16-stored weights: half the constant bytes, widened at load, results
/// within f16 rounding of the f32 export's.
#[test]
fn f16_weights_halve_the_constants() {
    let gpu = gpu();
    let path = root().join("examples/programs/mlp_block.txt");
    let (g, ins, weights) = example(&path);
    let s = Session::new(gpu);
    let full = export_example(&s, &g, &ins, &weights, &ExportOptions::default());
    let half = export_example(
        &s,
        &g,
        &ins,
        &weights,
        &ExportOptions {
            weights_dtype: WeightsDtype::F16,
            ..Default::default()
        },
    );
    let const_bytes = |b: &[u8]| -> u64 {
        let e = export::read(b).unwrap();
        e.manifest
            .params
            .iter()
            .filter_map(|p| p.constant.as_ref())
            .map(|c| c.bytes)
            .sum()
    };
    assert_eq!(const_bytes(&half) * 2, const_bytes(&full));
    let e = export::read(&half).unwrap();
    assert!(e
        .manifest
        .params
        .iter()
        .filter_map(|p| p.constant.as_ref())
        .all(|c| c.stored == "f16"));
    let worst = first_output_drift(&s, &half, &full, &ins);
    assert!(
        worst <= 2e-2,
        "f16 weights moved results by {worst} of the largest"
    );
}

/// The largest difference between the first outputs of exports `a` and
/// `b` run on `ins`, over the largest magnitude of `b`'s (at least 1).
fn first_output_drift(s: &Session, a: &[u8], b: &[u8], ins: &[HostTensor]) -> f32 {
    let out = |bytes: &[u8]| -> Vec<f32> {
        let e = export::read(bytes).unwrap();
        let exe = s.load_exported(&e).unwrap();
        bytemuck::pod_collect_to_vec(&run_bytes(s, &exe, ins)[0])
    };
    let (x, y) = (out(a), out(b));
    let scale = y.iter().fold(1f32, |m, v| m.max(v.abs()));
    x.iter()
        .zip(&y)
        .map(|(p, q)| (p - q).abs() / scale)
        .fold(0f32, f32::max)
}

/// An f16 program exported on an adapter with `shader-f16` (lavapipe)
/// carries each converting kernel twice: its portable WGSL and a variant
/// with the adapter's own f16 conversions. Loaded where the feature is
/// (this adapter) the variants run; where it is not (the same adapter
/// opened without optional features) the portable kernels run; both give the same bits (lavapipe's f16 conversions round
/// to nearest even, as the integer ones do), and those of the program
/// compiled in memory.
#[test]
fn f16_kernels_carry_a_shader_f16_variant() {
    let gpu = gpu();
    assert!(gpu.native_f16(), "{} has no shader-f16", gpu.describe());
    let path = root().join("examples/programs/f16_layer.txt");
    let (g, ins, weights) = example(&path);
    let s = Session::new(gpu);
    let bytes = export_example(&s, &g, &ins, &weights, &ExportOptions::default());
    let e = export::read(&bytes).unwrap();
    let variants = e
        .manifest
        .kernels
        .iter()
        .filter(|k| k.wgsl_f16.is_some())
        .count();
    assert_eq!(
        variants,
        e.manifest.kernels.len(),
        "every kernel converts to f16"
    );
    for k in &e.manifest.kernels {
        let w = k.wgsl_f16.as_deref().unwrap();
        assert!(w.starts_with("enable f16;") && !k.wgsl.contains("enable f16"));
    }
    let plain = Gpu::open(|_| {}, kiln::engine::wgpu::Features::empty());
    let without = Session::new(Arc::new(pollster::block_on(plain).unwrap()));
    assert!(!without.gpu().native_f16());
    let in_memory = run_bytes(&s, &s.compile(&g).unwrap(), &ins);
    let exe = s.load_exported(&e).unwrap();
    assert_eq!(run_bytes(&s, &exe, &ins), in_memory, "with shader-f16");
    let exe = without.load_exported(&e).unwrap();
    assert_eq!(
        run_bytes(&without, &exe, &ins),
        in_memory,
        "without shader-f16"
    );
}

/// int8-stored weights (`--weights-dtype i8`): matrices as int8 with an
/// f32 scale per output channel and 64 inputs, vectors as f32: each
/// matrix a quarter of its bytes (this small program's constants 31%
/// with its vectors and scales), uploaded as stored (a byte an element on
/// the device), results near the f32 export's. A constant the program
/// writes is refused, as it is without quantization.
#[test]
fn int8_weights_quarter_the_constants() {
    let gpu = gpu();
    let path = root().join("examples/programs/mlp_block.txt");
    let (g, ins, weights) = example(&path);
    let s = Session::new(gpu);
    let int8 = ExportOptions {
        weights_dtype: WeightsDtype::I8,
        ..Default::default()
    };
    let full = export_example(&s, &g, &ins, &weights, &ExportOptions::default());
    let quarter = export_example(&s, &g, &ins, &weights, &int8);
    let constants = |b: &[u8]| -> Vec<(String, String, u64)> {
        let e = export::read(b).unwrap();
        e.manifest
            .params
            .iter()
            .filter_map(|p| {
                let c = p.constant.as_ref()?;
                Some((p.name.clone(), c.stored.clone(), c.bytes))
            })
            .collect()
    };
    let (f, q) = (constants(&full), constants(&quarter));
    let total = |c: &[(String, String, u64)]| c.iter().map(|x| x.2).sum::<u64>();
    assert!(
        total(&q) * 100 <= total(&f) * 32,
        "{} of {} bytes",
        total(&q),
        total(&f)
    );
    for (name, stored, bytes) in &f {
        let (_, qs, qb) = q.iter().find(|x| &x.0 == name).unwrap();
        let two_dims = g
            .inputs
            .iter()
            .any(|&v| g.values[v].name.as_deref() == Some(name) && g.meta(v).sizes.len() >= 2);
        if two_dims {
            assert_eq!((qs.as_str(), *qb * 4), ("i8", *bytes), "%{name}");
        } else {
            assert_eq!((qs, qb), (stored, bytes), "%{name}");
        }
    }
    let worst = first_output_drift(&s, &quarter, &full, &ins);
    assert!(
        worst <= 2e-2,
        "int8 weights moved results by {worst} of the largest"
    );
    // A program that writes its weight matrix cannot have it as a constant.
    let src = "graph w(%x: f32[4, 64], %w: f32[64, 64]) {\n  %u = add_(%w, 1.0)\n  %y = linear(%x, %w)\n  return %y\n}";
    let g = kiln::functionalize::parse(src).unwrap();
    let w = HostTensor::from_slice(&[64, 64], &[0.5f32; 4096]).unwrap();
    let err = export::export(&s, &g, &[("w".into(), w)], &int8).unwrap_err();
    assert!(err.to_string().contains("writes it"), "{err}");
}

/// One weights file serves exports of a model at several shapes (format
/// version 3): identical bytes from each export, the exports small, the
/// weights uploaded once to a session that loads both, results those of
/// the program compiled in memory; read without its weights file, or with
/// another, an export says so.
#[test]
fn exports_share_a_weights_file() {
    let gpu = gpu();
    let s = Session::new(gpu.clone());
    let src = |rows: usize| {
        format!(
            "graph lin(%x: f32[{rows}, 64], %w: f32[96, 64], %b: f32[96]) {{\n  %y = linear(%x, %w, %b)\n  %z = relu(%y)\n  return %z\n}}"
        )
    };
    let opts = ExportOptions {
        weights_dtype: WeightsDtype::F32,
        weights_file: Some("lin.weights".into()),
    };
    // (program, inputs, export, weights file) per shape.
    type Part = (Graph, Vec<HostTensor<'static>>, Vec<u8>, Vec<u8>);
    let mut parts: Vec<Part> = vec![];
    for rows in [4, 32] {
        let g = parse(&src(rows)).unwrap();
        let ins = kiln::functionalize::random::random_inputs(&g, rows as u64, 1.0);
        let mut ins: Vec<HostTensor> = ins.iter().map(HostTensor::from_rtensor).collect();
        // One model: the first shape's weights.
        if let Some(first) = parts.first() {
            ins[1] = first.1[1].clone();
            ins[2] = first.1[2].clone();
        }
        let w = vec![
            ("w".to_string(), ins[1].clone()),
            ("b".to_string(), ins[2].clone()),
        ];
        let (file, weights) = export::export_parts(&s, &g, &w, &opts).unwrap();
        assert!(
            export::export(&s, &g, &w, &opts).is_err(),
            "two files from one call"
        );
        parts.push((g, ins, file, weights));
    }
    assert!(parts[0].3 == parts[1].3, "the weights files differ");
    assert_eq!(parts[0].3.len(), 256 * (96 * 64 * 4 / 256) + 96 * 4);
    let blob = parts[0].3.clone();
    // Both forms of the load: the blocking one (shaders compile on threads
    // while the weights upload) and the browser's (pipelines asked for
    // first, every constant under one error scope).
    for asynchronous in [false, true] {
        let fresh = Session::new(gpu.clone());
        let before = fresh.totals().uploaded_bytes;
        for (g, ins, file, _) in &parts {
            // The program file carries its kernels' text, not the weights.
            let head = &blob[..1024];
            assert!(
                !file.windows(head.len()).any(|w| w == head),
                "the weights inside the program file"
            );
            assert_eq!(
                export::weights_of(file).unwrap().unwrap().file,
                "lin.weights"
            );
            let e = export::read(file).err().unwrap().to_string();
            assert!(
                e.contains("lin.weights") && e.contains("must be loaded"),
                "{e}"
            );
            let e = export::read_with(file, Some(&blob[..blob.len() - 4]))
                .err()
                .unwrap()
                .to_string();
            assert!(e.contains("not `lin.weights` as it was exported"), "{e}");
            let e = export::read_with(file, Some(&blob)).unwrap();
            let exe = if asynchronous {
                pollster::block_on(fresh.load_exported_async(&e)).unwrap()
            } else {
                fresh.load_exported(&e).unwrap()
            };
            assert_eq!(exe.input_params(), vec![0]);
            let got = run_bytes(&fresh, &exe, ins);
            let m = Session::new(gpu.clone());
            m.add_constant("w", &ins[1]).unwrap();
            m.add_constant("b", &ins[2]).unwrap();
            let mem = m.compile(g).unwrap();
            assert_eq!(got, run_bytes(&m, &mem, ins));
        }
        // The weights once, each run's x apart.
        let runs: u64 = (4 + 32) * 64 * 4;
        assert_eq!(
            fresh.totals().uploaded_bytes - before,
            (96 * 64 + 96) * 4 + runs
        );
    }
}

/// Errors say what is wrong: another format version, a device that lacks
/// what the kernels need, a constant that does not fit.
#[test]
fn refusals_say_why() {
    let gpu = gpu();
    let path = root().join("examples/programs/mlp_block.txt");
    let (g, ins, weights) = example(&path);
    let s = Session::new(gpu);
    let bytes = export_example(&s, &g, &ins, &weights, &ExportOptions::default());
    let mut v1 = bytes.clone();
    v1[8] = 1;
    let e = export::read(&v1).err().unwrap().to_string();
    assert!(
        e.contains("version 1") && e.contains("reads versions 2 and 3"),
        "{e}"
    );
    let e = export::read(&bytes[..100]).err().unwrap().to_string();
    assert!(e.contains("runs past the end"), "{e}");
    let e =
        export::read(b"not an export at all, but long enough to hold a header of eighty bytes....")
            .err()
            .unwrap()
            .to_string();
    assert!(e.contains("not a Kiln export"), "{e}");
    // A device without what the kernels need.
    let mut m = export::read(&bytes).unwrap().manifest;
    m.requires.max_storage_buffer_binding_size = u64::MAX;
    m.requires.features.push("subgroup-matrix".into());
    let hostile = with_manifest(&bytes, &serde_json::to_vec(&m).unwrap());
    let e = export::read(&hostile).unwrap();
    let err = s.load_exported(&e).err().unwrap().to_string();
    assert!(
        err.contains("subgroup-matrix") && err.contains("re-export"),
        "{err}"
    );
    // A constant pointing past the data.
    let mut m = export::read(&bytes).unwrap().manifest;
    let c = m
        .params
        .iter_mut()
        .find_map(|p| p.constant.as_mut())
        .unwrap();
    c.offset = 1 << 40;
    let e = export::read(&with_manifest(&bytes, &serde_json::to_vec(&m).unwrap()))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("does not fit"), "{e}");
    // A value of a dtype no runtime knows, and one too large to index.
    let mut m = export::read(&bytes).unwrap().manifest;
    m.values[0].dtype = "f64".into();
    let e = export::read(&with_manifest(&bytes, &serde_json::to_vec(&m).unwrap()))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("unknown dtype `f64`"), "{e}");
    let mut m = export::read(&bytes).unwrap().manifest;
    m.values[0].shape = vec![1 << 20, 1 << 20];
    let e = export::read(&with_manifest(&bytes, &serde_json::to_vec(&m).unwrap()))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("too many elements"), "{e}");
}

fn u64_at(b: &[u8], o: usize) -> usize {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap()) as usize
}

/// `bytes` with its manifest replaced (offsets and checksums rewritten,
/// the program and the data moved along): what a hostile writer can make.
fn with_manifest(bytes: &[u8], json: &[u8]) -> Vec<u8> {
    let (po, pl) = (u64_at(bytes, 36), u64_at(bytes, 44));
    let (d_o, dl) = (u64_at(bytes, 56), u64_at(bytes, 64));
    let text = &bytes[po..po + pl];
    let data = &bytes[d_o..d_o + dl];
    let mut out = bytes[..HEADER_LEN].to_vec();
    out.extend(json);
    let new_po = out.len();
    out.extend(text);
    let new_do = out.len().next_multiple_of(export::ALIGN);
    out.resize(new_do, 0);
    out.extend(data);
    out[24..32].copy_from_slice(&(json.len() as u64).to_le_bytes());
    out[32..36].copy_from_slice(&crc32fast::hash(json).to_le_bytes());
    out[36..44].copy_from_slice(&(new_po as u64).to_le_bytes());
    out[56..64].copy_from_slice(&(new_do as u64).to_le_bytes());
    fix_header(&mut out);
    out
}

fn fix_header(b: &mut [u8]) {
    if b.len() >= HEADER_LEN {
        let crc = crc32fast::hash(&b[..76]);
        b[76..80].copy_from_slice(&crc.to_le_bytes());
    }
}

/// Section checksums made right again after a mutation, so that the
/// checks behind them are reached too.
fn fix_checksums(b: &mut [u8]) {
    if b.len() < HEADER_LEN {
        return;
    }
    for (off, len, crc) in [(16, 24, 32), (36, 44, 52)] {
        let (o, l) = (u64_at(b, off), u64_at(b, len));
        if o.checked_add(l).is_some_and(|e| e <= b.len()) {
            let c = crc32fast::hash(&b[o..o + l]);
            b[crc..crc + 4].copy_from_slice(&c.to_le_bytes());
        }
    }
    fix_header(b);
}

/// SplitMix64.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// One mutation of `b`: bit flips, a truncation, a changed length or
/// offset in the header, bytes spliced from another export, a digit of
/// the manifest changed; then, half the time, checksums made right.
fn mutate(r: &mut Rng, b: &[u8], other: &[u8]) -> Vec<u8> {
    let mut m = b.to_vec();
    match r.below(6) {
        0 => {
            for _ in 0..1 + r.below(8) {
                let i = r.below(m.len());
                m[i] ^= 1 << r.below(8);
            }
        }
        1 => m.truncate(r.below(m.len())),
        2 => {
            let field = [16, 24, 36, 44, 56, 64][r.below(6)];
            let v = match r.below(4) {
                0 => u64::MAX - r.below(1000) as u64,
                1 => r.next(),
                2 => u64_at(&m, field) as u64 + r.below(512) as u64,
                _ => (u64_at(&m, field) as u64).saturating_sub(r.below(512) as u64),
            };
            m[field..field + 8].copy_from_slice(&v.to_le_bytes());
        }
        3 => {
            let (len, at, from) = (1 + r.below(256), r.below(m.len()), r.below(other.len()));
            for k in 0..len {
                if at + k < m.len() && from + k < other.len() {
                    m[at + k] = other[from + k];
                }
            }
        }
        4 => {
            // A number in the manifest: counts, offsets, sizes, indices.
            let (o, l) = (u64_at(&m, 16), u64_at(&m, 24));
            let digits: Vec<usize> = (o..o + l).filter(|&i| m[i].is_ascii_digit()).collect();
            if !digits.is_empty() {
                let i = digits[r.below(digits.len())];
                m[i] = b'0' + r.below(10) as u8;
            }
        }
        _ => {
            // A character of the program text.
            let (o, l) = (u64_at(&m, 36), u64_at(&m, 44));
            if l > 0 {
                let i = o + r.below(l);
                m[i] = b"%(),[]0123456789abcxyz_ "[r.below(24)];
            }
        }
    }
    if r.below(2) == 0 {
        fix_checksums(&mut m);
    }
    m
}

#[test]
fn damaged_exports_are_errors_not_panics() {
    let cases: usize = std::env::var("KILN_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400);
    let gpu = gpu();
    let s = Session::new(gpu);
    let seeds: Vec<Vec<u8>> = [
        "mlp_block",
        "decode_step",
        "llama_block",
        "index_put_accumulate",
    ]
    .iter()
    .map(|n| {
        let (g, ins, w) = example(&root().join(format!("examples/programs/{n}.txt")));
        export_example(&s, &g, &ins, &w, &ExportOptions::default())
    })
    .collect();
    let mut r = Rng(0x6b696c6e);
    let (mut read_ok, mut loaded) = (0, 0);
    let mut ls = Session::new(s.gpu().clone());
    for case in 0..cases {
        let b = &seeds[case % seeds.len()];
        let other = &seeds[(case + 1) % seeds.len()];
        let m = mutate(&mut r, b, other);
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            match export::read(&m) {
                Ok(e) => {
                    // Structurally sound: loading must still be safe (a
                    // hostile value within range loads or is refused). A
                    // session shared by 256 files: its pipeline cache
                    // compiles only the shaders mutation changed (a fresh
                    // session per file recompiles every kernel, 120 ms a
                    // file on lavapipe) yet does not keep every mutated
                    // shader's pipeline for the whole run.
                    if read_ok % 256 == 255 {
                        ls = Session::new(s.gpu().clone());
                    }
                    let loaded = ls.load_exported(&e).is_ok();
                    // Uploads wait in the queue for the next submission
                    // and dropped buffers are freed only once it is done:
                    // without a submit and a poll a long run keeps every
                    // file's constants.
                    s.gpu().queue.submit([]);
                    let _ = s.gpu().device.poll(wgpu::PollType::wait_indefinitely());
                    (true, loaded)
                }
                Err(ExportError::Engine(e)) => panic!("read gave an engine error: {e}"),
                Err(_) => (false, false),
            }
        }));
        match outcome {
            Ok((r_ok, l_ok)) => {
                read_ok += r_ok as usize;
                loaded += l_ok as usize;
            }
            Err(_) => {
                let path = std::env::temp_dir().join(format!("kiln-fuzz-{case}.kiln"));
                std::fs::write(&path, &m).unwrap();
                panic!("case {case} panicked; the file is {}", path.display());
            }
        }
    }
    eprintln!("{cases} damaged exports: {read_ok} read as sound, {loaded} loaded, 0 panics");
}
