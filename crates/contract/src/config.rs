//! Model configuration: the raw Hugging Face `config.json` and the validated
//! [`ModelConfig`] every other module reads its dimensions from.
//!
//! Contract: nothing downstream hard-codes a model dimension; everything comes
//! from a `ModelConfig`, which is only built through [`ModelConfig::from_raw`]
//! (or the file helpers), so every one that exists has passed validation:
//! hidden divisible by heads (unless `head_dim` is given), heads divisible by
//! KV heads, a known RoPE type, positive sizes, every tensor and the whole
//! model addressable in f32 (no size product downstream can overflow),
//! `rms_norm_eps` a positive f32, a llama3 RoPE factor of at least 1.
//! What each layer computes is its [`ModelSpec`], made from the
//! architecture by `config/family.rs` (the one reader of `architectures`);
//! a sliding window is refused naming the field where the family's
//! windows are not modelled (Mistral v0.1, Qwen2).
//! Errors name the file and the field (a wrongly typed value too, by its
//! path: `rope_scaling.factor`).
//!
//! Both RoPE spellings are accepted: the classic top-level `rope_theta` +
//! `rope_scaling` keys and the newer `rope_parameters` object; resolving
//! them and the one RoPE definition live in `config/rope.rs`, the tests in
//! `config/tests.rs`. The KV cache's element type (`--kv-cache-dtype`) and
//! FP8 K/V's per-layer scales are `config/kv_cache.rs`.

use serde::Deserialize;
use std::path::Path;

mod family;
mod gemma;
mod kv_cache;
mod rope;
use crate::spec::{ModelSpec, Rope};
pub use family::SUPPORTED_ARCHITECTURES;
pub use kv_cache::{KvCacheDtype, KvScales, UnknownKvCacheDtype};
pub use rope::RopeScaling;

/// Errors reading or validating a model configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    /// Bad JSON, or a value of the wrong type; `field` is the path of the
    /// value (`rope_scaling.factor`), empty for a syntax error.
    #[error("malformed {path}: {}{source}", in_field(.field))]
    Parse {
        path: String,
        field: String,
        source: serde_json::Error,
    },
    #[error("invalid config {path}: field `{field}`: {reason}")]
    Invalid {
        path: String,
        field: &'static str,
        reason: String,
    },
}

fn in_field(field: &str) -> String {
    match field {
        "" | "." => String::new(),
        f => format!("field `{f}`: "),
    }
}

/// Parses JSON `text` into `T`; a type error names the field path.
fn parse_json<T: serde::de::DeserializeOwned>(text: &str, path: &str) -> Result<T, ConfigError> {
    let de = &mut serde_json::Deserializer::from_str(text);
    let err = |field: String, source| ConfigError::Parse {
        path: path.to_string(),
        field,
        source,
    };
    let v: T = serde_path_to_error::deserialize(&mut *de).map_err(|e| {
        let field = e.path().to_string();
        err(field, e.into_inner())
    })?;
    de.end().map_err(|e| err(String::new(), e))?;
    Ok(v)
}

/// Bytes of f32 data no model may exceed (the largest allocation Rust allows).
const MAX_BYTES: usize = isize::MAX as usize;

/// The most layers a model may have (the largest open models have ~130):
/// the spec holds one entry a layer, allocated only after this check.
pub const MAX_LAYERS: usize = 4096;

