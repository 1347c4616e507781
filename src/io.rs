//! Reading inputs from and writing results to safetensors files, with the
//! names and layout of the program format's `run` command.

use kiln_engine::HostTensor;
use kiln_functionalize::{interp::RunResult, text::Names, DType, Graph, RTensor};
use safetensors::{tensor::TensorView, Dtype, SafeTensors};
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum IoError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is not a valid safetensors file: {msg}")]
    Format { path: String, msg: String },
    #[error("{path}: input tensor `{name}` {msg}")]
    Input {
        path: String,
        name: String,
        msg: String,
    },
}

fn st_dtype(d: DType) -> Dtype {
    match d {
        DType::F32 => Dtype::F32,
        DType::F16 => Dtype::F16,
        DType::I32 => Dtype::I32,
        DType::I64 => Dtype::I64,
        DType::U32 => Dtype::U32,
        DType::I8 => Dtype::I8,
        DType::Bool => Dtype::BOOL,
    }
}

/// Decodes little-endian elements of `dtype` into `f64`s.
pub fn decode(dtype: DType, bytes: &[u8]) -> Vec<f64> {
    match dtype {
        DType::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
            .collect(),
        DType::F16 => bytes
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes(c.try_into().unwrap()).to_f64())
            .collect(),
        DType::I32 => bytes
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as f64)
            .collect(),
        DType::I64 => bytes
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f64)
            .collect(),
        DType::U32 => bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()) as f64)
            .collect(),
        DType::I8 => bytes.iter().map(|&b| b as i8 as f64).collect(),
        DType::Bool => bytes.iter().map(|&b| (b != 0) as u8 as f64).collect(),
    }
}

/// `decode`, refusing i64 values the reference cannot hold exactly.
fn decode_exact(dtype: DType, bytes: &[u8]) -> Result<Vec<f64>, String> {
    let vals = decode(dtype, bytes);
    if dtype == DType::I64 {
        if let Some(i) = vals
            .iter()
            .position(|v| v.abs() > kiln_functionalize::dtype::I64_EXACT)
        {
            let v = i64::from_le_bytes(bytes[8 * i..8 * i + 8].try_into().unwrap());
            return Err(format!(
                "holds {v} at element {i}; Kiln computes i64 exactly within +-2^53 only"
            ));
        }
    }
    Ok(vals)
}

fn read(path: &Path) -> Result<(String, Vec<u8>), IoError> {
    let p = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|source| IoError::Read {
        path: p.clone(),
        source,
    })?;
    Ok((p, bytes))
}

fn parse<'a>(p: &str, bytes: &'a [u8]) -> Result<SafeTensors<'a>, IoError> {
    SafeTensors::deserialize(bytes).map_err(|e| IoError::Format {
        path: p.to_string(),
        msg: e.to_string(),
    })
}

/// Reads one tensor per parameter of `g`, by the parameter's name.
pub fn load_inputs(g: &Graph, path: &Path) -> Result<Vec<RTensor>, IoError> {
    let (p, bytes) = read(path)?;
    let st = parse(&p, &bytes)?;
    let names = Names::of(g);
    let mut out = vec![];
    for &v in &g.inputs {
        let name = names.get(v);
        let want = g.meta(v);
        let err = |msg: String| IoError::Input {
            path: p.clone(),
            name: name.clone(),
            msg,
        };
        let t = st.tensor(&name).map_err(|_| {
            let mut have = st.names();
            have.sort();
            err(format!(
                "is missing (the file holds: {})",
                if have.is_empty() {
                    "nothing".into()
                } else {
                    have.join(", ")
                }
            ))
        })?;
        if kiln_dtype(t.dtype()).is_none() {
            return Err(err(unsupported(
                &format!("{:?}", t.dtype()),
                Some(want.dtype),
            )));
        }
        if t.dtype() != st_dtype(want.dtype) {
            return Err(err(format!(
                "has dtype {:?}, the program declares {}",
                t.dtype(),
                want.type_string()
            )));
        }
        if t.shape() != want.sizes.as_slice() {
            return Err(err(format!(
                "has shape {:?}, the program declares {}",
                t.shape(),
                want.type_string()
            )));
        }
        let vals = decode_exact(want.dtype, t.data()).map_err(err)?;
        out.push(RTensor::new(want.dtype, want.sizes.clone(), &vals));
    }
    Ok(out)
}

