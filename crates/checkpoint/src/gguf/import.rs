//! Import of a GGUF (the architectures of [`Arch`]: `llama`, `qwen2`,
//! `qwen3`, `gemma3`) into a Hugging Face model directory.
//!
//! Contract: [`import_to_dir`] writes `config.json` (from the
//! `<architecture>.*` metadata, Gemma 3's layer pattern, local RoPE base and
//! attention scale as llama.cpp fixes them: see `gemma3_fields`), `generation_config.json` (BOS/EOS from `tokenizer.ggml.*`),
//! `model.safetensors` (every tensor dequantised to BF16 under its Hugging
//! Face name, in Hugging Face layout: llama.cpp's Q/K row permutation of
//! Llama undone, the `+ 1` its converter adds to Gemma 3's norm gains
//! taken off: [`Arch`]),
//! `tokenizer.json` (byte-level BPE via [`tokenizer::bpe_from_gguf`],
//! SentencePiece via [`tokenizer::spm_from_gguf`]) and
//! `tokenizer_config.json` (chat template, BOS/EOS strings, `add_bos_token`
//! as llama.cpp decides it: [`super::adds_bos`]), or the model's own
//! tokenizer files given to [`import_with_tokenizer`] (a store id that
//! brings the model's own tokenizer.json).
//! Before any weight is written, the tensor set is checked against the config
//! (first its size, so a huge `block_count` allocates nothing):
//! an unknown, missing or misshapen tensor is an error naming it. Features the
//! importer cannot reproduce in a Hugging Face config (rope scaling types,
//! `rope_freqs` factors, vocabularies other than BPE and SentencePiece) are
//! errors, not silent drift.
//!
//! Costs: one tensor dequantised at a time (the largest, the embedding, is
//! `vocab × hidden` f32), streamed to disk; the output is the model in BF16.

use super::{Arch, Gguf, GgufError, TensorInfo};
use crate::loader::{SINGLE_FILE, SafetensorsWriter, tensor_specs};
use crate::progress::Progress;
use contract::config::ModelConfig;
use half::bf16;
use rayon::prelude::*;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::path::Path;

/// f32 of an f32 metadata value, printed shortest (1e-5, not 9.99999974e-6).
fn short_f32(v: f64) -> Value {
    let s = (v as f32).to_string();
    s.parse::<f64>().map(|x| json!(x)).unwrap_or(json!(v))
}

