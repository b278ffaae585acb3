//! `lamina generate`: one prompt streamed to stdout (from the argument, or
//! from stdin when none is given), or many prompts (`--prompts-file`) run
//! concurrently through the engine with one JSON line each, in input order.
//!
//! After a single prompt the timings go to stderr (`timings.rs`), also with
//! `--json`, whose output stays the same for the same seed. A request the KV pool cannot
//! hold ends with a non-zero exit and the `--kv-blocks` that would fit it.
//! `--json-schema FILE` / `--regex R` constrain every prompt's output
//! (`engine::grammar`); a schema or regex the grammar engine refuses is an
//! error naming the flag.

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result, bail};
use engine::{Constraint, Event, FinishReason, RequestHandle, SubmitError};
use serde::Serialize;

use crate::progress::PrefillSpinner;
use crate::sampling_args::SamplingArgs;
use crate::setup::{self, ModelArgs};
use crate::timings::{Clock, Timings};
use crate::tokenize::TokenIds;
use runtime::Runtime;

#[derive(clap::Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Raw prompt token ids instead of a text prompt: `504,3575,282` (as
    /// `lamina tokenize` prints them), spaces or a JSON array also work.
    #[arg(long, conflicts_with_all = ["prompt_text", "prompts_file"])]
    pub prompt_tokens: Option<TokenIds>,
    /// Run every non-blank line of this file as a prompt, concurrently.
    #[arg(long, conflicts_with = "prompt_text")]
    pub prompts_file: Option<PathBuf>,
    /// The prompt text, as a flag (llama.cpp's `-p`); the positional
    /// PROMPT does the same.
    #[arg(long = "prompt", short = 'p', value_name = "TEXT")]
    pub prompt_text: Option<String>,
    /// Wrap the prompt in the model's chat template as one user message.
    #[arg(long)]
    pub chat: bool,
    /// A system message before the prompt (implies `--chat`).
    #[arg(long, value_name = "TEXT")]
    pub system: Option<String>,
    /// Print one JSON object per prompt instead of streaming text.
    #[arg(long)]
    pub json: bool,
    /// Constrain the output to JSON valid against the JSON schema in this
    /// file (constrained decoding through llguidance).
    #[arg(long, value_name = "FILE", conflicts_with = "regex")]
    pub json_schema: Option<PathBuf>,
    /// Constrain the output to text fully matching this regular expression.
    #[arg(long, value_name = "R")]
    pub regex: Option<String>,
    /// `[MODEL] PROMPT`: the prompt text, read from stdin when left out
    /// (or `-`); with two words the first is the model (as `--model`).
    /// With `--prompt`, `--prompt-tokens` or `--prompts-file`, one word:
    /// the model.
    #[arg(value_name = "[MODEL] PROMPT", num_args = 0..=2)]
    pub words: Vec<String>,
}

impl GenerateArgs {
    /// Splits the positional words into the model (when two are given)
    /// and the prompt; a prompt given twice is an error.
    fn take_words(&mut self) -> Result<()> {
        let mut words = std::mem::take(&mut self.words);
        let given = self.prompt_text.is_some()
            || self.prompt_tokens.is_some()
            || self.prompts_file.is_some();
        if given {
            if words.len() > 1 {
                bail!(
                    "the prompt is given twice: with `--prompt`, `--prompt-tokens` or `--prompts-file` the one positional word is the model"
                );
            }
            return crate::habits::positional_model(&mut self.model, words.pop());
        }
        self.prompt_text = words.pop();
        crate::habits::positional_model(&mut self.model, words.pop())
    }

    /// Whether the prompt goes through the chat template.
    fn chat(&self) -> bool {
        self.chat || self.system.is_some()
    }
}

