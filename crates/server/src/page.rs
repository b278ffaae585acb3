//! The chat page at `/` for a browser: one self-contained HTML file
//! (`page/chat.html`, inline CSS and JavaScript, no build step) compiled
//! into the binary. It streams `POST /v1/chat/completions`, shows the
//! served model (from `/` as JSON), takes a system message, temperature,
//! top-p and max tokens (1024 unless changed, so a reply that never ends
//! stops there; emptied, the server's default cap applies), and stops a
//! reply with an `AbortController`.
//! `/#message=TEXT` sends TEXT once the page has loaded, unless an API key
//! is entered (then it only fills the message box: a link never sends
//! under the user's key). The key is kept for the tab's session, on the
//! device only when the user ticks "Remember".
//!
//! The page is served with a `Content-Security-Policy` that runs only its
//! own inline script and style (by their SHA-256), connects only to this
//! server and may not be framed, plus `nosniff` and `no-referrer`.

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

/// The text between `open` and `close` in the page (its script or style).
fn inline(open: &str, close: &str) -> &'static str {
    CHAT_HTML
        .split_once(open)
        .and_then(|(_, rest)| rest.split_once(close))
        .map_or("", |(inner, _)| inner)
}

fn sha256_source(text: &str) -> String {
    use base64::Engine;
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(text.as_bytes());
    format!(
        "'sha256-{}'",
        base64::engine::general_purpose::STANDARD.encode(digest)
    )
}

/// The page's `Content-Security-Policy`.
pub fn policy() -> &'static str {
    static POLICY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    POLICY.get_or_init(|| {
        format!(
            "default-src 'none'; script-src {}; style-src {}; connect-src 'self'; \
             img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
            sha256_source(inline("<script>", "</script>")),
            sha256_source(inline("<style>", "</style>")),
        )
    })
}

/// The chat page response.
pub fn chat() -> Response {
    let csp = HeaderValue::from_str(policy())
        .unwrap_or_else(|_| HeaderValue::from_static("default-src 'none'"));
    (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/html; charset=utf-8"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
            (header::CONTENT_SECURITY_POLICY, csp),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
            (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
            (
                header::REFERRER_POLICY,
                HeaderValue::from_static("no-referrer"),
            ),
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
            (1..=crate::params::DEFAULT_MAX_TOKENS).contains(&value),
            "{value}"
        );
        assert!(CHAT_HTML.contains(r#"for (const k of ["temperature", "top_p", "max_tokens"])"#));
    }

    #[test]
    fn a_source_is_the_base64_of_its_sha256() {
        assert_eq!(
            sha256_source(""),
            "'sha256-47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU='"
        );
    }

    #[test]
    fn the_policy_allows_exactly_the_pages_own_script_and_style() {
        let p = policy();
        assert!(p.contains("frame-ancestors 'none'") && p.contains("default-src 'none'"));
        assert!(!p.contains("unsafe-inline"), "{p}");
        let script = inline("<script>", "</script>");
        assert!(
            script.contains("\"use strict\""),
            "the script was not found"
        );
        assert!(
            p.contains(&sha256_source(script))
                && p.contains(&sha256_source(inline("<style>", "</style>")))
        );
        // one script and one style element, so the hashes cover the page
        assert_eq!(CHAT_HTML.matches("<script").count(), 1);
        assert_eq!(CHAT_HTML.matches("<style").count(), 1);
        assert!(!CHAT_HTML.contains(" style=") && !CHAT_HTML.contains(" onclick="));
    }
}
