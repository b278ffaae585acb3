//! Builds a Hugging Face `tokenizer.json` from a GGUF "llama" (SentencePiece
//! BPE) vocabulary: `tokenizer.ggml.tokens`, `.scores`, `.token_type` and
//! `.add_space_prefix` (Gemma 3, Llama 2, Mistral GGUFs).
//!
//! Contract: the result loads in the `tokenizers` crate (checked before
//! returning) and is the tokenizer.json Hugging Face's SentencePiece
//! converter writes for the same vocabulary, so it tokenizes as the model's
//! own tokenizer.json does (tested token for token on Gemma 3's):
//! - BPE over the vocabulary (id = position) with byte fallback (`<0xNN>`
//!   tokens, type 6) and `<unk>`;
//! - merges: every split of a piece into two pieces of the vocabulary,
//!   ranked by the piece's score, highest first (ties: longer left part,
//!   then longer right part; within a piece, by the parts' ids), as the
//!   converter ranks them. User-defined pieces (type 4) rank with score 0,
//!   their SentencePiece score (llama.cpp's converter writes -1000), and their
//!   spaces are `▁` again (llama.cpp's converter writes them as spaces);
//! - normalizer: spaces become `▁`, and a `▁` is prepended when
//!   `add_space_prefix` is set; the decoder undoes both;
//! - control (type 3) and user-defined pieces are added tokens, matched
//!   before normalisation, control ones special.
//!
//! BOS is not added here (no post-processor): as for the byte-level
//! vocabularies, the importer writes `add_bos_token` and `bos_token` into
//! tokenizer_config.json.
//!
//! Costs: every split of every piece is one hash lookup per part:
//! about 2M lookups for Gemma 3's 262k pieces, then one sort of the ~515k
//! merges; about a second.

use crate::TokenizerError;
use crate::bpe_from_gguf::{TYPE_CONTROL, TYPE_MAX, TYPE_UNKNOWN, TYPE_USER_DEFINED};
use serde_json::{Map, Value, json};
use std::cmp::Ordering;
use std::collections::HashMap;

/// SentencePiece's word-boundary mark.
const SPACE_MARK: &str = "\u{2581}";

/// A GGUF SentencePiece vocabulary: `tokens[i]`, `scores[i]` and
/// `types[i]` describe id `i`.
pub struct SpmVocab<'a> {
    pub tokens: &'a [String],
    pub scores: &'a [f32],
    pub types: &'a [i32],
    /// `tokenizer.ggml.unknown_token_id`; when `None`, the first piece of
    /// the unknown type (2), if any.
    pub unk: Option<usize>,
    /// `tokenizer.ggml.add_space_prefix` (llama.cpp's default: true).
    pub add_space_prefix: bool,
}

/// Returns the tokenizer.json text for a GGUF SentencePiece vocabulary.
pub fn build_tokenizer_json(v: &SpmVocab) -> Result<String, TokenizerError> {
    let n = v.tokens.len();
    for (field, len) in [
        ("tokenizer.ggml.scores", v.scores.len()),
        ("tokenizer.ggml.token_type", v.types.len()),
    ] {
        if len != n {
            return Err(TokenizerError::Gguf {
                field,
                reason: format!("has {len} entries but tokenizer.ggml.tokens has {n}"),
            });
        }
    }
    let pieces = pieces(v)?;
    let ids = piece_ids(&pieces)?;
    let merges = merges(v, &pieces, &ids);
    let unk_id = v
        .unk
        .or_else(|| v.types.iter().position(|&t| t == TYPE_UNKNOWN));
    let unk = match unk_id {
        Some(u) => Some(pieces.get(u).ok_or_else(|| TokenizerError::Gguf {
            field: "tokenizer.ggml.unknown_token_id",
            reason: format!("{u} is outside the vocabulary of {n}"),
        })?),
        None => None,
    };
    let tj = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added_tokens(v, &pieces),
        "normalizer": normalizer(v.add_space_prefix),
        "pre_tokenizer": null,
        "post_processor": null,
        "decoder": decoder(v.add_space_prefix),
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": unk,
            "continuing_subword_prefix": null,
            "end_of_word_suffix": null,
            "fuse_unk": true,
            "byte_fallback": true,
            "ignore_merges": false,
            "vocab": Value::Object(pieces.iter().enumerate().map(|(i, p)| (p.clone(), json!(i))).collect::<Map<_, _>>()),
            "merges": merges.iter().map(|&(l, r)| json!([l, r])).collect::<Vec<_>>(),
        },
    });
    let text = serde_json::to_string(&tj).map_err(|e| TokenizerError::Gguf {
        field: "tokenizer.ggml.tokens",
        reason: format!("cannot serialise tokenizer.json: {e}"),
    })?;
    tokenizers::Tokenizer::from_bytes(text.as_bytes()).map_err(|e| TokenizerError::Gguf {
        field: "tokenizer.ggml.tokens",
        reason: format!("the built tokenizer.json does not load: {e}"),
    })?;
    Ok(text)
}

