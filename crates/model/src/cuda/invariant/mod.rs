//! Deterministic mode's products: every GEMM shape of the model (the four
//! projections and the LM head) runs one batch-invariant product at every
//! row count, picked here once at start by timing: one of cuBLASLt's
//! algorithms that keep K whole ([`gpu::InvariantGemm`]) or lamina's own
//! `invariant_gemm` kernel (its k slices fixed by k). `choose` holds the
//! own kernel's check against cuBLASLt and the timing.
//!
//! Contract: [`CudaBackend::pin_invariant`] pins a product for each shape
//! or fails naming it, before any step, and returns them as the backend's
//! [`Products`] ([`Pinned`]), which then never pick by row count. The own kernel
//! is a candidate only for bf16 weights (it reads them before its PDL
//! wait, so never FP8 weights widened by the kernel before it) and only
//! where its outputs agree with cuBLASLt's within bf16 rounding on the
//! shape's real weights ([`choose::agrees`]). FP8 weights with FP8
//! activations run the FP8 product where cuBLASLt has a batch-invariant
//! FP8 algorithm for the shape, else the bf16 product on widened weights:
//! the choice is per shape, never per step.
//! Costs: at start, each candidate timed at [`TIMED_ROWS`] rows (tens of
//! ms a shape), the own kernel's check one product read back per shape and
//! timed row count; temporary buffers of `TIMED_ROWS.max() x width` (the
//! LM head's at [`HEAD_TIMED_ROWS`]), the inputs uploaded once.

use std::collections::HashSet;

use gpu::{DevSlice, GemmDims, Inputs, InvariantGemm, Operands, Output};
use half::bf16;
use kernels::invariant_gemm::InvOut;

use contract::backend::BackendError;

mod choose;

use choose::{OwnRun, Pick, own_agrees, pick, test_inputs};

use super::CudaBackend;
use super::linear::{GemmIo, Linear, Products};
use crate::cuda::errors::{dev_err, ge, ke};
use kernels::gemv::WeightFormat;

/// Row counts each projection's candidates are timed at: batch-1 decode, a
/// decode batch and a prefill step; the pick loses least against the
/// fastest candidate over them (sum of ratios).
const TIMED_ROWS: [usize; 3] = [1, 128, 2048];

/// The LM head runs on sampled rows only: timed at batch-1 and a batch.
const HEAD_TIMED_ROWS: [usize; 2] = [1, 128];

// the own kernel's check at the timed row counts runs both of its forms
const _: () = assert!(
    TIMED_ROWS[0] < kernels::invariant_gemm::TILED_MIN_ROWS
        && HEAD_TIMED_ROWS[0] < kernels::invariant_gemm::TILED_MIN_ROWS
        && kernels::invariant_gemm::TILED_MIN_ROWS <= HEAD_TIMED_ROWS[1]
        && kernels::invariant_gemm::TILED_MIN_ROWS <= TIMED_ROWS[2]
);

/// The shapes `(operands, n, k)` deterministic mode runs on the own
/// `invariant_gemm` kernel (every other shape on its pinned cuBLASLt
/// algorithm).
pub(super) type OwnShapes = HashSet<Shape>;

/// Which products deterministic mode may pin a GEMM shape to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DetGemm {
    /// The fastest by timing, cuBLASLt's or the own kernel where it agrees.
    #[default]
    Auto,
    /// cuBLASLt's batch-invariant algorithms only.
    CublasLt,
    /// The own `invariant_gemm` for every bf16 shape (an error naming the
    /// shape where it cannot serve it or disagrees with cuBLASLt).
    Own,
}

/// Device buffers the timing runs read and write.
struct Scratch {
    x: gpu::DeviceBuffer<bf16>,     // [rows, max k]
    xq: gpu::DeviceBuffer<u8>,      // [rows, max k]
    xs: gpu::DeviceBuffer<f32>,     // [rows]
    y: gpu::DeviceBuffer<bf16>,     // [rows, max n]
    logits: gpu::DeviceBuffer<f32>, // [rows, vocab]
}

