//! ATen ops the import rewrites itself, where the op table's entries
//! cannot stand for them: ops that only name an existing tensor
//! (eval-mode `dropout`, `detach_`, `to` of the same dtype, `flatten` of
//! one dimension) bind their result to it, as eager returns the tensor
//! itself; views by another name (`flatten`, `view_as`, `expand_as`); the
//! in-place view ops, whose later nodes name the tensor by its old node;
//! training-mode `batch_norm`, which writes its running statistics;
//! upsampling's `.vec` overload, its sizes spelled out. Convolution,
//! pooling, normalization, upsampling and the activations are composite
//! ops of the table (`kiln_functionalize::ops::decomp`).

use super::convert::{float, ints, usizes, Node, Out, A};

/// A decomposition: writes the node's statements, returns its outputs'
/// Kiln values.
pub type Decomp = fn(&mut Out, &Node) -> Result<Vec<String>, String>;

type R = Result<Vec<String>, String>;

/// An ATen op (or several) the import rewrites, and how, as `kiln ops`
/// lists it.
pub struct Rewrite {
    pub ops: &'static [&'static str],
    pub how: &'static str,
    pub f: Decomp,
}

pub const REWRITES: &[Rewrite] = &[
    Rewrite {
        ops: &["_convolution"],
        how: "`convolution` (cuDNN's flags change nothing here)",
        f: legacy_convolution,
    },
    Rewrite {
        ops: &[
            "batch_norm",
            "_native_batch_norm_legit",
            "_native_batch_norm_legit_functional",
        ],
        how: "in training mode with running statistics: the batch statistics, the running ones \
              updated with `copy_` (`_functional`: returned); otherwise the table's op",
        f: batch_norm,
    },
    Rewrite {
        ops: &[
            "dropout",
            "dropout_",
            "feature_dropout",
            "feature_dropout_",
            "alpha_dropout",
            "alpha_dropout_",
            "feature_alpha_dropout",
            "feature_alpha_dropout_",
        ],
        how: "the input itself in evaluation mode; refused in training mode (random)",
        f: dropout,
    },
    Rewrite {
        ops: &["detach", "detach_"],
        how: "`alias` (`detach_`: the tensor itself)",
        f: detach,
    },
    Rewrite {
        ops: &["lift_fresh_copy"],
        how: "`clone`",
        f: lift_fresh_copy,
    },
    Rewrite {
        ops: &["_assert_tensor_metadata"],
        how: "checked against the archive's metadata, then dropped",
        f: assert_metadata,
    },
    Rewrite {
        ops: &["to", "type_as"],
        how: "the tensor itself at its own dtype, else `_to_copy`",
        f: to,
    },
    Rewrite {
        ops: &["flatten"],
        how: "`reshape`",
        f: flatten,
    },
    Rewrite {
        ops: &["unflatten"],
        how: "`view`",
        f: unflatten,
    },
    Rewrite {
        ops: &["new_zeros", "new_ones", "new_full", "new_empty"],
        how: "`zeros`, `ones`, `full` at the tensor's dtype (`new_empty`: zeros)",
        f: new_fill,
    },
    Rewrite {
        ops: &[
            "upsample_nearest1d",
            "upsample_nearest2d",
            "upsample_nearest3d",
            "_upsample_nearest_exact1d",
            "_upsample_nearest_exact2d",
            "_upsample_nearest_exact3d",
            "upsample_linear1d",
            "upsample_bilinear2d",
            "upsample_trilinear3d",
        ],
        how: "the table's op with output sizes and scales spelled out (`.vec`'s `scale_factors` \
              too)",
        f: upsample,
    },
    Rewrite {
        ops: &["min", "max"],
        how: "`.other`: `minimum` / `maximum`; the other overloads are the table's",
        f: min_max,
    },
    Rewrite {
        ops: &[
            "__and__",
            "bitwise_and",
            "__or__",
            "bitwise_or",
            "__xor__",
            "bitwise_xor",
            "__invert__",
            "bitwise_not",
        ],
        how: "the table's `bitwise_*` op, its overload by the other operand",
        f: bitwise,
    },
    Rewrite {
        ops: &["expand_as"],
        how: "`expand` to the other's sizes",
        f: expand_as,
    },
    Rewrite {
        ops: &["view_as", "reshape_as"],
        how: "`view` / `reshape` to the other's sizes",
        f: view_as,
    },
    Rewrite {
        ops: &[
            "t_",
            "transpose_",
            "swapdims_",
            "swapaxes_",
            "unsqueeze_",
            "squeeze_",
            "as_strided_",
        ],
        how: "the view, and the tensor's name rebound to it",
        f: view_in_place,
    },
    Rewrite {
        ops: &["var", "std"],
        how: "`.default` (`unbiased`): `.correction` over every dimension; the other overloads \
              are the table's",
        f: var_std,
    },
    Rewrite {
        ops: &["scaled_dot_product_attention"],
        how: "with `enable_gqa`: the query's heads grouped by key head (`reshape`), key, value \
              and mask broadcast over the group (`unsqueeze`), the table's op, the heads \
              merged back; otherwise the table's op",
        f: sdpa_gqa,
    },
    Rewrite {
        ops: &["scatter"],
        how: "`.reduce` / `.value_reduce` (`add`, `multiply`): `scatter_reduce.two` (`sum`, \
              `prod`, self included); the other overloads are the table's",
        f: scatter_reduce_overload,
    },
    Rewrite {
        ops: &["index_add"],
        how: "of a 0-d tensor: the table's op on it as one element; otherwise the table's op",
        f: index_add_0d,
    },
    Rewrite {
        ops: &["clone", "contiguous"],
        how: "with a `memory_format`: contiguous (`contiguous`), or channels-last (`permute` to \
              channels last, `contiguous`, `permute` back), after a `clone` for `clone`; \
              otherwise the table's op",
        f: memory_format,
    },
    Rewrite {
        ops: &[
            "swapaxes",
            "swapdims",
            "moveaxis",
            "movedim",
            "numpy_T",
            "mT",
            "mH",
            "adjoint",
            "matrix_H",
            "_unsafe_view",
        ],
        how: "the view by its table name: `transpose` (`swapaxes`, `swapdims`, `mT`, `mH`, \
              `adjoint`, `matrix_H`: real tensors), `permute` (`moveaxis`, `movedim`, \
              `numpy_T`), `view` (`_unsafe_view`)",
        f: view_alias,
    },
    Rewrite {
        ops: &["sort"],
        how: "`.stable`: the table's `sort`, which is stable either way",
        f: sort_stable,
    },
    Rewrite {
        ops: &["_unsafe_index", "_unsafe_index_put"],
        how: "`index.Tensor` / `index_put` (Kiln checks the indices either way)",
        f: unsafe_index,
    },
    Rewrite {
        ops: &[
            "divide",
            "true_divide",
            "subtract",
            "multiply",
            "negative",
            "absolute",
            "arccos",
            "arcsin",
            "arctan",
            "arctan2",
            "arccosh",
            "arcsinh",
            "arctanh",
            "clip",
            "fix",
            "greater",
            "greater_equal",
            "less",
            "less_equal",
            "not_equal",
            "concat",
            "concatenate",
            "special_expit",
            "expand_copy",
            "broadcast_to",
            "unsafe_chunk",
            "unsafe_split",
            "unsafe_split_with_sizes",
            "square",
        ],
        how: "the table's op of the same meaning: `div`, `sub`, `mul`, `neg`, `abs`, `acos`, \
              `asin`, `atan`, `atan2`, `acosh`, `asinh`, `atanh`, `clamp`, `trunc`, `gt`, `ge`, \
              `lt`, `le`, `ne`, `cat`, `sigmoid`, `expand`, `chunk`, `split`, \
              `split_with_sizes`; `square` as `mul` by itself",
        f: alias,
    },
];

