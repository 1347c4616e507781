//! Kiln's front end: tensor metadata and dtypes, the op table, the graph
//! and its text format, the Rust tracer, the eager reference interpreter
//! and the functionalization pass. No GPU dependency.

pub mod compare;
pub mod custom;
// Dtypes live below the front end: the runtime alone uses them too.
pub use kiln_dtype as dtype;
pub mod error;
pub mod function;
pub mod graph;
pub mod id;
pub mod interp;
pub mod meta;
pub mod ops;
pub mod pass;
pub mod random;
pub mod rule;
pub mod schema;
pub mod simplify;
pub mod tensor;
pub mod text;
pub mod trace;
pub mod transform;
pub mod verify;

pub use dtype::DType;
pub use error::{Error, Result};
pub use graph::{Graph, NodeId, ValueId};
pub use interp::{run, RunResult};
pub use meta::Meta;
pub use pass::{
    functionalize, functionalize_decomposed, functionalize_traced, parse_functionalized,
    Functionalized, Functionalizer, MutatedInput, Pruned, Remove,
};
pub use tensor::RTensor;
pub use text::{parse, print};
pub use trace::{trace, Tensor, TensorSpec};
