//! Shape rules and reference kernels of the ops that are neither views nor
//! elementwise: factories, copies and fills, scatters, indexing, reductions
//! and linear algebra. `infer` works on metadata alone; `eval` gets the
//! inferred result metas and fills them.

use super::args::{ArgsExt, Scalar};
use super::layout::like;
use super::views;
use super::RemapKind;
use crate::dtype::DType;
use crate::meta::{broadcast_shapes, wrap_dim, Meta, Metas, ShapeFmt};
use crate::schema::Arg;
use crate::tensor::RTensor;

pub type A<'a> = [Arg<&'a Meta>];
pub type R = [Arg<RTensor>];
type Res<T> = Result<T, String>;

fn sizes_of(l: &[i64]) -> Res<Vec<usize>> {
    l.iter()
        .map(|&s| {
            usize::try_from(s)
                .map_err(|_| format!("Trying to create tensor with negative dimension {s}: {l:?}"))
        })
        .collect()
}

fn one(meta: Meta, vals: &[f64]) -> Res<Vec<RTensor>> {
    Ok(vec![RTensor::from_values(meta, vals)])
}

// ------------------------------------------------------------ factories

pub fn zeros_infer(a: &A) -> Res<Metas> {
    Ok(smallvec::smallvec![Meta::contiguous(
        a.opt_dtype(1)?.unwrap_or(DType::F32),
        sizes_of(a.int_list(0)?)?,
    )])
}

pub fn zeros_eval(_: &R, o: &[Meta]) -> Res<Vec<RTensor>> {
    one(o[0].clone(), &vec![0.0; o[0].numel()])
}

pub fn ones_eval(_: &R, o: &[Meta]) -> Res<Vec<RTensor>> {
    one(o[0].clone(), &vec![1.0; o[0].numel()])
}

pub fn full_infer(a: &A) -> Res<Metas> {
    let v = a.scalar(1)?;
    Ok(smallvec::smallvec![Meta::contiguous(
        a.opt_dtype(2)?.unwrap_or(v.default_dtype()),
        sizes_of(a.int_list(0)?)?,
    )])
}

pub fn full_eval(a: &R, o: &[Meta]) -> Res<Vec<RTensor>> {
    one(o[0].clone(), &vec![a.scalar(1)?.to_f64(); o[0].numel()])
}

/// `arange(end)`, `arange(start, end)`, `arange(start, end, step)`, each
/// with an optional dtype after the numbers.
fn arange_params<T>(a: &[Arg<T>]) -> Res<(Vec<Scalar>, Option<DType>)> {
    let mut nums = vec![];
    let mut dtype = None;
    for i in 0..a.len() {
        match a.get(i) {
            Some(Arg::Dtype(d)) => dtype = Some(*d),
            Some(Arg::None) => {}
            _ => nums.push(a.scalar(i)?),
        }
    }
    Ok((nums, dtype))
}

fn arange_range<T>(a: &[Arg<T>]) -> Res<(f64, f64, f64, usize, DType)> {
    let (nums, dtype) = arange_params(a)?;
    let (start, end, step) = match nums[..] {
        [e] => (Scalar::Int(0), e, Scalar::Int(1)),
        [s, e] => (s, e, Scalar::Int(1)),
        [s, e, st] => (s, e, st),
        _ => return Err("arange takes one to three numbers".into()),
    };
    let any_float = [start, end, step]
        .iter()
        .any(|s| matches!(s, Scalar::Float(_)));
    let dt = dtype.unwrap_or(if any_float { DType::F32 } else { DType::I64 });
    let (s, e, st) = (start.to_f64(), end.to_f64(), step.to_f64());
    if st == 0.0 {
        return Err("step must be nonzero".into());
    }
    if !s.is_finite() || !e.is_finite() {
        return Err(format!("unsupported range: {s} -> {e}"));
    }
    if (st > 0.0 && e < s) || (st < 0.0 && e > s) {
        return Err("upper bound and larger bound inconsistent with step sign".into());
    }
    let n = ((e - s) / st).ceil().max(0.0) as usize;
    Ok((s, e, st, n, dt))
}

pub fn arange_infer(a: &A) -> Res<Metas> {
    let (_, _, _, n, dt) = arange_range(a)?;
    Ok(smallvec::smallvec![Meta::contiguous(dt, vec![n])])
}

pub fn arange_eval(a: &R, o: &[Meta]) -> Res<Vec<RTensor>> {
    let (s, _, st, n, _) = arange_range(a)?;
    let vals: Vec<f64> = (0..n).map(|i| s + st * i as f64).collect();
    one(o[0].clone(), &vals)
}

pub fn like_infer(a: &A) -> Res<Metas> {
    let m = a.tensor(0)?;
    Ok(smallvec::smallvec![like(
        m,
        a.opt_dtype(1)?.unwrap_or(m.dtype)
    )])
}

pub fn full_like_infer(a: &A) -> Res<Metas> {
    let m = a.tensor(0)?;
    Ok(smallvec::smallvec![like(
        m,
        a.opt_dtype(2)?.unwrap_or(m.dtype)
    )])
}

pub fn full_like_eval(a: &R, o: &[Meta]) -> Res<Vec<RTensor>> {
    one(o[0].clone(), &vec![a.scalar(1)?.to_f64(); o[0].numel()])
}

// --------------------------------------------------- copies and fills

/// ATen's `clone_preserve_strides`, used by `copy` and the scatters: a copy
/// of the whole storage viewed with the same geometry (so offsets of a
/// later `as_strided` keep meaning the same), or a plain clone when the
/// input has zero-stride overlap.
fn preserve_strides_meta(m: &Meta) -> Meta {
    if m.sizes
        .iter()
        .zip(&m.strides)
        .any(|(&s, &st)| s > 1 && st == 0)
    {
        like(m, m.dtype)
    } else {
        m.clone()
    }
}

fn clone_preserve_strides(t: &RTensor, out: &Meta) -> RTensor {
    if *out == t.meta {
        let data = t.storage.data.borrow().clone();
        RTensor {
            storage: std::rc::Rc::new(crate::tensor::Storage {
                dtype: t.dtype(),
                data: data.into(),
            }),
            meta: out.clone(),
        }
    } else {
        RTensor::from_values(out.clone(), &t.values())
    }
}

/// Same shape and dtype as argument 0, laid out like it (`clone`,
/// `copy`, `fill`, `zero`, `index_put`).
pub fn like_self_infer(a: &A) -> Res<Metas> {
    let m = a.tensor(0)?;
    Ok(smallvec::smallvec![like(m, m.dtype)])
}

pub fn clone_eval(a: &R, o: &[Meta]) -> Res<Vec<RTensor>> {
    one(o[0].clone(), &a.tensor(0)?.values())
}

fn expandable(src: &[usize], dst: &[usize]) -> Res<()> {
    match broadcast_shapes(dst, src) {
        Ok(s) if s[..] == dst[..] => Ok(()),
        _ => Err(format!(
            "the source of shape {} cannot be broadcast to the destination's shape {}",
            ShapeFmt(src),
            ShapeFmt(dst)
        )),
    }
}

pub fn copy_infer(a: &A) -> Res<Metas> {
    let (m, src) = (a.tensor(0)?, a.tensor(1)?);
    expandable(&src.sizes, &m.sizes)?;
    Ok(smallvec::smallvec![preserve_strides_meta(m)])
}

pub fn copy_eval(a: &R, o: &[Meta]) -> Res<Vec<RTensor>> {
    let out = clone_preserve_strides(a.tensor(0)?, &o[0]);
    out.write(&a.tensor(1)?.values_broadcast(&o[0].sizes));
    Ok(vec![out])
}

fn zero_dim_value(t: &Meta, op: &str) -> Res<()> {
    if t.dim() != 0 {
        return Err(format!(
            "{op} only supports 0-dimension value tensor but got tensor with {} dimensions.",
            t.dim()
        ));
    }
    Ok(())
}

pub fn fill_infer(a: &A) -> Res<Metas> {
    if a.is_tensor(1) {
        zero_dim_value(a.tensor(1)?, "fill_")?;
    }
    like_self_infer(a)
}

fn scalar_or_0d(a: &R, i: usize) -> Res<f64> {
    if a.is_tensor(i) {
        Ok(a.tensor(i)?.values()[0])
    } else {
        Ok(a.scalar(i)?.to_f64())
    }
}

pub fn fill_eval(a: &R, o: &[Meta]) -> Res<Vec<RTensor>> {
    one(o[0].clone(), &vec![scalar_or_0d(a, 1)?; o[0].numel()])
}

pub fn masked_fill_infer(a: &A) -> Res<Metas> {
    let (m, mask) = (a.tensor(0)?, a.tensor(1)?);
    if mask.dtype != DType::Bool {
        return Err(format!(
            "masked_fill_ only supports boolean masks, but got mask with dtype {}",
            mask.dtype
        ));
    }
    if a.is_tensor(2) {
        zero_dim_value(a.tensor(2)?, "masked_fill_")?;
    }
    Ok(smallvec::smallvec![Meta::contiguous(
        m.dtype,
        broadcast_shapes(&m.sizes, &mask.sizes)?,
    )])
}

