//! BF16 weights packed once as panels of `k` pairs, and their f32
//! products: the AVX-512 layout of the fast path's projections.
//!
//! Contract: [`PairPanels::new`] packs `w` `[out, inp]` as `[out / NR]`
//! panels of `[pairs][NR]` 32-bit words, word `(k, j)` holding `w[o][2k]`
//! in its low half and `w[o][2k + 1]` in its high half (`o = p * NR + j`;
//! zero past `inp` and `out`). That is the operand `vdpbf16ps` multiplies
//! ([`crate::gemm_split`]) and, widened in registers (a shift for the even
//! `k`, a mask for the odd), what [`matmul_pairs`] multiplies f32
//! activations with: `y = x @ W^T`, each output one fused multiply-add
//! chain over `k` in increasing order, the same bits as
//! [`crate::gemm512::matmul`] over the row-major matrix, for any number of
//! tokens (register tiles of [`MR`] tokens x [`NR`] outputs).
//!
//! Costs: the panels hold the BF16 weights (plus padding to whole panels
//! and an even `inp`), packed once; a product reads them once per call
//! (from memory for one token: bound by bandwidth, 2 bytes per weight) and
//! does `T * out * inp` multiply-adds, parallel over panels on rayon.

use crate::OutPtr;
use half::bf16;
use rayon::prelude::*;

/// Tokens per register tile.
pub const MR: usize = 12;
/// Outputs per panel and register tile.
pub const NR: usize = 32;
/// Below this many multiply-adds a product runs on the calling thread.
const PARALLEL_MIN_WORK: usize = 1 << 16;

/// A BF16 matrix `[out, inp]` as `k`-pair panels (see the module doc).
pub struct PairPanels {
    data: Vec<u32>,
    inp: usize,
    out: usize,
}

impl PairPanels {
    /// Packs `w` `[out, inp]`. Panics if `w.len() != out * inp` or the
    /// processor lacks AVX-512F (callers check [`crate::Isa`]).
    pub fn new(w: &[bf16], inp: usize, out: usize) -> Self {
        assert!(crate::Isa::Avx512.supported(), "AVX-512F is required");
        assert_eq!(w.len(), out * inp, "w is not [{out}, {inp}]");
        let pairs = inp.div_ceil(2);
        let bits: &[u16] = half::slice::HalfFloatSliceExt::reinterpret_cast(w);
        let mut data = vec![0u32; out.div_ceil(NR) * pairs * NR];
        if pairs > 0 {
            data.par_chunks_mut(pairs * NR)
                .enumerate()
                .for_each(|(p, panel)| {
                    pack_pairs(bits, inp, p * NR, ((p + 1) * NR).min(out), panel)
                });
        }
        PairPanels { data, inp, out }
    }

    /// Inputs per row.
    pub fn inp(&self) -> usize {
        self.inp
    }

    /// Outputs (rows).
    pub fn out(&self) -> usize {
        self.out
    }

    /// `k` pairs per panel row count (`ceil(inp / 2)`).
    pub fn pairs(&self) -> usize {
        self.inp.div_ceil(2)
    }

    /// Panel `p`: `[pairs][NR]` words.
    pub fn panel(&self, p: usize) -> &[u32] {
        let n = self.pairs() * NR;
        &self.data[p * n..(p + 1) * n]
    }

