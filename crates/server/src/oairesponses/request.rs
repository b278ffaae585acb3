//! Responses API request bodies as sent on the wire, and their translation
//! into the chat-completion request the chat path runs (built from its wire
//! names; the items' part is in [`super::convert`]).
//!
//! Contract: unknown fields are a 400 naming them (`include`,
//! `background`, `prompt`, `conversation`, `top_logprobs`, ...). Honoured:
//! `input` (a string, or items: messages with text content, `function_call`
//! and `function_call_output`), `instructions` (a system message first; not
//! carried over from `previous_response_id`), function `tools`,
//! `tool_choice`, `parallel_tool_calls`, `text.format`, `max_output_tokens`,
//! `temperature`, `top_p`, `stream`, `store`, `previous_response_id`,
//! `metadata` (kept and returned, never shown to the model), `truncation`
//! (`disabled` only). Accepted and ignored on purpose, counted in the
//! metrics: `user`, `service_tier`, `safety_identifier`,
//! `prompt_cache_key`, `reasoning` (no served model reasons), and an item's
//! `id` / `status` and an output text's `annotations` / `logprobs` (what a
//! client sends back of an earlier response). Errors the chat path raises
//! name the chat field; [`responses_param`] renames those that differ.
//!
//! Costs: O(size of the request and of the continued conversation).

use std::collections::BTreeMap;

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::Value;

use crate::error::ApiError;

/// `input`: a string (one user message) or items.
#[derive(Debug, Clone, utoipa::ToSchema)]
#[schema(as = ResponsesInput)]
#[serde(untagged)]
pub enum Input {
    Text(String),
    Items(Vec<Item>),
}

crate::wire::string_or_list!(Input, Text, Items, Item, "a list of input items");

/// A message's `content`: a string or parts.
#[derive(Debug, Clone, utoipa::ToSchema)]
#[schema(as = ResponsesItemContent)]
#[serde(untagged)]
pub enum ItemContent {
    Text(String),
    Parts(Vec<Part>),
}

crate::wire::string_or_list!(ItemContent, Text, Parts, Part, "a list of content parts");

/// `{"type": "input_text" | "output_text", "text"}`. The fields of the
/// part types lamina refuses (`input_image`, `input_file`) are read too,
/// so the refusal names the type.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[schema(as = ResponsesPart)]
#[serde(deny_unknown_fields)]
pub struct Part {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
    /// Of an earlier output: accepted and ignored.
    #[serde(default)]
    #[schema(value_type = Option<Vec<Object>>)]
    pub annotations: Option<IgnoredAny>,
    /// Of an earlier output: accepted and ignored.
    #[serde(default)]
    #[schema(value_type = Option<Vec<Object>>)]
    pub logprobs: Option<IgnoredAny>,
    /// Fields of refused part types: read only to name the type.
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub image_url: Option<IgnoredAny>,
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub file_id: Option<IgnoredAny>,
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub detail: Option<IgnoredAny>,
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub file_data: Option<IgnoredAny>,
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub file_url: Option<IgnoredAny>,
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub filename: Option<IgnoredAny>,
}

/// One input item: a message (`type` `message` or absent), a
/// `function_call` or a `function_call_output`; each type's fields are
/// checked in [`super::convert::to_messages`].
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[schema(as = ResponsesItem)]
#[serde(deny_unknown_fields)]
pub struct Item {
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    /// A message's role: `user`, `assistant`, `system` or `developer`.
    #[serde(default)]
    pub role: Option<String>,
    #[serde(default)]
    pub content: Option<ItemContent>,
    /// A call's id (both call item types).
    #[serde(default)]
    pub call_id: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    /// A `function_call`'s arguments, a JSON text.
    #[serde(default)]
    pub arguments: Option<String>,
    /// A `function_call_output`'s result.
    #[serde(default)]
    pub output: Option<String>,
    /// Accepted and ignored (an earlier output item's id).
    #[serde(default)]
    pub id: Option<String>,
    /// Accepted and ignored.
    #[serde(default)]
    pub status: Option<String>,
}

/// A function tool.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[schema(as = ResponsesTool)]
#[serde(deny_unknown_fields)]
pub struct Tool {
    /// `function` (other tool types are refused).
    #[serde(rename = "type")]
    pub kind: String,
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub parameters: Option<Value>,
    /// Accepted; the arguments are always held to the schema when enforced.
    #[serde(default)]
    pub strict: Option<bool>,
}

