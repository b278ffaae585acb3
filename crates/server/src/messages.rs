//! A chat request's messages as the template's input: roles checked, text
//! parts joined, the history's tool calls placed ([`chat_messages`]), and
//! the last assistant turn taken off to start the reply
//! (`continue_final_message`, [`final_message`]).
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
