//! The step workspace: activations, staging and sample outputs, allocated
//! once per capacity and grown between launches.
//!
//! Contract: growth happens only between launches (it drops the captured
//! graphs, which point into the old buffers; it waits for the steps in
//! flight, reads their samples, and carries the last step's sampled ids
//! over to the new buffers); row capacities grow by powers of two, token
//! capacity exactly.
//! Costs: `T_cap * (hidden * 10 + qkv + 3 * intermediate) * 2` bytes +
//! `R_cap * vocab * 8` bytes (logits and the sampler's scratch) + decode
//! partials `max_S(S * splits(S)) * heads * (head_dim + 2) * 4` bytes
//! (about `2 * SMs * group * (head_dim + 2) * 4`: a few hundred KiB; in
//! deterministic mode `T_cap * 8 * heads * (head_dim + 2) * 4`, 0.55 GB at
//! 8,192 tokens of Llama-3.2-1B).

use gpu::{DeviceBuffer, Fence, Gpu, PinnedBuffer};
use half::bf16;
use kernels::sampling::SampleScratch;

use contract::backend::BackendError;
use contract::config::ModelConfig;
use contract::sampling::MAX_LOGPROBS;

use super::lora::Group;
use super::plan::Tuning;
use super::staging::Layout;
use super::{CudaBackend, GRAPH_HISTORY, RESERVE_BLOCKS, dev_err};

/// Capacities a [`Workspace`] was allocated for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Caps {
    pub tokens: usize,
    pub rows: usize,
    pub decode_seqs: usize,
    pub meta: usize,
}

/// Activations, staging and outputs, allocated once per capacity.
pub(super) struct Workspace {
    pub caps: Caps,
    pub x: DeviceBuffer<f32>,      // [T, hidden] residual stream
    pub xn: DeviceBuffer<bf16>,    // [T, hidden] normed
    pub qkv: DeviceBuffer<bf16>,   // [T, qkv_width]
    pub attn: DeviceBuffer<bf16>,  // [T, heads * head_dim]
    pub delta: DeviceBuffer<bf16>, // [T, hidden] o / down projection output
    pub gu: DeviceBuffer<bf16>,    // [T, 2 * intermediate]
    pub act: DeviceBuffer<bf16>,   // [T, intermediate]
    pub lora_h: DeviceBuffer<f32>, // [T, 3 * LoRA rank] (1 element without LoRA)
    /// Every slot's shrink on the tensor-core LoRA path, f32 and selected
    /// bf16: `[W, slots * 3 * rank]` each, `W = lora::wide_rows(T, ..)`
    /// (1 element without that path).
    pub lora_wide: DeviceBuffer<f32>,
    pub lora_wide_b: DeviceBuffer<bf16>,
    /// The GEMV path's shrink counters, one per layer and LoRA group (zeroed
    /// by each step with adapter rows; 1 element without LoRA).
    pub lora_ready: DeviceBuffer<u32>,
    /// FP8 weights on cuBLASLt only (else empty): a GEMM's input rows
    /// quantised to e4m3 and their scales.
    pub xq: DeviceBuffer<u8>, // [T, max(hidden, q_dim, intermediate)]
    pub xs8: DeviceBuffer<f32>,      // [T]
    pub part_o: DeviceBuffer<f32>,   // [S_dec, heads, splits, head_dim]
    pub part_ml: DeviceBuffer<f32>,  // [S_dec, heads, splits, 2]
    pub part_cnt: DeviceBuffer<u32>, // [S_dec, kv_heads] split arrival counters (zero)
    /// The QKV GEMV's per-head arrival counters when the K cache rotates
    /// (zero, left zero by each launch).
    pub rot_ready: DeviceBuffer<u32>, // [heads + kv_heads]
    pub xs: DeviceBuffer<bf16>,      // [R, hidden] rows to sample
    pub logits: DeviceBuffer<f32>,   // [R, vocab]
    pub work: DeviceBuffer<f32>,     // [R, vocab] sampler scratch
    pub samp_stats: DeviceBuffer<f32>, // [R, vocab / SLICE, 2] sampler partials
    pub samp_keys: DeviceBuffer<u64>, // [R, vocab / SLICE, 1 + MAX_LOGPROBS]
    pub tok: DeviceBuffer<u32>,      // [R]
    pub lp: DeviceBuffer<f32>,       // [R]
    pub top_ids: DeviceBuffer<u32>,  // [R, MAX_LOGPROBS]
    pub top_lps: DeviceBuffer<f32>,  // [R, MAX_LOGPROBS]
    pub meta: DeviceBuffer<u32>,     // staging, see Layout
    pub host_meta: PinnedBuffer<u32>,
    /// A held step's final sampling parameters and history, staged at
    /// release apart from `host_meta` (whose next packing must not wait for
    /// the held step's forward pass).
    pub host_release: PinnedBuffer<u32>,
    /// Two slots for the samples of two steps in flight (pipelined).
    pub host_out: [HostOut; 2],
    /// Recorded after the last copy of `host_meta` to the device.
    pub meta_fence: Fence,
    /// Recorded after the last copy of `host_release` to the device.
    pub release_fence: Fence,
}