/// ATen ops the import refuses whatever their arguments, and why.
pub const REFUSED: &[(&[&str], &str)] = &[
    (
        &[
            "nonzero",
            "nonzero_static",
            "masked_select",
            "unique",
            "_unique2",
            "unique_consecutive",
        ],
        "its result's size depends on the values (Kiln compiles fixed shapes)",
    ),
    (
        &["_local_scalar_dense", "item"],
        "it reads a tensor's value into Python (data-dependent control flow); export the model \
         without `.item()` or `.tolist()` in forward",
    ),
    (
        &["sym_size", "sym_numel", "sym_stride", "sym_storage_offset"],
        "it reads a symbolic shape (dynamic shapes); export with static shapes (no \
         `dynamic_shapes=`)",
    ),
    (
        &[
            "_fft_r2c",
            "_fft_c2r",
            "_fft_c2c",
            "view_as_complex",
            "view_as_real",
        ],
        "it computes in complex numbers, a dtype Kiln does not hold",
    ),
];

pub fn find(op: &str) -> Option<Decomp> {
    REWRITES.iter().find(|r| r.ops.contains(&op)).map(|r| r.f)
}

/// Why the import refuses `op`, if it refuses it whatever its arguments.
pub fn refused(op: &str) -> Option<&'static str> {
    REFUSED
        .iter()
        .find(|(ops, _)| ops.contains(&op))
        .map(|(_, why)| *why)
}

/// `_convolution`: `convolution` with cuDNN's flags, which change nothing
/// here.
fn legacy_convolution(o: &mut Out, n: &Node) -> R {
    let mut args = vec![];
    for k in [
        "input",
        "weight",
        "bias",
        "stride",
        "padding",
        "dilation",
        "transposed",
        "output_padding",
        "groups",
    ] {
        args.push(match n.get(k) {
            Some(a) => super::convert::render(o, a)?,
            None => "none".into(),
        });
    }
    Ok(vec![o.emit_out(n, 0, "convolution", &args)])
}

