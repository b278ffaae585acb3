//! LoRA adapters in the PEFT layout: `adapter_config.json` (`r`,
//! `lora_alpha`, `target_modules`, optional `use_rslora`) and
//! `adapter_model.safetensors` (`base_model.model.model.layers.{i}.{self_attn|mlp}.{target}.lora_A.weight`
//! `[r, in]` and `lora_B.weight` `[out, r]`, F32, BF16 or F16), read into a
//! checked [`contract::LoraAdapter`].
//!
//! Contract: [`load_adapter`] refuses, naming the file and the field or
//! tensor, an adapter whose config is missing or malformed, whose
//! `target_modules` name a module other than the seven Llama projections,
//! whose tensors name another module, layer or target than the config's,
//! whose shapes do not fit the model, whose values are not finite, or whose
//! rank is above `max_rank` (`--max-lora-rank`). [`resolve_adapter`] maps a
//! `--lora` path or Hugging Face repo id to a directory through the same
//! hub cache the models use. [`write_peft_adapter`] writes an adapter in
//! exactly that layout (F32 tensors, PEFT's names and config keys): the
//! test helper and the merged-weights reference of the tests.
//!
//! Costs: one read of the file; memory = the adapter in f32.

use crate::store::{StoreError, hub};
use contract::config::LlamaConfig;
use contract::lora::{LoraAdapter, LoraError, LoraLayer, LoraPair, LoraTarget, lora_scale};
use half::{bf16, f16};
use safetensors::{Dtype, SafeTensors};
use std::path::{Path, PathBuf};

/// The adapter's configuration file.
pub const ADAPTER_CONFIG: &str = "adapter_config.json";
/// The adapter's weights.
pub const ADAPTER_WEIGHTS: &str = "adapter_model.safetensors";
const PREFIX: &str = "base_model.model.model.layers.";

/// Errors reading an adapter.
#[derive(Debug, thiserror::Error)]
pub enum LoraLoadError {
    #[error("LoRA adapter {path}: cannot read it: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("LoRA adapter {path}: `{field}` {reason}")]
    Config {
        path: PathBuf,
        field: String,
        reason: String,
    },
    #[error("LoRA adapter {path}: tensor `{tensor}` {reason}")]
    Tensor {
        path: PathBuf,
        tensor: String,
        reason: String,
    },
    #[error("LoRA adapter {path}: {source}")]
    Fit { path: PathBuf, source: LoraError },
    #[error("LoRA adapter {0}: {1}")]
    Store(String, StoreError),
}

/// The directory of adapter `spec`: a local directory as is, else a
/// Hugging Face repo id fetched into (or found in) the hub cache.
pub fn resolve_adapter(spec: &str) -> Result<PathBuf, LoraLoadError> {
    let path = Path::new(spec);
    if path.is_dir() {
        return Ok(path.to_path_buf());
    }
    match hub::RepoRef::parse(spec) {
        Some(r) if !spec.starts_with('.') && !spec.starts_with('/') => hub::Hub::from_env()
            .snapshot(&r)
            .map_err(|e| LoraLoadError::Store(spec.to_string(), e)),
        _ => Err(LoraLoadError::Io {
            path: path.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such directory"),
        }),
    }
}

/// Whether a config field's value is one lamina supports.
type FieldOk = fn(&serde_json::Value) -> bool;

/// The fields of `adapter_config.json` that matter.
struct PeftConfig {
    rank: usize,
    alpha: f32,
    targets: Vec<LoraTarget>,
    rslora: bool,
}

