//! Model configuration: the raw Hugging Face `config.json` and the validated
//! [`LlamaConfig`] every other module reads its dimensions from.
//!
//! Contract: nothing downstream hard-codes a model dimension; everything comes
//! from a `LlamaConfig`, which is only built through [`LlamaConfig::from_raw`]
//! (or the file helpers), so every one that exists has passed validation:
//! hidden divisible by heads (unless `head_dim` is given), heads divisible by
//! KV heads, a known RoPE type, positive sizes. Errors name the field.
//!
//! Both RoPE spellings are accepted: the classic top-level `rope_theta` +
//! `rope_scaling` keys and the newer `rope_parameters` object.

use serde::Deserialize;
use std::path::Path;

/// Errors reading or validating a model configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("malformed {path}: {source}")]
    Parse {
        path: String,
        source: serde_json::Error,
    },
    #[error("invalid config {path}: field `{field}`: {reason}")]
    Invalid {
        path: String,
        field: &'static str,
        reason: String,
    },
}

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
    #[serde(default)]
    pub attention_bias: Option<bool>,
    #[serde(default)]
    pub mlp_bias: Option<bool>,
    #[serde(default)]
    pub torch_dtype: Option<String>,
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

/// RoPE frequency scaling.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE: `inv_freq[i] = theta^(-2i/head_dim)`.
    None,
    /// Llama 3 piecewise scaling of the low frequencies.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: usize,
    },
}

/// A validated Llama-family configuration. All dimensions in the engine come from here.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
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
    pub rope_theta: f64,
    pub rope_scaling: RopeScaling,
    pub bos_token_id: Option<u32>,
    /// EOS ids from `config.json`; [`GenerationConfig`] may extend them.
    pub eos_token_ids: Vec<u32>,
}