/// Where a sampled sequence's samples are in a [`HostOut`]: its first
/// sampler row, its top-logprob count and the draft rows following that row.
pub(super) type OutRow = (usize, usize, usize);

/// Pinned copies of one step's samples.
pub(super) struct HostOut {
    pub tok: PinnedBuffer<u32>,     // [R]
    pub lp: PinnedBuffer<f32>,      // [R]
    pub top_ids: PinnedBuffer<u32>, // [R, MAX_LOGPROBS]
    pub top_lps: PinnedBuffer<f32>, // [R, MAX_LOGPROBS]
}

impl HostOut {
    fn new(gpu: &Gpu, r: usize) -> Result<HostOut, BackendError> {
        let e = |what: &'static str| {
            move |err: gpu::GpuError| dev_err(&format!("allocating the workspace ({what})"), err)
        };
        Ok(HostOut {
            tok: gpu.alloc_pinned(r).map_err(e("host_tok"))?,
            lp: gpu.alloc_pinned(r).map_err(e("host_lp"))?,
            top_ids: gpu
                .alloc_pinned(r * MAX_LOGPROBS)
                .map_err(e("host_top_ids"))?,
            top_lps: gpu
                .alloc_pinned(r * MAX_LOGPROBS)
                .map_err(e("host_top_lps"))?,
        })
    }
}

/// Values of each of the tensor-core LoRA path's buffers for steps of up
/// to `t` tokens (0 without that path).
fn wide_len(t: usize, tu: &Tuning) -> usize {
    super::lora::wide_rows(t, tu.lora_wide) * tu.lora_wide
}

