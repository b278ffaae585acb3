//! Managing the store's models: listing ([`Store::list`]), removal
//! ([`Store::remove`]), import of a `.gguf` file by path
//! ([`Store::import_gguf`]), the `lamina.json` that names a model's source,
//! and the sampling values written into a known model's
//! `generation_config.json`.
//!
//! Contract: ids are single path components (no separator, not hidden), so
//! `remove` can only ever delete `models/<id>`. A GGUF file is imported under
//! its lower-cased stem; the same file (path and size) given again reuses the
//! import, a different model under that id is an error naming it. The
//! import keeps the file's blocks in the store (`model.gguf`, a hard link
//! where the file system allows, else a copy), so moving or deleting the
//! source changes nothing; `lamina.json` records the kept file's size and
//! modification time, and a kept (or, for older imports, external) GGUF
//! that is gone or changed is refused naming how to import it again
//! ([`StoreError::GgufChanged`]), never silently run from BF16. An import
//! whose GGUF says it is a known model (`general.basename` and
//! `general.size_label`) gets that model's [`recommended_sampling`] when
//! its own metadata sets none.
//!
//! Costs: `list` sums the file sizes of each model directory; the GGUF import
//! is [`crate::gguf::import_to_dir`] (one tensor at a time).

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::{Store, StoreError, io_err};
use crate::gguf::{Gguf, TokenizerFiles, import_with_tokenizer};
use crate::progress::{Progress, Unit};

/// The file naming a stored model's source.
const META: &str = "lamina.json";

/// One model in the store, as `lamina list` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredModel {
    pub id: String,
    pub size_bytes: u64,
    /// Where it came from (`lamina.json`, or the known id's source).
    pub source: String,
    pub path: PathBuf,
}

/// Sampling values a known model's authors recommend: written into its
/// `generation_config.json` when the file it is converted from carries none.
/// SmolLM2's model card recommends temperature 0.2 and top-p 0.9; Gemma 3
/// ships temperature 1, top-k 64, top-p 0.95.
pub fn recommended_sampling(id: &str) -> Option<&'static [(&'static str, f64)]> {
    match id {
        "smollm2-135m-instruct" => Some(&[("temperature", 0.2), ("top_p", 0.9)]),
        // Gemma 3's generation_config.json
        "gemma-3-270m" => Some(&[("temperature", 1.0), ("top_k", 64.0), ("top_p", 0.95)]),
        _ => None,
    }
}

/// The known id a GGUF's `general.basename` and `general.size_label` name
/// (matched without case), for its [`recommended_sampling`].
pub fn known_id_of_gguf(basename: &str, size_label: &str) -> Option<&'static str> {
    const BY_NAME: [(&str, &str, &str); 1] = [("smollm2", "135m", "smollm2-135m-instruct")];
    BY_NAME
        .iter()
        .find(|(b, s, _)| basename.eq_ignore_ascii_case(b) && size_label.eq_ignore_ascii_case(s))
        .map(|(_, _, id)| *id)
}

/// The name of the GGUF an import keeps in its model directory.
const KEPT_GGUF: &str = "model.gguf";

/// Puts `src` at `dst`: a hard link where the file system allows, else a copy.
fn keep_file(src: &Path, dst: &Path) -> Result<(), StoreError> {
    if std::fs::hard_link(src, dst).is_ok() {
        return Ok(());
    }
    std::fs::copy(src, dst)
        .map(|_| ())
        .map_err(io_err("cannot copy the GGUF into the store at", dst))
}

/// A file's size and modification time (nanoseconds since the epoch).
fn identity(path: &Path) -> Option<(u64, u64)> {
    let m = std::fs::metadata(path).ok()?;
    let mtime = m
        .modified()
        .ok()?
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?;
    Some((m.len(), mtime.as_nanos() as u64))
}

const SAMPLING_KEYS: [&str; 4] = ["temperature", "top_p", "top_k", "min_p"];

/// Merges [`recommended_sampling`] for `id` into `dir/generation_config.json`
/// unless that file already sets a sampling value.
pub(super) fn write_recommended_sampling(dir: &Path, id: &str) -> Result<(), StoreError> {
    let Some(values) = recommended_sampling(id) else {
        return Ok(());
    };
    let path = dir.join("generation_config.json");
    let mut doc: Value = match std::fs::read_to_string(&path) {
        Ok(text) => serde_json::from_str(&text).unwrap_or_else(|_| json!({})),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => json!({}),
        Err(e) => return Err(io_err("cannot read", &path)(e)),
    };
    let Some(obj) = doc.as_object_mut() else {
        return Ok(());
    };
    if SAMPLING_KEYS.iter().any(|k| obj.contains_key(*k)) {
        return Ok(());
    }
    for (k, v) in values {
        // a whole number as an integer (`top_k` is one)
        let v = match v.fract() == 0.0 {
            true => json!(*v as i64),
            false => json!(v),
        };
        obj.insert((*k).to_string(), v);
    }
    // written aside and renamed: a reader never sees half a file
    let tmp = dir.join(format!(".generation_config.json.{}", std::process::id()));
    std::fs::write(&tmp, format!("{doc:#}\n")).map_err(io_err("cannot write", &tmp))?;
    std::fs::rename(&tmp, &path).map_err(io_err("cannot rename into", &path))
}

