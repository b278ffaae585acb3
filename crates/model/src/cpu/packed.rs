//! The fast path's weight matrices: BF16, or quantised blocks multiplied as
//! they are (the weights' own blocks, or BF16 quantised at load when
//! [`CpuWeights`] asks).
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
//! times faster than the block kernels'), or group-wise int4 (AWQ / GPTQ /
//! compressed-tensors checkpoints, [`Matrix::Int4`]) through
//! [`cpu_kernels::int4::matmul_int4`] (the dequantised weights' f32
//! product: a row-count-invariant dot per token below 16 tokens, a GEMM
//! from 16 on, so prompt rows run apart). [`by_kind`] runs a mixed step's prompt and generated rows apart.
//! [`Rows::Invariant`] (deterministic mode) runs every row on the products
//! whose per-row reduction order depends neither on the row count nor on
//! the thread count: the panels' [`matmul_pairs`] (one FMA chain per output
//! in `k` order, any token count), row-major BF16 on the register-tiled
//! regime at every token count ([`matmul_bf16_tiled`]: a token's
//! accumulators are its own, so `matmul_bf16`'s switch to a GEMM at 16
//! tokens never happens), blocks on [`matmul_quant`]'s row kernels
//! (a token tile's bits are a single token's) and 16-row panels on
//! [`matmul_x16`] (likewise).
//! [`pack_group`] builds one fused matrix from several row-stacked
//! projections (Q/K/V, gate/up), each entering through [`Part::of`], the
//! fast path's one match on the stored formats: ggml blocks of a type the
//! kernels multiply ([`KEPT_GGML_TYPES`]) as they are, every other format
//! as its BF16 values (FP8 widened to `bf16(decode(q) * scale)`, other
//! block types decoded), int4 as it is. Int4 parts sharing one group and
//! one column order make one int4 matrix (their rows stacked); int4
//! beside another form or order is decoded to BF16. From the blocks when every part has them in one
//! type; as a [`Matrix::Stack`] of parts each in its own form when the
//! parts differ (a Q4_K_M file's Q4_K Q/K and Q6_K V); else from the BF16
//! values (quantised at load when [`CpuWeights::Quantize`] asks for it;
//! Q4_K only where rows are whole super-blocks of 256, Q4_1 elsewhere, as
//! llama.cpp's quantiser falls back). The projections' stored buffers are
//! released, so memory is the packed size.
//!
//! Costs: at load, quantising a BF16 matrix is one pass over it (the split's
//! 8-bit copy too: one byte per weight); per call, see the kernels, plus a
//! gather and scatter of the rows of each kind when a step mixes them.

use checkpoint::gguf::GgmlType;
use checkpoint::int4::Int4Tensor;
use checkpoint::projection::Projection;
use checkpoint::weights::ModelWeights;
use contract::backend::BackendError;
use cpu_kernels::Isa;
use cpu_kernels::gemm_split::{LoWeights, SplitActs, matmul_split};
use cpu_kernels::int4::{Int4Matrix, Int4Scratch, matmul_int4};
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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CpuWeights {
    /// As the weights store them: BF16 as it is (f32 arithmetic over
    /// exactly widened weights), FP8 widened to its BF16 values, ggml
    /// blocks multiplied as they are ([`KEPT_GGML_TYPES`]).
    #[default]
    Stored,
    /// Every BF16 projection quantised at load to this type; the LM head
    /// to Q8_0 (a 4-bit head costs more accuracy than it saves).
    Quantize(QuantType),
}

