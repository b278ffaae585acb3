//! FP8 (e4m3) projection weights: the layouts of pre-quantised Hugging Face
//! checkpoints, and quantisation of BF16 weights at load.
//!
//! Contract: a model directory whose `config.json` has a
//! `quantization_config` is FP8 when it is one of the two layouts on the hub
//! today, and refused otherwise with an error naming the field:
//! - `quant_method: "compressed-tensors"` with `format: "float-quantized"`
//!   and a config group whose `weights` are `type: "float"`, `num_bits: 8`,
//!   `strategy: "channel"` (`weight_scale` `[out, 1]`) or `"tensor"`
//!   (`[1]` or a scalar); its `input_activations` may be dynamic (per
//!   token) or static (an `input_scale` per projection);
//! - `quant_method: "fp8"` (AutoFP8 / vLLM's layout): `weight_scale` a
//!   scalar per projection, `activation_scheme` `"dynamic"` or `"static"`
//!   (with `input_scale`); block-wise scales (`weight_block_size`) are
//!   refused.
//!
//! Every projection stored as `F8_E4M3` must come with a finite, positive
//! `weight_scale` of a shape its strategy allows (the error names the
//! tensor); a static `input_scale` is checked alike and kept. Projections a
//! checkpoint leaves in BF16 (its `ignore` list) are quantised at load, so
//! an FP8 model is FP8 in all seven projections of every layer; the
//! embedding, norms and LM head stay BF16. Scales are held per output row
//! (`[out]`; a per-tensor scale is repeated).
//!
//! Each projection is held once, as [`Projection::Fp8`]; a consumer that
//! runs BF16 (the CPU backend) widens it to `bf16(decode(q) * scale)`
//! ([`Projection::dense`]): one FP8 folder works on every backend.
//!
//! A checkpoint may also carry the FP8 KV cache's scales, one per layer
//! for K and V (`model.layers.N.self_attn.k_scale` / `v_scale`, described
//! by compressed-tensors' `kv_cache_scheme`, which must then be 8-bit
//! float): read into [`ModelWeights::kv_scales`], all layers or none.
//!
//! Costs: a pre-quantised projection is copied once (one byte per weight);
//! quantising at load is two passes over the BF16 weights
//! (`ops::fp8::quantize_rows`), whose buffers are then dropped.

pub(crate) mod convert;

pub use convert::{
    Fp8Layout, Fp8Options, WeightsOut, write_checkpoint, write_fp8_checkpoint,
    write_quantized_checkpoint,
};

use half::bf16;
use rayon::prelude::*;
use safetensors::Dtype;
use safetensors::tensor::TensorView;
use serde_json::Value;
use std::path::Path;

use contract::KvScales;

use crate::int4::{Int4Scheme, int4_scheme};
use crate::loader::LoadError;
use crate::projection::Projection;
use crate::weights::{ModelWeights, Tensor};

/// One projection in FP8: `data` `[n, k]` e4m3 bits, `scale` `[n]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Fp8Tensor {
    pub name: String,
    pub shape: Vec<usize>, // [n, k]
    pub data: Vec<u8>,     // [n, k]
    pub scale: Vec<f32>,   // [n]
    /// The checkpoint's static activation scale, when it has one.
    pub input_scale: Option<f32>,
}

impl Fp8Tensor {
    /// Quantises `t` (`[n, k]`) per output row.
    pub fn quantize(t: &Tensor) -> Fp8Tensor {
        let (n, k) = (t.shape[0], t.shape[1]);
        let (data, scale) = ops::fp8::quantize_rows(&t.to_f32(), n, k);
        Fp8Tensor {
            name: t.name.clone(),
            shape: t.shape.clone(),
            data,
            scale,
            input_scale: None,
        }
    }

    /// The dequantised values as BF16.
    pub fn dequantize(&self) -> Tensor {
        let k = self.shape[1];
        let data = ops::fp8::dequantize_rows(&self.data, &self.scale, k)
            .into_par_iter()
            .map(bf16::from_f32)
            .collect();
        Tensor {
            name: self.name.clone(),
            shape: self.shape.clone(),
            data,
        }
    }
}

impl ModelWeights {
    /// Whether any layer projection is FP8.
    pub fn is_fp8(&self) -> bool {
        (self.layers.iter())
            .flat_map(|l| l.projections())
            .any(|p| matches!(p, Projection::Fp8(_)))
    }

