//! The fast CPU forward pass ([`CpuPath::Fast`](super::CpuPath)): the same
//! step as [`forward`](super::forward) (the layer the model's spec
//! describes) on the `cpu-kernels` crate.
//!
//! Contract: [`FastWeights::pack`] takes each layer's projections once at
//! construction and concatenates Q/K/V into one `[q_dim + 2 kv_dim, hidden]`
//! and gate/up into one `[2 intermediate, hidden]` matrix, BF16 or the
//! stored blocks (see `packed`; the layer's
//! original buffers are released; on AVX-512 BF16 is packed as `k`-pair
//! panels, and where the processor has AVX-512 BF16 + VNNI an 8-bit copy
//! is added, one byte per weight). A BF16 LM head is packed as panels too
//! on AVX-512 (its row-major buffer released; a tied embedding's lookup
//! reads its rows back from the panels). [`CpuBackend::forward_fast`] runs
//! embedding, per layer RMSNorm, the fused QKV product, the layer's RoPE,
//! the KV write, paged causal attention under the layer's scale, soft-cap
//! and window, the output product and residual, RMSNorm, the
//! fused gate/up product, the gated activation, the down product and residual, then the
//! final norm and the LM head for the asked rows only. The arithmetic of
//! generated tokens is the reference's (f32 over exactly widened BF16
//! weights, RMSNorm's mean in f64, the same RoPE table and softmax); only
//! the order of additions differs, so their logits agree with the reference
//! path to about `1e-5` relative. Prompt tokens
//! ([`StepBatch::prompt_lens`]) run the projections on
//! `cpu_kernels::gemm_split` where it runs: about `1e-4` relative (the
//! golden tests hold both to `1e-3`); over quantised blocks, on
//! `cpu_kernels::quant::gemm` (the row kernel's integer sums in another
//! f32 order). A token's products never depend on the other rows' values;
//! by default they do depend on the step's shape in three places: a token's
//! kind (prompt or generated) picks its products, a prefill chunk of
//! [`SEGMENT_GEMM_MIN`]+ tokens runs attention as GEMMs and a shorter one
//! per token (so a prompt's chunking, a prefix-cache hit and a recompute
//! after preemption change the bits of its rows), and row-major BF16
//! products (every projection and the BF16 LM head without AVX-512) switch
//! from the register-tiled regime to a GEMM at 16 rows.
//!
//! Deterministic mode (`CpuBackend::with_deterministic`, `--deterministic`)
//! removes all three: every row runs [`Rows::Invariant`] (the panels'
//! `matmul_pairs`, the tiled BF16 regime at every row count, the quantised
//! row kernels; never `gemm_split`, `quant::gemm`, `gemm512::matmul` or the
//! `gemm` crate) and every token's attention runs [`decode_attention`]
//! (positions in chunks of `decode::KV_SPLIT` from the first it sees,
//! merged in order: a function of the token's position and the layer's
//! window alone). What is invariant in
//! both modes: the elementwise steps (norms with the mean in f64, RoPE,
//! SwiGLU, residuals: per row, serial or on rayon alike), the KV writes,
//! the LoRA deltas (per row), the split of every product over threads (by
//! output columns, never over `k`), decode attention's serial or parallel
//! tasks, and sampling (per row, over that row's logits). The reference
//! path is invariant by construction (a dot product per output, attention
//! per token).
//!
//! Costs per step of `T` tokens and `R` output rows: on AVX-512 one read of
//! the packed weights per step and 12 tokens (bound by memory bandwidth
//! for decode), else one read of the BF16 weights per four tokens while `T
//! < 16` (register-tiled GEMV) or one widening pass per matrix plus the
//! `gemm` crate's GEMM; prompt rows also one split of their activations
//! per product; a step mixing prompt and generated rows copies each kind's
//! rows in and out. Attention for decodes per (token, KV head, chunk of
//! positions) over the pool's stored type, merged by log-sum-exp (see
//! `decode`; on rayon when the step has enough of it), and as two GEMMs
//! per head and block of rows for prefill chunks of 16+ tokens
//! (`segment_attention`, each KV head's keys and values gathered, widened
//! to f32 and packed once per chunk). The elementwise steps run over rows on rayon for steps of
//! 32+ tokens. Every activation buffer lives in [`Workspace`] and is
//! reused step after step (grown to the largest step seen), as are a
//! chunk's gathered K/V and per-block outputs ([`SegmentScratch`]) and
//! each pool thread's attention scores: once the largest step has run, a
//! step allocates only its returned logits.
//!
//! One file on purpose: the fast step is one pipeline over one set of reused
//! buffers, and each stage's shape assumptions are checked by the stage after
//! it; split, the buffer contract would be spread over files.
//!
//! One file past the usual size on purpose: the packed weights and the step
//! that reads them change together (a layout and its one reader).

