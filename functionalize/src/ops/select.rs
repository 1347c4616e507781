//! Data-dependent selection: ops whose result positions or values depend on
//! index tensors or on comparisons (`gather scatter scatter_add
//! index_copy take_along_dim argmax argmin max.dim min.dim sort topk`).
//! Shape rules and reference kernels, with eager's checks and messages.

use super::args::ArgsExt;
use crate::dtype::DType;
use crate::meta::{broadcast_shapes, contiguous_strides, wrap_dim, Meta, Metas, ShapeFmt};
use crate::schema::Arg;
use crate::tensor::RTensor;
use std::cmp::Ordering;

type A<'a> = [Arg<&'a Meta>];
type R = [Arg<RTensor>];
type Res<T> = Result<T, String>;

/// Row-major multi-indices of `sizes`, in order.
fn positions(sizes: &[usize]) -> impl Iterator<Item = Vec<usize>> + '_ {
    let n: usize = sizes.iter().product();
    let strides = contiguous_strides(sizes);
    (0..n).map(move |f| {
        sizes
            .iter()
            .zip(&strides)
            .map(|(&s, &st)| (f / st.max(1)) % s.max(1))
            .collect()
    })
}

fn flat(pos: &[usize], sizes: &[usize]) -> usize {
    pos.iter()
        .zip(contiguous_strides(sizes))
        .map(|(p, s)| p * s)
        .sum()
}

/// Eager's index checks: an i64 index (i32 accepted as well, Kiln's
/// earlier index type), in `0..len`.
fn check_index(what: &str, m: &Meta) -> Res<()> {
    if !matches!(m.dtype, DType::I64 | DType::I32) {
        return Err(format!(
            "{what}(): Expected dtype int64 for index, got {}",
            m.dtype
        ));
    }
    Ok(())
}

fn index_value(what: &str, v: f64, len: usize) -> Res<usize> {
    if v < 0.0 || v >= len as f64 {
        return Err(format!(
            "{what}(): index {v} is out of bounds for dimension with size {len}"
        ));
    }
    Ok(v as usize)
}

/// `gather`/`scatter`: `index` has self's rank, and every other dimension
/// of it fits in self's (and in `src`'s for scatters).
fn check_dims(what: &str, m: &Meta, idx: &Meta, d: usize, src: Option<&Meta>) -> Res<()> {
    check_index(what, idx)?;
    if idx.dim() != m.dim() && !(idx.dim() <= 1 && m.dim() <= 1) {
        return Err(format!(
            "{what}(): Index tensor must have the same number of dimensions as {} tensor",
            if src.is_some() { "self" } else { "input" }
        ));
    }
    for k in 0..idx.dim() {
        let fits_self = k == d || idx.sizes[k] <= m.sizes.get(k).copied().unwrap_or(1);
        let fits_src = src.is_none_or(|s| idx.sizes[k] <= s.sizes.get(k).copied().unwrap_or(1));
        if !fits_self || !fits_src {
            return Err(format!(
                "{what}(): Size does not match at dimension {k}: index {} against {} {}",
                ShapeFmt(&idx.sizes),
                if fits_self { "src" } else { "self" },
                ShapeFmt(if fits_self {
                    &src.unwrap().sizes
                } else {
                    &m.sizes
                })
            ));
        }
    }
    Ok(())
}

pub fn gather_infer(a: &A) -> Res<Metas> {
    let (m, idx) = (a.tensor(0)?, a.tensor(2)?);
    let d = wrap_dim(a.int(1)?, m.dim())?;
    check_dims("gather", m, idx, d, None)?;
    Ok(smallvec::smallvec![Meta::contiguous(
        m.dtype,
        idx.sizes.clone()
    )])
}

pub fn gather_eval(a: &R, o: &[Meta]) -> Res<Vec<RTensor>> {
    let (t, idx) = (a.tensor(0)?, a.tensor(2)?);
    let d = wrap_dim(a.int(1)?, t.meta.dim())?;
    let (tv, iv) = (t.values(), idx.values());
    let sizes = &t.meta.sizes;
    let mut out = Vec::with_capacity(iv.len());
    for (pos, &i) in positions(&idx.meta.sizes).zip(&iv) {
        let mut p = pos;
        if !p.is_empty() {
            p[d] = index_value("gather", i, sizes[d])?;
        } else {
            index_value("gather", i, 1)?;
        }
        out.push(tv[flat(&p, sizes)]);
    }
    Ok(vec![RTensor::from_values(o[0].clone(), &out)])
}

