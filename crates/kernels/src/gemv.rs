//! Launcher for `cu/gemv.cu`: projections for steps of at most
//! [`MAX_ROWS`] token rows, with bf16, FP8 or GGUF block weights
//! ([`GemvWeights`]), the
//! RMSNorm before them, the residual add (through an output norm or not)
//! or the gated activation after them fused in (see [`GemvOp`]), and their
//! CPU reference.
//! Contract: `y[m, n] = x[m, k] · W[n, k]ᵀ`, fp32 accumulation, rounding
//! like the unfused path (cuBLAS to bf16, then add_rmsnorm / gate_mul /
//! head_rmsnorm / bias_rows).
//! `k` must be a multiple of 8 and every operand 16-byte aligned.
//! Costs: one launch; reads W once (16-byte loads, issued before the PDL
//! wait) whatever `m`, plus the inputs from L1/L2 once per block; the norm
//! variants take `m * k * 2` bytes of dynamic shared memory (at most
//! [`MAX_NORM_SMEM`], see [`fits`]).
//! Beside the launchers: `weights` (each weight format's operands),
//! `lora` (the epilogue's adapter operands), `reference` (the CPU
//! reference).

use gpu::{DevSlice, LaunchConfig};
use half::bf16;

use crate::abi::GemvArgs;
use crate::kv::KvCaches;
pub use crate::weight_format::{BlockLayout, WeightFormat};
use crate::{HeadShape, KernelError, Kernels, need, u32_of};
use contract::Activation;

mod lora;
mod reference;
mod weights;
pub use lora::GemvLora;
pub use reference::{GemvKind, gemv_ref};
pub use weights::{GemvWeights, width_fits};

/// FP8 weights' `k` must be a multiple of this (16 e4m3 bytes a load).
pub use crate::consts::GEMV_FP8_COLS as FP8_K_MULTIPLE;
/// Most token rows one launch handles (larger steps use cuBLAS).
pub use crate::consts::GEMV_MAX_ROWS as MAX_ROWS;
use crate::consts::{
    ACT_GELU_TANH, ACT_SILU, GEMV_ROWS_PER_WARP as ROWS_PER_WARP, GEMV_WARPS as WARPS,
    HADAMARD_MAX_DIM, gemv_chunks,
};
/// Dynamic shared memory the norm variants may take (their `m * k` bf16
/// normalised inputs); within every sm_80+ GPU's opt-in limit.
pub const MAX_NORM_SMEM: usize = 96 * 1024;
/// Variants that stage normalised inputs in shared memory.
pub(crate) const NORM_VARIANTS: [usize; 3] = [2, 3, 5];
/// Row tiles the kernels are instantiated for (index = entry in `Kernels::gemv[variant]`).
const TILES: [usize; 5] = [1, 2, 4, 8, 16];
/// Entry-point names after the format's prefix, in [`GemvOp::variant`] order.
pub(crate) const VARIANTS: [&str; 6] = ["bf16", "resid", "norm", "norm_gated", "f32", "norm_rope"];
/// Index of `gemv_norm_rope` in [`VARIANTS`].
const ROPE_VARIANT: usize = 5;

/// Index of `gemv_f32` (the LM head) in [`VARIANTS`]: the one variant
/// without a LoRA delta.
const F32_VARIANT: usize = 4;

/// The entry point of variant `i` for row tile `m` and weight format `f`
/// (one for launches with and without LoRA deltas: `cu/gemv.cu`'s module doc).
pub(crate) fn entry(i: usize, f: WeightFormat, m: usize) -> String {
    format!("{}_{}_m{m}", f.prefix(), VARIANTS[i])
}

/// An RMSNorm's gains: each row's values times `rsqrt(mean(x²) + eps)`
/// times `offset + w`.
#[derive(Debug, Clone, Copy)]
pub struct RowNorm<'a> {
    pub w: DevSlice<'a, bf16>, // [width]
    pub eps: f32,
    /// Added to each gain: 0, or 1 for Gemma's `(1+w)`.
    pub offset: f32,
}

