//! The model's reply read back as text and calls (the formats are in the
//! module doc of [`crate::tools`]): whole ([`split_reply`]) or as it
//! streams ([`CallStream`]: the text before a call goes out as it comes,
//! the call is held until the reply ends).
//!
//! Contract: in the JSON format ([`CallFormat::Json`]) the calls start at
//! the first [`CALL_OPEN`] (`{"name":`, white space of [`BLANKS`] allowed
//! between the parts), the same place the `auto` grammar starts them; a
//! whole reply that is calls in another accepted shape (a JSON array,
//! `arguments`, another key order) is calls with no text. In the tagged
//! format ([`CallFormat::Tagged`], `super::tagged`) they start at the first
//! `<tool_call>`. The text before the calls is returned without its trailing white
//! space; streamed, the text sent is always a prefix of what the whole
//! reply would return.
//!
//! Costs: one JSON parse of the reply; streamed, O(1) amortised per token
//! (only the text not yet sent is scanned).

use serde_json::Value;

use super::call::{BLANKS, ParsedCall, call_of};
use super::tagged;

/// How a model writes its tool calls: a property of the model, decided
/// once, from its chat template ([`CallFormat::of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CallFormat {
    /// Llama 3.1 / 3.2: a bare JSON object `{"name", "parameters"}` (after
    /// `<|python_tag|>` where the template has it).
    #[default]
    Json,
    /// Qwen2.5, Qwen3 (Hermes style): `<tool_call>\n{"name", "arguments"}\n</tool_call>`.
    Tagged,
}

impl CallFormat {
    /// The format a chat template teaches: tagged when it writes
    /// `<tool_call>` (Qwen's templates do), else the JSON one.
    pub fn of(template: Option<&str>) -> CallFormat {
        match template {
            Some(t) if t.contains(tagged::OPEN) => CallFormat::Tagged,
            _ => CallFormat::Json,
        }
    }

    /// The key a call's arguments go under.
    pub fn arguments_key(self) -> &'static str {
        match self {
            CallFormat::Json => "parameters",
            CallFormat::Tagged => "arguments",
        }
    }

    /// How far `rest` matches the opening of a call.
    fn open_at(self, rest: &str) -> Open {
        match self {
            CallFormat::Json => open_at(rest),
            CallFormat::Tagged if rest.starts_with(tagged::OPEN) => Open::Whole(tagged::OPEN.len()),
            CallFormat::Tagged if tagged::OPEN.starts_with(rest) => Open::Partial,
            CallFormat::Tagged => Open::No,
        }
    }

    /// The character every opening starts with.
    fn first_char(self) -> char {
        match self {
            CallFormat::Json => '{',
            CallFormat::Tagged => '<',
        }
    }
}

/// How a call starts: `{`, then `"name"`, then `:`, [`BLANKS`] allowed between.
pub const CALL_OPEN: [&str; 3] = ["{", "\"name\"", ":"];

/// [`BLANKS`] as a regex character class.
pub fn blank_class() -> String {
    let escaped: String = BLANKS
        .iter()
        .map(|c| c.escape_default().to_string())
        .collect();
    format!("[{escaped}]")
}

/// How far `rest` matches [`CALL_OPEN`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    /// All of it, ending at this byte offset.
    Whole(usize),
    /// `rest` is a proper prefix of an opening.
    Partial,
    No,
}

fn open_at(rest: &str) -> Open {
    let mut at = 0;
    for (k, part) in CALL_OPEN.iter().enumerate() {
        if k > 0 {
            at = rest.len() - rest[at..].trim_start_matches(BLANKS).len();
        }
        let r = &rest[at..];
        if r.len() < part.len() {
            return if part.starts_with(r) {
                Open::Partial
            } else {
                Open::No
            };
        }
        if !r.starts_with(part) {
            return Open::No;
        }
        at += part.len();
    }
    Open::Whole(at)
}

/// The byte offset of the first call opening in `text`.
pub fn call_start(format: CallFormat, text: &str) -> Option<usize> {
    text.match_indices(format.first_char())
        .map(|(i, _)| i)
        .find(|&i| matches!(format.open_at(&text[i..]), Open::Whole(_)))
}

/// A reply as text and calls.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Split {
    /// The text (all of it when there are no calls, else what came before
    /// them, trailing white space cut).
    pub content: String,
    /// The calls; empty when the reply is text.
    pub calls: Vec<ParsedCall>,
}

/// A whole reply as text and the calls of known functions (module doc), at
/// most one call unless `parallel`.
pub fn split_reply(format: CallFormat, text: &str, names: &[String], parallel: bool) -> Split {
    let parse = |t: &str| match format {
        CallFormat::Json => parse_calls(t, names, parallel),
        CallFormat::Tagged => tagged::calls_from(t, names, parallel),
    };
    if format == CallFormat::Json
        && let Some(calls) = parse(text)
    {
        return Split {
            content: String::new(),
            calls,
        };
    }
    if let Some(at) = call_start(format, text)
        && let Some(calls) = parse(&text[at..])
    {
        return Split {
            content: text[..at].trim_end_matches(BLANKS).to_string(),
            calls,
        };
    }
    Split {
        content: text.to_string(),
        calls: Vec::new(),
    }
}

