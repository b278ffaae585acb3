//! The prompt GEMM on AVX-512 BF16 and VNNI: `y = x @ W^T` for BF16
//! weights and f32 activations, each activation split into a BF16 high part
//! and an 8-bit remainder.
//!
//! Contract: [`matmul_split`] computes `x @ W^T` (`x` `[T, inp]`, `w`
//! `[out, inp]` BF16, `y` `[T, out]`) as `hi @ W^T + lo @ W^T`, where `hi`
//! is `x` rounded to BF16 (to nearest even) and `lo = x - hi` (exact in
//! f32, at most half a BF16 unit of `x`). The high product runs on
//! `vdpbf16ps` against the weights themselves (products exact, summed in
//! f32 one `k` pair at a time in increasing order); the remainder's on
//! `vpdpbusd`: `lo` rounded to 8 bits with one scale per token, against an
//! 8-bit copy of the weights with one scale per output ([`LoWeights`],
//! built once at load), summed exactly in 32-bit integers. The error is
//! the remainder's rounding: about `2^-17` of a token's largest activation
//! per value, some `1e-4` relative on SmolLM2's logits (the f32 GEMM:
//! `1e-6`; BF16 activations alone: `1e-2`). Each row's result depends on
//! that row's values only, never on `T` or on the other rows, so a prompt
//! token computes the same bits in every batch and chunk.
//!
//! Why: on a core with full-width AVX-512 `vdpbf16ps` multiplies twice as
//! fast as f32 FMA and `vpdpbusd` four times, so the two products together
//! cost about 0.75x the f32 GEMM ([`crate::gemm512`]).
//!
//! Costs: `T * out * inp` multiply-adds in each product; per call one
//! split of `x` (`T * inp` values, into the caller's [`SplitActs`]); the
//! weights are read as [`PairPanels`] (packed once) and [`LoWeights`] (one
//! byte per weight, built once).
//!
//! One file on purpose: the packing, the register tiles and their tests
//! depend on one register layout; apart, a change to the layout could not be
//! read in one place.

use crate::OutPtr;
use crate::pairs::{PairPanels, masks};
use half::bf16;
use rayon::prelude::*;

pub use crate::pairs::{MR, NR};

/// Whether this processor runs [`matmul_split`] (AVX-512F, BW, VL, BF16
/// and VNNI).
pub fn supported() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512bf16")
            && is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The 8-bit copy of a BF16 matrix `[out, inp]` that [`matmul_split`]
/// multiplies the remainders with: per output row `scale = max|w| / 127`
/// and `q = round(w / scale)`, packed as panels of [`NR`] rows, `k` in
/// groups of four (`[out / NR][quads][NR][4]`, zero past the edges).
pub struct LoWeights {
    inp: usize,
    out: usize,
    quads: usize,
    panels: Vec<i8>,
    /// `[panels * NR]` per output `scale` (0 past `out`).
    scale: Vec<f32>,
    /// `[panels * NR]` per output `128 * sum_k q`: what the unsigned offset
    /// of the remainders adds to each integer sum.
    bias: Vec<i32>,
}

