//! Responses API items and formats in chat terms: input items to checked
//! wire items (the history's form), wire items to chat messages, `text.format`
//! to `response_format`, a whole request to the chat request
//! ([`ResponsesRequest::to_chat`]), and the Responses names of the chat
//! fields errors name. Costs: O(size of the items).

use serde_json::{Value, json};

use super::request::{Format, Input, Item, ItemContent, Part, ResponsesRequest, ToolChoice};
use crate::error::ApiError;

fn bad(param: impl Into<String>, msg: impl Into<String>) -> ApiError {
    ApiError::invalid_param(param, msg)
}

/// `text.format` as the chat `response_format`.
pub(super) fn response_format(f: &Format) -> Value {
    if f.kind != "json_schema" {
        return json!({"type": f.kind});
    }
    let mut js = json!({"name": f.name.clone().unwrap_or_default()});
    if let Some(s) = &f.schema {
        js["schema"] = s.clone();
    }
    if let Some(d) = &f.description {
        js["description"] = json!(d);
    }
    if let Some(s) = f.strict {
        js["strict"] = json!(s);
    }
    json!({"type": "json_schema", "json_schema": js})
}

/// The text of a message's parts (`input[i].content`), each part checked.
fn parts_text(i: usize, parts: &[Part]) -> Result<String, ApiError> {
    let mut texts = Vec::with_capacity(parts.len());
    for (j, p) in parts.iter().enumerate() {
        let path = format!("input[{i}].content[{j}]");
        if !matches!(p.kind.as_str(), "input_text" | "output_text") {
            return Err(bad(
                format!("{path}.type"),
                format!(
                    "`{}` parts are not supported; lamina reads `input_text` and `output_text`.",
                    p.kind
                ),
            ));
        }
        let stray = [
            ("image_url", p.image_url.is_some()),
            ("file_id", p.file_id.is_some()),
            ("detail", p.detail.is_some()),
            ("file_data", p.file_data.is_some()),
            ("file_url", p.file_url.is_some()),
            ("filename", p.filename.is_some()),
        ]
        .into_iter()
        .find(|(_, given)| *given);
        if let Some((f, _)) = stray {
            return Err(bad(
                format!("{path}.{f}"),
                format!("`{f}` does not belong to an `{}` part.", p.kind),
            ));
        }
        let Some(t) = &p.text else {
            return Err(bad(
                format!("{path}.text"),
                format!("An `{}` part needs `text`.", p.kind),
            ));
        };
        texts.push(t.as_str());
    }
    Ok(texts.join("\n"))
}

/// Input item `i`, checked, as the wire item kept in the history.
pub(super) fn item_value(i: usize, item: &Item) -> Result<Value, ApiError> {
    let kind = item.kind.as_deref().unwrap_or("message");
    let text = match &item.content {
        None => None,
        Some(ItemContent::Text(t)) => Some(t.clone()),
        Some(ItemContent::Parts(p)) => Some(parts_text(i, p)?),
    };
    Ok(match kind {
        "message" => json!({"type": "message", "role": item.role, "content": text}),
        "function_call" => json!({"type": "function_call", "call_id": item.call_id,
            "name": item.name, "arguments": item.arguments}),
        "function_call_output" => json!({"type": "function_call_output",
            "call_id": item.call_id, "output": item.output}),
        other => {
            return Err(bad(
                format!("input[{i}].type"),
                format!(
                    "Unsupported input item type `{other}`; lamina reads `message`, `function_call` and `function_call_output`."
                ),
            ));
        }
    })
}

/// The chat messages of wire items (the history and the input), appended
/// to `out`; consecutive calls join one assistant message.
pub fn to_messages(items: &[Value], out: &mut Vec<Value>) -> Result<(), ApiError> {
    for (i, it) in items.iter().enumerate() {
        let field = |f: &str| -> Result<String, ApiError> {
            it[f].as_str().map(str::to_owned).ok_or_else(|| {
                bad(
                    format!("input[{i}].{f}"),
                    format!(
                        "A `{}` item needs `{f}`.",
                        it["type"].as_str().unwrap_or("")
                    ),
                )
            })
        };
        match it["type"].as_str().unwrap_or("message") {
            "message" => {
                let role = field("role")?;
                if !matches!(role.as_str(), "user" | "assistant" | "system" | "developer") {
                    return Err(bad(
                        format!("input[{i}].role"),
                        format!(
                            "Unknown role `{role}`; expected `user`, `assistant`, `system` or `developer`."
                        ),
                    ));
                }
                out.push(json!({"role": role, "content": field("content")?}));
            }
            "function_call" => {
                let call = json!({"id": field("call_id")?, "type": "function",
                    "function": {"name": field("name")?, "arguments": field("arguments")?}});
                match out.last_mut() {
                    Some(last) if last["role"] == "assistant" => {
                        if !last["tool_calls"].is_array() {
                            last["tool_calls"] = json!([]);
                        }
                        if let Some(calls) = last["tool_calls"].as_array_mut() {
                            calls.push(call);
                        }
                    }
                    _ => {
                        out.push(json!({"role": "assistant", "content": "", "tool_calls": [call]}))
                    }
                }
            }
            _ => out.push(json!({"role": "tool", "tool_call_id": field("call_id")?,
                "content": field("output")?})),
        }
    }
    Ok(())
}

/// The Responses name of a chat request's field in an error.
pub fn responses_param(chat: &str) -> String {
    if chat == "max_tokens" {
        return "max_output_tokens".into();
    }
    if chat == "tool_choice.function.name" {
        return "tool_choice.name".into();
    }
    if let Some(rest) = chat.strip_prefix("response_format") {
        return format!("text.format{}", rest.replacen(".json_schema", "", 1));
    }
    if let Some(rest) = chat.strip_prefix("messages") {
        return format!("input{rest}");
    }
    if chat.starts_with("tools[") {
        return chat.replacen(".function.", ".", 1);
    }
    chat.to_string()
}

