//! The prefill GEMM on AVX-512F: `y = x @ W^T` for many tokens, BF16
//! weights widened into packed f32 panels, a 12 x 32 register tile.
//!
//! Contract: [`matmul`] computes what [`crate::matmul::matmul_bf16`]
//! computes (`x` `[T, inp]`, `w` `[out, inp]` BF16, `y` `[T, out]`), each
//! output the sum over `k` in increasing order of exact f32 products (the
//! naive order). The `gemm` crate's x86 kernels stop at AVX2 without its
//! nightly feature; this one uses the 32 zmm registers: per `k` two 16-lane
//! loads of the packed panel, twelve broadcasts of `x`, 24 FMAs.
//!
//! [`Packed`] / [`matmul_packed`] are the same kernel over an f32 matrix
//! packed once, with strided activations and outputs, on the calling
//! thread (attention's products, `matmul::gemm_nt_f32`).
//!
//! Costs: `T * out * inp` multiply-adds; [`matmul`]'s tasks each pack their
//! panels of [`NR`] weight rows (`inp * NR * 4` bytes, reused for every
//! token tile), so `W` is read once per call; work split over panels on
//! rayon.

use crate::OutPtr;
use half::bf16;
use rayon::prelude::*;

/// Tokens per register tile.
pub const MR: usize = 12;
/// Weight rows (outputs) per register tile and packed panel.
pub const NR: usize = 32;

/// `y = x @ W^T` on AVX-512F (see the module doc), parallel over panels.
/// Panics if the lengths disagree or the processor lacks AVX-512F (callers
/// check [`crate::Isa`]).
pub fn matmul(x: &[f32], w: &[bf16], inp: usize, out: usize, y: &mut [f32]) {
    assert!(crate::Isa::Avx512.supported(), "AVX-512F is required");
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
    let yp = OutPtr(y.as_mut_ptr());
    let run = |panel: &mut Vec<f32>, p: usize| {
        let (o0, o1) = (p * NR, ((p + 1) * NR).min(out));
        pack(w, inp, o0, o1, panel);
        for t0 in (0..t).step_by(MR) {
            // SAFETY: AVX-512F asserted above; rows t0..t0 + mr of x and y
            // are in bounds (asserted); the panel holds inp * NR values;
            // columns o0..o1 of y belong to this panel only.
            unsafe {
                micro_dispatch(
                    MR.min(t - t0),
                    x.as_ptr().add(t0 * inp),
                    inp,
                    inp,
                    panel.as_ptr(),
                    yp.get().add(t0 * out + o0),
                    out,
                    o1 - o0,
                )
            };
        }
    };
    (0..out.div_ceil(NR))
        .into_par_iter()
        .for_each_init(|| vec![0f32; inp * NR], run);
}

/// Floats from which [`Packed`]'s constructors fill panels in parallel.
const PARALLEL_PACK: usize = 1 << 15;

/// An f32 matrix `[out, inp]` packed once as the micro-kernel's panels
/// (`[out / NR][inp][NR]`, zero past `out`), for many products against it
/// ([`matmul_packed`]): attention packs each KV head's keys and values once
/// per chunk instead of once per (query head, block of rows).
#[derive(Default)]
pub struct Packed {
    data: Vec<f32>,
    inp: usize,
    out: usize,
}

