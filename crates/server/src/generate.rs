//! Running one accepted request through the engine and shaping its events
//! into an OpenAI response: a single JSON body, or an SSE stream of
//! `data: {chunk}` events ending with `data: [DONE]`.
//!
//! Contract: the [`engine::RequestHandle`]s (one per choice, `n` / `best_of`)
//! live inside the response future or the SSE stream, so when the client
//! goes away (hyper drops the stream) the handles are dropped and the engine
//! cancels every choice and frees its KV blocks. `cancelled` never reaches a
//! live client as a finish reason: it only happens on shutdown, which is
//! reported as an error event / 503. Choices stream interleaved, each chunk
//! naming its `index`; usage counts the prompt once and the completion
//! tokens of every choice generated (all of `best_of`). A streamed response
//! sends an SSE comment (`: keep-alive`) whenever no event went out for
//! `ServerConfig::sse_keep_alive`, also while the request waits in the
//! engine's queue. Latency metrics (TTFT, inter-token, end-to-end) are
//! recorded on choice 0, O(1) per token. With tools, a reply that ends
//! with calls of known functions ([`crate::tools::split_reply`]) is
//! answered as `tool_calls` with `finish_reason: "tool_calls"`, the text
//! before them (if any) as `content`; streamed, that text goes out as
//! content deltas as it comes and the calls, held back from their first
//! character until the reply ends, as `delta.tool_calls` chunks (or as
//! content when they do not parse). With a reasoning parser, a chat reply's
//! reasoning is split off first ([`crate::reasoning`]): `reasoning_content`
//! (streamed: `delta.reasoning_content`), and the calls are read from the
//! rest. The SSE side is in `generate/sse.rs`.

use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::response::sse::{KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use engine::{Event, FinishReason, Finished, RequestHandle, TokenEvent, Usage};
use serde_json::Value;

use crate::error::ApiError;
use crate::logprobs;
use crate::models::Lease;
use crate::responses::{
    AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletion, ChatCompletionChunk, ChatDelta,
    CompletionChoice, TextCompletion, UsageInfo,
};
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
    /// The model running it, held until the response ends.
    pub served: Lease,
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
    /// Completions with `echo`: the prompt text each choice starts with.
    pub echo: Option<String>,
    /// Choices returned (`n`); fewer than the handles when `best_of` > `n`.
    pub n: usize,
    /// The replica running it.
    pub replica: usize,
    /// Chat with tools: the callable names; a reply that is a call of one
    /// becomes `tool_calls` (see [`crate::tools`]).
    pub tool_names: Option<Arc<Vec<String>>>,
    /// Several tool calls per reply allowed (`parallel_tool_calls`).
    pub parallel_tool_calls: bool,
    /// How the model writes tool calls.
    pub call_format: crate::tools::CallFormat,
    /// Chat with a reasoning parser: whether the reply thinks; its
    /// reasoning is then split from its content ([`crate::reasoning`]).
    pub thinking: Option<bool>,
    /// The field the request's constraint came from, if it has one.
    pub constraint_param: Option<&'static str>,
    /// Tokens of the prompt as submitted.
    pub prompt_tokens: usize,
}