impl CudaBackend {
    /// Pins a product on `inv` for every GEMM shape (FP8 products only
    /// with `fp8_acts`) and returns them as deterministic mode's products,
    /// or names the shape with no batch-invariant product.
    pub(super) fn pin_invariant(
        &self,
        inv: InvariantGemm,
        det: DetGemm,
        fp8_acts: bool,
    ) -> Result<Pinned, BackendError> {
        let mut own = OwnShapes::new();
        let c = &self.config;
        let (h, inter, q, v) = (c.hidden_size, c.intermediate_size, c.q_dim(), c.vocab_size);
        let qkv = self.tuning.shape.qkv_width();
        let rows = TIMED_ROWS[TIMED_ROWS.len() - 1];
        let head_rows = HEAD_TIMED_ROWS[HEAD_TIMED_ROWS.len() - 1];
        let e = ge("deterministic GEMM timing");
        let (max_k, max_n) = (h.max(q).max(inter), qkv.max(h).max(2 * inter));
        let s = Scratch {
            // the own kernel is checked against cuBLASLt on these inputs
            x: self.gpu.upload(&test_inputs(rows * max_k)).map_err(e)?,
            xq: self.gpu.alloc(rows * max_k).map_err(e)?,
            xs: self.gpu.alloc(rows).map_err(e)?,
            y: self.gpu.alloc(rows * max_n).map_err(e)?,
            logits: self.gpu.alloc(head_rows * v).map_err(e)?,
        };
        let mut pins = Pins {
            inv: &inv,
            s: &s,
            det,
            own: &mut own,
            fp8_acts,
        };
        if let Some(l) = self.model.w.layers.first() {
            for (w, n, k) in [
                (&l.qkv, qkv, h),
                (&l.o, h, q),
                (&l.gate_up, 2 * inter, h),
                (&l.down, h, inter),
            ] {
                self.pin_proj(&mut pins, w.as_ref(), n, k)?;
            }
        }
        // (an FP8 head is widened by the kernel before the product)
        let io = self.exec().gemm_io();
        let (head, bf16_weights) = match &self.model.w.lm_head {
            Some(p) => (p.bf16(&io, v, h)?, p.format() == WeightFormat::Bf16),
            None => (self.model.w.embed.view(), true),
        };
        let shape = (Operands::Bf16ToF32, v, h);
        self.pin_bf16(&mut pins, head, shape, &HEAD_TIMED_ROWS, bf16_weights)?;
        self.gpu
            .synchronize()
            .map_err(ge("pinning the deterministic GEMMs"))?;
        Ok(Pinned { inv, own, fp8_acts })
    }

    /// Pins the product of projection `w` (`[n, k]`): FP8 where FP8
    /// activations are on and cuBLASLt has a batch-invariant FP8 algorithm
    /// for it, else bf16 ([`CudaBackend::pin_bf16`]).
    fn pin_proj(
        &self,
        p: &mut Pins<'_>,
        w: &dyn Linear,
        n: usize,
        k: usize,
    ) -> Result<(), BackendError> {
        let (inv, s) = (p.inv, p.s);
        if let Some((q, scale)) = w.fp8().filter(|_| p.fp8_acts)
            && let Ok(cands) = inv.candidates(Operands::Fp8, n, k)
        {
            let run = |m: usize| {
                let inputs = Inputs::Fp8 {
                    x: s.xq.view().sub(0, m * k)?,
                    sx: s.xs.view().sub(0, m)?,
                    w: q,
                    sw: scale,
                };
                Ok((inputs, Output::Bf16(s.y.view().sub(0, m * n)?)))
            };
            let shape = (Operands::Fp8, n, k);
            if let Ok(Pick::Lt(algo)) = pick(&self.gpu, inv, shape, cands, &TIMED_ROWS, run, None) {
                inv.pin(Operands::Fp8, n, k, algo);
                return Ok(());
            }
        }
        let wb = w.bf16(&self.exec().gemm_io(), n, k)?;
        let bf16_weights = w.format() == WeightFormat::Bf16;
        self.pin_bf16(p, wb, (Operands::Bf16, n, k), &TIMED_ROWS, bf16_weights)
    }

