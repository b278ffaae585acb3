//! GPU tests of RoPE + KV write, prefill and decode attention against the
//! `ops` crate's RoPE, KV write and paged attention (the CPU backend's own
//! code) (poisoned outputs, random paged batches with scrambled
//! block tables, head sizes 16 to 256, lengths above 1024, sliding windows
//! and score scales against `ops::attention::paged_attention_with`), over bf16 and
//! FP8 e4m3 caches (`ops::kv`'s codec: the writers' bytes against it, the
//! readers against attention over the values the bytes read back as; the
//! writer also with Hadamard-rotated keys, against `ops::hadamard`).
//! `#[ignore]`d: they need a CUDA device (`scripts/gpu/kernels.sh`).

mod common;
mod flash_prefill;
mod windows;

use common::*;
use half::bf16;
use kernels::decode_attention::{DecodeParams, DecodeRows};
use kernels::prefill_attention::PrefillParams;
use kernels::{DecodePlan, HeadShape};
use ops::attention::{ScoreRule, paged_attention_with, positions_of};
use ops::{KvView, PagedSeqs};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

#[test]
#[ignore = "needs a CUDA GPU"]
fn rope_kv_write_matches_reference() {
    let (gpu, k) = setup();
    let mut rng = StdRng::seed_from_u64(4);
    let max_pos = 4096;
    // head dim 6: odd D / 2, the kernel's one-pair-per-thread path
    let odd = HeadShape {
        num_heads: 3,
        num_kv_heads: 1,
        head_dim: 6,
    };
    let shapes = SHAPES.iter().chain(std::iter::once(&odd));
    let cases = shapes.zip([5usize, 1030, 1300, 7, 300, 9]);
    let caches = [(false, false), (true, false), (true, true)];
    for ((shape, tokens), (fp8, rotate)) in cases.flat_map(|c| caches.map(|f| (c, f))) {
        let d = shape.head_dim;
        let rope = rope(max_pos, d);
        let (cos, sin) = (rope.cos(), rope.sin());
        let num_slots = tokens + 50;
        let qkv = rand_bf16(&mut rng, tokens * shape.qkv_width(), 2.0);
        let positions: Vec<u32> = (0..tokens)
            .map(|_| rng.random_range(0..max_pos as u32))
            .collect();
        let mut slots: Vec<u32> = (0..num_slots as u32).collect();
        slots.shuffle(&mut rng);
        slots.truncate(tokens);
        let d_qkv = gpu.upload(&qkv).unwrap();
        let (d_pos, d_slots) = (gpu.upload(&positions).unwrap(), gpu.upload(&slots).unwrap());
        let (d_cos, d_sin) = (gpu.upload(cos).unwrap(), gpu.upload(sin).unwrap());
        let cache = TestKv::poisoned(&gpu, num_slots * shape.kv_width(), fp8).rotating(rotate);
        // SAFETY: slots below num_slots, positions below max_pos.
        let r = unsafe {
            k.rope_kv_write(
                d_qkv.view(),
                d_pos.view(),
                d_slots.view(),
                d_cos.view(),
                d_sin.view(),
                cache.caches(),
                *shape,
                tokens,
                max_pos,
            )
        };
        if rotate && !ops::hadamard::rotatable(d) {
            assert!(r.is_err(), "head_dim {d} cannot be Hadamard-rotated");
            continue;
        }
        r.unwrap();
        // reference: rotate the q and k parts (Hadamard-rotated after RoPE
        // when the cache rotates), write k and v at the slots
        let (w, qw, kvw) = (shape.qkv_width(), shape.num_heads * d, shape.kv_width());
        let x = f32s(&qkv);
        let mut q_want = columns(&x, w, 0, qw);
        rope.apply_rows(&mut q_want, qw, &positions);
        let mut k_new = columns(&x, w, qw, kvw);
        rope.apply_rows(&mut k_new, kvw, &positions);
        if rotate {
            ops::hadamard::rotate_heads(&mut q_want, d);
            ops::hadamard::rotate_heads(&mut k_new, d);
        }
        let v_new = columns(&x, w, qw + kvw, kvw);
        let mut kr = vec![0f32; num_slots * kvw];
        let mut vr = kr.clone();
        ops::kv_write(&mut kr, &mut vr, &k_new, &v_new, &slots, kvw);
        let got = f32s(&gpu.to_host(d_qkv.view()).unwrap());
        let q_got: Vec<f32> = (0..tokens)
            .flat_map(|t| got[t * shape.qkv_width()..][..qw].to_vec())
            .collect();
        let e = rel_err(&q_got, &q_want);
        assert!(e < 5e-3, "rope q (rotated {rotate}): rel err {e}");
        let (kg, vg) = cache.read(&gpu);
        let w = shape.kv_width();
        let pick = |c: &[f32]| -> Vec<f32> {
            slots
                .iter()
                .flat_map(|&s| c[s as usize * w..][..w].to_vec())
                .collect()
        };
        let (k_got, k_want) = (pick(&kg), kv_rounded(&pick(&kr), fp8, FP8_K_SCALE));
        let e = rel_err(&k_got, &k_want);
        assert!(
            e < 5e-3,
            "rope k (fp8 {fp8}, rotated {rotate}): rel err {e}"
        );
        if fp8 {
            // the rotation's f32 rounding may tip a value across a rounding
            // boundary of e4m3, one step; nearly all bytes agree
            let same = k_got.iter().zip(&k_want).filter(|(a, b)| a == b).count();
            assert!(
                same * 100 >= k_got.len() * 99,
                "rope k fp8 (rotated {rotate}): {same} of {} equal",
                k_got.len()
            );
        }
        // v is stored from bf16 values: exactly the codec's bytes (saturated
        // at ±448 * scale in FP8: the inputs reach 500 * scale)
        let v_want = kv_rounded(&pick(&vr), fp8, FP8_V_SCALE);
        assert_eq!(pick(&vg), v_want, "v stored exactly (fp8 {fp8})");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn prefill_attention_matches_reference() {
    let (gpu, k) = setup();
    let mut rng = StdRng::seed_from_u64(5);
    let block_size = 16;
    let cases: [&[(usize, usize)]; 3] = [
        &[(1, 1), (7, 7), (300, 300), (1100, 1100)],
        &[(5, 40), (33, 1200), (1, 17)],
        &[(1500, 1500)],
    ];
    let shapes = SHAPES.into_iter().chain([D256]);
    for (shape, fp8) in shapes.flat_map(|s| [(s, false), (s, true)]) {
        for seqs in cases {
            let b = paged_batch(&mut rng, seqs, block_size);
            let tokens = *b.cu.last().unwrap() as usize;
            let slots = b.num_blocks * block_size;
            let kc = rand_bf16(&mut rng, slots * shape.kv_width(), 1.0);
            let vc = rand_bf16(&mut rng, slots * shape.kv_width(), 1.0);
            let qkv = rand_bf16(&mut rng, tokens * shape.qkv_width(), 1.0);
            let cache = TestKv::new(&gpu, &kc, &vc, fp8);
            let d_qkv = gpu.upload(&qkv).unwrap();
            let (d_cu, d_ctx, d_tab) = (
                gpu.upload(&b.cu).unwrap(),
                gpu.upload(&b.ctx).unwrap(),
                gpu.upload(&b.tables).unwrap(),
            );
            let qw = shape.num_heads * shape.head_dim;
            let out = gpu.alloc::<bf16>(tokens * qw).unwrap();
            gpu.fill_bytes(out.view(), POISON).unwrap();
            let p = PrefillParams {
                shape,
                tokens,
                num_seqs: seqs.len(),
                max_seqlen: seqs.iter().map(|s| s.0).max().unwrap(),
                max_blocks: b.max_blocks,
                block_size,
                rule: ScoreRule::causal(shape.head_dim),
            };
            // SAFETY: the batch was built consistent, every block id < num_blocks.
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
            let q: Vec<f32> = (0..tokens)
                .flat_map(|t| f32s(&qkv[t * shape.qkv_width()..][..qw]))
                .collect();
            let positions = positions_of(&b.cu, &b.ctx);
            let seqs = PagedSeqs {
                cu_seqlens: &b.cu,
                positions: &positions,
                block_tables: &b.tables,
                max_blocks: b.max_blocks,
                block_size,
            };
            let want = ops::paged_attention(&q, &cache.k_ref, &cache.v_ref, seqs, dims(shape));
            let e = rel_err(&f32s(&gpu.to_host(out.view()).unwrap()), &want);
            assert!(
                e < 1e-2,
                "prefill {shape:?} {seqs:?} fp8 {fp8}: rel err {e}"
            );
        }
    }
}

/// Contexts of a decode test batch: odd lengths, one empty, one long.
const DECODE_CTXS: [usize; 8] = [1, 5, 513, 2000, 1030, 64, 17, 0];

/// Random decode inputs for `shape`: (batch, K cache, V cache, qkv).
pub(crate) fn decode_inputs(
    rng: &mut StdRng,
    shape: kernels::HeadShape,
    block_size: usize,
) -> (PagedBatch, Vec<bf16>, Vec<bf16>, Vec<bf16>) {
    let seqs: Vec<(usize, usize)> = DECODE_CTXS.iter().map(|&c| (1, c)).collect();
    let b = paged_batch(rng, &seqs, block_size);
    let slots = b.num_blocks * block_size;
    let kc = rand_bf16(rng, slots * shape.kv_width(), 1.0);
    let vc = rand_bf16(rng, slots * shape.kv_width(), 1.0);
    let qkv = rand_bf16(rng, seqs.len() * shape.qkv_width(), 1.0);
    (b, kc, vc, qkv)
}

/// The reference of a decode batch: attention of the last position under
/// `rule` (zeros for an empty context, like the kernel).
#[allow(clippy::too_many_arguments)]
pub(crate) fn decode_want(
    b: &PagedBatch,
    q: &[f32],
    kc: &[f32],
    vc: &[f32],
    shape: kernels::HeadShape,
    bs: usize,
    rule: ScoreRule,
) -> Vec<f32> {
    let qw = shape.num_heads * shape.head_dim;
    let mut want = vec![0f32; q.len()];
    for (s, &ctx) in b.ctx.iter().enumerate() {
        if ctx == 0 {
            continue;
        }
        let positions = [ctx - 1];
        let seq = PagedSeqs {
            cu_seqlens: &[0, 1],
            positions: &positions,
            block_tables: &b.tables[s * b.max_blocks..(s + 1) * b.max_blocks],
            max_blocks: b.max_blocks,
            block_size: bs,
        };
        let (k, v) = (KvView::F32(kc), KvView::F32(vc));
        let o = paged_attention_with(&q[s * qw..(s + 1) * qw], k, v, seq, dims(shape), rule);
        want[s * qw..(s + 1) * qw].copy_from_slice(&o);
    }
    want
}

/// Runs on the CPU: the split arithmetic the kernels use (chunks from the
/// window's keys, empty splits, log2-domain merge) equals attention under
/// each score rule (plain causal, windows, scales).
#[test]
fn decode_split_reference_matches_attention() {
    let mut rng = StdRng::seed_from_u64(16);
    let block_size = 16;
    let cases = [SHAPES[0], SHAPES[3], D256].into_iter().flat_map(|s| {
        rules(s.head_dim)
            .into_iter()
            .chain([ScoreRule::causal(s.head_dim)])
            .map(move |r| (s, r))
    });
    for (shape, rule) in cases {
        let (b, kc, vc, qkv) = decode_inputs(&mut rng, shape, block_size);
        let qw = shape.num_heads * shape.head_dim;
        let q: Vec<f32> = (0..b.ctx.len())
            .flat_map(|t| f32s(&qkv[t * shape.qkv_width()..][..qw]))
            .collect();
        let (kc, vc) = (f32s(&kc), f32s(&vc));
        let want = decode_want(&b, &q, &kc, &vc, shape, block_size, rule);
        for (splits, min_chunk) in [(1, 64), (3, 16), (33, 64), (33, 256), (128, 16)] {
            let got = kernels::decode_attention::decode_split_ref(
                &q,
                &kc,
                &vc,
                &b.ctx,
                &b.tables,
                b.max_blocks,
                block_size,
                shape,
                splits,
                min_chunk,
                rule,
            );
            let e = rel_err(&got, &want);
            assert!(
                e < 1e-5,
                "{shape:?} {rule:?} splits {splits} min {min_chunk}: rel err {e}"
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn decode_attention_matches_reference() {
    let (gpu, k) = setup();
    let mut rng = StdRng::seed_from_u64(6);
    let shapes = SHAPES.into_iter().chain([D256]);
    for (shape, fp8) in shapes.flat_map(|s| [(s, false), (s, true)]) {
        for block_size in [16, 5] {
            let (b, kc, vc, qkv) = decode_inputs(&mut rng, shape, block_size);
            let n = b.ctx.len();
            let cache = TestKv::new(&gpu, &kc, &vc, fp8);
            let d_qkv = gpu.upload(&qkv).unwrap();
            let (d_ctx, d_tab) = (gpu.upload(&b.ctx).unwrap(), gpu.upload(&b.tables).unwrap());
            let qw = shape.num_heads * shape.head_dim;
            let q: Vec<f32> = (0..n)
                .flat_map(|t| f32s(&qkv[t * shape.qkv_width()..][..qw]))
                .collect();
            let causal = ScoreRule::causal(shape.head_dim);
            let want = decode_want(
                &b,
                &q,
                &cache.k_ref,
                &cache.v_ref,
                shape,
                block_size,
                causal,
            );
            // 1 block: one split per (sequence, KV head), the direct bf16 output;
            // 264: the H200 batch-1 plan; 5000: up to 128 splits, most of them
            // empty; minimum splits of 16 keys (many partials) and 256 (one
            // split up to 256 keys, loops past the keys loaded before the wait).
            for (target, min_chunk) in [(1, 64), (264, 64), (5000, 64), (5000, 16), (264, 256)] {
                let plan = DecodePlan::new(shape, target)
                    .unwrap()
                    .with_min_chunk(min_chunk)
                    .unwrap();
                let po = gpu.alloc::<f32>(plan.partial_o_len(shape, n)).unwrap();
                let pm = gpu.alloc::<f32>(plan.partial_ml_len(shape, n)).unwrap();
                let pc = gpu.alloc::<u32>(plan.counters_len(shape, n)).unwrap();
                let out = gpu.alloc::<bf16>(n * qw).unwrap();
                gpu.fill_bytes(po.view(), POISON).unwrap();
                gpu.fill_bytes(pm.view(), POISON).unwrap();
                let p = DecodeParams {
                    shape,
                    plan,
                    num_seqs: n,
                    max_blocks: b.max_blocks,
                    block_size,
                    fresh: 1,
                    min_ctx: 0,
                    rule: causal,
                };
                // Twice on the same buffers: the second launch relies on the
                // first leaving its split arrival counters at zero.
                for round in 0..2 {
                    gpu.fill_bytes(out.view(), POISON).unwrap();
                    // SAFETY: block ids < num_blocks, every table entry in range.
                    unsafe {
                        k.decode_attention(
                            d_qkv.view(),
                            cache.caches(),
                            DecodeRows::Seqs {
                                context_lens: d_ctx.view(),
                            },
                            d_tab.view(),
                            po.view(),
                            pm.view(),
                            pc.view(),
                            out.view(),
                            p,
                        )
                    }
                    .unwrap();
                    let e = rel_err(&f32s(&gpu.to_host(out.view()).unwrap()), &want);
                    assert!(
                        e < 1e-2,
                        "decode {shape:?} fp8 {fp8} bs {block_size} target {target} min {min_chunk} round {round}: rel err {e}"
                    );
                }
                assert!(
                    gpu.to_host(pc.view()).unwrap().iter().all(|&c| c == 0),
                    "split arrival counters left non-zero"
                );
            }
        }
    }
}

/// One launch of the invariant decode plan over `n` rows described by
/// `rows`, tables `tab`; the bf16 output bits.
#[allow(clippy::too_many_arguments)]
fn invariant_decode(
    gpu: &std::sync::Arc<gpu::Gpu>,
    k: &kernels::Kernels,
    shape: HeadShape,
    qkv: &[bf16],
    cache: &TestKv,
    rows: DecodeRows<'_>,
    tab: &[u32],
    n: usize,
    max_blocks: usize,
    block_size: usize,
) -> Vec<u16> {
    let plan = DecodePlan::new(shape, 264).unwrap().invariant();
    let po = gpu.alloc::<f32>(plan.partial_o_len(shape, n)).unwrap();
    let pm = gpu.alloc::<f32>(plan.partial_ml_len(shape, n)).unwrap();
    let pc = gpu.alloc::<u32>(plan.counters_len(shape, n)).unwrap();
    let out = gpu
        .alloc::<bf16>(n * shape.num_heads * shape.head_dim)
        .unwrap();
    let (d_qkv, d_tab) = (gpu.upload(qkv).unwrap(), gpu.upload(tab).unwrap());
    let p = DecodeParams {
        shape,
        plan,
        num_seqs: n,
        max_blocks,
        block_size,
        fresh: 1,
        min_ctx: 0,
        rule: ScoreRule::causal(shape.head_dim),
    };
    // SAFETY: block ids < num_blocks, every table entry in range; token
    // rows' cu_seqlens cover the rows.
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
    let got = gpu.to_host(out.view()).unwrap();
    got.iter().map(|x| x.to_bits()).collect()
}

/// The invariant plan (deterministic mode): a prompt's token rows give the
/// same bits as the same tokens run as decode rows, one sequence each,
/// alone or in a batch of any size.
#[test]
#[ignore = "needs a CUDA GPU"]
fn invariant_decode_rows_match_bit_for_bit() {
    let (gpu, k) = setup();
    let mut rng = StdRng::seed_from_u64(36);
    let (shape, bs) = (SHAPES[3], 16);
    // two segments: 9 tokens ending at 1,300 keys, 5 ending at 40
    let segs = [(9usize, 1300usize), (5, 40)];
    let b = paged_batch(&mut rng, &segs, bs);
    let slots = b.num_blocks * bs;
    let kc = rand_bf16(&mut rng, slots * shape.kv_width(), 1.0);
    let vc = rand_bf16(&mut rng, slots * shape.kv_width(), 1.0);
    let cache = TestKv::new(&gpu, &kc, &vc, false);
    let t = b.cu[segs.len()] as usize;
    let qkv = rand_bf16(&mut rng, t * shape.qkv_width(), 1.0);
    let positions: Vec<u32> = segs
        .iter()
        .flat_map(|&(len, ctx)| (ctx - len..ctx).map(|p| p as u32))
        .collect();
    let (d_pos, d_cu) = (gpu.upload(&positions).unwrap(), gpu.upload(&b.cu).unwrap());
    let tokens = DecodeRows::Tokens {
        positions: d_pos.view(),
        cu_seqlens: d_cu.view(),
        num_seqs: segs.len(),
    };
    let mb = b.max_blocks;
    let as_tokens = invariant_decode(&gpu, &k, shape, &qkv, &cache, tokens, &b.tables, t, mb, bs);
    // every token a sequence of its own, with its segment's table
    let seq_of = |r: usize| (0..segs.len()).rfind(|&q| b.cu[q] as usize <= r).unwrap();
    let tab: Vec<u32> = (0..t)
        .flat_map(|r| b.tables[seq_of(r) * mb..][..mb].to_vec())
        .collect();
    let ctx: Vec<u32> = positions.iter().map(|p| p + 1).collect();
    let d_ctx = gpu.upload(&ctx).unwrap();
    let seqs = DecodeRows::Seqs {
        context_lens: d_ctx.view(),
    };
    let as_seqs = invariant_decode(&gpu, &k, shape, &qkv, &cache, seqs, &tab, t, mb, bs);
    assert_eq!(as_tokens, as_seqs, "token rows against decode rows");
    // each row alone
    let w = shape.num_heads * shape.head_dim;
    for r in [0, 8, 9, t - 1] {
        let d_one = gpu.upload(&ctx[r..r + 1]).unwrap();
        let one = DecodeRows::Seqs {
            context_lens: d_one.view(),
        };
        let q = &qkv[r * shape.qkv_width()..][..shape.qkv_width()];
        let alone = invariant_decode(
            &gpu,
            &k,
            shape,
            q,
            &cache,
            one,
            &tab[r * mb..][..mb],
            1,
            mb,
            bs,
        );
        assert_eq!(
            alone,
            as_seqs[r * w..][..w],
            "row {r} alone against in the batch"
        );
    }
}
