//! Matrix products, layers, and maps with index arithmetic (joins, triangles, flips, repeats, padding, conversions).

use super::*;

pub(super) fn declare(b: &mut Builder) {
    // Linear algebra and layers.
    b.kernel(
        "mm",
        Functional,
        &["mm(Tensor self, Tensor mat2) -> Tensor"],
        k::mm_infer,
        k::mm_eval,
        L::MatMul(ProductForm::plain(false)),
    )
    .rules(d::mm, d::jvp_bilinear, bt::matmul);
    b.kernel(
        "bmm",
        Functional,
        &["bmm(Tensor self, Tensor mat2) -> Tensor"],
        k::bmm_infer,
        k::bmm_eval,
        L::MatMul(ProductForm::plain(true)),
    )
    .rules(d::mm, d::jvp_bilinear, bt::matmul);
    b.kernel(
        "matmul",
        Functional,
        &["matmul(Tensor self, Tensor other) -> Tensor"],
        k::matmul_infer,
        k::matmul_eval,
        L::MatMul(ProductForm::plain(true)),
    )
    .rules(d::matmul, d::jvp_bilinear, bt::matmul);
    b.kernel(
        "addmm",
        Functional,
        &["addmm(Tensor self, Tensor mat1, Tensor mat2, *, Scalar beta=1, Scalar alpha=1) -> Tensor"],
        k::addmm_infer,
        k::addmm_eval, L::MatMul(ProductForm { left: 1, right: 2, addend: Some(0), linear: false, batched: false }),
    ).rules(d::addmm, d::jvp_bilinear, bt::addmm);
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
    )
    .rules(d::linear, d::jvp_bilinear, bt::linear);
    b.kernel(
        "layer_norm",
        Functional,
        &["layer_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight=None, Tensor? bias=None, float eps=1e-05, bool cudnn_enable=True) -> Tensor"],
        k::layer_norm_infer,
        k::layer_norm_eval, L::LayerNorm,
    ).rules(d::layer_norm, d::jvp_layer_norm, bt::layer_norm);
    b.kernel(
        "embedding",
        Functional,
        &["embedding(Tensor weight, Tensor indices, SymInt padding_idx=-1, bool scale_grad_by_freq=False, bool sparse=False) -> Tensor"],
        k::embedding_infer,
        k::embedding_eval, L::Map(E::IndexSelect { index: 1, dim: None }),
    ).rules(d::embedding, d::jvp_linear, bt::embedding);
    b.kernel(
        "cat",
        Functional,
        &["cat(Tensor[] tensors, int dim=0) -> Tensor"],
        k::cat_infer,
        k::cat_eval,
        L::Map(E::Join { stack: false }),
    )
    .rules(d::cat, d::jvp_linear, bt::cat);
    b.kernel(
        "stack",
        Functional,
        &["stack(Tensor[] tensors, int dim=0) -> Tensor"],
        k::stack_infer,
        k::stack_eval,
        L::Map(E::Join { stack: true }),
    )
    .rules(d::cat, d::jvp_linear, bt::cat);
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
        )
        .rules(d::same_op_on_grad, d::jvp_linear, bt::leading);
    }
    b.kernel(
        "_to_copy",
        Functional,
        &["_to_copy(Tensor self, *, ScalarType? dtype=None) -> Tensor"],
        k::to_copy_infer,
        k::to_copy_eval,
        L::Map(E::Cast),
    )
    .rules(d::identity, d::jvp_linear, bt::elementwise);
    b.kernel(
        "baddbmm",
        Functional,
        &["baddbmm(Tensor self, Tensor batch1, Tensor batch2, *, Scalar beta=1, Scalar alpha=1) -> Tensor"],
        k::baddbmm_infer,
        k::baddbmm_eval, L::MatMul(ProductForm { left: 1, right: 2, addend: Some(0), linear: false, batched: true }),
    ).rules(d::addmm, d::jvp_bilinear, bt::addmm);
    b.kernel(
        "flip",
        Functional,
        &["flip(Tensor self, int[] dims) -> Tensor"],
        k::flip_infer,
        k::flip_eval,
        L::Map(E::Remap(RemapKind::Flip)),
    )
    .rules(d::same_op_on_grad, d::jvp_linear, bt::list1);
    b.kernel(
        "repeat",
        Functional,
        &["repeat(Tensor self, SymInt[] repeats) -> Tensor"],
        k::repeat_infer,
        k::repeat_eval,
        L::Map(E::Remap(RemapKind::Repeat)),
    )
    .rules(d::repeat, d::jvp_linear, bt::repeat);
    b.kernel(
        "constant_pad_nd",
        Functional,
        &["constant_pad_nd(Tensor self, SymInt[] pad, Scalar value=0) -> Tensor"],
        k::pad_infer,
        k::pad_eval,
        L::Map(E::Remap(RemapKind::Pad)),
    )
    .rules(d::pad, d::jvp_linear, bt::leading);
    b.kernel(
        "scaled_dot_product_attention",
        Functional,
        &["scaled_dot_product_attention(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None, float dropout_p=0.0, bool is_causal=False, *, float? scale=None, bool enable_gqa=False) -> Tensor"],
        k::sdpa_infer,
        k::sdpa_eval, L::Attention,
    ).rules(d::sdpa, d::jvp_sdpa, bt::attention);
    b.kernel(
        "index_select",
        Functional,
        &["index_select(Tensor self, int dim, Tensor index) -> Tensor"],
        k::index_select_infer,
        k::index_select_eval,
        L::Map(E::IndexSelect {
            index: 2,
            dim: Some(1),
        }),
    )
    .rules(d::index_select, d::jvp_linear, bt::indexed_dim);
}
