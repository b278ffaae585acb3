//! Token log-probabilities in OpenAI's two shapes:
//! chat `logprobs.content[{token, logprob, bytes, top_logprobs[{token, logprob, bytes}]}]`
//! and legacy completions `{tokens, token_logprobs, top_logprobs[{token: logprob}], text_offset}`.
//!
//! A token's text is its own decoding (`decode([id])`, special tokens kept);
//! `bytes` are that text's UTF-8 bytes. `-inf` is reported as -9999.0, as
//! OpenAI does (JSON has no infinity). O(top_logprobs) per token.
//!
//! Entries follow the returned text ([`Aligner`]): a token whose text is
//! held back (a possible stop string, a partial UTF-8 character) is reported
//! with the token that releases it, and the tokens of a matched stop string
//! and the end-of-sequence token, which add no text, are not reported, so
//! `tokens` and `text_offset` never run past the text.

use engine::{FinishReason, TokenEvent};
use serde_json::{Map, Value, json};
use tokenizer::Tokenizer;

/// What OpenAI reports for a log-probability of zero probability.
const NEG_INF_LOGPROB: f32 = -9999.0;

fn finite(lp: f32) -> f32 {
    if lp.is_finite() { lp } else { NEG_INF_LOGPROB }
}

/// The text of one token on its own.
pub fn token_text(tok: &Tokenizer, id: u32) -> String {
    tok.token_text(id).unwrap_or_default()
}

