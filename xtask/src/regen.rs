//! `cargo xtask regen-references`: rebuilds the golden files under
//! `tests/golden/` from the independent numpy fp32 reference
//! (`scripts/reference/llama_ref.py`, the "oracle").
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
//! `tests/golden/smollm2-q4_1.json` holds the oracle's teacher-forced
//! log-probabilities on SmolLM2's Q4_1 GGUF itself (dequantised by the
//! oracle), for the quantised CPU path's test (`tests/quant_golden.rs`).
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

use crate::repo::repo_root;

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
    /// Teacher-forced log-probabilities on SmolLM2's Q4_1 GGUF (the
    /// sequences of `smollm2.json`, which must exist).
    #[value(name = "smollm2-q4_1")]
    Smollm2Q4_1,
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
    /// The oracle script (default: scripts/reference/llama_ref.py in the repository)
    #[arg(long)]
    pub oracle: Option<PathBuf>,
    /// Python interpreter with numpy (and `gguf` for smollm2-q4_1)
    #[arg(long, default_value = "python3")]
    pub python: String,
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
        .unwrap_or_else(|| root.join("scripts/reference/llama_ref.py"));
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
    if wanted(Reference::Smollm2Q4_1) {
        write_teacher_forced(&args, &oracle, &out, &scratch)?;
    }
    std::fs::remove_dir_all(&scratch).ok();
    Ok(())
}

/// Writes `smollm2-q4_1.json`: the oracle's teacher-forced log-probabilities
/// on SmolLM2's own GGUF (the store's source of the default model,
/// dequantised by the oracle) for each case of `smollm2.json` (prompt then
/// greedy continuation), by `tests/python/teacher_forced.py`:
/// `{"model", "source", "gguf", "cases": [{"tokens", "logprobs"}]}`.
fn write_teacher_forced(args: &RegenArgs, oracle: &Path, out: &Path, scratch: &Path) -> Result<()> {
    let id = store::DEFAULT_MODEL;
    let dir = store::resolve(id, true).with_context(|| format!("fetching {id}"))?;
    let gguf = store::source_gguf(&dir)?
        .with_context(|| format!("{id} in the store names no source GGUF"))?;
    let golden_path = out.join("smollm2.json");
    let golden: Value = serde_json::from_str(
        &std::fs::read_to_string(&golden_path)
            .with_context(|| format!("reading {}", golden_path.display()))?,
    )?;
    let seqs: Vec<Vec<u64>> = golden["cases"]
        .as_array()
        .context("smollm2.json has no cases")?
        .iter()
        .map(|c| {
            let ids = |k: &str| -> Vec<u64> {
                c[k].as_array()
                    .map(|a| a.iter().filter_map(Value::as_u64).collect())
                    .unwrap_or_default()
            };
            [ids("tokens"), ids("generated")].concat()
        })
        .collect();
    let (inp, res) = (scratch.join("tf-in.json"), scratch.join("tf-out.json"));
    std::fs::write(&inp, json!({"sequences": seqs}).to_string())?;
    eprintln!(
        "regen smollm2-q4_1: oracle on {} ({} sequences)",
        gguf.display(),
        seqs.len()
    );
    let script = repo_root().join("tests/python/teacher_forced.py");
    let status = Command::new(&args.python)
        .arg(&script)
        .arg(oracle)
        .arg(&gguf)
        .arg(&inp)
        .arg(&res)
        .status()
        .with_context(|| format!("running {} {}", args.python, script.display()))?;
    if !status.success() {
        bail!("{} failed: {status}", script.display());
    }
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&res)?)?;
    let lps = r["logprobs"].as_array().context("no logprobs")?;
    let cases: Vec<Value> = seqs
        .iter()
        .zip(lps)
        .map(|(s, lp)| json!({"tokens": s, "logprobs": lp}))
        .collect();
    let name = gguf.file_name().map(|n| n.to_string_lossy().into_owned());
    let doc =
        json!({"model": id, "source": {"kind": "store", "id": id}, "gguf": name, "cases": cases});
    let dest = out.join("smollm2-q4_1.json");
    std::fs::write(&dest, serde_json::to_string(&doc)? + "\n")
        .with_context(|| format!("writing {}", dest.display()))?;
    eprintln!("regen smollm2-q4_1: wrote {}", dest.display());
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
