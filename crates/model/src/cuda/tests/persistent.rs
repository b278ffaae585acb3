//! The persistent decode kernel against the per-kernel path it replaces: it
//! runs the same bodies over the same blocks with the same reductions, so
//! every greedy token and its log-probability must come out bit for bit the
//! same, at a short context (one key split) and a long one (split keys and
//! their merge), in bf16 and FP8 weights.

use super::*;

/// Greedy tokens after `prompt` and their log-probabilities' bits, one
/// decode step at a time through `step` (graphs on).
fn decode_bits(b: &mut dyn Backend, prompt: &[u32], blocks: &[u32], n: usize) -> Vec<(u32, u32)> {
    (generate_sampled(b, prompt, blocks, n).into_iter())
        .map(|t| (t.token, t.logprob.to_bits()))
        .collect()
}

fn same_bits_as_per_kernel(preset: Preset, fp8: bool) {
    let (cfg, mut w) = load(&synth_dir(preset));
    if fp8 {
        w.quantize_fp8();
    }
    let kv = KvShape {
        num_blocks: 256,
        block_size: BS,
    };
    let on = CudaOptions {
        persistent_decode: true,
        ..CudaOptions::default()
    };
    let mut layered = CudaBackend::new(cfg.clone(), &w, kv, 0, CudaOptions::default()).unwrap();
    let mut persistent = CudaBackend::new(cfg.clone(), &w, kv, 0, on).unwrap();
    drop(w);
    let mut pool = Pool::new(kv.num_blocks);
    for (len, n) in [(20usize, 24usize), (700, 24)] {
        let prompt = tokens(len as u64, len, cfg.vocab_size);
        let blocks = pool.take(len + n);
        let want = decode_bits(&mut layered, &prompt, &blocks, n);
        let got = decode_bits(&mut persistent, &prompt, &blocks, n);
        assert!(
            persistent.num_persistent_graphs() >= 1,
            "{}: no decode graph ran the persistent kernel",
            preset.name()
        );
        assert_eq!(layered.num_persistent_graphs(), 0);
        assert_eq!(
            got,
            want,
            "{} (fp8 {fp8}), prompt {len}: persistent and per-kernel decode differ",
            preset.name()
        );
        pool.free.extend(blocks);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_persistent_decode_gives_the_per_kernel_bits() {
    // head size 64 with groups of 3 and 4 query heads a KV head
    same_bits_as_per_kernel(Preset::Smollm2_135m, false);
    same_bits_as_per_kernel(Preset::Llama3_2_1b, false);
    same_bits_as_per_kernel(Preset::Smollm2_135m, true);
}

/// A short persistent run (smollm2-135m, 4 decode steps): what the
/// compute-sanitizer runs check.
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_persistent_decode_short() {
    let (cfg, w) = load(&synth_dir(Preset::Smollm2_135m));
    let kv = KvShape {
        num_blocks: 16,
        block_size: BS,
    };
    let on = CudaOptions {
        persistent_decode: true,
        ..CudaOptions::default()
    };
    let mut gpu = CudaBackend::new(cfg.clone(), &w, kv, 0, on).unwrap();
    let mut pool = Pool::new(kv.num_blocks);
    let prompt = tokens(5, 20, cfg.vocab_size);
    let out = decode_bits(&mut gpu, &prompt, &pool.take(20 + 4), 4);
    assert_eq!(gpu.num_persistent_graphs(), 1);
    assert!(
        out.iter().all(|&(t, _)| (t as usize) < cfg.vocab_size),
        "{out:?}"
    );
}