pub fn masked_fill_eval(a: &R, o: &[Meta]) -> Res<Vec<RTensor>> {
    let shape = &o[0].sizes;
    let mut vals = a.tensor(0)?.values_broadcast(shape);
    let mask = a.tensor(1)?.values_broadcast(shape);
    let v = scalar_or_0d(a, 2)?;
    for (x, m) in vals.iter_mut().zip(mask) {
        if m != 0.0 {
            *x = v;
        }
    }
    one(o[0].clone(), &vals)
}

fn check_index_dtype(m: &Meta, what: &str) -> Res<()> {
    if !matches!(m.dtype, DType::I64 | DType::I32) {
        return Err(format!(
            "{what} must be an i64 or i32 tensor, got {}",
            m.dtype
        ));
    }
    Ok(())
}

pub fn index_put_infer(a: &A) -> Res<Metas> {
    let (m, values) = (a.tensor(0)?, a.tensor(2)?);
    let idx = a.tensor_list(1)?;
    if idx.len() > m.dim() {
        return Err(format!(
            "too many indices for tensor of dimension {} (got {})",
            m.dim(),
            idx.len()
        ));
    }
    let mut bshape = crate::meta::Dims::new();
    for t in idx.iter().flatten() {
        if t.dtype != DType::Bool {
            check_index_dtype(t, "tensors used as indices")?;
            bshape = broadcast_shapes(&bshape, &t.sizes)?;
        }
    }
    if values.dtype != m.dtype {
        return Err(format!(
            "Index put requires the source and destination dtypes match, got {} for the destination and {} for the source.",
            m.dtype, values.dtype
        ));
    }
    like_self_infer(a)
}

fn wrap_index(i: f64, size: usize, dim: usize) -> Res<usize> {
    let s = size as i64;
    let i = i as i64;
    if i < -s || i >= s {
        return Err(format!(
            "index {i} is out of bounds for dimension {dim} with size {size}"
        ));
    }
    Ok(if i < 0 { i + s } else { i } as usize)
}

/// The layout of advanced indexing `self[indices]` (eager's rules): the
/// index tensors broadcast to `bshape`; that block of dimensions stands
/// where the indexed dimensions were when they are adjacent, else first.
#[derive(Clone, Debug, PartialEq)]
pub struct Advanced {
    pub bshape: Vec<usize>,
    /// Indexed dimensions of self.
    pub adv: Vec<usize>,
    /// Self's other dimensions before and after the index block.
    pub before: Vec<usize>,
    pub after: Vec<usize>,
    /// The shape of `self[indices]`.
    pub rshape: Vec<usize>,
}

impl Advanced {
    /// `sizes`: self's; `idx`: the shape of each dimension's index tensor
    /// (`None`: the whole dimension).
    pub fn of(sizes: &[usize], idx: &[Option<&[usize]>]) -> Res<Advanced> {
        if idx.len() > sizes.len() {
            return Err(format!(
                "too many indices for tensor of dimension {} (got {})",
                sizes.len(),
                idx.len()
            ));
        }
        let mut bshape = crate::meta::Dims::new();
        for s in idx.iter().flatten() {
            bshape = broadcast_shapes(&bshape, s)?;
        }
        let adv: Vec<usize> = (0..idx.len()).filter(|&d| idx[d].is_some()).collect();
        let adjacent = adv.windows(2).all(|w| w[1] == w[0] + 1);
        let rest: Vec<usize> = (0..sizes.len()).filter(|d| !adv.contains(d)).collect();
        let (before, after): (Vec<usize>, Vec<usize>) = if adjacent && !adv.is_empty() {
            (
                rest.iter().copied().filter(|&d| d < adv[0]).collect(),
                rest.iter().copied().filter(|&d| d > adv[0]).collect(),
            )
        } else {
            (vec![], rest)
        };
        let mut rshape: Vec<usize> = before.iter().map(|&d| sizes[d]).collect();
        rshape.extend(&bshape);
        rshape.extend(after.iter().map(|&d| sizes[d]));
        Ok(Advanced {
            bshape: bshape.into_vec(),
            adv,
            before,
            after,
            rshape,
        })
    }
}

/// `index.Tensor(self, indices)`: `self[indices]` with integer index
/// tensors (a bool mask's result shape depends on its values, which static
/// shapes cannot express).
pub fn index_infer(a: &A) -> Res<Metas> {
    let m = a.tensor(0)?;
    let idx = a.tensor_list(1)?;
    for t in idx.iter().flatten() {
        if t.dtype == DType::Bool {
            return Err(
                "indexing with a bool mask gives a shape that depends on the mask's \
                        values, which Kiln's static shapes cannot express; use masked_fill or \
                        where, or integer indices"
                    .into(),
            );
        }
        check_index_dtype(t, "tensors used as indices")?;
    }
    let shapes: Vec<Option<&[usize]>> = idx.iter().map(|t| t.map(|t| &t.sizes[..])).collect();
    let lay = Advanced::of(&m.sizes, &shapes)?;
    Ok(smallvec::smallvec![Meta::contiguous(m.dtype, lay.rshape)])
}

pub fn index_eval(a: &R, o: &[Meta]) -> Res<Vec<RTensor>> {
    let this = a.tensor(0)?;
    let sizes = this.sizes().to_vec();
    let idx = a.tensor_list(1)?;
    let shapes: Vec<Option<&[usize]>> = idx.iter().map(|t| t.map(|t| t.sizes())).collect();
    let lay = Advanced::of(&sizes, &shapes)?;
    let idx_b: Vec<Option<Vec<f64>>> = idx
        .iter()
        .map(|t| t.map(|t| t.values_broadcast(&lay.bshape)))
        .collect();
    let tv = this.values();
    let cstr = crate::meta::contiguous_strides(&sizes);
    let rstr = crate::meta::contiguous_strides(&lay.rshape);
    let bstr = crate::meta::contiguous_strides(&lay.bshape);
    let (nb, nbs) = (lay.before.len(), lay.bshape.len());
    let mut out = Vec::with_capacity(o[0].numel());
    for r in 0..o[0].numel() {
        let ridx: Vec<usize> = (0..lay.rshape.len())
            .map(|j| (r / rstr[j]) % lay.rshape[j].max(1))
            .collect();
        let bpos: usize = (0..nbs).map(|j| ridx[nb + j] * bstr[j]).sum();
        let mut off = 0;
        for (j, &d) in lay.before.iter().enumerate() {
            off += ridx[j] * cstr[d];
        }
        for (j, &d) in lay.after.iter().enumerate() {
            off += ridx[nb + nbs + j] * cstr[d];
        }
        for &d in &lay.adv {
            let i = idx_b[d].as_ref().map(|v| v[bpos]).unwrap_or(0.0);
            off += wrap_index(i, sizes[d], d)? * cstr[d];
        }
        out.push(tv[off]);
    }
    one(o[0].clone(), &out)
}

/// Advanced indexing `self[indices] = values` (or `+=` when accumulating)
/// on a row-major logical copy of `self`.
pub fn index_put_eval(a: &R, o: &[Meta]) -> Res<Vec<RTensor>> {
    let this = a.tensor(0)?;
    let sizes = this.sizes().to_vec();
    let mut vals = this.values();
    let values = a.tensor(2)?;
    let accumulate = a.bool(3)?;
    // Expand bool masks into one integer index per masked dimension.
    let mut idx: Vec<Option<(Vec<usize>, Vec<f64>)>> = vec![];
    for t in a.tensor_list(1)? {
        match t {
            None => idx.push(None),
            Some(t) if t.dtype() == DType::Bool => {
                let k = t.meta.dim();
                let start = idx.len();
                if start + k > sizes.len() || t.sizes() != &sizes[start..start + k] {
                    return Err(format!(
                        "The shape of the mask {} at index {start} does not match the shape of the indexed tensor {}",
                        ShapeFmt(t.sizes()),
                        ShapeFmt(&sizes)
                    ));
                }
                let mv = t.values();
                let hits: Vec<usize> = (0..mv.len()).filter(|&i| mv[i] != 0.0).collect();
                let cstrides = crate::meta::contiguous_strides(t.sizes());
                for (&st, &size) in cstrides.iter().zip(t.sizes()) {
                    let col = hits.iter().map(|&h| ((h / st) % size) as f64).collect();
                    idx.push(Some((vec![hits.len()], col)));
                }
            }
            Some(t) => idx.push(Some((t.sizes().to_vec(), t.values()))),
        }
    }
    let shapes: Vec<Option<&[usize]>> = idx
        .iter()
        .map(|x| x.as_ref().map(|(s, _)| &s[..]))
        .collect();
    let lay = Advanced::of(&sizes, &shapes)?;
    idx.resize(sizes.len(), None);
    let (bshape, rshape, before, after, adv) =
        (&lay.bshape, &lay.rshape, &lay.before, &lay.after, &lay.adv);
    expandable(values.sizes(), rshape).map_err(|_| {
        format!("shape mismatch: value tensor of shape {} cannot be broadcast to indexing result of shape {}", ShapeFmt(values.sizes()), ShapeFmt(rshape))
    })?;
    let vv = values.values_broadcast(rshape);
    let idx_b: Vec<Option<Vec<f64>>> = idx
        .iter()
        .map(|x| {
            x.as_ref().map(|(s, v)| {
                let m = Meta::contiguous(DType::F32, s.clone());
                let st = crate::meta::broadcast_strides(&m, bshape);
                crate::meta::OffsetIter::new(bshape, &st, 0)
                    .map(|o| v[o])
                    .collect()
            })
        })
        .collect();
    let cstr = crate::meta::contiguous_strides(&sizes);
    let rstr = crate::meta::contiguous_strides(rshape);
    let bstr = crate::meta::contiguous_strides(bshape);
    let nb = before.len();
    for (r, &value) in vv.iter().enumerate() {
        let ridx: Vec<usize> = (0..rshape.len())
            .map(|j| (r / rstr[j]) % rshape[j].max(1))
            .collect();
        let bpos: usize = (0..bshape.len()).map(|j| ridx[nb + j] * bstr[j]).sum();
        let mut off = 0;
        for (j, &d) in before.iter().enumerate() {
            off += ridx[j] * cstr[d];
        }
        for (j, &d) in after.iter().enumerate() {
            off += ridx[nb + bshape.len() + j] * cstr[d];
        }
        for &d in adv {
            let i = idx_b[d].as_ref().map(|v| v[bpos]).unwrap_or(0.0);
            off += wrap_index(i, sizes[d], d)? * cstr[d];
        }
        if accumulate {
            vals[off] = this.dtype().cast(vals[off] + value);
        } else {
            vals[off] = value;
        }
    }
    one(o[0].clone(), &vals)
}