impl Packed {
    /// Packs rows `row(o)` (`inp` values each, `o < out`), through the
    /// register transpose. Panics if a row is shorter than `inp` or the
    /// processor lacks AVX-512F.
    pub fn from_rows<'a>(inp: usize, out: usize, row: impl Fn(usize) -> &'a [f32] + Sync) -> Self {
        let mut p = Packed::default();
        p.refill_rows(inp, out, row);
        p
    }

    /// [`Packed::from_rows`] into this matrix's storage (grown, never
    /// shrunk: a caller packing every chunk allocates once).
    pub fn refill_rows<'a>(
        &mut self,
        inp: usize,
        out: usize,
        row: impl Fn(usize) -> &'a [f32] + Sync,
    ) {
        assert!(crate::Isa::Avx512.supported(), "AVX-512F is required");
        self.build(inp, out, |p, panel| {
            let (o0, o1) = (p * NR, ((p + 1) * NR).min(out));
            let rows: Vec<&[f32]> = (o0..o1).map(|o| &row(o)[..inp]).collect();
            let whole = if o1 - o0 == NR { inp / 16 * 16 } else { 0 };
            #[cfg(target_arch = "x86_64")]
            if whole > 0 {
                // SAFETY: AVX-512F (asserted); every row holds inp >= k0 + 16
                // values; the panel holds inp * NR >= whole * NR values.
                unsafe {
                    pack_blocks(whole, panel.as_mut_ptr(), |i, k0| {
                        std::arch::x86_64::_mm512_loadu_ps(rows[i].as_ptr().add(k0))
                    })
                };
            }
            for (k, dst) in panel.chunks_exact_mut(NR).enumerate().skip(whole) {
                for (v, r) in dst.iter_mut().zip(&rows) {
                    *v = r[k];
                }
            }
        })
    }

    /// Packs the transposed view: `col(k)` holds the `out` values of input
    /// `k` (`k < inp`), copied as they are. Panics if one is shorter than `out`.
    pub fn from_columns<'a>(
        inp: usize,
        out: usize,
        col: impl Fn(usize) -> &'a [f32] + Sync,
    ) -> Self {
        let mut p = Packed::default();
        p.refill_columns(inp, out, col);
        p
    }

    /// [`Packed::from_columns`] into this matrix's storage (grown, never shrunk).
    pub fn refill_columns<'a>(
        &mut self,
        inp: usize,
        out: usize,
        col: impl Fn(usize) -> &'a [f32] + Sync,
    ) {
        self.build(inp, out, |p, panel| {
            let (o0, o1) = (p * NR, ((p + 1) * NR).min(out));
            for (k, dst) in panel.chunks_exact_mut(NR).enumerate() {
                dst[..o1 - o0].copy_from_slice(&col(k)[o0..o1]);
            }
        })
    }

    /// Zeroed panels in this matrix's storage, each filled by `fill(p,
    /// panel)` (in parallel for large matrices).
    fn build(&mut self, inp: usize, out: usize, fill: impl Fn(usize, &mut [f32]) + Sync) {
        let panels = out.div_ceil(NR);
        self.data.clear();
        self.data.resize(panels * inp * NR, 0.0);
        (self.inp, self.out) = (inp, out);
        if inp > 0 {
            let chunks = self.data.par_chunks_mut(inp * NR).enumerate();
            if panels * inp * NR >= PARALLEL_PACK {
                chunks.for_each(|(p, panel)| fill(p, panel));
            } else {
                chunks
                    .with_min_len(panels)
                    .for_each(|(p, panel)| fill(p, panel));
            }
        }
    }
}

/// `y[i][o] = sum_{k < inp} x[i][k] * w[o][k]` for `i < t`, `o < out`, over
/// the first `inp <= w.inp` inputs and `out <= w.out` outputs of packed `w`,
/// `x` rows `x_stride` apart and `y` rows `y_stride` apart, on the calling
/// thread: the same kernel, so the same bits, as [`matmul`] over
/// the unpacked matrix. Panics if a view is out of bounds or the processor
/// lacks AVX-512F.
#[allow(clippy::too_many_arguments)]
pub fn matmul_packed(
    x: &[f32],
    x_stride: usize,
    t: usize,
    w: &Packed,
    inp: usize,
    out: usize,
    y: &mut [f32],
    y_stride: usize,
) {
    assert!(crate::Isa::Avx512.supported(), "AVX-512F is required");
    if t == 0 || out == 0 {
        return;
    }
    assert!(
        inp > 0 && inp <= w.inp && out <= w.out,
        "beyond the packed matrix"
    );
    assert!(inp <= x_stride && out <= y_stride);
    assert!(x.len() >= (t - 1) * x_stride + inp, "x too short");
    assert!(y.len() >= (t - 1) * y_stride + out, "y too short");
    for p in 0..out.div_ceil(NR) {
        let o0 = p * NR;
        let nv = NR.min(out - o0);
        let panel = &w.data[p * w.inp * NR..][..w.inp * NR];
        for t0 in (0..t).step_by(MR) {
            // SAFETY: AVX-512F asserted; rows t0.. of x hold inp values,
            // of y out values from o0 (nv of them this panel's); the panel
            // holds inp <= w.inp rows of NR values.
            unsafe {
                micro_dispatch(
                    MR.min(t - t0),
                    x.as_ptr().add(t0 * x_stride),
                    x_stride,
                    inp,
                    panel.as_ptr(),
                    y.as_mut_ptr().add(t0 * y_stride + o0),
                    y_stride,
                    nv,
                )
            };
        }
    }
}