/// `take_along_dim(self, indices, dim?)`: without `dim`, over the
/// flattened tensor; with it, self and indices broadcast over the other
/// dimensions, then `gather`.
fn take_shapes(m: &Meta, idx: &Meta, dim: Option<i64>) -> Res<(Vec<usize>, Vec<usize>, usize)> {
    check_index("take_along_dim", idx)?;
    let Some(dim) = dim else {
        return Ok((vec![m.numel()], vec![idx.numel()], 0));
    };
    if m.dim() != idx.dim() {
        return Err(format!(
            "torch.take_along_dim(): input and indices should have the same number of \
             dimensions, but got {} dimensions for input, and {} dimensions for indices",
            m.dim(),
            idx.dim()
        ));
    }
    let d = wrap_dim(dim, m.dim())?;
    let (mut a, mut b) = (m.sizes.clone(), idx.sizes.clone());
    if a.is_empty() {
        return Ok((vec![1], vec![1], 0));
    }
    a[d] = 1;
    b[d] = 1;
    let both = broadcast_shapes(&a, &b)?.into_vec();
    let (mut sm, mut si) = (both.clone(), both);
    sm[d] = m.sizes[d];
    si[d] = idx.sizes[d];
    Ok((sm, si, d))
}

pub fn take_along_dim_infer(a: &A) -> Res<Metas> {
    let (m, idx) = (a.tensor(0)?, a.tensor(1)?);
    let (_, si, _) = take_shapes(m, idx, a.opt_int(2)?)?;
    let sizes = if a.opt_int(2)?.is_some() {
        si
    } else {
        idx.sizes.to_vec()
    };
    Ok(smallvec::smallvec![Meta::contiguous(m.dtype, sizes)])
}

pub fn take_along_dim_eval(a: &R, o: &[Meta]) -> Res<Vec<RTensor>> {
    let (t, idx) = (a.tensor(0)?, a.tensor(1)?);
    let dim = a.opt_int(2)?;
    let (sm, si, d) = take_shapes(&t.meta, &idx.meta, dim)?;
    let (tv, iv) = match dim {
        Some(_) => (t.values_broadcast(&sm), idx.values_broadcast(&si)),
        None => (t.values(), idx.values()),
    };
    let mut out = Vec::with_capacity(iv.len());
    for (pos, &i) in positions(&si).zip(&iv) {
        let mut p = pos;
        p[d] = index_value("take_along_dim", i, sm[d])?;
        out.push(tv[flat(&p, &sm)]);
    }
    Ok(vec![RTensor::from_values(o[0].clone(), &out)])
}

/// `scatter.src`, `scatter.value`, `scatter_add`: self with `src` (or the
/// value) written, or added, at `index` along `dim`. Duplicate indices:
/// the last write wins (eager's CPU order).
pub fn scatter_infer(a: &A) -> Res<Metas> {
    let (m, idx) = (a.tensor(0)?, a.tensor(2)?);
    let d = wrap_dim(a.int(1)?, m.dim())?;
    let src = if a.is_tensor(3) {
        Some(a.tensor(3)?)
    } else {
        None
    };
    if let Some(s) = src {
        if s.dtype != m.dtype {
            return Err(format!(
                "scatter(): Expected self.dtype to be equal to src.dtype ({} vs {})",
                m.dtype, s.dtype
            ));
        }
    }
    check_dims("scatter", m, idx, d, src.copied())?;
    Ok(smallvec::smallvec![Meta::contiguous(
        m.dtype,
        m.sizes.clone()
    )])
}

