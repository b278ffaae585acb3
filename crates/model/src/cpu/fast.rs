//! The fast CPU forward pass ([`CpuPath::Fast`](super::CpuPath)): the same
//! Llama step as [`forward`](super::forward) on the `cpu-kernels` crate.
//!
//! Contract: [`FastWeights::pack`] takes each layer's projections once at
//! construction and concatenates Q/K/V into one `[q_dim + 2 kv_dim, hidden]`
//! and gate/up into one `[2 intermediate, hidden]` BF16 matrix (the layer's
//! original tensors are released, so memory stays the model's BF16 size);
//! [`CpuBackend::forward_fast`] runs embedding, per layer RMSNorm, the fused
//! QKV product, RoPE, the KV write, paged causal attention, the output
//! product and residual, RMSNorm, the fused gate/up product, SwiGLU, the down
//! product and residual, then the final norm and the LM head for the asked
//! rows only. The arithmetic is the reference's (f32 over exactly widened
//! BF16 weights, RMSNorm's mean in f64, the same RoPE table and softmax);
//! only the order of additions differs, so logits agree with the reference
//! path to about `1e-5` relative (the golden tests hold it to `1e-3`).
//!
//! Costs per step of `T` tokens and `R` output rows: one read of the BF16
//! weights per four tokens while `T < 16` (register-tiled GEMV, bound by
//! memory bandwidth) or one widening pass per matrix plus a cache-blocked
//! f32 GEMM otherwise (`cpu-kernels`: AVX-512, else the `gemm` crate);
//! attention per (token, head) with SIMD dot products for decodes (on rayon
//! when the step has enough of it), and as two GEMMs per head and block of
//! rows for prefill chunks of 16+ tokens (`segment_attention`). Every
//! activation buffer lives in [`Workspace`] and is reused step after step
//! (grown to the largest step seen); a decode step allocates only its
//! returned logits (and, for parallel attention, one score buffer per rayon
//! task); a prefill chunk also its gathered K/V and per-head scores.

use super::CpuBackend;
use super::attention::KvPool;
use super::packed::{CpuWeights, Matrix, pack_group, pack_head};
use checkpoint::weights::LlamaWeights;
use contract::backend::{BackendError, StepBatch};
use cpu_kernels::Isa;
use cpu_kernels::matmul::{Scratch, gemm_nt_f32, matmul_bf16};
use cpu_kernels::quant::QuantActs;
use cpu_kernels::vector::{add_assign, axpy, dot_keys, exp_scaled_sum, rms_norm, silu_mul};
use half::slice::HalfFloatSliceExt;
use ops::AttnDims;
use rayon::prelude::*;

/// Attention work (query rows x keys x head size) below which a step's
/// attention runs on the calling thread.
const PARALLEL_ATTENTION_MIN: usize = 1 << 15;

/// One layer's projections, packed for the fused products.
struct FastLayer {
    qkv: Matrix,     // [q_dim + 2 kv_dim, hidden]
    o: Matrix,       // [hidden, q_dim]
    gate_up: Matrix, // [2 intermediate, hidden]
    down: Matrix,    // [hidden, intermediate]
}

/// Every layer's packed projections, and the LM head when it is not the
/// weights' BF16 one.
pub(super) struct FastWeights {
    layers: Vec<FastLayer>,
    head: Option<Matrix>, // [vocab, hidden]
}

