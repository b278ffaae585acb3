//! `lamina bench`: the workloads of `scripts/bench/torch_baseline.py`, run
//! through the engine on random prompt tokens, greedy, EOS ignored.
//!
//! - b1: one stream, `--b1-prompt` prompt tokens then `--b1-gen` tokens: decode tok/s
//!   (first to last token) and TTFT; then its floor (`bench_floor`): the
//!   rate at which a step would only read its weights and K/V at the copy
//!   bandwidth measured before the model loads, and b1's fraction of it.
//! - b2: time to first token for a `--b2-prompt`-token prompt (median of `--repeats`).
//! - b3: `--b3-batch` prompts of `--b3-prompt` tokens, `--b3-gen` new tokens each,
//!   submitted at once: output tok/s over the whole run, prefill included.
//! - s1: constrained decoding: `--s1-batch` prompts of
//!   `--s1-prompt` tokens, `--s1-gen` new tokens each, run once
//!   unconstrained and once held to a JSON schema (an array of at least
//!   10,000 small objects, so the grammar is live at every token and never
//!   ends early): both output tok/s and their ratio (the grammar's cost).
//!   An untimed round first captures the batch's decode graphs; the timed
//!   constrained run compiles its schema (the first request; the others
//!   start from the engine's cached copy) and pays every submit.
//! - lr: LoRA adapters' cost (`bench_lora`): b1's stream and b3's batch on
//!   the base model and with rank-16 adapters on all seven targets (one;
//!   eight spread over the batch), and their ratios. Not run by default;
//!   it raises `--max-loras` to 8 when it is lower.
//!
//! Defaults are the baseline's sizes on CUDA and smaller ones on the CPU
//! (where the baseline's would run for tens of minutes): see [`Sizes`].
//! Each workload prints a progress line to stderr as it starts and as its
//! requests finish.
//!
//! With `--llama-bench PATH` (see [`crate::llama_bench`]) llama.cpp's
//! `llama-bench` runs on the same machine and thread count (on CUDA with
//! every layer on the GPU: a llama.cpp built with CUDA), on
//! `--llama-gguf` (default: `--model` when it is a .gguf file, else the GGUF
//! whose Q8_0 / Q4_1 / Q4_K / Q6_K blocks lamina runs with `--dtype auto`) with b2's
//! prompt and b1's generated token counts, its decode after b1's prompt of
//! context (`-d`), alternating with lamina's b1 and
//! b2 for `--rounds` rounds (default 3), so that a machine whose speed
//! drifts from minute to minute slows both sides of a round alike. Each
//! round prints both figures and lamina's ratio (prompt processing: b2
//! prompt tokens / b2 TTFT; decode: b1); the summary gives every figure's
//! and every ratio's median over the rounds, with the ratios' range.
//!
//! One file on purpose: the workloads share one harness, one set of sizes and
//! one report (text and JSON), which the baseline script mirrors field for
//! field.
//!
//! One file past the usual size on purpose: the workloads share the sizes,
//! the prompt generator and the report; each is a short function over them.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use contract::SamplingParams;
use contract::sampling::splitmix64;
use engine::{Constraint, Event, GenerateRequest, RequestHandle};
use serde_json::json;

