//! The op table: every op Kiln knows, with its ATen schemas, its kind, its
//! shape/dtype rule and its reference kernel. In-place forms (`add_`) and
//! view copies (`slice_copy`) are derived from their base entries, so adding
//! an op means adding one entry here. Each functional op also carries its
//! transform rules (`Rules`: VJP and JVP from `derivatives.rs`, batching
//! from `batching.rs`); which op has which is listed in
//! `docs/transforms.md` (a test keeps the list in step with the table).

pub mod args;
pub mod batching;
pub mod derivatives;
pub mod kernels;
pub mod layout;
pub mod lowering;
pub mod pointwise;
pub mod select;
pub mod views;

pub use lowering::{Elem, GatherForm, Lowering, ProductForm, Reduction, RegionKind, RemapKind};

use crate::meta::{Meta, Metas};
use crate::schema::{Arg, Schema, Schemas};
use crate::tensor::RTensor;
use std::collections::HashMap;
use std::sync::LazyLock;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OpId(pub u16);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    /// Returns a tensor aliasing its first argument's storage.
    View,
    /// Returns several views (`split`, `chunk`, `unbind`).
    MultiView,
    /// An alias when the layout allows one, a copy otherwise (`reshape`,
    /// `contiguous`): decided statically from strides.
    ViewOrCopy,
    /// Mutates its first argument and returns it.
    InPlace,
    /// A pure function of its arguments returning fresh tensors.
    Functional,
    /// Makes a tensor from literals alone.
    Factory,
}

pub type InferFn = fn(&[Arg<&Meta>]) -> Result<Metas, String>;
pub type EvalFn = fn(&[Arg<RTensor>], &[Meta]) -> Result<Vec<RTensor>, String>;
pub type ViewOrCopyFn = fn(&[Arg<&Meta>]) -> Result<(Meta, bool), String>;

pub enum Rule {
    /// Result metas over the input's storage.
    View(InferFn),
    ViewOrCopy(ViewOrCopyFn),
    /// Elementwise: the plan gives shape, dtype and scalar function.
    Pointwise(pointwise::PlanFn),
    /// A contiguous copy of the results of the view op (`<view>_copy`).
    ViewCopy(OpId),
    /// A scatter: `self` with `src` written through the view (the view's
    /// arguments follow `src`).
    Scatter(InferFn),
    /// Computes the functional op, then writes the result into `self`.
    InPlace(OpId),
    Kernel {
        infer: InferFn,
        eval: EvalFn,
    },
    /// A custom function (`crate::custom`): `OpDef::custom` has its rules.
    Custom,
}

pub struct OpDef {
    pub name: String,
    pub kind: OpKind,
    pub schemas: Schemas,
    pub rule: Rule,
    pub lowering: Lowering,
    /// View op: its `_copy` form. In-place op: its functional form.
    /// Functional op with an in-place form: that form.
    pub counterpart: Option<OpId>,
    /// View op: how a value written to its result is put back into its
    /// input; `None`: only in storage coordinates (`expand`, `unfold`).
    pub inverse: Option<Inverse>,
    /// In-place op: for each of its overloads, the functional form's
    /// overload of the same parameters, so that arguments bound by one are
    /// bound by the other (`with_inplace`); empty for other ops.
    pub functional_overloads: Box<[usize]>,
    /// In-place ops that may write through a self-overlapping view because
    /// every element gets the same value (`fill_`, `zero_`).
    pub overlap_ok: bool,
    /// Functional op whose tensor operands are read anywhere (gathered), not
    /// position by position: its in-place form refuses any operand sharing
    /// memory with the written tensor, as eager does.
    pub gathers: bool,
    /// How function transforms treat the op (`derivatives.rs`,
    /// `batching.rs`).
    pub rules: Rules,
    /// A custom function's implementation and rules.
    pub custom: Option<std::sync::Arc<dyn crate::custom::Function>>,
}

/// How the functionalization pass writes a view's new value back into the
/// view's input (PyTorch's `FunctionalInverses`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Inverse {
    /// The view's `<view>_scatter` with the view's own arguments.
    Scatter(OpId),
    /// `slice_scatter` of the narrowed range.
    Narrow,
    /// `slice_scatter` of the piece's range (`split`, `chunk`).
    Piece,
    /// `select_scatter` at the piece's index.
    Unbind,
    /// `as_strided_scatter`: offsets and strides address the whole storage,
    /// whatever view `as_strided` was applied to.
    AsStrided,
    /// The view again (`transpose`, `t`).
    Involution,
    /// The inverse permutation.
    Permute,
    /// `squeeze` of the inserted dimension.
    Unsqueeze,
    /// A reshape back to the input's sizes.
    Reshape,
    /// The written value itself (`alias`, `contiguous`).
    Identity,
}

/// An op's rules for the transforms; `None` refuses the transform with an
/// error naming the op. View and in-place ops have none: transforms run on
/// functionalized programs.
#[derive(Clone, Copy, Default)]
pub struct Rules {
    pub vjp: Option<crate::transform::VjpFn>,
    pub jvp: Option<crate::transform::JvpFn>,
    pub batch: Option<crate::transform::BatchFn>,
}

impl OpDef {
    pub fn id(&self) -> OpId {
        lookup(&self.name).expect("every op definition is in the table")
    }
}

pub struct Table {
    pub ops: Vec<OpDef>,
    /// Looked up once per parsed statement: a fast hash.
    by_name: rustc_hash::FxHashMap<String, OpId>,
}

pub static TABLE: LazyLock<Table> = LazyLock::new(build);

pub fn lookup(name: &str) -> Option<OpId> {
    match TABLE.by_name.get(name) {
        Some(&id) => Some(id),
        // Custom functions have qualified names.
        None if name.contains("::") => custom_ops()
            .iter()
            .position(|o| o.name == name)
            .map(|i| OpId((TABLE.ops.len() + i) as u16)),
        None => None,
    }
}

