//! Deterministic mode's products: every GEMM shape of the model (the four
//! projections and the LM head) runs one batch-invariant product at every
//! row count, picked here once at start by timing: one of cuBLASLt's
//! algorithms that keep K whole ([`gpu::InvariantGemm`]) or lamina's own
//! `invariant_gemm` kernel (its k slices fixed by k).
//!
//! Contract: [`CudaBackend::pin_invariant`] pins a product for each shape
//! or fails naming it, before any step; [`CudaBackend::inv_gemm`] and
//! [`CudaBackend::inv_head`] then never pick by row count. The own kernel
//! is a candidate only for bf16 weights (it reads them before its PDL
//! wait, so never FP8 weights widened by the kernel before it) and only
//! where its outputs agree with cuBLASLt's within bf16 rounding on the
//! shape's real weights ([`agrees`]). FP8 weights
//! with FP8 activations run the FP8 product where cuBLASLt has a
//! batch-invariant FP8 algorithm for the shape, else the bf16 product on
//! widened weights: the choice is per shape, never per step.
//! Costs: at start, each candidate timed at [`TIMED_ROWS`] rows (tens of
//! ms a shape), the own kernel's check one product read back per shape and
//! timed row count;
//! temporary buffers of `TIMED_ROWS.max() x width` (the LM head's at
//! [`HEAD_TIMED_ROWS`]), the inputs uploaded once.

use std::collections::HashSet;

use gpu::{Algo, DevSlice, GemmDims, Inputs, InvariantGemm, Operands, Output};
use half::bf16;
use kernels::invariant_gemm::{InvOut, slices};

use contract::backend::BackendError;

use super::weights::DevProj;
use super::{CudaBackend, dev_err};

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

/// Timed runs per candidate and row count (after one warm-up run).
const TIMED_RUNS: usize = 5;

/// The shapes `(operands, n, k)` deterministic mode runs on the own
/// `invariant_gemm` kernel (every other shape on its pinned cuBLASLt
/// algorithm).
pub(super) type OwnShapes = HashSet<(Operands, usize, usize)>;

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

