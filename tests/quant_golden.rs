//! The quantised CPU path against the oracle: SmolLM2-135M run from the
//! Q4_1 / Q8_0 blocks of its own GGUF (`--dtype auto`), teacher-forced, its
//! log-probabilities against the oracle's on the same GGUF dequantised to
//! f32 (`tests/golden/smollm2-q4_1.json`, written by `cargo xtask
//! regen-references --only smollm2-q4_1`).
//!
//! Contract: for every sequence (each golden prompt followed by its greedy
//! continuation), the log-probability of each next token differs from the
//! oracle's by at most [`MAX_LOGPROB_DIFF`], both when the whole sequence
//! runs as one prefill chunk and when it runs one token per step (decode).
//! The approximations besides the order of additions: the 16-bit rounding
//! of the activations before each quantised product, and the BF16 copies
//! of the norms and of the embedding rows (the store's import). Measured:
//! largest difference 0.008 nats (the BF16 path on the same weights:
//! 0.038; with 8-bit activations as llama.cpp has them: 0.23).
//!
//! Costs: loads the BF16 model and the GGUF's blocks, about 4 x 2 passes
//! over ~30 tokens of a 135M model.

use checkpoint::loader::load_config;
use contract::Backend;
use model::cpu::batch::{SeqChunk, build_step};
use serde::Deserialize;
use std::path::Path;

const BLOCK_SIZE: usize = 16;
/// Largest difference of a teacher-forced log-probability (nats).
const MAX_LOGPROB_DIFF: f64 = 0.05;

#[derive(Deserialize)]
struct TeacherForced {
    model: String,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    tokens: Vec<u32>,
    /// `logprobs[i]` = log p(tokens[i + 1] | tokens[..= i]).
    logprobs: Vec<f64>,
}

/// `log p(next)` of each row of `logits` (`[rows, vocab]`).
fn logprobs(logits: &[f32], vocab: usize, next: &[u32]) -> Vec<f64> {
    logits
        .chunks_exact(vocab)
        .zip(next)
        .map(|(z, &t)| lamina_tests::log_softmax(z.iter().map(|&v| v as f64))[t as usize])
        .collect()
}

#[test]
fn smollm2_from_its_gguf_blocks_matches_the_oracle_teacher_forced() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("golden/smollm2-q4_1.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run `cargo xtask regen-references`)",
            path.display()
        )
    });
    let golden: TeacherForced =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(golden.cases.len() >= 3, "only {} cases", golden.cases.len());
    let dir = checkpoint::store::resolve(&golden.model, true).unwrap_or_else(|e| panic!("{e}"));
    let gguf = checkpoint::store::source_gguf(&dir)
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("{} names no source GGUF", dir.display()));
    let loaded = load_config(&dir).unwrap_or_else(|e| panic!("{e}"));
    let cfg = loaded.config;
    let weights = lamina_tests::weights_with_blocks(&dir, &gguf, &cfg);
    // every projection kept in its blocks (the file is Q4_1 with a Q8_0 head)
    assert_eq!(
        lamina_tests::kept_blocks(&weights).len(),
        7 * cfg.num_layers + 1
    );
    let longest = golden
        .cases
        .iter()
        .map(|c| c.tokens.len())
        .max()
        .unwrap_or(0);
    let mut backend = lamina_tests::fast_blocks_backend(&cfg, weights, longest, BLOCK_SIZE);
    assert!(backend.name().contains("Q4_1"), "{}", backend.name());
    let vocab = cfg.vocab_size;
    let table: Vec<u32> = (0..longest.div_ceil(BLOCK_SIZE) as u32).collect();
    let mut worst = 0f64;
    for case in &golden.cases {
        let n = case.tokens.len();
        assert_eq!(case.logprobs.len(), n - 1);
        let next = &case.tokens[1..];
        // the whole sequence as one prompt chunk (the prompt rows' GEMM)
        let chunk = SeqChunk {
            prompt_len: n,
            tokens: case.tokens.clone(),
            start: 0,
            blocks: table.clone(),
            sample: None,
        };
        let batch = build_step(&[chunk], BLOCK_SIZE).unwrap_or_else(|e| panic!("{e}"));
        let rows: Vec<usize> = (0..n - 1).collect();
        let logits = backend
            .logits(&batch, &rows)
            .unwrap_or_else(|e| panic!("{e}"));
        let prefill = logprobs(&logits, vocab, next);
        // one generated token per step (the row kernel)
        let mut decode = Vec::with_capacity(n - 1);
        for (i, &t) in case.tokens[..n - 1].iter().enumerate() {
            let chunk = SeqChunk {
                prompt_len: 0,
                tokens: vec![t],
                start: i,
                blocks: table.clone(),
                sample: None,
            };
            let batch = build_step(&[chunk], BLOCK_SIZE).unwrap_or_else(|e| panic!("{e}"));
            let z = backend
                .logits(&batch, &[0])
                .unwrap_or_else(|e| panic!("{e}"));
            decode.extend(logprobs(&z, vocab, &next[i..i + 1]));
        }
        for (what, got) in [("prefill", &prefill), ("decode", &decode)] {
            for (i, (&a, &b)) in got.iter().zip(&case.logprobs).enumerate() {
                worst = worst.max((a - b).abs());
                assert!(
                    (a - b).abs() <= MAX_LOGPROB_DIFF,
                    "{what} position {i} of {:?}: log p {a:.4} vs the oracle's {b:.4}",
                    case.tokens
                );
            }
        }
    }
    eprintln!("largest teacher-forced log-probability difference: {worst:.4}");
}
