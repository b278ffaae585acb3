//! `lamina perplexity`: the model's perplexity on a text (llama.cpp's
//! `llama-perplexity`), the figure lossy formats (FP8, Q8_0, Q4) are judged
//! by against BF16 on the same text.
//!
//! The text is tokenized once (no BOS added) and cut into windows of
//! `--context` tokens; each window runs as one prefill on a fresh KV
//! range, and every position but the first of its window is scored:
//! `ppl = exp(-mean log p(token | window so far))`. Windows are independent,
//! so the figure depends only on the text, `--context` and the weights.
//! Prints the perplexity, the tokens scored and the windows; `--json` for
//! one JSON object.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use contract::StepBuilder;
use serde::Serialize;

use crate::setup::{self, ModelArgs};

#[derive(clap::Args, Debug)]
pub struct PerplexityArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The text file to score (UTF-8).
    #[arg(long)]
    pub text: PathBuf,
    /// Tokens per window (each scored from its second token on).
    #[arg(long, default_value_t = 512)]
    pub context: usize,
    /// Print one JSON object instead of a line.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct Report {
    perplexity: f64,
    tokens_scored: usize,
    windows: usize,
    context: usize,
    backend: String,
}

pub fn run(args: PerplexityArgs) -> Result<()> {
    if args.context < 2 {
        bail!(
            "invalid `--context {}`: at least 2 tokens per window",
            args.context
        );
    }
    let text = std::fs::read_to_string(&args.text)
        .with_context(|| format!("reading --text {}", args.text.display()))?;
    let mut opened = setup::open_backend_alone(&args.model)?;
    let ids = opened.tokenizer.encode(&text, false)?;
    let max_ctx = opened.backend.config().max_position_embeddings;
    if args.context > max_ctx {
        bail!(
            "invalid `--context {}`: the model's context is {max_ctx} tokens",
            args.context
        );
    }
    if ids.len() < 2 {
        bail!("--text {} holds fewer than 2 tokens", args.text.display());
    }
    let bs = opened.backend.kv_shape().block_size;
    let blocks: Vec<u32> = (0..args.context.div_ceil(bs) as u32).collect();
    if blocks.len() > opened.backend.kv_shape().num_blocks {
        bail!(
            "invalid `--context {}`: more than the KV pool holds",
            args.context
        );
    }
    let vocab = opened.backend.config().vocab_size;
    let mut builder = StepBuilder::new(bs);
    let (mut nll, mut scored, mut windows) = (0f64, 0usize, 0usize);
    for window in ids.chunks(args.context).filter(|w| w.len() >= 2) {
        builder.begin();
        builder.push(window, 0, &blocks, None)?;
        let rows: Vec<usize> = (0..window.len() - 1).collect();
        let logits = opened.backend.logits(builder.finish(), &rows)?; // [rows, vocab]
        for (row, &next) in logits.chunks(vocab).zip(&window[1..]) {
            nll -= log_prob(row, next as usize);
            scored += 1;
        }
        windows += 1;
    }
    let report = Report {
        perplexity: (nll / scored as f64).exp(),
        tokens_scored: scored,
        windows,
        context: args.context,
        backend: opened.backend.name(),
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "perplexity {:.4} over {} tokens ({} windows of up to {}; {})",
            report.perplexity, report.tokens_scored, report.windows, report.context, report.backend
        );
    }
    Ok(())
}

/// `log softmax(row)[token]`.
fn log_prob(row: &[f32], token: usize) -> f64 {
    row[token] as f64 - model::sampler::log_sum_exp(row) as f64
}
