//! In-process tests of the HTTP API over a real `engine::Engine` driving a
//! deterministic fake backend (`fake.rs`): every error case, both response
//! shapes, the SSE stream format, disconnect cancellation, metrics and
//! graceful shutdown; and the request parsing under fuzzing (`fuzz.rs`).

mod abuse;
mod agents;
mod api_surface;
mod cross_site;
mod embeddings;
mod errors;
mod fake;
mod fuzz;
mod limits;
mod load;
mod many_models;
mod peer_clients;
mod replicas;
mod responses;
mod shutdown;
mod stored_responses;
mod streams;
mod tool_replies;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;
use server::{AppState, ServerConfig};
use tower::ServiceExt;

pub const MODEL: &str = "letters";

pub struct App {
    pub state: Arc<AppState>,
    pub router: Router,
}

pub fn app_with(setup: fake::Setup, tweak: impl FnOnce(&mut ServerConfig)) -> App {
    let (engine, tok) = fake::engine(setup);
    let mut cfg = ServerConfig::new(MODEL);
    tweak(&mut cfg);
    let state = AppState::new(engine, tok, cfg);
    App {
        router: server::router(state.clone()),
        state,
    }
}

/// An app over one engine per setup (data parallelism), routed by `server::Replicas`.
pub fn app_replicas(setups: Vec<fake::Setup>) -> App {
    let mut engines = Vec::new();
    let mut tok = None;
    for setup in setups {
        let (engine, t) = fake::engine(setup);
        engines.push(engine);
        tok = Some(t);
    }
    let replicas = server::Replicas::new(engines).expect("replicas");
    let state = AppState::with_replicas(
        replicas,
        tok.expect("one setup at least"),
        ServerConfig::new(MODEL),
    );
    App {
        router: server::router(state.clone()),
        state,
    }
}

pub fn app() -> App {
    app_with(fake::Setup::default(), |_| {})
}

pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// Asserts an OpenAI error body with this status and parameter.
    pub fn assert_error(&self, status: u16, param: Option<&str>) -> Value {
        assert_eq!(self.status.as_u16(), status, "{}", self.text());
        let v = self.json();
        let e = &v["error"];
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
        assert!(e["type"].as_str().is_some(), "{v}");
        assert!(e.get("code").is_some(), "{v}");
        assert_eq!(e["param"].as_str(), param, "{v}");
        v
    }
}

impl App {
    pub async fn send(&self, req: Request<Body>) -> Reply {
        let resp = self.router.clone().oneshot(req).await.expect("infallible");
        let status = resp.status();
        let headers = resp.headers().clone();
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        Reply {
            status,
            headers,
            body,
        }
    }

    pub async fn post(&self, path: &str, body: impl Into<Body>) -> Reply {
        self.send(post(path, body)).await
    }

    pub async fn post_json(&self, path: &str, v: &Value) -> Reply {
        self.post(path, v.to_string()).await
    }

    pub async fn get(&self, path: &str) -> Reply {
        let req = Request::get(path).body(Body::empty()).expect("request");
        self.send(req).await
    }

    /// Waits until the engine runs nothing and holds no KV blocks.
    pub async fn wait_idle(&self) {
        let start = Instant::now();
        loop {
            let s = self.state.served().unwrap().replicas.stats();
            if s.running == 0 && s.waiting == 0 && s.kv_blocks_used == 0 {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "engine never went idle: {s:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

pub fn post(path: &str, body: impl Into<Body>) -> Request<Body> {
    Request::post(path)
        .header("content-type", "application/json")
        .body(body.into())
        .expect("request")
}

/// The head of a raw HTTP/1.1 `POST /v1/completions` carrying a JSON body
/// of `len` bytes (`close`: ask the server to close after the response),
/// for the tests that talk to a real socket.
pub fn completion_head(len: usize, close: bool) -> String {
    let conn = if close { "connection: close\r\n" } else { "" };
    format!(
        "POST /v1/completions HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n\
         {conn}content-length: {len}\r\n\r\n"
    )
}

/// A whole raw `POST /v1/completions` request with `body` (see [`completion_head`]).
pub fn completion_request(body: &str, close: bool) -> String {
    completion_head(body.len(), close) + body
}

/// The `data:` payloads of an SSE body, in order (comment-only events,
/// the keep-alives, are skipped).
pub fn sse_data(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter(|e| e.lines().any(|l| l.starts_with("data:")))
        .map(|e| {
            e.lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|d| d.strip_prefix(' ').unwrap_or(d))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .collect()
}

/// The JSON chunks of an SSE body, checking it ends with exactly one `[DONE]`.
pub fn sse_chunks(body: &str) -> Vec<Value> {
    let data = sse_data(body);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{body}");
    assert_eq!(data.iter().filter(|d| *d == "[DONE]").count(), 1, "{body}");
    data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("chunk {d:?}: {e}")))
        .collect()
}

/// The letters a prompt ending in a non-letter continues with before EOS.
pub const LETTERS: &str = "abcdefghijklmnopqrstuvwxy";
