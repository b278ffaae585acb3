//! Verify rows (speculative decoding, `StepBatch::drafts`) on the GPU: a
//! drafted segment's sampled rows give what plain decoding gives at those
//! positions (greedy tokens equal, or a near tie: the plain token within
//! 0.2 nats of the verify row's best), greedy and seeded, beside an
//! undrafted sequence in the same step; a wrong draft changes no sample
//! before it.

use super::*;
use contract::step_builder::StepBuilder;

fn req(params: &SamplingParams, step: u64) -> Option<SampleRequest> {
    Some(SampleRequest {
        params: params.clone(),
        step,
        history: None,
        allowed: None,
    })
}

/// `n` plain decode steps after `prompt`: each step's sample.
fn plain(
    b: &mut CudaBackend,
    p: &SamplingParams,
    prompt: &[u32],
    blocks: &[u32],
    n: usize,
) -> Vec<SampledToken> {
    let mut sb = StepBuilder::new(BS);
    let (mut run, mut start, mut out) = (prompt.to_vec(), 0, Vec::new());
    for step in 0..n {
        sb.begin();
        sb.push(&run, start, blocks, req(p, step as u64)).unwrap();
        let s = b.step(sb.finish()).unwrap()[0].clone().unwrap();
        start += run.len();
        run = vec![s.token];
        out.push(s);
    }
    out
}

/// Prefills `prompt`, then runs `[first] + drafts` as one drafted segment
/// beside a one-token sequence; returns the drafted sequence's samples.
fn verified(
    b: &mut CudaBackend,
    p: &SamplingParams,
    prompt: &[u32],
    blocks: &[u32],
    other: &[u32],
    drafts: &[u32],
) -> Vec<SampledToken> {
    let mut sb = StepBuilder::new(BS);
    sb.push(prompt, 0, blocks, req(p, 0)).unwrap();
    let first = b.step(sb.finish()).unwrap()[0].clone().unwrap();
    sb.begin();
    sb.push(&[5], 0, other, req(p, 0)).unwrap();
    let run: Vec<u32> = std::iter::once(first.token)
        .chain(drafts.iter().copied())
        .collect();
    sb.push(&run, prompt.len(), blocks, req(p, 1)).unwrap();
    sb.set_drafts(drafts.len());
    let out = b.step(sb.finish()).unwrap();
    assert!(out[0].as_ref().unwrap().draft_rows.is_empty());
    let s = out[1].clone().unwrap();
    assert_eq!(s.draft_rows.len(), drafts.len());
    let mut all = vec![first, s.clone()];
    all[1].draft_rows.clear();
    all.extend(s.draft_rows);
    all
}

/// Greedy: `got` samples `want`'s token, or a near tie with it. Seeded:
/// the rows' distributions agree (their top log-probabilities within
/// 0.2): a verify step of several rows runs the GEMM path and a one-row
/// decode step the GEMVs, and where the logits are flat (random weights) the same
/// draw may then land on another token of the same probability.
fn agrees(want: &SampledToken, got: &SampledToken, what: &str, seeded: bool) {
    if seeded {
        let top = |s: &SampledToken| s.top_logprobs.first().map_or(f32::NAN, |t| t.1);
        assert!(
            (top(want) - top(got)).abs() < 0.2 && got.logprob <= top(got) + 1e-3,
            "{what}: plain {want:?}, verify row {got:?}"
        );
        return;
    }
    if want.token == got.token {
        assert!(
            (want.logprob - got.logprob).abs() < 0.2,
            "{what}: {want:?} vs {got:?}"
        );
        return;
    }
    let near = got
        .top_logprobs
        .iter()
        .any(|&(t, lp)| t == want.token && got.logprob - lp < 0.2);
    assert!(near, "{what}: plain {want:?}, verify row {got:?}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_verify_rows_sample_what_plain_decoding_samples() {
    verify_rows_sample_what_plain_decoding_samples(KvCacheDtype::Bf16);
}

/// The same over an FP8 K/V cache (verify rows write and read e4m3 K/V
/// through the same kernels as plain decoding).
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_verify_rows_with_fp8_kv_sample_what_plain_decoding_samples() {
    verify_rows_sample_what_plain_decoding_samples(KvCacheDtype::Fp8);
}

fn verify_rows_sample_what_plain_decoding_samples(kv_cache_dtype: KvCacheDtype) {
    let (cfg, w) = load(&synth_dir(Preset::Smollm2_135m));
    let vocab = cfg.vocab_size;
    let kv = KvShape {
        num_blocks: 256,
        block_size: BS,
    };
    let opts = CudaOptions {
        kv_cache_dtype,
        ..CudaOptions::default()
    };
    let mut gpu = CudaBackend::new(cfg, &w, kv, 0, opts).unwrap();
    assert_eq!(gpu.max_drafts(), contract::backend::MAX_DRAFTS);
    let mut pool = Pool::new(kv.num_blocks);
    let seeded = SamplingParams {
        temperature: 0.8,
        seed: 5,
        logprobs: 3,
        ..SamplingParams::default()
    };
    let greedy = SamplingParams {
        logprobs: 3,
        ..SamplingParams::greedy()
    };
    for (i, p) in [greedy, seeded].iter().enumerate() {
        let prompt = tokens(3000 + i as u64, 37, vocab);
        let want = plain(&mut gpu, p, &prompt, &pool.take(64), 7);
        let drafts: Vec<u32> = want[1..6].iter().map(|s| s.token).collect();
        let got = verified(&mut gpu, p, &prompt, &pool.take(64), &pool.take(1), &drafts);
        assert_eq!(got.len(), 7);
        for (j, (a, b)) in want.iter().zip(&got).enumerate() {
            agrees(a, b, &format!("params {i}, row {j}"), i == 1);
        }
        // a wrong third draft: the samples up to its row are unchanged
        let mut wrong = drafts.clone();
        wrong[2] = (wrong[2] + 1) % vocab as u32;
        let got2 = verified(&mut gpu, p, &prompt, &pool.take(64), &pool.take(1), &wrong);
        for j in 0..4 {
            assert_eq!(got2[j].token, got[j].token, "params {i}, row {j}");
        }
    }
}
