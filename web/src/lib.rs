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
//! const [out] = await p.run([x, w]);        // typed arrays, one per input
//! const e = await Embedder.load(bytes, tokenizerJson);
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
    /// export needs, uploads the weights and makes the pipelines.
    pub async fn load(bytes: Vec<u8>) -> Result<Program, JsError> {
        let gpu = Gpu::new_async().await.map_err(|e| {
            js_err(format!(
                "no WebGPU adapter: {e}. This page needs a browser with WebGPU \
                 (Chrome or Edge 113+, Safari 26+, Firefox 141+ on Windows; on \
                 Linux start Chromium with --enable-unsafe-webgpu)"
            ))
        })?;
        let session = Session::new(Arc::new(gpu));
        let e = export::read(&bytes).map_err(js_err)?;
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
        let outs = self.run_host(&host).await?;
        outs.iter().map(typed_array).collect()
    }
}

impl Program {
    async fn run_host(
        &self,
        inputs: &[HostTensor<'_>],
    ) -> Result<Vec<HostTensor<'static>>, JsError> {
        let feeds: Vec<Input> = inputs.iter().map(Input::Host).collect();
        let r = self
            .session
            .run_async(
                &self.exe,
                &feeds,
                &self.exe.options(Fetch::Host, Fetch::Skip),
            )
            .await
            .map_err(js_err)?;
        r.outputs
            .into_iter()
            .map(|o| o.host().ok_or_else(|| js_err("a result was not read back")))
            .collect()
    }
}

/// Sentence embeddings from an exported all-MiniLM-L6-v2 (`minilm --export
/// FILE --web`): the tokenizer runs here, sentences are batched by the
/// export's bucket and padded, each result is the model's unit-length
/// embedding.
#[wasm_bindgen]
pub struct Embedder {
    program: Program,
    tokenizer: tokenizers::Tokenizer,
    batch: usize,
    tokens: usize,
    dim: usize,
}

#[wasm_bindgen]
impl Embedder {
    /// Loads the export (`Program::load`) and the model's `tokenizer.json`,
    /// and checks the export is a sentence embedder: `input_ids` and
    /// `attention_mask` i32 [batch, tokens] in, f32 [batch, dim] out.
    pub async fn load(bytes: Vec<u8>, tokenizer_json: String) -> Result<Embedder, JsError> {
        let program = Program::load(bytes).await?;
        let shape_ok = match (&program.inputs[..], &program.outputs[..]) {
            ([ids, mask], [out]) => {
                ids.dtype == DType::I32
                    && mask.dtype == DType::I32
                    && ids.sizes.len() == 2
                    && mask.sizes == ids.sizes
                    && out.dtype == DType::F32
                    && out.sizes.len() == 2
                    && out.sizes[0] == ids.sizes[0]
            }
            _ => false,
        };
        if !shape_ok {
            return Err(js_err(
                "the export is not a sentence embedder: it must take input_ids and \
                 attention_mask (i32 [batch, tokens]) and give f32 [batch, dim] \
                 (export one with `minilm --export FILE --web`)",
            ));
        }
        let (batch, tokens) = (program.inputs[0].sizes[0], program.inputs[0].sizes[1]);
        let dim = program.outputs[0].sizes[1];
        let mut tokenizer: tokenizers::Tokenizer = tokenizer_json
            .parse()
            .map_err(|e| js_err(format!("tokenizer.json: {e}")))?;
        // Batches are padded and truncated here, to the export's bucket.
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(None)
            .map_err(|e| js_err(format!("tokenizer.json: {e}")))?;
        Ok(Embedder {
            program,
            tokenizer,
            batch,
            tokens,
            dim,
        })
    }

    #[wasm_bindgen(getter)]
    pub fn adapter(&self) -> String {
        self.program.adapter()
    }

    /// Sentences per run (the export's bucket).
    #[wasm_bindgen(getter)]
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Tokens per sentence, [CLS] and [SEP] included; longer sentences are
    /// cut (their [SEP] kept).
    #[wasm_bindgen(getter)]
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// Floats per embedding.
    #[wasm_bindgen(getter)]
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// The token ids the model sees for `text`.
    pub fn tokenize(&self, text: &str) -> Result<Vec<u32>, JsError> {
        let enc = self
            .tokenizer
            .encode(text, true)
            .map_err(|e| js_err(format!("tokenizer: {e}")))?;
        let mut ids = enc.get_ids().to_vec();
        if ids.len() > self.tokens {
            let sep = *ids.last().expect("longer than the bucket, so not empty");
            ids.truncate(self.tokens - 1);
            ids.push(sep);
        }
        Ok(ids)
    }

    /// One Float32Array of `dim` floats per sentence, in order.
    pub async fn embed(&self, sentences: Vec<String>) -> Result<js_sys::Array, JsError> {
        let out = js_sys::Array::new();
        for chunk in sentences.chunks(self.batch) {
            let (b, t) = (self.batch, self.tokens);
            let mut ids = vec![0i32; b * t];
            let mut mask = vec![0i32; b * t];
            for (i, s) in chunk.iter().enumerate() {
                for (j, x) in self.tokenize(s)?.into_iter().enumerate() {
                    ids[i * t + j] = x as i32;
                    mask[i * t + j] = 1;
                }
            }
            let inputs = [
                HostTensor::from_slice(&[b, t], &ids).map_err(js_err)?,
                HostTensor::from_slice(&[b, t], &mask).map_err(js_err)?,
            ];
            let rows = self.program.run_host(&inputs).await?[0]
                .to_vec::<f32>()
                .map_err(js_err)?;
            for row in rows.chunks_exact(self.dim).take(chunk.len()) {
                out.push(&js_sys::Float32Array::from(row).into());
            }
        }
        Ok(out)
    }
}
