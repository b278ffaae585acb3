//! Attention's inner loops over K/V rows in their stored type: f32, BF16,
//! or FP8 e4m3 with a scale, widened in registers as they are read (no
//! widened copy of the cache), for all query heads of one KV head at once
//! (GQA: each key and value row is read once per KV head, not once per
//! query head).
//!
//! Contract: a [`Row`] widens to what `ops::kv` reads it back as (BF16
//! exactly; FP8 `decode(byte) * scale`, one rounding): [`widen`]. Scores
//! ([`dot_keys_rows`]) are each query's [`crate::vector::dot_keys`] over
//! the widened keys, bit for bit (on AVX-512 the GEMM's fused chain, so a
//! decode token's scores equal the ones it gets inside a prefill chunk, whose
//! keys are widened by [`widen`]); [`pv_rows`] adds `p[h][j] * value(j)`
//! into each head's output in `j` order (the same sums as
//! [`crate::vector::axpy`] per key).
//!
//! Costs: one read of each row per call, O(rows * heads * len)
//! multiply-adds; no allocation once the caller's scratch has grown.
//!
//! FP8 in registers: an e4m3 byte `s eeee mmm` moved to the bits of an
//! IEEE half as `s 0eeee mmm0000000` is its value times 2^-8 exactly
//! (subnormals included), so the AVX-512 path widens 16 bytes with one
//! half-to-float conversion and multiplies by `256 * scale`.

use crate::isa::Isa;
use crate::vector::{axpy, dot_keys};

/// One K or V row (or a run of one) in its stored type.
#[derive(Debug, Clone, Copy)]
pub enum Row<'a> {
    F32(&'a [f32]),
    /// BF16 bits.
    Bf16(&'a [u16]),
    /// e4m3 bytes and their scale.
    Fp8(&'a [u8], f32),
}

impl Row<'_> {
    /// Elements held.
    pub fn len(&self) -> usize {
        match self {
            Row::F32(r) => r.len(),
            Row::Bf16(r) => r.len(),
            Row::Fp8(r, _) => r.len(),
        }
    }

    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Its first byte and its length in bytes.
    fn bytes(&self) -> (*const u8, usize) {
        match self {
            Row::F32(r) => (r.as_ptr().cast(), r.len() * 4),
            Row::Bf16(r) => (r.as_ptr().cast(), r.len() * 2),
            Row::Fp8(r, _) => (r.as_ptr(), r.len()),
        }
    }
}

/// Rows the AVX-512 loops request ahead of the one they read: the cache
/// rows decode reads come from memory (each row a few cache lines, rows
/// strided by the KV width), and the hardware prefetcher alone leaves the
/// loops waiting on them.
const ROWS_AHEAD: usize = 16;

/// Asks for the cache lines of `row`'s first `len` elements.
#[cfg(target_arch = "x86_64")]
#[inline]
fn prefetch_row(row: Row<'_>, len: usize) {
    use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
    let (p, bytes) = row.bytes();
    let bytes = bytes.min(len * (bytes / row.len().max(1)));
    for at in (0..bytes).step_by(64) {
        // SAFETY: a prefetch never faults; the address lies inside the row.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(at).cast()) };
    }
}

/// The 256 e4m3 values (exact), for the portable widening.
fn e4m3_table() -> &'static [f32; 256] {
    static TABLE: std::sync::OnceLock<[f32; 256]> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        std::array::from_fn(|b| {
            // half bits of the byte (see the module doc), times 2^8
            let h = (((b & 0x80) << 8) | ((b & 0x7f) << 7)) as u16;
            half::f16::from_bits(h).to_f32() * 256.0
        })
    })
}

/// `out[i]` = element `i` of `row` widened (`out.len()` elements).
pub fn widen(isa: Isa, row: Row<'_>, out: &mut [f32]) {
    let n = out.len();
    match row {
        Row::F32(r) => out.copy_from_slice(&r[..n]),
        Row::Bf16(r) => {
            for (o, &b) in out.iter_mut().zip(&r[..n]) {
                *o = f32::from_bits(u32::from(b) << 16);
            }
        }
        Row::Fp8(r, scale) => {
            #[cfg(target_arch = "x86_64")]
            if isa.checked() == Isa::Avx512 && n.is_multiple_of(16) {
                for (o, b) in out.chunks_exact_mut(16).zip(r[..n].chunks_exact(16)) {
                    // SAFETY: AVX-512F (Isa::checked); 16 bytes in, 16 floats out.
                    unsafe { widen_fp8_16(b, scale, o) };
                }
                return;
            }
            let _ = isa;
            let t = e4m3_table();
            for (o, &b) in out.iter_mut().zip(&r[..n]) {
                *o = t[b as usize] * scale;
            }
        }
    }
}

