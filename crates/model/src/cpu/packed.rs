//! The fast path's weight matrices: BF16, or quantised blocks multiplied as
//! they are ([`CpuWeights`] picks which).
//!
//! Contract: [`Matrix::matmul`] is `y = x @ W^T` over `[out, inp]` weights
//! in whichever form the matrix holds: BF16 through
//! [`cpu_kernels::matmul_bf16`] (f32 over exactly widened weights), or on
//! AVX-512 as `k`-pair panels packed at load through
//! [`cpu_kernels::pairs::matmul_pairs`] (the same arithmetic; prompt rows
//! through [`cpu_kernels::gemm_split`] where the processor has AVX-512 BF16
//! and VNNI, against an 8-bit copy made at load), or
//! ggml Q8_0 / Q4_1 / Q4_K / Q6_K blocks through [`cpu_kernels::quant::matmul_quant`]
//! (activations rounded to 16 bits per block of 32, integer dot products;
//! prompt rows through [`cpu_kernels::quant::gemm`] where AVX-512 VNNI
//! runs; there Q4_1 and Q8_0 matrices are repacked at load into the 16-row
//! panels of [`cpu_kernels::quant::x16`], whose row product is several
//! times faster than the block kernels'). [`by_kind`] runs a mixed step's prompt and generated rows apart.
//! [`Rows::Invariant`] (deterministic mode) runs every row on the products
//! whose per-row reduction order depends neither on the row count nor on
//! the thread count: the panels' [`matmul_pairs`] (one FMA chain per output
//! in `k` order, any token count), row-major BF16 on the register-tiled
//! regime at every token count ([`matmul_bf16_tiled`]: a token's
//! accumulators are its own, so `matmul_bf16`'s switch to a GEMM at 16
//! tokens never happens), blocks on [`matmul_quant`]'s row kernels
//! (a token tile's bits are a single token's) and 16-row panels on
//! [`matmul_x16`] (likewise).
//! [`pack_group`] builds one fused matrix from several row-stacked tensors
//! (Q/K/V, gate/up): from the GGUF's blocks when every tensor of the group
//! was kept in one type; as a [`Matrix::Stack`] of parts each in its own
//! form when the GGUF keeps them in different types or only some of them
//! (a Q4_K_M file's Q4_K Q/K and Q6_K V); else from the BF16 tensors
//! (quantised at load when [`CpuWeights::Quantize`] asks for it; Q4_K only where rows are whole
//! super-blocks of 256, Q4_1 elsewhere, as llama.cpp's quantiser falls
//! back). The BF16 buffers of packed tensors are released, so memory is the
//! packed size.
//!
//! Costs: at load, quantising a BF16 matrix is one pass over it (the split's
//! 8-bit copy too: one byte per weight); per call, see the kernels, plus a
//! gather and scatter of the rows of each kind when a step mixes them.

use checkpoint::gguf::GgmlType;
use checkpoint::quantized::{QuantTensor, QuantWeights};
use checkpoint::weights::Tensor;
use contract::backend::BackendError;
use cpu_kernels::Isa;
use cpu_kernels::gemm_split::{LoWeights, SplitActs, matmul_split};
use cpu_kernels::matmul::{Scratch, matmul_bf16, matmul_bf16_tiled};
use cpu_kernels::pairs::{PairPanels, matmul_pairs};
use cpu_kernels::quant::gemm::{matmul_panels_gemm, matmul_quant_gemm};
use cpu_kernels::quant::x16::{Panels16, matmul_x16};
use cpu_kernels::quant::{QuantActs, QuantType, matmul_quant, quantize_row};
use half::bf16;
use half::slice::HalfFloatSliceExt;

/// The GGUF block types the CPU multiplies directly (others are dequantised
/// to BF16 by the store's import and run as BF16).
pub const KEPT_GGML_TYPES: [GgmlType; 4] = [
    GgmlType::Q8_0,
    GgmlType::Q4_1,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
];

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
    /// The GGUF blocks kept, if any (a CUDA backend runs them too).
    pub fn blocks(&self) -> Option<&QuantWeights> {
        match self {
            CpuWeights::Blocks(q) => Some(q),
            _ => None,
        }
    }

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
        GgmlType::Q4_K => Some(QuantType::Q4_K),
        GgmlType::Q6_K => Some(QuantType::Q6_K),
        _ => None,
    }
}

