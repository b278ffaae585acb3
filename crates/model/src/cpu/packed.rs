//! The fast path's weight matrices: BF16, or quantised blocks multiplied as
//! they are ([`CpuWeights`] picks which).
//!
//! Contract: [`Matrix::matmul`] is `y = x @ W^T` over `[out, inp]` weights
//! in whichever form the matrix holds: BF16 through
//! [`cpu_kernels::matmul_bf16`] (f32 over exactly widened weights), or
//! ggml Q8_0 / Q4_1 blocks through [`cpu_kernels::quant::matmul_quant`]
//! (activations rounded to 8 bits per block of 32, integer dot products).
//! [`pack_group`] builds one fused matrix from several row-stacked tensors
//! (Q/K/V, gate/up): from the GGUF's blocks when every tensor of the group
//! was kept in one type, else from the BF16 tensors (quantised at load when
//! [`CpuWeights::Quantize`] asks for it). The BF16 buffers of packed
//! tensors are released, so memory is the packed size.
//!
//! Costs: at load, quantising a BF16 matrix is one pass over it; per call,
//! see the two kernels.

use checkpoint::gguf::GgmlType;
use checkpoint::quantized::{QuantTensor, QuantWeights};
use checkpoint::weights::Tensor;
use contract::backend::BackendError;
use cpu_kernels::Isa;
use cpu_kernels::matmul::{Scratch, matmul_bf16};
use cpu_kernels::quant::{QK, QuantActs, QuantType, matmul_quant, quantize_row};
use half::bf16;
use half::slice::HalfFloatSliceExt;

/// The GGUF block types the CPU multiplies directly (others are dequantised
/// to BF16 by the store's import and run as BF16).
pub const KEPT_GGML_TYPES: [GgmlType; 2] = [GgmlType::Q8_0, GgmlType::Q4_1];

/// How the fast path holds the projections and the LM head.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum CpuWeights {
    /// BF16 (f32 arithmetic over exactly widened weights).
    #[default]
    Bf16,
    /// Every projection quantised at load from BF16 to this type; the LM
    /// head to Q8_0 (a 4-bit head costs more accuracy than it saves).
    Quantize(QuantType),
    /// A GGUF's own blocks where the given set holds them (see
    /// [`checkpoint::quantized::load_quantized`]); BF16 elsewhere.
    Blocks(QuantWeights),
}

impl CpuWeights {
    /// Short name for the backend's name: `bf16`, `q8_0`, `gguf blocks`.
    pub fn describe(&self) -> String {
        match self {
            CpuWeights::Bf16 => "bf16".into(),
            CpuWeights::Quantize(qt) => qt.name().to_lowercase(),
            CpuWeights::Blocks(q) => {
                let mut types: Vec<String> = q.tensors().map(|t| t.ty.name()).collect();
                types.sort_unstable();
                types.dedup();
                if types.is_empty() {
                    "bf16".into()
                } else {
                    format!("gguf {}", types.join("+"))
                }
            }
        }
    }
}

/// The block type of a kept GGUF type.
fn quant_type(ty: GgmlType) -> Option<QuantType> {
    match ty {
        GgmlType::Q8_0 => Some(QuantType::Q8_0),
        GgmlType::Q4_1 => Some(QuantType::Q4_1),
        _ => None,
    }
}

/// One weight matrix `[out, inp]` of the fast path.
pub(super) enum Matrix {
    Bf16(Vec<bf16>),
    Quant { qt: QuantType, data: Vec<u8> },
}

impl Matrix {
    /// `y = x @ W^T`: `x` `[T, inp]`, `y` `[T, out]`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn matmul(
        &self,
        isa: Isa,
        x: &[f32],
        inp: usize,
        out: usize,
        y: &mut [f32],
        scratch: &mut Scratch,
        acts: &mut QuantActs,
    ) {
        match self {
            Matrix::Bf16(w) => matmul_bf16(isa, x, w, inp, out, y, scratch),
            Matrix::Quant { qt, data } => matmul_quant(isa, x, data, *qt, inp, out, y, acts),
        }
    }
}

/// Quantises the row-major `[rows, cols]` BF16 `data` to `qt` blocks.
fn quantize(
    qt: QuantType,
    data: &[bf16],
    cols: usize,
    name: &str,
) -> Result<Vec<u8>, BackendError> {
    if !cols.is_multiple_of(QK) {
        return Err(BackendError::Device(format!(
            "cpu: cannot quantise `{name}` to {}: its rows of {cols} values are not whole blocks of {QK}",
            qt.name()
        )));
    }
    let mut out = Vec::with_capacity(qt.matrix_bytes(data.len() / cols, cols));
    let mut row = vec![0f32; cols];
    for r in data.chunks_exact(cols) {
        r.convert_to_f32_slice(&mut row);
        quantize_row(qt, &row, &mut out);
    }
    Ok(out)
}

/// The fused matrix of `parts` (row-stacked, all `[_, cols]`): the kept
/// blocks when every part has them in one type, else BF16 (quantised to
/// `qt` when given). Releases the parts' BF16 buffers.
pub(super) fn pack_group(
    parts: &mut [&mut Tensor],
    kept: &[Option<&QuantTensor>],
    quantize_to: Option<QuantType>,
) -> Result<Matrix, BackendError> {
    let cols = parts[0].shape[1];
    let types: Vec<Option<QuantType>> = kept
        .iter()
        .map(|k| k.and_then(|t| quant_type(t.ty)))
        .collect();
    if !kept.is_empty() && types.iter().all(|t| t.is_some() && *t == types[0]) {
        let qt = types[0].expect("checked: every part has a type");
        let mut data = Vec::new();
        for k in kept.iter().flatten() {
            data.extend_from_slice(&k.data);
        }
        for p in parts.iter_mut() {
            p.data = Vec::new();
        }
        return Ok(Matrix::Quant { qt, data });
    }
    let mut bf = Vec::with_capacity(parts.iter().map(|t| t.data.len()).sum());
    for p in parts.iter_mut() {
        bf.extend_from_slice(&p.data);
        p.data = Vec::new();
    }
    match quantize_to {
        Some(qt) => Ok(Matrix::Quant {
            qt,
            data: quantize(qt, &bf, cols, &parts[0].name)?,
        }),
        None => Ok(Matrix::Bf16(bf)),
    }
}

/// The LM head as the fast path multiplies it: `None` keeps the BF16 head
/// of the weights (the embedding when tied, which the lookup still needs).
pub(super) fn pack_head(
    head: &Tensor,
    format: &CpuWeights,
) -> Result<Option<Matrix>, BackendError> {
    match format {
        CpuWeights::Bf16 => Ok(None),
        CpuWeights::Quantize(_) => Ok(Some(Matrix::Quant {
            qt: QuantType::Q8_0,
            data: quantize(QuantType::Q8_0, &head.data, head.shape[1], &head.name)?,
        })),
        CpuWeights::Blocks(q) => Ok(q.head.as_ref().and_then(|t| {
            quant_type(t.ty).map(|qt| Matrix::Quant {
                qt,
                data: t.data.clone(),
            })
        })),
    }
}
