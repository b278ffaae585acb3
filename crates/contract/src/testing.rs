//! Batches for testing [`StepBatch::check`] and the backends that run it
//! (feature `testing`; compiled into this crate's own tests), and random
//! LoRA adapters ([`random_adapter`]).
//!
//! Contract: [`well_formed`] builds a batch that passes `check`;
//! [`malform`] breaks exactly one field of a well-formed batch so that it must
//! fail; [`malformed_batches`] is a fixed list of such batches (the cases
//! past bugs hit first) that every backend's `step` must reject with an
//! error, never a panic. Costs: O(T + S x max_blocks) per batch.

use crate::backend::{KvShape, StepBatch};

/// A well-formed batch over `kv`: sequence `s` has context length
/// `seqs[s].0` and runs its last `seqs[s].1` positions (clamped to 1..=ctx);
/// logical block `j` of sequence `s` is physical block `block(s, j)` (taken
/// modulo the pool). Rows are padded with 0 to the longest table.
pub fn well_formed(
    kv: KvShape,
    seqs: &[(usize, usize)],
    mut block: impl FnMut(usize, usize) -> u32,
) -> StepBatch {
    let bs = kv.block_size.max(1);
    let nb = kv.num_blocks.max(1) as u32;
    let max_blocks = seqs
        .iter()
        .map(|&(ctx, _)| ctx.max(1).div_ceil(bs))
        .max()
        .unwrap_or(0);
    let mut b = StepBatch {
        cu_seqlens: vec![0],
        max_blocks,
        ..StepBatch::default()
    };
    for (s, &(ctx, chunk)) in seqs.iter().enumerate() {
        let ctx = ctx.max(1);
        let chunk = chunk.clamp(1, ctx);
        let row: Vec<u32> = (0..max_blocks)
            .map(|j| {
                if j < ctx.div_ceil(bs) {
                    block(s, j) % nb
                } else {
                    0
                }
            })
            .collect();
        for p in ctx - chunk..ctx {
            b.tokens.push((p % 7) as u32);
            b.positions.push(p as u32);
            b.slot_mapping
                .push(row[p / bs] * bs as u32 + (p % bs) as u32);
        }
        b.cu_seqlens.push(b.tokens.len() as u32);
        b.context_lens.push(ctx as u32);
        b.block_tables.extend(row);
        b.samples.push(None);
    }
    b
}

/// One way to break a well-formed batch (see [`malform`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Malformation {
    /// Add `by` (wrapping, non-zero) to one position.
    Position,
    /// Add `by` to one context length.
    ContextLen,
    /// Add `by` to one slot.
    Slot,
    /// Set one block a sequence reads to `num_blocks + by`.
    BlockOutsidePool,
    /// Set one token id to `vocab + by`.
    TokenOutsideVocab,
    /// Drop the last entry of one per-token or per-sequence vector.
    DropEntry,
    /// Push an extra entry onto one of those vectors.
    ExtraEntry,
    /// Change `max_blocks` without changing `block_tables`.
    RowLength,
    /// Shift one inner `cu_seqlens` boundary (or the end) by `by`.
    Segment,
}

impl Malformation {
    /// Every malformation.
    pub const ALL: [Malformation; 9] = [
        Self::Position,
        Self::ContextLen,
        Self::Slot,
        Self::BlockOutsidePool,
        Self::TokenOutsideVocab,
        Self::DropEntry,
        Self::ExtraEntry,
        Self::RowLength,
        Self::Segment,
    ];
}

/// `batch` (well-formed over `kv` and `vocab`, at least one sequence) with
/// one field broken by `m`; `at` picks the entry (taken modulo the length),
/// `by` (at least 1) the amount. The result fails `check`.
pub fn malform(
    batch: &StepBatch,
    m: Malformation,
    at: usize,
    by: u32,
    kv: KvShape,
    vocab: usize,
) -> StepBatch {
    let mut b = batch.clone();
    let by = by.max(1);
    let t = b.tokens.len().max(1);
    let s = b.num_seqs().max(1);
    match m {
        Malformation::Position => {
            let i = at % t;
            b.positions[i] = b.positions[i].wrapping_add(by);
        }
        Malformation::ContextLen => {
            let i = at % s;
            b.context_lens[i] = b.context_lens[i].wrapping_add(by);
        }
        Malformation::Slot => {
            let i = at % t;
            b.slot_mapping[i] = b.slot_mapping[i].wrapping_add(by);
        }
        Malformation::BlockOutsidePool => {
            let seq = at % s;
            let used = (b.context_lens[seq] as usize).div_ceil(kv.block_size.max(1));
            let j = (at / s) % used.max(1);
            b.block_tables[seq * b.max_blocks + j] = (kv.num_blocks as u32).saturating_add(by);
        }
        Malformation::TokenOutsideVocab => {
            let i = at % t;
            b.tokens[i] = (vocab as u32).saturating_add(by);
        }
        Malformation::DropEntry | Malformation::ExtraEntry => {
            let extra = m == Malformation::ExtraEntry;
            match at % 6 {
                0 => edit(&mut b.positions, extra),
                1 => edit(&mut b.slot_mapping, extra),
                2 => edit(&mut b.context_lens, extra),
                3 => edit(&mut b.block_tables, extra),
                4 => edit(&mut b.cu_seqlens, extra),
                _ if extra => b.samples.push(None),
                _ => {
                    b.samples.pop();
                }
            }
        }
        Malformation::RowLength => b.max_blocks += by as usize,
        Malformation::Segment => {
            let i = 1 + at % s;
            b.cu_seqlens[i] = b.cu_seqlens[i].wrapping_add(by);
        }
    }
    b
}

