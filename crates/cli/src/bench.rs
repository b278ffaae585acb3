//! `lamina bench`: the workloads of `../shared/bench/torch_baseline.py`, run
//! through the engine on random prompt tokens, greedy, EOS ignored.
//!
//! - b1: one stream, `--b1-prompt` prompt tokens then `--b1-gen` tokens: decode tok/s
//!   (first to last token) and TTFT.
//! - b2: time to first token for a `--b2-prompt`-token prompt (median of `--repeats`).
//! - b3: `--b3-batch` prompts of `--b3-prompt` tokens, `--b3-gen` new tokens each,
//!   submitted at once: output tok/s over the whole run, prefill included.
//! - s1: constrained decoding (issue 9): `--s1-batch` prompts of
//!   `--s1-prompt` tokens, `--s1-gen` new tokens each, run once
//!   unconstrained and once held to a JSON schema (an array of at least
//!   10,000 small objects, so the grammar is live at every token and never
//!   ends early): both output tok/s and their ratio (the grammar's cost).
//!   An untimed round first captures the batch's decode graphs; the timed
//!   constrained run compiles its schema (the first request; the others
//!   start from the engine's cached copy) and pays every submit.
//!
//! Defaults are the baseline's sizes on CUDA and smaller ones on the CPU
//! (where the baseline's would run for tens of minutes): see [`Sizes`].
//! Each workload prints a progress line to stderr as it starts and as its
//! requests finish.
//!
//! With `--llama-bench PATH` (see [`crate::llama_bench`]) llama.cpp's
//! `llama-bench` runs right after, on the same machine and thread count, on
//! `--llama-gguf` (default: `--model` when it is a .gguf file, else the GGUF
//! whose Q8_0 / Q4_1 / Q4_K / Q6_K blocks lamina runs with `--dtype auto`) with b2's
//! prompt and b1's generated token counts; both figures and lamina's ratio
//! (prompt processing: b2 prompt tokens / b2 TTFT; decode: b1) are printed.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use contract::SamplingParams;
use contract::sampling::splitmix64;
use engine::{Constraint, Event, GenerateRequest, RequestHandle};
use serde_json::json;

use crate::llama_bench::{self, LlamaRun};
use crate::setup::{self, ModelArgs};

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Comma-separated workloads among b1, b2, b3, s1 (s1 is not run by default).
    #[arg(long, default_value = "b1,b2,b3", value_delimiter = ',')]
    pub workloads: Vec<String>,
    /// b1 prompt tokens [default: 128 on CUDA, 32 on the CPU].
    #[arg(long)]
    pub b1_prompt: Option<usize>,
    /// b1 generated tokens [default: 256 on CUDA, 32 on the CPU].
    #[arg(long)]
    pub b1_gen: Option<usize>,
    /// b2 prompt tokens [default: 2048 on CUDA, 256 on the CPU].
    #[arg(long)]
    pub b2_prompt: Option<usize>,
    /// b3 requests [default: 256 on CUDA, 8 on the CPU].
    #[arg(long)]
    pub b3_batch: Option<usize>,
    /// b3 prompt tokens each [default: 512 on CUDA, 64 on the CPU].
    #[arg(long)]
    pub b3_prompt: Option<usize>,
    /// b3 generated tokens each [default: 256 on CUDA, 32 on the CPU].
    #[arg(long)]
    pub b3_gen: Option<usize>,
    /// s1 requests [default: 64 on CUDA, 8 on the CPU].
    #[arg(long)]
    pub s1_batch: Option<usize>,
    /// s1 prompt tokens each [default: 128 on CUDA, 32 on the CPU].
    #[arg(long)]
    pub s1_prompt: Option<usize>,
    /// s1 generated tokens each [default: 256 on CUDA, 24 on the CPU].
    #[arg(long)]
    pub s1_gen: Option<usize>,
    /// Timed repetitions of b1 and b2 (the median is reported).
    #[arg(long, default_value_t = 3)]
    pub repeats: usize,
    /// Write the results as JSON here too.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
    /// A llama.cpp `llama-bench` binary to run after lamina's workloads, on
    /// the same machine, for a side-by-side comparison
    /// (`scripts/build-llama-bench.sh` builds one).
    #[arg(long)]
    pub llama_bench: Option<std::path::PathBuf>,
    /// The model as a .gguf file for llama-bench [default: --model when it
    /// is a .gguf file].
    #[arg(long)]
    pub llama_gguf: Option<std::path::PathBuf>,
}

