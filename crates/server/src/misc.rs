//! The small endpoints: `GET /health`, `GET /version`,
//! `GET /v1/models[/{id}]`, `POST /tokenize`, `POST /detokenize`,
//! `GET /metrics` (the index, `GET /`, is [`crate::openapi`]'s).

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::api::check_model;
use crate::body::body_bytes;
use crate::encode::{Input, encode};
use crate::error::ApiError;
use crate::messages::chat_messages;
use crate::protocol::{self, DetokenizeRequest, TokenizeRequest};
use crate::responses::{
    DetokenizeResponse, FailedEngine, HealthResponse, ModelCard, ModelList, TokenizeResponse,
    VersionResponse,
};
use crate::state::AppState;

/// 200 `{"status": "ok"}` while serving (`degraded`, naming the failed
/// replicas, while some replicas failed and others serve), 503 once
/// shutdown has begun or when every replica failed.
#[utoipa::path(get, path = "/health", tag = "lamina",
    responses(
        (status = 200, description = "Serving", body = HealthResponse),
        (status = 503, description = "Shutting down, or every replica failed", body = HealthResponse),
    ))]
pub async fn health(State(state): State<Arc<AppState>>) -> Response {
    let failed_engines: Vec<FailedEngine> = state
        .replicas
        .failures()
        .into_iter()
        .map(|(engine, error)| FailedEngine { engine, error })
        .collect();
    let (code, status) = if state.is_draining() {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting_down")
    } else if failed_engines.len() == state.replicas.len() {
        (StatusCode::SERVICE_UNAVAILABLE, "failed")
    } else if !failed_engines.is_empty() {
        (StatusCode::OK, "degraded")
    } else {
        (StatusCode::OK, "ok")
    };
    let body = HealthResponse {
        status,
        failed_engines,
    };
    (code, Json(body)).into_response()
}

fn model_card(state: &AppState) -> ModelCard {
    ModelCard {
        id: state.cfg.model_id.clone(),
        object: "model",
        created: state.started,
        owned_by: "lamina",
        max_model_len: state.max_context(),
        root: state.cfg.model_id.clone(),
        parent: None,
    }
}

/// The card of LoRA adapter `name`: its parent is the base model.
fn lora_card(state: &AppState, name: String) -> ModelCard {
    ModelCard {
        id: name,
        parent: Some(state.cfg.model_id.clone()),
        ..model_card(state)
    }
}

/// The served model, with its `max_model_len`.
#[utoipa::path(get, path = "/v1/models", tag = "openai",
    security(("api_key" = [])),
    responses(
        (status = 200, description = "The served model", body = ModelList),
        (status = 401, description = "Missing or wrong API key", body = crate::error::ErrorBody),
    ))]
pub async fn list_models(State(state): State<Arc<AppState>>) -> Json<ModelList> {
    Json(ModelList {
        object: "list",
        data: std::iter::once(model_card(&state))
            .chain(
                crate::lora::loaded(&state)
                    .into_iter()
                    .map(|n| lora_card(&state, n)),
            )
            .collect(),
    })
}

/// One model by id (404 unless it is the served one).
#[utoipa::path(get, path = "/v1/models/{id}", tag = "openai",
    security(("api_key" = [])),
    params(("id" = String, Path, description = "The model id")),
    responses(
        (status = 200, description = "The model", body = ModelCard),
        (status = 404, description = "Not served here", body = crate::error::ErrorBody),
    ))]
pub async fn get_model(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<ModelCard>, ApiError> {
    Ok(Json(match check_model(&state, Some(&id))? {
        Some(lora) => lora_card(&state, lora),
        None => model_card(&state),
    }))
}

/// `{"tokens": [...], "count": n, "max_model_len": m}` for a `prompt`
/// (special tokens added unless `add_special_tokens` is false) or chat
/// `messages` (rendered with the template as a chat request renders it:
/// the generation prompt unless `add_generation_prompt` is false, the
/// `chat_template_kwargs`, BOS once).
#[utoipa::path(post, path = "/tokenize", tag = "lamina",
    security(("api_key" = [])),
    request_body = TokenizeRequest,
    responses(
        (status = 200, description = "The token ids", body = TokenizeResponse),
        (status = 400, description = "Bad input, naming the parameter", body = crate::error::ErrorBody),
    ))]
pub async fn tokenize(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<TokenizeResponse>, ApiError> {
    let body = body_bytes(&state, body)?;
    let req: TokenizeRequest = protocol::parse(&body)?;
    check_model(&state, req.model.as_deref())?;
    let tokens = match (req.prompt, &req.messages) {
        (Some(text), None) => {
            let add_special = req.add_special_tokens.unwrap_or(true);
            encode(&state, Input::Text { text, add_special }, "prompt").await?
        }
        (None, Some(msgs)) => {
            let lim = &state.cfg.limits;
            crate::limits::check_count("messages", msgs.len(), lim.messages, "max-messages")?;
            let kwargs = req.chat_template_kwargs.clone();
            crate::messages::template_kwargs(kwargs.as_ref())?;
            let input = Input::Chat {
                messages: chat_messages(msgs, state.tokenizer.template_renders_tools())?,
                tools: None,
                kwargs,
                trusted: req.parse_special_tokens.unwrap_or(false),
                prefill: None,
                generation_prompt: req.add_generation_prompt.unwrap_or(true),
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
    Ok(Json(TokenizeResponse {
        count: tokens.len(),
        tokens,
        max_model_len: state.max_context(),
    }))
}

/// `{"prompt": "..."}`: the text of `tokens` (special tokens kept, as
/// vLLM does); an id outside the vocabulary is a 400 naming `tokens`.
#[utoipa::path(post, path = "/detokenize", tag = "lamina",
    security(("api_key" = [])),
    request_body = DetokenizeRequest,
    responses(
        (status = 200, description = "The text", body = DetokenizeResponse),
        (status = 400, description = "Bad input, naming the parameter", body = crate::error::ErrorBody),
    ))]
pub async fn detokenize(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<DetokenizeResponse>, ApiError> {
    let body = body_bytes(&state, body)?;
    let req: DetokenizeRequest = protocol::parse(&body)?;
    check_model(&state, req.model.as_deref())?;
    let vocab = state.tokenizer.vocab_size();
    if let Some((i, id)) = req
        .tokens
        .iter()
        .enumerate()
        .find(|(_, id)| **id as usize >= vocab)
    {
        return Err(ApiError::invalid_param(
            format!("tokens[{i}]"),
            format!("Token id {id} is outside the vocabulary (size {vocab})."),
        ));
    }
    let prompt = state
        .tokenizer
        .decode(&req.tokens, false)
        .map_err(|e| ApiError::invalid_param("tokens", format!("Cannot decode `tokens`: {e}")))?;
    Ok(Json(DetokenizeResponse { prompt }))
}

/// The server's version (vLLM's `/version`).
#[utoipa::path(get, path = "/version", tag = "lamina",
    responses((status = 200, description = "The version", body = VersionResponse)))]
pub async fn version() -> Json<VersionResponse> {
    Json(VersionResponse {
        version: env!("CARGO_PKG_VERSION"),
    })
}

/// Prometheus text exposition.
#[utoipa::path(get, path = "/metrics", tag = "lamina",
    responses((status = 200, description = "Prometheus text format", content_type = "text/plain")))]
pub async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let mut text = state
        .metrics
        .render(&state.replica_views(), &state.cfg.model_id);
    if let Some(view) = crate::lora::metrics_view(&state) {
        crate::metrics::render_lora(&mut text, &state.cfg.model_id, &view);
    }
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}