fn read_config(dir: &Path) -> Result<PeftConfig, LoraLoadError> {
    let path = dir.join(ADAPTER_CONFIG);
    let text = std::fs::read_to_string(&path).map_err(|source| LoraLoadError::Io {
        path: path.clone(),
        source,
    })?;
    let bad = |field: &str, reason: String| LoraLoadError::Config {
        path: path.clone(),
        field: field.into(),
        reason,
    };
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad("(file)", format!("is not JSON: {e}")))?;
    let rank = v
        .get("r")
        .and_then(|r| r.as_u64())
        .ok_or_else(|| bad("r", "is missing or not a positive integer".into()))?
        as usize;
    let alpha = match v.get("lora_alpha") {
        None | Some(serde_json::Value::Null) => rank as f32,
        Some(a) => a
            .as_f64()
            .ok_or_else(|| bad("lora_alpha", format!("is {a}, not a number")))?
            as f32,
    };
    let rslora = v
        .get("use_rslora")
        .and_then(|x| x.as_bool())
        .unwrap_or(false);
    let names: Vec<String> = match v.get("target_modules") {
        Some(serde_json::Value::Array(a)) => a
            .iter()
            .map(|x| x.as_str().map(str::to_string))
            .collect::<Option<_>>()
            .ok_or_else(|| bad("target_modules", "holds a non-string entry".into()))?,
        Some(serde_json::Value::String(s)) if s == "all-linear" => LoraTarget::ALL
            .iter()
            .map(|t| t.name().to_string())
            .collect(),
        Some(other) => {
            return Err(bad(
                "target_modules",
                format!("is {other}; expected a list of module names"),
            ));
        }
        None => return Err(bad("target_modules", "is missing".into())),
    };
    let mut targets = Vec::new();
    for n in &names {
        let t = LoraTarget::from_name(n).ok_or_else(|| {
            bad(
                "target_modules",
                format!(
                    "names `{n}`, which is not a projection LoRA can target here (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)"
                ),
            )
        })?;
        targets.push(t);
    }
    let unsupported: [(&str, FieldOk); 4] = [
        ("fan_in_fan_out", |x: &serde_json::Value| {
            x.as_bool() != Some(true)
        }),
        ("bias", |x: &serde_json::Value| {
            x.is_null() || x.as_str() == Some("none")
        }),
        ("modules_to_save", |x: &serde_json::Value| {
            x.is_null() || x.as_array().is_some_and(|a| a.is_empty())
        }),
        ("use_dora", |x: &serde_json::Value| {
            x.as_bool() != Some(true)
        }),
    ];
    for (field, ok) in unsupported {
        if let Some(x) = v.get(field).filter(|x| !ok(x)) {
            return Err(bad(field, format!("is {x}, which lamina does not support")));
        }
    }
    for field in ["rank_pattern", "alpha_pattern"] {
        if let Some(x) = v
            .get(field)
            .filter(|x| x.as_object().is_some_and(|o| !o.is_empty()))
        {
            return Err(bad(
                field,
                format!("is {x}; per-module ranks are not supported"),
            ));
        }
    }
    Ok(PeftConfig {
        rank,
        alpha,
        targets,
        rslora,
    })
}

/// `(layer, target, 'A' | 'B')` of a PEFT tensor name.
fn parse_name(name: &str) -> Option<(usize, &str, char)> {
    let rest = name.strip_prefix(PREFIX)?;
    let (layer, rest) = rest.split_once('.')?;
    let (_block, rest) = rest.split_once('.')?;
    let (module, rest) = rest.split_once('.')?;
    let which = match rest {
        "lora_A.weight" => 'A',
        "lora_B.weight" => 'B',
        _ => return None,
    };
    Some((layer.parse().ok()?, module, which))
}