impl Workspace {
    pub fn new(
        gpu: &Gpu,
        c: &ModelConfig,
        tu: &Tuning,
        caps: Caps,
        fp8_act: bool,
    ) -> Result<Workspace, BackendError> {
        let (shape, plan) = (tu.shape, tu.decode);
        let e = |what: &'static str| {
            move |err: gpu::GpuError| dev_err(&format!("allocating the workspace ({what})"), err)
        };
        let (t, r, h, i, v) = (
            caps.tokens,
            caps.rows,
            c.hidden_size,
            c.intermediate_size,
            c.vocab_size,
        );
        Ok(Workspace {
            caps,
            x: gpu.alloc(t * h).map_err(e("x"))?,
            xn: gpu.alloc(t * h).map_err(e("xn"))?,
            qkv: gpu.alloc(t * shape.qkv_width()).map_err(e("qkv"))?,
            attn: gpu.alloc(t * c.q_dim()).map_err(e("attn"))?,
            delta: gpu.alloc(t * h).map_err(e("delta"))?,
            gu: gpu.alloc(t * 2 * i).map_err(e("gate_up"))?,
            act: gpu.alloc(t * i).map_err(e("act"))?,
            lora_h: gpu
                .alloc(if tu.lora_h > 0 { t * tu.lora_h } else { 1 })
                .map_err(e("lora_h"))?,
            lora_wide: gpu.alloc(wide_len(t, tu).max(1)).map_err(e("lora_wide"))?,
            lora_wide_b: gpu.alloc(wide_len(t, tu).max(1)).map_err(e("lora_wide"))?,
            lora_ready: gpu
                .alloc(if tu.lora_h > 0 {
                    Group::ALL.len() * c.num_layers
                } else {
                    1
                })
                .map_err(e("lora_ready"))?,
            xq: gpu
                .alloc(if fp8_act {
                    t * h.max(c.q_dim()).max(i)
                } else {
                    1
                })
                .map_err(e("xq"))?,
            xs8: gpu.alloc(if fp8_act { t } else { 1 }).map_err(e("xs8"))?,
            part_o: gpu
                .alloc(plan.partial_o_len(shape, caps.decode_seqs))
                .map_err(e("part_o"))?,
            part_ml: gpu
                .alloc(plan.partial_ml_len(shape, caps.decode_seqs))
                .map_err(e("part_ml"))?,
            part_cnt: gpu
                .alloc(plan.counters_len(shape, caps.decode_seqs))
                .map_err(e("part_cnt"))?,
            rot_ready: gpu
                .alloc(shape.num_heads + shape.num_kv_heads)
                .map_err(e("rot_ready"))?,
            xs: gpu.alloc(r * h).map_err(e("xs"))?,
            logits: gpu.alloc(r * v).map_err(e("logits"))?,
            work: gpu.alloc(r * v).map_err(e("work"))?,
            samp_stats: gpu
                .alloc(SampleScratch::stats_len(r, v))
                .map_err(e("sampler stats"))?,
            samp_keys: gpu
                .alloc(SampleScratch::keys_len(r, v, MAX_LOGPROBS))
                .map_err(e("sampler keys"))?,
            tok: gpu.alloc(r).map_err(e("tok"))?,
            lp: gpu.alloc(r).map_err(e("lp"))?,
            top_ids: gpu.alloc(r * MAX_LOGPROBS).map_err(e("top_ids"))?,
            top_lps: gpu.alloc(r * MAX_LOGPROBS).map_err(e("top_lps"))?,
            meta: gpu.alloc(caps.meta).map_err(e("meta"))?,
            host_meta: gpu.alloc_pinned(caps.meta).map_err(e("host_meta"))?,
            host_release: gpu.alloc_pinned(caps.meta).map_err(e("host_release"))?,
            host_out: [HostOut::new(gpu, r)?, HostOut::new(gpu, r)?],
            meta_fence: gpu.fence().map_err(e("events"))?,
            release_fence: gpu.fence().map_err(e("events"))?,
        })
    }
}

impl CudaBackend {
    /// Grows the workspace to hold `need` (dropping captured graphs, which
    /// point into the old buffers). Never called inside a capture.
    pub(super) fn ensure(&mut self, need: Caps) -> Result<(), BackendError> {
        let have = self.ws.caps;
        if need.tokens <= have.tokens
            && need.rows <= have.rows
            && need.decode_seqs <= have.decode_seqs
            && need.meta <= have.meta
        {
            return Ok(());
        }
        self.graphs.clear();
        self.gpu
            .synchronize()
            .map_err(|e| dev_err("growing the workspace", e))?;
        // the steps in flight are done: their samples leave the old buffers
        self.pipe.harvest(&self.ws);
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
        let ws = Workspace::new(
            &self.gpu,
            &self.config,
            &self.tuning,
            caps,
            self.lt.is_some(),
        )?;
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
        // deterministic steps run long rows' attention on token rows
        let decode_seqs = match self.tuning.deterministic {
            true => max_tokens.max(seqs),
            false => seqs,
        };
        self.ensure(Caps {
            tokens: max_tokens.max(seqs),
            rows: seqs,
            decode_seqs,
            meta: eager.total.max(graph.total),
        })
    }
}
