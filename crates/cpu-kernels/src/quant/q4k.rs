//! ggml's Q4_K super-blocks: their layout, a reference quantiser, and the
//! dot products of [`super::Kernel`] over them.
//!
//! Contract: a super-block is 144 bytes for 256 weights: f16 `d`, f16
//! `dmin`, 12 bytes packing eight 6-bit scales `sc_s` and minimums `mn_s`
//! (for `s < 4` the low 6 bits of bytes `s` and `s + 4`; for `s >= 4` a low
//! nibble from byte `s + 4` and two high bits from the top of bytes `s - 4`
//! and `s`), then 128 bytes of nibbles: 32 bytes per pair of sub-blocks,
//! sub-block `2g` in the low nibbles of bytes `32g..32g + 32`, sub-block
//! `2g + 1` in their high nibbles. Weight `i` of sub-block `s` is `d·sc_s·q
//! − dmin·mn_s`.
//!
//! The row kernels ([`super::Kernel`]'s AVX2 and VNNI paths) take
//! activations with one scale `dx` per 256 ([`super::QuantType::act_group`]):
//! each sub-block's 16-bit weights are multiplied by its 6-bit scale
//! (`q·sc_s <= 945`) and the whole super-block is summed in i32 (a lane
//! gathers at most 16 products of `945 · 32767`: below `2^31`), then
//! scaled by `d·dx` once, plus the minimums' term `Σ_s dmin·mn_s·sx_s` in
//! 8 f32 lanes. `dot_portable` (per sub-block, any activation grouping)
//! is the reference; the paths compute the same integer values and differ
//! in the order of the f32 additions, and a tile of several activation
//! rows gives bit for bit what one row gives. The prompt GEMM reads the
//! super-blocks as eight Q4_1-like blocks (`(d·sc_s, −dmin·mn_s)` per 32:
//! `unpack_sub_vnni`).
//!
//! Costs: per super-block and weight row one unpacking of the scales (a
//! few integer operations, one 8-lane conversion), per 64 weights one
//! widening, two nibble extractions, two 16-bit multiplies by the scales,
//! and per activation row two 16-bit dot products (`vpdpwssd`); one
//! conversion and two FMAs per super-block and activation row. Measured on
//! 2 Zen 4 cores: about 42 GB/s of Q4_K weights (compute-bound; Q8_0's
//! row kernel reaches 58, the memory's rate).

use super::{ActsRow, QK};
use half::f16;

/// Weights per super-block.
pub const QK_K: usize = 256;
/// Bytes per super-block.
pub const BLOCK_BYTES: usize = 144;
/// Sub-blocks of [`QK`] per super-block.
const SUB: usize = QK_K / QK;
/// Offset of the nibbles in a super-block.
const QS: usize = 16;

/// The eight 6-bit scales and minimums packed in `p[..12]`.
pub fn scales_mins(p: &[u8]) -> ([u8; SUB], [u8; SUB]) {
    let word = |i: usize| u32::from_le_bytes([p[i], p[i + 1], p[i + 2], p[i + 3]]);
    let (a, b, c) = (word(0), word(4), word(8));
    const LOW6: u32 = 0x3f3f_3f3f;
    const LOW4: u32 = 0x0f0f_0f0f;
    const TOP2: u32 = 0x0303_0303;
    let sc_hi = (c & LOW4) | (((a >> 6) & TOP2) << 4);
    let mn_hi = ((c >> 4) & LOW4) | (((b >> 6) & TOP2) << 4);
    let join = |lo: u32, hi: u32| {
        let mut out = [0u8; SUB];
        out[..4].copy_from_slice(&lo.to_le_bytes());
        out[4..].copy_from_slice(&hi.to_le_bytes());
        out
    };
    (join(a & LOW6, sc_hi), join(b & LOW6, mn_hi))
}

