//! Composite ops: each a decomposition into other ops of the table
//! (`decomp.rs`), as ATen's CompositeImplicitAutograd ops are. Their
//! reference, GPU lowering and transform rules are their parts'.

use super::*;
use crate::ops::decomp as dc;
use crate::ops::decomp_math as dm;

pub(super) fn declare(b: &mut Builder) {
    for (name, conv, f) in [
        (
            "conv1d",
            "SymInt[1]",
            dc::conv1d as super::super::composite::DecompFn,
        ),
        ("conv2d", "SymInt[2]", dc::conv2d),
        ("conv3d", "SymInt[3]", dc::conv3d),
    ] {
        b.composite(
            name,
            &[
                &format!("{name}(Tensor input, Tensor weight, Tensor? bias=None, {conv} stride=1, {conv} padding=0, {conv} dilation=1, SymInt groups=1) -> Tensor"),
                &format!("{name}.padding(Tensor input, Tensor weight, Tensor? bias=None, {conv} stride=1, str padding=\"valid\", {conv} dilation=1, SymInt groups=1) -> Tensor"),
            ],
            f,
            false,
        );
    }
    for (name, conv, f) in [
        (
            "conv_transpose1d",
            "SymInt[1]",
            dc::conv_transpose1d as super::super::composite::DecompFn,
        ),
        ("conv_transpose2d", "SymInt[2]", dc::conv_transpose2d),
        ("conv_transpose3d", "SymInt[3]", dc::conv_transpose3d),
    ] {
        b.composite(
            name,
            &[&format!("{name}.input(Tensor input, Tensor weight, Tensor? bias=None, {conv} stride=1, {conv} padding=0, {conv} output_padding=0, SymInt groups=1, {conv} dilation=1) -> Tensor")],
            f,
            false,
        );
    }
    b.composite(
        "convolution",
        &["convolution(Tensor input, Tensor weight, Tensor? bias, SymInt[] stride, SymInt[] padding, SymInt[] dilation, bool transposed, SymInt[] output_padding, SymInt groups) -> Tensor"],
        dc::convolution,
        false,
    );
    for (name, k, f) in [
        (
            "max_pool1d",
            "int[1]",
            dc::max_pool1d as super::super::composite::DecompFn,
        ),
        ("max_pool2d", "int[2]", dc::max_pool2d),
        ("max_pool3d", "int[3]", dc::max_pool3d),
    ] {
        b.composite(
            name,
            &[&format!("{name}(Tensor self, {k} kernel_size, {k} stride=[], {k} padding=0, {k} dilation=1, bool ceil_mode=False) -> Tensor")],
            f,
            false,
        );
    }
    for (name, k, f) in [
        (
            "max_pool1d_with_indices",
            "int[1]",
            dc::max_pool1d_with_indices as super::super::composite::DecompFn,
        ),
        (
            "max_pool2d_with_indices",
            "int[2]",
            dc::max_pool2d_with_indices,
        ),
        (
            "max_pool3d_with_indices",
            "int[3]",
            dc::max_pool3d_with_indices,
        ),
    ] {
        b.composite(
            name,
            &[&format!("{name}(Tensor self, {k} kernel_size, {k} stride=[], {k} padding=0, {k} dilation=1, bool ceil_mode=False) -> (Tensor, Tensor)")],
            f,
            false,
        );
    }
    b.composite(
        "avg_pool1d",
        &["avg_pool1d(Tensor self, int[1] kernel_size, int[1] stride=[], int[1] padding=0, bool ceil_mode=False, bool count_include_pad=True) -> Tensor"],
        dc::avg_pool1d,
        false,
    );
    for (name, k, f) in [
        (
            "avg_pool2d",
            "int[2]",
            dc::avg_pool2d as super::super::composite::DecompFn,
        ),
        ("avg_pool3d", "int[3]", dc::avg_pool3d),
    ] {
        b.composite(
            name,
            &[&format!("{name}(Tensor self, {k} kernel_size, {k} stride=[], {k} padding=0, bool ceil_mode=False, bool count_include_pad=True, int? divisor_override=None) -> Tensor")],
            f,
            false,
        );
    }
    for (name, k, f) in [
        (
            "adaptive_avg_pool1d",
            "int[1]",
            dc::adaptive_avg_pool1d as super::super::composite::DecompFn,
        ),
        ("adaptive_avg_pool2d", "SymInt[2]", dc::adaptive_avg_pool2d),
        ("_adaptive_avg_pool2d", "SymInt[2]", dc::adaptive_avg_pool2d),
        ("adaptive_avg_pool3d", "SymInt[3]", dc::adaptive_avg_pool3d),
        ("_adaptive_avg_pool3d", "SymInt[3]", dc::adaptive_avg_pool3d),
    ] {
        b.composite(
            name,
            &[&format!("{name}(Tensor self, {k} output_size) -> Tensor")],
            f,
            false,
        );
    }
    b.composite(
        "batch_norm",
        &["batch_norm(Tensor input, Tensor? weight, Tensor? bias, Tensor? running_mean, Tensor? running_var, bool training, float momentum, float eps, bool cudnn_enabled) -> Tensor"],
        dc::batch_norm,
        false,
    );
    b.composite(
        "_native_batch_norm_legit_no_training",
        &["_native_batch_norm_legit_no_training(Tensor input, Tensor? weight, Tensor? bias, Tensor running_mean, Tensor running_var, float momentum, float eps) -> (Tensor, Tensor, Tensor)"],
        dc::native_batch_norm_eval,
        false,
    );
    b.composite(
        "_native_batch_norm_legit",
        &[
            "_native_batch_norm_legit(Tensor input, Tensor? weight, Tensor? bias, Tensor running_mean, Tensor running_var, bool training, float momentum, float eps) -> (Tensor, Tensor, Tensor)",
            "_native_batch_norm_legit.no_stats(Tensor input, Tensor? weight, Tensor? bias, bool training, float momentum, float eps) -> (Tensor, Tensor, Tensor)",
        ],
        dc::native_batch_norm,
        false,
    );
    b.composite(
        "native_layer_norm",
        &["native_layer_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight, Tensor? bias, float eps) -> (Tensor, Tensor, Tensor)"],
        dc::native_layer_norm,
        false,
    );
    b.composite(
        "native_group_norm",
        &["native_group_norm(Tensor input, Tensor? weight, Tensor? bias, SymInt N, SymInt C, SymInt HxW, int group, float eps) -> (Tensor, Tensor, Tensor)"],
        dc::native_group_norm,
        false,
    );
    b.composite(
        "native_dropout",
        &["native_dropout(Tensor input, float p, bool? train) -> (Tensor, Tensor)"],
        dc::native_dropout,
        false,
    );
    for (name, f) in [
        ("any", dc::any as super::super::composite::DecompFn),
        ("all", dc::all),
    ] {
        b.composite(
            name,
            &[
                &format!("{name}(Tensor self) -> Tensor"),
                &format!("{name}.dim(Tensor self, int dim, bool keepdim=False) -> Tensor"),
                &format!("{name}.dims(Tensor self, int[]? dim=None, bool keepdim=False) -> Tensor"),
            ],
            f,
            false,
        );
    }
    b.composite(
        "scalar_tensor",
        &["scalar_tensor(Scalar s, *, ScalarType? dtype=None) -> Tensor"],
        dc::scalar_tensor,
        false,
    );
    b.composite(
        "empty",
        &["empty.memory_format(SymInt[] size, *, ScalarType? dtype=None) -> Tensor"],
        dc::empty,
        false,
    );
    b.composite(
        "empty_strided",
        &["empty_strided(SymInt[] size, SymInt[] stride, *, ScalarType? dtype=None) -> Tensor"],
        dc::empty,
        false,
    );
    b.composite(
        "masked_scatter",
        &["masked_scatter(Tensor self, Tensor mask, Tensor source) -> Tensor"],
        dc::masked_scatter,
        true,
    );
    b.composite(
        "scatter_reduce",
        &["scatter_reduce.two(Tensor self, int dim, Tensor index, Tensor src, str reduce, *, bool include_self=True) -> Tensor"],
        dc::scatter_reduce,
        true,
    );
    b.composite(
        "_cdist_forward",
        &["_cdist_forward(Tensor x1, Tensor x2, float p, int? compute_mode) -> Tensor"],
        dc::cdist,
        false,
    );
    b.composite(
        "cdist",
        &["cdist(Tensor x1, Tensor x2, float p=2, int? compute_mode=None) -> Tensor"],
        dc::cdist,
        false,
    );
    b.composite(
        "_pdist_forward",
        &["_pdist_forward(Tensor self, float p=2) -> Tensor"],
        dc::pdist,
        false,
    );
    b.composite(
        "pdist",
        &["pdist(Tensor self, float p=2) -> Tensor"],
        dc::pdist,
        false,
    );
    for name in ["grid_sampler_2d", "grid_sampler"] {
        b.composite(
            name,
            &[&format!("{name}(Tensor input, Tensor grid, int interpolation_mode, int padding_mode, bool align_corners) -> Tensor")],
            dc::grid_sampler_2d,
            false,
        );
    }
    b.composite(
        "affine_grid_generator",
        &["affine_grid_generator(Tensor theta, SymInt[] size, bool align_corners) -> Tensor"],
        dc::affine_grid,
        false,
    );
    b.composite(
        "clamp_min",
        &[
            "clamp_min(Tensor self, Scalar min) -> Tensor",
            "clamp_min.Tensor(Tensor self, Tensor min) -> Tensor",
        ],
        dc::clamp_min,
        true,
    );
    b.composite(
        "clamp_max",
        &[
            "clamp_max(Tensor self, Scalar max) -> Tensor",
            "clamp_max.Tensor(Tensor self, Tensor max) -> Tensor",
        ],
        dc::clamp_max,
        true,
    );
    b.composite(
        "rsub",
        &[
            "rsub.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor",
            "rsub.Scalar(Tensor self, Scalar other, Scalar alpha=1) -> Tensor",
        ],
        dc::rsub,
        false,
    );
    b.composite("selu", &["selu(Tensor self) -> Tensor"], dc::selu, true);
    b.composite(
        "celu",
        &["celu(Tensor self, Scalar alpha=1.0) -> Tensor"],
        dc::celu,
        true,
    );
    b.composite(
        "log_sigmoid",
        &["log_sigmoid(Tensor self) -> Tensor"],
        dc::log_sigmoid,
        false,
    );
    b.composite(
        "glu",
        &["glu(Tensor self, int dim=-1) -> Tensor"],
        dc::glu,
        false,
    );
    b.composite(
        "prelu",
        &["prelu(Tensor self, Tensor weight) -> Tensor"],
        dc::prelu,
        false,
    );
    b.composite(
        "_prelu_kernel",
        &["_prelu_kernel(Tensor self, Tensor weight) -> Tensor"],
        dc::prelu_kernel,
        false,
    );
    b.composite(
        "pixel_shuffle",
        &["pixel_shuffle(Tensor self, int upscale_factor) -> Tensor"],
        dc::pixel_shuffle,
        false,
    );
    b.composite(
        "pixel_unshuffle",
        &["pixel_unshuffle(Tensor self, int downscale_factor) -> Tensor"],
        dc::pixel_unshuffle,
        false,
    );
    b.composite(
        "one_hot",
        &["one_hot(Tensor self, int num_classes=-1) -> Tensor"],
        dc::one_hot,
        false,
    );
    b.composite(
        "repeat_interleave",
        &["repeat_interleave.self_int(Tensor self, SymInt repeats, int? dim=None, *, SymInt? output_size=None) -> Tensor"],
        dc::repeat_interleave,
        false,
    );
    b.composite(
        "argsort",
        &[
            "argsort(Tensor self, int dim=-1, bool descending=False) -> Tensor",
            "argsort.stable(Tensor self, *, bool stable, int dim=-1, bool descending=False) -> Tensor",
        ],
        dc::argsort,
        false,
    );
    b.composite(
        "cumprod",
        &["cumprod(Tensor self, int dim, *, ScalarType? dtype=None) -> Tensor"],
        dc::cumprod,
        true,
    );
    b.composite(
        "meshgrid",
        &[
            "meshgrid(Tensor[] tensors) -> Tensor[]",
            "meshgrid.indexing(Tensor[] tensors, *, str indexing) -> Tensor[]",
        ],
        dc::meshgrid,
        false,
    );
    b.composite(
        "instance_norm",
        &["instance_norm(Tensor input, Tensor? weight, Tensor? bias, Tensor? running_mean, Tensor? running_var, bool use_input_stats, float momentum, float eps, bool cudnn_enabled) -> Tensor"],
        dc::instance_norm,
        false,
    );
    b.composite(
        "_weight_norm_interface",
        &["_weight_norm_interface(Tensor v, Tensor g, int dim=0) -> (Tensor, Tensor)"],
        dc::weight_norm,
        false,
    );
    b.composite(
        "_weight_norm",
        &["_weight_norm(Tensor v, Tensor g, int dim=0) -> Tensor"],
        dc::weight_norm_weight,
        false,
    );
    b.composite(
        "linalg_vector_norm",
        &["linalg_vector_norm(Tensor self, Scalar ord=2, int[1]? dim=None, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor"],
        dc::vector_norm,
        false,
    );
    let composites: &[(&str, &[&str], super::super::composite::DecompFn, bool)] = &[
        ("logaddexp", &["logaddexp(Tensor self, Tensor other) -> Tensor"], dm::logaddexp, false),
        ("logaddexp2", &["logaddexp2(Tensor self, Tensor other) -> Tensor"], dm::logaddexp2, false),
        ("addcmul", &["addcmul(Tensor self, Tensor tensor1, Tensor tensor2, *, Scalar value=1) -> Tensor"], dm::addcmul, true),
        ("addcdiv", &["addcdiv(Tensor self, Tensor tensor1, Tensor tensor2, *, Scalar value=1) -> Tensor"], dm::addcdiv, true),
        ("fmax", &["fmax(Tensor self, Tensor other) -> Tensor"], dm::fmax, false),
        ("fmin", &["fmin(Tensor self, Tensor other) -> Tensor"], dm::fmin, false),
        ("heaviside", &["heaviside(Tensor self, Tensor values) -> Tensor"], dm::heaviside, true),
        ("isclose", &["isclose(Tensor self, Tensor other, float rtol=1e-05, float atol=1e-08, bool equal_nan=False) -> Tensor"], dm::isclose, false),
        ("ldexp", &["ldexp.Tensor(Tensor self, Tensor other) -> Tensor"], dm::ldexp, false),
        ("addmv", &["addmv(Tensor self, Tensor mat, Tensor vec, *, Scalar beta=1, Scalar alpha=1) -> Tensor"], dm::addmv, true),
        ("addr", &["addr(Tensor self, Tensor vec1, Tensor vec2, *, Scalar beta=1, Scalar alpha=1) -> Tensor"], dm::addr, true),
        ("addbmm", &["addbmm(Tensor self, Tensor batch1, Tensor batch2, *, Scalar beta=1, Scalar alpha=1) -> Tensor"], dm::addbmm, true),
        ("var_mean", &["var_mean.correction(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False) -> (Tensor, Tensor)"], dm::var_mean, false),
        ("std_mean", &["std_mean.correction(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False) -> (Tensor, Tensor)"], dm::std_mean, false),
        ("aminmax", &["aminmax(Tensor self, *, int? dim=None, bool keepdim=False) -> (Tensor min, Tensor max)"], dm::aminmax, false),
        ("kthvalue", &["kthvalue(Tensor self, int k, int dim=-1, bool keepdim=False) -> (Tensor values, Tensor indices)"], dm::kthvalue, false),
        ("cummax", &["cummax(Tensor self, int dim) -> (Tensor values, Tensor indices)"], dm::cummax, false),
        ("cummin", &["cummin(Tensor self, int dim) -> (Tensor values, Tensor indices)"], dm::cummin, false),
        ("_softmax_backward_data", &["_softmax_backward_data(Tensor grad_output, Tensor output, int dim, ScalarType input_dtype) -> Tensor"], dm::softmax_backward, false),
        ("_log_softmax_backward_data", &["_log_softmax_backward_data(Tensor grad_output, Tensor output, int dim, ScalarType input_dtype) -> Tensor"], dm::log_softmax_backward, false),
        ("nll_loss", &["nll_loss(Tensor self, Tensor target, Tensor? weight=None, int reduction=1, SymInt ignore_index=-100) -> Tensor"], dm::nll_loss, false),
        ("nll_loss_nd", &["nll_loss_nd(Tensor self, Tensor target, Tensor? weight=None, int reduction=1, SymInt ignore_index=-100) -> Tensor"], dm::nll_loss, false),
        ("nll_loss2d", &["nll_loss2d(Tensor self, Tensor target, Tensor? weight=None, int reduction=1, SymInt ignore_index=-100) -> Tensor"], dm::nll_loss2d, false),
        ("nll_loss_forward", &["nll_loss_forward(Tensor self, Tensor target, Tensor? weight, int reduction, SymInt ignore_index) -> (Tensor output, Tensor total_weight)"], dm::nll_loss_forward, false),
        ("nll_loss2d_forward", &["nll_loss2d_forward(Tensor self, Tensor target, Tensor? weight, int reduction, SymInt ignore_index) -> (Tensor output, Tensor total_weight)"], dm::nll_loss2d_forward, false),
        ("cross_entropy_loss", &["cross_entropy_loss(Tensor self, Tensor target, Tensor? weight=None, int reduction=1, SymInt ignore_index=-100, float label_smoothing=0.0) -> Tensor"], dm::cross_entropy, false),
        ("linspace", &["linspace(Scalar start, Scalar end, int steps, *, ScalarType? dtype=None) -> Tensor"], dm::linspace, false),
        ("logspace", &["logspace(Scalar start, Scalar end, int steps, float base=10.0, *, ScalarType? dtype=None) -> Tensor"], dm::logspace, false),
        ("broadcast_tensors", &["broadcast_tensors(Tensor[] tensors) -> Tensor[]"], dm::broadcast_tensors, false),
        ("diag", &["diag(Tensor self, int diagonal=0) -> Tensor"], dm::diag, false),
        ("diag_embed", &["diag_embed(Tensor self, int offset=0, int dim1=-2, int dim2=-1) -> Tensor"], dm::diag_embed, false),
        ("linalg_cross", &["linalg_cross(Tensor self, Tensor other, *, int dim=-1) -> Tensor"], dm::cross, false),
        ("cross", &["cross(Tensor self, Tensor other, int? dim=None) -> Tensor"], dm::cross, false),
        ("cosine_similarity", &["cosine_similarity(Tensor x1, Tensor x2, int dim=1, float eps=1e-08) -> Tensor"], dm::cosine_similarity, false),
        ("pairwise_distance", &["pairwise_distance(Tensor x1, Tensor x2, float p=2, float eps=1e-06, bool keepdim=False) -> Tensor"], dm::pairwise_distance, false),
        ("max_unpool2d", &["max_unpool2d(Tensor self, Tensor indices, SymInt[2] output_size) -> Tensor"], dm::max_unpool, false),
        ("max_unpool3d", &["max_unpool3d(Tensor self, Tensor indices, SymInt[3] output_size, int[3] stride, int[3] padding) -> Tensor"], dm::max_unpool, false),
        ("einsum", &["einsum(str equation, Tensor[] tensors, *, int[]? path=None) -> Tensor"], dm::einsum, false),
        ("index_reduce", &["index_reduce(Tensor self, int dim, Tensor index, Tensor source, str reduce, *, bool include_self=True) -> Tensor"], dm::index_reduce, true),
    ];
    for &(name, schemas, f, inplace) in composites {
        b.composite(name, schemas, f, inplace);
    }
    let small: &[(&str, &[&str], super::super::composite::DecompFn, bool)] = &[
        ("im2col", &["im2col(Tensor self, int[2] kernel_size, int[2] dilation, int[2] padding, int[2] stride) -> Tensor"], dc::im2col, false),
        ("col2im", &["col2im(Tensor self, SymInt[2] output_size, int[2] kernel_size, int[2] dilation, int[2] padding, int[2] stride) -> Tensor"], dc::col2im, false),
        ("threshold", &["threshold(Tensor self, Scalar threshold, Scalar value) -> Tensor"], dc::threshold, true),
        ("softshrink", &["softshrink(Tensor self, Scalar lambd=0.5) -> Tensor"], dc::softshrink, false),
        ("hardshrink", &["hardshrink(Tensor self, Scalar lambd=0.5) -> Tensor"], dc::hardshrink, false),
        ("sinc", &["sinc(Tensor self) -> Tensor"], dc::sinc, true),
        ("exp2", &["exp2(Tensor self) -> Tensor"], dc::exp2, true),
        ("copysign", &["copysign.Tensor(Tensor self, Tensor other) -> Tensor", "copysign.Scalar(Tensor self, Scalar other) -> Tensor"], dc::copysign, true),
        ("rot90", &["rot90(Tensor self, int k=1, int[] dims=[0,1]) -> Tensor"], dc::rot90, false),
        ("sum_to_size", &["sum_to_size(Tensor self, SymInt[] size) -> Tensor"], dc::sum_to_size, false),
    ];
    for &(name, schemas, f, inplace) in small {
        b.composite(name, schemas, f, inplace);
    }
    // Backward ops of joint graphs.
    b.composite(
        "convolution_backward",
        &["convolution_backward(Tensor grad_output, Tensor input, Tensor weight, SymInt[]? bias_sizes, SymInt[] stride, SymInt[] padding, SymInt[] dilation, bool transposed, SymInt[] output_padding, SymInt groups, bool[3] output_mask) -> (Tensor, Tensor, Tensor)"],
        dc::convolution_backward,
        false,
    );
    b.composite(
        "avg_pool2d_backward",
        &["avg_pool2d_backward(Tensor grad_output, Tensor self, int[2] kernel_size, int[2] stride, int[2] padding, bool ceil_mode, bool count_include_pad, int? divisor_override) -> Tensor"],
        dc::avg_pool2d_backward,
        false,
    );
    b.composite(
        "_adaptive_avg_pool2d_backward",
        &["_adaptive_avg_pool2d_backward(Tensor grad_output, Tensor self) -> Tensor"],
        dc::adaptive_avg_pool2d_backward,
        false,
    );
    b.composite(
        "max_pool2d_with_indices_backward",
        &["max_pool2d_with_indices_backward(Tensor grad_output, Tensor self, int[2] kernel_size, int[2] stride, int[2] padding, int[2] dilation, bool ceil_mode, Tensor indices) -> Tensor"],
        dc::max_pool2d_with_indices_backward,
        false,
    );
    b.composite(
        "embedding_dense_backward",
        &["embedding_dense_backward(Tensor grad_output, Tensor indices, SymInt num_weights, SymInt padding_idx, bool scale_grad_by_freq) -> Tensor"],
        dc::embedding_dense_backward,
        false,
    );
    b.composite(
        "native_layer_norm_backward",
        &["native_layer_norm_backward(Tensor grad_out, Tensor input, SymInt[] normalized_shape, Tensor mean, Tensor rstd, Tensor? weight, Tensor? bias, bool[3] output_mask) -> (Tensor, Tensor, Tensor)"],
        dc::native_layer_norm_backward,
        false,
    );
    b.composite(
        "native_group_norm_backward",
        &["native_group_norm_backward(Tensor grad_out, Tensor input, Tensor mean, Tensor rstd, Tensor? weight, SymInt N, SymInt C, SymInt HxW, int group, bool[3] output_mask) -> (Tensor, Tensor, Tensor)"],
        dc::native_group_norm_backward,
        false,
    );
    b.composite(
        "group_norm",
        &["group_norm(Tensor input, SymInt num_groups, Tensor? weight=None, Tensor? bias=None, float eps=1e-05, bool cudnn_enabled=True) -> Tensor"],
        dc::group_norm,
        false,
    );
    b.composite(
        "rms_norm",
        &["rms_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight=None, float? eps=None) -> Tensor"],
        dc::rms_norm,
        false,
    );
    b.composite(
        "hardswish",
        &["hardswish(Tensor self) -> Tensor"],
        dc::hardswish,
        true,
    );
    b.composite(
        "hardsigmoid",
        &["hardsigmoid(Tensor self) -> Tensor"],
        dc::hardsigmoid,
        true,
    );
    b.composite(
        "hardtanh",
        &["hardtanh(Tensor self, Scalar min_val=-1, Scalar max_val=1) -> Tensor"],
        dc::hardtanh,
        true,
    );
    b.composite("relu6", &["relu6(Tensor self) -> Tensor"], dc::relu6, true);
    b.composite("mish", &["mish(Tensor self) -> Tensor"], dc::mish, true);
    b.composite(
        "logsumexp",
        &["logsumexp(Tensor self, int[1] dim, bool keepdim=False) -> Tensor"],
        dc::logsumexp,
        false,
    );
    b.composite(
        "roll",
        &["roll(Tensor self, SymInt[1] shifts, int[1] dims=[]) -> Tensor"],
        dc::roll,
        false,
    );
    b.composite(
        "diff",
        &["diff(Tensor self, int n=1, int dim=-1, Tensor? prepend=None, Tensor? append=None) -> Tensor"],
        dc::diff,
        false,
    );
    b.composite(
        "pad",
        &["pad(Tensor self, SymInt[] pad, str mode=\"constant\", float? value=None) -> Tensor"],
        dc::pad,
        false,
    );
    for (name, k, f) in [
        (
            "reflection_pad1d",
            "SymInt[2]",
            dc::reflection_pad1d as super::super::composite::DecompFn,
        ),
        ("reflection_pad2d", "SymInt[4]", dc::reflection_pad2d),
        ("reflection_pad3d", "SymInt[6]", dc::reflection_pad3d),
        ("replication_pad1d", "SymInt[2]", dc::replication_pad1d),
        ("replication_pad2d", "SymInt[4]", dc::replication_pad2d),
        ("replication_pad3d", "SymInt[6]", dc::replication_pad3d),
    ] {
        b.composite(
            name,
            &[&format!("{name}(Tensor self, {k} padding) -> Tensor")],
            f,
            false,
        );
    }
    for (sp, f, fe, fl) in [
        (
            1,
            dc::upsample_nearest1d as super::super::composite::DecompFn,
            dc::upsample_nearest_exact1d as super::super::composite::DecompFn,
            dc::upsample_linear1d as super::super::composite::DecompFn,
        ),
        (
            2,
            dc::upsample_nearest2d,
            dc::upsample_nearest_exact2d,
            dc::upsample_bilinear2d,
        ),
        (
            3,
            dc::upsample_nearest3d,
            dc::upsample_nearest_exact3d,
            dc::upsample_trilinear3d,
        ),
    ] {
        let scales = match sp {
            1 => "float? scales=None",
            2 => "float? scales_h=None, float? scales_w=None",
            _ => "float? scales_d=None, float? scales_h=None, float? scales_w=None",
        };
        let linear = [
            "upsample_linear1d",
            "upsample_bilinear2d",
            "upsample_trilinear3d",
        ][sp - 1];
        for (name, f, align) in [
            (format!("upsample_nearest{sp}d"), f, ""),
            (format!("_upsample_nearest_exact{sp}d"), fe, ""),
            (linear.to_string(), fl, "bool align_corners, "),
        ] {
            b.composite(
                &name,
                &[&format!(
                    "{name}(Tensor self, SymInt[{sp}] output_size, {align}{scales}) -> Tensor"
                )],
                f,
                false,
            );
        }
    }
}
