//! Writing a BF16 model directory as an FP8 checkpoint in one of the hub's
//! layouts ([`Fp8Layout`]), byte for byte as the tools that make them do
//! (llm-compressor for compressed-tensors, AutoFP8 for `fp8`): every
//! projection `F8_E4M3` with its `weight_scale` (and `input_scale` for
//! static activations), everything else as it was, `quantization_config`
//! added to `config.json`, the other files copied (but the store's
//! `lamina.json` and GGUF files, which describe the BF16 source). The
//! loader's tests and the FP8 quality checks make their checkpoints with
//! it. A projection the model holds in BF16 is rounded to nearest
//! ([`write_fp8_checkpoint`]); one it holds in FP8 already (GPTQ's,
//! `model::gptq`: [`write_quantized_checkpoint`]) is written as it is,
//! checked against the layout first.
//!
//! Either may carry calibrated FP8 KV cache scales
//! ([`write_checkpoint`]: `model.layers.N.self_attn.k_scale` / `v_scale`,
//! one BF16 value each (`[1]`) in compressed-tensors with its
//! `kv_cache_scheme`, an F32 scalar in the `fp8` layout), and a BF16 model
//! may be written with only those scales added (its `config.json` as it
//! was: lamina reads the scales of any checkpoint).
//!
//! Costs: the whole model is held in memory once in BF16 and once in FP8.

use std::collections::HashMap;
use std::path::Path;

use safetensors::Dtype;
use safetensors::tensor::TensorView;
use serde_json::{Value, json};

use contract::KvScales;

use super::{Fp8Tensor, kv_scale_names};
use crate::loader::{INDEX_FILE, LoadError, SINGLE_FILE, load_config, load_weights, tensor_specs};
use crate::projection::Projection;
use crate::weights::{ModelWeights, Tensor};

/// The on-disk FP8 layouts (see the parent module).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fp8Layout {
    /// `quant_method: "compressed-tensors"`, `format: "float-quantized"`.
    CompressedTensors,
    /// `quant_method: "fp8"` (per-tensor scales).
    Fp8,
}

/// How [`write_fp8_checkpoint`] quantises.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fp8Options {
    pub layout: Fp8Layout,
    /// Per-output-channel scales (compressed-tensors only), else per tensor.
    pub channel: bool,
    /// Static activations: this `input_scale` on every projection.
    pub input_scale: Option<f32>,
}

/// A tensor to write: dtype, shape, little-endian bytes.
pub(crate) type Entry = (Dtype, Vec<usize>, Vec<u8>);

/// Writes the model of `src` (BF16 / F16 / F32 weights) to `out` as an FP8
/// checkpoint under `opts`.
pub fn write_fp8_checkpoint(src: &Path, out: &Path, opts: Fp8Options) -> Result<(), LoadError> {
    let loaded = load_config(src)?;
    let weights = load_weights(src, &loaded.config)?;
    write(src, &weights, Some(opts), None, out)
}

/// The weights [`write_checkpoint`] writes.
#[derive(Debug, Clone, Copy)]
pub enum WeightsOut {
    /// Every tensor in BF16 (an FP8 projection as its BF16 values).
    Bf16,
    /// Every layer projection in FP8 in a layout: as the model holds it
    /// when FP8 (see [`write_quantized_checkpoint`]), else rounded to
    /// nearest.
    Fp8(Fp8Options),
}

/// Writes the model of `src` (`weights`, as loaded from it, its
/// projections perhaps quantised since) to `out` with `how`'s weights and
/// the FP8 KV cache scales `kv` (one per layer for K and for V, each
/// finite and positive: the error names the tensor).
pub fn write_checkpoint(
    src: &Path,
    weights: &ModelWeights,
    how: WeightsOut,
    kv: &KvScales,
    out: &Path,
) -> Result<(), LoadError> {
    check_kv_scales(src, weights.layers.len(), kv)?;
    let fp8 = match how {
        WeightsOut::Bf16 => None,
        WeightsOut::Fp8(opts) => Some(opts),
    };
    write(src, weights, fp8, Some(kv), out)
}

