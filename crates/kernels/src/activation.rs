//! Launcher for `cu/activation.cu`: the gated activations, `act(gate) * up`
//! over the fused `[gate | up]` GEMM output (SwiGLU's SiLU, GeGLU's
//! tanh-approximated GELU); each kernel takes one [`GatedArgs`]. CPU
//! reference: `ops::activation::gate_mul`.
//! Costs: one grid-stride launch over `T * inter / 8` 16-byte chunks (one
//! read of `gu`, one write of `out`); `T * inter` must fit in `u32`.

use gpu::{DevSlice, LaunchConfig};
use half::bf16;

use crate::abi::GatedArgs;
use crate::consts::{ROW_THREADS, SILU_MAX_BLOCKS};
use crate::{KernelError, Kernels, need, u32_of};
use contract::Activation;

impl Kernels {
    /// `out[t, i] = silu(gu[t, i]) * gu[t, inter + i]`.
    pub fn silu_mul(
        &self,
        out: DevSlice<'_, bf16>, // [T, inter]
        gu: DevSlice<'_, bf16>,  // [T, 2 inter]
        tokens: usize,
        inter: usize,
    ) -> Result<(), KernelError> {
        self.gate_mul(Activation::Silu, out, gu, tokens, inter)
    }

    /// `out[t, i] = act(gu[t, i]) * gu[t, inter + i]` for the spec's `act`.
    pub fn gate_mul(
        &self,
        act: Activation,
        out: DevSlice<'_, bf16>, // [T, inter]
        gu: DevSlice<'_, bf16>,  // [T, 2 inter]
        tokens: usize,
        inter: usize,
    ) -> Result<(), KernelError> {
        let (function, k) = match act {
            Activation::Silu => (&self.silu_mul, "silu_mul"),
            Activation::GeluTanh => (&self.gelu_tanh_mul, "gelu_tanh_mul"),
        };
        need(k, "out", &out, tokens * inter)?;
        need(k, "gu", &gu, tokens * 2 * inter)?;
        if tokens == 0 {
            return Ok(());
        }
        u32_of(k, "tokens * inter", tokens * inter)?;
        // one thread per 16-byte chunk (8 elements); the kernel grid-strides
        let blocks = (tokens * inter)
            .div_ceil(8 * ROW_THREADS)
            .min(SILU_MAX_BLOCKS);
        let args = GatedArgs {
            out: out.ptr(),
            gu: gu.ptr(),
            tokens: u32_of(k, "tokens", tokens)?,
            inter: u32_of(k, "inter", inter)?,
        };
        let cfg = LaunchConfig::linear(blocks as u32, ROW_THREADS as u32);
        // SAFETY: views checked for [T, inter] and [T, 2 inter]; the kernel
        // takes `GatedArgs`.
        unsafe { self.launch(function, cfg, &args)? };
        Ok(())
    }
}
