//! `y = x @ W^T` for BF16 weights `W` `[out, in]` and f32 activations `x`
//! `[T, in]`, f32 accumulation: the CPU backend's projections and LM head.
//!
//! Contract: [`matmul_bf16`] writes `y` `[T, out]` row-major, each element
//! the exact f32 product sum of the widened BF16 weights (a BF16 value is the
//! top half of an f32, so widening is a 16-bit shift) in an order that
//! differs from `ops::linear::matmul_bf16` only in the association of the
//! additions. Two regimes:
//! - `T < GEMM_MIN_TOKENS` (decode and small batches): register tiles of
//!   [`ROW_TILE`] weight rows x up to [`TOKEN_TILE`] tokens read the BF16
//!   weights straight from memory, once per tile of tokens, with the
//!   processor's widest vectors ([`Isa`]); work split over weight rows on
//!   rayon. This regime is bound by memory bandwidth: 2 bytes per weight.
//!   A token's bits do not depend on the token count or the split over
//!   threads ([`matmul_bf16_tiled`] runs it at any count: the CPU
//!   backend's deterministic mode).
//! - `T >= GEMM_MIN_TOKENS` (prefill): the weights are widened to f32 once
//!   into the caller's [`Scratch`] (cost `out * in` conversions, amortised
//!   over `T` tokens) and multiplied by the `gemm` crate's cache-blocked,
//!   run-time dispatched f32 kernels on the rayon pool.
//!
//! Costs: `T * out * in` multiply-adds; the tiled regime reads `W` `ceil(T /
//! TOKEN_TILE)` times (from cache after the first when a task's rows fit),
//! the gemm regime once plus `4 * out * in` bytes of scratch. No allocation
//! except the scratch's growth to the largest weight seen.

use crate::OutPtr;
use crate::isa::Isa;
use half::bf16;
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

/// Weight rows one register tile covers.
pub const ROW_TILE: usize = 4;
/// Tokens one register tile covers.
pub const TOKEN_TILE: usize = 4;
/// From this many tokens on, [`matmul_bf16`] widens the weights and calls `gemm`.
pub const GEMM_MIN_TOKENS: usize = 16;
/// How far ahead (in weights, 16 KiB) the SIMD tiles prefetch the weight
/// stream: measured best on the 2-core EPYC of this project's machines (the
/// hardware prefetchers alone reached half the bandwidth); prefetching past
/// the end of the weights is harmless (a hint, never a fault).
const PREFETCH: usize = 8192;
/// Below this many multiply-adds a product runs on the calling thread.
const PARALLEL_MIN_WORK: usize = 1 << 16;

/// Reused buffer of the gemm regime: the current weight widened to f32.
#[derive(Default)]
pub struct Scratch {
    wide: Vec<f32>,
}

/// `y = x @ W^T` (see the module doc): `x` `[T, inp]`, `w` `[out, inp]`,
/// `y` `[T, out]`. Panics if the lengths disagree (a caller bug).
pub fn matmul_bf16(
    isa: Isa,
    x: &[f32],
    w: &[bf16],
    inp: usize,
    out: usize,
    y: &mut [f32],
    scratch: &mut Scratch,
) {
    assert!(
        inp > 0 && x.len().is_multiple_of(inp),
        "x is not [T, {inp}]"
    );
    let t = x.len() / inp;
    assert_eq!(w.len(), out * inp, "w is not [{out}, {inp}]");
    assert_eq!(y.len(), t * out, "y is not [{t}, {out}]");
    if t == 0 || out == 0 {
        return;
    }
    if t >= GEMM_MIN_TOKENS {
        if isa.checked() == Isa::Avx512 {
            crate::gemm512::matmul(x, w, inp, out, y);
        } else {
            gemm_f32(x, w, inp, out, t, y, scratch);
        }
    } else {
        tiled(isa.checked(), x, w.reinterpret_cast(), inp, out, t, y);
    }
}

