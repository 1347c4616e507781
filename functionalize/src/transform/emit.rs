//! Building a transformed program: calls by op name into a graph, with
//! common subexpressions emitted once (`Emitter`, the rules' `Emit`).

use crate::graph::{Graph, Results, ValueId};
use crate::meta::Meta;
use crate::ops::{self, OpId};
use crate::schema::Arg;
use rustc_hash::FxHashMap as HashMap;

pub use crate::rule::{float, int, ints, sizes_arg, t, Emit, R};

/// A graph under construction with hash-consing: a call equal to an earlier
/// one (same op, same arguments) returns the earlier results.
pub struct Emitter {
    pub g: Graph,
    seen: HashMap<(OpId, String), Results>,
}

impl Emitter {
    pub fn new(name: &str) -> Emitter {
        Emitter {
            g: Graph::new(name),
            seen: HashMap::default(),
        }
    }

    /// Continues building `g` (common subexpressions are found among what
    /// is emitted from now on).
    pub fn wrap(g: Graph) -> Emitter {
        Emitter {
            g,
            seen: HashMap::default(),
        }
    }
}

impl Emit for Emitter {
    fn meta(&self, v: ValueId) -> &Meta {
        self.g.meta(v)
    }

    /// `op(args)`, all results.
    fn call_id(&mut self, op: OpId, args: Vec<Arg<ValueId>>) -> R<Results> {
        // Bit-exact floats: `Arg`'s Debug prints them exactly.
        let key = (op, format!("{args:?}"));
        if let Some(r) = self.seen.get(&key) {
            return Ok(r.clone());
        }
        let r = self
            .g
            .call(op, &args)
            .map_err(|e| format!("{}: {e}", op.name()))?;
        self.seen.insert(key, r.clone());
        Ok(r)
    }

    /// `name(args)`, all results.
    fn call_all(&mut self, name: &str, args: Vec<Arg<ValueId>>) -> R<Results> {
        let op = ops::lookup(name).ok_or_else(|| format!("internal error: no op {name}"))?;
        self.call_id(op, args)
    }
}
