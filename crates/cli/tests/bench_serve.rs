//! `lamina bench-serve` end to end on the CPU: a tiny synthetic model behind
//! `lamina serve`, a small sweep (all at once, then Poisson at 40 req/s),
//! and the JSON report checked against what was asked. Also: an unreachable
//! server is one clear error line.

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
