//! Builds a Hugging Face `tokenizer.json` from a GGUF "gpt2" (byte-level BPE)
//! vocabulary: `tokenizer.ggml.tokens`, `.merges`, `.token_type` and `.pre`.
//!
//! Contract: the result is a tokenizer.json that the `tokenizers` crate loads
//! (checked before returning) and that tokenizes like llama.cpp does for the
//! same GGUF:
//! - BPE model over the GGUF vocabulary (id = position) and merges (GGUF
//!   writes each as `"left right"`; split at the first space after the first
//!   character, as llama.cpp does), byte-level decoder;
//! - control tokens (type 3) become special added tokens, user-defined tokens
//!   (type 4) non-special added tokens, both matched before pre-tokenization;
//! - the pre-tokenizer follows llama.cpp's `tokenizer.ggml.pre` definitions:
//!   - `smollm`: llama.cpp splits on `\p{N}` (every digit alone), then the GPT-2
//!     regex; as HF: `Digits(individual_digits)` then
//!     `ByteLevel(add_prefix_space=false, use_regex=true)` (the GPT-2 regex);
//!   - `llama-bpe`: the Llama 3 regex (`Split`, isolated) then
//!     `ByteLevel(use_regex=false)`, with `ignore_merges` as llama.cpp sets it;
//!   - `qwen2` (Qwen2, Qwen2.5 and Qwen3 GGUFs): the same with Qwen's regex
//!     (digits one at a time), merges always applied, as Qwen's own
//!     tokenizer.json has it (its NFC normalizer left out, as llama.cpp
//!     leaves it);
//!   - any other value is an error naming it.
//!
//! BOS is not added by this tokenizer.json (its post-processor is ByteLevel
//! only): the importer writes `add_bos_token` (llama.cpp's decision,
//! `checkpoint::gguf::adds_bos`) and `bos_token` from the GGUF
//! into tokenizer_config.json and `Tokenizer` prepends BOS from there.
//!
//! Costs: linear in vocabulary + merges (about 100k strings for SmolLM2);
//! the validation parse roughly doubles it. Tens of milliseconds.

use crate::TokenizerError;
use serde_json::{Map, Value, json};
use std::collections::HashMap;

/// GGUF token types (llama.cpp `llama_token_type`).
pub(crate) const TYPE_UNKNOWN: i32 = 2;
pub(crate) const TYPE_CONTROL: i32 = 3;
pub(crate) const TYPE_USER_DEFINED: i32 = 4;
pub(crate) const TYPE_MAX: i32 = 6;

