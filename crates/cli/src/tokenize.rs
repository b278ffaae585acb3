//! `lamina tokenize`: prints the token ids of a text (with the BOS the
//! model's tokenizer adds), comma-separated, or as JSON with their strings.

use anyhow::Result;
use tokenizer::Tokenizer;

#[derive(clap::Args, Debug)]
pub struct TokenizeArgs {
    /// Model id in the store (fetched on first use) or a model directory.
    #[arg(long, default_value = checkpoint::store::DEFAULT_MODEL)]
    pub model: String,
    /// Print `[{"id", "token"}]` instead of bare ids.
    #[arg(long)]
    pub json: bool,
    /// Do not add the special tokens (BOS) the tokenizer normally adds.
    #[arg(long)]
    pub no_special: bool,
    /// The text to tokenize.
    pub text: String,
}

pub fn run(args: TokenizeArgs) -> Result<()> {
    let dir = crate::setup::model_dir(&args.model)?;
    let tok = Tokenizer::from_dir(&dir)?;
    let ids = tok.encode(&args.text, !args.no_special)?;
    if args.json {
        let rows: Vec<serde_json::Value> = ids
            .iter()
            .map(|&id| serde_json::json!({"id": id, "token": tok.id_to_token(id)}))
            .collect();
        println!("{}", serde_json::Value::Array(rows));
    } else {
        let s: Vec<String> = ids.iter().map(u32::to_string).collect();
        println!("{}", s.join(", "));
    }
    Ok(())
}
