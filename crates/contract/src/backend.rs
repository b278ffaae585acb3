//! The step contract between the scheduler and a backend (design brief).
//!
//! The scheduler emits one flat [`StepBatch`] per step: prefill chunks and
//! decode tokens mixed, with positions, per-sequence segments (`cu_seqlens`),
//! the physical KV slot each token writes and each sequence's block table
//! (from `paged-kv`). A [`Backend`] runs it and returns a [`SampledToken`] for
//! every sequence whose [`StepBatch::samples`] entry is `Some`, i.e. that
//! reached its last known position. Logits are computed only for those rows.
//!
//! Both backends (CPU reference, CUDA) take exactly the same batch and run
//! the same [`StepBatch::check`] on it first; it cannot panic, so a malformed
//! batch is an error naming the field. A batch whose every sequence
//! contributes one token is a *pure-decode* step.
//!
//! Steps can be pipelined ([`Backend::launch`] / [`Backend::collect`]): the
//! engine launches step N + 1 before it has read step N's sampled tokens, and
//! the tokens of step N + 1 that are step N's samples are named in
//! [`StepBatch::carried`] (their `tokens` entries are placeholders); the
//! backend takes them from step N's results where they already are (on the
//! device for CUDA), so no host round trip separates two steps. A step whose
//! grammar masks depend on step N's samples is launched held
//! ([`Backend::launch_held`]): its forward pass runs while the host reads
//! step N's samples and computes the masks, and [`Backend::release`] then
//! starts its sampling with them.

use std::sync::Arc;

use crate::config::ModelConfig;
use crate::history::PenaltyHistory;
use crate::mask::TokenMask;
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
    /// `[S]`, or empty for none: each sequence's prompt length. Its tokens
    /// at positions below it are prompt tokens, the others generated ones;
    /// a backend may run the two kinds with different arithmetic (the CPU
    /// runs prompt tokens' products on BF16 + 8-bit hardware), as long as a
    /// token's result never depends on the rest of the step.
    pub prompt_lens: Vec<u32>,
    /// Tokens whose id is the sample of the previously launched step, still
    /// unknown to the host (their `tokens` entry is a placeholder), by
    /// increasing token index. Empty for a step that depends on no launch.
    pub carried: Vec<Carried>,
    /// `[S]`, or empty for none: how many drafted tokens end each
    /// sequence's segment (speculative decoding's verify rows). With `K`
    /// drafts the segment's last `K + 1` rows are sampled: the row before
    /// the drafts with the request's `step`, the row of draft `j` with
    /// `step + 1 + j`, each exactly as that token would be sampled without
    /// drafts (the draw depends only on seed and step). The engine accepts
    /// draft `j` while the sample before it equals it. At most
    /// [`MAX_DRAFTS`], only on a sampled sequence. A penalty history
    /// applies to each row as it stands after the drafts before it
    /// ([`StepBatch::row_request`]), and only a backend that says so
    /// verifies such drafts ([`Backend::verifies_penalties`]); a sequence
    /// with a grammar mask gives each draft row its own mask
    /// ([`StepBatch::draft_masks`]), and only a backend that says so
    /// verifies its drafts ([`Backend::verifies_masks`]).
    pub drafts: Vec<u32>,
    /// `[S]`, or empty for none: for a sequence with `K` drafts and a
    /// grammar mask (`SampleRequest::allowed`), the `K` masks of its draft
    /// rows: `draft_masks[s][j]` is what the grammar allows after the
    /// drafts `0..=j`, the mask of the row of draft `j` (the first sampled
    /// row takes the request's own mask). Empty for every other sequence.
    pub draft_masks: Vec<Vec<Arc<TokenMask>>>,
    /// `[S]`, or empty for none: each sequence's LoRA adapter slot, 0 for
    /// the base model, `k` >= 1 for the adapter [`Backend::set_lora`] put
    /// in slot `k`. A backend refuses a slot it holds no adapter in.
    pub loras: Vec<u32>,
}

/// Most drafted tokens one sequence may verify in a step.
pub const MAX_DRAFTS: usize = 16;

