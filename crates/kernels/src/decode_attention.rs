//! Launcher for `cu/decode_attention.cu`: paged flash-decoding whose cost
//! follows the real context. The host fixes only the number of splits per
//! (sequence, KV head), from the batch size and the GPU size
//! ([`DecodePlan::splits`]); each block derives its key range from the
//! device-side context length ([`chunk_of`]), so a captured graph replayed
//! at any context does work proportional to that context.
//! Splits take at least [`DecodePlan::min_chunk`] keys ([`default_min_chunk`]:
//! one batch of a block's loads), and the last split block of a
//! (sequence, KV head) to finish merges the partials (a zeroed arrival
//! counter per (sequence, KV head), [`DecodePlan::counters_len`]).
//! A row under a sliding window ([`DecodeParams::rule`]) splits only the keys
//! of its window, so blocks older than the window are never read.
//! Costs: one launch; reads each sequence's K/V once (the window's, on a
//! windowed layer), 16 bytes per lane load, each load serving all query
//! heads of a GQA group; split partials cost `2 * (D + 2) * 4` bytes per
//! (split, head) written and read once.

use gpu::{DevSlice, LaunchConfig};
use half::bf16;

use crate::abi::DecodeArgs;
use crate::kv::KvCaches;
use crate::{HeadShape, KernelError, Kernels, head_dim_index, need, rule_args, u32_of};
use ops::attention::ScoreRule;

/// Keys per split are a multiple of this (`DECODE_CHUNK_GRAN`).
pub use crate::consts::DECODE_CHUNK_GRAN as CHUNK_GRAN;
/// Query heads per KV head the kernels are instantiated for (index 0: <= 4, 1: <= 8).
pub use crate::consts::DECODE_GROUP_CAPS as GROUP_CAPS;
use crate::consts::{DECODE_MIN_CHUNK_MAX, DECODE_THREADS as THREADS, DECODE_UNROLL};
/// Upper bound on splits per (sequence, KV head).
const MAX_SPLITS: usize = 128;
/// Splits per row of a batch-invariant plan ([`DecodePlan::invariant`]):
/// a row's key ranges then depend on its own context alone.
pub const INVARIANT_SPLITS: usize = 8;

/// Fewest keys a split takes by default at head size `head_dim`: the keys
/// a block loads in one batch ([`DECODE_UNROLL`] a lane group, `D / 8`
/// lanes a key), all of a split's first batch issued before the PDL wait,
/// at most [`DECODE_MIN_CHUNK_MAX`]: 64 at head size 64, 32 at 128, 16 at
/// 256. Short contexts then run on as many blocks as their keys fill.
pub fn default_min_chunk(head_dim: usize) -> usize {
    let lanes_per_key = (head_dim / 8).clamp(1, 32);
    let batch = DECODE_UNROLL * (THREADS / 32) * (32 / lanes_per_key);
    batch.clamp(CHUNK_GRAN, DECODE_MIN_CHUNK_MAX)
}

/// Keys per split for a context of `ctx` keys split `splits` ways
/// (the kernels' `decode_chunk`): `ceil(ctx / splits)`, at least
/// `min_chunk` ([`DecodePlan::min_chunk`]), rounded up to [`CHUNK_GRAN`].
pub fn chunk_of(ctx: usize, splits: usize, min_chunk: usize) -> usize {
    ctx.div_ceil(splits.max(1))
        .max(min_chunk)
        .next_multiple_of(CHUNK_GRAN)
}

/// `Ok` for a minimum split the kernel takes: a positive multiple of
/// [`CHUNK_GRAN`] keys that fits its `u32` argument.
pub fn check_min_chunk(keys: usize) -> Result<(), KernelError> {
    if keys == 0 || !keys.is_multiple_of(CHUNK_GRAN) || u32::try_from(keys).is_err() {
        return Err(KernelError::Unsupported {
            kernel: "decode_attention",
            reason: format!(
                "a minimum split of {keys} keys (must be a positive multiple of {CHUNK_GRAN})"
            ),
        });
    }
    Ok(())
}

