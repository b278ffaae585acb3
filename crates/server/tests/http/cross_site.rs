//! What a web page may make a browser send: bodies that are not JSON get
//! 415, Hosts that are not loopback, bound or allowed get 403 (DNS
//! rebinding), and without an API key a foreign `Origin` may not change
//! state (403); the server's own page, probes and API clients keep working.

use axum::body::Body;
use axum::http::Request;
use serde_json::{Value, json};

use crate::{App, MODEL, app, app_with, fake};

fn chat() -> String {
    json!({"model": MODEL, "max_tokens": 2,
        "messages": [{"role": "user", "content": "hi"}]})
    .to_string()
}

/// Sends `method path` with `headers` and `body`; the status and JSON body.
async fn send(
    app: &App,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, Value) {
    let mut req = Request::builder().method(method).uri(path);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let r = app
        .send(req.body(Body::from(body.to_string())).expect("request"))
        .await;
    let v = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
    (r.status.as_u16(), v)
}

fn message(v: &Value) -> &str {
    v["error"]["message"].as_str().unwrap_or("")
}

#[tokio::test]
async fn bodies_that_are_not_json_get_415_naming_the_fix() {
    let app = app();
    for ct in [
        "text/plain",
        "text/plain;charset=UTF-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
    ] {
        for path in [
            "/v1/chat/completions",
            "/v1/load_lora_adapter",
            "/v1/unload_lora_adapter",
            "/v1/messages",
            "/tokenize",
        ] {
            let (status, v) = send(&app, "POST", path, &[("content-type", ct)], &chat()).await;
            assert_eq!(status, 415, "{path} with {ct}: {v}");
            let m = message(&v);
            assert!(
                m.contains(ct) && m.contains("-H 'Content-Type: application/json'"),
                "{m}"
            );
        }
    }
    // JSON with parameters, `+json`, and no type at all (read as JSON)
    for ct in [
        Some("application/json"),
        Some("application/json; charset=utf-8"),
        Some("application/vnd.lamina+json"),
        None,
    ] {
        let headers: Vec<(&str, &str)> = ct.map(|c| ("content-type", c)).into_iter().collect();
        let (status, v) = send(&app, "POST", "/v1/chat/completions", &headers, &chat()).await;
        assert_eq!(status, 200, "{ct:?}: {v}");
    }
    app.wait_idle().await;
}

const JSON: (&str, &str) = ("content-type", "application/json");

#[tokio::test]
async fn foreign_hosts_are_refused_and_loopback_is_served() {
    let app = app();
    for host in [
        "localhost",
        "localhost:8000",
        "LOCALHOST:1",
        "127.0.0.1",
        "127.0.0.1:8000",
        "127.9.9.9:80",
        "[::1]:8000",
        "[::1]",
    ] {
        let (status, v) = send(&app, "GET", "/v1/models", &[("host", host)], "").await;
        assert_eq!(status, 200, "{host}: {v}");
        let (status, v) = send(
            &app,
            "POST",
            "/v1/chat/completions",
            &[("host", host), JSON],
            &chat(),
        )
        .await;
        assert_eq!(status, 200, "{host}: {v}");
    }
    for host in [
        "evil.example",
        "evil.example:8000",
        "10.0.0.7:8000",
        "127.0.0.1.evil.example",
    ] {
        for (method, path, body) in [
            ("GET", "/v1/models", String::new()),
            ("GET", "/", String::new()),
            ("POST", "/v1/chat/completions", chat()),
        ] {
            let (status, v) = send(&app, method, path, &[("host", host), JSON], &body).await;
            assert_eq!(status, 403, "{host} {path}: {v}");
            let m = message(&v);
            assert!(m.contains(host) && m.contains("--allowed-hosts"), "{m}");
        }
        // Kubernetes probes send the pod's IP as Host
        for path in ["/health", "/metrics"] {
            let (status, v) = send(&app, "GET", path, &[("host", host)], "").await;
            assert_eq!(status, 200, "{host} {path}: {v}");
        }
    }
    // Anthropic's route refuses in Anthropic's shape
    let (status, v) = send(
        &app,
        "POST",
        "/v1/messages",
        &[("host", "evil.example"), JSON],
        "{}",
    )
    .await;
    assert_eq!((status, v["type"].as_str()), (403, Some("error")), "{v}");
    app.wait_idle().await;
}

