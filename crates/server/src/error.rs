//! API errors in OpenAI's JSON shape:
//! `{"error": {"message", "type", "param", "code"}}` with these HTTP statuses
//! (400 bad input naming the parameter, 401 API key, 404
//! unknown model, 413 body too large, 429 queue full with `Retry-After`,
//! 503 shutting down, 500 engine failure).
//!
//! Every handler returns `Result<_, ApiError>`; nothing here panics.

pub mod anthropic;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use engine::SubmitError;
use serde::Serialize;

/// Seconds a client is told to wait after a 429 / 503.
pub const RETRY_AFTER_SECS: u64 = 1;

/// One API error: the status and the body's fields.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's `type`: `invalid_request_error`, `authentication_error`, ...
    pub kind: &'static str,
    /// The request parameter at fault, if one is.
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

/// The body of every error response.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorBody<'a> {
    error: ErrorInner<'a>,
}

/// OpenAI's error object.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorInner<'a> {
    message: &'a str,
    /// `invalid_request_error`, `authentication_error`, ...
    #[serde(rename = "type")]
    kind: &'a str,
    /// The request parameter at fault, if one is.
    param: Option<&'a str>,
    code: Option<&'a str>,
}

impl ApiError {
    /// This chat-path error as another API reports it: its field named by
    /// `rename` (of the chat field's name) in `param` and in the message.
    pub fn param_renamed(self, rename: impl Fn(&str) -> String) -> ApiError {
        match self.param.as_deref() {
            Some(p) => {
                let ours = rename(p);
                let message = self
                    .message
                    .replace(&format!("`{p}`"), &format!("`{ours}`"));
                ApiError {
                    param: Some(ours),
                    message,
                    ..self
                }
            }
            None => self,
        }
    }

    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
        }
    }

    /// 400 for a bad value of `param`.
    pub fn invalid_param(param: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError {
            param: Some(param.into()),
            code: Some("invalid_value"),
            ..Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
        }
    }

    /// 400 for a request that is wrong as a whole (no single parameter at fault).
    pub fn invalid_request(message: impl Into<String>) -> Self {
        ApiError {
            code: Some("invalid_request"),
            ..Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
        }
    }

    /// 400 for a body that is not valid JSON.
    pub fn malformed_json(message: impl Into<String>) -> Self {
        ApiError {
            code: Some("invalid_json"),
            ..Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
        }
    }

    /// 400: the prompt plus the requested completion do not fit the context.
    pub fn context_length(param: &str, message: impl Into<String>) -> Self {
        ApiError {
            param: Some(param.to_string()),
            code: Some("context_length_exceeded"),
            ..Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
        }
    }

    /// 404 for a model this server does not serve.
    pub fn unknown_model(model: &str) -> Self {
        ApiError {
            param: Some("model".into()),
            code: Some("model_not_found"),
            ..Self::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                format!("The model `{model}` does not exist."),
            )
        }
    }

    /// 404 for a LoRA adapter name no adapter is loaded under.
    pub fn lora_not_found(message: impl Into<String>) -> Self {
        ApiError {
            param: Some("lora_name".into()),
            code: Some("lora_not_found"),
            ..Self::new(StatusCode::NOT_FOUND, "invalid_request_error", message)
        }
    }

    /// 401 for a missing or wrong API key.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        ApiError {
            code: Some("invalid_api_key"),
            ..Self::new(StatusCode::UNAUTHORIZED, "authentication_error", message)
        }
    }

    /// 429: the engine's waiting queue is full.
    pub fn queue_full() -> Self {
        ApiError {
            code: Some("queue_full"),
            ..Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                "The server is at capacity (request queue full); retry later.",
            )
        }
    }

    /// 503: the server is shutting down.
    pub fn shutting_down() -> Self {
        ApiError {
            code: Some("shutting_down"),
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "The server is shutting down.",
            )
        }
    }

    /// 500: the engine failed while running the request.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// Any other status from a rejected request body (413 body too large, ...).
    pub fn from_status(status: StatusCode, message: impl Into<String>) -> Self {
        let kind = if status.is_server_error() {
            "server_error"
        } else {
            "invalid_request_error"
        };
        Self::new(status, kind, message)
    }

    /// The JSON body, for SSE error events and responses.
    pub fn body(&self) -> serde_json::Value {
        serde_json::to_value(ErrorBody {
            error: ErrorInner {
                message: &self.message,
                kind: self.kind,
                param: self.param.as_deref(),
                code: self.code,
            },
        })
        .unwrap_or(serde_json::Value::Null)
    }

    fn retry_after(&self) -> bool {
        matches!(
            self.status,
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
        )
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status.as_u16(), self.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (self.status, axum::Json(self.body())).into_response();
        if self.retry_after() {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
        }
        resp
    }
}

