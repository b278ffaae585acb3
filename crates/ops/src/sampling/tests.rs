//! The CPU sampler against the documented procedure and straightforward
//! references (penalties, bias, filters, seeded draws, log-probabilities).
use super::*;
use contract::history::PenaltyHistory;
use contract::sampling::SamplingParams;
use std::sync::Arc;

fn req(params: SamplingParams, step: u64) -> SampleRequest {
    SampleRequest {
        params,
        step,
        history: None,
        allowed: None,
    }
}

fn seeded(seed: u64) -> SamplingParams {
    SamplingParams {
        temperature: 1.0,
        seed,
        ..SamplingParams::default()
    }
}

/// A fixed pseudo-random logits vector over a vocabulary of `n`.
fn logits(n: usize, salt: u64) -> Vec<f32> {
    (0..n as u64)
        .map(|i| {
            (contract::sampling::splitmix64(i ^ (salt << 32)) >> 40) as f32 / (1 << 24) as f32 * 8.0
                - 4.0
        })
        .collect()
}

/// Candidates rank by logit, so
/// `top_k = 1` is greedy at any temperature, even where every
/// probability ties in f32 (T = 1e8 here; the API refuses T > 100).
#[test]
fn top_k_one_is_greedy_at_any_temperature() {
    let z = logits(1000, 9);
    let best = argmax(&z);
    assert_ne!(best, 0);
    for t in [0.5f32, 1.0, 100.0, 1e8, 1e10] {
        for step in 0..20 {
            let p = SamplingParams {
                temperature: t,
                top_k: 1,
                seed: 5,
                ..SamplingParams::default()
            };
            assert_eq!(sample(&z, &req(p, step)).token, best, "T = {t}");
        }
    }
    // top_p keeps the best candidate first too
    let p = SamplingParams {
        temperature: 1e8,
        top_p: 1e-6,
        seed: 5,
        ..SamplingParams::default()
    };
    assert_eq!(sample(&z, &req(p, 0)).token, best);
}

#[test]
fn greedy_equals_temperature_zero_and_ties_pick_lowest_id() {
    let z = logits(1000, 1);
    let best = z
        .iter()
        .enumerate()
        .fold((0, f32::MIN), |a, (i, &v)| if v > a.1 { (i, v) } else { a });
    let g = sample(&z, &req(SamplingParams::greedy(), 0));
    assert_eq!(g.token, best.0 as u32);
    let t0 = SamplingParams {
        temperature: 0.0,
        seed: 99,
        top_k: 5,
        ..Default::default()
    };
    assert_eq!(sample(&z, &req(t0, 7)).token, g.token);
    assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
    assert_eq!(argmax(&[f32::NAN, 1.0]), 1);
}

#[test]
fn same_seed_same_result_and_seeds_differ() {
    let z = logits(500, 2);
    let a: Vec<u32> = (0..64)
        .map(|s| sample(&z, &req(seeded(7), s)).token)
        .collect();
    let b: Vec<u32> = (0..64)
        .map(|s| sample(&z, &req(seeded(7), s)).token)
        .collect();
    let c: Vec<u32> = (0..64)
        .map(|s| sample(&z, &req(seeded(8), s)).token)
        .collect();
    assert_eq!(a, b);
    assert_ne!(a, c);
    // a flat-ish distribution: many distinct tokens drawn
    let distinct: std::collections::HashSet<_> = a.iter().collect();
    assert!(distinct.len() > 20, "{}", distinct.len());
}

#[test]
fn top_k_one_and_tiny_top_p_are_greedy() {
    let z = logits(300, 3);
    let g = argmax(&z);
    for step in 0..50 {
        let k1 = SamplingParams {
            top_k: 1,
            ..seeded(step)
        };
        assert_eq!(sample(&z, &req(k1, step)).token, g);
        let p0 = SamplingParams {
            top_p: 1e-6,
            ..seeded(step)
        };
        assert_eq!(sample(&z, &req(p0, step)).token, g);
        let m1 = SamplingParams {
            min_p: 1.0,
            ..seeded(step)
        };
        assert_eq!(sample(&z, &req(m1, step)).token, g);
    }
}

