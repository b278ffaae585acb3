//! Pipelined steps on the device: [`Backend::launch`] enqueues a step and
//! the copies of its samples, [`Backend::collect`] waits for them.
//!
//! Contract: at most [`MAX_IN_FLIGHT`] steps are in flight; each copies its
//! samples into its own pinned slot (two, alternating) behind a fence, so
//! collecting step N waits for step N alone, not for step N + 1 launched
//! after it. A carried token ([`StepBatch::carried`]) is read by the
//! embedding kernel from the sampler's output of the previous launch, which
//! stays in the workspace until the next sampler runs (after that embedding,
//! in stream order; a workspace growth copies it over). A plain
//! [`Backend::step`] is a launch and a collect with nothing in flight.
//! Any failure drops every step in flight.
//!
//! Costs: per step one fence record and, per collect, one fence wait; the
//! host-side work of step N + 1 (planning, staging, graph launch) runs
//! while the device computes step N.
//!
//! [`Backend::launch`]: contract::Backend::launch
//! [`Backend::collect`]: contract::Backend::collect
//! [`Backend::step`]: contract::Backend::step

use contract::backend::{BackendError, MAX_IN_FLIGHT, SampledToken, StepBatch};
use contract::sampling::MAX_LOGPROBS;
use kernels::SampleParams;

use super::forward::HostOut;
use super::staging::{NO_CARRY, sample_params};
use super::{CudaBackend, dev_err};

/// A launched step not collected yet.
pub(super) struct Flight {
    /// Its pinned output slot (and fence).
    slot: usize,
    /// `[S]` sampler row and top-logprob count of each sampled sequence.
    rows: Vec<Option<(usize, usize)>>,
    /// Its samples, once read early (the workspace grew while it was in flight).
    ready: Option<Vec<Option<SampledToken>>>,
}

/// The samples of `rows` from a pinned slot.
fn read(out: &HostOut, rows: &[Option<(usize, usize)>]) -> Vec<Option<SampledToken>> {
    rows.iter()
        .map(|r| {
            r.map(|(row, n)| {
                let top = row * MAX_LOGPROBS;
                let ids = &out.top_ids.as_slice()[top..top + n];
                let lps = &out.top_lps.as_slice()[top..top + n];
                SampledToken {
                    token: out.tok.as_slice()[row],
                    logprob: out.lp.as_slice()[row],
                    top_logprobs: ids.iter().copied().zip(lps.iter().copied()).collect(),
                }
            })
        })
        .collect()
}

impl CudaBackend {
    /// Enqueues `batch` and the copies of its samples (module doc).
    pub(super) fn launch_step(&mut self, batch: &StepBatch) -> Result<(), BackendError> {
        self.check_batch(batch)?;
        if self.flights.len() >= MAX_IN_FLIGHT {
            return Err(BackendError::InvalidBatch(format!(
                "{MAX_IN_FLIGHT} steps are in flight already; collect one first"
            )));
        }
        let mut carry = Vec::with_capacity(batch.carried.len());
        for (i, c) in batch.carried.iter().enumerate() {
            match self.prev_rows.get(c.from as usize) {
                Some(&row) if row != NO_CARRY => carry.push((c.token, row)),
                _ => return Err(c.unsampled(i, self.prev_rows.len())),
            }
        }
        let r = self.enqueue_step(batch, &carry);
        if r.is_err() {
            self.flights.clear();
            self.prev_rows.clear();
        }
        r
    }