/// One weight matrix `[out, inp]` of the fast path.
pub(super) enum Matrix {
    /// Row-major BF16 (processors without AVX-512).
    Bf16(Vec<bf16>),
    /// AVX-512: BF16 as `k`-pair panels, and their 8-bit copy for prompt
    /// rows when the processor runs [`cpu_kernels::gemm_split`].
    Panels {
        w: PairPanels,
        lo: Option<LoWeights>,
    },
    Quant {
        qt: QuantType,
        data: Vec<u8>,
    },
    /// Q4_1 / Q8_0 blocks in 16-row panels (AVX-512 VNNI): generated rows
    /// through [`matmul_x16`], prompt rows through [`matmul_panels_gemm`].
    Quant16(Panels16),
    /// Row-stacked parts in different forms, each multiplied on its own
    /// and its outputs copied into its columns: `(part, its rows)`.
    Stack(Vec<(Matrix, usize)>),
}

/// Which rows of a step's activations are prompt tokens (see
/// [`contract::backend::StepBatch::prompt_lens`]).
#[derive(Clone, Copy)]
pub(super) enum Rows<'a> {
    /// Every row generated (or prompt rows where no split runs).
    Generated,
    /// Every row a prompt token.
    Prompt,
    /// Both kinds: the row indices of each.
    Mixed {
        prompt: &'a [usize],
        generated: &'a [usize],
    },
    /// Every row, whatever its kind, on the products whose reduction order
    /// per row is fixed at every row count and thread count (deterministic
    /// mode): [`matmul_pairs`], the register-tiled BF16 regime
    /// ([`matmul_bf16_tiled`], never the GEMM) and [`matmul_quant`].
    Invariant,
}

/// The reused buffers of [`Matrix::matmul`].
#[derive(Default)]
pub(super) struct MatBufs {
    pub(super) scratch: Scratch,
    acts: QuantActs,
    split: SplitActs,
    gather: Gather,
    /// `[T, rows]` one [`Matrix::Stack`] part's products.
    part: Vec<f32>,
}

/// The rows of one kind of a mixed step, gathered.
#[derive(Default)]
struct Gather {
    /// `[rows, inp]`
    x: Vec<f32>,
    /// `[rows, out]` their products.
    y: Vec<f32>,
}

/// Runs `f(prompt, x, y)` on the step's rows by kind: on all of `x` and `y`
/// when the step holds one kind, else on each kind's rows gathered into
/// `g` and scattered back (a row's result never depends on the others).
#[allow(clippy::too_many_arguments)]
fn by_kind(
    x: &[f32],
    inp: usize,
    out: usize,
    y: &mut [f32],
    rows: Rows<'_>,
    g: &mut Gather,
    mut f: impl FnMut(bool, &[f32], &mut [f32]),
) {
    let (prompt, generated) = match rows {
        Rows::Generated | Rows::Invariant => return f(false, x, y),
        Rows::Prompt => return f(true, x, y),
        Rows::Mixed { prompt, generated } => (prompt, generated),
    };
    for (kind, idx) in [(true, prompt), (false, generated)] {
        let n = idx.len();
        g.x.clear();
        for &r in idx {
            g.x.extend_from_slice(&x[r * inp..][..inp]);
        }
        g.y.resize(n * out, 0.0);
        let yg = &mut g.y[..n * out];
        f(kind, &g.x, yg);
        for (&r, src) in idx.iter().zip(yg.chunks_exact(out)) {
            y[r * out..][..out].copy_from_slice(src);
        }
    }
}

