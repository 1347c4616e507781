//! Graph clean-ups run after functionalization.

use crate::graph::{Graph, NodeId, ValueSet};
use crate::ops::OpKind;

/// Removes nodes none of whose results is used (in-place nodes, the
/// `copy_` epilogue, are always kept), and their values.
pub fn eliminate_dead_code(g: &mut Graph) {
    let dead = prune_dead_code(g);
    sweep(g, dead);
}

/// Takes the dead nodes (as `eliminate_dead_code` finds them) out of the
/// order and returns them, still in the arena: printing reads only the
/// order, and freeing them costs about as much as printing.
pub fn prune_dead_code(g: &mut Graph) -> Vec<NodeId> {
    let mut live = ValueSet::for_graph(g);
    live.extend(g.outputs.iter().copied());
    let mut keep = vec![false; g.order.len()];
    for (i, &n) in g.order.iter().enumerate().rev() {
        let node = &g.nodes[n];
        if node.results.iter().any(|&r| live.contains(r)) || node.op.def().kind == OpKind::InPlace {
            keep[i] = true;
            for a in &node.args {
                a.each_tensor(&mut |&v| live.insert(v));
            }
        }
    }
    let kept = keep.iter().filter(|&&k| k).count();
    let order = std::mem::replace(&mut g.order, Vec::with_capacity(kept));
    let mut dead = Vec::with_capacity(order.len() - kept);
    for (n, k) in order.into_iter().zip(keep) {
        if k {
            g.order.push(n);
        } else {
            dead.push(n);
        }
    }
    dead
}

/// Removes pruned nodes (`prune_dead_code`) and their values from the arena.
pub fn sweep(g: &mut Graph, dead: Vec<NodeId>) {
    for n in dead {
        if let Some(node) = g.nodes.remove(n) {
            for r in node.results {
                g.values.remove(r);
            }
        }
    }
}
