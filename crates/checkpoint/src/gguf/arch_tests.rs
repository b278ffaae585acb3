//! Import of the Qwen GGUF architectures (`qwen2`, `qwen3`): tiny files
//! written with llama.cpp's metadata keys and tensor names, imported, and
//! read back: the config is the family's, the extra tensors (Q/K/V biases,
//! QK-norm weights) land under their Hugging Face names, and no Q/K row
//! permutation is undone (llama.cpp writes these families unpermuted).

use super::tests::{Builder, gstr};
use super::*;
use half::bf16;
use std::collections::HashMap;

const T_U32: u32 = 4;
const T_F32: u32 = 6;
const T_BOOL: u32 = 7;
const T_STRING: u32 = 8;
const T_ARRAY: u32 = 9;
const GGML_F32: u32 = 0;
const TOKENS: [&str; 6] = ["a", "b", "c", "<|endoftext|>", "<|im_start|>", "<|im_end|>"];
const HIDDEN: u64 = 8;
const HEADS: u64 = 2;
const KV_HEADS: u64 = 1;
const HEAD_DIM: u64 = 4;
const FFN: u64 = 16;

fn string(s: &str) -> Vec<u8> {
    let mut v = Vec::new();
    gstr(&mut v, s);
    v
}

fn strings(items: &[&str]) -> Vec<u8> {
    let mut v = T_STRING.to_le_bytes().to_vec();
    v.extend((items.len() as u64).to_le_bytes());
    for s in items {
        gstr(&mut v, s);
    }
    v
}

/// Distinct values, exact in BF16: element `i` of tensor number `t`.
fn value(t: usize, i: usize) -> f32 {
    ((t * 31 + i * 7) % 97) as f32 / 64.0 - 0.75
}

/// The `[rows, cols]` row-major tensors of a one-layer model of `arch`.
fn tensors(arch: &str) -> Vec<(String, Vec<u64>)> {
    let (q, kv) = (HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM);
    let vocab = TOKENS.len() as u64;
    let mut t = vec![
        ("token_embd.weight", vec![vocab, HIDDEN]),
        ("output_norm.weight", vec![HIDDEN]),
        ("blk.0.attn_norm.weight", vec![HIDDEN]),
        ("blk.0.attn_q.weight", vec![q, HIDDEN]),
        ("blk.0.attn_k.weight", vec![kv, HIDDEN]),
        ("blk.0.attn_v.weight", vec![kv, HIDDEN]),
        ("blk.0.attn_output.weight", vec![HIDDEN, q]),
        ("blk.0.ffn_norm.weight", vec![HIDDEN]),
        ("blk.0.ffn_gate.weight", vec![FFN, HIDDEN]),
        ("blk.0.ffn_up.weight", vec![FFN, HIDDEN]),
        ("blk.0.ffn_down.weight", vec![HIDDEN, FFN]),
    ];
    match arch {
        "qwen2" => t.extend([
            ("blk.0.attn_q.bias", vec![q]),
            ("blk.0.attn_k.bias", vec![kv]),
            ("blk.0.attn_v.bias", vec![kv]),
        ]),
        "qwen3" => t.extend([
            ("blk.0.attn_q_norm.weight", vec![HEAD_DIM]),
            ("blk.0.attn_k_norm.weight", vec![HEAD_DIM]),
        ]),
        _ => {}
    }
    t.into_iter().map(|(n, s)| (n.to_string(), s)).collect()
}

/// A GGUF of `arch` as llama.cpp's converter writes one, without the
/// tensor `skip`.
fn qwen_gguf(arch: &str, skip: &str) -> Vec<u8> {
    gguf_with_vocab(arch, skip, false)
}

/// SentencePiece pieces of [`gguf_with_vocab`]'s `llama` vocabulary.
const SPM_TOKENS: [&str; 6] = ["<unk>", "<s>", "</s>", "\u{2581}", "a", "\u{2581}a"];

