//! GPU tests of sliding windows, score scales and head_dim 256 on the scalar
//! prefill kernel and the split-KV decode kernel (sequence rows and token
//! rows), against `ops::attention::paged_attention_with` under the same
//! `ScoreRule` (the CPU backend's rule), over bf16 and FP8 e4m3 caches:
//! prompts longer than every window, a chunk whose cached prefix is longer
//! than the window, contexts from 0 to 2,000 keys. Part of the
//! `gpu_attention` test binary; `#[ignore]`d: they need a CUDA device.

use crate::common::*;
use crate::{decode_inputs, decode_want};
use gpu::Gpu;
use half::bf16;
use kernels::decode_attention::{DecodeParams, DecodeRows};
use kernels::prefill_attention::PrefillParams;
use kernels::{DecodePlan, HeadShape, Kernels};
use ops::attention::{ScoreRule, paged_attention_with, positions_of};
use ops::{KvView, PagedSeqs};
use rand::SeedableRng;
use rand::rngs::StdRng;

const BLOCK: usize = 16;

/// Prefill segments `(seqlen, context)`: a prompt past every window, a
/// chunk whose cached prefix is longer than the windows, a one-token row
/// and a prompt shorter than the windows.
const SEGS: [(usize, usize); 4] = [(700, 700), (40, 900), (1, 513), (7, 7)];

/// Decode plans `(target blocks, min chunk)`: one split a row, the H200's
/// batch-1 plan, many small splits (most of them empty under a window).
const PLANS: [(usize, usize); 3] = [(1, 64), (264, 64), (5000, 16)];

/// The reference of a packed batch under `rule`.
fn prefill_want(
    b: &PagedBatch,
    q: &[f32],
    cache: &TestKv,
    shape: HeadShape,
    rule: ScoreRule,
) -> Vec<f32> {
    let positions = positions_of(&b.cu, &b.ctx);
    let seqs = PagedSeqs {
        cu_seqlens: &b.cu,
        positions: &positions,
        block_tables: &b.tables,
        max_blocks: b.max_blocks,
        block_size: BLOCK,
    };
    let (k, v) = (KvView::F32(&cache.k_ref), KvView::F32(&cache.v_ref));
    paged_attention_with(q, k, v, seqs, dims(shape), rule)
}

/// `[rows, heads * D]` query rows of `[rows, qkv_width]`.
fn queries(qkv: &[bf16], shape: HeadShape, rows: usize) -> Vec<f32> {
    let qw = shape.num_heads * shape.head_dim;
    (0..rows)
        .flat_map(|t| f32s(&qkv[t * shape.qkv_width()..][..qw]))
        .collect()
}

/// One decode launch of `rows` query rows with plan `(target, min_chunk)`;
/// returns the output and checks the arrival counters are left at zero.
#[allow(clippy::too_many_arguments)]
fn run_decode(
    gpu: &Gpu,
    k: &Kernels,
    qkv: &[bf16],
    cache: &TestKv,
    rows: DecodeRows<'_>,
    b: &PagedBatch,
    n: usize,
    shape: HeadShape,
    rule: ScoreRule,
    (target, min_chunk): (usize, usize),
) -> Vec<f32> {
    let plan = DecodePlan::new(shape, target)
        .unwrap()
        .with_min_chunk(min_chunk)
        .unwrap();
    let po = gpu.alloc::<f32>(plan.partial_o_len(shape, n)).unwrap();
    let pm = gpu.alloc::<f32>(plan.partial_ml_len(shape, n)).unwrap();
    let pc = gpu.alloc::<u32>(plan.counters_len(shape, n)).unwrap();
    let out = gpu
        .alloc::<bf16>(n * shape.num_heads * shape.head_dim)
        .unwrap();
    gpu.fill_bytes(out.view(), POISON).unwrap();
    gpu.fill_bytes(po.view(), POISON).unwrap();
    let (d_qkv, d_tab) = (gpu.upload(qkv).unwrap(), gpu.upload(&b.tables).unwrap());
    let p = DecodeParams {
        shape,
        plan,
        num_seqs: n,
        max_blocks: b.max_blocks,
        block_size: BLOCK,
        fresh: 1,
        min_ctx: 0,
        rule,
    };
    // SAFETY: paged_batch builds consistent metadata, every block id <
    // num_blocks; token rows' cu_seqlens cover the rows.
    unsafe {
        k.decode_attention(
            d_qkv.view(),
            cache.caches(),
            rows,
            d_tab.view(),
            po.view(),
            pm.view(),
            pc.view(),
            out.view(),
            p,
        )
    }
    .unwrap();
    assert!(
        gpu.to_host(pc.view()).unwrap().iter().all(|&c| c == 0),
        "split arrival counters left non-zero"
    );
    f32s(&gpu.to_host(out.view()).unwrap())
}

