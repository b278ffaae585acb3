//! Vector operations of the fast CPU path: dot product and `y += a x` (the
//! attention inner loops) with explicit SIMD paths, and RMSNorm, SwiGLU,
//! softmax's exponentials ([`exp_scaled_sum`]) and the residual add written
//! so that LLVM vectorises them (compiled per instruction set where a
//! fused multiply-add matters).
//!
//! Contract: each function computes what its `ops` reference computes
//! (RMSNorm's mean of squares in f64 as in `ops::norm::rms_norm`, SwiGLU
//! `silu(g) * u` as in `ops::activation::silu_mul`), into caller-owned
//! buffers, on the calling thread (these run per token row; the caller
//! decides on parallelism). [`dot`] differs from a sequential sum only in
//! the order of the additions; [`exp`] (SwiGLU, softmax) is within 2.5e-7
//! relative of `f32::exp` and gives the same bits on every path.
//! Costs: O(n) per call, no allocation.
//!
//! One file on purpose: each operation's AVX-512, AVX2 and portable paths
//! stand side by side, so they stay the same computation.

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

/// `out[j] = q · key(j)` for `j < out.len()`, each key `q.len()` values.
/// On AVX-512 each is the AVX-512 GEMM's arithmetic for one output, bit
/// for bit: the fused chain `s = fma(q[k], key[k], s)` over `k` in order
/// from `s = 0`, 16 keys at a time (their next 16 values transposed into
/// lanes), so a decode token's attention scores equal the scores the same
/// token gets inside a prefill chunk (whose `Q K^T` runs on that GEMM), and
/// a prompt recomputed from the prefix cache samples what it sampled the
/// first time. Elsewhere [`dot`] per key (the chunk's GEMM is then the
/// `gemm` crate's, in another order anyway).
pub fn dot_keys<'a>(isa: Isa, q: &[f32], key: impl Fn(usize) -> &'a [f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if isa.checked() == Isa::Avx512 && q.len().is_multiple_of(16) {
        for (j0, o) in (0..out.len()).step_by(16).zip(out.chunks_mut(16)) {
            let keys: [Option<&[f32]>; 16] =
                std::array::from_fn(|i| (i < o.len()).then(|| key(j0 + i)));
            assert!(
                keys.iter().flatten().all(|k| k.len() >= q.len()),
                "a key shorter than q"
            );
            // SAFETY: AVX-512F (Isa::checked); every present key holds q.len() values (asserted).
            unsafe { dot_keys_avx512(q, &keys, o) };
        }
        return;
    }
    for (j, o) in out.iter_mut().enumerate() {
        *o = dot(isa, q, key(j));
    }
}

/// # Safety
/// AVX-512F; `q.len()` a multiple of 16; each present key at least `q.len()`
/// values; `out` at most 16 values, one per present key from the first.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn dot_keys_avx512(q: &[f32], keys: &[Option<&[f32]>; 16], out: &mut [f32]) {
    use std::arch::x86_64::*;
    let mut acc = _mm512_setzero_ps();
    for k0 in (0..q.len()).step_by(16) {
        let mut r = [_mm512_setzero_ps(); 16];
        for (v, k) in r.iter_mut().zip(keys) {
            if let Some(k) = k {
                // SAFETY: k0 + 16 <= q.len() <= k.len() (the contract).
                *v = unsafe { _mm512_loadu_ps(k.as_ptr().add(k0)) };
            }
        }
        // SAFETY: AVX-512F (this function's contract).
        unsafe { crate::gemm512::transpose16(&mut r) };
        for (kk, v) in r.iter().enumerate() {
            acc = _mm512_fmadd_ps(_mm512_set1_ps(q[k0 + kk]), *v, acc);
        }
    }
    let mut lanes = [0f32; 16];
    // SAFETY: 16 writable values.
    unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), acc) };
    out.copy_from_slice(&lanes[..out.len()]);
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
pub fn silu_mul(isa: Isa, gate: &mut [f32], up: &[f32]) {
    let n = gate.len().min(up.len());
    let (gate, up) = (&mut gate[..n], &up[..n]);
    match isa.checked() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the processor supports AVX-512F (Isa::checked); FMA comes with it.
        Isa::Avx512 => unsafe { silu_mul_avx512(gate, up) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the processor supports AVX2 and FMA (Isa::checked).
        Isa::Avx2 => unsafe { silu_mul_avx2(gate, up) },
        _ => silu_mul_body(gate, up),
    }
}