/// [`qwen_gguf`] with a byte-level BPE (`gpt2`) vocabulary, or with a
/// SentencePiece (`llama`) one when `spm`.
fn gguf_with_vocab(arch: &str, skip: &str, spm: bool) -> Vec<u8> {
    let mut b = Builder::default();
    let key = |k: &str| format!("{arch}.{k}");
    b.kv("general.architecture", T_STRING, &string(arch))
        .kv(&key("context_length"), T_U32, &64u32.to_le_bytes())
        .kv(
            &key("embedding_length"),
            T_U32,
            &(HIDDEN as u32).to_le_bytes(),
        )
        .kv(
            &key("feed_forward_length"),
            T_U32,
            &(FFN as u32).to_le_bytes(),
        )
        .kv(&key("block_count"), T_U32, &1u32.to_le_bytes())
        .kv(
            &key("attention.head_count"),
            T_U32,
            &(HEADS as u32).to_le_bytes(),
        )
        .kv(
            &key("attention.head_count_kv"),
            T_U32,
            &(KV_HEADS as u32).to_le_bytes(),
        )
        .kv(&key("rope.freq_base"), T_F32, &1_000_000f32.to_le_bytes())
        .kv(
            &key("attention.layer_norm_rms_epsilon"),
            T_F32,
            &1e-6f32.to_le_bytes(),
        );
    if arch == "qwen3" {
        b.kv(
            &key("attention.key_length"),
            T_U32,
            &(HEAD_DIM as u32).to_le_bytes(),
        )
        .kv(
            &key("attention.value_length"),
            T_U32,
            &(HEAD_DIM as u32).to_le_bytes(),
        );
    }
    let tokens: &[&str] = if spm { &SPM_TOKENS } else { &TOKENS };
    let mut types = 5u32.to_le_bytes().to_vec(); // i32
    types.extend((tokens.len() as u64).to_le_bytes());
    for (i, t) in tokens.iter().enumerate() {
        let ty: i32 = match (spm, i) {
            (true, 0) => 2,
            (true, 1 | 2) => 3,
            (false, _) if t.starts_with("<|") => 3,
            _ => 1,
        };
        types.extend(ty.to_le_bytes());
    }
    if spm {
        let mut scores = T_F32.to_le_bytes().to_vec();
        scores.extend((tokens.len() as u64).to_le_bytes());
        for i in 0..tokens.len() {
            scores.extend((-(i as f32)).to_le_bytes());
        }
        b.kv("tokenizer.ggml.model", T_STRING, &string("llama"))
            .kv("tokenizer.ggml.scores", T_ARRAY, &scores)
            .kv("tokenizer.ggml.add_space_prefix", T_BOOL, &[0]);
    } else {
        b.kv("tokenizer.ggml.model", T_STRING, &string("gpt2"))
            .kv("tokenizer.ggml.pre", T_STRING, &string("qwen2"))
            .kv("tokenizer.ggml.merges", T_ARRAY, &strings(&[]));
    }
    b.kv("tokenizer.ggml.tokens", T_ARRAY, &strings(tokens))
        .kv("tokenizer.ggml.token_type", T_ARRAY, &types)
        .kv("tokenizer.ggml.eos_token_id", T_U32, &5u32.to_le_bytes())
        .kv(
            "tokenizer.ggml.padding_token_id",
            T_U32,
            &3u32.to_le_bytes(),
        )
        .kv("tokenizer.ggml.bos_token_id", T_U32, &3u32.to_le_bytes())
        .kv("tokenizer.ggml.add_bos_token", T_BOOL, &[0])
        .kv(
            "tokenizer.chat_template",
            T_STRING,
            &string("{{ messages[0].content }}"),
        );
    let data: Vec<(String, Vec<u64>, u32, Vec<u8>)> = tensors(arch)
        .into_iter()
        .enumerate()
        .filter(|(_, (name, _))| name != skip)
        .map(|(k, (name, shape))| {
            let n: u64 = shape.iter().product();
            let bytes = (0..n as usize)
                .flat_map(|i| value(k, i).to_le_bytes())
                .collect();
            let dims = shape.iter().rev().copied().collect();
            (name, dims, GGML_F32, bytes)
        })
        .collect();
    let refs: Vec<(&str, Vec<u64>, u32, Vec<u8>)> = data
        .iter()
        .map(|(n, d, t, b)| (n.as_str(), d.clone(), *t, b.clone()))
        .collect();
    b.build(3, 32, &refs)
}

