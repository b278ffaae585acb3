//! The translation of an Anthropic conversation into a chat-completion
//! request (wire JSON): blocks to chat messages, tools, tool choice (the
//! mapping is in [`super::request`]'s module doc), and the Anthropic names
//! of the chat fields errors name. Costs: O(size of the request).

use serde_json::{Map, Value, json};

use super::request::{Block, Content, Conversation, System, Tool, ToolChoice};
use crate::error::ApiError;

pub(super) fn bad(param: impl Into<String>, msg: impl Into<String>) -> ApiError {
    ApiError::invalid_param(param, msg)
}

/// A system prompt or a tool result's text: blocks joined by newlines.
fn joined(s: &System, path: &str, ignored: &mut Vec<&'static str>) -> Result<String, ApiError> {
    match s {
        System::Text(t) => Ok(t.clone()),
        System::Blocks(blocks) => {
            let mut texts = Vec::with_capacity(blocks.len());
            for (j, b) in blocks.iter().enumerate() {
                let at = format!("{path}[{j}]");
                if b.kind != "text" {
                    return Err(bad(
                        format!("{at}.type"),
                        format!(
                            "`{}` blocks are not supported here; only `text` blocks are read.",
                            b.kind
                        ),
                    ));
                }
                checked_fields(b, &at, &["text", "citations"], ignored)?;
                let Some(t) = &b.text else {
                    return Err(bad(format!("{at}.text"), "A `text` block needs `text`."));
                };
                texts.push(t.as_str());
            }
            Ok(texts.join("\n"))
        }
    }
}

/// The chat request (wire JSON) of a conversation; `ignored` collects the
/// ignored fields given.
pub fn to_chat(c: &Conversation<'_>, ignored: &mut Vec<&'static str>) -> Result<Value, ApiError> {
    let mut messages = Vec::with_capacity(c.messages.len() + 1);
    if let Some(s) = c.system {
        messages.push(json!({"role": "system", "content": joined(s, "system", ignored)?}));
    }
    if c.messages.is_empty() {
        return Err(bad("messages", "`messages` must not be empty."));
    }
    for (i, m) in c.messages.iter().enumerate() {
        match m.role.as_str() {
            "user" | "assistant" => {}
            other => {
                return Err(bad(
                    format!("messages[{i}].role"),
                    format!(
                        "Unknown role `{other}`; expected `user` or `assistant` (the system prompt goes in `system`)."
                    ),
                ));
            }
        }
        match &m.content {
            Content::Text(t) => messages.push(json!({"role": m.role, "content": t})),
            Content::Blocks(blocks) => turn(i, &m.role, blocks, &mut messages, ignored)?,
        }
    }
    let mut chat = json!({"model": c.model, "messages": messages});
    // a last assistant turn is the start of the reply (Anthropic's prefill)
    if c.messages.last().is_some_and(|m| m.role == "assistant") {
        chat["continue_final_message"] = json!(true);
    }
    if let Some(tools) = c.tools {
        chat["tools"] = Value::Array(
            tools
                .iter()
                .enumerate()
                .map(|(i, t)| tool(i, t, ignored))
                .collect::<Result<_, _>>()?,
        );
    }
    if let Some(tc) = c.tool_choice {
        let (choice, parallel) = tool_choice(tc)?;
        chat["tool_choice"] = choice;
        if let Some(p) = parallel {
            chat["parallel_tool_calls"] = json!(p);
        }
    }
    Ok(chat)
}

/// The fields of `b` given that do not belong to its type (`allowed`).
fn stray(b: &Block, allowed: &[&str]) -> Option<&'static str> {
    [
        ("text", b.text.is_some()),
        ("id", b.id.is_some()),
        ("name", b.name.is_some()),
        ("input", b.input.is_some()),
        ("caller", b.caller.is_some()),
        ("toolset_name", b.toolset_name.is_some()),
        ("tool_use_id", b.tool_use_id.is_some()),
        ("content", b.content.is_some()),
        ("is_error", b.is_error.is_some()),
        ("citations", b.citations.is_some()),
        ("source", b.source.is_some()),
        ("title", b.title.is_some()),
        ("context", b.context.is_some()),
        ("thinking", b.thinking.is_some()),
        ("signature", b.signature.is_some()),
        ("data", b.data.is_some()),
    ]
    .into_iter()
    .find(|(f, given)| *given && !allowed.contains(f))
    .map(|(f, _)| f)
}

