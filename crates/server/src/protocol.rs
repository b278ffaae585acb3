//! Request bodies of the OpenAI-compatible endpoints, as sent on the wire,
//! and their parsing: malformed JSON and wrongly typed fields become 400
//! errors naming the field (via `serde_path_to_error`). Range checks happen
//! later, in [`crate::params`].
//!
//! Never silently ignored: a field lamina does not implement (`functions`,
//! `function_call`, `logprobs` on the Responses API, ...) is a 400 naming it.
//! Accepted and ignored on purpose, because they only describe or route a
//! request and cannot change the output: `user` (an end-user id for abuse
//! tracking), a message's `name`, and on chat `store` (lamina keeps no chat
//! completions), `metadata`, `service_tier` and `reasoning_effort` (no
//! served model reasons). ([`IGNORED_FIELDS`]; the README lists them too;
//! each use is counted in `lamina_ignored_fields_total`.)
//!
//! One file on purpose: every endpoint's body shares the same field types and
//! parsers (messages, sampling fields, stop, logit_bias), and reading them
//! side by side is how the wire shapes stay consistent.

use std::collections::HashMap;

use contract::SamplingOverrides;
use serde::Deserialize;
use serde::de::{DeserializeOwned, IgnoredAny};

/// Fields accepted and ignored on purpose (see the module doc).
pub const IGNORED_FIELDS: [&str; 6] = [
    "user",
    "messages[].name",
    "store",
    "metadata",
    "service_tier",
    "reasoning_effort",
];

use crate::error::ApiError;

/// `stop`: one string or a list.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

impl Stop {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Stop::One(s) => vec![s],
            Stop::Many(v) => v,
        }
    }
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// Fields shared by chat and text completions, as the client gave them
/// (each body declares them through `completion_request!`).
#[derive(Debug, Clone, Default)]
pub struct CommonFields {
    pub model: Option<String>,
    /// Unsigned on the wire: a negative count is a type error naming the
    /// field; every limit on it is the engine's (`Engine::submit`).
    pub max_tokens: Option<u64>,
    /// The scalar sampling parameters (`contract::sampling_params!`).
    pub sampling: SamplingOverrides,
    pub top_k: Option<i64>,
    pub seed: Option<i64>,
    pub stop: Option<Stop>,
    pub n: Option<i64>,
    /// Completions only: choices generated to return the best `n` of.
    pub best_of: Option<i64>,
    pub logit_bias: Option<HashMap<String, f32>>,
    pub stop_token_ids: Option<Vec<u32>>,
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub ignore_eos: bool,
    /// lamina extension: `false` opts out of speculative decoding.
    pub speculative: Option<bool>,
}

