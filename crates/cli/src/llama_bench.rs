//! `lamina bench --llama-bench PATH`: llama.cpp's `llama-bench` run on the
//! same machine right after lamina's workloads, for a side-by-side line.
//!
//! Contract: [`run`] starts `PATH -m GGUF -t THREADS -ngl LAYERS -p PROMPT
//! -n GEN -d 0[,DEPTH] -r REPEATS -o json` (prompt processing of `PROMPT`
//! tokens on an empty context, decode of `GEN` tokens after `DEPTH` tokens
//! of context: lamina's b2 / b1 sizes, the depth b1's prompt, lamina's
//! thread count; every layer on the GPU when lamina runs on CUDA, none
//! when it runs on the CPU, whichever backends the binary was built with),
//! parses the mean tokens per second of those two tests (a build without
//! `n_depth` in its output counts as depth 0) and returns them; a missing binary,
//! a failing run (its stderr's tail is quoted) or output without the two
//! tests is an error naming the binary. `scripts/build-llama-bench.sh`
//! builds the pinned binary.
//! Costs: one child process; its run time is llama.cpp's.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

/// llama-bench's mean rates.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LlamaRates {
    /// Prompt processing, tokens per second.
    pub prompt_tok_s: f64,
    /// Decode (token generation), tokens per second.
    pub decode_tok_s: f64,
}

/// The sizes one comparison runs.
#[derive(Debug, Clone, Copy)]
pub struct LlamaRun {
    pub threads: usize,
    /// Every layer offloaded to the GPU (llama.cpp built with CUDA), else
    /// none.
    pub gpu: bool,
    pub prompt: usize,
    pub generate: usize,
    /// Context the decode test runs after (lamina's b1 prompt).
    pub depth: usize,
    pub repeats: usize,
}

/// Runs `bin` on `gguf` (see the module doc).
pub fn run(bin: &Path, gguf: &Path, r: LlamaRun) -> Result<LlamaRates> {
    if !gguf.is_file() {
        bail!(
            "invalid `--llama-gguf`: no GGUF file at {} (llama-bench needs the model as a .gguf)",
            gguf.display()
        );
    }
    let out = Command::new(bin)
        .arg("-m")
        .arg(gguf)
        .args(["-t", &r.threads.to_string()])
        .args(["-ngl", if r.gpu { "99" } else { "0" }])
        .args(["-p", &r.prompt.to_string()])
        .args(["-n", &r.generate.to_string()])
        .args(["-d", &depths(r.depth)])
        .args(["-r", &r.repeats.to_string()])
        .args(["-o", "json"])
        .output()
        .with_context(|| format!("running llama-bench at {}", bin.display()))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: String = err
            .lines()
            .rev()
            .take(5)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n");
        bail!(
            "llama-bench at {} failed ({}):\n{tail}",
            bin.display(),
            out.status
        );
    }
    parse(&String::from_utf8_lossy(&out.stdout), r.depth)
        .with_context(|| format!("reading the output of llama-bench at {}", bin.display()))
}

/// llama-bench's `-d` list: the empty context, and `depth` when not 0.
fn depths(depth: usize) -> String {
    match depth {
        0 => "0".into(),
        d => format!("0,{d}"),
    }
}

/// The rates of llama-bench's JSON output (`-o json`): prompt processing is
/// the test with `n_gen == 0` at depth 0, decode the one with `n_prompt ==
/// 0` at depth `depth`.
pub fn parse(json: &str, depth: usize) -> Result<LlamaRates> {
    let tests: Vec<serde_json::Value> =
        serde_json::from_str(json).context("llama-bench output is not a JSON array")?;
    let rate = |want_prompt: bool| {
        tests.iter().find_map(|t| {
            let (p, g) = (t["n_prompt"].as_u64()?, t["n_gen"].as_u64()?);
            let d = t["n_depth"].as_u64().unwrap_or(0);
            let hit = if want_prompt {
                p > 0 && g == 0 && d == 0
            } else {
                g > 0 && p == 0 && d == depth as u64
            };
            hit.then(|| t["avg_ts"].as_f64()).flatten()
        })
    };
    match (rate(true), rate(false)) {
        (Some(prompt_tok_s), Some(decode_tok_s)) => Ok(LlamaRates {
            prompt_tok_s,
            decode_tok_s,
        }),
        _ => bail!(
            "llama-bench output lacks a prompt test (n_gen 0, depth 0) or a decode test (n_prompt 0, depth {depth})"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_tests_and_names_what_is_missing() {
        let json = r#"[{"n_prompt": 512, "n_gen": 0, "avg_ts": 345.5},
                       {"n_prompt": 0, "n_gen": 64, "avg_ts": 51.25}]"#;
        assert_eq!(
            parse(json, 0).unwrap(),
            LlamaRates {
                prompt_tok_s: 345.5,
                decode_tok_s: 51.25
            }
        );
        // with `-d 0,4096`: prompt processing at depth 0, decode at 4,096
        let deep = r#"[{"n_prompt": 512, "n_gen": 0, "n_depth": 0, "avg_ts": 345.5},
                       {"n_prompt": 0, "n_gen": 64, "n_depth": 0, "avg_ts": 51.25},
                       {"n_prompt": 512, "n_gen": 0, "n_depth": 4096, "avg_ts": 99.0},
                       {"n_prompt": 0, "n_gen": 64, "n_depth": 4096, "avg_ts": 28.5}]"#;
        assert_eq!(
            parse(deep, 4096).unwrap(),
            LlamaRates {
                prompt_tok_s: 345.5,
                decode_tok_s: 28.5
            }
        );
        assert_eq!((depths(0), depths(4096)), ("0".into(), "0,4096".into()));
        let e = parse(json, 4096).unwrap_err();
        assert!(e.to_string().contains("depth 4096"), "{e}");
        let e = parse(r#"[{"n_prompt": 512, "n_gen": 0, "avg_ts": 1.0}]"#, 0).unwrap_err();
        assert!(e.to_string().contains("decode test"), "{e}");
        assert!(parse("not json", 0).is_err());
    }

    #[test]
    fn a_missing_binary_or_model_is_an_error_naming_it() {
        let r = LlamaRun {
            threads: 1,
            gpu: false,
            prompt: 8,
            generate: 8,
            depth: 0,
            repeats: 1,
        };
        let dir = std::env::temp_dir();
        let e = run(Path::new("/nonexistent/llama-bench"), &dir, r).unwrap_err();
        assert!(e.to_string().contains("--llama-gguf"), "{e}");
        let gguf = dir.join(format!(
            "lamina-llama-bench-test-{}.gguf",
            std::process::id()
        ));
        std::fs::write(&gguf, b"GGUF").unwrap();
        let e = run(Path::new("/nonexistent/llama-bench"), &gguf, r).unwrap_err();
        std::fs::remove_file(&gguf).ok();
        assert!(
            format!("{e:#}").contains("/nonexistent/llama-bench"),
            "{e:#}"
        );
    }
}
