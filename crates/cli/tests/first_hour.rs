//! What someone meets in their first hour: `lamina run "QUESTION"` for the
//! default model, neighbours' `-ngl` / `--gpu-layers` / `--keep-alive`
//! answered with lamina's way, one-shot commands sizing their KV pool to
//! the request, and the store by short names and any case (`ls`, `show`,
//! `rm` freeing the downloads, `list` sizes as on disk, `ps` asking a
//! server).

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use support::{clear_error, ok, run, stderr};

fn tiny() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("lamina-first-hour-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        support::synth_tiny(&dir, "tiny")
    })
}

/// `lamina ARGS` with `LAMINA_MODEL` set (the default model of the run).
fn with_model_env(model: &Path, args: &[&str]) -> Output {
    Command::new(support::bin())
        .args(args)
        .env("LAMINA_MODEL", model)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// The README's first command: a lone word that names no model is the
/// prompt, for the default model (here `LAMINA_MODEL`) or `--model`.
#[test]
fn a_lone_question_is_the_prompt_of_the_default_model() {
    let q = "What is the capital of France?";
    let args = ["run", "--device", "cpu", "-n", "3", "--seed", "1", q];
    let out = with_model_env(tiny(), &args);
    ok(&out);
    assert!(!stderr(&out).contains("names no model"), "{}", stderr(&out));
    let m = tiny().to_str().unwrap();
    let out = run(
        None,
        &[&["run", "--model", m][..], &args[1..]].concat(),
        None,
    );
    ok(&out);
    // one word: answered too, with a note in case it was a mistyped model
    let out = run(
        None,
        &["run", "--model", m, "--device", "cpu", "-n", "2", "hello"],
        None,
    );
    ok(&out);
    assert!(
        stderr(&out).contains("`hello` names no model"),
        "{}",
        stderr(&out)
    );
    // a flag out of range is the one error, before any note on the words
    let out = run(None, &["run", "--model", m, "hi", "--top-p", "-0.5"], None);
    clear_error(&out, &["`--top-p`", "-0.5"]);
}

/// llama.cpp's `-ngl 99` is not read as `-n gl`, and ollama's
/// `--keep-alive` gets what lamina does instead.
#[test]
fn neighbours_gpu_layers_and_keep_alive_get_their_tip() {
    for (args, want) in [
        (&["run", "-ngl", "99", "hi"][..], "--device cuda"),
        (
            &["generate", "--gpu-layers", "99", "hi"][..],
            "--device cuda",
        ),
        (&["serve", "--n-gpu-layers=99"][..], "--device cuda"),
        (&["run", "--keep-alive", "5m", "hi"][..], "lamina serve"),
    ] {
        let out = run(None, args, None);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains("tip:") && err.contains(want),
            "{args:?}: {err}"
        );
        assert!(!err.contains("'gl'"), "{err}");
    }
}

/// `run` / `generate` size the pool to prompt + reply (+ slack), not to
/// the serving default.
#[test]
fn one_shot_commands_size_the_pool_to_the_request() {
    let blocks = |n: &str| -> usize {
        let m = tiny().to_str().unwrap();
        let out = run(
            None,
            &["-v", "generate", "--device", "cpu", "-n", n, m, "hi"],
            None,
        );
        ok(&out);
        let err = stderr(&out);
        let at = err.find("kv_blocks=").unwrap_or_else(|| panic!("{err}"));
        err[at + "kv_blocks=".len()..]
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .and_then(|d| d.parse().ok())
            .unwrap_or_else(|| panic!("{err}"))
    };
    let (short, long) = (blocks("4"), blocks("200"));
    // (hi + 4 + 256 slack) / 16 and (hi + 200 + 256) / 16 blocks
    assert!(short <= 17, "{short} blocks for a 4-token reply");
    assert!(
        long > short && long <= 29,
        "{long} blocks for a 200-token reply"
    );
}

/// The store by short name and in any case; `ls` and `show`; `list` sizes
/// what is on disk; `rm` says what it freed.
#[test]
fn store_names_ls_show_and_rm() {
    let home = tempfile::tempdir().unwrap();
    let h = Some(home.path());
    let work = tempfile::tempdir().unwrap();
    let src = support::synth_tiny(work.path(), "tiny");
    let cfg_path = src.join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&cfg_path).unwrap()).unwrap();
    cfg["rope_scaling"] = serde_json::Value::Null;
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let gguf = work.path().join("Tiny-Test.gguf");
    support::gguf::write_gguf(&src, &gguf);
    ok(&run(h, &["pull", gguf.to_str().unwrap()], None));

    let ls = ok(&run(h, &["ls"], None));
    let row = ls
        .lines()
        .find(|l| l.starts_with("tiny-test"))
        .unwrap_or_else(|| panic!("{ls}"));
    let dir = home.path().join("models/tiny-test");
    let on_disk: u64 = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    let shown = format!("{:.1} KB", on_disk as f64 / 1e3);
    assert!(row.contains(&shown), "{row} should show {shown}");

    let show = ok(&run(h, &["show", "TINY-TEST"], None));
    for want in [
        "parameters",
        "context       512 tokens",
        "chat template",
        "model.safetensors",
        "on disk",
    ] {
        assert!(show.contains(want), "{want} missing: {show}");
    }
    // a known model by its short name: not fetched by `show`, named in full
    clear_error(
        &run(h, &["show", "SmolLM2"], None),
        &["smollm2-135m-instruct", "lamina pull smollm2-135m-instruct"],
    );

    let rm = run(h, &["rm", "Tiny-Test"], None);
    ok(&rm);
    assert!(
        stderr(&rm).contains("removed `tiny-test`") && stderr(&rm).contains("freed"),
        "{}",
        stderr(&rm)
    );
    assert!(!dir.exists());
}

/// `ps` asks a server; with none it says how to start one.
#[test]
fn ps_without_a_server_says_how_to_start_one() {
    clear_error(
        &run(None, &["ps", "--url", support::NO_HUB], None),
        &["no server answers at http://127.0.0.1:9", "lamina serve"],
    );
}