// ------------------------------------------------------------ scatters

pub type ViewFn = fn(&A) -> Res<Metas>;

/// The view a scatter writes through, taken on its own output: the
/// scatter's arguments are the view's, with `src` removed.
fn scatter_view(a: &A, out: &Meta, view: ViewFn) -> Res<Meta> {
    let mut va: Vec<Arg<&Meta>> = vec![Arg::Tensor(out)];
    va.extend(a[2..].iter().cloned());
    Ok(view(&va)?.remove(0))
}

pub fn scatter_infer(a: &A, view: ViewFn) -> Res<Metas> {
    let (m, src) = (a.tensor(0)?, a.tensor(1)?);
    let out = preserve_strides_meta(m);
    let v = scatter_view(a, &out, view)?;
    if v.sizes != src.sizes {
        return Err(format!(
            "expected src to have a size equal to the slice of self. src size = {}, slice size = {}",
            ShapeFmt(&src.sizes),
            ShapeFmt(&v.sizes)
        ));
    }
    Ok(smallvec::smallvec![out])
}

pub fn scatter_eval(a: &R, o: &[Meta], view: ViewFn) -> Res<Vec<RTensor>> {
    let out = clone_preserve_strides(a.tensor(0)?, &o[0]);
    let am = super::args::metas(a);
    let v = scatter_view(&am, &out.meta, view)?;
    out.view(v).write(&a.tensor(1)?.values());
    Ok(vec![out])
}

// ---------------------------------------------------------- reductions

/// Groups the row-major `vals` of a `sizes` tensor by the output index of
/// a reduction over `reduced` dims (one group per output element).
fn groups(vals: &[f64], sizes: &[usize], reduced: &[bool]) -> Vec<Vec<f64>> {
    let out_sizes: Vec<usize> = sizes
        .iter()
        .zip(reduced)
        .map(|(&s, &r)| if r { 1 } else { s })
        .collect();
    let ostr = crate::meta::contiguous_strides(&out_sizes);
    let istr = crate::meta::contiguous_strides(sizes);
    let mut g = vec![vec![]; crate::meta::numel(&out_sizes)];
    for (i, &v) in vals.iter().enumerate() {
        let mut o = 0;
        for d in 0..sizes.len() {
            if !reduced[d] {
                o += ((i / istr[d]) % sizes[d]) * ostr[d];
            }
        }
        g[o].push(v);
    }
    g
}

fn reduced_dims(m: &Meta, dims: Option<&[i64]>) -> Res<Vec<bool>> {
    let mut r = vec![false; m.dim()];
    match dims {
        None => r.iter_mut().for_each(|x| *x = true),
        Some([]) => r.iter_mut().for_each(|x| *x = true),
        Some(l) => {
            for &d in l {
                let d = wrap_dim(d, m.dim())?;
                if m.dim() > 0 {
                    if r[d] {
                        return Err(format!(
                            "dim {d} appears multiple times in the list of dims"
                        ));
                    }
                    r[d] = true;
                }
            }
        }
    }
    Ok(r)
}

fn reduced_shape(m: &Meta, r: &[bool], keepdim: bool) -> Vec<usize> {
    m.sizes
        .iter()
        .zip(r)
        .filter_map(|(&s, &x)| {
            if !x {
                Some(s)
            } else if keepdim {
                Some(1)
            } else {
                None
            }
        })
        .collect()
}

/// A reduction's dims (None: all), keepdim and dtype.
type ReduceArgs<'a> = (Option<&'a [i64]>, bool, Option<DType>);

/// (dims, keepdim, dtype) of `sum`/`mean` overloads: `(self, dtype?)` or
/// `(self, dim?, keepdim, dtype?)`.
fn reduce_args<T>(a: &[Arg<T>]) -> Res<ReduceArgs<'_>> {
    if a.len() <= 2 {
        Ok((None, false, a.opt_dtype(1)?))
    } else {
        Ok((a.opt_int_list(1)?, a.bool(2)?, a.opt_dtype(3)?))
    }
}

fn sum_dtype(m: &Meta, dtype: Option<DType>) -> DType {
    dtype.unwrap_or(if m.dtype.is_float() {
        m.dtype
    } else {
        DType::I64
    })
}

pub fn sum_infer(a: &A) -> Res<Metas> {
    let m = a.tensor(0)?;
    let (dims, keep, dt) = reduce_args(a)?;
    let r = reduced_dims(m, dims)?;
    Ok(smallvec::smallvec![Meta::contiguous(
        sum_dtype(m, dt),
        reduced_shape(m, &r, keep),
    )])
}

pub fn mean_infer(a: &A) -> Res<Metas> {
    let m = a.tensor(0)?;
    let (_, _, dt) = reduce_args(a)?;
    let out = dt.unwrap_or(m.dtype);
    if !out.is_float() {
        return Err(format!(
            "mean(): could not infer output dtype. Input dtype must be either a floating point or complex dtype. Got: {}",
            out
        ));
    }
    let mut r = sum_infer(a)?;
    r[0].dtype = out;
    Ok(r)
}

fn reduce_eval(
    a: &R,
    o: &[Meta],
    dims: Option<&[i64]>,
    f: impl Fn(&[f64]) -> Res<f64>,
) -> Res<Vec<RTensor>> {
    let t = a.tensor(0)?;
    let r = reduced_dims(&t.meta, dims)?;
    let vals: Vec<f64> = t.values().iter().map(|&v| o[0].dtype.cast(v)).collect();
    let out = groups(&vals, t.sizes(), &r)
        .iter()
        .map(|g| f(g))
        .collect::<Res<Vec<_>>>()?;
    one(o[0].clone(), &out)
}

pub fn sum_eval(a: &R, o: &[Meta]) -> Res<Vec<RTensor>> {
    let dims = reduce_args(a)?.0;
    reduce_eval(a, o, dims, |g| Ok(g.iter().sum()))
}

pub fn mean_eval(a: &R, o: &[Meta]) -> Res<Vec<RTensor>> {
    let dims = reduce_args(a)?.0;
    reduce_eval(a, o, dims, |g| Ok(g.iter().sum::<f64>() / g.len() as f64))
}

/// The dims `prod` reduces: `prod(self, dtype?)` all of them,
/// `prod.dim_int(self, dim, keepdim, dtype?)` one.
fn prod_args<T>(a: &[Arg<T>]) -> Res<(Option<Vec<i64>>, bool, Option<DType>)> {
    if a.len() <= 2 {
        Ok((None, false, a.opt_dtype(1)?))
    } else {
        Ok((Some(vec![a.int(1)?]), a.bool(2)?, a.opt_dtype(3)?))
    }
}

pub fn prod_infer(a: &A) -> Res<Metas> {
    let m = a.tensor(0)?;
    let (dims, keep, dt) = prod_args(a)?;
    let r = reduced_dims(m, dims.as_deref())?;
    Ok(smallvec::smallvec![Meta::contiguous(
        sum_dtype(m, dt),
        reduced_shape(m, &r, keep),
    )])
}

