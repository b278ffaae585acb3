//! Launcher for `cu/invariant_gemm.cu`: `y[m, n] = x[m, k] · w[n, k]ᵀ` on
//! bf16 weights whose every output is the same bits at any `m` and any
//! position of its row (the deterministic mode's products). The kernel
//! takes one [`InvariantGemmArgs`]. CPU reference:
//! `ops::linear::matmul_bf16` (the same products in another order, so the
//! tests compare within rounding and hold the GPU's rows to each other
//! bit for bit).
//! Two forms with the same bits (the kernel file's comment says why): the
//! direct one for fewer than [`TILED_MIN_ROWS`] rows, the tiled one
//! (operands staged in shared memory) from there on.
//! Costs: direct, one launch of `ceil(m / 64) x ceil(n / 16)` blocks of
//! `32 * slices(k)` threads, the weights read once per 64 input rows (from
//! L2 after the first of the blocks that share them); tiled, `ceil(m /
//! 128) x ceil(n / 64)` blocks of 256 threads, each input row read once per
//! 64 weight rows and each weight once per 128 input rows.

use gpu::{DevSlice, LaunchConfig};
use half::bf16;

use crate::abi::InvariantGemmArgs;
use crate::consts::{
    INV_GEMM_FEATURES, INV_GEMM_K_CHUNK, INV_GEMM_MAX_SLICES, INV_GEMM_ROW_TILES,
    INV_GEMM_TILE_FEATURES, INV_GEMM_TILE_ROWS, INV_GEMM_TILED_MIN_ROWS,
};
use crate::{KernelError, Kernels, need, u32_of};

/// The output of [`Kernels::invariant_gemm`].
#[derive(Clone, Copy)]
pub enum InvOut<'a> {
    /// `[m, n]` bf16 (projections).
    Bf16(DevSlice<'a, bf16>),
    /// `[m, n]` f32 (the LM head's logits).
    F32(DevSlice<'a, f32>),
}

/// Input rows one block of the direct form covers.
pub const BLOCK_ROWS: usize = 8 * INV_GEMM_ROW_TILES;

/// `k` must be a multiple of this.
pub const K_CHUNK: usize = INV_GEMM_K_CHUNK;

/// Row counts from which the tiled form runs.
pub const TILED_MIN_ROWS: usize = INV_GEMM_TILED_MIN_ROWS;

/// Threads of a tiled block (8 warps).
const TILED_THREADS: u32 = 256;

/// The slices a row's reduction over `k` is split into: the most of 8, 4,
/// 2 and 1 that divide `k`'s chunks evenly; `None` when `k` is not a
/// multiple of the chunk. A function of `k` alone: this is what keeps a
/// row's sums independent of the batch.
pub fn slices(k: usize) -> Option<usize> {
    if k == 0 || !k.is_multiple_of(INV_GEMM_K_CHUNK) {
        return None;
    }
    let chunks = k / INV_GEMM_K_CHUNK;
    let mut s = INV_GEMM_MAX_SLICES;
    while !chunks.is_multiple_of(s) {
        s /= 2;
    }
    Some(s)
}

impl Kernels {
    /// `y[m, n] = x[m, k] · w[n, k]ᵀ`, every row's reduction fixed by `k`
    /// alone (module doc). `x`, `w` and `y` start 16-byte aligned.
    pub fn invariant_gemm(
        &self,
        x: DevSlice<'_, bf16>, // [m, k]
        w: DevSlice<'_, bf16>, // [n, k]
        y: InvOut<'_>,         // [m, n]
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        const K: &str = "invariant_gemm";
        let s = slices(k).ok_or_else(|| KernelError::Unsupported {
            kernel: K,
            reason: format!("k = {k} (a multiple of {INV_GEMM_K_CHUNK} is needed)"),
        })?;
        need(K, "x", &x, m * k)?;
        need(K, "w", &w, n * k)?;
        let (y_ptr, f32_out) = match y {
            InvOut::Bf16(v) => {
                need(K, "y", &v, m * n)?;
                (v.ptr(), false)
            }
            InvOut::F32(v) => {
                need(K, "y", &v, m * n)?;
                (v.ptr(), true)
            }
        };
        if m == 0 || n == 0 {
            return Ok(());
        }
        if [x.ptr(), w.ptr()].iter().any(|p| p % 16 != 0) {
            return Err(KernelError::Shape {
                kernel: K,
                reason: "x and w must start 16-byte aligned".into(),
            });
        }
        // (the direct form's bound, the smaller: one bound at every m)
        if n.div_ceil(INV_GEMM_FEATURES) > 65_535 {
            return Err(KernelError::Unsupported {
                kernel: K,
                reason: format!("n = {n} (at most {} rows)", 65_535 * INV_GEMM_FEATURES),
            });
        }
        // each form's entry points (bf16, f32 output) and block geometry
        let (fs, rows, features, threads) = match m >= TILED_MIN_ROWS {
            true => (
                [
                    &self.invariant_gemm_tiled_bf16,
                    &self.invariant_gemm_tiled_f32,
                ],
                INV_GEMM_TILE_ROWS,
                INV_GEMM_TILE_FEATURES,
                TILED_THREADS,
            ),
            false => (
                [&self.invariant_gemm_bf16, &self.invariant_gemm_f32],
                BLOCK_ROWS,
                INV_GEMM_FEATURES,
                32 * s as u32,
            ),
        };
        let f = fs[usize::from(f32_out)];
        let grid = (
            u32_of(K, "row blocks", m.div_ceil(rows))?,
            u32_of(K, "weight-row blocks", n.div_ceil(features))?,
        );
        let args = InvariantGemmArgs {
            y: y_ptr,
            x: x.ptr(),
            w: w.ptr(),
            m: u32_of(K, "m", m)?,
            n: u32_of(K, "n", n)?,
            k: u32_of(K, "k", k)?,
            slices: s as u32,
        };
        let cfg = LaunchConfig {
            grid: (grid.0, grid.1, 1),
            block: (threads, 1, 1),
            shared_bytes: 0,
        };
        // SAFETY: x, w and y checked for [m, k], [n, k] and [m, n], x and w
        // aligned for the 16-byte loads, k a multiple of the chunk; both
        // forms take `InvariantGemmArgs` and read weights before their PDL
        // wait only (the tiled form reads nothing before it).
        unsafe { self.launch_pdl(f, cfg, &args)? };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_follow_k_alone() {
        assert_eq!(slices(2048), Some(8));
        assert_eq!(slices(8192), Some(8));
        assert_eq!(slices(576), Some(2)); // 18 chunks
        assert_eq!(slices(32 * 12), Some(4));
        assert_eq!(slices(32 * 7), Some(1));
        assert_eq!(slices(100), None);
        assert_eq!(slices(0), None);
    }
}
