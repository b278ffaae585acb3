//! Kernel timings on a CUDA GPU: figures for tuning, not checks (the kernel
//! tests in `tests/` hold each kernel to its CPU reference).
//!
//! `cargo run --release -p kernels --example kernel_timings -- [WHICH...]`
//! where WHICH is `sampling`, `gemv`, `invariant`, `qgemm`, `decode` or
//! `flash` (default: all).
//! Each figure is one `RESULT` line. Decode-step kernels are timed as a
//! captured graph of 20 calls replayed 10 times, as a decode step replays
//! them; the flash prefill kernels as back-to-back launches.

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "kernel_timings/qgemm.rs"]
mod qgemm;

use std::sync::Arc;

use common::*;
use gpu::{DeviceBuffer, Gpu, Graph};
use half::bf16;
use kernels::decode_attention::{DecodeParams, DecodeRows};
use kernels::flash_prefill::FlashTiles;
use kernels::gemv::{GemvOp, GemvWeights};
use kernels::invariant_gemm::InvOut;
use kernels::prefill_attention::PrefillParams;
use kernels::sampling::{SampleOutputs, SampleScratch};
use kernels::{DecodePlan, HeadShape, Kernels, KvCaches, SampleParams};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Calls per captured graph and graph replays per figure.
const PER: usize = 20;
const REPS: usize = 10;

fn main() {
    let which: Vec<String> = std::env::args().skip(1).collect();
    let all = ["sampling", "gemv", "invariant", "qgemm", "decode", "flash"];
    if let Some(bad) = which.iter().find(|w| !all.contains(&w.as_str())) {
        eprintln!("unknown timing `{bad}`; expected some of {all:?}");
        std::process::exit(2);
    }
    let (gpu, k) = setup();
    let want = |name: &str| which.is_empty() || which.iter().any(|w| w == name);
    if want("sampling") {
        sampling(&gpu, &k);
    }
    if want("gemv") {
        gemv(&gpu, &k);
    }
    if want("invariant") {
        invariant(&gpu, &k);
    }
    if want("qgemm") {
        qgemm::qgemm(&gpu, &k);
    }
    if want("decode") {
        decode(&gpu, &k);
    }
    if want("flash") {
        flash(&gpu, &k);
    }
}

/// Microseconds per call of `run`, captured `PER` times into a graph that
/// is replayed `REPS` times after one warm-up replay.
fn graph_us(gpu: &Arc<Gpu>, run: impl Fn()) -> f64 {
    let graph = Graph::capture(gpu, || {
        for _ in 0..PER {
            run();
        }
        Ok(())
    })
    .expect("capture");
    graph.launch(gpu).expect("warm-up replay");
    let t = gpu.timer().expect("timer");
    t.start().expect("timer start");
    for _ in 0..REPS {
        graph.launch(gpu).expect("replay");
    }
    t.stop_ms().expect("timer stop") as f64 * 1000.0 / (REPS * PER) as f64
}

