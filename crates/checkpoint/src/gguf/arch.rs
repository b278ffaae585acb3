//! The GGUF architectures the importer reads, and what each means for
//! names, rows and values: the Hugging Face class it becomes, llama.cpp's
//! tensor names per architecture (metadata keys are `<architecture>.<key>`
//! for every one), its Q/K row permutation (Llama's only: Qwen2, Qwen3 and
//! Gemma 3 run NeoX RoPE on rows as Hugging Face stores them), and the
//! `+ 1` its converter adds to Gemma 3's norm gains
//! (`Gemma3Model.norm_shift` in `convert_hf_to_gguf.py`: the file holds
//! `1 + w`, Hugging Face `w`).
//!
//! Contract: [`Arch::of`] reads `general.architecture` and refuses any
//! other, naming the key; [`Arch::hf_name`] maps exactly the tensors
//! llama.cpp writes for the architecture (`None` for any other name).

use super::{Gguf, GgufError};
use serde_json::{Value, json};

/// A GGUF architecture the importer reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Qwen2,
    Qwen3,
    Gemma3,
}

impl Arch {
    /// The file's architecture, or an error naming `general.architecture`.
    pub fn of(g: &Gguf) -> Result<Arch, GgufError> {
        let name = g.get_str("general.architecture")?;
        Self::ALL
            .into_iter()
            .find(|a| a.key() == name)
            .ok_or_else(|| {
                let known: Vec<&str> = Self::ALL.iter().map(|a| a.key()).collect();
                GgufError::Metadata {
                    key: "general.architecture".into(),
                    reason: format!(
                        "`{name}` is not supported (supported: {})",
                        known.join(", ")
                    ),
                }
            })
    }

    /// Every architecture the importer reads.
    pub const ALL: [Arch; 4] = [Arch::Llama, Arch::Qwen2, Arch::Qwen3, Arch::Gemma3];

    /// The family's fields of `config.json`: class, model type and the
    /// boolean fields its class reads (the rest of a family's layer follows
    /// from its class: Qwen2's Q/K/V biases, Qwen3's QK-norm; Gemma 3's
    /// are set by the importer from its metadata).
    pub fn config_fields(self) -> Value {
        let (class, model_type, flags): (&str, &str, &[(&str, bool)]) = match self {
            Arch::Llama => (
                "LlamaForCausalLM",
                "llama",
                &[("attention_bias", false), ("mlp_bias", false)],
            ),
            Arch::Qwen2 => ("Qwen2ForCausalLM", "qwen2", &[]),
            Arch::Qwen3 => ("Qwen3ForCausalLM", "qwen3", &[("attention_bias", false)]),
            Arch::Gemma3 => ("Gemma3ForCausalLM", "gemma3_text", &[]),
        };
        let mut v = json!({"architectures": [class], "model_type": model_type});
        for (field, on) in flags {
            v[*field] = json!(on);
        }
        v
    }

    /// The RoPE base when the file states none.
    pub fn default_rope_theta(self) -> f64 {
        match self {
            Arch::Gemma3 => 1_000_000.0,
            _ => 10_000.0,
        }
    }

    /// The prefix of the architecture's metadata keys.
    pub fn key(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Gemma3 => "gemma3",
        }
    }

    /// Whether llama.cpp permuted the Q/K rows (interleaved RoPE pairs).
    pub fn permutes_qk(self) -> bool {
        self == Arch::Llama
    }

    /// What llama.cpp's converter added to tensor `gguf_name`'s values
    /// (Gemma 3's norm gains are stored as `1 + w`).
    pub fn value_shift(self, gguf_name: &str) -> f32 {
        match self {
            Arch::Gemma3 if gguf_name.ends_with("norm.weight") => 1.0,
            _ => 0.0,
        }
    }

    /// The Hugging Face name of llama.cpp tensor `gguf_name`, or `None` if
    /// the architecture has no such tensor.
    pub fn hf_name(self, gguf_name: &str) -> Option<String> {
        match gguf_name {
            "token_embd.weight" => return Some("model.embed_tokens.weight".into()),
            "output_norm.weight" => return Some("model.norm.weight".into()),
            "output.weight" => return Some("lm_head.weight".into()),
            _ => {}
        }
        let rest = gguf_name.strip_prefix("blk.")?;
        let (layer, rest) = rest.split_once('.')?;
        let layer: usize = layer.parse().ok()?;
        let (kind, suffix) = rest.split_once('.')?;
        let hf = match (self, kind) {
            (_, "attn_norm") => "input_layernorm",
            (Arch::Llama | Arch::Qwen2 | Arch::Qwen3, "ffn_norm") => "post_attention_layernorm",
            (_, "attn_q") => "self_attn.q_proj",
            (_, "attn_k") => "self_attn.k_proj",
            (_, "attn_v") => "self_attn.v_proj",
            (_, "attn_output") => "self_attn.o_proj",
            (_, "ffn_gate") => "mlp.gate_proj",
            (_, "ffn_up") => "mlp.up_proj",
            (_, "ffn_down") => "mlp.down_proj",
            (Arch::Qwen3 | Arch::Gemma3, "attn_q_norm") => "self_attn.q_norm",
            (Arch::Qwen3 | Arch::Gemma3, "attn_k_norm") => "self_attn.k_norm",
            (Arch::Gemma3, "post_attention_norm") => "post_attention_layernorm",
            (Arch::Gemma3, "ffn_norm") => "pre_feedforward_layernorm",
            (Arch::Gemma3, "post_ffw_norm") => "post_feedforward_layernorm",
            _ => return None,
        };
        Some(format!("model.layers.{layer}.{hf}.{suffix}"))
    }
}
