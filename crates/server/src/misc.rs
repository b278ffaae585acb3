//! The small endpoints: `GET /` (name, version, model, endpoints),
//! `GET /health`, `GET /v1/models[/{id}]`, `POST /tokenize`, `GET /metrics`.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::api::{body_bytes, chat_messages, check_model};
use crate::encode::{Input, encode};
use crate::error::ApiError;
use crate::protocol::{self, TokenizeRequest};
use crate::state::AppState;

/// 200 `{"status": "ok"}` while serving, 503 once shutdown has begun.
pub async fn health(State(state): State<Arc<AppState>>) -> Response {
    if state.is_draining() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "shutting_down"})),
        )
            .into_response()
    } else {
        Json(json!({"status": "ok"})).into_response()
    }
}

/// Every route, for `GET /` (method, path, what).
pub const ENDPOINTS: [(&str, &str, &str); 8] = [
    (
        "POST",
        "/v1/chat/completions",
        "chat with the model's template",
    ),
    ("POST", "/v1/completions", "text or token-id prompt"),
    ("GET", "/v1/models", "the served model"),
    ("GET", "/v1/models/{id}", "one model"),
    ("POST", "/tokenize", "token ids of a prompt or messages"),
    (
        "GET",
        "/health",
        "200 while serving, 503 while shutting down",
    ),
    ("GET", "/metrics", "Prometheus metrics"),
    ("GET", "/", "this page"),
];

/// `GET /`: who is serving what, and where (no API key needed, like `/health`).
pub async fn root(State(state): State<Arc<AppState>>) -> Json<Value> {
    let endpoints: Vec<Value> = ENDPOINTS
        .iter()
        .map(|(method, path, what)| json!({"method": method, "path": path, "description": what}))
        .collect();
    Json(json!({
        "name": "lamina",
        "version": env!("CARGO_PKG_VERSION"),
        "status": if state.is_draining() { "shutting_down" } else { "running" },
        "model": state.cfg.model_id,
        "max_model_len": state.max_context(),
        "endpoints": endpoints,
    }))
}

fn model_card(state: &AppState) -> Value {
    json!({
        "id": state.cfg.model_id,
        "object": "model",
        "created": state.started,
        "owned_by": "lamina",
        "max_model_len": state.max_context(),
    })
}

pub async fn list_models(State(state): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({"object": "list", "data": [model_card(&state)]}))
}

pub async fn get_model(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    check_model(&state, Some(&id))?;
    Ok(Json(model_card(&state)))
}

/// `{"tokens": [...], "count": n, "max_model_len": m}` for a `prompt`
/// (special tokens added unless `add_special_tokens` is false) or chat
/// `messages` (rendered with the template and the generation prompt).
pub async fn tokenize(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let body = body_bytes(&state, body)?;
    let req: TokenizeRequest = protocol::parse(&body)?;
    check_model(&state, req.model.as_deref())?;
    let tokens = match (req.prompt, &req.messages) {
        (Some(text), None) => {
            let add_special = req.add_special_tokens.unwrap_or(true);
            encode(&state, Input::Text { text, add_special }, "prompt").await?
        }
        (None, Some(msgs)) => {
            let input = Input::Chat {
                messages: chat_messages(msgs)?,
                trusted: req.parse_special_tokens.unwrap_or(false),
            };
            encode(&state, input, "messages").await?
        }
        _ => {
            return Err(ApiError::invalid_param(
                "prompt",
                "Give exactly one of `prompt` and `messages`.",
            ));
        }
    };
    Ok(Json(json!({
        "count": tokens.len(),
        "tokens": tokens,
        "max_model_len": state.max_context(),
    })))
}

/// Prometheus text exposition.
pub async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let text = state
        .metrics
        .render(&state.engine.stats(), &state.cfg.model_id);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}
