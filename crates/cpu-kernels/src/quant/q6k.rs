//! ggml's Q6_K super-blocks: their layout, a reference quantiser, and the
//! dot products of [`super::Kernel`] over them.
//!
//! Contract: a super-block is 210 bytes for 256 weights: `ql[128]` (low 4
//! bits), `qh[64]` (high 2 bits), sixteen i8 scales, f16 `d`. Weight `i`
//! (half `n = i / 128`, `k = i % 128 / 32`, `l = i % 32`) has the low bits
//! of byte `ql[64n + 32(k & 1) + l]` (its low nibble for `k < 2`, else its
//! high one) and the high bits `(qh[32n + l] >> 2k) & 3`; its value is
//! `d·sc[i / 16]·(q − 32)`. So sub-block `s` of 32 weights (our activation
//! blocks) has two scales, `sc[2s]` and `sc[2s + 1]`, one per 16.
//!
//! The row kernels take activations with one scale `dx` per 256
//! ([`super::QuantType::act_group`]): each sub-block's values `q − 32`
//! are multiplied by their scales in 16 bits (`|(q − 32)·sc| <= 32 · 128 =
//! 4096`) and summed in i32 in two accumulators of four sub-blocks each (a
//! lane gathers at most 16 products of `4096 · 32767`: below `2^31`), each
//! converted and scaled by `d·dx` once per super-block. `dot_portable`
//! (any activation grouping) is the reference; the paths compute the same
//! integer values and differ in the order of the f32 additions, and a tile
//! of several activation rows gives bit for bit what one row gives. The
//! prompt GEMM reads `q − 32` per sub-block (`unpack_sub_vnni`) with one
//! scale `d·sc` per 16 ([`half_scale`]).
//!
//! Costs: per super-block and weight row one widening of the scales, per 32
//! weights a widening of their low and high bits (shared between
//! sub-blocks), five bit operations, a scale permute and a 16-bit multiply,
//! and per activation row one 16-bit dot product; two conversions and FMAs
//! per super-block and activation row.

use super::{ActsRow, QK};
use half::f16;

/// Weights per super-block.
pub const QK_K: usize = 256;
/// Bytes per super-block.
pub const BLOCK_BYTES: usize = 210;
/// Sub-blocks of [`QK`] per super-block.
const SUB: usize = QK_K / QK;
/// Offsets of the high bits, the scales and `d`.
const QH: usize = 128;
const SC: usize = 192;
const D: usize = 208;

/// Weight `i`'s 6-bit value (before the offset of 32) in super-block `b`.
pub fn q6(b: &[u8], i: usize) -> u8 {
    let (n, k, l) = (i / 128, i % 128 / 32, i % 32);
    let ql = b[64 * n + 32 * (k & 1) + l];
    let low = if k < 2 { ql & 15 } else { ql >> 4 };
    low | (((b[QH + 32 * n + l] >> (2 * k)) & 3) << 4)
}

/// `d·sc` of 16-weight group `h` (0..16) of super-block `b`.
pub fn half_scale(b: &[u8], h: usize) -> f32 {
    f16::from_le_bytes([b[D], b[D + 1]]).to_f32() * f32::from(b[SC + h] as i8)
}

/// Dequantises one super-block into `out` (256 values).
pub fn dequantize_block(b: &[u8], out: &mut [f32]) {
    for (i, o) in out.iter_mut().enumerate() {
        *o = half_scale(b, i / 16) * (f32::from(q6(b, i)) - 32.0);
    }
}

