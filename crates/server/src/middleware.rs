//! Per-request layers: a request id (from `x-request-id` when the client
//! sends a short printable one, else a fresh number) carried in a tracing
//! span and echoed in the response header, and the API-key check.
//!
//! The `response` log line carries the request's real duration: for a
//! streamed (SSE) response it is written when the body ends or the client
//! goes away, not when the headers leave.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use tracing::Instrument;

use crate::error::ApiError;
use crate::response_store::Owner;
use crate::state::{AppState, key_digest};

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
    let resp = next.run(req).instrument(span.clone()).await;
    let done = LogOnDrop {
        span,
        start,
        status: resp.status().as_u16(),
    };
    let streamed = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    let mut resp = if streamed {
        // logged when the stream (and with it `done`) is dropped: at its end,
        // or when the client disconnects
        let (parts, body) = resp.into_parts();
        let stream = body.into_data_stream().map(move |chunk| {
            let _alive = &done;
            chunk
        });
        Response::from_parts(parts, Body::from_stream(stream))
    } else {
        drop(done);
        resp
    };
    let echoed = client_id.unwrap_or_else(|| id.to_string());
    if let Ok(v) = HeaderValue::from_str(&echoed) {
        resp.headers_mut().insert(REQUEST_ID_HEADER, v);
    }
    resp
}

/// Writes a request's `response` log line when dropped.
struct LogOnDrop {
    span: tracing::Span,
    start: Instant,
    status: u16,
}

impl Drop for LogOnDrop {
    fn drop(&mut self) {
        self.span.in_scope(|| {
            tracing::info!(
                status = self.status,
                elapsed_ms = self.start.elapsed().as_millis() as u64,
                "response"
            )
        });
    }
}

/// Compares two digests in time independent of where they differ.
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Why an API key cannot be used (checked at start-up): it must be
/// non-empty printable ASCII without surrounding spaces, or no client could
/// ever send it in an `Authorization` header.
pub fn check_api_key(key: &str) -> Result<(), String> {
    if key.is_empty() {
        return Err("must not be empty".into());
    }
    if key.starts_with(' ') || key.ends_with(' ') {
        return Err("must not start or end with a space".into());
    }
    if let Some(c) = key.chars().find(|c| !(' '..='~').contains(c)) {
        return Err(format!(
            "must be printable ASCII; found {:?} (U+{:04X})",
            c, c as u32
        ));
    }
    Ok(())
}

/// Header carrying the API key as Anthropic's clients send it.
pub const X_API_KEY: &str = "x-api-key";

/// Requires `Authorization: Bearer <key>` (or, as Anthropic's clients send
/// it, `x-api-key: <key>`) when the server has keys, with any one of them
/// (the scheme name case-insensitive, as HTTP says; any other scheme, or a
/// bare key in `Authorization`, is refused). The given key is compared with
/// every configured key, each in constant time. Refusals on the Anthropic
/// routes come in Anthropic's error shape. An accepted request carries its
/// key's [`Owner`] (the key's position, never the key), the anonymous owner
/// when the server has no keys.
pub async fn require_api_key(
    State(state): State<Arc<AppState>>,
    mut req: Request,
    next: Next,
) -> Response {
    let want = &state.api_key_digests;
    if want.is_empty() {
        req.extensions_mut().insert(Owner::default());
        return next.run(req).await;
    }
    let anthropic = req.uri().path().starts_with("/v1/messages");
    let refuse = move |msg: &str| {
        let e = ApiError::unauthorized(msg);
        if anthropic {
            crate::error::anthropic::error_response(e)
        } else {
            e.into_response()
        }
    };
    let header = req
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| v.to_str().unwrap_or(""));
    let x_key = req
        .headers()
        .get(X_API_KEY)
        .map(|v| v.to_str().unwrap_or(""));
    let given = match (header, x_key) {
        (None, None) => {
            return refuse(
                "Missing API key: send it as `Authorization: Bearer <key>` (or `x-api-key: <key>`).",
            );
        }
        (Some(header), _) => header
            .split_once(' ')
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, k)| k.trim_start_matches(' ')),
        (None, Some(k)) => Some(k),
    };
    let hit = match given {
        None => {
            return refuse(
                "Malformed `Authorization` header: send the key as `Authorization: Bearer <key>`.",
            );
        }
        Some(k) => {
            let d = key_digest(k.as_bytes());
            // every key compared, the first match kept
            want.iter()
                .enumerate()
                .fold(None, |hit, (i, w)| hit.or(same(&d, w).then_some(i)))
        }
    };
    match hit {
        Some(i) => {
            req.extensions_mut()
                .insert(Owner(u32::try_from(i + 1).unwrap_or(u32::MAX)));
            next.run(req).await
        }
        None => refuse("Incorrect API key provided."),
    }
}