/// A token of a step whose id is a sample of the previously launched step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Carried {
    /// Index of the token in [`StepBatch::tokens`].
    pub token: u32,
    /// Sequence row (index into `samples`) of the previous step whose sample it is.
    pub from: u32,
}

impl Carried {
    /// The error for `carried[i]` (this) when row `from` of the previous
    /// step, of `rows` rows, sampled nothing (or no step was launched).
    pub fn unsampled(&self, i: usize, rows: usize) -> BackendError {
        BackendError::InvalidBatch(format!(
            "carried[{i}] takes the sample of row {} of the previous step, which sampled none there ({rows} rows)",
            self.from
        ))
    }
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

    /// Whether token `i` of sequence `s` (at `positions[i]`) is a prompt
    /// token ([`StepBatch::prompt_lens`]); false past the tables.
    pub fn is_prompt_token(&self, s: usize, i: usize) -> bool {
        match (self.prompt_lens.get(s), self.positions.get(i)) {
            (Some(&len), Some(&pos)) => pos < len,
            _ => false,
        }
    }

    /// Drafted tokens ending sequence `s`'s segment ([`StepBatch::drafts`];
    /// 0 past the table).
    pub fn drafts_of(&self, s: usize) -> usize {
        self.drafts.get(s).map_or(0, |&k| k as usize)
    }

    /// The sampled rows of sequence `s`: its segment's last
    /// `1 + drafts_of(s)` token indices (empty when it samples nothing).
    /// Valid only on a checked batch.
    pub fn sampled_rows(&self, s: usize) -> std::ops::Range<usize> {
        match self.samples.get(s) {
            Some(Some(_)) => {
                let end = self.cu_seqlens[s + 1] as usize;
                end - 1 - self.drafts_of(s)..end
            }
            _ => 0..0,
        }
    }

    /// The sample request of token row `row` of sequence `s`, one of its
    /// [`StepBatch::sampled_rows`]: the sequence's request with `step`
    /// advanced by the row's offset past the first sampled row, and a
    /// penalty history extended by the drafts before the row (generated
    /// tokens, as they would be had they been sampled one step at a time)
    /// and, on a constrained sequence, the row's grammar mask
    /// ([`StepBatch::draft_masks`]). O(1) for the first row; O(history +
    /// drafts) for a later one with a history.
    pub fn row_request(&self, s: usize, row: usize) -> Option<SampleRequest> {
        let req = self.samples.get(s)?.as_ref()?;
        let first = self.sampled_rows(s).start;
        let mut r = req.clone();
        let j = row.checked_sub(first)?;
        r.step += j as u64;
        if let (Some(_), Some(j)) = (&req.allowed, j.checked_sub(1)) {
            r.allowed = Some(self.draft_masks.get(s)?.get(j)?.clone());
        }
        if let (Some(h), true) = (&req.history, row > first) {
            let mut h = PenaltyHistory::clone(h);
            for &t in self.tokens.get(first + 1..=row)? {
                h.push_generated(t);
            }
            r.history = Some(Arc::new(h));
        }
        Some(r)
    }

    /// The LoRA slot of sequence `s` ([`StepBatch::loras`]; 0, the base
    /// model, past the table).
    pub fn lora_of(&self, s: usize) -> u32 {
        self.loras.get(s).copied().unwrap_or(0)
    }

    /// True when every sequence contributes exactly one token.
    pub fn is_pure_decode(&self) -> bool {
        self.num_seqs() == self.num_tokens()
    }

    /// The block-table row of sequence `s` (`[max_blocks]`); empty when `s`
    /// has no full row in `block_tables` (never panics).
    pub fn block_table(&self, s: usize) -> &[u32] {
        s.checked_mul(self.max_blocks)
            .and_then(|a| Some(a..a.checked_add(self.max_blocks)?))
            .and_then(|r| self.block_tables.get(r))
            .unwrap_or(&[])
    }

