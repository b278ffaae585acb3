//! Deterministic mode's products: every GEMM shape of the model (the four
//! projections and the LM head) runs one cuBLASLt algorithm at every row
//! count ([`gpu::InvariantGemm`]), picked here once at start by timing.
//!
//! Contract: [`CudaBackend::pin_invariant`] pins an algorithm for each
//! shape or fails naming it, before any step; [`CudaBackend::inv_gemm`] and
//! the LM head then never pick by row count. FP8 weights with FP8
//! activations run the FP8 product where cuBLASLt has a batch-invariant
//! FP8 algorithm for the shape, else the bf16 product on widened weights:
//! the choice is per shape, never per step.
//! Costs: at start, each candidate algorithm timed at [`TIMED_ROWS`] rows
//! (tens of ms a shape); temporary buffers of `TIMED_ROWS.max() x width`
//! (the LM head's at [`HEAD_TIMED_ROWS`]).

use gpu::{Algo, DevSlice, GemmDims, Inputs, InvariantGemm, Operands, Output};
use half::bf16;

use contract::backend::BackendError;

use super::weights::DevProj;
use super::{CudaBackend, dev_err};

/// Row counts each projection's candidates are timed at: batch-1 decode, a
/// decode batch and a prefill step; the pick loses least against the
/// fastest candidate over them (sum of ratios).
const TIMED_ROWS: [usize; 3] = [1, 128, 2048];

/// The LM head runs on sampled rows only: timed at batch-1 and a batch.
const HEAD_TIMED_ROWS: [usize; 2] = [1, 128];

/// Timed runs per candidate and row count (after one warm-up run).
const TIMED_RUNS: usize = 5;

/// Device buffers the timing runs read and write.
struct Scratch {
    x: gpu::DeviceBuffer<bf16>,     // [rows, max k]
    xq: gpu::DeviceBuffer<u8>,      // [rows, max k]
    xs: gpu::DeviceBuffer<f32>,     // [rows]
    y: gpu::DeviceBuffer<bf16>,     // [rows, max n]
    logits: gpu::DeviceBuffer<f32>, // [rows, vocab]
}

impl CudaBackend {
    /// Pins an algorithm for every GEMM shape (deterministic mode; a no-op
    /// otherwise), or names the shape cuBLASLt has none for.
    pub(super) fn pin_invariant(&self) -> Result<(), BackendError> {
        let Some(inv) = &self.inv else {
            return Ok(());
        };
        let c = &self.config;
        let (h, inter, q, v) = (c.hidden_size, c.intermediate_size, c.q_dim(), c.vocab_size);
        let qkv = self.tuning.shape.qkv_width();
        let rows = TIMED_ROWS[TIMED_ROWS.len() - 1];
        let head_rows = HEAD_TIMED_ROWS[HEAD_TIMED_ROWS.len() - 1];
        let e = |what: &'static str| move |err: gpu::GpuError| dev_err(what, err);
        let (max_k, max_n) = (h.max(q).max(inter), qkv.max(h).max(2 * inter));
        let s = Scratch {
            x: self
                .gpu
                .alloc(rows * max_k)
                .map_err(e("deterministic GEMM timing"))?,
            xq: self
                .gpu
                .alloc(rows * max_k)
                .map_err(e("deterministic GEMM timing"))?,
            xs: self
                .gpu
                .alloc(rows)
                .map_err(e("deterministic GEMM timing"))?,
            y: self
                .gpu
                .alloc(rows * max_n)
                .map_err(e("deterministic GEMM timing"))?,
            logits: self
                .gpu
                .alloc(head_rows * v)
                .map_err(e("deterministic GEMM timing"))?,
        };
        if let Some(l) = self.model.w.layers.first() {
            for (w, n, k) in [
                (&l.qkv, qkv, h),
                (&l.o, h, q),
                (&l.gate_up, 2 * inter, h),
                (&l.down, h, inter),
            ] {
                self.pin_proj(inv, &s, w, n, k)?;
            }
        }
        let head = match &self.model.w.lm_head {
            Some(p) => self.widen(p, v, h)?,
            None => self.model.w.embed.view(),
        };
        let run = |m: usize| {
            let x = s.x.view().sub(0, m * h)?;
            let y = s.logits.view().sub(0, m * v)?;
            Ok((Inputs::Bf16 { x, w: head }, Output::F32(y)))
        };
        let algo = pick(
            &self.gpu,
            inv,
            Operands::Bf16ToF32,
            v,
            h,
            &HEAD_TIMED_ROWS,
            run,
        )?;
        inv.pin(Operands::Bf16ToF32, v, h, algo);
        self.gpu
            .synchronize()
            .map_err(|e| dev_err("pinning the deterministic GEMMs", e))
    }

