//! From a `config.json`'s architecture to a [`ModelSpec`]: the one place
//! that reads `architectures` (and the per-family fields that follow from
//! it). Everything downstream reads the spec.
//!
//! Families: Llama (and Mistral without a shorter window), Qwen2 (Q/K/V
//! biases) and Qwen3 (QK-norm); `attention_bias` and `mlp_bias` as each
//! family's transformers class reads them. Anything else is refused naming
//! `architectures`.

use super::{ConfigError, RawConfig};
use crate::spec::{Activation, ModelSpec, Rope};

/// The architectures a spec is known for, as `config.json` names them.
pub const SUPPORTED_ARCHITECTURES: [&str; 4] = [
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
];

/// The layer family of a supported architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    Llama,
    Qwen2,
    Qwen3,
}

fn family(raw: &RawConfig) -> Option<Result<Family, String>> {
    let archs = raw.architectures.as_ref()?;
    let found = archs.iter().find_map(|a| match a.as_str() {
        "LlamaForCausalLM" | "MistralForCausalLM" => Some(Family::Llama),
        "Qwen2ForCausalLM" => Some(Family::Qwen2),
        "Qwen3ForCausalLM" => Some(Family::Qwen3),
        _ => None,
    });
    Some(found.ok_or_else(|| {
        format!(
            "{archs:?}: supported: {}",
            SUPPORTED_ARCHITECTURES.join(", ")
        )
    }))
}

/// The spec of `raw` (already checked for its dimensions): `head_dim` and
/// `num_layers` validated, `rope` resolved. Errors name the field.
pub(super) fn spec(
    raw: &RawConfig,
    head_dim: usize,
    num_layers: usize,
    rope: Rope,
    path: &str,
) -> Result<ModelSpec, ConfigError> {
    let bad = |field: &'static str, reason: String| ConfigError::Invalid {
        path: path.to_string(),
        field,
        reason,
    };
    // no `architectures` (older files): the Llama layer, as before
    let family = match family(raw) {
        None => Family::Llama,
        Some(f) => f.map_err(|why| bad("architectures", why))?,
    };
    let activation = match raw.hidden_act.as_deref() {
        None => Activation::Silu,
        Some(name) => Activation::from_hf(name).ok_or_else(|| {
            bad(
                "hidden_act",
                format!("`{name}` is not supported (supported: silu, gelu_pytorch_tanh)"),
            )
        })?,
    };
    let attention_bias = raw.attention_bias.unwrap_or(false);
    let mut spec = ModelSpec::llama(num_layers, head_dim, rope);
    for layer in &mut spec.layers {
        let a = &mut layer.attention;
        match family {
            Family::Llama | Family::Qwen3 => {
                a.qkv_bias = attention_bias;
                a.o_bias = attention_bias;
            }
            // Qwen2's Q/K/V always carry biases, its output projection none
            Family::Qwen2 => a.qkv_bias = true,
        }
        a.qk_norm = family == Family::Qwen3;
        layer.mlp.activation = activation;
        layer.mlp.bias = raw.mlp_bias.unwrap_or(false) && family == Family::Llama;
    }
    Ok(spec)
}
