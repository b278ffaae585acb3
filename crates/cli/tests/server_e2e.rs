//! End-to-end test of `lamina serve`: starts the real binary with SmolLM2 on
//! the CPU on a free loopback port, waits for `/health`, and runs the
//! pytest-free scripts in tests/python/ with the official `openai` package:
//! `openai_client.py` (chat whole and streamed, completion with stop,
//! logprobs, seed reproducibility, /v1/models, greedy output equal to
//! `lamina generate`), `embeddings.py` (`embeddings.create` single and
//! batched, float and base64, alone vs batched within 1e-3 cosine,
//! `dimensions`, `lamina embed`), `sampling_api.py` (`n` / `best_of` with derived
//! seeds, `logit_bias`, presence / frequency penalties, `stop_token_ids`,
//! `echo`, unknown fields, /detokenize, /version, /openapi.json, /docs),
//! `structured.py` (`response_format` through `chat.completions.parse`,
//! `guided_regex` / `guided_grammar`, tool-calling round trips whole and
//! streamed, bad schemas / grammars / tools refused), `tool_auto.py` (20
//! seeded `auto`-mode tool requests: every call validates against its
//! schema with the `jsonschema` package),
//! `anthropic_api.py` (the Messages API through the official `anthropic`
//! package: plain, streamed, prefilled, stop sequence, tool round trip, count_tokens,
//! Anthropic's error shape), `responses_api.py` (the Responses API: plain,
//! streamed, function tool round trip, `previous_response_id`, stored
//! responses, JSON schema format; the chat API's ignored fields counted,
//! vLLM's metric names) and
//! `load.py` (64 concurrent streams, 32 hang-ups, then /metrics idle)
//! against one server; `bad_input.py` (every malformed request, 401, 413,
//! 429) against a second one configured through `LAMINA_*` environment
//! variables, its API keys from `LAMINA_API_KEY` and `--api-key-file` (never
//! on its command line), and a queue of one. Each server is stopped with
//! SIGTERM and must exit 0.
//!
//! Needs `python3` with `openai` and `anthropic` importable (`cargo xtask
//! test` installs them)
//! and fetches SmolLM2 through the model store on first use. Costs a few
//! minutes on a 2-core CPU, dominated by the load test.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const MODEL: &str = "smollm2-135m-instruct";
const API_KEY: &str = "e2e-secret-key";
/// A second key, from `--api-key-file`.
const SECOND_KEY: &str = "e2e-second-key";
/// Model flags shared by the servers and `lamina generate` (a small KV pool
/// keeps the CPU backend's memory modest).
const MODEL_ARGS: &str = "--model smollm2-135m-instruct --device cpu --kv-blocks 512";
const BODY_LIMIT: usize = 65536;

fn lamina() -> &'static str {
    env!("CARGO_BIN_EXE_lamina")
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    l.local_addr().expect("local addr").port()
}

/// `GET path` over a fresh connection; the status code, or `None` if unreachable.
fn get_status(port: u16, path: &str) -> Option<u16> {
    get_status_with(port, path, "")
}

/// Like [`get_status`] with `Authorization: Bearer <key>`.
fn get_status_auth(port: u16, path: &str, key: &str) -> Option<u16> {
    get_status_with(port, path, &format!("authorization: Bearer {key}\r\n"))
}

fn get_status_with(port: u16, path: &str, headers: &str) -> Option<u16> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let req =
        format!("GET {path} HTTP/1.1\r\nhost: 127.0.0.1\r\n{headers}connection: close\r\n\r\n");
    s.write_all(req.as_bytes()).ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.split_whitespace().nth(1)?.parse().ok()
}

struct Server {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Server {
    fn start(extra: &[&str]) -> Server {
        Self::start_with_env(extra, &[])
    }

