//! The fast path's attention for decode tokens (segments shorter than a
//! prefill chunk): flash-decoding on the CPU.
//!
//! Contract: each (token, KV head) reads its keys and values in their
//! stored type ([`cpu_kernels::kv`]: widened in registers, every row once
//! for all the query heads of the KV head), over the positions it sees
//! (the layer's [`ScoreRule`]: all up to its own, or its window's) split
//! into chunks of [`KV_SPLIT`] from the first: per chunk and query head the scaled scores, their
//! maximum `m`, `l = sum exp(s - m)` and `o = sum exp(s - m) v`; the chunks
//! are merged by the log-sum-exp rule (`M = max m`, `o = sum e^(m - M) o /
//! sum e^(m - M) l`). The split depends only on the token's position and
//! the layer's window,
//! never on the step or the thread count, so the same token gets the same
//! bits whether the tasks run serially or on rayon (tested), and a token's
//! result never depends on the rest of its step. Agrees with
//! `ops::paged_attention_in` over the same cache up to the order of the
//! additions (one chunk: the reference's order of the value sums, with
//! `1 / l` applied after them).
//!
//! Costs: per token and KV head one read of its `ctx` K and V rows; tasks
//! are (token, KV head, chunk), run on rayon when the step's attention work
//! reaches [`PARALLEL_ATTENTION_MIN`]; partial results `[tasks, group * (head_dim
//! + 2)]` floats in a buffer reused across steps.

use contract::backend::StepBatch;
use cpu_kernels::Isa;
use cpu_kernels::kv::{Row, dot_keys_rows, pv_rows};
use cpu_kernels::vector::exp_scaled_sum;
use half::slice::HalfFloatSliceExt;
use ops::{AttnDims, KvView, ScoreRule};
use rayon::prelude::*;

/// Attention work (query rows x keys x head size) below which a step's
/// decode attention runs on the calling thread.
pub(super) const PARALLEL_ATTENTION_MIN: usize = 1 << 15;

/// Positions per chunk of one (token, KV head): long contexts split into
/// several tasks, short ones stay one.
pub const KV_SPLIT: usize = 512;

/// `len` elements of `view` from `at`, as the kernels read them.
pub(super) fn row_of(view: KvView<'_>, at: usize, len: usize) -> Row<'_> {
    match view {
        KvView::F32(v) => Row::F32(&v[at..at + len]),
        KvView::Bf16(v) => Row::Bf16(v[at..at + len].reinterpret_cast()),
        KvView::Fp8(v, s) => Row::Fp8(&v[at..at + len], s),
    }
}

/// One layer's pool, as decode attention reads it.
#[derive(Clone, Copy)]
pub(super) struct PoolView<'a> {
    pub k: KvView<'a>,
    pub v: KvView<'a>,
    pub kv_dim: usize,
    pub block_size: usize,
}

/// The buffers of [`decode_attention`], reused across steps.
#[derive(Default)]
pub(super) struct DecodeScratch {
    /// `(token, KV head, chunk)` of every task
    tasks: Vec<(u32, u32, u32)>,
    /// `[tasks, group * (head_dim + 2)]`: each head's `o`, then `m`s and `l`s
    partials: Vec<f32>,
}

thread_local! {
    /// Each thread's scores `[group, KV_SPLIT]`, widening scratch and
    /// a chunk's row offsets in the pool.
    static BUFS: std::cell::RefCell<(Vec<f32>, Vec<f32>, Vec<usize>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new(), Vec::new())) };
}

