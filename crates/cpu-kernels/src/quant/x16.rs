//! Q4_1 and Q8_0 weights interleaved in panels of [`ROWS`] rows for
//! AVX-512 VNNI: the generated rows' product with the outputs in the
//! vector lanes, so no horizontal sums and one activation pair broadcast
//! for sixteen rows.
//!
//! Contract: [`Panels16::new`] repacks a `[rows, inp]` matrix of ggml
//! blocks (`rows` a multiple of [`ROWS`]) without changing a byte's
//! meaning: panel `g`, block `b` holds rows `16g..16g+16`'s block `b` as
//! `64`-byte chunks `c` whose 32-bit lane `r` is row `r`'s weights `4c +
//! [0, 2, 1, 3]` (Q8_0: the bytes; Q4_1: the nibble bytes, so the high
//! nibbles are weights `16 + 4c + ..`), then the sixteen f16 `d` and
//! (Q4_1) the sixteen f16 `m`: [`QuantType::block_bytes`] per row and
//! block, as before. Masks and shifts then give each lane two consecutive
//! weights as 16-bit values, multiplied with the activations' 16-bit pair
//! by `vpdpwssd`. [`matmul_x16`] computes [`super::matmul_quant`]'s
//! integer block sums from the same [`QuantActs`] and adds them in another
//! f32 order (per output, block after block, the `m·sx` terms apart), so it
//! agrees with it to f32 rounding; a row's result depends on that row
//! alone, never on `T` or on the other rows.
//!
//! Costs: per panel and block, four (Q4_1) or eight (Q8_0) 64-byte loads
//! and their unpacking, once for up to [`TOKENS`] tokens, then per token
//! sixteen `vpdpwssd` and one scale multiply-add (and one for `m`): about
//! a fifth of the row kernels' instructions, which are bound by their
//! per-block unpacking and horizontal sums; each block prefetches the one
//! [`AHEAD`] blocks on (decode reads the weights from L3 or memory, where
//! the hardware prefetchers alone left a quarter of the speed); the repack
//! is one pass at load, no extra memory once the source is dropped.

use super::{ActsRow, PARALLEL_MIN_WORK, QK, QuantActs, QuantType};
use crate::OutPtr;
use crate::pairs::NR;
use rayon::prelude::*;

/// Rows per panel: one per 32-bit lane of a 512-bit vector.
pub const ROWS: usize = 16;
/// Weights `4c + PERM[i]` sit in byte `i` of a lane, so that the even
/// and the odd bytes each hold two consecutive weights.
const PERM: [usize; 4] = [0, 2, 1, 3];
/// Panel blocks the kernels prefetch ahead of the one they multiply.
const AHEAD: usize = 8;
/// Tokens one pass over a panel serves (each chunk unpacked once for all).
const TOKENS: usize = 4;

/// A quantised matrix in panels of [`ROWS`] rows (see the module doc).
pub struct Panels16 {
    qt: QuantType,
    rows: usize,
    /// Blocks of [`QK`] per row.
    blocks: usize,
    data: Vec<u8>,
}

/// Whether this processor runs [`matmul_x16`].
pub fn supported() -> bool {
    super::Kernel::Vnni.supported()
}