use crate::bench_floor::{self, Floor};
use crate::llama_bench::{self, LlamaRates, LlamaRun};
use crate::setup::{self, ModelArgs};

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Comma-separated workloads among b1, b2, b3, s1, lr and sp (s1 and lr
    /// are not run by default; sp, speculative decoding with and without, runs
    /// last whenever --speculative is given, and the others then run plain).
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
    /// With `--llama-bench`: rounds of lamina's b1 and b2 alternating with
    /// one llama-bench run each (medians over the rounds are reported).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Write the results as JSON here too.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
    /// A llama.cpp `llama-bench` binary to run alternately with lamina's b1
    /// and b2, on the same machine, for a side-by-side comparison (its
    /// decode after `--b1-prompt` tokens of context, as b1's; with
    /// `--device cuda` every layer on the GPU, so a llama.cpp built with
    /// CUDA; `scripts/build-llama-bench.sh` builds a CPU one).
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
pub(crate) struct Timing {
    pub ttft: Duration,
    pub decode: Duration,
    pub tokens: usize,
}

pub fn run(args: BenchArgs) -> Result<()> {
    if args.repeats == 0 {
        bail!("invalid `--repeats`: must be at least 1");
    }
    if args.rounds == 0 {
        bail!("invalid `--rounds`: must be at least 1");
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
    let mut model_args = args.model.clone();
    if args.workloads.iter().any(|w| w == "lr") {
        let slots = (model_args.lora.options()?.slots()).max(crate::bench_lora::ADAPTERS);
        model_args.lora.max_loras = Some(slots);
    }
    // before the model loads: the copy's buffers never compete with the KV pool
    let copy = (args.workloads.iter().any(|w| w == "b1"))
        .then(|| bench_floor::measure_copy(args.model.device.runtime()))
        .flatten();
    let loaded = setup::open(&model_args, 0)?;
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
    println!("lamina: {}", loaded.sizing);
    let z = Sizes::resolve(&args, loaded.cuda);
    let floor = copy.map(|c| {
        let (w, cfg) = (&loaded.weight_bytes, &loaded.model.config);
        Floor::new(w, cfg, loaded.sizing.kv_dtype, (z.b1_prompt, z.b1_gen), c)
    });
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
            // with --speculative only the sp workload drafts
            speculative: false,
            lora: None,
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
    let rounds = if llama_gguf.is_some() { args.rounds } else { 1 };
    // (the method only: the engines' own is resolved for the device)
    let spec = args.model.spec.config(true)?;
    let mut workloads = args.workloads.clone();
    if spec.is_some() && !workloads.iter().any(|w| w == "sp") {
        workloads.push("sp".into());
    }
    // one figure per round: b1 decode tok/s, b2 TTFT ms, llama.cpp's rates
    let (mut b1_rates, mut b2_ms, mut llama) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let tag = if rounds > 1 {
            eprintln!("bench: round {}/{rounds}", round + 1);
            format!("round {}/{rounds}: ", round + 1)
        } else {
            String::new()
        };
        for w in &workloads {
            // b3 and s1 are not compared with llama.cpp: once is enough
            if round > 0 && !matches!(w.as_str(), "b1" | "b2") {
                continue;
            }
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
                        "{tag}b1 single stream ({} prompt, {} new): {r:.1} tok/s decode ({:.3} ms/token)",
                        z.b1_prompt,
                        z.b1_gen,
                        1e3 / r
                    );
                    if let Some(f) = &floor {
                        println!("{tag}{}", f.line(r));
                    }
                    b1_rates.push(r);
                }
                "b2" => {
                    let mut ms = Vec::new();
                    for i in 0..args.repeats {
                        let t = time(submit(prompt(z.b2_prompt), 1)?)?;
                        ms.push(t.ttft.as_secs_f64() * 1e3);
                        eprintln!("bench: b2 run {}/{} done", i + 1, args.repeats);
                    }
                    let m = median(ms);
                    println!("{tag}b2 TTFT {} tokens: {m:.2} ms", z.b2_prompt);
                    b2_ms.push(m);
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
                "sp" => {
                    let Some(spec) = &spec else {
                        bail!("the sp workload needs `--speculative ngram|suffix|draft:MODEL`");
                    };
                    let method = spec.method.name();
                    crate::bench_spec::run(
                        &loaded.engine,
                        method,
                        &mut prompt,
                        &z,
                        args.repeats,
                        &loaded.tokenizer,
                        &mut res,
                    )?;
                }
                "lr" => crate::bench_lora::run(
                    &loaded.engine,
                    &loaded.model.config,
                    &mut prompt,
                    &z,
                    args.repeats,
                    &mut res,
                )?,
                other => {
                    bail!(
                        "invalid `--workloads`: unknown workload `{other}` (b1, b2, b3, s1, lr, sp)"
                    )
                }
            }
        }
        if let (Some(bin), Some(gguf)) = (&args.llama_bench, &llama_gguf) {
            let r = run_llama(bin, gguf, &z, args.repeats, loaded.cuda)?;
            print_ratios(&tag, b1_rates.last(), b2_ms.last(), &z, &r);
            llama.push(r);
        }
    }
    loaded.engine.shutdown();
    if let Some(f) = floor.filter(|_| !b1_rates.is_empty()) {
        res.insert("b1_floor".into(), f.json(median(b1_rates.clone())));
    }
    summarize(&z, &b1_rates, &b2_ms, &llama, &mut res);
    let res = serde_json::Value::Object(res);
    println!("{res}");
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&res)?)?;
    }
    Ok(())
}

/// Runs llama-bench once with lamina's sizes (`repeats` repetitions) and
/// prints its rates.
fn run_llama(
    bin: &std::path::Path,
    gguf: &std::path::Path,
    z: &Sizes,
    repeats: usize,
    gpu: bool,
) -> Result<LlamaRates> {
    let threads = rayon::current_num_threads();
    let on = match gpu {
        true => "every layer on the GPU".to_string(),
        false => format!("{threads} threads"),
    };
    eprintln!("bench: llama-bench ({on}) ...");
    let r = llama_bench::run(
        bin,
        gguf,
        LlamaRun {
            threads,
            gpu,
            prompt: z.b2_prompt,
            generate: z.b1_gen,
            depth: z.b1_prompt,
            repeats,
        },
    )?;
    println!(
        "llama.cpp ({on}, {}): prompt processing {} tokens {:.1} tok/s, decode {} tokens after {} of context {:.1} tok/s",
        gguf.display(),
        z.b2_prompt,
        r.prompt_tok_s,
        z.b1_gen,
        z.b1_prompt,
        r.decode_tok_s
    );
    Ok(r)
}

/// Prompt tokens per second of a b2 TTFT.
fn prompt_rate(z: &Sizes, ttft_ms: f64) -> f64 {
    z.b2_prompt as f64 / (ttft_ms / 1e3).max(1e-9)
}

