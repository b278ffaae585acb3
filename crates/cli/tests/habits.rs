//! The shapes a user of ollama, llama.cpp or vLLM types first: `lamina
//! run MODEL PROMPT`, a raw completion that ends at once explained, a
//! positional model on every model-running command, llama.cpp's
//! `-m -p -n -c -t`, vLLM's `--max-model-len`, `generate --system`, tips
//! for a neighbour's flags and ranges for negative numbers.

mod support;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use support::{clear_error, lamina, ok, run, stderr, stdout};

fn tiny() -> &'static str {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("lamina-habits-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        support::synth_tiny(&dir, "tiny")
    })
    .to_str()
    .unwrap()
}

/// SmolLM2-Instruct given a bare question without its chat template emits
/// its end-of-sequence token first (greedy): `generate` says so and points
/// at `--chat` and `run`; `run` answers the same question.
#[test]
fn a_raw_completion_that_ends_at_once_points_at_chat_and_run() {
    let q = "What is the capital of France?";
    let out = lamina(&["generate", "--device", "cpu", "--temperature", "0", q]);
    let err = stderr(&out);
    ok(&out);
    assert!(
        err.contains("ended at once") && err.contains("--chat") && err.contains("lamina run"),
        "{err}"
    );
    let out = lamina(&[
        "run",
        "--device",
        "cpu",
        "--temperature",
        "0",
        "-n",
        "24",
        "smollm2-135m-instruct",
        q,
    ]);
    let text = ok(&out);
    assert!(text.contains("Paris"), "{text}");
    assert!(!stderr(&out).contains("ended at once"), "{}", stderr(&out));
    // with --chat the hint never shows
    let out = lamina(&[
        "generate",
        "--device",
        "cpu",
        "--temperature",
        "0",
        "-n",
        "8",
        "--chat",
        q,
    ]);
    ok(&out);
    assert!(!stderr(&out).contains("ended at once"));
}

/// `generate --system` replaces the template's system turn (SmolLM2's
/// default one names the assistant; asked for French, it greets in French),
/// and `run` reads a prompt piped on stdin.
#[test]
fn generate_system_and_run_from_stdin() {
    let base = [
        "generate",
        "--device",
        "cpu",
        "--temperature",
        "0",
        "-n",
        "4",
        "--json",
    ];
    let plain = ok(&lamina(&[&base[..], &["--chat", "hi"]].concat()));
    let sys = ok(&lamina(
        &[&base[..], &["--system", "You answer in French.", "hi"]].concat(),
    ));
    let json = |s: &str| -> serde_json::Value { serde_json::from_str(s.trim()).unwrap() };
    let (plain, sys) = (json(&plain), json(&sys));
    assert_ne!(plain["prompt_tokens"], sys["prompt_tokens"]);
    assert!(sys["text"].as_str().unwrap().contains("Bonjour"), "{sys}");
    let out = run(
        None,
        &["run", "--device", "cpu", "--temperature", "0", "-n", "24"],
        Some("What is the capital of France?\n"),
    );
    assert!(ok(&out).contains("Paris"), "{}", stdout(&out));
}

