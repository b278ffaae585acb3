//! GPU tests of the LoRA shrink / expand pair (`kernels::lora`), of the
//! tensor-core path (cuBLAS GEMMs around `lora_select`) and of the GEMV
//! path (a GEMV launch computing the shrink in blocks of its own and the
//! deltas in its epilogue) against `lora_ref` (over `gemv_ref`'s product),
//! with rows of the base model and of several adapters mixed, ranks padded
//! with zeros, one to three stacked segments, bf16 and normed inputs; part
//! of the `gpu_kernels` binary.

use crate::common::*;
use crate::gemv::DevWeights;
use gpu::{Blas, GemmDims};
use half::bf16;
use kernels::Kernels;
use kernels::gemv::{GemvKind, GemvLora, GemvOp, gemv_ref};
use kernels::lora::{LoraShape, lora_ref};
use rand::SeedableRng;
use rand::rngs::StdRng;

/// Random A / B of `sh.slots` slots in the pool's layout, slot `i`'s rows
/// / columns past `ranks[i]` zero (a smaller adapter padded to the pool's
/// rank); B's row `c` set in its own segment's values only.
fn pool(rng: &mut StdRng, sh: &LoraShape, ranks: &[usize]) -> (Vec<bf16>, Vec<bf16>) {
    let (hw, r) = (sh.hw(), sh.rank);
    let mut a = rand_bf16(rng, sh.slots * hw * sh.k, 0.5);
    let mut b = vec![bf16::ZERO; sh.n * sh.slots * hw];
    for (s, &rk) in ranks.iter().enumerate() {
        for j in 0..hw {
            if j % r >= rk {
                a[(s * hw + j) * sh.k..(s * hw + j + 1) * sh.k].fill(bf16::ZERO);
            }
        }
        for c in 0..sh.n {
            let seg = usize::from(c >= sh.seg_starts[0]) + usize::from(c >= sh.seg_starts[1]);
            let at = (c * sh.slots + s) * hw + seg * r;
            b[at..at + rk].copy_from_slice(&rand_bf16(rng, rk, 0.5));
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
        // runs of one slot (a prefill chunk's rows), with base rows
        (37, 256, 384, 3, [256, 320], [2, 2, 2, 2, 2]),
        (12, 512, 1024, 2, [512, 1024], [1, 0, 1, 1, 0]),
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
            y.view(),
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
        // the tensor-core path: every slot's shrink, each row's own kept, B added
        let y = gpu.upload(&y0).unwrap();
        tensor_core_pair(
            &gpu, &k, &sh, &d_x, &d_a, &d_b, &d_s, &d_slot, &y, &scales, &slot_of,
        );
        let got = f32s(&gpu.to_host(y.view()).unwrap());
        let e = rel_err(&got, &want);
        assert!(e < 1e-2, "lora tensor cores T={tokens} n={n}: rel err {e}");
        for (t, &s) in slot_of.iter().enumerate() {
            if s == 0 {
                let row = t * n..(t + 1) * n;
                assert_eq!(&got[row.clone()], &f32s(&y0[row]), "base row {t} changed");
            }
        }
        // the GEMV path: the shrink and the delta in one GEMV launch
        if tokens <= kernels::gemv::MAX_ROWS {
            for fp8 in [false, true] {
                let case = Case {
                    a: &a,
                    b: &b,
                    scales: &scales,
                    slot_of: &slot_of,
                    x: &x,
                    y0: &y0,
                };
                gemv_epilogues(&gpu, &k, &mut rng, &sh, case, fp8);
            }
        }
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

/// `y += B (A x)` as the CUDA backend runs it from a few rows up: `h = x
/// A_allᵀ` (cuBLAS), `lora_select` (checked value for value against its
/// definition), `y += hb Bᵀ` (cuBLAS).
#[allow(clippy::too_many_arguments)]
fn tensor_core_pair(
    gpu: &std::sync::Arc<gpu::Gpu>,
    k: &Kernels,
    sh: &LoraShape,
    x: &gpu::DeviceBuffer<bf16>,
    a: &gpu::DeviceBuffer<bf16>,
    b: &gpu::DeviceBuffer<bf16>,
    scales_d: &gpu::DeviceBuffer<f32>,
    slot_d: &gpu::DeviceBuffer<u32>,
    y: &gpu::DeviceBuffer<bf16>,
    scales: &[f32],
    slot_of: &[u32],
) {
    let blas = Blas::new(gpu).unwrap();
    let (t, wide) = (sh.tokens, sh.slots * sh.hw());
    let h = gpu.alloc::<f32>(t * wide).unwrap();
    let hb = gpu.alloc::<bf16>(t * wide).unwrap();
    let dims = |m, n, k| GemmDims { m, n, k };
    blas.matmul_nt(x.view(), a.view(), h.view(), dims(t, wide, sh.k))
        .unwrap();
    k.lora_select(h.view(), scales_d.view(), slot_d.view(), hb.view(), sh)
        .unwrap();
    let (hh, got) = (
        gpu.to_host(h.view()).unwrap(),
        gpu.to_host(hb.view()).unwrap(),
    );
    for (i, (&v, &g)) in hh.iter().zip(&got).enumerate() {
        let (row, s) = (i / wide, i % wide / sh.hw());
        let want = match slot_of[row] as usize == s + 1 {
            true => bf16::from_f32(scales[s] * v),
            false => bf16::ZERO,
        };
        assert_eq!(
            g.to_bits(),
            want.to_bits(),
            "lora_select value {i} (row {row}, slot {s})"
        );
    }
    blas.matmul_nt_add(hb.view(), b.view(), y.view(), dims(t, sh.n, wide))
        .unwrap();
}

/// One case's host operands: the pool's A and B, the slots' scales, each
/// row's slot, the input rows and the outputs' starting values.
struct Case<'a> {
    a: &'a [bf16],
    b: &'a [bf16],
    scales: &'a [f32],
    slot_of: &'a [u32],
    x: &'a [bf16],
    y0: &'a [bf16],
}

/// A GEMV (bf16 or FP8 weights) with its LoRA shrink blocks and the deltas
/// in its epilogue (bf16 rows, then the residual normed): Bf16 and Norm (bf16 out: the delta
/// added to the rounded product, then rounded), Resid (f32 residual: the
/// rounded product and the delta added). The counter is zeroed before each
/// launch, as the CUDA backend does once a step.
fn gemv_epilogues(
    gpu: &gpu::Gpu,
    k: &Kernels,
    rng: &mut StdRng,
    sh: &LoraShape,
    case: Case<'_>,
    fp8: bool,
) {
    let Case {
        a,
        b,
        scales,
        slot_of,
        x,
        y0,
    } = case;
    let (m, n, kin) = (sh.tokens, sh.n, sh.k);
    let w = rand_bf16(rng, n * kin, 0.05);
    let dw = DevWeights::new(gpu, &w, n, kin, fp8);
    let (d_a, d_b) = (gpu.upload(a).unwrap(), gpu.upload(b).unwrap());
    let (d_s, d_slot) = (gpu.upload(scales).unwrap(), gpu.upload(slot_of).unwrap());
    let h = gpu.alloc::<f32>(m * sh.hw()).unwrap();
    let ready = gpu.alloc::<u32>(1).unwrap();
    let lora = GemvLora {
        a: d_a.view(),
        b: d_b.view(),
        scales: d_s.view(),
        slot_of: d_slot.view(),
        h: h.view(),
        ready: ready.view(),
        shape: *sh,
    };
    let zero = || gpu.fill_bytes(ready.view(), 0).unwrap();
    let (af, bf) = (f32s(a), f32s(b));
    let with_delta =
        |input: &[f32], base: &[f32]| lora_ref(input, &af, &bf, scales, slot_of, base, sh);
    // bf16 rows in, bf16 out
    let d_x = gpu.upload(x).unwrap();
    zero();
    let y = gpu.alloc::<bf16>(m * n).unwrap();
    let op = GemvOp::Bf16 {
        x: d_x.view(),
        y: y.view(),
    };
    k.gemv_with(op, dw.gemv(), m, n, kin, Some(&lora)).unwrap();
    let mut base = vec![0f32; m * n];
    gemv_ref(
        GemvKind::Bf16,
        &f32s(x),
        &[],
        0.0,
        &dw.values,
        &mut base,
        m,
        n,
        kin,
    );
    let got = f32s(&gpu.to_host(y.view()).unwrap());
    let e = rel_err(&got, &with_delta(&f32s(x), &base));
    assert!(
        e < 1e-2,
        "GEMV + LoRA bf16 m={m} n={n} fp8 {fp8}: rel err {e}"
    );
    // the residual stream, f32 out
    let r0 = f32s(y0);
    let d_r = gpu.upload(&r0).unwrap();
    let op = GemvOp::Resid {
        x: d_x.view(),
        residual: d_r.view(),
    };
    zero();
    k.gemv_with(op, dw.gemv(), m, n, kin, Some(&lora)).unwrap();
    let mut base = r0.clone();
    gemv_ref(
        GemvKind::Resid,
        &f32s(x),
        &[],
        0.0,
        &dw.values,
        &mut base,
        m,
        n,
        kin,
    );
    let e = rel_err(
        &gpu.to_host(d_r.view()).unwrap(),
        &with_delta(&f32s(x), &base),
    );
    assert!(
        e < 1e-3,
        "GEMV + LoRA resid m={m} n={n} fp8 {fp8}: rel err {e}"
    );
    // the residual normed by the shrink and by the GEMV
    let resid: Vec<f32> = f32s(&rand_bf16(rng, m * kin, 3.0));
    let g = rand_bf16(rng, kin, 1.0);
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
    let (d_res, d_g) = (gpu.upload(&resid).unwrap(), gpu.upload(&g).unwrap());
    zero();
    let norm = kernels::gemv::RowNorm {
        w: d_g.view(),
        eps,
        offset: 0.0,
    };
    let op = GemvOp::Norm {
        residual: d_res.view(),
        norm,
        y: y.view(),
    };
    k.gemv_with(op, dw.gemv(), m, n, kin, Some(&lora)).unwrap();
    let mut base = vec![0f32; m * n];
    gemv_ref(
        GemvKind::Norm,
        &resid,
        &f32s(&g),
        eps,
        &dw.values,
        &mut base,
        m,
        n,
        kin,
    );
    let got = f32s(&gpu.to_host(y.view()).unwrap());
    let e = rel_err(&got, &with_delta(&normed, &base));
    assert!(
        e < 1e-2,
        "GEMV + LoRA normed m={m} n={n} fp8 {fp8}: rel err {e}"
    );
}
