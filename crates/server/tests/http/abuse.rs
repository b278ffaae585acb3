//! Hostile requests over a real socket: structures too large or too deep
//! for the grammar engine, CPU-heavy preparation, constraints that fail at
//! their first token, invalid regexes, long stop strings and abandoned
//! non-streamed requests. The server must answer each with a 200 or a 400
//! naming the field, keep `/health` answering, and free what an abandoned
//! request held. Sizes are swept, so no test hangs on one number.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::fake::{Setup, engine};
use server::{AppState, ServerConfig};

pub struct Live {
    pub addr: std::net::SocketAddr,
    pub state: Arc<AppState>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

pub async fn serve(setup: Setup, tweak: impl FnOnce(&mut ServerConfig)) -> Live {
    let (engine, tok) = engine(setup);
    let mut cfg = ServerConfig::new("letters");
    tweak(&mut cfg);
    let state = AppState::new(engine, tok, cfg);
    let listener = server::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server::serve(state.clone(), listener, async {
        let _ = rx.await;
    }));
    Live {
        addr,
        state,
        _stop: tx,
    }
}

/// POSTs `body` to `path` with `connection: close`; the status and body.
pub async fn post(addr: std::net::SocketAddr, path: &str, body: &Value) -> (u16, String) {
    let body = body.to_string();
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n\
         connection: close\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.expect("write");
    s.write_all(body.as_bytes()).await.expect("write");
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), s.read_to_end(&mut got))
        .await
        .expect("no reply within 60 s")
        .expect("read (the server died?)");
    let text = String::from_utf8_lossy(&got).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (status, body)
}

/// `/health`'s status and how long it took.
pub async fn health(addr: std::net::SocketAddr) -> (u16, Duration) {
    let t0 = Instant::now();
    let Ok(mut s) = TcpStream::connect(addr).await else {
        return (0, t0.elapsed());
    };
    let _ = s
        .write_all(b"GET /health HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n")
        .await;
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut got)).await;
    let status = String::from_utf8_lossy(&got)
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, t0.elapsed())
}

/// The `error.param` of a 400 body.
fn param(body: &str) -> String {
    serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| v["error"]["param"].as_str().map(String::from))
        .unwrap_or_default()
}

fn props(n: usize) -> Value {
    let p: serde_json::Map<String, Value> = (0..n)
        .map(|i| (format!("p{i}"), json!({"type": "string"})))
        .collect();
    json!({"type": "object", "properties": p})
}

fn chain(rules: usize) -> String {
    let mut g = String::from("start: r0\n");
    for i in 0..rules {
        g.push_str(&format!("r{i}: \"x\" r{}\n", i + 1));
    }
    g.push_str(&format!("r{rules}: \"y\"\n"));
    g
}

fn chat(extra: Value) -> Value {
    let mut body = json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 2});
    for (k, v) in extra.as_object().into_iter().flatten() {
        body[k] = v.clone();
    }
    body
}

/// Each request: a 200, or a 400 naming `field` (or `messages`: tools a
/// template cannot render make the prompt longer than the small test
/// model's context); the server then still answers.
async fn survives(addr: std::net::SocketAddr, field: &str, body: Value) -> u16 {
    let (status, reply) = post(addr, "/v1/chat/completions", &body).await;
    assert!(status == 200 || status == 400, "{field}: {status} {reply}");
    if status == 400 {
        let p = param(&reply);
        assert!(p.starts_with(field) || p == "messages", "{field}: {reply}");
    }
    assert_eq!(health(addr).await.0, 200, "{field}: the server died");
    status
}