/// The Llama 3 pre-tokenizer regex (as in Meta's tokenizer.json).
pub const LLAMA3_SPLIT_REGEX: &str = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/// Qwen's pre-tokenizer regex (as in Qwen2's and Qwen3's tokenizer.json).
pub const QWEN2_SPLIT_REGEX: &str = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/// Returns the tokenizer.json text for a GGUF byte-level BPE vocabulary.
/// `tokens[i]` has id `i`; `token_types` is parallel to `tokens`.
pub fn build_tokenizer_json(
    tokens: &[String],
    merges: &[String],
    token_types: &[i32],
    pre: &str,
) -> Result<String, TokenizerError> {
    let (pre_tokenizer, ignore_merges) = pre_tokenizer_for(pre)?;
    if tokens.len() != token_types.len() {
        return Err(TokenizerError::Gguf {
            field: "tokenizer.ggml.token_type",
            reason: format!(
                "has {} entries but tokenizer.ggml.tokens has {}",
                token_types.len(),
                tokens.len()
            ),
        });
    }

    let mut vocab = Map::with_capacity(tokens.len());
    let mut first_id: HashMap<&str, usize> = HashMap::with_capacity(tokens.len());
    let mut added = Vec::new();
    for (id, (tok, &ty)) in tokens.iter().zip(token_types).enumerate() {
        if let Some(prev) = first_id.insert(tok, id) {
            return Err(TokenizerError::Gguf {
                field: "tokenizer.ggml.tokens",
                reason: format!("token {tok:?} appears twice (ids {prev} and {id})"),
            });
        }
        if !(0..=TYPE_MAX).contains(&ty) {
            return Err(TokenizerError::Gguf {
                field: "tokenizer.ggml.token_type",
                reason: format!("token {id} ({tok:?}) has unknown type {ty}"),
            });
        }
        vocab.insert(tok.clone(), json!(id));
        if ty == TYPE_CONTROL || ty == TYPE_USER_DEFINED {
            added.push(json!({
                "id": id,
                "content": tok,
                "single_word": false,
                "lstrip": false,
                "rstrip": false,
                "normalized": ty == TYPE_USER_DEFINED,
                "special": ty == TYPE_CONTROL,
            }));
        }
    }

    let mut pairs = Vec::with_capacity(merges.len());
    for (i, m) in merges.iter().enumerate() {
        // llama.cpp: the separator is the first space at or after byte 1, so
        // a left part that is itself a space still splits correctly.
        let split = m
            .char_indices()
            .skip(1)
            .find(|&(_, c)| c == ' ')
            .map(|(pos, _)| (&m[..pos], &m[pos + 1..]));
        match split {
            Some((l, r)) if !r.is_empty() => pairs.push(json!([l, r])),
            _ => {
                return Err(TokenizerError::Gguf {
                    field: "tokenizer.ggml.merges",
                    reason: format!("merge {i} ({m:?}) is not of the form \"left right\""),
                });
            }
        }
    }

    let byte_level = json!({
        "type": "ByteLevel",
        "add_prefix_space": false,
        "trim_offsets": true,
        "use_regex": true,
    });
    let tj = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": {
            "type": "ByteLevel",
            "add_prefix_space": true,
            "trim_offsets": false,
            "use_regex": true,
        },
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": null,
            "continuing_subword_prefix": null,
            "end_of_word_suffix": null,
            "fuse_unk": false,
            "byte_fallback": false,
            "ignore_merges": ignore_merges,
            "vocab": Value::Object(vocab),
            "merges": pairs,
        },
    });
    let text = serde_json::to_string(&tj).map_err(|e| TokenizerError::Gguf {
        field: "tokenizer.ggml.tokens",
        reason: format!("cannot serialise tokenizer.json: {e}"),
    })?;
    // Check it loads (a merge naming a token outside the vocabulary fails here).
    tokenizers::Tokenizer::from_bytes(text.as_bytes()).map_err(|e| TokenizerError::Gguf {
        field: "tokenizer.ggml.merges",
        reason: format!("the built tokenizer.json does not load: {e}"),
    })?;
    Ok(text)
}

/// The tokenizer.json `pre_tokenizer` for a `tokenizer.ggml.pre` value, and
/// whether BPE skips merging words already in the vocabulary.
fn pre_tokenizer_for(pre: &str) -> Result<(Value, bool), TokenizerError> {
    match pre {
        "smollm" => Ok((
            json!({
                "type": "Sequence",
                "pretokenizers": [
                    { "type": "Digits", "individual_digits": true },
                    {
                        "type": "ByteLevel",
                        "add_prefix_space": false,
                        "trim_offsets": true,
                        "use_regex": true,
                    },
                ],
            }),
            false,
        )),
        "llama-bpe" | "qwen2" => Ok((
            json!({
                "type": "Sequence",
                "pretokenizers": [
                    {
                        "type": "Split",
                        "pattern": { "Regex": if pre == "qwen2" { QWEN2_SPLIT_REGEX } else { LLAMA3_SPLIT_REGEX } },
                        "behavior": "Isolated",
                        "invert": false,
                    },
                    {
                        "type": "ByteLevel",
                        "add_prefix_space": false,
                        "trim_offsets": true,
                        "use_regex": false,
                    },
                ],
            }),
            pre == "llama-bpe",
        )),
        other => Err(TokenizerError::UnknownPreTokenizer(other.to_string())),
    }
}

#[cfg(test)]
pub(crate) mod fixture;
#[cfg(test)]
mod tests;
