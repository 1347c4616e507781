//! One file holding a compiled program and its constants
//! (`docs/export-format.md`): written by `export`, checked by `read`
//! before anything is allocated on a device, loaded by
//! `Session::load_exported` without the functionalizer or the fuser.
//!
//! Layout: an 80-byte header (magic, format version, the three sections'
//! offsets, lengths and CRC-32s, the header's own CRC), a JSON manifest,
//! the functionalized program as text, then the constants, each at a
//! 256-byte boundary so a mapped file uploads without a copy.
//!
//! The manifest holds everything a run needs (values' types, kernels,
//! locations, host views, statements for fault messages): the runtime
//! alone never parses the program text.

#[cfg(feature = "compiler")]
use crate::compile_functional;
use crate::kernel::{Binding, Buf, HostView, KernelCode, Loc, Val, ValueInfo};
use crate::runtime::{HostTensor, Session};
use crate::{EngineError, Kernel, MemoryStats, Program};
use kiln_dtype::DType;
#[cfg(feature = "compiler")]
use kiln_functionalize::Graph;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

pub const MAGIC: [u8; 8] = *b"KILNPROG";
/// The format this runtime writes and reads (2: the manifest carries the
/// values' types, host views and statements; 1 left them to the text).
pub const FORMAT_VERSION: u32 = 2;
/// The format of an export whose constants live in a weights file of
/// their own (`Manifest::weights`), shared by exports of one model at
/// several shapes: a version-2 runtime refuses it rather than run without
/// its weights.
pub const SHARED_WEIGHTS_VERSION: u32 = 3;
pub const HEADER_LEN: usize = 80;
/// Constants start at multiples of this (WebGPU's copy and binding
/// alignment).
pub const ALIGN: usize = 256;
/// Every kernel's entry point.
const ENTRY: &str = "main";

/// Why a file cannot be used: it says what is wrong and where.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("not a Kiln export: {0}")]
    Format(String),
    #[error("{0}")]
    Version(String),
    #[error("the export is damaged: {0}")]
    Corrupt(String),
    #[error("{0}")]
    Weights(String),
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// The manifest: everything a runtime needs besides the program text and
/// the constants' bytes.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Manifest {
    /// `kiln <version>`.
    pub producer: String,
    pub name: String,
    /// Every value named below, with its type.
    pub values: Vec<ValueEntry>,
    /// Every parameter in order; constants carry where their bytes are.
    pub params: Vec<ParamEntry>,
    /// What a run returns, by value name: the outputs, then the final value
    /// of each mutated parameter.
    pub outputs: Vec<String>,
    pub n_outputs: usize,
    /// The parameter each extra output writes back to.
    pub mutated_inputs: Vec<usize>,
    pub readback: Vec<String>,
    /// Outputs taken on the host as views of a read-back buffer.
    pub host_views: Vec<HostViewEntry>,
    /// The functionalized program's statements (`%y = op(...)`), named
    /// when a kernel reports a fault at one.
    pub statements: Vec<String>,
    pub locs: Vec<LocEntry>,
    pub param_words: Vec<usize>,
    pub written_params: Vec<usize>,
    pub arena_words: usize,
    pub status_word: Option<usize>,
    pub min_bytes: usize,
    pub memory: [usize; 6],
    pub kernels: Vec<KernelEntry>,
    pub requires: Requirements,
    /// Version 3: the constants' offsets are in this weights file (beside
    /// the export), not in the export's own (empty) data section.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weights: Option<WeightsEntry>,
}

/// A weights file several exports share: the data section of an export,
/// stored apart (every constant at a multiple of `ALIGN`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct WeightsEntry {
    /// Its file name, looked up in the export's folder.
    pub file: String,
    pub bytes: u64,
    pub crc32: u32,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ValueEntry {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<usize>,
}

/// `output`'s elements at `offset + sum(index * strides)` of `base`'s
/// buffer (contiguous).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct HostViewEntry {
    pub output: String,
    pub base: String,
    pub shape: Vec<usize>,
    pub strides: Vec<usize>,
    pub offset: usize,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ParamEntry {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<usize>,
    pub constant: Option<ConstantEntry>,
}

/// A constant's bytes: `bytes` at `offset` in the data section, stored as
/// `stored` (the parameter's dtype, or f16 for an f32 parameter).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ConstantEntry {
    pub offset: u64,
    pub bytes: u64,
    pub stored: String,
    pub crc32: u32,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct LocEntry {
    pub value: String,
    /// The parameter whose buffer holds it; `None`: the arena.
    pub param: Option<usize>,
    pub word: usize,
    pub packed: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct KernelEntry {
    pub label: String,
    pub wgsl: String,
    /// The same kernel with f16 conversions in the adapter's instructions
    /// (`enable f16;`), run where the device has `shader-f16`; `wgsl`
    /// elsewhere (a runtime not knowing this key runs `wgsl`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wgsl_f16: Option<String>,
    /// The shader's entry point (Kiln's kernels: `main`).
    pub entry: String,
    pub grid: [u32; 3],
    pub bindings: Vec<BindingEntry>,
    pub ops: Vec<String>,
    pub bytes_read: usize,
    pub bytes_written: usize,
    pub flops: usize,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct BindingEntry {
    /// `None`: the arena.
    pub param: Option<usize>,
    pub offset: u64,
    pub size: u64,
    pub write: bool,
}

/// What the kernels need of an adapter: features by name and the limits
/// the compiling device's choices assumed.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Requirements {
    pub features: Vec<String>,
    pub min_storage_buffer_offset_alignment: u32,
    pub max_storage_buffer_binding_size: u64,
    pub max_storage_buffers_per_shader_stage: u32,
    pub max_buffer_size: u64,
    pub max_compute_invocations_per_workgroup: u32,
    pub max_compute_workgroup_storage_size: u32,
    pub max_compute_workgroups_per_dimension: u32,
}

/// How an export stores f32 weights.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WeightsDtype {
    /// As they are.
    #[default]
    F32,
    /// As f16: half the file, widened to f32 at load.
    F16,
    /// Weights of two dimensions or more as int8 with an f32 scale per
    /// output channel (index of the first dimension), symmetric: a
    /// quarter of the file and of the device memory. The program reads
    /// them through `mul(_to_copy(q, f32), scale)`, which kernels compute
    /// where they load the weight (never an f32 copy on the device);
    /// one-dimensional weights (biases, norms), and matrices too small
    /// for int8 and scales to take fewer bytes, stay f32.
    I8,
}

