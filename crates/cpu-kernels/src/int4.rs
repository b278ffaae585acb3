//! `y = x @ W^T` for group-wise 4-bit weights (AWQ / GPTQ /
//! compressed-tensors W4A16, `checkpoint::int4`) and f32 activations.
//!
//! Contract: [`Int4Matrix`] is the stored layout, borrowed: `[rows,
//! cols]` codes in nibble blocks of [`BLOCK`] (byte `j` of a block holds
//! code `j` low and code `j + 16` high), a scale and a zero per `group`
//! columns of a row, and optionally the stored columns' input columns
//! (`perm`: the product reads `x[perm[c]]` for stored column `c`). Every
//! weight is widened exactly as the checkpoint's reference does, `w = (q -
//! zero) * scale` in f32 (one rounding), by the processor's widest path
//! ([`Isa`]: AVX-512F, AVX2, portable; all give the same bits), into a
//! per-task buffer of [`ROW_CHUNK`] rows; then:
//! - fewer than [`GEMM_MIN_TOKENS`] tokens (decode): each row's dot with
//!   each token ([`crate::vector::dot`]); a token's bits do not depend on
//!   the other tokens or on the split over threads;
//! - from [`GEMM_MIN_TOKENS`] on (prompts): the `gemm` crate's f32 kernels
//!   over the widened rows for all tokens at once, the rows once per call.
//!
//! So the result is the product over the dequantised weights, differing
//! from the plain reference only in the order of the additions.
//!
//! Costs: one widening per weight per call (a pass over 0.5 byte per
//! weight, the widened rows staying in cache), `T * rows * cols`
//! multiply-adds; tasks of [`ROW_CHUNK`] rows on rayon (the calling
//! thread for small products); `T * cols` floats of gather with `perm`.

use crate::OutPtr;
use crate::isa::Isa;
use rayon::prelude::*;

/// Codes per nibble block (16 bytes).
pub const BLOCK: usize = 32;
/// Weight rows widened per task.
pub const ROW_CHUNK: usize = 32;
/// From this many tokens on, the widened rows go through `gemm`.
pub const GEMM_MIN_TOKENS: usize = 16;
/// Below this many multiply-adds a product runs on the calling thread.
const PARALLEL_MIN_WORK: usize = 1 << 16;

/// Group-wise 4-bit weights, borrowed (see the module doc).
#[derive(Clone, Copy, Debug)]
pub struct Int4Matrix<'a> {
    pub rows: usize,
    pub cols: usize,
    /// Columns per scale and zero (a multiple of [`BLOCK`] dividing `cols`).
    pub group: usize,
    pub data: &'a [u8],          // [rows, cols / 2]
    pub scale: &'a [f32],        // [rows, cols / group]
    pub zero: &'a [u8],          // [rows, cols / group]
    pub perm: Option<&'a [u32]>, // [cols]
}

impl Int4Matrix<'_> {
    /// Panics unless the slices make the layout (a caller bug: the
    /// checkpoint checked it at load).
    fn assert_layout(&self) {
        let (n, k, g) = (self.rows, self.cols, self.group);
        assert!(k.is_multiple_of(BLOCK) && g > 0 && g.is_multiple_of(BLOCK) && k.is_multiple_of(g));
        assert_eq!(self.data.len(), n * k / 2, "codes are not [{n}, {k}]");
        assert_eq!(
            self.scale.len(),
            n * (k / g),
            "scales are not [{n}, {}]",
            k / g
        );
        assert_eq!(
            self.zero.len(),
            n * (k / g),
            "zeros are not [{n}, {}]",
            k / g
        );
        assert!(self.perm.is_none_or(|p| p.len() == k), "perm is not [{k}]");
    }

    /// Row `r` widened into `out` (`[cols]`).
    pub fn widen_row(&self, isa: Isa, r: usize, out: &mut [f32]) {
        let (k, groups) = (self.cols, self.cols / self.group);
        let codes = &self.data[r * k / 2..][..k / 2];
        for (b, (bytes, dst)) in codes
            .chunks_exact(BLOCK / 2)
            .zip(out.chunks_exact_mut(BLOCK))
            .enumerate()
        {
            let g = r * groups + b * BLOCK / self.group;
            widen_block(isa, bytes, self.zero[g], self.scale[g], dst);
        }
    }
}

/// Reused buffers of [`matmul_int4`].
#[derive(Default)]
pub struct Int4Scratch {
    /// `[T, cols]` the activations in stored column order (with `perm`).
    gathered: Vec<f32>,
}

/// `y = x @ W^T`: `x` `[T, cols]` (input column order), `y` `[T, rows]`.
/// Panics if the lengths disagree (a caller bug).
pub fn matmul_int4(isa: Isa, x: &[f32], w: &Int4Matrix<'_>, y: &mut [f32], s: &mut Int4Scratch) {
    w.assert_layout();
    let (k, n) = (w.cols, w.rows);
    assert!(x.len().is_multiple_of(k), "x is not [T, {k}]");
    let t = x.len() / k;
    assert_eq!(y.len(), t * n, "y is not [{t}, {n}]");
    if t == 0 || n == 0 {
        return;
    }
    let x = match w.perm {
        Some(p) => {
            s.gathered.clear();
            for row in x.chunks_exact(k) {
                s.gathered.extend(p.iter().map(|&i| row[i as usize]));
            }
            &s.gathered[..]
        }
        None => x,
    };
    let isa = isa.checked();
    let out = OutPtr(y.as_mut_ptr());
    let task = |buf: &mut Vec<f32>, r0: usize| {
        let rows = ROW_CHUNK.min(n - r0);
        buf.resize(rows * k, 0.0);
        for (i, dst) in buf.chunks_exact_mut(k).enumerate() {
            w.widen_row(isa, r0 + i, dst);
        }
        // SAFETY: this task alone writes columns r0..r0 + rows of every
        // row of `y` ([t, n], borrowed mutably by this call), in bounds.
        unsafe { product(isa, x, t, buf, k, rows, out.get().add(r0), n) };
    };
    let starts = (0..n).step_by(ROW_CHUNK);
    if t * n * k < PARALLEL_MIN_WORK {
        let mut buf = Vec::new();
        starts.for_each(|r0| task(&mut buf, r0));
    } else {
        starts
            .collect::<Vec<_>>()
            .into_par_iter()
            .for_each_init(Vec::new, |buf, r0| task(buf, r0));
    }
}