/// Declares a completion-style request body (chat, text completion): the
/// endpoint's own fields, then the fields every such body shares. The shared
/// fields are inlined rather than a `#[serde(flatten)]`ed struct, because
/// serde reads a flattened struct from a buffered copy of the body that
/// `serde_path_to_error` cannot see into: a wrongly typed `temperature`
/// would lose its name. The scalar sampling fields come from
/// `contract::sampling_params!`, so a new sampling parameter is a field here
/// without an edit. The body's `shared()` gathers them into [`CommonFields`].
macro_rules! completion_request {
    ($(#[$m:meta])* pub struct $name:ident { $($own:tt)* }) => {
        contract::sampling_params!(completion_request_fields {
            $(#[$m])* pub struct $name { $($own)* }
        });
    };
}

macro_rules! completion_request_fields {
    (
        { $(#[$m:meta])* pub struct $name:ident { $($own:tt)* } }
        $( $(#[doc = $doc:literal])* $p:ident : f32 = $default:literal, $range:expr $(, $kernel:ident)? ; )*
    ) => {
        $(#[$m])*
        pub struct $name {
            $($own)*
            #[serde(default)]
            pub model: Option<String>,
            /// ollama's extension: how long the model stays loaded after
            /// this request (seconds, or a duration like `"5m"`; 0 unloads
            /// it once idle, negative keeps it loaded).
            #[serde(default)]
            #[schema(value_type = Option<String>)]
            pub keep_alive: Option<crate::keep_alive::KeepAlive>,
            #[serde(default)]
            pub max_tokens: Option<u64>,
            $(
                $(#[doc = $doc])*
                #[serde(default)]
                pub $p: Option<f32>,
            )*
            /// Keep only the K most likely tokens (0 or -1 = off).
            #[serde(default)]
            pub top_k: Option<i64>,
            #[serde(default)]
            pub seed: Option<i64>,
            #[serde(default)]
            pub stop: Option<Stop>,
            #[serde(default)]
            pub n: Option<i64>,
            /// Token id (as a string key, OpenAI's encoding) -> bias in [-100, 100].
            #[serde(default)]
            pub logit_bias: Option<HashMap<String, f32>>,
            /// vLLM extension: stop when one of these token ids is generated.
            #[serde(default)]
            pub stop_token_ids: Option<Vec<u32>>,
            #[serde(default)]
            pub stream: Option<bool>,
            #[serde(default)]
            pub stream_options: Option<StreamOptions>,
            #[serde(default)]
            pub ignore_eos: Option<bool>,
            /// lamina extension: `false` opts this request out of the
            /// server's speculative decoding (`--speculative`; the output
            /// is the same either way).
            #[serde(default)]
            pub speculative: Option<bool>,
            /// `text`, `json_object` or `json_schema` (constrained decoding).
            #[serde(default)]
            pub response_format: Option<ResponseFormat>,
            /// lamina extension: the output must fully match this regular expression.
            #[serde(default)]
            pub guided_regex: Option<String>,
            /// lamina extension: the output must be in this Lark grammar's language.
            #[serde(default)]
            pub guided_grammar: Option<String>,
            /// Accepted and ignored (an end-user id).
            #[serde(default)]
            #[schema(value_type = Option<String>)]
            pub user: Option<IgnoredAny>,
        }

        impl $name {
            /// The shared fields as the body gives them (`best_of` unset).
            fn shared(&self) -> CommonFields {
                CommonFields {
                    model: self.model.clone(),
                    max_tokens: self.max_tokens,
                    sampling: SamplingOverrides {
                        $( $p: self.$p, )*
                    },
                    top_k: self.top_k,
                    seed: self.seed,
                    stop: self.stop.clone(),
                    n: self.n,
                    best_of: None,
                    logit_bias: self.logit_bias.clone(),
                    stop_token_ids: self.stop_token_ids.clone(),
                    stream: self.stream.unwrap_or(false),
                    stream_options: self.stream_options.clone(),
                    ignore_eos: self.ignore_eos.unwrap_or(false),
                    speculative: self.speculative,
                }
            }
        }
    };
}

/// One chat message's `content`: a string or a list of content parts.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// `{"type": "text", "text": "..."}`; other part types are refused.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

/// One message of `messages`.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Message {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
    /// An assistant turn's function calls (history of a tool round trip).
    #[serde(default)]
    pub tool_calls: Option<Vec<MessageToolCall>>,
    /// A `tool` turn: the id of the call it answers.
    #[serde(default)]
    pub tool_call_id: Option<String>,
    /// Accepted and ignored (the chat templates do not render it).
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub name: Option<IgnoredAny>,
}

/// `response_format`.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResponseFormat {
    /// `text`, `json_object` or `json_schema`.
    #[serde(rename = "type")]
    pub kind: String,
    /// With `json_schema`: the schema and its name.
    #[serde(default)]
    pub json_schema: Option<JsonSchemaFormat>,
}

/// `response_format.json_schema`.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JsonSchemaFormat {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub schema: Option<serde_json::Value>,
    /// Accepted; the schema is always enforced.
    #[serde(default)]
    pub strict: Option<bool>,
}

/// One entry of `tools`.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Tool {
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionDef,
}

/// A function the model may call.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FunctionDef {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    /// A JSON schema of the arguments (an object); absent: no arguments.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub parameters: Option<serde_json::Value>,
    /// Accepted; the arguments are always held to the schema when enforced.
    #[serde(default)]
    pub strict: Option<bool>,
}

/// `tool_choice`: a mode, or one named function.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum ToolChoice {
    /// `none`, `auto` or `required`.
    Mode(String),
    Named(NamedToolChoice),
}

/// `{"type": "function", "function": {"name": ...}}`.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NamedToolChoice {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionName,
}

/// `{"name": ...}`.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FunctionName {
    pub name: String,
}

