//! contract: what the engine and every backend agree on, and nothing else.
//!
//! The model's validated configuration ([`config`]) and what its layers
//! compute ([`spec`]), the known model shapes
//! ([`presets`]), the step contract ([`backend`]: `StepBatch`, the `Backend`
//! trait, sampled tokens; [`step_builder`], the one builder of step batches;
//! [`lora`], LoRA adapters as backends apply them;
//! [`history`], the penalty history and the additive terms of the presence /
//! frequency penalties and `logit_bias`; [`mask`], the
//! allowed-token bitset of constrained decoding) and the sampling parameters with their
//! counter-based draw and per-choice seeds ([`sampling`]). No tensors, no CUDA, no I/O beyond
//! reading a `config.json`: the engine and the server build on this crate
//! alone, so a kernel change never recompiles them.

pub mod backend;
pub mod config;
pub mod history;
pub mod lora;
pub mod mask;
pub mod pipeline;
pub mod presets;
pub mod sampling;
pub mod spec;
pub mod step_builder;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use backend::{
    Backend, BackendError, Carried, KvShape, MAX_IN_FLIGHT, SampleRequest, SampledToken, StepBatch,
    check_idle, check_release, check_rows_call,
};
pub use config::{
    ConfigError, DefaultsSource, GenerationConfig, KvCacheDtype, KvScales, ModelConfig,
    SamplingDefaults,
};
pub use history::PenaltyHistory;
pub use lora::{LoraAdapter, LoraError, LoraTarget};
pub use mask::TokenMask;
pub use pipeline::{HostCompute, HostPipeline};
pub use sampling::{ParamError, SamplingOverrides, SamplingParams};
pub use spec::{Activation, ModelSpec};
pub use step_builder::{StepBuildError, StepBuilder};