/// A reply read as it streams (module doc): [`CallStream::push`] each
/// token's text and send what it returns as content; [`CallStream::finish`]
/// gives the rest of the content and the calls.
#[derive(Debug, Default)]
pub struct CallStream {
    format: CallFormat,
    text: String,
    /// Bytes of `text` sent as content.
    sent: usize,
    /// A call opening was seen: nothing more is sent before the end.
    opened: bool,
}

impl CallStream {
    /// A reader of a reply in `format`.
    pub fn new(format: CallFormat) -> Self {
        CallStream {
            format,
            ..CallStream::default()
        }
    }

    /// Adds `delta`; returns the text that can be sent now.
    pub fn push(&mut self, delta: &str) -> &str {
        self.text.push_str(delta);
        let lead = self.text.trim_start();
        // the whole reply may still be calls in another shape (module doc)
        let other_shape = self.format == CallFormat::Json && lead.starts_with(['{', '[']);
        if self.opened || lead.is_empty() || other_shape {
            return "";
        }
        let rest = &self.text[self.sent..];
        let mut hold = rest.len();
        for (i, _) in rest.match_indices(self.format.first_char()) {
            match self.format.open_at(&rest[i..]) {
                Open::Whole(_) => {
                    self.opened = true;
                    hold = i;
                    break;
                }
                Open::Partial => {
                    hold = i;
                    break;
                }
                Open::No => {}
            }
        }
        // trailing blanks wait for what follows them
        let hold = rest[..hold].trim_end_matches(BLANKS).len();
        let from = self.sent;
        self.sent += hold;
        &self.text[from..self.sent]
    }

    /// The content not sent yet and the calls, once the reply ended;
    /// `stopped`: it ended normally (a reply cut short is text).
    pub fn finish(self, names: &[String], parallel: bool, stopped: bool) -> Split {
        let split = if stopped {
            split_reply(self.format, &self.text, names, parallel)
        } else {
            Split {
                content: self.text.clone(),
                calls: Vec::new(),
            }
        };
        Split {
            content: split
                .content
                .get(self.sent..)
                .unwrap_or_default()
                .to_string(),
            calls: split.calls,
        }
    }
}