    /// The one validation of a batch, run by both backends before a step:
    /// every length and bound is checked before anything is indexed, so any
    /// malformed batch is an [`BackendError::InvalidBatch`] naming the field,
    /// never a panic. In order:
    /// - `kv`: `block_size > 0` and `num_blocks x block_size` fits `usize`;
    /// - `cu_seqlens`: runs from 0 to `T`, strictly increasing (no empty segment);
    /// - `positions`, `slot_mapping`: `T` entries; `context_lens`, `samples`:
    ///   `S` entries; `prompt_lens`: none or `S`; `block_tables`: `S x
    ///   max_blocks` entries;
    /// - `drafts`: none or `S` entries, each at most [`MAX_DRAFTS`], nonzero
    ///   only on a sampled sequence whose segment is longer than its
    ///   drafts; `draft_masks`: none or `S` entries, as many masks as
    ///   drafts, each as long as the request's, on a sequence with a
    ///   grammar mask, none on any other;
    /// - `tokens`: every id below `vocab`; `carried`: token indices below `T`,
    ///   strictly increasing (whether `from` names a sample of the previous
    ///   step only the backend knows);
    /// - per sequence: positions consecutive, the last one + 1 equal to its
    ///   `context_lens` entry, that context at most `max_positions` (the RoPE
    ///   table) and within its block-table row; every block attention reads
    ///   (`ceil(context_len / block_size)`) inside the pool; every slot equal to
    ///   `table[p / block_size] * block_size + p % block_size`.
    ///
    /// Cost: O(T + S + blocks read), no allocation on success.
    pub fn check(
        &self,
        kv: KvShape,
        vocab: usize,
        max_positions: usize,
    ) -> Result<(), BackendError> {
        let bad = |m: String| Err(BackendError::InvalidBatch(m));
        let KvShape {
            num_blocks,
            block_size: bs,
        } = kv;
        if bs == 0 || num_blocks.checked_mul(bs).is_none() {
            return bad(format!(
                "kv shape: {num_blocks} blocks of {bs} tokens is not a pool"
            ));
        }
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
        if self.positions.len() != t {
            return bad(format!(
                "positions has {} entries, want one per token ({t})",
                self.positions.len()
            ));
        }
        if self.slot_mapping.len() != t {
            return bad(format!(
                "slot_mapping has {} entries, want one per token ({t})",
                self.slot_mapping.len()
            ));
        }
        if self.context_lens.len() != s {
            return bad(format!(
                "context_lens has {} entries, want one per sequence ({s})",
                self.context_lens.len()
            ));
        }
        if self.samples.len() != s {
            return bad(format!(
                "samples has {} entries, want one per sequence ({s})",
                self.samples.len()
            ));
        }
        if !self.prompt_lens.is_empty() && self.prompt_lens.len() != s {
            return bad(format!(
                "prompt_lens has {} entries, want none or one per sequence ({s})",
                self.prompt_lens.len()
            ));
        }
        self.check_drafts()?;
        if !self.loras.is_empty() && self.loras.len() != s {
            return bad(format!(
                "loras has {} entries, want none or one per sequence ({s})",
                self.loras.len()
            ));
        }
        if s.checked_mul(self.max_blocks) != Some(self.block_tables.len()) {
            return bad(format!(
                "block_tables has {} entries, want {s} x max_blocks {}",
                self.block_tables.len(),
                self.max_blocks
            ));
        }
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
        if let Some((i, c)) = self.carried.iter().enumerate().find(|(i, c)| {
            c.token as usize >= t || (*i > 0 && c.token <= self.carried[*i - 1].token)
        }) {
            return bad(format!(
                "carried[{i}] names token {}: carried tokens must be below {t} and strictly increasing",
                c.token
            ));
        }
        // Lengths hold: cu_seqlens is increasing from 0 to T, so every segment
        // lies inside the per-token vectors, and each row is max_blocks long.
        for (seq, w) in self.cu_seqlens.windows(2).enumerate() {
            let (a, b) = (w[0] as usize, w[1] as usize);
            let seg = &self.positions[a..b];
            if let Some(k) = (1..seg.len()).find(|&k| seg[k - 1].checked_add(1) != Some(seg[k])) {
                return bad(format!(
                    "positions[{}] = {}: sequence {seq}'s positions are not consecutive",
                    a + k,
                    seg[k]
                ));
            }
            let ctx = self.context_lens[seq] as usize;
            let last = seg[seg.len() - 1] as usize;
            if last + 1 != ctx {
                return bad(format!(
                    "context_lens[{seq}] = {ctx}, but the sequence's last position is {last}"
                ));
            }
            if ctx > max_positions {
                return bad(format!(
                    "positions[{}] = {last} exceeds the context of {max_positions} (max_position_embeddings or KV pool)",
                    b - 1
                ));
            }
            let used = ctx.div_ceil(bs);
            if used > self.max_blocks {
                return bad(format!(
                    "block_tables row {seq}: context_len {ctx} needs {used} blocks, the row holds {}",
                    self.max_blocks
                ));
            }
            let table = &self.block_tables[seq * self.max_blocks..][..used];
            if let Some(blk) = table.iter().find(|b| **b as usize >= num_blocks) {
                return bad(format!(
                    "block_tables row {seq}: block {blk} outside the pool of {num_blocks} blocks"
                ));
            }
            for (i, &p) in (a..b).zip(seg) {
                // p < ctx, so p / bs < used and the slot is inside the pool
                let p = p as usize;
                let want = table[p / bs] as usize * bs + p % bs;
                if self.slot_mapping[i] as usize != want {
                    return bad(format!(
                        "slot_mapping[{i}] = {} does not match the block table (expected {want})",
                        self.slot_mapping[i]
                    ));
                }
            }
        }
        Ok(())
    }

