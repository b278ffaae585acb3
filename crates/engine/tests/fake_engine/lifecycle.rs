//! How requests end: cancellation, rejections, the queue limit, stop
//! strings, EOS, backend failures, outgrowing the pool, shutdown, async
//! consumers and invalid configs.

use super::*;

#[test]
fn cancelling_half_frees_blocks_and_others_finish_unchanged() {
    let s = start_with(512, 4, cfg(16, 64), |b| {
        b.with_step_delay(Duration::from_micros(200))
    });
    let vocab = s.config.vocab_size;
    let reqs: Vec<_> = (0..8)
        .map(|i| {
            req(
                prompt(10 + i * 9, 100 + i as u32),
                400,
                SamplingParams::greedy(),
            )
        })
        .collect();
    let handles: Vec<_> = reqs
        .iter()
        .map(|r| s.engine.submit(r.clone()).unwrap())
        .collect();
    let outs: Vec<Option<Completion>> = std::thread::scope(|sc| {
        let joins: Vec<_> = handles
            .into_iter()
            .enumerate()
            .map(|(i, mut h)| {
                sc.spawn(move || {
                    if i % 2 == 1 {
                        // read two tokens, then cancel (odd) or drop (i % 4 == 3)
                        for _ in 0..2 {
                            assert!(matches!(h.blocking_next(), Some(Event::Token(_))));
                        }
                        if i % 4 == 3 {
                            drop(h);
                            return None;
                        }
                        h.cancel();
                        let mut last = None;
                        while let Some(ev) = h.blocking_next() {
                            last = Some(ev);
                        }
                        match last {
                            Some(Event::Done(d)) => assert_eq!(d.reason, FinishReason::Cancelled),
                            other => panic!("expected Done(Cancelled), got {other:?}"),
                        }
                        None
                    } else {
                        Some(h.blocking_collect())
                    }
                })
            })
            .collect();
        joins.into_iter().map(|j| j.join().unwrap()).collect()
    });
    for (r, out) in reqs.iter().zip(&outs) {
        if let Some(out) = out {
            let want =
                reference_generate(&r.prompt, vocab, &r.sampling, r.max_tokens, &s.eos, true);
            assert_eq!(out.tokens, want);
        }
    }
    wait_idle(&s.engine);
    assert_eq!(s.engine.stats().kv_blocks_used, 0);
}

#[test]
fn rejections_name_the_numbers_and_leave_others_alone() {
    let s = start(32, 4, cfg(8, 64));
    let vocab = s.config.vocab_size;
    let ctx = s.engine.max_context();
    let good = req(prompt(20, 1), 30, SamplingParams::greedy());
    let h = s.engine.submit(good.clone()).unwrap();
    let huge = format!("max_tokens is {}: {} in all", usize::MAX, usize::MAX);
    let cases: Vec<(GenerateRequest, &str)> = vec![
        (req(vec![], 5, SamplingParams::greedy()), "empty"),
        (req(prompt(ctx, 2), 5, SamplingParams::greedy()), "context"),
        (
            req(prompt(100, 2), ctx, SamplingParams::greedy()),
            "beyond the model's context",
        ),
        (
            req(prompt(129, 2), 5, SamplingParams::greedy()),
            "33 KV blocks of 4; the whole KV pool has 32",
        ),
        (req(prompt(5, 2), 0, SamplingParams::greedy()), "max_tokens"),
        // the one max_tokens check: a client's huge count is refused, and
        // the message's sum saturates
        (
            req(prompt(5, 2), usize::MAX, SamplingParams::greedy()),
            &huge,
        ),
        (
            req(vec![1, vocab as u32], 5, SamplingParams::greedy()),
            "token id 300 at prompt position 1",
        ),
        (
            req(
                prompt(5, 2),
                5,
                SamplingParams {
                    top_p: 0.0,
                    ..SamplingParams::default()
                },
            ),
            "top_p",
        ),
    ];
    for (r, needle) in cases {
        let err = s.engine.submit(r).err().expect("must be rejected");
        assert!(
            err.to_string().contains(needle),
            "`{err}` should mention `{needle}`"
        );
    }
    assert!(matches!(
        s.engine.submit(req(prompt(ctx, 2), 1, SamplingParams::greedy())),
        Err(SubmitError::PromptTooLong { prompt, limit }) if prompt == ctx && limit == ctx
    ));
    let out = h.blocking_collect();
    assert_eq!(
        out.tokens,
        reference_generate(&good.prompt, vocab, &good.sampling, 30, &s.eos, true)
    );
}