/// Sampling at a 128,256-token vocabulary: one greedy row, one greedy row
/// with 20 log-probabilities, 64 greedy rows.
fn sampling(gpu: &Arc<Gpu>, k: &Kernels) {
    let mut rng = StdRng::seed_from_u64(17);
    let (vocab, max_lp) = (128_256usize, 20usize);
    for (rows, n_lp) in [(1usize, 0u32), (1, 20), (64, 0)] {
        let logits: Vec<f32> = (0..rows * vocab)
            .map(|_| rng.random_range(-8.0f32..8.0))
            .collect();
        let mut p = SampleParams::greedy();
        p.n_logprobs = n_lp;
        let d_logits = gpu.upload(&logits).unwrap();
        let d_params = gpu.upload(&vec![p; rows]).unwrap();
        let d_hist = gpu.alloc::<u32>(1).unwrap();
        let work = gpu.alloc::<f32>(rows * vocab).unwrap();
        let stats = gpu.alloc::<f32>(SampleScratch::stats_len(rows, vocab));
        let keys = gpu.alloc::<u64>(SampleScratch::keys_len(rows, vocab, max_lp));
        let (stats, keys) = (stats.unwrap(), keys.unwrap());
        let (tok, lp) = (gpu.alloc::<u32>(rows), gpu.alloc::<f32>(rows));
        let (tok, lp) = (tok.unwrap(), lp.unwrap());
        let (tid, tlp) = (
            gpu.alloc::<u32>(rows * max_lp).unwrap(),
            gpu.alloc::<f32>(rows * max_lp).unwrap(),
        );
        let run = || {
            let scratch = SampleScratch {
                work: work.view(),
                stats: stats.view(),
                keys: keys.view(),
            };
            let out = SampleOutputs {
                tokens: tok.view(),
                logprobs: lp.view(),
                top_ids: tid.view(),
                top_lps: tlp.view(),
            };
            let (logits, params, hist) = (d_logits.view(), d_params.view(), d_hist.view());
            // SAFETY: empty histories.
            unsafe { k.sample_rows(logits, scratch, params, hist, out, rows, vocab, max_lp) }
                .unwrap()
        };
        let us = graph_us(gpu, run);
        println!("RESULT sampling rows={rows} logprobs={n_lp}: {us:.1} us/call");
    }
}

/// The GEMVs of Llama-3.2-1B's decode projections at 1 to 16 rows.
fn gemv(gpu: &Arc<Gpu>, k: &Kernels) {
    let mut rng = StdRng::seed_from_u64(19);
    let (h, inter, qkv, vocab) = (2048usize, 8192usize, 3072usize, 128_256usize);
    let x = gpu.upload(&rand_bf16(&mut rng, 16 * inter, 1.0)).unwrap();
    let xf = gpu.upload(&vec![0.5f32; 16 * h]).unwrap();
    let g = gpu.upload(&rand_bf16(&mut rng, h, 1.0)).unwrap();
    let yb = gpu.alloc::<bf16>(16 * 2 * inter).unwrap();
    let yf = gpu.alloc::<f32>(16 * vocab).unwrap();
    let resid = gpu.alloc::<f32>(16 * h).unwrap();
    for (name, n, kk, wrows) in [
        ("qkv (norm)", qkv, h, qkv),
        ("o (resid)", h, h, h),
        ("gate/up (norm+silu)", inter, h, 2 * inter),
        ("down (resid)", h, inter, h),
        ("lm head (f32)", vocab, h, vocab),
    ] {
        let w = gpu.alloc::<bf16>(wrows * kk).unwrap();
        let q = gpu.alloc::<u8>(wrows * kk).unwrap();
        let scale = gpu.alloc::<f32>(wrows).unwrap();
        let fp8_w = GemvWeights::Fp8 {
            q: q.view(),
            scale: scale.view(),
        };
        for (m, fp8) in [1usize, 2, 4, 8, 16]
            .into_iter()
            .flat_map(|m| [(m, false), (m, true)])
        {
            let norm = kernels::gemv::RowNorm {
                w: g.view(),
                eps: 1e-5,
                offset: 0.0,
            };
            let op = match name {
                "qkv (norm)" => GemvOp::Norm {
                    residual: xf.view(),
                    norm,
                    y: yb.view(),
                },
                "gate/up (norm+silu)" => GemvOp::NormGated {
                    residual: xf.view(),
                    norm,
                    act: contract::Activation::Silu,
                    y: yb.view(),
                },
                "lm head (f32)" => GemvOp::F32 {
                    x: x.view(),
                    y: yf.view(),
                },
                _ => GemvOp::Resid {
                    x: x.view(),
                    residual: resid.view(),
                },
            };
            let (weights, bytes, kind) = match fp8 {
                true => (fp8_w, wrows * kk, "fp8"),
                false => (GemvWeights::Bf16(w.view()), wrows * kk * 2, "bf16"),
            };
            let run = || k.gemv(op, weights, m, n, kk).unwrap();
            run();
            let us = graph_us(gpu, run);
            let gbs = bytes as f64 / us / 1e3;
            println!("RESULT gemv {kind} {name} m={m}: {us:.1} us, {gbs:.0} GB/s of weights");
        }
    }
}

