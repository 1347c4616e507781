//! The GPU device: adapter selection, features and limits, and the
//! compile choices they imply.

use super::pipelines::DiskCache;
use crate::kernel::BindingRules;
use crate::{CompileOptions, EngineError};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// A GPU device and its queue.
pub struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    pub limits: wgpu::Limits,
    pub features: wgpu::Features,
    lost: Arc<(AtomicBool, Mutex<String>)>,
    /// The driver's pipeline cache, kept on disk between processes.
    pub(crate) disk_cache: Option<DiskCache>,
}

/// Device objects alive at one moment (`Gpu::held`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Held {
    pub buffers: isize,
    /// Device memory allocated for those buffers.
    pub buffer_bytes: isize,
    pub bind_groups: isize,
    pub pipelines: isize,
}

/// Keeps a headless run quiet: Mesa's device-select Vulkan layer looks for
/// a Wayland compositor to rank GPUs by, and where there can be none (no
/// `XDG_RUNTIME_DIR`) libwayland prints "error: XDG_RUNTIME_DIR is invalid
/// or not set in the environment." twice. There the layer is switched off
/// (`NODEVICE_SELECT=1`; the adapter is still chosen by power preference
/// or `KILN_ADAPTER`), unless the user asked it for a device
/// (`MESA_VK_DEVICE_SELECT`). Binaries call it first thing in `main`,
/// before any thread starts (it sets an environment variable).
#[cfg(not(target_arch = "wasm32"))]
pub fn quiet_headless_vulkan() {
    let unset = |v: &str| std::env::var_os(v).is_none_or(|x| x.is_empty());
    if unset("XDG_RUNTIME_DIR") && unset("MESA_VK_DEVICE_SELECT") && unset("NODEVICE_SELECT") {
        std::env::set_var("NODEVICE_SELECT", "1");
    }
}

const INSTALL_HINT: &str =
    "install a Vulkan, Metal or DX12 driver; on Debian or Ubuntu without a GPU, \
     `apt-get install mesa-vulkan-drivers libvulkan1` gives the software adapter lavapipe";