/// # Safety
/// AVX-512F; `b` and `out` hold at least 16 elements.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn widen_fp8_16(b: &[u8], scale: f32, out: &mut [f32]) {
    use std::arch::x86_64::*;
    // SAFETY: 16 readable bytes, 16 writable floats (the contract).
    unsafe {
        let v = load_fp8_16(b.as_ptr(), _mm512_set1_ps(scale * 256.0));
        _mm512_storeu_ps(out.as_mut_ptr(), v);
    }
}

/// 16 e4m3 bytes at `p` widened and multiplied by `mul` (`256 * scale`).
///
/// # Safety
/// AVX-512F; 16 readable bytes at `p`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn load_fp8_16(p: *const u8, mul: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    // SAFETY: 16 readable bytes (the contract).
    let bytes = unsafe { _mm_loadu_si128(p.cast()) };
    let w = _mm256_cvtepu8_epi16(bytes);
    let sign = _mm256_slli_epi16::<8>(_mm256_and_si256(w, _mm256_set1_epi16(0x80)));
    let rest = _mm256_slli_epi16::<7>(_mm256_and_si256(w, _mm256_set1_epi16(0x7f)));
    let h = _mm256_or_si256(sign, rest);
    _mm512_mul_ps(_mm512_cvtph_ps(h), mul)
}

/// Elements `at..at + 16` of `row` widened.
///
/// # Safety
/// AVX-512F; `at + 16 <= row.len()`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn load_16(row: Row<'_>, at: usize) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    // SAFETY: 16 elements from `at` (the contract).
    unsafe {
        match row {
            Row::F32(r) => _mm512_loadu_ps(r.as_ptr().add(at)),
            Row::Bf16(r) => load_bf16_16(r.as_ptr().add(at)),
            Row::Fp8(r, s) => load_fp8_16(r.as_ptr().add(at), _mm512_set1_ps(s * 256.0)),
        }
    }
}

/// 16 BF16 values at `p` widened.
///
/// # Safety
/// AVX-512F; 16 readable `u16` at `p`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn load_bf16_16(p: *const u16) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    // SAFETY: 16 readable u16 (the contract).
    let w = unsafe { _mm256_loadu_si256(p.cast()) };
    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(w)))
}