/// `tool_choice`: a mode or `{"type": "function", "name"}`.
#[derive(Debug, Clone, utoipa::ToSchema)]
#[schema(as = ResponsesToolChoice)]
#[serde(untagged)]
pub enum ToolChoice {
    Mode(String),
    Named(NamedTool),
}

crate::wire::string_or_object!(ToolChoice, Mode, Named, NamedTool, "a named tool");

#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[schema(as = ResponsesNamedTool)]
#[serde(deny_unknown_fields)]
pub struct NamedTool {
    #[serde(rename = "type")]
    pub kind: String,
    pub name: String,
}

/// `text`: the output format.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[schema(as = ResponsesTextConfig)]
#[serde(deny_unknown_fields)]
pub struct TextConfig {
    #[serde(default)]
    pub format: Option<Format>,
}

/// `text.format`: `text`, `json_object` or `json_schema` (flat, with
/// `name`, `schema`, `description`, `strict`).
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[schema(as = ResponsesFormat)]
#[serde(deny_unknown_fields)]
pub struct Format {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub schema: Option<Value>,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub strict: Option<bool>,
}

/// `POST /v1/responses`.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResponsesRequest {
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub input: Option<Input>,
    #[serde(default)]
    pub instructions: Option<String>,
    #[serde(default)]
    pub tools: Option<Vec<Tool>>,
    #[serde(default)]
    pub tool_choice: Option<ToolChoice>,
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    #[serde(default)]
    pub text: Option<TextConfig>,
    #[serde(default)]
    pub max_output_tokens: Option<i64>,
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub top_p: Option<f32>,
    #[serde(default)]
    pub stream: Option<bool>,
    /// Keep the response for `previous_response_id` and `GET` (default true).
    #[serde(default)]
    pub store: Option<bool>,
    #[serde(default)]
    pub previous_response_id: Option<String>,
    /// Kept with the response and returned; not shown to the model.
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
    /// `disabled` only (a conversation too long is a 400).
    #[serde(default)]
    pub truncation: Option<String>,
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub user: Option<IgnoredAny>,
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub service_tier: Option<IgnoredAny>,
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub safety_identifier: Option<IgnoredAny>,
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub prompt_cache_key: Option<IgnoredAny>,
    /// Accepted and ignored: no served model reasons.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub reasoning: Option<IgnoredAny>,
}

fn bad(param: impl Into<String>, msg: impl Into<String>) -> ApiError {
    ApiError::invalid_param(param, msg)
}

/// Most `metadata` pairs (OpenAI's limit).
pub const MAX_METADATA_PAIRS: usize = 16;
/// Longest `metadata` key, in characters (OpenAI's limit).
pub const MAX_METADATA_KEY_CHARS: usize = 64;
/// Longest `metadata` value, in characters (OpenAI's limit).
pub const MAX_METADATA_VALUE_CHARS: usize = 512;

impl ResponsesRequest {
    /// The ignored fields given (counted in the metrics).
    pub fn ignored_fields(&self) -> Vec<&'static str> {
        let mut out: Vec<&'static str> = crate::protocol::given([
            ("user", self.user.is_some()),
            ("service_tier", self.service_tier.is_some()),
            ("safety_identifier", self.safety_identifier.is_some()),
            ("prompt_cache_key", self.prompt_cache_key.is_some()),
            ("reasoning", self.reasoning.is_some()),
        ])
        .collect();
        if let Some(Input::Items(items)) = &self.input
            && items.iter().any(|i| i.id.is_some() || i.status.is_some())
        {
            out.push("input[].id");
        }
        out
    }

    /// Refuses `metadata` past OpenAI's limits, naming the limit (the
    /// key or value itself is not echoed).
    pub fn check_metadata(&self) -> Result<(), ApiError> {
        let Some(m) = &self.metadata else {
            return Ok(());
        };
        if m.len() > MAX_METADATA_PAIRS {
            return Err(bad(
                "metadata",
                format!(
                    "`metadata` has {} pairs; at most {MAX_METADATA_PAIRS} are allowed.",
                    m.len()
                ),
            ));
        }
        for (k, v) in m {
            if k.chars().count() > MAX_METADATA_KEY_CHARS {
                return Err(bad(
                    "metadata",
                    format!("A `metadata` key is longer than {MAX_METADATA_KEY_CHARS} characters."),
                ));
            }
            if v.chars().count() > MAX_METADATA_VALUE_CHARS {
                return Err(bad(
                    "metadata",
                    format!(
                        "A `metadata` value is longer than {MAX_METADATA_VALUE_CHARS} characters."
                    ),
                ));
            }
        }
        Ok(())
    }
}
