//! Speculative decoding on the fake: outputs (tokens, text, finish reason,
//! usage, log-probabilities) equal plain decoding's for every drafter,
//! greedy and seeded sampled, batched, preempted and ending on EOS inside
//! an accepted draft; drafts are really verified (the counters move), and
//! a request that opts out drafts nothing. The draft-model drafter runs a
//! second fake as its draft model (its greedy tokens are the target's, so
//! greedy drafts are all accepted and seeded ones mostly rejected): its
//! own KV pool kept in step (the fake fails a step that reads a slot never
//! written), evicting under a small pool; a draft model of another
//! vocabulary or larger than the target is refused naming both.

use super::*;
use engine::speculate::DraftModel;
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
    for method in [SpecMethod::Ngram, SpecMethod::Suffix] {
        for k in [1, 4, 16] {
            let s = start(512, 4, spec_cfg(method.clone(), k, 16, 128));
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
                // ... so each sequence runs fewer forward positions than
                // plain decoding's one per token: an accepted draft is a
                // token without a step of its own. (Counted per sequence,
                // not in engine steps: how many requests share a step
                // varies with timing.) The replayed round alone can save
                // k/(k+1) of its half of the tokens; ask for a fifth of
                // that
                let saved = st.spec_accepted_total * (k as u64 + 1) * 2 * 5;
                assert!(
                    saved > st.generation_tokens_total * k as u64,
                    "{method:?} k={k}: {st:?}"
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

/// A fake draft model of `config` with a pool of `blocks` blocks of 4.
fn fake_draft(config: ModelConfig, blocks: usize) -> SpecMethod {
    let shape = KvShape {
        num_blocks: blocks,
        block_size: 4,
    };
    SpecMethod::Draft(DraftModel::loaded(
        "fake",
        Box::new(FakeBackend::new(config, shape)),
    ))
}

#[test]
fn a_draft_model_drafts_the_plain_outputs() {
    let reqs = mixed_requests();
    let plain = run_all(&start(512, 4, cfg(16, 128)).engine, reqs.clone());
    let config = fake_config().unwrap();
    // a roomy draft pool, and one that holds a few sequences at a time
    for (k, blocks) in [(4, 512), (16, 512), (3, 40)] {
        let method = fake_draft(config.clone(), blocks);
        let s = start(512, 4, spec_cfg(method, k, 16, 128));
        assert_same(&plain, &run_all(&s.engine, reqs.clone()));
        assert_same(&plain, &run_all(&s.engine, reqs.clone()));
        wait_idle(&s.engine);
        let st = s.engine.stats();
        assert_eq!(st.kv_blocks_used, 0, "k={k}");
        // half the requests are greedy: their drafts are the target's tokens
        assert!(
            st.spec_accepted_total * 3 > st.spec_drafted_total,
            "k={k} blocks={blocks}: {st:?}"
        );
    }
}

#[test]
fn a_greedy_draft_of_the_same_model_is_all_accepted() {
    let reqs: Vec<GenerateRequest> = (0..6)
        .map(|i| req(prompt(20 + 9 * i, i as u32), 40, SamplingParams::greedy()))
        .collect();
    let plain = run_all(&start(512, 4, cfg(16, 128)).engine, reqs.clone());
    let method = fake_draft(fake_config().unwrap(), 512);
    let s = start(512, 4, spec_cfg(method, 5, 16, 128));
    assert_same(&plain, &run_all(&s.engine, reqs));
    let st = s.engine.stats();
    assert!(
        st.spec_drafted_total > 0 && st.spec_accepted_total == st.spec_drafted_total,
        "{st:?}"
    );
    // every step drafts (a failed draft step would draft nothing): with 5
    // drafts and the correction per step, 5 of 6 tokens come from drafts
    let tokens = 6 * 40;
    assert!(st.spec_accepted_total * 10 > tokens * 7, "{st:?}");
}

fn start_err(method: SpecMethod) -> String {
    let config = fake_config().unwrap();
    let tok = Arc::new(fake_tokenizer(&config).unwrap());
    let shape = KvShape {
        num_blocks: 16,
        block_size: 4,
    };
    let backend = FakeBackend::new(config, shape);
    Engine::start(
        Box::new(backend),
        tok,
        Vec::new(),
        spec_cfg(method, 4, 4, 64),
    )
    .err()
    .map(|e| e.to_string())
    .unwrap_or_default()
}

#[test]
fn a_mismatched_or_larger_draft_model_is_refused() {
    let target = fake_config().unwrap();
    let other_vocab = ModelConfig {
        vocab_size: target.vocab_size + 8,
        ..target.clone()
    };
    let err = start_err(fake_draft(other_vocab, 16));
    assert!(
        err.contains("speculative.method")
            && err.contains(&format!("{} tokens", target.vocab_size + 8))
            && err.contains(&format!("the target's {}", target.vocab_size)),
        "{err}"
    );
    let deeper = ModelConfig {
        num_layers: target.num_layers + 1,
        ..target.clone()
    };
    let err = start_err(fake_draft(deeper, 16));
    assert!(err.contains("larger than the target"), "{err}");
    // a handle whose backend was never loaded
    let err = start_err(SpecMethod::Draft(DraftModel::named("nothing")));
    assert!(
        err.contains("nothing") && err.contains("not loaded"),
        "{err}"
    );
}

#[test]
fn a_request_with_penalties_drafts_and_matches() {
    let reqs: Vec<GenerateRequest> = mixed_requests()
        .into_iter()
        .map(|r| GenerateRequest {
            sampling: SamplingParams {
                repetition_penalty: 1.3,
                presence_penalty: 0.5,
                frequency_penalty: 0.2,
                ..r.sampling
            },
            ..r
        })
        .collect();
    let plain = run_all(&start(512, 4, cfg(16, 128)).engine, reqs.clone());
    let method = fake_draft(fake_config().unwrap(), 512);
    let s = start(512, 4, spec_cfg(method, 4, 16, 128));
    assert_same(&plain, &run_all(&s.engine, reqs));
    let st = s.engine.stats();
    assert!(st.spec_accepted_total > 0, "{st:?}");
}

/// Constrained requests (regular expressions, greedy and seeded) draft
/// too: with every drafter their outputs are plain decoding's and match
/// their patterns. The fake draft model ignores the grammar, so many of
/// its drafts are refused by it and cut before they run; the greedy ones
/// it keeps are the target's tokens and accepted.
#[test]
fn constrained_requests_draft_and_give_the_plain_outputs() {
    use engine::Constraint;
    // the last allows nearly every token: the draft model's are kept
    let patterns = [
        "[a-e]{4,30}",
        "(ab|cd)+x",
        "[0-9]+(\\.[0-9]+)?",
        "[^\\n]{20,60}",
    ];
    let reqs: Vec<GenerateRequest> = (0..12u32)
        .map(|i| {
            let params = match i % 3 {
                0 => SamplingParams {
                    temperature: 0.9,
                    seed: u64::from(i),
                    ..SamplingParams::default()
                },
                _ => SamplingParams::greedy(),
            };
            let mut r = req(prompt(5 + (i as usize * 7) % 40, 300 + i), 64, params);
            r.constraint = Some(Constraint::Regex(patterns[i as usize % 4].into()));
            r.ignore_eos = false;
            r
        })
        .collect();
    let plain = run_all(&start(512, 4, cfg(16, 128)).engine, reqs.clone());
    for (i, out) in plain.iter().enumerate() {
        let p = patterns[i % 4];
        let re = regex::Regex::new(&format!("^({p})$")).unwrap();
        assert!(
            re.is_match(&out.text),
            "request {i}: {:?} against {p}",
            out.text
        );
    }
    let config = fake_config().unwrap();
    let methods = [
        SpecMethod::Ngram,
        SpecMethod::Suffix,
        fake_draft(config.clone(), 512),
    ];
    for method in methods {
        let name = method.name();
        let s = start(512, 4, spec_cfg(method, 4, 16, 128));
        assert_same(&plain, &run_all(&s.engine, reqs.clone()));
        // alone (one sequence per step)
        for i in [1, 2, 5] {
            let alone = run_all(&s.engine, vec![reqs[i].clone()]);
            assert_same(&plain[i..=i], &alone);
        }
        wait_idle(&s.engine);
        let st = s.engine.stats();
        assert_eq!(st.kv_blocks_used, 0, "{name}");
        if name == "draft" {
            assert!(
                st.spec_verifies_total > 0 && st.spec_accepted_total > 0,
                "{name}: constrained requests drafted nothing: {st:?}"
            );
        }
    }
}

/// Two-sample chi-square statistic of two equal-sized samples of tokens,
/// bins with fewer than 10 draws in all pooled into one, and its degrees of
/// freedom.
fn chi_square(a: &[u32], b: &[u32]) -> (f64, usize) {
    use std::collections::BTreeMap;
    let mut bins: BTreeMap<u32, (f64, f64)> = BTreeMap::new();
    for &t in a {
        bins.entry(t).or_default().0 += 1.0;
    }
    for &t in b {
        bins.entry(t).or_default().1 += 1.0;
    }
    let (mut rest, mut cells) = ((0.0, 0.0), Vec::new());
    for (x, y) in bins.into_values() {
        match x + y < 10.0 {
            true => rest = (rest.0 + x, rest.1 + y),
            false => cells.push((x, y)),
        }
    }
    if rest.0 + rest.1 > 0.0 {
        cells.push(rest);
    }
    let stat = cells.iter().map(|(x, y)| (x - y) * (x - y) / (x + y)).sum();
    (stat, cells.len().saturating_sub(1))
}

/// The chi-square value a statistic of `df` degrees of freedom exceeds
/// with probability 0.001 (Wilson-Hilferty).
fn chi_square_critical(df: usize) -> f64 {
    let (k, z) = (df.max(1) as f64, 3.09);
    let c = 2.0 / (9.0 * k);
    k * (1.0 - c + z * c.sqrt()).powi(3)
}

/// Speculation keeps the sampled distribution, not only seeded draws:
/// at a fixed position the tokens of 800 seeded requests with speculation
/// and of 800 without, on disjoint seeds (so no draw is shared), pass a
/// two-sample chi-square test at p = 0.001, unconstrained and constrained
/// (each verify row masked by its own grammar state), and the verify path
/// really ran.
#[test]
fn seeded_tokens_keep_their_distribution_under_speculation() {
    use engine::Constraint;
    const N: u64 = 800;
    const AT: usize = 4;
    for constrained in [false, true] {
        let make = |seed: u64| {
            let params = SamplingParams {
                temperature: 1.0,
                seed,
                ..SamplingParams::default()
            };
            let mut r = req(prompt(12, 900), AT + 3, params);
            if constrained {
                r.constraint = Some(Constraint::Regex("[a-e]{8,30}".into()));
            }
            r.ignore_eos = true;
            r
        };
        let at =
            |outs: Vec<Completion>| -> Vec<u32> { outs.iter().map(|o| o.tokens[AT]).collect() };
        let plain = at(run_all(
            &start(4096, 4, cfg(64, 512)).engine,
            (N..2 * N).map(make).collect(),
        ));
        let s = start(4096, 4, spec_cfg(SpecMethod::Suffix, 4, 64, 512));
        let spec = at(run_all(&s.engine, (0..N).map(make).collect()));
        let st = s.engine.stats();
        assert!(
            st.spec_accepted_total > 0 && st.spec_verifies_total > 0,
            "constrained {constrained}: {st:?}"
        );
        let (stat, df) = chi_square(&plain, &spec);
        assert!(
            df >= 2,
            "constrained {constrained}: {df} degrees of freedom"
        );
        assert!(
            stat < chi_square_critical(df),
            "constrained {constrained}: chi-square {stat:.1} with {df} degrees of freedom"
        );
    }
}