/// A function call in an assistant message of the history.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MessageToolCall {
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionCall,
}

/// `{"name": ..., "arguments": "<JSON text>"}`.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FunctionCall {
    pub name: String,
    pub arguments: String,
}

completion_request! {
    /// `POST /v1/chat/completions`.
    #[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
    #[serde(deny_unknown_fields)]
    pub struct ChatRequest {
        pub messages: Vec<Message>,
        #[serde(default)]
        pub max_completion_tokens: Option<u64>,
        #[serde(default)]
        pub logprobs: Option<bool>,
        #[serde(default)]
        pub top_logprobs: Option<i64>,
        /// lamina extension: parse special-token text in message contents as
        /// control tokens (default false: it is text).
        #[serde(default)]
        pub parse_special_tokens: Option<bool>,
        /// Functions the model may call.
        #[serde(default)]
        pub tools: Option<Vec<Tool>>,
        /// `none`, `auto`, `required` or `{"type": "function", "function": {"name": ...}}`.
        #[serde(default)]
        pub tool_choice: Option<ToolChoice>,
        /// `true` (the default): a reply may make several calls; `false`: at
        /// most one (the first).
        #[serde(default)]
        pub parallel_tool_calls: Option<bool>,
        /// vLLM's extension: the last message (the assistant's) is continued
        /// rather than answered: the reply is the text that follows it.
        #[serde(default)]
        pub continue_final_message: Option<bool>,
        /// vLLM's extension: extra variables for the chat template (Qwen3's
        /// `enable_thinking`): booleans, numbers or null.
        #[serde(default)]
        #[schema(value_type = Option<Object>)]
        pub chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
        /// Accepted and ignored: lamina keeps no chat completions.
        #[serde(default)]
        #[schema(value_type = Option<bool>)]
        pub store: Option<IgnoredAny>,
        /// Accepted and ignored (tags for the caller's own bookkeeping).
        #[serde(default)]
        #[schema(value_type = Option<Object>)]
        pub metadata: Option<IgnoredAny>,
        /// Accepted and ignored (one tier of service).
        #[serde(default)]
        #[schema(value_type = Option<String>)]
        pub service_tier: Option<IgnoredAny>,
        /// Accepted and ignored: no served model reasons.
        #[serde(default)]
        #[schema(value_type = Option<String>)]
        pub reasoning_effort: Option<IgnoredAny>,
    }
}

impl ChatRequest {
    /// The shared fields; `max_completion_tokens` wins over `max_tokens`.
    pub fn common(&self) -> CommonFields {
        CommonFields {
            max_tokens: self.max_completion_tokens.or(self.max_tokens),
            ..self.shared()
        }
    }

    /// The fields given that are accepted and ignored on purpose (counted
    /// in the metrics).
    pub fn ignored_fields(&self) -> Vec<&'static str> {
        let named = self
            .messages
            .iter()
            .any(|m| m.name.is_some())
            .then_some("messages[].name");
        given([
            ("user", self.user.is_some()),
            ("store", self.store.is_some()),
            ("metadata", self.metadata.is_some()),
            ("service_tier", self.service_tier.is_some()),
            ("reasoning_effort", self.reasoning_effort.is_some()),
        ])
        .chain(named)
        .collect()
    }

    /// Name of the `max_tokens` parameter the client used, for error messages.
    pub fn max_tokens_param(&self) -> &'static str {
        if self.max_completion_tokens.is_some() {
            "max_completion_tokens"
        } else {
            "max_tokens"
        }
    }
}

/// The names of the fields given, of `(name, given)` pairs: what every API's
/// request lists as its accepted-and-ignored fields (counted in the metrics).
pub fn given<const N: usize>(
    fields: [(&'static str, bool); N],
) -> impl Iterator<Item = &'static str> {
    fields
        .into_iter()
        .filter_map(|(f, given)| given.then_some(f))
}

/// `prompt` of a text completion: text or token ids, alone or in a list of one.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
    Texts(Vec<String>),
    TokenLists(Vec<Vec<u32>>),
}

completion_request! {
    /// `POST /v1/completions`.
    #[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
    #[serde(deny_unknown_fields)]
    pub struct CompletionRequest {
        pub prompt: Prompt,
        #[serde(default)]
        pub logprobs: Option<i64>,
        #[serde(default)]
        pub best_of: Option<i64>,
        #[serde(default)]
        pub echo: Option<bool>,
        #[serde(default)]
        pub suffix: Option<String>,
    }
}

