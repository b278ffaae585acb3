//! Running a step: growing the workspace, staging the metadata, and either
//! replaying the pure-decode graph of the batch's bucket (captured on first
//! use) or enqueueing the kernels eagerly.
//!
//! Contract: growth and capture happen only between launches (growth drops
//! the graphs, which point into the old buffers; it waits for the steps in
//! flight, reads their samples, and carries the last step's sampled ids over
//! to the new buffers); a failed capture turns graphs off with a warning and
//! the step runs eagerly; row capacities grow by powers of two. The pinned
//! staging buffer is rewritten only once the previous step's copy of it has
//! run (a fence). Costs: one host-to-device copy of the staging buffer per
//! step; capture + instantiate once per bucket.

use gpu::Graph;
use kernels::SampleParams;

use super::forward::{Attn, Caps, Workspace};
use super::staging::PARAM_WORDS;
use super::staging::{Layout, Pad, pack};
use super::{
    CAPTURE_AFTER, CudaBackend, GRAPH_HISTORY, MAX_GRAPH_BATCH, MIN_GRAPH_BLOCKS, RESERVE_BLOCKS,
    dev_err,
};
use contract::backend::{BackendError, StepBatch};

impl CudaBackend {
    /// Grows the workspace to hold `need` (dropping captured graphs, which
    /// point into the old buffers). Never called inside a capture.
    fn ensure(&mut self, need: Caps) -> Result<(), BackendError> {
        let have = self.ws.caps;
        if need.tokens <= have.tokens
            && need.rows <= have.rows
            && need.decode_seqs <= have.decode_seqs
            && need.meta <= have.meta
        {
            return Ok(());
        }
        self.graphs.clear();
        self.bucket_uses.clear();
        self.gpu
            .synchronize()
            .map_err(|e| dev_err("growing the workspace", e))?;
        // the steps in flight are done: their samples leave the old buffers
        self.harvest();
        // Grown row counts round up to a power of two: sampled rows that grow
        // by a few each step (decode rows joining mixed steps) would otherwise
        // reallocate every buffer, pinned ones included, and drop the graphs
        // every step (~15 ms each at 8,192 tokens). Tokens grow exactly (the
        // step budget caps them; rounding would double the largest buffers).
        let grow = |need: usize, have: usize| {
            if need <= have {
                have
            } else {
                need.next_power_of_two()
            }
        };
        let caps = Caps {
            tokens: need.tokens.max(have.tokens),
            rows: grow(need.rows, have.rows),
            decode_seqs: grow(need.decode_seqs, have.decode_seqs),
            meta: grow(need.meta, have.meta),
        };
        let ws = Workspace::new(&self.gpu, &self.config, self.shape, self.plan, caps)?;
        let old = std::mem::replace(&mut self.ws, ws);
        // the next step may carry tokens the last one sampled into `tok`
        let n = old.tok.len().min(self.ws.tok.len());
        let copy = |old: &Workspace, ws: &Workspace| -> Result<(), gpu::GpuError> {
            self.gpu
                .copy_device(old.tok.slice(0..n)?, ws.tok.slice(0..n)?)?;
            self.gpu.synchronize()
        };
        copy(&old, &self.ws).map_err(|e| dev_err("growing the workspace", e))?;
        Ok(())
    }

    /// Sizes the workspace for eager steps of up to `max_tokens` tokens and
    /// `max_seqs` sequences and for the decode graphs of up to `max_seqs`
    /// (block-table rows of [`RESERVE_BLOCKS`]; longer ones grow it later).
    pub(super) fn reserve_steps(
        &mut self,
        max_tokens: usize,
        max_seqs: usize,
    ) -> Result<(), BackendError> {
        let seqs = max_seqs.max(1).next_power_of_two();
        let eager = Layout::new(max_tokens, max_seqs, RESERVE_BLOCKS, max_seqs, 0);
        let graph = Layout::new(seqs, seqs, RESERVE_BLOCKS, seqs, GRAPH_HISTORY);
        self.ensure(Caps {
            tokens: max_tokens.max(seqs),
            rows: seqs,
            decode_seqs: seqs,
            meta: eager.total.max(graph.total),
        })
    }