impl RowNorm<'_> {
    fn check(&self, kernel: &'static str, width: usize) -> Result<(), KernelError> {
        need(kernel, "norm gains", &self.w, width)?;
        aligned(kernel, "norm gains", self.w.ptr())
    }
}

/// The norm over each whole output row of [`GemvOp::ResidNormed`], and
/// what the launch needs for it: a scratch for the rows before the norm
/// and a counter.
#[derive(Debug, Clone, Copy)]
pub struct OutNorm<'a> {
    pub norm: RowNorm<'a>,        // [n] gains
    pub rows: DevSlice<'a, bf16>, // [m, n] scratch
    /// Zero at launch and left zero; no other launch in flight uses it.
    pub ready: DevSlice<'a, u32>, // [1]
}

/// Whether a norm-variant GEMV of `m` rows over `k` inputs fits its shared
/// memory (`m * k` bf16 at most [`MAX_NORM_SMEM`]); the other variants take any `m <= MAX_ROWS`.
pub fn fits(m: usize, k: usize) -> bool {
    m * k * size_of::<bf16>() <= MAX_NORM_SMEM
}

/// Index into `TILES` for `m` rows.
fn tile_of(m: usize) -> usize {
    TILES
        .iter()
        .position(|&t| m <= t)
        .unwrap_or(TILES.len() - 1)
}

/// Warps sharing one row pair for row tile `tile`, `k` inputs and a norm
/// (`norm`) or plain variant: the fewest (a power of two, at most WARPS)
/// whose column ranges one pass of the kernel's register chunks covers
/// ([`gemv_chunks`], 256 columns each).
fn ksplit(tile: usize, k: usize, norm: bool) -> usize {
    let chunks = gemv_chunks(TILES[tile], norm);
    k.div_ceil(256 * chunks).next_power_of_two().min(WARPS)
}

/// Grid and shared memory of a launch of `pairs` row pairs.
fn launch_config(
    pairs: usize,
    tile: usize,
    m: usize,
    k: usize,
    norm: bool,
) -> Result<(LaunchConfig, u32), KernelError> {
    let ks = ksplit(tile, k, norm);
    let cfg = LaunchConfig {
        grid: (u32_of("gemv", "blocks", pairs.div_ceil(WARPS / ks))?, 1, 1),
        block: ((WARPS * 32) as u32, 1, 1),
        shared_bytes: if norm {
            (m * k * size_of::<bf16>()) as u32
        } else {
            0
        },
    };
    Ok((cfg, ks as u32))
}

/// The RoPE + KV-write epilogue of [`Kernels::gemv_qkv_rope`] (as `rope_kv_write`).
#[derive(Debug, Clone, Copy)]
pub struct RopeKv<'a> {
    pub positions: DevSlice<'a, u32>, // [m]
    pub slots: DevSlice<'a, u32>,     // [m]
    pub cos: DevSlice<'a, f32>,       // [max_pos, D/2]
    pub sin: DevSlice<'a, f32>,       // [max_pos, D/2]
    pub kv: KvCaches<'a>,             // [slots, kv_heads, D] each
    pub shape: HeadShape,
    pub max_pos: usize,
    /// Per-head arrival counters, `[num_heads + num_kv_heads]`, zero at
    /// launch and left zero: needed when `kv` rotates or with `qk_norm`
    /// (the warp completing a head finishes it), else unread.
    pub ready: Option<DevSlice<'a, u32>>,
    /// Per-head RMSNorm of q and k before RoPE (Qwen3's, Gemma's), as
    /// `head_rmsnorm` computes it; heads up to `consts::HADAMARD_MAX_DIM`.
    pub qk_norm: Option<QkNorm<'a>>,
    /// `[qkv_width]` added to the projection before everything else
    /// (Qwen2's QKV bias), as `bias_rows` adds it.
    pub bias: Option<DevSlice<'a, bf16>>,
}