pub fn prod_eval(a: &R, o: &[Meta]) -> Res<Vec<RTensor>> {
    let dims = prod_args(a)?.0;
    let dt = o[0].dtype;
    // Integers wrap at every step, as eager's do.
    reduce_eval(a, o, dims.as_deref(), move |g| {
        Ok(g.iter().fold(1.0, |acc, &x| {
            if dt.is_float() {
                acc * x
            } else {
                dt.cast(acc * x)
            }
        }))
    })
}

pub fn amax_infer(a: &A) -> Res<Metas> {
    let m = a.tensor(0)?;
    let r = reduced_dims(m, Some(a.int_list(1)?))?;
    if m.sizes.iter().zip(&r).any(|(&s, &x)| x && s == 0) {
        return Err("amax(): Expected reduction dim to have non-zero size.".into());
    }
    Ok(smallvec::smallvec![Meta::contiguous(
        m.dtype,
        reduced_shape(m, &r, a.bool(2)?),
    )])
}

fn extreme(g: &[f64], max: bool) -> Res<f64> {
    let mut best = g[0];
    for &x in g {
        if x.is_nan() {
            return Ok(x);
        }
        if (max && x > best) || (!max && x < best) {
            best = x;
        }
    }
    Ok(best)
}

pub fn amax_eval(a: &R, o: &[Meta]) -> Res<Vec<RTensor>> {
    reduce_eval(a, o, Some(a.int_list(1)?), |g| extreme(g, true))
}

pub fn amin_eval(a: &R, o: &[Meta]) -> Res<Vec<RTensor>> {
    reduce_eval(a, o, Some(a.int_list(1)?), |g| extreme(g, false))
}

/// `softmax(self, dim, dtype?)` and `_softmax(self, dim, half_to_float)`.
fn softmax_dtype<T: super::args::HasMeta>(a: &[Arg<T>]) -> Res<DType> {
    let m = a.tensor(0)?.meta();
    let dt = match a.get(2) {
        Some(Arg::Bool(true)) => {
            return Err("softmax with half to float conversion is not supported on CPU".into())
        }
        Some(Arg::Dtype(d)) => *d,
        _ => m.dtype,
    };
    if !dt.is_float() {
        return Err(format!(
            "softmax is not implemented for {dt} tensors; pass a float dtype"
        ));
    }
    Ok(dt)
}

pub fn softmax_infer(a: &A) -> Res<Metas> {
    let m = a.tensor(0)?;
    wrap_dim(a.int(1)?, m.dim())?;
    Ok(smallvec::smallvec![Meta::contiguous(
        softmax_dtype(a)?,
        m.sizes.clone()
    )])
}

fn along_dim(t: &RTensor, dim: i64, f: impl Fn(&mut [f64])) -> Res<Vec<f64>> {
    let d = wrap_dim(dim, t.meta.dim())?;
    let sizes = t.sizes().to_vec();
    if sizes.is_empty() {
        let mut v = t.values();
        f(&mut v);
        return Ok(v);
    }
    let vals = t.values();
    let str_ = crate::meta::contiguous_strides(&sizes);
    let mut out = vals.clone();
    let n = sizes[d];
    for start in 0..vals.len() {
        if n == 0 || !(start / str_[d]).is_multiple_of(n) {
            continue;
        }
        let mut line: Vec<f64> = (0..n).map(|k| vals[start + k * str_[d]]).collect();
        f(&mut line);
        for k in 0..n {
            out[start + k * str_[d]] = line[k];
        }
    }
    Ok(out)
}

fn softmax_line(v: &mut [f64], log: bool) {
    let mx = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let s: f64 = v.iter().map(|x| (x - mx).exp()).sum();
    for x in v.iter_mut() {
        *x = if log {
            *x - mx - s.ln()
        } else {
            (*x - mx).exp() / s
        };
    }
}

pub fn softmax_eval(a: &R, o: &[Meta]) -> Res<Vec<RTensor>> {
    let t = a.tensor(0)?;
    let dt = o[0].dtype;
    let cast: Vec<f64> = t.values().iter().map(|&v| dt.cast(v)).collect();
    let tc = RTensor::new(dt, t.sizes().to_vec(), &cast);
    one(
        o[0].clone(),
        &along_dim(&tc, a.int(1)?, |l| softmax_line(l, false))?,
    )
}

pub fn log_softmax_eval(a: &R, o: &[Meta]) -> Res<Vec<RTensor>> {
    let t = a.tensor(0)?;
    let dt = o[0].dtype;
    let cast: Vec<f64> = t.values().iter().map(|&v| dt.cast(v)).collect();
    let tc = RTensor::new(dt, t.sizes().to_vec(), &cast);
    one(
        o[0].clone(),
        &along_dim(&tc, a.int(1)?, |l| softmax_line(l, true))?,
    )
}

// ------------------------------------------------------ linear algebra

fn same_dtype(x: &Meta, y: &Meta, op: &str) -> Res<()> {
    if x.dtype != y.dtype {
        return Err(format!(
            "{op}: expected both operands to have the same dtype, but got: {} != {}",
            x.dtype, y.dtype
        ));
    }
    if x.dtype == DType::Bool {
        return Err(format!("{op} is not implemented for bool tensors"));
    }
    Ok(())
}

/// Row-major `[b, n, k] x [b, k, m]` product.
fn batched_mm(x: &[f64], y: &[f64], b: usize, n: usize, k: usize, m: usize) -> Vec<f64> {
    let mut out = vec![0.0; b * n * m];
    for bi in 0..b {
        for i in 0..n {
            for p in 0..k {
                let xv = x[bi * n * k + i * k + p];
                if xv == 0.0 {
                    continue;
                }
                let yrow = &y[bi * k * m + p * m..bi * k * m + p * m + m];
                let orow = &mut out[bi * n * m + i * m..bi * n * m + i * m + m];
                for (o, &yv) in orow.iter_mut().zip(yrow) {
                    *o += xv * yv;
                }
            }
        }
    }
    // 0 * inf / nan must still poison the result, as a real product would.
    if x.contains(&0.0) && y.iter().any(|v| !v.is_finite()) {
        for bi in 0..b {
            for i in 0..n {
                for j in 0..m {
                    out[bi * n * m + i * m + j] = (0..k)
                        .map(|p| x[bi * n * k + i * k + p] * y[bi * k * m + p * m + j])
                        .sum();
                }
            }
        }
    }
    out
}

pub fn mm_infer(a: &A) -> Res<Metas> {
    let (x, y) = (a.tensor(0)?, a.tensor(1)?);
    if x.dim() != 2 || y.dim() != 2 {
        return Err(format!(
            "mm: expected 2-D tensors, got {}-D and {}-D",
            x.dim(),
            y.dim()
        ));
    }
    same_dtype(x, y, "mm")?;
    if x.sizes[1] != y.sizes[0] {
        return Err(format!(
            "mat1 and mat2 shapes cannot be multiplied ({}x{} and {}x{})",
            x.sizes[0], x.sizes[1], y.sizes[0], y.sizes[1]
        ));
    }
    Ok(smallvec::smallvec![Meta::contiguous(
        x.dtype,
        vec![x.sizes[0], y.sizes[1]],
    )])
}

pub fn mm_eval(a: &R, o: &[Meta]) -> Res<Vec<RTensor>> {
    let (x, y) = (a.tensor(0)?, a.tensor(1)?);
    let (n, k, m) = (x.sizes()[0], x.sizes()[1], y.sizes()[1]);
    one(
        o[0].clone(),
        &batched_mm(&x.values(), &y.values(), 1, n, k, m),
    )
}

pub fn bmm_infer(a: &A) -> Res<Metas> {
    let (x, y) = (a.tensor(0)?, a.tensor(1)?);
    if x.dim() != 3 || y.dim() != 3 {
        return Err(format!(
            "bmm: expected 3-D tensors, got {}-D and {}-D",
            x.dim(),
            y.dim()
        ));
    }
    same_dtype(x, y, "bmm")?;
    if x.sizes[0] != y.sizes[0] {
        return Err("batch1 and batch2 must have same number of batches".into());
    }
    if x.sizes[2] != y.sizes[1] {
        return Err(format!(
            "Expected size for first two dimensions of batch2 tensor to be: [{}, {}] but got: [{}, {}].",
            x.sizes[0], x.sizes[2], y.sizes[0], y.sizes[1]
        ));
    }
    Ok(smallvec::smallvec![Meta::contiguous(
        x.dtype,
        vec![x.sizes[0], x.sizes[1], y.sizes[2]],
    )])
}

pub fn bmm_eval(a: &R, o: &[Meta]) -> Res<Vec<RTensor>> {
    let (x, y) = (a.tensor(0)?, a.tensor(1)?);
    let (b, n, k, m) = (x.sizes()[0], x.sizes()[1], x.sizes()[2], y.sizes()[2]);
    one(
        o[0].clone(),
        &batched_mm(&x.values(), &y.values(), b, n, k, m),
    )
}

/// `matmul`'s shapes: batch shape, n, k, m and the result's shape.
struct MatmulShapes {
    batch: Vec<usize>,
    n: usize,
    k: usize,
    m: usize,
    shape: Vec<usize>,
}