    /// The `drafts` rules of [`StepBatch::check`] (lengths of `samples` and
    /// `cu_seqlens` already checked).
    fn check_drafts(&self) -> Result<(), BackendError> {
        let s = self.num_seqs();
        if !self.drafts.is_empty() && self.drafts.len() != s {
            return Err(BackendError::InvalidBatch(format!(
                "drafts has {} entries, want none or one per sequence ({s})",
                self.drafts.len()
            )));
        }
        for (seq, &k) in self.drafts.iter().enumerate() {
            let k = k as usize;
            if k == 0 {
                continue;
            }
            let len = (self.cu_seqlens[seq + 1] - self.cu_seqlens[seq]) as usize;
            let why = match &self.samples[seq] {
                _ if k > MAX_DRAFTS => format!("more than {MAX_DRAFTS}"),
                _ if k >= len => format!("not below its segment's {len} tokens"),
                None => "on a sequence that samples nothing".into(),
                Some(_) => continue,
            };
            return Err(BackendError::InvalidBatch(format!(
                "drafts[{seq}] = {k}: {why}"
            )));
        }
        self.check_draft_masks()
    }

    /// The `draft_masks` rules of [`StepBatch::check`] (`drafts` checked).
    fn check_draft_masks(&self) -> Result<(), BackendError> {
        let s = self.num_seqs();
        if !self.draft_masks.is_empty() && self.draft_masks.len() != s {
            return Err(BackendError::InvalidBatch(format!(
                "draft_masks has {} entries, want none or one per sequence ({s})",
                self.draft_masks.len()
            )));
        }
        for seq in 0..s {
            let masks = self.draft_masks.get(seq).map_or(&[][..], |m| &m[..]);
            let words = match &self.samples[seq] {
                Some(SampleRequest {
                    allowed: Some(m), ..
                }) => Some(m.words().len()),
                _ => None,
            };
            let k = self.drafts_of(seq);
            let why = match words {
                None if !masks.is_empty() => "on a sequence without a grammar mask".to_string(),
                Some(_) if masks.len() != k => format!("not one per draft ({k})"),
                Some(w) if masks.iter().any(|m| m.words().len() != w) => {
                    format!("not all of the request's mask length ({w} words)")
                }
                _ => continue,
            };
            return Err(BackendError::InvalidBatch(format!(
                "draft_masks[{seq}] has {} masks: {why}",
                masks.len()
            )));
        }
        Ok(())
    }