#[inline(always)]
fn silu_mul_body(gate: &mut [f32], up: &[f32]) {
    for (a, &b) in gate.iter_mut().zip(up) {
        *a = *a / (1.0 + exp(-*a)) * b;
    }
}

/// # Safety
/// The processor must support AVX-512F and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
unsafe fn silu_mul_avx512(gate: &mut [f32], up: &[f32]) {
    silu_mul_body(gate, up)
}

/// # Safety
/// The processor must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn silu_mul_avx2(gate: &mut [f32], up: &[f32]) {
    silu_mul_body(gate, up)
}

/// `e^x` in f32 within 2 ulp of the exact value for `x` in `[-87, 88]`
/// (Cody-Waite reduction by `ln 2`, Cephes' degree-6 polynomial, `2^n`
/// built in the exponent bits), written in operations LLVM vectorises
/// (fused multiply-adds, the `1.5 * 2^23` rounding trick), so a row of
/// them costs a few instructions per 16 values instead of a libm call
/// each. Inputs are clamped to `[-87, 88]` first: below, the result is
/// `e^-87` (1.6e-38, nothing next to any sum it joins), above `e^88`; NaN
/// stays NaN. The same operations in the same order on every path and in
/// every lane, so a value's result does not depend on where it sits.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    // n = round(x / ln 2), ties to even; r = x - n ln 2 in [-ln 2 / 2, ln 2 / 2]
    let shifted = x.mul_add(LOG2E, ROUND);
    let n = shifted - ROUND;
    let r = n.mul_add(-LN2_LO, n.mul_add(-LN2_HI, x));
    let mut p = 1.987_569_1e-4f32;
    p = p.mul_add(r, 1.398_199_9e-3);
    p = p.mul_add(r, 8.333_452e-3);
    p = p.mul_add(r, 4.166_579_6e-2);
    p = p.mul_add(r, 1.666_666_5e-1);
    p = p.mul_add(r, 0.5);
    let e = p.mul_add(r * r, r) + 1.0;
    // n is an integer in [-126, 127], held in the low mantissa bits of
    // `shifted` (1.5 * 2^23 + n): integer operations only, which vectorise
    // (a float-to-int cast did not); 2^n from its exponent bits
    let n_int = shifted.to_bits().wrapping_sub(ROUND.to_bits());
    e * f32::from_bits(n_int.wrapping_add(127) << 23)
}

/// `row[i] = e^(row[i] * scale - m)` for every `i` (the product and the
/// difference each rounded, so pre-scaled scores with `scale = 1` give the
/// same bits); returns their sum (over 16 lanes, then the lanes in order: a
/// fixed order for a given length). Softmax's numerator: `m` is the row's
/// scaled maximum.
pub fn exp_scaled_sum(isa: Isa, row: &mut [f32], scale: f32, m: f32) -> f32 {
    match isa.checked() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the processor supports AVX-512F (Isa::checked); FMA comes with it.
        Isa::Avx512 => unsafe { exp_scaled_sum_avx512(row, scale, m) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the processor supports AVX2 and FMA (Isa::checked).
        Isa::Avx2 => unsafe { exp_scaled_sum_avx2(row, scale, m) },
        _ => exp_scaled_sum_body(row, scale, m),
    }
}

#[inline(always)]
fn exp_scaled_sum_body(row: &mut [f32], scale: f32, m: f32) -> f32 {
    let mut lanes = [0f32; 16];
    let mut chunks = row.chunks_exact_mut(16);
    for c in &mut chunks {
        for (l, v) in lanes.iter_mut().zip(c.iter_mut()) {
            *v = exp(*v * scale - m);
            *l += *v;
        }
    }
    let mut sum = 0f32;
    for v in chunks.into_remainder() {
        *v = exp(*v * scale - m);
        sum += *v;
    }
    lanes.iter().sum::<f32>() + sum
}

/// # Safety
/// The processor must support AVX-512F and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
unsafe fn exp_scaled_sum_avx512(row: &mut [f32], scale: f32, m: f32) -> f32 {
    exp_scaled_sum_body(row, scale, m)
}

/// # Safety
/// The processor must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn exp_scaled_sum_avx2(row: &mut [f32], scale: f32, m: f32) -> f32 {
    exp_scaled_sum_body(row, scale, m)
}