impl WeightsDtype {
    /// As `--weights-dtype` spells it.
    pub fn name(self) -> &'static str {
        match self {
            WeightsDtype::F32 => "f32",
            WeightsDtype::F16 => "f16",
            WeightsDtype::I8 => "i8",
        }
    }
}

/// How `export` stores things.
#[derive(Clone, Debug, Default)]
pub struct ExportOptions {
    pub weights_dtype: WeightsDtype,
    /// Keep the constants in a weights file of this name beside the
    /// export (format version 3; `export_parts` returns its bytes): exports
    /// of one model at several shapes share one download of its weights.
    pub weights_file: Option<String>,
}

/// Compiles `g` for `session`'s device with the parameters found in
/// `weights` as constants and writes the export file's bytes.
#[cfg(feature = "compiler")]
pub fn export(
    session: &Session,
    g: &Graph,
    weights: &[(String, HostTensor<'_>)],
    opts: &ExportOptions,
) -> Result<Vec<u8>, EngineError> {
    if opts.weights_file.is_some() {
        return Err(EngineError::Internal(
            "an export with a weights file of its own is two files: use export_parts".into(),
        ));
    }
    Ok(export_parts(session, g, weights, opts)?.0)
}

/// `export`, returning the export file's bytes and those of its weights
/// file (`ExportOptions::weights_file`; empty when the constants are
/// inside the export).
#[cfg(feature = "compiler")]
pub fn export_parts(
    session: &Session,
    g: &Graph,
    weights: &[(String, HostTensor<'_>)],
    opts: &ExportOptions,
) -> Result<(Vec<u8>, Vec<u8>), EngineError> {
    let by_name: HashMap<&str, &HostTensor> =
        weights.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let mut bound: Vec<(usize, &HostTensor)> = vec![];
    for (i, &v) in g.inputs.iter().enumerate() {
        let Some(name) = g.values[v].name.as_deref() else {
            continue;
        };
        if let Some(t) = by_name.get(name) {
            let m = g.meta(v);
            if t.dtype() != m.dtype || t.sizes() != &m.sizes[..] {
                return Err(EngineError::Input {
                    index: i,
                    msg: format!(
                        "%{name} is {}, but the weights file holds {}",
                        m.type_string(),
                        t.type_string()
                    ),
                });
            }
            bound.push((i, *t));
        }
    }
    let quantized;
    let (g, bound) = if opts.weights_dtype == WeightsDtype::I8 {
        quantized = quantize(g, &bound)?;
        (
            &quantized.0,
            quantized.1.iter().map(|(i, t)| (*i, t)).collect(),
        )
    } else {
        (g, bound)
    };
    let mut options = session.compile_options().clone();
    options.constants = bound.iter().map(|(i, _)| *i).collect();
    let (program, functional) = compile_functional(g, &options)?;
    let text = kiln_functionalize::text::print(&functional);
    let gpu = session.gpu();
    write(&program, &text, &bound, gpu, opts)
}

#[cfg(feature = "compiler")]
fn buf_param(b: Buf) -> Option<usize> {
    match b {
        Buf::Param(i) => Some(i),
        Buf::Arena => None,
    }
}

/// `g` with its f32 constants `bound` of two dimensions or more stored
/// as int8 (`WeightsDtype::I8`), and every constant, scales appended
/// (`Graph::with_dequantized_params`). A constant the program writes is
/// refused here, as the compiler refuses it: once quantized, the write
/// would land on the dequantized copy.
#[cfg(feature = "compiler")]
fn quantize(
    g: &Graph,
    bound: &[(usize, &HostTensor<'_>)],
) -> Result<(Graph, Vec<(usize, HostTensor<'static>)>), EngineError> {
    let picked: Vec<usize> = bound
        .iter()
        .filter(|(_, t)| {
            t.dtype() == DType::F32 && t.sizes().len() >= 2 && int8_saves(t.numel(), t.sizes()[0])
        })
        .map(|(i, _)| *i)
        .collect();
    let f = kiln_functionalize::functionalize(g, kiln_functionalize::Remove::Mutations)?;
    if let Some(m) = f.mutated_inputs.iter().find(|m| picked.contains(&m.input)) {
        let name = g.values[g.inputs[m.input]].name.clone().unwrap_or_default();
        return Err(EngineError::Input {
            index: m.input,
            msg: format!(
                "parameter %{name} is bound to a constant (uploaded once) but the program \
                 writes it; pass it as an ordinary input instead"
            ),
        });
    }
    let (q, groups) = g
        .with_dequantized_params(&picked, INT8_GROUP)
        .map_err(|e| EngineError::Internal(format!("storing weights as int8: {e}")))?;
    let mut out = vec![];
    let mut scales = vec![];
    for (i, t) in bound {
        if !picked.contains(i) {
            out.push((*i, (*t).clone().into_owned()));
            continue;
        }
        let glen = groups[scales.len()].1;
        let (qs, ss) = quantize_groups(&t.to_vec::<f32>()?, glen);
        let bytes: Vec<u8> = qs.iter().map(|&x| x as u8).collect();
        out.push((*i, HostTensor::new(DType::I8, t.sizes().to_vec(), bytes)?));
        let scale_meta = q.meta(q.inputs[g.inputs.len() + scales.len()]);
        scales.push(HostTensor::from_slice(&scale_meta.sizes, &ss)?);
    }
    let first = g.inputs.len();
    out.extend(scales.into_iter().enumerate().map(|(j, s)| (first + j, s)));
    Ok((q, out))
}

/// Elements of an output channel sharing one int8 scale: per channel
/// alone, all-MiniLM-L6-v2's embedding of "Hi" drifts to cosine 0.9982
/// of f32 (its FFN output matrices have 1536 inputs with outliers); in
/// groups of 64, 0.9996 (and 0.9994 in groups of 128), for 6% more bytes.
pub const INT8_GROUP: usize = 64;

/// Does a matrix of `n` f32 elements in `rows` output channels take
/// fewer bytes as int8 with its scales (one per group of `INT8_GROUP`, or
/// per channel), each constant padded to `ALIGN`? A tiny one does not: it
/// stays f32.
#[cfg(feature = "compiler")]
fn int8_saves(n: usize, rows: usize) -> bool {
    let scales = rows.max(n.div_ceil(INT8_GROUP));
    let int8 = n.next_multiple_of(ALIGN) + (4 * scales).next_multiple_of(ALIGN);
    int8 < (4 * n).next_multiple_of(ALIGN)
}

/// Symmetric int8 of `w` with a scale per `glen` consecutive elements:
/// scale = max |w| / 127 of the group (1 for a group of zeros), q = w /
/// scale rounded half to even (`torch.round`), within -127..=127.
pub fn quantize_groups(w: &[f32], glen: usize) -> (Vec<i8>, Vec<f32>) {
    let mut q = Vec::with_capacity(w.len());
    let mut scales = Vec::with_capacity(w.len() / glen.max(1));
    for row in w.chunks(glen.max(1)) {
        let amax = row.iter().fold(0f32, |m, x| m.max(x.abs()));
        let scale = if amax > 0.0 && amax.is_finite() {
            amax / 127.0
        } else {
            1.0
        };
        q.extend(
            row.iter()
                .map(|&x| (x / scale).round_ties_even().clamp(-127.0, 127.0) as i8),
        );
        scales.push(scale);
    }
    (q, scales)
}

/// The constants' bytes, each at a 256-byte boundary of the data
/// section (f32 ones as f16 where asked), and their table entries.
#[cfg(feature = "compiler")]
fn constant_data(
    constants: &[(usize, &HostTensor<'_>)],
    opts: &ExportOptions,
) -> Result<(Vec<u8>, HashMap<usize, ConstantEntry>), EngineError> {
    let mut data: Vec<u8> = vec![];
    let mut entries: HashMap<usize, ConstantEntry> = HashMap::new();
    for (i, t) in constants {
        let (bytes, stored): (Vec<u8>, DType) =
            if opts.weights_dtype == WeightsDtype::F16 && t.dtype() == DType::F32 {
                let v: Vec<f32> = t.to_vec::<f32>()?;
                (
                    v.iter()
                        .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
                        .collect(),
                    DType::F16,
                )
            } else {
                (t.bytes().to_vec(), t.dtype())
            };
        data.resize(data.len().next_multiple_of(ALIGN), 0);
        entries.insert(
            *i,
            ConstantEntry {
                offset: data.len() as u64,
                bytes: bytes.len() as u64,
                stored: stored.name().into(),
                crc32: crc32fast::hash(&bytes),
            },
        );
        data.extend(bytes);
    }
    Ok((data, entries))
}

/// The manifest of `p`, whose constants are at `entries` of the data.
#[cfg(feature = "compiler")]
fn manifest(
    p: &Program,
    mut entries: HashMap<usize, ConstantEntry>,
    gpu: &crate::Gpu,
) -> Result<Manifest, EngineError> {
    let name = |v: Val| p.values[v].name.clone();
    let params = p
        .params
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let m = &p.values[v];
            ParamEntry {
                name: m.name.clone(),
                dtype: m.dtype.name().into(),
                shape: m.sizes.clone(),
                constant: entries.remove(&i),
            }
        })
        .collect();
    let values = p
        .values
        .iter()
        .map(|m| ValueEntry {
            name: m.name.clone(),
            dtype: m.dtype.name().into(),
            shape: m.sizes.clone(),
        })
        .collect();
    let mut host_views: Vec<HostViewEntry> = p
        .host_views
        .iter()
        .map(|(&o, h)| HostViewEntry {
            output: name(o),
            base: name(h.base),
            shape: h.sizes.clone(),
            strides: h.strides.clone(),
            offset: h.offset,
        })
        .collect();
    host_views.sort_by(|a, b| a.output.cmp(&b.output));
    let mut locs: Vec<LocEntry> = p
        .locs
        .iter()
        .map(|(&v, l)| LocEntry {
            value: name(v),
            param: buf_param(l.buf),
            word: l.word,
            packed: l.packed,
        })
        .collect();
    locs.sort_by(|a, b| a.value.cmp(&b.value));
    let kernels = p
        .kernels
        .iter()
        .map(|k| KernelEntry {
            label: k.code.label.clone(),
            wgsl: k.code.wgsl.clone(),
            wgsl_f16: k.code.wgsl_f16.clone(),
            entry: ENTRY.into(),
            grid: k.code.grid,
            bindings: k
                .code
                .bindings
                .iter()
                .map(|b| BindingEntry {
                    param: buf_param(b.buf),
                    offset: b.offset,
                    size: b.size,
                    write: b.write,
                })
                .collect(),
            ops: k.ops.clone(),
            bytes_read: k.bytes_read,
            bytes_written: k.bytes_written,
            flops: k.flops,
        })
        .collect::<Vec<_>>();
    let mem = &p.memory;
    Ok(Manifest {
        producer: format!("kiln {}", env!("CARGO_PKG_VERSION")),
        name: p.name.clone(),
        values,
        params,
        outputs: p.outputs.iter().map(|&v| name(v)).collect(),
        n_outputs: p.n_outputs,
        mutated_inputs: p.mutated_inputs.clone(),
        readback: p.readback.iter().map(|&v| name(v)).collect(),
        host_views,
        statements: p.statements.clone(),
        locs,
        param_words: p.param_words.clone(),
        written_params: p.written_params.clone(),
        arena_words: p.arena_words,
        status_word: p.status_word,
        min_bytes: p.min_bytes,
        memory: [
            mem.io,
            mem.arena,
            mem.lower_bound,
            mem.naive,
            mem.naive_unfused,
            mem.eager_peak,
        ],
        requires: requirements(p, &kernels, gpu)?,
        weights: None,
        kernels,
    })
}

/// What `kernels` need of an adapter (features, and the limits `gpu`'s
/// choices assumed).
#[cfg(feature = "compiler")]
fn requirements(
    p: &Program,
    kernels: &[KernelEntry],
    gpu: &crate::Gpu,
) -> Result<Requirements, EngineError> {
    let l = &gpu.limits;
    let needs = kernels
        .iter()
        .map(|k| shader_needs(&k.wgsl))
        .collect::<Result<Vec<_>, _>>()
        .map_err(EngineError::Internal)?;
    Ok(Requirements {
        features: if p.kernels.iter().any(|k| k.code.subgroup) {
            vec!["subgroup".to_string()]
        } else {
            vec![]
        },
        min_storage_buffer_offset_alignment: l.min_storage_buffer_offset_alignment,
        max_storage_buffer_binding_size: kernels
            .iter()
            .flat_map(|k| k.bindings.iter().map(|b| b.size))
            .max()
            .unwrap_or(0),
        max_storage_buffers_per_shader_stage: kernels
            .iter()
            .map(|k| k.bindings.len() as u32)
            .max()
            .unwrap_or(0),
        max_buffer_size: ((p.arena_words as u64 + 1) * 4).max(
            p.param_words
                .iter()
                .map(|&w| w as u64 * 4)
                .max()
                .unwrap_or(0),
        ),
        max_compute_invocations_per_workgroup: needs.iter().map(|n| n.0).max().unwrap_or(1),
        max_compute_workgroup_storage_size: needs.iter().map(|n| n.1).max().unwrap_or(0),
        max_compute_workgroups_per_dimension: kernels
            .iter()
            .flat_map(|k| k.grid)
            .max()
            .unwrap_or(1),
    })
}

/// The file's bytes: `p`'s manifest, `text` (the functionalized program
/// returning what a run returns: the outputs, then the mutated
/// parameters' final values, so the reference can run it too) and the
/// constants; or, with a weights file, the constants' bytes apart.
#[cfg(feature = "compiler")]
fn write(
    p: &Program,
    text: &str,
    constants: &[(usize, &HostTensor<'_>)],
    gpu: &crate::Gpu,
    opts: &ExportOptions,
) -> Result<(Vec<u8>, Vec<u8>), EngineError> {
    let (mut data, entries) = constant_data(constants, opts)?;
    let mut manifest = manifest(p, entries, gpu)?;
    let mut apart = vec![];
    let version = match &opts.weights_file {
        Some(file) => {
            manifest.weights = Some(WeightsEntry {
                file: file.clone(),
                bytes: data.len() as u64,
                crc32: crc32fast::hash(&data),
            });
            apart = std::mem::take(&mut data);
            SHARED_WEIGHTS_VERSION
        }
        None => FORMAT_VERSION,
    };
    let json = serde_json::to_vec(&manifest)
        .map_err(|e| EngineError::Internal(format!("writing the manifest: {e}")))?;
    let man_off = HEADER_LEN;
    let prog_off = man_off + json.len();
    let data_off = (prog_off + text.len()).next_multiple_of(ALIGN);
    let mut out = Vec::with_capacity(data_off + data.len());
    out.extend(MAGIC);
    out.extend(version.to_le_bytes());
    out.extend(0u32.to_le_bytes());
    out.extend((man_off as u64).to_le_bytes());
    out.extend((json.len() as u64).to_le_bytes());
    out.extend(crc32fast::hash(&json).to_le_bytes());
    out.extend((prog_off as u64).to_le_bytes());
    out.extend((text.len() as u64).to_le_bytes());
    out.extend(crc32fast::hash(text.as_bytes()).to_le_bytes());
    out.extend((data_off as u64).to_le_bytes());
    out.extend((data.len() as u64).to_le_bytes());
    out.resize(HEADER_LEN - 4, 0);
    let crc = crc32fast::hash(&out);
    out.extend(crc.to_le_bytes());
    out.extend(&json);
    out.extend(text.as_bytes());
    out.resize(data_off, 0);
    out.extend(&data);
    Ok((out, apart))
}

/// The header's fields.
#[derive(Clone, Copy, Debug)]
pub struct Header {
    pub version: u32,
    pub manifest: (usize, usize, u32),
    pub program: (usize, usize, u32),
    pub data: (usize, usize),
}

fn corrupt<T>(msg: impl Into<String>) -> Result<T, ExportError> {
    Err(ExportError::Corrupt(msg.into()))
}

/// Reads and checks the header: every range inside the file.
pub fn header(bytes: &[u8]) -> Result<Header, ExportError> {
    if bytes.len() < HEADER_LEN || bytes[..8] != MAGIC {
        return Err(ExportError::Format(format!(
            "the file is {} bytes and does not start with {:?}",
            bytes.len(),
            std::str::from_utf8(&MAGIC).unwrap_or("KILNPROG")
        )));
    }
    let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().expect("4 bytes"));
    let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().expect("8 bytes"));
    let version = u32_at(8);
    if version != FORMAT_VERSION && version != SHARED_WEIGHTS_VERSION {
        return Err(ExportError::Version(format!(
            "the file is export format version {version}; this runtime reads versions \
             {FORMAT_VERSION} and {SHARED_WEIGHTS_VERSION} (re-export the program with this \
             kiln, or use the kiln that wrote it)"
        )));
    }
    if crc32fast::hash(&bytes[..76]) != u32_at(76) {
        return corrupt("the header's checksum does not match");
    }
    let range = |off: u64, len: u64, what: &str| -> Result<(usize, usize), ExportError> {
        match off.checked_add(len) {
            Some(end) if end <= bytes.len() as u64 => Ok((off as usize, len as usize)),
            _ => corrupt(format!(
                "the {what} section ({len} bytes at {off}) runs past the end of the {}-byte file",
                bytes.len()
            )),
        }
    };
    let (mo, ml) = range(u64_at(16), u64_at(24), "manifest")?;
    let (po, pl) = range(u64_at(36), u64_at(44), "program")?;
    let (d_o, dl) = range(u64_at(56), u64_at(64), "data")?;
    if d_o % ALIGN != 0 {
        return corrupt(format!(
            "the data section starts at {d_o}, not a multiple of {ALIGN}"
        ));
    }
    Ok(Header {
        version,
        manifest: (mo, ml, u32_at(32)),
        program: (po, pl, u32_at(52)),
        data: (d_o, dl),
    })
}

/// A checked export: its manifest, the program it runs (from the
/// manifest) and the constants' bytes (borrowed from the file).
pub struct Exported<'a> {
    pub manifest: Manifest,
    /// The functionalized program as text (for inspection and the
    /// reference interpreter; runs do not need it).
    pub text: &'a str,
    pub program: Program,
    /// (parameter, stored dtype, bytes).
    pub constants: Vec<(usize, DType, &'a [u8])>,
}

/// Parses and checks every part of an export file: checksums, every name,
/// range and index of the manifest, every shader (naga). A damaged or
/// hostile file is an error, never a panic. An export whose weights are
/// in a file of their own (`weights_of`) needs `read_with`.
pub fn read(bytes: &[u8]) -> Result<Exported<'_>, ExportError> {
    read_with(bytes, None)
}

/// The manifest of an export file, its checksum checked.
fn manifest_of(bytes: &[u8], h: &Header) -> Result<Manifest, ExportError> {
    let json = &bytes[h.manifest.0..h.manifest.0 + h.manifest.1];
    if crc32fast::hash(json) != h.manifest.2 {
        return corrupt("the manifest section's checksum does not match");
    }
    serde_json::from_slice(json)
        .map_err(|e| ExportError::Corrupt(format!("the manifest does not parse: {e}")))
}

/// Where weights file `name` of the export at `export` lives: in the same
/// folder (a bare file name, never a path elsewhere: a manifest must not
/// send a reader to other files).
pub fn weights_path(
    export: &std::path::Path,
    name: &str,
) -> Result<std::path::PathBuf, ExportError> {
    let bare = std::path::Path::new(name)
        .file_name()
        .is_some_and(|f| f == std::ffi::OsStr::new(name));
    if !bare || name == ".." || name == "." {
        return Err(ExportError::Weights(format!(
            "the weights file `{name}` must be a file name, beside the export (no folder)"
        )));
    }
    Ok(export
        .parent()
        .unwrap_or(std::path::Path::new("."))
        .join(name))
}

/// The weights file an export reads its constants from, if it has one
/// (format version 3): load it from the export's folder for `read_with`.
pub fn weights_of(bytes: &[u8]) -> Result<Option<WeightsEntry>, ExportError> {
    let h = header(bytes)?;
    Ok(manifest_of(bytes, &h)?.weights)
}

/// `read` of an export and, where it keeps its constants apart, the
/// bytes of its weights file (length and checksum checked).
pub fn read_with<'a>(
    bytes: &'a [u8],
    weights: Option<&'a [u8]>,
) -> Result<Exported<'a>, ExportError> {
    let h = header(bytes)?;
    let manifest = manifest_of(bytes, &h)?;
    let program_text = &bytes[h.program.0..h.program.0 + h.program.1];
    if crc32fast::hash(program_text) != h.program.2 {
        return corrupt("the program section's checksum does not match");
    }
    let text = std::str::from_utf8(program_text)
        .map_err(|_| ExportError::Corrupt("the program text is not UTF-8".into()))?;
    let data = match (&manifest.weights, weights) {
        (None, _) if h.version == FORMAT_VERSION => &bytes[h.data.0..h.data.0 + h.data.1],
        (Some(w), Some(blob)) if h.version == SHARED_WEIGHTS_VERSION && h.data.1 == 0 => {
            if blob.len() as u64 != w.bytes || crc32fast::hash(blob) != w.crc32 {
                return Err(ExportError::Weights(format!(
                    "the weights file given for this export is not `{}` as it was exported \
                     ({} bytes, CRC-32 {:08x}; given: {} bytes): export the model and its \
                     weights again together",
                    w.file,
                    w.bytes,
                    w.crc32,
                    blob.len()
                )));
            }
            blob
        }
        (Some(w), None) if h.version == SHARED_WEIGHTS_VERSION => {
            return Err(ExportError::Weights(format!(
                "the export keeps its weights in `{}` ({} bytes), which must be loaded with it \
                 (from the export's folder)",
                w.file, w.bytes
            )))
        }
        _ => {
            return corrupt(format!(
                "a version-{} file {} a weights file of its own",
                h.version,
                if manifest.weights.is_some() {
                    "naming"
                } else {
                    "without"
                }
            ))
        }
    };
    let (program, constants) = rebuild(&manifest, data)?;
    Ok(Exported {
        manifest,
        text,
        program,
        constants,
    })
}

impl<'a> Exported<'a> {
    /// Every constant as its parameter's tensor: (parameter, tensor),
    /// f16-stored f32 widened, the others borrowing the file.
    pub fn constant_tensors(&self) -> Result<Vec<(usize, HostTensor<'a>)>, EngineError> {
        (0..self.constants.len())
            .map(|k| self.constant_tensor(k))
            .collect()
    }

    /// Constant `k` (of `constants`) as its parameter's tensor.
    pub fn constant_tensor(&self, k: usize) -> Result<(usize, HostTensor<'a>), EngineError> {
        let (i, stored, bytes) = self.constants[k];
        let m = self.program.param(i);
        let t = if stored == m.dtype {
            HostTensor::new(m.dtype, m.sizes.clone(), bytes)?
        } else {
            let wide: Vec<f32> = bytes
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect();
            HostTensor::from_slice(&m.sizes, &wide)?
        };
        Ok((i, t))
    }

    /// The functionalized program (parsed from the text section), its
    /// parameters checked against the manifest's.
    #[cfg(feature = "compiler")]
    pub fn graph(&self) -> Result<Graph, ExportError> {
        let g = kiln_functionalize::parse(self.text)
            .map_err(|e| ExportError::Corrupt(format!("the program text does not parse: {e}")))?;
        let names = kiln_functionalize::text::Names::of(&g);
        let p = &self.program;
        let agrees = g.inputs.len() == p.params.len()
            && g.inputs.iter().enumerate().all(|(i, &v)| {
                let (m, want) = (g.meta(v), p.param(i));
                names.name(v) == want.name && m.dtype == want.dtype && m.sizes[..] == want.sizes[..]
            });
        if !agrees {
            return corrupt("the program text's parameters do not match the manifest's");
        }
        Ok(g)
    }
}

type Rebuilt<'a> = (Program, Constants<'a>);

/// The most elements a value of an export may have (kernels index with
/// 32-bit integers).
const MAX_ELEMENTS: usize = u32::MAX as usize;

/// The manifest's values, by name.
struct Table {
    values: Vec<ValueInfo>,
    by_name: HashMap<String, Val>,
}

impl Table {
    /// Every value's type checked: a dtype this runtime knows, at most
    /// `MAX_ELEMENTS` elements, each name once.
    fn of(m: &Manifest) -> Result<Table, ExportError> {
        let mut t = Table {
            values: vec![],
            by_name: HashMap::new(),
        };
        for (k, e) in m.values.iter().enumerate() {
            let dtype = DType::parse(&e.dtype).ok_or_else(|| {
                ExportError::Corrupt(format!("value %{} has unknown dtype `{}`", e.name, e.dtype))
            })?;
            let n = e
                .shape
                .iter()
                .try_fold(1usize, |a, &d| a.checked_mul(d))
                .filter(|&n| n <= MAX_ELEMENTS);
            if n.is_none() {
                return corrupt(format!("value %{} has too many elements", e.name));
            }
            if t.by_name.insert(e.name.clone(), k).is_some() {
                return corrupt(format!("value %{} is listed twice", e.name));
            }
            t.values.push(ValueInfo {
                name: e.name.clone(),
                dtype,
                sizes: e.shape.clone(),
            });
        }
        Ok(t)
    }

    fn value(&self, n: &str) -> Result<Val, ExportError> {
        self.by_name.get(n).copied().ok_or_else(|| {
            ExportError::Corrupt(format!("the manifest names %{n}, which it does not list"))
        })
    }

    fn values(&self, names: &[String]) -> Result<Vec<Val>, ExportError> {
        names.iter().map(|n| self.value(n)).collect()
    }
}

/// The program the manifest describes, every name, range and index
/// checked.
fn rebuild<'a>(m: &Manifest, data: &'a [u8]) -> Result<Rebuilt<'a>, ExportError> {
    let table = Table::of(m)?;
    let (params, constants) = params_and_constants(m, &table, data)?;
    check_buffers(m)?;
    let outputs = table.values(&m.outputs)?;
    if m.n_outputs > outputs.len() || outputs.len() - m.n_outputs != m.mutated_inputs.len() {
        return corrupt("the output counts do not agree");
    }
    let locs = locations(m, &table)?;
    let readback = table.values(&m.readback)?;
    let host_views = host_views(m, &table, &locs)?;
    for &v in outputs.iter().chain(&readback) {
        if !locs.contains_key(&v) && !host_views.contains_key(&v) {
            return corrupt(format!("%{} has no buffer", table.values[v].name));
        }
    }
    let kernels = kernels(m)?;
    let mem = m.memory;
    let program = Program {
        name: m.name.clone(),
        values: table.values,
        params,
        statements: m.statements.clone(),
        outputs,
        readback,
        host_views,
        n_outputs: m.n_outputs,
        mutated_inputs: m.mutated_inputs.clone(),
        kernels,
        locs,
        param_words: m.param_words.clone(),
        constants: constants.iter().map(|c| c.0).collect(),
        written_params: m.written_params.clone(),
        arena_words: m.arena_words,
        status_word: m.status_word,
        memory: MemoryStats {
            io: mem[0],
            arena: mem[1],
            lower_bound: mem[2],
            naive: mem[3],
            naive_unfused: mem[4],
            eager_peak: mem[5],
        },
        min_bytes: m.min_bytes,
    };
    Ok((program, constants))
}

/// Each constant: (parameter, stored dtype, bytes).
type Constants<'a> = Vec<(usize, DType, &'a [u8])>;