impl Matrix {
    /// `y = x @ W^T`: `x` `[T, inp]`, `y` `[T, out]`. Prompt rows of a BF16
    /// matrix with an 8-bit copy run [`matmul_split`], every other row the
    /// f32 products; a row's result never depends on the other rows' kind.
    /// [`Rows::Invariant`]: every row on the row-count-invariant products.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn matmul(
        &self,
        isa: Isa,
        x: &[f32],
        inp: usize,
        out: usize,
        y: &mut [f32],
        rows: Rows<'_>,
        b: &mut MatBufs,
    ) {
        let (w, lo) = match self {
            Matrix::Stack(parts) => {
                let t = x.len() / inp;
                let mut o0 = 0;
                let mut tmp = std::mem::take(&mut b.part);
                for (m, n) in parts {
                    tmp.resize(t * n, 0.0);
                    m.matmul(isa, x, inp, *n, &mut tmp, rows, b);
                    for (yr, pr) in y.chunks_exact_mut(out).zip(tmp.chunks_exact(*n)) {
                        yr[o0..o0 + n].copy_from_slice(pr);
                    }
                    o0 += n;
                }
                b.part = tmp;
                return;
            }
            Matrix::Quant { qt, data } => {
                return quant_rows(isa, x, data, *qt, inp, out, y, rows, b);
            }
            Matrix::Quant16(p) => {
                let acts = &mut b.acts;
                return by_kind(x, inp, out, y, rows, &mut b.gather, |prompt, x, y| {
                    if prompt {
                        matmul_panels_gemm(x, p, y, acts)
                    } else {
                        matmul_x16(x, p, y, acts)
                    }
                });
            }
            Matrix::Bf16(w) if matches!(rows, Rows::Invariant) => {
                return matmul_bf16_tiled(isa, x, w, inp, out, y);
            }
            Matrix::Bf16(w) => return matmul_bf16(isa, x, w, inp, out, y, &mut b.scratch),
            Matrix::Panels { w, lo: None } => return matmul_pairs(x, w, y),
            Matrix::Panels { w, lo: Some(lo) } => (w, lo),
        };
        let split = &mut b.split;
        by_kind(x, inp, out, y, rows, &mut b.gather, |prompt, x, y| {
            if prompt {
                matmul_split(x, w, lo, y, split)
            } else {
                matmul_pairs(x, w, y)
            }
        });
    }

    /// Drops the 8-bit copy: every row then runs the f32 products.
    /// (Quantised matrices keep their prompt GEMM.)
    pub(super) fn drop_split(&mut self) {
        match self {
            Matrix::Panels { lo, .. } => *lo = None,
            Matrix::Stack(parts) => parts.iter_mut().for_each(|(m, _)| m.drop_split()),
            _ => {}
        }
    }

    /// The block type of a quantised matrix.
    pub(super) fn quant_type(&self) -> Option<QuantType> {
        match self {
            Matrix::Quant { qt, .. } => Some(*qt),
            Matrix::Quant16(p) => Some(p.quant_type()),
            _ => None,
        }
    }

    /// Whether prompt rows of some BF16 part run the split products.
    pub(super) fn has_split(&self) -> bool {
        match self {
            Matrix::Panels { lo, .. } => lo.is_some(),
            Matrix::Stack(parts) => parts.iter().any(|(m, _)| m.has_split()),
            _ => false,
        }
    }
}

/// [`Matrix::matmul`] over quantised blocks: prompt rows through
/// [`matmul_quant_gemm`] where the processor runs it (the same integer
/// sums in a GEMM's order), every other row through [`matmul_quant`].
#[allow(clippy::too_many_arguments)]
fn quant_rows(
    isa: Isa,
    x: &[f32],
    w: &[u8],
    qt: QuantType,
    inp: usize,
    out: usize,
    y: &mut [f32],
    rows: Rows<'_>,
    b: &mut MatBufs,
) {
    if matches!(rows, Rows::Invariant)
        || !(isa == Isa::Avx512 && cpu_kernels::quant::gemm::supported())
    {
        return matmul_quant(isa, x, w, qt, inp, out, y, &mut b.acts);
    }
    let acts = &mut b.acts;
    by_kind(x, inp, out, y, rows, &mut b.gather, |prompt, x, y| {
        if prompt {
            matmul_quant_gemm(x, w, qt, inp, out, y, acts)
        } else {
            matmul_quant(isa, x, w, qt, inp, out, y, acts)
        }
    });
}

