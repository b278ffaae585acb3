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

/// The sample request of step `step` of a penalised request: its history
/// holds the prompt and the tokens generated before this step.
fn penalised(
    p: &SamplingParams,
    step: u64,
    prompt: &[u32],
    generated: &[u32],
) -> Option<SampleRequest> {
    let mut h = contract::history::PenaltyHistory::from_tokens(prompt);
    for &t in generated {
        h.push_generated(t);
    }
    Some(SampleRequest {
        params: p.clone(),
        step,
        history: Some(std::sync::Arc::new(h)),
        allowed: None,
    })
}

/// A drafted sequence with penalties beside another sequence's prefill
/// chunk (a mixed step: the drafted rows run as one-token sequences, each
/// with its own history): its rows sample what plain penalised decoding
/// samples, and the chunk's sample is the one it gets alone.
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_penalised_drafts_beside_a_prefill_chunk_sample_what_plain_decoding_samples() {
    let (cfg, w) = load(&synth_dir(Preset::Smollm2_135m));
    let vocab = cfg.vocab_size;
    let kv = KvShape {
        num_blocks: 256,
        block_size: BS,
    };
    let mut gpu = CudaBackend::new(cfg, &w, kv, 0, CudaOptions::default()).unwrap();
    let mut pool = Pool::new(kv.num_blocks);
    let p = SamplingParams {
        logprobs: 5,
        repetition_penalty: 1.3,
        frequency_penalty: 0.5,
        ..SamplingParams::greedy()
    };
    let prompt = tokens(3100, 29, vocab);
    let chunk = tokens(3200, 40, vocab);
    // plain penalised decoding, and the chunk's first sample alone
    let (blocks, mut sb) = (pool.take(64), StepBuilder::new(BS));
    let (mut run, mut start, mut want) = (prompt.clone(), 0, Vec::<SampledToken>::new());
    for step in 0..6 {
        let done: Vec<u32> = want.iter().map(|s| s.token).collect();
        sb.begin();
        sb.push(&run, start, &blocks, penalised(&p, step, &prompt, &done))
            .unwrap();
        let s = gen_one(&mut gpu, &mut sb);
        start += run.len();
        run = vec![s.token];
        want.push(s);
    }
    let chunk_blocks = pool.take(64);
    sb.begin();
    sb.push(&chunk, 0, &chunk_blocks, penalised(&p, 0, &chunk, &[]))
        .unwrap();
    let chunk_alone = gen_one(&mut gpu, &mut sb);
    // the same request drafted beside the chunk (on fresh blocks)
    let blocks = pool.take(64);
    sb.begin();
    sb.push(&prompt, 0, &blocks, penalised(&p, 0, &prompt, &[]))
        .unwrap();
    let first = gen_one(&mut gpu, &mut sb);
    assert_eq!(first.token, want[0].token);
    let drafts: Vec<u32> = want[1..5].iter().map(|s| s.token).collect();
    let run: Vec<u32> = std::iter::once(first.token)
        .chain(drafts.iter().copied())
        .collect();
    sb.begin();
    sb.push(&chunk, 0, &pool.take(64), penalised(&p, 0, &chunk, &[]))
        .unwrap();
    sb.push(
        &run,
        prompt.len(),
        &blocks,
        penalised(&p, 1, &prompt, &[first.token]),
    )
    .unwrap();
    sb.set_drafts(drafts.len());
    let out = gpu.step(sb.finish()).unwrap();
    let c = out[0].clone().unwrap();
    ranks(&chunk_alone, &c, "the chunk");
    let s = out[1].clone().unwrap();
    assert_eq!(s.draft_rows.len(), drafts.len());
    let mut got = vec![s.clone()];
    got[0].draft_rows.clear();
    got.extend(s.draft_rows);
    for (j, (a, b)) in want[1..].iter().zip(&got).enumerate() {
        ranks(a, b, &format!("row {j}"));
    }
}