pub fn op(id: OpId) -> &'static OpDef {
    let i = id.0 as usize;
    match TABLE.ops.get(i) {
        Some(o) => o,
        None => custom_ops()[i - TABLE.ops.len()],
    }
}

/// Registered custom functions, after the built-in table (leaked: a
/// registered op lives as long as the process, like the table).
static CUSTOM: std::sync::RwLock<Vec<&'static OpDef>> = std::sync::RwLock::new(Vec::new());

fn custom_ops() -> std::sync::RwLockReadGuard<'static, Vec<&'static OpDef>> {
    CUSTOM.read().unwrap_or_else(|e| e.into_inner())
}

/// `custom::register`: the op's entry from the function's schema.
pub fn register_custom(f: std::sync::Arc<dyn crate::custom::Function>) -> Result<OpId, String> {
    let text = f.schema();
    let schema = Schema::try_parse(&text)?;
    if !schema.name.contains("::") || schema.name.starts_with("aten::") {
        return Err(format!(
            "custom function `{}`: give it a qualified name of your own, `mylib::{}`",
            schema.name,
            schema.name.rsplit("::").next().unwrap_or("")
        ));
    }
    if text.contains('!') {
        return Err(format!(
            "custom function `{}` writes an argument (`!` in its schema): custom functions are \
             functional; return a new tensor instead",
            schema.name
        ));
    }
    if f.generate_vmap_rule() && !f.has_forward_ops() {
        return Err(format!(
            "custom function `{}`: generate_vmap_rule batches a forward written with Kiln ops, and \
             this one's forward is opaque (give forward_ops and has_forward_ops, or a vmap rule)",
            schema.name
        ));
    }
    let mut all = CUSTOM.write().unwrap_or_else(|e| e.into_inner());
    if TABLE.by_name.contains_key(&schema.name) || all.iter().any(|o| o.name == schema.name) {
        return Err(format!(
            "an op named `{}` is already registered",
            schema.name
        ));
    }
    let id = OpId((TABLE.ops.len() + all.len()) as u16);
    let def = OpDef {
        name: schema.name.clone(),
        kind: OpKind::Functional,
        schemas: Schemas::parsed(vec![schema]),
        rule: Rule::Custom,
        lowering: Lowering::Custom,
        counterpart: None,
        inverse: None,
        functional_overloads: Box::default(),
        overlap_ok: false,
        gathers: false,
        rules: Rules::default(),
        custom: Some(f),
    };
    all.push(Box::leak(Box::new(def)));
    Ok(id)
}

impl OpId {
    pub fn def(self) -> &'static OpDef {
        op(self)
    }
    pub fn name(self) -> &'static str {
        &op(self).name
    }
}

struct Builder {
    ops: Vec<OpDef>,
}

impl Builder {
    /// The index of op `name` (building only).
    fn by_name_slow(&self, name: &str) -> usize {
        self.ops
            .iter()
            .position(|o| o.name == name)
            .unwrap_or_else(|| panic!("no op {name} yet"))
    }

    fn add(&mut self, name: &str, kind: OpKind, schemas: &[&str], rule: Rule) -> OpId {
        let texts = schemas.iter().map(|&s| s.into()).collect();
        self.add_texts(name, kind, texts, rule)
    }

