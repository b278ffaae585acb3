//! Speculative decoding on the fake: outputs (tokens, text, finish reason,
//! usage, log-probabilities) equal plain decoding's for every drafter,
//! greedy and seeded sampled, batched, preempted and ending on EOS inside
//! an accepted draft; drafts are really verified (the counters move), and
//! a request that opts out drafts nothing.

use super::*;
use engine::{SpecConfig, SpecMethod};

fn spec_cfg(method: SpecMethod, k: usize, seqs: usize, budget: usize) -> EngineConfig {
    EngineConfig {
        speculative: Some(SpecConfig {
            method,
            num_tokens: k,
            max_batch: 64,
        }),
        ..cfg(seqs, budget)
    }
}

/// Greedy and seeded requests over the usual lengths, EOS honoured.
fn mixed_requests() -> Vec<GenerateRequest> {
    lengths()
        .into_iter()
        .enumerate()
        .map(|(i, n)| {
            let p = match i % 2 {
                0 => SamplingParams::greedy(),
                _ => SamplingParams {
                    temperature: 0.9,
                    seed: i as u64,
                    logprobs: 2,
                    ..SamplingParams::default()
                },
            };
            GenerateRequest {
                ignore_eos: i % 3 != 0,
                ..req(prompt(n.min(120), i as u32), 30 + i, p)
            }
        })
        .collect()
}

fn assert_same(plain: &[Completion], spec: &[Completion]) {
    for (i, (a, b)) in plain.iter().zip(spec).enumerate() {
        assert_eq!(
            a.tokens, b.tokens,
            "request {i}: {:?} {:?}",
            b.reason, b.error
        );
        assert_eq!(a.text, b.text, "request {i}");
        assert_eq!(a.reason, b.reason, "request {i}");
        // (the second round finds prompts in the prefix cache)
        assert_eq!(a.usage.prompt_tokens, b.usage.prompt_tokens, "request {i}");
        assert_eq!(
            a.usage.completion_tokens, b.usage.completion_tokens,
            "request {i}"
        );
        assert_eq!(a.logprobs, b.logprobs, "request {i}");
    }
}

#[test]
fn every_drafter_gives_the_plain_outputs() {
    let reqs = mixed_requests();
    let p = start(512, 4, cfg(16, 128));
    let plain = run_all(&p.engine, reqs.clone());
    run_all(&p.engine, reqs.clone());
    wait_idle(&p.engine);
    let plain_steps = p.engine.stats().steps_total;
    for method in [SpecMethod::Ngram, SpecMethod::Suffix] {
        for k in [1, 4, 16] {
            let s = start(512, 4, spec_cfg(method, k, 16, 128));
            // twice: the second round's drafts come from the first's outputs
            // (suffix), all accepted where the request is the same
            assert_same(&plain, &run_all(&s.engine, reqs.clone()));
            assert_same(&plain, &run_all(&s.engine, reqs.clone()));
            wait_idle(&s.engine);
            let st = s.engine.stats();
            assert_eq!(st.kv_blocks_used, 0, "{method:?} k={k}");
            // (the fake's hashed tokens rarely repeat an n-gram: n-gram
            // drafts are tested on real text, `tests/speculative_e2e.rs`)
            if method == SpecMethod::Suffix {
                assert!(st.spec_verifies_total > 0, "{method:?} k={k}: {st:?}");
                // the replayed round accepts nearly every draft
                assert!(
                    st.spec_accepted_total * 2 > st.spec_drafted_total,
                    "{method:?} k={k}: {st:?}"
                );
                // ... so the two rounds take fewer steps than plain decoding's
                assert!(
                    st.steps_total * 10 < plain_steps * 9,
                    "{method:?} k={k}: {st:?}, plain {plain_steps} steps"
                );
            }
        }
    }
}

#[test]
fn a_small_pool_preempts_speculating_sequences_and_still_matches() {
    let reqs = mixed_requests();
    let plain = run_all(&start(512, 4, cfg(16, 32)).engine, reqs.clone());
    let s = start(64, 4, spec_cfg(SpecMethod::Suffix, 8, 16, 32));
    assert_same(&plain, &run_all(&s.engine, reqs.clone()));
    assert_same(&plain, &run_all(&s.engine, reqs.clone()));
    wait_idle(&s.engine);
    let st = s.engine.stats();
    assert!(st.preemptions_total > 0, "{st:?}");
    assert!(st.spec_accepted_total > 0, "{st:?}");
    assert_eq!(st.kv_blocks_used, 0);
}

#[test]
fn a_request_can_opt_out() {
    let s = start(512, 4, spec_cfg(SpecMethod::Suffix, 4, 16, 128));
    let reqs: Vec<GenerateRequest> = mixed_requests()
        .into_iter()
        .map(|r| GenerateRequest {
            speculative: false,
            ..r
        })
        .collect();
    run_all(&s.engine, reqs.clone());
    run_all(&s.engine, reqs);
    wait_idle(&s.engine);
    assert_eq!(s.engine.stats().spec_verifies_total, 0);
}

#[test]
fn a_bad_draft_length_is_refused_naming_it() {
    let config = fake_config().unwrap();
    let tok = Arc::new(fake_tokenizer(&config).unwrap());
    let backend = FakeBackend::new(
        config.clone(),
        KvShape {
            num_blocks: 16,
            block_size: 4,
        },
    );
    let err = Engine::start(
        Box::new(backend),
        tok,
        Vec::new(),
        spec_cfg(SpecMethod::Ngram, 17, 4, 64),
    )
    .err()
    .map(|e| e.to_string())
    .unwrap_or_default();
    assert!(err.contains("speculative.num_tokens"), "{err}");
}
