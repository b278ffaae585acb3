//! The fields of `tokenizer_config.json` the tokenizer reads, in their
//! Hugging Face spellings: special tokens as bare strings or `{content: ...}`
//! objects, `chat_template` as one string or a list of `{name, template}`.
//!
//! Costs: one serde pass over a small JSON file.

use super::TokenizerError;
use serde::Deserialize;

/// A special token in tokenizer_config.json: a bare string or `{content: ...}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(super) enum RawSpecialToken {
    Text(String),
    Object { content: String },
}

impl RawSpecialToken {
    pub(super) fn into_text(self) -> String {
        match self {
            Self::Text(s) | Self::Object { content: s } => s,
        }
    }
}

/// `chat_template`: one string, or a list of named templates.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(super) enum RawChatTemplate {
    One(String),
    Named(Vec<NamedTemplate>),
}

#[derive(Debug, Clone, Deserialize)]
pub(super) struct NamedTemplate {
    name: String,
    template: String,
}

/// The fields of tokenizer_config.json this crate reads.
#[derive(Debug, Clone, Default, Deserialize)]
pub(super) struct RawTokenizerConfig {
    #[serde(default)]
    pub(super) bos_token: Option<RawSpecialToken>,
    #[serde(default)]
    pub(super) eos_token: Option<RawSpecialToken>,
    #[serde(default)]
    pub(super) add_bos_token: Option<bool>,
    #[serde(default)]
    pub(super) chat_template: Option<RawChatTemplate>,
}

impl RawTokenizerConfig {
    /// Parses tokenizer_config.json text; `origin` names it in errors.
    pub(super) fn parse(text: &str, origin: &str) -> Result<Self, TokenizerError> {
        serde_json::from_str(text).map_err(|e| TokenizerError::Parse {
            path: origin.to_string(),
            reason: e.to_string(),
        })
    }
}

/// The template source to use: the config's (the entry named `default` of a
/// list, else its first), else `file` (chat_template.jinja). Returns the
/// source and the name of the file it came from.
pub(super) fn pick_template(
    from_config: Option<RawChatTemplate>,
    file: Option<(String, String)>,
    cfg_origin: &str,
) -> Result<Option<(String, String)>, TokenizerError> {
    match from_config {
        Some(RawChatTemplate::One(s)) => Ok(Some((s, cfg_origin.to_string()))),
        Some(RawChatTemplate::Named(list)) => {
            let pick = list
                .iter()
                .position(|t| t.name == "default")
                .unwrap_or_default();
            match list.into_iter().nth(pick) {
                Some(t) => Ok(Some((t.template, cfg_origin.to_string()))),
                None => Err(TokenizerError::Invalid {
                    path: cfg_origin.to_string(),
                    field: "chat_template",
                    reason: "is an empty list of templates".to_string(),
                }),
            }
        }
        None => Ok(file),
    }
}
