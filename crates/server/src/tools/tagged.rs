//! The tagged call format (Qwen2.5, Qwen3 and other Hermes-style
//! templates): each call is `<tool_call>` + a JSON object `{"name": ...,
//! "arguments": {...}}` + `</tool_call>` (module doc of [`crate::tools`]).
//!
//! Contract: the calls start at the first [`OPEN`]; from there the reply is
//! one or more tagged calls separated by white space, the last one's
//! [`CLOSE`] optional (a model may stop right after its JSON), and nothing
//! else: any other text, or a JSON that is not a call of a known function,
//! makes the whole reply content. With `parallel` false only the first
//! call is returned.
//!
//! Costs: one JSON parse per call.

use serde_json::Value;

use super::call::{BLANKS, ParsedCall, call_of};

/// How a tagged call opens (a token of Qwen's vocabulary).
pub const OPEN: &str = "<tool_call>";
/// How a tagged call closes.
pub const CLOSE: &str = "</tool_call>";

/// The calls of `text` when it is tagged calls only (module doc; the
/// caller cuts the text before the first [`OPEN`]).
pub fn calls_from(text: &str, names: &[String], parallel: bool) -> Option<Vec<ParsedCall>> {
    let mut rest = text.trim_matches(BLANKS);
    let mut calls = Vec::new();
    while !rest.is_empty() {
        rest = rest.strip_prefix(OPEN)?.trim_start_matches(BLANKS);
        let mut de = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        let v = de.next()?.ok()?;
        calls.push(call_of(&v, names)?);
        rest = rest[de.byte_offset()..].trim_start_matches(BLANKS);
        if let Some(after) = rest.strip_prefix(CLOSE) {
            rest = after.trim_start_matches(BLANKS);
        } else if !rest.is_empty() {
            return None;
        }
    }
    if calls.is_empty() {
        return None;
    }
    if !parallel {
        calls.truncate(1);
    }
    Some(calls)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vec<String> {
        vec!["get_weather".into(), "now".into()]
    }

    /// Streamed in pieces of every size, the text sent is the whole reply's
    /// content and no part of a call is sent.
    #[test]
    fn streamed_tagged_replies_match_the_whole_ones() {
        use super::super::parse::{CallFormat, CallStream, split_reply};
        let f = CallFormat::Tagged;
        for reply in [
            "Let me check.\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>",
            "<tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call>\n<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}</tool_call>",
            "a < b and <tool maybe",
            "Broken <tool_call>{\"name\": ",
        ] {
            let whole = split_reply(f, reply, &names(), true);
            let chars: Vec<char> = reply.chars().collect();
            for step in 1..=5 {
                let mut cs = CallStream::new(f);
                let mut sent = String::new();
                for piece in chars.chunks(step) {
                    sent.push_str(cs.push(&piece.iter().collect::<String>()));
                    assert!(whole.content.starts_with(&sent), "{reply:?}: {sent:?}");
                }
                let end = cs.finish(&names(), true, true);
                assert_eq!(format!("{sent}{}", end.content), whole.content, "{reply:?}");
                assert_eq!(end.calls, whole.calls, "{reply:?}");
            }
        }
        let s = split_reply(
            f,
            "Sure.\n<tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call>",
            &names(),
            true,
        );
        assert_eq!((s.content.as_str(), s.calls.len()), ("Sure.", 1));
        // the JSON format's bare call is text here
        let bare = r#"{"name": "now", "arguments": {}}"#;
        assert_eq!(split_reply(f, bare, &names(), true).calls.len(), 0);
    }

    #[test]
    fn tagged_calls_parse_one_or_several() {
        let one = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
        let two = "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
        let c = calls_from(one, &names(), true).unwrap();
        assert_eq!(c[0].name, "get_weather");
        assert_eq!(c[0].arguments, r#"{"city":"Oslo"}"#);
        let both = format!("{one}\n{two}");
        assert_eq!(calls_from(&both, &names(), true).unwrap().len(), 2);
        assert_eq!(calls_from(&both, &names(), false).unwrap().len(), 1);
        // the last close tag may be missing
        let open = "<tool_call>{\"name\": \"now\", \"arguments\": {}}";
        assert_eq!(calls_from(open, &names(), true).unwrap()[0].name, "now");
        for bad in [
            "<tool_call>{\"name\": \"other\", \"arguments\": {}}</tool_call>",
            &format!("{one} and then text"),
            "<tool_call>{\"name\": \"now\"",
            "<tool_call></tool_call>",
            "",
        ] {
            assert!(calls_from(bad, &names(), true).is_none(), "{bad:?}");
        }
    }
}
