//! Handles at the bottom of the front end: values and nodes of a graph,
//! ops of the table. The table and the graph give them meaning
//! (`OpId::def`, `Graph::meta`); rules and custom functions, declared
//! below both, only pass them around.

use slotmap::new_key_type;

new_key_type! {
    pub struct ValueId;
    pub struct NodeId;
}

/// An op of the table (`ops::lookup`, `OpId::def`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OpId(pub u16);

/// A node's results: up to two inline (no allocation per node).
pub type Results = smallvec::SmallVec<[ValueId; 2]>;
