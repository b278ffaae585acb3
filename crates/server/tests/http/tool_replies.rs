//! Replies to requests with tools in `auto` mode, over the fake engine
//! reading out a script: text before a call comes back as the text of
//! each API (`content`, a `text` block before the `tool_use` block, a
//! `message` item before the `function_call` item), whole and streamed in
//! that order; a call started after text is still held to its function's
//! schema (the grammar refuses the fake's step out of it), also after
//! Llama 3's `<|python_tag|>` marker; text with braces that open no call
//! stays text.

use serde_json::{Value, json};

use crate::agents::named_events;
use crate::fake::Setup;
use crate::{App, MODEL, app_with, sse_chunks};

const CALL: &str = r#"{"name": "get_weather", "parameters": {"city": "Oslo"}}"#;

fn scripted(script: &str) -> App {
    app_with(
        Setup {
            script: Some(script.bytes().map(u32::from).collect()),
            num_blocks: 256,
            ..Setup::default()
        },
        |_| {},
    )
}

fn weather_params() -> Value {
    json!({"type": "object", "properties": {"city": {"type": "string"}},
        "required": ["city"], "additionalProperties": false})
}

fn chat(stream: bool) -> Value {
    json!({"model": MODEL, "max_tokens": 200, "stream": stream,
        "messages": [{"role": "user", "content": "Weather in Oslo?"}],
        "tools": [{"type": "function", "function": {"name": "get_weather",
            "parameters": weather_params()}}]})
}

fn anthropic(stream: bool) -> Value {
    json!({"model": MODEL, "max_tokens": 200, "stream": stream,
        "messages": [{"role": "user", "content": "Weather in Oslo?"}],
        "tools": [{"name": "get_weather", "input_schema": weather_params()}]})
}

fn responses(stream: bool) -> Value {
    json!({"model": MODEL, "max_output_tokens": 200, "stream": stream, "input": "Weather in Oslo?",
        "tools": [{"type": "function", "name": "get_weather", "parameters": weather_params()}]})
}

#[tokio::test]
async fn text_before_a_call_is_the_chat_content() {
    let app = scripted(&format!("Let me check.\n{CALL}"));
    let v = app
        .post_json("/v1/chat/completions", &chat(false))
        .await
        .json();
    let c = &v["choices"][0];
    assert_eq!(c["finish_reason"], "tool_calls", "{v}");
    assert_eq!(c["message"]["content"], "Let me check.", "{v}");
    let calls = c["message"]["tool_calls"].as_array().expect("tool_calls");
    assert_eq!(calls.len(), 1, "{v}");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    let args: Value =
        serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"city": "Oslo"}));

    // streamed: the text as content deltas, all before the call's chunks
    let r = app.post_json("/v1/chat/completions", &chat(true)).await;
    let chunks = sse_chunks(&r.text());
    let mut content = String::new();
    let mut first_call = None;
    let mut finish = None;
    for (i, ch) in chunks.iter().enumerate() {
        let d = &ch["choices"][0]["delta"];
        if let Some(t) = d["content"].as_str() {
            assert!(
                first_call.is_none() || t.is_empty(),
                "content after the call: {ch}"
            );
            content.push_str(t);
        }
        if d.get("tool_calls").is_some() && first_call.is_none() {
            first_call = Some(i);
        }
        if let Some(f) = ch["choices"][0]["finish_reason"].as_str() {
            finish = Some(f.to_string());
        }
    }
    assert_eq!(content, "Let me check.");
    assert!(first_call.is_some(), "no tool_calls chunk: {}", r.text());
    assert_eq!(finish.as_deref(), Some("tool_calls"));
    app.wait_idle().await;
}

