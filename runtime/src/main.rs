//! `kiln-run MODEL.kiln --inputs IN.safetensors --output OUT.safetensors`:
//! the runtime alone, what an application shipping models carries. It
//! links the export loader, the session and wgpu, and not the
//! functionalizer, the fuser or the code generator (the engine is built
//! without its `compiler` feature). Results are written as `kiln run`
//! writes them: `output.N`, then every parameter's final value.

use kiln_engine::export;
use kiln_engine::functionalize::{text::Names, DType};
use kiln_engine::{Fetch, HostTensor, Input, Session};
use safetensors::{Dtype, SafeTensors};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

const USAGE: &str = "usage: kiln-run MODEL.kiln --inputs IN.safetensors --output OUT.safetensors";

fn map(path: &Path) -> Result<memmap2::Mmap, String> {
    let f =
        std::fs::File::open(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    // SAFETY: mapped read-only; nothing here writes the file.
    unsafe { memmap2::Mmap::map(&f) }.map_err(|e| format!("cannot map {}: {e}", path.display()))
}

fn dtype(d: Dtype) -> Option<DType> {
    Some(match d {
        Dtype::F32 => DType::F32,
        Dtype::F16 => DType::F16,
        Dtype::I32 => DType::I32,
        Dtype::I64 => DType::I64,
        Dtype::U32 => DType::U32,
        Dtype::BOOL => DType::Bool,
        _ => return None,
    })
}

fn st_dtype(d: DType) -> Dtype {
    match d {
        DType::F32 => Dtype::F32,
        DType::F16 => Dtype::F16,
        DType::I32 => Dtype::I32,
        DType::I64 => Dtype::I64,
        DType::U32 => Dtype::U32,
        DType::Bool => Dtype::BOOL,
    }
}

fn run(model: &Path, inputs: &Path, output: &Path) -> Result<(), String> {
    let file = map(model)?;
    let e = export::read(&file).map_err(|e| format!("{}: {e}", model.display()))?;
    let session = Session::open().map_err(|e| e.to_string())?;
    let exe = session
        .load_exported(&e)
        .map_err(|e| format!("{}: {e}", model.display()))?;
    let g = &e.program.graph;
    let names = Names::of(g);
    let in_map = map(inputs)?;
    let st = SafeTensors::deserialize(&in_map).map_err(|e| format!("{}: {e}", inputs.display()))?;
    let mut fed = vec![];
    for i in exe.input_params() {
        let v = g.inputs[i];
        let (name, m) = (names.get(v), g.meta(v));
        let t = st
            .tensor(&name)
            .map_err(|_| format!("{}: no tensor `{name}`", inputs.display()))?;
        if dtype(t.dtype()) != Some(m.dtype) || t.shape() != &m.sizes[..] {
            return Err(format!(
                "{}: `{name}` is {:?}{:?}, the model takes {}",
                inputs.display(),
                t.dtype(),
                t.shape(),
                m.type_string()
            ));
        }
        fed.push((
            i,
            HostTensor::new(m.dtype, m.sizes.to_vec(), t.data()).map_err(|e| e.to_string())?,
        ));
    }
    let feeds: Vec<Input> = fed.iter().map(|(_, t)| Input::Host(t)).collect();
    let r = session
        .run(&exe, &feeds, &exe.options(Fetch::Host, Fetch::Host))
        .map_err(|e| format!("{}: {e}", model.display()))?;
    let mut named: Vec<(String, HostTensor)> = vec![];
    for (k, o) in r.outputs.into_iter().enumerate() {
        named.push((
            format!("output.{k}"),
            o.host().ok_or("a result was not read back")?,
        ));
    }
    let mut finals: Vec<Option<HostTensor>> = vec![None; g.inputs.len()];
    for (i, t) in fed {
        finals[i] = Some(t);
    }
    for (i, o) in r.mutated {
        finals[i] = o.host();
    }
    for &(i, stored, bytes) in &e.constants {
        let m = g.meta(g.inputs[i]);
        finals[i] = Some(if stored == m.dtype {
            HostTensor::new(m.dtype, m.sizes.to_vec(), bytes).map_err(|e| e.to_string())?
        } else {
            let wide: Vec<f32> = bytes
                .chunks_exact(2)
                .map(|c| f16_to_f32(u16::from_le_bytes([c[0], c[1]])))
                .collect();
            HostTensor::from_slice(&m.sizes, &wide).map_err(|e| e.to_string())?
        });
    }
    for (i, t) in finals.into_iter().enumerate() {
        if let Some(t) = t {
            named.push((names.get(g.inputs[i]), t));
        }
    }
    let views: Vec<(String, safetensors::tensor::TensorView)> = named
        .iter()
        .map(|(n, t)| {
            safetensors::tensor::TensorView::new(st_dtype(t.dtype()), t.sizes().to_vec(), t.bytes())
                .map(|v| (n.clone(), v))
                .map_err(|e| e.to_string())
        })
        .collect::<Result<_, _>>()?;
    safetensors::serialize_to_file(views, None, output)
        .map_err(|e| format!("{}: {e}", output.display()))
}

/// IEEE half to single (the runtime avoids a dependency for this one use).
fn f16_to_f32(h: u16) -> f32 {
    let (sign, exp, man) = (
        (h >> 15) as u32,
        ((h >> 10) & 0x1f) as u32,
        (h & 0x3ff) as u32,
    );
    let bits = match (exp, man) {
        (0, 0) => sign << 31,
        (0, m) => {
            // Subnormal: normalize.
            let shift = m.leading_zeros() - 21;
            ((sign << 31) | ((113 - shift) << 23)) | ((m << shift) & 0x3ff) << 13
        }
        (0x1f, m) => (sign << 31) | 0x7f80_0000 | (m << 13),
        (e, m) => (sign << 31) | ((e + 112) << 23) | (m << 13),
    };
    f32::from_bits(bits)
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let (mut model, mut inputs, mut output) = (None, None, None);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--inputs" => inputs = args.next().map(PathBuf::from),
            "--output" => output = args.next().map(PathBuf::from),
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            _ if model.is_none() && !a.starts_with("--") => model = Some(PathBuf::from(a)),
            _ => {
                eprintln!("error: unexpected argument `{a}`\n{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let (Some(model), Some(inputs), Some(output)) = (model, inputs, output) else {
        eprintln!("error: missing arguments\n{USAGE}");
        return ExitCode::from(2);
    };
    match run(&model, &inputs, &output) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn half_widens_like_the_ieee_rules() {
        for x in [
            0.0f32,
            -0.0,
            1.0,
            -2.5,
            65504.0,
            6.1035156e-5,
            5.9604645e-8,
            f32::INFINITY,
        ] {
            let h = half_bits(x);
            assert_eq!(super::f16_to_f32(h).to_bits(), x.to_bits(), "{x}");
        }
        assert!(super::f16_to_f32(0x7e00).is_nan());
    }

    /// f32 -> f16 bits for values exact in f16.
    fn half_bits(x: f32) -> u16 {
        let b = x.to_bits();
        let sign = ((b >> 16) & 0x8000) as u16;
        let exp = ((b >> 23) & 0xff) as i32;
        let man = b & 0x7f_ffff;
        if exp == 0xff {
            return sign | 0x7c00 | (man >> 13) as u16;
        }
        if exp == 0 {
            return sign;
        }
        let e = exp - 127 + 15;
        if e <= 0 {
            return sign | (((man | 0x80_0000) >> (14 - e)) as u16);
        }
        sign | ((e as u16) << 10) | (man >> 13) as u16
    }
}
