//! `kiln run MODEL.pt2`: the user inputs from a file by their `forward`
//! names, the weights from the archive (GPU: constants uploaded once,
//! except the buffers the program writes), results under the spec's
//! names: `output.N`, then each buffer and user input the program writes
//! under its state-dict or argument name; nothing it only reads.

use super::Imported;
use crate::io::{save_host, MappedTensors};
use kiln_engine::{Fetch, HostTensor, Input, Output, Session};
use kiln_functionalize::{functionalize, interp, text::Names, Graph, Remove};
use std::path::Path;

/// Which parameters the program writes.
pub fn mutated(g: &Graph) -> Result<Vec<bool>, String> {
    let f = functionalize(g, Remove::Mutations).map_err(|e| e.to_string())?;
    let mut m = vec![false; g.inputs.len()];
    for x in f.mutated_inputs {
        m[x.input] = true;
    }
    Ok(m)
}

/// Every parameter's tensor: weights from the archive, user inputs from
/// `inputs` (by name, checked against the program).
pub fn feeds<'a>(
    imp: &'a Imported,
    g: &Graph,
    file: &'a MappedTensors,
) -> Result<Vec<HostTensor<'a>>, String> {
    let names = Names::of(g);
    let user = file
        .inputs_for(g, &|i| imp.is_weight(i))
        .map_err(|e| e.to_string())?;
    let mut user = user.into_iter();
    let mut out = vec![];
    for (i, &v) in g.inputs.iter().enumerate() {
        if imp.is_weight(i) {
            let n = names.get(v);
            out.push(
                imp.weights
                    .get(&n)
                    .ok_or_else(|| format!("weight `{n}` is missing from the archive"))?,
            );
        } else {
            out.push(user.next().expect("one tensor per user input"));
        }
    }
    Ok(out)
}

/// Runs an imported program and writes its results (on a session of
/// the default adapter and options where `gpu`).
pub fn run(
    imp: &Imported,
    g: &Graph,
    inputs: &Path,
    output: &Path,
    gpu: bool,
) -> Result<(), String> {
    let session = if gpu {
        let s = Session::open().map_err(|e| e.to_string())?;
        eprintln!("adapter: {}", s.gpu().describe());
        Some(s)
    } else {
        None
    };
    run_on(imp, g, inputs, output, session.as_ref())
}

/// Runs an imported program on `session` (the reference interpreter
/// where `None`) and writes its results.
pub fn run_on(
    imp: &Imported,
    g: &Graph,
    inputs: &Path,
    output: &Path,
    session: Option<&Session>,
) -> Result<(), String> {
    let file = MappedTensors::open(inputs).map_err(|e| e.to_string())?;
    let all = feeds(imp, g, &file)?;
    let written = mutated(g)?;
    let names = Names::of(g);
    let mut named: Vec<(String, HostTensor)> = vec![];
    let finals: Vec<HostTensor> = if let Some(session) = session {
        for (n, t) in imp.constants(g)? {
            session.add_constant(&n, &t).map_err(|e| e.to_string())?;
        }
        let exe = session.compile(g).map_err(|e| e.to_string())?;
        let wanted = exe.input_params();
        let ins: Vec<Input> = wanted.iter().map(|&i| Input::Host(&all[i])).collect();
        let r = session
            .run(&exe, &ins, &exe.options(Fetch::Host, Fetch::Host))
            .map_err(|e| e.to_string())?;
        let host = |o: Output| o.host().ok_or("a result was not read back".to_string());
        for (i, o) in r.outputs.into_iter().enumerate() {
            named.push((format!("output.{i}"), host(o)?));
        }
        let mut finals = all.clone();
        for (i, o) in r.mutated {
            finals[i] = host(o)?;
        }
        finals
    } else {
        let ins = all.iter().map(HostTensor::to_rtensor).collect();
        let r = interp::run(g, ins).map_err(|e| e.to_string())?;
        for (i, t) in r.outputs.iter().enumerate() {
            named.push((format!("output.{i}"), HostTensor::from_rtensor(t)));
        }
        r.inputs.iter().map(HostTensor::from_rtensor).collect()
    };
    for (i, (&v, t)) in g.inputs.iter().zip(finals).enumerate() {
        if written[i] {
            named.push((imp.output_name(i, &names.get(v)), t));
        }
    }
    save_host(output, &named).map_err(|e| e.to_string())
}
