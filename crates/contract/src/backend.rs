//! The step contract between the scheduler and a backend (design brief).
//!
//! The scheduler emits one flat [`StepBatch`] per step: prefill chunks and
//! decode tokens mixed, with positions, per-sequence segments (`cu_seqlens`),
//! the physical KV slot each token writes and each sequence's block table
//! (from `paged-kv`). A [`Backend`] runs it and returns a [`SampledToken`] for
//! every sequence whose [`StepBatch::samples`] entry is `Some`, i.e. that
//! reached its last known position. Logits are computed only for those rows.
//!
//! Both backends (CPU reference, CUDA) take exactly the same batch. A batch
//! whose every sequence contributes one token is a *pure-decode* step.

use std::sync::Arc;

use crate::config::LlamaConfig;
use crate::history::PenaltyHistory;
use crate::sampling::SamplingParams;

/// One scheduler step, flattened. `T` = tokens in the step, `S` = sequences.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepBatch {
    /// `[T]` token ids to run.
    pub tokens: Vec<u32>,
    /// `[T]` absolute position of each token in its sequence.
    pub positions: Vec<u32>,
    /// `[S + 1]` token offsets of each sequence's segment in `tokens`.
    pub cu_seqlens: Vec<u32>,
    /// `[T]` physical KV slot (`block * block_size + offset`) each token writes.
    pub slot_mapping: Vec<u32>,
    /// `[S]` tokens in each sequence's KV cache once this step has written
    /// (its last position + 1): what attention reads.
    pub context_lens: Vec<u32>,
    /// `[S, max_blocks]` row-major block tables, rows padded with 0 past each
    /// sequence's `ceil(context_len / block_size)` blocks (never read there).
    pub block_tables: Vec<u32>,
    /// Row length of `block_tables`.
    pub max_blocks: usize,
    /// `[S]`: `Some` when the sequence's last token in this step is to be sampled.
    pub samples: Vec<Option<SampleRequest>>,
}

impl StepBatch {
    /// Number of sequences `S`.
    pub fn num_seqs(&self) -> usize {
        self.cu_seqlens.len().saturating_sub(1)
    }

    /// Number of tokens `T`.
    pub fn num_tokens(&self) -> usize {
        self.tokens.len()
    }

    /// True when every sequence contributes exactly one token.
    pub fn is_pure_decode(&self) -> bool {
        self.num_seqs() == self.num_tokens()
    }

    /// The block-table row of sequence `s`.
    pub fn block_table(&self, s: usize) -> &[u32] {
        &self.block_tables[s * self.max_blocks..(s + 1) * self.max_blocks]
    }

    /// [`StepBatch::validate`] plus what a backend indexes with: token ids below
    /// `vocab`, positions below `max_positions` (its RoPE table), and every block
    /// attention reads (`ceil(context_len / block_size)` per sequence) inside the pool.
    /// Both backends run exactly this check before a step.
    pub fn check(
        &self,
        kv: KvShape,
        vocab: usize,
        max_positions: usize,
    ) -> Result<(), BackendError> {
        self.validate(kv.num_blocks, kv.block_size)?;
        let bad = |m: String| Err(BackendError::InvalidBatch(m));
        if let Some((i, id)) = self
            .tokens
            .iter()
            .enumerate()
            .find(|(_, id)| **id as usize >= vocab)
        {
            return bad(format!(
                "tokens[{i}] = {id} is outside the vocabulary of {vocab}"
            ));
        }
        if let Some((i, p)) = self
            .positions
            .iter()
            .enumerate()
            .find(|(_, p)| **p as usize >= max_positions)
        {
            return bad(format!(
                "positions[{i}] = {p} exceeds the context of {max_positions} (max_position_embeddings or KV pool)"
            ));
        }
        for s in 0..self.num_seqs() {
            let used = (self.context_lens[s] as usize).div_ceil(kv.block_size);
            if let Some(b) = self.block_table(s)[..used]
                .iter()
                .find(|b| **b as usize >= kv.num_blocks)
            {
                return bad(format!(
                    "block_tables row {s}: block {b} outside the pool of {} blocks",
                    kv.num_blocks
                ));
            }
        }
        Ok(())
    }

