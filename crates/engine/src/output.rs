//! One request's output side: detokenizing, stop conditions and streaming.
//!
//! Contract: [`Output::on_token`] is called once per sampled token, in order.
//! It sends one [`Event::Token`] per token (an EOS that ends the request
//! included, with empty text) and says whether the request is finished:
//! EOS (unless `ignore_eos`), a stop token id or a stop string -> `Stop`, `max_tokens`
//! generated -> `Length`, the handle gone -> `Cancelled`, a detokenizer
//! failure -> `Error`. Text is held back while it could still become a stop
//! string and released at the end; streamed text never contains a stop string.
//!
//! Costs per token: O(new text + Σ stop lengths²) (see [`crate::stop`]); one
//! channel send.

use std::sync::Arc;

use contract::SampledToken;
use tokenizer::detok::IncrementalDecoder;
use tokenizer::{Tokenizer, TokenizerError};
use tokio::sync::mpsc::UnboundedSender;

use crate::stop::{Pushed, StopText};
use crate::types::{Event, FinishReason, Finished, TokenEvent, Usage};

/// Whether a request goes on after a token.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Verdict {
    Continue,
    Finish(FinishReason, Option<String>),
}

/// Per-request output state, owned by the engine loop.
pub(crate) struct Output {
    tx: UnboundedSender<Event>,
    detok: IncrementalDecoder,
    stop: StopText,
    max_tokens: usize,
    ignore_eos: bool,
    stop_ids: Vec<u32>,
    generated: usize,
}

impl Output {
    pub(crate) fn new(
        tx: UnboundedSender<Event>,
        tokenizer: Arc<Tokenizer>,
        stop: &[String],
        max_tokens: usize,
        ignore_eos: bool,
        stop_ids: Vec<u32>,
    ) -> Self {
        Output {
            tx,
            detok: IncrementalDecoder::new(tokenizer, true),
            stop: StopText::new(stop),
            max_tokens,
            ignore_eos,
            stop_ids,
            generated: 0,
        }
    }

    /// Handles one sampled token; `eos` is the model's EOS list.
    pub(crate) fn on_token(&mut self, t: SampledToken, eos: &[u32]) -> Verdict {
        self.generated += 1;
        let ends = self.ends_on(t.token, self.generated, eos);
        let is_eos = ends == Some(FinishReason::Stop);
        let ending = ends.is_some();
        let mut piece = if is_eos {
            String::new()
        } else {
            match self.detok.push(t.token) {
                Ok(p) => p,
                Err(e) => return detok_failed(t.token, e),
            }
        };
        if ending {
            // an incomplete character left at the end becomes U+FFFD
            match self.detok.flush() {
                Ok(rest) => piece.push_str(&rest),
                Err(e) => return detok_failed(t.token, e),
            }
        }
        let (text, verdict) = match self.stop.push(&piece) {
            Pushed::Stop(delta) => (delta, Verdict::Finish(FinishReason::Stop, None)),
            Pushed::Continue(mut delta) if ending => {
                delta.push_str(&self.stop.flush());
                let reason = if is_eos {
                    FinishReason::Stop
                } else {
                    FinishReason::Length
                };
                (delta, Verdict::Finish(reason, None))
            }
            Pushed::Continue(delta) => (delta, Verdict::Continue),
        };
        // a stop (EOS, a stop id or string) adds no text: its entry is held
        // and dropped when the request ends
        let stopped = matches!(verdict, Verdict::Finish(FinishReason::Stop, _));
        let held = stopped || self.detok.holding() || self.stop.holding();
        if self
            .tx
            .send(Event::Token(TokenEvent::new(t, text, held)))
            .is_err()
        {
            return Verdict::Finish(FinishReason::Cancelled, None);
        }
        verdict
    }

    /// Whether the next sampled token `token` ends the request on its id alone
    /// (EOS unless ignored, a stop token id, or `max_tokens` reached), given `generated` tokens
    /// committed so far including it. Decided at commit time, before its text
    /// is processed, so the scheduler never runs such a sequence again.
    pub(crate) fn ends_on(
        &self,
        token: u32,
        generated: usize,
        eos: &[u32],
    ) -> Option<FinishReason> {
        if (!self.ignore_eos && eos.contains(&token)) || self.stop_ids.contains(&token) {
            Some(FinishReason::Stop)
        } else if generated >= self.max_tokens {
            Some(FinishReason::Length)
        } else {
            None
        }
    }

    /// Tokens handled so far (what the user has been sent).
    pub(crate) fn generated(&self) -> usize {
        self.generated
    }

    /// Sends the final event (ignored when the handle is gone).
    pub(crate) fn finish(
        self,
        reason: FinishReason,
        usage: Usage,
        error: Option<String>,
        queue_time: Option<std::time::Duration>,
    ) {
        let _ = self.tx.send(Event::Done(Finished {
            reason,
            usage,
            error,
            queue_time,
        }));
    }
}

fn detok_failed(token: u32, e: TokenizerError) -> Verdict {
    Verdict::Finish(
        FinishReason::Error,
        Some(format!("cannot detokenize token {token}: {e}")),
    )
}
