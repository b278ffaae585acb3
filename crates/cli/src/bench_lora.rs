//! `lamina bench`'s `lr` workload: the cost of LoRA adapters, in one run on
//! one engine (the base model and the adapters share the weights, the KV
//! pool and the machine's state). [`ADAPTERS`] random adapters of rank
//! [`RANK`] on all seven targets are made in memory (their values do not
//! change the cost) and loaded; the engine needs that many slots
//! (`bench` raises `--max-loras` to [`ADAPTERS`] for this workload).
//!
//! - one stream, b1's sizes: decode tok/s of the base model and of one
//!   adapter, each the median of `--repeats`, and their ratio;
//! - a batch, b3's sizes: output tok/s of the base model and with the
//!   requests spread round-robin over the adapters, and their ratio.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use contract::lora::{LoraAdapter, LoraLayer, LoraPair, LoraTarget};
use contract::sampling::splitmix64;
use contract::{ModelConfig, SamplingParams};
use engine::{Engine, GenerateRequest, RequestHandle};
use serde_json::json;

use crate::bench::{Sizes, drain_all, median, time};

/// Adapters the batch part spreads its requests over.
pub const ADAPTERS: usize = 8;
/// Rank of each adapter.
const RANK: usize = 16;

/// A random adapter of rank [`RANK`] on every target (seed `seed`).
fn adapter(c: &ModelConfig, seed: u64) -> LoraAdapter {
    let mut n = seed << 32;
    let mut vals = |len: usize| -> Vec<f32> {
        (0..len)
            .map(|_| {
                n += 1;
                let u = (splitmix64(n) >> 40) as f32 / (1u32 << 24) as f32;
                0.01 * (2.0 * u - 1.0)
            })
            .collect()
    };
    let layers = (0..c.num_layers)
        .map(|_| {
            let mut l = LoraLayer::default();
            for t in LoraTarget::ALL {
                let (i, o) = t.dims(c);
                l.pairs[t.index()] = Some(LoraPair {
                    a: vals(RANK * i),
                    b: vals(o * RANK),
                });
            }
            l
        })
        .collect();
    LoraAdapter {
        rank: RANK,
        scale: 1.0,
        layers,
    }
}

fn submit(
    engine: &Engine,
    prompt: Vec<u32>,
    n: usize,
    lora: Option<String>,
) -> Result<RequestHandle> {
    Ok(engine.submit(GenerateRequest {
        prompt,
        sampling: SamplingParams::greedy(),
        max_tokens: n,
        stop: Vec::new(),
        ignore_eos: true,
        stop_token_ids: Vec::new(),
        constraint: None,
        speculative: false,
        lora,
    })?)
}

/// The name of adapter `i`.
fn name(i: usize) -> String {
    format!("bench-lora-{i}")
}

/// Output tok/s of `prompts` submitted at once, request `i` on `lora(i)`.
fn batch(
    engine: &Engine,
    prompts: Vec<Vec<u32>>,
    n: usize,
    lora: impl Fn(usize) -> Option<String>,
) -> Result<f64> {
    let start = Instant::now();
    let handles = prompts
        .into_iter()
        .enumerate()
        .map(|(i, p)| submit(engine, p, n, lora(i)))
        .collect::<Result<Vec<_>>>()?;
    let total = drain_all(handles, "lr batch")?;
    Ok(total as f64 / start.elapsed().as_secs_f64())
}

/// Runs the workload (module doc), printing its lines and adding its
/// figures to `res`.
pub fn run(
    engine: &Engine,
    c: &ModelConfig,
    prompt: &mut dyn FnMut(usize) -> Vec<u32>,
    z: &Sizes,
    repeats: usize,
    res: &mut serde_json::Map<String, serde_json::Value>,
) -> Result<()> {
    for i in 0..ADAPTERS {
        engine
            .load_lora(&name(i), Arc::new(adapter(c, i as u64 + 1)))
            .with_context(|| format!("the lr workload needs --max-loras {ADAPTERS} or more"))?;
    }
    // warm-up: each adapter's slot upload and the LoRA decode graphs stay
    // out of the figures
    batch(
        engine,
        (0..ADAPTERS).map(|_| prompt(16)).collect(),
        4,
        |i| Some(name(i)),
    )?;
    let stream = |p: Vec<u32>, lora: Option<String>| -> Result<f64> {
        let t = time(submit(engine, p, z.b1_gen, lora)?)?;
        Ok(t.tokens.saturating_sub(1).max(1) as f64 / t.decode.as_secs_f64().max(1e-9))
    };
    let (mut base, mut one) = (Vec::new(), Vec::new());
    for _ in 0..repeats {
        base.push(stream(prompt(z.b1_prompt), None)?);
        one.push(stream(prompt(z.b1_prompt), Some(name(0)))?);
    }
    let (base, one) = (median(base), median(one));
    println!(
        "lr b1 single stream ({} prompt, {} new): base {base:.1} tok/s, one rank-{RANK} adapter (7 targets) {one:.1} tok/s, ratio {:.3}",
        z.b1_prompt,
        z.b1_gen,
        one / base.max(1e-9)
    );
    let prompts = |prompt: &mut dyn FnMut(usize) -> Vec<u32>| -> Vec<Vec<u32>> {
        (0..z.b3_batch).map(|_| prompt(z.b3_prompt)).collect()
    };
    let plain = batch(engine, prompts(prompt), z.b3_gen, |_| None)?;
    let mixed = batch(engine, prompts(prompt), z.b3_gen, |i| {
        Some(name(i % ADAPTERS))
    })?;
    println!(
        "lr b3 batch {} x ({} in, {} out): base {plain:.0} output tok/s, {ADAPTERS} rank-{RANK} adapters round-robin {mixed:.0} output tok/s, ratio {:.3}",
        z.b3_batch,
        z.b3_prompt,
        z.b3_gen,
        mixed / plain.max(1e-9)
    );
    res.insert(
        "lr".into(),
        json!({"b1_base_tok_s": base, "b1_lora_tok_s": one, "b1_ratio": one / base.max(1e-9),
               "b3_base_out_tok_s": plain, "b3_lora_out_tok_s": mixed,
               "b3_ratio": mixed / plain.max(1e-9), "adapters": ADAPTERS, "rank": RANK}),
    );
    Ok(())
}
