//! Typed host tensors: a dtype, a shape and the elements as contiguous
//! little-endian bytes, owned or borrowed (from a memory-mapped weights
//! file, with no copy). f64 appears only at the reference interpreter's
//! boundary (`from_rtensor`, `to_rtensor`).

use crate::EngineError;
use kiln_dtype::DType;
#[cfg(feature = "compiler")]
use kiln_functionalize::RTensor;
use std::borrow::Cow;

/// A Rust element type of a dtype (`bool` travels as `u8`, one byte).
pub trait Element: bytemuck::Pod {
    const DTYPE: DType;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
}
impl Element for i32 {
    const DTYPE: DType = DType::I32;
}
impl Element for i64 {
    const DTYPE: DType = DType::I64;
}
impl Element for u32 {
    const DTYPE: DType = DType::U32;
}
impl Element for half::f16 {
    const DTYPE: DType = DType::F16;
}
impl Element for i8 {
    const DTYPE: DType = DType::I8;
}

/// Elements as bytes in eager memory's layout: bools a byte, f16 two bytes,
/// i64 eight, the others four.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor<'a> {
    dtype: DType,
    sizes: Vec<usize>,
    bytes: Cow<'a, [u8]>,
}

impl<'a> HostTensor<'a> {
    /// A tensor over `bytes` (owned or borrowed), checked against the shape.
    pub fn new(
        dtype: DType,
        sizes: Vec<usize>,
        bytes: impl Into<Cow<'a, [u8]>>,
    ) -> Result<HostTensor<'a>, EngineError> {
        let bytes = bytes.into();
        let want = sizes
            .iter()
            .try_fold(dtype.size_bytes(), |n, &s| n.checked_mul(s))
            .ok_or_else(|| {
                EngineError::Tensor(format!("a {dtype}{sizes:?} tensor is too large"))
            })?;
        if bytes.len() != want {
            return Err(EngineError::Tensor(format!(
                "a {dtype}{sizes:?} tensor needs {want} bytes, got {}",
                bytes.len()
            )));
        }
        Ok(HostTensor {
            dtype,
            sizes,
            bytes,
        })
    }

    /// A tensor of typed elements (copied).
    pub fn from_slice<T: Element>(
        sizes: &[usize],
        data: &[T],
    ) -> Result<HostTensor<'static>, EngineError> {
        HostTensor::new(
            T::DTYPE,
            sizes.to_vec(),
            bytemuck::cast_slice::<T, u8>(data).to_vec(),
        )
    }

    pub fn from_bools(sizes: &[usize], data: &[bool]) -> Result<HostTensor<'static>, EngineError> {
        HostTensor::new(
            DType::Bool,
            sizes.to_vec(),
            data.iter().map(|&b| b as u8).collect::<Vec<u8>>(),
        )
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn sizes(&self) -> &[usize] {
        &self.sizes
    }

    pub fn numel(&self) -> usize {
        self.sizes.iter().product()
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// "f32[2, 3]", as the text format writes types.
    pub fn type_string(&self) -> String {
        let dims: Vec<String> = self.sizes.iter().map(|s| s.to_string()).collect();
        format!("{}[{}]", self.dtype, dims.join(", "))
    }

    /// The elements as `T` (which must be the tensor's dtype).
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>, EngineError> {
        if T::DTYPE != self.dtype {
            return Err(EngineError::Tensor(format!(
                "asked for {} elements of a {} tensor",
                T::DTYPE,
                self.dtype
            )));
        }
        // The bytes may be unaligned (a borrowed file region).
        Ok(bytemuck::pod_collect_to_vec(&self.bytes))
    }

    pub fn into_owned(self) -> HostTensor<'static> {
        HostTensor {
            dtype: self.dtype,
            sizes: self.sizes,
            bytes: Cow::Owned(self.bytes.into_owned()),
        }
    }

    /// The reference interpreter's tensor as bytes (its f64 values rounded
    /// to the dtype).
    #[cfg(feature = "compiler")]
    pub fn from_rtensor(t: &RTensor) -> HostTensor<'static> {
        let vals = t.values();
        let d = t.dtype();
        let mut bytes = Vec::with_capacity(vals.len() * d.size_bytes());
        for v in vals {
            match d {
                DType::F32 => bytes.extend((v as f32).to_le_bytes()),
                DType::F16 => bytes.extend(half::f16::from_f64(v).to_le_bytes()),
                DType::I32 => bytes.extend((v as i32).to_le_bytes()),
                DType::I64 => bytes.extend((v as i64).to_le_bytes()),
                DType::U32 => bytes.extend((v as u32).to_le_bytes()),
                DType::I8 => bytes.push(v as i8 as u8),
                DType::Bool => bytes.push((v != 0.0) as u8),
            }
        }
        HostTensor {
            dtype: d,
            sizes: t.sizes().to_vec(),
            bytes: Cow::Owned(bytes),
        }
    }

    /// Element `i` as f64 (the reference interpreter's value type).
    #[cfg(feature = "compiler")]
    fn value(&self, i: usize) -> f64 {
        let b = &self.bytes;
        let w4 = |i: usize| [b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]];
        match self.dtype {
            DType::F32 => f32::from_le_bytes(w4(i)) as f64,
            DType::I32 => i32::from_le_bytes(w4(i)) as f64,
            DType::U32 => u32::from_le_bytes(w4(i)) as f64,
            DType::I64 => i64::from_le_bytes(std::array::from_fn(|k| b[8 * i + k])) as f64,
            DType::F16 => half::f16::from_le_bytes([b[2 * i], b[2 * i + 1]]).to_f64(),
            DType::I8 => b[i] as i8 as f64,
            DType::Bool => (b[i] != 0) as u8 as f64,
        }
    }

    #[cfg(feature = "compiler")]
    pub fn to_rtensor(&self) -> RTensor {
        let vals: Vec<f64> = (0..self.numel()).map(|i| self.value(i)).collect();
        RTensor::new(self.dtype, self.sizes.clone(), &vals)
    }

    /// The strided view `(sizes, strides, offset)` in elements, gathered
    /// into a new contiguous tensor (the view must lie inside the tensor).
    pub(crate) fn gather(
        &self,
        sizes: &[usize],
        strides: &[usize],
        offset: usize,
    ) -> HostTensor<'static> {
        let es = self.dtype.size_bytes();
        let n: usize = sizes.iter().product();
        let mut out = Vec::with_capacity(n * es);
        let mut idx = vec![0usize; sizes.len()];
        for _ in 0..n {
            let at = offset + idx.iter().zip(strides).map(|(i, s)| i * s).sum::<usize>();
            out.extend_from_slice(&self.bytes[at * es..(at + 1) * es]);
            for d in (0..sizes.len()).rev() {
                idx[d] += 1;
                if idx[d] < sizes[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
        HostTensor {
            dtype: self.dtype,
            sizes: sizes.to_vec(),
            bytes: Cow::Owned(out),
        }
    }
}

/// The bytes of `t` as a device buffer holds them: i64 narrowed to i32
/// (see `wgsl::ty`), refused with the element and its value where one does
/// not fit, and padded to whole words.
pub(crate) fn device_bytes<'b>(t: &'b HostTensor<'_>) -> Result<Cow<'b, [u8]>, EngineError> {
    if t.dtype != DType::I64 {
        return Ok(padded(t.bytes()));
    }
    let mut out = Vec::with_capacity(t.bytes.len() / 2);
    for (i, c) in t.bytes.chunks_exact(8).enumerate() {
        let v = i64::from_le_bytes(c.try_into().expect("8 bytes"));
        let n = i32::try_from(v).map_err(|_| {
            EngineError::Tensor(format!(
                "element {i} of an i64{:?} tensor is {v}, outside the 32-bit range this                  device computes i64 in ({} to {}); run it with the reference backend",
                t.sizes,
                i32::MIN,
                i32::MAX
            ))
        })?;
        out.extend(n.to_le_bytes());
    }
    if out.is_empty() {
        out.resize(4, 0);
    }
    Ok(Cow::Owned(out))
}

/// `bytes` padded with zeros to whole 32-bit words (buffer writes and
/// copies move whole words).
pub(crate) fn padded(bytes: &[u8]) -> Cow<'_, [u8]> {
    if bytes.len().is_multiple_of(4) && !bytes.is_empty() {
        Cow::Borrowed(bytes)
    } else {
        let mut v = bytes.to_vec();
        v.resize(bytes.len().div_ceil(4).max(1) * 4, 0);
        Cow::Owned(v)
    }
}