/// Reads and checks the PEFT adapter in `dir` against model `c` with ranks
/// up to `max_rank` (see the module doc).
pub fn load_adapter(
    dir: &Path,
    c: &LlamaConfig,
    max_rank: usize,
) -> Result<LoraAdapter, LoraLoadError> {
    let cfg = read_config(dir)?;
    let path = dir.join(ADAPTER_WEIGHTS);
    let fit = |source: LoraError| LoraLoadError::Fit {
        path: dir.to_path_buf(),
        source,
    };
    if cfg.rank > max_rank || cfg.rank == 0 {
        return Err(LoraLoadError::Config {
            path: dir.join(ADAPTER_CONFIG),
            field: "r".into(),
            reason: match cfg.rank {
                0 => "is 0; the rank must be at least 1".into(),
                r => format!("is {r}, above --max-lora-rank {max_rank}"),
            },
        });
    }
    let bytes = std::fs::read(&path).map_err(|source| LoraLoadError::Io {
        path: path.clone(),
        source,
    })?;
    let st = SafeTensors::deserialize(&bytes).map_err(|e| LoraLoadError::Tensor {
        path: path.clone(),
        tensor: "(header)".into(),
        reason: format!("is not a safetensors file: {e}"),
    })?;
    let mut layers = vec![LoraLayer::default(); c.num_layers];
    let mut halves = vec![[(false, false); 7]; c.num_layers];
    // by name: the first tensor at fault is the same on every run
    let mut tensors = st.tensors();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, view) in tensors {
        let bad = |reason: String| LoraLoadError::Tensor {
            path: path.clone(),
            tensor: name.clone(),
            reason,
        };
        let (l, module, which) = parse_name(&name).ok_or_else(|| {
            bad(format!(
                "is not a LoRA weight of a layer projection (expected `{PREFIX}{{i}}.{{self_attn|mlp}}.{{module}}.lora_{{A|B}}.weight`)"
            ))
        })?;
        let t = LoraTarget::from_name(module)
            .filter(|t| name.contains(&format!(".{}.{}.", t.block(), t.name())))
            .ok_or_else(|| {
                bad(format!(
                    "targets module `{module}`, which LoRA cannot target here"
                ))
            })?;
        if !cfg.targets.contains(&t) {
            return Err(bad(format!(
                "targets `{module}`, which is not among the config's target_modules"
            )));
        }
        if l >= c.num_layers {
            return Err(bad(format!(
                "is for layer {l}, but the model has {} layers",
                c.num_layers
            )));
        }
        let (i, o) = t.dims(c);
        let r = cfg.rank;
        let want = if which == 'A' { vec![r, i] } else { vec![o, r] };
        if view.shape() != want.as_slice() {
            return Err(bad(format!(
                "has shape {:?}, expected {want:?} (rank {r} from `r`, the model's projection is [{o}, {i}])",
                view.shape()
            )));
        }
        let data = to_f32(view.dtype(), view.data()).ok_or_else(|| {
            bad(format!(
                "has dtype {:?}, expected F32, BF16 or F16",
                view.dtype()
            ))
        })?;
        if let Some((k, x)) = data.iter().enumerate().find(|(_, x)| !x.is_finite()) {
            return Err(bad(format!(
                "holds a non-finite value ({x} at flat index {k})"
            )));
        }
        let pair = layers[l].pairs[t.index()].get_or_insert_with(|| LoraPair {
            a: Vec::new(),
            b: Vec::new(),
        });
        let half = &mut halves[l][t.index()];
        if which == 'A' {
            pair.a = data;
            half.0 = true;
        } else {
            pair.b = data;
            half.1 = true;
        }
    }
    for (l, hs) in halves.iter().enumerate() {
        for t in LoraTarget::ALL {
            let (a, b) = hs[t.index()];
            if a != b {
                return Err(LoraLoadError::Tensor {
                    path: path.clone(),
                    tensor: format!(
                        "{PREFIX}{l}.{}.{}.lora_{}.weight",
                        t.block(),
                        t.name(),
                        if a { 'B' } else { 'A' }
                    ),
                    reason: "is missing (its other half is there)".into(),
                });
            }
        }
    }
    let adapter = LoraAdapter {
        rank: cfg.rank,
        scale: lora_scale(cfg.alpha, cfg.rank, cfg.rslora),
        layers,
    };
    adapter.check(c, max_rank).map_err(fit)?;
    Ok(adapter)
}

fn to_f32(dtype: Dtype, bytes: &[u8]) -> Option<Vec<f32>> {
    Some(match dtype {
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
            .collect(),
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
            .collect(),
        _ => return None,
    })
}

