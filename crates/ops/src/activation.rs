//! SwiGLU: `silu(gate) * up`, elementwise in f32.
//! Costs: `n` exp evaluations, parallel in chunks of 4096.

use rayon::prelude::*;

/// SwiGLU in place: `gate = silu(gate) * up`, elementwise (`[n]` each).
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    gate.par_chunks_mut(4096)
        .zip(up.par_chunks(4096))
        .for_each(|(g, u)| {
            for (a, &b) in g.iter_mut().zip(u) {
                *a = *a / (1.0 + (-*a).exp()) * b;
            }
        });
}

/// Splits fused `[gate | up]` rows (`[T, 2 inter]`) into `gate`, `up`
/// (`[T, inter]` each): the layout of the CUDA backend's fused GEMM output.
pub fn split_gate_up<T: Copy>(gu: &[T], inter: usize) -> (Vec<T>, Vec<T>) {
    let mut gate = Vec::with_capacity(gu.len() / 2);
    let mut up = Vec::with_capacity(gu.len() / 2);
    for row in gu.chunks_exact(2 * inter) {
        gate.extend_from_slice(&row[..inter]);
        up.extend_from_slice(&row[inter..]);
    }
    (gate, up)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silu_mul_and_split() {
        let mut g = vec![0.0, 2.0];
        silu_mul(&mut g, &[5.0, 3.0]);
        assert_eq!(g[0], 0.0);
        assert!((g[1] - 2.0 / (1.0 + (-2f32).exp()) * 3.0).abs() < 1e-6);
        let (g, u) = split_gate_up(&[1, 2, 3, 4, 5, 6, 7, 8], 2);
        assert_eq!((g, u), (vec![1, 2, 5, 6], vec![3, 4, 7, 8]));
    }
}
