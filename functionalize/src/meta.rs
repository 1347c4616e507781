//! Tensor metadata: dtype, sizes, strides and storage offset, as PyTorch has
//! them. Strides are tracked statically (like PyTorch's fake tensors) so that
//! view rules, `reshape`'s alias-or-copy choice and `as_strided` bounds are
//! decided once, for the graph and the interpreter alike.

use crate::dtype::DType;
use std::fmt;

/// Sizes or strides: up to four dimensions inline (no allocation for the
/// tensors of nearly every program; a graph holds millions of metas).
pub type Dims = smallvec::SmallVec<[usize; 4]>;

/// The results of a shape rule: nearly always one, inline.
pub type Metas = smallvec::SmallVec<[Meta; 1]>;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Meta {
    pub dtype: DType,
    pub sizes: Dims,
    pub strides: Dims,
    pub offset: usize,
    /// Elements in the underlying storage (bounds for `as_strided`).
    pub storage_numel: usize,
}

impl Meta {
    /// A fresh contiguous tensor with its own storage.
    pub fn contiguous(dtype: DType, sizes: impl Into<Dims>) -> Meta {
        let sizes: Dims = sizes.into();
        let strides = contiguous_dims(&sizes);
        let n = numel(&sizes);
        Meta {
            dtype,
            sizes,
            strides,
            offset: 0,
            storage_numel: n,
        }
    }

    pub fn dim(&self) -> usize {
        self.sizes.len()
    }

    pub fn numel(&self) -> usize {
        numel(&self.sizes)
    }

    /// Laid out exactly as `Meta::contiguous` lays it out: row-major
    /// strides, no offset, a storage of its own size.
    pub fn is_dense_contiguous(&self) -> bool {
        let mut expected: usize = 1;
        for (&s, &st) in self.sizes.iter().zip(&self.strides).rev() {
            if st != expected {
                return false;
            }
            expected = expected.saturating_mul(s.max(1));
        }
        self.offset == 0 && self.storage_numel == numel(&self.sizes)
    }

    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1;
        for (&s, &st) in self.sizes.iter().zip(&self.strides).rev() {
            if s == 0 {
                return true;
            }
            if s != 1 && st != expected {
                return false;
            }
            expected *= s;
        }
        true
    }

    /// A view of the same storage with new geometry.
    pub fn restrided(
        &self,
        sizes: impl Into<Dims>,
        strides: impl Into<Dims>,
        offset: usize,
    ) -> Meta {
        Meta {
            dtype: self.dtype,
            sizes: sizes.into(),
            strides: strides.into(),
            offset,
            storage_numel: self.storage_numel,
        }
    }

    /// The storage offsets of every element, in row-major order.
    pub fn offsets(&self) -> OffsetIter<'_> {
        OffsetIter::new(&self.sizes, &self.strides, self.offset)
    }

    /// Does any storage element appear twice in this view?
    /// ATen's `is_non_overlapping_and_dense`: the elements fill a block of
    /// the storage exactly, in some order of the dimensions.
    pub fn is_non_overlapping_and_dense(&self) -> bool {
        fills_block(&self.sizes, &self.strides)
    }

    /// ATen's `get_overlap_status(a, b) == Partial` for two views of one
    /// storage: the same block with other strides, or blocks that
    /// intersect. (Views too irregular to tell are "too hard" there: not
    /// partial.)
    pub fn partially_overlaps(&self, other: &Meta) -> bool {
        if self.numel() == 0 || other.numel() == 0 {
            return false;
        }
        if !self.is_non_overlapping_and_dense() || !other.is_non_overlapping_and_dense() {
            return false;
        }
        let (a0, a1) = (self.offset, self.offset + self.numel());
        let (b0, b1) = (other.offset, other.offset + other.numel());
        if a0 == b0 && a1 == b1 {
            return self.strides != other.strides;
        }
        a0 < b1 && b0 < a1
    }

    pub fn has_internal_overlap(&self) -> bool {
        if self.numel() <= 1 {
            return false;
        }
        if self
            .sizes
            .iter()
            .zip(&self.strides)
            .any(|(&s, &st)| s > 1 && st == 0)
        {
            return true;
        }
        // Sort dims by stride: non-overlapping iff each stride covers the
        // extent of all smaller ones (exact for the common cases) or, failing
        // that, an explicit check.
        let mut dims: smallvec::SmallVec<[(usize, usize); 4]> = self
            .sizes
            .iter()
            .copied()
            .zip(self.strides.iter().copied())
            .filter(|d| d.0 > 1)
            .collect();
        dims.sort_by_key(|d| d.1);
        let mut extent = 1;
        let mut simple = true;
        for &(s, st) in &dims {
            if st < extent {
                simple = false;
                break;
            }
            extent += st * (s - 1);
        }
        if simple {
            return false;
        }
        let mut seen: Vec<usize> = self.offsets().collect();
        seen.sort_unstable();
        seen.windows(2).any(|w| w[0] == w[1])
    }

    /// `dtype[d0, d1]`, as the text format writes a parameter type.
    pub fn type_string(&self) -> String {
        format!("{}{}", self.dtype, ShapeFmt(&self.sizes))
    }
}

