//! Captured CUDA graphs of pure-decode steps, one per bucket.
//!
//! Contract: a bucket is (batch, block-table row length, sampler inside),
//! batch and row length powers of two (rows from [`MIN_GRAPH_BLOCKS`] up to
//! the longest context); its graph bakes in the bucket's fixed [`Layout`],
//! and rows past the real batch are padded to a scratch slot / block no
//! sequence reads. A bucket is captured on first use, or, while a captured
//! bucket up to 4x its batch can serve it padded, once it has been asked
//! for [`CAPTURE_AFTER`] times (GEMV-sized buckets at once: a padded cuBLAS
//! replay costs them up to half a step). Capture happens only between
//! launches; a failed capture turns graphs off with a warning and the step
//! runs eagerly. Graphs with and without the sampler (held steps) are kept
//! apart, and so are graphs with and without LoRA adapter rows: a step of
//! the base model alone replays a graph without any LoRA kernel, a step
//! with adapter rows one that runs the deltas of every row, reading each
//! row's slot from the staged table (padded rows: 0, the base model), so
//! any mix of adapters replays the same graph. Costs: capture + instantiate once per bucket (~10 ms at batch
//! 128), one graph launch per step.

use std::collections::HashMap;

use gpu::Graph;
use kernels::persistent::PersistentProgram;

use contract::backend::{BackendError, StepBatch};

use super::plan::{StepKind, StepPlan, StepShape};
use super::run::Sampling;
use super::staging::Layout;
use super::workspace::Caps;
use super::{CudaBackend, GRAPH_HISTORY, MAX_GRAPH_BATCH, dev_err};

/// Shortest block-table row of a graph bucket.
const MIN_GRAPH_BLOCKS: usize = 16;
/// Steps a bucket is asked for before it is captured while a captured bucket
/// up to 4x its batch can serve it padded (a capture costs ~10 ms at batch
/// 128; a padded replay a fraction of a millisecond).
const CAPTURE_AFTER: u32 = 16;

/// (batch bucket, block-table row bucket, sampler inside, LoRA rows).
type Key = (usize, usize, bool, bool);

/// A bucket's graph and the persistent kernel's program it launches (the
/// ops it points at live as long as the graph).
pub(super) struct Captured {
    graph: Graph,
    /// Held as long as the graph, which points at its ops and counters.
    layers: Option<PersistentProgram>,
}

/// The captured graphs and how often each bucket was asked for.
pub(super) struct DecodeGraphs {
    pub(super) graphs: HashMap<Key, Captured>,
    uses: HashMap<(usize, usize), u32>,
    enabled: bool,
    /// Longest block-table row of a bucket: `ceil(longest context / block_size)`.
    max_blocks: usize,
    /// Why the capture that turned graphs off failed.
    pub(super) failure: Option<String>,
}

impl DecodeGraphs {
    pub fn new(enabled: bool, max_blocks: usize) -> DecodeGraphs {
        DecodeGraphs {
            graphs: HashMap::new(),
            uses: HashMap::new(),
            enabled,
            max_blocks: max_blocks.max(MIN_GRAPH_BLOCKS),
            failure: None,
        }
    }

    /// Drops every graph (they point into buffers about to be replaced).
    pub fn clear(&mut self) {
        self.graphs.clear();
        self.uses.clear();
    }

    pub fn set_enabled(&mut self, enabled: bool) {
        self.enabled = enabled;
        if !enabled {
            self.clear();
        }
    }

    pub fn len(&self) -> usize {
        self.graphs.len()
    }

    /// Graphs whose layers run on the persistent kernel.
    pub fn persistent(&self) -> usize {
        self.graphs.values().filter(|c| c.layers.is_some()).count()
    }

    /// The persistent program of a graph of batch bucket `batch`, if any.
    pub fn persistent_program(&self, batch: usize) -> Option<&PersistentProgram> {
        (self.graphs.iter())
            .filter(|(key, _)| key.0 == batch)
            .find_map(|(_, c)| c.layers.as_ref())
    }

