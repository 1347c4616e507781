//! The op table's declarations, by family. Each op is declared once, with
//! everything the rest of Kiln reads of it: schemas, kind, shape and dtype
//! rule with the reference kernel (`Rule`), lowering (`Lowering`), VJP,
//! JVP and batching rules, view inverse. In-place forms (`add_`) and view
//! copies (`slice_copy`) are derived from their base entries.

mod composites;
mod fills;
mod indexing;
mod linalg;
mod pointwise;
mod reductions;
mod view_ops;

pub(super) use super::batching as bt;
pub(super) use super::derivatives as d;
pub(super) use super::kernels as k;
pub(super) use super::pointwise as p;
pub(super) use super::select as sel;
pub(super) use super::views;
pub(super) use super::{
    Elem as E, EvalFn, InferFn, Inverse, Lowering as L, Lowering, OpDef, OpId, OpKind, OpKind::*,
    ProductForm, Reduction, RegionKind, RemapKind, Rule, Table,
};
use crate::rule::{BatchFn, JvpFn, VjpFn};
use crate::schema::Schemas;

pub(super) struct Builder {
    ops: Vec<OpDef>,
}

/// An op being declared: its entry's optional parts, set by name.
pub(super) struct Decl<'a> {
    b: &'a mut Builder,
    id: OpId,
}

impl Decl<'_> {
    pub fn id(&self) -> OpId {
        self.id
    }

    fn def(&mut self) -> &mut OpDef {
        &mut self.b.ops[self.id.0 as usize]
    }

    /// Its VJP, JVP and batching rules.
    pub fn rules(self, vjp: VjpFn, jvp: JvpFn, batch: BatchFn) -> Self {
        self.vjp(vjp).jvp(jvp).batch(batch)
    }

    pub fn vjp(mut self, f: VjpFn) -> Self {
        self.def().rules.vjp = Some(f);
        self
    }

    pub fn jvp(mut self, f: JvpFn) -> Self {
        self.def().rules.jvp = Some(f);
        self
    }

    pub fn batch(mut self, f: BatchFn) -> Self {
        self.def().rules.batch = Some(f);
        self
    }

    /// A view's: the rules of its `<view>_copy`.
    pub fn copy_rules(mut self, vjp: VjpFn, jvp: JvpFn, batch: BatchFn) -> Self {
        let copy = self.def().counterpart.expect("a view has its copy");
        Decl {
            b: self.b,
            id: copy,
        }
        .rules(vjp, jvp, batch);
        self
    }

    pub fn inverse(mut self, inverse: Inverse) -> Self {
        self.def().inverse = Some(inverse);
        self
    }

    /// Its tensor operands are read anywhere (`OpDef::gathers`).
    pub fn gathers(mut self) -> Self {
        self.def().gathers = true;
        self
    }

    /// Its in-place form may write through a self-overlapping view
    /// (`OpDef::overlap_ok`).
    pub fn overlap_ok(mut self) -> Self {
        let ip = self.def().counterpart.expect("an in-place form");
        self.b.ops[ip.0 as usize].overlap_ok = true;
        self
    }
}