/// Packs weight rows `o0..o1` as f32 `[inp][NR]` (row `o` in lane `o - o0`,
/// lanes past `o1` zero): 16 x 16 blocks through registers (16 rows' next
/// 16 values loaded, widened, transposed, stored as 16 panel rows), the
/// ragged edges value by value. The whole matrix is widened once per call,
/// so this is `out * inp` of a product's `T * out * inp` work, at a few
/// instructions per 16 values rather than a scalar load and store each.
fn pack(w: &[bf16], inp: usize, o0: usize, o1: usize, panel: &mut [f32]) {
    let n = o1 - o0;
    if n < NR {
        panel.fill(0.0);
    }
    assert!(panel.len() >= inp * NR);
    let whole = if n == NR { inp / 16 * 16 } else { 0 };
    let bits: &[u16] = half::slice::HalfFloatSliceExt::reinterpret_cast(w);
    let rows = &bits[o0 * inp..o1 * inp];
    if whole > 0 {
        // SAFETY: AVX-512F (asserted by every caller); 32 rows of inp
        // values, k + 16 <= whole <= inp, panel >= inp * NR.
        unsafe { pack_blocks_bf16(rows.as_ptr(), inp, whole, panel.as_mut_ptr()) };
    }
    for (k, dst) in panel.chunks_exact_mut(NR).take(inp).enumerate().skip(whole) {
        for (j, v) in dst[..n].iter_mut().enumerate() {
            *v = f32::from_bits((rows[j * inp + k] as u32) << 16);
        }
    }
}

/// Transposes the 16 x 16 block `r` (row `i` = lanes of `r[i]`) in place.
///
/// # Safety
/// AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn transpose16(r: &mut [std::arch::x86_64::__m512; 16]) {
    use std::arch::x86_64::*;
    let mut t = [_mm512_setzero_ps(); 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    let (lo, hi) = (
        |a: __m512, b: __m512| {
            _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)))
        },
        |a: __m512, b: __m512| {
            _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)))
        },
    );
    for g in 0..4 {
        let b = 4 * g;
        r[b] = lo(t[b], t[b + 2]);
        r[b + 1] = hi(t[b], t[b + 2]);
        r[b + 2] = lo(t[b + 1], t[b + 3]);
        r[b + 3] = hi(t[b + 1], t[b + 3]);
    }
    for h in 0..2 {
        let b = 8 * h;
        for i in 0..4 {
            t[b + i] = _mm512_shuffle_f32x4::<0x88>(r[b + i], r[b + i + 4]);
            t[b + i + 4] = _mm512_shuffle_f32x4::<0xdd>(r[b + i], r[b + i + 4]);
        }
    }
    for i in 0..8 {
        r[i] = _mm512_shuffle_f32x4::<0x88>(t[i], t[i + 8]);
        r[i + 8] = _mm512_shuffle_f32x4::<0xdd>(t[i], t[i + 8]);
    }
}

/// Packs columns `0..whole` (a multiple of 16) of [`NR`] BF16 rows `inp`
/// apart into `panel` `[k][NR]`, widened.
///
/// # Safety
/// AVX-512F; `rows` holds `NR` rows of `inp >= whole` values, `panel`
/// `whole * NR` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn pack_blocks_bf16(rows: *const u16, inp: usize, whole: usize, panel: *mut f32) {
    use std::arch::x86_64::*;
    // SAFETY: forwarded; each load reads 16 values of a row from k0 < whole.
    unsafe {
        pack_blocks(whole, panel, |i, k0| {
            let h = _mm256_loadu_si256(rows.add(i * inp + k0).cast());
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
        })
    }
}

