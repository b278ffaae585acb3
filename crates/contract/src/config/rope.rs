//! RoPE: the scaling a config asks for ([`RopeScaling`], resolved from
//! `rope_scaling` or `rope_parameters`) and the one RoPE definition both
//! backends build their tables from ([`Rope::inv_freq`], [`Rope::table`]).
//!
//! Costs: `rope_inv_freq` O(head_dim); `rope_table` O(positions x head_dim)
//! time and memory, computed in f64 and stored in f32, once per backend.

use super::{ConfigError, ModelConfig, RawRope};
use crate::spec::Rope;

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

/// A RoPE base must be finite and at least 1: below 1 the "slowest" pair
/// would turn fastest (real models use 1e4 .. 1e6). `field` names it.
pub(super) fn check_theta(theta: f64, field: &'static str, path: &str) -> Result<(), ConfigError> {
    if theta >= 1.0 && theta.is_finite() {
        return Ok(());
    }
    Err(ConfigError::Invalid {
        path: path.to_string(),
        field,
        reason: format!("must be a finite number of at least 1, got {theta}"),
    })
}

/// Resolves a `rope_scaling` / `rope_parameters` object; errors name the field.
pub(super) fn resolve(r: &RawRope, path: &str) -> Result<RopeScaling, ConfigError> {
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
            // as transformers requires: a factor below 1 would speed the low
            // frequencies up (1e-320 turns them infinite)
            if factor < 1.0 {
                return Err(ConfigError::Invalid {
                    path: path.to_string(),
                    field: "rope_scaling.factor",
                    reason: format!(
                        "llama3 rope scaling needs a factor of at least 1, got {factor}"
                    ),
                });
            }
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

impl Rope {
    /// The inverse frequencies for heads of `head_dim`, `[head_dim / 2]`,
    /// computed in f64 with the scaling applied: the one RoPE definition
    /// every backend and reference builds its tables from.
    pub fn inv_freq(&self, head_dim: usize) -> Vec<f64> {
        let d = head_dim as f64;
        let base: Vec<f64> = (0..head_dim / 2)
            .map(|i| 1.0 / self.theta.powf((2 * i) as f64 / d))
            .collect();
        match &self.scaling {
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

    /// `(cos, sin)` tables, each `[positions, head_dim / 2]` row-major, in
    /// f32, angles computed in f64.
    pub fn table(&self, head_dim: usize, positions: usize) -> (Vec<f32>, Vec<f32>) {
        let inv = self.inv_freq(head_dim);
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

impl ModelConfig {
    /// The RoPE of layer 0. A backend that keeps one table for every layer
    /// runs only specs whose layers share it
    /// ([`ModelSpec::uniform_rope`](crate::spec::ModelSpec::uniform_rope),
    /// checked when it opens).
    pub fn rope(&self) -> &Rope {
        &self.spec.layers[0].rope
    }

    /// Layer 0's inverse frequencies ([`Rope::inv_freq`]).
    pub fn rope_inv_freq(&self) -> Vec<f64> {
        self.rope().inv_freq(self.head_dim)
    }

    /// Layer 0's `(cos, sin)` tables ([`Rope::table`]), built once per backend.
    pub fn rope_table(&self, positions: usize) -> (Vec<f32>, Vec<f32>) {
        self.rope().table(self.head_dim, positions)
    }
}
