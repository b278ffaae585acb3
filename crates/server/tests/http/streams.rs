//! SSE streaming: chunk shapes, `[DONE]`, usage, logprobs, and cancellation
//! when the client goes away mid-stream.

use std::time::Duration;

use axum::body::Body;
use http_body_util::BodyExt;
use serde_json::json;
use tower::ServiceExt;

use crate::fake::Setup;
use crate::{LETTERS, MODEL, app, app_with, post, sse_chunks};

#[tokio::test]
async fn chat_stream_format() {
    let app = app();
    let r = app
        .post_json(
            "/v1/chat/completions",
            &json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": true}),
        )
        .await;
    assert_eq!(r.status, 200);
    assert!(
        r.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let chunks = sse_chunks(&r.text());
    let first = &chunks[0];
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    let id = first["id"].as_str().unwrap();
    assert!(id.starts_with("chatcmpl-"));
    let mut text = String::new();
    for c in &chunks[1..chunks.len() - 1] {
        assert_eq!(c["id"], id);
        assert_eq!(c["model"], MODEL);
        assert!(c["choices"][0]["finish_reason"].is_null());
        text.push_str(c["choices"][0]["delta"]["content"].as_str().unwrap());
        assert!(c.get("usage").is_none());
    }
    assert_eq!(text, LETTERS);
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "stop");
    assert_eq!(last["choices"][0]["delta"], json!({}));
    app.wait_idle().await;
}

#[tokio::test]
async fn stream_usage_chunk_comes_last() {
    let app = app();
    let r = app
        .post_json(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": true,
                    "stream_options": {"include_usage": true}}),
        )
        .await;
    let chunks = sse_chunks(&r.text());
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 4);
    assert!(usage["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
    let fin = &chunks[chunks.len() - 2];
    assert_eq!(fin["choices"][0]["finish_reason"], "length");
    // every other chunk carries `usage: null`, as OpenAI's do
    assert!(
        chunks[..chunks.len() - 1]
            .iter()
            .all(|c| c["usage"].is_null() && c.get("usage").is_some())
    );
}

#[tokio::test]
async fn completion_stream_with_stop_and_logprobs() {
    let app = app();
    let r = app
        .post_json(
            "/v1/completions",
            &json!({"prompt": "a", "stream": true, "stop": ["ef"], "logprobs": 1}),
        )
        .await;
    let chunks = sse_chunks(&r.text());
    let mut text = String::new();
    let mut offsets = Vec::new();
    for c in &chunks[..chunks.len() - 1] {
        assert_eq!(c["object"], "text_completion");
        text.push_str(c["choices"][0]["text"].as_str().unwrap());
        let lp = &c["choices"][0]["logprobs"];
        assert_eq!(
            lp["token_logprobs"].as_array().unwrap().len(),
            1,
            "{chunks:?}"
        );
        offsets.push(lp["text_offset"][0].as_u64().unwrap());
    }
    // "e" is held back as a possible start of "ef", then dropped with it
    assert_eq!(text, "bcd");
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "stop"
    );
    assert_eq!(&offsets[..3], &[0, 1, 2]);
}

/// A stream with logprobs sends each token as soon as its text is settled:
/// a special token (no text, nothing held back) in its own chunk at once,
/// the bytes of an incomplete character with the byte that completes it.
#[tokio::test]
async fn completion_stream_sends_textless_tokens_at_once() {
    let (_, tok) = crate::fake::engine(Setup::default());
    let filler = tok.token_to_id("<|filler_0|>").expect("a filler token");
    let mut script = vec![filler, filler, u32::from(b'h')];
    script.extend("😀".bytes().map(u32::from));
    script.push(filler);
    let app = app_with(
        Setup {
            script: Some(script),
            ..Setup::default()
        },
        |_| {},
    );
    let r = app
        .post_json(
            "/v1/completions",
            &json!({"model": MODEL, "prompt": "a", "stream": true, "logprobs": 0}),
        )
        .await;
    let chunks = sse_chunks(&r.text());
    let mut sizes = Vec::new();
    let mut text = String::new();
    for c in &chunks {
        let choice = &c["choices"][0];
        text.push_str(choice["text"].as_str().unwrap_or_default());
        if let Some(tokens) = choice["logprobs"]["tokens"].as_array() {
            sizes.push(tokens.len());
        }
    }
    assert_eq!(text, "h😀");
    // the EOS that ends the script adds no text and is not reported
    assert_eq!(sizes, [1, 1, 1, 4, 1], "{chunks:?}");
}

#[tokio::test]
async fn disconnect_mid_stream_cancels_and_frees_blocks() {
    let app = app_with(
        Setup {
            delay: Duration::from_millis(2),
            ..Setup::default()
        },
        |_| {},
    );
    let body = json!({"prompt": "a", "max_tokens": 450, "ignore_eos": true, "stream": true});
    let mut streams = Vec::new();
    for _ in 0..4 {
        let resp = app
            .router
            .clone()
            .oneshot(post("/v1/completions", body.to_string()))
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let mut body: Body = resp.into_body();
        // read one event, then hang up
        let frame = body
            .frame()
            .await
            .expect("a first event")
            .expect("no error");
        assert!(frame.into_data().is_ok());
        streams.push(body);
    }
    let s = app.state.served().unwrap().replicas.stats();
    assert!(s.running > 0 && s.kv_blocks_used > 0, "{s:?}");
    drop(streams);
    app.wait_idle().await;
    let m = app.get("/metrics").await.text();
    assert!(
        m.contains(
            "lamina_requests_finished_total{model_name=\"letters\",finished_reason=\"cancelled\"} 4"
        ),
        "{m}"
    );
    // generation went nowhere near max_tokens
    assert!(
        app.state
            .served()
            .unwrap()
            .replicas
            .stats()
            .generation_tokens_total
            < 4 * 450
    );
}