impl Job {
    pub fn new(
        state: Arc<AppState>,
        served: Lease,
        kind: Kind,
        request_id: u64,
        arrived: Instant,
    ) -> Self {
        let prefix = match kind {
            Kind::Chat => "chatcmpl",
            Kind::Completion => "cmpl",
        };
        let model = served.name().to_string();
        Job {
            state,
            served,
            kind,
            request_id,
            id: format!("{prefix}-{request_id}"),
            created: unix_now(),
            model,
            logprobs: None,
            include_usage: false,
            arrived,
            echo: None,
            n: 1,
            replica: 0,
            tool_names: None,
            parallel_tool_calls: true,
            call_format: crate::tools::CallFormat::default(),
            thinking: None,
            constraint_param: None,
            prompt_tokens: 0,
        }
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Completion, _) => "text_completion",
        }
    }

    /// The response (or stream) for an accepted request, one handle per
    /// choice generated, in choice order.
    pub async fn respond(
        self,
        handles: Vec<RequestHandle>,
        stream: bool,
    ) -> Result<Response, ApiError> {
        let keep_alive = self.state.cfg.sse_keep_alive;
        let actives: Vec<Active> = handles
            .into_iter()
            .enumerate()
            .map(|(i, h)| Active::new(self.clone(), h, i))
            .collect();
        if stream {
            let sse = Sse::new(sse_stream(self, actives));
            Ok(sse
                .keep_alive(KeepAlive::new().interval(keep_alive).text("keep-alive"))
                .into_response())
        } else {
            complete(self, actives).await
        }
    }

    fn logprobs_value(&self, events: &[TokenEvent], offset: &mut usize) -> Value {
        let Some(k) = self.logprobs else {
            return Value::Null;
        };
        let tok = &self.served.tokenizer;
        match self.kind {
            Kind::Chat => logprobs::chat(tok, events, k),
            Kind::Completion => logprobs::completion(tok, events, k, offset),
        }
    }

    /// Choice `index` carrying `text`, with an optional finish reason.
    fn choice(
        &self,
        index: usize,
        text: &str,
        logprobs: Value,
        finish: Option<&'static str>,
        chunk: bool,
    ) -> Choice {
        match (self.kind, chunk) {
            (Kind::Chat, false) => Choice::Chat(ChatChoice {
                index,
                message: AssistantMessage {
                    role: "assistant",
                    content: Some(text.to_string()),
                    reasoning_content: None,
                    tool_calls: None,
                },
                logprobs,
                finish_reason: finish,
            }),
            (Kind::Chat, true) => {
                let delta = ChatDelta {
                    role: None,
                    content: (finish.is_none() || !text.is_empty()).then(|| text.to_string()),
                    reasoning_content: None,
                    tool_calls: None,
                };
                Choice::ChatChunk(ChatChunkChoice {
                    index,
                    delta,
                    logprobs,
                    finish_reason: finish,
                })
            }
            (Kind::Completion, _) => Choice::Text(CompletionChoice {
                index,
                text: text.to_string(),
                logprobs,
                finish_reason: finish,
            }),
        }
    }

    /// The response object wrapping `choices`: a streamed chunk (`usage`
    /// `null` while streaming when asked for, `usage_now` in the last), or
    /// the whole answer (`chunk` false, `usage_now` set).
    fn envelope(&self, choices: Vec<Choice>, usage_now: Option<UsageInfo>, chunk: bool) -> Value {
        let usage = match (chunk, usage_now) {
            (_, Some(u)) => Some(Some(u)),
            (true, None) if self.include_usage => Some(None),
            _ => None,
        };
        let (id, created, model) = (self.id.clone(), self.created, self.model.clone());
        let object = self.object(chunk);
        let v = match (self.kind, chunk) {
            (Kind::Chat, false) => serde_json::to_value(ChatCompletion {
                id,
                object,
                created,
                model,
                choices: choices.into_iter().filter_map(Choice::into_chat).collect(),
                usage: usage
                    .flatten()
                    .unwrap_or_else(|| UsageInfo::from(&Usage::default())),
            }),
            (Kind::Chat, true) => serde_json::to_value(ChatCompletionChunk {
                id,
                object,
                created,
                model,
                choices: choices.into_iter().filter_map(Choice::into_chunk).collect(),
                usage,
            }),
            (Kind::Completion, _) => serde_json::to_value(TextCompletion {
                id,
                object,
                created,
                model,
                choices: choices.into_iter().filter_map(Choice::into_text).collect(),
                usage,
            }),
        };
        // plain data of strings and numbers: serialization cannot fail
        v.unwrap_or(Value::Null)
    }

    /// A streamed chunk wrapping `choices`.
    fn chunk(&self, choices: Vec<Choice>) -> Value {
        self.envelope(choices, None, true)
    }
}

