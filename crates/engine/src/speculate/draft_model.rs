//! The draft-model drafter: a smaller model of the same vocabulary runs
//! greedily ahead of the target and proposes its tokens.
//!
//! Contract: [`DraftModelDrafter`] owns a second [`Backend`] (the same kind
//! as the target's, with its own weights and paged KV pool) and a
//! `paged_kv::KvManager` over that pool, one sequence per target sequence.
//! Each proposal first brings the draft's sequence in line with the
//! target's verified tokens: the longest common prefix of what the draft
//! holds and the verified tokens is kept (rejected drafts are truncated
//! away, accepted ones and the correction appended), the tokens whose KV
//! the draft has not written run as one segment whose last row is sampled
//! greedily (the first draft), then each further draft token runs as a
//! one-token row. The sequences of one [`Drafter::propose_all`] call run
//! together: one draft-backend step for every sequence's catch-up segment
//! and first draft, then one step per further drafted position with a row
//! for each sequence still drafting (K steps for K drafts, however many
//! sequences draft). Only verified tokens are ever marked computed in the
//! draft's KV manager (drafts stay uncomputed there, so a rollback is a
//! `truncate` and the draft's prefix cache never holds an unverified
//! token); the drafter itself remembers how far the draft's KV is written
//! ([`DraftSeq::ran`]), which covers the kept drafts of the last proposal.
//!
//! A failing draft step forgets its sequences, which draft nothing
//! (drafts never change outputs, only how many steps they take).
//!
//! A full draft pool evicts the least recently drafting sequence outside
//! the call (it is re-admitted, recomputing its tokens, when it drafts
//! again). A sequence's drafts do not depend on the others of its call
//! (the backend's rows are independent, `contract::StepBatch`).
//!
//! Costs: per call, one draft step over every sequence's tokens verified
//! since its last proposal, plus one step of one row per drafting
//! sequence for each further drafted position; O(len) per sequence to
//! compare the held and verified tokens.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use contract::{Backend, ModelConfig, SampleRequest, SamplingParams, StepBuilder};
use paged_kv::{KvConfig, KvError, KvManager, SeqId};

use super::{Drafter, Proposal};

/// A draft model's backend, handed to the engine in
/// [`super::SpecMethod::Draft`]; the engine takes it out once at start.
#[derive(Clone)]
pub struct DraftModel {
    name: Arc<str>,
    backend: Arc<Mutex<Option<Box<dyn Backend>>>>,
}

impl DraftModel {
    /// A draft model named `name` whose backend is not loaded yet.
    pub fn named(name: &str) -> Self {
        DraftModel {
            name: name.into(),
            backend: Arc::new(Mutex::new(None)),
        }
    }

    /// The draft model `name` running on `backend`.
    pub fn loaded(name: &str, backend: Box<dyn Backend>) -> Self {
        DraftModel {
            name: name.into(),
            backend: Arc::new(Mutex::new(Some(backend))),
        }
    }

    /// The model's name (as the flag gave it).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Takes the backend out (`None`: not loaded, or taken already).
    pub fn take(&self) -> Option<Box<dyn Backend>> {
        self.backend.lock().ok()?.take()
    }
}

impl std::fmt::Debug for DraftModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DraftModel({})", self.name)
    }
}

impl PartialEq for DraftModel {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.backend, &other.backend)
    }
}

impl Eq for DraftModel {}

/// Most parameters a model holds, counted from its configuration
/// (embeddings, attention, MLP, norms and an untied head).
pub fn num_params(c: &ModelConfig) -> u64 {
    let (h, i) = (c.hidden_size as u64, c.intermediate_size as u64);
    let (q, kv, v) = (c.q_dim() as u64, c.kv_dim() as u64, c.vocab_size as u64);
    let layer = h * q * 2 + h * kv * 2 + h * i * 3 + h * 2;
    let head = if c.tie_word_embeddings { 0 } else { v * h };
    v * h + c.num_layers as u64 * layer + h + head
}

/// Checks that `draft` can draft for `target`: the same vocabulary size,
/// BOS and EOS ids, and no larger (parameters, or layers x hidden size).
/// The error says what differs, with both values.
pub fn check_draft_config(draft: &ModelConfig, target: &ModelConfig) -> Result<(), String> {
    if draft.vocab_size != target.vocab_size {
        return Err(format!(
            "the draft model's vocabulary has {} tokens, the target's {}; the draft model must share the target's tokenizer",
            draft.vocab_size, target.vocab_size
        ));
    }
    if draft.bos_token_id != target.bos_token_id {
        return Err(format!(
            "the draft model's BOS id is {:?}, the target's {:?}; the draft model must share the target's tokenizer",
            draft.bos_token_id, target.bos_token_id
        ));
    }
    let (dp, tp) = (num_params(draft), num_params(target));
    let (dw, tw) = (
        draft.num_layers * draft.hidden_size,
        target.num_layers * target.hidden_size,
    );
    if dp > tp || dw > tw {
        return Err(format!(
            "the draft model ({dp} parameters, {} layers x hidden {}) is larger than the target ({tp} parameters, {} layers x hidden {}); a draft model must be smaller",
            draft.num_layers, draft.hidden_size, target.num_layers, target.hidden_size
        ));
    }
    Ok(())
}