impl LoWeights {
    /// Quantises and packs `w` `[out, inp]`. Panics if `w.len() != out *
    /// inp` or the processor lacks what [`supported`] checks.
    pub fn new(w: &[bf16], inp: usize, out: usize) -> Self {
        assert!(supported(), "AVX-512 BF16 and VNNI are required");
        assert_eq!(w.len(), out * inp, "w is not [{out}, {inp}]");
        let quads = inp.div_ceil(4);
        let n_panels = out.div_ceil(NR);
        let mut panels = vec![0i8; n_panels * quads * NR * 4];
        let mut scale = vec![0f32; n_panels * NR];
        let mut bias = vec![0i32; n_panels * NR];
        let bits: &[u16] = half::slice::HalfFloatSliceExt::reinterpret_cast(w);
        panels
            .par_chunks_mut(quads * NR * 4)
            .zip(scale.par_chunks_mut(NR).zip(bias.par_chunks_mut(NR)))
            .enumerate()
            .for_each(|(p, (panel, (scale, bias)))| {
                let mut q = vec![0i8; quads * 4];
                for j in 0..NR.min(out - p * NR) {
                    let row = &bits[(p * NR + j) * inp..][..inp];
                    // SAFETY: the processor has AVX-512F (asserted);
                    // q.len() >= row.len().
                    let (s, sum) = unsafe { quantize_row(row, &mut q) };
                    for (k, word) in q.chunks_exact(4).enumerate() {
                        panel[(k * NR + j) * 4..][..4].copy_from_slice(word);
                    }
                    scale[j] = s;
                    bias[j] = 128 * sum;
                }
            });
        LoWeights {
            inp,
            out,
            quads,
            panels,
            scale,
            bias,
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.panels.len() + 8 * self.scale.len()
    }
}

/// One BF16 row's 8-bit copy: writes `q[..row.len()]` (`round(w /
/// scale)`, ties to even; the rest of `q` zero), returns `(scale, sum of
/// q)` with `scale = max|w| / 127` (0, and `q` all zero, for a row of
/// zeros or with a non-finite value).
///
/// # Safety
/// AVX-512F, BW and VL; `q.len() >= row.len()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn quantize_row(row: &[u16], q: &mut [i8]) -> (f32, i32) {
    use std::arch::x86_64::*;
    let n = row.len();
    q.fill(0);
    let mask = |k: usize| -> __mmask16 {
        let left = n - k;
        if left >= 16 {
            0xFFFF
        } else {
            (1u16 << left) - 1
        }
    };
    let load = |k: usize| {
        // SAFETY: the mask keeps the load inside row[..n].
        let h = unsafe { _mm256_maskz_loadu_epi16(mask(k), row.as_ptr().add(k).cast()) };
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
    };
    let mut max = _mm512_setzero_ps();
    for k in (0..n).step_by(16) {
        max = _mm512_max_ps(max, _mm512_abs_ps(load(k)));
    }
    let max = _mm512_reduce_max_ps(max);
    if max == 0.0 || !max.is_finite() {
        return (0.0, 0);
    }
    let scale = max / 127.0;
    let s = _mm512_set1_ps(scale);
    let mut sum = _mm512_setzero_si512();
    for k in (0..n).step_by(16) {
        // |w| / scale <= 127 (+ rounding of the division: clamped)
        let v = _mm512_cvtps_epi32(_mm512_div_ps(load(k), s));
        let v = _mm512_min_epi32(
            _mm512_max_epi32(v, _mm512_set1_epi32(-127)),
            _mm512_set1_epi32(127),
        );
        sum = _mm512_add_epi32(sum, v);
        // SAFETY: as above.
        unsafe {
            _mm_mask_storeu_epi8(
                q.as_mut_ptr().add(k).cast(),
                mask(k),
                _mm512_cvtepi32_epi8(v),
            )
        };
    }
    (scale, _mm512_reduce_add_epi32(sum))
}

/// Never called off x86-64 (every caller asserts [`supported`] first).
///
/// # Safety
/// None needed.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn quantize_row(_: &[u16], _: &mut [i8]) -> (f32, i32) {
    unreachable!("AVX-512 is asserted before any call")
}

/// The split activations of one call, reused call after call: `hi` `[T,
/// pairs * 2]` BF16 bits, `lo` `[T, quads * 4]` remainders as `q + 128`,
/// `scale` `[T]` (zero past `inp` in both).
#[derive(Default)]
pub struct SplitActs {
    hi: Vec<u16>,
    lo: Vec<u8>,
    scale: Vec<f32>,
}

/// One row of [`split`]: `((x, hi), (lo, scale))`.
type RowParts<'a> = ((&'a [f32], &'a mut [u16]), (&'a mut [u8], &'a mut f32));