/// The gains of a per-head QK-norm: each head's values times
/// `rsqrt(mean(x²) + eps)` times `offset + gain`.
#[derive(Debug, Clone, Copy)]
pub struct QkNorm<'a> {
    pub q: DevSlice<'a, bf16>, // [head_dim]
    pub k: DevSlice<'a, bf16>, // [head_dim]
    /// Added to each gain: 0, or 1 for Gemma's `(1+w)`.
    pub offset: f32,
}

/// What a GEMV reads and writes (shapes for `m` rows, `n` outputs, `k` inputs).
#[derive(Debug, Clone, Copy)]
pub enum GemvOp<'a> {
    /// `y = x · Wᵀ` in bf16.
    Bf16 {
        x: DevSlice<'a, bf16>, // [m, k]
        y: DevSlice<'a, bf16>, // [m, n]
    },
    /// `residual += bf16(x · Wᵀ)` (the O and down projections).
    Resid {
        x: DevSlice<'a, bf16>,       // [m, k]
        residual: DevSlice<'a, f32>, // [m, n]
    },
    /// `residual += bf16(RMSNorm(bf16(x · Wᵀ)))` over whole output rows
    /// (Gemma's post-attention and post-MLP norms); `norm.rows` and
    /// `norm.ready` as [`OutNorm`] says.
    ResidNormed {
        x: DevSlice<'a, bf16>,       // [m, k]
        residual: DevSlice<'a, f32>, // [m, n]
        norm: OutNorm<'a>,
    },
    /// `y = RMSNorm(residual) · Wᵀ` (the QKV projection).
    Norm {
        residual: DevSlice<'a, f32>, // [m, k]
        norm: RowNorm<'a>,           // [k] gains
        y: DevSlice<'a, bf16>,       // [m, n]
    },
    /// `y = act(g) · u` with `[g | u] = RMSNorm(residual) · Wᵀ`, W `[2n, k]`
    /// (gate/up; SiLU or GELU-tanh).
    NormGated {
        residual: DevSlice<'a, f32>, // [m, k]
        norm: RowNorm<'a>,           // [k] gains
        act: Activation,
        y: DevSlice<'a, bf16>, // [m, n]
    },
    /// `y = x · Wᵀ` in f32 (the LM head's logits).
    F32 {
        x: DevSlice<'a, bf16>, // [m, k]
        y: DevSlice<'a, f32>,  // [m, n]
    },
}

impl GemvOp<'_> {
    fn variant(&self) -> usize {
        match self {
            GemvOp::Bf16 { .. } => 0,
            GemvOp::Resid { .. } | GemvOp::ResidNormed { .. } => 1,
            GemvOp::Norm { .. } => 2,
            GemvOp::NormGated { .. } => 3,
            GemvOp::F32 { .. } => 4,
        }
    }
}

fn aligned(kernel: &'static str, what: &str, ptr: u64) -> Result<(), KernelError> {
    if !ptr.is_multiple_of(16) {
        return Err(KernelError::Unsupported {
            kernel,
            reason: format!("operand `{what}` not 16-byte aligned"),
        });
    }
    Ok(())
}