/// Quantises 256 values into one super-block appended to `out`: per 16
/// values the step `max|x| / 31.5` (both signs' extremes within half a
/// step of `q − 32 = ±32`, `+32` clamped to 31), the steps rounded to i8
/// multiples of the largest / 127, values rounded to `q − 32` in `[-32,
/// 31]` (ggml's simplest Q6_K quantiser, without its search for better
/// scales).
pub fn quantize_block(x: &[f32], out: &mut Vec<u8>) {
    assert_eq!(x.len(), QK_K, "a Q6_K block is {QK_K} values");
    let step: Vec<f32> = x
        .chunks_exact(16)
        .map(|g| g.iter().fold(0f32, |m, v| m.max(v.abs())) / 31.5)
        .collect();
    let d = f16::from_f32(step.iter().fold(0f32, |m, s| m.max(s.abs())) / 127.0);
    let sc: Vec<i8> = step
        .iter()
        .map(|&s| {
            if d.to_f32() > 0.0 {
                (s / d.to_f32()).round().clamp(-127.0, 127.0) as i8
            } else {
                0
            }
        })
        .collect();
    let q: Vec<u8> = x
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let unit = d.to_f32() * f32::from(sc[i / 16]);
            let r = if unit != 0.0 { (v / unit).round() } else { 0.0 };
            (r.clamp(-32.0, 31.0) + 32.0) as u8
        })
        .collect();
    let mut b = [0u8; BLOCK_BYTES];
    for (i, &v) in q.iter().enumerate() {
        let (n, k, l) = (i / 128, i % 128 / 32, i % 32);
        let at = 64 * n + 32 * (k & 1) + l;
        b[at] |= if k < 2 { v & 15 } else { (v & 15) << 4 };
        b[QH + 32 * n + l] |= (v >> 4) << (2 * k);
    }
    for (h, &s) in sc.iter().enumerate() {
        b[SC + h] = s as u8;
    }
    b[D..].copy_from_slice(&d.to_le_bytes());
    out.extend_from_slice(&b);
}

/// Scalar reference: integer sums per 16 weights, f32 across them.
pub(super) fn dot_portable(w: &[u8], a: ActsRow<'_>) -> f32 {
    let mut acc = 0f32;
    for (sb, wb) in w
        .chunks_exact(BLOCK_BYTES)
        .take(a.ds.len() / SUB)
        .enumerate()
    {
        for s in 0..SUB {
            let b = sb * SUB + s;
            let qx = &a.q[b * QK..(b + 1) * QK];
            let half = |h: usize| -> i32 {
                (16 * h..16 * h + 16)
                    .map(|l| (i32::from(q6(wb, QK * s + l)) - 32) * i32::from(qx[l]))
                    .sum()
            };
            let dx = a.ds[b][0];
            acc += half_scale(wb, 2 * s) * dx * half(0) as f32
                + half_scale(wb, 2 * s + 1) * dx * half(1) as f32;
        }
    }
    acc
}

/// `q − 32` of sub-block `k` (0..4) of a half, from its widened low-bit
/// bytes `ql` (`ql[0]` for even `k`, `ql[1]` for odd) and high-bit bytes
/// `qh`, as 16-bit lanes; `$v` names the vector type's operations.
macro_rules! sub_values {
    ($ql:expr, $qh:expr, $k:expr, $and:ident, $or:ident, $sub:ident, $srli:ident, $slli:ident, $set1:ident) => {{
        let (ql, qh) = ($ql, $qh);
        let (fifteen, hi2) = ($set1(15), $set1(0x30));
        let (low, high) = match $k {
            0 => ($and(ql[0], fifteen), $and($slli::<4>(qh), hi2)),
            1 => ($and(ql[1], fifteen), $and($slli::<2>(qh), hi2)),
            2 => ($srli::<4>(ql[0]), $and(qh, hi2)),
            _ => ($srli::<4>(ql[1]), $and($srli::<2>(qh), hi2)),
        };
        $sub($or(low, high), $set1(32))
    }};
}

/// 32 bytes at `p` widened to 16-bit lanes (AVX-512).
///
/// # Safety
/// AVX-512F, BW; 32 bytes readable at `p`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw")]
unsafe fn widen_vnni(p: *const u8) -> std::arch::x86_64::__m512i {
    use std::arch::x86_64::*;
    // SAFETY: 32 bytes readable (caller).
    _mm512_cvtepu8_epi16(unsafe { _mm256_loadu_si256(p as *const __m256i) })
}