/// The batch-invariant GEMM against cuBLAS (its own heuristic per shape)
/// on Llama-3.2-1B's projections and LM head, 1 to 2,048 rows (the direct
/// form below `TILED_MIN_ROWS`, the tiled one from there).
fn invariant(gpu: &Arc<Gpu>, k: &Kernels) {
    const MAX_M: usize = 2048;
    let mut rng = StdRng::seed_from_u64(23);
    let (h, inter, qkv, vocab) = (2048usize, 8192usize, 3072usize, 128_256usize);
    let blas = gpu::Blas::new(gpu).expect("cuBLAS");
    let x = gpu
        .upload(&rand_bf16(&mut rng, MAX_M * inter, 1.0))
        .unwrap();
    let yb = gpu.alloc::<bf16>(MAX_M * 2 * inter).unwrap();
    let yf = gpu.alloc::<f32>(MAX_M * vocab).unwrap();
    let tiled = kernels::invariant_gemm::TILED_MIN_ROWS;
    for (name, n, kk) in [
        ("qkv", qkv, h),
        ("o", h, h),
        ("gate/up", 2 * inter, h),
        ("down", h, inter),
        ("lm head (f32)", vocab, h),
    ] {
        let w = gpu.alloc::<bf16>(n * kk).unwrap();
        for m in [1usize, 4, 16, 64, tiled - 1, tiled, 256, 512, MAX_M] {
            let d = gpu::GemmDims { m, n, k: kk };
            let (ours, theirs) = match name {
                "lm head (f32)" => (
                    graph_us(gpu, || {
                        let y = InvOut::F32(yf.view());
                        k.invariant_gemm(x.view(), w.view(), y, m, n, kk).unwrap()
                    }),
                    graph_us(gpu, || {
                        blas.matmul_nt(x.view(), w.view(), yf.view(), d).unwrap()
                    }),
                ),
                _ => (
                    graph_us(gpu, || {
                        let y = InvOut::Bf16(yb.view());
                        k.invariant_gemm(x.view(), w.view(), y, m, n, kk).unwrap()
                    }),
                    graph_us(gpu, || {
                        blas.matmul_nt(x.view(), w.view(), yb.view(), d).unwrap()
                    }),
                ),
            };
            let gbs = (n * kk * 2) as f64 / ours / 1e3;
            let tf = (2 * m * n * kk) as f64 / ours / 1e6;
            println!(
                "RESULT invariant {name} m={m}: {ours:.1} us ({gbs:.0} GB/s of weights, \
                 {tf:.0} TFLOP/s), cuBLAS {theirs:.1} us"
            );
        }
    }
}

