//! Kiln in the browser: an exported program (`docs/export-format.md`) loaded
//! onto the page's WebGPU device and run with typed arrays in and out, and
//! MiniLM sentence embeddings on top of it with the model's own tokenizer.
//! Everything on this path is async: nothing blocks the page.
//!
//! From JavaScript (`web/kiln.js` wraps this with download progress and the
//! browser's Cache Storage):
//!
//! ```js
//! const p = await Program.load(bytes);      // Uint8Array of a .kiln file
//! const q = await Program.load(bytes, weights); // a version-3 export and its weights file
//! const [out] = await p.run([x, w]);        // typed arrays, one per input
//! const e = await Embedder.load([b8x32, b1x256], weights, tokenizerJson);
//! const rows = await e.embed(["a sentence", "another"]); // Float32Array[]
//! ```

use kiln_engine::export;
use kiln_engine::DType;
use kiln_engine::{Executable, Fetch, Gpu, HostTensor, Input, Session};
use std::sync::Arc;
use wasm_bindgen::prelude::*;

#[wasm_bindgen(start)]
pub fn start() {
    console_error_panic_hook::set_once();
}

fn js_err(e: impl std::fmt::Display) -> JsError {
    JsError::new(&e.to_string())
}

/// A tensor a run takes or gives: its name, dtype and sizes.
#[derive(Clone, Debug)]
struct Slot {
    name: String,
    dtype: DType,
    sizes: Vec<usize>,
}

impl Slot {
    fn numel(&self) -> usize {
        self.sizes.iter().product()
    }

    fn to_js(&self) -> JsValue {
        let o = js_sys::Object::new();
        let shape: js_sys::Array = self
            .sizes
            .iter()
            .map(|&s| JsValue::from(s as u32))
            .collect();
        // Setting a property on a fresh plain object cannot fail.
        let _ = js_sys::Reflect::set(&o, &"name".into(), &self.name.as_str().into());
        let _ = js_sys::Reflect::set(&o, &"dtype".into(), &self.dtype.name().into());
        let _ = js_sys::Reflect::set(&o, &"shape".into(), &shape);
        o.into()
    }

    /// The typed array `v` as this slot's host tensor: the array type must
    /// match the dtype (f32: Float32Array, f16: Uint16Array of the bits,
    /// i32: Int32Array, u32: Uint32Array, i64: BigInt64Array, bool:
    /// Uint8Array) and its length the number of elements.
    fn host(&self, v: &JsValue) -> Result<HostTensor<'static>, JsError> {
        let want = self.numel();
        let wrong = |kind: &str| {
            js_err(format!(
                "input `{}` ({} {:?}) must be {kind} of {want} elements",
                self.name,
                self.dtype.name(),
                self.sizes
            ))
        };
        // The elements of `v` as a `$arr` of exactly `want` elements.
        macro_rules! elements {
            ($arr:ty, $kind:literal) => {{
                let a = v.dyn_ref::<$arr>().ok_or_else(|| wrong($kind))?;
                if a.length() as usize != want {
                    return Err(wrong($kind));
                }
                a.to_vec()
            }};
        }
        // A host tensor of element type `$t` from a `$arr`.
        macro_rules! plain {
            ($arr:ty, $kind:literal, $t:ty) => {
                HostTensor::from_slice::<$t>(&self.sizes, &elements!($arr, $kind))
            };
        }
        let t = match self.dtype {
            DType::F32 => plain!(js_sys::Float32Array, "a Float32Array", f32),
            DType::I32 => plain!(js_sys::Int32Array, "an Int32Array", i32),
            DType::U32 => plain!(js_sys::Uint32Array, "a Uint32Array", u32),
            DType::I64 => plain!(js_sys::BigInt64Array, "a BigInt64Array", i64),
            DType::I8 => plain!(js_sys::Int8Array, "an Int8Array", i8),
            DType::F16 => {
                let bits: Vec<u16> = elements!(js_sys::Uint16Array, "a Uint16Array (f16 bits)");
                let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
                HostTensor::new(DType::F16, self.sizes.clone(), bytes).map(HostTensor::into_owned)
            }
            DType::Bool => {
                let b: Vec<u8> = elements!(js_sys::Uint8Array, "a Uint8Array");
                let b: Vec<bool> = b.into_iter().map(|x| x != 0).collect();
                HostTensor::from_bools(&self.sizes, &b)
            }
        };
        t.map_err(js_err)
    }
}

