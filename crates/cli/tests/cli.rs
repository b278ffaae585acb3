//! End-to-end tests of the `lamina` binary: the first-run command on the real
//! SmolLM2, tokenization, reproducible sampling, and each kind of bad input
//! giving a non-zero exit with one clear line naming the cause and no panic.

mod support;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::OnceLock;

use support::{clear_error as assert_clear_error, lamina, stderr, stdout};

/// `lamina generate --device cpu --model DIR ARGS...`.
fn generate_on(model: &Path, args: &[&str]) -> Output {
    let mut all = vec![
        "generate",
        "--device",
        "cpu",
        "--model",
        model.to_str().unwrap(),
    ];
    all.extend_from_slice(args);
    lamina(&all)
}

/// A `tiny` synthetic model written once per test run through the CLI itself.
fn tiny() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("lamina-cli-tiny-{}", std::process::id()));
        // a run of an earlier process with the same id may have left it
        let _ = std::fs::remove_dir_all(&dir);
        let out = lamina(&[
            "synth-model",
            "--preset",
            "tiny",
            "--seed",
            "3",
            "--out",
            dir.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "synth-model failed: {}", stderr(&out));
        dir
    })
}

/// A private copy of the tiny model to break.
fn tiny_copy(name: &str) -> PathBuf {
    let dst = std::env::temp_dir().join(format!("lamina-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dst);
    std::fs::create_dir_all(&dst).unwrap();
    for entry in std::fs::read_dir(tiny()).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dst.join(entry.file_name())).unwrap();
    }
    dst
}

fn gen_json(model: &Path, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["--json"];
    args.extend_from_slice(extra);
    let out = generate_on(model, &args);
    assert!(out.status.success(), "generate failed: {}", stderr(&out));
    serde_json::from_str(stdout(&out).trim()).expect("one JSON object")
}