#[test]
fn queue_full_is_reported() {
    let mut c = cfg(1, 8);
    c.max_queue = 2;
    let s = start_with(64, 4, c, |b| b.with_step_delay(Duration::from_millis(2)));
    let mut handles = Vec::new();
    let mut full = 0;
    for i in 0..10 {
        match s
            .engine
            .submit(req(prompt(5, i), 50, SamplingParams::greedy()))
        {
            Ok(h) => handles.push(h),
            Err(SubmitError::QueueFull) => full += 1,
            Err(e) => panic!("unexpected {e}"),
        }
    }
    assert!(
        full > 0,
        "10 quick submits into a queue of 2 behind one slot"
    );
    assert!(handles.len() <= 3 + 1);
    for h in handles {
        assert_eq!(h.blocking_collect().reason, FinishReason::Length);
    }
    // the queue drained, so submits work again
    assert!(
        s.engine
            .submit(req(prompt(5, 1), 2, SamplingParams::greedy()))
            .is_ok()
    );
}

#[test]
fn stop_string_spanning_tokens_cuts_the_text() {
    let s = start(256, 4, cfg(8, 64));
    let base = req(prompt(12, 9), 120, SamplingParams::greedy());
    let full = run_all(&s.engine, vec![base.clone()]).remove(0);
    let chars: Vec<char> = full.text.chars().collect();
    // a 3-character stop of plain ASCII, at its first occurrence
    let (at, stop) = (5..chars.len().saturating_sub(3))
        .find_map(|i| {
            let w: String = chars[i..i + 3].iter().collect();
            let byte = chars[..i].iter().map(|c| c.len_utf8()).sum::<usize>();
            (w.chars().all(|c| c.is_ascii_graphic()) && full.text.find(&w) == Some(byte))
                .then_some((byte, w))
        })
        .expect("a plain-ASCII window in the output");
    let mut r = base.clone();
    r.stop = vec!["\u{1}never".into(), stop.clone()];
    let out = run_all(&s.engine, vec![r]).remove(0);
    assert_eq!(out.reason, FinishReason::Stop);
    assert_eq!(out.text, full.text[..at], "stop `{stop}`");
    assert!(out.tokens.len() < full.tokens.len());
    assert_eq!(out.tokens[..], full.tokens[..out.tokens.len()]);
}

#[test]
fn eos_stops_unless_ignored() {
    let s = start(256, 4, cfg(8, 64));
    let vocab = s.config.vocab_size;
    // find a prompt whose greedy continuation hits EOS early
    let (p, want) = (0..5000u32)
        .find_map(|salt| {
            let p = prompt(6, salt);
            let w = reference_generate(&p, vocab, &SamplingParams::greedy(), 40, &s.eos, false);
            (w.len() < 40).then_some((p, w))
        })
        .expect("some prompt reaches EOS");
    let mut r = req(p.clone(), 40, SamplingParams::greedy());
    r.ignore_eos = false;
    let out = run_all(&s.engine, vec![r.clone()]).remove(0);
    assert_eq!(out.reason, FinishReason::Stop);
    assert_eq!(out.tokens, want);
    assert!(s.eos.contains(out.tokens.last().unwrap()));
    assert_eq!(out.usage.completion_tokens, want.len());
    r.ignore_eos = true;
    let out = run_all(&s.engine, vec![r]).remove(0);
    assert_eq!(out.reason, FinishReason::Length);
    assert_eq!(out.tokens.len(), 40);
}

#[test]
fn backend_failure_ends_only_that_step() {
    let s = start_with(128, 4, cfg(8, 64), |b| b.with_fail_on_token(249));
    let out = run_all(
        &s.engine,
        vec![req(vec![3, 249, 5], 5, SamplingParams::greedy())],
    )
    .remove(0);
    assert_eq!(out.reason, FinishReason::Error);
    assert!(out.error.unwrap().contains("injected failure on token 249"));
    let vocab = s.config.vocab_size;
    let p = vec![3, 4, 5];
    let ok = run_all(&s.engine, vec![req(p.clone(), 2, SamplingParams::greedy())]).remove(0);
    assert_eq!(ok.reason, FinishReason::Length);
    assert_eq!(
        ok.tokens,
        reference_generate(&p, vocab, &SamplingParams::greedy(), 2, &s.eos, true)
    );
    wait_idle(&s.engine);
    assert_eq!(s.engine.stats().kv_blocks_used, 0);
}

