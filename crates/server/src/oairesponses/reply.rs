//! The `response` object of the Responses API and the reply to a submitted
//! request: whole, or streamed as its semantic events.
//!
//! Contract: `output` is one `message` item with one `output_text` part,
//! or, when the reply ends with calls of the request's tools, the
//! `message` item of the text before them (when there is any) and one
//! `function_call` item per call (`call_id`, `name`, `arguments` as a JSON
//! text). `status` is `completed`, or `incomplete` with
//! `incomplete_details.reason: "max_output_tokens"` when the limit cut the
//! reply. Streamed: `response.created`, `response.in_progress`, then per
//! item `response.output_item.added`, (`response.content_part.added`,
//! `response.output_text.delta`..., `response.output_text.done`,
//! `response.content_part.done` | `response.function_call_arguments.delta`,
//! `response.function_call_arguments.done`), `response.output_item.done`,
//! and last `response.completed` (or `response.incomplete`) with the whole
//! object; every event carries `type` and a `sequence_number` from 0; an
//! engine failure is an `error` event. The text goes out as it comes and a
//! call is held back until the reply ends, as on the chat path; the
//! message item is done before the calls' items are added.
//! With `store` the finished response is stored ([`super::store`]).
//! Costs: O(1) per token.

use std::convert::Infallible;

use axum::Json;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use engine::{Event, FinishReason, Finished, RequestHandle, Usage};
use futures::stream::{self, Stream, StreamExt};
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::generate::{Active, Job, engine_gone, failure};
use crate::response_store::{Owner, Stored};
use crate::tools::{CallStream, ParsedCall};

/// What the response object echoes of the request, and what storing needs.
#[derive(Clone)]
pub struct Meta {
    /// The request's fields as the object echoes them (`instructions`,
    /// `tools`, `metadata`, ...), without `id`, `status`, `output`, `usage`.
    pub echo: Value,
    /// Keep the finished response (`store`).
    pub store: bool,
    /// Whose the stored response is.
    pub owner: Owner,
    /// The conversation's items up to this request's input.
    pub history: Vec<Value>,
}

/// The response object.
fn object(
    job: &Job,
    meta: &Meta,
    status: &str,
    output: Vec<Value>,
    usage: Option<&Usage>,
) -> Value {
    let mut v = meta.echo.clone();
    v["id"] = json!(job.id);
    v["object"] = json!("response");
    v["created_at"] = json!(job.created);
    v["model"] = json!(job.model);
    v["status"] = json!(status);
    v["output"] = Value::Array(output);
    v["error"] = Value::Null;
    v["incomplete_details"] = match status {
        "incomplete" => json!({"reason": "max_output_tokens"}),
        _ => Value::Null,
    };
    v["usage"] = match usage {
        Some(u) => json!({
            "input_tokens": u.prompt_tokens,
            "input_tokens_details": {"cached_tokens": u.cached_tokens},
            "output_tokens": u.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": u.prompt_tokens + u.completion_tokens,
        }),
        None => Value::Null,
    };
    v
}

fn message_item(job: &Job, text: &str, status: &str) -> Value {
    json!({"type": "message", "id": format!("msg_{}", job.request_id), "status": status,
    "role": "assistant", "content": if status == "completed" {
        json!([{"type": "output_text", "text": text, "annotations": [], "logprobs": []}])
    } else {
        json!([])
    }})
}

/// Calls as `function_call` items.
fn call_items(job: &Job, calls: Vec<ParsedCall>) -> Vec<Value> {
    job.tool_calls(0, calls)
        .into_iter()
        .enumerate()
        .map(|(k, c)| {
            json!({"type": "function_call", "id": format!("fc_{}_{k}", job.request_id),
                "call_id": c.id, "name": c.function.name, "arguments": c.function.arguments,
                "status": "completed"})
        })
        .collect()
}

fn status_of(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Length => "incomplete",
        _ => "completed",
    }
}

