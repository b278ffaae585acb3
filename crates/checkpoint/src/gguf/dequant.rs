//! ggml tensor types and their dequantisation to f32.
//!
//! Contract: block layouts as in ggml (`ggml-common.h`), little-endian:
//! - Q8_0: 32 elements in 34 bytes: f16 scale `d`, 32 × i8 `q`; `x = d·q`.
//! - Q4_0: 32 elements in 18 bytes: f16 `d`, 16 bytes of nibbles; element `j`
//!   (j < 16) is the low nibble of byte `j`, element `j + 16` its high nibble;
//!   `x = d·(q − 8)`.
//! - Q4_1: 32 elements in 20 bytes: f16 `d`, f16 `m`, nibbles as Q4_0; `x = d·q + m`.
//!
//! Element counts must be whole blocks and byte lengths exact, else an error.
//!
//! Costs: one pass over the data, parallel over blocks (rayon), f32 output.

use half::{bf16, f16};
use rayon::prelude::*;

/// The ggml tensor types this importer knows by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q8_0,
    BF16,
    /// Any other type id (quantisations this reader does not dequantise).
    Other(u32),
}

const QK: usize = 32;

impl GgmlType {
    pub fn from_u32(v: u32) -> Self {
        match v {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            8 => GgmlType::Q8_0,
            30 => GgmlType::BF16,
            other => GgmlType::Other(other),
        }
    }

    /// `(elements per block, bytes per block)`.
    fn block(self) -> Result<(usize, usize), String> {
        Ok(match self {
            GgmlType::F32 => (1, 4),
            GgmlType::F16 | GgmlType::BF16 => (1, 2),
            GgmlType::Q8_0 => (QK, 34),
            GgmlType::Q4_0 => (QK, 18),
            GgmlType::Q4_1 => (QK, 20),
            GgmlType::Other(id) => {
                return Err(format!(
                    "ggml type {id} is not supported (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1)"
                ));
            }
        })
    }

    /// Bytes taken by `n` elements of this type.
    pub fn byte_size(self, n: usize) -> Result<usize, String> {
        let (per, bytes) = self.block()?;
        if !n.is_multiple_of(per) {
            return Err(format!(
                "{n} elements is not a whole number of {self:?} blocks of {per}"
            ));
        }
        (n / per)
            .checked_mul(bytes)
            .ok_or_else(|| format!("{n} elements overflow"))
    }
}

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f32()
}

/// Dequantises `n` elements of type `ty` stored in `bytes` to f32.
pub fn dequantize(ty: GgmlType, bytes: &[u8], n: usize) -> Result<Vec<f32>, String> {
    let size = ty.byte_size(n)?;
    if bytes.len() != size {
        return Err(format!(
            "{n} {ty:?} elements need {size} bytes, got {}",
            bytes.len()
        ));
    }
    let mut out = vec![0f32; n];
    match ty {
        GgmlType::F32 => out
            .par_iter_mut()
            .zip(bytes.par_chunks_exact(4))
            .for_each(|(o, c)| *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        GgmlType::F16 => out
            .par_iter_mut()
            .zip(bytes.par_chunks_exact(2))
            .for_each(|(o, c)| *o = f16_at(c, 0)),
        GgmlType::BF16 => out
            .par_iter_mut()
            .zip(bytes.par_chunks_exact(2))
            .for_each(|(o, c)| *o = bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32()),
        GgmlType::Q8_0 => out
            .par_chunks_exact_mut(QK)
            .zip(bytes.par_chunks_exact(34))
            .for_each(|(o, b)| {
                let d = f16_at(b, 0);
                for (x, &q) in o.iter_mut().zip(&b[2..]) {
                    *x = d * f32::from(q as i8);
                }
            }),
        GgmlType::Q4_0 => out
            .par_chunks_exact_mut(QK)
            .zip(bytes.par_chunks_exact(18))
            .for_each(|(o, b)| {
                let d = f16_at(b, 0);
                let (lo, hi) = o.split_at_mut(QK / 2);
                for (j, &q) in b[2..].iter().enumerate() {
                    lo[j] = d * (f32::from(q & 0x0F) - 8.0);
                    hi[j] = d * (f32::from(q >> 4) - 8.0);
                }
            }),
        GgmlType::Q4_1 => out
            .par_chunks_exact_mut(QK)
            .zip(bytes.par_chunks_exact(20))
            .for_each(|(o, b)| {
                let (d, m) = (f16_at(b, 0), f16_at(b, 2));
                let (lo, hi) = o.split_at_mut(QK / 2);
                for (j, &q) in b[4..].iter().enumerate() {
                    lo[j] = d * f32::from(q & 0x0F) + m;
                    hi[j] = d * f32::from(q >> 4) + m;
                }
            }),
        GgmlType::Other(id) => return Err(format!("ggml type {id} is not supported")),
    }
    Ok(out)
}
