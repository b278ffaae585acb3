//! Launcher for `cu/rope_kv.cu`: RoPE from the one precomputed table
//! (`LlamaConfig::rope_table`), fused with writing K/V into paged blocks.
//! Costs: one launch, one block per token.

use gpu::{DevSlice, LaunchArgs, LaunchConfig};
use half::bf16;

use crate::{HeadShape, KernelError, Kernels, need, u32_of};

impl Kernels {
    /// Rotates the q heads of `qkv` in place and writes rotated k and plain v
    /// of each token into `k_cache` / `v_cache` at its slot.
    ///
    /// # Safety
    /// Every slot in `slots[..tokens]` is below the caches' slot count, and
    /// every position below `max_pos` (the table's rows).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn rope_kv_write(
        &self,
        qkv: DevSlice<'_, bf16>,      // [T, qkv_width]
        positions: DevSlice<'_, u32>, // [T]
        slots: DevSlice<'_, u32>,     // [T]
        cos: DevSlice<'_, f32>,       // [max_pos, D/2]
        sin: DevSlice<'_, f32>,       // [max_pos, D/2]
        k_cache: DevSlice<'_, bf16>,  // [slots, kv_heads, D]
        v_cache: DevSlice<'_, bf16>,  // [slots, kv_heads, D]
        shape: HeadShape,
        tokens: usize,
        max_pos: usize,
    ) -> Result<(), KernelError> {
        const K: &str = "rope_kv_write";
        shape.check(K)?;
        need(K, "qkv", &qkv, tokens * shape.qkv_width())?;
        need(K, "positions", &positions, tokens)?;
        need(K, "slots", &slots, tokens)?;
        need(K, "cos", &cos, max_pos * shape.head_dim / 2)?;
        need(K, "sin", &sin, max_pos * shape.head_dim / 2)?;
        need(K, "k_cache", &k_cache, shape.kv_width())?;
        need(K, "v_cache", &v_cache, shape.kv_width())?;
        if tokens == 0 {
            return Ok(());
        }
        let mut a = LaunchArgs::new();
        a.ptr(qkv)
            .ptr(positions)
            .ptr(slots)
            .ptr(cos)
            .ptr(sin)
            .ptr(k_cache)
            .ptr(v_cache)
            .u32(u32_of(K, "num_heads", shape.num_heads)?)
            .u32(u32_of(K, "num_kv_heads", shape.num_kv_heads)?)
            .u32(u32_of(K, "head_dim", shape.head_dim)?)
            .u32(u32_of(K, "max_pos", max_pos)?);
        // SAFETY: dense views checked above; slot and position ranges by contract.
        unsafe {
            self.gpu.launch(
                &self.rope_kv_write,
                LaunchConfig::linear(u32_of(K, "tokens", tokens)?, 128),
                &mut a,
            )?
        };
        Ok(())
    }
}

/// Rotates one head vector `x` (`[D]`) at table row `pos` (rotate-half order).
pub fn rope_ref(x: &mut [f32], cos: &[f32], sin: &[f32], pos: usize) {
    let half = x.len() / 2;
    for j in 0..half {
        let (c, s) = (cos[pos * half + j], sin[pos * half + j]);
        let (x1, x2) = (x[j], x[j + half]);
        x[j] = x1 * c - x2 * s;
        x[j + half] = x2 * c + x1 * s;
    }
}

/// CPU reference of [`Kernels::rope_kv_write`]: returns the rotated q part of
/// each token (`[T, heads * D]`) and fills the caches (`[slots, kv_heads * D]`, f32).
#[allow(clippy::too_many_arguments)]
pub fn rope_kv_ref(
    qkv: &[bf16],
    positions: &[u32],
    slots: &[u32],
    cos: &[f32],
    sin: &[f32],
    shape: HeadShape,
    k_cache: &mut [f32],
    v_cache: &mut [f32],
) -> Vec<f32> {
    let d = shape.head_dim;
    let w = shape.qkv_width();
    let kvw = shape.kv_width();
    let mut q_out = Vec::new();
    for (t, (&pos, &slot)) in positions.iter().zip(slots).enumerate() {
        let row: Vec<f32> = qkv[t * w..(t + 1) * w].iter().map(|x| x.to_f32()).collect();
        for h in 0..shape.num_heads + shape.num_kv_heads {
            let mut v = row[h * d..(h + 1) * d].to_vec();
            rope_ref(&mut v, cos, sin, pos as usize);
            if h < shape.num_heads {
                q_out.extend_from_slice(&v);
            } else {
                let kh = h - shape.num_heads;
                k_cache[slot as usize * kvw + kh * d..][..d].copy_from_slice(&v);
            }
        }
        let v0 = (shape.num_heads + shape.num_kv_heads) * d;
        v_cache[slot as usize * kvw..][..kvw].copy_from_slice(&row[v0..v0 + kvw]);
    }
    q_out
}