    /// Pins the product of projection `w` (`[n, k]`): FP8 where FP8
    /// activations are on and cuBLASLt has a batch-invariant FP8 algorithm
    /// for it, else bf16.
    fn pin_proj(
        &self,
        inv: &InvariantGemm,
        s: &Scratch,
        w: &DevProj,
        n: usize,
        k: usize,
    ) -> Result<(), BackendError> {
        if let (DevProj::Fp8 { q, scale }, Some(_)) = (w, &self.lt) {
            let run = |m: usize| {
                let inputs = Inputs::Fp8 {
                    x: s.xq.view().sub(0, m * k)?,
                    sx: s.xs.view().sub(0, m)?,
                    w: q.view(),
                    sw: scale.view(),
                };
                Ok((inputs, Output::Bf16(s.y.view().sub(0, m * n)?)))
            };
            if let Ok(algo) = pick(&self.gpu, inv, Operands::Fp8, n, k, &TIMED_ROWS, run) {
                inv.pin(Operands::Fp8, n, k, algo);
                return Ok(());
            }
        }
        let wb = self.widen(w, n, k)?;
        let run = |m: usize| {
            let x = s.x.view().sub(0, m * k)?;
            Ok((
                Inputs::Bf16 { x, w: wb },
                Output::Bf16(s.y.view().sub(0, m * n)?),
            ))
        };
        let algo = pick(&self.gpu, inv, Operands::Bf16, n, k, &TIMED_ROWS, run)?;
        inv.pin(Operands::Bf16, n, k, algo);
        Ok(())
    }

    /// `y[m, n] = x[m, k] · w[n, k]ᵀ` on the shape's pinned algorithm.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn inv_gemm(
        &self,
        inv: &InvariantGemm,
        m: usize,
        x: DevSlice<'_, bf16>,
        w: &DevProj,
        y: DevSlice<'_, bf16>,
        n: usize,
        k: usize,
    ) -> Result<(), BackendError> {
        let d = GemmDims { m, n, k };
        let e = |what: &'static str| move |err: gpu::GpuError| dev_err(what, err);
        if let (DevProj::Fp8 { q, scale }, Some(_)) = (w, &self.lt)
            && inv.is_pinned(Operands::Fp8, n, k)
        {
            let (xq, xs) = self.fp8_rows(x, m, k)?;
            let inputs = Inputs::Fp8 {
                x: xq,
                sx: xs,
                w: q.view(),
                sw: scale.view(),
            };
            return inv
                .matmul(inputs, Output::Bf16(y), d, None)
                .map_err(e("deterministic FP8 GEMM"));
        }
        let w = self.widen(w, n, k)?;
        inv.matmul(Inputs::Bf16 { x, w }, Output::Bf16(y), d, None)
            .map_err(e("deterministic GEMM"))
    }
}

/// The candidate of `(ops, n, k)` that loses least against the fastest
/// over `rows` (`run(m)`: the operands at `m` rows); an error naming the
/// shape when no candidate runs.
fn pick<'a>(
    gpu: &gpu::Gpu,
    inv: &InvariantGemm,
    ops: Operands,
    n: usize,
    k: usize,
    rows: &[usize],
    run: impl Fn(usize) -> Result<(Inputs<'a>, Output<'a>), gpu::GpuError>,
) -> Result<Algo, BackendError> {
    let what = format!("the deterministic GEMM {ops:?} n={n}, k={k}");
    let cands = inv.candidates(ops, n, k).map_err(|e| dev_err(&what, e))?;
    let timed: Vec<(Algo, Vec<f32>)> = cands
        .into_iter()
        .filter_map(|a| {
            let ms: Result<Vec<f32>, _> = rows
                .iter()
                .map(|&m| time(gpu, inv, &a, m, n, k, &run))
                .collect();
            ms.ok().map(|ms| (a, ms))
        })
        .collect();
    let best: Vec<f32> = (0..rows.len())
        .map(|i| timed.iter().map(|t| t.1[i]).fold(f32::INFINITY, f32::min))
        .collect();
    // the sum of the ratios to the fastest: a pick slow at one size pays
    // for it, one a little slower at every size does not
    let loss = |ms: &[f32]| -> f32 {
        ms.iter()
            .zip(&best)
            .map(|(t, b)| t / b.max(f32::MIN_POSITIVE))
            .sum()
    };
    let Some((algo, ms)) = timed
        .iter()
        .min_by(|a, b| loss(&a.1).total_cmp(&loss(&b.1)))
    else {
        return Err(BackendError::Device(format!(
            "{what}: cuBLASLt has no batch-invariant algorithm (one that keeps K whole) for this shape on this device; drop `--deterministic`"
        )));
    };
    let us = |v: &[f32]| {
        v.iter()
            .map(|t| format!("{:.1}", t * 1e3))
            .collect::<Vec<_>>()
            .join(" / ")
    };
    tracing::info!(
        "{what}: {} candidates; picked {} us at {rows:?} rows (fastest {} us)",
        timed.len(),
        us(ms),
        us(&best)
    );
    Ok(*algo)
}

/// Milliseconds per call of `algo` at `m` rows.
fn time<'a>(
    gpu: &gpu::Gpu,
    inv: &InvariantGemm,
    algo: &Algo,
    m: usize,
    n: usize,
    k: usize,
    run: &impl Fn(usize) -> Result<(Inputs<'a>, Output<'a>), gpu::GpuError>,
) -> Result<f32, gpu::GpuError> {
    let (inputs, out) = run(m)?;
    let d = GemmDims { m, n, k };
    inv.matmul(inputs, out, d, Some(algo))?;
    let timer = gpu.timer()?;
    timer.start()?;
    for _ in 0..TIMED_RUNS {
        inv.matmul(inputs, out, d, Some(algo))?;
    }
    Ok(timer.stop_ms()? / TIMED_RUNS as f32)
}