/// The workload sizes in effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizes {
    pub b1_prompt: usize,
    pub b1_gen: usize,
    pub b2_prompt: usize,
    pub b3_batch: usize,
    pub b3_prompt: usize,
    pub b3_gen: usize,
    pub s1_batch: usize,
    pub s1_prompt: usize,
    pub s1_gen: usize,
}

impl Sizes {
    /// The baseline's sizes (`torch_baseline.py`).
    pub const CUDA: Sizes = Sizes {
        b1_prompt: 128,
        b1_gen: 256,
        b2_prompt: 2048,
        b3_batch: 256,
        b3_prompt: 512,
        b3_gen: 256,
        s1_batch: 64,
        s1_prompt: 128,
        s1_gen: 256,
    };
    /// About a minute for SmolLM2-135M on two cores.
    pub const CPU: Sizes = Sizes {
        b1_prompt: 32,
        b1_gen: 32,
        b2_prompt: 256,
        b3_batch: 8,
        b3_prompt: 64,
        b3_gen: 32,
        s1_batch: 8,
        s1_prompt: 32,
        s1_gen: 24,
    };

    /// The device's defaults with the flags given applied.
    fn resolve(args: &BenchArgs, cuda: bool) -> Sizes {
        let d = if cuda { Sizes::CUDA } else { Sizes::CPU };
        Sizes {
            b1_prompt: args.b1_prompt.unwrap_or(d.b1_prompt),
            b1_gen: args.b1_gen.unwrap_or(d.b1_gen),
            b2_prompt: args.b2_prompt.unwrap_or(d.b2_prompt),
            b3_batch: args.b3_batch.unwrap_or(d.b3_batch),
            b3_prompt: args.b3_prompt.unwrap_or(d.b3_prompt),
            b3_gen: args.b3_gen.unwrap_or(d.b3_gen),
            s1_batch: args.s1_batch.unwrap_or(d.s1_batch),
            s1_prompt: args.s1_prompt.unwrap_or(d.s1_prompt),
            s1_gen: args.s1_gen.unwrap_or(d.s1_gen),
        }
    }
}

/// Timings of one request.
struct Timing {
    ttft: Duration,
    decode: Duration,
    tokens: usize,
}

