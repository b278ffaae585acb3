//! Anthropic's Messages API: `POST /v1/messages` (whole or streamed) and
//! `POST /v1/messages/count_tokens`, over the chat path.
//!
//! Contract: a request is parsed with Anthropic's field names
//! ([`request`]), translated into a chat-completion request and run by the
//! chat path ([`crate::api::prepare_chat`]: model check, limits, sampling
//! checks, tools and their grammar, template, tokenization, submission), so
//! both APIs share every rule. The reply ([`reply`]) is Anthropic's
//! `message` object, or its SSE event sequence (`message_start`, `ping`,
//! `content_block_start` / `content_block_delta` / `content_block_stop` per
//! block, `message_delta` with the stop reason and usage, `message_stop`;
//! `ping` also as the keep-alive). A reply that is calls of the request's
//! tools comes back as `tool_use` blocks with `stop_reason: "tool_use"`
//! (after a `text` block of the text before them, if any). A conversation
//! ending with an assistant turn is continued, as Anthropic does: that turn
//! is the start of the reply (the chat path's `continue_final_message`), and
//! the reply holds what follows it.
//! The API key may come as `x-api-key` (as Anthropic's clients send it) or
//! as `Authorization: Bearer`; `anthropic-version` and `anthropic-beta` are
//! read by no one (there is one version of this API here). Every error is
//! Anthropic's shape, `{"type": "error", "error": {"type", "message"}}`,
//! with the status the chat path gives it (the message names the field).
//!
//! Costs: the chat path's, plus one translation (O(request size)).

pub mod convert;
pub mod reply;
pub mod request;

use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, State};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::api::{accept, chat_prompt, prepare_chat};
use crate::error::ApiError;
use crate::error::anthropic::error_response;
use crate::generate::{Job, Kind};
use crate::middleware::RequestId;
use crate::models::Lease;
use crate::protocol::ChatRequest;
use crate::protocol::given;
use crate::state::AppState;
use convert::anthropic_param;
use request::{CountTokensRequest, MessagesRequest};

impl MessagesRequest {
    /// The chat request's JSON: the conversation plus the sampling fields.
    pub fn to_chat(&self, ignored: &mut Vec<&'static str>) -> Result<Value, ApiError> {
        if self.max_tokens < 1 {
            return Err(ApiError::invalid_param(
                "max_tokens",
                format!("`max_tokens` must be at least 1, got {}.", self.max_tokens),
            ));
        }
        let mut chat = convert::to_chat(&self.conversation(), ignored)?;
        let put = |chat: &mut Value, k: &str, v: Value| {
            if !v.is_null() {
                chat[k] = v;
            }
        };
        put(&mut chat, "max_tokens", json!(self.max_tokens));
        put(&mut chat, "stop", json!(self.stop_sequences));
        put(&mut chat, "stream", json!(self.stream));
        put(&mut chat, "temperature", json!(self.temperature));
        put(&mut chat, "top_p", json!(self.top_p));
        put(&mut chat, "top_k", json!(self.top_k));
        ignored.extend(given([
            ("metadata", self.metadata.is_some()),
            ("service_tier", self.service_tier.is_some()),
        ]));
        self.routing_ignored(ignored);
        if let Some(oc) = &self.output_config {
            if oc.effort.is_some() {
                ignored.push("output_config.effort");
            }
            if let Some(f) = &oc.format {
                if f.kind != "json_schema" {
                    return Err(ApiError::invalid_param(
                        "output_config.format.type",
                        format!("Only `json_schema` is supported, got `{}`.", f.kind),
                    ));
                }
                chat["response_format"] = json!({"type": "json_schema",
                    "json_schema": {"name": "output", "schema": f.schema}});
            }
        }
        Ok(chat)
    }
}

/// A chat-path error with its field renamed to Anthropic's; Anthropic's
/// error shape has no `param`, so the message names the field.
fn renamed(e: ApiError) -> ApiError {
    let e = e.param_renamed(anthropic_param);
    match e.param.as_deref() {
        Some(p) if !e.message.contains(&format!("`{p}`")) => ApiError {
            message: format!("`{p}`: {}", e.message),
            ..e
        },
        _ => e,
    }
}