fn dropout(o: &mut Out, n: &Node) -> R {
    let x = o.val(n.tensor("input").or_else(|_| n.tensor("self"))?)?;
    if n.bool("train", false)? && n.float("p", 0.0)? > 0.0 {
        return Err(
            "dropout in training mode draws random numbers, which Kiln does not \
                    reproduce; export the model after model.eval()"
                .into(),
        );
    }
    // Eager returns the input itself.
    Ok(vec![x])
}

fn detach(o: &mut Out, n: &Node) -> R {
    let x = o.val(n.tensor("self")?)?;
    if n.op == "detach_" {
        return Ok(vec![x]);
    }
    Ok(vec![o.emit_out(n, 0, "alias", &[x])])
}

fn lift_fresh_copy(o: &mut Out, n: &Node) -> R {
    let x = o.val(n.tensor("self")?)?;
    Ok(vec![o.emit_out(n, 0, "clone", &[x])])
}

/// Checked here, against the archive's static metadata.
fn assert_metadata(o: &mut Out, n: &Node) -> R {
    let t = n.tensor("a")?;
    let m = o.meta(t)?.clone();
    if let Some(d) = n.dtype("dtype")? {
        if d != m.dtype {
            return Err(format!(
                "`{t}` is {}, the program asserts {}",
                m.dtype.name(),
                d.name()
            ));
        }
    }
    if let Some(A::Ints(s)) = n.get("size") {
        if s.iter().map(|&x| x as usize).ne(m.sizes.iter().copied()) {
            return Err(format!(
                "`{t}` has sizes {:?}, the program asserts {s:?}",
                m.sizes
            ));
        }
    }
    Ok(vec![])
}

fn to(o: &mut Out, n: &Node) -> R {
    let x = n.tensor("self")?;
    let have = o.meta(x)?.dtype;
    let want = match n.get("other") {
        Some(A::Tensor(other)) => o.meta(other)?.dtype,
        _ => n.dtype("dtype")?.unwrap_or(have),
    };
    let v = o.val(x)?;
    if want == have && !n.bool("copy", false)? {
        // Eager returns `self` itself.
        return Ok(vec![v]);
    }
    Ok(vec![o.emit_out(n, 0, "_to_copy", &[v, want.name().into()])])
}

fn flatten(o: &mut Out, n: &Node) -> R {
    let x = n.tensor("self")?;
    let sizes = o.meta(x)?.sizes.clone();
    let v = o.val(x)?;
    if sizes.is_empty() {
        return Ok(vec![o.emit_out(n, 0, "reshape", &[v, "[1]".into()])]);
    }
    let rank = sizes.len() as i64;
    let norm = |d: i64| -> Result<usize, String> {
        let r = if d < 0 { d + rank } else { d };
        usize::try_from(r)
            .ok()
            .filter(|&r| r < sizes.len())
            .ok_or_else(|| format!("dimension {d} out of range for rank {rank}"))
    };
    let (s, e) = (norm(n.int("start_dim", 0)?)?, norm(n.int("end_dim", -1)?)?);
    if s > e {
        return Err("flatten: start_dim after end_dim".into());
    }
    if s == e {
        return Ok(vec![v]);
    }
    let mut new: Vec<usize> = sizes[..s].to_vec();
    new.push(sizes[s..=e].iter().product());
    new.extend_from_slice(&sizes[e + 1..]);
    Ok(vec![o.emit_out(n, 0, "reshape", &[v, usizes(&new)])])
}

fn unflatten(o: &mut Out, n: &Node) -> R {
    let x = n.tensor("self")?;
    let sizes = o.meta(x)?.sizes.clone();
    let rank = sizes.len() as i64;
    let d = n.int("dim", 0)?;
    let d = usize::try_from(if d < 0 { d + rank } else { d })
        .ok()
        .filter(|&d| d < sizes.len())
        .ok_or_else(|| format!("dimension {d} out of range for rank {rank}"))?;
    let parts = n.ints("sizes", 0, &[])?;
    let mut new: Vec<i64> = sizes[..d].iter().map(|&s| s as i64).collect();
    new.extend(parts);
    new.extend(sizes[d + 1..].iter().map(|&s| s as i64));
    let v = o.val(x)?;
    Ok(vec![o.emit_out(n, 0, "view", &[v, ints(&new)])])
}

