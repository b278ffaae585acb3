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
//! Costs: `T * out * inp` multiply-adds; each task packs its panels of
//! [`NR`] weight rows (`inp * NR * 4` bytes, reused for every token tile),
//! so `W` is read once per call; work split over panels on rayon.

use half::bf16;
use rayon::prelude::*;

/// Tokens per register tile.
pub const MR: usize = 12;
/// Weight rows (outputs) per register tile and packed panel.
pub const NR: usize = 32;

/// A raw pointer to the output, shared by tasks that write disjoint columns.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
impl OutPtr {
    /// The pointer (a method, so closures capture the whole `Send` wrapper).
    fn get(self) -> *mut f32 {
        self.0
    }
}
// SAFETY: tasks write disjoint output columns (distinct panels) while the
// owning `&mut [f32]` is not otherwise used.
unsafe impl Send for OutPtr {}
// SAFETY: as for Send.
unsafe impl Sync for OutPtr {}

/// `y = x @ W^T` on AVX-512F (see the module doc). Panics if the lengths
/// disagree or the processor lacks AVX-512F (callers check [`crate::Isa`]).
pub fn matmul(x: &[f32], w: &[bf16], inp: usize, out: usize, y: &mut [f32]) {
    assert!(crate::Isa::Avx512.supported(), "AVX-512F is required");
    assert!(inp > 0 && x.len().is_multiple_of(inp));
    let t = x.len() / inp;
    assert!(w.len() == out * inp && y.len() == t * out);
    let panels = out.div_ceil(NR);
    let yp = OutPtr(y.as_mut_ptr());
    let bits: &[u16] = half::slice::HalfFloatSliceExt::reinterpret_cast(w);
    (0..panels).into_par_iter().for_each_init(
        || vec![0f32; inp * NR],
        |panel, p| {
            let (o0, o1) = (p * NR, ((p + 1) * NR).min(out));
            pack(bits, inp, o0, o1, panel);
            let mut tile = [[0f32; NR]; MR];
            for t0 in (0..t).step_by(MR) {
                let mr = MR.min(t - t0);
                let xs = &x[t0 * inp..(t0 + mr) * inp];
                // SAFETY: AVX-512F asserted above; xs holds mr rows of inp,
                // panel inp * NR values.
                unsafe { micro_dispatch(mr, xs, inp, panel, &mut tile) };
                for (m, row) in tile.iter().enumerate().take(mr) {
                    for (j, &v) in row.iter().enumerate().take(o1 - o0) {
                        // SAFETY: t0 + m < t and o0 + j < out: inside y
                        // [t, out]; column o0 + j belongs to this panel only.
                        unsafe { *yp.get().add((t0 + m) * out + o0 + j) = v };
                    }
                }
            }
        },
    );
}

/// Packs weight rows `o0..o1` as f32 `[inp][NR]` (row `o` in lane `o - o0`,
/// lanes past `o1` zero).
fn pack(w: &[u16], inp: usize, o0: usize, o1: usize, panel: &mut [f32]) {
    if o1 - o0 < NR {
        panel.fill(0.0);
    }
    for (j, o) in (o0..o1).enumerate() {
        for (k, &b) in w[o * inp..(o + 1) * inp].iter().enumerate() {
            panel[k * NR + j] = f32::from_bits((b as u32) << 16);
        }
    }
}

/// # Safety
/// AVX-512F; `x` holds `mr * inp` values, `panel` `inp * NR`.
#[cfg(target_arch = "x86_64")]
unsafe fn micro_dispatch(
    mr: usize,
    x: &[f32],
    inp: usize,
    panel: &[f32],
    tile: &mut [[f32; NR]; MR],
) {
    macro_rules! go {
        ($($m:literal)*) => {
            match mr {
                // SAFETY: forwarded from this function's contract.
                $($m => unsafe { micro::<$m>(x, inp, panel, tile) },)*
                _ => unreachable!("mr is 1..=MR"),
            }
        };
    }
    go!(1 2 3 4 5 6 7 8 9 10 11 12)
}

/// Never called off x86-64 ([`matmul`] asserts AVX-512F first).
///
/// # Safety
/// None needed; unsafe only to match the x86-64 signature.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn micro_dispatch(_: usize, _: &[f32], _: usize, _: &[f32], _: &mut [[f32; NR]; MR]) {
    unreachable!("AVX-512F is asserted before any call")
}

/// `tile[m][j] = sum_k x[m][k] * panel[k][j]` for `m < M`, `j < NR`.
///
/// # Safety
/// AVX-512F; `x` holds `M * inp` values, `panel` `inp * NR`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn micro<const M: usize>(x: &[f32], inp: usize, panel: &[f32], tile: &mut [[f32; NR]; MR]) {
    use std::arch::x86_64::*;
    assert!(x.len() >= M * inp && panel.len() >= inp * NR && M <= MR);
    let (xp, bp) = (x.as_ptr(), panel.as_ptr());
    let mut c0 = [_mm512_setzero_ps(); M];
    let mut c1 = [_mm512_setzero_ps(); M];
    for k in 0..inp {
        // SAFETY: k * NR + 32 <= inp * NR <= panel.len(); m * inp + k <
        // M * inp <= x.len() (asserted).
        unsafe {
            let b0 = _mm512_loadu_ps(bp.add(k * NR));
            let b1 = _mm512_loadu_ps(bp.add(k * NR + 16));
            for m in 0..M {
                let a = _mm512_set1_ps(*xp.add(m * inp + k));
                c0[m] = _mm512_fmadd_ps(a, b0, c0[m]);
                c1[m] = _mm512_fmadd_ps(a, b1, c1[m]);
            }
        }
    }
    for m in 0..M {
        // SAFETY: tile[m] holds NR = 32 floats.
        unsafe {
            _mm512_storeu_ps(tile[m].as_mut_ptr(), c0[m]);
            _mm512_storeu_ps(tile[m].as_mut_ptr().add(16), c1[m]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_naive_product_on_ragged_shapes() {
        if !crate::Isa::Avx512.supported() {
            return; // the path this machine cannot run; the portable one is tested in matmul
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
}
