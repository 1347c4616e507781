//! `torch.export` archives (`../shared/spec/import.md`): every model under
//! `tests/fixtures/import/` (made by `tests/torch_ref/
//! make_import_fixtures.py`) run from its `.pt2` on the reference and on
//! the GPU (lavapipe in CI), in both functionalization modes, against what
//! eager PyTorch computed: outputs, mutated buffers and user inputs. Then
//! the refusals, the command line (`import`, `export` of a `.pt2`,
//! `kiln-run`) and damaged archives (never a panic).

mod common;

use common::{kiln, root};
use kiln::functionalize::{functionalize, Graph, RTensor, Remove};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Kiln's results against eager PyTorch's, for every model: within
/// `ABS + REL * |want|`. Both sum in f32 in different orders (convolution
/// as a product of unfolded windows, batch norm as a scale and shift), and
/// the errors stay below a few 1e-6 relative.
const ABS: f64 = 1e-5;
const REL: f64 = 1e-4;

fn dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("kiln-import-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn models() -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(root().join("tests/fixtures/import"))
        .unwrap()
        .filter_map(|e| {
            let n = e.unwrap().file_name().to_string_lossy().into_owned();
            n.strip_suffix(".pt2").map(str::to_string)
        })
        .collect();
    out.sort();
    assert!(out.len() >= 17, "fixtures missing: {out:?}");
    out
}

fn fixture(name: &str, suffix: &str) -> PathBuf {
    root().join(format!("tests/fixtures/import/{name}{suffix}"))
}

/// The tensors of `got` against `want`: the same names, dtypes, shapes,
/// and values within the tolerance.
fn compare(got: &[(String, RTensor)], want: &[(String, RTensor)]) -> Result<(), String> {
    let gn: Vec<&String> = got.iter().map(|x| &x.0).collect();
    let wn: Vec<&String> = want.iter().map(|x| &x.0).collect();
    if gn != wn {
        return Err(format!("wrote {gn:?}, PyTorch's file has {wn:?}"));
    }
    for ((n, a), (_, b)) in got.iter().zip(want) {
        common::same_type(n, a, b)?;
        for (i, (x, y)) in a.values().iter().zip(b.values()).enumerate() {
            let ok = (x - y).abs() <= ABS + REL * y.abs() || (x.is_nan() && y.is_nan());
            if !ok {
                return Err(format!("{n}[{i}]: {x}, PyTorch {y}"));
            }
        }
    }
    Ok(())
}

/// Runs a fixture's archive through `kiln::import` (the `run` command's
/// path) and compares with PyTorch's file.
fn check(name: &str, mode: Option<Remove>, gpu: bool) -> Result<(), String> {
    let imp = kiln::import::open(&fixture(name, ".pt2")).map_err(|e| e.to_string())?;
    check_import(name, imp, mode, gpu)
}

fn check_import(
    name: &str,
    imp: kiln::import::Imported,
    mode: Option<Remove>,
    gpu: bool,
) -> Result<(), String> {
    let g: Graph = match mode {
        Some(m) => {
            functionalize(&imp.graph, m)
                .map_err(|e| e.to_string())?
                .graph
        }
        None => imp.graph.clone(),
    };
    let out = dir().join(format!("{name}-{mode:?}-{gpu}.safetensors"));
    kiln::import::run(&imp, &g, &fixture(name, ".inputs.safetensors"), &out, gpu)?;
    let got = kiln::io::load_all(&out).map_err(|e| e.to_string())?;
    let want =
        kiln::io::load_all(&fixture(name, ".expected.safetensors")).map_err(|e| e.to_string())?;
    compare(&got, &want)
}

