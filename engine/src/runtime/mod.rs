//! The runtime: the device (`device.rs`), typed host tensors (`host.rs`),
//! device tensors (`buffers.rs`) and sessions and runs (`session.rs`).
//! Scheduling and codegen decide what runs (a `kernel::Program`); this
//! module only moves data and dispatches.

mod buffers;
mod device;
mod host;
mod pipelines;
mod session;
pub(crate) use session::SharedWeight;

pub use buffers::DeviceTensor;
#[cfg(not(target_arch = "wasm32"))]
pub use device::quiet_headless_vulkan;
pub use device::{Gpu, Held};
pub use host::{Element, HostTensor};
pub use pipelines::{report_pipeline_progress, Progress};
#[cfg(not(target_arch = "wasm32"))]
pub use pipelines::{show_pipeline_progress_on_terminal, user_cache_dir};
pub use session::{
    Executable, Fetch, Input, Output, RunOptions, RunResult, RunStats, Session, SessionTotals,
    Timing,
};

#[cfg(feature = "compiler")]
use crate::EngineError;
#[cfg(feature = "compiler")]
use kiln_functionalize::{Graph, RTensor};

/// What a run gives at the reference interpreter's boundary: outputs, and
/// every parameter's final value.
#[cfg(feature = "compiler")]
pub struct EngineRun {
    pub outputs: Vec<RTensor>,
    pub inputs: Vec<RTensor>,
}

/// A session used with the reference interpreter's tensors (tests, the
/// `run` command): every parameter is an input, every result comes back.
#[cfg(feature = "compiler")]
pub struct Engine {
    pub session: Session,
}

#[cfg(feature = "compiler")]
impl Engine {
    #[cfg(not(target_arch = "wasm32"))]
    pub fn new() -> Result<Engine, EngineError> {
        Ok(Engine {
            session: Session::open()?,
        })
    }

    pub fn on(session: Session) -> Engine {
        Engine { session }
    }

    pub fn gpu(&self) -> &Gpu {
        self.session.gpu()
    }

    /// Compiles (once per program) and runs `g` on `inputs`.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn run(&mut self, g: &Graph, inputs: Vec<RTensor>) -> Result<EngineRun, EngineError> {
        let exe = self.session.compile(g)?;
        if exe.input_params().len() != g.inputs.len() {
            return Err(EngineError::Usage(
                "a parameter is bound to a session constant: Engine::run passes every \
                 parameter; use Session::run"
                    .into(),
            ));
        }
        if inputs.len() != g.inputs.len() {
            return Err(EngineError::Input {
                index: inputs.len(),
                msg: format!("the program takes {} inputs", g.inputs.len()),
            });
        }
        let host: Vec<HostTensor> = inputs.iter().map(HostTensor::from_rtensor).collect();
        let feeds: Vec<Input> = exe
            .input_params()
            .iter()
            .map(|&i| Input::Host(&host[i]))
            .collect();
        let r = self
            .session
            .run(&exe, &feeds, &exe.options(Fetch::Host, Fetch::Host))?;
        let to_r = |o: Output| {
            o.host()
                .map(|t| t.to_rtensor())
                .ok_or_else(|| EngineError::Internal("a result was not read back".into()))
        };
        let outputs = r
            .outputs
            .into_iter()
            .map(to_r)
            .collect::<Result<Vec<_>, _>>()?;
        let mut finals = inputs;
        for (i, o) in r.mutated {
            finals[i] = to_r(o)?;
        }
        Ok(EngineRun {
            outputs,
            inputs: finals,
        })
    }
}