pub fn run(args: BenchArgs) -> Result<()> {
    if args.repeats == 0 {
        bail!("invalid `--repeats`: must be at least 1");
    }
    if args.llama_bench.is_some()
        && args.llama_gguf.is_none()
        && !args.model.model.ends_with(".gguf")
        && args.model.dtype != setup::DtypeArg::Auto
    {
        bail!(
            "`--llama-bench` needs the model as a .gguf file: give `--llama-gguf PATH` (or a .gguf `--model`, or `--dtype auto` on a model imported from a GGUF)"
        );
    }
    let loaded = setup::open(&args.model, 0)?;
    let llama_gguf = match (&args.llama_bench, &args.llama_gguf) {
        (None, _) => None,
        (Some(_), Some(g)) => Some(g.clone()),
        (Some(_), None) if args.model.model.ends_with(".gguf") => {
            Some(args.model.model.clone().into())
        }
        (Some(_), None) => match &loaded.weights_gguf {
            Some(g) => Some(g.clone()),
            None => bail!(
                "`--llama-bench` needs the model as a .gguf file: give `--llama-gguf PATH` (`{}` runs no GGUF's blocks)",
                args.model.model
            ),
        },
    };
    println!("lamina: {}", loaded.backend_name);
    let z = Sizes::resolve(&args, loaded.cuda);
    if !loaded.cuda {
        eprintln!(
            "bench: CPU backend: smaller default sizes than the baseline's (b1 {}+{}, b2 {}, b3 {} x {}+{}); give --b1-prompt etc. to change them",
            z.b1_prompt, z.b1_gen, z.b2_prompt, z.b3_batch, z.b3_prompt, z.b3_gen
        );
    }
    let vocab = loaded.model.config.vocab_size as u64;
    let mut rng = 0u64;
    let mut prompt = |n: usize| -> Vec<u32> {
        (0..n)
            .map(|_| {
                rng += 1;
                (splitmix64(rng) % vocab) as u32
            })
            .collect()
    };
    let submit_with = |p: Vec<u32>, n: usize, c: Option<Constraint>| -> Result<RequestHandle> {
        Ok(loaded.engine.submit(GenerateRequest {
            prompt: p,
            sampling: SamplingParams::greedy(),
            max_tokens: n,
            stop: Vec::new(),
            ignore_eos: true,
            stop_token_ids: Vec::new(),
            constraint: c,
        })?)
    };
    let submit = |p: Vec<u32>, n: usize| submit_with(p, n, None);
    let mut res = serde_json::Map::new();
    res.insert(
        "engine".into(),
        json!(format!("lamina {}", env!("CARGO_PKG_VERSION"))),
    );
    res.insert("model".into(), json!(loaded.model_id));
    res.insert(
        "sizes".into(),
        json!({"b1_prompt": z.b1_prompt, "b1_gen": z.b1_gen, "b2_prompt": z.b2_prompt,
               "b3_batch": z.b3_batch, "b3_prompt": z.b3_prompt, "b3_gen": z.b3_gen,
               "s1_batch": z.s1_batch, "s1_prompt": z.s1_prompt, "s1_gen": z.s1_gen}),
    );
    // warm-up: first-use costs (graph capture, page faults) stay out of the figures
    time(submit(prompt(16), 4)?)?;
    for w in &args.workloads {
        eprintln!("bench: {w} ...");
        match w.as_str() {
            "b1" => {
                let mut rates = Vec::new();
                for i in 0..args.repeats {
                    let t = time(submit(prompt(z.b1_prompt), z.b1_gen)?)?;
                    eprintln!("bench: b1 run {}/{} done", i + 1, args.repeats);
                    let steps = t.tokens.saturating_sub(1).max(1);
                    rates.push(steps as f64 / t.decode.as_secs_f64().max(1e-9));
                }
                let r = median(rates);
                println!(
                    "b1 single stream ({} prompt, {} new): {r:.1} tok/s decode ({:.3} ms/token)",
                    z.b1_prompt,
                    z.b1_gen,
                    1e3 / r
                );
                res.insert("b1_decode_tok_s".into(), json!(r));
            }
            "b2" => {
                let mut ms = Vec::new();
                for i in 0..args.repeats {
                    let t = time(submit(prompt(z.b2_prompt), 1)?)?;
                    ms.push(t.ttft.as_secs_f64() * 1e3);
                    eprintln!("bench: b2 run {}/{} done", i + 1, args.repeats);
                }
                let m = median(ms);
                println!("b2 TTFT {} tokens: {m:.2} ms", z.b2_prompt);
                res.insert("b2_ttft_ms".into(), json!(m));
                res.insert(
                    "b2_prompt_tok_s".into(),
                    json!(z.b2_prompt as f64 / (m / 1e3).max(1e-9)),
                );
            }
            "b3" => {
                let before = loaded.engine.stats();
                let start = Instant::now();
                let handles = (0..z.b3_batch)
                    .map(|_| submit(prompt(z.b3_prompt), z.b3_gen))
                    .collect::<Result<Vec<_>>>()?;
                let total = drain_all(handles, "b3")?;
                let rate = total as f64 / start.elapsed().as_secs_f64();
                println!(
                    "b3 throughput {} x ({} in, {} out): {rate:.0} output tok/s",
                    z.b3_batch, z.b3_prompt, z.b3_gen
                );
                res.insert("b3_out_tok_s".into(), json!(rate));
                let after = loaded.engine.stats();
                let ms = |a: u64, b: u64| (a - b) as f64 / 1e6;
                let steps = after.steps_total - before.steps_total;
                let backend = ms(after.backend_ns_total, before.backend_ns_total);
                let host = ms(after.host_ns_total, before.host_ns_total);
                println!(
                    "b3 steps: {steps}, backend {backend:.1} ms ({:.3} ms/step), host between steps {host:.1} ms",
                    backend / steps.max(1) as f64
                );
                res.insert("b3_steps".into(), json!(steps));
                res.insert("b3_backend_ms".into(), json!(backend));
                res.insert("b3_host_ms".into(), json!(host));
            }
            "s1" => {
                // the token trie is built at the first constrained request:
                // once, before anything is timed
                let warm = submit_with(prompt(8), 1, Some(Constraint::JsonObject))?;
                drain_all(vec![warm], "s1 warm-up")?;
                // A first, untimed round captures the decode graphs of the
                // batch's buckets (with and without the sampler) and warms
                // cuBLAS for both runs; it uses another schema, so the timed
                // constrained run still compiles its own once (its first
                // request; the others start from the engine's cached copy).
                let mut rates = Vec::new();
                for (timed, schema) in [(false, s1_schema(15)), (true, s1_schema(16))] {
                    rates.clear();
                    for constrained in [false, true] {
                        let label = match (timed, constrained) {
                            (false, _) => "warm-up round",
                            (true, false) => "unconstrained",
                            (true, true) => "JSON schema",
                        };
                        let c = constrained.then(|| Constraint::JsonSchema(schema.clone()));
                        // fresh prompts per run: the prefix cache must not serve the second
                        let prompts: Vec<Vec<u32>> =
                            (0..z.s1_batch).map(|_| prompt(z.s1_prompt)).collect();
                        let before = loaded.engine.stats();
                        let start = Instant::now();
                        let handles = prompts
                            .into_iter()
                            .map(|p| submit_with(p, z.s1_gen, c.clone()))
                            .collect::<Result<Vec<_>>>()?;
                        // submitting compiles (or copies) each request's
                        // schema, one after another on this thread (the
                        // server does it in parallel, per connection)
                        let submitted = start.elapsed();
                        let total = drain_all(handles, &format!("s1 {label}"))?;
                        rates.push(total as f64 / start.elapsed().as_secs_f64());
                        if !timed {
                            continue;
                        }
                        println!(
                            "s1 {label}: submitting {} requests took {:.1} ms (included in the rate)",
                            z.s1_batch,
                            submitted.as_secs_f64() * 1e3
                        );
                        // the grammar work is done at landing, inside the scheduler's time
                        let after = loaded.engine.stats();
                        let steps = (after.steps_total - before.steps_total).max(1) as f64;
                        let per = |a: u64, b: u64| (a - b) as f64 / 1e6 / steps;
                        println!(
                            "s1 {label}: {steps} steps, backend {:.3} ms/step, scheduler (grammar included) {:.3} ms/step",
                            per(after.backend_ns_total, before.backend_ns_total),
                            per(after.schedule_ns_total, before.schedule_ns_total),
                        );
                    }
                }
                let ratio = rates[1] / rates[0].max(1e-9);
                println!(
                    "s1 constrained decoding {} x ({} in, {} out): unconstrained {:.0} output tok/s, JSON schema {:.0} output tok/s, ratio {ratio:.3} (cost {:.1}%)",
                    z.s1_batch,
                    z.s1_prompt,
                    z.s1_gen,
                    rates[0],
                    rates[1],
                    (1.0 - ratio) * 100.0
                );
                res.insert("s1_free_out_tok_s".into(), json!(rates[0]));
                res.insert("s1_json_out_tok_s".into(), json!(rates[1]));
                res.insert("s1_ratio".into(), json!(ratio));
            }
            other => {
                bail!("invalid `--workloads`: unknown workload `{other}` (b1, b2, b3, s1)")
            }
        }
    }
    loaded.engine.shutdown();
    if let (Some(bin), Some(gguf)) = (&args.llama_bench, &llama_gguf) {
        compare_llama(bin, gguf, &z, args.repeats, &mut res)?;
    }
    let res = serde_json::Value::Object(res);
    println!("{res}");
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&res)?)?;
    }
    Ok(())
}