    /// Quantises every BF16 projection of the layers to FP8 per output row
    /// (`--dtype fp8`); projections in another format are left as they are.
    pub fn quantize_fp8(&mut self) {
        for l in &mut self.layers {
            for p in l.projections_mut() {
                if let Projection::Bf16(t) = p {
                    *p = Projection::Fp8(Fp8Tensor::quantize(t));
                }
            }
        }
    }

    /// Quantises the LM head to FP8 per vocabulary row, as
    /// [`ModelWeights::quantize_fp8`] does the projections; a head tied to
    /// the embedding gets its own FP8 copy (the embedding stays exact).
    /// Needs FP8 projections (`None` returned when the model has none); a
    /// head already in FP8 is left as it is. A head in ggml blocks is
    /// quantised from its values.
    pub fn quantize_lm_head_fp8(&mut self) -> Option<()> {
        if !self.is_fp8() {
            return None;
        }
        if !matches!(self.lm_head, Some(Projection::Fp8(_))) {
            let mut f = Fp8Tensor::quantize(self.head_dense().ok()?.as_ref());
            f.name = "lm_head.weight".into();
            self.lm_head = Some(Projection::Fp8(f));
        }
        Some(())
    }

    /// Widens every FP8 projection (the LM head too) to its BF16 values
    /// ([`Projection::dense`]), for a model asked to run in BF16.
    pub fn widen_fp8(&mut self) {
        for p in self.projections_mut() {
            if let Projection::Fp8(f) = p {
                *p = Projection::Bf16(f.dequantize());
            }
        }
    }
}

/// What a checkpoint's `quantization_config` says about its projections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scheme {
    pub layout: Fp8Layout,
    /// `weight_scale` per output channel (else per tensor).
    pub channel: bool,
    /// A static `input_scale` per projection (else dynamic activations).
    pub static_input: bool,
}

/// What a checkpoint's `quantization_config` describes: FP8 projections
/// (this module) or group-wise 4-bit ones ([`crate::int4`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantScheme {
    Fp8(Scheme),
    Int4(Int4Scheme),
}

/// Reads `quantization_config` from `config.json` of `dir`: `None` when
/// absent (a BF16 / F16 / F32 checkpoint, or no `config.json`: a config
/// given another way), the FP8 or 4-bit scheme, or an error
/// naming the field that is not one lamina runs.
pub fn scheme_of(dir: &Path) -> Result<Option<QuantScheme>, LoadError> {
    let path = dir.join("config.json");
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        // weights loaded against a config given another way
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(LoadError::Io { path, source }),
    };
    let v: Value = serde_json::from_str(&text).map_err(|e| LoadError::Quantization {
        path: path.clone(),
        field: "quantization_config".into(),
        reason: e.to_string(),
    })?;
    let parsed = match v.get("quantization_config") {
        None | Some(Value::Null) => return Ok(None),
        Some(q) => match int4_scheme(q) {
            Some(int4) => int4.map(QuantScheme::Int4),
            None => parse_scheme(q).map(QuantScheme::Fp8),
        },
    };
    parsed
        .map(Some)
        .map_err(|(field, reason)| LoadError::Quantization {
            path,
            field: format!("quantization_config.{field}"),
            reason,
        })
}

/// A refusal: the field (below `quantization_config`) and why.
pub(crate) type Refusal = (String, String);

fn parse_scheme(q: &Value) -> Result<Scheme, Refusal> {
    let method = q.get("quant_method").and_then(Value::as_str);
    match method {
        Some("compressed-tensors") => compressed_tensors(q),
        Some("fp8") => auto_fp8(q),
        Some(other) => Err((
            "quant_method".into(),
            format!(
                "`{other}` is not supported; lamina loads FP8 checkpoints (`compressed-tensors` \
                 float-quantized or `fp8`), 4-bit ones (`awq`, `gptq`, `compressed-tensors` \
                 pack-quantized) and BF16 / F16 / F32 ones"
            ),
        )),
        None => Err(("quant_method".into(), "missing or not a string".into())),
    }
}

/// The one scheme of a compressed-tensors `quantization_config`: its
/// config group, the group's `weights` and the path of a field below the
/// group (`config_groups.NAME.FIELD`) for refusals.
pub(crate) struct OneGroup<'a> {
    pub group: &'a Value,
    pub weights: &'a Value,
    pub at: Box<dyn Fn(&str) -> String + 'a>,
}

