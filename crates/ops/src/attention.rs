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
//!   `1 / sqrt(head_dim)`, f32 softmax. [`paged_attention_with`] takes a
//!   layer's [`ScoreRule`] instead: its scale, soft-cap
//!   (`cap * tanh(s / cap)` on the scaled score) and sliding window (the
//!   token sees positions [`ScoreRule::first`]`(p)..=p`).
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

/// How one layer turns a query-key dot product into a score, and which
/// positions a token sees (the spec's `AttentionSpec` in f32).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScoreRule {
    pub scale: f32,
    /// `cap * tanh(score / cap)` on the scaled score.
    pub softcap: Option<f32>,
    /// A token sees itself and the `window - 1` positions before it.
    pub window: Option<usize>,
}

impl ScoreRule {
    /// Plain causal attention scaled by `1 / sqrt(head_dim)`.
    pub fn causal(head_dim: usize) -> Self {
        ScoreRule {
            scale: 1.0 / (head_dim as f32).sqrt(),
            softcap: None,
            window: None,
        }
    }

    /// The rule of a layer's attention spec.
    pub fn of(a: &contract::spec::AttentionSpec) -> Self {
        ScoreRule {
            scale: a.scale as f32,
            softcap: a.logit_softcap.map(|c| c as f32),
            window: a.window,
        }
    }

    /// The first position a token at `pos` sees.
    pub fn first(&self, pos: usize) -> usize {
        self.window.map_or(0, |w| (pos + 1).saturating_sub(w))
    }

    /// The score of dot product `dot`: scaled, then capped.
    pub fn score(&self, dot: f32) -> f32 {
        let s = dot * self.scale;
        self.softcap.map_or(s, |c| c * (s / c).tanh())
    }
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
    let rule = ScoreRule::causal(dims.head_dim);
    paged_attention_with(q, k_cache, v_cache, seqs, dims, rule)
}

/// [`paged_attention_in`] under a layer's [`ScoreRule`]: each token at
/// position `p` attends to positions `rule.first(p)..=p`, scored by
/// [`ScoreRule::score`].
pub fn paged_attention_with(
    q: &[f32],
    k_cache: KvView<'_>,
    v_cache: KvView<'_>,
    seqs: PagedSeqs<'_>,
    dims: AttnDims,
    rule: ScoreRule,
) -> Vec<f32> {
    let AttnDims {
        heads,
        kv_heads,
        head_dim: hd,
    } = dims;
    let group = heads / kv_heads;
    let kv_dim = kv_heads * hd;
    let bs = seqs.block_size;
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
            let pos = seqs.positions[t] as usize;
            let first = rule.first(pos);
            let qh = &q[t * heads * hd + h * hd..][..hd];
            let koff = (h / group) * hd;
            let row = |j: usize| (table[j / bs] as usize * bs + j % bs) * kv_dim + koff;
            scores.clear();
            scores.extend((first..=pos).map(|j| {
                k_cache.get(row(j), kv_row);
                rule.score(dot(qh, kv_row))
            }));
            let m = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0f32;
            for s in scores.iter_mut() {
                *s = (*s - m).exp();
                sum += *s;
            }
            let inv = 1.0 / sum;
            for (j, &p) in (first..).zip(scores.iter()) {
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

    /// A layer's rule against a brute-force dense pass in f64: the mask
    /// written out as a matrix (`j <= i` and `i - j < window`), scores
    /// scaled then capped, over a cache whose blocks are scattered.
    #[test]
    fn windows_and_caps_match_a_dense_masked_reference() {
        let dims = AttnDims {
            heads: 4,
            kv_heads: 2,
            head_dim: 8,
        };
        let (n, bs, hd) = (23usize, 4usize, 8usize);
        let kv_dim = dims.kv_heads * hd;
        let val = |i: usize, s: f64| ((i as f64 * 0.618 + s).sin() * 1.5) as f32;
        let q: Vec<f32> = (0..n * dims.heads * hd).map(|i| val(i, 0.1)).collect();
        let k: Vec<f32> = (0..n * kv_dim).map(|i| val(i, 1.3)).collect();
        let v: Vec<f32> = (0..n * kv_dim).map(|i| val(i, 2.9)).collect();
        // blocks in reverse order, one spare block first
        let blocks = n.div_ceil(bs);
        let table: Vec<u32> = (0..blocks).map(|b| (blocks - b) as u32).collect();
        let slots: Vec<u32> = (0..n)
            .map(|j| table[j / bs] * bs as u32 + (j % bs) as u32)
            .collect();
        let mut kc = vec![0f32; (blocks + 1) * bs * kv_dim];
        let mut vc = kc.clone();
        kv_write(&mut kc, &mut vc, &k, &v, &slots, kv_dim);
        let positions: Vec<u32> = (0..n as u32).collect();
        let cu = [0, n as u32];
        let seqs = PagedSeqs {
            cu_seqlens: &cu,
            positions: &positions,
            block_tables: &table,
            max_blocks: blocks,
            block_size: bs,
        };
        let causal = ScoreRule::causal(hd);
        let rules = [
            causal,
            ScoreRule {
                window: Some(5),
                ..causal
            },
            ScoreRule {
                scale: 0.9,
                softcap: Some(1.25),
                window: Some(1),
            },
            ScoreRule {
                softcap: Some(2.0),
                window: Some(n + 3),
                ..causal
            },
        ];
        let plain = paged_attention(&q, &kc, &vc, seqs, dims);
        for rule in rules {
            let got =
                paged_attention_with(&q, KvView::F32(&kc), KvView::F32(&vc), seqs, dims, rule);
            let seen = |i: usize, j: usize| j <= i && rule.window.is_none_or(|w| i - j < w);
            let mut err = 0f64;
            for i in 0..n {
                for h in 0..dims.heads {
                    let g = h / (dims.heads / dims.kv_heads);
                    let qh = &q[(i * dims.heads + h) * hd..][..hd];
                    let score = |j: usize| {
                        let kj = &k[j * kv_dim + g * hd..][..hd];
                        let d: f64 = qh.iter().zip(kj).map(|(a, b)| *a as f64 * *b as f64).sum();
                        let s = d * rule.scale as f64;
                        rule.softcap.map_or(s, |c| c as f64 * (s / c as f64).tanh())
                    };
                    let w: Vec<f64> = (0..n)
                        .map(|j| if seen(i, j) { score(j).exp() } else { 0.0 })
                        .collect();
                    let z: f64 = w.iter().sum();
                    for d in 0..hd {
                        let o: f64 = (0..n)
                            .map(|j| w[j] / z * v[j * kv_dim + g * hd + d] as f64)
                            .sum();
                        let e = (o - got[(i * dims.heads + h) * hd + d] as f64).abs();
                        err = err.max(e);
                    }
                }
            }
            assert!(err < 1e-5, "{rule:?}: max error {err}");
            let windowed = rule.window.is_some_and(|w| w < n);
            assert_eq!(got != plain, windowed || rule != causal, "{rule:?}");
        }
    }
}
