//! Launcher for `cu/fp8.cu`: FP8 (e4m3) weights with per-row scales widened
//! to bf16 for the tensor-core GEMMs of large steps (small steps read the
//! FP8 bytes directly in the `gemv8_*` kernels, `gemv.rs`), and its CPU
//! reference [`dequant_rows_ref`].
//! Contract: `out[r, c] = bf16(decode(q[r, c]) * scale[r])`, `k % 8 == 0`.
//! Costs: one grid-stride launch reading `n * k` bytes and writing `2 n k`.

use gpu::{DevSlice, LaunchConfig};
use half::bf16;

use crate::abi::Fp8DequantArgs;
use crate::consts::{ROW_THREADS, SILU_MAX_BLOCKS};
use crate::{KernelError, Kernels, need, u32_of};

impl Kernels {
    /// `out = bf16(decode(q) * scale[row])` for `q` `[n, k]`.
    pub fn fp8_dequant_rows(
        &self,
        q: DevSlice<'_, u8>,      // [n, k]
        scale: DevSlice<'_, f32>, // [n]
        out: DevSlice<'_, bf16>,  // [n, k]
        n: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        const K: &str = "fp8_dequant_rows";
        if !k.is_multiple_of(8) || !q.ptr().is_multiple_of(8) || !out.ptr().is_multiple_of(16) {
            return Err(KernelError::Unsupported {
                kernel: K,
                reason: format!("k = {k} (a multiple of 8), q 8-byte and out 16-byte aligned"),
            });
        }
        need(K, "q", &q, n * k)?;
        need(K, "scale", &scale, n)?;
        need(K, "out", &out, n * k)?;
        if n == 0 || k == 0 {
            return Ok(());
        }
        let blocks = (n * k / 8).div_ceil(ROW_THREADS).min(SILU_MAX_BLOCKS);
        let args = Fp8DequantArgs {
            q: q.ptr(),
            scale: scale.ptr(),
            out: out.ptr(),
            n: u32_of(K, "n", n)?,
            k: u32_of(K, "k", k)?,
        };
        let cfg = LaunchConfig::linear(blocks as u32, ROW_THREADS as u32);
        // SAFETY: views checked for [n, k], [n] and [n, k] and their
        // alignment; the kernel takes `Fp8DequantArgs`.
        unsafe { self.gpu.launch_struct(&self.fp8_dequant_rows, cfg, &args)? };
        Ok(())
    }
}

/// CPU reference of [`Kernels::fp8_dequant_rows`].
pub fn dequant_rows_ref(q: &[u8], scale: &[f32], k: usize) -> Vec<bf16> {
    ops::fp8::dequantize_rows(q, scale, k)
        .into_iter()
        .map(bf16::from_f32)
        .collect()
}
