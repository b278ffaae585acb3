//! ggml tensor types and their dequantisation to f32.
//!
//! Contract: block layouts as in ggml (`ggml-common.h`), little-endian:
//! - Q8_0: 32 elements in 34 bytes: f16 scale `d`, 32 × i8 `q`; `x = d·q`.
//! - Q4_0: 32 elements in 18 bytes: f16 `d`, 16 bytes of nibbles; element `j`
//!   (j < 16) is the low nibble of byte `j`, element `j + 16` its high nibble;
//!   `x = d·(q − 8)`.
//! - Q4_1: 32 elements in 20 bytes: f16 `d`, f16 `m`, nibbles as Q4_0; `x = d·q + m`.
//! - Q5_0 / Q5_1: as Q4_0 / Q4_1 with a fifth bit per element in a u32
//!   after the scales (bit `j` for element `j`); `x = d·(q − 16)` / `d·q + m`.
//! - Q2_K, Q3_K, Q4_K, Q5_K, Q6_K: 256-element super-blocks with 6- or
//!   4-bit sub-block scales (`dequant_k.rs` states each layout).
//!
//! Every other type id is known by its ggml name ([`GgmlType::name`]) so an
//! error can say which type a tensor has. Element counts must be whole
//! blocks and byte lengths exact, else an error.
//!
//! Costs: one pass over the data, parallel over blocks (rayon), f32 output.

use half::{bf16, f16};
use rayon::prelude::*;

use super::dequant_k;

/// The ggml tensor types this importer dequantises, and any other by id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    BF16,
    /// Any other type id (quantisations this reader does not dequantise).
    Other(u32),
}

const QK: usize = 32;

/// The names of ggml's type ids (`ggml.h`, `enum ggml_type`); `None` for
/// removed or unknown ids.
fn ggml_name(id: u32) -> Option<&'static str> {
    const NAMES: [&str; 40] = [
        "F32", "F16", "Q4_0", "Q4_1", "", "", "Q5_0", "Q5_1", "Q8_0", "Q8_1", "Q2_K", "Q3_K",
        "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S",
        "IQ2_S", "IQ4_XS", "I8", "I16", "I32", "I64", "F64", "IQ1_M", "BF16", "", "", "", "TQ1_0",
        "TQ2_0", "", "", "", "MXFP4",
    ];
    NAMES.get(id as usize).copied().filter(|n| !n.is_empty())
}

/// The types [`dequantize`] supports, for error messages.
pub const SUPPORTED: &str =
    "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K";

impl GgmlType {
    pub fn from_u32(v: u32) -> Self {
        match v {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            6 => GgmlType::Q5_0,
            7 => GgmlType::Q5_1,
            8 => GgmlType::Q8_0,
            10 => GgmlType::Q2_K,
            11 => GgmlType::Q3_K,
            12 => GgmlType::Q4_K,
            13 => GgmlType::Q5_K,
            14 => GgmlType::Q6_K,
            30 => GgmlType::BF16,
            other => GgmlType::Other(other),
        }
    }

    /// The type's ggml name (`Q4_K`), or `type 99` for an id ggml does not name.
    pub fn name(self) -> String {
        match self {
            GgmlType::Other(id) => match ggml_name(id) {
                Some(n) => n.to_string(),
                None => format!("type {id}"),
            },
            known => format!("{known:?}"),
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
            GgmlType::Q5_0 => (QK, 22),
            GgmlType::Q5_1 => (QK, 24),
            GgmlType::Q2_K => (dequant_k::QK_K, dequant_k::Q2_K_BYTES),
            GgmlType::Q3_K => (dequant_k::QK_K, dequant_k::Q3_K_BYTES),
            GgmlType::Q4_K => (dequant_k::QK_K, dequant_k::Q4_K_BYTES),
            GgmlType::Q5_K => (dequant_k::QK_K, dequant_k::Q5_K_BYTES),
            GgmlType::Q6_K => (dequant_k::QK_K, dequant_k::Q6_K_BYTES),
            GgmlType::Other(_) => {
                return Err(format!(
                    "ggml type {} is not supported (supported: {SUPPORTED}); re-quantise the model to one of those, e.g. with llama.cpp's `llama-quantize`",
                    self.name()
                ));
            }
        })
    }

    /// Bytes taken by `n` elements of this type.
    pub fn byte_size(self, n: usize) -> Result<usize, String> {
        let (per, bytes) = self.block()?;
        if !n.is_multiple_of(per) {
            return Err(format!(
                "{n} elements is not a whole number of {} blocks of {per}",
                self.name()
            ));
        }
        (n / per)
            .checked_mul(bytes)
            .ok_or_else(|| format!("{n} elements overflow"))
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

pub(super) fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f32()
}