pub struct ShapeFmt<'a>(pub &'a [usize]);

impl fmt::Display for ShapeFmt<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, s) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{s}")?;
        }
        f.write_str("]")
    }
}

/// Saturating: an absurd shape gives `usize::MAX`, which `check_size`
/// refuses, never an overflow.
pub fn numel(sizes: &[usize]) -> usize {
    sizes.iter().fold(1usize, |a, &s| a.saturating_mul(s))
}

/// The most elements a tensor may have (2^48: beyond any machine's memory,
/// far from overflowing index arithmetic; on 32-bit targets such as wasm32,
/// what `usize` holds).
pub const MAX_ELEMENTS: usize = if usize::BITS > 48 {
    1 << (48 % usize::BITS)
} else {
    usize::MAX
};

/// `Ok` when a tensor of `sizes` has at most `MAX_ELEMENTS` elements.
pub fn check_size(sizes: &[usize]) -> Result<(), String> {
    let n = sizes
        .iter()
        .try_fold(1usize, |acc, &s| acc.checked_mul(s))
        .filter(|&n| n <= MAX_ELEMENTS);
    match n {
        Some(_) => Ok(()),
        None => Err(format!(
            "a tensor of shape {sizes:?} is too large: more than {MAX_ELEMENTS} elements"
        )),
    }
}

/// `contiguous_strides` without an allocation.
pub fn contiguous_dims(sizes: &[usize]) -> Dims {
    let mut strides: Dims = smallvec::smallvec![0; sizes.len()];
    let mut acc: usize = 1;
    for i in (0..sizes.len()).rev() {
        strides[i] = acc;
        acc = acc.saturating_mul(sizes[i].max(1));
    }
    strides
}

pub fn contiguous_strides(sizes: &[usize]) -> Vec<usize> {
    let mut strides = vec![0; sizes.len()];
    let mut acc: usize = 1;
    for i in (0..sizes.len()).rev() {
        strides[i] = acc;
        acc = acc.saturating_mul(sizes[i].max(1));
    }
    strides
}

/// Wraps a possibly negative dim into `0..ndim` (PyTorch's `maybe_wrap_dim`;
/// a 0-d tensor accepts dims -1 and 0).
pub fn wrap_dim(dim: i64, ndim: usize) -> Result<usize, String> {
    let n = ndim.max(1) as i64;
    if dim < -n || dim >= n {
        return Err(format!(
            "dimension out of range (expected to be in range of [{}, {}], but got {dim})",
            -n,
            n - 1
        ));
    }
    Ok(if dim < 0 {
        (dim + n) as usize
    } else {
        dim as usize
    })
}

/// Broadcasts two shapes, right-aligned (NumPy / PyTorch rules).
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Result<Dims, String> {
    let n = a.len().max(b.len());
    let mut out: Dims = smallvec::smallvec![0; n];
    for i in 0..n {
        let da = if i + a.len() >= n {
            a[i + a.len() - n]
        } else {
            1
        };
        let db = if i + b.len() >= n {
            b[i + b.len() - n]
        } else {
            1
        };
        out[i] = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return Err(format!(
                "shapes {} and {} cannot be broadcast: size {da} vs {db} at dimension {i}",
                ShapeFmt(a),
                ShapeFmt(b)
            ));
        };
    }
    Ok(out)
}