fn check_all(modes: &[Option<Remove>], gpu: bool) {
    let mut failures = vec![];
    let names = models();
    for name in &names {
        for &m in modes {
            if let Err(e) = check(name, m, gpu) {
                failures.push(format!("{name} ({m:?}): {e}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} runs differ from PyTorch:\n{}",
        failures.len(),
        names.len() * modes.len(),
        failures.join("\n")
    );
}

#[test]
fn every_model_matches_pytorch_on_the_reference() {
    check_all(
        &[
            None,
            Some(Remove::Mutations),
            Some(Remove::MutationsAndViews),
        ],
        false,
    );
    // As `kiln import` prints it: no batch norm folded.
    let failures: Vec<String> = models()
        .iter()
        .filter_map(|name| {
            let imp = kiln::import::open_as_exported(&fixture(name, ".pt2"));
            let r = imp
                .map_err(|e| e.to_string())
                .and_then(|imp| check_import(name, imp, None, false));
            r.err().map(|e| format!("{name} (as exported): {e}"))
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Folding batch norms into convolutions leaves fewer parameters and
/// statements, and no batch norm.
#[test]
fn batch_norms_fold_into_convolutions() {
    for name in ["tiny_resnet", "mobilenet_v2", "efficientnet", "regnet"] {
        let p = fixture(name, ".pt2");
        let (f, e) = (
            kiln::import::open(&p).unwrap(),
            kiln::import::open_as_exported(&p).unwrap(),
        );
        assert!(f.text.contains("_folded_weight"), "{name}: nothing folded");
        assert!(
            !f.text.contains("batch_norm"),
            "{name}: a batch norm is left:\n{}",
            f.text
        );
        assert!(e.text.contains("batch_norm"), "{name}");
        assert!(f.roles.len() < e.roles.len(), "{name}: no weight dropped");
    }
}

/// Every model compiles for GPUs and browsers (the default options:
/// WebGPU's 8 storage buffers a kernel, launches shared), whatever adapter
/// runs the tests; kernel counts printed (`--nocapture`).
#[test]
fn every_model_compiles_for_gpus_and_browsers() {
    let mut failures = vec![];
    for name in models() {
        let imp = kiln::import::open(&fixture(&name, ".pt2")).unwrap();
        match kiln::engine::compile(&imp.graph) {
            Ok(p) => {
                assert!(p.kernels.iter().all(|k| k.code.bindings.len() <= 8));
                println!("{name}: {} kernels", p.kernels.len());
            }
            Err(e) => failures.push(format!("{name}: {e}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_model_matches_pytorch_on_the_gpu() {
    // The compiler functionalizes (no views) itself; `mutations` first
    // checks that its program compiles to the same results.
    check_all(&[None, Some(Remove::Mutations)], true);
}

/// And on the kernels a GPU-class adapter gets (grid-stride loops,
/// workgroup rows, tiles, shared launches), which lavapipe's own options
/// do not make: the H200 run of 2026-11-28 found `views_in_place` wrong
/// there only.
#[test]
fn every_model_matches_pytorch_with_the_gpu_variants() {
    let mut failures = vec![];
    let names = models();
    for name in &names {
        let imp = kiln::import::open(&fixture(name, ".pt2")).unwrap();
        let out = dir().join(format!("{name}-variants.safetensors"));
        let session = common::gpu_variant_session();
        let r = kiln::import::run_on(
            &imp,
            &imp.graph,
            &fixture(name, ".inputs.safetensors"),
            &out,
            Some(&session),
        )
        .and_then(|()| {
            let got = kiln::io::load_all(&out).map_err(|e| e.to_string())?;
            let want = kiln::io::load_all(&fixture(name, ".expected.safetensors"))
                .map_err(|e| e.to_string())?;
            compare(&got, &want)
        });
        if let Err(e) = r {
            failures.push(format!("{name}: {e}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} models differ from PyTorch:\n{}",
        failures.len(),
        names.len(),
        failures.join("\n")
    );
}

/// Each archive under `refused/` is refused with an error holding every
/// line of its `.expect` file.
#[test]
fn unsupported_archives_are_refused_clearly() {
    let d = root().join("tests/fixtures/import/refused");
    let mut n = 0;
    for e in std::fs::read_dir(&d).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_none_or(|x| x != "pt2") {
            continue;
        }
        n += 1;
        let expect = std::fs::read_to_string(p.with_extension("expect")).unwrap();
        let err = match kiln::import::open(&p) {
            Ok(_) => panic!("{}: imported", p.display()),
            Err(e) => e.to_string(),
        };
        for line in expect.lines().filter(|l| !l.is_empty()) {
            assert!(
                err.contains(line),
                "{}: `{line}` not in: {err}",
                p.display()
            );
        }
    }
    assert!(n >= 4, "refused fixtures missing");
}

/// `kiln import` writes a program and its weights that run like the
/// archive; `kiln export` of the archive needs no weights, and `kiln-run`
/// runs the export.
#[test]
fn import_and_export_from_the_command_line() {
    let name = "small_cnn_cache";
    let pt2 = fixture(name, ".pt2");
    let prog = dir().join("small.txt");
    let w = dir().join("small_weights.safetensors");
    let (ok, _, err) = kiln(&[
        "import",
        s(&pt2),
        "--output",
        s(&prog),
        "--weights-output",
        s(&w),
    ]);
    assert!(ok, "{err}");
    assert!(err.contains("10 weights, 2 inputs"), "{err}");
    let text = std::fs::read_to_string(&prog).unwrap();
    assert!(
        text.contains("%p_conv_weight: f32[8, 3, 3, 3]")
            && text.contains("%x: f32[2, 3, 8, 8], %idx: i64[2])")
            && text.contains("index_copy_(%b_cache, 0, %idx, %flatten)"),
        "{text}"
    );
    // The printed program with its weights file: the same as the archive.
    let mut ins = kiln::io::load_all(&w).unwrap();
    ins.extend(kiln::io::load_all(&fixture(name, ".inputs.safetensors")).unwrap());
    let all_in = dir().join("small_all_inputs.safetensors");
    kiln::io::save_all(&all_in, &ins).unwrap();
    let o = dir().join("small_prog_out.safetensors");
    let (ok, _, err) = kiln(&["run", s(&prog), "--inputs", s(&all_in), "--output", s(&o)]);
    assert!(ok, "{err}");
    let want = kiln::io::load_all(&fixture(name, ".expected.safetensors")).unwrap();
    let find =
        |n: &str, from: &[(String, RTensor)]| from.iter().find(|x| x.0 == n).unwrap().1.clone();
    // The output and the written buffer (named by parameter in a program
    // or an export, by state-dict name in PyTorch's file).
    let same_as_pytorch = |out: &Path| {
        let got = kiln::io::load_all(out).unwrap();
        let pick = |from: &[(String, RTensor)], cache: &str| {
            vec![
                ("output.0".to_string(), find("output.0", from)),
                ("cache".to_string(), find(cache, from)),
            ]
        };
        compare(&pick(&got, "b_cache"), &pick(&want, "cache")).unwrap();
    };
    same_as_pytorch(&o);
    // Every command reads the archive.
    for cmd in [
        &["print", s(&pt2)][..],
        &["functionalize", s(&pt2), "--remove", "mutations_and_views"],
        &["compile", s(&pt2)],
        &["vjp", s(&pt2), "--wrt", "p_fc_weight"],
    ] {
        let (ok, out, err) = kiln(cmd);
        assert!(ok && !out.is_empty(), "{cmd:?}: {err}");
    }
    // `profile` with the user inputs alone: the buffer the program writes
    // starts from the archive's value, as in `run`.
    let inputs = fixture(name, ".inputs.safetensors");
    let (ok, out, err) = kiln(&[
        "profile",
        s(&pt2),
        "--inputs",
        s(&inputs),
        "--runs",
        "1",
        "--json",
    ]);
    assert!(ok && out.contains("kernels_ms"), "profile: {err}");
    // Export without --weights: the archive's weights are constants.
    let model = dir().join("small.kiln");
    let (ok, _, err) = kiln(&["export", s(&pt2), "--output", s(&model)]);
    assert!(ok, "{err}");
    let (ok, out, err) = kiln(&["inspect", s(&model)]);
    assert!(ok, "{err}");
    // The batch norm folded into the convolution: its weight replaces the
    // archive's.
    assert!(
        out.contains("%conv2d_folded_weight: f32[8, 3, 3, 3]  constant")
            && !out.contains("%p_conv_weight"),
        "{out}"
    );
    // kiln-run (the runtime alone) on the export: the buffer the program
    // writes is an input of the export, by parameter name.
    let kr = common::kiln_run_exe();
    let o = dir().join("small_kiln_run.safetensors");
    let mut ins = kiln::io::load_all(&fixture(name, ".inputs.safetensors")).unwrap();
    ins.push((
        "b_cache".into(),
        find("b_cache", &kiln::io::load_all(&w).unwrap()),
    ));
    let kr_in = dir().join("small_kiln_run_inputs.safetensors");
    kiln::io::save_all(&kr_in, &ins).unwrap();
    let out = Command::new(&kr)
        .args([s(&model), "--inputs", s(&kr_in), "--output", s(&o)])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    same_as_pytorch(&o);
}

/// An archive's entries: (name, bytes).
type Entries = Vec<(String, Vec<u8>)>;

/// The archive's entries (name, bytes), to rebuild changed copies.
fn entries(bytes: &[u8]) -> Entries {
    let mut z = zip::ZipArchive::new(std::io::Cursor::new(bytes)).unwrap();
    (0..z.len())
        .map(|i| {
            let mut f = z.by_index(i).unwrap();
            let mut v = vec![];
            std::io::Read::read_to_end(&mut f, &mut v).unwrap();
            (f.name().unwrap().to_string(), v)
        })
        .collect()
}

fn rezip(entries: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut w = zip::ZipWriter::new(std::io::Cursor::new(vec![]));
    let opts =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for (n, b) in entries {
        w.start_file(n.as_str(), opts).unwrap();
        std::io::Write::write_all(&mut w, b).unwrap();
    }
    w.finish().unwrap().into_inner()
}

/// Imports `bytes` as an archive and, when that succeeds, runs the program
/// on the reference with zero inputs: an error or a result, no panic.
fn try_import(path: &Path, bytes: &[u8]) -> Result<(), String> {
    std::fs::write(path, bytes).unwrap();
    let imp = kiln::import::open(path).map_err(|e| e.to_string())?;
    let ins = imp
        .graph
        .inputs
        .iter()
        .map(|&v| {
            let m = imp.graph.meta(v);
            RTensor::new(m.dtype, m.sizes.clone(), &vec![0.0; m.numel()])
        })
        .collect();
    kiln::functionalize::interp::run(&imp.graph, ins)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

#[test]
fn damaged_archives_are_refused_clearly() {
    let good = std::fs::read(fixture("small_cnn_cache", ".pt2")).unwrap();
    let p = dir().join("damaged.pt2");
    let e = entries(&good);
    let with = |f: &dyn Fn(&mut Entries)| {
        let mut e = e.clone();
        f(&mut e);
        rezip(&e)
    };
    let json_edit = |name: &str, from: &str, to: &str| {
        with(&|e| {
            let x = e.iter_mut().find(|x| x.0.ends_with(name)).unwrap();
            let t = String::from_utf8(x.1.clone()).unwrap();
            assert!(t.contains(from), "{from}");
            x.1 = t.replacen(from, to, 1).into_bytes();
        })
    };
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "truncated",
            good[..good.len() / 2].to_vec(),
            "not a PT2 archive",
        ),
        ("not a zip", b"graph f() {}".to_vec(), "not a PT2 archive"),
        (
            "a weight's byte flipped",
            {
                let mut b = good.clone();
                let mut z = zip::ZipArchive::new(std::io::Cursor::new(&good[..])).unwrap();
                let i = (0..z.len())
                    .find(|&i| {
                        z.name_for_index(i)
                            .unwrap()
                            .unwrap()
                            .ends_with("weights/weight_0")
                    })
                    .unwrap();
                let at = z.by_index_raw(i).unwrap().data_start().unwrap() as usize;
                b[at + 5] ^= 0x10;
                b
            },
            "CRC",
        ),
        (
            "weight removed",
            with(&|e| e.retain(|x| !x.0.ends_with("data/weights/weight_0"))),
            "is missing from the archive",
        ),
        (
            "weight resized",
            with(&|e| {
                let x = e
                    .iter_mut()
                    .find(|x| x.0.ends_with("data/weights/weight_0"))
                    .unwrap();
                x.1.truncate(x.1.len() - 4)
            }),
            "needs 864 bytes, its data holds 860",
        ),
        (
            "unknown schema major",
            json_edit("models/model.json", "\"major\": 8", "\"major\": 99"),
            "schema version 99",
        ),
        (
            "foreign zip",
            rezip(&[("a/readme.txt".into(), b"hello".to_vec())]),
            "not a PT2 archive",
        ),
    ];
    for (what, bytes, want) in cases {
        match try_import(&p, &bytes) {
            Ok(()) => panic!("{what}: accepted"),
            Err(e) => assert!(e.contains(want), "{what}: `{want}` not in: {e}"),
        }
    }
}

/// A tiny deterministic generator (xorshift).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// A random change to one JSON value: a number, string, list or object
/// replaced, or a key removed.
fn mutate_json(v: &mut serde_json::Value, r: &mut Rng) {
    use serde_json::Value;
    let deeper = r.below(4) != 0;
    match v {
        Value::Object(m) if deeper && !m.is_empty() => {
            let k = m.keys().nth(r.below(m.len())).unwrap().clone();
            if r.below(8) == 0 {
                m.remove(&k);
            } else {
                mutate_json(m.get_mut(&k).unwrap(), r);
            }
        }
        Value::Array(a) if deeper && !a.is_empty() => {
            let i = r.below(a.len());
            if r.below(8) == 0 {
                a.remove(i);
            } else {
                mutate_json(&mut a[i], r);
            }
        }
        _ => {
            *v = match r.below(8) {
                0 => Value::from(-1),
                1 => Value::from(1u64 << 40),
                2 => Value::from(0),
                3 => Value::from("x"),
                4 => Value::Null,
                5 => Value::Array(vec![]),
                6 => Value::from(2.5),
                _ => Value::from(r.below(6) as i64),
            }
        }
    }
}

/// The fuzz test: damaged copies of an archive (bits flipped, truncated,
/// JSON values changed, weight entries removed or resized) are imported
/// and, when accepted, run: an error or a sound result, never a panic.
/// `KILN_IMPORT_FUZZ_CASES` sets the count (300 by default; the long run
/// in docs/import.md used 100,000).
#[test]
fn damaged_archives_never_panic() {
    let cases: usize = std::env::var("KILN_IMPORT_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let good = std::fs::read(fixture("small_cnn_cache", ".pt2")).unwrap();
    let e = entries(&good);
    let p = dir().join("fuzz.pt2");
    let mut r = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut refused, mut accepted) = (0, 0);
    let json_entries: Vec<usize> = (0..e.len())
        .filter(|&i| e[i].0.ends_with(".json"))
        .collect();
    let weight_entries: Vec<usize> = (0..e.len())
        .filter(|&i| e[i].0.contains("/data/weights/weight_"))
        .collect();
    for case in 0..cases {
        let bytes = match r.below(5) {
            0 => {
                let mut b = good.clone();
                for _ in 0..1 + r.below(4) {
                    let at = r.below(b.len());
                    b[at] ^= 1 << r.below(8);
                }
                b
            }
            1 => good[..r.below(good.len())].to_vec(),
            2 | 3 => {
                let mut e = e.clone();
                let i = json_entries[r.below(json_entries.len())];
                let mut v: serde_json::Value = serde_json::from_slice(&e[i].1).unwrap();
                for _ in 0..1 + r.below(3) {
                    mutate_json(&mut v, &mut r);
                }
                e[i].1 = serde_json::to_vec(&v).unwrap();
                rezip(&e)
            }
            _ => {
                let mut e = e.clone();
                let i = weight_entries[r.below(weight_entries.len())];
                match r.below(3) {
                    0 => {
                        e.remove(i);
                    }
                    1 => {
                        let n = r.below(e[i].1.len() + 1);
                        e[i].1.truncate(n);
                    }
                    _ => e[i].1.extend(std::iter::repeat_n(7u8, 1 + r.below(16))),
                }
                rezip(&e)
            }
        };
        let res = std::panic::catch_unwind(|| try_import(&p, &bytes));
        match res {
            Ok(Ok(())) => accepted += 1,
            Ok(Err(msg)) => {
                assert!(!msg.is_empty(), "case {case}: an empty error");
                refused += 1
            }
            Err(_) => {
                let keep = dir().join(format!("fuzz-panic-{case}.pt2"));
                std::fs::write(&keep, &bytes).unwrap();
                panic!("case {case} panicked (archive kept at {})", keep.display());
            }
        }
    }
    eprintln!("{cases} damaged archives: {refused} refused, {accepted} accepted and run");
    assert!(refused > 0 && accepted > 0);
}

/// PyTorch names an archive's folder after its file, so a name's length
/// moves every offset in it: names of every length from 1 to 40
/// characters read and run (8, `resnet18.pt2`, once broke the zip
/// reader's guess of where the archive starts).
#[test]
fn archives_named_with_every_length_run() {
    let d = root().join("tests/fixtures/import/names");
    let want = kiln::io::load_all(&d.join("expected.safetensors")).unwrap();
    let mut failures = vec![];
    for n in 1..=40 {
        let pt2 = d.join(format!("{}.pt2", "n".repeat(n)));
        let r = kiln::import::open(&pt2)
            .map_err(|e| e.to_string())
            .and_then(|imp| {
                let out = dir().join(format!("names-{n}.safetensors"));
                kiln::import::run(&imp, &imp.graph, &d.join("inputs.safetensors"), &out, false)?;
                compare(&kiln::io::load_all(&out).map_err(|e| e.to_string())?, &want)
            });
        if let Err(e) = r {
            failures.push(format!("{n} characters: {e}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