impl FastWeights {
    /// Packs every layer of `w` (already shape-checked) in `format`,
    /// releasing the layer tensors' BF16 buffers as it goes.
    pub(super) fn pack(w: &mut LlamaWeights, format: &CpuWeights) -> Result<Self, BackendError> {
        let (blocks, quantize_to) = match format {
            CpuWeights::Bf16 => (None, None),
            CpuWeights::Quantize(qt) => (None, Some(*qt)),
            CpuWeights::Blocks(q) => (Some(q), None),
        };
        let mut layers = Vec::with_capacity(w.layers.len());
        for (i, l) in w.layers.iter_mut().enumerate() {
            let k = blocks.and_then(|b| b.layers.get(i));
            let kept = |f: fn(&checkpoint::quantized::QuantLayer) -> &Option<_>| {
                k.and_then(|k| f(k).as_ref())
            };
            layers.push(FastLayer {
                qkv: pack_group(
                    &mut [&mut l.q_proj, &mut l.k_proj, &mut l.v_proj],
                    &[
                        kept(|k| &k.q_proj),
                        kept(|k| &k.k_proj),
                        kept(|k| &k.v_proj),
                    ],
                    quantize_to,
                )?,
                o: pack_group(&mut [&mut l.o_proj], &[kept(|k| &k.o_proj)], quantize_to)?,
                gate_up: pack_group(
                    &mut [&mut l.gate_proj, &mut l.up_proj],
                    &[kept(|k| &k.gate_proj), kept(|k| &k.up_proj)],
                    quantize_to,
                )?,
                down: pack_group(
                    &mut [&mut l.down_proj],
                    &[kept(|k| &k.down_proj)],
                    quantize_to,
                )?,
            });
        }
        let head = pack_head(w.head(), format)?;
        Ok(FastWeights { layers, head })
    }
}

/// The step's activation buffers, reused across steps.
#[derive(Default)]
pub(super) struct Workspace {
    x: Vec<f32>,        // [T, hidden] residual stream
    h: Vec<f32>,        // [T, hidden] normed
    qkv: Vec<f32>,      // [T, q_dim + 2 kv_dim]
    attn: Vec<f32>,     // [T, q_dim]
    proj: Vec<f32>,     // [T, hidden]
    gu: Vec<f32>,       // [T, 2 intermediate]
    act: Vec<f32>,      // [T, intermediate]
    scores: Vec<f32>,   // [context] (serial attention)
    seq_of: Vec<usize>, // [T] sequence of each token
    scratch: Scratch,
    acts: QuantActs,
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
    /// rows `rows`, `[rows.len(), vocab]` row-major.
    pub(super) fn forward_fast(
        &mut self,
        fast: &FastWeights,
        batch: &StepBatch,
        rows: &[usize],
    ) -> Vec<f32> {
        let isa = self.isa;
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
                self.weights.embed.data[id as usize * hidden..][..hidden].convert_to_f32_slice(row);
            }
        }
        ws.seq_of.clear();
        for s in 0..batch.num_seqs() {
            let n = (batch.cu_seqlens[s + 1] - batch.cu_seqlens[s]) as usize;
            ws.seq_of.extend(std::iter::repeat_n(s, n));
        }
        for (l, lw) in fast.layers.iter().enumerate() {
            let norms = &self.norms[l];
            let x = &mut ws.x[..t * hidden];
            let h = sized(&mut ws.h, t * hidden);
            rms_norm(x, &norms.input, eps, h);
            let qkv = sized(&mut ws.qkv, t * qkv_w);
            lw.qkv
                .matmul(isa, h, hidden, qkv_w, qkv, &mut ws.scratch, &mut ws.acts);
            for (row, &pos) in qkv.chunks_exact_mut(qkv_w).zip(&batch.positions) {
                let (q, rest) = row.split_at_mut(q_dim);
                self.rope.apply(q, pos as usize);
                self.rope.apply(&mut rest[..kv_dim], pos as usize);
            }
            self.pool
                .write_packed(l, qkv, qkv_w, q_dim, &batch.slot_mapping);
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
                attn,
                &mut ws.scores,
            );
            let proj = sized(&mut ws.proj, t * hidden);
            lw.o.matmul(
                isa,
                attn,
                q_dim,
                hidden,
                proj,
                &mut ws.scratch,
                &mut ws.acts,
            );
            add_assign(x, proj);
            rms_norm(x, &norms.post, eps, h);
            let gu = sized(&mut ws.gu, t * 2 * inter);
            lw.gate_up
                .matmul(isa, h, hidden, 2 * inter, gu, &mut ws.scratch, &mut ws.acts);
            let act = sized(&mut ws.act, t * inter);
            for (a, g) in act.chunks_exact_mut(inter).zip(gu.chunks_exact(2 * inter)) {
                a.copy_from_slice(&g[..inter]);
                silu_mul(isa, a, &g[inter..]);
            }
            lw.down
                .matmul(isa, act, inter, hidden, proj, &mut ws.scratch, &mut ws.acts);
            add_assign(x, proj);
        }
        // [R, hidden] only the rows whose logits are wanted, normed
        let r = rows.len();
        let picked = sized(&mut ws.proj, r * hidden);
        for (dst, &row) in picked.chunks_exact_mut(hidden).zip(rows) {
            dst.copy_from_slice(&ws.x[row * hidden..(row + 1) * hidden]);
        }
        let h = sized(&mut ws.h, r * hidden);
        rms_norm(picked, &self.final_norm, eps, h);
        let mut logits = vec![0f32; r * c.vocab_size]; // [R, vocab]
        match &fast.head {
            Some(m) => m.matmul(
                isa,
                h,
                hidden,
                c.vocab_size,
                &mut logits,
                &mut ws.scratch,
                &mut ws.acts,
            ),
            None => matmul_bf16(
                isa,
                h,
                &self.weights.head().data,
                hidden,
                c.vocab_size,
                &mut logits,
                &mut ws.scratch,
            ),
        }
        logits
    }
}