/// What `--json` prints for one prompt.
#[derive(Debug, Serialize)]
pub struct Output {
    /// With `--prompts-file`: the prompt's 0-based position among the prompts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<usize>,
    /// With `--prompts-file`: the prompt's 1-based line in the file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<usize>,
    pub prompt_tokens: Vec<u32>,
    pub tokens: Vec<u32>,
    pub text: String,
    pub finish_reason: &'static str,
    /// Per generated token, the top-K `[id, logprob]` pairs, the chosen one first.
    pub logprobs: Option<Vec<Vec<(u32, f32)>>>,
    /// On stderr, never in the JSON (seeded runs print identical JSON).
    #[serde(skip)]
    pub timings: Option<Timings>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

pub fn run(mut args: GenerateArgs) -> Result<()> {
    args.take_words()?;
    // flags out of range fail before the model loads
    args.sampling
        .params(&contract::GenerationConfig::default())?;
    let prompts = read_prompts(&args)?;
    let constraint = constraint(&args)?;
    if args.model.lora.lora.len() > 1 {
        bail!(
            "`--lora`: `lamina generate` runs one adapter, {} were given",
            args.model.lora.lora.len()
        );
    }
    args.model.one_shot = Some(one_shot(&args, &prompts));
    let loaded = setup::open(&args.model, 0)?;
    tracing::info!("{}", args.sampling.describe(&loaded.model.generation));
    let encoded = prompts
        .iter()
        .map(|p| encode(&loaded, &p.prompt, args.chat(), args.system.as_deref()))
        .collect::<Result<Vec<_>>>()?;
    if args.prompts_file.is_some() {
        return run_many(&loaded, &args, prompts, encoded, constraint.as_ref());
    }
    let prompt = encoded.into_iter().next().context("no prompt")?;
    let handle = submit(&loaded, &args.sampling, prompt.clone(), constraint.as_ref())?;
    let interrupted = cancel_on_ctrl_c(&handle);
    let spinner = (!args.json)
        .then(|| spinner(&loaded, prompt.len()))
        .flatten();
    let out = collect(handle, prompt, args.sampling.logprobs, !args.json, spinner)?;
    loaded.engine.shutdown();
    let mut stdout = std::io::stdout().lock();
    if args.json {
        writeln!(stdout, "{}", serde_json::to_string(&out)?)?;
    } else {
        writeln!(stdout)?;
        if interrupted.load(Ordering::SeqCst) {
            eprintln!("[interrupted]");
        } else if out.finish_reason == FinishReason::Length.as_str() {
            eprintln!("[stopped at --max-tokens {}]", args.sampling.max_tokens);
        }
        if let Some(hint) = ended_at_once(&out, &args, &loaded) {
            eprintln!("{hint}");
        }
    }
    if let Some(t) = out.timings.as_ref().filter(|_| out.error.is_none()) {
        eprintln!("{t}");
    }
    if let Some(err) = &out.error {
        bail!("{}", failure(&loaded, err));
    }
    if interrupted.load(Ordering::SeqCst) {
        return Err(Interrupted.into());
    }
    Ok(())
}

/// A command stopped by Ctrl-C after reporting what it did (exit 130, no
/// error line).
#[derive(Debug)]
pub struct Interrupted;

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("interrupted")
    }
}

impl std::error::Error for Interrupted {}

/// Ctrl-C cancels the request (its timings are still printed); the flag
/// says whether it came. Without a handler Ctrl-C ends the process as usual.
fn cancel_on_ctrl_c(handle: &RequestHandle) -> Arc<AtomicBool> {
    let flag = Arc::new(AtomicBool::new(false));
    let (seen, canceller) = (flag.clone(), handle.canceller());
    if let Err(e) = ctrlc::set_handler(move || {
        seen.store(true, Ordering::SeqCst);
        canceller.cancel();
    }) {
        tracing::warn!("cannot install the Ctrl-C handler: {e}");
    }
    flag
}

/// The hint for a raw completion that ended before its first token (the
/// model's end-of-sequence came first, as an instruct model does when its
/// chat template is left out); `None` otherwise.
fn ended_at_once(out: &Output, args: &GenerateArgs, loaded: &Runtime) -> Option<String> {
    let eos_first = out.finish_reason == FinishReason::Stop.as_str()
        && out.tokens.len() == 1
        && out.text.is_empty()
        && args.sampling.stop.is_empty();
    if !eos_first || args.chat() {
        return None;
    }
    let mut hint = "[the model ended at once: its end-of-sequence token came first".to_string();
    if loaded.tokenizer.chat_template().is_some() {
        hint.push_str(
            "; an instruct model answers a chat turn: add `--chat` (raw completion wraps nothing), or use `lamina run MODEL \"PROMPT\"`",
        );
    }
    hint.push(']');
    Some(hint)
}