fn matmul_shapes(x: &Meta, y: &Meta) -> Res<MatmulShapes> {
    if x.dim() == 0 || y.dim() == 0 {
        return Err(format!(
            "both arguments to matmul need to be at least 1D, but they are {}D and {}D",
            x.dim(),
            y.dim()
        ));
    }
    same_dtype(x, y, "matmul")?;
    let (xb, n, k1) = if x.dim() == 1 {
        (vec![], 1, x.sizes[0])
    } else {
        (
            x.sizes[..x.dim() - 2].to_vec(),
            x.sizes[x.dim() - 2],
            x.sizes[x.dim() - 1],
        )
    };
    let (yb, k2, m) = if y.dim() == 1 {
        (vec![], y.sizes[0], 1)
    } else {
        (
            y.sizes[..y.dim() - 2].to_vec(),
            y.sizes[y.dim() - 2],
            y.sizes[y.dim() - 1],
        )
    };
    if k1 != k2 {
        return Err(format!(
            "matmul: shapes {} and {} cannot be multiplied ({k1} != {k2})",
            ShapeFmt(&x.sizes),
            ShapeFmt(&y.sizes)
        ));
    }
    let batch = broadcast_shapes(&xb, &yb)?.into_vec();
    let mut shape = batch.clone();
    if x.dim() > 1 {
        shape.push(n);
    }
    if y.dim() > 1 {
        shape.push(m);
    }
    Ok(MatmulShapes {
        batch,
        n,
        k: k1,
        m,
        shape,
    })
}

pub fn matmul_infer(a: &A) -> Res<Metas> {
    let (x, y) = (a.tensor(0)?, a.tensor(1)?);
    Ok(smallvec::smallvec![Meta::contiguous(
        x.dtype,
        matmul_shapes(x, y)?.shape
    )])
}

pub fn matmul_eval(a: &R, o: &[Meta]) -> Res<Vec<RTensor>> {
    let (x, y) = (a.tensor(0)?, a.tensor(1)?);
    let MatmulShapes { batch, n, k, m, .. } = matmul_shapes(&x.meta, &y.meta)?;
    let mut xs = batch.clone();
    xs.extend([n, k]);
    let mut ys = batch.clone();
    ys.extend([k, m]);
    let xm = if x.meta.dim() == 1 {
        x.view(
            x.meta
                .restrided(vec![1, k], vec![0, x.meta.strides[0]], x.meta.offset),
        )
    } else {
        x.clone()
    };
    let ym = if y.meta.dim() == 1 {
        y.view(
            y.meta
                .restrided(vec![k, 1], vec![y.meta.strides[0], 0], y.meta.offset),
        )
    } else {
        y.clone()
    };
    let b = crate::meta::numel(&batch);
    one(
        o[0].clone(),
        &batched_mm(
            &xm.values_broadcast(&xs),
            &ym.values_broadcast(&ys),
            b,
            n,
            k,
            m,
        ),
    )
}

/// `addmm` / `baddbmm(self, x, y, beta, alpha)`: the product of `x` and `y`
/// (`product`'s shape rule), `self` broadcast to it.
fn with_addend_infer(a: &A, product: fn(&A) -> Res<Metas>, name: &str) -> Res<Metas> {
    let s = a.tensor(0)?;
    let out = product(&a[1..])?;
    same_dtype(s, &out[0], name)?;
    expandable(&s.sizes, &out[0].sizes)?;
    Ok(out)
}

/// `alpha x y + beta self` (`self` ignored, NaNs too, when `beta` is 0).
fn with_addend_eval(
    a: &R,
    o: &[Meta],
    product: fn(&R, &[Meta]) -> Res<Vec<RTensor>>,
) -> Res<Vec<RTensor>> {
    let (beta, alpha) = (a.scalar(3)?.to_f64(), a.scalar(4)?.to_f64());
    let prod = product(&a[1..], o)?.remove(0).values();
    let s = a.tensor(0)?.values_broadcast(&o[0].sizes);
    let vals: Vec<f64> = prod
        .iter()
        .zip(s)
        .map(|(p, s)| alpha * p + if beta == 0.0 { 0.0 } else { beta * s })
        .collect();
    one(o[0].clone(), &vals)
}

pub fn addmm_infer(a: &A) -> Res<Metas> {
    with_addend_infer(a, mm_infer, "addmm")
}

pub fn addmm_eval(a: &R, o: &[Meta]) -> Res<Vec<RTensor>> {
    with_addend_eval(a, o, mm_eval)
}

pub fn linear_infer(a: &A) -> Res<Metas> {
    let (x, w) = (a.tensor(0)?, a.tensor(1)?);
    if w.dim() != 2 && w.dim() != 1 {
        return Err(format!(
            "linear: weight must be 1-D or 2-D, got {}-D",
            w.dim()
        ));
    }
    same_dtype(x, w, "linear")?;
    let inner = *w.sizes.last().unwrap();
    if x.dim() == 0 || *x.sizes.last().unwrap() != inner {
        return Err(format!(
            "mat1 and mat2 shapes cannot be multiplied (input {} and weight {})",
            ShapeFmt(&x.sizes),
            ShapeFmt(&w.sizes)
        ));
    }
    let mut shape = x.sizes[..x.dim() - 1].to_vec();
    if w.dim() == 2 {
        shape.push(w.sizes[0]);
    }
    if let Some(b) = a.opt_tensor(2)? {
        same_dtype(x, b, "linear")?;
        expandable(&b.sizes, &shape)?;
    }
    Ok(smallvec::smallvec![Meta::contiguous(x.dtype, shape)])
}

pub fn linear_eval(a: &R, o: &[Meta]) -> Res<Vec<RTensor>> {
    let (x, w) = (a.tensor(0)?, a.tensor(1)?);
    let k = *w.sizes().last().unwrap();
    let out_f = if w.meta.dim() == 2 { w.sizes()[0] } else { 1 };
    let rows = x.meta.numel() / k.max(1);
    // x [rows, k] times w^T [k, out_f].
    let wt = w.values();
    let mut wt_t = vec![0.0; k * out_f];
    for j in 0..out_f {
        for p in 0..k {
            wt_t[p * out_f + j] = wt[j * k + p];
        }
    }
    let mut vals = batched_mm(&x.values(), &wt_t, 1, rows, k, out_f);
    if let Some(b) = a.opt_tensor(2)? {
        for (v, bv) in vals.iter_mut().zip(b.values_broadcast(&o[0].sizes)) {
            *v += bv;
        }
    }
    one(o[0].clone(), &vals)
}

pub fn layer_norm_infer(a: &A) -> Res<Metas> {
    let x = a.tensor(0)?;
    let ns = sizes_of(a.int_list(1)?)?;
    if !x.dtype.is_float() {
        return Err(format!(
            "layer_norm is not implemented for {} tensors",
            x.dtype
        ));
    }
    if ns.is_empty() || ns.len() > x.dim() || x.sizes[x.dim() - ns.len()..] != ns[..] {
        return Err(format!(
            "Given normalized_shape={}, expected input with shape [*, {}], but got input of size{}",
            ShapeFmt(&ns),
            ns.iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            ShapeFmt(&x.sizes)
        ));
    }
    for i in [2, 3] {
        if let Some(w) = a.opt_tensor(i)? {
            if w.sizes[..] != ns[..] {
                return Err(format!(
                    "Expected weight and bias to be of the same shape as normalized_shape {}, but got {}",
                    ShapeFmt(&ns),
                    ShapeFmt(&w.sizes)
                ));
            }
        }
    }
    Ok(smallvec::smallvec![Meta::contiguous(
        x.dtype,
        x.sizes.clone()
    )])
}

pub fn layer_norm_eval(a: &R, o: &[Meta]) -> Res<Vec<RTensor>> {
    let x = a.tensor(0)?;
    let n: usize = a.int_list(1)?.iter().product::<i64>() as usize;
    let eps = a.float(4)?;
    let w = a.opt_tensor(2)?.map(|t| t.values());
    let b = a.opt_tensor(3)?.map(|t| t.values());
    let mut vals = x.values();
    for row in vals.chunks_mut(n.max(1)) {
        let mean = row.iter().sum::<f64>() / n as f64;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n as f64;
        let r = 1.0 / (var + eps).sqrt();
        for (j, v) in row.iter_mut().enumerate() {
            *v = (*v - mean) * r * w.as_ref().map_or(1.0, |w| w[j])
                + b.as_ref().map_or(0.0, |b| b[j]);
        }
    }
    one(o[0].clone(), &vals)
}

pub fn embedding_infer(a: &A) -> Res<Metas> {
    let (w, idx) = (a.tensor(0)?, a.tensor(1)?);
    check_index_dtype(idx, "embedding indices")?;
    if w.dim() != 2 {
        return Err(format!("'weight' must be 2-D, got {}-D", w.dim()));
    }
    let mut shape = idx.sizes.clone();
    shape.push(w.sizes[1]);
    Ok(smallvec::smallvec![Meta::contiguous(w.dtype, shape)])
}