use super::attention::KvPool;
use super::decode::{DecodeScratch, PoolView, decode_attention, row_of};
use super::layer::{LayerVecs, qk_norm};
use super::lora::delta;
use super::packed::{CpuWeights, Layout, MatBufs, Matrix, Part, Rows, pack_group, pack_head};
use super::{CpuBackend, Out};
use checkpoint::projection::Projection;
use checkpoint::weights::Extra as X;
use checkpoint::weights::ModelWeights;
use contract::Activation;
use contract::backend::{BackendError, StepBatch};
use contract::lora::LoraTarget as L;
use cpu_kernels::Isa;
use cpu_kernels::gemm512::{Packed, matmul_packed};
use cpu_kernels::kv::widen;
use cpu_kernels::matmul::{gemm_nt_f32, matmul_bf16, matmul_bf16_tiled};
use cpu_kernels::vector::{add_assign, rms_norm, rope, silu_mul, softmax_scaled};
use half::slice::HalfFloatSliceExt;
use ops::activation::gelu_tanh_mul;
use ops::norm::{add_rows, rms_norm_in_place, softcap};
use ops::{AttnDims, KvView, ScoreRule};
use rayon::prelude::*;

/// One layer's projections, packed for the fused products.
struct FastLayer {
    qkv: Matrix,     // [q_dim + 2 kv_dim, hidden]
    o: Matrix,       // [hidden, q_dim]
    gate_up: Matrix, // [2 intermediate, hidden]
    down: Matrix,    // [hidden, intermediate]
}

/// Every layer's packed projections, and the LM head unless it is the
/// tied embedding's row-major BF16 buffer.
pub(super) struct FastWeights {
    layers: Vec<FastLayer>,
    head: Option<Matrix>, // [vocab, hidden]
    /// The tied embedding's rows are read from `head`'s panels (its
    /// row-major buffer released).
    embed_in_head: bool,
}

impl FastWeights {
    /// Packs every layer of `w` (already shape-checked) in `format`,
    /// releasing the projections' stored buffers as it goes; BF16 values
    /// in `layout`.
    pub(super) fn pack(
        w: &mut ModelWeights,
        format: CpuWeights,
        layout: Layout,
    ) -> Result<Self, BackendError> {
        let quantize_to = match format {
            CpuWeights::Stored => None,
            CpuWeights::Quantize(qt) => Some(qt),
        };
        let mut layers = Vec::with_capacity(w.layers.len());
        for l in &mut w.layers {
            let group = |ps: &mut [&mut Projection]| -> Result<Matrix, BackendError> {
                let rows: Vec<usize> = ps.iter().map(|p| p.shape()[0]).collect();
                let [_, cols] = ps[0].shape();
                let name = ps[0].name().to_string();
                let parts = (ps.iter_mut())
                    .map(|p| Part::of(p))
                    .collect::<Result<_, _>>()?;
                pack_group(parts, &rows, cols, &name, quantize_to, layout)
            };
            layers.push(FastLayer {
                qkv: group(&mut [&mut l.q_proj, &mut l.k_proj, &mut l.v_proj])?,
                o: group(&mut [&mut l.o_proj])?,
                gate_up: group(&mut [&mut l.gate_proj, &mut l.up_proj])?,
                down: group(&mut [&mut l.down_proj])?,
            });
        }
        let (head, embed_in_head) = pack_head(w, format, layout)?;
        if let Some(want) = quantize_to {
            let all: Vec<&Matrix> = layers
                .iter()
                .flat_map(|l| [&l.qkv, &l.o, &l.gate_up, &l.down])
                .collect();
            let other = all.iter().filter(|m| m.quant_type() != Some(want)).count();
            if other > 0 {
                tracing::info!(
                    "cpu: {other} of {} projections quantised to Q4_1, not {} (rows not whole blocks of {})",
                    all.len(),
                    want.name(),
                    want.block_len()
                );
            }
        }
        Ok(FastWeights {
            layers,
            head,
            embed_in_head,
        })
    }

