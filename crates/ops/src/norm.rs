//! RMSNorm, and the row-wise steps beside it (bias rows, soft-cap).
//! Costs: two passes over `x`, parallel over rows.

use rayon::prelude::*;

/// RMSNorm of each `[dim]` row of `x` (`[T, dim]`) scaled by `weight`
/// (`[dim]`, f32): `x / sqrt(mean(x^2) + eps) * weight`, the mean of squares
/// accumulated in f64. Returns `[T, dim]`.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32) -> Vec<f32> {
    let dim = weight.len();
    let mut y = vec![0f32; x.len()];
    y.par_chunks_mut(dim)
        .zip(x.par_chunks(dim))
        .for_each(|(yr, xr)| {
            let ms = xr.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / dim as f64;
            let inv = (1.0 / (ms + eps as f64).sqrt()) as f32;
            for ((o, &v), &g) in yr.iter_mut().zip(xr).zip(weight) {
                *o = v * inv * g;
            }
        });
    y
}

/// RMSNorm in place of each `[dim]` row of `x` (`dim = weight.len()`,
/// e.g. the heads of a Q row for QK-norm), serially: the arithmetic of
/// [`rms_norm`].
pub fn rms_norm_in_place(x: &mut [f32], weight: &[f32], eps: f32) {
    let dim = weight.len();
    for xr in x.chunks_exact_mut(dim) {
        let ms = xr.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / dim as f64;
        let inv = (1.0 / (ms + eps as f64).sqrt()) as f32;
        for (v, &g) in xr.iter_mut().zip(weight) {
            *v = *v * inv * g;
        }
    }
}

/// Adds `bias` (`[w]`) to each `[w]` row of `x`.
pub fn add_rows(x: &mut [f32], bias: &[f32]) {
    for xr in x.chunks_exact_mut(bias.len()) {
        for (v, &b) in xr.iter_mut().zip(bias) {
            *v += b;
        }
    }
}

/// `cap * tanh(v / cap)` for every value of `x`.
pub fn softcap(x: &mut [f32], cap: f32) {
    for v in x {
        *v = cap * (*v / cap).tanh();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_rows() {
        let mut z = vec![3.0, 4.0, 0.0, 0.0];
        rms_norm_in_place(&mut z, &[1.0, 2.0], 1e-6);
        assert_eq!(z, rms_norm(&[3.0, 4.0, 0.0, 0.0], &[1.0, 2.0], 1e-6));
        add_rows(&mut z, &[1.0, -1.0]);
        assert_eq!((z[2], z[3]), (1.0, -1.0));
        let y = rms_norm(&[3.0, 4.0, 0.0, 0.0], &[1.0, 2.0], 1e-6);
        let inv = 1.0 / (12.5f32 + 1e-6).sqrt();
        assert!((y[0] - 3.0 * inv).abs() < 1e-6 && (y[1] - 8.0 * inv).abs() < 1e-6);
        assert_eq!(&y[2..], &[0.0, 0.0]);
    }
}
