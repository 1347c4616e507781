//! Errors of the compiler's stages. Each names what it is about: the
//! statement of the functionalized program (`%y = op(...)`), the value,
//! or the kernel's values, so a user can find it in `kiln functionalize`'s
//! output.

use kiln_functionalize::graph::{Graph, NodeId};
use kiln_functionalize::text::Names;
use std::fmt;

/// Where in the compiler an error arose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    Schedule,
    Plan,
    Codegen,
    Assemble,
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Stage::Schedule => "scheduling",
            Stage::Plan => "planning",
            Stage::Codegen => "code generation",
            Stage::Assemble => "assembly",
        })
    }
}

/// Why a program cannot be compiled for this device.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    /// An op that no GPU kernel computes (for these operands): run the
    /// program with the reference backend.
    #[error("the gpu backend does not support this program: {what}{}", at(.statement))]
    NoKernel {
        statement: Option<String>,
        what: String,
    },
    /// A value larger than the device's buffers or 32-bit indexing allow.
    #[error("the gpu backend does not support this program: %{value} ({ty}) {what}")]
    TooLarge {
        value: String,
        ty: String,
        what: String,
    },
    /// A kernel that binds more storage buffers than the device allows,
    /// with no inlined producer to compute apart.
    #[error(
        "the gpu backend does not support this program: the kernel computing {} binds \
         {bindings} storage buffers; this device allows {limit} per shader stage (split the \
         expression with an intermediate `clone`)",
        .values.join(", ")
    )]
    TooManyBindings {
        values: Vec<String>,
        bindings: usize,
        limit: usize,
    },
    /// A broken invariant of the compiler: a bug to report.
    #[error("internal error in the gpu backend ({stage}): {msg}{}", at(.statement))]
    Internal {
        stage: Stage,
        statement: Option<String>,
        msg: String,
    },
}

fn at(statement: &Option<String>) -> String {
    statement
        .as_ref()
        .map(|s| format!(" (at `{s}`)"))
        .unwrap_or_default()
}

impl CompileError {
    /// The program asks for what this backend or device cannot do (not a
    /// bug): the reference backend, or a split program, can run it.
    pub fn is_unsupported(&self) -> bool {
        !matches!(self, CompileError::Internal { .. })
    }

    pub fn no_kernel(what: impl Into<String>) -> CompileError {
        CompileError::NoKernel {
            statement: None,
            what: what.into(),
        }
    }

    pub fn internal(stage: Stage, msg: impl Into<String>) -> CompileError {
        CompileError::Internal {
            stage,
            statement: None,
            msg: msg.into(),
        }
    }

    /// The error, naming statement `n` of `g` where it names none yet.
    pub fn at(mut self, g: &Graph, n: NodeId) -> CompileError {
        if let CompileError::NoKernel { statement, .. } | CompileError::Internal { statement, .. } =
            &mut self
        {
            if statement.is_none() {
                *statement = Some(statement_text(g, n));
            }
        }
        self
    }
}

/// Statement `n` as `%y = op(...)`.
pub fn statement_text(g: &Graph, n: NodeId) -> String {
    statement_with(&Names::of(g), g, n)
}

/// `statement_text` with the program's names at hand.
pub fn statement_with(names: &Names, g: &Graph, n: NodeId) -> String {
    let node = &g.nodes[n];
    let res: Vec<&str> = node.results.iter().map(|&v| names.name(v)).collect();
    format!("%{} = {}(...)", res.join(", %"), node.op.name())
}