/// Scores of `heads` queries against `n` keys: `out[h * n + j] = qs[h] ·
/// key(j)` with `qs` `[heads, d]` (`d = qs.len() / heads`) and each key
/// `d` elements; `scratch` holds the widened keys (grown as needed).
pub fn dot_keys_rows<'a>(
    isa: Isa,
    qs: &[f32],
    heads: usize,
    key: impl Fn(usize) -> Row<'a>,
    n: usize,
    out: &mut [f32],
    scratch: &mut Vec<f32>,
) {
    let d = qs.len() / heads.max(1);
    #[cfg(target_arch = "x86_64")]
    if isa.checked() == Isa::Avx512 && d.is_multiple_of(16) && heads <= MAX_GROUP {
        for j0 in (0..n).step_by(16) {
            let m = 16.min(n - j0);
            for j in j0 + ROWS_AHEAD..(j0 + ROWS_AHEAD + 16).min(n) {
                prefetch_row(key(j), d);
            }
            let keys: [Option<Row<'a>>; 16] = std::array::from_fn(|i| (i < m).then(|| key(j0 + i)));
            assert!(
                keys.iter().flatten().all(|k| k.len() >= d),
                "a key shorter than the queries"
            );
            // SAFETY: AVX-512F (Isa::checked); every present key holds d
            // values (asserted); `out` holds heads * n values.
            unsafe { dot_group_avx512(qs, heads, d, &keys, n, j0, out) };
        }
        return;
    }
    if let Some(f) = all_f32(&key, n) {
        for (q, o) in qs.chunks_exact(d).zip(out.chunks_exact_mut(n)) {
            dot_keys(isa, q, &f, o);
        }
        return;
    }
    // 16 keys at a time widened, then each query's chain over them
    const STEP: usize = 16;
    if scratch.len() < STEP * d {
        scratch.resize(STEP * d, 0.0);
    }
    for j0 in (0..n).step_by(STEP) {
        let m = STEP.min(n - j0);
        for (i, w) in scratch[..m * d].chunks_exact_mut(d).enumerate() {
            widen(isa, key(j0 + i), w);
        }
        let wide = &scratch[..m * d];
        for (q, o) in qs.chunks_exact(d).zip(out.chunks_exact_mut(n)) {
            dot_keys(isa, q, |i| &wide[i * d..(i + 1) * d], &mut o[j0..j0 + m]);
        }
    }
}

/// Most query heads per KV head the fused AVX-512 scores take at once.
const MAX_GROUP: usize = 16;

/// Scores of up to 16 keys (`keys`, from key `j0`) for every query head:
/// each 16 values of the keys loaded widened and transposed once, then
/// each head's fused chain over them ([`dot_keys`]' arithmetic, bit for bit).
///
/// # Safety
/// AVX-512F; `heads <= MAX_GROUP`; `qs` `heads * d` values, `d` a
/// multiple of 16; each present key at least `d` values; `out` `heads * n`
/// values with `j0 + present keys <= n`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn dot_group_avx512(
    qs: &[f32],
    heads: usize,
    d: usize,
    keys: &[Option<Row<'_>>; 16],
    n: usize,
    j0: usize,
    out: &mut [f32],
) {
    use std::arch::x86_64::*;
    let mut acc = [_mm512_setzero_ps(); MAX_GROUP];
    let mut r = [_mm512_setzero_ps(); 16];
    for k0 in (0..d).step_by(16) {
        for (v, k) in r.iter_mut().zip(keys) {
            *v = match k {
                None => _mm512_setzero_ps(),
                // SAFETY: k0 + 16 <= d <= the key's length (the contract).
                Some(row) => unsafe { load_16(*row, k0) },
            };
        }
        // SAFETY: AVX-512F (this function's contract).
        unsafe { crate::gemm512::transpose16(&mut r) };
        for (h, a) in acc.iter_mut().enumerate().take(heads) {
            let q = &qs[h * d + k0..h * d + k0 + 16];
            for (kk, v) in r.iter().enumerate() {
                *a = _mm512_fmadd_ps(_mm512_set1_ps(q[kk]), *v, *a);
            }
        }
    }
    let m = keys.iter().flatten().count();
    let mut lanes = [0f32; 16];
    for (h, a) in acc.iter().enumerate().take(heads) {
        // SAFETY: 16 writable values.
        unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), *a) };
        out[h * n + j0..h * n + j0 + m].copy_from_slice(&lanes[..m]);
    }
}

/// The f32 rows of `key(0..n)` when they all are f32.
fn all_f32<'a>(key: &impl Fn(usize) -> Row<'a>, n: usize) -> Option<impl Fn(usize) -> &'a [f32]> {
    match n.checked_sub(1).map(key) {
        None | Some(Row::F32(_)) => Some(move |j: usize| match key(j) {
            Row::F32(r) => r,
            _ => &[][..],
        }),
        _ => None,
    }
}