/// Packs eight 6-bit scales and minimums as [`scales_mins`] reads them.
fn pack_scales(sc: &[u8; SUB], mn: &[u8; SUB]) -> [u8; 12] {
    let mut p = [0u8; 12];
    for j in 0..4 {
        p[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
        p[j + 4] = mn[j] | ((mn[j + 4] >> 4) << 6);
        p[j + 8] = (sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4);
    }
    p
}

/// Weight `i`'s 4-bit value in sub-block `s` of the super-block `b`.
pub fn nibble(b: &[u8], s: usize, i: usize) -> u8 {
    (b[QS + 32 * (s / 2) + i] >> (4 * (s & 1))) & 15
}

/// Dequantises one super-block into `out` (256 values).
pub fn dequantize_block(b: &[u8], out: &mut [f32]) {
    let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
    let dmin = f16::from_le_bytes([b[2], b[3]]).to_f32();
    let (sc, mn) = scales_mins(&b[4..16]);
    for (s, o) in out.chunks_exact_mut(QK).enumerate() {
        let (ds, ms) = (d * sc[s] as f32, -dmin * mn[s] as f32);
        for (i, o) in o.iter_mut().enumerate() {
            *o = ds * nibble(b, s, i) as f32 + ms;
        }
    }
}

/// Quantises 256 values into one super-block appended to `out`: per
/// sub-block the range `[min(0, lo), hi]` over 15 steps, the sub-blocks'
/// steps and minimums rounded to 6 bits of the largest (ggml's simplest
/// Q4_K quantiser, without its search for better scales).
pub fn quantize_block(x: &[f32], out: &mut Vec<u8>) {
    assert_eq!(x.len(), QK_K, "a Q4_K block is {QK_K} values");
    let mut step = [0f32; SUB];
    let mut low = [0f32; SUB];
    for (s, v) in x.chunks_exact(QK).enumerate() {
        let lo = v.iter().copied().fold(0f32, f32::min);
        let hi = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        step[s] = (hi - lo) / 15.0;
        low[s] = -lo;
    }
    let d = step.iter().copied().fold(0f32, f32::max) / 63.0;
    let dmin = low.iter().copied().fold(0f32, f32::max) / 63.0;
    let (d, dmin) = (f16::from_f32(d), f16::from_f32(dmin));
    let to6 = |v: f32, unit: f32| {
        if unit > 0.0 {
            (v / unit).round().clamp(0.0, 63.0) as u8
        } else {
            0
        }
    };
    let sc: [u8; SUB] = std::array::from_fn(|s| to6(step[s], d.to_f32()));
    let mn: [u8; SUB] = std::array::from_fn(|s| to6(low[s], dmin.to_f32()));
    out.extend_from_slice(&d.to_le_bytes());
    out.extend_from_slice(&dmin.to_le_bytes());
    out.extend_from_slice(&pack_scales(&sc, &mn));
    let q = |s: usize, v: f32| {
        let (ds, ms) = (d.to_f32() * sc[s] as f32, dmin.to_f32() * mn[s] as f32);
        if ds > 0.0 {
            ((v + ms) / ds).round().clamp(0.0, 15.0) as u8
        } else {
            0
        }
    };
    for g in 0..SUB / 2 {
        let (a, b) = (&x[2 * g * QK..][..QK], &x[(2 * g + 1) * QK..][..QK]);
        out.extend((0..QK).map(|i| q(2 * g, a[i]) | (q(2 * g + 1, b[i]) << 4)));
    }
}

/// Scalar reference: integer sub-block sums, f32 across them.
pub(super) fn dot_portable(w: &[u8], a: ActsRow<'_>) -> f32 {
    let mut acc = 0f32;
    for (sb, wb) in w
        .chunks_exact(BLOCK_BYTES)
        .take(a.ds.len() / SUB)
        .enumerate()
    {
        let d = f16::from_le_bytes([wb[0], wb[1]]).to_f32();
        let dmin = f16::from_le_bytes([wb[2], wb[3]]).to_f32();
        let (sc, mn) = scales_mins(&wb[4..16]);
        for s in 0..SUB {
            let b = sb * SUB + s;
            let [dx, sx] = a.ds[b];
            let (qs, shift) = (&wb[QS + 32 * (s / 2)..][..QK], 4 * (s & 1));
            let qx = &a.q[b * QK..(b + 1) * QK];
            let sum: i32 = qs
                .iter()
                .zip(qx)
                .map(|(&q, &x)| ((q >> shift) & 15) as i32 * x as i32)
                .sum();
            acc += d * sc[s] as f32 * dx * sum as f32 - dmin * mn[s] as f32 * sx;
        }
    }
    acc
}

/// `d` of the super-block at `wb`, its 6-bit scales (each in both i16
/// halves of an i32), and `[dmin·mn_s]` in 8 lanes: [`scales_mins`]'s
/// word arithmetic on one 128-bit register (no scalar work).
///
/// # Safety
/// AVX2, F16C; a whole super-block at `wb`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn head(wb: *const u8) -> (f32, [i32; SUB], std::arch::x86_64::__m256) {
    use std::arch::x86_64::*;
    // SAFETY: 16 bytes readable at wb (caller).
    let v = unsafe { _mm_loadu_si128(wb as *const __m128i) };
    let dd = _mm_cvtph_ps(v); // [d, dmin, _, _]
    // 32-bit lanes of v: [d dmin | a | b | c], a, b, c the packed words
    let abcc = _mm_shuffle_epi32::<0b11_11_10_01>(v);
    let low6 = _mm_and_si128(abcc, _mm_set1_epi8(0x3f)); // [sc 0..4, mn 0..4, _, _]
    let ccab = _mm_shuffle_epi32::<0b10_01_11_11>(v);
    let bits = _mm_and_si128(
        _mm_srlv_epi32(ccab, _mm_setr_epi32(0, 4, 6, 6)),
        _mm_setr_epi32(0x0f0f_0f0f, 0x0f0f_0f0f, 0x0303_0303, 0x0303_0303),
    );
    let top = _mm_shuffle_epi32::<0b11_10_11_10>(_mm_slli_epi32::<4>(bits));
    let high = _mm_or_si128(bits, top); // [sc 4..8, mn 4..8, _, _]
    let scmn = _mm_unpacklo_epi32(low6, high); // bytes: sc 0..8, mn 0..8
    let sc = _mm256_cvtepu8_epi32(scmn);
    let mut doubled = [0i32; SUB];
    // SAFETY: 32 bytes written into the array.
    unsafe {
        _mm256_storeu_si256(
            doubled.as_mut_ptr() as *mut __m256i,
            _mm256_or_si256(sc, _mm256_slli_epi32::<16>(sc)),
        )
    };
    let mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128::<8>(scmn)));
    let dmn = _mm256_mul_ps(_mm256_broadcastss_ps(_mm_movehdup_ps(dd)), mn);
    (_mm_cvtss_f32(dd), doubled, dmn)
}