/// Writes `output.0`, `output.1`, ... and every parameter's final value
/// under its own name, contiguous.
pub fn save_results(g: &Graph, r: &RunResult, path: &Path) -> Result<(), IoError> {
    let names = Names::of(g);
    let mut named: Vec<(String, RTensor)> = r
        .outputs
        .iter()
        .enumerate()
        .map(|(i, t)| (format!("output.{i}"), t.clone()))
        .collect();
    named.extend(
        g.inputs
            .iter()
            .zip(&r.inputs)
            .map(|(&v, t)| (names.get(v), t.clone())),
    );
    save_all(path, &named)
}

/// Reads every tensor of a safetensors file (for tests and tools).
pub fn load_all(path: &Path) -> Result<Vec<(String, RTensor)>, IoError> {
    let (p, bytes) = read(path)?;
    let st = parse(&p, &bytes)?;
    let mut out = vec![];
    for (name, t) in st.tensors() {
        let Some(dtype) = kiln_dtype(t.dtype()) else {
            return Err(IoError::Input {
                path: p,
                name,
                msg: unsupported(&format!("{:?}", t.dtype()), None),
            });
        };
        let vals = decode_exact(dtype, t.data()).map_err(|msg| IoError::Input {
            path: p.clone(),
            name: name.clone(),
            msg,
        })?;
        out.push((name, RTensor::new(dtype, t.shape().to_vec(), &vals)));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// Writes named tensors to a safetensors file.
pub fn save_all(path: &Path, tensors: &[(String, RTensor)]) -> Result<(), IoError> {
    let host: Vec<(String, HostTensor)> = tensors
        .iter()
        .map(|(n, t)| (n.clone(), HostTensor::from_rtensor(t)))
        .collect();
    save_host(path, &host)
}

fn kiln_dtype(d: Dtype) -> Option<DType> {
    Some(match d {
        Dtype::F32 => DType::F32,
        Dtype::F16 => DType::F16,
        Dtype::I32 => DType::I32,
        Dtype::I64 => DType::I64,
        Dtype::U32 => DType::U32,
        Dtype::I8 => DType::I8,
        Dtype::BOOL => DType::Bool,
        _ => return None,
    })
}

/// What to say of a tensor stored as `dtype`, which Kiln does not hold:
/// what it holds and the conversion to make before saving (to `want`,
/// the dtype the program declares, where there is one).
fn unsupported(dtype: &str, want: Option<DType>) -> String {
    let call = match want {
        Some(DType::F32) => "x.float()",
        Some(DType::F16) => "x.half()",
        Some(DType::I64) => "x.long()",
        Some(DType::I32) => "x.int()",
        Some(DType::U32) => "x.to(torch.uint32)",
        Some(DType::I8) => "x.to(torch.int8)",
        Some(DType::Bool) => "x.bool()",
        None => match dtype {
            "U8" | "I16" | "U16" => "x.int()",
            "U64" => "x.long()",
            _ => "x.float()",
        },
    };
    format!(
        "is stored as {dtype}, a dtype Kiln does not hold (it holds f32, f16, i64, i32, u32, \
         i8 and bool): convert it with `{call}` before saving"
    )
}

/// Where a mapped tensor's bytes are: a range of the mapped file, or a
/// copy (a compressed archive entry, a strided weight made contiguous, a
/// constant made at import).
pub enum Src {
    Map(std::ops::Range<usize>),
    Owned(Vec<u8>),
}

/// A safetensors file (or a `.pt2` archive's weights) mapped in memory: its
/// tensors are host tensors borrowing the mapped bytes (no copy, no
/// conversion). Tensors of dtypes Kiln lacks (f64 buffers and such) are
/// listed apart.
pub struct MappedTensors {
    path: String,
    map: memmap2::Mmap,
    tensors: Vec<(String, DType, Vec<usize>, Src)>,
    /// Names of tensors whose dtype Kiln does not support, with the dtype.
    pub skipped: Vec<(String, String)>,
}

impl MappedTensors {
    pub fn open(path: &Path) -> Result<MappedTensors, IoError> {
        let p = path.display().to_string();
        let file = std::fs::File::open(path).map_err(|source| IoError::Read {
            path: p.clone(),
            source,
        })?;
        // SAFETY: the file is opened read-only; Kiln never writes it while
        // mapped (another process truncating it is outside what Rust can
        // guard, as with every mmap).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|source| IoError::Read {
            path: p.clone(),
            source,
        })?;
        let st = parse(&p, &map)?;
        let base = map.as_ptr() as usize;
        let mut tensors = vec![];
        let mut skipped = vec![];
        for (name, t) in st.tensors() {
            match kiln_dtype(t.dtype()) {
                Some(d) => {
                    let start = t.data().as_ptr() as usize - base;
                    let range = start..start + t.data().len();
                    tensors.push((name, d, t.shape().to_vec(), Src::Map(range)));
                }
                None => skipped.push((name, format!("{:?}", t.dtype()))),
            }
        }
        tensors.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(MappedTensors {
            path: p,
            map,
            tensors,
            skipped,
        })
    }

    /// Tensors of an already mapped file (an archive), by name.
    pub fn from_parts(
        path: String,
        map: memmap2::Mmap,
        mut tensors: Vec<(String, DType, Vec<usize>, Src)>,
    ) -> MappedTensors {
        tensors.sort_by(|a, b| a.0.cmp(&b.0));
        MappedTensors {
            path,
            map,
            tensors,
            skipped: vec![],
        }
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    fn bytes<'a>(&'a self, s: &'a Src) -> &'a [u8] {
        match s {
            Src::Map(r) => &self.map[r.clone()],
            Src::Owned(v) => v,
        }
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.iter().map(|t| t.0.as_str())
    }

    /// The tensor `name`, borrowing the mapped file.
    pub fn get(&self, name: &str) -> Option<HostTensor<'_>> {
        let i = self
            .tensors
            .binary_search_by(|t| t.0.as_str().cmp(name))
            .ok()?;
        let (_, d, sizes, src) = &self.tensors[i];
        HostTensor::new(*d, sizes.clone(), self.bytes(src)).ok()
    }

    /// Every tensor, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, HostTensor<'_>)> {
        self.tensors.iter().filter_map(|(n, d, s, r)| {
            Some((
                n.as_str(),
                HostTensor::new(*d, s.clone(), self.bytes(r)).ok()?,
            ))
        })
    }

    /// One tensor per parameter of `g` (by name), checked against the
    /// declared types; `skip(i)` parameters are left out (constants).
    pub fn inputs_for(
        &self,
        g: &Graph,
        skip: &dyn Fn(usize) -> bool,
    ) -> Result<Vec<HostTensor<'_>>, IoError> {
        let names = Names::of(g);
        let mut out = vec![];
        for (i, &v) in g.inputs.iter().enumerate() {
            if skip(i) {
                continue;
            }
            let name = names.get(v);
            let want = g.meta(v);
            let err = |msg: String| IoError::Input {
                path: self.path.clone(),
                name: name.clone(),
                msg,
            };
            let t = self.get(&name).ok_or_else(|| {
                if let Some((_, d)) = self.skipped.iter().find(|s| s.0 == name) {
                    return err(unsupported(d, Some(want.dtype)));
                }
                let mut have: Vec<&str> = self.names().collect();
                have.extend(self.skipped.iter().map(|s| s.0.as_str()));
                have.sort_unstable();
                err(format!(
                    "is missing (the file holds: {})",
                    if have.is_empty() {
                        "nothing".into()
                    } else {
                        have.join(", ")
                    }
                ))
            })?;
            if t.dtype() != want.dtype || t.sizes() != want.sizes.as_slice() {
                return Err(err(format!(
                    "is {}, the program declares {}",
                    t.type_string(),
                    want.type_string()
                )));
            }
            out.push(t);
        }
        Ok(out)
    }
}

/// Writes named host tensors to a safetensors file.
pub fn save_host(path: &Path, tensors: &[(String, HostTensor)]) -> Result<(), IoError> {
    let p = path.display().to_string();
    let views = tensors
        .iter()
        .map(|(n, t)| {
            Ok((
                n.clone(),
                TensorView::new(st_dtype(t.dtype()), t.sizes().to_vec(), t.bytes())?,
            ))
        })
        .collect::<Result<Vec<_>, safetensors::SafeTensorError>>()
        .map_err(|e| IoError::Format {
            path: p.clone(),
            msg: e.to_string(),
        })?;
    let bytes = safetensors::serialize(views, None).map_err(|e| IoError::Format {
        path: p.clone(),
        msg: e.to_string(),
    })?;
    std::fs::write(path, bytes).map_err(|source| IoError::Write { path: p, source })
}
