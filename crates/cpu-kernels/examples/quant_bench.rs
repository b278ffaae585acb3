//! Times `matmul_quant` on one shape for every dot-product path: `cargo run
//! --release -p cpu-kernels --example quant_bench -- T IN OUT [ITERS]`.
//! Prints the fastest call's ms and GB/s of weights read per type and path
//! (Q4_K and Q6_K where `IN` is a multiple of 256; Q4_1 and Q8_0 also in
//! 16-row panels where AVX-512 VNNI runs),
//! single-threaded (`RAYON_NUM_THREADS=1`) or on the pool.

use cpu_kernels::Isa;
use cpu_kernels::quant::{Kernel, QuantActs, QuantType, matmul_quant, quantize_row, x16};
use std::time::Instant;

fn main() {
    let a: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|s| s.parse().ok())
        .collect();
    let (t, inp, out) = (
        a.first().copied().unwrap_or(1),
        a.get(1).copied().unwrap_or(576),
        a.get(2).copied().unwrap_or(49152),
    );
    let iters = a.get(3).copied().unwrap_or(20);
    cpu_kernels::threads::init_pool();
    let x: Vec<f32> = (0..t * inp).map(|i| ((i % 7) as f32 - 3.0) * 0.1).collect();
    let wf: Vec<f32> = (0..inp).map(|i| ((i % 5) as f32 - 2.0) * 0.01).collect();
    let mut y = vec![0f32; t * out];
    let mut acts = QuantActs::default();
    for qt in [
        QuantType::Q4_1,
        QuantType::Q8_0,
        QuantType::Q4_K,
        QuantType::Q6_K,
    ] {
        if !inp.is_multiple_of(qt.block_len()) {
            println!(
                "{:>4} skipped: {inp} is not whole blocks of {}",
                qt.name(),
                qt.block_len()
            );
            continue;
        }
        let mut row = Vec::new();
        quantize_row(qt, &wf, &mut row);
        let w: Vec<u8> = row.iter().copied().cycle().take(row.len() * out).collect();
        for isa in Isa::available() {
            let mut sec = f64::INFINITY;
            for _ in 0..iters {
                let start = Instant::now();
                matmul_quant(isa, &x, &w, qt, inp, out, &mut y, &mut acts);
                sec = sec.min(start.elapsed().as_secs_f64());
            }
            println!(
                "{:>4} {:>11} T={t} {inp}x{out}: {:.3} ms, {:.1} GB/s",
                qt.name(),
                Kernel::pick(isa).name(),
                sec * 1e3,
                w.len() as f64 / sec / 1e9
            );
        }
        if let Some(p) = x16::Panels16::new(qt, &w, out, inp) {
            let mut sec = f64::INFINITY;
            for _ in 0..iters {
                let start = Instant::now();
                x16::matmul_x16(&x, &p, &mut y, &mut acts);
                sec = sec.min(start.elapsed().as_secs_f64());
            }
            println!(
                "{:>4} {:>11} T={t} {inp}x{out}: {:.3} ms, {:.1} GB/s",
                qt.name(),
                "panels-16",
                sec * 1e3,
                w.len() as f64 / sec / 1e9
            );
        }
    }
}