    /// Bytes a generated row reads of the layers' projections, and of the
    /// LM head's own matrix (`None`: the embedding's row-major buffer).
    pub(super) fn bytes(&self) -> (usize, Option<usize>) {
        let layers = (self.layers.iter())
            .flat_map(|l| [&l.qkv, &l.o, &l.gate_up, &l.down])
            .map(Matrix::bytes)
            .sum();
        (layers, self.head.as_ref().map(Matrix::bytes))
    }

    /// Whether prompt rows run the split products.
    pub(super) fn splits(&self) -> bool {
        self.layers
            .first()
            .is_some_and(|l| l.qkv.has_split() || l.gate_up.has_split())
    }

    /// Drops every 8-bit copy: prompt rows then run the f32 products.
    pub(super) fn drop_split(&mut self) {
        for l in &mut self.layers {
            for m in [&mut l.qkv, &mut l.o, &mut l.gate_up, &mut l.down] {
                m.drop_split();
            }
        }
    }
}

/// The step's activation buffers, reused across steps.
#[derive(Default)]
pub(super) struct Workspace {
    x: Vec<f32>,                      // [T, hidden] residual stream
    h: Vec<f32>,                      // [T, hidden] normed
    qkv: Vec<f32>,                    // [T, q_dim + 2 kv_dim]
    attn: Vec<f32>,                   // [T, q_dim]
    proj: Vec<f32>,                   // [T, hidden]
    gu: Vec<f32>,                     // [T, 2 intermediate]
    act: Vec<f32>,                    // [T, intermediate]
    segment: SegmentScratch,          // prefill chunks' attention
    decode: DecodeScratch,            // decode tokens' attention
    seq_of: Vec<usize>,               // [T] sequence of each token
    prompt: Vec<usize>,               // prompt token rows (mixed steps)
    write_order: Vec<(usize, usize)>, // the step's KV writes by block
    generated: Vec<usize>,            // generated token rows (mixed steps)
    fp8_in: Vec<f32>,                 // a product's input rounded to e4m3 (FP8 activations)
    bufs: MatBufs,
}

/// Token rows per rayon task of the elementwise steps (norms, RoPE,
/// residuals, SwiGLU); a step of fewer than twice as many runs them on the
/// calling thread. Each row computes the same bits either way.
const ROWS_PER_TASK: usize = 16;

/// `x` (`[T, k]`) as a product reads it: rounded to e4m3 a row at a time
/// into `buf` with FP8 activations (`on`), else `x` itself.
pub(super) fn product_input<'a>(
    on: bool,
    x: &'a [f32],
    k: usize,
    buf: &'a mut Vec<f32>,
) -> &'a [f32] {
    if !on {
        return x;
    }
    let b = sized(buf, x.len());
    b.copy_from_slice(x);
    ops::fp8::round_rows(b, k);
    b
}

/// `f(i, row i of a)` over the `[T, w]` rows of `a`.
fn each_row(a: &mut [f32], w: usize, f: impl Fn(usize, &mut [f32]) + Sync + Send) {
    if a.len() >= 2 * ROWS_PER_TASK * w {
        a.par_chunks_exact_mut(w)
            .enumerate()
            .with_min_len(ROWS_PER_TASK)
            .for_each(|(i, r)| f(i, r));
    } else {
        a.chunks_exact_mut(w).enumerate().for_each(|(i, r)| f(i, r));
    }
}

/// `f(row i of a, row i of b)` over the `[T, wa]` rows of `a` and `[T, wb]` of `b`.
fn each_row_pair(
    a: &mut [f32],
    wa: usize,
    b: &[f32],
    wb: usize,
    f: impl Fn(&mut [f32], &[f32]) + Sync + Send,
) {
    if a.len() >= 2 * ROWS_PER_TASK * wa {
        a.par_chunks_exact_mut(wa)
            .zip(b.par_chunks_exact(wb))
            .with_min_len(ROWS_PER_TASK)
            .for_each(|(x, y)| f(x, y));
    } else {
        a.chunks_exact_mut(wa)
            .zip(b.chunks_exact(wb))
            .for_each(|(x, y)| f(x, y));
    }
}

/// Sets `v` to `n` elements (contents unspecified), growing it only when needed.
fn sized(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if v.len() < n {
        v.resize(n, 0.0);
    }
    &mut v[..n]
}

