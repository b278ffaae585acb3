//! Anthropic's reply to a submitted messages request: the whole `message`
//! object, or its SSE event sequence (see the module doc of
//! [`crate::anthropic`]).
//!
//! Contract: `stop_reason` is `tool_use` when the reply ends with calls of
//! the request's tools (then the content is a `text` block of the text
//! before them, if any, and their `tool_use` blocks),
//! `max_tokens` when the limit cut it, `stop_sequence` (with
//! `stop_sequence` set to the one matched) when a stop sequence ended it,
//! else `end_turn`. Streamed, the text goes out as it comes and a call is
//! held back until the reply ends, as on the chat path; the text block
//! (index 0) stops before the `tool_use` blocks start.
//! `usage.input_tokens` counts the prompt tokens not read from the prefix
//! cache, `cache_read_input_tokens` those that were (Anthropic's split);
//! their sum is what `count_tokens` answers. An engine failure mid-stream
//! is an `error` event. Dropping the response (client gone) cancels the
//! request. Costs: O(1) per token; the stop sequence is found by decoding
//! the reply's tokens once at its end.

use std::convert::Infallible;

use axum::Json;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use engine::{Event, FinishReason, Finished, RequestHandle, Usage};
use futures::stream::{self, Stream, StreamExt};
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::error::anthropic::error_body;
use crate::generate::{Active, Job, engine_gone, failure};
use crate::tools::{CallStream, ParsedCall};

/// The response for a submitted request (one choice).
pub async fn respond(
    job: Job,
    mut handles: Vec<RequestHandle>,
    stream: bool,
    stops: Vec<String>,
) -> Result<Response, ApiError> {
    let Some(handle) = handles.pop() else {
        return Err(engine_gone());
    };
    let active = Active::new(job.clone(), handle, 0);
    let reply = Reply {
        job,
        active,
        stops,
        text: String::new(),
        tokens: Vec::new(),
    };
    if stream {
        let keep = reply.job.state.cfg.sse_keep_alive;
        Ok(Sse::new(events(reply))
            .keep_alive(KeepAlive::new().interval(keep).event(ping()))
            .into_response())
    } else {
        whole(reply).await
    }
}

/// A running reply: what it produced so far.
struct Reply {
    job: Job,
    active: Active,
    stops: Vec<String>,
    text: String,
    tokens: Vec<u32>,
}

impl Reply {
    /// The stop sequence that ended the reply, if one did: the earliest
    /// one in what the tokens decode to past the returned text.
    fn matched_stop(&self) -> Option<String> {
        if self.stops.is_empty() {
            return None;
        }
        let full = self.job.served.tokenizer.decode(&self.tokens, false).ok()?;
        let rest = full.strip_prefix(self.text.as_str())?;
        self.stops
            .iter()
            .filter_map(|s| rest.find(s.as_str()).map(|at| (at, s)))
            .min_by_key(|(at, _)| *at)
            .map(|(_, s)| s.clone())
    }

    /// `stop_reason` and `stop_sequence` of a reply that is not a call.
    fn stop(&self, reason: FinishReason) -> (&'static str, Option<String>) {
        match reason {
            FinishReason::Length => ("max_tokens", None),
            _ => match self.matched_stop() {
                Some(s) => ("stop_sequence", Some(s)),
                None => ("end_turn", None),
            },
        }
    }

    /// Calls as `tool_use` blocks.
    fn tool_uses(&self, calls: Vec<ParsedCall>) -> Vec<Value> {
        self.job
            .tool_calls(0, calls)
            .into_iter()
            .map(|c| {
                let input: Value =
                    serde_json::from_str(&c.function.arguments).unwrap_or_else(|_| json!({}));
                json!({"type": "tool_use", "id": c.id.replacen("call_", "toolu_", 1),
                    "name": c.function.name, "input": input})
            })
            .collect()
    }
}

/// Anthropic's `usage` (see the module doc).
fn usage(u: &Usage) -> Value {
    json!({
        "input_tokens": u.prompt_tokens.saturating_sub(u.cached_tokens),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": u.cached_tokens,
        "output_tokens": u.completion_tokens,
    })
}

/// Drains the reply into one `message` object.
async fn whole(mut r: Reply) -> Result<Response, ApiError> {
    let finished = loop {
        match r.active.next().await {
            Some(Event::Token(t)) => {
                r.tokens.push(t.token);
                r.text.push_str(&t.text);
            }
            Some(Event::Done(f)) => break f,
            None => return Err(engine_gone()),
        }
    };
    if let Some(err) = failure(&r.job, &finished) {
        return Err(err);
    }
    let split = r.job.split(&r.text, finished.reason);
    let mut content = Vec::with_capacity(1 + split.calls.len());
    if !split.content.is_empty() {
        content.push(json!({"type": "text", "text": split.content}));
    }
    let (reason, seq) = if split.calls.is_empty() {
        r.stop(finished.reason)
    } else {
        content.extend(r.tool_uses(split.calls));
        ("tool_use", None)
    };
    Ok(Json(json!({
        "id": r.job.id, "type": "message", "role": "assistant", "model": r.job.model,
        "content": content, "stop_reason": reason, "stop_sequence": seq,
        "usage": usage(&finished.usage),
    }))
    .into_response())
}