impl CompletionRequest {
    pub fn common(&self) -> CommonFields {
        CommonFields {
            best_of: self.best_of,
            ..self.shared()
        }
    }
}

/// `POST /tokenize`: a `prompt`, or chat `messages` rendered with the template.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenizeRequest {
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub prompt: Option<String>,
    #[serde(default)]
    pub messages: Option<Vec<Message>>,
    #[serde(default)]
    pub add_special_tokens: Option<bool>,
    /// As [`ChatRequest::parse_special_tokens`], for `messages`.
    #[serde(default)]
    pub parse_special_tokens: Option<bool>,
    /// For `messages`: end with the assistant's turn header (default true).
    #[serde(default)]
    pub add_generation_prompt: Option<bool>,
    /// For `messages`: the template's extra variables, as in a chat request.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
}

/// `POST /detokenize` (vLLM's shape): token ids back to text.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DetokenizeRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub tokens: Vec<u32>,
}

/// Parses a JSON body: a syntax error is "malformed JSON", a type error
/// names the field path (`messages[0].content`, `temperature`).
pub fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    // serde would read a struct from an array too; a request is an object
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(
            match serde_json::from_slice::<serde::de::IgnoredAny>(body) {
                Ok(_) => ApiError::invalid_request("The request body must be a JSON object."),
                Err(e) => {
                    ApiError::malformed_json(format!("The request body is not valid JSON: {e}"))
                }
            },
        );
    }
    let de = &mut serde_json::Deserializer::from_slice(body);
    let parsed: Result<T, _> = serde_path_to_error::deserialize(&mut *de);
    match parsed {
        // one object and nothing after it but whitespace
        Ok(v) => match de.end() {
            Ok(()) => Ok(v),
            Err(e) => Err(ApiError::malformed_json(format!(
                "The request body is not valid JSON: {e} (data after the JSON object)"
            ))),
        },
        Err(e) => {
            let path = e.path().to_string();
            let inner = e.into_inner();
            if inner.is_syntax() || inner.is_eof() {
                Err(ApiError::malformed_json(format!(
                    "The request body is not valid JSON: {inner}"
                )))
            } else if let Some(field) = serde_field(&inner.to_string(), "unknown field `") {
                // the path already ends with the unknown field; a key with
                // an empty name is shown as `""` (found by the HTTP fuzzer)
                let param = if path.is_empty() || path == "." {
                    field
                } else {
                    path
                };
                let param = if param.is_empty() || param.ends_with('.') {
                    format!("{param}\"\"")
                } else {
                    param
                };
                Err(ApiError::invalid_param(
                    param.clone(),
                    format!(
                        "Unsupported parameter `{param}`: lamina does not implement it, and it \
                         is refused rather than ignored. (Accepted and ignored on purpose: {}.)",
                        IGNORED_FIELDS.join(", ")
                    ),
                ))
            } else if path.is_empty() || path == "." {
                let msg = inner.to_string();
                // serde names a missing field as "missing field `x` at line.."
                let missing = serde_field(&msg, "missing field `");
                Err(match missing {
                    Some(field) => ApiError::invalid_param(
                        field.clone(),
                        format!("Missing required parameter `{field}`."),
                    ),
                    None => ApiError::invalid_request(format!("Invalid request body: {msg}")),
                })
            } else if let Some(field) = serde_field(&inner.to_string(), "missing field `") {
                let param = format!("{path}.{field}");
                Err(ApiError::invalid_param(
                    param.clone(),
                    format!("Missing required parameter `{param}`."),
                ))
            } else {
                Err(ApiError::invalid_param(
                    path.clone(),
                    format!("Invalid value for `{path}`: {inner}"),
                ))
            }
        }
    }
}

/// Reads a request built as wire JSON (the chat request an Anthropic or
/// Responses body translates into) as [`parse`] reads a body, so an error
/// names the field.
pub fn parse_value<T: DeserializeOwned>(v: &serde_json::Value) -> Result<T, ApiError> {
    parse(v.to_string().as_bytes())
}

