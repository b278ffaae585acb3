//! The machine's multiply-add roofs: a loop of 16 independent zmm f32 FMAs
//! (and of 16 `vdpbf16ps` / `vpdpbusd`, where the processor has AVX-512
//! BF16 / VNNI) on 1 and
//! 2 threads, in GFLOP/s. `cargo run --release -p cpu-kernels --example
//! fma_peak`. What the GEMM's GFLOP/s (`matmul_bench`) are measured against.

use rayon::prelude::*;
use std::time::Instant;

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// `$name(n)`: `n` rounds of 16 independent `$op(acc)` on zmm
    /// accumulators from `$zero`, summed into a checksum by `$fold`.
    macro_rules! peak_loop {
        ($name:ident, $feat:literal, $zero:expr, $op:expr, $fold:expr) => {
            /// # Safety
            /// The named target features.
            #[target_feature(enable = $feat)]
            pub unsafe fn $name(n: usize) -> f32 {
                let mut acc = [$zero; 16];
                for _ in 0..n {
                    for c in acc.iter_mut() {
                        *c = $op(*c);
                    }
                }
                $fold(&acc)
            }
        };
    }

    peak_loop!(
        fma_loop,
        "avx512f",
        _mm512_setzero_ps(),
        |c| _mm512_fmadd_ps(c, _mm512_set1_ps(1.000_000_1), _mm512_set1_ps(0.999_999_9)),
        |a: &[__m512; 16]| _mm512_reduce_add_ps(
            a.iter()
                .fold(_mm512_setzero_ps(), |s, &c| _mm512_add_ps(s, c))
        )
    );
    // 1.0 in every BF16 lane (__m512i and __m512bh are both 512 plain bits)
    peak_loop!(
        bf16_loop,
        "avx512f,avx512bf16",
        _mm512_setzero_ps(),
        |c| {
            // SAFETY: see above.
            let one: __m512bh = unsafe { std::mem::transmute(_mm512_set1_epi16(0x3f80)) };
            _mm512_dpbf16_ps(c, one, one)
        },
        |a: &[__m512; 16]| _mm512_reduce_add_ps(
            a.iter()
                .fold(_mm512_setzero_ps(), |s, &c| _mm512_add_ps(s, c))
        )
    );
    peak_loop!(
        vnni_loop,
        "avx512f,avx512vnni",
        _mm512_setzero_si512(),
        |c| _mm512_dpbusd_epi32(c, _mm512_set1_epi8(1), _mm512_set1_epi8(1)),
        |a: &[__m512i; 16]| _mm512_reduce_add_epi32(
            a.iter()
                .fold(_mm512_setzero_si512(), |s, &c| _mm512_add_epi32(s, c))
        ) as f32
    );
}

fn main() {
    #[cfg(target_arch = "x86_64")]
    {
        if !is_x86_feature_detected!("avx512f") {
            println!("no AVX-512F on this processor");
            return;
        }
        let bf16 = is_x86_feature_detected!("avx512bf16");
        let vnni = is_x86_feature_detected!("avx512vnni");
        let n = 20_000_000usize;
        for threads in [1usize, 2] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("a rayon pool");
            let time = |f: unsafe fn(usize) -> f32, macs_per_op: usize| {
                let t = Instant::now();
                let r: f32 = pool.install(|| {
                    (0..threads)
                        .into_par_iter()
                        // SAFETY: the features were detected above.
                        .map(|_| unsafe { f(n) })
                        .sum()
                });
                let flops = (threads * n * 16 * macs_per_op * 2) as f64;
                (flops / t.elapsed().as_secs_f64() / 1e9, r)
            };
            let (g, r) = time(x86::fma_loop, 16);
            println!("f32 FMA, {threads} threads: {g:.1} GFLOP/s (checksum {r})");
            if bf16 {
                let (g, r) = time(x86::bf16_loop, 32);
                println!("vdpbf16ps, {threads} threads: {g:.1} GFLOP/s (checksum {r})");
            }
            if vnni {
                let (g, r) = time(x86::vnni_loop, 64);
                println!("vpdpbusd, {threads} threads: {g:.1} GOP/s (checksum {r})");
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    println!("x86-64 only");
}
