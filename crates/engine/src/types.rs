//! The engine's public value types: configuration, requests, the events a
//! request streams, finish reasons, usage, statistics and errors.
//!
//! Contract: plain data, no behaviour beyond validation and display. Every
//! error's `Display` names the value at fault and the limit it broke.

use contract::{ParamError, SampledToken, SamplingParams};

use crate::grammar::{Constraint, GrammarError};
use crate::speculate::SpecConfig;

/// Scheduler limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineConfig {
    /// Most sequences running (holding KV blocks) at once.
    pub max_num_seqs: usize,
    /// Most tokens in one step: every running decode plus prefill chunks.
    /// Must be at least `max_num_seqs` so every running decode fits a step.
    pub max_batch_tokens: usize,
    /// Reuse KV blocks of identical prompt prefixes across requests.
    pub enable_prefix_cache: bool,
    /// Most requests waiting for their first admission; 0 = unbounded.
    pub max_queue: usize,
    /// Target backend time of one step: prefill chunks are cut to the tokens
    /// the backend is measured to run in that time (at least 16), so a long
    /// prompt cannot stall the other streams for longer on a slow backend
    /// (the CPU). `None`: the token budget alone.
    pub max_step_time: Option<std::time::Duration>,
    /// A failed backend step fails the whole engine: every request ends
    /// with an error naming the failure, later submits are refused with
    /// [`SubmitError::EngineFailed`] and [`crate::Engine::failure`] says why.
    /// For one engine among replicas (the server then takes it out of
    /// rotation); off, a failed step ends only that step's requests.
    pub halt_on_backend_error: bool,
    /// Pipeline the steps: step N + 1 is planned and launched before step
    /// N's samples are read, the tokens it needs from step N taken on the
    /// device, so no host round trip separates two steps. Off, each step
    /// lands before the next is planned. Output is the same either way.
    pub async_steps: bool,
    /// Speculative decoding (`crate::speculate`): drafts verified in the
    /// step, the same output in fewer steps. `None`: off. Ignored with a
    /// warning on a backend that verifies no drafts
    /// (`Backend::max_drafts` 0); the draft length is capped at what it
    /// verifies.
    pub speculative: Option<SpecConfig>,
    /// LoRA adapter slots in the backend: adapters resident at once
    /// (`--max-loras`; 0: LoRA off). Must not exceed `Backend::max_loras`.
    pub max_loras: usize,
    /// Highest LoRA rank accepted (`--max-lora-rank`).
    pub max_lora_rank: usize,
    /// Bounds on the adapters loaded at once (`--max-loaded-loras`,
    /// `--max-lora-memory-mib`).
    pub lora_limits: crate::lora::LoraLimits,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_num_seqs: 256,
            max_batch_tokens: 2048,
            enable_prefix_cache: true,
            max_queue: 0,
            max_step_time: None,
            halt_on_backend_error: false,
            async_steps: true,
            speculative: None,
            max_loras: 0,
            max_lora_rank: contract::lora::DEFAULT_MAX_LORA_RANK,
            lora_limits: crate::lora::LoraLimits::default(),
        }
    }
}

/// One generation request: prompt token ids and how to continue them.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateRequest {
    pub prompt: Vec<u32>,
    pub sampling: SamplingParams,
    /// Most tokens to generate (at least 1); prompt + max_tokens must fit the context.
    pub max_tokens: usize,
    /// Stop when any of these texts appears in the output; the text returned
    /// excludes it.
    pub stop: Vec<String>,
    /// Keep generating past EOS tokens.
    pub ignore_eos: bool,
    /// Stop when one of these token ids is sampled (vLLM's
    /// `stop_token_ids`), even with `ignore_eos`; like an EOS, the token
    /// adds no text and the finish reason is `Stop`.
    pub stop_token_ids: Vec<u32>,
    /// Constrained decoding: every sampled token keeps the output a prefix
    /// of a text this constraint accepts (see [`crate::grammar`]).
    pub constraint: Option<Constraint>,
    /// May be decoded speculatively when the engine speculates
    /// ([`EngineConfig::speculative`]); false opts out. The output is the
    /// same either way.
    pub speculative: bool,
    /// The LoRA adapter to run with, by the name it was loaded under
    /// (`Engine::load_lora`); `None`: the base model.
    pub lora: Option<String>,
}

/// What a request streams.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// One generated token (never an EOS that ended the request).
    Token(TokenEvent),
    /// The last event of every request.
    Done(Finished),
}

/// One generated token and the text it completed.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenEvent {
    pub token: u32,
    /// New output text: may be empty (an incomplete UTF-8 character, or text
    /// held back because it could still become a stop string) and may carry
    /// text held back by earlier tokens.
    pub text: String,
    /// Log-probability of `token` under the raw model distribution.
    pub logprob: f32,
    /// The requested top alternatives, best first.
    pub top_logprobs: Vec<(u32, f32)>,
    /// Whether text of this token or an earlier one is still held back (an
    /// incomplete character, a possible stop string), or the token ended the
    /// request on a stop (EOS, a stop token id or string) and adds no text. A token that adds
    /// no text and holds nothing back (a skipped special token) is not held.
    pub held: bool,
}