    /// Pins the bf16 product `shape` (`Bf16` or `Bf16ToF32`, `[n, k]`
    /// weights `w`) to a cuBLASLt algorithm or the own kernel, timed at
    /// `rows`. The own kernel is a candidate only for the model's own bf16
    /// weights (`bf16_weights`: it reads them before its PDL wait, and
    /// widened FP8 weights are written by the kernel before it) whose
    /// outputs agree with cuBLASLt's ([`own_agrees`]).
    fn pin_bf16(
        &self,
        p: &mut Pins<'_>,
        w: DevSlice<'_, bf16>,
        shape: Shape,
        rows: &[usize],
        bf16_weights: bool,
    ) -> Result<(), BackendError> {
        let (ops, n, k) = shape;
        let s = p.s;
        let out = |m: usize| -> Result<(Output<'_>, InvOut<'_>), gpu::GpuError> {
            Ok(match ops {
                Operands::Bf16ToF32 => {
                    let y = s.logits.view().sub(0, m * n)?;
                    (Output::F32(y), InvOut::F32(y))
                }
                _ => {
                    let y = s.y.view().sub(0, m * n)?;
                    (Output::Bf16(y), InvOut::Bf16(y))
                }
            })
        };
        let run = |m: usize| {
            Ok((
                Inputs::Bf16 {
                    x: s.x.view().sub(0, m * k)?,
                    w,
                },
                out(m)?.0,
            ))
        };
        let launch = |m: usize| -> Result<(), BackendError> {
            let x =
                s.x.view()
                    .sub(0, m * k)
                    .map_err(ge("invariant_gemm check"))?;
            let y = out(m).map_err(ge("invariant_gemm check"))?.1;
            self.k
                .invariant_gemm(x, w, y, m, n, k)
                .map_err(ke("invariant_gemm"))
        };
        let read = |m: usize| -> Result<Vec<f32>, BackendError> {
            let e = ge("reading invariant_gemm's check");
            match out(m).map_err(e)?.0 {
                Output::F32(y) => self.gpu.to_host(y).map_err(e),
                Output::Bf16(y) => Ok(self
                    .gpu
                    .to_host(y)
                    .map_err(e)?
                    .iter()
                    .map(|v| v.to_f32())
                    .collect()),
            }
        };
        let what = shape_name(shape);
        let cands = p.inv.candidates(ops, n, k).map_err(|e| dev_err(&what, e))?;
        let own_ok = p.det != DetGemm::CublasLt
            && bf16_weights
            && own_agrees(p.inv, shape, cands.first(), rows, &run, &launch, &read)?;
        let choice = match (p.det, own_ok) {
            (DetGemm::Own, true) => Pick::Own,
            (DetGemm::Own, false) => {
                return Err(BackendError::Device(format!(
                    "`--deterministic-gemm own`: invariant_gemm cannot serve {what} (it needs bf16 weights, k a multiple of {}, and outputs that agree with cuBLASLt's; the log says which failed)",
                    kernels::invariant_gemm::K_CHUNK
                )));
            }
            _ => {
                let own_run = own_ok.then_some(&launch as OwnRun<'_>);
                pick(&self.gpu, p.inv, shape, cands, rows, run, own_run)?
            }
        };
        match choice {
            Pick::Lt(algo) => p.inv.pin(ops, n, k, algo),
            Pick::Own => {
                p.own.insert(shape);
            }
        }
        Ok(())
    }
}

/// Deterministic mode's products: every shape on the product pinned to it
/// at start.
pub(super) struct Pinned {
    inv: InvariantGemm,
    /// The shapes on the own `invariant_gemm` kernel.
    own: OwnShapes,
    /// FP8 weights multiply FP8 activations where a shape is pinned so.
    fp8_acts: bool,
}

impl Products for Pinned {
    fn project(
        &self,
        io: &GemmIo<'_>,
        w: &dyn Linear,
        x: DevSlice<'_, bf16>,
        y: DevSlice<'_, bf16>,
        d: GemmDims,
    ) -> Result<(), BackendError> {
        let (inv, GemmDims { m, n, k }) = (&self.inv, d);
        if let Some((q, scale)) = w.fp8().filter(|_| self.fp8_acts)
            && inv.is_pinned(Operands::Fp8, n, k)
        {
            let (xq, xs) = io.fp8_rows(x, m, k)?;
            let inputs = Inputs::Fp8 {
                x: xq,
                sx: xs,
                w: q,
                sw: scale,
            };
            return inv
                .matmul(inputs, Output::Bf16(y), d, None)
                .map_err(ge("deterministic FP8 GEMM"));
        }
        let w = w.bf16(io, n, k)?;
        if self.own.contains(&(Operands::Bf16, n, k)) {
            return io
                .k
                .invariant_gemm(x, w, InvOut::Bf16(y), m, n, k)
                .map_err(ke("deterministic GEMM"));
        }
        inv.matmul(Inputs::Bf16 { x, w }, Output::Bf16(y), d, None)
            .map_err(ge("deterministic GEMM"))
    }

    fn head(
        &self,
        io: &GemmIo<'_>,
        head: DevSlice<'_, bf16>,
        x: DevSlice<'_, bf16>,
        logits: DevSlice<'_, f32>,
        d: GemmDims,
    ) -> Result<(), BackendError> {
        if self.own.contains(&(Operands::Bf16ToF32, d.n, d.k)) {
            return io
                .k
                .invariant_gemm(x, head, InvOut::F32(logits), d.m, d.n, d.k)
                .map_err(ke("deterministic LM head"));
        }
        self.inv
            .matmul(Inputs::Bf16 { x, w: head }, Output::F32(logits), d, None)
            .map_err(ge("deterministic LM head GEMM"))
    }

    fn fp8_activations(&self) -> bool {
        self.fp8_acts
    }
}

/// What pinning every shape shares: the products, the timing buffers, the
/// `--deterministic-gemm` choice and the shapes put on the own kernel.
struct Pins<'a> {
    inv: &'a InvariantGemm,
    s: &'a Scratch,
    det: DetGemm,
    own: &'a mut OwnShapes,
    fp8_acts: bool,
}

/// A product's operands and `[n, k]` weights.
pub(super) type Shape = (Operands, usize, usize);

pub(super) fn shape_name((ops, n, k): Shape) -> String {
    format!("the deterministic GEMM {ops:?} n={n}, k={k}")
}