    fn start_with_env(extra: &[&str], env: &[(&str, &str)]) -> Server {
        let port = free_port();
        let log =
            std::env::temp_dir().join(format!("lamina-e2e-{}-{port}.log", std::process::id()));
        let child = Command::new(lamina())
            .args(["-v", "serve"])
            .args(MODEL_ARGS.split_whitespace())
            .args(["--port", &port.to_string()])
            .args(extra)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("spawn lamina serve");
        let mut s = Server { child, port, log };
        s.wait_healthy(Duration::from_secs(600));
        s
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn wait_healthy(&mut self, timeout: Duration) {
        let start = Instant::now();
        loop {
            if get_status(self.port, "/health") == Some(200) {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("lamina serve exited early ({status}):\n{}", self.log_text());
            }
            assert!(
                start.elapsed() < timeout,
                "lamina serve not healthy after {timeout:?}:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn python(&self, script: &str, env: &[(&str, String)]) {
        let path = repo_root().join("tests/python").join(script);
        let t0 = Instant::now();
        let status = Command::new("python3")
            .arg(&path)
            .env("LAMINA_BASE_URL", format!("http://127.0.0.1:{}", self.port))
            .env("LAMINA_MODEL", MODEL)
            .env("LAMINA_BIN", lamina())
            .env("LAMINA_MODEL_ARGS", MODEL_ARGS)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .status()
            .expect("run python3");
        eprintln!("{script}: {status} in {:.1}s", t0.elapsed().as_secs_f64());
        if !status.success() {
            let log = self.log_text();
            let tail: Vec<&str> = log.lines().rev().take(60).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            panic!(
                "{script} failed ({status}); server log tail:\n{}",
                tail.join("\n")
            );
        }
    }

    /// SIGTERM; the server must exit 0 within its grace period plus a margin.
    fn terminate(mut self) -> String {
        let pid = self.child.id().to_string();
        let ok = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("run kill");
        assert!(ok.success(), "kill -TERM {pid} failed");
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                let log = self.log_text();
                assert!(
                    status.success(),
                    "lamina serve exited with {status} after SIGTERM:\n{log}"
                );
                let _ = std::fs::remove_file(&self.log);
                return log;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "no exit 60 s after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // only reached on a failed assertion; terminate() waits the child itself
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[test]
fn lamina_serve_end_to_end() {
    let import = Command::new("python3")
        .args(["-c", "import openai"])
        .status()
        .expect("python3 must be installed");
    assert!(
        import.success(),
        "the `openai` Python package is required (pip install openai, or run `cargo xtask test`)"
    );
    // fetch the model once up front, so server start-up below is just loading
    let fetch = Command::new(lamina())
        .args(["tokenize", "--model", MODEL, "hello"])
        .output()
        .expect("run lamina tokenize");
    assert!(
        fetch.status.success(),
        "cannot get {MODEL}: {}",
        String::from_utf8_lossy(&fetch.stderr)
    );

    let server = Server::start(&["--api-key", API_KEY, "--grace", "5"]);
    assert_eq!(get_status(server.port, "/metrics"), Some(200));
    let key = [("LAMINA_API_KEY", API_KEY.to_string())];
    server.python("openai_client.py", &key);
    server.python("embeddings.py", &key);
    server.python("sampling_api.py", &key);
    server.python("structured.py", &key);
    server.python("tool_auto.py", &key);
    server.python("anthropic_api.py", &key);
    server.python("responses_api.py", &key);
    server.python("load.py", &key);
    let log = server.terminate();
    assert!(
        log.contains("request_id"),
        "no request ids in the log:\n{log}"
    );
    assert!(log.contains("lamina: server stopped"), "{log}");

    // configured through the environment: no key on the command line
    let limit = BODY_LIMIT.to_string();
    let key_file = std::env::temp_dir().join(format!("lamina-e2e-keys-{}", std::process::id()));
    std::fs::write(&key_file, format!("# second key\n\n{SECOND_KEY}\n")).expect("key file");
    let key_path = key_file.display().to_string();
    let strict = Server::start_with_env(
        &["--max-num-seqs", "1"],
        &[
            ("LAMINA_API_KEY", API_KEY),
            ("LAMINA_API_KEY_FILE", &key_path),
            ("LAMINA_MAX_QUEUE", "1"),
            ("LAMINA_BODY_LIMIT", &limit),
            ("LAMINA_GRACE", "5"),
        ],
    );
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", strict.child.id())).unwrap_or_default();
    let cmdline = String::from_utf8_lossy(&cmdline);
    assert!(
        !cmdline.contains(API_KEY) && !cmdline.contains(SECOND_KEY),
        "an API key shows in the command line: {cmdline}"
    );
    // both keys are accepted, a wrong one is not
    assert_eq!(
        get_status_auth(strict.port, "/v1/models", API_KEY),
        Some(200)
    );
    assert_eq!(
        get_status_auth(strict.port, "/v1/models", SECOND_KEY),
        Some(200)
    );
    assert_eq!(
        get_status_auth(strict.port, "/v1/models", "nope"),
        Some(401)
    );
    let _ = std::fs::remove_file(&key_file);
    strict.python(
        "bad_input.py",
        &[
            ("LAMINA_API_KEY", API_KEY.to_string()),
            ("LAMINA_BODY_LIMIT", limit.clone()),
        ],
    );
    strict.terminate();
}