/// The prefill spinner for the one request of `generate` / `chat`.
pub fn spinner(loaded: &Runtime, prompt_len: usize) -> Option<PrefillSpinner> {
    PrefillSpinner::start(&loaded.engine, prompt_len, loaded.max_batch_tokens)
}

/// A failed request's message. (A request the KV pool could never hold is
/// refused at submit by the engine, with the flags that size the pool.)
/// The message of a request that ended with an error, naming the model.
pub fn failure(loaded: &Runtime, err: &str) -> String {
    format!("generation failed with model `{}`: {err}", loaded.model_id)
}

/// A prompt as given on the command line, and where in a prompts file.
struct Given {
    prompt: Prompt,
    line: Option<usize>,
}

/// A prompt's content.
enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
}

/// What the prompts will ask of the KV pool: a text's bytes bound its
/// tokens (each token covers at least one byte; the template's own tokens
/// are the pool's slack), plus `--max-tokens`, for each prompt at once.
fn one_shot(args: &GenerateArgs, prompts: &[Given]) -> runtime::OneShot {
    let system = args.system.as_ref().map_or(0, String::len);
    let longest = prompts
        .iter()
        .map(|g| match &g.prompt {
            Prompt::Text(t) => t.len() + system,
            Prompt::Tokens(ids) => ids.len(),
        })
        .max()
        .unwrap_or(0);
    runtime::OneShot {
        tokens: Some(longest.saturating_add(args.sampling.max_tokens)),
        sequences: prompts.len().min(args.model.max_num_seqs),
    }
}

fn read_prompts(args: &GenerateArgs) -> Result<Vec<Given>> {
    if let Some(ids) = &args.prompt_tokens {
        return Ok(vec![Given {
            prompt: Prompt::Tokens(ids.0.clone()),
            line: None,
        }]);
    }
    if let Some(path) = &args.prompts_file {
        return read_prompts_file(path);
    }
    let text = match args.prompt_text.as_deref() {
        Some("-") | None => read_stdin()?,
        Some(p) => p.to_string(),
    };
    Ok(vec![Given {
        prompt: Prompt::Text(text),
        line: None,
    }])
}

/// The prompt piped on stdin (one trailing newline dropped).
fn read_stdin() -> Result<String> {
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        bail!(
            "no prompt: give one as an argument (`lamina generate \"Once upon a time\"`), pipe it on stdin (`echo hi | lamina generate`), or use --prompt-tokens / --prompts-file"
        );
    }
    let mut text = String::new();
    stdin
        .lock()
        .read_to_string(&mut text)
        .context("cannot read the prompt from stdin")?;
    let text = text
        .strip_suffix('\n')
        .map(|t| t.strip_suffix('\r').unwrap_or(t))
        .unwrap_or(&text)
        .to_string();
    if text.trim().is_empty() {
        bail!(
            "no prompt: stdin was empty; give a prompt as an argument or pipe one in (`echo hi | lamina generate`)"
        );
    }
    Ok(text)
}

fn read_prompts_file(path: &std::path::Path) -> Result<Vec<Given>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read prompts file {}", path.display()))?;
    let mut prompts = Vec::new();
    let mut blank = Vec::new();
    for (i, l) in text.lines().enumerate() {
        if l.trim().is_empty() {
            blank.push((i + 1).to_string());
        } else {
            prompts.push(Given {
                prompt: Prompt::Text(l.to_string()),
                line: Some(i + 1),
            });
        }
    }
    // a blank last line is just the file's final newline, already dropped by `lines`
    if prompts.is_empty() {
        bail!(
            "prompts file {} has no prompts: it needs one prompt per line",
            path.display()
        );
    }
    if !blank.is_empty() {
        eprintln!(
            "note: {} blank line(s) of {} skipped (line {}); each output names its line",
            blank.len(),
            path.display(),
            blank.join(", ")
        );
    }
    Ok(prompts)
}

