//! `lamina bench-serve`: a load test of a running OpenAI-compatible server,
//! in the manner of `vllm bench serve`.
//!
//! Contract: `--num-prompts` streamed `/v1/completions` requests with random
//! token-id prompts (ids uniform below `--max-token-id`), prompt and output
//! lengths uniform in `--input-len` / `--output-len` (`N` or `MIN:MAX`),
//! greedy, `ignore_eos`, so every request asks for exactly its output
//! length. Requests arrive as a Poisson process at each `--request-rate`
//! (requests/s; `inf` sends them all at once), optionally capped at
//! `--max-concurrency` in flight. The same `--seed` gives the same prompts,
//! lengths and arrival times. Each rate's run draws its own prompt tokens
//! (the same lengths and arrival times, and the same `--shared-prefix`), so a
//! later rate does not find the earlier runs' prompts in the server's prefix
//! cache. `--warmup N` first sends N untimed requests at
//! once (a server's first-use costs stay out of the figures; a failed warm-up
//! request stops the benchmark). For each rate it reports request throughput,
//! output and total tok/s, and mean / p50 / p90 / p99 of time to first token
//! (TTFT), time per output token after the first (TPOT), inter-token latency
//! (ITL: the gaps between streamed chunks) and end-to-end latency.
//!
//! Costs: one tokio task per request and one connection per request in
//! flight; chunk timestamps are kept per request (O(output tokens)).

mod client;
mod replicas;
mod stats;

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use contract::sampling::splitmix64;
use serde_json::json;

use client::{Outcome, Spec};
use stats::RunReport;

#[derive(clap::Args, Debug)]
pub struct BenchServeArgs {
    /// Base URL of the server (`lamina serve` or any OpenAI-compatible one).
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    pub url: String,
    /// Model name sent with each request (default: the first of `/v1/models`).
    #[arg(long)]
    pub model: Option<String>,
    /// API key sent as `Authorization: Bearer KEY`.
    #[arg(long)]
    pub api_key: Option<String>,
    /// Requests per run.
    #[arg(long, default_value_t = 200)]
    pub num_prompts: usize,
    /// Arrival rates to sweep (requests/s, Poisson); `inf` sends all at once.
    #[arg(long, default_value = "inf", value_delimiter = ',')]
    pub request_rate: Vec<Rate>,
    /// Prompt length in tokens: `N` or `MIN:MAX` (uniform).
    #[arg(long, default_value = "256:1024")]
    pub input_len: LenRange,
    /// Output length in tokens: `N` or `MIN:MAX` (uniform).
    #[arg(long, default_value = "64:256")]
    pub output_len: LenRange,
    /// Most requests in flight at once (0 = no cap).
    #[arg(long, default_value_t = 0)]
    pub max_concurrency: usize,
    /// Every prompt starts with the same this many tokens (a shared system
    /// prompt) before its own `--input-len` tokens.
    #[arg(long, default_value_t = 0)]
    pub shared_prefix: usize,
    /// Prompt token ids are drawn uniformly from `0..max_token_id`.
    #[arg(long, default_value_t = 256)]
    pub max_token_id: u32,
    /// Seed of the prompts, lengths and arrival times.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Requests sent all at once before the timed runs and not reported (the
    /// server's first-use costs, such as CUDA graph captures, stay out of the
    /// figures); drawn like the timed ones under another seed.
    #[arg(long, default_value_t = 0)]
    pub warmup: usize,
    /// Seconds a request may take before it counts as failed.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// Ask for each token's log-probability (`logprobs: 0`): every token
    /// then arrives in an event even when it decodes to no text (special
    /// tokens, a synthetic model's filler tokens), so TTFT and ITL are
    /// measured for such outputs too. Costs the server the log-softmax.
    #[arg(long)]
    pub logprobs: bool,
    /// Write the results as JSON here too.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// An arrival rate in requests per second (`inf`: all at once).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate(pub f64);

impl FromStr for Rate {
    type Err = String;
    fn from_str(s: &str) -> Result<Rate, String> {
        if s == "inf" {
            return Ok(Rate(f64::INFINITY));
        }
        match s.parse::<f64>() {
            Ok(r) if r > 0.0 && r.is_finite() => Ok(Rate(r)),
            _ => Err(format!(
                "`{s}` is not a rate: a positive number of requests/s, or `inf`"
            )),
        }
    }
}

impl std::fmt::Display for Rate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.is_infinite() {
            f.write_str("inf")
        } else {
            write!(f, "{}", self.0)
        }
    }
}

/// A token count `N` or a uniform range `MIN:MAX` (inclusive).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LenRange {
    pub min: usize,
    pub max: usize,
}

impl FromStr for LenRange {
    type Err = String;
    fn from_str(s: &str) -> Result<LenRange, String> {
        let num = |t: &str| {
            t.trim()
                .parse::<usize>()
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| format!("`{t}` in `{s}` is not a positive token count"))
        };
        let (min, max) = match s.split_once(':') {
            Some((a, b)) => (num(a)?, num(b)?),
            None => (num(s)?, num(s)?),
        };
        if min > max {
            return Err(format!("`{s}`: MIN is larger than MAX"));
        }
        Ok(LenRange { min, max })
    }
}

