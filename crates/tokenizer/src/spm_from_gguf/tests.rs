use super::*;

/// A small SentencePiece vocabulary: `<unk>`, `<s>`, `</s>`, the 256 byte
/// pieces, then `▁ h e l o ll ▁h he llo` (scores falling with the id) and a
/// user-defined two-space piece as llama.cpp's converter writes it.
struct Fixture {
    tokens: Vec<String>,
    scores: Vec<f32>,
    types: Vec<i32>,
}

const NORMAL: [&str; 9] = ["▁", "h", "e", "l", "o", "ll", "▁h", "he", "llo"];
const FIRST_NORMAL: u32 = 259;

fn fixture() -> Fixture {
    let mut tokens: Vec<String> = ["<unk>", "<s>", "</s>"].map(String::from).to_vec();
    let mut types = vec![2, TYPE_CONTROL, TYPE_CONTROL];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6); // byte
    }
    for t in NORMAL {
        tokens.push(t.to_string());
        types.push(1);
    }
    tokens.push("  ".to_string());
    types.push(TYPE_USER_DEFINED);
    let scores = (0..tokens.len())
        .map(|i| match types[i] {
            1 => -(i as f32),
            _ => -1000.0,
        })
        .collect();
    Fixture {
        tokens,
        scores,
        types,
    }
}

fn vocab(f: &Fixture, add_space_prefix: bool) -> SpmVocab<'_> {
    SpmVocab {
        tokens: &f.tokens,
        scores: &f.scores,
        types: &f.types,
        unk: Some(0),
        add_space_prefix,
    }
}

fn id(piece: &str) -> u32 {
    let pos = NORMAL.iter().position(|p| *p == piece);
    FIRST_NORMAL + pos.expect("a fixture piece") as u32
}

fn encode(json: &str, text: &str) -> Vec<u32> {
    let t = tokenizers::Tokenizer::from_bytes(json.as_bytes()).expect("loads");
    t.encode(text, false).expect("encodes").get_ids().to_vec()
}

#[test]
fn merges_follow_the_scores() {
    let f = fixture();
    let json = build_tokenizer_json(&vocab(&f, false)).expect("builds");
    // `ll` (best score) first, then `he`, then `llo`
    assert_eq!(encode(&json, "hello"), [id("he"), id("llo")]);
    // `▁h` outranks `he`: SentencePiece merges the better-scored pair first
    assert_eq!(encode(&json, " hello"), [id("▁h"), id("e"), id("llo")]);
}

#[test]
fn unknown_characters_fall_back_to_bytes() {
    let f = fixture();
    let json = build_tokenizer_json(&vocab(&f, false)).expect("builds");
    // é is C3 A9 in UTF-8; byte piece `<0xNN>` has id 3 + NN
    assert_eq!(encode(&json, "hé"), [id("h"), 3 + 0xC3, 3 + 0xA9]);
}

#[test]
fn a_space_prefix_is_added_and_decoded_away() {
    let f = fixture();
    let json = build_tokenizer_json(&vocab(&f, true)).expect("builds");
    let ids = encode(&json, "hello");
    assert_eq!(ids, [id("▁h"), id("e"), id("llo")]);
    let t = tokenizers::Tokenizer::from_bytes(json.as_bytes()).expect("loads");
    assert_eq!(t.decode(&ids, false).expect("decodes"), "hello");
}

#[test]
fn user_defined_pieces_get_their_marks_back_and_rank_first() {
    let f = fixture();
    let json = build_tokenizer_json(&vocab(&f, false)).expect("builds");
    let two_spaces = f.tokens.len() as u32 - 1;
    assert_eq!(encode(&json, "  "), [two_spaces]);
    let tj: Value = serde_json::from_str(&json).expect("json");
    assert_eq!(tj["model"]["merges"][0], json!(["▁", "▁"]));
    let added: Vec<&str> = tj["added_tokens"]
        .as_array()
        .expect("added tokens")
        .iter()
        .filter_map(|a| a["content"].as_str())
        .collect();
    assert_eq!(added, ["<s>", "</s>", "▁▁"]);
}

#[test]
fn bad_vocabularies_are_refused_by_field() {
    let f = fixture();
    let short = &f.scores[1..];
    let v = SpmVocab {
        scores: short,
        ..vocab(&f, false)
    };
    let e = build_tokenizer_json(&v)
        .expect_err("scores too short")
        .to_string();
    assert!(e.contains("tokenizer.ggml.scores"), "{e}");
    let mut dup = f.tokens.clone();
    dup[FIRST_NORMAL as usize + 1] = "▁".into();
    let v = SpmVocab {
        tokens: &dup,
        ..vocab(&f, false)
    };
    let e = build_tokenizer_json(&v).expect_err("duplicate").to_string();
    assert!(e.contains("appears twice"), "{e}");
    let v = SpmVocab {
        unk: Some(100_000),
        ..vocab(&f, false)
    };
    let e = build_tokenizer_json(&v)
        .expect_err("unk outside")
        .to_string();
    assert!(e.contains("tokenizer.ggml.unknown_token_id"), "{e}");
    let mut types = f.types.clone();
    types[5] = 9;
    let v = SpmVocab {
        types: &types,
        ..vocab(&f, false)
    };
    let e = build_tokenizer_json(&v).expect_err("bad type").to_string();
    assert!(e.contains("unknown type 9"), "{e}");
}
