//! Special-token texts in user-supplied strings never become control tokens.
//!
//! Every string a chat template may render from a request (each message's
//! `role`, `content` and `tool_call_id`, every string and key inside its
//! `tool_calls`, and inside `tools`) is scanned before rendering. Each
//! special token's text found there, and each reserved reference character,
//! is swapped for a reference: [`REF_OPEN`], the literal's index in the
//! hexadecimal digits `REF_DIGIT0 + n`, [`REF_CLOSE`], all Unicode
//! noncharacters (U+FDD0..=U+FDEF, reserved for internal use, so a user
//! string holding one is itself swapped). The template renders references
//! like any text (it may copy, move, repeat or drop them); the rendered
//! prompt is then cut into [`Piece`]s: the text between references, encoded
//! with the special tokens active (the template's own markers), and each
//! reference's literal, encoded as plain text.
//!
//! A conversation with no such text is left untouched (it renders and
//! encodes in one piece, exactly as `transformers` does).
//!
//! Costs: one Aho-Corasick pass over each user string and one scan of the
//! rendered prompt; linear in their lengths.

use crate::ChatMessage;
use aho_corasick::{AhoCorasick, MatchKind};
use serde_json::Value;
use std::collections::HashMap;

/// Opens a reference.
const REF_OPEN: char = '\u{FDD0}';
/// Closes a reference.
const REF_CLOSE: char = '\u{FDD1}';
/// The hexadecimal digit 0 of a reference index; digits run to U+FDEF.
const REF_DIGIT0: u32 = 0xFDE0;
/// The reserved range: every character a reference is built from.
const RESERVED: std::ops::RangeInclusive<u32> = 0xFDD0..=0xFDEF;

/// Finds special-token texts and reserved characters in user strings.
pub(crate) struct Shield {
    /// The special texts and the reserved characters, leftmost-longest.
    finder: AhoCorasick,
}

/// The literals swapped out of one conversation, by index.
#[derive(Default)]
pub(crate) struct Literals {
    texts: Vec<String>,
    index: HashMap<String, usize>,
}

impl Literals {
    fn reference(&mut self, literal: &str) -> String {
        let next = self.texts.len();
        let n = *self.index.entry(literal.to_string()).or_insert(next);
        if n == next {
            self.texts.push(literal.to_string());
        }
        let mut out = String::from(REF_OPEN);
        let hex = format!("{n:x}");
        for d in hex.chars() {
            let digit = d.to_digit(16).unwrap_or(0);
            out.push(char::from_u32(REF_DIGIT0 + digit).unwrap_or(REF_CLOSE));
        }
        out.push(REF_CLOSE);
        out
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.texts.is_empty()
    }
}

