//! The op table as users read it (`kiln ops`, `docs/ops.md`): each op's
//! overloads, kind, lowering class and which rules its entry declares.

use super::{Inverse, Lowering, OpDef, OpKind, TABLE};

/// One op's line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    /// Overload names (`Tensor`, `Scalar`; empty for the default).
    pub overloads: Vec<String>,
    pub kind: &'static str,
    /// How a compiler lowers it (`Lowering::class_name`).
    pub lowering: &'static str,
    pub vjp: bool,
    pub jvp: bool,
    pub batching: bool,
    /// A GPU kernel computes it (views and in-place ops: through their
    /// functional forms, after functionalization).
    pub gpu: bool,
    /// A view's copy or an in-place op's functional form: the op whose
    /// rules and kernel it uses.
    pub via: Option<String>,
    /// A view's inverse: how a write through it reaches its input.
    pub inverse: Option<String>,
}

fn kind_name(k: OpKind) -> &'static str {
    match k {
        OpKind::View => "view",
        OpKind::MultiView => "views",
        OpKind::ViewOrCopy => "view or copy",
        OpKind::InPlace => "in-place",
        OpKind::Functional => "functional",
        OpKind::Factory => "factory",
    }
}

fn inverse_name(i: Inverse) -> String {
    match i {
        Inverse::Scatter(s) => format!("`{}`", s.name()),
        Inverse::Narrow => "`slice_scatter` of the range".into(),
        Inverse::Piece => "`slice_scatter` of the piece".into(),
        Inverse::Unbind => "`select_scatter` of the piece".into(),
        Inverse::AsStrided => "`as_strided_scatter`".into(),
        Inverse::Involution => "the view again".into(),
        Inverse::Permute => "the inverse permutation".into(),
        Inverse::Unsqueeze => "`squeeze`".into(),
        Inverse::Reshape => "a reshape back".into(),
        Inverse::Identity => "the value itself".into(),
    }
}

fn has_kernel(d: &OpDef) -> bool {
    !matches!(d.lowering, Lowering::None | Lowering::NoKernel)
}

fn entry(d: &OpDef) -> Entry {
    // Views and in-place ops use their functional form's rules and kernel.
    let via = match d.kind {
        OpKind::View | OpKind::MultiView | OpKind::ViewOrCopy | OpKind::InPlace => {
            d.counterpart.map(|c| c.def())
        }
        _ => None,
    };
    let f = via.unwrap_or(d);
    // A composite runs, differentiates and batches as its parts.
    let parts = matches!(f.rule, super::Rule::Composite(_));
    Entry {
        name: d.name.clone(),
        overloads: d.schemas.iter().map(|s| s.overload.clone()).collect(),
        kind: match d.metadata {
            Some(_) => "in-place view",
            None => kind_name(d.kind),
        },
        lowering: f.lowering.class_name(),
        vjp: parts || f.rules.vjp.is_some(),
        jvp: parts || f.rules.jvp.is_some(),
        batching: parts || f.rules.batch.is_some(),
        gpu: has_kernel(f),
        via: via.map(|v| v.name.clone()),
        inverse: d.inverse.map(inverse_name),
    }
}

/// Every built-in op, in table order.
pub fn entries() -> Vec<Entry> {
    TABLE.ops.iter().map(entry).collect()
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "-"
    }
}

fn overloads(e: &Entry) -> String {
    let o: Vec<String> = e
        .overloads
        .iter()
        .map(|o| {
            if o.is_empty() {
                "default".into()
            } else {
                format!("`{o}`")
            }
        })
        .collect();
    o.join(", ")
}

/// `docs/ops.md`: the page, generated (`kiln ops --markdown`).
pub fn markdown() -> String {
    let all = entries();
    let mut s = String::from(
        "# Ops\n\n\
         Generated from the op table by `kiln ops --markdown` (a test keeps it in step; \
         `kiln ops` prints it for a terminal, `kiln ops --json` for programs). Each op is \
         declared once, in `functionalize/src/ops/table/`: how to add one is \
         [contributing.md](contributing.md).\n\n\
         - **lowering**: how the GPU compiler computes it: a *map* is inlined into the \
         kernels that read it (a *free map* costs no memory traffic: index maps, fills); \
         the other classes are kernels of their own. `none yet`: compiling it fails \
         naming the op; the reference backend runs it.\n\
         - **vjp / jvp / batching**: the entry declares that transform rule (`grad`, \
         `vjp`, `jvp`, `vmap`); `-`: the transform refuses the op, naming it. \
         Factories take no tensor and are never batched.\n\
         - Views and in-place ops are removed by functionalization: they run, \
         differentiate and batch as their functional forms (`via`).\n\n\
         ## Functional ops\n\n\
         | op | overloads | kind | lowering | vjp | jvp | batching | GPU |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    let functional = |e: &&Entry| matches!(e.kind, "functional" | "factory");
    for e in all.iter().filter(functional) {
        let batching = match (e.kind, e.batching) {
            ("factory", _) => "never batched",
            (_, b) => yes(b),
        };
        s += &format!(
            "| `{}` | {} | {} | {} | {} | {} | {} | {} |\n",
            e.name,
            overloads(e),
            e.kind,
            e.lowering,
            yes(e.vjp),
            yes(e.jvp),
            batching,
            yes(e.gpu)
        );
    }
    s += "\n## Views\n\nEach runs as its copy (`via`) in a functional program; a write \
          through it reaches its input by its inverse.\n\n\
          | op | overloads | kind | via | inverse |\n|---|---|---|---|---|\n";
    for e in all
        .iter()
        .filter(|e| !functional(e) && e.kind != "in-place")
    {
        let via = match &e.via {
            Some(v) => format!("`{v}`"),
            // `chunk`, `contiguous`: spelled with other ops' copies.
            None => "the pass spells it".into(),
        };
        s += &format!(
            "| `{}` | {} | {} | {via} | {} |\n",
            e.name,
            overloads(e),
            e.kind,
            e.inverse.as_deref().unwrap_or("storage offsets only")
        );
    }
    s += "\n## In-place forms\n\nEach is its functional form (`via`) followed by a write \
          into `self`.\n\n| op | via |\n|---|---|\n";
    for e in all.iter().filter(|e| e.kind == "in-place") {
        s += &format!("| `{}` | `{}` |\n", e.name, e.via.as_deref().unwrap_or("-"));
    }
    s
}

/// `kiln ops`: one line per op, aligned.
pub fn text() -> String {
    let all = entries();
    let w = all.iter().map(|e| e.name.len()).max().unwrap_or(0);
    let mut s = format!(
        "{:w$}  {:12}  {:24}  {:4} {:4} {:5} {:3}  overloads\n",
        "op", "kind", "lowering", "vjp", "jvp", "batch", "gpu"
    );
    for e in &all {
        let lowering = match (&e.via, e.kind) {
            (Some(v), _) => format!("via {v}"),
            (None, "functional" | "factory") => e.lowering.to_string(),
            (None, _) => "functionalized".into(),
        };
        let o = if e.overloads.iter().all(|o| o.is_empty()) {
            String::new()
        } else {
            let o: Vec<&str> = e
                .overloads
                .iter()
                .map(|o| if o.is_empty() { "default" } else { o })
                .collect();
            o.join(", ")
        };
        s += &format!(
            "{:w$}  {:12}  {:24}  {:4} {:4} {:5} {:3}  {o}\n",
            e.name,
            e.kind,
            lowering,
            yes(e.vjp),
            yes(e.jvp),
            yes(e.batching),
            yes(e.gpu)
        );
    }
    s
}