/// Softmax of `row * scale` in place: `m = max(row[i] * scale)` (the
/// product rounded, then the maximum, which is exact in any order), then
/// [`exp_scaled_sum`] and every value times `1 / sum`. The same bits as
/// those three steps written out, on every path.
pub fn softmax_scaled(isa: Isa, row: &mut [f32], scale: f32) {
    let m = match isa.checked() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the processor supports AVX-512F (Isa::checked).
        Isa::Avx512 => unsafe { max_scaled_avx512(row, scale) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the processor supports AVX2 (Isa::checked).
        Isa::Avx2 => unsafe { max_scaled_avx2(row, scale) },
        _ => max_scaled_body(row, scale),
    };
    let inv = 1.0 / exp_scaled_sum(isa, row, scale, m);
    match isa.checked() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx512 => unsafe { scale_avx512(row, inv) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx2 => unsafe { scale_avx2(row, inv) },
        _ => scale_body(row, inv),
    }
}

#[inline(always)]
fn max_scaled_body(row: &[f32], scale: f32) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 16];
    let mut chunks = row.chunks_exact(16);
    for c in &mut chunks {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l = l.max(v * scale);
        }
    }
    let rest = chunks
        .remainder()
        .iter()
        .fold(f32::NEG_INFINITY, |m, &v| m.max(v * scale));
    lanes.iter().fold(rest, |m, &l| m.max(l))
}

#[inline(always)]
fn scale_body(row: &mut [f32], a: f32) {
    for v in row {
        *v *= a;
    }
}

/// # Safety
/// The processor must support AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn max_scaled_avx512(row: &[f32], scale: f32) -> f32 {
    max_scaled_body(row, scale)
}

/// # Safety
/// The processor must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn max_scaled_avx2(row: &[f32], scale: f32) -> f32 {
    max_scaled_body(row, scale)
}

/// # Safety
/// The processor must support AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn scale_avx512(row: &mut [f32], a: f32) {
    scale_body(row, a)
}

/// # Safety
/// The processor must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn scale_avx2(row: &mut [f32], a: f32) {
    scale_body(row, a)
}

/// Rotary embedding of every head of one token's `x` (`[heads * 2 *
/// half]`, rotate-half pairs `i` and `i + half`) with `cos` and `sin`
/// (`[half]`, the token's position's table rows): `a' = a cos - b sin`,
/// `b' = b cos + a sin`, each product rounded (no fused multiply-add), so
/// the same bits as `ops::Rope::apply` on every path.
pub fn rope(isa: Isa, x: &mut [f32], cos: &[f32], sin: &[f32]) {
    match isa.checked() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the processor supports AVX-512F (Isa::checked).
        Isa::Avx512 => unsafe { rope_avx512(x, cos, sin) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the processor supports AVX2 (Isa::checked).
        Isa::Avx2 => unsafe { rope_avx2(x, cos, sin) },
        _ => rope_body(x, cos, sin),
    }
}

#[inline(always)]
fn rope_body(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = cos.len().min(sin.len());
    if half == 0 {
        return;
    }
    for head in x.chunks_exact_mut(2 * half) {
        let (a, b) = head.split_at_mut(half);
        for (((a, b), &c), &s) in a.iter_mut().zip(b.iter_mut()).zip(cos).zip(sin) {
            let (x0, x1) = (*a, *b);
            *a = x0 * c - x1 * s;
            *b = x1 * c + x0 * s;
        }
    }
}

/// # Safety
/// The processor must support AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn rope_avx512(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    rope_body(x, cos, sin)
}

