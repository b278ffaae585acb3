//! The KV cache's stored types on the CPU: each dtype's logits against the
//! exact f64 forward pass (over f32 K/V) within its stated bound, on both
//! paths, for prefill chunks and decode; FP8 at a checkpoint's scales; the
//! fast decode attention serial vs on rayon (bit for bit) and against the
//! `ops` reference over the same cache.

use super::batch::{build_step, contiguous_blocks};
use super::decode::{DecodeScratch, KV_SPLIT, PoolView, decode_attention};
use super::tests::{BS, LONG_PROMPT, backend_on, chunk, config, naive, rel_err, weights};
use super::*;
use checkpoint::projection::Projection;
use contract::Backend;
use contract::step_builder::StepBuilder;
use ops::{AttnDims, KvCache, PagedSeqs, ScoreRule};

/// Relative error of the logits (root of the summed squares) a dtype may
/// add to the f32 pass: BF16 keeps 8 bits of each K/V value (2^-9
/// relative), e4m3 4 bits (up to 2^-4) at scale 1 below 448; the test
/// model's random weights make its logits sensitive to both.
fn bound(dtype: KvCacheDtype) -> f64 {
    match dtype {
        KvCacheDtype::F32 => 1e-5,
        KvCacheDtype::Bf16 => 1e-2,
        KvCacheDtype::Fp8 => 1e-1,
    }
}

const DTYPES: [KvCacheDtype; 3] = [KvCacheDtype::F32, KvCacheDtype::Bf16, KvCacheDtype::Fp8];

#[test]
fn every_kv_dtype_stays_within_its_bound_of_the_exact_pass() {
    for path in [CpuPath::Reference, CpuPath::Fast] {
        for dtype in DTYPES {
            let mut b = backend_on(path, false, 16).with_kv_cache_dtype(dtype);
            assert_eq!(b.kv_cache_dtype(), dtype);
            let want = naive(b.config(), &weights(b.config(), false), &LONG_PROMPT);
            let n = LONG_PROMPT.len();
            let blocks = contiguous_blocks(1, n, BS);
            // a prefill chunk of 16+ tokens (the fast path's GEMM attention)
            let whole = build_step(&[chunk(&LONG_PROMPT, 0, blocks.clone())], BS).unwrap();
            let all = b.logits(&whole, &(0..n).collect::<Vec<_>>()).unwrap();
            let mut worst = 0f64;
            for (r, w) in want.iter().enumerate() {
                worst = worst.max(rel_err(&all[r * 50..(r + 1) * 50], w));
            }
            // then token by token (decode attention) over a fresh pool
            let mut d = backend_on(path, false, 16).with_kv_cache_dtype(dtype);
            for (p, tok) in LONG_PROMPT.iter().enumerate() {
                let step = build_step(&[chunk(&[*tok], p, blocks.clone())], BS).unwrap();
                let row = d.logits(&step, &[0]).unwrap();
                worst = worst.max(rel_err(&row, &want[p]));
            }
            eprintln!("{path:?} {dtype}: rel err {worst:.2e}");
            assert!(
                worst < bound(dtype),
                "{path:?} {dtype}: rel err {worst} past {}",
                bound(dtype)
            );
            if dtype != KvCacheDtype::F32 {
                // the stored type is what changes the result: it must show
                assert!(worst > 1e-6, "{path:?} {dtype}: as exact as f32 ({worst})");
            }
        }
    }
}

#[test]
fn fp8_reads_the_checkpoints_scales() {
    // K/V of this model reach a few units: scale 1/4096 saturates them at
    // 448/4096 = 0.11, far from the exact pass; scale 1/8 keeps them (to 56)
    let c = config(false);
    let logits = |scale: f32| {
        let mut w = weights(&c, false);
        w.kv_scales = Some(KvScales {
            k: vec![scale; c.num_layers],
            v: vec![scale; c.num_layers],
        });
        let kv = KvShape {
            num_blocks: 16,
            block_size: BS,
        };
        let mut b = CpuBackend::with_path(c.clone(), w, kv, CpuPath::Fast)
            .unwrap()
            .with_kv_cache_dtype(KvCacheDtype::Fp8);
        let n = LONG_PROMPT.len();
        let step = build_step(&[chunk(&LONG_PROMPT, 0, contiguous_blocks(0, n, BS))], BS);
        b.logits(&step.unwrap(), &[n - 1]).unwrap()
    };
    let want = naive(&c, &weights(&c, false), &LONG_PROMPT);
    let last = want.last().unwrap();
    let fine = rel_err(&logits(1.0 / 8.0), last);
    let clipped = rel_err(&logits(1.0 / 4096.0), last);
    assert!(fine < bound(KvCacheDtype::Fp8), "{fine}");
    assert!(
        clipped > 2.0 * fine,
        "scale 1/4096 ({clipped}) vs 1/8 ({fine})"
    );
}