    /// Stages `batch` at `lay` and copies the staging buffer to the device.
    #[allow(clippy::too_many_arguments)]
    fn stage(
        &mut self,
        lay: &Layout,
        batch: &StepBatch,
        rows: &[u32],
        params: &[SampleParams],
        hist: &[u32],
        carry: &[(u32, u32)],
        pad: bool,
    ) -> Result<(), BackendError> {
        let pad = pad.then_some(Pad {
            block: self.kv.num_blocks as u32,
            block_size: self.kv.block_size as u32,
        });
        // the previous step's copy of the pinned buffer must have run
        self.meta_fence
            .wait()
            .map_err(|e| dev_err("waiting for the last staging copy", e))?;
        pack(
            self.ws.host_meta.as_mut_slice(),
            lay,
            batch,
            rows,
            params,
            hist,
            carry,
            pad,
        );
        // Only the used prefix: a graph bucket's history capacity is mostly empty.
        let used = lay.history + hist.len().max(1);
        let dst = self
            .ws
            .meta
            .slice(0..used)
            .map_err(|e| dev_err("staging", e))?;
        self.gpu
            .copy_to_device(&self.ws.host_meta.as_slice()[..used], dst)
            .map_err(|e| dev_err("copying step metadata", e))?;
        self.meta_fence
            .record()
            .map_err(|e| dev_err("copying step metadata", e))
    }

