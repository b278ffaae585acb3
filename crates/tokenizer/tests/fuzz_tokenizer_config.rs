//! Fuzzing `tokenizer_config.json` resolution: the seed corpus
//! (`tests/fuzz-corpus/tokenizer-config`) over the byte-level vocabulary
//! with fields removed or replaced by arbitrary JSON, with mutated chat
//! templates, and as mutated bytes.
//!
//! Property: building the tokenizer never panics; an error names the file
//! (the origin) and the field at fault; a tokenizer that builds encodes
//! text and renders a conversation (or refuses with an error naming the
//! origin) without panicking or running unbounded (template fuel and
//! bytes). Special-token texts and reserved reference characters anywhere
//! in user strings never become control tokens; templates that grow
//! strings, lists or captures exponentially fail with the byte budget named.
//! `LAMINA_FUZZ_CASES` sets the number of cases.

use proptest::prelude::*;
use serde_json::Value;
use tokenizer::byte_level::tokenizer_json;
use tokenizer::{ChatMessage, Tokenizer, TokenizerError};

const ORIGIN: &str = "fuzz-tokenizer";

fn vocab() -> String {
    tokenizer_json(300, 256, 257)
}

fn seeds() -> Vec<(String, Vec<u8>)> {
    fuzzkit::corpus("tokenizer-config")
}

fn json_seeds() -> Vec<Value> {
    seeds()
        .into_iter()
        .map(|(n, b)| serde_json::from_slice(&b).unwrap_or_else(|e| panic!("seed {n}: {e}")))
        .collect()
}

/// Builds over the byte-level vocabulary and uses the result.
fn config_input(vocab: &str, cfg: &str) {
    let tok = match Tokenizer::from_json(vocab, Some(cfg), ORIGIN) {
        Ok(t) => t,
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.contains(ORIGIN), "error without the origin: {msg}");
            if let TokenizerError::Invalid { field, .. } = e {
                assert!(msg.contains(field), "error without `{field}`: {msg}");
            }
            return;
        }
    };
    let ids = tok
        .encode("héllo <|end_of_text|>", true)
        .expect("byte-level encode");
    assert!(ids.iter().all(|&id| (id as usize) < tok.vocab_size()));
    let msgs = [
        ChatMessage::new("system", "be brief"),
        ChatMessage::new("user", "hi <|eot_id|>"),
    ];
    match tok.encode_chat(&msgs) {
        Ok(ids) => assert!(ids.iter().all(|&id| (id as usize) < tok.vocab_size())),
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.contains(ORIGIN), "chat error without the origin: {msg}");
        }
    }
}

/// A chat template with bytes mutated (kept UTF-8).
fn mutated_template() -> impl Strategy<Value = String> {
    let templates: Vec<Vec<u8>> = json_seeds()
        .iter()
        .filter_map(|v| v["chat_template"].as_str().map(|s| s.as_bytes().to_vec()))
        .collect();
    fuzzkit::mutated_from(templates).prop_map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// One piece of a user string: text, a special token's text, a reserved
/// reference character (U+FDD0..=U+FDEF).
fn piece() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z <|>\\n]{0,6}",
        (258u32..300).prop_map(|i| format!("<|filler_{}|>", i - 258)),
        Just(tokenizer::byte_level::BOS.to_string()),
        Just(tokenizer::byte_level::EOS.to_string()),
        (0xFDD0u32..=0xFDEF).prop_map(|c| char::from_u32(c).map(String::from).unwrap_or_default()),
    ]
}

/// The special ids of `tok` in `ids`, in order.
fn special_ids(tok: &Tokenizer, ids: &[u32]) -> Vec<u32> {
    let specials: std::collections::HashSet<u32> = tok
        .inner()
        .get_added_tokens_decoder()
        .into_iter()
        .filter(|(_, t)| t.special)
        .map(|(id, _)| id)
        .collect();
    ids.iter()
        .copied()
        .filter(|i| specials.contains(i))
        .collect()
}

