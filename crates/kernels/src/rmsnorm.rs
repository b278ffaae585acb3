//! Launcher for `cu/rmsnorm.cu`: RMSNorm fused with the residual add.
//! Costs: one launch, one block per row, two passes over the row.

use gpu::{DevSlice, LaunchArgs, LaunchConfig};
use half::bf16;

use crate::{KernelError, Kernels, need, u32_of};

impl Kernels {
    /// For each of `tokens` rows: `residual += delta` (when given), then
    /// `out = residual * rsqrt(mean(residual²) + eps) * weight`.
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
        let mut a = LaunchArgs::new();
        a.ptr(residual)
            .ptr(delta.unwrap_or(DevSlice::null()))
            .ptr(weight)
            .ptr(out)
            .u32(u32_of(K, "hidden", hidden)?)
            .f32(eps);
        // SAFETY: every view was checked for its [T, hidden] / [hidden] shape;
        // a null delta is handled by the kernel; args match the signature.
        unsafe {
            self.gpu.launch(
                &self.add_rmsnorm,
                LaunchConfig::linear(u32_of(K, "tokens", tokens)?, 256),
                &mut a,
            )?
        };
        Ok(())
    }
}

/// CPU reference of [`Kernels::add_rmsnorm`]: updates `residual`, returns `out` as f32.
pub fn add_rmsnorm_ref(
    residual: &mut [f32],
    delta: Option<&[bf16]>,
    weight: &[bf16],
    hidden: usize,
    eps: f32,
) -> Vec<f32> {
    let mut out = vec![0f32; residual.len()];
    for (t, row) in residual.chunks_mut(hidden).enumerate() {
        if let Some(d) = delta {
            for (x, dv) in row.iter_mut().zip(&d[t * hidden..(t + 1) * hidden]) {
                *x += dv.to_f32();
            }
        }
        let ss: f64 = row.iter().map(|&x| (x as f64) * (x as f64)).sum();
        let inv = 1.0 / ((ss / hidden as f64) + eps as f64).sqrt();
        for i in 0..hidden {
            out[t * hidden + i] = (row[i] as f64 * inv) as f32 * weight[i].to_f32();
        }
    }
    out
}
