//! Outputs under batching, chunked prefill, preemption, prefix caching and
//! overlapped output processing match the reference run alone.

use super::*;

#[test]
fn sixteen_concurrent_prompts_match_the_reference() {
    let s = start(256, 4, cfg(16, 64));
    let vocab = s.config.vocab_size;
    let reqs: Vec<_> = lengths()
        .into_iter()
        .enumerate()
        .map(|(i, n)| req(prompt(n, i as u32), 20 + i * 3, SamplingParams::greedy()))
        .collect();
    let outs = run_all(&s.engine, reqs.clone());
    for (r, out) in reqs.iter().zip(&outs) {
        let want = reference_generate(&r.prompt, vocab, &r.sampling, r.max_tokens, &s.eos, true);
        assert_eq!(out.tokens, want, "prompt of {} tokens", r.prompt.len());
        assert_eq!(out.reason, FinishReason::Length);
        assert_eq!(out.usage.prompt_tokens, r.prompt.len());
        assert_eq!(out.usage.completion_tokens, r.max_tokens);
    }
    // and each alone gives the same
    for r in reqs.iter().take(4) {
        let alone = run_all(&s.engine, vec![r.clone()]);
        let conc = &outs[reqs.iter().position(|x| x == r).unwrap()];
        assert_eq!(alone[0].tokens, conc.tokens);
    }
    wait_idle(&s.engine);
    assert_eq!(s.engine.stats().kv_blocks_used, 0);
    assert!(s.engine.stats().steps_total > 0);
}

#[test]
fn small_pool_preempts_and_still_matches() {
    // 64 blocks of 4 = 256 slots for 16 sequences of up to 150 + 40 tokens
    let s = start(64, 4, cfg(16, 32));
    let vocab = s.config.vocab_size;
    let seeded = SamplingParams {
        temperature: 0.8,
        seed: 7,
        ..SamplingParams::default()
    };
    let reqs: Vec<_> = lengths()
        .into_iter()
        .enumerate()
        .map(|(i, n)| {
            let p = if i % 2 == 0 {
                SamplingParams::greedy()
            } else {
                SamplingParams {
                    seed: i as u64,
                    ..seeded.clone()
                }
            };
            req(prompt(n.min(150), i as u32), 40, p)
        })
        .collect();
    let outs = run_all(&s.engine, reqs.clone());
    for (r, out) in reqs.iter().zip(&outs) {
        let want = reference_generate(&r.prompt, vocab, &r.sampling, r.max_tokens, &s.eos, true);
        assert_eq!(out.tokens, want, "prompt of {} tokens", r.prompt.len());
    }
    wait_idle(&s.engine);
    let st = s.engine.stats();
    assert!(
        st.preemptions_total > 0,
        "the pool should have forced preemption: {st:?}"
    );
    assert_eq!(st.kv_blocks_used, 0);
    assert_eq!(st.kv_blocks_total, 64);
}

#[test]
fn chunked_prefill_with_tiny_budget_matches() {
    // budget 4 tokens per step: long prompts go in many chunks beside decodes
    let s = start(512, 8, cfg(4, 4));
    let vocab = s.config.vocab_size;
    let reqs: Vec<_> = [37usize, 3, 90, 12]
        .into_iter()
        .enumerate()
        .map(|(i, n)| req(prompt(n, 40 + i as u32), 10, SamplingParams::greedy()))
        .collect();
    let outs = run_all(&s.engine, reqs.clone());
    for (r, out) in reqs.iter().zip(&outs) {
        let want = reference_generate(&r.prompt, vocab, &r.sampling, r.max_tokens, &s.eos, true);
        assert_eq!(out.tokens, want);
    }
}

