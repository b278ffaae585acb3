//! The SSE side of [`super::Job::respond`]: each choice's events become
//! chunks tagged with its index, the choices' streams are merged as they
//! come, and the response ends with the usage chunk (when asked for) and
//! `data: [DONE]`; a failing choice ends the whole stream with its error.
//! O(1) work per token.

use std::convert::Infallible;

use axum::response::sse::Event as SseEvent;
use engine::{Event, Usage};
use futures::Stream;
use futures::stream::{self, StreamExt};
use serde_json::Value;

use super::{Active, Choice, Job, Kind, engine_gone, failure, total_usage};
use crate::error::ApiError;
use crate::responses::{ChatChunkChoice, ChatDelta, ToolCallOut, UsageInfo};
use crate::{logprobs, reasoning, tools};

fn data(v: &Value) -> SseEvent {
    SseEvent::default().data(v.to_string())
}

fn done_marker() -> SseEvent {
    SseEvent::default().data("[DONE]")
}

/// What one choice's stream yields to the merged response stream.
enum Piece {
    Sse(SseEvent),
    /// The choice ended normally, with its usage.
    Finished(Usage),
    /// The choice failed: the whole response ends with this error.
    Failed(ApiError),
}

/// Where a choice's stream is.
enum Phase {
    Start,
    Tokens,
    End,
}

struct ChoiceStream {
    active: Active,
    phase: Phase,
    /// Completion `text_offset` of the next token.
    offset: usize,
    /// Log-probability entries waiting for their text.
    align: logprobs::Aligner,
    /// Chat with tools: the reader of text and calls.
    calls: Option<tools::CallStream>,
    /// Chat with a reasoning parser: the reader of reasoning and content.
    reasoning: Option<reasoning::ReasoningStream>,
}

/// The pieces of one choice, in order.
fn choice_stream(active: Active) -> impl Stream<Item = Piece> {
    let offset = active.job.echo.as_ref().map_or(0, String::len);
    let calls = active.job.call_stream();
    let reasoning = active.job.reasoning_stream();
    let st = ChoiceStream {
        active,
        phase: Phase::Start,
        offset,
        align: logprobs::Aligner::default(),
        calls,
        reasoning,
    };
    stream::unfold(st, |mut st| async move {
        let pieces = step(&mut st).await?;
        Some((pieces, st))
    })
    .flat_map(stream::iter)
}

/// The SSE events of a streamed request: the choices' chunks interleaved as
/// they come, then the usage chunk (when asked for) and `[DONE]`. Owns the
/// engine handles: dropping the stream (client disconnect) cancels them all.
pub(super) fn sse_stream(
    job: Job,
    actives: Vec<Active>,
) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    struct Merge<S> {
        inner: S,
        usages: Vec<Usage>,
        ended: bool,
    }
    let merged = stream::select_all(actives.into_iter().map(|a| choice_stream(a).boxed()));
    let st = Merge {
        inner: merged,
        usages: Vec::new(),
        ended: false,
    };
    stream::unfold((st, job), |(mut st, job)| async move {
        if st.ended {
            return None;
        }
        let out = match st.inner.next().await {
            Some(Piece::Sse(ev)) => vec![ev],
            Some(Piece::Finished(u)) => {
                st.usages.push(u);
                Vec::new()
            }
            Some(Piece::Failed(err)) => {
                st.ended = true;
                vec![data(&err.body()), done_marker()]
            }
            None => {
                st.ended = true;
                let mut out = Vec::new();
                if job.include_usage {
                    let usage = UsageInfo::from(&total_usage(&st.usages));
                    out.push(data(&job.envelope(Vec::new(), Some(usage), true)));
                }
                out.push(done_marker());
                out
            }
        };
        Some((out, (st, job)))
    })
    .flat_map(|events| stream::iter(events.into_iter().map(Ok)))
}

