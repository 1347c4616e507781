//! The PT2 archive (`torch.export.save`): a zip of `<name>/models/*.json`
//! (the exported program), `<name>/data/weights/` and
//! `<name>/data/constants/` (raw little-endian tensors described by their
//! JSON configs) and a few version files. Stored entries are borrowed from
//! the memory-mapped file; every entry's CRC is checked before use.

use super::ImportError;
use crate::io::Src;
use kiln_functionalize::DType;
use serde_json::Value;
use std::path::Path;

/// Schema majors this reader knows (`torch/_export/serde/schema.py`'s
/// `SCHEMA_VERSION`); minors only add fields.
pub const SCHEMA_MAJORS: std::ops::RangeInclusive<u64> = 8..=8;

/// A tensor stored in the archive: its state-dict name, dtype, sizes and
/// contiguous little-endian bytes.
pub struct Stored {
    pub name: String,
    pub dtype: DType,
    pub sizes: Vec<usize>,
    pub bytes: Src,
}

pub struct Archive {
    pub path: String,
    pub map: memmap2::Mmap,
    /// `models/<model>.json`, parsed.
    pub model: Value,
    /// Weights (`data/weights`) then constants (`data/constants`), by
    /// state-dict name.
    pub tensors: Vec<Stored>,
}

impl Archive {
    pub fn get(&self, name: &str) -> Option<&Stored> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// A stored tensor's bytes.
    pub fn bytes<'a>(&'a self, s: &'a Stored) -> &'a [u8] {
        match &s.bytes {
            Src::Map(r) => &self.map[r.clone()],
            Src::Owned(v) => v,
        }
    }
}

struct Zip<'a> {
    path: &'a str,
    map: &'a [u8],
    zip: zip::ZipArchive<std::io::Cursor<&'a [u8]>>,
    /// `<archive name>/`: every entry's folder.
    prefix: String,
}

impl Zip<'_> {
    fn damaged(&self, msg: impl std::fmt::Display) -> ImportError {
        ImportError::Archive(format!("{}: {msg}", self.path))
    }

    /// The bytes of entry `name` (under the prefix), CRC checked: a range
    /// of the map for a stored entry, else decompressed.
    fn entry(&mut self, name: &str) -> Result<Option<Src>, ImportError> {
        let full = format!("{}{name}", self.prefix);
        let Some(i) = self.zip.index_for_name(&full) else {
            return Ok(None);
        };
        let (path, map) = (self.path, self.map);
        let bad = |m: String| ImportError::Archive(format!("{path}: entry `{full}`: {m}"));
        let f = self.zip.by_index_raw(i).map_err(|e| bad(e.to_string()))?;
        let (size, crc, stored) = (
            f.size(),
            f.crc32(),
            f.compression() == zip::CompressionMethod::Stored,
        );
        let start = f.data_start();
        drop(f);
        let bytes = match start {
            Some(s) if stored => {
                let s = usize::try_from(s).map_err(|_| bad("offset out of range".into()))?;
                let end = s
                    .checked_add(size as usize)
                    .filter(|&e| e <= map.len())
                    .ok_or_else(|| bad("its data runs past the end of the file".into()))?;
                Src::Map(s..end)
            }
            _ => {
                let mut f = self.zip.by_index(i).map_err(|e| bad(e.to_string()))?;
                let mut v = Vec::with_capacity(size.min(1 << 30) as usize);
                std::io::Read::read_to_end(&mut f, &mut v).map_err(|e| bad(e.to_string()))?;
                Src::Owned(v)
            }
        };
        let data = match &bytes {
            Src::Map(r) => &map[r.clone()],
            Src::Owned(v) => v,
        };
        if crc32fast::hash(data) != crc {
            return Err(bad(
                "its CRC does not match its bytes (a damaged file)".into()
            ));
        }
        Ok(Some(bytes))
    }

    fn text(&mut self, name: &str) -> Result<Option<String>, ImportError> {
        let Some(b) = self.entry(name)? else {
            return Ok(None);
        };
        let data = match &b {
            Src::Map(r) => self.map[r.clone()].to_vec(),
            Src::Owned(v) => v.clone(),
        };
        String::from_utf8(data)
            .map(Some)
            .map_err(|_| self.damaged(format!("`{name}` is not UTF-8 text")))
    }

    fn json(&mut self, name: &str) -> Result<Option<Value>, ImportError> {
        let Some(t) = self.text(name)? else {
            return Ok(None);
        };
        // Python's `json` writes infinities and NaN as bare words.
        let v = serde_json::from_str(&finite_json(&t))
            .map_err(|e| self.damaged(format!("`{name}` is not valid JSON: {e}")))?;
        Ok(Some(v))
    }
}

