//! FP8 tensor-core GEMMs on the GPU: the per-row activation quantiser
//! against `ops::fp8::quantize_rows` (bytes and scales exactly), and
//! `gpu::BlasLt::matmul_fp8_nt` against the f64 product of the dequantised
//! operands, on the decoder's shapes; bad layouts rejected by name.

mod common;

use common::*;
use gpu::{BlasLt, GemmDims};
use half::bf16;
use rand::SeedableRng;
use rand::rngs::StdRng;

#[test]
#[ignore = "needs a CUDA GPU"]
fn fp8_quantiser_matches_the_codec_exactly() {
    let (gpu, k) = setup();
    let mut rng = StdRng::seed_from_u64(31);
    for (m, kk) in [(1, 64), (5, 2048), (300, 576), (64, 8192)] {
        let mut x = rand_bf16(&mut rng, m * kk, 3.0);
        if m > 1 {
            x[kk..2 * kk].fill(bf16::ZERO); // a zero row: scale 1
        }
        let dx = gpu.upload(&x).unwrap();
        let q = gpu.alloc::<u8>(m * kk).unwrap();
        let s = gpu.alloc::<f32>(m).unwrap();
        gpu.fill_bytes(q.view(), POISON).unwrap();
        k.fp8_quant_rows(dx.view(), q.view(), s.view(), m, kk)
            .unwrap();
        let (want_q, want_s) = kernels::fp8::quant_rows_ref(&x, m, kk);
        assert_eq!(gpu.to_host(s.view()).unwrap(), want_s, "scales {m}x{kk}");
        assert_eq!(gpu.to_host(q.view()).unwrap(), want_q, "bytes {m}x{kk}");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn fp8_gemm_matches_the_dequantised_product() {
    let (gpu, _) = setup();
    let lt = BlasLt::new(&gpu).unwrap();
    let mut rng = StdRng::seed_from_u64(32);
    // Llama-3.2-1B's QKV, O, gate/up and down at prefill sizes, odd m;
    // SmolLM2's QKV and down (k = 576, 1536); rows of x and w scaled by
    // 2^-3 .. 2^3, so a scale applied to the wrong row or column shows
    for (m, n, kk) in [
        (7, 3072, 2048),
        (300, 2048, 2048),
        (129, 16384, 2048),
        (2048, 2048, 8192),
        (300, 960, 576),
        (64, 576, 1536),
    ] {
        let mut x = rand_bf16(&mut rng, m * kk, 1.0);
        let mut w = rand_bf16(&mut rng, n * kk, 0.05);
        for rows in [&mut x, &mut w] {
            for (r, row) in rows.chunks_mut(kk).enumerate() {
                let f = 2f32.powi((r % 7) as i32 - 3);
                row.iter_mut()
                    .for_each(|v| *v = bf16::from_f32(v.to_f32() * f));
            }
        }
        let (wq, ws) = ops::fp8::quantize_rows(&f32s(&w), n, kk);
        let (xq, xs) = kernels::fp8::quant_rows_ref(&x, m, kk);
        let d = GemmDims { m, n, k: kk };
        assert!(lt.supports(d).unwrap(), "no FP8 algorithm for {d:?}");
        let (dxq, dxs) = (gpu.upload(&xq).unwrap(), gpu.upload(&xs).unwrap());
        let (dwq, dws) = (gpu.upload(&wq).unwrap(), gpu.upload(&ws).unwrap());
        let y = gpu.alloc::<bf16>(m * n).unwrap();
        gpu.fill_bytes(y.view(), POISON).unwrap();
        lt.matmul_fp8_nt(dxq.view(), dxs.view(), dwq.view(), dws.view(), y.view(), d)
            .unwrap();
        let (xf, wf) = (
            ops::fp8::dequantize_rows(&xq, &xs, kk),
            ops::fp8::dequantize_rows(&wq, &ws, kk),
        );
        // every 97th output against the f64 product of the dequantised operands
        let got = f32s(&gpu.to_host(y.view()).unwrap());
        let idx: Vec<usize> = (0..m * n).step_by(97).collect();
        let want: Vec<f32> = idx
            .iter()
            .map(|&i| {
                let (r, c) = (i / n, i % n);
                (0..kk)
                    .map(|j| xf[r * kk + j] as f64 * wf[c * kk + j] as f64)
                    .sum::<f64>() as f32
            })
            .collect();
        let got: Vec<f32> = idx.iter().map(|&i| got[i]).collect();
        let e = rel_err(&got, &want);
        assert!(e < 1e-2, "fp8 gemm {m}x{n}x{kk}: rel err {e}");
        // the same shape again with other weight scales (as the next layer
        // would): each call reads its own scales
        let twice: Vec<f32> = ws.iter().map(|s| 2.0 * s).collect();
        let dws2 = gpu.upload(&twice).unwrap();
        lt.matmul_fp8_nt(dxq.view(), dxs.view(), dwq.view(), dws2.view(), y.view(), d)
            .unwrap();
        let again = f32s(&gpu.to_host(y.view()).unwrap());
        let again: Vec<f32> = idx.iter().map(|&i| again[i] / 2.0).collect();
        let e = rel_err(&again, &want);
        assert!(
            e < 1e-2,
            "fp8 gemm {m}x{n}x{kk}, second scales: rel err {e}"
        );
        let err = lt
            .matmul_fp8_nt(
                dxq.view(),
                dxs.view(),
                dwq.view(),
                dws.view(),
                y.view(),
                GemmDims { m: m + 1, n, k: kk },
            )
            .unwrap_err();
        assert!(err.to_string().contains("x [m, k]"), "{err}");
    }
    let err = lt.supports(GemmDims { m: 4, n: 64, k: 40 }).unwrap_err();
    assert!(err.to_string().contains("multiple of 16"), "{err}");
}