/// The next pieces of one choice, or `None` once it ended.
async fn step(st: &mut ChoiceStream) -> Option<Vec<Piece>> {
    let job = st.active.job.clone();
    let index = st.active.index;
    match st.phase {
        Phase::End => None,
        Phase::Start => {
            st.phase = Phase::Tokens;
            let first = match (job.kind, &job.echo) {
                // OpenAI opens a chat stream with the role
                (Kind::Chat, _) => vec![Piece::Sse(data(&job.chunk(vec![Choice::ChatChunk(
                    ChatChunkChoice {
                        index,
                        delta: ChatDelta {
                            role: Some("assistant"),
                            content: Some(String::new()),
                            reasoning_content: None,
                            tool_calls: None,
                        },
                        logprobs: Value::Null,
                        finish_reason: None,
                    },
                )])))],
                (Kind::Completion, Some(echo)) => vec![Piece::Sse(data(
                    &job.chunk(vec![job.choice(index, echo, Value::Null, None, true)]),
                ))],
                (Kind::Completion, None) => Vec::new(),
            };
            Some(first)
        }
        Phase::Tokens => loop {
            match st.active.next().await {
                Some(Event::Token(t)) => {
                    // with a reasoning parser (never with logprobs)
                    if let Some(rs) = st.reasoning.as_mut() {
                        let (r, c) = rs.push(&t.text);
                        let out = reasoning_pieces(st, &job, index, r, c);
                        if out.is_empty() {
                            continue;
                        }
                        return Some(out);
                    }
                    // with tools (never with logprobs): the text before a call
                    if let Some(calls) = st.calls.as_mut() {
                        let text = calls.push(&t.text);
                        if text.is_empty() {
                            continue;
                        }
                        let choice = job.choice(index, text, Value::Null, None, true);
                        return Some(vec![Piece::Sse(data(&job.chunk(vec![choice])))]);
                    }
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
                    let choice = job.choice(index, &text, lp, None, true);
                    return Some(vec![Piece::Sse(data(&job.chunk(vec![choice])))]);
                }
                Some(Event::Done(f)) => {
                    st.phase = Phase::End;
                    if let Some(err) = failure(&job, &f) {
                        return Some(vec![Piece::Failed(err)]);
                    }
                    let mut reason = f.reason.as_str();
                    let mut out = Vec::new();
                    if let Some(rs) = st.reasoning.take() {
                        let (r, c) = rs.finish();
                        out = reasoning_pieces(st, &job, index, r, c);
                    }
                    if let Some(calls) = st.calls.take() {
                        let split = job.finish_calls(calls, f.reason);
                        if !split.content.is_empty() {
                            let choice = job.choice(index, &split.content, Value::Null, None, true);
                            out.push(Piece::Sse(data(&job.chunk(vec![choice]))));
                        }
                        if !split.calls.is_empty() {
                            reason = "tool_calls";
                        }
                        for (k, call) in job.tool_calls(index, split.calls).into_iter().enumerate()
                        {
                            out.extend(call_chunks(&job, index, k, call));
                        }
                    }
                    let rest = st.align.finish(f.reason);
                    if !rest.is_empty() {
                        let lp = job.logprobs_value(&rest, &mut st.offset);
                        out.push(Piece::Sse(data(
                            &job.chunk(vec![job.choice(index, "", lp, None, true)]),
                        )));
                    }
                    out.push(Piece::Sse(data(&job.chunk(vec![job.choice(
                        index,
                        "",
                        Value::Null,
                        Some(reason),
                        true,
                    )]))));
                    out.push(Piece::Finished(f.usage));
                    return Some(out);
                }
                None => {
                    st.phase = Phase::End;
                    return Some(vec![Piece::Failed(engine_gone())]);
                }
            }
        },
    }
}

/// The chunks of a reasoning parser's output: the reasoning `r` as a
/// `reasoning_content` delta, the content `c` (through the tool-call
/// reader, when the request has tools) as a content delta.
fn reasoning_pieces(
    st: &mut ChoiceStream,
    job: &Job,
    index: usize,
    r: String,
    c: String,
) -> Vec<Piece> {
    let mut out = Vec::new();
    if !r.is_empty() {
        let delta = ChatDelta {
            role: None,
            content: None,
            reasoning_content: Some(r),
            tool_calls: None,
        };
        let choice = Choice::ChatChunk(ChatChunkChoice {
            index,
            delta,
            logprobs: Value::Null,
            finish_reason: None,
        });
        out.push(Piece::Sse(data(&job.chunk(vec![choice]))));
    }
    let text = match st.calls.as_mut() {
        Some(calls) => calls.push(&c).to_string(),
        None => c,
    };
    if !text.is_empty() {
        let choice = job.choice(index, &text, Value::Null, None, true);
        out.push(Piece::Sse(data(&job.chunk(vec![choice]))));
    }
    out
}

/// Tool call `k` of a reply as OpenAI streams it: name first (empty
/// arguments), then the arguments.
fn call_chunks(job: &Job, index: usize, k: usize, call: ToolCallOut) -> Vec<Piece> {
    let delta = |calls: Value| {
        Choice::ChatChunk(ChatChunkChoice {
            index,
            delta: ChatDelta {
                role: None,
                content: None,
                reasoning_content: None,
                tool_calls: Some(vec![calls]),
            },
            logprobs: Value::Null,
            finish_reason: None,
        })
    };
    let head = serde_json::json!({
        "index": k,
        "id": call.id,
        "type": call.kind,
        "function": {"name": call.function.name, "arguments": ""},
    });
    let args = serde_json::json!({"index": k, "function": {"arguments": call.function.arguments}});
    vec![
        Piece::Sse(data(&job.chunk(vec![delta(head)]))),
        Piece::Sse(data(&job.chunk(vec![delta(args)]))),
    ]
}
