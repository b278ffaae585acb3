//! Launcher for `cu/flash_prefill.cu`: tensor-core (mma.sync bf16)
//! FlashAttention-2 prefill over packed variable-length sequences, reading
//! every key and value from the paged cache; same contract and semantics as
//! [`Kernels::prefill_attention`] (causal, GQA, scale `1/sqrt(D)`), for the
//! head sizes in [`FLASH_HEAD_DIMS`] and at most [`FLASH_MAX_GROUP`] query
//! heads per KV head ([`Kernels::flash_prefill_supports`]).
//! Costs: one launch of `ceil(max_seqlen / (128 / G)) x S x kv_heads` CTAs of
//! 256 threads and `(128 + 4 * 64) * D * 2` bytes of shared memory; O(Σ seqlen
//! · context · D) tensor-core FLOPs, K/V read once per 128-row query tile; no
//! T x T buffer, no atomics (deterministic).

use std::mem::{offset_of, size_of};

use gpu::{DevSlice, Function, LaunchConfig, Module};
use half::bf16;

use crate::prefill_attention::PrefillParams;
use crate::{KernelError, Kernels, need, u32_of};

/// Head sizes the flash kernel is instantiated for (index = entry in `Kernels::flash_prefill`).
pub const FLASH_HEAD_DIMS: [usize; 2] = [64, 128];
/// Keys per shared-memory tile.
use crate::consts::FLASH_KEYS as KEYS;
/// Query rows of one CTA (16 per warp, 8 warps): tokens x query heads of one KV head.
use crate::consts::FLASH_ROWS as ROWS;
const THREADS: u32 = crate::consts::FLASH_THREADS as u32;
/// Most query heads per KV head one CTA can pack.
pub const FLASH_MAX_GROUP: usize = ROWS;

/// Mirrors `struct FlashPrefillArgs` in `cu/flash_prefill.cu`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct FlashPrefillArgs {
    qkv: u64,          // [T, qkv_width], q roped
    k_cache: u64,      // [slots, kv_heads, D]
    v_cache: u64,      // [slots, kv_heads, D]
    cu_seqlens: u64,   // [S + 1]
    context_lens: u64, // [S]
    block_tables: u64, // [S, max_blocks]
    out: u64,          // [T, heads * D]
    max_blocks: u32,
    num_heads: u32,
    num_kv_heads: u32,
    block_size: u32,
    tok_per_tile: u32,
    scale_log2: f32,
}
const _: () = {
    assert!(size_of::<FlashPrefillArgs>() == 80);
    assert!(offset_of!(FlashPrefillArgs, qkv) == 0);
    assert!(offset_of!(FlashPrefillArgs, k_cache) == 8);
    assert!(offset_of!(FlashPrefillArgs, v_cache) == 16);
    assert!(offset_of!(FlashPrefillArgs, cu_seqlens) == 24);
    assert!(offset_of!(FlashPrefillArgs, context_lens) == 32);
    assert!(offset_of!(FlashPrefillArgs, block_tables) == 40);
    assert!(offset_of!(FlashPrefillArgs, out) == 48);
    assert!(offset_of!(FlashPrefillArgs, max_blocks) == 56);
    assert!(offset_of!(FlashPrefillArgs, num_heads) == 60);
    assert!(offset_of!(FlashPrefillArgs, num_kv_heads) == 64);
    assert!(offset_of!(FlashPrefillArgs, block_size) == 68);
    assert!(offset_of!(FlashPrefillArgs, tok_per_tile) == 72);
    assert!(offset_of!(FlashPrefillArgs, scale_log2) == 76);
};

/// Dynamic shared memory of one CTA: Q tile plus double-buffered K and V tiles.
fn shared_bytes(head_dim: usize) -> usize {
    (ROWS + 4 * KEYS) * head_dim * size_of::<bf16>()
}

/// Resolves the flash entry points and allows their shared memory.
pub(crate) fn load_functions(module: &Module) -> Result<[Function; 2], KernelError> {
    let f = |d: usize| -> Result<Function, KernelError> {
        let func = module.function(&format!("flash_prefill_d{d}"))?;
        func.set_max_dynamic_shared(shared_bytes(d))?;
        Ok(func)
    };
    Ok([f(FLASH_HEAD_DIMS[0])?, f(FLASH_HEAD_DIMS[1])?])
}

