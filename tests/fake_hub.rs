//! A fake Hugging Face hub on a local port for the download tests: the
//! hub's file listing (`GET /api/models/{repo}/revision/{rev}`) and resolve
//! route (`HEAD`/`GET /{repo}/resolve/{rev}/{file}`, with `ETag`,
//! `X-Repo-Commit`, `X-Linked-Etag`/`X-Linked-Size` for the weight files as
//! the real hub sends for LFS files, and `Range` answered with 206).
//!
//! Knobs: a repo can require a token (401 without one, `X-Error-Code:
//! GatedRepo`), refuse every token (403, licence not accepted) or accept
//! only one token; one file can be cut off mid-body once (the connection
//! closes after half the bytes, with the full `Content-Length` announced).
//! Every request is counted and recorded (method, path, range, whether an
//! `Authorization` header came).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};

/// Who may read a repo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    Public,
    /// 401 without `Authorization: Bearer <token>`, 403 with another token.
    Token(String),
    /// 401 without a token, 403 with any (the licence is not accepted).
    LicenceNotAccepted,
}

#[derive(Debug, Clone)]
pub struct Repo {
    pub commit: String,
    pub files: BTreeMap<String, Vec<u8>>,
    pub access: Access,
}

/// One request as the server saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub range: Option<String>,
    pub authorized: bool,
}

#[derive(Default)]
struct State {
    repos: BTreeMap<String, Repo>,
    /// `repo/file` cut off once, at half its length.
    cut_once: Option<String>,
    seen: Vec<Seen>,
}

pub struct FakeHub {
    pub url: String,
    state: Arc<Mutex<State>>,
}

/// A stable blob name for `bytes` (hex, like the hub's sha256 ETags).
pub fn etag(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
    }
    format!("{h:016x}{:016x}", bytes.len())
}

impl FakeHub {
    pub fn start() -> FakeHub {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let state = Arc::new(Mutex::new(State::default()));
        let shared = state.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let state = shared.clone();
                std::thread::spawn(move || serve(conn, &state));
            }
        });
        FakeHub { url, state }
    }

    /// Serves the files of `dir` (names relative to it) as `repo`.
    pub fn add_repo(&self, repo: &str, dir: &Path, commit: &str, access: Access) {
        let mut files = BTreeMap::new();
        for e in std::fs::read_dir(dir).expect("read repo dir") {
            let p = e.expect("entry").path();
            if p.is_file() {
                let name = p.file_name().unwrap().to_string_lossy().into_owned();
                files.insert(name, std::fs::read(&p).expect("read file"));
            }
        }
        let r = Repo {
            commit: commit.to_string(),
            files,
            access,
        };
        self.state.lock().unwrap().repos.insert(repo.into(), r);
    }

    /// Cuts `repo/file` off at half its length the next time it is sent.
    pub fn cut_once(&self, repo: &str, file: &str) {
        self.state.lock().unwrap().cut_once = Some(format!("{repo}/{file}"));
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.state.lock().unwrap().seen.clone()
    }
}

