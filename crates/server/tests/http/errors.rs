//! Every malformed request gets OpenAI's error shape and the right status,
//! and the server keeps serving afterwards.

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{Value, json};

use crate::fake::Setup;
use crate::{MODEL, app, app_with, post};

fn chat(extra: Value) -> Value {
    let mut v =
        json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    v
}

#[tokio::test]
async fn bad_inputs_are_400_naming_the_parameter() {
    let app = app();
    let cases: Vec<(Value, Option<&str>)> = vec![
        (json!({"temperature": -1}), Some("temperature")),
        (json!({"temperature": "hot"}), Some("temperature")),
        (json!({"temperature": 1e8}), Some("temperature")),
        (json!({"top_p": 0}), Some("top_p")),
        (json!({"top_p": 1.5}), Some("top_p")),
        (json!({"top_k": -5}), Some("top_k")),
        (json!({"min_p": 1.5}), Some("min_p")),
        (json!({"max_tokens": 0}), Some("max_tokens")),
        (json!({"max_tokens": -3}), Some("max_tokens")),
        (
            json!({"max_completion_tokens": 0}),
            Some("max_completion_tokens"),
        ),
        (json!({"max_tokens": "many"}), Some("max_tokens")),
        (json!({"n": 0}), Some("n")),
        (json!({"n": 129}), Some("n")),
        (json!({"presence_penalty": 2.5}), Some("presence_penalty")),
        (json!({"frequency_penalty": -3}), Some("frequency_penalty")),
        (json!({"logit_bias": {"x": 1}}), Some("logit_bias")),
        (json!({"logit_bias": {"5": 101}}), Some("logit_bias")),
        (json!({"logit_bias": {"999999": 1}}), Some("logit_bias")),
        (json!({"stop_token_ids": [999999]}), Some("stop_token_ids")),
        (json!({"best_of": 2}), Some("best_of")),
        (json!({"stop": ["a", "b", "c", "d", "e"]}), Some("stop")),
        (json!({"stop": 7}), Some("stop")),
        (json!({"top_logprobs": 3}), Some("top_logprobs")),
        (
            json!({"logprobs": true, "top_logprobs": 21}),
            Some("top_logprobs"),
        ),
        (
            json!({"stream_options": {"include_usage": true}}),
            Some("stream_options"),
        ),
        (json!({"messages": []}), Some("messages")),
        (json!({"messages": "hi"}), Some("messages")),
        (
            json!({"messages": [{"role": "wizard", "content": "x"}]}),
            Some("messages[0].role"),
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
            Some("messages[0].content[0]"),
        ),
        (json!({"max_tokens": 600}), Some("max_tokens")),
    ];
    for (extra, param) in cases {
        let r = app
            .post_json("/v1/chat/completions", &chat(extra.clone()))
            .await;
        let v = r.assert_error(400, param);
        assert_eq!(v["error"]["type"], "invalid_request_error", "{extra}");
    }
    let comp: Vec<(Value, Option<&str>)> = vec![
        (json!({"prompt": "a", "logprobs": -1}), Some("logprobs")),
        (json!({"prompt": "a", "logprobs": 99}), Some("logprobs")),
        (json!({"prompt": ["a", "b"]}), Some("prompt")),
        (json!({"prompt": [1, 99999]}), Some("prompt")),
        (
            json!({"prompt": "a", "echo": true, "logprobs": 1}),
            Some("echo"),
        ),
        (
            json!({"prompt": "a", "n": 3, "best_of": 2}),
            Some("best_of"),
        ),
        (
            json!({"prompt": "a", "best_of": 2, "stream": true}),
            Some("best_of"),
        ),
        (json!({"prompt": "a".repeat(600)}), Some("prompt")),
        (
            json!({"prompt": "a".repeat(500), "max_tokens": 20}),
            Some("max_tokens"),
        ),
        (json!({"prompt": 5}), Some("prompt")),
    ];
    for (body, param) in comp {
        let r = app.post_json("/v1/completions", &body).await;
        r.assert_error(400, param);
    }
    // the context errors say so
    let r = app
        .post_json(
            "/v1/completions",
            &json!({"prompt": "a".repeat(500), "max_tokens": 20}),
        )
        .await;
    assert_eq!(r.json()["error"]["code"], "context_length_exceeded");
    // still serving
    let r = app
        .post_json("/v1/chat/completions", &chat(json!({})))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    app.wait_idle().await;
}

