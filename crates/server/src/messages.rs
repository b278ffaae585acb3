//! A chat request's messages as the template's input: roles checked, text
//! parts joined, the history's tool calls placed ([`chat_messages`]), and
//! the last assistant turn taken off to start the reply
//! (`continue_final_message`, [`final_message`]), and the template's extra
//! variables checked ([`template_kwargs`]).
//!
//! Costs: O(size of the messages).

use tokenizer::ChatMessage;

use crate::error::ApiError;
use crate::protocol::{Content, Message};
use crate::tools;

/// Chat roles the server accepts (`developer` is read as `system`).
const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

/// The request's messages as template input; text parts are joined by
/// newlines. An assistant turn's `tool_calls` go to the template when it
/// renders tools (`calls_in_template`), else they become the turn's text
/// (see [`crate::tools`]); a `tool` turn keeps its `tool_call_id`.
pub fn chat_messages(
    msgs: &[Message],
    calls_in_template: bool,
) -> Result<Vec<ChatMessage>, ApiError> {
    if msgs.is_empty() {
        return Err(ApiError::invalid_param(
            "messages",
            "`messages` must not be empty.",
        ));
    }
    msgs.iter()
        .enumerate()
        .map(|(i, m)| {
            if !ROLES.contains(&m.role.as_str()) {
                return Err(ApiError::invalid_param(
                    format!("messages[{i}].role"),
                    format!("Unknown role `{}`; expected one of {ROLES:?}.", m.role),
                ));
            }
            let role = if m.role == "developer" {
                "system"
            } else {
                m.role.as_str()
            };
            let content = match &m.content {
                None => String::new(),
                Some(Content::Text(t)) => t.clone(),
                Some(Content::Parts(parts)) => {
                    let mut texts = Vec::with_capacity(parts.len());
                    for (j, p) in parts.iter().enumerate() {
                        match (p.kind.as_str(), &p.text) {
                            ("text", Some(t)) => texts.push(t.as_str()),
                            _ => {
                                return Err(ApiError::invalid_param(
                                    format!("messages[{i}].content[{j}]"),
                                    format!(
                                        "Only text content parts are supported, got type `{}`.",
                                        p.kind
                                    ),
                                ));
                            }
                        }
                    }
                    texts.join("\n")
                }
            };
            if m.tool_call_id.is_some() && m.role != "tool" {
                return Err(ApiError::invalid_param(
                    format!("messages[{i}].tool_call_id"),
                    "Only `tool` messages carry `tool_call_id`.",
                ));
            }
            let mut msg = ChatMessage::new(role, content);
            msg.tool_call_id = m.tool_call_id.clone();
            if let Some((calls, text)) = tools::history_calls(i, m)? {
                if calls_in_template {
                    msg.tool_calls = Some(calls);
                } else if msg.content.is_empty() {
                    msg.content = text;
                } else {
                    msg.content = format!("{}\n{text}", msg.content);
                }
            }
            Ok(msg)
        })
        .collect()
}

/// `continue_final_message`: the last message, an assistant's text, taken
/// off the conversation to start the reply; a 400 naming the field when
/// the conversation does not end so.
pub fn final_message(req: &[Message], messages: &mut Vec<ChatMessage>) -> Result<String, ApiError> {
    let last = req
        .last()
        .filter(|m| m.role == "assistant" && m.tool_calls.is_none());
    match (last, messages.pop()) {
        (Some(_), Some(m)) if !messages.is_empty() => Ok(m.content),
        _ => Err(ApiError::invalid_param(
            "continue_final_message",
            "`continue_final_message` needs a conversation that ends with an assistant message of text (after at least one other message).",
        )),
    }
}

/// `chat_template_kwargs` checked: values are booleans, numbers or null
/// (no text, so nothing a user writes reaches the prompt unshielded), and
/// no name the render sets itself (`messages`, `tools`, ...). Errors name
/// `chat_template_kwargs.<name>`.
pub fn template_kwargs(
    kwargs: Option<&serde_json::Map<String, serde_json::Value>>,
) -> Result<(), ApiError> {
    for (k, v) in kwargs.into_iter().flatten() {
        let field = || {
            format!(
                "chat_template_kwargs.{}",
                k.chars().take(64).collect::<String>()
            )
        };
        if tokenizer::chat::RESERVED_VARS.contains(&k.as_str()) {
            return Err(ApiError::invalid_param(
                field(),
                format!("`{k}` is set by the server and cannot be given."),
            ));
        }
        if !(v.is_boolean() || v.is_number() || v.is_null()) {
            return Err(ApiError::invalid_param(
                field(),
                "Template variables must be booleans, numbers or null.",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_kwargs_are_scalars_under_free_names() {
        let kw = |v: serde_json::Value| v.as_object().cloned();
        assert!(template_kwargs(None).is_ok());
        let ok = kw(serde_json::json!({"enable_thinking": false, "n": 3, "x": null}));
        assert!(template_kwargs(ok.as_ref()).is_ok());
        for (bad, field) in [
            (
                serde_json::json!({"enable_thinking": "no"}),
                "chat_template_kwargs.enable_thinking",
            ),
            (
                serde_json::json!({"tools": true}),
                "chat_template_kwargs.tools",
            ),
            (serde_json::json!({"a": [1]}), "chat_template_kwargs.a"),
        ] {
            let e = template_kwargs(kw(bad).as_ref()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(field));
        }
    }
}
