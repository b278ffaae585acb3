//! Running a step eagerly: staging it at its exact layout, planning it and
//! enqueueing its kernels (pure-decode steps that a captured graph can
//! serve go through `graphs` instead).
//!
//! Contract: the workspace grows (between launches) before the step is
//! staged; the plan comes from the staged shape alone (`plan`).
//! Costs: one host-to-device copy of the staging buffer per step.

use kernels::SampleParams;

use contract::backend::{BackendError, StepBatch};

use super::CudaBackend;
use super::plan::{StepKind, StepPlan, StepShape};
use super::staging::Layout;
use super::workspace::Caps;

/// The attention kind of `batch`.
fn step_kind(batch: &StepBatch) -> StepKind {
    if batch.is_pure_decode() {
        return StepKind::Decode;
    }
    let lens = batch.cu_seqlens.windows(2).map(|w| (w[1] - w[0]) as usize);
    StepKind::Prefill {
        max_seqlen: lens.clone().max().unwrap_or(0),
        singles: lens.filter(|&n| n == 1).count(),
    }
}

/// Whether some sequence of `batch` runs a LoRA adapter.
pub(super) fn has_lora(batch: &StepBatch) -> bool {
    batch.loras.iter().any(|&k| k != 0)
}

impl CudaBackend {
    /// Stages and enqueues `batch` without a graph; `rows` are the token rows
    /// to sample or return. Returns the layout it staged.
    pub(super) fn run_eager(
        &mut self,
        batch: &StepBatch,
        rows: &[u32],
        smp: &Sampling<'_>,
        carry: &[(u32, u32)],
    ) -> Result<Layout, BackendError> {
        let (t, s) = (batch.num_tokens(), batch.num_seqs());
        let lay = Layout::new(t, s, batch.max_blocks, rows.len(), smp.hist_cap);
        let kind = step_kind(batch);
        self.ensure(Caps {
            tokens: t,
            rows: rows.len().max(1),
            // deterministic prefill steps run attention on token rows
            decode_seqs: match kind {
                StepKind::Decode => s,
                _ if self.tuning.deterministic => t,
                _ => 1,
            },
            meta: lay.total,
        })?;
        self.stage(&lay, batch, rows, smp.params, smp.hist, carry, false)?;
        let shape = StepShape {
            t,
            s,
            r: rows.len(),
            max_blocks: batch.max_blocks,
            kind,
            identity_rows: rows.iter().enumerate().all(|(i, &r)| r as usize == i),
            lora: has_lora(batch),
        };
        let plan = StepPlan::new(&self.tuning, &self.k, shape);
        self.exec().enqueue(&lay, &plan, smp.now, None)?;
        Ok(lay)
    }
}

impl CudaBackend {
    /// Stages and enqueues `batch` up to the final norm of every token
    /// row, without a graph, the LM head or sampling; the normed rows stay
    /// in the workspace's `xn` (`[T, hidden]` bf16). The workspace grows
    /// for the tokens only: no logits rows.
    pub(super) fn run_hidden(&mut self, batch: &StepBatch) -> Result<(), BackendError> {
        let (t, s) = (batch.num_tokens(), batch.num_seqs());
        let rows: Vec<u32> = (0..t as u32).collect();
        let params = vec![SampleParams::greedy(); t];
        let lay = Layout::new(t, s, batch.max_blocks, t, 0);
        let kind = step_kind(batch);
        self.ensure(Caps {
            tokens: t,
            rows: 1,
            decode_seqs: match kind {
                StepKind::Decode => s,
                _ if self.tuning.deterministic => t,
                _ => 1,
            },
            meta: lay.total,
        })?;
        self.stage(&lay, batch, &rows, &params, &[], &[], false)?;
        let shape = StepShape {
            t,
            s,
            r: t,
            max_blocks: batch.max_blocks,
            kind,
            identity_rows: true,
            lora: has_lora(batch),
        };
        let plan = StepPlan::new(&self.tuning, &self.k, shape);
        self.exec().enqueue_hidden(&lay, &plan)
    }
}

/// What a step samples: the settings of its sampler rows, their history
/// words, the history capacity to lay out (at least `hist.len()`; a held
/// step reserves its masks' words) and whether the sampler runs with the
/// forward pass (`now`) or at release.
pub(super) struct Sampling<'a> {
    pub params: &'a [SampleParams],
    pub hist: &'a [u32],
    pub hist_cap: usize,
    pub now: bool,
}

impl<'a> Sampling<'a> {
    /// No sampling (logits stay in the workspace).
    pub fn none(params: &'a [SampleParams]) -> Self {
        Sampling {
            params,
            hist: &[],
            hist_cap: 0,
            now: false,
        }
    }
}
