//! The warm-up runs every step shape of its plan before the first request,
//! then leaves no trace: no cached prefix, zero counters, the same outputs.

use std::collections::BTreeSet;

use super::*;

/// A step's bucket: its token count and sequence count rounded up to
/// powers of two, and whether it is pure decode (as many tokens as
/// sequences) or carries a prefill.
fn bucket(&(tokens, seqs): &(usize, usize)) -> (usize, usize, bool) {
    (
        tokens.next_power_of_two(),
        seqs.next_power_of_two(),
        tokens == seqs,
    )
}

#[test]
fn warm_up_runs_every_shape_then_leaves_no_trace() {
    let mut log = None;
    // (a step takes a while, as on a real device: a batch's requests are
    // all queued before its first step ends)
    let s = start_with(512, 16, cfg(8, 64), |b| {
        log = Some(b.step_shapes());
        b.with_step_delay(Duration::from_millis(2))
    });
    let log = log.unwrap();
    let vocab = s.config.vocab_size;

    let plan = s.engine.warmup_plan();
    assert_eq!(plan.prefills, [1, 2, 4, 8, 16, 32, 64]);
    assert_eq!(plan.decode_batches, [1, 2, 4, 8]);
    let report = s.engine.warm_up(Duration::from_secs(60)).unwrap();
    assert_eq!((report.warmed, report.planned), (11, 11), "{report}");
    let warmed: BTreeSet<_> = log.lock().unwrap().iter().map(bucket).collect();
    // every prefill bucket alone, every decode batch bucket alone
    for l in plan.prefills.iter() {
        assert!(
            warmed.contains(&(l.next_power_of_two(), 1, *l == 1)),
            "prefill {l}: {warmed:?}"
        );
    }
    for b in plan.decode_batches.iter() {
        assert!(
            warmed.contains(&(*b, *b, true)),
            "decode batch {b}: {warmed:?}"
        );
    }
    // nothing remembered: counters zero, no block cached or used
    wait_idle(&s.engine);
    let st = s.engine.stats();
    assert_eq!(
        (
            st.prompt_tokens_total,
            st.generation_tokens_total,
            st.steps_total,
            st.kv_blocks_used
        ),
        (0, 0, 0, 0),
        "{st:?}"
    );

    // real requests: their shapes were all warmed, and outputs are the reference's
    log.lock().unwrap().clear();
    let reqs: Vec<_> = [5usize, 30, 64]
        .iter()
        .enumerate()
        .map(|(i, &n)| req(prompt(n, i as u32), 6, SamplingParams::greedy()))
        .collect();
    for r in &reqs {
        let out = run_all(&s.engine, vec![r.clone()]);
        let want = reference_generate(&r.prompt, vocab, &r.sampling, r.max_tokens, &s.eos, true);
        assert_eq!(out[0].tokens, want);
        assert_eq!(out[0].usage.cached_tokens, 0, "no warm-up block is matched");
    }
    let outs = run_all(&s.engine, reqs.clone());
    for (r, out) in reqs.iter().zip(&outs) {
        let want = reference_generate(&r.prompt, vocab, &r.sampling, r.max_tokens, &s.eos, true);
        assert_eq!(out.tokens, want);
    }
    for shape in log.lock().unwrap().iter() {
        let b = bucket(shape);
        // (a step mixing prefill chunks and decodes is not a bucket of its own)
        if b.2 || b.1 == 1 {
            assert!(warmed.contains(&b), "{shape:?} was not warmed: {warmed:?}");
        }
    }

    // a budget already spent warms nothing and still forgets
    let r = s.engine.warm_up(Duration::ZERO).unwrap();
    assert_eq!(r.warmed, 0);
}