/// Segments at least this long run attention as two GEMMs per head
/// ([`segment_attention`]); shorter ones (decode) per (token, head).
const SEGMENT_GEMM_MIN: usize = 16;

/// Causal paged attention of the queries in `qkv` (`[T, qkv_w]`, the first
/// `q_dim` columns of each row, RoPE applied) over `layer`'s pool, into `out`
/// (`[T, q_dim]`): `ops::paged_attention`'s arithmetic. Segments of
/// [`SEGMENT_GEMM_MIN`] tokens or more (prefill chunks) run
/// [`segment_attention`]; the other tokens run per (token, head) with SIMD
/// dot products, in parallel when the step has [`PARALLEL_ATTENTION_MIN`]
/// work of that kind.
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
    out: &mut [f32],
    scores: &mut Vec<f32>,
) {
    let (heads, hd) = (dims.heads, dims.head_dim);
    let group = heads / dims.kv_heads;
    let (kc, vc, kv_dim, bs) = pool.layer(layer);
    let scale = 1.0 / (hd as f32).sqrt();
    let seg_len = |s: usize| (batch.cu_seqlens[s + 1] - batch.cu_seqlens[s]) as usize;
    let long = |s: usize| seg_len(s) >= SEGMENT_GEMM_MIN;
    let one = |idx: usize, o: &mut [f32], scores: &mut Vec<f32>| {
        let (t, h) = (idx / heads, idx % heads);
        let s = seq_of[t];
        if long(s) {
            return;
        }
        let table = &batch.block_tables[s * batch.max_blocks..(s + 1) * batch.max_blocks];
        let ctx = batch.positions[t] as usize + 1;
        let qh = &qkv[t * qkv_w + h * hd..][..hd];
        let koff = (h / group) * hd;
        let row = |j: usize| (table[j / bs] as usize * bs + j % bs) * kv_dim + koff;
        // the chunk path's arithmetic (`dot_keys`): a token recomputed from
        // the prefix cache gets the scores it got inside the first prefill
        scores.clear();
        scores.resize(ctx, 0.0);
        dot_keys(isa, qh, |j| &kc[row(j)..row(j) + hd], scores);
        for s in scores.iter_mut() {
            *s *= scale;
        }
        let m = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let inv = 1.0 / exp_scaled_sum(isa, scores, 1.0, m);
        o.fill(0.0);
        for (j, &p) in scores.iter().enumerate() {
            let r = row(j);
            axpy(isa, o, p * inv, &vc[r..r + hd]);
        }
    };
    let work: usize = (0..batch.positions.len())
        .filter(|&t| !long(seq_of[t]))
        .map(|t| batch.positions[t] as usize + 1)
        .sum::<usize>()
        * heads
        * hd;
    if work < PARALLEL_ATTENTION_MIN {
        for (idx, o) in out.chunks_exact_mut(hd).enumerate() {
            one(idx, o, scores);
        }
    } else {
        out.par_chunks_mut(hd)
            .enumerate()
            .for_each_init(Vec::<f32>::new, |scores, (idx, o)| one(idx, o, scores));
    }
    let q_dim = heads * hd;
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
        segment_attention(isa, &seg, dims, scale, &mut out[t0 * q_dim..t1 * q_dim]);
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
    kc: &'a [f32],
    vc: &'a [f32],
    kv_dim: usize,
    block_size: usize,
}