/// `data` (`[_, cols]` in `qt` blocks) as a matrix: in 16-row panels where
/// `layout` is AVX-512's and the processor runs them (Q4_1 and Q8_0 with
/// whole panels), else as the blocks.
fn quant_matrix(qt: QuantType, data: Vec<u8>, cols: usize, layout: Layout) -> Matrix {
    let rows = data.len() / qt.matrix_bytes(1, cols);
    match layout
        .panels
        .then(|| Panels16::new(qt, &data, rows, cols))
        .flatten()
    {
        Some(p) => Matrix::Quant16(p),
        None => Matrix::Quant { qt, data },
    }
}

/// Quantises the row-major `[rows, cols]` BF16 `data` to `qt` blocks: a
/// [`Matrix::Quant`] (or [`Matrix::Quant16`], see [`quant_matrix`]). Q4_K rows that are not whole super-blocks are
/// quantised to Q4_1 instead (what llama.cpp's quantiser does for them,
/// with Q5_0), with a debug line naming the tensor (the backend logs how
/// many).
fn quantize(
    qt: QuantType,
    data: &[bf16],
    cols: usize,
    name: &str,
    layout: Layout,
) -> Result<Matrix, BackendError> {
    let qt = if qt == QuantType::Q4_K && !cols.is_multiple_of(qt.block_len()) {
        tracing::debug!(
            "cpu: `{name}` has rows of {cols} values, not whole Q4_K super-blocks of {}: quantised to Q4_1",
            qt.block_len()
        );
        QuantType::Q4_1
    } else {
        qt
    };
    if !cols.is_multiple_of(qt.block_len()) {
        return Err(BackendError::Device(format!(
            "cpu: cannot quantise `{name}` to {}: its rows of {cols} values are not whole blocks of {}",
            qt.name(),
            qt.block_len()
        )));
    }
    let mut out = Vec::with_capacity(qt.matrix_bytes(data.len() / cols, cols));
    let mut row = vec![0f32; cols];
    for r in data.chunks_exact(cols) {
        r.convert_to_f32_slice(&mut row);
        quantize_row(qt, &row, &mut out);
    }
    Ok(quant_matrix(qt, out, cols, layout))
}

/// How the fast path lays out its BF16 matrices.
#[derive(Debug, Clone, Copy)]
pub(super) struct Layout {
    /// `k`-pair panels (AVX-512) rather than rows.
    pub(super) panels: bool,
    /// With the 8-bit copy of [`cpu_kernels::gemm_split`] (needs `panels`).
    pub(super) split: bool,
}

/// The fused matrix of `parts` (row-stacked, all `[_, cols]`): the kept
/// blocks when every part has them in one type, a [`Matrix::Stack`] of the
/// runs of parts in one form when some are kept but not all in one type,
/// else BF16 (quantised to `qt` when given) in `layout`. Releases the
/// parts' BF16 buffers.
pub(super) fn pack_group(
    parts: &mut [&mut Tensor],
    kept: &[Option<&QuantTensor>],
    quantize_to: Option<QuantType>,
    layout: Layout,
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
        return Ok(quant_matrix(qt, data, cols, layout));
    }
    if parts.len() > 1 && types.iter().any(Option::is_some) {
        // each run of parts in one form is one matrix (Q4_K Q and K
        // together beside a Q6_K V)
        let mut stack = Vec::new();
        let mut i = 0;
        for run in types.chunk_by(|a, b| a == b) {
            let n = run.len();
            let rows = parts[i..i + n].iter().map(|p| p.shape[0]).sum();
            let m = pack_group(&mut parts[i..i + n], &kept[i..i + n], quantize_to, layout)?;
            stack.push((m, rows));
            i += n;
        }
        return Ok(Matrix::Stack(stack));
    }
    let mut bf = Vec::with_capacity(parts.iter().map(|t| t.data.len()).sum());
    for p in parts.iter_mut() {
        bf.extend_from_slice(&p.data);
        p.data = Vec::new();
    }
    match quantize_to {
        Some(qt) => quantize(qt, &bf, cols, &parts[0].name, layout),
        None if layout.panels => {
            let rows = bf.len() / cols;
            let lo = layout.split.then(|| LoWeights::new(&bf, cols, rows));
            let w = PairPanels::new(&bf, cols, rows);
            Ok(Matrix::Panels { w, lo })
        }
        None => Ok(Matrix::Bf16(bf)),
    }
}

