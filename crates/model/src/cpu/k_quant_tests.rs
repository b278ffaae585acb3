//! The fast path on the K types (Q4_K, Q6_K): the kernels' dequantisation
//! equal to the GGUF reader's, a model whose rows are whole super-blocks of
//! 256 close to the exact forward pass on prompt and generated rows, a
//! GGUF's blocks equal to the same blocks quantised at load, and
//! `Quantize(Q4_K)` falling back to Q4_1 for narrower rows.

use super::batch::{SeqChunk, build_step, contiguous_blocks};
use super::tests::{
    BS, LONG_PROMPT, PROMPT, blocks as blocks_of, chunk, config_with, naive_with, rel_err, weights,
};
use super::*;
use checkpoint::gguf::GgmlType;
use checkpoint::projection::Projection;
use checkpoint::quantized::QuantTensor;
use checkpoint::synth::splitmix64;
use contract::Backend;
use cpu_kernels::quant::{QuantType, dequantize_row};
use std::collections::HashMap;

/// Hidden 256, intermediate 512, 4 heads of 64: every projection's rows
/// are whole super-blocks.
fn wide_config(tied: bool) -> ModelConfig {
    let text = format!(
        r#"{{"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 50,
        "rms_norm_eps": 1e-5, "max_position_embeddings": 64, "rope_theta": 10000.0,
        "tie_word_embeddings": {tied}}}"#
    );
    ModelConfig::from_json(&text, "test").unwrap()
}

fn backend(c: &ModelConfig, w: ModelWeights, format: CpuWeights) -> CpuBackend {
    let kv = KvShape {
        num_blocks: 16,
        block_size: BS,
    };
    CpuBackend::with_weights(c.clone(), w, kv, CpuPath::Fast, format).unwrap()
}

/// Logits of every position of `tokens` as one chunk: prompt rows (the
/// quantised GEMM) or generated rows (the row kernels).
fn logits_of(b: &mut CpuBackend, tokens: &[u32], as_prompt: bool) -> Vec<f32> {
    let c = SeqChunk {
        prompt_len: if as_prompt { tokens.len() } else { 0 },
        ..chunk(tokens, 0, contiguous_blocks(0, tokens.len(), BS))
    };
    let batch = build_step(&[c], BS).unwrap();
    b.logits(&batch, &(0..tokens.len()).collect::<Vec<_>>())
        .unwrap()
}

#[test]
fn kernels_dequantise_k_types_like_the_gguf_reader() {
    let blocks = 40;
    for (qt, ty) in [
        (QuantType::Q4_K, GgmlType::Q4_K),
        (QuantType::Q6_K, GgmlType::Q6_K),
    ] {
        let bb = qt.block_bytes();
        let mut bytes: Vec<u8> = (0..blocks * bb)
            .map(|i| splitmix64(i as u64 ^ 0x51) as u8)
            .collect();
        for (b, block) in bytes.chunks_exact_mut(bb).enumerate() {
            // finite f16 scales of either sign (random bits may be NaN or
            // Inf): Q4_K's d and dmin lead the block, Q6_K's d ends it
            let d = half::f16::from_f32(((b % 7) as f32 - 3.0) * 0.01);
            let dmin = half::f16::from_f32(((b % 5) as f32 - 1.5) * 0.003);
            if qt == QuantType::Q4_K {
                block[..2].copy_from_slice(&d.to_le_bytes());
                block[2..4].copy_from_slice(&dmin.to_le_bytes());
            } else {
                block[bb - 2..].copy_from_slice(&d.to_le_bytes());
            }
        }
        let want = checkpoint::gguf::dequantize(ty, &bytes, blocks * 256).unwrap();
        let mut got = vec![f32::NAN; blocks * 256];
        dequantize_row(qt, &bytes, &mut got);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-6 * w.abs(),
                "{qt:?} weight {i}: {g} vs {w}"
            );
        }
    }
}

/// The exact values of the `qt` blocks `q`.
fn dequantised(qt: QuantType, q: &QuantTensor) -> Vec<f64> {
    let mut f = vec![0f32; q.rows * q.cols];
    let rb = qt.matrix_bytes(1, q.cols);
    for (r, out) in f.chunks_exact_mut(q.cols).enumerate() {
        dequantize_row(qt, &q.data[r * rb..(r + 1) * rb], out);
    }
    f.iter().map(|&v| v as f64).collect()
}