fn new_fill(o: &mut Out, n: &Node) -> R {
    let x = n.tensor("self")?;
    let dtype = n.dtype("dtype")?.unwrap_or(o.meta(x)?.dtype);
    let size = match n.get("size") {
        Some(A::Ints(s)) => ints(s),
        _ => return Err("argument `size` is not a list of integers".into()),
    };
    let d = dtype.name().to_string();
    Ok(vec![match n.op.as_str() {
        "new_ones" => o.emit_out(n, 0, "ones", &[size, d]),
        "new_full" => {
            let v = super::convert::render(o, n.get("fill_value").unwrap_or(&A::Int(0)))?;
            o.emit_out(n, 0, "full", &[size, v, d])
        }
        // `new_empty`'s values are unspecified: zeros are one choice.
        _ => o.emit_out(n, 0, "zeros", &[size, d]),
    }])
}

/// `min.other` / `max.other` are the elementwise `minimum` / `maximum`;
/// the other overloads are the table's.
fn min_max(o: &mut Out, n: &Node) -> R {
    if n.overload != "other" {
        return super::convert::call_table(o, n).map_err(|e| e.to_string());
    }
    let x = o.val(n.tensor("self")?)?;
    let y = o.val(n.tensor("other")?)?;
    let op = if n.op == "min" { "minimum" } else { "maximum" };
    Ok(vec![o.emit_out(n, 0, op, &[x, y])])
}

/// Python's operators (`__and__`, `__invert__`, ...) are the table's
/// `bitwise_*` ops.
fn bitwise(o: &mut Out, n: &Node) -> R {
    let op = match n.op.trim_start_matches("__").trim_end_matches("__") {
        "and" | "bitwise_and" => "bitwise_and",
        "or" | "bitwise_or" => "bitwise_or",
        "xor" | "bitwise_xor" => "bitwise_xor",
        _ => "bitwise_not",
    };
    let overload = match n.get("other") {
        Some(A::Tensor(_)) => "Tensor",
        Some(_) => "Scalar",
        None => "default",
    };
    let renamed = Node {
        op: op.into(),
        overload: overload.into(),
        name: n.name.clone(),
        args: n.args.clone(),
        outputs: n.outputs.clone(),
        trace: n.trace,
    };
    super::convert::call_table(o, &renamed).map_err(|e| e.to_string())
}

fn expand_as(o: &mut Out, n: &Node) -> R {
    let x = o.val(n.tensor("self")?)?;
    let s = usizes(&o.meta(n.tensor("other")?)?.sizes.clone());
    Ok(vec![o.emit_out(n, 0, "expand", &[x, s])])
}

fn view_as(o: &mut Out, n: &Node) -> R {
    let x = o.val(n.tensor("self")?)?;
    let s = usizes(&o.meta(n.tensor("other")?)?.sizes.clone());
    let op = if n.op == "view_as" { "view" } else { "reshape" };
    Ok(vec![o.emit_out(n, 0, op, &[x, s])])
}

/// In-place view ops change only a tensor's sizes and strides: the view
/// of the same storage, and the tensor's name now means it (eager's
/// object is the same, its metadata changed).
fn view_in_place(o: &mut Out, n: &Node) -> R {
    let x = n.tensor("self")?;
    let v = o.val(x)?;
    let mut args = vec![v];
    let op = match n.op.as_str() {
        "t_" => "t",
        "unsqueeze_" => {
            args.push(n.int("dim", 0)?.to_string());
            "unsqueeze"
        }
        "squeeze_" => {
            match n.get("dim") {
                Some(A::Int(d)) => args.push(d.to_string()),
                Some(A::Ints(d)) => args.push(ints(d)),
                _ => {}
            }
            "squeeze"
        }
        "as_strided_" => {
            args.push(ints(&n.ints("size", 0, &[])?));
            args.push(ints(&n.ints("stride", 0, &[])?));
            if let Some(off) = n.get("storage_offset") {
                args.push(super::convert::render(o, off)?);
            }
            "as_strided"
        }
        _ => {
            args.push(n.int("dim0", 0)?.to_string());
            args.push(n.int("dim1", 0)?.to_string());
            "transpose"
        }
    };
    let r = o.emit_out(n, 0, op, &args);
    o.bind(x, r.clone());
    Ok(vec![r])
}

