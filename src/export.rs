//! Export files from the command line and from Rust: write one from a
//! program and a weights file, open one (memory-mapped), run it on the GPU
//! or on the reference interpreter. The format and its checks live in
//! `kiln_engine::export` (`docs/export-format.md`).

use crate::io::{save_host, MappedTensors};
use kiln_engine::export::{self, ExportOptions, Exported};
use kiln_engine::{Fetch, HostTensor, Input, Output, Session};
use kiln_functionalize::text::Names;
use kiln_functionalize::{Graph, RTensor};
use std::path::Path;

/// Does the file start like an export (so `run` and `profile` take it)?
pub fn is_export(path: &Path) -> bool {
    use std::io::Read;
    let mut head = [0u8; 8];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok()
        && head == export::MAGIC
}

/// Compiles `g` on `session`'s device with the parameters found in
/// `weights` as constants and writes the export to `output`.
pub fn write(
    session: &Session,
    g: &Graph,
    weights: &Path,
    output: &Path,
    opts: &ExportOptions,
) -> Result<usize, String> {
    let w = MappedTensors::open(weights).map_err(|e| e.to_string())?;
    let names = Names::of(g);
    let found: Vec<(String, HostTensor)> = g
        .inputs
        .iter()
        .filter_map(|&v| {
            let n = names.get(v);
            w.get(&n).map(|t| (n, t))
        })
        .collect();
    write_found(session, g, found, output, opts)
}

