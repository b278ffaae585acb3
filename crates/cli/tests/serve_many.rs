//! Several models behind one `lamina serve`: routing by `model` on the
//! three APIs, `/v1/models` and `/models` with each model's state, loading
//! on demand with LRU eviction (`--max-loaded-models`), `keep_alive`,
//! unloading while a request runs (it finishes), the 404 / 409 answers,
//! and load/unload cycles that keep the server's memory bounded.

mod support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

struct Server {
    child: Child,
    log: PathBuf,
    port: u16,
}

impl Server {
    fn start(dir: &Path, models: &[&Path], extra: &[&str]) -> Server {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let log = dir.join(format!("serve-{port}.log"));
        let child = Command::new(support::bin())
            .args(["serve", "--device", "cpu", "--warmup-secs", "0"])
            .args(["--kv-memory-gib", "0.05", "--port", &port.to_string()])
            .args(models)
            .args(extra)
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let server = Server { child, log, port };
        let t0 = Instant::now();
        while http(port, "GET", "/health", "").is_none() {
            let log = std::fs::read_to_string(&server.log).unwrap_or_default();
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "server not up: {log}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        server
    }

    /// `(status, JSON body)` of one request.
    fn call(&self, method: &str, path: &str, body: Value) -> (u16, Value) {
        let body = if body.is_null() {
            String::new()
        } else {
            body.to_string()
        };
        let resp = http(self.port, method, path, &body).unwrap_or_else(|| {
            panic!(
                "no answer to {path}: {}",
                std::fs::read_to_string(&self.log).unwrap()
            )
        });
        parse(&resp)
    }

    /// The state of `model` in `/models`.
    fn state(&self, model: &str) -> String {
        let (_, v) = self.call("GET", "/models", Value::Null);
        let m = v["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["id"] == model);
        m.unwrap_or_else(|| panic!("{model} not in {v}"))["status"]["value"]
            .as_str()
            .unwrap()
            .to_string()
    }

    /// Waits until `model` is in `state`.
    fn wait_state(&self, model: &str, state: &str) {
        let t0 = Instant::now();
        while self.state(model) != state {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "{model} never {state}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn chat(&self, model: &str) -> (u16, Value) {
        let body = json!({"model": model, "max_tokens": 4,
            "messages": [{"role": "user", "content": "hi"}]});
        self.call("POST", "/v1/chat/completions", body)
    }

    /// The server process's resident memory in KiB.
    fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Plain HTTP/1.1 to a local port; the whole response.
fn http(port: u16, method: &str, path: &str, body: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(60))).ok()?;
    let req = format!(
        "{method} {path} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\nconnection: close\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).ok()?;
    let mut bytes = Vec::new();
    let _ = s.read_to_end(&mut bytes);
    (!bytes.is_empty()).then(|| String::from_utf8_lossy(&bytes).into_owned())
}

fn parse(resp: &str) -> (u16, Value) {
    let status: u16 = resp[9..12].parse().unwrap();
    let body = &resp[resp.find("\r\n\r\n").unwrap() + 4..];
    (
        status,
        serde_json::from_str(body.trim()).unwrap_or(Value::Null),
    )
}

/// Two synthetic models (`tiny` of two seeds) in `dir`.
fn two_models(dir: &Path) -> (PathBuf, PathBuf) {
    let a = support::synth_tiny(dir, "alpha");
    let b = dir.join("beta");
    support::ok(&support::lamina(&[
        "synth-model",
        "--preset",
        "tiny",
        "--seed",
        "5",
        "--out",
        b.to_str().unwrap(),
    ]));
    (a, b)
}

#[test]
fn two_models_answer_by_name_on_every_api() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = two_models(dir.path());
    let srv = Server::start(dir.path(), &[&a, &b], &[]);
    let (code, v) = srv.chat("alpha");
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["model"], "alpha");
    let (code, v) = srv.call(
        "POST",
        "/v1/completions",
        json!({"model": "beta", "prompt": "hello", "max_tokens": 3}),
    );
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["model"], "beta");
    let (code, v) = srv.call(
        "POST",
        "/v1/messages",
        json!({"model": "beta", "max_tokens": 3,
               "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["model"], "beta");
    let (code, v) = srv.call(
        "POST",
        "/v1/responses",
        json!({"model": "alpha", "input": "hi", "max_output_tokens": 3}),
    );
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["model"], "alpha");
    // the two models differ: the same greedy prompt gives different tokens
    let greedy = |m: &str| {
        let (_, v) = srv.call(
            "POST",
            "/v1/completions",
            json!({"model": m, "prompt": [1, 2, 3], "max_tokens": 6,
                   "temperature": 0, "ignore_eos": true}),
        );
        v["choices"][0]["text"].clone()
    };
    assert_ne!(greedy("alpha"), greedy("beta"));
    let (_, v) = srv.call("GET", "/v1/models", Value::Null);
    let ids: Vec<&str> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["alpha", "beta"]);
    for m in v["data"].as_array().unwrap() {
        assert_eq!(m["status"]["value"], "loaded", "{m}");
        assert_eq!(m["owned_by"], "lamina", "{m}");
    }
    let (code, v) = srv.chat("gamma");
    assert_eq!(code, 404, "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("`gamma`") && msg.contains("`alpha`") && msg.contains("`beta`"),
        "{msg}"
    );
    let (code, v) = srv.call("POST", "/models/unload", json!({"model": "gamma"}));
    assert_eq!(code, 404, "{v}");
    let resp = http(srv.port, "GET", "/metrics", "").unwrap();
    for m in ["alpha", "beta"] {
        assert!(
            resp.contains(&format!("lamina_model_loaded{{model_name=\"{m}\"}} 1")),
            "{resp}"
        );
        assert!(
            resp.contains(&format!(
                "lamina_requests_finished_total{{model_name=\"{m}\",finished_reason=\"length\"}}"
            )),
            "{resp}"
        );
    }
    assert_eq!(
        resp.matches("# TYPE lamina_num_requests_running gauge")
            .count(),
        1,
        "one family header for both models"
    );
    let url = format!("http://127.0.0.1:{}", srv.port);
    let ps = support::ok(&support::run(None, &["ps", "--url", &url], None));
    assert!(
        ps.contains("alpha") && ps.contains("beta") && ps.contains("loaded"),
        "{ps}"
    );
}

#[test]
fn models_load_on_demand_and_the_least_recently_used_is_evicted() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = two_models(dir.path());
    let srv = Server::start(dir.path(), &[&a, &b], &["--max-loaded-models", "1"]);
    assert_eq!(srv.state("alpha"), "loaded");
    assert_eq!(srv.state("beta"), "unloaded");
    let (code, v) = srv.chat("beta");
    assert_eq!(code, 200, "{v} {}", srv.log());
    srv.wait_state("alpha", "unloaded");
    assert_eq!(srv.state("beta"), "loaded");
    let (code, v) = srv.chat("alpha");
    assert_eq!(code, 200, "{v}");
    srv.wait_state("beta", "unloaded");
    // keep_alive 0: unloaded as soon as the request ends
    let body = json!({"model": "alpha", "prompt": "x", "max_tokens": 2, "keep_alive": 0});
    let (code, v) = srv.call("POST", "/v1/completions", body);
    assert_eq!(code, 200, "{v}");
    srv.wait_state("alpha", "unloaded");
    let body = json!({"model": "alpha", "prompt": "x", "max_tokens": 2, "keep_alive": "soon"});
    let (code, v) = srv.call("POST", "/v1/completions", body);
    assert_eq!(code, 400, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("soon"),
        "{v}"
    );
}

