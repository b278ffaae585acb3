//! Pipelined steps on the device: [`Backend::launch`] enqueues a step and
//! the copies of its samples, [`Backend::collect`] waits for them.
//!
//! Contract: at most [`MAX_IN_FLIGHT`](contract::backend::MAX_IN_FLIGHT) steps are in flight; each copies its
//! samples into its own pinned slot (two, alternating) behind a fence, so
//! collecting step N waits for step N alone, not for step N + 1 launched
//! after it. A carried token ([`StepBatch::carried`]) is read by the
//! embedding kernel from the sampler's output of the previous launch, which
//! stays in the workspace until the next sampler runs (after that embedding,
//! in stream order; a workspace growth copies it over). Any failure drops
//! every step in flight. A sequence with drafts ([`StepBatch::drafts`])
//! owns consecutive sampler rows, its last `1 + K` token rows, each with
//! its own draw (`step + j`); such a step is never held, and runs as a
//! decode step (its graph) where its shape allows (`verify`), else eagerly.
//!
//! The copy of each sequence's sampler rows is [`OutRow`](super::verify::OutRow).
//!
//! Costs: per step one fence record and, per collect, one fence wait; the
//! host-side work of step N + 1 (planning, staging, graph launch) runs
//! while the device computes step N.
//!
//! [`Backend::launch`]: contract::Backend::launch
//! [`Backend::collect`]: contract::Backend::collect

use std::collections::VecDeque;

use contract::backend::{
    BackendError, SampleRequest, SampledToken, StepBatch, check_can_launch, check_release,
    nothing_held,
};
use contract::sampling::{MAX_LOGPROBS, uniform};
use gpu::{Fence, Gpu};
use kernels::SampleParams;

use super::CudaBackend;
use super::errors::dev_err;
use super::run::Sampling;
use super::staging::{Layout, NO_CARRY, sample_params};
use super::verify::OutRow;
use super::workspace::{HostOut, Workspace};

/// A held step: its forward pass enqueued, its sampling waiting for the
/// final requests.
struct Held {
    /// Where it was staged (the sampler reads its parameters there).
    lay: Layout,
    /// Replayed from a graph: every sequence owns a sampler row.
    graph: bool,
    /// `[S]` the launched requests (the final ones must match them).
    samples: Vec<Option<SampleRequest>>,
    /// `[S]` sampler rows of each sampled sequence.
    rows: Vec<Option<OutRow>>,
}

/// The steps in flight and what the next launch needs of the last one.
pub(super) struct Pipe {
    /// Launched steps not collected yet, oldest first.
    flights: VecDeque<Flight>,
    /// The held step (`Backend::launch_held`), not released yet.
    held: Option<Held>,
    /// The pinned output slot of the next launch (0 or 1).
    next_slot: usize,
    /// Fences after each slot's sample copies.
    fences: [Fence; 2],
    /// `[S]` of the last launch: the sampler row holding each sequence's
    /// sample ([`NO_CARRY`] where none), for carried tokens.
    prev_rows: Vec<u32>,
}

impl Pipe {
    pub fn new(gpu: &Gpu) -> Result<Pipe, BackendError> {
        let fence = || gpu.fence().map_err(|e| dev_err("creating events", e));
        Ok(Pipe {
            flights: VecDeque::new(),
            held: None,
            next_slot: 0,
            fences: [fence()?, fence()?],
            prev_rows: Vec::new(),
        })
    }

    /// Steps launched (the held one included) and not collected.
    pub fn in_flight(&self) -> usize {
        self.flights.len() + usize::from(self.held.is_some())
    }

    /// Forgets every step in flight and the held one (a failure).
    fn drop_all(&mut self) {
        self.flights.clear();
        self.prev_rows.clear();
        self.held = None;
    }

    /// Reads the samples of every step in flight into the host (call after
    /// a synchronisation, before `ws`'s pinned slots are dropped).
    pub fn harvest(&mut self, ws: &Workspace) {
        for f in self.flights.iter_mut().filter(|f| f.ready.is_none()) {
            f.ready = Some(read(&ws.host_out[f.slot], &f.rows));
        }
    }
}

/// A launched step not collected yet.
struct Flight {
    /// Its pinned output slot (and fence).
    slot: usize,
    /// `[S]` sampler rows of each sampled sequence.
    rows: Vec<Option<OutRow>>,
    /// Its samples, once read early (the workspace grew while it was in flight).
    ready: Option<Vec<Option<SampledToken>>>,
}

