//! LoRA adapters over HTTP (vLLM's API): `POST /v1/load_lora_adapter`
//! `{"lora_name", "lora_path"}` and `POST /v1/unload_lora_adapter`
//! `{"lora_name"}`, behind the API key; a request's `model` names a
//! model or a loaded adapter ([`crate::models::Models::acquire`]);
//! `/v1/models` lists the adapters with `parent` = the base model's id.
//! With several models, `load_lora_adapter` takes the base model in
//! `model` (default: the first); adapter and model names share one
//! namespace, so a name taken by either is refused.
//!
//! Contract: an adapter is loaded into every replica or none (a replica
//! that refuses it unloads it from those that took it). Reading the files
//! is the model's [`crate::models::LoraLoader`] the binary gives it
//! ([`crate::models::Served::lora_loader`]; the server reads no files itself), run on
//! the blocking pool and given `ServerConfig::lora_load_timeout`
//! (`--lora-load-timeout-secs`) to answer. A load when `--max-loaded-loras` adapters are loaded is refused
//! before any file is read, one past `--max-lora-memory-mib` once read. A
//! bad adapter is a 400 naming what is wrong (the loader's message names
//! the file and field or tensor, and tells nothing of paths that cannot be
//! read), an unknown one on unload or in `model` a 404.
//! Unloading never disturbs a request already submitted with the adapter.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use engine::LoraRegistryError;
use serde::Deserialize;
use utoipa::ToSchema;

use crate::body::body_bytes;
use crate::error::ApiError;
use crate::models::Served;
use crate::protocol;
use crate::state::AppState;

/// `POST /v1/load_lora_adapter`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LoadLoraRequest {
    /// The name requests use as `model`.
    pub lora_name: String,
    /// A directory in the PEFT layout, or a Hugging Face repo id.
    pub lora_path: String,
    /// lamina extension: the loaded model the adapter is for (default:
    /// the first model served).
    #[serde(default)]
    pub model: Option<String>,
}

/// `POST /v1/unload_lora_adapter`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UnloadLoraRequest {
    pub lora_name: String,
    /// Accepted and ignored (vLLM's field).
    #[serde(default)]
    pub lora_int_id: Option<i64>,
}

fn registry_error(e: LoraRegistryError) -> ApiError {
    let msg = format!("{e}.");
    match e {
        LoraRegistryError::NotLoaded(_) => ApiError::lora_not_found(msg),
        LoraRegistryError::Invalid { .. } => ApiError::invalid_param("lora_path", msg),
        LoraRegistryError::Disabled
        | LoraRegistryError::TooMany { .. }
        | LoraRegistryError::TooLarge { .. } => ApiError::invalid_request(msg),
        _ => ApiError::invalid_param("lora_name", msg),
    }
}

/// Loads a LoRA adapter for later requests (`model: lora_name`).
#[utoipa::path(post, path = "/v1/load_lora_adapter", tag = "lamina",
    security(("api_key" = [])),
    request_body = LoadLoraRequest,
    responses(
        (status = 200, description = "Loaded", body = String),
        (status = 400, description = "A bad or refused adapter, naming the field, file or tensor", body = crate::error::ErrorBody),
    ))]
