//! Batch norm folded into the convolution before it, at import: when an
//! eval-mode `batch_norm` (or `_native_batch_norm_legit_no_training`)
//! reads a convolution's result and nothing else does, and its statistics
//! and affine are stored tensors the program never writes, the
//! convolution's weight is scaled per output channel and its bias made
//! (`W' = W * s`, `b' = (b - mean) * s + beta`, `s = gamma / sqrt(var +
//! eps)`, in f64 then rounded to the weight's dtype, as
//! `torch.fx`'s `fuse_conv_bn_eval` does), and the batch norm becomes the
//! convolution's result. A run then does one product per convolution and
//! no per-channel scale and shift.

use super::archive::Archive;
use super::convert::{Node, A};
use kiln_functionalize::DType;
use std::collections::{HashMap, HashSet};

/// A convolution whose weight and bias the import replaces.
pub struct Fold {
    /// The folded weight and bias (little-endian bytes of `dtype`).
    pub weight: Vec<u8>,
    pub bias: Vec<u8>,
    pub dtype: DType,
    pub weight_sizes: Vec<usize>,
    /// The batch norm's result, which is the convolution's from now on.
    pub norm_output: String,
    /// The batch norm node (written as nothing).
    pub norm_node: String,
}

/// The folds of a graph: by convolution node name.
pub fn plan(
    a: &Archive,
    nodes: &[Node],
    weights: &HashMap<String, String>,
    written: &HashSet<String>,
) -> HashMap<String, Fold> {
    // How many times each tensor is read (outputs count as reads).
    let mut reads: HashMap<&str, usize> = HashMap::new();
    for n in nodes {
        for (_, arg) in &n.args {
            match arg {
                A::Tensor(t) => *reads.entry(t.as_str()).or_default() += 1,
                A::Tensors(l) => l
                    .iter()
                    .flatten()
                    .for_each(|t| *reads.entry(t.as_str()).or_default() += 1),
                _ => {}
            }
        }
    }
    let producer: HashMap<&str, &Node> = nodes
        .iter()
        .flat_map(|n| n.outputs.iter().flatten().map(move |o| (o.as_str(), n)))
        .collect();
    let mut folds = HashMap::new();
    for bn in nodes {
        let eval = match bn.op.as_str() {
            "_native_batch_norm_legit_no_training" => true,
            "batch_norm" => matches!(bn.get("training"), Some(A::Bool(false))),
            _ => false,
        };
        // Its saved statistics must be unused.
        if !eval
            || bn
                .outputs
                .iter()
                .skip(1)
                .flatten()
                .any(|o| reads.contains_key(o.as_str()))
        {
            continue;
        }
        let Some(Some(out)) = bn.outputs.first() else {
            continue;
        };
        let Some(A::Tensor(x)) = bn.get("input") else {
            continue;
        };
        let Some(conv) = producer.get(x.as_str()) else {
            continue;
        };
        if reads.get(x.as_str()) != Some(&1) || !is_plain_conv(conv) {
            continue;
        }
        if let Some(f) = fold(a, conv, bn, weights, written) {
            folds.insert(
                conv.name.clone(),
                Fold {
                    norm_output: out.clone(),
                    norm_node: bn.name.clone(),
                    ..f
                },
            );
        }
    }
    folds
}

/// A convolution (not transposed) with its weight and bias as arguments.
fn is_plain_conv(n: &Node) -> bool {
    match n.op.as_str() {
        "conv1d" | "conv2d" | "conv3d" => true,
        "convolution" | "_convolution" => matches!(n.get("transposed"), Some(A::Bool(false))),
        _ => false,
    }
}

/// A stored tensor's dtype, sizes and values.
type Values = (DType, Vec<usize>, Vec<f64>);

/// A stored tensor the program does not write, by graph name: its values
/// (`Some(None)`: the argument is absent; `None`: not foldable).
fn stored(
    a: &Archive,
    arg: Option<&A>,
    weights: &HashMap<String, String>,
    written: &HashSet<String>,
) -> Option<Option<Values>> {
    let name = match arg {
        None | Some(A::None) => return Some(None),
        Some(A::Tensor(t)) => t,
        _ => return None,
    };
    if written.contains(name) {
        return None;
    }
    let s = a.get(weights.get(name)?)?;
    let bytes = a.bytes(s);
    let vals: Vec<f64> = match s.dtype {
        DType::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64)
            .collect(),
        DType::F16 => bytes
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f64())
            .collect(),
        _ => return None,
    };
    Some(Some((s.dtype, s.sizes.clone(), vals)))
}

fn fold(
    a: &Archive,
    conv: &Node,
    bn: &Node,
    weights: &HashMap<String, String>,
    written: &HashSet<String>,
) -> Option<Fold> {
    let (dtype, w_sizes, w) = stored(a, conv.get("weight"), weights, written)??;
    let o = *w_sizes.first()?;
    let per = |v: Option<Values>| -> Option<Option<Vec<f64>>> {
        match v {
            None => Some(None),
            Some((_, s, v)) if s == [o] => Some(Some(v)),
            Some(_) => None,
        }
    };
    let b = per(stored(a, conv.get("bias"), weights, written)?)?;
    let gamma = per(stored(a, bn.get("weight"), weights, written)?)?;
    let beta = per(stored(a, bn.get("bias"), weights, written)?)?;
    let mean = per(stored(a, bn.get("running_mean"), weights, written)?)??;
    let var = per(stored(a, bn.get("running_var"), weights, written)?)??;
    let eps = match bn.get("eps") {
        Some(A::Float(e)) => *e,
        None => 1e-5,
        _ => return None,
    };
    let scale: Vec<f64> = (0..o)
        .map(|c| gamma.as_ref().map_or(1.0, |g| g[c]) / (var[c] + eps).sqrt())
        .collect();
    let inner = w.len() / o.max(1);
    let weight: Vec<f64> = w
        .iter()
        .enumerate()
        .map(|(i, &x)| x * scale[i / inner.max(1)])
        .collect();
    let bias: Vec<f64> = (0..o)
        .map(|c| {
            (b.as_ref().map_or(0.0, |b| b[c]) - mean[c]) * scale[c]
                + beta.as_ref().map_or(0.0, |b| b[c])
        })
        .collect();
    Some(Fold {
        weight: encode(dtype, &weight),
        bias: encode(dtype, &bias),
        dtype,
        weight_sizes: w_sizes,
        norm_output: String::new(),
        norm_node: String::new(),
    })
}

fn encode(dtype: DType, v: &[f64]) -> Vec<u8> {
    match dtype {
        DType::F16 => v
            .iter()
            .flat_map(|&x| half::f16::from_f64(x).to_le_bytes())
            .collect(),
        _ => v.iter().flat_map(|&x| (x as f32).to_le_bytes()).collect(),
    }
}