/// 32 bytes at `p` widened to 16-bit lanes, as two vectors of 16 (AVX2).
///
/// # Safety
/// AVX2; 32 bytes readable at `p`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn widen_avx2(p: *const u8) -> (std::arch::x86_64::__m256i, std::arch::x86_64::__m256i) {
    use std::arch::x86_64::*;
    // SAFETY: 32 bytes readable (caller).
    unsafe {
        (
            _mm256_cvtepu8_epi16(_mm_loadu_si128(p as *const __m128i)),
            _mm256_cvtepu8_epi16(_mm_loadu_si128(p.add(16) as *const __m128i)),
        )
    }
}

/// `q − 32` of sub-block `k` of a half (AVX-512).
///
/// # Safety
/// AVX-512F, BW.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw")]
unsafe fn values_vnni(
    ql: [std::arch::x86_64::__m512i; 2],
    qh: std::arch::x86_64::__m512i,
    k: usize,
) -> std::arch::x86_64::__m512i {
    use std::arch::x86_64::*;
    sub_values!(
        ql,
        qh,
        k,
        _mm512_and_si512,
        _mm512_or_si512,
        _mm512_sub_epi16,
        _mm512_srli_epi16,
        _mm512_slli_epi16,
        _mm512_set1_epi16
    )
}

/// `q − 32` of sub-block `k` of a half (AVX2, 2 x 16 lanes).
///
/// # Safety
/// AVX2.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn values_avx2(
    ql: [(std::arch::x86_64::__m256i, std::arch::x86_64::__m256i); 2],
    qh: (std::arch::x86_64::__m256i, std::arch::x86_64::__m256i),
    k: usize,
) -> (std::arch::x86_64::__m256i, std::arch::x86_64::__m256i) {
    // SAFETY: AVX2 (this function's features).
    unsafe {
        (
            values_avx2_16([ql[0].0, ql[1].0], qh.0, k),
            values_avx2_16([ql[0].1, ql[1].1], qh.1, k),
        )
    }
}

/// [`values_avx2`] for one vector of 16 lanes.
///
/// # Safety
/// AVX2.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn values_avx2_16(
    ql: [std::arch::x86_64::__m256i; 2],
    qh: std::arch::x86_64::__m256i,
    k: usize,
) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    sub_values!(
        ql,
        qh,
        k,
        _mm256_and_si256,
        _mm256_or_si256,
        _mm256_sub_epi16,
        _mm256_srli_epi16,
        _mm256_slli_epi16,
        _mm256_set1_epi16
    )
}

/// Sub-block `b` (of 32 weights, counted along the row) of the row at `row`
/// as `q − 32` in 32 i16, for the prompt GEMM's panels.
///
/// # Safety
/// AVX-512F, BW; super-block `b / 8` of the row readable.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw")]
pub(super) unsafe fn unpack_sub_vnni(row: *const u8, b: usize) -> std::arch::x86_64::__m512i {
    let (sb, s) = (b / SUB, b % SUB);
    let (n, k) = (s / 4, s % 4);
    // SAFETY: the half's bytes lie in super-block sb (caller).
    unsafe {
        let wb = row.add(sb * BLOCK_BYTES);
        let low = widen_vnni(wb.add(64 * n + 32 * (k & 1)));
        let ql = [low, low];
        values_vnni(ql, widen_vnni(wb.add(QH + 32 * n)), k)
    }
}

/// Lane `i` of index vector `s`: scale `2s` for lanes 0..16, `2s + 1` for
/// 16..32 (the 16-bit permute that spreads a sub-block's two scales).
const fn scale_index() -> [[i16; 32]; SUB] {
    let mut t = [[0i16; 32]; SUB];
    let mut s = 0;
    while s < SUB {
        let mut i = 0;
        while i < 32 {
            t[s][i] = (2 * s + i / 16) as i16;
            i += 1;
        }
        s += 1;
    }
    t
}
static SCALE_INDEX: [[i16; 32]; SUB] = scale_index();

