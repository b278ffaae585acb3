//! Gated activations, elementwise in f32: SwiGLU `silu(gate) * up` and
//! GeGLU `gelu_tanh(gate) * up` ([`gate_mul`] picks by the spec's
//! activation).
//! Costs: `n` exp or tanh evaluations, parallel in chunks of 4096.

use contract::Activation;
use rayon::prelude::*;

/// `gate = act(gate) * up` in place for the spec's activation.
pub fn gate_mul(act: Activation, gate: &mut [f32], up: &[f32]) {
    match act {
        Activation::Silu => silu_mul(gate, up),
        Activation::GeluTanh => gelu_tanh_mul(gate, up),
    }
}

/// GELU (tanh approximation) of `x` in f32, as torch's `gelu_pytorch_tanh`.
pub fn gelu_tanh(x: f32) -> f32 {
    const C: f32 = 0.797_884_6; // sqrt(2 / pi)
    0.5 * x * (1.0 + (C * (x + 0.044715 * x * x * x)).tanh())
}

/// GeGLU in place: `gate = gelu_tanh(gate) * up`, elementwise (`[n]` each).
pub fn gelu_tanh_mul(gate: &mut [f32], up: &[f32]) {
    gate.par_chunks_mut(4096)
        .zip(up.par_chunks(4096))
        .for_each(|(g, u)| {
            for (a, &b) in g.iter_mut().zip(u) {
                *a = gelu_tanh(*a) * b;
            }
        });
}

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
        let mut g = vec![1.0, -0.5];
        gate_mul(Activation::GeluTanh, &mut g, &[2.0, 1.0]);
        for (got, x, u) in [(g[0], 1.0, 2.0), (g[1], -0.5, 1.0)] {
            let want = Activation::GeluTanh.eval(x) * u;
            assert!((f64::from(got) - want).abs() < 1e-6, "{got} {want}");
        }
        let (g, u) = split_gate_up(&[1, 2, 3, 4, 5, 6, 7, 8], 2);
        assert_eq!((g, u), (vec![1, 2, 5, 6], vec![3, 4, 7, 8]));
    }
}
