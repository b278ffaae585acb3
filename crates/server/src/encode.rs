//! Tokenization and chat-template rendering off the async workers.
//!
//! Contract: [`encode`] turns a request's prompt text or chat messages into
//! token ids without ever running the tokenizer on an async worker thread:
//! the work goes to the bounded work pool ([`crate::work`]; generation
//! requests call [`encode_now`] from their own pool job), so a client
//! sending huge prompts delays only its own requests, never another
//! request's stream or `/health`. Text longer than the model's whole
//! context can possibly hold (context tokens x the longest vocabulary piece,
//! [`tokenizer::Tokenizer::max_text_bytes`]) is refused before any
//! tokenization, naming the parameter.
//! Costs: one work-pool hop per request (microseconds) besides the
//! tokenization itself; the byte check is O(1) per message.

use std::sync::Arc;

use tokenizer::ChatMessage;

use crate::error::ApiError;
use crate::models::Lease;
use crate::state::AppState;

/// What to encode.
pub enum Input {
    /// A completion prompt; `add_special`: the tokenizer's BOS and the like.
    Text { text: String, add_special: bool },
    /// Chat messages rendered with the template; `trusted`: special-token
    /// text in contents becomes control tokens (`parse_special_tokens`).
    Chat {
        messages: Vec<ChatMessage>,
        trusted: bool,
        /// Function definitions for a template that renders `tools`.
        tools: Option<serde_json::Value>,
        /// The template's extra variables (`chat_template_kwargs`, checked).
        kwargs: Option<serde_json::Map<String, serde_json::Value>>,
        /// The start of the assistant's reply, continued by the model
        /// (`continue_final_message`): encoded after the rendered prompt.
        prefill: Option<String>,
        /// Render the template's `add_generation_prompt` (the assistant's
        /// turn header); false only where a client asks (`/tokenize`).
        generation_prompt: bool,
    },
}

impl Input {
    fn text_bytes(&self) -> usize {
        match self {
            Input::Text { text, .. } => text.len(),
            Input::Chat {
                messages, prefill, ..
            } => {
                messages.iter().map(|m| m.content.len()).sum::<usize>()
                    + prefill.as_ref().map_or(0, String::len)
            }
        }
    }
}

/// Encodes `input` for `model` on the work pool (see the module doc);
/// errors name `param`.
pub async fn encode(
    state: &Arc<AppState>,
    model: &Lease,
    input: Input,
    param: &'static str,
) -> Result<Vec<u32>, ApiError> {
    let model = model.clone();
    state
        .work
        .run(param, move || encode_now(&model, input, param))
        .await?
}

/// Encodes `input` for `model` in this thread (a work-pool job); errors
/// name `param`.
pub fn encode_now(model: &Lease, input: Input, param: &str) -> Result<Vec<u32>, ApiError> {
    let ctx = model.max_context();
    let bytes = input.text_bytes();
    if let Some(limit) = model.tokenizer.max_text_bytes(ctx)
        && bytes > limit
    {
        return Err(ApiError::invalid_param(
            param,
            format!(
                "The prompt text is {bytes} bytes: more than this model's context of {ctx} tokens can hold \
                 (at most {limit} bytes); it was not tokenized."
            ),
        ));
    }
    let tok = &model.tokenizer;
    match input {
        Input::Text { text, add_special } => tok
            .encode(&text, add_special)
            .map_err(|e| format!("Cannot tokenize the prompt: {e}")),
        Input::Chat {
            messages,
            trusted,
            tools,
            kwargs,
            prefill,
            generation_prompt,
        } => {
            let vars = tokenizer::ChatVars {
                tools: tools.as_ref(),
                kwargs: kwargs.as_ref(),
            };
            let end = (generation_prompt, prefill.as_deref());
            chat_ids(tok, &messages, trusted, vars, end)
        }
    }
    .map_err(|msg| ApiError::invalid_param(param, msg))
}

/// The prompt ids of a conversation: the rendered template (with the
/// generation prompt when `end.0`), then the reply's start (`end.1`,
/// `prefill`) as text (special-token texts parsed only when `trusted`).
fn chat_ids(
    tok: &tokenizer::Tokenizer,
    messages: &[ChatMessage],
    trusted: bool,
    vars: tokenizer::ChatVars<'_>,
    end: (bool, Option<&str>),
) -> Result<Vec<u32>, String> {
    let (generation_prompt, prefill) = end;
    let mut ids = if trusted {
        tok.encode_chat_trusted_ending(messages, vars, generation_prompt)
    } else {
        tok.encode_chat_ending(messages, vars, generation_prompt)
    }
    .map_err(|e| format!("Cannot apply the chat template: {e}"))?;
    if let Some(text) = prefill {
        let more = if trusted {
            tok.encode(text, false)
        } else {
            tok.encode_literal(text)
        };
        ids.extend(more.map_err(|e| format!("Cannot tokenize the prompt: {e}"))?);
    }
    Ok(ids)
}