/// Splits `x` `[t, inp]` into `acts` (see [`SplitActs`]), rows in parallel.
fn split(x: &[f32], t: usize, inp: usize, acts: &mut SplitActs) {
    let (hs, ls) = (inp.div_ceil(2) * 2, inp.div_ceil(4) * 4);
    acts.hi.resize(t * hs, 0);
    acts.lo.resize(t * ls, 128);
    acts.scale.resize(t, 0.0);
    let run = |((xr, hi), (lo, scale)): RowParts<'_>| {
        // SAFETY: AVX-512F and BF16 (asserted by matmul_split); the slices
        // hold inp, hs >= inp and ls >= inp values.
        *scale = unsafe { split_row(xr, hi, lo) };
    };
    if t * inp >= 1 << 15 {
        x.par_chunks_exact(inp)
            .zip(acts.hi.par_chunks_exact_mut(hs))
            .zip(
                acts.lo
                    .par_chunks_exact_mut(ls)
                    .zip(acts.scale.par_iter_mut()),
            )
            .with_min_len(8)
            .for_each(run);
    } else {
        x.chunks_exact(inp)
            .zip(acts.hi.chunks_exact_mut(hs))
            .zip(acts.lo.chunks_exact_mut(ls).zip(acts.scale.iter_mut()))
            .for_each(run);
    }
}

/// One row of [`split`]: writes `hi[..inp]` (and a zero pad), `lo[..inp]`
/// (the pad stays 128 = zero), returns the row's remainder scale.
///
/// # Safety
/// AVX-512F, BW, VL and BF16; `hi.len() >= x.len()`, `lo.len() >= x.len()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16,avx512bw,avx512vl")]
unsafe fn split_row(x: &[f32], hi: &mut [u16], lo: &mut [u8]) -> f32 {
    use std::arch::x86_64::*;
    let n = x.len();
    let mask = |k: usize| -> __mmask16 {
        let left = n - k;
        if left >= 16 {
            0xFFFF
        } else {
            (1u16 << left) - 1
        }
    };
    // The high parts and the largest remainder.
    let mut max = _mm512_setzero_ps();
    for k in (0..n).step_by(16) {
        let m = mask(k);
        // SAFETY: the mask keeps the loads and stores inside x[..n],
        // hi[..n] (hi.len() >= n).
        unsafe {
            let v = _mm512_maskz_loadu_ps(m, x.as_ptr().add(k));
            let h: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(v));
            _mm256_mask_storeu_epi16(hi.as_mut_ptr().add(k).cast(), m, h);
            let hf = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)));
            max = _mm512_max_ps(max, _mm512_abs_ps(_mm512_sub_ps(v, hf)));
        }
    }
    if n % 2 == 1 {
        hi[n] = 0;
    }
    let max = _mm512_reduce_max_ps(max);
    if max == 0.0 || !max.is_finite() {
        lo[..n].fill(128);
        return 0.0;
    }
    let scale = max / 127.0;
    let inv = _mm512_set1_ps(1.0 / scale);
    let off = _mm512_set1_epi32(128);
    for k in (0..n).step_by(16) {
        let m = mask(k);
        // SAFETY: as above, lo.len() >= n.
        unsafe {
            let v = _mm512_maskz_loadu_ps(m, x.as_ptr().add(k));
            let h = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(
                _mm256_maskz_loadu_epi16(m, hi.as_ptr().add(k).cast()),
            )));
            // |lo| * inv <= 127 (+ rounding), so q + 128 is in 0..=255
            let q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_sub_ps(v, h), inv));
            let q = _mm512_min_epi32(
                _mm512_max_epi32(q, _mm512_set1_epi32(-127)),
                _mm512_set1_epi32(127),
            );
            let b = _mm512_cvtepi32_epi8(_mm512_add_epi32(q, off));
            _mm_mask_storeu_epi8(lo.as_mut_ptr().add(k).cast(), m, b);
        }
    }
    scale
}

/// Never called off x86-64 (every caller asserts [`supported`] first).
///
/// # Safety
/// None needed.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn split_row(_: &[f32], _: &mut [u16], _: &mut [u8]) -> f32 {
    unreachable!("AVX-512 BF16 is asserted before any call")
}

