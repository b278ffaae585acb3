//! The chat page at `/` for a browser: one self-contained HTML file
//! (`page/chat.html`, inline CSS and JavaScript, no build step) compiled
//! into the binary. It streams `POST /v1/chat/completions`, shows the
//! served model (from `/` as JSON), takes a system message, temperature,
//! top-p and max tokens (1024 unless changed, so a reply that never ends
//! stops there; emptied, the server's default cap applies), and stops a reply with an `AbortController`.
//! `/#message=TEXT` sends TEXT once the page has loaded.

use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};

/// The page's source.
pub const CHAT_HTML: &str = include_str!("page/chat.html");

/// Whether the client asks for HTML (a browser navigating to `/`); API
/// clients (`*/*`, `application/json`, no `Accept`) get the JSON index.
pub fn wants_html(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.split(',').any(|t| t.trim().starts_with("text/html")))
}

/// The chat page response.
pub fn chat() -> Response {
    (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/html; charset=utf-8"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        CHAT_HTML,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn browsers_get_the_page_and_api_clients_the_index() {
        let with = |accept: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::ACCEPT, HeaderValue::from_str(accept).unwrap());
            wants_html(&h)
        };
        assert!(with("text/html,application/xhtml+xml,*/*;q=0.8"));
        assert!(!with("*/*"));
        assert!(!with("application/json"));
        assert!(!wants_html(&HeaderMap::new()));
    }

    /// The page sends a bounded `max_tokens` unless the user changes it.
    #[test]
    fn the_page_sends_a_default_max_tokens() {
        let input = CHAT_HTML
            .lines()
            .find(|l| l.contains(r#"id="max_tokens""#))
            .expect("a max tokens field");
        let value: usize = input
            .split(r#"value=""#)
            .nth(1)
            .and_then(|v| v.split('"').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no default value: {input}"));
        assert!(
            value >= 1 && value <= crate::params::DEFAULT_MAX_TOKENS,
            "{value}"
        );
        assert!(CHAT_HTML.contains(r#"for (const k of ["temperature", "top_p", "max_tokens"])"#));
    }
}