    /// [`StepBatch::check`] without the vocabulary and RoPE bounds, for
    /// engine-side fakes that only know the pool's shape.
    pub fn validate(&self, num_blocks: usize, block_size: usize) -> Result<(), BackendError> {
        let kv = KvShape {
            num_blocks,
            block_size,
        };
        self.check(kv, usize::MAX, usize::MAX)
    }
}

/// The check before a pipelined launch ([`Backend::launch`],
/// [`Backend::launch_held`]): an error while a step is `held` (it must be
/// released first) or while `in_flight` launched steps, the held one not
/// counted, reach [`MAX_IN_FLIGHT`].
pub fn check_can_launch(held: bool, in_flight: usize) -> Result<(), BackendError> {
    if held {
        return Err(BackendError::InvalidBatch(
            "a held step is not released; release it first".into(),
        ));
    }
    if in_flight >= MAX_IN_FLIGHT {
        return Err(BackendError::InvalidBatch(format!(
            "{MAX_IN_FLIGHT} steps are in flight already; collect one first"
        )));
    }
    Ok(())
}

/// The error of a [`Backend::release`] with no step held.
pub fn nothing_held() -> BackendError {
    BackendError::InvalidBatch("release: no step is held".into())
}

/// Checks the final requests of a held step ([`Backend::release`]) against
/// the ones it was launched with (`held`): as many, `Some` exactly where
/// those are, each with a mask of the same length where the launched one
/// has a mask and none where it has none.
pub fn check_release(
    held: &[Option<SampleRequest>],
    samples: &[Option<SampleRequest>],
) -> Result<(), BackendError> {
    let bad = |m: String| Err(BackendError::InvalidBatch(m));
    if samples.len() != held.len() {
        return bad(format!(
            "release: {} sample requests for a held step of {} sequences",
            samples.len(),
            held.len()
        ));
    }
    for (s, (was, now)) in held.iter().zip(samples).enumerate() {
        let words = |r: &SampleRequest| r.allowed.as_ref().map(|m| m.words().len());
        match (was, now) {
            (None, None) => {}
            (Some(a), Some(b)) if words(a) == words(b) => {}
            (Some(_), Some(_)) => {
                return bad(format!(
                    "release: sample request {s} changes its mask's presence or length"
                ));
            }
            _ => {
                return bad(format!(
                    "release: sample request {s} is {} where the held step's was {}",
                    if now.is_some() { "set" } else { "absent" },
                    if was.is_some() { "set" } else { "absent" },
                ));
            }
        }
    }
    Ok(())
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
    /// repetition penalty, and the counts of its generated tokens, for the
    /// presence / frequency penalties: `Some` exactly when
    /// `params.needs_history()` (a backend ignores what no penalty reads).
    /// Shared, not copied: the engine keeps it per sequence and updates it in
    /// place between steps.
    pub history: Option<Arc<PenaltyHistory>>,
    /// The tokens a grammar allows here (constrained decoding), applied after
    /// the penalties: every other logit becomes `-inf` (see
    /// [`crate::mask`]). `None`: unconstrained, no cost.
    pub allowed: Option<Arc<TokenMask>>,
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
    /// With `K` drafts ([`StepBatch::drafts`]): the samples of the `K`
    /// draft rows, in order (`draft_rows[j]` at the row of draft `j`, the
    /// token after it); empty otherwise.
    pub draft_rows: Vec<SampledToken>,
}

/// Most steps a pipelining backend holds in flight (launched, not collected).
pub const MAX_IN_FLIGHT: usize = 2;

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
///
/// One step protocol, pipelined: [`Backend::launch`] (or
/// [`Backend::launch_held`] + [`Backend::release`]) starts a step and
/// [`Backend::collect`] returns its samples, in launch order, with at most
/// [`MAX_IN_FLIGHT`] steps in flight. A backend that computes on the
/// calling thread implements it with [`crate::HostPipeline`]. Running steps
/// one at a time is the same protocol at depth one ([`Backend::step`]).
pub trait Backend: Send {
    /// Short name for logs (`cpu`, `cuda:0`).
    fn name(&self) -> String;