/// `batch_norm` in training mode with running statistics, which it writes
/// in place: the batch statistics, the running ones moved towards them
/// with `copy_`, then the table's `batch_norm` of the batch statistics.
/// Otherwise the table's op.
fn batch_norm(o: &mut Out, n: &Node) -> R {
    let rm = n.opt_tensor("running_mean")?;
    let rv = n.opt_tensor("running_var")?;
    let functional = n.op == "_native_batch_norm_legit_functional";
    let training = n.bool("training", false)?;
    if functional && !training {
        // Evaluation: the table's op, and the running statistics as they were.
        let (Some(rm), Some(rv)) = (rm, rv) else {
            return Err("running_mean and running_var must be defined in evaluation mode".into());
        };
        let mut args = vec![];
        for k in ["input", "weight", "bias"] {
            args.push(match n.get(k) {
                Some(a) => super::convert::render(o, a)?,
                None => "none".into(),
            });
        }
        let (rmv, rvv) = (o.val(rm)?, o.val(rv)?);
        args.extend([rmv.clone(), rvv.clone(), "false".into()]);
        args.push(float(n.float("momentum", 0.1)?));
        args.push(float(n.float("eps", 1e-5)?));
        let mut r = o.emit_outs(n, 3, "_native_batch_norm_legit", &args);
        r.extend([rmv, rvv]);
        return Ok(r);
    }
    let (true, Some(rm), Some(rv)) = (training, rm, rv) else {
        return super::convert::call_table(o, n).map_err(|e| e.to_string());
    };
    let legit = n.op.starts_with("_native_batch_norm_legit");
    let x = n.tensor("input")?;
    let m = o.meta(x)?.clone();
    if m.sizes.len() < 2 {
        return Err(format!(
            "input of rank {} (batch norm needs N, C, ...)",
            m.sizes.len()
        ));
    }
    let (c, rank) = (m.sizes[1], m.sizes.len());
    let xv = o.val(x)?;
    let eps = float(n.float("eps", 1e-5)?);
    let b = &n.name;
    let dims: Vec<i64> = std::iter::once(0).chain(2..rank as i64).collect();
    let mean = o.emit(b, "mean", &[xv.clone(), ints(&dims)]);
    let var = o.emit(b, "var", &[xv.clone(), ints(&dims), "0".into()]);
    let count: usize = m.sizes.iter().product::<usize>() / c.max(1);
    let mom = n.float("momentum", 0.1)?;
    let (rm, rv) = (o.val(rm)?, o.val(rv)?);
    let keep = float(1.0 - mom);
    let a = o.emit(b, "mul", &[rm.clone(), keep.clone()]);
    let bm = o.emit(b, "mul", &[mean.clone(), float(mom)]);
    let nm = o.emit(b, "add", &[a, bm]);
    if !functional {
        o.emit_void("copy_", &[rm, nm.clone()]);
    }
    let unbiased = count as f64 / (count.max(2) - 1) as f64;
    let a = o.emit(b, "mul", &[rv.clone(), keep]);
    let bv = o.emit(b, "mul", &[var.clone(), float(mom * unbiased)]);
    let nv = o.emit(b, "add", &[a, bv]);
    if !functional {
        o.emit_void("copy_", &[rv, nv.clone()]);
    }
    // The batch's statistics, as eval-mode running ones.
    let w = match n.opt_tensor("weight")? {
        Some(w) => o.val(w)?,
        None => "none".into(),
    };
    let bias = match n.opt_tensor("bias")? {
        Some(bias) => o.val(bias)?,
        None => "none".into(),
    };
    if legit {
        // The result and the saved statistics, from the table's
        // `.no_stats` overload (it computes them again; the duplicates
        // fold away).
        let mut r = o.emit_outs(
            n,
            3,
            "_native_batch_norm_legit",
            &[xv, w, bias, "true".into(), float(mom), eps],
        );
        if functional {
            // `_functional` returns the running statistics it would write.
            r.extend([nm, nv]);
        }
        return Ok(r);
    }
    Ok(vec![o.emit_out(
        n,
        0,
        "batch_norm",
        &[
            xv,
            w,
            bias,
            mean,
            var,
            "false".into(),
            float(mom),
            eps,
            "false".into(),
        ],
    )])
}

/// `upsample_*` and its `.vec` overload (`output_size` or `scale_factors`,
/// as `F.interpolate` calls it): the table's composite with the output
/// sizes and per-dimension scales spelled out.
fn upsample(o: &mut Out, n: &Node) -> R {
    let x = n.tensor("input").or_else(|_| n.tensor("self"))?;
    let m = o.meta(x)?.clone();
    let sp = match &n.op {
        op if op.ends_with("1d") => 1,
        op if op.ends_with("3d") => 3,
        _ => 2,
    };
    if m.sizes.len() != sp + 2 {
        return Err(format!(
            "input of rank {}, expected {}",
            m.sizes.len(),
            sp + 2
        ));
    }
    let ins = &m.sizes[2..];
    // Scales: `scale_factors` (`.vec`), or `scales_h` / `scales_w` / ...
    let factors: Vec<Option<f64>> = match n.get("scale_factors") {
        Some(A::Floats(f)) => f.iter().map(|&x| Some(x)).collect(),
        _ => {
            let names: &[&str] = match sp {
                1 => &["scales"],
                2 => &["scales_h", "scales_w"],
                _ => &["scales_d", "scales_h", "scales_w"],
            };
            names
                .iter()
                .map(|k| n.opt_float(k))
                .collect::<Result<_, _>>()?
        }
    };
    let outs: Vec<i64> = match n.get("output_size") {
        Some(A::Ints(v)) => v.clone(),
        _ => ins
            .iter()
            .zip(&factors)
            .map(|(&i, f)| (i as f64 * f.unwrap_or(1.0)).floor() as i64)
            .collect(),
    };
    if outs.len() != sp || factors.len() != sp && !factors.is_empty() {
        return Err("output size and scales of the wrong length".into());
    }
    let list = |v: &[i64]| {
        format!(
            "[{}]",
            v.iter().map(i64::to_string).collect::<Vec<_>>().join(", ")
        )
    };
    let mut args = vec![o.val(x)?, list(&outs)];
    if n.op.contains("linear") {
        args.push(n.bool("align_corners", false)?.to_string());
    }
    for k in 0..sp {
        args.push(match factors.get(k).copied().flatten() {
            Some(f) => format!("{f:?}"),
            None => "none".into(),
        });
    }
    Ok(vec![o.emit_out(n, 0, &n.op, &args)])
}