/// `config.json` as written by Hugging Face, before validation.
#[derive(Debug, Clone, Deserialize, Default)]
pub struct RawConfig {
    #[serde(default)]
    pub architectures: Option<Vec<String>>,
    #[serde(default)]
    pub model_type: Option<String>,
    pub hidden_size: Option<usize>,
    pub intermediate_size: Option<usize>,
    pub num_hidden_layers: Option<usize>,
    pub num_attention_heads: Option<usize>,
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    #[serde(default)]
    pub head_dim: Option<usize>,
    pub vocab_size: Option<usize>,
    #[serde(default)]
    pub rms_norm_eps: Option<f64>,
    #[serde(default)]
    pub tie_word_embeddings: Option<bool>,
    #[serde(default)]
    pub max_position_embeddings: Option<usize>,
    #[serde(default)]
    pub rope_theta: Option<f64>,
    #[serde(default)]
    pub rope_scaling: Option<RawRope>,
    #[serde(default)]
    pub rope_parameters: Option<RawRope>,
    #[serde(default)]
    pub bos_token_id: Option<u32>,
    #[serde(default)]
    pub eos_token_id: Option<EosIds>,
    #[serde(default)]
    pub hidden_act: Option<String>,
    /// Gemma's spelling of `hidden_act`.
    #[serde(default)]
    pub hidden_activation: Option<String>,
    #[serde(default)]
    pub attention_bias: Option<bool>,
    #[serde(default)]
    pub mlp_bias: Option<bool>,
    #[serde(default)]
    pub torch_dtype: Option<String>,
    /// Mistral's (and Qwen2's) sliding attention window; supported only
    /// when it covers the whole context (or is switched off).
    #[serde(default)]
    pub sliding_window: Option<usize>,
    #[serde(default)]
    pub use_sliding_window: Option<bool>,
    /// Gemma 3: which layers are `sliding_attention` / `full_attention`.
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    /// Gemma 3's older spelling of `layer_types`: every n-th layer is global.
    #[serde(default, alias = "_sliding_window_pattern")]
    pub sliding_window_pattern: Option<usize>,
    /// Gemma 3: the local (sliding-window) layers' RoPE base.
    #[serde(default)]
    pub rope_local_base_freq: Option<f64>,
    /// Gemma: the attention scores' scale is `query_pre_attn_scalar^-1/2`.
    #[serde(default)]
    pub query_pre_attn_scalar: Option<f64>,
    #[serde(default)]
    pub final_logit_softcapping: Option<f64>,
    #[serde(default)]
    pub attn_logit_softcapping: Option<f64>,
    #[serde(default)]
    pub use_bidirectional_attention: Option<bool>,
}

/// A RoPE scaling / parameters object (`rope_scaling` or `rope_parameters`).
#[derive(Debug, Clone, Deserialize, Default)]
pub struct RawRope {
    #[serde(default)]
    pub rope_type: Option<String>,
    /// Older spelling of `rope_type`.
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    #[serde(default)]
    pub rope_theta: Option<f64>,
    #[serde(default)]
    pub factor: Option<f64>,
    #[serde(default)]
    pub low_freq_factor: Option<f64>,
    #[serde(default)]
    pub high_freq_factor: Option<f64>,
    #[serde(default)]
    pub original_max_position_embeddings: Option<usize>,
    /// Gemma 3's `rope_parameters` per layer type: the global layers'.
    #[serde(default)]
    pub full_attention: Option<Box<RawRope>>,
    /// The local (sliding-window) layers'.
    #[serde(default)]
    pub sliding_attention: Option<Box<RawRope>>,
}

/// `eos_token_id` is a single id or a list in Hugging Face files.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum EosIds {
    One(u32),
    Many(Vec<u32>),
}

impl EosIds {
    pub fn to_vec(&self) -> Vec<u32> {
        match self {
            EosIds::One(id) => vec![*id],
            EosIds::Many(ids) => ids.clone(),
        }
    }
}

/// A validated model configuration (any supported family: its layer is
/// described by `spec`). All dimensions in the engine come from here.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub rms_norm_eps: f32,
    pub tie_word_embeddings: bool,
    pub max_position_embeddings: usize,
    /// What each layer computes (norms, biases, RoPE, activation, ...).
    pub spec: ModelSpec,
    pub bos_token_id: Option<u32>,
    /// EOS ids from `config.json`; [`GenerationConfig`] may extend them.
    pub eos_token_ids: Vec<u32>,
}

impl ModelConfig {
    /// Reads and validates `dir/config.json`.
    pub fn from_dir(dir: &Path) -> Result<Self, ConfigError> {
        Self::from_file(&dir.join("config.json"))
    }