/// # Safety
/// The processor must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn rope_avx2(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    rope_body(x, cos, sin)
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

    /// The softmax equals its three steps written out, bit for bit, on
    /// every path, and sums to 1.
    #[test]
    fn softmax_scaled_is_its_steps_on_every_path() {
        for n in [1, 7, 16, 17, 100, 333] {
            let x: Vec<f32> = data(n, 0.4).iter().map(|v| v * 9.0).collect();
            let scale = 0.125;
            let mut want = x.clone();
            let m = want
                .iter()
                .fold(f32::NEG_INFINITY, |m, &s| m.max(s * scale));
            let inv = 1.0 / exp_scaled_sum(Isa::Portable, &mut want, scale, m);
            for v in &mut want {
                *v *= inv;
            }
            for isa in Isa::available() {
                let mut got = x.clone();
                softmax_scaled(isa, &mut got, scale);
                assert_eq!(got, want, "{isa:?} n={n}");
                let sum: f32 = got.iter().sum();
                assert!((sum - 1.0).abs() < 1e-5, "{isa:?} n={n}: {sum}");
            }
        }
    }

    /// RoPE equals the reference's per-pair formula bit for bit on every path.
    #[test]
    fn rope_is_the_reference_rotation_on_every_path() {
        for half in [1, 5, 32, 64] {
            let x = data(3 * 2 * half, 0.3);
            let (cos, sin) = (data(half, 1.1), data(half, 2.7));
            let mut want = x.clone();
            for head in want.chunks_exact_mut(2 * half) {
                for i in 0..half {
                    let (x0, x1) = (head[i], head[i + half]);
                    head[i] = x0 * cos[i] - x1 * sin[i];
                    head[i + half] = x1 * cos[i] + x0 * sin[i];
                }
            }
            for isa in Isa::available() {
                let mut got = x.clone();
                rope(isa, &mut got, &cos, &sin);
                assert_eq!(got, want, "{isa:?} half={half}");
            }
        }
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
        for isa in Isa::available() {
            let mut g = vec![0.0, 2.0, -1.0];
            silu_mul(isa, &mut g, &[5.0, 3.0, 1.0]);
            assert_eq!(g[0], 0.0);
            assert!((g[1] - 2.0 / (1.0 + (-2f32).exp()) * 3.0).abs() < 1e-6);
        }
        let mut x = vec![1.0, 2.0];
        add_assign(&mut x, &[0.5, 0.25]);
        assert_eq!(x, vec![1.5, 2.25]);
    }

    /// `exp` within 2.5e-7 relative of the exact value over the range that
    /// softmax and SiLU meet (and at its ends), NaN kept; the clamps.
    #[test]
    fn exp_is_within_two_ulp() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x <= 88.0 {
            let got = exp(x) as f64;
            let want = (x as f64).exp();
            worst = worst.max((got - want).abs() / want);
            x += 0.001_37;
        }
        for x in [
            -87.0f32,
            -1e-8,
            0.0,
            1e-8,
            0.5 * std::f32::consts::LN_2,
            88.0,
        ] {
            let (got, want) = (exp(x) as f64, (x as f64).exp());
            worst = worst.max((got - want).abs() / want);
        }
        assert!(worst < 2.5e-7, "worst relative error {worst:e}");
        assert_eq!(exp(0.0), 1.0);
        assert!(exp(f32::NAN).is_nan());
        assert_eq!(exp(-1000.0), exp(-87.0));
        assert_eq!(exp(1000.0), exp(88.0));
    }

    /// Softmax numerators and their sum: the same bits on every path (the
    /// same operations in each lane and the same order of the sum), close
    /// to the f64 values.
    #[test]
    fn exp_scaled_sums_agree_on_every_path() {
        for n in [1, 15, 16, 17, 100, 513] {
            let row = data(n, 0.7);
            let m = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v * 0.125));
            let mut want = row.clone();
            let sum = exp_scaled_sum(Isa::Portable, &mut want, 0.125, m);
            let exact: f64 = row
                .iter()
                .map(|&v| (v as f64 * 0.125 - m as f64).exp())
                .sum();
            assert!(((sum as f64) - exact).abs() / exact < 1e-6, "n={n}");
            for isa in Isa::available() {
                let mut got = row.clone();
                let s = exp_scaled_sum(isa, &mut got, 0.125, m);
                assert_eq!(s.to_bits(), sum.to_bits(), "{isa:?} n={n}");
                assert_eq!(got, want, "{isa:?} n={n}");
            }
        }
    }

    /// On AVX-512, `dot_keys` gives each score the AVX-512 GEMM's bits
    /// (the prefill chunk's `Q K^T`); elsewhere it is `dot` per key.
    #[test]
    fn key_dots_equal_the_gemm_bit_for_bit() {
        let hd = 64;
        for n in [1, 5, 16, 17, 40] {
            let q = data(hd, 0.3);
            let keys: Vec<Vec<f32>> = (0..n).map(|j| data(hd, j as f32 * 1.7)).collect();
            for isa in Isa::available() {
                let mut got = vec![f32::NAN; n];
                dot_keys(isa, &q, |j| &keys[j], &mut got);
                for (j, k) in keys.iter().enumerate() {
                    let exact: f64 = q.iter().zip(k).map(|(&a, &b)| a as f64 * b as f64).sum();
                    assert!((got[j] as f64 - exact).abs() < 1e-4, "{isa:?} n={n} j={j}");
                }
                if isa == Isa::Avx512 {
                    let flat: Vec<f32> = keys.concat();
                    let mut want = vec![0f32; n];
                    crate::matmul::gemm_nt_f32(isa, &q, hd, 1, &flat, hd, hd, n, &mut want, n);
                    assert_eq!(got, want, "n={n}");
                }
            }
        }
    }
}
