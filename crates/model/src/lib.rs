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

/// The bytes of the weights a backend holds, as it holds them (BF16, FP8
/// with its row scales, ggml blocks, int4 codes with their groups'
/// records; the CPU's f32 norm gains), by the part of a step that reads
/// them. What a decode step reads of these is the bench's to define
/// (`lamina bench`'s b1 floor).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WeightBytes {
    /// Every layer's projections, norm gains and biases.
    pub layers: usize,
    /// The final norm's gain.
    pub final_norm: usize,
    /// The token embedding table (0 where its buffer was released into
    /// the LM head's).
    pub embed: usize,
    /// The LM head's own matrix; `None` when the head reads the embedding
    /// table (tied).
    pub lm_head: Option<usize>,
}
