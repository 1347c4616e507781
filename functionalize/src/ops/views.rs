//! View rules: each computes the sizes, strides and offset of the result(s)
//! over the input's storage, exactly as ATen's view kernels do.

use super::args::ArgsExt;
use crate::meta::{contiguous_strides, numel, wrap_dim, Meta, Metas, ShapeFmt};
use crate::schema::Arg;

pub type A<'a> = [Arg<&'a Meta>];

fn me<'a>(a: &A<'a>) -> Result<&'a Meta, String> {
    a.tensor(0).copied()
}

fn to_usize(v: i64, what: &str) -> Result<usize, String> {
    usize::try_from(v).map_err(|_| format!("{what} must be non-negative, got {v}"))
}

/// Resolves one `-1` in a requested shape (PyTorch's `infer_size`).
pub fn infer_size(shape: &[i64], numel: usize) -> Result<Vec<usize>, String> {
    let mut infer = None;
    let mut known: usize = 1;
    for (i, &s) in shape.iter().enumerate() {
        if s == -1 {
            if infer.is_some() {
                return Err("only one dimension can be inferred".into());
            }
            infer = Some(i);
        } else if s < 0 {
            return Err(format!("invalid shape dimension {s}"));
        } else {
            known *= s as usize;
        }
    }
    let mut out: Vec<usize> = shape.iter().map(|&s| s.max(0) as usize).collect();
    match infer {
        Some(i) if known != 0 && numel.is_multiple_of(known) => out[i] = numel / known,
        None if known == numel => {}
        _ => {
            return Err(format!(
                "shape '[{}]' is invalid for input of size {numel}",
                shape
                    .iter()
                    .map(|s| s.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        }
    }
    Ok(out)
}

/// Strides for viewing (`old_sizes`, `old_strides`) as `new_sizes` without a
/// copy, or `None` when impossible (ATen's `computeStride`).
pub fn compute_stride(
    old_sizes: &[usize],
    old_strides: &[usize],
    new_sizes: &[usize],
) -> Option<Vec<usize>> {
    if old_sizes.is_empty() {
        return Some(vec![1; new_sizes.len()]);
    }
    let n = numel(old_sizes);
    if n == 0 && old_sizes == new_sizes {
        return Some(old_strides.to_vec());
    }
    let mut new_strides = vec![0; new_sizes.len()];
    if n == 0 {
        return Some(contiguous_strides(new_sizes));
    }
    let mut view_d = new_sizes.len() as i64 - 1;
    let mut chunk_base_stride = *old_strides.last().unwrap();
    let mut tensor_numel = 1;
    let mut view_numel = 1;
    for tensor_d in (0..old_sizes.len()).rev() {
        tensor_numel *= old_sizes[tensor_d];
        if tensor_d == 0
            || (old_sizes[tensor_d - 1] != 1
                && old_strides[tensor_d - 1] != tensor_numel * chunk_base_stride)
        {
            while view_d >= 0 && (view_numel < tensor_numel || new_sizes[view_d as usize] == 1) {
                new_strides[view_d as usize] = view_numel * chunk_base_stride;
                view_numel *= new_sizes[view_d as usize];
                view_d -= 1;
            }
            if view_numel != tensor_numel {
                return None;
            }
            if tensor_d > 0 {
                chunk_base_stride = old_strides[tensor_d - 1];
                tensor_numel = 1;
                view_numel = 1;
            }
        }
    }
    if view_d != -1 {
        return None;
    }
    Some(new_strides)
}

pub fn view(a: &A) -> Result<Metas, String> {
    let m = me(a)?;
    let sizes = infer_size(a.int_list(1)?, m.numel())?;
    let strides = compute_stride(&m.sizes, &m.strides, &sizes).ok_or_else(|| {
        "view size is not compatible with input tensor's size and stride (at least one dimension spans \
         across two contiguous subspaces). Use reshape(...) instead."
            .to_string()
    })?;
    Ok(smallvec::smallvec![m.restrided(sizes, strides, m.offset)])
}

/// `reshape`: a view when the strides allow one, else a contiguous copy.
/// Returns the result and whether it aliases the input.
pub fn reshape(a: &A) -> Result<(Meta, bool), String> {
    let m = me(a)?;
    let sizes = infer_size(a.int_list(1)?, m.numel())?;
    Ok(match compute_stride(&m.sizes, &m.strides, &sizes) {
        Some(strides) => (m.restrided(sizes, strides, m.offset), true),
        None => (Meta::contiguous(m.dtype, sizes), false),
    })
}

/// `contiguous`: the input itself when already contiguous, else a copy.
pub fn contiguous(a: &A) -> Result<(Meta, bool), String> {
    let m = me(a)?;
    Ok(if m.is_contiguous() {
        (m.clone(), true)
    } else {
        (Meta::contiguous(m.dtype, m.sizes.clone()), false)
    })
}

/// Clamps a Python-style slice bound into `0..=size`.
fn clamp_bound(v: i64, size: usize) -> usize {
    let s = size as i64;
    let v = if v < 0 { v + s } else { v };
    v.clamp(0, s) as usize
}

pub fn slice_meta(
    m: &Meta,
    dim: i64,
    start: Option<i64>,
    end: Option<i64>,
    step: i64,
) -> Result<Meta, String> {
    if m.dim() == 0 {
        return Err("slice() cannot be applied to a 0-dim tensor.".into());
    }
    let d = wrap_dim(dim, m.dim())?;
    if step <= 0 {
        return Err("slice step must be positive".into());
    }
    let size = m.sizes[d];
    let start = clamp_bound(start.unwrap_or(0), size);
    let end = clamp_bound(end.unwrap_or(i64::MAX), size).max(start);
    let len = (end - start).div_ceil(step as usize);
    let mut sizes = m.sizes.clone();
    let mut strides = m.strides.clone();
    sizes[d] = len;
    strides[d] *= step as usize;
    Ok(m.restrided(sizes, strides, m.offset + start * m.strides[d]))
}

pub fn slice(a: &A) -> Result<Metas, String> {
    Ok(smallvec::smallvec![slice_meta(
        me(a)?,
        a.int(1)?,
        a.opt_int(2)?,
        a.opt_int(3)?,
        a.int(4)?,
    )?])
}

pub fn narrow(a: &A) -> Result<Metas, String> {
    let m = me(a)?;
    if m.dim() == 0 {
        return Err("narrow() cannot be applied to a 0-dim tensor.".into());
    }
    let d = wrap_dim(a.int(1)?, m.dim())?;
    let size = m.sizes[d] as i64;
    let mut start = a.int(2)?;
    let length = a.int(3)?;
    if start < -size || start > size {
        return Err(format!(
            "start out of range (expected to be in range of [{}, {size}], but got {start})",
            -size
        ));
    }
    if start < 0 {
        start += size;
    }
    if length < 0 || start + length > size {
        return Err(format!(
            "start ({start}) + length ({length}) exceeds dimension size ({size})."
        ));
    }
    Ok(smallvec::smallvec![slice_meta(
        m,
        d as i64,
        Some(start),
        Some(start + length),
        1,
    )?])
}

pub fn select_meta(m: &Meta, dim: i64, index: i64) -> Result<Meta, String> {
    if m.dim() == 0 {
        return Err("select() cannot be applied to a 0-dim tensor.".into());
    }
    let d = wrap_dim(dim, m.dim())?;
    let size = m.sizes[d] as i64;
    if index < -size || index >= size {
        return Err(format!(
            "select(): index {index} out of range for tensor of size {} at dimension {d}",
            ShapeFmt(&m.sizes)
        ));
    }
    let i = if index < 0 { index + size } else { index } as usize;
    let mut sizes = m.sizes.clone();
    let mut strides = m.strides.clone();
    sizes.remove(d);
    strides.remove(d);
    Ok(m.restrided(sizes, strides, m.offset + i * m.strides[d]))
}

pub fn select(a: &A) -> Result<Metas, String> {
    Ok(smallvec::smallvec![select_meta(
        me(a)?,
        a.int(1)?,
        a.int(2)?
    )?])
}

pub fn transpose_meta(m: &Meta, d0: i64, d1: i64) -> Result<Meta, String> {
    let (d0, d1) = (wrap_dim(d0, m.dim())?, wrap_dim(d1, m.dim())?);
    let mut out = m.clone();
    if m.dim() > 0 {
        out.sizes.swap(d0, d1);
        out.strides.swap(d0, d1);
    }
    Ok(out)
}

pub fn transpose(a: &A) -> Result<Metas, String> {
    Ok(smallvec::smallvec![transpose_meta(
        me(a)?,
        a.int(1)?,
        a.int(2)?
    )?])
}

pub fn t(a: &A) -> Result<Metas, String> {
    let m = me(a)?;
    if m.dim() > 2 {
        return Err(format!(
            "t() expects a tensor with <= 2 dimensions, but self is {}D",
            m.dim()
        ));
    }
    Ok(smallvec::smallvec![if m.dim() < 2 {
        m.clone()
    } else {
        transpose_meta(m, 0, 1)?
    }])
}

pub fn permute(a: &A) -> Result<Metas, String> {
    let m = me(a)?;
    let dims = a.int_list(1)?;
    if dims.len() != m.dim() {
        return Err(format!(
            "permute(sparse_coo): number of dimensions in the tensor input does not match the length of the desired ordering of dimensions i.e. input.dim() = {} is not equal to len(dims) = {}",
            m.dim(),
            dims.len()
        ));
    }
    let mut seen = vec![false; m.dim()];
    let mut sizes = Vec::new();
    let mut strides = Vec::new();
    for &d in dims {
        let d = wrap_dim(d, m.dim())?;
        if seen[d] {
            return Err("permute(): duplicate dims are not allowed.".into());
        }
        seen[d] = true;
        sizes.push(m.sizes[d]);
        strides.push(m.strides[d]);
    }
    Ok(smallvec::smallvec![m.restrided(sizes, strides, m.offset)])
}

pub fn expand_meta(m: &Meta, size: &[i64]) -> Result<Meta, String> {
    if size.len() < m.dim() {
        return Err(format!(
            "expand: the number of sizes provided ({}) must be greater or equal to the number of dimensions in the tensor ({})",
            size.len(),
            m.dim()
        ));
    }
    let lead = size.len() - m.dim();
    let mut sizes = Vec::with_capacity(size.len());
    let mut strides = Vec::with_capacity(size.len());
    for (i, &s) in size.iter().enumerate() {
        if i < lead {
            if s < 0 {
                return Err(format!(
                    "expand: -1 is not allowed in a leading, non-existing dimension {i}"
                ));
            }
            sizes.push(s as usize);
            strides.push(0);
        } else {
            let (os, ost) = (m.sizes[i - lead], m.strides[i - lead]);
            if s == -1 || s as usize == os {
                sizes.push(os);
                strides.push(ost);
            } else if os == 1 && s >= 0 {
                sizes.push(s as usize);
                strides.push(0);
            } else {
                return Err(format!(
                    "The expanded size of the tensor ({s}) must match the existing size ({os}) at non-singleton dimension {i}.  Target sizes: {:?}.  Tensor sizes: {}",
                    size,
                    ShapeFmt(&m.sizes)
                ));
            }
        }
    }
    Ok(m.restrided(sizes, strides, m.offset))
}

pub fn expand(a: &A) -> Result<Metas, String> {
    Ok(smallvec::smallvec![expand_meta(me(a)?, a.int_list(1)?)?])
}

pub fn diagonal_meta(m: &Meta, offset: i64, dim1: i64, dim2: i64) -> Result<Meta, String> {
    if m.dim() < 2 {
        return Err(format!(
            "diagonal dimensions requested for a tensor with {} dimensions",
            m.dim()
        ));
    }
    let (d1, d2) = (wrap_dim(dim1, m.dim())?, wrap_dim(dim2, m.dim())?);
    if d1 == d2 {
        return Err(format!(
            "diagonal dimensions cannot be identical {dim1}, {dim2}"
        ));
    }
    let (s1, s2) = (m.sizes[d1] as i64, m.sizes[d2] as i64);
    let (len, off) = if offset >= 0 {
        (
            (s1.min(s2 - offset)).max(0),
            offset as usize * m.strides[d2],
        )
    } else {
        (
            (s1 + offset).min(s2).max(0),
            (-offset) as usize * m.strides[d1],
        )
    };
    let storage_offset = if len == 0 { m.offset } else { m.offset + off };
    let mut sizes = Vec::new();
    let mut strides = Vec::new();
    for i in 0..m.dim() {
        if i != d1 && i != d2 {
            sizes.push(m.sizes[i]);
            strides.push(m.strides[i]);
        }
    }
    sizes.push(len as usize);
    strides.push(m.strides[d1] + m.strides[d2]);
    Ok(m.restrided(sizes, strides, storage_offset))
}

pub fn diagonal(a: &A) -> Result<Metas, String> {
    Ok(smallvec::smallvec![diagonal_meta(
        me(a)?,
        a.int(1)?,
        a.int(2)?,
        a.int(3)?,
    )?])
}

pub fn as_strided_meta(
    m: &Meta,
    size: &[i64],
    stride: &[i64],
    offset: Option<i64>,
) -> Result<Meta, String> {
    if size.len() != stride.len() {
        return Err(format!(
            "mismatch in length of strides and shape: {} vs {}",
            size.len(),
            stride.len()
        ));
    }
    let sizes = size
        .iter()
        .map(|&s| to_usize(s, "as_strided size"))
        .collect::<Result<Vec<_>, _>>()?;
    let strides = stride
        .iter()
        .map(|&s| to_usize(s, "as_strided stride"))
        .collect::<Result<Vec<_>, _>>()?;
    let offset = match offset {
        Some(o) => to_usize(o, "as_strided storage offset")?,
        None => m.offset,
    };
    let out = m.restrided(sizes, strides, offset);
    if out.numel() > 0 {
        let last = offset
            + out
                .sizes
                .iter()
                .zip(&out.strides)
                .map(|(&s, &st)| (s - 1) * st)
                .sum::<usize>();
        if last >= m.storage_numel {
            return Err(format!(
                "setStorage: sizes {}, strides {}, storage offset {offset}, and itemsize {} requiring a storage size of {} are out of bounds for storage of size {}",
                ShapeFmt(&out.sizes),
                ShapeFmt(&out.strides),
                m.dtype.size_bytes(),
                (last + 1) * m.dtype.size_bytes(),
                m.storage_numel * m.dtype.size_bytes()
            ));
        }
    }
    Ok(out)
}

pub fn as_strided(a: &A) -> Result<Metas, String> {
    Ok(smallvec::smallvec![as_strided_meta(
        me(a)?,
        a.int_list(1)?,
        a.int_list(2)?,
        a.opt_int(3)?,
    )?])
}

pub fn unsqueeze(a: &A) -> Result<Metas, String> {
    let m = me(a)?;
    let d = wrap_dim(a.int(1)?, m.dim() + 1)?;
    let mut sizes = m.sizes.clone();
    let mut strides = m.strides.clone();
    let st = if d >= m.dim() {
        1
    } else {
        m.sizes[d] * m.strides[d]
    };
    sizes.insert(d, 1);
    strides.insert(d, st);
    Ok(smallvec::smallvec![m.restrided(sizes, strides, m.offset)])
}

/// `squeeze()`, `squeeze(dim)` and `squeeze(dims)` (the overload is told
/// apart by argument 1: none, an int, or a list).
pub fn squeeze(a: &A) -> Result<Metas, String> {
    let m = me(a)?;
    let dims: Vec<usize> = match a.get(1) {
        None | Some(Arg::None) => (0..m.dim()).collect(),
        Some(Arg::Int(d)) => vec![wrap_dim(*d, m.dim())?],
        Some(Arg::IntList(l)) => l
            .iter()
            .map(|&d| wrap_dim(d, m.dim()))
            .collect::<Result<_, _>>()?,
        _ => return Err("internal error: squeeze dims".into()),
    };
    let mut sizes = Vec::new();
    let mut strides = Vec::new();
    for i in 0..m.dim() {
        if !(dims.contains(&i) && m.sizes[i] == 1) {
            sizes.push(m.sizes[i]);
            strides.push(m.strides[i]);
        }
    }
    Ok(smallvec::smallvec![m.restrided(sizes, strides, m.offset)])
}

pub fn alias(a: &A) -> Result<Metas, String> {
    Ok(smallvec::smallvec![me(a)?.clone()])
}

pub fn unfold(a: &A) -> Result<Metas, String> {
    let m = me(a)?;
    let size = a.int(2)?;
    let step = a.int(3)?;
    if step <= 0 {
        return Err(format!("step is {step} but must be > 0"));
    }
    if size < 0 {
        return Err(format!("size is {size} but must be >= 0"));
    }
    let d = wrap_dim(a.int(1)?, m.dim())?;
    let (dsize, dstride) = if m.dim() == 0 {
        (1, 1)
    } else {
        (m.sizes[d], m.strides[d])
    };
    let size = size as usize;
    if size > dsize {
        return Err(format!(
            "maximum size for tensor at dimension {d} is {dsize} but size is {size}"
        ));
    }
    let mut sizes = m.sizes.clone();
    let mut strides = m.strides.clone();
    if m.dim() > 0 {
        sizes[d] = (dsize - size) / step as usize + 1;
        strides[d] = dstride * step as usize;
    }
    sizes.push(size);
    strides.push(dstride);
    Ok(smallvec::smallvec![m.restrided(sizes, strides, m.offset)])
}

fn split_by_sizes(m: &Meta, d: usize, sizes: &[usize]) -> Result<Metas, String> {
    let mut start = 0;
    let mut out = Metas::new();
    for &s in sizes {
        out.push(slice_meta(
            m,
            d as i64,
            Some(start as i64),
            Some((start + s) as i64),
            1,
        )?);
        start += s;
    }
    Ok(out)
}

/// `split(int split_size, dim)` and `split(int[] split_sizes, dim)`.
pub fn split(a: &A) -> Result<Metas, String> {
    let m = me(a)?;
    if m.dim() == 0 {
        return Err("split expects at least a 1-dimensional tensor".into());
    }
    let d = wrap_dim(a.int(2)?, m.dim())?;
    let dsize = m.sizes[d];
    let sizes: Vec<usize> = match a.get(1) {
        Some(Arg::Int(s)) => {
            let s = to_usize(*s, "split_size")?;
            if s == 0 && dsize != 0 {
                return Err(format!("split_size can only be 0 if dimension size is 0, but got dimension size of {dsize}"));
            }
            if dsize == 0 {
                vec![0]
            } else {
                (0..dsize.div_ceil(s))
                    .map(|i| s.min(dsize - i * s))
                    .collect()
            }
        }
        Some(Arg::IntList(l)) => {
            let l = l
                .iter()
                .map(|&s| to_usize(s, "split size"))
                .collect::<Result<Vec<_>, _>>()?;
            if l.iter().sum::<usize>() != dsize {
                return Err(format!(
                    "split_with_sizes expects split_sizes to sum exactly to {dsize} (input tensor's size at dimension {d}), but got split_sizes={:?}",
                    l
                ));
            }
            l
        }
        _ => return Err("internal error: split size".into()),
    };
    split_by_sizes(m, d, &sizes)
}

pub fn chunk(a: &A) -> Result<Metas, String> {
    let m = me(a)?;
    let chunks = a.int(1)?;
    if chunks <= 0 {
        return Err(format!(
            "chunk expects `chunks` to be greater than 0, got: {chunks}"
        ));
    }
    if m.dim() == 0 {
        return Err("chunk expects at least a 1-dimensional tensor".into());
    }
    let d = wrap_dim(a.int(2)?, m.dim())?;
    let dsize = m.sizes[d];
    let split_size = dsize.div_ceil(chunks as usize);
    if split_size == 0 {
        // Every chunk is empty: PyTorch returns `chunks` empty slices.
        return split_by_sizes(m, d, &vec![0; chunks as usize]);
    }
    let sizes: Vec<usize> = (0..dsize.div_ceil(split_size))
        .map(|i| split_size.min(dsize - i * split_size))
        .collect();
    split_by_sizes(m, d, &sizes)
}

pub fn unbind(a: &A) -> Result<Metas, String> {
    let m = me(a)?;
    if m.dim() == 0 {
        return Err("Dimension specified as 0 but tensor has no dimensions".into());
    }
    let d = wrap_dim(a.int(1)?, m.dim())?;
    (0..m.sizes[d])
        .map(|i| select_meta(m, d as i64, i as i64))
        .collect()
}

/// `resize_`: `size`, contiguous at `self`'s offset, over a storage grown
/// to hold it when it is too small (as eager grows it).
pub fn resize(a: &A) -> Result<Metas, String> {
    let m = me(a)?;
    let sizes = a
        .int_list(1)?
        .iter()
        .map(|&s| to_usize(s, "resize_: every size"))
        .collect::<Result<Vec<usize>, String>>()?;
    crate::meta::check_size(&sizes)?;
    let n = numel(&sizes);
    let strides = contiguous_strides(&sizes);
    let mut out = m.restrided(sizes, strides, m.offset);
    out.storage_numel = m.storage_numel.max(m.offset + n);
    Ok(smallvec::smallvec![out])
}