/// Brings a model fetched by an older lamina up to date (the recommended
/// sampling values); a store that cannot be written is left as it is.
pub(super) fn upgrade_sampling(dir: &Path, id: &str) {
    if let Err(e) = write_recommended_sampling(dir, id) {
        tracing::warn!("cannot add the recommended sampling values to {id}: {e}");
    }
}

/// Writes `lamina.json` naming the model's source (and the GGUF file it
/// was imported from, if any).
pub(super) fn write_source(
    dir: &Path,
    source: &str,
    gguf: Option<&Path>,
) -> Result<(), StoreError> {
    let mut doc = json!({ "source": source });
    if let Some(g) = gguf {
        doc["gguf"] = json!(g.to_string_lossy());
    }
    write_meta(dir, &doc)
}

/// The GGUF `lamina.json` names (relative names are in `dir`): `Ok(None)`
/// when it names none, or names a file that is gone and `rebuildable` (a
/// known model whose download is extracted again); an error when the file
/// is gone or its size or modification time differ from the import's.
pub(super) fn meta_gguf(dir: &Path, rebuildable: bool) -> Result<Option<PathBuf>, StoreError> {
    let Some(meta) = read_meta(dir) else {
        return Ok(None);
    };
    let Some(name) = meta["gguf"].as_str() else {
        return Ok(None);
    };
    let p = dir.join(name);
    let changed = |why: String| StoreError::GgufChanged {
        id: dir
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
        gguf: p.clone(),
        why,
    };
    let Some((size, mtime)) = identity(&p) else {
        if rebuildable {
            return Ok(None);
        }
        return Err(changed("is gone (moved or deleted)".into()));
    };
    if let Some(want) = meta["gguf_size"].as_u64().filter(|&w| w != size) {
        return Err(changed(format!(
            "has changed since the import ({size} bytes, {want} then)"
        )));
    }
    if meta["gguf_mtime_ns"].as_u64().is_some_and(|w| w != mtime) {
        return Err(changed("was modified after the import".into()));
    }
    Ok(Some(p))
}

fn write_meta(dir: &Path, doc: &Value) -> Result<(), StoreError> {
    let path = dir.join(META);
    std::fs::write(&path, format!("{doc:#}\n")).map_err(io_err("cannot write", &path))
}

fn read_meta(dir: &Path) -> Option<Value> {
    let text = std::fs::read_to_string(dir.join(META)).ok()?;
    serde_json::from_str(&text).ok()
}

/// A valid store id: one non-hidden path component.
pub(super) fn check_id(id: &str) -> Result<(), StoreError> {
    let bad = |reason: &str| {
        Err(StoreError::BadId {
            id: id.to_string(),
            reason: reason.to_string(),
        })
    };
    if id.is_empty() {
        return bad("it is empty");
    }
    if id.contains('/') || id.contains('\\') || id.contains(std::path::MAIN_SEPARATOR) {
        return bad("a store id has no path separator");
    }
    if id.starts_with('.') {
        return bad("a store id does not start with `.`");
    }
    Ok(())
}

/// A `.gguf` name or a file that starts with the GGUF magic.
pub(super) fn is_gguf(path: &Path) -> bool {
    if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
    {
        return true;
    }
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
        .is_ok_and(|()| &magic == b"GGUF")
}

/// The store id of a GGUF file: its stem, lower-cased, other characters as `-`.
pub fn gguf_id(path: &Path) -> String {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().to_lowercase())
        .unwrap_or_default();
    let id: String = stem
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '-'
            }
        })
        .collect();
    let id = id.trim_start_matches('.').to_string();
    if id.is_empty() {
        "gguf-model".into()
    } else {
        id
    }
}

