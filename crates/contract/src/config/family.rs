//! From a `config.json`'s architecture to a [`ModelSpec`]: the one place
//! that reads `architectures` (and the per-family fields that follow from
//! it). Everything downstream reads the spec.
//!
//! Families: Llama (and Mistral without a shorter window), Qwen2 (Q/K/V
//! biases), Qwen3 (QK-norm) and Gemma 3's text model (`config/gemma.rs`:
//! `(1+w)` norms, four a layer, QK-norm, GeGLU, scaled embedding, sliding
//! and global layers with their own RoPE); `attention_bias` and `mlp_bias`
//! as each family's transformers class reads them. Anything else is
//! refused naming `architectures`; a sliding window of a family whose
//! windows are not modelled here is refused naming `sliding_window`.

use super::{ConfigError, RawConfig, gemma};
use crate::spec::{Activation, ModelSpec, Rope};

/// The architectures a spec is known for, as `config.json` names them.
pub const SUPPORTED_ARCHITECTURES: [&str; 5] = [
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "Gemma3ForCausalLM",
];

/// The layer family of a supported architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    Llama,
    Qwen2,
    Qwen3,
    Gemma3,
}

fn family(raw: &RawConfig) -> Option<Result<Family, String>> {
    let Some(archs) = raw.architectures.as_ref() else {
        // no `architectures`: the text model's `model_type` alone
        return (raw.model_type.as_deref() == Some("gemma3_text")).then_some(Ok(Family::Gemma3));
    };
    let found = archs.iter().find_map(|a| match a.as_str() {
        "LlamaForCausalLM" | "MistralForCausalLM" => Some(Family::Llama),
        "Qwen2ForCausalLM" => Some(Family::Qwen2),
        "Qwen3ForCausalLM" => Some(Family::Qwen3),
        "Gemma3ForCausalLM" => Some(Family::Gemma3),
        _ => None,
    });
    let multimodal = archs.iter().any(|a| a == "Gemma3ForConditionalGeneration");
    Some(found.ok_or_else(|| {
        let hint = match multimodal {
            true => " (the multimodal Gemma 3 checkpoint: its weights sit under `language_model.`; use a text-only Gemma3ForCausalLM checkpoint)",
            false => "",
        };
        format!(
            "{archs:?}: supported: {}{hint}",
            SUPPORTED_ARCHITECTURES.join(", ")
        )
    }))
}

/// The family's default for an absent `tie_word_embeddings` (transformers'
/// class default: Gemma 3 ties, the others do not).
pub(super) fn ties_by_default(raw: &RawConfig) -> bool {
    matches!(family(raw), Some(Ok(Family::Gemma3)))
}

/// The validated dimensions the spec depends on.
#[derive(Debug, Clone, Copy)]
pub(super) struct Dims {
    pub hidden_size: usize,
    pub head_dim: usize,
    pub num_layers: usize,
    pub max_position_embeddings: usize,
}

/// The spec of `raw` (already checked for its dimensions), `rope` the
/// top-level RoPE resolved. Errors name the field.
pub(super) fn spec(
    raw: &RawConfig,
    dims: Dims,
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
    let (act_field, act_name) = match (&raw.hidden_act, &raw.hidden_activation) {
        (_, Some(name)) if family == Family::Gemma3 => ("hidden_activation", Some(name)),
        (name, _) => ("hidden_act", name.as_ref()),
    };
    let activation = match act_name {
        None if family == Family::Gemma3 => Activation::GeluTanh,
        None => Activation::Silu,
        Some(name) => Activation::from_hf(name).ok_or_else(|| {
            bad(
                act_field,
                format!("`{name}` is not supported (supported: silu, gelu_pytorch_tanh)"),
            )
        })?,
    };
    if family == Family::Gemma3 {
        return gemma::spec(raw, dims, activation, path);
    }
    refuse_window(raw, dims.max_position_embeddings, path)?;
    let attention_bias = raw.attention_bias.unwrap_or(false);
    let mut spec = ModelSpec::llama(dims.num_layers, dims.head_dim, rope);
    for layer in &mut spec.layers {
        let a = &mut layer.attention;
        match family {
            Family::Llama | Family::Qwen3 | Family::Gemma3 => {
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

/// Mistral v0.1's and Qwen2's windows (which layers they cover is not
/// modelled here): refused unless the window covers the whole context or
/// is switched off.
fn refuse_window(raw: &RawConfig, max_pos: usize, path: &str) -> Result<(), ConfigError> {
    match raw.sliding_window {
        Some(window) if raw.use_sliding_window != Some(false) && window < max_pos => {
            Err(ConfigError::Invalid {
                path: path.to_string(),
                field: "sliding_window",
                reason: format!(
                    "{window} is shorter than max_position_embeddings {max_pos}: sliding-window attention is not supported for this architecture (only Gemma 3's layers)"
                ),
            })
        }
        _ => Ok(()),
    }
}
