//! Launchers for `cu/layer_extras.cu`: the steps a model spec adds around
//! the projections, a bias on each row, per-head RMSNorm (QK-norm, and a
//! whole row as one head: the output norms) and the logits' soft-cap; each
//! kernel takes one argument struct ([`BiasRowsArgs`], [`HeadRmsnormArgs`],
//! [`SoftcapArgs`]). CPU references: `ops::norm::add_rows`,
//! `ops::norm::rms_norm_in_place` and `ops::norm::softcap`.
//! Costs: one launch each; `bias_rows` and `softcap_rows` one read and
//! write of the values, `head_rmsnorm` two passes over each head (one warp
//! a head).

use gpu::{DevSlice, LaunchConfig};
use half::bf16;

use crate::abi::{BiasRowsArgs, HeadRmsnormArgs, SoftcapArgs};
use crate::consts::{ROW_THREADS, SILU_MAX_BLOCKS};
use crate::{KernelError, Kernels, need, u32_of};

/// The heads a row holds from column 0: `q_heads` normalised with the Q
/// gain, then `k_heads` with the K gain, each `head_dim` wide.
#[derive(Debug, Clone, Copy)]
pub struct HeadNorm {
    pub q_heads: usize,
    pub k_heads: usize,
    pub head_dim: usize,
    pub eps: f32,
    /// The gains are `offset + gain` (the spec's norm weight offset).
    pub offset: f32,
}

impl Kernels {
    /// `y[t, c] += bias[c]` for the `tokens` rows of `y`.
    pub fn bias_rows(
        &self,
        y: DevSlice<'_, bf16>,    // [T, width]
        bias: DevSlice<'_, bf16>, // [width]
        tokens: usize,
        width: usize,
    ) -> Result<(), KernelError> {
        const K: &str = "bias_rows";
        need(K, "y", &y, tokens * width)?;
        need(K, "bias", &bias, width)?;
        if tokens == 0 || width == 0 {
            return Ok(());
        }
        u32_of(K, "tokens * width", tokens * width)?;
        let blocks = (tokens * width).div_ceil(ROW_THREADS).min(SILU_MAX_BLOCKS);
        let args = BiasRowsArgs {
            y: y.ptr(),
            bias: bias.ptr(),
            tokens: u32_of(K, "tokens", tokens)?,
            width: u32_of(K, "width", width)?,
        };
        let cfg = LaunchConfig::linear(blocks as u32, ROW_THREADS as u32);
        // SAFETY: views checked for [T, width] and [width]; the kernel takes
        // `BiasRowsArgs`.
        unsafe { self.launch(&self.bias_rows, cfg, &args)? };
        Ok(())
    }

    /// Per-head RMSNorm in place of the heads at the start of each of the
    /// `tokens` rows of `x` (`row` wide), as `n` says.
    pub fn head_rmsnorm(
        &self,
        x: DevSlice<'_, bf16>,      // [T, row]
        q_gain: DevSlice<'_, bf16>, // [head_dim]
        k_gain: DevSlice<'_, bf16>, // [head_dim]
        tokens: usize,
        row: usize,
        n: HeadNorm,
    ) -> Result<(), KernelError> {
        const K: &str = "head_rmsnorm";
        need(K, "x", &x, tokens * row)?;
        need(K, "q_gain", &q_gain, n.head_dim)?;
        need(K, "k_gain", &k_gain, n.head_dim)?;
        if (n.q_heads + n.k_heads) * n.head_dim > row {
            return Err(KernelError::Shape {
                kernel: K,
                reason: format!(
                    "{} + {} heads of {} do not fit a row of {row}",
                    n.q_heads, n.k_heads, n.head_dim
                ),
            });
        }
        let warps = tokens * (n.q_heads + n.k_heads);
        if warps == 0 || n.head_dim == 0 {
            return Ok(());
        }
        let blocks = u32_of(K, "blocks", (warps * 32).div_ceil(ROW_THREADS))?;
        let args = HeadRmsnormArgs {
            x: x.ptr(),
            q_gain: q_gain.ptr(),
            k_gain: k_gain.ptr(),
            tokens: u32_of(K, "tokens", tokens)?,
            row: u32_of(K, "row", row)?,
            q_heads: u32_of(K, "q_heads", n.q_heads)?,
            k_heads: u32_of(K, "k_heads", n.k_heads)?,
            head_dim: u32_of(K, "head_dim", n.head_dim)?,
            eps: n.eps,
            offset: n.offset,
            pad: 0,
        };
        let cfg = LaunchConfig::linear(blocks, ROW_THREADS as u32);
        // SAFETY: x checked for [T, row] with the heads inside a row, the
        // gains for [head_dim]; the kernel takes `HeadRmsnormArgs`.
        unsafe { self.launch(&self.head_rmsnorm, cfg, &args)? };
        Ok(())
    }

    /// `y = cap * tanh(y / cap)` over the `n` values of `y`, in place.
    pub fn softcap_rows(
        &self,
        y: DevSlice<'_, f32>,
        n: usize,
        cap: f32,
    ) -> Result<(), KernelError> {
        const K: &str = "softcap_rows";
        need(K, "y", &y, n)?;
        if !(cap.is_finite() && cap > 0.0) {
            return Err(KernelError::Shape {
                kernel: K,
                reason: format!("cap {cap}: must be finite and positive"),
            });
        }
        if n == 0 {
            return Ok(());
        }
        let blocks = n.div_ceil(ROW_THREADS).min(SILU_MAX_BLOCKS);
        let args = SoftcapArgs {
            y: y.ptr(),
            n: u32_of(K, "n", n)?,
            cap,
        };
        let cfg = LaunchConfig::linear(blocks as u32, ROW_THREADS as u32);
        // SAFETY: y checked for [n]; the kernel takes `SoftcapArgs`.
        unsafe { self.launch(&self.softcap_rows, cfg, &args)? };
        Ok(())
    }
}
