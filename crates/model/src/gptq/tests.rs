//! GPTQ on small problems: lower output error than round-to-nearest, equal
//! to it when the Hessian is the identity, dead inputs, and the sequential
//! pass over a tiny random model (closer to BF16's logits than rounding,
//! bad input refused).

use super::solve::{Factor, ScaleRule, gptq, round_to_nearest, scales};
use super::*;
use crate::cpu::tests::{config, weights};
use crate::exact::{ExactWeights, forward};
use checkpoint::weights::ModelWeights;
use contract::sampling::splitmix64;

/// Uniform values in `[-1, 1)` from `seed`.
pub(super) fn uniform(len: usize, seed: u64) -> Vec<f32> {
    (0..len as u64)
        .map(|i| (splitmix64(i ^ (seed << 32)) >> 40) as f32 / (1u32 << 23) as f32 - 1.0)
        .collect()
}

/// Inputs `[t, k]` with correlated columns and uneven magnitudes, as real
/// activations have: a few shared factors plus noise, some columns large.
pub(super) fn inputs(t: usize, k: usize, seed: u64) -> Vec<f32> {
    let f = 4;
    let factors = uniform(t * f, seed); // [t, f]
    let mix = uniform(f * k, seed + 1); // [f, k]
    let noise = uniform(t * k, seed + 2); // [t, k]
    (0..t * k)
        .map(|i| {
            let (r, c) = (i / k, i % k);
            let shared: f32 = (0..f).map(|j| factors[r * f + j] * mix[j * k + c]).sum();
            (shared + 0.3 * noise[i]) * if c % 7 == 0 { 4.0 } else { 1.0 }
        })
        .collect()
}

/// `||x w^T - x deq(q)^T||^2` for `x` `[t, k]`, `w` and `q` `[n, k]`.
fn output_error(x: &[f32], w: &[f32], q: &[u8], s: &[f32], k: usize) -> f64 {
    let deq: Vec<f64> = q
        .iter()
        .enumerate()
        .map(|(i, &b)| ops::fp8::decode(b) as f64 * s[i / k] as f64)
        .collect();
    let mut sum = 0.0;
    for xr in x.chunks(k) {
        for (wr, dr) in w.chunks(k).zip(deq.chunks(k)) {
            let d: f64 = (0..k).map(|c| xr[c] as f64 * (wr[c] as f64 - dr[c])).sum();
            sum += d * d;
        }
    }
    sum
}

const CHANNEL: ScaleRule = ScaleRule {
    per_channel: true,
    bf16: true,
};

/// GPTQ at dampening 0.01, blocks of 16 columns.
fn solve(w: &[f32], n: usize, k: usize, h: &Hessian, s: &[f32], act_order: bool) -> Vec<u8> {
    let f = Factor::new(h, 0.01, act_order).unwrap();
    gptq(w, n, k, &f, s, 16)
}

#[test]
fn gptq_has_a_lower_output_error_than_rounding_to_nearest() {
    let (t, n, k) = (256, 24, 72); // k not a multiple of the block
    let x = inputs(t, k, 1);
    let w: Vec<f32> = uniform(n * k, 9).iter().map(|v| v * 0.05).collect();
    let h = Hessian::of(&x, k);
    for rule in [
        CHANNEL,
        ScaleRule {
            per_channel: false,
            bf16: false,
        },
    ] {
        let s = scales(&w, n, k, rule);
        let rtn = output_error(&x, &w, &round_to_nearest(&w, n, k, &s), &s, k);
        for act_order in [false, true] {
            let q = solve(&w, n, k, &h, &s, act_order);
            let e = output_error(&x, &w, &q, &s, k);
            assert!(
                e < 0.5 * rtn,
                "{rule:?} act_order {act_order}: {e} vs {rtn}"
            );
        }
    }
}

#[test]
fn with_the_identity_hessian_gptq_is_rounding_to_nearest() {
    let (n, k) = (10, 40);
    let w: Vec<f32> = uniform(n * k, 3).iter().map(|v| v * 0.3).collect();
    let mut eye = vec![0f64; k * k];
    (0..k).for_each(|i| eye[i * k + i] = 1.0);
    let h = Hessian::from_matrix(k, eye);
    let rule = ScaleRule {
        per_channel: true,
        bf16: false,
    };
    let s = scales(&w, n, k, rule);
    for act_order in [false, true] {
        let q = solve(&w, n, k, &h, &s, act_order);
        assert_eq!(q, round_to_nearest(&w, n, k, &s));
    }
    // and that is the loader's rounding, scales included
    let (bits, loader_scales) = ops::fp8::quantize_rows(&w, n, k);
    assert_eq!((round_to_nearest(&w, n, k, &s), s), (bits, loader_scales));
}