impl Panels16 {
    /// The panels of `w` (`[rows, inp]` in `qt` blocks), or `None` for a
    /// type other than Q4_1 / Q8_0, `rows` not a multiple of [`ROWS`], or a
    /// processor without AVX-512 VNNI ([`supported`]).
    /// Panics if `w`'s length disagrees (a caller bug).
    pub fn new(qt: QuantType, w: &[u8], rows: usize, inp: usize) -> Option<Self> {
        let lanes = match qt {
            QuantType::Q4_1 => QK / 2,
            QuantType::Q8_0 => QK,
            _ => return None,
        };
        if !rows.is_multiple_of(ROWS) || !inp.is_multiple_of(QK) || !supported() {
            return None;
        }
        let (blocks, bb) = (inp / QK, qt.block_bytes());
        assert_eq!(
            w.len(),
            qt.matrix_bytes(rows, inp),
            "w is not [{rows}, {inp}] of {qt:?}"
        );
        let head = bb - lanes; // d (and m) before the weights
        let mut data = vec![0u8; w.len()];
        let pb = ROWS * bb;
        for (i, dst) in data.chunks_exact_mut(pb).enumerate() {
            let (g, b) = (i / blocks, i % blocks);
            for r in 0..ROWS {
                let src = &w[((g * ROWS + r) * blocks + b) * bb..][..bb];
                for c in 0..lanes / 4 {
                    for (j, &p) in PERM.iter().enumerate() {
                        dst[c * 64 + r * 4 + j] = src[head + 4 * c + p];
                    }
                }
                let scales = ROWS * lanes;
                dst[scales + 2 * r..][..2].copy_from_slice(&src[0..2]);
                if qt == QuantType::Q4_1 {
                    dst[scales + 32 + 2 * r..][..2].copy_from_slice(&src[2..4]);
                }
            }
        }
        Some(Panels16 {
            qt,
            rows,
            blocks,
            data,
        })
    }

    /// The block type.
    pub fn quant_type(&self) -> QuantType {
        self.qt
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    /// Rows (outputs).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Weights per row (inputs).
    pub fn inp(&self) -> usize {
        self.blocks * QK
    }

    /// Rows `o0..o0 + nv` (`o0` a multiple of [`ROWS`], `nv <=` [`NR`]) in
    /// the prompt GEMM's panel form ([`super::gemm`]): `q[(16 b + k) * NR +
    /// j]` the `k`-th pair of block `b` of row `o0 + j` as two 16-bit values,
    /// `d` and `m` `[blocks][NR]` the blocks' scales and minimums; lanes from
    /// `nv` zero. Panics on a caller bug (bounds, or no AVX-512 VNNI).
    pub(super) fn unpack_gemm(
        &self,
        o0: usize,
        nv: usize,
        q: &mut [u32],
        d: &mut [f32],
        m: &mut [f32],
    ) {
        assert!(supported() && o0.is_multiple_of(ROWS) && nv <= NR && o0 + nv <= self.rows);
        let nb = self.blocks;
        assert!(q.len() >= nb * 16 * NR && d.len() >= nb * NR && m.len() >= nb * NR);
        let pb = self.qt.matrix_bytes(ROWS, self.inp());
        let bb = ROWS * self.qt.block_bytes();
        let lanes = self.qt.block_bytes() - if self.qt == QuantType::Q4_1 { 4 } else { 2 };
        q.fill(0);
        d.fill(0.0);
        m.fill(0.0);
        for half in 0..nv.div_ceil(ROWS) {
            let panel = &self.data[(o0 / ROWS + half) * pb..][..pb];
            for (b, blk) in panel.chunks_exact(bb).enumerate() {
                let scales = &blk[ROWS * lanes..];
                for j in 0..ROWS.min(nv - half * ROWS) {
                    let f =
                        |i: usize| half::f16::from_le_bytes([scales[i], scales[i + 1]]).to_f32();
                    d[b * NR + half * 16 + j] = f(2 * j);
                    if self.qt == QuantType::Q4_1 {
                        m[b * NR + half * 16 + j] = f(32 + 2 * j);
                    }
                }
                let dst = &mut q[b * 16 * NR + half * 16..];
                #[cfg(target_arch = "x86_64")]
                // SAFETY: AVX-512 VNNI asserted; the block's chunks are in
                // `blk`; word (16 b + k) * NR + 16 half + 15 is in `q`.
                unsafe {
                    unpack_block(self.qt, blk, dst)
                };
                #[cfg(not(target_arch = "x86_64"))]
                let _ = dst;
            }
        }
    }
}

/// One panel block's sixteen `k` pairs as 16-row vectors of words, stored
/// [`NR`] words apart from `dst` (see [`Panels16::unpack_gemm`]).
///
/// # Safety
/// AVX-512F and BW; `blk` one panel block of `qt`; `dst` holds `15 * NR +
/// 16` words.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn unpack_block(qt: QuantType, blk: &[u8], dst: &mut [u32]) {
    use std::arch::x86_64::*;
    assert!(dst.len() >= 15 * NR + 16);
    let put = |dst: &mut [u32], k: usize, v: __m512i| {
        // SAFETY: k < 16, so 16 words at k * NR are in `dst` (asserted).
        unsafe { _mm512_storeu_si512(dst.as_mut_ptr().add(k * NR) as *mut _, v) }
    };
    let load = |c: usize| {
        // SAFETY: chunk c of the block (64 bytes at 64 c) is in `blk`.
        unsafe { _mm512_loadu_si512(blk.as_ptr().add(c * 64) as *const _) }
    };
    if qt == QuantType::Q4_1 {
        let mask = _mm512_set1_epi16(0x0f);
        for c in 0..4 {
            let v = load(c);
            put(dst, 2 * c, _mm512_and_si512(v, mask));
            put(
                dst,
                2 * c + 1,
                _mm512_and_si512(_mm512_srli_epi16::<8>(v), mask),
            );
            put(
                dst,
                8 + 2 * c,
                _mm512_and_si512(_mm512_srli_epi16::<4>(v), mask),
            );
            put(dst, 9 + 2 * c, _mm512_srli_epi16::<12>(v));
        }
    } else {
        for c in 0..8 {
            let v = load(c);
            put(
                dst,
                2 * c,
                _mm512_srai_epi16::<8>(_mm512_slli_epi16::<8>(v)),
            );
            put(dst, 2 * c + 1, _mm512_srai_epi16::<8>(v));
        }
    }
}

