use super::*;
use crate::bpe_from_gguf::fixture;
use proptest::prelude::*;

fn ok<T, E: std::fmt::Display>(r: Result<T, E>) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("{e}"),
    }
}

/// A Llama 2 style SentencePiece tokenizer: Metaspace, byte fallback, and a
/// decoder that drops the leading space of the first token.
fn sentencepiece_json() -> String {
    let mut vocab = serde_json::Map::new();
    vocab.insert("<unk>".into(), 0.into());
    vocab.insert("<s>".into(), 1.into());
    for b in 0..=255u32 {
        vocab.insert(format!("<0x{b:02X}>"), (b + 2).into());
    }
    for (i, piece) in ["▁Hello", "▁world", "!", "▁", "a", "▁▁", "é", "lo"]
        .iter()
        .enumerate()
    {
        vocab.insert(piece.to_string(), (258 + i).into());
    }
    serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [{"id": 1, "content": "<s>", "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true}],
        "normalizer": null,
        "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": false},
        "post_processor": null,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>",
            "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": true,
            "byte_fallback": true, "ignore_merges": false, "vocab": vocab, "merges": []}
    })
    .to_string()
}

fn sentencepiece() -> Arc<Tokenizer> {
    Arc::new(ok(Tokenizer::from_json(&sentencepiece_json(), None, "sp")))
}

fn byte_level() -> Arc<Tokenizer> {
    Arc::new(fixture::tokenizer(false, None))
}

/// Pushes every id; returns the deltas (the flush last).
fn stream(tok: &Arc<Tokenizer>, ids: &[u32], skip_special: bool) -> Vec<String> {
    let mut dec = IncrementalDecoder::new(tok.clone(), skip_special);
    let mut out: Vec<String> = ids.iter().map(|&id| ok(dec.push(id))).collect();
    out.push(ok(dec.flush()));
    assert_eq!(dec.text(), out.concat());
    assert_eq!(dec.num_tokens(), ids.len());
    out
}

#[test]
fn emoji_split_across_byte_tokens_is_held_until_complete() {
    let tok = byte_level();
    let ids = ok(tok.encode("a😀b", false));
    assert_eq!(ids.len(), 6, "a + 4 byte tokens + b");
    let deltas = stream(&tok, &ids, false);
    assert_eq!(deltas, ["a", "", "", "", "😀", "b", ""]);
}

#[test]
fn holding_is_true_only_while_a_character_is_incomplete() {
    let tok = byte_level();
    let mut ids = vec![1];
    ids.extend(ok(tok.encode("a😀b", false)));
    let mut dec = IncrementalDecoder::new(tok, true);
    let held: Vec<bool> = ids
        .iter()
        .map(|&id| {
            ok(dec.push(id));
            dec.holding()
        })
        .collect();
    // the skipped special token holds nothing back; the emoji's first three bytes do
    assert_eq!(held, [false, false, true, true, true, false, false]);
}

#[test]
fn ids_past_the_vocabulary_add_no_text() {
    let tok = byte_level();
    let past = tok.vocab_size() as u32 + 3;
    let mut ids = ok(tok.encode("a😀", false));
    ids.insert(2, past); // inside the emoji's bytes: still held back
    ids.push(past);
    let mut dec = IncrementalDecoder::new(tok.clone(), true);
    let deltas: Vec<String> = ids.iter().map(|&id| ok(dec.push(id))).collect();
    assert_eq!(deltas.concat(), "a😀");
    assert_eq!(deltas.last().map(String::as_str), Some(""));
    assert!(!dec.holding());
    assert_eq!(dec.num_tokens(), ids.len());
    assert!(tok.decode(&[past], true).is_err());
}