#[tokio::test]
async fn text_before_a_call_is_anthropics_text_block() {
    let app = scripted(&format!("Let me check.\n{CALL}"));
    let v = app
        .post_json("/v1/messages", &anthropic(false))
        .await
        .json();
    assert_eq!(v["stop_reason"], "tool_use", "{v}");
    assert_eq!(
        v["content"][0],
        json!({"type": "text", "text": "Let me check."}),
        "{v}"
    );
    assert_eq!(v["content"][1]["type"], "tool_use", "{v}");
    assert_eq!(v["content"][1]["input"], json!({"city": "Oslo"}), "{v}");
    assert_eq!(v["content"].as_array().map(Vec::len), Some(2));

    let r = app.post_json("/v1/messages", &anthropic(true)).await;
    let evs = named_events(&r.text());
    let mut seq: Vec<String> = Vec::new();
    let mut text = String::new();
    for (name, data) in &evs {
        let at = &data["index"];
        let label = match name.as_str() {
            "content_block_start" => format!("start {at} {}", data["content_block"]["type"]),
            "content_block_delta" => format!("delta {at} {}", data["delta"]["type"]),
            "content_block_stop" => format!("stop {at}"),
            other => other.to_string(),
        };
        if data["delta"]["type"] == "text_delta" {
            text.push_str(data["delta"]["text"].as_str().unwrap_or_default());
        }
        if seq.last() != Some(&label) {
            seq.push(label);
        }
    }
    assert_eq!(
        seq,
        [
            "message_start",
            "ping",
            "start 0 \"text\"",
            "delta 0 \"text_delta\"",
            "stop 0",
            "start 1 \"tool_use\"",
            "delta 1 \"input_json_delta\"",
            "stop 1",
            "message_delta",
            "message_stop"
        ],
        "{}",
        r.text()
    );
    assert_eq!(text, "Let me check.");
    let delta = &evs.iter().find(|(n, _)| n == "message_delta").unwrap().1;
    assert_eq!(delta["delta"]["stop_reason"], "tool_use");
    app.wait_idle().await;
}

#[tokio::test]
async fn text_before_a_call_is_a_message_item_first() {
    let app = scripted(&format!("Let me check.\n{CALL}"));
    let v = app
        .post_json("/v1/responses", &responses(false))
        .await
        .json();
    let out = v["output"].as_array().expect("output");
    assert_eq!(out.len(), 2, "{v}");
    assert_eq!(out[0]["type"], "message");
    assert_eq!(out[0]["content"][0]["text"], "Let me check.");
    assert_eq!(out[1]["type"], "function_call");
    assert_eq!(out[1]["name"], "get_weather");

    let r = app.post_json("/v1/responses", &responses(true)).await;
    let evs = named_events(&r.text());
    let mut seq: Vec<String> = Vec::new();
    for (name, data) in &evs {
        let label = match name.as_str() {
            "response.output_item.added" | "response.output_item.done" => {
                format!("{name} {} {}", data["output_index"], data["item"]["type"])
            }
            other => other.to_string(),
        };
        if seq.last() != Some(&label) {
            seq.push(label);
        }
    }
    assert_eq!(
        seq,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added 0 \"message\"",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done 0 \"message\"",
            "response.output_item.added 1 \"function_call\"",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done 1 \"function_call\"",
            "response.completed"
        ],
        "{}",
        r.text()
    );
    let done = &evs.last().unwrap().1["response"];
    assert_eq!(done["output"][0]["content"][0]["text"], "Let me check.");
    assert_eq!(done["output"][1]["arguments"], r#"{"city":"Oslo"}"#);
    app.wait_idle().await;
}

/// A call started after text cannot leave its function's schema (an
/// argument `additionalProperties: false` forbids) or name an undeclared
/// function: the grammar refuses the step and the request fails naming
/// `tools`.
#[tokio::test]
async fn a_call_after_text_is_held_to_its_schema() {
    for script in [
        r#"Sure.
{"name": "get_weather", "parameters": {"city": "Oslo", "temp": 21}}"#,
        r#"Sure. {"name": "get_time", "parameters": {}}"#,
    ] {
        let app = scripted(script);
        let r = app.post_json("/v1/chat/completions", &chat(false)).await;
        r.assert_error(400, Some("tools"));
        app.wait_idle().await;
    }
}

