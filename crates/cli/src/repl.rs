//! The chat REPL's input language and conversation state, apart from the
//! terminal: a line is a message or a `/command`; `"""` opens a multi-line
//! message closed by a line ending in `"""`; the conversation saves to and
//! loads from JSON (`[{"role", "content"}]`, the OpenAI messages shape).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use tokenizer::ChatMessage;

pub const HELP: &str = "\
commands:
  /help          this list
  /clear         forget the conversation (the system message stays)
  /system TEXT   set the system message (and clear the conversation)
  /set NAME VAL  change a setting: temperature, top_p, top_k, min_p,
                 max_tokens, seed, repetition_penalty, stop, system...
  /set           show the settings in effect
  /save FILE     write the conversation to FILE as JSON
  /load FILE     read a conversation written by /save
  /bye           quit (also /exit, Ctrl-D)
input:
  \"\"\"            start a multi-line message; a line ending in \"\"\" sends it
  paste          pasted lines arrive whole (one message on a terminal with
                 bracketed paste; else wrap them in \"\"\")
  Ctrl-C         stop the reply being written (the conversation is kept),
                 or clear the line being typed
  Up / Down      history (kept across sessions)";

/// What one line of input asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// Nothing (a blank line).
    Empty,
    /// A message to the model.
    Message(String),
    /// The first line of a `"""` message (text after the quotes, if any).
    OpenMulti(String),
    Help,
    Clear,
    System(String),
    /// `/set NAME VALUE` (ollama's `/set parameter NAME VALUE` too).
    Set {
        name: String,
        value: String,
    },
    /// `/set` alone: show the settings.
    ShowSettings,
    Save(PathBuf),
    Load(PathBuf),
    Bye,
    /// A command that does not exist or lacks its argument: the hint to show.
    Bad(String),
}

/// Parses one line typed at the prompt.
pub fn parse(line: &str) -> Input {
    let t = line.trim();
    if t.is_empty() {
        return Input::Empty;
    }
    if let Some(rest) = t.strip_prefix("\"\"\"") {
        // `"""text"""` on one line is a complete message
        // (a pasted block carries its own line breaks)
        let rest = rest.trim_start_matches(['\r', '\n']);
        if let Some(whole) = rest.strip_suffix("\"\"\"") {
            return Input::Message(whole.trim_end_matches(['\r', '\n']).to_string());
        }
        return Input::OpenMulti(rest.to_string());
    }
    let Some(cmd) = line.trim_end().strip_prefix('/') else {
        return Input::Message(line.to_string());
    };
    let (name, arg) = match cmd.split_once(char::is_whitespace) {
        Some((n, a)) => (n, a.trim()),
        None => (cmd, ""),
    };
    let need = |what: &str| Input::Bad(format!("/{name} needs {what}: /{name} {what}"));
    match name {
        "help" | "?" => Input::Help,
        "clear" | "reset" => Input::Clear,
        "bye" | "exit" | "quit" => Input::Bye,
        "system" if arg.is_empty() => need("TEXT"),
        "system" => Input::System(arg.to_string()),
        "set" if arg.is_empty() => Input::ShowSettings,
        "set" => {
            let arg = arg.strip_prefix("parameter ").map_or(arg, str::trim_start);
            let (name, value) = arg.split_once(char::is_whitespace).unwrap_or((arg, ""));
            Input::Set {
                name: name.to_string(),
                value: value.trim().to_string(),
            }
        }
        "save" if arg.is_empty() => need("FILE"),
        "save" => Input::Save(PathBuf::from(arg)),
        "load" if arg.is_empty() => need("FILE"),
        "load" => Input::Load(PathBuf::from(arg)),
        _ => Input::Bad(format!(
            "unknown command /{name}: /help lists the commands (start a message with a space to send a slash)"
        )),
    }
}

/// Feeds one more line to an open `"""` message: `Some(text)` when the line
/// closes it.
pub fn continue_multi(buf: &mut String, line: &str) -> Option<String> {
    let (body, closed) = match line.trim_end().strip_suffix("\"\"\"") {
        Some(body) => (body, true),
        None => (line, false),
    };
    // a closing `"""` alone on its line adds no empty last line
    if !(closed && body.trim().is_empty()) {
        if !buf.is_empty() {
            buf.push('\n');
        }
        buf.push_str(body);
    }
    closed.then(|| std::mem::take(buf))
}