/// `out[h] += sum over j of p[h * n + j] * value(j)` for `heads` outputs
/// of `d` values each (`out` `[heads, d]`), `j` in order.
pub fn pv_rows<'a>(
    isa: Isa,
    p: &[f32],
    heads: usize,
    value: impl Fn(usize) -> Row<'a>,
    n: usize,
    out: &mut [f32],
    scratch: &mut Vec<f32>,
) {
    let d = out.len() / heads.max(1);
    #[cfg(target_arch = "x86_64")]
    if isa.checked() == Isa::Avx512 && d.is_multiple_of(16) {
        macro_rules! blocked {
            ($(($h:literal, $c:literal)),*) => {
                match (heads, d / 16) {
                    $(($h, $c) => {
                        // SAFETY: AVX-512F (Isa::checked); `out` holds
                        // $h * $c * 16 values, `p` heads * n.
                        unsafe { pv_block_avx512::<$h, $c>(p, n, &value, out) };
                        return;
                    })*
                    _ => {}
                }
            };
        }
        blocked!(
            (1, 4),
            (2, 4),
            (3, 4),
            (4, 4),
            (5, 4),
            (6, 4),
            (1, 8),
            (2, 8),
            (3, 8)
        );
        for j in 0..n {
            let row = value(j);
            assert!(row.len() >= d, "a value row shorter than the output");
            // SAFETY: AVX-512F (Isa::checked); the row holds d elements
            // (asserted), `out` heads * d, `p` heads * n.
            unsafe { pv_one_avx512(p, n, j, heads, row, d, out) };
        }
        return;
    }
    if scratch.len() < d {
        scratch.resize(d, 0.0);
    }
    let wide = &mut scratch[..d];
    for j in 0..n {
        let v: &[f32] = match value(j) {
            Row::F32(r) => r,
            other => {
                widen(isa, other, wide);
                wide
            }
        };
        for (h, o) in out.chunks_exact_mut(d).enumerate() {
            axpy(isa, o, p[h * n + j], v);
        }
    }
}

/// [`pv_rows`] for `H` heads of `C * 16` values with the outputs held in
/// registers across all `n` rows: per output element the same fused
/// multiply-adds in the same `j` order as [`pv_one_avx512`], so the same
/// bits, without a load and a store of the output per row.
///
/// # Safety
/// AVX-512F; `out` holds `H * C * 16` values, `p` `H * n`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::needless_range_loop)] // j and c index several arrays in step
unsafe fn pv_block_avx512<'a, const H: usize, const C: usize>(
    p: &[f32],
    n: usize,
    value: &impl Fn(usize) -> Row<'a>,
    out: &mut [f32],
) {
    use std::arch::x86_64::*;
    let d = C * 16;
    let mut acc = [[_mm512_setzero_ps(); C]; H];
    for (h, a) in acc.iter_mut().enumerate() {
        for (c, v) in a.iter_mut().enumerate() {
            // SAFETY: h * d + c * 16 + 16 <= H * d = out.len() (the contract).
            *v = unsafe { _mm512_loadu_ps(out.as_ptr().add(h * d + c * 16)) };
        }
    }
    let ps: [&[f32]; H] = std::array::from_fn(|h| &p[h * n..(h + 1) * n]);
    for j in 0..n {
        if j + ROWS_AHEAD < n {
            prefetch_row(value(j + ROWS_AHEAD), d);
        }
        let row = value(j);
        assert!(row.len() >= d, "a value row shorter than the output");
        let w: [__m512; H] = std::array::from_fn(|h| _mm512_set1_ps(ps[h][j]));
        for c in 0..C {
            // SAFETY: c * 16 + 16 <= d <= row.len() (asserted).
            let v = unsafe { load_16(row, c * 16) };
            for h in 0..H {
                acc[h][c] = _mm512_fmadd_ps(w[h], v, acc[h][c]);
            }
        }
    }
    for (h, a) in acc.iter().enumerate() {
        for (c, v) in a.iter().enumerate() {
            // SAFETY: as for the loads above.
            unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(h * d + c * 16), *v) };
        }
    }
}