/// One Q6_K dot-product path over `N` activation rows (see the module
/// doc): `ys[j][r] = w_r · a[j]`, each super-block's weights unpacked and
/// scaled once for all `N`; every row's operations are the same whatever
/// `N` is (bit for bit).
macro_rules! q6k_fn {
    ($name:ident, $feat:literal, $widen:ident, $values:ident, $scales:ident, $scale:ident, $dp:path, $izero:ident, $zero:ident, $set1:ident, $fma:ident, $cvt:ident, $hsum:expr) => {
        /// # Safety
        /// The named target features; `w` holds `ys[0].len()` rows of
        /// `a[0].ds.len() / 8` super-blocks, every `a[j]` that many
        /// sub-blocks of activations with one scale per 256 and every
        /// `ys[j]` the same length (checked by [`super::Kernel`]).
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $feat)]
        pub(super) unsafe fn $name<const N: usize>(
            w: &[u8],
            a: &[ActsRow<'_>; N],
            ys: &mut [&mut [f32]; N],
        ) {
            use std::arch::x86_64::*;
            let sbs = a[0].ds.len() / SUB;
            let rb = sbs * BLOCK_BYTES;
            for r in 0..ys[0].len() {
                let mut acc = [$zero(); N];
                for sb in 0..sbs {
                    // SAFETY: super-block sb of row r lies in `w`; the
                    // activations' sub-blocks sb * 8.. sb * 8 + 8 in every
                    // a[j] (the caller's contract).
                    unsafe {
                        let wb = w.as_ptr().add(r * rb + sb * BLOCK_BYTES);
                        let scales = $scales(wb);
                        let mut ia = [[$izero(); 2]; N];
                        for n in 0..2 {
                            let ql = [$widen(wb.add(64 * n)), $widen(wb.add(64 * n + 32))];
                            let qh = $widen(wb.add(QH + 32 * n));
                            for k in 0..4 {
                                let s = 4 * n + k;
                                let v = $scale(scales, s, $values(ql, qh, k));
                                for j in 0..N {
                                    let x = a[j].q.as_ptr().add((sb * SUB + s) * QK);
                                    ia[j][k & 1] = $dp(ia[j][k & 1], v, x);
                                }
                            }
                        }
                        let d = f16::from_le_bytes([*wb.add(D), *wb.add(D + 1)]).to_f32();
                        for j in 0..N {
                            let ddx = $set1(d * (*a[j].ds.as_ptr().add(sb * SUB))[0]);
                            acc[j] = $fma($cvt(ia[j][0]), ddx, acc[j]);
                            acc[j] = $fma($cvt(ia[j][1]), ddx, acc[j]);
                        }
                    }
                }
                for j in 0..N {
                    ys[j][r] = $hsum(acc[j]);
                }
            }
        }
    };
}

/// The super-block's 16 scales widened to i16 (AVX-512).
///
/// # Safety
/// AVX-512F, BW; a whole super-block at `wb`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw")]
unsafe fn scales_vnni(wb: *const u8) -> std::arch::x86_64::__m512i {
    use std::arch::x86_64::*;
    // SAFETY: the 16 scale bytes lie in the super-block (caller).
    let sc = unsafe { _mm_loadu_si128(wb.add(SC) as *const __m128i) };
    _mm512_castsi256_si512(_mm256_cvtepi8_epi16(sc))
}

/// Sub-block `s`'s values times its two scales (lanes 0..16 by `sc[2s]`,
/// 16..32 by `sc[2s + 1]`, spread by a 16-bit permute).
///
/// # Safety
/// AVX-512F, BW.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw")]
unsafe fn scale_vnni(
    sc: std::arch::x86_64::__m512i,
    s: usize,
    v: std::arch::x86_64::__m512i,
) -> std::arch::x86_64::__m512i {
    use std::arch::x86_64::*;
    // SAFETY: the index row is 64 bytes.
    let idx = unsafe { _mm512_loadu_si512(SCALE_INDEX[s].as_ptr() as *const _) };
    _mm512_mullo_epi16(v, _mm512_permutexvar_epi16(idx, sc))
}

/// The super-block's 16 scales (AVX2 broadcasts them one by one).
///
/// # Safety
/// A whole super-block at `wb`.
#[cfg(target_arch = "x86_64")]
#[inline]
unsafe fn scales_avx2(wb: *const u8) -> [i8; 16] {
    // SAFETY: the 16 scale bytes lie in the super-block (caller).
    unsafe { std::ptr::read_unaligned(wb.add(SC) as *const [i8; 16]) }
}

