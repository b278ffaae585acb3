//! checkpoint: model files. Reading user-named files safely ([`files`]),
//! reading and checking safetensors into
//! [`weights::ModelWeights`] ([`loader`]), each projection a
//! [`projection::Projection`] in its stored format (BF16, FP8, ggml blocks,
//! group-wise int4 of AWQ / GPTQ / compressed-tensors checkpoints: [`int4`]), GGUF reading and import to the
//! Hugging Face layout ([`gguf`]), the model store with its pip and hub
//! downloads ([`store`]) and deterministic synthetic models ([`synth`]).
//!
//! Everything here runs once at start-up (or in tools); nothing here runs
//! per step. Errors name the file and the tensor or field that is wrong.

pub mod files;
pub mod fp8;
pub mod gguf;
pub mod int4;
pub mod loader;
pub mod lora;
pub mod progress;
pub mod projection;
pub mod quantized;
pub mod store;
pub mod synth;
pub mod weights;

pub use projection::{Format, FormatError, Projection};
pub use weights::{LayerWeights, ModelWeights, Tensor};