    /// Checks the batch's internal consistency against a KV pool of
    /// `num_blocks` blocks of `block_size` tokens; the error names the field.
    pub fn validate(&self, num_blocks: usize, block_size: usize) -> Result<(), BackendError> {
        let bad = |what: String| Err(BackendError::InvalidBatch(what));
        let t = self.tokens.len();
        let s = self.num_seqs();
        if self.cu_seqlens.first() != Some(&0)
            || self.cu_seqlens.last().map(|&x| x as usize) != Some(t)
        {
            return bad(format!(
                "cu_seqlens must run from 0 to {t}, got {:?}",
                self.cu_seqlens
            ));
        }
        if self.cu_seqlens.windows(2).any(|w| w[1] <= w[0]) {
            return bad("cu_seqlens must be strictly increasing (no empty segment)".into());
        }
        if self.positions.len() != t || self.slot_mapping.len() != t {
            return bad(format!(
                "positions ({}) and slot_mapping ({}) must have one entry per token ({t})",
                self.positions.len(),
                self.slot_mapping.len()
            ));
        }
        if self.context_lens.len() != s || self.samples.len() != s {
            return bad(format!(
                "context_lens and samples must have one entry per sequence ({s})"
            ));
        }
        if self.block_tables.len() != s * self.max_blocks {
            return bad(format!(
                "block_tables must be {s} x {} entries",
                self.max_blocks
            ));
        }
        let capacity = num_blocks * block_size;
        for seq in 0..s {
            let (a, b) = (
                self.cu_seqlens[seq] as usize,
                self.cu_seqlens[seq + 1] as usize,
            );
            let ctx = self.context_lens[seq] as usize;
            if self.positions[b - 1] as usize + 1 != ctx {
                return bad(format!(
                    "sequence {seq}: last position + 1 != context_len {ctx}"
                ));
            }
            if ctx.div_ceil(block_size) > self.max_blocks {
                return bad(format!(
                    "sequence {seq}: context_len {ctx} exceeds its block table"
                ));
            }
            let table = self.block_table(seq);
            for i in a..b {
                if i > a && self.positions[i] != self.positions[i - 1] + 1 {
                    return bad(format!("sequence {seq}: positions are not consecutive"));
                }
                let p = self.positions[i] as usize;
                let want = table[p / block_size] as usize * block_size + p % block_size;
                if self.slot_mapping[i] as usize != want || want >= capacity {
                    return bad(format!(
                        "token {i}: slot {} does not match block table (expected {want})",
                        self.slot_mapping[i]
                    ));
                }
            }
        }
        Ok(())
    }
}

/// What to sample for one sequence at the end of a step.
#[derive(Debug, Clone, PartialEq)]
pub struct SampleRequest {
    pub params: SamplingParams,
    /// Index of the token being sampled among the request's generated tokens
    /// (0 for the first); with `params.seed` it fixes the random draw, so a
    /// run is reproducible however it is batched or preempted.
    pub step: u64,
    /// The distinct tokens the request has seen (prompt + generated), for the
    /// repetition penalty: `Some` exactly when `params.repetition_penalty != 1`
    /// (a backend ignores it otherwise). Shared, not copied: the engine keeps
    /// it per sequence and updates it in place between steps.
    pub history: Option<Arc<PenaltyHistory>>,
}

/// The token a backend sampled for one sequence.
#[derive(Debug, Clone, PartialEq)]
pub struct SampledToken {
    pub token: u32,
    /// Log-probability of `token` under the model's raw distribution
    /// (log-softmax of the logits, before temperature and penalties).
    pub logprob: f32,
    /// The `params.logprobs` most likely `(token, logprob)` pairs, best first.
    pub top_logprobs: Vec<(u32, f32)>,
}

/// Errors a backend reports for a step.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("invalid step batch: {0}")]
    InvalidBatch(String),
    #[error("device error: {0}")]
    Device(String),
}

/// Shape of the KV pool a backend holds: `num_blocks` blocks of `block_size` tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvShape {
    pub num_blocks: usize,
    pub block_size: usize,
}

/// A model executor. Owns the weights and the KV pool memory; the engine owns
/// the KV bookkeeping (`paged-kv`) and hands each step its slots and tables.
pub trait Backend: Send {
    /// Short name for logs (`cpu`, `cuda:0`).
    fn name(&self) -> String;

    /// The model this backend runs.
    fn config(&self) -> &LlamaConfig;

    /// The KV pool this backend was built with.
    fn kv_shape(&self) -> KvShape;

    /// Runs one step: writes every token's K/V into its slot, and for each
    /// sequence with a sample request samples the next token.
    /// Returns `[S]` entries, `Some` exactly where `batch.samples` is `Some`.
    fn step(&mut self, batch: &StepBatch) -> Result<Vec<Option<SampledToken>>, BackendError>;

    /// Runs one step like [`Backend::step`] but returns the float32 logits of
    /// the given token rows, `[rows.len(), vocab]` row-major, instead of sampling.
    /// For tests and reference comparisons.
    fn logits(&mut self, batch: &StepBatch, rows: &[usize]) -> Result<Vec<f32>, BackendError>;
}
