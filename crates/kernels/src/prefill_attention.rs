//! Launcher for `cu/prefill_attention.cu`: causal flash attention over packed
//! variable-length sequences reading K/V from the paged cache, under the
//! layer's [`ScoreRule`] (scale, sliding window); one kernel per head size
//! of [`crate::HEAD_DIMS`] (256 included: the head size the flash kernels do
//! not serve runs here), each taking one [`PrefillAttentionArgs`]. CPU
//! reference: `ops::attention::paged_attention_with` (the CPU backend's
//! attention, also the decode kernel's reference).
//! Costs: one launch; O(Σ seqlen · min(context, window) · D) FLOPs, no
//! T x T buffer.

use gpu::{DevSlice, LaunchConfig};
use half::bf16;

use crate::abi::PrefillAttentionArgs;
use crate::consts::{MAX_THREADS_PER_BLOCK, PREFILL_ROWS_PER_BLOCK};
use crate::kv::KvCaches;
use crate::{HeadShape, KernelError, Kernels, head_dim_index, need, rule_args, u32_of};
use ops::attention::ScoreRule;

/// Sizes of one packed prefill launch.
#[derive(Debug, Clone, Copy)]
pub struct PrefillParams {
    pub shape: HeadShape,
    pub tokens: usize,
    pub num_seqs: usize,
    /// Longest segment in `cu_seqlens`.
    pub max_seqlen: usize,
    /// Row length of `block_tables`.
    pub max_blocks: usize,
    pub block_size: usize,
    /// The layer's score scale and sliding window (no soft-cap).
    pub rule: ScoreRule,
}

impl Kernels {
    /// `out[t, h*D..] = softmax(q_t·Kᵀ · scale) V` over the cached
    /// positions `rule.first(pos(t))..=pos(t)` of `t`'s sequence (causal,
    /// within the window).
    ///
    /// # Safety
    /// `cu_seqlens`, `context_lens` and `block_tables` describe a valid batch
    /// (`StepBatch::validate`) whose every block id indexes inside the caches,
    /// and the K/V of every position up to each context length were written.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn prefill_attention(
        &self,
        qkv: DevSlice<'_, bf16>,         // [T, qkv_width], q roped
        kv: KvCaches<'_>,                // [slots, kv_heads, D] each
        cu_seqlens: DevSlice<'_, u32>,   // [S + 1]
        context_lens: DevSlice<'_, u32>, // [S]
        block_tables: DevSlice<'_, u32>, // [S, max_blocks]
        out: DevSlice<'_, bf16>,         // [T, heads * D]
        p: PrefillParams,
    ) -> Result<(), KernelError> {
        const K: &str = "prefill_attention";
        p.shape.check(K)?;
        let s = p.shape;
        let funcs = if kv.is_fp8() {
            &self.prefill8
        } else {
            &self.prefill
        };
        let func = &funcs[head_dim_index(K, s.head_dim)?];
        let (scale, window) = rule_args(K, &p.rule)?;
        need(K, "qkv", &qkv, p.tokens * s.qkv_width())?;
        need(K, "cu_seqlens", &cu_seqlens, p.num_seqs + 1)?;
        need(K, "context_lens", &context_lens, p.num_seqs)?;
        need(K, "block_tables", &block_tables, p.num_seqs * p.max_blocks)?;
        need(K, "out", &out, p.tokens * s.num_heads * s.head_dim)?;
        kv.need(K, p.block_size * s.kv_width())?;
        if p.tokens == 0 || p.num_seqs == 0 {
            return Ok(());
        }
        let g = s.group();
        let tok_per_block = (PREFILL_ROWS_PER_BLOCK / g).max(1);
        let threads = tok_per_block * g;
        if threads > MAX_THREADS_PER_BLOCK {
            return Err(KernelError::Unsupported {
                kernel: K,
                reason: format!("{g} query heads per KV head (at most {MAX_THREADS_PER_BLOCK})"),
            });
        }
        let cfg = LaunchConfig {
            grid: (
                u32_of(K, "tiles", p.max_seqlen.div_ceil(tok_per_block))?,
                u32_of(K, "num_seqs", p.num_seqs)?,
                u32_of(K, "num_kv_heads", s.num_kv_heads)?,
            ),
            block: (threads as u32, 1, 1),
            shared_bytes: 0,
        };
        let (k_cache, v_cache) = kv.ptrs();
        let (k_scale, v_scale) = kv.scales();
        let args = PrefillAttentionArgs {
            qkv: qkv.ptr(),
            k_cache,
            v_cache,
            cu_seqlens: cu_seqlens.ptr(),
            context_lens: context_lens.ptr(),
            block_tables: block_tables.ptr(),
            out: out.ptr(),
            max_blocks: u32_of(K, "max_blocks", p.max_blocks)?,
            n_heads: u32_of(K, "num_heads", s.num_heads)?,
            n_kv: u32_of(K, "num_kv_heads", s.num_kv_heads)?,
            block_size: u32_of(K, "block_size", p.block_size)?,
            tok_per_block: tok_per_block as u32,
            scale,
            k_scale,
            v_scale,
            window,
            pad: 0,
        };
        // SAFETY: dense views checked above; the batch metadata indexes inside
        // the caches by this function's contract; every prefill kernel takes
        // `PrefillAttentionArgs`.
        unsafe { self.launch(func, cfg, &args)? };
        Ok(())
    }
}