fn gather_rows(src: &RTensor, dim: usize, index: &[f64]) -> Res<Vec<f64>> {
    let sizes = src.sizes();
    let vals = src.values();
    let outer: usize = sizes[..dim].iter().product();
    let inner: usize = sizes[dim + 1..].iter().product();
    let n = sizes[dim];
    let mut out = Vec::with_capacity(outer * index.len() * inner);
    for o in 0..outer {
        for &i in index {
            let i = i as i64;
            if i < 0 || i as usize >= n {
                return Err(format!("index out of range in self (index {i}, size {n})"));
            }
            let base = (o * n + i as usize) * inner;
            out.extend_from_slice(&vals[base..base + inner]);
        }
    }
    Ok(out)
}

pub fn embedding_eval(a: &R, o: &[Meta]) -> Res<Vec<RTensor>> {
    one(
        o[0].clone(),
        &gather_rows(a.tensor(0)?, 0, &a.tensor(1)?.values())?,
    )
}

pub fn index_select_infer(a: &A) -> Res<Metas> {
    let (m, idx) = (a.tensor(0)?, a.tensor(2)?);
    check_index_dtype(idx, "index_select(): index")?;
    if idx.dim() > 1 {
        return Err("index_select(): Index is supposed to be a vector".into());
    }
    let d = wrap_dim(a.int(1)?, m.dim())?;
    let mut shape = m.sizes.clone();
    if m.dim() > 0 {
        shape[d] = idx.numel();
    }
    Ok(smallvec::smallvec![Meta::contiguous(m.dtype, shape)])
}

pub fn index_select_eval(a: &R, o: &[Meta]) -> Res<Vec<RTensor>> {
    let t = a.tensor(0)?;
    let idx = a.tensor(2)?.values();
    if t.meta.dim() == 0 {
        let v = t.values();
        for &i in &idx {
            if i != 0.0 && i != -1.0 {
                return Err("index_select(): index out of range in self".into());
            }
        }
        return one(o[0].clone(), &v);
    }
    let d = wrap_dim(a.int(1)?, t.meta.dim())?;
    one(o[0].clone(), &gather_rows(t, d, &idx)?)
}

/// Re-exported for the view-copy and scatter entries of the table.
pub use views::A as ViewArgs;

// ------------------------------------------------- joins, masks, casts

/// `cat(tensors, dim)`: joined along `dim`, dtypes promoted. As in
/// PyTorch, 1-D empty tensors are skipped (legacy behaviour).
pub fn cat_infer(a: &A) -> Res<Metas> {
    let all: Vec<&Meta> = a.tensor_list(0)?.into_iter().flatten().copied().collect();
    if all.is_empty() {
        return Err("torch.cat(): expected a non-empty list of Tensors".into());
    }
    let dtype = all[1..]
        .iter()
        .try_fold(all[0].dtype, |d, m| crate::dtype::promote_types(d, m.dtype))?;
    let parts: Vec<&Meta> = all
        .iter()
        .copied()
        .filter(|m| !(m.dim() == 1 && m.sizes[0] == 0))
        .collect();
    let Some(first) = parts.first() else {
        return Ok(smallvec::smallvec![Meta::contiguous(dtype, vec![0])]);
    };
    if first.dim() == 0 {
        return Err("zero-dimensional tensor (at position 0) cannot be concatenated".into());
    }
    let d = wrap_dim(a.int(1)?, first.dim())?;
    let mut sizes = first.sizes.clone();
    sizes[d] = 0;
    for (i, m) in parts.iter().enumerate() {
        if m.dim() != first.dim() {
            return Err(format!(
                "Tensors must have same number of dimensions: got {} and {}",
                first.dim(),
                m.dim()
            ));
        }
        for k in 0..m.dim() {
            if k != d && m.sizes[k] != first.sizes[k] {
                return Err(format!(
                    "Sizes of tensors must match except in dimension {d}. Expected size {} but got size {} for tensor number {i} in the list.",
                    first.sizes[k], m.sizes[k]
                ));
            }
        }
        sizes[d] += m.sizes[d];
    }
    Ok(smallvec::smallvec![Meta::contiguous(dtype, sizes)])
}

pub fn cat_eval(a: &R, o: &[Meta]) -> Res<Vec<RTensor>> {
    let parts: Vec<&RTensor> = a
        .tensor_list(0)?
        .into_iter()
        .flatten()
        .filter(|t| !(t.meta.dim() == 1 && t.meta.sizes[0] == 0))
        .collect();
    let out = &o[0];
    if parts.is_empty() {
        return one(out.clone(), &[]);
    }
    let d = wrap_dim(a.int(1)?, out.dim())?;
    let outer: usize = out.sizes[..d].iter().product();
    let inner: usize = out.sizes[d + 1..].iter().product();
    let runs: Vec<usize> = parts.iter().map(|t| t.meta.sizes[d] * inner).collect();
    one(out.clone(), &interleave(&parts, &runs, outer))
}

/// The parts' values joined run by run: for each of `outer` blocks, the
/// next `runs[i]` values of each part `i` in turn (`cat`, `stack`).
fn interleave(parts: &[&RTensor], runs: &[usize], outer: usize) -> Vec<f64> {
    let values: Vec<Vec<f64>> = parts.iter().map(|t| t.values()).collect();
    let mut vals = Vec::with_capacity(outer * runs.iter().sum::<usize>());
    for o in 0..outer {
        for (v, &run) in values.iter().zip(runs) {
            vals.extend_from_slice(&v[o * run..(o + 1) * run]);
        }
    }
    vals
}

/// `stack(tensors, dim)`: equal shapes joined along a new `dim`.
pub fn stack_infer(a: &A) -> Res<Metas> {
    let all: Vec<&Meta> = a.tensor_list(0)?.into_iter().flatten().copied().collect();
    let Some(first) = all.first() else {
        return Err("stack expects a non-empty TensorList".into());
    };
    for (i, m) in all.iter().enumerate() {
        if m.sizes != first.sizes {
            return Err(format!(
                "stack expects each tensor to be equal size, but got {} at entry 0 and {} at entry {i}",
                ShapeFmt(&first.sizes),
                ShapeFmt(&m.sizes)
            ));
        }
    }
    let dtype = all[1..]
        .iter()
        .try_fold(first.dtype, |d, m| crate::dtype::promote_types(d, m.dtype))?;
    let d = wrap_dim(a.int(1)?, first.dim() + 1)?;
    let mut sizes = first.sizes.clone();
    sizes.insert(d, all.len());
    Ok(smallvec::smallvec![Meta::contiguous(dtype, sizes)])
}

pub fn stack_eval(a: &R, o: &[Meta]) -> Res<Vec<RTensor>> {
    let parts: Vec<&RTensor> = a.tensor_list(0)?.into_iter().flatten().collect();
    let out = &o[0];
    let d = wrap_dim(a.int(1)?, out.dim())?;
    let outer: usize = out.sizes[..d].iter().product();
    let inner: usize = out.sizes[d + 1..].iter().product();
    let vals = interleave(&parts, &vec![inner; parts.len()], outer);
    one(out.clone(), &vals)
}

/// `tril` / `triu(self, diagonal)`: the matrices of the last two
/// dimensions with the elements above (tril) or below (triu) the diagonal
/// zeroed.
pub fn triangle_infer(a: &A) -> Res<Metas> {
    let m = a.tensor(0)?;
    if m.dim() < 2 {
        return Err("tril/triu: input tensor must have at least 2 dimensions".into());
    }
    Ok(smallvec::smallvec![Meta::contiguous(
        m.dtype,
        m.sizes.clone()
    )])
}

/// Whether element (row `i`, column `j`) survives `tril` (`upper` false) or
/// `triu` with diagonal `k`.
pub fn triangle_keeps(upper: bool, k: i64, i: usize, j: usize) -> bool {
    let off = j as i64 - i as i64;
    if upper {
        off >= k
    } else {
        off <= k
    }
}

fn triangle_eval(a: &R, o: &[Meta], upper: bool) -> Res<Vec<RTensor>> {
    let t = a.tensor(0)?;
    let k = a.opt_int(1)?.unwrap_or(0);
    let out = &o[0];
    let (r, c) = (out.sizes[out.dim() - 2], out.sizes[out.dim() - 1]);
    let mut vals = t.values();
    for (e, v) in vals.iter_mut().enumerate() {
        let (i, j) = ((e / c.max(1)) % r.max(1), e % c.max(1));
        if !triangle_keeps(upper, k, i, j) {
            *v = 0.0;
        }
    }
    one(out.clone(), &vals)
}

pub fn tril_eval(a: &R, o: &[Meta]) -> Res<Vec<RTensor>> {
    triangle_eval(a, o, false)
}

pub fn triu_eval(a: &R, o: &[Meta]) -> Res<Vec<RTensor>> {
    triangle_eval(a, o, true)
}