impl std::fmt::Display for LenRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.min, self.max)
    }
}

/// Uniform `u64` draw `i` of stream `stream` under `seed` (counter-based).
fn draw(seed: u64, stream: u64, i: u64) -> u64 {
    splitmix64(seed ^ splitmix64(stream ^ splitmix64(i)))
}

fn uniform01(seed: u64, stream: u64, i: u64) -> f64 {
    (draw(seed, stream, i) >> 11) as f64 / (1u64 << 53) as f64
}

/// The `n` requests of run `run` under `seed` and their arrival offsets from
/// its start. The run only changes the prompts' own tokens.
fn plan(args: &BenchServeArgs, rate: Rate, n: usize, seed: u64, run: u64) -> Vec<(Duration, Spec)> {
    let ids_seed = seed.wrapping_add(run.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let pick = |r: LenRange, stream: u64, i: u64| {
        r.min + (draw(seed, stream, i) % (r.max - r.min + 1) as u64) as usize
    };
    let mut t = 0.0f64;
    let shared: Vec<u32> = (0..args.shared_prefix as u64)
        .map(|j| (draw(seed, u64::MAX - 1, j) % args.max_token_id as u64) as u32)
        .collect();
    (0..n as u64)
        .map(|i| {
            let len = pick(args.input_len, 1, i);
            let mut prompt = shared.clone();
            prompt.extend(
                (0..len as u64)
                    .map(|j| (draw(ids_seed, 2 + i, j) % args.max_token_id as u64) as u32),
            );
            let spec = Spec {
                prompt,
                max_tokens: pick(args.output_len, 0, i),
            };
            let at = Duration::from_secs_f64(t);
            if rate.0.is_finite() {
                // exponential inter-arrival times: a Poisson process
                t += -(1.0 - uniform01(seed, u64::MAX, i)).ln() / rate.0;
            }
            (at, spec)
        })
        .collect()
}

pub fn run(args: BenchServeArgs) -> Result<()> {
    if args.num_prompts == 0 {
        bail!("invalid `--num-prompts`: must be at least 1");
    }
    if args.max_token_id == 0 {
        bail!("invalid `--max-token-id`: must be at least 1");
    }
    if args.request_rate.is_empty() {
        bail!("invalid `--request-rate`: give at least one rate");
    }
    let rt = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    rt.block_on(run_async(args))
}

async fn run_async(args: BenchServeArgs) -> Result<()> {
    let base = args.url.trim_end_matches('/').to_string();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(args.timeout))
        .pool_max_idle_per_host(usize::MAX)
        .build()
        .context("building the HTTP client")?;
    let model = match &args.model {
        Some(m) => m.clone(),
        None => client::first_model(&http, &base, args.api_key.as_deref()).await?,
    };
    eprintln!(
        "bench-serve: {} requests, prompts {} tokens, outputs {} tokens, model `{model}` at {base}",
        args.num_prompts, args.input_len, args.output_len
    );
    let ctx = Arc::new(client::Ctx {
        http,
        url: format!("{base}/v1/completions"),
        model: model.clone(),
        api_key: args.api_key.clone(),
        logprobs: args.logprobs,
    });
    if args.warmup > 0 {
        let requests = plan(&args, Rate(f64::INFINITY), args.warmup, !args.seed, 0);
        let (outcomes, took) = drive(&ctx, requests, args.max_concurrency).await;
        if let Some(e) = outcomes.iter().find_map(|o| o.error.clone()) {
            bail!("a warm-up request failed: {e}");
        }
        eprintln!(
            "bench-serve: {} warm-up requests in {:.2} s (not reported)",
            args.warmup,
            took.as_secs_f64()
        );
    }
    let mut runs = Vec::new();
    for (run, &rate) in args.request_rate.iter().enumerate() {
        let requests = plan(&args, rate, args.num_prompts, args.seed, run as u64);
        let requested: usize = requests.iter().map(|(_, s)| s.max_tokens).sum();
        let before = replicas::scrape(&ctx.http, &base).await;
        let outcomes = drive(&ctx, requests, args.max_concurrency).await;
        let report = RunReport::new(rate, &outcomes.0, outcomes.1, requested);
        report.print(&mut std::io::stdout())?;
        if let (Some(b), Some(a)) = (before, replicas::scrape(&ctx.http, &base).await) {
            for line in replicas::report(&b, &a) {
                println!("  {line}");
            }
        }
        runs.push(report);
    }
    if let Some(path) = &args.json {
        let doc = json!({
            "url": base,
            "model": model,
            "num_prompts": args.num_prompts,
            "input_len": args.input_len.to_string(),
            "output_len": args.output_len.to_string(),
            "max_concurrency": args.max_concurrency,
            "seed": args.seed,
            "runs": runs.iter().map(RunReport::to_json).collect::<Vec<_>>(),
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let failed: usize = runs.iter().map(|r| r.failed).sum();
    if failed > 0 {
        let first = runs.iter().find_map(|r| r.first_error.clone());
        bail!(
            "{failed} request(s) failed; the first: {}",
            first.unwrap_or_default()
        );
    }
    Ok(())
}

/// Sends every request at its arrival time; returns the outcomes (in request
/// order) and the run's duration, from the first send to the last finish.
async fn drive(
    ctx: &Arc<client::Ctx>,
    requests: Vec<(Duration, Spec)>,
    max_concurrency: usize,
) -> (Vec<Outcome>, Duration) {
    let limit = Arc::new(tokio::sync::Semaphore::new(if max_concurrency == 0 {
        tokio::sync::Semaphore::MAX_PERMITS
    } else {
        max_concurrency
    }));
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(requests.len());
    for (at, spec) in requests {
        let ctx = ctx.clone();
        let limit = limit.clone();
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep_until((start + at).into()).await;
            let _permit = limit.acquire_owned().await;
            client::send(&ctx, &spec).await
        }));
    }
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(
            t.await
                .unwrap_or_else(|e| Outcome::failed(format!("task: {e}"))),
        );
    }
    let end = out
        .iter()
        .filter_map(|o| o.finished)
        .max()
        .unwrap_or_else(Instant::now);
    (out, end.saturating_duration_since(start))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_and_rates_parse_and_refuse_nonsense() {
        assert_eq!("8:16".parse::<LenRange>(), Ok(LenRange { min: 8, max: 16 }));
        assert_eq!("5".parse::<LenRange>(), Ok(LenRange { min: 5, max: 5 }));
        assert!("16:8".parse::<LenRange>().is_err());
        assert!("0".parse::<LenRange>().is_err());
        assert!("x:3".parse::<LenRange>().unwrap_err().contains("`x`"));
        assert!("inf".parse::<Rate>().unwrap().0.is_infinite());
        assert_eq!("2.5".parse::<Rate>(), Ok(Rate(2.5)));
        assert!("0".parse::<Rate>().is_err());
        assert!("-1".parse::<Rate>().is_err());
    }

    fn args(rate_seed: u64) -> BenchServeArgs {
        BenchServeArgs {
            url: String::new(),
            model: None,
            api_key: None,
            num_prompts: 4000,
            request_rate: vec![],
            input_len: LenRange { min: 3, max: 9 },
            output_len: LenRange { min: 2, max: 5 },
            max_concurrency: 0,
            shared_prefix: 0,
            max_token_id: 50,
            seed: rate_seed,
            warmup: 0,
            timeout: 1,
            logprobs: false,
            json: None,
        }
    }

    #[test]
    fn plans_are_seeded_poisson_within_the_ranges() {
        let p = |seed: u64, rate: f64| plan(&args(seed), Rate(rate), 4000, seed, 0);
        let a = p(1, 20.0);
        assert_eq!(a, p(1, 20.0));
        assert_ne!(a, p(2, 20.0));
        // the warm-up's draw: its own count and seed
        let w = plan(&args(1), Rate(f64::INFINITY), 7, !1, 0);
        assert_eq!(w.len(), 7);
        assert_ne!(w[0].1, a[0].1);
        for (_, s) in &a {
            assert!((3..=9).contains(&s.prompt.len()) && (2..=5).contains(&s.max_tokens));
            assert!(s.prompt.iter().all(|&id| id < 50));
        }
        // every length of the range occurs
        assert!((3..=9).all(|n| a.iter().any(|(_, s)| s.prompt.len() == n)));
        // mean inter-arrival 1/20 s, within 5 sigma of an exponential's mean
        let last = a.last().map(|(t, _)| t.as_secs_f64()).unwrap_or(0.0);
        let mean = last / (a.len() - 1) as f64;
        let sigma = 0.05 / ((a.len() - 1) as f64).sqrt();
        assert!((mean - 0.05).abs() < 5.0 * sigma, "mean gap {mean}");
        // `inf`: all at once
        assert!(p(1, f64::INFINITY).iter().all(|(t, _)| t.is_zero()));
    }

    #[test]
    fn each_run_draws_fresh_prompt_tokens_over_the_same_shape() {
        let mut a = args(3);
        a.shared_prefix = 5;
        let (first, second) = (
            plan(&a, Rate(8.0), 200, 3, 0),
            plan(&a, Rate(8.0), 200, 3, 1),
        );
        assert_eq!(first, plan(&a, Rate(8.0), 200, 3, 0));
        let mut same_tokens = 0;
        for ((t0, s0), (t1, s1)) in first.iter().zip(&second) {
            assert_eq!(
                (t0, s0.prompt.len(), s0.max_tokens),
                (t1, s1.prompt.len(), s1.max_tokens)
            );
            assert_eq!(s0.prompt[..5], s1.prompt[..5], "the shared prefix stays");
            same_tokens += usize::from(s0.prompt[5..] == s1.prompt[5..]);
        }
        // 3..=9 own tokens below 50: two draws agree by chance about never
        assert!(same_tokens <= 1, "{same_tokens} of 200 prompts repeated");
    }
}