fn scatter_with(a: &R, o: &[Meta], add: bool) -> Res<Vec<RTensor>> {
    let (t, idx) = (a.tensor(0)?, a.tensor(2)?);
    let out = &o[0];
    let d = wrap_dim(a.int(1)?, out.dim())?;
    let mut vals = t.values();
    let src = if a.is_tensor(3) {
        let s = a.tensor(3)?;
        Some((s.values(), s.meta.sizes.clone()))
    } else {
        None
    };
    let value = if src.is_none() {
        a.scalar(3)?.to_f64()
    } else {
        0.0
    };
    for (pos, &i) in positions(&idx.meta.sizes).zip(&idx.values()) {
        let x = match &src {
            Some((sv, ss)) => sv[flat(&pos, ss)],
            None => value,
        };
        let mut p = pos;
        if p.is_empty() {
            index_value("scatter", i, 1)?;
        } else {
            p[d] = index_value("scatter", i, out.sizes[d])?;
        }
        let at = flat(&p, &out.sizes);
        vals[at] = out.dtype.cast(if add { vals[at] + x } else { x });
    }
    Ok(vec![RTensor::from_values(out.clone(), &vals)])
}

pub fn scatter_eval(a: &R, o: &[Meta]) -> Res<Vec<RTensor>> {
    scatter_with(a, o, false)
}

pub fn scatter_add_eval(a: &R, o: &[Meta]) -> Res<Vec<RTensor>> {
    scatter_with(a, o, true)
}

