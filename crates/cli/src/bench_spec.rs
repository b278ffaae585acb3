//! `lamina bench`'s `sp` workload: speculative decoding with and without,
//! in one run on one engine (`--speculative` on; requests that opt out run
//! plain, so both sides share the weights, the KV pool and the machine's
//! state). With `--speculative` every other workload opts out (their
//! figures stay those of plain decoding) and `sp` runs after them.
//!
//! - one stream, b1's sizes: plain decode tok/s, speculative decode tok/s
//!   on a fresh prompt, and the same prompt again (suffix decoding then
//!   drafts the first run's output: the verify path's overhead when every
//!   draft is right), each the median of `--repeats`, with their ratios to
//!   plain;
//! - a batch, b3's sizes: output tok/s plain and speculative (the batch
//!   above `--speculative-max-batch` drafts nothing);
//! - real text, with a model that has a chat template: the shipped chat
//!   prompts of `data/speculative_prompts.json`, one stream, each run to
//!   its end (at most b1's new tokens), speculative before plain (so no
//!   speculative run drafts from the plain run of its own prompt): decode
//!   tok/s of the copy-heavy set (edit, extract, reformat) and of the set
//!   with nothing to copy, plain and speculative;
//! - the engine's draft counters over the speculative runs: drafted,
//!   accepted, acceptance rate and mean accepted length per verify.

use std::time::Instant;

use anyhow::Result;
use contract::SamplingParams;
use engine::{Engine, EngineStats, GenerateRequest, RequestHandle};
use serde_json::json;
use tokenizer::{ChatMessage, Tokenizer};

use crate::bench::{Sizes, drain_all, median, time};

/// The real-text part's chat prompts (module doc).
const PROMPTS: &str = include_str!("../data/speculative_prompts.json");

#[derive(serde::Deserialize)]
struct Prompts {
    copy: Vec<String>,
    open: Vec<String>,
}

fn submit(engine: &Engine, prompt: Vec<u32>, n: usize, speculative: bool) -> Result<RequestHandle> {
    submit_until(engine, prompt, n, speculative, true)
}

fn submit_until(
    engine: &Engine,
    prompt: Vec<u32>,
    n: usize,
    speculative: bool,
    ignore_eos: bool,
) -> Result<RequestHandle> {
    Ok(engine.submit(GenerateRequest {
        prompt,
        sampling: SamplingParams::greedy(),
        max_tokens: n,
        stop: Vec::new(),
        ignore_eos,
        stop_token_ids: Vec::new(),
        constraint: None,
        speculative,
        lora: None,
    })?)
}

/// Decode tok/s of one stream (first to last token).
fn stream(engine: &Engine, prompt: Vec<u32>, n: usize, speculative: bool) -> Result<f64> {
    let t = time(submit(engine, prompt, n, speculative)?)?;
    Ok(t.tokens.saturating_sub(1).max(1) as f64 / t.decode.as_secs_f64().max(1e-9))
}

/// Decode tok/s over `prompts` run one at a time to their end (at most
/// `n` tokens), each speculative then plain: (plain, speculative).
fn text_set(engine: &Engine, prompts: &[Vec<u32>], n: usize) -> Result<(f64, f64)> {
    let mut sums = [(0usize, 0f64); 2];
    for p in prompts {
        for (side, speculative) in [(1, true), (0, false)] {
            let t = time(submit_until(engine, p.clone(), n, speculative, false)?)?;
            sums[side].0 += t.tokens.saturating_sub(1);
            sums[side].1 += t.decode.as_secs_f64();
        }
    }
    let rate = |(k, secs): (usize, f64)| k as f64 / secs.max(1e-9);
    Ok((rate(sums[0]), rate(sums[1])))
}

/// The real-text part (module doc): prints and returns its figures.
fn text(engine: &Engine, tok: &Tokenizer, method: &str, n: usize) -> Result<serde_json::Value> {
    let sets: Prompts = serde_json::from_str(PROMPTS)?;
    let mut out = serde_json::Map::new();
    for (name, texts) in [("copy", &sets.copy), ("open", &sets.open)] {
        let prompts = texts
            .iter()
            .map(|q| Ok(tok.encode_chat(&[ChatMessage::new("user", q)])?))
            .collect::<Result<Vec<_>>>()?;
        let (plain, spec) = text_set(engine, &prompts, n)?;
        println!(
            "sp {method} text, {name} ({} chat prompts, one stream, at most {n} new): plain {plain:.1} tok/s, speculative {spec:.1} tok/s ({:.2}x)",
            prompts.len(),
            spec / plain.max(1e-9)
        );
        out.insert(
            name.into(),
            json!({"plain_tok_s": plain, "spec_tok_s": spec}),
        );
    }
    Ok(out.into())
}

