//! FP8 activations (`CpuBackend::with_fp8_activations`) on both paths:
//! the logits move from the plain run's by e4m3's rounding of every
//! projection input, no more, and the two paths agree as closely.

use super::batch::{build_step, contiguous_blocks};
use super::tests::{BS, LONG_PROMPT, chunk, config_with, weights};
use super::*;
use contract::Backend;

fn logits(path: CpuPath, fp8: bool) -> Vec<f32> {
    let c = config_with(false, 64);
    let w = weights(&c, false);
    let kv = KvShape {
        num_blocks: 32,
        block_size: BS,
    };
    let mut b = CpuBackend::with_weights(c, w, kv, path, CpuWeights::Stored)
        .unwrap()
        .with_fp8_activations(fp8);
    let a = &LONG_PROMPT;
    let step = build_step(&[chunk(a, 0, contiguous_blocks(0, a.len(), BS))], BS).unwrap();
    b.logits(&step, &(0..a.len()).collect::<Vec<_>>()).unwrap()
}

/// `|a - b| / |b|` over the whole vectors.
fn rel(a: &[f32], b: &[f32]) -> f64 {
    let d: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum();
    let n: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
    (d / n).sqrt()
}

#[test]
fn fp8_activations_round_every_projection_input_on_both_paths() {
    let mut rounded = Vec::new();
    for path in [CpuPath::Reference, CpuPath::Fast] {
        let (plain, fp8) = (logits(path, false), logits(path, true));
        let moved = rel(&fp8, &plain);
        // e4m3 keeps 3 mantissa bits: a few percent, not nothing, not noise
        assert!(moved > 1e-3 && moved < 0.1, "{path:?}: moved {moved}");
        rounded.push(fp8);
    }
    let apart = rel(&rounded[1], &rounded[0]);
    assert!(
        apart < 0.1,
        "fast vs reference with fp8 activations: {apart}"
    );
}