/// Runs `f(block_bytes, block_out)` over the blocks of `bytes` in parallel.
pub(super) fn blocks(
    out: &mut [f32],
    bytes: &[u8],
    (per, size): (usize, usize),
    f: impl Fn(&[u8], &mut [f32]) + Sync,
) {
    out.par_chunks_exact_mut(per)
        .zip(bytes.par_chunks_exact(size))
        .for_each(|(o, b)| f(b, o));
}

/// Q5_0 (`with_min` false) and Q5_1 (true): scales, 32 high bits, 16 nibble bytes.
fn q5(b: &[u8], o: &mut [f32], with_min: bool) {
    let d = f16_at(b, 0);
    let (m, rest) = if with_min {
        (f16_at(b, 2), &b[4..])
    } else {
        (0.0, &b[2..])
    };
    let qh = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]);
    let offset = if with_min { 0.0 } else { 16.0 };
    let (lo, hi) = o.split_at_mut(QK / 2);
    for (j, &q) in rest[4..].iter().enumerate() {
        let h0 = ((qh >> j) << 4) & 0x10;
        let h1 = (qh >> (j + 12)) & 0x10;
        let x0 = f32::from((u32::from(q & 0x0F) | h0) as u8) - offset;
        let x1 = f32::from((u32::from(q >> 4) | h1) as u8) - offset;
        if with_min {
            lo[j] = x0 * d + m;
            hi[j] = x1 * d + m;
        } else {
            lo[j] = x0 * d;
            hi[j] = x1 * d;
        }
    }
}

/// Dequantises `n` elements of type `ty` stored in `bytes` to f32.
pub fn dequantize(ty: GgmlType, bytes: &[u8], n: usize) -> Result<Vec<f32>, String> {
    let size = ty.byte_size(n)?;
    if bytes.len() != size {
        return Err(format!(
            "{n} {ty} elements need {size} bytes, got {}",
            bytes.len()
        ));
    }
    let block = ty.block()?;
    let mut out = vec![0f32; n];
    match ty {
        GgmlType::F32 => blocks(&mut out, bytes, block, |c, o| {
            o[0] = f32::from_le_bytes([c[0], c[1], c[2], c[3]])
        }),
        GgmlType::F16 => blocks(&mut out, bytes, block, |c, o| o[0] = f16_at(c, 0)),
        GgmlType::BF16 => blocks(&mut out, bytes, block, |c, o| {
            o[0] = bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32()
        }),
        GgmlType::Q8_0 => blocks(&mut out, bytes, block, |b, o| {
            let d = f16_at(b, 0);
            for (x, &q) in o.iter_mut().zip(&b[2..]) {
                *x = d * f32::from(q as i8);
            }
        }),
        GgmlType::Q4_0 => blocks(&mut out, bytes, block, |b, o| {
            let d = f16_at(b, 0);
            let (lo, hi) = o.split_at_mut(QK / 2);
            for (j, &q) in b[2..].iter().enumerate() {
                lo[j] = d * (f32::from(q & 0x0F) - 8.0);
                hi[j] = d * (f32::from(q >> 4) - 8.0);
            }
        }),
        GgmlType::Q4_1 => blocks(&mut out, bytes, block, |b, o| {
            let (d, m) = (f16_at(b, 0), f16_at(b, 2));
            let (lo, hi) = o.split_at_mut(QK / 2);
            for (j, &q) in b[4..].iter().enumerate() {
                lo[j] = d * f32::from(q & 0x0F) + m;
                hi[j] = d * f32::from(q >> 4) + m;
            }
        }),
        GgmlType::Q5_0 => blocks(&mut out, bytes, block, |b, o| q5(b, o, false)),
        GgmlType::Q5_1 => blocks(&mut out, bytes, block, |b, o| q5(b, o, true)),
        GgmlType::Q2_K => blocks(&mut out, bytes, block, dequant_k::q2_k),
        GgmlType::Q3_K => blocks(&mut out, bytes, block, dequant_k::q3_k),
        GgmlType::Q4_K => blocks(&mut out, bytes, block, dequant_k::q4_k),
        GgmlType::Q5_K => blocks(&mut out, bytes, block, dequant_k::q5_k),
        GgmlType::Q6_K => blocks(&mut out, bytes, block, dequant_k::q6_k),
        GgmlType::Other(_) => return Err(format!("ggml type {ty} is not supported")),
    }
    Ok(out)
}