    /// Row `o` (`inp` values) widened to f32 into `out`: the matrix's own
    /// values (a tied embedding's lookup reads its rows from the LM head's
    /// panels). Panics if `o >= out()` or `out.len() != inp()`.
    pub fn row_f32(&self, o: usize, out: &mut [f32]) {
        assert!(o < self.out, "row {o} of {}", self.out);
        assert_eq!(out.len(), self.inp, "a row has {} values", self.inp);
        let words = self.panel(o / NR)[o % NR..].iter().step_by(NR);
        for (pair, &w) in out.chunks_mut(2).zip(words) {
            pair[0] = f32::from_bits(w << 16);
            if let Some(odd) = pair.get_mut(1) {
                *odd = f32::from_bits(w & 0xFFFF_0000);
            }
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        4 * self.data.len()
    }
}

/// Packs weight rows `o0..o1` (BF16 bits, rows `inp` apart) as `[pairs][NR]`
/// words, word `(k, j)` holding `w[o0 + j][2k]` in its low half and `w[o0 +
/// j][2k + 1]` (0 past `inp`) in its high half; lanes past `o1` zero. Whole
/// blocks of 16 rows x 16 words go through the register transpose.
pub(crate) fn pack_pairs(bits: &[u16], inp: usize, o0: usize, o1: usize, panel: &mut [u32]) {
    let n = o1 - o0;
    let pairs = inp.div_ceil(2);
    assert!(panel.len() >= pairs * NR);
    if n < NR {
        panel.fill(0);
    }
    let rows = &bits[o0 * inp..o1 * inp];
    // whole blocks need every row's words aligned: inp even
    let whole = if cfg!(target_arch = "x86_64") && n == NR && inp.is_multiple_of(2) {
        inp / 2 / 16 * 16
    } else {
        0
    };
    #[cfg(target_arch = "x86_64")]
    if whole > 0 {
        // SAFETY: AVX-512F (asserted by every caller); NR rows of inp
        // values, each load reads words k0..k0 + 16 <= whole <= inp / 2 of
        // a row; the panel holds pairs * NR >= whole * NR words.
        unsafe {
            crate::gemm512::pack_blocks(whole, panel.as_mut_ptr().cast(), |i, k0| {
                std::arch::x86_64::_mm512_loadu_ps(rows.as_ptr().add(i * inp + 2 * k0).cast())
            })
        };
    }
    for (k, dst) in panel
        .chunks_exact_mut(NR)
        .take(pairs)
        .enumerate()
        .skip(whole)
    {
        for (j, v) in dst[..n].iter_mut().enumerate() {
            let r = &rows[j * inp..][..inp];
            let second = r.get(2 * k + 1).copied().unwrap_or(0);
            *v = u32::from(r[2 * k]) | (u32::from(second) << 16);
        }
    }
}

/// The masks of a tile's two 16-lane halves for `nv` valid outputs.
#[cfg(target_arch = "x86_64")]
pub(crate) fn masks(nv: usize) -> (u16, u16) {
    let lanes = |n: usize| -> u16 { if n >= 16 { 0xFFFF } else { (1u16 << n) - 1 } };
    (lanes(nv), lanes(nv.saturating_sub(16)))
}

/// `pub(crate)` for [`crate::gemm_split`]: a function `$name(mr, args..)`
/// running `$micro::<mr>(args..)` for `mr` in `1..=MR` (with `$micro
/// [G, ..]`, `$micro::<mr, G, ..>`).
macro_rules! dispatch {
    ($name:ident, $micro:ident $([$($extra:tt),*])?, ($($arg:ident: $ty:ty),*)) => {
        /// Runs the `mr`-row kernel (`mr` in `1..=MR`).
        ///
        /// # Safety
        /// As the kernel with `M = mr`.
        #[allow(clippy::too_many_arguments)]
        unsafe fn $name(mr: usize, $($arg: $ty),*) {
            // SAFETY: every arm is forwarded from this function's contract.
            unsafe {
                match mr {
                    1 => $micro::<1 $($(, $extra)*)?>($($arg),*),
                    2 => $micro::<2 $($(, $extra)*)?>($($arg),*),
                    3 => $micro::<3 $($(, $extra)*)?>($($arg),*),
                    4 => $micro::<4 $($(, $extra)*)?>($($arg),*),
                    5 => $micro::<5 $($(, $extra)*)?>($($arg),*),
                    6 => $micro::<6 $($(, $extra)*)?>($($arg),*),
                    7 => $micro::<7 $($(, $extra)*)?>($($arg),*),
                    8 => $micro::<8 $($(, $extra)*)?>($($arg),*),
                    9 => $micro::<9 $($(, $extra)*)?>($($arg),*),
                    10 => $micro::<10 $($(, $extra)*)?>($($arg),*),
                    11 => $micro::<11 $($(, $extra)*)?>($($arg),*),
                    12 => $micro::<12 $($(, $extra)*)?>($($arg),*),
                    _ => unreachable!("mr is 1..=MR"),
                }
            }
        }
    };
}
pub(crate) use dispatch;

/// `y = x @ W^T` for f32 `x` `[T, inp]` and `y` `[T, out]` (see the module
/// doc), parallel over panels. Panics if the lengths disagree or the
/// processor lacks AVX-512F.
pub fn matmul_pairs(x: &[f32], w: &PairPanels, y: &mut [f32]) {
    assert!(crate::Isa::Avx512.supported(), "AVX-512F is required");
    let (inp, out) = (w.inp, w.out);
    assert!(
        inp > 0 && x.len().is_multiple_of(inp),
        "x is not [T, {inp}]"
    );
    let t = x.len() / inp;
    assert_eq!(y.len(), t * out, "y is not [{t}, {out}]");
    if t == 0 || out == 0 {
        return;
    }
    let yp = OutPtr(y.as_mut_ptr());
    let run = |p: usize| {
        let (o0, nv) = (p * NR, NR.min(out - p * NR));
        let panel = w.panel(p);
        for t0 in (0..t).step_by(MR) {
            // SAFETY: AVX-512F asserted; rows t0.. of x hold inp values, of
            // y out values from o0 (nv of them this panel's alone); the
            // panel holds pairs * NR words.
            unsafe {
                f32_dispatch(
                    MR.min(t - t0),
                    x.as_ptr().add(t0 * inp),
                    inp,
                    panel.as_ptr(),
                    yp.get().add(t0 * out + o0),
                    out,
                    nv,
                )
            };
        }
    };
    let panels = out.div_ceil(NR);
    if panels > 1 && t * inp * out >= PARALLEL_MIN_WORK {
        (0..panels).into_par_iter().for_each(run);
    } else {
        (0..panels).for_each(run);
    }
}

/// `k` pairs (128 bytes of panel each) [`f32_micro`] prefetches ahead of
/// the one it multiplies: decode reads the panels from L3 or memory.
const PAIRS_AHEAD: usize = 32;

dispatch!(f32_dispatch, f32_micro, (x: *const f32, inp: usize, panel: *const u32, y: *mut f32, ys: usize, nv: usize));

/// `y[m][j] = sum_k x[m][k] * w[j][k]` for `m < M`, `j < nv`: per `k` pair
/// two panel loads widened into four f32 vectors (even and odd `k`, two
/// halves of the outputs), two broadcasts and four FMAs per row; stored
/// masked.
///
/// # Safety
/// AVX-512F; `x` points at `M` rows of `inp` values `inp` apart, `panel` at
/// `ceil(inp / 2) * NR` words, `y` at `M` rows of `nv <= NR` writable
/// values `ys` apart.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn f32_micro<const M: usize>(
    x: *const f32,
    inp: usize,
    panel: *const u32,
    y: *mut f32,
    ys: usize,
    nv: usize,
) {
    use std::arch::x86_64::*;
    let mut c0 = [_mm512_setzero_ps(); M];
    let mut c1 = [_mm512_setzero_ps(); M];
    let high = _mm512_set1_epi32(0xFFFF_0000u32 as i32);
    let whole = inp / 2;
    for k in 0..whole {
        // SAFETY: pair k < inp / 2: x values 2k and 2k + 1 of every row and
        // panel row k are in bounds (the contract).
        unsafe {
            // the pair PAIRS_AHEAD on (a hint: never faults; the stream runs
            // on into the next panel)
            let ahead = panel.wrapping_add((k + PAIRS_AHEAD) * NR);
            _mm_prefetch::<_MM_HINT_T0>(ahead as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(16) as *const i8);
            let w0 = _mm512_loadu_si512(panel.add(k * NR).cast());
            let w1 = _mm512_loadu_si512(panel.add(k * NR + 16).cast());
            let (e0, o0) = (
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(w0)),
                _mm512_castsi512_ps(_mm512_and_si512(w0, high)),
            );
            let (e1, o1) = (
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(w1)),
                _mm512_castsi512_ps(_mm512_and_si512(w1, high)),
            );
            for m in 0..M {
                let xa = _mm512_set1_ps(*x.add(m * inp + 2 * k));
                let xb = _mm512_set1_ps(*x.add(m * inp + 2 * k + 1));
                c0[m] = _mm512_fmadd_ps(xa, e0, c0[m]);
                c1[m] = _mm512_fmadd_ps(xa, e1, c1[m]);
                c0[m] = _mm512_fmadd_ps(xb, o0, c0[m]);
                c1[m] = _mm512_fmadd_ps(xb, o1, c1[m]);
            }
        }
    }
    if inp % 2 == 1 {
        // the last input alone (its pair's high half is padding)
        // SAFETY: panel row `whole` exists (pairs = whole + 1); x value
        // inp - 1 of every row.
        unsafe {
            let w0 = _mm512_loadu_si512(panel.add(whole * NR).cast());
            let w1 = _mm512_loadu_si512(panel.add(whole * NR + 16).cast());
            let e0 = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(w0));
            let e1 = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(w1));
            for m in 0..M {
                let xa = _mm512_set1_ps(*x.add(m * inp + inp - 1));
                c0[m] = _mm512_fmadd_ps(xa, e0, c0[m]);
                c1[m] = _mm512_fmadd_ps(xa, e1, c1[m]);
            }
        }
    }
    let (m0, m1) = masks(nv);
    for m in 0..M {
        // SAFETY: row m of y has nv writable values; the masks write only
        // those (the second pointer may lie past the end: wrapping_add,
        // empty mask).
        unsafe {
            _mm512_mask_storeu_ps(y.add(m * ys), m0, c0[m]);
            _mm512_mask_storeu_ps(y.wrapping_add(m * ys + 16), m1, c1[m]);
        }
    }
}