/// Refuses the fields of `b` (at `path`) that do not belong to its type
/// (`allowed`) and a caller other than the model; counts the ignored ones.
fn checked_fields(
    b: &Block,
    path: &str,
    allowed: &[&str],
    ignored: &mut Vec<&'static str>,
) -> Result<(), ApiError> {
    if let Some(f) = stray(b, allowed) {
        return Err(bad(
            format!("{path}.{f}"),
            format!("`{f}` does not belong to a `{}` block.", b.kind),
        ));
    }
    if let Some(caller) = &b.caller {
        if caller.get("type").and_then(Value::as_str) != Some("direct") {
            return Err(bad(
                format!("{path}.caller"),
                format!(
                    "Only the model calls tools here (`{{\"type\": \"direct\"}}` or null); \
                     a server tool as caller cannot be honoured, got `{caller}`."
                ),
            ));
        }
        ignored.push("caller");
    }
    for (f, given) in [
        ("cache_control", b.cache_control.is_some()),
        ("citations", b.citations.is_some()),
        ("toolset_name", b.toolset_name.is_some()),
    ] {
        if given {
            ignored.push(f);
        }
    }
    Ok(())
}

/// One message of content blocks as chat messages, appended to `out`.
fn turn(
    i: usize,
    role: &str,
    blocks: &[Block],
    out: &mut Vec<Value>,
    ignored: &mut Vec<&'static str>,
) -> Result<(), ApiError> {
    let mut text: Vec<&str> = Vec::new();
    let mut calls = Vec::new();
    for (j, b) in blocks.iter().enumerate() {
        let path = format!("messages[{i}].content[{j}]");
        let allowed: &[&str] = match (b.kind.as_str(), role) {
            ("text", _) => &["text", "citations"],
            ("tool_use", "assistant") => &["id", "name", "input", "caller", "toolset_name"],
            ("tool_result", "user") => &["tool_use_id", "content", "is_error", "toolset_name"],
            ("tool_use" | "tool_result", _) => {
                return Err(bad(
                    format!("{path}.type"),
                    format!("A `{}` block cannot be in a `{role}` message.", b.kind),
                ));
            }
            (other, _) => {
                return Err(bad(
                    format!("{path}.type"),
                    format!(
                        "`{other}` blocks are not supported; lamina reads `text`, `tool_use` and `tool_result`."
                    ),
                ));
            }
        };
        checked_fields(b, &path, allowed, ignored)?;
        match b.kind.as_str() {
            "text" => match &b.text {
                Some(t) => text.push(t),
                None => return Err(bad(format!("{path}.text"), "A `text` block needs `text`.")),
            },
            "tool_use" => calls.push(tool_use(&path, b)?),
            _ => {
                // a tool result: text before it is its own user message
                if !text.is_empty() {
                    out.push(json!({"role": "user", "content": text.join("\n")}));
                    text.clear();
                }
                let Some(id) = &b.tool_use_id else {
                    return Err(bad(
                        format!("{path}.tool_use_id"),
                        "A `tool_result` block needs `tool_use_id`.",
                    ));
                };
                let content = match &b.content {
                    Some(c) => joined(c, &format!("{path}.content"), ignored)?,
                    None => String::new(),
                };
                let content = if b.is_error == Some(true) {
                    format!("Error: {content}")
                } else {
                    content
                };
                out.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
            }
        }
    }
    if role == "assistant" {
        let mut m = json!({"role": "assistant", "content": text.join("\n")});
        if !calls.is_empty() {
            m["tool_calls"] = Value::Array(calls);
        }
        out.push(m);
    } else if !text.is_empty() {
        out.push(json!({"role": "user", "content": text.join("\n")}));
    }
    Ok(())
}