/// `y[i][j] = x[i] · w[j]` for `t` tokens and `rows` widened rows of `k`,
/// `y` at row stride `stride`.
///
/// # Safety
/// `y` must be valid for writes at `i * stride + j` for every `i < t`,
/// `j < rows`, and no other thread may touch those elements meanwhile.
#[allow(clippy::too_many_arguments)]
unsafe fn product(
    isa: Isa,
    x: &[f32],
    t: usize,
    w: &[f32],
    k: usize,
    rows: usize,
    y: *mut f32,
    stride: usize,
) {
    if t >= GEMM_MIN_TOKENS {
        // SAFETY: dst y [t, rows] at row stride `stride` (the caller's
        // contract); lhs x [t, k] row-major; rhs W^T [k, rows] read from the
        // widened rows w [rows, k] (row stride 1, column stride k): every
        // index gemm forms is inside its buffer.
        unsafe {
            gemm::gemm(
                t,
                rows,
                k,
                y,
                1,
                stride as isize,
                false,
                x.as_ptr(),
                1,
                k as isize,
                w.as_ptr(),
                k as isize,
                1,
                0.0,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::None,
            );
        }
        return;
    }
    for (j, wr) in w.chunks_exact(k).enumerate() {
        for (i, xr) in x.chunks_exact(k).enumerate() {
            // SAFETY: i < t, j < rows: in the caller's bounds.
            unsafe { *y.add(i * stride + j) = crate::vector::dot(isa, wr, xr) };
        }
    }
}

/// One nibble block (16 bytes, 32 codes) widened: `out[j] = (q_j - zero) * scale`.
pub fn widen_block(isa: Isa, bytes: &[u8], zero: u8, scale: f32, out: &mut [f32]) {
    assert!(
        bytes.len() == BLOCK / 2 && out.len() == BLOCK,
        "a block is 16 bytes, 32 values"
    );
    match isa.checked() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the processor supports AVX-512F (Isa::checked); lengths asserted.
        Isa::Avx512 => unsafe { widen_avx512(bytes, zero, scale, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the processor supports AVX2 (Isa::checked); lengths asserted.
        Isa::Avx2 => unsafe { widen_avx2(bytes, zero, scale, out) },
        _ => widen_portable(bytes, zero, scale, out),
    }
}

fn widen_portable(bytes: &[u8], zero: u8, scale: f32, out: &mut [f32]) {
    let z = f32::from(zero);
    let (lo, hi) = out.split_at_mut(BLOCK / 2);
    for ((b, l), h) in bytes.iter().zip(lo).zip(hi) {
        *l = (f32::from(b & 0xF) - z) * scale;
        *h = (f32::from(b >> 4) - z) * scale;
    }
}

/// # Safety
/// The processor must support AVX-512F; `bytes` is 16 bytes, `out` 32 values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn widen_avx512(bytes: &[u8], zero: u8, scale: f32, out: &mut [f32]) {
    use std::arch::x86_64::*;
    // SAFETY: 16 bytes read, 32 floats written (the caller's lengths).
    unsafe {
        let raw = _mm_loadu_si128(bytes.as_ptr().cast());
        let mask = _mm_set1_epi8(0x0F);
        let lo = _mm_and_si128(raw, mask);
        let hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
        let (z, s) = (_mm512_set1_epi32(i32::from(zero)), _mm512_set1_ps(scale));
        let wide = |v| {
            _mm512_mul_ps(
                _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_cvtepu8_epi32(v), z)),
                s,
            )
        };
        _mm512_storeu_ps(out.as_mut_ptr(), wide(lo));
        _mm512_storeu_ps(out.as_mut_ptr().add(16), wide(hi));
    }
}

/// # Safety
/// The processor must support AVX2; `bytes` is 16 bytes, `out` 32 values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn widen_avx2(bytes: &[u8], zero: u8, scale: f32, out: &mut [f32]) {
    use std::arch::x86_64::*;
    // SAFETY: 16 bytes read, 32 floats written (the caller's lengths).
    unsafe {
        let raw = _mm_loadu_si128(bytes.as_ptr().cast());
        let mask = _mm_set1_epi8(0x0F);
        let lo = _mm_and_si128(raw, mask);
        let hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
        let (z, s) = (_mm256_set1_epi32(i32::from(zero)), _mm256_set1_ps(scale));
        let wide = |v| {
            _mm256_mul_ps(
                _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(v), z)),
                s,
            )
        };
        let p = out.as_mut_ptr();
        _mm256_storeu_ps(p, wide(lo));
        _mm256_storeu_ps(p.add(8), wide(_mm_srli_si128(lo, 8)));
        _mm256_storeu_ps(p.add(16), wide(hi));
        _mm256_storeu_ps(p.add(24), wide(_mm_srli_si128(hi, 8)));
    }
}

#[cfg(test)]
mod tests;