/// One choice in any of the three shapes.
enum Choice {
    Chat(ChatChoice),
    ChatChunk(ChatChunkChoice),
    Text(CompletionChoice),
}

impl Choice {
    fn into_chat(self) -> Option<ChatChoice> {
        match self {
            Choice::Chat(c) => Some(c),
            _ => None,
        }
    }
    fn into_chunk(self) -> Option<ChatChunkChoice> {
        match self {
            Choice::ChatChunk(c) => Some(c),
            _ => None,
        }
    }
    fn into_text(self) -> Option<CompletionChoice> {
        match self {
            Choice::Text(c) => Some(c),
            _ => None,
        }
    }
}

/// Usage of a whole request from its choices' usages: the prompt (and its
/// cached part) once, the completion tokens of every choice.
fn total_usage(choices: &[Usage]) -> Usage {
    let first = choices.first().copied().unwrap_or_default();
    Usage {
        prompt_tokens: first.prompt_tokens,
        cached_tokens: first.cached_tokens,
        completion_tokens: choices.iter().map(|u| u.completion_tokens).sum(),
    }
}

/// One running choice: the engine handle plus latency bookkeeping (kept
/// for choice 0 only, so a request counts once in the metrics).
pub(crate) struct Active {
    pub(crate) job: Job,
    handle: RequestHandle,
    index: usize,
    last_token: Option<Instant>,
    first_token: Option<Instant>,
    done: bool,
}

/// The log target of the one line per finished request (`lamina serve`
/// shows it at its default level; `--log-requests false` hides it).
pub const REQUEST_LOG: &str = "lamina::requests";

impl Active {
    pub(crate) fn new(job: Job, handle: RequestHandle, index: usize) -> Self {
        Active {
            job,
            handle,
            index,
            last_token: None,
            first_token: None,
            done: false,
        }
    }

