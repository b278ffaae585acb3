//! Response bodies, typed: what the handlers serialize and what the OpenAPI
//! document ([`crate::openapi`]) describes, from the same structs.
//!
//! Log-probabilities keep OpenAI's two free-form shapes (see
//! [`crate::logprobs`]) and are documented as objects.

use engine::Usage;
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

/// OpenAI's `usage`: the prompt counted once, the completion tokens of
/// every choice generated.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct UsageInfo {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
}

/// Prompt tokens served from the prefix cache.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct PromptTokensDetails {
    pub cached_tokens: usize,
}

impl From<&Usage> for UsageInfo {
    fn from(u: &Usage) -> Self {
        UsageInfo {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            total_tokens: u.prompt_tokens + u.completion_tokens,
            prompt_tokens_details: PromptTokensDetails {
                cached_tokens: u.cached_tokens,
            },
        }
    }
}

/// The assistant's message of a chat choice.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AssistantMessage {
    pub role: &'static str,
    /// The reply's text; `null` when it is a tool call.
    pub content: Option<String>,
    /// The reply's reasoning, with a reasoning parser
    /// (`--reasoning-parser`, [`crate::reasoning`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// The function called, when the reply is a tool call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallOut>>,
}

/// One function call of an assistant message.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ToolCallOut {
    pub id: String,
    /// `function`
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionCallOut,
}

/// `{"name", "arguments"}`: the arguments as a JSON text.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct FunctionCallOut {
    pub name: String,
    pub arguments: String,
}

/// One choice of a `chat.completion`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChatChoice {
    pub index: usize,
    pub message: AssistantMessage,
    /// `{"content": [...]}` when log-probabilities were asked for.
    #[schema(value_type = Option<Object>)]
    pub logprobs: Value,
    /// `stop`, `length` or `tool_calls`.
    pub finish_reason: Option<&'static str>,
}

/// `POST /v1/chat/completions`, not streamed.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChatCompletion {
    pub id: String,
    /// `chat.completion`
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    pub usage: UsageInfo,
}

/// The new part of a streamed chat message.
#[derive(Debug, Clone, Default, Serialize, ToSchema)]
pub struct ChatDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Reasoning text, with a reasoning parser ([`crate::reasoning`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// A tool call, streamed as OpenAI does: the first chunk carries
    /// `index`, `id`, `type` and `function.name` with empty arguments, the
    /// next the arguments.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<Object>>)]
    pub tool_calls: Option<Vec<Value>>,
}

/// One choice of a `chat.completion.chunk`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChatChunkChoice {
    pub index: usize,
    pub delta: ChatDelta,
    #[schema(value_type = Option<Object>)]
    pub logprobs: Value,
    pub finish_reason: Option<&'static str>,
}

/// One event of a streamed chat completion.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChatCompletionChunk {
    pub id: String,
    /// `chat.completion.chunk`
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChunkChoice>,
    /// With `stream_options.include_usage`: `null`, then the usage in a last
    /// chunk without choices; absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<UsageInfo>)]
    pub usage: Option<Option<UsageInfo>>,
}

/// One choice of a `text_completion`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CompletionChoice {
    pub index: usize,
    pub text: String,
    /// `{tokens, token_logprobs, top_logprobs, text_offset}` when asked for.
    #[schema(value_type = Option<Object>)]
    pub logprobs: Value,
    pub finish_reason: Option<&'static str>,
}

/// `POST /v1/completions`: the whole answer, or one event of a stream.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TextCompletion {
    pub id: String,
    /// `text_completion`
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    /// Always in a whole answer; in a stream as for chat chunks.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<UsageInfo>)]
    pub usage: Option<Option<UsageInfo>>,
}

/// A model this server serves.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ModelCard {
    pub id: String,
    /// `model`
    pub object: &'static str,
    pub created: u64,
    pub owned_by: String,
    /// The longest prompt + completion a request may have (tokens; 0 for a
    /// model never loaded yet).
    pub max_model_len: usize,
    /// `root`: the base model's id (vLLM's field; for an adapter, the
    /// base model it runs on).
    pub root: String,
    /// For a LoRA adapter, the base model's id; `null` for the base model.
    pub parent: Option<String>,
    /// `{"value": "loaded" | "loading" | "unloading" | "unloaded"}`
    /// (llama-server's router field).
    pub status: ModelStatus,
}

/// A model's state (`ModelCard::status`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ModelStatus {
    pub value: &'static str,
}

/// `GET /v1/models`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ModelList {
    /// `list`
    pub object: &'static str,
    pub data: Vec<ModelCard>,
}

/// `POST /tokenize`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TokenizeResponse {
    pub count: usize,
    pub tokens: Vec<u32>,
    pub max_model_len: usize,
}

/// `POST /detokenize` (vLLM's shape).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct DetokenizeResponse {
    pub prompt: String,
}

/// `GET /version`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct VersionResponse {
    pub version: &'static str,
}

/// `GET /health`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct HealthResponse {
    /// `ok`; `degraded` when some replicas failed and others serve (200);
    /// `failed` when every replica failed, or `shutting_down` (both 503).
    pub status: &'static str,
    /// The replicas out of rotation and why (absent when none).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub failed_engines: Vec<FailedEngine>,
}

/// A replica taken out of rotation.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct FailedEngine {
    /// Its index (the `engine` label of its metrics).
    pub engine: usize,
    /// The failure that ended its requests.
    pub error: String,
}

/// One route, as listed by `GET /`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct EndpointInfo {
    pub method: String,
    pub path: String,
    pub description: String,
}

/// `GET /`: who is serving what, and where.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct IndexResponse {
    pub name: &'static str,
    pub version: &'static str,
    /// `running` or `shutting_down`.
    pub status: &'static str,
    /// The default (first) model and its context.
    pub model: String,
    pub max_model_len: usize,
    /// Every model served, loaded or not.
    pub models: Vec<String>,
    pub endpoints: Vec<EndpointInfo>,
}