#[test]
fn first_run_command_says_paris() {
    // the README's main command, on the default model (fetched on first use)
    let out = lamina(&[
        "generate",
        "--device",
        "cpu",
        "--max-tokens",
        "8",
        "--temperature",
        "0",
        "The capital of France is",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("Paris"), "got: {}", stdout(&out));
}

#[test]
fn json_output_has_every_field_and_logprobs() {
    let v = gen_json(
        tiny(),
        &[
            "--max-tokens",
            "5",
            "--temperature",
            "0",
            "--logprobs",
            "3",
            "--ignore-eos",
            "hello",
        ],
    );
    let tokens = v["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), 5);
    assert_eq!(v["finish_reason"], "length");
    assert!(v["prompt_tokens"].as_array().unwrap().len() > 1);
    assert!(v["text"].is_string());
    let lps = v["logprobs"].as_array().unwrap();
    assert_eq!(lps.len(), 5);
    for (row, tok) in lps.iter().zip(tokens) {
        let row = row.as_array().unwrap();
        assert_eq!(row.len(), 3);
        assert_eq!(&row[0][0], tok, "the chosen token comes first");
        // greedy: the chosen token is the most likely one
        assert!(row[0][1].as_f64().unwrap() >= row[1][1].as_f64().unwrap());
    }
}

#[test]
fn seeded_sampling_is_reproducible_and_greedy_is_temperature_zero() {
    let args = [
        "--max-tokens",
        "12",
        "--temperature",
        "1.0",
        "--seed",
        "1234",
        "--ignore-eos",
        "--prompt-tokens",
        "5,6,7",
    ];
    let a = gen_json(tiny(), &args);
    let b = gen_json(tiny(), &args);
    assert_eq!(a["tokens"], b["tokens"]);
    let other = gen_json(
        tiny(),
        &[
            "--max-tokens",
            "12",
            "--temperature",
            "1.0",
            "--seed",
            "99",
            "--ignore-eos",
            "--prompt-tokens",
            "5,6,7",
        ],
    );
    assert_ne!(
        a["tokens"], other["tokens"],
        "a different seed should change a 12-token sample"
    );
    let greedy = gen_json(
        tiny(),
        &[
            "--max-tokens",
            "12",
            "--temperature",
            "0",
            "--ignore-eos",
            "--prompt-tokens",
            "5,6,7",
        ],
    );
    let top1 = gen_json(
        tiny(),
        &[
            "--max-tokens",
            "12",
            "--temperature",
            "0.8",
            "--top-k",
            "1",
            "--seed",
            "5",
            "--ignore-eos",
            "--prompt-tokens",
            "5,6,7",
        ],
    );
    assert_eq!(greedy["tokens"], top1["tokens"]);
}

#[test]
fn prompts_file_runs_all_in_input_order() {
    let file = std::env::temp_dir().join(format!("lamina-prompts-{}.txt", std::process::id()));
    std::fs::write(&file, "a\nlonger prompt here\n\nb c\n").unwrap();
    let out = lamina(&[
        "generate",
        "--device",
        "cpu",
        "--json",
        "--temperature",
        "0",
        "--max-tokens",
        "4",
        "--ignore-eos",
        "--model",
        tiny().to_str().unwrap(),
        "--prompts-file",
        file.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let rows: Vec<serde_json::Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 3);
    for (row, prompt) in rows.iter().zip(["a", "longer prompt here", "b c"]) {
        let alone = gen_json(
            tiny(),
            &[
                "--temperature",
                "0",
                "--max-tokens",
                "4",
                "--ignore-eos",
                prompt,
            ],
        );
        assert_eq!(row["tokens"], alone["tokens"], "prompt {prompt:?}");
        assert_eq!(row["prompt_tokens"], alone["prompt_tokens"]);
    }
}

#[test]
fn tokenize_prints_ids_with_bos() {
    let out = lamina(&["tokenize", "--model", tiny().to_str().unwrap(), "hi"]);
    assert!(out.status.success(), "{}", stderr(&out));
    // the tiny byte-level tokenizer: BOS 256, then the two bytes, in the
    // form `--prompt-tokens` takes
    assert_eq!(stdout(&out).trim(), "256,104,105");
}

#[test]
fn missing_model_directory() {
    let out = generate_on(Path::new("/nonexistent/lamina-model"), &["hi"]);
    assert_clear_error(
        &out,
        &[
            "no model at /nonexistent/lamina-model",
            "no such file",
            "model directory",
        ],
    );
}

#[test]
fn truncated_safetensors() {
    let dir = tiny_copy("truncated");
    let file = dir.join("model.safetensors");
    let len = std::fs::metadata(&file).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
    f.set_len(len / 2).unwrap();
    let out = generate_on(&dir, &["hi"]);
    assert_clear_error(&out, &["model.safetensors"]);
    assert!(
        stderr(&out).contains("model."),
        "names a tensor: {}",
        stderr(&out)
    );
}

#[test]
fn tensor_with_wrong_shape() {
    // the config now says the MLP is wider than the stored tensors
    let dir = tiny_copy("shape");
    let cfg_path = dir.join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    let inter = cfg["intermediate_size"].as_u64().unwrap();
    cfg["intermediate_size"] = (inter + 8).into();
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let out = generate_on(&dir, &["hi"]);
    assert_clear_error(&out, &["model.safetensors", "mlp", "shape"]);
}

/// Zeroes one tensor of a model's `model.safetensors` in place.
fn zero_tensor(dir: &Path, name: &str) {
    let path = dir.join("model.safetensors");
    let mut bytes = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let offs = &header[name]["data_offsets"];
    let (a, b) = (
        offs[0].as_u64().unwrap() as usize,
        offs[1].as_u64().unwrap() as usize,
    );
    bytes[8 + n + a..8 + n + b].fill(0);
    std::fs::write(&path, bytes).unwrap();
}

/// Weights that load but collapse every logit to one value (a zero final
/// norm) end the generation with an error naming the model and the cause,
/// never an empty completion and exit 0; over HTTP, a 500 naming them.
#[test]
fn collapsed_logits_are_an_error_naming_the_model() {
    let dir = tiny_copy("collapsed");
    zero_tensor(&dir, "model.norm.weight");
    for dtype in ["bf16", "q8_0"] {
        let out = generate_on(&dir, &["--dtype", dtype, "--max-tokens", "4", "hi"]);
        let line = stderr(&out);
        assert!(!out.status.success(), "{dtype}: {line}");
        assert!(
            line.contains("degenerate logits") && line.contains("lamina-cli-collapsed"),
            "{dtype}: {line}"
        );
    }
    let reply = serve_one_completion(&dir);
    assert!(reply.starts_with("HTTP/1.1 500"), "{reply}");
    assert!(
        reply.contains("degenerate logits") && reply.contains("lamina-cli-collapsed"),
        "{reply}"
    );
}

/// Starts `lamina serve` on `model` (CPU), sends one completion and
/// returns the raw reply; the server is killed afterwards.
fn serve_one_completion(model: &Path) -> String {
    use std::io::{Read, Write};
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let mut child = std::process::Command::new(support::bin())
        .args([
            "serve",
            "--device",
            "cpu",
            "--model",
            model.to_str().unwrap(),
        ])
        .args(["--port", &port.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let body = r#"{"prompt": "hi", "max_tokens": 4}"#;
    let req = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let t0 = std::time::Instant::now();
    let reply = loop {
        if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            let mut out = String::new();
            if s.write_all(req.as_bytes()).is_ok() && s.read_to_string(&mut out).is_ok() {
                break out;
            }
        }
        assert!(t0.elapsed().as_secs() < 120, "no reply from lamina serve");
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    let _ = child.kill();
    let _ = child.wait();
    reply
}

#[test]
fn malformed_config_json() {
    let dir = tiny_copy("config");
    std::fs::write(dir.join("config.json"), "{\"hidden_size\": 64,").unwrap();
    let out = generate_on(&dir, &["hi"]);
    assert_clear_error(&out, &["config.json"]);
}

#[test]
fn prompt_longer_than_context() {
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(tiny().join("config.json")).unwrap())
            .unwrap();
    let ctx = cfg["max_position_embeddings"].as_u64().unwrap() as usize;
    let ids = vec!["7"; ctx + 10].join(",");
    let out = generate_on(tiny(), &["--prompt-tokens", &ids]);
    assert_clear_error(&out, &["prompt", &ctx.to_string()]);
}

#[test]
fn top_p_out_of_range() {
    let out = generate_on(tiny(), &["--top-p", "1.5", "hi"]);
    assert_clear_error(&out, &["--top-p", "1.5"]);
}

#[test]
fn zero_max_tokens_names_the_flag() {
    // the engine's check, under the flag's name
    let out = generate_on(tiny(), &["--max-tokens", "0", "hi"]);
    assert_clear_error(&out, &["--max-tokens", "at least 1"]);
}

#[test]
fn cuda_without_a_gpu_says_why() {
    if model::cuda::available().is_ok() {
        return; // a GPU machine: nothing to check here
    }
    let out = lamina(&[
        "generate",
        "--device",
        "cuda",
        "--model",
        tiny().to_str().unwrap(),
        "hi",
    ]);
    assert_clear_error(&out, &["--device cuda is unavailable"]);
}

#[test]
fn dtype_quantises_on_the_fast_kernels_and_is_refused_on_the_reference_ones() {
    for dtype in ["q8_0", "q4_1", "q4_k", "bf16", "auto"] {
        let out = generate_on(
            tiny(),
            &[
                "--dtype",
                dtype,
                "--max-tokens",
                "4",
                "--temperature",
                "0",
                "hi",
            ],
        );
        assert!(out.status.success(), "--dtype {dtype}: {}", stderr(&out));
    }
    let out = generate_on(
        tiny(),
        &["--cpu-kernels", "reference", "--dtype", "q4_1", "hi"],
    );
    assert_clear_error(&out, &["--dtype q4_1", "reference", "--cpu-kernels fast"]);
}

/// Pipelined engine steps (the default) and `--sync-steps` (also as
/// `LAMINA_SYNC_STEPS=1` or `=true`) generate the same tokens; a value that
/// is no boolean is refused naming the flag.
/// `--deterministic`: a batch of prompts of several lengths, prefilled in
/// chunks of 7 tokens, gives each prompt's tokens and log-probabilities
/// exactly as when it runs alone in one chunk; the flag is in `--help`;
/// `--deterministic-gemm` without it is refused naming both.
#[test]
fn deterministic_batches_give_each_prompt_its_output_alone() {
    let help = lamina(&["serve", "--help"]);
    assert!(stdout(&help).contains("--deterministic"));
    let file = std::env::temp_dir().join(format!("lamina-det-{}.txt", std::process::id()));
    let prompts = [
        "a",
        "a longer prompt than the chunks",
        "b c d e f g h i j k l",
    ];
    std::fs::write(&file, prompts.join("\n")).unwrap();
    let common = [
        "--deterministic",
        "--logprobs",
        "3",
        "--temperature",
        "0",
        "--max-tokens",
        "6",
        "--ignore-eos",
    ];
    let mut args = vec!["--json", "--max-batch-tokens", "7", "--max-num-seqs", "4"];
    args.extend(common);
    args.extend(["--prompts-file", file.to_str().unwrap()]);
    let out = generate_on(tiny(), &args);
    assert!(out.status.success(), "{}", stderr(&out));
    let rows: Vec<serde_json::Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), prompts.len());
    for (row, prompt) in rows.iter().zip(prompts) {
        let mut args = common.to_vec();
        args.push(prompt);
        let alone = gen_json(tiny(), &args);
        assert_eq!(row["tokens"], alone["tokens"], "prompt {prompt:?}");
        assert_eq!(row["logprobs"], alone["logprobs"], "prompt {prompt:?}");
    }
    // choosing the mode's products without the mode is refused
    let out = generate_on(
        tiny(),
        &["--deterministic-gemm", "own", "--max-tokens", "1", "a"],
    );
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("--deterministic-gemm") && err.contains("`--deterministic`"),
        "{err}"
    );
}

#[test]
fn sync_steps_give_the_same_tokens() {
    let model = tiny().to_str().unwrap().to_string();
    let run = |extra: &[&str], env: Option<&str>| {
        let mut cmd = std::process::Command::new(support::bin());
        cmd.args(["generate", "--device", "cpu", "--model", &model, "--json"]);
        cmd.args([
            "--max-tokens",
            "10",
            "--temperature",
            "0.8",
            "--seed",
            "7",
            "--ignore-eos",
            "--prompt-tokens",
            "5,6,7",
        ]);
        cmd.args(extra);
        match env {
            Some(v) => cmd.env("LAMINA_SYNC_STEPS", v),
            None => cmd.env_remove("LAMINA_SYNC_STEPS"),
        };
        cmd.output().unwrap()
    };
    let tokens = |o: &Output| -> serde_json::Value {
        assert!(o.status.success(), "{}", stderr(o));
        serde_json::from_str::<serde_json::Value>(stdout(o).trim()).unwrap()["tokens"].clone()
    };
    let piped = tokens(&run(&[], None));
    assert_eq!(tokens(&run(&["--sync-steps"], None)), piped);
    assert_eq!(tokens(&run(&[], Some("1"))), piped);
    assert_eq!(tokens(&run(&[], Some("true"))), piped);
    let bad = run(&[], Some("maybe"));
    assert!(!bad.status.success());
    assert!(stderr(&bad).contains("sync-steps"), "{}", stderr(&bad));
}

/// `lamina serve --device cpu --model tiny --port 0 ARGS`, killed if it is
/// still running after `secs` (a server that started: a flag let through).
fn serve_briefly(args: &[&str], secs: u64) -> Output {
    use std::process::{Command, Stdio};
    let mut all = vec![
        "serve",
        "--device",
        "cpu",
        "--model",
        tiny().to_str().unwrap(),
        "--port",
        "0",
    ];
    all.extend_from_slice(args);
    let mut child = Command::new(support::bin())
        .args(&all)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("`serve {args:?}` started: {}", stderr(&out));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

/// Durations no `Duration` holds (or longer than a day) are refused with
/// the flag named before anything loads, not a panic after loading.
#[test]
fn serve_refuses_absurd_durations() {
    for v in [
        "1e20",
        "1e300",
        "18446744073709551616",
        "86401",
        "inf",
        "NaN",
    ] {
        let grace = format!("--grace={v}");
        assert_clear_error(&serve_briefly(&[&grace], 60), &["--grace"]);
        let timeout = format!("--body-timeout={v}");
        assert_clear_error(&serve_briefly(&[&timeout], 60), &["--body-timeout"]);
    }
    assert_clear_error(&serve_briefly(&["--grace=-1"], 60), &["--grace"]);
}

/// More CPU replicas than cores, or than the machine's memory holds for
/// their KV pools together, are refused naming the flag before any weights
/// load (not an allocation until the machine runs out).
#[test]
fn serve_refuses_more_cpu_replicas_than_the_machine_holds() {
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    for n in [cores + 1, cores * 4 + 1, 100_000, usize::MAX] {
        let n = n.to_string();
        let line = assert_clear_error(
            &serve_briefly(&["--data-parallel-size", &n], 60),
            &["--data-parallel-size", &n],
        );
        assert!(line.contains("cores"), "{line}");
    }
    if cores < 2 {
        return;
    }
    // two replicas whose pools each take 60% of the memory
    let info = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let kib: f64 = info
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0.0);
    let gib = format!("{}", kib * 0.6 / (1024.0 * 1024.0));
    let line = assert_clear_error(
        &serve_briefly(
            &[
                "-d",
                "2",
                "--kv-memory-gib",
                &gib,
                "--max-num-seqs",
                "100000000",
            ],
            60,
        ),
        &["--data-parallel-size 2", "GiB"],
    );
    assert!(line.contains("KV"), "{line}");
}
