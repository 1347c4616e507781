//! sentence-transformers' all-MiniLM-L6-v2 (BERT: 6 layers, hidden 384,
//! 12 heads; mean pooling; L2 normalisation) written with Kiln's tracing
//! API the way a user would write it: head split and merge are views, the
//! padding mask is applied in place.
//!
//! Weights come from `model.safetensors` (memory-mapped, uploaded once to
//! a session as constants, straight from the mapping; each layer's query,
//! key and value projections stacked into one, as inference engines load
//! them: one product instead of three), text is tokenized
//! by the `tokenizers` crate from `tokenizer.json`. The model is traced per
//! (batch, sequence length) bucket; the session compiles each bucket once,
//! and the buckets share the weights and the pipelines of identical
//! kernels.

use crate::io::MappedTensors;
use kiln_engine::{Fetch, HostTensor, Input, Output, RunStats, Session};
use kiln_functionalize::trace::{call, Tensor, TensorSpec};
use kiln_functionalize::{args, trace, DType, Graph, RTensor};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

pub use fetch::{fetch, model_dir, PACKAGE, VERSION};

mod fetch;

pub const HIDDEN: usize = 384;
pub const HEADS: usize = 12;
pub const LAYERS: usize = 6;
/// The most word pieces a sentence keeps, [CLS] and [SEP] included:
/// sentence-transformers' `max_seq_length` for this model
/// (`sentence_bert_config.json`), which truncates longer text to it.
pub const MAX_LEN: usize = 256;
const LN_EPS: f64 = 1e-12;
/// The projections a layer's stacked `attention_self_qkv` holds, in order.
const QKV: [&str; 3] = ["query", "key", "value"];

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("model files: {0}")]
    Files(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error(transparent)]
    Program(#[from] kiln_functionalize::Error),
    #[error(transparent)]
    Engine(#[from] kiln_engine::EngineError),
    #[error(transparent)]
    Io(#[from] crate::io::IoError),
}

/// The model's weights (memory-mapped, by graph parameter name) and
/// tokenizer.
pub struct MiniLm {
    pub dir: PathBuf,
    weights: MappedTensors,
    /// Parameter name -> tensor name in the file.
    names: HashMap<String, String>,
    tokenizer: tokenizers::Tokenizer,
    graphs: HashMap<(usize, usize), Graph>,
    /// The dtype weights and activations compute in (`set_arithmetic`).
    arithmetic: DType,
}

/// A weight's name in the text format: dots become underscores.
fn param_name(name: &str) -> String {
    name.replace('.', "_")
}

impl MiniLm {
    pub fn load(dir: &Path) -> Result<MiniLm, ModelError> {
        let weights = MappedTensors::open(&dir.join("model.safetensors"))?;
        // Buffers such as `position_ids` (int64) are not weights.
        let names = weights
            .names()
            .map(|n| {
                (
                    param_name(n.strip_prefix("bert.").unwrap_or(n)),
                    n.to_string(),
                )
            })
            .collect();
        let tok_path = dir.join("tokenizer.json");
        let mut tokenizer = tokenizers::Tokenizer::from_file(&tok_path)
            .map_err(|e| ModelError::Tokenizer(format!("{}: {e}", tok_path.display())))?;
        // Kiln pads to its own buckets and truncates itself.
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(None)
            .map_err(|e| ModelError::Tokenizer(e.to_string()))?;
        Ok(MiniLm {
            dir: dir.to_path_buf(),
            weights,
            names,
            tokenizer,
            graphs: HashMap::new(),
            arithmetic: DType::F32,
        })
    }

    /// Computes in `dtype` from now on: f32 (sentence-transformers' own
    /// model) or f16 (its `model.half()`: f16 weights and activations,
    /// products and reductions accumulating in f32 as PyTorch's do; half
    /// the weight memory and the bytes moved). A session holds the weights
    /// of one arithmetic: use a session per arithmetic.
    pub fn set_arithmetic(&mut self, dtype: DType) -> Result<(), ModelError> {
        if !matches!(dtype, DType::F32 | DType::F16) {
            return Err(ModelError::Files(format!(
                "MiniLM computes in f32 or f16, not {dtype}"
            )));
        }
        if dtype != self.arithmetic {
            self.arithmetic = dtype;
            self.graphs.clear();
        }
        Ok(())
    }

    /// The dtype the model computes in (`set_arithmetic`).
    pub fn arithmetic(&self) -> DType {
        self.arithmetic
    }

    /// Weight `param` (a graph parameter name), borrowing the mapped file
    /// (a layer's stacked query, key and value projection: copied).
    pub fn weight(&self, param: &str) -> Result<HostTensor<'_>, ModelError> {
        if let Some(stacked) = self.stacked_qkv(param) {
            return stacked;
        }
        self.names
            .get(param)
            .and_then(|n| self.weights.get(n))
            .filter(|t| t.dtype() == DType::F32)
            .ok_or_else(|| {
                ModelError::Files(format!(
                    "{} has no f32 weight for {param}",
                    self.weights.path()
                ))
            })
    }

    /// Weight `param`'s sizes, read without stacking anything.
    fn weight_sizes(&self, param: &str) -> Result<Vec<usize>, ModelError> {
        match param.split_once("_attention_self_qkv_") {
            Some((layer, w)) => {
                let mut sizes = self
                    .weight(&format!("{layer}_attention_self_{}_{w}", QKV[0]))?
                    .sizes()
                    .to_vec();
                sizes[0] *= QKV.len();
                Ok(sizes)
            }
            None => Ok(self.weight(param)?.sizes().to_vec()),
        }
    }

    /// A layer's `..._attention_self_qkv_{weight,bias}`: its query, key
    /// and value weights (or biases) stacked along the output features, in
    /// that order; `None` for other names.
    fn stacked_qkv(&self, param: &str) -> Option<Result<HostTensor<'_>, ModelError>> {
        let (layer, w) = param.split_once("_attention_self_qkv_")?;
        let stack = || {
            let mut data: Vec<f32> = vec![];
            let mut sizes = vec![];
            for part in QKV {
                let t = self.weight(&format!("{layer}_attention_self_{part}_{w}"))?;
                data.extend(t.to_vec::<f32>()?);
                sizes = t.sizes().to_vec();
            }
            sizes[0] *= QKV.len();
            Ok(HostTensor::from_slice(&sizes, &data)?)
        };
        Some(stack())
    }

    /// Weight `param` in the model's arithmetic: borrowed from the mapped
    /// file in f32, converted (round to nearest even) in f16.
    pub fn weight_as_computed(&self, param: &str) -> Result<HostTensor<'_>, ModelError> {
        let w = self.weight(param)?;
        if self.arithmetic == DType::F32 {
            return Ok(w);
        }
        let v: Vec<half::f16> = w
            .to_vec::<f32>()?
            .into_iter()
            .map(half::f16::from_f32)
            .collect();
        Ok(HostTensor::from_slice(w.sizes(), &v)?)
    }

    /// Uploads every weight once as a constant of `session`, in the
    /// model's arithmetic (f32 straight from the mapped file); graphs
    /// compiled there then take only the token ids and the mask.
    pub fn upload_weights(&self, session: &Session) -> Result<(), ModelError> {
        for n in Self::weight_names() {
            match session.constant(&n) {
                None => session.add_constant(&n, &self.weight_as_computed(&n)?)?,
                Some(c) if c.dtype() != self.arithmetic => {
                    return Err(ModelError::Files(format!(
                        "this session holds MiniLM's {} weights; the model now computes \
                         in {}: use a session per arithmetic",
                        c.dtype(),
                        self.arithmetic
                    )))
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// The model for `batch` sentences of `seq` tokens compiled on
    /// `session`'s device into an export file's bytes, every weight a
    /// constant: runs take `input_ids` and `attention_mask` and return the
    /// embeddings.
    pub fn export(
        &mut self,
        session: &Session,
        batch: usize,
        seq: usize,
        opts: &kiln_engine::export::ExportOptions,
    ) -> Result<Vec<u8>, ModelError> {
        Ok(self.export_parts(session, batch, seq, opts)?.0)
    }

    /// `export`, and the bytes of the weights file when
    /// `opts.weights_file` keeps them apart (the same for every bucket:
    /// one weights file serves them all).
    pub fn export_parts(
        &mut self,
        session: &Session,
        batch: usize,
        seq: usize,
        opts: &kiln_engine::export::ExportOptions,
    ) -> Result<(Vec<u8>, Vec<u8>), ModelError> {
        let g = self.graph(batch, seq)?.clone();
        let weights = Self::weight_names()
            .into_iter()
            .map(|n| Ok((n.clone(), self.weight_as_computed(&n)?)))
            .collect::<Result<Vec<_>, ModelError>>()?;
        Ok(kiln_engine::export::export_parts(
            session, &g, &weights, opts,
        )?)
    }

    /// Token ids of one sentence ([CLS] ... [SEP]), at most `MAX_LEN`
    /// (`tokenize_counted` says whether text was cut).
    pub fn tokenize(&self, text: &str) -> Result<Vec<u32>, ModelError> {
        Ok(self.tokenize_counted(text)?.0)
    }

    /// Token ids of one sentence ([CLS] ... [SEP]) cut to `MAX_LEN` as
    /// sentence-transformers cuts them (the first `MAX_LEN - 2` word
    /// pieces kept, then [SEP]), and the sentence's word pieces before
    /// cutting.
    pub fn tokenize_counted(&self, text: &str) -> Result<(Vec<u32>, usize), ModelError> {
        let enc = self
            .tokenizer
            .encode(text, true)
            .map_err(|e| ModelError::Tokenizer(e.to_string()))?;
        let mut ids = enc.get_ids().to_vec();
        let full = ids.len();
        fit(&mut ids, MAX_LEN);
        Ok((ids, full))
    }

    /// The weight parameters, in the order `forward` declares them: the
    /// file's weights, but for each layer's query, key and value
    /// projections, stacked into one (`..._attention_self_qkv_weight`
    /// [1152, 384] and its bias), as inference engines load them: one
    /// product (one launch where WebGPU's 8 storage buffers a kernel would
    /// take two for three siblings), its result read in place by the
    /// attention kernel.
    pub fn weight_names() -> Vec<String> {
        let mut names: Vec<String> = [
            "embeddings.word_embeddings.weight",
            "embeddings.position_embeddings.weight",
            "embeddings.token_type_embeddings.weight",
            "embeddings.LayerNorm.weight",
            "embeddings.LayerNorm.bias",
        ]
        .iter()
        .map(|s| param_name(s))
        .collect();
        for l in 0..LAYERS {
            for part in [
                "attention.self.qkv",
                "attention.output.dense",
                "attention.output.LayerNorm",
                "intermediate.dense",
                "output.dense",
                "output.LayerNorm",
            ] {
                for w in ["weight", "bias"] {
                    names.push(param_name(&format!("encoder.layer.{l}.{part}.{w}")));
                }
            }
        }
        names
    }

    /// The traced model for `batch` sentences padded to `seq` tokens:
    /// parameters `input_ids` i32[batch, seq], `attention_mask`
    /// i32[batch, seq], then the weights (in the model's arithmetic);
    /// output `embeddings` f32[batch, 384].
    pub fn graph(&mut self, batch: usize, seq: usize) -> Result<&Graph, ModelError> {
        if !self.graphs.contains_key(&(batch, seq)) {
            let mut specs = vec![
                TensorSpec::new("input_ids", DType::I32, &[batch, seq]),
                TensorSpec::new("attention_mask", DType::I32, &[batch, seq]),
            ];
            for n in Self::weight_names() {
                specs.push(TensorSpec::new(
                    &n,
                    self.arithmetic,
                    &self.weight_sizes(&n)?,
                ));
            }
            let dtype = self.arithmetic;
            let g = trace("minilm", &specs, |p| vec![forward(p, batch, seq, dtype)])?;
            self.graphs.insert((batch, seq), g);
        }
        Ok(&self.graphs[&(batch, seq)])
    }

    /// Token ids and mask for the bucket, padded with zeros.
    pub fn token_inputs(
        ids: &[Vec<u32>],
        batch: usize,
        seq: usize,
    ) -> Result<[HostTensor<'static>; 2], ModelError> {
        let mut id = vec![0i32; batch * seq];
        let mut mask = vec![0i32; batch * seq];
        for (b, s) in ids.iter().enumerate() {
            for (t, &x) in s.iter().enumerate() {
                id[b * seq + t] = x as i32;
                mask[b * seq + t] = 1;
            }
        }
        Ok([
            HostTensor::from_slice(&[batch, seq], &id)?,
            HostTensor::from_slice(&[batch, seq], &mask)?,
        ])
    }

    /// Every parameter as the reference interpreter's tensors (ids, mask,
    /// then the weights, converted through f64).
    pub fn reference_inputs(
        &self,
        ids: &[Vec<u32>],
        batch: usize,
        seq: usize,
    ) -> Result<Vec<RTensor>, ModelError> {
        let mut v: Vec<RTensor> = Self::token_inputs(ids, batch, seq)?
            .iter()
            .map(|t| t.to_rtensor())
            .collect();
        for n in Self::weight_names() {
            v.push(self.weight_as_computed(&n)?.to_rtensor());
        }
        Ok(v)
    }

    /// The bucket (batch, sequence length) that holds these token lists.
    pub fn bucket_of(ids: &[Vec<u32>]) -> (usize, usize) {
        let seq = bucket(ids.iter().map(|t| t.len()).max().unwrap_or(1), &SEQ_BUCKETS);
        (bucket(ids.len(), &BATCH_BUCKETS), seq)
    }

    /// Embeds `sentences` on `session` (weights uploaded there first, once):
    /// one run uploads the token ids and the mask and reads back only the
    /// embeddings. Returns one unit-length row of 384 per sentence.
    pub fn embed(
        &mut self,
        session: &Session,
        sentences: &[&str],
    ) -> Result<(Vec<Vec<f32>>, RunStats), ModelError> {
        if sentences.is_empty() {
            return Ok((vec![], RunStats::default()));
        }
        if sentences.len() > MAX_BATCH {
            return Err(ModelError::Tokenizer(format!(
                "{} sentences in one call; embed at most {MAX_BATCH} at a time",
                sentences.len()
            )));
        }
        self.upload_weights(session)?;
        let ids = sentences
            .iter()
            .map(|s| self.tokenize(s))
            .collect::<Result<Vec<_>, _>>()?;
        let (batch, seq) = Self::bucket_of(&ids);
        let exe = session.compile(self.graph(batch, seq)?)?;
        let [id, mask] = Self::token_inputs(&ids, batch, seq)?;
        let r = session.run(
            &exe,
            &[Input::Host(&id), Input::Host(&mask)],
            &exe.options(Fetch::Host, Fetch::Skip),
        )?;
        let stats = r.stats.clone();
        let emb = r
            .outputs
            .into_iter()
            .next()
            .and_then(Output::host)
            .ok_or_else(|| ModelError::Files("the model returned no embeddings".into()))?
            .to_vec::<f32>()?;
        let rows = (0..sentences.len())
            .map(|i| emb[i * HIDDEN..(i + 1) * HIDDEN].to_vec())
            .collect();
        Ok((rows, stats))
    }
}

/// Cuts token ids ([CLS] ... [SEP]) to at most `len` as sentence-transformers
/// truncates: the first `len - 1` kept and [SEP] last.
pub fn fit(ids: &mut Vec<u32>, len: usize) {
    if ids.len() > len && len > 0 {
        let sep = *ids.last().expect("non-empty");
        ids.truncate(len - 1);
        ids.push(sep);
    }
}

/// Sequence lengths and batch sizes are padded up to these, so few shapes
/// compile.
pub fn bucket(n: usize, sizes: &[usize]) -> usize {
    sizes.iter().copied().find(|&s| s >= n).unwrap_or(n)
}

pub const SEQ_BUCKETS: [usize; 6] = [8, 16, 32, 64, 128, 256];
pub const BATCH_BUCKETS: [usize; 6] = [1, 2, 4, 8, 16, 32];
const MAX_BATCH: usize = 32;

fn linear(x: &Tensor, w: &Tensor, b: &Tensor) -> Tensor {
    x.linear(w, Some(b))
}

/// BERT encoder + mean pooling + L2 normalisation over traced tensors, in
/// the weights' dtype (`dtype`, as `model.half()` computes in f16), the
/// embeddings returned in f32.
fn forward(p: &[Tensor], batch: usize, seq: usize, dtype: DType) -> Tensor {
    let (b, s, h) = (batch as i64, seq as i64, HIDDEN as i64);
    let d = (HIDDEN / HEADS) as i64;
    let (ids, mask) = (&p[0], &p[1]);
    let w = |i: usize| &p[2 + i];
    // Embeddings: word + position + token type 0, then layer norm.
    let words = call("embedding", args![w(0), ids]).remove(0);
    let positions = call("arange", args![0, s, 1, DType::I32]).remove(0);
    let pos = call("embedding", args![w(1), &positions]).remove(0);
    let token_type = w(2).select(0, 0);
    let x = &(&words + &pos) + &token_type;
    let mut x = x.layer_norm(&[h], Some(w(3)), Some(w(4)), LN_EPS);
    // Padding as a bool [b, 1, 1, s] mask for the attention scores.
    let pad = mask.eq(0).view(&[b, 1, 1, s]);
    for l in 0..LAYERS {
        let lw = |k: usize| w(5 + l * 12 + k);
        // [b, s, 3 x heads x d] -> [3, b, heads, s, d] (timm's form): one
        // permutation of the product's result, then a head-split tensor each.
        let qkv = linear(&x, lw(0), lw(1))
            .view(&[b, s, 3, HEADS as i64, d])
            .permute(&[2, 0, 3, 1, 4]);
        let (q, k, v) = (qkv.select(0, 0), qkv.select(0, 1), qkv.select(0, 2));
        let scores = &q.matmul(&k.transpose(-1, -2)) * (1.0 / (d as f64).sqrt());
        // The dtype's lowest value, as transformers' extended mask.
        let lowest = if dtype == DType::F16 {
            f64::from(half::f16::MIN)
        } else {
            f32::MIN as f64
        };
        scores.masked_fill_(&pad, lowest);
        let probs = scores.softmax(-1);
        let ctx = probs.matmul(&v).transpose(1, 2).reshape(&[b, s, h]);
        let attn = linear(&ctx, lw(2), lw(3));
        attn.add_(&x);
        let x1 = attn.layer_norm(&[h], Some(lw(4)), Some(lw(5)), LN_EPS);
        let ff = linear(&linear(&x1, lw(6), lw(7)).gelu(), lw(8), lw(9));
        ff.add_(&x1);
        x = ff.layer_norm(&[h], Some(lw(10)), Some(lw(11)), LN_EPS);
    }
    // Mean over the real tokens, then unit length.
    let m = if dtype == DType::F32 {
        mask.mul(1.0)
    } else {
        call("_to_copy", args![mask, dtype]).remove(0)
    }
    .unsqueeze(-1);
    let summed = x.mul(&m).sum(&[1], false);
    let count = m.sum(&[1], false).clamp(Some(1e-9), None);
    let mean = summed.div(&count);
    let norm = mean
        .mul(&mean)
        .sum(&[1], true)
        .sqrt()
        .clamp(Some(1e-12), None);
    let unit = mean.div(&norm);
    if dtype == DType::F32 {
        unit
    } else {
        call("_to_copy", args![&unit, DType::F32]).remove(0)
    }
}