/// Attention of the step's tokens `t` with `decode(t)` (queries the first
/// `heads * head_dim` columns of each `[T, qkv_w]` row of `qkv`, RoPE
/// applied) over `pool`, into their rows of `out` (`[T, q_dim]`); `parallel`
/// forces the choice of rayon (else by the work).
#[allow(clippy::too_many_arguments)]
pub(super) fn decode_attention(
    isa: Isa,
    pool: PoolView<'_>,
    qkv: &[f32],
    qkv_w: usize,
    batch: &StepBatch,
    seq_of: &[usize],
    decode: impl Fn(usize) -> bool,
    dims: AttnDims,
    rule: ScoreRule,
    out: &mut [f32],
    scratch: &mut DecodeScratch,
    parallel: Option<bool>,
) {
    let (heads, kv_heads, hd) = (dims.heads, dims.kv_heads, dims.head_dim);
    let group = heads / kv_heads;
    let q_dim = heads * hd;
    let span = group * (hd + 2);
    let DecodeScratch { tasks, partials } = scratch;
    tasks.clear();
    let mut work = 0;
    for t in (0..batch.positions.len()).filter(|&t| decode(t)) {
        let pos = batch.positions[t] as usize;
        let seen = pos + 1 - rule.first(pos);
        work += seen * heads * hd;
        for g in 0..kv_heads {
            for c in 0..seen.div_ceil(KV_SPLIT) {
                tasks.push((t as u32, g as u32, c as u32));
            }
        }
    }
    if tasks.is_empty() {
        return;
    }
    if partials.len() < tasks.len() * span {
        partials.resize(tasks.len() * span, 0.0);
    }
    let partials = &mut partials[..tasks.len() * span];
    let bs = pool.block_size;
    let run = |&(t, g, c): &(u32, u32, u32), part: &mut [f32]| {
        let (t, g, c) = (t as usize, g as usize, c as usize);
        let s = seq_of[t];
        let table = &batch.block_tables[s * batch.max_blocks..(s + 1) * batch.max_blocks];
        let pos = batch.positions[t] as usize;
        let first = rule.first(pos);
        let (j0, j1) = (
            first + c * KV_SPLIT,
            (first + (c + 1) * KV_SPLIT).min(pos + 1),
        );
        let n = j1 - j0;
        let qs = &qkv[t * qkv_w + g * group * hd..][..group * hd];
        BUFS.with_borrow_mut(|(scores, wide, offs)| {
            if scores.len() < group * n {
                scores.resize(group * n, 0.0);
            }
            let scores = &mut scores[..group * n];
            // each position's row offset, a block at a time (one table
            // lookup and no division per key)
            offs.clear();
            let b0 = j0 / bs;
            for (b, &blk) in table.iter().enumerate().take(j1.div_ceil(bs)).skip(b0) {
                let base = blk as usize * bs;
                let (a, z) = ((b * bs).max(j0), ((b + 1) * bs).min(j1));
                let first = (base + a - b * bs) * pool.kv_dim + g * hd;
                offs.extend((0..z - a).map(|i| first + i * pool.kv_dim));
            }
            let at = |j: usize| offs[j];
            let key = |j: usize| row_of(pool.k, at(j), hd);
            dot_keys_rows(isa, qs, group, key, n, scores, wide);
            let (o, ml) = part.split_at_mut(group * hd);
            for (h, row) in scores.chunks_exact_mut(n).enumerate() {
                for x in row.iter_mut() {
                    *x = rule.score(*x);
                }
                let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                ml[h] = m;
                ml[group + h] = exp_scaled_sum(isa, row, 1.0, m);
            }
            o.fill(0.0);
            let value = |j: usize| row_of(pool.v, at(j), hd);
            pv_rows(isa, scores, group, value, n, o, wide);
        });
    };
    let parallel = parallel.unwrap_or(work >= PARALLEL_ATTENTION_MIN);
    if parallel {
        tasks
            .par_iter()
            .zip(partials.par_chunks_mut(span))
            .for_each(|(task, part)| run(task, part));
    } else {
        for (task, part) in tasks.iter().zip(partials.chunks_mut(span)) {
            run(task, part);
        }
    }
    merge(tasks, partials, group, hd, q_dim, out);
}

/// Merges each (token, KV head)'s chunks (consecutive in `tasks`) into its
/// query heads' rows of `out`.
fn merge(
    tasks: &[(u32, u32, u32)],
    partials: &[f32],
    group: usize,
    hd: usize,
    q_dim: usize,
    out: &mut [f32],
) {
    let span = group * (hd + 2);
    let mut i = 0;
    while i < tasks.len() {
        let (t, g, _) = tasks[i];
        let n = tasks[i..]
            .iter()
            .take_while(|&&(t2, g2, _)| (t2, g2) == (t, g))
            .count();
        let parts = &partials[i * span..(i + n) * span];
        for h in 0..group {
            let m_of = |c: usize| parts[c * span + group * hd + h];
            let l_of = |c: usize| parts[c * span + group * hd + group + h];
            let big = (0..n).map(m_of).fold(f32::NEG_INFINITY, f32::max);
            let w = |c: usize| (m_of(c) - big).exp();
            let l: f32 = (0..n).map(|c| w(c) * l_of(c)).sum();
            let inv = 1.0 / l;
            let dst = &mut out[t as usize * q_dim + (g as usize * group + h) * hd..][..hd];
            dst.fill(0.0);
            for c in 0..n {
                let (wc, o) = (w(c), &parts[c * span + h * hd..][..hd]);
                for (d, &x) in dst.iter_mut().zip(o) {
                    *d += x * wc;
                }
            }
            for d in dst.iter_mut() {
                *d *= inv;
            }
        }
        i += n;
    }
}
