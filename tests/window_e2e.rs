//! Sliding windows end to end on the CPU backend (deterministic mode, so a
//! token's log-probabilities do not depend on how its step was cut): the
//! tiny synthetic model with every layer windowed, whose engine frees KV
//! blocks behind the window as sequences decode. A prompt whose cached
//! prefix is longer than the window gives the same tokens and the same
//! log-probability bits as the same prompt on an engine without the prefix
//! cache, and every block comes back.

use std::sync::Arc;

use contract::{KvCacheDtype, KvShape, SamplingParams};
use engine::{Completion, Engine, EngineConfig, GenerateRequest};
use tokenizer::Tokenizer;

const BLOCK_SIZE: usize = 16;
/// Every layer's window: shorter than the shared prefix (4 blocks).
const WINDOW: usize = 20;

fn start(prefix_cache: bool) -> Engine {
    let dir = lamina_tests::tiny_model(13);
    let loaded = checkpoint::loader::load_config(dir).expect("config");
    let weights = checkpoint::loader::load_weights(dir, &loaded.config).expect("weights");
    let mut config = loaded.config.clone();
    for l in &mut config.spec.layers {
        l.attention.window = Some(WINDOW);
    }
    assert_eq!(config.spec.kv_window(), Some(WINDOW));
    let tok = Arc::new(Tokenizer::from_dir(dir).expect("tokenizer"));
    let kv = KvShape {
        num_blocks: 64,
        block_size: BLOCK_SIZE,
    };
    let backend = model::cpu::CpuBackend::with_path(config, weights, kv, model::cpu::CpuPath::Fast)
        .expect("cpu backend")
        .with_kv_cache_dtype(KvCacheDtype::Bf16)
        .with_deterministic(true);
    Engine::start(
        Box::new(backend),
        tok,
        loaded.eos_ids.clone(),
        EngineConfig {
            max_num_seqs: 4,
            max_batch_tokens: 256,
            enable_prefix_cache: prefix_cache,
            ..EngineConfig::default()
        },
    )
    .expect("engine")
}

/// A prompt of `len` byte tokens, distinct per `salt`.
fn prompt(len: usize, salt: u32) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (i * 29 + salt * 11 + 7) % 250)
        .collect()
}

fn greedy(prompt: Vec<u32>) -> GenerateRequest {
    GenerateRequest {
        prompt,
        sampling: SamplingParams {
            logprobs: 5,
            ..SamplingParams::greedy()
        },
        max_tokens: 40,
        stop: Vec::new(),
        ignore_eos: true,
        stop_token_ids: Vec::new(),
        constraint: None,
        speculative: true,
        lora: None,
    }
}

/// A token's log-probability bits and its alternatives' (token, bits).
type LogprobBits = (u32, Vec<(u32, u32)>);

/// Tokens and log-probability bits of a completion.
fn bits(c: &Completion) -> (Vec<u32>, Vec<LogprobBits>) {
    let lp = c.logprobs.iter().map(|(l, alts)| {
        let alts = alts.iter().map(|&(t, a)| (t, a.to_bits())).collect();
        (l.to_bits(), alts)
    });
    (c.tokens.clone(), lp.collect())
}

#[test]
fn a_cached_prefix_longer_than_the_window_gives_the_same_logprobs() {
    let shared = prompt(70, 1);
    let first = greedy(shared.clone());
    let mut second = shared.clone();
    second.extend(prompt(13, 2));
    let second = greedy(second);

    let plain = start(false);
    let want = lamina_tests::run_all(&plain, std::slice::from_ref(&second)).remove(0);
    plain.shutdown();

    let cached = start(true);
    lamina_tests::run_all(&cached, std::slice::from_ref(&first));
    let got = lamina_tests::run_all(&cached, std::slice::from_ref(&second)).remove(0);
    // 70 shared tokens: 4 full blocks of 16, longer than the window
    assert_eq!(got.usage.cached_tokens, 64);
    assert!(got.usage.cached_tokens > WINDOW);
    assert_eq!(got.tokens.len(), 40);
    assert_eq!(bits(&got), bits(&want), "cached prefix against none");
    for _ in 0..5000 {
        if cached.stats().running == 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(cached.stats().kv_blocks_used, 0);
    cached.shutdown();
}