/// One value row's share of [`pv_rows`]: widened 16 at a time, added to
/// every head's output.
///
/// # Safety
/// AVX-512F; `row` holds at least `d` elements, `d` a multiple of 16,
/// `out` `heads * d`, `p` `heads * n` with `j < n`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn pv_one_avx512(
    p: &[f32],
    n: usize,
    j: usize,
    heads: usize,
    row: Row<'_>,
    d: usize,
    out: &mut [f32],
) {
    use std::arch::x86_64::*;
    for c in (0..d).step_by(16) {
        // SAFETY: c + 16 <= d <= row.len() (the contract).
        let v = unsafe { load_16(row, c) };
        for h in 0..heads {
            let w = _mm512_set1_ps(p[h * n + j]);
            // SAFETY: h * d + c + 16 <= heads * d = out.len() (the contract).
            unsafe {
                let o = out.as_mut_ptr().add(h * d + c);
                _mm512_storeu_ps(o, _mm512_fmadd_ps(w, v, _mm512_loadu_ps(o)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    fn data(n: usize, seed: f32) -> Vec<f32> {
        (0..n).map(|i| ((i as f32 + seed) * 0.731).sin()).collect()
    }

    /// The ISAs this machine runs.
    fn isas() -> Vec<Isa> {
        [Isa::Portable, Isa::Avx2, Isa::Avx512]
            .into_iter()
            .filter(|i| i.supported())
            .collect()
    }

    #[test]
    fn fp8_widening_is_the_table_on_every_path() {
        let bytes: Vec<u8> = (0..=255u8).filter(|b| b & 0x7f != 0x7f).collect();
        let bytes = &bytes[..bytes.len() / 16 * 16];
        for isa in isas() {
            let mut out = vec![0f32; bytes.len()];
            widen(isa, Row::Fp8(bytes, 0.37), &mut out);
            for (&b, &o) in bytes.iter().zip(&out) {
                let want = e4m3_table()[b as usize] * 0.37;
                assert_eq!(o.to_bits(), want.to_bits(), "{isa:?} byte {b:#x}");
            }
        }
        // the table is the e4m3 decoding: 1.0 is 0x38, the largest 448 is 0x7e,
        // the smallest subnormal 2^-9 is 0x01
        let t = e4m3_table();
        assert_eq!(
            (t[0x38], t[0x7e], t[0x01], t[0xb8]),
            (1.0, 448.0, 1.0 / 512.0, -1.0)
        );
    }

    #[test]
    fn grouped_scores_and_values_equal_the_per_head_loops() {
        // register-blocked value sums (64 and 128 wide) and the row loop
        for (heads, d, n) in [
            (3, 32, 37),
            (3, 64, 37),
            (4, 64, 21),
            (2, 128, 19),
            (8, 64, 5),
        ] {
            grouped_equal_per_head(heads, d, n);
        }
    }

    fn grouped_equal_per_head(heads: usize, d: usize, n: usize) {
        let qs = data(heads * d, 1.0);
        let keys = data(n * d, 2.0);
        let vals = data(n * d, 3.0);
        let kb: Vec<u16> = keys.iter().map(|&x| bf16::from_f32(x).to_bits()).collect();
        let vb: Vec<u16> = vals.iter().map(|&x| bf16::from_f32(x).to_bits()).collect();
        for isa in isas() {
            for bf in [false, true] {
                let row = |src: &'_ [f32], bits: &'_ [u16], j: usize| -> (Vec<f32>, usize) {
                    let w: Vec<f32> = if bf {
                        bits[j * d..(j + 1) * d]
                            .iter()
                            .map(|&b| f32::from_bits(u32::from(b) << 16))
                            .collect()
                    } else {
                        src[j * d..(j + 1) * d].to_vec()
                    };
                    (w, j)
                };
                let key = |j: usize| match bf {
                    true => Row::Bf16(&kb[j * d..(j + 1) * d]),
                    false => Row::F32(&keys[j * d..(j + 1) * d]),
                };
                let value = |j: usize| match bf {
                    true => Row::Bf16(&vb[j * d..(j + 1) * d]),
                    false => Row::F32(&vals[j * d..(j + 1) * d]),
                };
                let mut scores = vec![0f32; heads * n];
                dot_keys_rows(isa, &qs, heads, key, n, &mut scores, &mut Vec::new());
                // the sums add to what `out` holds
                let mut out = data(heads * d, 4.0);
                pv_rows(isa, &scores, heads, value, n, &mut out, &mut Vec::new());
                let wk: Vec<Vec<f32>> = (0..n).map(|j| row(&keys, &kb, j).0).collect();
                let wv: Vec<Vec<f32>> = (0..n).map(|j| row(&vals, &vb, j).0).collect();
                for h in 0..heads {
                    let q = &qs[h * d..(h + 1) * d];
                    let mut want = vec![0f32; n];
                    dot_keys(isa, q, |j| &wk[j], &mut want);
                    assert_eq!(&scores[h * n..(h + 1) * n], &want[..], "{isa:?} bf16 {bf}");
                    let mut o = data(heads * d, 4.0)[h * d..(h + 1) * d].to_vec();
                    for j in 0..n {
                        axpy(isa, &mut o, want[j], &wv[j]);
                    }
                    assert_eq!(&out[h * d..(h + 1) * d], &o[..], "{isa:?} bf16 {bf}");
                }
            }
        }
    }
}
