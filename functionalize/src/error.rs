//! Errors of the front end and the interpreter. Each says where the problem
//! is (line and column, or the statement) and what is wrong.

use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq)]
pub enum Error {
    /// The text is not in the program format.
    #[error("{line}:{col}: {msg}")]
    Parse {
        line: usize,
        col: usize,
        msg: String,
    },
    /// A statement is well-formed but invalid: unknown op, bad arguments,
    /// shape or dtype mismatch.
    #[error("{}`{stmt}`: {msg}", line.map(|l| format!("line {l}: ")).unwrap_or_default())]
    Statement {
        line: Option<usize>,
        stmt: String,
        msg: String,
    },
    /// An input tensor given to `run` does not fit its parameter.
    #[error("input `{name}`: {msg}")]
    Input { name: String, msg: String },
    /// A statement failed while running (index out of range, a write that
    /// overlaps its own inputs, ...).
    #[error("{}`{stmt}` failed at run time: {msg}", line.map(|l| format!("line {l}: ")).unwrap_or_default())]
    Runtime {
        line: Option<usize>,
        stmt: String,
        msg: String,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
