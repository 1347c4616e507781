//! Run a torchvision classifier exported with `torch.export` on the GPU and
//! print its top-5 classes beside PyTorch's.
//!
//!     cargo run --release --example classify [MODEL.pt2 INPUTS.safetensors EXPECTED.safetensors]
//!
//! Without arguments: the MobileNetV2 fixture (random weights, made by
//! `tests/torch_ref/make_import_fixtures.py` with PyTorch's output beside
//! it). With a model of your own: `torch.export.save(torch.export.export(
//! model.eval(), (x,)), "model.pt2")`, the input `x` in a safetensors file
//! under its argument name, and PyTorch's logits as `output.0` (optional).

use kiln::engine::{Fetch, Input, Session};
use std::path::PathBuf;

fn top5(logits: &[f64]) -> Vec<(usize, f64)> {
    let mut idx: Vec<usize> = (0..logits.len()).collect();
    idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    idx.into_iter().take(5).map(|i| (i, logits[i])).collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/import");
    let args: Vec<PathBuf> = std::env::args().skip(1).map(PathBuf::from).collect();
    let (model, inputs, expected) = match args.as_slice() {
        [] => (
            root.join("mobilenet_v2.pt2"),
            root.join("mobilenet_v2.inputs.safetensors"),
            Some(root.join("mobilenet_v2.expected.safetensors")),
        ),
        [m, i] => (m.clone(), i.clone(), None),
        [m, i, e] => (m.clone(), i.clone(), Some(e.clone())),
        _ => {
            return Err(
                "usage: classify [MODEL.pt2 INPUTS.safetensors [EXPECTED.safetensors]]".into(),
            )
        }
    };

    // The archive as a program, its weights memory-mapped.
    let t = std::time::Instant::now();
    let imp = kiln::import::open(&model)?;
    let import_ms = t.elapsed().as_secs_f64() * 1e3;
    let g = &imp.graph;

    // Weights are session constants, uploaded once; the image is an input.
    let session = Session::open()?;
    for (n, w) in imp.constants(g)? {
        session.add_constant(&n, &w)?;
    }
    let t = std::time::Instant::now();
    let exe = session.compile(g)?;
    let compile_ms = t.elapsed().as_secs_f64() * 1e3;
    let file = kiln::io::MappedTensors::open(&inputs)?;
    let feeds = file.inputs_for(g, &|i| imp.is_weight(i))?;
    let ins: Vec<Input> = feeds.iter().map(Input::Host).collect();
    let r = session.run(&exe, &ins, &exe.options(Fetch::Host, Fetch::Skip))?;
    let kernels = r.stats.kernels;
    let logits = r
        .outputs
        .into_iter()
        .next()
        .and_then(|o| o.host())
        .ok_or("the model returned nothing")?
        .to_rtensor()
        .values();

    println!(
        "{} on {} ({} kernels; import {import_ms:.0} ms, compile {compile_ms:.0} ms)",
        model.display(),
        session.gpu().describe(),
        kernels
    );
    let theirs = match &expected {
        Some(e) => kiln::io::load_all(e)?
            .into_iter()
            .find(|(n, _)| n == "output.0")
            .map(|(_, t)| t.values()),
        None => None,
    };
    let classes = g.meta(g.outputs[0]).sizes.last().copied().unwrap_or(1);
    for (b, row) in logits.chunks(classes).enumerate() {
        println!(
            "image {b}: class (logit)   Kiln{}",
            if theirs.is_some() {
                "              PyTorch"
            } else {
                ""
            }
        );
        let ours = top5(row);
        let ref5 = theirs
            .as_ref()
            .map(|t| top5(&t[b * classes..(b + 1) * classes]));
        for k in 0..ours.len() {
            let (c, l) = ours[k];
            match &ref5 {
                Some(p) => println!(
                    "  #{}  {c:4} ({l:+.6})   {:4} ({:+.6})",
                    k + 1,
                    p[k].0,
                    p[k].1
                ),
                None => println!("  #{}  {c:4} ({l:+.6})", k + 1),
            }
        }
    }
    Ok(())
}