#[test]
fn sentencepiece_leading_spaces_survive() {
    let tok = sentencepiece();
    let id = |p: &str| tok.token_to_id(p).unwrap_or(u32::MAX);
    let ids = [id("▁Hello"), id("▁world"), id("!"), id("▁"), id("▁Hello")];
    assert_eq!(ok(tok.decode(&ids, false)), "Hello world!  Hello");
    let deltas = stream(&tok, &ids, false);
    assert_eq!(deltas, ["Hello", " world", "!", " ", " Hello", ""]);
}

#[test]
fn sentencepiece_byte_fallback_is_held_until_complete() {
    let tok = sentencepiece();
    // byte-fallback tokens E2 82 AC spell "€"
    let ids: Vec<u32> = [0xE2u32, 0x82, 0xAC].iter().map(|b| b + 2).collect();
    let mut all = vec![tok.token_to_id("a").unwrap_or(0)];
    all.extend(&ids);
    let deltas = stream(&tok, &all, false);
    assert_eq!(deltas, ["a", "", "", "€", ""]);
}

#[test]
fn flush_emits_an_incomplete_character_as_replacement() {
    let tok = byte_level();
    let ids = ok(tok.encode("😀", false));
    let deltas = stream(&tok, &ids[..2], false);
    assert_eq!(deltas.concat(), "\u{FFFD}");
    assert_eq!(deltas.last().map(String::as_str), Some("\u{FFFD}"));
}

#[test]
fn skip_special_leaves_special_tokens_out() {
    let tok = byte_level();
    let mut ids = vec![1];
    ids.extend(ok(tok.encode("Hello world", false)));
    ids.push(2);
    assert_eq!(stream(&tok, &ids, true).concat(), "Hello world");
    assert_eq!(
        stream(&tok, &ids, false).concat(),
        "<|im_start|>Hello world<|im_end|>"
    );
}

#[test]
fn window_stays_small_on_long_streams() {
    let tok = byte_level();
    let ids = ok(tok.encode(&" the capital of France is".repeat(200), false));
    let mut dec = IncrementalDecoder::new(tok.clone(), false);
    for &id in &ids {
        ok(dec.push(id));
        assert!(dec.window.len() <= 2, "window grew to {}", dec.window.len());
    }
    assert_eq!(dec.text(), ok(tok.decode(&ids, false)));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn byte_level_pushes_concatenate_to_decode(
        ids in prop::collection::vec(0u32..300, 0..40),
        skip in any::<bool>(),
    ) {
        let tok = byte_level();
        let n = tok.vocab_size() as u32;
        let ids: Vec<u32> = ids.into_iter().map(|i| i % n).collect();
        let expected = ok(tok.decode(&ids, skip));
        prop_assert_eq!(stream(&tok, &ids, skip).concat(), expected);
    }

    /// SentencePiece pieces mixed with characters spelled as byte-fallback
    /// tokens. Byte runs are valid UTF-8 here: `ByteFallback` turns a whole
    /// invalid run into U+FFFD, which no streaming decoder can match.
    #[test]
    fn sentencepiece_pushes_concatenate_to_decode(
        items in prop::collection::vec(prop_oneof![
            (258u32..266).prop_map(|id| vec![id]),
            any::<char>().prop_map(|c| c.to_string().bytes().map(|b| u32::from(b) + 2).collect()),
            Just(vec![1u32]),
        ], 0..24),
        skip in any::<bool>(),
    ) {
        let tok = sentencepiece();
        let ids: Vec<u32> = items.concat();
        let expected = ok(tok.decode(&ids, skip));
        prop_assert_eq!(stream(&tok, &ids, skip).concat(), expected);
    }

    #[test]
    fn valid_text_never_streams_a_replacement_character(text in "\\PC{0,24}") {
        prop_assume!(!text.contains('\u{FFFD}'));
        let tok = byte_level();
        let ids = ok(tok.encode(&text, false));
        let deltas = stream(&tok, &ids, false);
        for d in &deltas {
            prop_assert!(!d.contains('\u{FFFD}'), "delta {:?} of {:?}", d, text);
        }
        prop_assert_eq!(deltas.concat(), text);
    }
}