/// A host tensor as the typed array of its dtype (see `Slot::host`).
fn typed_array(t: &HostTensor) -> Result<JsValue, JsError> {
    Ok(match t.dtype() {
        DType::F32 => js_sys::Float32Array::from(&t.to_vec::<f32>().map_err(js_err)?[..]).into(),
        DType::I32 => js_sys::Int32Array::from(&t.to_vec::<i32>().map_err(js_err)?[..]).into(),
        DType::U32 => js_sys::Uint32Array::from(&t.to_vec::<u32>().map_err(js_err)?[..]).into(),
        DType::I64 => js_sys::BigInt64Array::from(&t.to_vec::<i64>().map_err(js_err)?[..]).into(),
        DType::I8 => js_sys::Int8Array::from(&t.to_vec::<i8>().map_err(js_err)?[..]).into(),
        DType::F16 => {
            let bits: Vec<u16> = t
                .bytes()
                .chunks_exact(2)
                .map(|b| u16::from_le_bytes([b[0], b[1]]))
                .collect();
            js_sys::Uint16Array::from(&bits[..]).into()
        }
        DType::Bool => js_sys::Uint8Array::from(t.bytes()).into(),
    })
}

/// The page's WebGPU adapter as a session, or an error saying how to get
/// one.
async fn page_session() -> Result<Session, JsError> {
    let gpu = Gpu::new_async().await.map_err(|e| {
        js_err(format!(
            "no WebGPU adapter: {e}. This page needs a browser with WebGPU \
             (Chrome or Edge 113+, Safari 26+, Firefox 141+ on Windows; on \
             Linux start Chromium with --enable-unsafe-webgpu)"
        ))
    })?;
    Ok(Session::new(Arc::new(gpu)))
}

/// Checks an export's bytes (with its weights file's, for a version-3
/// export) and loads it on `session`: its inputs and outputs, and the
/// executable. Exports sharing a weights file share its device tensors.
async fn load_on(
    session: &Session,
    bytes: &[u8],
    weights: Option<&[u8]>,
) -> Result<(Executable, Vec<Slot>, Vec<Slot>), JsError> {
    let e = export::read_with(bytes, weights).map_err(js_err)?;
    let exe = session.load_exported_async(&e).await.map_err(js_err)?;
    let p = &e.program;
    let slot = |v: usize, name: String| {
        let m = p.value(v);
        Slot {
            name,
            dtype: m.dtype,
            sizes: m.sizes.clone(),
        }
    };
    let inputs = exe
        .input_params()
        .into_iter()
        .map(|i| slot(p.params[i], p.param(i).name.clone()))
        .collect();
    let outputs = p
        .outputs
        .iter()
        .enumerate()
        .map(|(k, &v)| slot(v, format!("output.{k}")))
        .collect();
    Ok((exe, inputs, outputs))
}

/// Runs `exe` on `session` with host inputs; every output read back.
async fn run_on(
    session: &Session,
    exe: &Executable,
    inputs: &[HostTensor<'_>],
) -> Result<Vec<HostTensor<'static>>, JsError> {
    let feeds: Vec<Input> = inputs.iter().map(Input::Host).collect();
    let r = session
        .run_async(exe, &feeds, &exe.options(Fetch::Host, Fetch::Skip))
        .await
        .map_err(js_err)?;
    r.outputs
        .into_iter()
        .map(|o| o.host().ok_or_else(|| js_err("a result was not read back")))
        .collect()
}

/// An exported program loaded onto the page's WebGPU device.
#[wasm_bindgen]
pub struct Program {
    session: Session,
    exe: Executable,
    inputs: Vec<Slot>,
    outputs: Vec<Slot>,
}

#[wasm_bindgen]
impl Program {
    /// Checks the export file's bytes (checksums, manifest, program, every
    /// shader), opens the page's WebGPU adapter, checks it offers what the
    /// export needs, uploads the weights and makes the pipelines. An export
    /// that keeps its weights in a file of their own (format version 3)
    /// takes that file's bytes as `weights`.
    pub async fn load(bytes: Vec<u8>, weights: Option<Vec<u8>>) -> Result<Program, JsError> {
        let session = page_session().await?;
        let (exe, inputs, outputs) = load_on(&session, &bytes, weights.as_deref()).await?;
        Ok(Program {
            session,
            exe,
            inputs,
            outputs,
        })
    }

    /// The adapter, as "name (backend, device type)".
    #[wasm_bindgen(getter)]
    pub fn adapter(&self) -> String {
        self.session.gpu().describe()
    }

    /// What a run takes, in order: `[{name, dtype, shape}]`.
    #[wasm_bindgen(getter)]
    pub fn inputs(&self) -> js_sys::Array {
        self.inputs.iter().map(Slot::to_js).collect()
    }