/// How decode attention spreads a step over the GPU: enough blocks of
/// (split, sequence, KV head) to reach `target_blocks` (two waves of the
/// SMs is a good target), one split per (sequence, KV head) once the batch
/// alone fills that many; no split takes fewer than `min_chunk` keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodePlan {
    pub target_blocks: usize,
    /// Fewest keys a split takes ([`default_min_chunk`] unless set): larger means
    /// fewer partials to merge and fewer blocks, smaller more parallelism.
    pub min_chunk: usize,
    /// Splits per row whatever the batch (batch-invariant; 0: follow the batch).
    pub fixed_splits: usize,
}

impl DecodePlan {
    /// Checks `shape` is supported and plans for about `target_blocks` blocks a step.
    pub fn new(shape: HeadShape, target_blocks: usize) -> Result<DecodePlan, KernelError> {
        const K: &str = "decode_attention";
        shape.check(K)?;
        head_dim_index(K, shape.head_dim)?;
        group_index(shape.group())?;
        Ok(DecodePlan {
            target_blocks: target_blocks.max(1),
            min_chunk: default_min_chunk(shape.head_dim),
            fixed_splits: 0,
        })
    }

    /// The same plan with [`INVARIANT_SPLITS`] splits per row at every
    /// batch size: a row's key ranges, and so its result, depend on its
    /// own context alone (deterministic mode).
    pub fn invariant(self) -> DecodePlan {
        DecodePlan {
            fixed_splits: INVARIANT_SPLITS,
            ..self
        }
    }

    /// The same plan with splits of at least `keys` keys ([`check_min_chunk`]).
    pub fn with_min_chunk(self, keys: usize) -> Result<DecodePlan, KernelError> {
        check_min_chunk(keys)?;
        Ok(DecodePlan {
            min_chunk: keys,
            ..self
        })
    }

    /// Splits per (sequence, KV head) for a step of `num_seqs` sequences.
    pub fn splits(&self, shape: HeadShape, num_seqs: usize) -> usize {
        if self.fixed_splits > 0 {
            return self.fixed_splits.min(MAX_SPLITS);
        }
        let per = num_seqs.max(1) * shape.num_kv_heads.max(1);
        self.target_blocks.div_ceil(per).clamp(1, MAX_SPLITS)
    }

    /// Split rows (`seqs * splits`) a buffer must hold for any step of at most `num_seqs`.
    fn split_rows(&self, shape: HeadShape, num_seqs: usize) -> usize {
        (1..=num_seqs)
            .map(|s| s * self.splits(shape, s))
            .max()
            .unwrap_or(0)
    }

    /// Elements of the partial-output buffer for steps of up to `num_seqs` sequences.
    pub fn partial_o_len(&self, shape: HeadShape, num_seqs: usize) -> usize {
        self.split_rows(shape, num_seqs) * shape.num_heads * shape.head_dim
    }

    /// Arrival counters (`u32`, zeroed once at allocation) for steps of up to
    /// `num_seqs` sequences; the kernel leaves them zero after every launch.
    pub fn counters_len(&self, shape: HeadShape, num_seqs: usize) -> usize {
        num_seqs * shape.num_kv_heads
    }

    /// Elements of the partial (max, sum) buffer for steps of up to `num_seqs` sequences.
    pub fn partial_ml_len(&self, shape: HeadShape, num_seqs: usize) -> usize {
        self.split_rows(shape, num_seqs) * shape.num_heads * 2
    }
}

/// Index of the kernel instantiated for `group` query heads per KV head.
fn group_index(group: usize) -> Result<usize, KernelError> {
    GROUP_CAPS
        .iter()
        .position(|&c| group <= c)
        .ok_or(KernelError::Unsupported {
            kernel: "decode_attention",
            reason: format!("{group} query heads per KV head (at most {GROUP_CAPS:?})"),
        })
}