/// `_to_copy(self, dtype)`: a contiguous copy, converted to `dtype`.
pub fn to_copy_infer(a: &A) -> Res<Metas> {
    let m = a.tensor(0)?;
    Ok(smallvec::smallvec![Meta::contiguous(
        a.opt_dtype(1)?.unwrap_or(m.dtype),
        m.sizes.clone(),
    )])
}

pub fn to_copy_eval(a: &R, o: &[Meta]) -> Res<Vec<RTensor>> {
    // `from_values` converts (floats to integers toward zero, as C casts).
    one(o[0].clone(), &a.tensor(0)?.values())
}

/// `scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal,
/// scale, enable_gqa)`: `softmax(q k^T * scale + bias) v` over broadcast
/// batch dimensions; `bias` is -inf above the diagonal (`is_causal`) and
/// where a bool mask is false, or a float mask's values; a row every key
/// of which is masked gives zeros (PyTorch's safe softmax). Deterministic:
/// `dropout_p` must be 0.
pub fn sdpa_infer(a: &A) -> Res<Metas> {
    let (q, k, v) = (a.tensor(0)?, a.tensor(1)?, a.tensor(2)?);
    if q.dim() < 2 || k.dim() < 2 || v.dim() < 2 {
        return Err(
            "scaled_dot_product_attention expects query, key and value with at least 2 dimensions"
                .into(),
        );
    }
    if !q.dtype.is_float() || k.dtype != q.dtype || v.dtype != q.dtype {
        return Err(format!(
            "Expected query, key, and value to have the same floating dtype, but got query.dtype: {}, key.dtype: {}, and value.dtype: {}",
            q.dtype, k.dtype, v.dtype
        ));
    }
    let (l, e) = (q.sizes[q.dim() - 2], q.sizes[q.dim() - 1]);
    let (s, ek) = (k.sizes[k.dim() - 2], k.sizes[k.dim() - 1]);
    let (sv, ev) = (v.sizes[v.dim() - 2], v.sizes[v.dim() - 1]);
    if ek != e || sv != s {
        return Err(format!(
            "scaled_dot_product_attention: query {}, key {} and value {} do not fit (query and key share the last size, key and value the one before)",
            ShapeFmt(&q.sizes),
            ShapeFmt(&k.sizes),
            ShapeFmt(&v.sizes)
        ));
    }
    let qb = &q.sizes[..q.dim() - 2];
    let kb = &k.sizes[..k.dim() - 2];
    let vb = &v.sizes[..v.dim() - 2];
    let mut batch = broadcast_shapes(&broadcast_shapes(qb, kb)?, vb)?;
    if let Ok(m) = a.tensor(3) {
        let mut full = batch.clone();
        full.extend([l, s]);
        if broadcast_shapes(&m.sizes, &full)? != full {
            return Err(format!(
                "attn_mask {} does not broadcast to the scores {}",
                ShapeFmt(&m.sizes),
                ShapeFmt(&full)
            ));
        }
        if m.dtype != DType::Bool && m.dtype != q.dtype {
            return Err(format!(
                "Expected attn_mask dtype to be bool or {} to match query dtype, but got attn_mask.dtype: {}",
                q.dtype, m.dtype
            ));
        }
        if a.bool(5)? {
            return Err("_scaled_dot_product_attention: Explicit attn_mask should not be set when is_causal=True".into());
        }
    }
    if a.float(4)? != 0.0 {
        return Err("scaled_dot_product_attention with dropout_p > 0 is random; Kiln runs deterministic programs only (pass 0.0)".into());
    }
    if a.bool(7)? {
        return Err(
            "scaled_dot_product_attention with enable_gqa=True is not supported yet".into(),
        );
    }
    batch.extend([l, ev]);
    Ok(smallvec::smallvec![Meta::contiguous(q.dtype, batch)])
}

pub fn sdpa_eval(a: &R, o: &[Meta]) -> Res<Vec<RTensor>> {
    let (q, k, v) = (a.tensor(0)?, a.tensor(1)?, a.tensor(2)?);
    let mask = a.tensor(3).ok();
    let causal = a.bool(5)?;
    let out = &o[0];
    let (l, ev) = (out.sizes[out.dim() - 2], out.sizes[out.dim() - 1]);
    let e = q.meta.sizes[q.meta.dim() - 1];
    let s = k.meta.sizes[k.meta.dim() - 2];
    let scale = a
        .opt_scalar(6)?
        .map_or(1.0 / (e as f64).sqrt(), |s| s.to_f64());
    let batch = out.sizes[..out.dim() - 2].to_vec();
    let full = |last: [usize; 2]| {
        let mut f = batch.clone();
        f.extend(last);
        f
    };
    let qv = q.values_broadcast(&full([l, e]));
    let kv = k.values_broadcast(&full([s, e]));
    let vv = v.values_broadcast(&full([s, ev]));
    let mv = mask.map(|m| (m.meta.dtype, m.values_broadcast(&full([l, s]))));
    let nb: usize = batch.iter().product();
    let mut vals = vec![0.0; out.numel()];
    let mut row = vec![0.0; s];
    for b in 0..nb {
        for i in 0..l {
            for (j, r) in row.iter_mut().enumerate() {
                let dot: f64 = (0..e)
                    .map(|d| qv[(b * l + i) * e + d] * kv[(b * s + j) * e + d])
                    .sum();
                let mut x = dot * scale;
                if causal && j > i {
                    x = f64::NEG_INFINITY;
                }
                if let Some((dt, m)) = &mv {
                    let mval = m[(b * l + i) * s + j];
                    x = if *dt == DType::Bool {
                        if mval != 0.0 {
                            x
                        } else {
                            f64::NEG_INFINITY
                        }
                    } else {
                        x + mval
                    };
                }
                *r = x;
            }
            let mx = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            if mx == f64::NEG_INFINITY {
                // Every key masked: PyTorch's safe softmax attends to
                // nothing (zeros, where a plain softmax gives NaN).
                continue;
            }
            let ex: Vec<f64> = row.iter().map(|x| (x - mx).exp()).collect();
            let sum: f64 = ex.iter().sum();
            for c in 0..ev {
                let acc: f64 = (0..s).map(|j| ex[j] * vv[(b * s + j) * ev + c]).sum();
                vals[(b * l + i) * ev + c] = acc / sum;
            }
        }
    }
    one(out.clone(), &vals)
}

/// `baddbmm(self, batch1, batch2, beta, alpha)`: `beta self + alpha
/// batch1 @ batch2`, `self` broadcast to the product.
pub fn baddbmm_infer(a: &A) -> Res<Metas> {
    with_addend_infer(a, bmm_infer, "baddbmm")
}

pub fn baddbmm_eval(a: &R, o: &[Meta]) -> Res<Vec<RTensor>> {
    with_addend_eval(a, o, bmm_eval)
}

/// Element `m` of an index-map op's result: the input's multi-index it
/// reads, or `None` for a padding element (`flip`, `repeat`,
/// `constant_pad_nd`; shared by the reference and the code generator).
pub enum Remap {
    /// Dimensions reversed.
    Flip(Vec<usize>),
    /// Input dimension `d` (aligned to the result's last dimensions) read at
    /// `m % size`.
    Repeat { lead: usize },
    /// Input at `m - before` where that is in range, else the fill value.
    Pad { before: Vec<i64> },
}

impl Remap {
    pub fn of(kind: RemapKind, a: &A) -> Res<Remap> {
        let m = a.tensor(0)?;
        Ok(match kind {
            RemapKind::Flip => {
                let dims = a
                    .int_list(1)?
                    .iter()
                    .map(|&d| wrap_dim(d, m.dim()))
                    .collect::<Res<Vec<_>>>()?;
                Remap::Flip(dims)
            }
            RemapKind::Repeat => Remap::Repeat {
                lead: a.int_list(1)?.len().saturating_sub(m.dim()),
            },
            RemapKind::Pad => {
                let pad = a.int_list(1)?;
                let mut before = vec![0i64; m.dim()];
                for (k, p) in pad.chunks(2).enumerate() {
                    before[m.dim() - 1 - k] = p[0];
                }
                Remap::Pad { before }
            }
        })
    }

    /// The input multi-index of result element `out` (input sizes `inp`).
    pub fn source(&self, out: &[usize], inp: &[usize]) -> Option<Vec<usize>> {
        match self {
            Remap::Flip(dims) => {
                let mut m = out.to_vec();
                for &d in dims {
                    m[d] = inp[d] - 1 - out[d];
                }
                Some(m)
            }
            Remap::Repeat { lead } => Some(
                inp.iter()
                    .enumerate()
                    .map(|(d, &s)| out[lead + d] % s.max(1))
                    .collect(),
            ),
            Remap::Pad { before } => inp
                .iter()
                .enumerate()
                .map(|(d, &s)| {
                    let x = out[d] as i64 - before[d];
                    (x >= 0 && x < s as i64).then_some(x as usize)
                })
                .collect(),
        }
    }
}

