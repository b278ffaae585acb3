//! Error-compensating (GPTQ) quantisation to FP8 or to GPTQ's symmetric
//! 4-bit grid: each projection's weights rounded column by column, the
//! rounding error of each column spread over the columns not yet rounded
//! so that the projection's output on real inputs moves as little as it
//! can (Frantar et al., "GPTQ: Accurate Post-Training Quantization for
//! Generative Pre-trained Transformers", 2022).
//!
//! Contract: [`quantize_model`] runs the model (BF16 weights, f32
//! arithmetic, the CPU backend's operations) over
//! calibration tokens cut into windows, one layer at a time over all
//! windows, and quantises the layer's projections in the order the
//! forward pass uses them: Q/K/V against the Hessian `H = sum x x^T` of
//! their shared input (the normed residual), then O against the attention
//! output computed with the quantised Q/K/V, gate/up against the second
//! normed residual, down against `silu(gate) * up` of the quantised
//! gate/up; the next layer's input is the quantised layer's output (GPTQ's
//! sequential, "true sequential" mode). Each matrix is solved by
//! [`solve::solve`] (dampening, dead inputs, block updates and optional
//! activation order as GPTQ does) on the grid of [`GptqOptions::target`]:
//! FP8 at the scales of [`solve::scales`], giving the model with
//! [`checkpoint::Projection::Fp8`] projections in any layout the converter
//! writes; or 4 bits, a scale per group of a row found as the solver
//! reaches the group ([`grid::Int4Grid`]), giving
//! [`checkpoint::Projection::Int4`] projections in the GPTQ layout's form
//! (zero 8, f16 scales, no column order) that
//! `checkpoint::int4::write` writes as they are. The next layer's
//! inputs come from the quantised projections as the CPU backend runs
//! them. Bad input (no tokens, a token outside the vocabulary, a window
//! beyond the model's context, a model already FP8, a 4-bit group that does
//! not divide a projection's input width or 4 bits with activation order,
//! weights that do not
//! match the config (the CPU backend's check), calibration activations that overflow, a Hessian
//! that dampening cannot make positive definite) is a [`GptqError`]
//! naming the cause, never a panic.
//!
//! Costs, per layer of `N` calibration tokens: the forward pass's
//! products (`2 N (hidden (q + 2 kv + 2 inter) + q hidden + inter
//! hidden)` flops) and attention, four Hessians (about `N k^2 / 2`
//! multiply-adds each, `k` the input width) each factored once (`k^3 / 3`),
//! seven solves (`n k^2` each, `n` the output width), all f64 but the
//! forward pass; memory: the activations of all `N` tokens, `N` times
//! `hidden + q + 2 kv + 2 inter` f32, and the f64 copies of one matrix
//! and its Hessian at a time. SmolLM2-135M over 2,048 tokens: 20 s on two
//! cores, 0.6 GB.

pub(crate) mod attention;
pub mod grid;
mod hessian;
mod linalg;
pub(crate) mod sequential;
pub mod solve;

#[cfg(test)]
mod int4_tests;
#[cfg(test)]
mod tests;

pub use hessian::Hessian;
pub use sequential::quantize_model;
pub use solve::{Factor, ScaleRule};

/// How [`quantize_model`] runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GptqOptions {
    /// Added to the Hessian's diagonal, as a share of its mean (GPTQ's
    /// `percdamp`). GPTQ's 0.01 fits a few thousand calibration tokens
    /// too closely: on SmolLM2 with 2,048 tokens of prose it cost more
    /// perplexity than rounding to nearest on other text (technical
    /// Markdown), where 0.03 to 1 all did better; 0.1 is the default.
    pub damp: f64,
    /// Columns whose updates are batched (GPTQ's `blocksize`, 128).
    pub block: usize,
    /// Columns quantised in order of decreasing Hessian diagonal (GPTQ's
    /// `act_order`) instead of in order.
    pub act_order: bool,
    /// What the projections become.
    pub target: Target,
    /// Tokens per calibration window (each window a sequence from position 0).
    pub window: usize,
}

impl Default for GptqOptions {
    fn default() -> Self {
        GptqOptions {
            damp: 0.1,
            block: 128,
            act_order: false,
            target: Target::Fp8(ScaleRule {
                per_channel: true,
                bf16: true,
            }),
            window: 512,
        }
    }
}

/// The format [`quantize_model`] quantises to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// FP8 e4m3 ([`checkpoint::Projection::Fp8`]) at the scales of the rule.
    Fp8(ScaleRule),
    /// GPTQ's symmetric 4-bit grid ([`checkpoint::Projection::Int4`], zero
    /// 8, f16 scales), `group` columns a scale (a multiple of
    /// [`checkpoint::int4::BLOCK`] dividing every projection's input
    /// width): runs of input columns, or with `act_order` of the solver's
    /// order, the tensor then carrying that order (GPTQ's `desc_act`).
    Int4 { group: usize },
}

/// Why [`quantize_model`] refused or failed.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum GptqError {
    #[error("no calibration tokens")]
    NoTokens,
    #[error("calibration token {id} (at {at}) is outside the model's vocabulary of {vocab}")]
    Token { at: usize, id: u32, vocab: usize },
    #[error("{0}")]
    Options(String),
    #[error("the model's projections are FP8 already; quantise its BF16 checkpoint instead")]
    AlreadyFp8,
    #[error("{0}")]
    Weights(String),
    #[error(transparent)]
    Format(#[from] checkpoint::FormatError),
    #[error(
        "the inputs of `{tensor}` on the calibration text are not finite (the model overflows on it)"
    )]
    NonFinite { tensor: String },
    #[error(
        "the outputs of `{tensor}` on the calibration text are not finite (the model overflows on it)"
    )]
    NonFiniteOutput { tensor: String },
    #[error(
        "`{tensor}`: the Hessian of its inputs is not positive definite at column {column} even with dampening {damp}; try a larger dampening"
    )]
    NotPositiveDefinite {
        tensor: String,
        column: usize,
        damp: f64,
    },
}
