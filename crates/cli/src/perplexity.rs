//! `lamina perplexity`: the model's perplexity on a text, computed as
//! llama.cpp's `llama-perplexity` computes it by default, so the two
//! figures compare on the same weights and text; also the figure lossy
//! formats (FP8, Q8_0, Q4) are judged by against BF16.
//!
//! llama-perplexity's procedure: the whole text is tokenized once (BOS in
//! front when the model adds one: for a GGUF, as llama.cpp decides it from
//! the file's vocabulary, else as its tokenizer does; special-token strings stay
//! text) and cut into chunks of exactly `-c` tokens (what is left after the
//! last whole chunk is dropped); a chunk's first token is replaced by BOS
//! when the model adds one; each chunk runs as one prefill from position 0,
//! and only its second half is scored: the logits at positions `c/2` to
//! `c - 2` against the tokens that follow them, `c - 1 - c/2` tokens a
//! chunk. `ppl = exp(mean negative log-likelihood over every scored token)`.
//! A text under `2 c` tokens is refused, as llama-perplexity refuses it.
//!
//! `--score-all` scores every token of a chunk but the first instead (no
//! BOS, the last partial chunk too): about twice the tokens of the same
//! text, a steadier figure to compare weight formats by, not comparable
//! with llama-perplexity's.

use anyhow::{Context, Result, bail};
use contract::StepBuilder;
use serde::Serialize;
use std::path::Path;
use tokenizer::Tokenizer;

use crate::files::{TextFile, tokenize};
use crate::setup::{self, ModelArgs};

/// Tokens a chunk when `-c` is not given (llama-perplexity's default).
pub const DEFAULT_CTX: usize = 512;

#[derive(clap::Args, Debug)]
#[command(mut_arg("max_model_len", |a| a.help(
    "Tokens a chunk, each scored from its middle on (llama-perplexity's `-c`) [default: 512]"
)))]
pub struct PerplexityArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The text file to score: UTF-8, a regular file of at most 1 GiB.
    #[arg(long, short = 'f', visible_alias = "file")]
    pub text: std::path::PathBuf,
    /// Score only the first N chunks (llama-perplexity's `--chunks`)
    /// [default: all].
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub chunks: Option<usize>,
    /// Score every token of a chunk after its first, with no BOS, the last
    /// partial chunk too, instead of llama-perplexity's second halves:
    /// about twice the tokens of the same text (a steadier figure to
    /// compare weight formats by), not comparable with llama-perplexity.
    #[arg(long)]
    pub score_all: bool,
    /// Print one JSON object instead of a line.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct Report {
    perplexity: f64,
    tokens_scored: usize,
    chunks: usize,
    ctx_size: usize,
    /// `llama-perplexity` or `score-all`.
    procedure: &'static str,
    backend: String,
}

/// How a text's tokens are cut into chunks and which of their tokens count.
#[derive(Clone, Copy, Debug)]
struct Procedure {
    /// Tokens a chunk.
    ctx: usize,
    /// llama-perplexity's: BOS put in front of each chunk (when the model
    /// adds one), whole chunks only, the second half scored.
    llama: bool,
    bos: Option<u32>,
}

impl Procedure {
    /// The fewest tokens the text must hold.
    fn min_tokens(&self) -> usize {
        if self.llama { 2 * self.ctx } else { 2 }
    }

    /// The first position whose logits are scored (against the next token).
    fn first_scored(&self) -> usize {
        if self.llama { self.ctx / 2 } else { 0 }
    }

    /// The chunks of `ids` (the text's tokens, BOS included), at most
    /// `limit` of them, as they run: each from position 0.
    fn chunks<'a>(&'a self, ids: &'a [u32], limit: usize) -> impl Iterator<Item = Vec<u32>> + 'a {
        let least = if self.llama { self.ctx } else { 2 };
        ids.chunks(self.ctx)
            .filter(move |c| c.len() >= least)
            .take(limit)
            .map(|c| {
                let mut c = c.to_vec();
                if let Some(b) = self.bos {
                    c[0] = b;
                }
                c
            })
    }
}

