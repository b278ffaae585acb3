//! The Qwen presets against transformers: `qwen3-0.6b`, `qwen3-1.7b` and
//! `qwen2.5-0.5b` synthesised with their real `config.json` dimensions (cut
//! to two layers), run by lamina's CPU backend (the reference and the fast
//! path) and by transformers in float32 on the same weights; every
//! position's log-probabilities (the whole vocabulary, so the
//! teacher-forced ones too) agree within [`MAX_LOGPROB_DIFF`].
//!
//! Needs torch and transformers, which `cargo xtask test` does not install,
//! so it is ignored there; run it with
//! `PYTHONPATH=/tmp/tfenv/site cargo test --release -p lamina-tests --test hf_families -- --ignored`
//! (`LAMINA_PYTHON` names another interpreter).

use checkpoint::synth::{Preset, SynthOptions, synth_model_with};
use contract::{Backend, KvShape};
use lamina_tests::log_softmax;
use model::cpu::batch::{SeqChunk, build_step};
use model::cpu::{CpuBackend, CpuPath};
use std::path::Path;
use std::process::Command;

const BLOCK_SIZE: usize = 8;
/// Largest difference of a log-probability (nats), over every position and
/// vocabulary entry.
const MAX_LOGPROB_DIFF: f64 = 0.02;
/// The least range of a row of transformers' logits (nats): random
/// weights that gave near-uniform rows would make the comparison empty.
const MIN_LOGIT_SPREAD: f64 = 1.0;
/// "Hello world, the weather in Oslo is" and a few more of Qwen's ids.
const TOKENS: [u32; 12] = [9707, 1879, 11, 279, 9104, 304, 57858, 374, 220, 16, 15, 13];

/// transformers' `[position][vocab]` logits of [`TOKENS`] for the model in `dir`.
fn hf_logits(dir: &Path, vocab: usize) -> Vec<Vec<f32>> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/hf_logits.py");
    let out = dir.join("hf_logits.f32");
    let ids: Vec<String> = TOKENS.iter().map(u32::to_string).collect();
    let python = std::env::var("LAMINA_PYTHON").unwrap_or_else(|_| "python3".into());
    let run = Command::new(python)
        .arg(&script)
        .arg(dir)
        .arg(ids.join(","))
        .arg(&out)
        .output()
        .expect("run python3");
    assert!(
        run.status.success(),
        "{} failed ({}): {}\n(needs torch and transformers: PYTHONPATH=/tmp/tfenv/site)",
        script.display(),
        run.status,
        String::from_utf8_lossy(&run.stderr)
    );
    let bytes = std::fs::read(&out).expect("read the logits");
    let all: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(all.len(), TOKENS.len() * vocab);
    all.chunks_exact(vocab).map(<[f32]>::to_vec).collect()
}

/// lamina's CPU logits of [`TOKENS`] (one prompt chunk) on `path`.
fn lamina_logits(dir: &Path, path: CpuPath) -> Vec<Vec<f32>> {
    let cfg = checkpoint::loader::load_config(dir)
        .unwrap_or_else(|e| panic!("{e}"))
        .config;
    let weights = checkpoint::loader::load_weights(dir, &cfg).unwrap_or_else(|e| panic!("{e}"));
    let n = TOKENS.len();
    let kv = KvShape {
        num_blocks: n.div_ceil(BLOCK_SIZE),
        block_size: BLOCK_SIZE,
    };
    let vocab = cfg.vocab_size;
    let mut b = CpuBackend::with_path(cfg, weights, kv, path).unwrap_or_else(|e| panic!("{e}"));
    let chunk = SeqChunk {
        prompt_len: n,
        tokens: TOKENS.to_vec(),
        start: 0,
        blocks: (0..n.div_ceil(BLOCK_SIZE) as u32).collect(),
        sample: None,
    };
    let batch = build_step(&[chunk], BLOCK_SIZE).unwrap_or_else(|e| panic!("{e}"));
    let rows: Vec<usize> = (0..n).collect();
    let z = b.logits(&batch, &rows).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(b.config().vocab_size, vocab);
    z.chunks_exact(vocab).map(<[f32]>::to_vec).collect()
}

fn check(preset: Preset) {
    let dir = tempfile::TempDir::new().expect("tempdir");
    let opts = SynthOptions {
        preset,
        seed: 11,
        tokenizer_wheel: None,
        tokenizer_npm: None,
        layers: Some(2),
    };
    synth_model_with(&opts, dir.path()).unwrap_or_else(|e| panic!("{e}"));
    let vocab = preset.config().unwrap_or_else(|e| panic!("{e}")).vocab_size;
    let want = hf_logits(dir.path(), vocab);
    // the check means something only if the rows are far from uniform
    let spread = want
        .iter()
        .map(|row| {
            let lo = row.iter().copied().fold(f32::INFINITY, f32::min);
            let hi = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            f64::from(hi - lo)
        })
        .fold(f64::INFINITY, f64::min);
    assert!(
        spread > MIN_LOGIT_SPREAD,
        "{preset}: logits span only {spread}"
    );
    for path in [CpuPath::Reference, CpuPath::Fast] {
        let got = lamina_logits(dir.path(), path);
        let mut worst = 0f64;
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let g = log_softmax(g.iter().map(|&v| f64::from(v)));
            let w = log_softmax(w.iter().map(|&v| f64::from(v)));
            let e = g
                .iter()
                .zip(&w)
                .fold(0f64, |m, (a, b)| m.max((a - b).abs()));
            worst = worst.max(e);
            assert!(e <= MAX_LOGPROB_DIFF, "{preset} {path:?} position {i}: {e}");
        }
        eprintln!(
            "{preset} {path:?}: largest log-probability difference {worst:.2e} (logits span at least {spread:.2})"
        );
    }
}

#[test]
#[ignore = "needs torch and transformers (module doc)"]
fn qwen3_0_6b_matches_transformers() {
    check(Preset::Qwen3_0_6b);
}

#[test]
#[ignore = "needs torch and transformers (module doc)"]
fn qwen3_1_7b_matches_transformers() {
    check(Preset::Qwen3_1_7b);
}

#[test]
#[ignore = "needs torch and transformers (module doc)"]
fn qwen2_5_0_5b_matches_transformers() {
    check(Preset::Qwen2_5_0_5b);
}