/// The calls in `text` when the whole reply is one or more calls (module
/// doc) of known functions, at most one unless `parallel`; `None` otherwise
/// (the reply is content).
pub fn parse_calls(text: &str, names: &[String], parallel: bool) -> Option<Vec<ParsedCall>> {
    const TAG: &str = "<|python_tag|>";
    let mut rest = text.trim();
    let mut values = Vec::new();
    while !rest.is_empty() {
        rest = rest.strip_prefix(TAG).unwrap_or(rest).trim_start();
        let mut de = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        let v = de.next()?.ok()?;
        rest = rest[de.byte_offset()..]
            .trim_start()
            .trim_start_matches([';', ','])
            .trim_start();
        match v {
            Value::Array(items) if values.is_empty() && rest.is_empty() => values = items,
            v => values.push(v),
        }
    }
    if values.is_empty() {
        return None;
    }
    let calls: Vec<ParsedCall> = values
        .iter()
        .map(|v| call_of(v, names))
        .collect::<Option<_>>()?;
    Some(if parallel {
        calls
    } else {
        calls.into_iter().take(1).collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn names() -> Vec<String> {
        vec!["get_weather".to_string(), "now".to_string()]
    }

    #[test]
    fn text_before_a_call_is_content() {
        let call = r#"{"name": "get_weather", "parameters": {"city": "Oslo"}}"#;
        let s = split_reply(
            CallFormat::Json,
            &format!("Let me look.\n{call}"),
            &names(),
            true,
        );
        assert_eq!(s.content, "Let me look.");
        assert_eq!(s.calls.len(), 1);
        assert_eq!(s.calls[0].name, "get_weather");
        let spaced = r#"Sure { "name" :"now", "parameters": {}}"#;
        let s = split_reply(CallFormat::Json, spaced, &names(), true);
        assert_eq!((s.content.as_str(), s.calls.len()), ("Sure", 1));
        // braces that open no call, or a call that does not parse: all text
        for text in [
            "a {b} c",
            r#"x {"name": "unknown", "parameters": {}}"#,
            r#"x {"name": "now", "parameters": {}} and more"#,
        ] {
            let s = split_reply(CallFormat::Json, text, &names(), true);
            assert_eq!((s.content.as_str(), s.calls.len()), (text, 0));
        }
        let s = split_reply(CallFormat::Json, call, &names(), true);
        assert_eq!((s.content.as_str(), s.calls.len()), ("", 1));
    }

    /// Streamed in every split into pieces, the text sent is a prefix of
    /// the whole reply's content and, with the rest from `finish`, equal
    /// to it; no part of a call is ever sent.
    #[test]
    fn streamed_text_is_the_whole_replys_content() {
        let replies = [
            r#"Let me look. {"name": "get_weather", "parameters": {"city": "Oslo"}}"#.to_string(),
            "Plain text { with a brace } and more.  ".to_string(),
            r#"{"name": "now", "parameters": {}}"#.to_string(),
            r#"Two:
{"name": "now", "parameters": {}}
{ "name": "get_weather", "parameters": {"city": "Rome"}}"#
                .to_string(),
            r#"Broken {"name": "now", "parameters": "#.to_string(),
        ];
        for reply in &replies {
            let whole = split_reply(CallFormat::Json, reply, &names(), true);
            for step in 1..=7 {
                let mut cs = CallStream::default();
                let mut sent = String::new();
                let chars: Vec<char> = reply.chars().collect();
                for piece in chars.chunks(step) {
                    let piece: String = piece.iter().collect();
                    sent.push_str(cs.push(&piece));
                    assert!(whole.content.starts_with(&sent), "{reply:?} sent {sent:?}");
                }
                let end = cs.finish(&names(), true, true);
                assert_eq!(format!("{sent}{}", end.content), whole.content, "{reply:?}");
                assert_eq!(end.calls, whole.calls, "{reply:?}");
            }
        }
        // cut short: everything is text
        let mut cs = CallStream::default();
        let mut sent = cs.push("Hi ").to_string();
        sent.push_str(cs.push(r#"{"name": "now", "parameters": {}}"#));
        let end = cs.finish(&names(), true, false);
        assert_eq!(
            format!("{sent}{}", end.content),
            r#"Hi {"name": "now", "parameters": {}}"#
        );
        assert!(end.calls.is_empty());
    }

    #[test]
    fn openings_are_found_whole_or_in_part() {
        assert_eq!(open_at(r#"{"name":"#), Open::Whole(8));
        assert_eq!(open_at("{ \n\"name\"\t: x"), Open::Whole(11));
        for part in ["{", "{ ", r#"{"na"#, r#"{"name""#, "{\"name\" "] {
            assert_eq!(open_at(part), Open::Partial, "{part:?}");
        }
        for no in ["{}", r#"{"city""#, r#"{"name"}"#, "{ x"] {
            assert_eq!(open_at(no), Open::No, "{no:?}");
        }
        assert_eq!(call_start(CallFormat::Json, r#"a {b} {"name": 1"#), Some(6));
        assert_eq!(blank_class(), r"[ \t\r\n]");
    }

    fn parse_call(text: &str, names: &[String]) -> Option<ParsedCall> {
        parse_calls(text, names, false).map(|mut v| v.remove(0))
    }

    #[test]
    fn several_calls_parse_when_parallel() {
        let names = vec!["f".to_string(), "g".to_string()];
        let one = r#"{"name": "f", "parameters": {"a": 1}}"#;
        let two = r#"{"name": "g", "parameters": {}}"#;
        for text in [
            format!("{one}\n{two}"),
            format!("{one}; {two}"),
            format!("<|python_tag|>{one}<|python_tag|>{two}"),
            format!("[{one}, {two}]"),
        ] {
            let calls = parse_calls(&text, &names, true).unwrap();
            let got: Vec<&str> = calls.iter().map(|c| c.name.as_str()).collect();
            assert_eq!(got, ["f", "g"], "{text}");
            let first = parse_calls(&text, &names, false).unwrap();
            assert_eq!(first.len(), 1, "{text}");
        }
        // one unknown function or trailing text: the reply is content
        assert!(parse_calls(&format!("{one} {{\"name\": \"h\"}}"), &names, true).is_none());
        assert!(parse_calls(&format!("{one} done"), &names, true).is_none());
        assert!(parse_calls("[]", &names, true).is_none());
    }

    #[test]
    fn replies_parse_into_calls_of_known_functions_only() {
        let names = vec!["get_weather".to_string()];
        let c = parse_call(
            " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}\n",
            &names,
        )
        .unwrap();
        assert_eq!(c.name, "get_weather");
        assert_eq!(
            serde_json::from_str::<Value>(&c.arguments).unwrap(),
            json!({"city": "Paris"})
        );
        let c = parse_call(
            r#"{"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}"#,
            &names,
        )
        .unwrap();
        assert_eq!(c.arguments, r#"{"city": "Oslo"}"#);
        assert!(parse_call(r#"{"name": "other", "parameters": {}}"#, &names).is_none());
        assert!(parse_call("It is sunny.", &names).is_none());
        assert!(parse_call(r#"{"name": "get_weather", "parameters": 3}"#, &names).is_none());
    }
}