/// Decode attention (Llama-3.2-1B heads, block size 16) for batch 1 at 200,
/// 600 and 2000 tokens of context, batches 8 to 64 at 500 and larger
/// batches (also through the narrow flash kernel), with this GPU's plan.
fn decode(gpu: &Arc<Gpu>, k: &Kernels) {
    let mut rng = StdRng::seed_from_u64(26);
    let shape = SHAPES[2];
    let block_size = 16;
    let target = 2 * gpu.sm_count().unwrap();
    let cases = [
        (1usize, 200usize),
        (1, 600),
        (1, 2000),
        (8, 500),
        (32, 500),
        (64, 500),
        (256, 640),
        (128, 1000),
        (1, 16384),
        (1, 65536),
    ];
    for (n, ctx) in cases {
        let seqs: Vec<(usize, usize)> = (0..n).map(|_| (1, ctx)).collect();
        let b = paged_batch(&mut rng, &seqs, block_size);
        let slots = b.num_blocks * block_size;
        let d = DecodeInputs {
            kc: gpu
                .upload(&rand_bf16(&mut rng, slots * shape.kv_width(), 1.0))
                .unwrap(),
            vc: gpu
                .upload(&rand_bf16(&mut rng, slots * shape.kv_width(), 1.0))
                .unwrap(),
            qkv: gpu
                .upload(&rand_bf16(&mut rng, n * shape.qkv_width(), 1.0))
                .unwrap(),
            ctx: gpu.upload(&b.ctx).unwrap(),
            tab: gpu.upload(&b.tables).unwrap(),
            out: gpu
                .alloc::<bf16>(n * shape.num_heads * shape.head_dim)
                .unwrap(),
        };
        let kv_mb = (n * ctx * shape.kv_width() * 4) as f64 / 1e6;
        // long contexts: also two and four waves of blocks
        let waves: &[usize] = if ctx >= 8192 { &[1, 2, 4] } else { &[1] };
        for (&w, min_chunk) in waves.iter().flat_map(|w| [64, 128, 256].map(|m| (w, m))) {
            let plan = DecodePlan::new(shape, target * w)
                .unwrap()
                .with_min_chunk(min_chunk);
            let plan = plan.unwrap();
            let p = DecodeParams {
                shape,
                plan,
                num_seqs: n,
                max_blocks: b.max_blocks,
                block_size,
                fresh: 1,
                min_ctx: 0,
                rule: ops::attention::ScoreRule::causal(shape.head_dim),
            };
            let us = d.split_kv_us(gpu, k, p);
            println!(
                "RESULT decode attention S={n} ctx={ctx} splits={} min chunk {min_chunk}: {us:.1} us/call (incl. merge), {:.0} GB/s of K+V",
                plan.splits(shape, n),
                kv_mb * 1e3 / us
            );
        }
        if n >= 32 {
            let us = d.narrow_flash_us(gpu, k, shape, n, b.max_blocks, block_size);
            println!(
                "RESULT flash_narrow S={n} ctx={ctx}: {us:.1} us/call, {:.0} GB/s of K+V",
                kv_mb * 1e3 / us
            );
        }
    }
}

/// Device inputs of one decode batch (one query token per sequence).
struct DecodeInputs {
    kc: DeviceBuffer<bf16>,
    vc: DeviceBuffer<bf16>,
    qkv: DeviceBuffer<bf16>,
    ctx: DeviceBuffer<u32>,
    tab: DeviceBuffer<u32>,
    out: DeviceBuffer<bf16>,
}

impl DecodeInputs {
    /// The split-KV decode kernel with plan `p`.
    fn split_kv_us(&self, gpu: &Arc<Gpu>, k: &Kernels, p: DecodeParams) -> f64 {
        let (shape, n) = (p.shape, p.num_seqs);
        let po = gpu.alloc::<f32>(p.plan.partial_o_len(shape, n)).unwrap();
        let pm = gpu.alloc::<f32>(p.plan.partial_ml_len(shape, n)).unwrap();
        let pc = gpu.alloc::<u32>(p.plan.counters_len(shape, n)).unwrap();
        let (q, kv) = (
            self.qkv.view(),
            KvCaches::bf16(self.kc.view(), self.vc.view()),
        );
        let (tab, out) = (self.tab.view(), self.out.view());
        let ctx = DecodeRows::Seqs {
            context_lens: self.ctx.view(),
        };
        let (po, pm, pc) = (po.view(), pm.view(), pc.view());
        // SAFETY: paged_batch's block ids are < num_blocks, every table entry in range.
        let run = || unsafe { k.decode_attention(q, kv, ctx, tab, po, pm, pc, out, p) }.unwrap();
        graph_us(gpu, run)
    }