    /// Reads and validates one `config.json` file.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let p = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: p.clone(),
            source,
        })?;
        Self::from_json(&text, &p)
    }

    /// Parses and validates JSON text; `path` only labels errors.
    pub fn from_json(text: &str, path: &str) -> Result<Self, ConfigError> {
        let raw: RawConfig = parse_json(text, path)?;
        Self::from_raw(&raw, path)
    }

    /// Validates a raw config; `path` only labels errors.
    pub fn from_raw(raw: &RawConfig, path: &str) -> Result<Self, ConfigError> {
        let bad = |field: &'static str, reason: String| ConfigError::Invalid {
            path: path.to_string(),
            field,
            reason,
        };
        let need = |v: Option<usize>, field: &'static str| -> Result<usize, ConfigError> {
            match v {
                None => Err(bad(field, "missing".into())),
                Some(0) => Err(bad(field, "must be positive, got 0".into())),
                Some(n) => Ok(n),
            }
        };
        let hidden_size = need(raw.hidden_size, "hidden_size")?;
        let intermediate_size = need(raw.intermediate_size, "intermediate_size")?;
        let num_layers = need(raw.num_hidden_layers, "num_hidden_layers")?;
        if num_layers > MAX_LAYERS {
            return Err(bad(
                "num_hidden_layers",
                format!("{num_layers} is more than the {MAX_LAYERS} layers lamina supports"),
            ));
        }
        let num_heads = need(raw.num_attention_heads, "num_attention_heads")?;
        let num_kv_heads = need(
            raw.num_key_value_heads.or(raw.num_attention_heads),
            "num_key_value_heads",
        )?;
        let vocab_size = need(raw.vocab_size, "vocab_size")?;
        if num_heads % num_kv_heads != 0 {
            return Err(bad(
                "num_key_value_heads",
                format!("num_attention_heads {num_heads} is not divisible by {num_kv_heads}"),
            ));
        }
        let head_dim = match raw.head_dim {
            Some(0) => return Err(bad("head_dim", "must be positive, got 0".into())),
            Some(d) => d,
            None => {
                if hidden_size % num_heads != 0 {
                    return Err(bad(
                        "hidden_size",
                        format!(
                            "hidden_size {hidden_size} is not divisible by num_attention_heads {num_heads}"
                        ),
                    ));
                }
                hidden_size / num_heads
            }
        };
        if head_dim % 2 != 0 {
            return Err(bad(
                "head_dim",
                format!("must be even for RoPE, got {head_dim}"),
            ));
        }
        // every tensor (and the whole model) must be addressable in f32:
        // no size computed from this config can overflow downstream
        let overflow = |field: &'static str, what: &str| {
            bad(
                field,
                format!("{what} would exceed {MAX_BYTES} bytes in f32 (the sizes overflow)"),
            )
        };
        let q_dim = num_heads
            .checked_mul(head_dim)
            .ok_or_else(|| overflow("head_dim", "num_attention_heads x head_dim"))?;
        let tensor = |rows: usize, cols: usize| {
            rows.checked_mul(cols)
                .filter(|n| n.checked_mul(4).is_some_and(|b| b <= MAX_BYTES))
        };
        let embed = tensor(vocab_size, hidden_size)
            .ok_or_else(|| overflow("vocab_size", "the embedding [vocab_size, hidden_size]"))?;
        let attn = tensor(q_dim, hidden_size)
            .ok_or_else(|| overflow("num_attention_heads", "q_proj [heads x head_dim, hidden]"))?;
        let mlp = tensor(intermediate_size, hidden_size)
            .ok_or_else(|| overflow("intermediate_size", "gate_proj [intermediate, hidden]"))?;
        // per layer: q, o, and k, v (at most q's size: kv heads divide heads), 3 MLP, 2 norms
        let per_layer = [
            attn,
            attn,
            attn,
            attn,
            mlp,
            mlp,
            mlp,
            hidden_size,
            hidden_size,
        ]
        .into_iter()
        .try_fold(0usize, usize::checked_add);
        per_layer
            .and_then(|l| l.checked_mul(num_layers))
            .and_then(|l| l.checked_add(embed.checked_mul(2)?))
            .filter(|n| n.checked_mul(4).is_some_and(|b| b <= MAX_BYTES))
            .ok_or_else(|| overflow("num_hidden_layers", "the whole model"))?;
        let rms_norm_eps = raw.rms_norm_eps.unwrap_or(1e-6);
        // stored as f32: 1e-50 would become 0 (a division by zero) and 1e39 infinity
        let eps32 = rms_norm_eps as f32; // NaN and inf stay so
        if !(eps32 > 0.0 && eps32.is_finite()) {
            return Err(bad(
                "rms_norm_eps",
                format!("must be a positive f32 (from 1.2e-38 to 3.4e38), got {rms_norm_eps}"),
            ));
        }
        let max_position_embeddings = need(
            Some(raw.max_position_embeddings.unwrap_or(2048)),
            "max_position_embeddings",
        )?;
        let params = raw.rope_parameters.as_ref();
        let rope_theta = raw
            .rope_theta
            .or(params.and_then(|p| p.rope_theta))
            .unwrap_or(10000.0);
        rope::check_theta(rope_theta, "rope_theta", path)?;
        // a special token the embedding has no row for could never be read
        // or sampled (an EOS that never comes: every reply runs to its limit)
        let eos = raw
            .eos_token_id
            .as_ref()
            .map(EosIds::to_vec)
            .unwrap_or_default();
        let ids = [("bos_token_id", raw.bos_token_id)]
            .into_iter()
            .chain(eos.iter().map(|&e| ("eos_token_id", Some(e))));
        for (field, id) in ids {
            if let Some(id) = id.filter(|&id| id as usize >= vocab_size) {
                return Err(bad(
                    field,
                    format!("token id {id} is outside the vocabulary (vocab_size {vocab_size})"),
                ));
            }
        }
        let rope_scaling = match raw.rope_scaling.as_ref().or(params) {
            None => RopeScaling::None,
            Some(r) => rope::resolve(r, path)?,
        };
        let rope = Rope {
            theta: rope_theta,
            scaling: rope_scaling,
        };
        let dims = family::Dims {
            hidden_size,
            head_dim,
            num_layers,
            max_position_embeddings,
        };
        let spec = family::spec(raw, dims, rope, path)?;
        Ok(ModelConfig {
            hidden_size,
            intermediate_size,
            num_layers,
            num_heads,
            num_kv_heads,
            head_dim,
            vocab_size,
            rms_norm_eps: rms_norm_eps as f32,
            tie_word_embeddings: raw
                .tie_word_embeddings
                .unwrap_or(family::ties_by_default(raw)),
            max_position_embeddings,
            spec,
            bos_token_id: raw.bos_token_id,
            eos_token_ids: eos,
        })
    }

    /// Llama's layer in this model's dimensions and RoPE: what kernels that
    /// fuse Llama's layer run.
    pub fn llama_spec(&self) -> ModelSpec {
        ModelSpec::llama(self.num_layers, self.head_dim, self.rope().clone())
    }

    /// Query width: `num_heads * head_dim`.
    pub fn q_dim(&self) -> usize {
        self.num_heads * self.head_dim
    }

    /// Key (= value) width: `num_kv_heads * head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }
}