/// The Hugging Face `config.json` for this GGUF.
pub fn config_json(g: &Gguf) -> Result<Value, GgufError> {
    let arch = Arch::of(g)?;
    let key = |k: &str| format!("{}.{k}", arch.key());
    if let Some(v) = g.metadata.get(&key("rope.scaling.type"))
        && v.as_str() != Some("none")
    {
        return Err(GgufError::Metadata {
            key: key("rope.scaling.type"),
            reason: format!("rope scaling {v:?} is not supported by the importer"),
        });
    }
    if g.tensor("rope_freqs.weight").is_some() {
        return Err(GgufError::Tensor {
            tensor: "rope_freqs.weight".into(),
            reason: "per-frequency rope factors (llama3 scaling) are not supported by the importer"
                .into(),
        });
    }
    let hidden = g.get_u64(&key("embedding_length"))?;
    let heads = g.get_u64(&key("attention.head_count"))?;
    let kv_heads = match g.metadata.get(&key("attention.head_count_kv")) {
        Some(_) => g.get_u64(&key("attention.head_count_kv"))?,
        None => heads,
    };
    let head_dim = match (
        g.metadata.get(&key("attention.key_length")),
        g.metadata.get(&key("rope.dimension_count")),
    ) {
        (Some(_), _) => g.get_u64(&key("attention.key_length"))?,
        (None, Some(_)) => g.get_u64(&key("rope.dimension_count"))?,
        (None, None) => hidden / heads.max(1),
    };
    let vocab = match g.metadata.get(&key("vocab_size")) {
        Some(_) => g.get_u64(&key("vocab_size"))?,
        None => g
            .get("tokenizer.ggml.tokens")?
            .as_array()
            .map(|a| a.len() as u64)
            .unwrap_or(0),
    };
    let default_theta = arch.default_rope_theta();
    let theta = match g.metadata.get(&key("rope.freq_base")) {
        Some(_) => finite(g, &key("rope.freq_base"))?,
        None => default_theta,
    };
    let eps = finite(g, &key("attention.layer_norm_rms_epsilon"))?;
    let tied = g.tensor("output.weight").is_none();
    let layers = g.get_u64(&key("block_count"))?;
    let mut cfg = arch.config_fields();
    let common = json!({
        "hidden_act": "silu",
        "hidden_size": hidden,
        "intermediate_size": g.get_u64(&key("feed_forward_length"))?,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "vocab_size": vocab,
        "rms_norm_eps": short_f32(eps),
        "rope_theta": short_f32(theta),
        "rope_scaling": null,
        "max_position_embeddings": g.get_u64(&key("context_length"))?,
        "tie_word_embeddings": tied,
        "torch_dtype": "bfloat16",
    });
    for (field, v) in common.as_object().into_iter().flatten() {
        cfg[field] = v.clone();
    }
    if arch == Arch::Gemma3 {
        gemma3_fields(g, &mut cfg, (hidden, heads, head_dim, layers))?;
    }
    for (field, k) in [
        ("bos_token_id", "tokenizer.ggml.bos_token_id"),
        ("eos_token_id", "tokenizer.ggml.eos_token_id"),
    ] {
        if g.metadata.contains_key(k) {
            cfg[field] = json!(token_id(g, k, vocab)?);
        }
    }
    Ok(cfg)
}

/// Gemma 3's layer as llama.cpp runs it (`llama-model.cpp`, `LLM_ARCH_GEMMA3`):
/// every sixth layer global, the others local with the file's
/// `attention.sliding_window` and RoPE base 10,000; scores scaled by
/// `1 / sqrt(head_dim)` (by `1 / sqrt(hidden / heads)` for the 62-layer
/// 27B); the final soft-cap when the file has one.
fn gemma3_fields(
    g: &Gguf,
    cfg: &mut Value,
    (hidden, heads, head_dim, layers): (u64, u64, u64, u64),
) -> Result<(), GgufError> {
    let cap_key = "gemma3.attn_logit_softcapping";
    if g.metadata.contains_key(cap_key) {
        return Err(GgufError::Metadata {
            key: cap_key.into(),
            reason: "Gemma 3 has no attention soft-cap (llama.cpp's converter asserts none)".into(),
        });
    }
    let scalar = match layers {
        62 => hidden / heads.max(1),
        _ => head_dim,
    };
    let o = cfg.as_object_mut().expect("config_json builds an object");
    o.remove("hidden_act");
    for (k, v) in [
        ("hidden_activation", json!("gelu_pytorch_tanh")),
        (
            "sliding_window",
            json!(g.get_u64("gemma3.attention.sliding_window")?),
        ),
        ("sliding_window_pattern", json!(6)),
        ("rope_local_base_freq", json!(10000.0)),
        ("query_pre_attn_scalar", json!(scalar)),
    ] {
        o.insert(k.into(), v);
    }
    let final_cap = "gemma3.final_logit_softcapping";
    if g.metadata.contains_key(final_cap) {
        o.insert(
            "final_logit_softcapping".into(),
            short_f32(finite(g, final_cap)?),
        );
    }
    Ok(())
}

/// A float metadata value that must be finite: NaN would become JSON
/// `null`, which `config.json` reads as "use the default".
fn finite(g: &Gguf, key: &str) -> Result<f64, GgufError> {
    let v = g.get_f64(key)?;
    if !v.is_finite() {
        return Err(GgufError::Metadata {
            key: key.to_string(),
            reason: format!("must be a finite number, got {v}"),
        });
    }
    Ok(v)
}

