//! Running a training step program on the GPU (`transform::sgd_step`):
//! every parameter uploaded once, each step's updated weights (the
//! program's mutated parameters) kept on the device for the next step;
//! only the loss is read back.

use kiln_engine::{Fetch, HostTensor, Input, Session};
use kiln_functionalize::Graph;

/// `steps` runs of `step` from `inputs` (one per parameter): the loss of
/// each step and the mean milliseconds per step (loss read back included).
pub fn run_steps(
    session: &Session,
    step: &Graph,
    inputs: &[HostTensor],
    steps: usize,
) -> Result<(Vec<f64>, f64), String> {
    let exe = session.compile(step).map_err(|e| e.to_string())?;
    let mut dev = inputs
        .iter()
        .map(|t| session.upload(t))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let mut opts = exe.options(Fetch::Skip, Fetch::Device);
    opts.outputs[0] = Fetch::Host;
    let mut losses = Vec::with_capacity(steps);
    let start = std::time::Instant::now();
    for _ in 0..steps {
        let feeds: Vec<Input> = dev.iter().map(Input::Device).collect();
        let r = session
            .run(&exe, &feeds, &opts)
            .map_err(|e| e.to_string())?;
        let loss = r.outputs[0]
            .clone()
            .host()
            .ok_or("the loss was not read back")?;
        losses.push(loss.to_rtensor().values()[0]);
        for (i, o) in r.mutated {
            dev[i] = o
                .device()
                .ok_or("the weights were not kept on the device")?;
        }
    }
    Ok((
        losses,
        start.elapsed().as_secs_f64() * 1e3 / steps.max(1) as f64,
    ))
}
