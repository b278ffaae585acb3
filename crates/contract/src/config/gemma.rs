//! Gemma 3's text layer as a [`ModelSpec`], read as transformers'
//! `Gemma3TextConfig` and `modeling_gemma3.py` read the same file.
//!
//! Contract: every layer has `(1+w)` RMSNorm gains, four norms (input,
//! post-attention, pre- and post-MLP), per-head QK-norm, the gated MLP of
//! `hidden_activation` (GELU-tanh), scores scaled by
//! `query_pre_attn_scalar^-1/2` (default 256); the embedding is scaled by
//! `sqrt(hidden_size)` (rounded to f32); `final_logit_softcapping` caps
//! the logits when set. Layer `i` is local (`sliding_attention`) or global
//! (`full_attention`) as `layer_types` says, else as
//! `sliding_window_pattern` (default 6: every sixth layer global). A local
//! layer sees itself and the `sliding_window - 1` positions before it
//! (transformers' `kv_idx > q_idx - sliding_window`; default 4096) with
//! RoPE base `rope_local_base_freq` (default 10,000) and no scaling; a
//! global layer sees the whole context with `rope_theta` (default 1e6)
//! and `rope_scaling` when set. A `rope_parameters` object keyed by layer
//! type overrides both. Refused naming the field: a bidirectional mask
//! (`use_bidirectional_attention`), `attn_logit_softcapping` (transformers'
//! Gemma 3 does not apply it, so no answer would match), a window or
//! pattern of 0, and an unknown layer type.

use super::family::Dims;
use super::{ConfigError, RawConfig, RawRope, rope};
use crate::spec::{Activation, AttentionSpec, LayerSpec, MlpSpec, ModelSpec, Rope};

/// `Gemma3TextConfig`'s defaults for absent fields.
const DEFAULT_WINDOW: usize = 4096;
const DEFAULT_PATTERN: usize = 6;
const DEFAULT_GLOBAL_THETA: f64 = 1_000_000.0;
const DEFAULT_LOCAL_THETA: f64 = 10_000.0;
const DEFAULT_QUERY_SCALAR: f64 = 256.0;

/// The spec of a Gemma 3 text `raw` (see the module doc).
pub(super) fn spec(
    raw: &RawConfig,
    dims: Dims,
    activation: Activation,
    path: &str,
) -> Result<ModelSpec, ConfigError> {
    let bad = |field: &'static str, reason: String| ConfigError::Invalid {
        path: path.to_string(),
        field,
        reason,
    };
    if raw.use_bidirectional_attention == Some(true) {
        return Err(bad(
            "use_bidirectional_attention",
            "a bidirectional mask (an embedding model) is not supported".into(),
        ));
    }
    if let Some(cap) = raw.attn_logit_softcapping {
        return Err(bad(
            "attn_logit_softcapping",
            format!(
                "{cap}: transformers' Gemma 3 does not apply an attention soft-cap; refused rather than guessed"
            ),
        ));
    }
    let window = raw.sliding_window.unwrap_or(DEFAULT_WINDOW);
    if window == 0 {
        return Err(bad("sliding_window", "must be positive, got 0".into()));
    }
    let scalar = raw.query_pre_attn_scalar.unwrap_or(DEFAULT_QUERY_SCALAR);
    if !(scalar > 0.0 && scalar.is_finite()) {
        return Err(bad(
            "query_pre_attn_scalar",
            format!("must be a finite positive number, got {scalar}"),
        ));
    }
    let final_logit_softcap = match raw.final_logit_softcapping {
        Some(cap) if !(cap > 0.0 && cap.is_finite()) => {
            return Err(bad(
                "final_logit_softcapping",
                format!("must be a finite positive number, got {cap}"),
            ));
        }
        cap => cap,
    };
    let local = local_layers(raw, dims.num_layers, path)?;
    let (global_rope, local_rope) = ropes(raw, path)?;
    let layers = local
        .into_iter()
        .map(|is_local| LayerSpec {
            attention: AttentionSpec {
                qkv_bias: raw.attention_bias.unwrap_or(false),
                o_bias: raw.attention_bias.unwrap_or(false),
                qk_norm: true,
                scale: 1.0 / scalar.sqrt(),
                logit_softcap: None,
                window: is_local.then_some(window),
            },
            rope: if is_local { &local_rope } else { &global_rope }.clone(),
            mlp: MlpSpec {
                activation,
                bias: false,
            },
            post_attention_norm: true,
            post_mlp_norm: true,
        })
        .collect();
    Ok(ModelSpec {
        norm_weight_offset: 1.0,
        embed_scale: (dims.hidden_size as f64).sqrt() as f32,
        final_logit_softcap,
        layers,
    })
}

/// Whether each of the `n` layers is local (sliding window).
fn local_layers(raw: &RawConfig, n: usize, path: &str) -> Result<Vec<bool>, ConfigError> {
    let bad = |field: &'static str, reason: String| ConfigError::Invalid {
        path: path.to_string(),
        field,
        reason,
    };
    if let Some(types) = &raw.layer_types {
        if types.len() != n {
            return Err(bad(
                "layer_types",
                format!(
                    "{} entries for num_hidden_layers {n}: one per layer",
                    types.len()
                ),
            ));
        }
        return types
            .iter()
            .map(|t| match t.as_str() {
                "sliding_attention" => Ok(true),
                "full_attention" => Ok(false),
                other => Err(bad(
                    "layer_types",
                    format!(
                        "unknown layer type `{other}` (known: sliding_attention, full_attention)"
                    ),
                )),
            })
            .collect();
    }
    let pattern = raw.sliding_window_pattern.unwrap_or(DEFAULT_PATTERN);
    if pattern == 0 {
        return Err(bad(
            "sliding_window_pattern",
            "must be positive, got 0".into(),
        ));
    }
    Ok((0..n).map(|i| (i + 1) % pattern != 0).collect())
}

/// The global and the local layers' RoPE.
fn ropes(raw: &RawConfig, path: &str) -> Result<(Rope, Rope), ConfigError> {
    let per_type = raw.rope_parameters.as_ref();
    let full = per_type.and_then(|p| p.full_attention.as_deref());
    let sliding = per_type.and_then(|p| p.sliding_attention.as_deref());
    // the older `rope_scaling` key applies to the global layers only
    let global_scaling = full.or(raw.rope_scaling.as_ref());
    let global = Rope {
        theta: theta(
            full.and_then(|r| r.rope_theta).or(raw.rope_theta),
            DEFAULT_GLOBAL_THETA,
            "rope_theta",
            path,
        )?,
        scaling: scaling(global_scaling, path)?,
    };
    let local = Rope {
        theta: theta(
            sliding
                .and_then(|r| r.rope_theta)
                .or(raw.rope_local_base_freq),
            DEFAULT_LOCAL_THETA,
            "rope_local_base_freq",
            path,
        )?,
        scaling: scaling(sliding, path)?,
    };
    Ok((global, local))
}

fn theta(
    v: Option<f64>,
    default: f64,
    field: &'static str,
    path: &str,
) -> Result<f64, ConfigError> {
    let theta = v.unwrap_or(default);
    rope::check_theta(theta, field, path)?;
    Ok(theta)
}

fn scaling(r: Option<&RawRope>, path: &str) -> Result<super::RopeScaling, ConfigError> {
    r.map_or(Ok(super::RopeScaling::None), |r| rope::resolve(r, path))
}