#[test]
fn shared_prefix_reports_cached_tokens_and_same_output() {
    let s = start(256, 4, cfg(8, 64));
    let vocab = s.config.vocab_size;
    let base = prompt(40, 3);
    let first = run_all(
        &s.engine,
        vec![req(base.clone(), 5, SamplingParams::greedy())],
    );
    assert_eq!(first[0].usage.cached_tokens, 0);
    let mut longer = base.clone();
    longer.extend([11, 12, 13, 14, 15]);
    let second = run_all(
        &s.engine,
        vec![req(longer.clone(), 12, SamplingParams::greedy())],
    );
    assert_eq!(
        second[0].usage.cached_tokens, 40,
        "the 10 full blocks of the shared prefix"
    );
    let want = reference_generate(&longer, vocab, &SamplingParams::greedy(), 12, &s.eos, true);
    assert_eq!(second[0].tokens, want);
    // the same prompt again: all but the last token can come from the cache
    let again = run_all(
        &s.engine,
        vec![req(base.clone(), 5, SamplingParams::greedy())],
    );
    assert_eq!(again[0].tokens, first[0].tokens);
    assert!(again[0].usage.cached_tokens >= 36);
    let st = s.engine.stats();
    assert!(st.cached_tokens_total >= 76);
    assert_eq!(st.prompt_tokens_total, 40 + 45 + 40);
}

/// With many sequences the previous step's text is processed while the
/// backend runs the next (overlap path); stop strings, EOS and max_tokens must
/// end every request exactly as when it runs alone (processed in line).
#[test]
fn overlapped_output_processing_matches_alone() {
    let s = start(1024, 4, cfg(32, 256));
    let mut reqs = Vec::new();
    for i in 0..24u32 {
        let mut r = req(
            prompt(5 + (i as usize * 7) % 40, 100 + i),
            30 + i as usize,
            SamplingParams::greedy(),
        );
        r.ignore_eos = i % 3 != 0;
        let full = run_all(&s.engine, vec![r.clone()]).remove(0);
        let chars: Vec<char> = full.text.chars().collect();
        // every other request stops on a plain-ASCII window from the middle of its text
        if i % 2 == 0 {
            let stop = (chars.len() / 3..chars.len().saturating_sub(3)).find_map(|j| {
                let w: String = chars[j..j + 3].iter().collect();
                w.chars().all(|c| c.is_ascii_graphic()).then_some(w)
            });
            if let Some(stop) = stop {
                r.stop = vec![stop];
            }
        }
        reqs.push(r);
    }
    let alone: Vec<Completion> = reqs
        .iter()
        .map(|r| run_all(&s.engine, vec![r.clone()]).remove(0))
        .collect();
    assert!(
        alone.iter().any(|c| c.reason == FinishReason::Stop),
        "some request stops"
    );
    let together = run_all(&s.engine, reqs.clone());
    for (i, (a, t)) in alone.iter().zip(&together).enumerate() {
        assert_eq!(t.tokens, a.tokens, "request {i}");
        assert_eq!(t.text, a.text, "request {i}");
        assert_eq!(t.reason, a.reason, "request {i}");
        assert_eq!(
            t.usage.completion_tokens, a.usage.completion_tokens,
            "request {i}"
        );
        assert_eq!(t.usage.completion_tokens, t.tokens.len(), "request {i}");
    }
    wait_idle(&s.engine);
    assert_eq!(s.engine.stats().kv_blocks_used, 0);
}

