//! Writers of the seed inputs: a micro llama GGUF (hidden 4, one layer, an
//! 8-token byte-level BPE vocabulary, tensors in F32, F16, BF16, Q8_0, Q4_0
//! and Q4_1) that imports into a loadable model, built from a structured
//! description the GGUF property mutates field by field.

use half::{bf16, f16};

/// A metadata value as GGUF stores it: type id and payload.
#[derive(Debug, Clone)]
pub struct Kv {
    pub key: String,
    pub ty: u32,
    pub payload: Vec<u8>,
}

/// A tensor info and its data.
#[derive(Debug, Clone)]
pub struct TensorDesc {
    pub name: String,
    /// Fastest-varying first.
    pub dims: Vec<u64>,
    pub ty: u32,
    pub data: Vec<u8>,
    /// Overrides the offset the writer would compute.
    pub offset: Option<u64>,
}

/// A whole file: counts can lie about the lists that follow.
#[derive(Debug, Clone)]
pub struct GgufDesc {
    pub version: u32,
    pub n_tensors: Option<u64>,
    pub n_kv: Option<u64>,
    pub kvs: Vec<Kv>,
    pub tensors: Vec<TensorDesc>,
}

pub fn gstr(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

pub fn string(s: &str) -> Vec<u8> {
    let mut v = Vec::new();
    gstr(&mut v, s);
    v
}

fn strings(items: &[&str]) -> Vec<u8> {
    let mut v = 8u32.to_le_bytes().to_vec();
    v.extend((items.len() as u64).to_le_bytes());
    for s in items {
        gstr(&mut v, s);
    }
    v
}

pub fn kv(key: &str, ty: u32, payload: Vec<u8>) -> Kv {
    Kv {
        key: key.into(),
        ty,
        payload,
    }
}

impl GgufDesc {
    pub fn bytes(&self) -> Vec<u8> {
        const ALIGN: u64 = 32;
        let mut out = b"GGUF".to_vec();
        out.extend(self.version.to_le_bytes());
        let n_tensors = self.n_tensors.unwrap_or(self.tensors.len() as u64);
        out.extend(n_tensors.to_le_bytes());
        out.extend(self.n_kv.unwrap_or(self.kvs.len() as u64).to_le_bytes());
        for k in &self.kvs {
            gstr(&mut out, &k.key);
            out.extend(k.ty.to_le_bytes());
            out.extend(&k.payload);
        }
        let mut next = 0u64;
        let mut placed = Vec::new();
        for t in &self.tensors {
            gstr(&mut out, &t.name);
            out.extend((t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(t.ty.to_le_bytes());
            let offset = t.offset.unwrap_or(next);
            out.extend(offset.to_le_bytes());
            placed.push(next);
            next = (next + t.data.len() as u64).div_ceil(ALIGN) * ALIGN;
        }
        while !(out.len() as u64).is_multiple_of(ALIGN) {
            out.push(0);
        }
        let start = out.len();
        for (t, off) in self.tensors.iter().zip(placed) {
            out.resize(start + off as usize, 0);
            out.extend(&t.data);
        }
        out
    }
}

fn f32s(n: usize, scale: f32) -> Vec<u8> {
    (0..n)
        .flat_map(|i| ((i % 7) as f32 * scale - 0.1).to_le_bytes())
        .collect()
}

fn f16s(n: usize) -> Vec<u8> {
    (0..n)
        .flat_map(|i| f16::from_f32((i % 5) as f32 * 0.05).to_le_bytes())
        .collect()
}

fn bf16s(n: usize) -> Vec<u8> {
    (0..n)
        .flat_map(|i| bf16::from_f32(1.0 - (i % 3) as f32 * 0.1).to_le_bytes())
        .collect()
}

/// One block of 32 elements: `head` (scales) then the quants.
fn block(head: &[f32], quants: usize) -> Vec<u8> {
    let mut v: Vec<u8> = head
        .iter()
        .flat_map(|&x| f16::from_f32(x).to_le_bytes())
        .collect();
    v.extend((0..quants).map(|i| (i * 37 % 256) as u8));
    v
}

fn tensor(name: &str, dims: &[u64], ty: u32, data: Vec<u8>) -> TensorDesc {
    TensorDesc {
        name: name.into(),
        dims: dims.to_vec(),
        ty,
        data,
        offset: None,
    }
}

/// The micro llama: imports into a model that loads.
pub fn micro_llama() -> GgufDesc {
    let u32v = |x: u32| x.to_le_bytes().to_vec();
    let tokens = ["a", "b", "ab", "Ġ", "Ġa", "<s>", "</s>", "c"];
    let mut types = 5u32.to_le_bytes().to_vec(); // array of i32
    types.extend(8u64.to_le_bytes());
    for t in [1i32, 1, 1, 1, 1, 3, 3, 1] {
        types.extend(t.to_le_bytes());
    }
    let kvs = vec![
        kv("general.architecture", 8, string("llama")),
        kv("llama.embedding_length", 4, u32v(4)),
        kv("llama.feed_forward_length", 4, u32v(8)),
        kv("llama.block_count", 4, u32v(1)),
        kv("llama.attention.head_count", 4, u32v(2)),
        kv("llama.attention.head_count_kv", 4, u32v(1)),
        kv("llama.context_length", 4, u32v(32)),
        kv(
            "llama.attention.layer_norm_rms_epsilon",
            6,
            1e-5f32.to_le_bytes().to_vec(),
        ),
        kv("llama.rope.freq_base", 6, 10000f32.to_le_bytes().to_vec()),
        kv("tokenizer.ggml.model", 8, string("gpt2")),
        kv("tokenizer.ggml.pre", 8, string("smollm")),
        kv("tokenizer.ggml.tokens", 9, strings(&tokens)),
        kv("tokenizer.ggml.merges", 9, strings(&["a b", "Ġ a"])),
        kv("tokenizer.ggml.token_type", 9, types),
        kv("tokenizer.ggml.bos_token_id", 4, u32v(5)),
        kv("tokenizer.ggml.eos_token_id", 4, u32v(6)),
        kv("tokenizer.ggml.add_bos_token", 7, vec![1]),
        kv(
            "tokenizer.chat_template",
            8,
            string("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"),
        ),
    ];
    let tensors = vec![
        tensor("token_embd.weight", &[4, 8], 0, f32s(32, 0.1)),
        tensor("output_norm.weight", &[4], 1, f16s(4)),
        tensor("blk.0.attn_norm.weight", &[4], 30, bf16s(4)),
        tensor("blk.0.attn_q.weight", &[4, 4], 0, f32s(16, 0.2)),
        tensor("blk.0.attn_k.weight", &[4, 2], 1, f16s(8)),
        tensor("blk.0.attn_v.weight", &[4, 2], 30, bf16s(8)),
        tensor("blk.0.attn_output.weight", &[4, 4], 0, f32s(16, 0.05)),
        tensor("blk.0.ffn_norm.weight", &[4], 0, f32s(4, 0.3)),
        tensor("blk.0.ffn_gate.weight", &[4, 8], 8, block(&[0.01], 32)),
        tensor("blk.0.ffn_up.weight", &[4, 8], 2, block(&[0.02], 16)),
        tensor(
            "blk.0.ffn_down.weight",
            &[8, 4],
            3,
            block(&[0.01, -0.1], 16),
        ),
    ];
    GgufDesc {
        version: 3,
        n_tensors: None,
        n_kv: None,
        kvs,
        tensors,
    }
}