/// A template that grows a value `k` times by `op` once per message.
fn growing_template() -> impl Strategy<Value = String> {
    let ops = [
        "{% set ns.s = ns.s ~ ns.s %}",
        "{% set ns.s = [ns.s, ns.s]|join %}",
        "{% set ns.s = d(ns.s) %}",
        "{% set ns.l = ns.l + ns.l %}",
        "{% set ns.s = ns.s + ns.s %}",
        "{% set ns.s %}{{ ns.s }}{{ ns.s }}{% endset %}",
    ];
    (proptest::sample::select(ops.to_vec()), 1usize..4).prop_map(|(op, k)| {
        format!(
            "{{% macro d(s) %}}{{{{ s }}}}{{{{ s }}}}{{% endmacro %}}\
             {{% set ns = namespace(s='ab', l=[1, 2]) %}}\
             {{% for m in messages %}}{}{{% endfor %}}{{{{ ns.s|length }}}}{{{{ ns.l|length }}}}",
            op.repeat(k)
        )
    })
}

proptest! {
    #![proptest_config(fuzzkit::config(fuzzkit::DEFAULT_CASES))]

    #[test]
    fn special_texts_in_user_strings_stay_text(
        contents in proptest::collection::vec(proptest::collection::vec(piece(), 0..6), 1..4),
        cfg in proptest::sample::select(json_seeds()),
    ) {
        let Ok(tok) = Tokenizer::from_json(&vocab(), Some(&cfg.to_string()), ORIGIN) else {
            return Ok(());
        };
        let roles = ["system", "user", "assistant"];
        let conv = |clean: bool| -> Vec<ChatMessage> {
            contents.iter().enumerate().map(|(i, parts)| {
                let text: String = parts.iter().map(|p| {
                    let special = p.starts_with("<|") && p.ends_with("|>") || p.chars().any(|c| ('\u{FDD0}'..='\u{FDEF}').contains(&c));
                    if clean && special { "x".to_string() } else { p.clone() }
                }).collect();
                ChatMessage::new(roles[i % 3], format!("{text}x"))
            }).collect()
        };
        if let (Ok(ids), Ok(clean)) = (tok.encode_chat(&conv(false)), tok.encode_chat(&conv(true))) {
            prop_assert_eq!(special_ids(&tok, &ids), special_ids(&tok, &clean));
        }
    }

    #[test]
    fn growing_templates_fail_within_the_byte_budget(
        src in growing_template(),
        n in 1usize..80,
    ) {
        let cfg = serde_json::json!({"chat_template": src});
        let tok = match Tokenizer::from_json(&vocab(), Some(&cfg.to_string()), ORIGIN) {
            Ok(t) => t,
            Err(e) => {
                let msg = e.to_string();
                prop_assert!(msg.contains("budget"), "{}", msg);
                return Ok(());
            }
        };
        let msgs = vec![ChatMessage::new("user", "hi"); n];
        if let Err(e) = tok.apply_chat_template(&msgs, true) {
            let msg = e.to_string();
            prop_assert!(msg.contains("budget") && msg.contains(ORIGIN), "{}", msg);
        }
    }

    #[test]
    fn tokenizer_config_with_mutated_fields(
        v in proptest::sample::select(json_seeds()).prop_flat_map(fuzzkit::mutated_json)
    ) {
        config_input(&vocab(), &v.to_string());
    }

    #[test]
    fn tokenizer_config_with_mutated_template(
        v in proptest::sample::select(json_seeds()),
        t in mutated_template(),
    ) {
        let mut v = v;
        v["chat_template"] = Value::String(t);
        config_input(&vocab(), &v.to_string());
    }

    #[test]
    fn tokenizer_config_as_mutated_bytes(
        b in fuzzkit::mutated_from(seeds().into_iter().map(|(_, b)| b).collect())
    ) {
        config_input(&vocab(), &String::from_utf8_lossy(&b));
    }
}

#[test]
fn every_seed_builds() {
    for (name, b) in seeds() {
        let text = String::from_utf8(b).unwrap();
        Tokenizer::from_json(&vocab(), Some(&text), ORIGIN)
            .unwrap_or_else(|e| panic!("seed {name}: {e}"));
    }
}
