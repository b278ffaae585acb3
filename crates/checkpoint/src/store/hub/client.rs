//! The requests of [`super::Hub::snapshot`]: the file listing, `HEAD` for
//! a file's ETag and size, the resumable download into
//! `blobs/<etag>.incomplete`, the snapshot symlinks, and the one-line
//! explanation of a refused request.
//!
//! Contract: see the parent module's doc (cache layout, resume, locks,
//! token). Every request carries `Authorization` only when a token is set;
//! `HEAD` does not follow redirects (the hub's `X-Linked-*` headers are on
//! the redirect itself), downloads do (to the CDN; ureq drops the
//! `Authorization` header on a redirect).
//!
//! Costs: a 64 KiB copy buffer; a retry waits 0.4-6.4 s.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{Hub, RepoRef, is_commit};
use crate::progress::{Progress, Unit};
use crate::store::{StoreError, io_err};

/// Resumptions of one file within a run before giving up.
const RETRIES: usize = 5;

/// Requests for one repo.
pub(super) struct Client<'a> {
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
    pub(super) fn new(hub: &'a Hub, r: &'a RepoRef) -> Self {
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
    pub(super) fn list(&self) -> Result<(String, Vec<String>), StoreError> {
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
    pub(super) fn file(&self, commit: &str, file: &str) -> Result<PathBuf, StoreError> {
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
