//! Launcher for `cu/activation.cu`: SwiGLU, `silu(gate) * up` over the fused
//! `[gate | up]` GEMM output; the kernel takes one [`SiluMulArgs`]. CPU
//! reference: `ops::activation::silu_mul`.
//! Costs: one grid-stride launch over `T * inter / 8` 16-byte chunks (one
//! read of `gu`, one write of `out`); `T * inter` must fit in `u32`.

use gpu::{DevSlice, LaunchConfig};
use half::bf16;

use crate::abi::SiluMulArgs;
use crate::consts::{ROW_THREADS, SILU_MAX_BLOCKS};
use crate::{KernelError, Kernels, need, u32_of};

impl Kernels {
    /// `out[t, i] = silu(gu[t, i]) * gu[t, inter + i]`.
    pub fn silu_mul(
        &self,
        out: DevSlice<'_, bf16>, // [T, inter]
        gu: DevSlice<'_, bf16>,  // [T, 2 inter]
        tokens: usize,
        inter: usize,
    ) -> Result<(), KernelError> {
        const K: &str = "silu_mul";
        need(K, "out", &out, tokens * inter)?;
        need(K, "gu", &gu, tokens * 2 * inter)?;
        if tokens == 0 {
            return Ok(());
        }
        u32_of(K, "tokens * inter", tokens * inter)?;
        // one thread per 16-byte chunk (8 elements); the kernel grid-strides
        let blocks = (tokens * inter)
            .div_ceil(8 * ROW_THREADS)
            .min(SILU_MAX_BLOCKS);
        let args = SiluMulArgs {
            out: out.ptr(),
            gu: gu.ptr(),
            tokens: u32_of(K, "tokens", tokens)?,
            inter: u32_of(K, "inter", inter)?,
        };
        let cfg = LaunchConfig::linear(blocks as u32, ROW_THREADS as u32);
        // SAFETY: views checked for [T, inter] and [T, 2 inter]; the kernel
        // takes `SiluMulArgs`.
        unsafe { self.gpu.launch_struct(&self.silu_mul, cfg, &args)? };
        Ok(())
    }
}