impl CpuWeights {
    /// Short name for the backend's name: `bf16`, `bf16 from fp8`, `q8_0`,
    /// `gguf Q4_K+Q6_K`: how the fast path holds `w`'s projections.
    pub fn describe(self, w: &ModelWeights) -> String {
        if let CpuWeights::Quantize(qt) = self {
            return qt.name().to_lowercase();
        }
        let formats = w.formats();
        let mut blocks: Vec<String> = (formats.iter())
            .filter_map(|f| match f {
                checkpoint::Format::Ggml(ty) => Some(ty.name()),
                _ => None,
            })
            .collect();
        blocks.sort_unstable();
        let fp8 = formats.contains(&checkpoint::Format::Fp8Row);
        let int4 = formats.iter().find_map(|f| match f {
            checkpoint::Format::Int4 { group } => Some(*group),
            _ => None,
        });
        if let Some(group) = int4 {
            return format!("int4 g{group}");
        }
        match (blocks.is_empty(), fp8) {
            (false, _) => format!("gguf {}", blocks.join("+")),
            (true, true) => "bf16 from fp8".into(),
            (true, false) => "bf16".into(),
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
    /// Group-wise 4-bit codes (rows of fused parts stacked).
    Int4(Int4Tensor),
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
    int4: Int4Scratch,
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
            Matrix::Int4(t) => {
                let (w, s) = (int4_matrix(t), &mut b.int4);
                // below the GEMM's token count a row's bits are its own
                if matches!(rows, Rows::Invariant) {
                    for (xr, yr) in x.chunks_exact(inp).zip(y.chunks_exact_mut(out)) {
                        matmul_int4(isa, xr, &w, yr, s);
                    }
                    return;
                }
                return by_kind(x, inp, out, y, rows, &mut b.gather, |_, x, y| {
                    matmul_int4(isa, x, &w, y, s)
                });
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

    /// Bytes a generated row's product reads: the weights with their
    /// scales and records (not the prompt rows' 8-bit copy).
    pub(super) fn bytes(&self) -> usize {
        match self {
            Matrix::Bf16(w) => w.len() * 2,
            Matrix::Panels { w, .. } => w.bytes(),
            Matrix::Quant { data, .. } => data.len(),
            Matrix::Quant16(p) => p.bytes(),
            Matrix::Int4(t) => {
                let perm = t.perm.as_ref().map_or(0, |p| p.len() * 4);
                t.data.len() + t.scale.len() * 4 + t.zero.len() + perm
            }
            Matrix::Stack(parts) => parts.iter().map(|(m, _)| m.bytes()).sum(),
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

/// One projection as the packer takes it.
pub(super) enum Part {
    /// Its values in BF16, `[rows, cols]`.
    Dense(Vec<bf16>),
    /// Blocks the kernels multiply as they are.
    Blocks(QuantType, Vec<u8>),
    /// Group-wise 4-bit codes, as stored.
    Int4(Int4Tensor),
}

impl Part {
    /// `p` as the fast path runs it (the one match on the stored formats,
    /// see the module doc), its stored buffers released.
    pub(super) fn of(p: &mut Projection) -> Result<Part, BackendError> {
        let part = match p {
            Projection::Bf16(t) => Part::Dense(std::mem::take(&mut t.data)),
            Projection::Blocks(t) if quant_type(t.ty).is_some() => {
                let qt = quant_type(t.ty).expect("checked: a kept type");
                Part::Blocks(qt, std::mem::take(&mut t.data))
            }
            Projection::Int4(t) => Part::Int4(t.clone()),
            // FP8 widened; other block types decoded
            Projection::Fp8(_) | Projection::Blocks(_) => {
                let t = p
                    .dense()
                    .map_err(|e| BackendError::Device(format!("cpu: {e}")))?;
                Part::Dense(t.into_owned().data)
            }
        };
        p.release();
        Ok(part)
    }

    fn quant_type(&self) -> Option<QuantType> {
        match self {
            Part::Blocks(qt, _) => Some(*qt),
            Part::Dense(_) | Part::Int4(_) => None,
        }
    }

    /// The part's BF16 values, for a form the fused matrix does not keep.
    fn into_dense(self) -> Result<Part, BackendError> {
        match self {
            Part::Int4(t) => {
                let p = Projection::Int4(t);
                let t = p
                    .dense()
                    .map_err(|e| BackendError::Device(format!("cpu: {e}")))?;
                Ok(Part::Dense(t.into_owned().data))
            }
            other => Ok(other),
        }
    }
}

/// `t` as the kernel borrows it.
pub(crate) fn int4_matrix(t: &Int4Tensor) -> Int4Matrix<'_> {
    Int4Matrix {
        rows: t.rows,
        cols: t.cols,
        group: t.group,
        data: &t.data,
        scale: &t.scale,
        zero: &t.zero,
        perm: t.perm.as_deref(),
    }
}

/// `parts` stacked into one int4 matrix when every part is int4 in one
/// group and one column order; else `Err(parts)`, int4 ones decoded.
fn stack_int4(parts: Vec<Part>) -> Result<Result<Matrix, Vec<Part>>, BackendError> {
    let int4: Vec<&Int4Tensor> = (parts.iter())
        .filter_map(|p| match p {
            Part::Int4(t) => Some(t),
            _ => None,
        })
        .collect();
    let Some(first) = int4.first() else {
        return Ok(Err(parts));
    };
    let one = int4.len() == parts.len()
        && (int4.iter()).all(|t| t.group == first.group && t.perm == first.perm);
    if !one {
        let dense = parts
            .into_iter()
            .map(Part::into_dense)
            .collect::<Result<_, _>>()?;
        return Ok(Err(dense));
    }
    let mut all = (*first).clone();
    for t in &int4[1..] {
        all.rows += t.rows;
        all.data.extend_from_slice(&t.data);
        all.scale.extend_from_slice(&t.scale);
        all.zero.extend_from_slice(&t.zero);
    }
    Ok(Ok(Matrix::Int4(all)))
}

/// The fused matrix of `parts` (row-stacked, all `[_, cols]`, `rows[i]`
/// rows each; [`Part::of`]): the blocks when every part has them in one
/// type, a [`Matrix::Stack`] of the runs of parts in one form when they
/// differ, else BF16 (quantised to `qt` when given) in `layout`. `name`
/// (the first part's) names it in errors.
pub(super) fn pack_group(
    parts: Vec<Part>,
    rows: &[usize],
    cols: usize,
    name: &str,
    quantize_to: Option<QuantType>,
    layout: Layout,
) -> Result<Matrix, BackendError> {
    let parts = match stack_int4(parts)? {
        Ok(m) => return Ok(m),
        Err(parts) => parts,
    };
    let types: Vec<Option<QuantType>> = parts.iter().map(Part::quant_type).collect();
    if types.iter().all(|t| t.is_some() && *t == types[0]) {
        let qt = types[0].expect("checked: every part has a type");
        let mut data = Vec::new();
        for p in parts {
            if let Part::Blocks(_, d) = p {
                data.extend_from_slice(&d);
            }
        }
        return Ok(quant_matrix(qt, data, cols, layout));
    }
    if parts.len() > 1 && types.iter().any(Option::is_some) {
        // each run of parts in one form is one matrix (Q4_K Q and K
        // together beside a Q6_K V)
        let mut stack = Vec::new();
        let mut parts = parts.into_iter();
        let mut i = 0;
        for run in types.chunk_by(|a, b| a == b) {
            let n = run.len();
            let run_rows = &rows[i..i + n];
            let m = pack_group(
                parts.by_ref().take(n).collect(),
                run_rows,
                cols,
                name,
                quantize_to,
                layout,
            )?;
            stack.push((m, run_rows.iter().sum()));
            i += n;
        }
        return Ok(Matrix::Stack(stack));
    }
    let mut bf = Vec::with_capacity(rows.iter().sum::<usize>() * cols);
    for p in parts {
        if let Part::Dense(d) = p {
            bf.extend_from_slice(&d);
        }
    }
    match quantize_to {
        Some(qt) => quantize(qt, &bf, cols, name, layout),
        None if layout.panels => {
            let rows = bf.len() / cols;
            let lo = layout.split.then(|| LoWeights::new(&bf, cols, rows));
            let w = PairPanels::new(&bf, cols, rows);
            Ok(Matrix::Panels { w, lo })
        }
        None => Ok(Matrix::Bf16(bf)),
    }
}

/// The LM head as the fast path multiplies it, and whether it holds the
/// embedding's rows (a tied head in BF16 panels: the embedding's
/// row-major buffer is released and its lookup reads the panels,
/// [`PairPanels::row_f32`]). An untied head enters through [`Part::of`]
/// (its blocks, else BF16: quantised to Q8_0 when the layers are, in
/// panels on AVX-512, else row-major). A tied head is the embedding:
/// quantised to Q8_0 when the layers are, in panels on AVX-512, else
/// `None` (the embedding's row-major buffer read as it is).
pub(super) fn pack_head(
    w: &mut ModelWeights,
    format: CpuWeights,
    layout: Layout,
) -> Result<(Option<Matrix>, bool), BackendError> {
    let cols = w.embed.shape[1];
    let q8 = matches!(format, CpuWeights::Quantize(_));
    let part = match &mut w.lm_head {
        Some(p) => Part::of(p)?,
        None if q8 => {
            let m = quantize(QuantType::Q8_0, &w.embed.data, cols, &w.embed.name, layout)?;
            return Ok((Some(m), false));
        }
        None if layout.panels => {
            let data = std::mem::take(&mut w.embed.data);
            let panels = PairPanels::new(&data, cols, data.len() / cols);
            return Ok((
                Some(Matrix::Panels {
                    w: panels,
                    lo: None,
                }),
                true,
            ));
        }
        None => return Ok((None, false)),
    };
    let name = "lm_head.weight";
    let m = match part.into_dense()? {
        Part::Blocks(qt, data) => quant_matrix(qt, data, cols, layout),
        Part::Int4(_) => unreachable!("into_dense decodes int4"),
        Part::Dense(d) if q8 => quantize(QuantType::Q8_0, &d, cols, name, layout)?,
        // a BF16 head in panels: the layers' f32 products, half again the
        // row-major tiles' bandwidth on one token
        Part::Dense(d) if layout.panels => Matrix::Panels {
            w: PairPanels::new(&d, cols, d.len() / cols),
            lo: None,
        },
        Part::Dense(d) => Matrix::Bf16(d),
    };
    Ok((Some(m), false))
}

#[cfg(test)]
mod tests;
