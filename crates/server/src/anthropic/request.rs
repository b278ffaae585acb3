//! Anthropic Messages request bodies as sent on the wire; their
//! translation into the chat-completion request the chat path runs
//! ([`crate::protocol::ChatRequest`], built from its wire names) is in
//! [`super::convert`].
//!
//! Contract: unknown fields are a 400 naming them (`thinking`,
//! `container`, `mcp_servers`, a tool's `input_examples`, ...); accepted
//! and ignored on purpose, since they only describe or route a request and
//! cannot change the output, counted in the metrics: `metadata`,
//! `service_tier`, `inference_geo`, `speed`, `user_profile_id`,
//! `workspace_id`, `diagnostics`, `output_config.effort` (no served model
//! reasons), a tool's `eager_input_streaming` and every `cache_control`
//! (lamina's prefix cache needs no hints). Honoured besides the
//! conversation: `output_config.format` (a JSON schema the reply is held
//! to), a tool's `strict` (its input is always held to its schema). A block
//! field that does not belong to the block's type is a 400 naming it, as is
//! a block type lamina does not read (`image`, `document`, `thinking`).
//! Mapping: `system` -> a system message; a user turn's `tool_result`
//! blocks -> `tool` messages (in block order, text between them -> user
//! messages); an assistant turn's `tool_use` blocks -> its `tool_calls`;
//! `tools[].input_schema` -> `parameters`; `tool_choice` `auto` / `any` /
//! `tool` / `none` -> `auto` / `required` / the named function / `none`,
//! `disable_parallel_tool_use` -> `parallel_tool_calls: false`;
//! `stop_sequences` -> `stop`. Errors the chat path raises name the chat
//! field; [`anthropic_param`] renames the ones whose names differ.
//!
//! Costs: O(size of the request).

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::Value;

use crate::protocol::given;

/// `system`: a string or text blocks (also a `tool_result`'s content).
#[derive(Debug, Clone, utoipa::ToSchema)]
#[schema(as = AnthropicSystem)]
#[serde(untagged)]
pub enum System {
    Text(String),
    Blocks(Vec<Block>),
}

crate::wire::string_or_list!(System, Text, Blocks, Block, "a list of text blocks");

/// A message's `content`: a string or content blocks.
#[derive(Debug, Clone, utoipa::ToSchema)]
#[schema(as = AnthropicContent)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Blocks(Vec<Block>),
}

crate::wire::string_or_list!(Content, Text, Blocks, Block, "a list of content blocks");

/// One content block: `text`, `tool_use` or `tool_result`; each type's
/// fields are checked in [`super::convert::to_chat`]. The fields of the
/// block types lamina refuses (`image`, `document`, `thinking`, ...) are
/// read too, so the refusal names the type whatever the order of the
/// fields.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[schema(as = AnthropicBlock)]
#[serde(deny_unknown_fields)]
pub struct Block {
    #[serde(rename = "type")]
    pub kind: String,
    /// `text`: the text.
    #[serde(default)]
    pub text: Option<String>,
    /// `tool_use`: the call's id.
    #[serde(default)]
    pub id: Option<String>,
    /// `tool_use`: the function called.
    #[serde(default)]
    pub name: Option<String>,
    /// `tool_use`: the arguments (an object).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub input: Option<Value>,
    /// `tool_use`: who called the tool; `{"type": "direct"}` (the model,
    /// the only caller here) or null. A server tool as caller is refused.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub caller: Option<Value>,
    /// `tool_use` and `tool_result`: accepted and ignored (the toolset a
    /// tool belongs to).
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub toolset_name: Option<IgnoredAny>,
    /// `tool_result`: the id of the call it answers.
    #[serde(default)]
    pub tool_use_id: Option<String>,
    /// `tool_result`: the result, a string or text blocks.
    #[serde(default)]
    #[schema(no_recursion)]
    pub content: Option<System>,
    /// `tool_result`: the call failed (the result is shown as an error).
    #[serde(default)]
    pub is_error: Option<bool>,
    /// Accepted and ignored.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub cache_control: Option<IgnoredAny>,
    /// `text` of an earlier reply: accepted and ignored (lamina cites nothing).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub citations: Option<IgnoredAny>,
    /// Fields of refused block types (`image`, `document`, `thinking`,
    /// `redacted_thinking`, `search_result`): read only to name the type.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub source: Option<IgnoredAny>,
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub title: Option<IgnoredAny>,
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub context: Option<IgnoredAny>,
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub thinking: Option<IgnoredAny>,
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub signature: Option<IgnoredAny>,
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub data: Option<IgnoredAny>,
}

/// One message of `messages`.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[schema(as = AnthropicMessage)]
#[serde(deny_unknown_fields)]
pub struct Message {
    /// `user` or `assistant`.
    pub role: String,
    pub content: Content,
}

/// One entry of `tools` (a client tool; server tools are refused).
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[schema(as = AnthropicTool)]
#[serde(deny_unknown_fields)]
pub struct Tool {
    /// Absent or `custom`.
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    /// A JSON schema of the arguments (an object).
    #[schema(value_type = Object)]
    pub input_schema: Value,
    /// Accepted; the input is always held to the schema.
    #[serde(default)]
    pub strict: Option<bool>,
    /// Accepted and ignored.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub cache_control: Option<IgnoredAny>,
    /// Accepted and ignored (how finely the input streams).
    #[serde(default)]
    #[schema(value_type = Option<bool>)]
    pub eager_input_streaming: Option<IgnoredAny>,
}

/// `output_config`.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[schema(as = AnthropicOutputConfig)]
#[serde(deny_unknown_fields)]
pub struct OutputConfig {
    /// Accepted and ignored: no served model reasons.
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub effort: Option<IgnoredAny>,
    /// `{"type": "json_schema", "schema"}`: the reply is held to the schema.
    #[serde(default)]
    pub format: Option<OutputFormat>,
}

