//! Checks every request passes before its route, against cross-site
//! requests and DNS rebinding: the `Host` it names, the `Origin` of a
//! state-changing request, and the media type of a body.
//!
//! Contract:
//! - `Host`: loopback names (`localhost`, `127.0.0.0/8`, `[::1]`, any
//!   port), the address the server is bound to ([`AppState::bind`]) and the
//!   names of `allowed_hosts` are served; any other is a 403 naming it and
//!   the flag (`--allowed-hosts`). `*` in `allowed_hosts` serves any Host,
//!   as does an empty `allowed_hosts` when API keys are set (a rebinding
//!   page cannot send the key). A request without `Host` (no browser sends
//!   one) passes. `GET /health` and `GET /metrics` are exempt: Kubernetes
//!   probes send the pod's IP as Host.
//! - `Origin`: without API keys, a `POST`, `PUT`, `PATCH` or `DELETE`
//!   whose `Origin` is neither the request's own Host (the chat page), a
//!   loopback or allowed host, nor one of `allowed_origins` is a 403 naming
//!   the origin. Browsers send `Origin` on every cross-origin request that
//!   changes state, CORS or not.
//! - `Content-Type`: a `POST` / `PUT` / `PATCH` body must be JSON
//!   (`application/json` with any parameters, or a `+json` type) or carry
//!   no type at all (then it is read as JSON); any other type, such as the
//!   `text/plain` a cross-site form sends without a preflight or curl's
//!   default for `-d`, is a 415 telling the fix.
//!
//! Errors come in the API's shape (Anthropic's on `/v1/messages*`).
//! Costs: O(header length) per request.

use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;
use crate::state::AppState;

/// Refuses requests that fail the checks of the module doc.
pub async fn check_request(
    State(state): State<Arc<AppState>>,
    req: Request,
    next: Next,
) -> Response {
    match refusal(&state, &req) {
        None => next.run(req).await,
        Some(e) if req.uri().path().starts_with("/v1/messages") => {
            crate::error::anthropic::error_response(e)
        }
        Some(e) => e.into_response(),
    }
}

fn refusal(state: &AppState, req: &Request) -> Option<ApiError> {
    let headers = req.headers();
    let probe = req.method() == Method::GET && matches!(req.uri().path(), "/health" | "/metrics");
    if !probe && let Some(e) = host_refusal(state, headers) {
        return Some(e);
    }
    let changes = matches!(
        *req.method(),
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    );
    if changes
        && state.api_key_digests.is_empty()
        && let Some(e) = origin_refusal(state, headers)
    {
        return Some(e);
    }
    let has_body = matches!(*req.method(), Method::POST | Method::PUT | Method::PATCH);
    if has_body {
        return content_type_refusal(headers);
    }
    None
}

/// Whether every Host is served (see the module doc).
pub fn any_host(state: &AppState) -> bool {
    let hosts = &state.cfg.allowed_hosts;
    hosts.iter().any(|h| h == "*") || (hosts.is_empty() && !state.api_key_digests.is_empty())
}

/// The host part of `authority` (`name`, `name:port`, `[v6]:port`),
/// lowercased, brackets removed.
pub fn host_name(authority: &str) -> String {
    let a = authority.trim();
    let host = if let Some(rest) = a.strip_prefix('[') {
        rest.split(']').next().unwrap_or(rest)
    } else if a.matches(':').count() > 1 {
        a // a bare IPv6 address
    } else {
        a.split(':').next().unwrap_or(a)
    };
    host.trim_end_matches('.').to_ascii_lowercase()
}

/// Why an `--allowed-hosts` entry cannot be used: `*`, or a host name or
/// address with an optional port, no scheme or path.
pub fn check_allowed_host(host: &str) -> Result<(), String> {
    if host == "*" {
        return Ok(());
    }
    let name = host_name(host);
    let fine = !name.is_empty()
        && !host.contains("://")
        && !host.contains('/')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | ':'));
    if fine {
        Ok(())
    } else {
        Err(format!(
            "`{host}` is not a host name or address like `example.com` or `10.0.0.5` \
             (no scheme, no path; `*` for any)"
        ))
    }
}

