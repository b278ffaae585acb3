//! The HTTP API's surface in process: the generated OpenAPI document
//! (every served route, validated by an independent OpenAPI 3.1 parser),
//! `/docs`, `/detokenize`, `/version`, `n` / `best_of` / `echo` shapes and
//! usage, SSE keep-alive comments while a request is queued, and CORS.
//! (Sampling semantics of `n`, penalties and `logit_bias` on a real model
//! are in `crates/cli/tests/server_e2e.rs`, `tests/python/sampling_api.py`.)

use std::collections::BTreeSet;
use std::time::Duration;

use axum::body::Body;
use axum::http::Request;
use serde_json::{Value, json};

use super::*;

/// Every route the router serves: the test fails when one is added without
/// being documented, or documented without being served.
const ROUTES: [(&str, &str); 23] = [
    ("GET", "/"),
    ("GET", "/health"),
    ("GET", "/version"),
    ("GET", "/metrics"),
    ("GET", "/openapi.json"),
    ("GET", "/docs"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/messages"),
    ("POST", "/v1/messages/count_tokens"),
    ("POST", "/v1/responses"),
    ("GET", "/v1/responses/{id}"),
    ("DELETE", "/v1/responses/{id}"),
    ("GET", "/v1/models"),
    ("GET", "/v1/models/{id}"),
    ("POST", "/v1/embeddings"),
    ("POST", "/tokenize"),
    ("POST", "/detokenize"),
    ("POST", "/v1/load_lora_adapter"),
    ("POST", "/v1/unload_lora_adapter"),
    ("GET", "/models"),
    ("POST", "/models/load"),
    ("POST", "/models/unload"),
];

#[tokio::test]
async fn openapi_document_lists_every_route_and_is_valid() {
    let app = app();
    let r = app.get("/openapi.json").await;
    assert_eq!(r.status, 200);
    // an independent OpenAPI 3.1 parser accepts the whole document
    let spec = oas3::from_json(r.text()).unwrap_or_else(|e| panic!("invalid OpenAPI: {e}"));
    assert!(spec.openapi.starts_with("3.1"), "{}", spec.openapi);
    let v = r.json();
    let mut documented = BTreeSet::new();
    for (path, item) in v["paths"].as_object().expect("paths") {
        for method in item.as_object().expect("path item").keys() {
            documented.insert((method.to_uppercase(), path.clone()));
        }
    }
    let served: BTreeSet<(String, String)> = ROUTES
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    assert_eq!(documented, served);
    // each documented route is really served (not the fallback's 404)
    for (method, path) in &served {
        let uri = path.replace("{id}", MODEL);
        let req = Request::builder()
            .method(method.as_str())
            .uri(&uri)
            .header("content-type", "application/json")
            .body(Body::from("{}"))
            .expect("request");
        let r = app.send(req).await;
        assert!(
            !r.text().contains("No route"),
            "{method} {uri}: {}",
            r.text()
        );
    }
    // the routes behind the API key declare it, the open ones do not
    assert_eq!(
        v["components"]["securitySchemes"]["api_key"]["scheme"]
            .as_str()
            .map(str::to_lowercase),
        Some("bearer".to_string())
    );
    for (method, path) in &served {
        let op = &v["paths"][path][method.to_lowercase()];
        let guarded =
            path.starts_with("/v1/") || path.starts_with("/models") || path.ends_with("tokenize");
        assert_eq!(op.get("security").is_some(), guarded, "{method} {path}");
    }
    // request and response bodies are described from their types
    let schemas = v["components"]["schemas"].as_object().expect("schemas");
    for name in [
        "ChatRequest",
        "CompletionRequest",
        "ChatCompletion",
        "TextCompletion",
        "DetokenizeRequest",
        "EmbeddingRequest",
        "EmbeddingList",
        "ModelList",
        "ErrorBody",
    ] {
        assert!(schemas.contains_key(name), "no schema {name}");
    }
    let chat = &schemas["ChatRequest"]["properties"];
    for field in ["n", "logit_bias", "presence_penalty", "stop_token_ids"] {
        assert!(chat.get(field).is_some(), "ChatRequest lacks {field}");
    }
    // `/docs` renders the same document as HTML
    let r = app.get("/docs").await;
    assert_eq!(r.status, 200);
    let ct = r.headers["content-type"].to_str().unwrap_or("").to_string();
    assert!(ct.starts_with("text/html"), "{ct}");
    let html = r.text();
    for (_, path) in ROUTES {
        assert!(html.contains(&format!("<code>{path}</code>")), "{path}");
    }
    // and `GET /` lists the same routes
    let idx = app.get("/").await.json();
    assert_eq!(
        idx["endpoints"].as_array().map(Vec::len),
        Some(ROUTES.len())
    );
    app.wait_idle().await;
}

#[tokio::test]
async fn detokenize_and_version() {
    let app = app();
    let r = app
        .post_json(
            "/detokenize",
            &json!({"model": MODEL, "tokens": [104, 105]}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json(), json!({"prompt": "hi"}));
    // round trip with /tokenize
    let t = app
        .post_json(
            "/tokenize",
            &json!({"prompt": "abc", "add_special_tokens": false}),
        )
        .await
        .json();
    let r = app
        .post_json("/detokenize", &json!({"tokens": t["tokens"]}))
        .await;
    assert_eq!(r.json()["prompt"], "abc");
    app.post_json("/detokenize", &json!({"tokens": [1, 999999]}))
        .await
        .assert_error(400, Some("tokens[1]"));
    app.post_json("/detokenize", &json!({"tokens": [1], "skip": true}))
        .await
        .assert_error(400, Some("skip"));
    app.post_json("/detokenize", &json!({"model": "gpt-7", "tokens": [1]}))
        .await
        .assert_error(404, Some("model"));
    let v = app.get("/version").await.json();
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
    // the API key guards /detokenize like /tokenize
    let keyed = app_with(fake::Setup::default(), |c| c.api_keys = vec!["k".into()]);
    keyed
        .post_json("/detokenize", &json!({"tokens": [104]}))
        .await
        .assert_error(401, None);
    assert_eq!(keyed.get("/version").await.status, 200);
}

fn chat_body(extra: Value) -> Value {
    let mut v = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3});
    for (k, x) in extra.as_object().expect("object") {
        v[k] = x.clone();
    }
    v
}