/// Huge schemas, grammar chains and tool definitions: the small ones are
/// served, the ones past the limits are 400s naming the field and the
/// limit, and nothing overflows a stack.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn structures_past_the_limits_are_refused_and_the_server_lives() {
    let srv = serve(Setup::default(), |_| {}).await;
    let addr = srv.addr;
    for n in [10, 1_000, 7_000, 20_000] {
        let rf = json!({"type": "json_schema", "json_schema": {"name": "s", "schema": props(n)}});
        let st = survives(
            addr,
            "response_format",
            chat(json!({"response_format": rf})),
        )
        .await;
        assert!(n < 7_000 || st == 400, "{n} properties accepted");
        let tools =
            json!([{"type": "function", "function": {"name": "f", "parameters": props(n)}}]);
        let body = chat(json!({"tools": tools, "tool_choice": "auto"}));
        let (st, reply) = post(addr, "/v1/chat/completions", &body).await;
        if n >= 7_000 {
            assert_eq!(st, 400, "{reply}");
            assert!(param(&reply).starts_with("tools"), "{reply}");
        }
        assert_eq!(health(addr).await.0, 200, "tools of {n}: the server died");
    }
    for n in [10, 300, 1_000, 3_000] {
        let st = survives(
            addr,
            "guided_grammar",
            chat(json!({"guided_grammar": chain(n)})),
        )
        .await;
        assert!(n < 3_000 || st == 400, "a chain of {n} rules accepted");
    }
    for depth in [8, 60, 120] {
        let mut s = json!({"type": "string"});
        for _ in 0..depth {
            s = json!({"type": "array", "items": s});
        }
        let rf = json!({"type": "json_schema", "json_schema": {"name": "s", "schema": s}});
        survives(
            addr,
            "response_format",
            chat(json!({"response_format": rf})),
        )
        .await;
    }
    let many = vec![json!({"type": "function", "function": {"name": "f"}}); 1_000];
    let st = survives(addr, "tools", chat(json!({"tools": many}))).await;
    assert_eq!(st, 400, "1,000 tools accepted");
}

/// With the limits raised far past the defaults the same structures reach
/// the grammar engine, on the work pool's large stacks: each is a 200 or a
/// 400, never a crash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raised_limits_compile_on_the_work_pool_without_overflow() {
    let srv = serve(Setup::default(), |c| {
        c.limits.schema_nodes = 1_000_000;
        c.limits.grammar_rules = 1_000_000;
        c.limits.grammar_bytes = 1 << 22;
        c.work_budget = Duration::from_secs(60);
    })
    .await;
    for n in [7_000, 14_000] {
        let rf = json!({"type": "json_schema", "json_schema": {"name": "s", "schema": props(n)}});
        survives(
            srv.addr,
            "response_format",
            chat(json!({"response_format": rf})),
        )
        .await;
        let tools =
            json!([{"type": "function", "function": {"name": "f", "parameters": props(n)}}]);
        survives(
            srv.addr,
            "tools",
            chat(json!({"tools": tools, "tool_choice": "auto"})),
        )
        .await;
    }
    for n in [1_000, 3_000] {
        survives(
            srv.addr,
            "guided_grammar",
            chat(json!({"guided_grammar": chain(n)})),
        )
        .await;
    }
}

/// Grammar compilation and tool checks run on the work pool: while
/// clients (on their own thread) keep sending fresh large schemas and
/// 60,000-tool lists, `/health` answers within a second each time; with a
/// queue of one some are refused with 429, none with a 5xx.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heavy_preparation_leaves_health_responsive() {
    let srv = serve(Setup::default(), |c| {
        c.work_queue = 1;
        c.limits.tools = 100_000;
        c.limits.schema_nodes = 1_000_000;
    })
    .await;
    let addr = srv.addr;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = stop.clone();
    let clients = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("client runtime");
        rt.block_on(async move {
            let tools: Vec<Value> = (0..60_000)
                .map(|k| json!({"type": "function", "function": {"name": format!("f{k}")}}))
                .collect();
            let tools = Arc::new(chat(json!({"tools": tools})));
            let mut tasks = Vec::new();
            for c in 0..3usize {
                let (stop, tools) = (flag.clone(), tools.clone());
                tasks.push(tokio::spawn(async move {
                    let mut statuses = Vec::new();
                    let mut schema = props(3_000);
                    let mut i = 0usize;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        i += 1;
                        let body = if c == 0 {
                            (*tools).clone()
                        } else {
                            // a fresh schema each time: no compiled copy is cached
                            schema["properties"]["p0"] = json!({"const": format!("{c}-{i}")});
                            let rf = json!({"type": "json_schema", "json_schema": {"name": "s", "schema": schema}});
                            chat(json!({"response_format": rf}))
                        };
                        let (status, reply) = post(addr, "/v1/chat/completions", &body).await;
                        assert!(status < 500, "{status}: {reply}");
                        statuses.push(status);
                    }
                    statuses
                }));
            }
            let mut all = Vec::new();
            for t in tasks {
                all.extend(t.await.expect("client"));
            }
            all
        })
    });
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let mut worst = Duration::ZERO;
    for _ in 0..20 {
        let (status, took) = health(addr).await;
        assert_eq!(status, 200);
        worst = worst.max(took);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let all = tokio::task::spawn_blocking(move || clients.join().expect("clients"))
        .await
        .expect("join");
    assert!(
        worst < Duration::from_secs(1),
        "/health took up to {worst:?} while requests were prepared ({all:?})"
    );
}

