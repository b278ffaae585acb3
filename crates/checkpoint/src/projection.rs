//! One projection matrix (a Linear layer's weight, or the LM head) in the
//! format it is stored in: the one host type every producer writes and
//! every consumer reads.
//!
//! Contract: a [`Projection`] is `[out, in]` row-major (Hugging Face's
//! layout and row order) in one of the stored formats: BF16 values
//! ([`Tensor`]), FP8 e4m3 bytes with one f32 scale per output row
//! ([`Fp8Tensor`]), ggml blocks ([`QuantTensor`]), or group-wise 4-bit
//! codes with a scale and zero per group of a row ([`Int4Tensor`], whose
//! stored columns may be a permutation of the input's: its module doc). Nothing is kept
//! beside a lossy format: a consumer that needs floats asks
//! [`Projection::dense`] (the BF16 values the CPU runs: BF16 as it is,
//! `bf16(decode(q) * scale)` for FP8, the blocks' values rounded to BF16)
//! or [`Projection::to_f32_rows`] (the stored values exactly), which
//! decode on demand; a consumer that cannot serve a format refuses it with
//! a [`FormatError`] naming the tensor, the format and the consumer.
//!
//! Adding a format is a variant here (its shape, bytes and decoding) and
//! one arm in each consumer's one match on [`Projection`].
//!
//! Costs: [`Projection::dense`] borrows a BF16 matrix and decodes any
//! other once per call (one pass, `out * in` BF16 values allocated);
//! the other accessors are O(1), but [`Projection::first_implausible`]
//! (one decode pass).

use std::borrow::Cow;

use half::bf16;
use rayon::prelude::*;

use crate::fp8::Fp8Tensor;
use crate::gguf::{GgmlType, dequantize};
use crate::int4::Int4Tensor;
use crate::quantized::QuantTensor;
use crate::weights::{Tensor, first_bad, implausible};

/// A projection in its stored format (see the module doc).
#[derive(Debug, Clone, PartialEq)]
pub enum Projection {
    /// BF16 values, as a checkpoint stores them.
    Bf16(Tensor),
    /// FP8 e4m3 with one scale per output row.
    Fp8(Fp8Tensor),
    /// ggml blocks, each row a whole number of blocks.
    Blocks(QuantTensor),
    /// 4-bit codes, a scale and zero per group of a row.
    Int4(Int4Tensor),
}

/// A projection's stored format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Bf16,
    /// e4m3 with one f32 scale per output row.
    Fp8Row,
    /// ggml blocks of this type.
    Ggml(GgmlType),
    /// 4-bit codes, a scale and zero per this many columns of a row.
    Int4 {
        group: usize,
    },
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Format::Bf16 => f.write_str("bf16"),
            Format::Fp8Row => f.write_str("fp8"),
            Format::Ggml(ty) => f.write_str(&ty.name().to_lowercase()),
            Format::Int4 { group } => write!(f, "int4 (groups of {group})"),
        }
    }
}

/// A projection a consumer cannot use in its format, or whose blocks do
/// not decode.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("tensor `{tensor}` is stored as {format}: {reason}")]
pub struct FormatError {
    pub tensor: String,
    pub format: Format,
    pub reason: String,
}

impl Projection {
    /// Hugging Face name, e.g. `model.layers.0.self_attn.q_proj.weight`.
    pub fn name(&self) -> &str {
        match self {
            Projection::Bf16(t) => &t.name,
            Projection::Fp8(t) => &t.name,
            Projection::Blocks(t) => &t.name,
            Projection::Int4(t) => &t.name,
        }
    }

    /// `[out, in]`.
    pub fn shape(&self) -> [usize; 2] {
        match self {
            Projection::Bf16(t) => [
                t.shape.first().copied().unwrap_or(0),
                t.shape.get(1).copied().unwrap_or(0),
            ],
            Projection::Fp8(t) => [
                t.shape.first().copied().unwrap_or(0),
                t.shape.get(1).copied().unwrap_or(0),
            ],
            Projection::Blocks(t) => [t.rows, t.cols],
            Projection::Int4(t) => [t.rows, t.cols],
        }
    }

    /// Number of weights, `out * in`.
    pub fn numel(&self) -> usize {
        let [n, k] = self.shape();
        n * k
    }

    /// The stored format.
    pub fn format(&self) -> Format {
        match self {
            Projection::Bf16(_) => Format::Bf16,
            Projection::Fp8(_) => Format::Fp8Row,
            Projection::Blocks(t) => Format::Ggml(t.ty),
            Projection::Int4(t) => Format::Int4 { group: t.group },
        }
    }