/// The two sub-blocks of the 32 nibble bytes at `p`, each as 2 x 16 i16
/// (the bytes widened first, then both nibbles taken from each 16-bit
/// lane).
///
/// # Safety
/// AVX2; 32 bytes readable at `p`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
#[allow(clippy::type_complexity)]
unsafe fn unpack_avx2(
    p: *const u8,
) -> (
    (std::arch::x86_64::__m256i, std::arch::x86_64::__m256i),
    (std::arch::x86_64::__m256i, std::arch::x86_64::__m256i),
) {
    use std::arch::x86_64::*;
    // SAFETY: 32 bytes readable (caller).
    let (a, b) = unsafe {
        (
            _mm256_cvtepu8_epi16(_mm_loadu_si128(p as *const __m128i)),
            _mm256_cvtepu8_epi16(_mm_loadu_si128(p.add(16) as *const __m128i)),
        )
    };
    let mask = _mm256_set1_epi16(0x0f);
    (
        (_mm256_and_si256(a, mask), _mm256_and_si256(b, mask)),
        (_mm256_srli_epi16::<4>(a), _mm256_srli_epi16::<4>(b)),
    )
}

/// The two sub-blocks of the 32 nibble bytes at `p`, each as 32 i16 (the
/// bytes widened first, then both nibbles taken from each 16-bit lane).
///
/// # Safety
/// AVX-512F, BW; 32 bytes readable at `p`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw")]
unsafe fn unpack_vnni(p: *const u8) -> (std::arch::x86_64::__m512i, std::arch::x86_64::__m512i) {
    use std::arch::x86_64::*;
    // SAFETY: 32 bytes readable (caller).
    let wide = _mm512_cvtepu8_epi16(unsafe { _mm256_loadu_si256(p as *const __m256i) });
    (
        _mm512_and_si512(wide, _mm512_set1_epi16(0x0f)),
        _mm512_srli_epi16::<4>(wide),
    )
}