/// `y = x @ W^T` (see the module doc) for `x` `[T, inp]` and `y` `[T,
/// out]`, `w` and `lo` the same matrix's panels and 8-bit copy, parallel
/// over panels of [`NR`] outputs. Panics if the lengths disagree, `lo` is
/// not `w`'s copy, or the processor lacks what [`supported`] checks.
pub fn matmul_split(
    x: &[f32],
    w: &PairPanels,
    lo: &LoWeights,
    y: &mut [f32],
    acts: &mut SplitActs,
) {
    assert!(supported(), "AVX-512 BF16 and VNNI are required");
    let (inp, out) = (w.inp(), w.out());
    assert!(
        inp > 0 && x.len().is_multiple_of(inp),
        "x is not [T, {inp}]"
    );
    let t = x.len() / inp;
    assert_eq!(y.len(), t * out, "y is not [{t}, {out}]");
    assert!(lo.inp == inp && lo.out == out, "lo is not w's 8-bit copy");
    if t == 0 || out == 0 {
        return;
    }
    split(x, t, inp, acts);
    let (pairs, quads) = (w.pairs(), lo.quads);
    let acts = &*acts;
    let yp = OutPtr(y.as_mut_ptr());
    let run = |p: usize| {
        let (o0, nv) = (p * NR, NR.min(out - p * NR));
        let panel = w.panel(p);
        let lo_panel = &lo.panels[p * quads * NR * 4..][..quads * NR * 4];
        // every tile's high products, then every tile's remainders: each
        // pass keeps its own panel in L1 (both together did not fit)
        for t0 in (0..t).step_by(MR) {
            // SAFETY: the processor runs the kernels (asserted); rows
            // t0..t0 + mr of the split activations hold pairs * 2 values,
            // y's rows out values from o0 on with nv of them this panel's
            // alone; the panel holds pairs * NR words.
            unsafe {
                hi_dispatch(
                    MR.min(t - t0),
                    acts.hi.as_ptr().add(t0 * pairs * 2).cast(),
                    pairs,
                    panel.as_ptr(),
                    yp.get().add(t0 * out + o0),
                    out,
                    nv,
                )
            };
        }
        for t0 in (0..t).step_by(MR) {
            // SAFETY: as above for the remainders' quads * 4 values a row
            // and quads * NR * 4 panel bytes; the scales hold NR values
            // from p * NR, the row scales t values.
            unsafe {
                lo_dispatch(
                    MR.min(t - t0),
                    acts.lo.as_ptr().add(t0 * quads * 4).cast(),
                    quads,
                    lo_panel.as_ptr().cast(),
                    acts.scale.as_ptr().add(t0),
                    lo.scale.as_ptr().add(p * NR),
                    lo.bias.as_ptr().add(p * NR),
                    yp.get().add(t0 * out + o0),
                    out,
                    nv,
                )
            };
        }
    };
    let panels = out.div_ceil(NR);
    if panels > 1 && t * inp * out >= 1 << 16 {
        (0..panels).into_par_iter().for_each(run);
    } else {
        (0..panels).for_each(run);
    }
}

crate::pairs::dispatch!(hi_dispatch, hi_micro, (a: *const u32, pairs: usize, panel: *const u32, y: *mut f32, ys: usize, nv: usize));
crate::pairs::dispatch!(lo_dispatch, lo_micro, (a: *const u32, quads: usize, panel: *const u32, sa: *const f32, sw: *const f32, bias: *const i32, y: *mut f32, ys: usize, nv: usize));