/// The register-tiled regime at any `T` (what [`matmul_bf16`] runs below
/// [`GEMM_MIN_TOKENS`]): for benchmarks and tests. Same shapes as
/// [`matmul_bf16`].
pub fn matmul_bf16_tiled(isa: Isa, x: &[f32], w: &[bf16], inp: usize, out: usize, y: &mut [f32]) {
    assert!(
        inp > 0 && x.len().is_multiple_of(inp),
        "x is not [T, {inp}]"
    );
    let t = x.len() / inp;
    assert_eq!(w.len(), out * inp, "w is not [{out}, {inp}]");
    assert_eq!(y.len(), t * out, "y is not [{t}, {out}]");
    if t > 0 && out > 0 {
        tiled(isa.checked(), x, w.reinterpret_cast(), inp, out, t, y);
    }
}

/// The `gemm` crate's regime at any `T` (what [`matmul_bf16`] runs from
/// [`GEMM_MIN_TOKENS`] on without AVX-512): for benchmarks and tests.
pub fn matmul_bf16_gemm(
    x: &[f32],
    w: &[bf16],
    inp: usize,
    out: usize,
    y: &mut [f32],
    scratch: &mut Scratch,
) {
    assert!(
        inp > 0 && x.len().is_multiple_of(inp),
        "x is not [T, {inp}]"
    );
    let t = x.len() / inp;
    assert_eq!(w.len(), out * inp, "w is not [{out}, {inp}]");
    assert_eq!(y.len(), t * out, "y is not [{t}, {out}]");
    if t > 0 && out > 0 {
        gemm_f32(x, w, inp, out, t, y, scratch);
    }
}

