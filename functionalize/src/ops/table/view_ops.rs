//! Views, each with its `<view>_copy`, and the scatters that are their inverses.

use super::*;

pub(super) fn declare(b: &mut Builder) {
    // Views (each gets a `<name>_copy`).
    b.view(
        "view",
        false,
        &["view(Tensor(a) self, SymInt[] size) -> Tensor(a)"],
        views::view,
        Some(Inverse::Reshape),
    )
    .copy_rules(d::written_back, d::jvp_linear, bt::view);
    let reshape = b
        .add(
            "reshape",
            ViewOrCopy,
            &["reshape(Tensor(a) self, SymInt[] shape) -> Tensor(a)"],
            Rule::ViewOrCopy(views::reshape),
        )
        .inverse(Inverse::Reshape)
        .id();
    // ATen has no `reshape_copy`: a functional program's values are
    // contiguous, where `view_copy` is the same thing.
    let view_copy = b.find("view_copy");
    b.ops[reshape.0 as usize].counterpart = Some(view_copy);
    // ATen's always-copying reshape.
    b.add(
        "_reshape_copy",
        Functional,
        &["_reshape_copy(Tensor self, SymInt[] size) -> Tensor"],
        Rule::ViewCopy(reshape),
    )
    .rules(d::written_back, d::jvp_linear, bt::view);
    b.view(
        "slice",
        false,
        &["slice.Tensor(Tensor(a) self, int dim=0, SymInt? start=None, SymInt? end=None, SymInt step=1) -> Tensor(a)"],
        views::slice,
        None, // `slice_scatter`, below
    ).copy_rules(d::written_back, d::jvp_linear, bt::dim1);
    b.view(
        "select",
        false,
        &["select.int(Tensor(a) self, int dim, SymInt index) -> Tensor(a)"],
        views::select,
        None, // `select_scatter`, below
    )
    .copy_rules(d::written_back, d::jvp_linear, bt::dim1);
    b.view(
        "transpose",
        false,
        &["transpose.int(Tensor(a) self, int dim0, int dim1) -> Tensor(a)"],
        views::transpose,
        Some(Inverse::Involution),
    )
    .copy_rules(d::written_back, d::jvp_linear, bt::dims12);
    b.view(
        "t",
        false,
        &["t(Tensor(a) self) -> Tensor(a)"],
        views::t,
        Some(Inverse::Involution),
    )
    .copy_rules(d::written_back, d::jvp_linear, bt::t_copy);
    b.view(
        "permute",
        false,
        &["permute(Tensor(a) self, int[] dims) -> Tensor(a)"],
        views::permute,
        Some(Inverse::Permute),
    )
    .copy_rules(d::written_back, d::jvp_linear, bt::permute);
    b.view(
        "expand",
        false,
        &["expand(Tensor(a) self, SymInt[] size, *, bool implicit=False) -> Tensor(a)"],
        views::expand,
        None,
    )
    .copy_rules(d::identity, d::jvp_linear, bt::expand);
    b.view(
        "diagonal",
        false,
        &["diagonal(Tensor(a) self, int offset=0, int dim1=0, int dim2=1) -> Tensor(a)"],
        views::diagonal,
        None, // `diagonal_scatter`, below
    )
    .copy_rules(d::written_back, d::jvp_linear, bt::dims23);
    b.view(
        "as_strided",
        false,
        &["as_strided(Tensor(a) self, SymInt[] size, SymInt[] stride, SymInt? storage_offset=None) -> Tensor(a)"],
        views::as_strided,
        Some(Inverse::AsStrided),
    ).copy_rules(d::gathered_copy, d::jvp_linear, bt::per_element);
    b.view(
        "unsqueeze",
        false,
        &["unsqueeze(Tensor(a) self, int dim) -> Tensor(a)"],
        views::unsqueeze,
        Some(Inverse::Unsqueeze),
    )
    .copy_rules(d::written_back, d::jvp_linear, bt::unsqueeze);
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
    )
    .copy_rules(d::written_back, d::jvp_linear, bt::squeeze);
    b.view(
        "alias",
        false,
        &["alias(Tensor(a) self) -> Tensor(a)"],
        views::alias,
        Some(Inverse::Identity),
    )
    .copy_rules(d::identity, d::jvp_linear, bt::elementwise);
    b.view(
        "narrow",
        false,
        &["narrow(Tensor(a) self, int dim, SymInt start, SymInt length) -> Tensor(a)"],
        views::narrow,
        Some(Inverse::Narrow),
    )
    .copy_rules(d::written_back, d::jvp_linear, bt::dim1);
    b.view(
        "unfold",
        false,
        &["unfold(Tensor(a) self, int dimension, int size, int step) -> Tensor(a)"],
        views::unfold,
        None,
    )
    .copy_rules(d::gathered_copy, d::jvp_linear, bt::dim1);
    b.view(
        "split",
        true,
        &[
            "split.Tensor(Tensor(a -> *) self, SymInt split_size, int dim=0) -> Tensor(a)[]",
            "split.sizes(Tensor(a -> *) self, SymInt[] split_size, int dim=0) -> Tensor(a)[]",
        ],
        views::split,
        Some(Inverse::Piece),
    )
    .copy_rules(d::pieces_copy, d::jvp_linear, bt::dim2);
    b.view(
        "split_with_sizes",
        true,
        &["split_with_sizes(Tensor(a -> *) self, SymInt[] split_sizes, int dim=0) -> Tensor(a)[]"],
        views::split,
        Some(Inverse::Piece),
    )
    .copy_rules(d::pieces_copy, d::jvp_linear, bt::dim2);
    // ATen has no `chunk_copy`: functional programs spell a chunk's
    // pieces with `split_copy` / `split_with_sizes_copy` (the pass).
    b.add(
        "chunk",
        MultiView,
        &["chunk(Tensor(a -> *) self, int chunks, int dim=0) -> Tensor(a)[]"],
        Rule::View(views::chunk),
    )
    .inverse(Inverse::Piece);
    b.view(
        "unbind",
        true,
        &["unbind.int(Tensor(a -> *) self, int dim=0) -> Tensor(a)[]"],
        views::unbind,
        Some(Inverse::Unbind),
    )
    .copy_rules(d::pieces_copy, d::jvp_linear, bt::dim1);
    b.add(
        "contiguous",
        ViewOrCopy,
        &["contiguous(Tensor(a) self) -> Tensor(a)"],
        Rule::ViewOrCopy(views::contiguous),
    )
    .inverse(Inverse::Identity);

    // Scatters: the inverse of a view, writing `src` through it.
    b.scatter(
        "slice_scatter",
        "slice_scatter(Tensor self, Tensor src, int dim=0, SymInt? start=None, SymInt? end=None, SymInt step=1) -> Tensor",
        views::slice,
        Some(RegionKind::Slice),
    ).rules(d::scatter_view, d::jvp_linear, bt::region_scatter);
    b.scatter(
        "select_scatter",
        "select_scatter(Tensor self, Tensor src, int dim, SymInt index) -> Tensor",
        views::select,
        Some(RegionKind::Select),
    )
    .rules(d::scatter_view, d::jvp_linear, bt::region_scatter);
    b.scatter(
        "diagonal_scatter",
        "diagonal_scatter(Tensor self, Tensor src, int offset=0, int dim1=0, int dim2=1) -> Tensor",
        views::diagonal,
        Some(RegionKind::Diagonal),
    )
    .rules(d::scatter_view, d::jvp_linear, bt::region_scatter);
    b.scatter(
        "as_strided_scatter",
        "as_strided_scatter(Tensor self, Tensor src, SymInt[] size, SymInt[] stride, SymInt? storage_offset=None) -> Tensor",
        views::as_strided,
        None,
    ).rules(d::scatter_view, d::jvp_linear, bt::per_element);
    // Metadata changed in place (after the scatters: they set inverses).
    for (name, base, schemas) in [
        ("transpose_", "transpose", &["transpose_(Tensor(a!) self, int dim0, int dim1) -> Tensor(a!)"][..]),
        ("swapdims_", "transpose", &["swapdims_(Tensor(a!) self, int dim0, int dim1) -> Tensor(a!)"]),
        ("swapaxes_", "transpose", &["swapaxes_(Tensor(a!) self, int axis0, int axis1) -> Tensor(a!)"]),
        ("t_", "t", &["t_(Tensor(a!) self) -> Tensor(a!)"]),
        ("unsqueeze_", "unsqueeze", &["unsqueeze_(Tensor(a!) self, int dim) -> Tensor(a!)"]),
        (
            "squeeze_",
            "squeeze",
            &[
                "squeeze_(Tensor(a!) self) -> Tensor(a!)",
                "squeeze_.dim(Tensor(a!) self, int dim) -> Tensor(a!)",
                "squeeze_.dims(Tensor(a!) self, int[] dim) -> Tensor(a!)",
            ],
        ),
        (
            "as_strided_",
            "as_strided",
            &["as_strided_(Tensor(a!) self, SymInt[] size, SymInt[] stride, SymInt? storage_offset=None) -> Tensor(a!)"],
        ),
    ] {
        b.view_in_place(name, base, schemas);
    }
    // Eager grows the storage with uninitialized elements; Kiln's are 0.
    let resize = b
        .add(
            "resize_",
            View,
            &["resize_(Tensor(a!) self, SymInt[] size) -> Tensor(a!)"],
            Rule::View(views::resize),
        )
        .id();
    b.ops[resize.0 as usize].metadata = Some(super::super::Metadata::Resize);
}
