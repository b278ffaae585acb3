//! The Anthropic Messages API and OpenAI's Responses API over the fake
//! engine: reply shapes whole and streamed, stop reasons, usage,
//! `count_tokens`, `x-api-key`, Anthropic's error shape, the response store
//! (`previous_response_id`, `GET` / `DELETE`, `store: false`, eviction), and
//! the chat API's ignored fields counted. (Tool calls need a model that
//! follows the grammar: `tests/python/anthropic_api.py` and
//! `responses_api.py`.)

use axum::body::Body;
use axum::http::Request;
use serde_json::{Value, json};

use crate::{LETTERS, MODEL, app, app_with, fake, sse_data};

fn msg(extra: Value) -> Value {
    let mut b = json!({"model": MODEL, "max_tokens": 64,
        "messages": [{"role": "user", "content": "hi"}]});
    for (k, v) in extra.as_object().into_iter().flatten() {
        b[k] = v.clone();
    }
    b
}

/// `(event name, data)` of an SSE body.
pub fn named_events(body: &str) -> Vec<(String, Value)> {
    body.split("\n\n")
        .filter(|e| e.lines().any(|l| l.starts_with("data:")))
        .map(|e| {
            let name = e
                .lines()
                .find_map(|l| l.strip_prefix("event: "))
                .unwrap_or_default()
                .to_string();
            let data = sse_data(e).join("");
            (name, serde_json::from_str(&data).expect("event JSON"))
        })
        .collect()
}

