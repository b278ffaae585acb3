//! The CPU backend's paged KV pool; RoPE and the attention arithmetic are
//! the shared reference operations of the `ops` crate.
//!
//! Contract: [`KvPool`] holds, per layer, K and V pools `[num_blocks *
//! block_size, kv_heads * head_dim]` of one [`KvCacheDtype`] (f32, BF16,
//! or FP8 e4m3 at the layer's K and V scales), stored and read through
//! the one codec of [`ops::kv`]. Token `i` of a step writes its K/V
//! row at physical slot `slot_mapping[i]` ([`ops::kv_write`]); attention
//! ([`KvPool::attention`], i.e. [`ops::paged_attention`]) reads position `j`
//! of a sequence at slot `table[j / block_size] * block_size + j %
//! block_size`, so any block layout the scheduler hands out is read back
//! correctly.
//!
//! An FP8 pool at calibrated K scales (any layer's not 1) holds its keys
//! rotated, by the rule [`ops::hadamard::rotates_keys`] the CUDA backend
//! follows too: queries and keys pass through
//! [`ops::hadamard::rotate_heads`] after RoPE ([`KvPool::rotate_qk`], every
//! path of the backend, prefill and decode alike), which leaves the scores
//! unchanged and spreads the keys' few large channels, whose e4m3 rounding
//! otherwise dominates the scores' error.
//!
//! Costs: memory `2 * layers * slots * kv_dim * dtype.bytes()` bytes; see
//! [`ops::attention`] for the write and attention costs.

use contract::backend::StepBatch;
use contract::{KvCacheDtype, KvScales};
use ops::{AttnDims, KvCache, KvElem, KvView, PagedSeqs, ScoreRule};
use rayon::prelude::*;

/// Tokens from which [`KvPool::write_order`] plans parallel writes.
const PARALLEL_WRITE_MIN: usize = 64;

/// The paged KV cache memory of every layer.
pub struct KvPool {
    k: Vec<KvCache>, // [layers][num_blocks * block_size, kv_dim]
    v: Vec<KvCache>, // [layers][num_blocks * block_size, kv_dim]
    kv_dim: usize,
    block_size: usize,
    dtype: KvCacheDtype,
    /// Queries and keys are Hadamard-rotated per head ([`KvPool::rotate_qk`]).
    rotate: bool,
}

impl KvPool {
    /// A zeroed pool of `slots` token rows per layer of `kv_dim` values
    /// (heads of `head_dim`) in `dtype` (FP8 at `scales`' per-layer K and V
    /// scales).
    pub fn new(
        layers: usize,
        slots: usize,
        (kv_dim, head_dim): (usize, usize),
        block_size: usize,
        dtype: KvCacheDtype,
        scales: &KvScales,
    ) -> Self {
        let n = slots * kv_dim;
        KvPool {
            k: (0..layers)
                .map(|l| KvCache::zeroed(dtype, n, scales.layer(l).0))
                .collect(),
            v: (0..layers)
                .map(|l| KvCache::zeroed(dtype, n, scales.layer(l).1))
                .collect(),
            kv_dim,
            block_size,
            dtype,
            rotate: ops::hadamard::rotates_keys(dtype, scales, head_dim),
        }
    }

    /// Rotates every `head_dim`-wide head of `x` (query or key heads after
    /// RoPE) when the pool stores its keys rotated (see the module doc);
    /// leaves `x` as it is otherwise.
    pub fn rotate_qk(&self, x: &mut [f32], head_dim: usize) {
        if self.rotate {
            ops::hadamard::rotate_heads(x, head_dim);
        }
    }

    /// Whether queries and keys are rotated before the cache.
    pub fn rotates(&self) -> bool {
        self.rotate
    }

    /// How K and V are stored.
    pub fn dtype(&self) -> KvCacheDtype {
        self.dtype
    }

    /// Writes `k`, `v` (`[T, kv_dim]`) of `layer` at the step's slots.
    pub fn write(&mut self, layer: usize, k: &[f32], v: &[f32], slot_mapping: &[u32]) {
        let (kc, vc) = (&mut self.k[layer], &mut self.v[layer]);
        ops::kv_write_in(kc, vc, k, v, slot_mapping, self.kv_dim);
    }

    /// The step's writes in block order (`(block, token)`, tokens in step
    /// order within a block) into `order`, for every layer's
    /// [`KvPool::write_packed`]: left empty below `PARALLEL_WRITE_MIN`
    /// tokens (those steps write serially).
    pub fn write_order(&self, slot_mapping: &[u32], order: &mut Vec<(usize, usize)>) {
        order.clear();
        if slot_mapping.len() >= PARALLEL_WRITE_MIN && self.kv_dim > 0 {
            let bs = self.block_size;
            order.extend(
                slot_mapping
                    .iter()
                    .enumerate()
                    .map(|(i, &s)| (s as usize / bs, i)),
            );
            order.sort_unstable();
        }
    }