/// Sizes of one decode launch.
#[derive(Debug, Clone, Copy)]
pub struct DecodeParams {
    pub shape: HeadShape,
    pub plan: DecodePlan,
    /// Query rows: sequences, or token rows ([`DecodeRows::Tokens`]).
    pub num_seqs: usize,
    pub max_blocks: usize,
    pub block_size: usize,
    /// Keys at the end of each sequence's context that this step's earlier
    /// kernels write (at least 1: the new token's); sequence rows only.
    pub fresh: usize,
    /// Rows with a shorter context are left alone (for another launch; 0: none).
    pub min_ctx: usize,
    /// The layer's score scale and sliding window (no soft-cap).
    pub rule: ScoreRule,
}

/// What the query rows of a decode launch are.
#[derive(Clone, Copy)]
pub enum DecodeRows<'a> {
    /// One row per sequence, attending to `context_lens [S]` keys.
    Seqs { context_lens: DevSlice<'a, u32> },
    /// Token rows of `num_seqs` segments (`cu_seqlens [S + 1]`): row `t`
    /// attends to `positions[t] + 1` keys of its segment's sequence, so a
    /// prompt's tokens compute exactly as decode rows would.
    Tokens {
        positions: DevSlice<'a, u32>,
        cu_seqlens: DevSlice<'a, u32>,
        num_seqs: usize,
    },
}

impl Kernels {
    /// One query per row (row `r` of `qkv` is query row `r`, `rows` says
    /// whose keys it reads): `out[r, h*D..] = softmax(q·Kᵀ · scale) V`
    /// over its keys, positions `rule.first(ctx - 1)..ctx` (zeros for an
    /// empty context).
    ///
    /// # Safety
    /// For each row, the first `ceil(ctx / block_size)` entries of its
    /// sequence's table row (ctx <= max_blocks * block_size) index blocks
    /// inside the caches, and the K/V of positions `0..ctx` were written;
    /// token rows' `cu_seqlens` are non-decreasing from 0 and cover them.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn decode_attention(
        &self,
        qkv: DevSlice<'_, bf16>, // [rows, qkv_width], q roped
        kv: KvCaches<'_>,        // [slots, kv_heads, D] each
        rows: DecodeRows<'_>,
        block_tables: DevSlice<'_, u32>, // [S, max_blocks]
        part_o: DevSlice<'_, f32>,       // [S, heads, splits, D]
        part_ml: DevSlice<'_, f32>,      // [S, heads, splits, 2]
        counters: DevSlice<'_, u32>,     // [S, kv_heads], zero
        out: DevSlice<'_, bf16>,         // [S, heads * D]
        p: DecodeParams,
    ) -> Result<(), KernelError> {
        const K: &str = "decode_attention";
        let s = p.shape;
        DecodePlan::new(s, p.plan.target_blocks)?.with_min_chunk(p.plan.min_chunk)?;
        let funcs = if kv.is_fp8() {
            &self.decode8
        } else {
            &self.decode
        };
        let func = &funcs[head_dim_index(K, s.head_dim)?][group_index(s.group())?];
        let (scale, window) = rule_args(K, &p.rule)?;
        let splits = p.plan.splits(s, p.num_seqs);
        need(K, "qkv", &qkv, p.num_seqs * s.qkv_width())?;
        let (context_lens, positions, cu_seqlens, seqs) = match rows {
            DecodeRows::Seqs { context_lens } => {
                need(K, "context_lens", &context_lens, p.num_seqs)?;
                (context_lens.ptr(), 0, 0, p.num_seqs)
            }
            DecodeRows::Tokens {
                positions,
                cu_seqlens,
                num_seqs,
            } => {
                need(K, "positions", &positions, p.num_seqs)?;
                need(K, "cu_seqlens", &cu_seqlens, num_seqs + 1)?;
                (0, positions.ptr(), cu_seqlens.ptr(), num_seqs)
            }
        };
        need(K, "block_tables", &block_tables, seqs * p.max_blocks)?;
        if splits > 1 {
            let rows = p.num_seqs * splits * s.num_heads;
            need(K, "part_o", &part_o, rows * s.head_dim)?;
            need(K, "part_ml", &part_ml, rows * 2)?;
            need(K, "counters", &counters, p.num_seqs * s.num_kv_heads)?;
        }
        need(K, "out", &out, p.num_seqs * s.num_heads * s.head_dim)?;
        kv.need(K, p.block_size * s.kv_width())?;
        if p.num_seqs == 0 {
            return Ok(());
        }
        let (k_cache, v_cache) = kv.ptrs();
        let (k_scale, v_scale) = kv.scales();
        let args = DecodeArgs {
            qkv: qkv.ptr(),
            k_cache,
            v_cache,
            context_lens,
            block_tables: block_tables.ptr(),
            part_o: part_o.ptr(),
            part_ml: part_ml.ptr(),
            out: out.ptr(),
            counters: counters.ptr(),
            max_blocks: u32_of(K, "max_blocks", p.max_blocks)?,
            n_heads: u32_of(K, "num_heads", s.num_heads)?,
            n_kv: u32_of(K, "num_kv_heads", s.num_kv_heads)?,
            block_size: u32_of(K, "block_size", p.block_size)?,
            splits: splits as u32,
            scale_log2: std::f32::consts::LOG2_E * scale,
            min_chunk: p.plan.min_chunk as u32,
            k_scale,
            v_scale,
            fresh: u32_of(K, "fresh", p.fresh.max(1))?,
            positions,
            cu_seqlens,
            num_seqs: u32_of(K, "num_seqs", seqs)?,
            min_ctx: u32_of(K, "min_ctx", p.min_ctx)?,
            window,
            pad: 0,
        };
        let cfg = LaunchConfig {
            grid: (splits as u32, u32_of(K, "num_seqs", p.num_seqs)?, args.n_kv),
            block: (THREADS as u32, 1, 1),
            shared_bytes: 0,
        };
        // SAFETY: dense views checked above (partials and counters only when
        // used); the kernel's static shared memory is within the default
        // limit; the metadata indexes inside the caches by contract;
        // DecodeArgs mirrors the kernel's struct (asserted on both sides).
        unsafe { self.launch_pdl(func, cfg, &args)? };
        Ok(())
    }
}