/// Close to the exact pass over the dequantised weights (the blocks'
/// values), on prompt rows and generated rows;
/// the same blocks from a GGUF and quantised at load give the same bits.
#[test]
fn k_type_logits_track_the_exact_pass_and_gguf_blocks_equal_load_time_ones() {
    for (qt, ty, tied) in [
        (QuantType::Q4_K, GgmlType::Q4_K, true),
        (QuantType::Q4_K, GgmlType::Q4_K, false),
        (QuantType::Q6_K, GgmlType::Q6_K, true),
        (QuantType::Q6_K, GgmlType::Q6_K, false),
    ] {
        let c = wide_config(tied);
        let mut bf = weights(&c, tied);
        // names unique across layers (the exact values are found by name)
        for (i, l) in bf.layers.iter_mut().enumerate() {
            for p in l.projections_mut() {
                if let Projection::Bf16(t) = p {
                    t.name = format!("{i}.{}", t.name);
                }
            }
        }
        let mut w = bf.clone();
        for p in w.layers.iter_mut().flat_map(|l| l.projections_mut()) {
            if let Projection::Bf16(t) = p {
                *p = Projection::Blocks(blocks_of(t, qt, ty));
            }
        }
        // the projections' exact values, the other tensors' BF16 ones
        let exact: HashMap<String, Vec<f64>> = (w.projections().into_iter())
            .filter_map(|p| match p {
                Projection::Blocks(t) => Some((t.name.clone(), dequantised(qt, t))),
                _ => None,
            })
            .collect();
        let values = |t: &Tensor| {
            exact
                .get(&t.name)
                .cloned()
                .unwrap_or_else(|| t.data.iter().map(|v| v.to_f32() as f64).collect())
        };
        let want = naive_with(&c, &w, &LONG_PROMPT, &values);
        let mut from_gguf = backend(&c, w.clone(), CpuWeights::Stored);
        let name = format!("gguf {}", qt.name());
        assert!(from_gguf.name().contains(&name), "{}", from_gguf.name());
        let mut worst = 0f64;
        for as_prompt in [true, false] {
            let got = logits_of(&mut from_gguf, &LONG_PROMPT, as_prompt);
            for (r, w) in want.iter().enumerate() {
                // the activations' 16-bit rounding and f32 sums: 3.2e-4
                // (Q4_K) and 8.1e-4 (Q6_K)
                // measured (these flat random-weight logits amplify any
                // rounding ~25x); a wrong block layout or scale: order 1
                let e = rel_err(&got[r * 50..(r + 1) * 50], w);
                worst = worst.max(e);
                assert!(
                    e < 2e-3,
                    "{qt:?} tied={tied} prompt={as_prompt} row {r}: {e}"
                );
            }
        }
        eprintln!("{qt:?} tied={tied}: largest relative error {worst:.2e}");
        // quantised at load: the same projections, the head Q8_0
        let head = blocks_of(&bf.head_dense().unwrap(), QuantType::Q8_0, GgmlType::Q8_0);
        w.lm_head = Some(Projection::Blocks(head));
        let mut from_gguf = backend(&c, w, CpuWeights::Stored);
        let mut at_load = backend(&c, bf, CpuWeights::Quantize(qt));
        let name = qt.name().to_lowercase();
        assert!(at_load.name().contains(&name), "{}", at_load.name());
        for as_prompt in [true, false] {
            assert_eq!(
                logits_of(&mut from_gguf, &PROMPT, as_prompt),
                logits_of(&mut at_load, &PROMPT, as_prompt)
            );
        }
    }
}

#[test]
fn q4k_falls_back_to_q4_1_for_rows_that_are_not_whole_super_blocks() {
    // hidden 32: no projection's rows are whole super-blocks
    let c = config_with(true, 64);
    let mut k = backend(&c, weights(&c, true), CpuWeights::Quantize(QuantType::Q4_K));
    let mut one = backend(&c, weights(&c, true), CpuWeights::Quantize(QuantType::Q4_1));
    for as_prompt in [true, false] {
        assert_eq!(
            logits_of(&mut k, &LONG_PROMPT, as_prompt),
            logits_of(&mut one, &LONG_PROMPT, as_prompt)
        );
    }
}
