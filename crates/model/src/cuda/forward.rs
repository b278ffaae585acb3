//! The layer pipeline on the device: workspace buffers and the enqueue of
//! one step's kernels.
//!
//! Contract: [`CudaBackend::enqueue`] only enqueues work on the stream, with
//! no allocation, no synchronisation and no host branching on device data,
//! reading its inputs from the staging buffer at a fixed [`Layout`]; that is
//! what lets a pure-decode step be captured as a CUDA graph and replayed.
//! Per layer, steps of more than `gemv_rows` tokens (cuBLAS): fused
//! add+RMSNorm, QKV GEMM, RoPE + KV write, attention (decode kernel for
//! pure-decode steps, flash prefill kernel otherwise), O GEMM, add+RMSNorm,
//! gate/up GEMM, SiLU·up, down GEMM: 4 GEMMs and 5 or 6 kernels. Small
//! steps (decode at small batch, `gemv_rows`) use the fused GEMVs instead:
//! RMSNorm+QKV+RoPE+KV write, attention, O + residual, RMSNorm+gate/up+SiLU·up,
//! down + residual: 5 or 6 kernels. Then the final norm, the gather of the
//! rows to sample, the LM head (GEMV for one row) on those rows only,
//! and sampling.
//! Costs: workspace = `T_cap * (hidden * 10 + qkv + 3 * intermediate) * 2`
//! bytes + `R_cap * vocab * 8` bytes (logits and the sampler's scratch) +
//! decode partials `max_S(S * splits(S)) * heads * (head_dim + 2) * 4` bytes
//! (about `2 * SMs * group * (head_dim + 2) * 4`: a few hundred KiB).

use gpu::{DevSlice, DeviceBuffer, GemmDims, Gpu, PinnedBuffer};
use half::bf16;
use kernels::decode_attention::DecodeParams;
use kernels::flash_prefill::FlashTiles;
use kernels::gemv::{GemvOp, RopeKv};
use kernels::prefill_attention::PrefillParams;
use kernels::sampling::{SampleOutputs, SampleScratch};
use kernels::{DecodePlan, HeadShape, SampleParams};

use contract::backend::BackendError;
use contract::config::LlamaConfig;
use contract::sampling::MAX_LOGPROBS;

use super::staging::{Layout, PARAM_WORDS};
use super::{CudaBackend, dev_err};

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
    pub x: DeviceBuffer<f32>,          // [T, hidden] residual stream
    pub xn: DeviceBuffer<bf16>,        // [T, hidden] normed
    pub qkv: DeviceBuffer<bf16>,       // [T, qkv_width]
    pub attn: DeviceBuffer<bf16>,      // [T, heads * head_dim]
    pub delta: DeviceBuffer<bf16>,     // [T, hidden] o / down projection output
    pub gu: DeviceBuffer<bf16>,        // [T, 2 * intermediate]
    pub act: DeviceBuffer<bf16>,       // [T, intermediate]
    pub part_o: DeviceBuffer<f32>,     // [S_dec, heads, splits, head_dim]
    pub part_ml: DeviceBuffer<f32>,    // [S_dec, heads, splits, 2]
    pub part_cnt: DeviceBuffer<u32>,   // [S_dec, kv_heads] split arrival counters (zero)
    pub xs: DeviceBuffer<bf16>,        // [R, hidden] rows to sample
    pub logits: DeviceBuffer<f32>,     // [R, vocab]
    pub work: DeviceBuffer<f32>,       // [R, vocab] sampler scratch
    pub samp_stats: DeviceBuffer<f32>, // [R, vocab / SLICE, 2] sampler partials
    pub samp_keys: DeviceBuffer<u64>,  // [R, vocab / SLICE, 1 + MAX_LOGPROBS]
    pub tok: DeviceBuffer<u32>,        // [R]
    pub lp: DeviceBuffer<f32>,         // [R]
    pub top_ids: DeviceBuffer<u32>,    // [R, MAX_LOGPROBS]
    pub top_lps: DeviceBuffer<f32>,    // [R, MAX_LOGPROBS]
    pub meta: DeviceBuffer<u32>,       // staging, see Layout
    pub host_meta: PinnedBuffer<u32>,
    /// A held step's final sampling parameters and history, staged at
    /// release apart from `host_meta` (whose next packing must not wait for
    /// the held step's forward pass).
    pub host_release: PinnedBuffer<u32>,
    /// Two slots for the samples of two steps in flight (pipelined).
    pub host_out: [HostOut; 2],
}

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