#[tokio::test]
async fn a_message_has_anthropics_shape() {
    let app = app();
    let r = app
        .post_json("/v1/messages", &msg(json!({"temperature": 0})))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["type"], "message");
    assert_eq!(v["role"], "assistant");
    assert!(v["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(v["model"], MODEL);
    assert_eq!(v["content"], json!([{"type": "text", "text": LETTERS}]));
    assert_eq!(v["stop_reason"], "end_turn");
    assert!(v["stop_sequence"].is_null());
    let u = &v["usage"];
    assert_eq!(u["output_tokens"], LETTERS.len() + 1);
    let prompt =
        u["input_tokens"].as_u64().unwrap() + u["cache_read_input_tokens"].as_u64().unwrap();
    // count_tokens counts the same prompt
    let c = app
        .post_json(
            "/v1/messages/count_tokens",
            &json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(c.status, 200, "{}", c.text());
    assert_eq!(c.json(), json!({"input_tokens": prompt}));
    // limits and stop sequences
    let v = app
        .post_json("/v1/messages", &msg(json!({"max_tokens": 3})))
        .await
        .json();
    assert_eq!(
        (v["content"][0]["text"].as_str(), v["stop_reason"].as_str()),
        (Some("abc"), Some("max_tokens"))
    );
    let v = app
        .post_json(
            "/v1/messages",
            &msg(json!({"stop_sequences": ["zz", "fg"]})),
        )
        .await
        .json();
    assert_eq!(v["content"][0]["text"], "abcde");
    assert_eq!(
        (v["stop_reason"].as_str(), v["stop_sequence"].as_str()),
        (Some("stop_sequence"), Some("fg"))
    );
    app.wait_idle().await;
}

#[tokio::test]
async fn a_streamed_message_follows_anthropics_event_sequence() {
    let app = app();
    let r = app
        .post_json("/v1/messages", &msg(json!({"stream": true})))
        .await;
    assert_eq!(r.status, 200);
    let events = named_events(&r.text());
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        &names[..3],
        ["message_start", "ping", "content_block_start"]
    );
    assert_eq!(
        &names[names.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );
    for (name, data) in &events {
        assert_eq!(data["type"], name.as_str());
    }
    let text: String = events
        .iter()
        .filter(|(n, _)| n == "content_block_delta")
        .map(|(_, d)| d["delta"]["text"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(text, LETTERS);
    let delta = &events[events.len() - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], "end_turn");
    assert_eq!(delta["usage"]["output_tokens"], LETTERS.len() + 1);
    assert!(
        events[0].1["message"]["usage"]["input_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );
    app.wait_idle().await;
}

#[tokio::test]
async fn anthropic_errors_and_keys() {
    let app = app_with(fake::Setup::default(), |c| c.api_keys = vec!["k".into()]);
    let send = |headers: &[(&str, &str)], body: Value| {
        let mut req = Request::post("/v1/messages").header("content-type", "application/json");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        app.send(req.body(Body::from(body.to_string())).unwrap())
    };
    let r = send(
        &[("x-api-key", "k"), ("anthropic-version", "2023-06-01")],
        msg(json!({})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = send(&[("authorization", "Bearer k")], msg(json!({}))).await;
    assert_eq!(r.status, 200);
    let r = send(&[("x-api-key", "nope")], msg(json!({}))).await;
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["error"]["type"], "authentication_error");
    assert_eq!(r.json()["type"], "error");
    for (body, status, kind, needle) in [
        (
            msg(json!({"thinking": {"type": "enabled"}})),
            400,
            "invalid_request_error",
            "thinking",
        ),
        (
            json!({"model": MODEL, "messages": []}),
            400,
            "invalid_request_error",
            "max_tokens",
        ),
        (
            msg(json!({"stop_sequences": ["a", "b", "c", "d", "e"]})),
            400,
            "invalid_request_error",
            "stop_sequences",
        ),
        (
            msg(json!({"model": "claude-x"})),
            404,
            "not_found_error",
            "claude-x",
        ),
        (
            msg(json!({"top_p": 7})),
            400,
            "invalid_request_error",
            "top_p",
        ),
    ] {
        let r = send(&[("x-api-key", "k")], body.clone()).await;
        assert_eq!(r.status, status, "{body}: {}", r.text());
        let v = r.json();
        assert_eq!(
            (v["type"].as_str(), v["error"]["type"].as_str()),
            (Some("error"), Some(kind)),
            "{v}"
        );
        let m = v["error"]["message"].as_str().unwrap();
        assert!(m.contains(needle), "{body}: {m}");
    }
    app.wait_idle().await;
}

fn resp(extra: Value) -> Value {
    let mut b = json!({"model": MODEL, "input": "hi", "max_output_tokens": 64});
    for (k, v) in extra.as_object().into_iter().flatten() {
        b[k] = v.clone();
    }
    b
}

#[tokio::test]
async fn a_response_has_the_responses_shape_and_is_stored() {
    let app = app();
    let r = app
        .post_json("/v1/responses", &resp(json!({"metadata": {"k": "v"}})))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(
        (v["object"].as_str(), v["status"].as_str()),
        (Some("response"), Some("completed"))
    );
    let id = v["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("resp_"));
    assert_eq!(v["output"][0]["type"], "message");
    assert_eq!(
        v["output"][0]["content"][0],
        json!({"type": "output_text", "text": LETTERS, "annotations": [], "logprobs": []})
    );
    assert_eq!(v["metadata"], json!({"k": "v"}));
    assert_eq!(v["usage"]["output_tokens"], LETTERS.len() + 1);
    let first_input = v["usage"]["input_tokens"].as_u64().unwrap();
    // stored: GET returns it, a continuation sees its conversation
    assert_eq!(app.get(&format!("/v1/responses/{id}")).await.json(), v);
    let next = app
        .post_json(
            "/v1/responses",
            &resp(json!({"previous_response_id": id, "max_output_tokens": 2})),
        )
        .await
        .json();
    assert_eq!(next["status"], "incomplete");
    assert_eq!(next["incomplete_details"]["reason"], "max_output_tokens");
    assert!(next["usage"]["input_tokens"].as_u64().unwrap() > first_input + LETTERS.len() as u64);
    // deleted: gone
    let del = app
        .send(
            Request::delete(format!("/v1/responses/{id}"))
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(
        del.json(),
        json!({"id": id, "object": "response", "deleted": true})
    );
    assert_eq!(app.get(&format!("/v1/responses/{id}")).await.status, 404);
    let r = app
        .post_json("/v1/responses", &resp(json!({"previous_response_id": id})))
        .await;
    r.assert_error(400, Some("previous_response_id"));
    // store: false keeps nothing
    let v = app
        .post_json("/v1/responses", &resp(json!({"store": false})))
        .await
        .json();
    assert_eq!(
        app.get(&format!("/v1/responses/{}", v["id"].as_str().unwrap()))
            .await
            .status,
        404
    );
    app.wait_idle().await;
}

#[tokio::test]
async fn a_streamed_response_sends_numbered_semantic_events() {
    let app = app();
    let r = app
        .post_json("/v1/responses", &resp(json!({"stream": true})))
        .await;
    assert_eq!(r.status, 200);
    let events = named_events(&r.text());
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        &names[..4],
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added"
        ]
    );
    assert_eq!(
        &names[names.len() - 4..],
        [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed"
        ]
    );
    for (i, (name, data)) in events.iter().enumerate() {
        assert_eq!(
            (data["type"].as_str(), data["sequence_number"].as_u64()),
            (Some(name.as_str()), Some(i as u64))
        );
    }
    let text: String = events
        .iter()
        .filter(|(n, _)| n == "response.output_text.delta")
        .map(|(_, d)| d["delta"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(text, LETTERS);
    let done = &events.last().unwrap().1["response"];
    assert_eq!(done["output"][0]["content"][0]["text"], LETTERS);
    app.wait_idle().await;
}

#[tokio::test]
async fn responses_errors_name_the_responses_field() {
    let app = app();
    for (body, param) in [
        (resp(json!({"include": ["x"]})), "include"),
        (resp(json!({"max_output_tokens": 0})), "max_output_tokens"),
        (
            resp(json!({"input": [{"type": "reasoning"}]})),
            "input[0].type",
        ),
        (
            resp(json!({"text": {"format": {"type": "json_schema", "name": "a b", "schema": {}}}})),
            "text.format.name",
        ),
        (resp(json!({"tool_choice": "required"})), "tool_choice"),
        (resp(json!({"truncation": "auto"})), "truncation"),
    ] {
        let r = app.post_json("/v1/responses", &body).await;
        r.assert_error(400, Some(param));
    }
}

#[tokio::test]
async fn the_store_evicts_the_oldest_past_its_cap() {
    let app = app_with(fake::Setup::default(), |c| c.responses_store_bytes = 3_000);
    let mut ids = Vec::new();
    for _ in 0..4 {
        let v = app
            .post_json("/v1/responses", &resp(json!({})))
            .await
            .json();
        ids.push(v["id"].as_str().unwrap().to_string());
    }
    assert_eq!(
        app.get(&format!("/v1/responses/{}", ids[0])).await.status,
        404
    );
    assert_eq!(
        app.get(&format!("/v1/responses/{}", ids[3])).await.status,
        200
    );
    let (_, bytes) = app.state.responses.usage();
    assert!(bytes <= 3_000, "{bytes}");
}

#[tokio::test]
async fn harmless_chat_fields_are_accepted_and_counted() {
    let app = app();
    let r = app
        .post_json(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                "store": false, "metadata": {"a": "b"}, "service_tier": "auto",
                "reasoning_effort": "low", "user": "u", "parallel_tool_calls": false}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let m = app.get("/metrics").await.text();
    for f in [
        "store",
        "metadata",
        "service_tier",
        "reasoning_effort",
        "user",
    ] {
        let line = format!("lamina_ignored_fields_total{{model_name=\"{MODEL}\",field=\"{f}\"}} 1");
        assert!(m.contains(&line), "{line}\n{m}");
    }
    assert!(m.contains("vllm:num_requests_running{"), "{m}");
    // a field that would change the output is still refused by name
    let r = app
        .post_json(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "hi"}], "prediction": {"type": "content"}}),
        )
        .await;
    r.assert_error(400, Some("prediction"));
}

/// A conversation ending with an assistant turn is continued (Anthropic's
/// prefill; the chat API's `continue_final_message`): the letter fake goes
/// on from the turn's last letter, whole and streamed, and `count_tokens`
/// counts the prompt the reply continued.
#[tokio::test]
async fn a_final_assistant_turn_is_continued() {
    let app = app();
    let turns = json!([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "abc"}]);
    let v = app
        .post_json("/v1/messages", &msg(json!({"messages": turns})))
        .await
        .json();
    assert_eq!(
        v["content"],
        json!([{"type": "text", "text": &LETTERS[3..]}]),
        "{v}"
    );
    assert_eq!(v["stop_reason"], "end_turn");
    let u = &v["usage"];
    let prompt =
        u["input_tokens"].as_u64().unwrap() + u["cache_read_input_tokens"].as_u64().unwrap();
    let c = app
        .post_json(
            "/v1/messages/count_tokens",
            &json!({"model": MODEL, "messages": turns}),
        )
        .await
        .json();
    assert_eq!(c["input_tokens"], prompt);
    let r = app
        .post_json(
            "/v1/messages",
            &msg(json!({"messages": turns, "stream": true})),
        )
        .await;
    let text: String = named_events(&r.text())
        .iter()
        .filter(|(n, _)| n == "content_block_delta")
        .filter_map(|(_, d)| d["delta"]["text"].as_str().map(str::to_string))
        .collect();
    assert_eq!(text, &LETTERS[3..]);

    // the chat API: continued with the field, answered without it
    let chat = |extra: Value| {
        let mut b = json!({"model": MODEL, "messages": turns});
        for (k, v) in extra.as_object().into_iter().flatten() {
            b[k] = v.clone();
        }
        b
    };
    let v = app
        .post_json(
            "/v1/chat/completions",
            &chat(json!({"continue_final_message": true})),
        )
        .await
        .json();
    assert_eq!(v["choices"][0]["message"]["content"], &LETTERS[3..], "{v}");
    let v = app
        .post_json("/v1/chat/completions", &chat(json!({})))
        .await
        .json();
    assert_eq!(v["choices"][0]["message"]["content"], LETTERS, "{v}");
    // a conversation that does not end with an assistant's text is refused
    let user_last = json!({"model": MODEL, "continue_final_message": true,
        "messages": [{"role": "user", "content": "hi"}]});
    app.post_json("/v1/chat/completions", &user_last)
        .await
        .assert_error(400, Some("continue_final_message"));
    app.wait_idle().await;
}
