//! Reductions, running sums and softmaxes (and `index_add`).

use super::*;

pub(super) fn declare(b: &mut Builder) {
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
    ).rules(d::sum, d::jvp_linear, bt::reduction);
    b.kernel(
        "mean",
        Functional,
        &[
            "mean(Tensor self, *, ScalarType? dtype=None) -> Tensor",
            "mean.dim(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor",
        ],
        k::mean_infer,
        k::mean_eval, L::Reduce(Reduction::Mean),
    ).rules(d::sum, d::jvp_linear, bt::reduction);
    for (name, eval, sqrt) in [
        ("var", k::var_eval as EvalFn, false),
        ("std", k::std_eval, true),
    ] {
        b.kernel(
            name,
            Functional,
            // `.dim`'s `unbiased` sits where `.correction`'s correction
            // does, and reads as it (true: 1, false: 0).
            &[
                &format!("{name}.correction(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False) -> Tensor"),
                &format!("{name}.dim(Tensor self, int[1]? dim, bool unbiased=True, bool keepdim=False) -> Tensor"),
            ],
            k::var_infer,
            eval,
            L::Reduce(Reduction::Var { sqrt }),
        )
        .rules(d::var, d::jvp_var, bt::reduction);
    }
    // Reads its index and source anywhere.
    b.with_inplace(
        "index_add",
        Functional,
        &["index_add(Tensor self, int dim, Tensor index, Tensor source, *, Scalar alpha=1) -> Tensor"],
        Rule::Kernel {
            infer: k::index_add_infer,
            eval: k::index_add_eval,
        }, L::Map(E::IndexAdd),
    ).rules(d::index_add, d::jvp_linear, bt::indexed_dim)
        .gathers();
    b.kernel(
        "cumsum",
        Functional,
        &["cumsum(Tensor self, int dim, *, ScalarType? dtype=None) -> Tensor"],
        k::cumsum_infer,
        k::cumsum_eval,
        L::Scan,
    )
    .rules(d::cumsum, d::jvp_linear, bt::dim1);
    b.kernel(
        "amax",
        Functional,
        &["amax(Tensor self, int[1] dim=[], bool keepdim=False) -> Tensor"],
        k::amax_infer,
        k::amax_eval,
        L::Reduce(Reduction::Amax),
    )
    .rules(d::amax, d::jvp_amax, bt::reduction);
    b.kernel(
        "amin",
        Functional,
        &["amin(Tensor self, int[1] dim=[], bool keepdim=False) -> Tensor"],
        k::amax_infer,
        k::amin_eval,
        L::Reduce(Reduction::Amin),
    )
    .rules(d::amax, d::jvp_amax, bt::reduction);
    b.kernel(
        "prod",
        Functional,
        &[
            "prod(Tensor self, *, ScalarType? dtype=None) -> Tensor",
            "prod.dim_int(Tensor self, int dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor",
        ],
        k::prod_infer,
        k::prod_eval,
        L::Reduce(Reduction::Prod),
    )
    .rules(d::prod, d::jvp_prod, bt::prod);
    b.kernel(
        "softmax",
        Functional,
        &["softmax.int(Tensor self, int dim, ScalarType? dtype=None) -> Tensor"],
        k::softmax_infer,
        k::softmax_eval,
        L::Softmax { log: false },
    )
    .rules(d::softmax, d::jvp_softmax, bt::dim1);
    b.kernel(
        "log_softmax",
        Functional,
        &["log_softmax.int(Tensor self, int dim, ScalarType? dtype=None) -> Tensor"],
        k::softmax_infer,
        k::log_softmax_eval,
        L::Softmax { log: true },
    )
    .rules(d::log_softmax, d::jvp_softmax, bt::dim1);
    b.kernel(
        "_softmax",
        Functional,
        &["_softmax(Tensor self, int dim, bool half_to_float) -> Tensor"],
        k::softmax_infer,
        k::softmax_eval,
        L::Softmax { log: false },
    )
    .rules(d::softmax, d::jvp_softmax, bt::dim1);
    b.kernel(
        "_log_softmax",
        Functional,
        &["_log_softmax(Tensor self, int dim, bool half_to_float) -> Tensor"],
        k::softmax_infer,
        k::log_softmax_eval,
        L::Softmax { log: true },
    )
    .rules(d::log_softmax, d::jvp_softmax, bt::dim1);
}
