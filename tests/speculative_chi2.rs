//! Speculative decoding keeps the sampled distribution: on the synthetic
//! `tiny` model (CPU), thousands of seeded requests at temperature 1 with
//! speculation (suffix drafts, and the model drafting for itself) and
//! without, on disjoint seeds; the token at a fixed generated position has
//! the same distribution both ways: a two-sample chi-square statistic
//! below the 0.001 critical value for its degrees of freedom. The same
//! statistic against a run at another temperature lies far above it (the
//! test can tell distributions apart). A logit bias makes a few tokens
//! likely, so suffix drafts are often accepted and the position is often
//! sampled by a verify row behind accepted drafts (the counters say so).
//!
//! Costs: the tiny model (hidden 64, 3 layers); 4 x 3,000 requests of 5
//! tokens: a few seconds on 2 cores in release.

use std::path::Path;
use std::sync::Arc;

use contract::{KvShape, SamplingParams};
use engine::speculate::DraftModel;
use engine::{Engine, EngineConfig, GenerateRequest, SpecConfig, SpecMethod};
use tokenizer::Tokenizer;

/// Requests per run.
const N: u64 = 3000;
/// The generated position whose token is counted.
const AT: usize = 3;
const PROMPT: [u32; 6] = [65, 66, 67, 32, 68, 69];

/// The tiny synthetic model, written once per test binary.
fn model_dir() -> &'static Path {
    lamina_tests::tiny_model(9)
}

fn backend() -> (model::cpu::CpuBackend, checkpoint::loader::LoadedModel) {
    let dir = model_dir();
    let loaded = checkpoint::loader::load_config(dir).expect("config");
    let weights = checkpoint::loader::load_weights(dir, &loaded.config).expect("weights");
    let kv = KvShape {
        num_blocks: 256,
        block_size: 16,
    };
    let b = model::cpu::CpuBackend::new(loaded.config.clone(), weights, kv).expect("cpu backend");
    (b, loaded)
}

fn start(method: Option<SpecMethod>) -> Engine {
    let (b, loaded) = backend();
    let tok = Arc::new(Tokenizer::from_dir(model_dir()).expect("tokenizer"));
    Engine::start(
        Box::new(b),
        tok,
        loaded.eos_ids.clone(),
        EngineConfig {
            max_num_seqs: 64,
            max_batch_tokens: 1024,
            speculative: method.map(|method| SpecConfig {
                method,
                num_tokens: 4,
                max_batch: 64,
            }),
            ..EngineConfig::default()
        },
    )
    .expect("engine")
}

/// Counts of the token at generated position [`AT`] over seeds `seeds`.
fn counts(e: &Engine, seeds: std::ops::Range<u64>, temperature: f32) -> Vec<u64> {
    let vocab = 300;
    let reqs: Vec<GenerateRequest> = seeds
        .map(|seed| GenerateRequest {
            prompt: PROMPT.to_vec(),
            sampling: SamplingParams {
                temperature,
                top_p: 1.0,
                top_k: 0,
                min_p: 0.0,
                seed,
                // a few likely tokens: drafts are often right
                logit_bias: vec![(40, 6.0), (41, 5.0), (42, 3.5), (43, 3.0)].into(),
                ..SamplingParams::default()
            },
            max_tokens: AT + 2,
            stop: Vec::new(),
            ignore_eos: true,
            stop_token_ids: Vec::new(),
            constraint: None,
            speculative: true,
            lora: None,
        })
        .collect();
    let mut c = vec![0; vocab];
    for chunk in reqs.chunks(500) {
        for done in lamina_tests::run_all(e, chunk) {
            assert_eq!(done.error, None);
            c[done.tokens[AT] as usize] += 1;
        }
    }
    c
}

/// Two-sample chi-square statistic of equal-size samples `a`, `b` and its
/// degrees of freedom; cells with fewer than 10 draws in all are pooled.
fn chi2(a: &[u64], b: &[u64]) -> (f64, usize) {
    let (mut stat, mut cells) = (0.0, 0);
    let (mut pa, mut pb) = (0u64, 0u64);
    for (&x, &y) in a.iter().zip(b) {
        if x + y < 10 {
            (pa, pb) = (pa + x, pb + y);
            continue;
        }
        stat += (x as f64 - y as f64).powi(2) / (x + y) as f64;
        cells += 1;
    }
    if pa + pb > 0 {
        stat += (pa as f64 - pb as f64).powi(2) / (pa + pb) as f64;
        cells += 1;
    }
    (stat, cells - 1)
}

/// The chi-square distribution's 0.999 quantile for `df` degrees of
/// freedom (Wilson-Hilferty; within 1% for df >= 3).
fn critical_0001(df: usize) -> f64 {
    let (k, z) = (df as f64, 3.090_232);
    let h = 2.0 / (9.0 * k);
    k * (1.0 - h + z * h.sqrt()).powi(3)
}

#[test]
fn speculation_keeps_the_sampled_distribution() {
    let plain = counts(&start(None), 0..N, 1.0);
    let (draft, _) = backend();
    let methods = [
        SpecMethod::Suffix,
        SpecMethod::Draft(DraftModel::loaded("tiny", Box::new(draft))),
    ];
    for (i, method) in methods.into_iter().enumerate() {
        let name = method.name();
        let e = start(Some(method));
        let seeds = (i as u64 + 1) * N..(i as u64 + 2) * N;
        let spec = counts(&e, seeds, 1.0);
        let st = e.stats();
        // suffix drafts the likely tokens; the draft model's greedy tokens
        // ignore the request's bias, so its drafts are mostly rejected
        let accepted = match i {
            0 => N / 4,
            _ => 0,
        };
        assert!(
            st.spec_drafted_total > N && st.spec_accepted_total > accepted,
            "{name}: {st:?}"
        );
        let (stat, df) = chi2(&plain, &spec);
        let crit = critical_0001(df);
        assert!(
            df >= 3 && stat < crit,
            "{name}: chi-square {stat:.1} over {df} degrees of freedom, critical {crit:.1}"
        );
        e.shutdown();
    }
    // the statistic does tell different distributions apart
    let hotter = counts(&start(None), 4 * N..5 * N, 1.6);
    let (stat, df) = chi2(&plain, &hotter);
    assert!(
        stat > 2.0 * critical_0001(df),
        "temperature 1.6: chi-square {stat:.1} over {df} degrees of freedom"
    );
}