    /// The bucket that runs a pure-decode step of `s` sequences with
    /// block-table rows of `max_blocks` (module doc), or `None` when graphs
    /// cannot serve it.
    fn bucket(
        &mut self,
        s: usize,
        max_blocks: usize,
        sample: bool,
        lora: bool,
        gemv_rows: usize,
    ) -> Option<Key> {
        if !self.enabled || s > MAX_GRAPH_BATCH {
            return None;
        }
        let sb = s.next_power_of_two();
        // rows as long as the batch needs, in powers of two: a bucket of the
        // longest possible context would stage S x 8,192 words a step at 131k
        let mb = max_blocks
            .next_power_of_two()
            .clamp(MIN_GRAPH_BLOCKS, self.max_blocks);
        let uses = self.uses.entry((sb, mb)).or_insert(0);
        *uses = uses.saturating_add(1);
        let own = (sb, mb, sample, lora);
        if self.graphs.contains_key(&own) || *uses >= CAPTURE_AFTER || sb <= gemv_rows {
            return Some(own);
        }
        let padded = [2, 4]
            .into_iter()
            .map(|k| (sb * k, mb, sample, lora))
            .find(|b| b.0 <= MAX_GRAPH_BATCH && self.graphs.contains_key(b));
        Some(padded.unwrap_or(own))
    }
}

impl CudaBackend {
    /// Runs a pure-decode step from its bucket's graph (capturing it when
    /// due). Returns the layout it staged, or `None`, having done nothing,
    /// when this step cannot use one.
    pub(super) fn run_graph(
        &mut self,
        batch: &StepBatch,
        smp: &Sampling<'_>,
        carry: &[(u32, u32)],
    ) -> Result<Option<Layout>, BackendError> {
        let s = batch.num_seqs();
        if !batch.is_pure_decode() || smp.hist_cap > GRAPH_HISTORY {
            return Ok(None);
        }
        let gemv_rows = self.tuning.gemv_rows;
        let lora = super::run::has_lora(batch);
        let Some(key) = self
            .graphs
            .bucket(s, batch.max_blocks, smp.now, lora, gemv_rows)
        else {
            return Ok(None);
        };
        let (sb, mb, sample, _) = key;
        let lay = Layout::new(sb, sb, mb, sb, GRAPH_HISTORY);
        self.ensure(Caps {
            tokens: sb,
            rows: sb,
            decode_seqs: sb,
            meta: lay.total,
        })?;
        let rows: Vec<u32> = (0..s as u32).collect();
        self.stage(&lay, batch, &rows, smp.params, smp.hist, carry, true)?;
        let shape = StepShape {
            t: sb,
            s: sb,
            r: sb,
            max_blocks: mb,
            kind: StepKind::Decode,
            identity_rows: true,
            lora,
        };
        let plan = StepPlan::new(&self.tuning, &self.k, shape);
        if !self.graphs.graphs.contains_key(&key) && !self.capture(key, &lay, &plan)? {
            // capture failed: graphs are off, this step runs eagerly
            self.exec().enqueue(&lay, &plan, sample, None)?;
            return Ok(Some(lay));
        }
        match self.graphs.graphs.get(&key) {
            Some(c) => c
                .graph
                .launch(&self.gpu)
                .map_err(|e| dev_err("replaying a decode graph", e))?,
            None => self.exec().enqueue(&lay, &plan, sample, None)?,
        }
        Ok(Some(lay))
    }

