//! The projections, one implementation per weight format, and the GEMM
//! path's products.
//!
//! Contract: a [`Linear`] is one (fused) projection `[n, k]` on the device
//! in one weight format, made by its format's uploader. Every format gives
//! the fused GEMV kernels its weights ([`Linear::gemv`], read through
//! `kernels::gemv::WeightFormat`) and the GEMM path a bf16 matrix
//! ([`Linear::bf16`]: its own, or widened into the model's scratch), plus
//! FP8 operands where it has them ([`Linear::fp8`]). Which product the GEMM
//! path runs is a [`Products`] chosen once when the backend opens (the fast
//! cuBLAS products here, or deterministic mode's pinned ones in
//! `invariant`); no call site checks a mode or a format.
//! Adding a format is a new `Linear` (and a kernel format type where its
//! GEMV reads it natively); the layers and the plan do not change. The
//! GGUF block formats' `Linear` is `gguf::GgufLinear`.
//! Costs: widening an FP8 or block projection is one kernel over its bytes
//! into the one scratch buffer (the next widening overwrites it).

use gpu::{Blas, BlasLt, DevSlice, DeviceBuffer, GemmDims, Gpu};
use half::bf16;
use kernels::Kernels;
use kernels::gemv::{GemvWeights, WeightFormat};

use checkpoint::fp8::Fp8Tensor;
use checkpoint::weights::Tensor;
use contract::backend::BackendError;

use super::errors::{dev_err, ge, ke};

/// One projection's weights on the device, `[n, k]`.
pub(super) trait Linear: Send + Sync {
    /// The format the weights are stored in.
    fn format(&self) -> WeightFormat;
    /// The weights as the fused GEMV kernels read them.
    fn gemv(&self) -> GemvWeights<'_>;
    /// The bf16 matrix `[n, k]` cuBLAS reads: the weights themselves, or
    /// widened by a kernel into `io.widened` (enqueued on the stream).
    fn bf16<'a>(
        &'a self,
        io: &GemmIo<'a>,
        n: usize,
        k: usize,
    ) -> Result<DevSlice<'a, bf16>, BackendError>;
    /// The e4m3 weights and their row scales, for formats that are FP8.
    fn fp8(&self) -> Option<(DevSlice<'_, u8>, DevSlice<'_, f32>)> {
        None
    }
    /// The format, chunks and side records of block formats (GGUF, int4),
    /// which `kernels::qgemm` multiplies without widening the matrix.
    fn blocks(&self) -> Option<(WeightFormat, DevSlice<'_, u8>, DevSlice<'_, u8>)> {
        None
    }
}

/// Rows up to which the fast products multiply a block-format projection
/// with `kernels::qgemm` (its weights widened in registers) rather than
/// widening it into the scratch matrix for cuBLAS: the widening pass reads
/// the blocks and writes and rereads 2 bytes a weight, which outweighs
/// cuBLAS's faster tensor-core loop only at a few hundred rows. The
/// crossing is what `kernel_timings qgemm` measures on a GPU.
pub(super) const QGEMM_MAX_ROWS: usize = 256;

/// bf16 weights, as a checkpoint stores them.
pub(super) struct Bf16Linear(DeviceBuffer<bf16>);

impl Bf16Linear {
    /// Uploads `parts` (each checked against its shape,
    /// `checkpoint::Projection::check`) stacked into one matrix (rows of
    /// each in order).
    pub fn upload(gpu: &Gpu, parts: &[&Tensor]) -> Result<Self, BackendError> {
        let data: Vec<&[bf16]> = parts.iter().map(|t| &t.data[..]).collect();
        let what = parts.first().map_or("", |t| t.name.as_str());
        gpu.upload_parts(&data)
            .map(Bf16Linear)
            .map_err(|e| dev_err(&format!("uploading {what}"), e))
    }
}

impl Linear for Bf16Linear {
    fn format(&self) -> WeightFormat {
        WeightFormat::Bf16
    }
    fn gemv(&self) -> GemvWeights<'_> {
        GemvWeights::Bf16(self.0.view())
    }
    fn bf16<'a>(
        &'a self,
        _: &GemmIo<'a>,
        _: usize,
        _: usize,
    ) -> Result<DevSlice<'a, bf16>, BackendError> {
        Ok(self.0.view())
    }
}

/// e4m3 bytes `[n, k]` with one f32 scale per row `[n]`.
pub(super) struct Fp8RowLinear {
    q: DeviceBuffer<u8>,
    scale: DeviceBuffer<f32>,
}

impl Fp8RowLinear {
    /// Uploads FP8 projections `parts` (each checked against its shape,
    /// `checkpoint::Projection::check`) stacked into one matrix.
    pub fn upload(gpu: &Gpu, parts: &[&Fp8Tensor]) -> Result<Self, BackendError> {
        let mut q = Vec::with_capacity(parts.iter().map(|t| t.data.len()).sum());
        let mut scale = Vec::new();
        for t in parts {
            q.extend_from_slice(&t.data);
            scale.extend_from_slice(&t.scale);
        }
        let what = parts.first().map_or("", |t| t.name.as_str());
        let err = |e| dev_err(&format!("uploading FP8 {what}"), e);
        Ok(Fp8RowLinear {
            q: gpu.upload(&q).map_err(err)?,
            scale: gpu.upload(&scale).map_err(err)?,
        })
    }
}