pub fn flip_infer(a: &A) -> Res<Metas> {
    let m = a.tensor(0)?;
    let mut seen = vec![false; m.dim().max(1)];
    for &d in a.int_list(1)? {
        let d = wrap_dim(d, m.dim())?;
        if std::mem::replace(&mut seen[d], true) {
            return Err(format!(
                "dims has duplicates, original flip dims size={}",
                a.int_list(1)?.len()
            ));
        }
    }
    Ok(smallvec::smallvec![Meta::contiguous(
        m.dtype,
        m.sizes.clone()
    )])
}

pub fn repeat_infer(a: &A) -> Res<Metas> {
    let m = a.tensor(0)?;
    let reps = a.int_list(1)?;
    if reps.len() < m.dim() {
        return Err("Number of dimensions of repeat dims can not be smaller than number of dimensions of tensor".into());
    }
    let lead = reps.len() - m.dim();
    let sizes = reps
        .iter()
        .enumerate()
        .map(|(d, &r)| {
            let r = usize::try_from(r)
                .map_err(|_| format!("Trying to create tensor with negative dimension {r}"))?;
            Ok(r * if d < lead { 1 } else { m.sizes[d - lead] })
        })
        .collect::<Res<Vec<_>>>()?;
    Ok(smallvec::smallvec![Meta::contiguous(m.dtype, sizes)])
}

pub fn pad_infer(a: &A) -> Res<Metas> {
    let m = a.tensor(0)?;
    let pad = a.int_list(1)?;
    if pad.len() % 2 != 0 || pad.len() / 2 > m.dim() {
        return Err(format!(
            "Length of pad must be even but instead it equals {}, and at most twice the number of dimensions ({})",
            pad.len(),
            m.dim()
        ));
    }
    let mut sizes = m.sizes.clone();
    for (k, p) in pad.chunks(2).enumerate() {
        let d = m.dim() - 1 - k;
        let s = sizes[d] as i64 + p[0] + p[1];
        if s < 0 {
            return Err(format!(
                "The input size {}, plus negative padding {} and {} resulted in a negative output size, which is invalid. Check dimension {d} of your input.",
                sizes[d], p[0], p[1]
            ));
        }
        sizes[d] = s as usize;
    }
    Ok(smallvec::smallvec![Meta::contiguous(m.dtype, sizes)])
}

fn remap_eval(kind: RemapKind, a: &R, o: &[Meta], fill: f64) -> Res<Vec<RTensor>> {
    let t = a.tensor(0)?;
    let metas: Vec<Arg<&Meta>> = a.iter().map(|x| x.map(&mut |t| &t.meta)).collect();
    let r = Remap::of(kind, &metas)?;
    let vals = t.values();
    let inp = t.meta.sizes.clone();
    let st = crate::meta::contiguous_strides(&inp);
    let out = &o[0];
    let mut res = Vec::with_capacity(out.numel());
    for i in 0..out.numel() {
        let m = crate::meta::unravel(i, &out.sizes);
        res.push(match r.source(&m, &inp) {
            Some(sm) => vals[sm.iter().zip(&st).map(|(a, b)| a * b).sum::<usize>()],
            None => fill,
        });
    }
    one(out.clone(), &res)
}

pub fn flip_eval(a: &R, o: &[Meta]) -> Res<Vec<RTensor>> {
    remap_eval(RemapKind::Flip, a, o, 0.0)
}

pub fn repeat_eval(a: &R, o: &[Meta]) -> Res<Vec<RTensor>> {
    remap_eval(RemapKind::Repeat, a, o, 0.0)
}

pub fn pad_eval(a: &R, o: &[Meta]) -> Res<Vec<RTensor>> {
    let fill = a.opt_scalar(2)?.map_or(0.0, |s| s.to_f64());
    remap_eval(RemapKind::Pad, a, o, fill)
}

/// `var` / `std(self, dim?, *, correction=1, keepdim=False)`: the mean
/// squared deviation over `dim`, divided by `N - correction`.
pub fn var_infer(a: &A) -> Res<Metas> {
    let m = a.tensor(0)?;
    if !m.dtype.is_float() {
        return Err(format!(
            "std and var only support floating point and complex dtypes, got {}",
            m.dtype
        ));
    }
    let r = reduced_dims(m, a.opt_int_list(1)?)?;
    Ok(smallvec::smallvec![Meta::contiguous(
        m.dtype,
        reduced_shape(m, &r, a.bool(3)?),
    )])
}

/// The correction (Bessel's by default) of a `var` / `std` call.
pub fn var_correction<T>(a: &[Arg<T>]) -> Res<f64> {
    Ok(a.opt_scalar(2)?.map_or(1.0, |s| s.to_f64()))
}

fn variance(g: &[f64], correction: f64) -> f64 {
    let n = g.len() as f64;
    let mean = g.iter().sum::<f64>() / n;
    g.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - correction).max(0.0)
}

pub fn var_eval(a: &R, o: &[Meta]) -> Res<Vec<RTensor>> {
    let c = var_correction(a)?;
    reduce_eval(a, o, a.opt_int_list(1)?, |g| Ok(variance(g, c)))
}

pub fn std_eval(a: &R, o: &[Meta]) -> Res<Vec<RTensor>> {
    let c = var_correction(a)?;
    reduce_eval(a, o, a.opt_int_list(1)?, |g| Ok(variance(g, c).sqrt()))
}

/// `cumsum(self, dim, dtype?)`: running sums along `dim` (integers and
/// bools sum to i64, as in eager).
pub fn cumsum_infer(a: &A) -> Res<Metas> {
    let m = a.tensor(0)?;
    wrap_dim(a.int(1)?, m.dim())?;
    Ok(smallvec::smallvec![Meta::contiguous(
        sum_dtype(m, a.opt_dtype(2)?),
        m.sizes.clone(),
    )])
}

pub fn cumsum_eval(a: &R, o: &[Meta]) -> Res<Vec<RTensor>> {
    let t = a.tensor(0)?;
    let out = &o[0];
    let vals: Vec<f64> = t.values().iter().map(|&v| out.dtype.cast(v)).collect();
    if out.dim() == 0 {
        return one(out.clone(), &vals);
    }
    let d = wrap_dim(a.int(1)?, out.dim())?;
    let len = out.sizes[d];
    let inner: usize = out.sizes[d + 1..].iter().product();
    let mut res = vals.clone();
    for line in 0..out.numel() / (len * inner).max(1) {
        for i in 0..inner {
            let mut acc = 0.0;
            for k in 0..len {
                let at = line * len * inner + k * inner + i;
                // Floats accumulate wide (as eager's f16 does in f32),
                // integers wrap at every step.
                acc = if out.dtype.is_float() {
                    acc + vals[at]
                } else {
                    out.dtype.cast(acc + vals[at])
                };
                res[at] = out.dtype.cast(acc);
            }
        }
    }
    one(out.clone(), &res)
}

/// `index_add(self, dim, index, source, alpha)`: `self` with `alpha *
/// source[.., k, ..]` added at `[.., index[k], ..]` along `dim`, in order of
/// `k` (repeated indices accumulate).
pub fn index_add_infer(a: &A) -> Res<Metas> {
    let (m, idx, src) = (a.tensor(0)?, a.tensor(2)?, a.tensor(3)?);
    check_index_dtype(idx, "index_add_(): index")?;
    if idx.dim() > 1 {
        return Err("index_add_(): Index is supposed to be a vector".into());
    }
    if m.dim() == 0 {
        return Err("index_add on a 0-d tensor is not supported".into());
    }
    let d = wrap_dim(a.int(1)?, m.dim())?;
    let mut want = m.sizes.clone();
    want[d] = idx.numel();
    if src.sizes != want || src.dtype != m.dtype {
        return Err(format!(
            "index_add_(): source must be {}{} (self's type with dim {d} of the index's length), got {}{}",
            m.dtype,
            ShapeFmt(&want),
            src.dtype,
            ShapeFmt(&src.sizes)
        ));
    }
    Ok(smallvec::smallvec![Meta::contiguous(
        m.dtype,
        m.sizes.clone()
    )])
}

pub fn index_add_eval(a: &R, o: &[Meta]) -> Res<Vec<RTensor>> {
    let (t, idx, src) = (a.tensor(0)?, a.tensor(2)?, a.tensor(3)?);
    let alpha = a.scalar(4)?.to_f64();
    let out = &o[0];
    let d = wrap_dim(a.int(1)?, out.dim())?;
    let (len, inner) = (out.sizes[d], out.sizes[d + 1..].iter().product::<usize>());
    let outer = out.numel() / (len * inner).max(1);
    let mut vals = t.values();
    let sv = src.values();
    let n = idx.meta.numel();
    for (k, &i) in idx.values().iter().enumerate() {
        if i < 0.0 || i as usize >= len {
            return Err(format!(
                "index_add_(): index {i} out of range for dimension {d} of size {len}"
            ));
        }
        for o_ in 0..outer {
            for j in 0..inner {
                let at = (o_ * len + i as usize) * inner + j;
                vals[at] = out
                    .dtype
                    .cast(vals[at] + alpha * sv[(o_ * n + k) * inner + j]);
            }
        }
    }
    one(out.clone(), &vals)
}