/// `y = x @ W^T` over panels (see the module doc): `x` `[T, inp]`, `y` `[T,
/// rows]`. Panics if the lengths disagree or the processor lacks
/// AVX-512 VNNI ([`supported`]; a caller bug).
pub fn matmul_x16(x: &[f32], p: &Panels16, y: &mut [f32], acts: &mut QuantActs) {
    let inp = p.blocks * QK;
    assert!(supported(), "matmul_x16 needs AVX-512 VNNI");
    assert!(x.len().is_multiple_of(inp), "x is not [T, {inp}]");
    let t = x.len() / inp;
    assert_eq!(y.len(), t * p.rows, "y is not [{t}, {}]", p.rows);
    if t == 0 || p.rows == 0 {
        return;
    }
    acts.quantize(x, inp);
    let acts = &*acts;
    let groups = p.rows / ROWS;
    let threads = rayon::current_num_threads();
    let per_task = if t * p.rows * inp < PARALLEL_MIN_WORK || threads == 1 {
        groups
    } else {
        groups.div_ceil(threads * 4).max(1)
    };
    let tasks = groups.div_ceil(per_task);
    let pb = p.qt.matrix_bytes(ROWS, inp);
    let yp = OutPtr(y.as_mut_ptr());
    let run = |task: usize| {
        for g in task * per_task..((task + 1) * per_task).min(groups) {
            let panel = &p.data[g * pb..][..pb];
            let mut n = 0;
            while n < t {
                let nt = TOKENS.min(t - n);
                let a: [ActsRow<'_>; TOKENS] = std::array::from_fn(|j| acts.row(n + j.min(nt - 1)));
                // SAFETY: n + j < t and g < groups, so the 16 outputs at
                // (n + j) * rows + 16 g are inside `y` [t, rows]; panel g
                // belongs to this task only (see OutPtr).
                let out: [*mut f32; TOKENS] = std::array::from_fn(|j| unsafe {
                    yp.get().add((n + j.min(nt - 1)) * p.rows + g * ROWS)
                });
                #[cfg(target_arch = "x86_64")]
                // SAFETY: AVX-512 VNNI asserted above; `panel` holds
                // `blocks` blocks of 16 rows and each row of `a` `blocks`
                // blocks; the first `nt` outputs are distinct.
                unsafe {
                    match (p.qt, nt) {
                        (QuantType::Q4_1, 1) => q4_1_panel::<1>(panel, &a, &out),
                        (QuantType::Q4_1, 2) => q4_1_panel::<2>(panel, &a, &out),
                        (QuantType::Q4_1, 3) => q4_1_panel::<3>(panel, &a, &out),
                        (QuantType::Q4_1, _) => q4_1_panel::<4>(panel, &a, &out),
                        (_, 1) => q8_0_panel::<1>(panel, &a, &out),
                        (_, 2) => q8_0_panel::<2>(panel, &a, &out),
                        (_, 3) => q8_0_panel::<3>(panel, &a, &out),
                        _ => q8_0_panel::<4>(panel, &a, &out),
                    }
                }
                #[cfg(not(target_arch = "x86_64"))]
                let _ = (panel, out, a);
                n += nt;
            }
        }
    };
    if tasks == 1 {
        run(0);
    } else {
        (0..tasks).into_par_iter().for_each(run);
    }
}

/// Prefetches the panel block [`AHEAD`] blocks of `pb` bytes past `w`
/// (the stream runs on into the next panel; a prefetch past the matrix
/// reads nothing and cannot fault).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
fn prefetch_ahead(w: *const u8, pb: usize) {
    use std::arch::x86_64::*;
    let at = w.wrapping_add(AHEAD * pb);
    for line in (0..pb).step_by(64) {
        // a hint: it never faults, whatever the address (wrapping_add
        // keeps the pointer arithmetic defined)
        _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(line) as *const i8);
    }
}

