//! Per-request layers: a request id (from `x-request-id` when the client
//! sends a short printable one, else a fresh number) carried in a tracing
//! span and echoed in the response header, and the API-key check.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tracing::Instrument;

use crate::error::ApiError;
use crate::state::AppState;

/// The id of the request being served (a request extension).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestId(pub u64);

/// Header carrying the request id.
pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// Assigns the request id, logs the request and its status inside a span.
pub async fn request_context(
    State(state): State<Arc<AppState>>,
    mut req: Request,
    next: Next,
) -> Response {
    let id = state.next_request_id();
    let client_id = req
        .headers()
        .get(REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|s| !s.is_empty() && s.len() <= 128)
        .map(str::to_owned);
    req.extensions_mut().insert(RequestId(id));
    let span = tracing::info_span!(
        "request",
        request_id = id,
        client_request_id = tracing::field::Empty,
        method = %req.method(),
        path = %req.uri().path(),
    );
    if let Some(c) = &client_id {
        span.record("client_request_id", c.as_str());
    }
    let start = Instant::now();
    let mut resp = next.run(req).instrument(span.clone()).await;
    span.in_scope(|| {
        tracing::info!(
            status = resp.status().as_u16(),
            elapsed_ms = start.elapsed().as_millis() as u64,
            "response"
        )
    });
    let echoed = client_id.unwrap_or_else(|| id.to_string());
    if let Ok(v) = HeaderValue::from_str(&echoed) {
        resp.headers_mut().insert(REQUEST_ID_HEADER, v);
    }
    resp
}

/// Compares two byte strings in time independent of where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Requires `Authorization: Bearer <key>` when the server has a key.
pub async fn require_api_key(
    State(state): State<Arc<AppState>>,
    req: Request,
    next: Next,
) -> Response {
    let Some(key) = state.cfg.api_key.as_deref() else {
        return next.run(req).await;
    };
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.strip_prefix("Bearer ").unwrap_or(v).trim());
    match given {
        None => {
            ApiError::unauthorized("Missing API key: send it as `Authorization: Bearer <key>`.")
                .into_response()
        }
        Some(k) if !same(k.as_bytes(), key.as_bytes()) => {
            ApiError::unauthorized("Incorrect API key provided.").into_response()
        }
        Some(_) => next.run(req).await,
    }
}