/// CPU model of the kernels' arithmetic for one step (`q`: `[S, heads * D]`,
/// caches `[slots, kv_heads * D]`): a row of context `ctx` reads keys
/// `lo..ctx`, `lo = rule.first(ctx - 1)`; per split an online softmax in
/// the log2 domain over keys `lo + split * chunk ..` up to the next split's
/// first key or `ctx` (`chunk` from the `ctx - lo` keys), then the combine.
/// Tests check it against `ops::attention::paged_attention_with` (the one
/// reference), which validates the split arithmetic (chunking, empty
/// splits, merging, windows).
#[allow(clippy::too_many_arguments)]
pub fn decode_split_ref(
    q: &[f32],            // [S, heads * D]
    k_cache: &[f32],      // [slots, kv_heads * D]
    v_cache: &[f32],      // [slots, kv_heads * D]
    context_lens: &[u32], // [S]
    block_tables: &[u32], // [S, max_blocks]
    max_blocks: usize,
    block_size: usize,
    shape: HeadShape,
    splits: usize,
    min_chunk: usize,
    rule: ScoreRule,
) -> Vec<f32> {
    let (d, g, kvw) = (shape.head_dim, shape.group(), shape.kv_width());
    let qw = shape.num_heads * d;
    let scale = std::f32::consts::LOG2_E * rule.scale;
    let mut out = vec![0f32; q.len()];
    for (s, &ctx) in context_lens.iter().enumerate() {
        let ctx = ctx as usize;
        let table = &block_tables[s * max_blocks..(s + 1) * max_blocks];
        let slot = |p: usize| table[p / block_size] as usize * block_size + p % block_size;
        let lo = ctx.checked_sub(1).map_or(0, |p| rule.first(p));
        let chunk = chunk_of(ctx - lo, splits, min_chunk);
        for h in 0..shape.num_heads {
            let kvh = h / g;
            let qv = &q[s * qw + h * d..][..d];
            // (max, sum, acc) per split
            let mut parts = Vec::new();
            for sp in 0..splits {
                let (a, e) = (lo + sp * chunk, (lo + (sp + 1) * chunk).min(ctx));
                if a >= e {
                    continue;
                }
                let (mut m, mut l, mut acc) = (f32::NEG_INFINITY, 0f32, vec![0f32; d]);
                for j in a..e {
                    let k = &k_cache[slot(j) * kvw + kvh * d..][..d];
                    let v = &v_cache[slot(j) * kvw + kvh * d..][..d];
                    let x: f32 = qv.iter().zip(k).map(|(x, y)| x * scale * y).sum();
                    let mn = m.max(x);
                    let (c, p) = ((m - mn).exp2(), (x - mn).exp2());
                    l = l * c + p;
                    acc.iter_mut().zip(v).for_each(|(o, v)| *o = *o * c + p * v);
                    m = mn;
                }
                parts.push((m, l, acc));
            }
            let mm = parts.iter().map(|p| p.0).fold(f32::NEG_INFINITY, f32::max);
            let l: f32 = parts.iter().map(|p| p.1 * (p.0 - mm).exp2()).sum();
            for i in 0..d {
                let o: f32 = parts.iter().map(|p| p.2[i] * (p.0 - mm).exp2()).sum();
                out[s * qw + h * d + i] = if l > 0.0 { o / l } else { 0.0 };
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHAPE: HeadShape = HeadShape {
        num_heads: 32,
        num_kv_heads: 8,
        head_dim: 64,
    };

    #[test]
    fn splits_follow_the_batch_and_buffers_hold_every_batch() {
        let plan = DecodePlan::new(SHAPE, 264).unwrap();
        assert_eq!(plan.splits(SHAPE, 1), 33);
        assert_eq!(plan.splits(SHAPE, 64), 1);
        for n in 1..300 {
            let rows = n * plan.splits(SHAPE, n) * SHAPE.num_heads;
            assert!(plan.partial_ml_len(SHAPE, n) >= rows * 2);
            assert!(plan.partial_o_len(SHAPE, 300) >= rows * SHAPE.head_dim);
        }
    }

    #[test]
    fn chunks_cover_the_context_in_at_most_splits_pieces() {
        for min in [DECODE_MIN_CHUNK_MAX, CHUNK_GRAN, 256] {
            for ctx in 0..600 {
                for splits in [1, 2, 3, 7, 33, 128] {
                    let c = chunk_of(ctx, splits, min);
                    assert!(c.is_multiple_of(CHUNK_GRAN) && c >= min);
                    assert!(c * splits >= ctx, "ctx {ctx} splits {splits}");
                    // no split smaller than `min` is made just to use all splits
                    assert!(ctx.div_ceil(c) <= ctx.div_ceil(min).max(1));
                }
            }
        }
    }

    #[test]
    fn the_default_split_is_one_batch_of_loads_at_most_64_keys() {
        let want = [(16, 64), (32, 64), (64, 64), (128, 32), (256, 16)];
        for (d, keys) in want {
            assert_eq!(default_min_chunk(d), keys, "head size {d}");
            check_min_chunk(keys).unwrap();
        }
        for d in crate::HEAD_DIMS {
            let c = default_min_chunk(d);
            assert!(c.is_multiple_of(CHUNK_GRAN) && c <= DECODE_MIN_CHUNK_MAX);
        }
    }

    #[test]
    fn min_chunk_must_be_a_multiple_of_the_granule() {
        let plan = DecodePlan::new(SHAPE, 264).unwrap();
        assert_eq!(plan.min_chunk, default_min_chunk(SHAPE.head_dim));
        assert_eq!(plan.with_min_chunk(256).unwrap().min_chunk, 256);
        for bad in [0, CHUNK_GRAN + 1] {
            let e = plan.with_min_chunk(bad).unwrap_err().to_string();
            assert!(e.contains(&bad.to_string()), "{e}");
        }
    }

    #[test]
    fn rejects_groups_over_the_instantiated_caps() {
        let s = HeadShape {
            num_heads: 32,
            num_kv_heads: 2,
            head_dim: 64,
        };
        assert!(DecodePlan::new(s, 100).is_err());
    }
}
