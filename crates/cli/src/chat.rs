//! `lamina chat`: an interactive multi-turn REPL over the model's chat
//! template, on a line editor (rustyline: editing, history kept in
//! `$LAMINA_HOME/chat_history`). Each turn re-encodes the whole conversation
//! (the prefix cache makes the shared part cheap) and streams the reply.
//!
//! Ctrl-C while a reply is written cancels that request (a SIGINT handler
//! holds its `engine::Canceller`); the partial reply stays in the
//! conversation, marked `[interrupted]`. A reply cut at `--max-tokens` is
//! marked too. Commands and `"""` input: [`crate::repl`]; `/set`:
//! [`crate::chat_set`]. Pasted text arrives whole: bracketed paste puts it
//! in one line, and without it the lines after the first stay buffered for
//! the next read (rustyline's `buffer-redux`). With `-v`, each
//! reply is followed by its timings on stderr.

use std::io::Write;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use engine::{Canceller, FinishReason};
use rustyline::DefaultEditor;
use rustyline::error::ReadlineError;

use crate::chat_set::{self, Change};
use crate::generate::{collect, failure, spinner};
use crate::repl::{self, Conversation, Input};
use crate::sampling_args::SamplingArgs;
use crate::setup::{self, ModelArgs};
use runtime::Runtime;

#[derive(clap::Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// A system message opening the conversation.
    #[arg(long)]
    pub system: Option<String>,
    /// The model (as `--model`).
    #[arg(value_name = "MODEL")]
    pub model_word: Option<String>,
}

/// The request being answered, for the Ctrl-C handler.
type Current = Arc<Mutex<Option<Canceller>>>;

pub fn run(mut args: ChatArgs, verbose: u8) -> Result<()> {
    crate::habits::positional_model(&mut args.model, args.model_word.take())?;
    // flags out of range fail before the model loads
    args.sampling
        .params(&contract::GenerationConfig::default())?;
    // one conversation, up to the context
    args.model.one_shot = Some(runtime::OneShot {
        tokens: None,
        sequences: 1,
    });
    let loaded = setup::open(&args.model, 0)?;
    let current: Current = Arc::default();
    let handler_sees = current.clone();
    ctrlc::set_handler(move || {
        let guard = handler_sees.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = guard.as_ref() {
            c.cancel();
        }
    })
    .context("cannot install the Ctrl-C handler")?;
    let mut rl = DefaultEditor::new().context("cannot start the line editor")?;
    let history = checkpoint::store::home().join("chat_history");
    // a first session has no history file yet
    let _ = rl.load_history(&history);
    let mut conv = Conversation {
        system: args.system.clone(),
        turns: Vec::new(),
    };
    eprintln!(
        "chatting with {} ({}); /help lists the commands, /bye or Ctrl-D quits",
        loaded.model_id,
        args.sampling.describe(&loaded.model.generation)
    );
    let mut multi: Option<String> = None;
    loop {
        let prompt = if multi.is_some() { "... " } else { ">>> " };
        let line = match rl.readline(prompt) {
            Ok(line) => line,
            Err(ReadlineError::Interrupted) => {
                if multi.take().is_some() {
                    eprintln!("(multi-line message dropped)");
                } else {
                    eprintln!("(Ctrl-D or /bye quits)");
                }
                continue;
            }
            Err(ReadlineError::Eof) => {
                println!();
                break;
            }
            Err(e) => return Err(e).context("cannot read the terminal"),
        };
        if let Some(buf) = multi.as_mut() {
            if let Some(text) = repl::continue_multi(buf, &line) {
                multi = None;
                let _ = rl.add_history_entry(format!("\"\"\"{text}\"\"\""));
                turn(&loaded, &args, &current, &mut conv, text, verbose)?;
            }
            continue;
        }
        let input = repl::parse(&line);
        if !matches!(input, Input::Empty | Input::OpenMulti(_)) {
            let _ = rl.add_history_entry(line.as_str());
        }
        match input {
            Input::Empty => {}
            Input::Message(text) => turn(&loaded, &args, &current, &mut conv, text, verbose)?,
            Input::OpenMulti(first) => multi = Some(first),
            Input::Help => eprintln!("{}", repl::HELP),
            Input::Clear => {
                conv.turns.clear();
                eprintln!("(conversation cleared)");
            }
            Input::System(text) => set_system(&mut conv, text),
            Input::ShowSettings => eprintln!(
                "({}; system message: {})",
                chat_set::describe(&args.sampling, &loaded.model.generation),
                conv.system
                    .as_deref()
                    .map_or("none".into(), |s| format!("{s:?}"))
            ),
            Input::Set { name, value } => {
                let defaults = &loaded.model.generation;
                match chat_set::apply(&mut args.sampling, defaults, &name, &value) {
                    Ok(Change::Sampling(line)) => eprintln!("({line})"),
                    Ok(Change::System(text)) => set_system(&mut conv, text),
                    Err(e) => eprintln!("error: {e:#}"),
                }
            }
            Input::Save(path) => match conv.save(&path) {
                Ok(()) => eprintln!(
                    "(saved {} messages to {})",
                    conv.messages().len(),
                    path.display()
                ),
                Err(e) => eprintln!("error: {e:#}"),
            },
            Input::Load(path) => match Conversation::load(&path) {
                Ok(c) => {
                    conv = c;
                    eprintln!(
                        "(loaded {} messages from {})",
                        conv.messages().len(),
                        path.display()
                    );
                }
                Err(e) => eprintln!("error: {e:#}"),
            },
            Input::Bye => break,
            Input::Bad(hint) => eprintln!("{hint}"),
        }
    }
    if let Some(dir) = history.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    if let Err(e) = rl.save_history(&history) {
        tracing::warn!("cannot save the chat history to {}: {e}", history.display());
    }
    loaded.engine.shutdown();
    Ok(())
}

