//! The decompositions of the composite ops (`composite`), as ATen's own
//! decompositions compute them: convolution as an unfolded input times the
//! weight (the GPU compiler fuses the unfold into the product's operand
//! loads, so no column buffer exists), pooling as a reduction over
//! unfolded windows, batch norm as a per-channel scale and shift, the hard
//! activations as clamps. Each checks what eager checks first, naming the
//! op, so a bad call is refused as eager refuses it and not by a part.

use super::args::ArgsExt;
use crate::dtype::DType;
use crate::id::ValueId;
use crate::rule::{float, int, ints, t, Emit, R};
use crate::schema::Arg;

type A = [Arg<ValueId>];
type Out = R<Vec<ValueId>>;

fn one(v: ValueId) -> Out {
    Ok(vec![v])
}

/// The ops of one family at spatial rank 1, 2 and 3 (`conv1d`, `conv2d`,
/// `conv3d`): `f` with the rank.
macro_rules! by_rank {
    ($($f:ident => $one:ident, $two:ident, $three:ident;)*) => {$(
        pub fn $one(e: &mut dyn Emit, _: &str, a: &A) -> Out {
            $f(e, a, 1)
        }
        pub fn $two(e: &mut dyn Emit, _: &str, a: &A) -> Out {
            $f(e, a, 2)
        }
        pub fn $three(e: &mut dyn Emit, _: &str, a: &A) -> Out {
            $f(e, a, 3)
        }
    )*};
}

by_rank! {
    conv_nd => conv1d, conv2d, conv3d;
    conv_transpose_nd => conv_transpose1d, conv_transpose2d, conv_transpose3d;
    max_pool => max_pool1d, max_pool2d, max_pool3d;
    max_pool_with_indices => max_pool1d_with_indices, max_pool2d_with_indices, max_pool3d_with_indices;
    avg_pool => avg_pool1d, avg_pool2d, avg_pool3d;
    adaptive_avg_pool => adaptive_avg_pool1d, adaptive_avg_pool2d, adaptive_avg_pool3d;
    reflection_pad => reflection_pad1d, reflection_pad2d, reflection_pad3d;
    replication_pad => replication_pad1d, replication_pad2d, replication_pad3d;
    upsample_nearest => upsample_nearest1d, upsample_nearest2d, upsample_nearest3d;
    upsample_nearest_exact => upsample_nearest_exact1d, upsample_nearest_exact2d, upsample_nearest_exact3d;
    upsample_linear => upsample_linear1d, upsample_bilinear2d, upsample_trilinear3d;
}

fn usizes(v: &[usize]) -> Arg<ValueId> {
    Arg::IntList(v.iter().map(|&x| x as i64).collect())
}

fn reshape(e: &mut dyn Emit, v: ValueId, sizes: &[usize]) -> R<ValueId> {
    e.call("reshape", vec![t(v), usizes(sizes)])
}

/// List argument `i` with one entry per spatial dimension (`sp`); a single
/// entry stands for all (`stride=1`); empty gives `default`.
fn per_dim(a: &A, i: usize, sp: usize, what: &str, default: Option<&[i64]>) -> R<Vec<i64>> {
    let l = a.int_list(i)?;
    match (l.len(), default) {
        (0, Some(d)) => Ok(d.to_vec()),
        (1, _) => Ok(vec![l[0]; sp]),
        (k, _) if k == sp => Ok(l.to_vec()),
        _ => Err(format!("{what} must have 1 or {sp} entries, got {l:?}")),
    }
}

/// `per_dim` of sizes that must be positive (strides, dilations).
fn positive_dims(a: &A, i: usize, sp: usize, what: &str) -> R<Vec<usize>> {
    positive(&per_dim(a, i, sp, what, None)?, what)
}

/// `per_dim` of sizes that may be 0 (paddings).
fn padding_dims(a: &A, i: usize, sp: usize, what: &str) -> R<Vec<usize>> {
    non_negative(&per_dim(a, i, sp, what, None)?, what)
}

fn positive(v: &[i64], what: &str) -> R<Vec<usize>> {
    v.iter()
        .map(|&x| {
            usize::try_from(x)
                .ok()
                .filter(|&x| x > 0)
                .ok_or_else(|| format!("{what} must be positive, got {v:?}"))
        })
        .collect()
}

fn non_negative(v: &[i64], what: &str) -> R<Vec<usize>> {
    v.iter()
        .map(|&x| usize::try_from(x).map_err(|_| format!("{what} must be non-negative, got {v:?}")))
        .collect()
}

fn floats_only(e: &dyn Emit, v: ValueId, what: &str) -> R<()> {
    match e.dtype(v) {
        DType::F32 | DType::F16 => Ok(()),
        d => Err(format!(
            "{what} of {} is not supported (floats are)",
            d.name()
        )),
    }
}

/// `[C]` per-channel values shaped to broadcast along dimension 1 of a
/// rank-`rank` tensor.
fn channel(e: &mut dyn Emit, v: ValueId, c: usize, rank: usize) -> R<ValueId> {
    if rank <= 2 {
        return Ok(v);
    }
    let mut s = vec![c];
    s.resize(rank - 1, 1);
    reshape(e, v, &s)
}

// ---------------------------------------------------------------- windows

/// A pooling or convolution window along one dimension.
#[derive(Clone, Copy, Debug)]
struct Window {
    size: usize,
    kernel: usize,
    stride: usize,
    pad: usize,
    dilation: usize,
}

impl Window {
    fn span(&self) -> usize {
        self.dilation * (self.kernel - 1) + 1
    }

    /// Positions a window starts at, ATen's `pooling_output_shape`.
    fn outputs(&self, ceil: bool) -> R<usize> {
        let avail = self.size + 2 * self.pad;
        if avail < self.span() {
            return Err(format!(
                "a window of {} is larger than the padded input ({avail})",
                self.span()
            ));
        }
        let mut out =
            (avail - self.span() + if ceil { self.stride - 1 } else { 0 }) / self.stride + 1;
        if ceil && (out - 1) * self.stride >= self.size + self.pad {
            out -= 1;
        }
        Ok(out)
    }
}

/// `v` padded with `value` and unfolded into `outs` windows along each of
/// its last `ws.len()` dimensions: the window elements become new trailing
/// dimensions (`[..., o1, o2, k1, k2]`).
fn unfold_windows(
    e: &mut dyn Emit,
    mut v: ValueId,
    ws: &[Window],
    outs: &[usize],
    value: f64,
) -> R<ValueId> {
    let (sp, rank) = (ws.len(), e.rank(v));
    // Right padding: enough for the last window (ceil mode), at least the
    // left padding.
    let rights: Vec<usize> = ws
        .iter()
        .zip(outs)
        .map(|(w, &out)| {
            let need = (out - 1) * w.stride + w.span();
            need.saturating_sub(w.size + w.pad).max(w.pad)
        })
        .collect();
    if ws.iter().zip(&rights).any(|(w, &r)| w.pad > 0 || r > 0) {
        let mut pads = vec![];
        for (w, &r) in ws.iter().zip(&rights).rev() {
            pads.push(w.pad as i64);
            pads.push(r as i64);
        }
        v = e.call("constant_pad_nd", vec![t(v), ints(&pads), float(value)])?;
    }
    for (i, (w, &out)) in ws.iter().zip(outs).enumerate() {
        let d = (rank - sp + i) as i64;
        v = e.call(
            "unfold",
            vec![t(v), int(d), int(w.span() as i64), int(w.stride as i64)],
        )?;
        // Right padding may leave room for more windows than eager has.
        let have = (w.size + w.pad + rights[i] - w.span()) / w.stride + 1;
        if have > out {
            v = e.call("narrow", vec![t(v), int(d), int(0), int(out as i64)])?;
        }
        if w.dilation > 1 {
            let last = (rank + i) as i64;
            v = e.call(
                "slice",
                vec![
                    t(v),
                    int(last),
                    int(0),
                    int(w.span() as i64),
                    int(w.dilation as i64),
                ],
            )?;
        }
    }
    Ok(v)
}

/// The trailing window dimensions of `unfold_windows`' result.
fn window_dims(sp: usize) -> Arg<ValueId> {
    ints(&(1..=sp as i64).map(|i| -i).collect::<Vec<_>>())
}

// ------------------------------------------------------------ convolution

/// How a convolution pads.
enum Padding {
    Explicit(Vec<usize>),
    Same,
    Valid,
}

/// A convolution's arguments after `conv2d`, `conv_transpose2d`, ...
/// brought them to `convolution`'s.
struct Conv {
    sp: usize,
    stride: Vec<usize>,
    padding: Padding,
    dilation: Vec<usize>,
    transposed: bool,
    output_padding: Vec<usize>,
    groups: usize,
}

/// Argument 4 of `conv2d` and `conv2d.padding`: sizes or `same`/`valid`.
fn padding_arg(a: &A, sp: usize, op: &str) -> R<Padding> {
    match a.get(4) {
        Some(Arg::Str(s)) if s == "same" => Ok(Padding::Same),
        Some(Arg::Str(s)) if s == "valid" => Ok(Padding::Valid),
        Some(Arg::Str(s)) => Err(format!(
            "{op}: invalid padding string '{s}' (it takes 'same' or 'valid')"
        )),
        _ => Ok(Padding::Explicit(padding_dims(a, 4, sp, "padding")?)),
    }
}

fn conv_nd(e: &mut dyn Emit, a: &A, sp: usize) -> Out {
    let op = format!("conv{sp}d");
    let c = Conv {
        sp,
        stride: positive_dims(a, 3, sp, "stride")?,
        padding: padding_arg(a, sp, &op)?,
        dilation: positive_dims(a, 5, sp, "dilation")?,
        transposed: false,
        output_padding: vec![0; sp],
        groups: groups(a.int(6)?)?,
    };
    conv(e, a, &c, &op)
}

fn groups(g: i64) -> R<usize> {
    usize::try_from(g)
        .ok()
        .filter(|&g| g > 0)
        .ok_or_else(|| format!("non-positive groups is not supported (got {g})"))
}

fn conv_transpose_nd(e: &mut dyn Emit, a: &A, sp: usize) -> Out {
    let c = Conv {
        sp,
        stride: positive_dims(a, 3, sp, "stride")?,
        padding: Padding::Explicit(padding_dims(a, 4, sp, "padding")?),
        output_padding: padding_dims(a, 5, sp, "output_padding")?,
        groups: groups(a.int(6)?)?,
        dilation: positive_dims(a, 7, sp, "dilation")?,
        transposed: true,
    };
    conv(e, a, &c, &format!("conv_transpose{sp}d"))
}

/// `convolution(input, weight, bias, stride, padding, dilation,
/// transposed, output_padding, groups)`.
pub fn convolution(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let w = *a.tensor(1)?;
    let sp = e.rank(w).saturating_sub(2).max(1);
    let c = Conv {
        sp,
        stride: positive_dims(a, 3, sp, "stride")?,
        padding: Padding::Explicit(padding_dims(a, 4, sp, "padding")?),
        dilation: positive_dims(a, 5, sp, "dilation")?,
        transposed: a.bool(6)?,
        output_padding: padding_dims(a, 7, sp, "output_padding")?,
        groups: groups(a.int(8)?)?,
    };
    conv(e, a, &c, "convolution")
}

/// Every convolution: `a` holds input, weight and bias first.
fn conv(e: &mut dyn Emit, a: &A, c: &Conv, op: &str) -> Out {
    let (x, w) = (*a.tensor(0)?, *a.tensor(1)?);
    let bias = a.opt_tensor(2)?.copied();
    let sp = c.sp;
    let (xs, wsz) = (e.sizes(x), e.sizes(w));
    if wsz.len() != sp + 2 {
        return Err(format!(
            "{op}: expected a weight of rank {}, got sizes {wsz:?}",
            sp + 2
        ));
    }
    let batched = match xs.len() {
        r if r == sp + 2 => true,
        r if r == sp + 1 => false,
        _ => {
            return Err(format!(
                "{op}: expected a {}D (unbatched) or {}D (batched) input, got sizes {xs:?}",
                sp + 1,
                sp + 2
            ))
        }
    };
    floats_only(e, x, op)?;
    if e.dtype(x) != e.dtype(w) || bias.is_some_and(|b| e.dtype(b) != e.dtype(x)) {
        return Err(format!(
            "{op}: input type ({}) and weight type ({}) should be the same",
            e.dtype(x).name(),
            e.dtype(w).name()
        ));
    }
    // f16 as eager computes it: in f32, the bias included, rounded once.
    let half = e.dtype(x) == DType::F16;
    let (x, w, bias) = if half {
        let b = match bias {
            Some(b) => Some(e.cast(b, DType::F32)?),
            None => None,
        };
        (e.cast(x, DType::F32)?, e.cast(w, DType::F32)?, b)
    } else {
        (x, w, bias)
    };
    let mut v = x;
    let mut sizes = xs.clone();
    if !batched {
        v = e.call("unsqueeze", vec![t(v), int(0)])?;
        sizes.insert(0, 1);
    }
    let (mut wv, mut w_sizes) = (w, wsz.clone());
    let mut stride = c.stride.clone();
    let mut explicit = None;
    if c.transposed {
        let (xv, ws, wt, pads) = transpose_as_conv(e, v, &mut sizes, w, &wsz, c, op)?;
        v = xv;
        w_sizes = ws;
        wv = wt;
        explicit = Some(pads);
        stride = vec![1; sp];
    }
    let kernel = w_sizes[2..].to_vec();
    let (batch, ch, o_ch) = (sizes[0], sizes[1], w_sizes[0]);
    let g = c.groups;
    if ch != w_sizes[1] * g || o_ch % g != 0 {
        return Err(format!(
            "{op}: given groups={g}, weight of size {wsz:?}, expected input {sizes:?} to have {} \
             channels, but got {ch} channels instead",
            w_sizes[1] * g
        ));
    }
    if let Some(b) = bias {
        if e.sizes(b) != [o_ch] {
            return Err(format!(
                "{op}: a bias of sizes {:?} for {o_ch} output channels",
                e.sizes(b)
            ));
        }
    }
    // Padding per dimension (left, right); `same` puts the odd one right.
    let pads: Vec<(usize, usize)> = match (explicit, &c.padding) {
        (Some(p), _) => p,
        (None, Padding::Valid) => vec![(0, 0); sp],
        (None, Padding::Same) => {
            if stride.iter().any(|&s| s != 1) {
                return Err(format!(
                    "{op}: padding='same' is not supported for strided convolutions"
                ));
            }
            (0..sp)
                .map(|i| {
                    let total = c.dilation[i] * (kernel[i] - 1);
                    (total / 2, total - total / 2)
                })
                .collect()
        }
        (None, Padding::Explicit(p)) => p.iter().map(|&p| (p, p)).collect(),
    };
    let ws: Vec<Window> = (0..sp)
        .map(|i| {
            let (l, r) = pads[i];
            Window {
                size: sizes[2 + i] + l + r - 2 * l.min(r),
                kernel: kernel[i],
                stride: stride[i],
                pad: l.min(r),
                dilation: c.dilation[i],
            }
        })
        .collect();
    if ws.iter().any(|w| w.kernel == 0) {
        return Err(format!("{op}: a weight with a zero-sized kernel {wsz:?}"));
    }
    // Asymmetric (`same`) padding: the extra column padded first.
    if pads.iter().any(|(l, r)| l != r) {
        let mut p = vec![];
        for (l, r) in pads.iter().rev() {
            p.push((l - l.min(r)) as i64);
            p.push((r - l.min(r)) as i64);
        }
        v = e.call("constant_pad_nd", vec![t(v), ints(&p), float(0.0)])?;
    }
    let outs = ws
        .iter()
        .map(|w| w.outputs(false))
        .collect::<R<Vec<_>>>()
        .map_err(|m| format!("{op}: {m}"))?;
    let l: usize = outs.iter().product();
    let k: usize = w_sizes[1] * kernel.iter().product::<usize>();
    let pointwise = ws
        .iter()
        .all(|w| w.kernel == 1 && w.stride == 1 && w.pad == 0);
    let mut out_shape = vec![batch, o_ch];
    out_shape.extend(&outs);
    let mut r = if g > 1 && g == ch && !pointwise {
        depthwise(e, v, wv, &ws, &outs, &kernel, o_ch / g, &out_shape)?
    } else {
        let cols = columns(e, v, &ws, &outs, pointwise, g, k, l)?;
        let w_shape = if g == 1 {
            vec![o_ch, k]
        } else {
            vec![g, o_ch / g, k]
        };
        let w2 = reshape(e, wv, &w_shape)?;
        let prod = e.call("matmul", vec![t(w2), t(cols)])?;
        reshape(e, prod, &out_shape)?
    };
    if let Some(b) = bias {
        let bc = channel(e, b, o_ch, sp + 2)?;
        r = e.call("add", vec![t(r), t(bc)])?;
    }
    if !batched {
        r = e.call("squeeze", vec![t(r), int(0)])?;
    }
    if half {
        r = e.cast(r, DType::F16)?;
    }
    one(r)
}