impl Kernels {
    /// Runs `op` with weights `w` (`[n, k]`, `[2n, k]` for [`GemvOp::NormGated`];
    /// bf16 or [`GemvWeights::Fp8`]) for `m` rows in `1..=MAX_ROWS`; `k` a
    /// multiple of 8.
    pub fn gemv<'w>(
        &self,
        op: GemvOp<'_>,
        w: impl Into<GemvWeights<'w>>, // [n, k] or [2n, k]
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        self.gemv_with(op, w, m, n, k, None)
    }

    /// [`Kernels::gemv`] with the LoRA deltas of `lora` added in the
    /// epilogue (not for [`GemvOp::F32`]).
    pub fn gemv_with<'w>(
        &self,
        op: GemvOp<'_>,
        w: impl Into<GemvWeights<'w>>, // [n, k] or [2n, k]
        m: usize,
        n: usize,
        k: usize,
        lora: Option<&GemvLora<'_>>,
    ) -> Result<(), KernelError> {
        const K: &str = "gemv";
        if m == 0 || m > MAX_ROWS || n == 0 || k == 0 || !width_fits(k, WeightFormat::Bf16) {
            return Err(KernelError::Unsupported {
                kernel: K,
                reason: format!(
                    "m = {m}, n = {n}, k = {k} (m in 1..={MAX_ROWS}, k a multiple of 8)"
                ),
            });
        }
        let gated = matches!(op, GemvOp::NormGated { .. });
        let (w, w_side, format) = w.into().check(K, if gated { 2 * n } else { n }, k)?;
        let mut args = GemvArgs {
            w,
            w_side,
            m: m as u32,
            n: u32_of(K, "n", n)?,
            k: u32_of(K, "k", k)?,
            ..GemvArgs::default()
        };
        let in_norm = |args: &mut GemvArgs, residual: &DevSlice<'_, f32>, norm: &RowNorm<'_>| {
            need(K, "residual", residual, m * k)?;
            norm.check(K, k)?;
            (args.x, args.norm_w) = (residual.ptr(), norm.w.ptr());
            (args.eps, args.norm_offset) = (norm.eps, norm.offset);
            Ok::<_, KernelError>(())
        };
        match op {
            GemvOp::Bf16 { x, y } => {
                need(K, "x", &x, m * k)?;
                need(K, "y", &y, m * n)?;
                (args.x, args.y) = (x.ptr(), y.ptr());
            }
            GemvOp::Resid { x, residual } => {
                need(K, "x", &x, m * k)?;
                need(K, "residual", &residual, m * n)?;
                (args.x, args.y) = (x.ptr(), residual.ptr());
            }
            GemvOp::ResidNormed { x, residual, norm } => {
                need(K, "x", &x, m * k)?;
                need(K, "residual", &residual, m * n)?;
                norm.norm.check(K, n)?;
                need(K, "output norm rows", &norm.rows, m * n)?;
                need(K, "output norm counter", &norm.ready, 1)?;
                (args.x, args.y) = (x.ptr(), residual.ptr());
                (args.out_norm_w, args.out_rows) = (norm.norm.w.ptr(), norm.rows.ptr());
                args.out_ready = norm.ready.ptr();
                (args.eps, args.norm_offset) = (norm.norm.eps, norm.norm.offset);
            }
            GemvOp::Norm { residual, norm, y } => {
                in_norm(&mut args, &residual, &norm)?;
                need(K, "y", &y, m * n)?;
                args.y = y.ptr();
            }
            GemvOp::NormGated {
                residual,
                norm,
                act,
                y,
            } => {
                in_norm(&mut args, &residual, &norm)?;
                need(K, "y", &y, m * n)?;
                args.y = y.ptr();
                args.act = match act {
                    Activation::Silu => ACT_SILU,
                    Activation::GeluTanh => ACT_GELU_TANH,
                } as u32;
            }
            GemvOp::F32 { x, y } => {
                need(K, "x", &x, m * k)?;
                need(K, "y", &y, m * n)?;
                (args.x, args.y) = (x.ptr(), y.ptr());
            }
        }
        aligned(K, "x", args.x)?;
        let norm = NORM_VARIANTS.contains(&op.variant());
        if norm && !fits(m, k) {
            return Err(KernelError::Unsupported {
                kernel: K,
                reason: format!(
                    "m = {m}, k = {k}: normalised inputs over {MAX_NORM_SMEM} bytes of shared memory"
                ),
            });
        }
        let tile = tile_of(m);
        let func = &self.gemv[format as usize][op.variant()][tile];
        let pairs = if gated { n } else { n.div_ceil(ROWS_PER_WARP) };
        let (mut cfg, ksplit) = launch_config(pairs, tile, m, k, norm)?;
        args.ksplit = ksplit;
        if let Some(l) = lora {
            if op.variant() == F32_VARIANT {
                return Err(KernelError::Unsupported {
                    kernel: K,
                    reason: "a LoRA delta on the f32 (LM head) variant".into(),
                });
            }
            l.fill(
                K,
                (m, if gated { 2 * n } else { n }, k),
                &mut args,
                &mut cfg,
            )?;
        }
        // SAFETY: every operand was checked for its shape and 16-byte
        // alignment above; GemvArgs mirrors the kernel's struct (asserted on
        // both sides); the kernel touches only rows < m, outputs < n, inputs
        // < k. With LoRA the GEMV blocks wait for the shrink blocks, which
        // come first in the grid and wait for nothing but the PDL wait; the
        // caller zeroes the counter before the launch (as the output norm's,
        // which only decides which warp norms the rows: every access stays
        // inside the checked rows).
        unsafe { self.launch_pdl(func, cfg, &args)? };
        Ok(())
    }

    /// `qkv = RMSNorm(residual) · Wᵀ` (plus `lora`'s deltas) for `m` token rows, then RoPE and the
    /// KV write of `rope_kv_write` in the epilogue: q rotated in `qkv`, k
    /// rotated into `k_cache[slots[t]]`, v into `v_cache[slots[t]]`
    /// (`qkv`'s k and v keep the un-rotated projection). When the caches
    /// rotate, q and k heads are Hadamard-rotated after RoPE, as
    /// `rope_kv_write` does, and with `rope.qk_norm` each q and k head is
    /// RMS-normed before RoPE, as `head_rmsnorm` does (`qkv` keeping the
    /// normed, un-rotated k), by the warp that completes each head
    /// (`rope.ready` counts a head's warps). With `rope.bias` each output
    /// is the rounded projection plus its bias, rounded, before all that.
    ///
    /// # Safety
    /// Every `slots[t]` indexes a slot inside the caches; positions at or past
    /// `max_pos` are skipped (no rotation, no cache write), as `rope_kv_write`.
    /// `rope.ready` is zero at launch and no other launch in flight uses it.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gemv_qkv_rope<'w>(
        &self,
        residual: DevSlice<'_, f32>,   // [m, hidden]
        norm: RowNorm<'_>,             // [hidden] gains
        w: impl Into<GemvWeights<'w>>, // [qkv_width, hidden]
        qkv: DevSlice<'_, bf16>,       // [m, qkv_width]
        rope: RopeKv<'_>,
        lora: Option<&GemvLora<'_>>,
        m: usize,
        hidden: usize,
    ) -> Result<(), KernelError> {
        const K: &str = "gemv_qkv_rope";
        let sh = rope.shape;
        sh.check(K)?;
        let n = sh.qkv_width();
        if m == 0
            || m > MAX_ROWS
            || hidden == 0
            || !hidden.is_multiple_of(8)
            || !sh.head_dim.is_multiple_of(2)
            || !fits(m, hidden)
        {
            return Err(KernelError::Unsupported {
                kernel: K,
                reason: format!(
                    "m = {m}, hidden = {hidden}, head_dim = {} (m in 1..={MAX_ROWS}, hidden a multiple of 8, even head_dim, m * hidden * 2 <= {MAX_NORM_SMEM})",
                    sh.head_dim
                ),
            });
        }
        need(K, "residual", &residual, m * hidden)?;
        norm.check(K, hidden)?;
        let bias = match rope.bias {
            Some(b) => {
                need(K, "bias", &b, n)?;
                b.ptr()
            }
            None => 0,
        };
        let (w, w_side, format) = w.into().check(K, n, hidden)?;
        need(K, "qkv", &qkv, m * n)?;
        need(K, "positions", &rope.positions, m)?;
        need(K, "slots", &rope.slots, m)?;
        need(K, "cos", &rope.cos, rope.max_pos * sh.head_dim / 2)?;
        need(K, "sin", &rope.sin, rope.max_pos * sh.head_dim / 2)?;
        rope.kv.need(K, sh.kv_width())?;
        let kv_rotate = rope.kv.rotate_flag(K, sh.head_dim)?;
        let (q_norm_w, k_norm_w, qk_offset) = match &rope.qk_norm {
            None => (0, 0, 0.0),
            Some(qk) => {
                let d = sh.head_dim;
                if d > HADAMARD_MAX_DIM || !d.is_power_of_two() {
                    return Err(KernelError::Unsupported {
                        kernel: K,
                        reason: format!(
                            "QK-norm in the epilogue at head_dim {d} (a power of two up to {})",
                            HADAMARD_MAX_DIM
                        ),
                    });
                }
                need(K, "q_norm", &qk.q, d)?;
                need(K, "k_norm", &qk.k, d)?;
                (qk.q.ptr(), qk.k.ptr(), qk.offset)
            }
        };
        let whole_heads = kv_rotate != 0 || rope.qk_norm.is_some();
        let rot_ready = match (whole_heads, rope.ready) {
            (false, _) => 0,
            (true, Some(ready)) => {
                need(K, "ready", &ready, sh.num_heads + sh.num_kv_heads)?;
                ready.ptr()
            }
            (true, None) => {
                return Err(KernelError::Unsupported {
                    kernel: K,
                    reason: "a rotating K cache or QK-norm needs the heads' arrival counters (`RopeKv::ready`)"
                        .into(),
                });
            }
        };
        aligned(K, "residual", residual.ptr())?;
        let tile = tile_of(m);
        let (mut cfg, ksplit) = launch_config(n / 2, tile, m, hidden, true)?;
        let func = &self.gemv[format as usize][ROPE_VARIANT][tile];
        let (k_cache, v_cache) = rope.kv.ptrs();
        let (k_scale, v_scale) = rope.kv.scales();
        let mut args = GemvArgs {
            x: residual.ptr(),
            norm_w: norm.w.ptr(),
            norm_offset: norm.offset,
            bias,
            w,
            w_side,
            y: qkv.ptr(),
            m: m as u32,
            n: u32_of(K, "qkv_width", n)?,
            k: u32_of(K, "hidden", hidden)?,
            eps: norm.eps,
            positions: rope.positions.ptr(),
            slots: rope.slots.ptr(),
            cos_t: rope.cos.ptr(),
            sin_t: rope.sin.ptr(),
            k_cache,
            v_cache,
            n_heads: u32_of(K, "num_heads", sh.num_heads)?,
            n_kv: u32_of(K, "num_kv_heads", sh.num_kv_heads)?,
            head_dim: u32_of(K, "head_dim", sh.head_dim)?,
            max_pos: u32_of(K, "max_pos", rope.max_pos)?,
            ksplit,
            kv_fp8: rope.kv.flag(),
            k_scale,
            v_scale,
            rot_ready,
            kv_rotate,
            qk_offset,
            q_norm_w,
            k_norm_w,
            ..GemvArgs::default()
        };
        if let Some(l) = lora {
            l.fill(K, (m, n, hidden), &mut args, &mut cfg)?;
        }
        // SAFETY: dense operands checked for shape and alignment above; cache
        // slots in range by contract; GemvArgs mirrors the kernel's struct;
        // LoRA's shrink blocks as in `gemv_with`; the rotation's counters
        // checked above, zero at launch by contract.
        unsafe { self.launch_pdl(func, cfg, &args)? };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_index_the_table_and_name_their_entries() {
        for (i, f) in WeightFormat::ALL.iter().enumerate() {
            assert_eq!(*f as usize, i);
        }
        assert_eq!(entry(0, WeightFormat::Bf16, 1), "gemv_bf16_m1");
        assert_eq!(
            entry(ROPE_VARIANT, WeightFormat::Fp8Row, 16),
            "gemv8_norm_rope_m16"
        );
        assert_eq!(entry(F32_VARIANT, WeightFormat::Fp8Row, 4), "gemv8_f32_m4");
        assert!(width_fits(24, WeightFormat::Bf16) && !width_fits(24, WeightFormat::Fp8Row));
        assert_eq!(entry(2, WeightFormat::Q4K, 8), "gemv_q4_k_norm_m8");
        assert!(width_fits(96, WeightFormat::Q8_0) && !width_fits(96, WeightFormat::Q6K));
        for f in WeightFormat::ALL {
            // whole chunks and whole side records per block
            if let Some(l) = f.layout() {
                assert!(l.group.is_multiple_of(l.cols) && l.side_bytes(l.group) > 0);
            }
        }
    }
}
