//! How a compiler lowers an op onto kernels, declared in each op's entry
//! (no GPU dependency: the classes say what a code generator needs to know
//! of the op, not how it does it). Code generators match on these typed
//! forms, never on op names: an op's lowering is read from its entry.

use super::OpId;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lowering {
    /// Not lowered directly: views and in-place ops (functionalize first).
    None,
    /// A functional op no GPU kernel computes yet: compiling it fails
    /// naming the op.
    NoKernel,
    /// A composite: functionalization replaces it by its parts.
    Composite,
    /// Element `i` of the result is an expression of the inputs at
    /// computed indices: inlined into consumers.
    Map(Elem),
    /// A map that costs no memory traffic to recompute (index maps of view
    /// copies, factories, fills): inlined into every consumer.
    Free(Elem),
    /// `<view>_scatter` of a region view: a predicated map, or in place.
    RegionScatter {
        view: OpId,
        region: RegionKind,
    },
    /// `as_strided_scatter`: a copy, then the view's elements written.
    StridedScatter(OpId),
    Reduce(Reduction),
    Softmax {
        log: bool,
    },
    LayerNorm,
    /// A (batched) matrix product, with its operands' positions.
    MatMul(ProductForm),
    /// `softmax(q k^T * scale + bias) v` in one kernel.
    Attention,
    /// Running sums along a dimension: a line per invocation.
    Scan,
    IndexPut,
    /// The extreme of each line and its index (`argmax`, `max.dim`): an
    /// output element per invocation. `high`: the maximum; `index_only`:
    /// the only result is the index (`argmax`).
    Extreme {
        high: bool,
        index_only: bool,
    },
    /// Sorting lines (`sort`, `topk`): each element's rank in its line.
    Sort {
        topk: bool,
    },
    /// A custom function's own kernel.
    Custom,
}

/// What element `i` of a map's result is, given its inputs (`Lowering::Map`
/// and `Lowering::Free`). Each form also fixes which inputs the element
/// reads and where (the index maps the scheduler fuses by).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    /// The plan's scalar code over its operands, broadcast (`Rule::Pointwise`).
    Pointwise,
    /// The view's index map into its input (`Rule::ViewCopy`).
    ViewCopy,
    /// The input at `i` (`clone`).
    Same,
    /// The input at `i`, converted to the result's dtype (`_to_copy`).
    Cast,
    /// The input, or zero outside the triangle (`tril`, `triu`).
    Triangle { upper: bool },
    /// Each input fills a region of the result: a slice along `dim`
    /// (`cat`), one index of a new `dim` (`stack`).
    Join { stack: bool },
    /// The input at the multi-index `kernels::Remap` gives (`flip`,
    /// `repeat`, `constant_pad_nd`: the pad value outside the input).
    Remap(RemapKind),
    /// `self` plus the source rows whose index names this row.
    IndexAdd,
    /// Advanced indexing (`index.Tensor`).
    Index,
    /// `self` along `dim` at the index tensor's value here; `index` and
    /// `dim` are argument positions (`gather`, `take_along_dim`).
    GatherAlong { index: usize, dim: usize },
    /// `self` with position `p` along `dim` taken from `index[p]`
    /// (`index_select`'s 1-d index; `embedding`: `dim` absent, rows of the
    /// table for every element of an index of any shape, flattened);
    /// argument positions. Inline, so chained selections (upsampling's, per
    /// dimension) are one kernel, and a lookup is read where it is used (a
    /// transformer's embeddings summed and normalized in one kernel).
    IndexSelect { index: usize, dim: Option<usize> },
    /// `self`, then every source element whose index names this position
    /// (the last wins): `scatter`, `scatter_add` (`add`), `index_copy`
    /// (`copy`: a whole-slice index).
    ScatterInto { add: bool, copy: bool },
    /// `copy(self, src)`: `src` broadcast, converted to `self`'s dtype.
    CopyFrom,
    /// A value at argument `value` (a scalar or a 0-d tensor), everywhere
    /// (`fill`, `full`, `full_like`).
    Fill { value: usize },
    /// `self`, or the value at argument 2 where the mask holds.
    MaskedFill,
    /// Zero or one everywhere (`zeros`, `ones_like`, `zero`).
    Constant { one: bool },
    /// `start + step * i`.
    Arange,
}

