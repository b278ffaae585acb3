//! `POST /v1/embeddings` (every input shape, float and base64, the same
//! vector alone and in a batch, usage, every refusal) and the chat side of
//! `/tokenize` (`add_generation_prompt`, `chat_template_kwargs`).

use base64::Engine as _;
use serde_json::{Value, json};

use crate::{App, MODEL, app, app_with, fake};

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|x| x.as_f64().expect("a number") as f32)
        .collect()
}

async fn embed(app: &App, body: Value) -> Value {
    let r = app.post_json("/v1/embeddings", &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

fn hidden(app: &App) -> usize {
    (app.state.models.loaded(None))
        .expect("the default model is loaded")
        .replicas
        .hidden_size()
}

#[tokio::test]
async fn one_text_as_floats_and_as_base64() {
    let app = app();
    let v = embed(&app, json!({"model": MODEL, "input": "hello"})).await;
    assert_eq!(v["object"], "list");
    assert_eq!(v["model"], MODEL);
    assert_eq!(v["data"].as_array().map(Vec::len), Some(1));
    let d = &v["data"][0];
    assert_eq!(
        (d["object"].as_str(), d["index"].as_u64()),
        (Some("embedding"), Some(0))
    );
    let x = floats(&d["embedding"]);
    assert_eq!(x.len(), hidden(&app));
    let norm = x.iter().map(|a| a * a).sum::<f32>().sqrt();
    assert!((norm - 1.0).abs() < 1e-4, "norm {norm}");
    // BOS + five bytes
    assert_eq!(v["usage"], json!({"prompt_tokens": 6, "total_tokens": 6}));
    let b = embed(&app, json!({"input": "hello", "encoding_format": "base64"})).await;
    let text = b["data"][0]["embedding"].as_str().expect("a base64 string");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .expect("base64");
    let y: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(x, y);
    // `dimensions` equal to the hidden size is accepted
    let d = hidden(&app);
    embed(&app, json!({"input": "hello", "dimensions": d})).await;
    app.wait_idle().await;
}

#[tokio::test]
async fn every_input_shape_and_the_same_vector_alone_or_batched() {
    let app = app();
    let many = embed(&app, json!({"input": ["abc", "hello world", "abc"]})).await;
    let data = many["data"].as_array().expect("data");
    assert_eq!(data.len(), 3);
    for (i, d) in data.iter().enumerate() {
        assert_eq!(d["index"], i);
    }
    let alone = embed(&app, json!({"input": "abc"})).await;
    assert_eq!(alone["data"][0]["embedding"], data[0]["embedding"]);
    assert_eq!(data[2]["embedding"], data[0]["embedding"]);
    assert_ne!(data[1]["embedding"], data[0]["embedding"]);
    assert_eq!(many["usage"]["prompt_tokens"], 4 + 12 + 4);
    // token ids: one list, or a list of lists (no BOS added)
    let ids = embed(&app, json!({"input": [1, 97, 98, 99]})).await;
    assert_eq!(ids["data"][0]["embedding"], data[0]["embedding"]);
    let lists = embed(&app, json!({"input": [[1, 97, 98, 99], [104, 105]]})).await;
    assert_eq!(lists["data"][0]["embedding"], data[0]["embedding"]);
    assert_eq!(lists["usage"]["prompt_tokens"], 6);
    app.wait_idle().await;
}

#[tokio::test]
async fn mean_pooling_is_the_servers_setting() {
    let last = app();
    let mean = app_with(fake::Setup::default(), |c| {
        c.pooling = engine::Pooling::Mean
    });
    let a = embed(&last, json!({"input": "hello"})).await;
    let b = embed(&mean, json!({"input": "hello"})).await;
    assert_ne!(a["data"][0]["embedding"], b["data"][0]["embedding"]);
    let y = floats(&b["data"][0]["embedding"]);
    let norm = y.iter().map(|v| v * v).sum::<f32>().sqrt();
    assert!((norm - 1.0).abs() < 1e-4, "norm {norm}");
}

#[tokio::test]
async fn bad_input_is_refused_naming_the_field() {
    let app = app();
    let h = hidden(&app);
    let post = |body: Value| {
        let app = &app;
        async move { app.post_json("/v1/embeddings", &body).await }
    };
    let e = post(json!({"input": "hi", "dimensions": h + 1}))
        .await
        .assert_error(400, Some("dimensions"));
    let msg = e["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains(&h.to_string()), "{msg}");
    post(json!({"input": "hi", "encoding_format": "int8"}))
        .await
        .assert_error(400, Some("encoding_format"));
    post(json!({"input": ""}))
        .await
        .assert_error(400, Some("input"));
    post(json!({"input": ["a", ""]}))
        .await
        .assert_error(400, Some("input[1]"));
    post(json!({"input": []}))
        .await
        .assert_error(400, Some("input"));
    post(json!({"input": [[1], []]}))
        .await
        .assert_error(400, Some("input[1]"));
    post(json!({"input": [[1], [999999]]}))
        .await
        .assert_error(400, Some("input[1]"));
    let limit = (app.state.models.loaded(None))
        .expect("the default model is loaded")
        .replicas
        .max_sequence();
    let e = post(json!({"input": vec![97; limit + 1]}))
        .await
        .assert_error(400, Some("input"));
    assert_eq!(e["error"]["code"], "context_length_exceeded");
    let msg = e["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains(&limit.to_string()), "{msg}");
    // as long as the limit is fine
    embed(&app, json!({"input": vec![97; limit]})).await;
    post(json!({"input": "hi", "model": "gpt-7"}))
        .await
        .assert_error(404, Some("model"));
    post(json!({"input": "hi", "pooling": "mean"}))
        .await
        .assert_error(400, Some("pooling"));
    post(json!({"model": MODEL}))
        .await
        .assert_error(400, Some("input"));
    app.wait_idle().await;
}

#[tokio::test]
async fn a_failed_pass_is_a_server_error_for_that_request_only() {
    let app = app_with(
        fake::Setup {
            fail_on: Some(u32::from(b'!')),
            ..fake::Setup::default()
        },
        |_| {},
    );
    let r = app
        .post_json("/v1/embeddings", &json!({"input": "oops!"}))
        .await;
    assert_eq!(r.status, 500, "{}", r.text());
    embed(&app, json!({"input": "fine"})).await;
    app.wait_idle().await;
}

#[tokio::test]
async fn tokenize_renders_chat_like_a_chat_request() {
    let app = app();
    let msgs = json!([{"role": "user", "content": "hi"}]);
    let count = |v: Value| v["count"].as_u64().expect("count");
    let with = app
        .post_json("/tokenize", &json!({"messages": msgs}))
        .await
        .json();
    let without = app
        .post_json(
            "/tokenize",
            &json!({"messages": msgs, "add_generation_prompt": false}),
        )
        .await
        .json();
    assert!(
        count(with.clone()) > count(without.clone()),
        "{with} {without}"
    );
    assert_eq!(with["max_model_len"], without["max_model_len"]);
    let kw = app
        .post_json(
            "/tokenize",
            &json!({"messages": msgs, "chat_template_kwargs": {"flag": true}}),
        )
        .await;
    assert_eq!(kw.status, 200, "{}", kw.text());
    app.post_json(
        "/tokenize",
        &json!({"messages": msgs, "chat_template_kwargs": {"x": [1]}}),
    )
    .await
    .assert_error(400, Some("chat_template_kwargs.x"));
}
