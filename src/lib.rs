//! Kiln: trace tensor programs written with views and in-place mutations,
//! functionalize them, and run them fast on any GPU.
//!
//! This crate ties the pipeline together and owns the `kiln` command line;
//! the stages live in [`kiln_functionalize`] (graph, ops, tracer, reference
//! interpreter, the pass) and [`kiln_engine`] (the GPU engine).

pub mod export;
pub mod import;
pub mod io;
pub mod minilm;
pub mod probe;
pub mod profile;
pub mod soak;
pub mod train;

pub use kiln_engine as engine;
pub use kiln_functionalize as functionalize;
pub use kiln_functionalize::{
    args, functionalize, functionalize_traced, parse, print, run, trace, DType, Functionalized,
    Graph, RTensor, Remove, Tensor, TensorSpec,
};
