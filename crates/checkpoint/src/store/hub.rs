//! The Hugging Face hub: any model repository `org/name[@revision]`
//! downloaded into (or found in) the standard Hugging Face cache.
//!
//! Contract: [`Hub::snapshot`] returns a snapshot directory in Hugging Face
//! layout (`config.json`, tokenizer files, `generation_config.json` when the
//! repo has one, and `model.safetensors` or `model.safetensors.index.json`
//! with every shard it names). The cache is the one `huggingface_hub`
//! (Python) uses and shares with it: `$HF_HUB_CACHE`, else `$HF_HOME/hub`,
//! else `~/.cache/huggingface/hub`; in it `models--org--name/` holds
//! `blobs/<etag>` (the contents), `snapshots/<commit>/<file>` (relative
//! symlinks into `blobs`) and `refs/<revision>` (the commit). A snapshot
//! that already holds every needed file is used without any request; files
//! already in `blobs` are linked, not fetched again. The hub is
//! `$HF_ENDPOINT` (default `https://huggingface.co`): the file list comes
//! from `GET /api/models/{repo}/revision/{rev}`, each file from
//! `/{repo}/resolve/{commit}/{file}` (a `HEAD` for its ETag and size, then a
//! `GET`). `config.json` is fetched and validated first, so an unsupported
//! architecture is refused before gigabytes are downloaded. A download
//! lands in `blobs/<etag>.incomplete` and is renamed when complete; an
//! interrupted one (dropped connection, Ctrl-C, a crash) resumes from its
//! length with an HTTP `Range` request, within the run (a few retries) and
//! in a later run, also one started by `huggingface_hub`. A download of the
//! same blob by another process is kept apart by the lock file
//! `.locks/models--org--name/<etag>.lock` (the one `huggingface_hub` takes).
//! The token (`$HF_TOKEN`, else the file `huggingface-cli login` writes) is
//! sent only when there is one; a 401 or 403 becomes one line saying why
//! (no token, a rejected token, a gated repo whose licence is not
//! accepted). `HF_HUB_OFFLINE=1` uses the cache only.
//!
//! Layout: this file holds the repo id, the environment and the snapshot
//! logic; `hub/client.rs` the requests and downloads.
//!
//! Costs: one listing request and two requests per file missing from the
//! cache; downloads stream to disk (64 KiB buffer), never held in memory.

mod client;

use std::path::{Path, PathBuf};

use super::{StoreError, io_err};
use client::Client;

const DEFAULT_ENDPOINT: &str = "https://huggingface.co";
const INDEX_FILE: &str = "model.safetensors.index.json";
const SINGLE_FILE: &str = "model.safetensors";
/// Fetched when the repo has them.
const OPTIONAL_FILES: [&str; 3] = [
    "generation_config.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
];

/// A repo id with its revision (`main` unless `org/name@rev` says otherwise).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoRef {
    pub repo: String,
    pub revision: String,
}

impl RepoRef {
    /// `org/name` or `org/name@revision` with plain characters, else `None`.
    pub fn parse(s: &str) -> Option<RepoRef> {
        let (repo, revision) = match s.split_once('@') {
            Some((r, rev)) if !rev.is_empty() && !rev.contains("..") => (r, rev),
            Some(_) => return None,
            None => (s, "main"),
        };
        let plain = |p: &str| {
            !p.is_empty()
                && !p.starts_with('.')
                && !p.ends_with(".gguf")
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        };
        let (org, name) = repo.split_once('/')?;
        (plain(org) && plain(name)).then(|| RepoRef {
            repo: repo.to_string(),
            revision: revision.to_string(),
        })
    }

    /// `org/name`, or `org/name@rev` when the revision is not `main`.
    pub fn display(&self) -> String {
        if self.revision == "main" {
            self.repo.clone()
        } else {
            format!("{}@{}", self.repo, self.revision)
        }
    }
}

/// The hub endpoint, the cache and the token to send.
#[derive(Debug, Clone)]
pub struct Hub {
    pub endpoint: String,
    pub cache: PathBuf,
    token: Option<String>,
    pub offline: bool,
}

fn env(key: &str) -> Option<String> {
    std::env::var(key).ok().filter(|v| !v.trim().is_empty())
}

