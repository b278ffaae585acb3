//! `cargo xtask regen-references`: rebuilds the golden files under
//! `tests/golden/` from the independent numpy oracle
//! (`../shared/oracle/llama_ref.py`).
//!
//! Contract: for each reference model (the `tiny` synthetic model written by
//! `checkpoint::synth` with [`TINY_SEED`], and SmolLM2-135M-Instruct as converted
//! by the store), each prompt of [`PROMPTS`] is encoded with the model's own
//! tokenizer (special tokens included), the oracle is run with
//! `--steps N --json`, and `tests/golden/<name>.json` is written:
//! `{"model", "source": {"kind": "synth", "preset", "seed"} | {"kind":
//! "store", "id"}, "steps", "cases": [{"text", "tokens", "generated",
//! "logits_last"}]}`, logits rounded to 7 significant digits. The golden test
//! (`tests/golden.rs`) rebuilds the same model from `source` and compares.
//!
//! Costs: the oracle recomputes the whole sequence per generated token; a few
//! seconds for `tiny`, about a minute for SmolLM2 (plus its first fetch).

use anyhow::{Context, Result, bail};
use checkpoint::store;
use checkpoint::synth::{Preset, synth_model};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;
use tokenizer::Tokenizer;

/// Seed of the `tiny` synthetic reference model.
pub const TINY_SEED: u64 = 7;

/// Prompt texts, encoded per model with its tokenizer.
pub const PROMPTS: [&str; 4] = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea,",
    "1, 2, 3, 4, 5,",
];

/// Which golden files to rebuild.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reference {
    Tiny,
    Smollm2,
}

#[derive(clap::Args, Debug)]
pub struct RegenArgs {
    /// Rebuild only this reference (default: all)
    #[arg(long, value_enum)]
    pub only: Option<Reference>,
    /// Greedy tokens the oracle generates per prompt
    #[arg(long, default_value_t = 16)]
    pub steps: usize,
    /// Output directory (default: tests/golden in the repository)
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The oracle script (default: ../shared/oracle/llama_ref.py from the repository root)
    #[arg(long)]
    pub oracle: Option<PathBuf>,
    /// Python interpreter with numpy
    #[arg(long, default_value = "python3")]
    pub python: String,
}

/// The repository root (the parent of this crate).
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

pub fn run(args: RegenArgs) -> Result<()> {
    let root = repo_root();
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| root.join("tests/golden"));
    let oracle = args
        .oracle
        .clone()
        .unwrap_or_else(|| root.join("../shared/oracle/llama_ref.py"));
    if !oracle.is_file() {
        bail!("oracle {} not found (pass --oracle)", oracle.display());
    }
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let scratch = std::env::temp_dir().join(format!("lamina-regen-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).with_context(|| format!("creating {}", scratch.display()))?;
    let wanted = |r| args.only.is_none_or(|o| o == r);
    if wanted(Reference::Tiny) {
        let dir = scratch.join("tiny");
        synth_model(Preset::Tiny, TINY_SEED, &dir).context("synthesising the tiny model")?;
        let source = json!({"kind": "synth", "preset": Preset::Tiny.name(), "seed": TINY_SEED});
        let dest = out.join("tiny.json");
        write_golden(&args, &oracle, &dir, "tiny", source, &scratch, &dest)?;
    }
    if wanted(Reference::Smollm2) {
        let id = store::DEFAULT_MODEL;
        let dir = store::resolve(id, true).with_context(|| format!("fetching {id}"))?;
        let source = json!({"kind": "store", "id": id});
        let dest = out.join("smollm2.json");
        write_golden(&args, &oracle, &dir, id, source, &scratch, &dest)?;
    }
    std::fs::remove_dir_all(&scratch).ok();
    Ok(())
}

/// Runs the oracle on every prompt for the model in `dir` and writes `dest`
/// (the oracle's own JSON goes to `scratch`).
fn write_golden(
    args: &RegenArgs,
    oracle: &Path,
    dir: &Path,
    name: &str,
    source: Value,
    scratch: &Path,
    dest: &Path,
) -> Result<()> {
    let tok = Tokenizer::from_dir(dir)
        .with_context(|| format!("loading the tokenizer of {}", dir.display()))?;
    let mut cases = Vec::new();
    for text in PROMPTS {
        let tokens = tok
            .encode(text, true)
            .with_context(|| format!("encoding {text:?}"))?;
        let ids: Vec<String> = tokens.iter().map(u32::to_string).collect();
        let json_out = scratch.join(format!("{name}-{}.json", cases.len()));
        eprintln!(
            "regen {name}: oracle on {text:?} ({} tokens, {} steps)",
            tokens.len(),
            args.steps
        );
        let status = Command::new(&args.python)
            .arg(oracle)
            .arg("--model")
            .arg(dir)
            .args([
                "--tokens",
                &ids.join(","),
                "--steps",
                &args.steps.to_string(),
                "--json",
            ])
            .arg(&json_out)
            .stdout(std::process::Stdio::null())
            .status()
            .with_context(|| format!("running {} {}", args.python, oracle.display()))?;
        if !status.success() {
            bail!("oracle failed on {name} / {text:?}: {status}");
        }
        let text_out = std::fs::read_to_string(&json_out)
            .with_context(|| format!("reading {}", json_out.display()))?;
        let r: Value = serde_json::from_str(&text_out)
            .with_context(|| format!("parsing {}", json_out.display()))?;
        std::fs::remove_file(&json_out).ok();
        let logits = r["logits_last"]
            .as_array()
            .context("oracle output has no logits_last")?
            .iter()
            .map(|v| v.as_f64().map(round7).context("non-numeric logit"))
            .collect::<Result<Vec<f64>>>()?;
        cases.push(json!({"text": text, "tokens": tokens, "generated": r["generated"], "logits_last": logits}));
    }
    let golden = json!({"model": name, "source": source, "steps": args.steps, "cases": cases});
    std::fs::write(dest, serde_json::to_string(&golden)? + "\n")
        .with_context(|| format!("writing {}", dest.display()))?;
    eprintln!("regen {name}: wrote {}", dest.display());
    Ok(())
}

/// `v` rounded to 7 significant digits.
fn round7(v: f64) -> f64 {
    format!("{v:.6e}").parse().unwrap_or(v)
}
