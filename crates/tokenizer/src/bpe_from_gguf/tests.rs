use super::fixture::{self, byte_level};
use super::*;

fn load(pre: &str) -> tokenizers::Tokenizer {
    let j = fixture::tokenizer_json(false, pre);
    match tokenizers::Tokenizer::from_bytes(j.as_bytes()) {
        Ok(t) => t,
        Err(e) => panic!("{e}"),
    }
}

fn pieces(tok: &tokenizers::Tokenizer, text: &str) -> Vec<String> {
    match tok.encode(text, true) {
        Ok(enc) => enc.get_tokens().to_vec(),
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn byte_char_matches_gpt2_table() {
    assert_eq!(fixture::byte_char(b' '), 'Ġ');
    assert_eq!(fixture::byte_char(b'\n'), 'Ċ');
    assert_eq!(fixture::byte_char(b'a'), 'a');
    assert_eq!(fixture::byte_char(0xAD), 'Ń');
    assert_eq!(fixture::byte_char(0xFF), 'ÿ');
    let all: std::collections::HashSet<char> = (0..=255u8).map(fixture::byte_char).collect();
    assert_eq!(all.len(), 256);
}

#[test]
fn smollm_splits_every_digit_even_with_a_merge_for_it() {
    let tok = load("smollm");
    // the fixture has merges "1 2" and "12 3"; SmolLM2 still isolates digits
    assert_eq!(pieces(&tok, "123"), ["1", "2", "3"]);
    assert_eq!(pieces(&tok, "a12"), ["a", "1", "2"]);
    // words merge, leading spaces attach to the word (GPT-2 regex)
    assert_eq!(
        pieces(&tok, "The capital of France is"),
        ["The", "Ġcapital", "Ġof", "ĠFrance", "Ġis"]
    );
    // the space before a digit stays alone: digits are split off first
    assert_eq!(pieces(&tok, " 1"), ["Ġ", "1"]);
    // whitespace runs: `\s+(?!\S)` leaves the last space to the next word
    assert_eq!(pieces(&tok, "   the"), ["ĠĠ", "Ġthe"]);
    assert_eq!(pieces(&tok, "Hello\n\n"), ["Hello", "ĊĊ"]);
}

#[test]
fn llama_bpe_groups_digits_by_three() {
    let tok = load("llama-bpe");
    assert_eq!(pieces(&tok, "123"), ["123"]);
    assert_eq!(pieces(&tok, "1234"), ["123", "4"]);
    assert_eq!(pieces(&tok, "The capital"), ["The", "Ġcapital"]);
    assert_eq!(pieces(&tok, "The 123"), ["The", "Ġ", "123"]);
}

#[test]
fn qwen2_splits_every_digit_and_keeps_merges() {
    let tok = load("qwen2");
    // Qwen's regex takes digits one at a time, unlike Llama 3's groups of three
    assert_eq!(pieces(&tok, "123"), ["1", "2", "3"]);
    assert_eq!(pieces(&tok, "The capital"), ["The", "Ġcapital"]);
    assert_eq!(pieces(&tok, "The 12"), ["The", "Ġ", "1", "2"]);
}

#[test]
fn control_tokens_are_special_and_whole() {
    let (tokens, merges, types) = fixture::vocab(false);
    let json = match build_tokenizer_json(&tokens, &merges, &types, "smollm") {
        Ok(j) => j,
        Err(e) => panic!("{e}"),
    };
    let tok = match tokenizers::Tokenizer::from_bytes(json.as_bytes()) {
        Ok(t) => t,
        Err(e) => panic!("{e}"),
    };
    let enc = match tok.encode("<|im_start|>user", false) {
        Ok(e) => e,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(enc.get_tokens(), ["<|im_start|>", "user"]);
    assert_eq!(enc.get_ids()[0], 1);
    let skipped = tok.decode(enc.get_ids(), true).unwrap_or_default();
    assert_eq!(skipped, "user");
    let kept = tok.decode(enc.get_ids(), false).unwrap_or_default();
    assert_eq!(kept, "<|im_start|>user");
}

#[test]
fn user_defined_tokens_are_added_but_not_special() {
    let (mut tokens, merges, mut types) = fixture::vocab(false);
    tokens.push("<tool>".to_string());
    types.push(4);
    let json = build_tokenizer_json(&tokens, &merges, &types, "smollm").unwrap_or_default();
    let tok = tokenizers::Tokenizer::from_bytes(json.as_bytes());
    let Ok(tok) = tok else {
        panic!("does not load")
    };
    let id = tok.token_to_id("<tool>");
    assert_eq!(id, Some(tokens.len() as u32 - 1));
    let enc = tok.encode("a<tool>", false).map(|e| e.get_ids().to_vec());
    assert_eq!(enc.ok().and_then(|ids| ids.last().copied()), id);
    // not special: skip_special keeps it
    let text = tok
        .decode(&[tokens.len() as u32 - 1], true)
        .unwrap_or_default();
    assert_eq!(text, "<tool>");
}

#[test]
fn byte_level_roundtrip_of_unicode() {
    let tok = load("smollm");
    for text in [
        "héllo wörld 😀",
        "日本語\ttab",
        "  lead and trail  ",
        "mixed 42 and 3.14",
    ] {
        let ids = tok.encode(text, false).map(|e| e.get_ids().to_vec());
        let Ok(ids) = ids else {
            panic!("encode {text:?}")
        };
        assert_eq!(tok.decode(&ids, false).unwrap_or_default(), text);
    }
    assert_eq!(byte_level("😀").chars().count(), 4);
}

#[test]
fn unknown_pre_is_an_error_naming_it() {
    let (tokens, merges, types) = fixture::vocab(false);
    let err = build_tokenizer_json(&tokens, &merges, &types, "qwen9");
    let msg = err.map(|_| String::new()).unwrap_or_else(|e| e.to_string());
    assert!(msg.contains("`qwen9`"), "{msg}");
}

#[test]
fn malformed_inputs_are_errors_naming_the_field() {
    let (tokens, merges, types) = fixture::vocab(false);
    let msg =
        |r: Result<String, TokenizerError>| r.err().map(|e| e.to_string()).unwrap_or_default();

    let m = msg(build_tokenizer_json(
        &tokens,
        &merges,
        &types[1..],
        "smollm",
    ));
    assert!(m.contains("token_type") && m.contains("entries"), "{m}");

    let mut bad = merges.clone();
    bad.push("nospace".to_string());
    let m = msg(build_tokenizer_json(&tokens, &bad, &types, "smollm"));
    assert!(m.contains("merges") && m.contains("nospace"), "{m}");

    let mut bad = merges.clone();
    bad.push("zzz qqq".to_string());
    let m = msg(build_tokenizer_json(&tokens, &bad, &types, "smollm"));
    assert!(m.contains("merges") && m.contains("does not load"), "{m}");

    let mut dup = tokens.clone();
    dup.push("Ġthe".to_string());
    let mut dup_types = types.clone();
    dup_types.push(1);
    let m = msg(build_tokenizer_json(&dup, &merges, &dup_types, "smollm"));
    assert!(m.contains("appears twice"), "{m}");

    let mut bad_types = types.clone();
    bad_types[5] = 9;
    let m = msg(build_tokenizer_json(&tokens, &merges, &bad_types, "smollm"));
    assert!(m.contains("unknown type 9"), "{m}");
}
