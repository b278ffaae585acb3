//! The continuous-batching scheduler: which tokens of which sequences run in
//! the next step, and the KV bookkeeping (through `paged-kv`) that goes with it.
//!
//! Contract, per [`Scheduler::schedule`]:
//! 1. Every running sequence gets KV room for the token it sampled last step,
//!    oldest first; when the pool is short, the youngest running sequence is
//!    preempted (blocks freed, tokens kept, put at the front of the waiting
//!    queue) until the room is there.
//! 2. Every running sequence with one uncomputed token (a decode) runs it.
//! 3. Partially prefilled running sequences run a chunk each from the token
//!    budget left (`max_batch_tokens`, further capped for prefill by
//!    [`Scheduler::set_prefill_cap`], the step time budget, whenever another
//!    sequence is running or waiting), oldest first (chunked prefill). While
//!    that cap binds and sequences wait, the chunks take at most half of it:
//!    the rest is kept for admissions, so a request that arrives during a
//!    long prefill starts at the next step.
//! 4. While budget and `max_num_seqs` allow and no one was preempted this step,
//!    waiting sequences are admitted first come first served when
//!    `KvManager::can_admit` says all their known tokens fit; admission
//!    reuses the prefix cache, and the rest is computed in chunks. A
//!    re-admitted sequence recomputes prompt + generated so far and samples
//!    its next token exactly as it would have (`SampleRequest::step` = tokens
//!    generated so far). A sequence that cannot fit even into an empty pool
//!    is reported in [`Scheduler::aborted`].
//!    A sequence with a LoRA adapter is admitted only when the adapter has
//!    a slot (`crate::lora`), else it stays waiting and the sequences
//!    behind it are considered; its KV lives in the adapter's prefix-cache
//!    namespace (`KvManager::admit_in`), and its rows name the slot
//!    (`StepBatch::loras`).
//! 5. Choices of one request (`n > 1`): each later choice is a sequence
//!    with `fork_of` = the first choice. It waits behind that sequence until
//!    its prompt's full blocks are computed, then is admitted by
//!    `KvManager::fork`: those blocks are shared (the prompt is computed
//!    once) and only the last partial block's tokens (at most `B`) are
//!    recomputed. If the first choice is gone or was preempted, the choice
//!    is admitted like any sequence.
//!
//! 6. Pipelined steps: [`Scheduler::launched`] records a step as running
//!    before its samples are known: its KV counts as computed and each
//!    sampled sequence's next token is a placeholder ([`PENDING_TOKEN`])
//!    whose value the next step reads from the launched one
//!    ([`contract::StepBatch::carried`]); [`Scheduler::land`] writes the real
//!    tokens in wherever the placeholders went (the KV manager's tokens, a
//!    preempted sequence's parked tokens, or `next`) before the next
//!    `launched`, so no block is ever hashed with a placeholder. A sequence
//!    whose placeholder is its last token by `max_tokens` is not scheduled
//!    again. A step in which a constrained sequence samples after such a
//!    placeholder is held ([`Scheduler::batch_held`]): its grammar mask
//!    depends on the token, so the caller lands the step before it, then
//!    makes its requests final ([`Scheduler::finalize_samples`]) before
//!    `launched`. A penalty history is shared with the batch, so a step
//!    with one lands before the next is planned
//!    ([`Scheduler::landing_needs_host`]).
//!
//! 7. Speculative decoding (`crate::speculate`, off unless
//!    [`Scheduler::set_speculation`]): a decoding sequence that may draft
//!    and whose last token is known appends up to its draft length of
//!    drafted tokens (KV room permitting, never past `max_tokens`; all
//!    sequences' proposals made in one drafter call; a constrained one's
//!    cut at the first token its grammar refuses) and runs them as verify
//!    rows of its decode segment ([`contract::StepBatch::drafts`], with
//!    each row's grammar mask in [`contract::StepBatch::draft_masks`]).
//!    They stay uncomputed until its
//!    step lands: the accepted ones are then marked computed, the rejected
//!    ones truncated away (`KvManager::truncate`), and the accepted tokens
//!    plus the correction are committed in order. Such a sequence's next
//!    step depends on how many were accepted, and a draft on its last
//!    token, so its step lands before the next plan
//!    ([`Scheduler::landing_needs_host`]); after an attempt that proposed
//!    nothing (where steps overlap: `Backend::steps_overlap`) or had
//!    nothing accepted it waits a few steps (doubling with each miss, at
//!    most 15) before the next, its steps pipelined meanwhile.
//!
//! The batch ([`Scheduler::batch`]) is valid from `schedule` until
//! [`Scheduler::launched`], which releases it (so the
//! repetition-penalty sets it shared are updated in place, not copied).
//!
//! # One owner per fact
//! `paged_kv::KvManager` owns a running sequence's tokens and its computed
//! count: it needs both anyway (prefix-cache hashing, block registration),
//! so the scheduler reads them from there and keeps no copy to keep
//! in agreement. What `paged-kv` cannot hold stays here, each in one place:
//! a waiting sequence's tokens (`Seq::parked`; it holds no blocks, so
//! `paged-kv` does not know it), and the one token sampled by the last step
//! that has no KV room yet (`Seq::next`; the room is found, or a preemption
//! made, at the next `schedule`). Running, `parked` is empty; waiting, `next`
//! is `None`; so a token lives in exactly one of the three.
//!
//! One file past the usual size on purpose: the contract points above are
//! one state machine over `Seq`; its per-step parts (building, launching,
//! landing) live in `step.rs` and speculative decoding's in `spec.rs`.
//!
//! Costs: O(S + T + S * max_blocks) per step for S scheduled sequences and T
//! tokens, plus O(running + len) per preemption, O(len) per admission and
//! O(running) per finish; the batch is built by one reused
//! [`contract::StepBuilder`] and the penalty history is an `Arc` updated in
//! place, so a warm step allocates nothing (a new distinct token may grow a
//! history set).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use contract::{PenaltyHistory, SamplingParams, StepBatch, StepBuildError, StepBuilder, TokenMask};
use paged_kv::{KvConfig, KvError, KvManager, SeqId};

