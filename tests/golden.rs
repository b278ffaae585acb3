//! Golden tests: the CPU backend against the independent numpy oracle
//! (`scripts/reference/llama_ref.py`), through the golden files that
//! `cargo xtask regen-references` writes under `tests/golden/`.
//!
//! Contract: for each golden file, the model is rebuilt from its `source`
//! (the `tiny` synthetic model from its seed into a temp dir, or SmolLM2 from
//! the store, fetched on first use), and for every case (at least 3 prompts):
//! - the prompt's last-position logits over the full vocabulary match the
//!   oracle's with relative error `||a - b|| / ||b|| < 1e-4` on the reference
//!   path (`CpuPath::Reference`) and `< 1e-3` on the fast path
//!   (`CpuPath::Fast`, reordered sums and another GEMM for prefill);
//! - the greedy continuation, decoded with all prompts batched together on
//!   scattered (interleaved, non-contiguous) KV blocks, equals the oracle's
//!   token for token (at least 16 tokens), on both paths.
//!
//! Costs: `tiny` runs in well under a second; SmolLM2 loads 270 MB of BF16
//! weights and runs ~4 prompts x 16 tokens of a 135M model (a few seconds in
//! release, longer in debug), plus a one-time fetch (~93 MB download).

use checkpoint::loader::{load_config, load_weights};
use contract::{Backend, KvShape};
use model::cpu::batch::{SeqChunk, build_step, generate_greedy};
use model::cpu::{CpuBackend, CpuPath};
use serde::Deserialize;
use std::path::{Path, PathBuf};

const BLOCK_SIZE: usize = 16;
const MAX_REL_ERR: f64 = 1e-4;
const MAX_REL_ERR_FAST: f64 = 1e-3;
const MIN_CASES: usize = 3;
const MIN_STEPS: usize = 16;

#[derive(Deserialize)]
struct Golden {
    model: String,
    source: Source,
    steps: usize,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
enum Source {
    Synth { preset: String, seed: u64 },
    Store { id: String },
}

#[derive(Deserialize)]
struct Case {
    text: String,
    tokens: Vec<u32>,
    generated: Vec<u32>,
    logits_last: Vec<f64>,
}

fn read_golden(name: &str) -> Golden {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("golden")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run `cargo xtask regen-references`)",
            path.display()
        )
    });
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn rel_err(a: &[f32], b: &[f64]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| (*x as f64 - y).powi(2)).sum();
    let den: f64 = b.iter().map(|y| y * y).sum();
    (num / den).sqrt()
}

/// Sequence `i` of `n` gets blocks `i, i + n, i + 2n, ...`: interleaved, never contiguous.
fn scattered_table(i: usize, n: usize, tokens: usize) -> Vec<u32> {
    (0..tokens.div_ceil(BLOCK_SIZE))
        .map(|b| (i + b * n) as u32)
        .collect()
}

/// Checks both CPU paths on the model in `dir` against `golden`.
fn check(golden: &Golden, dir: &Path) {
    check_path(golden, dir, CpuPath::Reference, MAX_REL_ERR);
    check_path(golden, dir, CpuPath::Fast, MAX_REL_ERR_FAST);
}

/// Checks the CPU backend on `path` against `golden`, logits within `max_err`.
fn check_path(golden: &Golden, dir: &Path, path: CpuPath, max_err: f64) {
    assert!(
        golden.cases.len() >= MIN_CASES,
        "{}: only {} cases",
        golden.model,
        golden.cases.len()
    );
    assert!(
        golden.steps >= MIN_STEPS,
        "{}: only {} steps",
        golden.model,
        golden.steps
    );
    let loaded = load_config(dir).unwrap_or_else(|e| panic!("{e}"));
    let weights = load_weights(dir, &loaded.config).unwrap_or_else(|e| panic!("{e}"));
    let n = golden.cases.len();
    let longest = golden
        .cases
        .iter()
        .map(|c| c.tokens.len())
        .max()
        .unwrap_or(0)
        + golden.steps;
    let kv = KvShape {
        num_blocks: n * longest.div_ceil(BLOCK_SIZE),
        block_size: BLOCK_SIZE,
    };
    let mut backend =
        CpuBackend::with_path(loaded.config, weights, kv, path).unwrap_or_else(|e| panic!("{e}"));
    for (i, case) in golden.cases.iter().enumerate() {
        let chunk = SeqChunk {
            prompt_len: case.tokens.len(),
            tokens: case.tokens.clone(),
            start: 0,
            blocks: scattered_table(i, n, case.tokens.len()),
            sample: None,
        };
        let batch = build_step(&[chunk], BLOCK_SIZE).unwrap_or_else(|e| panic!("{e}"));
        let logits = backend
            .logits(&batch, &[case.tokens.len() - 1])
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            logits.len(),
            case.logits_last.len(),
            "{} {:?}: vocab",
            golden.model,
            case.text
        );
        let err = rel_err(&logits, &case.logits_last);
        eprintln!(
            "{} {path:?} {:?}: prompt logits rel err {err:.2e}",
            golden.model, case.text
        );
        assert!(
            err < max_err,
            "{} {path:?} {:?}: rel err {err:e}",
            golden.model,
            case.text
        );
    }
    let prompts: Vec<&[u32]> = golden.cases.iter().map(|c| c.tokens.as_slice()).collect();
    let tables: Vec<Vec<u32>> = (0..n)
        .map(|i| scattered_table(i, n, prompts[i].len() + golden.steps))
        .collect();
    let got = generate_greedy(&mut backend, &prompts, &tables, golden.steps)
        .unwrap_or_else(|e| panic!("{e}"));
    for (case, got) in golden.cases.iter().zip(&got) {
        assert_eq!(case.generated.len(), golden.steps);
        assert_eq!(
            got, &case.generated,
            "{} {path:?} {:?}: greedy continuation",
            golden.model, case.text
        );
    }
}

#[test]
fn tiny_synthetic_model_matches_oracle() {
    let golden = read_golden("tiny.json");
    let Source::Synth { preset, seed } = &golden.source else {
        panic!("tiny.json: expected a synth source");
    };
    let preset: contract::presets::Preset =
        preset.parse().unwrap_or_else(|e: String| panic!("{e}"));
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir: {e}"));
    checkpoint::synth::synth_model(preset, *seed, dir.path()).unwrap_or_else(|e| panic!("{e}"));
    check(&golden, dir.path());
}

#[test]
fn smollm2_matches_oracle() {
    let golden = read_golden("smollm2.json");
    let Source::Store { id } = &golden.source else {
        panic!("smollm2.json: expected a store source");
    };
    let dir: PathBuf = checkpoint::store::resolve(id, true).unwrap_or_else(|e| panic!("{e}"));
    check(&golden, &dir);
}
