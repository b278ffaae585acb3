//! The GEMVs' CPU reference ([`gemv_ref`]): each fused variant composed of
//! `ops`' norm, gated activation and an f64 dot, rounded where the kernels
//! round.

use contract::Activation;

use crate::round_bf16;

/// Which [`GemvOp`] [`gemv_ref`] models.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemvKind {
    Bf16,
    Resid,
    ResidNormed,
    Norm,
    NormGated(Activation),
    F32,
}

/// CPU reference: `x` is `[m, k]` (the f32 residual for the norm kinds, bf16
/// values otherwise), `w` `[n, k]` (`[2n, k]` for NormGated), `y` `[m, n]`
/// (read for Resid and ResidNormed); `norm_w` the gains with their offset
/// added (`[k]`, or `[n]` for ResidNormed's output norm). Rounds where the
/// kernels round.
#[allow(clippy::too_many_arguments)]
pub fn gemv_ref(
    kind: GemvKind,
    x: &[f32],
    norm_w: &[f32],
    eps: f32,
    w: &[f32],
    y: &mut [f32],
    m: usize,
    n: usize,
    k: usize,
) {
    // the norms and the gated activation are `ops`' (the CPU backend's own code)
    let normed = |v: &[f32]| -> Vec<f32> {
        ops::norm::rms_norm(v, norm_w, eps)
            .into_iter()
            .map(round_bf16)
            .collect()
    };
    for r in 0..m {
        let row = &x[r * k..(r + 1) * k];
        let xin: Vec<f32> = match kind {
            GemvKind::Norm | GemvKind::NormGated(_) => normed(row),
            _ => row.to_vec(),
        };
        let dot = |j: usize| -> f32 {
            let wr = &w[j * k..(j + 1) * k];
            wr.iter()
                .zip(&xin)
                .map(|(a, b)| *a as f64 * *b as f64)
                .sum::<f64>() as f32
        };
        let out = &mut y[r * n..(r + 1) * n];
        match kind {
            GemvKind::Bf16 | GemvKind::Norm => out
                .iter_mut()
                .enumerate()
                .for_each(|(j, o)| *o = round_bf16(dot(j))),
            GemvKind::Resid => out
                .iter_mut()
                .enumerate()
                .for_each(|(j, o)| *o += round_bf16(dot(j))),
            GemvKind::ResidNormed => {
                let p: Vec<f32> = (0..n).map(|j| round_bf16(dot(j))).collect();
                out.iter_mut().zip(normed(&p)).for_each(|(o, d)| *o += d);
            }
            GemvKind::F32 => out.iter_mut().enumerate().for_each(|(j, o)| *o = dot(j)),
            GemvKind::NormGated(act) => {
                for (j, o) in out.iter_mut().enumerate() {
                    let mut g = [round_bf16(dot(j))];
                    ops::activation::gate_mul(act, &mut g, &[round_bf16(dot(n + j))]);
                    *o = round_bf16(g[0]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_fuses_norm_and_silu_like_the_unfused_steps() {
        let (m, n, k) = (3, 5, 16);
        let x: Vec<f32> = (0..m * k)
            .map(|i| ((i * 7 % 11) as f32 - 5.0) / 3.0)
            .collect();
        let g: Vec<f32> = (0..k).map(|i| 0.5 + i as f32 / 16.0).collect();
        let w: Vec<f32> = (0..2 * n * k)
            .map(|i| round_bf16(((i * 5 % 13) as f32 - 6.0) / 8.0))
            .collect();
        // unfused: norm, GEMM to bf16 (both halves), silu·up
        let mut xn = vec![0f32; m * k];
        for r in 0..m {
            let row = &x[r * k..(r + 1) * k];
            let inv = 1.0 / (row.iter().map(|v| v * v).sum::<f32>() / k as f32 + 1e-5).sqrt();
            for i in 0..k {
                xn[r * k + i] = round_bf16(row[i] * inv * g[i]);
            }
        }
        let mut gu = vec![0f32; m * 2 * n];
        gemv_ref(GemvKind::Bf16, &xn, &[], 0.0, &w, &mut gu, m, 2 * n, k);
        let mut fused = vec![0f32; m * n];
        gemv_ref(
            GemvKind::NormGated(Activation::Silu),
            &x,
            &g,
            1e-5,
            &w,
            &mut fused,
            m,
            n,
            k,
        );
        for r in 0..m {
            for j in 0..n {
                let (a, b) = (gu[r * 2 * n + j], gu[r * 2 * n + n + j]);
                let want = round_bf16(a / (1.0 + (-a).exp()) * b);
                assert!((fused[r * n + j] - want).abs() <= 1e-2 * want.abs().max(1e-2));
            }
        }
    }
}
