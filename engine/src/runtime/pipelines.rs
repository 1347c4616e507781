//! What outlives one process's pipelines: the driver's pipeline cache kept
//! on disk (Vulkan: wgpu's `PipelineCache`), and the progress a command
//! line shows while a new model's pipelines compile.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// The per-user cache folder: `$KILN_CACHE`, `$XDG_CACHE_HOME/kiln` or
/// `~/.cache/kiln` (MiniLM's files live there too).
#[cfg(not(target_arch = "wasm32"))]
pub fn user_cache_dir() -> Option<PathBuf> {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
    };
    env("KILN_CACHE")
        .or_else(|| env("XDG_CACHE_HOME").map(|d| d.join("kiln")))
        .or_else(|| env("HOME").map(|d| d.join(".cache/kiln")))
}

/// A cache file larger than this is not written (wgpu cannot shrink one;
/// the next process starts a fresh one).
const MAX_CACHE_BYTES: usize = 256 << 20;

/// The driver's pipeline cache of one device, read from and written to
/// `<user cache>/pipelines/<wgpu's key for the adapter>`.
pub(crate) struct DiskCache {
    pub(crate) cache: wgpu::PipelineCache,
    path: PathBuf,
    /// Pipelines were made with it since it was last written.
    dirty: AtomicBool,
}

#[cfg_attr(target_arch = "wasm32", allow(dead_code))]
impl DiskCache {
    /// Is it wanted (`KILN_PIPELINE_CACHE=off` turns it off), and where?
    #[cfg(not(target_arch = "wasm32"))]
    pub(crate) fn path_for(info: &wgpu::AdapterInfo) -> Option<PathBuf> {
        if std::env::var("KILN_PIPELINE_CACHE").is_ok_and(|v| v == "off") {
            return None;
        }
        let key = wgpu::util::pipeline_cache_key(info)?;
        Some(user_cache_dir()?.join("pipelines").join(key))
    }

    /// The cache at `path`, seeded with what the file holds (nothing where
    /// it is missing, or written by another driver or wgpu: `fallback`).
    pub(crate) fn open(device: &wgpu::Device, path: PathBuf) -> DiskCache {
        let data = std::fs::read(&path).ok();
        // SAFETY: the data was written by `save` from `get_data` of a
        // device with the same key (the file name); wgpu checks its header
        // (wgpu version, adapter, driver) and ignores data that fails.
        let cache = unsafe {
            device.create_pipeline_cache(&wgpu::PipelineCacheDescriptor {
                label: Some("kiln pipelines"),
                data: data.as_deref(),
                fallback: true,
            })
        };
        DiskCache {
            cache,
            path,
            dirty: AtomicBool::new(false),
        }
    }

    pub(crate) fn touched(&self) {
        self.dirty.store(true, Ordering::Relaxed);
    }

    /// Writes the cache if pipelines were made since the last write:
    /// through a file of this process's own, renamed over the old one, so
    /// that processes writing at once leave one whole file. A cache that
    /// cannot be written is only slower next time: logged, not an error.
    pub(crate) fn save(&self) {
        if !self.dirty.swap(false, Ordering::Relaxed) {
            return;
        }
        let Some(data) = self.cache.get_data() else {
            return;
        };
        if data.len() > MAX_CACHE_BYTES {
            log::warn!(
                "pipeline cache {} would hold {} bytes; not written",
                self.path.display(),
                data.len()
            );
            return;
        }
        let tmp = self
            .path
            .with_extension(format!("{}.tmp", std::process::id()));
        let written = self
            .path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::write(&tmp, &data))
            .and_then(|()| std::fs::rename(&tmp, &self.path));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            log::warn!(
                "cannot write the pipeline cache {}: {e}",
                self.path.display()
            );
        }
    }
}

/// What is told of pipelines compiling: `(made, of)` after each one.
pub type Progress = dyn Fn(usize, usize) + Send + Sync;

static PROGRESS: OnceLock<Box<Progress>> = OnceLock::new();

/// Calls `f(made, of)` after each pipeline a load or compile makes, in
/// every session of the process (once; later calls are ignored).
pub fn report_pipeline_progress(f: Box<Progress>) {
    let _ = PROGRESS.set(f);
}

pub(crate) fn progress(made: usize, of: usize) {
    if let Some(f) = PROGRESS.get() {
        f(made, of);
    }
}

/// Where standard error is a terminal, shows `compiling N kernels: K`
/// on one line while a new program's pipelines compile (lavapipe takes
/// minutes for a model's first run; the driver's caches make later runs
/// quick). Binaries call it at start.
#[cfg(not(target_arch = "wasm32"))]
pub fn show_pipeline_progress_on_terminal() {
    use std::io::{IsTerminal, Write};
    if !std::io::stderr().is_terminal() {
        return;
    }
    // A handful of pipelines compile before anyone could read a line.
    const SHOWN_FROM: usize = 8;
    report_pipeline_progress(Box::new(|made, of| {
        if of < SHOWN_FROM {
            return;
        }
        let mut e = std::io::stderr().lock();
        let _ = if made < of {
            write!(e, "\rcompiling {of} kernels: {made} done")
        } else {
            writeln!(e, "\rcompiling {of} kernels: {made} done")
        };
        let _ = e.flush();
    }));
}