/// Runs llama-bench with lamina's sizes and prints both and the ratios.
fn compare_llama(
    bin: &std::path::Path,
    gguf: &std::path::Path,
    z: &Sizes,
    repeats: usize,
    res: &mut serde_json::Map<String, serde_json::Value>,
) -> Result<()> {
    let threads = rayon::current_num_threads();
    eprintln!("bench: llama-bench ({threads} threads) ...");
    let r = llama_bench::run(
        bin,
        gguf,
        LlamaRun {
            threads,
            prompt: z.b2_prompt,
            generate: z.b1_gen,
            repeats,
        },
    )?;
    println!(
        "llama.cpp ({threads} threads, {}): prompt processing {} tokens {:.1} tok/s, decode {} tokens {:.1} tok/s",
        gguf.display(),
        z.b2_prompt,
        r.prompt_tok_s,
        z.b1_gen,
        r.decode_tok_s
    );
    res.insert("llama_prompt_tok_s".into(), json!(r.prompt_tok_s));
    res.insert("llama_decode_tok_s".into(), json!(r.decode_tok_s));
    let ratio = |ours: Option<&serde_json::Value>, theirs: f64| {
        ours.and_then(|v| v.as_f64()).map(|v| v / theirs)
    };
    if let Some(x) = ratio(res.get("b2_prompt_tok_s"), r.prompt_tok_s) {
        println!("lamina / llama.cpp prompt processing: {x:.2}x");
        res.insert("ratio_prompt".into(), json!(x));
    }
    if let Some(x) = ratio(res.get("b1_decode_tok_s"), r.decode_tok_s) {
        println!("lamina / llama.cpp decode: {x:.2}x");
        res.insert("ratio_decode".into(), json!(x));
    }
    Ok(())
}