/// `kv` holds a finite positive K and V scale for each of `layers`.
fn check_kv_scales(src: &Path, layers: usize, kv: &KvScales) -> Result<(), LoadError> {
    for l in 0..layers {
        let [k_name, v_name] = kv_scale_names(l);
        for (name, got) in [(k_name, kv.k.get(l)), (v_name, kv.v.get(l))] {
            match got {
                Some(s) if s.is_finite() && *s > 0.0 => {}
                other => {
                    return Err(LoadError::Scale {
                        path: src.to_path_buf(),
                        tensor: name,
                        reason: format!("is {other:?}; each layer needs a finite positive scale"),
                    });
                }
            }
        }
    }
    Ok(())
}

/// Writes the model of `src` to `out` as [`write_fp8_checkpoint`] does,
/// with `weights` (the model as loaded from `src`, its projections
/// quantised since: GPTQ's) taking every FP8 projection as it is: each
/// must have a finite positive scale per row, and one scale for the whole
/// tensor when `opts` is per tensor (the error names the tensor).
pub fn write_quantized_checkpoint(
    src: &Path,
    weights: &ModelWeights,
    out: &Path,
    opts: Fp8Options,
) -> Result<(), LoadError> {
    write(src, weights, Some(opts), None, out)
}

/// `f` checked against `opts`: finite positive scales, one per row (the
/// same value in each when `opts` is per tensor).
fn check_given(src: &Path, f: &Fp8Tensor, opts: Fp8Options) -> Result<(), LoadError> {
    let bad = |reason: String| LoadError::Scale {
        path: src.to_path_buf(),
        tensor: f.name.clone(),
        reason,
    };
    let (n, k) = (f.shape[0], f.shape[1]);
    if f.data.len() != n * k || f.scale.len() != n {
        return Err(bad(format!(
            "quantised as {:?} with {} bytes and {} scales",
            f.shape,
            f.data.len(),
            f.scale.len()
        )));
    }
    if let Some(s) = f.scale.iter().find(|s| !(s.is_finite() && **s > 0.0)) {
        return Err(bad(format!(
            "has scale {s}; scales must be finite and positive"
        )));
    }
    if !opts.channel && f.scale.iter().any(|s| *s != f.scale[0]) {
        return Err(bad(
            "has a scale per row; this layout has one per tensor".into()
        ));
    }
    Ok(())
}

/// Writes `weights` to `out`: with `fp8`, the layer projections under its
/// options (FP8 ones as they are, others rounded to nearest; without, all
/// BF16 and `config.json` as it was); with `kv`, the KV cache scales.
fn write(
    src: &Path,
    weights: &ModelWeights,
    fp8: Option<Fp8Options>,
    kv: Option<&KvScales>,
    out: &Path,
) -> Result<(), LoadError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| LoadError::Io { path, source }
    };
    let loaded = load_config(src)?;
    let mut all: HashMap<String, Entry> = HashMap::new();
    let names: Vec<String> = tensor_specs(&loaded.config, weights.lm_head.is_some())
        .into_iter()
        .map(|s| s.name)
        .collect();
    let tensors: HashMap<&str, &Tensor> = (weights.tensors().into_iter())
        .map(|t| (t.name.as_str(), t))
        .collect();
    let projections: HashMap<&str, &Projection> = (weights.projections().into_iter())
        .map(|p| (p.name(), p))
        .collect();
    for name in &names {
        if let Some(t) = tensors.get(name.as_str()) {
            all.insert(name.clone(), bf16_entry(t));
            continue;
        }
        let Some(p) = projections.get(name.as_str()) else {
            return Err(LoadError::MissingTensor {
                path: src.to_path_buf(),
                tensor: name.clone(),
            });
        };
        // the one match of the writer on the stored formats
        match (fp8.filter(|_| is_projection(name)), p) {
            (Some(opts), Projection::Fp8(f)) => {
                check_given(src, f, opts)?;
                insert(&mut all, &f.name, &f.data, &f.scale, f.shape[1], opts);
            }
            (Some(opts), p) => quantize_into(&mut all, p.dense()?.as_ref(), opts),
            (None, p) => {
                all.insert(name.clone(), bf16_entry(p.dense()?.as_ref()));
            }
        }
    }
    if let Some(kv) = kv {
        insert_kv_scales(&mut all, kv, fp8.map(|o| o.layout));
    }
    // (nothing is written before every tensor passed its checks)
    save(&all, out)?;
    match fp8 {
        Some(opts) => write_config(src, out, opts, kv.is_some())?,
        None => {
            let cfg = src.join("config.json");
            std::fs::copy(&cfg, out.join("config.json")).map_err(io(&cfg))?;
        }
    }
    copy_other_files(src, out)
}

