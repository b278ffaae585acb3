//! OpenAI's Responses API: `POST /v1/responses` (whole or streamed),
//! `GET /v1/responses/{id}` and `DELETE /v1/responses/{id}`, over the chat
//! path.
//!
//! Contract: a request is parsed with the Responses field names
//! ([`request`]), its conversation is the stored history of
//! `previous_response_id` (when given) followed by its `input`, and it is
//! translated into a chat-completion request run by the chat path
//! ([`crate::api::prepare_chat`]), so both APIs share every rule (model,
//! limits, sampling, tools and their grammar, template, tokenization). The
//! reply ([`reply`]) is a `response` object or its semantic SSE events.
//! Errors are OpenAI's shape, naming the Responses field. `store` (default
//! true) keeps the finished response in the in-memory [`store`], under a
//! random 128-bit id (`resp_` and 32 hex digits), for the API key that
//! made it alone; a response too large for the store is answered with
//! `store: false`. A `previous_response_id` that is not there (never
//! stored, evicted, expired, deleted, or another key's) is a 400 naming it;
//! `GET` / `DELETE` of such an id is a 404. `metadata` holds at most
//! [`request::MAX_METADATA_PAIRS`] pairs, keys of at most
//! [`request::MAX_METADATA_KEY_CHARS`] characters and values of at most
//! [`request::MAX_METADATA_VALUE_CHARS`] (OpenAI's limits).
//!
//! Costs: the chat path's, plus one translation O(conversation size).

pub mod convert;
pub mod reply;
pub mod request;

use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use engine::RequestHandle;
use serde_json::{Value, json};

use crate::api::{accept, prepare_chat};
use crate::error::ApiError;
use crate::generate::{Job, Kind};
use crate::middleware::RequestId;
use crate::protocol::ChatRequest;
use crate::state::AppState;
use convert::responses_param;
use reply::Meta;
use request::{ResponsesRequest, ToolChoice};

pub use crate::response_store::{Owner, ResponseStore};

/// The request's fields as the response object echoes them.
fn echo(req: &ResponsesRequest, store: bool) -> Value {
    let tools: Vec<Value> = req
        .tools
        .iter()
        .flatten()
        .map(|t| {
            json!({"type": t.kind, "name": t.name, "description": t.description,
                "parameters": t.parameters, "strict": t.strict.unwrap_or(true)})
        })
        .collect();
    let tool_choice = match &req.tool_choice {
        None => json!("auto"),
        Some(ToolChoice::Mode(m)) => json!(m),
        Some(ToolChoice::Named(n)) => json!({"type": n.kind, "name": n.name}),
    };
    let format = match req.text.as_ref().and_then(|t| t.format.as_ref()) {
        None => json!({"type": "text"}),
        Some(f) => {
            let mut v = json!({"type": f.kind});
            for (k, x) in [
                ("name", json!(f.name)),
                ("schema", json!(f.schema)),
                ("description", json!(f.description)),
                ("strict", json!(f.strict)),
            ] {
                if !x.is_null() {
                    v[k] = x;
                }
            }
            v
        }
    };
    json!({
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "previous_response_id": req.previous_response_id,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "tools": tools,
        "tool_choice": tool_choice,
        "parallel_tool_calls": req.parallel_tool_calls.unwrap_or(true),
        "text": {"format": format},
        "metadata": req.metadata.clone().unwrap_or_default(),
        "store": store,
        "truncation": "disabled",
        "reasoning": {"effort": null, "summary": null},
        "user": null,
    })
}

/// A chat-path error with its field renamed to the Responses name.
fn renamed(e: ApiError) -> ApiError {
    e.param_renamed(responses_param)
}

type Prepared = Result<(Job, Vec<RequestHandle>, bool, Meta), ApiError>;