/// Where [`SamplingDefaults`] came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DefaultsSource {
    /// The model's `generation_config.json`.
    Model,
    /// llama.cpp's defaults (the model ships no sampling settings).
    LlamaCpp,
}

/// The sampling settings in effect when a request sets none of them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingDefaults {
    pub temperature: f32,
    /// 0 = off.
    pub top_k: usize,
    pub top_p: f32,
    /// 0 = off.
    pub min_p: f32,
    /// 1 = off; the model's `repetition_penalty` whichever the source.
    pub repetition_penalty: f32,
    pub source: DefaultsSource,
}

impl SamplingDefaults {
    /// Sampling parameters with these defaults, and every other parameter
    /// at its own default: the base a request's values override.
    pub fn params(&self) -> crate::SamplingParams {
        crate::SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            ..Default::default()
        }
    }

    /// llama.cpp's `common_params_sampling` defaults.
    pub const LLAMA_CPP: SamplingDefaults = SamplingDefaults {
        temperature: 0.8,
        top_k: 40,
        top_p: 0.95,
        min_p: 0.05,
        repetition_penalty: 1.0,
        source: DefaultsSource::LlamaCpp,
    };
}

impl std::fmt::Display for SamplingDefaults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let from = match self.source {
            DefaultsSource::Model => "from the model's generation_config.json",
            DefaultsSource::LlamaCpp => "llama.cpp's defaults: the model ships none",
        };
        write!(
            f,
            "temperature {}, top-k {}, top-p {}, min-p {}",
            self.temperature, self.top_k, self.top_p, self.min_p
        )?;
        if self.repetition_penalty != 1.0 {
            // (from the model's file, whichever the source of the others)
            write!(
                f,
                ", repetition penalty {} (generation_config.json)",
                self.repetition_penalty
            )?;
        }
        write!(f, " ({from})")
    }
}

