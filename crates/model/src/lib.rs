//! The model layer: configuration, weights, tokenizer and chat template, the
//! Llama forward pass for each backend, and sampling.

pub mod backend;
pub mod config;
pub mod sampling;
pub mod weights;

pub use backend::{Backend, BackendError, KvShape, SampleRequest, SampledToken, StepBatch};
pub use config::{ConfigError, GenerationConfig, LlamaConfig};
pub use sampling::{ParamError, SamplingParams};
pub use weights::{LayerWeights, LlamaWeights, Tensor};
