//! Over a real socket: clients posting 4 MB prompts in a
//! loop (parsed, refused as longer than the context, never run) do not raise
//! another client's worst gap between streamed tokens above twice its
//! unloaded value plus [`SLACK`] (the other tests of this binary share the
//! cores).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::fake::Setup;
use crate::limits::start_with;
use crate::{completion_head, completion_request};

/// Scheduling noise allowed on top of twice the unloaded gap.
const SLACK: Duration = Duration::from_millis(200);

/// Streams `n` tokens; returns the worst gap between two reads carrying events.
async fn worst_gap(addr: std::net::SocketAddr, n: usize) -> Duration {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let body =
        format!(r#"{{"prompt": "a", "max_tokens": {n}, "ignore_eos": true, "stream": true}}"#);
    let req = completion_request(&body, true);
    s.write_all(req.as_bytes()).await.expect("write");
    let (mut last, mut worst, mut events) = (None::<Instant>, Duration::ZERO, 0);
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let k = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
            .await
            .expect("stream stalled")
            .expect("read");
        if k == 0 {
            break;
        }
        let got = String::from_utf8_lossy(&buf[..k]);
        let e = got.matches("data: ").count();
        if e > 0 {
            let now = Instant::now();
            if let Some(t) = last {
                worst = worst.max(now - t);
            }
            last = Some(now);
            events += e;
        }
    }
    assert!(events >= n, "only {events} events for {n} tokens");
    worst
}

/// One 4 MB prompt (within the 4 MiB body limit); returns the status line.
async fn post_big(addr: std::net::SocketAddr, body: &str) -> String {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let head = completion_head(body.len(), true);
    s.write_all(head.as_bytes()).await.expect("write");
    s.write_all(body.as_bytes()).await.expect("write");
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut got)).await;
    String::from_utf8_lossy(&got)
        .lines()
        .next()
        .unwrap_or("")
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn big_prompts_in_a_loop_do_not_stall_another_stream() {
    let setup = Setup {
        delay: Duration::from_millis(25),
        ..Setup::default()
    };
    let srv = start_with(setup, |_| {}).await;
    let unloaded = worst_gap(srv.addr, 20).await;
    let stop = Arc::new(AtomicBool::new(false));
    let refused = Arc::new(AtomicUsize::new(0));
    let body = Arc::new(format!(
        r#"{{"prompt": "{}", "max_tokens": 4}}"#,
        "a".repeat(4_000_000)
    ));
    let mut load = Vec::new();
    for _ in 0..2 {
        let (stop, refused, body, addr) = (stop.clone(), refused.clone(), body.clone(), srv.addr);
        load.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let status = post_big(addr, &body).await;
                assert!(status.starts_with("HTTP/1.1 400"), "4 MB prompt: {status}");
                refused.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let loaded = worst_gap(srv.addr, 20).await;
    stop.store(true, Ordering::Relaxed);
    for t in load {
        t.await.expect("load task");
    }
    let n = refused.load(Ordering::Relaxed);
    println!("worst gap unloaded {unloaded:?}, under {n} 4 MB prompts {loaded:?}");
    assert!(n >= 2, "the load ran only {n} requests");
    assert!(
        loaded <= 2 * unloaded + SLACK,
        "worst inter-token gap {loaded:?} under 4 MB prompts ({n} refused) vs {unloaded:?} unloaded"
    );
}