/// A depthwise convolution (one input channel per group, `m` outputs
/// each): the windows times the weight, summed over the window, so the
/// GPU compiler makes it one reduction reading the input through the
/// unfold (a matrix product per channel would be one row each).
#[allow(clippy::too_many_arguments)]
fn depthwise(
    e: &mut dyn Emit,
    v: ValueId,
    w: ValueId,
    ws: &[Window],
    outs: &[usize],
    kernel: &[usize],
    m: usize,
    out_shape: &[usize],
) -> R<ValueId> {
    let sp = ws.len();
    let c = e.sizes(v)[1];
    // [N, C, 1, o..., k...] * [1, C, m, 1..., k...].
    let u = unfold_windows(e, v, ws, outs, 0.0)?;
    let u = e.call("unsqueeze", vec![t(u), int(2)])?;
    let mut w_shape = vec![1, c, m];
    w_shape.extend(std::iter::repeat_n(1, sp));
    w_shape.extend_from_slice(kernel);
    let w = reshape(e, w, &w_shape)?;
    let p = e.call("mul", vec![t(u), t(w)])?;
    let s = e.call("sum", vec![t(p), window_dims(sp)])?;
    reshape(e, s, out_shape)
}

/// The input as the columns of a convolution's product: `[N, (G,) C/G *
/// k, L]`.
#[allow(clippy::too_many_arguments)]
fn columns(
    e: &mut dyn Emit,
    v: ValueId,
    ws: &[Window],
    outs: &[usize],
    pointwise: bool,
    g: usize,
    k: usize,
    l: usize,
) -> R<ValueId> {
    let sp = ws.len();
    let batch = e.sizes(v)[0];
    let cols_shape = if g == 1 {
        vec![batch, k, l]
    } else {
        vec![batch, g, k, l]
    };
    if pointwise {
        return reshape(e, v, &cols_shape);
    }
    let u = unfold_windows(e, v, ws, outs, 0.0)?;
    // [N, C, o..., k...] -> [N, C, k..., o...].
    let mut perm: Vec<i64> = vec![0, 1];
    perm.extend((2 + sp..2 + 2 * sp).map(|d| d as i64));
    perm.extend((2..2 + sp).map(|d| d as i64));
    let p = e.call("permute", vec![t(u), ints(&perm)])?;
    reshape(e, p, &cols_shape)
}

/// The input, the weight's sizes and value, and the padding of a
/// transposed convolution rewritten as a convolution.
type AsConv = (ValueId, Vec<usize>, ValueId, Vec<(usize, usize)>);

/// A transposed convolution as a convolution: the input with `stride - 1`
/// zeros between elements, padded by `dilation (k - 1) - padding` (plus
/// `output_padding` on the right; cropped where negative), and the weight
/// flipped with its channel roles swapped per group.
fn transpose_as_conv(
    e: &mut dyn Emit,
    mut v: ValueId,
    sizes: &mut [usize],
    w: ValueId,
    w_sizes: &[usize],
    c: &Conv,
    op: &str,
) -> R<AsConv> {
    let sp = c.sp;
    let Padding::Explicit(padding) = &c.padding else {
        return Err(format!("{op}: padding must be sizes"));
    };
    let (cin, cout_g, g) = (w_sizes[0], w_sizes[1], c.groups);
    if cin != sizes[1] || cin % g != 0 {
        return Err(format!(
            "{op}: given transposed=1, weight of size {w_sizes:?}, expected input {sizes:?} to \
             have {cin} channels, but got {} channels instead",
            sizes[1]
        ));
    }
    let dtype = e.dtype(v);
    let mut pads = vec![];
    for i in 0..sp {
        let d = 2 + i;
        let s = c.stride[i];
        if c.output_padding[i] >= s.max(c.dilation[i]) {
            return Err(format!(
                "{op}: output padding must be smaller than either stride or dilation"
            ));
        }
        if s > 1 && sizes[d] > 0 {
            // [.., L, ..] -> [.., L, s, ..] with zeros after each element.
            let mut zs: Vec<usize> = sizes[..=d].to_vec();
            zs.push(s - 1);
            zs.extend_from_slice(&sizes[d + 1..]);
            let z = e.call("zeros", vec![usizes(&zs), Arg::Dtype(dtype)])?;
            let u = e.call("unsqueeze", vec![t(v), int(d as i64 + 1)])?;
            let cat = e.call(
                "cat",
                vec![Arg::TensorList(vec![Some(u), Some(z)]), int(d as i64 + 1)],
            )?;
            let mut merged = sizes.to_vec();
            merged[d] *= s;
            let r = reshape(e, cat, &merged)?;
            let len = (sizes[d] - 1) * s + 1;
            v = e.call("narrow", vec![t(r), int(d as i64), int(0), int(len as i64)])?;
            sizes[d] = len;
        }
        let span = (c.dilation[i] * (w_sizes[2 + i].max(1) - 1)) as i64;
        let (l, r) = (
            span - padding[i] as i64,
            span - padding[i] as i64 + c.output_padding[i] as i64,
        );
        if l < 0 || r < 0 {
            // Negative padding crops.
            let (cl, cr) = ((-l).max(0) as usize, (-r).max(0) as usize);
            if cl + cr >= sizes[d] {
                return Err(format!("{op}: the padding leaves no output"));
            }
            let len = sizes[d] - cl - cr;
            v = e.call(
                "narrow",
                vec![t(v), int(d as i64), int(cl as i64), int(len as i64)],
            )?;
            sizes[d] = len;
        }
        pads.push((l.max(0) as usize, r.max(0) as usize));
    }
    // [Cin, Cout/G, k...] -> flipped, [G, Cin/G, Cout/G, k...] with the
    // channel roles swapped -> [Cout, Cin/G, k...].
    let spatial: Vec<i64> = (2..2 + sp as i64).collect();
    let f = e.call("flip", vec![t(w), ints(&spatial)])?;
    let mut g_shape = vec![g, cin / g, cout_g];
    g_shape.extend_from_slice(&w_sizes[2..]);
    let r = reshape(e, f, &g_shape)?;
    let tr = e.call("transpose", vec![t(r), int(1), int(2)])?;
    let mut new_sizes = vec![g * cout_g, cin / g];
    new_sizes.extend_from_slice(&w_sizes[2..]);
    let wt = reshape(e, tr, &new_sizes)?;
    Ok((v, new_sizes, wt, pads))
}

// ---------------------------------------------------------------- pooling

/// A pool's input checked (rank `sp + 1` or `sp + 2`, floats), its
/// windows and output sizes.
struct Pool {
    x: ValueId,
    sp: usize,
    ws: Vec<Window>,
    outs: Vec<usize>,
}

fn pool(
    e: &mut dyn Emit,
    a: &A,
    sp: usize,
    op: &str,
    dilation: Option<usize>,
    ceil: bool,
) -> R<Pool> {
    let x = *a.tensor(0)?;
    let sizes = e.sizes(x);
    if sizes.len() != sp + 1 && sizes.len() != sp + 2 {
        return Err(format!(
            "{op}: expected {}D or {}D input, got sizes {sizes:?}",
            sp + 1,
            sp + 2
        ));
    }
    floats_only(e, x, op)?;
    let k = positive_dims(a, 1, sp, "kernel_size")?;
    let s = positive(
        &per_dim(
            a,
            2,
            sp,
            "stride",
            Some(&k.iter().map(|&x| x as i64).collect::<Vec<_>>()),
        )?,
        "stride",
    )?;
    let p = padding_dims(a, 3, sp, "padding")?;
    let d = match dilation {
        Some(i) => positive(&per_dim(a, i, sp, "dilation", None)?, "dilation")?,
        None => vec![1; sp],
    };
    let at = sizes.len() - sp;
    let ws: Vec<Window> = (0..sp)
        .map(|i| Window {
            size: sizes[at + i],
            kernel: k[i],
            stride: s[i],
            pad: p[i],
            dilation: d[i],
        })
        .collect();
    if ws.iter().any(|w| w.pad * 2 > w.kernel) {
        return Err(format!(
            "{op}: pad should be at most half of effective kernel size, but got pad={p:?}, \
             kernel_size={k:?}"
        ));
    }
    let outs = ws
        .iter()
        .map(|w| w.outputs(ceil))
        .collect::<R<Vec<_>>>()
        .map_err(|m| format!("{op}: {m}"))?;
    Ok(Pool { x, sp, ws, outs })
}

fn max_pool(e: &mut dyn Emit, a: &A, sp: usize) -> Out {
    let p = pool(e, a, sp, &format!("max_pool{sp}d"), Some(4), a.bool(5)?)?;
    let u = unfold_windows(e, p.x, &p.ws, &p.outs, f64::NEG_INFINITY)?;
    one(e.call("amax", vec![t(u), window_dims(p.sp)])?)
}

/// `max_pool2d_with_indices`: the maxima, and where each was in the
/// input (the flat index into its spatial dimensions, as ATen gives it):
/// `max.dim` over the flattened window gives the element within the
/// window, `arange`s of the output positions place it.
fn max_pool_with_indices(e: &mut dyn Emit, a: &A, sp: usize) -> Out {
    let p = pool(
        e,
        a,
        sp,
        &format!("max_pool{sp}d_with_indices"),
        Some(4),
        a.bool(5)?,
    )?;
    let u = unfold_windows(e, p.x, &p.ws, &p.outs, f64::NEG_INFINITY)?;
    let sizes = e.sizes(u);
    let mut flat: Vec<usize> = sizes[..sizes.len() - sp].to_vec();
    flat.push(p.ws.iter().map(|w| w.kernel).product());
    let u = reshape(e, u, &flat)?;
    let r = e.call_all("max", vec![t(u), int(-1)])?;
    let (vals, mut rest) = (r[0], r[1]);
    let xs = e.sizes(p.x);
    let at = xs.len() - sp;
    let mut index: Option<ValueId> = None;
    let mut plane = 1i64;
    for i in (0..sp).rev() {
        let w = p.ws[i];
        let k = w.kernel as i64;
        let j = e.call("remainder", vec![t(rest), int(k)])?;
        rest = e.call("floor_divide", vec![t(rest), int(k)])?;
        // Output positions along dimension i, shaped to broadcast.
        let o = e.call(
            "arange",
            vec![int(p.outs[i] as i64), Arg::Dtype(DType::I64)],
        )?;
        let mut shape = vec![p.outs[i]];
        shape.extend(std::iter::repeat_n(1, sp - 1 - i));
        let o = reshape(e, o, &shape)?;
        let start = e.call("mul", vec![t(o), int(w.stride as i64)])?;
        let start = e.call("sub", vec![t(start), int(w.pad as i64)])?;
        let off = e.call("mul", vec![t(j), int(w.dilation as i64)])?;
        let pos = e.call("add", vec![t(off), t(start)])?;
        let term = e.call("mul", vec![t(pos), int(plane)])?;
        index = Some(match index {
            None => term,
            Some(acc) => e.call("add", vec![t(acc), t(term)])?,
        });
        plane *= xs[at + i] as i64;
    }
    let index = index.ok_or("internal error: a pool without dimensions")?;
    Ok(vec![vals, e.call("clone", vec![t(index)])?])
}

/// `avg_pool1d(self, kernel_size, stride, padding, ceil_mode,
/// count_include_pad)`; 2-d and 3-d add `divisor_override`.
fn avg_pool(e: &mut dyn Emit, a: &A, sp: usize) -> Out {
    let ceil = a.bool(4)?;
    let include_pad = a.bool(5)?;
    let p = pool(e, a, sp, &format!("avg_pool{sp}d"), None, ceil)?;
    let u = unfold_windows(e, p.x, &p.ws, &p.outs, 0.0)?;
    let sum = e.call("sum", vec![t(u), window_dims(sp)])?;
    if let Some(d) = a.opt_int(6).ok().flatten() {
        if d == 0 {
            return Err(format!("avg_pool{sp}d: divisor must be not zero"));
        }
        return one(e.call("div", vec![t(sum), int(d)])?);
    }
    // ATen's divisor per output position: the window clipped to the padded
    // input (or to the input without `count_include_pad`).
    let per_dim: Vec<Vec<usize>> =
        p.ws.iter()
            .zip(&p.outs)
            .map(|(w, &out)| {
                (0..out)
                    .map(|i| {
                        let start = (i * w.stride) as i64 - w.pad as i64;
                        let end = (start + w.kernel as i64).min((w.size + w.pad) as i64);
                        let (s, en) = (start.max(0), end.min(w.size as i64));
                        (if include_pad { end - start } else { en - s }) as usize
                    })
                    .collect()
            })
            .collect();
    if per_dim
        .iter()
        .all(|d| d.iter().all(|&x| x == per_dim[0][0]))
    {
        let d: usize = per_dim.iter().map(|d| d[0]).product();
        return one(e.call("div", vec![t(sum), int(d as i64)])?);
    }
    // Unequal divisors: the same windows summed over ones (the padded
    // extent counting as input with `count_include_pad`).
    let dtype = e.dtype(p.x);
    let (shape, ws): (Vec<usize>, Vec<Window>) = if include_pad {
        let ws: Vec<Window> =
            p.ws.iter()
                .map(|w| Window {
                    size: w.size + 2 * w.pad,
                    pad: 0,
                    ..*w
                })
                .collect();
        (ws.iter().map(|w| w.size).collect(), ws)
    } else {
        (p.ws.iter().map(|w| w.size).collect(), p.ws.clone())
    };
    let ones = e.call("ones", vec![usizes(&shape), Arg::Dtype(dtype)])?;
    let windows = unfold_windows(e, ones, &ws, &p.outs, 0.0)?;
    let counts = e.call("sum", vec![t(windows), window_dims(sp)])?;
    one(e.call("div", vec![t(sum), t(counts)])?)
}

/// Adaptive average pooling: the mean over the input (output 1), over
/// equal windows (sizes that divide), else a product per dimension with
/// the averaging matrix, made from `arange`s (ATen's windows
/// `[floor(j len / out), ceil((j + 1) len / out))`).
fn adaptive_avg_pool(e: &mut dyn Emit, a: &A, sp: usize) -> Out {
    let op = format!("adaptive_avg_pool{sp}d");
    let x = *a.tensor(0)?;
    let sizes = e.sizes(x);
    if sizes.len() != sp + 1 && sizes.len() != sp + 2 {
        return Err(format!(
            "{op}: expected {}D or {}D input, got sizes {sizes:?}",
            sp + 1,
            sp + 2
        ));
    }
    floats_only(e, x, &op)?;
    let at = sizes.len() - sp;
    let ins = sizes[at..].to_vec();
    let outs: Vec<usize> = per_dim(a, 1, sp, "output_size", None)?
        .iter()
        .zip(&ins)
        .map(|(&o, &i)| if o < 0 { i } else { o as usize })
        .collect();
    if outs.contains(&0) || ins.contains(&0) {
        return Err(format!(
            "{op}: empty input or output sizes ({sizes:?} to {outs:?})"
        ));
    }
    if outs.iter().all(|&s| s == 1) {
        return one(e.call("mean", vec![t(x), window_dims(sp), Arg::Bool(true)])?);
    }
    if ins.iter().zip(&outs).all(|(i, o)| i % o == 0) {
        let ws: Vec<Window> = ins
            .iter()
            .zip(&outs)
            .map(|(&i, &o)| Window {
                size: i,
                kernel: i / o,
                stride: i / o,
                pad: 0,
                dilation: 1,
            })
            .collect();
        let u = unfold_windows(e, x, &ws, &outs, 0.0)?;
        return one(e.call("mean", vec![t(u), window_dims(sp)])?);
    }
    let dtype = e.dtype(x);
    let mut v = x;
    for k in (0..sp).rev() {
        let (len, out) = (ins[k] as i64, outs[k] as i64);
        let j = e.call("arange", vec![int(out), Arg::Dtype(DType::I64)])?;
        let jl = e.call("mul", vec![t(j), int(len)])?;
        let start = e.call("floor_divide", vec![t(jl), int(out)])?;
        let jl1 = e.call("add", vec![t(jl), int(len + out - 1)])?;
        let end = e.call("floor_divide", vec![t(jl1), int(out)])?;
        let i = e.call("arange", vec![int(len), Arg::Dtype(DType::I64)])?;
        let i = reshape(e, i, &[len as usize, 1])?;
        let ge = e.call("ge", vec![t(i), t(start)])?;
        let lt = e.call("lt", vec![t(i), t(end)])?;
        let inside = e.call("logical_and", vec![t(ge), t(lt)])?;
        let inside = e.call("_to_copy", vec![t(inside), Arg::Dtype(dtype)])?;
        let count = e.call("sub", vec![t(end), t(start)])?;
        let count = e.call("_to_copy", vec![t(count), Arg::Dtype(dtype)])?;
        let mat = e.call("div", vec![t(inside), t(count)])?;
        let d = (at + k) as i64;
        let last = sizes.len() as i64 - 1;
        // Bring dimension k last, multiply, put it back.
        let tr = if d == last {
            v
        } else {
            e.call("transpose", vec![t(v), int(d), int(last)])?
        };
        let p = e.call("matmul", vec![t(tr), t(mat)])?;
        v = if d == last {
            p
        } else {
            e.call("transpose", vec![t(p), int(d), int(last)])?
        };
    }
    // Contiguous, as eager's result is (a later `view` depends on it).
    if e.meta(v).is_contiguous() {
        one(e.call("clone", vec![t(v)])?)
    } else {
        one(e.call("contiguous", vec![t(v)])?)
    }
}