    /// What a run gives, in order: `[{name, dtype, shape}]`.
    #[wasm_bindgen(getter)]
    pub fn outputs(&self) -> js_sys::Array {
        self.outputs.iter().map(Slot::to_js).collect()
    }

    /// Runs the program: one typed array per input (`inputs`), the outputs
    /// as typed arrays.
    pub async fn run(&self, inputs: js_sys::Array) -> Result<js_sys::Array, JsError> {
        if inputs.length() as usize != self.inputs.len() {
            return Err(js_err(format!(
                "the program takes {} inputs ({}), got {}",
                self.inputs.len(),
                self.inputs
                    .iter()
                    .map(|s| s.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                inputs.length()
            )));
        }
        let host = self
            .inputs
            .iter()
            .zip(inputs.iter())
            .map(|(s, v)| s.host(&v))
            .collect::<Result<Vec<_>, _>>()?;
        let outs = run_on(&self.session, &self.exe, &host).await?;
        outs.iter().map(typed_array).collect()
    }
}

/// One compiled shape of a sentence embedder: `batch` sentences of
/// `tokens` tokens.
struct Bucket {
    batch: usize,
    tokens: usize,
    exe: Executable,
}

/// Sentence embeddings from exported all-MiniLM-L6-v2 buckets (`minilm
/// --export FILE --web --bucket BxT`, one file per bucket, sharing a
/// `--weights-file`): the tokenizer runs here, text past the largest
/// bucket's tokens is cut as sentence-transformers cuts it ([CLS], the
/// first word pieces, [SEP]), sentences are grouped in order into runs of
/// the smallest bucket that holds each group, padded; each result is the
/// model's unit-length embedding.
#[wasm_bindgen]
pub struct Embedder {
    session: Session,
    /// By tokens, then batch.
    buckets: Vec<Bucket>,
    tokenizer: tokenizers::Tokenizer,
    dim: usize,
}

#[wasm_bindgen]
impl Embedder {
    /// Loads each export (`Program::load`, on one device: buckets sharing
    /// a weights file upload it once) and the model's `tokenizer.json`,
    /// and checks each export is a sentence embedder: `input_ids` and
    /// `attention_mask` i32 [batch, tokens] in, f32 [batch, dim] out.
    /// `on_ready(done, total)`, when given, is called as each bucket is
    /// ready (checked, its weights uploaded, its pipelines made).
    pub async fn load(
        models: js_sys::Array,
        weights: Option<Vec<u8>>,
        tokenizer_json: String,
        on_ready: Option<js_sys::Function>,
    ) -> Result<Embedder, JsError> {
        let session = page_session().await?;
        let mut buckets = vec![];
        let mut dim = None;
        let total = models.length();
        for (done, m) in models.iter().enumerate() {
            let bytes = js_sys::Uint8Array::new(&m).to_vec();
            let (exe, inputs, outputs) = load_on(&session, &bytes, weights.as_deref()).await?;
            if let Some(f) = &on_ready {
                // A progress display failing is no reason to stop loading.
                let _ = f.call2(&JsValue::NULL, &(done as u32 + 1).into(), &total.into());
            }
            let shape_ok = match (&inputs[..], &outputs[..]) {
                ([ids, mask], [out]) => {
                    ids.dtype == DType::I32
                        && mask.dtype == DType::I32
                        && ids.sizes.len() == 2
                        && mask.sizes == ids.sizes
                        && out.dtype == DType::F32
                        && out.sizes.len() == 2
                        && out.sizes[0] == ids.sizes[0]
                        && dim.is_none_or(|d| d == out.sizes[1])
                }
                _ => false,
            };
            if !shape_ok {
                return Err(js_err(
                    "the export is not a sentence embedder of the others' width: it must take \
                     input_ids and attention_mask (i32 [batch, tokens]) and give f32 \
                     [batch, dim] (export one with `minilm --export FILE --web`)",
                ));
            }
            dim = Some(outputs[0].sizes[1]);
            buckets.push(Bucket {
                batch: inputs[0].sizes[0],
                tokens: inputs[0].sizes[1],
                exe,
            });
        }
        let Some(dim) = dim else {
            return Err(js_err("no model: give at least one exported bucket"));
        };
        buckets.sort_by_key(|b| (b.tokens, b.batch));
        let mut tokenizer: tokenizers::Tokenizer = tokenizer_json
            .parse()
            .map_err(|e| js_err(format!("tokenizer.json: {e}")))?;
        // Batches are padded and truncated here, to the buckets.
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(None)
            .map_err(|e| js_err(format!("tokenizer.json: {e}")))?;
        Ok(Embedder {
            session,
            buckets,
            tokenizer,
            dim,
        })
    }