    fn enqueue_step(
        &mut self,
        batch: &StepBatch,
        carry: &[(u32, u32)],
    ) -> Result<(), BackendError> {
        let s = batch.num_seqs();
        let mut hist = Vec::new();
        // Graph steps sample every sequence (row s = sequence s); eager steps only the requested ones.
        let all: Vec<SampleParams> = batch
            .samples
            .iter()
            .map(|r| sample_params(r.as_ref(), &mut hist))
            .collect();
        let out_rows: Vec<usize> = if self.run_graph(batch, &all, &hist, carry)? {
            (0..s).collect()
        } else {
            // the requested rows only, with the settings (and history) already staged
            let sampled: Vec<usize> = (0..s).filter(|&q| batch.samples[q].is_some()).collect();
            let rows: Vec<u32> = sampled
                .iter()
                .map(|&q| batch.cu_seqlens[q + 1] - 1)
                .collect();
            let params: Vec<SampleParams> = sampled.iter().map(|&q| all[q]).collect();
            if rows.is_empty() {
                let greedy = [SampleParams::greedy()];
                self.run_eager(batch, &[0], &greedy, &hist, carry, false)?;
            } else {
                self.run_eager(batch, &rows, &params, &hist, carry, true)?;
            }
            let mut next = 0;
            batch
                .samples
                .iter()
                .map(|r| {
                    let i = next;
                    next += usize::from(r.is_some());
                    i
                })
                .collect()
        };
        let rows: Vec<Option<(usize, usize)>> = batch
            .samples
            .iter()
            .zip(&out_rows)
            .map(|(req, &row)| {
                req.as_ref()
                    .map(|q| (row, q.params.logprobs.min(MAX_LOGPROBS)))
            })
            .collect();
        // rows written by the sampler: only sequences that asked for a sample own one
        let r = rows
            .iter()
            .flatten()
            .map(|&(row, _)| row + 1)
            .max()
            .unwrap_or(0);
        let slot = self.next_slot;
        self.next_slot ^= 1;
        let ws = &mut self.ws;
        let out = &mut ws.host_out[slot];
        let mut copy = |gpu: &gpu::Gpu| -> Result<(), gpu::GpuError> {
            gpu.copy_to_pinned(ws.tok.slice(0..r)?, &mut out.tok)?;
            gpu.copy_to_pinned(ws.lp.slice(0..r)?, &mut out.lp)?;
            let n = r * MAX_LOGPROBS;
            gpu.copy_to_pinned(ws.top_ids.slice(0..n)?, &mut out.top_ids)?;
            gpu.copy_to_pinned(ws.top_lps.slice(0..n)?, &mut out.top_lps)
        };
        copy(&self.gpu).map_err(|e| dev_err("copying sampled tokens", e))?;
        self.fences[slot]
            .record()
            .map_err(|e| dev_err("copying sampled tokens", e))?;
        self.prev_rows.clear();
        self.prev_rows.extend(
            rows.iter()
                .map(|r| r.map_or(NO_CARRY, |(row, _)| row as u32)),
        );
        self.flights.push_back(Flight {
            slot,
            rows,
            ready: None,
        });
        Ok(())
    }

    /// Waits for the oldest step in flight and returns its samples.
    pub(super) fn collect_step(&mut self) -> Result<Vec<Option<SampledToken>>, BackendError> {
        let Some(f) = self.flights.pop_front() else {
            return Err(BackendError::InvalidBatch(
                "no launched step to collect".into(),
            ));
        };
        if let Some(ready) = f.ready {
            return Ok(ready);
        }
        if let Err(e) = self.fences[f.slot].wait() {
            self.flights.clear();
            self.prev_rows.clear();
            return Err(dev_err("running a step", e));
        }
        Ok(read(&self.ws.host_out[f.slot], &f.rows))
    }

    /// Reads the samples of every step in flight into the host (call after a
    /// synchronisation, before the pinned slots are dropped).
    pub(super) fn harvest(&mut self) {
        for f in self.flights.iter_mut().filter(|f| f.ready.is_none()) {
            f.ready = Some(read(&self.ws.host_out[f.slot], &f.rows));
        }
    }

    /// Fails with a message when steps are in flight (a plain step or a
    /// logits call cannot run before them).
    pub(super) fn require_idle(&self, what: &str) -> Result<(), BackendError> {
        if self.flights.is_empty() {
            Ok(())
        } else {
            Err(BackendError::InvalidBatch(format!(
                "{} launched steps are not collected; {what} cannot run before them",
                self.flights.len()
            )))
        }
    }
}