// ----------------------------------------------------------- normalization

/// ATen: `scale = weight / sqrt(var + eps)`, `shift = bias - mean * scale`,
/// `x * scale + shift` per channel (dimension 1).
#[allow(clippy::too_many_arguments)]
fn normalize(
    e: &mut dyn Emit,
    x: ValueId,
    mean: ValueId,
    var: ValueId,
    weight: Option<ValueId>,
    bias: Option<ValueId>,
    eps: f64,
) -> R<ValueId> {
    let sizes = e.sizes(x);
    let (c, rank) = (sizes[1], sizes.len());
    let ve = e.call("add", vec![t(var), float(eps)])?;
    let mut scale = e.call("rsqrt", vec![t(ve)])?;
    if let Some(w) = weight {
        scale = e.call("mul", vec![t(w), t(scale)])?;
    }
    let ms = e.call("mul", vec![t(mean), t(scale)])?;
    let shift = match bias {
        Some(b) => e.call("sub", vec![t(b), t(ms)])?,
        None => e.call("neg", vec![t(ms)])?,
    };
    let scale = channel(e, scale, c, rank)?;
    let shift = channel(e, shift, c, rank)?;
    let y = e.call("mul", vec![t(x), t(scale)])?;
    e.call("add", vec![t(y), t(shift)])
}

fn channels(e: &dyn Emit, x: ValueId, op: &str, stats: &[Option<ValueId>]) -> R<usize> {
    let sizes = e.sizes(x);
    if sizes.len() < 2 {
        return Err(format!(
            "{op}: expected an input of at least 2 dimensions (N, C, ...), got sizes {sizes:?}"
        ));
    }
    floats_only(e, x, op)?;
    for s in stats.iter().flatten() {
        if e.sizes(*s) != [sizes[1]] {
            return Err(format!(
                "{op}: a per-channel argument of sizes {:?} for {} channels",
                e.sizes(*s),
                sizes[1]
            ));
        }
    }
    Ok(sizes[1])
}

/// `batch_norm(input, weight, bias, running_mean, running_var, training,
/// momentum, eps, cudnn_enabled)`.
pub fn batch_norm(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let x = *a.tensor(0)?;
    let (w, b) = (a.opt_tensor(1)?.copied(), a.opt_tensor(2)?.copied());
    let (rm, rv) = (a.opt_tensor(3)?.copied(), a.opt_tensor(4)?.copied());
    channels(e, x, "batch_norm", &[w, b, rm, rv])?;
    let eps = a.float(7)?;
    if !a.bool(5)? {
        let (Some(rm), Some(rv)) = (rm, rv) else {
            return Err(
                "batch_norm: running_mean and running_var must be defined in evaluation mode"
                    .into(),
            );
        };
        return one(normalize(e, x, rm, rv, w, b, eps)?);
    }
    if rm.is_some() || rv.is_some() {
        return Err(
            "batch_norm in training mode writes running_mean and running_var in place, which \
             this functional op cannot: pass none for them and update them with copy_ (the \
             import writes the update)"
                .into(),
        );
    }
    let rank = e.rank(x) as i64;
    let dims: Vec<i64> = std::iter::once(0).chain(2..rank).collect();
    let mean = e.call("mean", vec![t(x), ints(&dims)])?;
    let var = e.call("var", vec![t(x), ints(&dims), int(0)])?;
    one(normalize(e, x, mean, var, w, b, eps)?)
}

/// `_native_batch_norm_legit_no_training(input, weight, bias,
/// running_mean, running_var, momentum, eps)`: the result and two empty
/// saved statistics.
pub fn native_batch_norm_eval(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let x = *a.tensor(0)?;
    let (w, b) = (a.opt_tensor(1)?.copied(), a.opt_tensor(2)?.copied());
    let (rm, rv) = (*a.tensor(3)?, *a.tensor(4)?);
    channels(
        e,
        x,
        "_native_batch_norm_legit_no_training",
        &[w, b, Some(rm), Some(rv)],
    )?;
    let y = normalize(e, x, rm, rv, w, b, a.float(6)?)?;
    let dtype = e.dtype(x);
    let empty = e.call("zeros", vec![usizes(&[0]), Arg::Dtype(dtype)])?;
    let empty2 = e.call("zeros", vec![usizes(&[0]), Arg::Dtype(dtype)])?;
    Ok(vec![y, empty, empty2])
}

/// `group_norm(input, num_groups, weight, bias, eps, cudnn_enabled)`:
/// statistics over each group of channels and the spatial dimensions, then
/// the per-channel affine.
pub fn group_norm(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let x = *a.tensor(0)?;
    let (w, b) = (a.opt_tensor(2)?.copied(), a.opt_tensor(3)?.copied());
    let c = channels(e, x, "group_norm", &[w, b])?;
    let sizes = e.sizes(x);
    let g = usize::try_from(a.int(1)?).unwrap_or(0);
    if g == 0 || c % g != 0 {
        return Err(format!(
            "group_norm: expected number of channels in input to be divisible by num_groups, \
             but got input of sizes {sizes:?} and num_groups={}",
            a.int(1)?
        ));
    }
    let batch = sizes[0];
    let per = sizes.iter().product::<usize>() / (batch * g).max(1);
    let grouped = reshape(e, x, &[batch, g, per])?;
    let mean = e.call("mean", vec![t(grouped), ints(&[-1]), Arg::Bool(true)])?;
    let var = e.call(
        "var",
        vec![t(grouped), ints(&[-1]), int(0), Arg::Bool(true)],
    )?;
    let ve = e.call("add", vec![t(var), float(a.float(4)?)])?;
    let r = e.call("rsqrt", vec![t(ve)])?;
    let d = e.call("sub", vec![t(grouped), t(mean)])?;
    let nrm = e.call("mul", vec![t(d), t(r)])?;
    let mut y = reshape(e, nrm, &sizes)?;
    if let Some(w) = w {
        let w = channel(e, w, c, sizes.len())?;
        y = e.call("mul", vec![t(y), t(w)])?;
    }
    if let Some(b) = b {
        let b = channel(e, b, c, sizes.len())?;
        y = e.call("add", vec![t(y), t(b)])?;
    }
    one(y)
}

/// `rms_norm(input, normalized_shape, weight, eps)`:
/// `x * rsqrt(mean(x^2) + eps) * weight` over the normalized dimensions
/// (`eps` by default the dtype's machine epsilon).
pub fn rms_norm(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let x = *a.tensor(0)?;
    floats_only(e, x, "rms_norm")?;
    let shape = a.int_list(1)?.to_vec();
    let sizes = e.sizes(x);
    let k = shape.len();
    if k > sizes.len()
        || shape
            .iter()
            .zip(&sizes[sizes.len() - k..])
            .any(|(&s, &x)| s != x as i64)
    {
        return Err(format!(
            "rms_norm: normalized_shape {shape:?} is not the trailing sizes of the input {sizes:?}"
        ));
    }
    let weight = a.opt_tensor(2)?.copied();
    if let Some(w) = weight {
        if e.sizes(w)
            .iter()
            .map(|&s| s as i64)
            .ne(shape.iter().copied())
        {
            return Err(format!(
                "rms_norm: weight of sizes {:?} for normalized_shape {shape:?}",
                e.sizes(w)
            ));
        }
    }
    let eps = match a.get(3) {
        Some(Arg::Float(f)) => *f,
        _ if e.dtype(x) == DType::F16 => 0.0009765625,
        _ => f32::EPSILON as f64,
    };
    let dims: Vec<i64> = (1..=k as i64).map(|i| -i).collect();
    let sq = e.call("mul", vec![t(x), t(x)])?;
    let mean = e.call("mean", vec![t(sq), ints(&dims), Arg::Bool(true)])?;
    let pe = e.call("add", vec![t(mean), float(eps)])?;
    let r = e.call("rsqrt", vec![t(pe)])?;
    let y = e.call("mul", vec![t(x), t(r)])?;
    match weight {
        Some(w) => one(e.call("mul", vec![t(y), t(w)])?),
        None => one(y),
    }
}

/// The mean and `1 / sqrt(var + eps)` of `x` over `dims`, kept.
fn moments(e: &mut dyn Emit, x: ValueId, dims: &[i64], eps: f64) -> R<(ValueId, ValueId)> {
    let mean = e.call("mean", vec![t(x), ints(dims), Arg::Bool(true)])?;
    let var = e.call("var", vec![t(x), ints(dims), int(0), Arg::Bool(true)])?;
    let ve = e.call("add", vec![t(var), float(eps)])?;
    Ok((mean, e.call("rsqrt", vec![t(ve)])?))
}

/// `native_layer_norm(input, normalized_shape, weight, bias, eps)`: the
/// table's `layer_norm`, and the mean and reciprocal standard deviation
/// over the normalized dimensions (kept as size 1), as eager saves them.
pub fn native_layer_norm(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let x = *a.tensor(0)?;
    let k = a.int_list(1)?.len();
    let y = e.call(
        "layer_norm",
        vec![t(x), a[1].clone(), a[2].clone(), a[3].clone(), a[4].clone()],
    )?;
    let dims: Vec<i64> = (1..=k as i64).map(|i| -i).collect();
    let (mean, rstd) = moments(e, x, &dims, a.float(4)?)?;
    Ok(vec![y, mean, rstd])
}

/// `native_group_norm(input, weight, bias, N, C, HxW, group, eps)`: the
/// table's `group_norm`, and each (sample, group)'s mean and reciprocal
/// standard deviation, `[N, group]`.
pub fn native_group_norm(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let x = *a.tensor(0)?;
    let sizes = e.sizes(x);
    let (n, c, hw, g) = (a.int(3)?, a.int(4)?, a.int(5)?, a.int(6)?);
    let numel: usize = sizes.iter().product();
    if sizes.first().map(|&s| s as i64) != Some(n)
        || sizes.get(1).map(|&s| s as i64) != Some(c)
        || (n * c * hw) as usize != numel
    {
        return Err(format!(
            "native_group_norm: N={n}, C={c}, HxW={hw} do not describe an input of sizes {sizes:?}"
        ));
    }
    let y = e.call(
        "group_norm",
        vec![t(x), int(g), a[1].clone(), a[2].clone(), a[7].clone()],
    )?;
    let per = numel / (n * g).max(1) as usize;
    let grouped = reshape(e, x, &[n as usize, g as usize, per])?;
    let (mean, rstd) = moments(e, grouped, &[-1], a.float(7)?)?;
    let mean = reshape(e, mean, &[n as usize, g as usize])?;
    let rstd = reshape(e, rstd, &[n as usize, g as usize])?;
    Ok(vec![y, mean, rstd])
}

/// `_native_batch_norm_legit(input, weight, bias, running_mean,
/// running_var, training, momentum, eps)` and its `.no_stats` overload:
/// the result and the batch's per-channel mean and reciprocal standard
/// deviation (empty in evaluation mode, as eager's). Training with
/// running statistics writes them, which this functional op cannot: the
/// import writes the update with `copy_`.
pub fn native_batch_norm(e: &mut dyn Emit, overload: &str, a: &A) -> Out {
    let op = "_native_batch_norm_legit";
    let x = *a.tensor(0)?;
    let (w, b) = (a.opt_tensor(1)?.copied(), a.opt_tensor(2)?.copied());
    let (stats, rest) = if overload == "no_stats" {
        (None, 3)
    } else {
        (Some((*a.tensor(3)?, *a.tensor(4)?)), 5)
    };
    let (training, eps) = (a.bool(rest)?, a.float(rest + 2)?);
    channels(e, x, op, &[w, b, stats.map(|s| s.0), stats.map(|s| s.1)])?;
    if !training {
        let Some((rm, rv)) = stats else {
            return Err(format!(
                "{op}.no_stats: running_mean and running_var must be defined in evaluation mode"
            ));
        };
        let y = normalize(e, x, rm, rv, w, b, eps)?;
        let dtype = e.dtype(x);
        let empty = e.call("zeros", vec![usizes(&[0]), Arg::Dtype(dtype)])?;
        let empty2 = e.call("zeros", vec![usizes(&[0]), Arg::Dtype(dtype)])?;
        return Ok(vec![y, empty, empty2]);
    }
    if stats.is_some() {
        return Err(format!(
            "{op} in training mode writes running_mean and running_var in place, which this \
             functional op cannot: use the .no_stats overload and update them with copy_ (the \
             import writes the update)"
        ));
    }
    let rank = e.rank(x) as i64;
    let dims: Vec<i64> = std::iter::once(0).chain(2..rank).collect();
    let mean = e.call("mean", vec![t(x), ints(&dims)])?;
    let var = e.call("var", vec![t(x), ints(&dims), int(0)])?;
    let y = normalize(e, x, mean, var, w, b, eps)?;
    let ve = e.call("add", vec![t(var), float(eps)])?;
    let rstd = e.call("rsqrt", vec![t(ve)])?;
    Ok(vec![y, mean, rstd])
}

/// `native_dropout(input, p, train)`: in evaluation mode (or `p = 0`) the
/// input and an all-true mask; with `p = 1` zeros and an all-false mask.
/// Anything between draws random numbers, which a program Kiln compiles
/// does not.
pub fn native_dropout(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let x = *a.tensor(0)?;
    let p = a.float(1)?;
    let train = !matches!(a.get(2), Some(Arg::Bool(false)));
    if !(0.0..=1.0).contains(&p) {
        return Err(format!(
            "dropout probability has to be between 0 and 1, but got {p}"
        ));
    }
    let sizes = e.sizes(x);
    let keep_all = !train || p == 0.0;
    if keep_all || p == 1.0 {
        let y = if keep_all {
            e.call("clone", vec![t(x)])?
        } else {
            e.call("zeros_like", vec![t(x)])?
        };
        let mask = e.call(
            if keep_all { "ones" } else { "zeros" },
            vec![usizes(&sizes), Arg::Dtype(DType::Bool)],
        )?;
        return Ok(vec![y, mask]);
    }
    Err(format!(
        "native_dropout in training mode (p = {p}) draws random numbers, which Kiln does not; \
         export the model after model.eval()"
    ))
}

/// `any` / `all` (`.dim`, `.dims`): whether any (every) element is
/// non-zero, as the largest (smallest) truth value.
fn truth_reduce(e: &mut dyn Emit, overload: &str, a: &A, name: &str, extreme: &str) -> Out {
    let x = *a.tensor(0)?;
    let truth = if e.dtype(x) == DType::Bool {
        x
    } else {
        e.call("ne", vec![t(x), int(0)])?
    };
    let (dims, keep) = match overload {
        "" => (vec![], false),
        "dim" => (vec![a.int(1)?], a.bool(2)?),
        _ => (a.opt_int_list(1)?.unwrap_or(&[]).to_vec(), a.bool(2)?),
    };
    if e.sizes(x).contains(&0) {
        return Err(format!("{name} of an empty tensor is not supported"));
    }
    one(e.call(extreme, vec![t(truth), ints(&dims), Arg::Bool(keep)])?)
}

pub fn any(e: &mut dyn Emit, overload: &str, a: &A) -> Out {
    truth_reduce(e, overload, a, "any", "amax")
}

pub fn all(e: &mut dyn Emit, overload: &str, a: &A) -> Out {
    truth_reduce(e, overload, a, "all", "amin")
}

/// `scalar_tensor(s, dtype)`: a 0-d tensor (float unless told).
pub fn scalar_tensor(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let dtype = a.opt_dtype(1)?.unwrap_or(DType::F32);
    one(e.call("full", vec![usizes(&[]), a[0].clone(), Arg::Dtype(dtype)])?)
}

/// `empty` / `empty_strided`: values eager leaves unspecified; zeros here,
/// contiguous (Kiln's tensors are).
pub fn empty(e: &mut dyn Emit, overload: &str, a: &A) -> Out {
    let dtype_at = if overload == "memory_format" { 1 } else { 2 };
    let dtype = a.opt_dtype(dtype_at)?.unwrap_or(DType::F32);
    one(e.call("zeros", vec![a[0].clone(), Arg::Dtype(dtype)])?)
}