/// `y[m][j] = sum_k hi[m][k] * w[j][k]` for `m < M`, `j < nv`: per `k` pair
/// two panel loads, `M` pair broadcasts, `2 M` `vdpbf16ps`; stored masked.
///
/// # Safety
/// AVX-512F and BF16; `a` points at `M` rows of `pairs` words `pairs`
/// apart, `panel` at `pairs * NR` words, `y` at `M` rows of `nv <= NR`
/// writable values `ys` apart.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn hi_micro<const M: usize>(
    a: *const u32,
    pairs: usize,
    panel: *const u32,
    y: *mut f32,
    ys: usize,
    nv: usize,
) {
    use std::arch::x86_64::*;
    let (m0, m1) = masks(nv);
    let mut c0 = [_mm512_setzero_ps(); M];
    let mut c1 = [_mm512_setzero_ps(); M];
    for k in 0..pairs {
        // SAFETY: k < pairs words of every row and panel row k (the contract).
        unsafe {
            let b0: __m512bh = std::mem::transmute(_mm512_loadu_si512(panel.add(k * NR).cast()));
            let b1: __m512bh =
                std::mem::transmute(_mm512_loadu_si512(panel.add(k * NR + 16).cast()));
            for m in 0..M {
                let x: __m512bh =
                    std::mem::transmute(_mm512_set1_epi32(*a.add(m * pairs + k) as i32));
                c0[m] = _mm512_dpbf16_ps(c0[m], x, b0);
                c1[m] = _mm512_dpbf16_ps(c1[m], x, b1);
            }
        }
    }
    for m in 0..M {
        // SAFETY: row m of y has nv writable values; the masks write only
        // those (the second pointer may lie past the end: wrapping_add, empty mask).
        unsafe {
            _mm512_mask_storeu_ps(y.add(m * ys), m0, c0[m]);
            _mm512_mask_storeu_ps(y.wrapping_add(m * ys + 16), m1, c1[m]);
        }
    }
}

/// `y[m][j] += (sum_k lo[m][k] * q[j][k] - bias[j]) * sa[m] * sw[j]`: per
/// `k` quad two panel loads, `M` broadcasts, `2 M` `vpdpbusd` into 32-bit
/// sums, then one conversion and multiply-add per output.
///
/// # Safety
/// AVX-512F and VNNI; `a` points at `M` rows of `quads` words `quads` apart,
/// `panel` at `quads * NR` words, `sa` at `M` values, `sw` and `bias` at
/// `NR`, `y` at `M` rows of `nv <= NR` values `ys` apart.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vnni")]
#[allow(clippy::too_many_arguments)]
unsafe fn lo_micro<const M: usize>(
    a: *const u32,
    quads: usize,
    panel: *const u32,
    sa: *const f32,
    sw: *const f32,
    bias: *const i32,
    y: *mut f32,
    ys: usize,
    nv: usize,
) {
    use std::arch::x86_64::*;
    let mut c0 = [_mm512_setzero_si512(); M];
    let mut c1 = [_mm512_setzero_si512(); M];
    for k in 0..quads {
        // SAFETY: k < quads words of every row and panel row k (the contract).
        unsafe {
            let b0 = _mm512_loadu_si512(panel.add(k * NR).cast());
            let b1 = _mm512_loadu_si512(panel.add(k * NR + 16).cast());
            for m in 0..M {
                let x = _mm512_set1_epi32(*a.add(m * quads + k) as i32);
                c0[m] = _mm512_dpbusd_epi32(c0[m], x, b0);
                c1[m] = _mm512_dpbusd_epi32(c1[m], x, b1);
            }
        }
    }
    let (m0, m1) = masks(nv);
    // SAFETY: NR scales and biases (the contract).
    let (s0, s1, b0, b1) = unsafe {
        (
            _mm512_loadu_ps(sw),
            _mm512_loadu_ps(sw.add(16)),
            _mm512_loadu_si512(bias.cast()),
            _mm512_loadu_si512(bias.add(16).cast()),
        )
    };
    for m in 0..M {
        // SAFETY: as in hi_micro; sa holds M values.
        unsafe {
            let s = _mm512_set1_ps(*sa.add(m));
            let (p0, p1) = (y.add(m * ys), y.wrapping_add(m * ys + 16));
            let f0 = _mm512_cvtepi32_ps(_mm512_sub_epi32(c0[m], b0));
            let f1 = _mm512_cvtepi32_ps(_mm512_sub_epi32(c1[m], b1));
            let r0 = _mm512_fmadd_ps(f0, _mm512_mul_ps(s, s0), _mm512_maskz_loadu_ps(m0, p0));
            let r1 = _mm512_fmadd_ps(f1, _mm512_mul_ps(s, s1), _mm512_maskz_loadu_ps(m1, p1));
            _mm512_mask_storeu_ps(p0, m0, r0);
            _mm512_mask_storeu_ps(p1, m1, r1);
        }
    }
}