/// Query rows per block of [`segment_attention`]: a block computes scores
/// only up to its last row's position (the causal triangle, block-wise).
/// The unit tests' chunks (up to 37 tokens) span several blocks of 8.
const SEGMENT_ROWS: usize = if cfg!(test) { 8 } else { 96 };

/// Causal attention of a whole chunk, per KV head: its keys (`[ctx,
/// head_dim]`) and transposed values (`[head_dim, ctx]`) gathered from the
/// pool into contiguous buffers, then per query head and block of
/// [`SEGMENT_ROWS`] rows `S = Q K^T` over the keys the block can see (one
/// GEMM), the scaled causal row softmax (row `i` keeps keys
/// `0..=positions[i]`) and `O = P V` (one GEMM), into `out` (`[n, q_dim]`).
/// (head, block) pairs run in parallel on rayon, each GEMM on one thread
/// ([`gemm_nt_f32`]). Costs: about `n * ctx * head_dim` multiply-adds per
/// head for the causal part plus a block's triangle, `SEGMENT_ROWS * ctx`
/// floats of scores per task in flight, `2 * ctx * head_dim` floats per KV
/// head.
fn segment_attention(isa: Isa, seg: &Segment<'_>, dims: AttnDims, scale: f32, out: &mut [f32]) {
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
    // per KV head: K [ctx, hd] and V^T [hd, ctx]
    let kv: Vec<(Vec<f32>, Vec<f32>)> = (0..dims.kv_heads)
        .into_par_iter()
        .map(|g| {
            let mut k = vec![0f32; ctx * hd];
            let mut vt = vec![0f32; hd * ctx];
            for j in 0..ctx {
                let r = slot(j) + g * hd;
                k[j * hd..(j + 1) * hd].copy_from_slice(&seg.kc[r..r + hd]);
                for (d, &v) in seg.vc[r..r + hd].iter().enumerate() {
                    vt[d * ctx + j] = v;
                }
            }
            (k, vt)
        })
        .collect();
    // one task per (head, block of rows), so the work spreads over the
    // threads however few heads there are; each block is computed exactly
    // as a head's pass over its blocks would (the same GEMMs, the same rows)
    let blocks: Vec<(usize, usize)> = (0..heads)
        .flat_map(|h| (0..n).step_by(SEGMENT_ROWS).map(move |r0| (h, r0)))
        .collect();
    // [rows, hd] each block's output, copied into `out` after
    let per_block: Vec<Vec<f32>> = blocks
        .par_iter()
        .map(|&(h, r0)| {
            let (k, vt) = &kv[h / group];
            let r1 = (r0 + SEGMENT_ROWS).min(n);
            let rows = &seg.positions[r0..r1];
            let kb = rows.iter().map(|&p| p as usize + 1).max().unwrap_or(0);
            let mut sc = vec![0f32; (r1 - r0) * ctx]; // [rows, ctx]
            let q = &seg.q[r0 * seg.qkv_w + h * hd..];
            gemm_nt_f32(isa, q, seg.qkv_w, r1 - r0, k, hd, hd, kb, &mut sc, ctx);
            for (row, &p) in sc.chunks_exact_mut(ctx).zip(rows) {
                let keep = p as usize + 1;
                let m = row[..keep]
                    .iter()
                    .fold(f32::NEG_INFINITY, |m, &s| m.max(s * scale));
                let inv = 1.0 / exp_scaled_sum(isa, &mut row[..keep], scale, m);
                for s in &mut row[..keep] {
                    *s *= inv;
                }
                row[keep..kb].fill(0.0);
            }
            let mut o = vec![0f32; (r1 - r0) * hd]; // [rows, hd]
            gemm_nt_f32(isa, &sc, ctx, r1 - r0, vt, ctx, kb, hd, &mut o, hd);
            o
        })
        .collect();
    for (&(h, r0), o) in blocks.iter().zip(&per_block) {
        let dst = out[r0 * q_dim..].chunks_exact_mut(q_dim);
        for (d, src) in dst.zip(o.chunks_exact(hd)) {
            d[h * hd..(h + 1) * hd].copy_from_slice(src);
        }
    }
}