impl CpuBackend {
    /// The fast path's forward pass (see the module doc): logits of token
    /// rows `rows`, `[rows.len(), vocab]` row-major (or with [`Out::Hidden`]
    /// their final-normed hidden states, `[rows.len(), hidden]`).
    pub(super) fn forward_fast(
        &mut self,
        fast: &FastWeights,
        batch: &StepBatch,
        rows: &[usize],
        out: Out,
    ) -> Vec<f32> {
        let isa = self.isa;
        let fp8a = self.fp8_activations;
        let c = &self.config;
        let ws = &mut self.ws;
        let (hidden, q_dim, kv_dim, inter) =
            (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
        let qkv_w = q_dim + 2 * kv_dim;
        let eps = c.rms_norm_eps;
        let t = batch.num_tokens();
        let dims = AttnDims {
            heads: c.num_heads,
            kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
        };
        {
            let x = sized(&mut ws.x, t * hidden);
            for (row, &id) in x.chunks_exact_mut(hidden).zip(&batch.tokens) {
                match &fast.head {
                    Some(Matrix::Panels { w, .. }) if fast.embed_in_head => {
                        w.row_f32(id as usize, row)
                    }
                    _ => self.weights.embed.data[id as usize * hidden..][..hidden]
                        .convert_to_f32_slice(row),
                }
                if c.spec.embed_scale != 1.0 {
                    row.iter_mut().for_each(|v| *v *= c.spec.embed_scale);
                }
            }
        }
        ws.seq_of.clear();
        ws.prompt.clear();
        ws.generated.clear();
        for s in 0..batch.num_seqs() {
            let (a, b) = (
                batch.cu_seqlens[s] as usize,
                batch.cu_seqlens[s + 1] as usize,
            );
            ws.seq_of.extend(std::iter::repeat_n(s, b - a));
            for i in a..b {
                match batch.is_prompt_token(s, i) {
                    true => ws.prompt.push(i),
                    false => ws.generated.push(i),
                }
            }
        }
        self.pool
            .write_order(&batch.slot_mapping, &mut ws.write_order);
        let det = self.deterministic;
        let rows_kind = match (ws.prompt.len(), ws.generated.len()) {
            _ if det => Rows::Invariant,
            (_, 0) => Rows::Prompt,
            (0, _) => Rows::Generated,
            _ => Rows::Mixed {
                prompt: &ws.prompt,
                generated: &ws.generated,
            },
        };
        let lrows = self.lora.rows(batch); // [T] each row's adapter
        let lr = lrows.as_deref();
        for (l, lw) in fast.layers.iter().enumerate() {
            let norms = &self.norms[l];
            let x = &mut ws.x[..t * hidden];
            let h = sized(&mut ws.h, t * hidden);
            each_row_pair(h, hidden, x, hidden, |hr, xr| {
                rms_norm(xr, &norms.input, eps, hr)
            });
            let qkv = sized(&mut ws.qkv, t * qkv_w);
            let hq = product_input(fp8a, h, hidden, &mut ws.fp8_in);
            lw.qkv
                .matmul(isa, hq, hidden, qkv_w, qkv, rows_kind, &mut ws.bufs);
            delta(lr, l, L::Q, h, hidden, qkv, qkv_w, 0);
            delta(lr, l, L::K, h, hidden, qkv, qkv_w, q_dim);
            delta(lr, l, L::V, h, hidden, qkv, qkv_w, q_dim + kv_dim);
            let table = self.rope.layer(l);
            let (cos, sin, half) = (table.cos(), table.sin(), c.head_dim / 2);
            let pool = &self.pool;
            each_row(qkv, qkv_w, |i, row| {
                if let Some(b) = &norms.qkv_bias {
                    add_rows(row, b);
                }
                qk_norm(norms, row, q_dim, kv_dim, eps);
                let pos = batch.positions[i] as usize;
                let (cos, sin) = (&cos[pos * half..][..half], &sin[pos * half..][..half]);
                // Q and K: the first q_dim + kv_dim values, whole heads
                rope(isa, &mut row[..q_dim + kv_dim], cos, sin);
                pool.rotate_qk(&mut row[..q_dim + kv_dim], c.head_dim);
            });
            self.pool
                .write_packed(l, qkv, qkv_w, q_dim, &batch.slot_mapping, &ws.write_order);
            let attn = sized(&mut ws.attn, t * q_dim);
            attention(
                isa,
                &self.pool,
                l,
                qkv,
                qkv_w,
                batch,
                &ws.seq_of,
                dims,
                ScoreRule::of(&c.spec.layers[l].attention),
                attn,
                &mut ws.segment,
                &mut ws.decode,
                det,
            );
            let proj = sized(&mut ws.proj, t * hidden);
            let aq = product_input(fp8a, attn, q_dim, &mut ws.fp8_in);
            lw.o.matmul(isa, aq, q_dim, hidden, proj, rows_kind, &mut ws.bufs);
            delta(lr, l, L::O, attn, q_dim, proj, hidden, 0);
            out_extras(proj, hidden, norms, X::OBias, X::AttnOutNorm, eps);
            each_row_pair(x, hidden, proj, hidden, add_assign);
            each_row_pair(h, hidden, x, hidden, |hr, xr| {
                rms_norm(xr, &norms.post, eps, hr)
            });
            let gu = sized(&mut ws.gu, t * 2 * inter);
            let hq = product_input(fp8a, h, hidden, &mut ws.fp8_in);
            lw.gate_up
                .matmul(isa, hq, hidden, 2 * inter, gu, rows_kind, &mut ws.bufs);
            delta(lr, l, L::Gate, h, hidden, gu, 2 * inter, 0);
            delta(lr, l, L::Up, h, hidden, gu, 2 * inter, inter);
            if let Some(b) = &norms.gate_up_bias {
                each_row(gu, 2 * inter, |_, row| add_rows(row, b));
            }
            let act = sized(&mut ws.act, t * inter);
            let activation = c.spec.layers[l].mlp.activation;
            each_row_pair(act, inter, gu, 2 * inter, |a, g| {
                a.copy_from_slice(&g[..inter]);
                match activation {
                    Activation::Silu => silu_mul(isa, a, &g[inter..]),
                    Activation::GeluTanh => gelu_tanh_mul(a, &g[inter..]),
                }
            });
            let mq = product_input(fp8a, act, inter, &mut ws.fp8_in);
            lw.down
                .matmul(isa, mq, inter, hidden, proj, rows_kind, &mut ws.bufs);
            delta(lr, l, L::Down, act, inter, proj, hidden, 0);
            out_extras(proj, hidden, norms, X::DownBias, X::MlpOutNorm, eps);
            each_row_pair(x, hidden, proj, hidden, add_assign);
        }
        // [R, hidden] only the rows whose logits are wanted, normed
        let r = rows.len();
        let picked = sized(&mut ws.proj, r * hidden);
        for (dst, &row) in picked.chunks_exact_mut(hidden).zip(rows) {
            dst.copy_from_slice(&ws.x[row * hidden..(row + 1) * hidden]);
        }
        let h = sized(&mut ws.h, r * hidden);
        rms_norm(picked, &self.final_norm, eps, h);
        if out == Out::Hidden {
            return h.to_vec();
        }
        let mut logits = vec![0f32; r * c.vocab_size]; // [R, vocab]
        let head = &self.weights.embed.data; // tied, row-major (`fast.head` is `None`)
        match &fast.head {
            Some(m) => m.matmul(
                isa,
                h,
                hidden,
                c.vocab_size,
                &mut logits,
                if det {
                    Rows::Invariant
                } else {
                    Rows::Generated
                },
                &mut ws.bufs,
            ),
            None if det => matmul_bf16_tiled(isa, h, head, hidden, c.vocab_size, &mut logits),
            None => matmul_bf16(
                isa,
                h,
                head,
                hidden,
                c.vocab_size,
                &mut logits,
                &mut ws.bufs.scratch,
            ),
        }
        if let Some(cap) = c.spec.final_logit_softcap {
            softcap(&mut logits, cap as f32);
        }
        logits
    }
}

/// A projection's output `y` (`[T, w]`) before its residual add: plus
/// the layer's `bias` and through its output norm `norm`, where it has them.
fn out_extras(y: &mut [f32], w: usize, v: &LayerVecs, bias: X, norm: X, eps: f32) {
    let (b, g) = (v.get(bias), v.get(norm));
    if b.is_none() && g.is_none() {
        return;
    }
    each_row(y, w, |_, row| {
        if let Some(b) = b {
            add_rows(row, b);
        }
        if let Some(g) = g {
            rms_norm_in_place(row, g, eps);
        }
    });
}

/// Segments at least this long run attention as two GEMMs per head
/// ([`segment_attention`]); shorter ones (decode) per (token, head).
const SEGMENT_GEMM_MIN: usize = 16;

/// Causal paged attention (under the layer's `rule`) of the queries in `qkv` (`[T, qkv_w]`, the first
/// `q_dim` columns of each row, RoPE applied) over `layer`'s pool, into `out`
/// (`[T, q_dim]`): `ops::paged_attention_in`'s arithmetic. Segments of
/// [`SEGMENT_GEMM_MIN`] tokens or more (prefill chunks) run
/// [`segment_attention`]; the other tokens run [`decode_attention`]. With
/// `deterministic`, every token runs [`decode_attention`], whose order over
/// positions depends only on the token's own context length, so a token
/// gets the same bits in a chunk of any length.
#[allow(clippy::too_many_arguments)]
fn attention(
    isa: Isa,
    pool: &KvPool,
    layer: usize,
    qkv: &[f32],
    qkv_w: usize,
    batch: &StepBatch,
    seq_of: &[usize],
    dims: AttnDims,
    rule: ScoreRule,
    out: &mut [f32],
    seg_scratch: &mut SegmentScratch,
    dec_scratch: &mut DecodeScratch,
    deterministic: bool,
) {
    let hd = dims.head_dim;
    let (kc, vc, kv_dim, bs) = pool.layer(layer);
    let seg_len = |s: usize| (batch.cu_seqlens[s + 1] - batch.cu_seqlens[s]) as usize;
    let long = |s: usize| !deterministic && seg_len(s) >= SEGMENT_GEMM_MIN;
    let view = PoolView {
        k: kc,
        v: vc,
        kv_dim,
        block_size: bs,
    };
    decode_attention(
        isa,
        view,
        qkv,
        qkv_w,
        batch,
        seq_of,
        |t| !long(seq_of[t]),
        dims,
        rule,
        out,
        dec_scratch,
        None,
    );
    let q_dim = dims.heads * hd;
    for s in (0..batch.num_seqs()).filter(|&s| long(s)) {
        let (t0, t1) = (
            batch.cu_seqlens[s] as usize,
            batch.cu_seqlens[s + 1] as usize,
        );
        let table = &batch.block_tables[s * batch.max_blocks..(s + 1) * batch.max_blocks];
        let seg = Segment {
            q: &qkv[t0 * qkv_w..t1 * qkv_w],
            qkv_w,
            positions: &batch.positions[t0..t1],
            table,
            kc,
            vc,
            kv_dim,
            block_size: bs,
        };
        segment_attention(
            isa,
            &seg,
            dims,
            rule,
            &mut out[t0 * q_dim..t1 * q_dim],
            seg_scratch,
        );
    }
}

/// One sequence's prefill chunk and its paged cache, for [`segment_attention`].
struct Segment<'a> {
    /// `[n, qkv_w]` packed rows; the queries are the first `q_dim` columns.
    q: &'a [f32],
    qkv_w: usize,
    /// `[n]` positions of the chunk's tokens.
    positions: &'a [u32],
    /// The sequence's block table.
    table: &'a [u32],
    kc: KvView<'a>,
    vc: KvView<'a>,
    kv_dim: usize,
    block_size: usize,
}