/// What [`pick`] chose for a shape.
#[derive(Clone, Copy)]
enum Pick {
    Lt(Algo),
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
    /// Pins a product for every GEMM shape (deterministic mode; a no-op
    /// otherwise) and returns the shapes that run on the own kernel, or
    /// names the shape with no batch-invariant product.
    pub(super) fn pin_invariant(&self, det: DetGemm) -> Result<OwnShapes, BackendError> {
        let mut own = OwnShapes::new();
        let Some(inv) = &self.inv else {
            return Ok(own);
        };
        let c = &self.config;
        let (h, inter, q, v) = (c.hidden_size, c.intermediate_size, c.q_dim(), c.vocab_size);
        let qkv = self.tuning.shape.qkv_width();
        let rows = TIMED_ROWS[TIMED_ROWS.len() - 1];
        let head_rows = HEAD_TIMED_ROWS[HEAD_TIMED_ROWS.len() - 1];
        let e = |what: &'static str| move |err: gpu::GpuError| dev_err(what, err);
        let (max_k, max_n) = (h.max(q).max(inter), qkv.max(h).max(2 * inter));
        let s = Scratch {
            // the own kernel is checked against cuBLASLt on these inputs
            x: self
                .gpu
                .upload(&test_inputs(rows * max_k))
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
                self.pin_proj(inv, &s, w, (n, k), det, &mut own)?;
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
        let launch = |m: usize| -> Result<(), BackendError> {
            let x = s.x.view().sub(0, m * h).map_err(e("head view"))?;
            let y = s.logits.view().sub(0, m * v).map_err(e("head view"))?;
            self.k
                .invariant_gemm(x, head, InvOut::F32(y), m, v, h)
                .map_err(|err| BackendError::Device(format!("invariant_gemm: {err}")))
        };
        let ops = Operands::Bf16ToF32;
        let read = |m: usize| -> Result<Vec<f32>, BackendError> {
            let y = s.logits.view().sub(0, m * v).map_err(e("head view"))?;
            self.gpu
                .to_host(y)
                .map_err(e("reading the LM head's check"))
        };
        let widened = matches!(&self.model.w.lm_head, Some(DevProj::Fp8 { .. }));
        let own_ok = det != DetGemm::CublasLt
            && !widened
            && self.own_agrees(inv, ops, v, h, &HEAD_TIMED_ROWS, &run, &launch, &read)?;
        let own_run = own_ok.then_some(&launch as OwnRun<'_>);
        match choose(
            &self.gpu,
            inv,
            (ops, v, h),
            &HEAD_TIMED_ROWS,
            run,
            own_run,
            det,
        )? {
            Pick::Lt(algo) => inv.pin(ops, v, h, algo),
            Pick::Own => {
                own.insert((ops, v, h));
            }
        }
        self.gpu
            .synchronize()
            .map_err(|e| dev_err("pinning the deterministic GEMMs", e))?;
        Ok(own)
    }

    /// Pins the product of projection `w` (`[n, k]`): FP8 where FP8
    /// activations are on and cuBLASLt has a batch-invariant FP8 algorithm
    /// for it, else bf16 (cuBLASLt's or the own kernel, into `own`).
    fn pin_proj(
        &self,
        inv: &InvariantGemm,
        s: &Scratch,
        w: &DevProj,
        (n, k): (usize, usize),
        det: DetGemm,
        own: &mut OwnShapes,
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
            if let Ok(Pick::Lt(algo)) =
                pick(&self.gpu, inv, Operands::Fp8, n, k, &TIMED_ROWS, run, None)
            {
                inv.pin(Operands::Fp8, n, k, algo);
                return Ok(());
            }
        }
        let e = |what: &'static str| move |err: gpu::GpuError| dev_err(what, err);
        let wb = self.widen(w, n, k)?;
        let run = |m: usize| {
            let x = s.x.view().sub(0, m * k)?;
            Ok((
                Inputs::Bf16 { x, w: wb },
                Output::Bf16(s.y.view().sub(0, m * n)?),
            ))
        };
        let launch = |m: usize| -> Result<(), BackendError> {
            let x = s.x.view().sub(0, m * k).map_err(e("projection view"))?;
            let y = s.y.view().sub(0, m * n).map_err(e("projection view"))?;
            self.k
                .invariant_gemm(x, wb, InvOut::Bf16(y), m, n, k)
                .map_err(|err| BackendError::Device(format!("invariant_gemm: {err}")))
        };
        let read = |m: usize| -> Result<Vec<f32>, BackendError> {
            let y = s.y.view().sub(0, m * n).map_err(e("projection view"))?;
            let y = self
                .gpu
                .to_host(y)
                .map_err(e("reading a projection's check"))?;
            Ok(y.iter().map(|v| v.to_f32()).collect())
        };
        let ops = Operands::Bf16;
        let own_ok = det != DetGemm::CublasLt
            && matches!(w, DevProj::Bf16(_))
            && self.own_agrees(inv, ops, n, k, &TIMED_ROWS, &run, &launch, &read)?;
        let own_run = own_ok.then_some(&launch as OwnRun<'_>);
        match choose(&self.gpu, inv, (ops, n, k), &TIMED_ROWS, run, own_run, det)? {
            Pick::Lt(algo) => inv.pin(ops, n, k, algo),
            Pick::Own => {
                own.insert((ops, n, k));
            }
        }
        Ok(())
    }

    /// Whether the own kernel serves `(ops, n, k)`: `k` fits its slices and
    /// its outputs at each of `rows` (both of its forms) agree with
    /// cuBLASLt's first candidate's ([`agrees`]); a disagreement is logged
    /// and the shape stays on cuBLASLt.
    #[allow(clippy::too_many_arguments)]
    fn own_agrees<'a>(
        &self,
        inv: &InvariantGemm,
        ops: Operands,
        n: usize,
        k: usize,
        rows: &[usize],
        run: &impl Fn(usize) -> Result<(Inputs<'a>, Output<'a>), gpu::GpuError>,
        launch: &impl Fn(usize) -> Result<(), BackendError>,
        read: &impl Fn(usize) -> Result<Vec<f32>, BackendError>,
    ) -> Result<bool, BackendError> {
        let what = format!("the deterministic GEMM {ops:?} n={n}, k={k}");
        if slices(k).is_none() {
            tracing::info!("{what}: k off invariant_gemm's chunk; cuBLASLt only");
            return Ok(false);
        }
        let cands = inv.candidates(ops, n, k).map_err(|e| dev_err(&what, e))?;
        let Some(first) = cands.first() else {
            return Ok(false);
        };
        for &m in rows {
            let reference = run(m).and_then(|(inputs, out)| {
                inv.matmul(inputs, out, GemmDims { m, n, k }, Some(first))
            });
            if let Err(e) = reference {
                tracing::warn!("{what}: no cuBLASLt product to check invariant_gemm against ({e})");
                return Ok(false);
            }
            let lt = read(m)?;
            if let Err(e) = launch(m) {
                tracing::warn!("{what}: {e}; using cuBLASLt");
                return Ok(false);
            }
            if !agrees(&read(m)?, &lt) {
                tracing::warn!(
                    "{what}: invariant_gemm disagrees with cuBLASLt at {m} rows; using cuBLASLt"
                );
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// `y[m, n] = x[m, k] · w[n, k]ᵀ` on the shape's pinned product.
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
        if self.own.contains(&(Operands::Bf16, n, k)) {
            return self
                .k
                .invariant_gemm(x, w, InvOut::Bf16(y), m, n, k)
                .map_err(|err| BackendError::Device(format!("deterministic GEMM: {err}")));
        }
        inv.matmul(Inputs::Bf16 { x, w }, Output::Bf16(y), d, None)
            .map_err(e("deterministic GEMM"))
    }

    /// The LM head `logits[m, v] = x[m, h] · head[v, h]ᵀ` on its pinned
    /// product.
    pub(super) fn inv_head(
        &self,
        inv: &InvariantGemm,
        x: DevSlice<'_, bf16>,
        head: DevSlice<'_, bf16>,
        logits: DevSlice<'_, f32>,
        m: usize,
    ) -> Result<(), BackendError> {
        let (v, h) = (self.config.vocab_size, self.config.hidden_size);
        if self.own.contains(&(Operands::Bf16ToF32, v, h)) {
            return self
                .k
                .invariant_gemm(x, head, InvOut::F32(logits), m, v, h)
                .map_err(|err| BackendError::Device(format!("deterministic LM head: {err}")));
        }
        let d = GemmDims { m, n: v, k: h };
        inv.matmul(Inputs::Bf16 { x, w: head }, Output::F32(logits), d, None)
            .map_err(|e| dev_err("deterministic LM head GEMM", e))
    }
}

/// Whether the own kernel's outputs `mine` agree with cuBLASLt's `lt` (the
/// same products summed in another order): every difference within 2% of
/// the largest output's magnitude plus 1e-3. A wrong index or a missed
/// slice moves outputs by their own size; rounding by bf16's 2^-8.
pub(super) fn agrees(mine: &[f32], lt: &[f32]) -> bool {
    let scale = lt.iter().fold(0f32, |a, v| a.max(v.abs()));
    let tol = 0.02 * scale + 1e-3;
    mine.len() == lt.len()
        && mine
            .iter()
            .zip(lt)
            .all(|(a, b)| a.is_finite() && (a - b).abs() <= tol)
}

/// Deterministic inputs in [-1, 1] for the timing and checking runs.
fn test_inputs(len: usize) -> Vec<bf16> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            bf16::from_f32((state >> 40) as f32 / (1u64 << 23) as f32 - 1.0)
        })
        .collect()
}