fn time(mut h: RequestHandle) -> Result<Timing> {
    let start = Instant::now();
    let mut first = None;
    let mut tokens = 0;
    while let Some(ev) = h.blocking_next() {
        match ev {
            Event::Token(_) => {
                tokens += 1;
                first.get_or_insert_with(Instant::now);
            }
            Event::Done(d) => {
                if let Some(e) = d.error {
                    bail!("benchmark request failed: {e}");
                }
                let first = first.unwrap_or_else(Instant::now);
                return Ok(Timing {
                    ttft: first - start,
                    decode: first.elapsed(),
                    tokens,
                });
            }
        }
    }
    bail!("the engine stopped during the benchmark")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// s1's schema: an array of at least 10,000 small objects, so the grammar
/// constrains every token and never lets a request end early (names of at
/// most `max_name` characters: the warm-up round's schema differs).
fn s1_schema(max_name: u32) -> serde_json::Value {
    json!({
        "type": "array",
        "minItems": 10000,
        "items": {
            "type": "object",
            "properties": {
                "id": {"type": "integer"},
                "name": {"type": "string", "maxLength": max_name},
                "ok": {"type": "boolean"}
            },
            "required": ["id", "name", "ok"],
            "additionalProperties": false
        }
    })
}

/// Waits for every request (one thread each), printing progress; returns
/// the tokens they generated.
fn drain_all(handles: Vec<RequestHandle>, label: &str) -> Result<usize> {
    let n = handles.len();
    let finished = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        let finished = &finished;
        let joins: Vec<_> = handles
            .into_iter()
            .map(|h| {
                s.spawn(move || {
                    let t = time(h);
                    let k = finished.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                    if k.is_multiple_of(n.div_ceil(8).max(1)) || k == n {
                        eprintln!("bench: {label} {k}/{n} requests done");
                    }
                    t
                })
            })
            .collect();
        joins
            .into_iter()
            .map(|j| {
                j.join()
                    .map_err(|_| anyhow::anyhow!("bench thread panicked"))?
                    .map(|t| t.tokens)
            })
            .sum::<Result<usize>>()
    })
}
