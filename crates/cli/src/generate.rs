//! `lamina generate`: one prompt streamed to stdout, or many prompts
//! (`--prompts-file`) run concurrently through the engine with one JSON line
//! each, in input order.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use engine::{Event, FinishReason, RequestHandle};
use serde::Serialize;

use crate::sampling_args::SamplingArgs;
use crate::setup::{self, Loaded, ModelArgs};

#[derive(clap::Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Raw prompt token ids, comma-separated, instead of a text prompt.
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["prompt", "prompts_file"])]
    pub prompt_tokens: Option<Vec<u32>>,
    /// Run every line of this file as a prompt, concurrently.
    #[arg(long, conflicts_with = "prompt")]
    pub prompts_file: Option<PathBuf>,
    /// Wrap the prompt in the model's chat template as one user message.
    #[arg(long)]
    pub chat: bool,
    /// Print one JSON object per prompt instead of streaming text.
    #[arg(long)]
    pub json: bool,
    /// The prompt text.
    pub prompt: Option<String>,
}

/// What `--json` prints for one prompt.
#[derive(Debug, Serialize)]
pub struct Output {
    pub prompt_tokens: Vec<u32>,
    pub tokens: Vec<u32>,
    pub text: String,
    pub finish_reason: &'static str,
    /// Per generated token, the top-K `[id, logprob]` pairs, the chosen one first.
    pub logprobs: Option<Vec<Vec<(u32, f32)>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

pub fn run(args: GenerateArgs) -> Result<()> {
    let prompts = read_prompts(&args)?;
    let loaded = setup::open(&args.model, 0)?;
    let encoded = prompts
        .iter()
        .map(|p| encode(&loaded, p, args.chat))
        .collect::<Result<Vec<_>>>()?;
    if args.prompts_file.is_some() {
        return run_many(&loaded, &args, encoded);
    }
    let prompt = encoded.into_iter().next().context("no prompt")?;
    let handle = submit(&loaded, &args.sampling, prompt.clone())?;
    let out = collect(handle, prompt, args.sampling.logprobs, !args.json)?;
    loaded.engine.shutdown();
    if args.json {
        println!("{}", serde_json::to_string(&out)?);
    } else {
        println!();
    }
    if let Some(err) = out.error {
        bail!("generation failed: {err}");
    }
    Ok(())
}

/// A prompt as given on the command line.
enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
}

fn read_prompts(args: &GenerateArgs) -> Result<Vec<Prompt>> {
    if let Some(ids) = &args.prompt_tokens {
        if ids.is_empty() {
            bail!("invalid `--prompt-tokens`: no token ids given");
        }
        return Ok(vec![Prompt::Tokens(ids.clone())]);
    }
    if let Some(path) = &args.prompts_file {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read prompts file {}", path.display()))?;
        let lines: Vec<Prompt> = text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| Prompt::Text(l.to_string()))
            .collect();
        if lines.is_empty() {
            bail!("prompts file {} has no prompts", path.display());
        }
        return Ok(lines);
    }
    match &args.prompt {
        Some(p) => Ok(vec![Prompt::Text(p.clone())]),
        None => bail!("no prompt: give a prompt, --prompt-tokens or --prompts-file"),
    }
}

fn encode(loaded: &Loaded, prompt: &Prompt, chat: bool) -> Result<Vec<u32>> {
    let vocab = loaded.model.config.vocab_size;
    match prompt {
        Prompt::Tokens(ids) => {
            if let Some(bad) = ids.iter().find(|&&id| id as usize >= vocab) {
                bail!(
                    "invalid `--prompt-tokens`: token id {bad} is outside the vocabulary (size {vocab})"
                );
            }
            Ok(ids.clone())
        }
        Prompt::Text(text) if chat => {
            let msg = tokenizer::ChatMessage {
                role: "user".into(),
                content: text.clone(),
            };
            Ok(loaded.tokenizer.encode_chat(&[msg])?)
        }
        Prompt::Text(text) => Ok(loaded.tokenizer.encode(text, true)?),
    }
}

fn submit(loaded: &Loaded, sampling: &SamplingArgs, prompt: Vec<u32>) -> Result<RequestHandle> {
    let req = sampling.request(prompt, &loaded.model.generation)?;
    Ok(loaded.engine.submit(req)?)
}

/// Drains a request's events; with `stream`, prints text deltas as they arrive.
pub fn collect(
    mut handle: RequestHandle,
    prompt_tokens: Vec<u32>,
    logprobs: Option<usize>,
    stream: bool,
) -> Result<Output> {
    let mut out = Output {
        prompt_tokens,
        tokens: Vec::new(),
        text: String::new(),
        finish_reason: FinishReason::Error.as_str(),
        logprobs: logprobs.map(|_| Vec::new()),
        error: None,
    };
    let stdout = std::io::stdout();
    while let Some(event) = handle.blocking_next() {
        match event {
            Event::Token(t) => {
                out.tokens.push(t.token);
                out.text.push_str(&t.text);
                if let (Some(k), Some(lp)) = (logprobs, out.logprobs.as_mut()) {
                    let mut row = vec![(t.token, t.logprob)];
                    row.extend(
                        t.top_logprobs
                            .iter()
                            .copied()
                            .filter(|(id, _)| *id != t.token),
                    );
                    row.truncate(k.max(1));
                    lp.push(row);
                }
                if stream && !t.text.is_empty() {
                    let mut lock = stdout.lock();
                    lock.write_all(t.text.as_bytes())?;
                    lock.flush()?;
                }
            }
            Event::Done(done) => {
                out.finish_reason = done.reason.as_str();
                out.error = done.error;
                return Ok(out);
            }
        }
    }
    out.error = Some("the engine stopped before the request finished".into());
    Ok(out)
}

fn run_many(loaded: &Loaded, args: &GenerateArgs, prompts: Vec<Vec<u32>>) -> Result<()> {
    let handles = prompts
        .into_iter()
        .map(|p| Ok((submit(loaded, &args.sampling, p.clone())?, p)))
        .collect::<Result<Vec<_>>>()?;
    let logprobs = args.sampling.logprobs;
    let outputs: Vec<Result<Output>> = std::thread::scope(|s| {
        let joins: Vec<_> = handles
            .into_iter()
            .map(|(h, p)| s.spawn(move || collect(h, p, logprobs, false)))
            .collect();
        joins
            .into_iter()
            .map(|j| {
                j.join()
                    .unwrap_or_else(|_| bail!("a collector thread panicked"))
            })
            .collect()
    });
    loaded.engine.shutdown();
    for (i, out) in outputs.into_iter().enumerate() {
        let out = out?;
        if args.json {
            println!("{}", serde_json::to_string(&out)?);
        } else {
            println!("### prompt {} ({})\n{}", i + 1, out.finish_reason, out.text);
        }
    }
    Ok(())
}