    /// Writes the K and V columns of packed rows `qkv` (`[T, width]`: Q in
    /// columns `0..k_col`, then K, then V, `kv_dim` each) of `layer` at the
    /// step's slots (what [`KvPool::write`] does for separate K and V).
    /// With the step's [`KvPool::write_order`] non-empty, block by block on
    /// rayon (each block's tokens in step order, so a slot written twice
    /// ends as the serial loop leaves it); the first write to a page costs
    /// a page fault, which then runs on every thread.
    pub fn write_packed(
        &mut self,
        layer: usize,
        qkv: &[f32],
        width: usize,
        k_col: usize,
        slot_mapping: &[u32],
        order: &[(usize, usize)],
    ) {
        let rows = PackedRows {
            qkv,
            width,
            k_col,
            slot_mapping,
            order,
            kv_dim: self.kv_dim,
            block_size: self.block_size,
        };
        match (&mut self.k[layer], &mut self.v[layer]) {
            (KvCache::F32(k), KvCache::F32(v)) => rows.write(k, v, 1.0, 1.0),
            (KvCache::Bf16(k), KvCache::Bf16(v)) => rows.write(k, v, 1.0, 1.0),
            (KvCache::Fp8(k, ks), KvCache::Fp8(v, vs)) => rows.write(k, v, *ks, *vs),
            _ => unreachable!("a layer's K and V are built in one dtype"),
        }
    }

    /// `layer`'s K and V pools with the row width and block size.
    pub fn layer(&self, layer: usize) -> (KvView<'_>, KvView<'_>, usize, usize) {
        (
            self.k[layer].view(),
            self.v[layer].view(),
            self.kv_dim,
            self.block_size,
        )
    }

    /// Causal attention of the step's queries `q` (`[T, heads * head_dim]`,
    /// RoPE applied) over `layer`'s pool (this step's rows already written),
    /// under the layer's `rule` (scale, soft-cap, window).
    /// Returns `[T, heads * head_dim]`.
    pub fn attention(
        &self,
        q: &[f32],
        layer: usize,
        batch: &StepBatch,
        dims: AttnDims,
        rule: ScoreRule,
    ) -> Vec<f32> {
        let seqs = PagedSeqs {
            cu_seqlens: &batch.cu_seqlens,
            positions: &batch.positions,
            block_tables: &batch.block_tables,
            max_blocks: batch.max_blocks,
            block_size: self.block_size,
        };
        let (k, v) = (self.k[layer].view(), self.v[layer].view());
        ops::paged_attention_with(q, k, v, seqs, dims, rule)
    }
}

/// A step's packed rows and where they go, for [`KvPool::write_packed`].
struct PackedRows<'a> {
    qkv: &'a [f32],
    width: usize,
    k_col: usize,
    slot_mapping: &'a [u32],
    order: &'a [(usize, usize)],
    kv_dim: usize,
    block_size: usize,
}

impl PackedRows<'_> {
    /// Stores every row's K and V columns into `kc`, `vc` (FP8 at `ks`, `vs`).
    fn write<T: KvElem>(&self, kc: &mut [T], vc: &mut [T], ks: f32, vs: f32) {
        let (d, bs, k_col) = (self.kv_dim, self.block_size, self.k_col);
        let put = |kc: &mut [T], vc: &mut [T], row: &[f32], at: usize| {
            T::put(&mut kc[at..at + d], &row[k_col..k_col + d], ks);
            T::put(&mut vc[at..at + d], &row[k_col + d..k_col + 2 * d], vs);
        };
        let (qkv, width, order) = (self.qkv, self.width, self.order);
        if order.is_empty() {
            for (row, &slot) in qkv.chunks_exact(width).zip(self.slot_mapping) {
                put(kc, vc, row, slot as usize * d);
            }
            return;
        }
        kc.par_chunks_mut(bs * d)
            .zip(vc.par_chunks_mut(bs * d))
            .enumerate()
            .for_each(|(b, (kb, vb))| {
                let first = order.partition_point(|&(ob, _)| ob < b);
                for &(_, i) in order[first..].iter().take_while(|&&(ob, _)| ob == b) {
                    let at = (self.slot_mapping[i] as usize % bs) * d;
                    put(kb, vb, &qkv[i * width..][..width], at);
                }
            });
    }
}