pub async fn load_lora_adapter(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<String, ApiError> {
    let body = body_bytes(&state, body)?;
    let req: LoadLoraRequest = protocol::parse(&body)?;
    let name = req.lora_name.clone();
    if name.is_empty() {
        return Err(registry_error(LoraRegistryError::EmptyName));
    }
    let served = base_model(&state, req.model.as_deref())?;
    match state.models.owner_of(&name) {
        Some(owner) if owner == name => {
            return Err(registry_error(LoraRegistryError::BaseName(name)));
        }
        Some(_) if served.loras().contains(&name) => {
            return Err(registry_error(LoraRegistryError::AlreadyLoaded(name)));
        }
        Some(owner) => {
            return Err(ApiError::invalid_param(
                "lora_name",
                format!("The name `{name}` is taken by a LoRA adapter of model `{owner}`."),
            ));
        }
        None => {}
    }
    if served
        .replicas
        .engine(0)
        .is_some_and(|e| e.max_loras() == 0)
    {
        return Err(registry_error(LoraRegistryError::Disabled));
    }
    if let Some(e) = served.replicas.engine(0) {
        e.loras().check_room().map_err(registry_error)?;
    }
    let Some(loader) = served.lora_loader.clone() else {
        return Err(registry_error(LoraRegistryError::Disabled));
    };
    let path = req.lora_path.clone();
    let limit = state.cfg.lora_load_timeout;
    let adapter = tokio::time::timeout(limit, tokio::task::spawn_blocking(move || loader(&path)))
        .await
        .map_err(|_| {
            ApiError::invalid_param(
                "lora_path",
                format!(
                    "Reading the adapter took longer than {} s (--lora-load-timeout-secs).",
                    limit.as_secs_f64()
                ),
            )
        })?
        .map_err(|e| ApiError::internal(format!("the adapter loader failed: {e}")))?
        .map_err(|e| ApiError::invalid_param("lora_path", e))?;
    let replicas = &served.replicas;
    for i in 0..replicas.len() {
        let Some(e) = replicas.engine(i) else {
            continue;
        };
        if let Err(err) = e.load_lora(&name, adapter.clone()) {
            for j in 0..i {
                if let Some(e) = replicas.engine(j) {
                    let _ = e.unload_lora(&name);
                }
            }
            return Err(registry_error(err));
        }
    }
    tracing::info!(lora = %name, path = %req.lora_path, rank = adapter.rank, "LoRA adapter loaded");
    Ok(format!(
        "Success: LoRA adapter '{name}' added successfully."
    ))
}

/// Unloads a LoRA adapter: later requests naming it get a 404; requests
/// already running finish with it.
#[utoipa::path(post, path = "/v1/unload_lora_adapter", tag = "lamina",
    security(("api_key" = [])),
    request_body = UnloadLoraRequest,
    responses(
        (status = 200, description = "Unloaded", body = String),
        (status = 404, description = "No adapter of that name", body = crate::error::ErrorBody),
    ))]
pub async fn unload_lora_adapter(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<String, ApiError> {
    let body = body_bytes(&state, body)?;
    let req: UnloadLoraRequest = protocol::parse(&body)?;
    let name = req.lora_name;
    let owner = state
        .models
        .owner_of(&name)
        .filter(|o| *o != name)
        .and_then(|o| state.models.loaded(Some(&o)));
    let Some(served) = owner else {
        return Err(registry_error(LoraRegistryError::NotLoaded(name)));
    };
    let mut first: Option<LoraRegistryError> = None;
    for i in 0..served.replicas.len() {
        if let Some(Err(e)) = served.replicas.engine(i).map(|e| e.unload_lora(&name)) {
            first.get_or_insert(e);
        }
    }
    if let Some(e) = first {
        return Err(registry_error(e));
    }
    tracing::info!(lora = %name, "LoRA adapter unloaded");
    Ok(format!(
        "Success: LoRA adapter '{name}' removed successfully."
    ))
}

/// The loaded model `model` names (the first with `None`) for an adapter
/// load: 404 for an unknown one, 409 for one not loaded.
fn base_model(state: &AppState, model: Option<&str>) -> Result<Arc<Served>, ApiError> {
    if let Some(m) = model
        && !state.models.names().iter().any(|n| n == m)
    {
        return Err(ApiError::unknown_model(m));
    }
    state.models.loaded(model).ok_or_else(|| {
        ApiError::from_status(
            axum::http::StatusCode::CONFLICT,
            format!(
                "Model `{}` is not loaded: load it before its adapters.",
                model.unwrap_or("(the first)")
            ),
        )
    })
}

/// What `/metrics` shows of a model's adapters, over every replica;
/// `None` with LoRA off.
pub fn metrics_view(served: &Served) -> Option<crate::metrics::LoraView> {
    let first = served.replicas.engine(0)?;
    if first.max_loras() == 0 {
        return None;
    }
    let (mut running, mut waiting, mut resident) = (Vec::new(), Vec::new(), 0);
    let mut requests: std::collections::BTreeMap<String, u64> = Default::default();
    for i in 0..served.replicas.len() {
        let Some(e) = served.replicas.engine(i) else {
            continue;
        };
        let g = e.lora_gauge();
        resident += g.resident;
        running.extend(g.running);
        waiting.extend(g.waiting);
        for (name, n) in e.loras().requests() {
            *requests.entry(name).or_default() += n;
        }
    }
    for v in [&mut running, &mut waiting] {
        v.sort();
        v.dedup();
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    Some(crate::metrics::LoraView {
        max_loras: first.max_loras(),
        loaded: first.loras().names().len(),
        resident,
        running,
        waiting,
        requests: requests.into_iter().collect(),
        now,
    })
}