/// Why a draft step failed (the sequence is then forgotten).
#[derive(Debug, thiserror::Error)]
enum DraftError {
    #[error("draft KV: {0}")]
    Kv(#[from] KvError),
    #[error("draft step: {0}")]
    Step(String),
}

/// What the drafter keeps of one sequence beside its KV manager.
#[derive(Debug, Clone, Copy)]
struct DraftSeq {
    /// Leading tokens whose KV the draft model has written (verified ones
    /// and the drafts of the last proposal that the draft ran).
    ran: usize,
    /// Tokens of the prompt, as far as the drafter knows (its first
    /// proposal's tokens but the last).
    prompt_len: usize,
    /// When it last drafted (a counter), for eviction.
    used: u64,
}

/// Drafts with a smaller model (module doc).
pub struct DraftModelDrafter {
    backend: Box<dyn Backend>,
    kv: KvManager,
    builder: StepBuilder,
    seqs: HashMap<u64, DraftSeq>,
    clock: u64,
    max_positions: usize,
    greedy: SampleRequest,
}

impl DraftModelDrafter {
    /// A drafter over `backend`'s KV pool (prefix cache on).
    pub fn new(backend: Box<dyn Backend>) -> Result<Self, String> {
        let shape = backend.kv_shape();
        let kv = KvManager::try_new(KvConfig {
            num_blocks: shape.num_blocks,
            block_size: shape.block_size,
            enable_prefix_cache: true,
        })
        .map_err(|e| format!("the draft model's KV pool: {e}"))?;
        let max_positions = backend.config().max_position_embeddings;
        Ok(DraftModelDrafter {
            backend,
            kv,
            builder: StepBuilder::new(shape.block_size),
            seqs: HashMap::new(),
            clock: 0,
            max_positions,
            greedy: SampleRequest {
                params: SamplingParams::greedy(),
                step: 0,
                history: None,
                allowed: None,
            },
        })
    }

    /// Frees the least recently drafting sequence other than `keep` and
    /// those of the current call (used at the current clock); false when
    /// there is none.
    fn evict_one(&mut self, keep: u64) -> bool {
        let now = self.clock;
        let victim = self
            .seqs
            .iter()
            .filter(|(id, s)| **id != keep && s.used != now)
            .min_by_key(|(_, s)| s.used)
            .map(|(id, _)| *id);
        match victim {
            Some(id) => {
                self.forget(id);
                true
            }
            None => false,
        }
    }

    fn forget(&mut self, seq: u64) {
        if self.seqs.remove(&seq).is_some() {
            let _ = self.kv.free(seq as SeqId);
        }
    }

    /// Makes the draft's sequence hold exactly `tokens` (module doc);
    /// false when the pool has no room for it.
    fn sync(&mut self, seq: u64, tokens: &[u32]) -> Result<bool, DraftError> {
        let sid = seq as SeqId;
        let held = self.kv.seq_tokens(sid).map(|held| {
            let c = held.iter().zip(tokens).take_while(|(a, b)| a == b).count();
            (c, self.kv.num_computed(sid).unwrap_or(0))
        });
        match held {
            Some((common, computed)) if common >= computed => {
                self.kv.truncate(sid, common)?;
                while !self.kv.can_append(sid, tokens.len() - common) {
                    if !self.evict_one(seq) {
                        return Ok(false);
                    }
                }
                self.kv.append(sid, &tokens[common..])?;
                if let Some(s) = self.seqs.get_mut(&seq) {
                    s.ran = s.ran.min(common);
                }
            }
            _ => {
                self.forget(seq);
                while !self.kv.can_admit(tokens) {
                    if !self.evict_one(seq) {
                        return Ok(false);
                    }
                }
                let cached = self.kv.admit(sid, tokens)?;
                let prompt_len = tokens.len().saturating_sub(1);
                self.seqs.insert(
                    seq,
                    DraftSeq {
                        ran: cached,
                        prompt_len,
                        used: 0,
                    },
                );
            }
        }
        Ok(true)
    }

