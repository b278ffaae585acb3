//! GGUF block projections on the device: the [`Linear`] of every block
//! format the GEMVs read (`kernels::gemv::WeightFormat::Q8_0` ..
//! `Q6K`), and the packing of ggml's blocks into their device layout.
//!
//! Contract: [`format_of`] names the device format of a ggml type (`None`
//! for types the kernels do not read: those projections run from the
//! store's BF16 copy). [`GgufLinear::upload`] packs a fused projection
//! whose parts are all in one block format: each ggml block (layout of
//! `ggml-common.h`) becomes its chunks of codes and its side record, in the
//! order the format type in `kernels`' `cu/gemv_formats.cuh` states, row
//! after row, so stacked parts stay stacked. Nothing is requantised: the
//! GEMVs and [`Linear::bf16`] widen every weight to exactly the value the
//! CPU's dequantiser gives. A tensor of the wrong shape or byte count is
//! refused naming it.
//! Costs: packing is one pass over the blocks on the host; device memory
//! is the blocks' size plus the K formats' reordering padding (Q6_K 216
//! bytes a super-block for ggml's 210; Q5_K, Q4_K, Q8_0, Q4_x as ggml's).

use gpu::{DevSlice, DeviceBuffer, Gpu};
use half::bf16;
use kernels::consts::{GGUF_Q6_K_D_AT, GGUF_Q6_K_SCALES_AT};
use kernels::gemv::{GemvWeights, WeightFormat};

use checkpoint::gguf::GgmlType;
use checkpoint::quantized::QuantTensor;
use contract::backend::BackendError;

use super::errors::{dev_err, ge, ke};
use super::linear::{GemmIo, Linear};

/// The ggml types the CUDA backend keeps in their blocks.
pub const KEPT_GGML_TYPES: [GgmlType; 6] = [
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// The device format of ggml type `ty`, if the GEMVs read it.
pub(super) fn format_of(ty: GgmlType) -> Option<WeightFormat> {
    Some(match ty {
        GgmlType::Q8_0 => WeightFormat::Q8_0,
        GgmlType::Q4_0 => WeightFormat::Q4_0,
        GgmlType::Q4_1 => WeightFormat::Q4_1,
        GgmlType::Q4_K => WeightFormat::Q4K,
        GgmlType::Q5_K => WeightFormat::Q5K,
        GgmlType::Q6_K => WeightFormat::Q6K,
        _ => return None,
    })
}

/// One projection in a block format of [`WeightFormat::layout`] (a GGUF
/// type, or int4: `super::int4`), `[n, k]`: the chunks of codes and their
/// side records.
pub(super) struct GgufLinear {
    format: WeightFormat,
    q: DeviceBuffer<u8>,
    side: DeviceBuffer<u8>,
}

impl GgufLinear {
    /// Packs `parts` (all of block format `format`) stacked into one
    /// matrix, checking each against its expected shape.
    pub fn upload(
        gpu: &Gpu,
        format: WeightFormat,
        parts: &[(&QuantTensor, &[usize])],
    ) -> Result<Self, BackendError> {
        let (mut q, mut side) = (Vec::new(), Vec::new());
        for (t, shape) in parts {
            pack(t, shape, format, &mut q, &mut side)?;
        }
        let what = parts.first().map_or("", |(t, _)| t.name.as_str());
        Self::from_packed(gpu, format, what, &q, &side)
    }

    /// Uploads chunks `q` and records `side` already packed in `format`'s
    /// layout (`what` names the projection in an error).
    pub(super) fn from_packed(
        gpu: &Gpu,
        format: WeightFormat,
        what: &str,
        q: &[u8],
        side: &[u8],
    ) -> Result<Self, BackendError> {
        let err = |e| dev_err(&format!("uploading the {format:?} blocks of {what}"), e);
        Ok(GgufLinear {
            format,
            q: gpu.upload(q).map_err(err)?,
            side: gpu.upload(side).map_err(err)?,
        })
    }
}

impl Linear for GgufLinear {
    fn format(&self) -> WeightFormat {
        self.format
    }
    fn gemv(&self) -> GemvWeights<'_> {
        GemvWeights::Blocks {
            format: self.format,
            q: self.q.view(),
            side: self.side.view(),
        }
    }
    fn bf16<'a>(
        &'a self,
        io: &GemmIo<'a>,
        n: usize,
        k: usize,
    ) -> Result<DevSlice<'a, bf16>, BackendError> {
        let buf = io.widened.ok_or_else(|| {
            BackendError::Device(format!(
                "cuda: {:?} block weights without their widening buffer",
                self.format
            ))
        })?;
        let wide = buf.sub(0, n * k).map_err(ge("widened view"))?;
        io.k.gguf_dequant(self.format, self.q.view(), self.side.view(), wide, n, k)
            .map_err(ke("GGUF block widening"))?;
        Ok(wide)
    }
    fn blocks(&self) -> Option<(WeightFormat, DevSlice<'_, u8>, DevSlice<'_, u8>)> {
        Some((self.format, self.q.view(), self.side.view()))
    }
}

