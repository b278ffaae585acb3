//! `lamina serve` as someone trying it meets it: one log line per finished
//! request and a throughput line while busy at the default level
//! (`--log-requests false` turns the first off), and the chat page at `/`
//! for a browser, loaded in headless Chromium where one is installed
//! (`LAMINA_CHROMIUM`, else `chromium` / `chromium-browser` /
//! `google-chrome` on the PATH; `LAMINA_REQUIRE_BROWSER=1` makes its
//! absence a failure): it sends a message and shows the streamed reply.

mod support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Server {
    child: Child,
    log: PathBuf,
    port: u16,
}

impl Server {
    fn start(model: &Path, extra: &[&str]) -> Server {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let log = model.parent().unwrap().join(format!("serve-{port}.log"));
        let child = Command::new(support::bin())
            .args(["serve", "--device", "cpu", "--port", &port.to_string()])
            .arg(model)
            .args(extra)
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let server = Server { child, log, port };
        let t0 = Instant::now();
        while server.http("GET", "/health", &[], "").is_none() {
            assert!(t0.elapsed() < Duration::from_secs(60), "server not up");
            std::thread::sleep(Duration::from_millis(100));
        }
        server
    }

    fn http(&self, method: &str, path: &str, headers: &[&str], body: &str) -> Option<String> {
        Probe(self.port).http(method, path, headers, body)
    }

    fn chat(&self) -> String {
        let body = r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":5,"stream":true}"#;
        let h = ["content-type: application/json"];
        self.http("POST", "/v1/chat/completions", &h, body).unwrap()
    }

    /// Stops the server; returns its log.
    fn stop(self) -> String {
        let log = self.log.clone();
        drop(self);
        std::fs::read_to_string(log).unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Plain HTTP/1.1 to a local port.
struct Probe(u16);

impl Probe {
    fn http(&self, method: &str, path: &str, headers: &[&str], body: &str) -> Option<String> {
        let mut s = TcpStream::connect(("127.0.0.1", self.0)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nhost: 127.0.0.1:{}\r\nconnection: close\r\n",
            self.0
        );
        for h in headers {
            req.push_str(h);
            req.push_str("\r\n");
        }
        req.push_str(&format!("content-length: {}\r\n\r\n{body}", body.len()));
        s.write_all(req.as_bytes()).ok()?;
        // (a server that keeps the connection open ends the read by timeout)
        let mut bytes = Vec::new();
        let _ = s.read_to_end(&mut bytes);
        (!bytes.is_empty()).then(|| String::from_utf8_lossy(&bytes).into_owned())
    }
}

fn tiny(dir: &Path) -> PathBuf {
    support::synth_tiny(dir, "tiny")
}

#[test]
fn requests_and_throughput_are_logged_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny(dir.path());
    let server = Server::start(&model, &["--log-stats-interval", "0.2"]);
    assert!(server.chat().contains("data: [DONE]"));
    std::thread::sleep(Duration::from_millis(600));
    let log = server.stop();
    let line = log
        .lines()
        .find(|l| l.contains("request finished"))
        .unwrap_or_else(|| panic!("no request line: {log}"));
    for field in [
        "request_id=",
        "prompt_tokens=",
        "completion_tokens=5",
        "ttft_ms=",
        "e2e_ms=",
        "finish_reason=\"length\"",
    ] {
        assert!(line.contains(field), "{field} missing: {line}");
    }
    assert!(
        log.contains("lamina::stats") && log.contains("generation") && log.contains("tok/s"),
        "{log}"
    );

    let server = Server::start(
        &model,
        &["--log-requests", "false", "--log-stats-interval", "0"],
    );
    assert!(server.chat().contains("data: [DONE]"));
    let log = server.stop();
    assert!(
        !log.contains("request finished") && !log.contains("lamina::stats"),
        "{log}"
    );
}

#[test]
fn the_chat_page_is_served_at_root_for_a_browser() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny(dir.path());
    let server = Server::start(&model, &[]);
    let page = server
        .http(
            "GET",
            "/",
            &["accept: text/html,application/xhtml+xml,*/*;q=0.8"],
            "",
        )
        .unwrap();
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(
        page.to_ascii_lowercase()
            .contains("content-type: text/html"),
        "{page}"
    );
    for part in [
        "/v1/chat/completions",
        "stream: true",
        "getReader",
        "AbortController",
        "id=\"stop\"",
        "id=\"temperature\"",
        "id=\"system\"",
    ] {
        assert!(page.contains(part), "{part} missing from the page");
    }
    // API clients still get the JSON index
    let json = server.http("GET", "/", &[], "").unwrap();
    assert!(json.contains("\"name\":\"lamina\""), "{json}");