/// One user message and the streamed reply; a failed turn is dropped with
/// its message, the conversation before it kept.
fn turn(
    loaded: &Runtime,
    args: &ChatArgs,
    current: &Current,
    conv: &mut Conversation,
    text: String,
    verbose: u8,
) -> Result<()> {
    conv.turns.push(repl::msg("user", &text));
    let prompt = loaded.tokenizer.encode_chat(&conv.messages())?;
    let submitted = args
        .sampling
        .request(prompt.clone(), &loaded.model.generation)
        .map(|mut req| {
            req.lora = crate::lora_args::single(&loaded.engine);
            req
        })
        .and_then(|req| (loaded.engine.submit(req)).map_err(crate::sampling_args::submit_error));
    let handle = match submitted {
        Ok(h) => h,
        Err(e) => {
            conv.turns.pop();
            eprintln!("error: {e:#}");
            return Ok(());
        }
    };
    set_current(current, Some(handle.canceller()));
    let spin = spinner(loaded, prompt.len());
    let out = collect(handle, prompt, None, true, spin);
    set_current(current, None);
    let out = out?;
    let mut stdout = std::io::stdout();
    writeln!(stdout)?;
    stdout.flush()?;
    if let Some(err) = &out.error {
        conv.turns.pop();
        eprintln!("error: {}", failure(loaded, err));
        return Ok(());
    }
    if out.finish_reason == FinishReason::Cancelled.as_str() {
        eprintln!("[interrupted: the partial reply stays in the conversation]");
    } else if out.finish_reason == FinishReason::Length.as_str() {
        eprintln!("[reply cut at --max-tokens {}]", args.sampling.max_tokens);
    }
    if verbose > 0
        && let Some(t) = &out.timings
    {
        eprintln!("{t}");
    }
    conv.turns.push(repl::msg("assistant", &out.text));
    Ok(())
}

fn set_system(conv: &mut Conversation, text: String) {
    conv.system = Some(text);
    conv.turns.clear();
    eprintln!("(system message set, conversation cleared)");
}

fn set_current(current: &Current, c: Option<Canceller>) {
    *current.lock().unwrap_or_else(|p| p.into_inner()) = c;
}