/// lamina's prompt-processing rate (from a b2 TTFT) over llama.cpp's.
fn prompt_ratio(z: &Sizes, ttft_ms: f64, r: &LlamaRates) -> f64 {
    prompt_rate(z, ttft_ms) / r.prompt_tok_s
}

/// One round's ratios, printed after its llama-bench line.
fn print_ratios(tag: &str, b1: Option<&f64>, b2_ms: Option<&f64>, z: &Sizes, r: &LlamaRates) {
    if let Some(&ms) = b2_ms {
        let x = prompt_ratio(z, ms, r);
        println!("{tag}lamina / llama.cpp prompt processing: {x:.2}x");
    }
    if let Some(&tok_s) = b1 {
        let x = tok_s / r.decode_tok_s;
        println!("{tag}lamina / llama.cpp decode: {x:.2}x");
    }
}

/// The medians over the rounds into `res` (and, for several rounds, the
/// summary lines; every round's ratio under `*_rounds`).
fn summarize(
    z: &Sizes,
    b1: &[f64],
    b2_ms: &[f64],
    llama: &[LlamaRates],
    res: &mut serde_json::Map<String, serde_json::Value>,
) {
    let rounds = b1.len().max(b2_ms.len());
    let many = rounds > 1;
    if !b1.is_empty() {
        let r = median(b1.to_vec());
        if many {
            println!("b1 decode, median of {rounds} rounds: {r:.1} tok/s");
        }
        res.insert("b1_decode_tok_s".into(), json!(r));
    }
    if !b2_ms.is_empty() {
        let m = median(b2_ms.to_vec());
        if many {
            println!(
                "b2 TTFT {} tokens, median of {rounds} rounds: {m:.2} ms",
                z.b2_prompt
            );
        }
        res.insert("b2_ttft_ms".into(), json!(m));
        res.insert("b2_prompt_tok_s".into(), json!(prompt_rate(z, m)));
    }
    if llama.is_empty() {
        return;
    }
    let pick = |f: fn(&LlamaRates) -> f64| median(llama.iter().map(f).collect());
    res.insert("llama_prompt_tok_s".into(), json!(pick(|r| r.prompt_tok_s)));
    res.insert("llama_decode_tok_s".into(), json!(pick(|r| r.decode_tok_s)));
    // each round's ratio pairs figures taken minutes apart at most
    let mut ratio = |key: &str, what: &str, ratios: Vec<f64>| {
        if ratios.is_empty() {
            return;
        }
        let m = median(ratios.clone());
        let (lo, hi) = ratios
            .iter()
            .fold((f64::INFINITY, 0f64), |(a, b), &x| (a.min(x), b.max(x)));
        if many {
            println!(
                "lamina / llama.cpp {what}: {m:.2}x (median of {} rounds, {lo:.2}-{hi:.2}x)",
                ratios.len()
            );
        }
        res.insert(key.into(), json!(m));
        res.insert(format!("{key}_rounds"), json!(ratios));
    };
    let prompt: Vec<f64> = b2_ms
        .iter()
        .zip(llama)
        .map(|(&ms, r)| prompt_ratio(z, ms, r))
        .collect();
    ratio("ratio_prompt", "prompt processing", prompt);
    let decode: Vec<f64> = b1
        .iter()
        .zip(llama)
        .map(|(&tok_s, r)| tok_s / r.decode_tok_s)
        .collect();
    ratio("ratio_decode", "decode", decode);
}

pub(crate) fn time(mut h: RequestHandle) -> Result<Timing> {
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

/// The middle value (the mean of the two middle ones for an even count).
pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n.is_multiple_of(2) {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    } else {
        v[n / 2]
    }
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
pub(crate) fn drain_all(handles: Vec<RequestHandle>, label: &str) -> Result<usize> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 2.5);
    }

    #[test]
    fn each_round_is_paired_with_its_own_llama_run() {
        let z = Sizes {
            b2_prompt: 512,
            ..Sizes::CPU
        };
        let rates = |p, d| LlamaRates {
            prompt_tok_s: p,
            decode_tok_s: d,
        };
        // round 2 is slow on both sides: paired ratios stay at 1.0x, 1.0x, 2.0x
        let b1 = [100.0, 50.0, 200.0];
        let b2_ms = [512.0, 1024.0, 256.0];
        let llama = [
            rates(1000.0, 100.0),
            rates(500.0, 50.0),
            rates(1000.0, 100.0),
        ];
        let mut res = serde_json::Map::new();
        summarize(&z, &b1, &b2_ms, &llama, &mut res);
        assert_eq!(res["ratio_prompt_rounds"], json!([1.0, 1.0, 2.0]));
        assert_eq!(res["ratio_prompt"], json!(1.0));
        assert_eq!(res["ratio_decode_rounds"], json!([1.0, 1.0, 2.0]));
        assert_eq!(res["b1_decode_tok_s"], json!(100.0));
        assert_eq!(res["b2_ttft_ms"], json!(512.0));
        assert_eq!(res["llama_prompt_tok_s"], json!(1000.0));
    }
}