// ------------------------------------------------------------ scatters

/// `masked_scatter(self, mask, source)`: `self` with the positions `mask`
/// marks (broadcast to `self`) taken from `source`'s elements in order: a
/// running count of the mask picks each position's element.
pub fn masked_scatter(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let (x, mask, src) = (*a.tensor(0)?, *a.tensor(1)?, *a.tensor(2)?);
    if e.dtype(mask) != DType::Bool {
        return Err(format!(
            "masked_scatter_: expected BoolTensor for mask, got {}",
            e.dtype(mask)
        ));
    }
    if e.dtype(src) != e.dtype(x) {
        return Err(format!(
            "masked_scatter: expected self and source to have same dtypes but got {} and {}",
            e.dtype(x),
            e.dtype(src)
        ));
    }
    let sizes = e.sizes(x);
    let n: usize = sizes.iter().product();
    let k: usize = e.sizes(src).iter().product();
    let m = e.expand(mask, &sizes)?;
    if k == 0 || n == 0 {
        // Nothing to take (eager requires an all-false mask here).
        return one(e.call("clone", vec![t(x)])?);
    }
    let flat_m = reshape(e, m, &[n])?;
    let count = e.call("cumsum", vec![t(flat_m), int(0)])?;
    let before = e.call("sub", vec![t(count), int(1)])?;
    let at = e.call("clamp", vec![t(before), int(0), int(k as i64 - 1)])?;
    let flat_s = reshape(e, src, &[k])?;
    let picked = e.call("index_select", vec![t(flat_s), int(0), t(at)])?;
    let picked = reshape(e, picked, &sizes)?;
    one(e.call("where", vec![t(m), t(picked), t(x)])?)
}

/// `scatter_reduce.two(self, dim, index, src, reduce, include_self)`:
/// `sum` and `mean` through `scatter_add` (counts for the mean);
/// `amax`, `amin` and `prod` as a reduction over a comparison of each
/// index with every target position along `dim` (memory: index elements
/// times the target's length along `dim`).
pub fn scatter_reduce(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let (x, idx, src) = (*a.tensor(0)?, *a.tensor(2)?, *a.tensor(3)?);
    let reduce = a.opt_str(4)?.unwrap_or("sum").to_string();
    let include_self = a.bool(5)?;
    let xs = e.sizes(x);
    let is = e.sizes(idx);
    let rank = xs.len().max(1);
    let d = crate::meta::wrap_dim(a.int(1)?, rank)?;
    let ss = e.sizes(src);
    if is.len() != xs.len() || ss.len() != xs.len() {
        return Err(format!(
            "scatter_reduce: index (sizes {is:?}) and src (sizes {ss:?}) must have as many \
             dimensions as self (sizes {xs:?})"
        ));
    }
    for k in 0..is.len() {
        if is[k] > ss[k] || (k != d && is[k] > xs[k]) {
            return Err(format!(
                "scatter_reduce: index of sizes {is:?} larger than src {ss:?} or self {xs:?} \
                 outside dimension {d}"
            ));
        }
    }
    // The part of `src` the index covers.
    let mut sv = src;
    for k in 0..ss.len() {
        if ss[k] != is[k] {
            sv = e.call(
                "narrow",
                vec![t(sv), int(k as i64), int(0), int(is[k] as i64)],
            )?;
        }
    }
    let dt = e.dtype(x);
    match reduce.as_str() {
        "sum" | "mean" => {
            let base = if include_self {
                x
            } else {
                e.call("scatter", vec![t(x), int(d as i64), t(idx), int(0)])?
            };
            let total = e.call("scatter_add", vec![t(base), int(d as i64), t(idx), t(sv)])?;
            if reduce == "sum" {
                return one(total);
            }
            let start = if include_self {
                e.call("ones_like", vec![t(x)])?
            } else {
                e.call("zeros_like", vec![t(x)])?
            };
            let ones = e.call("ones_like", vec![t(sv)])?;
            let count = e.call(
                "scatter_add",
                vec![t(start), int(d as i64), t(idx), t(ones)],
            )?;
            let hit = e.call("gt", vec![t(count), int(0)])?;
            let safe = e.call("clamp", vec![t(count), int(1)])?;
            let mean = if dt.is_float() {
                e.call("div", vec![t(total), t(safe)])?
            } else {
                e.call("div", vec![t(total), t(safe), Arg::Str("floor".into())])?
            };
            one(e.call("where", vec![t(hit), t(mean), t(x)])?)
        }
        "amax" | "amin" | "prod" => {
            let ident = match (reduce.as_str(), dt.is_float()) {
                ("prod", _) => Arg::Int(1),
                ("amax", true) => Arg::Float(f64::NEG_INFINITY),
                ("amin", true) => Arg::Float(f64::INFINITY),
                ("amax", false) => Arg::Int(i32::MIN as i64),
                _ => Arg::Int(i32::MAX as i64),
            };
            let r = is.len();
            // `dim` last: [..., I_d] against every target position [S_d].
            let mut perm: Vec<i64> = (0..r as i64).filter(|&k| k != d as i64).collect();
            perm.push(d as i64);
            let (ip, sp) = if r > 0 {
                (
                    e.call("permute", vec![t(idx), ints(&perm)])?,
                    e.call("permute", vec![t(sv), ints(&perm)])?,
                )
            } else {
                (idx, sv)
            };
            let ip = e.call("unsqueeze", vec![t(ip), int(-1)])?;
            let sp = e.call("unsqueeze", vec![t(sp), int(-1)])?;
            let len = if xs.is_empty() { 1 } else { xs[d] };
            let pos = e.call("arange", vec![int(len as i64), Arg::Dtype(e.dtype(idx))])?;
            let mask = e.call("eq", vec![t(ip), t(pos)])?;
            let vals = e.call("where", vec![t(mask), t(sp), ident])?;
            let red = reduce.as_str();
            let rv = if red == "prod" {
                e.call("prod", vec![t(vals), int(-2)])?
            } else {
                e.call(red, vec![t(vals), ints(&[-2])])?
            };
            let hit = e.call("any", vec![t(mask), int(-2)])?;
            // Back to `self`'s layout: `dim` in place, the other dimensions
            // padded from the index's sizes to `self`'s.
            let mut inv = vec![0i64; r];
            for (i, &p) in perm.iter().enumerate() {
                inv[p as usize] = i as i64;
            }
            let (mut rv, mut hit) = if r > 0 {
                (
                    e.call("permute", vec![t(rv), ints(&inv)])?,
                    e.call("permute", vec![t(hit), ints(&inv)])?,
                )
            } else {
                (rv, hit)
            };
            let pad: Vec<i64> = (0..r)
                .rev()
                .flat_map(|k| [0, if k == d { 0 } else { (xs[k] - is[k]) as i64 }])
                .collect();
            if pad.iter().any(|&p| p > 0) {
                rv = e.call("constant_pad_nd", vec![t(rv), ints(&pad)])?;
                let h = e.cast(hit, DType::I32)?;
                let h = e.call("constant_pad_nd", vec![t(h), ints(&pad)])?;
                hit = e.call("ne", vec![t(h), int(0)])?;
            }
            let rv = e.cast(rv, dt)?;
            let combined = match (include_self, red) {
                (false, _) => rv,
                (true, "prod") => e.call("mul", vec![t(x), t(rv)])?,
                (true, "amax") => e.call("maximum", vec![t(x), t(rv)])?,
                (true, _) => e.call("minimum", vec![t(x), t(rv)])?,
            };
            one(e.call("where", vec![t(hit), t(combined), t(x)])?)
        }
        other => Err(format!(
            "reduce argument must be either sum, prod, mean, amax or amin, got {other}"
        )),
    }
}

// ------------------------------------------------------------ distances

/// `_cdist_forward(x1, x2, p, compute_mode)`: the `p`-norm distance of
/// every row of `x1` to every row of `x2` (batched alike), from their
/// differences.
pub fn cdist(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let (x1, x2) = (*a.tensor(0)?, *a.tensor(1)?);
    let p = a.float(2)?;
    one(distances(e, x1, x2, p)?)
}

fn distances(e: &mut dyn Emit, x1: ValueId, x2: ValueId, p: f64) -> R<ValueId> {
    let (s1, s2) = (e.sizes(x1), e.sizes(x2));
    if s1.len() < 2 || s2.len() < 2 || s1[s1.len() - 1] != s2[s2.len() - 1] {
        return Err(format!(
            "cdist: X1 and X2 must have at least 2 dimensions and the same number of columns, \
             got sizes {s1:?} and {s2:?}"
        ));
    }
    if p < 0.0 {
        return Err("cdist only supports non-negative p values".into());
    }
    floats_only(e, x1, "cdist")?;
    let a = e.call("unsqueeze", vec![t(x1), int(-2)])?;
    let b = e.call("unsqueeze", vec![t(x2), int(-3)])?;
    let diff = e.call("sub", vec![t(a), t(b)])?;
    let ad = e.call("abs", vec![t(diff)])?;
    if p == 0.0 {
        let nz = e.call("ne", vec![t(diff), int(0)])?;
        let c = e.cast(nz, e.dtype(x1))?;
        return e.call("sum", vec![t(c), ints(&[-1])]);
    }
    if p.is_infinite() {
        return e.call("amax", vec![t(ad), ints(&[-1])]);
    }
    if p == 1.0 {
        return e.call("sum", vec![t(ad), ints(&[-1])]);
    }
    if p == 2.0 {
        let sq = e.call("mul", vec![t(diff), t(diff)])?;
        let s = e.call("sum", vec![t(sq), ints(&[-1])])?;
        return e.call("sqrt", vec![t(s)]);
    }
    let pw = e.call("pow", vec![t(ad), Arg::Float(p)])?;
    let s = e.call("sum", vec![t(pw), ints(&[-1])])?;
    e.call("pow", vec![t(s), Arg::Float(1.0 / p)])
}

/// `_pdist_forward(self, p)`: the distances of each pair of rows `i < j`,
/// in row-major order: every distance, then the upper triangle's entries
/// gathered by a running count of its mask.
pub fn pdist(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let x = *a.tensor(0)?;
    let p = a.float(1)?;
    let s = e.sizes(x);
    if s.len() != 2 {
        return Err(format!("pdist only supports 2D tensors, got: {}D", s.len()));
    }
    let n = s[0];
    let k = n * n.saturating_sub(1) / 2;
    if k == 0 {
        return one(e.call("zeros", vec![usizes(&[0]), Arg::Dtype(e.dtype(x))])?);
    }
    let all = distances(e, x, x, p)?;
    let flat = reshape(e, all, &[n * n])?;
    // Position of each upper-triangle entry among them, `k` (a slot past
    // the end) for the others.
    let ones = e.call("ones", vec![usizes(&[n, n]), Arg::Dtype(DType::I64)])?;
    let upper = e.call("triu", vec![t(ones), int(1)])?;
    let upper = reshape(e, upper, &[n * n])?;
    let run = e.call("cumsum", vec![t(upper), int(0)])?;
    let at = e.call("sub", vec![t(run), int(1)])?;
    let is_up = e.call("ne", vec![t(upper), int(0)])?;
    let at = e.call("where", vec![t(is_up), t(at), int(k as i64)])?;
    let z = e.call("zeros", vec![usizes(&[k + 1]), Arg::Dtype(e.dtype(x))])?;
    let put = e.call("scatter_add", vec![t(z), int(0), t(at), t(flat)])?;
    one(e.call("narrow", vec![t(put), int(0), int(0), int(k as i64)])?)
}

// ------------------------------------------------------------ sampling

/// `grid_sampler_2d(input, grid, interpolation_mode, padding_mode,
/// align_corners)` (and `grid_sampler`): ATen's CPU kernel as table ops.
/// Each grid point's source coordinates (`unnormalize`, then the padding
/// mode's clip or reflection), then bilinear (four neighbours weighted),
/// nearest (rounded half to even) or bicubic (sixteen taps, A = -0.75)
/// reads of the input by `gather`; out-of-range reads are zero.
pub fn grid_sampler_2d(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let (x, grid) = (*a.tensor(0)?, *a.tensor(1)?);
    let (mode, pad, align) = (a.int(2)?, a.int(3)?, a.bool(4)?);
    let (xs, gs) = (e.sizes(x), e.sizes(grid));
    if xs.len() != 4 || gs.len() != 4 || gs[3] != 2 || gs[0] != xs[0] {
        return Err(format!(
            "grid_sampler_2d: expected input [N, C, H, W] and grid [N, H_out, W_out, 2], got \
             {xs:?} and {gs:?}"
        ));
    }
    if !(0..=2).contains(&mode) || !(0..=2).contains(&pad) {
        return Err(format!(
            "grid_sampler_2d: interpolation mode {mode} or padding mode {pad} out of range"
        ));
    }
    floats_only(e, x, "grid_sampler_2d")?;
    let (n, c, h, w) = (xs[0], xs[1], xs[2], xs[3]);
    let (ho, wo) = (gs[1], gs[2]);
    let s = Sampler {
        x,
        n,
        c,
        h,
        w,
        ho,
        wo,
        pad,
        align,
    };
    let gx = e.call("select", vec![t(grid), int(3), int(0)])?;
    let gy = e.call("select", vec![t(grid), int(3), int(1)])?;
    let ux = s.unnormalize(e, gx, w)?;
    let uy = s.unnormalize(e, gy, h)?;
    let y = match mode {
        0 => {
            let ix = s.padded(e, ux, w)?;
            let iy = s.padded(e, uy, h)?;
            let x0 = e.call("floor", vec![t(ix)])?;
            let y0 = e.call("floor", vec![t(iy)])?;
            let x1 = e.call("add", vec![t(x0), int(1)])?;
            let y1 = e.call("add", vec![t(y0), int(1)])?;
            let wx1 = e.call("sub", vec![t(ix), t(x0)])?;
            let wx0 = e.call("sub", vec![t(x1), t(ix)])?;
            let wy1 = e.call("sub", vec![t(iy), t(y0)])?;
            let wy0 = e.call("sub", vec![t(y1), t(iy)])?;
            let mut acc: Option<ValueId> = None;
            for (cx, cy, wxv, wyv) in [
                (x0, y0, wx0, wy0),
                (x1, y0, wx1, wy0),
                (x0, y1, wx0, wy1),
                (x1, y1, wx1, wy1),
            ] {
                let wgt = e.call("mul", vec![t(wxv), t(wyv)])?;
                let v = s.read(e, cx, cy, wgt)?;
                acc = Some(match acc {
                    Some(a) => e.call("add", vec![t(a), t(v)])?,
                    None => v,
                });
            }
            acc.ok_or("internal error: no corners")?
        }
        1 => {
            let ix = s.padded(e, ux, w)?;
            let iy = s.padded(e, uy, h)?;
            let rx = e.call("round", vec![t(ix)])?;
            let ry = e.call("round", vec![t(iy)])?;
            let one = e.call("ones_like", vec![t(rx)])?;
            s.read(e, rx, ry, one)?
        }
        _ => {
            // Taps at the unnormalized coordinates, each padded itself.
            let x0 = e.call("floor", vec![t(ux)])?;
            let y0 = e.call("floor", vec![t(uy)])?;
            let tx = e.call("sub", vec![t(ux), t(x0)])?;
            let ty = e.call("sub", vec![t(uy), t(y0)])?;
            let cx = cubic_coefficients(e, tx)?;
            let cy = cubic_coefficients(e, ty)?;
            let mut acc: Option<ValueId> = None;
            for (j, wyv) in cy.iter().enumerate() {
                for (i, wxv) in cx.iter().enumerate() {
                    let px = e.call("add", vec![t(x0), int(i as i64 - 1)])?;
                    let py = e.call("add", vec![t(y0), int(j as i64 - 1)])?;
                    let px = s.padded(e, px, w)?;
                    let py = s.padded(e, py, h)?;
                    let wgt = e.call("mul", vec![t(*wxv), t(*wyv)])?;
                    let v = s.read(e, px, py, wgt)?;
                    acc = Some(match acc {
                        Some(a) => e.call("add", vec![t(a), t(v)])?,
                        None => v,
                    });
                }
            }
            acc.ok_or("internal error: no taps")?
        }
    };
    one(y)
}

/// What `grid_sampler_2d`'s reads share.
struct Sampler {
    x: ValueId,
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    ho: usize,
    wo: usize,
    pad: i64,
    align: bool,
}

impl Sampler {
    /// A grid coordinate in [-1, 1] as a source position along a dimension
    /// of `size`.
    fn unnormalize(&self, e: &mut dyn Emit, g: ValueId, size: usize) -> R<ValueId> {
        let size = size as f64;
        if self.align {
            // ((g + 1) / 2) * (size - 1)
            let a = e.call("add", vec![t(g), float(1.0)])?;
            e.call("mul", vec![t(a), float((size - 1.0) / 2.0)])
        } else {
            // ((g + 1) * size - 1) / 2
            let a = e.call("add", vec![t(g), float(1.0)])?;
            let b = e.call("mul", vec![t(a), float(size)])?;
            let c = e.call("sub", vec![t(b), float(1.0)])?;
            e.call("div", vec![t(c), float(2.0)])
        }
    }