/// With `halt_on_backend_error` (one replica among several) a failed step
/// fails the whole engine: the request queued beside the faulty one ends
/// with the failure too, later submits are refused naming it, and no block
/// or queued prompt token is left counted.
#[test]
fn halting_engine_fails_everything_and_refuses_more() {
    let halting = EngineConfig {
        halt_on_backend_error: true,
        ..cfg(8, 64)
    };
    let s = start_with(128, 4, halting, |b| {
        b.with_fail_on_token(249)
            .with_step_delay(Duration::from_millis(1))
    });
    // the healthy request runs (40 steps of 1 ms) when the faulty one arrives
    let outs = run_all(
        &s.engine,
        vec![
            req(vec![3, 4, 5], 40, SamplingParams::greedy()),
            req(vec![3, 249, 5], 5, SamplingParams::greedy()),
        ],
    );
    for out in &outs {
        assert_eq!(out.reason, FinishReason::Error);
        let err = out.error.as_deref().unwrap();
        assert!(err.contains("injected failure on token 249"), "{err}");
    }
    let why = s.engine.failure().expect("the engine records its failure");
    assert!(why.contains("injected failure on token 249"), "{why}");
    match s
        .engine
        .submit(req(vec![3, 4], 2, SamplingParams::greedy()))
    {
        Err(SubmitError::EngineFailed(e)) => assert_eq!(e, why),
        Err(e) => panic!("refused for the wrong reason: {e}"),
        Ok(_) => panic!("a failed engine accepted a request"),
    }
    wait_idle(&s.engine);
    let st = s.engine.stats();
    assert_eq!((st.kv_blocks_used, st.queued_prompt_tokens), (0, 0));
}

/// `queued_prompt_tokens` counts a request's prompt from submit until its
/// first admission; a finished request reports how long it queued.
#[test]
fn queued_prompt_tokens_and_queue_time() {
    // one sequence at a time: the second request waits for the first
    let s = start_with(128, 4, cfg(1, 64), |b| {
        b.with_step_delay(Duration::from_millis(1))
    });
    let long = s
        .engine
        .submit(req(vec![3; 8], 30, SamplingParams::greedy()))
        .unwrap();
    let queued = s
        .engine
        .submit(req(vec![4; 12], 2, SamplingParams::greedy()))
        .unwrap();
    assert!(s.engine.stats().queued_prompt_tokens >= 12);
    let first = long.blocking_collect();
    let mut queued = queued;
    let done = loop {
        match queued.blocking_next() {
            Some(Event::Done(f)) => break f,
            Some(Event::Token(_)) => {}
            None => panic!("the stream ended without Done"),
        }
    };
    assert_eq!(first.reason, FinishReason::Length);
    let waited = done.queue_time.expect("admitted, so it has a queue time");
    assert!(waited > Duration::ZERO);
    wait_idle(&s.engine);
    assert_eq!(s.engine.stats().queued_prompt_tokens, 0);
}

/// Non-finite logits (a NaN log-probability
/// from the sampler) end that request with an error naming the cause; the
/// request beside it in the same steps completes, and no block leaks.
#[test]
fn non_finite_logits_end_the_request_with_an_error() {
    let s = start_with(128, 4, cfg(8, 64), |b| b.with_nan_on_token(249));
    let p = vec![3, 4, 5];
    let mut outs = run_all(
        &s.engine,
        vec![
            req(vec![3, 249, 5], 5, SamplingParams::greedy()),
            req(p.clone(), 4, SamplingParams::greedy()),
        ],
    );
    let ok = outs.remove(1);
    let bad = outs.remove(0);
    assert_eq!(bad.reason, FinishReason::Error);
    assert!(bad.error.unwrap().contains("degenerate logits"));
    assert!(bad.tokens.is_empty(), "no token of a NaN step is shown");
    assert_eq!(ok.reason, FinishReason::Length);
    let vocab = s.config.vocab_size;
    assert_eq!(
        ok.tokens,
        reference_generate(&p, vocab, &SamplingParams::greedy(), 4, &s.eos, true)
    );
    wait_idle(&s.engine);
    assert_eq!(s.engine.stats().kv_blocks_used, 0);
}

