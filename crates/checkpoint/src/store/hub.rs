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
//! Costs: one listing request and two requests per file missing from the
//! cache; downloads stream to disk (64 KiB buffer), never held in memory.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{StoreError, io_err};
use crate::progress::{Progress, Unit};

const DEFAULT_ENDPOINT: &str = "https://huggingface.co";
const INDEX_FILE: &str = "model.safetensors.index.json";
const SINGLE_FILE: &str = "model.safetensors";
/// Fetched when the repo has them.
const OPTIONAL_FILES: [&str; 3] = [
    "generation_config.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
];
/// Resumptions of one file within a run before giving up.
const RETRIES: usize = 5;

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
        contract::config::LlamaConfig::from_file(&config)?;
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

/// Requests for one repo.
struct Client<'a> {
    hub: &'a Hub,
    r: &'a RepoRef,
    /// Follows redirects (downloads may go to a CDN).
    agent: ureq::Agent,
    /// Does not: the hub's own headers (ETag, size) are on the redirect.
    head_agent: ureq::Agent,
}

/// One `HEAD` answer: the blob name and size of a file.
struct FileMeta {
    etag: String,
    size: Option<u64>,
}

impl<'a> Client<'a> {
    fn new(hub: &'a Hub, r: &'a RepoRef) -> Self {
        // HTTPS_PROXY / ALL_PROXY as other clients do; a local endpoint never
        // goes through a proxy (ureq 2 does not read NO_PROXY)
        let host = hub.endpoint.split("://").nth(1).unwrap_or("");
        let local = ["localhost", "127.", "[::1]"]
            .iter()
            .any(|h| host.starts_with(h));
        let builder = || {
            ureq::AgentBuilder::new()
                .try_proxy_from_env(!local)
                .timeout_connect(Duration::from_secs(30))
                .timeout_read(Duration::from_secs(60))
                .user_agent(concat!("lamina/", env!("CARGO_PKG_VERSION")))
        };
        Client {
            hub,
            r,
            agent: builder().build(),
            head_agent: builder().redirects(0).build(),
        }
    }

    fn auth(&self, req: ureq::Request) -> ureq::Request {
        match &self.hub.token {
            Some(t) => req.set("Authorization", &format!("Bearer {t}")),
            None => req,
        }
    }

    /// The error for a failed request about `file` (`None`: the listing).
    fn error(&self, file: Option<&str>, e: ureq::Error) -> StoreError {
        let repo = self.r.display();
        match e {
            ureq::Error::Status(status, resp) => {
                let code = resp.header("X-Error-Code").unwrap_or("").to_string();
                let page = format!("{}/{}", self.hub.endpoint, self.r.repo);
                let reason = match (status, self.hub.has_token()) {
                    (401, false) => format!(
                        "the repo is gated or private (or does not exist) and no token is set: set HF_TOKEN to a read token from {}/settings/tokens",
                        self.hub.endpoint
                    ),
                    (401, true) => "HF_TOKEN was rejected: it is invalid or expired (or the repo is private or does not exist)".to_string(),
                    (403, _) if code == "GatedRepo" || code.is_empty() => format!(
                        "the repo is gated and the licence is not accepted for this token's account: accept it at {page} (a fine-grained token also needs read access to public gated repos)"
                    ),
                    (403, _) => format!("access denied ({code})"),
                    (404, _) => match (code.as_str(), file) {
                        ("RevisionNotFound", _) => {
                            format!("no revision `{}` in the repo", self.r.revision)
                        }
                        (_, Some(f)) if code != "RepoNotFound" => format!("no file `{f}` in the repo"),
                        _ => format!("no such repo on {}", self.hub.endpoint),
                    },
                    _ => format!("the hub answered {status} {}", resp.status_text()),
                };
                StoreError::HubRefused {
                    repo,
                    status,
                    reason,
                }
            }
            ureq::Error::Transport(t) => StoreError::Hub {
                repo,
                reason: format!(
                    "{}cannot reach {}: {t}",
                    file.map(|f| format!("{f}: ")).unwrap_or_default(),
                    self.hub.endpoint
                ),
            },
        }
    }