impl Elem {
    /// Does element `i` read each input of the result's shape at `i`
    /// (rather than elsewhere: a flip, a pad, a join)? Only such maps can
    /// follow a kernel as its epilogue, element by element.
    pub fn reads_in_place(self) -> bool {
        matches!(
            self,
            Elem::Pointwise
                | Elem::Same
                | Elem::Cast
                | Elem::Triangle { .. }
                | Elem::MaskedFill
                | Elem::CopyFrom
        )
    }
}

/// How a `Remap` finds the input element of a result element.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemapKind {
    /// `flip(self, dims)`.
    Flip,
    /// `repeat(self, repeats)`: the input tiled.
    Repeat,
    /// `constant_pad_nd(self, pad, value)`.
    Pad,
}

/// Which region of its result a `RegionScatter` writes `src` into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegionKind {
    /// `slice_scatter(self, src, dim, start, end, step)`.
    Slice,
    /// `select_scatter(self, src, dim, index)`.
    Select,
    /// `diagonal_scatter(self, src, offset, dim1, dim2)`.
    Diagonal,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reduction {
    Sum,
    Mean,
    Amax,
    Amin,
    /// `prod` (over one dimension or all).
    Prod,
    /// `var.correction`, `std.correction` (`sqrt`: the square root).
    Var {
        sqrt: bool,
    },
}

/// Where a matrix op (`Lowering::MatMul`) keeps its operands: `left @
/// right`, plus an addend (`addmm`/`baddbmm`'s self, `linear`'s bias);
/// `linear`'s right operand is a weight stored transposed; `batched`
/// products (`bmm`, `matmul`) may be the two products of an attention.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProductForm {
    pub left: usize,
    pub right: usize,
    pub addend: Option<usize>,
    pub linear: bool,
    pub batched: bool,
}

impl ProductForm {
    /// `left @ right`, nothing added.
    pub const fn plain(batched: bool) -> ProductForm {
        ProductForm {
            left: 0,
            right: 1,
            addend: None,
            linear: false,
            batched,
        }
    }
}

impl Lowering {
    /// The view op a scatter writes through.
    pub fn scatter_view(self) -> Option<OpId> {
        match self {
            Lowering::RegionScatter { view, .. } | Lowering::StridedScatter(view) => Some(view),
            _ => None,
        }
    }

    /// Inlined into consumers (rather than a kernel of its own).
    pub fn is_map(self) -> bool {
        matches!(
            self,
            Lowering::Map(_) | Lowering::Free(_) | Lowering::RegionScatter { .. }
        )
    }

    /// Free to recompute in every consumer.
    pub fn is_free(self) -> bool {
        matches!(self, Lowering::Free(_))
    }

    /// A map that is neither free nor a scatter.
    pub fn is_plain_map(self) -> bool {
        matches!(self, Lowering::Map(_))
    }

    /// The element form of a map.
    pub fn elem(self) -> Option<Elem> {
        match self {
            Lowering::Map(e) | Lowering::Free(e) => Some(e),
            _ => None,
        }
    }

    /// The operand positions of a matrix product.
    pub fn product(self) -> Option<ProductForm> {
        match self {
            Lowering::MatMul(f) => Some(f),
            _ => None,
        }
    }

    /// Its class, as `kiln ops` lists it.
    pub fn class_name(self) -> &'static str {
        match self {
            Lowering::None => "-",
            Lowering::NoKernel => "none yet",
            Lowering::Composite => "its parts",
            Lowering::Map(_) => "map",
            Lowering::Free(_) => "free map",
            Lowering::RegionScatter { .. } => "region scatter",
            Lowering::StridedScatter(_) => "strided scatter",
            Lowering::Reduce(_) => "reduction",
            Lowering::Softmax { .. } => "softmax",
            Lowering::LayerNorm => "layer norm",
            Lowering::MatMul(_) => "matrix product",
            Lowering::Attention => "attention",
            Lowering::Scan => "scan",
            Lowering::IndexPut => "index put",
            Lowering::Extreme { .. } => "extreme",
            Lowering::Sort { .. } => "sort",
            Lowering::Custom => "custom",
        }
    }
}