/// The own kernel at `m` rows, as [`pick`] times it.
type OwnRun<'r> = &'r dyn Fn(usize) -> Result<(), BackendError>;

/// [`pick`] under `det`: `DetGemm::Own` takes the own kernel untimed, or
/// names the shape it cannot serve (`own` is `None`: k off its slices, or
/// its outputs disagree with cuBLASLt's).
fn choose<'a>(
    gpu: &gpu::Gpu,
    inv: &InvariantGemm,
    (ops, n, k): (Operands, usize, usize),
    rows: &[usize],
    run: impl Fn(usize) -> Result<(Inputs<'a>, Output<'a>), gpu::GpuError>,
    own: Option<OwnRun<'_>>,
    det: DetGemm,
) -> Result<Pick, BackendError> {
    match (det, own) {
        (DetGemm::Own, Some(_)) => Ok(Pick::Own),
        (DetGemm::Own, None) => Err(BackendError::Device(format!(
            "`--deterministic-gemm own`: invariant_gemm cannot serve the GEMM {ops:?} n={n}, k={k} (it needs bf16 weights, k a multiple of {}, and outputs that agree with cuBLASLt's; the log says which failed)",
            kernels::invariant_gemm::K_CHUNK
        ))),
        _ => pick(gpu, inv, ops, n, k, rows, run, own),
    }
}

