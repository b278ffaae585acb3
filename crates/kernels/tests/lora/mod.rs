//! GPU tests of the LoRA shrink / expand pair (`kernels::lora`) against
//! `lora_ref`, with rows of the base model and of several adapters mixed,
//! ranks padded with zeros, one to three stacked segments and both output
//! types; part of the `gpu_kernels` binary.

use crate::common::*;
use half::bf16;
use kernels::Kernels;
use kernels::lora::{LoraIn, LoraOut, LoraShape, lora_ref};
use rand::SeedableRng;
use rand::rngs::StdRng;

/// Random stacked A / B of `sh.slots` slots, slot `i`'s rows / columns past
/// `ranks[i]` zero (a smaller adapter padded to the pool's rank).
fn pool(rng: &mut StdRng, sh: &LoraShape, ranks: &[usize]) -> (Vec<bf16>, Vec<bf16>) {
    let (hw, r) = (sh.hw(), sh.rank);
    let mut a = rand_bf16(rng, sh.slots * hw * sh.k, 0.5);
    let mut b = rand_bf16(rng, sh.slots * sh.n * r, 0.5);
    for (s, &rk) in ranks.iter().enumerate() {
        for j in 0..hw {
            if j % r >= rk {
                a[(s * hw + j) * sh.k..(s * hw + j + 1) * sh.k].fill(bf16::ZERO);
            }
        }
        for c in 0..sh.n {
            b[(s * sh.n + c) * r + rk..(s * sh.n + c + 1) * r].fill(bf16::ZERO);
        }
    }
    (a, b)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn lora_shrink_expand_match_reference() {
    let (gpu, k) = setup();
    let mut rng = StdRng::seed_from_u64(11);
    // (tokens, k, n, segs, seg starts, slot of each row cycling)
    let cases = [
        (5, 256, 384, 3, [256, 320], [0u32, 1, 2, 1, 0]),
        (37, 2048, 3072, 1, [3072, 3072], [2, 0, 2, 1, 2]),
        (3, 512, 1024, 2, [512, 1024], [1, 1, 0, 2, 2]),
    ];
    for (tokens, kin, n, segs, seg_starts, cycle) in cases {
        let sh = LoraShape {
            tokens,
            k: kin,
            n,
            rank: 16,
            segs,
            seg_starts,
            slots: 2,
        };
        let (a, b) = pool(&mut rng, &sh, &[16, 8]);
        let x = rand_bf16(&mut rng, tokens * kin, 1.0);
        let scales = [0.7f32, 2.0];
        let slot_of: Vec<u32> = (0..tokens).map(|t| cycle[t % cycle.len()]).collect();
        let (d_x, d_a, d_b) = (
            gpu.upload(&x).unwrap(),
            gpu.upload(&a).unwrap(),
            gpu.upload(&b).unwrap(),
        );
        let d_s = gpu.upload(&scales).unwrap();
        let d_slot = gpu.upload(&slot_of).unwrap();
        let h = gpu.alloc::<f32>(tokens * sh.hw()).unwrap();
        let y0 = rand_bf16(&mut rng, tokens * n, 1.0);
        let want = lora_ref(
            &f32s(&x),
            &f32s(&a),
            &f32s(&b),
            &scales,
            &slot_of,
            &f32s(&y0),
            &sh,
        );
        // bf16 rows, updated in place
        let y = gpu.upload(&y0).unwrap();
        k.lora_shrink(d_x.view(), d_a.view(), d_slot.view(), h.view(), &sh)
            .unwrap();
        k.lora_expand(
            h.view(),
            d_b.view(),
            d_s.view(),
            d_slot.view(),
            LoraOut::Bf16(y.view()),
            &sh,
        )
        .unwrap();
        let got = f32s(&gpu.to_host(y.view()).unwrap());
        let e = rel_err(&got, &want);
        assert!(e < 1e-2, "lora bf16 T={tokens} n={n}: rel err {e}");
        for (t, &s) in slot_of.iter().enumerate() {
            if s == 0 {
                let row = t * n..(t + 1) * n;
                assert_eq!(&got[row.clone()], &f32s(&y0[row]), "base row {t} changed");
            }
        }
        // f32 rows (the GEMV path's residual)
        let y32 = gpu.upload(&f32s(&y0)).unwrap();
        k.lora_expand(
            h.view(),
            d_b.view(),
            d_s.view(),
            d_slot.view(),
            LoraOut::F32(y32.view()),
            &sh,
        )
        .unwrap();
        let got = gpu.to_host(y32.view()).unwrap();
        let e = rel_err(&got, &want);
        assert!(e < 1e-4, "lora f32 T={tokens} n={n}: rel err {e}");
        // the fused launch: bf16 rows in, bf16 out
        assert!(Kernels::lora_fused_fits(&sh));
        let y = gpu.upload(&y0).unwrap();
        let (a_, b_, s_, t_) = (d_a.view(), d_b.view(), d_s.view(), d_slot.view());
        k.lora_fused(
            LoraIn::Bf16(d_x.view()),
            a_,
            b_,
            s_,
            t_,
            LoraOut::Bf16(y.view()),
            &sh,
        )
        .unwrap();
        let got = f32s(&gpu.to_host(y.view()).unwrap());
        let e = rel_err(&got, &want);
        assert!(e < 1e-2, "lora fused bf16 T={tokens} n={n}: rel err {e}");
        // the fused launch over the f32 residual normed first, f32 out
        let resid: Vec<f32> = f32s(&rand_bf16(&mut rng, tokens * kin, 3.0));
        let g = rand_bf16(&mut rng, kin, 1.0);
        let eps = 1e-5f32;
        let normed: Vec<f32> = resid
            .chunks(kin)
            .flat_map(|row| {
                let ms = row.iter().map(|v| (v * v) as f64).sum::<f64>() / kin as f64;
                let rs = 1.0 / (ms + eps as f64).sqrt();
                row.iter()
                    .zip(&g)
                    .map(move |(v, w)| (*v as f64 * rs * w.to_f32() as f64) as f32)
                    .collect::<Vec<_>>()
            })
            .collect();
        let want_n = lora_ref(
            &normed,
            &f32s(&a),
            &f32s(&b),
            &scales,
            &slot_of,
            &f32s(&y0),
            &sh,
        );
        let (d_r, d_g) = (gpu.upload(&resid).unwrap(), gpu.upload(&g).unwrap());
        let y32 = gpu.upload(&f32s(&y0)).unwrap();
        let input = LoraIn::Normed {
            residual: d_r.view(),
            norm_w: d_g.view(),
            eps,
        };
        k.lora_fused(input, a_, b_, s_, t_, LoraOut::F32(y32.view()), &sh)
            .unwrap();
        let e = rel_err(&gpu.to_host(y32.view()).unwrap(), &want_n);
        assert!(e < 1e-4, "lora fused normed T={tokens} n={n}: rel err {e}");
    }
    // a rank that is not a multiple of the step is refused, not launched
    let bad = LoraShape {
        tokens: 1,
        k: 256,
        n: 256,
        rank: 12,
        segs: 1,
        seg_starts: [256, 256],
        slots: 1,
    };
    let buf = gpu.alloc::<bf16>(256 * 16).unwrap();
    let h = gpu.alloc::<f32>(16).unwrap();
    let slot = gpu.upload(&[1u32]).unwrap();
    let e = k
        .lora_shrink(buf.view(), buf.view(), slot.view(), h.view(), &bad)
        .unwrap_err()
        .to_string();
    assert!(e.contains("rank 12"), "{e}");
}