impl Workspace {
    pub fn new(
        gpu: &Gpu,
        c: &LlamaConfig,
        shape: HeadShape,
        plan: DecodePlan,
        caps: Caps,
    ) -> Result<Workspace, BackendError> {
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
            part_o: gpu
                .alloc(plan.partial_o_len(shape, caps.decode_seqs))
                .map_err(e("part_o"))?,
            part_ml: gpu
                .alloc(plan.partial_ml_len(shape, caps.decode_seqs))
                .map_err(e("part_ml"))?,
            part_cnt: gpu
                .alloc(plan.counters_len(shape, caps.decode_seqs))
                .map_err(e("part_cnt"))?,
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
        })
    }
}

/// Which attention kernel a step runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Attn {
    /// One token per sequence: the split-KV decode kernel.
    Decode,
    /// Anything else: the flash prefill kernel; the longest segment and the
    /// number of one-token segments (decode rows of a mixed step).
    Prefill { max_seqlen: usize, singles: usize },
}

impl CudaBackend {
    /// Enqueues the forward pass of the step staged at `lay`, then sampling
    /// (`sample`) or nothing (logits stay in the workspace). `identity_rows`:
    /// the staged rows are `0, 1, ..` (the LM head may then skip the gather).
    pub(super) fn enqueue(
        &self,
        lay: &Layout,
        attn: Attn,
        sample: bool,
        identity_rows: bool,
    ) -> Result<(), BackendError> {
        let c = &self.config;
        let ws = &self.ws;
        let (t, s, r) = (lay.t, lay.s, lay.r);
        let (h, inter, v) = (c.hidden_size, c.intermediate_size, c.vocab_size);
        let shape = self.shape;
        let g = |what: &'static str| move |e: gpu::GpuError| dev_err(what, e);
        let k = |what: &'static str| move |e: kernels::KernelError| dev_err(what, e);
        let meta = ws.meta.view();
        let part = |off: usize, len: usize| meta.sub(off, len).map_err(g("staging view"));
        let tokens = part(lay.tokens, t)?;
        let carry = kernels::embedding::Carry {
            rows: part(lay.carry, t)?,
            prev: ws.tok.view(),
        };
        let positions = part(lay.positions, t)?;
        let slots = part(lay.slots, t)?;
        let cu = part(lay.cu_seqlens, s + 1)?;
        let ctx = part(lay.context_lens, s)?;
        let tables = part(lay.tables, s * lay.max_blocks)?;
        let rows = part(lay.rows, r)?;
        let gemm = |x: DevSlice<'_, bf16>,
                    w: &DeviceBuffer<bf16>,
                    y: DevSlice<'_, bf16>,
                    n: usize,
                    kk: usize| {
            self.blas
                .matmul_nt(x, w.view(), y, GemmDims { m: t, n, k: kk })
                .map_err(g("GEMM"))
        };
        let gemm_rows = |m: usize,
                         x: DevSlice<'_, bf16>,
                         w: &DeviceBuffer<bf16>,
                         y: DevSlice<'_, bf16>,
                         n: usize,
                         kk: usize| {
            self.blas
                .matmul_nt(x, w.view(), y, GemmDims { m, n, k: kk })
                .map_err(g("GEMM"))
        };
        let eps = c.rms_norm_eps;
        // Past the last layer's attention only the sampled rows matter (the
        // K/V of every token are in the cache by then): a prefill step whose
        // sampled rows are fewer than its tokens runs the last layer's O
        // projection, MLP and the final norm on those rows alone (b2: 1 of
        // 2,048 rows; about 1/16 of the step's GEMM work saved). Compacted
        // rows live in buffers free by then: attention rows in `qkv`, the f32
        // residual rows in the sampler's `work`.
        let prune = !identity_rows && r >= 1 && r < t && v >= h && c.num_layers >= 1;
        let last = c.num_layers.saturating_sub(1);
        // SAFETY: check_batch verified every token id < vocab; the staged ids
        // are those (or 0 for padding); carried ids are the sampler's (< vocab).
        unsafe {
            self.k.embedding_gather(
                ws.x.view(),
                self.w.embed.view(),
                tokens,
                Some(carry),
                t,
                h,
                v,
            )
        }
        .map_err(k("embedding"))?;
        // Steps of at most `gemv_rows` tokens run the projections as GEMVs
        // with the norms, residual adds and SiLU·up fused in; the residual
        // stream `x` then always holds every delta already.
        let small = t >= 1 && t <= self.gemv_rows && kernels::gemv::fits(t, h);
        let gemv = |op: GemvOp<'_>, w: &DeviceBuffer<bf16>, n: usize, kk: usize| {
            self.k.gemv(op, w.view(), t, n, kk).map_err(k("GEMV"))
        };
        // Decode steps with enough sequences: attention on the narrow
        // tensor-core flash kernel (one token per sequence, cu_seqlens 0..=S).
        let narrow = (attn == Attn::Decode && s >= self.narrow_decode_seqs)
            .then_some(PrefillParams {
                shape,
                tokens: t,
                num_seqs: s,
                max_seqlen: 1,
                max_blocks: lay.max_blocks,
                block_size: self.kv.block_size,
            })
            .filter(|p| self.k.flash_supports(FlashTiles::Narrow, p));
        for (l, layer) in self.w.layers.iter().enumerate() {
            let (kc, vc) = (self.cache.k[l].view(), self.cache.v[l].view());
            if small {
                let rope = RopeKv {
                    positions,
                    slots,
                    cos: self.rope_cos.view(),
                    sin: self.rope_sin.view(),
                    k_cache: kc,
                    v_cache: vc,
                    shape,
                    max_pos: self.rope_rows,
                };
                // SAFETY: as for rope_kv_write below: check_batch verified slots
                // against the pool (padding uses the scratch block) and positions.
                unsafe {
                    self.k.gemv_qkv_rope(
                        ws.x.view(),
                        layer.input_norm.view(),
                        eps,
                        layer.qkv.view(),
                        ws.qkv.view(),
                        rope,
                        t,
                        h,
                    )
                }
                .map_err(k("QKV + RoPE GEMV"))?;
            } else {
                let delta = (l > 0).then(|| ws.delta.view());
                self.k
                    .add_rmsnorm(
                        ws.x.view(),
                        delta,
                        layer.input_norm.view(),
                        ws.xn.view(),
                        t,
                        h,
                        eps,
                    )
                    .map_err(k("input norm"))?;
                gemm(
                    ws.xn.view(),
                    &layer.qkv,
                    ws.qkv.view(),
                    shape.qkv_width(),
                    h,
                )?;
                // SAFETY: check_batch verified slots against the pool (padding uses the
                // scratch block past it, which the cache holds) and positions < rope_rows.
                unsafe {
                    self.k.rope_kv_write(
                        ws.qkv.view(),
                        positions,
                        slots,
                        self.rope_cos.view(),
                        self.rope_sin.view(),
                        kc,
                        vc,
                        shape,
                        t,
                        self.rope_rows,
                    )
                }
                .map_err(k("rope/kv write"))?;
            }
            match (attn, narrow) {
                (Attn::Decode, Some(p)) => {
                    // SAFETY: as for decode below; cu_seqlens of a decode step are 0..=S
                    // (one token per sequence, staged), so max_seqlen 1 bounds every segment.
                    unsafe {
                        self.k.flash(
                            FlashTiles::Narrow,
                            1..=u32::MAX,
                            ws.qkv.view(),
                            kc,
                            vc,
                            cu,
                            ctx,
                            tables,
                            ws.attn.view(),
                            p,
                        )
                    }
                    .map_err(k("decode attention (narrow flash)"))?;
                }
                (Attn::Decode, None) => {
                    let p = DecodeParams {
                        shape,
                        plan: self.plan,
                        num_seqs: s,
                        max_blocks: lay.max_blocks,
                        block_size: self.kv.block_size,
                    };
                    // SAFETY: contexts <= max_context (check_batch), tables in the pool
                    // (padding points at the scratch block), and every position up to
                    // each context was written by this or an earlier step.
                    unsafe {
                        self.k.decode_attention(
                            ws.qkv.view(),
                            kc,
                            vc,
                            ctx,
                            tables,
                            ws.part_o.view(),
                            ws.part_ml.view(),
                            ws.part_cnt.view(),
                            ws.attn.view(),
                            p,
                        )
                    }
                    .map_err(k("decode attention"))?;
                }
                (
                    Attn::Prefill {
                        max_seqlen,
                        singles,
                    },
                    _,
                ) => {
                    let p = PrefillParams {
                        shape,
                        tokens: t,
                        num_seqs: s,
                        max_seqlen,
                        max_blocks: lay.max_blocks,
                        block_size: self.kv.block_size,
                    };
                    // A mixed step with many decode rows: those on the narrow
                    // tiling, the multi-token segments on the wide one.
                    let split = singles >= self.narrow_decode_seqs
                        && max_seqlen > 1
                        && self.k.flash_prefill_supports(&p)
                        && self.k.flash_supports(FlashTiles::Narrow, &p);
                    let (q, out) = (ws.qkv.view(), ws.attn.view());
                    // Tensor-core kernel where it serves the head shape, the old one otherwise.
                    // SAFETY: as for decode; the batch passed StepBatch::validate.
                    unsafe {
                        if split {
                            let (wide, narrow) = (self.k.prefill_tiles(), FlashTiles::Narrow);
                            self.k
                                .flash(wide, 2..=u32::MAX, q, kc, vc, cu, ctx, tables, out, p)
                                .and_then(|()| {
                                    // only one-token segments: one query tile each
                                    let p = PrefillParams { max_seqlen: 1, ..p };
                                    self.k
                                        .flash(narrow, 1..=1, q, kc, vc, cu, ctx, tables, out, p)
                                })
                        } else if self.k.flash_prefill_supports(&p) {
                            self.k.flash_prefill(q, kc, vc, cu, ctx, tables, out, p)
                        } else {
                            self.k.prefill_attention(q, kc, vc, cu, ctx, tables, out, p)
                        }
                    }
                    .map_err(k("prefill attention"))?;
                }
            }
            if small {
                let op = GemvOp::Resid {
                    x: ws.attn.view(),
                    residual: ws.x.view(),
                };
                gemv(op, &layer.o, h, c.q_dim())?;
                let op = GemvOp::NormSilu {
                    residual: ws.x.view(),
                    norm_w: layer.post_norm.view(),
                    eps,
                    y: ws.act.view(),
                };
                gemv(op, &layer.gate_up, inter, h)?;
                let op = GemvOp::Resid {
                    x: ws.act.view(),
                    residual: ws.x.view(),
                };
                gemv(op, &layer.down, h, inter)?;
                continue;
            }
            if prune && l == last {
                // compact the sampled rows: attention rows into `qkv`, the
                // residual rows (f32, copied as bf16 pairs) into `work`
                let q = c.q_dim();
                let attn_r = ws.qkv.view().sub(0, r * q).map_err(g("row views"))?;
                let x_r: DevSlice<'_, bf16> = ws
                    .work
                    .view()
                    .sub(0, r * h)
                    .and_then(|v| v.cast())
                    .map_err(g("row views"))?;
                let x_all: DevSlice<'_, bf16> = ws.x.view().cast().map_err(g("row views"))?;
                // SAFETY: every staged row index is < T (checked on the host).
                unsafe {
                    self.k
                        .gather_rows(attn_r, ws.attn.view(), rows, r, q, t)
                        .and_then(|()| self.k.gather_rows(x_r, x_all, rows, r, 2 * h, t))
                }
                .map_err(k("row gather (last layer)"))?;
                let x_r = ws.work.view().sub(0, r * h).map_err(g("row views"))?;
                gemm_rows(r, attn_r, &layer.o, ws.delta.view(), h, q)?;
                self.k
                    .add_rmsnorm(
                        x_r,
                        Some(ws.delta.view()),
                        layer.post_norm.view(),
                        ws.xn.view(),
                        r,
                        h,
                        eps,
                    )
                    .map_err(k("post-attention norm"))?;
                gemm_rows(r, ws.xn.view(), &layer.gate_up, ws.gu.view(), 2 * inter, h)?;
                self.k
                    .silu_mul(ws.act.view(), ws.gu.view(), r, inter)
                    .map_err(k("silu"))?;
                gemm_rows(r, ws.act.view(), &layer.down, ws.delta.view(), h, inter)?;
                continue;
            }
            gemm(ws.attn.view(), &layer.o, ws.delta.view(), h, c.q_dim())?;
            self.k
                .add_rmsnorm(
                    ws.x.view(),
                    Some(ws.delta.view()),
                    layer.post_norm.view(),
                    ws.xn.view(),
                    t,
                    h,
                    eps,
                )
                .map_err(k("post-attention norm"))?;
            gemm(ws.xn.view(), &layer.gate_up, ws.gu.view(), 2 * inter, h)?;
            self.k
                .silu_mul(ws.act.view(), ws.gu.view(), t, inter)
                .map_err(k("silu"))?;
            gemm(ws.act.view(), &layer.down, ws.delta.view(), h, inter)?;
        }
        let pruned = prune && !small;
        let (resid, norm_rows) = if pruned {
            let x_r = ws.work.view().sub(0, r * h).map_err(g("row views"))?;
            (x_r, r)
        } else {
            (ws.x.view(), t)
        };
        self.k
            .add_rmsnorm(
                resid,
                (!small).then(|| ws.delta.view()),
                self.w.norm.view(),
                ws.xn.view(),
                norm_rows,
                h,
                eps,
            )
            .map_err(k("final norm"))?;
        // Rows 0..t in order (every pure-decode step), or rows compacted at
        // the last layer: the LM head reads the normed rows in place.
        let head_in = if pruned || (identity_rows && r == t) {
            ws.xn.view()
        } else {
            // SAFETY: every staged row index is < T (checked on the host, padding rows < bucket).
            unsafe {
                self.k
                    .gather_rows(ws.xs.view(), ws.xn.view(), rows, r, h, t)
            }
            .map_err(k("row gather"))?;
            ws.xs.view()
        };
        if r >= 1 && r <= self.gemv_rows.min(super::HEAD_GEMV_ROWS) {
            let op = GemvOp::F32 {
                x: head_in,
                y: ws.logits.view(),
            };
            self.k
                .gemv(op, self.w.head().view(), r, v, h)
                .map_err(k("LM head GEMV"))?;
        } else {
            self.blas
                .matmul_nt(
                    head_in,
                    self.w.head().view(),
                    ws.logits.view(),
                    GemmDims { m: r, n: v, k: h },
                )
                .map_err(g("LM head GEMM"))?;
        }
        if sample {
            self.enqueue_sampler(lay)?;
        }
        Ok(())
    }

    /// Enqueues sampling of the `lay.r` rows of logits the forward pass of
    /// the step staged at `lay` left in the workspace, with the parameters
    /// and history staged there.
    pub(super) fn enqueue_sampler(&self, lay: &Layout) -> Result<(), BackendError> {
        let ws = &self.ws;
        let g = |what: &'static str| move |e: gpu::GpuError| dev_err(what, e);
        let meta = ws.meta.view();
        let part = |off: usize, len: usize| meta.sub(off, len).map_err(g("staging view"));
        let r = lay.r;
        let params: DevSlice<'_, SampleParams> = part(lay.params, r * PARAM_WORDS)?
            .cast()
            .map_err(g("params view"))?;
        let history = part(lay.history, lay.hist_cap.max(1))?;
        let out = SampleOutputs {
            tokens: ws.tok.view(),
            logprobs: ws.lp.view(),
            top_ids: ws.top_ids.view(),
            top_lps: ws.top_lps.view(),
        };
        // SAFETY: each row's history range was staged inside the history area, ids distinct.
        unsafe {
            self.k.sample_rows(
                ws.logits.view(),
                SampleScratch {
                    work: ws.work.view(),
                    stats: ws.samp_stats.view(),
                    keys: ws.samp_keys.view(),
                },
                params,
                history,
                out,
                r,
                self.config.vocab_size,
                MAX_LOGPROBS,
            )
        }
        .map_err(|e| dev_err("sampling", e))
    }
}
