//! A GGUF's Q4_K and Q4_1 blocks run as they are on the CPU, end to end:
//! `tests/python/gguf_types.py model` writes a two-layer llama (hidden 256)
//! whose layer 0 is a Q4_K_M-like mix (Q4_K Q, K, O, gate and up; Q6_K V,
//! down and head) and whose layer 1 has a Q4_1 down projection; the store
//! imports it (BF16 copies of the dequantised tensors), and
//! `load_quantized` keeps the Q4_K and Q4_1 blocks.
//!
//! Contract: the fast path on those blocks (`--dtype auto`) gives logits
//! within [`MAX_REL_ERR`] of the reference path on the imported BF16
//! weights, for the sequence as one prompt chunk (the quantised GEMM) and
//! one token per step (the row kernels). The difference is the BF16
//! rounding of the reference's weights (the blocks path multiplies the
//! exact dequantised values) and the activations' 16-bit rounding: about
//! 5e-3 measured; a wrong nibble or scale gives 0.1 to 1.4.
//!
//! Needs `python3` with `gguf` importable (`cargo xtask test` installs it).

use checkpoint::loader::{load_config, load_weights};
use checkpoint::quantized::load_quantized;
use contract::{Backend, KvShape};
use model::cpu::batch::{SeqChunk, build_step};
use model::cpu::{CpuBackend, CpuPath, CpuWeights, KEPT_GGML_TYPES};
use std::path::Path;
use std::process::Command;

const BLOCK_SIZE: usize = 8;
/// Largest relative (L2) difference of a row of logits.
const MAX_REL_ERR: f64 = 1e-2;
const TOKENS: [u32; 12] = [5, 0, 1, 2, 3, 4, 7, 2, 2, 0, 4, 1];

fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 - y as f64).powi(2))
        .sum();
    let den: f64 = b.iter().map(|&y| (y as f64).powi(2)).sum();
    (num / den).sqrt()
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
fn q4k_and_q4_1_blocks_of_a_gguf_match_the_reference_path() {
    let dir = tempfile::TempDir::new().unwrap();
    write_model(dir.path());
    let gguf = dir.path().join("llama.gguf");
    let store = checkpoint::store::Store::new(dir.path().join("store"));
    let (_, model) = store.import_gguf(&gguf).unwrap_or_else(|e| panic!("{e}"));
    let cfg = load_config(&model).unwrap_or_else(|e| panic!("{e}")).config;
    let blocks = load_quantized(&gguf, &cfg, &KEPT_GGML_TYPES).unwrap_or_else(|e| panic!("{e}"));
    let kept: Vec<String> = blocks
        .tensors()
        .map(|t| format!("{} {}", t.name, t.ty))
        .collect();
    // Q4_K: layer 0's Q, K, O, gate, up; Q4_1: layer 1's down (V, the
    // other layer-0 tensors and the head are Q6_K / other types: BF16)
    assert_eq!(kept.len(), 6, "{kept:?}");
    assert_eq!(kept.iter().filter(|k| k.ends_with("Q4_K")).count(), 5);
    let kv = KvShape {
        num_blocks: TOKENS.len().div_ceil(BLOCK_SIZE),
        block_size: BLOCK_SIZE,
    };
    let open = |path, format| {
        let weights = load_weights(&model, &cfg).unwrap_or_else(|e| panic!("{e}"));
        CpuBackend::with_weights(cfg.clone(), weights, kv, path, format)
            .unwrap_or_else(|e| panic!("{e}"))
    };
    let mut reference = open(CpuPath::Reference, CpuWeights::Bf16);
    let mut fast = open(CpuPath::Fast, CpuWeights::Blocks(blocks));
    // layer 0's Q/K/V is a stack (Q and K Q4_K, V BF16 from Q6_K); O and
    // gate/up run Q4_K, layer 1's down Q4_1
    assert!(fast.name().contains("Q4_1+Q4_K"), "{}", fast.name());
    let want = logits(&mut reference, true);
    let mut worst = 0f64;
    for prefill in [true, false] {
        for (i, (g, w)) in logits(&mut fast, prefill).iter().zip(&want).enumerate() {
            let e = rel_err(g, w);
            worst = worst.max(e);
            assert!(e <= MAX_REL_ERR, "prefill={prefill} position {i}: {e}");
        }
    }
    eprintln!("largest relative logit difference: {worst:.2e}");
}
