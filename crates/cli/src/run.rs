//! `lamina run [MODEL] [PROMPT]`, ollama's verb: with a prompt (or one
//! piped on stdin), one chat turn through the model's chat template,
//! streamed to stdout (`generate --chat`); without, on a terminal, the chat
//! REPL (`chat`).

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
    /// directory or a .gguf file.
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
        model_word,
        prompt,
    } = args;
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