/// Checks, translates and submits a request (a work-pool job).
fn prepare(state: &Arc<AppState>, req: ResponsesRequest, job: Job, owner: Owner) -> Prepared {
    for f in req.ignored_fields() {
        job.served.metrics().ignored(f);
    }
    req.check_metadata()?;
    let mut history = match &req.previous_response_id {
        Some(id) => {
            let stored = state.responses.get(id, owner).ok_or_else(|| {
                ApiError::invalid_param(
                    "previous_response_id",
                    format!(
                        "No stored response `{id}`: it was not stored, or was deleted, evicted \
                         (`--responses-store-mib`) or expired (`--responses-store-ttl-secs`)."
                    ),
                )
            })?;
            stored.history
        }
        None => Vec::new(),
    };
    history.extend(req.input_items()?);
    let chat = req.to_chat(&history)?;
    let chat: ChatRequest = crate::protocol::parse_value(&chat).map_err(renamed)?;
    let store = req.store.unwrap_or(true);
    let meta = Meta {
        echo: echo(&req, store),
        store,
        owner,
        history,
    };
    let (job, handles, stream) = prepare_chat(state, chat, job).map_err(renamed)?;
    Ok((job, handles, stream, meta))
}

/// Creates a model response: a `response` object, or with `stream: true`
/// its semantic SSE events.
#[utoipa::path(post, path = "/v1/responses", tag = "openai",
    security(("api_key" = [])),
    request_body = ResponsesRequest,
    responses(
        (status = 200, description = "A `response` object, or an SSE stream of `response.*` events", content_type = "application/json"),
        (status = 400, description = "Bad input, naming the parameter", body = crate::error::ErrorBody),
        (status = 401, description = "Missing or wrong API key", body = crate::error::ErrorBody),
    ))]
pub async fn create_response(
    State(state): State<Arc<AppState>>,
    Extension(RequestId(rid)): Extension<RequestId>,
    Extension(owner): Extension<Owner>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let req: ResponsesRequest = accept(&state, body)?;
    let id = response_id()?;
    let model = state.models.acquire(req.model.as_deref(), None).await?;
    let st = state.clone();
    let job = Job::new(state.clone(), model, Kind::Chat, rid, arrived);
    let (mut job, handles, stream, meta) = state
        .work
        .run("input", move || prepare(&st, req, job, owner))
        .await??;
    job.id = id;
    reply::respond(job, handles, stream, meta).await
}

/// A fresh response id: `resp_` and 128 random bits in hex, so ids
/// neither repeat nor tell how many responses the server made.
fn response_id() -> Result<String, ApiError> {
    let mut bits = [0u8; 16];
    getrandom::fill(&mut bits)
        .map_err(|e| ApiError::internal(format!("cannot draw a random response id: {e}")))?;
    let hex: String = bits.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("resp_{hex}"))
}

fn not_stored(id: &str) -> ApiError {
    ApiError::from_status(StatusCode::NOT_FOUND, format!("No stored response `{id}`."))
}

/// A stored response.
#[utoipa::path(get, path = "/v1/responses/{id}", tag = "openai",
    security(("api_key" = [])),
    params(("id" = String, Path, description = "The response id")),
    responses(
        (status = 200, description = "The stored `response` object", content_type = "application/json"),
        (status = 404, description = "Not stored (never, deleted, evicted or expired)", body = crate::error::ErrorBody),
    ))]
pub async fn get_response(
    State(state): State<Arc<AppState>>,
    Extension(owner): Extension<Owner>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let stored = state
        .responses
        .get(&id, owner)
        .ok_or_else(|| not_stored(&id))?;
    Ok(Json(stored.response))
}

/// Deletes a stored response.
#[utoipa::path(delete, path = "/v1/responses/{id}", tag = "openai",
    security(("api_key" = [])),
    params(("id" = String, Path, description = "The response id")),
    responses(
        (status = 200, description = "`{\"id\", \"object\": \"response\", \"deleted\": true}`", content_type = "application/json"),
        (status = 404, description = "Not stored", body = crate::error::ErrorBody),
    ))]
pub async fn delete_response(
    State(state): State<Arc<AppState>>,
    Extension(owner): Extension<Owner>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    if !state.responses.delete(&id, owner) {
        return Err(not_stored(&id));
    }
    Ok(Json(
        json!({"id": id, "object": "response", "deleted": true}),
    ))
}