    /// Runs one draft step of `rows` (`(sequence, first token to run)`:
    /// each sequence's tokens from there to its end, one segment, its last
    /// row sampled greedily) and returns each one's sample, in order.
    fn run(&mut self, rows: &[(u64, usize)]) -> Result<Vec<u32>, DraftError> {
        self.builder.begin();
        for &(seq, from) in rows {
            let sid = seq as SeqId;
            let unknown = || DraftError::Step(format!("sequence {seq} is not in the draft pool"));
            let tokens = self.kv.seq_tokens(sid).ok_or_else(unknown)?;
            let table = self.kv.block_table(sid).ok_or_else(unknown)?;
            let prompt_len = self.seqs.get(&seq).map_or(0, |s| s.prompt_len);
            self.builder
                .push(&tokens[from..], from, table, Some(self.greedy.clone()))
                .map_err(|e| DraftError::Step(e.to_string()))?;
            self.builder.set_prompt_len(prompt_len);
        }
        let out = self
            .backend
            .step(self.builder.finish())
            .map_err(|e| DraftError::Step(e.to_string()))?;
        if out.len() != rows.len() {
            return Err(DraftError::Step("the draft step sampled nothing".into()));
        }
        out.into_iter()
            .map(|s| s.map(|s| s.token))
            .collect::<Option<Vec<u32>>>()
            .ok_or_else(|| DraftError::Step("the draft step sampled nothing".into()))
    }

    /// Syncs every asked sequence (module doc) and returns those that
    /// draft: `(index in reqs, sequence, first token to run)`.
    fn sync_all(&mut self, reqs: &[Proposal<'_>]) -> Vec<(usize, u64, usize)> {
        self.clock += 1;
        let mut active = Vec::with_capacity(reqs.len());
        for (i, r) in reqs.iter().enumerate() {
            let len = r.tokens.len();
            if r.max == 0 || len == 0 || len >= self.max_positions {
                continue;
            }
            match self.sync(r.seq, r.tokens) {
                Ok(true) => {}
                Ok(false) => continue,
                Err(e) => {
                    tracing::warn!(seq = r.seq, error = %e, "the draft model's KV failed; the sequence drafts nothing this step");
                    self.forget(r.seq);
                    continue;
                }
            }
            if let Some(state) = self.seqs.get_mut(&r.seq) {
                state.used = self.clock;
                // the last verified token always runs: its row gives the first draft
                active.push((i, r.seq, state.ran.min(len - 1)));
            }
        }
        active
    }

    fn try_propose_all(
        &mut self,
        reqs: &[Proposal<'_>],
        active: &[(usize, u64, usize)],
        out: &mut [Vec<u32>],
    ) -> Result<(), DraftError> {
        let rows: Vec<(u64, usize)> = active.iter().map(|&(_, seq, from)| (seq, from)).collect();
        let firsts = self.run(&rows)?;
        // (index in reqs, sequence, tokens whose KV the draft wrote, next)
        let mut live: Vec<(usize, u64, usize, u32)> = Vec::with_capacity(active.len());
        for (&(i, seq, _), next) in active.iter().zip(firsts) {
            let len = reqs[i].tokens.len();
            self.kv.mark_computed(seq as SeqId, len)?;
            out[i].push(next);
            live.push((i, seq, len, next));
        }
        loop {
            // sequences that draft another token: their last draft runs
            let mut rows: Vec<(u64, usize)> = Vec::with_capacity(live.len());
            let mut step: Vec<usize> = Vec::with_capacity(live.len());
            for (n, &(i, seq, ran, next)) in live.iter().enumerate() {
                let sid = seq as SeqId;
                if out[i].len() < reqs[i].max
                    && ran + 1 < self.max_positions
                    && self.kv.can_append(sid, 1)
                {
                    self.kv.append(sid, &[next])?;
                    rows.push((seq, ran));
                    step.push(n);
                }
            }
            if rows.is_empty() {
                break;
            }
            let nexts = self.run(&rows)?;
            let mut still = Vec::with_capacity(step.len());
            for (&n, next) in step.iter().zip(nexts) {
                let (i, seq, ran, _) = live[n];
                out[i].push(next);
                still.push((i, seq, ran + 1, next));
            }
            for &(_, seq, ran, _) in &live {
                self.set_ran(seq, ran);
            }
            live = still;
        }
        for &(_, seq, ran, _) in &live {
            self.set_ran(seq, ran);
        }
        Ok(())
    }

    /// Records that the draft's KV of `seq` is written up to `ran`.
    fn set_ran(&mut self, seq: u64, ran: usize) {
        if let Some(state) = self.seqs.get_mut(&seq) {
            state.ran = ran;
        }
    }
}

impl Drafter for DraftModelDrafter {
    fn propose(&mut self, seq: u64, tokens: &[u32], max: usize, out: &mut Vec<u32>) {
        let mut one = [std::mem::take(out)];
        self.propose_all(&[Proposal { seq, tokens, max }], &mut one);
        let [drafts] = one;
        *out = drafts;
    }

    fn propose_all(&mut self, reqs: &[Proposal<'_>], out: &mut [Vec<u32>]) {
        let active = self.sync_all(reqs);
        if active.is_empty() {
            return;
        }
        if let Err(e) = self.try_propose_all(reqs, &active, out) {
            tracing::warn!(error = %e, "the draft model failed; its sequences draft nothing this step");
            for &(i, seq, _) in &active {
                self.forget(seq);
                out[i].clear();
            }
        }
    }

    fn finished(&mut self, seq: u64, _tokens: &[u32]) {
        self.forget(seq);
    }
}
