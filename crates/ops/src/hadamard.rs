//! The orthonormal Walsh-Hadamard rotation of each attention head, applied
//! to queries and keys after RoPE when the K cache is FP8.
//!
//! Contract: [`rotate_heads`] replaces every `head_dim`-wide head `x` of a
//! row by `H x`, `H` the Sylvester Hadamard matrix of order `head_dim`
//! (a power of two) over `sqrt(head_dim)`. `H` is orthonormal and
//! symmetric, so `(H q) · (H k) = q · k`: attention scores are unchanged in
//! exact arithmetic, while a key's few large channels are spread over all
//! of its channels, so e4m3's per-value relative error no longer
//! concentrates on the channels that dominate the scores.
//!
//! [`rotates_keys`] is the one rule of when a K/V cache holds its keys
//! rotated, which every backend follows: FP8 at calibrated K scales (some
//! layer's not 1) and a rotatable head size. At scale 1 the rotated keys'
//! small values fall into e4m3's subnormals and the rotation costs more
//! than it saves, so it stays off; BF16 and f32 caches gain nothing.
//!
//! Costs: `head_dim * log2(head_dim)` additions per head, in place.

use contract::{KvCacheDtype, KvScales};

/// Whether a K/V cache of `dtype` at `scales` with heads of `head_dim`
/// stores its keys Hadamard-rotated (queries rotated alike, both after
/// RoPE): FP8 with some layer's K scale not 1, `head_dim` [`rotatable`].
pub fn rotates_keys(dtype: KvCacheDtype, scales: &KvScales, head_dim: usize) -> bool {
    dtype == KvCacheDtype::Fp8 && scales.k.iter().any(|&s| s != 1.0) && rotatable(head_dim)
}

/// Whether heads of `head_dim` can be rotated (a power of two, at least 2).
pub fn rotatable(head_dim: usize) -> bool {
    head_dim >= 2 && head_dim.is_power_of_two()
}

/// Rotates every `head_dim`-wide head of `x` (`x.len()` a multiple of
/// `head_dim`, `head_dim` [`rotatable`]) by the orthonormal Hadamard matrix.
pub fn rotate_heads(x: &mut [f32], head_dim: usize) {
    debug_assert!(rotatable(head_dim) && x.len().is_multiple_of(head_dim));
    let norm = 1.0 / (head_dim as f32).sqrt();
    for head in x.chunks_exact_mut(head_dim) {
        let mut h = 1;
        while h < head_dim {
            for block in head.chunks_exact_mut(2 * h) {
                let (a, b) = block.split_at_mut(h);
                for (x, y) in a.iter_mut().zip(b.iter_mut()) {
                    (*x, *y) = (*x + *y, *x - *y);
                }
            }
            h *= 2;
        }
        head.iter_mut().for_each(|v| *v *= norm);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Sylvester Hadamard matrix of order `n` over `sqrt(n)`, row-major:
    /// entry `(i, j)` is `(-1)^popcount(i & j) / sqrt(n)`.
    fn matrix(n: usize) -> Vec<f32> {
        let norm = 1.0 / (n as f32).sqrt();
        (0..n * n)
            .map(|e| match ((e / n) & (e % n)).count_ones() % 2 {
                0 => norm,
                _ => -norm,
            })
            .collect()
    }

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let x = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8;
                (x % 2001) as f32 / 100.0 - 10.0
            })
            .collect()
    }

    #[test]
    fn rotation_is_the_normalised_hadamard_product() {
        for hd in [2, 4, 8, 64, 128] {
            let heads = 3;
            let x = values(heads * hd, hd as u32);
            let mut fast = x.clone();
            rotate_heads(&mut fast, hd);
            let h = matrix(hd);
            for (head, got) in x.chunks_exact(hd).zip(fast.chunks_exact(hd)) {
                for (i, &g) in got.iter().enumerate() {
                    let want: f32 = (0..hd).map(|j| h[i * hd + j] * head[j]).sum();
                    assert!(
                        (g - want).abs() <= 1e-4 * (1.0 + want.abs()),
                        "{hd}: {g} vs {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn rotated_scores_equal_the_plain_ones() {
        let hd = 64;
        let (q, k) = (values(hd, 1), values(hd, 7));
        let dot = |a: &[f32], b: &[f32]| -> f64 {
            a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum()
        };
        let (mut rq, mut rk) = (q.clone(), k.clone());
        rotate_heads(&mut rq, hd);
        rotate_heads(&mut rk, hd);
        let (plain, rotated) = (dot(&q, &k), dot(&rq, &rk));
        let scale = dot(&q, &q).sqrt() * dot(&k, &k).sqrt();
        assert!(
            (plain - rotated).abs() <= 1e-6 * scale,
            "{plain} vs {rotated}"
        );
        assert_ne!(q, rq, "the rotation moved the query");
    }

    #[test]
    fn only_fp8_at_calibrated_k_scales_rotates() {
        let ones = KvScales::ones(3);
        let mut calibrated = ones.clone();
        calibrated.k[1] = 0.02;
        let mut v_only = ones.clone();
        v_only.v[0] = 0.02;
        assert!(rotates_keys(KvCacheDtype::Fp8, &calibrated, 64));
        assert!(!rotates_keys(KvCacheDtype::Fp8, &ones, 64));
        assert!(!rotates_keys(KvCacheDtype::Fp8, &v_only, 64));
        assert!(!rotates_keys(KvCacheDtype::Fp8, &calibrated, 96));
        for dtype in [KvCacheDtype::Bf16, KvCacheDtype::F32] {
            assert!(!rotates_keys(dtype, &calibrated, 64));
        }
    }

    #[test]
    fn only_powers_of_two_rotate() {
        assert!(rotatable(64) && rotatable(2));
        assert!(!rotatable(0) && !rotatable(1) && !rotatable(96));
    }
}
