//! GPU tests of the batch-invariant GEMM (`kernels::invariant_gemm`): its
//! outputs against `ops::linear::matmul_bf16` within rounding, and every
//! row bit for bit the same when it runs alone, in small batches or at any
//! place of a large one, on the direct form and the tiled one alike; part
//! of the `gpu_kernels` binary.

use crate::common::*;
use half::bf16;
use kernels::invariant_gemm::{BLOCK_ROWS, InvOut, TILED_MIN_ROWS, slices};
use rand::SeedableRng;
use rand::rngs::StdRng;

/// `(n, k)`: Llama-3.2-1B's down projection (k of 8 slices), SmolLM2's QKV
/// (k of 2 slices, n not a multiple of the block's 16 rows), one slice.
const SHAPES: [(usize, usize); 3] = [(2048, 8192), (1000, 576), (40, 224)];

/// The kernel's f32 and bf16 outputs for the rows `x` (`[m, k]`).
fn run(
    k_: &kernels::Kernels,
    gpu: &gpu::Gpu,
    x: &[bf16],
    w: &gpu::DeviceBuffer<bf16>,
    n: usize,
    k: usize,
) -> (Vec<f32>, Vec<bf16>) {
    let m = x.len() / k;
    let dx = gpu.upload(x).unwrap();
    let yf = gpu.alloc::<f32>(m * n).unwrap();
    let yb = gpu.alloc::<bf16>(m * n).unwrap();
    gpu.fill_bytes(yf.view(), POISON).unwrap();
    gpu.fill_bytes(yb.view(), POISON).unwrap();
    k_.invariant_gemm(dx.view(), w.view(), InvOut::F32(yf.view()), m, n, k)
        .unwrap();
    k_.invariant_gemm(dx.view(), w.view(), InvOut::Bf16(yb.view()), m, n, k)
        .unwrap();
    (
        gpu.to_host(yf.view()).unwrap(),
        gpu.to_host(yb.view()).unwrap(),
    )
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn invariant_gemm_matches_the_reference_and_every_row_is_batch_invariant() {
    let (gpu, k_) = setup();
    let mut rng = StdRng::seed_from_u64(29);
    for (n, k) in SHAPES {
        assert!(slices(k).is_some(), "k = {k}");
        // the whole batch on the tiled form, the parts on both
        let big = (3 * BLOCK_ROWS).max(2 * TILED_MIN_ROWS) + 11;
        let x = rand_bf16(&mut rng, big * k, 1.0);
        let w_host = rand_bf16(&mut rng, n * k, 0.05);
        let w = gpu.upload(&w_host).unwrap();
        let (full, full_b) = run(&k_, &gpu, &x, &w, n, k);
        let want = ops::linear::matmul_bf16(&f32s(&x), &w_host, k, n);
        let err = rel_err(&full, &want);
        assert!(err < 1e-4, "n {n} k {k}: f32 output rel err {err}");
        let err = rel_err(&f32s(&full_b), &want);
        assert!(err < 1e-2, "n {n} k {k}: bf16 output rel err {err}");
        // the same rows alone and in batches of every tile position
        for (start, m) in [
            (0, 1),
            (5, 1),
            (big - 1, 1),
            (3, 2),
            (9, 7),
            (13, 64),
            (70, 129),
            (1, TILED_MIN_ROWS - 1),
            (big - TILED_MIN_ROWS, TILED_MIN_ROWS),
        ] {
            let (part, part_b) = run(&k_, &gpu, &x[start * k..(start + m) * k], &w, n, k);
            let same = part.iter().zip(&full[start * n..(start + m) * n]);
            let bad = same.filter(|(a, b)| a.to_bits() != b.to_bits()).count();
            assert_eq!(
                bad, 0,
                "n {n} k {k}: rows {start}..+{m} differ from the batch in {bad} f32 outputs"
            );
            assert_eq!(
                part_b,
                full_b[start * n..(start + m) * n],
                "n {n} k {k}: rows {start}..+{m} (bf16)"
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn invariant_gemm_refuses_a_k_off_the_chunk() {
    let (gpu, k_) = setup();
    let x = gpu.alloc::<bf16>(100).unwrap();
    let w = gpu.alloc::<bf16>(100).unwrap();
    let y = gpu.alloc::<f32>(1).unwrap();
    let err = k_
        .invariant_gemm(x.view(), w.view(), InvOut::F32(y.view()), 1, 1, 100)
        .unwrap_err()
        .to_string();
    assert!(err.contains("k = 100"), "{err}");
}
