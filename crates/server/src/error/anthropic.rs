//! An [`ApiError`] in the shape of Anthropic's Messages API:
//! `{"type": "error", "error": {"type", "message"}}`, the status and
//! `Retry-After` of the OpenAI shape kept. The Messages handlers and the
//! layers in front of them (the API-key check, the request guard) answer
//! `/v1/messages` errors with it.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::ApiError;

/// Anthropic's error `type` for a status.
fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 408 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        s if s >= 500 => "api_error",
        _ => "invalid_request_error",
    }
}

/// The body of an error in Anthropic's shape.
pub fn error_body(e: &ApiError) -> Value {
    json!({"type": "error", "error": {"type": error_type(e.status), "message": e.message}})
}

/// An error as Anthropic's response (the status and `Retry-After` kept).
pub fn error_response(e: ApiError) -> Response {
    use axum::http::header::RETRY_AFTER;
    let body = error_body(&e);
    let status = e.status;
    let retry = e.into_response().headers().get(RETRY_AFTER).cloned();
    let mut out = (status, Json(body)).into_response();
    if let Some(v) = retry {
        out.headers_mut().insert(RETRY_AFTER, v);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_take_anthropics_shape() {
        let b = error_body(&ApiError::invalid_param("stop_sequences", "Too many."));
        assert_eq!(b["type"], "error");
        assert_eq!(b["error"]["type"], "invalid_request_error");
        assert_eq!(b["error"]["message"], "Too many.");
        let r = error_response(ApiError::queue_full());
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(r.headers().contains_key(axum::http::header::RETRY_AFTER));
        assert_eq!(error_type(StatusCode::UNAUTHORIZED), "authentication_error");
        assert_eq!(error_type(StatusCode::NOT_FOUND), "not_found_error");
        assert_eq!(
            error_type(StatusCode::SERVICE_UNAVAILABLE),
            "overloaded_error"
        );
    }
}
