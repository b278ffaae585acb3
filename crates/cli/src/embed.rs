//! `lamina embed`: one embedding per text, the texts given as arguments or
//! read from stdin (every non-empty line), printed as JSON lines in input
//! order: `{"index": i, "tokens": n, "embedding": [...]}`. A vector is the
//! model's final hidden state pooled (`--pooling`) and L2-normalised, the
//! same as `/v1/embeddings` returns; texts are tokenized with the
//! tokenizer's special tokens and embedded together by the engine (one
//! request of every text).

use std::io::{BufRead, IsTerminal, Write};

use anyhow::{Context, Result, bail};
use engine::{EmbedRequest, Pooling};

use crate::setup::{self, ModelArgs};

#[derive(clap::Args, Debug)]
pub struct EmbedArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// How a text's final hidden states become one vector (then
    /// L2-normalised): `last` (the last token's state) or `mean`.
    #[arg(long, default_value = "last")]
    pub pooling: Pooling,
    /// The texts to embed; every non-empty line of stdin when left out.
    pub texts: Vec<String>,
}

pub fn run(args: EmbedArgs) -> Result<()> {
    let texts = match args.texts.is_empty() {
        false => args.texts.clone(),
        true => stdin_lines()?,
    };
    if texts.is_empty() {
        bail!("no text to embed: give texts as arguments or lines on stdin");
    }
    let loaded = setup::open(&args.model, 0)?;
    let inputs = (texts.iter())
        .map(|t| loaded.tokenizer.encode(t, true))
        .collect::<Result<Vec<_>, _>>()
        .context("cannot tokenize a text")?;
    let lens: Vec<usize> = inputs.iter().map(Vec::len).collect();
    let req = EmbedRequest {
        inputs,
        pooling: args.pooling,
    };
    let done = (loaded.engine.embed(req))
        .and_then(|h| h.blocking_wait())
        .map_err(|e| match e.input().and_then(|i| texts.get(i)) {
            // the engine counts inputs from 0, as the output's `index`
            Some(t) => anyhow::anyhow!("{e} (the text starting {:?})", preview(t)),
            None => anyhow::anyhow!("{e}"),
        });
    loaded.engine.shutdown();
    let done = done?;
    let mut out = std::io::stdout().lock();
    for (index, (v, tokens)) in done.vectors.iter().zip(lens).enumerate() {
        let line = serde_json::json!({"index": index, "tokens": tokens, "embedding": v});
        writeln!(out, "{line}")?;
    }
    Ok(())
}

/// The first characters of `text`, to name it in an error.
fn preview(text: &str) -> String {
    const CHARS: usize = 40;
    match text.char_indices().nth(CHARS) {
        Some((end, _)) => format!("{}...", &text[..end]),
        None => text.to_string(),
    }
}

/// Every non-empty line of stdin (not a terminal).
fn stdin_lines() -> Result<Vec<String>> {
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        bail!("no text: give texts as arguments or pipe lines on stdin");
    }
    let mut texts = Vec::new();
    for line in stdin.lock().lines() {
        let line = line.context("cannot read stdin")?;
        if !line.trim().is_empty() {
            texts.push(line);
        }
    }
    Ok(texts)
}

#[cfg(test)]
mod tests {
    use super::preview;

    #[test]
    fn a_text_is_named_by_its_first_characters() {
        assert_eq!(preview("a cat"), "a cat");
        let long = "é".repeat(50);
        assert_eq!(preview(&long), format!("{}...", "é".repeat(40)));
    }
}
