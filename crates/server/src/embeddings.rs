//! `POST /v1/embeddings` in OpenAI's shape.
//!
//! Contract: `input` is a string, a list of strings, a list of token ids
//! or a list of such lists (OpenAI's four shapes); texts are tokenized on
//! the work pool with the tokenizer's special tokens. Every input is
//! checked by the engine (`Engine::embed`: none empty, ids inside the
//! vocabulary, at most the model's context), its refusal a 400 naming
//! `input` (one input) or `input[i]`; a too-long input is a
//! `context_length_exceeded` naming the limit. `dimensions` is refused
//! unless it equals the model's hidden size (the only size served);
//! `encoding_format` is `float` (the default) or `base64` (each vector's
//! little-endian f32 bytes, as OpenAI sends them). The vectors are the
//! engine's: the final hidden state pooled as the server's `--pooling`
//! says and L2-normalised. `usage.prompt_tokens` counts every input's
//! tokens. Embeddings run on the base model (a LoRA adapter's name is
//! refused).
//!
//! Costs: tokenization on the work pool, one engine job per request, and
//! `4 x hidden` bytes (float: about 10 characters per value) per input in
//! the response.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use base64::Engine as _;
use engine::{EmbedError, EmbedRequest};
use serde::{Deserialize, Serialize};

use crate::api::accept;
use crate::encode::{Input, encode_now};
use crate::error::ApiError;
use crate::models::Lease;
use crate::protocol::Prompt;
use crate::state::AppState;

/// `POST /v1/embeddings`.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EmbeddingRequest {
    #[serde(default)]
    pub model: Option<String>,
    /// A string, a list of strings, token ids, or a list of token-id lists.
    pub input: Prompt,
    /// `float` (default) or `base64` (little-endian f32 bytes).
    #[serde(default)]
    pub encoding_format: Option<String>,
    /// Must equal the model's hidden size when given.
    #[serde(default)]
    pub dimensions: Option<u64>,
    /// Accepted and ignored.
    #[serde(default)]
    pub user: Option<String>,
    /// How long the model stays loaded after this request (ollama's
    /// `keep_alive`: seconds or a duration like `5m`).
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub keep_alive: Option<crate::keep_alive::KeepAlive>,
}

/// One vector: floats, or base64 of its little-endian f32 bytes.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum EmbeddingValue {
    Float(Vec<f32>),
    Base64(String),
}

/// One input's embedding.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Embedding {
    pub object: &'static str,
    pub index: usize,
    pub embedding: EmbeddingValue,
}

/// Tokens embedded.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct EmbeddingUsage {
    pub prompt_tokens: usize,
    pub total_tokens: usize,
}

/// The `list` of embeddings, in input order.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct EmbeddingList {
    pub object: &'static str,
    pub data: Vec<Embedding>,
    pub model: String,
    pub usage: EmbeddingUsage,
}

/// Creates one embedding per input: the model's final hidden state,
/// pooled (`--pooling`) and L2-normalised.
#[utoipa::path(post, path = "/v1/embeddings", tag = "openai",
    security(("api_key" = [])),
    request_body = EmbeddingRequest,
    responses(
        (status = 200, description = "The embeddings", body = EmbeddingList),
        (status = 400, description = "Bad input, naming the parameter", body = crate::error::ErrorBody),
        (status = 404, description = "Unknown model", body = crate::error::ErrorBody),
    ))]
pub async fn create_embeddings(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<EmbeddingList>, ApiError> {
    let req: EmbeddingRequest = accept(&state, body)?;
    let model = state
        .models
        .acquire(req.model.as_deref(), req.keep_alive)
        .await?;
    if model.lora().is_some() {
        return Err(ApiError::invalid_param(
            "model",
            "Embeddings run on the base model, not on a LoRA adapter.",
        ));
    }
    let hidden = model.replicas.hidden_size();
    if let Some(d) = req.dimensions.filter(|&d| d != hidden as u64) {
        return Err(ApiError::invalid_param(
            "dimensions",
            format!(
                "This model's embeddings have {hidden} dimensions; `dimensions` {d} is not supported (omit it or give {hidden})."
            ),
        ));
    }
    let base64 = match req.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::invalid_param(
                "encoding_format",
                format!("Unknown `encoding_format` `{other}`; expected `float` or `base64`."),
            ));
        }
    };
    let single = matches!(req.input, Prompt::Text(_) | Prompt::Tokens(_));
    let inputs = tokenize(&state, &model, req.input).await?;
    let pooling = state.cfg.pooling;
    let handle = (model.replicas)
        .embed(EmbedRequest { inputs, pooling })
        .map_err(|e| embed_error(e, single))?;
    let done = handle.wait().await.map_err(|e| embed_error(e, single))?;
    let data = (done.vectors.into_iter().enumerate())
        .map(|(index, v)| Embedding {
            object: "embedding",
            index,
            embedding: encode_vector(v, base64),
        })
        .collect();
    Ok(Json(EmbeddingList {
        object: "list",
        data,
        model: model.name().to_string(),
        usage: EmbeddingUsage {
            prompt_tokens: done.prompt_tokens,
            total_tokens: done.prompt_tokens,
        },
    }))
}

/// The inputs as token ids (texts tokenized on the work pool, at most
/// `engine::embed::MAX_EMBED_INPUTS` of them).
async fn tokenize(
    state: &Arc<AppState>,
    model: &Lease,
    input: Prompt,
) -> Result<Vec<Vec<u32>>, ApiError> {
    let texts = match input {
        Prompt::Tokens(ids) => return Ok(vec![ids]),
        Prompt::TokenLists(lists) => return Ok(lists),
        Prompt::Text(t) => vec![t],
        Prompt::Texts(ts) => ts,
    };
    engine::embed::check_count(texts.len()).map_err(|e| embed_error(e, false))?;
    let single = texts.len() == 1;
    if let Some(i) = texts.iter().position(String::is_empty) {
        let msg = "An empty string has nothing to embed.";
        return Err(ApiError::invalid_param(input_param(single, i), msg));
    }
    let lease = model.clone();
    let job = move || {
        let mut out = Vec::with_capacity(texts.len());
        for (i, text) in texts.into_iter().enumerate() {
            let param = input_param(single, i);
            let add_special = true;
            out.push(encode_now(
                &lease,
                Input::Text { text, add_special },
                &param,
            )?);
        }
        Ok(out)
    };
    state.work.run("input", job).await?
}

/// The parameter naming input `i`: `input` for a single input.
fn input_param(single: bool, i: usize) -> String {
    match single {
        true => "input".to_string(),
        false => format!("input[{i}]"),
    }
}

/// The response value of one vector.
fn encode_vector(v: Vec<f32>, base64: bool) -> EmbeddingValue {
    if !base64 {
        return EmbeddingValue::Float(v);
    }
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    EmbeddingValue::Base64(base64::engine::general_purpose::STANDARD.encode(bytes))
}

/// The API error of an engine refusal or failure (`single`: one input,
/// named `input`).
fn embed_error(e: EmbedError, single: bool) -> ApiError {
    let msg = crate::error::sentence(&e.to_string());
    let param = e
        .input()
        .map_or("input".to_string(), |i| input_param(single, i));
    match e {
        EmbedError::TooLong { .. } => ApiError::context_length(&param, msg),
        EmbedError::ShuttingDown => ApiError::shutting_down(),
        EmbedError::EngineFailed(_) | EmbedError::Backend(_) => ApiError::internal(msg),
        _ => ApiError::invalid_param(param, msg),
    }
}