/// The activation pair `(q[k], q[k + 1])` in every 32-bit lane.
#[cfg(target_arch = "x86_64")]
///
/// # Safety
/// AVX-512F; `k + 1 < q.len()` (the caller's block bounds).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn pair(q: &[i16], k: usize) -> std::arch::x86_64::__m512i {
    use std::arch::x86_64::*;
    debug_assert!(k + 1 < q.len());
    // SAFETY: two i16 in bounds (caller).
    _mm512_set1_epi32(unsafe { std::ptr::read_unaligned(q.as_ptr().add(k) as *const i32) })
}

/// Sixteen rows' Q4_1 dot products with each of the first `N` rows of
/// `a`, stored at `out[j]`: each chunk is unpacked once for the `N` tokens,
/// and every token's f32 operations are those it has alone (`N` = 1).
///
/// # Safety
/// AVX-512F, BW, VNNI, F16C; `panel` holds `a[j].ds.len()` blocks of 16
/// rows; 16 floats writable at each `out[j]`, `j < N`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
unsafe fn q4_1_panel<const N: usize>(
    panel: &[u8],
    a: &[ActsRow<'_>; TOKENS],
    out: &[*mut f32; TOKENS],
) {
    use std::arch::x86_64::*;
    const PB: usize = ROWS * 20;
    let mask = _mm512_set1_epi16(0x0f);
    let mut acc = [_mm512_setzero_ps(); N];
    let mut accm = [_mm512_setzero_ps(); N];
    for b in 0..a[0].ds.len() {
        let w = &panel[b * PB..][..PB];
        prefetch_ahead(w.as_ptr(), PB);
        let x: [&[i16]; N] = std::array::from_fn(|j| &a[j].q[b * QK..][..QK]);
        let mut s = [[_mm512_setzero_si512(); 4]; N];
        for c in 0..4 {
            // SAFETY: chunk c is inside the block; pairs inside x.
            unsafe {
                let v = _mm512_loadu_si512(w.as_ptr().add(c * 64) as *const _);
                let lo = _mm512_and_si512(v, mask);
                let lo2 = _mm512_and_si512(_mm512_srli_epi16::<8>(v), mask);
                let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), mask);
                let hi2 = _mm512_srli_epi16::<12>(v);
                for j in 0..N {
                    s[j][0] = _mm512_dpwssd_epi32(s[j][0], lo, pair(x[j], 4 * c));
                    s[j][1] = _mm512_dpwssd_epi32(s[j][1], lo2, pair(x[j], 4 * c + 2));
                    s[j][2] = _mm512_dpwssd_epi32(s[j][2], hi, pair(x[j], 16 + 4 * c));
                    s[j][3] = _mm512_dpwssd_epi32(s[j][3], hi2, pair(x[j], 18 + 4 * c));
                }
            }
        }
        // SAFETY: the 16 d and 16 m follow the 256 nibble bytes.
        let (d, m) = unsafe {
            (
                _mm512_cvtph_ps(_mm256_loadu_si256(w.as_ptr().add(256) as *const _)),
                _mm512_cvtph_ps(_mm256_loadu_si256(w.as_ptr().add(288) as *const _)),
            )
        };
        for j in 0..N {
            let [dx, sx] = a[j].ds[b];
            let s = &s[j];
            let sum = _mm512_add_epi32(_mm512_add_epi32(s[0], s[1]), _mm512_add_epi32(s[2], s[3]));
            let scale = _mm512_mul_ps(d, _mm512_set1_ps(dx));
            acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), scale, acc[j]);
            accm[j] = _mm512_fmadd_ps(m, _mm512_set1_ps(sx), accm[j]);
        }
    }
    for j in 0..N {
        // SAFETY: 16 floats writable at out[j] (caller).
        unsafe { _mm512_storeu_ps(out[j], _mm512_add_ps(acc[j], accm[j])) }
    }
}