fn event(name: &str, data: Value) -> SseEvent {
    SseEvent::default().event(name).data(data.to_string())
}

fn ping() -> SseEvent {
    event("ping", json!({"type": "ping"}))
}

/// Where the stream is.
enum Phase {
    Start,
    Tokens,
    End,
}

struct Streaming {
    reply: Reply,
    phase: Phase,
    /// With tools: the reader of text and calls.
    calls: Option<CallStream>,
    /// The text block was started.
    text_open: bool,
}

/// The SSE events of a streamed reply.
fn events(reply: Reply) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    let calls = reply.job.call_stream();
    let st = Streaming {
        reply,
        phase: Phase::Start,
        calls,
        text_open: false,
    };
    stream::unfold(st, |mut st| async move {
        let out = step(&mut st).await?;
        Some((out, st))
    })
    .flat_map(|evs| stream::iter(evs.into_iter().map(Ok)))
}

/// The events carrying `text` in the text block (opened first if needed).
fn text_events(st: &mut Streaming, text: &str) -> Vec<SseEvent> {
    let mut out = Vec::with_capacity(2);
    if !st.text_open {
        st.text_open = true;
        out.push(event(
            "content_block_start",
            json!({"type": "content_block_start", "index": 0,
                "content_block": {"type": "text", "text": ""}}),
        ));
    }
    out.push(event(
        "content_block_delta",
        json!({"type": "content_block_delta", "index": 0,
            "delta": {"type": "text_delta", "text": text}}),
    ));
    out
}

/// The next events, or `None` once the stream ended.
async fn step(st: &mut Streaming) -> Option<Vec<SseEvent>> {
    match st.phase {
        Phase::End => None,
        Phase::Start => {
            st.phase = Phase::Tokens;
            let r = &st.reply;
            let start = json!({"type": "message_start", "message": {
                "id": r.job.id, "type": "message", "role": "assistant", "model": r.job.model,
                "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": r.job.prompt_tokens, "output_tokens": 0}}});
            Some(vec![event("message_start", start), ping()])
        }
        Phase::Tokens => loop {
            match st.reply.active.next().await {
                Some(Event::Token(t)) => {
                    st.reply.tokens.push(t.token);
                    st.reply.text.push_str(&t.text);
                    if let Some(calls) = st.calls.as_mut() {
                        let text = calls.push(&t.text).to_string();
                        if text.is_empty() {
                            continue;
                        }
                        return Some(text_events(st, &text));
                    }
                    if t.text.is_empty() {
                        continue;
                    }
                    return Some(text_events(st, &t.text));
                }
                Some(Event::Done(f)) => {
                    st.phase = Phase::End;
                    return Some(finish(st, &f));
                }
                None => {
                    st.phase = Phase::End;
                    return Some(vec![event("error", error_body(&engine_gone()))]);
                }
            }
        },
    }
}

/// The closing events of a finished reply.
fn finish(st: &mut Streaming, f: &Finished) -> Vec<SseEvent> {
    if let Some(err) = failure(&st.reply.job, f) {
        return vec![event("error", error_body(&err))];
    }
    let mut out = Vec::new();
    let mut calls = Vec::new();
    if let Some(reader) = st.calls.take() {
        let split = st.reply.job.finish_calls(reader, f.reason);
        if !split.content.is_empty() {
            out.extend(text_events(st, &split.content));
        }
        calls = split.calls;
    }
    // the text block first (index 0), stopped before the calls' blocks
    let first = usize::from(st.text_open);
    if st.text_open {
        out.push(event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ));
    }
    let tool_use = !calls.is_empty();
    for (k, mut block) in st.reply.tool_uses(calls).into_iter().enumerate() {
        let index = first + k;
        let input = block["input"].take();
        block["input"] = json!({});
        out.push(event(
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": block}),
        ));
        out.push(event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": index,
                "delta": {"type": "input_json_delta", "partial_json": input.to_string()}}),
        ));
        out.push(event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ));
    }
    let (reason, seq) = if tool_use {
        ("tool_use", None)
    } else {
        st.reply.stop(f.reason)
    };
    out.push(event(
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": seq},
            "usage": usage(&f.usage)}),
    ));
    out.push(event("message_stop", json!({"type": "message_stop"})));
    out
}
