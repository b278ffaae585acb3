//! The CUDA backend: the Llama forward pass on an NVIDIA GPU through our own
//! kernels (crate `kernels`) and cuBLAS (crate `gpu`).
//!
//! Contract: [`CudaBackend`] implements [`Backend`] exactly like the CPU
//! backend: any [`StepBatch`] passing [`CudaBackend::check_batch`] runs;
//! anything else is a [`BackendError::InvalidBatch`] naming the field, never a
//! panic; device failures are [`BackendError::Device`] naming the operation.
//! Weights are uploaded once as bf16 (Q/K/V and gate/up fused, tied head =
//! embedding); the KV pool is bf16 on the device. Logits are computed only
//! for the rows that are sampled (gathered before the LM head), and sampling
//! runs on the GPU with the procedure of [`contract::sampling`]. A pure-decode
//! step is replayed from a CUDA graph captured once per bucket of batch size
//! (powers of two up to [`MAX_GRAPH_BATCH`]) and block-table row length
//! (powers of two from 16 blocks to the longest context); padded rows write to a scratch
//! KV block no sequence reads. `LAMINA_CUDA_GRAPHS=0` turns graphs off;
//! `LAMINA_GEMV_ROWS=n` sets the largest step run on the fused GEMV
//! projections (0: cuBLAS always), `LAMINA_PDL=0` turns programmatic
//! dependent launch off.
//! [`available`] says why CUDA cannot be used, without panicking.
//!
//! Steps are pipelined (`pipeline`): a launch enqueues a step and the
//! copy of its samples, a collect waits for that copy alone, and tokens
//! carried from the previous launch are read on the device. A held launch
//! enqueues the forward pass alone (a decode graph without the sampler);
//! its release stages the final sampling parameters and grammar masks and
//! enqueues the sampler.
//!
//! Costs: one host-to-device copy of the packed metadata, the kernels (or one
//! graph launch) and one device-to-host copy of the sampled tokens per step,
//! with one fence wait per collect. Memory: see `weights` and `forward`.

mod forward;
mod pipeline;
mod run;
mod staging;
mod weights;

#[cfg(test)]
mod tests;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use gpu::{Blas, DeviceBuffer, Fence, Gpu, Graph};
use kernels::{DecodePlan, HeadShape, Kernels, SampleParams};

use checkpoint::weights::LlamaWeights;
use contract::backend::{Backend, BackendError, KvShape, SampleRequest, SampledToken, StepBatch};
use contract::config::LlamaConfig;
use forward::{Caps, Workspace};
use pipeline::{Flight, Held};
use weights::{DeviceWeights, KvCache, upload_weights};

/// Largest pure-decode batch replayed from a captured graph.
pub const MAX_GRAPH_BATCH: usize = 256;
/// Shortest block-table row of a graph bucket (rows are powers of two from
/// here up to `graph_max_blocks`).
const MIN_GRAPH_BLOCKS: usize = 16;
/// Steps a bucket is asked for before it is captured while a captured bucket
/// up to 4x its batch can serve it padded (a capture costs ~10 ms at batch
/// 128; a padded replay a fraction of a millisecond).
const CAPTURE_AFTER: u32 = 16;
/// Block-table row length [`CudaBackend::reserve_steps`] sizes the staging for.
const RESERVE_BLOCKS: usize = 128;
/// `u32` words of history a graph bucket can stage: repetition-penalty ids,
/// additive terms and grammar masks (`V / 32` words per constrained row:
/// 256 rows of a 128k vocabulary fit). 4 MiB of staging, of which a step
/// copies only the used prefix.
const GRAPH_HISTORY: usize = 1 << 20;

/// `Ok` when this binary carries CUDA kernels and a CUDA driver with a
/// device is present; otherwise the reason and how to fix it.
pub fn available() -> Result<(), String> {
    if let Some(why) = kernels::unavailable_reason() {
        return Err(why);
    }
    gpu::driver_available().map_err(|e| format!("no CUDA driver found: {e}"))
}

/// How many CUDA devices can run the backend (after [`available`]'s checks).
pub fn device_count() -> Result<usize, String> {
    available()?;
    gpu::device_count()
}

pub(crate) fn dev_err(what: &str, e: impl std::fmt::Display) -> BackendError {
    BackendError::Device(format!("cuda: {what}: {e}"))
}

/// Steps of at most this many tokens use the fused GEMV projections by
/// default: at more rows the GEMVs (which re-read their inputs per warp) lose
/// to cuBLAS plus the unfused norm / SiLU kernels (H200, Llama-3.2-1B).
const DEFAULT_GEMV_ROWS: usize = 2;
/// The LM head runs as a GEMV only for this many rows (at one row it matches
/// cuBLAS; beyond, cuBLAS wins).
const HEAD_GEMV_ROWS: usize = 1;