/// `write` with the constants chosen: `(parameter name, tensor)`.
pub fn write_found(
    session: &Session,
    g: &Graph,
    found: Vec<(String, HostTensor)>,
    output: &Path,
    opts: &ExportOptions,
) -> Result<usize, String> {
    let (bytes, weights) =
        export::export_parts(session, g, &found, opts).map_err(|e| e.to_string())?;
    std::fs::write(output, &bytes)
        .map_err(|e| format!("cannot write {}: {e}", output.display()))?;
    if let Some(name) = &opts.weights_file {
        let path = weights_beside(output, name)?;
        std::fs::write(&path, &weights)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(bytes.len())
}

/// Where the weights file `name` of the export at `export` lives
/// (`export::weights_path`: beside it).
pub fn weights_beside(export: &Path, name: &str) -> Result<std::path::PathBuf, String> {
    export::weights_path(export, name).map_err(|e| e.to_string())
}

/// An export file mapped in memory, and its weights file where it keeps
/// its constants apart (format version 3).
pub struct ExportFile {
    map: memmap2::Mmap,
    weights: Option<memmap2::Mmap>,
    path: String,
}

fn map_file(path: &Path) -> Result<memmap2::Mmap, String> {
    let f =
        std::fs::File::open(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    // SAFETY: mapped read-only; Kiln never writes an export it reads.
    unsafe { memmap2::Mmap::map(&f) }.map_err(|e| format!("cannot map {}: {e}", path.display()))
}

impl ExportFile {
    pub fn open(path: &Path) -> Result<ExportFile, String> {
        let map = map_file(path)?;
        let at = |e: export::ExportError| format!("{}: {e}", path.display());
        let weights = match export::weights_of(&map).map_err(at)? {
            Some(w) => Some(map_file(&weights_beside(path, &w.file)?)?),
            None => None,
        };
        Ok(ExportFile {
            map,
            weights,
            path: path.display().to_string(),
        })
    }

    /// The checked contents (`export::read_with`).
    pub fn read(&self) -> Result<Exported<'_>, String> {
        export::read_with(&self.map, self.weights.as_deref())
            .map_err(|e| format!("{}: {e}", self.path))
    }

    pub fn bytes(&self) -> &[u8] {
        &self.map
    }
}

/// `run model.kiln`: the inputs from `inputs` (by parameter name), results
/// written as `run` writes them for a program, constants included.
pub fn run(e: &Exported<'_>, inputs: &Path, output: &Path, gpu: bool) -> Result<(), String> {
    let g = &e.graph().map_err(|e| e.to_string())?;
    let mut constants = e.constant_tensors().map_err(|e| e.to_string())?;
    // Constants are never written (a buffer the program writes stays an
    // input), so they are not results either.
    let constant: Vec<bool> = (0..e.program.params.len())
        .map(|i| constants.iter().any(|c| c.0 == i))
        .collect();
    let file = MappedTensors::open(inputs).map_err(|e| e.to_string())?;
    let fed = file
        .inputs_for(g, &|i| constants.iter().any(|c| c.0 == i))
        .map_err(|e| e.to_string())?;
    let mut params: Vec<HostTensor> = vec![];
    let mut fed_iter = fed.into_iter();
    for i in 0..g.inputs.len() {
        params.push(match constants.iter().position(|c| c.0 == i) {
            Some(k) => constants.swap_remove(k).1.into_owned(),
            None => fed_iter.next().ok_or("an input went missing")?.into_owned(),
        });
    }
    let (outputs, finals) = if gpu {
        let session = Session::open().map_err(|e| e.to_string())?;
        eprintln!("adapter: {}", session.gpu().describe());
        let exe = session.load_exported(e).map_err(|e| e.to_string())?;
        let feeds: Vec<Input> = exe
            .input_params()
            .into_iter()
            .map(|i| Input::Host(&params[i]))
            .collect();
        let r = session
            .run(&exe, &feeds, &exe.options(Fetch::Host, Fetch::Host))
            .map_err(|e| e.to_string())?;
        let host = |o: Output| {
            o.host()
                .ok_or_else(|| "a result was not read back".to_string())
        };
        let outs = r
            .outputs
            .into_iter()
            .map(host)
            .collect::<Result<Vec<_>, _>>()?;
        let mut finals = params.clone();
        for (i, o) in r.mutated {
            finals[i] = host(o)?;
        }
        (outs, finals)
    } else {
        // The embedded program on the reference interpreter: it returns the
        // outputs, then the mutated parameters' final values.
        let ins: Vec<RTensor> = params.iter().map(HostTensor::to_rtensor).collect();
        let r = kiln_functionalize::interp::run(g, ins).map_err(|e| e.to_string())?;
        let mut outs: Vec<HostTensor> = r.outputs.iter().map(HostTensor::from_rtensor).collect();
        let written = outs.split_off(e.program.n_outputs.min(outs.len()));
        let mut finals = params.clone();
        for (&i, t) in e.program.mutated_inputs.iter().zip(written) {
            finals[i] = t;
        }
        (outs, finals)
    };
    let names = Names::of(g);
    let mut named: Vec<(String, HostTensor)> = outputs
        .into_iter()
        .enumerate()
        .map(|(i, t)| (format!("output.{i}"), t))
        .collect();
    for ((&v, t), constant) in g.inputs.iter().zip(finals).zip(constant) {
        if !constant {
            named.push((names.get(v), t));
        }
    }
    save_host(output, &named).map_err(|e| e.to_string())
}

/// `inspect`: the manifest (kernels without their WGSL unless asked) and
/// the program.
pub fn inspect(e: &Exported<'_>, file_bytes: usize, wgsl: bool) -> String {
    let m = &e.manifest;
    let mut out = String::new();
    use std::fmt::Write;
    let _ = writeln!(
        out,
        "{} ({} bytes, export format {}), written by {}",
        m.name,
        file_bytes,
        export::FORMAT_VERSION,
        m.producer
    );
    let _ = writeln!(out, "parameters:");
    for (i, p) in m.params.iter().enumerate() {
        let what = match &p.constant {
            Some(c) => format!("constant, {} bytes stored as {}", c.bytes, c.stored),
            None if m.mutated_inputs.contains(&i) => "input (written back)".into(),
            None => "input".into(),
        };
        let _ = writeln!(out, "  %{}: {}{:?}  {what}", p.name, p.dtype, p.shape);
    }
    let _ = writeln!(
        out,
        "outputs: {}",
        m.outputs[..m.n_outputs]
            .iter()
            .map(|o| format!("%{o}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let r = &m.requires;
    let _ = writeln!(
        out,
        "needs: features [{}], {} storage buffers per stage, bindings of {} bytes, buffers of {} bytes, {} invocations and {} bytes of workgroup memory per workgroup, {} workgroups per dimension",
        r.features.join(", "),
        r.max_storage_buffers_per_shader_stage,
        r.max_storage_buffer_binding_size,
        r.max_buffer_size,
        r.max_compute_invocations_per_workgroup,
        r.max_compute_workgroup_storage_size,
        r.max_compute_workgroups_per_dimension
    );
    let native = m.kernels.iter().filter(|k| k.wgsl_f16.is_some()).count();
    if native > 0 {
        let _ = writeln!(
            out,
            "optional: feature [shader-f16] ({native} kernels convert to f16 in its instructions where the adapter has it, in integer arithmetic elsewhere)"
        );
    }
    let _ = writeln!(
        out,
        "memory: arena {} bytes, parameters {} bytes",
        m.memory[1], m.memory[0]
    );
    let _ = writeln!(out, "kernels: {}", m.kernels.len());
    for (i, k) in m.kernels.iter().enumerate() {
        let _ = writeln!(
            out,
            "  {i:3} {}  grid {:?}, {} bindings, {} bytes, {} flops",
            k.label,
            k.grid,
            k.bindings.len(),
            k.bytes_read + k.bytes_written,
            k.flops
        );
        if wgsl {
            let _ = writeln!(out, "{}", k.wgsl);
            if let Some(w) = &k.wgsl_f16 {
                let _ = writeln!(out, "  (with shader-f16:)\n{w}");
            }
        }
    }
    let _ = writeln!(out, "program:\n{}", e.text);
    out
}