/// The samples of `rows` from a pinned slot.
fn read(out: &HostOut, rows: &[Option<OutRow>]) -> Vec<Option<SampledToken>> {
    let one = |row: usize, n: usize| {
        let logprob = out.lp.as_slice()[row];
        // a degenerate row (NaN) has no alternatives
        let n = if logprob.is_nan() { 0 } else { n };
        let top = row * MAX_LOGPROBS;
        let ids = &out.top_ids.as_slice()[top..top + n];
        let lps = &out.top_lps.as_slice()[top..top + n];
        SampledToken {
            token: out.tok.as_slice()[row],
            logprob,
            top_logprobs: ids.iter().copied().zip(lps.iter().copied()).collect(),
            draft_rows: Vec::new(),
        }
    };
    rows.iter()
        .map(|r| {
            r.map(|(row, n, k)| {
                let mut t = one(row, n);
                t.draft_rows = (row + 1..=row + k).map(|d| one(d, n)).collect();
                t
            })
        })
        .collect()
}

impl CudaBackend {
    /// Enqueues `batch` and the copies of its samples (module doc); `hold`:
    /// its forward pass only, the sampling at [`CudaBackend::release_step`].
    pub(super) fn launch_step(
        &mut self,
        batch: &StepBatch,
        hold: bool,
    ) -> Result<(), BackendError> {
        self.check_batch(batch)?;
        check_can_launch(self.pipe.held.is_some(), self.pipe.flights.len())?;
        if hold && batch.drafts.iter().any(|&k| k > 0) {
            return Err(BackendError::InvalidBatch(
                "drafts: a held step verifies no drafts (its masks wait; drafts carry none)".into(),
            ));
        }
        let prev = &self.pipe.prev_rows;
        let mut carry = Vec::with_capacity(batch.carried.len());
        for (i, c) in batch.carried.iter().enumerate() {
            match prev.get(c.from as usize) {
                Some(&row) if row != NO_CARRY => carry.push((c.token, row)),
                _ => return Err(c.unsampled(i, prev.len())),
            }
        }
        // a verify step shaped like decode runs as one (`verify`; a held
        // step has no drafts)
        let expanded = super::verify::expand(batch, self.tuning.block_size);
        if expanded.is_none() {
            super::verify::check_unexpanded(batch)?;
        }
        let r = match &expanded {
            Some(e) => self.enqueue_step(e, &carry, hold, Some(batch)),
            None => self.enqueue_step(batch, &carry, hold, None),
        };
        if r.is_err() {
            self.pipe.drop_all();
        }
        r
    }

    /// `orig`: the batch `batch` is the [`expand`](super::verify::expand)ed
    /// form of, whose sequences the samples are returned for.
    fn enqueue_step(
        &mut self,
        batch: &StepBatch,
        carry: &[(u32, u32)],
        hold: bool,
        orig: Option<&StepBatch>,
    ) -> Result<(), BackendError> {
        let s = batch.num_seqs();
        let mut hist = Vec::new();
        // Graph steps sample every sequence (row s = sequence s); eager steps only the requested ones.
        let all: Vec<SampleParams> = batch
            .samples
            .iter()
            .map(|r| sample_params(r.as_ref(), &mut hist, !hold))
            .collect();
        // a held step's masks are staged at release, into room kept for them
        let masks = |b: &StepBatch| -> usize {
            b.samples
                .iter()
                .flatten()
                .filter_map(|r| r.allowed.as_ref())
                .map(|m| m.words().len())
                .sum()
        };
        let smp = Sampling {
            params: &all,
            hist: &hist,
            hist_cap: hist.len() + if hold { masks(batch) } else { 0 },
            now: !hold,
        };
        let sampled: Vec<usize> = (0..s).filter(|&q| batch.samples[q].is_some()).collect();
        let (lay, out_rows, graph) = if let Some(lay) = self.run_graph(batch, &smp, carry)? {
            (lay, (0..s).collect(), true)
        } else {
            // the requested rows only, with the settings (and history)
            // already staged; a drafted sequence's verify rows each with the
            // draw of its own step (drafts carry no history or mask)
            let mut rows: Vec<u32> = Vec::with_capacity(sampled.len());
            let mut params: Vec<SampleParams> = Vec::with_capacity(sampled.len());
            for &q in &sampled {
                let (first, req) = (batch.sampled_rows(q), batch.samples[q].as_ref());
                for (j, row) in first.enumerate() {
                    let mut p = all[q];
                    if let (Some(r), true) = (req, j > 0) {
                        p.u = uniform(r.params.seed, r.step + j as u64);
                    }
                    rows.push(row as u32);
                    params.push(p);
                }
            }
            let lay = if rows.is_empty() {
                let greedy = [SampleParams::greedy()];
                self.run_eager(batch, &[0], &Sampling::none(&greedy), carry)?
            } else {
                let smp = Sampling {
                    params: &params,
                    ..smp
                };
                self.run_eager(batch, &rows, &smp, carry)?
            };
            let mut next = 0;
            let out_rows: Vec<usize> = (0..s)
                .map(|q| {
                    let i = next;
                    next += batch.sampled_rows(q).len();
                    i
                })
                .collect();
            (lay, out_rows, false)
        };
        let rows: Vec<Option<OutRow>> = batch
            .samples
            .iter()
            .zip(&out_rows)
            .enumerate()
            .map(|(q, (req, &row))| {
                req.as_ref().map(|r| {
                    let n = r.params.logprobs.min(MAX_LOGPROBS);
                    (row, n, batch.drafts_of(q))
                })
            })
            .collect();
        if hold {
            self.pipe.held = Some(Held {
                lay,
                graph,
                samples: batch.samples.clone(),
                rows,
            });
            return Ok(());
        }
        match orig {
            Some(orig) => self.push_flight(super::verify::fold(orig, &rows)),
            None => self.push_flight(rows),
        }
    }