/// The parameters (their types as the values table says, their buffers
/// large enough) and the constants' bytes (inside the data section,
/// checksums matching).
fn params_and_constants<'a>(
    m: &Manifest,
    table: &Table,
    data: &'a [u8],
) -> Result<(Vec<Val>, Constants<'a>), ExportError> {
    let np = m.params.len();
    if m.param_words.len() != np {
        return corrupt(format!(
            "the manifest lists {np} parameters and {} buffer sizes",
            m.param_words.len()
        ));
    }
    let mut constants = vec![];
    let mut params = vec![];
    // Where each parameter goes: its own buffer, or another's (a pack of
    // small ones).
    let slot: HashMap<&str, (usize, usize)> = (m.locs.iter())
        .filter_map(|l| Some((l.value.as_str(), (l.param?, l.word))))
        .collect();
    for (i, p) in m.params.iter().enumerate() {
        let v = table.value(&p.name)?;
        let meta = &table.values[v];
        if meta.dtype.name() != p.dtype || meta.sizes[..] != p.shape[..] {
            return corrupt(format!(
                "parameter {i} is %{} {} in the manifest's parameters but {} in its values",
                p.name,
                p.dtype,
                meta.type_string()
            ));
        }
        params.push(v);
        let words = crate::kernel::words(meta.dtype, meta.numel(), true);
        let (buffer, word) = slot.get(p.name.as_str()).copied().unwrap_or((i, 0));
        let holds = word
            .checked_add(words)
            .is_some_and(|end| m.param_words.get(buffer).is_some_and(|&w| w >= end));
        if !holds {
            return corrupt(format!("parameter {i}'s buffer is smaller than its tensor"));
        }
        if let Some(c) = &p.constant {
            let stored = DType::parse(&c.stored)
                .filter(|&s| s == meta.dtype || (s == DType::F16 && meta.dtype == DType::F32))
                .ok_or_else(|| {
                    ExportError::Corrupt(format!(
                        "constant %{} is stored as `{}`, which cannot hold a {} tensor",
                        p.name, c.stored, meta.dtype
                    ))
                })?;
            let want = (meta.numel() as u64).checked_mul(stored.size_bytes() as u64);
            let end = c.offset.checked_add(c.bytes);
            match (want, end) {
                (Some(w), Some(e)) if w == c.bytes && e <= data.len() as u64 && c.offset % ALIGN as u64 == 0 => {}
                _ => {
                    return corrupt(format!(
                        "constant %{} ({} bytes at {}) does not fit its type or the {}-byte data section",
                        p.name,
                        c.bytes,
                        c.offset,
                        data.len()
                    ))
                }
            }
            let bytes = &data[c.offset as usize..(c.offset + c.bytes) as usize];
            if crc32fast::hash(bytes) != c.crc32 {
                return corrupt(format!("constant %{}'s checksum does not match", p.name));
            }
            constants.push((i, stored, bytes));
        }
    }
    Ok((params, constants))
}

