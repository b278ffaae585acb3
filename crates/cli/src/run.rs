//! `lamina run [MODEL] [PROMPT]`, ollama's verb: with a prompt (or one
//! piped on stdin), one chat turn through the model's chat template,
//! streamed to stdout (`generate --chat`); without, on a terminal, the chat
//! REPL (`chat`). A lone first word that names no model (`lamina run
//! "What is the capital of France?"`) is the prompt, for the default model
//! (or `--model`).

use std::io::IsTerminal;

use anyhow::Result;

use crate::chat::ChatArgs;
use crate::generate::GenerateArgs;
use crate::sampling_args::SamplingArgs;
use crate::setup::ModelArgs;

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// A system message opening the conversation.
    #[arg(long, value_name = "TEXT")]
    pub system: Option<String>,
    /// The model (as `--model`): a store id, a Hugging Face repo, a
    /// directory or a .gguf file. Alone, a word that names no model is the
    /// PROMPT.
    #[arg(value_name = "MODEL")]
    pub model_word: Option<String>,
    /// One message to answer; without it (and nothing piped on stdin), the
    /// chat REPL starts.
    #[arg(value_name = "PROMPT")]
    pub prompt: Option<String>,
}

pub fn run(args: RunArgs, verbose: u8) -> Result<()> {
    let RunArgs {
        mut model,
        sampling,
        system,
        mut model_word,
        mut prompt,
    } = args;
    // flags out of range fail before any note about the words given
    sampling.params(&contract::GenerationConfig::default())?;
    if prompt.is_none()
        && let Some(word) = model_word.take_if(|w| !crate::habits::names_a_model(w))
    {
        if !word.contains(char::is_whitespace) {
            eprintln!(
                "lamina: `{word}` names no model (`lamina list` shows the store): it is the prompt for {}",
                model.model
            );
        }
        prompt = Some(word);
    }
    crate::habits::positional_model(&mut model, model_word)?;
    if prompt.is_none() && std::io::stdin().is_terminal() {
        return crate::chat::run(
            ChatArgs {
                model,
                sampling,
                system,
                model_word: None,
            },
            verbose,
        );
    }
    // a prompt, or one piped on stdin (`generate` reads it)
    crate::generate::run(GenerateArgs {
        model,
        sampling,
        prompt_tokens: None,
        prompts_file: None,
        prompt_text: prompt,
        chat: true,
        system,
        json: false,
        json_schema: None,
        regex: None,
        words: Vec::new(),
    })
}
