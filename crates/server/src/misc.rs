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

use crate::body::body_bytes;
use crate::encode::{Input, encode};
use crate::error::ApiError;
use crate::messages::chat_messages;
use crate::models::ModelInfo;
use crate::protocol::{self, DetokenizeRequest, TokenizeRequest};
use crate::responses::{
    DetokenizeResponse, FailedEngine, HealthResponse, ModelCard, ModelList, ModelStatus,
    TokenizeResponse, VersionResponse,
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
    let loaded = state.models.all_loaded();
    let mut failed_engines = Vec::new();
    let mut engines = 0;
    for (name, served) in &loaded {
        engines += served.replicas.len();
        for (engine, error) in served.replicas.failures() {
            let error = if loaded.len() > 1 {
                format!("model `{name}`: {error}")
            } else {
                error
            };
            failed_engines.push(FailedEngine { engine, error });
        }
    }
    let (code, status) = if state.is_draining() {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting_down")
    } else if engines > 0 && failed_engines.len() == engines {
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

/// The cards of every model and of each loaded adapter (its `parent` the
/// model it runs on).
pub(crate) fn model_cards(state: &AppState) -> Vec<(ModelCard, ModelInfo)> {
    let mut cards = Vec::new();
    for info in state.models.info() {
        let card = ModelCard {
            id: info.name.clone(),
            object: "model",
            created: state.started,
            owned_by: info.owned_by.clone(),
            max_model_len: info.max_context,
            root: info.name.clone(),
            parent: None,
            status: ModelStatus {
                value: info.state.as_str(),
            },
        };
        for lora in &info.loras {
            let adapter = ModelCard {
                id: lora.clone(),
                parent: Some(info.name.clone()),
                ..card.clone()
            };
            cards.push((adapter, info.clone()));
        }
        cards.insert(cards.len() - info.loras.len(), (card, info));
    }
    cards
}

/// The served models (each with its state) and the loaded LoRA adapters,
/// with their `max_model_len`.
#[utoipa::path(get, path = "/v1/models", tag = "openai",
    security(("api_key" = [])),
    responses(
        (status = 200, description = "The served models", body = ModelList),
        (status = 401, description = "Missing or wrong API key", body = crate::error::ErrorBody),
    ))]
pub async fn list_models(State(state): State<Arc<AppState>>) -> Json<ModelList> {
    Json(ModelList {
        object: "list",
        data: model_cards(&state).into_iter().map(|(c, _)| c).collect(),
    })
}

/// One model or adapter by id (404 unless served here).
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
    model_cards(&state)
        .into_iter()
        .map(|(c, _)| c)
        .find(|c| c.id == id)
        .map(Json)
        .ok_or_else(|| ApiError::unknown_model(&id))
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
    let model = state.models.acquire(req.model.as_deref(), None).await?;
    let tokens = match (req.prompt, &req.messages) {
        (Some(text), None) => {
            let add_special = req.add_special_tokens.unwrap_or(true);
            encode(&state, &model, Input::Text { text, add_special }, "prompt").await?
        }
        (None, Some(msgs)) => {
            let lim = &state.cfg.limits;
            crate::limits::check_count("messages", msgs.len(), lim.messages, "max-messages")?;
            let kwargs = req.chat_template_kwargs.clone();
            crate::messages::template_kwargs(kwargs.as_ref())?;
            let input = Input::Chat {
                messages: chat_messages(msgs, model.tokenizer.template_renders_tools())?,
                tools: None,
                kwargs,
                trusted: req.parse_special_tokens.unwrap_or(false),
                prefill: None,
                generation_prompt: req.add_generation_prompt.unwrap_or(true),
            };
            encode(&state, &model, input, "messages").await?
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
        max_model_len: model.max_context(),
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
    let model = state.models.acquire(req.model.as_deref(), None).await?;
    let vocab = model.tokenizer.vocab_size();
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
    let prompt = model
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
    let mut parts = Vec::new();
    for (name, metrics, served) in state.models.metrics() {
        let views = served.as_deref().map(AppState::replica_views);
        let mut text = metrics.render(views.as_deref().unwrap_or(&[]), &name);
        if let Some(view) = served.as_deref().and_then(crate::lora::metrics_view) {
            crate::metrics::render_lora(&mut text, &name, &view);
        }
        parts.push(text);
    }
    let mut text = crate::metrics::merge(&parts);
    crate::models::render_state(&mut text, &state.models.info());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}
