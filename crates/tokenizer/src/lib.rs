//! The model's tokenizer: Hugging Face `tokenizer.json` (through the
//! `tokenizers` crate) plus the parts of `tokenizer_config.json` that matter
//! for serving: the BOS / EOS tokens, `add_bos_token` and the chat template.
//!
//! Contract:
//! - [`Tokenizer::encode`] with `add_special_tokens` returns exactly what the
//!   model expects at the start of a prompt: the tokenizer.json post-processor
//!   decides (Llama 3's adds BOS 128000 itself); only when tokenizer_config says
//!   `add_bos_token: true` and the post-processor does not add it is BOS
//!   prepended here. BOS is never added twice.
//! - [`Tokenizer::decode`] rejects ids outside the vocabulary instead of
//!   silently dropping them. No `clean_up_tokenization_spaces` pass is applied
//!   (it is lossy and would break incremental decoding; see `detok`).
//! - [`Tokenizer::encode_chat`] renders the chat template and encodes it so that
//!   a template that already writes the BOS text does not get a second BOS.
//! - Every error names the file (or the in-memory origin) at fault.
//!
//! Costs: loading parses tokenizer.json once (tens of ms for a 128k vocabulary)
//! and compiles the chat template once; encode/decode are linear in the text /
//! ids; the struct is immutable and shared as `Arc<Tokenizer>`.

pub use crate::chat::ChatVars;
use crate::chat::{ChatTemplate, LLAMA3_HEADER_TOKEN};
use config::{RawSpecialToken, RawTokenizerConfig, pick_template};
use serde::{Deserialize, Serialize};
use shield::{Literals, Piece, Shield};
use std::path::Path;

pub mod bpe_from_gguf;
pub mod byte_level;
pub mod chat;
mod config;
pub mod detok;
mod shield;
pub mod spm_from_gguf;

/// File names read by [`Tokenizer::from_dir`].
pub const TOKENIZER_FILE: &str = "tokenizer.json";
pub const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";
/// Newer `transformers` versions save the chat template beside the config.
pub const CHAT_TEMPLATE_FILE: &str = "chat_template.jinja";

/// Errors from loading or using a tokenizer, each naming its file or origin.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("malformed {path}: {reason}")]
    Parse { path: String, reason: String },
    #[error("{path}: field `{field}`: {reason}")]
    Invalid {
        path: String,
        field: &'static str,
        reason: String,
    },
    #[error("{origin}: cannot encode text: {reason}")]
    Encode { origin: String, reason: String },
    #[error("{origin}: cannot decode ids: {reason}")]
    Decode { origin: String, reason: String },
    #[error("{origin}: token id {id} is outside the vocabulary (size {vocab_size})")]
    UnknownId {
        origin: String,
        id: u32,
        vocab_size: usize,
    },
    #[error(
        "{origin}: the model has no chat template (none in tokenizer_config.json or \
         chat_template.jinja) and its vocabulary is not Llama 3's, so no fallback applies"
    )]
    NoChatTemplate { origin: String },
    #[error("{origin}: chat template: {reason}")]
    Template { origin: String, reason: String },
    #[error("GGUF tokenizer: `{field}`: {reason}")]
    Gguf { field: &'static str, reason: String },
    #[error("unknown GGUF pre-tokenizer type `{0}` (supported: smollm, llama-bpe)")]
    UnknownPreTokenizer(String),
}

/// One chat message, as in the OpenAI API and Hugging Face chat templates.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    /// An assistant turn's function calls, as templates read them:
    /// `[{"id", "type": "function", "function": {"name", "arguments": {..}}}]`
    /// (arguments as an object, as Hugging Face templates expect).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<serde_json::Value>,
    /// A `tool` turn: the id of the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            tool_calls: None,
            tool_call_id: None,
        }
    }
}

/// A special token resolved against the vocabulary.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Special {
    text: String,
    id: u32,
}