/// `output_config.format`.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[schema(as = AnthropicOutputFormat)]
#[serde(deny_unknown_fields)]
pub struct OutputFormat {
    /// `json_schema`.
    #[serde(rename = "type")]
    pub kind: String,
    #[schema(value_type = Object)]
    pub schema: Value,
}

/// `tool_choice`.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[schema(as = AnthropicToolChoice)]
#[serde(deny_unknown_fields)]
pub struct ToolChoice {
    /// `auto`, `any`, `tool` or `none`.
    #[serde(rename = "type")]
    pub kind: String,
    /// With `tool`: the function to call.
    #[serde(default)]
    pub name: Option<String>,
    /// At most one `tool_use` block in the reply.
    #[serde(default)]
    pub disable_parallel_tool_use: Option<bool>,
}

/// The fields both Anthropic requests share, declared once: the
/// conversation (`model`, `messages`, `system`, `tools`, `tool_choice`)
/// and the routing fields accepted and ignored. `$name` gets them after its
/// own fields, with `conversation()` and `routing_ignored()`.
macro_rules! anthropic_request {
    ($(#[$m:meta])* pub struct $name:ident { $($(#[$fm:meta])* pub $f:ident: $t:ty,)* }) => {
        $(#[$m])*
        pub struct $name {
            pub model: String,
            pub messages: Vec<Message>,
            #[serde(default)]
            pub system: Option<System>,
            #[serde(default)]
            pub tools: Option<Vec<Tool>>,
            #[serde(default)]
            pub tool_choice: Option<ToolChoice>,
            $($(#[$fm])* pub $f: $t,)*
            /// Accepted and ignored (a prompt-cache hint).
            #[serde(default)]
            #[schema(value_type = Option<Object>)]
            pub cache_control: Option<IgnoredAny>,
            /// Accepted and ignored (routing).
            #[serde(default)]
            #[schema(value_type = Option<String>)]
            pub inference_geo: Option<IgnoredAny>,
            /// Accepted and ignored (one speed here).
            #[serde(default)]
            #[schema(value_type = Option<String>)]
            pub speed: Option<IgnoredAny>,
            /// Accepted and ignored (routing).
            #[serde(default)]
            #[schema(value_type = Option<String>)]
            pub user_profile_id: Option<IgnoredAny>,
            /// Accepted and ignored (routing).
            #[serde(default)]
            #[schema(value_type = Option<String>)]
            pub workspace_id: Option<IgnoredAny>,
            /// Accepted and ignored (no cache diagnostics are reported).
            #[serde(default)]
            #[schema(value_type = Option<Object>)]
            pub diagnostics: Option<IgnoredAny>,
        }

        impl $name {
            pub fn conversation(&self) -> Conversation<'_> {
                Conversation {
                    model: &self.model,
                    system: self.system.as_ref(),
                    messages: &self.messages,
                    tools: self.tools.as_deref(),
                    tool_choice: self.tool_choice.as_ref(),
                }
            }

            /// The routing fields given.
            pub(super) fn routing_ignored(&self, ignored: &mut Vec<&'static str>) {
                ignored.extend(given([
                    ("cache_control", self.cache_control.is_some()),
                    ("inference_geo", self.inference_geo.is_some()),
                    ("speed", self.speed.is_some()),
                    ("user_profile_id", self.user_profile_id.is_some()),
                    ("workspace_id", self.workspace_id.is_some()),
                    ("diagnostics", self.diagnostics.is_some()),
                ]));
            }
        }
    };
}

anthropic_request! {
    /// `POST /v1/messages`.
    #[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
    #[schema(as = AnthropicMessagesRequest)]
    #[serde(deny_unknown_fields)]
    pub struct MessagesRequest {
        /// Required, as Anthropic requires it.
        pub max_tokens: i64,
        #[serde(default)]
        pub stop_sequences: Option<Vec<String>>,
        #[serde(default)]
        pub stream: Option<bool>,
        #[serde(default)]
        pub temperature: Option<f32>,
        #[serde(default)]
        pub top_p: Option<f32>,
        #[serde(default)]
        pub top_k: Option<i64>,
        /// Accepted and ignored (`user_id` for abuse tracking).
        #[serde(default)]
        #[schema(value_type = Option<Object>)]
        pub metadata: Option<IgnoredAny>,
        /// Accepted and ignored.
        #[serde(default)]
        #[schema(value_type = Option<String>)]
        pub service_tier: Option<IgnoredAny>,
        #[serde(default)]
        pub output_config: Option<OutputConfig>,
    }
}

anthropic_request! {
    /// `POST /v1/messages/count_tokens`: the prompt part of a messages request.
    #[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
    #[schema(as = AnthropicCountTokensRequest)]
    #[serde(deny_unknown_fields)]
    pub struct CountTokensRequest {
        /// Accepted and ignored (the prompt's tokens do not depend on it).
        #[serde(default)]
        #[schema(value_type = Option<Object>)]
        pub output_config: Option<IgnoredAny>,
    }
}

/// The conversation fields both requests share.
pub struct Conversation<'a> {
    pub model: &'a str,
    pub system: Option<&'a System>,
    pub messages: &'a [Message],
    pub tools: Option<&'a [Tool]>,
    pub tool_choice: Option<&'a ToolChoice>,
}

impl CountTokensRequest {
    /// The ignored fields given.
    pub fn ignored(&self, ignored: &mut Vec<&'static str>) {
        self.routing_ignored(ignored);
        ignored.extend(given([("output_config", self.output_config.is_some())]));
    }
}
