//! A self-made byte-level tokenizer for synthetic models.
//!
//! Contract: the vocabulary has exactly `vocab_size` ids and every id decodes:
//! the 256 bytes (as GPT-2 byte-level characters, no merges, so any text
//! encodes to one token per UTF-8 byte), the BOS and EOS specials at the ids
//! the model config names, and special filler tokens `<|filler_N|>` in every
//! remaining id. The BOS is added on encode (`add_bos_token`) and the chat
//! template is the Llama 3 header format. Output is plain JSON in the
//! `tokenizers` crate's `tokenizer.json` format plus a `tokenizer_config.json`.
//!
//! Costs: builds a JSON document with `vocab_size` entries.

use serde_json::{Value, json};

pub const BOS: &str = "<|begin_of_text|>";
pub const EOS: &str = "<|end_of_text|>";

/// Llama 3 header chat format, used as the synthetic models' chat template.
pub const CHAT_TEMPLATE: &str = "{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n{{ message['content'] | trim }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}";

/// GPT-2's byte -> printable character map used by byte-level BPE.
pub fn byte_to_char(b: u8) -> char {
    let printable = |x: u8| (33..=126).contains(&x) || (161..=172).contains(&x) || x >= 174;
    if printable(b) {
        return char::from(b);
    }
    // non-printable bytes map to 256, 257, ... in byte order
    let rank = (0..b).filter(|x| !printable(*x)).count() as u32;
    char::from_u32(256 + rank).unwrap_or('\u{FFFD}')
}

/// The id layout: bytes fill the lowest ids not taken by BOS/EOS, fillers the rest.
/// Requires `vocab_size >= 258` and distinct `bos`, `eos` below it (checked by the caller).
fn layout(vocab_size: usize, bos: u32, eos: u32) -> Vec<Token> {
    let mut out = Vec::with_capacity(vocab_size);
    let mut next_byte = 0usize;
    let mut fillers = 0usize;
    for id in 0..vocab_size as u32 {
        if id == bos {
            out.push(Token::Special(BOS.to_string()));
        } else if id == eos {
            out.push(Token::Special(EOS.to_string()));
        } else if next_byte < 256 {
            out.push(Token::Byte(byte_to_char(next_byte as u8)));
            next_byte += 1;
        } else {
            out.push(Token::Special(format!("<|filler_{fillers}|>")));
            fillers += 1;
        }
    }
    out
}

enum Token {
    Byte(char),
    Special(String),
}

/// `tokenizer.json` text for a byte-level vocabulary of `vocab_size` ids.
pub fn tokenizer_json(vocab_size: usize, bos: u32, eos: u32) -> String {
    let tokens = layout(vocab_size, bos, eos);
    let mut vocab = serde_json::Map::new();
    let mut added = Vec::new();
    for (id, t) in tokens.iter().enumerate() {
        match t {
            Token::Byte(c) => {
                vocab.insert(c.to_string(), json!(id));
            }
            Token::Special(s) => {
                vocab.insert(s.clone(), json!(id));
                added.push(
                    json!({"id": id, "content": s, "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": true}),
                );
            }
        }
    }
    let doc = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": BOS, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": BOS, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": BOS, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {BOS: {"id": BOS, "ids": [bos], "tokens": [BOS]}}
        },
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "ignore_merges": false, "vocab": Value::Object(vocab), "merges": []}
    });
    format!("{doc:#}")
}

/// `tokenizer_config.json` text matching [`tokenizer_json`].
pub fn tokenizer_config_json(max_len: usize) -> String {
    let doc = json!({
        "add_bos_token": true,
        "add_eos_token": false,
        "bos_token": BOS,
        "eos_token": EOS,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": false,
        "model_max_length": max_len,
        "tokenizer_class": "PreTrainedTokenizerFast"
    });
    format!("{doc:#}")
}
