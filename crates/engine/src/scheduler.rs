//! The continuous-batching scheduler: which tokens of which sequences run in
//! the next step, and the KV bookkeeping (through `paged-kv`) that goes with it.
//!
//! Contract, per [`Scheduler::schedule`]:
//! 1. Every running sequence gets KV room for the tokens it sampled last step,
//!    oldest first; when the pool is short, the youngest running sequence is
//!    preempted (blocks freed, tokens kept, put at the front of the waiting
//!    queue) until the room is there.
//! 2. Every running sequence with one uncomputed token (a decode) runs it.
//! 3. Partially prefilled running sequences run a chunk each from the token
//!    budget left (`max_batch_tokens`), oldest first (chunked prefill).
//! 4. While budget and `max_num_seqs` allow and no one was preempted this step,
//!    waiting sequences are admitted first come first served when
//!    `KvManager::can_admit` says all their known tokens fit; admission
//!    reuses the prefix cache, and the rest is computed in chunks. A
//!    re-admitted sequence recomputes prompt + generated so far and samples
//!    its next token exactly as it would have (`SampleRequest::step` = tokens
//!    generated so far). A sequence that cannot fit even into an empty pool
//!    is reported in [`Scheduler::aborted`].
//!
//! Costs: O(S + T + S * max_blocks) per step for S scheduled sequences and T
//! tokens, plus O(running) per preemption and per finish; the batch buffers
//! are reused, so a step allocates nothing once warm (except the history copy
//! a repetition penalty needs).

use std::collections::{HashMap, VecDeque};

use contract::{SampleRequest, SampledToken, SamplingParams, StepBatch};
use paged_kv::{KvConfig, KvError, KvManager, SeqId};

/// A scheduling invariant broke (a bug in the engine, `paged-kv` or the backend).
#[derive(Debug, thiserror::Error)]
pub(crate) enum SchedError {
    #[error("KV bookkeeping failed: {0}")]
    Kv(#[from] KvError),
    #[error("sequence {0} is not known to the scheduler")]
    UnknownSeq(u64),
    #[error(
        "sequence {seq}: planned to compute from position {start} but paged-kv has {computed} computed"
    )]
    PlanMismatch {
        seq: u64,
        start: usize,
        computed: usize,
    },
    #[error("backend returned {got} results for a step of {want} sequences")]
    ResultCount { got: usize, want: usize },
    #[error("backend result for sequence {seq}: {what}")]
    ResultMismatch { seq: u64, what: &'static str },
}

/// One sequence's token-level state.
#[derive(Debug)]
pub(crate) struct Seq {
    /// Prompt followed by the generated tokens.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    pub params: SamplingParams,
    /// Tokens whose KV is written (0 while waiting).
    pub num_computed: usize,
    /// Tokens that have KV slots allocated (0 while waiting).
    pub kv_len: usize,
    /// Set at the first admission; a preempted sequence keeps it.
    pub admitted_once: bool,
    /// Prompt tokens reused from the prefix cache at the first admission.
    pub cached_tokens: usize,
}

impl Seq {
    pub(crate) fn generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }
}

/// One sequence's part of the planned step: tokens `start..end` run.
#[derive(Debug, Clone, Copy)]
struct Planned {
    id: u64,
    start: usize,
    end: usize,
}

/// Waiting queue, running set, KV manager and the reusable step batch.
pub(crate) struct Scheduler {
    kv: KvManager,
    max_num_seqs: usize,
    max_batch_tokens: usize,
    seqs: HashMap<u64, Seq>,
    waiting: VecDeque<u64>,
    /// Sorted by id (= arrival order): the youngest is last.
    running: Vec<u64>,
    plan: Vec<Planned>,
    batch: StepBatch,
    aborted: Vec<u64>,
    first_admitted: Vec<u64>,
    pub preemptions_total: u64,
}

impl Scheduler {
    pub(crate) fn new(
        kv: KvConfig,
        max_num_seqs: usize,
        max_batch_tokens: usize,
    ) -> Result<Self, paged_kv::KvError> {
        Ok(Scheduler {
            kv: KvManager::try_new(kv)?,
            max_num_seqs,
            max_batch_tokens,
            seqs: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::with_capacity(max_num_seqs),
            plan: Vec::with_capacity(max_num_seqs),
            batch: StepBatch::default(),
            aborted: Vec::new(),
            first_admitted: Vec::new(),
            preemptions_total: 0,
        })
    }

    /// Queues a new sequence (ids must increase with arrival).
    pub(crate) fn add(&mut self, id: u64, prompt: Vec<u32>, params: SamplingParams) {
        let prompt_len = prompt.len();
        self.seqs.insert(
            id,
            Seq {
                tokens: prompt,
                prompt_len,
                params,
                num_computed: 0,
                kv_len: 0,
                admitted_once: false,
                cached_tokens: 0,
            },
        );
        self.waiting.push_back(id);
    }