impl Gpu {
    /// The high-performance adapter, or the first whose name contains
    /// `KILN_ADAPTER`; `WGPU_BACKEND` picks backends.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn new() -> Result<Gpu, EngineError> {
        pollster::block_on(Gpu::new_async())
    }

    pub async fn new_async() -> Result<Gpu, EngineError> {
        Gpu::with_limits(|_| {}).await
    }

    /// Like `new_async`, with the adapter's limits adjusted by `adjust`
    /// (lowered, to run as a smaller device would: a browser's 8 storage
    /// buffers, a small binding limit).
    pub async fn with_limits(adjust: impl FnOnce(&mut wgpu::Limits)) -> Result<Gpu, EngineError> {
        Gpu::open(
            adjust,
            wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::SUBGROUP | shader_f16(),
        )
        .await
    }

    /// The adapter restricted to what every WebGPU browser gives: WebGPU's
    /// default limits (8 storage buffers per stage, 128 MiB per binding,
    /// 256-byte offsets) and no optional feature but `shader-f16` where
    /// the adapter has it, which exports never require (its kernels are
    /// variants beside portable ones). Programs compiled here and exported
    /// run in a browser.
    pub async fn web_like() -> Result<Gpu, EngineError> {
        Gpu::open(|l| *l = wgpu::Limits::default(), shader_f16()).await
    }

    /// The adapter (`KILN_ADAPTER` or the high-performance one), its limits
    /// adjusted by `adjust`, with those of `wanted` features it has (tests
    /// open it without `shader-f16` to run what such a device runs).
    pub async fn open(
        adjust: impl FnOnce(&mut wgpu::Limits),
        wanted: wgpu::Features,
    ) -> Result<Gpu, EngineError> {
        let instance =
            wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        let adapter = match std::env::var("KILN_ADAPTER") {
            Ok(want) => {
                let all = instance.enumerate_adapters(wgpu::Backends::all()).await;
                let names: Vec<String> = all.iter().map(|a| a.get_info().name).collect();
                all.into_iter()
                    .find(|a| {
                        a.get_info()
                            .name
                            .to_lowercase()
                            .contains(&want.to_lowercase())
                    })
                    .ok_or_else(|| {
                        EngineError::NoAdapter(format!(
                            "KILN_ADAPTER={want:?} matches none of the adapters {names:?}"
                        ))
                    })?
            }
            Err(_) => instance
                .request_adapter(&wgpu::RequestAdapterOptions {
                    power_preference: wgpu::PowerPreference::HighPerformance,
                    force_fallback_adapter: false,
                    compatible_surface: None,
                    apply_limit_buckets: false,
                })
                .await
                .map_err(|e| EngineError::NoAdapter(format!("{e}; {INSTALL_HINT}")))?,
        };
        let info = adapter.get_info();
        let mut limits = adapter.limits();
        adjust(&mut limits);
        // GPU time comes from timestamp queries where the adapter has them;
        // row reductions use subgroup operations where it has those.
        let features = adapter.features() & wanted;
        // Compiled pipelines kept between runs where the backend lets an
        // application keep them (Vulkan).
        #[cfg(not(target_arch = "wasm32"))]
        let cache_path = DiskCache::path_for(&info)
            .filter(|_| adapter.features().contains(wgpu::Features::PIPELINE_CACHE));
        #[cfg(target_arch = "wasm32")]
        let cache_path: Option<std::path::PathBuf> = None;
        let cache_feature = match cache_path {
            Some(_) => wgpu::Features::PIPELINE_CACHE,
            None => wgpu::Features::empty(),
        };
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("kiln"),
                required_limits: limits.clone(),
                required_features: features | cache_feature,
                ..Default::default()
            })
            .await
            .map_err(|e| EngineError::Device(e.to_string()))?;
        let lost = Arc::new((AtomicBool::new(false), Mutex::new(String::new())));
        let flag = lost.clone();
        device.set_device_lost_callback(move |reason, msg| {
            flag.0.store(true, Ordering::SeqCst);
            if let Ok(mut m) = flag.1.lock() {
                *m = format!("{reason:?}: {msg}");
            }
        });
        // Errors outside `scoped` (none are expected) are logged, not
        // panicked on as wgpu's default handler would.
        device.on_uncaptured_error(Arc::new(|e: wgpu::Error| {
            log::error!("wgpu: {e}");
        }));
        let disk_cache = cache_path.map(|p| DiskCache::open(&device, p));
        Ok(Gpu {
            device,
            queue,
            info,
            limits,
            features,
            lost,
            disk_cache,
        })
    }

    /// An error if the device was lost (driver reset, removal).
    pub fn check(&self) -> Result<(), EngineError> {
        if self.lost.0.load(Ordering::SeqCst) {
            let why = self.lost.1.lock().map(|m| m.clone()).unwrap_or_default();
            return Err(EngineError::Device(format!(
                "the GPU device was lost ({why}); create a new session"
            )));
        }
        Ok(())
    }

    /// Runs `f` inside error scopes (per thread: wgpu's `std` feature) and
    /// returns what wgpu rejected or could not allocate during it as an
    /// error saying what was being `doing`.
    pub(crate) async fn scoped<T>(
        &self,
        doing: &str,
        f: impl FnOnce() -> Result<T, EngineError>,
    ) -> Result<T, EngineError> {
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let r = f();
        // Both scopes leave the device's stack before anything awaits, so
        // scoped calls of concurrent futures (a load's pipelines and its
        // uploads) never interleave on it.
        let (v, o) = (validation.pop(), oom.pop());
        let (v, o) = (v.await, o.await);
        match (v, o) {
            (Some(e), _) => Err(EngineError::Internal(format!("{doing}: {e}"))),
            (None, Some(e)) => Err(EngineError::Device(format!(
                "{doing}: out of GPU memory ({e})"
            ))),
            (None, None) => r,
        }
    }

    /// What the device holds now, by wgpu's own counters (every buffer,
    /// bind group and pipeline created on it and not yet dropped): a
    /// leak shows as growth between two readings. Zeros where the
    /// backend keeps no counters (WebGPU in a browser).
    pub fn held(&self) -> Held {
        let c = self.device.get_internal_counters();
        Held {
            buffers: c.hal.buffers.read(),
            buffer_bytes: c.hal.buffer_memory.read(),
            bind_groups: c.hal.bind_groups.read(),
            pipelines: c.hal.compute_pipelines.read(),
        }
    }

    /// The device runs f16 conversions in its own instructions
    /// (`KernelCode::wgsl_f16`).
    pub fn native_f16(&self) -> bool {
        self.features.contains(wgpu::Features::SHADER_F16)
    }

    pub fn has_timestamps(&self) -> bool {
        self.features.contains(wgpu::Features::TIMESTAMP_QUERY)
    }

    /// Compilation choices for this device.
    pub fn compile_options(&self) -> CompileOptions {
        let l = &self.limits;
        let cpu = self.info.device_type == wgpu::DeviceType::Cpu;
        let subgroup = (self.features.contains(wgpu::Features::SUBGROUP)
            && switch("KILN_SUBGROUPS", true)
            && self.info.subgroup_min_size.is_power_of_two()
            && self.info.subgroup_min_size >= 4)
            .then_some(self.info.subgroup_min_size as usize);
        let attention_rows = subgroup.is_some() && switch("KILN_ATTENTION_ROWS", cpu);
        CompileOptions {
            tile_min_rows: if cpu { usize::MAX } else { 0 },
            tall_tiles_from: tall_tiles_from(CompileOptions::default().tall_tiles_from),
            workgroup_rows: !cpu,
            tile_transposes: switch("KILN_TILE_TRANSPOSES", !cpu),
            transpose_tile: transpose_tile(if cpu {
                16
            } else {
                CompileOptions::default().transpose_tile
            }),
            transpose_blocks: switch("KILN_TRANSPOSE_BLOCKS", cpu),
            wide_blocks: switch("KILN_WIDE_BLOCKS", CompileOptions::default().wide_blocks),
            vectorize: true,
            contiguous_operands: switch("KILN_CONTIGUOUS_OPERANDS", cpu),
            // CPU adapters fuse attention where their kernel for it can
            // share loads through subgroups.
            fuse_attention: switch("KILN_FUSE_ATTENTION", !cpu || attention_rows),
            attention_rows,
            attention_projections: switch("KILN_ATTENTION_PROJECTIONS", true),
            subgroup,
            shader_f16: self.native_f16(),
            grid_stride: if cpu { None } else { Some(8192) },
            workgroup: if cpu { 64 } else { 256 },
            share_launches: CompileOptions::default().share_launches,
            chain_rows: CompileOptions::default().chain_rows,
            sequence: CompileOptions::default().sequence,
            max_buffer_bytes: usize::try_from(l.max_buffer_size).unwrap_or(usize::MAX),
            rules: BindingRules {
                align_words: (l.min_storage_buffer_offset_alignment as usize / 4).max(1),
                max_words: (l.max_storage_buffer_binding_size as usize / 4).max(1),
            },
            max_bindings: l.max_storage_buffers_per_shader_stage as usize,
            constants: vec![],
        }
    }

    /// "name (backend, device type)".
    pub fn describe(&self) -> String {
        format!(
            "{} ({:?}, {:?})",
            self.info.name, self.info.backend, self.info.device_type
        )
    }

    /// Waits for the queue (native; a browser resolves maps by itself).
    pub(crate) fn wait(&self) -> Result<(), EngineError> {
        #[cfg(not(target_arch = "wasm32"))]
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| EngineError::Device(e.to_string()))?;
        self.check()
    }
}