    /// The padding mode applied: zeros leaves the position, border clips
    /// it into range, reflection reflects it off the edges, then clips.
    fn padded(&self, e: &mut dyn Emit, v: ValueId, size: usize) -> R<ValueId> {
        let hi = (size as f64 - 1.0).max(0.0);
        match self.pad {
            1 => e.call("clamp", vec![t(v), float(0.0), float(hi)]),
            2 => {
                let (lo2, hi2) = if self.align {
                    (0.0, 2.0 * (size as f64 - 1.0))
                } else {
                    (-1.0, 2.0 * size as f64 - 1.0)
                };
                let r = if lo2 == hi2 {
                    e.call("zeros_like", vec![t(v)])?
                } else {
                    let (min, span) = (lo2 / 2.0, (hi2 - lo2) / 2.0);
                    let d = e.call("sub", vec![t(v), float(min)])?;
                    let d = e.call("abs", vec![t(d)])?;
                    let extra = e.call("fmod", vec![t(d), float(span)])?;
                    let q = e.call("div", vec![t(d), float(span)])?;
                    let flips = e.call("floor", vec![t(q)])?;
                    let odd = e.call("remainder", vec![t(flips), float(2.0)])?;
                    let odd = e.call("ne", vec![t(odd), float(0.0)])?;
                    let even_v = e.call("add", vec![t(extra), float(min)])?;
                    let odd_v = e.call("sub", vec![t(extra), float(span + min)])?;
                    let odd_v = e.call("neg", vec![t(odd_v)])?;
                    e.call("where", vec![t(odd), t(odd_v), t(even_v)])?
                };
                e.call("clamp", vec![t(r), float(0.0), float(hi)])
            }
            _ => Ok(v),
        }
    }

    /// The input at integral positions `(px, py)` ([N, H_out, W_out],
    /// floats) times `weight`, zero where out of range: [N, C, H_out,
    /// W_out].
    fn read(&self, e: &mut dyn Emit, px: ValueId, py: ValueId, weight: ValueId) -> R<ValueId> {
        let (n, c, h, w, ho, wo) = (self.n, self.c, self.h, self.w, self.ho, self.wo);
        let inx = e.call("ge", vec![t(px), float(0.0)])?;
        let inx2 = e.call("le", vec![t(px), float(w as f64 - 1.0)])?;
        let iny = e.call("ge", vec![t(py), float(0.0)])?;
        let iny2 = e.call("le", vec![t(py), float(h as f64 - 1.0)])?;
        let a = e.call("logical_and", vec![t(inx), t(inx2)])?;
        let b = e.call("logical_and", vec![t(iny), t(iny2)])?;
        let valid = e.call("logical_and", vec![t(a), t(b)])?;
        let cx = e.call("clamp", vec![t(px), float(0.0), float(w as f64 - 1.0)])?;
        let cy = e.call("clamp", vec![t(py), float(0.0), float(h as f64 - 1.0)])?;
        let lin = e.call("mul", vec![t(cy), float(w as f64)])?;
        let lin = e.call("add", vec![t(lin), t(cx)])?;
        let idx = e.cast(lin, DType::I64)?;
        let idx = reshape(e, idx, &[n, 1, ho * wo])?;
        let idx = e.expand(idx, &[n, c, ho * wo])?;
        let flat = reshape(e, self.x, &[n, c, h * w])?;
        let v = e.call("gather", vec![t(flat), int(2), t(idx)])?;
        let v = reshape(e, v, &[n, c, ho, wo])?;
        let invalid = e.call("logical_not", vec![t(valid)])?;
        let wz = e.call("masked_fill", vec![t(weight), t(invalid), float(0.0)])?;
        let wz = e.call("unsqueeze", vec![t(wz), int(1)])?;
        e.call("mul", vec![t(v), t(wz)])
    }
}

/// The cubic convolution weights (A = -0.75) of the four taps around a
/// point at fraction `f` past the second.
fn cubic_coefficients(e: &mut dyn Emit, f: ValueId) -> R<[ValueId; 4]> {
    const A_: f64 = -0.75;
    // Near taps (|x| <= 1): ((A + 2) x - (A + 3)) x^2 + 1;
    // far ones (1 < |x| < 2): ((A x - 5A) x + 8A) x - 4A.
    let near = |e: &mut dyn Emit, x: ValueId| -> R<ValueId> {
        let a = e.call("mul", vec![t(x), float(A_ + 2.0)])?;
        let a = e.call("sub", vec![t(a), float(A_ + 3.0)])?;
        let xx = e.call("mul", vec![t(x), t(x)])?;
        let a = e.call("mul", vec![t(a), t(xx)])?;
        e.call("add", vec![t(a), float(1.0)])
    };
    let far = |e: &mut dyn Emit, x: ValueId| -> R<ValueId> {
        let a = e.call("mul", vec![t(x), float(A_)])?;
        let a = e.call("sub", vec![t(a), float(5.0 * A_)])?;
        let a = e.call("mul", vec![t(a), t(x)])?;
        let a = e.call("add", vec![t(a), float(8.0 * A_)])?;
        let a = e.call("mul", vec![t(a), t(x)])?;
        e.call("sub", vec![t(a), float(4.0 * A_)])
    };
    let x0 = e.call("add", vec![t(f), float(1.0)])?;
    let w0 = far(e, x0)?;
    let w1 = near(e, f)?;
    let nf = e.call("neg", vec![t(f)])?;
    let x2 = e.call("add", vec![t(nf), float(1.0)])?;
    let w2 = near(e, x2)?;
    let x3 = e.call("add", vec![t(nf), float(2.0)])?;
    let w3 = far(e, x3)?;
    Ok([w0, w1, w2, w3])
}

/// `affine_grid_generator(theta, size, align_corners)`: each output
/// position's normalized `(x, y, 1)` times `theta`'s rows: a sampling grid
/// `[N, H, W, 2]` for `grid_sampler_2d`.
pub fn affine_grid(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let theta = *a.tensor(0)?;
    let size = a.int_list(1)?.to_vec();
    let align = a.bool(2)?;
    let ts = e.sizes(theta);
    if size.len() != 4 || ts != [size[0] as usize, 2, 3] {
        return Err(format!(
            "affine_grid: expected theta [N, 2, 3] and a 4-d size [N, C, H, W], got {ts:?} and \
             {size:?}"
        ));
    }
    let (n, h, w) = (size[0] as usize, size[2] as usize, size[3] as usize);
    let dt = e.dtype(theta);
    // linspace(-1, 1, len), scaled by (len - 1) / len without align_corners.
    let axis = |e: &mut dyn Emit, len: usize| -> R<ValueId> {
        let k = e.call("arange", vec![int(len as i64), Arg::Dtype(dt)])?;
        let step = if len > 1 {
            2.0 / (len as f64 - 1.0)
        } else {
            0.0
        };
        let v = e.call("mul", vec![t(k), float(step)])?;
        let v = e.call("sub", vec![t(v), float(1.0)])?;
        if align || len == 0 {
            Ok(v)
        } else {
            e.call("mul", vec![t(v), float((len as f64 - 1.0) / len as f64)])
        }
    };
    let xs = axis(e, w)?;
    let ys = axis(e, h)?;
    let xs = reshape(e, xs, &[1, w, 1])?;
    let xs = e.expand(xs, &[h, w, 1])?;
    let ys = reshape(e, ys, &[h, 1, 1])?;
    let ys = e.expand(ys, &[h, w, 1])?;
    let ones = e.call("ones", vec![usizes(&[h, w, 1]), Arg::Dtype(dt)])?;
    let base = e.call(
        "cat",
        vec![
            Arg::TensorList(vec![Some(xs), Some(ys), Some(ones)]),
            int(2),
        ],
    )?;
    let base = reshape(e, base, &[1, h * w, 3])?;
    let tt = e.call("transpose", vec![t(theta), int(1), int(2)])?;
    let g = e.call("matmul", vec![t(base), t(tt)])?;
    one(reshape(e, g, &[n, h, w, 2])?)
}

// ------------------------------------------------------------ activations and shapes

/// `clamp_min(self, min)` / `clamp_max(self, max)` (a scalar or tensor
/// bound): `clamp` with the other bound absent.
pub fn clamp_min(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    one(e.call("clamp", vec![a[0].clone(), a[1].clone(), Arg::None])?)
}

pub fn clamp_max(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    one(e.call("clamp", vec![a[0].clone(), Arg::None, a[1].clone()])?)
}

/// `rsub(self, other, alpha)`: `other - alpha * self`.
pub fn rsub(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let x = *a.tensor(0)?;
    let alpha = a.opt_scalar(2)?.map_or(1.0, |s| s.to_f64());
    let scaled = if alpha == 1.0 {
        x
    } else {
        e.call("mul", vec![t(x), a[2].clone()])?
    };
    let n = e.call("neg", vec![t(scaled)])?;
    one(e.call("add", vec![t(n), a[1].clone()])?)
}

/// `selu`: `elu` with SELU's constants.
pub fn selu(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let x = *a.tensor(0)?;
    one(e.call(
        "elu",
        vec![
            t(x),
            float(1.673_263_242_354_377_3),
            float(1.050_700_987_355_480_5),
            int(1),
        ],
    )?)
}

/// `celu(self, alpha)`: `elu(x, alpha, 1, 1 / alpha)`.
pub fn celu(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let x = *a.tensor(0)?;
    let alpha = a.scalar(1)?.to_f64();
    if alpha == 0.0 {
        return Err("ZeroDivisionError: celu's alpha must not be 0".into());
    }
    one(e.call("elu", vec![t(x), float(alpha), int(1), float(1.0 / alpha)])?)
}

/// `log_sigmoid`: `-softplus(-x)`.
pub fn log_sigmoid(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let x = *a.tensor(0)?;
    floats_only(e, x, "log_sigmoid")?;
    let n = e.call("neg", vec![t(x)])?;
    let sp = e.call("softplus", vec![t(n)])?;
    one(e.call("neg", vec![t(sp)])?)
}

/// `glu(self, dim)`: the first half times the sigmoid of the second.
pub fn glu(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let x = *a.tensor(0)?;
    let s = e.sizes(x);
    let d = crate::meta::wrap_dim(a.int(1)?, s.len())?;
    if s.is_empty() || s[d] % 2 != 0 {
        return Err(format!(
            "glu: Halving dimension must be even, but dimension {d} is size {}",
            s.get(d).copied().unwrap_or(0)
        ));
    }
    let h = (s[d] / 2) as i64;
    let l = e.call("narrow", vec![t(x), int(d as i64), int(0), int(h)])?;
    let r = e.call("narrow", vec![t(x), int(d as i64), int(h), int(h)])?;
    let g = e.call("sigmoid", vec![t(r)])?;
    one(e.call("mul", vec![t(l), t(g)])?)
}

/// `prelu(self, weight)` / `_prelu_kernel`: `x` where positive, else
/// `weight * x`, the weight per channel (dimension 1; 0 for a vector).
pub fn prelu(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let (x, w) = (*a.tensor(0)?, *a.tensor(1)?);
    let (xs, wn) = (e.sizes(x), e.meta(w).numel());
    let wv = if wn == 1 || e.rank(w) != 1 {
        w
    } else {
        let c = match xs.len() {
            0 => 1,
            1 => xs[0],
            _ => xs[1],
        };
        if wn != c {
            return Err(format!(
                "Mismatch of parameter numbers and input channel size. Found parameter numbers = \
                 {wn} and channel size = {c}."
            ));
        }
        if xs.len() >= 2 {
            channel(e, w, c, xs.len())?
        } else {
            w
        }
    };
    let pos = e.call("gt", vec![t(x), int(0)])?;
    let neg = e.call("mul", vec![t(x), t(wv)])?;
    one(e.call("where", vec![t(pos), t(x), t(neg)])?)
}

/// `_prelu_kernel(self, weight)`: the weight broadcast as it is.
pub fn prelu_kernel(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let (x, w) = (*a.tensor(0)?, *a.tensor(1)?);
    let pos = e.call("gt", vec![t(x), int(0)])?;
    let neg = e.call("mul", vec![t(x), t(w)])?;
    one(e.call("where", vec![t(pos), t(x), t(neg)])?)
}

/// `pixel_shuffle(self, r)`: `[*, C r^2, H, W]` to `[*, C, H r, W r]`.
pub fn pixel_shuffle(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    shuffle(e, a, true)
}

/// `pixel_unshuffle(self, r)`: the inverse.
pub fn pixel_unshuffle(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    shuffle(e, a, false)
}

fn shuffle(e: &mut dyn Emit, a: &A, up: bool) -> Out {
    let x = *a.tensor(0)?;
    let r = usize::try_from(a.int(1)?)
        .ok()
        .filter(|&r| r > 0)
        .ok_or("the factor must be positive")?;
    let s = e.sizes(x);
    let op = if up {
        "pixel_shuffle"
    } else {
        "pixel_unshuffle"
    };
    if s.len() < 3 {
        return Err(format!(
            "{op} expects input to have at least 3 dimensions, got sizes {s:?}"
        ));
    }
    let b = s.len() - 3;
    let (c, h, w) = (s[b], s[b + 1], s[b + 2]);
    let lead: Vec<usize> = s[..b].to_vec();
    let l = b as i64;
    let (split, perm, out): (Vec<usize>, Vec<i64>, Vec<usize>) = if up {
        if c % (r * r) != 0 {
            return Err(format!(
                "pixel_shuffle expects its input's 'channel' dimension to be divisible by the square of upscale_factor, but input.size(-3)={c} is not divisible by {}",
                r * r
            ));
        }
        let oc = c / (r * r);
        (
            [lead.clone(), vec![oc, r, r, h, w]].concat(),
            (0..l).chain([l, l + 3, l + 1, l + 4, l + 2]).collect(),
            [lead, vec![oc, h * r, w * r]].concat(),
        )
    } else {
        if h % r != 0 || w % r != 0 {
            return Err(format!(
                "pixel_unshuffle expects height and width ({h}, {w}) to be divisible by downscale_factor {r}"
            ));
        }
        (
            [lead.clone(), vec![c, h / r, r, w / r, r]].concat(),
            (0..l).chain([l, l + 2, l + 4, l + 1, l + 3]).collect(),
            [lead, vec![c * r * r, h / r, w / r]].concat(),
        )
    };
    let v = reshape(e, x, &split)?;
    let p = e.call("permute", vec![t(v), ints(&perm)])?;
    let c = e.call("contiguous", vec![t(p)])?;
    one(reshape(e, c, &out)?)
}

/// `one_hot(self, num_classes)`: `self == arange(num_classes)` as i64.
pub fn one_hot(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let x = *a.tensor(0)?;
    let n = a.int(1)?;
    if n < 0 {
        return Err(
            "one_hot with num_classes=-1 takes its size from the values (the largest plus one); \
             Kiln compiles fixed shapes: pass num_classes"
                .into(),
        );
    }
    if e.dtype(x) != DType::I64 {
        return Err("one_hot is only applicable to index tensor of type LongTensor.".into());
    }
    let u = e.call("unsqueeze", vec![t(x), int(-1)])?;
    let r = e.call("arange", vec![int(n), Arg::Dtype(DType::I64)])?;
    let m = e.call("eq", vec![t(u), t(r)])?;
    one(e.cast(m, DType::I64)?)
}

/// `repeat_interleave.self_int(self, repeats, dim, output_size)`: each
/// element `repeats` times in a row (the flattened tensor without `dim`).
pub fn repeat_interleave(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let mut x = *a.tensor(0)?;
    let r = usize::try_from(a.int(1)?).map_err(|_| "repeats can not be negative")?;
    let d = match a.get(2) {
        Some(Arg::Int(d)) => *d,
        _ => {
            let n = e.meta(x).numel();
            x = reshape(e, x, &[n])?;
            0
        }
    };
    let s = e.sizes(x);
    let d = crate::meta::wrap_dim(d, s.len())?;
    if s.is_empty() {
        x = reshape(e, x, &[1])?;
        let v = e.call("expand", vec![t(x), usizes(&[r])])?;
        return one(e.call("clone", vec![t(v)])?);
    }
    let u = e.call("unsqueeze", vec![t(x), int(d as i64 + 1)])?;
    let mut to = s.clone();
    to.insert(d + 1, r);
    let ex = e.call("expand", vec![t(u), usizes(&to)])?;
    let mut out = s.clone();
    out[d] *= r;
    one(e.call("reshape", vec![t(ex), usizes(&out)])?)
}

