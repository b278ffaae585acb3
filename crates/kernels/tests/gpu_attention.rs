//! GPU tests of RoPE + KV write, prefill and decode attention against their
//! CPU references (poisoned outputs, random paged batches with scrambled
//! block tables, head sizes 16 to 128, lengths above 1024). `#[ignore]`d:
//! they need a CUDA device (`scripts/gpu/kernels.sh`).

mod common;
mod flash_prefill;

use common::*;
use half::bf16;
use kernels::DecodePlan;
use kernels::decode_attention::DecodeParams;
use kernels::prefill_attention::{PrefillParams, RefBatch, attention_ref};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

#[test]
#[ignore = "needs a CUDA GPU"]
fn rope_kv_write_matches_reference() {
    let (gpu, k) = setup();
    let mut rng = StdRng::seed_from_u64(4);
    let max_pos = 4096;
    for (shape, tokens) in SHAPES.iter().zip([5usize, 1030, 1300, 7, 300]) {
        let d = shape.head_dim;
        let (cos, sin) = rope_tables(max_pos, d / 2);
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
        let (d_cos, d_sin) = (gpu.upload(&cos).unwrap(), gpu.upload(&sin).unwrap());
        let kc = gpu.alloc::<bf16>(num_slots * shape.kv_width()).unwrap();
        let vc = gpu.alloc::<bf16>(num_slots * shape.kv_width()).unwrap();
        gpu.fill_bytes(kc.view(), POISON).unwrap();
        gpu.fill_bytes(vc.view(), POISON).unwrap();
        // SAFETY: slots below num_slots, positions below max_pos.
        unsafe {
            k.rope_kv_write(
                d_qkv.view(),
                d_pos.view(),
                d_slots.view(),
                d_cos.view(),
                d_sin.view(),
                kc.view(),
                vc.view(),
                *shape,
                tokens,
                max_pos,
            )
        }
        .unwrap();
        let mut kr = vec![0f32; num_slots * shape.kv_width()];
        let mut vr = kr.clone();
        let q_want = kernels::rope_kv::rope_kv_ref(
            &qkv, &positions, &slots, &cos, &sin, *shape, &mut kr, &mut vr,
        );
        let got = f32s(&gpu.to_host(d_qkv.view()).unwrap());
        let qw = shape.num_heads * d;
        let q_got: Vec<f32> = (0..tokens)
            .flat_map(|t| got[t * shape.qkv_width()..][..qw].to_vec())
            .collect();
        let e = rel_err(&q_got, &q_want);
        assert!(e < 5e-3, "rope q: rel err {e}");
        let (kg, vg) = (
            f32s(&gpu.to_host(kc.view()).unwrap()),
            f32s(&gpu.to_host(vc.view()).unwrap()),
        );
        let w = shape.kv_width();
        let pick = |c: &[f32]| -> Vec<f32> {
            slots
                .iter()
                .flat_map(|&s| c[s as usize * w..][..w].to_vec())
                .collect()
        };
        let e = rel_err(&pick(&kg), &pick(&kr));
        assert!(e < 5e-3, "rope k: rel err {e}");
        assert_eq!(pick(&vg), pick(&vr), "v copied exactly");
    }
}

/// A random paged batch: sequences with `(seqlen, context_len)`, blocks shuffled.
struct PagedBatch {
    cu: Vec<u32>,
    ctx: Vec<u32>,
    tables: Vec<u32>,
    max_blocks: usize,
    num_blocks: usize,
}

