//! A model with int4 projections (AWQ / GPTQ / compressed-tensors'
//! stored form) on the CPU backend: the fast path close to the exact pass
//! over the dequantised weights, on prompt and generated rows, and the
//! reference path equal to the same model with those weights in BF16.

use super::batch::{SeqChunk, build_step, contiguous_blocks};
use super::tests::{BS, LONG_PROMPT, chunk, config_with, naive_with, rel_err, weights};
use super::*;
use checkpoint::int4::Int4Tensor;
use checkpoint::projection::Projection;
use checkpoint::weights::Tensor;
use contract::Backend;
use std::collections::HashMap;

const GROUP: usize = 32;

fn backend(c: &ModelConfig, w: ModelWeights, path: CpuPath) -> CpuBackend {
    let kv = KvShape {
        num_blocks: 16,
        block_size: BS,
    };
    CpuBackend::with_weights(c.clone(), w, kv, path, CpuWeights::Stored).unwrap()
}

fn logits_of(b: &mut CpuBackend, tokens: &[u32], as_prompt: bool) -> Vec<f32> {
    let c = SeqChunk {
        prompt_len: if as_prompt { tokens.len() } else { 0 },
        ..chunk(tokens, 0, contiguous_blocks(0, tokens.len(), BS))
    };
    let batch = build_step(&[c], BS).unwrap();
    b.logits(&batch, &(0..tokens.len()).collect::<Vec<_>>())
        .unwrap()
}

/// `t` rounded to int4, its stored columns in the order `perm` (input
/// column `perm[c]` at stored column `c`) when given.
fn int4(t: &Tensor, sym: bool, perm: Option<&[u32]>) -> Int4Tensor {
    let Some(perm) = perm else {
        return Int4Tensor::round_to_nearest(t, GROUP, sym);
    };
    let k = t.shape[1];
    let mut shuffled = t.clone();
    for (dst, src) in shuffled
        .data
        .chunks_exact_mut(k)
        .zip(t.data.chunks_exact(k))
    {
        for (c, &i) in perm.iter().enumerate() {
            dst[c] = src[i as usize];
        }
    }
    let mut q = Int4Tensor::round_to_nearest(&shuffled, GROUP, sym);
    q.perm = Some(perm.to_vec());
    q
}

/// The test model with int4 projections: layer 0's Q/K/V in one column
/// order (one fused int4 matrix), layer 1's Q alone in one (its fused
/// Q/K/V decoded), symmetric and asymmetric grids alternating.
fn int4_weights(c: &ModelConfig) -> ModelWeights {
    let mut w = weights(c, false);
    let h = c.hidden_size as u32;
    let perm: Vec<u32> = (0..h).map(|i| (i * 7 + 3) % h).collect();
    for (l, lw) in w.layers.iter_mut().enumerate() {
        for (i, p) in lw.projections_mut().into_iter().enumerate() {
            let t = p.as_bf16().expect("BF16 test weights").clone();
            let ordered = (l == 0 && i < 3) || (l == 1 && i == 0);
            let q = int4(&t, i % 2 == 0, ordered.then_some(&perm[..]));
            *p = Projection::Int4(Int4Tensor {
                name: format!("{l}.{}", t.name),
                ..q
            });
        }
    }
    w
}

#[test]
fn int4_logits_track_the_exact_pass_over_the_dequantised_weights() {
    let c = config_with(false, 64);
    let w = int4_weights(&c);
    // layer 1's Q/K/V (one in its own column order) run as their BF16
    // values; every other projection as its exact int4 values
    let decoded = |name: &str| ["1.q", "1.k", "1.v"].contains(&name);
    let exact: HashMap<String, Vec<f64>> = (w.projections().into_iter())
        .filter(|p| matches!(p, Projection::Int4(_)) && !decoded(p.name()))
        .map(|p| {
            let v = p.to_f32_rows().unwrap();
            (
                p.name().to_string(),
                v.iter().map(|&x| f64::from(x)).collect(),
            )
        })
        .collect();
    let values = |t: &Tensor| {
        (exact.get(&t.name).cloned())
            .unwrap_or_else(|| t.data.iter().map(|v| f64::from(v.to_f32())).collect())
    };
    let want = naive_with(&c, &w, &LONG_PROMPT, &values);
    // (layer 1's BF16 projections in f32 on prompt rows too: on a processor
    // with AVX-512 BF16 and VNNI they would run the 8-bit split products)
    let mut fast = backend(&c, w.clone(), CpuPath::Fast).without_split_products();
    assert!(fast.name().contains("int4 g32"), "{}", fast.name());
    let vocab = c.vocab_size;
    for as_prompt in [true, false] {
        let got = logits_of(&mut fast, &LONG_PROMPT, as_prompt);
        for (r, want) in want.iter().enumerate() {
            // f32 products over the exact int4 values against an f64 pass:
            // the sums' order only, 2e-7 to 7e-7 measured (a wrong nibble,
            // scale, zero or column order moves the logits by order 1;
            // running one projection group on its BF16 values instead,
            // by 1e-3)
            let e = rel_err(&got[r * vocab..(r + 1) * vocab], want);
            assert!(e < 1e-5, "prompt={as_prompt} row {r}: {e}");
        }
    }
}

#[test]
fn the_reference_path_runs_int4_as_its_bf16_values() {
    let c = config_with(false, 64);
    let w = int4_weights(&c);
    let mut dense = w.clone();
    for p in dense.projections_mut() {
        *p = Projection::Bf16(p.dense().unwrap().into_owned());
    }
    let mut a = backend(&c, w, CpuPath::Reference);
    let mut b = backend(&c, dense, CpuPath::Reference);
    for as_prompt in [true, false] {
        assert_eq!(
            logits_of(&mut a, &LONG_PROMPT, as_prompt),
            logits_of(&mut b, &LONG_PROMPT, as_prompt)
        );
    }
}