/// Sixteen rows' Q8_0 dot products with each of the first `N` rows of
/// `a` (as [`q4_1_panel`]).
///
/// # Safety
/// As [`q4_1_panel`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
unsafe fn q8_0_panel<const N: usize>(
    panel: &[u8],
    a: &[ActsRow<'_>; TOKENS],
    out: &[*mut f32; TOKENS],
) {
    use std::arch::x86_64::*;
    const PB: usize = ROWS * 34;
    let mut acc = [_mm512_setzero_ps(); N];
    for b in 0..a[0].ds.len() {
        let w = &panel[b * PB..][..PB];
        prefetch_ahead(w.as_ptr(), PB);
        let x: [&[i16]; N] = std::array::from_fn(|j| &a[j].q[b * QK..][..QK]);
        let mut s = [[_mm512_setzero_si512(); 4]; N];
        for c in 0..8 {
            // SAFETY: chunk c is inside the block; pairs inside x.
            unsafe {
                let v = _mm512_loadu_si512(w.as_ptr().add(c * 64) as *const _);
                let even = _mm512_srai_epi16::<8>(_mm512_slli_epi16::<8>(v));
                let odd = _mm512_srai_epi16::<8>(v);
                let i = 2 * (c & 1);
                for j in 0..N {
                    s[j][i] = _mm512_dpwssd_epi32(s[j][i], even, pair(x[j], 4 * c));
                    s[j][i + 1] = _mm512_dpwssd_epi32(s[j][i + 1], odd, pair(x[j], 4 * c + 2));
                }
            }
        }
        // SAFETY: the 16 d follow the 512 weight bytes.
        let d = unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(w.as_ptr().add(512) as *const _)) };
        for j in 0..N {
            let s = &s[j];
            let sum = _mm512_add_epi32(_mm512_add_epi32(s[0], s[1]), _mm512_add_epi32(s[2], s[3]));
            let scale = _mm512_mul_ps(d, _mm512_set1_ps(a[j].ds[b][0]));
            acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), scale, acc[j]);
        }
    }
    for j in 0..N {
        // SAFETY: 16 floats writable at out[j] (caller).
        unsafe { _mm512_storeu_ps(out[j], acc[j]) }
    }
}