    match chromium() {
        Some(browser) => browser_sends_and_streams(&browser, server.port),
        None if std::env::var_os("LAMINA_REQUIRE_BROWSER").is_some() => {
            panic!("LAMINA_REQUIRE_BROWSER is set but no Chromium was found")
        }
        None => eprintln!("no Chromium found: the page was checked over HTTP only"),
    }
    server.stop();
}

/// Headless Chromium opens `/#message=Hello`, which sends it; the page's
/// title, read over the DevTools HTTP endpoint, reports the finished
/// streamed reply and its token count. The page's default `max_tokens`
/// (1024) is beyond the tiny model's 512-token context, so the page must
/// fit the reply into the room the conversation leaves.
fn browser_sends_and_streams(browser: &Path, port: u16) {
    let profile = tempfile::tempdir().unwrap();
    let mut child = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--remote-debugging-port=0",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("http://127.0.0.1:{port}/#message=Hello"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let mut last = String::new();
    let title = loop {
        if t0.elapsed() > Duration::from_secs(90) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
        let Ok(active) = std::fs::read_to_string(profile.path().join("DevToolsActivePort")) else {
            continue;
        };
        let Some(Ok(devtools)) = active.lines().next().map(str::parse::<u16>) else {
            continue;
        };
        let Some(list) = Probe(devtools).http("GET", "/json/list", &[], "") else {
            continue;
        };
        last = list;
        let found = last
            .split("\"title\": \"")
            .skip(1)
            .find(|t| t.starts_with("lamina chat (last reply: "));
        if let Some(t) = found {
            break Some(t.split('"').next().unwrap_or_default().to_string());
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    let title = title.unwrap_or_else(|| panic!("the reply did not finish in the browser: {last}"));
    let tokens: usize = title
        .trim_start_matches("lamina chat (last reply: ")
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(tokens > 0, "{title}");
}

fn chromium() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("LAMINA_CHROMIUM") {
        return Some(p.into());
    }
    let path = std::env::var_os("PATH")?;
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .flat_map(|name| std::env::split_paths(&path).map(move |d| d.join(name)))
        .find(|p| p.is_file())
}

/// At start every step shape is warmed up and then forgotten (no counted
/// tokens); a request without `max_tokens` stops at `--max-tokens-default`
/// while one that asks more gets it; `lamina ps` lists the served model.
#[test]
fn warm_up_at_start_and_a_default_reply_cap() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny(dir.path());
    let server = Server::start(
        &model,
        &["--warmup-secs", "60", "--max-tokens-default", "7"],
    );
    let metrics = server.http("GET", "/metrics", &[], "").unwrap();
    let counted = metrics
        .lines()
        .find(|l| l.starts_with("lamina_prompt_tokens_total"))
        .unwrap_or_else(|| panic!("{metrics}"));
    assert!(
        counted.ends_with(" 0"),
        "the warm-up is not counted: {counted}"
    );
    let h = ["content-type: application/json"];
    let tokens = |body: &str| -> u64 {
        let resp = server.http("POST", "/v1/completions", &h, body).unwrap();
        let json = &resp[resp.find("\r\n\r\n").unwrap() + 4..];
        let v: serde_json::Value =
            serde_json::from_str(json.trim()).unwrap_or_else(|e| panic!("{e}: {resp}"));
        v["usage"]["completion_tokens"]
            .as_u64()
            .unwrap_or_else(|| panic!("{v}"))
    };
    assert_eq!(tokens(r#"{"prompt":"hello","ignore_eos":true}"#), 7);
    assert_eq!(
        tokens(r#"{"prompt":"hello","ignore_eos":true,"max_tokens":12}"#),
        12
    );
    let url = format!("http://127.0.0.1:{}", server.port);
    let ps = support::ok(&support::run(None, &["ps", "--url", &url], None));
    assert!(ps.contains("tiny") && ps.contains("512"), "{ps}");
    let log = server.stop();
    let line = log
        .lines()
        .find(|l| l.contains("warmed up"))
        .unwrap_or_else(|| panic!("no warm-up line: {log}"));
    assert!(
        line.contains("step shapes") && !line.contains("ran out"),
        "{line}"
    );
    let help = support::ok(&support::lamina(&["serve", "--help"]));
    assert!(
        help.contains("--max-tokens-default") && help.contains("[default: 4096]"),
        "{help}"
    );
    assert!(help.contains("--warmup-secs"), "{help}");
}