    /// Enqueues the copies of a step's samples (`rows`: each sequence's
    /// sampler row and top-logprob count) into the next pinned slot and
    /// records it in flight.
    fn push_flight(&mut self, rows: Vec<Option<OutRow>>) -> Result<(), BackendError> {
        // rows written by the sampler: only sequences that asked for a sample own one
        let r = rows
            .iter()
            .flatten()
            .map(|&(row, _, k)| row + 1 + k)
            .max()
            .unwrap_or(0);
        let slot = self.pipe.next_slot;
        self.pipe.next_slot ^= 1;
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
        self.pipe.fences[slot]
            .record()
            .map_err(|e| dev_err("copying sampled tokens", e))?;
        let prev = &mut self.pipe.prev_rows;
        prev.clear();
        prev.extend(
            rows.iter()
                .map(|r| r.map_or(NO_CARRY, |(row, _, _)| row as u32)),
        );
        self.pipe.flights.push_back(Flight {
            slot,
            rows,
            ready: None,
        });
        Ok(())
    }

    /// Samples the held step with its final requests (`Backend::release`):
    /// stages their settings, history and masks, enqueues the sampler and
    /// the copies of its samples.
    pub(super) fn release_step(
        &mut self,
        samples: &[Option<SampleRequest>],
    ) -> Result<(), BackendError> {
        let Some(held) = self.pipe.held.take() else {
            return Err(nothing_held());
        };
        check_release(&held.samples, samples)?;
        // graph steps have a sampler row per sequence, eager ones per request
        let reqs: Vec<Option<&SampleRequest>> = match held.graph {
            true => samples.iter().map(Option::as_ref).collect(),
            false => samples.iter().flatten().map(Some).collect(),
        };
        let mut hist = Vec::new();
        let mut params: Vec<SampleParams> = reqs
            .iter()
            .map(|r| sample_params(*r, &mut hist, false))
            .collect();
        // the masks follow every other history word, written straight into
        // the pinned staging (no intermediate copy of V / 32 words a row)
        let mut end = hist.len();
        let mut masks = Vec::new();
        for (p, r) in params.iter_mut().zip(&reqs) {
            if let Some(m) = r.and_then(|r| r.allowed.as_ref()) {
                p.mask_off = end as u32;
                p.mask_len = m.words().len() as u32;
                end += m.words().len();
                masks.push(m.words());
            }
        }
        let r = (|| {
            if held.rows.iter().any(Option::is_some) {
                self.stage_sampling(&held.lay, &params, &hist, &masks)?;
                self.exec().enqueue_sampler(&held.lay)?;
            }
            self.push_flight(held.rows)
        })();
        if r.is_err() {
            self.pipe.drop_all();
        }
        r
    }

    /// Waits for the oldest step in flight and returns its samples.
    pub(super) fn collect_step(&mut self) -> Result<Vec<Option<SampledToken>>, BackendError> {
        let Some(f) = self.pipe.flights.pop_front() else {
            return Err(BackendError::InvalidBatch(
                "no launched step to collect".into(),
            ));
        };
        if let Some(ready) = f.ready {
            return Ok(ready);
        }
        if let Err(e) = self.pipe.fences[f.slot].wait() {
            self.pipe.drop_all();
            return Err(dev_err("running a step", e));
        }
        Ok(read(&self.ws.host_out[f.slot], &f.rows))
    }
}