fn encode(loaded: &Runtime, prompt: &Prompt, chat: bool, system: Option<&str>) -> Result<Vec<u32>> {
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
            let mut msgs: Vec<_> = system
                .map(|s| tokenizer::ChatMessage::new("system", s))
                .into_iter()
                .collect();
            msgs.push(tokenizer::ChatMessage::new("user", text.clone()));
            Ok(loaded.tokenizer.encode_chat(&msgs)?)
        }
        Prompt::Text(text) => Ok(loaded.tokenizer.encode(text, true)?),
    }
}

/// The constraint of `--json-schema` / `--regex`; errors name the flag and file.
fn constraint(args: &GenerateArgs) -> Result<Option<Constraint>> {
    if let Some(path) = &args.json_schema {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read `--json-schema` {}", path.display()))?;
        let schema: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("`--json-schema` {} is not JSON", path.display()))?;
        return Ok(Some(Constraint::JsonSchema(schema)));
    }
    Ok(args.regex.clone().map(Constraint::Regex))
}

fn submit(
    loaded: &Runtime,
    sampling: &SamplingArgs,
    prompt: Vec<u32>,
    constraint: Option<&Constraint>,
) -> Result<RequestHandle> {
    let mut req = sampling.request(prompt, &loaded.model.generation)?;
    req.constraint = constraint.cloned();
    req.lora = crate::lora_args::single(&loaded.engine);
    loaded.engine.submit(req).map_err(|e| match e {
        SubmitError::Grammar(g) => {
            let flag = if g.kind == "regex" {
                "--regex"
            } else {
                "--json-schema"
            };
            anyhow::anyhow!("invalid `{flag}`: {}", g.reason)
        }
        e => crate::sampling_args::submit_error(e),
    })
}

/// Drains a request's events; with `stream`, prints text deltas as they
/// arrive. `spinner` (if any) is cleared at the first event.
pub fn collect(
    mut handle: RequestHandle,
    prompt_tokens: Vec<u32>,
    logprobs: Option<usize>,
    stream: bool,
    mut spinner: Option<PrefillSpinner>,
) -> Result<Output> {
    let mut out = Output {
        index: None,
        line: None,
        prompt_tokens,
        tokens: Vec::new(),
        text: String::new(),
        finish_reason: FinishReason::Error.as_str(),
        logprobs: logprobs.map(|_| Vec::new()),
        timings: None,
        error: None,
    };
    let mut clock = Clock::start();
    let stdout = std::io::stdout();
    while let Some(event) = handle.blocking_next() {
        if let Some(s) = spinner.take() {
            s.finish();
        }
        match event {
            Event::Token(t) => {
                clock.token();
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
                let u = done.usage;
                out.timings =
                    Some(clock.finish(u.prompt_tokens, u.cached_tokens, u.completion_tokens));
                return Ok(out);
            }
        }
    }
    out.error = Some("the engine stopped before the request finished".into());
    Ok(out)
}

fn run_many(
    loaded: &Runtime,
    args: &GenerateArgs,
    given: Vec<Given>,
    prompts: Vec<Vec<u32>>,
    constraint: Option<&Constraint>,
) -> Result<()> {
    let handles = prompts
        .into_iter()
        .map(|p| Ok((submit(loaded, &args.sampling, p.clone(), constraint)?, p)))
        .collect::<Result<Vec<_>>>()?;
    let logprobs = args.sampling.logprobs;
    let outputs: Vec<Result<Output>> = std::thread::scope(|s| {
        let joins: Vec<_> = handles
            .into_iter()
            .map(|(h, p)| s.spawn(move || collect(h, p, logprobs, false, None)))
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
    let mut failed = None;
    for (i, (out, g)) in outputs.into_iter().zip(&given).enumerate() {
        let mut out = out?;
        out.index = Some(i);
        out.line = g.line;
        let line = g.line.unwrap_or(i + 1);
        if let Some(e) = &out.error {
            failed.get_or_insert_with(|| (line, failure(loaded, e)));
        }
        let mut stdout = std::io::stdout().lock();
        if args.json {
            writeln!(stdout, "{}", serde_json::to_string(&out)?)?;
        } else {
            writeln!(
                stdout,
                "### prompt {} (line {line}, {})\n{}",
                i + 1,
                out.finish_reason,
                out.text
            )?;
        }
    }
    if let Some((line, why)) = failed {
        bail!("the prompt on line {line} failed: {why}");
    }
    Ok(())
}
