//! The model layer: configuration, weights, tokenizer and chat template, the
//! Llama forward pass for each backend, and sampling.

pub mod backend;
pub mod bpe_from_gguf;
pub mod chat;
pub mod config;
pub mod cpu;
pub mod cuda;
pub mod detok;
pub mod gguf;
pub mod loader;
pub mod sampler;
pub mod sampling;
pub mod store;
pub mod synth;
pub mod tokenizer;
pub mod weights;

pub use backend::{Backend, BackendError, KvShape, SampleRequest, SampledToken, StepBatch};
pub use config::{ConfigError, GenerationConfig, LlamaConfig};
pub use sampling::{ParamError, SamplingParams};
pub use weights::{LayerWeights, LlamaWeights, Tensor};
