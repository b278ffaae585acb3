//! The FP8 e4m3 K/V cache on CUDA against the CPU backend with the same
//! cache dtype, on the smollm2-135m synthetic preset at per-layer scales
//! other than 1 (so the scale's folding is exercised, and both backends
//! Hadamard-rotate queries and keys, `ops::hadamard::rotates_keys`: the
//! rotating writers, `rope_kv_write` and the QKV GEMV's epilogue, against
//! the CPU's `ops::hadamard::rotate_heads`): prefill on the GEMV
//! path (7 tokens) and on the GEMM path (300 tokens: the flash prefill
//! kernels), greedy generation on captured decode graphs then its
//! teacher-forced decode, batch against alone (decode attention, the narrow
//! flash tiling and chunked prefill over an FP8 pool), and the FP8 result
//! set apart from the BF16 one (the stored type must show).

use super::*;
use crate::cpu::CpuBackend;
use contract::KvScales;

/// Per-layer scales of the test: K and V of this model stay within a few
/// units, so neither saturates (448 * scale) nor sits in e4m3's subnormals.
fn scales(layers: usize) -> KvScales {
    KvScales {
        k: (0..layers).map(|l| 0.02 + 0.01 * l as f32).collect(),
        v: (0..layers).map(|l| 0.015 + 0.005 * l as f32).collect(),
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_fp8_kv_matches_the_cpu_with_fp8_kv() {
    let (cfg, mut w) = load(&synth_dir(Preset::Smollm2_135m));
    w.kv_scales = Some(scales(cfg.num_layers));
    let vocab = cfg.vocab_size;
    let kv = KvShape {
        num_blocks: 512,
        block_size: BS,
    };
    let fp8 = CudaOptions {
        kv_cache_dtype: KvCacheDtype::Fp8,
        ..CudaOptions::default()
    };
    let mut gpu = CudaBackend::new(cfg.clone(), &w, kv, 0, fp8).unwrap();
    assert!(gpu.name().contains("fp8 KV"), "{}", gpu.name());
    let mut bf16_gpu = CudaBackend::new(cfg.clone(), &w, kv, 0, CudaOptions::default()).unwrap();
    let mut cpu = CpuBackend::new(cfg, w, kv)
        .unwrap()
        .with_kv_cache_dtype(KvCacheDtype::Fp8);
    let mut pool = Pool::new(kv.num_blocks);
    let mut worst = (0.0f64, 0.0f64);
    let mut apart = f64::INFINITY;
    for n in [7usize, 300] {
        let toks = tokens(n as u64 + 5, n, vocab);
        let blocks = pool.take(n);
        let (g, c, b) = (
            chunk_logits(&mut gpu, &toks, 0, &blocks),
            chunk_logits(&mut cpu, &toks, 0, &blocks),
            chunk_logits(&mut bf16_gpu, &toks, 0, &blocks),
        );
        let (e, d) = (rel_err(&g, &c), max_lp_diff(&g, &c, vocab));
        let from_bf16 = rel_err(&g, &b);
        println!(
            "RESULT fp8 KV smollm2 prompt {n}: vs CPU fp8 KV rel err {e:.3e}, max |dlogprob| {d:.3}; vs CUDA bf16 KV rel err {from_bf16:.3e}"
        );
        worst = (worst.0.max(e), worst.1.max(d));
        apart = apart.min(from_bf16);
    }
    let prompt = tokens(77, 40, vocab);
    let blocks = pool.take(40 + 32);
    let (e, d) = generated_vs_cpu(&mut gpu, &mut cpu, &prompt, &blocks, 32, vocab);
    assert!(gpu.num_graphs() > 0, "decode steps ran on captured graphs");
    println!(
        "RESULT fp8 KV smollm2 32 generated (teacher-forced decode): rel err {e:.3e}, max |dlogprob| {d:.3}"
    );
    worst = (worst.0.max(e), worst.1.max(d));
    // the CPU's FP8 bound against the exact pass is 0.1; a K/V value on
    // either side of an e4m3 rounding boundary (bf16 GEMMs in another
    // order) moves by one step of 2^-3, so the two backends may differ by
    // about that much
    assert!(
        worst.0 <= 0.1 && worst.1 <= 0.3,
        "FP8 KV CUDA vs CPU with FP8 KV: {worst:?}"
    );
    assert!(apart > 1e-4, "FP8 KV as exact as bf16 KV ({apart})");
    batch_matches_alone(&mut gpu, 5e-2, "smollm2-135m fp8 KV");
}
