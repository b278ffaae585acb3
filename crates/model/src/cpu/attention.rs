//! RoPE, the paged KV pool and causal attention over packed sequences.
//!
//! Contract:
//! - [`Rope`] holds `cos`/`sin` tables `[positions, head_dim / 2]` built once
//!   from [`LlamaConfig::rope_table`] and rotates in the rotate-half
//!   convention of the Hugging Face layout (pairs `i` and `i + head_dim/2`).
//! - [`KvPool`] holds, per layer, K and V pools `[num_blocks * block_size,
//!   kv_heads * head_dim]` f32. Token `i` of a step writes its K/V row at
//!   physical slot `slot_mapping[i]`; attention reads position `j` of a
//!   sequence at slot `table[j / block_size] * block_size + j % block_size`,
//!   so any block layout the scheduler hands out is read back correctly.
//! - [`attention`] lets each token of sequence `s` at position `p` attend to
//!   positions `0..=p` of `s` (earlier steps' KV included), with GQA
//!   (query head `h` reads KV head `h / (heads / kv_heads)`).
//!
//! Costs: RoPE O(T * heads * head_dim); attention O(sum over tokens of
//! (p + 1) * heads * head_dim) reads of the pool, parallel over
//! (token, head) pairs with one reusable score buffer per rayon worker.

use contract::backend::StepBatch;
use contract::config::LlamaConfig;
use rayon::prelude::*;

/// Precomputed rotary tables.
pub struct Rope {
    cos: Vec<f32>, // [positions, half]
    sin: Vec<f32>, // [positions, half]
    half: usize,
    positions: usize,
}

impl Rope {
    /// Tables for positions `0..positions`.
    pub fn new(config: &LlamaConfig, positions: usize) -> Self {
        let (cos, sin) = config.rope_table(positions);
        Rope {
            cos,
            sin,
            half: config.head_dim / 2,
            positions,
        }
    }

    /// Number of positions covered by the tables.
    pub fn positions(&self) -> usize {
        self.positions
    }

    /// Rotates every head of one token's `x` (`[heads * head_dim]`) to `pos`.
    /// `pos` must be below [`Rope::positions`] (checked by the backend).
    pub fn apply(&self, x: &mut [f32], pos: usize) {
        let half = self.half;
        let cos = &self.cos[pos * half..(pos + 1) * half];
        let sin = &self.sin[pos * half..(pos + 1) * half];
        for head in x.chunks_exact_mut(2 * half) {
            let (a, b) = head.split_at_mut(half);
            for i in 0..half {
                let (x0, x1) = (a[i], b[i]);
                a[i] = x0 * cos[i] - x1 * sin[i];
                b[i] = x1 * cos[i] + x0 * sin[i];
            }
        }
    }
}

/// The paged KV cache memory of every layer.
pub struct KvPool {
    k: Vec<Vec<f32>>, // [layers][num_blocks * block_size, kv_dim]
    v: Vec<Vec<f32>>, // [layers][num_blocks * block_size, kv_dim]
    kv_dim: usize,
    block_size: usize,
}

impl KvPool {
    /// A zeroed pool of `slots` token rows per layer.
    pub fn new(layers: usize, slots: usize, kv_dim: usize, block_size: usize) -> Self {
        KvPool {
            k: (0..layers).map(|_| vec![0f32; slots * kv_dim]).collect(),
            v: (0..layers).map(|_| vec![0f32; slots * kv_dim]).collect(),
            kv_dim,
            block_size,
        }
    }

    /// Writes `k`, `v` (`[T, kv_dim]`) of `layer` at the step's slots.
    pub fn write(&mut self, layer: usize, k: &[f32], v: &[f32], slot_mapping: &[u32]) {
        let d = self.kv_dim;
        for (i, &slot) in slot_mapping.iter().enumerate() {
            let s = slot as usize * d;
            self.k[layer][s..s + d].copy_from_slice(&k[i * d..(i + 1) * d]);
            self.v[layer][s..s + d].copy_from_slice(&v[i * d..(i + 1) * d]);
        }
    }
}

/// Dimensions attention needs.
#[derive(Clone, Copy)]
pub struct AttnDims {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

/// Causal attention of the step's queries `q` (`[T, heads * head_dim]`, RoPE
/// applied) over `layer`'s paged KV (this step's rows already written).
/// Returns `[T, heads * head_dim]`.
pub fn attention(
    q: &[f32],
    pool: &KvPool,
    layer: usize,
    batch: &StepBatch,
    dims: AttnDims,
) -> Vec<f32> {
    let AttnDims {
        heads,
        kv_heads,
        head_dim: hd,
    } = dims;
    let group = heads / kv_heads;
    let kv_dim = pool.kv_dim;
    let bs = pool.block_size;
    let (kp, vp) = (&pool.k[layer], &pool.v[layer]);
    let scale = 1.0 / (hd as f32).sqrt();
    // [T] sequence index of each token
    let seq_of: Vec<usize> = (0..batch.num_seqs())
        .flat_map(|s| {
            let n = batch.cu_seqlens[s + 1] - batch.cu_seqlens[s];
            std::iter::repeat_n(s, n as usize)
        })
        .collect();
    let mut out = vec![0f32; q.len()];
    out.par_chunks_mut(hd)
        .enumerate()
        .for_each_init(Vec::<f32>::new, |scores, (idx, o)| {
            let (t, h) = (idx / heads, idx % heads);
            let table = batch.block_table(seq_of[t]);
            let ctx = batch.positions[t] as usize + 1;
            let qh = &q[t * heads * hd + h * hd..][..hd];
            let koff = (h / group) * hd;
            let row = |j: usize| (table[j / bs] as usize * bs + j % bs) * kv_dim + koff;
            scores.clear();
            scores
                .extend((0..ctx).map(|j| super::linear::dot(qh, &kp[row(j)..row(j) + hd]) * scale));
            let m = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0f32;
            for s in scores.iter_mut() {
                *s = (*s - m).exp();
                sum += *s;
            }
            let inv = 1.0 / sum;
            for (j, &p) in scores.iter().enumerate() {
                let w = p * inv;
                let r = row(j);
                for (a, &b) in o.iter_mut().zip(&vp[r..r + hd]) {
                    *a += w * b;
                }
            }
        });
    out
}
