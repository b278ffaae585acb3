//! Running one accepted request through the engine and shaping its events
//! into an OpenAI response: a single JSON body, or an SSE stream of
//! `data: {chunk}` events ending with `data: [DONE]`.
//!
//! Contract: the [`engine::RequestHandle`] lives inside the response future
//! or the SSE stream, so when the client goes away (hyper drops the stream)
//! the handle is dropped and the engine cancels the request and frees its KV
//! blocks. `cancelled` never reaches a live client as a finish reason: it
//! only happens on shutdown, which is reported as an error event / 503.
//! Latency metrics (TTFT, inter-token, end-to-end) are recorded here, O(1)
//! per token.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use engine::{Event, FinishReason, Finished, RequestHandle, TokenEvent, Usage};
use futures::Stream;
use futures::stream::{self, StreamExt};
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::logprobs;
use crate::state::{AppState, unix_now};

/// Which API a request came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Chat,
    Completion,
}

/// Everything about an accepted request needed to shape its response.
#[derive(Clone)]
pub struct Job {
    pub state: Arc<AppState>,
    pub kind: Kind,
    pub request_id: u64,
    /// The response id (`chatcmpl-…`, `cmpl-…`).
    pub id: String,
    pub created: u64,
    pub model: String,
    /// `Some(k)` when log-probabilities were asked for, with `k` alternatives.
    pub logprobs: Option<usize>,
    pub include_usage: bool,
    /// When the request arrived (TTFT and end-to-end latency start here).
    pub arrived: Instant,
}

impl Job {
    pub fn new(state: Arc<AppState>, kind: Kind, request_id: u64, arrived: Instant) -> Self {
        let prefix = match kind {
            Kind::Chat => "chatcmpl",
            Kind::Completion => "cmpl",
        };
        let model = state.cfg.model_id.clone();
        Job {
            state,
            kind,
            request_id,
            id: format!("{prefix}-{request_id}"),
            created: unix_now(),
            model,
            logprobs: None,
            include_usage: false,
            arrived,
        }
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Completion, _) => "text_completion",
        }
    }

    /// The response (or stream) for an accepted request.
    pub async fn respond(self, handle: RequestHandle, stream: bool) -> Result<Response, ApiError> {
        let active = Active::new(self, handle);
        if stream {
            Ok(Sse::new(sse_stream(active)).into_response())
        } else {
            complete(active).await
        }
    }

    fn logprobs_value(&self, events: &[TokenEvent], offset: &mut usize) -> Value {
        let Some(k) = self.logprobs else {
            return Value::Null;
        };
        let tok = &self.state.tokenizer;
        match self.kind {
            Kind::Chat => logprobs::chat(tok, events, k),
            Kind::Completion => logprobs::completion(tok, events, k, offset),
        }
    }

    /// One choice carrying `text`, with an optional finish reason.
    fn choice(&self, text: &str, logprobs: Value, finish: Option<&str>, chunk: bool) -> Value {
        match (self.kind, chunk) {
            (Kind::Chat, false) => json!({
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": logprobs,
                "finish_reason": finish,
            }),
            (Kind::Chat, true) => {
                let delta = if finish.is_some() && text.is_empty() {
                    json!({})
                } else {
                    json!({"content": text})
                };
                json!({"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish})
            }
            (Kind::Completion, _) => json!({
                "index": 0,
                "text": text,
                "logprobs": logprobs,
                "finish_reason": finish,
            }),
        }
    }

    /// A streamed chunk wrapping `choices`.
    fn chunk(&self, choices: Vec<Value>) -> Value {
        let mut v = json!({
            "id": self.id,
            "object": self.object(true),
            "created": self.created,
            "model": self.model,
            "choices": choices,
        });
        if self.include_usage {
            v["usage"] = Value::Null;
        }
        v
    }
}

/// OpenAI's `usage` object.
pub fn usage_json(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    })
}

/// A running request: the engine handle plus latency bookkeeping.
struct Active {
    job: Job,
    handle: RequestHandle,
    last_token: Option<Instant>,
    done: bool,
}

impl Active {
    fn new(job: Job, handle: RequestHandle) -> Self {
        Active {
            job,
            handle,
            last_token: None,
            done: false,
        }
    }

    /// The next engine event, with metrics recorded.
    async fn next(&mut self) -> Option<Event> {
        let ev = self.handle.next().await;
        let now = Instant::now();
        let m = &self.job.state.metrics;
        match &ev {
            Some(Event::Token(_)) => {
                match self.last_token {
                    None => m.ttft.observe(now - self.job.arrived),
                    Some(prev) => m.itl.observe(now - prev),
                }
                self.last_token = Some(now);
            }
            Some(Event::Done(f)) => {
                self.done = true;
                m.e2e.observe(now - self.job.arrived);
                m.finished(f.reason.as_str());
                tracing::info!(
                    request_id = self.job.request_id,
                    finish_reason = f.reason.as_str(),
                    prompt_tokens = f.usage.prompt_tokens,
                    cached_tokens = f.usage.cached_tokens,
                    completion_tokens = f.usage.completion_tokens,
                    e2e_ms = (now - self.job.arrived).as_millis() as u64,
                    error = f.error.as_deref().unwrap_or(""),
                    "request finished"
                );
            }
            None => self.done = true,
        }
        ev
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        if !self.done {
            // dropping `handle` right after this cancels the request in the engine
            self.job.state.metrics.finished("cancelled");
            tracing::info!(
                request_id = self.job.request_id,
                "client went away; request cancelled"
            );
        }
    }
}