/// The conversation so far, with its system message kept apart.
#[derive(Debug, Clone, Default)]
pub struct Conversation {
    pub system: Option<String>,
    pub turns: Vec<ChatMessage>,
}

impl Conversation {
    /// Every message, the system message first.
    pub fn messages(&self) -> Vec<ChatMessage> {
        let sys = self.system.iter().map(|s| msg("system", s));
        sys.chain(self.turns.iter().cloned()).collect()
    }

    pub fn save(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(&self.messages())?;
        std::fs::write(path, text + "\n")
            .with_context(|| format!("cannot write {}", path.display()))
    }

    /// Reads a conversation written by [`Conversation::save`].
    pub fn load(path: &Path) -> Result<Conversation> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let all: Vec<ChatMessage> = serde_json::from_str(&text).with_context(|| {
            format!(
                "{} is not a saved conversation (a JSON list of {{\"role\", \"content\"}})",
                path.display()
            )
        })?;
        let mut conv = Conversation::default();
        for (i, m) in all.into_iter().enumerate() {
            match m.role.as_str() {
                "system" if i == 0 => conv.system = Some(m.content),
                "user" | "assistant" => conv.turns.push(m),
                other => bail!(
                    "{}: message {} has role `{other}` (expected a first `system`, then `user` / `assistant`)",
                    path.display(),
                    i + 1
                ),
            }
        }
        Ok(conv)
    }
}

pub fn msg(role: &str, content: &str) -> ChatMessage {
    ChatMessage::new(role, content)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_parse_to_commands_and_messages() {
        assert_eq!(parse("  "), Input::Empty);
        assert_eq!(parse("hi there"), Input::Message("hi there".into()));
        assert_eq!(parse("/help"), Input::Help);
        assert_eq!(parse("/bye"), Input::Bye);
        assert_eq!(parse("/system be brief "), Input::System("be brief".into()));
        assert_eq!(parse("/save c.json"), Input::Save("c.json".into()));
        assert_eq!(parse("/set"), Input::ShowSettings);
        let set = |n: &str, v: &str| Input::Set {
            name: n.into(),
            value: v.into(),
        };
        assert_eq!(parse("/set temperature 0.2"), set("temperature", "0.2"));
        assert_eq!(parse("/set parameter top_k 5"), set("top_k", "5"));
        assert_eq!(
            parse("/set system Be  brief. "),
            set("system", "Be  brief.")
        );
        assert!(matches!(parse("/save"), Input::Bad(h) if h.contains("/save FILE")));
        assert!(
            matches!(parse("/bogus x"), Input::Bad(h) if h.contains("unknown command /bogus") && h.contains("/help"))
        );
        assert_eq!(
            parse(" /not a command"),
            Input::Message(" /not a command".into())
        );
        assert_eq!(parse("\"\"\"first"), Input::OpenMulti("first".into()));
        assert_eq!(
            parse("\"\"\"one line\"\"\""),
            Input::Message("one line".into())
        );
        // a bracketed paste arrives as one line holding its line breaks
        assert_eq!(
            parse("\"\"\"\nfirst\nsecond\n\"\"\""),
            Input::Message("first\nsecond".into())
        );
        assert_eq!(parse("a\nb"), Input::Message("a\nb".into()));
    }

    #[test]
    fn multi_line_messages_close_on_triple_quotes() {
        let mut buf = "first".to_string();
        assert_eq!(continue_multi(&mut buf, "second"), None);
        assert_eq!(
            continue_multi(&mut buf, "third\"\"\""),
            Some("first\nsecond\nthird".into())
        );
        assert!(buf.is_empty());
        buf.push_str("alpha");
        assert_eq!(continue_multi(&mut buf, "\"\"\""), Some("alpha".into()));
    }

    #[test]
    fn conversations_round_trip_and_bad_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.json");
        let conv = Conversation {
            system: Some("be brief".into()),
            turns: vec![msg("user", "hi"), msg("assistant", "hello")],
        };
        conv.save(&path).unwrap();
        let back = Conversation::load(&path).unwrap();
        assert_eq!(back.messages(), conv.messages());
        std::fs::write(&path, r#"[{"role": "tool", "content": "x"}]"#).unwrap();
        let e = format!("{:#}", Conversation::load(&path).unwrap_err());
        assert!(e.contains("role `tool`"), "{e}");
        std::fs::write(&path, "nope").unwrap();
        let e = format!("{:#}", Conversation::load(&path).unwrap_err());
        assert!(e.contains("not a saved conversation"), "{e}");
    }
}