/// `y[i][o] = sum_k x[i][k] * w[o][k]` over f32 views, the products on
/// the calling thread: `x` `t` rows `x_stride` apart, `w` `out` rows `w_stride` apart,
/// `inp` values each, `y` `t` rows `y_stride` apart (the first `out`
/// values of each written). The AVX-512 GEMM over `w` packed once
/// ([`crate::gemm512::Packed`]) where `isa` allows, else the `gemm` crate. For attention's `Q K^T` and `P V`.
/// Panics if a view is out of bounds.
#[allow(clippy::too_many_arguments)]
pub fn gemm_nt_f32(
    isa: Isa,
    x: &[f32],
    x_stride: usize,
    t: usize,
    w: &[f32],
    w_stride: usize,
    inp: usize,
    out: usize,
    y: &mut [f32],
    y_stride: usize,
) {
    if t == 0 || out == 0 {
        return;
    }
    assert!(inp > 0 && inp <= x_stride && inp <= w_stride && out <= y_stride);
    assert!(x.len() >= (t - 1) * x_stride + inp, "x too short");
    assert!(w.len() >= (out - 1) * w_stride + inp, "w too short");
    assert!(y.len() >= (t - 1) * y_stride + out, "y too short");
    if isa.checked() == Isa::Avx512 {
        let w = crate::gemm512::Packed::from_rows(inp, out, |o| &w[o * w_stride..][..inp]);
        crate::gemm512::matmul_packed(x, x_stride, t, &w, inp, out, y, y_stride);
        return;
    }
    // SAFETY: dst y [t, out] at row stride y_stride; lhs x [t, inp] at row
    // stride x_stride; rhs W^T [inp, out] read from w (row stride 1, column
    // stride w_stride); every index is in bounds by the asserts above.
    unsafe {
        gemm::gemm(
            t,
            out,
            inp,
            y.as_mut_ptr(),
            1,
            y_stride as isize,
            false,
            x.as_ptr(),
            1,
            x_stride as isize,
            w.as_ptr(),
            w_stride as isize,
            1,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// Widens `w` into the scratch and runs `gemm` (the prefill regime).
fn gemm_f32(
    x: &[f32],
    w: &[bf16],
    inp: usize,
    out: usize,
    t: usize,
    y: &mut [f32],
    scratch: &mut Scratch,
) {
    if scratch.wide.len() < w.len() {
        scratch.wide.resize(w.len(), 0.0);
    }
    let wide = &mut scratch.wide[..w.len()];
    const CHUNK: usize = 1 << 14;
    wide.par_chunks_mut(CHUNK)
        .zip(w.par_chunks(CHUNK))
        .for_each(|(d, s)| s.convert_to_f32_slice(d));
    let threads = rayon::current_num_threads();
    // SAFETY: dst is `y` [t, out] row-major (row stride out, column stride
    // 1), lhs is `x` [t, inp] row-major, rhs is `W^T` [inp, out] read from
    // the widened `W` [out, inp] (row stride 1, column stride inp); the
    // asserts in `matmul_bf16` and the slicing above guarantee every index
    // gemm forms (i < t, j < out, k < inp) is inside its buffer, and `y`
    // does not alias the inputs (it is borrowed mutably).
    unsafe {
        gemm::gemm(
            t,
            out,
            inp,
            y.as_mut_ptr(),
            1,
            out as isize,
            false,
            x.as_ptr(),
            1,
            inp as isize,
            wide.as_ptr(),
            inp as isize,
            1,
            0.0,
            1.0,
            false,
            false,
            false,
            if threads > 1 {
                gemm::Parallelism::Rayon(threads)
            } else {
                gemm::Parallelism::None
            },
        );
    }
}

/// The small-`T` regime: register tiles over weight rows, split on rayon.
fn tiled(isa: Isa, x: &[f32], w: &[u16], inp: usize, out: usize, t: usize, y: &mut [f32]) {
    let work = out * inp * t;
    let threads = rayon::current_num_threads();
    // several tasks per thread for balance, whole tiles each
    let per_task = if work < PARALLEL_MIN_WORK || threads == 1 {
        out
    } else {
        out.div_ceil(threads * 8)
            .next_multiple_of(ROW_TILE)
            .max(ROW_TILE)
    };
    let tasks = out.div_ceil(per_task);
    let yp = OutPtr(y.as_mut_ptr());
    let run = |task: usize| {
        let (r0, r1) = (task * per_task, ((task + 1) * per_task).min(out));
        let mut acc = [[0f32; TOKEN_TILE]; ROW_TILE];
        for rb in (r0..r1).step_by(ROW_TILE) {
            let nr = ROW_TILE.min(r1 - rb);
            let wt = &w[rb * inp..(rb + nr) * inp];
            for tb in (0..t).step_by(TOKEN_TILE) {
                let nt = TOKEN_TILE.min(t - tb);
                let xt = &x[tb * inp..(tb + nt) * inp];
                tile(isa, wt, nr, xt, nt, inp, &mut acc);
                for (r, row) in acc.iter().enumerate().take(nr) {
                    for (n, &v) in row.iter().enumerate().take(nt) {
                        // SAFETY: (tb + n) < t and (rb + r) < out, so the
                        // index is inside `y` [t, out]; row rb + r belongs
                        // to this task only (see OutPtr).
                        unsafe { *yp.get().add((tb + n) * out + rb + r) = v };
                    }
                }
            }
        }
    };
    if tasks == 1 {
        run(0);
    } else {
        (0..tasks).into_par_iter().for_each(run);
    }
}

/// One register tile: `acc[r][n] = w_r · x_n` for `r < nr`, `n < nt`
/// (`w` `[nr, inp]` BF16 bits, `x` `[nt, inp]`).
fn tile(
    isa: Isa,
    w: &[u16],
    nr: usize,
    x: &[f32],
    nt: usize,
    inp: usize,
    acc: &mut [[f32; TOKEN_TILE]; ROW_TILE],
) {
    macro_rules! dispatch {
        ($f:ident) => {
            match (nr, nt) {
                (4, 4) => $f::<4, 4>(w, x, inp, acc),
                (4, 3) => $f::<4, 3>(w, x, inp, acc),
                (4, 2) => $f::<4, 2>(w, x, inp, acc),
                (4, 1) => $f::<4, 1>(w, x, inp, acc),
                (3, 4) => $f::<3, 4>(w, x, inp, acc),
                (3, 3) => $f::<3, 3>(w, x, inp, acc),
                (3, 2) => $f::<3, 2>(w, x, inp, acc),
                (3, 1) => $f::<3, 1>(w, x, inp, acc),
                (2, 4) => $f::<2, 4>(w, x, inp, acc),
                (2, 3) => $f::<2, 3>(w, x, inp, acc),
                (2, 2) => $f::<2, 2>(w, x, inp, acc),
                (2, 1) => $f::<2, 1>(w, x, inp, acc),
                (1, 4) => $f::<1, 4>(w, x, inp, acc),
                (1, 3) => $f::<1, 3>(w, x, inp, acc),
                (1, 2) => $f::<1, 2>(w, x, inp, acc),
                _ => $f::<1, 1>(w, x, inp, acc),
            }
        };
    }
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `isa` was checked against the processor (Isa::checked).
        Isa::Avx512 => unsafe { dispatch!(tile_avx512) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx2 => unsafe { dispatch!(tile_avx2) },
        _ => dispatch!(tile_portable),
    }
}

#[inline(always)]
fn widen(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// Portable tile: eight-lane accumulators LLVM vectorises.
fn tile_portable<const R: usize, const N: usize>(
    w: &[u16],
    x: &[f32],
    inp: usize,
    acc: &mut [[f32; TOKEN_TILE]; ROW_TILE],
) {
    for r in 0..R {
        let wr = &w[r * inp..(r + 1) * inp];
        for n in 0..N {
            let xn = &x[n * inp..(n + 1) * inp];
            let mut lanes = [0f32; 8];
            let (wc, xc) = (wr.chunks_exact(8), xn.chunks_exact(8));
            let (wrem, xrem) = (wc.remainder(), xc.remainder());
            for (a, b) in wc.zip(xc) {
                for l in 0..8 {
                    lanes[l] += widen(a[l]) * b[l];
                }
            }
            let mut s = lanes.iter().sum::<f32>();
            for (&a, &b) in wrem.iter().zip(xrem) {
                s += widen(a) * b;
            }
            acc[r][n] = s;
        }
    }
}

/// AVX-512F tile: one weight row at a time (a sequential stream, which the
/// hardware prefetchers follow best), a 64-byte line of 32 BF16 weights per
/// step into two accumulators per token.
///
/// # Safety
/// The processor must support AVX-512F; `w` holds `R * inp` values and `x`
/// `N * inp`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn tile_avx512<const R: usize, const N: usize>(
    w: &[u16],
    x: &[f32],
    inp: usize,
    acc: &mut [[f32; TOKEN_TILE]; ROW_TILE],
) {
    use std::arch::x86_64::*;
    assert!(w.len() >= R * inp && x.len() >= N * inp);
    let (wp, xp) = (w.as_ptr(), x.as_ptr());
    let widen16 = |p: *const u16| {
        // SAFETY: callers pass p with 16 values readable (see the loops).
        let raw = unsafe { _mm256_loadu_si256(p as *const __m256i) };
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(raw)))
    };
    for r in 0..R {
        let wr = wp.wrapping_add(r * inp);
        let mut a0 = [_mm512_setzero_ps(); N];
        let mut a1 = [_mm512_setzero_ps(); N];
        let mut k = 0;
        while k + 32 <= inp {
            // r * inp + k + 32 <= R * inp <= w.len() (asserted)
            _mm_prefetch::<_MM_HINT_T0>(wr.wrapping_add(k + PREFETCH) as *const i8);
            let (w0, w1) = (
                widen16(wr.wrapping_add(k)),
                widen16(wr.wrapping_add(k + 16)),
            );
            for n in 0..N {
                // SAFETY: n * inp + k + 32 <= N * inp <= x.len() (asserted).
                let (x0, x1) = unsafe {
                    (
                        _mm512_loadu_ps(xp.add(n * inp + k)),
                        _mm512_loadu_ps(xp.add(n * inp + k + 16)),
                    )
                };
                a0[n] = _mm512_fmadd_ps(w0, x0, a0[n]);
                a1[n] = _mm512_fmadd_ps(w1, x1, a1[n]);
            }
            k += 32;
        }
        if k + 16 <= inp {
            let w0 = widen16(wr.wrapping_add(k));
            for (n, a) in a0.iter_mut().enumerate() {
                // SAFETY: n * inp + k + 16 <= N * inp <= x.len() (asserted).
                let x0 = unsafe { _mm512_loadu_ps(xp.add(n * inp + k)) };
                *a = _mm512_fmadd_ps(w0, x0, *a);
            }
            k += 16;
        }
        for n in 0..N {
            let mut s = _mm512_reduce_add_ps(_mm512_add_ps(a0[n], a1[n]));
            for kk in k..inp {
                s += widen(w[r * inp + kk]) * x[n * inp + kk];
            }
            acc[r][n] = s;
        }
    }
}

/// AVX2 + FMA tile: one weight row at a time (as [`tile_avx512`]), 32 BF16
/// weights per step into four 8-lane accumulators per token.
///
/// # Safety
/// The processor must support AVX2 and FMA; `w` holds `R * inp` values and
/// `x` `N * inp`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_avx2<const R: usize, const N: usize>(
    w: &[u16],
    x: &[f32],
    inp: usize,
    acc: &mut [[f32; TOKEN_TILE]; ROW_TILE],
) {
    use std::arch::x86_64::*;
    assert!(w.len() >= R * inp && x.len() >= N * inp);
    let (wp, xp) = (w.as_ptr(), x.as_ptr());
    let widen8 = |p: *const u16| {
        // SAFETY: callers pass p with 8 values readable (see the loops).
        let raw = unsafe { _mm_loadu_si128(p as *const __m128i) };
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(raw)))
    };
    for r in 0..R {
        let wr = wp.wrapping_add(r * inp);
        let mut a = [[_mm256_setzero_ps(); 4]; N];
        let mut k = 0;
        while k + 32 <= inp {
            // r * inp + k + 32 <= R * inp <= w.len() (asserted)
            _mm_prefetch::<_MM_HINT_T0>(wr.wrapping_add(k + PREFETCH) as *const i8);
            let wv = [0, 8, 16, 24].map(|o| widen8(wr.wrapping_add(k + o)));
            for (n, an) in a.iter_mut().enumerate() {
                for (j, aj) in an.iter_mut().enumerate() {
                    // SAFETY: n * inp + k + 32 <= N * inp <= x.len() (asserted).
                    let xv = unsafe { _mm256_loadu_ps(xp.add(n * inp + k + 8 * j)) };
                    *aj = _mm256_fmadd_ps(wv[j], xv, *aj);
                }
            }
            k += 32;
        }
        while k + 8 <= inp {
            let wv = widen8(wr.wrapping_add(k));
            for (n, an) in a.iter_mut().enumerate() {
                // SAFETY: n * inp + k + 8 <= N * inp <= x.len() (asserted).
                let xv = unsafe { _mm256_loadu_ps(xp.add(n * inp + k)) };
                an[0] = _mm256_fmadd_ps(wv, xv, an[0]);
            }
            k += 8;
        }
        for (n, an) in a.iter().enumerate() {
            let v = _mm256_add_ps(_mm256_add_ps(an[0], an[1]), _mm256_add_ps(an[2], an[3]));
            let mut s = crate::vector::hsum256(v);
            for kk in k..inp {
                s += widen(w[r * inp + kk]) * x[n * inp + kk];
            }
            acc[r][n] = s;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Naive f64 reference of `x @ W^T`.
    fn naive(x: &[f32], w: &[bf16], inp: usize, out: usize) -> Vec<f64> {
        let t = x.len() / inp;
        let mut y = vec![0f64; t * out];
        for ti in 0..t {
            for o in 0..out {
                y[ti * out + o] = (0..inp)
                    .map(|i| x[ti * inp + i] as f64 * w[o * inp + i].to_f64())
                    .sum();
            }
        }
        y
    }

    fn inputs(t: usize, inp: usize, out: usize, seed: u64) -> (Vec<f32>, Vec<bf16>) {
        let mut s = seed;
        let mut next = || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
        };
        let x = (0..t * inp).map(|_| next()).collect();
        let w = (0..out * inp).map(|_| bf16::from_f32(next())).collect();
        (x, w)
    }

    #[test]
    fn every_path_matches_the_naive_product_on_ragged_shapes() {
        // ragged: tails in k (not a multiple of 16 or 8), rows (not of 4),
        // tokens (not of 4), both regimes, the parallel split and not
        let shapes = [
            (1, 37, 5),
            (3, 64, 9),
            (5, 100, 130),
            (7, 577, 67),
            (GEMM_MIN_TOKENS - 1, 33, 21),
            (GEMM_MIN_TOKENS, 45, 19),
            (40, 130, 70),
            (2, 1024, 1000),
        ];
        for (i, &(t, inp, out)) in shapes.iter().enumerate() {
            let (x, w) = inputs(t, inp, out, i as u64 + 1);
            let want = naive(&x, &w, inp, out);
            for isa in Isa::available() {
                let mut y = vec![f32::NAN; t * out];
                matmul_bf16(isa, &x, &w, inp, out, &mut y, &mut Scratch::default());
                for (j, (&a, &b)) in y.iter().zip(&want).enumerate() {
                    assert!(
                        (a as f64 - b).abs() <= 1e-5 * (1.0 + b.abs()) * (inp as f64).sqrt(),
                        "{isa:?} T={t} in={inp} out={out} [{j}]: {a} vs {b}"
                    );
                }
            }
        }
    }

    /// The tiled regime gives a token the same bits at any token count
    /// (its accumulators are its own): what deterministic mode runs at
    /// every count; `matmul_bf16` from 16 tokens on does not promise it.
    #[test]
    fn the_tiled_regime_gives_a_token_the_same_bits_at_any_token_count() {
        let (t, inp, out) = (37, 577, 70);
        let (x, w) = inputs(t, inp, out, 9);
        for isa in Isa::available() {
            let mut all = vec![f32::NAN; t * out];
            matmul_bf16_tiled(isa, &x, &w, inp, out, &mut all);
            for (n, row) in all.chunks_exact(out).enumerate() {
                let mut one = vec![f32::NAN; out];
                matmul_bf16_tiled(isa, &x[n * inp..(n + 1) * inp], &w, inp, out, &mut one);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(row), bits(&one), "{isa:?} token {n}");
            }
        }
    }

    #[test]
    fn strided_f32_products_match_on_every_path() {
        // x [5 rows of 37, stride 40], w [70 rows of 37, stride 39], y stride 75
        let (t, inp, out, xs, ws, ys) = (5, 37, 70, 40, 39, 75);
        let x: Vec<f32> = (0..t * xs)
            .map(|i| ((i * 7 % 13) as f32 - 6.0) / 5.0)
            .collect();
        let w: Vec<f32> = (0..out * ws)
            .map(|i| ((i * 5 % 11) as f32 - 5.0) / 8.0)
            .collect();
        for isa in Isa::available() {
            let mut y = vec![f32::NAN; t * ys];
            gemm_nt_f32(isa, &x, xs, t, &w, ws, inp, out, &mut y, ys);
            for i in 0..t {
                for o in 0..ys {
                    let got = y[i * ys + o];
                    if o >= out {
                        assert!(got.is_nan(), "{isa:?} wrote past the row's {out} values");
                        continue;
                    }
                    let want: f32 = (0..inp).map(|k| x[i * xs + k] * w[o * ws + k]).sum();
                    assert!(
                        (got - want).abs() < 1e-4,
                        "{isa:?} ({i},{o}) {got} vs {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_gemm_crate_regime_matches_and_reuses_its_scratch() {
        let mut scratch = Scratch::default();
        for &(out, inp) in &[(64, 64), (8, 16), (32, 96)] {
            let t = GEMM_MIN_TOKENS + 1;
            let (x, w) = inputs(t, inp, out, 9);
            let mut y = vec![0f32; t * out];
            matmul_bf16_gemm(&x, &w, inp, out, &mut y, &mut scratch);
            let want = naive(&x, &w, inp, out);
            assert!(
                y.iter()
                    .zip(&want)
                    .all(|(&a, &b)| (a as f64 - b).abs() < 1e-4)
            );
        }
        assert_eq!(scratch.wide.len(), 64 * 64);
    }
}
