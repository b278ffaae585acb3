//! [`write_peft_adapter`]: an adapter in exactly PEFT's layout (F32
//! tensors, PEFT's names and config keys), the test helper and the
//! merged-weights reference of the tests.

use std::path::Path;

use contract::config::ModelConfig;
use contract::lora::{LoraAdapter, LoraLayer, LoraPair, LoraTarget, lora_scale};
use safetensors::Dtype;

use super::{ADAPTER_CONFIG, ADAPTER_WEIGHTS, PREFIX};

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
    c: &ModelConfig,
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