#[test]
fn without_autoload_an_unloaded_model_is_a_409_until_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = two_models(dir.path());
    let srv = Server::start(
        dir.path(),
        &[&a, &b],
        &["--max-loaded-models", "1", "--no-models-autoload"],
    );
    let (code, v) = srv.chat("beta");
    assert_eq!(code, 409, "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("`beta`") && msg.contains("/models/load"),
        "{msg}"
    );
    let (code, v) = srv.call("POST", "/models/load", json!({"model": "beta"}));
    assert_eq!(code, 200, "{v}");
    assert_eq!(srv.state("beta"), "loaded");
    srv.wait_state("alpha", "unloaded");
    let (code, v) = srv.chat("beta");
    assert_eq!(code, 200, "{v}");
    let (code, v) = srv.call("POST", "/models/load", json!({"model": "delta"}));
    assert_eq!(code, 404, "{v}");
}

#[test]
fn a_request_running_on_a_model_being_unloaded_finishes() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = two_models(dir.path());
    let srv = Server::start(dir.path(), &[&a, &b], &[]);
    let port = srv.port;
    let long = std::thread::spawn(move || {
        let body = json!({"model": "alpha", "prompt": "go", "max_tokens": 200,
                          "ignore_eos": true, "stream": true});
        http(port, "POST", "/v1/completions", &body.to_string()).unwrap()
    });
    let t0 = Instant::now();
    loop {
        let (_, v) = srv.call("GET", "/models", Value::Null);
        if v["data"][0]["running"].as_u64() == Some(1) {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the request never ran"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let (code, v) = srv.call("POST", "/models/unload", json!({"model": "alpha"}));
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["status"], "unloading", "{v}");
    let stream = long.join().unwrap();
    assert!(stream.contains("data: [DONE]"), "{stream}");
    assert!(!stream.contains("\"error\""), "{stream}");
    assert!(
        stream.contains("\"finish_reason\":\"length\""),
        "it ran to its max_tokens: {stream}"
    );
    srv.wait_state("alpha", "unloaded");
    // the other model served all along; the unloaded one loads again
    assert_eq!(srv.chat("beta").0, 200);
    assert_eq!(srv.chat("alpha").0, 200);
}

#[test]
fn load_unload_cycles_lose_no_request_and_keep_memory_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = two_models(dir.path());
    let srv = Server::start(dir.path(), &[&a, &b], &[]);
    let cycle = |i: usize| {
        let (code, v) = srv.call("POST", "/models/unload", json!({"model": "beta"}));
        assert_eq!(code, 200, "cycle {i}: {v}");
        srv.wait_state("beta", "unloaded");
        let (code, v) = srv.chat("beta");
        assert_eq!(code, 200, "cycle {i}: {v}");
        let (code, v) = srv.chat("alpha");
        assert_eq!(code, 200, "cycle {i}: {v}");
    };
    for i in 0..5 {
        cycle(i);
    }
    let before = srv.rss_kib();
    for i in 5..50 {
        cycle(i);
    }
    let after = srv.rss_kib();
    // one load of the tiny model is a few MiB; 45 leaked loads would be far more
    let bound = before + before / 10 + 16 * 1024;
    assert!(
        after <= bound,
        "RSS grew from {before} KiB to {after} KiB over 45 load/unload cycles (bound {bound})"
    );
}