/// 16-bit weights (2 x 16, AVX2) times a sub-block's 6-bit scale (in both
/// halves of `s`).
///
/// # Safety
/// AVX2.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn scale_avx2(
    w: (std::arch::x86_64::__m256i, std::arch::x86_64::__m256i),
    s: &i32,
) -> (std::arch::x86_64::__m256i, std::arch::x86_64::__m256i) {
    use std::arch::x86_64::*;
    let s = _mm256_set1_epi32(*s);
    (_mm256_mullo_epi16(w.0, s), _mm256_mullo_epi16(w.1, s))
}

/// 16-bit weights (32, AVX-512) times a sub-block's 6-bit scale (in both
/// halves of `s`).
///
/// # Safety
/// AVX-512F, BW.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw")]
unsafe fn scale_vnni(w: std::arch::x86_64::__m512i, s: &i32) -> std::arch::x86_64::__m512i {
    use std::arch::x86_64::*;
    _mm512_mullo_epi16(w, _mm512_set1_epi32(*s))
}

/// `acc` plus the i32 lane sums of `w` times the 32 activations at `x`
/// (AVX2).
///
/// # Safety
/// AVX2; 32 values at `x`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn dp_avx2(
    acc: std::arch::x86_64::__m256i,
    w: (std::arch::x86_64::__m256i, std::arch::x86_64::__m256i),
    x: *const i16,
) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    // SAFETY: 32 values at x (caller).
    _mm256_add_epi32(acc, unsafe { super::dot::mul_avx2(w, x) })
}

/// `acc` plus the i32 lane sums of `w` times the 32 activations at `x`
/// (AVX-512 VNNI, one `vpdpwssd`).
///
/// # Safety
/// AVX-512F, BW, VNNI; 32 values at `x`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn dp_vnni(
    acc: std::arch::x86_64::__m512i,
    w: std::arch::x86_64::__m512i,
    x: *const i16,
) -> std::arch::x86_64::__m512i {
    use std::arch::x86_64::*;
    // SAFETY: 32 values at x (caller).
    _mm512_dpwssd_epi32(acc, w, unsafe { _mm512_loadu_si512(x as *const _) })
}

/// Sub-block `b` (of 32 weights, counted along the row) of the row at `row`
/// as 32 i16, for the prompt GEMM's panels.
///
/// # Safety
/// AVX-512F, BW; super-block `b / 8` of the row readable.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw")]
pub(super) unsafe fn unpack_sub_vnni(row: *const u8, b: usize) -> std::arch::x86_64::__m512i {
    let (sb, s) = (b / SUB, b % SUB);
    // SAFETY: the pair's 32 bytes lie in super-block sb (caller).
    let (lo, hi) = unsafe { unpack_vnni(row.add(sb * BLOCK_BYTES + QS + 32 * (s / 2))) };
    if s & 1 == 0 { lo } else { hi }
}