/// The model as the first word (`generate MODEL PROMPT`, `chat MODEL`,
/// `serve MODEL`), `-m`, llama.cpp's `-p -n -c -t`; a model given twice
/// and a context longer than the model's are refused by name.
#[test]
fn positional_models_and_short_flags() {
    let m = tiny();
    let seeded = ["--device", "cpu", "--seed", "1", "--json"];
    let a = ok(&lamina(
        &[&["generate", m, "hello"][..], &seeded, &["-n", "5"]].concat(),
    ));
    let b = ok(&lamina(
        &[
            &["generate", "-m", m, "-p", "hello"][..],
            &seeded,
            &["--max-tokens", "5"],
        ]
        .concat(),
    ));
    let c = ok(&lamina(
        &[
            &["generate", "--model", m][..],
            &seeded,
            &["-n", "5", "-c", "64", "-t", "1", "hello"],
        ]
        .concat(),
    ));
    assert_eq!(a, b);
    assert_eq!(a, c);
    let v: serde_json::Value = serde_json::from_str(a.trim()).unwrap();
    assert_eq!(v["tokens"].as_array().unwrap().len(), 5);
    // a one-word `generate` with -p: that word is the model
    let d = ok(&lamina(
        &[&["generate", m, "-p", "hello"][..], &seeded, &["-n", "5"]].concat(),
    ));
    assert_eq!(a, d);

    let twice = lamina(&["generate", "--model", "other", m, "hello"]);
    clear_error(&twice, &["given twice", "--model other"]);
    let long = lamina(&[
        "generate",
        "--device",
        "cpu",
        "--max-model-len",
        "100000",
        m,
        "x",
    ]);
    clear_error(
        &long,
        &["--max-model-len 100000", "max_position_embeddings"],
    );
    // a context shorter than the prompt: refused by the engine, naming its size
    let short = lamina(&[
        "generate",
        "--device",
        "cpu",
        "-c",
        "4",
        m,
        "one two three four five six",
    ]);
    assert!(!short.status.success());
    let dir = Path::new(m).parent().unwrap().join("no-such-model");
    let serve = lamina(&["serve", "--port", "0", dir.to_str().unwrap()]);
    clear_error(&serve, &["no-such-model"]);
    let chat = lamina(&["chat", dir.to_str().unwrap()]);
    clear_error(&chat, &["no-such-model"]);
}

/// Numbers out of range name the range (not clap's `-- -1` hint), before
/// any model loads; a neighbour's flag gets lamina's flag as the tip.
#[test]
fn ranges_and_tips() {
    let out = lamina(&["generate", "--temperature", "-1", "hi"]);
    clear_error(&out, &["--temperature", "must be in [0,", "-1"]);
    let out = lamina(&["run", "--top-p", "-0.5", "say hi"]);
    clear_error(&out, &["--top-p", "(0, 1]"]);
    let out = lamina(&["chat", "--min-p", "-2"]);
    clear_error(&out, &["--min-p", "[0, 1]"]);
    let out = lamina(&["generate", "--threads", "0", "hi"]);
    let err = stderr(&out);
    assert!(err.contains("--threads") && err.contains("1..="), "{err}");
    assert!(!err.contains("'-- "), "{err}");
    for (flag, want) in [
        ("--max-num-batched-tokens", "--max-batch-tokens"),
        ("--tensor-parallel-size", "--devices"),
        ("-ngl", "--device"),
        ("--num-ctx", "--max-model-len"),
    ] {
        let out = lamina(&["serve", flag, "1"]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains(want) && err.contains("tip:"), "{flag}: {err}");
    }
    // the aliases themselves parse
    let help = ok(&lamina(&["serve", "--help"]));
    for want in [
        "--max-model-len",
        "ctx-size",
        "-m, --model",
        "-t, --threads",
        "[MODEL]",
    ] {
        assert!(help.contains(want), "{want} missing from serve --help");
    }
    let help = ok(&lamina(&["generate", "--help"]));
    for want in ["-n, --max-tokens", "n-predict", "-p, --prompt", "--system"] {
        assert!(help.contains(want), "{want} missing from generate --help");
    }
}

/// `lamina generate ... | head`: the reader closing the pipe ends the
/// command quietly with exit 0 (no `Broken pipe` error line).
#[test]
fn a_closed_pipe_ends_generate_quietly() {
    use std::io::Read;
    use std::process::{Command, Stdio};
    let mut child = Command::new(support::bin())
        .args([
            "generate",
            "--device",
            "cpu",
            "--ignore-eos",
            "-n",
            "400",
            "--seed",
            "1",
            tiny(),
            "hello",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 16];
    child.stdout.take().unwrap().read_exact(&mut first).unwrap();
    // (the pipe's read end is dropped here)
    let out = child.wait_with_output().unwrap();
    let err = stderr(&out);
    assert!(out.status.success(), "{:?}: {err}", out.status);
    assert!(
        !err.contains("Broken pipe") && !err.contains("panicked"),
        "{err}"
    );
}
