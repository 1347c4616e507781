//! Device tensors: a GPU buffer with a dtype and shape that stays on the
//! device, so one run can feed the next; read back typed when wanted.

use super::host::{device_bytes, from_words, HostTensor};
use super::Gpu;
use crate::EngineError;
use kiln_dtype::DType;
use std::sync::Arc;

/// A tensor in a buffer of its own on a session's device.
#[derive(Clone)]
pub struct DeviceTensor {
    gpu: Arc<Gpu>,
    session: u64,
    buffer: Arc<wgpu::Buffer>,
    dtype: DType,
    sizes: Vec<usize>,
    /// Bools and f16 packed as in eager memory (every upload, and
    /// elementwise results), or a word per element (f16 as f32 bits).
    packed: bool,
}

impl std::fmt::Debug for DeviceTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceTensor({})", self.type_string())
    }
}

impl DeviceTensor {
    pub(crate) fn new(
        gpu: Arc<Gpu>,
        session: u64,
        buffer: Arc<wgpu::Buffer>,
        dtype: DType,
        sizes: Vec<usize>,
        packed: bool,
    ) -> DeviceTensor {
        DeviceTensor {
            gpu,
            session,
            buffer,
            dtype,
            sizes,
            // Dtypes of a word per element are the same either way.
            packed: packed || crate::kernel::per_word(dtype) == 1,
        }
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn sizes(&self) -> &[usize] {
        &self.sizes
    }

    pub fn type_string(&self) -> String {
        let dims: Vec<String> = self.sizes.iter().map(|s| s.to_string()).collect();
        format!("{}[{}]", self.dtype, dims.join(", "))
    }

    /// Which buffer this is (equal for clones of one tensor).
    #[cfg(feature = "compiler")]
    pub(crate) fn identity(&self) -> usize {
        Arc::as_ptr(&self.buffer) as usize
    }

    pub(crate) fn session(&self) -> u64 {
        self.session
    }

    pub(crate) fn is_packed(&self) -> bool {
        self.packed
    }

    pub(crate) fn buffer(&self) -> &wgpu::Buffer {
        &self.buffer
    }

    fn words(&self) -> u64 {
        let n: usize = self.sizes.iter().product();
        crate::kernel::words(self.dtype, n, self.packed) as u64
    }

    /// Reads the tensor back (one staging copy), blocking.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn to_host(&self) -> Result<HostTensor<'static>, EngineError> {
        pollster::block_on(self.to_host_async())
    }

    pub async fn to_host_async(&self) -> Result<HostTensor<'static>, EngineError> {
        let gpu = &self.gpu;
        gpu.check()?;
        let bytes = self.words() * 4;
        if bytes == 0 {
            return HostTensor::new(self.dtype, self.sizes.clone(), vec![]).map(|t| t.into_owned());
        }
        let staging = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("kiln to_host"),
            size: bytes,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut enc = gpu
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("kiln to_host"),
            });
        enc.copy_buffer_to_buffer(&self.buffer, 0, &staging, 0, bytes);
        gpu.queue.submit([enc.finish()]);
        let (tx, rx) = futures::channel::oneshot::channel();
        staging.slice(..).map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        gpu.wait()?;
        rx.await
            .map_err(|_| EngineError::Device("the readback was dropped".into()))?
            .map_err(|e| EngineError::Device(e.to_string()))?;
        let t = {
            let view = staging
                .slice(..)
                .get_mapped_range()
                .map_err(|e| EngineError::Device(e.to_string()))?;
            from_words(self.dtype, self.sizes.clone(), &view, self.packed)
        };
        staging.unmap();
        Ok(t)
    }
}

/// Uploads `t` into a new device tensor (packed) of `session` on `gpu`.
pub(crate) async fn upload_in(
    gpu: &Arc<Gpu>,
    session: u64,
    t: &HostTensor<'_>,
) -> Result<DeviceTensor, EngineError> {
    gpu.scoped("uploading a tensor", || upload_unscoped(gpu, session, t))
        .await
}

/// `upload_in` without an error scope of its own: for callers uploading
/// many tensors under one scope (one wait for all, not one per tensor).
pub(crate) fn upload_unscoped(
    gpu: &Arc<Gpu>,
    session: u64,
    t: &HostTensor<'_>,
) -> Result<DeviceTensor, EngineError> {
    let bytes = device_bytes(t)?;
    let limit = gpu.limits.max_buffer_size;
    if bytes.len() as u64 > limit {
        return Err(EngineError::Unsupported(format!(
            "a {} tensor takes {} bytes; this device's largest buffer is {limit} bytes",
            t.type_string(),
            bytes.len()
        )));
    }
    let buffer = gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("kiln tensor"),
        size: bytes.len() as u64,
        usage: wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_DST
            | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    gpu.queue.write_buffer(&buffer, 0, &bytes);
    Ok(DeviceTensor::new(
        gpu.clone(),
        session,
        Arc::new(buffer),
        t.dtype(),
        t.sizes().to_vec(),
        true,
    ))
}