/// Buffer sizes in words: parameters, then the arena (plus the spare word
/// every arena has). Bounded so that no size computation wraps (on 32-bit
/// targets, wasm32, far below what `usize` holds).
const MAX_WORDS: usize = if usize::BITS > 40 {
    1 << (40 % usize::BITS)
} else {
    usize::MAX / 16
};

/// Buffer sizes in range, the status word in the arena, parameter indices
/// that exist.
fn check_buffers(m: &Manifest) -> Result<(), ExportError> {
    if m.arena_words > MAX_WORDS || m.param_words.iter().any(|&w| w > MAX_WORDS) {
        return corrupt("a buffer size is out of range");
    }
    if m.status_word.is_some_and(|w| w >= m.arena_words) {
        return corrupt("the status word lies outside the arena");
    }
    let np = m.params.len();
    let index_ok = |l: &[usize]| l.iter().all(|&i| i < np);
    if !index_ok(&m.mutated_inputs) || !index_ok(&m.written_params) {
        return corrupt("a mutated or written parameter index is out of range");
    }
    Ok(())
}

/// Words of a parameter's buffer (`Some(i)`) or of the arena.
fn buffer_words(m: &Manifest, param: Option<usize>) -> Result<usize, ExportError> {
    match param {
        None => Ok(m.arena_words + 1),
        Some(i) if i < m.param_words.len() => Ok(m.param_words[i]),
        Some(i) => corrupt(format!("parameter {i} does not exist")),
    }
}