    /// The commit of the revision and the repo's file names.
    fn list(&self) -> Result<(String, Vec<String>), StoreError> {
        #[derive(serde::Deserialize)]
        struct Sibling {
            rfilename: String,
        }
        #[derive(serde::Deserialize)]
        struct Info {
            sha: String,
            siblings: Vec<Sibling>,
        }
        let url = format!(
            "{}/api/models/{}/revision/{}",
            self.hub.endpoint,
            self.r.repo,
            self.r.revision.replace('/', "%2F")
        );
        let resp = self
            .auth(self.agent.get(&url))
            .call()
            .map_err(|e| self.error(None, e))?;
        let info: Info = resp.into_json().map_err(|e| StoreError::Hub {
            repo: self.r.display(),
            reason: format!("malformed answer from {url}: {e}"),
        })?;
        if !is_commit(&info.sha) {
            return Err(StoreError::Hub {
                repo: self.r.display(),
                reason: format!("the hub named commit `{}`, not a 40-digit hash", info.sha),
            });
        }
        Ok((
            info.sha,
            info.siblings.into_iter().map(|s| s.rfilename).collect(),
        ))
    }

    fn url(&self, commit: &str, file: &str) -> String {
        format!(
            "{}/{}/resolve/{commit}/{file}",
            self.hub.endpoint, self.r.repo
        )
    }

    /// `HEAD` of a file: its ETag (`X-Linked-Etag` for LFS files) and size.
    fn head(&self, commit: &str, file: &str) -> Result<FileMeta, StoreError> {
        let mut url = self.url(commit, file);
        let mut resp = None;
        // the hub redirects renamed repos relatively; a CDN redirect is absolute
        for _ in 0..5 {
            let r = self
                .auth(self.head_agent.head(&url))
                .call()
                .map_err(|e| self.error(Some(file), e))?;
            match r.header("Location") {
                Some(loc) if (300..400).contains(&r.status()) && loc.starts_with('/') => {
                    url = format!("{}{loc}", self.hub.endpoint);
                }
                _ => {
                    resp = Some(r);
                    break;
                }
            }
        }
        let bad = |reason: String| StoreError::Hub {
            repo: self.r.display(),
            reason: format!("{file}: {reason}"),
        };
        let resp = resp.ok_or_else(|| bad("too many redirects".into()))?;
        let etag = resp
            .header("X-Linked-Etag")
            .or_else(|| resp.header("ETag"))
            .ok_or_else(|| bad("the hub sent no ETag".into()))?
            .trim_start_matches("W/")
            .trim_matches('"')
            .to_string();
        if etag.is_empty() || !etag.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            return Err(bad(format!("unusable ETag `{etag}`")));
        }
        let size = resp
            .header("X-Linked-Size")
            .or_else(|| resp.header("Content-Length"))
            .and_then(|s| s.parse().ok());
        Ok(FileMeta { etag, size })
    }

    /// The snapshot path of `file`, downloading its blob unless cached.
    fn file(&self, commit: &str, file: &str) -> Result<PathBuf, StoreError> {
        let repo_dir = self.hub.repo_dir(&self.r.repo);
        let pointer = repo_dir.join("snapshots").join(commit).join(file);
        if pointer.is_file() {
            return Ok(pointer);
        }
        let meta = self.head(commit, file)?;
        let blobs = repo_dir.join("blobs");
        std::fs::create_dir_all(&blobs).map_err(io_err("cannot create", &blobs))?;
        let blob = blobs.join(&meta.etag);
        if !blob.is_file() {
            let locks = self
                .hub
                .cache
                .join(".locks")
                .join(repo_dir.file_name().unwrap_or_default());
            std::fs::create_dir_all(&locks).map_err(io_err("cannot create", &locks))?;
            let lock_path = locks.join(format!("{}.lock", meta.etag));
            let lock =
                std::fs::File::create(&lock_path).map_err(io_err("cannot create", &lock_path))?;
            lock.lock().map_err(io_err("cannot lock", &lock_path))?;
            if !blob.is_file() {
                self.download(commit, file, &meta, &blob)?;
            }
        }
        link(&blob, &pointer, file)?;
        Ok(pointer)
    }

    /// Streams `file` into `blob` through `<blob>.incomplete`, resuming
    /// from what that file holds.
    fn download(
        &self,
        commit: &str,
        file: &str,
        meta: &FileMeta,
        blob: &Path,
    ) -> Result<(), StoreError> {
        let part = blob.with_extension("incomplete");
        let url = self.url(commit, file);
        let have = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
        let start = have(&part);
        let what = format!("downloading {}/{file}", self.r.repo);
        if start > 0 {
            eprintln!("lamina: resuming {}/{file} from byte {start}", self.r.repo);
        }
        let progress = Progress::new(&what, Unit::Bytes, meta.size.unwrap_or(0), start);
        let mut failures = 0;
        loop {
            let from = have(&part);
            if meta.size.is_some_and(|s| from == s) {
                break;
            }
            let mut req = self.auth(self.agent.get(&url));
            if from > 0 {
                req = req.set("Range", &format!("bytes={from}-"));
            }
            let outcome = match req.call() {
                Ok(resp) => {
                    // 206: the rest; 200: the whole file (no range support)
                    let append = from > 0 && resp.status() == 206;
                    progress.set(if append { from } else { 0 });
                    copy_into(resp.into_reader(), &part, append, &progress)
                }
                Err(ureq::Error::Transport(t)) => Err(std::io::Error::other(t.to_string())),
                Err(ureq::Error::Status(416, _)) if from > 0 => {
                    // the partial file is not a prefix of this blob: start over
                    std::fs::remove_file(&part).map_err(io_err("cannot remove", &part))?;
                    continue;
                }
                Err(e) => return Err(self.error(Some(file), e)),
            };
            let got = have(&part);
            let short = meta.size.is_some_and(|s| got < s);
            match outcome {
                Ok(()) if !short => break,
                Ok(()) | Err(_) if failures < RETRIES => {
                    failures += 1;
                    let why = outcome
                        .err()
                        .map(|e| e.to_string())
                        .unwrap_or_else(|| "connection closed early".into());
                    eprintln!(
                        "lamina: {}/{file}: interrupted at byte {got} ({why}); resuming",
                        self.r.repo
                    );
                    std::thread::sleep(Duration::from_millis(200 << failures.min(5)));
                }
                Ok(()) => {
                    return Err(StoreError::Hub {
                        repo: self.r.display(),
                        reason: format!(
                            "{file}: the download stopped at byte {got} of {} {RETRIES} times",
                            meta.size.unwrap_or(0)
                        ),
                    });
                }
                Err(e) => return Err(io_err("cannot download into", &part)(e)),
            }
        }
        let got = have(&part);
        if let Some(size) = meta.size
            && got != size
        {
            return Err(StoreError::Hub {
                repo: self.r.display(),
                reason: format!("{file}: downloaded {got} bytes, the hub announced {size}"),
            });
        }
        progress.finish();
        std::fs::rename(&part, blob).map_err(io_err("cannot rename into", blob))
    }
}