/// What [`write_peft_adapter`] writes: rank, alpha, targets, rsLoRA, and
/// the seed of its values.
#[derive(Debug, Clone)]
pub struct PeftSpec {
    pub rank: usize,
    pub alpha: f32,
    pub targets: Vec<LoraTarget>,
    pub rslora: bool,
    pub seed: u64,
    /// Spread of the values (uniform in `[-amp, amp]`).
    pub amp: f32,
}

/// Writes a PEFT adapter for model `c` into `dir` (created): its
/// `adapter_config.json` and `adapter_model.safetensors` with F32 values
/// that are a pure function of (seed, tensor name, index). Returns the
/// adapter as [`load_adapter`] reads it.
pub fn write_peft_adapter(
    dir: &Path,
    c: &LlamaConfig,
    spec: &PeftSpec,
) -> std::io::Result<LoraAdapter> {
    std::fs::create_dir_all(dir)?;
    let names: Vec<&str> = spec.targets.iter().map(|t| t.name()).collect();
    let config = serde_json::json!({
        "alpha_pattern": {},
        "auto_mapping": null,
        "base_model_name_or_path": "synthetic",
        "bias": "none",
        "fan_in_fan_out": false,
        "inference_mode": true,
        "init_lora_weights": true,
        "layers_pattern": null,
        "layers_to_transform": null,
        "lora_alpha": spec.alpha,
        "lora_dropout": 0.0,
        "modules_to_save": null,
        "peft_type": "LORA",
        "r": spec.rank,
        "rank_pattern": {},
        "revision": null,
        "target_modules": names,
        "task_type": "CAUSAL_LM",
        "use_dora": false,
        "use_rslora": spec.rslora,
    });
    let text = serde_json::to_string_pretty(&config).map_err(std::io::Error::other)?;
    std::fs::write(dir.join(ADAPTER_CONFIG), text)?;
    let r = spec.rank;
    let mut layers = vec![LoraLayer::default(); c.num_layers];
    let mut tensors: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::new();
    for (l, layer) in layers.iter_mut().enumerate() {
        for &t in &spec.targets {
            let (i, o) = t.dims(c);
            let base = format!("{PREFIX}{l}.{}.{}", t.block(), t.name());
            let a_name = format!("{base}.lora_A.weight");
            let b_name = format!("{base}.lora_B.weight");
            let a = values(spec, &a_name, r * i);
            let b = values(spec, &b_name, o * r);
            tensors.push((a_name, vec![r, i], a.clone()));
            tensors.push((b_name, vec![o, r], b.clone()));
            layer.pairs[t.index()] = Some(LoraPair { a, b });
        }
    }
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|(n, shape, v)| {
            let view = safetensors::tensor::TensorView::new(
                Dtype::F32,
                shape.clone(),
                bytemuck::cast_slice(v),
            )
            .map_err(std::io::Error::other)?;
            Ok((n.clone(), view))
        })
        .collect::<std::io::Result<_>>()?;
    let meta = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize_to_file(views, Some(meta), &dir.join(ADAPTER_WEIGHTS))
        .map_err(std::io::Error::other)?;
    Ok(LoraAdapter {
        rank: r,
        scale: lora_scale(spec.alpha, r, spec.rslora),
        layers,
    })
}

/// `n` values in `[-amp, amp]`, a pure function of (seed, name, index).
fn values(spec: &PeftSpec, name: &str, n: usize) -> Vec<f32> {
    let key = name
        .bytes()
        .fold(spec.seed ^ 0xCBF2_9CE4_8422_2325, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01B3)
        });
    (0..n as u64)
        .map(|i| {
            let z = crate::synth::splitmix64(key ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let u = (z >> 40) as f32 / (1u64 << 24) as f32; // [0, 1)
            (2.0 * u - 1.0) * spec.amp
        })
        .collect()
}

#[cfg(test)]
mod tests;
