//! Writes a llama GGUF (BF16 tensors, byte-level "gpt2" vocabulary) from a
//! synthetic model directory, the way llama.cpp's converter lays it out:
//! llama.cpp tensor names, Q/K rows permuted, dims fastest-first. For tests
//! of `lamina pull FILE.gguf` and `--model FILE.gguf`.

use std::path::Path;

use serde_json::Value;

const T_U32: u32 = 4;
const T_F32: u32 = 6;
const T_BOOL: u32 = 7;
const T_STRING: u32 = 8;
const T_ARRAY: u32 = 9;
const GGML_BF16: u32 = 30;
const ALIGN: usize = 32;

fn gstr(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

#[derive(Default)]
struct Kv {
    bytes: Vec<u8>,
    n: u64,
}

impl Kv {
    fn key(&mut self, k: &str, ty: u32) {
        gstr(&mut self.bytes, k);
        self.bytes.extend(ty.to_le_bytes());
        self.n += 1;
    }
    fn u32(&mut self, k: &str, v: u64) {
        self.key(k, T_U32);
        self.bytes.extend((v as u32).to_le_bytes());
    }
    fn f32(&mut self, k: &str, v: f64) {
        self.key(k, T_F32);
        self.bytes.extend((v as f32).to_le_bytes());
    }
    fn string(&mut self, k: &str, v: &str) {
        self.key(k, T_STRING);
        gstr(&mut self.bytes, v);
    }
    fn strings(&mut self, k: &str, v: &[String]) {
        self.key(k, T_ARRAY);
        self.bytes.extend(T_STRING.to_le_bytes());
        self.bytes.extend((v.len() as u64).to_le_bytes());
        for s in v {
            gstr(&mut self.bytes, s);
        }
    }
    fn u32s(&mut self, k: &str, ty: u32, v: &[u32]) {
        self.key(k, T_ARRAY);
        self.bytes.extend(ty.to_le_bytes());
        self.bytes.extend((v.len() as u64).to_le_bytes());
        for x in v {
            self.bytes.extend(x.to_le_bytes());
        }
    }
}

/// llama.cpp's name for a Hugging Face tensor name.
fn gguf_name(hf: &str) -> String {
    match hf {
        "model.embed_tokens.weight" => return "token_embd.weight".into(),
        "model.norm.weight" => return "output_norm.weight".into(),
        "lm_head.weight" => return "output.weight".into(),
        _ => {}
    }
    let rest = hf.strip_prefix("model.layers.").expect("a layer tensor");
    let (layer, rest) = rest.split_once('.').unwrap();
    let kind = rest.strip_suffix(".weight").unwrap();
    let short = match kind {
        "input_layernorm" => "attn_norm",
        "post_attention_layernorm" => "ffn_norm",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        other => panic!("unknown tensor {other}"),
    };
    format!("blk.{layer}.{short}.weight")
}

/// llama.cpp's Q/K permutation of a `[rows, cols]` BF16 matrix with `heads` heads.
fn permute(data: &[u8], rows: usize, cols: usize, heads: usize) -> Vec<u8> {
    let (hd, row) = (rows / heads, cols * 2);
    let half = hd / 2;
    let mut out = vec![0u8; data.len()];
    for h in 0..heads {
        for i in 0..half {
            for j in 0..2 {
                let dst = h * hd + 2 * i + j;
                let src = h * hd + j * half + i;
                out[dst * row..(dst + 1) * row].copy_from_slice(&data[src * row..(src + 1) * row]);
            }
        }
    }
    out
}

fn json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// Writes `dir` (a synthetic model without rope scaling) as a GGUF at `out`.
pub fn write_gguf(dir: &Path, out: &Path) {
    write_gguf_named(dir, out, None)
}

/// [`write_gguf`] with `general.basename` and `general.size_label` when given.
pub fn write_gguf_named(dir: &Path, out: &Path, name: Option<(&str, &str)>) {
    let cfg = json(&dir.join("config.json"));
    assert!(
        cfg["rope_scaling"].is_null(),
        "GGUF import refuses rope scaling"
    );
    let u = |k: &str| cfg[k].as_u64().unwrap_or_else(|| panic!("config {k}"));
    let mut kv = Kv::default();
    kv.string("general.architecture", "llama");
    if let Some((basename, size)) = name {
        kv.string("general.basename", basename);
        kv.string("general.size_label", size);
    }
    kv.u32("llama.embedding_length", u("hidden_size"));
    kv.u32("llama.feed_forward_length", u("intermediate_size"));
    kv.u32("llama.block_count", u("num_hidden_layers"));
    kv.u32("llama.attention.head_count", u("num_attention_heads"));
    kv.u32("llama.attention.head_count_kv", u("num_key_value_heads"));
    kv.u32("llama.attention.key_length", u("head_dim"));
    kv.u32("llama.context_length", u("max_position_embeddings"));
    kv.f32("llama.rope.freq_base", cfg["rope_theta"].as_f64().unwrap());
    kv.f32(
        "llama.attention.layer_norm_rms_epsilon",
        cfg["rms_norm_eps"].as_f64().unwrap(),
    );
    // the byte-level vocabulary: tokens by id, specials as control tokens
    let tok = json(&dir.join("tokenizer.json"));
    let vocab = tok["model"]["vocab"].as_object().unwrap();
    let mut tokens = vec![String::new(); vocab.len()];
    for (s, id) in vocab {
        tokens[id.as_u64().unwrap() as usize] = s.clone();
    }
    let mut types = vec![1u32; tokens.len()];
    for t in tok["added_tokens"].as_array().unwrap() {
        types[t["id"].as_u64().unwrap() as usize] = 3;
    }
    let tc = json(&dir.join("tokenizer_config.json"));
    kv.string("tokenizer.ggml.model", "gpt2");
    kv.string("tokenizer.ggml.pre", "smollm");
    kv.strings("tokenizer.ggml.tokens", &tokens);
    kv.strings("tokenizer.ggml.merges", &[]);
    kv.u32s("tokenizer.ggml.token_type", 5, &types);
    kv.u32("tokenizer.ggml.bos_token_id", u("bos_token_id"));
    kv.u32("tokenizer.ggml.eos_token_id", u("eos_token_id"));
    kv.key("tokenizer.ggml.add_bos_token", T_BOOL);
    kv.bytes.push(1);
    kv.string(
        "tokenizer.chat_template",
        tc["chat_template"].as_str().unwrap(),
    );

    // tensors from model.safetensors (BF16)
    let st = std::fs::read(dir.join("model.safetensors")).unwrap();
    let n = u64::from_le_bytes(st[..8].try_into().unwrap()) as usize;
    let header: serde_json::Map<String, Value> = serde_json::from_slice(&st[8..8 + n]).unwrap();
    let data = &st[8 + n..];
    let mut tensors: Vec<(String, Vec<u64>, Vec<u8>)> = Vec::new();
    for (name, info) in &header {
        if name == "__metadata__" {
            continue;
        }
        assert_eq!(info["dtype"], "BF16");
        let shape: Vec<usize> = info["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap() as usize)
            .collect();
        let off = info["data_offsets"].as_array().unwrap();
        let (a, b) = (
            off[0].as_u64().unwrap() as usize,
            off[1].as_u64().unwrap() as usize,
        );
        let mut bytes = data[a..b].to_vec();
        let heads = if name.ends_with("q_proj.weight") {
            Some(u("num_attention_heads"))
        } else if name.ends_with("k_proj.weight") {
            Some(u("num_key_value_heads"))
        } else {
            None
        };
        if let Some(h) = heads {
            bytes = permute(&bytes, shape[0], shape[1], h as usize);
        }
        let dims = shape.iter().rev().map(|&d| d as u64).collect();
        tensors.push((gguf_name(name), dims, bytes));
    }

    let mut out_bytes = b"GGUF".to_vec();
    out_bytes.extend(3u32.to_le_bytes());
    out_bytes.extend((tensors.len() as u64).to_le_bytes());
    out_bytes.extend(kv.n.to_le_bytes());
    out_bytes.extend(&kv.bytes);
    let mut offset = 0usize;
    let mut offsets = Vec::new();
    for (name, dims, data) in &tensors {
        gstr(&mut out_bytes, name);
        out_bytes.extend((dims.len() as u32).to_le_bytes());
        for d in dims {
            out_bytes.extend(d.to_le_bytes());
        }
        out_bytes.extend(GGML_BF16.to_le_bytes());
        out_bytes.extend((offset as u64).to_le_bytes());
        offsets.push(offset);
        offset = (offset + data.len()).div_ceil(ALIGN) * ALIGN;
    }
    while !out_bytes.len().is_multiple_of(ALIGN) {
        out_bytes.push(0);
    }
    let start = out_bytes.len();
    for ((_, _, data), off) in tensors.iter().zip(offsets) {
        out_bytes.resize(start + off, 0);
        out_bytes.extend(data);
    }
    std::fs::write(out, out_bytes).unwrap();
}