impl Kernels {
    /// Whether [`Kernels::flash_prefill`] serves `p`'s head shape.
    pub fn flash_prefill_supports(&self, p: &PrefillParams) -> bool {
        let s = p.shape;
        FLASH_HEAD_DIMS.contains(&s.head_dim)
            && s.num_kv_heads > 0
            && s.num_heads.is_multiple_of(s.num_kv_heads)
            && s.group() <= FLASH_MAX_GROUP
    }

    /// `out[t, h*D..] = softmax(q_t·Kᵀ / sqrt(D)) V` over the cached
    /// positions `0..=pos(t)` of `t`'s sequence (causal), on tensor cores.
    ///
    /// # Safety
    /// As [`Kernels::prefill_attention`]: `cu_seqlens`, `context_lens` and
    /// `block_tables` describe a valid batch whose every block id indexes
    /// inside the caches, `max_seqlen` bounds every segment, and the K/V of
    /// every position up to each context length were written.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn flash_prefill(
        &self,
        qkv: DevSlice<'_, bf16>,         // [T, qkv_width], q roped
        k_cache: DevSlice<'_, bf16>,     // [slots, kv_heads, D]
        v_cache: DevSlice<'_, bf16>,     // [slots, kv_heads, D]
        cu_seqlens: DevSlice<'_, u32>,   // [S + 1]
        context_lens: DevSlice<'_, u32>, // [S]
        block_tables: DevSlice<'_, u32>, // [S, max_blocks]
        out: DevSlice<'_, bf16>,         // [T, heads * D]
        p: PrefillParams,
    ) -> Result<(), KernelError> {
        const K: &str = "flash_prefill";
        let s = p.shape;
        if !self.flash_prefill_supports(&p) {
            return Err(KernelError::Unsupported {
                kernel: K,
                reason: format!(
                    "{s:?} (head dims {FLASH_HEAD_DIMS:?}, at most {FLASH_MAX_GROUP} query heads per KV head)"
                ),
            });
        }
        let idx = FLASH_HEAD_DIMS
            .iter()
            .position(|&d| d == s.head_dim)
            .unwrap_or_default();
        need(K, "qkv", &qkv, p.tokens * s.qkv_width())?;
        need(K, "cu_seqlens", &cu_seqlens, p.num_seqs + 1)?;
        need(K, "context_lens", &context_lens, p.num_seqs)?;
        need(K, "block_tables", &block_tables, p.num_seqs * p.max_blocks)?;
        need(K, "out", &out, p.tokens * s.num_heads * s.head_dim)?;
        need(K, "k_cache", &k_cache, p.block_size * s.kv_width())?;
        need(K, "v_cache", &v_cache, p.block_size * s.kv_width())?;
        if p.tokens == 0 || p.num_seqs == 0 || p.max_seqlen == 0 {
            return Ok(());
        }
        let tok_per_tile = ROWS / s.group();
        let cfg = LaunchConfig {
            grid: (
                u32_of(K, "tiles", p.max_seqlen.div_ceil(tok_per_tile))?,
                u32_of(K, "num_seqs", p.num_seqs)?,
                u32_of(K, "num_kv_heads", s.num_kv_heads)?,
            ),
            block: (THREADS, 1, 1),
            shared_bytes: shared_bytes(s.head_dim) as u32,
        };
        let args = FlashPrefillArgs {
            qkv: qkv.ptr(),
            k_cache: k_cache.ptr(),
            v_cache: v_cache.ptr(),
            cu_seqlens: cu_seqlens.ptr(),
            context_lens: context_lens.ptr(),
            block_tables: block_tables.ptr(),
            out: out.ptr(),
            max_blocks: u32_of(K, "max_blocks", p.max_blocks)?,
            num_heads: u32_of(K, "num_heads", s.num_heads)?,
            num_kv_heads: u32_of(K, "num_kv_heads", s.num_kv_heads)?,
            block_size: u32_of(K, "block_size", p.block_size)?,
            tok_per_tile: tok_per_tile as u32,
            scale_log2: std::f32::consts::LOG2_E / (s.head_dim as f32).sqrt(),
        };
        // SAFETY: dense views checked above; the batch metadata indexes inside
        // the caches by this function's contract; `args` mirrors the kernel's
        // `FlashPrefillArgs` (layout asserted on both sides).
        unsafe {
            self.gpu
                .launch_struct(&self.flash_prefill[idx], cfg, &args)?
        };
        Ok(())
    }
}