/// The single group of `q`'s `config_groups` (every Linear layer in one
/// scheme, as lamina runs them), refused otherwise or without `weights`.
pub(crate) fn one_config_group(q: &Value) -> Result<OneGroup<'_>, Refusal> {
    let (name, group) = (q.get("config_groups").and_then(Value::as_object))
        .filter(|g| g.len() == 1)
        .and_then(|g| g.iter().next())
        .ok_or_else(|| {
            (
                "config_groups".to_string(),
                "must hold exactly one group (one scheme for every Linear layer)".to_string(),
            )
        })?;
    let at = move |f: &str| format!("config_groups.{name}.{f}");
    let weights = (group.get("weights")).ok_or_else(|| (at("weights"), "missing".to_string()))?;
    Ok(OneGroup {
        group,
        weights,
        at: Box::new(at),
    })
}

pub(crate) fn want(
    v: &Value,
    field: &str,
    ok: impl Fn(&Value) -> bool,
    allowed: &str,
) -> Result<(), Refusal> {
    let got = v.get(field).unwrap_or(&Value::Null);
    if ok(got) {
        Ok(())
    } else {
        Err((field.into(), format!("is {got}; lamina runs {allowed}")))
    }
}

fn compressed_tensors(q: &Value) -> Result<Scheme, Refusal> {
    want(
        q,
        "format",
        |f| f == "float-quantized",
        "\"float-quantized\" (FP8)",
    )?;
    let OneGroup {
        group,
        weights: w,
        at,
    } = one_config_group(q)?;
    let sub = |r: Refusal| (at(&format!("weights.{}", r.0)), r.1);
    want(w, "type", |t| t == "float", "\"float\" (FP8)").map_err(sub)?;
    want(w, "num_bits", |b| b == 8, "8").map_err(sub)?;
    let strategy = w.get("strategy").and_then(Value::as_str).unwrap_or("");
    let channel = match strategy {
        "channel" => true,
        "tensor" => false,
        other => {
            return Err((
                at("weights.strategy"),
                format!("is \"{other}\"; lamina runs \"channel\" or \"tensor\" FP8 scales"),
            ));
        }
    };
    let static_input = match group.get("input_activations") {
        None | Some(Value::Null) => false,
        Some(a) => {
            let sub = |r: Refusal| (at(&format!("input_activations.{}", r.0)), r.1);
            want(a, "type", |t| t == "float", "\"float\" (FP8)").map_err(sub)?;
            want(a, "num_bits", |b| b == 8, "8").map_err(sub)?;
            !a.get("dynamic").and_then(Value::as_bool).unwrap_or(false)
        }
    };
    if let Some(kv) = q.get("kv_cache_scheme").filter(|k| !k.is_null()) {
        let sub = |r: Refusal| (format!("kv_cache_scheme.{}", r.0), r.1);
        want(kv, "type", |t| t == "float", "\"float\" (FP8)").map_err(sub)?;
        want(kv, "num_bits", |b| b == 8, "8").map_err(sub)?;
    }
    Ok(Scheme {
        layout: Fp8Layout::CompressedTensors,
        channel,
        static_input,
    })
}

fn auto_fp8(q: &Value) -> Result<Scheme, Refusal> {
    if q.get("weight_block_size").is_some_and(|b| !b.is_null()) {
        return Err((
            "weight_block_size".into(),
            "block-wise FP8 scales are not supported; lamina runs per-tensor or per-channel scales"
                .into(),
        ));
    }
    if let Some(fmt) = q.get("fmt").and_then(Value::as_str)
        && fmt != "e4m3"
    {
        return Err(("fmt".into(), format!("is \"{fmt}\"; lamina runs \"e4m3\"")));
    }
    let static_input = match q.get("activation_scheme").and_then(Value::as_str) {
        Some("static") => true,
        Some("dynamic") | None => false,
        Some(other) => {
            return Err((
                "activation_scheme".into(),
                format!("is \"{other}\"; lamina runs \"dynamic\" or \"static\""),
            ));
        }
    };
    Ok(Scheme {
        layout: Fp8Layout::Fp8,
        channel: false,
        static_input,
    })
}

