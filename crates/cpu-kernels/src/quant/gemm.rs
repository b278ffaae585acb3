//! Prompt rows of the quantised product as a GEMM on AVX-512 VNNI: the
//! outputs in the vector lanes, so no horizontal sums, and each block's
//! weights unpacked once per call for every token.
//!
//! Contract: [`matmul_quant_gemm`] computes what [`super::matmul_quant`]
//! computes from the same 16-bit activations ([`super::QuantActs`]) and the
//! same integer block sums, `Σ_b dw·dx·(Σ q·qx) (+ m·sx)`, with another
//! order of the f32 additions (per output, block after block), so it agrees
//! with it to f32 rounding, not bit for bit. Each row's result depends on
//! that row alone, never on `T` or on the other rows: the CPU backend runs
//! it for prompt tokens only, and every prompt token always so.
//!
//! Costs: per call the activations' quantisation (as `matmul_quant`), and
//! per panel of [`NR`] outputs its blocks unpacked into 16-bit `k` pairs
//! (`inp * NR * 2` bytes, through the register transpose) plus the blocks'
//! scales; then `T * out * inp` 16-bit multiply-adds in tiles of [`MR`]
//! tokens x [`NR`] outputs, each block's integer sums scaled into f32 once
//! per tile. Parallel over panels on rayon.

use super::x16::Panels16;
use super::{ActsRow, QK, QuantActs, QuantType};
use crate::OutPtr;
use crate::pairs::NR;
use rayon::prelude::*;

/// Tokens per register tile (2 x 5 integer and 2 x 5 f32 accumulators).
pub const MR: usize = 5;

/// Whether this processor runs [`matmul_quant_gemm`].
pub fn supported() -> bool {
    super::Kernel::Vnni.supported()
}

/// One panel's weights, unpacked: `q` `[inp / 2][NR]` words (two 16-bit
/// weights of consecutive `k`), `d` and `m` `[units][NR]` the scales and
/// minimums of the scale units ([`QuantType::scale_len`] weights: blocks
/// of [`QK`], Q4_K's sub-blocks, Q6_K's groups of 16; 0 past the matrix's
/// rows and for `m` without minimums).
struct Panel {
    q: Vec<u32>,
    d: Vec<f32>,
    m: Vec<f32>,
}

/// `y = x @ W^T` (see the module doc): `x` `[T, inp]`, `w` `[out, inp]` in
/// `qt` blocks, `y` `[T, out]`. Panics if the lengths disagree, `inp` is
/// not a whole number of blocks or the processor lacks what [`supported`]
/// checks.
pub fn matmul_quant_gemm(
    x: &[f32],
    w: &[u8],
    qt: QuantType,
    inp: usize,
    out: usize,
    y: &mut [f32],
    acts: &mut QuantActs,
) {
    assert!(supported(), "AVX-512 VNNI is required");
    let Some((_, row_bytes)) = super::check_shapes(x, w, qt, inp, out, y) else {
        return;
    };
    let blocks = inp / QK;
    gemm(x, qt, inp, out, y, acts, |p, nv, panel| {
        let o0 = p * NR;
        unpack(
            &w[o0 * row_bytes..(o0 + nv) * row_bytes],
            qt,
            blocks,
            nv,
            panel,
        )
    });
}

/// [`matmul_quant_gemm`] over a matrix in 16-row panels
/// ([`Panels16`]): the same integer sums and f32 order, so the same bits.
pub fn matmul_panels_gemm(x: &[f32], w: &Panels16, y: &mut [f32], acts: &mut QuantActs) {
    assert!(supported(), "AVX-512 VNNI is required");
    let (inp, out) = (w.inp(), w.rows());
    assert!(x.len().is_multiple_of(inp), "x is not [T, {inp}]");
    assert_eq!(y.len(), x.len() / inp * out, "y is not [T, {out}]");
    gemm(x, w.quant_type(), inp, out, y, acts, |p, nv, panel| {
        w.unpack_gemm(p * NR, nv, &mut panel.q, &mut panel.d, &mut panel.m)
    });
}