/// Sub-block `s`'s values times its two scales (AVX2).
///
/// # Safety
/// AVX2.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn scale_avx2(
    sc: [i8; 16],
    s: usize,
    v: (std::arch::x86_64::__m256i, std::arch::x86_64::__m256i),
) -> (std::arch::x86_64::__m256i, std::arch::x86_64::__m256i) {
    use std::arch::x86_64::*;
    (
        _mm256_mullo_epi16(v.0, _mm256_set1_epi16(i16::from(sc[2 * s]))),
        _mm256_mullo_epi16(v.1, _mm256_set1_epi16(i16::from(sc[2 * s + 1]))),
    )
}

q6k_fn!(
    rows_avx2,
    "avx2,fma,f16c",
    widen_avx2,
    values_avx2,
    scales_avx2,
    scale_avx2,
    super::q4k::dp_avx2,
    _mm256_setzero_si256,
    _mm256_setzero_ps,
    _mm256_set1_ps,
    _mm256_fmadd_ps,
    _mm256_cvtepi32_ps,
    crate::vector::hsum256
);
q6k_fn!(
    rows_vnni,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vnni",
    widen_vnni,
    values_vnni,
    scales_vnni,
    scale_vnni,
    super::q4k::dp_vnni,
    _mm512_setzero_si512,
    _mm512_setzero_ps,
    _mm512_set1_ps,
    _mm512_fmadd_ps,
    _mm512_cvtepi32_ps,
    _mm512_reduce_add_ps
);

#[cfg(test)]
mod tests {
    use super::*;

    /// The layout written out from ggml's `dequantize_row_q6_K` loop
    /// (halves of 128, `l < 32`, four values per `l`), apart from [`q6`].
    fn by_loop(b: &[u8]) -> Vec<f32> {
        let d = f16::from_le_bytes([b[D], b[D + 1]]).to_f32();
        let mut y = vec![0f32; QK_K];
        for n in 0..2 {
            let (ql, qh, sc) = (&b[64 * n..], &b[QH + 32 * n..], &b[SC + 8 * n..]);
            for l in 0..32 {
                let is = l / 16;
                let q = [
                    (ql[l] & 15) | ((qh[l] & 3) << 4),
                    (ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4),
                    (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4),
                    (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4),
                ];
                for (k, &q) in q.iter().enumerate() {
                    let s = d * f32::from(sc[is + 2 * k] as i8);
                    y[128 * n + 32 * k + l] = s * (f32::from(q) - 32.0);
                }
            }
        }
        y
    }

    #[test]
    fn values_follow_the_reference_loop_and_quantise_back() {
        let mut block = super::super::tests::random_bytes(BLOCK_BYTES, 0x9e37_79b9_7f4a_7c15);
        block[D..].copy_from_slice(&f16::from_f32(0.01).to_le_bytes());
        let mut got = vec![0f32; QK_K];
        dequantize_block(&block, &mut got);
        assert_eq!(got, by_loop(&block));
        // quantising those values gives them back within half a step
        let mut again = Vec::new();
        quantize_block(&got, &mut again);
        let mut back = vec![0f32; QK_K];
        dequantize_block(&again, &mut back);
        let step = |g: &[f32]| g.iter().fold(0f32, |m, v| m.max(v.abs())) / 32.0;
        let d = got.chunks_exact(16).map(step).fold(0f32, f32::max) / 127.0;
        for (h, (g, b)) in got.chunks_exact(16).zip(back.chunks_exact(16)).enumerate() {
            for (x, y) in g.iter().zip(b) {
                // half a step, plus the scale's rounding to a multiple of
                // d (half of d on up to 32 steps) and d's f16 rounding
                let bound = 0.5 * step(g) + 16.0 * d + 1e-3 * x.abs();
                assert!((x - y).abs() <= bound, "group {h}: {x} vs {y}");
            }
        }
    }
}
