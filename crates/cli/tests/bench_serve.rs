//! `lamina bench-serve` end to end on the CPU: a tiny synthetic model behind
//! `lamina serve`, a small sweep (all at once, then Poisson at 40 req/s),
//! and the JSON report checked against what was asked. Also: an unreachable
//! server is one clear error line, and `--logprobs` times tokens that have
//! no text.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn lamina() -> &'static str {
    env!("CARGO_BIN_EXE_lamina")
}

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    l.local_addr().expect("local addr").port()
}

struct Killed(Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn synth_tiny(dir: &Path) {
    let ok = Command::new(lamina())
        .args(["synth-model", "--preset", "tiny", "--seed", "3", "--out"])
        .arg(dir)
        .stdout(Stdio::null())
        .status()
        .expect("run synth-model");
    assert!(ok.success());
}

fn serve(model: &Path, port: u16) -> Killed {
    serve_with(model, port, &[])
}

fn serve_with(model: &Path, port: u16, extra: &[&str]) -> Killed {
    let child = Command::new(lamina())
        .args([
            "serve",
            "--device",
            "cpu",
            "--port",
            &port.to_string(),
            "--model",
        ])
        .arg(model)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn lamina serve");
    let server = Killed(child);
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(start.elapsed() < Duration::from_secs(60), "server not up");
        std::thread::sleep(Duration::from_millis(100));
    }
    server
}

#[test]
fn bench_serve_reports_every_request_of_a_sweep() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let model: PathBuf = tmp.path().join("tiny");
    synth_tiny(&model);
    let port = free_port();
    let _server = serve(&model, port);
    let json = tmp.path().join("bench.json");
    let out = Command::new(lamina())
        .args(["bench-serve", "--url", &format!("http://127.0.0.1:{port}")])
        .args([
            "--num-prompts",
            "10",
            "--request-rate",
            "inf,40",
            "--warmup",
            "3",
        ])
        .args([
            "--input-len",
            "5:40",
            "--output-len",
            "3:9",
            "--max-token-id",
            "250",
        ])
        .arg("--json")
        .arg(&json)
        .output()
        .expect("run bench-serve");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("rate inf req/s") && stdout.contains("rate 40 req/s"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("3 warm-up requests"), "{stderr}");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json written"))
            .expect("valid json");
    let runs = doc["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 2);
    for r in runs {
        assert_eq!(r["completed"], 10, "{r}");
        assert_eq!(r["failed"], 0, "{r}");
        // ignore_eos: every request produced exactly what it asked for
        assert_eq!(r["output_tokens"], r["output_tokens_requested"], "{r}");
        let ttft = &r["ttft_ms"];
        let (p50, p99) = (ttft["p50"].as_f64(), ttft["p99"].as_f64());
        assert!(p50 > Some(0.0) && p50 <= p99, "{r}");
        assert!(r["output_throughput"].as_f64() > Some(0.0));
    }
    // the Poisson run is spread out: it lasts at least most of 10 arrivals at 40/s
    assert!(runs[1]["duration_s"].as_f64() > Some(0.05), "{}", runs[1]);
}

/// A server whose every token decodes to no text (as a synthetic model's
/// filler tokens): each completion streams two tokens, with their
/// log-probabilities when the request asks for them.
fn textless_server() -> u16 {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("local addr").port();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let mut reader = BufReader::new(conn);
            let (mut head, mut len) = (String::new(), 0usize);
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap_or(0);
                }
                head.push_str(&line);
            }
            let mut body = vec![0u8; len];
            let _ = reader.read_exact(&mut body);
            let mut conn = reader.into_inner();
            if !head.starts_with("POST /v1/completions") {
                let _ = conn.write_all(
                    b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                );
                continue;
            }
            let logprobs = String::from_utf8_lossy(&body).contains("\"logprobs\":0");
            let lp = if logprobs {
                r#","logprobs":{"tokens":["<|f|>"]}"#
            } else {
                ""
            };
            let _ = conn.write_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n",
            );
            for _ in 0..2 {
                std::thread::sleep(Duration::from_millis(20));
                let ev = format!("data: {{\"choices\":[{{\"index\":0,\"text\":\"\"{lp}}}]}}\n\n");
                let _ = conn.write_all(ev.as_bytes());
            }
            let _ = conn.write_all(
                b"data: {\"choices\":[],\"usage\":{\"completion_tokens\":2}}\n\ndata: [DONE]\n\n",
            );
        }
    });
    port
}

/// Tokens without text stream no text: no TTFT without `--logprobs`; with
/// it each token arrives with its log-probability and is timed.
#[test]
fn bench_serve_logprobs_times_tokens_without_text() {
    let port = textless_server();
    let tmp = tempfile::tempdir().expect("tempdir");
    let ttft = |extra: &[&str]| {
        let json = tmp.path().join("bench.json");
        let out = Command::new(lamina())
            .args(["bench-serve", "--url", &format!("http://127.0.0.1:{port}")])
            .args(["--model", "m", "--num-prompts", "3", "--input-len", "4"])
            .args(["--output-len", "2"])
            .args(extra)
            .arg("--json")
            .arg(&json)
            .output()
            .expect("run bench-serve");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let doc: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).expect("json written"))
                .expect("valid json");
        let r = doc["runs"][0].clone();
        assert_eq!(r["completed"], 3, "{r}");
        r["ttft_ms"]["p50"].as_f64()
    };
    assert_eq!(ttft(&[]), Some(0.0));
    let first = ttft(&["--logprobs"]);
    assert!(first >= Some(15.0), "{first:?}");
}

/// Two CPU replicas of a tiny synthetic model (`--data-parallel-size 2`):
/// prompts sharing a 64-token prefix all land on the replica the first one
/// went to; short unrelated prompts (no full KV block to be affine to)
/// spread over both. bench-serve reports the per-replica load.
#[test]
fn two_cpu_replicas_route_by_prefix_and_by_load() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let model: PathBuf = tmp.path().join("tiny");
    synth_tiny(&model);
    let port = free_port();
    let _server = serve_with(&model, port, &["--data-parallel-size", "2"]);
    let bench = |extra: &[&str]| {
        let out = Command::new(lamina())
            .args(["bench-serve", "--url", &format!("http://127.0.0.1:{port}")])
            .args([
                "--num-prompts",
                "12",
                "--output-len",
                "4",
                "--max-token-id",
                "250",
            ])
            .args(extra)
            .output()
            .expect("run bench-serve");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    };
    let shared = bench(&[
        "--shared-prefix",
        "64",
        "--input-len",
        "4:12",
        "--request-rate",
        "40",
    ]);
    let lines: Vec<&str> = shared.lines().filter(|l| l.contains("engine ")).collect();
    assert_eq!(lines.len(), 2, "{shared}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("12 requests (11 by prefix, 1 by load)")),
        "{shared}"
    );
    assert!(lines.iter().any(|l| l.contains(": 0 requests")), "{shared}");
    let spread = bench(&["--input-len", "4:12", "--request-rate", "inf"]);
    for l in spread.lines().filter(|l| l.contains("engine ")) {
        assert!(
            l.contains(" by prefix") && !l.contains(": 0 requests"),
            "{spread}"
        );
    }
}

#[test]
fn bench_serve_names_an_unreachable_server() {
    let port = free_port();
    let out = Command::new(lamina())
        .args(["bench-serve", "--url", &format!("http://127.0.0.1:{port}")])
        .args(["--num-prompts", "1"])
        .output()
        .expect("run bench-serve");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot reach the server") && err.contains(&port.to_string()),
        "{err}"
    );
}