/// Never called off x86-64 (every caller asserts [`supported`] first).
///
/// # Safety
/// None needed.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn hi_micro<const M: usize>(
    _: *const u32,
    _: usize,
    _: *const u32,
    _: *mut f32,
    _: usize,
    _: usize,
) {
    unreachable!("AVX-512 BF16 is asserted before any call")
}

/// Never called off x86-64 (every caller asserts [`supported`] first).
///
/// # Safety
/// None needed.
#[cfg(not(target_arch = "x86_64"))]
#[allow(clippy::too_many_arguments)]
unsafe fn lo_micro<const M: usize>(
    _: *const u32,
    _: usize,
    _: *const u32,
    _: *const f32,
    _: *const f32,
    _: *const i32,
    _: *mut f32,
    _: usize,
    _: usize,
) {
    unreachable!("AVX-512 VNNI is asserted before any call")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bf16_round(v: f32) -> f32 {
        bf16::from_f32(v).to_f32()
    }

    /// Every output within the split's bound of the exact f64 product, on
    /// ragged shapes (odd `inp`, partial panels and tiles), and each row's
    /// bits independent of the rows beside it.
    #[test]
    fn matches_the_exact_product_within_the_remainder_rounding() {
        if !crate::isa::test_runs_here(
            supported(),
            concat!(
                module_path!(),
                "::matches_the_exact_product_within_the_remainder_rounding"
            ),
            "AVX-512 BF16 and VNNI",
        ) {
            return;
        }
        for &(t, inp, out) in &[
            (1, 5, 3),
            (13, 37, 33),
            (25, 64, 70),
            (12, 100, 32),
            (30, 96, 64),
        ] {
            let x: Vec<f32> = (0..t * inp)
                .map(|i| ((i as f32 * 0.731).sin() * 3.0) + if i % 17 == 0 { 20.0 } else { 0.0 })
                .collect();
            let w: Vec<bf16> = (0..out * inp)
                .map(|i| bf16::from_f32((i as f32 * 0.377).cos() * 0.5))
                .collect();
            let (pw, lo) = (PairPanels::new(&w, inp, out), LoWeights::new(&w, inp, out));
            let mut acts = SplitActs::default();
            let mut y = vec![f32::NAN; t * out];
            matmul_split(&x, &pw, &lo, &mut y, &mut acts);
            for ti in 0..t {
                let row = &x[ti * inp..][..inp];
                let xmax = row.iter().fold(0f32, |m, v| m.max(v.abs()));
                for o in 0..out {
                    let wr = &w[o * inp..][..inp];
                    let want: f64 = row
                        .iter()
                        .zip(wr)
                        .map(|(a, b)| *a as f64 * b.to_f32() as f64)
                        .sum();
                    let hi: f64 = row
                        .iter()
                        .zip(wr)
                        .map(|(a, b)| bf16_round(*a) as f64 * b.to_f32() as f64)
                        .sum();
                    let wsum: f64 = wr.iter().map(|b| b.to_f32().abs() as f64).sum();
                    // remainder rounding (half a step of max|lo| / 127 <=
                    // xmax * 2^-9 / 127) times the weights, the weights'
                    // 8-bit rounding times the remainders, f32 sums
                    let bound = wsum * xmax as f64 * (2f64.powi(-9) / 127.0)
                        + 1e-5 * (want.abs() + wsum * xmax as f64);
                    let got = y[ti * out + o] as f64;
                    assert!(
                        (got - want).abs() <= bound,
                        "T={t} {inp}x{out} ({ti},{o}) {got} vs {want} (bf16 alone {hi})"
                    );
                }
                // the same row alone gives the same bits
                let mut y1 = vec![0f32; out];
                matmul_split(row, &pw, &lo, &mut y1, &mut acts);
                assert_eq!(y1, &y[ti * out..][..out], "row {ti} alone differs");
            }
        }
    }

    /// The split is far closer to the exact product than BF16 activations.
    #[test]
    fn is_far_closer_than_bf16_activations() {
        if !crate::isa::test_runs_here(
            supported(),
            concat!(module_path!(), "::is_far_closer_than_bf16_activations"),
            "AVX-512 BF16 and VNNI",
        ) {
            return;
        }
        let (t, inp, out) = (16, 576, 64);
        let x: Vec<f32> = (0..t * inp)
            .map(|i| (i as f32 * 0.917).sin() * (1.0 + (i % 29) as f32))
            .collect();
        let w: Vec<bf16> = (0..out * inp)
            .map(|i| bf16::from_f32((i as f32 * 0.113).cos() * 0.05))
            .collect();
        let (pw, lo) = (PairPanels::new(&w, inp, out), LoWeights::new(&w, inp, out));
        let mut y = vec![0f32; t * out];
        matmul_split(&x, &pw, &lo, &mut y, &mut SplitActs::default());
        let (mut e_split, mut e_bf16, mut norm) = (0f64, 0f64, 0f64);
        for ti in 0..t {
            for o in 0..out {
                let pairs = x[ti * inp..][..inp].iter().zip(&w[o * inp..][..inp]);
                let want: f64 = pairs
                    .clone()
                    .map(|(a, b)| *a as f64 * b.to_f32() as f64)
                    .sum();
                let hi: f64 = pairs
                    .map(|(a, b)| bf16_round(*a) as f64 * b.to_f32() as f64)
                    .sum();
                e_split += (y[ti * out + o] as f64 - want).powi(2);
                e_bf16 += (hi - want).powi(2);
                norm += want * want;
            }
        }
        let (e_split, e_bf16) = ((e_split / norm).sqrt(), (e_bf16 / norm).sqrt());
        assert!(
            e_split * 50.0 < e_bf16,
            "split {e_split:e}, bf16 {e_bf16:e}"
        );
    }

    /// The 8-bit copy is `round(w / (max|w| / 127))` per row, packed by
    /// quads, with the offset's bias; zero rows and edges stay zero.
    #[test]
    fn quantises_each_row_like_the_scalar_definition() {
        if !crate::isa::test_runs_here(
            supported(),
            concat!(
                module_path!(),
                "::quantises_each_row_like_the_scalar_definition"
            ),
            "AVX-512 BF16 and VNNI",
        ) {
            return;
        }
        let (inp, out) = (37, 45);
        let mut w: Vec<bf16> = (0..out * inp)
            .map(|i| bf16::from_f32((i as f32 * 0.71).sin() * (1 + i % 5) as f32))
            .collect();
        w[3 * inp..4 * inp].fill(bf16::ZERO);
        let lo = LoWeights::new(&w, inp, out);
        for o in 0..lo.scale.len() {
            let (p, j) = (o / NR, o % NR);
            let row = (o < out).then(|| &w[o * inp..][..inp]);
            let max = row.map_or(0.0, |r| r.iter().fold(0f32, |m, v| m.max(v.to_f32().abs())));
            let s = max / 127.0;
            assert_eq!(lo.scale[o], s, "row {o}");
            let mut sum = 0;
            for k in 0..lo.quads * 4 {
                let want = match row {
                    Some(r) if k < inp && max > 0.0 => (r[k].to_f32() / s).round_ties_even() as i8,
                    _ => 0,
                };
                sum += i32::from(want);
                let got = lo.panels[((p * lo.quads + k / 4) * NR + j) * 4 + k % 4];
                assert_eq!(got, want, "row {o} k {k}");
            }
            assert_eq!(lo.bias[o], 128 * sum, "row {o}");
        }
    }
}