/// The error a request that did not finish normally reports.
fn failure(f: &Finished) -> Option<ApiError> {
    match f.reason {
        FinishReason::Stop | FinishReason::Length => None,
        FinishReason::Cancelled => Some(ApiError::shutting_down()),
        FinishReason::Error => Some(ApiError::internal(format!(
            "Generation failed: {}",
            f.error.as_deref().unwrap_or("unknown engine error")
        ))),
    }
}

fn engine_gone() -> ApiError {
    ApiError::internal("The engine stopped before the request finished.")
}

/// Drains the request and answers with one JSON body.
async fn complete(mut active: Active) -> Result<Response, ApiError> {
    let mut text = String::new();
    let mut events = Vec::new();
    let mut align = logprobs::Aligner::default();
    let finished = loop {
        match active.next().await {
            Some(Event::Token(t)) => {
                text.push_str(&t.text);
                if active.job.logprobs.is_some()
                    && let Some(out) = align.push(t)
                {
                    events.extend(out);
                }
            }
            Some(Event::Done(f)) => {
                events.extend(align.finish(f.reason));
                break f;
            }
            None => return Err(engine_gone()),
        }
    };
    if let Some(err) = failure(&finished) {
        return Err(err);
    }
    let job = &active.job;
    let lp = job.logprobs_value(&events, &mut 0);
    let choice = job.choice(&text, lp, Some(finished.reason.as_str()), false);
    Ok(Json(json!({
        "id": job.id,
        "object": job.object(false),
        "created": job.created,
        "model": job.model,
        "choices": [choice],
        "usage": usage_json(&finished.usage),
    }))
    .into_response())
}

fn data(v: &Value) -> SseEvent {
    SseEvent::default().data(v.to_string())
}

fn done_marker() -> SseEvent {
    SseEvent::default().data("[DONE]")
}

/// Where a stream is.
enum Phase {
    Start,
    Tokens,
    End,
}

struct StreamState {
    active: Active,
    phase: Phase,
    /// Completion `text_offset` of the next token.
    offset: usize,
    /// Log-probability entries waiting for their text.
    align: logprobs::Aligner,
}

/// The SSE events of a streamed request. Owns the engine handle: dropping
/// the stream (client disconnect) cancels the request.
fn sse_stream(active: Active) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    let st = StreamState {
        active,
        phase: Phase::Start,
        offset: 0,
        align: logprobs::Aligner::default(),
    };
    stream::unfold(st, |mut st| async move {
        let events = step(&mut st).await?;
        Some((events, st))
    })
    .flat_map(|events| stream::iter(events.into_iter().map(Ok)))
}

/// The next batch of SSE events, or `None` once `[DONE]` was sent.
async fn step(st: &mut StreamState) -> Option<Vec<SseEvent>> {
    let job = st.active.job.clone();
    match st.phase {
        Phase::End => None,
        Phase::Start => {
            st.phase = Phase::Tokens;
            let first = match job.kind {
                // OpenAI opens a chat stream with the role
                Kind::Chat => vec![data(&job.chunk(vec![json!({
                    "index": 0,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": null,
                    "finish_reason": null,
                })]))],
                Kind::Completion => Vec::new(),
            };
            Some(first)
        }
        Phase::Tokens => loop {
            match st.active.next().await {
                Some(Event::Token(t)) => {
                    // held-back text (a possible stop string) gives empty
                    // deltas: no chunk; its logprobs go with the text
                    if t.text.is_empty() && job.logprobs.is_none() {
                        continue;
                    }
                    let text = t.text.clone();
                    let Some(evs) = st.align.push(t) else {
                        continue;
                    };
                    let lp = job.logprobs_value(&evs, &mut st.offset);
                    let choice = job.choice(&text, lp, None, true);
                    return Some(vec![data(&job.chunk(vec![choice]))]);
                }
                Some(Event::Done(f)) => {
                    st.phase = Phase::End;
                    if let Some(err) = failure(&f) {
                        return Some(vec![data(&err.body()), done_marker()]);
                    }
                    let reason = f.reason.as_str();
                    let mut out = Vec::new();
                    let rest = st.align.finish(f.reason);
                    if !rest.is_empty() {
                        let lp = job.logprobs_value(&rest, &mut st.offset);
                        out.push(data(&job.chunk(vec![job.choice("", lp, None, true)])));
                    }
                    out.push(data(&job.chunk(vec![job.choice(
                        "",
                        Value::Null,
                        Some(reason),
                        true,
                    )])));
                    if job.include_usage {
                        let mut last = job.chunk(Vec::new());
                        last["usage"] = usage_json(&f.usage);
                        out.push(data(&last));
                    }
                    out.push(done_marker());
                    return Some(out);
                }
                None => {
                    st.phase = Phase::End;
                    return Some(vec![data(&engine_gone().body()), done_marker()]);
                }
            }
        },
    }
}