#[test]
fn dead_inputs_are_zeroed_and_bf16_scales_are_exact() {
    let (t, n, k) = (64, 6, 20);
    let mut x = inputs(t, k, 4);
    x.iter_mut().skip(5).step_by(k).for_each(|v| *v = 0.0); // input 5 dead
    let w = uniform(n * k, 5);
    let s = scales(&w, n, k, CHANNEL);
    for (row, &sc) in w.chunks(k).zip(&s) {
        let amax = row.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert!(sc >= amax / 448.0 && sc < amax / 448.0 * 1.01);
        assert_eq!(half::bf16::from_f32(sc).to_f32(), sc);
    }
    let q = solve(&w, n, k, &Hessian::of(&x, k), &s, false);
    for r in 0..n {
        assert_eq!(ops::fp8::decode(q[r * k + 5]), 0.0, "row {r}");
    }
}

#[test]
fn an_indefinite_hessian_is_an_error_naming_the_column() {
    let k = 3;
    let mut m = vec![0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, -5.0];
    m[0] = 1.0;
    let h = Hessian::from_matrix(k, m);
    assert_eq!(Factor::new(&h, 0.01, false), Err(2));
    assert_eq!(Factor::new(&h, 0.01, true).map(|_| ()), Err(2));
}

/// Logits of `tokens` in f64 (FP8 projections at their dequantised
/// values).
/// The squared distance of `w`'s logits over `tokens` from `want`.
pub(super) fn logit_distance(
    c: &contract::ModelConfig,
    w: &ModelWeights,
    tokens: &[u32],
    want: &[Vec<f64>],
) -> f64 {
    let got = logits(c, w, tokens);
    let sq =
        |a: &Vec<f64>, b: &Vec<f64>| a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum::<f64>();
    want.iter().zip(&got).map(|(a, b)| sq(a, b)).sum()
}

pub(super) fn logits(c: &contract::ModelConfig, w: &ModelWeights, tokens: &[u32]) -> Vec<Vec<f64>> {
    let ex =
        ExactWeights::from_weights(w, |t| t.data.iter().map(|v| v.to_f64()).collect()).unwrap();
    forward(c, &ex, tokens)
}

#[test]
fn the_sequential_pass_brings_the_logits_closer_to_bf16_than_rounding() {
    let c = config(false);
    let w = weights(&c, false);
    let tokens: Vec<u32> = (0..48u64).map(|i| (splitmix64(i) % 50) as u32).collect();
    let opts = GptqOptions {
        window: 48,
        block: 8,
        ..GptqOptions::default()
    };
    let mut seen = Vec::new();
    let fp8 = quantize_model(&c, w.clone(), &tokens, &opts, &mut |d, n| seen.push((d, n))).unwrap();
    assert_eq!(seen, [(1, 2), (2, 2)]);
    let layer_formats = fp8
        .layers
        .iter()
        .flat_map(|l| l.projections())
        .map(|p| p.format());
    assert!(
        layer_formats
            .into_iter()
            .all(|f| f == checkpoint::Format::Fp8Row)
    );
    assert_eq!(
        fp8.layers[1].down_proj.shape(),
        w.layers[1].down_proj.shape()
    );
    let mut rtn = w.clone();
    rtn.quantize_fp8();
    let want = logits(&c, &w, &tokens);
    let dist = |other: &ModelWeights| logit_distance(&c, other, &tokens, &want);
    let (g, r) = (dist(&fp8), dist(&rtn));
    assert!(g < 0.8 * r, "gptq {g} vs round-to-nearest {r}");
}

#[test]
fn bad_calibration_input_is_an_error_not_a_panic() {
    let c = config(true);
    let w = weights(&c, true);
    let opts = GptqOptions::default();
    let run = |w: &ModelWeights, tokens: &[u32], opts: &GptqOptions| {
        quantize_model(&c, w.clone(), tokens, opts, &mut |_, _| {}).map(|_| ())
    };
    assert_eq!(run(&w, &[], &opts), Err(GptqError::NoTokens));
    assert_eq!(
        run(&w, &[1, 50], &opts),
        Err(GptqError::Token {
            at: 1,
            id: 50,
            vocab: 50
        })
    );
    let long = GptqOptions { window: 65, ..opts };
    assert!(matches!(
        run(&w, &[1, 2], &long),
        Err(GptqError::Options(_))
    ));
    let mut fp8 = w.clone();
    fp8.quantize_fp8();
    assert_eq!(run(&fp8, &[1, 2], &opts), Err(GptqError::AlreadyFp8));
    let mut bad = w.clone();
    bad.layers[0].up_proj.as_bf16_mut().unwrap().shape = vec![1, 1];
    assert!(matches!(
        run(&bad, &[1, 2], &opts),
        Err(GptqError::Weights(_))
    ));
}