/// A `tool_use` block as a chat `tool_calls` entry.
fn tool_use(path: &str, b: &Block) -> Result<Value, ApiError> {
    let (Some(id), Some(name)) = (&b.id, &b.name) else {
        let missing = if b.id.is_none() { "id" } else { "name" };
        return Err(bad(
            format!("{path}.{missing}"),
            format!("A `tool_use` block needs `{missing}`."),
        ));
    };
    let input = match &b.input {
        Some(v) if v.is_object() => v.clone(),
        None => Value::Object(Map::new()),
        Some(_) => {
            return Err(bad(
                format!("{path}.input"),
                "`input` must be a JSON object.",
            ));
        }
    };
    Ok(json!({"id": id, "type": "function",
        "function": {"name": name, "arguments": input.to_string()}}))
}

/// A tool definition as a chat tool.
fn tool(i: usize, t: &Tool, ignored: &mut Vec<&'static str>) -> Result<Value, ApiError> {
    if let Some(kind) = t.kind.as_deref().filter(|k| *k != "custom") {
        return Err(bad(
            format!("tools[{i}].type"),
            format!(
                "Server tools are not available; `type` must be `custom` or absent, got `{kind}`."
            ),
        ));
    }
    if t.cache_control.is_some() {
        ignored.push("cache_control");
    }
    if t.eager_input_streaming.is_some() {
        ignored.push("eager_input_streaming");
    }
    let mut f = json!({"name": t.name, "parameters": t.input_schema});
    if let Some(d) = &t.description {
        f["description"] = json!(d);
    }
    Ok(json!({"type": "function", "function": f}))
}

/// `tool_choice` as the chat `tool_choice` and `parallel_tool_calls`.
fn tool_choice(tc: &ToolChoice) -> Result<(Value, Option<bool>), ApiError> {
    let parallel = tc.disable_parallel_tool_use.map(|d| !d);
    let choice = match (tc.kind.as_str(), &tc.name) {
        ("auto", None) => json!("auto"),
        ("any", None) => json!("required"),
        ("none", None) => json!("none"),
        ("tool", Some(name)) => json!({"type": "function", "function": {"name": name}}),
        ("tool", None) => {
            return Err(bad(
                "tool_choice.name",
                "`tool_choice` of type `tool` needs `name`.",
            ));
        }
        ("auto" | "any" | "none", Some(_)) => {
            return Err(bad(
                "tool_choice.name",
                "Only `tool_choice` of type `tool` takes a `name`.",
            ));
        }
        (other, _) => {
            return Err(bad(
                "tool_choice.type",
                format!(
                    "Unknown `tool_choice` type `{other}`; expected `auto`, `any`, `tool` or `none`."
                ),
            ));
        }
    };
    Ok((choice, parallel))
}

