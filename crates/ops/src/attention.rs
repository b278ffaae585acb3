//! The paged KV write and causal attention over packed sequences.
//!
//! Contract:
//! - A KV cache is one `[slots, kv_heads * head_dim]` array per K and V
//!   (the CUDA layout `[slots, kv_heads, head_dim]`): f32 for [`kv_write`]
//!   and [`paged_attention`] (the exact reference, and the kernels'
//!   tests'), any [`crate::kv`] type for [`kv_write_in`] and
//!   [`paged_attention_in`] (stored through the one codec, widened row by
//!   row as read; over f32 the same bits as the f32 pair). [`kv_write`]
//!   writes token `i`'s row at physical slot `slots[i]`; attention reads
//!   position `j` of sequence `s` at slot
//!   `table[j / block_size] * block_size + j % block_size`, so any block
//!   layout the scheduler hands out is read back correctly.
//! - [`paged_attention`] lets each token of sequence `s` at position `p`
//!   attend to positions `0..=p` of `s` (earlier steps' K/V included), with
//!   GQA (query head `h` reads KV head `h / (heads / kv_heads)`), scale
//!   `1 / sqrt(head_dim)`, f32 softmax.
//!
//! Costs: the write O(T * kv_width); attention O(sum over tokens of
//! (p + 1) heads head_dim) reads of the cache, parallel over (token, head)
//! pairs with one reusable score buffer per rayon worker.

use crate::kv::{KvCache, KvView};
use crate::linear::dot;
use rayon::prelude::*;

/// Head counts and size of one attention layer.
#[derive(Debug, Clone, Copy)]
pub struct AttnDims {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

/// Where the tokens of a packed step sit (the fields of a `StepBatch`).
#[derive(Debug, Clone, Copy)]
pub struct PagedSeqs<'a> {
    /// `[S + 1]` token offsets of each sequence's segment.
    pub cu_seqlens: &'a [u32],
    /// `[T]` absolute position of each token in its sequence.
    pub positions: &'a [u32],
    /// `[S, max_blocks]` row-major block tables.
    pub block_tables: &'a [u32],
    pub max_blocks: usize,
    pub block_size: usize,
}

/// `[T]` positions of packed segments that end their sequences' contexts:
/// token `i` of segment `s` (length `len`) sits at `context_lens[s] - len + i`.
pub fn positions_of(cu_seqlens: &[u32], context_lens: &[u32]) -> Vec<u32> {
    let mut pos = Vec::new();
    for (s, &ctx) in context_lens.iter().enumerate() {
        let len = cu_seqlens[s + 1] - cu_seqlens[s];
        pos.extend((0..len).map(|i| ctx - len + i));
    }
    pos
}

/// Writes `k`, `v` (`[T, kv_width]`) into `k_cache`, `v_cache`
/// (`[slots, kv_width]`) at rows `slots[i]`.
pub fn kv_write(
    k_cache: &mut [f32],
    v_cache: &mut [f32],
    k: &[f32],
    v: &[f32],
    slots: &[u32],
    kv_width: usize,
) {
    let d = kv_width;
    for (i, &slot) in slots.iter().enumerate() {
        let s = slot as usize * d;
        k_cache[s..s + d].copy_from_slice(&k[i * d..(i + 1) * d]);
        v_cache[s..s + d].copy_from_slice(&v[i * d..(i + 1) * d]);
    }
}

/// [`kv_write`] into caches of any stored type: each row stored through
/// [`crate::kv::KvElem::put`] (rounded to BF16, or to FP8 at the cache's scale).
pub fn kv_write_in(
    k_cache: &mut KvCache,
    v_cache: &mut KvCache,
    k: &[f32],
    v: &[f32],
    slots: &[u32],
    kv_width: usize,
) {
    let d = kv_width;
    for (i, &slot) in slots.iter().enumerate() {
        let s = slot as usize * d;
        k_cache.put(s, &k[i * d..(i + 1) * d]);
        v_cache.put(s, &v[i * d..(i + 1) * d]);
    }
}

