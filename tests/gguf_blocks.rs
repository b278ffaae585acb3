//! A GGUF's Q4_K, Q6_K and Q4_1 blocks run as they are on the CPU, end to
//! end: `tests/python/gguf_types.py model` writes a two-layer llama (hidden
//! 256) whose layer 0 is a Q4_K_M-like mix (Q4_K Q, K, O, gate and up; Q6_K
//! V, down and head) and whose layer 1 mixes other types with a Q4_1 down
//! projection; the store imports it (BF16 copies of the dequantised
//! tensors), and `keep_blocks` keeps the Q4_K, Q6_K and Q4_1 blocks.
//!
//! Contract: the fast path on those blocks (`--dtype auto`) gives
//! log-probabilities within [`MAX_LOGPROB_DIFF`] of an f64 forward pass over the `gguf` package's
//! own dequantisation of every tensor (`ref/*.f32`), for the sequence as
//! one prompt chunk (the quantised GEMM) and one token per step (the row
//! kernels). The difference is mostly the BF16 copies of the tensors not
//! kept (layer 1's other types, the embedding, the norms: the store's
//! import), plus the activations' 16-bit rounding before the kept
//! tensors' products: 0.012 nats measured (the reference path on the
//! BF16 copies of every tensor: 0.020); a wrong nibble or scale moves
//! them by far more.
//!
//! Needs `python3` with `gguf` importable (`cargo xtask test` installs it).

use checkpoint::loader::load_config;
use contract::Backend;
use lamina_tests::log_softmax;
use model::cpu::CpuBackend;
use model::cpu::batch::{SeqChunk, build_step};
use model::exact::{ExactWeights, forward};
use std::path::Path;
use std::process::Command;

const BLOCK_SIZE: usize = 8;
/// Largest difference of a log-probability (nats), over every position and
/// vocabulary entry.
const MAX_LOGPROB_DIFF: f64 = 0.03;
const TOKENS: [u32; 12] = [5, 0, 1, 2, 3, 4, 7, 2, 2, 0, 4, 1];

/// The largest difference of two rows' log-probabilities (nats).
fn logprob_diff(a: &[f32], b: &[f64]) -> f64 {
    let a = log_softmax(a.iter().map(|&v| v as f64));
    a.iter()
        .zip(log_softmax(b.iter().copied()))
        .fold(0f64, |m, (x, y)| m.max((x - y).abs()))
}

/// The f64 forward pass of [`TOKENS`] over the exact tensors in `dir`
/// (`<Hugging Face name>.f32`): `[position][vocab]` logits.
fn exact_logits(c: &contract::ModelConfig, dir: &Path) -> Vec<Vec<f64>> {
    let w = ExactWeights::from_names(c, |name| {
        let path = dir.join(format!("{name}.f32"));
        std::fs::read(&path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64)
            .collect()
    });
    forward(c, &w, &TOKENS)
}

fn write_model(dir: &Path) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/gguf_types.py");
    let out = Command::new("python3")
        .arg(&script)
        .arg("model")
        .arg(dir)
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "{} failed ({}): {}\n(needs the `gguf` Python package: run `cargo xtask test`, which installs it into .cache/pydeps)",
        script.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `[rows, vocab]` logits of `backend` for every position of [`TOKENS`],
/// as one prompt chunk (`prefill`) or one generated token per step.
fn logits(backend: &mut CpuBackend, prefill: bool) -> Vec<Vec<f32>> {
    let n = TOKENS.len();
    let blocks: Vec<u32> = (0..n.div_ceil(BLOCK_SIZE) as u32).collect();
    let chunk = |tokens: &[u32], start: usize, prompt_len: usize| SeqChunk {
        prompt_len,
        tokens: tokens.to_vec(),
        start,
        blocks: blocks.clone(),
        sample: None,
    };
    let run = |b: &mut CpuBackend, c: SeqChunk, rows: &[usize]| {
        let batch = build_step(&[c], BLOCK_SIZE).unwrap_or_else(|e| panic!("{e}"));
        b.logits(&batch, rows).unwrap_or_else(|e| panic!("{e}"))
    };
    let vocab = backend.config().vocab_size;
    if prefill {
        let rows: Vec<usize> = (0..n).collect();
        let z = run(backend, chunk(&TOKENS, 0, n), &rows);
        z.chunks_exact(vocab).map(<[f32]>::to_vec).collect()
    } else {
        (0..n)
            .map(|i| run(backend, chunk(&TOKENS[i..i + 1], i, 0), &[0]))
            .collect()
    }
}

#[test]
fn k_type_and_q4_1_blocks_of_a_gguf_match_the_exact_pass() {
    let dir = tempfile::TempDir::new().unwrap();
    write_model(dir.path());
    let gguf = dir.path().join("llama.gguf");
    let store = checkpoint::store::Store::new(dir.path().join("store"));
    let (_, model) = store.import_gguf(&gguf).unwrap_or_else(|e| panic!("{e}"));
    let cfg = load_config(&model).unwrap_or_else(|e| panic!("{e}")).config;
    let weights = lamina_tests::weights_with_blocks(&model, &gguf, &cfg);
    let kept = lamina_tests::kept_blocks(&weights);
    // Q4_K: layer 0's Q, K, O, gate, up; Q6_K: its V and down and the
    // head; Q4_1: layer 1's down (layer 1's other types run BF16)
    assert_eq!(kept.len(), 9, "{kept:?}");
    assert_eq!(kept.iter().filter(|k| k.ends_with("Q4_K")).count(), 5);
    assert_eq!(kept.iter().filter(|k| k.ends_with("Q6_K")).count(), 3);
    let mut fast = lamina_tests::fast_blocks_backend(&cfg, weights, TOKENS.len(), BLOCK_SIZE);
    // layer 0's Q/K/V is a stack (Q and K Q4_K, V Q6_K); O and gate/up
    // run Q4_K, its down Q6_K, layer 1's down Q4_1, the head Q6_K
    assert!(fast.name().contains("Q4_1+Q4_K+Q6_K"), "{}", fast.name());
    let want = exact_logits(&cfg, &dir.path().join("ref"));
    let mut worst = 0f64;
    for prefill in [true, false] {
        for (i, (g, w)) in logits(&mut fast, prefill).iter().zip(&want).enumerate() {
            let e = logprob_diff(g, w);
            worst = worst.max(e);
            assert!(e <= MAX_LOGPROB_DIFF, "prefill={prefill} position {i}: {e}");
        }
    }
    eprintln!("largest log-probability difference: {worst:.2e}");
}
