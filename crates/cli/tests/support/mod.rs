//! Helpers shared by end-to-end tests of the `lamina` binary: runs
//! with a private store (`LAMINA_HOME`), stdin, and a synthetic tiny model.

#![allow(dead_code)]

pub mod gguf;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_lamina")
}

/// Where the runs with a private store look for the Hugging Face hub:
/// nothing listens there, so a repo id never reaches the real hub.
pub const NO_HUB: &str = "http://127.0.0.1:9";

/// `lamina ARGS` with `LAMINA_HOME=home` (when given; then also a private
/// Hugging Face cache in it and the hub at [`NO_HUB`]) and `stdin` piped in.
pub fn run(home: Option<&Path>, args: &[&str], stdin: Option<&str>) -> Output {
    let mut cmd = Command::new(bin());
    cmd.args(args);
    if let Some(h) = home {
        cmd.env("LAMINA_HOME", h)
            .env("HF_HUB_CACHE", h.join("hf-hub"))
            .env("HF_ENDPOINT", NO_HUB)
            .env_remove("HF_TOKEN")
            .env_remove("HF_HUB_OFFLINE");
    }
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("the lamina binary runs");
    if let Some(text) = stdin {
        let mut pipe = child.stdin.take().unwrap();
        pipe.write_all(text.as_bytes()).unwrap();
    }
    child.wait_with_output().unwrap()
}

pub fn lamina(args: &[&str]) -> Output {
    run(None, args, None)
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn ok(o: &Output) -> String {
    assert!(o.status.success(), "lamina failed: {}", stderr(o));
    assert!(!stderr(o).contains("panicked"), "{}", stderr(o));
    stdout(o)
}

/// Asserts a failure with exactly one non-empty stderr line starting with
/// `error: ` and containing every `needle`; returns the line.
pub fn clear_error(out: &Output, needles: &[&str]) -> String {
    let err = stderr(out);
    assert!(!out.status.success(), "expected failure; stderr: {err}");
    assert!(!err.contains("panicked"), "panic: {err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "expected one error line, got: {err}");
    assert!(lines[0].starts_with("error: "), "{err}");
    for n in needles {
        assert!(lines[0].contains(n), "`{}` should mention `{n}`", lines[0]);
    }
    lines[0].to_string()
}

/// A fresh `tiny` synthetic model (seed 3) in `dir/name`.
pub fn synth_tiny(dir: &Path, name: &str) -> PathBuf {
    let out = dir.join(name);
    let o = lamina(&[
        "synth-model",
        "--preset",
        "tiny",
        "--seed",
        "3",
        "--out",
        out.to_str().unwrap(),
    ]);
    ok(&o);
    out
}

/// `lamina generate --device cpu --model MODEL ARGS...` under `home`.
pub fn generate(home: Option<&Path>, model: &str, args: &[&str], stdin: Option<&str>) -> Output {
    let mut all = vec!["generate", "--device", "cpu", "--model", model];
    all.extend_from_slice(args);
    run(home, &all, stdin)
}