/// The id llama-perplexity puts in front of the text and of each chunk
/// (BOS), if the model adds one. For a model imported from a GGUF, the
/// decision is llama.cpp's, read from that file
/// ([`checkpoint::gguf::file_adds_bos`], the one the importer wrote into
/// the tokenizer; read again so an older import agrees too); otherwise,
/// whether the tokenizer adds it.
fn bos_added(dir: &Path, tok: &Tokenizer) -> Result<Option<u32>> {
    if let Some(gguf) = checkpoint::store::source_gguf(dir)? {
        let adds = checkpoint::gguf::file_adds_bos(&gguf)
            .with_context(|| format!("reading the vocabulary of {}", gguf.display()))?;
        if !adds {
            return Ok(None);
        }
        return match tok.bos_id() {
            Some(b) => Ok(Some(b)),
            None => bail!(
                "{}: the vocabulary adds BOS but the tokenizer of {} names none (`bos_token`)",
                gguf.display(),
                dir.display()
            ),
        };
    }
    let with = tok.encode("a", true)?;
    let without = tok.encode("a", false)?;
    Ok((with.len() == without.len() + 1 && with[1..] == without[..]).then(|| with[0]))
}

pub fn run(args: PerplexityArgs) -> Result<()> {
    let ctx = args.model.max_model_len.unwrap_or(DEFAULT_CTX);
    let least = if args.score_all { 2 } else { 3 };
    if ctx < least {
        bail!("invalid `-c {ctx}` (--ctx-size): at least {least} tokens a chunk");
    }
    let mut text = TextFile::open(&args.text, "--text")?;
    let mut opened = setup::open_backend_alone(&args.model)?;
    let max_ctx = opened.backend.config().max_position_embeddings;
    if ctx > max_ctx {
        bail!("invalid `-c {ctx}` (--ctx-size): the model's context is {max_ctx} tokens");
    }
    let proc = Procedure {
        ctx,
        llama: !args.score_all,
        bos: if args.score_all {
            None
        } else {
            bos_added(&opened.dir, &opened.tokenizer)?
        },
    };
    let limit = args.chunks.unwrap_or(usize::MAX);
    let want = limit.saturating_mul(ctx).max(proc.min_tokens());
    let ids = tokenize(&mut text, &opened.tokenizer, proc.bos, want)?;
    if ids.len() < proc.min_tokens() {
        bail!(
            "--text {} holds {} tokens; {} needs at least {} (a longer text{})",
            args.text.display(),
            ids.len(),
            if proc.llama {
                "llama-perplexity's procedure, 2 chunks of -c,"
            } else {
                "--score-all"
            },
            proc.min_tokens(),
            if proc.llama { ", a smaller -c" } else { "" },
        );
    }
    let (nll, scored, chunks) = score(&mut *opened.backend, &proc, proc.chunks(&ids, limit))?;
    let report = Report {
        perplexity: (nll / scored as f64).exp(),
        tokens_scored: scored,
        chunks,
        ctx_size: ctx,
        procedure: if proc.llama {
            "llama-perplexity"
        } else {
            "score-all"
        },
        backend: opened.backend.name(),
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "perplexity {:.4} over {} tokens ({} chunks of {}, {}; {})",
            report.perplexity,
            report.tokens_scored,
            report.chunks,
            report.ctx_size,
            report.procedure,
            report.backend
        );
    }
    Ok(())
}

/// The summed negative log-likelihood of the scored tokens of `chunks`, how
/// many were scored, and the chunks run.
fn score(
    backend: &mut dyn contract::Backend,
    proc: &Procedure,
    chunks: impl Iterator<Item = Vec<u32>>,
) -> Result<(f64, usize, usize)> {
    let bs = backend.kv_shape().block_size;
    let blocks: Vec<u32> = (0..proc.ctx.div_ceil(bs) as u32).collect();
    if blocks.len() > backend.kv_shape().num_blocks {
        bail!(
            "invalid `-c {}` (--ctx-size): more than the KV pool holds",
            proc.ctx
        );
    }
    let vocab = backend.config().vocab_size;
    let first = proc.first_scored();
    let mut builder = StepBuilder::new(bs);
    let (mut nll, mut scored, mut run) = (0f64, 0usize, 0usize);
    for chunk in chunks {
        builder.begin();
        builder.push(&chunk, 0, &blocks, None)?;
        let rows: Vec<usize> = (first..chunk.len() - 1).collect();
        let logits = backend
            .logits(builder.finish(), &rows)
            .with_context(|| format!("chunk {}", run + 1))?; // [rows, vocab]
        for (row, &next) in logits.chunks(vocab).zip(&chunk[first + 1..]) {
            nll -= log_prob(row, next as usize);
            scored += 1;
        }
        run += 1;
    }
    Ok((nll, scored, run))
}

/// `log softmax(row)[token]`.
fn log_prob(row: &[f32], token: usize) -> f64 {
    row[token] as f64 - ops::sampling::log_sum_exp(row) as f64
}