impl ResponsesRequest {
    /// The request's own input as items (a string is one user message).
    pub fn input_items(&self) -> Result<Vec<Value>, ApiError> {
        match &self.input {
            None if self.previous_response_id.is_none() => {
                Err(bad("input", "Missing required parameter `input`."))
            }
            None => Ok(Vec::new()),
            Some(Input::Text(t)) => Ok(vec![
                json!({"type": "message", "role": "user", "content": t}),
            ]),
            Some(Input::Items(items)) => items
                .iter()
                .enumerate()
                .map(|(i, it)| item_value(i, it))
                .collect(),
        }
    }

    /// The chat request (wire JSON) for the conversation `items` (the
    /// continued history, then this request's input).
    pub fn to_chat(&self, items: &[Value]) -> Result<Value, ApiError> {
        if let Some(t) = self.truncation.as_deref().filter(|t| *t != "disabled") {
            return Err(bad(
                "truncation",
                format!("Only `truncation: \"disabled\"` is supported, got `{t}`."),
            ));
        }
        let mut messages = Vec::with_capacity(items.len() + 1);
        if let Some(i) = &self.instructions {
            messages.push(json!({"role": "system", "content": i}));
        }
        to_messages(items, &mut messages)?;
        let mut chat = json!({"messages": messages});
        let mut put = |k: &str, v: Value| {
            if !v.is_null() {
                chat[k] = v;
            }
        };
        put("model", json!(self.model));
        put("max_tokens", json!(self.max_output_tokens));
        put("temperature", json!(self.temperature));
        put("top_p", json!(self.top_p));
        put("stream", json!(self.stream));
        put("parallel_tool_calls", json!(self.parallel_tool_calls));
        if let Some(tools) = &self.tools {
            let tools: Vec<Value> = tools
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    if t.kind != "function" {
                        return Err(bad(
                            format!("tools[{i}].type"),
                            format!("Only `function` tools are supported, got `{}`.", t.kind),
                        ));
                    }
                    let mut f = json!({"name": t.name});
                    if let Some(p) = &t.parameters {
                        f["parameters"] = p.clone();
                    }
                    if let Some(d) = &t.description {
                        f["description"] = json!(d);
                    }
                    Ok(json!({"type": "function", "function": f}))
                })
                .collect::<Result<_, _>>()?;
            put("tools", Value::Array(tools));
        }
        match &self.tool_choice {
            None => {}
            Some(ToolChoice::Mode(m)) => put("tool_choice", json!(m)),
            Some(ToolChoice::Named(n)) => put(
                "tool_choice",
                json!({"type": n.kind, "function": {"name": n.name}}),
            ),
        }
        if let Some(f) = self.text.as_ref().and_then(|t| t.format.as_ref()) {
            put("response_format", response_format(f));
        }
        Ok(chat)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oairesponses::request::ResponsesRequest;
    use crate::protocol::{self, ChatRequest};

    fn req(body: Value) -> Result<ResponsesRequest, ApiError> {
        protocol::parse(body.to_string().as_bytes())
    }

    #[test]
    fn items_become_chat_messages() {
        let r = req(json!({
            "model": "m", "instructions": "Be brief.", "max_output_tokens": 9,
            "input": [
                {"role": "user", "content": "Weather in Paris?"},
                {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{}", "id": "fc_1", "status": "completed"},
                {"type": "function_call_output", "call_id": "c1", "output": "21C"},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Thanks"}]},
            ],
            "tools": [{"type": "function", "name": "w", "parameters": {"type": "object"}}],
            "tool_choice": {"type": "function", "name": "w"},
            "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
        }))
        .unwrap();
        let items = r.input_items().unwrap();
        let chat = r.to_chat(&items).unwrap();
        let roles: Vec<&str> = chat["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["role"].as_str().unwrap())
            .collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool", "user"]);
        assert_eq!(chat["messages"][2]["tool_calls"][0]["id"], "c1");
        assert_eq!(chat["tool_choice"]["function"]["name"], "w");
        assert_eq!(chat["response_format"]["json_schema"]["name"], "x");
        assert_eq!(r.ignored_fields(), ["input[].id"]);
        let chat: ChatRequest = serde_json::from_value(chat).unwrap();
        assert_eq!(chat.max_tokens, Some(9));
    }

    #[test]
    fn bad_requests_name_the_field() {
        for (body, param) in [
            (json!({"input": "a", "include": ["x"]}), "include"),
            (json!({"input": "a", "truncation": "auto"}), "truncation"),
            (json!({}), "input"),
            (json!({"input": [{"type": "reasoning"}]}), "input[0].type"),
            (
                json!({"input": [{"role": "tool", "content": "x"}]}),
                "input[0].role",
            ),
            (
                json!({"input": [{"type": "function_call_output", "output": "x"}]}),
                "input[0].call_id",
            ),
            (
                json!({"input": "a", "tools": [{"type": "web_search", "name": "w"}]}),
                "tools[0].type",
            ),
        ] {
            let e = req(body.clone())
                .and_then(|r| {
                    let items = r.input_items()?;
                    r.to_chat(&items)
                })
                .unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {}", e.message);
        }
    }

    #[test]
    fn chat_params_are_renamed() {
        assert_eq!(responses_param("max_tokens"), "max_output_tokens");
        assert_eq!(
            responses_param("response_format.json_schema.name"),
            "text.format.name"
        );
        assert_eq!(responses_param("messages[2].content"), "input[2].content");
        assert_eq!(
            responses_param("tools[1].function.parameters"),
            "tools[1].parameters"
        );
    }
}