/// The field a serde error message names after `prefix` ("missing field `",
/// "unknown field `" from `deny_unknown_fields`), if it is that error.
fn serde_field(msg: &str, prefix: &str) -> Option<String> {
    msg.strip_prefix(prefix)
        .and_then(|rest| rest.split('`').next())
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsupported_fields_are_refused_naming_them() {
        for (body, param) in [
            (
                r#"{"messages": [], "function_call": "auto"}"#,
                "function_call",
            ),
            (
                r#"{"messages": [], "response_format": {"type": "json_object", "foo": 1}}"#,
                "response_format.foo",
            ),
            (
                r#"{"messages": [], "logit_bias": {"1": 5}, "functions": []}"#,
                "functions",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "a", "function_call": {}}]}"#,
                "messages[0].function_call",
            ),
            (
                r#"{"messages": [], "stream_options": {"continuous_usage_stats": true}}"#,
                "stream_options.continuous_usage_stats",
            ),
        ] {
            let e = parse::<ChatRequest>(body.as_bytes()).unwrap_err();
            assert_eq!(
                (e.status.as_u16(), e.param.as_deref()),
                (400, Some(param)),
                "{}",
                e.message
            );
            assert!(e.message.contains("Unsupported parameter"), "{}", e.message);
        }
        let e = parse::<CompletionRequest>(br#"{"prompt": "a", "best_of": 2, "suffixes": 1}"#)
            .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("suffixes"));
        // chat has no best_of (OpenAI's chat API does not either)
        let e = parse::<ChatRequest>(br#"{"messages": [], "best_of": 2}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("best_of"));
        let e = parse::<TokenizeRequest>(br#"{"prompt": "a", "foo": 1}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("foo"));
        // regression (HTTP fuzzer): a key with an empty name is still named
        let e = parse::<CompletionRequest>(br#"{"prompt": "a", "": 1}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("\"\""), "{}", e.message);
        // accepted and ignored on purpose
        assert!(
            parse::<ChatRequest>(
                br#"{"messages": [{"role": "user", "content": "a", "name": "x"}], "user": "u"}"#
            )
            .is_ok()
        );
        let r = parse::<ChatRequest>(
            br#"{"messages": [], "store": false, "metadata": {"a": "b"},
                "service_tier": "auto", "reasoning_effort": "low", "parallel_tool_calls": true}"#,
        )
        .unwrap();
        assert_eq!(
            r.ignored_fields(),
            ["store", "metadata", "service_tier", "reasoning_effort"]
        );
        assert!(parse::<CompletionRequest>(br#"{"prompt": "a", "user": "u"}"#).is_ok());
    }

    #[test]
    fn type_error_names_the_field() {
        let e = parse::<ChatRequest>(br#"{"messages": [], "temperature": "hot"}"#).unwrap_err();
        assert_eq!(e.status, 400);
        assert_eq!(e.param.as_deref(), Some("temperature"));
        let e = parse::<ChatRequest>(br#"{"messages": [{"role": 3}]}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].role"));
    }

    #[test]
    fn syntax_error_is_malformed_json() {
        let e = parse::<ChatRequest>(br#"{"messages": ["#).unwrap_err();
        assert_eq!(e.status, 400);
        assert_eq!(e.code, Some("invalid_json"));
        assert!(e.param.is_none());
    }

    #[test]
    fn missing_required_field_is_named() {
        let e = parse::<CompletionRequest>(br#"{"model": "m"}"#).unwrap_err();
        assert_eq!(e.status, 400);
        assert_eq!(e.param.as_deref(), Some("prompt"), "{}", e.message);
        let e = parse::<CompletionRequest>(b"[1]").unwrap_err();
        assert_eq!((e.status.as_u16(), e.param), (400, None));
    }

    #[test]
    fn prompt_shapes() {
        let r: CompletionRequest = parse(br#"{"prompt": [1, 2, 3]}"#).unwrap();
        assert!(matches!(r.prompt, Prompt::Tokens(ref t) if t == &[1, 2, 3]));
        let r: CompletionRequest = parse(br#"{"prompt": ["a"]}"#).unwrap();
        assert!(matches!(r.prompt, Prompt::Texts(ref t) if t.len() == 1));
        let r: ChatRequest = parse(
            br#"{"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}"#,
        )
        .unwrap();
        assert!(matches!(r.messages[0].content, Some(Content::Parts(_))));
    }
}