/// Causal attention of the step's queries `q` (`[T, heads * head_dim]`, RoPE
/// applied) over the paged caches `k_cache`, `v_cache` (`[slots, kv_heads *
/// head_dim]`, this step's rows already written). Returns `[T, heads * head_dim]`.
pub fn paged_attention(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    seqs: PagedSeqs<'_>,
    dims: AttnDims,
) -> Vec<f32> {
    paged_attention_in(q, KvView::F32(k_cache), KvView::F32(v_cache), seqs, dims)
}

/// [`paged_attention`] over caches of any stored type: each key and value
/// row is widened ([`KvView::get`]) as it is read, then the same f32
/// arithmetic runs (over f32 caches, the same bits).
pub fn paged_attention_in(
    q: &[f32],
    k_cache: KvView<'_>,
    v_cache: KvView<'_>,
    seqs: PagedSeqs<'_>,
    dims: AttnDims,
) -> Vec<f32> {
    let AttnDims {
        heads,
        kv_heads,
        head_dim: hd,
    } = dims;
    let group = heads / kv_heads;
    let kv_dim = kv_heads * hd;
    let bs = seqs.block_size;
    let scale = 1.0 / (hd as f32).sqrt();
    // [T] sequence index of each token
    let seq_of: Vec<usize> = (0..seqs.cu_seqlens.len().saturating_sub(1))
        .flat_map(|s| {
            let n = seqs.cu_seqlens[s + 1] - seqs.cu_seqlens[s];
            std::iter::repeat_n(s, n as usize)
        })
        .collect();
    let mut out = vec![0f32; q.len()];
    out.par_chunks_mut(hd).enumerate().for_each_init(
        || (Vec::<f32>::new(), vec![0f32; hd]),
        |(scores, kv_row), (idx, o)| {
            let (t, h) = (idx / heads, idx % heads);
            let s = seq_of[t];
            let table = &seqs.block_tables[s * seqs.max_blocks..(s + 1) * seqs.max_blocks];
            let ctx = seqs.positions[t] as usize + 1;
            let qh = &q[t * heads * hd + h * hd..][..hd];
            let koff = (h / group) * hd;
            let row = |j: usize| (table[j / bs] as usize * bs + j % bs) * kv_dim + koff;
            scores.clear();
            scores.extend((0..ctx).map(|j| {
                k_cache.get(row(j), kv_row);
                dot(qh, kv_row) * scale
            }));
            let m = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0f32;
            for s in scores.iter_mut() {
                *s = (*s - m).exp();
                sum += *s;
            }
            let inv = 1.0 / sum;
            for (j, &p) in scores.iter().enumerate() {
                let w = p * inv;
                v_cache.get(row(j), kv_row);
                for (a, &b) in o.iter_mut().zip(kv_row.iter()) {
                    *a += w * b;
                }
            }
        },
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_key_returns_its_value_and_blocks_are_followed() {
        // one sequence of 2 tokens in block 1 (block_size 2); 1 head of size 2
        let dims = AttnDims {
            heads: 1,
            kv_heads: 1,
            head_dim: 2,
        };
        let (mut kc, mut vc) = (vec![0f32; 8], vec![0f32; 8]);
        kv_write(
            &mut kc,
            &mut vc,
            &[1.0, 0.0, 0.0, 1.0],
            &[5.0, 6.0, 7.0, 8.0],
            &[2, 3],
            2,
        );
        assert_eq!(&vc[4..], &[5.0, 6.0, 7.0, 8.0]);
        let cu = [0, 2];
        let positions = positions_of(&cu, &[2]);
        assert_eq!(positions, vec![0, 1]);
        let seqs = PagedSeqs {
            cu_seqlens: &cu,
            positions: &positions,
            block_tables: &[1],
            max_blocks: 1,
            block_size: 2,
        };
        let o = paged_attention(&[3.0, 0.0, 0.0, 0.0], &kc, &vc, seqs, dims);
        assert_eq!(&o[..2], &[5.0, 6.0], "the first token sees only itself");
        assert_eq!(&o[2..], &[6.0, 7.0], "equal scores average the two values");
    }
}
