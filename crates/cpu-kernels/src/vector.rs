//! Vector operations of the fast CPU path: dot product and `y += a x` (the
//! attention inner loops) with explicit SIMD paths, and RMSNorm, SwiGLU and
//! the residual add written so that LLVM vectorises them.
//!
//! Contract: each function computes what its `ops` reference computes
//! (RMSNorm's mean of squares in f64 as in `ops::norm::rms_norm`, SwiGLU
//! `silu(g) * u` as in `ops::activation::silu_mul`), into caller-owned
//! buffers, on the calling thread (these run per token row; the caller
//! decides on parallelism). [`dot`] differs from a sequential sum only in
//! the order of the additions.
//! Costs: O(n) per call, no allocation.

use crate::isa::Isa;

/// `a · b` over the common length.
pub fn dot(isa: Isa, a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    match isa.checked() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the processor supports AVX-512F (Isa::checked).
        Isa::Avx512 => unsafe { dot_avx512(a, b) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the processor supports AVX2 and FMA (Isa::checked).
        Isa::Avx2 => unsafe { dot_avx2(a, b) },
        _ => dot_portable(a, b),
    }
}

fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            lanes[l] += x[l] * y[l];
        }
    }
    let mut s: f32 = lanes.iter().sum();
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// # Safety
/// The processor must support AVX-512F; `a` and `b` have equal lengths.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn dot_avx512(a: &[f32], b: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let n = a.len().min(b.len());
    let mut acc = _mm512_setzero_ps();
    let mut k = 0;
    while k + 16 <= n {
        // SAFETY: k + 16 <= n <= both lengths.
        let (x, y) = unsafe {
            (
                _mm512_loadu_ps(a.as_ptr().add(k)),
                _mm512_loadu_ps(b.as_ptr().add(k)),
            )
        };
        acc = _mm512_fmadd_ps(x, y, acc);
        k += 16;
    }
    let mut s = _mm512_reduce_add_ps(acc);
    for i in k..n {
        s += a[i] * b[i];
    }
    s
}

/// # Safety
/// The processor must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let n = a.len().min(b.len());
    let mut acc = _mm256_setzero_ps();
    let mut k = 0;
    while k + 8 <= n {
        // SAFETY: k + 8 <= n <= both lengths.
        let (x, y) = unsafe {
            (
                _mm256_loadu_ps(a.as_ptr().add(k)),
                _mm256_loadu_ps(b.as_ptr().add(k)),
            )
        };
        acc = _mm256_fmadd_ps(x, y, acc);
        k += 8;
    }
    let mut s = hsum256(acc);
    for i in k..n {
        s += a[i] * b[i];
    }
    s
}

/// Sum of the eight lanes.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn hsum256(v: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::*;
    let lo = _mm256_castps256_ps128(v);
    let hi = _mm256_extractf128_ps::<1>(v);
    let s = _mm_add_ps(lo, hi);
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
    _mm_cvtss_f32(s)
}

/// `y += a * x` over the common length.
pub fn axpy(isa: Isa, y: &mut [f32], a: f32, x: &[f32]) {
    let n = y.len().min(x.len());
    let (y, x) = (&mut y[..n], &x[..n]);
    match isa.checked() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the processor supports AVX-512F (Isa::checked).
        Isa::Avx512 => unsafe { axpy_avx512(y, a, x) },
        _ => {
            for (o, &v) in y.iter_mut().zip(x) {
                *o += a * v;
            }
        }
    }
}

/// # Safety
/// The processor must support AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn axpy_avx512(y: &mut [f32], a: f32, x: &[f32]) {
    use std::arch::x86_64::*;
    let n = y.len().min(x.len());
    let av = _mm512_set1_ps(a);
    let mut k = 0;
    while k + 16 <= n {
        // SAFETY: k + 16 <= n <= both lengths; `y` is exclusively borrowed.
        unsafe {
            let p = y.as_mut_ptr().add(k);
            let v = _mm512_fmadd_ps(av, _mm512_loadu_ps(x.as_ptr().add(k)), _mm512_loadu_ps(p));
            _mm512_storeu_ps(p, v);
        }
        k += 16;
    }
    for i in k..n {
        y[i] += a * x[i];
    }
}

/// RMSNorm of each `[dim]` row of `x` into `y` (`[T, dim]` each), scaled by
/// `weight` (`[dim]`): `x / sqrt(mean(x^2) + eps) * weight`, mean in f64.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, y: &mut [f32]) {
    let dim = weight.len();
    for (yr, xr) in y.chunks_exact_mut(dim).zip(x.chunks_exact(dim)) {
        let mut lanes = [0f64; 4];
        let c = xr.chunks_exact(4);
        let rem = c.remainder();
        for v in c {
            for l in 0..4 {
                lanes[l] += v[l] as f64 * v[l] as f64;
            }
        }
        let ss = lanes.iter().sum::<f64>() + rem.iter().map(|&v| v as f64 * v as f64).sum::<f64>();
        let inv = (1.0 / (ss / dim as f64 + eps as f64).sqrt()) as f32;
        for ((o, &v), &g) in yr.iter_mut().zip(xr).zip(weight) {
            *o = v * inv * g;
        }
    }
}

/// SwiGLU in place: `gate = silu(gate) * up`, elementwise.
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    for (a, &b) in gate.iter_mut().zip(up) {
        *a = *a / (1.0 + (-*a).exp()) * b;
    }
}

/// `x += y`, elementwise (the residual connection).
pub fn add_assign(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize, seed: f32) -> Vec<f32> {
        (0..n).map(|i| (i as f32 * 0.37 + seed).sin()).collect()
    }

    #[test]
    fn dot_and_axpy_agree_on_every_path() {
        for n in [0, 1, 7, 8, 15, 16, 17, 64, 131] {
            let (a, b) = (data(n, 0.1), data(n, 2.3));
            let want: f64 = a.iter().zip(&b).map(|(&x, &y)| x as f64 * y as f64).sum();
            for isa in Isa::available() {
                let got = dot(isa, &a, &b);
                assert!(
                    (got as f64 - want).abs() < 1e-5,
                    "{isa:?} n={n}: {got} vs {want}"
                );
                let mut y = b.clone();
                axpy(isa, &mut y, 0.5, &a);
                for i in 0..n {
                    assert!(
                        (y[i] - (b[i] + 0.5 * a[i])).abs() < 1e-6,
                        "{isa:?} axpy n={n}"
                    );
                }
            }
        }
    }

    #[test]
    fn norm_and_activation_match_the_formulas() {
        let x = data(2 * 13, 0.5);
        let w = data(13, 1.5);
        let mut y = vec![0f32; x.len()];
        rms_norm(&x, &w, 1e-5, &mut y);
        for r in 0..2 {
            let row = &x[r * 13..(r + 1) * 13];
            let ms = row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / 13.0;
            let inv = (1.0 / (ms + 1e-5).sqrt()) as f32;
            for i in 0..13 {
                assert!((y[r * 13 + i] - row[i] * inv * w[i]).abs() < 1e-6);
            }
        }
        let mut g = vec![0.0, 2.0, -1.0];
        silu_mul(&mut g, &[5.0, 3.0, 1.0]);
        assert_eq!(g[0], 0.0);
        assert!((g[1] - 2.0 / (1.0 + (-2f32).exp()) * 3.0).abs() < 1e-6);
        let mut x = vec![1.0, 2.0];
        add_assign(&mut x, &[0.5, 0.25]);
        assert_eq!(x, vec![1.5, 2.25]);
    }
}
