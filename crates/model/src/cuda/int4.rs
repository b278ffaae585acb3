//! Group-wise int4 projections (AWQ / GPTQ / compressed-tensors
//! checkpoints, `checkpoint::int4`) on the device: the [`Linear`] of
//! `kernels::gemv::WeightFormat::Int4`.
//!
//! Contract: [`Int4Linear::upload`] takes fused parts that are all int4
//! without a column order (`perm`; a part with one goes up widened to
//! bf16 by `linear_of`, since the fused GEMVs read the activations in
//! input order) and stacks their rows. The codes go up as stored (their
//! nibble blocks are the GEMV's nibble chunks); each 32-column chunk gets
//! an 8-byte side record, its group's f32 scale and its zero as an f32
//! (`FmtInt4` in `cu/gemv_formats.cuh`), so the GEMVs and
//! `Linear::bf16` widen every weight to `(q - zero) * scale`, the CPU's
//! value. A part whose fields do not make its layout is refused naming it.
//! Costs: the codes' size (0.5 byte a weight) plus 0.25 byte a weight of
//! records (a group's record repeated per chunk, the price of a
//! compile-time record stride).

use gpu::Gpu;
use kernels::consts::{GGUF_BLOCK, INT4_SIDE};
use kernels::gemv::WeightFormat;

use checkpoint::int4::Int4Tensor;
use contract::backend::BackendError;

use super::gguf::GgufLinear;

/// The upload of int4 projections: packed here, held and run as the
/// block formats are ([`GgufLinear`]).
pub(super) struct Int4Linear;

impl Int4Linear {
    /// Packs `parts` (each `[rows, k]`, no column order) stacked into one
    /// matrix.
    pub fn upload(gpu: &Gpu, parts: &[&Int4Tensor]) -> Result<GgufLinear, BackendError> {
        let (mut q, mut side) = (Vec::new(), Vec::new());
        for t in parts {
            pack(t, &mut q, &mut side).map_err(|why| {
                BackendError::Device(format!("cuda: int4 tensor {}: {why}", t.name))
            })?;
        }
        let what = parts.first().map_or("", |t| t.name.as_str());
        GgufLinear::from_packed(gpu, WeightFormat::Int4, what, &q, &side)
    }
}

/// Appends `t`'s codes to `q` and its chunks' records to `side`.
pub(super) fn pack(t: &Int4Tensor, q: &mut Vec<u8>, side: &mut Vec<u8>) -> Result<(), String> {
    if let Some(why) = t.layout_error() {
        return Err(why);
    }
    if t.perm.is_some() {
        return Err("has a column order, which the GEMVs do not read".into());
    }
    q.extend_from_slice(&t.data);
    let groups = t.groups();
    for r in 0..t.rows {
        for chunk in 0..t.cols / GGUF_BLOCK {
            let g = r * groups + chunk * GGUF_BLOCK / t.group;
            side.extend_from_slice(&t.scale[g].to_le_bytes());
            side.extend_from_slice(&f32::from(t.zero[g]).to_le_bytes());
        }
    }
    debug_assert_eq!(side.len() % INT4_SIDE, 0);
    Ok(())
}