#[test]
fn top_k_and_min_p_restrict_the_support() {
    // probabilities 0.5, 0.25, 0.125, 0.0625, 0.0625
    let z: Vec<f32> = [0.5f32, 0.25, 0.125, 0.0625, 0.0625]
        .iter()
        .map(|p| p.ln())
        .collect();
    let draws = |params: SamplingParams| -> std::collections::BTreeSet<u32> {
        (0..2000)
            .map(|s| sample(&z, &req(params.clone(), s)).token)
            .collect()
    };
    assert_eq!(
        draws(SamplingParams {
            top_k: 2,
            ..seeded(1)
        }),
        [0, 1].into()
    );
    // min_p 0.3: keeps p >= 0.15, i.e. tokens 0 and 1
    assert_eq!(
        draws(SamplingParams {
            min_p: 0.3,
            ..seeded(2)
        }),
        [0, 1].into()
    );
    // top_p 0.8: 0.5 + 0.25 = 0.75 < 0.8, so token 2 is needed too
    assert_eq!(
        draws(SamplingParams {
            top_p: 0.8,
            ..seeded(3)
        }),
        [0, 1, 2].into()
    );
    assert_eq!(draws(seeded(4)), [0, 1, 2, 3, 4].into());
}

#[test]
fn frequencies_follow_the_distribution() {
    let z = [1.0f32, 2.0, 0.5, -1.0, 1.5, 0.0];
    let t = 0.8f32;
    let w: Vec<f64> = z.iter().map(|&v| ((v / t) as f64).exp()).collect();
    let sum: f64 = w.iter().sum();
    let n = 40_000u64;
    let mut counts = [0u64; 6];
    let params = SamplingParams {
        temperature: t,
        seed: 1234,
        ..Default::default()
    };
    for step in 0..n {
        counts[sample(&z, &req(params.clone(), step)).token as usize] += 1;
    }
    for (i, &c) in counts.iter().enumerate() {
        let p = w[i] / sum;
        let freq = c as f64 / n as f64;
        let sd = (p * (1.0 - p) / n as f64).sqrt();
        assert!(
            (freq - p).abs() < 5.0 * sd,
            "token {i}: freq {freq} vs p {p}"
        );
    }
}

#[test]
fn repetition_penalty_divides_positive_and_multiplies_negative() {
    let z = [3.0f32, 2.9, -1.0, -1.1];
    let mut r = req(
        SamplingParams {
            repetition_penalty: 2.0,
            ..SamplingParams::greedy()
        },
        0,
    );
    r.history = Some(Arc::new(PenaltyHistory::from_tokens(&[0, 0, 0, 99])));
    // 3.0 / 2 = 1.5 < 2.9: token 1 wins; a repeated id is penalised once
    assert_eq!(sample(&z, &r).token, 1);
    let h = PenaltyHistory::from_tokens(&[0, 1]);
    r.history = Some(Arc::new(h.clone()));
    assert_eq!(
        apply_repetition_penalty(&z, h.as_slice(), 2.0),
        vec![1.5, 1.45, -1.0, -1.1]
    );
    let two = PenaltyHistory::from_tokens(&[2]);
    assert_eq!(apply_repetition_penalty(&z, two.as_slice(), 2.0)[2], -2.0);
    // the reported logprob is of the raw logits
    let lse = log_sum_exp(&z);
    let s = sample(&z, &r);
    assert!((s.logprob - (z[s.token as usize] - lse)).abs() < 1e-6);
}

