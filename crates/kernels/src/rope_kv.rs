//! Launcher for `cu/rope_kv.cu`: RoPE from the one precomputed table
//! (`ModelConfig::rope_table`), fused with writing K/V into paged blocks;
//! the kernel takes one [`RopeKvArgs`]. CPU reference: `ops::rope::Rope` and
//! `ops::attention::kv_write` (the CPU backend's own code); FP8 caches store
//! `ops::kv`'s e4m3 codec at the layer's scales ([`KvCaches`]), and rotating
//! ones Hadamard-rotate q and k heads after RoPE (`ops::hadamard`).
//! Costs: one launch, one block per token.

use gpu::{DevSlice, LaunchConfig};
use half::bf16;

use crate::abi::RopeKvArgs;
use crate::consts::ROPE_THREADS;
use crate::kv::KvCaches;
use crate::{HeadShape, KernelError, Kernels, need, u32_of};

impl Kernels {
    /// Rotates the q heads of `qkv` in place and writes rotated k and plain v
    /// of each token into `k_cache` / `v_cache` at its slot (when `kv`
    /// rotates, q and k heads Hadamard-rotated after RoPE).
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
        kv: KvCaches<'_>,             // [slots, kv_heads, D] each
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
        kv.need(K, shape.kv_width())?;
        let kv_rotate = kv.rotate_flag(K, shape.head_dim)?;
        if tokens == 0 {
            return Ok(());
        }
        let (k_cache, v_cache) = kv.ptrs();
        let (k_scale, v_scale) = kv.scales();
        let args = RopeKvArgs {
            qkv: qkv.ptr(),
            positions: positions.ptr(),
            slots: slots.ptr(),
            cos_t: cos.ptr(),
            sin_t: sin.ptr(),
            k_cache,
            v_cache,
            n_heads: u32_of(K, "num_heads", shape.num_heads)?,
            n_kv: u32_of(K, "num_kv_heads", shape.num_kv_heads)?,
            head_dim: u32_of(K, "head_dim", shape.head_dim)?,
            max_pos: u32_of(K, "max_pos", max_pos)?,
            k_scale,
            v_scale,
            kv_fp8: kv.flag(),
            kv_rotate,
        };
        let cfg = LaunchConfig::linear(u32_of(K, "tokens", tokens)?, ROPE_THREADS as u32);
        // SAFETY: dense views checked above; slot and position ranges by
        // contract; the kernel takes `RopeKvArgs`.
        unsafe { self.launch(&self.rope_kv_write, cfg, &args)? };
        Ok(())
    }
}
