//! Launcher for `cu/decode_attention.cu`: paged decode attention split over
//! the KV length, plus its combine step. The split plan is fixed per model
//! and maximum context so a captured graph can replay it for any context
//! length up to that maximum (splits past a context exit at once).
//! Costs: two launches; reads each sequence's K/V once.

use gpu::{DevSlice, LaunchArgs, LaunchConfig};
use half::bf16;

use crate::{HeadShape, KernelError, Kernels, head_dim_index, need, u32_of};

const THREADS: usize = 128;
const MAX_HEADS_PER_THREAD: usize = 16;
const SMEM_LIMIT: usize = 48 * 1024;

/// How decode attention splits a context: `chunk` keys per split, at most
/// `max_splits` splits (covering the longest context it was planned for).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodePlan {
    pub chunk: usize,
    pub max_splits: usize,
}

impl DecodePlan {
    /// Plans for contexts up to `max_context` tokens.
    pub fn new(shape: HeadShape, max_context: usize) -> Result<DecodePlan, KernelError> {
        const K: &str = "decode_attention";
        shape.check(K)?;
        let (g, d) = (shape.group(), shape.head_dim);
        head_dim_index(K, d)?;
        if g > MAX_HEADS_PER_THREAD * (THREADS / d) {
            return Err(KernelError::Unsupported {
                kernel: K,
                reason: format!(
                    "{g} query heads per KV head (at most {})",
                    MAX_HEADS_PER_THREAD * (THREADS / d)
                ),
            });
        }
        let mut chunk = 512;
        while Self::smem(g, d, chunk) > SMEM_LIMIT && chunk > 32 {
            chunk /= 2;
        }
        if Self::smem(g, d, chunk) > SMEM_LIMIT {
            return Err(KernelError::Unsupported {
                kernel: K,
                reason: format!(
                    "{g} query heads of size {d}: shared memory over {SMEM_LIMIT} bytes"
                ),
            });
        }
        Ok(DecodePlan {
            chunk,
            max_splits: max_context.max(1).div_ceil(chunk),
        })
    }

    fn smem(g: usize, d: usize, chunk: usize) -> usize {
        (g * d + g * chunk + 2 * g) * 4
    }

    /// Elements of the partial-output buffer for `num_seqs` sequences.
    pub fn partial_o_len(&self, shape: HeadShape, num_seqs: usize) -> usize {
        num_seqs * shape.num_heads * self.max_splits * shape.head_dim
    }

    /// Elements of the partial (max, sum) buffer for `num_seqs` sequences.
    pub fn partial_ml_len(&self, shape: HeadShape, num_seqs: usize) -> usize {
        num_seqs * shape.num_heads * self.max_splits * 2
    }
}

/// Sizes of one decode launch.
#[derive(Debug, Clone, Copy)]
pub struct DecodeParams {
    pub shape: HeadShape,
    pub plan: DecodePlan,
    pub num_seqs: usize,
    pub max_blocks: usize,
    pub block_size: usize,
}

impl Kernels {
    /// One query per sequence (token `s` of `qkv` belongs to sequence `s`):
    /// `out[s, h*D..] = softmax(q·Kᵀ / sqrt(D)) V` over positions `0..context_lens[s]`.
    ///
    /// # Safety
    /// Every context length is in `1..=plan.max_splits * plan.chunk`, every
    /// block id in the tables' first `ceil(ctx / block_size)` entries indexes
    /// inside the caches, and those positions' K/V were written.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn decode_attention(
        &self,
        qkv: DevSlice<'_, bf16>,         // [S, qkv_width], q roped
        k_cache: DevSlice<'_, bf16>,     // [slots, kv_heads, D]
        v_cache: DevSlice<'_, bf16>,     // [slots, kv_heads, D]
        context_lens: DevSlice<'_, u32>, // [S]
        block_tables: DevSlice<'_, u32>, // [S, max_blocks]
        part_o: DevSlice<'_, f32>,       // [S, heads, max_splits, D]
        part_ml: DevSlice<'_, f32>,      // [S, heads, max_splits, 2]
        out: DevSlice<'_, bf16>,         // [S, heads * D]
        p: DecodeParams,
    ) -> Result<(), KernelError> {
        const K: &str = "decode_attention";
        let s = p.shape;
        let plan = DecodePlan::new(s, p.plan.max_splits * p.plan.chunk)?;
        if plan.chunk != p.plan.chunk {
            return Err(KernelError::Shape {
                kernel: K,
                reason: format!(
                    "plan chunk {} differs from this shape's {}",
                    p.plan.chunk, plan.chunk
                ),
            });
        }
        let func = &self.decode[head_dim_index(K, s.head_dim)?];
        need(K, "qkv", &qkv, p.num_seqs * s.qkv_width())?;
        need(K, "context_lens", &context_lens, p.num_seqs)?;
        need(K, "block_tables", &block_tables, p.num_seqs * p.max_blocks)?;
        need(K, "part_o", &part_o, p.plan.partial_o_len(s, p.num_seqs))?;
        need(K, "part_ml", &part_ml, p.plan.partial_ml_len(s, p.num_seqs))?;
        need(K, "out", &out, p.num_seqs * s.num_heads * s.head_dim)?;
        need(K, "k_cache", &k_cache, p.block_size * s.kv_width())?;
        need(K, "v_cache", &v_cache, p.block_size * s.kv_width())?;
        if p.num_seqs == 0 {
            return Ok(());
        }
        let g = s.group();
        let cfg = LaunchConfig {
            grid: (
                u32_of(K, "max_splits", p.plan.max_splits)?,
                u32_of(K, "num_seqs", p.num_seqs)?,
                u32_of(K, "num_kv_heads", s.num_kv_heads)?,
            ),
            block: (THREADS as u32, 1, 1),
            shared_bytes: DecodePlan::smem(g, s.head_dim, p.plan.chunk) as u32,
        };
        let mut a = LaunchArgs::new();
        a.ptr(qkv)
            .ptr(k_cache)
            .ptr(v_cache)
            .ptr(context_lens)
            .ptr(block_tables)
            .ptr(part_o)
            .ptr(part_ml)
            .u32(u32_of(K, "max_blocks", p.max_blocks)?)
            .u32(u32_of(K, "num_heads", s.num_heads)?)
            .u32(u32_of(K, "num_kv_heads", s.num_kv_heads)?)
            .u32(u32_of(K, "block_size", p.block_size)?)
            .u32(p.plan.chunk as u32)
            .u32(p.plan.max_splits as u32)
            .f32(1.0 / (s.head_dim as f32).sqrt());
        // SAFETY: dense views checked above, shared memory within the plan's
        // limit; the metadata indexes inside the caches by contract.
        unsafe { self.gpu.launch(func, cfg, &mut a)? };
        let cfg = LaunchConfig {
            grid: (p.num_seqs as u32, s.num_heads as u32, 1),
            block: (s.head_dim.clamp(32, 1024) as u32, 1, 1),
            shared_bytes: 0,
        };
        let mut a = LaunchArgs::new();
        a.ptr(part_o)
            .ptr(part_ml)
            .ptr(context_lens)
            .ptr(out)
            .u32(s.num_heads as u32)
            .u32(s.head_dim as u32)
            .u32(p.plan.chunk as u32)
            .u32(p.plan.max_splits as u32);
        // SAFETY: partial buffers and out checked above for [S, heads, ...];
        // the combine reads only the splits the attention kernel wrote.
        unsafe { self.gpu.launch(&self.decode_combine, cfg, &mut a)? };
        Ok(())
    }
}