/// The finished object, stored when asked; `store: false` in it when the
/// store could not keep it (larger than `--responses-store-mib`).
fn finished_object(job: &Job, meta: &Meta, output: Vec<Value>, f: &Finished) -> Value {
    let mut obj = object(
        job,
        meta,
        status_of(f.reason),
        output.clone(),
        Some(&f.usage),
    );
    if meta.store {
        let mut history = meta.history.clone();
        history.extend(output.into_iter().map(|mut item| {
            // the history keeps the item's content, not its output form
            if item["type"] == "message" {
                let text = item["content"][0]["text"].take();
                item = json!({"type": "message", "role": "assistant", "content": text});
            }
            item
        }));
        let kept = job.state.responses.insert(
            job.id.clone(),
            meta.owner,
            Stored {
                response: obj.clone(),
                history,
            },
        );
        if !kept {
            obj["store"] = json!(false);
            tracing::warn!(
                id = %job.id,
                "response not stored: larger than the store (--responses-store-mib)"
            );
        }
    }
    obj
}

/// The response for a submitted request (one choice).
pub async fn respond(
    job: Job,
    mut handles: Vec<RequestHandle>,
    stream: bool,
    meta: Meta,
) -> Result<Response, ApiError> {
    let Some(handle) = handles.pop() else {
        return Err(engine_gone());
    };
    let active = Active::new(job.clone(), handle, 0);
    if stream {
        let keep = job.state.cfg.sse_keep_alive;
        return Ok(Sse::new(events(job, active, meta))
            .keep_alive(KeepAlive::new().interval(keep).text("keep-alive"))
            .into_response());
    }
    let mut active = active;
    let mut text = String::new();
    let f = loop {
        match active.next().await {
            Some(Event::Token(t)) => text.push_str(&t.text),
            Some(Event::Done(f)) => break f,
            None => return Err(engine_gone()),
        }
    };
    if let Some(err) = failure(&job, &f) {
        return Err(err);
    }
    let split = job.split(&text, f.reason);
    let mut output = Vec::with_capacity(1 + split.calls.len());
    if !split.content.is_empty() || split.calls.is_empty() {
        output.push(message_item(&job, &split.content, "completed"));
    }
    output.extend(call_items(&job, split.calls));
    Ok(Json(finished_object(&job, &meta, output, &f)).into_response())
}

enum Phase {
    Start,
    Tokens,
    End,
}

struct Streaming {
    job: Job,
    meta: Meta,
    active: Active,
    phase: Phase,
    seq: u64,
    /// With tools: the reader of text and calls.
    calls: Option<CallStream>,
    /// The text streamed so far (the message item is open when non-empty).
    text: String,
    open: bool,
}

impl Streaming {
    fn event(&mut self, kind: &str, mut data: Value) -> SseEvent {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.seq);
        self.seq += 1;
        SseEvent::default().event(kind).data(data.to_string())
    }

    fn item_id(&self) -> String {
        format!("msg_{}", self.job.request_id)
    }

    /// Events carrying `delta` of the text (the item and part opened first).
    fn text(&mut self, delta: &str) -> Vec<SseEvent> {
        let mut out = Vec::with_capacity(3);
        let id = self.item_id();
        if !self.open {
            self.open = true;
            let item = message_item(&self.job, "", "in_progress");
            out.push(self.event(
                "response.output_item.added",
                json!({"output_index": 0, "item": item}),
            ));
            out.push(self.event(
                "response.content_part.added",
                json!({"item_id": id,
                "output_index": 0, "content_index": 0,
                "part": {"type": "output_text", "text": "", "annotations": []}}),
            ));
        }
        self.text.push_str(delta);
        out.push(self.event(
            "response.output_text.delta",
            json!({"item_id": id,
            "output_index": 0, "content_index": 0, "delta": delta, "logprobs": []}),
        ));
        out
    }
}

