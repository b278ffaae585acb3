//! Times `matmul_bf16` on one shape: `cargo run --release -p cpu-kernels
//! --example matmul_bench -- T IN OUT [ITERS]`. Prints the fastest call's ms, GB/s of
//! weights read and GFLOP/s, for every instruction-set path this machine runs.

use cpu_kernels::{Isa, Scratch, matmul_bf16};
use half::bf16;
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
    let x: Vec<f32> = (0..t * inp).map(|i| (i % 7) as f32 * 0.1).collect();
    let w: Vec<bf16> = (0..out * inp)
        .map(|i| bf16::from_f32((i % 5) as f32 * 0.01))
        .collect();
    let mut y = vec![0f32; t * out];
    let mut s = Scratch::default();
    if t >= cpu_kernels::matmul::GEMM_MIN_TOKENS {
        let isa = Isa::best();
        let mut sec = f64::INFINITY;
        for _ in 0..iters {
            let start = Instant::now();
            cpu_kernels::matmul::matmul_bf16_tiled(isa, &x, &w, inp, out, &mut y);
            sec = sec.min(start.elapsed().as_secs_f64());
        }
        println!(
            "{:>9} tiled T={t} {inp}x{out}: {:.3} ms, {:.1} GFLOP/s",
            isa.name(),
            sec * 1e3,
            (2 * t * inp * out) as f64 / sec / 1e9
        );
        let mut sec = f64::INFINITY;
        for _ in 0..iters {
            let start = Instant::now();
            cpu_kernels::matmul::matmul_bf16_gemm(&x, &w, inp, out, &mut y, &mut s);
            sec = sec.min(start.elapsed().as_secs_f64());
        }
        println!(
            "gemm-crate T={t} {inp}x{out}: {:.3} ms, {:.1} GFLOP/s",
            sec * 1e3,
            (2 * t * inp * out) as f64 / sec / 1e9
        );
    }
    {
        let isa = Isa::best();
        let mut sec = f64::INFINITY;
        for _ in 0..iters {
            let start = Instant::now();
            cpu_kernels::matmul::matmul_bf16(isa, &x, &w, inp, out, &mut y, &mut s);
            sec = sec.min(start.elapsed().as_secs_f64());
        }
        println!(
            "{:>9} row-major bf16 T={t} {inp}x{out}: {:.3} ms, {:.1} GB/s weights",
            isa.name(),
            sec * 1e3,
            (w.len() * 2) as f64 / sec / 1e9
        );
    }
    if Isa::Avx512.supported() {
        let pw = cpu_kernels::pairs::PairPanels::new(&w, inp, out);
        let mut sec = f64::INFINITY;
        for _ in 0..iters {
            let start = Instant::now();
            cpu_kernels::pairs::matmul_pairs(&x, &pw, &mut y);
            sec = sec.min(start.elapsed().as_secs_f64());
        }
        println!(
            "pair panels, f32 T={t} {inp}x{out}: {:.3} ms, {:.1} GB/s weights, {:.1} GFLOP/s",
            sec * 1e3,
            (w.len() * 2) as f64 / sec / 1e9,
            (2 * t * inp * out) as f64 / sec / 1e9
        );
        if cpu_kernels::gemm_split::supported() {
            use cpu_kernels::gemm_split::{LoWeights, SplitActs, matmul_split};
            let lo = LoWeights::new(&w, inp, out);
            let mut acts = SplitActs::default();
            let mut sec = f64::INFINITY;
            for _ in 0..iters {
                let start = Instant::now();
                matmul_split(&x, &pw, &lo, &mut y, &mut acts);
                sec = sec.min(start.elapsed().as_secs_f64());
            }
            println!(
                "pair panels, bf16+int8 split T={t} {inp}x{out}: {:.3} ms, {:.1} GFLOP/s",
                sec * 1e3,
                (2 * t * inp * out) as f64 / sec / 1e9
            );
        }
    }
    for isa in Isa::available() {
        matmul_bf16(isa, &x, &w, inp, out, &mut y, &mut s);
        // the fastest call: the least disturbed by other processes
        let mut sec = f64::INFINITY;
        for _ in 0..iters {
            let start = Instant::now();
            matmul_bf16(isa, &x, &w, inp, out, &mut y, &mut s);
            sec = sec.min(start.elapsed().as_secs_f64());
        }
        println!(
            "{:>9} T={t} {inp}x{out}: {:.3} ms, {:.1} GB/s weights, {:.1} GFLOP/s",
            isa.name(),
            sec * 1e3,
            (w.len() * 2) as f64 / sec / 1e9,
            (2 * t * inp * out) as f64 / sec / 1e9
        );
    }
}
