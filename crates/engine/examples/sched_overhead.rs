//! Scheduler overhead per step with 256 running sequences: the engine's host time between backend steps (planning,
//! KV bookkeeping, batch building, detokenizing, stop checks, event sends),
//! measured on the fake backend in its cheap mode (O(T + S) per step), so the
//! figure is the engine's own cost, not a model's.
//!
//! Run: `cargo run --release -p engine --example sched_overhead [-- SEQS GEN PROMPT]`.
//! Events are left buffered until the end so no consumer thread competes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use contract::{KvShape, SamplingParams};
use engine::testing::{FakeBackend, fake_config, fake_tokenizer};
use engine::{Engine, EngineConfig, GenerateRequest};

fn arg(i: usize, default: usize) -> usize {
    std::env::args()
        .nth(i)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let seqs = arg(1, 256);
    let gen_tokens = arg(2, 256);
    let prompt_len = arg(3, 64);
    let block_size = 16;
    let mut config = fake_config()?;
    // room for the benchmark's context; the fake has no position table
    config.max_position_embeddings = config
        .max_position_embeddings
        .max(prompt_len + gen_tokens + 1);
    let tok = Arc::new(fake_tokenizer(&config)?);
    let shape = KvShape {
        num_blocks: seqs * (prompt_len + gen_tokens).div_ceil(block_size),
        block_size,
    };
    let engine = Engine::start(
        Box::new(FakeBackend::cheap(config, shape)),
        tok,
        vec![],
        EngineConfig {
            max_num_seqs: seqs,
            max_batch_tokens: seqs * prompt_len,
            enable_prefix_cache: true,
            max_queue: 0,
            max_step_time: None,
            halt_on_backend_error: false,
            async_steps: true,
            speculative: None,
            ..EngineConfig::default()
        },
    )?;
    let start = Instant::now();
    let handles = (0..seqs as u32)
        .map(|i| {
            let prompt = (0..prompt_len as u32)
                .map(|j| (i * 7919 + j * 31) % 250)
                .collect();
            engine.submit(GenerateRequest {
                prompt,
                sampling: SamplingParams::greedy(),
                max_tokens: gen_tokens,
                stop: vec!["\u{7}never".into()],
                ignore_eos: true,
                stop_token_ids: Vec::new(),
                constraint: None,
                speculative: true,
                lora: None,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    loop {
        let s = engine.stats();
        if s.generation_tokens_total as usize == seqs * gen_tokens {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let wall = start.elapsed();
    let s = engine.stats();
    let mut tokens = 0;
    for h in handles {
        tokens += h.blocking_collect().tokens.len();
    }
    engine.shutdown();
    let per = |ns: u64| ns as f64 / s.steps_total.max(1) as f64 / 1e3;
    println!(
        "{seqs} sequences x ({prompt_len} prompt + {gen_tokens} generated): {} steps, {tokens} tokens in {:.2} s",
        s.steps_total,
        wall.as_secs_f64()
    );
    println!(
        "per step: scheduler {:.1} us ({:.3} us per sequence); all host work {:.1} us ({:.2} us per sequence, detokenizing included); fake backend {:.1} us",
        per(s.schedule_ns_total),
        per(s.schedule_ns_total) / seqs as f64,
        per(s.host_ns_total),
        per(s.host_ns_total) / seqs as f64,
        per(s.backend_ns_total)
    );
    Ok(())
}