/// Python's JSON extensions `Infinity`, `-Infinity` and `NaN` (outside
/// strings) as the strings `"inf"`, `"-inf"` and `"nan"`.
fn finite_json(s: &str) -> std::borrow::Cow<'_, str> {
    if !(s.contains("Infinity") || s.contains("NaN")) {
        return s.into();
    }
    let mut out = String::with_capacity(s.len() + 16);
    let (mut in_str, mut escaped) = (false, false);
    let mut rest = s;
    while let Some(c) = rest.chars().next() {
        if in_str {
            out.push(c);
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_str = false,
                _ => {}
            }
            rest = &rest[c.len_utf8()..];
            continue;
        }
        let word = [
            ("-Infinity", "\"-inf\""),
            ("Infinity", "\"inf\""),
            ("NaN", "\"nan\""),
        ]
        .into_iter()
        .find(|(w, _)| rest.starts_with(w));
        if let Some((w, r)) = word {
            out.push_str(r);
            rest = &rest[w.len()..];
        } else {
            in_str = c == '"';
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out.into()
}

/// Does the file start like a zip archive (so commands take it as `.pt2`)?
pub fn is_zip(path: &Path) -> bool {
    use std::io::Read;
    let mut head = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok()
        && head == *b"PK\x03\x04"
}

/// Opens and checks an archive: format, byte order, schema version, the
/// model's JSON, and every weight and constant against its config.
pub fn open(path: &Path) -> Result<Archive, ImportError> {
    let p = path.display().to_string();
    let file = std::fs::File::open(path)
        .map_err(|e| ImportError::Archive(format!("cannot read {p}: {e}")))?;
    // SAFETY: mapped read-only; Kiln never writes an archive it reads
    // (another process truncating it is outside what Rust can guard).
    let map = unsafe { memmap2::Mmap::map(&file) }
        .map_err(|e| ImportError::Archive(format!("cannot map {p}: {e}")))?;
    let (model, tensors) = read(&p, &map)?;
    Ok(Archive {
        path: p,
        map,
        model,
        tensors,
    })
}

fn read(p: &str, map: &[u8]) -> Result<(Value, Vec<Stored>), ImportError> {
    // PyTorch's writer starts the archive at byte 0. Left to guess, the zip
    // crate takes the central directory to start where its size says,
    // counted back from the end record, which PyTorch's ZIP64 records
    // (76 bytes) push back: where the first directory entry is 76 bytes
    // long too (an archive named with 8 characters, `resnet18.pt2`), the
    // guess lands on the second entry and every offset is off by 76.
    let config = zip::read::Config {
        archive_offset: zip::read::ArchiveOffset::Known(0),
    };
    let zip = zip::ZipArchive::with_config(config, std::io::Cursor::new(map)).map_err(|e| {
        ImportError::Archive(if map.starts_with(b"PK\x03\x04") {
            format!(
                "{p} is not a PT2 archive Kiln can read: it starts as a zip file does, but \
                 {e} (a damaged or truncated file?). Save it again with torch.export.save; \
                 if torch.export.load reads it, please report this with the archive"
            )
        } else {
            let head: Vec<String> = map.iter().take(8).map(|b| format!("{b:02x}")).collect();
            format!(
                "{p} is not a PT2 archive: not a zip file (it starts with bytes `{}`, a \
                 zip file with `50 4b 03 04`); make one with \
                 torch.export.save(torch.export.export(model, args), \"model.pt2\")",
                head.join(" ")
            )
        })
    })?;
    let prefix = zip
        .file_names()
        .filter_map(|n| n.ok())
        .find_map(|n| n.strip_suffix("archive_format").map(str::to_string))
        .filter(|pre| pre.is_empty() || pre.ends_with('/'))
        .ok_or_else(|| {
            ImportError::Archive(format!(
                "{p} is a zip file but not a PT2 archive (no `archive_format` entry); \
                 make one with torch.export.save"
            ))
        })?;
    let mut z = Zip {
        path: p,
        map,
        zip,
        prefix,
    };
    let format = z.text("archive_format")?.unwrap_or_default();
    if format.trim() != "pt2" {
        return Err(z.damaged(format!("archive format `{}`, not `pt2`", format.trim())));
    }
    if let Some(order) = z.text("byteorder")? {
        if order.trim() != "little" {
            return Err(z.damaged(format!(
                "weights stored {} endian; Kiln reads little endian archives",
                order.trim()
            )));
        }
    }
    let model_name = model_entry(&z)?;
    let model = z
        .json(&model_name)?
        .ok_or_else(|| z.damaged(format!("no `{model_name}`")))?;
    check_schema_version(&z, &model)?;
    let mut tensors = vec![];
    for (dir, config) in [
        ("data/weights/", "model_weights_config.json"),
        ("data/constants/", "model_constants_config.json"),
    ] {
        let Some(cfg) = z.json(&format!("{dir}{config}"))? else {
            continue;
        };
        let entries = cfg
            .get("config")
            .and_then(Value::as_object)
            .ok_or_else(|| z.damaged(format!("`{dir}{config}` has no `config` object")))?;
        for (name, e) in entries {
            tensors.push(stored(&mut z, dir, name, e)?);
        }
    }
    Ok((model, tensors))
}