/// Where each value lives, every one inside its buffer.
fn locations(m: &Manifest, table: &Table) -> Result<HashMap<Val, Loc>, ExportError> {
    let mut locs = HashMap::new();
    for l in &m.locs {
        let v = table.value(&l.value)?;
        let meta = &table.values[v];
        let words = crate::kernel::words(meta.dtype, meta.numel(), l.packed);
        match l.word.checked_add(words) {
            Some(end) if end <= buffer_words(m, l.param)? => {}
            _ => return corrupt(format!("%{} lies outside its buffer", l.value)),
        }
        let buf = l.param.map_or(Buf::Arena, Buf::Param);
        locs.insert(
            v,
            Loc {
                buf,
                word: l.word,
                packed: l.packed,
            },
        );
    }
    Ok(locs)
}

/// Outputs taken as views of a read-back buffer: every element of the
/// view inside its base.
fn host_views(
    m: &Manifest,
    table: &Table,
    locs: &HashMap<Val, Loc>,
) -> Result<HashMap<Val, HostView>, ExportError> {
    let mut host_views = HashMap::new();
    for h in &m.host_views {
        let (o, b) = (table.value(&h.output)?, table.value(&h.base)?);
        if !locs.contains_key(&b) {
            return corrupt(format!("the base of host view %{} has no buffer", h.output));
        }
        // Every element of the view lies inside the base.
        let (vm, bm) = (&table.values[o], &table.values[b]);
        let last = h
            .shape
            .iter()
            .zip(&h.strides)
            .try_fold(h.offset, |a, (&n, &st)| {
                a.checked_add(n.saturating_sub(1).checked_mul(st)?)
            });
        let empty = h.shape.contains(&0);
        if h.shape != vm.sizes
            || h.strides.len() != h.shape.len()
            || vm.dtype != bm.dtype
            || !empty && last.is_none_or(|l| l >= bm.numel())
        {
            return corrupt(format!(
                "host view %{} does not fit its base %{}",
                h.output, h.base
            ));
        }
        host_views.insert(
            o,
            HostView {
                base: b,
                sizes: h.shape.clone(),
                strides: h.strides.clone(),
                offset: h.offset,
            },
        );
    }
    Ok(host_views)
}