/// Appends tensor `t`'s blocks in the device layout of `format` to `q`
/// (chunks) and `side` (records), after checking its shape and size.
fn pack(
    t: &QuantTensor,
    shape: &[usize],
    format: WeightFormat,
    q: &mut Vec<u8>,
    side: &mut Vec<u8>,
) -> Result<(), BackendError> {
    let bad = |why: String| BackendError::Device(format!("cuda: GGUF tensor {}: {why}", t.name));
    if [t.rows, t.cols] != shape {
        return Err(bad(format!(
            "shape [{}, {}], expected {shape:?}",
            t.rows, t.cols
        )));
    }
    let (Some(l), Some(f)) = (format.layout(), format_of(t.ty)) else {
        return Err(bad(format!("type {} is not {format:?}", t.ty.name())));
    };
    if f != format || !t.cols.is_multiple_of(l.group) {
        return Err(bad(format!(
            "type {} in rows of {} columns does not fit {format:?} blocks of {}",
            t.ty.name(),
            t.cols,
            l.group
        )));
    }
    let block = t.ty.byte_size(l.group).map_err(bad)?;
    let want = t.rows * t.ty.byte_size(t.cols).map_err(bad)?;
    if t.data.len() != want {
        return Err(bad(format!(
            "{} bytes of blocks, expected {want}",
            t.data.len()
        )));
    }
    for b in t.data.chunks_exact(block) {
        pack_block(format, b, q, side);
    }
    Ok(())
}

/// One ggml block `b` of `format` (its byte count checked by the caller).
fn pack_block(format: WeightFormat, b: &[u8], q: &mut Vec<u8>, side: &mut Vec<u8>) {
    match format {
        // d, then the codes as the chunks take them
        WeightFormat::Q8_0 | WeightFormat::Q4_0 => {
            side.extend_from_slice(&b[..2]);
            q.extend_from_slice(&b[2..]);
        }
        WeightFormat::Q4_1 => {
            side.extend_from_slice(&b[..4]);
            q.extend_from_slice(&b[4..]);
        }
        WeightFormat::Q4K | WeightFormat::Q5K => pack_k4(format == WeightFormat::Q5K, b, q, side),
        WeightFormat::Q6K => pack_q6_k(b, q, side),
        WeightFormat::Bf16 | WeightFormat::Fp8Row | WeightFormat::Int4 => {}
    }
}

/// 32 codes (their low 4 bits) as one nibble chunk: byte `i` holds code
/// `i` low and code `i + 16` high.
fn nibble_chunk(codes: &[u8], q: &mut Vec<u8>) {
    q.extend((0..16).map(|i| (codes[i] & 0xF) | ((codes[i + 16] & 0xF) << 4)));
}

/// Q4_K (144 bytes: d, dmin, scales[12], qs[128]) and Q5_K (176: the same
/// with qh[32] before qs): the 16-byte head as it is, the codes in column
/// order (ggml's qs byte `32g + l` holds columns `64g + l` low and `64g +
/// 32 + l` high), Q5_K's fifth bits as one 32-bit word per 32 columns.
fn pack_k4(five: bool, b: &[u8], q: &mut Vec<u8>, side: &mut Vec<u8>) {
    let (qh, qs) = if five {
        (Some(&b[16..48]), &b[48..176])
    } else {
        (None, &b[16..144])
    };
    side.extend_from_slice(&b[..16]);
    let mut codes = [0u8; 256];
    for (g, qs) in qs.chunks_exact(32).enumerate() {
        for (l, &byte) in qs.iter().enumerate() {
            codes[64 * g + l] = byte & 0xF;
            codes[64 * g + 32 + l] = byte >> 4;
        }
    }
    for c in codes.chunks_exact(32) {
        nibble_chunk(c, q);
    }
    if let Some(qh) = qh {
        // column 64g + l's fifth bit is qh[l] bit 2g; column 64g + 32 + l's bit 2g + 1
        for j in 0..8 {
            let shift = 2 * (j / 2) + j % 2;
            let word = (0..32).fold(0u32, |w, i| w | (u32::from((qh[i] >> shift) & 1) << i));
            side.extend_from_slice(&word.to_le_bytes());
        }
    }
}

/// Q6_K (210 bytes: ql[128], qh[64], scales[16], d): the low 4 bits of the
/// codes as nibble chunks; the record holds per 32 columns 8 bytes of high
/// bits (byte `b`, bits `2i..2i+2`: column `b + 8i`), then the scales and d.
fn pack_q6_k(b: &[u8], q: &mut Vec<u8>, side: &mut Vec<u8>) {
    let (ql, qh) = (&b[..128], &b[128..192]);
    let mut codes = [0u8; 256];
    for n in 0..2 {
        let (ql, qh) = (&ql[64 * n..], &qh[32 * n..]);
        for l in 0..32 {
            let base = 128 * n + l;
            codes[base] = (ql[l] & 0xF) | ((qh[l] & 3) << 4);
            codes[base + 32] = (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4);
            codes[base + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
            codes[base + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
        }
    }
    let start = side.len();
    for c in codes.chunks_exact(32) {
        nibble_chunk(c, q);
        side.extend((0..8).map(|byte| {
            (0..4).fold(0u8, |acc, i| {
                acc | (((c[byte + 8 * i] >> 4) & 3) << (2 * i))
            })
        }));
    }
    debug_assert_eq!(side.len() - start, GGUF_Q6_K_SCALES_AT);
    side.extend_from_slice(&b[192..208]);
    debug_assert_eq!(side.len() - start, GGUF_Q6_K_D_AT);
    side.extend_from_slice(&b[208..210]);
    let layout_side = WeightFormat::Q6K.layout().map_or(0, |l| l.side);
    side.resize(start + layout_side, 0);
}

#[cfg(test)]
mod tests;
