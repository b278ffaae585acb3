//! The layer pipeline on the device: executes a [`StepPlan`].
//!
//! Contract: the executor ([`Exec`]) borrows what a step's kernels read and
//! nothing else: the device model (weights, KV pool, RoPE tables), the
//! step's IO (the workspace and its staged arrays), the projections'
//! products, the adapter slots and the kernels; it cannot change the
//! backend. [`Exec::enqueue`] only enqueues work on the stream, with
//! no allocation, no synchronisation and no host branching on device data,
//! reading its inputs from the staging buffer at a fixed [`Layout`]; that is
//! what lets a pure-decode step be captured as a CUDA graph and replayed.
//! Every choice between kernels was made by the plan (`plan`); the
//! functions here run it:
//! - a GEMV layer: RMSNorm+QKV(+bias, QK-norm)+RoPE+KV write, attention,
//!   O (+ output norm) + residual, RMSNorm+gate/up+activation, down (+
//!   output norm) + residual (5 or 6 kernels);
//! - a GEMM layer: add+RMSNorm, QKV GEMM, RoPE + KV write, attention, O
//!   GEMM, add+RMSNorm, gate/up GEMM, SiLU·up, down GEMM (4 GEMMs and 5 or
//!   6 kernels), the last one on the sampled rows alone when pruned; the
//!   spec's biases, QK-norm, output norms and activation where the layer
//!   has them (every spec `check_spec` admits; the GEMV layer runs those
//!   `gemv_layer_runs` admits);
//! - then the final norm, the LM head on the sampled rows, and sampling
//!   (or, for hidden states, the final norm of every row and nothing after:
//!   [`Exec::enqueue_hidden`]).

use gpu::{DevSlice, GemmDims};
use half::bf16;
use kernels::decode_attention::DecodeRows;
use kernels::embedding::Carry;
use kernels::flash_prefill::FlashTiles;
use kernels::gemv::{GemvLora, GemvOp, OutNorm, QkNorm, RopeKv, RowNorm};
use kernels::layer_extras::HeadNorm;
use kernels::persistent::PersistentProgram;
use kernels::sampling::{SampleOutputs, SampleScratch};
use ops::attention::ScoreRule;

use contract::backend::BackendError;
use contract::sampling::MAX_LOGPROBS;

use contract::config::ModelConfig;
use gpu::Blas;
use kernels::Kernels;

use super::CudaBackend;
use super::errors::{ge, ke};
use super::linear::{GemmIo, Linear, Products};
use super::lora::{Group, LoraPool};
use super::plan::{AttnPlan, HeadIn, Proj, StepPlan, Tuning};
use super::staging::{Layout, PARAM_WORDS};
use super::weights::{DeviceLayer, DeviceModel, Projection};
use super::workspace::Workspace;

mod adapters;

/// The plan executor: the parts of the backend a step reads (module doc).
pub(super) struct Exec<'a> {
    pub config: &'a ModelConfig,
    pub tuning: &'a Tuning,
    pub model: &'a DeviceModel,
    pub ws: &'a Workspace,
    pub lora: &'a LoraPool,
    pub products: &'a dyn Products,
    pub blas: &'a Blas,
    pub k: &'a Kernels,
}

impl CudaBackend {
    /// The executor of this backend's steps.
    pub(super) fn exec(&self) -> Exec<'_> {
        Exec {
            config: &self.config,
            tuning: &self.tuning,
            model: &self.model,
            ws: &self.ws,
            lora: &self.lora,
            products: self.products.as_ref(),
            blas: &self.blas,
            k: &self.k,
        }
    }
}