/// The kernels: bindings inside their buffers, the entry point this
/// runtime runs, a grid, a shader naga validates.
fn kernels(m: &Manifest) -> Result<Vec<Kernel>, ExportError> {
    let mut kernels = vec![];
    for (k, e) in m.kernels.iter().enumerate() {
        let mut bindings = vec![];
        for b in &e.bindings {
            let limit = buffer_words(m, b.param)? as u64 * 4;
            match b.offset.checked_add(b.size) {
                Some(end) if end <= limit && b.size > 0 && b.offset % 4 == 0 && b.size % 4 == 0 => {
                }
                _ => {
                    return corrupt(format!(
                        "kernel {k} ({}) binds {} bytes at {} of a {limit}-byte buffer",
                        e.label, b.size, b.offset
                    ))
                }
            }
            bindings.push(Binding {
                buf: b.param.map_or(Buf::Arena, Buf::Param),
                offset: b.offset,
                size: b.size,
                write: b.write,
            });
        }
        if e.entry != ENTRY {
            return corrupt(format!(
                "kernel {k} ({}) names entry point `{}`; this runtime runs `{ENTRY}`",
                e.label, e.entry
            ));
        }
        if e.grid.contains(&0) {
            return corrupt(format!("kernel {k} ({}) has an empty grid", e.label));
        }
        for w in std::iter::once(&e.wgsl).chain(&e.wgsl_f16) {
            validate_wgsl(w, bindings.len())
                .map_err(|msg| ExportError::Corrupt(format!("kernel {k} ({}): {msg}", e.label)))?;
        }
        kernels.push(Kernel {
            code: KernelCode {
                label: e.label.clone(),
                wgsl: e.wgsl.clone(),
                wgsl_f16: e.wgsl_f16.clone(),
                grid: e.grid,
                bindings,
                subgroup: m.requires.features.iter().any(|f| f == "subgroup"),
            },
            ops: e.ops.clone(),
            bytes_read: e.bytes_read,
            bytes_written: e.bytes_written,
            flops: e.flops,
        });
    }
    Ok(kernels)
}

