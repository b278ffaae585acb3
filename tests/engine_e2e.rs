//! The continuous-batching engine on the real CPU backend with the synthetic
//! `tiny` model: concurrency, preemption,
//! cancellation, prefix caching and rejection never change a request's
//! greedy tokens, and every KV block comes back.
//!
//! The reference for "alone" is a separate engine with the prefix cache off,
//! running one request at a time.

use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use contract::{KvShape, SamplingParams};
use engine::{Completion, Engine, EngineConfig, Event, FinishReason, GenerateRequest, SubmitError};
use tokenizer::Tokenizer;

const BLOCK_SIZE: usize = 16;

/// The tiny synthetic model, written once per test binary.
fn model_dir() -> &'static Path {
    lamina_tests::tiny_model(5)
}

fn start(
    num_blocks: usize,
    max_num_seqs: usize,
    max_batch_tokens: usize,
    prefix_cache: bool,
) -> Engine {
    let dir = model_dir();
    let loaded = checkpoint::loader::load_config(dir).expect("config");
    let weights = checkpoint::loader::load_weights(dir, &loaded.config).expect("weights");
    let tok = Arc::new(Tokenizer::from_dir(dir).expect("tokenizer"));
    let kv = KvShape {
        num_blocks,
        block_size: BLOCK_SIZE,
    };
    let backend =
        model::cpu::CpuBackend::new(loaded.config.clone(), weights, kv).expect("cpu backend");
    Engine::start(
        Box::new(backend),
        tok,
        loaded.eos_ids.clone(),
        EngineConfig {
            max_num_seqs,
            max_batch_tokens,
            enable_prefix_cache: prefix_cache,
            max_queue: 0,
            max_step_time: None,
            halt_on_backend_error: false,
            async_steps: true,
            speculative: None,
            ..EngineConfig::default()
        },
    )
    .expect("engine")
}

/// A prompt of `len` byte tokens, distinct per `salt`.
fn prompt(len: usize, salt: u32) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (i * 31 + salt * 17 + 5) % 250)
        .collect()
}

fn greedy(prompt: Vec<u32>, max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        prompt,
        sampling: SamplingParams::greedy(),
        max_tokens,
        stop: Vec::new(),
        ignore_eos: true,
        stop_token_ids: Vec::new(),
        constraint: None,
        speculative: true,
        lora: None,
    }
}

/// 16 prompts of very different lengths (1 to 300 tokens).
fn sixteen() -> Vec<GenerateRequest> {
    [
        1usize, 300, 7, 64, 2, 150, 33, 16, 17, 90, 4, 220, 48, 11, 128, 5,
    ]
    .into_iter()
    .enumerate()
    .map(|(i, n)| greedy(prompt(n, i as u32), 6 + (i % 5) * 4))
    .collect()
}

/// Each request run alone on a fresh engine without prefix cache.
fn alone(reqs: &[GenerateRequest]) -> Vec<Vec<u32>> {
    let engine = start(64, 4, 512, false);
    let out = reqs
        .iter()
        .map(|r| {
            lamina_tests::run_all(&engine, std::slice::from_ref(r))
                .remove(0)
                .tokens
        })
        .collect();
    engine.shutdown();
    out
}

fn reference() -> &'static [Vec<u32>] {
    static REF: OnceLock<Vec<Vec<u32>>> = OnceLock::new();
    REF.get_or_init(|| alone(&sixteen()))
}