/// Braces that open no call are text, and without tools the same script
/// is plain content.
#[tokio::test]
async fn braces_that_open_no_call_are_text() {
    let script = r#"Use {x} or {"city": 1} here."#;
    let app = scripted(script);
    for stream in [false, true] {
        let r = app.post_json("/v1/chat/completions", &chat(stream)).await;
        let (content, finish) = if stream {
            let chunks = sse_chunks(&r.text());
            let content: String = chunks
                .iter()
                .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
                .collect();
            let finish = chunks.iter().find_map(|c| {
                c["choices"][0]["finish_reason"]
                    .as_str()
                    .map(str::to_string)
            });
            (content, finish)
        } else {
            let v = r.json();
            let c = &v["choices"][0];
            assert!(c["message"]["tool_calls"].is_null(), "{v}");
            (
                c["message"]["content"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                c["finish_reason"].as_str().map(str::to_string),
            )
        };
        assert_eq!(content, script);
        assert_eq!(finish.as_deref(), Some("stop"));
    }
    app.wait_idle().await;
}

/// The `auto` grammar compiles in each of its forms: with and without the
/// template's call marker (a vocabulary that has `<|python_tag|>`), one or
/// several calls.
#[test]
fn every_form_of_the_auto_grammar_compiles() {
    let (engine, tok) = crate::fake::engine(Setup {
        call_marker: true,
        ..Setup::default()
    });
    assert!(tok.token_to_id(server::tools::CALL_MARKER).is_some());
    let tools: Vec<server::protocol::Tool> = serde_json::from_value(json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": weather_params()}},
        {"type": "function", "function": {"name": "now"}},
    ]))
    .unwrap();
    for parallel in [false, true] {
        let plan = server::tools::plan(
            Some(&tools),
            None,
            Some(parallel),
            server::tools::CallFormat::Json,
        )
        .unwrap()
        .unwrap();
        for marker in [false, true] {
            let g = plan.auto_grammar(marker);
            engine
                .check_constraint(&g)
                .unwrap_or_else(|e| panic!("parallel {parallel}, marker {marker}: {e}\n{g:?}"));
        }
    }
}

/// With the template's marker, text, then `<|python_tag|>`, then a call
/// follows the grammar, and the call is still held to its schema (the
/// grammar given as `guided_grammar`, since the fake's template renders no
/// tools; the marker is a special token, so the text reads without it).
#[tokio::test]
async fn a_call_after_the_marker_follows_the_grammar() {
    let tools: Vec<server::protocol::Tool> = serde_json::from_value(json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": weather_params()}},
    ]))
    .unwrap();
    let plan = server::tools::plan(Some(&tools), None, None, server::tools::CallFormat::Json)
        .unwrap()
        .unwrap();
    let engine::Constraint::Lark(grammar) = plan.auto_grammar(true) else {
        panic!("a Lark grammar");
    };
    let bad = r#"{"name": "get_weather", "parameters": {"town": "Oslo"}}"#;
    for (call, ok) in [(CALL, true), (bad, false)] {
        let mut setup = Setup {
            call_marker: true,
            num_blocks: 256,
            ..Setup::default()
        };
        let (_, tok) = crate::fake::engine(Setup {
            call_marker: true,
            ..Setup::default()
        });
        let tag = tok
            .token_to_id(server::tools::CALL_MARKER)
            .expect("the marker");
        let mut script: Vec<u32> = "Sure.".bytes().map(u32::from).collect();
        script.push(tag);
        script.extend(call.bytes().map(u32::from));
        setup.script = Some(script);
        let app = app_with(setup, |_| {});
        let body = json!({"model": MODEL, "max_tokens": 200, "guided_grammar": grammar,
            "messages": [{"role": "user", "content": "Weather in Oslo?"}]});
        let r = app.post_json("/v1/chat/completions", &body).await;
        if ok {
            assert_eq!(r.status, 200, "{}", r.text());
            let v = r.json();
            assert_eq!(
                v["choices"][0]["message"]["content"],
                format!("Sure.{CALL}"),
                "{v}"
            );
        } else {
            r.assert_error(400, Some("guided_grammar"));
        }
        app.wait_idle().await;
    }
}