/// Output tok/s of a batch submitted at once.
fn batch(engine: &Engine, prompts: Vec<Vec<u32>>, n: usize, speculative: bool) -> Result<f64> {
    let start = Instant::now();
    let handles = prompts
        .into_iter()
        .map(|p| submit(engine, p, n, speculative))
        .collect::<Result<Vec<_>>>()?;
    let total = drain_all(handles, "sp batch")?;
    Ok(total as f64 / start.elapsed().as_secs_f64())
}

/// Runs the workload (module doc), printing its lines and adding its
/// figures to `res`; `method` names the drafter.
pub fn run(
    engine: &Engine,
    method: &str,
    prompt: &mut dyn FnMut(usize) -> Vec<u32>,
    z: &Sizes,
    repeats: usize,
    tok: &Tokenizer,
    res: &mut serde_json::Map<String, serde_json::Value>,
) -> Result<()> {
    let before = engine.stats();
    let (mut plain, mut fresh, mut again) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..repeats {
        // a prompt of its own for each run but the repeat, so no run
        // drafts from another's output unless it is meant to
        plain.push(stream(engine, prompt(z.b1_prompt), z.b1_gen, false)?);
        let q = prompt(z.b1_prompt);
        fresh.push(stream(engine, q.clone(), z.b1_gen, true)?);
        again.push(stream(engine, q, z.b1_gen, true)?);
        eprintln!("bench: sp run {}/{repeats} done", i + 1);
    }
    let (plain, fresh, again) = (median(plain), median(fresh), median(again));
    println!(
        "sp {method} single stream ({} prompt, {} new): plain {plain:.1} tok/s, speculative {fresh:.1} tok/s ({:.2}x), repeated prompt {again:.1} tok/s ({:.2}x)",
        z.b1_prompt,
        z.b1_gen,
        fresh / plain,
        again / plain
    );
    // fresh prompts for each batch: the prefix cache must not serve the second
    let mut prompts = || (0..z.b3_batch).map(|_| prompt(z.b3_prompt)).collect();
    let b_plain = batch(engine, prompts(), z.b3_gen, false)?;
    let b_spec = batch(engine, prompts(), z.b3_gen, true)?;
    println!(
        "sp {method} batch {} x ({} in, {} out): plain {b_plain:.0} output tok/s, speculative {b_spec:.0} ({:.2}x)",
        z.b3_batch,
        z.b3_prompt,
        z.b3_gen,
        b_spec / b_plain
    );
    let texts = match tok.chat_template() {
        Some(_) => text(engine, tok, method, z.b1_gen)?,
        None => {
            println!("sp {method} text: skipped (the model has no chat template)");
            serde_json::Value::Null
        }
    };
    let d = counters(&before, &engine.stats());
    println!(
        "sp {method} drafts: {} drafted, {} accepted ({:.1}%), mean accepted length {:.2} over {} verifies",
        d.0,
        d.1,
        100.0 * d.1 as f64 / d.0.max(1) as f64,
        d.1 as f64 / d.2.max(1) as f64,
        d.2
    );
    res.insert(
        "sp".into(),
        json!({"method": method, "b1_plain_tok_s": plain, "b1_spec_tok_s": fresh,
               "b1_repeat_tok_s": again, "batch_plain_tok_s": b_plain,
               "batch_spec_tok_s": b_spec, "text": texts, "drafted": d.0, "accepted": d.1,
               "verifies": d.2}),
    );
    Ok(())
}

/// (drafted, accepted, verifies) between two snapshots.
fn counters(a: &EngineStats, b: &EngineStats) -> (u64, u64, u64) {
    (
        b.spec_drafted_total - a.spec_drafted_total,
        b.spec_accepted_total - a.spec_accepted_total,
        b.spec_verifies_total - a.spec_verifies_total,
    )
}
