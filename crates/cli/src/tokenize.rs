//! `lamina tokenize`: prints the token ids of a text (with the BOS the
//! model's tokenizer adds) as `504,3575,282`, the form `generate
//! --prompt-tokens` takes, or as JSON with their strings (which
//! `--prompt-tokens` takes too). The text comes from stdin when none is given.
//!
//! [`TokenIds`] is the parser of `--prompt-tokens`: ids separated by commas
//! and/or spaces, a JSON array of ids, or `tokenize --json`'s output.

use std::io::{IsTerminal, Read};
use std::str::FromStr;

use anyhow::{Context, Result, bail};
use tokenizer::Tokenizer;

#[derive(clap::Args, Debug)]
pub struct TokenizeArgs {
    /// Model id in the store (fetched on first use), a model directory or a .gguf file.
    #[arg(long, default_value = checkpoint::store::DEFAULT_MODEL)]
    pub model: String,
    /// Print `[{"id", "token"}]` instead of bare ids.
    #[arg(long)]
    pub json: bool,
    /// Do not add the special tokens (BOS) the tokenizer normally adds.
    #[arg(long)]
    pub no_special: bool,
    /// The text to tokenize; read from stdin when left out.
    pub text: Option<String>,
}

pub fn run(args: TokenizeArgs) -> Result<()> {
    let text = match args.text {
        Some(t) => t,
        None => {
            let stdin = std::io::stdin();
            if stdin.is_terminal() {
                bail!("no text: give it as an argument or pipe it on stdin");
            }
            let mut t = String::new();
            stdin
                .lock()
                .read_to_string(&mut t)
                .context("cannot read the text from stdin")?;
            t
        }
    };
    let dir = runtime::model_dir(&args.model)?;
    let tok = Tokenizer::from_dir(&dir)?;
    let ids = tok.encode(&text, !args.no_special)?;
    if args.json {
        let rows: Vec<serde_json::Value> = ids
            .iter()
            .map(|&id| serde_json::json!({"id": id, "token": tok.id_to_token(id)}))
            .collect();
        println!("{}", serde_json::Value::Array(rows));
    } else {
        let s: Vec<String> = ids.iter().map(u32::to_string).collect();
        println!("{}", s.join(","));
    }
    Ok(())
}

/// Token ids as `--prompt-tokens` takes them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenIds(pub Vec<u32>);

const FORMS: &str = "give ids like 504,3575,282 (as `lamina tokenize` prints them)";

impl FromStr for TokenIds {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let ids = if s.starts_with('[') {
            let v: serde_json::Value = serde_json::from_str(s)
                .map_err(|e| format!("not a JSON array of token ids ({e}); {FORMS}"))?;
            let items = v.as_array().map(Vec::as_slice).unwrap_or_default();
            items
                .iter()
                .map(|item| {
                    let id = item.get("id").unwrap_or(item);
                    id.as_u64()
                        .and_then(|x| u32::try_from(x).ok())
                        .ok_or_else(|| format!("`{item}` is not a token id; {FORMS}"))
                })
                .collect::<Result<Vec<u32>, String>>()?
        } else {
            s.split(|c: char| c == ',' || c.is_whitespace())
                .filter(|p| !p.is_empty())
                .map(|p| {
                    p.parse::<u32>()
                        .map_err(|_| format!("`{p}` is not a token id; {FORMS}"))
                })
                .collect::<Result<Vec<u32>, String>>()?
        };
        if ids.is_empty() {
            return Err(format!("no token ids given; {FORMS}"));
        }
        Ok(TokenIds(ids))
    }
}

#[cfg(test)]
mod tests {
    use super::TokenIds;

    #[test]
    fn every_printed_form_parses() {
        let want = TokenIds(vec![504, 3575, 282]);
        for s in [
            "504,3575,282",
            "504, 3575, 282",
            " 504 3575\t282\n",
            "[504, 3575, 282]",
            r#"[{"id":504,"token":"The"},{"id":3575,"token":"Ġcapital"},{"id":282,"token":"Ġof"}]"#,
        ] {
            assert_eq!(s.parse::<TokenIds>(), Ok(want.clone()), "{s}");
        }
        for (bad, needle) in [
            ("504,abc", "`abc` is not a token id"),
            ("-1", "`-1` is not a token id"),
            ("", "no token ids"),
            ("[1, \"x\"]", "is not a token id"),
            ("[1,", "not a JSON array"),
            ("99999999999", "is not a token id"),
        ] {
            let e = bad.parse::<TokenIds>().unwrap_err();
            assert!(
                e.contains(needle) && e.contains("504,3575,282"),
                "{bad}: {e}"
            );
        }
    }
}