/// Strides that read `meta` as if expanded to `target` (0 on broadcast dims).
pub fn broadcast_strides(meta: &Meta, target: &[usize]) -> Dims {
    let n = target.len();
    let k = meta.dim();
    (0..n)
        .map(|i| {
            if i + k < n {
                0
            } else {
                let j = i + k - n;
                if meta.sizes[j] == 1 && target[i] != 1 {
                    0
                } else {
                    meta.strides[j]
                }
            }
        })
        .collect()
}

/// Iterates storage offsets of a strided view in row-major order.
pub struct OffsetIter<'a> {
    sizes: &'a [usize],
    strides: &'a [usize],
    index: Vec<usize>,
    current: usize,
    remaining: usize,
}

impl<'a> OffsetIter<'a> {
    pub fn new(sizes: &'a [usize], strides: &'a [usize], offset: usize) -> Self {
        OffsetIter {
            sizes,
            strides,
            index: vec![0; sizes.len()],
            current: offset,
            remaining: numel(sizes),
        }
    }
}

impl Iterator for OffsetIter<'_> {
    type Item = usize;
    fn next(&mut self) -> Option<usize> {
        if self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        let out = self.current;
        if self.remaining > 0 {
            for d in (0..self.sizes.len()).rev() {
                self.index[d] += 1;
                self.current += self.strides[d];
                if self.index[d] < self.sizes[d] {
                    break;
                }
                self.current -= self.strides[d] * self.sizes[d];
                self.index[d] = 0;
            }
        }
        Some(out)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining, Some(self.remaining))
    }
}

/// Row-major multi-index of flat `i` over `sizes`.
pub fn unravel(mut i: usize, sizes: &[usize]) -> Vec<usize> {
    let mut m = vec![0; sizes.len()];
    for (d, &s) in sizes.iter().enumerate().rev() {
        if s > 0 {
            m[d] = i % s;
            i /= s;
        }
    }
    m
}

/// Do `sizes` and `strides` address each element of a block of
/// `numel(sizes)` elements exactly once, in some order of the dimensions?
pub fn fills_block(sizes: &[usize], strides: &[usize]) -> bool {
    let mut dims: Vec<(usize, usize)> = sizes
        .iter()
        .zip(strides)
        .filter(|(&s, _)| s != 1)
        .map(|(&s, &st)| (st, s))
        .collect();
    dims.sort();
    let mut expected = 1;
    for (st, s) in dims {
        if st != expected {
            return false;
        }
        expected *= s;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_walk_row_major() {
        let m = Meta::contiguous(DType::F32, vec![2, 3]);
        let t = m.restrided(vec![3, 2], vec![1, 3], 0);
        assert_eq!(t.offsets().collect::<Vec<_>>(), vec![0, 3, 1, 4, 2, 5]);
        assert!(!t.is_contiguous() && m.is_contiguous());
    }

    #[test]
    fn overlap_is_exact() {
        let m = Meta::contiguous(DType::F32, vec![5]);
        assert!(m
            .restrided(vec![3, 3], vec![1, 1], 0)
            .has_internal_overlap());
        assert!(!m
            .restrided(vec![2, 2], vec![2, 1], 0)
            .has_internal_overlap());
        assert!(m
            .restrided(vec![2, 3], vec![0, 1], 0)
            .has_internal_overlap());
        // Interleaved but disjoint: strides 1 and 3 over sizes 2 and 2 is fine.
        assert!(!m
            .restrided(vec![2, 2], vec![1, 3], 0)
            .has_internal_overlap());
    }

    #[test]
    fn broadcasting() {
        assert_eq!(broadcast_shapes(&[3, 1], &[4]).unwrap()[..], [3, 4]);
        assert!(broadcast_shapes(&[3], &[4]).is_err());
    }
}
