//! Launcher for `cu/activation.cu`: SwiGLU, `silu(gate) * up` over the fused
//! `[gate | up]` GEMM output. Costs: one grid-stride launch over `T * inter`.

use gpu::{DevSlice, LaunchArgs, LaunchConfig};
use half::bf16;

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
        let blocks = (tokens * inter).div_ceil(256).min(65_535);
        let mut a = LaunchArgs::new();
        a.ptr(out)
            .ptr(gu)
            .u32(u32_of(K, "tokens", tokens)?)
            .u32(u32_of(K, "inter", inter)?);
        // SAFETY: views checked for [T, inter] and [T, 2 inter]; args match the signature.
        unsafe {
            self.gpu.launch(
                &self.silu_mul,
                LaunchConfig::linear(blocks as u32, 256),
                &mut a,
            )?
        };
        Ok(())
    }
}

/// CPU reference of [`Kernels::silu_mul`].
pub fn silu_mul_ref(gu: &[bf16], tokens: usize, inter: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(tokens * inter);
    for t in 0..tokens {
        for i in 0..inter {
            let g = gu[t * 2 * inter + i].to_f32();
            let u = gu[t * 2 * inter + inter + i].to_f32();
            out.push(g / (1.0 + (-g).exp()) * u);
        }
    }
    out
}