/// `n > 1`: choice `i` equals a single request seeded with
/// `choice_seed(seed, i)`, alone or batched with others, prefix cache on or
/// off (the fork shares the prompt blocks either way; the fake reads every
/// context back through the block tables, so a wrong share changes tokens),
/// under preemption too; the prompt is computed once.
#[test]
fn n_choices_equal_single_requests_with_derived_seeds() {
    use contract::sampling::choice_seed;
    for (blocks, cache) in [(256, true), (256, false), (24, false)] {
        let s = start(
            blocks,
            4,
            EngineConfig {
                enable_prefix_cache: cache,
                ..cfg(8, 32)
            },
        );
        let vocab = s.config.vocab_size;
        let params = SamplingParams {
            temperature: 0.9,
            seed: 1234,
            ..SamplingParams::default()
        };
        let r = req(prompt(37, 3), 25, params.clone());
        let handles = s.engine.submit_n(r.clone(), 4).unwrap();
        // other traffic in the same batches
        let other = s
            .engine
            .submit(req(prompt(20, 9), 30, SamplingParams::greedy()))
            .unwrap();
        let outs: Vec<Completion> = std::thread::scope(|sc| {
            let js: Vec<_> = handles
                .into_iter()
                .map(|h| sc.spawn(move || h.blocking_collect()))
                .collect();
            js.into_iter().map(|j| j.join().unwrap()).collect()
        });
        other.blocking_collect();
        let mut distinct = std::collections::HashSet::new();
        for (i, out) in outs.iter().enumerate() {
            let p = SamplingParams {
                seed: choice_seed(1234, i as u64),
                ..params.clone()
            };
            let want = reference_generate(&r.prompt, vocab, &p, 25, &s.eos, true);
            assert_eq!(
                out.tokens, want,
                "choice {i}, blocks {blocks}, cache {cache}"
            );
            assert_eq!(out.usage.prompt_tokens, 37);
            distinct.insert(out.tokens.clone());
            let single = run_all(&s.engine, vec![req(r.prompt.clone(), 25, p)]);
            assert_eq!(single[0].tokens, out.tokens);
        }
        assert_eq!(distinct.len(), 4, "choices differ");
        wait_idle(&s.engine);
        assert_eq!(s.engine.stats().kv_blocks_used, 0);
    }
}

/// `stop_token_ids` ends a request on that id even with `ignore_eos`.
#[test]
fn stop_token_ids_end_the_request() {
    let s = start(256, 4, cfg(8, 64));
    let vocab = s.config.vocab_size;
    let mut r = req(prompt(12, 4), 40, SamplingParams::greedy());
    let full = reference_generate(&r.prompt, vocab, &r.sampling, 40, &s.eos, true);
    let stop_at = 5;
    r.stop_token_ids = vec![full[stop_at]];
    let out = run_all(&s.engine, vec![r.clone()]).remove(0);
    let first = full.iter().position(|&t| t == full[stop_at]).unwrap();
    assert_eq!(out.tokens, full[..=first].to_vec());
    assert_eq!(out.reason, FinishReason::Stop);
    // an id outside the vocabulary is refused, naming the field
    r.stop_token_ids = vec![vocab as u32];
    match s.engine.submit(r) {
        Err(SubmitError::InvalidParams(e)) => assert_eq!(e.param, "stop_token_ids"),
        other => panic!("{:?}", other.map(|h| h.id)),
    }
}