/// An FP8 pool at calibrated (not 1) K scales stores its keys Hadamard-
/// rotated, queries rotated alike, on both paths: prefill and token-by-
/// token decode stay within FP8's bound of the exact (unrotated) pass;
/// scale 1 and the other dtypes do not rotate.
#[test]
fn fp8_at_calibrated_scales_rotates_queries_and_keys_on_every_path() {
    let c = config(false);
    let kv = KvShape {
        num_blocks: 16,
        block_size: BS,
    };
    let backend = |path: CpuPath, scale: Option<f32>, dtype: KvCacheDtype| {
        let mut w = weights(&c, false);
        w.kv_scales = scale.map(|s| KvScales {
            k: vec![s; c.num_layers],
            v: vec![s; c.num_layers],
        });
        CpuBackend::with_path(c.clone(), w, kv, path)
            .unwrap()
            .with_kv_cache_dtype(dtype)
    };
    let want = naive(&c, &weights(&c, false), &LONG_PROMPT);
    let n = LONG_PROMPT.len();
    let blocks = contiguous_blocks(1, n, BS);
    for path in [CpuPath::Reference, CpuPath::Fast] {
        assert!(!backend(path, None, KvCacheDtype::Fp8).pool.rotates());
        assert!(
            !backend(path, Some(0.125), KvCacheDtype::Bf16)
                .pool
                .rotates()
        );
        let mut b = backend(path, Some(0.125), KvCacheDtype::Fp8);
        assert!(b.pool.rotates(), "{path:?}");
        let whole = build_step(&[chunk(&LONG_PROMPT, 0, blocks.clone())], BS).unwrap();
        let all = b.logits(&whole, &(0..n).collect::<Vec<_>>()).unwrap();
        let mut d = backend(path, Some(0.125), KvCacheDtype::Fp8);
        for (p, tok) in LONG_PROMPT.iter().enumerate() {
            let step = build_step(&[chunk(&[*tok], p, blocks.clone())], BS).unwrap();
            let row = d.logits(&step, &[0]).unwrap();
            let prefill = rel_err(&all[p * 50..(p + 1) * 50], &want[p]);
            let decode = rel_err(&row, &want[p]);
            assert!(
                prefill < bound(KvCacheDtype::Fp8) && decode < bound(KvCacheDtype::Fp8),
                "{path:?} position {p}: prefill {prefill}, decode {decode}"
            );
        }
    }
}

/// A model whose K and V are 1024 times smaller than the test model's (K
/// and V projections divided, Q and O multiplied by 1024: the same
/// logits, exactly) stores them below e4m3's normal range at scale 1, and
/// its FP8 logits fall far from the exact pass; the scales calibrated by
/// `kv_calib` on other tokens bring them back within FP8's bound.
#[test]
fn calibrated_scales_keep_small_k_and_v_out_of_e4m3s_subnormals() {
    let c = config(false);
    let mut w = weights(&c, false);
    let times = |p: &mut Projection, f: f32| {
        let t = p.as_bf16_mut().expect("BF16 test weights");
        for x in t.data.iter_mut() {
            *x = half::bf16::from_f32(x.to_f32() * f);
        }
    };
    for l in &mut w.layers {
        times(&mut l.k_proj, 1.0 / 1024.0);
        times(&mut l.v_proj, 1.0 / 1024.0);
        times(&mut l.q_proj, 1024.0);
        times(&mut l.o_proj, 1024.0);
    }
    let logits = |scales: Option<KvScales>| {
        let mut w = w.clone();
        w.kv_scales = scales;
        let kv = KvShape {
            num_blocks: 16,
            block_size: BS,
        };
        let mut b = CpuBackend::with_path(c.clone(), w, kv, CpuPath::Fast)
            .unwrap()
            .with_kv_cache_dtype(KvCacheDtype::Fp8);
        let n = LONG_PROMPT.len();
        let step = build_step(&[chunk(&LONG_PROMPT, 0, contiguous_blocks(0, n, BS))], BS);
        b.logits(&step.unwrap(), &[n - 1]).unwrap()
    };
    let want = naive(&c, &w, &LONG_PROMPT);
    let last = want.last().unwrap();
    let other: Vec<u32> = LONG_PROMPT.iter().rev().map(|t| (t * 7 + 3) % 50).collect();
    let scales = crate::kv_calib::kv_amax(&c, &w, &other, 64)
        .unwrap()
        .scales();
    assert!(
        scales.k.iter().chain(&scales.v).all(|s| *s < 1.0 / 64.0),
        "{scales:?}"
    );
    let ones = rel_err(&logits(None), last);
    let calibrated = rel_err(&logits(Some(scales)), last);
    eprintln!("FP8 K/V rel err: scale 1 {ones:.3e}, calibrated {calibrated:.3e}");
    assert!(calibrated < bound(KvCacheDtype::Fp8), "{calibrated}");
    assert!(
        ones > 3.0 * calibrated,
        "scale 1 ({ones}) vs calibrated ({calibrated})"
    );
}