/// `var.default` / `std.default(self, unbiased)`: `.correction` over
/// every dimension (`unbiased` is a correction of 1 or 0).
fn var_std(o: &mut Out, n: &Node) -> R {
    if n.overload != "default" {
        return super::convert::call_table(o, n).map_err(|e| e.to_string());
    }
    let x = o.val(n.tensor("self")?)?;
    let c = if n.bool("unbiased", true)? { "1" } else { "0" };
    Ok(vec![o.emit_out(n, 0, &n.op, &[x, "none".into(), c.into()])])
}

/// ATen's aliases: the table's op by its own name.
fn alias(o: &mut Out, n: &Node) -> R {
    let op = match n.op.as_str() {
        "divide" | "true_divide" => "div",
        "subtract" => "sub",
        "multiply" => "mul",
        "negative" => "neg",
        "absolute" => "abs",
        "arccos" => "acos",
        "arcsin" => "asin",
        "arctan" => "atan",
        "arctan2" => "atan2",
        "arccosh" => "acosh",
        "arcsinh" => "asinh",
        "arctanh" => "atanh",
        "clip" => "clamp",
        "fix" => "trunc",
        "greater" => "gt",
        "greater_equal" => "ge",
        "less" => "lt",
        "less_equal" => "le",
        "not_equal" => "ne",
        "concat" | "concatenate" => "cat",
        "special_expit" => "sigmoid",
        "expand_copy" | "broadcast_to" => "expand",
        "unsafe_chunk" => "chunk",
        "unsafe_split" => "split",
        "unsafe_split_with_sizes" => "split_with_sizes",
        "square" => {
            let x = o.val(n.tensor("self")?)?;
            return Ok(vec![o.emit_out(n, 0, "mul", &[x.clone(), x])]);
        }
        other => return Err(format!("internal error: no alias for {other}")),
    };
    let renamed = Node {
        op: op.into(),
        overload: n.overload.clone(),
        name: n.name.clone(),
        args: n.args.clone(),
        outputs: n.outputs.clone(),
        trace: n.trace,
    };
    super::convert::call_table(o, &renamed).map_err(|e| e.to_string())
}

/// `scaled_dot_product_attention(..., enable_gqa=True)`: query heads
/// `[.., Hq, L, E]` grouped as `[.., Hk, Hq / Hk, L, E]`, so that each key
/// and value head broadcasts over its group of query heads.
fn sdpa_gqa(o: &mut Out, n: &Node) -> R {
    if !n.bool("enable_gqa", false)? {
        return super::convert::call_table(o, n).map_err(|e| e.to_string());
    }
    let (q, k, v) = (n.tensor("query")?, n.tensor("key")?, n.tensor("value")?);
    let (qm, km) = (o.meta(q)?.clone(), o.meta(k)?.clone());
    let (qr, kr) = (qm.sizes.len(), km.sizes.len());
    if qr < 3 || kr < 3 {
        return Err("enable_gqa needs query and key with a head dimension (rank 3 or more)".into());
    }
    let (hq, hk) = (qm.sizes[qr - 3], km.sizes[kr - 3]);
    if hk == 0 || hq % hk != 0 {
        return Err(format!(
            "enable_gqa: the query's {hq} heads are not a multiple of the key's {hk}"
        ));
    }
    let b = &n.name;
    let mut grouped: Vec<usize> = qm.sizes[..qr - 3].to_vec();
    grouped.extend([hk, hq / hk, qm.sizes[qr - 2], qm.sizes[qr - 1]]);
    let qv = o.val(q)?;
    let qg = o.emit(b, "reshape", &[qv, usizes(&grouped)]);
    let kv = o.val(k)?;
    let kg = o.emit(b, "unsqueeze", &[kv, "-3".into()]);
    let vv = o.val(v)?;
    let vg = o.emit(b, "unsqueeze", &[vv, "-3".into()]);
    let mask = match n.opt_tensor("attn_mask")? {
        None => "none".into(),
        Some(m) => {
            let mm = o.meta(m)?.clone();
            let r = mm.sizes.len();
            let mv = o.val(m)?;
            if r >= 3 && mm.sizes[r - 3] == hq && hq != 1 {
                let mut s: Vec<usize> = mm.sizes[..r - 3].to_vec();
                s.extend([hk, hq / hk, mm.sizes[r - 2], mm.sizes[r - 1]]);
                o.emit(b, "reshape", &[mv, usizes(&s)])
            } else if r >= 3 {
                o.emit(b, "unsqueeze", &[mv, "-3".into()])
            } else {
                mv
            }
        }
    };
    let scale = match n.opt_float("scale")? {
        Some(s) => float(s),
        None => "none".into(),
    };
    let out = o.emit(
        b,
        "scaled_dot_product_attention",
        &[
            qg,
            kg,
            vg,
            mask,
            float(n.float("dropout_p", 0.0)?),
            n.bool("is_causal", false)?.to_string(),
            scale,
        ],
    );
    let vm = o.meta(v)?.clone();
    let mut merged: Vec<usize> = qm.sizes[..qr - 3].to_vec();
    merged.extend([hq, qm.sizes[qr - 2], vm.sizes[vm.sizes.len() - 1]]);
    Ok(vec![o.emit_out(n, 0, "reshape", &[out, usizes(&merged)])])
}