/// A token id metadata value: an unsigned integer inside the vocabulary.
fn token_id(g: &Gguf, key: &str, vocab: u64) -> Result<u64, GgufError> {
    let id = g.get_u64(key)?;
    if id >= vocab {
        return Err(GgufError::Metadata {
            key: key.to_string(),
            reason: format!("token id {id} is outside the vocabulary ({vocab} tokens)"),
        });
    }
    Ok(id)
}

fn string_array(g: &Gguf, key: &str) -> Result<Vec<String>, GgufError> {
    let bad = || GgufError::Metadata {
        key: key.to_string(),
        reason: "expected an array of strings".into(),
    };
    let arr = g.get(key)?.as_array().ok_or_else(bad)?;
    arr.iter()
        .map(|v| v.as_str().map(str::to_string).ok_or_else(bad))
        .collect()
}

/// An array-of-numbers metadata value as `T` (`None` where an entry does
/// not fit), or an error naming `key`.
fn number_array<T>(
    g: &Gguf,
    key: &str,
    of: impl Fn(&super::Value) -> Option<T>,
) -> Result<Vec<T>, GgufError> {
    let bad = || GgufError::Metadata {
        key: key.to_string(),
        reason: "expected an array of numbers".into(),
    };
    let arr = g.get(key)?.as_array().ok_or_else(bad)?;
    arr.iter().map(|v| of(v).ok_or_else(bad)).collect()
}

/// The `tokenizer.json` text for this GGUF's vocabulary: byte-level BPE
/// (`gpt2`) or SentencePiece (`llama`); `tokens` is `tokenizer.ggml.tokens`.
fn tokenizer_json(g: &Gguf, tokens: &[String]) -> Result<String, GgufError> {
    let model = g.get_str("tokenizer.ggml.model")?;
    let types = number_array(g, "tokenizer.ggml.token_type", |v| {
        v.as_i64().and_then(|x| i32::try_from(x).ok())
    })?;
    let built = match model {
        "gpt2" => {
            let merges = string_array(g, "tokenizer.ggml.merges")?;
            let pre = match g.metadata.get("tokenizer.ggml.pre") {
                Some(_) => g.get_str("tokenizer.ggml.pre")?,
                None => "default",
            };
            tokenizer::bpe_from_gguf::build_tokenizer_json(tokens, &merges, &types, pre)
        }
        "llama" => {
            let scores =
                number_array(g, "tokenizer.ggml.scores", |v| v.as_f64().map(|x| x as f32))?;
            let flag = g.metadata.get("tokenizer.ggml.add_space_prefix");
            let unk = g.metadata.get("tokenizer.ggml.unknown_token_id");
            tokenizer::spm_from_gguf::build_tokenizer_json(&tokenizer::spm_from_gguf::SpmVocab {
                tokens,
                scores: &scores,
                types: &types,
                unk: unk
                    .and_then(|v| v.as_u64())
                    .and_then(|u| usize::try_from(u).ok()),
                // llama.cpp's default when the key is absent
                add_space_prefix: flag.and_then(|v| v.as_bool()).unwrap_or(true),
            })
        }
        other => {
            return Err(GgufError::Metadata {
                key: "tokenizer.ggml.model".into(),
                reason: format!(
                    "only byte-level BPE (`gpt2`) and SentencePiece (`llama`) vocabularies are converted, got `{other}`"
                ),
            });
        }
    };
    built.map_err(|e| GgufError::Tokenizer(e.to_string()))
}

