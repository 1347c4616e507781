//! The training example (`examples/train_mlp.rs`): 20 SGD steps of the
//! compiled step program on the GPU (weights kept on the device through
//! the `copy_` epilogue) and on the reference, against PyTorch eager's
//! losses on the same data and initial weights
//! (`tests/fixtures/train_mlp_losses.json`, made by
//! `tests/torch_ref/train_mlp.py`).

#[path = "../examples/train_mlp.rs"]
mod train_mlp;

fn torch_losses() -> Vec<f64> {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/train_mlp_losses.json");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    v["losses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

#[test]
fn the_step_program_is_functional_with_an_epilogue() {
    let step = train_mlp::step_program(0.5).unwrap();
    let f = kiln::functionalize(&step, kiln::Remove::MutationsAndViews).unwrap();
    let text = kiln::print(&f.graph);
    // The four weights are written back, nothing else is mutated.
    assert_eq!(
        f.mutated_inputs.iter().map(|m| m.input).collect::<Vec<_>>(),
        vec![0, 1, 2, 3]
    );
    assert_eq!(text.matches("copy_(").count(), 4, "{text}");
    assert!(!text.contains("sub_("), "{text}");
}

#[test]
fn training_on_the_gpu_follows_pytorch() {
    let want = torch_losses();
    let step = train_mlp::step_program(0.5).unwrap();
    let reference = train_mlp::train_reference(&step, want.len()).unwrap();
    let session = kiln::engine::Session::open()
        .unwrap_or_else(|e| panic!("the GPU tests need a wgpu adapter: {e}"));
    let (gpu, _) = train_mlp::train_gpu(&session, &step, want.len()).unwrap();
    for (i, w) in want.iter().enumerate() {
        assert!(
            (reference[i] - w).abs() <= 1e-5 * (1.0 + w.abs()),
            "step {i}: reference {} vs PyTorch {w}",
            reference[i]
        );
        assert!(
            (gpu[i] - w).abs() <= 1e-5 * (1.0 + w.abs()),
            "step {i}: GPU {} vs PyTorch {w}",
            gpu[i]
        );
    }
    assert!(want[want.len() - 1] < 0.6 * want[0], "the loss falls");
}

#[path = "../examples/finetune_minilm.rs"]
mod finetune_minilm;

/// MiniLM's last layer fine-tuned on the GPU for 4 steps: PyTorch's losses
/// (sentence-transformers, `tests/fixtures/finetune_minilm_losses.json`).
#[test]
fn minilm_fine_tuning_on_the_gpu_follows_pytorch() {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/finetune_minilm_losses.json");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    let want: Vec<f64> = v["losses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    let lr = v["lr"].as_f64().unwrap();
    let dir = kiln::minilm::fetch(None).unwrap_or_else(|e| panic!("fetching the model: {e}"));
    let mut model = kiln::minilm::MiniLm::load(&dir).unwrap();
    let (step, ins) = finetune_minilm::setup(&mut model, lr).unwrap();
    // Only the last layer is written back.
    let f = kiln::functionalize(&step, kiln::Remove::MutationsAndViews).unwrap();
    assert_eq!(f.mutated_inputs.len(), finetune_minilm::last_layer().len());
    let session = kiln::engine::Session::open()
        .unwrap_or_else(|e| panic!("the GPU tests need a wgpu adapter: {e}"));
    let (gpu, _) = finetune_minilm::train_gpu(&session, &step, &ins, want.len()).unwrap();
    for (i, w) in want.iter().enumerate() {
        assert!(
            (gpu[i] - w).abs() <= 1e-5 * (1.0 + w.abs()),
            "step {i}: GPU {} vs PyTorch {w}",
            gpu[i]
        );
    }
}