thread_local! {
    /// Each thread's attention scores (a decode's per token and head, a
    /// chunk's per block of rows), reused call after call.
    static SCORES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// What [`segment_attention`] keeps from chunk to chunk, so that a chunk
/// allocates nothing once the largest one has run: every KV head's
/// gathered keys and values, and the (head, block of rows) outputs.
#[derive(Default)]
pub(super) struct SegmentScratch {
    kv: Vec<HeadKv>,
    /// `[heads * blocks, SEGMENT_ROWS, head_dim]`
    outs: Vec<f32>,
}

/// One KV head's keys and values as a chunk's attention products read
/// them, gathered from the pool once per chunk (widened to f32 as
/// `cpu_kernels::kv::widen` reads them).
enum HeadKv {
    /// AVX-512: packed for the micro-kernel (keys as rows, values as
    /// columns), so no (head, block) task packs them again; `wide` holds
    /// K then V `[2, ctx, head_dim]` widened, when the pool is not f32.
    Packed {
        k: Packed,
        v: Packed,
        wide: Vec<f32>,
    },
    /// Elsewhere: K `[ctx, head_dim]` and V^T `[head_dim, ctx]`.
    Plain { k: Vec<f32>, vt: Vec<f32> },
}

/// Query rows per block of [`segment_attention`]: a block computes scores
/// only up to its last row's position (the causal triangle, block-wise).
/// The unit tests' chunks (up to 37 tokens) span several blocks of 8.
const SEGMENT_ROWS: usize = if cfg!(test) { 8 } else { 96 };

/// Causal attention of a whole chunk, per KV head: its keys (`[ctx,
/// head_dim]`) and transposed values (`[head_dim, ctx]`) gathered from the
/// pool into contiguous buffers, then per query head and block of
/// [`SEGMENT_ROWS`] rows `S = Q K^T` over the keys the block can see (one
/// GEMM), the layer's row softmax (row `i` keeps keys
/// `rule.first(positions[i])..=positions[i]`, scaled and capped by `rule`;
/// the others weigh 0: a windowed layer's chunk still computes every
/// score up to the block's last position) and `O = P V` (one GEMM), into `out` (`[n, q_dim]`).
/// Keys and values before the chunk's earliest window are gathered as
/// zeros, never read: on a pool whose every layer is windowed, their blocks
/// may have gone back to the pool (`paged_kv`'s window freeing).
/// (head, block) pairs run in parallel on rayon, each GEMM on one thread
/// ([`gemm_nt_f32`]). Costs: about `n * ctx * head_dim` multiply-adds per
/// head for the causal part plus a block's triangle, `SEGMENT_ROWS * ctx`
/// floats of scores per task in flight, `2 * ctx * head_dim` floats per KV
/// head.
fn segment_attention(
    isa: Isa,
    seg: &Segment<'_>,
    dims: AttnDims,
    rule: ScoreRule,
    out: &mut [f32],
    scratch: &mut SegmentScratch,
) {
    let (heads, hd) = (dims.heads, dims.head_dim);
    let group = heads / dims.kv_heads;
    let q_dim = heads * hd;
    let n = seg.positions.len();
    let ctx = seg
        .positions
        .iter()
        .map(|&p| p as usize + 1)
        .max()
        .unwrap_or(0);
    let bs = seg.block_size;
    let slot = |j: usize| (seg.table[j / bs] as usize * bs + j % bs) * seg.kv_dim;
    // keys before every row's window are zeros (their blocks may be released)
    let lo = (seg.positions.iter())
        .map(|&p| rule.first(p as usize))
        .min()
        .unwrap_or(0);
    let zeros = vec![0f32; hd];
    let packed = isa == Isa::Avx512;
    // per KV head, gathered from the pool once, into the storage of the
    // previous chunk's (no allocation once the largest chunk has run; the
    // backend's ISA, hence each head's form, never changes)
    let SegmentScratch { kv, outs } = scratch;
    kv.resize_with(dims.kv_heads, || {
        if packed {
            HeadKv::Packed {
                k: Packed::default(),
                v: Packed::default(),
                wide: Vec::new(),
            }
        } else {
            HeadKv::Plain {
                k: Vec::new(),
                vt: Vec::new(),
            }
        }
    });
    kv.par_iter_mut().enumerate().for_each(|(g, head)| {
        let key = |j: usize| row_of(seg.kc, slot(j) + g * hd, hd);
        let value = |j: usize| row_of(seg.vc, slot(j) + g * hd, hd);
        match head {
            HeadKv::Packed { k, v, wide } => match (seg.kc, seg.vc) {
                (KvView::F32(kc), KvView::F32(vc)) => {
                    let z = &zeros[..];
                    k.refill_rows(hd, ctx, |j| match j < lo {
                        true => z,
                        false => &kc[slot(j) + g * hd..][..hd],
                    });
                    v.refill_columns(ctx, hd, |j| match j < lo {
                        true => z,
                        false => &vc[slot(j) + g * hd..][..hd],
                    });
                }
                _ => {
                    // every value is written below: only growth is zeroed
                    wide.resize(2 * ctx * hd, 0.0);
                    let (wk, wv) = wide.split_at_mut(ctx * hd);
                    wk[..lo * hd].fill(0.0);
                    wv[..lo * hd].fill(0.0);
                    for j in lo..ctx {
                        widen(isa, key(j), &mut wk[j * hd..(j + 1) * hd]);
                        widen(isa, value(j), &mut wv[j * hd..(j + 1) * hd]);
                    }
                    let (wk, wv) = (&*wk, &*wv);
                    k.refill_rows(hd, ctx, |j| &wk[j * hd..(j + 1) * hd]);
                    v.refill_columns(ctx, hd, |j| &wv[j * hd..(j + 1) * hd]);
                }
            },
            HeadKv::Plain { k, vt } => {
                // every value is written below: only growth is zeroed
                k.resize(ctx * hd, 0.0);
                vt.resize(hd * ctx + hd, 0.0);
                let (vt, row) = vt.split_at_mut(hd * ctx);
                for j in 0..ctx {
                    if j < lo {
                        k[j * hd..(j + 1) * hd].fill(0.0);
                        row.fill(0.0);
                    } else {
                        widen(isa, key(j), &mut k[j * hd..(j + 1) * hd]);
                        widen(isa, value(j), row);
                    }
                    for (d, &v) in row.iter().enumerate() {
                        vt[d * ctx + j] = v;
                    }
                }
            }
        }
    });
    let kv = &*kv;
    // one task per (head, block of rows), so the work spreads over the
    // threads however few heads there are; each block is computed exactly
    // as a head's pass over its blocks would (the same GEMMs, the same rows).
    // Block i is head i / per_head's rows from (i % per_head) * SEGMENT_ROWS;
    // its [rows, hd] output goes to its own stretch of `outs`, copied into
    // `out` after.
    let per_head = n.div_ceil(SEGMENT_ROWS);
    let span = SEGMENT_ROWS * hd;
    outs.resize(heads * per_head * span, 0.0);
    outs.par_chunks_mut(span).enumerate().for_each(|(i, o)| {
        let (h, r0) = (i / per_head, (i % per_head) * SEGMENT_ROWS);
        let r1 = (r0 + SEGMENT_ROWS).min(n);
        let rows = &seg.positions[r0..r1];
        let kb = rows.iter().map(|&p| p as usize + 1).max().unwrap_or(0);
        let m = r1 - r0;
        let o = &mut o[..m * hd];
        SCORES.with_borrow_mut(|sc| {
            // [rows, ctx] scores, reused by the thread's next blocks: the
            // first kb of each row are written below before any is read
            if sc.len() < m * ctx {
                sc.resize(m * ctx, 0.0);
            }
            let sc = &mut sc[..m * ctx];
            let q = &seg.q[r0 * seg.qkv_w + h * hd..];
            match &kv[h / group] {
                HeadKv::Packed { k, .. } => matmul_packed(q, seg.qkv_w, m, k, hd, kb, sc, ctx),
                HeadKv::Plain { k, .. } => {
                    gemm_nt_f32(isa, q, seg.qkv_w, m, k, hd, hd, kb, sc, ctx)
                }
            }
            for (row, &p) in sc.chunks_exact_mut(ctx).zip(rows) {
                let (lo, keep) = (rule.first(p as usize), p as usize + 1);
                let seen = &mut row[lo..keep];
                match rule.softcap {
                    None => softmax_scaled(isa, seen, rule.scale),
                    Some(_) => {
                        seen.iter_mut().for_each(|x| *x = rule.score(*x));
                        softmax_scaled(isa, seen, 1.0);
                    }
                }
                row[..lo].fill(0.0);
                row[keep..kb].fill(0.0);
            }
            o.fill(0.0);
            match &kv[h / group] {
                HeadKv::Packed { v, .. } => matmul_packed(sc, ctx, m, v, kb, hd, o, hd),
                HeadKv::Plain { vt, .. } => gemm_nt_f32(isa, sc, ctx, m, vt, ctx, kb, hd, o, hd),
            }
        });
    });
    // row i of head h is row i % SEGMENT_ROWS of block (h, i / SEGMENT_ROWS)
    let outs = &*outs;
    out[..n * q_dim]
        .par_chunks_mut(q_dim)
        .enumerate()
        .with_min_len(ROWS_PER_TASK)
        .for_each(|(i, row)| {
            let (b, r) = (i / SEGMENT_ROWS, i % SEGMENT_ROWS);
            for (h, dst) in row.chunks_exact_mut(hd).enumerate() {
                dst.copy_from_slice(&outs[(h * per_head + b) * span + r * hd..][..hd]);
            }
        });
}