/// A piece of a rendered prompt.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Piece<'t> {
    /// Template text (and user text with nothing swapped out): special
    /// tokens are recognised.
    Template(&'t str),
    /// A swapped-out literal: plain text.
    Literal(&'t str),
}

impl Shield {
    /// A shield for the special tokens `specials` (their texts).
    pub(crate) fn new(specials: &[String]) -> Result<Shield, String> {
        let mut patterns: Vec<String> =
            specials.iter().filter(|s| !s.is_empty()).cloned().collect();
        patterns.extend(RESERVED.filter_map(char::from_u32).map(String::from));
        let finder = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(&patterns)
            .map_err(|e| e.to_string())?;
        Ok(Shield { finder })
    }

    /// `s` with every special-token text and reserved character swapped for
    /// a reference; `None` when it holds none.
    fn string(&self, s: &str, lits: &mut Literals) -> Option<String> {
        let mut out: Option<String> = None;
        let mut at = 0;
        for m in self.finder.find_iter(s) {
            let buf = out.get_or_insert_with(|| String::with_capacity(s.len() + 8));
            buf.push_str(&s[at..m.start()]);
            buf.push_str(&lits.reference(&s[m.start()..m.end()]));
            at = m.end();
        }
        if let Some(buf) = &mut out {
            buf.push_str(&s[at..]);
        }
        out
    }

    /// A JSON value with every string and object key shielded; `None` when
    /// nothing was swapped.
    fn value(&self, v: &Value, lits: &mut Literals) -> Option<Value> {
        match v {
            Value::String(s) => self.string(s, lits).map(Value::String),
            Value::Array(items) => {
                let new: Vec<Option<Value>> = items.iter().map(|x| self.value(x, lits)).collect();
                new.iter().any(Option::is_some).then(|| {
                    let pairs = new.into_iter().zip(items);
                    Value::Array(
                        pairs
                            .map(|(n, old)| n.unwrap_or_else(|| old.clone()))
                            .collect(),
                    )
                })
            }
            Value::Object(map) => {
                let mut changed = false;
                let mut out = serde_json::Map::with_capacity(map.len());
                for (k, x) in map {
                    let key = self.string(k, lits);
                    let val = self.value(x, lits);
                    changed |= key.is_some() || val.is_some();
                    out.insert(
                        key.unwrap_or_else(|| k.clone()),
                        val.unwrap_or_else(|| x.clone()),
                    );
                }
                changed.then_some(Value::Object(out))
            }
            _ => None,
        }
    }

    /// The conversation and tools with every user-supplied string shielded;
    /// `None` when none holds anything to swap (render the originals).
    pub(crate) fn conversation(
        &self,
        messages: &[ChatMessage],
        tools: Option<&Value>,
        lits: &mut Literals,
    ) -> Option<(Vec<ChatMessage>, Option<Value>)> {
        let msgs: Vec<ChatMessage> = messages
            .iter()
            .map(|m| {
                let mut out = m.clone();
                if let Some(s) = self.string(&m.role, lits) {
                    out.role = s;
                }
                if let Some(s) = self.string(&m.content, lits) {
                    out.content = s;
                }
                if let Some(s) = m
                    .tool_call_id
                    .as_deref()
                    .and_then(|id| self.string(id, lits))
                {
                    out.tool_call_id = Some(s);
                }
                if let Some(v) = m.tool_calls.as_ref().and_then(|c| self.value(c, lits)) {
                    out.tool_calls = Some(v);
                }
                out
            })
            .collect();
        let tools = tools.map(|t| self.value(t, lits).unwrap_or_else(|| t.clone()));
        (!lits.is_empty()).then_some((msgs, tools))
    }
}

/// Cuts a prompt rendered from a shielded conversation into template text
/// and literals. A malformed reference (a template that cut one apart) stays
/// template text; its characters are no special token's.
pub(crate) fn pieces<'t>(rendered: &'t str, lits: &'t Literals) -> Vec<Piece<'t>> {
    let mut out = Vec::new();
    let mut plain_from = 0;
    let mut search = 0;
    while let Some(off) = rendered[search..].find(REF_OPEN) {
        let open = search + off;
        let body = open + REF_OPEN.len_utf8();
        match parse_reference(&rendered[body..]) {
            Some((n, used)) if n < lits.texts.len() => {
                if open > plain_from {
                    out.push(Piece::Template(&rendered[plain_from..open]));
                }
                out.push(Piece::Literal(&lits.texts[n]));
                plain_from = body + used;
                search = plain_from;
            }
            _ => search = body,
        }
    }
    if plain_from < rendered.len() {
        out.push(Piece::Template(&rendered[plain_from..]));
    }
    out
}

/// The index at the start of `s` (hex digits then [`REF_CLOSE`]) and the
/// bytes it spans.
fn parse_reference(s: &str) -> Option<(usize, usize)> {
    let mut n: usize = 0;
    for (digits, (i, c)) in s.char_indices().enumerate() {
        if c == REF_CLOSE {
            return (digits > 0).then_some((n, i + c.len_utf8()));
        }
        let d = (c as u32).checked_sub(REF_DIGIT0).filter(|&d| d < 16)?;
        n = n.checked_mul(16)?.checked_add(d as usize)?;
    }
    None
}

#[cfg(test)]
mod tests;
