//! The op table: every op Kiln knows, each declared once (`table/`, by
//! family) with its ATen schemas, kind, shape/dtype rule and reference
//! kernel, lowering class (`lowering`), transform rules (`Rules`: VJP and
//! JVP from `derivatives.rs`, batching from `batching.rs`) and view
//! inverse. In-place forms (`add_`) and view copies (`slice_copy`) are
//! derived from their base entries. The pass, the transforms and the
//! compiler read the entries, never op names; `kiln ops` lists them
//! (`catalog`, `docs/ops.md`).

pub mod args;
pub mod batching;
pub mod catalog;
pub mod composite;
pub mod decomp;
pub mod decomp_math;
pub mod derivatives;
pub mod expr;
pub mod inverse;
pub mod kernels;
pub mod layout;
pub mod lowering;
pub mod pointwise;
pub mod select;
mod table;
pub mod tape;
pub mod views;

pub use lowering::{Elem, Lowering, ProductForm, Reduction, RegionKind, RemapKind};

use crate::meta::{Meta, Metas};
use crate::schema::{Arg, Schema, Schemas};
use crate::tensor::RTensor;
use std::collections::HashMap;
use std::sync::LazyLock;

pub use crate::id::OpId;

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
    /// A custom function (registered by `custom::register`): `OpDef::custom` has its rules.
    Custom,
    /// A decomposition into other ops (`composite`): its shape rule,
    /// reference, lowering and transform rules are the parts'.
    Composite(composite::DecompFn),
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
    pub custom: Option<std::sync::Arc<dyn crate::function::Function>>,
    /// Changes `self`'s metadata in place and returns `self`: front ends
    /// rebind every name of `self` to the result.
    pub metadata: Option<Metadata>,
}

/// How an op changes its `self`'s metadata in place (`OpDef::metadata`);
/// its storage's contents stay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Metadata {
    /// `self` becomes this view of itself (`transpose_`: `transpose`),
    /// bound by the overload of the same index.
    View(OpId),
    /// `resize_`: contiguous with the new sizes over the same storage,
    /// grown when it holds too few elements.
    Resize,
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
    pub vjp: Option<crate::rule::VjpFn>,
    pub jvp: Option<crate::rule::JvpFn>,
    pub batch: Option<crate::rule::BatchFn>,
}

impl OpDef {
    /// An entry with no counterpart, inverse, flags or rules yet.
    pub(crate) fn new(
        name: &str,
        kind: OpKind,
        schemas: Schemas,
        rule: Rule,
        lowering: Lowering,
    ) -> OpDef {
        OpDef {
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
            metadata: None,
        }
    }

    pub fn id(&self) -> OpId {
        lookup(&self.name).expect("every op definition is in the table")
    }
}

pub struct Table {
    pub ops: Vec<OpDef>,
    /// Looked up once per parsed statement: a fast hash.
    by_name: rustc_hash::FxHashMap<String, OpId>,
}

impl Table {
    fn new(ops: Vec<OpDef>) -> Table {
        let by_name = ops
            .iter()
            .enumerate()
            .map(|(i, o)| (o.name.clone(), OpId(i as u16)))
            .collect();
        Table { ops, by_name }
    }
}

pub static TABLE: LazyLock<Table> = LazyLock::new(table::build);

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
pub fn register_custom(f: std::sync::Arc<dyn crate::function::Function>) -> Result<OpId, String> {
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
    let name = schema.name.clone();
    let schemas = Schemas::parsed(vec![schema]);
    let mut def = OpDef::new(
        &name,
        OpKind::Functional,
        schemas,
        Rule::Custom,
        Lowering::Custom,
    );
    def.custom = Some(f);
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
        Rule::Composite(f) => composite::infer(id, *f, args),
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