/// Pipelined steps (the next step launched before the last one's samples are
/// read, its tokens carried on the backend) give exactly what unpipelined
/// steps give: EOS, stop strings and `max_tokens` endings, penalties (whose
/// steps land before the next plan), seeds, `n > 1` forks, preemption in a
/// small pool and prefix-cache hits, with every block freed at the end.
#[test]
fn pipelined_steps_equal_unpipelined_steps() {
    let workload = |s: &Setup| {
        let mut reqs = Vec::new();
        for i in 0..20u32 {
            let params = SamplingParams {
                temperature: if i % 3 == 0 { 0.0 } else { 0.8 },
                seed: u64::from(i),
                repetition_penalty: if i % 5 == 0 { 1.2 } else { 1.0 },
                ..SamplingParams::default()
            };
            // a shared prefix for every fourth request
            let mut p = if i % 4 == 0 {
                prompt(24, 1)
            } else {
                Vec::new()
            };
            p.extend(prompt(3 + (i as usize * 11) % 50, 200 + i));
            let mut r = req(p, 8 + (i as usize * 5) % 40, params);
            r.ignore_eos = i % 2 == 0;
            if i % 7 == 3 {
                r.stop = vec!["e".into()];
            }
            reqs.push(r);
        }
        let forked = s
            .engine
            .submit_n(req(prompt(30, 77), 20, SamplingParams::default()), 3)
            .unwrap();
        let mut outs = run_all(&s.engine, reqs);
        outs.extend(forked.into_iter().map(|h| h.blocking_collect()));
        wait_idle(&s.engine);
        assert_eq!(s.engine.stats().kv_blocks_used, 0);
        outs
    };
    for blocks in [48, 1024] {
        let piped = start(blocks, 4, cfg(12, 64));
        let plain = start(
            blocks,
            4,
            EngineConfig {
                async_steps: false,
                ..cfg(12, 64)
            },
        );
        let (a, b) = (workload(&piped), workload(&plain));
        assert!(a.iter().any(|c| c.reason == FinishReason::Stop));
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            assert_eq!(x.tokens, y.tokens, "request {i}, {blocks} blocks");
            assert_eq!(x.text, y.text, "request {i}");
            assert_eq!(x.reason, y.reason, "request {i}");
            // (cached tokens depend on when each request arrived)
            assert_eq!(x.usage.prompt_tokens, y.usage.prompt_tokens, "request {i}");
            assert_eq!(
                x.usage.completion_tokens, y.usage.completion_tokens,
                "request {i}"
            );
        }
        if blocks == 48 {
            assert!(
                piped.engine.stats().preemptions_total > 0,
                "the small pool preempts"
            );
        }
    }
}

/// Constrained requests (the fake samples inside each grammar's mask)
/// batched with unconstrained ones: pipelined, their steps are launched
/// held and released once the step before has landed and the grammars have
/// advanced, and every request's output equals the unpipelined run's; the
/// constrained outputs match their regular expressions.
#[test]
fn held_steps_equal_unpipelined_constrained_steps() {
    use engine::Constraint;
    use std::sync::atomic::Ordering;
    let patterns = ["[a-e]{4,30}", "(ab|cd)+x", "[0-9]+(\\.[0-9]+)?", "yes|no"];
    let workload = |s: &Setup| {
        let mut reqs = Vec::new();
        for i in 0..16u32 {
            let params = SamplingParams {
                temperature: if i % 3 == 0 { 0.0 } else { 0.9 },
                seed: u64::from(i),
                ..SamplingParams::default()
            };
            let mut r = req(
                prompt(5 + (i as usize * 7) % 40, 300 + i),
                12 + i as usize,
                params,
            );
            if i % 2 == 0 {
                let p = patterns[(i as usize / 2) % patterns.len()];
                r.constraint = Some(Constraint::Regex(p.into()));
                r.ignore_eos = false;
            }
            reqs.push(r);
        }
        let outs = run_all(&s.engine, reqs);
        wait_idle(&s.engine);
        assert_eq!(s.engine.stats().kv_blocks_used, 0);
        outs
    };
    let mut held = None;
    let piped = start_with(256, 4, cfg(16, 64), |b| {
        held = Some(b.held_steps());
        b
    });
    let plain = start(
        256,
        4,
        EngineConfig {
            async_steps: false,
            ..cfg(16, 64)
        },
    );
    let (a, b) = (workload(&piped), workload(&plain));
    let held = held.unwrap().load(Ordering::Relaxed);
    assert!(held > 10, "only {held} held steps");
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert_eq!(x.tokens, y.tokens, "request {i}");
        assert_eq!(x.text, y.text, "request {i}");
        assert_eq!(x.reason, y.reason, "request {i}");
        if i % 2 == 0 {
            let p = patterns[(i / 2) % patterns.len()];
            let re = regex::Regex::new(&format!("^({p})$")).unwrap();
            assert_eq!(x.reason, FinishReason::Stop, "request {i}: {:?}", x.text);
            assert!(
                re.is_match(&x.text),
                "request {i}: {:?} against {p}",
                x.text
            );
        }
    }
}