/// A packed prefill batch on the scalar kernel and as the decode kernel's
/// token rows.
fn prefill_case(
    gpu: &Gpu,
    k: &Kernels,
    rng: &mut StdRng,
    shape: HeadShape,
    rule: ScoreRule,
    fp8: bool,
) {
    let b = paged_batch(rng, &SEGS, BLOCK);
    let t = *b.cu.last().unwrap() as usize;
    let slots = b.num_blocks * BLOCK;
    let kc = rand_bf16(rng, slots * shape.kv_width(), 1.0);
    let vc = rand_bf16(rng, slots * shape.kv_width(), 1.0);
    let qkv = rand_bf16(rng, t * shape.qkv_width(), 1.0);
    let cache = TestKv::new(gpu, &kc, &vc, fp8);
    let want = prefill_want(&b, &queries(&qkv, shape, t), &cache, shape, rule);
    let d_qkv = gpu.upload(&qkv).unwrap();
    let (d_cu, d_ctx, d_tab) = (
        gpu.upload(&b.cu).unwrap(),
        gpu.upload(&b.ctx).unwrap(),
        gpu.upload(&b.tables).unwrap(),
    );
    let out = gpu
        .alloc::<bf16>(t * shape.num_heads * shape.head_dim)
        .unwrap();
    gpu.fill_bytes(out.view(), POISON).unwrap();
    let p = PrefillParams {
        shape,
        tokens: t,
        num_seqs: SEGS.len(),
        max_seqlen: SEGS.iter().map(|s| s.0).max().unwrap(),
        max_blocks: b.max_blocks,
        block_size: BLOCK,
        rule,
    };
    // SAFETY: paged_batch builds consistent metadata, every block id < num_blocks.
    unsafe {
        k.prefill_attention(
            d_qkv.view(),
            cache.caches(),
            d_cu.view(),
            d_ctx.view(),
            d_tab.view(),
            out.view(),
            p,
        )
    }
    .unwrap();
    let e = rel_err(&f32s(&gpu.to_host(out.view()).unwrap()), &want);
    assert!(
        e < 1e-2,
        "prefill {shape:?} {rule:?} fp8 {fp8}: rel err {e}"
    );
    let positions = positions_of(&b.cu, &b.ctx);
    let d_pos = gpu.upload(&positions).unwrap();
    for plan in PLANS {
        let rows = DecodeRows::Tokens {
            positions: d_pos.view(),
            cu_seqlens: d_cu.view(),
            num_seqs: SEGS.len(),
        };
        let got = run_decode(gpu, k, &qkv, &cache, rows, &b, t, shape, rule, plan);
        let e = rel_err(&got, &want);
        assert!(
            e < 1e-2,
            "decode token rows {shape:?} {rule:?} fp8 {fp8} plan {plan:?}: rel err {e}"
        );
    }
}

/// A decode batch (contexts 0 to 2,000) as sequence rows.
fn decode_case(
    gpu: &Gpu,
    k: &Kernels,
    rng: &mut StdRng,
    shape: HeadShape,
    rule: ScoreRule,
    fp8: bool,
) {
    let (b, kc, vc, qkv) = decode_inputs(rng, shape, BLOCK);
    let n = b.ctx.len();
    let cache = TestKv::new(gpu, &kc, &vc, fp8);
    let q = queries(&qkv, shape, n);
    let want = decode_want(&b, &q, &cache.k_ref, &cache.v_ref, shape, BLOCK, rule);
    let d_ctx = gpu.upload(&b.ctx).unwrap();
    for plan in PLANS {
        let rows = DecodeRows::Seqs {
            context_lens: d_ctx.view(),
        };
        let got = run_decode(gpu, k, &qkv, &cache, rows, &b, n, shape, rule, plan);
        let e = rel_err(&got, &want);
        assert!(
            e < 1e-2,
            "decode {shape:?} {rule:?} fp8 {fp8} plan {plan:?}: rel err {e}"
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn windows_scales_and_d256_match_reference() {
    let (gpu, k) = setup();
    let mut rng = StdRng::seed_from_u64(41);
    for shape in [SHAPES[2], SHAPES[4], D256] {
        for rule in rules(shape.head_dim) {
            for fp8 in [false, true] {
                prefill_case(&gpu, &k, &mut rng, shape, rule, fp8);
                decode_case(&gpu, &k, &mut rng, shape, rule, fp8);
            }
        }
    }
}

/// The launchers refuse what the kernels do not run, naming it: a
/// soft-cap, a window of 0 keys; head_dim 256 is not a flash head size
/// (the plan sends it to the scalar kernel), the scalar kernel serves it.
#[test]
#[ignore = "needs a CUDA GPU"]
fn unsupported_rules_are_refused_by_name() {
    let (gpu, k) = setup();
    let mut rng = StdRng::seed_from_u64(42);
    let shape = D256;
    let b = paged_batch(&mut rng, &[(3, 3)], BLOCK);
    let slots = b.num_blocks * BLOCK;
    let kc = rand_bf16(&mut rng, slots * shape.kv_width(), 1.0);
    let cache = TestKv::new(&gpu, &kc, &kc, false);
    let qkv = gpu
        .upload(&rand_bf16(&mut rng, 3 * shape.qkv_width(), 1.0))
        .unwrap();
    let (cu, ctx, tab) = (
        gpu.upload(&b.cu).unwrap(),
        gpu.upload(&b.ctx).unwrap(),
        gpu.upload(&b.tables).unwrap(),
    );
    let out = gpu
        .alloc::<bf16>(3 * shape.num_heads * shape.head_dim)
        .unwrap();
    let causal = ScoreRule::causal(shape.head_dim);
    let p = PrefillParams {
        shape,
        tokens: 3,
        num_seqs: 1,
        max_seqlen: 3,
        max_blocks: b.max_blocks,
        block_size: BLOCK,
        rule: causal,
    };
    assert!(!k.flash_prefill_supports(&p), "flash at head_dim 256");
    let run = |rule: ScoreRule| {
        let p = PrefillParams { rule, ..p };
        // SAFETY: paged_batch builds consistent metadata, every block id < num_blocks.
        unsafe {
            k.prefill_attention(
                qkv.view(),
                cache.caches(),
                cu.view(),
                ctx.view(),
                tab.view(),
                out.view(),
                p,
            )
        }
        .map_err(|e| e.to_string())
    };
    run(causal).unwrap();
    let capped = ScoreRule {
        softcap: Some(50.0),
        ..causal
    };
    assert!(run(capped).unwrap_err().contains("soft-cap"));
    let empty = ScoreRule {
        window: Some(0),
        ..causal
    };
    assert!(run(empty).unwrap_err().contains("window of 0"));
}
