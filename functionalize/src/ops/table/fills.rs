//! Copies, fills and factories.

use super::*;

pub(super) fn declare(b: &mut Builder) {
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
    )
    .rules(d::second, d::jvp_diag, bt::elementwise);
    b.with_inplace(
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
    )
    .rules(d::second, d::jvp_linear, bt::elementwise)
    .overlap_ok();
    b.with_inplace(
        "zero",
        Functional,
        &["zero(Tensor self) -> Tensor"],
        Rule::Kernel {
            infer: k::like_self_infer,
            eval: k::zeros_eval,
        },
        L::Free(E::Constant { one: false }),
    )
    .rules(d::no_grad, d::jvp_none, bt::elementwise)
    .overlap_ok();
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
    )
    .rules(d::masked_fill, d::jvp_linear, bt::elementwise);
    // Reads its index and source anywhere.
    b.with_inplace(
        "index_put",
        Functional,
        &["index_put(Tensor self, Tensor?[] indices, Tensor values, bool accumulate=False) -> Tensor"],
        Rule::Kernel { infer: k::index_put_infer, eval: k::index_put_eval }, L::IndexPut,
    ).rules(d::index_put, d::jvp_linear, bt::per_element)
        .gathers();

    // Factories and copies.
    b.kernel(
        "zeros",
        Factory,
        &["zeros(SymInt[] size, *, ScalarType? dtype=None) -> Tensor"],
        k::zeros_infer,
        k::zeros_eval,
        L::Free(E::Constant { one: false }),
    )
    .vjp(d::no_grad)
    .jvp(d::jvp_none);
    b.kernel(
        "ones",
        Factory,
        &["ones(SymInt[] size, *, ScalarType? dtype=None) -> Tensor"],
        k::zeros_infer,
        k::ones_eval,
        L::Free(E::Constant { one: true }),
    )
    .vjp(d::no_grad)
    .jvp(d::jvp_none);
    b.kernel(
        "full",
        Factory,
        &["full(SymInt[] size, Scalar fill_value, *, ScalarType? dtype=None) -> Tensor"],
        k::full_infer,
        k::full_eval,
        L::Free(E::Fill { value: 1 }),
    )
    .vjp(d::no_grad)
    .jvp(d::jvp_none);
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
    ).vjp(d::no_grad).jvp(d::jvp_none);
    b.kernel(
        "zeros_like",
        Functional,
        &["zeros_like(Tensor self, *, ScalarType? dtype=None) -> Tensor"],
        k::like_infer,
        k::zeros_eval,
        L::Free(E::Constant { one: false }),
    )
    .rules(d::no_grad, d::jvp_none, bt::elementwise);
    b.kernel(
        "ones_like",
        Functional,
        &["ones_like(Tensor self, *, ScalarType? dtype=None) -> Tensor"],
        k::like_infer,
        k::ones_eval,
        L::Free(E::Constant { one: true }),
    )
    .rules(d::no_grad, d::jvp_none, bt::elementwise);
    b.kernel(
        "full_like",
        Functional,
        &["full_like(Tensor self, Scalar fill_value, *, ScalarType? dtype=None) -> Tensor"],
        k::full_like_infer,
        k::full_like_eval,
        L::Free(E::Fill { value: 1 }),
    )
    .rules(d::no_grad, d::jvp_none, bt::elementwise);
    b.kernel(
        "clone",
        Functional,
        &["clone(Tensor self) -> Tensor"],
        k::like_self_infer,
        k::clone_eval,
        L::Map(E::Same),
    )
    .rules(d::identity, d::jvp_linear, bt::elementwise);
}