/// `argsort(self, dim, descending)` (and `.stable`): `sort`'s indices.
pub fn argsort(e: &mut dyn Emit, overload: &str, a: &A) -> Out {
    let x = *a.tensor(0)?;
    let (dim, desc) = if overload == "stable" {
        (a.int(2)?, a.bool(3)?)
    } else {
        (a.int(1)?, a.bool(2)?)
    };
    let r = e.call_all("sort", vec![t(x), int(dim), Arg::Bool(desc)])?;
    one(r[1])
}

/// `cumprod(self, dim, dtype)`: each position's product of the elements up
/// to it, as a product over the lower triangle of the line against
/// itself (memory: the line's length squared per line).
pub fn cumprod(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let mut x = *a.tensor(0)?;
    if let Some(d) = a.opt_dtype(2)? {
        x = e.cast(x, d)?;
    } else if !e.dtype(x).is_float() {
        x = e.cast(x, DType::I64)?;
    }
    let s = e.sizes(x);
    if s.is_empty() {
        return one(e.call("clone", vec![t(x)])?);
    }
    let d = crate::meta::wrap_dim(a.int(1)?, s.len())?;
    let len = s[d];
    let last = s.len() as i64 - 1;
    let xt = if d as i64 == last {
        x
    } else {
        e.call("transpose", vec![t(x), int(d as i64), int(last)])?
    };
    let row = e.call("unsqueeze", vec![t(xt), int(-2)])?;
    let ones = e.call("ones", vec![usizes(&[len, len]), Arg::Dtype(DType::Bool)])?;
    let lower = e.call("tril", vec![t(ones)])?;
    let vals = e.call("where", vec![t(lower), t(row), int(1)])?;
    let p = e.call("prod", vec![t(vals), int(-1)])?;
    if d as i64 == last {
        one(p)
    } else {
        let b = e.call("transpose", vec![t(p), int(d as i64), int(last)])?;
        one(e.call("contiguous", vec![t(b)])?)
    }
}

/// `meshgrid(tensors, indexing)`: each 1-d tensor along its own
/// dimension, expanded to all of them (`xy` swaps the first two).
pub fn meshgrid(e: &mut dyn Emit, overload: &str, a: &A) -> Out {
    let ts: Vec<ValueId> = match a.first() {
        Some(Arg::TensorList(l)) => l.iter().flatten().copied().collect(),
        _ => return Err("meshgrid expects a list of tensors".into()),
    };
    let xy = overload == "indexing" && a.opt_str(1)?.unwrap_or("ij") == "xy";
    let mut sizes = vec![];
    for &v in &ts {
        let s = e.sizes(v);
        if s.len() > 1 {
            return Err(format!(
                "meshgrid expects 0-d or 1-d tensors, got sizes {s:?}"
            ));
        }
        sizes.push(s.first().copied().unwrap_or(1));
    }
    let k = ts.len();
    let pos = |i: usize| if xy && k >= 2 && i < 2 { 1 - i } else { i };
    let mut full = vec![0; k];
    for i in 0..k {
        full[pos(i)] = sizes[i];
    }
    let mut out = vec![];
    for (i, &v) in ts.iter().enumerate() {
        let mut shape = vec![1; k];
        shape[pos(i)] = sizes[i];
        let r = reshape(e, v, &shape)?;
        out.push(e.call("expand", vec![t(r), usizes(&full)])?);
    }
    Ok(out)
}

/// `instance_norm(input, weight, bias, running_mean, running_var,
/// use_input_stats, momentum, eps, cudnn_enabled)`: with the input's
/// statistics, `group_norm` with a group per channel; else `batch_norm`
/// with the running ones.
pub fn instance_norm(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let x = *a.tensor(0)?;
    let use_input = a.bool(5)?;
    let eps = a.float(7)?;
    if !use_input {
        return one(e.call(
            "batch_norm",
            vec![
                t(x),
                a[1].clone(),
                a[2].clone(),
                a[3].clone(),
                a[4].clone(),
                Arg::Bool(false),
                a[6].clone(),
                float(eps),
                Arg::Bool(false),
            ],
        )?);
    }
    if a.opt_tensor(3)?.is_some() || a.opt_tensor(4)?.is_some() {
        return Err(
            "instance_norm with running statistics in training mode writes them in place, \
             which this functional op cannot"
                .into(),
        );
    }
    let c = channels(e, x, "instance_norm", &[])?;
    one(e.call(
        "group_norm",
        vec![t(x), int(c as i64), a[1].clone(), a[2].clone(), float(eps)],
    )?)
}

/// `_weight_norm(v, g, dim)`: `v * g / ||v||`, the norm over every
/// dimension but `dim` (all of them for -1).
pub fn weight_norm(e: &mut dyn Emit, overload: &str, a: &A) -> Out {
    let _ = overload;
    let (v, g) = (*a.tensor(0)?, *a.tensor(1)?);
    let s = e.sizes(v);
    let d = a.int(2)?;
    let dims: Vec<i64> = if d == -1 {
        (0..s.len() as i64).collect()
    } else {
        let d = crate::meta::wrap_dim(d, s.len())? as i64;
        (0..s.len() as i64).filter(|&k| k != d).collect()
    };
    let sq = e.call("mul", vec![t(v), t(v)])?;
    let ss = e.call("sum", vec![t(sq), ints(&dims), Arg::Bool(true)])?;
    let norm = e.call("sqrt", vec![t(ss)])?;
    let q = e.call("div", vec![t(g), t(norm)])?;
    let w = e.call("mul", vec![t(v), t(q)])?;
    Ok(vec![w, norm])
}

/// `_weight_norm(v, g, dim)`: `_weight_norm_interface`'s weight.
pub fn weight_norm_weight(e: &mut dyn Emit, o: &str, a: &A) -> Out {
    Ok(vec![weight_norm(e, o, a)?[0]])
}

/// `linalg_vector_norm(self, ord, dim, keepdim, dtype)`: `sum(|x|^ord) ^
/// (1 / ord)`; `inf` / `-inf` the largest / smallest magnitude, 0 the
/// count of non-zeros.
pub fn vector_norm(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let mut x = *a.tensor(0)?;
    if let Some(d) = a.opt_dtype(4)? {
        x = e.cast(x, d)?;
    }
    floats_only(e, x, "linalg.vector_norm")?;
    let ord = a.opt_scalar(1)?.map_or(2.0, |s| s.to_f64());
    let dims: Vec<i64> = a.opt_int_list(2)?.unwrap_or(&[]).to_vec();
    let keep = a.bool(3)?;
    let ad = e.call("abs", vec![t(x)])?;
    let red = |e: &mut dyn Emit, op: &str, v: ValueId| {
        e.call(op, vec![t(v), ints(&dims), Arg::Bool(keep)])
    };
    one(if ord == f64::INFINITY {
        red(e, "amax", ad)?
    } else if ord == f64::NEG_INFINITY {
        red(e, "amin", ad)?
    } else if ord == 0.0 {
        let nz = e.call("ne", vec![t(x), int(0)])?;
        let c = e.cast(nz, e.dtype(x))?;
        red(e, "sum", c)?
    } else if ord == 1.0 {
        red(e, "sum", ad)?
    } else if ord == 2.0 {
        let sq = e.call("mul", vec![t(x), t(x)])?;
        let s = red(e, "sum", sq)?;
        e.call("sqrt", vec![t(s)])?
    } else {
        let p = e.call("pow", vec![t(ad), float(ord)])?;
        let s = red(e, "sum", p)?;
        e.call("pow", vec![t(s), float(1.0 / ord)])?
    })
}

// ------------------------------------------------------------ im2col

/// `im2col(self, kernel_size, dilation, padding, stride)` (`F.unfold`):
/// each sliding window of `[N, C, H, W]` as a column, `[N, C kh kw, L]`.
pub fn im2col(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let x = *a.tensor(0)?;
    let s = e.sizes(x);
    if s.len() != 3 && s.len() != 4 {
        return Err(format!(
            "im2col: Expected 3D or 4D (batch mode) tensor, got sizes {s:?}"
        ));
    }
    let (k, d, p, st) = (
        positive_dims(a, 1, 2, "kernel_size")?,
        positive_dims(a, 2, 2, "dilation")?,
        padding_dims(a, 3, 2, "padding")?,
        positive_dims(a, 4, 2, "stride")?,
    );
    let sp = &s[s.len() - 2..];
    let ws: Vec<Window> = (0..2)
        .map(|i| Window {
            size: sp[i],
            kernel: k[i],
            stride: st[i],
            pad: p[i],
            dilation: d[i],
        })
        .collect();
    let outs: Vec<usize> = ws.iter().map(|w| w.outputs(false)).collect::<R<_>>()?;
    let u = unfold_windows(e, x, &ws, &outs, 0.0)?;
    // [.., C, oh, ow, kh, kw] -> [.., C, kh, kw, oh, ow] -> [.., C kh kw, L]
    let r = e.rank(u) as i64;
    let lead: Vec<i64> = (0..r - 5).collect();
    let perm: Vec<i64> = lead
        .iter()
        .copied()
        .chain([r - 5, r - 2, r - 1, r - 4, r - 3])
        .collect();
    let pu = e.call("permute", vec![t(u), ints(&perm)])?;
    let c = s[s.len() - 3];
    let mut out: Vec<usize> = s[..s.len() - 3].to_vec();
    out.extend([c * k[0] * k[1], outs[0] * outs[1]]);
    let c = e.call("contiguous", vec![t(pu)])?;
    one(reshape(e, c, &out)?)
}

/// `col2im(self, output_size, kernel_size, dilation, padding, stride)`
/// (`F.fold`): the columns summed back into their windows' places
/// (`im2col`'s transpose).
pub fn col2im(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let cols = *a.tensor(0)?;
    let cs = e.sizes(cols);
    let out = a.int_list(1)?.to_vec();
    let k = positive_dims(a, 2, 2, "kernel_size")?;
    if (cs.len() != 2 && cs.len() != 3) || out.len() != 2 {
        return Err(format!(
            "col2im: Expected 2D or 3D (batch mode) input and a 2-entry output_size, got sizes {cs:?} and {out:?}"
        ));
    }
    let kk = k[0] * k[1];
    let ch = cs[cs.len() - 2];
    if ch % kk != 0 {
        return Err(format!(
            "col2im: Expected size of input's dimension 1 to be divisible by the product of kernel_size, but got input.size(1)={ch} and kernel_size={k:?}"
        ));
    }
    let (d, p, st) = (
        positive_dims(a, 3, 2, "dilation")?,
        padding_dims(a, 4, 2, "padding")?,
        positive_dims(a, 5, 2, "stride")?,
    );
    let blocks: Vec<i64> = (0..2)
        .map(|i| (out[i] + 2 * p[i] as i64 - (d[i] * (k[i] - 1)) as i64 - 1) / st[i] as i64 + 1)
        .collect();
    if blocks.iter().any(|&b| b < 1) || (blocks[0] * blocks[1]) as usize != cs[cs.len() - 1] {
        return Err(format!(
            "Given output_size={out:?}, kernel_size={k:?}, dilation={d:?}, padding={p:?}, stride={st:?}, expected size of input's dimension {} to match the calculated number of sliding blocks {} * {} = {}, but got input.size({})={}.",
            cs.len() - 1,
            blocks[0],
            blocks[1],
            blocks[0] * blocks[1],
            cs.len() - 1,
            cs[cs.len() - 1]
        ));
    }
    // Each column entry's place in the padded output, `(oh sh + ki dh) Wp
    // + ow sw + kj dw`, from `arange`s; the entries summed there by
    // `scatter_add` (overlapping windows add), the padding cropped.
    let (h, w) = (out[0] as usize, out[1] as usize);
    let (hp, wp) = (h + 2 * p[0], w + 2 * p[1]);
    let (bh, bw) = (blocks[0] as usize, blocks[1] as usize);
    let axis = |e: &mut dyn Emit, n: usize, step: usize, shape: &[usize]| -> R<ValueId> {
        let r = e.call("arange", vec![int(n as i64), Arg::Dtype(DType::I64)])?;
        let r = e.call("mul", vec![t(r), int(step as i64)])?;
        reshape(e, r, shape)
    };
    let ki = axis(e, k[0], d[0] * wp, &[k[0], 1, 1, 1])?;
    let kj = axis(e, k[1], d[1], &[1, k[1], 1, 1])?;
    let oh = axis(e, bh, st[0] * wp, &[1, 1, bh, 1])?;
    let ow = axis(e, bw, st[1], &[1, 1, 1, bw])?;
    let a1 = e.call("add", vec![t(ki), t(kj)])?;
    let a2 = e.call("add", vec![t(oh), t(ow)])?;
    let at = e.call("add", vec![t(a1), t(a2)])?;
    let n = kk * bh * bw;
    let at = reshape(e, at, &[n])?;
    let lead: Vec<usize> = cs[..cs.len() - 2].to_vec();
    let c = ch / kk;
    let mut src_shape = lead.clone();
    src_shape.extend([c, n]);
    let src = reshape(e, cols, &src_shape)?;
    let idx = e.expand(at, &src_shape)?;
    let mut flat = lead.clone();
    flat.extend([c, hp * wp]);
    let z = e.call("zeros", vec![usizes(&flat), Arg::Dtype(e.dtype(cols))])?;
    let dim = lead.len() as i64 + 1;
    let sum = e.call("scatter_add", vec![t(z), int(dim), t(idx), t(src)])?;
    let mut padded = lead.clone();
    padded.extend([c, hp, wp]);
    let v = reshape(e, sum, &padded)?;
    let r = padded.len() as i64;
    let v = e.call(
        "narrow",
        vec![t(v), int(r - 2), int(p[0] as i64), int(h as i64)],
    )?;
    let v = e.call(
        "narrow",
        vec![t(v), int(r - 1), int(p[1] as i64), int(w as i64)],
    )?;
    one(e.call("contiguous", vec![t(v)])?)
}

// ------------------------------------------------------------ small activations

/// `threshold(self, threshold, value)`: `self` where above the threshold,
/// else `value`.
pub fn threshold(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let x = *a.tensor(0)?;
    let above = e.call("gt", vec![t(x), a[1].clone()])?;
    let v = e.call("full_like", vec![t(x), a[2].clone()])?;
    one(e.call("where", vec![t(above), t(x), t(v)])?)
}

/// `softshrink(self, lambd)`: shrunk toward 0 by `lambd`, 0 inside.
pub fn softshrink(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let x = *a.tensor(0)?;
    let l = a.scalar(1)?.to_f64();
    floats_only(e, x, "softshrink")?;
    let hi = e.call("gt", vec![t(x), float(l)])?;
    let lo = e.call("lt", vec![t(x), float(-l)])?;
    let dn = e.call("sub", vec![t(x), float(l)])?;
    let up = e.call("add", vec![t(x), float(l)])?;
    let z = e.call("zeros_like", vec![t(x)])?;
    let r = e.call("where", vec![t(lo), t(up), t(z)])?;
    one(e.call("where", vec![t(hi), t(dn), t(r)])?)
}

/// `hardshrink(self, lambd)`: `self` outside `[-lambd, lambd]`, else 0.
pub fn hardshrink(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let x = *a.tensor(0)?;
    let l = a.scalar(1)?.to_f64();
    let ax = e.call("abs", vec![t(x)])?;
    let keep = e.call("gt", vec![t(ax), float(l)])?;
    let z = e.call("zeros_like", vec![t(x)])?;
    one(e.call("where", vec![t(keep), t(x), t(z)])?)
}

/// `sinc(self)`: `sin(pi x) / (pi x)`, 1 at 0.
pub fn sinc(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let mut x = *a.tensor(0)?;
    if !e.dtype(x).is_float() {
        x = e.cast(x, DType::F32)?;
    }
    let px = e.call("mul", vec![t(x), float(std::f64::consts::PI)])?;
    let sn = e.call("sin", vec![t(px)])?;
    let q = e.call("div", vec![t(sn), t(px)])?;
    let z = e.call("eq", vec![t(x), int(0)])?;
    let one_ = e.call("ones_like", vec![t(q)])?;
    one(e.call("where", vec![t(z), t(one_), t(q)])?)
}

/// `exp2(self)`: `2 ^ self`.
pub fn exp2(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let mut x = *a.tensor(0)?;
    if !e.dtype(x).is_float() {
        x = e.cast(x, DType::F32)?;
    }
    one(e.call("pow", vec![float(2.0), t(x)])?)
}