use crate::grammar::SeqGrammar;
use crate::lora::{LoraSlots, SeqLora};

/// The id a pipelined sample has until it lands (contract point 6); any
/// in-vocabulary id would do, the backend never reads it.
pub(crate) const PENDING_TOKEN: u32 = 0;

/// A scheduling invariant broke (a bug in the engine, `paged-kv` or the backend).
#[derive(Debug, thiserror::Error)]
pub(crate) enum SchedError {
    #[error("KV bookkeeping failed: {0}")]
    Kv(#[from] KvError),
    #[error("step batch: {0}")]
    Build(#[from] StepBuildError),
    #[error("sequence {0} is not known to the scheduler")]
    UnknownSeq(u64),
    #[error("backend returned {got} results for a step of {want} sequences")]
    ResultCount { got: usize, want: usize },
    #[error("backend result for sequence {seq}: {what}")]
    ResultMismatch { seq: u64, what: &'static str },
}

/// What the scheduler keeps of one sequence beside `paged-kv` (module doc).
#[derive(Debug)]
struct Seq {
    /// Known tokens while waiting; empty while running.
    parked: Vec<u32>,
    /// Sampled by the last step, KV room not found yet (running only).
    next: Option<u32>,
    prompt_len: usize,
    params: SamplingParams,
    /// Tokens seen and generated, when a penalty needs them
    /// (`SamplingParams::needs_history`).
    history: Option<Arc<PenaltyHistory>>,
    /// The first choice of the same request, whose prompt KV this one shares.
    fork_of: Option<u64>,
    /// Set at the first admission; a preempted sequence keeps it.
    admitted_once: bool,
    /// Its last token is the placeholder for the sample of this row of the
    /// launched step, not landed yet.
    carried_from: Option<u32>,
    /// Most tokens to generate (`None`: no limit known here).
    max_tokens: Option<usize>,
    /// The placeholder is its last token by `max_tokens`: not scheduled again.
    last_in_flight: bool,
    /// Prompt tokens reused from the prefix cache at the first admission.
    cached_tokens: usize,
    /// The constraint's state (constrained decoding): kept across
    /// preemption, advanced at commit, its mask sent with each sample.
    grammar: Option<Box<SeqGrammar>>,
    /// Most tokens to draft for it next (speculative decoding, `spec`
    /// module); 0: it never drafts.
    spec_k: usize,
    /// Drafted tokens at the end of its KV tokens, run by the launched
    /// step and not verified yet (they stay uncomputed until then).
    drafted: usize,
    /// With a grammar: the masks of those drafts' verify rows, each the
    /// grammar's after the drafts up to it (`StepBatch::draft_masks`).
    draft_masks: Vec<Arc<TokenMask>>,
    /// Draft attempts in a row that proposed nothing or had nothing
    /// accepted, and the steps left before the next attempt (`spec`
    /// module: until then its steps stay pipelined).
    spec_miss: u8,
    spec_wait: u8,
    /// Its LoRA adapter (`None`: the base model).
    lora: Option<SeqLora>,
    /// The adapter slot it holds while running (0: none).
    slot: u32,
}

/// A sequence to queue ([`Scheduler::add`]).
pub(crate) struct NewSeq {
    pub prompt: Vec<u32>,
    pub params: SamplingParams,
    /// Most tokens to generate (`None`: no limit known here).
    pub max_tokens: Option<usize>,
    pub fork_of: Option<u64>,
    pub grammar: Option<SeqGrammar>,
    /// May draft when the scheduler speculates (a request can opt out).
    pub speculative: bool,
    /// Its LoRA adapter (`None`: the base model).
    pub lora: Option<SeqLora>,
}

impl NewSeq {
    /// An unconstrained sequence with no token limit.
    #[cfg(test)]
    pub(crate) fn plain(prompt: Vec<u32>, params: SamplingParams) -> Self {
        NewSeq {
            prompt,
            params,
            max_tokens: None,
            fork_of: None,
            grammar: None,
            speculative: true,
            lora: None,
        }
    }
}

/// Token counts of one sequence, for usage and stop decisions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SeqSummary {
    pub prompt_len: usize,
    pub cached_tokens: usize,
    /// Tokens sampled so far.
    pub generated: usize,
}

/// One sequence's part of the planned step: tokens `start..end` run.
#[derive(Debug, Clone, Copy)]
struct Planned {
    id: u64,
    start: usize,
    end: usize,
}

/// Waiting queue, running set, KV manager and the reusable step builder.
pub(crate) struct Scheduler {
    kv: KvManager,
    max_num_seqs: usize,
    max_batch_tokens: usize,
    /// Most prefill tokens (chunks and admissions) in one step.
    prefill_cap: usize,
    seqs: HashMap<u64, Seq>,
    waiting: VecDeque<u64>,
    /// Sorted by id (= arrival order): the youngest is last.
    running: Vec<u64>,
    plan: Vec<Planned>,
    /// The launched step not landed yet: `(sequence, row)` of each sampled
    /// row, and the step's row count.
    landing: Vec<(u64, u32)>,
    landing_rows: usize,
    builder: StepBuilder,
    aborted: Vec<u64>,
    first_admitted: Vec<u64>,
    /// Constrained sequences whose grammar failed at the last commit, and why.
    grammar_failures: Vec<(u64, String)>,
    /// The planned step must be launched held ([`Scheduler::batch_held`]).
    held: bool,
    pub preemptions_total: u64,
    /// Speculative decoding, when on.
    spec: Option<Speculation>,
    /// The backend's LoRA adapter slots (none unless set).
    lora: LoraSlots,
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
            prefill_cap: usize::MAX,
            seqs: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::with_capacity(max_num_seqs),
            plan: Vec::with_capacity(max_num_seqs),
            landing: Vec::with_capacity(max_num_seqs),
            landing_rows: 0,
            builder: StepBuilder::new(kv.block_size),
            aborted: Vec::new(),
            first_admitted: Vec::new(),
            grammar_failures: Vec::new(),
            held: false,
            preemptions_total: 0,
            spec: None,
            lora: LoraSlots::new(0, Arc::default()),
        })
    }

    /// The same scheduler over a KV pool that frees blocks outside
    /// `window` (`paged_kv::KvManager::with_window`: every layer of the
    /// model windowed; `None` frees nothing).
    pub(crate) fn with_kv_window(
        mut self,
        window: Option<usize>,
    ) -> Result<Self, paged_kv::KvError> {
        self.kv = self.kv.with_window(window)?;
        Ok(self)
    }

    /// Queues a new sequence (ids must increase with arrival); `fork_of`
    /// names the first choice of the same request (contract point 5),
    /// `max_tokens` the most tokens it generates (contract point 6).
    pub(crate) fn add(&mut self, id: u64, new: NewSeq) {
        let NewSeq {
            prompt,
            params,
            max_tokens,
            fork_of,
            grammar,
            speculative,
            lora,
        } = new;
        let history = params
            .needs_history()
            .then(|| Arc::new(PenaltyHistory::from_tokens(&prompt)));
        let spec_k = match &self.spec {
            Some(s)
                if speculative
                    && (s.penalties || history.is_none())
                    && (s.masks || grammar.is_none()) =>
            {
                s.cfg.num_tokens
            }
            _ => 0,
        };
        let seq = Seq {
            prompt_len: prompt.len(),
            parked: prompt,
            next: None,
            params,
            history,
            fork_of,
            admitted_once: false,
            carried_from: None,
            max_tokens,
            last_in_flight: false,
            cached_tokens: 0,
            spec_k,
            drafted: 0,
            draft_masks: Vec::new(),
            spec_miss: 0,
            spec_wait: 0,
            grammar: grammar.map(Box::new),
            lora,
            slot: 0,
        };
        self.seqs.insert(id, seq);
        self.waiting.push_back(id);
    }

    pub(crate) fn is_idle(&self) -> bool {
        self.seqs.is_empty()
    }
    /// Sequences `(running, waiting)`.
    pub(crate) fn counts(&self) -> (usize, usize) {
        (self.running.len(), self.waiting.len())
    }
    pub(crate) fn kv(&self) -> &KvManager {
        &self.kv
    }

    /// The KV pool, for sequences the scheduler does not run (an
    /// embedding pass admits and frees its own between steps), and the
    /// prompt tokens one pass may run: the step budget under the prefill cap.
    pub(crate) fn kv_for_pass(&mut self) -> (&mut KvManager, usize) {
        (&mut self.kv, self.max_batch_tokens.min(self.prefill_cap))
    }
    /// Empties the prefix cache and zeroes the preemption and speculation
    /// counters (what the warm-up leaves behind).
    pub(crate) fn forget_history(&mut self) {
        self.kv.clear_prefix_cache();
        self.preemptions_total = 0;
        if let Some(spec) = self.spec.as_mut() {
            spec.stats = Default::default();
        }
    }
    /// The LoRA adapter slots.
    pub(crate) fn lora(&self) -> &LoraSlots {
        &self.lora
    }
    pub(crate) fn lora_mut(&mut self) -> &mut LoraSlots {
        &mut self.lora
    }
    /// Sets the LoRA adapter slots (before any sequence is added).
    pub(crate) fn set_lora_slots(&mut self, slots: LoraSlots) {
        self.lora = slots;
    }
    /// Adapter names of the waiting sequences, with their counts.
    pub(crate) fn waiting_loras(&self) -> HashMap<Arc<str>, usize> {
        let mut m = HashMap::new();
        for id in &self.waiting {
            if let Some(l) = self.seqs.get(id).and_then(|s| s.lora.as_ref()) {
                *m.entry(l.name.clone()).or_default() += 1;
            }
        }
        m
    }
    /// The batch planned by the last [`Scheduler::schedule`] (until `launched`).
    pub(crate) fn batch(&self) -> &StepBatch {
        self.builder.batch()
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

    /// Known tokens of `id` (prompt + generated), wherever they are held.
    fn len_of(&self, id: u64, seq: &Seq) -> usize {
        let held = self.kv.seq_len(id as SeqId).unwrap_or(seq.parked.len());
        held + usize::from(seq.next.is_some())
    }

    /// Token counts of `id`.
    pub(crate) fn summary(&self, id: u64) -> Option<SeqSummary> {
        let seq = self.seqs.get(&id)?;
        Some(SeqSummary {
            prompt_len: seq.prompt_len,
            cached_tokens: seq.cached_tokens,
            generated: self.len_of(id, seq) - seq.prompt_len,
        })
    }

    /// Removes a sequence wherever it is and frees its blocks.
    pub(crate) fn finish(&mut self, id: u64) -> Result<SeqSummary, SchedError> {
        let summary = self.summary(id).ok_or(SchedError::UnknownSeq(id))?;
        let seq = self.seqs.remove(&id);
        let seq_slot = seq.as_ref().map(|q| q.slot).filter(|&k| k > 0);
        if let (Some(spec), Some(seq), Some(tokens)) =
            (self.spec.as_mut(), seq, self.kv.seq_tokens(id as SeqId))
            && seq.spec_k > 0
        {
            spec.drafter
                .finished(id, &tokens[..tokens.len() - seq.drafted]);
        }
        if let Some(i) = self.running.iter().position(|&r| r == id) {
            self.running.remove(i);
            self.kv.free(id as SeqId)?;
            if let Some(slot) = seq_slot {
                self.lora.release(slot);
            }
        } else if let Some(i) = self.waiting.iter().position(|&w| w == id) {
            self.waiting.remove(i);
        }
        Ok(summary)
    }

    /// Caps the prefill tokens (chunks of running sequences and admissions)
    /// of the following steps at `cap` while more than one sequence is
    /// running or waiting; decodes are never cut.
    pub(crate) fn set_prefill_cap(&mut self, cap: usize) {
        self.prefill_cap = cap.max(1);
    }

    /// Plans the next step into [`Scheduler::batch`] (empty when nothing can run).
    pub(crate) fn schedule(&mut self) -> Result<(), SchedError> {
        self.plan.clear();
        self.aborted.clear();
        self.first_admitted.clear();
        let preempted = self.grow_running()?;
        let mut budget = self.max_batch_tokens;
        self.propose_drafts(budget)?;
        // the prefill budget left for admissions (step 4)
        let mut reserved = 0;
        // decodes first, then chunks of partial prefills, oldest first
        for decodes in [true, false] {
            // the time cap protects other streams: a lone sequence runs whole chunks
            if !decodes && self.running.len() + self.waiting.len() > 1 {
                budget = budget.min(self.prefill_cap);
                // while the cap binds, a running prefill leaves half of it
                // to the waiting queue, so a request arriving during a long
                // prefill starts within a step instead of after it
                if self.prefill_cap < self.max_batch_tokens
                    && !self.waiting.is_empty()
                    && !preempted
                {
                    reserved = budget / 2;
                    budget -= reserved;
                }
            }
            for i in 0..self.running.len() {
                let id = self.running[i];
                // (a sequence that drafted this step is planned already)
                if self
                    .seqs
                    .get(&id)
                    .is_some_and(|q| q.last_in_flight || q.drafted > 0)
                {
                    continue;
                }
                let sid = id as SeqId;
                let len = self.kv.seq_len(sid).ok_or(SchedError::UnknownSeq(id))?;
                let computed = self
                    .kv
                    .num_computed(sid)
                    .ok_or(SchedError::UnknownSeq(id))?;
                let left = len - computed;
                if budget == 0 || (left == 1) != decodes {
                    continue;
                }
                let n = left.min(budget);
                budget -= n;
                let drafted = match decodes {
                    true => self.draft(id, budget)?,
                    false => 0,
                };
                budget -= drafted;
                self.plan.push(Planned {
                    id,
                    start: computed,
                    end: computed + n + drafted,
                });
            }
        }
        if !preempted {
            self.admit_waiting(budget + reserved)?;
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
            if let (Some(token), false) = (seq.next, seq.last_in_flight) {
                let mut lost_self = false;
                while !self.kv.can_append(id as SeqId, 1) {
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
                self.kv.append(id as SeqId, &[token])?;
                if let Some(seq) = self.seqs.get_mut(&id) {
                    seq.next = None;
                }
            }
            i += 1;
        }
        Ok(preempted)
    }

    /// Frees `id`'s blocks and parks its tokens at the front of the queue.
    fn preempt(&mut self, id: u64) -> Result<(), SchedError> {
        let seq = self.seqs.get_mut(&id).ok_or(SchedError::UnknownSeq(id))?;
        if seq.drafted > 0 {
            // unverified: dropped (the landing then takes the first sample)
            let len = self.kv.seq_len(id as SeqId).unwrap_or(0);
            self.kv
                .truncate(id as SeqId, len.saturating_sub(seq.drafted))?;
            seq.drafted = 0;
            seq.draft_masks.clear();
        }
        let held = self
            .kv
            .seq_tokens(id as SeqId)
            .ok_or(SchedError::UnknownSeq(id))?;
        seq.parked.clear();
        seq.parked.extend_from_slice(held);
        seq.parked.extend(seq.next.take());
        self.kv.free(id as SeqId)?;
        if seq.slot > 0 {
            self.lora.release(seq.slot);
            seq.slot = 0;
        }
        self.running.retain(|&r| r != id);
        self.waiting.push_front(id);
        self.preemptions_total += 1;
        tracing::debug!(seq = id, tokens = seq.parked.len(), "preempted");
        Ok(())
    }

    /// Step 4: first come first served admission under the budget; a
    /// sequence whose LoRA adapter finds no slot stays waiting and the
    /// ones behind it are considered.
    fn admit_waiting(&mut self, mut budget: usize) -> Result<(), SchedError> {
        let mut i = 0;
        while budget > 0 && self.running.len() < self.max_num_seqs {
            let Some(&id) = self.waiting.get(i) else {
                break;
            };
            if self.seqs.get(&id).is_some_and(|q| q.carried_from.is_some()) {
                break; // preempted with a placeholder: admitted once it has landed
            }
            let fork = match self.fork_source(id)? {
                Fork::Wait => break,
                Fork::From(parent) => Some(parent),
                Fork::Alone => None,
            };
            let seq = self.seqs.get_mut(&id).ok_or(SchedError::UnknownSeq(id))?;
            if let Some(l) = &seq.lora
                && !self.lora.can_acquire(l)
            {
                i += 1; // every slot busy with other adapters: it waits
                continue;
            }
            let ns = seq.lora.as_ref().map_or(0, |l| l.key);
            let fits = match fork {
                Some(parent) => self.kv.can_fork(parent as SeqId, &seq.parked),
                None => self.kv.can_admit_in(&seq.parked, ns),
            };
            if !fits {
                if self.running.is_empty() {
                    // the whole pool is allocatable and still too small
                    self.waiting.remove(i);
                    self.aborted.push(id);
                    continue;
                }
                break;
            }
            self.waiting.remove(i);
            let cached = match fork {
                Some(parent) => self.kv.fork(parent as SeqId, id as SeqId, &seq.parked)?,
                None => self.kv.admit_in(id as SeqId, &seq.parked, ns)?,
            };
            if let Some(l) = &seq.lora {
                seq.slot = self.lora.acquire(l).unwrap_or(0);
            }
            let len = seq.parked.len();
            seq.parked = Vec::new(); // paged-kv holds the tokens now
            if !seq.admitted_once {
                seq.admitted_once = true;
                seq.cached_tokens = cached;
                self.first_admitted.push(id);
            }
            let n = (len - cached).min(budget);
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
}

/// How a waiting sequence is admitted (contract point 5).
enum Fork {
    /// Its first choice is still computing the shared prompt: wait.
    Wait,
    /// Share the prompt blocks of this running first choice.
    From(u64),
    /// Like any sequence.
    Alone,
}

impl Scheduler {
    /// How waiting sequence `id` is to be admitted now.
    fn fork_source(&self, id: u64) -> Result<Fork, SchedError> {
        let seq = self.seqs.get(&id).ok_or(SchedError::UnknownSeq(id))?;
        let (Some(parent_id), false) = (seq.fork_of, seq.admitted_once) else {
            return Ok(Fork::Alone);
        };
        let Some(parent) = self.seqs.get(&parent_id) else {
            return Ok(Fork::Alone);
        };
        if !parent.admitted_once {
            return Ok(Fork::Wait);
        }
        let Some(computed) = self.kv.num_computed(parent_id as SeqId) else {
            // preempted: it will recompute, this one does not wait for it
            return Ok(Fork::Alone);
        };
        let bs = self.kv.block_size();
        let shareable = (seq.prompt_len - 1) / bs * bs;
        Ok(if computed >= shareable {
            Fork::From(parent_id)
        } else {
            Fork::Wait
        })
    }
}

mod spec;
mod step;

use spec::Speculation;
pub(crate) use spec::VerifyCaps;
#[cfg(test)]
mod spec_tests;
#[cfg(test)]
mod tests;