/// The staged per-step arrays of a [`Layout`], as device views.
pub(super) struct Staged<'a> {
    tokens: DevSlice<'a, u32>,     // [T]
    carry: DevSlice<'a, u32>,      // [T]
    positions: DevSlice<'a, u32>,  // [T]
    slots: DevSlice<'a, u32>,      // [T]
    cu_seqlens: DevSlice<'a, u32>, // [S + 1]
    ctx: DevSlice<'a, u32>,        // [S]
    tables: DevSlice<'a, u32>,     // [S, max_blocks]
    rows: DevSlice<'a, u32>,       // [R]
    /// `[T]` each token's LoRA slot (0: the base model)
    pub(super) loras: DevSlice<'a, u32>,
}

impl<'a> Exec<'a> {
    /// The staged arrays of the step at `lay`.
    fn staged(&self, lay: &Layout) -> Result<Staged<'_>, BackendError> {
        let meta = self.ws.meta.view();
        let part = |off: usize, len: usize| meta.sub(off, len).map_err(ge("staging view"));
        Ok(Staged {
            tokens: part(lay.tokens, lay.t)?,
            carry: part(lay.carry, lay.t)?,
            positions: part(lay.positions, lay.t)?,
            slots: part(lay.slots, lay.t)?,
            cu_seqlens: part(lay.cu_seqlens, lay.s + 1)?,
            ctx: part(lay.context_lens, lay.s)?,
            tables: part(lay.tables, lay.s * lay.max_blocks)?,
            rows: part(lay.rows, lay.r)?,
            loras: part(lay.loras, lay.t)?,
        })
    }

    /// Enqueues the forward pass of the step staged at `lay` as `plan`
    /// says, then sampling (`sample`) or nothing (the logits stay in the
    /// workspace). `layers`: the persistent kernel's program of this
    /// step's layers ([`Exec::record_layers`]), run in their place.
    pub(super) fn enqueue(
        &self,
        lay: &Layout,
        plan: &StepPlan,
        sample: bool,
        layers: Option<&PersistentProgram>,
    ) -> Result<(), BackendError> {
        let io = self.staged(lay)?;
        if plan.lora && plan.proj == Proj::Gemv {
            self.reset_lora_counters()?;
        }
        self.embed(&io, plan)?;
        match layers {
            Some(p) => self
                .k
                .launch_persistent(p)
                .map_err(ke("persistent decode"))?,
            None => self.layers(&io, plan)?,
        }
        self.final_norm_and_head(&io, plan)?;
        if sample {
            self.enqueue_sampler(lay)?;
        }
        Ok(())
    }

    /// Every layer of the step, as `plan` says.
    fn layers(&self, io: &Staged<'_>, plan: &StepPlan) -> Result<(), BackendError> {
        let last = self.model.w.layers.len().saturating_sub(1);
        for (l, layer) in self.model.w.layers.iter().enumerate() {
            match plan.proj {
                Proj::Gemv => self.gemv_layer(l, layer, io, plan)?,
                Proj::Gemm => self.gemm_layer(l, layer, io, plan, l == last)?,
            }
        }
        Ok(())
    }

    /// The persistent kernel's program of the layers of the step staged at
    /// `lay` run as `plan` (one that allows it: `plan.persistent`), or why
    /// it cannot run them. Records the layers' launches instead of making
    /// them (the GEMV layer reaches the GPU through kernels alone), then
    /// uploads, blocking: call it outside a graph capture.
    pub(super) fn record_layers(
        &self,
        lay: &Layout,
        plan: &StepPlan,
    ) -> Result<Result<PersistentProgram, String>, BackendError> {
        if !plan.persistent {
            return Ok(Err("the step's plan does not allow it".into()));
        }
        let io = self.staged(lay)?;
        let rec = self.k.record_persistent(|| self.layers(&io, plan))?;
        self.k
            .persistent_program(rec, self.tuning.persistent_trace)
            .map_err(ke("uploading the persistent decode program"))
    }

    /// The residual stream `x` from the token embeddings (carried tokens'
    /// ids read from the previous step's samples).
    fn embed(&self, io: &Staged<'_>, plan: &StepPlan) -> Result<(), BackendError> {
        let c = &self.config;
        let carry = Carry {
            rows: io.carry,
            prev: self.ws.tok.view(),
        };
        // SAFETY: check_batch verified every token id < vocab; the staged ids
        // are those (or 0 for padding); carried ids are the sampler's (< vocab).
        unsafe {
            self.k.embedding_gather(
                self.ws.x.view(),
                self.model.w.embed.view(),
                io.tokens,
                Some(carry),
                plan.t,
                c.hidden_size,
                c.vocab_size,
                c.spec.embed_scale,
            )
        }
        .map_err(ke("embedding"))
    }

    /// One layer on the fused GEMVs; `x` holds every delta afterwards. With
    /// adapter rows each GEMV also computes its group's shrink and adds the
    /// deltas in its epilogue (`lora`).
    fn gemv_layer(
        &self,
        l: usize,
        layer: &DeviceLayer,
        io: &Staged<'_>,
        plan: &StepPlan,
    ) -> Result<(), BackendError> {
        let (c, ws, t) = (&self.config, &self.ws, plan.t);
        let (h, inter) = (c.hidden_size, c.intermediate_size);
        let (attn, act, x) = (ws.attn.view(), ws.act.view(), ws.x.view());
        let offset = c.spec.norm_weight_offset;
        let (n1, n2) = (
            self.row_norm(&layer.input_norm),
            self.row_norm(&layer.post_norm),
        );
        let lora = |g: Group| match plan.lora {
            true => self.gemv_lora(l, g, io.loras, t).map(Some),
            false => Ok(None),
        };
        let rope = RopeKv {
            positions: io.positions,
            slots: io.slots,
            cos: self.model.rope_cos(l),
            sin: self.model.rope_sin(l),
            kv: self.model.cache.layer(l),
            shape: self.tuning.shape,
            max_pos: self.model.rope_rows,
            ready: Some(ws.rot_ready.view()),
            qk_norm: layer.extras.qk_norm.as_ref().map(|[q, k]| QkNorm {
                q: q.view(),
                k: k.view(),
                offset,
            }),
            bias: layer.extras.qkv_bias.as_ref().map(|b| b.view()),
        };
        let lq = lora(Group::Qkv)?;
        // SAFETY: check_batch verified slots against the pool (padding uses the
        // scratch block past it, which the cache holds) and positions < rope_rows.
        unsafe {
            self.k.gemv_qkv_rope(
                x,
                n1,
                layer.qkv.gemv(),
                ws.qkv.view(),
                rope,
                lq.as_ref(),
                t,
                h,
            )
        }
        .map_err(ke("QKV + RoPE GEMV"))?;
        self.attention(l, io, plan)?;
        let gemv =
            |op: GemvOp<'_>, w: &Projection, n: usize, k: usize, lora: Option<GemvLora<'_>>| {
                self.k
                    .gemv_with(op, w.gemv(), t, n, k, lora.as_ref())
                    .map_err(ke("GEMV"))
            };
        let lo = lora(Group::O)?;
        let o = self.resid_op(attn, &layer.extras.attn_out_norm);
        gemv(o, &layer.o, h, c.q_dim(), lo)?;
        let lg = lora(Group::GateUp)?;
        let gated = GemvOp::NormGated {
            residual: x,
            norm: n2,
            act: c.spec.layers[l].mlp.activation,
            y: act,
        };
        gemv(gated, &layer.gate_up, inter, h, lg)?;
        let ld = lora(Group::Down)?;
        let down = self.resid_op(act, &layer.extras.mlp_out_norm);
        gemv(down, &layer.down, h, inter, ld)
    }

    /// An RMSNorm with gains `w` under the model's epsilon and gain offset.
    fn row_norm<'w>(&self, w: &'w gpu::DeviceBuffer<bf16>) -> RowNorm<'w> {
        let c = &self.config;
        RowNorm {
            w: w.view(),
            eps: c.rms_norm_eps,
            offset: c.spec.norm_weight_offset,
        }
    }

    /// A projection of `input` added to the residual, through the layer's
    /// output norm `gain` where it has one (its rows in `delta`).
    fn resid_op<'w>(
        &'w self,
        input: DevSlice<'w, bf16>,
        gain: &'w Option<gpu::DeviceBuffer<bf16>>,
    ) -> GemvOp<'w> {
        let (ws, residual) = (&self.ws, self.ws.x.view());
        match gain {
            None => GemvOp::Resid { x: input, residual },
            Some(g) => GemvOp::ResidNormed {
                x: input,
                residual,
                norm: OutNorm {
                    norm: self.row_norm(g),
                    rows: ws.delta.view(),
                    ready: ws.rot_ready.view(),
                },
            },
        }
    }

    /// `y[m, n] = x[m, k] · w[n, k]ᵀ` on the backend's products (`linear`).
    fn gemm(
        &self,
        m: usize,
        x: DevSlice<'_, bf16>,
        w: &dyn Linear,
        y: DevSlice<'_, bf16>,
        n: usize,
        k: usize,
    ) -> Result<(), BackendError> {
        let d = GemmDims { m, n, k };
        self.products.project(&self.gemm_io(), w, x, y, d)
    }

    /// What the products may use beside their operands.
    pub(super) fn gemm_io(&self) -> GemmIo<'a> {
        GemmIo {
            k: self.k,
            blas: self.blas,
            xq: self.ws.xq.view(),
            xs: self.ws.xs8.view(),
            widened: self.model.w.widened.as_ref().map(|b| b.view()),
        }
    }

    /// One layer on cuBLAS GEMMs; the last one (`last`) on the sampled rows
    /// alone after attention when the plan prunes it. Leaves the layer's
    /// last delta in `delta` (added by the next norm).
    fn gemm_layer(
        &self,
        l: usize,
        layer: &DeviceLayer,
        io: &Staged<'_>,
        plan: &StepPlan,
        last: bool,
    ) -> Result<(), BackendError> {
        let (c, ws, t) = (&self.config, &self.ws, plan.t);
        let (h, eps) = (c.hidden_size, c.rms_norm_eps);
        let delta = (l > 0).then(|| ws.delta.view());
        let norm = layer.input_norm.view();
        self.k
            .add_rmsnorm(
                ws.x.view(),
                delta,
                norm,
                ws.xn.view(),
                t,
                h,
                eps,
                c.spec.norm_weight_offset,
            )
            .map_err(ke("input norm"))?;
        let qkv_width = self.tuning.shape.qkv_width();
        self.gemm(
            t,
            ws.xn.view(),
            layer.qkv.as_ref(),
            ws.qkv.view(),
            qkv_width,
            h,
        )?;
        let lora = plan.lora.then_some((l, io.loras));
        if let Some((l, rows)) = lora {
            self.lora_delta(l, Group::Qkv, ws.xn.view(), ws.qkv.view(), rows, t)?;
        }
        self.qkv_extras(layer, t)?;
        self.rope_kv(l, io, t)?;
        self.attention(l, io, plan)?;
        if last && plan.prune_last {
            let (attn, x) = self.compact_sampled_rows(io, plan)?;
            return self.o_and_mlp(layer, plan.r, attn, x, None);
        }
        self.o_and_mlp(layer, t, ws.attn.view(), ws.x.view(), lora)
    }

    /// The spec's Q/K/V bias and per-head QK-norm on the `t` rows of `qkv`,
    /// where the layer has them.
    fn qkv_extras(&self, layer: &DeviceLayer, t: usize) -> Result<(), BackendError> {
        let (c, qkv) = (&self.config, self.ws.qkv.view());
        let width = self.tuning.shape.qkv_width();
        if let Some(b) = &layer.extras.qkv_bias {
            self.k
                .bias_rows(qkv, b.view(), t, width)
                .map_err(ke("qkv bias"))?;
        }
        if let Some([gq, gk]) = &layer.extras.qk_norm {
            let n = HeadNorm {
                q_heads: c.num_heads,
                k_heads: c.num_kv_heads,
                head_dim: c.head_dim,
                eps: c.rms_norm_eps,
                offset: c.spec.norm_weight_offset,
            };
            self.k
                .head_rmsnorm(qkv, gq.view(), gk.view(), t, width, n)
                .map_err(ke("qk norm"))?;
        }
        Ok(())
    }

    /// An output norm (`gain`, when the layer has it) over the `m` rows of
    /// a projection's output `y` (`[m, hidden]`), before its residual add.
    fn out_norm(
        &self,
        gain: &Option<gpu::DeviceBuffer<bf16>>,
        y: DevSlice<'_, bf16>,
        m: usize,
    ) -> Result<(), BackendError> {
        let Some(g) = gain else {
            return Ok(());
        };
        let (c, h) = (&self.config, self.config.hidden_size);
        // one "head" as wide as the row: a whole-row RMSNorm
        let n = HeadNorm {
            q_heads: 1,
            k_heads: 0,
            head_dim: h,
            eps: c.rms_norm_eps,
            offset: c.spec.norm_weight_offset,
        };
        self.k
            .head_rmsnorm(y, g.view(), g.view(), m, h, n)
            .map_err(ke("output norm"))
    }

    /// `bias`, when given, on the `m` rows of `y` (`[m, width]`).
    fn bias(
        &self,
        bias: &Option<gpu::DeviceBuffer<bf16>>,
        y: DevSlice<'_, bf16>,
        m: usize,
        width: usize,
    ) -> Result<(), BackendError> {
        match bias {
            Some(b) => self.k.bias_rows(y, b.view(), m, width).map_err(ke("bias")),
            None => Ok(()),
        }
    }

    /// RoPE on the `t` rows of `qkv` and their K/V written into layer
    /// `l`'s cache.
    pub(super) fn rope_kv(&self, l: usize, io: &Staged<'_>, t: usize) -> Result<(), BackendError> {
        // SAFETY: check_batch verified slots against the pool (padding uses the
        // scratch block past it, which the cache holds) and positions < rope_rows.
        unsafe {
            self.k.rope_kv_write(
                self.ws.qkv.view(),
                io.positions,
                io.slots,
                self.model.rope_cos(l),
                self.model.rope_sin(l),
                self.model.cache.layer(l),
                self.tuning.shape,
                t,
                self.model.rope_rows,
            )
        }
        .map_err(ke("rope/kv write"))
    }

    /// Past the last layer's attention only the sampled rows matter (every
    /// token's K/V is in the cache): copies them into buffers free by then,
    /// attention rows into `qkv` and the f32 residual rows (as bf16 pairs)
    /// into the sampler's `work`. Returns both `[R, ..]` views.
    fn compact_sampled_rows(
        &self,
        io: &Staged<'_>,
        plan: &StepPlan,
    ) -> Result<(DevSlice<'_, bf16>, DevSlice<'_, f32>), BackendError> {
        let (ws, h, q) = (&self.ws, self.config.hidden_size, self.config.q_dim());
        let (r, t) = (plan.r, plan.t);
        let attn_r = ws.qkv.view().sub(0, r * q).map_err(ge("row views"))?;
        let x_r: DevSlice<'_, bf16> = ws
            .work
            .view()
            .sub(0, r * h)
            .and_then(|v| v.cast())
            .map_err(ge("row views"))?;
        let x_all: DevSlice<'_, bf16> = ws.x.view().cast().map_err(ge("row views"))?;
        // SAFETY: every staged row index is < T (checked on the host).
        unsafe {
            self.k
                .gather_rows(attn_r, ws.attn.view(), io.rows, r, q, t)
                .and_then(|()| self.k.gather_rows(x_r, x_all, io.rows, r, 2 * h, t))
        }
        .map_err(ke("row gather (last layer)"))?;
        let x_r = ws.work.view().sub(0, r * h).map_err(ge("row views"))?;
        Ok((attn_r, x_r))
    }

    /// O projection, add+RMSNorm, gate/up, SiLU·up and down over `m` rows
    /// of attention output `attn` and residual `x`; the down projection's
    /// output is left in `delta`. `lora`: the layer and each row's LoRA
    /// slot when the step has adapter rows (their deltas land on each
    /// product's output before its epilogue).
    fn o_and_mlp(
        &self,
        layer: &DeviceLayer,
        m: usize,
        attn: DevSlice<'_, bf16>,
        x: DevSlice<'_, f32>,
        lora: Option<(usize, DevSlice<'_, u32>)>,
    ) -> Result<(), BackendError> {
        let (c, ws) = (&self.config, &self.ws);
        let (h, inter) = (c.hidden_size, c.intermediate_size);
        let delta = |g: Group, x: DevSlice<'_, bf16>, y: DevSlice<'_, bf16>| match lora {
            Some((l, rows)) => self.lora_delta(l, g, x, y, rows, m),
            None => Ok(()),
        };
        let (x8, act) = (&layer.extras, c.spec.layers[0].mlp.activation);
        self.gemm(m, attn, layer.o.as_ref(), ws.delta.view(), h, c.q_dim())?;
        delta(Group::O, attn, ws.delta.view())?;
        self.bias(&x8.o_bias, ws.delta.view(), m, h)?;
        self.out_norm(&x8.attn_out_norm, ws.delta.view(), m)?;
        let norm = layer.post_norm.view();
        self.k
            .add_rmsnorm(
                x,
                Some(ws.delta.view()),
                norm,
                ws.xn.view(),
                m,
                h,
                c.rms_norm_eps,
                c.spec.norm_weight_offset,
            )
            .map_err(ke("post-attention norm"))?;
        self.gemm(
            m,
            ws.xn.view(),
            layer.gate_up.as_ref(),
            ws.gu.view(),
            2 * inter,
            h,
        )?;
        delta(Group::GateUp, ws.xn.view(), ws.gu.view())?;
        self.bias(&x8.gate_up_bias, ws.gu.view(), m, 2 * inter)?;
        self.k
            .gate_mul(act, ws.act.view(), ws.gu.view(), m, inter)
            .map_err(ke("gated activation"))?;
        self.gemm(
            m,
            ws.act.view(),
            layer.down.as_ref(),
            ws.delta.view(),
            h,
            inter,
        )?;
        delta(Group::Down, ws.act.view(), ws.delta.view())?;
        self.bias(&x8.down_bias, ws.delta.view(), m, h)?;
        self.out_norm(&x8.mlp_out_norm, ws.delta.view(), m)
    }

    /// Layer `l`'s attention over the paged KV cache, on the plan's path.
    pub(super) fn attention(
        &self,
        l: usize,
        io: &Staged<'_>,
        plan: &StepPlan,
    ) -> Result<(), BackendError> {
        let ws = &self.ws;
        let kv = self.model.cache.layer(l);
        let (q, out) = (ws.qkv.view(), ws.attn.view());
        let (cu, ctx, tables) = (io.cu_seqlens, io.ctx, io.tables);
        let rule = ScoreRule::of(&self.config.spec.layers[l].attention);
        // SAFETY: (every arm) check_batch verified contexts <= the RoPE table,
        // tables inside the pool (padding points at the scratch block), and
        // every position up to each context was written by this or an earlier
        // step; a decode step's cu_seqlens are 0..=S (staged).
        let r = unsafe {
            match plan.attn.for_layer(rule) {
                AttnPlan::Decode(p) => self.k.decode_attention(
                    q,
                    kv,
                    DecodeRows::Seqs { context_lens: ctx },
                    tables,
                    ws.part_o.view(),
                    ws.part_ml.view(),
                    ws.part_cnt.view(),
                    out,
                    p,
                ),
                AttnPlan::DecodeTokens(p) => self.k.decode_attention(
                    q,
                    kv,
                    DecodeRows::Tokens {
                        positions: io.positions,
                        cu_seqlens: cu,
                        num_seqs: cu.len().saturating_sub(1),
                    },
                    tables,
                    ws.part_o.view(),
                    ws.part_ml.view(),
                    ws.part_cnt.view(),
                    out,
                    p,
                ),
                AttnPlan::Narrow(p) => {
                    let tiles = FlashTiles::Narrow;
                    self.k
                        .flash(tiles, 1..=u32::MAX, q, kv, cu, ctx, tables, out, p)
                }
                AttnPlan::Flash(p) => self.k.flash_prefill(q, kv, cu, ctx, tables, out, p),
                AttnPlan::Fixed { p, long, tokens } => {
                    let rows = match tokens {
                        true => DecodeRows::Tokens {
                            positions: io.positions,
                            cu_seqlens: cu,
                            num_seqs: cu.len().saturating_sub(1),
                        },
                        false => DecodeRows::Seqs { context_lens: ctx },
                    };
                    let (po, pm, pc) = (ws.part_o.view(), ws.part_ml.view(), ws.part_cnt.view());
                    let short = super::plan::DETERMINISTIC_FLASH_KEYS as u32;
                    let tiles = super::plan::DETERMINISTIC_TILES;
                    self.k
                        .flash_upto(tiles, 1..=u32::MAX, short, q, kv, cu, ctx, tables, out, p)
                        .and_then(|()| match long {
                            Some(long) => self
                                .k
                                .decode_attention(q, kv, rows, tables, po, pm, pc, out, long),
                            None => Ok(()),
                        })
                }
                AttnPlan::FlashSplit { wide, p } => self
                    .k
                    .flash(wide, 2..=u32::MAX, q, kv, cu, ctx, tables, out, p)
                    .and_then(|()| {
                        // only one-token segments: one query tile each
                        let p = kernels::prefill_attention::PrefillParams { max_seqlen: 1, ..p };
                        let tiles = FlashTiles::Narrow;
                        self.k.flash(tiles, 1..=1, q, kv, cu, ctx, tables, out, p)
                    }),
                AttnPlan::Scalar(p) => self.k.prefill_attention(q, kv, cu, ctx, tables, out, p),
            }
        };
        r.map_err(ke("attention"))
    }

    /// Enqueues the forward pass of the step staged at `lay` up to the
    /// final norm: `xn` then holds the `[T, hidden]` normed hidden states
    /// (what embeddings pool). `plan` must keep every row (no pruning,
    /// [`HeadIn::InPlace`]: identity rows, as many as tokens).
    pub(super) fn enqueue_hidden(&self, lay: &Layout, plan: &StepPlan) -> Result<(), BackendError> {
        if plan.prune_last || plan.head_in != HeadIn::InPlace || plan.r != plan.t {
            return Err(BackendError::InvalidBatch(format!(
                "hidden states need every row of the step: {} rows of {} tokens",
                plan.r, plan.t
            )));
        }
        let io = self.staged(lay)?;
        self.embed(&io, plan)?;
        let last = self.model.w.layers.len().saturating_sub(1);
        for (l, layer) in self.model.w.layers.iter().enumerate() {
            match plan.proj {
                Proj::Gemv => self.gemv_layer(l, layer, &io, plan)?,
                Proj::Gemm => self.gemm_layer(l, layer, &io, plan, l == last)?,
            }
        }
        self.final_norm(plan)
    }

    /// The final norm of the rows the last layer kept, into `xn`.
    fn final_norm(&self, plan: &StepPlan) -> Result<(), BackendError> {
        let (c, ws) = (&self.config, &self.ws);
        let (h, r, t) = (c.hidden_size, plan.r, plan.t);
        let (resid, rows) = match plan.prune_last {
            true => (ws.work.view().sub(0, r * h).map_err(ge("row views"))?, r),
            false => (ws.x.view(), t),
        };
        // after a GEMV layer `x` holds every delta already
        let delta = (plan.proj == Proj::Gemm).then(|| ws.delta.view());
        let norm = self.model.w.norm.view();
        self.k
            .add_rmsnorm(
                resid,
                delta,
                norm,
                ws.xn.view(),
                rows,
                h,
                c.rms_norm_eps,
                c.spec.norm_weight_offset,
            )
            .map_err(ke("final norm"))
    }

    /// The final norm and the LM head on the rows to sample, into `logits`.
    fn final_norm_and_head(&self, io: &Staged<'_>, plan: &StepPlan) -> Result<(), BackendError> {
        let (c, ws) = (&self.config, &self.ws);
        let (h, v, r, t) = (c.hidden_size, c.vocab_size, plan.r, plan.t);
        self.final_norm(plan)?;
        let head_in = match plan.head_in {
            HeadIn::InPlace => ws.xn.view(),
            HeadIn::Gather => {
                // SAFETY: every staged row index is < T (checked on the host,
                // padding rows < bucket).
                unsafe {
                    self.k
                        .gather_rows(ws.xs.view(), ws.xn.view(), io.rows, r, h, t)
                }
                .map_err(ke("row gather"))?;
                ws.xs.view()
            }
        };
        let w = &self.model.w;
        match plan.head {
            Proj::Gemv => {
                let op = GemvOp::F32 {
                    x: head_in,
                    y: ws.logits.view(),
                };
                self.k
                    .gemv(op, w.head_gemv(), r, v, h)
                    .map_err(ke("LM head GEMV"))?;
            }
            Proj::Gemm => {
                let io = self.gemm_io();
                let head = match &w.lm_head {
                    Some(p) => p.bf16(&io, v, h)?,
                    None => w.embed.view(),
                };
                let d = GemmDims { m: r, n: v, k: h };
                self.products
                    .head(&io, head, head_in, ws.logits.view(), d)?;
            }
        }
        match c.spec.final_logit_softcap {
            Some(cap) => self
                .k
                .softcap_rows(ws.logits.view(), r * v, cap as f32)
                .map_err(ke("logit soft-cap")),
            None => Ok(()),
        }
    }

    /// Enqueues sampling of the `lay.r` rows of logits the forward pass of
    /// the step staged at `lay` left in the workspace, with the parameters
    /// and history staged there.
    pub(super) fn enqueue_sampler(&self, lay: &Layout) -> Result<(), BackendError> {
        let ws = &self.ws;
        let meta = ws.meta.view();
        let part = |off: usize, len: usize| meta.sub(off, len).map_err(ge("staging view"));
        let r = lay.r;
        let params = part(lay.params, r * PARAM_WORDS)?
            .cast()
            .map_err(ge("params view"))?;
        let history = part(lay.history, lay.hist_cap.max(1))?;
        let out = SampleOutputs {
            tokens: ws.tok.view(),
            logprobs: ws.lp.view(),
            top_ids: ws.top_ids.view(),
            top_lps: ws.top_lps.view(),
        };
        let scratch = SampleScratch {
            work: ws.work.view(),
            stats: ws.samp_stats.view(),
            keys: ws.samp_keys.view(),
        };
        let (logits, v) = (ws.logits.view(), self.config.vocab_size);
        // SAFETY: each row's history range was staged inside the history area, ids distinct.
        unsafe {
            self.k
                .sample_rows(logits, scratch, params, history, out, r, v, MAX_LOGPROBS)
        }
        .map_err(ke("sampling"))
    }
}
