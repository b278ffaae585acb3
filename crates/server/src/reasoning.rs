//! A reply's reasoning split from its answer, as vLLM's `qwen3` reasoning
//! parser does (`lamina serve --reasoning-parser qwen3`): chat completions
//! then carry the thinking as `message.reasoning_content` (streamed: deltas
//! with `reasoning_content`) and the rest as `content`.
//!
//! Contract (one rule, whole or streamed):
//! - with thinking on (the default; a request turns it off with
//!   `chat_template_kwargs: {"enable_thinking": false}`, which Qwen3's
//!   template answers by closing an empty `<think></think>` in the prompt),
//!   the reply's text up to the first `</think>` is the reasoning, the text
//!   after it the content; an opening `<think>` at the very start of the
//!   reply (after white space) is dropped, so a model that writes it and one
//!   whose template wrote it into the prompt read the same. A reply that ends
//!   with no `</think>` is all reasoning (it was cut off while thinking);
//! - with thinking off, all of it is content;
//! - streamed, the text sent as reasoning and as content are always
//!   prefixes of what the whole reply gives; only a suffix that may still
//!   become `<think>` or `</think>` is held back.
//!
//! Tool calls are read from the content only ([`crate::tools`]). A request
//! that forces a call (`tool_choice` `required` or a named function, held
//! from the first token) or asks for `logprobs` gets its text unsplit.
//!
//! Costs: O(1) amortised per streamed token; one scan of a whole reply.

/// The reasoning parsers `--reasoning-parser` accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningParser {
    /// `<think>` ... `</think>` (Qwen3, as vLLM's `qwen3`).
    Qwen3,
}

impl ReasoningParser {
    /// Every parser, for `--help` and errors.
    pub const ALL: [ReasoningParser; 1] = [ReasoningParser::Qwen3];

    /// The flag's name of the parser.
    pub fn name(self) -> &'static str {
        match self {
            ReasoningParser::Qwen3 => "qwen3",
        }
    }
}

impl std::str::FromStr for ReasoningParser {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Self::ALL.iter().map(|p| p.name()).collect();
                format!(
                    "unknown reasoning parser `{s}` (known: {})",
                    names.join(", ")
                )
            })
    }
}

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// Whether a request thinks: `enable_thinking` of its
/// `chat_template_kwargs`, on unless `false`.
pub fn thinking(kwargs: Option<&serde_json::Map<String, serde_json::Value>>) -> bool {
    kwargs.and_then(|k| k.get("enable_thinking")) != Some(&serde_json::Value::Bool(false))
}

/// A whole reply as reasoning and content (module doc); `reasoning` is
/// `None` when the reply has none.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Parts {
    pub reasoning: Option<String>,
    pub content: String,
}