    /// `add`, with schemas made while building (derived forms').
    fn add_texts(&mut self, name: &str, kind: OpKind, texts: Vec<Box<str>>, rule: Rule) -> OpId {
        let id = OpId(self.ops.len() as u16);
        // Parsed when first used; `every_schema_parses` checks them all.
        let schemas = Schemas::lazy(texts);
        let lowering = match (&rule, kind) {
            (Rule::Pointwise(_), OpKind::Functional) => Lowering::Map(Elem::Pointwise),
            (Rule::ViewCopy(_), _) => Lowering::Free(Elem::ViewCopy),
            _ => Lowering::None,
        };
        self.ops.push(OpDef {
            name: name.into(),
            kind,
            schemas,
            rule,
            lowering,
            counterpart: None,
            inverse: None,
            functional_overloads: Box::default(),
            overlap_ok: false,
            gathers: false,
            rules: Rules::default(),
            custom: None,
        });
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
    ) -> OpId {
        let kind = if multi {
            OpKind::MultiView
        } else {
            OpKind::View
        };
        let id = self.add(name, kind, schemas, Rule::View(rule));
        self.ops[id.0 as usize].inverse = inverse;
        self.copy_of(id);
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
    /// those whose first argument is not a tensor).
    fn with_inplace(
        &mut self,
        name: &str,
        kind: OpKind,
        schemas: &[&str],
        rule: Rule,
        lowering: Lowering,
    ) -> OpId {
        let id = self.add(name, kind, schemas, rule);
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
        ip
    }

    fn pointwise(&mut self, name: &str, schemas: &[&str], plan: pointwise::PlanFn, inplace: bool) {
        if inplace {
            let map = Lowering::Map(Elem::Pointwise);
            self.with_inplace(
                name,
                OpKind::Functional,
                schemas,
                Rule::Pointwise(plan),
                map,
            );
        } else {
            self.add(name, OpKind::Functional, schemas, Rule::Pointwise(plan));
        }
    }

    fn kernel(
        &mut self,
        name: &str,
        kind: OpKind,
        schemas: &[&str],
        infer: InferFn,
        eval: EvalFn,
        lowering: Lowering,
    ) -> OpId {
        let id = self.add(name, kind, schemas, Rule::Kernel { infer, eval });
        self.ops[id.0 as usize].lowering = lowering;
        id
    }

    /// Marks functional op `id` (or the functional form of in-place op
    /// `id`) as reading its tensor operands anywhere (`OpDef::gathers`).
    fn gathers(&mut self, id: OpId) {
        let d = &self.ops[id.0 as usize];
        let f = match d.kind {
            OpKind::InPlace => d.counterpart.expect("an in-place op has a functional form"),
            _ => id,
        };
        self.ops[f.0 as usize].gathers = true;
    }
}

fn build() -> Table {
    use kernels as k;
    use pointwise as p;
    use Elem as E;
    use Lowering as L;
    use OpKind::*;
    let mut b = Builder { ops: vec![] };

    // Views (each gets a `<name>_copy`).
    b.view(
        "view",
        false,
        &["view(Tensor(a) self, SymInt[] size) -> Tensor(a)"],
        views::view,
        Some(Inverse::Reshape),
    );
    let reshape = b.add(
        "reshape",
        ViewOrCopy,
        &["reshape(Tensor(a) self, SymInt[] shape) -> Tensor(a)"],
        Rule::ViewOrCopy(views::reshape),
    );
    // ATen has no `reshape_copy`: a functional program's values are
    // contiguous, where `view_copy` is the same thing.
    b.ops[reshape.0 as usize].inverse = Some(Inverse::Reshape);
    let view = OpId(b.by_name_slow("view") as u16);
    b.ops[reshape.0 as usize].counterpart = b.ops[view.0 as usize].counterpart;
    // ATen's always-copying reshape.
    b.add(
        "_reshape_copy",
        Functional,
        &["_reshape_copy(Tensor self, SymInt[] size) -> Tensor"],
        Rule::ViewCopy(reshape),
    );
    b.view(
        "slice",
        false,
        &["slice.Tensor(Tensor(a) self, int dim=0, SymInt? start=None, SymInt? end=None, SymInt step=1) -> Tensor(a)"],
        views::slice,
        None, // `slice_scatter`, below
    );
    b.view(
        "select",
        false,
        &["select.int(Tensor(a) self, int dim, SymInt index) -> Tensor(a)"],
        views::select,
        None, // `select_scatter`, below
    );
    b.view(
        "transpose",
        false,
        &["transpose.int(Tensor(a) self, int dim0, int dim1) -> Tensor(a)"],
        views::transpose,
        Some(Inverse::Involution),
    );
    b.view(
        "t",
        false,
        &["t(Tensor(a) self) -> Tensor(a)"],
        views::t,
        Some(Inverse::Involution),
    );
    b.view(
        "permute",
        false,
        &["permute(Tensor(a) self, int[] dims) -> Tensor(a)"],
        views::permute,
        Some(Inverse::Permute),
    );
    b.view(
        "expand",
        false,
        &["expand(Tensor(a) self, SymInt[] size, *, bool implicit=False) -> Tensor(a)"],
        views::expand,
        None,
    );
    b.view(
        "diagonal",
        false,
        &["diagonal(Tensor(a) self, int offset=0, int dim1=0, int dim2=1) -> Tensor(a)"],
        views::diagonal,
        None, // `diagonal_scatter`, below
    );
    b.view(
        "as_strided",
        false,
        &["as_strided(Tensor(a) self, SymInt[] size, SymInt[] stride, SymInt? storage_offset=None) -> Tensor(a)"],
        views::as_strided,
        Some(Inverse::AsStrided),
    );
    b.view(
        "unsqueeze",
        false,
        &["unsqueeze(Tensor(a) self, int dim) -> Tensor(a)"],
        views::unsqueeze,
        Some(Inverse::Unsqueeze),
    );
    b.view(
        "squeeze",
        false,
        &[
            "squeeze(Tensor(a) self) -> Tensor(a)",
            "squeeze.dim(Tensor(a) self, int dim) -> Tensor(a)",
            "squeeze.dims(Tensor(a) self, int[] dim) -> Tensor(a)",
        ],
        views::squeeze,
        Some(Inverse::Reshape),
    );
    b.view(
        "alias",
        false,
        &["alias(Tensor(a) self) -> Tensor(a)"],
        views::alias,
        Some(Inverse::Identity),
    );
    b.view(
        "narrow",
        false,
        &["narrow(Tensor(a) self, int dim, SymInt start, SymInt length) -> Tensor(a)"],
        views::narrow,
        Some(Inverse::Narrow),
    );
    b.view(
        "unfold",
        false,
        &["unfold(Tensor(a) self, int dimension, int size, int step) -> Tensor(a)"],
        views::unfold,
        None,
    );
    b.view(
        "split",
        true,
        &[
            "split.Tensor(Tensor(a -> *) self, SymInt split_size, int dim=0) -> Tensor(a)[]",
            "split.sizes(Tensor(a -> *) self, SymInt[] split_size, int dim=0) -> Tensor(a)[]",
        ],
        views::split,
        Some(Inverse::Piece),
    );
    b.view(
        "split_with_sizes",
        true,
        &["split_with_sizes(Tensor(a -> *) self, SymInt[] split_sizes, int dim=0) -> Tensor(a)[]"],
        views::split,
        Some(Inverse::Piece),
    );
    // ATen has no `chunk_copy`: functional programs spell a chunk's
    // pieces with `split_copy` / `split_with_sizes_copy` (the pass).
    let chunk = b.add(
        "chunk",
        MultiView,
        &["chunk(Tensor(a -> *) self, int chunks, int dim=0) -> Tensor(a)[]"],
        Rule::View(views::chunk),
    );
    b.ops[chunk.0 as usize].inverse = Some(Inverse::Piece);
    b.view(
        "unbind",
        true,
        &["unbind.int(Tensor(a -> *) self, int dim=0) -> Tensor(a)[]"],
        views::unbind,
        Some(Inverse::Unbind),
    );
    let contiguous = b.add(
        "contiguous",
        ViewOrCopy,
        &["contiguous(Tensor(a) self) -> Tensor(a)"],
        Rule::ViewOrCopy(views::contiguous),
    );
    b.ops[contiguous.0 as usize].inverse = Some(Inverse::Identity);

    // Scatters: the inverse of a view, writing `src` through it.
    // `region`: the region a predicated map writes; `None` for
    // `as_strided`, which may overlap itself.
    let sc = |b: &mut Builder, name: &str, schema: &str, view: InferFn, region| {
        let id = b.add(name, Functional, &[schema], Rule::Scatter(view));
        let view = name
            .strip_suffix("_scatter")
            .expect("a scatter is <view>_scatter");
        let v = b.ops.iter().position(|o| o.name == view);
        let v = OpId(v.expect("a scatter's view is defined before it") as u16);
        b.ops[id.0 as usize].lowering = match region {
            Some(region) => Lowering::RegionScatter { view: v, region },
            None => Lowering::StridedScatter(v),
        };
        // The view's inverse, unless it has its own (`as_strided`'s).
        b.ops[v.0 as usize]
            .inverse
            .get_or_insert(Inverse::Scatter(id));
    };
    sc(
        &mut b,
        "slice_scatter",
        "slice_scatter(Tensor self, Tensor src, int dim=0, SymInt? start=None, SymInt? end=None, SymInt step=1) -> Tensor",
        views::slice,
        Some(RegionKind::Slice),
    );
    sc(
        &mut b,
        "select_scatter",
        "select_scatter(Tensor self, Tensor src, int dim, SymInt index) -> Tensor",
        views::select,
        Some(RegionKind::Select),
    );
    sc(
        &mut b,
        "diagonal_scatter",
        "diagonal_scatter(Tensor self, Tensor src, int offset=0, int dim1=0, int dim2=1) -> Tensor",
        views::diagonal,
        Some(RegionKind::Diagonal),
    );
    sc(
        &mut b,
        "as_strided_scatter",
        "as_strided_scatter(Tensor self, Tensor src, SymInt[] size, SymInt[] stride, SymInt? storage_offset=None) -> Tensor",
        views::as_strided,
        None,
    );

    // Elementwise ops, each with its in-place form.
    let bin = |n: &str| {
        [
            format!("{n}.Tensor(Tensor self, Tensor other) -> Tensor"),
            format!("{n}.Scalar(Tensor self, Scalar other) -> Tensor"),
        ]
    };
    let unary = |n: &str| format!("{n}(Tensor self) -> Tensor");
    b.pointwise(
        "add",
        &[
            "add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor",
            "add.Scalar(Tensor self, Scalar other, Scalar alpha=1) -> Tensor",
        ],
        p::add,
        true,
    );
    b.pointwise(
        "sub",
        &[
            "sub.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor",
            "sub.Scalar(Tensor self, Scalar other, Scalar alpha=1) -> Tensor",
        ],
        p::sub,
        true,
    );
    let [m0, m1] = bin("mul");
    b.pointwise("mul", &[&m0, &m1], p::mul, true);
    b.pointwise(
        "div",
        &[
            "div.Tensor(Tensor self, Tensor other) -> Tensor",
            "div.Scalar(Tensor self, Scalar other) -> Tensor",
            "div.Tensor_mode(Tensor self, Tensor other, *, str? rounding_mode) -> Tensor",
            "div.Scalar_mode(Tensor self, Scalar other, *, str? rounding_mode) -> Tensor",
        ],
        p::div,
        true,
    );
    let unaries: [(&str, pointwise::PlanFn); 15] = [
        ("silu", p::silu),
        ("neg", p::neg),
        ("exp", p::exp),
        ("log", p::log),
        ("sqrt", p::sqrt),
        ("rsqrt", p::rsqrt),
        ("abs", p::abs),
        ("relu", p::relu),
        ("sigmoid", p::sigmoid),
        ("tanh", p::tanh),
        ("logical_not", p::logical_not),
        ("sin", p::sin),
        ("cos", p::cos),
        ("reciprocal", p::reciprocal),
        ("erf", p::erf),
    ];
    for (n, plan) in unaries {
        b.pointwise(n, &[&unary(n)], plan, true);
    }
    b.pointwise(
        "gelu",
        &["gelu(Tensor self, *, str approximate='none') -> Tensor"],
        p::gelu,
        true,
    );
    b.pointwise(
        "pow",
        &[
            "pow.Tensor_Tensor(Tensor self, Tensor exponent) -> Tensor",
            "pow.Tensor_Scalar(Tensor self, Scalar exponent) -> Tensor",
            "pow.Scalar(Scalar self, Tensor exponent) -> Tensor",
        ],
        p::pow,
        true,
    );
    b.pointwise(
        "maximum",
        &["maximum(Tensor self, Tensor other) -> Tensor"],
        p::maximum,
        false, // ATen has no `maximum_`
    );
    b.pointwise(
        "minimum",
        &["minimum(Tensor self, Tensor other) -> Tensor"],
        p::minimum,
        false, // ATen has no `minimum_`
    );
    b.pointwise(
        "where",
        &[
            "where.self(Tensor condition, Tensor self, Tensor other) -> Tensor",
            "where.ScalarSelf(Tensor condition, Scalar self, Tensor other) -> Tensor",
            "where.ScalarOther(Tensor condition, Tensor self, Scalar other) -> Tensor",
            "where.Scalar(Tensor condition, Scalar self, Scalar other) -> Tensor",
        ],
        p::where_,
        false,
    );
    b.pointwise(
        "clamp",
        &[
            "clamp(Tensor self, Scalar? min=None, Scalar? max=None) -> Tensor",
            "clamp.Tensor(Tensor self, Tensor? min=None, Tensor? max=None) -> Tensor",
        ],
        p::clamp,
        true,
    );
    let cmps: [(&str, pointwise::PlanFn); 6] = [
        ("eq", p::eq),
        ("ne", p::ne),
        ("lt", p::lt),
        ("le", p::le),
        ("gt", p::gt),
        ("ge", p::ge),
    ];
    for (n, plan) in cmps {
        let [s0, s1] = bin(n);
        b.pointwise(n, &[&s0, &s1], plan, true);
    }
    for (n, plan) in [
        ("logical_and", p::logical_and as pointwise::PlanFn),
        ("logical_or", p::logical_or),
    ] {
        b.pointwise(
            n,
            &[&format!("{n}(Tensor self, Tensor other) -> Tensor")],
            plan,
            true,
        );
    }
    b.pointwise(
        "remainder",
        &[
            "remainder.Tensor(Tensor self, Tensor other) -> Tensor",
            "remainder.Scalar(Tensor self, Scalar other) -> Tensor",
            "remainder.Scalar_Tensor(Scalar self, Tensor other) -> Tensor",
        ],
        p::remainder,
        true,
    );
    b.pointwise("sign", &["sign(Tensor self) -> Tensor"], p::sign, true);
    // Backward ops of derivatives.yaml that transforms emit.
    b.pointwise(
        "threshold_backward",
        &["threshold_backward(Tensor grad_output, Tensor self, Scalar threshold) -> Tensor"],
        p::threshold_backward,
        false,
    );
    b.pointwise(
        "gelu_backward",
        &["gelu_backward(Tensor grad_output, Tensor self, *, str approximate='none') -> Tensor"],
        p::gelu_backward,
        false,
    );
    b.pointwise(
        "silu_backward",
        &["silu_backward(Tensor grad_output, Tensor self) -> Tensor"],
        p::silu_backward,
        false,
    );
    b.pointwise(
        "sigmoid_backward",
        &["sigmoid_backward(Tensor grad_output, Tensor output) -> Tensor"],
        p::sigmoid_backward,
        false,
    );
    b.pointwise(
        "tanh_backward",
        &["tanh_backward(Tensor grad_output, Tensor output) -> Tensor"],
        p::tanh_backward,
        false,
    );
    b.pointwise(
        "floor_divide",
        &[
            "floor_divide(Tensor self, Tensor other) -> Tensor",
            "floor_divide.Scalar(Tensor self, Scalar other) -> Tensor",
        ],
        p::floor_divide,
        true,
    );

    // Copies and fills, each with its in-place form.
    b.with_inplace(
        "copy",
        Functional,
        &["copy(Tensor self, Tensor src, bool non_blocking=False) -> Tensor"],
        Rule::Kernel {
            infer: k::copy_infer,
            eval: k::copy_eval,
        },
        L::Map(E::CopyFrom),
    );
    let fill = b.with_inplace(
        "fill",
        Functional,
        &[
            "fill.Scalar(Tensor self, Scalar value) -> Tensor",
            "fill.Tensor(Tensor self, Tensor value) -> Tensor",
        ],
        Rule::Kernel {
            infer: k::fill_infer,
            eval: k::fill_eval,
        },
        L::Free(E::Fill { value: 1 }),
    );
    b.ops[fill.0 as usize].overlap_ok = true;
    let zero = b.with_inplace(
        "zero",
        Functional,
        &["zero(Tensor self) -> Tensor"],
        Rule::Kernel {
            infer: k::like_self_infer,
            eval: k::zeros_eval,
        },
        L::Free(E::Constant { one: false }),
    );
    b.ops[zero.0 as usize].overlap_ok = true;
    b.with_inplace(
        "masked_fill",
        Functional,
        &[
            "masked_fill.Scalar(Tensor self, Tensor mask, Scalar value) -> Tensor",
            "masked_fill.Tensor(Tensor self, Tensor mask, Tensor value) -> Tensor",
        ],
        Rule::Kernel {
            infer: k::masked_fill_infer,
            eval: k::masked_fill_eval,
        },
        L::Map(E::MaskedFill),
    );
    let id = b.with_inplace(
        "index_put",
        Functional,
        &["index_put(Tensor self, Tensor?[] indices, Tensor values, bool accumulate=False) -> Tensor"],
        Rule::Kernel { infer: k::index_put_infer, eval: k::index_put_eval }, L::IndexPut,
    );
    // Reads its index and source anywhere.
    b.gathers(id);

    // Factories and copies.
    b.kernel(
        "zeros",
        Factory,
        &["zeros(SymInt[] size, *, ScalarType? dtype=None) -> Tensor"],
        k::zeros_infer,
        k::zeros_eval,
        L::Free(E::Constant { one: false }),
    );
    b.kernel(
        "ones",
        Factory,
        &["ones(SymInt[] size, *, ScalarType? dtype=None) -> Tensor"],
        k::zeros_infer,
        k::ones_eval,
        L::Free(E::Constant { one: true }),
    );
    b.kernel(
        "full",
        Factory,
        &["full(SymInt[] size, Scalar fill_value, *, ScalarType? dtype=None) -> Tensor"],
        k::full_infer,
        k::full_eval,
        L::Free(E::Fill { value: 1 }),
    );
    b.kernel(
        "arange",
        Factory,
        &[
            "arange(Scalar end, *, ScalarType? dtype=None) -> Tensor",
            "arange.start(Scalar start, Scalar end, *, ScalarType? dtype=None) -> Tensor",
            "arange.start_step(Scalar start, Scalar end, Scalar step=1, *, ScalarType? dtype=None) -> Tensor",
        ],
        k::arange_infer,
        k::arange_eval, L::Free(E::Arange),
    );
    b.kernel(
        "zeros_like",
        Functional,
        &["zeros_like(Tensor self, *, ScalarType? dtype=None) -> Tensor"],
        k::like_infer,
        k::zeros_eval,
        L::Free(E::Constant { one: false }),
    );
    b.kernel(
        "ones_like",
        Functional,
        &["ones_like(Tensor self, *, ScalarType? dtype=None) -> Tensor"],
        k::like_infer,
        k::ones_eval,
        L::Free(E::Constant { one: true }),
    );
    b.kernel(
        "full_like",
        Functional,
        &["full_like(Tensor self, Scalar fill_value, *, ScalarType? dtype=None) -> Tensor"],
        k::full_like_infer,
        k::full_like_eval,
        L::Free(E::Fill { value: 1 }),
    );
    b.kernel(
        "clone",
        Functional,
        &["clone(Tensor self) -> Tensor"],
        k::like_self_infer,
        k::clone_eval,
        L::Map(E::Same),
    );

    // Reductions.
    b.kernel(
        "sum",
        Functional,
        &[
            "sum(Tensor self, *, ScalarType? dtype=None) -> Tensor",
            "sum.dim_IntList(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor",
        ],
        k::sum_infer,
        k::sum_eval, L::Reduce(Reduction::Sum),
    );
    b.kernel(
        "mean",
        Functional,
        &[
            "mean(Tensor self, *, ScalarType? dtype=None) -> Tensor",
            "mean.dim(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor",
        ],
        k::mean_infer,
        k::mean_eval, L::Reduce(Reduction::Mean),
    );
    for (name, eval, sqrt) in [
        ("var", k::var_eval as EvalFn, false),
        ("std", k::std_eval, true),
    ] {
        b.kernel(
            name,
            Functional,
            &[&format!("{name}.correction(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False) -> Tensor")],
            k::var_infer,
            eval,
            L::Reduce(Reduction::Var { sqrt }),
        );
    }
    let id = b.with_inplace(
        "index_add",
        Functional,
        &["index_add(Tensor self, int dim, Tensor index, Tensor source, *, Scalar alpha=1) -> Tensor"],
        Rule::Kernel {
            infer: k::index_add_infer,
            eval: k::index_add_eval,
        }, L::Map(E::IndexAdd),
    );
    // Reads its index and source anywhere.
    b.gathers(id);
    b.kernel(
        "cumsum",
        Functional,
        &["cumsum(Tensor self, int dim, *, ScalarType? dtype=None) -> Tensor"],
        k::cumsum_infer,
        k::cumsum_eval,
        L::Scan,
    );
    b.kernel(
        "amax",
        Functional,
        &["amax(Tensor self, int[1] dim=[], bool keepdim=False) -> Tensor"],
        k::amax_infer,
        k::amax_eval,
        L::Reduce(Reduction::Amax),
    );
    b.kernel(
        "amin",
        Functional,
        &["amin(Tensor self, int[1] dim=[], bool keepdim=False) -> Tensor"],
        k::amax_infer,
        k::amin_eval,
        L::Reduce(Reduction::Amin),
    );
    b.kernel(
        "softmax",
        Functional,
        &["softmax.int(Tensor self, int dim, ScalarType? dtype=None) -> Tensor"],
        k::softmax_infer,
        k::softmax_eval,
        L::Softmax { log: false },
    );
    b.kernel(
        "log_softmax",
        Functional,
        &["log_softmax.int(Tensor self, int dim, ScalarType? dtype=None) -> Tensor"],
        k::softmax_infer,
        k::log_softmax_eval,
        L::Softmax { log: true },
    );
    b.kernel(
        "_softmax",
        Functional,
        &["_softmax(Tensor self, int dim, bool half_to_float) -> Tensor"],
        k::softmax_infer,
        k::softmax_eval,
        L::Softmax { log: false },
    );
    b.kernel(
        "_log_softmax",
        Functional,
        &["_log_softmax(Tensor self, int dim, bool half_to_float) -> Tensor"],
        k::softmax_infer,
        k::log_softmax_eval,
        L::Softmax { log: true },
    );

    // Linear algebra and layers.
    b.kernel(
        "mm",
        Functional,
        &["mm(Tensor self, Tensor mat2) -> Tensor"],
        k::mm_infer,
        k::mm_eval,
        L::MatMul(ProductForm::plain(false)),
    );
    b.kernel(
        "bmm",
        Functional,
        &["bmm(Tensor self, Tensor mat2) -> Tensor"],
        k::bmm_infer,
        k::bmm_eval,
        L::MatMul(ProductForm::plain(true)),
    );
    b.kernel(
        "matmul",
        Functional,
        &["matmul(Tensor self, Tensor other) -> Tensor"],
        k::matmul_infer,
        k::matmul_eval,
        L::MatMul(ProductForm::plain(true)),
    );
    b.kernel(
        "addmm",
        Functional,
        &["addmm(Tensor self, Tensor mat1, Tensor mat2, *, Scalar beta=1, Scalar alpha=1) -> Tensor"],
        k::addmm_infer,
        k::addmm_eval, L::MatMul(ProductForm { left: 1, right: 2, addend: Some(0), linear: false, batched: false }),
    );
    b.kernel(
        "linear",
        Functional,
        &["linear(Tensor input, Tensor weight, Tensor? bias=None) -> Tensor"],
        k::linear_infer,
        k::linear_eval,
        L::MatMul(ProductForm {
            left: 0,
            right: 1,
            addend: Some(2),
            linear: true,
            batched: false,
        }),
    );
    b.kernel(
        "layer_norm",
        Functional,
        &["layer_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight=None, Tensor? bias=None, float eps=1e-05, bool cudnn_enable=True) -> Tensor"],
        k::layer_norm_infer,
        k::layer_norm_eval, L::LayerNorm,
    );
    b.kernel(
        "embedding",
        Functional,
        &["embedding(Tensor weight, Tensor indices, SymInt padding_idx=-1, bool scale_grad_by_freq=False, bool sparse=False) -> Tensor"],
        k::embedding_infer,
        k::embedding_eval, L::Gather(GatherForm { table: 0, index: 1, dim: None }),
    );
    b.kernel(
        "cat",
        Functional,
        &["cat(Tensor[] tensors, int dim=0) -> Tensor"],
        k::cat_infer,
        k::cat_eval,
        L::Map(E::Join { stack: false }),
    );
    b.kernel(
        "stack",
        Functional,
        &["stack(Tensor[] tensors, int dim=0) -> Tensor"],
        k::stack_infer,
        k::stack_eval,
        L::Map(E::Join { stack: true }),
    );
    for (name, eval, upper) in [
        ("tril", k::tril_eval as EvalFn, false),
        ("triu", k::triu_eval, true),
    ] {
        b.with_inplace(
            name,
            Functional,
            &[&format!("{name}(Tensor self, int diagonal=0) -> Tensor")],
            Rule::Kernel {
                infer: k::triangle_infer,
                eval,
            },
            L::Map(E::Triangle { upper }),
        );
    }
    b.kernel(
        "_to_copy",
        Functional,
        &["_to_copy(Tensor self, *, ScalarType? dtype=None) -> Tensor"],
        k::to_copy_infer,
        k::to_copy_eval,
        L::Map(E::Cast),
    );
    b.kernel(
        "baddbmm",
        Functional,
        &["baddbmm(Tensor self, Tensor batch1, Tensor batch2, *, Scalar beta=1, Scalar alpha=1) -> Tensor"],
        k::baddbmm_infer,
        k::baddbmm_eval, L::MatMul(ProductForm { left: 1, right: 2, addend: Some(0), linear: false, batched: true }),
    );
    b.kernel(
        "flip",
        Functional,
        &["flip(Tensor self, int[] dims) -> Tensor"],
        k::flip_infer,
        k::flip_eval,
        L::Map(E::Remap(RemapKind::Flip)),
    );
    b.kernel(
        "repeat",
        Functional,
        &["repeat(Tensor self, SymInt[] repeats) -> Tensor"],
        k::repeat_infer,
        k::repeat_eval,
        L::Map(E::Remap(RemapKind::Repeat)),
    );
    b.kernel(
        "constant_pad_nd",
        Functional,
        &["constant_pad_nd(Tensor self, SymInt[] pad, Scalar value=0) -> Tensor"],
        k::pad_infer,
        k::pad_eval,
        L::Map(E::Remap(RemapKind::Pad)),
    );
    b.kernel(
        "scaled_dot_product_attention",
        Functional,
        &["scaled_dot_product_attention(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None, float dropout_p=0.0, bool is_causal=False, *, float? scale=None, bool enable_gqa=False) -> Tensor"],
        k::sdpa_infer,
        k::sdpa_eval, L::Attention,
    );
    b.kernel(
        "index_select",
        Functional,
        &["index_select(Tensor self, int dim, Tensor index) -> Tensor"],
        k::index_select_infer,
        k::index_select_eval,
        L::Gather(GatherForm {
            table: 0,
            index: 2,
            dim: Some(1),
        }),
    );

    // Data-dependent selection.
    use select as sel;
    b.kernel(
        "index",
        Functional,
        &["index.Tensor(Tensor self, Tensor?[] indices) -> Tensor"],
        k::index_infer,
        k::index_eval,
        L::Map(E::Index),
    );
    b.kernel(
        "gather",
        Functional,
        &["gather(Tensor self, int dim, Tensor index, *, bool sparse_grad=False) -> Tensor"],
        sel::gather_infer,
        sel::gather_eval,
        L::Map(E::GatherAlong { index: 2, dim: 1 }),
    );
    b.kernel(
        "take_along_dim",
        Functional,
        &["take_along_dim(Tensor self, Tensor indices, int? dim=None) -> Tensor"],
        sel::take_along_dim_infer,
        sel::take_along_dim_eval,
        L::Map(E::GatherAlong { index: 1, dim: 2 }),
    );
    let id = b.with_inplace(
        "scatter",
        Functional,
        &[
            "scatter.src(Tensor self, int dim, Tensor index, Tensor src) -> Tensor",
            "scatter.value(Tensor self, int dim, Tensor index, Scalar value) -> Tensor",
        ],
        Rule::Kernel {
            infer: sel::scatter_infer,
            eval: sel::scatter_eval,
        },
        L::Map(E::ScatterInto {
            add: false,
            copy: false,
        }),
    );
    // Reads its index and source anywhere.
    b.gathers(id);
    let id = b.with_inplace(
        "scatter_add",
        Functional,
        &["scatter_add(Tensor self, int dim, Tensor index, Tensor src) -> Tensor"],
        Rule::Kernel {
            infer: sel::scatter_infer,
            eval: sel::scatter_add_eval,
        },
        L::Map(E::ScatterInto {
            add: true,
            copy: false,
        }),
    );
    // Reads its index and source anywhere.
    b.gathers(id);
    let id = b.with_inplace(
        "index_copy",
        Functional,
        &["index_copy(Tensor self, int dim, Tensor index, Tensor source) -> Tensor"],
        Rule::Kernel {
            infer: sel::index_copy_infer,
            eval: sel::index_copy_eval,
        },
        L::Map(E::ScatterInto {
            add: false,
            copy: true,
        }),
    );
    // Reads its index and source anywhere.
    b.gathers(id);
    for (name, eval, high) in [
        ("argmax", sel::argmax_eval as EvalFn, true),
        ("argmin", sel::argmin_eval, false),
    ] {
        b.kernel(
            name,
            Functional,
            &[&format!(
                "{name}(Tensor self, int? dim=None, bool keepdim=False) -> Tensor"
            )],
            sel::argmax_infer,
            eval,
            L::Extreme {
                high,
                index_only: true,
            },
        );
    }
    for (name, eval, high) in [
        ("max", sel::max_eval as EvalFn, true),
        ("min", sel::min_eval, false),
    ] {
        b.kernel(
            name,
            Functional,
            &[
                &format!("{name}(Tensor self) -> Tensor"),
                &format!("{name}.dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values, Tensor indices)"),
            ],
            sel::max_infer,
            eval,
            L::Extreme {
                high,
                index_only: false,
            },
        );
    }
    b.kernel(
        "sort",
        Functional,
        &["sort(Tensor self, int dim=-1, bool descending=False) -> (Tensor values, Tensor indices)"],
        sel::sort_infer,
        sel::sort_eval, L::Sort { topk: false },
    );
    b.kernel(
        "topk",
        Functional,
        &["topk(Tensor self, SymInt k, int dim=-1, bool largest=True, bool sorted=True) -> (Tensor values, Tensor indices)"],
        sel::topk_infer,
        sel::topk_eval, L::Sort { topk: true },
    );

    // Functional ops no declaration gave a kernel say so.
    for o in &mut b.ops {
        if o.lowering == L::None && matches!(o.kind, Functional | Factory) {
            o.lowering = L::NoKernel;
        }
    }
    for o in &mut b.ops {
        o.rules = Rules {
            vjp: derivatives::vjp_rule(&o.name),
            jvp: derivatives::jvp_rule(&o.name),
            batch: batching::rule(&o.name),
        };
    }
    let by_name = b
        .ops
        .iter()
        .enumerate()
        .map(|(i, o)| (o.name.clone(), OpId(i as u16)))
        .collect();
    Table {
        ops: b.ops,
        by_name,
    }
}

/// Picks the first overload whose schema binds `args`.
pub fn bind<V: Clone>(id: OpId, args: &[Arg<V>]) -> Result<(usize, Vec<Arg<V>>), String> {
    let def = op(id);
    for (i, s) in def.schemas.iter().enumerate() {
        if s.accepts(args) {
            if let Ok(b) = s.bind(args) {
                return Ok((i, b));
            }
        }
    }
    // Every overload refused: say why each did.
    let errors: Vec<String> = def
        .schemas
        .iter()
        .filter_map(|s| s.bind(args).err().map(|e| format!("  {}: {e}", s.text)))
        .collect();
    Err(format!(
        "no overload of {} accepts these arguments:\n{}",
        def.name,
        errors.join("\n")
    ))
}

/// Result metas of a bound call.
pub fn infer(id: OpId, args: &[Arg<&Meta>]) -> Result<Metas, String> {
    let def = op(id);
    match &def.rule {
        Rule::View(f) => f(args),
        Rule::ViewOrCopy(f) => Ok(smallvec::smallvec![f(args)?.0]),
        Rule::Pointwise(plan) => Ok(smallvec::smallvec![plan(args)?.out_meta(args)?]),
        Rule::ViewCopy(v) => Ok(infer(*v, args)?
            .into_iter()
            .map(|m| Meta::contiguous(m.dtype, m.sizes))
            .collect()),
        Rule::Scatter(view) => kernels::scatter_infer(args, *view),
        Rule::InPlace(f) => {
            let this = args.first().and_then(|a| {
                if let Arg::Tensor(t) = a {
                    Some(*t)
                } else {
                    None
                }
            });
            let this = this.ok_or("internal error: in-place op without a tensor self")?;
            // Only the functional result's shape and dtype matter: an
            // elementwise op's layout (TensorIterator's) is not worked out.
            let (sizes, dtype) = match &op(*f).rule {
                Rule::Pointwise(plan) => {
                    let p = plan(args)?;
                    (p.out_shape(args)?, p.out_dtype)
                }
                _ => {
                    let m = infer(*f, args)?.into_iter().next();
                    let m = m.ok_or("internal error: a functional op without a result")?;
                    (m.sizes, m.dtype)
                }
            };
            if sizes != this.sizes {
                return Err(format!(
                    "output with shape {} doesn't match the broadcast shape {}",
                    crate::meta::ShapeFmt(&this.sizes),
                    crate::meta::ShapeFmt(&sizes)
                ));
            }
            if !dtype.can_cast_to(this.dtype) {
                return Err(format!(
                    "result type {} can't be cast to the desired output type {}",
                    dtype, this.dtype
                ));
            }
            if !def.overlap_ok && this.has_internal_overlap() {
                return Err(
                    "unsupported operation: more than one element of the written-to tensor refers to a single memory \
                     location. Please clone() the tensor before performing the operation."
                        .into(),
                );
            }
            Ok(smallvec::smallvec![this.clone()])
        }
        Rule::Kernel { infer, .. } => infer(args),
        Rule::Custom => match &def.custom {
            Some(f) => f.infer(args).map(Metas::from_vec),
            None => Err(format!(
                "internal error: {} has no implementation",
                def.name
            )),
        },
    }
}

pub const HAZARD_MESSAGE: &str =
    "unsupported operation: some elements of the input tensor and the written-to tensor \
     refer to a single memory location. Please clone() the tensor before performing the operation.";

/// Does the in-place form of `functional` read its tensor operands by
/// gathering (anywhere) rather than position by position?
pub fn reads_gathered(functional: OpId) -> bool {
    functional.def().gathers
}

/// Is writing through `this` while reading `other` (same storage)
/// refused? Eager refuses partial overlap (`partially_overlaps`); beyond
/// eager, Kiln refuses what would depend on the order elements are
/// visited: positional operands (broadcast against `this`) may read a
/// written element only at the position that writes it; gathered ones may
/// not overlap at all.
pub fn write_hazard(this: &Meta, other: &Meta, gathered: bool) -> bool {
    if this.partially_overlaps(other) {
        return true;
    }
    let written: HashMap<usize, usize> = this.offsets().enumerate().map(|(i, o)| (o, i)).collect();
    if gathered {
        return other.offsets().any(|o| written.contains_key(&o));
    }
    let st = crate::meta::broadcast_strides(other, &this.sizes);
    crate::meta::OffsetIter::new(&this.sizes, &st, other.offset)
        .enumerate()
        .any(|(i, o)| written.get(&o).is_some_and(|&j| j != i))
}

#[cfg(test)]
mod tests {
    /// The table's schemas are parsed on first use: parse them all here,
    /// each listed under its own op.
    #[test]
    fn every_schema_parses() {
        for def in &super::TABLE.ops {
            assert!(!def.schemas.is_empty(), "{} has no schema", def.name);
            for s in def.schemas.iter() {
                assert_eq!(
                    s.name, def.name,
                    "schema {} listed under {}",
                    s.text, def.name
                );
            }
        }
    }
}