/// "Q4_1 x 90, F32 x 30" style summary of the tensor types.
fn type_summary(g: &Gguf) -> String {
    let mut counts: Vec<(String, usize)> = Vec::new();
    for t in &g.tensors {
        let name = t.ty.name();
        match counts.iter_mut().find(|(n, _)| *n == name) {
            Some((_, c)) => *c += 1,
            None => counts.push((name, 1)),
        }
    }
    counts.sort_by_key(|c| std::cmp::Reverse(c.1));
    counts
        .iter()
        .map(|(n, c)| format!("{n} x{c}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What an import learnt of the GGUF: its tensor types, and the known id
/// its metadata names, if any.
pub(super) struct Imported {
    pub types: String,
    pub known_id: Option<&'static str>,
}

/// Parses the GGUF at `path` and imports it into `dir` with a progress bar.
pub(super) fn import_gguf_file(path: &Path, dir: &Path) -> Result<Imported, StoreError> {
    import_gguf_file_with(path, dir, None)
}

/// [`import_gguf_file`] with the model's own tokenizer files, when given.
pub(super) fn import_gguf_file_with(
    path: &Path,
    dir: &Path,
    tokenizer: Option<&TokenizerFiles>,
) -> Result<Imported, StoreError> {
    let file = std::fs::File::open(path).map_err(io_err("cannot open", path))?;
    // SAFETY: read-only private map; the import reads it once, and a file
    // changed underneath gives wrong weights or a parse error, never UB in
    // safe code that only indexes through bounds-checked slices.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io_err("cannot map", path))?;
    let import = |source| StoreError::Import {
        path: path.to_path_buf(),
        source,
    };
    let gguf = Gguf::parse(&map, &path.display().to_string()).map_err(import)?;
    let progress = Progress::new(
        format!("converting {} to BF16", path.display()),
        Unit::Items("tensors"),
        gguf.tensors.len() as u64,
        0,
    );
    import_with_tokenizer(&gguf, &map, dir, Some(&progress), tokenizer).map_err(import)?;
    progress.finish();
    let known_id = match (
        gguf.get_str("general.basename"),
        gguf.get_str("general.size_label"),
    ) {
        (Ok(b), Ok(s)) => known_id_of_gguf(b, s),
        _ => None,
    };
    Ok(Imported {
        types: type_summary(&gguf),
        known_id,
    })
}

impl Store {
    /// Imports the GGUF file at `path` into the store (once) under
    /// [`gguf_id`]; returns the id and the model directory.
    pub fn import_gguf(&self, path: &Path) -> Result<(String, PathBuf), StoreError> {
        let real = std::fs::canonicalize(path).map_err(io_err("cannot open", path))?;
        let size = std::fs::metadata(&real)
            .map_err(io_err("cannot read", &real))?
            .len();
        let id = gguf_id(&real);
        let dir = self.model_dir(&id);
        if dir.is_dir() {
            let meta = read_meta(&dir).unwrap_or(Value::Null);
            // older imports named the source itself in `gguf`
            let source = meta["gguf_source"].as_str().or(meta["gguf"].as_str());
            let same = source == Some(&*real.to_string_lossy())
                && meta["gguf_size"].as_u64() == Some(size);
            if same {
                return Ok((id, dir));
            }
            return Err(StoreError::IdTaken {
                source_desc: describe_source(&id, &dir),
                id,
            });
        }
        eprintln!("lamina: importing {} as `{id}`", real.display());
        let dir = self.build(&id, |tmp| {
            let imported = import_gguf_file(&real, tmp)?;
            let kept = tmp.join(KEPT_GGUF);
            keep_file(&real, &kept)?;
            let (kept_size, mtime) = identity(&kept).unwrap_or((size, 0));
            if let Some(known) = imported.known_id {
                write_recommended_sampling(tmp, known)?;
            }
            write_meta(
                tmp,
                &json!({
                    "source": format!(
                        "GGUF {} ({}), converted to BF16, its blocks kept in the store",
                        real.display(),
                        imported.types
                    ),
                    "gguf": KEPT_GGUF,
                    "gguf_source": real.to_string_lossy(),
                    "gguf_size": kept_size,
                    "gguf_mtime_ns": mtime,
                }),
            )
        })?;
        Ok((id, dir))
    }

    /// The models in the store, sorted by id (temporary build directories
    /// and stray files left out).
    pub fn list(&self) -> Result<Vec<StoredModel>, StoreError> {
        let models = self.root.join("models");
        let entries = match std::fs::read_dir(&models) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_err("cannot read", &models)(e)),
        };
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry.map_err(io_err("cannot read", &models))?;
            let id = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            if id.starts_with('.') || !path.is_dir() {
                continue;
            }
            out.push(StoredModel {
                size_bytes: self.disk_bytes(&id),
                source: describe_source(&id, &path),
                id,
                path,
            });
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    /// The id of the stored model `name` names: the directory of that
    /// name, else of the known id it is an alias of, else the one whose
    /// name matches without case; `None` when the store holds none.
    pub fn stored_id(&self, name: &str) -> Option<String> {
        check_id(name).ok()?;
        if self.model_dir(name).is_dir() {
            return Some(name.to_string());
        }
        if let Some(id) = super::canonical_id(name)
            && self.model_dir(id).is_dir()
        {
            return Some(id.to_string());
        }
        let entries = std::fs::read_dir(self.root.join("models")).ok()?;
        entries
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .find(|id| !id.starts_with('.') && id.eq_ignore_ascii_case(name))
            .filter(|id| self.model_dir(id).is_dir())
    }

    /// The files of the download cache that only model `id` uses: a known
    /// PyPI model's wheel and the GGUF extracted from it.
    pub fn downloads_of(&self, id: &str) -> Vec<PathBuf> {
        let Some(super::Source::PypiGguf { spec }) = super::source_of(id) else {
            return Vec::new();
        };
        let downloads = self.downloads_dir();
        let mut out = Vec::new();
        if let Some(wheel) =
            super::fetch::wheel_prefix(spec).and_then(|p| super::fetch::find_wheel(&downloads, &p))
        {
            if let Some(gguf) = super::fetch::gguf_in_wheel(&downloads, &wheel) {
                out.push(gguf);
            }
            out.push(wheel);
        }
        out
    }

    /// Bytes model `id` takes on disk: the files of its directory (all
    /// levels) and its [`Store::downloads_of`].
    pub fn disk_bytes(&self, id: &str) -> u64 {
        let own = dir_size(&self.model_dir(id));
        let downloads: u64 = self
            .downloads_of(id)
            .iter()
            .filter_map(|p| std::fs::metadata(p).ok())
            .map(|m| m.len())
            .sum();
        own + downloads
    }

    /// Deletes `models/<id>` (`id` as [`Store::stored_id`] finds it) and
    /// its [`Store::downloads_of`]; returns the id, the directory removed
    /// and the bytes freed.
    pub fn remove(&self, name: &str) -> Result<Removed, StoreError> {
        check_id(name)?;
        let Some(id) = self.stored_id(name) else {
            return Err(self.not_stored(name));
        };
        let dir = self.model_dir(&id);
        let mut freed = freed_bytes(&dir);
        std::fs::remove_dir_all(&dir).map_err(io_err("cannot remove", &dir))?;
        for file in self.downloads_of(&id) {
            let bytes = std::fs::metadata(&file).map_or(0, |m| m.len());
            std::fs::remove_file(&file).map_err(io_err("cannot remove", &file))?;
            freed += bytes;
        }
        Ok(Removed { id, dir, freed })
    }

    fn not_stored(&self, id: &str) -> StoreError {
        StoreError::BadId {
            id: id.to_string(),
            reason: format!(
                "not in the store at {} (in the store: {}); `lamina list` shows the store",
                self.root.join("models").display(),
                self.stored_ids()
            ),
        }
    }
}

fn describe_source(id: &str, dir: &Path) -> String {
    if let Some(s) = read_meta(dir).and_then(|m| m["source"].as_str().map(str::to_string)) {
        // the GGUF whose blocks it runs from, as it is now
        return match meta_gguf(dir, super::source_of(id).is_some()) {
            Err(StoreError::GgufChanged { gguf, why, .. }) => format!(
                "{s}; its GGUF {} {why}: re-import it (`lamina rm {id}`, then `lamina pull FILE.gguf`)",
                gguf.display()
            ),
            _ => s,
        };
    }
    match super::source_of(id) {
        Some(s) => s.describe(),
        None => "unknown".into(),
    }
}

/// What [`Store::remove`] removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Removed {
    pub id: String,
    pub dir: PathBuf,
    /// Bytes the removal gave back to the file system (a file hard-linked
    /// from elsewhere, like an imported GGUF, frees nothing).
    pub freed: u64,
}

/// The files under `dir` (recursively, links not followed) with their metadata.
fn files_under(dir: &Path) -> Vec<std::fs::Metadata> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.filter_map(|e| e.ok()) {
            let Ok(m) = e.path().symlink_metadata() else {
                continue;
            };
            if m.is_dir() {
                stack.push(e.path());
            } else if m.is_file() {
                out.push(m);
            }
        }
    }
    out
}

/// Bytes of the files under `dir`, as `du --apparent-size` counts them.
fn dir_size(dir: &Path) -> u64 {
    files_under(dir).iter().map(|m| m.len()).sum()
}

/// Bytes deleting `dir` frees: files no other link keeps.
fn freed_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    files_under(dir)
        .iter()
        .filter(|m| m.nlink() <= 1)
        .map(|m| m.len())
        .sum()
}