#[tokio::test]
async fn n_choices_count_the_prompt_once() {
    let app = app();
    let one = app
        .post_json("/v1/chat/completions", &chat_body(json!({})))
        .await
        .json();
    let three = app
        .post_json("/v1/chat/completions", &chat_body(json!({"n": 3})))
        .await;
    assert_eq!(three.status, 200, "{}", three.text());
    let three = three.json();
    let choices = three["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 3);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["message"], one["choices"][0]["message"]);
    }
    let (u1, u3) = (&one["usage"], &three["usage"]);
    assert_eq!(u3["prompt_tokens"], u1["prompt_tokens"]);
    assert_eq!(
        u3["completion_tokens"].as_u64(),
        u1["completion_tokens"].as_u64().map(|c| 3 * c)
    );
    // streamed: chunks of every index, one finish each, one usage at the end
    let r = app
        .post_json(
            "/v1/chat/completions",
            &chat_body(json!({"n": 2, "stream": true, "stream_options": {"include_usage": true}})),
        )
        .await;
    let chunks = sse_chunks(&r.text());
    let mut text = [String::new(), String::new()];
    let mut finished = [0, 0];
    for c in &chunks {
        for ch in c["choices"].as_array().expect("choices") {
            let i = ch["index"].as_u64().expect("index") as usize;
            text[i].push_str(ch["delta"]["content"].as_str().unwrap_or(""));
            finished[i] += usize::from(!ch["finish_reason"].is_null());
        }
    }
    let want = one["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or("");
    assert_eq!(text, [want.to_string(), want.to_string()]);
    assert_eq!(finished, [1, 1]);
    let last = chunks.last().expect("a usage chunk");
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"]["prompt_tokens"], u1["prompt_tokens"]);
    assert_eq!(
        last["usage"]["completion_tokens"].as_u64(),
        u1["completion_tokens"].as_u64().map(|c| 2 * c)
    );
    app.wait_idle().await;
}

#[tokio::test]
async fn best_of_and_echo_on_completions() {
    let app = app();
    let r = app
        .post_json(
            "/v1/completions",
            &json!({"prompt": "xy?", "max_tokens": 4, "best_of": 3, "n": 2}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["choices"].as_array().map(Vec::len), Some(2));
    assert_eq!(v["choices"][1]["index"], 1);
    // every generated choice is billed, the prompt once
    assert_eq!(v["usage"]["completion_tokens"], 12);
    // echo: the prompt text first, whole and streamed
    let r = app
        .post_json(
            "/v1/completions",
            &json!({"prompt": "xy?", "max_tokens": 3, "echo": true}),
        )
        .await;
    assert_eq!(r.json()["choices"][0]["text"], "xy?abc");
    let r = app
        .post_json(
            "/v1/completions",
            &json!({"prompt": "xy?", "max_tokens": 3, "echo": true, "stream": true}),
        )
        .await;
    let text: String = sse_chunks(&r.text())
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(text, "xy?abc");
    // a token-id prompt is echoed as its text
    let r = app
        .post_json(
            "/v1/completions",
            &json!({"prompt": [120, 121, 63], "max_tokens": 1, "echo": true}),
        )
        .await;
    assert_eq!(r.json()["choices"][0]["text"], "xy?a");
    app.wait_idle().await;
}

#[tokio::test]
async fn stop_token_ids_end_generation() {
    let app = app();
    // the letters continue a, b, c, ...: stop on `d` (id 100)
    let r = app
        .post_json(
            "/v1/completions",
            &json!({"prompt": "?", "max_tokens": 10, "stop_token_ids": [100]}),
        )
        .await;
    let v = r.json();
    assert_eq!(v["choices"][0]["text"], "abc");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    app.wait_idle().await;
}

#[tokio::test]
async fn queued_streams_get_keep_alive_comments() {
    let app = app_with(
        fake::Setup {
            delay: Duration::from_millis(20),
            max_num_seqs: 1,
            ..Default::default()
        },
        |c| c.sse_keep_alive = Duration::from_millis(10),
    );
    // one long request holds the only sequence slot...
    let long = json!({"prompt": "?", "max_tokens": 30, "ignore_eos": true});
    let busy = app.post_json("/v1/completions", &long);
    // ...so this stream, sent a little later, waits in the queue, kept
    // alive by comments
    let short = json!({"prompt": "?", "max_tokens": 2, "stream": true});
    let queued = async {
        tokio::time::sleep(Duration::from_millis(60)).await;
        app.post_json("/v1/completions", &short).await
    };
    let (b, q) = tokio::join!(busy, queued);
    assert_eq!(b.status, 200);
    let body = q.text();
    let first_data = body.find("data:").expect("data events");
    assert!(
        body[..first_data].contains(": keep-alive"),
        "no keep-alive before the first event: {body}"
    );
    let text: String = sse_chunks(&body)
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(text, "ab");
    app.wait_idle().await;
}

#[tokio::test]
async fn cors_only_for_allowed_origins() {
    let preflight = |origin: &str| {
        Request::builder()
            .method("OPTIONS")
            .uri("/v1/completions")
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "authorization,content-type",
            )
            .body(Body::empty())
            .expect("request")
    };
    let allow = |r: &Reply| {
        r.headers
            .get("access-control-allow-origin")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    // none by default
    let app = app();
    assert_eq!(allow(&app.send(preflight("https://a.example")).await), None);
    let app = app_with(fake::Setup::default(), |c| {
        c.allowed_origins = vec!["https://a.example".into()]
    });
    let r = app.send(preflight("https://a.example")).await;
    assert_eq!(allow(&r).as_deref(), Some("https://a.example"));
    assert_eq!(
        allow(&app.send(preflight("https://evil.example")).await),
        None
    );
    let req = Request::get("/v1/models")
        .header("origin", "https://a.example")
        .body(Body::empty())
        .expect("request");
    let r = app.send(req).await;
    assert_eq!(r.status, 200);
    assert_eq!(allow(&r).as_deref(), Some("https://a.example"));
    let any = app_with(fake::Setup::default(), |c| {
        c.allowed_origins = vec!["*".into()]
    });
    assert_eq!(
        allow(&any.send(preflight("https://b.example")).await).as_deref(),
        Some("*")
    );
    // the origins are checked at start-up
    assert!(server::check_origin("https://a.example:8443").is_ok());
    for bad in ["a.example", "https://a.example/path", "ftp://a", "https://"] {
        assert!(server::check_origin(bad).is_err(), "{bad}");
    }
}
