//! Runtime tensors of the eager reference interpreter: a shared storage and
//! a strided view of it. Views share the `Rc<Storage>`, so an in-place write
//! through any alias is seen by all of them, as in PyTorch.
//!
//! Elements are held as `f64` and rounded to the storage's dtype on every
//! store (`DType::cast`), which represents every f32, f16, i32, u32 and bool
//! value exactly, and i64 values within 2^53 (`dtype::I64_EXACT`).

use crate::dtype::DType;
use crate::meta::Meta;
use std::cell::RefCell;
use std::rc::Rc;

#[derive(Debug)]
pub struct Storage {
    pub dtype: DType,
    pub data: RefCell<Vec<f64>>,
}

/// The bytes of a buffer of `numel` elements of `dtype` on a device: whole
/// 4-byte words (a bool[15] mask takes 16).
pub fn buffer_bytes(numel: usize, dtype: DType) -> usize {
    (numel * dtype.size_bytes()).next_multiple_of(4)
}

impl Storage {
    /// The bytes a device buffer holding this storage takes: its
    /// elements' bytes rounded up to whole 4-byte words (wgpu sizes and
    /// copies buffers in words), so eager's peak and a compiled plan's are
    /// counted alike.
    pub fn bytes(&self) -> usize {
        buffer_bytes(self.data.borrow().len(), self.dtype)
    }
}

#[derive(Clone, Debug)]
pub struct RTensor {
    pub storage: Rc<Storage>,
    pub meta: Meta,
}

impl RTensor {
    /// A fresh tensor laid out as `meta`, holding `values` in row-major
    /// logical order (rounded to the dtype).
    pub fn from_values(meta: Meta, values: &[f64]) -> RTensor {
        debug_assert_eq!(values.len(), meta.numel());
        let mut data = vec![0.0; meta.storage_numel];
        for (off, &v) in meta.offsets().zip(values) {
            data[off] = meta.dtype.cast(v);
        }
        RTensor {
            storage: Rc::new(Storage {
                dtype: meta.dtype,
                data: RefCell::new(data),
            }),
            meta,
        }
    }

    /// A contiguous tensor of the given dtype and shape.
    pub fn new(dtype: DType, sizes: impl Into<crate::meta::Dims>, values: &[f64]) -> RTensor {
        RTensor::from_values(Meta::contiguous(dtype, sizes), values)
    }

    /// The elements in row-major logical order.
    pub fn values(&self) -> Vec<f64> {
        let data = self.storage.data.borrow();
        self.meta.offsets().map(|o| data[o]).collect()
    }

    /// The elements read as if broadcast to `shape`.
    pub fn values_broadcast(&self, shape: &[usize]) -> Vec<f64> {
        let strides = crate::meta::broadcast_strides(&self.meta, shape);
        let data = self.storage.data.borrow();
        crate::meta::OffsetIter::new(shape, &strides, self.meta.offset)
            .map(|o| data[o])
            .collect()
    }

    /// Writes `values` (row-major over this view) into the storage.
    pub fn write(&self, values: &[f64]) {
        let mut data = self.storage.data.borrow_mut();
        for (off, &v) in self.meta.offsets().zip(values) {
            data[off] = self.meta.dtype.cast(v);
        }
    }

    /// The same storage seen through another geometry.
    pub fn view(&self, meta: Meta) -> RTensor {
        RTensor {
            storage: self.storage.clone(),
            meta,
        }
    }

    pub fn shares_storage(&self, other: &RTensor) -> bool {
        Rc::ptr_eq(&self.storage, &other.storage)
    }

    pub fn sizes(&self) -> &[usize] {
        &self.meta.sizes
    }

    pub fn dtype(&self) -> DType {
        self.meta.dtype
    }
}
