//! Writing a model as a 4-bit checkpoint in GPTQ's layout (`lamina
//! quantize --format int4`).
//!
//! Why GPTQ's layout (`quant_method: "gptq"`, `bits: 4`, `sym: true`,
//! `checkpoint_format: "gptq"`) rather than
//! compressed-tensors `pack-quantized`: its grid is the one the GPTQ solver
//! rounds to (`(q - 8) * s`, an f16 scale per group of a row), the layout
//! needs nothing but the four tensors per projection, and it is the one
//! read by the most runtimes as it is (transformers through
//! gptqmodel/optimum, vLLM's `gptq` and `gptq_marlin`, SGLang, TGI).
//!
//! Contract: [`write_int4_checkpoint`] writes the model of `src`
//! (`weights`, as loaded from it and perhaps quantised since) to `out`:
//! every layer projection as `qweight` I32 `[in / 8, out]`, `qzeros` I32
//! `[in / g, out / 8]` (every stored zero 7: the zero 8 minus 1, v1),
//! `scales` F16 `[in / g, out]` and `g_idx` I32 `[in]` (each input
//! column's group: `i / g`, or for a tensor with a column order, GPTQ's
//! `act_order`, the group of its stored column), in the packing
//! [`super::read`] documents, `desc_act` true when some tensor has a
//! column order; everything else as it was (BF16; the LM head stays
//! BF16), `quantization_config` added to `config.json`, the other files
//! copied. A projection held in BF16 is rounded to nearest
//! ([`Int4Tensor::round_to_nearest`]); one held in 4 bits already (the
//! GPTQ solver's) is written as it is, after checking that it has the
//! layout's group, symmetric zeros and f16 scales (refused naming the
//! tensor otherwise). A group that does not divide a projection's input
//! width is refused naming it.
//!
//! Costs: the projections' codes once in memory beside the model.

use std::collections::HashMap;
use std::path::Path;

use half::f16;
use safetensors::Dtype;
use serde_json::json;

use super::{BLOCK, Int4Tensor, SYM_ZERO};
use crate::fp8::convert::{Entry, bf16_entry, copy_other_files, is_projection, read_config, save};
use crate::loader::{LoadError, load_config, tensor_specs};
use crate::projection::Projection;
use crate::weights::{ModelWeights, Tensor};

/// Codes per packed I32 word.
const PER_WORD: usize = 8;

/// Writes `weights` (the model of `src`) to `out` in GPTQ's 4-bit layout,
/// `group` input columns a scale (see the module doc).
pub fn write_int4_checkpoint(
    src: &Path,
    weights: &ModelWeights,
    out: &Path,
    group: usize,
) -> Result<(), LoadError> {
    let loaded = load_config(src)?;
    let names = tensor_specs(&loaded.config, weights.lm_head.is_some());
    let tensors: HashMap<&str, &Tensor> = (weights.tensors().into_iter())
        .map(|t| (t.name.as_str(), t))
        .collect();
    let projections: HashMap<&str, &Projection> = (weights.projections().into_iter())
        .map(|p| (p.name(), p))
        .collect();
    let mut all: HashMap<String, Entry> = HashMap::new();
    let mut desc_act = false;
    for spec in &names {
        let name = spec.name.as_str();
        if let Some(t) = tensors.get(name) {
            all.insert(name.to_string(), bf16_entry(t));
            continue;
        }
        let Some(p) = projections.get(name) else {
            return Err(LoadError::MissingTensor {
                path: src.to_path_buf(),
                tensor: name.to_string(),
            });
        };
        if !is_projection(name) {
            all.insert(name.to_string(), bf16_entry(p.dense()?.as_ref()));
            continue;
        }
        // the one match of the writer on the stored formats
        let t = match p {
            Projection::Int4(t) => t.clone(),
            other => {
                let dense = other.dense()?;
                check_group(src, &dense.name, dense.shape[1], group)?;
                Int4Tensor::round_to_nearest(dense.as_ref(), group, true)
            }
        };
        check_given(src, &t, group)?;
        desc_act |= t.perm.is_some();
        insert(&mut all, &t);
    }
    save(&all, out)?;
    let mut cfg = read_config(src)?;
    cfg["quantization_config"] = json!({
        "bits": 4,
        "group_size": group,
        "desc_act": desc_act,
        "sym": true,
        "static_groups": false,
        "true_sequential": true,
        "lm_head": false,
        "checkpoint_format": "gptq",
        "quant_method": "gptq"
    });
    let dst = out.join("config.json");
    let text = serde_json::to_string_pretty(&cfg).unwrap_or_default();
    std::fs::write(&dst, text + "\n").map_err(|source| LoadError::Io { path: dst, source })?;
    copy_other_files(src, out)
}

