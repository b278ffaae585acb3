//! Incremental detokenization for streaming: turn generated ids into text
//! deltas as they arrive.
//!
//! Contract: the concatenation of every [`IncrementalDecoder::push`] result and
//! the final [`IncrementalDecoder::flush`] equals `Tokenizer::decode` of all
//! pushed ids. A push never returns a split UTF-8 character: while the newest
//! window decodes to text ending in U+FFFD (an incomplete multi-byte character
//! from byte-level tokens) the text is held back until a later token completes
//! it (or `flush` gives up and emits the replacement character).
//! The equality is exact for byte-level BPE (Llama 3, SmolLM2) whatever the
//! ids. One case cannot be streamed: a SentencePiece `ByteFallback` decoder
//! turns a whole run of byte tokens into U+FFFDs when any of them is invalid,
//! so a valid byte already emitted cannot be taken back; such output differs
//! from `decode` only inside invalid UTF-8.
//!
//! Method (the prefix / read offsets of TGI and vLLM): only the window of ids
//! from `prefix_offset` is decoded, and the new text is what the window decodes
//! to beyond the ids up to `read_offset`. Decoding from a token or two back,
//! rather than from the new id alone, keeps context-dependent decoders right
//! (SentencePiece drops the leading space of the first token it decodes; both
//! decodes of the window drop the same one).
//!
//! Ids past the tokenizer's vocabulary (a model's padding rows: Qwen's
//! embedding has 151,936 rows for 151,669 tokens, and a model may sample
//! one) have no text: a push of one adds nothing and holds nothing back, as
//! a skipped special token does, so a request's stream goes on; only
//! `Tokenizer::decode` of such an id is an error.
//!
//! Costs: one push decodes two windows of a few ids: O(new tokens) and
//! independent of the sequence length. Memory: the ids of the current window
//! and the accumulated text.

use crate::{Tokenizer, TokenizerError};
use std::sync::Arc;

/// Streams the text of a growing id sequence.
pub struct IncrementalDecoder {
    tok: Arc<Tokenizer>,
    skip_special: bool,
    /// Ids from `base` on (earlier ids are no longer needed).
    window: Vec<u32>,
    /// Start of the ids decoded as context, relative to `window`.
    prefix_offset: usize,
    /// End of the ids whose text was already emitted, relative to `window`.
    read_offset: usize,
    /// All text emitted so far.
    text: String,
    /// Number of ids pushed.
    pushed: usize,
    /// Whether pushed ids have text not yet emitted (an incomplete character).
    holding: bool,
}

impl IncrementalDecoder {
    pub fn new(tok: Arc<Tokenizer>, skip_special: bool) -> Self {
        Self {
            tok,
            skip_special,
            window: Vec::new(),
            prefix_offset: 0,
            read_offset: 0,
            text: String::new(),
            pushed: 0,
            holding: false,
        }
    }

    /// Adds one id; returns the text it completes (maybe empty).
    pub fn push(&mut self, id: u32) -> Result<String, TokenizerError> {
        self.pushed += 1;
        if id as usize >= self.tok.vocab_size() {
            return Ok(String::new()); // no text (module doc)
        }
        self.window.push(id);
        let prefix_text = self.decode(self.prefix_offset, self.read_offset)?;
        let new_text = self.decode(self.prefix_offset, self.window.len())?;
        // ids that add no text (a skipped special token) hold nothing back
        self.holding = new_text != prefix_text;
        if new_text.len() <= prefix_text.len() || new_text.ends_with('\u{FFFD}') {
            return Ok(String::new());
        }
        let Some(delta) = delta(&prefix_text, &new_text) else {
            return Ok(String::new());
        };
        self.holding = false;
        let delta = delta.to_string();
        self.text.push_str(&delta);
        // The old read offset becomes the new context start; drop older ids.
        let drop = self.read_offset;
        self.window.drain(..drop);
        self.prefix_offset = 0;
        self.read_offset = self.window.len();
        Ok(delta)
    }

    /// Emits any held-back text (an incomplete character becomes U+FFFD).
    /// Call once the sequence is finished.
    pub fn flush(&mut self) -> Result<String, TokenizerError> {
        let prefix_text = self.decode(self.prefix_offset, self.read_offset)?;
        let new_text = self.decode(self.prefix_offset, self.window.len())?;
        let out = delta(&prefix_text, &new_text)
            .unwrap_or_default()
            .to_string();
        self.text.push_str(&out);
        self.holding = false;
        self.window.drain(..self.read_offset);
        self.prefix_offset = 0;
        self.read_offset = self.window.len();
        Ok(out)
    }

    /// All text emitted so far.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Whether the ids pushed since the last emitted text decode to text
    /// held back (an incomplete character); false after ids that add no
    /// text, such as skipped special tokens.
    pub fn holding(&self) -> bool {
        self.holding
    }

    /// Number of ids pushed so far.
    pub fn num_tokens(&self) -> usize {
        self.pushed
    }

    fn decode(&self, start: usize, end: usize) -> Result<String, TokenizerError> {
        if start >= end {
            return Ok(String::new());
        }
        self.tok.decode(&self.window[start..end], self.skip_special)
    }
}

/// The part of `new` after `prefix`, when `new` extends it (or at least has a
/// character boundary at `prefix.len()`).
fn delta<'a>(prefix: &str, new: &'a str) -> Option<&'a str> {
    new.get(prefix.len()..)
}

#[cfg(test)]
mod tests;