    #[wasm_bindgen(getter)]
    pub fn adapter(&self) -> String {
        self.session.gpu().describe()
    }

    /// The most sentences one run takes (the largest bucket's batch).
    #[wasm_bindgen(getter)]
    pub fn batch(&self) -> usize {
        self.buckets.iter().map(|b| b.batch).max().unwrap_or(0)
    }

    /// The most tokens a sentence keeps, [CLS] and [SEP] included (the
    /// largest bucket's); longer sentences are cut, their [SEP] kept.
    #[wasm_bindgen(getter)]
    pub fn tokens(&self) -> usize {
        self.buckets.iter().map(|b| b.tokens).max().unwrap_or(0)
    }

    /// The buckets, as "BATCHxTOKENS".
    #[wasm_bindgen(getter)]
    pub fn buckets(&self) -> Vec<String> {
        self.buckets
            .iter()
            .map(|b| format!("{}x{}", b.batch, b.tokens))
            .collect()
    }

    /// Floats per embedding.
    #[wasm_bindgen(getter)]
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// The tokens of `text` before any cut, [CLS] and [SEP] included (more
    /// than `tokens`: the model reads only the first `tokens`).
    #[wasm_bindgen(js_name = tokenCount)]
    pub fn token_count(&self, text: &str) -> Result<usize, JsError> {
        Ok(self.encode(text)?.len())
    }

    /// The token ids the model sees for `text`.
    pub fn tokenize(&self, text: &str) -> Result<Vec<u32>, JsError> {
        let mut ids = self.encode(text)?;
        let max = self.tokens();
        if ids.len() > max {
            let sep = *ids.last().expect("longer than a bucket, so not empty");
            ids.truncate(max - 1);
            ids.push(sep);
        }
        Ok(ids)
    }

    /// One Float32Array of `dim` floats per sentence, in order.
    pub async fn embed(&self, sentences: Vec<String>) -> Result<js_sys::Array, JsError> {
        let ids = sentences
            .iter()
            .map(|s| self.tokenize(s))
            .collect::<Result<Vec<_>, _>>()?;
        let out = js_sys::Array::new();
        let mut start = 0;
        while start < ids.len() {
            // The longest run of sentences from `start` some bucket holds,
            // on the cheapest bucket that holds it.
            let mut end = start + 1;
            let mut longest = ids[start].len();
            while end < ids.len()
                && self
                    .bucket_for(end + 1 - start, longest.max(ids[end].len()))
                    .is_some()
            {
                longest = longest.max(ids[end].len());
                end += 1;
            }
            let b = self.bucket_for(end - start, longest).ok_or_else(|| {
                js_err("no bucket holds a sentence (bug: it was cut to the largest)")
            })?;
            let (bn, t) = (b.batch, b.tokens);
            let mut tok = vec![0i32; bn * t];
            let mut mask = vec![0i32; bn * t];
            for (i, s) in ids[start..end].iter().enumerate() {
                for (j, &x) in s.iter().enumerate() {
                    tok[i * t + j] = x as i32;
                    mask[i * t + j] = 1;
                }
            }
            let inputs = [
                HostTensor::from_slice(&[bn, t], &tok).map_err(js_err)?,
                HostTensor::from_slice(&[bn, t], &mask).map_err(js_err)?,
            ];
            let rows = run_on(&self.session, &b.exe, &inputs).await?[0]
                .to_vec::<f32>()
                .map_err(js_err)?;
            for row in rows.chunks_exact(self.dim).take(end - start) {
                out.push(&js_sys::Float32Array::from(row).into());
            }
            start = end;
        }
        Ok(out)
    }
}

impl Embedder {
    fn encode(&self, text: &str) -> Result<Vec<u32>, JsError> {
        let enc = self
            .tokenizer
            .encode(text, true)
            .map_err(|e| js_err(format!("tokenizer: {e}")))?;
        Ok(enc.get_ids().to_vec())
    }

    /// The bucket of fewest tokens per run that holds `n` sentences of at
    /// most `tokens` tokens.
    fn bucket_for(&self, n: usize, tokens: usize) -> Option<&Bucket> {
        self.buckets
            .iter()
            .filter(|b| b.batch >= n && b.tokens >= tokens)
            .min_by_key(|b| (b.batch * b.tokens, b.tokens))
    }
}
