//! Invariants checked between passes.

use crate::graph::{Def, Graph, ValueSet};
use crate::ops::OpKind;

/// Every value is defined before it is used, by a parameter or an earlier
/// node.
pub fn verify_ssa(g: &Graph) -> Result<(), String> {
    let mut defined = ValueSet::for_graph(g);
    defined.extend(g.inputs.iter().copied());
    for &n in &g.order {
        let node = g
            .nodes
            .get(n)
            .ok_or("a node in the order is missing from the arena")?;
        let mut undefined = false;
        for a in &node.args {
            a.each_tensor(&mut |&v| undefined |= !defined.contains(v));
        }
        if undefined {
            return Err(format!(
                "{} reads a value before it is defined",
                node.op.name()
            ));
        }
        for (i, &r) in node.results.iter().enumerate() {
            if g.values.get(r).map(|v| &v.def) != Some(&Def::Node(n, i)) {
                return Err(format!(
                    "{} has a result that does not point back to it",
                    node.op.name()
                ));
            }
            defined.insert(r);
        }
    }
    for &o in &g.outputs {
        if !defined.contains(o) {
            return Err("an output is not defined".into());
        }
    }
    Ok(())
}

/// What functionalization removes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Remove {
    /// In-place ops only: views stay (`slice`, `view`, ...).
    Mutations,
    /// In-place ops and views: views become `<view>_copy` ops, so every
    /// tensor is a fresh contiguous one.
    MutationsAndViews,
}

impl Remove {
    pub fn parse(s: &str) -> Option<Remove> {
        match s {
            "mutations" => Some(Remove::Mutations),
            "mutations_and_views" => Some(Remove::MutationsAndViews),
            _ => None,
        }
    }
}

/// After functionalization: SSA holds; the only mutations are the trailing
/// `copy_(parameter, value)` epilogue; in `MutationsAndViews` mode no view
/// is left.
pub fn verify_functional(g: &Graph, mode: Remove) -> Result<(), String> {
    verify_ssa(g)?;
    let mut in_epilogue = false;
    for &n in &g.order {
        let node = &g.nodes[n];
        let def = node.op.def();
        let epilogue = def.name == "copy_"
            && node
                .args
                .first()
                .and_then(|a| a.tensors().first().copied().copied())
                .is_some_and(|v| g.inputs.contains(&v));
        match def.kind {
            OpKind::InPlace if epilogue => in_epilogue = true,
            OpKind::InPlace => return Err(format!("mutation `{}` left in the graph", def.name)),
            _ if in_epilogue => return Err(format!("`{}` after the copy_ epilogue", def.name)),
            OpKind::View | OpKind::MultiView | OpKind::ViewOrCopy
                if mode == Remove::MutationsAndViews =>
            {
                return Err(format!("view `{}` left in the graph", def.name))
            }
            _ => {}
        }
    }
    Ok(())
}