/// `index_copy(self, dim, index, source)`: rows of `source` replace the
/// rows of self that `index` names (the last of duplicates wins).
pub fn index_copy_infer(a: &A) -> Res<Metas> {
    let (m, idx, src) = (a.tensor(0)?, a.tensor(2)?, a.tensor(3)?);
    check_index("index_copy", idx)?;
    if idx.dim() > 1 {
        return Err("index_copy_(): Index should have dimension 1 or 0".into());
    }
    let d = wrap_dim(a.int(1)?, m.dim())?;
    let mut want = m.sizes.clone();
    if !want.is_empty() {
        want[d] = idx.numel();
    }
    if src.sizes != want || src.dtype != m.dtype {
        return Err(format!(
            "index_copy_(): source must be {}{} (self's type with dim {d} of the index's \
             length), got {}{}",
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

pub fn index_copy_eval(a: &R, o: &[Meta]) -> Res<Vec<RTensor>> {
    let (t, idx, src) = (a.tensor(0)?, a.tensor(2)?, a.tensor(3)?);
    let out = &o[0];
    if out.dim() == 0 {
        index_value("index_copy", idx.values()[0], 1)?;
        return Ok(vec![RTensor::from_values(out.clone(), &src.values())]);
    }
    let d = wrap_dim(a.int(1)?, out.dim())?;
    let mut vals = t.values();
    let sv = src.values();
    let iv = idx.values();
    for (pos, &x) in positions(&src.meta.sizes).zip(&sv) {
        let mut p = pos;
        p[d] = index_value("index_copy", iv[p[d]], out.sizes[d])?;
        vals[flat(&p, &out.sizes)] = x;
    }
    Ok(vec![RTensor::from_values(out.clone(), &vals)])
}

/// Total order of eager's comparisons for max/min/sort: NaN above
/// everything (it wins `max` and `min` alike, and sorts last).
fn order(a: f64, b: f64) -> Ordering {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        _ => a.partial_cmp(&b).expect("not NaN"),
    }
}

/// The lines of `m` along `dim` (None: the flattened tensor): for each
/// line, the flat offsets of its elements.
fn lines(m: &Meta, dim: Option<usize>) -> Vec<Vec<usize>> {
    let Some(d) = dim.filter(|_| m.dim() > 0) else {
        return vec![(0..m.numel()).collect()];
    };
    let (len, inner) = (m.sizes[d], m.sizes[d + 1..].iter().product::<usize>());
    let outer = m.numel() / (len * inner).max(1);
    let mut out = vec![];
    for o in 0..outer {
        for j in 0..inner {
            out.push((0..len).map(|k| (o * len + k) * inner + j).collect());
        }
    }
    out
}

/// The reduced shape of `m` along `dim` (all of it when None).
fn reduced(m: &Meta, dim: Option<usize>, keep: bool) -> Vec<usize> {
    match dim {
        None if keep => vec![1; m.dim()],
        None => vec![],
        Some(d) => {
            let mut s = m.sizes.clone();
            if s.is_empty() {
            } else if keep {
                s[d] = 1;
            } else {
                s.remove(d);
            }
            s.to_vec()
        }
    }
}

/// `argmax`/`argmin(self, dim?, keepdim)`, `max.dim`/`min.dim(self, dim,
/// keepdim)` (values and indices) and the full `max`/`min(self)`.
fn extreme_args(a: &A) -> Res<(Option<usize>, bool)> {
    let m = a.tensor(0)?;
    let dim = match a.opt_int(1)? {
        Some(d) => Some(wrap_dim(d, m.dim())?),
        None => None,
    };
    let keep = a.len() > 2 && a.bool(2)?;
    Ok((dim, keep))
}

fn check_nonempty(what: &str, m: &Meta, dim: Option<usize>) -> Res<()> {
    let empty = match dim {
        Some(d) if m.dim() > 0 => m.sizes[d] == 0,
        _ => m.numel() == 0,
    };
    if empty {
        return Err(format!(
            "{what}(): Expected reduction dim to be specified for input.numel() == 0, or the \
             reduced dimension to be non-empty"
        ));
    }
    Ok(())
}

pub fn argmax_infer(a: &A) -> Res<Metas> {
    let m = a.tensor(0)?;
    let (dim, keep) = extreme_args(a)?;
    check_nonempty("argmax", m, dim)?;
    Ok(smallvec::smallvec![Meta::contiguous(
        DType::I64,
        reduced(m, dim, keep)
    )])
}

/// Values and indices of max (`high`) or min along each line: the first
/// extreme, NaN winning.
fn extremes(t: &RTensor, dim: Option<usize>, high: bool) -> (Vec<f64>, Vec<f64>) {
    let v = t.values();
    let (mut vals, mut idxs) = (vec![], vec![]);
    for line in lines(&t.meta, dim) {
        let mut best = 0;
        for k in 1..line.len() {
            let (x, b) = (v[line[k]], v[line[best]]);
            if b.is_nan() {
                break;
            }
            let better = if high { order(x, b) } else { order(b, x) };
            if better == Ordering::Greater || x.is_nan() {
                best = k;
            }
        }
        vals.push(v[line[best]]);
        idxs.push(best as f64);
    }
    (vals, idxs)
}

pub fn argmax_eval(a: &R, o: &[Meta]) -> Res<Vec<RTensor>> {
    let (dim, _) = extreme_args(&super::args::metas(a))?;
    let (_, i) = extremes(a.tensor(0)?, dim, true);
    Ok(vec![RTensor::from_values(o[0].clone(), &i)])
}

pub fn argmin_eval(a: &R, o: &[Meta]) -> Res<Vec<RTensor>> {
    let (dim, _) = extreme_args(&super::args::metas(a))?;
    let (_, i) = extremes(a.tensor(0)?, dim, false);
    Ok(vec![RTensor::from_values(o[0].clone(), &i)])
}

/// `max(self)` -> the value; `max.dim(self, dim, keepdim)` -> (values,
/// indices).
pub fn max_infer(a: &A) -> Res<Metas> {
    let m = a.tensor(0)?;
    let (dim, keep) = extreme_args(a)?;
    check_nonempty("max", m, dim)?;
    let sizes = reduced(m, dim, keep);
    let mut out: Metas = smallvec::smallvec![Meta::contiguous(m.dtype, sizes.clone())];
    if dim.is_some() || a.len() > 1 {
        out.push(Meta::contiguous(DType::I64, sizes));
    }
    Ok(out)
}

fn max_min(a: &R, o: &[Meta], high: bool) -> Res<Vec<RTensor>> {
    let (dim, _) = extreme_args(&super::args::metas(a))?;
    let (v, i) = extremes(a.tensor(0)?, dim, high);
    let mut out = vec![RTensor::from_values(o[0].clone(), &v)];
    if o.len() > 1 {
        out.push(RTensor::from_values(o[1].clone(), &i));
    }
    Ok(out)
}

pub fn max_eval(a: &R, o: &[Meta]) -> Res<Vec<RTensor>> {
    max_min(a, o, true)
}

pub fn min_eval(a: &R, o: &[Meta]) -> Res<Vec<RTensor>> {
    max_min(a, o, false)
}

/// `sort(self, dim=-1, descending=False)`: stable, NaN last ascending and
/// first descending (eager's order).
pub fn sort_infer(a: &A) -> Res<Metas> {
    let m = a.tensor(0)?;
    wrap_dim(a.opt_int(1)?.unwrap_or(-1), m.dim())?;
    Ok(smallvec::smallvec![
        Meta::contiguous(m.dtype, m.sizes.clone()),
        Meta::contiguous(DType::I64, m.sizes.clone()),
    ])
}

/// Each line's element order: ascending or descending, ties in index
/// order.
fn sorted_lines(t: &RTensor, d: usize, descending: bool) -> (Vec<Vec<usize>>, Vec<f64>) {
    let v = t.values();
    let ls = lines(&t.meta, Some(d));
    let orders = ls
        .iter()
        .map(|line| {
            let mut k: Vec<usize> = (0..line.len()).collect();
            k.sort_by(|&x, &y| {
                let c = order(v[line[x]], v[line[y]]);
                if descending {
                    c.reverse()
                } else {
                    c
                }
            });
            k
        })
        .collect();
    (orders, v)
}

pub fn sort_eval(a: &R, o: &[Meta]) -> Res<Vec<RTensor>> {
    let t = a.tensor(0)?;
    let d = wrap_dim(a.opt_int(1)?.unwrap_or(-1), t.meta.dim())?;
    let desc = a.len() > 2 && a.bool(2)?;
    let (orders, v) = sorted_lines(t, d, desc);
    let (mut vals, mut idxs) = (vec![0.0; v.len()], vec![0.0; v.len()]);
    for (line, ord) in lines(&t.meta, Some(d)).iter().zip(&orders) {
        for (r, &k) in ord.iter().enumerate() {
            vals[line[r]] = v[line[k]];
            idxs[line[r]] = k as f64;
        }
    }
    Ok(vec![
        RTensor::from_values(o[0].clone(), &vals),
        RTensor::from_values(o[1].clone(), &idxs),
    ])
}

/// `topk(self, k, dim=-1, largest=True, sorted=True)`: the k largest (or
/// smallest) of each line, in sorted order.
pub fn topk_infer(a: &A) -> Res<Metas> {
    let m = a.tensor(0)?;
    let k = a.int(1)?;
    let d = wrap_dim(a.opt_int(2)?.unwrap_or(-1), m.dim())?;
    let len = m.sizes.get(d).copied().unwrap_or(1);
    if k < 0 || k as usize > len {
        return Err(format!(
            "topk(): selected index k out of range (k = {k}, size {len})"
        ));
    }
    let mut s = m.sizes.clone();
    if !s.is_empty() {
        s[d] = k as usize;
    }
    Ok(smallvec::smallvec![
        Meta::contiguous(m.dtype, s.clone()),
        Meta::contiguous(DType::I64, s),
    ])
}

pub fn topk_eval(a: &R, o: &[Meta]) -> Res<Vec<RTensor>> {
    let t = a.tensor(0)?;
    let k = a.int(1)? as usize;
    let d = wrap_dim(a.opt_int(2)?.unwrap_or(-1), t.meta.dim())?;
    let largest = a.len() <= 3 || a.bool(3)?;
    let (orders, v) = sorted_lines(t, d, largest);
    let (mut vals, mut idxs) = (vec![], vec![]);
    let out_lines = lines(&o[0], Some(d));
    vals.resize(o[0].numel(), 0.0);
    idxs.resize(o[0].numel(), 0.0);
    for ((line, ord), ol) in lines(&t.meta, Some(d)).iter().zip(&orders).zip(&out_lines) {
        for r in 0..k {
            vals[ol[r]] = v[line[ord[r]]];
            idxs[ol[r]] = ord[r] as f64;
        }
    }
    Ok(vec![
        RTensor::from_values(o[0].clone(), &vals),
        RTensor::from_values(o[1].clone(), &idxs),
    ])
}
