//! Verify rows (speculative decoding, `StepBatch::drafts`) on both CPU
//! paths: each sampled row of a drafted segment samples exactly what plain
//! decoding samples at that position (greedy and seeded), whatever the
//! drafts after it, and the sampled rows come back in order; with a
//! penalty history too (each row's history counting the drafts before it),
//! and with a grammar mask per row (`StepBatch::draft_masks`).

use super::batch::contiguous_blocks;
use super::tests::{BS, backend_on};
use super::*;
use contract::Backend;
use contract::PenaltyHistory;
use contract::backend::SampleRequest;
use contract::sampling::SamplingParams;
use contract::step_builder::StepBuilder;

const PROMPT: [u32; 7] = [3, 17, 5, 42, 8, 8, 21];
const BLOCKS: usize = 16;

fn req(params: &SamplingParams, step: u64, history: &[u32]) -> Option<SampleRequest> {
    // the prompt seen, the tokens after it generated
    let history = params.needs_history().then(|| {
        let mut h = PenaltyHistory::from_tokens(&PROMPT);
        for &t in history {
            h.push_generated(t);
        }
        std::sync::Arc::new(h)
    });
    Some(SampleRequest {
        params: params.clone(),
        step,
        history,
        allowed: None,
    })
}

/// `n` tokens after `PROMPT`, one plain decode step each.
fn plain(path: CpuPath, params: &SamplingParams, n: usize) -> Vec<u32> {
    let mut b = backend_on(path, true, BLOCKS);
    let table = contiguous_blocks(0, PROMPT.len() + n + 1, BS);
    let mut sb = StepBuilder::new(BS);
    let (mut run, mut start, mut out) = (PROMPT.to_vec(), 0, Vec::new());
    for step in 0..n {
        sb.begin();
        sb.push(&run, start, &table, req(params, step as u64, &out))
            .unwrap();
        sb.set_prompt_len(PROMPT.len());
        let s = b.step(sb.finish()).unwrap()[0].clone().unwrap();
        assert!(s.draft_rows.is_empty());
        start += run.len();
        run = vec![s.token];
        out.push(s.token);
    }
    out
}

/// Prefills `PROMPT` (sampling token 0), then runs `[token 0] + drafts` as
/// one segment with the drafts marked; returns every sampled row's token.
fn verified(path: CpuPath, params: &SamplingParams, first: u32, drafts: &[u32]) -> Vec<u32> {
    let mut b = backend_on(path, true, BLOCKS);
    let table = contiguous_blocks(0, PROMPT.len() + drafts.len() + 1, BS);
    let mut sb = StepBuilder::new(BS);
    sb.push(&PROMPT, 0, &table, req(params, 0, &[])).unwrap();
    sb.set_prompt_len(PROMPT.len());
    assert_eq!(
        b.step(sb.finish()).unwrap()[0].as_ref().unwrap().token,
        first
    );
    // a second sequence beside it, undrafted, in the same step
    let other = contiguous_blocks(10, 3, BS);
    sb.begin();
    sb.push(&[first, 9, 9], 0, &other, req(params, 0, &[]))
        .unwrap();
    let run: Vec<u32> = std::iter::once(first)
        .chain(drafts.iter().copied())
        .collect();
    sb.push(&run, PROMPT.len(), &table, req(params, 1, &[first]))
        .unwrap();
    sb.set_prompt_len(PROMPT.len());
    sb.set_drafts(drafts.len());
    let out = b.step(sb.finish()).unwrap();
    assert!(out[0].as_ref().unwrap().draft_rows.is_empty());
    let s = out[1].clone().unwrap();
    assert_eq!(s.draft_rows.len(), drafts.len());
    std::iter::once(s.token)
        .chain(s.draft_rows.iter().map(|r| r.token))
        .collect()
}

