//! LoRA adapters through `lamina serve` (the real binary, the synthetic
//! `tiny` model on the CPU, adapters written in the PEFT layout): adapters
//! from `--lora` and `POST /v1/load_lora_adapter` listed by `/v1/models`
//! with their parent, each request's `model` picking its adapter (the same
//! greedy text as when run alone), adapters loaded and unloaded while
//! requests stream (none fails, none gets another adapter's text), many
//! cycles giving every slot back, bad adapters refused naming what is
//! wrong, unknown adapters 404, the LoRA series in `/metrics`, the
//! endpoints behind the API key; and `lamina generate --lora`.

mod support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use checkpoint::lora::{ADAPTER_CONFIG, ADAPTER_WEIGHTS, PeftSpec, write_peft_adapter};
use contract::lora::LoraTarget;
use serde_json::{Value, json};

const KEY: &str = "lora-test-key";
const BASE: &str = "base";

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// One HTTP/1.0 request (the body ends at close); `(status, body)`.
fn http(
    port: u16,
    method: &str,
    path: &str,
    body: Option<&Value>,
    key: Option<&str>,
) -> (u16, String) {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return (0, String::new()); // not listening (yet)
    };
    s.set_read_timeout(Some(Duration::from_secs(120)))
        .expect("timeout");
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let auth = key
        .map(|k| format!("authorization: Bearer {k}\r\n"))
        .unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.0\r\nhost: 127.0.0.1\r\n{auth}content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).expect("write");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read");
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

fn post(port: u16, path: &str, body: Value) -> (u16, String) {
    http(port, "POST", path, Some(&body), Some(KEY))
}

/// A greedy completion of `model`, streamed or whole: `(status, text)`.
fn complete(port: u16, model: &str, stream: bool) -> (u16, String) {
    let (status, body) = post(
        port,
        "/v1/completions",
        json!({"model": model, "prompt": "Hello there, little model", "max_tokens": 12,
               "temperature": 0, "stream": stream, "ignore_eos": true}),
    );
    if status != 200 {
        return (status, body);
    }
    if !stream {
        let v: Value = serde_json::from_str(&body).expect("json");
        return (
            status,
            v["choices"][0]["text"].as_str().unwrap_or_default().into(),
        );
    }
    let mut text = String::new();
    let mut done = false;
    for line in body.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            done = true;
            continue;
        }
        let v: Value = serde_json::from_str(data).expect("sse json");
        assert!(v.get("error").is_none(), "stream error: {data}");
        text.push_str(v["choices"][0]["text"].as_str().unwrap_or_default());
    }
    assert!(done, "stream did not end with [DONE]: {body}");
    (status, text)
}

