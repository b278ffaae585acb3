//! The runtime: opens a model and starts its engines, for the `lamina`
//! binary, tests and embedders alike.
//!
//! [`Runtime::open`] takes a model's name (a store id, a Hugging Face repo,
//! a directory, a GGUF file) and one [`RuntimeOptions`], and does every
//! step of start-up: resolve and read the model, plan memory (each
//! replica's KV pool, the draft model's share, LoRA adapters), open the
//! backends (CPU or CUDA, one per replica) and start an engine on each.
//! The options are plain structs with `Default`, one per concern; the CLI
//! maps its flags onto them and errors name a setting by its flag.
//! [`copy_bandwidth`] measures how fast the device a model would run on
//! copies memory (before it loads), for `lamina bench`'s floor.
//!
//! It sits below the binary and beside `server`: the server takes the
//! started engines and never depends on this crate (nor on `model` or
//! `checkpoint`, which this crate composes).
//!
//! Modules, in dependency order (each imports only those before it):
//! `options`, `error`, `memory`; `resolve`, `weights`, `kv_sizing`, `lora`;
//! `bandwidth`, `backend`; `draft`; `sizing`; `open`.

mod backend;
mod bandwidth;
mod draft;
mod error;
pub mod kv_sizing;
mod lora;
mod memory;
mod open;
mod options;
mod resolve;
mod sizing;
mod weights;

pub use bandwidth::copy_bandwidth;
pub use error::RuntimeError;
pub use lora::{AdapterLoader, adapter_loader};
pub use memory::tune_host_allocator;
pub use open::{BackendAlone, Runtime};
pub use options::{
    BLOCK_SIZE, CPU_KV_MEMORY_GIB, CPU_MAX_BATCH_TOKENS, CPU_MAX_STEP_MS, CUDA_MAX_BATCH_TOKENS,
    CpuOptions, CudaOptions, DEFAULT_GPU_MEMORY_UTILIZATION, DEFAULT_MAX_NUM_SEQS,
    DEFAULT_NUM_SPECULATIVE_TOKENS, Device, Drafting, EngineOptions, KvOptions, LoraOptions,
    OneShot, ReplicaPlan, RuntimeOptions, SpecOptions, WeightFormat, WeightOptions,
};
pub use resolve::{display_name, model_dir};
pub use sizing::Sizing;
