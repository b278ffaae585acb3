//! The per-request `response` log line carries the request's real duration:
//! for a streamed response, the whole stream, not the time to its headers.
//! Alone in its test binary: it installs a global log subscriber.

#[path = "http/fake.rs"]
#[allow(dead_code)]
mod fake;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::Request;
use http_body_util::BodyExt;
use server::{AppState, ServerConfig};
use tower::ServiceExt;

#[derive(Clone, Default)]
struct LogBuf(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogBuf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The `elapsed_ms` of the first `response` line.
fn logged_ms(log: &str) -> u64 {
    let line = log
        .lines()
        .find(|l| l.contains("response") && l.contains("elapsed_ms="))
        .unwrap_or_else(|| panic!("no response line in {log}"));
    line.split("elapsed_ms=")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|d| d.parse().ok())
        .unwrap_or_else(|| panic!("no duration in {line}"))
}

#[tokio::test]
async fn streamed_requests_are_logged_with_their_real_duration() {
    let buf = LogBuf::default();
    let sink = buf.clone();
    tracing_subscriber::fmt()
        .with_writer(move || sink.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .init();
    let (engine, tok) = fake::engine(fake::Setup {
        delay: Duration::from_millis(20),
        ..Default::default()
    });
    let state = AppState::new(engine, tok, ServerConfig::new("letters"));
    let body = serde_json::json!({"model": "letters", "prompt": "a", "max_tokens": 20,
                                  "stream": true, "ignore_eos": true});
    let req = Request::post("/v1/completions")
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let t0 = Instant::now();
    let resp = server::router(state).oneshot(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let text = resp.into_body().collect().await.unwrap().to_bytes();
    let took = t0.elapsed().as_millis() as u64;
    assert!(text.ends_with(b"data: [DONE]\n\n"), "{text:?}");
    assert!(took >= 300, "the stream took {took} ms");
    let log = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
    let ms = logged_ms(&log);
    assert!(
        ms * 2 >= took,
        "logged {ms} ms for a {took} ms stream:\n{log}"
    );
}