/// The Anthropic name of a chat request's field in an error (`stop` ->
/// `stop_sequences`, `tools[i].function.parameters` -> `tools[i].input_schema`,
/// `tool_choice.function.name` -> `tool_choice.name`, ...).
pub fn anthropic_param(chat: &str) -> String {
    match chat {
        "stop" => return "stop_sequences".into(),
        "tool_choice.function.name" => return "tool_choice.name".into(),
        "continue_final_message" => return "messages".into(),
        _ => {}
    }
    if let Some(rest) = chat.strip_prefix("response_format") {
        return format!(
            "output_config.format{}",
            rest.replacen(".json_schema", "", 1)
        );
    }
    if chat.starts_with("tools[") {
        return chat
            .replace(".function.parameters", ".input_schema")
            .replace(".function.", ".");
    }
    chat.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::anthropic::request::MessagesRequest;
    use crate::protocol;
    use crate::protocol::ChatRequest;

    fn chat_of(body: Value) -> Result<Value, ApiError> {
        let req: MessagesRequest = protocol::parse(body.to_string().as_bytes())?;
        req.to_chat(&mut Vec::new())
    }

    #[test]
    fn blocks_become_chat_messages() {
        let chat = chat_of(json!({
            "model": "m", "max_tokens": 10, "system": [{"type": "text", "text": "Be brief."}],
            "stop_sequences": ["\n\n"],
            "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Looking."},
                    {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "21C"}]},
                    {"type": "text", "text": "Thanks", "cache_control": {"type": "ephemeral"}}]},
            ]
        }))
        .unwrap();
        let m = chat["messages"].as_array().unwrap();
        let roles: Vec<&str> = m.iter().map(|m| m["role"].as_str().unwrap()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool", "user"]);
        assert_eq!(
            m[2]["tool_calls"][0]["function"]["arguments"],
            r#"{"city":"Paris"}"#
        );
        assert_eq!(m[3]["tool_call_id"], "t1");
        assert_eq!(m[3]["content"], "21C");
        assert_eq!(
            chat["tools"][0]["function"]["parameters"],
            json!({"type": "object"})
        );
        assert_eq!(chat["tool_choice"], "required");
        assert_eq!(chat["parallel_tool_calls"], false);
        assert_eq!(chat["stop"], json!(["\n\n"]));
        let req: ChatRequest = serde_json::from_value(chat).unwrap();
        assert_eq!(req.max_tokens, Some(10));
    }

    #[test]
    fn bad_requests_name_the_anthropic_field() {
        let base = |extra: Value| {
            let mut b = json!({"model": "m", "max_tokens": 5,
                "messages": [{"role": "user", "content": "hi"}]});
            for (k, v) in extra.as_object().unwrap() {
                b[k] = v.clone();
            }
            b
        };
        for (body, param) in [
            (base(json!({"thinking": {"type": "enabled"}})), "thinking"),
            (json!({"model": "m", "messages": []}), "max_tokens"),
            (
                base(json!({"messages": [{"role": "system", "content": "x"}]})),
                "messages[0].role",
            ),
            (
                base(
                    json!({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}),
                ),
                "messages[0].content[0].type",
            ),
            (
                base(json!({"messages": [{"role": "user", "content": [{"type": "image"}]}]})),
                "messages[0].content[0].type",
            ),
            (
                base(
                    json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "a", "input": {}}]}]}),
                ),
                "messages[0].content[0].input",
            ),
            (
                base(
                    json!({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f"}]}]}),
                ),
                "messages[0].content[0].type",
            ),
            (
                base(
                    json!({"tools": [{"type": "web_search_20250305", "name": "w", "input_schema": {}}]}),
                ),
                "tools[0].type",
            ),
            (
                base(json!({"tool_choice": {"type": "tool"}})),
                "tool_choice.name",
            ),
            (
                base(json!({"tool_choice": {"type": "sometimes"}})),
                "tool_choice.type",
            ),
        ] {
            let e = chat_of(body.clone()).unwrap_err();
            assert_eq!(e.status, 400, "{body}");
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {}", e.message);
        }
    }

    #[test]
    fn output_config_format_holds_the_reply_to_a_schema() {
        let chat = chat_of(json!({"model": "m", "max_tokens": 5,
            "messages": [{"role": "user", "content": "hi"}],
            "output_config": {"effort": "low", "format": {"type": "json_schema", "schema": {"type": "object"}}}}))
        .unwrap();
        assert_eq!(chat["response_format"]["type"], "json_schema");
        assert_eq!(
            chat["response_format"]["json_schema"]["schema"],
            json!({"type": "object"})
        );
        assert_eq!(
            anthropic_param("response_format.json_schema.schema"),
            "output_config.format.schema"
        );
    }

    #[test]
    fn ignored_fields_are_collected() {
        let req: MessagesRequest = protocol::parse(
            json!({"model": "m", "max_tokens": 5, "metadata": {"user_id": "u"}, "speed": "fast",
                "system": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}],
                "messages": [{"role": "user", "content": "hi"}]})
            .to_string()
            .as_bytes(),
        )
        .unwrap();
        let mut ignored = Vec::new();
        req.to_chat(&mut ignored).unwrap();
        assert_eq!(ignored, ["cache_control", "metadata", "speed"]);
    }

    #[test]
    fn chat_params_are_renamed() {
        assert_eq!(anthropic_param("stop"), "stop_sequences");
        assert_eq!(
            anthropic_param("tools[2].function.parameters"),
            "tools[2].input_schema"
        );
        assert_eq!(anthropic_param("tools[0].function.name"), "tools[0].name");
        assert_eq!(
            anthropic_param("tool_choice.function.name"),
            "tool_choice.name"
        );
        assert_eq!(anthropic_param("max_tokens"), "max_tokens");
    }
}