/// `tokenizer.json` and `tokenizer_config.json` texts for this GGUF.
fn tokenizer_files(g: &Gguf, max_len: u64) -> Result<(String, Value), GgufError> {
    let tokens = string_array(g, "tokenizer.ggml.tokens")?;
    let json = tokenizer_json(g, &tokens)?;
    let token_str = |key: &str| -> Option<String> {
        let id = g.metadata.get(key)?.as_u64()?;
        tokens.get(usize::try_from(id).ok()?).cloned()
    };
    let add_bos = super::adds_bos(g)?;
    if add_bos && token_str("tokenizer.ggml.bos_token_id").is_none() {
        return Err(GgufError::Metadata {
            key: "tokenizer.ggml.bos_token_id".into(),
            reason: "missing or outside the vocabulary, but the vocabulary adds BOS".into(),
        });
    }
    let mut cfg = json!({
        "add_bos_token": add_bos,
        "add_eos_token": g.metadata.get("tokenizer.ggml.add_eos_token").and_then(|v| v.as_bool()).unwrap_or(false),
        "clean_up_tokenization_spaces": false,
        "model_max_length": max_len,
        "tokenizer_class": "GPT2Tokenizer",
    });
    for (field, key) in [
        ("bos_token", "tokenizer.ggml.bos_token_id"),
        ("eos_token", "tokenizer.ggml.eos_token_id"),
        ("unk_token", "tokenizer.ggml.unknown_token_id"),
        ("pad_token", "tokenizer.ggml.padding_token_id"),
    ] {
        if let Some(s) = token_str(key) {
            cfg[field] = json!(s);
        }
    }
    if let Some(t) = g
        .metadata
        .get("tokenizer.chat_template")
        .and_then(|v| v.as_str())
    {
        cfg["chat_template"] = json!(t);
    }
    Ok((json, cfg))
}

/// Undoes llama.cpp's Q/K row permutation of a `[rows, cols]` matrix with
/// `heads` heads: GGUF row `h·hd + 2i + j` becomes row `h·hd + j·hd/2 + i`.
pub fn unpermute_rows(
    w: &[f32],
    rows: usize,
    cols: usize,
    heads: usize,
) -> Result<Vec<f32>, String> {
    if heads == 0
        || !rows.is_multiple_of(heads)
        || !(rows / heads).is_multiple_of(2)
        || w.len() != rows * cols
    {
        return Err(format!(
            "cannot unpermute [{rows}, {cols}] over {heads} heads"
        ));
    }
    let hd = rows / heads;
    let half = hd / 2;
    let mut out = vec![0f32; w.len()];
    out.par_chunks_exact_mut(cols)
        .enumerate()
        .for_each(|(r, dst)| {
            let (h, within) = (r / hd, r % hd);
            let (j, i) = (within / half, within % half);
            let src = h * hd + 2 * i + j;
            dst.copy_from_slice(&w[src * cols..(src + 1) * cols]);
        });
    Ok(out)
}

/// Imports the GGUF (`g` parsed from `buf`) into `dir`; see the module doc.
pub fn import_to_dir(
    g: &Gguf,
    buf: &[u8],
    dir: &Path,
    progress: Option<&Progress>,
) -> Result<(), GgufError> {
    import_with_tokenizer(g, buf, dir, progress, None)
}

/// A model's own `tokenizer.json` and `tokenizer_config.json` texts, used
/// instead of the ones built from the GGUF's vocabulary (a store id that
/// brings them).
#[derive(Debug, Clone)]
pub struct TokenizerFiles {
    pub tokenizer_json: Vec<u8>,
    pub tokenizer_config_json: Vec<u8>,
}

