//! model: the Llama layer pipeline, once per backend.
//!
//! [`cpu`] is the reference backend (f32 arithmetic over BF16 weights) and the
//! fallback; [`cuda`] runs the same step on an NVIDIA GPU with our kernels and
//! cuBLAS. Both implement [`contract::Backend`] over the same
//! [`contract::StepBatch`] and sample with the procedure of
//! [`ops::sampling`].
//! Configuration, weights and tokenizers come from the crates below
//! (`contract`, `checkpoint`); nothing above this crate sees CUDA.

pub mod cpu;
pub mod cuda;
#[cfg(any(test, feature = "testing"))]
pub mod exact;
pub mod gptq;
pub mod kv_calib;