#[tokio::test]
async fn allowed_bound_and_keyed_hosts_are_served() {
    let listed = app_with(fake::Setup::default(), |c| {
        c.allowed_hosts = vec!["api.example".into(), "10.1.1.1".into()]
    });
    for host in ["api.example", "API.example:443", "10.1.1.1:8000"] {
        let (status, v) = send(&listed, "GET", "/v1/models", &[("host", host)], "").await;
        assert_eq!(status, 200, "{host}: {v}");
    }
    let (status, _) = send(
        &listed,
        "GET",
        "/v1/models",
        &[("host", "other.example")],
        "",
    )
    .await;
    assert_eq!(status, 403);
    // the address the server is bound to
    let bound = app();
    let _ = bound.state.bind.set("10.9.8.7".parse().expect("ip"));
    let (status, v) = send(
        &bound,
        "GET",
        "/v1/models",
        &[("host", "10.9.8.7:8000")],
        "",
    )
    .await;
    assert_eq!(status, 200, "{v}");
    // `*`: any Host; API keys without `--allowed-hosts`: any Host
    let any = app_with(fake::Setup::default(), |c| {
        c.allowed_hosts = vec!["*".into()]
    });
    let (status, _) = send(&any, "GET", "/v1/models", &[("host", "x.example")], "").await;
    assert_eq!(status, 200);
    let keyed = app_with(fake::Setup::default(), |c| c.api_keys = vec!["k".into()]);
    let auth = ("authorization", "Bearer k");
    let (status, _) = send(
        &keyed,
        "GET",
        "/v1/models",
        &[("host", "x.example"), auth],
        "",
    )
    .await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn without_a_key_foreign_origins_cannot_change_state() {
    let app = app_with(fake::Setup::default(), |c| {
        c.allowed_hosts = vec!["box.lan".into()];
        c.allowed_origins = vec!["https://app.example".into()];
    });
    for origin in [
        "https://evil.example",
        "http://evil.example:8000",
        "null",
        "file://",
    ] {
        for path in [
            "/v1/chat/completions",
            "/v1/load_lora_adapter",
            "/v1/messages",
        ] {
            let (status, v) = send(&app, "POST", path, &[("origin", origin), JSON], &chat()).await;
            assert_eq!(status, 403, "{origin} {path}: {v}");
            assert!(message(&v).contains(origin), "{v}");
        }
        let (status, _) = send(
            &app,
            "DELETE",
            "/v1/responses/resp_1",
            &[("origin", origin)],
            "",
        )
        .await;
        assert_eq!(status, 403, "{origin} DELETE");
        // reading is not changing state (CORS keeps the answer from the page)
        let (status, _) = send(&app, "GET", "/v1/models", &[("origin", origin)], "").await;
        assert_eq!(status, 200, "{origin} GET");
    }
    // the server's own page (same origin), loopback, allowed hosts and origins
    for (host, origin) in [
        ("box.lan:8000", "http://box.lan:8000"),
        ("localhost:8000", "http://localhost:8000"),
        ("127.0.0.1:8000", "http://127.0.0.1:8000"),
        ("localhost:8000", "http://localhost:3000"),
        ("localhost:8000", "https://box.lan"),
        ("localhost:8000", "https://app.example"),
    ] {
        let headers = [("host", host), ("origin", origin), JSON];
        let (status, v) = send(&app, "POST", "/v1/chat/completions", &headers, &chat()).await;
        assert_eq!(status, 200, "{host} {origin}: {v}");
    }
    // with an API key the key is the check
    let keyed = app_with(fake::Setup::default(), |c| c.api_keys = vec!["k".into()]);
    let headers = [
        ("origin", "https://evil.example"),
        ("authorization", "Bearer k"),
        JSON,
    ];
    let (status, v) = send(&keyed, "POST", "/v1/chat/completions", &headers, &chat()).await;
    assert_eq!(status, 200, "{v}");
    app.wait_idle().await;
    keyed.wait_idle().await;
}

#[tokio::test]
async fn the_chat_page_carries_a_content_security_policy() {
    let app = app();
    let req = Request::get("/")
        .header("accept", "text/html")
        .body(Body::empty())
        .expect("request");
    let r = app.send(req).await;
    assert_eq!(r.status, 200);
    let h = |k: &str| r.headers.get(k).and_then(|v| v.to_str().ok()).unwrap_or("");
    let csp = h("content-security-policy");
    assert!(
        csp.contains("frame-ancestors 'none'")
            && csp.contains("default-src 'none'")
            && csp.contains("script-src 'sha256-"),
        "{csp}"
    );
    assert_eq!(h("x-content-type-options"), "nosniff");
    let page = r.text();
    // the key stays in the tab's session unless the user opts in, and a
    // `#message=` link does not send under it
    assert!(page.contains("sessionStorage") && page.contains("remember_key"));
    assert!(page.contains("press Send to send it"));
}