impl Builder {
    fn decl(&mut self, id: OpId) -> Decl<'_> {
        Decl { b: self, id }
    }

    /// Op `name`, declared earlier.
    fn find(&self, name: &str) -> OpId {
        let i = self.ops.iter().position(|o| o.name == name);
        OpId(i.unwrap_or_else(|| panic!("no op {name} yet")) as u16)
    }

    fn add(&mut self, name: &str, kind: OpKind, schemas: &[&str], rule: Rule) -> Decl<'_> {
        let texts = schemas.iter().map(|&s| s.into()).collect();
        let id = self.add_texts(name, kind, texts, rule);
        self.decl(id)
    }

    /// `add`, with schemas made while building (derived forms').
    fn add_texts(&mut self, name: &str, kind: OpKind, texts: Vec<Box<str>>, rule: Rule) -> OpId {
        let id = OpId(self.ops.len() as u16);
        // Parsed when first used; `every_schema_parses` checks them all.
        let schemas = Schemas::lazy(texts);
        let lowering = match (&rule, kind) {
            (Rule::Pointwise(_), OpKind::Functional) => Lowering::Map(E::Pointwise),
            (Rule::ViewCopy(_), _) => Lowering::Free(E::ViewCopy),
            _ => Lowering::None,
        };
        self.ops
            .push(OpDef::new(name, kind, schemas, rule, lowering));
        id
    }

    /// A view and its `_copy` form.
    fn view(
        &mut self,
        name: &str,
        multi: bool,
        schemas: &[&str],
        rule: InferFn,
        inverse: Option<Inverse>,
    ) -> Decl<'_> {
        let kind = if multi {
            OpKind::MultiView
        } else {
            OpKind::View
        };
        let id = self.add(name, kind, schemas, Rule::View(rule)).id();
        self.ops[id.0 as usize].inverse = inverse;
        self.copy_of(id);
        self.decl(id)
    }

    /// `<view>_` (`transpose_`): `self` becomes that view of itself. Same
    /// rule, inverse and copy as the view, whose overloads these
    /// `schemas` follow one for one.
    fn view_in_place(&mut self, name: &str, view: &str, schemas: &[&str]) -> OpId {
        let v = self.find(view);
        let base = &self.ops[v.0 as usize];
        let Rule::View(rule) = base.rule else {
            panic!("{view} is not a view")
        };
        assert_eq!(
            base.schemas.texts().count(),
            schemas.len(),
            "{name}: one schema per overload of {view}"
        );
        let (inverse, copy) = (base.inverse, base.counterpart);
        let id = self.add(name, View, schemas, Rule::View(rule)).id();
        let d = &mut self.ops[id.0 as usize];
        d.inverse = inverse;
        d.counterpart = copy;
        d.metadata = Some(super::Metadata::View(v));
        id
    }

    /// `<name>_copy` with the view's schemas and a contiguous result.
    fn copy_of(&mut self, view: OpId) -> OpId {
        let v = &self.ops[view.0 as usize];
        let name = format!("{}_copy", v.name);
        let texts = v
            .schemas
            .texts()
            .map(|t| {
                let t = t
                    .replace("Tensor(a)", "Tensor")
                    .replace("Tensor(a -> *)", "Tensor");
                format!("{name}{}", &t[v.name.len()..]).into()
            })
            .collect();
        let id = self.add_texts(&name, OpKind::Functional, texts, Rule::ViewCopy(view));
        self.ops[view.0 as usize].counterpart = Some(id);
        id
    }

    /// A functional op and its in-place form `<name>_` (same schemas minus
    /// those whose first argument is not a tensor); the functional op's
    /// declaration.
    fn with_inplace(
        &mut self,
        name: &str,
        kind: OpKind,
        schemas: &[&str],
        rule: Rule,
        lowering: Lowering,
    ) -> Decl<'_> {
        let id = self.add(name, kind, schemas, rule).id();
        self.ops[id.0 as usize].lowering = lowering;
        let iname = format!("{name}_");
        let (overloads, texts): (Vec<usize>, Vec<Box<str>>) = schemas
            .iter()
            .enumerate()
            .filter(|(_, s)| s[s.find('(').unwrap() + 1..].starts_with("Tensor self"))
            .map(|(i, s)| (i, format!("{iname}{}", &s[name.len()..]).into()))
            .unzip();
        let ip = self.add_texts(&iname, OpKind::InPlace, texts, Rule::InPlace(id));
        self.ops[id.0 as usize].counterpart = Some(ip);
        let ip_def = &mut self.ops[ip.0 as usize];
        ip_def.counterpart = Some(id);
        ip_def.functional_overloads = overloads.into();
        self.decl(id)
    }

    /// An elementwise op, with its in-place form when `inplace`.
    fn pointwise(
        &mut self,
        name: &str,
        schemas: &[&str],
        plan: super::pointwise::PlanFn,
        inplace: bool,
    ) -> Decl<'_> {
        if inplace {
            let map = Lowering::Map(E::Pointwise);
            self.with_inplace(
                name,
                OpKind::Functional,
                schemas,
                Rule::Pointwise(plan),
                map,
            )
        } else {
            self.add(name, OpKind::Functional, schemas, Rule::Pointwise(plan))
        }
    }

    /// `<view>_scatter`, the view's inverse unless it has its own;
    /// `region`: the region a predicated map writes (`None` for
    /// `as_strided`, which may overlap itself).
    fn scatter(
        &mut self,
        name: &str,
        schema: &str,
        view: InferFn,
        region: Option<RegionKind>,
    ) -> Decl<'_> {
        let id = self
            .add(name, Functional, &[schema], Rule::Scatter(view))
            .id();
        let view = name
            .strip_suffix("_scatter")
            .expect("a scatter is <view>_scatter");
        let v = self.find(view);
        self.ops[id.0 as usize].lowering = match region {
            Some(region) => Lowering::RegionScatter { view: v, region },
            None => Lowering::StridedScatter(v),
        };
        self.ops[v.0 as usize]
            .inverse
            .get_or_insert(Inverse::Scatter(id));
        self.decl(id)
    }

    /// A composite op: its decomposition into other ops of the table
    /// (`composite`), with an in-place form when `inplace`.
    fn composite(
        &mut self,
        name: &str,
        schemas: &[&str],
        f: super::composite::DecompFn,
        inplace: bool,
    ) -> Decl<'_> {
        let rule = Rule::Composite(f);
        let id = if inplace {
            self.with_inplace(name, Functional, schemas, rule, L::Composite)
                .id()
        } else {
            self.add(name, Functional, schemas, rule).id()
        };
        self.ops[id.0 as usize].lowering = L::Composite;
        self.decl(id)
    }

    fn kernel(
        &mut self,
        name: &str,
        kind: OpKind,
        schemas: &[&str],
        infer: InferFn,
        eval: EvalFn,
        lowering: Lowering,
    ) -> Decl<'_> {
        let id = self
            .add(name, kind, schemas, Rule::Kernel { infer, eval })
            .id();
        self.ops[id.0 as usize].lowering = lowering;
        self.decl(id)
    }
}

/// The built-in table.
pub(super) fn build() -> Table {
    let mut b = Builder { ops: vec![] };
    view_ops::declare(&mut b);
    pointwise::declare(&mut b);
    fills::declare(&mut b);
    reductions::declare(&mut b);
    linalg::declare(&mut b);
    indexing::declare(&mut b);
    composites::declare(&mut b);
    // Functional ops no declaration gave a kernel say so.
    for o in &mut b.ops {
        if o.lowering == L::None && matches!(o.kind, Functional | Factory) {
            o.lowering = L::NoKernel;
        }
    }
    Table::new(b.ops)
}