impl TokenEvent {
    pub(crate) fn new(s: SampledToken, text: String, held: bool) -> Self {
        TokenEvent {
            token: s.token,
            text,
            held,
            logprob: s.logprob,
            top_logprobs: s.top_logprobs,
        }
    }
}

/// How a request ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Finished {
    pub reason: FinishReason,
    pub usage: Usage,
    /// Why, when `reason` is [`FinishReason::Error`].
    pub error: Option<String>,
    /// Time from submission to the first admission (`None` if never admitted).
    pub queue_time: Option<std::time::Duration>,
}

/// Why a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FinishReason {
    /// An EOS token or a stop string.
    Stop,
    /// `max_tokens` generated.
    Length,
    /// Cancelled by the client (handle dropped, `cancel()`) or by shutdown.
    Cancelled,
    /// The backend or the detokenizer failed, or the sequence outgrew the
    /// whole KV pool; see [`Finished::error`].
    Error,
}

impl FinishReason {
    /// The OpenAI-style name: `stop`, `length`, `cancelled`, `error`.
    pub fn as_str(&self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
            FinishReason::Error => "error",
        }
    }
}

/// Token counts of one request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    /// Prompt tokens whose KV came from the prefix cache at first admission.
    pub cached_tokens: usize,
    /// Tokens sampled, including an EOS that ended the request.
    pub completion_tokens: usize,
}

/// A snapshot of the engine's counters (totals since start).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineStats {
    pub running: u64,
    pub waiting: u64,
    /// Prompt tokens of the requests submitted and not yet admitted (updated
    /// at submit, not only per step: what a router balances on).
    pub queued_prompt_tokens: u64,
    pub kv_blocks_used: u64,
    pub kv_blocks_total: u64,
    pub prompt_tokens_total: u64,
    pub cached_tokens_total: u64,
    pub generation_tokens_total: u64,
    /// Backend steps run.
    pub steps_total: u64,
    /// Sequences preempted (blocks freed, later recomputed).
    pub preemptions_total: u64,
    /// Nanoseconds spent in `Backend::step`.
    pub backend_ns_total: u64,
    /// Nanoseconds spent planning steps (scheduling, KV bookkeeping, batch
    /// building) and committing their results: the scheduler proper.
    pub schedule_ns_total: u64,
    /// Nanoseconds spent on host work between steps (scheduling, batch
    /// building, detokenizing, stop checks, sending events).
    pub host_ns_total: u64,
    /// Speculative decoding: tokens drafted and verified.
    pub spec_drafted_total: u64,
    /// Speculative decoding: drafted tokens accepted.
    pub spec_accepted_total: u64,
    /// Speculative decoding: sequence steps that verified drafts (accepted
    /// / verifies is the mean accepted length).
    pub spec_verifies_total: u64,
}

/// The LoRA adapters in use, as of the end of the last step
/// ([`crate::Engine::lora_gauge`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoraGauge {
    /// Adapters of running sequences, sorted.
    pub running: Vec<String>,
    /// Adapters of waiting sequences, sorted.
    pub waiting: Vec<String>,
    /// Backend slots holding an adapter.
    pub resident: usize,
}

/// Why [`crate::Engine::start`] failed.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("invalid engine config: `{field}`: {reason}")]
    InvalidConfig { field: &'static str, reason: String },
    #[error("cannot start the engine thread: {0}")]
    Spawn(#[from] std::io::Error),
}

/// Why [`crate::Engine::submit`] refused a request; other requests are unaffected.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SubmitError {
    #[error("the waiting queue is full; retry later")]
    QueueFull,
    #[error("the prompt has {prompt} tokens; the model's context is {limit}")]
    PromptTooLong { prompt: usize, limit: usize },
    #[error(
        "the prompt has {prompt} tokens and max_tokens is {max_tokens}: {} in all, beyond the model's context of {limit}",
        prompt.saturating_add(*max_tokens)
    )]
    ContextExceeded {
        prompt: usize,
        max_tokens: usize,
        limit: usize,
    },
    #[error(
        "the prompt has {prompt} tokens, needing {needed_blocks} KV blocks of {block_size}; the whole KV pool has {pool_blocks}"
    )]
    ExceedsKvPool {
        prompt: usize,
        needed_blocks: usize,
        block_size: usize,
        pool_blocks: usize,
    },
    #[error(
        "the prompt has {prompt} tokens and max_tokens is {max_tokens}: {} in all, more than the whole KV pool holds ({pool_tokens} tokens), so the request could never finish; lower max_tokens or give the pool more memory (--kv-memory-gib / --kv-blocks)",
        prompt.saturating_add(*max_tokens)
    )]
    NeverFitsKvPool {
        prompt: usize,
        max_tokens: usize,
        pool_tokens: usize,
    },
    #[error(
        "token id {token} at prompt position {position} is outside the vocabulary (size {vocab})"
    )]
    TokenOutOfVocab {
        token: u32,
        position: usize,
        vocab: usize,
    },
    #[error("{0}")]
    InvalidParams(ParamError),
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("invalid {0}")]
    Grammar(GrammarError),
    #[error("the engine is shutting down")]
    ShuttingDown,
    #[error("the engine failed: {0}")]
    EngineFailed(String),
    #[error("no LoRA adapter named `{0}` is loaded")]
    UnknownLora(String),
}
