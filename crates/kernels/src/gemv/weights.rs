//! A projection's weights as the GEMVs read them ([`GemvWeights`]): bf16,
//! FP8 rows with their scales, or a GGUF block format's chunks and side
//! records, each checked against its shape before a launch.

use gpu::DevSlice;
use half::bf16;

use super::{WeightFormat, aligned};
use crate::{KernelError, need};

/// A projection's weights, `[rows, k]` (rows = `n`, or `2n` for
/// [`GemvOp::NormGated`]).
#[derive(Debug, Clone, Copy)]
pub enum GemvWeights<'a> {
    /// bf16 values.
    Bf16(DevSlice<'a, bf16>),
    /// e4m3 bytes with one f32 scale per row: `w[r, c] = decode(q[r, c]) * scale[r]`.
    Fp8 {
        q: DevSlice<'a, u8>,      // [rows, k]
        scale: DevSlice<'a, f32>, // [rows]
    },
    /// A GGUF block format in its device layout ([`WeightFormat::layout`]).
    Blocks {
        format: WeightFormat,
        q: DevSlice<'a, u8>,    // [rows, layout.row_bytes(k)]
        side: DevSlice<'a, u8>, // [rows, layout.side_bytes(k)]
    },
}

impl<'a> From<DevSlice<'a, bf16>> for GemvWeights<'a> {
    fn from(w: DevSlice<'a, bf16>) -> Self {
        GemvWeights::Bf16(w)
    }
}

impl GemvWeights<'_> {
    /// The weights' format.
    pub fn format(&self) -> WeightFormat {
        match self {
            GemvWeights::Bf16(_) => WeightFormat::Bf16,
            GemvWeights::Fp8 { .. } => WeightFormat::Fp8Row,
            GemvWeights::Blocks { format, .. } => *format,
        }
    }

    /// Bytes a product reads of the weights: the values, plus the FP8 row
    /// scales or the blocks' side records.
    pub fn bytes(&self) -> usize {
        match self {
            GemvWeights::Bf16(w) => w.num_bytes(),
            GemvWeights::Fp8 { q, scale } => q.num_bytes() + scale.num_bytes(),
            GemvWeights::Blocks { q, side, .. } => q.num_bytes() + side.num_bytes(),
        }
    }

    /// Checks the weights hold `rows` rows of `k`; returns the weight and
    /// side pointers (0 for bf16) and the format.
    pub(super) fn check(
        &self,
        kernel: &'static str,
        rows: usize,
        k: usize,
    ) -> Result<(u64, u64, WeightFormat), KernelError> {
        let format = self.format();
        if !width_fits(k, format) {
            return Err(KernelError::Unsupported {
                kernel,
                reason: format!(
                    "k = {k}: {format:?} weights need k a multiple of {}",
                    format.k_multiple()
                ),
            });
        }
        match self {
            GemvWeights::Bf16(w) => {
                need(kernel, "w", w, rows * k)?;
                aligned(kernel, "w", w.ptr())?;
                Ok((w.ptr(), 0, format))
            }
            GemvWeights::Fp8 { q, scale } => {
                need(kernel, "w (fp8)", q, rows * k)?;
                need(kernel, "w scale", scale, rows)?;
                aligned(kernel, "w (fp8)", q.ptr())?;
                Ok((q.ptr(), scale.ptr(), format))
            }
            GemvWeights::Blocks { q, side, .. } => {
                let l = format.layout().ok_or_else(|| KernelError::Unsupported {
                    kernel,
                    reason: format!("{format:?} is not a block format"),
                })?;
                need(kernel, "w (blocks)", q, rows * l.row_bytes(k))?;
                need(kernel, "w side records", side, rows * l.side_bytes(k))?;
                aligned(kernel, "w (blocks)", q.ptr())?;
                aligned(kernel, "w side records", side.ptr())?;
                Ok((q.ptr(), side.ptr(), format))
            }
        }
    }
}

/// Whether the GEMVs take inputs `k` wide in weight format `f`: whole
/// 16-byte chunks of a row ([`WeightFormat::k_multiple`]).
pub fn width_fits(k: usize, f: WeightFormat) -> bool {
    k.is_multiple_of(f.k_multiple())
}