/// Copies `body` into `path` (appended or from the start), counting bytes.
fn copy_into(
    mut body: impl Read,
    path: &Path,
    append: bool,
    progress: &Progress,
) -> std::io::Result<()> {
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .append(append)
        .truncate(!append)
        .open(path)?;
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match body.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                out.flush()?;
                return Err(e);
            }
        };
        out.write_all(&buf[..n])?;
        progress.inc(n as u64);
    }
    out.sync_all()
}

/// Points the snapshot entry `pointer` (repo path `file`) at `blob`: a
/// relative symlink as `huggingface_hub` makes, a copy where symlinks fail.
fn link(blob: &Path, pointer: &Path, file: &str) -> Result<(), StoreError> {
    if let Some(parent) = pointer.parent() {
        std::fs::create_dir_all(parent).map_err(io_err("cannot create", parent))?;
    }
    let _ = std::fs::remove_file(pointer);
    // snapshots/<commit>/<file> -> ../../blobs/<etag>, one more `..` per `/` in file
    let mut target = PathBuf::from("../..");
    for _ in 0..file.matches('/').count() {
        target.push("..");
    }
    target.push("blobs");
    target.push(blob.file_name().unwrap_or_default());
    #[cfg(unix)]
    if std::os::unix::fs::symlink(&target, pointer).is_ok() {
        return Ok(());
    }
    std::fs::copy(blob, pointer).map_err(io_err("cannot copy into", pointer))?;
    let _ = target;
    Ok(())
}