/// The 16 x 16 blocks of the panel packs (here and in `pairs`, `quant::gemm`): `load(i, k0)` gives row `i`'s
/// values `k0..k0 + 16` as f32.
///
/// # Safety
/// AVX-512F; `load` is sound for `i < NR` and `k0 + 16 <= whole`; `panel`
/// holds `whole * NR` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) unsafe fn pack_blocks(
    whole: usize,
    panel: *mut f32,
    load: impl Fn(usize, usize) -> std::arch::x86_64::__m512,
) {
    use std::arch::x86_64::*;
    for k0 in (0..whole).step_by(16) {
        for g in 0..NR / 16 {
            let mut r: [__m512; 16] = std::array::from_fn(|i| load(g * 16 + i, k0));
            // SAFETY: AVX-512F (this function's contract).
            unsafe { transpose16(&mut r) };
            for (i, v) in r.iter().enumerate() {
                // SAFETY: panel row k0 + i < whole, lanes g * 16.. + 16 <= NR.
                unsafe { _mm512_storeu_ps(panel.add((k0 + i) * NR + g * 16), *v) };
            }
        }
    }
}

/// Never called off x86-64 (every caller asserts AVX-512F first).
///
/// # Safety
/// None needed.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn pack_blocks_bf16(_: *const u16, _: usize, _: usize, _: *mut f32) {
    unreachable!("AVX-512F is asserted before any call")
}

/// # Safety
/// AVX-512F; `x` points at `mr` rows of `inp` values `xs` apart, `panel` at
/// `inp * NR` values, `y` at `mr` rows of `nv <= NR` writable values `ys`
/// apart.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn micro_dispatch(
    mr: usize,
    x: *const f32,
    xs: usize,
    inp: usize,
    panel: *const f32,
    y: *mut f32,
    ys: usize,
    nv: usize,
) {
    macro_rules! go {
        ($($m:literal)*) => {
            match mr {
                // SAFETY: forwarded from this function's contract.
                $($m => unsafe { micro::<$m>(x, xs, inp, panel, y, ys, nv) },)*
                _ => unreachable!("mr is 1..=MR"),
            }
        };
    }
    go!(1 2 3 4 5 6 7 8 9 10 11 12)
}

/// Never called off x86-64 ([`matmul_strided`] asserts AVX-512F first).
///
/// # Safety
/// None needed; unsafe only to match the x86-64 signature.
#[cfg(not(target_arch = "x86_64"))]
#[allow(clippy::too_many_arguments)]
unsafe fn micro_dispatch(
    _: usize,
    _: *const f32,
    _: usize,
    _: usize,
    _: *const f32,
    _: *mut f32,
    _: usize,
    _: usize,
) {
    unreachable!("AVX-512F is asserted before any call")
}