fn edit(v: &mut Vec<u32>, extra: bool) {
    if extra {
        v.push(v.last().copied().unwrap_or(0));
    } else {
        v.pop();
    }
}

/// Named malformed batches for a backend with pool `kv` (at least 4 blocks),
/// vocabulary `vocab` and RoPE table `max_positions` (at least 8): each must
/// be rejected.
pub fn malformed_batches(
    kv: KvShape,
    vocab: usize,
    max_positions: usize,
) -> Vec<(String, StepBatch)> {
    let bs = kv.block_size as u32;
    let one = |positions: Vec<u32>, ctx: u32, table: Vec<u32>, slots: Vec<u32>| StepBatch {
        tokens: vec![1; positions.len()],
        cu_seqlens: vec![0, positions.len() as u32],
        slot_mapping: slots,
        context_lens: vec![ctx],
        max_blocks: table.len(),
        block_tables: table,
        samples: vec![None],
        prompt_lens: Vec::new(),
        positions,
        carried: Vec::new(),
        drafts: Vec::new(),
        draft_masks: Vec::new(),
        loras: Vec::new(),
    };
    let mut out = vec![
        (
            "positions [100, 1] with context 2".to_string(),
            one(vec![100, 1], 2, vec![0], vec![100, 1]),
        ),
        (
            "a block table shorter than the context".to_string(),
            one(
                (0..bs + 1).collect(),
                bs + 1,
                vec![0],
                (0..bs + 1).collect(),
            ),
        ),
        (
            "a slot beyond the pool".to_string(),
            one(vec![0], 1, vec![0], vec![(kv.num_blocks as u32) * bs + 3]),
        ),
        (
            "a block beyond the pool".to_string(),
            one(vec![0], 1, vec![kv.num_blocks as u32 + 5], vec![0]),
        ),
        (
            "a position past the RoPE table".to_string(),
            one(
                vec![max_positions as u32],
                max_positions as u32 + 1,
                vec![0; max_positions.div_ceil(kv.block_size) + 1],
                vec![max_positions as u32 % bs],
            ),
        ),
        (
            "cu_seqlens past the tokens".to_string(),
            StepBatch {
                cu_seqlens: vec![0, 5],
                ..one(vec![0], 1, vec![0], vec![0])
            },
        ),
        ("an empty cu_seqlens".to_string(), StepBatch::default()),
        (
            "a carried token past the tokens".to_string(),
            StepBatch {
                carried: vec![crate::backend::Carried { token: 1, from: 0 }],
                ..one(vec![0], 1, vec![0], vec![0])
            },
        ),
        (
            "drafts on a sequence that samples nothing".to_string(),
            StepBatch {
                drafts: vec![1],
                ..one(vec![0, 1], 2, vec![0], vec![0, 1])
            },
        ),
        (
            "drafts as long as their segment".to_string(),
            StepBatch {
                drafts: vec![2],
                samples: vec![Some(crate::backend::SampleRequest {
                    params: crate::sampling::SamplingParams::greedy(),
                    step: 0,
                    history: None,
                    allowed: None,
                })],
                ..one(vec![0, 1], 2, vec![0], vec![0, 1])
            },
        ),
        (
            "drafts for two sequences in a batch of one".to_string(),
            StepBatch {
                drafts: vec![0, 0],
                ..one(vec![0], 1, vec![0], vec![0])
            },
        ),
    ];
    let base = well_formed(kv, &[(5, 5), (3, 1), (1, 1)], |s, j| (s + j) as u32);
    for (k, m) in Malformation::ALL.iter().enumerate() {
        out.push((
            format!("{m:?} on a mixed prefill/decode batch"),
            malform(&base, *m, k, 1, kv, vocab),
        ));
    }
    out
}

/// A LoRA adapter of rank `r` on `targets` for a model of `c`, every value
/// of A and B drawn from `[-amp, amp]` by `seed`, scaled by `scale`.
pub fn random_adapter(
    c: &crate::ModelConfig,
    r: usize,
    targets: &[crate::lora::LoraTarget],
    seed: u64,
    amp: f32,
    scale: f32,
) -> crate::lora::LoraAdapter {
    use crate::lora::{LoraAdapter, LoraLayer, LoraPair};
    let mut n = 0u64;
    let mut vals = |len: usize| -> Vec<f32> {
        (0..len)
            .map(|_| {
                n += 1;
                let u = (crate::sampling::splitmix64(n ^ seed.wrapping_mul(0x5851_F42D)) >> 40)
                    as f32
                    / (1u32 << 24) as f32;
                amp * (2.0 * u - 1.0)
            })
            .collect()
    };
    let layers = (0..c.num_layers)
        .map(|_| {
            let mut l = LoraLayer::default();
            for &t in targets {
                let (i, o) = t.dims(c);
                l.pairs[t.index()] = Some(LoraPair {
                    a: vals(r * i),
                    b: vals(o * r),
                });
            }
            l
        })
        .collect();
    LoraAdapter {
        rank: r,
        scale,
        layers,
    }
}