    /// The next engine event, with metrics recorded.
    pub(crate) async fn next(&mut self) -> Option<Event> {
        let ev = self.handle.next().await;
        if self.index != 0 {
            if matches!(ev, None | Some(Event::Done(_))) {
                self.done = true;
            }
            return ev;
        }
        let now = Instant::now();
        let m = &self.job.served.metrics();
        match &ev {
            Some(Event::Token(_)) => {
                match self.last_token {
                    None => {
                        m.ttft.observe(now - self.job.arrived);
                        self.first_token = Some(now);
                    }
                    Some(prev) => m.itl.observe(now - prev),
                }
                self.last_token = Some(now);
            }
            Some(Event::Done(f)) => {
                self.done = true;
                m.e2e.observe(now - self.job.arrived);
                if let Some(q) = f.queue_time {
                    m.queue.observe(q);
                }
                m.finished(f.reason.as_str());
                let ttft = self.first_token.map(|t| t - self.job.arrived);
                // the per-request line `lamina serve` shows at its default level
                tracing::info!(
                    target: REQUEST_LOG,
                    request_id = self.job.request_id,
                    engine = self.job.replica,
                    finish_reason = f.reason.as_str(),
                    prompt_tokens = f.usage.prompt_tokens,
                    cached_tokens = f.usage.cached_tokens,
                    completion_tokens = f.usage.completion_tokens,
                    ttft_ms = ttft.map_or(0, |t| t.as_millis() as u64),
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
        if !self.done && self.index == 0 {
            // dropping `handle` right after this cancels the request in the engine
            self.job.served.metrics().finished("cancelled");
            tracing::info!(
                target: REQUEST_LOG,
                request_id = self.job.request_id,
                e2e_ms = self.job.arrived.elapsed().as_millis() as u64,
                "client went away; request cancelled"
            );
        }
    }
}

/// The error a request that did not finish normally reports: its
/// constraint failing (the grammar engine refusing a step) is a 400 naming
/// the constraint's field, anything else a 500.
pub(crate) fn failure(job: &Job, f: &Finished) -> Option<ApiError> {
    let constraint = f
        .error
        .as_deref()
        .and_then(|e| e.strip_prefix(engine::Constraint::FAILURE_PREFIX));
    match (f.reason, constraint, job.constraint_param) {
        (FinishReason::Stop | FinishReason::Length, ..) => None,
        (FinishReason::Cancelled, ..) => Some(ApiError::shutting_down()),
        (FinishReason::Error, Some(why), Some(param)) => Some(ApiError::invalid_param(
            param,
            format!("Invalid `{param}`: the constraint cannot be followed: {why}"),
        )),
        (FinishReason::Error, ..) => Some(ApiError::internal(format!(
            "Generation failed (model `{}`): {}",
            job.model,
            f.error.as_deref().unwrap_or("unknown engine error")
        ))),
    }
}

pub(crate) fn engine_gone() -> ApiError {
    ApiError::internal("The engine stopped before the request finished.")
}

/// What one choice produced, for a whole (not streamed) answer.
pub(crate) struct ChoiceOut {
    pub(crate) text: String,
    events: Vec<TokenEvent>,
    pub(crate) finished: Finished,
    /// Mean raw log-probability per sampled token (`best_of` ranking).
    score: f64,
}

/// Drains one choice.
pub(crate) async fn drain(mut active: Active) -> Result<ChoiceOut, ApiError> {
    let mut text = String::new();
    let mut events = Vec::new();
    let mut align = logprobs::Aligner::default();
    let (mut sum, mut count) = (0f64, 0usize);
    let finished = loop {
        match active.next().await {
            Some(Event::Token(t)) => {
                sum += f64::from(t.logprob);
                count += 1;
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
    if let Some(err) = failure(&active.job, &finished) {
        return Err(err);
    }
    Ok(ChoiceOut {
        text,
        events,
        finished,
        score: if count == 0 {
            f64::NEG_INFINITY
        } else {
            sum / count as f64
        },
    })
}

/// Drains every choice and answers with one JSON body: the `n` best by
/// mean token log-probability when `best_of` generated more.
async fn complete(job: Job, actives: Vec<Active>) -> Result<Response, ApiError> {
    let outs = futures::future::join_all(actives.into_iter().map(drain)).await;
    let mut outs: Vec<ChoiceOut> = outs.into_iter().collect::<Result<_, _>>()?;
    let usage = total_usage(&outs.iter().map(|o| o.finished.usage).collect::<Vec<_>>());
    if outs.len() > job.n {
        // stable: equal scores keep choice order
        outs.sort_by(|a, b| b.score.total_cmp(&a.score));
        outs.truncate(job.n);
    }
    let echo = job.echo.as_deref().unwrap_or("");
    let choices: Vec<Choice> = outs
        .iter()
        .enumerate()
        .map(|(i, o)| -> Choice {
            let mut offset = echo.len();
            let lp = job.logprobs_value(&o.events, &mut offset);
            let text = format!("{echo}{}", o.text);
            let (reasoning, text) = job.reasoning(text);
            let split = job.split(&text, o.finished.reason);
            if !split.calls.is_empty() || reasoning.is_some() {
                let calls = !split.calls.is_empty();
                return Choice::Chat(ChatChoice {
                    index: i,
                    message: AssistantMessage {
                        role: "assistant",
                        content: (!calls || !split.content.is_empty()).then_some(split.content),
                        reasoning_content: reasoning,
                        tool_calls: calls.then(|| job.tool_calls(i, split.calls)),
                    },
                    logprobs: lp,
                    finish_reason: Some(if calls {
                        "tool_calls"
                    } else {
                        o.finished.reason.as_str()
                    }),
                });
            }
            job.choice(i, &text, lp, Some(o.finished.reason.as_str()), false)
        })
        .collect();
    Ok(Json(job.envelope(choices, Some(UsageInfo::from(&usage)), false)).into_response())
}

mod calls;
mod sse;
use sse::sse_stream;