/// A kernel's invocations per workgroup and workgroup memory in bytes.
#[cfg(feature = "compiler")]
fn shader_needs(src: &str) -> Result<(u32, u32), String> {
    let module = naga::front::wgsl::parse_str(src).map_err(|e| format!("shader: {e}"))?;
    let invocations = module
        .entry_points
        .iter()
        .map(|e| e.workgroup_size.iter().product::<u32>())
        .max()
        .unwrap_or(1);
    let shared = module
        .global_variables
        .iter()
        .filter(|(_, v)| v.space == naga::AddressSpace::WorkGroup)
        .map(|(_, v)| module.types[v.ty].inner.size(module.to_ctx()))
        .sum();
    Ok((invocations, shared))
}

/// naga's verdict on a kernel: it parses, validates, has the entry point
/// `main` and declares exactly the bindings the manifest gives it.
fn validate_wgsl(src: &str, bindings: usize) -> Result<(), String> {
    let module = naga::front::wgsl::parse_str(src).map_err(|e| format!("shader: {e}"))?;
    naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    )
    .validate(&module)
    .map_err(|e| format!("shader does not validate: {e:?}"))?;
    if !module.entry_points.iter().any(|e| e.name == ENTRY) {
        return Err(format!("shader has no entry point `{ENTRY}`"));
    }
    let declared = module
        .global_variables
        .iter()
        .filter(|(_, v)| v.binding.is_some())
        .count();
    if declared != bindings {
        return Err(format!(
            "shader declares {declared} bindings, the manifest gives {bindings}"
        ));
    }
    Ok(())
}