/// A one-sequence pool of `ctx` positions on scattered blocks in `dtype`,
/// with queries for its last `t` positions: (pool K, pool V, queries, batch).
fn long_context(
    dtype: KvCacheDtype,
    ctx: usize,
    t: usize,
    dims: AttnDims,
) -> (KvCache, KvCache, Vec<f32>, contract::backend::StepBatch) {
    let bs = 16;
    let blocks = ctx.div_ceil(bs);
    // block i of the sequence is physical block (7 i + 3) mod (blocks + 5)
    let table: Vec<u32> = (0..blocks)
        .map(|i| ((7 * i + 3) % (blocks + 5)) as u32)
        .collect();
    assert_eq!(
        table
            .iter()
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
        blocks
    );
    let kv_dim = dims.kv_heads * dims.head_dim;
    let slots = (blocks + 5) * bs;
    let mut k = KvCache::zeroed(dtype, slots * kv_dim, 0.5);
    let mut v = KvCache::zeroed(dtype, slots * kv_dim, 0.25);
    let val = |i: usize, seed: f32| (i as f32 * 0.618 + seed).sin() * 2.0;
    for j in 0..ctx {
        let slot = table[j / bs] as usize * bs + j % bs;
        let row: Vec<f32> = (0..kv_dim).map(|d| val(j * kv_dim + d, 0.3)).collect();
        k.put(slot * kv_dim, &row);
        let row: Vec<f32> = (0..kv_dim).map(|d| val(j * kv_dim + d, 1.7)).collect();
        v.put(slot * kv_dim, &row);
    }
    let q_dim = dims.heads * dims.head_dim;
    let q: Vec<f32> = (0..t * q_dim).map(|i| val(i, 4.1) * 0.5).collect();
    let mut b = StepBuilder::new(bs);
    b.begin();
    b.push(&vec![0; t], ctx - t, &table, None).unwrap();
    b.finish();
    (k, v, q, b.take())
}

/// How far f32 rounding alone lets two attention sums over `ctx` keys
/// differ, with values at most `vmax`: the reference adds the weighted
/// values one after another (each of its `ctx` additions rounds by at most
/// ε of a running sum no larger than `vmax`), the kernel in lanes and
/// chunks (fewer roundings on every path); the scores', exponentials' and
/// normalisation's roundings add a few ε of each weight.
fn attention_rounding_bound(ctx: usize, vmax: f32) -> f32 {
    (ctx as f32 + 16.0) * f32::EPSILON * vmax
}

#[test]
fn decode_attention_is_the_same_serial_or_parallel_and_near_the_reference() {
    let dims = AttnDims {
        heads: 6,
        kv_heads: 2,
        head_dim: 32,
    };
    let isa = cpu_kernels::Isa::best();
    let windowed = ScoreRule {
        scale: 0.1,
        softcap: None,
        window: Some(KV_SPLIT + 3),
    };
    let capped = ScoreRule {
        softcap: Some(2.0),
        window: Some(20),
        ..windowed
    };
    // contexts of one chunk, a chunk and a bit, and several; plain causal,
    // a window over a chunk and a bit, and a short window with a soft-cap
    let rules = [ScoreRule::causal(dims.head_dim), windowed, capped];
    for ctx in [37, KV_SPLIT + 9, 3 * KV_SPLIT + 100] {
        for (dtype, rule) in DTYPES.into_iter().flat_map(|d| rules.map(|r| (d, r))) {
            let t = 3;
            let (k, v, q, batch) = long_context(dtype, ctx, t, dims);
            let q_dim = dims.heads * dims.head_dim;
            let pool = PoolView {
                k: k.view(),
                v: v.view(),
                kv_dim: dims.kv_heads * dims.head_dim,
                block_size: 16,
            };
            let seq_of = vec![0; t];
            let run = |parallel: bool| {
                let mut out = vec![0f32; t * q_dim];
                let mut scratch = DecodeScratch::default();
                decode_attention(
                    isa,
                    pool,
                    &q,
                    q_dim,
                    &batch,
                    &seq_of,
                    |_| true,
                    dims,
                    rule,
                    &mut out,
                    &mut scratch,
                    Some(parallel),
                );
                out
            };
            let (serial, parallel) = (run(false), run(true));
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&serial), bits(&parallel), "ctx {ctx} {dtype} {rule:?}");
            let seqs = PagedSeqs {
                cu_seqlens: &batch.cu_seqlens,
                positions: &batch.positions,
                block_tables: &batch.block_tables,
                max_blocks: batch.max_blocks,
                block_size: 16,
            };
            let want = ops::paged_attention_with(&q, k.view(), v.view(), seqs, dims, rule);
            let err = serial
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            let bound = attention_rounding_bound(ctx, 2.0);
            assert!(
                err < bound,
                "ctx {ctx} {dtype} {rule:?}: {err} (bound {bound:.3e})"
            );
        }
    }
}
