//! Launcher for `cu/qgemm.cu`: `y[m, n] = x[m, k] · w[n, k]ᵀ` with `w` in
//! a block format (the device layout of [`WeightFormat::layout`]) widened
//! in registers onto tensor cores, for the GEMM path's batches where
//! widening the whole matrix for cuBLAS would cost more than the product.
//! Contract: every output is the sum, in a fixed order of `k` alone, of the
//! products of `x` with the weights `gguf_dequant` gives (the format's
//! values rounded to bf16); CPU reference: those weights times `x` (the
//! tests compare within rounding). Each output's value is the same at any
//! `m` and any place of its row.
//! Costs: one launch of `ceil(m / 64) x ceil(n / 64)` blocks of 128
//! threads and [`SMEM_BYTES`] of shared memory; the weights are read once
//! per 64 input rows (from L2 after the first of the blocks that share
//! them), each input row once per 64 weight rows.

use gpu::{DevSlice, LaunchConfig};
use half::bf16;

use crate::abi::QgemmArgs;
use crate::consts::{QGEMM_ROW_UNITS, QGEMM_ROWS, QGEMM_STAGES, QGEMM_WARPS};
use crate::gemv::WeightFormat;
use crate::gguf::BlockOperands;
use crate::{KernelError, Kernels, need, u32_of};

/// Dynamic shared memory of one block: the staged input rows (within the
/// 227 KiB a Hopper or Ampere block may opt in to).
pub const SMEM_BYTES: usize = QGEMM_STAGES * QGEMM_ROWS * QGEMM_ROW_UNITS * 16;
const _: () = assert!(SMEM_BYTES <= 227 * 1024);

/// Weight rows one block covers.
const FEATURES: usize = 16 * QGEMM_WARPS;

/// `k` must be a multiple of this (and of the format's group): a lane's 32
/// columns are whole chunks.
pub const K_MULTIPLE: usize = 32;

/// The entry point of block format `f` (`None` for bf16 and FP8).
pub(crate) fn entry(f: WeightFormat) -> Option<String> {
    f.block_entry("qgemm")
}

impl Kernels {
    /// `y = x · wᵀ` for the block-format weights `q` / `side` of `n` rows
    /// of `k` columns (module doc).
    #[allow(clippy::too_many_arguments)]
    pub fn qgemm(
        &self,
        format: WeightFormat,
        q: DevSlice<'_, u8>,    // [n, layout.row_bytes(k)]
        side: DevSlice<'_, u8>, // [n, layout.side_bytes(k)]
        x: DevSlice<'_, bf16>,  // [m, k]
        y: DevSlice<'_, bf16>,  // [m, n]
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        const K: &str = "qgemm";
        let ptrs = [q.ptr(), side.ptr(), x.ptr(), y.ptr()];
        let blocks = BlockOperands {
            q: &q,
            side: &side,
            ptrs: &ptrs,
            n,
            k,
            k_multiple: K_MULTIPLE,
        };
        let (_, func) = blocks.check(K, format, &self.qgemm)?;
        need(K, "x", &x, m * k)?;
        need(K, "y", &y, m * n)?;
        if m == 0 || n == 0 || k == 0 {
            return Ok(());
        }
        let args = QgemmArgs {
            y: y.ptr(),
            x: x.ptr(),
            q: q.ptr(),
            side: side.ptr(),
            m: u32_of(K, "m", m)?,
            n: u32_of(K, "n", n)?,
            k: u32_of(K, "k", k)?,
            pad: 0,
        };
        let grid_y = u32_of(K, "weight-row blocks", n.div_ceil(FEATURES))?;
        if grid_y > 65_535 {
            return Err(KernelError::Unsupported {
                kernel: K,
                reason: format!("n = {n} (at most {} rows)", 65_535 * FEATURES),
            });
        }
        let cfg = LaunchConfig {
            grid: (u32_of(K, "row blocks", m.div_ceil(QGEMM_ROWS))?, grid_y, 1),
            block: (32 * QGEMM_WARPS as u32, 1, 1),
            shared_bytes: SMEM_BYTES as u32,
        };
        // SAFETY: q, side, x and y checked for the format's [n, k] chunks
        // and records, [m, k] and [m, n], all 16-byte aligned, k whole
        // chunks and groups; the kernel takes `QgemmArgs`, reads only
        // weights before its PDL wait and its dynamic shared memory was
        // raised to SMEM_BYTES at load.
        unsafe { self.launch_pdl(func, cfg, &args)? };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_formats_name_their_gemm() {
        assert_eq!(entry(WeightFormat::Q4K).as_deref(), Some("qgemm_q4_k"));
        assert_eq!(entry(WeightFormat::Int4).as_deref(), Some("qgemm_int4"));
        assert_eq!(entry(WeightFormat::Fp8Row), None);
        assert_eq!(entry(WeightFormat::Bf16), None);
    }
}
