//! The block dot products of [`super::matmul_quant`]: one weight row in
//! ggml blocks times one quantised activation row, per instruction set.
//!
//! Contract: [`Kernel::dot`] returns `Σ_b dw_b·dx_b·(Σ_j qw_j·qx_j)` (Q8_0)
//! plus `Σ_b m_b·sx_b` (Q4_1), the integer sums exact on every path (the
//! weights widened to i16, products of pairs summed in i32 by `vpmaddwd` or
//! `vpdpwssd`: a block's sum is at most `32·128·32767 < 2^31`), the f32
//! additions in an order that differs between paths. [`Kernel::pick`] chooses the best path
//! an [`Isa`] allows that the processor runs; [`Kernel::available`] lists
//! every one for tests.
//! Costs: one pass over the row's blocks, no allocation.

use super::{ActsRow, QK, QuantType};
use crate::isa::Isa;
use half::f16;

/// A dot-product path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// Scalar integer sums (the reference).
    Portable,
    /// AVX2 `vpmaddwd` on 8 lanes, F16C scales.
    Avx2,
    /// AVX-512 VNNI `vpdpwssd` on 16 lanes (one block per instruction).
    Vnni,
}

impl Kernel {
    /// Whether this processor runs the path.
    pub fn supported(self) -> bool {
        match self {
            Kernel::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Kernel::Vnni => {
                Kernel::Avx2.supported()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// Every path this processor runs, portable first.
    pub fn available() -> Vec<Kernel> {
        [Kernel::Portable, Kernel::Avx2, Kernel::Vnni]
            .into_iter()
            .filter(|k| k.supported())
            .collect()
    }

    /// The best path `isa` allows (VNNI under AVX-512, `vpmaddwd` under
    /// AVX2) that the processor runs.
    pub fn pick(isa: Isa) -> Kernel {
        let want: &[Kernel] = match isa.checked() {
            Isa::Avx512 => &[Kernel::Vnni, Kernel::Avx2],
            Isa::Avx2 => &[Kernel::Avx2],
            Isa::Portable => &[],
        };
        want.iter()
            .copied()
            .find(|k| k.supported())
            .unwrap_or(Kernel::Portable)
    }

    /// Short name for logs and benchmark lines.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Portable => "portable",
            Kernel::Avx2 => "avx2",
            Kernel::Vnni => "avx512-vnni",
        }
    }

    /// `w · a` (see the module doc): `w` one row of `a.d.len()` blocks.
    /// Panics if `w` or `a.q` is shorter than that (a caller bug).
    pub fn dot(self, qt: QuantType, w: &[u8], a: ActsRow<'_>) -> f32 {
        let nb = a.d.len();
        assert!(w.len() >= nb * qt.block_bytes() && a.q.len() >= nb * QK && a.s.len() >= nb);
        let k = if self.supported() {
            self
        } else {
            Kernel::Portable
        };
        match (k, qt) {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the processor supports the path (checked above); the
            // lengths are asserted above.
            (Kernel::Avx2, QuantType::Q4_1) => unsafe { q4_1_avx2(w, a) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            (Kernel::Avx2, QuantType::Q8_0) => unsafe { q8_0_avx2(w, a) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            (Kernel::Vnni, QuantType::Q4_1) => unsafe { q4_1_vnni(w, a) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            (Kernel::Vnni, QuantType::Q8_0) => unsafe { q8_0_vnni(w, a) },
            _ => portable(qt, w, a),
        }
    }
}

/// Scalar reference: integer block sums, f32 across blocks.
fn portable(qt: QuantType, w: &[u8], a: ActsRow<'_>) -> f32 {
    let bb = qt.block_bytes();
    let mut acc = 0f32;
    for (b, wb) in w.chunks_exact(bb).take(a.d.len()).enumerate() {
        let dw = f16::from_le_bytes([wb[0], wb[1]]).to_f32();
        let qx = &a.q[b * QK..(b + 1) * QK];
        match qt {
            QuantType::Q8_0 => {
                let s: i32 = wb[2..]
                    .iter()
                    .zip(qx)
                    .map(|(&q, &x)| q as i8 as i32 * x as i32)
                    .sum();
                acc += dw * a.d[b] * s as f32;
            }
            QuantType::Q4_1 => {
                let m = f16::from_le_bytes([wb[2], wb[3]]).to_f32();
                let s: i32 = (0..QK / 2)
                    .map(|j| {
                        (wb[4 + j] & 15) as i32 * qx[j] as i32
                            + (wb[4 + j] >> 4) as i32 * qx[j + QK / 2] as i32
                    })
                    .sum();
                acc += dw * a.d[b] * s as f32 + m * a.s[b];
            }
        }
    }
    acc
}

/// `[d, m, 0, 0]` of the two f16 at `p`.
///
/// # Safety
/// F16C; 4 bytes readable at `p`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn two_f16(p: *const u8) -> std::arch::x86_64::__m128 {
    use std::arch::x86_64::*;
    // SAFETY: 4 bytes readable (caller).
    let raw = unsafe { std::ptr::read_unaligned(p as *const i32) };
    _mm_cvtph_ps(_mm_cvtsi32_si128(raw))
}

/// The f16 at `p`.
///
/// # Safety
/// F16C; 2 bytes readable at `p`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn one_f16(p: *const u8) -> f32 {
    use std::arch::x86_64::*;
    // SAFETY: 2 bytes readable (caller).
    let raw = unsafe { std::ptr::read_unaligned(p as *const u16) };
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(raw as i32)))
}