/// `$HF_HOME`, else `~/.cache/huggingface`.
fn hf_home() -> PathBuf {
    env("HF_HOME").map(PathBuf::from).unwrap_or_else(|| {
        std::env::home_dir()
            .unwrap_or_else(|| PathBuf::from("."))
            .join(".cache")
            .join("huggingface")
    })
}

impl Hub {
    /// The hub as the environment configures it (see the module doc).
    pub fn from_env() -> Hub {
        let cache = env("HF_HUB_CACHE")
            .map(PathBuf::from)
            .unwrap_or_else(|| hf_home().join("hub"));
        let token = env("HF_TOKEN")
            .or_else(|| env("HUGGING_FACE_HUB_TOKEN"))
            .or_else(|| {
                let path = env("HF_TOKEN_PATH")
                    .map(PathBuf::from)
                    .unwrap_or_else(|| hf_home().join("token"));
                std::fs::read_to_string(path)
                    .ok()
                    .filter(|t| !t.trim().is_empty())
            })
            .map(|t| t.trim().to_string());
        let offline = env("HF_HUB_OFFLINE").is_some_and(|v| !matches!(v.as_str(), "0" | "false"));
        Hub {
            endpoint: env("HF_ENDPOINT")
                .unwrap_or_else(|| DEFAULT_ENDPOINT.into())
                .trim_end_matches('/')
                .to_string(),
            cache,
            token,
            offline,
        }
    }

    /// A hub at `endpoint` with the cache `cache` and `token` (tests; the
    /// commands use [`Hub::from_env`]).
    pub fn new(endpoint: &str, cache: PathBuf, token: Option<String>) -> Hub {
        Hub {
            endpoint: endpoint.trim_end_matches('/').to_string(),
            cache,
            token,
            offline: false,
        }
    }

    /// Whether a token will be sent.
    pub fn has_token(&self) -> bool {
        self.token.is_some()
    }

    /// `models--org--name` in the cache.
    pub fn repo_dir(&self, repo: &str) -> PathBuf {
        self.cache
            .join(format!("models--{}", repo.replace('/', "--")))
    }

    /// The cached snapshot of `r` when it holds every file a model needs.
    pub fn cached(&self, r: &RepoRef) -> Option<PathBuf> {
        let dir = self.repo_dir(&r.repo);
        let commit = if is_commit(&r.revision) {
            r.revision.clone()
        } else {
            std::fs::read_to_string(dir.join("refs").join(&r.revision)).ok()?
        };
        let snap = dir.join("snapshots").join(commit.trim());
        complete(&snap).then_some(snap)
    }

