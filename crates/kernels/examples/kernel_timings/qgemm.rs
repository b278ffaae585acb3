//! `kernel_timings qgemm`: the block-format GEMM against what it replaces.

use std::sync::Arc;

use gpu::Gpu;
use half::bf16;
use kernels::Kernels;
use rand::SeedableRng;
use rand::rngs::StdRng;

use super::common::rand_bf16;
use super::graph_us;

/// The block-format GEMM (`kernels::qgemm`, Q4_K, Q8_0 and int4 weights
/// of Llama-3.2-1B's shapes) against what it replaces, widening the blocks
/// to bf16 and cuBLAS on them, and cuBLAS on bf16 weights, at row counts
/// from 16 to 2,048: where the two block paths cross is
/// `QGEMM_MAX_ROWS` in the model crate.
pub(super) fn qgemm(gpu: &Arc<Gpu>, k: &Kernels) {
    use kernels::gemv::WeightFormat;
    const MAX_M: usize = 2048;
    let mut rng = StdRng::seed_from_u64(31);
    let (h, inter, qkv) = (2048usize, 8192usize, 3072usize);
    let blas = gpu::Blas::new(gpu).expect("cuBLAS");
    let x = gpu
        .upload(&rand_bf16(&mut rng, MAX_M * inter, 1.0))
        .unwrap();
    let y = gpu.alloc::<bf16>(MAX_M * 2 * inter).unwrap();
    let wide = gpu.alloc::<bf16>(2 * inter * h).unwrap();
    for format in [WeightFormat::Q4K, WeightFormat::Q8_0, WeightFormat::Int4] {
        let l = format.layout().expect("a block format");
        for (name, n, kk) in [
            ("qkv", qkv, h),
            ("gate/up", 2 * inter, h),
            ("down", h, inter),
        ] {
            // zero scales: the figures do not depend on the values
            let q = gpu.alloc::<u8>(n * l.row_bytes(kk)).unwrap();
            let side = gpu.alloc::<u8>(n * l.side_bytes(kk)).unwrap();
            gpu.fill_bytes(q.view(), 0x11).unwrap();
            gpu.fill_bytes(side.view(), 0).unwrap();
            let bytes = n * (l.row_bytes(kk) + l.side_bytes(kk));
            for m in [16usize, 32, 64, 128, 256, 512, MAX_M] {
                let d = gpu::GemmDims { m, n, k: kk };
                let ours = graph_us(gpu, || {
                    let (q, s, x, y) = (q.view(), side.view(), x.view(), y.view());
                    k.qgemm(format, q, s, x, y, m, n, kk).unwrap()
                });
                let widened = graph_us(gpu, || {
                    let w = wide.view().sub(0, n * kk).unwrap();
                    k.gguf_dequant(format, q.view(), side.view(), w, n, kk)
                        .unwrap();
                    blas.matmul_nt(x.view(), w, y.view(), d).unwrap()
                });
                let bf16 = graph_us(gpu, || {
                    let w = wide.view().sub(0, n * kk).unwrap();
                    blas.matmul_nt(x.view(), w, y.view(), d).unwrap()
                });
                let gbs = bytes as f64 / ours / 1e3;
                let tf = (2 * m * n * kk) as f64 / ours / 1e6;
                println!(
                    "RESULT qgemm {format:?} {name} m={m}: {ours:.1} us ({gbs:.0} GB/s of blocks, \
                     {tf:.0} TFLOP/s), widened + cuBLAS {widened:.1} us, cuBLAS on bf16 {bf16:.1} us"
                );
            }
        }
    }
}
