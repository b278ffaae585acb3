//! Graceful shutdown over a real socket: in-flight streams finish within the
//! grace period; past it they are cancelled with an error event, and `serve`
//! returns `Ok` either way.

use std::time::{Duration, Instant};

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::fake::{Setup, engine};
use crate::{completion_request, sse_data};
use server::{AppState, ServerConfig};

/// Starts `serve` on a loopback port; returns the address, the shutdown
/// trigger and the server task.
async fn start(
    grace: Duration,
    delay: Duration,
) -> (
    std::net::SocketAddr,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), server::ServerError>>,
) {
    let (engine, tok) = engine(Setup {
        delay,
        ..Setup::default()
    });
    let mut cfg = ServerConfig::new("letters");
    cfg.grace = grace;
    let state = AppState::new(engine, tok, cfg);
    let listener = server::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(server::serve(state, listener, async {
        let _ = rx.await;
    }));
    (addr, tx, task)
}

/// Opens a streaming completion; returns the socket after the first bytes of the response.
async fn open(addr: std::net::SocketAddr, max_tokens: usize) -> (TcpStream, Vec<u8>) {
    let body = json!({"prompt": "a", "max_tokens": max_tokens, "ignore_eos": true, "stream": true})
        .to_string();
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let req = completion_request(&body, false);
    s.write_all(req.as_bytes()).await.expect("write");
    let mut buf = vec![0u8; 4096];
    let n = s.read(&mut buf).await.expect("read");
    buf.truncate(n);
    (s, buf)
}

async fn read_to_end(mut s: TcpStream, mut got: Vec<u8>) -> String {
    tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut got))
        .await
        .expect("the server closed the connection")
        .expect("read");
    String::from_utf8_lossy(&got).into_owned()
}

/// SSE payloads of a chunked HTTP response (chunk-size lines removed).
fn payloads(raw: &str) -> Vec<String> {
    let body = raw.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    let joined: String = body
        .split("\r\n")
        .filter(|l| !(l.len() <= 8 && !l.is_empty() && l.chars().all(|c| c.is_ascii_hexdigit())))
        .collect::<Vec<_>>()
        .join("\n");
    sse_data(&joined.replace("\n\n\n", "\n\n"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_requests_finish_within_grace() {
    let (addr, stop, task) = start(Duration::from_secs(20), Duration::from_millis(5)).await;
    let (s, first) = open(addr, 30).await;
    assert!(String::from_utf8_lossy(&first).starts_with("HTTP/1.1 200"));
    stop.send(()).expect("server alive");
    let raw = read_to_end(s, first).await;
    let data = payloads(&raw);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{raw}");
    assert!(raw.contains("\"finish_reason\":\"length\""), "{raw}");
    let res = tokio::time::timeout(Duration::from_secs(10), task).await;
    assert!(matches!(res, Ok(Ok(Ok(())))), "{res:?}");
    // no longer accepting
    assert!(TcpStream::connect(addr).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_past_grace_are_cancelled() {
    let (addr, stop, task) = start(Duration::from_millis(200), Duration::from_millis(5)).await;
    let (s, first) = open(addr, 450).await;
    let t0 = Instant::now();
    stop.send(()).expect("server alive");
    let raw = read_to_end(s, first).await;
    let data = payloads(&raw);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{raw}");
    let err = &data[data.len() - 2];
    assert!(
        err.contains("\"error\"") && err.contains("shutting down"),
        "{raw}"
    );
    let res = tokio::time::timeout(Duration::from_secs(10), task).await;
    assert!(matches!(res, Ok(Ok(Ok(())))), "{res:?}");
    // 450 tokens at 5 ms would take over 2 s
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
}

/// While the server drains, it still accepts connections and
/// answers `/health` with 503 and new work with 503; the in-flight stream
/// finishes; then the listener closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_answers_503_while_draining() {
    let (addr, stop, task) = start(Duration::from_secs(20), Duration::from_millis(10)).await;
    let (s, first) = open(addr, 40).await;
    assert!(String::from_utf8_lossy(&first).starts_with("HTTP/1.1 200"));
    stop.send(()).expect("server alive");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let get = |req: String| async move {
        let mut c = TcpStream::connect(addr)
            .await
            .expect("still accepting while draining");
        c.write_all(req.as_bytes()).await.expect("write");
        let mut got = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut got))
            .await
            .expect("the server closed the draining connection")
            .expect("read");
        String::from_utf8_lossy(&got).into_owned()
    };
    let h = get("GET /health HTTP/1.1\r\nhost: localhost\r\n\r\n".into()).await;
    assert!(h.starts_with("HTTP/1.1 503"), "{h}");
    assert!(h.contains("shutting_down"), "{h}");
    let body = r#"{"prompt": "a", "max_tokens": 2}"#;
    let c = get(completion_request(body, false)).await;
    assert!(c.starts_with("HTTP/1.1 503"), "{c}");
    let raw = read_to_end(s, first).await;
    assert!(raw.contains("\"finish_reason\":\"length\""), "{raw}");
    let res = tokio::time::timeout(Duration::from_secs(10), task).await;
    assert!(matches!(res, Ok(Ok(Ok(())))), "{res:?}");
    assert!(TcpStream::connect(addr).await.is_err());
}