/// Tokenizer + special tokens + chat template of one model.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// `inner` with special tokens encoded as plain text (user literals).
    text_only: tokenizers::Tokenizer,
    /// Keeps special-token texts in user strings from becoming control tokens.
    shield: Shield,
    /// Names the source in errors (the tokenizer.json path).
    origin: String,
    bos: Option<Special>,
    eos: Option<Special>,
    /// Prepend BOS in `encode` (config asks for it, post-processor does not).
    prepend_bos: bool,
    /// One past the largest id (model vocabulary and added tokens); cached
    /// because `tokenizers` rebuilds the whole vocabulary map to count it.
    vocab_size: usize,
    /// The longest vocabulary piece in UTF-8 bytes (at least 1); `None` when
    /// a normalizer may shrink the input (then no byte bound holds).
    max_piece_bytes: Option<usize>,
    chat: Option<ChatTemplate>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("origin", &self.origin)
            .field("vocab_size", &self.vocab_size())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("prepend_bos", &self.prepend_bos)
            .field("has_chat_template", &self.chat.is_some())
            .finish()
    }
}

fn read_text(path: &Path) -> Result<String, TokenizerError> {
    std::fs::read_to_string(path).map_err(|source| TokenizerError::Io {
        path: path.display().to_string(),
        source,
    })
}

/// Refuses a vocabulary (model vocabulary and added tokens together) that
/// gives one id to two different strings: decoding that id would be
/// ambiguous and the token counts of the two would mix.
fn check_unique_ids(
    vocab: &std::collections::HashMap<String, u32>,
    origin: &str,
) -> Result<(), TokenizerError> {
    let mut by_id: std::collections::HashMap<u32, &str> = std::collections::HashMap::new();
    for (text, &id) in vocab {
        if let Some(other) = by_id.insert(id, text) {
            let (a, b) = if other < text.as_str() {
                (other, text.as_str())
            } else {
                (text.as_str(), other)
            };
            return Err(TokenizerError::Invalid {
                path: origin.to_string(),
                field: "model.vocab / added_tokens",
                reason: format!("id {id} is given to two different tokens, {a:?} and {b:?}"),
            });
        }
    }
    Ok(())
}

impl Tokenizer {
    /// Loads `dir/tokenizer.json` and, when present, `dir/tokenizer_config.json`
    /// and `dir/chat_template.jinja` (used when the config carries no template).
    pub fn from_dir(dir: &Path) -> Result<Tokenizer, TokenizerError> {
        let tok_path = dir.join(TOKENIZER_FILE);
        let tok_json = read_text(&tok_path)?;
        let cfg_path = dir.join(TOKENIZER_CONFIG_FILE);
        let cfg_json = if cfg_path.is_file() {
            Some(read_text(&cfg_path)?)
        } else {
            None
        };
        let tpl_path = dir.join(CHAT_TEMPLATE_FILE);
        let template_file = if tpl_path.is_file() {
            Some((read_text(&tpl_path)?, tpl_path.display().to_string()))
        } else {
            None
        };
        Self::build(
            &tok_json,
            cfg_json.as_deref(),
            template_file,
            &tok_path.display().to_string(),
            &cfg_path.display().to_string(),
        )
    }

    /// Builds a tokenizer from in-memory JSON (tokenizer.json text and an
    /// optional tokenizer_config.json text); `origin` names them in errors.
    pub fn from_json(
        tokenizer_json: &str,
        config_json: Option<&str>,
        origin: &str,
    ) -> Result<Tokenizer, TokenizerError> {
        let cfg_origin = format!("{origin} ({TOKENIZER_CONFIG_FILE})");
        Self::build(tokenizer_json, config_json, None, origin, &cfg_origin)
    }

