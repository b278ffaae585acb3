//! `lamina chat`: an interactive multi-turn REPL over the model's chat
//! template. Each turn re-encodes the whole conversation (the prefix cache
//! makes the shared part cheap) and streams the reply.
//!
//! Commands: `/reset` clears the conversation, `/exit` (or end of input) quits.

use std::io::{BufRead, Write};

use anyhow::Result;
use tokenizer::ChatMessage;

use crate::generate::collect;
use crate::sampling_args::SamplingArgs;
use crate::setup::{self, ModelArgs};

#[derive(clap::Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// A system message opening the conversation.
    #[arg(long)]
    pub system: Option<String>,
}

pub fn run(args: ChatArgs) -> Result<()> {
    let loaded = setup::open(&args.model, 0)?;
    let mut messages = initial(&args);
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    eprintln!(
        "chatting with {} (/reset clears, /exit quits)",
        loaded.model_id
    );
    loop {
        eprint!("> ");
        std::io::stderr().flush()?;
        let Some(line) = lines.next() else { break };
        let line = line?;
        match line.trim() {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                messages = initial(&args);
                eprintln!("(conversation cleared)");
                continue;
            }
            _ => {}
        }
        messages.push(ChatMessage {
            role: "user".into(),
            content: line,
        });
        let prompt = loaded.tokenizer.encode_chat(&messages)?;
        let req = args
            .sampling
            .request(prompt.clone(), &loaded.model.generation)?;
        let handle = match loaded.engine.submit(req) {
            Ok(h) => h,
            Err(e) => {
                // the turn is dropped, the conversation so far is kept
                messages.pop();
                eprintln!("error: {e}");
                continue;
            }
        };
        let out = collect(handle, prompt, None, true)?;
        println!();
        if let Some(err) = out.error {
            messages.pop();
            eprintln!("error: {err}");
            continue;
        }
        messages.push(ChatMessage {
            role: "assistant".into(),
            content: out.text,
        });
    }
    loaded.engine.shutdown();
    Ok(())
}

fn initial(args: &ChatArgs) -> Vec<ChatMessage> {
    args.system
        .iter()
        .map(|s| ChatMessage {
            role: "system".into(),
            content: s.clone(),
        })
        .collect()
}