impl LlamaConfig {
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
        let raw: RawConfig = serde_json::from_str(text).map_err(|source| ConfigError::Parse {
            path: path.to_string(),
            source,
        })?;
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
        if let Some(archs) = &raw.architectures
            && !archs.iter().any(|a| a == "LlamaForCausalLM")
        {
            return Err(bad(
                "architectures",
                format!("expected LlamaForCausalLM, got {archs:?}"),
            ));
        }
        if let Some(act) = &raw.hidden_act
            && act != "silu"
        {
            return Err(bad(
                "hidden_act",
                format!("only `silu` is supported, got `{act}`"),
            ));
        }
        if raw.attention_bias == Some(true) {
            return Err(bad("attention_bias", "biases are not supported".into()));
        }
        if raw.mlp_bias == Some(true) {
            return Err(bad("mlp_bias", "biases are not supported".into()));
        }
        let hidden_size = need(raw.hidden_size, "hidden_size")?;
        let intermediate_size = need(raw.intermediate_size, "intermediate_size")?;
        let num_layers = need(raw.num_hidden_layers, "num_hidden_layers")?;
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
        let rms_norm_eps = raw.rms_norm_eps.unwrap_or(1e-6);
        if !(rms_norm_eps > 0.0 && rms_norm_eps.is_finite()) {
            return Err(bad(
                "rms_norm_eps",
                format!("must be positive, got {rms_norm_eps}"),
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
        if !(rope_theta > 0.0 && rope_theta.is_finite()) {
            return Err(bad(
                "rope_theta",
                format!("must be positive, got {rope_theta}"),
            ));
        }
        let rope_scaling = match raw.rope_scaling.as_ref().or(params) {
            None => RopeScaling::None,
            Some(r) => Self::resolve_rope(r, path)?,
        };
        Ok(LlamaConfig {
            hidden_size,
            intermediate_size,
            num_layers,
            num_heads,
            num_kv_heads,
            head_dim,
            vocab_size,
            rms_norm_eps: rms_norm_eps as f32,
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
            max_position_embeddings,
            rope_theta,
            rope_scaling,
            bos_token_id: raw.bos_token_id,
            eos_token_ids: raw
                .eos_token_id
                .as_ref()
                .map(EosIds::to_vec)
                .unwrap_or_default(),
        })
    }

    fn resolve_rope(r: &RawRope, path: &str) -> Result<RopeScaling, ConfigError> {
        let kind = r
            .rope_type
            .as_deref()
            .or(r.kind.as_deref())
            .unwrap_or("default");
        match kind {
            "default" => Ok(RopeScaling::None),
            "llama3" => {
                let f = |v: Option<f64>, field: &'static str| {
                    v.filter(|x| *x > 0.0 && x.is_finite())
                        .ok_or(ConfigError::Invalid {
                            path: path.to_string(),
                            field,
                            reason: "llama3 rope scaling needs a positive value".into(),
                        })
                };
                let factor = f(r.factor, "rope_scaling.factor")?;
                let low_freq_factor = f(r.low_freq_factor, "rope_scaling.low_freq_factor")?;
                let high_freq_factor = f(r.high_freq_factor, "rope_scaling.high_freq_factor")?;
                if high_freq_factor <= low_freq_factor {
                    return Err(ConfigError::Invalid {
                        path: path.to_string(),
                        field: "rope_scaling.high_freq_factor",
                        reason: format!(
                            "must exceed low_freq_factor ({high_freq_factor} <= {low_freq_factor})"
                        ),
                    });
                }
                let original = r
                    .original_max_position_embeddings
                    .filter(|n| *n > 0)
                    .ok_or(ConfigError::Invalid {
                        path: path.to_string(),
                        field: "rope_scaling.original_max_position_embeddings",
                        reason: "llama3 rope scaling needs a positive value".into(),
                    })?;
                Ok(RopeScaling::Llama3 {
                    factor,
                    low_freq_factor,
                    high_freq_factor,
                    original_max_position_embeddings: original,
                })
            }
            other => Err(ConfigError::Invalid {
                path: path.to_string(),
                field: "rope_scaling.rope_type",
                reason: format!("unknown rope type `{other}` (supported: default, llama3)"),
            }),
        }
    }

    /// Query width: `num_heads * head_dim`.
    pub fn q_dim(&self) -> usize {
        self.num_heads * self.head_dim
    }

    /// Key (= value) width: `num_kv_heads * head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// The RoPE inverse frequencies, `[head_dim / 2]`, computed in f64 with llama3
    /// scaling applied. The one RoPE definition both backends build their tables from.
    pub fn rope_inv_freq(&self) -> Vec<f64> {
        let d = self.head_dim as f64;
        let base: Vec<f64> = (0..self.head_dim / 2)
            .map(|i| 1.0 / self.rope_theta.powf((2 * i) as f64 / d))
            .collect();
        match &self.rope_scaling {
            RopeScaling::None => base,
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                let old = *original_max_position_embeddings as f64;
                let low_wl = old / low_freq_factor;
                let high_wl = old / high_freq_factor;
                base.into_iter()
                    .map(|f| {
                        let wl = 2.0 * std::f64::consts::PI / f;
                        if wl < high_wl {
                            f
                        } else if wl > low_wl {
                            f / factor
                        } else {
                            let s =
                                (old / wl - low_freq_factor) / (high_freq_factor - low_freq_factor);
                            (1.0 - s) * f / factor + s * f
                        }
                    })
                    .collect()
            }
        }
    }

