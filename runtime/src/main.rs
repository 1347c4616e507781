//! `kiln-run MODEL.kiln --inputs IN.safetensors --output OUT.safetensors`:
//! the runtime alone, what an application shipping models carries. It
//! links the export loader, the session and wgpu, and not the
//! functionalizer, the fuser or the code generator (the engine is built
//! without its `compiler` feature). Results are written as `kiln run`
//! writes them: `output.N`, then the final value of every parameter the
//! caller gives (the constants, never written, are not copied out).

use kiln_engine::export;
use kiln_engine::DType;
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
        Dtype::I8 => DType::I8,
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
        DType::I8 => Dtype::I8,
        DType::Bool => Dtype::BOOL,
    }
}

fn run(model: &Path, inputs: &Path, output: &Path) -> Result<(), String> {
    // The inputs are read first: a missing file is reported before the
    // adapter opens and the pipelines compile.
    let in_map = map(inputs)?;
    let st = SafeTensors::deserialize(&in_map)
        .map_err(|e| format!("{} is not a valid safetensors file: {e}", inputs.display()))?;
    let file = map(model)?;
    let at = |e: export::ExportError| format!("{}: {e}", model.display());
    // A version-3 export reads its constants from a weights file beside it.
    let weights = match export::weights_of(&file).map_err(at)? {
        Some(w) => Some(map(&export::weights_path(model, &w.file).map_err(at)?)?),
        None => None,
    };
    let e = export::read_with(&file, weights.as_deref()).map_err(at)?;
    let p = &e.program;
    // The parameters the caller gives: those that are not constants.
    let wanted: Vec<usize> = (0..p.params.len())
        .filter(|i| !e.constants.iter().any(|c| c.0 == *i))
        .collect();
    let mut fed = vec![];
    for &i in &wanted {
        let m = p.param(i);
        let name = &m.name;
        let t = st
            .tensor(name)
            .map_err(|_| format!("{}: no tensor `{name}`", inputs.display()))?;
        if dtype(t.dtype()).is_none() {
            return Err(format!(
                "{}: `{name}` is stored as {:?}, a dtype Kiln does not hold; the model takes {}: \
                 convert it before saving (`x.float()` for f32)",
                inputs.display(),
                t.dtype(),
                m.type_string()
            ));
        }
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
            HostTensor::new(m.dtype, m.sizes.clone(), t.data()).map_err(|e| e.to_string())?,
        ));
    }
    let session = Session::open().map_err(|e| e.to_string())?;
    let exe = session
        .load_exported(&e)
        .map_err(|e| format!("{}: {e}", model.display()))?;
    if exe.input_params() != wanted {
        return Err(format!(
            "{}: internal error: the loaded program takes other inputs than the file lists",
            model.display()
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
    let mut finals: Vec<Option<HostTensor>> = vec![None; p.params.len()];
    for (i, t) in fed {
        finals[i] = Some(t);
    }
    for (i, o) in r.mutated {
        finals[i] = o.host();
    }
    for (i, t) in finals.into_iter().enumerate() {
        if let Some(t) = t {
            named.push((p.param(i).name.clone(), t));
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

fn main() -> ExitCode {
    kiln_engine::quiet_headless_vulkan();
    kiln_engine::show_pipeline_progress_on_terminal();
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
