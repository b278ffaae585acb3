//! Launcher for `cu/prefill_attention.cu`: causal flash attention over packed
//! variable-length sequences reading K/V from the paged cache, and the CPU
//! reference attention shared with the decode kernel's tests.
//! Costs: one launch; O(Σ seqlen · context · D) FLOPs, no T x T buffer.

use gpu::{DevSlice, LaunchArgs, LaunchConfig};
use half::bf16;

use crate::{HeadShape, KernelError, Kernels, head_dim_index, need, u32_of};

/// Rows of queries one block serves (tokens x query heads of one KV head).
const ROWS_PER_BLOCK: usize = 64;

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
}

impl Kernels {
    /// `out[t, h*D..] = softmax(q_t·Kᵀ / sqrt(D)) V` over the cached
    /// positions `0..=pos(t)` of `t`'s sequence (causal).
    ///
    /// # Safety
    /// `cu_seqlens`, `context_lens` and `block_tables` describe a valid batch
    /// (`StepBatch::validate`) whose every block id indexes inside the caches,
    /// and the K/V of every position up to each context length were written.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn prefill_attention(
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
        const K: &str = "prefill_attention";
        p.shape.check(K)?;
        let s = p.shape;
        let func = &self.prefill[head_dim_index(K, s.head_dim)?];
        need(K, "qkv", &qkv, p.tokens * s.qkv_width())?;
        need(K, "cu_seqlens", &cu_seqlens, p.num_seqs + 1)?;
        need(K, "context_lens", &context_lens, p.num_seqs)?;
        need(K, "block_tables", &block_tables, p.num_seqs * p.max_blocks)?;
        need(K, "out", &out, p.tokens * s.num_heads * s.head_dim)?;
        need(K, "k_cache", &k_cache, p.block_size * s.kv_width())?;
        need(K, "v_cache", &v_cache, p.block_size * s.kv_width())?;
        if p.tokens == 0 || p.num_seqs == 0 {
            return Ok(());
        }
        let g = s.group();
        let tok_per_block = (ROWS_PER_BLOCK / g).max(1);
        let threads = tok_per_block * g;
        if threads > 1024 {
            return Err(KernelError::Unsupported {
                kernel: K,
                reason: format!("{g} query heads per KV head (at most 1024)"),
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
        let mut a = LaunchArgs::new();
        a.ptr(qkv)
            .ptr(k_cache)
            .ptr(v_cache)
            .ptr(cu_seqlens)
            .ptr(context_lens)
            .ptr(block_tables)
            .ptr(out)
            .u32(u32_of(K, "max_blocks", p.max_blocks)?)
            .u32(u32_of(K, "num_heads", s.num_heads)?)
            .u32(u32_of(K, "num_kv_heads", s.num_kv_heads)?)
            .u32(u32_of(K, "block_size", p.block_size)?)
            .u32(tok_per_block as u32)
            .f32(1.0 / (s.head_dim as f32).sqrt());
        // SAFETY: dense views checked above; the batch metadata indexes inside
        // the caches by this function's contract; args match the signature.
        unsafe { self.gpu.launch(func, cfg, &mut a)? };
        Ok(())
    }
}

/// Batch metadata for [`attention_ref`].
#[derive(Debug, Clone, Copy)]
pub struct RefBatch<'a> {
    pub cu_seqlens: &'a [u32],
    pub context_lens: &'a [u32],
    pub block_tables: &'a [u32],
    pub max_blocks: usize,
    pub block_size: usize,
}

/// CPU reference attention (f64 softmax): `q` is `[T, heads * D]` (already
/// rotated), caches `[slots, kv_heads * D]`; returns `[T, heads * D]`.
pub fn attention_ref(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    b: RefBatch<'_>,
    shape: HeadShape,
) -> Vec<f32> {
    let (d, g, kvw) = (shape.head_dim, shape.group(), shape.kv_width());
    let qw = shape.num_heads * d;
    let scale = 1.0 / (d as f64).sqrt();
    let mut out = vec![0f32; q.len()];
    for s in 0..b.context_lens.len() {
        let (a, e) = (b.cu_seqlens[s] as usize, b.cu_seqlens[s + 1] as usize);
        let ctx = b.context_lens[s] as usize;
        let table = &b.block_tables[s * b.max_blocks..(s + 1) * b.max_blocks];
        let slot = |p: usize| table[p / b.block_size] as usize * b.block_size + p % b.block_size;
        for t in a..e {
            let pos = ctx - (e - a) + (t - a);
            for h in 0..shape.num_heads {
                let kvh = h / g;
                let qv = &q[t * qw + h * d..][..d];
                let scores: Vec<f64> = (0..=pos)
                    .map(|j| {
                        let k = &k_cache[slot(j) * kvw + kvh * d..][..d];
                        qv.iter()
                            .zip(k)
                            .map(|(x, y)| *x as f64 * *y as f64)
                            .sum::<f64>()
                            * scale
                    })
                    .collect();
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let w: Vec<f64> = scores.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = w.iter().sum();
                for i in 0..d {
                    let acc: f64 = (0..=pos)
                        .map(|j| w[j] * v_cache[slot(j) * kvw + kvh * d + i] as f64)
                        .sum();
                    out[t * qw + h * d + i] = (acc / z) as f32;
                }
            }
        }
    }
    out
}