/// A constraint the output cannot follow from its first token (the letter
/// fake ignores the mask, so its first letter breaks any digit-only
/// constraint) is a 400 naming the constraint's field, with a short
/// reason and no dump of the grammar engine's state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_constraint_failing_at_its_first_token_is_a_400_naming_it() {
    let srv = serve(Setup::default(), |_| {}).await;
    let cases = [
        ("guided_regex", json!({"guided_regex": "[0-9]{2,4}"})),
        ("guided_regex", json!({"guided_regex": "[0-9]{1000}"})),
        (
            "guided_grammar",
            json!({"guided_grammar": "start: /[0-9]+/"}),
        ),
        (
            "response_format",
            json!({"response_format": {"type": "json_schema",
                "json_schema": {"name": "n", "schema": {"type": "integer"}}}}),
        ),
    ];
    for (field, extra) in cases {
        let (status, reply) = post(srv.addr, "/v1/chat/completions", &chat(extra)).await;
        assert_eq!(status, 400, "{field}: {reply}");
        assert_eq!(param(&reply), field, "{reply}");
        assert!(reply.len() < 600, "a long error: {reply}");
        assert!(!reply.contains("\\n"), "a multi-line dump: {reply}");
    }
}

/// Regexes ending in an unfinished escape are refused when compiled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_regexes_are_refused() {
    let srv = serve(Setup::default(), |_| {}).await;
    for re in ["\\", "a\\", "[0-9]\\\\\\"] {
        let (status, reply) = post(
            srv.addr,
            "/v1/completions",
            &json!({"prompt": "1", "guided_regex": re}),
        )
        .await;
        assert_eq!(status, 400, "{re:?}: {reply}");
        assert_eq!(param(&reply), "guided_regex", "{reply}");
    }
    // an escaped backslash is a valid regex
    let (status, reply) = post(
        srv.addr,
        "/v1/completions",
        &json!({"prompt": "1", "guided_regex": "a\\\\", "max_tokens": 1}),
    )
    .await;
    assert_ne!(status, 500, "{reply}");
}

/// Stop strings past the length limit are refused naming `stop`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_stop_strings_are_refused() {
    let srv = serve(Setup::default(), |_| {}).await;
    for len in [10, 1_000, 100_000, 1 << 20] {
        let stop = vec!["a".repeat(len); 2];
        let body = json!({"prompt": "a", "max_tokens": 3, "stop": stop});
        let (status, reply) = post(srv.addr, "/v1/completions", &body).await;
        if len > server::InputLimits::default().stop_bytes {
            assert_eq!(status, 400, "{len}: {reply}");
            assert_eq!(param(&reply), "stop");
        } else {
            assert_eq!(status, 200, "{len}: {reply}");
        }
    }
}

/// A client that resets its connection while waiting for a non-streamed
/// reply cancels the request: the engine runs nothing and holds no KV.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_while_waiting_cancels_a_non_streamed_request() {
    abandoned_requests_are_cancelled(true).await;
}

/// So does one that closes its socket normally (FIN), which the server
/// tells apart from a half-close (still owed its reply) by an interim
/// response the closed socket answers with a reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_normal_close_while_waiting_cancels_a_non_streamed_request() {
    abandoned_requests_are_cancelled(false).await;
}