/// Splits a whole reply (module doc).
pub fn split(text: &str, thinking: bool) -> Parts {
    let mut s = ReasoningStream::new(thinking);
    let (mut r, mut c) = s.push(text);
    let (r2, c2) = s.finish();
    r.push_str(&r2);
    c.push_str(&c2);
    Parts {
        reasoning: (!r.is_empty()).then_some(r),
        content: c,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Nothing but white space yet: an opening `<think>` may come.
    Start,
    Reasoning,
    Content,
}

/// A reply read as it streams (module doc): [`ReasoningStream::push`] each
/// token's text, send what it returns; [`ReasoningStream::finish`] gives
/// what was held back.
#[derive(Debug)]
pub struct ReasoningStream {
    phase: Phase,
    /// Text not yet sent (a possible start of a tag).
    held: String,
}

impl ReasoningStream {
    /// A reader for a reply that thinks (`thinking`) or not.
    pub fn new(thinking: bool) -> Self {
        ReasoningStream {
            phase: if thinking {
                Phase::Start
            } else {
                Phase::Content
            },
            held: String::new(),
        }
    }

    /// Adds `delta`; returns the reasoning and the content to send now.
    pub fn push(&mut self, delta: &str) -> (String, String) {
        if self.phase == Phase::Content {
            return (String::new(), delta.to_string());
        }
        self.held.push_str(delta);
        let mut reasoning = String::new();
        if self.phase == Phase::Start {
            let lead = self.held.trim_start();
            if let Some(rest) = lead.strip_prefix(OPEN) {
                self.held = rest.to_string();
                self.phase = Phase::Reasoning;
            } else if lead.is_empty() || OPEN.starts_with(lead) {
                return (String::new(), String::new());
            } else {
                self.phase = Phase::Reasoning;
            }
        }
        if let Some(at) = self.held.find(CLOSE) {
            reasoning.push_str(&self.held[..at]);
            let content = self.held[at + CLOSE.len()..].to_string();
            self.held.clear();
            self.phase = Phase::Content;
            return (reasoning, content);
        }
        let keep = partial_suffix(&self.held, CLOSE);
        let cut = self.held.len() - keep;
        reasoning.push_str(&self.held[..cut]);
        self.held.drain(..cut);
        (reasoning, String::new())
    }

    /// What was held back, once the reply ended: reasoning (a reply cut
    /// off while thinking) or content.
    pub fn finish(self) -> (String, String) {
        match self.phase {
            Phase::Content => (String::new(), self.held),
            Phase::Start | Phase::Reasoning => (self.held, String::new()),
        }
    }
}

/// The length of the longest proper prefix of `tag` that `text` ends with.
fn partial_suffix(text: &str, tag: &str) -> usize {
    (1..tag.len())
        .rev()
        .find(|&n| text.ends_with(&tag[..n]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(r: Option<&str>, c: &str) -> Parts {
        Parts {
            reasoning: r.map(str::to_string),
            content: c.to_string(),
        }
    }

    #[test]
    fn whole_replies_split_as_vllm_qwen3_does() {
        let cases = [
            (
                "<think>\nhmm\n</think>\n\nHi.",
                parts(Some("\nhmm\n"), "\n\nHi."),
            ),
            ("hmm</think>Hi.", parts(Some("hmm"), "Hi.")),
            ("  <think>a</think>", parts(Some("a"), "")),
            ("still thinking", parts(Some("still thinking"), "")),
            ("a < b </think> c", parts(Some("a < b "), " c")),
            ("", parts(None, "")),
        ];
        for (text, want) in cases {
            assert_eq!(split(text, true), want, "{text:?}");
        }
        assert_eq!(
            split("<think>x</think>y", false),
            parts(None, "<think>x</think>y")
        );
    }

    /// Streamed in pieces of every size, the reasoning and content sent add
    /// up to the whole reply's, and each is a prefix of it all along.
    #[test]
    fn streamed_parts_are_the_whole_replys() {
        for text in [
            "<think>\nLet me see: 1 < 2.\n</think>\n\nYes.",
            "no tags at all",
            "<thi",
            "x</think",
            "</think>all content",
            "<think></think><think>",
        ] {
            let whole = split(text, true);
            let chars: Vec<char> = text.chars().collect();
            for step in 1..=6 {
                let mut s = ReasoningStream::new(true);
                let (mut r, mut c) = (String::new(), String::new());
                for piece in chars.chunks(step) {
                    let (a, b) = s.push(&piece.iter().collect::<String>());
                    r.push_str(&a);
                    c.push_str(&b);
                    let wr = whole.reasoning.clone().unwrap_or_default();
                    assert!(wr.starts_with(&r), "{text:?} step {step}: {r:?}");
                    assert!(whole.content.starts_with(&c), "{text:?} step {step}: {c:?}");
                }
                let (a, b) = s.finish();
                r.push_str(&a);
                c.push_str(&b);
                assert_eq!(r, whole.reasoning.clone().unwrap_or_default(), "{text:?}");
                assert_eq!(c, whole.content, "{text:?}");
            }
        }
    }

    #[test]
    fn thinking_is_on_unless_the_request_turns_it_off() {
        let kw = |v: serde_json::Value| v.as_object().cloned();
        assert!(thinking(None));
        assert!(thinking(
            kw(serde_json::json!({"enable_thinking": true})).as_ref()
        ));
        assert!(thinking(kw(serde_json::json!({"other": 1})).as_ref()));
        assert!(!thinking(
            kw(serde_json::json!({"enable_thinking": false})).as_ref()
        ));
        assert_eq!("qwen3".parse(), Ok(ReasoningParser::Qwen3));
        assert!(
            "deepseek_r1"
                .parse::<ReasoningParser>()
                .unwrap_err()
                .contains("qwen3")
        );
    }
}