/// Imports `arch`'s file; returns the config and every tensor as f32.
fn import(arch: &str) -> (serde_json::Value, HashMap<String, Vec<f32>>) {
    let buf = qwen_gguf(arch, "");
    let dir = tempfile::tempdir().unwrap();
    let g = Gguf::parse(&buf, "tiny.gguf").unwrap();
    import_to_dir(&g, &buf, dir.path(), None).unwrap();
    let cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("config.json")).unwrap()).unwrap();
    let st = std::fs::read(dir.path().join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&st).unwrap();
    let weights = st
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            let xs = view
                .data()
                .chunks_exact(2)
                .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect();
            (name, xs)
        })
        .collect();
    (cfg, weights)
}

#[test]
fn qwen3_imports_with_qk_norm_and_unpermuted_rows() {
    let (cfg, w) = import("qwen3");
    assert_eq!(cfg["architectures"][0], "Qwen3ForCausalLM");
    assert_eq!(cfg["model_type"], "qwen3");
    assert_eq!(cfg["attention_bias"], false);
    assert_eq!(cfg["head_dim"], HEAD_DIM);
    assert_eq!(cfg["rms_norm_eps"], 1e-6);
    assert_eq!(cfg["rope_theta"], 1e6);
    assert_eq!(cfg["tie_word_embeddings"], true);
    let names = tensors("qwen3");
    for (k, (gguf, shape)) in names.iter().enumerate() {
        let hf = Arch::Qwen3.hf_name(gguf).unwrap();
        let n: u64 = shape.iter().product();
        let want: Vec<f32> = (0..n as usize).map(|i| value(k, i)).collect();
        assert_eq!(w.get(&hf), Some(&want), "{gguf} as {hf}");
    }
    assert!(w.contains_key("model.layers.0.self_attn.q_norm.weight"));
    assert!(w.contains_key("model.layers.0.self_attn.k_norm.weight"));
}

#[test]
fn qwen2_imports_with_qkv_biases() {
    let (cfg, w) = import("qwen2");
    assert_eq!(cfg["architectures"][0], "Qwen2ForCausalLM");
    assert!(cfg.get("attention_bias").is_none(), "{cfg}");
    for b in ["q_proj", "k_proj", "v_proj"] {
        assert!(
            w.contains_key(&format!("model.layers.0.self_attn.{b}.bias")),
            "{b}"
        );
    }
    let q = &w["model.layers.0.self_attn.q_proj.weight"];
    let want: Vec<f32> = (0..(HEADS * HEAD_DIM * HIDDEN) as usize)
        .map(|i| value(3, i))
        .collect();
    assert_eq!(q, &want, "Q rows as written, not un-permuted");
}

#[test]
fn a_family_without_its_extra_tensors_is_refused_naming_one() {
    let buf = qwen_gguf("qwen3", "blk.0.attn_k_norm.weight");
    let g = Gguf::parse(&buf, "tiny.gguf").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let e = import_to_dir(&g, &buf, dir.path(), None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("model.layers.0.self_attn.k_norm.weight"), "{e}");
    let mut other = Builder::default();
    other.kv("general.architecture", T_STRING, &string("gpt-neox"));
    let g = Gguf::parse(&other.build(3, 32, &[]), "neox.gguf").unwrap();
    let e = import::config_json(&g).unwrap_err().to_string();
    assert!(
        e.contains("general.architecture") && e.contains("gpt-neox") && e.contains("qwen3"),
        "{e}"
    );
}

#[test]
fn a_sentencepiece_vocabulary_becomes_a_byte_fallback_bpe_tokenizer() {
    let buf = gguf_with_vocab("qwen3", "", true);
    let dir = tempfile::tempdir().unwrap();
    let g = Gguf::parse(&buf, "spm.gguf").unwrap();
    import_to_dir(&g, &buf, dir.path(), None).unwrap();
    let tj: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("tokenizer.json")).unwrap()).unwrap();
    let model = &tj["model"];
    assert_eq!(model["type"], "BPE");
    assert_eq!(model["byte_fallback"], true);
    assert_eq!(model["unk_token"], "<unk>");
    assert_eq!(model["merges"], serde_json::json!([["\u{2581}", "a"]]));
    assert_eq!(tj["normalizer"]["content"], "\u{2581}");
    let added: Vec<_> = tj["added_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["content"].clone())
        .collect();
    assert_eq!(added, ["<s>", "</s>"]);
}