/// The GEMM over panels of [`NR`] outputs that `unpack(p, nv, panel)`
/// fills (panel `p`, its `nv` rows), on rayon.
#[allow(clippy::too_many_arguments)]
fn gemm(
    x: &[f32],
    qt: QuantType,
    inp: usize,
    out: usize,
    y: &mut [f32],
    acts: &mut QuantActs,
    unpack: impl Fn(usize, usize, &mut Panel) + Sync,
) {
    let t = x.len() / inp;
    if t == 0 || out == 0 {
        return;
    }
    acts.quantize_grouped(x, inp, qt.act_group());
    let acts = &*acts;
    let blocks = inp / QK;
    let yp = OutPtr(y.as_mut_ptr());
    let run = |panel: &mut Panel, p: usize| {
        let (o0, nv) = (p * NR, NR.min(out - p * NR));
        unpack(p, nv, panel);
        for t0 in (0..t).step_by(MR) {
            let mr = MR.min(t - t0);
            let rows: [ActsRow<'_>; MR] = std::array::from_fn(|m| acts.row((t0 + m).min(t - 1)));
            // SAFETY: VNNI (asserted); rows t0..t0 + mr exist, each with
            // blocks * QK values and blocks scales; the panel holds inp / 2
            // * NR words and (blocks * units per block) * NR scales; y's
            // rows hold out values from o0 with nv of them this panel's
            // alone.
            unsafe {
                let tile = if qt.scale_len() == QK {
                    tile_dispatch
                } else {
                    tile_dispatch_halves
                };
                tile(
                    mr,
                    &rows[..mr],
                    panel,
                    blocks,
                    qt.has_min(),
                    yp.get().add(t0 * out + o0),
                    out,
                    nv,
                )
            };
        }
    };
    let units = inp / qt.scale_len();
    let new_panel = || Panel {
        q: vec![0; inp / 2 * NR],
        d: vec![0.0; units * NR],
        m: vec![0.0; units * NR],
    };
    let panels = out.div_ceil(NR);
    if panels > 1 && t * inp * out >= 1 << 16 {
        (0..panels).into_par_iter().for_each_init(new_panel, run);
    } else {
        let mut panel = new_panel();
        for p in 0..panels {
            run(&mut panel, p);
        }
    }
}

/// Unpacks `nv <= NR` rows of `blocks` blocks of [`QK`] into `panel` (rows
/// past `nv` zero).
fn unpack(w: &[u8], qt: QuantType, blocks: usize, nv: usize, panel: &mut Panel) {
    let row_bytes = qt.matrix_bytes(1, blocks * QK);
    let units = blocks * QK / qt.scale_len();
    for j in 0..NR {
        if j < nv {
            super::for_each_unit(qt, &w[j * row_bytes..(j + 1) * row_bytes], |u, d, m| {
                panel.d[u * NR + j] = d;
                panel.m[u * NR + j] = m;
            });
        } else {
            for u in 0..units {
                panel.d[u * NR + j] = 0.0;
                panel.m[u * NR + j] = 0.0;
            }
        }
    }
    #[cfg(target_arch = "x86_64")]
    {
        let (wp, bb) = (w.as_ptr(), qt.block_bytes());
        // SAFETY: VNNI and BW (asserted by matmul_quant_gemm); every load
        // reads within block k0 / 16 < blocks (of QK) of a row i < nv; the
        // panel holds blocks * 16 * NR words.
        unsafe {
            crate::gemm512::pack_blocks(blocks * 16, panel.q.as_mut_ptr().cast(), |i, k0| {
                use std::arch::x86_64::*;
                if i >= nv {
                    return _mm512_setzero_ps();
                }
                let row = wp.add(i * row_bytes);
                _mm512_castsi512_ps(match qt {
                    QuantType::Q4_1 => super::dot::q4_1_unpack_vnni(row.add(k0 / 16 * bb)),
                    QuantType::Q8_0 => super::dot::q8_0_unpack_vnni(row.add(k0 / 16 * bb)),
                    QuantType::Q4_K => super::q4k::unpack_sub_vnni(row, k0 / 16),
                    QuantType::Q6_K => super::q6k::unpack_sub_vnni(row, k0 / 16),
                })
            })
        };
    }
}

crate::pairs::dispatch!(tile_dispatch, tile [1], (a: &[ActsRow<'_>], panel: &Panel, blocks: usize, has_min: bool, y: *mut f32, ys: usize, nv: usize));
crate::pairs::dispatch!(tile_dispatch_halves, tile [2], (a: &[ActsRow<'_>], panel: &Panel, blocks: usize, has_min: bool, y: *mut f32, ys: usize, nv: usize));

/// `y[m][j] = Σ_u (dw[u][j]·dx[m][b]) · (Σ_{k in u} q[j][k]·qx[m][k]) (+
/// m[u][j] · sx[m][b])` over the `H` scale units `u` of each block `b`, for
/// `m < M`, `j < nv`: per `k` pair two panel loads, `M`
/// broadcasts, `2 M` `vpdpwssd`; per unit one conversion, scale and FMA
/// per accumulator.
///
/// # Safety
/// AVX-512F, BW and VNNI; `a` holds `M` rows of `blocks` blocks, the panel
/// `blocks * 16 * NR` words and `blocks * H * NR` scales, `y` `M` rows of `nv
/// <= NR` writable values `ys` apart.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<const M: usize, const H: usize>(
    a: &[ActsRow<'_>],
    panel: &Panel,
    blocks: usize,
    has_min: bool,
    y: *mut f32,
    ys: usize,
    nv: usize,
) {
    use std::arch::x86_64::*;
    let mut f0 = [_mm512_setzero_ps(); M];
    let mut f1 = [_mm512_setzero_ps(); M];
    let xs: [*const i32; M] = std::array::from_fn(|m| a[m].q.as_ptr().cast());
    let qp = panel.q.as_ptr();
    let per = 16 / H; // k pairs per scale unit
    for b in 0..blocks {
        for h in 0..H {
            let mut i0 = [_mm512_setzero_si512(); M];
            let mut i1 = [_mm512_setzero_si512(); M];
            let k0 = b * 16 + h * per;
            for k in k0..k0 + per {
                // SAFETY: pair k < blocks * 16 of every row and of the panel.
                unsafe {
                    let w0 = _mm512_loadu_si512(qp.add(k * NR).cast());
                    let w1 = _mm512_loadu_si512(qp.add(k * NR + 16).cast());
                    for m in 0..M {
                        let x = _mm512_set1_epi32(*xs[m].add(k));
                        i0[m] = _mm512_dpwssd_epi32(i0[m], w0, x);
                        i1[m] = _mm512_dpwssd_epi32(i1[m], w1, x);
                    }
                }
            }
            let u = b * H + h;
            // SAFETY: unit u's NR scales and minimums.
            let (d0, d1, m0, m1) = unsafe {
                (
                    _mm512_loadu_ps(panel.d.as_ptr().add(u * NR)),
                    _mm512_loadu_ps(panel.d.as_ptr().add(u * NR + 16)),
                    _mm512_loadu_ps(panel.m.as_ptr().add(u * NR)),
                    _mm512_loadu_ps(panel.m.as_ptr().add(u * NR + 16)),
                )
            };
            for m in 0..M {
                let [dx, sx] = a[m].ds[b];
                let dx = _mm512_set1_ps(dx);
                f0[m] = _mm512_fmadd_ps(_mm512_mul_ps(d0, dx), _mm512_cvtepi32_ps(i0[m]), f0[m]);
                f1[m] = _mm512_fmadd_ps(_mm512_mul_ps(d1, dx), _mm512_cvtepi32_ps(i1[m]), f1[m]);
                if has_min {
                    let sx = _mm512_set1_ps(sx);
                    f0[m] = _mm512_fmadd_ps(m0, sx, f0[m]);
                    f1[m] = _mm512_fmadd_ps(m1, sx, f1[m]);
                }
            }
        }
    }
    let (k0, k1) = crate::pairs::masks(nv);
    for m in 0..M {
        // SAFETY: row m of y has nv writable values; the masks write only
        // those (the second pointer may lie past the end: wrapping_add,
        // empty mask).
        unsafe {
            _mm512_mask_storeu_ps(y.add(m * ys), k0, f0[m]);
            _mm512_mask_storeu_ps(y.wrapping_add(m * ys + 16), k1, f1[m]);
        }
    }
}

/// Never called off x86-64 (every caller asserts [`supported`] first).
///
/// # Safety
/// None needed.
#[cfg(not(target_arch = "x86_64"))]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<const M: usize, const H: usize>(
    _: &[ActsRow<'_>],
    _: &Panel,
    _: usize,
    _: bool,
    _: *mut f32,
    _: usize,
    _: usize,
) {
    unreachable!("AVX-512 VNNI is asserted before any call")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Isa;
    use crate::quant::{matmul_quant, quantize_row};

    /// Close to the row-by-row kernel (same integer sums, another order of
    /// the f32 additions) on ragged shapes, and each row's bits the same
    /// alone as in a batch.
    #[test]
    fn agrees_with_the_row_kernel_and_rows_are_independent() {
        if !crate::isa::test_runs_here(
            supported(),
            concat!(
                module_path!(),
                "::agrees_with_the_row_kernel_and_rows_are_independent"
            ),
            "AVX-512 VNNI",
        ) {
            return;
        }
        let shapes: [(usize, usize, usize); 6] = [
            (1, 32, 3),
            (7, 64, 33),
            (13, 96, 70),
            (12, 576, 64),
            (6, 256, 40),
            (11, 768, 33),
        ];
        for qt in [
            QuantType::Q4_1,
            QuantType::Q8_0,
            QuantType::Q4_K,
            QuantType::Q6_K,
        ] {
            let fits = shapes.iter().filter(|s| s.1.is_multiple_of(qt.block_len()));
            for &(t, inp, out) in fits {
                let x: Vec<f32> = (0..t * inp)
                    .map(|i| (i as f32 * 0.37).sin() * 2.0)
                    .collect();
                let wf: Vec<f32> = (0..out * inp)
                    .map(|i| (i as f32 * 0.61).cos() * 0.4)
                    .collect();
                let mut w = Vec::new();
                for r in wf.chunks_exact(inp) {
                    quantize_row(qt, r, &mut w);
                }
                let mut acts = QuantActs::default();
                let mut want = vec![0f32; t * out];
                matmul_quant(Isa::best(), &x, &w, qt, inp, out, &mut want, &mut acts);
                let mut got = vec![f32::NAN; t * out];
                matmul_quant_gemm(&x, &w, qt, inp, out, &mut got, &mut acts);
                for (i, (g, v)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (g - v).abs() <= 1e-5 * (1.0 + v.abs()),
                        "{qt:?} T={t} {inp}x{out} [{i}] {g} vs {v}"
                    );
                }
                for n in 0..t {
                    let mut one = vec![0f32; out];
                    matmul_quant_gemm(&x[n * inp..][..inp], &w, qt, inp, out, &mut one, &mut acts);
                    assert_eq!(one, &got[n * out..][..out], "{qt:?} row {n} alone");
                }
            }
        }
    }
}
