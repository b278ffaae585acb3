//! How deterministic mode chooses a shape's product: the own kernel's
//! check against cuBLASLt ([`own_agrees`]) and the timing of every
//! candidate ([`pick`]).

use gpu::{Algo, GemmDims, Inputs, InvariantGemm, Output};
use half::bf16;
use kernels::invariant_gemm::slices;

use contract::backend::BackendError;
use contract::sampling::uniform;

use super::{Shape, shape_name};
use crate::cuda::errors::dev_err;

/// Timed runs per candidate and row count (after one warm-up run).
const TIMED_RUNS: usize = 5;

/// What [`pick`] chose for a shape.
#[derive(Clone, Copy)]
pub(super) enum Pick {
    Lt(Algo),
    Own,
}

/// Whether the own kernel (`launch(m)`) serves `shape`: `k` fits its slices
/// and its outputs (`read(m)`) at each of `rows` (both of its forms) agree
/// with cuBLASLt's candidate `first` (`run(m)`, [`agrees`]); anything else
/// is logged and the shape stays on cuBLASLt.
pub(super) fn own_agrees<'a>(
    inv: &InvariantGemm,
    shape: Shape,
    first: Option<&Algo>,
    rows: &[usize],
    run: &impl Fn(usize) -> Result<(Inputs<'a>, Output<'a>), gpu::GpuError>,
    launch: &impl Fn(usize) -> Result<(), BackendError>,
    read: &impl Fn(usize) -> Result<Vec<f32>, BackendError>,
) -> Result<bool, BackendError> {
    let (_, n, k) = shape;
    let what = shape_name(shape);
    if slices(k).is_none() {
        tracing::info!("{what}: k off invariant_gemm's chunk; cuBLASLt only");
        return Ok(false);
    }
    let Some(first) = first else {
        return Ok(false);
    };
    for &m in rows {
        if let Err(e) = lt_run(inv, first, m, n, k, run) {
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
pub(super) fn test_inputs(len: usize) -> Vec<bf16> {
    (0..len as u64)
        .map(|i| bf16::from_f32(2.0 * uniform(TEST_INPUT_SEED, i) - 1.0))
        .collect()
}

/// The seed of [`test_inputs`].
const TEST_INPUT_SEED: u64 = 0x1a3e_5eed;

/// The own kernel at `m` rows, as [`pick`] times it.
pub(super) type OwnRun<'r> = &'r dyn Fn(usize) -> Result<(), BackendError>;

/// The candidate of `shape` among cuBLASLt's `cands` (`run(m)`: their
/// operands at `m` rows) and the own kernel (`own`, where it serves the
/// shape) that loses least against the fastest over `rows`; an error
/// naming the shape when no candidate runs.
pub(super) fn pick<'a>(
    gpu: &gpu::Gpu,
    inv: &InvariantGemm,
    shape: Shape,
    cands: Vec<Algo>,
    rows: &[usize],
    run: impl Fn(usize) -> Result<(Inputs<'a>, Output<'a>), gpu::GpuError>,
    own: Option<OwnRun<'_>>,
) -> Result<Pick, BackendError> {
    let (_, n, k) = shape;
    let what = shape_name(shape);
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
    use std::collections::HashSet;

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