/// The vocabulary's pieces as SentencePiece spells them (user-defined
/// pieces with `▁` for the spaces llama.cpp's converter wrote).
fn pieces(v: &SpmVocab) -> Result<Vec<String>, TokenizerError> {
    v.tokens
        .iter()
        .zip(v.types)
        .enumerate()
        .map(|(id, (tok, &ty))| match ty {
            _ if !(0..=TYPE_MAX).contains(&ty) => Err(TokenizerError::Gguf {
                field: "tokenizer.ggml.token_type",
                reason: format!("token {id} ({tok:?}) has unknown type {ty}"),
            }),
            TYPE_USER_DEFINED => Ok(tok.replace(' ', SPACE_MARK)),
            _ => Ok(tok.clone()),
        })
        .collect()
}

/// Piece -> id; a piece listed twice is an error naming both ids.
fn piece_ids(pieces: &[String]) -> Result<HashMap<&str, usize>, TokenizerError> {
    let mut ids = HashMap::with_capacity(pieces.len());
    for (id, p) in pieces.iter().enumerate() {
        if let Some(prev) = ids.insert(p.as_str(), id) {
            return Err(TokenizerError::Gguf {
                field: "tokenizer.ggml.tokens",
                reason: format!("token {p:?} appears twice (ids {prev} and {id})"),
            });
        }
    }
    Ok(ids)
}

/// Every split of a piece into two vocabulary pieces, ranked as the module
/// doc says.
fn merges<'p>(
    v: &SpmVocab,
    pieces: &'p [String],
    ids: &HashMap<&str, usize>,
) -> Vec<(&'p str, &'p str)> {
    // (score, left, right), pieces in id order, each piece's splits by
    // their parts' ids: the order a stable sort keeps among equal ranks
    let mut all: Vec<(f32, &str, &str)> = Vec::new();
    for (id, p) in pieces.iter().enumerate() {
        let score = match v.types[id] {
            TYPE_USER_DEFINED => 0.0,
            _ => v.scores[id],
        };
        let mut local: Vec<(usize, usize, &str, &str)> = p
            .char_indices()
            .skip(1)
            .filter_map(|(k, _)| {
                let (l, r) = p.split_at(k);
                Some((*ids.get(l)?, *ids.get(r)?, l, r))
            })
            .collect();
        local.sort_unstable();
        all.extend(local.into_iter().map(|(_, _, l, r)| (score, l, r)));
    }
    let chars = |s: &str| s.chars().count();
    all.sort_by(|a, b| {
        b.0.partial_cmp(&a.0)
            .unwrap_or(Ordering::Equal)
            .then_with(|| chars(b.1).cmp(&chars(a.1)))
            .then_with(|| chars(b.2).cmp(&chars(a.2)))
    });
    all.into_iter().map(|(_, l, r)| (l, r)).collect()
}

/// Control and user-defined pieces, matched before normalisation.
fn added_tokens(v: &SpmVocab, pieces: &[String]) -> Vec<Value> {
    let added = |ty: i32| ty == TYPE_CONTROL || ty == TYPE_USER_DEFINED;
    pieces
        .iter()
        .zip(v.types)
        .enumerate()
        .filter(|(_, (_, ty))| added(**ty))
        .map(|(id, (p, &ty))| {
            json!({
                "id": id,
                "content": p,
                "single_word": false,
                "lstrip": false,
                "rstrip": false,
                "normalized": false,
                "special": ty == TYPE_CONTROL,
            })
        })
        .collect()
}

fn normalizer(add_space_prefix: bool) -> Value {
    let replace = json!({ "type": "Replace", "pattern": { "String": " " }, "content": SPACE_MARK });
    match add_space_prefix {
        false => replace,
        true => json!({
            "type": "Sequence",
            "normalizers": [{ "type": "Prepend", "prepend": SPACE_MARK }, replace],
        }),
    }
}

fn decoder(add_space_prefix: bool) -> Value {
    let mut steps = vec![
        json!({ "type": "Replace", "pattern": { "String": SPACE_MARK }, "content": " " }),
        json!({ "type": "ByteFallback" }),
        json!({ "type": "Fuse" }),
    ];
    if add_space_prefix {
        steps.push(json!({ "type": "Strip", "content": " ", "start": 1, "stop": 0 }));
    }
    json!({ "type": "Sequence", "decoders": steps })
}

#[cfg(test)]
mod tests;
