//! Bodies the official clients send: the `anthropic` SDK's round trip of an
//! agent loop (the assistant's content sent back as `model_dump()` gives
//! it, `caller` / `toolset_name` / `citations` included), and the errors
//! of the Anthropic and Responses paths naming the field and the block or
//! part type instead of "did not match any variant".

use serde_json::{Value, json};

use crate::{MODEL, app};

/// An agent loop's second request, the assistant turn as the SDK's
/// `[b.model_dump() for b in r.content]` gives it.
fn sdk_round_trip(caller: Value, toolset: Value) -> Value {
    json!({
        "model": MODEL,
        "max_tokens": 8,
        "messages": [
            {"role": "user", "content": "Paris?"},
            {"role": "assistant", "content": [
                {"citations": null, "text": "Hm.", "type": "text"},
                {"id": "t1", "caller": caller, "input": {},
                 "name": "w", "type": "tool_use", "toolset_name": toolset},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "sun", "toolset_name": null},
            ]},
        ],
    })
}

fn message(v: &Value) -> String {
    v["error"]["message"].as_str().unwrap_or("").to_string()
}

#[tokio::test]
async fn the_anthropic_sdks_round_trip_is_accepted() {
    let app = app();
    for (caller, toolset) in [
        (Value::Null, Value::Null),
        (json!({"type": "direct"}), json!("weather_tools")),
    ] {
        let body = sdk_round_trip(caller.clone(), toolset.clone());
        let r = app.post_json("/v1/messages", &body).await;
        assert_eq!(r.status, 200, "{caller} {toolset}: {}", r.text());
        assert_eq!(r.json()["type"], "message");
        let mut count = body.clone();
        count.as_object_mut().map(|o| o.remove("max_tokens"));
        let r = app.post_json("/v1/messages/count_tokens", &count).await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let metrics = app.get("/metrics").await.text();
    for f in ["caller", "toolset_name"] {
        let line = format!("lamina_ignored_fields_total{{model_name=\"{MODEL}\",field=\"{f}\"}}");
        assert!(metrics.contains(&line), "{f} not counted:\n{metrics}");
    }
    app.wait_idle().await;
}

#[tokio::test]
async fn anthropic_errors_name_the_field_and_block_type() {
    let app = app();
    let with_block = |block: Value| {
        json!({"model": MODEL, "max_tokens": 8, "messages": [
            {"role": "user", "content": "hi"},
            {"role": "user", "content": [block]},
        ]})
    };
    let image = json!({"type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}});
    let image_last = json!({"source": {"type": "url", "url": "http://x"}, "type": "image"});
    let thinking = json!({"signature": "s", "thinking": "hmm", "type": "thinking"});
    let server_caller = sdk_round_trip(
        json!({"type": "code_execution_20250825", "tool_id": "x"}),
        Value::Null,
    );
    let tool_result_image = with_block(json!({"type": "tool_result", "tool_use_id": "t",
        "content": [{"type": "image", "source": {}}]}));
    for (body, needles) in [
        (
            with_block(image),
            vec![
                "messages[1].content[0].type",
                "`image` blocks are not supported",
            ],
        ),
        (
            with_block(image_last),
            vec!["messages[1].content[0].type", "`image`"],
        ),
        (
            with_block(thinking),
            vec!["messages[1].content[0].type", "`thinking`"],
        ),
        (
            with_block(json!({"type": "text", "text": "a", "colour": 1})),
            vec!["messages[1].content[0].colour"],
        ),
        (
            with_block(json!({"type": "text", "text": 5})),
            vec!["messages[1].content[0].text"],
        ),
        (
            server_caller,
            vec!["messages[1].content[1].caller", "cannot be honoured"],
        ),
        (
            tool_result_image,
            vec!["messages[1].content[0].content[0].type", "`image`"],
        ),
        (
            json!({"model": MODEL, "max_tokens": 8, "system": [{"type": "text"}],
                "messages": [{"role": "user", "content": "hi"}]}),
            vec!["system[0].text"],
        ),
        (
            json!({"model": MODEL, "max_tokens": -1, "messages": [{"role": "user", "content": "hi"}]}),
            vec!["max_tokens"],
        ),
    ] {
        let r = app.post_json("/v1/messages", &body).await;
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        let v = r.json();
        assert_eq!(v["type"], "error", "{v}");
        let m = message(&v);
        assert!(!m.contains("did not match any variant"), "{m}");
        for n in needles {
            assert!(m.contains(n), "{body}: `{n}` not in: {m}");
        }
    }
}

#[tokio::test]
async fn responses_errors_name_the_field_and_part_type() {
    let app = app();
    let with_part = |part: Value| {
        json!({"model": MODEL, "max_output_tokens": 8,
            "input": [{"role": "user", "content": [part]}]})
    };
    for (body, param) in [
        (
            with_part(json!({"type": "input_image", "text": "x"})),
            "input[0].content[0].type",
        ),
        (
            with_part(json!({"type": "input_image", "image_url": "http://x/i.png"})),
            "input[0].content[0].type",
        ),
        (
            with_part(json!({"type": "input_text"})),
            "input[0].content[0].text",
        ),
        (
            with_part(json!({"type": "input_text", "text": "a", "colour": 1})),
            "input[0].content[0].colour",
        ),
        (
            with_part(json!({"type": "input_text", "text": 7})),
            "input[0].content[0].text",
        ),
        (
            json!({"model": MODEL, "input": "hi", "tool_choice": {"type": "function"}}),
            "tool_choice.name",
        ),
        (
            json!({"model": MODEL, "input": "hi", "max_output_tokens": -1}),
            "max_output_tokens",
        ),
    ] {
        let r = app.post_json("/v1/responses", &body).await;
        let v = r.assert_error(400, Some(param));
        let m = message(&v);
        assert!(!m.contains("did not match any variant"), "{m}");
        if param.ends_with(".type") {
            assert!(m.contains("`input_image` parts are not supported"), "{m}");
        }
    }
    // a text part still reads
    let r = app
        .post_json(
            "/v1/responses",
            &with_part(json!({"type": "input_text", "text": "hi"})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    app.wait_idle().await;
}