fn is_loopback(host: &str) -> bool {
    host == "localhost"
        || host.ends_with(".localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Whether `host` (from [`host_name`]) is a loopback, bound or allowed host.
fn known_host(state: &AppState, host: &str) -> bool {
    is_loopback(host)
        || state
            .bind
            .get()
            .is_some_and(|ip| host.parse::<IpAddr>().is_ok_and(|h| h == *ip))
        || state
            .cfg
            .allowed_hosts
            .iter()
            .any(|a| a == "*" || host_name(a) == host)
}

fn forbidden(msg: String) -> ApiError {
    ApiError::from_status(StatusCode::FORBIDDEN, msg)
}

fn host_refusal(state: &AppState, headers: &HeaderMap) -> Option<ApiError> {
    let value = headers.get(header::HOST)?;
    if any_host(state) {
        return None;
    }
    let Ok(text) = value.to_str() else {
        return Some(forbidden(
            "The `Host` header is not printable ASCII.".to_string(),
        ));
    };
    if known_host(state, &host_name(text)) {
        return None;
    }
    Some(forbidden(format!(
        "Host `{text}` is not served: only loopback names, the address the server is bound to \
         and the names given to `--allowed-hosts` are (this protects against DNS rebinding). \
         Start the server with `--allowed-hosts {}` to serve it (`*`: any Host).",
        host_name(text)
    )))
}

fn origin_refusal(state: &AppState, headers: &HeaderMap) -> Option<ApiError> {
    let value = headers.get(header::ORIGIN)?;
    let origin = value.to_str().unwrap_or("").trim();
    let refused = || {
        forbidden(format!(
            "Origin `{origin}` may not send this request: without an API key, only the server's \
             own page, loopback origins and `--allowed-origins` / `--allowed-hosts` may change \
             state (this protects against cross-site requests)."
        ))
    };
    let allowed = &state.cfg.allowed_origins;
    if allowed
        .iter()
        .any(|o| o == "*" || o.eq_ignore_ascii_case(origin))
    {
        return None;
    }
    let Some((scheme, authority)) = origin.split_once("://") else {
        return Some(refused()); // `null` and the like
    };
    if !matches!(scheme, "http" | "https") {
        return Some(refused());
    }
    let own = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .is_some_and(|h| h.trim().eq_ignore_ascii_case(authority));
    let host = host_name(authority);
    let listed = is_loopback(&host)
        || state
            .cfg
            .allowed_hosts
            .iter()
            .any(|a| a != "*" && host_name(a) == host);
    if own || listed { None } else { Some(refused()) }
}

/// Whether a `Content-Type` value is JSON.
pub fn is_json(value: &str) -> bool {
    let essence = value.split(';').next().unwrap_or("").trim();
    let Some((kind, sub)) = essence.split_once('/') else {
        return false;
    };
    kind.eq_ignore_ascii_case("application")
        && (sub.eq_ignore_ascii_case("json") || sub.to_ascii_lowercase().ends_with("+json"))
}

fn content_type_refusal(headers: &HeaderMap) -> Option<ApiError> {
    let value = headers.get(header::CONTENT_TYPE)?;
    let text = value.to_str().unwrap_or("?");
    if is_json(text) {
        return None;
    }
    Some(ApiError::from_status(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        format!(
            "Content-Type `{text}` is not JSON: request bodies are JSON; send \
             `Content-Type: application/json` (curl: `-H 'Content-Type: application/json'`)."
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_drop_ports_and_brackets() {
        assert_eq!(host_name("LocalHost:8000"), "localhost");
        assert_eq!(host_name("[::1]:8000"), "::1");
        assert_eq!(host_name("127.0.0.9"), "127.0.0.9");
        assert_eq!(host_name("example.com."), "example.com");
        assert!(is_loopback("127.1.2.3") && is_loopback("::1") && is_loopback("localhost"));
        assert!(!is_loopback("evil.example") && !is_loopback("10.0.0.1"));
    }

    #[test]
    fn allowed_host_entries_are_checked() {
        for ok in [
            "*",
            "example.com",
            "api.example.com:8443",
            "10.0.0.5",
            "[fd00::1]",
        ] {
            assert!(check_allowed_host(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "https://example.com",
            "example.com/v1",
            "a b",
            "exa$mple",
        ] {
            assert!(check_allowed_host(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn json_media_types() {
        for ok in [
            "application/json",
            "application/json; charset=utf-8",
            "Application/JSON",
            "application/vnd.api+json",
        ] {
            assert!(is_json(ok), "{ok}");
        }
        for bad in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "application/jsonx",
            "",
        ] {
            assert!(!is_json(bad), "{bad}");
        }
    }
}