/// Writes `all` as `out`'s single safetensors file (`out` created).
pub(crate) fn save(all: &HashMap<String, Entry>, out: &Path) -> Result<(), LoadError> {
    std::fs::create_dir_all(out).map_err(|source| LoadError::Io {
        path: out.to_path_buf(),
        source,
    })?;
    let views: Vec<(String, TensorView<'_>)> = all
        .iter()
        .map(|(n, (d, s, b))| {
            let v = TensorView::new(*d, s.clone(), b).map_err(|e| LoadError::Safetensors {
                path: out.join(SINGLE_FILE),
                reason: format!("tensor `{n}`: {e}"),
            })?;
            Ok((n.clone(), v))
        })
        .collect::<Result<_, LoadError>>()?;
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize_to_file(views, Some(meta), &out.join(SINGLE_FILE)).map_err(|e| {
        LoadError::Safetensors {
            path: out.join(SINGLE_FILE),
            reason: e.to_string(),
        }
    })?;
    Ok(())
}

/// `config.json` of `src`, parsed.
pub(crate) fn read_config(src: &Path) -> Result<Value, LoadError> {
    let path = src.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|source| LoadError::Io {
        path: path.clone(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|e| LoadError::Quantization {
        path,
        field: "config.json".into(),
        reason: e.to_string(),
    })
}

/// `t` as a BF16 entry.
pub(crate) fn bf16_entry(t: &Tensor) -> Entry {
    let bytes = t
        .data
        .iter()
        .flat_map(|v| v.to_bits().to_le_bytes())
        .collect();
    (Dtype::BF16, t.shape.clone(), bytes)
}

/// Adds the KV cache scales of every layer to `all`: BF16 `[1]` as
/// llm-compressor writes them (a BF16 model too), an F32 scalar in the
/// `fp8` layout.
fn insert_kv_scales(all: &mut HashMap<String, Entry>, kv: &KvScales, layout: Option<Fp8Layout>) {
    for (l, (k, v)) in kv.k.iter().zip(&kv.v).enumerate() {
        for (name, s) in kv_scale_names(l).into_iter().zip([*k, *v]) {
            let entry = match layout {
                Some(Fp8Layout::Fp8) => (Dtype::F32, vec![], s.to_le_bytes().to_vec()),
                _ => (
                    Dtype::BF16,
                    vec![1],
                    half::bf16::from_f32(s).to_bits().to_le_bytes().to_vec(),
                ),
            };
            all.insert(name, entry);
        }
    }
}

/// The seven Linear layers of a decoder layer (the LM head stays BF16).
pub(crate) fn is_projection(name: &str) -> bool {
    name.starts_with("model.layers.") && (name.contains(".self_attn.") || name.contains(".mlp."))
}

/// Adds `t`'s FP8 weight and scales (rounded to nearest) to `all`.
fn quantize_into(all: &mut HashMap<String, Entry>, t: &Tensor, opts: Fp8Options) {
    let (n, k) = (t.shape[0], t.shape[1]);
    let w = t.to_f32();
    // per tensor: the whole matrix as one row
    let (q, scales) = if opts.channel {
        ops::fp8::quantize_rows(&w, n, k)
    } else {
        ops::fp8::quantize_rows(&w, 1, n * k)
    };
    insert(all, &t.name, &q, &scales, k, opts);
}

/// Adds FP8 weight `name` (bits `q` `[n, k]`) and its scales (`[n]`, or
/// one for the whole tensor) to `all` under `opts`.
fn insert(
    all: &mut HashMap<String, Entry>,
    name: &str,
    q: &[u8],
    scales: &[f32],
    k: usize,
    opts: Fp8Options,
) {
    let n = q.len() / k.max(1);
    let prefix = name.strip_suffix(".weight").unwrap_or(name);
    all.insert(name.to_string(), (Dtype::F8_E4M3, vec![n, k], q.to_vec()));
    let scale = |v: &[f32], shape: Vec<usize>| -> Entry {
        match opts.layout {
            // llm-compressor keeps scales in the model's dtype
            Fp8Layout::CompressedTensors => (
                Dtype::BF16,
                shape,
                v.iter()
                    .flat_map(|x| half::bf16::from_f32(*x).to_bits().to_le_bytes())
                    .collect(),
            ),
            // AutoFP8: f32 scalars
            Fp8Layout::Fp8 => (Dtype::F32, vec![], v[0].to_le_bytes().to_vec()),
        }
    };
    let (shape, scales) = if opts.channel {
        (vec![n, 1], scales)
    } else {
        (vec![1], &scales[..1])
    };
    all.insert(format!("{prefix}.weight_scale"), scale(scales, shape));
    if let Some(s) = opts.input_scale {
        all.insert(format!("{prefix}.input_scale"), scale(&[s], vec![1]));
    }
}

/// `config.json` of `src` with the layout's `quantization_config` (with
/// static FP8 KV cache scales when `kv`).
fn write_config(src: &Path, out: &Path, opts: Fp8Options, kv: bool) -> Result<(), LoadError> {
    let path = src.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|source| LoadError::Io {
        path: path.clone(),
        source,
    })?;
    let mut cfg: Value = serde_json::from_str(&text).map_err(|e| LoadError::Quantization {
        path: path.clone(),
        field: "config.json".into(),
        reason: e.to_string(),
    })?;
    cfg["quantization_config"] = quantization_config(opts);
    if kv && opts.layout == Fp8Layout::CompressedTensors {
        // llm-compressor's static per-tensor FP8 KV cache scheme
        cfg["quantization_config"]["kv_cache_scheme"] = json!({
            "num_bits": 8,
            "type": "float",
            "symmetric": true,
            "strategy": "tensor",
            "dynamic": false,
            "group_size": null,
            "block_structure": null,
            "actorder": null,
            "observer": "minmax",
            "observer_kwargs": {}
        });
    }
    let dst = out.join("config.json");
    let text = serde_json::to_string_pretty(&cfg).unwrap_or_default();
    std::fs::write(&dst, text + "\n").map_err(|source| LoadError::Io { path: dst, source })
}

/// The `quantization_config` the layout's tools write.
fn quantization_config(opts: Fp8Options) -> Value {
    let dynamic = opts.input_scale.is_none();
    match opts.layout {
        Fp8Layout::CompressedTensors => {
            let args = |strategy: &str, dynamic: bool, observer: Value| {
                json!({
                    "actorder": null, "block_structure": null, "dynamic": dynamic,
                    "group_size": null, "num_bits": 8, "observer": observer,
                    "observer_kwargs": {}, "strategy": strategy, "symmetric": true,
                    "type": "float"
                })
            };
            let weights = args(
                if opts.channel { "channel" } else { "tensor" },
                false,
                json!("minmax"),
            );
            let inputs = if dynamic {
                args("token", true, Value::Null)
            } else {
                args("tensor", false, json!("minmax"))
            };
            json!({
                "config_groups": {"group_0": {
                    "input_activations": inputs,
                    "output_activations": null,
                    "targets": ["Linear"],
                    "weights": weights
                }},
                "format": "float-quantized",
                "global_compression_ratio": null,
                "ignore": ["lm_head"],
                "kv_cache_scheme": null,
                "quant_method": "compressed-tensors",
                "quantization_status": "compressed"
            })
        }
        Fp8Layout::Fp8 => json!({
            "activation_scheme": if dynamic { "dynamic" } else { "static" },
            "ignored_layers": ["lm_head"],
            "quant_method": "fp8"
        }),
    }
}

/// Copies every file of `src` but the weights and `config.json`.
pub(crate) fn copy_other_files(src: &Path, out: &Path) -> Result<(), LoadError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| LoadError::Io { path, source }
    };
    for entry in std::fs::read_dir(src).map_err(io(src))? {
        let entry = entry.map_err(io(src))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        // the store's record of a GGUF source (`lamina.json`) and the
        // GGUF itself describe BF16 weights the checkpoint does not hold
        let skip = name == "config.json"
            || name == INDEX_FILE
            || name == "lamina.json"
            || name.ends_with(".gguf")
            || (name.starts_with("model") && name.ends_with(".safetensors"));
        if !skip && entry.path().is_file() {
            std::fs::copy(entry.path(), out.join(&*name)).map_err(io(&entry.path()))?;
        }
    }
    Ok(())
}
