//! The GGUF architectures the importer reads, one entry each: what
//! `general.architecture` names, the Hugging Face class it becomes, and how
//! llama.cpp's converter wrote its tensors.
//!
//! Contract: the metadata keys are `<architecture>.<key>` for every family
//! (`qwen3.attention.layer_norm_rms_epsilon`, ...), and the tensor names are
//! llama.cpp's shared ones (`blk.N.attn_q.weight`, `blk.N.attn_q.bias`,
//! `blk.N.attn_q_norm.weight`, ...), so they are read once, in
//! [`super::import`]; only what differs is here. llama.cpp permutes Q/K rows
//! for the `llama` architecture only (its converter interleaves rotary pairs
//! for `llama`; Qwen2 and Qwen3 run NEOX-style RoPE and are written as the
//! hub has them).
//!
//! Costs: a lookup in a table of three.

use super::{Gguf, GgufError};
use serde_json::{Value, json};

/// One architecture the importer reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GgufArch {
    /// `general.architecture`.
    pub name: &'static str,
    /// `architectures[0]` of the `config.json` written.
    pub hf_class: &'static str,
    /// `model_type` of the `config.json` written.
    pub model_type: &'static str,
    /// llama.cpp's converter permuted the Q/K projection rows.
    pub permuted_qk: bool,
    /// Boolean fields the family's `config.json` carries (the rest of a
    /// family's layer follows from its class: Qwen2's Q/K/V biases,
    /// Qwen3's QK-norm).
    pub flags: &'static [(&'static str, bool)],
}

/// The architectures the importer reads.
pub const ARCHS: [GgufArch; 3] = [
    GgufArch {
        name: "llama",
        hf_class: "LlamaForCausalLM",
        model_type: "llama",
        permuted_qk: true,
        flags: &[("attention_bias", false), ("mlp_bias", false)],
    },
    GgufArch {
        name: "qwen2",
        hf_class: "Qwen2ForCausalLM",
        model_type: "qwen2",
        permuted_qk: false,
        flags: &[],
    },
    GgufArch {
        name: "qwen3",
        hf_class: "Qwen3ForCausalLM",
        model_type: "qwen3",
        permuted_qk: false,
        flags: &[("attention_bias", false)],
    },
];

/// The entry of `g`'s `general.architecture`; an error naming the key and
/// the architectures read otherwise.
pub fn arch_of(g: &Gguf) -> Result<&'static GgufArch, GgufError> {
    let name = g.get_str("general.architecture")?;
    ARCHS.iter().find(|a| a.name == name).ok_or_else(|| {
        let known: Vec<&str> = ARCHS.iter().map(|a| a.name).collect();
        GgufError::Metadata {
            key: "general.architecture".into(),
            reason: format!(
                "`{name}` is not supported (supported: {})",
                known.join(", ")
            ),
        }
    })
}

impl GgufArch {
    /// The family's fields of `config.json`: class, model type and flags.
    pub fn config_fields(&self) -> Value {
        let mut v = json!({"architectures": [self.hf_class], "model_type": self.model_type});
        for (field, on) in self.flags {
            v[*field] = json!(on);
        }
        v
    }
}