#[tokio::test]
async fn malformed_json_is_400() {
    let app = app();
    for body in ["{\"messages\": [", "not json", "", "[1, 2]"] {
        let r = app.post("/v1/chat/completions", body).await;
        r.assert_error(400, None);
    }
    let r = app.post("/v1/completions", "{\"prompt\": ").await;
    let v = r.assert_error(400, None);
    assert_eq!(v["error"]["code"], "invalid_json");
    // one object, then trailing data or a second object: refused, not half-read
    for body in [
        "{\"prompt\": \"a\", \"max_tokens\": 1} xyz",
        "{\"prompt\": \"a\", \"max_tokens\": 1}{\"prompt\": \"b\"}",
    ] {
        let v = app
            .post("/v1/completions", body)
            .await
            .assert_error(400, None);
        assert_eq!(v["error"]["code"], "invalid_json", "{body}");
    }
    // trailing whitespace is fine
    let r = app
        .post(
            "/v1/completions",
            "{\"prompt\": \"a\", \"max_tokens\": 1} \n",
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
}

#[tokio::test]
async fn unknown_model_is_404() {
    let app = app();
    let r = app
        .post_json("/v1/chat/completions", &chat(json!({"model": "gpt-7"})))
        .await;
    let v = r.assert_error(404, Some("model"));
    assert_eq!(v["error"]["code"], "model_not_found");
    assert!(v["error"]["message"].as_str().unwrap().contains("gpt-7"));
    let r = app
        .post_json("/v1/completions", &json!({"model": "x", "prompt": "a"}))
        .await;
    r.assert_error(404, Some("model"));
    let r = app.get("/v2/nothing").await;
    r.assert_error(404, None);
}

#[tokio::test]
async fn api_key_is_required_when_set() {
    let app = app_with(Setup::default(), |c| {
        c.api_keys = vec!["other".into(), "sekrit".into()]
    });
    let body = chat(json!({})).to_string();
    let r = app.post("/v1/chat/completions", body.clone()).await;
    let v = r.assert_error(401, None);
    assert_eq!(v["error"]["code"], "invalid_api_key");
    let with_key = |k: &str| {
        Request::post("/v1/chat/completions")
            .header("authorization", format!("Bearer {k}"))
            .body(Body::from(body.clone()))
            .expect("request")
    };
    app.send(with_key("wrong")).await.assert_error(401, None);
    app.send(with_key("sekri")).await.assert_error(401, None);
    app.send(with_key("sekrit2")).await.assert_error(401, None);
    let r = app.send(with_key("sekrit")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    // every configured key is accepted
    let r = app.send(with_key("other")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    // the scheme is required (a bare key, or another scheme, is refused) and
    // matched case-insensitively
    let with_header = |h: &str| {
        Request::post("/v1/chat/completions")
            .header("authorization", h)
            .body(Body::from(body.clone()))
            .expect("request")
    };
    for bad in [
        "sekrit",
        "Basic sekrit",
        "Bearersekrit",
        "Bearer",
        "Bearer  sekrit2",
    ] {
        let v = app.send(with_header(bad)).await.assert_error(401, None);
        assert_eq!(v["error"]["code"], "invalid_api_key", "{bad}");
    }
    for good in ["bearer sekrit", "BEARER sekrit", "Bearer  sekrit"] {
        let r = app.send(with_header(good)).await;
        assert_eq!(r.status, 200, "{good}: {}", r.text());
    }
    app.get("/v1/models").await.assert_error(401, None);
    // health, metrics and the index stay open for probes and scrapers
    assert_eq!(app.get("/health").await.status, 200);
    assert_eq!(app.get("/metrics").await.status, 200);
    assert_eq!(app.get("/").await.status, 200);
}

#[test]
fn api_keys_no_header_can_carry_are_refused() {
    for bad in [
        "",
        " sekrit",
        "sekrit ",
        "sek\u{e9}rit",
        "sek\trit",
        "sek\nrit",
    ] {
        let e = server::check_api_key(bad).expect_err(bad);
        assert!(!e.is_empty());
    }
    assert!(server::check_api_key("sk-abc DEF_123~!").is_ok());
}

#[tokio::test]
async fn oversized_body_is_413() {
    let app = app_with(Setup::default(), |c| c.body_limit = 1024);
    let big = json!({"prompt": "a".repeat(2000)}).to_string();
    let r = app.post("/v1/completions", big).await;
    let v = r.assert_error(413, None);
    assert!(v["error"]["message"].as_str().unwrap().contains("1024"));
    // also without a content-length (chunked body)
    let chunks: Vec<Result<String, std::io::Error>> =
        (0..20).map(|_| Ok("a".repeat(100))).collect();
    let req = post(
        "/v1/completions",
        Body::from_stream(futures::stream::iter(chunks)),
    );
    app.send(req).await.assert_error(413, None);
    let r = app
        .post_json("/v1/completions", &json!({"prompt": "a", "max_tokens": 1}))
        .await;
    assert_eq!(r.status, 200);
}

#[tokio::test]
async fn full_queue_is_429_with_retry_after() {
    let app = app_with(
        Setup {
            delay: Duration::from_millis(2),
            max_num_seqs: 1,
            max_queue: 1,
            ..Setup::default()
        },
        |_| {},
    );
    let long = json!({"prompt": "a", "max_tokens": 400, "ignore_eos": true, "stream": true});
    // the first runs (held open by keeping its streaming response alive) ...
    let first = open_stream(&app, &long).await;
    let start = Instant::now();
    while app.state.served().unwrap().replicas.stats().running < 1 {
        assert!(start.elapsed() < Duration::from_secs(5));
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // ... the second waits in the queue of one ...
    let second = open_stream(&app, &long).await;
    // ... and the third is refused
    let r = app
        .post_json("/v1/completions", &json!({"prompt": "a", "max_tokens": 1}))
        .await;
    let v = r.assert_error(429, None);
    assert_eq!(r.headers["retry-after"], "1");
    assert_eq!(v["error"]["code"], "queue_full");
    drop((first, second));
    app.wait_idle().await;
    let r = app
        .post_json("/v1/completions", &json!({"prompt": "a", "max_tokens": 1}))
        .await;
    assert_eq!(r.status, 200);
}

/// Sends a streaming completion and returns its response unread (the
/// request stays alive in the engine until the response is dropped).
async fn open_stream(app: &crate::App, body: &Value) -> axum::response::Response {
    use tower::ServiceExt;
    let req = post("/v1/completions", body.to_string());
    let resp = app.router.clone().oneshot(req).await.expect("infallible");
    assert_eq!(resp.status(), 200);
    resp
}

/// Text longer than the whole context can
/// hold (context x the longest vocabulary piece) is refused before it is
/// tokenized, naming the parameter, for completions, chat and /tokenize.
#[tokio::test]
async fn prompts_longer_than_the_context_can_hold_are_refused_untokenized() {
    let app = app();
    let served = app.state.served().unwrap();
    let ctx = served.max_context();
    let limit = served
        .tokenizer
        .max_text_bytes(ctx)
        .expect("the fake tokenizer has no normalizer");
    let long = "a".repeat(limit + 1);
    let r = app
        .post_json(
            "/v1/completions",
            &json!({"model": MODEL, "prompt": long, "max_tokens": 1}),
        )
        .await;
    let v = r.assert_error(400, Some("prompt"));
    assert!(v.to_string().contains("not tokenized"), "{v}");
    let r = app
        .post_json(
            "/v1/chat/completions",
            &chat(json!({"messages": [{"role": "user", "content": long}]})),
        )
        .await;
    r.assert_error(400, Some("messages"));
    let r = app
        .post_json("/tokenize", &json!({"model": MODEL, "prompt": long}))
        .await;
    r.assert_error(400, Some("prompt"));
    // just under the bound it is tokenized (and then too long for the context)
    let r = app
        .post_json(
            "/tokenize",
            &json!({"model": MODEL, "prompt": "a".repeat(limit)}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    app.wait_idle().await;
}