    /// `(cos, sin)` tables, each `[positions, head_dim / 2]` row-major, in f32,
    /// angles computed in f64. Built once per backend.
    pub fn rope_table(&self, positions: usize) -> (Vec<f32>, Vec<f32>) {
        let inv = self.rope_inv_freq();
        let half = inv.len();
        let mut cos = Vec::with_capacity(positions * half);
        let mut sin = Vec::with_capacity(positions * half);
        for p in 0..positions {
            for f in &inv {
                let a = p as f64 * f;
                cos.push(a.cos() as f32);
                sin.push(a.sin() as f32);
            }
        }
        (cos, sin)
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
}

impl GenerationConfig {
    /// Reads `dir/generation_config.json`; a missing file is an empty config.
    pub fn from_dir(dir: &Path) -> Result<Self, ConfigError> {
        let path = dir.join("generation_config.json");
        let p = path.display().to_string();
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                serde_json::from_str(&text).map_err(|source| ConfigError::Parse { path: p, source })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(source) => Err(ConfigError::Io { path: p, source }),
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
mod tests {
    use super::*;

    const LLAMA_1B: &str = r#"{
      "architectures": ["LlamaForCausalLM"], "hidden_size": 2048, "intermediate_size": 8192,
      "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
      "vocab_size": 128256, "rms_norm_eps": 1e-5, "tie_word_embeddings": true,
      "max_position_embeddings": 131072, "rope_theta": 500000.0,
      "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
      "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009]}"#;

    #[test]
    fn parses_llama_3_2_1b() {
        let c = LlamaConfig::from_json(LLAMA_1B, "config.json").unwrap();
        assert_eq!(
            (c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim),
            (2048, 32, 8, 64)
        );
        assert_eq!(c.eos_token_ids, vec![128001, 128008, 128009]);
        assert!(matches!(c.rope_scaling, RopeScaling::Llama3 { .. }));
        let inv = c.rope_inv_freq();
        assert_eq!(inv.len(), 32);
        // the highest frequency is untouched, the lowest divided by the factor
        assert!((inv[0] - 1.0).abs() < 1e-12);
        let plain = 1.0 / 500000f64.powf(62.0 / 64.0);
        assert!((inv[31] - plain / 32.0).abs() < 1e-15);
    }

    #[test]
    fn reads_rope_parameters_object() {
        let text = LLAMA_1B.replace("\"rope_theta\": 500000.0,", "").replace(
            "\"rope_scaling\": {\"rope_type\"",
            "\"rope_parameters\": {\"rope_theta\": 500000.0, \"rope_type\"",
        );
        let c = LlamaConfig::from_json(&text, "config.json").unwrap();
        let d = LlamaConfig::from_json(LLAMA_1B, "config.json").unwrap();
        assert_eq!(c, d);
    }

    #[test]
    fn head_dim_derived() {
        let text = LLAMA_1B.replace("\"head_dim\": 64,", "");
        assert_eq!(LlamaConfig::from_json(&text, "c").unwrap().head_dim, 64);
    }

    #[test]
    fn rejects_inconsistent_configs_naming_the_field() {
        let cases = [
            (
                LLAMA_1B.replace("\"num_key_value_heads\": 8", "\"num_key_value_heads\": 7"),
                "num_key_value_heads",
            ),
            (
                LLAMA_1B
                    .replace("\"head_dim\": 64,", "")
                    .replace("\"hidden_size\": 2048", "\"hidden_size\": 2050"),
                "hidden_size",
            ),
            (LLAMA_1B.replace("\"llama3\"", "\"yarn\""), "rope_type"),
            (
                LLAMA_1B.replace("\"vocab_size\": 128256,", ""),
                "vocab_size",
            ),
            (
                LLAMA_1B.replace("\"num_hidden_layers\": 16", "\"num_hidden_layers\": 0"),
                "num_hidden_layers",
            ),
        ];
        for (text, field) in cases {
            let err = LlamaConfig::from_json(&text, "m/config.json")
                .unwrap_err()
                .to_string();
            assert!(err.contains(field), "{err} should name {field}");
            assert!(err.contains("m/config.json"), "{err}");
        }
        let err = LlamaConfig::from_json("{not json", "m/config.json")
            .unwrap_err()
            .to_string();
        assert!(err.contains("malformed m/config.json"), "{err}");
    }

    #[test]
    fn generation_config_extends_eos() {
        let g: GenerationConfig =
            serde_json::from_str(r#"{"eos_token_id": [128001, 128008, 128009]}"#).unwrap();
        assert_eq!(g.eos_ids(&[128009]), vec![128009, 128001, 128008]);
    }
}