/// The chat request of a translated conversation, the ignored fields counted.
fn chat_request(
    model: &Lease,
    chat: Result<Value, ApiError>,
    ignored: &[&'static str],
) -> Result<ChatRequest, ApiError> {
    for f in ignored {
        model.metrics().ignored(f);
    }
    crate::protocol::parse_value(&chat?)
}

/// Creates a message: Anthropic's `message` object, or with `stream: true`
/// its SSE event sequence.
#[utoipa::path(post, path = "/v1/messages", tag = "anthropic",
    security(("api_key" = [])),
    request_body = MessagesRequest,
    responses(
        (status = 200, description = "A `message` object, or an SSE stream of Anthropic's message events", content_type = "application/json"),
        (status = 400, description = "Bad input: `{\"type\": \"error\", \"error\": {\"type\", \"message\"}}`, the message naming the field", content_type = "application/json"),
        (status = 401, description = "Missing or wrong API key (`x-api-key` or `Authorization: Bearer`)", content_type = "application/json"),
    ))]
pub async fn messages(
    State(state): State<Arc<AppState>>,
    Extension(RequestId(rid)): Extension<RequestId>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match create(state, rid, body).await {
        Ok(r) => r,
        Err(e) => error_response(renamed(e)),
    }
}

async fn create(
    state: Arc<AppState>,
    rid: u64,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let req: MessagesRequest = accept(&state, body)?;
    let stops = req.stop_sequences.clone().unwrap_or_default();
    let model = state.models.acquire(Some(&req.model), None).await?;
    let st = state.clone();
    let job = Job::new(state.clone(), model, Kind::Chat, rid, arrived);
    let (mut job, handles, stream) = state
        .work
        .run("messages", move || {
            let mut ignored = Vec::new();
            let chat = chat_request(&job.served, req.to_chat(&mut ignored), &ignored)?;
            prepare_chat(&st, chat, job)
        })
        .await??;
    job.id = format!("msg_{rid}");
    reply::respond(job, handles, stream, stops).await
}

/// Counts the tokens of a conversation's prompt as the model sees it
/// (system, messages and tools rendered with the chat template):
/// `{"input_tokens": n}`.
#[utoipa::path(post, path = "/v1/messages/count_tokens", tag = "anthropic",
    security(("api_key" = [])),
    request_body = CountTokensRequest,
    responses(
        (status = 200, description = "`{\"input_tokens\": n}`", content_type = "application/json"),
        (status = 400, description = "Bad input, in Anthropic's error shape", content_type = "application/json"),
    ))]
pub async fn count_tokens(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let counted = async {
        let req: CountTokensRequest = accept(&state, body)?;
        let model = state.models.acquire(Some(&req.model), None).await?;
        let st = state.clone();
        let n = state
            .work
            .run("messages", move || {
                let mut ignored = Vec::new();
                req.ignored(&mut ignored);
                let chat = convert::to_chat(&req.conversation(), &mut ignored);
                let chat = chat_request(&model, chat, &ignored)?;
                chat_prompt(&st, &model, chat).map(|p| p.prompt.len())
            })
            .await??;
        Ok::<_, ApiError>(n)
    };
    match counted.await {
        Ok(n) => Json(json!({"input_tokens": n})).into_response(),
        Err(e) => error_response(renamed(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_take_anthropics_shape() {
        let e = ApiError::invalid_param("stop", "Invalid `stop`: too many.");
        let e = renamed(e);
        assert_eq!(e.param.as_deref(), Some("stop_sequences"));
        let b = crate::error::anthropic::error_body(&e);
        assert_eq!(b["error"]["message"], "Invalid `stop_sequences`: too many.");
        let e = renamed(ApiError::invalid_param("stop", "At most 4."));
        assert_eq!(e.message, "`stop_sequences`: At most 4.");
    }
}