/// Never called off x86-64 (every caller asserts AVX-512F first).
///
/// # Safety
/// None needed.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn f32_micro<const M: usize>(
    _: *const f32,
    _: usize,
    _: *const u32,
    _: *mut f32,
    _: usize,
    _: usize,
) {
    unreachable!("AVX-512F is asserted before any call")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The f32 products equal the row-major AVX-512 GEMM bit for bit (one
    /// chain per output, `k` in order), for 1 to 30 tokens and ragged
    /// shapes (odd `inp`, partial panels and tiles).
    #[test]
    fn equal_the_row_major_gemm_bit_for_bit() {
        if !crate::isa::test_runs_here(
            crate::Isa::Avx512.supported(),
            concat!(module_path!(), "::equal_the_row_major_gemm_bit_for_bit"),
            "AVX-512F",
        ) {
            return;
        }
        for &(t, inp, out) in &[
            (1, 5, 3),
            (1, 576, 70),
            (3, 37, 33),
            (13, 64, 96),
            (30, 101, 40),
        ] {
            let x: Vec<f32> = (0..t * inp)
                .map(|i| (i as f32 * 0.61).sin() * 2.0)
                .collect();
            let w: Vec<bf16> = (0..out * inp)
                .map(|i| bf16::from_f32((i as f32 * 0.23).cos() * 0.3))
                .collect();
            let p = PairPanels::new(&w, inp, out);
            let mut want = vec![0f32; t * out];
            crate::gemm512::matmul(&x, &w, inp, out, &mut want);
            let mut got = vec![f32::NAN; t * out];
            matmul_pairs(&x, &p, &mut got);
            assert_eq!(got, want, "T={t} {inp}x{out}");
        }
    }

    #[test]
    fn packs_pairs_like_the_scalar_regrouping() {
        if !crate::isa::test_runs_here(
            crate::Isa::Avx512.supported(),
            concat!(module_path!(), "::packs_pairs_like_the_scalar_regrouping"),
            "AVX-512F",
        ) {
            return;
        }
        for &(inp, out, o0, o1) in &[
            (64usize, 32usize, 0usize, 32usize),
            (75, 40, 0, 32),
            (64, 70, 64, 70),
            (96, 64, 32, 64),
        ] {
            let w: Vec<u16> = (0..out * inp).map(|i| (i * 31 % 65521) as u16).collect();
            let pairs = inp.div_ceil(2);
            let mut panel = vec![u32::MAX; pairs * NR];
            pack_pairs(&w, inp, o0, o1, &mut panel);
            for k in 0..pairs {
                for j in 0..NR {
                    let o = o0 + j;
                    let at = |c: usize| {
                        if o < o1 && c < inp {
                            u32::from(w[o * inp + c])
                        } else {
                            0
                        }
                    };
                    assert_eq!(
                        panel[k * NR + j],
                        at(2 * k) | (at(2 * k + 1) << 16),
                        "inp {inp} rows {o0}..{o1} k {k} j {j}"
                    );
                }
            }
        }
    }

    /// `row_f32` gives back every row's values exactly (odd `inp`, a
    /// partial last panel).
    #[test]
    fn rows_read_back_exactly() {
        if !crate::isa::test_runs_here(
            crate::Isa::Avx512.supported(),
            concat!(module_path!(), "::rows_read_back_exactly"),
            "AVX-512F",
        ) {
            return;
        }
        for &(inp, out) in &[(64usize, 32usize), (75, 40), (33, 70)] {
            let w: Vec<bf16> = (0..out * inp)
                .map(|i| bf16::from_f32((i * 31 % 2003) as f32 / 64.0 - 15.0))
                .collect();
            let p = PairPanels::new(&w, inp, out);
            let mut row = vec![f32::NAN; inp];
            for o in 0..out {
                p.row_f32(o, &mut row);
                let want: Vec<f32> = w[o * inp..][..inp].iter().map(|v| v.to_f32()).collect();
                assert_eq!(row, want, "inp {inp} row {o}");
            }
        }
    }
}