/// Reads projection `name` (`[n, k]`, `view` stored as `F8_E4M3`) with its
/// scales under `scheme`; `scale_of` finds a sibling tensor by name.
pub(crate) fn read_projection<'a>(
    path: &Path,
    name: &str,
    view: &TensorView<'a>,
    scheme: Scheme,
    scale_of: impl Fn(&str) -> Option<TensorView<'a>>,
) -> Result<Fp8Tensor, LoadError> {
    let (n, k) = (view.shape()[0], view.shape()[1]);
    let prefix = name.strip_suffix(".weight").unwrap_or(name);
    let bad = |field: &str, reason: String| LoadError::Scale {
        path: path.to_path_buf(),
        tensor: format!("{prefix}.{field}"),
        reason,
    };
    let ws = scale_of(&format!("{prefix}.weight_scale")).ok_or_else(|| {
        bad(
            "weight_scale",
            "missing: every FP8 weight needs its scale".into(),
        )
    })?;
    let scale = scale_values(&ws).map_err(|r| bad("weight_scale", r))?;
    let dims = ws.shape();
    let per_tensor = dims.iter().product::<usize>() == 1;
    let per_row = scheme.channel && (dims == [n, 1] || dims == [n]);
    let scale = if per_tensor {
        vec![scale[0]; n]
    } else if per_row {
        scale
    } else {
        let want = if scheme.channel {
            format!("[{n}, 1]")
        } else {
            "[1] or a scalar".into()
        };
        return Err(bad(
            "weight_scale",
            format!("has shape {dims:?}; this layout needs {want}"),
        ));
    };
    let input_scale = match scale_of(&format!("{prefix}.input_scale")) {
        Some(is) => {
            let v = scale_values(&is).map_err(|r| bad("input_scale", r))?;
            if v.len() != 1 {
                return Err(bad(
                    "input_scale",
                    format!("has {} values, expected one", v.len()),
                ));
            }
            Some(v[0])
        }
        None if scheme.static_input => {
            return Err(bad(
                "input_scale",
                "missing: the checkpoint's activations are static".into(),
            ));
        }
        None => None,
    };
    Ok(Fp8Tensor {
        name: name.to_string(),
        shape: vec![n, k],
        data: view.data().to_vec(),
        scale,
        input_scale,
    })
}

/// The names of layer `layer`'s FP8 KV cache scales (K, V).
pub fn kv_scale_names(layer: usize) -> [String; 2] {
    [
        format!("model.layers.{layer}.self_attn.k_scale"),
        format!("model.layers.{layer}.self_attn.v_scale"),
    ]
}

/// The FP8 KV cache's per-layer scales of a checkpoint
/// ([`kv_scale_names`]: one value each, compressed-tensors'
/// `kv_cache_scheme` layout): `None` when no layer has them; an error
/// naming the tensor when a layer lacks one while others have theirs, or
/// when one is not a single finite positive value. `find` returns a
/// tensor with the file that holds it.
pub(crate) fn read_kv_scales<'a>(
    dir: &Path,
    layers: usize,
    find: impl Fn(&str) -> Option<(&'a Path, TensorView<'a>)>,
) -> Result<Option<KvScales>, LoadError> {
    let names: Vec<[String; 2]> = (0..layers).map(kv_scale_names).collect();
    if !names.iter().flatten().any(|n| find(n).is_some()) {
        return Ok(None);
    }
    let mut scales = KvScales::ones(layers);
    for (l, pair) in names.iter().enumerate() {
        for (name, slot) in pair.iter().zip([&mut scales.k[l], &mut scales.v[l]]) {
            let bad = |path: &Path, reason: String| LoadError::Scale {
                path: path.to_path_buf(),
                tensor: name.clone(),
                reason,
            };
            let Some((path, view)) = find(name) else {
                return Err(bad(
                    dir,
                    "missing: the checkpoint has FP8 KV cache scales for other layers".into(),
                ));
            };
            let v = scale_values(&view).map_err(|r| bad(path, r))?;
            if v.len() != 1 {
                return Err(bad(path, format!("has {} values, expected one", v.len())));
            }
            *slot = v[0];
        }
    }
    Ok(Some(scales))
}

/// A scale tensor's values as f32: F32, BF16 or F16, every value finite
/// and positive.
fn scale_values(t: &TensorView<'_>) -> Result<Vec<f32>, String> {
    let b = t.data();
    let v: Vec<f32> = match t.dtype() {
        Dtype::F32 => b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        Dtype::BF16 => b
            .chunks_exact(2)
            .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
            .collect(),
        Dtype::F16 => b
            .chunks_exact(2)
            .map(|c| half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
            .collect(),
        other => return Err(format!("has dtype {other:?}, expected F32, BF16 or F16")),
    };
    if v.is_empty() {
        return Err("is empty".into());
    }
    if let Some((i, x)) = v
        .iter()
        .enumerate()
        .find(|(_, x)| !(x.is_finite() && **x > 0.0))
    {
        return Err(format!(
            "holds {x} at index {i}; scales must be finite and positive"
        ));
    }
    Ok(v)
}

#[cfg(test)]
mod tests;