/// [`import_to_dir`], with `tokenizer` written instead of the one built
/// from the file's vocabulary when given.
pub fn import_with_tokenizer(
    g: &Gguf,
    buf: &[u8],
    dir: &Path,
    progress: Option<&Progress>,
    tokenizer: Option<&TokenizerFiles>,
) -> Result<(), GgufError> {
    let arch = Arch::of(g)?;
    let cfg_json = config_json(g)?;
    // the config and tensor list are sized by the block count: one the
    // file cannot hold is refused before anything is allocated for it
    let layers = cfg_json["num_hidden_layers"].as_u64().unwrap_or(0);
    let tied = g.tensor("output.weight").is_none();
    let needed = layers
        .checked_mul(9)
        .and_then(|n| n.checked_add(2 + u64::from(!tied)));
    if needed.is_none_or(|n| n > g.tensors.len() as u64) {
        return Err(GgufError::Metadata {
            key: format!("{}.block_count", g.get_str("general.architecture")?),
            reason: format!(
                "{layers} layers need more tensors than the {} in {}",
                g.tensors.len(),
                g.path
            ),
        });
    }
    let cfg = ModelConfig::from_json(
        &cfg_json.to_string(),
        &format!("config.json from {}", g.path),
    )?;
    let write = |name: &str, text: Vec<u8>| {
        let p = dir.join(name);
        std::fs::write(&p, text).map_err(|source| GgufError::Io {
            path: p.display().to_string(),
            source,
        })
    };
    // every tensor known, present and of the right shape before writing anything
    let mut by_hf: HashMap<String, &TensorInfo> = HashMap::new();
    for t in &g.tensors {
        let name = arch.hf_name(&t.name).ok_or_else(|| GgufError::Tensor {
            tensor: t.name.clone(),
            reason: format!("not a {} tensor this importer knows", arch.key()),
        })?;
        // a type we cannot dequantise: refused before anything is written
        t.ty.byte_size(t.numel())
            .map_err(|reason| GgufError::Tensor {
                tensor: t.name.clone(),
                reason,
            })?;
        by_hf.insert(name, t);
    }
    let specs = tensor_specs(&cfg, !cfg.tie_word_embeddings);
    let mut plan = Vec::with_capacity(specs.len());
    for s in &specs {
        let t = *by_hf.get(&s.name).ok_or_else(|| GgufError::Tensor {
            tensor: s.name.clone(),
            reason: format!("missing from {}", g.path),
        })?;
        plan.push((s, t));
        if t.shape() != s.shape {
            return Err(GgufError::Tensor {
                tensor: t.name.clone(),
                reason: format!(
                    "shape {:?} does not match the config's {:?}",
                    t.shape(),
                    s.shape
                ),
            });
        }
    }
    let (tok_json, tok_cfg) = match tokenizer {
        Some(t) => (t.tokenizer_json.clone(), t.tokenizer_config_json.clone()),
        None => {
            let (json, cfg_json) = tokenizer_files(g, cfg.max_position_embeddings as u64)?;
            (json.into_bytes(), format!("{cfg_json:#}\n").into_bytes())
        }
    };
    let mut gen_cfg = json!({});
    for k in ["bos_token_id", "eos_token_id"] {
        if let Some(v) = cfg_json.get(k) {
            gen_cfg[k] = v.clone();
        }
    }
    write("config.json", format!("{cfg_json:#}\n").into_bytes())?;
    write(
        "generation_config.json",
        format!("{gen_cfg:#}\n").into_bytes(),
    )?;
    write("tokenizer.json", tok_json)?;
    write("tokenizer_config.json", tok_cfg)?;

    let path = dir.join(SINGLE_FILE);
    let io = |source| GgufError::Io {
        path: path.display().to_string(),
        source,
    };
    let mut w = SafetensorsWriter::create(&path, specs.clone()).map_err(io)?;
    for (s, t) in plan {
        let mut data = g.dequantize(buf, t)?; // [rows, cols] row-major (GGUF order)
        let shift = arch.value_shift(&t.name);
        if shift != 0.0 {
            data.par_iter_mut().for_each(|x| *x -= shift);
        }
        let heads = if !arch.permutes_qk() {
            None
        } else if s.name.ends_with("q_proj.weight") {
            Some(cfg.num_heads)
        } else if s.name.ends_with("k_proj.weight") {
            Some(cfg.num_kv_heads)
        } else {
            None
        };
        if let Some(heads) = heads {
            data = unpermute_rows(&data, s.shape[0], s.shape[1], heads).map_err(|reason| {
                GgufError::Tensor {
                    tensor: t.name.clone(),
                    reason,
                }
            })?;
        }
        let bf: Vec<bf16> = data.par_iter().map(|&x| bf16::from_f32(x)).collect();
        w.write_chunk(&bf).map_err(io)?;
        if let Some(p) = progress {
            p.inc(1);
        }
    }
    w.finish().map_err(io)
}