/// `scatter.reduce(self, dim, index, src, reduce)` and `.value_reduce`
/// (a scalar source): `scatter_reduce.two` with `self` included.
fn scatter_reduce_overload(o: &mut Out, n: &Node) -> R {
    if !matches!(n.overload.as_str(), "reduce" | "value_reduce") {
        return super::convert::call_table(o, n).map_err(|e| e.to_string());
    }
    let reduce = match n.get("reduce") {
        Some(A::Str(s)) if s == "add" => "sum",
        Some(A::Str(s)) if s == "multiply" => "prod",
        other => return Err(format!("reduce argument {other:?} must be add or multiply")),
    };
    let x = n.tensor("self")?;
    let idx = n.tensor("index")?;
    let xv = o.val(x)?;
    let iv = o.val(idx)?;
    let dim = n.int("dim", 0)?.to_string();
    let src = match n.get("src") {
        Some(A::Tensor(s)) => o.val(s)?,
        _ => {
            let value = super::convert::render(o, n.get("value").unwrap_or(&A::Int(0)))?;
            let dt = o.meta(x)?.dtype.name().to_string();
            let size = usizes(&o.meta(idx)?.sizes.clone());
            o.emit(&n.name, "full", &[size, value, dt])
        }
    };
    Ok(vec![o.emit_out(
        n,
        0,
        "scatter_reduce",
        &[xv, dim, iv, src, format!("{reduce:?}")],
    )])
}

/// `index_add` of a 0-d tensor: as a tensor of one element (eager treats
/// a 0-d `self` so), the result viewed back.
fn index_add_0d(o: &mut Out, n: &Node) -> R {
    let x = n.tensor("self")?;
    if !o.meta(x)?.sizes.is_empty() {
        return super::convert::call_table(o, n).map_err(|e| e.to_string());
    }
    let b = &n.name;
    let one = |o: &mut Out, t: &str| -> Result<String, String> {
        let v = o.val(t)?;
        Ok(if o.meta(t)?.sizes.is_empty() {
            o.emit(b, "reshape", &[v, "[1]".into()])
        } else {
            v
        })
    };
    let xv = one(o, x)?;
    let iv = one(o, n.tensor("index")?)?;
    let sv = one(o, n.tensor("source")?)?;
    let mut args = vec![xv, "0".into(), iv, sv];
    if let Some(alpha) = n.get("alpha") {
        args.push(super::convert::render(o, alpha)?);
    }
    let r = o.emit(b, "index_add", &args);
    Ok(vec![o.emit_out(n, 0, "reshape", &[r, "[]".into()])])
}