/// `generation_config.json`: the EOS list and default sampling settings.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct GenerationConfig {
    #[serde(default)]
    pub bos_token_id: Option<u32>,
    #[serde(default)]
    pub eos_token_id: Option<EosIds>,
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub top_p: Option<f32>,
    #[serde(default)]
    pub top_k: Option<usize>,
    #[serde(default)]
    pub min_p: Option<f32>,
    /// Transformers' `repetition_penalty` (1 = off).
    #[serde(default)]
    pub repetition_penalty: Option<f32>,
}

impl GenerationConfig {
    /// Reads `dir/generation_config.json`; a missing file is an empty config.
    pub fn from_dir(dir: &Path) -> Result<Self, ConfigError> {
        let path = dir.join("generation_config.json");
        let p = path.display().to_string();
        match std::fs::read_to_string(&path) {
            Ok(text) => Self::from_json(&text, &p),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(source) => Err(ConfigError::Io { path: p, source }),
        }
    }

    /// Parses and checks `generation_config.json` text; `path` only labels errors.
    pub fn from_json(text: &str, path: &str) -> Result<Self, ConfigError> {
        let g: Self = parse_json(text, path)?;
        g.check(path)?;
        Ok(g)
    }

    /// The sampling defaults must be usable (requests fall back on them, so
    /// a bad one would fail requests that never set the field): temperature
    /// finite and >= 0, top_p in (0, 1]. `path` names the file in errors.
    pub fn check(&self, path: &str) -> Result<(), ConfigError> {
        let bad = |field: &'static str, reason: String| ConfigError::Invalid {
            path: path.to_string(),
            field,
            reason,
        };
        if let Some(t) = self.temperature
            && !(t >= 0.0 && t.is_finite())
        {
            return Err(bad(
                "temperature",
                format!("must be a finite number >= 0, got {t}"),
            ));
        }
        if let Some(p) = self.top_p
            && !(p > 0.0 && p <= 1.0)
        {
            return Err(bad("top_p", format!("must be in (0, 1], got {p}")));
        }
        if let Some(p) = self.min_p
            && !(0.0..=1.0).contains(&p)
        {
            return Err(bad("min_p", format!("must be in [0, 1], got {p}")));
        }
        if let Some(r) = self.repetition_penalty
            && !(r > 0.0 && r.is_finite())
        {
            return Err(bad(
                "repetition_penalty",
                format!("must be a finite number > 0, got {r}"),
            ));
        }
        Ok(())
    }

    /// The sampling settings a request that sets none falls back on: the
    /// values this file ships, the others neutral (temperature 1, no top-k,
    /// top-p 1, no min-p); when it ships none at all, llama.cpp's defaults
    /// ([`SamplingDefaults::LLAMA_CPP`]), because a small model sampled at
    /// temperature 1 with no truncation rambles. The file's
    /// `repetition_penalty` applies either way (none: 1, off).
    pub fn sampling_defaults(&self) -> SamplingDefaults {
        let repetition_penalty = self.repetition_penalty.unwrap_or(1.0);
        if self.temperature.is_none()
            && self.top_p.is_none()
            && self.top_k.is_none()
            && self.min_p.is_none()
        {
            return SamplingDefaults {
                repetition_penalty,
                ..SamplingDefaults::LLAMA_CPP
            };
        }
        SamplingDefaults {
            temperature: self.temperature.unwrap_or(1.0),
            top_k: self.top_k.unwrap_or(0),
            top_p: self.top_p.unwrap_or(1.0),
            min_p: self.min_p.unwrap_or(0.0),
            repetition_penalty,
            source: DefaultsSource::Model,
        }
    }

    /// The union of this file's EOS ids and `base` (the ids from `config.json`), in order.
    pub fn eos_ids(&self, base: &[u32]) -> Vec<u32> {
        let mut out: Vec<u32> = base.to_vec();
        for id in self
            .eos_token_id
            .as_ref()
            .map(EosIds::to_vec)
            .unwrap_or_default()
        {
            if !out.contains(&id) {
                out.push(id);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests;