/// Clients (1 and 4) send a long non-streamed request and go away once it
/// runs, by a reset or a normal close; every request must end within 3 s.
async fn abandoned_requests_are_cancelled(reset: bool) {
    let setup = Setup {
        delay: Duration::from_millis(10),
        ..Setup::default()
    };
    let srv = serve(setup, |_| {}).await;
    for clients in [1, 4] {
        let mut socks = Vec::new();
        for _ in 0..clients {
            let body = json!({"prompt": "a", "max_tokens": 400, "ignore_eos": true}).to_string();
            let mut s = TcpStream::connect(srv.addr).await.expect("connect");
            s.write_all(crate::completion_request(&body, false).as_bytes())
                .await
                .expect("write");
            socks.push(s);
        }
        let t0 = Instant::now();
        while srv.state.served().unwrap().replicas.stats().running < clients {
            assert!(t0.elapsed() < Duration::from_secs(5), "never ran");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        for s in socks {
            if reset {
                socket2::SockRef::from(&s)
                    .set_linger(Some(Duration::ZERO))
                    .expect("linger");
            }
            drop(s); // a zero linger sends a reset, else a FIN
        }
        let t0 = Instant::now();
        loop {
            let st = srv.state.served().unwrap().replicas.stats();
            if st.running == 0 && st.waiting == 0 && st.kv_blocks_used == 0 {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(3),
                "{clients} abandoned requests still run: {st:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Connects to `addr` from the loopback address `127.0.0.<host>`.
async fn connect_from(host: u8, addr: std::net::SocketAddr) -> std::io::Result<TcpStream> {
    let sock = tokio::net::TcpSocket::new_v4()?;
    sock.bind(std::net::SocketAddr::from(([127, 0, 0, host], 0)))?;
    sock.connect(addr).await
}

/// Time to the first streamed token of a short completion.
async fn first_token(addr: std::net::SocketAddr) -> Duration {
    let t0 = Instant::now();
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let body = r#"{"prompt": "a", "max_tokens": 3, "stream": true}"#;
    s.write_all(crate::completion_request(body, true).as_bytes())
        .await
        .expect("write");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("data: {") {
        let k = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
            .await
            .expect("no token within 5 s")
            .expect("read");
        assert!(
            k > 0,
            "closed before a token: {}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..k]);
    }
    t0.elapsed()
}

/// A slow-body flood (valid headers, then a body byte now and then) from
/// a few addresses, filling the connection cap: `/health` answers within
/// 1 s and a stream's first token comes within twice its unloaded time
/// (or 100 ms); the slow bodies are cut within seconds (408 or closed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_body_flood_leaves_health_and_streams_responsive() {
    for cap in [32, 128] {
        let srv = serve(Setup::default(), |c| c.max_connections = cap).await;
        let addr = srv.addr;
        let unloaded = first_token(addr).await;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut attackers = Vec::new();
        for i in 0..2 * cap {
            let host = 2 + (i % 4) as u8;
            let Ok(mut s) = connect_from(host, addr).await else {
                continue;
            };
            let stop = stop.clone();
            attackers.push(tokio::spawn(async move {
                let head = crate::completion_head(1_000, false);
                if s.write_all(head.as_bytes()).await.is_err() {
                    return None;
                }
                let t0 = Instant::now();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    if s.write_all(b" ").await.is_err() {
                        return Some(t0.elapsed());
                    }
                    let mut b = [0u8; 64];
                    match tokio::time::timeout(Duration::from_millis(300), s.read(&mut b)).await {
                        Ok(Ok(0) | Err(_)) => return Some(t0.elapsed()),
                        Ok(Ok(_)) => return Some(t0.elapsed()), // the 408
                        Err(_) => {}
                    }
                }
                None
            }));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        for _ in 0..5 {
            let (status, took) = health(addr).await;
            assert_eq!(status, 200, "cap {cap}: /health refused under the flood");
            assert!(
                took < Duration::from_secs(1),
                "cap {cap}: /health took {took:?}"
            );
        }
        let loaded = first_token(addr).await;
        let bound = (unloaded * 2).max(Duration::from_millis(100));
        assert!(
            loaded < bound,
            "cap {cap}: first token after {loaded:?} under the flood vs {unloaded:?} unloaded"
        );
        tokio::time::sleep(Duration::from_secs(4)).await;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut cut = 0;
        for a in attackers {
            if let Ok(Some(t)) = a.await {
                cut += usize::from(t < Duration::from_secs(5));
            }
        }
        assert!(
            cut >= cap,
            "cap {cap}: only {cut} slow bodies were cut within 5 s"
        );
    }
}