/// Largest step run on the GEMV projections: `LAMINA_GEMV_ROWS` (0 = always
/// cuBLAS, at most [`kernels::gemv::MAX_ROWS`]) or [`DEFAULT_GEMV_ROWS`];
/// 0 when an input width is not a multiple of 8 (the GEMVs' 16-byte loads).
fn gemv_rows(c: &LlamaConfig) -> usize {
    let rows = std::env::var("LAMINA_GEMV_ROWS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(DEFAULT_GEMV_ROWS)
        .min(kernels::gemv::MAX_ROWS);
    let fits = [c.hidden_size, c.q_dim(), c.intermediate_size]
        .iter()
        .all(|k| k.is_multiple_of(8));
    if fits { rows } else { 0 }
}

/// Decode steps of at least this many sequences run attention on the narrow
/// tensor-core flash kernel instead of the split-KV decode kernel:
/// `LAMINA_NARROW_DECODE_SEQS` (0 = never), by default from the point where
/// the decode plan stops splitting keys (`seqs * kv_heads >= 2 * SMs`: one
/// block per (sequence, KV head) fills the GPU).
fn narrow_decode_seqs(num_kv_heads: usize, sms: usize) -> usize {
    match std::env::var("LAMINA_NARROW_DECODE_SEQS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    {
        Some(0) => usize::MAX,
        Some(n) => n,
        None => (2 * sms).div_ceil(num_kv_heads.max(1)),
    }
}

/// The CUDA backend (see the module doc).
pub struct CudaBackend {
    config: LlamaConfig,
    kv: KvShape,
    device: usize,
    shape: HeadShape,
    plan: DecodePlan,
    /// Rows of the RoPE table = longest context: min(max_position_embeddings, pool slots).
    rope_rows: usize,
    /// Longest block-table row of a graph bucket: `ceil(rope_rows / block_size)`.
    graph_max_blocks: usize,
    /// Captured decode graphs by (batch bucket, block-table row bucket,
    /// sampler inside: false for the forward pass of held steps).
    graphs: HashMap<(usize, usize, bool), Graph>,
    /// Steps that asked for each bucket (see `run_graph`'s capture policy).
    bucket_uses: HashMap<(usize, usize), u32>,
    graphs_enabled: bool,
    /// Steps of at most this many tokens use the fused GEMV projections
    /// (see [`gemv_rows`]); the LM head for at most `min(gemv_rows, HEAD_GEMV_ROWS)` rows.
    gemv_rows: usize,
    /// Decode steps of at least this many sequences use the narrow flash
    /// kernel for attention (see [`narrow_decode_seqs`]).
    narrow_decode_seqs: usize,
    ws: Workspace,
    /// Launched steps not collected yet, oldest first.
    flights: VecDeque<Flight>,
    /// The held step (`Backend::launch_held`), not released yet.
    held: Option<Held>,
    /// The pinned output slot of the next launch (0 or 1).
    next_slot: usize,
    /// Fences after each slot's sample copies.
    fences: [Fence; 2],
    /// Fence after the last copy of the pinned staging buffer.
    meta_fence: Fence,
    /// Fence after the last copy of a held step's sampling staging.
    release_fence: Fence,
    /// `[S]` of the last launch: the sampler row holding each sequence's
    /// sample (`staging::NO_CARRY` where none), for carried tokens.
    prev_rows: Vec<u32>,
    rope_cos: DeviceBuffer<f32>, // [rope_rows, head_dim / 2]
    rope_sin: DeviceBuffer<f32>, // [rope_rows, head_dim / 2]
    cache: KvCache,
    w: DeviceWeights,
    blas: Blas,
    k: Kernels,
    gpu: Arc<Gpu>,
}

impl CudaBackend {
    /// Uploads `weights` to device `device` and allocates a KV pool of
    /// `kv.num_blocks` blocks of `kv.block_size` tokens.
    pub fn new(
        config: LlamaConfig,
        weights: &LlamaWeights,
        kv: KvShape,
        device: usize,
    ) -> Result<CudaBackend, BackendError> {
        available().map_err(BackendError::Device)?;
        if kv.num_blocks == 0 || kv.block_size == 0 {
            return Err(BackendError::Device(format!(
                "cuda: KV pool needs num_blocks > 0 and block_size > 0, got {kv:?}"
            )));
        }
        let gpu = Gpu::new(device).map_err(|e| dev_err(&format!("opening device {device}"), e))?;
        let k = Kernels::load(&gpu, crate::kernel_options())
            .map_err(|e| dev_err("loading kernels", e))?;
        let blas = Blas::new(&gpu).map_err(|e| dev_err("creating the cuBLAS handle", e))?;
        let shape = HeadShape {
            num_heads: config.num_heads,
            num_kv_heads: config.num_kv_heads,
            head_dim: config.head_dim,
        };
        let rope_rows = config
            .max_position_embeddings
            .min(kv.num_blocks * kv.block_size);
        // two waves of blocks: enough to hide the latency of short contexts
        let sms = gpu
            .sm_count()
            .map_err(|e| dev_err("querying the SM count", e))?;
        let plan =
            DecodePlan::new(shape, 2 * sms).map_err(|e| dev_err("planning decode attention", e))?;
        let (cos, sin) = config.rope_table(rope_rows);
        let rope_cos = gpu
            .upload(&cos)
            .map_err(|e| dev_err("uploading the RoPE table", e))?;
        let rope_sin = gpu
            .upload(&sin)
            .map_err(|e| dev_err("uploading the RoPE table", e))?;
        let w = upload_weights(&gpu, &config, weights)?;
        let cache = KvCache::new(&gpu, &config, kv)?;
        let caps = Caps {
            tokens: 16,
            rows: 1,
            decode_seqs: 1,
            meta: 1024,
        };
        let ws = Workspace::new(&gpu, &config, shape, plan, caps)?;
        let fence = || gpu.fence().map_err(|e| dev_err("creating events", e));
        let (fences, meta_fence, release_fence) = ([fence()?, fence()?], fence()?, fence()?);
        gpu.synchronize().map_err(|e| dev_err("initialising", e))?;
        Ok(CudaBackend {
            graph_max_blocks: rope_rows.div_ceil(kv.block_size),
            graphs_enabled: std::env::var("LAMINA_CUDA_GRAPHS").map_or(true, |v| v != "0"),
            graphs: HashMap::new(),
            bucket_uses: HashMap::new(),
            gemv_rows: gemv_rows(&config),
            narrow_decode_seqs: narrow_decode_seqs(config.num_kv_heads, sms),
            config,
            kv,
            device,
            shape,
            plan,
            rope_rows,
            ws,
            flights: VecDeque::new(),
            held: None,
            next_slot: 0,
            fences,
            meta_fence,
            release_fence,
            prev_rows: Vec::new(),
            rope_cos,
            rope_sin,
            cache,
            w,
            blas,
            k,
            gpu,
        })
    }

    /// Turns graph capture/replay of pure-decode steps on or off (tests compare both).
    pub fn set_graphs(&mut self, enabled: bool) {
        self.graphs_enabled = enabled;
        if !enabled {
            self.graphs.clear();
        }
    }

    /// Number of captured decode graphs (one per bucket seen).
    pub fn num_graphs(&self) -> usize {
        self.graphs.len()
    }

    /// [`StepBatch::check`] with what this backend indexes with: token ids
    /// below the vocabulary, positions below the RoPE table (the longest
    /// context), and every block attention reads inside the pool.
    pub fn check_batch(&self, batch: &StepBatch) -> Result<(), BackendError> {
        batch.check(self.kv, self.config.vocab_size, self.rope_rows)
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> String {
        format!("cuda:{}", self.device)
    }

    fn config(&self) -> &LlamaConfig {
        &self.config
    }

    fn kv_shape(&self) -> KvShape {
        self.kv
    }

    fn reserve(&mut self, max_tokens: usize, max_seqs: usize) -> Result<(), BackendError> {
        self.reserve_steps(max_tokens, max_seqs)
    }

    fn pipelines(&self) -> bool {
        true
    }

    fn launch(&mut self, batch: &StepBatch) -> Result<(), BackendError> {
        self.launch_step(batch, false)
    }

    fn launch_held(&mut self, batch: &StepBatch) -> Result<(), BackendError> {
        self.launch_step(batch, true)
    }

    fn release(&mut self, samples: &[Option<SampleRequest>]) -> Result<(), BackendError> {
        self.release_step(samples)
    }

    fn collect(&mut self) -> Result<Vec<Option<SampledToken>>, BackendError> {
        self.collect_step()
    }

    fn step(&mut self, batch: &StepBatch) -> Result<Vec<Option<SampledToken>>, BackendError> {
        self.require_idle("a plain step")?;
        self.launch_step(batch, false)?;
        self.collect_step()
    }

    fn logits(&mut self, batch: &StepBatch, rows: &[usize]) -> Result<Vec<f32>, BackendError> {
        self.require_idle("a logits call")?;
        self.check_batch(batch)?;
        if !batch.carried.is_empty() {
            return Err(BackendError::InvalidBatch(
                "a logits call cannot carry tokens from a launched step".into(),
            ));
        }
        let t = batch.num_tokens();
        if let Some(r) = rows.iter().find(|&&r| r >= t) {
            return Err(BackendError::InvalidBatch(format!(
                "logits row {r} is outside the step's {t} tokens"
            )));
        }
        if rows.is_empty() {
            let none = [0u32];
            let greedy = [SampleParams::greedy()];
            self.run_eager(batch, &none, &run::Sampling::none(&greedy), &[])?;
            self.gpu
                .synchronize()
                .map_err(|e| dev_err("running a step", e))?;
            return Ok(Vec::new());
        }
        let rows32: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
        let params = vec![SampleParams::greedy(); rows.len()];
        self.run_eager(batch, &rows32, &run::Sampling::none(&params), &[])?;
        let n = rows.len() * self.config.vocab_size;
        let view = self
            .ws
            .logits
            .slice(0..n)
            .map_err(|e| dev_err("reading logits", e))?;
        self.gpu
            .to_host(view)
            .map_err(|e| dev_err("reading logits", e))
    }
}