/// The straightforward reading of OpenAI's definition: count each
/// generated token, subtract `c * frequency + (c > 0) * presence`, add
/// the bias; the sampler must pick what sampling from these logits picks.
fn reference_penalised(z: &[f32], generated: &[u32], p: &SamplingParams) -> Vec<f32> {
    let mut out = z.to_vec();
    for (id, v) in out.iter_mut().enumerate() {
        let c = generated.iter().filter(|&&t| t as usize == id).count() as f32;
        let pres = if c > 0.0 { p.presence_penalty } else { 0.0 };
        let bias = p
            .logit_bias
            .iter()
            .find(|b| b.0 as usize == id)
            .map_or(0.0, |b| b.1);
        *v = *v - (c * p.frequency_penalty + pres) + bias;
    }
    out
}

#[test]
fn presence_frequency_and_bias_match_the_reference() {
    let z = logits(200, 11);
    let prompt = [3u32, 4, 5];
    let generated: Vec<u32> = (0..40u32)
        .map(|i| (argmax(&z) + (i % 3) * 7) % 200)
        .collect();
    let mut h = PenaltyHistory::from_tokens(&prompt);
    for &t in &generated {
        h.push_generated(t);
    }
    let h = Arc::new(h);
    for (k, (pres, freq)) in [
        (0.0f32, 0.0f32),
        (1.5, 0.0),
        (0.0, 0.7),
        (-1.0, 2.0),
        (2.0, -0.3),
    ]
    .into_iter()
    .enumerate()
    {
        let bias: Vec<(u32, f32)> = vec![(4, 3.5), (17, -2.0), (argmax(&z), -1.0 - k as f32)];
        let mut bias = bias;
        bias.sort_by_key(|b| b.0);
        bias.dedup_by_key(|b| b.0);
        let params = SamplingParams {
            presence_penalty: pres,
            frequency_penalty: freq,
            logit_bias: Arc::from(bias),
            ..seeded(k as u64)
        };
        let want = reference_penalised(&z, &generated, &params);
        let r = SampleRequest {
            params: params.clone(),
            step: 0,
            history: Some(h.clone()),
            allowed: None,
        };
        let got = penalise(&z, &resolve(&r, &mut Vec::new())).unwrap();
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!((a - b).abs() < 1e-5, "token {i}: {a} vs {b}");
        }
        // greedy follows the penalised argmax; sampled draws equal
        // drawing from the reference logits without any penalty
        let g = SampleRequest {
            params: SamplingParams {
                temperature: 0.0,
                ..params.clone()
            },
            step: 0,
            history: Some(h.clone()),
            allowed: None,
        };
        assert_eq!(sample(&z, &g).token, argmax(&want));
        for step in 0..50 {
            let r = SampleRequest {
                params: params.clone(),
                step,
                history: Some(h.clone()),
                allowed: None,
            };
            let plain = SampleRequest {
                params: SamplingParams {
                    presence_penalty: 0.0,
                    frequency_penalty: 0.0,
                    logit_bias: Arc::from(Vec::new()),
                    ..params.clone()
                },
                step,
                history: None,
                allowed: None,
            };
            assert_eq!(sample(&z, &r).token, sample(&want, &plain).token);
        }
    }
}

#[test]
fn logit_bias_bans_and_forces_tokens() {
    let z = logits(300, 12);
    let best = argmax(&z);
    let ban = SamplingParams {
        logit_bias: Arc::from(vec![(best, -100.0)]),
        ..SamplingParams::greedy()
    };
    let s = sample(&z, &req(ban, 0));
    assert_ne!(s.token, best);
    // the reported logprob stays the raw one
    assert!((s.logprob - (z[s.token as usize] - log_sum_exp(&z))).abs() < 1e-6);
    let force = SamplingParams {
        logit_bias: Arc::from(vec![(7, 100.0)]),
        ..seeded(3)
    };
    for step in 0..200 {
        assert_eq!(sample(&z, &req(force.clone(), step)).token, 7);
    }
    // banned tokens never appear in seeded draws
    let banned: Vec<(u32, f32)> = (0..150).map(|i| (i * 2, -100.0)).collect();
    let p = SamplingParams {
        logit_bias: Arc::from(banned),
        ..seeded(4)
    };
    for step in 0..200 {
        assert_eq!(sample(&z, &req(p.clone(), step)).token % 2, 1);
    }
}

