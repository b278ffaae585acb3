//! Test fixture: a small GGUF-style byte-level BPE vocabulary (control tokens,
//! the 256 byte symbols, and chains of merges building a few words), shared
//! by the tokenizer, chat and detokenizer tests.

use crate::Tokenizer;
use crate::bpe_from_gguf::build_tokenizer_json;

/// GPT-2's byte-to-unicode map: printable bytes map to themselves, the rest
/// to U+0100 onwards in byte order.
pub fn byte_char(b: u8) -> char {
    let printable = |x: u8| (b'!'..=b'~').contains(&x) || (0xA1..=0xAC).contains(&x) || x >= 0xAE;
    if printable(b) {
        char::from(b)
    } else {
        let rank = (0..b).filter(|&x| !printable(x)).count() as u32;
        char::from_u32(0x100 + rank).unwrap_or('?')
    }
}

/// Byte-level form of `text` (each UTF-8 byte as its symbol).
pub fn byte_level(text: &str) -> String {
    text.bytes().map(byte_char).collect()
}

pub const CHAT_SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
pub const LLAMA3_SPECIALS: [&str; 4] = [
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
];

/// Words the merges build (as text; spaces become `Ġ`).
pub const WORDS: [&str; 14] = [
    " the",
    "The",
    " capital",
    " of",
    " France",
    " is",
    "Hello",
    " world",
    "12",
    "123",
    "  ",
    "\n\n",
    "user",
    "assistant",
];

/// `(tokens, merges, token_types)` of the fixture; Llama 3 header tokens are
/// included when `llama3` is set.
pub fn vocab(llama3: bool) -> (Vec<String>, Vec<String>, Vec<i32>) {
    let mut tokens: Vec<String> = CHAT_SPECIALS.iter().map(|s| s.to_string()).collect();
    if llama3 {
        tokens.extend(LLAMA3_SPECIALS.iter().map(|s| s.to_string()));
    }
    let n_special = tokens.len();
    tokens.extend((0..=255u8).map(|b| byte_char(b).to_string()));
    let mut merges = Vec::new();
    for word in WORDS {
        let symbols: Vec<String> = byte_level(word).chars().map(String::from).collect();
        let mut acc = symbols[0].clone();
        for s in &symbols[1..] {
            let merge = format!("{acc} {s}");
            acc.push_str(s);
            if !merges.contains(&merge) {
                merges.push(merge);
                tokens.push(acc.clone());
            }
        }
    }
    let mut types = vec![3; n_special];
    types.resize(tokens.len(), 1);
    (tokens, merges, types)
}

/// The fixture's tokenizer.json with the given pre-tokenizer type.
pub fn tokenizer_json(llama3: bool, pre: &str) -> String {
    let (tokens, merges, types) = vocab(llama3);
    match build_tokenizer_json(&tokens, &merges, &types, pre) {
        Ok(j) => j,
        Err(e) => panic!("fixture tokenizer.json: {e}"),
    }
}

/// The fixture tokenizer (SmolLM-style: `smollm` pre-tokenizer), with an
/// optional tokenizer_config.json text.
pub fn tokenizer(llama3: bool, config: Option<&str>) -> Tokenizer {
    let j = tokenizer_json(llama3, "smollm");
    match Tokenizer::from_json(&j, config, "fixture") {
        Ok(t) => t,
        Err(e) => panic!("fixture tokenizer: {e}"),
    }
}