    fn build(
        tokenizer_json: &str,
        config_json: Option<&str>,
        template_file: Option<(String, String)>,
        origin: &str,
        cfg_origin: &str,
    ) -> Result<Tokenizer, TokenizerError> {
        let inner = tokenizers::Tokenizer::from_bytes(tokenizer_json.as_bytes()).map_err(|e| {
            TokenizerError::Parse {
                path: origin.to_string(),
                reason: e.to_string(),
            }
        })?;
        let cfg = match config_json {
            Some(text) => RawTokenizerConfig::parse(text, cfg_origin)?,
            None => RawTokenizerConfig::default(),
        };
        let resolve = |tok: Option<RawSpecialToken>, field: &'static str| {
            tok.map(|t| {
                let text = t.into_text();
                match inner.token_to_id(&text) {
                    Some(id) => Ok(Special { text, id }),
                    None => Err(TokenizerError::Invalid {
                        path: cfg_origin.to_string(),
                        field,
                        reason: format!("token {text:?} is not in the vocabulary of {origin}"),
                    }),
                }
            })
            .transpose()
        };
        let bos = resolve(cfg.bos_token, "bos_token")?;
        let eos = resolve(cfg.eos_token, "eos_token")?;

        let prepend_bos = match (&bos, cfg.add_bos_token) {
            (Some(b), Some(true)) => {
                let probe = inner
                    .encode("a", true)
                    .map_err(|e| TokenizerError::Encode {
                        origin: origin.to_string(),
                        reason: e.to_string(),
                    })?;
                probe.get_ids().first() != Some(&b.id)
            }
            (None, Some(true)) => {
                return Err(TokenizerError::Invalid {
                    path: cfg_origin.to_string(),
                    field: "add_bos_token",
                    reason: "is true but no `bos_token` is given".to_string(),
                });
            }
            _ => false,
        };