/// One Q4_K dot-product path over `N` activation rows: `ys[j][r] = w_r ·
/// a[j]`, each super-block's weights unpacked and scaled once for all `N`;
/// every row's operations are the same whatever `N` is (bit for bit).
///
/// Per super-block the weights are multiplied by their sub-block's 6-bit
/// scale in 16 bits (`15 · 63 = 945` at most) and the whole super-block is
/// summed in i32 against activations with one scale per 256 (each lane
/// gathers at most 16 products of `945 · 32767`: below `2^31`); one
/// conversion and FMA by `d · dx` per super-block, plus the minimums' 8
/// lanes `dmin·mn_s · sx_s`.
macro_rules! q4k_fn {
    ($name:ident, $feat:literal, $unpack:ident, $scale:ident, $dp:ident, $izero:ident, $iadd:ident, $zero:ident, $set1:ident, $fma:ident, $cvt:ident, $hsum:expr) => {
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
                let mut mins = [_mm256_setzero_ps(); N];
                for sb in 0..sbs {
                    // SAFETY: super-block sb of row r lies in `w`; the
                    // activations' sub-blocks sb * 8.. sb * 8 + 8 in every
                    // a[j] (the caller's contract).
                    unsafe {
                        let wb = w.as_ptr().add(r * rb + sb * BLOCK_BYTES);
                        let (d, sc, dmn) = head(wb);
                        let mut ia = [[$izero(); 2]; N];
                        for g in 0..SUB / 2 {
                            let (lo, hi) = $unpack(wb.add(QS + 32 * g));
                            let (lo, hi) = ($scale(lo, &sc[2 * g]), $scale(hi, &sc[2 * g + 1]));
                            for j in 0..N {
                                let x = a[j].q.as_ptr().add((sb * SUB + 2 * g) * QK);
                                ia[j][0] = $dp(ia[j][0], lo, x);
                                ia[j][1] = $dp(ia[j][1], hi, x.add(QK));
                            }
                        }
                        for j in 0..N {
                            let dx = $set1(d * (*a[j].ds.as_ptr().add(sb * SUB))[0]);
                            acc[j] = $fma($cvt($iadd(ia[j][0], ia[j][1])), dx, acc[j]);
                            let sx = _mm256_loadu_ps(a[j].sx.as_ptr().add(sb * SUB));
                            mins[j] = _mm256_fmadd_ps(dmn, sx, mins[j]);
                        }
                    }
                }
                for j in 0..N {
                    ys[j][r] = $hsum(acc[j]) - crate::vector::hsum256(mins[j]);
                }
            }
        }
    };
}

q4k_fn!(
    rows_avx2,
    "avx2,fma,f16c",
    unpack_avx2,
    scale_avx2,
    dp_avx2,
    _mm256_setzero_si256,
    _mm256_add_epi32,
    _mm256_setzero_ps,
    _mm256_set1_ps,
    _mm256_fmadd_ps,
    _mm256_cvtepi32_ps,
    crate::vector::hsum256
);
q4k_fn!(
    rows_vnni,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vnni",
    unpack_vnni,
    scale_vnni,
    dp_vnni,
    _mm512_setzero_si512,
    _mm512_add_epi32,
    _mm512_setzero_ps,
    _mm512_set1_ps,
    _mm512_fmadd_ps,
    _mm512_cvtepi32_ps,
    _mm512_reduce_add_ps
);
#[cfg(test)]
mod tests {
    use super::*;

    /// The format's definition of scale / minimum `j`, written out apart
    /// from [`scales_mins`]'s word arithmetic.
    fn by_definition(p: &[u8], j: usize) -> (u8, u8) {
        if j < 4 {
            (p[j] & 63, p[j + 4] & 63)
        } else {
            (
                (p[j + 4] & 15) | ((p[j - 4] >> 6) << 4),
                (p[j + 4] >> 4) | ((p[j] >> 6) << 4),
            )
        }
    }

    #[test]
    fn scales_unpack_as_defined_and_pack_back() {
        for p in super::super::tests::random_bytes(500 * 12, 0x2545_f491_4f6c_dd1d).chunks_exact(12)
        {
            let (sc, mn) = scales_mins(p);
            for j in 0..SUB {
                assert_eq!((sc[j], mn[j]), by_definition(p, j), "{p:?} j={j}");
            }
            // every bit of the 12 bytes is one of the 96 scale bits
            assert_eq!(pack_scales(&sc, &mn), p);
        }
    }

    #[test]
    fn nibbles_follow_the_pair_layout() {
        let mut b = vec![0u8; BLOCK_BYTES];
        b[QS + 32 + 5] = 0xa7; // pair 1, byte 5
        assert_eq!(nibble(&b, 2, 5), 0x7);
        assert_eq!(nibble(&b, 3, 5), 0xa);
        assert_eq!(nibble(&b, 2, 4), 0);
        assert_eq!(nibble(&b, 0, 5), 0);
    }
}