    /// The same step through the narrow tensor-core flash kernel.
    fn narrow_flash_us(
        &self,
        gpu: &Arc<Gpu>,
        k: &Kernels,
        shape: HeadShape,
        n: usize,
        max_blocks: usize,
        block_size: usize,
    ) -> f64 {
        let cu: Vec<u32> = (0..=n as u32).collect();
        let d_cu = gpu.upload(&cu).unwrap();
        let p = PrefillParams {
            shape,
            tokens: n,
            num_seqs: n,
            max_seqlen: 1,
            max_blocks,
            block_size,
            rule: ops::attention::ScoreRule::causal(shape.head_dim),
        };
        let (q, kv) = (
            self.qkv.view(),
            KvCaches::bf16(self.kc.view(), self.vc.view()),
        );
        let (cu, ctx, tab, out) = (
            d_cu.view(),
            self.ctx.view(),
            self.tab.view(),
            self.out.view(),
        );
        let tiles = FlashTiles::Narrow;
        // SAFETY: as `split_kv_us`; cu_seqlens 0..=n, one token per sequence.
        let run = || unsafe { k.flash(tiles, 1..=u32::MAX, q, kv, cu, ctx, tab, out, p) }.unwrap();
        graph_us(gpu, run)
    }
}

/// The flash prefill tilings this GPU runs (and the plain prefill kernel)
/// on one causal prompt of 4,096 or 2,048 tokens; FLOPs counted as
/// 4 T² D heads / 2.
fn flash(gpu: &Arc<Gpu>, k: &Kernels) {
    let mut rng = StdRng::seed_from_u64(13);
    let wide_64 = SHAPES[2];
    let wide_128 = HeadShape {
        num_heads: 32,
        num_kv_heads: 8,
        head_dim: 128,
    };
    let block_size = 16;
    for (shape, t) in [(wide_64, 4096), (wide_128, 4096), (wide_64, 2048)] {
        let b = paged_batch(&mut rng, &[(t, t)], block_size);
        let slots = b.num_blocks * block_size;
        let kc = gpu
            .upload(&rand_bf16(&mut rng, slots * shape.kv_width(), 1.0))
            .unwrap();
        let vc = gpu
            .upload(&rand_bf16(&mut rng, slots * shape.kv_width(), 1.0))
            .unwrap();
        let qkv = gpu
            .upload(&rand_bf16(&mut rng, t * shape.qkv_width(), 1.0))
            .unwrap();
        let (cu, ctx) = (gpu.upload(&b.cu).unwrap(), gpu.upload(&b.ctx).unwrap());
        let tab = gpu.upload(&b.tables).unwrap();
        let out = gpu
            .alloc::<bf16>(t * shape.num_heads * shape.head_dim)
            .unwrap();
        let p = PrefillParams {
            shape,
            tokens: t,
            num_seqs: 1,
            max_seqlen: t,
            max_blocks: b.max_blocks,
            block_size,
            rule: ops::attention::ScoreRule::causal(shape.head_dim),
        };
        let flops = 4.0 * (t as f64).powi(2) * (shape.head_dim * shape.num_heads) as f64 / 2.0;
        let mut kinds: Vec<Option<FlashTiles>> = vec![Some(FlashTiles::Wide)];
        if k.has_flash_hopper() {
            kinds.push(Some(FlashTiles::Hopper));
        }
        if t == 4096 {
            kinds.push(None);
        }
        for tiles in kinds {
            let (q, kv) = (qkv.view(), KvCaches::bf16(kc.view(), vc.view()));
            let (cuv, ctxv, tabv, o) = (cu.view(), ctx.view(), tab.view(), out.view());
            let launch = || {
                // SAFETY: paged_batch builds consistent metadata, every block id < num_blocks.
                unsafe {
                    match tiles {
                        None => k.prefill_attention(q, kv, cuv, ctxv, tabv, o, p),
                        Some(ti) => k.flash(ti, 1..=u32::MAX, q, kv, cuv, ctxv, tabv, o, p),
                    }
                }
                .unwrap()
            };
            let iters = if tiles.is_none() { 3 } else { 20 };
            launch();
            let timer = gpu.timer().unwrap();
            timer.start().unwrap();
            for _ in 0..iters {
                launch();
            }
            let us = timer.stop_ms().unwrap() as f64 * 1e3 / iters as f64;
            let name = tiles.map_or("prefill_attention".to_string(), |t| format!("flash {t:?}"));
            println!(
                "RESULT {name} {shape:?} T={t}: {us:.1} us, {:.1} TFLOP/s",
                flops / us * 1e-6
            );
        }
    }
}