/// The LM head as the fast path multiplies it: quantised (Q8_0 when the
/// layers are, or the GGUF's own blocks), else BF16 panels on AVX-512;
/// `None` keeps the weights' row-major BF16 head. The caller may then
/// release the head tensor's BF16 buffer (a tied embedding's lookup reads
/// the panels' rows, [`PairPanels::row_f32`]).
pub(super) fn pack_head(
    head: &Tensor,
    format: &CpuWeights,
    layout: Layout,
) -> Result<Option<Matrix>, BackendError> {
    let cols = head.shape[1];
    let packed = match format {
        CpuWeights::Bf16 => None,
        CpuWeights::Quantize(_) => Some(quantize(
            QuantType::Q8_0,
            &head.data,
            cols,
            &head.name,
            layout,
        )?),
        CpuWeights::Blocks(q) => q.head.as_ref().and_then(|t| {
            quant_type(t.ty).map(|qt| quant_matrix(qt, t.data.clone(), cols, layout))
        }),
    };
    // a BF16 head in panels: the layers' f32 products, half again the
    // row-major tiles' bandwidth on one token
    Ok(packed.or_else(|| {
        layout.panels.then(|| Matrix::Panels {
            w: PairPanels::new(&head.data, cols, head.shape[0]),
            lo: None,
        })
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bf16_rows(rows: usize, cols: usize, seed: u64) -> Vec<bf16> {
        (0..rows * cols)
            .map(|i| {
                let u = checkpoint::synth::splitmix64(i as u64 ^ seed) >> 40;
                bf16::from_f32(u as f32 / (1u64 << 24) as f32 - 0.5)
            })
            .collect()
    }

    /// A stack of parts gives the fused matrix's bits (each output is its
    /// weight row's product alone), for prompt, generated and mixed rows:
    /// on this processor's layout with parts of whole 16-row panels, and
    /// on the row-major layout with ragged parts.
    #[test]
    fn a_stack_of_parts_equals_the_fused_matrix() {
        let isa = Isa::best();
        let panels = isa == Isa::Avx512;
        let best = Layout {
            panels,
            split: panels && cpu_kernels::isa::split_products(),
        };
        let rows_major = Layout {
            panels: false,
            split: false,
        };
        for (layout, a, b) in [(best, 48, 16), (rows_major, 40, 24)] {
            stack_equals_fused(isa, layout, a, b);
        }
    }

    fn stack_equals_fused(isa: Isa, layout: Layout, a: usize, b: usize) {
        let (cols, t) = (64, 7);
        let (wa, wb) = (bf16_rows(a, cols, 1), bf16_rows(b, cols, 2));
        let fused_w: Vec<bf16> = wa.iter().chain(&wb).copied().collect();
        let x: Vec<f32> = (0..t * cols).map(|i| (i as f32 * 0.37).sin()).collect();
        let pack = |w: &[bf16], qt: Option<QuantType>| {
            let mut t = Tensor {
                name: "w".into(),
                shape: vec![w.len() / cols, cols],
                data: w.to_vec(),
            };
            pack_group(&mut [&mut t], &[None], qt, layout).unwrap()
        };
        for qt in [None, Some(QuantType::Q4_1), Some(QuantType::Q8_0)] {
            let fused = pack(&fused_w, qt);
            let stack = Matrix::Stack(vec![(pack(&wa, qt), a), (pack(&wb, qt), b)]);
            let (prompt, generated) = ([0, 3, 4], [1, 2, 5, 6]);
            for rows in [
                Rows::Generated,
                Rows::Prompt,
                Rows::Mixed {
                    prompt: &prompt,
                    generated: &generated,
                },
            ] {
                let run = |m: &Matrix| {
                    let mut y = vec![f32::NAN; t * (a + b)];
                    m.matmul(isa, &x, cols, a + b, &mut y, rows, &mut MatBufs::default());
                    y
                };
                assert_eq!(run(&stack), run(&fused), "{qt:?} {a}+{b}");
            }
        }
    }
}
