//! A request's body as bytes, or the API error that says why it was
//! refused: 413 over `--body-limit` (`request_too_large`), 408 for a body
//! that arrives too slowly or stalls (the body timeouts of
//! [`crate::listen`]), the extractor's own status otherwise.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;

use crate::error::ApiError;
use crate::state::AppState;

/// The body, or the API error for a refused one (413 over the limit).
pub fn body_bytes(
    state: &AppState,
    body: Result<Bytes, BytesRejection>,
) -> Result<Bytes, ApiError> {
    body.map_err(|rej| {
        if rej.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError {
                code: Some("request_too_large"),
                ..ApiError::from_status(
                    rej.status(),
                    format!(
                        "The request body is larger than this server's limit of {} bytes.",
                        state.cfg.body_limit
                    ),
                )
            }
        } else if let Some(slow) = cause::<crate::listen::SlowBody>(&rej) {
            ApiError::from_status(StatusCode::REQUEST_TIMEOUT, slow.0.clone())
        } else if cause::<tower_http::timeout::TimeoutError>(&rej).is_some() {
            ApiError::from_status(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "The request body stalled for longer than this server's limit of {:.1} s between chunks.",
                    state.cfg.body_timeout.as_secs_f64()
                ),
            )
        } else {
            ApiError::from_status(rej.status(), rej.body_text())
        }
    })
}

/// The error of type `E` among the causes of a body rejection (the
/// body timeouts of `listen`).
fn cause<E: std::error::Error + 'static>(rej: &BytesRejection) -> Option<&E> {
    let mut e: Option<&(dyn std::error::Error + 'static)> = Some(rej);
    while let Some(err) = e {
        if let Some(hit) = err.downcast_ref::<E>() {
            return Some(hit);
        }
        e = err.source();
    }
    None
}