/// Penalised greedy rows: `got` samples `want`'s token or ranks it among
/// its top log-probabilities. (A near tie of the penalised logits is not
/// one of the raw log-probabilities the rows report, so [`agrees`]'s 0.2
/// nats cannot judge it; a row given another history, or none, ranks the
/// plain token anywhere.)
fn ranks(want: &SampledToken, got: &SampledToken, what: &str) {
    let listed = got.top_logprobs.iter().any(|&(t, _)| t == want.token);
    assert!(
        want.token == got.token || listed,
        "{what}: plain {want:?}, verify row {got:?}"
    );
}

fn gen_one(b: &mut CudaBackend, sb: &mut StepBuilder) -> SampledToken {
    b.step(sb.finish()).unwrap()[0].clone().unwrap()
}

/// Every other token of the vocabulary, by a hash of `seed`.
fn half_mask(vocab: usize, seed: u64) -> std::sync::Arc<contract::TokenMask> {
    let ids: Vec<u32> = (0..vocab as u32)
        .filter(|&i| (u64::from(i) ^ seed).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 63 == 0)
        .collect();
    std::sync::Arc::new(contract::TokenMask::from_ids(vocab, &ids))
}

/// Constrained speculation: a drafted sequence's verify rows, each masked
/// by its own grammar state (`StepBatch::draft_masks`), beside an
/// unconstrained sequence, sample what plain masked decoding samples, and
/// only tokens their masks allow.
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_masked_verify_rows_sample_what_plain_masked_decoding_samples() {
    let (cfg, w) = load(&synth_dir(Preset::Smollm2_135m));
    let vocab = cfg.vocab_size;
    let kv = KvShape {
        num_blocks: 256,
        block_size: BS,
    };
    let mut gpu = CudaBackend::new(cfg, &w, kv, 0, CudaOptions::default()).unwrap();
    assert!(contract::Backend::verifies_masks(&gpu));
    let mut pool = Pool::new(kv.num_blocks);
    let p = SamplingParams {
        logprobs: 3,
        ..SamplingParams::greedy()
    };
    let masks: Vec<_> = (0..6).map(|i| half_mask(vocab, 77 + i)).collect();
    let masked = |step: usize| {
        let mut r = req(&p, step as u64);
        if let Some(r) = r.as_mut() {
            r.allowed = Some(masks[step].clone());
        }
        r
    };
    let prompt = tokens(3300, 31, vocab);
    let (blocks, mut sb) = (pool.take(64), StepBuilder::new(BS));
    let (mut run, mut start, mut want) = (prompt.clone(), 0, Vec::<SampledToken>::new());
    for (step, mask) in masks.iter().enumerate() {
        sb.begin();
        sb.push(&run, start, &blocks, masked(step)).unwrap();
        let s = gen_one(&mut gpu, &mut sb);
        assert!(mask.allows(s.token), "plain step {step}");
        start += run.len();
        run = vec![s.token];
        want.push(s);
    }
    let blocks = pool.take(64);
    sb.begin();
    sb.push(&prompt, 0, &blocks, masked(0)).unwrap();
    let first = gen_one(&mut gpu, &mut sb);
    assert_eq!(first.token, want[0].token);
    let drafts: Vec<u32> = want[1..5].iter().map(|s| s.token).collect();
    let run: Vec<u32> = std::iter::once(first.token)
        .chain(drafts.iter().copied())
        .collect();
    sb.begin();
    sb.push(&[5], 0, &pool.take(1), req(&p, 0)).unwrap();
    sb.push(&run, prompt.len(), &blocks, masked(1)).unwrap();
    sb.set_drafts(drafts.len());
    sb.set_draft_masks(masks[2..6].to_vec());
    let out = gpu.step(sb.finish()).unwrap();
    let s = out[1].clone().unwrap();
    assert_eq!(s.draft_rows.len(), drafts.len());
    let mut got = vec![s.clone()];
    got[0].draft_rows.clear();
    got.extend(s.draft_rows);
    for (j, (a, b)) in want[1..].iter().zip(&got).enumerate() {
        assert!(
            masks[1 + j].allows(b.token),
            "verify row {j}: a token its mask forbids"
        );
        agrees(a, b, &format!("row {j}"), false);
    }
}
