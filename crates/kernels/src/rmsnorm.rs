//! Launcher for `cu/rmsnorm.cu`: RMSNorm fused with the residual add; the
//! kernel takes one [`AddRmsnormArgs`]. CPU reference: `ops::linear::add_assign`
//! then `ops::norm::rms_norm` (the CPU backend's own code).
//! Costs: one launch, one block per row, two passes over the row.

use gpu::{DevSlice, LaunchConfig};
use half::bf16;

use crate::abi::AddRmsnormArgs;
use crate::consts::ROW_THREADS;
use crate::{KernelError, Kernels, need, u32_of};

impl Kernels {
    /// For each of `tokens` rows: `residual += delta` (when given), then
    /// `out = residual * rsqrt(mean(residual²) + eps) * (offset + weight)`.
    #[allow(clippy::too_many_arguments)]
    pub fn add_rmsnorm(
        &self,
        residual: DevSlice<'_, f32>,       // [T, hidden]
        delta: Option<DevSlice<'_, bf16>>, // [T, hidden]
        weight: DevSlice<'_, bf16>,        // [hidden]
        out: DevSlice<'_, bf16>,           // [T, hidden]
        tokens: usize,
        hidden: usize,
        eps: f32,
        offset: f32,
    ) -> Result<(), KernelError> {
        const K: &str = "add_rmsnorm";
        need(K, "residual", &residual, tokens * hidden)?;
        if let Some(d) = &delta {
            need(K, "delta", d, tokens * hidden)?;
        }
        need(K, "weight", &weight, hidden)?;
        need(K, "out", &out, tokens * hidden)?;
        if tokens == 0 {
            return Ok(());
        }
        let args = AddRmsnormArgs {
            residual: residual.ptr(),
            delta: delta.map_or(0, |d| d.ptr()),
            weight: weight.ptr(),
            out: out.ptr(),
            hidden: u32_of(K, "hidden", hidden)?,
            eps,
            offset,
            pad: 0,
        };
        let cfg = LaunchConfig::linear(u32_of(K, "tokens", tokens)?, ROW_THREADS as u32);
        // SAFETY: every view was checked for its [T, hidden] / [hidden] shape;
        // a null delta is handled by the kernel; the kernel takes `AddRmsnormArgs`.
        unsafe { self.launch(&self.add_rmsnorm, cfg, &args)? };
        Ok(())
    }
}