struct Server {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Server {
    fn start(model: &Path, extra: &[&str]) -> Server {
        let port = free_port();
        let log =
            std::env::temp_dir().join(format!("lamina-lora-{}-{port}.log", std::process::id()));
        let child = Command::new(support::bin())
            .args([
                "serve",
                "--model",
                model.to_str().expect("path"),
                "--device",
                "cpu",
            ])
            .args([
                "--kv-blocks",
                "256",
                "--port",
                &port.to_string(),
                "--api-key",
                KEY,
            ])
            .args(["--served-model-name", BASE])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .expect("spawn lamina serve");
        let mut s = Server { child, port, log };
        let t0 = Instant::now();
        while http(s.port, "GET", "/health", None, None).0 != 200 {
            if let Ok(Some(st)) = s.child.try_wait() {
                panic!("lamina serve exited ({st}):\n{}", s.log_text());
            }
            assert!(
                t0.elapsed() < Duration::from_secs(300),
                "not healthy:\n{}",
                s.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        s
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn metric(&self, needle: &str) -> Option<String> {
        let (_, m) = http(self.port, "GET", "/metrics", None, None);
        m.lines()
            .find(|l| l.starts_with(needle))
            .map(str::to_string)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

fn adapter(
    model_cfg: &contract::ModelConfig,
    dir: &Path,
    rank: usize,
    targets: &[LoraTarget],
    seed: u64,
) -> PathBuf {
    let spec = PeftSpec {
        rank,
        alpha: 2.0 * rank as f32,
        targets: targets.to_vec(),
        rslora: false,
        seed,
        amp: 0.3,
    };
    write_peft_adapter(dir, model_cfg, &spec).expect("write adapter");
    dir.to_path_buf()
}

/// Sets the first F32 value of `dir`'s adapter weights to NaN.
fn poison(dir: &Path) {
    let path = dir.join(ADAPTER_WEIGHTS);
    let mut bytes = std::fs::read(&path).expect("read");
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    bytes[8 + n..8 + n + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(&path, bytes).expect("write");
}

#[test]
fn lora_adapters_through_the_server() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let model = support::synth_tiny(tmp.path(), "tiny");
    let cfg = checkpoint::loader::load_config(&model)
        .expect("config")
        .config;
    use LoraTarget::*;
    let dirs: Vec<PathBuf> = [
        (4, vec![Q, V], 1),
        (8, LoraTarget::ALL.to_vec(), 2),
        (2, vec![O, Down, Up], 3),
        (16, vec![K, Gate], 4),
    ]
    .into_iter()
    .enumerate()
    .map(|(k, (r, t, seed))| adapter(&cfg, &tmp.path().join(format!("ad{k}")), r, &t, seed))
    .collect();
    let path = |k: usize| dirs[k].to_str().expect("path").to_string();

    // `lamina generate --lora PATH` runs the adapter
    let generate = |extra: &[&str]| {
        let mut args = vec![
            "--prompt",
            "Hello there",
            "--max-tokens",
            "8",
            "--temperature",
            "0",
        ];
        args.extend_from_slice(extra);
        support::ok(&support::generate(
            None,
            model.to_str().expect("path"),
            &args,
            None,
        ))
    };
    let (plain, with_a) = (generate(&[]), generate(&["--lora", &path(0)]));
    assert_ne!(plain, with_a, "generate --lora changed nothing");
    assert_eq!(with_a, generate(&["--lora", &path(0)]));

    let srv = Server::start(
        &model,
        &["--lora", &format!("a={}", path(0)), "--max-loras", "2"],
    );
    let port = srv.port;
    // behind the API key
    let load = |name: &str, p: &str| {
        post(
            port,
            "/v1/load_lora_adapter",
            json!({"lora_name": name, "lora_path": p}),
        )
    };
    let unload = |name: &str| post(port, "/v1/unload_lora_adapter", json!({"lora_name": name}));
    let body = json!({"lora_name": "b", "lora_path": path(1)});
    assert_eq!(
        http(port, "POST", "/v1/load_lora_adapter", Some(&body), None).0,
        401
    );
    assert_eq!(load("b", &path(1)).0, 200);
    assert_eq!(load("c", &path(2)).0, 200);
    let (st, e) = load("c", &path(2));
    assert!(st == 400 && e.contains("already loaded"), "{st} {e}");

    // listed with their parent
    let (_, models) = http(port, "GET", "/v1/models", None, Some(KEY));
    let models: Value = serde_json::from_str(&models).expect("json");
    let ids: Vec<(&str, Value)> = models["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|m| (m["id"].as_str().unwrap_or_default(), m["parent"].clone()))
        .collect();
    assert_eq!(ids[0], (BASE, Value::Null));
    for n in ["a", "b", "c"] {
        assert!(ids.contains(&(n, json!(BASE))), "{n} missing: {models}");
    }

    // each adapter's greedy text, alone; they differ from the base's
    let names = [BASE, "a", "b", "c"];
    let want: Vec<String> = names
        .iter()
        .map(|n| {
            let (st, t) = complete(port, n, false);
            assert_eq!(st, 200, "{n}: {t}");
            t
        })
        .collect();
    for k in 1..4 {
        assert_ne!(want[k], want[0], "adapter {} changes nothing", names[k]);
    }

    // unknown adapters: 404 in OpenAI's shape, naming them
    let (st, e) = complete(port, "nope", false);
    assert!(
        st == 404 && e.contains("`nope`") && e.contains("model_not_found"),
        "{st} {e}"
    );
    let (st, e) = unload("nope");
    assert!(st == 404 && e.contains("`nope`"), "{st} {e}");

    // bad adapters, refused naming what is wrong
    let bad = tmp.path().join("bad");
    let case = |name: &str, make: &dyn Fn(&Path), needles: &[&str]| {
        let d = bad.join(name);
        adapter(&cfg, &d, 4, &[Q, Up], 9);
        make(&d);
        let (st, e) = load(name, d.to_str().expect("path"));
        assert_eq!(st, 400, "{name}: {e}");
        for n in needles {
            assert!(e.contains(n), "{name}: `{n}` not in {e}");
        }
    };
    case(
        "noconfig",
        &|d| std::fs::remove_file(d.join(ADAPTER_CONFIG)).expect("rm"),
        &[ADAPTER_CONFIG, "lora_path"],
    );
    case("nan", &poison, &["non-finite", ".lora_"]);
    case(
        "module",
        &|d| {
            let c = std::fs::read_to_string(d.join(ADAPTER_CONFIG)).expect("read");
            std::fs::write(
                d.join(ADAPTER_CONFIG),
                c.replace("\"up_proj\"", "\"lm_head\""),
            )
            .expect("write");
        },
        &["target_modules[1]"],
    );
    // paths that hold no adapter all get one message, which tells nothing
    // of what exists there
    let plain = tmp.path().join("plain-file");
    std::fs::write(&plain, "x").expect("write");
    let unreachable: Vec<String> = [
        plain.to_str().expect("path").to_string(),
        tmp.path()
            .join("absent")
            .to_str()
            .expect("path")
            .to_string(),
        "/proc/self".to_string(),
    ]
    .iter()
    .map(|p| {
        let (st, e) = load("nowhere", p);
        assert_eq!(st, 400, "{p}: {e}");
        e.replace(p.as_str(), "PATH")
    })
    .collect();
    assert!(
        unreachable.iter().all(|e| *e == unreachable[0]),
        "{unreachable:?}"
    );
    case(
        "shape",
        &|d| {
            let mut other = cfg.clone();
            other.intermediate_size += 8;
            let spec = PeftSpec {
                rank: 4,
                alpha: 8.0,
                targets: vec![Q, Up],
                rslora: false,
                seed: 9,
                amp: 0.1,
            };
            write_peft_adapter(d, &other, &spec).expect("write");
        },
        &["up_proj.lora_B.weight", "shape"],
    );
    case(
        "rank",
        &|d| {
            let spec = PeftSpec {
                rank: 32,
                alpha: 8.0,
                targets: vec![Q],
                rslora: false,
                seed: 9,
                amp: 0.1,
            };
            std::fs::remove_dir_all(d).expect("rm");
            write_peft_adapter(d, &cfg, &spec).expect("write");
        },
        &["--max-lora-rank 16"],
    );
    let (st, e) = load("base", &path(1));
    assert!(st == 400 && e.contains("base model"), "{st} {e}");

    // load and unload `d` while streams of every adapter run: none fails,
    // each gets its own adapter's text; a stream of `d` that was admitted
    // finishes with d's text
    assert_eq!(load("d", &path(3)).0, 200);
    let (st, want_d) = complete(port, "d", false);
    assert_eq!(st, 200);
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let mut joins = Vec::new();
        for t in 0..6 {
            let (want, names, stop, want_d) = (&want, &names, &stop, &want_d);
            joins.push(s.spawn(move || {
                let mut runs = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) || runs < 2 {
                    let k = (t + runs) % 5;
                    runs += 1;
                    if k == 4 {
                        let (st, text) = complete(port, "d", true);
                        assert!(st == 200 || st == 404, "d: {st} {text}");
                        if st == 200 {
                            assert_eq!(&text, want_d, "a stream of d got another text");
                        }
                        continue;
                    }
                    let (st, text) = complete(port, names[k], t % 2 == 0);
                    assert_eq!(st, 200, "{}: {text}", names[k]);
                    assert_eq!(text, want[k], "{} got another adapter's text", names[k]);
                }
                runs
            }));
        }
        for cycle in 0..25 {
            let (st, e) = unload("d");
            assert_eq!(st, 200, "cycle {cycle}: {e}");
            let (st, e) = load("d", &path(3));
            assert_eq!(st, 200, "cycle {cycle}: {e}");
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let total: usize = joins
            .into_iter()
            .map(|j| j.join().expect("stream thread"))
            .sum();
        assert!(total >= 12);
    });

    // the LoRA series
    let info = srv
        .metric("vllm:lora_requests_info{")
        .expect("lora_requests_info");
    assert!(info.contains("max_lora=\"2\""), "{info}");
    assert_eq!(
        srv.metric("lamina_lora_adapters_loaded{").expect("loaded"),
        format!("lamina_lora_adapters_loaded{{model_name=\"{BASE}\"}} 4")
    );
    let a_reqs = srv
        .metric("lamina_lora_requests_total{model_name=\"base\",lora_name=\"a\"}")
        .expect("a count");
    assert!(
        a_reqs
            .split_whitespace()
            .last()
            .and_then(|n| n.parse::<u64>().ok())
            .is_some_and(|n| n >= 2),
        "{a_reqs}"
    );

    // every adapter unloaded: every slot comes back
    for n in ["a", "b", "c", "d"] {
        assert_eq!(unload(n).0, 200, "{n}");
    }
    let slots = format!("lamina_lora_slots_resident{{model_name=\"{BASE}\"}} 0");
    let t0 = Instant::now();
    while srv.metric("lamina_lora_slots_resident{").as_deref() != Some(slots.as_str()) {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "{:?}\n{}",
            srv.metric("lamina_lora_slots_resident{"),
            srv.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        srv.metric("lamina_lora_adapters_loaded{").expect("loaded"),
        format!("lamina_lora_adapters_loaded{{model_name=\"{BASE}\"}} 0")
    );
    let (st, _) = complete(port, "a", false);
    assert_eq!(st, 404);
    let (st, text) = complete(port, BASE, true);
    assert_eq!((st, &text), (200, &want[0]));
}