/// Maps an engine refusal to its API error; `prompt_param` is `messages` or `prompt`.
pub fn from_submit(err: SubmitError, prompt_param: &str, max_tokens_param: &str) -> ApiError {
    let msg = sentence(&err.to_string());
    match err {
        SubmitError::QueueFull => ApiError::queue_full(),
        SubmitError::ShuttingDown => ApiError::shutting_down(),
        SubmitError::EngineFailed(_) => ApiError {
            code: Some("engine_failed"),
            ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", msg)
        },
        // the engine's `max_tokens`, under the client's name for it
        SubmitError::InvalidParams(p) if p.param == "max_tokens" => ApiError::invalid_param(
            max_tokens_param,
            format!("Invalid `{max_tokens_param}`: {}.", p.reason),
        ),
        SubmitError::InvalidParams(p) => ApiError::invalid_param(p.param, msg),
        SubmitError::PromptTooLong { .. } | SubmitError::ExceedsKvPool { .. } => {
            ApiError::context_length(prompt_param, msg)
        }
        SubmitError::ContextExceeded { .. } | SubmitError::NeverFitsKvPool { .. } => {
            ApiError::context_length(max_tokens_param, msg)
        }
        SubmitError::TokenOutOfVocab { .. } | SubmitError::EmptyPrompt => {
            ApiError::invalid_param(prompt_param, msg)
        }
        SubmitError::Grammar(_) => ApiError::invalid_param("response_format", msg),
        // unloaded between the check of `model` and the submit
        SubmitError::UnknownLora(m) => ApiError::unknown_model(&m),
    }
}

/// `the prompt is empty` -> `The prompt is empty.`
pub(crate) fn sentence(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        Some(c) => format!("{}{}.", c.to_uppercase(), chars.as_str()),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_has_openai_shape() {
        let e = ApiError::invalid_param("top_p", "bad");
        let b = e.body();
        assert_eq!(b["error"]["message"], "bad");
        assert_eq!(b["error"]["type"], "invalid_request_error");
        assert_eq!(b["error"]["param"], "top_p");
        assert_eq!(b["error"]["code"], "invalid_value");
        assert!(ApiError::queue_full().body()["error"]["param"].is_null());
    }

    #[test]
    fn queue_full_carries_retry_after() {
        let r = ApiError::queue_full().into_response();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        let r = ApiError::invalid_param("n", "x").into_response();
        assert!(r.headers().get(header::RETRY_AFTER).is_none());
    }

    #[test]
    fn submit_errors_map_to_statuses() {
        assert_eq!(
            from_submit(SubmitError::QueueFull, "prompt", "max_tokens").status,
            429
        );
        assert_eq!(
            from_submit(SubmitError::ShuttingDown, "prompt", "max_tokens").status,
            503
        );
        let e = from_submit(
            SubmitError::PromptTooLong {
                prompt: 9,
                limit: 8,
            },
            "messages",
            "max_tokens",
        );
        assert_eq!(
            (e.status.as_u16(), e.param.as_deref()),
            (400, Some("messages"))
        );
        assert_eq!(
            e.message,
            "The prompt has 9 tokens; the model's context is 8."
        );
        let e = from_submit(
            SubmitError::NeverFitsKvPool {
                prompt: 10,
                max_tokens: 30,
                pool_tokens: 16,
            },
            "prompt",
            "max_completion_tokens",
        );
        assert_eq!(
            (e.status.as_u16(), e.param.as_deref()),
            (400, Some("max_completion_tokens"))
        );
        assert!(e.message.contains("16 tokens"), "{}", e.message);
        // the engine's `max_tokens` check, under the client's name
        let e = from_submit(
            SubmitError::InvalidParams(contract::ParamError {
                param: "max_tokens",
                reason: "must be at least 1, got 0".into(),
            }),
            "messages",
            "max_completion_tokens",
        );
        assert_eq!(e.param.as_deref(), Some("max_completion_tokens"));
        assert_eq!(
            e.message,
            "Invalid `max_completion_tokens`: must be at least 1, got 0."
        );
    }
}
