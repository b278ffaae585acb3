//! LoRA on the CPU backend: the adapter slots ([`Backend::set_lora`]) and
//! the per-row delta `y += scale * B (A x)` after each targeted projection,
//! on both paths.
//!
//! Contract: slot `k` (1 ..= `max_loras`) holds an adapter checked against
//! the model; a step's [`StepBatch::loras`] names each sequence's slot (0:
//! base) and [`LoraSlots::check`] refuses a slot outside the table or
//! empty, naming `loras[s]`. [`LoraSlots::rows`] gives each token row its
//! adapter; [`LoraSlots::apply`] adds the delta of one target to the rows
//! that have one, reading the projection's input `x` `[T, in]` (row stride
//! `x_w`) and writing output columns `off..off + out` of `y` (row stride
//! `y_w`), so fused products (Q/K/V, gate/up) take their deltas in place.
//! A row's delta depends only on that row: rows of different adapters and
//! of the base model share a step.
//!
//! Costs: a step without adapter rows pays one O(S) scan; an adapter row
//! `rank * (in + out)` multiply-adds per targeted projection, rows in
//! parallel, `rank` floats of scratch per worker.
//!
//! [`Backend::set_lora`]: contract::Backend::set_lora

use std::sync::Arc;

use contract::backend::{BackendError, StepBatch};
use contract::lora::{LoraAdapter, LoraTarget};
use rayon::prelude::*;

/// The adapter slots (index `k - 1` holds slot `k`).
#[derive(Debug, Default)]
pub(super) struct LoraSlots {
    slots: Vec<Option<Arc<LoraAdapter>>>,
}

impl LoraSlots {
    /// `n` empty slots.
    pub(super) fn new(n: usize) -> Self {
        LoraSlots {
            slots: vec![None; n],
        }
    }

    pub(super) fn len(&self) -> usize {
        self.slots.len()
    }

    /// Puts `adapter` in slot `slot` (1-based) or empties it.
    pub(super) fn set(
        &mut self,
        slot: u32,
        adapter: Option<Arc<LoraAdapter>>,
    ) -> Result<(), BackendError> {
        let n = self.slots.len();
        match (slot as usize)
            .checked_sub(1)
            .and_then(|k| self.slots.get_mut(k))
        {
            Some(s) => {
                *s = adapter;
                Ok(())
            }
            None => Err(BackendError::InvalidBatch(format!(
                "LoRA slot {slot} is outside 1..={n} (--max-loras {n})"
            ))),
        }
    }

    /// The adapter of slot `slot` (None for 0 or an empty slot).
    fn get(&self, slot: u32) -> Option<&Arc<LoraAdapter>> {
        (slot as usize)
            .checked_sub(1)
            .and_then(|k| self.slots.get(k))
            .and_then(|s| s.as_ref())
    }

    /// Every sequence's slot in `batch` holds an adapter (or is 0).
    pub(super) fn check(&self, batch: &StepBatch) -> Result<(), BackendError> {
        for (s, &k) in batch.loras.iter().enumerate() {
            if k != 0 && self.get(k).is_none() {
                return Err(BackendError::InvalidBatch(format!(
                    "loras[{s}] = {k}: no LoRA adapter is loaded in that slot ({} slots)",
                    self.slots.len()
                )));
            }
        }
        Ok(())
    }

    /// `[T]` each token row's adapter, or `None` when no row has one.
    pub(super) fn rows(&self, batch: &StepBatch) -> Option<Vec<Option<Arc<LoraAdapter>>>> {
        if batch.loras.iter().all(|&k| k == 0) {
            return None;
        }
        let mut out = Vec::with_capacity(batch.num_tokens());
        for (s, w) in batch.cu_seqlens.windows(2).enumerate() {
            let a = self.get(batch.lora_of(s)).cloned();
            out.extend(std::iter::repeat_n(a, (w[1] - w[0]) as usize));
        }
        Some(out)
    }
}

/// Where one projection's input and output live (see the module doc).
pub(super) struct Proj<'a> {
    pub layer: usize,
    pub target: LoraTarget,
    /// `[T, x_w]`, the projection's input in columns `..in`.
    pub x: &'a [f32],
    pub x_w: usize,
    /// Row stride of the output and the first column of this projection.
    pub y_w: usize,
    pub off: usize,
}

/// Adds each adapter row's delta of `p` to `y` (`[T, p.y_w]`).
pub(super) fn apply(rows: &[Option<Arc<LoraAdapter>>], p: &Proj<'_>, y: &mut [f32]) {
    let t = rows.len();
    let max_rank = rows.iter().flatten().map(|a| a.rank).max().unwrap_or(0);
    y[..t * p.y_w]
        .par_chunks_mut(p.y_w)
        .zip(p.x.par_chunks(p.x_w))
        .zip(rows.par_iter())
        .for_each_init(
            || vec![0f32; max_rank],
            |tmp, ((yr, xr), a)| {
                let Some(a) = a else { return };
                let Some(pair) = a.layers[p.layer].pair(p.target) else {
                    return;
                };
                let (i, o) = (pair.a.len() / a.rank, pair.b.len() / a.rank);
                a.apply_row(pair, &xr[..i], &mut yr[p.off..p.off + o], tmp);
            },
        );
}

/// [`apply`] when the step has adapter rows (`rows` from
/// [`LoraSlots::rows`]): the delta of `target` in layer `layer`, input `x`
/// (`[T, x_w]`), output columns `off..` of `y` (`[T, y_w]`).
#[allow(clippy::too_many_arguments)]
pub(super) fn delta(
    rows: Option<&[Option<Arc<LoraAdapter>>]>,
    layer: usize,
    target: LoraTarget,
    x: &[f32],
    x_w: usize,
    y: &mut [f32],
    y_w: usize,
    off: usize,
) {
    if let Some(rows) = rows {
        let p = Proj {
            layer,
            target,
            x,
            x_w,
            y_w,
            off,
        };
        apply(rows, &p, y);
    }
}