/// The SSE events of a streamed reply.
fn events(
    job: Job,
    active: Active,
    meta: Meta,
) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    let calls = job.call_stream();
    let st = Streaming {
        job,
        meta,
        active,
        phase: Phase::Start,
        seq: 0,
        calls,
        text: String::new(),
        open: false,
    };
    stream::unfold(st, |mut st| async move {
        let out = step(&mut st).await?;
        Some((out, st))
    })
    .flat_map(|evs| stream::iter(evs.into_iter().map(Ok)))
}

async fn step(st: &mut Streaming) -> Option<Vec<SseEvent>> {
    match st.phase {
        Phase::End => None,
        Phase::Start => {
            st.phase = Phase::Tokens;
            let obj = object(&st.job, &st.meta, "in_progress", Vec::new(), None);
            Some(vec![
                st.event("response.created", json!({"response": obj})),
                st.event("response.in_progress", json!({"response": obj})),
            ])
        }
        Phase::Tokens => loop {
            match st.active.next().await {
                Some(Event::Token(t)) => {
                    if let Some(calls) = st.calls.as_mut() {
                        let text = calls.push(&t.text).to_string();
                        if text.is_empty() {
                            continue;
                        }
                        return Some(st.text(&text));
                    }
                    if t.text.is_empty() {
                        continue;
                    }
                    return Some(st.text(&t.text));
                }
                Some(Event::Done(f)) => {
                    st.phase = Phase::End;
                    return Some(finish(st, &f));
                }
                None => {
                    st.phase = Phase::End;
                    let e = engine_gone();
                    return Some(vec![st.event("error", error_data(&e))]);
                }
            }
        },
    }
}

fn error_data(e: &ApiError) -> Value {
    json!({"code": e.code, "message": e.message, "param": e.param})
}

/// The closing events: the open item done (or the calls' items), then the
/// final object.
fn finish(st: &mut Streaming, f: &Finished) -> Vec<SseEvent> {
    if let Some(err) = failure(&st.job, f) {
        return vec![st.event("error", error_data(&err))];
    }
    let mut out = Vec::new();
    let mut output = Vec::new();
    let mut calls = Vec::new();
    if let Some(reader) = st.calls.take() {
        let split = st.job.finish_calls(reader, f.reason);
        if !split.content.is_empty() {
            out.extend(st.text(&split.content));
        }
        calls = split.calls;
    }
    // the message item first (output 0), done before the calls' items
    if st.open || calls.is_empty() {
        if !st.open {
            out.extend(st.text(""));
        }
        let id = st.item_id();
        let text = std::mem::take(&mut st.text);
        let part = json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []});
        out.push(st.event(
            "response.output_text.done",
            json!({"item_id": id, "output_index": 0,
            "content_index": 0, "text": text, "logprobs": []}),
        ));
        out.push(st.event(
            "response.content_part.done",
            json!({"item_id": id, "output_index": 0,
            "content_index": 0, "part": part}),
        ));
        let item = message_item(&st.job, &text, "completed");
        out.push(st.event(
            "response.output_item.done",
            json!({"output_index": 0, "item": item}),
        ));
        output.push(item);
    }
    for item in call_items(&st.job, calls) {
        let index = output.len();
        let mut added = item.clone();
        added["arguments"] = json!("");
        added["status"] = json!("in_progress");
        let id = item["id"].clone();
        let args = item["arguments"].clone();
        out.push(st.event(
            "response.output_item.added",
            json!({"output_index": index, "item": added}),
        ));
        out.push(st.event(
            "response.function_call_arguments.delta",
            json!({"item_id": id, "output_index": index, "delta": args}),
        ));
        out.push(st.event(
            "response.function_call_arguments.done",
            json!({"item_id": id, "output_index": index, "arguments": args, "name": item["name"]}),
        ));
        out.push(st.event(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        ));
        output.push(item);
    }
    let obj = finished_object(&st.job, &st.meta, output, f);
    let kind = match status_of(f.reason) {
        "incomplete" => "response.incomplete",
        _ => "response.completed",
    };
    out.push(st.event(kind, json!({"response": obj})));
    out
}