/// The byte of each character of the GPT-2 byte-level alphabet
/// (printable bytes map to themselves, the others to U+0100 onwards).
fn byte_level_byte(c: char) -> Option<u8> {
    let printable = |b: u32| (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
    let cp = c as u32;
    if cp < 0x100 {
        return printable(cp).then_some(cp as u8);
    }
    // the non-printable bytes, in order, take code points 0x100, 0x101, ...
    let k = cp - 0x100;
    (0u32..0x100)
        .filter(|&b| !printable(b))
        .nth(k as usize)
        .map(|b| b as u8)
}

/// The raw bytes of a token: its text's UTF-8 unless that text is a lone
/// piece of a multi-byte character (U+FFFD), in which case the bytes come
/// from the byte-level vocabulary piece when there is one.
pub fn token_bytes(tok: &Tokenizer, id: u32, text: &str) -> Vec<u8> {
    if text.contains('\u{FFFD}')
        && let Some(piece) = tok.id_to_token(id)
        && let Some(bytes) = piece
            .chars()
            .map(byte_level_byte)
            .collect::<Option<Vec<u8>>>()
    {
        return bytes;
    }
    text.as_bytes().to_vec()
}

/// The top alternatives of an event, at most `k`, best first.
fn top(ev: &TokenEvent, k: usize) -> impl Iterator<Item = &(u32, f32)> {
    ev.top_logprobs.iter().take(k)
}

/// One chat `logprobs.content` entry.
pub fn chat_entry(tok: &Tokenizer, ev: &TokenEvent, k: usize) -> Value {
    let text = token_text(tok, ev.token);
    let alts: Vec<Value> = top(ev, k)
        .map(|&(id, lp)| {
            let t = token_text(tok, id);
            let bytes = token_bytes(tok, id, &t);
            json!({"token": t, "logprob": finite(lp), "bytes": bytes})
        })
        .collect();
    json!({
        "token": text,
        "logprob": finite(ev.logprob),
        "bytes": token_bytes(tok, ev.token, &text),
        "top_logprobs": alts,
    })
}

/// Chat `logprobs` for a run of events.
pub fn chat(tok: &Tokenizer, events: &[TokenEvent], k: usize) -> Value {
    let content: Vec<Value> = events.iter().map(|e| chat_entry(tok, e, k)).collect();
    json!({ "content": content })
}

/// Completion `logprobs` for a run of events; `offset` is the character
/// offset of the first event's text in the completion, advanced past them.
pub fn completion(tok: &Tokenizer, events: &[TokenEvent], k: usize, offset: &mut usize) -> Value {
    let mut tokens = Vec::with_capacity(events.len());
    let mut token_logprobs = Vec::with_capacity(events.len());
    let mut tops = Vec::with_capacity(events.len());
    let mut offsets = Vec::with_capacity(events.len());
    for ev in events {
        tokens.push(Value::String(token_text(tok, ev.token)));
        token_logprobs.push(json!(finite(ev.logprob)));
        let mut m = Map::new();
        for &(id, lp) in top(ev, k) {
            m.insert(token_text(tok, id), json!(finite(lp)));
        }
        tops.push(Value::Object(m));
        offsets.push(json!(*offset));
        *offset += ev.text.chars().count();
    }
    json!({
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": tops,
        "text_offset": offsets,
    })
}

/// Holds back the log-probability entries of tokens whose text is not out
/// yet (see the module doc).
#[derive(Default)]
pub struct Aligner {
    pending: Vec<TokenEvent>,
}

impl Aligner {
    /// Takes the next token; returns the entries to report with its text
    /// (the held-back ones first), or None while its text is held back. A
    /// token that adds no text and holds none back (a skipped special
    /// token) is reported at once, so a stream sends an event per token.
    pub fn push(&mut self, ev: TokenEvent) -> Option<Vec<TokenEvent>> {
        let release = !ev.text.is_empty() || !ev.held;
        self.pending.push(ev);
        release.then(|| std::mem::take(&mut self.pending))
    }

    /// Entries still held when the request ends: none when it ended on a
    /// stop string or EOS (those tokens add no text), else all of them.
    pub fn finish(&mut self, reason: FinishReason) -> Vec<TokenEvent> {
        let rest = std::mem::take(&mut self.pending);
        if reason == FinishReason::Stop {
            Vec::new()
        } else {
            rest
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An event whose text is held back when empty (a possible stop string).
    fn ev(token: u32, text: &str) -> TokenEvent {
        TokenEvent {
            token,
            text: text.into(),
            logprob: -1.0,
            top_logprobs: Vec::new(),
            held: text.is_empty(),
        }
    }

    #[test]
    fn held_back_tokens_follow_their_text_and_stop_tokens_are_dropped() {
        let mut a = Aligner::default();
        let ids =
            |v: Option<Vec<TokenEvent>>| v.map(|v| v.iter().map(|e| e.token).collect::<Vec<_>>());
        assert_eq!(ids(a.push(ev(1, "x"))), Some(vec![1]));
        // 2 held back (a possible stop string), released with 3
        assert_eq!(ids(a.push(ev(2, ""))), None);
        assert_eq!(ids(a.push(ev(3, "az"))), Some(vec![2, 3]));
        // 4 and 5 complete a stop string: never reported
        assert_eq!(ids(a.push(ev(4, ""))), None);
        assert_eq!(ids(a.push(ev(5, ""))), None);
        assert!(a.finish(FinishReason::Stop).is_empty());
        // at max_tokens, held-back tokens are still reported
        assert_eq!(ids(a.push(ev(6, ""))), None);
        assert_eq!(a.finish(FinishReason::Length).len(), 1);
    }

    #[test]
    fn tokens_without_text_that_hold_nothing_back_are_reported_at_once() {
        let mut a = Aligner::default();
        let special = TokenEvent {
            held: false,
            ..ev(7, "")
        };
        assert_eq!(a.push(special).map(|v| v.len()), Some(1));
        // behind a held-back one, it releases both
        assert_eq!(a.push(ev(8, "")).map(|v| v.len()), None);
        let special = TokenEvent {
            held: false,
            ..ev(9, "")
        };
        assert_eq!(a.push(special).map(|v| v.len()), Some(2));
    }

    #[test]
    fn byte_level_alphabet_round_trips() {
        // space is U+0120 (Ġ), newline U+010A (Ċ), printable ASCII is itself
        assert_eq!(byte_level_byte('Ġ'), Some(b' '));
        assert_eq!(byte_level_byte('Ċ'), Some(b'\n'));
        assert_eq!(byte_level_byte('a'), Some(b'a'));
        let all: std::collections::HashSet<u8> = (0u32..0x200)
            .filter_map(char::from_u32)
            .filter_map(byte_level_byte)
            .collect();
        assert_eq!(all.len(), 256);
        assert_eq!(byte_level_byte('▁'), None);
    }
}