#[test]
fn verify_rows_sample_what_plain_decoding_samples() {
    let seeded = SamplingParams {
        temperature: 1.3,
        seed: 11,
        ..SamplingParams::default()
    };
    let penalised = SamplingParams {
        repetition_penalty: 1.5,
        presence_penalty: 0.7,
        frequency_penalty: 0.9,
        ..seeded.clone()
    };
    let greedy_penalised = SamplingParams {
        temperature: 0.0,
        ..penalised.clone()
    };
    for path in [CpuPath::Reference, CpuPath::Fast] {
        for params in [
            SamplingParams::greedy(),
            seeded.clone(),
            penalised.clone(),
            greedy_penalised.clone(),
        ] {
            let want = plain(path, &params, 6);
            // right drafts: every row samples the next plain token
            let got = verified(path, &params, want[0], &want[1..5]);
            assert_eq!(got, want[1..6], "{path:?} {params:?}");
            // a wrong draft: the rows before it and its own sample agree
            let wrong = (want[2] + 1) % 50;
            let got = verified(path, &params, want[0], &[want[1], wrong, want[3]]);
            assert_eq!(got[..2], want[1..3], "{path:?} {params:?}");
        }
    }
}

/// The mask of generated token `step`: a different third of the
/// vocabulary left out at each position.
fn mask_at(step: usize) -> std::sync::Arc<contract::TokenMask> {
    let ids: Vec<u32> = (0..50)
        .filter(|t| !(*t as usize + step).is_multiple_of(3))
        .collect();
    std::sync::Arc::new(contract::TokenMask::from_ids(50, &ids))
}

/// Each verify row takes its own mask: a drafted segment under masks
/// samples what masked plain decoding samples, position by position.
#[test]
fn verify_rows_follow_their_grammar_masks() {
    let masked = |params: &SamplingParams, step: usize, history: &[u32]| {
        let mut r = req(params, step as u64, history);
        if let Some(r) = r.as_mut() {
            r.allowed = Some(mask_at(step));
        }
        r
    };
    for path in [CpuPath::Reference, CpuPath::Fast] {
        let params = SamplingParams::greedy();
        let mut b = backend_on(path, true, BLOCKS);
        let table = contiguous_blocks(0, PROMPT.len() + 8, BS);
        let mut sb = StepBuilder::new(BS);
        let (mut run, mut start, mut want) = (PROMPT.to_vec(), 0, Vec::new());
        for step in 0..6 {
            sb.begin();
            sb.push(&run, start, &table, masked(&params, step, &want))
                .unwrap();
            sb.set_prompt_len(PROMPT.len());
            let t = b.step(sb.finish()).unwrap()[0].clone().unwrap().token;
            assert!(mask_at(step).allows(t));
            start += run.len();
            run = vec![t];
            want.push(t);
        }
        let unmasked = plain(path, &params, 6);
        assert_ne!(unmasked, want, "{path:?}: the masks change the tokens");
        // a fresh backend: the prompt, then token 0 and four drafts
        let mut b = backend_on(path, true, BLOCKS);
        sb.begin();
        sb.push(&PROMPT, 0, &table, masked(&params, 0, &[]))
            .unwrap();
        sb.set_prompt_len(PROMPT.len());
        assert_eq!(
            b.step(sb.finish()).unwrap()[0].as_ref().unwrap().token,
            want[0]
        );
        sb.begin();
        sb.push(
            &want[..5],
            PROMPT.len(),
            &table,
            masked(&params, 1, &want[..1]),
        )
        .unwrap();
        sb.set_prompt_len(PROMPT.len());
        sb.set_drafts(4);
        sb.set_draft_masks((2..6).map(mask_at).collect());
        let s = b.step(sb.finish()).unwrap()[0].clone().unwrap();
        let got: Vec<u32> = std::iter::once(s.token)
            .chain(s.draft_rows.iter().map(|r| r.token))
            .collect();
        assert_eq!(got, want[1..6], "{path:?}");
    }
}
