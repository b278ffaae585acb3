//! Speculative decoding: drafters that propose the tokens a sequence will
//! likely generate next, and the settings that turn it on.
//!
//! Contract: a [`Drafter`] proposes up to `max` tokens to follow a
//! sequence's verified tokens (prompt + generated). Its drafts are
//! deterministic (one token per position, no probabilities), so verifying
//! them keeps the target's distribution exactly: the scheduler runs the
//! drafts as extra rows of the sequence's decode segment
//! ([`contract::StepBatch::drafts`]), every row is sampled exactly as that
//! token would be without speculation (same seed, same step index), and the
//! drafts are accepted while each equals the sample before it; the first
//! sample that differs is the next token. Greedy and seeded sampled outputs
//! are therefore token for token those of plain decoding; only the number of
//! steps changes. A wrong draft costs compute, never correctness.
//!
//! Which sequences draft: those of a request that allows it
//! (`GenerateRequest::speculative`), unless the backend applies a grammar
//! mask per verify row (`Backend::verifies_masks`: each row's mask is the
//! grammar's after the drafts before it) without a grammar, unless the
//! backend applies a penalty history per verify row
//! (`Backend::verifies_penalties`: each row's history then counts the
//! drafts before it) without penalties, while at most
//! [`SpecConfig::max_batch`] sequences run. A constrained sequence's draft
//! is cut at the first token its grammar refuses (checked on a copy of
//! the grammar state), so no verify row runs a token the output could
//! never hold, and each row samples from the target's masked
//! distribution exactly as plain decoding would at that position. Each sequence's draft length
//! starts at [`SpecConfig::num_tokens`] and follows its acceptance: it
//! grows by one after a fully accepted draft and drops to one past the
//! accepted length after a rejection.
//!
//! Methods: [`ngram`] (prompt lookup: the continuation of the latest
//! earlier occurrence of the sequence's last `n` tokens, longest `n`
//! first), [`suffix`] (the most frequent continuation of the longest
//! matching suffix over this sequence and recent sequences' tokens, cut
//! where the match's confidence drops) and [`draft_model`] (a smaller
//! model of the same vocabulary decoding greedily ahead, with its own
//! paged KV kept in step with the verified tokens).

pub mod draft_model;
pub mod ngram;
pub mod suffix;

use contract::backend::MAX_DRAFTS;

pub use draft_model::{DraftModel, DraftModelDrafter};
pub use ngram::NgramDrafter;
pub use suffix::SuffixDrafter;

/// One sequence's ask of [`Drafter::propose_all`].
#[derive(Debug, Clone, Copy)]
pub struct Proposal<'a> {
    pub seq: u64,
    /// Its verified prompt + generated tokens (never empty).
    pub tokens: &'a [u32],
    /// Most tokens to propose.
    pub max: usize,
}

/// Proposes draft tokens for sequences (module doc).
pub trait Drafter: Send {
    /// Appends to `out` at most `max` tokens proposed to follow `tokens`
    /// (sequence `seq`'s verified prompt + generated tokens, never empty).
    fn propose(&mut self, seq: u64, tokens: &[u32], max: usize, out: &mut Vec<u32>);

    /// Proposes for every sequence of a step at once: `out[i]` (empty on
    /// entry) gets `reqs[i]`'s proposal, the same tokens [`Drafter::propose`]
    /// would give it alone. Default: one [`Drafter::propose`] each; the
    /// draft model runs all of them in one batch per drafted position.
    fn propose_all(&mut self, reqs: &[Proposal<'_>], out: &mut [Vec<u32>]) {
        for (r, o) in reqs.iter().zip(out) {
            self.propose(r.seq, r.tokens, r.max, o);
        }
    }

    /// Sequence `seq` ended with `tokens` (its verified tokens, the prompt
    /// first). Default: nothing kept.
    fn finished(&mut self, seq: u64, tokens: &[u32]) {
        let _ = (seq, tokens);
    }
}

/// A drafting method.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpecMethod {
    /// Prompt lookup ([`NgramDrafter`]).
    Ngram,
    /// Suffix matching over this and recent sequences ([`SuffixDrafter`]).
    Suffix,
    /// A smaller model ([`DraftModelDrafter`]); its backend is taken out
    /// of the handle when the engine starts.
    Draft(DraftModel),
}

impl SpecMethod {
    /// The method's name, as the flag spells it and metrics label it.
    pub fn name(&self) -> &'static str {
        match self {
            SpecMethod::Ngram => "ngram",
            SpecMethod::Suffix => "suffix",
            SpecMethod::Draft(_) => "draft",
        }
    }
}

/// Speculative decoding settings (`EngineConfig::speculative`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecConfig {
    pub method: SpecMethod,
    /// Most tokens drafted per sequence and step, 1 to
    /// [`contract::backend::MAX_DRAFTS`].
    pub num_tokens: usize,
    /// Steps with more running sequences than this draft nothing: a large
    /// batch already keeps the device busy, and verify rows would cost
    /// more than they save.
    pub max_batch: usize,
}

/// Default [`SpecConfig::max_batch`] on a GPU.
pub const DEFAULT_SPEC_MAX_BATCH: usize = 32;
/// Default [`SpecConfig::max_batch`] on the CPU, whose verify rows cost
/// compute from two sequences on (SmolLM2 on 2 cores, suffix drafts, K =
/// 8: the default Q4_1 weights 0.89-0.91x at 2 sequences, 0.98x at 4;
/// BF16 1.50-1.70x at 2, 0.99x at 4, 0.91x at 8): a single stream drafts.
pub const CPU_SPEC_MAX_BATCH: usize = 1;

impl SpecConfig {
    /// Checks the settings: an error naming the field and its range.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if self.num_tokens == 0 || self.num_tokens > MAX_DRAFTS {
            return Err((
                "num_tokens",
                format!("{} is not in 1..={MAX_DRAFTS}", self.num_tokens),
            ));
        }
        Ok(())
    }

    /// A fresh drafter of this method for a target of configuration
    /// `target`. A draft model's backend is taken out of its handle (so
    /// only the first call gets it) and checked against the target
    /// ([`draft_model::check_draft_config`]); the error says why not.
    pub fn drafter(&self, target: &contract::ModelConfig) -> Result<Box<dyn Drafter>, String> {
        Ok(match &self.method {
            SpecMethod::Ngram => Box::new(NgramDrafter::default()),
            SpecMethod::Suffix => Box::new(SuffixDrafter::default()),
            SpecMethod::Draft(m) => {
                let backend = m.take().ok_or_else(|| {
                    format!(
                        "the draft model {} is not loaded (or already in use)",
                        m.name()
                    )
                })?;
                draft_model::check_draft_config(backend.config(), target)?;
                Box::new(DraftModelDrafter::new(backend)?)
            }
        })
    }
}