        let template = pick_template(cfg.chat_template, template_file, cfg_origin)?;
        let bos_text = bos.as_ref().map(|b| b.text.clone()).unwrap_or_default();
        let eos_text = eos.as_ref().map(|e| e.text.clone()).unwrap_or_default();
        let chat = match template {
            Some((src, from)) => Some(ChatTemplate::new(src, bos_text, eos_text, &from)?),
            None if inner.token_to_id(LLAMA3_HEADER_TOKEN).is_some() => {
                Some(ChatTemplate::llama3_fallback(eos_text, cfg_origin)?)
            }
            None => None,
        };
        let vocab = inner.get_vocab(true);
        check_unique_ids(&vocab, origin)?;
        let vocab_size = vocab.values().max().map_or(0, |&m| m as usize + 1);
        let max_piece_bytes = inner
            .get_normalizer()
            .is_none()
            .then(|| vocab.keys().map(String::len).max().unwrap_or(1).max(1));
        let specials: Vec<String> = inner
            .get_added_tokens_decoder()
            .into_values()
            .filter(|t| t.special)
            .map(|t| t.content)
            .collect();
        let shield = Shield::new(&specials).map_err(|reason| TokenizerError::Invalid {
            path: origin.to_string(),
            field: "added_tokens",
            reason,
        })?;
        let mut text_only = inner.clone();
        text_only.set_encode_special_tokens(true);
        Ok(Tokenizer {
            vocab_size,
            max_piece_bytes,
            text_only,
            shield,
            inner,
            origin: origin.to_string(),
            bos,
            eos,
            prepend_bos,
            chat,
        })
    }

    /// Encodes `text`; with `add_special_tokens` the result starts with BOS
    /// exactly when the model's tokenizer adds one.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizerError> {
        let enc =
            self.inner
                .encode(text, add_special_tokens)
                .map_err(|e| TokenizerError::Encode {
                    origin: self.origin.clone(),
                    reason: e.to_string(),
                })?;
        Ok(self.with_bos(enc.get_ids(), add_special_tokens))
    }

    /// Encodes `text` with special-token texts kept as text and nothing
    /// added (a user's literal, appended to a rendered prompt).
    pub fn encode_literal(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let enc = self
            .text_only
            .encode(text, false)
            .map_err(|e| TokenizerError::Encode {
                origin: self.origin.clone(),
                reason: e.to_string(),
            })?;
        Ok(enc.get_ids().to_vec())
    }

    /// `ids` with BOS prepended when `add_special_tokens` asks for it, the
    /// config wants it and the post-processor did not add it.
    fn with_bos(&self, ids: &[u32], add_special_tokens: bool) -> Vec<u32> {
        match (&self.bos, add_special_tokens && self.prepend_bos) {
            (Some(b), true) if ids.first() != Some(&b.id) => {
                let mut out = Vec::with_capacity(ids.len() + 1);
                out.push(b.id);
                out.extend_from_slice(ids);
                out
            }
            _ => ids.to_vec(),
        }
    }

    /// Decodes `ids` to text (invalid UTF-8 becomes U+FFFD); special tokens are
    /// left out when `skip_special`. An id outside the vocabulary is an error.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, TokenizerError> {
        let vocab_size = self.vocab_size();
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab_size) {
            return Err(TokenizerError::UnknownId {
                origin: self.origin.clone(),
                id,
                vocab_size,
            });
        }
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| TokenizerError::Decode {
                origin: self.origin.clone(),
                reason: e.to_string(),
            })
    }

    /// Renders the chat template (the model's own, or the Llama 3 header format
    /// for a Llama 3 vocabulary without one).
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        self.apply_chat_template_with_tools(messages, None, add_generation_prompt)
    }

    /// [`Tokenizer::apply_chat_template`] with the OpenAI `tools` list in the
    /// template's context (as `tools`, what Hugging Face templates read).
    pub fn apply_chat_template_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        self.apply_chat_template_with(messages, ChatVars::tools(tools), add_generation_prompt)
    }

    /// [`Tokenizer::apply_chat_template`] with `vars` (tools and extra
    /// variables) in the template's context.
    pub fn apply_chat_template_with(
        &self,
        messages: &[ChatMessage],
        vars: ChatVars<'_>,
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        match &self.chat {
            Some(t) => t.render_with(messages, vars, add_generation_prompt),
            None => Err(TokenizerError::NoChatTemplate {
                origin: self.origin.clone(),
            }),
        }
    }

    /// The prompt ids for a conversation, ending with the assistant's turn
    /// header: the template is rendered with `add_generation_prompt` and
    /// encoded with the tokenizer's special tokens unless the rendered text
    /// already starts with the BOS text (so BOS appears once, never twice).
    ///
    /// Special-token texts in user-supplied strings stay text (a user cannot
    /// write `<|im_end|>` and open a system turn), in every field a template
    /// may render: roles, contents, `tool_call_id`, `tool_calls` and `tools`
    /// (see `shield`). Only the template's own markers become control
    /// tokens. Conversations holding no such text are encoded in one piece,
    /// exactly as `transformers` does. [`Tokenizer::encode_chat_trusted`]
    /// parses every special text.
    pub fn encode_chat(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, TokenizerError> {
        self.encode_chat_with_tools(messages, None)
    }

    /// [`Tokenizer::encode_chat`] with `tools` in the template's context.
    pub fn encode_chat_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
    ) -> Result<Vec<u32>, TokenizerError> {
        self.encode_chat_with(messages, ChatVars::tools(tools))
    }

    /// [`Tokenizer::encode_chat`] with `vars` in the template's context
    /// (extra variables are the caller's to check: they are not shielded).
    pub fn encode_chat_with(
        &self,
        messages: &[ChatMessage],
        vars: ChatVars<'_>,
    ) -> Result<Vec<u32>, TokenizerError> {
        self.encode_chat_ending(messages, vars, true)
    }

    /// [`Tokenizer::encode_chat_with`], the template rendered with
    /// `add_generation_prompt` as given (false: the conversation ends
    /// with its last message, no assistant header; what `/tokenize` may ask).
    pub fn encode_chat_ending(
        &self,
        messages: &[ChatMessage],
        vars: ChatVars<'_>,
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        let gen_prompt = add_generation_prompt;
        let mut lits = Literals::default();
        let Some((shielded, shielded_tools)) =
            self.shield.conversation(messages, vars.tools, &mut lits)
        else {
            let text = self.apply_chat_template_with(messages, vars, gen_prompt)?;
            return self.encode_rendered_prompt(&text);
        };
        let vars = ChatVars {
            tools: shielded_tools.as_ref(),
            kwargs: vars.kwargs,
        };
        let text = self.apply_chat_template_with(&shielded, vars, gen_prompt)?;
        let mut parts = Vec::new();
        for piece in shield::pieces(&text, &lits) {
            let (tok, s) = match piece {
                Piece::Template(s) => (&self.inner, s),
                Piece::Literal(s) => (&self.text_only, s),
            };
            parts.push(tok.encode(s, false).map_err(|e| self.encode_error(e))?);
        }
        let add_special = !self.starts_with_bos(&text);
        let merged = tokenizers::Encoding::merge(parts, true);
        let enc = self
            .inner
            .post_process(merged, None, add_special)
            .map_err(|e| self.encode_error(e))?;
        Ok(self.with_bos(enc.get_ids(), add_special))
    }

    fn encode_error(&self, e: impl std::fmt::Display) -> TokenizerError {
        TokenizerError::Encode {
            origin: self.origin.clone(),
            reason: e.to_string(),
        }
    }

    /// Whether a rendered prompt already starts with the BOS text.
    fn starts_with_bos(&self, text: &str) -> bool {
        self.bos
            .as_ref()
            .is_some_and(|b| !b.text.is_empty() && text.starts_with(&b.text))
    }

    /// [`Tokenizer::encode_chat`] with special-token texts in message
    /// contents parsed as control tokens (for callers that build control
    /// sequences on purpose and trust every message).
    pub fn encode_chat_trusted(
        &self,
        messages: &[ChatMessage],
        vars: ChatVars<'_>,
    ) -> Result<Vec<u32>, TokenizerError> {
        self.encode_chat_trusted_ending(messages, vars, true)
    }

    /// [`Tokenizer::encode_chat_trusted`] with `add_generation_prompt` as
    /// given ([`Tokenizer::encode_chat_ending`]).
    pub fn encode_chat_trusted_ending(
        &self,
        messages: &[ChatMessage],
        vars: ChatVars<'_>,
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        let text = self.apply_chat_template_with(messages, vars, add_generation_prompt)?;
        self.encode_rendered_prompt(&text)
    }

    /// Encodes an already-rendered chat prompt with the BOS rule of
    /// [`Tokenizer::encode_chat`].
    pub fn encode_rendered_prompt(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        self.encode(text, !self.starts_with_bos(text))
    }

    /// Whether the chat template reads a `tools` list (Llama 3.1 / 3.2 do,
    /// SmolLM2's does not): callers render tool definitions into a system
    /// message themselves when it does not.
    pub fn template_renders_tools(&self) -> bool {
        self.chat
            .as_ref()
            .is_some_and(|t| t.source().contains("tools"))
    }

    /// The EOS id(s) from tokenizer_config.json's `eos_token` (empty if none).
    pub fn eos_ids(&self) -> Vec<u32> {
        self.eos.iter().map(|e| e.id).collect()
    }

    /// The BOS id from tokenizer_config.json's `bos_token`, if any.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos.as_ref().map(|b| b.id)
    }

    /// Number of ids (one past the largest), added tokens included. It may
    /// differ from the model's `vocab_size` (embedding rows).
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The most bytes of text that can encode to at most `max_tokens` tokens:
    /// every token covers at most the longest vocabulary piece's bytes, so a
    /// longer text surely exceeds `max_tokens` and can be refused without
    /// tokenizing it. `None` when the tokenizer has a normalizer (it may
    /// delete input, and no bound holds).
    pub fn max_text_bytes(&self, max_tokens: usize) -> Option<usize> {
        self.max_piece_bytes.map(|b| b.saturating_mul(max_tokens))
    }

    /// The vocabulary piece of `id` as stored (byte-level BPE shows a leading
    /// space as `Ġ`); `None` outside the vocabulary.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The id of a vocabulary piece or added token.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The text `id` decodes to on its own (what logprobs report for a token;
    /// a lone byte of a multi-byte character shows as U+FFFD).
    pub fn token_text(&self, id: u32) -> Result<String, TokenizerError> {
        self.decode(&[id], false)
    }

    /// The chat template source in use, if any (the Llama 3 fallback included).
    pub fn chat_template(&self) -> Option<&str> {
        self.chat.as_ref().map(|c| c.source())
    }

    /// The underlying `tokenizers` tokenizer.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

#[cfg(test)]
mod tests;