fn respond(out: &mut TcpStream, status: &str, headers: &[(String, String)], body: &[u8]) {
    let mut head = format!("HTTP/1.1 {status}\r\nConnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let _ = out.write_all(head.as_bytes());
    let _ = out.write_all(body);
    let _ = out.flush();
}

fn text(out: &mut TcpStream, status: &str, code: Option<&str>, msg: &str) {
    let mut h = vec![("Content-Length".to_string(), msg.len().to_string())];
    if let Some(c) = code {
        h.push(("X-Error-Code".into(), c.into()));
        h.push(("X-Error-Message".into(), msg.into()));
    }
    respond(out, status, &h, msg.as_bytes());
}

fn serve(conn: TcpStream, state: &Mutex<State>) {
    let mut reader = BufReader::new(conn.try_clone().expect("clone stream"));
    let mut out = conn;
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let mut parts = line.split_whitespace();
    let (method, path) = (
        parts.next().unwrap_or("").to_string(),
        parts.next().unwrap_or("").to_string(),
    );
    let mut auth = None;
    let mut range = None;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).is_err() || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            match k.trim().to_ascii_lowercase().as_str() {
                "authorization" => auth = Some(v.trim().to_string()),
                "range" => range = Some(v.trim().to_string()),
                _ => {}
            }
        }
    }
    let mut st = state.lock().unwrap();
    st.seen.push(Seen {
        method: method.clone(),
        path: path.clone(),
        range: range.clone(),
        authorized: auth.is_some(),
    });
    // /api/models/{org}/{name}/revision/{rev}  or  /{org}/{name}/resolve/{rev}/{file}
    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let (repo_id, rest) = match segs.as_slice() {
        ["api", "models", org, name, "revision", rev] => (format!("{org}/{name}"), vec![*rev]),
        [org, name, "resolve", rev, file] => (format!("{org}/{name}"), vec![*rev, *file]),
        _ => return text(&mut out, "404 Not Found", None, "no route"),
    };
    let Some(repo) = st.repos.get(&repo_id).cloned() else {
        return text(
            &mut out,
            "401 Unauthorized",
            Some("RepoNotFound"),
            "Repository not found",
        );
    };
    let token = auth.as_deref().and_then(|a| a.strip_prefix("Bearer "));
    match (&repo.access, token) {
        (Access::Public, _) => {}
        (_, None) => {
            return text(
                &mut out,
                "401 Unauthorized",
                Some("GatedRepo"),
                "Access to this model is restricted: you must be authenticated",
            );
        }
        (Access::Token(want), Some(t)) if want == t => {}
        (Access::Token(_), Some(_)) => {
            return text(&mut out, "401 Unauthorized", None, "Invalid credentials");
        }
        (Access::LicenceNotAccepted, Some(_)) => {
            return text(
                &mut out,
                "403 Forbidden",
                Some("GatedRepo"),
                "Access to this model is restricted and you are not in the authorized list",
            );
        }
    }
    if rest[0] != "main" && rest[0] != repo.commit {
        return text(
            &mut out,
            "404 Not Found",
            Some("RevisionNotFound"),
            "no revision",
        );
    }
    if rest.len() == 1 {
        let siblings: Vec<_> = repo
            .files
            .keys()
            .map(|f| serde_json::json!({ "rfilename": f }))
            .collect();
        let body = serde_json::json!({ "id": repo_id, "sha": repo.commit, "siblings": siblings })
            .to_string();
        let h = vec![
            ("Content-Type".to_string(), "application/json".to_string()),
            ("Content-Length".to_string(), body.len().to_string()),
        ];
        return respond(&mut out, "200 OK", &h, body.as_bytes());
    }
    let file = rest[1];
    let Some(bytes) = repo.files.get(file) else {
        return text(
            &mut out,
            "404 Not Found",
            Some("EntryNotFound"),
            "no such file",
        );
    };
    let tag = etag(bytes);
    let mut h = vec![("X-Repo-Commit".to_string(), repo.commit.clone())];
    if file.ends_with(".safetensors") {
        // an LFS file: the blob's ETag and size in X-Linked-*
        h.push(("ETag".into(), "\"pointer-etag\"".into()));
        h.push(("X-Linked-Etag".into(), format!("\"{tag}\"")));
        h.push(("X-Linked-Size".into(), bytes.len().to_string()));
    } else {
        h.push(("ETag".into(), format!("\"{tag}\"")));
    }
    let start: usize = range
        .as_deref()
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.strip_suffix('-'))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    if start > bytes.len() {
        return text(&mut out, "416 Range Not Satisfiable", None, "bad range");
    }
    let body = &bytes[start..];
    h.push(("Content-Length".into(), body.len().to_string()));
    let status = if start > 0 {
        h.push((
            "Content-Range".into(),
            format!("bytes {start}-{}/{}", bytes.len() - 1, bytes.len()),
        ));
        "206 Partial Content"
    } else {
        "200 OK"
    };
    if method == "HEAD" {
        return respond(&mut out, status, &h, &[]);
    }
    let key = format!("{repo_id}/{file}");
    if st.cut_once.as_deref() == Some(key.as_str()) {
        st.cut_once = None;
        drop(st);
        // full length announced, half sent, connection closed
        return respond(&mut out, status, &h, &body[..body.len() / 2]);
    }
    drop(st);
    respond(&mut out, status, &h, body);
}