    /// One capture of the step staged at `lay` run as `plan` (its layers
    /// as `layers`, `sample`: with the sampler): the graph, or the capture's
    /// error and the step's own error when enqueueing it failed.
    fn try_capture(
        &self,
        lay: &Layout,
        plan: &StepPlan,
        sample: bool,
        layers: Option<&PersistentProgram>,
    ) -> (Result<Graph, gpu::GpuError>, Option<BackendError>) {
        let mut inner = None;
        let captured = Graph::capture(&self.gpu, || {
            self.exec().enqueue(lay, plan, sample, layers).map_err(|e| {
                let msg = e.to_string();
                inner = Some(e);
                gpu::GpuError::Buffer {
                    what: "decode graph capture".into(),
                    reason: msg,
                }
            })
        });
        (captured, inner)
    }

    /// Captures the graph of bucket `key` (staged at `lay`, run as `plan`,
    /// its layers on the persistent kernel where the plan allows, the
    /// kernel covers them and its launch captures; else on the per-kernel
    /// path); false when capture failed and graphs were turned off.
    fn capture(&mut self, key: Key, lay: &Layout, plan: &StepPlan) -> Result<bool, BackendError> {
        let t0 = std::time::Instant::now();
        let mut layers = match self.exec().record_layers(lay, plan)? {
            Ok(p) => Some(p),
            Err(why) => {
                if plan.persistent {
                    tracing::info!(reason = %why, "decode layers stay on the per-kernel path");
                }
                None
            }
        };
        let (mut captured, mut inner) = self.try_capture(lay, plan, key.2, layers.as_ref());
        if layers.is_some() && captured.is_err() {
            let why = inner.as_ref().map_or_else(
                || captured.as_ref().err().map(|e| e.to_string()),
                |e| Some(e.to_string()),
            );
            tracing::warn!(
                error = why.unwrap_or_default(),
                "capturing the persistent decode kernel failed; decode layers stay on the per-kernel path"
            );
            layers = None;
            (captured, inner) = self.try_capture(lay, plan, key.2, None);
        }
        let graph = match captured {
            Ok(graph) => graph,
            Err(e) => {
                if let Some(inner) = inner {
                    return Err(inner);
                }
                tracing::warn!(error = %e, "CUDA graph capture failed; running decode steps eagerly");
                self.graphs.set_enabled(false);
                self.graphs.failure = Some(e.to_string());
                return Ok(false);
            }
        };
        graph
            .upload()
            .map_err(|e| dev_err("uploading a decode graph", e))?;
        let persistent = layers.as_ref().map(|p| (p.ops(), p.blocks()));
        self.graphs.graphs.insert(key, Captured { graph, layers });
        tracing::info!(
            batch_bucket = key.0,
            persistent_ops = persistent.map(|p| p.0),
            persistent_blocks = persistent.map(|p| p.1),
            block_bucket = key.1,
            sampler = key.2,
            lora = key.3,
            graphs = self.graphs.len(),
            ms = t0.elapsed().as_secs_f64() * 1e3,
            "captured a CUDA decode graph"
        );
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_powers_of_two_and_small_ones_are_captured_at_once() {
        let mut g = DecodeGraphs::new(true, 512);
        assert_eq!(g.bucket(3, 20, true, false, 2), Some((4, 32, true, false)));
        assert_eq!(g.bucket(1, 1, false, false, 2), Some((1, 16, false, false)));
        assert_eq!(g.bucket(1, 1, false, true, 2), Some((1, 16, false, true)));
        assert_eq!(
            g.bucket(200, 5000, true, false, 2),
            Some((256, 512, true, false))
        );
        assert_eq!(g.bucket(257, 16, true, false, 2), None);
        g.set_enabled(false);
        assert_eq!(g.bucket(4, 16, true, false, 2), None);
    }

    #[test]
    fn a_new_bucket_gets_its_own_graph_after_enough_steps() {
        // nothing captured: every bucket is its own from the first step
        let mut g = DecodeGraphs::new(true, 64);
        for _ in 0..CAPTURE_AFTER + 1 {
            assert_eq!(
                g.bucket(20, 16, true, false, 2),
                Some((32, 16, true, false))
            );
        }
    }
}