    /// The model this backend runs.
    fn config(&self) -> &ModelConfig;

    /// The KV pool this backend was built with.
    fn kv_shape(&self) -> KvShape;

    /// Starts a step: it writes every token's K/V into its slot and, for each
    /// sequence with a sample request, samples the next token, which
    /// [`Backend::collect`] returns. The tokens in `batch.carried` take their
    /// ids from the samples of the step launched just before (which may
    /// still be running). On error nothing was launched.
    fn launch(&mut self, batch: &StepBatch) -> Result<(), BackendError>;

    /// Starts a step like [`Backend::launch`] whose sample requests are
    /// not final: a grammar's mask for it depends on the sample of the step
    /// launched just before, which the host has not read yet. The forward
    /// pass may start now; sampling waits for [`Backend::release`], which
    /// brings the final requests. Until then no step can be launched; the
    /// step before can be collected. On error nothing was launched.
    fn launch_held(&mut self, batch: &StepBatch) -> Result<(), BackendError>;

    /// Samples the held step ([`Backend::launch_held`]) with `samples`,
    /// `[S]`: the launched batch's requests with only their `allowed` masks
    /// changed (a mask where the launch had one, none where it had none).
    /// The step is then in flight like a launched one. On error the held
    /// step is dropped (its samples are lost).
    fn release(&mut self, samples: &[Option<SampleRequest>]) -> Result<(), BackendError>;

    /// Waits for the oldest launched step and returns its samples: `[S]`
    /// entries, `Some` exactly where its `batch.samples` is `Some`. An error
    /// ends every step in flight (their results are lost; later steps
    /// carried tokens from them).
    fn collect(&mut self) -> Result<Vec<Option<SampledToken>>, BackendError>;

    /// Steps launched (held ones included) and not collected yet.
    fn in_flight(&self) -> usize;

    /// Most drafted tokens per sequence this backend verifies in a step
    /// ([`StepBatch::drafts`]); 0: it runs no verify rows. Default 0.
    fn max_drafts(&self) -> usize {
        0
    }

    /// Whether verify rows of a sequence with a penalty history sample
    /// with the history [`StepBatch::row_request`] gives each row (false
    /// by default: the engine then drafts nothing for such a sequence).
    fn verifies_penalties(&self) -> bool {
        false
    }

    /// Whether verify rows of a sequence with a grammar mask sample with
    /// the mask [`StepBatch::row_request`] gives each row
    /// ([`StepBatch::draft_masks`]; false by default: the engine then
    /// drafts nothing for a constrained sequence).
    fn verifies_masks(&self) -> bool {
        false
    }

    /// Whether a launched step computes while the host plans the next (a
    /// device queue; the default). A backend that computes at launch on the
    /// calling thread ([`crate::HostCompute`]) says false: a step that waits
    /// for the one before it to land then loses no overlap, which the
    /// engine's speculative decoding uses to retry a sequence whose drafter
    /// proposed nothing at once instead of backing off.
    fn steps_overlap(&self) -> bool {
        true
    }

    /// Whether the backend runs in deterministic mode (the CLI's
    /// `--deterministic`, set when the backend is built): every row's
    /// logits, hence its samples and log-probabilities, are bitwise the same
    /// whatever else its step holds and however its sequence reached it
    /// (alone or in any batch at any position, a prompt in one chunk or
    /// many, its prefix computed or found in the prefix cache, recomputed
    /// after preemption, a prompt token or a generated or verify one): each
    /// kernel reduces a row in one fixed order, independent of the step's
    /// rows and of the thread count. Default: false (no such promise).
    fn deterministic(&self) -> bool {
        false
    }

    /// Sizes the step buffers for steps of up to `max_tokens` tokens and
    /// `max_seqs` sequences ahead of time, so the first large steps of a run
    /// do not allocate (the engine calls it once at start; a failure is
    /// logged and buffers then grow on demand). Default: nothing to size.
    fn reserve(&mut self, max_tokens: usize, max_seqs: usize) -> Result<(), BackendError> {
        let _ = (max_tokens, max_seqs);
        Ok(())
    }