/// `y[m][j] = sum_k x[m][k] * panel[k][j]` for `m < M`, `j < nv`, stored
/// straight from the registers (masked for a partial panel).
///
/// # Safety
/// As [`micro_dispatch`] with `mr = M`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn micro<const M: usize>(
    x: *const f32,
    xs: usize,
    inp: usize,
    panel: *const f32,
    y: *mut f32,
    ys: usize,
    nv: usize,
) {
    use std::arch::x86_64::*;
    let mut c0 = [_mm512_setzero_ps(); M];
    let mut c1 = [_mm512_setzero_ps(); M];
    for k in 0..inp {
        // SAFETY: k * NR + 32 <= inp * NR panel values; x row m holds inp
        // values (the contract).
        unsafe {
            let b0 = _mm512_loadu_ps(panel.add(k * NR));
            let b1 = _mm512_loadu_ps(panel.add(k * NR + 16));
            for m in 0..M {
                let a = _mm512_set1_ps(*x.add(m * xs + k));
                c0[m] = _mm512_fmadd_ps(a, b0, c0[m]);
                c1[m] = _mm512_fmadd_ps(a, b1, c1[m]);
            }
        }
    }
    let lanes = |n: usize| -> __mmask16 { if n >= 16 { 0xFFFF } else { (1u16 << n) - 1 } };
    let (m0, m1) = (lanes(nv), lanes(nv.saturating_sub(16)));
    for m in 0..M {
        // SAFETY: row m of y has nv writable values (the contract); the
        // masks write only those (the second pointer may lie past the end
        // when nv <= 16: wrapping_add, and its mask is empty).
        unsafe {
            _mm512_mask_storeu_ps(y.add(m * ys), m0, c0[m]);
            _mm512_mask_storeu_ps(y.wrapping_add(m * ys + 16), m1, c1[m]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_naive_product_on_ragged_shapes() {
        if !crate::isa::test_runs_here(
            crate::Isa::Avx512.supported(),
            concat!(
                module_path!(),
                "::matches_the_naive_product_on_ragged_shapes"
            ),
            "AVX-512F",
        ) {
            return;
        }
        for &(t, inp, out) in &[(1, 5, 3), (13, 37, 33), (25, 64, 70), (12, 100, 32)] {
            let x: Vec<f32> = (0..t * inp)
                .map(|i| ((i * 7 % 13) as f32 - 6.0) / 5.0)
                .collect();
            let w: Vec<bf16> = (0..out * inp)
                .map(|i| bf16::from_f32(((i * 5 % 11) as f32 - 5.0) / 8.0))
                .collect();
            let mut y = vec![f32::NAN; t * out];
            matmul(&x, &w, inp, out, &mut y);
            for ti in 0..t {
                for o in 0..out {
                    let want: f32 = (0..inp)
                        .map(|i| x[ti * inp + i] * w[o * inp + i].to_f32())
                        .sum();
                    let got = y[ti * out + o];
                    assert!(
                        (got - want).abs() < 1e-4,
                        "T={t} ({ti},{o}) {got} vs {want}"
                    );
                }
            }
        }
    }

    /// Products against packed rows and packed columns are the naive
    /// product's fused chain (`k` in order) bit for bit, on the leading
    /// inputs and outputs too.
    #[test]
    fn packed_products_are_the_naive_chain() {
        if !crate::isa::test_runs_here(
            crate::Isa::Avx512.supported(),
            concat!(module_path!(), "::packed_products_are_the_naive_chain"),
            "AVX-512F",
        ) {
            return;
        }
        for &(t, inp, out) in &[(5, 64, 40), (13, 37, 96), (30, 100, 33)] {
            let x: Vec<f32> = (0..t * inp).map(|i| (i as f32 * 0.53).sin()).collect();
            let w: Vec<f32> = (0..out * inp).map(|i| (i as f32 * 0.29).cos()).collect();
            let wt: Vec<f32> = (0..inp * out)
                .map(|i| w[(i % out) * inp + i / out])
                .collect();
            let rows = Packed::from_rows(inp, out, |o| &w[o * inp..][..inp]);
            let cols = Packed::from_columns(inp, out, |k| &wt[k * out..][..out]);
            for (i, o) in [(inp, out), (inp - 3, out - 5)] {
                let want: Vec<f32> = (0..t * o)
                    .map(|e| {
                        let (r, c) = (e / o, e % o);
                        (0..i).fold(0f32, |acc, k| x[r * inp + k].mul_add(w[c * inp + k], acc))
                    })
                    .collect();
                for p in [&rows, &cols] {
                    let mut got = vec![f32::NAN; t * o];
                    matmul_packed(&x, inp, t, p, i, o, &mut got, o);
                    assert_eq!(got, want, "T={t} {inp}x{out} using {i}x{o}");
                }
            }
        }
    }

    /// The blocked pack equals the value-by-value one on full and ragged
    /// panels.
    #[test]
    fn packs_like_the_scalar_transpose() {
        if !crate::isa::test_runs_here(
            crate::Isa::Avx512.supported(),
            concat!(module_path!(), "::packs_like_the_scalar_transpose"),
            "AVX-512F",
        ) {
            return;
        }
        for &(inp, out, o0, o1) in &[
            (48, 32, 0, 32),
            (37, 40, 0, 32),
            (64, 70, 64, 70),
            (16, 64, 32, 64),
        ] {
            let w: Vec<bf16> = (0..out * inp)
                .map(|i| bf16::from_f32((i as f32 * 0.37).sin()))
                .collect();
            let mut panel = vec![f32::NAN; inp * NR];
            pack(&w, inp, o0, o1, &mut panel);
            for k in 0..inp {
                for j in 0..NR {
                    let o = o0 + j;
                    let want = if o < o1 { w[o * inp + k].to_f32() } else { 0.0 };
                    assert_eq!(
                        panel[k * NR + j],
                        want,
                        "inp {inp} rows {o0}..{o1} k {k} j {j}"
                    );
                }
            }
        }
    }
}