fn wait_idle(engine: &Engine) {
    for _ in 0..5000 {
        let s = engine.stats();
        if s.running == 0 && s.waiting == 0 {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("engine did not go idle: {:?}", engine.stats());
}

#[test]
fn sixteen_concurrent_prompts_equal_each_alone() {
    let reqs = sixteen();
    let distinct: std::collections::HashSet<&Vec<u32>> = reference().iter().collect();
    assert!(
        distinct.len() > 8,
        "the model should continue different prompts differently"
    );
    let engine = start(256, 16, 256, true);
    let outs = lamina_tests::run_all(&engine, &reqs);
    for ((r, out), want) in reqs.iter().zip(&outs).zip(reference()) {
        assert_eq!(&out.tokens, want, "prompt of {} tokens", r.prompt.len());
        assert_eq!(out.reason, FinishReason::Length);
        assert_eq!(out.usage.completion_tokens, r.max_tokens);
    }
    wait_idle(&engine);
    assert_eq!(engine.stats().kv_blocks_used, 0);
}

#[test]
fn pool_too_small_for_all_preempts_and_output_is_identical() {
    let reqs = sixteen();
    // 40 blocks = 640 slots; the 16 sequences need ~1,200
    let engine = start(40, 16, 128, true);
    let outs = lamina_tests::run_all(&engine, &reqs);
    for ((r, out), want) in reqs.iter().zip(&outs).zip(reference()) {
        assert_eq!(&out.tokens, want, "prompt of {} tokens", r.prompt.len());
    }
    wait_idle(&engine);
    let st = engine.stats();
    assert!(st.preemptions_total > 0, "expected preemption: {st:?}");
    assert_eq!(st.kv_blocks_used, 0, "every block free afterwards");
}

#[test]
fn cancelling_half_mid_stream_frees_blocks_others_unchanged() {
    let reqs: Vec<_> = (0..8)
        // the cancelled ones (odd) are long, so they are still running when cancelled
        .map(|i| {
            greedy(
                prompt(20 + i * 25, 50 + i as u32),
                if i % 2 == 1 { 250 } else { 60 },
            )
        })
        .collect();
    let want = alone(&reqs);
    let engine = start(256, 8, 256, true);
    let handles: Vec<_> = reqs
        .iter()
        .map(|r| engine.submit(r.clone()).expect("submit"))
        .collect();
    let outs: Vec<Option<Completion>> = std::thread::scope(|s| {
        let joins: Vec<_> = handles
            .into_iter()
            .enumerate()
            .map(|(i, mut h)| {
                s.spawn(move || {
                    if i % 2 == 0 {
                        return Some(h.blocking_collect());
                    }
                    for _ in 0..3 {
                        assert!(matches!(h.blocking_next(), Some(Event::Token(_))));
                    }
                    if i % 4 == 1 {
                        h.cancel();
                        let done = std::iter::from_fn(|| h.blocking_next()).last();
                        assert!(
                            matches!(&done, Some(Event::Done(d)) if d.reason == FinishReason::Cancelled),
                            "{done:?}"
                        );
                    }
                    // i % 4 == 3: the handle is dropped here
                    None
                })
            })
            .collect();
        joins
            .into_iter()
            .map(|j| j.join().expect("consumer"))
            .collect()
    });
    for (i, out) in outs.iter().enumerate() {
        if let Some(out) = out {
            assert_eq!(out.tokens, want[i], "request {i}");
        }
    }
    wait_idle(&engine);
    assert_eq!(engine.stats().kv_blocks_used, 0);
}

#[test]
fn shared_prefix_reports_cached_tokens_and_same_output() {
    let system = prompt(70, 9);
    let mut a = system.clone();
    a.extend(prompt(9, 1));
    let mut b = system.clone();
    b.extend(prompt(13, 2));
    let reqs = [greedy(a, 12), greedy(b, 12)];
    let want = alone(&reqs);
    let engine = start(128, 4, 256, true);
    let first = lamina_tests::run_all(&engine, &reqs[..1]).remove(0);
    let second = lamina_tests::run_all(&engine, &reqs[1..]).remove(0);
    assert_eq!(first.usage.cached_tokens, 0);
    // 70 shared tokens = 4 full blocks of 16
    assert_eq!(second.usage.cached_tokens, 64);
    assert_eq!(second.usage.prompt_tokens, 83);
    assert_eq!(first.tokens, want[0]);
    assert_eq!(second.tokens, want[1]);
    assert_eq!(engine.stats().cached_tokens_total, 64);
}

#[test]
fn prompt_beyond_pool_or_context_is_rejected_others_proceed() {
    let engine = start(16, 4, 256, true);
    let ok = greedy(prompt(40, 3), 10);
    let handle = engine.submit(ok.clone()).expect("submit");
    let too_big_for_pool = engine
        .submit(greedy(prompt(16 * BLOCK_SIZE + 1, 4), 4))
        .err();
    assert!(
        matches!(
            too_big_for_pool,
            Some(SubmitError::ExceedsKvPool {
                needed_blocks: 17,
                pool_blocks: 16,
                ..
            })
        ),
        "{too_big_for_pool:?}"
    );
    let ctx = engine.max_context();
    let too_long = engine.submit(greedy(prompt(ctx + 5, 4), 4)).err();
    assert!(
        matches!(too_long, Some(SubmitError::PromptTooLong { .. })),
        "{too_long:?}"
    );
    let msg = too_long.map(|e| e.to_string()).unwrap_or_default();
    assert!(
        msg.contains(&format!("{}", ctx + 5)) && msg.contains(&ctx.to_string()),
        "{msg}"
    );
    let out = handle.blocking_collect();
    assert_eq!(out.tokens, alone(std::slice::from_ref(&ok))[0]);
    wait_idle(&engine);
    assert_eq!(engine.stats().kv_blocks_used, 0);
}

/// Weights that pass the load checks yet collapse the logits (a zero final
/// norm: every logit 0) end each request with an error naming the cause on
/// every CPU path (reference, fast BF16, quantised at load), never an
/// empty completion that claims `length`.
#[test]
fn collapsed_logits_end_requests_with_an_error_on_every_cpu_path() {
    use cpu_kernels::quant::QuantType;
    use model::cpu::{CpuBackend, CpuPath, CpuWeights};
    let dir = model_dir();
    let loaded = checkpoint::loader::load_config(dir).expect("config");
    let formats = [
        (CpuPath::Reference, CpuWeights::Stored),
        (CpuPath::Fast, CpuWeights::Stored),
        (CpuPath::Fast, CpuWeights::Quantize(QuantType::Q8_0)),
        (CpuPath::Fast, CpuWeights::Quantize(QuantType::Q4_1)),
    ];
    for (path, format) in formats {
        let mut weights = checkpoint::loader::load_weights(dir, &loaded.config).expect("weights");
        let name = format.describe(&weights);
        weights.norm.data.fill(half::bf16::ZERO);
        let kv = KvShape {
            num_blocks: 32,
            block_size: BLOCK_SIZE,
        };
        let backend = CpuBackend::with_weights(loaded.config.clone(), weights, kv, path, format)
            .expect("cpu backend");
        let tok = Arc::new(Tokenizer::from_dir(dir).expect("tokenizer"));
        let engine = Engine::start(
            Box::new(backend),
            tok,
            loaded.eos_ids.clone(),
            EngineConfig::default(),
        )
        .expect("engine");
        let mut sampled = greedy(prompt(20, 1), 5);
        sampled.sampling.temperature = 0.8;
        sampled.sampling.seed = 3;
        for out in lamina_tests::run_all(&engine, &[greedy(prompt(9, 0), 5), sampled]) {
            assert_eq!(out.reason, FinishReason::Error, "{name} ({path:?})");
            let why = out.error.unwrap_or_default();
            assert!(why.contains("degenerate logits"), "{name}: {why}");
            assert!(out.tokens.is_empty(), "{name}: {:?}", out.tokens);
        }
        wait_idle(&engine);
        assert_eq!(engine.stats().kv_blocks_used, 0, "{name}");
        engine.shutdown();
    }
}