    pub(crate) fn is_idle(&self) -> bool {
        self.seqs.is_empty()
    }
    pub(crate) fn num_running(&self) -> usize {
        self.running.len()
    }
    pub(crate) fn num_waiting(&self) -> usize {
        self.waiting.len()
    }
    pub(crate) fn kv(&self) -> &KvManager {
        &self.kv
    }
    pub(crate) fn seq(&self, id: u64) -> Option<&Seq> {
        self.seqs.get(&id)
    }
    /// The ids of every sequence, running or waiting.
    pub(crate) fn ids(&self) -> Vec<u64> {
        self.seqs.keys().copied().collect()
    }
    /// The batch planned by the last [`Scheduler::schedule`].
    pub(crate) fn batch(&self) -> &StepBatch {
        &self.batch
    }
    /// Sequences that can never fit the KV pool, found by the last schedule.
    pub(crate) fn aborted(&self) -> &[u64] {
        &self.aborted
    }
    /// Sequences admitted for the first time by the last schedule.
    pub(crate) fn first_admitted(&self) -> &[u64] {
        &self.first_admitted
    }
    /// Ids of the sequences in the planned batch, in batch order.
    pub(crate) fn planned_ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.plan.iter().map(|p| p.id)
    }

    /// Removes a sequence wherever it is and frees its blocks.
    pub(crate) fn finish(&mut self, id: u64) -> Result<Seq, SchedError> {
        let seq = self.seqs.remove(&id).ok_or(SchedError::UnknownSeq(id))?;
        if let Some(i) = self.running.iter().position(|&r| r == id) {
            self.running.remove(i);
        } else if let Some(i) = self.waiting.iter().position(|&w| w == id) {
            self.waiting.remove(i);
        }
        if seq.kv_len > 0 {
            self.kv.free(id as SeqId)?;
        }
        Ok(seq)
    }

    /// Plans the next step into [`Scheduler::batch`] (empty when nothing can run).
    pub(crate) fn schedule(&mut self) -> Result<(), SchedError> {
        self.plan.clear();
        self.aborted.clear();
        self.first_admitted.clear();
        let preempted = self.grow_running()?;
        let mut budget = self.max_batch_tokens;
        // decodes first, then chunks of partial prefills, oldest first
        for decodes in [true, false] {
            for &id in &self.running {
                let seq = self.seqs.get(&id).ok_or(SchedError::UnknownSeq(id))?;
                let left = seq.tokens.len() - seq.num_computed;
                if budget == 0 || (left == 1) != decodes {
                    continue;
                }
                let n = left.min(budget);
                budget -= n;
                self.plan.push(Planned {
                    id,
                    start: seq.num_computed,
                    end: seq.num_computed + n,
                });
            }
        }
        if !preempted {
            self.admit_waiting(budget)?;
        }
        self.build_batch()
    }

    /// Step 1: KV room for last step's samples; returns whether anyone was preempted.
    fn grow_running(&mut self) -> Result<bool, SchedError> {
        let mut preempted = false;
        let mut i = 0;
        while i < self.running.len() {
            let id = self.running[i];
            let seq = self.seqs.get(&id).ok_or(SchedError::UnknownSeq(id))?;
            let need = seq.tokens.len() - seq.kv_len;
            if need > 0 {
                let mut lost_self = false;
                while !self.kv.can_append(id as SeqId, need) {
                    let Some(&victim) = self.running.last() else {
                        break;
                    };
                    self.preempt(victim)?;
                    preempted = true;
                    if victim == id {
                        lost_self = true;
                        break;
                    }
                }
                if lost_self {
                    break;
                }
                let seq = self.seqs.get_mut(&id).ok_or(SchedError::UnknownSeq(id))?;
                self.kv.append(id as SeqId, &seq.tokens[seq.kv_len..])?;
                seq.kv_len = seq.tokens.len();
            }
            i += 1;
        }
        Ok(preempted)
    }

    fn preempt(&mut self, id: u64) -> Result<(), SchedError> {
        let seq = self.seqs.get_mut(&id).ok_or(SchedError::UnknownSeq(id))?;
        self.kv.free(id as SeqId)?;
        seq.num_computed = 0;
        seq.kv_len = 0;
        self.running.retain(|&r| r != id);
        self.waiting.push_front(id);
        self.preemptions_total += 1;
        tracing::debug!(seq = id, tokens = seq.tokens.len(), "preempted");
        Ok(())
    }

    /// Step 4: first come first served admission under the budget.
    fn admit_waiting(&mut self, mut budget: usize) -> Result<(), SchedError> {
        while budget > 0 && self.running.len() < self.max_num_seqs {
            let Some(&id) = self.waiting.front() else {
                break;
            };
            let seq = self.seqs.get_mut(&id).ok_or(SchedError::UnknownSeq(id))?;
            if !self.kv.can_admit(&seq.tokens) {
                if self.running.is_empty() {
                    // the whole pool is allocatable and still too small
                    self.waiting.pop_front();
                    self.aborted.push(id);
                    continue;
                }
                break;
            }
            self.waiting.pop_front();
            let cached = self.kv.admit(id as SeqId, &seq.tokens)?;
            seq.num_computed = cached;
            seq.kv_len = seq.tokens.len();
            if !seq.admitted_once {
                seq.admitted_once = true;
                seq.cached_tokens = cached;
                self.first_admitted.push(id);
            }
            let n = (seq.tokens.len() - cached).min(budget);
            budget -= n;
            self.plan.push(Planned {
                id,
                start: cached,
                end: cached + n,
            });
            let at = self.running.partition_point(|&r| r < id);
            self.running.insert(at, id);
        }
        Ok(())
    }

    /// Fills the reused [`StepBatch`] from the plan.
    fn build_batch(&mut self) -> Result<(), SchedError> {
        let bs = self.kv.block_size();
        let b = &mut self.batch;
        b.tokens.clear();
        b.positions.clear();
        b.cu_seqlens.clear();
        b.slot_mapping.clear();
        b.context_lens.clear();
        b.block_tables.clear();
        b.samples.clear();
        b.max_blocks = self
            .plan
            .iter()
            .map(|p| p.end.div_ceil(bs))
            .max()
            .unwrap_or(0);
        b.cu_seqlens.push(0);
        for p in &self.plan {
            let seq = self.seqs.get(&p.id).ok_or(SchedError::UnknownSeq(p.id))?;
            let table = self
                .kv
                .block_table(p.id as SeqId)
                .ok_or(SchedError::UnknownSeq(p.id))?;
            let computed = self.kv.num_computed(p.id as SeqId).unwrap_or(usize::MAX);
            if computed != p.start {
                return Err(SchedError::PlanMismatch {
                    seq: p.id,
                    start: p.start,
                    computed,
                });
            }
            let blocks = p.end.div_ceil(bs);
            if table.len() < blocks {
                return Err(SchedError::Kv(KvError::UnknownSeq(p.id as SeqId)));
            }
            for pos in p.start..p.end {
                b.tokens.push(seq.tokens[pos]);
                b.positions.push(pos as u32);
                b.slot_mapping
                    .push(table[pos / bs] * bs as u32 + (pos % bs) as u32);
            }
            b.cu_seqlens.push(b.tokens.len() as u32);
            b.context_lens.push(p.end as u32);
            // [S, max_blocks]
            b.block_tables.extend_from_slice(&table[..blocks]);
            b.block_tables
                .resize(b.block_tables.len() + b.max_blocks - blocks, 0);
            b.samples
                .push((p.end == seq.tokens.len()).then(|| SampleRequest {
                    params: seq.params.clone(),
                    step: seq.generated() as u64,
                    history: if seq.params.repetition_penalty != 1.0 {
                        seq.tokens.clone()
                    } else {
                        Vec::new()
                    },
                }));
        }
        Ok(())
    }

    /// Records a finished step: KV written, sampled tokens appended. The
    /// sampled `(id, token)` pairs are pushed to `out` in batch order.
    pub(crate) fn commit(
        &mut self,
        results: Vec<Option<SampledToken>>,
        out: &mut Vec<(u64, SampledToken)>,
    ) -> Result<(), SchedError> {
        if results.len() != self.plan.len() {
            return Err(SchedError::ResultCount {
                got: results.len(),
                want: self.plan.len(),
            });
        }
        for (p, r) in self.plan.iter().zip(results) {
            let seq = self
                .seqs
                .get_mut(&p.id)
                .ok_or(SchedError::UnknownSeq(p.id))?;
            let sample = p.end == seq.tokens.len();
            seq.num_computed = p.end;
            self.kv.mark_computed(p.id as SeqId, p.end)?;
            match (sample, r) {
                (true, Some(t)) => {
                    seq.tokens.push(t.token);
                    out.push((p.id, t));
                }
                (false, None) => {}
                (true, None) => {
                    return Err(SchedError::ResultMismatch {
                        seq: p.id,
                        what: "no token where one was requested",
                    });
                }
                (false, Some(_)) => {
                    return Err(SchedError::ResultMismatch {
                        seq: p.id,
                        what: "a token where none was requested",
                    });
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