/// `models/model.json`, or the archive's only model.
fn model_entry(z: &Zip) -> Result<String, ImportError> {
    let models: Vec<String> = z
        .zip
        .file_names()
        .filter_map(|n| n.ok())
        .filter_map(|n| {
            n.strip_prefix(&z.prefix)
                .filter(|r| r.starts_with("models/") && r.ends_with(".json"))
                .map(str::to_string)
        })
        .collect();
    match models.as_slice() {
        [one] => Ok(one.clone()),
        _ if models.iter().any(|m| m == "models/model.json") => Ok("models/model.json".into()),
        [] => Err(z.damaged("no exported program (`models/*.json`)")),
        _ => Err(z.damaged(format!(
            "several exported programs ({}); Kiln reads an archive of one \
             (torch.export.save of a single ExportedProgram)",
            models.join(", ")
        ))),
    }
}

fn check_schema_version(z: &Zip, model: &Value) -> Result<(), ImportError> {
    let v = model.get("schema_version");
    let major = v.and_then(|v| v.get("major")).and_then(Value::as_u64);
    let minor = v.and_then(|v| v.get("minor")).and_then(Value::as_u64);
    match major {
        Some(m) if SCHEMA_MAJORS.contains(&m) => Ok(()),
        Some(m) => Err(ImportError::Version(format!(
            "{}: exported with schema version {m}.{}, which this Kiln does not read \
             (it reads majors {}..={}); export with a PyTorch whose torch.export schema \
             major is {}",
            z.path,
            minor.unwrap_or(0),
            SCHEMA_MAJORS.start(),
            SCHEMA_MAJORS.end(),
            SCHEMA_MAJORS.end()
        ))),
        None => Err(z.damaged("the model has no `schema_version.major`")),
    }
}

/// `torch/_export/serde/schema.py`'s `ScalarType` codes Kiln holds, and
/// the names of the rest (for errors).
pub fn dtype_of_code(code: i64) -> Result<DType, &'static str> {
    Ok(match code {
        4 => DType::I32,
        5 => DType::I64,
        6 => DType::F16,
        7 => DType::F32,
        12 => DType::Bool,
        34 => DType::U32,
        2 => DType::I8,
        1 => return Err("uint8"),
        3 => return Err("int16"),
        8 => return Err("float64"),
        9..=11 => return Err("complex"),
        13 => return Err("bfloat16"),
        28 => return Err("uint16"),
        29..=33 => return Err("float8"),
        35 => return Err("uint64"),
        _ => return Err("an unknown dtype"),
    })
}

/// The advice for a dtype Kiln does not hold.
pub fn dtype_advice(name: &str) -> &'static str {
    match name {
        "float64" | "bfloat16" => "convert the model with model.float() before exporting",
        _ => "Kiln holds f32, f16, i32, i64, u32, i8 and bool",
    }
}

/// An integer of a `SymInt` field (`{"as_int": 3}`); `None` when symbolic.
pub fn sym_int(v: &Value) -> Option<i64> {
    v.get("as_int").and_then(Value::as_i64)
}

/// A `TensorMeta`: dtype code, sizes and strides (`None` where
/// symbolic), storage offset.
pub type TensorMeta = (i64, Vec<Option<i64>>, Vec<Option<i64>>, i64);

/// A tensor meta's dtype, sizes and strides (`TensorMeta`); `Err` names
/// what is wrong.
pub fn tensor_meta(m: &Value) -> Result<TensorMeta, String> {
    let dtype = m.get("dtype").and_then(Value::as_i64).ok_or("no dtype")?;
    let ints = |k: &str| -> Result<Vec<Option<i64>>, String> {
        Ok(m.get(k)
            .and_then(Value::as_array)
            .ok_or(format!("no {k}"))?
            .iter()
            .map(sym_int)
            .collect())
    };
    let offset = m
        .get("storage_offset")
        .map(|o| sym_int(o).ok_or("a symbolic storage offset"))
        .transpose()?
        .unwrap_or(0);
    Ok((dtype, ints("sizes")?, ints("strides")?, offset))
}

