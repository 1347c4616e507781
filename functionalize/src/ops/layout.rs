//! The strides ATen gives freshly allocated results. They are observable
//! (whether a later `view` is legal, whether `reshape`/`contiguous` alias or
//! copy, what `as_strided` reads), so Kiln reproduces them.

use crate::meta::{broadcast_strides, numel, Dims, Meta};

/// `TensorImpl::is_non_overlapping_and_dense`.
pub fn is_non_overlapping_and_dense(sizes: &[usize], strides: &[usize]) -> bool {
    let n = sizes.len();
    if n == 1 {
        return sizes[0] < 2 || strides[0] == 1;
    }
    let mut perm: Dims = (0..n).collect();
    perm.sort_by(|&a, &b| {
        use std::cmp::Ordering::*;
        match (sizes[a] < 2, sizes[b] < 2) {
            (true, true) => Equal,
            (true, false) => Greater,
            (false, true) => Less,
            (false, false) => strides[a].cmp(&strides[b]),
        }
    });
    let mut require = 1;
    for &d in &perm {
        if sizes[d] < 2 {
            return true;
        }
        if strides[d] != require {
            return false;
        }
        require *= sizes[d];
    }
    true
}

/// `empty_like(t, preserve_format)`: the same strides when `t` is
/// non-overlapping and dense, else contiguous.
pub fn like(t: &Meta, dtype: crate::dtype::DType) -> Meta {
    if is_non_overlapping_and_dense(&t.sizes, &t.strides) {
        Meta {
            dtype,
            sizes: t.sizes.clone(),
            strides: t.strides.clone(),
            offset: 0,
            storage_numel: t.numel(),
        }
    } else {
        Meta::contiguous(dtype, t.sizes.clone())
    }
}

/// Output layout of a TensorIterator op over `inputs` (0-d scalars included)
/// broadcast to `shape`: the fast paths for all-contiguous and
/// all-same-strides inputs, else the permutation that sorts dimensions by
/// the inputs' strides (`TensorIteratorBase::reorder_dimensions`).
pub fn iterator_output(shape: &[usize], inputs: &[&Meta], dtype: crate::dtype::DType) -> Meta {
    let n = shape.len();
    let fresh = |strides: Dims| Meta {
        dtype,
        sizes: shape.into(),
        strides,
        offset: 0,
        storage_numel: numel(shape),
    };
    let same_shape = inputs.iter().all(|m| m.sizes[..] == shape[..]);
    if same_shape && !inputs.is_empty() {
        if inputs.iter().all(|m| m.is_contiguous()) {
            return Meta::contiguous(dtype, shape);
        }
        if inputs
            .iter()
            .all(|m| is_non_overlapping_and_dense(&m.sizes, &m.strides))
            && inputs.windows(2).all(|w| w[0].strides == w[1].strides)
        {
            return fresh(inputs[0].strides.clone());
        }
    }
    // Strides of each operand over the common shape (0 where broadcast;
    // size-1 dims keep theirs, as ATen does).
    let op_strides: smallvec::SmallVec<[Dims; 3]> = inputs
        .iter()
        .map(|m| {
            let b = broadcast_strides(m, shape);
            (0..n)
                .map(|i| {
                    let k = m.dim();
                    if i + k >= n && m.sizes[i + k - n] == 1 && shape[i] == 1 {
                        m.strides[i + k - n]
                    } else {
                        b[i]
                    }
                })
                .collect()
        })
        .collect();
    // perm[0] is the fastest-moving dim; ATen starts from reversed order.
    let mut perm: Dims = (0..n).rev().collect();
    let should_swap = |d0: usize, d1: usize| -> i32 {
        for s in &op_strides {
            let (s0, s1) = (s[d0], s[d1]);
            if s0 == 0 || s1 == 0 {
                continue;
            }
            if s0 < s1 {
                return -1;
            }
            if s0 > s1 {
                return 1;
            }
            if shape[d0] > shape[d1] {
                return 1;
            }
        }
        0
    };
    for i in 1..n {
        let mut dim1 = i;
        for dim0 in (0..i).rev() {
            let c = should_swap(perm[dim0], perm[dim1]);
            if c > 0 {
                perm.swap(dim0, dim1);
                dim1 = dim0;
            } else if c < 0 {
                break;
            }
        }
    }
    if perm.iter().enumerate().all(|(j, &p)| p == n - 1 - j) {
        return Meta::contiguous(dtype, shape);
    }
    let mut strides: Dims = smallvec::smallvec![0; n];
    let mut acc = 1;
    for &d in &perm {
        strides[d] = acc;
        acc *= shape[d].max(1);
    }
    fresh(strides)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType::F32;
    use crate::meta::contiguous_strides;

    #[test]
    fn elementwise_on_transposed_keeps_layout() {
        let x = Meta::contiguous(F32, vec![2, 3]);
        let t = x.restrided(vec![3, 2], vec![1, 3], 0);
        let out = iterator_output(&[3, 2], &[&t], F32);
        assert_eq!(out.strides[..], [1, 3]);
        let b = Meta::contiguous(F32, vec![2]);
        let out = iterator_output(&[3, 2], &[&t, &b], F32);
        assert_eq!(out.strides[..], [1, 3]);
        let sliced = Meta::contiguous(F32, vec![6]).restrided(vec![3], vec![2], 0);
        assert_eq!(
            iterator_output(&[3], &[&sliced], F32).strides[..],
            contiguous_strides(&[3])[..]
        );
    }
}