impl Linear for Fp8RowLinear {
    fn format(&self) -> WeightFormat {
        WeightFormat::Fp8Row
    }
    fn gemv(&self) -> GemvWeights<'_> {
        GemvWeights::Fp8 {
            q: self.q.view(),
            scale: self.scale.view(),
        }
    }
    fn bf16<'a>(
        &'a self,
        io: &GemmIo<'a>,
        n: usize,
        k: usize,
    ) -> Result<DevSlice<'a, bf16>, BackendError> {
        let buf = io.widened.ok_or_else(|| {
            BackendError::Device("cuda: FP8 weights without their widening buffer".into())
        })?;
        let wide = buf.sub(0, n * k).map_err(ge("widened view"))?;
        io.k.fp8_dequant_rows(self.q.view(), self.scale.view(), wide, n, k)
            .map_err(ke("FP8 widening"))?;
        Ok(wide)
    }
    fn fp8(&self) -> Option<(DevSlice<'_, u8>, DevSlice<'_, f32>)> {
        Some((self.q.view(), self.scale.view()))
    }
}

/// Checks that tensor `t` has `shape`, naming it otherwise.
pub(super) fn check(t: &Tensor, shape: &[usize]) -> Result<(), BackendError> {
    if t.shape != shape || t.data.len() != shape.iter().product::<usize>() {
        return Err(BackendError::Device(format!(
            "cuda: tensor {} has shape {:?} ({} values), expected {shape:?}",
            t.name,
            t.shape,
            t.data.len()
        )));
    }
    Ok(())
}

/// What a product may use beside its operands: the kernels, the cuBLAS
/// handle, the workspace's FP8 activation rows and the model's widening
/// buffer.
pub(super) struct GemmIo<'a> {
    pub k: &'a Kernels,
    pub blas: &'a Blas,
    pub xq: DevSlice<'a, u8>,                // [max rows * max k]
    pub xs: DevSlice<'a, f32>,               // [max rows]
    pub widened: Option<DevSlice<'a, bf16>>, // [largest projection]
}

impl<'a> GemmIo<'a> {
    /// `x [m, k]` quantised to e4m3 a row at a time: the rows `[m, k]` and
    /// their scales `[m]`.
    pub fn fp8_rows(
        &self,
        x: DevSlice<'_, bf16>,
        m: usize,
        k: usize,
    ) -> Result<(DevSlice<'a, u8>, DevSlice<'a, f32>), BackendError> {
        let xq = self.xq.sub(0, m * k).map_err(ge("FP8 activations view"))?;
        let xs = self.xs.sub(0, m).map_err(ge("FP8 scales view"))?;
        self.k
            .fp8_quant_rows(x, xq, xs, m, k)
            .map_err(ke("FP8 activations"))?;
        Ok((xq, xs))
    }
}

/// How the GEMM path multiplies, decided when the backend opens.
pub(super) trait Products: Send {
    /// `y[m, n] = x[m, k] · w[n, k]ᵀ` in bf16 (`d` = `(m, n, k)`).
    fn project(
        &self,
        io: &GemmIo<'_>,
        w: &dyn Linear,
        x: DevSlice<'_, bf16>,
        y: DevSlice<'_, bf16>,
        d: GemmDims,
    ) -> Result<(), BackendError>;
    /// The LM head `logits[m, v] = x[m, h] · head[v, h]ᵀ` in f32, `head`
    /// already bf16 (`d` = `(m, v, h)`).
    fn head(
        &self,
        io: &GemmIo<'_>,
        head: DevSlice<'_, bf16>,
        x: DevSlice<'_, bf16>,
        logits: DevSlice<'_, f32>,
        d: GemmDims,
    ) -> Result<(), BackendError>;
    /// Whether FP8 weights multiply FP8 activations (the workspace then
    /// holds their quantised rows).
    fn fp8_activations(&self) -> bool;
    /// A note for the backend's name ("" when none).
    fn note(&self) -> &'static str {
        match self.fp8_activations() {
            true => ", fp8 activations in GEMMs",
            false => "",
        }
    }
}

/// The fast products: cuBLAS, and FP8 weights on cuBLASLt's FP8 tensor
/// cores with `x` quantised per row where it has an algorithm for the
/// shape (`lt`; else widened to bf16).
pub(super) struct Fast {
    pub lt: Option<BlasLt>,
}

impl Products for Fast {
    fn project(
        &self,
        io: &GemmIo<'_>,
        w: &dyn Linear,
        x: DevSlice<'_, bf16>,
        y: DevSlice<'_, bf16>,
        d: GemmDims,
    ) -> Result<(), BackendError> {
        let GemmDims { m, n, k } = d;
        if let (Some((q, scale)), Some(lt)) = (w.fp8(), &self.lt)
            && lt.supports(d).map_err(ge("FP8 GEMM shape"))?
        {
            let (xq, xs) = io.fp8_rows(x, m, k)?;
            return lt
                .matmul_fp8_nt(xq, xs, q, scale, y, d)
                .map_err(ge("FP8 GEMM"));
        }
        if let Some((format, q, side)) = w.blocks()
            && m <= QGEMM_MAX_ROWS
        {
            return io
                .k
                .qgemm(format, q, side, x, y, m, n, k)
                .map_err(ke("block-format GEMM"));
        }
        let w = w.bf16(io, n, k)?;
        io.blas.matmul_nt(x, w, y, d).map_err(ge("GEMM"))
    }

    fn head(
        &self,
        io: &GemmIo<'_>,
        head: DevSlice<'_, bf16>,
        x: DevSlice<'_, bf16>,
        logits: DevSlice<'_, f32>,
        d: GemmDims,
    ) -> Result<(), BackendError> {
        io.blas
            .matmul_nt(x, head, logits, d)
            .map_err(ge("LM head GEMM"))
    }

    fn fp8_activations(&self) -> bool {
        self.lt.is_some()
    }
}
