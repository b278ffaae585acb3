//! Connection limits over a real socket (hardening issue, finding 1): slow
//! headers, idle keep-alive connections and stalled bodies are closed within
//! the configured timeouts; connections past the cap are closed at once and
//! the server keeps answering `/health` and streaming beside a flood of idle
//! connections.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::fake::{Setup, engine};
use server::{AppState, ServerConfig};

struct Server {
    addr: std::net::SocketAddr,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn start(tweak: impl FnOnce(&mut ServerConfig)) -> Server {
    let (engine, tok) = engine(Setup::default());
    let mut cfg = ServerConfig::new("letters");
    tweak(&mut cfg);
    let state = AppState::new(engine, tok, cfg);
    let listener = server::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server::serve(state, listener, async {
        let _ = rx.await;
    }));
    Server { addr, _stop: tx }
}

/// Reads until the server closes the connection; returns what it sent and
/// how long that took (panics after `limit`).
async fn until_closed(s: &mut TcpStream, limit: Duration) -> (String, Duration) {
    let t0 = Instant::now();
    let mut got = Vec::new();
    tokio::time::timeout(limit, s.read_to_end(&mut got))
        .await
        .expect("the server kept the connection open")
        .ok();
    (String::from_utf8_lossy(&got).into_owned(), t0.elapsed())
}

async fn health(addr: std::net::SocketAddr) -> (u16, Duration) {
    let t0 = Instant::now();
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(b"GET /health HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n")
        .await
        .expect("write");
    let (reply, _) = until_closed(&mut s, Duration::from_secs(5)).await;
    let status = reply
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, t0.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_headers_and_idle_connections_are_closed_within_the_timeout() {
    let srv = start(|c| c.header_timeout = Duration::from_millis(300)).await;
    // one header byte every 100 ms: never completes within 300 ms
    let slow = TcpStream::connect(srv.addr).await.expect("connect");
    let (mut rd, mut wr) = slow.into_split();
    let t0 = Instant::now();
    tokio::spawn(async move {
        for b in b"GET /health HTTP/1.1\r\nhost: t\r\n" {
            if wr.write_all(&[*b]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(3), rd.read_to_end(&mut got)).await;
    let took = t0.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "a slow-header connection lived {took:?} (timeout 300 ms)"
    );
    // a keep-alive connection left idle after one request
    let mut idle = TcpStream::connect(srv.addr).await.expect("connect");
    idle.write_all(b"GET /health HTTP/1.1\r\nhost: t\r\n\r\n")
        .await
        .expect("write");
    let (reply, took) = until_closed(&mut idle, Duration::from_secs(3)).await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(
        took < Duration::from_secs(2),
        "idle connection lived {took:?}"
    );
    // a connection that sends nothing at all
    let mut silent = TcpStream::connect(srv.addr).await.expect("connect");
    let (_, took) = until_closed(&mut silent, Duration::from_secs(3)).await;
    assert!(
        took < Duration::from_secs(2),
        "silent connection lived {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_body_gets_408() {
    let srv = start(|c| c.body_timeout = Duration::from_millis(300)).await;
    let mut s = TcpStream::connect(srv.addr).await.expect("connect");
    s.write_all(
        b"POST /v1/completions HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n\
          content-length: 100\r\n\r\n{\"prompt\":",
    )
    .await
    .expect("write");
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(3), s.read(&mut buf))
        .await
        .expect("no reply to a stalled body")
        .expect("read");
    let reply = String::from_utf8_lossy(&buf[..n]);
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_cap_are_closed_and_health_still_answers() {
    let cap = 64;
    let srv = start(|c| {
        c.max_connections = cap;
        c.header_timeout = Duration::from_millis(500);
    })
    .await;
    let (status, unloaded) = health(srv.addr).await;
    assert_eq!(status, 200);
    // a flood of idle connections, four times the cap
    let mut idle = Vec::new();
    for _ in 0..4 * cap {
        if let Ok(s) = TcpStream::connect(srv.addr).await {
            idle.push(s);
        }
    }
    // those past the cap are closed at once (EOF without a byte)
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut closed = 0;
    for s in &mut idle {
        let mut b = [0u8; 1];
        if let Ok(Ok(0)) = tokio::time::timeout(Duration::from_millis(5), s.read(&mut b)).await {
            closed += 1;
        }
    }
    assert!(
        closed >= 3 * cap - 4,
        "only {closed} of {} extra connections closed",
        3 * cap
    );
    // the idle ones within the cap time out; then the server answers again
    tokio::time::sleep(Duration::from_millis(700)).await;
    let (status, took) = health(srv.addr).await;
    assert_eq!(status, 200);
    assert!(
        took < Duration::from_millis(100) + 2 * unloaded,
        "/health took {took:?} after the flood (unloaded {unloaded:?})"
    );
}