/// `copysign(self, other)`: `|self|` with `other`'s sign (a negative zero's
/// too, found through its reciprocal).
pub fn copysign(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let mut x = *a.tensor(0)?;
    if !e.dtype(x).is_float() {
        x = e.cast(x, DType::F32)?;
    }
    let ax = e.call("abs", vec![t(x)])?;
    let o = match &a[1] {
        Arg::Tensor(o) => *o,
        s => e.call("full_like", vec![t(x), s.clone()])?,
    };
    let o = if e.dtype(o).is_float() {
        o
    } else {
        e.cast(o, DType::F32)?
    };
    let neg = e.call("lt", vec![t(o), int(0)])?;
    let r = e.call("reciprocal", vec![t(o)])?;
    let nz = e.call("lt", vec![t(r), int(0)])?;
    let z = e.call("eq", vec![t(o), int(0)])?;
    let negzero = e.call("logical_and", vec![t(z), t(nz)])?;
    let minus = e.call("logical_or", vec![t(neg), t(negzero)])?;
    let n = e.call("neg", vec![t(ax)])?;
    one(e.call("where", vec![t(minus), t(n), t(ax)])?)
}

/// `rot90(self, k, dims)`: a quarter turn `k` times in the plane of
/// `dims` (`flip` and `transpose`).
pub fn rot90(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let x = *a.tensor(0)?;
    let dims = a.int_list(2)?.to_vec();
    let r = e.rank(x);
    if dims.len() != 2 || r < 2 {
        return Err(format!(
            "expected total rotation dims == 2 and total dims >= 2, but got rotation dims {} and total dims {r}",
            dims.len()
        ));
    }
    let d0 = crate::meta::wrap_dim(dims[0], r)? as i64;
    let d1 = crate::meta::wrap_dim(dims[1], r)? as i64;
    if d0 == d1 {
        return Err("expected rotation dims to be different".into());
    }
    let v = match a.int(1)?.rem_euclid(4) {
        1 => {
            let f = e.call("flip", vec![t(x), ints(&[d1])])?;
            e.call("transpose", vec![t(f), int(d0), int(d1)])?
        }
        2 => e.call("flip", vec![t(x), ints(&[d0, d1])])?,
        3 => {
            let f = e.call("flip", vec![t(x), ints(&[d0])])?;
            e.call("transpose", vec![t(f), int(d0), int(d1)])?
        }
        _ => x,
    };
    one(e.call("clone", vec![t(v)])?)
}

/// `sum_to_size(self, size)`: summed over the dimensions `size` lacks or
/// has as 1.
pub fn sum_to_size(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let x = *a.tensor(0)?;
    let want: Vec<usize> = a.int_list(1)?.iter().map(|&s| s as usize).collect();
    let s = e.sizes(x);
    if want.len() > s.len() {
        return Err(format!("size {want:?} is not expandable to size {s:?}"));
    }
    let lead = s.len() - want.len();
    let dims: Vec<i64> = (0..s.len())
        .filter(|&i| i < lead || (want[i - lead] == 1 && s[i] != 1))
        .map(|i| i as i64)
        .collect();
    if dims.is_empty() {
        return one(e.call("clone", vec![t(x)])?);
    }
    let r = e.call("sum", vec![t(x), ints(&dims), Arg::Bool(true)])?;
    one(reshape(e, r, &want)?)
}

// ------------------------------------------------------------ backward ops

/// A `bool[N]` argument (`output_mask`).
fn bools(a: &A, i: usize) -> R<Vec<bool>> {
    match a.get(i) {
        Some(Arg::List(l)) => l
            .iter()
            .map(|x| match x {
                Arg::Bool(b) => Ok(*b),
                _ => Err(format!("argument {i} must be a list of bools")),
            })
            .collect(),
        _ => Err(format!("argument {i} must be a list of bools")),
    }
}

/// `g` where a gradient reached, else zeros like `like`.
fn or_zeros(e: &mut dyn Emit, g: Option<ValueId>, like: ValueId) -> R<ValueId> {
    match g {
        Some(g) => Ok(g),
        None => e.call("zeros_like", vec![t(like)]),
    }
}

/// `g` summed over every dimension but `keep`.
fn sum_but(e: &mut dyn Emit, g: ValueId, keep: &[usize]) -> R<ValueId> {
    let dims: Vec<i64> = (0..e.rank(g))
        .filter(|d| !keep.contains(d))
        .map(|d| d as i64)
        .collect();
    if dims.is_empty() {
        return e.call("clone", vec![t(g)]);
    }
    e.call("sum", vec![t(g), ints(&dims)])
}

/// `convolution_backward(grad_output, input, weight, bias_sizes, stride,
/// padding, dilation, transposed, output_padding, groups, output_mask)`:
/// the gradients of `convolution` (its decomposition differentiated,
/// `tape`) and of its bias (the gradient summed but for channels).
pub fn convolution_backward(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let (g, x, w) = (*a.tensor(0)?, *a.tensor(1)?, *a.tensor(2)?);
    bools(a, 10)?;
    let mut args = vec![t(x), t(w), Arg::None];
    args.extend(a[4..=9].iter().cloned());
    let gr = super::tape::vjp_of(e, "convolution", args, &[0, 1], &[Some(g)])?;
    let gx = or_zeros(e, gr[0], x)?;
    let gw = or_zeros(e, gr[1], w)?;
    let gb = match a.opt_int_list(3)? {
        Some(_) => sum_but(e, g, &[1])?,
        None => e.call("zeros", vec![usizes(&[0]), Arg::Dtype(e.dtype(g))])?,
    };
    Ok(vec![gx, gw, gb])
}

/// `avg_pool2d_backward(grad_output, self, kernel_size, stride, padding,
/// ceil_mode, count_include_pad, divisor_override)`: `avg_pool2d`
/// differentiated.
pub fn avg_pool2d_backward(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let (g, x) = (*a.tensor(0)?, *a.tensor(1)?);
    let mut args = vec![t(x)];
    args.extend(a[2..=7].iter().cloned());
    let gr = super::tape::vjp_of(e, "avg_pool2d", args, &[0], &[Some(g)])?;
    one(or_zeros(e, gr[0], x)?)
}

/// `_adaptive_avg_pool2d_backward(grad_output, self)`: the pool to the
/// gradient's spatial sizes, differentiated.
pub fn adaptive_avg_pool2d_backward(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let (g, x) = (*a.tensor(0)?, *a.tensor(1)?);
    let gs = e.sizes(g);
    if gs.len() < 2 {
        return Err(format!(
            "_adaptive_avg_pool2d_backward: a gradient of sizes {gs:?}"
        ));
    }
    let out = usizes(&gs[gs.len() - 2..]);
    let gr = super::tape::vjp_of(e, "_adaptive_avg_pool2d", vec![t(x), out], &[0], &[Some(g)])?;
    one(or_zeros(e, gr[0], x)?)
}

/// `max_pool2d_with_indices_backward(grad_output, self, kernel_size,
/// stride, padding, dilation, ceil_mode, indices)`: each gradient added at
/// its maximum's flat spatial index.
pub fn max_pool2d_with_indices_backward(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let (g, x, idx) = (*a.tensor(0)?, *a.tensor(1)?, *a.tensor(7)?);
    let xs = e.sizes(x);
    if !(3..=4).contains(&xs.len()) || e.sizes(idx) != e.sizes(g) {
        return Err(format!(
            "max_pool2d_with_indices_backward: input of sizes {xs:?}, gradient {:?}, indices {:?}",
            e.sizes(g),
            e.sizes(idx)
        ));
    }
    let lead = xs.len() - 2;
    let plane = xs[lead] * xs[lead + 1];
    let mut flat: Vec<usize> = xs[..lead].to_vec();
    flat.push(plane);
    let gsz = e.sizes(g);
    let mut gflat: Vec<usize> = gsz[..lead].to_vec();
    gflat.push(gsz[lead] * gsz[lead + 1]);
    let z = e.call("zeros", vec![usizes(&flat), Arg::Dtype(e.dtype(g))])?;
    let gi = reshape(e, g, &gflat)?;
    let ii = reshape(e, idx, &gflat)?;
    let r = e.call("scatter_add", vec![t(z), int(lead as i64), t(ii), t(gi)])?;
    one(reshape(e, r, &xs)?)
}

/// `embedding_dense_backward(grad_output, indices, num_weights,
/// padding_idx, scale_grad_by_freq)`: each row's gradient added at its
/// index (divided by the index's count with `scale_grad_by_freq`), the
/// padding row's zero.
pub fn embedding_dense_backward(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let (g, idx) = (*a.tensor(0)?, *a.tensor(1)?);
    let n = usize::try_from(a.int(2)?).map_err(|_| "num_weights must be non-negative")?;
    let gs = e.sizes(g);
    let d = *gs
        .last()
        .ok_or("embedding_dense_backward: a 0-d gradient")?;
    let k: usize = e.sizes(idx).iter().product();
    let flat_i = reshape(e, idx, &[k])?;
    let mut rows = reshape(e, g, &[k, d])?;
    if a.bool(4)? {
        let ones = e.call("ones", vec![usizes(&[k]), Arg::Dtype(e.dtype(g))])?;
        let z = e.call("zeros", vec![usizes(&[n]), Arg::Dtype(e.dtype(g))])?;
        let counts = e.call(
            "index_put",
            vec![
                t(z),
                Arg::TensorList(vec![Some(flat_i)]),
                t(ones),
                Arg::Bool(true),
            ],
        )?;
        let per = e.call("index_select", vec![t(counts), int(0), t(flat_i)])?;
        let per = reshape(e, per, &[k, 1])?;
        rows = e.call("div", vec![t(rows), t(per)])?;
    }
    let z = e.call("zeros", vec![usizes(&[n, d]), Arg::Dtype(e.dtype(g))])?;
    let mut r = e.call(
        "index_put",
        vec![
            t(z),
            Arg::TensorList(vec![Some(flat_i)]),
            t(rows),
            Arg::Bool(true),
        ],
    )?;
    let pad = a.int(3)?;
    if (0..n as i64).contains(&pad) {
        let row = e.call("select", vec![t(r), int(0), int(pad)])?;
        let zero = e.call("zeros_like", vec![t(row)])?;
        r = e.call("select_scatter", vec![t(r), t(zero), int(0), int(pad)])?;
    }
    one(r)
}

/// The normalization gradient both native norms' backward ops share, in
/// a shape where `mean` and `rstd` broadcast against `x` and `dims` are
/// the normalized dimensions: `rstd * (gw - mean(gw) - xhat *
/// mean(gw * xhat))` with `gw` the gradient times the weight.
fn norm_input_grad(
    e: &mut dyn Emit,
    g: ValueId,
    xhat: ValueId,
    w: Option<ValueId>,
    rstd: ValueId,
    dims: &[i64],
) -> R<ValueId> {
    let gw = match w {
        Some(w) => e.call("mul", vec![t(g), t(w)])?,
        None => g,
    };
    let m1 = e.call("mean", vec![t(gw), ints(dims), Arg::Bool(true)])?;
    let p = e.call("mul", vec![t(gw), t(xhat)])?;
    let m2 = e.call("mean", vec![t(p), ints(dims), Arg::Bool(true)])?;
    let d = e.call("sub", vec![t(gw), t(m1)])?;
    let xm = e.call("mul", vec![t(xhat), t(m2)])?;
    let d = e.call("sub", vec![t(d), t(xm)])?;
    e.call("mul", vec![t(d), t(rstd)])
}

/// `native_layer_norm_backward(grad_out, input, normalized_shape, mean,
/// rstd, weight, bias, output_mask)`: ATen's formulas from the saved
/// statistics.
pub fn native_layer_norm_backward(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let (g, x) = (*a.tensor(0)?, *a.tensor(1)?);
    let k = a.int_list(2)?.len();
    let (mean, rstd) = (*a.tensor(3)?, *a.tensor(4)?);
    let (w, b) = (a.opt_tensor(5)?.copied(), a.opt_tensor(6)?.copied());
    bools(a, 7)?;
    let rank = e.rank(x);
    if k > rank {
        return Err(format!(
            "native_layer_norm_backward: normalized_shape of {k} dimensions for an input of {rank}"
        ));
    }
    let dims: Vec<i64> = (1..=k as i64).map(|i| -i).collect();
    let xc = e.call("sub", vec![t(x), t(mean)])?;
    let xhat = e.call("mul", vec![t(xc), t(rstd)])?;
    let gx = norm_input_grad(e, g, xhat, w, rstd, &dims)?;
    let lead: Vec<i64> = (0..(rank - k) as i64).collect();
    let per = |e: &mut dyn Emit, v: ValueId, like: Option<ValueId>| -> R<ValueId> {
        match like {
            Some(_) if lead.is_empty() => e.call("clone", vec![t(v)]),
            Some(_) => e.call("sum", vec![t(v), ints(&lead)]),
            None => e.call("zeros", vec![usizes(&[0]), Arg::Dtype(e.dtype(v))]),
        }
    };
    let gxh = e.call("mul", vec![t(g), t(xhat)])?;
    let gw = per(e, gxh, w)?;
    let gb = per(e, g, b)?;
    Ok(vec![gx, gw, gb])
}

/// `native_group_norm_backward(grad_out, input, mean, rstd, weight, N,
/// C, HxW, group, output_mask)`: the same per (sample, group), in the
/// shape `[N, group, C / group, HxW]`.
pub fn native_group_norm_backward(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let (g, x) = (*a.tensor(0)?, *a.tensor(1)?);
    let (mean, rstd) = (*a.tensor(2)?, *a.tensor(3)?);
    let w = a.opt_tensor(4)?.copied();
    let (n, c, hw, grp) = (a.int(5)?, a.int(6)?, a.int(7)?, a.int(8)?);
    bools(a, 9)?;
    let xs = e.sizes(x);
    if grp <= 0 || c % grp != 0 || (n * c * hw) as usize != xs.iter().product::<usize>() {
        return Err(format!(
            "native_group_norm_backward: N={n}, C={c}, HxW={hw}, group={grp} for an input of sizes {xs:?}"
        ));
    }
    let (n, c, hw, grp) = (n as usize, c as usize, hw as usize, grp as usize);
    let shape = [n, grp, c / grp, hw];
    let xg = reshape(e, x, &shape)?;
    let gg = reshape(e, g, &shape)?;
    let m = reshape(e, mean, &[n, grp, 1, 1])?;
    let r = reshape(e, rstd, &[n, grp, 1, 1])?;
    let xc = e.call("sub", vec![t(xg), t(m)])?;
    let xhat = e.call("mul", vec![t(xc), t(r)])?;
    let wg = match w {
        Some(w) => Some(reshape(e, w, &[1, grp, c / grp, 1])?),
        None => None,
    };
    let gx = norm_input_grad(e, gg, xhat, wg, r, &[2, 3])?;
    let gx = reshape(e, gx, &xs)?;
    let gxh = e.call("mul", vec![t(gg), t(xhat)])?;
    let sum_c = |e: &mut dyn Emit, v: ValueId| -> R<ValueId> {
        let s = e.call("sum", vec![t(v), ints(&[0, 3])])?;
        reshape(e, s, &[c])
    };
    let gw = sum_c(e, gxh)?;
    let gb = sum_c(e, gg)?;
    Ok(vec![gx, gw, gb])
}

// ------------------------------------------------------------ activations

// ------------------------------------------------------------ upsampling

/// How an upsampling op picks its source elements.
#[derive(Clone, Copy, PartialEq)]
enum Pick {
    Nearest,
    /// `_upsample_nearest_exact*`: the nearest to the output's centre.
    NearestExact,
    Linear,
}

fn upsample_nearest(e: &mut dyn Emit, a: &A, sp: usize) -> Out {
    upsample(e, a, sp, Pick::Nearest)
}

fn upsample_nearest_exact(e: &mut dyn Emit, a: &A, sp: usize) -> Out {
    upsample(e, a, sp, Pick::NearestExact)
}

fn upsample_linear(e: &mut dyn Emit, a: &A, sp: usize) -> Out {
    upsample(e, a, sp, Pick::Linear)
}

/// Optional float argument `i`.
fn opt_float(a: &A, i: usize) -> R<Option<f64>> {
    match a.get(i) {
        Some(Arg::None) | None => Ok(None),
        _ => a.float(i).map(Some),
    }
}