/// One weight or constant: its entry's bytes checked against the config's
/// dtype, sizes, strides and offset, gathered contiguous when strided.
fn stored(z: &mut Zip, dir: &str, name: &str, e: &Value) -> Result<Stored, ImportError> {
    let path = z.path;
    let bad = |m: String| ImportError::Weight(format!("{path}: tensor `{name}`: {m}"));
    if e.get("use_pickle").and_then(Value::as_bool) == Some(true) {
        return Err(bad(
            "stored pickled (a tensor subclass); export plain tensors".into(),
        ));
    }
    let file = e
        .get("path_name")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("its config has no `path_name`".into()))?;
    let meta = e
        .get("tensor_meta")
        .ok_or_else(|| bad("its config has no `tensor_meta`".into()))?;
    let (code, sizes, strides, offset) = tensor_meta(meta).map_err(bad)?;
    let dtype = dtype_of_code(code).map_err(|d| {
        bad(format!(
            "has dtype {d}, which Kiln does not hold ({})",
            dtype_advice(d)
        ))
    })?;
    let as_usize = |v: Vec<Option<i64>>, what: &str| -> Result<Vec<usize>, ImportError> {
        v.into_iter()
            .map(|x| x.and_then(|x| usize::try_from(x).ok()))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| bad(format!("has symbolic or negative {what}")))
    };
    let sizes = as_usize(sizes, "sizes")?;
    let strides = as_usize(strides, "strides")?;
    if strides.len() != sizes.len() {
        return Err(bad(format!(
            "has {} sizes but {} strides",
            sizes.len(),
            strides.len()
        )));
    }
    let bytes = z.entry(&format!("{dir}{file}"))?.ok_or_else(|| {
        bad(format!(
            "its data `{dir}{file}` is missing from the archive"
        ))
    })?;
    let data = match &bytes {
        Src::Map(r) => &z.map[r.clone()],
        Src::Owned(v) => v.as_slice(),
    };
    let elem = dtype.size_bytes();
    let numel = sizes
        .iter()
        .try_fold(1usize, |a, &s| a.checked_mul(s))
        .ok_or_else(|| bad("has too many elements".into()))?;
    // The last element's storage index, plus one.
    let extent = if numel == 0 {
        0
    } else {
        sizes
            .iter()
            .zip(&strides)
            .try_fold(offset as usize, |a, (&s, &st)| {
                a.checked_add((s - 1).checked_mul(st)?)
            })
            .and_then(|x| x.checked_add(1))
            .ok_or_else(|| bad("has strides out of range".into()))?
    };
    if extent.saturating_mul(elem) > data.len() {
        return Err(bad(format!(
            "its {} x {:?} with strides {strides:?} and offset {offset} needs {} bytes, \
             its data holds {}",
            dtype.name(),
            sizes,
            extent * elem,
            data.len()
        )));
    }
    let contiguous = super::contiguous_strides(&sizes) == strides || numel <= 1;
    let bytes = if contiguous && offset == 0 && data.len() == numel * elem {
        bytes
    } else if contiguous {
        let start = offset as usize * elem;
        match bytes {
            Src::Map(r) => Src::Map(r.start + start..r.start + start + numel * elem),
            Src::Owned(v) => Src::Owned(v[start..start + numel * elem].to_vec()),
        }
    } else {
        Src::Owned(gather(data, &sizes, &strides, offset as usize, elem))
    };
    Ok(Stored {
        name: name.to_string(),
        dtype,
        sizes,
        bytes,
    })
}

/// The elements of a strided tensor, contiguous.
fn gather(data: &[u8], sizes: &[usize], strides: &[usize], offset: usize, elem: usize) -> Vec<u8> {
    let numel: usize = sizes.iter().product();
    let mut out = Vec::with_capacity(numel * elem);
    let mut idx = vec![0usize; sizes.len()];
    for _ in 0..numel {
        let at = offset + idx.iter().zip(strides).map(|(i, s)| i * s).sum::<usize>();
        out.extend_from_slice(&data[at * elem..(at + 1) * elem]);
        for d in (0..sizes.len()).rev() {
            idx[d] += 1;
            if idx[d] < sizes[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn python_json_words_become_strings() {
        let s = r#"{"a": Infinity, "b": [-Infinity, NaN], "c": "NaN Infinity"}"#;
        let v: serde_json::Value = serde_json::from_str(&super::finite_json(s)).unwrap();
        assert_eq!(v["a"], "inf");
        assert_eq!(v["b"][0], "-inf");
        assert_eq!(v["b"][1], "nan");
        assert_eq!(v["c"], "NaN Infinity");
    }
}