fn paged_batch(rng: &mut StdRng, seqs: &[(usize, usize)], block_size: usize) -> PagedBatch {
    let max_blocks = seqs
        .iter()
        .map(|s| s.1.div_ceil(block_size))
        .max()
        .unwrap_or(1);
    let total: usize = seqs.iter().map(|s| s.1.div_ceil(block_size)).sum();
    let num_blocks = total + 3;
    let mut ids: Vec<u32> = (0..num_blocks as u32).collect();
    ids.shuffle(rng);
    let mut tables = vec![0u32; seqs.len() * max_blocks];
    let mut next = 0;
    let mut cu = vec![0u32];
    for (s, &(len, ctx)) in seqs.iter().enumerate() {
        for b in 0..ctx.div_ceil(block_size) {
            tables[s * max_blocks + b] = ids[next];
            next += 1;
        }
        cu.push(cu[s] + len as u32);
    }
    PagedBatch {
        cu,
        ctx: seqs.iter().map(|s| s.1 as u32).collect(),
        tables,
        max_blocks,
        num_blocks,
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
    for shape in SHAPES {
        for seqs in cases {
            let b = paged_batch(&mut rng, seqs, block_size);
            let tokens = *b.cu.last().unwrap() as usize;
            let slots = b.num_blocks * block_size;
            let kc = rand_bf16(&mut rng, slots * shape.kv_width(), 1.0);
            let vc = rand_bf16(&mut rng, slots * shape.kv_width(), 1.0);
            let qkv = rand_bf16(&mut rng, tokens * shape.qkv_width(), 1.0);
            let (d_kc, d_vc, d_qkv) = (
                gpu.upload(&kc).unwrap(),
                gpu.upload(&vc).unwrap(),
                gpu.upload(&qkv).unwrap(),
            );
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
            };
            // SAFETY: the batch was built consistent, every block id < num_blocks.
            unsafe {
                k.prefill_attention(
                    d_qkv.view(),
                    d_kc.view(),
                    d_vc.view(),
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
            let rb = RefBatch {
                cu_seqlens: &b.cu,
                context_lens: &b.ctx,
                block_tables: &b.tables,
                max_blocks: b.max_blocks,
                block_size,
            };
            let want = attention_ref(&q, &f32s(&kc), &f32s(&vc), rb, shape);
            let e = rel_err(&f32s(&gpu.to_host(out.view()).unwrap()), &want);
            assert!(e < 1e-2, "prefill {shape:?} {seqs:?}: rel err {e}");
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn decode_attention_matches_reference() {
    let (gpu, k) = setup();
    let mut rng = StdRng::seed_from_u64(6);
    let block_size = 16;
    for shape in SHAPES {
        let ctxs = [1usize, 5, 513, 2000, 1030, 64];
        let seqs: Vec<(usize, usize)> = ctxs.iter().map(|&c| (1, c)).collect();
        let b = paged_batch(&mut rng, &seqs, block_size);
        let n = seqs.len();
        let slots = b.num_blocks * block_size;
        let kc = rand_bf16(&mut rng, slots * shape.kv_width(), 1.0);
        let vc = rand_bf16(&mut rng, slots * shape.kv_width(), 1.0);
        let qkv = rand_bf16(&mut rng, n * shape.qkv_width(), 1.0);
        let plan = DecodePlan::new(shape, 4096).unwrap();
        let (d_kc, d_vc, d_qkv) = (
            gpu.upload(&kc).unwrap(),
            gpu.upload(&vc).unwrap(),
            gpu.upload(&qkv).unwrap(),
        );
        let (d_ctx, d_tab) = (gpu.upload(&b.ctx).unwrap(), gpu.upload(&b.tables).unwrap());
        let po = gpu.alloc::<f32>(plan.partial_o_len(shape, n)).unwrap();
        let pm = gpu.alloc::<f32>(plan.partial_ml_len(shape, n)).unwrap();
        let qw = shape.num_heads * shape.head_dim;
        let out = gpu.alloc::<bf16>(n * qw).unwrap();
        gpu.fill_bytes(po.view(), POISON).unwrap();
        gpu.fill_bytes(pm.view(), POISON).unwrap();
        gpu.fill_bytes(out.view(), POISON).unwrap();
        let p = DecodeParams {
            shape,
            plan,
            num_seqs: n,
            max_blocks: b.max_blocks,
            block_size,
        };
        // SAFETY: contexts <= 4096, block ids < num_blocks.
        unsafe {
            k.decode_attention(
                d_qkv.view(),
                d_kc.view(),
                d_vc.view(),
                d_ctx.view(),
                d_tab.view(),
                po.view(),
                pm.view(),
                out.view(),
                p,
            )
        }
        .unwrap();
        let q: Vec<f32> = (0..n)
            .flat_map(|t| f32s(&qkv[t * shape.qkv_width()..][..qw]))
            .collect();
        let rb = RefBatch {
            cu_seqlens: &b.cu,
            context_lens: &b.ctx,
            block_tables: &b.tables,
            max_blocks: b.max_blocks,
            block_size,
        };
        let want = attention_ref(&q, &f32s(&kc), &f32s(&vc), rb, shape);
        let e = rel_err(&f32s(&gpu.to_host(out.view()).unwrap()), &want);
        assert!(e < 1e-2, "decode {shape:?}: rel err {e}");
    }
}