impl Requirements {
    /// What `gpu` lacks of these, in words; `None` when it has all.
    pub fn missing(&self, gpu: &crate::Gpu) -> Option<String> {
        let l = &gpu.limits;
        let mut miss = vec![];
        for f in &self.features {
            let has = match f.as_str() {
                "subgroup" => gpu.features.contains(wgpu::Features::SUBGROUP),
                _ => false,
            };
            if !has {
                miss.push(format!("feature `{f}`"));
            }
        }
        let mut need = |what: &str, want: u64, have: u64, at_most: bool| {
            let ok = if at_most { have <= want } else { have >= want };
            if !ok {
                miss.push(format!("{what} {want} (the device: {have})"));
            }
        };
        need(
            "storage buffer offsets aligned to",
            self.min_storage_buffer_offset_alignment as u64,
            l.min_storage_buffer_offset_alignment as u64,
            true,
        );
        need(
            "storage bindings of",
            self.max_storage_buffer_binding_size,
            l.max_storage_buffer_binding_size,
            false,
        );
        need(
            "storage buffers per stage:",
            self.max_storage_buffers_per_shader_stage as u64,
            l.max_storage_buffers_per_shader_stage as u64,
            false,
        );
        need("buffers of", self.max_buffer_size, l.max_buffer_size, false);
        need(
            "invocations per workgroup:",
            self.max_compute_invocations_per_workgroup as u64,
            l.max_compute_invocations_per_workgroup as u64,
            false,
        );
        need(
            "workgroup memory of",
            self.max_compute_workgroup_storage_size as u64,
            l.max_compute_workgroup_storage_size as u64,
            false,
        );
        need(
            "workgroups per dimension:",
            self.max_compute_workgroups_per_dimension as u64,
            l.max_compute_workgroups_per_dimension as u64,
            false,
        );
        (!miss.is_empty()).then(|| miss.join(", "))
    }
}

impl Session {
    /// Loads a checked export: its requirements met by this device, its
    /// constants uploaded (f16-stored ones widened), its kernels made
    /// pipelines. Runs take the parameters that are not constants.
    /// Natively the shaders compile while the weights upload.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn load_exported(&self, e: &Exported<'_>) -> Result<crate::Executable, ExportError> {
        self.check_requirements(e)?;
        let bound = std::thread::scope(|s| {
            // Its pipelines join the session's cache, where the load below
            // finds them; one that failed is made again there and its error
            // reported.
            let warm = s.spawn(|| pollster::block_on(self.pipelines_of(&e.program)).is_ok());
            let bound = pollster::block_on(self.upload_constants(e));
            let _ = warm.join();
            bound
        })?;
        Ok(pollster::block_on(
            self.load_bound(e.program.clone(), bound),
        )?)
    }

    /// `load_exported` without blocking (the only form in a browser).
    pub async fn load_exported_async(
        &self,
        e: &Exported<'_>,
    ) -> Result<crate::Executable, ExportError> {
        self.check_requirements(e)?;
        // The pipelines are asked for first: the device compiles them while
        // this thread widens and copies the constants in behind them (in a
        // browser, the GPU process compiles while the page's thread works).
        // They join the session's cache, where the load below finds them;
        // one that failed is made again there and its error reported.
        let (_, bound) =
            futures::future::join(self.pipelines_of(&e.program), self.upload_constants(e)).await;
        Ok(self.load_bound(e.program.clone(), bound?).await?)
    }

    fn check_requirements(&self, e: &Exported<'_>) -> Result<(), ExportError> {
        match e.manifest.requires.missing(self.gpu()) {
            Some(miss) => Err(ExportError::Engine(EngineError::Unsupported(format!(
                "the export needs {miss}; it was compiled for another device: re-export it \
                 on this one"
            )))),
            None => Ok(()),
        }
    }

    /// The export's constants on the device, by parameter (one wait for
    /// the device after all of them).
    async fn upload_constants(
        &self,
        e: &Exported<'_>,
    ) -> Result<Vec<(usize, crate::DeviceTensor)>, ExportError> {
        let (bound, fresh) = self
            .uploading("uploading the export's constants", |put| {
                let mut bound = vec![];
                let mut fresh: Vec<(crate::runtime::SharedWeight, crate::DeviceTensor)> = vec![];
                for (k, &(i, _, _)) in e.constants.iter().enumerate() {
                    // Exports sharing a weights file share its tensors on
                    // the device: each is widened and uploaded once per
                    // session.
                    let key = e
                        .manifest
                        .weights
                        .as_ref()
                        .zip(e.manifest.params[i].constant.as_ref());
                    let key =
                        key.map(|(w, c)| (w.crc32, w.bytes, c.offset, e.program.param(i).dtype));
                    let known = key.and_then(|k| {
                        self.shared_weight(&k)
                            .or_else(|| fresh.iter().find(|(f, _)| *f == k).map(|(_, d)| d.clone()))
                    });
                    let d = match known {
                        Some(d) => d,
                        None => {
                            let d = put(&e.constant_tensor(k)?.1)?;
                            fresh.extend(key.map(|k| (k, d.clone())));
                            d
                        }
                    };
                    bound.push((i, d));
                }
                Ok::<_, ExportError>((bound, fresh))
            })
            .await?;
        // Shared only once the device took them all.
        for (k, d) in fresh {
            self.keep_shared_weight(k, d);
        }
        Ok(bound)
    }
}