    /// The complete models in the cache, one per ref (`org/name` for
    /// `main`, `org/name@ref` for others), sorted, with their snapshot
    /// directories and sizes (for `lamina list`).
    pub fn cached_models(&self) -> Vec<super::StoredModel> {
        let mut out = Vec::new();
        let Ok(entries) = std::fs::read_dir(&self.cache) else {
            return out;
        };
        for e in entries.filter_map(|e| e.ok()) {
            let dir_name = e.file_name().to_string_lossy().into_owned();
            let Some(repo) = dir_name
                .strip_prefix("models--")
                .and_then(|r| r.split_once("--"))
                .map(|(org, name)| format!("{org}/{name}"))
            else {
                continue;
            };
            let Ok(refs) = std::fs::read_dir(e.path().join("refs")) else {
                continue;
            };
            for r in refs.filter_map(|r| r.ok()) {
                let rr = RepoRef {
                    repo: repo.clone(),
                    revision: r.file_name().to_string_lossy().into_owned(),
                };
                let Some(snap) = self.cached(&rr) else {
                    continue;
                };
                let id = rr.display();
                // sizes of the blobs the snapshot's links point at
                let size_bytes = std::fs::read_dir(&snap)
                    .map(|files| {
                        files
                            .filter_map(|f| std::fs::metadata(f.ok()?.path()).ok())
                            .filter(|m| m.is_file())
                            .map(|m| m.len())
                            .sum()
                    })
                    .unwrap_or(0);
                out.push(super::StoredModel {
                    id,
                    size_bytes,
                    source: "Hugging Face cache".into(),
                    path: snap,
                });
            }
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }

    /// The snapshot of `r`, downloading what the cache lacks (module doc).
    pub fn snapshot(&self, r: &RepoRef) -> Result<PathBuf, StoreError> {
        if let Some(snap) = self.cached(r) {
            return Ok(snap);
        }
        if self.offline {
            return Err(StoreError::Hub {
                repo: r.display(),
                reason: format!(
                    "HF_HUB_OFFLINE is set and the cache at {} does not hold a complete copy",
                    self.repo_dir(&r.repo).display()
                ),
            });
        }
        let client = Client::new(self, r);
        let (commit, files) = client.list()?;
        let has = |f: &str| files.iter().any(|x| x == f);
        let missing = |what: &str| StoreError::Hub {
            repo: r.display(),
            reason: what.to_string(),
        };
        if !has("config.json") {
            return Err(missing(
                "no config.json: not a transformers model repository",
            ));
        }
        if !has(tokenizer::TOKENIZER_FILE) {
            return Err(missing(
                "no tokenizer.json (lamina reads the fast-tokenizer file; a repo with only tokenizer.model is not supported)",
            ));
        }
        let single = has(SINGLE_FILE);
        if !single && !has(INDEX_FILE) {
            let ggufs: Vec<&String> = files.iter().filter(|f| f.ends_with(".gguf")).collect();
            let hint = match ggufs.first() {
                Some(g) => format!(
                    "; it has GGUF files ({g}, ...): download one and pass its path to --model"
                ),
                None => String::new(),
            };
            return Err(missing(&format!(
                "no safetensors weights ({SINGLE_FILE} or {INDEX_FILE}){hint}"
            )));
        }
        let snap = self.repo_dir(&r.repo).join("snapshots").join(&commit);
        let config = client.file(&commit, "config.json")?;
        contract::config::ModelConfig::from_file(&config)?;
        for f in OPTIONAL_FILES.iter().filter(|f| has(f)) {
            client.file(&commit, f)?;
        }
        client.file(&commit, tokenizer::TOKENIZER_FILE)?;
        let shards = if single {
            vec![SINGLE_FILE.to_string()]
        } else {
            let index = client.file(&commit, INDEX_FILE)?;
            shard_names(&index).map_err(|reason| missing(&reason))?
        };
        for shard in &shards {
            client.file(&commit, shard)?;
        }
        if !is_commit(&r.revision) {
            let refs = self.repo_dir(&r.repo).join("refs");
            std::fs::create_dir_all(&refs).map_err(io_err("cannot create", &refs))?;
            let path = refs.join(&r.revision);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(io_err("cannot create", parent))?;
            }
            std::fs::write(&path, &commit).map_err(io_err("cannot write", &path))?;
        }
        Ok(snap)
    }
}

fn is_commit(rev: &str) -> bool {
    rev.len() == 40 && rev.chars().all(|c| c.is_ascii_hexdigit())
}

/// The shard file names an index's `weight_map` names (sorted, distinct).
fn shard_names(index: &Path) -> Result<Vec<String>, String> {
    #[derive(serde::Deserialize)]
    struct Index {
        weight_map: std::collections::BTreeMap<String, String>,
    }
    let text = std::fs::read_to_string(index).map_err(|e| format!("{INDEX_FILE}: {e}"))?;
    let index: Index =
        serde_json::from_str(&text).map_err(|e| format!("malformed {INDEX_FILE}: {e}"))?;
    let mut files: Vec<String> = index.weight_map.into_values().collect();
    files.sort();
    files.dedup();
    if files.is_empty() {
        return Err(format!("{INDEX_FILE}: weight_map is empty"));
    }
    if let Some(bad) = files
        .iter()
        .find(|f| Path::new(f).components().count() != 1 || f.starts_with('.'))
    {
        return Err(format!(
            "{INDEX_FILE}: shard `{bad}` is not a plain file name"
        ));
    }
    Ok(files)
}

/// Whether snapshot `dir` holds config, tokenizer and all weights.
fn complete(dir: &Path) -> bool {
    if !dir.join("config.json").is_file() || !dir.join(tokenizer::TOKENIZER_FILE).is_file() {
        return false;
    }
    let index = dir.join(INDEX_FILE);
    if index.is_file() {
        return shard_names(&index).is_ok_and(|s| s.iter().all(|f| dir.join(f).is_file()));
    }
    dir.join(SINGLE_FILE).is_file()
}
