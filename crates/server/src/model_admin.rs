//! Loading and unloading models at run time, in llama-server's router
//! names: `GET /models` (every model with its state, memory, idle time and
//! running requests; what `lamina ps` shows), `POST /models/load`
//! `{"model"}` and `POST /models/unload` `{"model"}`, behind the API key.
//!
//! Contract: a load answers once the model is loaded (or with the load's
//! error: 507 naming the memory needed and free when it does not fit); an
//! unload answers at once, with `unloading` while the model's running
//! requests finish (then its engines shut down) or `unloaded`. An unknown
//! model is a 404 naming it and listing the served ones. The state machine
//! is [`crate::models`]'.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::body::body_bytes;
use crate::error::ApiError;
use crate::misc::model_cards;
use crate::protocol;
use crate::responses::ModelCard;
use crate::state::AppState;

/// `POST /models/load` and `POST /models/unload`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelRequest {
    /// The model's name (as in `/v1/models`).
    pub model: String,
}

/// What `POST /models/load` and `/models/unload` answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct ModelAction {
    pub success: bool,
    pub model: String,
    /// The model's state after the call.
    pub status: &'static str,
}

/// A model in `GET /models`: its card and what it holds.
#[derive(Debug, Serialize, ToSchema)]
pub struct ModelProcess {
    #[serde(flatten)]
    pub card: ModelCard,
    /// Requests running on it.
    pub running: usize,
    /// Seconds since its last request ended (0 while one runs).
    pub idle_seconds: f64,
    /// Bytes of its weights and of its KV pool (of its last load).
    pub weights_bytes: u64,
    pub kv_bytes: u64,
    /// Engines (replicas) while loaded.
    pub replicas: usize,
    /// Seconds it stays loaded once idle; `null`: until unloaded.
    pub keep_alive_seconds: Option<f64>,
}

/// `GET /models`.
#[derive(Debug, Serialize, ToSchema)]
pub struct ModelProcesses {
    pub object: &'static str,
    pub data: Vec<ModelProcess>,
}

/// Every model and adapter with its state and what it holds.
#[utoipa::path(get, path = "/models", tag = "lamina",
    security(("api_key" = [])),
    responses((status = 200, description = "The models", body = ModelProcesses)))]
pub async fn list(State(state): State<Arc<AppState>>) -> Json<ModelProcesses> {
    let data = model_cards(&state)
        .into_iter()
        .map(|(card, info)| ModelProcess {
            card,
            running: info.running,
            idle_seconds: info.idle.as_secs_f64(),
            weights_bytes: info.memory.weights,
            kv_bytes: info.memory.kv,
            replicas: info.replicas,
            keep_alive_seconds: info.keep_alive,
        })
        .collect();
    Json(ModelProcesses {
        object: "list",
        data,
    })
}

/// Loads a model (evicting the least recently used idle one past
/// `--max-loaded-models`); answers once it is loaded.
#[utoipa::path(post, path = "/models/load", tag = "lamina",
    security(("api_key" = [])),
    request_body = ModelRequest,
    responses(
        (status = 200, description = "Loaded", body = ModelAction),
        (status = 404, description = "No such model", body = crate::error::ErrorBody),
        (status = 507, description = "It does not fit: the memory needed and free", body = crate::error::ErrorBody),
    ))]
pub async fn load(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<ModelAction>, ApiError> {
    let req = parse(&state, body)?;
    state.models.load(&req.model).await?;
    Ok(Json(ModelAction {
        success: true,
        model: req.model,
        status: "loaded",
    }))
}

/// Unloads a model: its running requests finish first, then its engines
/// shut down and its memory is freed.
#[utoipa::path(post, path = "/models/unload", tag = "lamina",
    security(("api_key" = [])),
    request_body = ModelRequest,
    responses(
        (status = 200, description = "Unloading or unloaded", body = ModelAction),
        (status = 404, description = "No such model", body = crate::error::ErrorBody),
        (status = 409, description = "It is loading, or cannot be loaded again", body = crate::error::ErrorBody),
    ))]
pub async fn unload(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<ModelAction>, ApiError> {
    let req = parse(&state, body)?;
    let now = state.models.unload(&req.model)?;
    Ok(Json(ModelAction {
        success: true,
        model: req.model,
        status: now.as_str(),
    }))
}

fn parse(state: &AppState, body: Result<Bytes, BytesRejection>) -> Result<ModelRequest, ApiError> {
    if state.is_draining() {
        return Err(ApiError::shutting_down());
    }
    let body = body_bytes(state, body)?;
    protocol::parse(&body)
}
