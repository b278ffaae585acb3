//! Engine behaviour on the deterministic fake backend: concurrency, chunked
//! prefill, preemption, prefix caching, cancellation, stops, validation and
//! shutdown. Every expected token comes from `reference_generate`, the fake
//! model run alone with no paging at all.
//!
//! Split by concern: this file holds the shared setup helpers;
//! [`scheduling`] checks outputs under batching, chunking, preemption, prefix
//! caching and overlapped output processing; [`speculation`] checks that
//! speculative decoding changes no output; [`lifecycle`] checks how
//! requests end (cancel, stop, EOS, errors, rejections, queue, shutdown);
//! [`warmup`] checks the start-up warm-up; [`embed`] checks embedding
//! requests.

mod embed;
mod lifecycle;
mod scheduling;
mod speculation;
mod warmup;

use std::sync::Arc;
use std::time::Duration;

use contract::{KvShape, ModelConfig, SamplingParams};
use engine::testing::{FakeBackend, fake_config, fake_tokenizer, reference_generate};
use engine::{Completion, Engine, EngineConfig, Event, FinishReason, GenerateRequest, SubmitError};

struct Setup {
    engine: Engine,
    config: ModelConfig,
    eos: Vec<u32>,
}

fn start_with(
    blocks: usize,
    block_size: usize,
    cfg: EngineConfig,
    tweak: impl FnOnce(FakeBackend) -> FakeBackend,
) -> Setup {
    let config = fake_config().unwrap();
    let tok = Arc::new(fake_tokenizer(&config).unwrap());
    let eos = config.eos_token_ids.clone();
    let backend = tweak(FakeBackend::new(
        config.clone(),
        KvShape {
            num_blocks: blocks,
            block_size,
        },
    ));
    let engine = Engine::start(Box::new(backend), tok, eos.clone(), cfg).unwrap();
    Setup {
        engine,
        config,
        eos,
    }
}

fn start(blocks: usize, block_size: usize, cfg: EngineConfig) -> Setup {
    start_with(blocks, block_size, cfg, |b| b)
}

fn cfg(max_num_seqs: usize, max_batch_tokens: usize) -> EngineConfig {
    EngineConfig {
        max_num_seqs,
        max_batch_tokens,
        enable_prefix_cache: true,
        max_queue: 0,
        max_step_time: None,
        halt_on_backend_error: false,
        async_steps: true,
        speculative: None,
        ..EngineConfig::default()
    }
}

/// A prompt of `len` tokens, distinct per `salt`, all plain bytes.
fn prompt(len: usize, salt: u32) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (i * 7 + salt * 13 + 1) % 250)
        .collect()
}

fn req(prompt: Vec<u32>, max_tokens: usize, params: SamplingParams) -> GenerateRequest {
    GenerateRequest {
        prompt,
        sampling: params,
        max_tokens,
        stop: Vec::new(),
        ignore_eos: true,
        stop_token_ids: Vec::new(),
        constraint: None,
        speculative: true,
        lora: None,
    }
}

fn run_all(engine: &Engine, reqs: Vec<GenerateRequest>) -> Vec<Completion> {
    let handles: Vec<_> = reqs
        .into_iter()
        .map(|r| engine.submit(r).unwrap())
        .collect();
    std::thread::scope(|s| {
        let joins: Vec<_> = handles
            .into_iter()
            .map(|h| s.spawn(move || h.blocking_collect()))
            .collect();
        joins.into_iter().map(|j| j.join().unwrap()).collect()
    })
}

fn wait_idle(engine: &Engine) {
    for _ in 0..2000 {
        let s = engine.stats();
        if s.running == 0 && s.waiting == 0 {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("engine did not go idle: {:?}", engine.stats());
}

fn lengths() -> Vec<usize> {
    vec![1, 3, 17, 64, 5, 130, 2, 33, 16, 15, 200, 9, 48, 90, 4, 31]
}
