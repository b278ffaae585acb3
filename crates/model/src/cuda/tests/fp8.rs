//! FP8 weights on CUDA (W8A16: e4m3 projections, bf16 activations) against
//! the CPU backend on the same weights dequantised, on the smollm2-135m
//! synthetic preset: prefill on the GEMV path (7 tokens) and on the GEMM
//! path (300 tokens, projections widened to bf16), teacher-forced decode,
//! batch against alone, with the LM head in bf16 and in FP8; and a degenerate model (a zero final norm) sampled
//! on the GPU.

use super::*;
use crate::cpu::CpuBackend;

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_fp8_weights_match_the_cpu_on_the_dequantised_weights() {
    fp8_matches_the_cpu(false, false);
}

/// The same with the LM head in FP8 too (`--quantize-lm-head`): the GEMV
/// path reads it as e4m3, the GEMM path widens it.
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_fp8_lm_head_matches_the_cpu_on_the_dequantised_weights() {
    fp8_matches_the_cpu(true, false);
}

/// W8A8 (`--fp8-activations`): the GEMM path quantises its inputs per
/// token, which the CPU (bf16 activations) does not, so the bound is the
/// activations' rounding: measured rel err 7.4e-2, max |dlogprob| 0.21.
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_fp8_activations_stay_near_the_cpu() {
    fp8_matches_the_cpu(false, true);
}

fn fp8_matches_the_cpu(quantize_head: bool, fp8_activations: bool) {
    let (cfg, mut w) = load(&synth_dir(Preset::Smollm2_135m));
    w.quantize_fp8();
    if quantize_head {
        w.quantize_lm_head_fp8().unwrap();
    }
    let vocab = cfg.vocab_size;
    let kv = KvShape {
        num_blocks: 512,
        block_size: BS,
    };
    let opts = CudaOptions {
        fp8_activations,
        ..CudaOptions::default()
    };
    let mut gpu = CudaBackend::new(cfg.clone(), &w, kv, 0, opts).unwrap();
    assert!(gpu.name().contains("fp8"), "{}", gpu.name());
    assert_eq!(
        gpu.name().contains("activations"),
        fp8_activations,
        "{}",
        gpu.name()
    );
    assert_eq!(
        gpu.name().contains("LM head"),
        quantize_head,
        "{}",
        gpu.name()
    );
    // the CPU runs the dequantised values (widening the FP8 projections)
    let mut cpu = CpuBackend::new(cfg, w, kv).unwrap();
    let mut pool = Pool::new(kv.num_blocks);
    let mut worst = (0.0f64, 0.0f64);
    for n in [7usize, 300] {
        let toks = tokens(n as u64 + 11, n, vocab);
        let blocks = pool.take(n);
        let (g, c) = (
            chunk_logits(&mut gpu, &toks, 0, &blocks),
            chunk_logits(&mut cpu, &toks, 0, &blocks),
        );
        let (e, d) = (rel_err(&g, &c), max_lp_diff(&g, &c, vocab));
        println!(
            "RESULT fp8 (LM head: {quantize_head}, activations: {fp8_activations}) smollm2 prompt {n}: rel err {e:.3e}, max |dlogprob| {d:.3}"
        );
        worst = (worst.0.max(e), worst.1.max(d));
    }
    let prompt = tokens(98, 40, vocab);
    let blocks = pool.take(40 + 32);
    let (e, d) = generated_vs_cpu(&mut gpu, &mut cpu, &prompt, &blocks, 32, vocab);
    println!(
        "RESULT fp8 (LM head: {quantize_head}, activations: {fp8_activations}) smollm2 32 generated (teacher-forced decode): rel err {e:.3e}, max |dlogprob| {d:.3}"
    );
    worst = (worst.0.max(e), worst.1.max(d));
    let bound = if fp8_activations {
        (0.1, 0.3)
    } else {
        (3e-2, 0.2)
    };
    assert!(
        worst.0 <= bound.0 && worst.1 <= bound.1,
        "FP8 CUDA (activations too: {fp8_activations}) vs CPU on the dequantised weights: {worst:?}"
    );
    // W8A8: a sequence alone decodes on the GEMV path (bf16 activations),
    // in a batch on the GEMMs (FP8 activations): the activations' rounding apart
    let tol = if fp8_activations { bound.0 } else { 2e-2 };
    batch_matches_alone(&mut gpu, tol, "smollm2-135m fp8");
}

/// Weights that collapse every logit (a zero final norm) sample token 0 with
/// a NaN log-probability on the GPU, greedy and sampled: the engine's sign
/// to end the request with an error.
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_collapsed_logits_sample_a_nan_logprob() {
    let (cfg, mut w) = load(&synth_dir(Preset::Tiny));
    w.norm.data.fill(half::bf16::ZERO);
    let kv = KvShape {
        num_blocks: 16,
        block_size: BS,
    };
    let mut gpu = CudaBackend::new(cfg.clone(), &w, kv, 0, CudaOptions::default()).unwrap();
    let mut pool = Pool::new(kv.num_blocks);
    for params in [
        SamplingParams::greedy(),
        SamplingParams {
            temperature: 0.9,
            seed: 5,
            ..SamplingParams::default()
        },
    ] {
        let c = SeqChunk {
            prompt_len: 0,
            tokens: tokens(3, 9, cfg.vocab_size),
            start: 0,
            blocks: pool.take(9),
            sample: Some(SampleRequest {
                params,
                step: 0,
                history: None,
                allowed: None,
            }),
        };
        let t = gpu
            .step(&build_step(std::slice::from_ref(&c), BS).unwrap())
            .unwrap()[0]
            .clone()
            .unwrap();
        assert!(t.logprob.is_nan() && t.token == 0, "{t:?}");
    }
}

/// A short FP8 run on the tiny preset, both paths (a 40-token prefill on
/// the GEMMs with widened projections, then GEMV decode steps): what the
/// compute-sanitizer runs check.
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_fp8_short_generation() {
    let (cfg, mut w) = load(&synth_dir(Preset::Tiny));
    w.quantize_fp8();
    let kv = KvShape {
        num_blocks: 16,
        block_size: BS,
    };
    let mut gpu = CudaBackend::new(cfg.clone(), &w, kv, 0, CudaOptions::default()).unwrap();
    let mut pool = Pool::new(kv.num_blocks);
    let prompt = tokens(4, 40, cfg.vocab_size);
    let out = generate(&mut gpu, &prompt, &pool.take(40 + 8), 8);
    assert_eq!(out.len(), 8);
    assert!(
        out.iter().all(|&t| (t as usize) < cfg.vocab_size),
        "{out:?}"
    );
}
