//! Data-dependent selection: gathers, scatters, indexing, extremes and sorting.

use super::*;

pub(super) fn declare(b: &mut Builder) {
    // Data-dependent selection.
    b.kernel(
        "index",
        Functional,
        &["index.Tensor(Tensor self, Tensor?[] indices) -> Tensor"],
        k::index_infer,
        k::index_eval,
        L::Map(E::Index),
    )
    .rules(d::index, d::jvp_linear, bt::index);
    b.kernel(
        "gather",
        Functional,
        &["gather(Tensor self, int dim, Tensor index, *, bool sparse_grad=False) -> Tensor"],
        sel::gather_infer,
        sel::gather_eval,
        L::Map(E::GatherAlong { index: 2, dim: 1 }),
    )
    .rules(d::gather, d::jvp_linear, bt::gather_like);
    b.kernel(
        "take_along_dim",
        Functional,
        &["take_along_dim(Tensor self, Tensor indices, int? dim=None) -> Tensor"],
        sel::take_along_dim_infer,
        sel::take_along_dim_eval,
        L::Map(E::GatherAlong { index: 1, dim: 2 }),
    )
    .rules(d::take_along_dim, d::jvp_linear, bt::take_along_dim);
    // Reads its index and source anywhere.
    b.with_inplace(
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
    )
    .rules(d::scatter, d::jvp_linear, bt::gather_like)
    .gathers();
    // Reads its index and source anywhere.
    b.with_inplace(
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
    )
    .rules(d::scatter_add, d::jvp_linear, bt::gather_like)
    .gathers();
    // Reads its index and source anywhere.
    b.with_inplace(
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
    )
    .rules(d::index_copy, d::jvp_linear, bt::indexed_dim)
    .gathers();
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
        )
        .rules(d::no_grad, d::jvp_none, bt::arg_extreme);
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
        )
        .rules(d::max_min, d::jvp_amax, bt::max_min);
    }
    b.kernel(
        "sort",
        Functional,
        &["sort(Tensor self, int dim=-1, bool descending=False) -> (Tensor values, Tensor indices)"],
        sel::sort_infer,
        sel::sort_eval, L::Sort { topk: false },
    ).rules(d::select_values, d::jvp_select_values, bt::dim1);
    b.kernel(
        "topk",
        Functional,
        &["topk(Tensor self, SymInt k, int dim=-1, bool largest=True, bool sorted=True) -> (Tensor values, Tensor indices)"],
        sel::topk_infer,
        sel::topk_eval, L::Sort { topk: true },
    ).rules(d::select_values, d::jvp_select_values, bt::dim2);
}