/// A request that could not finish even alone in the
/// KV pool is refused at submit, naming the pool and the fix, never cut
/// short later as `length`; one that exactly fits runs to its end.
#[test]
fn a_request_the_pool_can_never_hold_is_refused_at_submit() {
    // 4 blocks of 4 = 16 slots; prompt 10 + 30 tokens can never fit
    let s = start(4, 4, cfg(2, 16));
    let e = s
        .engine
        .submit(req(prompt(10, 1), 30, SamplingParams::greedy()))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        e.contains("16 tokens") && e.contains("max_tokens is 30") && e.contains("--kv-memory-gib"),
        "{e}"
    );
    assert_eq!(s.engine.max_sequence(), 16);
    // prompt 10 + 6 fills the pool exactly: it finishes with all 6 tokens
    let out = run_all(
        &s.engine,
        vec![req(prompt(10, 1), 6, SamplingParams::greedy())],
    )
    .remove(0);
    assert_eq!((out.reason, out.tokens.len()), (FinishReason::Length, 6));
    wait_idle(&s.engine);
    assert_eq!(s.engine.stats().kv_blocks_used, 0);
}

#[test]
fn shutdown_cancels_in_flight_and_refuses_new() {
    let s = start_with(256, 4, cfg(8, 64), |b| {
        b.with_step_delay(Duration::from_millis(1))
    });
    let mut h = s
        .engine
        .submit(req(prompt(8, 1), 400, SamplingParams::greedy()))
        .unwrap();
    assert!(matches!(h.blocking_next(), Some(Event::Token(_))));
    s.engine.shutdown();
    let mut last = None;
    while let Some(ev) = h.blocking_next() {
        last = Some(ev);
    }
    assert!(matches!(last, Some(Event::Done(d)) if d.reason == FinishReason::Cancelled));
    assert_eq!(
        s.engine
            .submit(req(prompt(8, 1), 4, SamplingParams::greedy()))
            .err(),
        Some(SubmitError::ShuttingDown)
    );
    s.engine.shutdown();
}

#[test]
fn async_consumers_and_logprobs() {
    let s = start(256, 4, cfg(8, 64));
    let vocab = s.config.vocab_size;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let params = SamplingParams {
        logprobs: 3,
        ..SamplingParams::greedy()
    };
    let p = prompt(9, 4);
    let tokens = rt.block_on(async {
        let mut h = s.engine.submit(req(p.clone(), 6, params.clone())).unwrap();
        let mut toks = Vec::new();
        while let Some(ev) = h.next().await {
            match ev {
                Event::Token(t) => {
                    assert_eq!(t.top_logprobs.len(), 3);
                    toks.push(t.token);
                }
                Event::Done(d) => assert_eq!(d.reason, FinishReason::Length),
            }
        }
        toks
    });
    assert_eq!(
        tokens,
        reference_generate(&p, vocab, &params, 6, &s.eos, true)
    );
}

#[test]
fn invalid_engine_config_is_refused() {
    let config = fake_config().unwrap();
    let tok = Arc::new(fake_tokenizer(&config).unwrap());
    let shape = KvShape {
        num_blocks: 8,
        block_size: 4,
    };
    let err = Engine::start(
        Box::new(FakeBackend::new(config, shape)),
        tok,
        vec![],
        cfg(16, 8),
    )
    .err()
    .unwrap();
    assert!(err.to_string().contains("max_batch_tokens"), "{err}");
}

/// A `Canceller` taken from a handle ends the request from another thread
/// while the handle's owner is blocked waiting on its events.
#[test]
fn a_canceller_ends_a_request_from_another_thread() {
    let s = start_with(512, 4, cfg(4, 64), |b| {
        b.with_step_delay(Duration::from_millis(2))
    });
    let mut h = s
        .engine
        .submit(req(prompt(12, 7), 400, SamplingParams::greedy()))
        .unwrap();
    let canceller = h.canceller();
    assert!(matches!(h.blocking_next(), Some(Event::Token(_))));
    let other = std::thread::spawn(move || canceller.cancel());
    let mut tokens = 1;
    let reason = loop {
        match h.blocking_next() {
            Some(Event::Token(_)) => tokens += 1,
            Some(Event::Done(d)) => break d.reason,
            None => panic!("no Done event"),
        }
    };
    other.join().unwrap();
    assert_eq!(reason, FinishReason::Cancelled);
    assert!(tokens < 400, "cancelled after {tokens} tokens");
    wait_idle(&s.engine);
    assert_eq!(s.engine.stats().kv_blocks_used, 0, "its blocks are freed");
}
