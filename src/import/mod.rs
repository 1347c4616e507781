//! Importing `torch.export` programs (`.pt2` archives, `docs/import.md`):
//! the archive is read and checked (`archive`), its graph becomes a Kiln
//! program in the text format (`convert`), ATen ops Kiln runs through
//! their decompositions are expanded on the way (`decomp`), batch norms
//! fold into the convolutions before them (`fold`), and the weights
//! become the program's bound parameters. The program then goes through
//! the same functionalization, transforms, compiler and export as any
//! other.

mod archive;
mod convert;
pub mod coverage;
mod decomp;
mod fold;
mod run;

pub use archive::is_zip as is_pt2;
pub use decomp::{Rewrite, REFUSED, REWRITES};
pub use run::{feeds, mutated, run, run_on};

use crate::io::{MappedTensors, Src};
use kiln_engine::HostTensor;
use kiln_functionalize::{DType, Graph};
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// Not a readable PT2 archive, or a damaged one.
    #[error("{0}")]
    Archive(String),
    /// A schema version this reader does not know.
    #[error("{0}")]
    Version(String),
    /// A weight or constant that cannot be read as its config says.
    #[error("{0}")]
    Weight(String),
    /// An op (or argument) Kiln does not run: names the op, the node and
    /// the user's source line.
    #[error("{0}")]
    Op(String),
    /// Sizes that are symbolic (a dynamic-shape export).
    #[error("{0}")]
    Symbolic(String),
    /// Anything else the program holds that Kiln does not.
    #[error("{0}")]
    Unsupported(String),
    /// The converted program does not parse (a bug: the message says so).
    #[error("{0}")]
    Program(String),
}

/// What a parameter of an imported program stands for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// A parameter, buffer or constant of the model, by state-dict name
    /// (`layer1.0.conv1.weight`); bound to the archive's weights.
    Weight(String),
    /// An argument of the model's `forward`, by its name.
    User(String),
    /// A constant Kiln made at import (a convolution with a batch norm
    /// folded in: its weight and bias).
    Made,
}

/// A `.pt2` archive as a Kiln program with its weights.
pub struct Imported {
    /// The program in the text format (`kiln import` prints it).
    pub text: String,
    pub graph: Graph,
    /// One per parameter of `graph`.
    pub roles: Vec<Role>,
    /// Every `Role::Weight` and `Role::Made` parameter, by parameter name.
    pub weights: MappedTensors,
}

impl Imported {
    /// Is parameter `i` bound to the archive's weights?
    pub fn is_weight(&self, i: usize) -> bool {
        !matches!(self.roles[i], Role::User(_))
    }

    /// The weights that can be session constants of `g` (this program,
    /// maybe functionalized): all but the buffers the program writes,
    /// which stay inputs. `(parameter name, tensor)`.
    pub fn constants(&self, g: &Graph) -> Result<Vec<(String, HostTensor<'_>)>, String> {
        let written = mutated(g)?;
        let names = kiln_functionalize::text::Names::of(g);
        g.inputs
            .iter()
            .enumerate()
            .filter(|&(i, _)| self.is_weight(i) && !written[i])
            .map(|(_, &v)| {
                let n = names.get(v);
                let t = self
                    .weights
                    .get(&n)
                    .ok_or_else(|| format!("weight `{n}` is missing from the archive"))?;
                Ok((n, t))
            })
            .collect()
    }

    /// The name `kiln run` writes parameter `i`'s final value under: a
    /// weight's state-dict name, a user input's own name.
    pub fn output_name(&self, i: usize, param: &str) -> String {
        match &self.roles[i] {
            Role::Weight(fqn) => fqn.clone(),
            Role::User(n) => n.clone(),
            Role::Made => param.to_string(),
        }
    }
}

/// Reads a `.pt2` archive: checks it, converts its graph, binds its
/// weights. Batch norms fold into the convolutions before them
/// (`open_as_exported` keeps the program as exported).
pub fn open(path: &Path) -> Result<Imported, ImportError> {
    open_with(path, true)
}

/// `open`, the program as exported: every op, every weight a parameter
/// (what `kiln import` prints and writes).
pub fn open_as_exported(path: &Path) -> Result<Imported, ImportError> {
    open_with(path, false)
}

fn open_with(path: &Path, fold: bool) -> Result<Imported, ImportError> {
    let a = archive::open(path)?;
    let prog = convert::convert(&a, fold)?;
    let graph = kiln_functionalize::parse(&prog.text).map_err(|e| match e {
        // An op's own rule refusing its arguments (an unsupported mode, a
        // random draw, a shape eager refuses too): the op's message.
        kiln_functionalize::Error::Statement { stmt, msg, .. } => {
            ImportError::Op(format!("{}: Kiln refuses `{stmt}`: {msg}", a.path))
        }
        e => ImportError::Program(format!(
            "{}: the imported program does not parse ({e}); this is a bug in Kiln's \
             importer, please report it with the archive",
            a.path
        )),
    })?;
    // Each stored tensor moves to the parameter bound to it (one per
    // state-dict name; a tensor no parameter names is dropped).
    let mut stored: std::collections::HashMap<String, archive::Stored> =
        a.tensors.into_iter().map(|s| (s.name.clone(), s)).collect();
    let mut tensors: Vec<(String, DType, Vec<usize>, Src)> = vec![];
    for (param, fqn) in prog.bound {
        let s = stored
            .remove(&fqn)
            .expect("convert binds each stored tensor once");
        tensors.push((param, s.dtype, s.sizes, s.bytes));
    }
    for m in prog.made {
        tensors.push((m.name, m.dtype, m.sizes, Src::Owned(m.bytes)));
    }
    let weights = MappedTensors::from_parts(a.path, a.map, tensors);
    Ok(Imported {
        text: prog.text,
        graph,
        roles: prog.roles,
        weights,
    })
}

/// Row-major strides of `sizes`.
fn contiguous_strides(sizes: &[usize]) -> Vec<usize> {
    let mut s = vec![1; sizes.len()];
    for d in (0..sizes.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * sizes[d + 1];
    }
    s
}
