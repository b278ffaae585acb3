//! Connection limits over a real socket:
//! slow headers, idle keep-alive connections and stalled bodies are closed
//! within the configured timeouts; connections past the cap evict the
//! longest-idle ones, so a cap full of idle connections still answers
//! `/health` and streams within 100 ms; requests per client address are
//! capped; half-closed connections get their response; a cap full of
//! slow-header connections still answers `/health`.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::completion_request;
use crate::fake::{Setup, engine};
use server::{AppState, ServerConfig};

pub struct Server {
    pub addr: std::net::SocketAddr,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn start(tweak: impl FnOnce(&mut ServerConfig)) -> Server {
    start_with(Setup::default(), tweak).await
}

pub async fn start_with(setup: Setup, tweak: impl FnOnce(&mut ServerConfig)) -> Server {
    let (engine, tok) = engine(setup);
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
    s.write_all(b"GET /health HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n")
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
        for b in b"GET /health HTTP/1.1\r\nhost: localhost\r\n" {
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
    idle.write_all(b"GET /health HTTP/1.1\r\nhost: localhost\r\n\r\n")
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
        b"POST /v1/completions HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n\
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
async fn connections_past_the_cap_evict_the_longest_idle() {
    let cap = 64;
    let srv = start(|c| c.max_connections = cap).await;
    let (status, _) = health(srv.addr).await;
    assert_eq!(status, 200);
    // a flood of idle connections, four times the cap: each one past the
    // cap makes the server close the connection idle the longest
    let mut idle = Vec::new();
    for _ in 0..4 * cap {
        if let Ok(s) = TcpStream::connect(srv.addr).await {
            idle.push(s);
        }
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut open = Vec::new();
    for (i, s) in idle.iter_mut().enumerate() {
        let mut b = [0u8; 1];
        if tokio::time::timeout(Duration::from_millis(5), s.read(&mut b))
            .await
            .is_err()
        {
            open.push(i);
        }
    }
    // at most the cap stay open, and the oldest were closed: the first
    // `cap` (a loaded machine may accept later ones out of order, so only
    // these, older than 3 x cap connections after them, are certain)
    assert!(
        open.len() <= cap,
        "{} connections open past a cap of {cap}",
        open.len()
    );
    assert!(
        open.iter().all(|&i| i >= cap),
        "an old idle connection outlived newer ones: {open:?}"
    );
}

/// Soft limit on open file descriptors of this process (Linux), else 1024.
fn fd_limit() -> usize {
    std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(1024)
}

/// 10,000 idle connections (fewer if this process
/// may not open twice as many descriptors) filling the cap leave `/health`
/// and a stream's first token answering within 100 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cap_full_of_idle_connections_still_answers_within_100_ms() {
    let n = 10_000.min(fd_limit().saturating_sub(512) / 2);
    assert!(
        n >= 256,
        "too few file descriptors for this test: {}",
        fd_limit()
    );
    let srv = start(|c| c.max_connections = n).await;
    let mut idle = Vec::with_capacity(n);
    while idle.len() < n {
        idle.push(TcpStream::connect(srv.addr).await.expect("connect"));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    for _ in 0..3 {
        let (status, took) = health(srv.addr).await;
        assert_eq!(status, 200);
        assert!(
            took < Duration::from_millis(100),
            "/health took {took:?} beside {n} idle connections"
        );
    }
    let t0 = Instant::now();
    let mut s = TcpStream::connect(srv.addr).await.expect("connect");
    let body = r#"{"prompt": "a", "max_tokens": 3, "stream": true}"#;
    let req = completion_request(body, false);
    s.write_all(req.as_bytes()).await.expect("write");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("data: {") {
        let k = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
            .await
            .expect("no token")
            .expect("read");
        assert!(
            k > 0,
            "closed before a token: {}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..k]);
    }
    let took = t0.elapsed();
    assert!(
        took < Duration::from_millis(100),
        "first token after {took:?} beside {n} idle connections"
    );
    drop(idle);
}

/// A client that shuts its write side after the request still
/// gets the whole response.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_closed_connection_gets_its_response() {
    // tokens take a while, so the server sees the EOF before it answers
    let setup = Setup {
        delay: Duration::from_millis(20),
        ..Setup::default()
    };
    let srv = start_with(setup, |_| {}).await;
    let mut s = TcpStream::connect(srv.addr).await.expect("connect");
    let body = r#"{"prompt": "a", "max_tokens": 5, "ignore_eos": true}"#;
    let req = completion_request(body, false);
    s.write_all(req.as_bytes()).await.expect("write");
    s.shutdown().await.expect("half-close");
    let (reply, _) = until_closed(&mut s, Duration::from_secs(5)).await;
    // the server may ask with an interim response whether the socket is
    // still open (a closed one answers it with a reset); clients skip 1xx
    let last = reply.strip_prefix("HTTP/1.1 103 Early Hints\r\n\r\n");
    assert!(
        last.unwrap_or(&reply).starts_with("HTTP/1.1 200"),
        "{reply}"
    );
    assert!(reply.contains("\"choices\""), "{reply}");
}

/// Requests in flight per client address are capped (429 naming the flag);
/// a slot frees when a streamed response ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_past_the_per_client_cap_get_429() {
    let setup = Setup {
        delay: Duration::from_millis(20),
        ..Setup::default()
    };
    let srv = start_with(setup, |c| c.max_client_requests = 2).await;
    let addr = srv.addr;
    let stream = |max_tokens: usize| async move {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        let body = format!(
            r#"{{"prompt": "a", "max_tokens": {max_tokens}, "ignore_eos": true, "stream": true}}"#
        );
        let req = completion_request(&body, true);
        s.write_all(req.as_bytes()).await.expect("write");
        let mut first = vec![0u8; 64];
        let k = s.read(&mut first).await.expect("read");
        first.truncate(k);
        (s, String::from_utf8_lossy(&first).into_owned())
    };
    // two long streams take both slots
    let (a, ha) = stream(30).await;
    let (_b, hb) = stream(30).await;
    assert!(
        ha.starts_with("HTTP/1.1 200") && hb.starts_with("HTTP/1.1 200"),
        "{ha} / {hb}"
    );
    let (mut c, hc) = stream(1).await;
    assert!(hc.starts_with("HTTP/1.1 429"), "{hc}");
    let (rest, _) = until_closed(&mut c, Duration::from_secs(5)).await;
    assert!(
        format!("{hc}{rest}").contains("--max-client-requests"),
        "{hc}{rest}"
    );
    // once a stream ends, a new request is admitted
    let mut a = a;
    let _ = until_closed(&mut a, Duration::from_secs(10)).await;
    let (_d, hd) = stream(1).await;
    assert!(hd.starts_with("HTTP/1.1 200"), "{hd}");
}

/// Connections that send one header byte every 100 ms fill the connection
/// cap, and come back when closed: they are neither idle nor reading a
/// body, yet `/health` answers within 1 s, because the connection that
/// has spent the longest on its head is closed to make room. Bounded: each
/// attacker stops after a fixed number of connections, or when told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_headers_filling_the_cap_leave_health_responsive() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let cap = 16;
    let srv = start(|c| c.max_connections = cap).await;
    let addr = srv.addr;
    let stop = Arc::new(AtomicBool::new(false));
    let mut attackers = Vec::new();
    for _ in 0..cap {
        let stop = stop.clone();
        attackers.push(tokio::spawn(async move {
            for _ in 0..100 {
                let Ok(mut s) = TcpStream::connect(addr).await else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                for b in b"GET /health HTTP/1.1\r\nhost: localhost\r\nx-slow: aaaaaaaaaaaaaaaa\r\n"
                {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    if s.write_all(&[*b]).await.is_err() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    for i in 0..10 {
        let (status, took) = health(addr).await;
        assert_eq!(
            status, 200,
            "/health #{i} refused with the cap full of slow headers"
        );
        assert!(
            took < Duration::from_secs(1),
            "/health #{i} took {took:?} with the cap full of slow headers"
        );
    }
    stop.store(true, Ordering::Relaxed);
    for a in attackers {
        let _ = a.await;
    }
}
