//! The block dot products of [`super::matmul_quant`]: one weight row in
//! ggml blocks times one quantised activation row, per instruction set.
//!
//! Contract: [`Kernel::dot`] returns `Σ_b dw_b·dx_b·(Σ_j qw_j·qx_j)` (Q8_0)
//! plus `Σ_b m_b·sx_b` (Q4_1, and Q4_K per sub-block; Q4_K's and Q6_K's
//! kernels are in [`super::q4k`] and [`super::q6k`]), the integer sums
//! exact on every path (the
//! weights widened to i16, products of pairs summed in i32 by `vpmaddwd` or
//! `vpdpwssd`: a block's sum is at most `32·128·32767 < 2^31`), the f32
//! additions in an order that differs between paths. [`Kernel::pick`] chooses the best path
//! an [`Isa`] allows that the processor runs; [`Kernel::available`] lists
//! every one for tests.
//! Costs: one pass over the row's blocks, no allocation.
//!
//! One file on purpose: every block type's dot product for every instruction
//! set stands side by side, so the paths keep the same integer sums.

use super::{ActsRow, QK, QuantType, q4k, q6k};
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

    /// `w · a` (see the module doc): `w` one row of `a.ds.len()` blocks.
    /// Panics if `w` or `a.q` is shorter than that (a caller bug).
    pub fn dot(self, qt: QuantType, w: &[u8], a: ActsRow<'_>) -> f32 {
        let k = if self.supported() {
            self
        } else {
            Kernel::Portable
        };
        let mut y = [0f32];
        k.rows_supported(qt, w, a, &mut y);
        y[0]
    }

    /// [`Self::rows_supported`] for [`TILE`] activation rows at once
    /// (`ys[j][r] = w_r · a[j]`), bit for bit the same results; each
    /// block's weights are unpacked once for all of them. The portable path
    /// runs the rows one activation row at a time.
    pub(crate) fn tile_supported(
        self,
        qt: QuantType,
        w: &[u8],
        a: &[ActsRow<'_>; TILE],
        ys: &mut [&mut [f32]; TILE],
    ) {
        let (nb, rows) = (a[0].ds.len(), ys[0].len());
        assert!(nb.is_multiple_of(qt.block_len() / QK));
        assert!(a.iter().all(|a| a.group.is_multiple_of(qt.act_group())));
        assert!(w.len() >= rows * qt.matrix_bytes(1, nb * QK));
        assert!(
            a.iter()
                .all(|a| a.ds.len() == nb && a.sx.len() == nb && a.q.len() >= nb * QK)
        );
        assert!(ys.iter().all(|y| y.len() == rows));
        match (self, qt) {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the processor supports the path (the caller's
            // contract); the lengths are asserted above.
            (Kernel::Avx2, QuantType::Q4_K) => unsafe { q4k::rows_avx2(w, a, ys) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            (Kernel::Vnni, QuantType::Q4_K) => unsafe { q4k::rows_vnni(w, a, ys) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            (Kernel::Avx2, QuantType::Q6_K) => unsafe { q6k::rows_avx2(w, a, ys) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            (Kernel::Vnni, QuantType::Q6_K) => unsafe { q6k::rows_vnni(w, a, ys) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            (Kernel::Avx2, QuantType::Q4_1) => unsafe { q4_1_avx2_tile(w, a, ys) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            (Kernel::Avx2, QuantType::Q8_0) => unsafe { q8_0_avx2_tile(w, a, ys) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            (Kernel::Vnni, QuantType::Q4_1) => unsafe { q4_1_vnni_tile(w, a, ys) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            (Kernel::Vnni, QuantType::Q8_0) => unsafe { q8_0_vnni_tile(w, a, ys) },
            _ => {
                for (aj, y) in a.iter().zip(ys.iter_mut()) {
                    self.rows_supported(qt, w, *aj, y);
                }
            }
        }
    }

    /// `y[r] = w_r · a` for the `y.len()` rows of `a.ds.len()` blocks that
    /// `w` holds back to back, for a kernel known to be supported (from
    /// [`Self::pick`] or checked by the caller; an unsupported one would
    /// fault). The row loop runs inside the SIMD function (no call per row).
    pub(crate) fn rows_supported(self, qt: QuantType, w: &[u8], a: ActsRow<'_>, y: &mut [f32]) {
        let nb = a.ds.len();
        let rb = qt.matrix_bytes(1, nb * QK);
        assert!(nb.is_multiple_of(qt.block_len() / QK));
        assert!(
            a.group.is_multiple_of(qt.act_group()),
            "activations not grouped for {qt:?}"
        );
        assert!(w.len() >= y.len() * rb && a.q.len() >= nb * QK && a.sx.len() == nb);
        match (self, qt) {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the processor supports the path (the caller's
            // contract); the lengths are asserted above.
            (Kernel::Avx2, QuantType::Q4_K) => unsafe { q4k::rows_avx2(w, &[a], &mut [y]) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            (Kernel::Vnni, QuantType::Q4_K) => unsafe { q4k::rows_vnni(w, &[a], &mut [y]) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            (Kernel::Avx2, QuantType::Q6_K) => unsafe { q6k::rows_avx2(w, &[a], &mut [y]) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            (Kernel::Vnni, QuantType::Q6_K) => unsafe { q6k::rows_vnni(w, &[a], &mut [y]) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            (Kernel::Avx2, QuantType::Q4_1) => unsafe { q4_1_avx2(w, a, y) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            (Kernel::Avx2, QuantType::Q8_0) => unsafe { q8_0_avx2(w, a, y) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            (Kernel::Vnni, QuantType::Q4_1) => unsafe { q4_1_vnni(w, a, y) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            (Kernel::Vnni, QuantType::Q8_0) => unsafe { q8_0_vnni(w, a, y) },
            _ => {
                for (r, yr) in y.iter_mut().enumerate() {
                    *yr = portable(qt, &w[r * rb..(r + 1) * rb], a);
                }
            }
        }
    }
}

/// Scalar reference: integer block sums, f32 across blocks.
fn portable(qt: QuantType, w: &[u8], a: ActsRow<'_>) -> f32 {
    let f16_at = |b: &[u8], i: usize| f16::from_le_bytes([b[i], b[i + 1]]).to_f32();
    match qt {
        QuantType::Q4_K => q4k::dot_portable(w, a),
        QuantType::Q6_K => q6k::dot_portable(w, a),
        QuantType::Q8_0 => blocks_portable(w, a, qt.block_bytes(), |wb, qx, [dx, _]| {
            let s: i32 = wb[2..]
                .iter()
                .zip(qx)
                .map(|(&q, &x)| q as i8 as i32 * x as i32)
                .sum();
            f16_at(wb, 0) * dx * s as f32
        }),
        QuantType::Q4_1 => blocks_portable(w, a, qt.block_bytes(), |wb, qx, [dx, sx]| {
            let s: i32 = (0..QK / 2)
                .map(|j| {
                    (wb[4 + j] & 15) as i32 * qx[j] as i32
                        + (wb[4 + j] >> 4) as i32 * qx[j + QK / 2] as i32
                })
                .sum();
            f16_at(wb, 0) * dx * s as f32 + f16_at(wb, 2) * sx
        }),
    }
}

/// `Σ_b block(w_b, qx_b, [dx_b, sx_b])` over the blocks of [`QK`] (`bb`
/// bytes each) of one row, in order.
fn blocks_portable(
    w: &[u8],
    a: ActsRow<'_>,
    bb: usize,
    block: impl Fn(&[u8], &[i16], [f32; 2]) -> f32,
) -> f32 {
    let mut acc = 0f32;
    for (b, wb) in w.chunks_exact(bb).take(a.ds.len()).enumerate() {
        acc += block(wb, &a.q[b * QK..(b + 1) * QK], a.ds[b]);
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

/// The scales of block `b`: `[dw·dx, m·sx, 0, 0]` (Q4_1; `m·sx` is 0 for
/// Q8_0, whose `m` lane reads the first two weights: callers ignore it).
///
/// # Safety
/// F16C; the block's first 4 bytes readable at `wb`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn scales(wb: *const u8, ds: &[f32; 2]) -> std::arch::x86_64::__m128 {
    use std::arch::x86_64::*;
    // SAFETY: 4 bytes readable (caller); `ds` is 8 bytes.
    unsafe {
        let xs = _mm_castpd_ps(_mm_load_sd(ds.as_ptr() as *const f64));
        _mm_mul_ps(two_f16(wb), xs)
    }
}

/// The i32 lane sums of Q4_1 block `wb` times the 32 activations at `x`.
///
/// # Safety
/// AVX2; a whole block at `wb`, 32 values at `x`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn q4_1_sums_avx2(wb: *const u8, x: *const i16) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    // SAFETY: in bounds (caller).
    unsafe {
        let (lo, hi) = nibbles(wb.add(4));
        let x0 = _mm256_loadu_si256(x as *const __m256i);
        let x1 = _mm256_loadu_si256(x.add(16) as *const __m256i);
        _mm256_add_epi32(
            _mm256_madd_epi16(_mm256_cvtepu8_epi16(lo), x0),
            _mm256_madd_epi16(_mm256_cvtepu8_epi16(hi), x1),
        )
    }
}

/// The i32 lane sums of Q8_0 block `wb` times the 32 activations at `x`.
///
/// # Safety
/// AVX2; a whole block at `wb`, 32 values at `x`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn q8_0_sums_avx2(wb: *const u8, x: *const i16) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    // SAFETY: in bounds (caller).
    unsafe {
        let w0 = _mm_loadu_si128(wb.add(2) as *const __m128i);
        let w1 = _mm_loadu_si128(wb.add(18) as *const __m128i);
        let x0 = _mm256_loadu_si256(x as *const __m256i);
        let x1 = _mm256_loadu_si256(x.add(16) as *const __m256i);
        _mm256_add_epi32(
            _mm256_madd_epi16(_mm256_cvtepi8_epi16(w0), x0),
            _mm256_madd_epi16(_mm256_cvtepi8_epi16(w1), x1),
        )
    }
}

/// The i32 lane sums of Q4_1 block `wb` times the 32 activations at `x`.
///
/// # Safety
/// AVX-512F, BW, VNNI; a whole block at `wb`, 32 values at `x`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vnni")]
unsafe fn q4_1_sums_vnni(wb: *const u8, x: *const i16) -> std::arch::x86_64::__m512i {
    use std::arch::x86_64::*;
    // SAFETY: in bounds (caller).
    unsafe {
        let (lo, hi) = nibbles(wb.add(4));
        let q = _mm512_cvtepu8_epi16(_mm256_set_m128i(hi, lo));
        _mm512_dpwssd_epi32(_mm512_setzero_si512(), q, _mm512_loadu_si512(x as *const _))
    }
}

/// The i32 lane sums of Q8_0 block `wb` times the 32 activations at `x`.
///
/// # Safety
/// AVX-512F, BW, VNNI; a whole block at `wb`, 32 values at `x`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vnni")]
unsafe fn q8_0_sums_vnni(wb: *const u8, x: *const i16) -> std::arch::x86_64::__m512i {
    use std::arch::x86_64::*;
    // SAFETY: in bounds (caller).
    unsafe {
        let q = _mm512_cvtepi8_epi16(_mm256_loadu_si256(wb.add(2) as *const __m256i));
        _mm512_dpwssd_epi32(_mm512_setzero_si512(), q, _mm512_loadu_si512(x as *const _))
    }
}

/// One row's dot product over 8-lane vectors: two blocks per iteration into
/// independent accumulators (`$sums` gives a block's i32 lane sums; `$q41`
/// adds Q4_1's `m·sx` terms).
macro_rules! row_dot {
    ($w:expr, $a:expr, $bb:expr, $sums:ident, $zero:ident, $bcast:ident, $fma:ident, $cvt:ident, $add:ident, $hsum:expr, $q41:expr) => {{
        let (w, a) = ($w, $a);
        let nb = a.ds.len();
        let (wp, xp) = (w.as_ptr(), a.q.as_ptr());
        let (mut acc0, mut acc1) = ($zero(), $zero());
        let (mut m0, mut m1) = (_mm_setzero_ps(), _mm_setzero_ps());
        let mut b = 0;
        while b + 2 <= nb {
            // SAFETY: blocks b, b + 1 < nb are inside `w` and `a.q`
            // (Kernel::rows_supported asserts it).
            unsafe {
                let (w0, w1) = (wp.add(b * $bb), wp.add((b + 1) * $bb));
                let s0 = scales(w0, &a.ds[b]);
                let s1 = scales(w1, &a.ds[b + 1]);
                let p0 = $sums(w0, xp.add(b * QK));
                let p1 = $sums(w1, xp.add((b + 1) * QK));
                acc0 = $fma($bcast(s0), $cvt(p0), acc0);
                acc1 = $fma($bcast(s1), $cvt(p1), acc1);
                m0 = _mm_add_ps(m0, s0);
                m1 = _mm_add_ps(m1, s1);
            }
            b += 2;
        }
        if b < nb {
            // SAFETY: block b < nb is inside `w` and `a.q` (as above).
            unsafe {
                let w0 = wp.add(b * $bb);
                let s0 = scales(w0, &a.ds[b]);
                acc0 = $fma($bcast(s0), $cvt($sums(w0, xp.add(b * QK))), acc0);
                m0 = _mm_add_ps(m0, s0);
            }
        }
        let m = _mm_add_ps(m0, m1);
        let total = $hsum($add(acc0, acc1));
        if $q41 {
            total + _mm_cvtss_f32(_mm_movehdup_ps(m))
        } else {
            total
        }
    }};
}

macro_rules! row_fn {
    ($name:ident, $feat:literal, $bb:expr, $sums:ident, $zero:ident, $bcast:ident, $fma:ident, $cvt:ident, $add:ident, $hsum:expr, $q41:expr) => {
        /// # Safety
        /// The named target features; `w` holds `y.len()` rows and `a` one
        /// row of `a.ds.len()` blocks (checked by [`Kernel::rows_supported`]).
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $feat)]
        unsafe fn $name(w: &[u8], a: ActsRow<'_>, y: &mut [f32]) {
            use std::arch::x86_64::*;
            let rb = a.ds.len() * $bb;
            for (r, yr) in y.iter_mut().enumerate() {
                let wr = &w[r * rb..(r + 1) * rb];
                *yr = row_dot!(
                    wr, a, $bb, $sums, $zero, $bcast, $fma, $cvt, $add, $hsum, $q41
                );
            }
        }
    };
}

row_fn!(
    q4_1_avx2,
    "avx2,fma,f16c",
    20,
    q4_1_sums_avx2,
    _mm256_setzero_ps,
    _mm256_broadcastss_ps,
    _mm256_fmadd_ps,
    _mm256_cvtepi32_ps,
    _mm256_add_ps,
    crate::vector::hsum256,
    true
);
row_fn!(
    q8_0_avx2,
    "avx2,fma,f16c",
    34,
    q8_0_sums_avx2,
    _mm256_setzero_ps,
    _mm256_broadcastss_ps,
    _mm256_fmadd_ps,
    _mm256_cvtepi32_ps,
    _mm256_add_ps,
    crate::vector::hsum256,
    false
);
row_fn!(
    q4_1_vnni,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vnni",
    20,
    q4_1_sums_vnni,
    _mm512_setzero_ps,
    _mm512_broadcastss_ps,
    _mm512_fmadd_ps,
    _mm512_cvtepi32_ps,
    _mm512_add_ps,
    _mm512_reduce_add_ps,
    true
);
row_fn!(
    q8_0_vnni,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vnni",
    34,
    q8_0_sums_vnni,
    _mm512_setzero_ps,
    _mm512_broadcastss_ps,
    _mm512_fmadd_ps,
    _mm512_cvtepi32_ps,
    _mm512_add_ps,
    _mm512_reduce_add_ps,
    false
);

/// A Q4_1 block's 32 weights as two vectors of 16 i16 (AVX2).
///
/// # Safety
/// AVX2; a whole block at `wb`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn q4_1_unpack_avx2(
    wb: *const u8,
) -> (std::arch::x86_64::__m256i, std::arch::x86_64::__m256i) {
    use std::arch::x86_64::*;
    // SAFETY: in bounds (caller).
    let (lo, hi) = unsafe { nibbles(wb.add(4)) };
    (_mm256_cvtepu8_epi16(lo), _mm256_cvtepu8_epi16(hi))
}

/// A Q8_0 block's 32 weights as two vectors of 16 i16 (AVX2).
///
/// # Safety
/// AVX2; a whole block at `wb`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn q8_0_unpack_avx2(
    wb: *const u8,
) -> (std::arch::x86_64::__m256i, std::arch::x86_64::__m256i) {
    use std::arch::x86_64::*;
    // SAFETY: in bounds (caller).
    unsafe {
        (
            _mm256_cvtepi8_epi16(_mm_loadu_si128(wb.add(2) as *const __m128i)),
            _mm256_cvtepi8_epi16(_mm_loadu_si128(wb.add(18) as *const __m128i)),
        )
    }
}

/// The i32 lane sums of unpacked weights `q` times the 32 activations at
/// `x` (AVX2): what `q*_sums_avx2` computes.
///
/// # Safety
/// AVX2; 32 values at `x`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn mul_avx2(
    q: (std::arch::x86_64::__m256i, std::arch::x86_64::__m256i),
    x: *const i16,
) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    // SAFETY: in bounds (caller).
    unsafe {
        let x0 = _mm256_loadu_si256(x as *const __m256i);
        let x1 = _mm256_loadu_si256(x.add(16) as *const __m256i);
        _mm256_add_epi32(_mm256_madd_epi16(q.0, x0), _mm256_madd_epi16(q.1, x1))
    }
}

/// A Q4_1 block's 32 weights as one vector of 32 i16 (AVX-512).
///
/// # Safety
/// AVX-512F, BW; a whole block at `wb`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw")]
pub(super) unsafe fn q4_1_unpack_vnni(wb: *const u8) -> std::arch::x86_64::__m512i {
    use std::arch::x86_64::*;
    // SAFETY: in bounds (caller).
    let (lo, hi) = unsafe { nibbles(wb.add(4)) };
    _mm512_cvtepu8_epi16(_mm256_set_m128i(hi, lo))
}

/// A Q8_0 block's 32 weights as one vector of 32 i16 (AVX-512).
///
/// # Safety
/// AVX-512F, BW; a whole block at `wb`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw")]
pub(super) unsafe fn q8_0_unpack_vnni(wb: *const u8) -> std::arch::x86_64::__m512i {
    use std::arch::x86_64::*;
    // SAFETY: in bounds (caller).
    unsafe { _mm512_cvtepi8_epi16(_mm256_loadu_si256(wb.add(2) as *const __m256i)) }
}

/// The i32 lane sums of unpacked weights `q` times the 32 activations at
/// `x` (AVX-512 VNNI): what `q*_sums_vnni` computes.
///
/// # Safety
/// AVX-512F, BW, VNNI; 32 values at `x`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn mul_vnni(
    q: std::arch::x86_64::__m512i,
    x: *const i16,
) -> std::arch::x86_64::__m512i {
    use std::arch::x86_64::*;
    // SAFETY: in bounds (caller).
    unsafe { _mm512_dpwssd_epi32(_mm512_setzero_si512(), q, _mm512_loadu_si512(x as *const _)) }
}

/// [`row_dot`] for [`TILE`] activation rows at once, each block's weights
/// unpacked once: every token's accumulators, their block order and their
/// final sum are exactly [`row_dot`]'s, so results are bit for bit those of
/// one token at a time (a sequence's logits do not depend on its batch).
macro_rules! tile_dot {
    ($w:expr, $a:expr, $bb:expr, $unpack:ident, $mul:ident, $zero:ident, $bcast:ident, $fma:ident, $cvt:ident, $add:ident, $hsum:expr, $q41:expr) => {{
        let (w, a): (&[u8], &[ActsRow<'_>; TILE]) = ($w, $a);
        let nb = a[0].ds.len();
        let wp = w.as_ptr();
        let mut acc = [[$zero(); 2]; TILE];
        let mut m = [[_mm_setzero_ps(); 2]; TILE];
        for b in 0..nb {
            // SAFETY: block b < nb is inside `w` and every `a[j].q`
            // (Kernel::tile_supported asserts it).
            unsafe {
                let wb = wp.add(b * $bb);
                let q = $unpack(wb);
                for j in 0..TILE {
                    let s = scales(wb, &a[j].ds[b]);
                    let p = $mul(q, a[j].q.as_ptr().add(b * QK));
                    acc[j][b & 1] = $fma($bcast(s), $cvt(p), acc[j][b & 1]);
                    m[j][b & 1] = _mm_add_ps(m[j][b & 1], s);
                }
            }
        }
        let mut out = [0f32; TILE];
        for j in 0..TILE {
            let mm = _mm_add_ps(m[j][0], m[j][1]);
            let total = $hsum($add(acc[j][0], acc[j][1]));
            out[j] = if $q41 {
                total + _mm_cvtss_f32(_mm_movehdup_ps(mm))
            } else {
                total
            };
        }
        out
    }};
}

/// Activation rows one [`Kernel::tile_supported`] call covers.
pub(crate) const TILE: usize = 4;

macro_rules! tile_fn {
    ($name:ident, $feat:literal, $bb:expr, $unpack:ident, $mul:ident, $zero:ident, $bcast:ident, $fma:ident, $cvt:ident, $add:ident, $hsum:expr, $q41:expr) => {
        /// # Safety
        /// The named target features; `w` holds `ys[0].len()` rows of
        /// `a[0].ds.len()` blocks, every `a[j]` that many blocks and every
        /// `ys[j]` the same length (checked by [`Kernel::tile_supported`]).
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $feat)]
        unsafe fn $name(w: &[u8], a: &[ActsRow<'_>; TILE], ys: &mut [&mut [f32]; TILE]) {
            use std::arch::x86_64::*;
            let rb = a[0].ds.len() * $bb;
            for r in 0..ys[0].len() {
                let wr = &w[r * rb..(r + 1) * rb];
                let out = tile_dot!(
                    wr, a, $bb, $unpack, $mul, $zero, $bcast, $fma, $cvt, $add, $hsum, $q41
                );
                for (y, v) in ys.iter_mut().zip(out) {
                    y[r] = v;
                }
            }
        }
    };
}

tile_fn!(
    q4_1_avx2_tile,
    "avx2,fma,f16c",
    20,
    q4_1_unpack_avx2,
    mul_avx2,
    _mm256_setzero_ps,
    _mm256_broadcastss_ps,
    _mm256_fmadd_ps,
    _mm256_cvtepi32_ps,
    _mm256_add_ps,
    crate::vector::hsum256,
    true
);
tile_fn!(
    q8_0_avx2_tile,
    "avx2,fma,f16c",
    34,
    q8_0_unpack_avx2,
    mul_avx2,
    _mm256_setzero_ps,
    _mm256_broadcastss_ps,
    _mm256_fmadd_ps,
    _mm256_cvtepi32_ps,
    _mm256_add_ps,
    crate::vector::hsum256,
    false
);
tile_fn!(
    q4_1_vnni_tile,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vnni",
    20,
    q4_1_unpack_vnni,
    mul_vnni,
    _mm512_setzero_ps,
    _mm512_broadcastss_ps,
    _mm512_fmadd_ps,
    _mm512_cvtepi32_ps,
    _mm512_add_ps,
    _mm512_reduce_add_ps,
    true
);
tile_fn!(
    q8_0_vnni_tile,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vnni",
    34,
    q8_0_unpack_vnni,
    mul_vnni,
    _mm512_setzero_ps,
    _mm512_broadcastss_ps,
    _mm512_fmadd_ps,
    _mm512_cvtepi32_ps,
    _mm512_add_ps,
    _mm512_reduce_add_ps,
    false
);