/// `clone` / `contiguous` with a `memory_format` (torch.export's codes:
/// 1 contiguous, 2 channels last, 3 channels last 3d, 4 preserve): the
/// strides eager gives, which later views depend on.
fn memory_format(o: &mut Out, n: &Node) -> R {
    let format = match n.get("memory_format") {
        Some(A::MemoryFormat(m)) => *m,
        _ => 4,
    };
    let x = n.tensor("self")?;
    let rank = o.meta(x)?.sizes.len();
    let (to, back): (&str, &str) = match (format, rank) {
        (0 | 4, _) if n.op == "clone" => {
            return super::convert::call_table(o, n).map_err(|e| e.to_string());
        }
        (0 | 4 | 1, _) => ("", ""),
        (2, 4) => ("[0, 2, 3, 1]", "[0, 3, 1, 2]"),
        (3, 5) => ("[0, 2, 3, 4, 1]", "[0, 4, 1, 2, 3]"),
        (2 | 3, r) => {
            return Err(format!(
                "memory_format channels_last{} needs a tensor of rank {}, got rank {r}",
                if format == 3 { "_3d" } else { "" },
                if format == 3 { 5 } else { 4 }
            ))
        }
        (m, _) => return Err(format!("memory format code {m} is not one Kiln knows")),
    };
    let b = &n.name;
    let mut v = o.val(x)?;
    if n.op == "clone" {
        v = o.emit(b, "clone", &[v]);
    }
    if to.is_empty() {
        return Ok(vec![o.emit_out(n, 0, "contiguous", &[v])]);
    }
    let p = o.emit(b, "permute", &[v, to.into()]);
    let c = o.emit(b, "contiguous", &[p]);
    Ok(vec![o.emit_out(n, 0, "permute", &[c, back.into()])])
}

/// Views by another name: the table's view with the node's arguments
/// spelled as it takes them.
fn view_alias(o: &mut Out, n: &Node) -> R {
    let x = n.tensor("self")?;
    let rank = o.meta(x)?.sizes.len() as i64;
    let v = o.val(x)?;
    let wrap = |d: i64| if d < 0 { d + rank } else { d };
    let (op, args) = match n.op.as_str() {
        "swapaxes" | "swapdims" => {
            let (a, b) = match (n.get("axis0"), n.get("dim0")) {
                (Some(_), _) => (n.int("axis0", 0)?, n.int("axis1", 0)?),
                _ => (n.int("dim0", 0)?, n.int("dim1", 0)?),
            };
            ("transpose", vec![v, a.to_string(), b.to_string()])
        }
        "mT" | "mH" | "adjoint" | "matrix_H" => {
            if rank < 2 {
                return Err(format!("{} needs a tensor of rank 2 or more", n.op));
            }
            ("transpose", vec![v, "-2".into(), "-1".into()])
        }
        "numpy_T" => {
            let p: Vec<i64> = (0..rank).rev().collect();
            ("permute", vec![v, ints(&p)])
        }
        "moveaxis" | "movedim" => {
            // `.int` takes one dimension each, `.intlist` several.
            let dims = |k: &str| -> Result<Vec<i64>, String> {
                Ok(match n.get(k) {
                    Some(A::Int(i)) => vec![wrap(*i)],
                    Some(A::Ints(v)) => v.iter().map(|&d| wrap(d)).collect(),
                    other => return Err(format!("argument `{k}` is {other:?}, not dimensions")),
                })
            };
            let (src, dst) = (dims("source")?, dims("destination")?);
            if src.len() != dst.len() || src.iter().chain(&dst).any(|&d| d < 0 || d >= rank.max(1))
            {
                return Err(format!(
                    "movedim: source {src:?} and destination {dst:?} do not match rank {rank}"
                ));
            }
            // Positions not named keep their order in the free slots.
            let mut perm = vec![-1i64; rank as usize];
            for (&s, &d) in src.iter().zip(&dst) {
                perm[d as usize] = s;
            }
            let mut rest = (0..rank).filter(|k| !src.contains(k));
            for p in perm.iter_mut().filter(|p| **p < 0) {
                *p = rest.next().unwrap_or(0);
            }
            ("permute", vec![v, ints(&perm)])
        }
        _ => {
            let size = n.ints("size", 0, &[])?;
            ("view", vec![v, ints(&size)])
        }
    };
    Ok(vec![o.emit_out(n, 0, op, &args)])
}

/// `_unsafe_index` / `_unsafe_index_put`: the checked ops (Kiln checks
/// indices either way).
fn unsafe_index(o: &mut Out, n: &Node) -> R {
    let (op, overload) = match n.op.as_str() {
        "_unsafe_index" => ("index", "Tensor"),
        _ => ("index_put", "default"),
    };
    let renamed = Node {
        op: op.into(),
        overload: overload.into(),
        name: n.name.clone(),
        args: n.args.clone(),
        outputs: n.outputs.clone(),
        trace: n.trace,
    };
    super::convert::call_table(o, &renamed).map_err(|e| e.to_string())
}

/// `sort.stable(self, *, stable, dim, descending)`: the table's `sort`
/// (stable whatever `stable` says, which only allows an unstable one).
fn sort_stable(o: &mut Out, n: &Node) -> R {
    if n.overload != "stable" {
        return super::convert::call_table(o, n).map_err(|e| e.to_string());
    }
    let x = o.val(n.tensor("self")?)?;
    let dim = n.int("dim", -1)?.to_string();
    let desc = n.bool("descending", false)?.to_string();
    Ok(o.emit_outs(n, 2, "sort", &[x, dim, desc]))
}