/// `group` fits a projection `name` of `k` input columns.
fn check_group(src: &Path, name: &str, k: usize, group: usize) -> Result<(), LoadError> {
    if group == 0 || !group.is_multiple_of(BLOCK) || !k.is_multiple_of(group) {
        return Err(LoadError::Quantized {
            path: src.to_path_buf(),
            tensor: name.to_string(),
            reason: format!(
                "has {k} input columns, not whole groups of {group} (a group is a multiple of \
                 {BLOCK} that divides every projection's input width)"
            ),
        });
    }
    Ok(())
}

/// `t` fits the layout: `group`, symmetric, f16 scales.
fn check_given(src: &Path, t: &Int4Tensor, group: usize) -> Result<(), LoadError> {
    let bad = |reason: String| LoadError::Quantized {
        path: src.to_path_buf(),
        tensor: t.name.clone(),
        reason,
    };
    if let Some(why) = t.layout_error() {
        return Err(bad(why));
    }
    if t.group != group || !t.rows.is_multiple_of(PER_WORD) {
        return Err(bad(format!(
            "is [{}, {}] in groups of {}; the checkpoint has groups of {group} and whole words of \
             {PER_WORD} rows",
            t.rows, t.cols, t.group
        )));
    }
    if t.zero.iter().any(|&z| z != SYM_ZERO) {
        return Err(bad("has asymmetric zeros; the layout is symmetric".into()));
    }
    if let Some(s) = t.scale.iter().find(|&&s| f16::from_f32(s).to_f32() != s) {
        return Err(bad(format!(
            "has scale {s}, which F16 does not hold exactly"
        )));
    }
    Ok(())
}

/// Adds `t`'s four GPTQ tensors to `all`.
fn insert(all: &mut HashMap<String, Entry>, t: &Int4Tensor) {
    let (n, k, g) = (t.rows, t.cols, t.group);
    let groups = k / g;
    let prefix = t.name.strip_suffix(".weight").unwrap_or(&t.name);
    let words = |v: Vec<u32>| -> Vec<u8> { v.into_iter().flat_map(u32::to_le_bytes).collect() };
    // [k] the stored column of each input column
    let mut stored: Vec<usize> = (0..k).collect();
    if let Some(p) = &t.perm {
        p.iter()
            .enumerate()
            .for_each(|(c, &i)| stored[i as usize] = c);
    }
    // [k / 8, n]: nibble i of word [j, o] is input row 8j + i
    let qweight = (0..k / PER_WORD)
        .flat_map(|j| (0..n).map(move |o| (j, o)))
        .map(|(j, o)| {
            (0..PER_WORD).fold(0u32, |w, i| {
                w | u32::from(t.code(o, stored[j * PER_WORD + i])) << (4 * i)
            })
        })
        .collect();
    // [k / g, n / 8]: nibble i of word [gi, j] is output column 8j + i
    let qzeros = (0..groups)
        .flat_map(|gi| (0..n / PER_WORD).map(move |j| (gi, j)))
        .map(|(gi, j)| {
            (0..PER_WORD).fold(0u32, |w, i| {
                w | u32::from(t.zero[(j * PER_WORD + i) * groups + gi] - 1) << (4 * i)
            })
        })
        .collect();
    // [k / g, n]
    let scales = (0..groups)
        .flat_map(|gi| (0..n).map(move |o| t.scale[o * groups + gi]))
        .flat_map(|s| f16::from_f32(s).to_bits().to_le_bytes())
        .collect();
    let g_idx = stored.iter().map(|&c| (c / g) as u32).collect();
    all.insert(
        format!("{prefix}.qweight"),
        (Dtype::I32, vec![k / PER_WORD, n], words(qweight)),
    );
    all.insert(
        format!("{prefix}.qzeros"),
        (Dtype::I32, vec![groups, n / PER_WORD], words(qzeros)),
    );
    all.insert(
        format!("{prefix}.scales"),
        (Dtype::F16, vec![groups, n], scales),
    );
    all.insert(
        format!("{prefix}.g_idx"),
        (Dtype::I32, vec![k], words(g_idx)),
    );
}
