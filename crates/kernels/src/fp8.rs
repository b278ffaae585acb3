//! Launchers for `cu/fp8.cu`: FP8 (e4m3) weights with per-row scales widened
//! to bf16 for the bf16 tensor-core GEMMs of large steps (small steps read
//! the FP8 bytes directly in the `gemv8_*` kernels, `gemv.rs`), and
//! activations quantised per row for the FP8 GEMMs (`gpu::BlasLt`), with
//! their CPU references [`dequant_rows_ref`] and [`quant_rows_ref`].
//! Contract: `out[r, c] = bf16(decode(q[r, c]) * scale[r])`, `k % 8 == 0`;
//! the quantiser is `ops::fp8::quantize_rows` on the bf16 values.
//! Costs: one grid-stride launch reading `n * k` bytes and writing `2 n k`;
//! the quantiser one block per row reading `2 m k` bytes twice and writing `m k`.

use gpu::{DevSlice, LaunchConfig};
use half::bf16;

use crate::abi::{Fp8DequantArgs, Fp8QuantArgs};
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
        unsafe { self.launch(&self.fp8_dequant_rows, cfg, &args)? };
        Ok(())
    }
}

impl Kernels {
    /// `q[r, :]`, `scale[r]`: row `r` of `x` (`[m, k]`) quantised to e4m3
    /// with its own scale (`max|x[r, :]| / 448`).
    pub fn fp8_quant_rows(
        &self,
        x: DevSlice<'_, bf16>,    // [m, k]
        q: DevSlice<'_, u8>,      // [m, k]
        scale: DevSlice<'_, f32>, // [m]
        m: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        const K: &str = "fp8_quant_rows";
        need(K, "x", &x, m * k)?;
        need(K, "q", &q, m * k)?;
        need(K, "scale", &scale, m)?;
        if m == 0 || k == 0 {
            return Ok(());
        }
        let args = Fp8QuantArgs {
            x: x.ptr(),
            q: q.ptr(),
            scale: scale.ptr(),
            m: u32_of(K, "m", m)?,
            k: u32_of(K, "k", k)?,
        };
        let cfg = LaunchConfig::linear(args.m, ROW_THREADS as u32);
        // SAFETY: views checked for [m, k], [m, k] and [m]; one block per
        // row; the kernel takes `Fp8QuantArgs`.
        unsafe { self.launch(&self.fp8_quant_rows, cfg, &args)? };
        Ok(())
    }
}

/// CPU reference of [`Kernels::fp8_quant_rows`]: the bytes and row scales.
pub fn quant_rows_ref(x: &[bf16], m: usize, k: usize) -> (Vec<u8>, Vec<f32>) {
    let f: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
    ops::fp8::quantize_rows(&f, m, k)
}

/// CPU reference of [`Kernels::fp8_dequant_rows`].
pub fn dequant_rows_ref(q: &[u8], scale: &[f32], k: usize) -> Vec<bf16> {
    ops::fp8::dequantize_rows(q, scale, k)
        .into_iter()
        .map(bf16::from_f32)
        .collect()
}