    /// Adapter slots this backend holds ([`StepBatch::loras`] `1..=n`);
    /// 0: it runs no LoRA adapters. Default 0.
    fn max_loras(&self) -> usize {
        0
    }

    /// Puts `adapter` (checked by [`crate::LoraAdapter::check`] against
    /// this model) in slot `slot` (1 ..= [`Backend::max_loras`]), or empties
    /// the slot with `None`. Steps launched before keep the weights they
    /// were launched with only if the backend computed them already; the
    /// engine changes a slot only while no running sequence uses it.
    /// Default: an error naming the `--lora` flags.
    fn set_lora(
        &mut self,
        slot: u32,
        adapter: Option<std::sync::Arc<crate::LoraAdapter>>,
    ) -> Result<(), BackendError> {
        let _ = (slot, adapter);
        Err(no_lora(&self.name()))
    }

    /// Runs one step like [`Backend::step`] but returns the float32 logits of
    /// the given token rows, `[rows.len(), vocab]` row-major, instead of sampling.
    /// For tests and reference comparisons; nothing may be in flight.
    fn logits(&mut self, batch: &StepBatch, rows: &[usize]) -> Result<Vec<f32>, BackendError>;

    /// Runs one step like [`Backend::logits`] (its K/V written at the
    /// batch's slots, nothing sampled, nothing may be in flight) but
    /// returns the float32 hidden states of the given token rows after the
    /// final norm, before the LM head: `[rows.len(), hidden]` row-major
    /// (what embeddings pool). Default: an error naming the backend.
    fn hidden(&mut self, batch: &StepBatch, rows: &[usize]) -> Result<Vec<f32>, BackendError> {
        let _ = (batch, rows);
        Err(no_hidden(&self.name()))
    }

    /// The protocol at depth one: launches `batch` and collects it. An error
    /// when steps are in flight (their results would come first).
    fn step(&mut self, batch: &StepBatch) -> Result<Vec<Option<SampledToken>>, BackendError> {
        check_idle(self.in_flight(), "a plain step")?;
        self.launch(batch)?;
        self.collect()
    }
}

/// The error of a backend that runs no LoRA adapters, for any `--lora`,
/// `--max-loras` or adapter request.
pub fn no_lora(backend: &str) -> BackendError {
    BackendError::Device(format!(
        "{backend}: LoRA adapters (--lora, --max-loras, load_lora_adapter) are not supported on this backend; run them on the CPU (--device cpu)"
    ))
}

/// The error of a backend that returns no hidden states ([`Backend::hidden`]).
pub fn no_hidden(backend: &str) -> BackendError {
    BackendError::Device(format!(
        "{backend}: this backend returns no hidden states, so it computes no embeddings"
    ))
}

/// The checks of a [`Backend::logits`] or [`Backend::hidden`] call (`what`)
/// beyond [`StepBatch::check`]: nothing in flight, no carried token, every
/// row inside the step.
pub fn check_rows_call(
    in_flight: usize,
    batch: &StepBatch,
    rows: &[usize],
    what: &str,
) -> Result<(), BackendError> {
    check_idle(in_flight, what)?;
    if !batch.carried.is_empty() {
        return Err(BackendError::InvalidBatch(format!(
            "{what} cannot carry tokens from a launched step"
        )));
    }
    let t = batch.num_tokens();
    match rows.iter().find(|&&r| r >= t) {
        Some(r) => Err(BackendError::InvalidBatch(format!(
            "{what}: row {r} is outside the step's {t} tokens"
        ))),
        None => Ok(()),
    }
}

/// The error of a call that needs nothing in flight (a plain step, a
/// logits call) while `in_flight` steps are.
pub fn check_idle(in_flight: usize, what: &str) -> Result<(), BackendError> {
    match in_flight {
        0 => Ok(()),
        n => Err(BackendError::InvalidBatch(format!(
            "{n} launched steps are not collected; {what} cannot run before them"
        ))),
    }
}

#[cfg(test)]
mod tests;