#[test]
fn logprobs_are_raw_log_softmax_best_first() {
    let z = [0.0f32, 2.0, 1.0, 2.0, -3.0];
    let params = SamplingParams {
        logprobs: 3,
        ..SamplingParams::greedy()
    };
    let s = sample(&z, &req(params, 0));
    let lse = (z.iter().map(|&v| (v as f64).exp()).sum::<f64>()).ln() as f32;
    assert_eq!(s.token, 1);
    assert!((s.logprob - (2.0 - lse)).abs() < 1e-6);
    let ids: Vec<u32> = s.top_logprobs.iter().map(|p| p.0).collect();
    assert_eq!(ids, vec![1, 3, 2]);
    for (id, lp) in s.top_logprobs {
        assert!((lp - (z[id as usize] - lse)).abs() < 1e-6);
    }
    let total: f32 = z.iter().map(|&v| (v - lse).exp()).sum();
    assert!((total - 1.0).abs() < 1e-6);
    assert!(
        sample(&[], &req(SamplingParams::greedy(), 0))
            .logprob
            .is_infinite()
    );
}

/// The grammar's mask: only allowed tokens are drawn, greedy or
/// seeded, after the bias; the log-probability stays the raw model's.
#[test]
fn the_mask_limits_the_draw_to_allowed_tokens() {
    let z = logits(500, 3);
    let best = argmax(&z);
    let allowed: Vec<u32> = (0..500).filter(|i| i % 7 == 3 && *i != best).collect();
    let mask = Arc::new(contract::TokenMask::from_ids(500, &allowed));
    let lse = log_sum_exp(&z);
    for (params, n) in [(SamplingParams::greedy(), 1u64), (seeded(4), 50)] {
        for step in 0..n {
            let r = SampleRequest {
                allowed: Some(mask.clone()),
                ..req(params.clone(), step)
            };
            let t = sample(&z, &r);
            assert!(mask.allows(t.token), "token {} is forbidden", t.token);
            assert!((t.logprob - (z[t.token as usize] - lse)).abs() < 1e-6);
        }
    }
    // greedy picks the best allowed logit
    let want = allowed
        .iter()
        .copied()
        .max_by(|a, b| z[*a as usize].total_cmp(&z[*b as usize]).then(b.cmp(a)))
        .unwrap();
    let r = SampleRequest {
        allowed: Some(mask.clone()),
        ..req(SamplingParams::greedy(), 0)
    };
    assert_eq!(sample(&z, &r).token, want);
    // a bias cannot lift a forbidden token
    let r = SampleRequest {
        allowed: Some(mask),
        ..req(
            SamplingParams {
                logit_bias: Arc::from(vec![(best, 100.0)]),
                ..SamplingParams::greedy()
            },
            0,
        )
    };
    assert_eq!(sample(&z, &r).token, want);
}

/// [`sample_row`] reads the draw as given: `u = 0` takes the most likely
/// candidate, `u` just under 1 the last one top-k keeps.
#[test]
fn a_row_draws_at_its_u() {
    let z = logits(500, 5);
    let mut order: Vec<u32> = (0..500).collect();
    order.sort_by(|&a, &b| z[b as usize].total_cmp(&z[a as usize]).then(a.cmp(&b)));
    let row = |u| RowSampling {
        temperature: 1.0,
        top_k: 10,
        top_p: 1.0,
        min_p: 0.0,
        repetition_penalty: 1.0,
        history: &[],
        adds: &[],
        allowed: None,
        u,
        logprobs: 0,
    };
    assert_eq!(sample_row(&z, &row(0.0)).token, order[0]);
    assert_eq!(sample_row(&z, &row(0.999_999)).token, order[9]);
}