/// The candidate of `(ops, n, k)` that loses least against the fastest
/// over `rows` (`run(m)`: cuBLASLt's operands at `m` rows; `own`: the own
/// kernel, where it serves the shape); an error naming the shape when no
/// candidate runs.
#[allow(clippy::too_many_arguments)]
fn pick<'a>(
    gpu: &gpu::Gpu,
    inv: &InvariantGemm,
    ops: Operands,
    n: usize,
    k: usize,
    rows: &[usize],
    run: impl Fn(usize) -> Result<(Inputs<'a>, Output<'a>), gpu::GpuError>,
    own: Option<OwnRun<'_>>,
) -> Result<Pick, BackendError> {
    let what = format!("the deterministic GEMM {ops:?} n={n}, k={k}");
    let cands = inv.candidates(ops, n, k).map_err(|e| dev_err(&what, e))?;
    let mut timed: Vec<(Pick, Vec<f32>)> = cands
        .into_iter()
        .filter_map(|a| {
            let ms: Result<Vec<f32>, _> = rows
                .iter()
                .map(|&m| {
                    time(gpu, || {
                        lt_run(inv, &a, m, n, k, &run).map_err(|e| dev_err(&what, e))
                    })
                })
                .collect();
            ms.ok().map(|ms| (Pick::Lt(a), ms))
        })
        .collect();
    let lt_count = timed.len();
    if let Some(own) = own {
        let ms: Result<Vec<f32>, _> = rows.iter().map(|&m| time(gpu, || own(m))).collect();
        match ms {
            Ok(ms) => timed.push((Pick::Own, ms)),
            Err(e) => tracing::warn!("{what}: invariant_gemm failed ({e}); using cuBLASLt"),
        }
    }
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
    let Some((choice, ms)) = timed
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
    let name = match choice {
        Pick::Lt(_) => "a cuBLASLt algorithm",
        Pick::Own => "invariant_gemm",
    };
    tracing::info!(
        "{what}: {lt_count} cuBLASLt candidates{}; picked {name}, {} us at {rows:?} rows (fastest {} us)",
        if own.is_some() {
            " and invariant_gemm"
        } else {
            ""
        },
        us(ms),
        us(&best)
    );
    Ok(*choice)
}

/// One product on cuBLASLt's `algo` at `m` rows.
fn lt_run<'a>(
    inv: &InvariantGemm,
    algo: &Algo,
    m: usize,
    n: usize,
    k: usize,
    run: &impl Fn(usize) -> Result<(Inputs<'a>, Output<'a>), gpu::GpuError>,
) -> Result<(), gpu::GpuError> {
    let (inputs, out) = run(m)?;
    inv.matmul(inputs, out, GemmDims { m, n, k }, Some(algo))
}

/// Milliseconds per call of `once` (after one warm-up call).
fn time(gpu: &gpu::Gpu, once: impl Fn() -> Result<(), BackendError>) -> Result<f32, BackendError> {
    let e = |err| dev_err("timing a deterministic GEMM", err);
    once()?;
    let timer = gpu.timer().map_err(e)?;
    timer.start().map_err(e)?;
    for _ in 0..TIMED_RUNS {
        once()?;
    }
    Ok(timer.stop_ms().map_err(e)? / TIMED_RUNS as f32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agreement_allows_rounding_and_catches_a_wrong_output() {
        let lt: Vec<f32> = (0..64).map(|i| (i as f32 - 30.0) * 0.25).collect();
        let rounded: Vec<f32> = lt
            .iter()
            .map(|v| bf16::from_f32(v * 1.003).to_f32())
            .collect();
        assert!(agrees(&rounded, &lt));
        let mut wrong = rounded.clone();
        wrong[17] = -wrong[17];
        assert!(!agrees(&wrong, &lt));
        let mut nan = rounded.clone();
        nan[3] = f32::NAN;
        assert!(!agrees(&nan, &lt));
        assert!(!agrees(&rounded[1..], &lt));
    }

    #[test]
    fn test_inputs_are_in_range_and_varied() {
        let x = test_inputs(4096);
        assert!(x.iter().all(|v| (-1.0..=1.0).contains(&v.to_f32())));
        let distinct: HashSet<u16> = x.iter().map(|v| v.to_bits()).collect();
        assert!(distinct.len() > 1000);
    }
}