/// `shader-f16` where the adapter has it, unless `KILN_SHADER_F16=off`.
pub(crate) fn shader_f16() -> wgpu::Features {
    if std::env::var("KILN_SHADER_F16").is_ok_and(|v| v == "off") {
        wgpu::Features::empty()
    } else {
        wgpu::Features::SHADER_F16
    }
}

/// An on/off choice the environment variable `var` (`on` or `off`)
/// overrides, to time both in one run; else `default`.
fn switch(var: &str, default: bool) -> bool {
    match std::env::var(var).as_deref() {
        Ok("on") => true,
        Ok("off") => false,
        Ok(v) => {
            log::warn!("{var}={v:?}: not `on` or `off`; ignored");
            default
        }
        Err(_) => default,
    }
}

/// `CompileOptions::transpose_tile` on this machine: `KILN_TRANSPOSE_TILE`
/// (16 or 32) overrides the default, to time both in one run.
fn transpose_tile(default: usize) -> usize {
    match std::env::var("KILN_TRANSPOSE_TILE").as_deref() {
        Ok("16") => 16,
        Ok("32") => 32,
        Ok(v) => {
            log::warn!("KILN_TRANSPOSE_TILE={v:?}: not 16 or 32; ignored");
            default
        }
        Err(_) => default,
    }
}

/// `CompileOptions::tall_tiles_from` on this machine: `KILN_TALL_TILES`
/// (a count of workgroups, or `off`) overrides the default, so that one
/// run of `scripts/gpu-bench.sh` can time both tile shapes.
fn tall_tiles_from(default: usize) -> usize {
    match std::env::var("KILN_TALL_TILES") {
        Ok(v) if v == "off" => usize::MAX,
        Ok(v) => v.parse().unwrap_or_else(|_| {
            log::warn!("KILN_TALL_TILES={v:?}: not a count of workgroups or `off`; ignored");
            default
        }),
        Err(_) => default,
    }
}