    /// Runs a pure-decode step from its bucket's graph (capturing it on first
    /// use, or on its `CAPTURE_AFTER`-th while a larger captured bucket serves
    /// it padded; graphs with and without the sampler are kept apart).
    /// Returns the layout it staged, or `None`, having done nothing, when
    /// this step cannot use one.
    pub(super) fn run_graph(
        &mut self,
        batch: &StepBatch,
        smp: &Sampling<'_>,
        carry: &[(u32, u32)],
    ) -> Result<Option<Layout>, BackendError> {
        let s = batch.num_seqs();
        if !self.graphs_enabled
            || !batch.is_pure_decode()
            || s > MAX_GRAPH_BATCH
            || smp.hist_cap > GRAPH_HISTORY
        {
            return Ok(None);
        }
        let sample = smp.now;
        let sb = s.next_power_of_two();
        // Block-table rows as long as the batch needs, in powers of two: a
        // bucket of the longest possible context would stage (and copy)
        // S x 8,192 words a step at 131k positions.
        let mb = batch.max_blocks.next_power_of_two().clamp(
            MIN_GRAPH_BLOCKS,
            self.graph_max_blocks.max(MIN_GRAPH_BLOCKS),
        );
        // This bucket's graph once captured. Before that, a captured bucket
        // with the same block rows and up to 4x the batch replays it padded,
        // until the bucket has been asked for CAPTURE_AFTER times: a batch
        // shrinking through a bucket for a few steps (the tail of a burst)
        // does not pay a capture; one that stays gets its own graph.
        let uses = self.bucket_uses.entry((sb, mb)).or_insert(0);
        *uses = uses.saturating_add(1);
        // (Not for buckets on the fused GEMV path: a padded cuBLAS replay
        // costs those up to half a step.)
        let key = if self.graphs.contains_key(&(sb, mb, sample))
            || *uses >= CAPTURE_AFTER
            || sb <= self.gemv_rows
        {
            (sb, mb, sample)
        } else {
            [2, 4]
                .into_iter()
                .map(|k| (sb * k, mb, sample))
                .find(|b| b.0 <= MAX_GRAPH_BATCH && self.graphs.contains_key(b))
                .unwrap_or((sb, mb, sample))
        };
        let (sb, mb, _) = key;
        let lay = Layout::new(sb, sb, mb, sb, GRAPH_HISTORY);
        self.ensure(Caps {
            tokens: sb,
            rows: sb,
            decode_seqs: sb,
            meta: lay.total,
        })?;
        let rows: Vec<u32> = (0..s as u32).collect();
        self.stage(&lay, batch, &rows, smp.params, smp.hist, carry, true)?;
        if !self.graphs.contains_key(&key) {
            let t0 = std::time::Instant::now();
            let mut inner = None;
            let captured = Graph::capture(&self.gpu, || {
                self.enqueue(&lay, Attn::Decode, sample, true).map_err(|e| {
                    let msg = e.to_string();
                    inner = Some(e);
                    gpu::GpuError::Buffer {
                        what: "decode graph capture".into(),
                        reason: msg,
                    }
                })
            });
            match captured {
                Ok(graph) => {
                    graph
                        .upload()
                        .map_err(|e| dev_err("uploading a decode graph", e))?;
                    self.graphs.insert(key, graph);
                    // captured on first use of each bucket, between steps
                    tracing::info!(
                        batch_bucket = sb,
                        block_bucket = mb,
                        sampler = sample,
                        graphs = self.graphs.len(),
                        ms = t0.elapsed().as_secs_f64() * 1e3,
                        "captured a CUDA decode graph"
                    );
                }
                Err(e) => {
                    if let Some(inner) = inner {
                        return Err(inner);
                    }
                    tracing::warn!(error = %e, "CUDA graph capture failed; running decode steps eagerly");
                    self.graphs_enabled = false;
                    self.enqueue(&lay, Attn::Decode, sample, true)?;
                    return Ok(Some(lay));
                }
            }
        }
        match self.graphs.get(&key) {
            Some(graph) => graph
                .launch(&self.gpu)
                .map_err(|e| dev_err("replaying a decode graph", e))?,
            None => self.enqueue(&lay, Attn::Decode, sample, true)?,
        }
        Ok(Some(lay))
    }

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
        let decode = batch.is_pure_decode();
        self.ensure(Caps {
            tokens: t,
            rows: rows.len().max(1),
            decode_seqs: if decode { s } else { 1 },
            meta: lay.total,
        })?;
        self.stage(&lay, batch, rows, smp.params, smp.hist, carry, false)?;
        let attn = if decode {
            Attn::Decode
        } else {
            let lens = batch.cu_seqlens.windows(2).map(|w| (w[1] - w[0]) as usize);
            let max_seqlen = lens.clone().max().unwrap_or(0);
            let singles = lens.filter(|&n| n == 1).count();
            Attn::Prefill {
                max_seqlen,
                singles,
            }
        };
        let identity = rows.iter().enumerate().all(|(i, &r)| r as usize == i);
        self.enqueue(&lay, attn, smp.now, identity)?;
        Ok(lay)
    }

    /// Stages the final sampling parameters and history of a held step
    /// laid out at `lay` (`params` of its first rows, padded rows keeping
    /// theirs; the history words `hist`, then each of `masks` in turn, as
    /// the params' offsets say) and copies them to the device behind its
    /// forward pass.
    pub(super) fn stage_sampling(
        &mut self,
        lay: &Layout,
        params: &[SampleParams],
        hist: &[u32],
        masks: &[&[u32]],
    ) -> Result<(), BackendError> {
        let words = hist.len() + masks.iter().map(|m| m.len()).sum::<usize>();
        if words > lay.hist_cap || params.len() > lay.r {
            return Err(BackendError::InvalidBatch(format!(
                "release: {} sampler rows and {words} history words where the held step laid out {} and {}",
                params.len(),
                lay.r,
                lay.hist_cap
            )));
        }
        // the last release's copy must have run (long since: a step ago)
        self.release_fence
            .wait()
            .map_err(|e| dev_err("waiting for the last sampling copy", e))?;
        // params, padded rows' params (as the launch staged them) and
        // history are contiguous: one copy of `from..to`
        let (from, to) = (lay.params, lay.history + words.max(1));
        let buf = self.ws.host_release.as_mut_slice();
        buf[from..lay.history].copy_from_slice(&self.ws.host_meta.as_slice()[from..lay.history]);
        for (i, p) in params.iter().enumerate() {
            let dst = lay.params + i * PARAM_WORDS;
            buf[dst..dst + PARAM_WORDS]
                .copy_from_slice(bytemuck::cast_slice(std::slice::from_ref(p)));
        }
        let mut at = lay.history;
        for part in std::iter::once(hist).chain(masks.iter().copied()) {
            buf[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
        let dst = self
            .ws
            .meta
            .slice(from..to)
            .map_err(|e| dev_err("staging", e))?;
        self.gpu
            .copy_to_device(&self.ws.host_release.as_slice()[from..to], dst)
            .map_err(|e| dev_err("copying sampling parameters", e))?;
        self.release_fence
            .record()
            .map_err(|e| dev_err("copying sampling parameters", e))
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
