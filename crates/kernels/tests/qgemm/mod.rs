//! GPU tests of the block-format GEMM (`kernels::qgemm`): for every block
//! format, random blocks (random codes, sane scales) multiplied by random
//! rows against the CPU product of the same weights as `gguf_dequant`
//! widens them, within rounding, and every row bit for bit the same alone
//! as in a batch; part of the `gpu_kernels` binary.

use crate::common::*;
use half::{bf16, f16};
use kernels::gemv::WeightFormat;
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

/// Random chunks `[n, row_bytes]` and side records `[n, side_bytes]` of
/// `format` whose scales are small and finite (each record's fields at the
/// places `cu/gemv_formats.cuh` states).
fn random_blocks(rng: &mut StdRng, format: WeightFormat, n: usize, k: usize) -> (Vec<u8>, Vec<u8>) {
    let l = format.layout().expect("a block format");
    let mut q = vec![0u8; n * l.row_bytes(k)];
    rng.fill_bytes(&mut q);
    let mut side = vec![0u8; n * l.side_bytes(k)];
    rng.fill_bytes(&mut side);
    let f16_at = |rec: &mut [u8], at: usize, lo: f32, hi: f32, rng: &mut StdRng| {
        let v = f16::from_f32(rng.random_range(lo..hi));
        rec[at..at + 2].copy_from_slice(&v.to_le_bytes());
    };
    for rec in side.chunks_exact_mut(l.side) {
        match format {
            WeightFormat::Q8_0 => f16_at(rec, 0, 0.0005, 0.002, rng),
            WeightFormat::Q4_0 => f16_at(rec, 0, 0.002, 0.01, rng),
            WeightFormat::Q4_1 => {
                f16_at(rec, 0, 0.002, 0.01, rng);
                f16_at(rec, 2, -0.05, 0.0, rng);
            }
            WeightFormat::Q4K | WeightFormat::Q5K => {
                f16_at(rec, 0, 0.0002, 0.001, rng);
                f16_at(rec, 2, 0.0002, 0.001, rng);
            }
            WeightFormat::Q6K => {
                f16_at(rec, 80, 0.0002, 0.001, rng);
                rec[82..].fill(0);
            }
            WeightFormat::Int4 => {
                let scale: f32 = rng.random_range(0.002..0.01);
                let zero = rng.random_range(0..16u32) as f32;
                rec[..4].copy_from_slice(&scale.to_le_bytes());
                rec[4..8].copy_from_slice(&zero.to_le_bytes());
            }
            WeightFormat::Bf16 | WeightFormat::Fp8Row => unreachable!("not a block format"),
        }
    }
    (q, side)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn qgemm_matches_the_widened_product_and_rows_are_batch_invariant() {
    let (gpu, kern) = setup();
    let mut rng = StdRng::seed_from_u64(41);
    for format in WeightFormat::ALL
        .into_iter()
        .filter(|f| f.layout().is_some())
    {
        let group = format.layout().unwrap().group;
        // k: whole steps, and (block-32 formats) a last step of 64 columns
        let ks: &[usize] = match group {
            32 => &[512, 576],
            _ => &[512, 2048],
        };
        for &k in ks {
            let n = 200;
            let (q, side) = random_blocks(&mut rng, format, n, k);
            let (dq, ds) = (gpu.upload(&q).unwrap(), gpu.upload(&side).unwrap());
            let wide = gpu.alloc::<bf16>(n * k).unwrap();
            kern.gguf_dequant(format, dq.view(), ds.view(), wide.view(), n, k)
                .unwrap();
            let w = gpu.to_host(wide.view()).unwrap();
            assert!(
                w.iter().all(|v| v.to_f32().is_finite()),
                "{format:?} widened"
            );
            let big = 141;
            let x = rand_bf16(&mut rng, big * k, 1.0);
            let dx = gpu.upload(&x).unwrap();
            let run = |m: usize, from: usize| -> Vec<bf16> {
                let xs = dx.view().sub(from * k, m * k).unwrap();
                let y = gpu.alloc::<bf16>(m * n).unwrap();
                gpu.fill_bytes(y.view(), POISON).unwrap();
                kern.qgemm(format, dq.view(), ds.view(), xs, y.view(), m, n, k)
                    .unwrap();
                gpu.to_host(y.view()).unwrap()
            };
            let full = run(big, 0);
            let want = ops::linear::matmul_bf16(&f32s(&x), &w, k, n);
            let err = rel_err(&f32s(&full), &want);
            assert!(err < 1e-2, "{format:?} n {n} k {k}: rel err {err}");
            // rows alone and in small batches at other places of a tile
            for (m, from) in [(1, 0), (1, 77), (9, 63), (17, 100)] {
                let part = run(m, from);
                let same = &full[from * n..(from + m) * n];
                assert!(
                    part.iter()
                        .zip(same)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{format:?} k {k}: rows {from}..{} differ from the batch's",
                    from + m
                );
            }
            println!("RESULT qgemm {format:?} n {n} k {k} m {big}: rel err {err:.2e}");
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn qgemm_refuses_what_it_cannot_read() {
    let (gpu, kern) = setup();
    let buf = gpu.alloc::<u8>(1 << 16).unwrap();
    let x = gpu.alloc::<bf16>(1 << 12).unwrap();
    let y = gpu.alloc::<bf16>(1 << 12).unwrap();
    // Q4_K needs whole super-blocks; bf16 is no block format
    let e = kern
        .qgemm(
            WeightFormat::Q4K,
            buf.view(),
            buf.view(),
            x.view(),
            y.view(),
            1,
            8,
            128,
        )
        .unwrap_err();
    assert!(e.to_string().contains("k = 128"), "{e}");
    let e = kern
        .qgemm(
            WeightFormat::Bf16,
            buf.view(),
            buf.view(),
            x.view(),
            y.view(),
            1,
            8,
            256,
        )
        .unwrap_err();
    assert!(e.to_string().contains("Bf16"), "{e}");
}