/// `upsample_*(self, output_size, [align_corners,] scales...)`: one
/// spatial dimension at a time, the last first (as ATen's kernels nest
/// them), each an `index_select` of ATen's source indices (nearest) or
/// the two neighbours weighted (linear), the indices and weights computed
/// from `arange` in f32 as ATen's float kernels compute them.
fn upsample(e: &mut dyn Emit, a: &A, sp: usize, pick: Pick) -> Out {
    let op = match pick {
        Pick::Nearest => format!("upsample_nearest{sp}d"),
        Pick::NearestExact => format!("_upsample_nearest_exact{sp}d"),
        Pick::Linear => [
            "upsample_linear1d",
            "upsample_bilinear2d",
            "upsample_trilinear3d",
        ][sp - 1]
            .into(),
    };
    let x = *a.tensor(0)?;
    let xs = e.sizes(x);
    if xs.len() != sp + 2 {
        return Err(format!(
            "{op}: expected a {}D input, got sizes {xs:?}",
            sp + 2
        ));
    }
    let outs = a.int_list(1)?;
    if outs.len() != sp || outs.iter().any(|&o| o <= 0) {
        return Err(format!(
            "{op}: output_size must hold {sp} positive sizes, got {outs:?}"
        ));
    }
    let (align, first_scale) = if pick == Pick::Linear {
        (a.bool(2)?, 3)
    } else {
        (false, 2)
    };
    floats_only(e, x, &op)?;
    if xs[2..].contains(&0) {
        return Err(format!(
            "{op}: input sizes {xs:?} have an empty spatial dimension"
        ));
    }
    // f16 weights as eager's f32 arithmetic gives them (nearest only picks).
    let half = e.dtype(x) == DType::F16 && pick == Pick::Linear;
    let mut v = if half { e.cast(x, DType::F32)? } else { x };
    for k in (0..sp).rev() {
        let (len, out, d) = (xs[2 + k], outs[k] as usize, 2 + k);
        // ATen's `area_pixel_compute_scale`, in f32.
        let given = opt_float(a, first_scale + k)?.filter(|&f| f > 0.0);
        let sc = if align {
            if out > 1 {
                (len as f32 - 1.0) / (out as f32 - 1.0)
            } else {
                0.0
            }
        } else {
            given.map_or(len as f32 / out as f32, |f| (1.0 / f) as f32)
        };
        let j = e.call("arange", vec![int(out as i64), Arg::Dtype(DType::F32)])?;
        let last = |e: &mut dyn Emit, i: ValueId| -> R<ValueId> {
            e.call("clamp", vec![t(i), Arg::None, int(len as i64 - 1)])
        };
        if pick != Pick::Linear {
            if pick == Pick::Nearest && out == len {
                continue;
            }
            let j = if pick == Pick::NearestExact {
                e.call("add", vec![t(j), float(0.5)])?
            } else {
                j
            };
            let src = e.call("mul", vec![t(j), float(sc as f64)])?;
            // Non-negative: the conversion floors.
            let i = e.call("_to_copy", vec![t(src), Arg::Dtype(DType::I64)])?;
            let i = last(e, i)?;
            v = e.call("index_select", vec![t(v), int(d as i64), t(i)])?;
            continue;
        }
        let src = if align {
            e.call("mul", vec![t(j), float(sc as f64)])?
        } else {
            let j = e.call("add", vec![t(j), float(0.5)])?;
            let s = e.call("mul", vec![t(j), float(sc as f64)])?;
            let s = e.call("sub", vec![t(s), float(0.5)])?;
            e.call("clamp", vec![t(s), float(0.0), Arg::None])?
        };
        let i0 = e.call("_to_copy", vec![t(src), Arg::Dtype(DType::I64)])?;
        let i0 = last(e, i0)?;
        let i1 = e.call("add", vec![t(i0), int(1)])?;
        let i1 = last(e, i1)?;
        let f0 = e.call("_to_copy", vec![t(i0), Arg::Dtype(DType::F32)])?;
        let l1 = e.call("sub", vec![t(src), t(f0)])?;
        let l1 = e.call("clamp", vec![t(l1), float(0.0), float(1.0)])?;
        let nl = e.call("neg", vec![t(l1)])?;
        let l0 = e.call("add", vec![t(nl), float(1.0)])?;
        // [out] -> [out, 1, ...] along dimension d.
        let mut w_shape = vec![out];
        w_shape.extend(std::iter::repeat_n(1, sp - 1 - k));
        let (l0, l1) = (reshape(e, l0, &w_shape)?, reshape(e, l1, &w_shape)?);
        let x0 = e.call("index_select", vec![t(v), int(d as i64), t(i0)])?;
        let x1 = e.call("index_select", vec![t(v), int(d as i64), t(i1)])?;
        let p0 = e.call("mul", vec![t(x0), t(l0)])?;
        let p1 = e.call("mul", vec![t(x1), t(l1)])?;
        v = e.call("add", vec![t(p0), t(p1)])?;
    }
    if half {
        v = e.cast(v, DType::F16)?;
    } else if v == x {
        v = e.call("clone", vec![t(v)])?;
    }
    one(v)
}

/// ATen: `x * min(max(x + 3, 0), 6) / 6`.
pub fn hardswish(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let x = *a.tensor(0)?;
    floats_only(e, x, "hardswish")?;
    let p = e.call("add", vec![t(x), float(3.0)])?;
    let c = e.call("clamp", vec![t(p), float(0.0), float(6.0)])?;
    let m = e.call("mul", vec![t(x), t(c)])?;
    one(e.call("div", vec![t(m), float(6.0)])?)
}

/// ATen: `min(max(x + 3, 0), 6) / 6`.
pub fn hardsigmoid(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let x = *a.tensor(0)?;
    floats_only(e, x, "hardsigmoid")?;
    let p = e.call("add", vec![t(x), float(3.0)])?;
    let c = e.call("clamp", vec![t(p), float(0.0), float(6.0)])?;
    one(e.call("div", vec![t(c), float(6.0)])?)
}

/// `hardtanh(self, min_val=-1, max_val=1)`: a clamp.
pub fn hardtanh(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let x = *a.tensor(0)?;
    let (lo, hi) = (a.scalar(1)?.to_f64(), a.scalar(2)?.to_f64());
    if e.dtype(x) == DType::Bool {
        return Err("hardtanh of bool is not supported".into());
    }
    one(e.call("clamp", vec![t(x), float(lo), float(hi)])?)
}

/// `relu6`: `hardtanh(x, 0, 6)`.
pub fn relu6(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let x = *a.tensor(0)?;
    one(e.call("hardtanh", vec![t(x), float(0.0), float(6.0)])?)
}

/// ATen: `x * tanh(softplus(x))`.
pub fn mish(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let x = *a.tensor(0)?;
    floats_only(e, x, "mish")?;
    let sp = e.call("softplus", vec![t(x)])?;
    let th = e.call("tanh", vec![t(sp)])?;
    one(e.call("mul", vec![t(x), t(th)])?)
}

/// `logsumexp(self, dim, keepdim)`: `m + log(sum(exp(x - m)))`, `m` the
/// maximum (0 where it is infinite).
pub fn logsumexp(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let x = *a.tensor(0)?;
    floats_only(e, x, "logsumexp")?;
    let dims = ints(a.int_list(1)?);
    let keep = a.bool(2)?;
    let m = e.call("amax", vec![t(x), dims.clone(), Arg::Bool(true)])?;
    let ab = e.call("abs", vec![t(m)])?;
    let inf = e.call("eq", vec![t(ab), float(f64::INFINITY)])?;
    let m = e.call("masked_fill", vec![t(m), t(inf), float(0.0)])?;
    let d = e.call("sub", vec![t(x), t(m)])?;
    let ex = e.call("exp", vec![t(d)])?;
    let s = e.call("sum", vec![t(ex), dims.clone(), Arg::Bool(keep)])?;
    let l = e.call("log", vec![t(s)])?;
    let m = if keep {
        m
    } else {
        e.call("squeeze", vec![t(m), dims])?
    };
    one(e.call("add", vec![t(l), t(m)])?)
}

// ------------------------------------------------------------------ shifts

/// `roll(self, shifts, dims)`: per dimension, the last `shift` elements
/// moved first (`cat` of two `narrow`s); without dims, of the flattened
/// tensor.
pub fn roll(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let x = *a.tensor(0)?;
    let sizes = e.sizes(x);
    let shifts = a.int_list(1)?.to_vec();
    let dims = a.int_list(2)?.to_vec();
    let mut v = x;
    let (now, pairs): (Vec<usize>, Vec<(i64, usize)>) = if dims.is_empty() {
        if shifts.len() != 1 {
            return Err(format!(
                "roll: without dims it takes one shift, got {shifts:?}"
            ));
        }
        v = reshape(e, v, &[sizes.iter().product()])?;
        (vec![sizes.iter().product()], vec![(shifts[0], 0)])
    } else {
        if dims.len() != shifts.len() {
            return Err(format!(
                "roll: shifts and dimensions must align. shifts: {}, dims: {}",
                shifts.len(),
                dims.len()
            ));
        }
        let pairs = shifts
            .iter()
            .zip(&dims)
            .map(|(&s, &d)| Ok((s, crate::meta::wrap_dim(d, sizes.len())?)))
            .collect::<R<Vec<_>>>()?;
        (sizes.clone(), pairs)
    };
    for (s, d) in pairs {
        let len = now[d] as i64;
        if len == 0 {
            continue;
        }
        let k = s.rem_euclid(len);
        if k == 0 {
            continue;
        }
        let tail = e.call("narrow", vec![t(v), int(d as i64), int(len - k), int(k)])?;
        let head = e.call("narrow", vec![t(v), int(d as i64), int(0), int(len - k)])?;
        v = e.call(
            "cat",
            vec![Arg::TensorList(vec![Some(tail), Some(head)]), int(d as i64)],
        )?;
    }
    if dims.is_empty() {
        v = reshape(e, v, &sizes)?;
    }
    one(e.call("clone", vec![t(v)])?)
}

/// `diff(self, n, dim, prepend, append)`: differences of neighbours along
/// `dim`, `n` times, after `prepend` and `append` are joined (bools:
/// `ne`, as ATen).
pub fn diff(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let x = *a.tensor(0)?;
    let times = a.int(1)?;
    if times < 0 {
        return Err(format!("diff expects n to be non-negative, got {times}"));
    }
    let rank = e.rank(x);
    if rank == 0 {
        return Err("diff expects input to be at least one-dimensional".into());
    }
    let d = crate::meta::wrap_dim(a.int(2)?, rank)?;
    let pre = a.opt_tensor(3)?.copied();
    let app = a.opt_tensor(4)?.copied();
    let mut v = x;
    if pre.is_some() || app.is_some() {
        let parts: Vec<Option<ValueId>> = [pre, Some(x), app]
            .into_iter()
            .flatten()
            .map(Some)
            .collect();
        v = e.call("cat", vec![Arg::TensorList(parts), int(d as i64)])?;
    }
    let mut len = e.sizes(v)[d];
    let op = if e.dtype(x) == DType::Bool {
        "ne"
    } else {
        "sub"
    };
    for _ in 0..times {
        if len == 0 {
            break;
        }
        let hi = e.call(
            "narrow",
            vec![t(v), int(d as i64), int(1), int(len as i64 - 1)],
        )?;
        let lo = e.call(
            "narrow",
            vec![t(v), int(d as i64), int(0), int(len as i64 - 1)],
        )?;
        v = e.call(op, vec![t(hi), t(lo)])?;
        len -= 1;
    }
    one(e.call("clone", vec![t(v)])?)
}

// ---------------------------------------------------------------- padding

/// How `pad` fills the border.
#[derive(Clone, Copy, PartialEq)]
enum PadMode {
    Reflect,
    Replicate,
    Circular,
}

/// `pad(self, pad, mode, value)`: `constant_pad_nd` for `constant`; the
/// other modes per dimension (the pairs of `pad` from the last dimension
/// back) as a `cat` of the input with its mirrored (`reflect`), edge
/// (`replicate`) or opposite (`circular`) slices.
pub fn pad(e: &mut dyn Emit, _: &str, a: &A) -> Out {
    let x = *a.tensor(0)?;
    let p = a.int_list(1)?.to_vec();
    let mode = match a.opt_str(2)?.unwrap_or("constant") {
        "constant" => {
            let value = match a.get(3) {
                Some(Arg::Float(v)) => *v,
                _ => 0.0,
            };
            return one(e.call("constant_pad_nd", vec![t(x), ints(&p), float(value)])?);
        }
        "reflect" => PadMode::Reflect,
        "replicate" => PadMode::Replicate,
        "circular" => PadMode::Circular,
        m => {
            return Err(format!(
                "Unrecognised padding mode {m} (it takes constant, reflect, replicate or circular)"
            ))
        }
    };
    if matches!(a.get(3), Some(Arg::Float(v)) if *v != 0.0) {
        return Err(format!(
            "Padding mode \"{}\" doesn't take in value argument",
            a.opt_str(2)?.unwrap_or_default()
        ));
    }
    // ATen pads 1, 2 or 3 trailing dimensions of a (un)batched input.
    let rank = e.rank(x);
    if !matches!((p.len(), rank), (2, 2 | 3) | (4, 3 | 4) | (6, 4 | 5)) {
        return Err(format!(
            "Only 2D, 3D, 4D, 5D padding with non-constant padding are supported for now \
             (padding {p:?} of an input of rank {rank})"
        ));
    }
    one(pad_border(e, x, &p, mode, "pad")?)
}

fn pad_border(e: &mut dyn Emit, x: ValueId, p: &[i64], mode: PadMode, op: &str) -> R<ValueId> {
    let sizes = e.sizes(x);
    if !p.len().is_multiple_of(2) || p.len() / 2 > sizes.len() {
        return Err(format!(
            "{op}: padding length must be even and at most twice the input's rank ({sizes:?}), \
             got {p:?}"
        ));
    }
    let mut v = x;
    for (i, pair) in p.chunks(2).enumerate() {
        let d = sizes.len() - 1 - i;
        let (mut l, mut r) = (pair[0], pair[1]);
        let mut n = sizes[d];
        if (l < 0 || r < 0) && mode == PadMode::Replicate {
            // A negative side crops; replicating the cropped tensor's edge
            // is what eager's clamped source index reads.
            let (cl, cr) = ((-l).max(0) as usize, (-r).max(0) as usize);
            if cl + cr > n {
                return Err(format!(
                    "{op}: padding {p:?} crops more than the {n} elements of dimension {d}"
                ));
            }
            v = e.call(
                "narrow",
                vec![
                    t(v),
                    int(d as i64),
                    int(cl as i64),
                    int((n - cl - cr) as i64),
                ],
            )?;
            n -= cl + cr;
            (l, r) = (l.max(0), r.max(0));
        }
        if l < 0 || r < 0 {
            return Err(format!(
                "{op}: negative padding {p:?} is only for constant and replicate modes"
            ));
        }
        let (l, r) = (l as usize, r as usize);
        let fits = match mode {
            PadMode::Reflect => l < n && r < n,
            PadMode::Replicate => n > 0 || l + r == 0,
            PadMode::Circular => l <= n && r <= n,
        };
        if !fits {
            return Err(format!(
                "{op}: padding ({l}, {r}) at dimension {d} of an input of sizes {sizes:?} is too \
                 large for this mode"
            ));
        }
        if l + r == 0 {
            continue;
        }
        let di = int(d as i64);
        let narrow = |e: &mut dyn Emit, v: ValueId, s: usize, len: usize| {
            e.call(
                "narrow",
                vec![t(v), di.clone(), int(s as i64), int(len as i64)],
            )
        };
        let side = |e: &mut dyn Emit, v: ValueId, left: bool, k: usize| -> R<ValueId> {
            match mode {
                PadMode::Reflect => {
                    let s = if left {
                        narrow(e, v, 1, k)?
                    } else {
                        narrow(e, v, n - 1 - k, k)?
                    };
                    e.call("flip", vec![t(s), ints(&[d as i64])])
                }
                PadMode::Replicate => {
                    let edge = narrow(e, v, if left { 0 } else { n - 1 }, 1)?;
                    let mut to = e.sizes(v);
                    to[d] = k;
                    e.call("expand", vec![t(edge), usizes(&to)])
                }
                PadMode::Circular if left => narrow(e, v, n - k, k),
                PadMode::Circular => narrow(e, v, 0, k),
            }
        };
        let mut parts = vec![];
        if l > 0 {
            parts.push(Some(side(e, v, true, l)?));
        }
        parts.push(Some(v));
        if r > 0 {
            parts.push(Some(side(e, v, false, r)?));
        }
        v = e.call("cat", vec![Arg::TensorList(parts), di])?;
    }
    Ok(v)
}

fn border_pad(e: &mut dyn Emit, a: &A, sp: usize, mode: PadMode, op: &str) -> Out {
    let x = *a.tensor(0)?;
    let rank = e.rank(x);
    if rank != sp + 1 && rank != sp + 2 {
        return Err(format!(
            "{op}: expected {}D or {}D input, got sizes {:?}",
            sp + 1,
            sp + 2,
            e.sizes(x)
        ));
    }
    let p = a.int_list(1)?.to_vec();
    if p.len() != 2 * sp {
        return Err(format!(
            "{op}: padding must have {} entries, got {p:?}",
            2 * sp
        ));
    }
    one(pad_border(e, x, &p, mode, op)?)
}

fn reflection_pad(e: &mut dyn Emit, a: &A, sp: usize) -> Out {
    border_pad(e, a, sp, PadMode::Reflect, &format!("reflection_pad{sp}d"))
}

fn replication_pad(e: &mut dyn Emit, a: &A, sp: usize) -> Out {
    border_pad(
        e,
        a,
        sp,
        PadMode::Replicate,
        &format!("replication_pad{sp}d"),
    )
}