/// Decodes a buffer's words into host bytes: packed bools and f16 are
/// already eager's layout; unpacked ones (a word per element, f16 as f32
/// bits) are narrowed, i64 (an i32 on the device) widened.
pub(crate) fn from_words(
    dtype: DType,
    sizes: Vec<usize>,
    words: &[u8],
    packed: bool,
) -> HostTensor<'static> {
    let n: usize = sizes.iter().product();
    let es = dtype.size_bytes();
    let bytes: Vec<u8> = if (packed || es == 4) && dtype != DType::I64 {
        words[..n * es].to_vec()
    } else {
        let word = |i: usize| {
            u32::from_le_bytes([
                words[4 * i],
                words[4 * i + 1],
                words[4 * i + 2],
                words[4 * i + 3],
            ])
        };
        match dtype {
            DType::Bool => (0..n).map(|i| (word(i) != 0) as u8).collect(),
            DType::I8 => (0..n).map(|i| word(i) as u8).collect(),
            DType::F16 => (0..n)
                .flat_map(|i| half::f16::from_f32(f32::from_bits(word(i))).to_le_bytes())
                .collect(),
            DType::I64 => (0..n)
                .flat_map(|i| (word(i) as i32 as i64).to_le_bytes())
                .collect(),
            _ => unreachable!("4-byte dtypes are handled above"),
        }
    };
    HostTensor {
        dtype,
        sizes,
        bytes: Cow::Owned(bytes),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_decode_as_eager_memory() {
        let w: Vec<u8> = [1u32, 0, 7].iter().flat_map(|x| x.to_le_bytes()).collect();
        let t = from_words(DType::Bool, vec![3], &w, false);
        assert_eq!(t.bytes(), &[1, 0, 1]);
        let h = half::f16::from_f32(1.5);
        let w: Vec<u8> = 1.5f32.to_bits().to_le_bytes().to_vec();
        let t = from_words(DType::F16, vec![1], &w, false);
        assert_eq!(t.to_vec::<half::f16>().unwrap(), vec![h]);
        let x = HostTensor::from_slice(&[2, 3], &[0f32, 1., 2., 3., 4., 5.]).unwrap();
        let tr = x.gather(&[3, 2], &[1, 3], 0);
        assert_eq!(tr.to_vec::<f32>().unwrap(), vec![0., 3., 1., 4., 2., 5.]);
        assert_eq!(HostTensor::from_rtensor(&x.to_rtensor()), x);
        let l = HostTensor::from_slice(&[3], &[-5i64, 0, 2147483647]).unwrap();
        let d = device_bytes(&l).unwrap();
        assert_eq!(from_words(DType::I64, vec![3], &d, false), l);
        let big = HostTensor::from_slice(&[2], &[1i64, 1 << 31]).unwrap();
        let e = device_bytes(&big).unwrap_err().to_string();
        assert!(e.contains("element 1") && e.contains("2147483648"), "{e}");
    }
}