    /// Bytes held: the values, plus the FP8 row scales (the int4 groups'
    /// scales, zeros and column order).
    pub fn bytes(&self) -> usize {
        match self {
            Projection::Bf16(t) => t.data.len() * 2,
            Projection::Fp8(t) => t.data.len() + t.scale.len() * 4,
            Projection::Blocks(t) => t.data.len(),
            Projection::Int4(t) => {
                t.data.len() + t.scale.len() * 5 + t.perm.as_ref().map_or(0, |p| p.len() * 4)
            }
        }
    }

    /// Checks that the projection is `want` (`[out, in]`) and its stored
    /// values fill that shape (weights built in memory bypass the loader's
    /// checks); the error names the tensor.
    pub fn check(&self, want: [usize; 2]) -> Result<(), FormatError> {
        let [n, k] = want;
        let fills = match self {
            Projection::Bf16(t) => t.shape.len() == 2 && t.data.len() == n * k,
            Projection::Fp8(t) => t.shape.len() == 2 && t.data.len() == n * k && t.scale.len() == n,
            Projection::Blocks(t) => t.ty.byte_size(k).is_ok_and(|b| t.data.len() == b * n),
            Projection::Int4(t) => t.layout_error().is_none(),
        };
        if self.shape() != want || !fills {
            return Err(self.error(format!(
                "has shape {:?} ({} stored bytes), expected {want:?}",
                self.shape(),
                self.bytes()
            )));
        }
        Ok(())
    }

    /// The BF16 tensor, when the projection is stored in BF16.
    pub fn as_bf16(&self) -> Option<&Tensor> {
        match self {
            Projection::Bf16(t) => Some(t),
            _ => None,
        }
    }

    /// [`Self::as_bf16`], mutable.
    pub fn as_bf16_mut(&mut self) -> Option<&mut Tensor> {
        match self {
            Projection::Bf16(t) => Some(t),
            _ => None,
        }
    }

    /// The refusal of `consumer`, which cannot run this format.
    pub fn refuse(&self, consumer: &str) -> FormatError {
        self.error(format!("{consumer} does not run this format"))
    }

    fn error(&self, reason: String) -> FormatError {
        FormatError {
            tensor: self.name().to_string(),
            format: self.format(),
            reason,
        }
    }

    /// The values as BF16 (see the module doc): borrowed when stored in
    /// BF16, else decoded.
    pub fn dense(&self) -> Result<Cow<'_, Tensor>, FormatError> {
        let [n, k] = self.shape();
        if let Projection::Bf16(t) = self {
            return Ok(Cow::Borrowed(t));
        }
        let data = (self.to_f32_rows()?.into_par_iter())
            .map(bf16::from_f32)
            .collect();
        Ok(Cow::Owned(Tensor {
            name: self.name().to_string(),
            shape: vec![n, k],
            data,
        }))
    }

    /// The stored values exactly, as f32 `[out * in]` row-major.
    pub fn to_f32_rows(&self) -> Result<Vec<f32>, FormatError> {
        match self {
            Projection::Bf16(t) => Ok(t.to_f32()),
            Projection::Fp8(t) => {
                let k = self.shape()[1];
                if t.data.len() != t.scale.len() * k {
                    return Err(self.error(format!(
                        "{} bytes and {} row scales do not make rows of {k}",
                        t.data.len(),
                        t.scale.len()
                    )));
                }
                Ok(ops::fp8::dequantize_rows(&t.data, &t.scale, k))
            }
            Projection::Blocks(t) => {
                dequantize(t.ty, &t.data, t.rows * t.cols).map_err(|e| self.error(e))
            }
            Projection::Int4(t) => match t.layout_error() {
                Some(why) => Err(self.error(why)),
                None => Ok(t.to_f32_rows()),
            },
        }
    }

    /// The first weight that is NaN, infinite or beyond
    /// [`crate::weights::MAX_ABS_WEIGHT`] as stored (FP8 and blocks
    /// decoded): its flat index and value. Blocks that do not decode are
    /// reported at index 0 as NaN.
    pub fn first_implausible(&self) -> Option<(usize, f32)> {
        match self {
            Projection::Bf16(t) => first_bad(&t.data).map(|i| (i, t.data[i].to_f32())),
            _ => match self.to_f32_rows() {
                Ok(v) => v
                    .par_iter()
                    .position_first(|&x| implausible(x))
                    .map(|i| (i, v[i])),
                Err(_) => Some((0, f32::NAN)),
            },
        }
    }

    /// Drops the stored values (shape and name kept), for a consumer that
    /// moved them into its own layout; every accessor of values then sees
    /// an empty matrix.
    pub fn release(&mut self) {
        match self {
            Projection::Bf16(t) => t.data = Vec::new(),
            Projection::Fp8(t) => {
                t.data = Vec::new();
                t.scale = Vec::new();
            }
            Projection::Blocks(t) => t.data = Vec::new(),
            Projection::Int4(t) => {
                t.data = Vec::new();
                t.scale = Vec::new();
                t.zero = Vec::new();
                t.perm = None;
            }
        }
    }
}

#[cfg(test)]
mod tests;
