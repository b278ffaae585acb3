//! engine: requests, the continuous-batching scheduler (chunked prefill,
//! preemption, prefix caching through `paged-kv`) and streaming.
//!
//! [`Engine::start`] spawns one thread that owns the [`contract::Backend`] and a
//! `paged_kv::KvManager` sized from `backend.kv_shape()`. Each step it builds
//! one flat `StepBatch` (design brief): every running decode plus prefill
//! chunks under `max_batch_tokens`, admitting a waiting request only when its
//! blocks fit; when the pool runs out the youngest running sequence is
//! preempted and later recomputed, with output identical to an uninterrupted
//! run (sampling draws are counter-based on the generated index). Requests
//! stream [`Event`]s through a [`RequestHandle`] usable from async code and
//! from plain threads; dropping it cancels the request.
//!
//! Module map: [`types`] (public values and errors), `engine` (handles and
//! submit validation), [`embed`] (embeddings: pooled hidden states, run in
//! passes between steps), `worker` (the loop), `scheduler` (batch planning and KV
//! bookkeeping), `output` (detokenizing, stop conditions, events), `stop`
//! (stop strings across tokens), [`warmup`] (every step shape run once at
//! start), [`lora`] (LoRA adapters: the registry and
//! the backend's slots), [`grammar`] (constrained decoding through
//! `llguidance`), [`speculate`] (speculative decoding's drafters and
//! settings), [`testing`] (a fake backend for tests).
//!
//! Costs: per step O(S + T + S * max_blocks) host work for S sequences and T
//! tokens, with reused buffers; see each module for its own.

pub mod embed;
mod engine;
pub mod grammar;
pub mod lora;
mod output;
mod scheduler;
pub mod speculate;
mod step_time;
mod stop;
pub mod testing;
pub mod types;
pub mod warmup;
mod worker;

pub use embed::{EmbedError, EmbedHandle, EmbedRequest, Embeddings, Pooling};
pub use engine::{Canceller, Completion, Engine, RequestHandle};
pub use grammar::{Constraint, GrammarError};
pub use lora::{LoraLimits, LoraRegistry, LoraRegistryError};
pub use speculate::{Drafter, SpecConfig, SpecMethod};
pub use types::{
    EngineConfig, EngineError, EngineStats, Event, FinishReason, Finished, GenerateRequest,
    LoraGauge, SubmitError, TokenEvent, Usage,
};
pub use warmup::{WarmupPlan, WarmupReport};
