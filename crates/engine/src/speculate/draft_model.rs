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
//! one-token step. Only verified tokens are ever marked computed in the
//! draft's KV manager (drafts stay uncomputed there, so a rollback is a
//! `truncate` and the draft's prefix cache never holds an unverified
//! token); the drafter itself remembers how far the draft's KV is written
//! ([`DraftSeq::ran`]), which covers the kept drafts of the last proposal.
//!
//! A full draft pool evicts the least recently drafting sequence (it is
//! re-admitted, recomputing its tokens, when it drafts again); a failing
//! draft step forgets the sequence and drafts nothing (drafts never change
//! outputs, only how many steps they take).
//!
//! Costs: per proposal, one draft step over the tokens verified since the
//! last one plus one one-token step per further draft; O(len) to compare
//! the held and verified tokens. Sequences draft one at a time (the
//! draft's steps are not batched across sequences).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use contract::{Backend, LlamaConfig, SampleRequest, SamplingParams, StepBuilder};
use paged_kv::{KvConfig, KvError, KvManager, SeqId};

use super::Drafter;

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
pub fn num_params(c: &LlamaConfig) -> u64 {
    let (h, i) = (c.hidden_size as u64, c.intermediate_size as u64);
    let (q, kv, v) = (c.q_dim() as u64, c.kv_dim() as u64, c.vocab_size as u64);
    let layer = h * q * 2 + h * kv * 2 + h * i * 3 + h * 2;
    let head = if c.tie_word_embeddings { 0 } else { v * h };
    v * h + c.num_layers as u64 * layer + h + head
}

/// Checks that `draft` can draft for `target`: the same vocabulary size,
/// BOS and EOS ids, and no larger (parameters, or layers x hidden size).
/// The error says what differs, with both values.
pub fn check_draft_config(draft: &LlamaConfig, target: &LlamaConfig) -> Result<(), String> {
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

    /// Frees the least recently drafting sequence other than `keep`;
    /// false when there is none.
    fn evict_one(&mut self, keep: u64) -> bool {
        let victim = self
            .seqs
            .iter()
            .filter(|(id, _)| **id != keep)
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

    /// Runs `seq`'s tokens from `from` to its end as one segment and
    /// returns the greedy sample after them.
    fn run(&mut self, seq: u64, from: usize, prompt_len: usize) -> Result<u32, DraftError> {
        let sid = seq as SeqId;
        let unknown = || DraftError::Step(format!("sequence {seq} is not in the draft pool"));
        let tokens = self.kv.seq_tokens(sid).ok_or_else(unknown)?;
        let table = self.kv.block_table(sid).ok_or_else(unknown)?;
        self.builder.begin();
        self.builder
            .push(&tokens[from..], from, table, Some(self.greedy.clone()))
            .map_err(|e| DraftError::Step(e.to_string()))?;
        self.builder.set_prompt_len(prompt_len);
        let out = self
            .backend
            .step(self.builder.finish())
            .map_err(|e| DraftError::Step(e.to_string()))?;
        match out.first() {
            Some(Some(s)) => Ok(s.token),
            _ => Err(DraftError::Step("the draft step sampled nothing".into())),
        }
    }

    fn try_propose(
        &mut self,
        seq: u64,
        tokens: &[u32],
        max: usize,
        out: &mut Vec<u32>,
    ) -> Result<(), DraftError> {
        let len = tokens.len();
        if max == 0 || len >= self.max_positions || !self.sync(seq, tokens)? {
            return Ok(());
        }
        self.clock += 1;
        let Some(state) = self.seqs.get_mut(&seq) else {
            return Ok(());
        };
        state.used = self.clock;
        // the last verified token always runs: its row gives the first draft
        let (from, prompt_len) = (state.ran.min(len - 1), state.prompt_len);
        let mut next = self.run(seq, from, prompt_len)?;
        self.kv.mark_computed(seq as SeqId, len)?;
        let mut ran = len;
        out.push(next);
        while out.len() < max && ran + 1 < self.max_positions && self.kv.can_append(seq as SeqId, 1)
        {
            self.kv.append(seq as SeqId, &[next])?;
            next = self.run(seq, ran, prompt_len)?;
            ran += 1;
            out.push(next);
        }
        if let Some(state) = self.seqs.get_mut(&seq) {
            state.ran = ran;
        }
        Ok(())
    }
}

impl Drafter for DraftModelDrafter {
    fn propose(&mut self, seq: u64, tokens: &[u32], max: usize, out: &mut Vec<u32>) {
        if let Err(e) = self.try_propose(seq, tokens, max, out) {
            tracing::warn!(seq, error = %e, "the draft model failed; the sequence drafts nothing this step");
            self.forget(seq);
            out.clear();
        }
    }

    fn finished(&mut self, seq: u64, _tokens: &[u32]) {
        self.forget(seq);
    }
}