/// The low and high nibbles of the 16 bytes at `p` (elements 0..16 and
/// 16..32 of a Q4_1 block).
///
/// # Safety
/// AVX2; 16 bytes readable at `p`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn nibbles(p: *const u8) -> (std::arch::x86_64::__m128i, std::arch::x86_64::__m128i) {
    use std::arch::x86_64::*;
    let mask = _mm_set1_epi8(0x0f);
    // SAFETY: 16 bytes readable (caller).
    let bytes = unsafe { _mm_loadu_si128(p as *const __m128i) };
    (
        _mm_and_si128(bytes, mask),
        _mm_and_si128(_mm_srli_epi16::<4>(bytes), mask),
    )
}

/// # Safety
/// AVX2, FMA, F16C; `w` and `a` hold `a.d.len()` blocks (checked by
/// [`Kernel::dot`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_1_avx2(w: &[u8], a: ActsRow<'_>) -> f32 {
    use std::arch::x86_64::*;
    let nb = a.d.len();
    let (wp, xp) = (w.as_ptr(), a.q.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 2];
    let mut macc = 0f32;
    for b in 0..nb {
        // SAFETY: block b < nb is inside `w` and `a.q` (caller).
        unsafe {
            let wb = wp.add(b * 20);
            let dm = two_f16(wb);
            let (dw, mw) = (_mm_cvtss_f32(dm), _mm_cvtss_f32(_mm_movehdup_ps(dm)));
            let (lo, hi) = nibbles(wb.add(4));
            let x0 = _mm256_loadu_si256(xp.add(b * QK) as *const __m256i);
            let x1 = _mm256_loadu_si256(xp.add(b * QK + 16) as *const __m256i);
            let p = _mm256_add_epi32(
                _mm256_madd_epi16(_mm256_cvtepu8_epi16(lo), x0),
                _mm256_madd_epi16(_mm256_cvtepu8_epi16(hi), x1),
            );
            let s = _mm256_set1_ps(dw * a.d[b]);
            acc[b & 1] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(p), acc[b & 1]);
            macc += mw * a.s[b];
        }
    }
    crate::vector::hsum256(_mm256_add_ps(acc[0], acc[1])) + macc
}

/// # Safety
/// As [`q4_1_avx2`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_avx2(w: &[u8], a: ActsRow<'_>) -> f32 {
    use std::arch::x86_64::*;
    let nb = a.d.len();
    let (wp, xp) = (w.as_ptr(), a.q.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 2];
    for b in 0..nb {
        // SAFETY: block b < nb is inside `w` and `a.q` (caller).
        unsafe {
            let wb = wp.add(b * 34);
            let dw = one_f16(wb);
            let w0 = _mm_loadu_si128(wb.add(2) as *const __m128i);
            let w1 = _mm_loadu_si128(wb.add(18) as *const __m128i);
            let x0 = _mm256_loadu_si256(xp.add(b * QK) as *const __m256i);
            let x1 = _mm256_loadu_si256(xp.add(b * QK + 16) as *const __m256i);
            let p = _mm256_add_epi32(
                _mm256_madd_epi16(_mm256_cvtepi8_epi16(w0), x0),
                _mm256_madd_epi16(_mm256_cvtepi8_epi16(w1), x1),
            );
            let s = _mm256_set1_ps(dw * a.d[b]);
            acc[b & 1] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(p), acc[b & 1]);
        }
    }
    crate::vector::hsum256(_mm256_add_ps(acc[0], acc[1]))
}

/// # Safety
/// AVX2, FMA, F16C, AVX-512F, BW and VNNI; lengths as [`q4_1_avx2`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
unsafe fn q4_1_vnni(w: &[u8], a: ActsRow<'_>) -> f32 {
    use std::arch::x86_64::*;
    let nb = a.d.len();
    let (wp, xp) = (w.as_ptr(), a.q.as_ptr());
    let mut acc = [_mm512_setzero_ps(); 2];
    let mut macc = 0f32;
    for b in 0..nb {
        // SAFETY: block b < nb is inside `w` and `a.q` (caller).
        unsafe {
            let wb = wp.add(b * 20);
            let dm = two_f16(wb);
            let (dw, mw) = (_mm_cvtss_f32(dm), _mm_cvtss_f32(_mm_movehdup_ps(dm)));
            let (lo, hi) = nibbles(wb.add(4));
            let q = _mm512_cvtepu8_epi16(_mm256_set_m128i(hi, lo));
            let x = _mm512_loadu_si512(xp.add(b * QK) as *const _);
            let p = _mm512_dpwssd_epi32(_mm512_setzero_si512(), q, x);
            let s = _mm512_set1_ps(dw * a.d[b]);
            acc[b & 1] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(p), acc[b & 1]);
            macc += mw * a.s[b];
        }
    }
    _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1])) + macc
}

/// # Safety
/// As [`q4_1_vnni`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
unsafe fn q8_0_vnni(w: &[u8], a: ActsRow<'_>) -> f32 {
    use std::arch::x86_64::*;
    let nb = a.d.len();
    let (wp, xp) = (w.as_ptr(), a.q.as_ptr());
    let mut acc = [_mm512_setzero_ps(); 2];
    for b in 0..nb {
        // SAFETY: block b < nb is inside `w` and `a.q` (caller).
        unsafe {
            let wb = wp.add(b * 34);
            let dw = one_f16(wb);
            let q = _mm512_cvtepi8_epi16(_mm256_loadu_si256(wb.add(2) as *const __m256i));
            let x = _mm512_loadu_si512(xp.add(b * QK) as *const _);
            let p = _mm512_dpwssd_epi32(_mm512_setzero_si512(), q, x);
            let s = _mm512_set1_ps(dw * a.d[b]);
            acc[b & 1] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(p), acc[b & 1]);
        }
    }
    _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1]))
}
