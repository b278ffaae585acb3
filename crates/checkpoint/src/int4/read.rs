//! The hub's three 4-bit layouts read into [`Int4Tensor`]s.
//!
//! Contract: [`int4_scheme`] recognises a `quantization_config` that is
//! one of (anything else is refused naming the field and its value):
//! - AWQ (AutoAWQ's GEMM kernel): `quant_method: "awq"`, `bits: 4`,
//!   `version: "gemm"`, `zero_point: true`, `group_size`. Per projection
//!   `qweight` I32 `[in, out / 8]`, `qzeros` I32 `[in / g, out / 8]`, both
//!   with nibble `i` of a word holding output column `8j + AWQ_ORDER[i]`
//!   (AutoAWQ's interleave 0, 2, 4, 6, 1, 3, 5, 7), `scales` `[in / g,
//!   out]`; `w = (q - z) * s`.
//! - GPTQ: `quant_method: "gptq"`, `bits: 4`, `sym`, `group_size` (-1: one
//!   group a row), `desc_act`, `checkpoint_format` `"gptq"` (v1: a stored
//!   zero is the zero minus 1) or `"gptq_v2"`. `qweight` I32 `[in / 8,
//!   out]` (nibble `i` of word `[j, o]` is input row `8j + i`), `qzeros`
//!   I32 `[in / g, out / 8]` (nibble `i`: output column `8j + i`), `scales`
//!   `[in / g, out]`, `g_idx` I32 `[in]` (each input column's group, read
//!   with `desc_act`; without it the groups are `i / g`, as vLLM reads
//!   them). A symmetric checkpoint's zeros must all be 8.
//! - compressed-tensors `pack-quantized`: one config group whose `weights`
//!   are `type: "int"`, `num_bits: 4`, `strategy` `"group"` (`group_size`)
//!   or `"channel"`, no `input_activations`. `weight_packed` I32 `[out, in
//!   / 8]` (nibble `i` of word `[o, j]` is input column `8j + i`, the signed
//!   code plus 8), `weight_scale` `[out, in / g]`, `weight_shape` `[2]`;
//!   asymmetric: `weight_zero_point` I32 `[ceil(out / 8), in / g]` packed
//!   along the output rows (plus 8 likewise); an optional `weight_g_idx`
//!   as GPTQ's `g_idx`.
//!
//! Scales may be F16, BF16 or F32 and must be finite; codes I32 of the
//! exact shape; a group must divide `in` in whole blocks of
//! [`super::BLOCK`]; zeros must lie in `0..=15`; `g_idx` must give every
//! group exactly `g` columns. A projection whose packed tensor is absent
//! is not quantised (the `ignore` list, `modules_to_not_convert`): the
//! caller reads its BF16 `weight`.
//!
//! Costs: one pass over each projection's packed words (rows on rayon),
//! its codes held once in the stored form.

use std::path::{Path, PathBuf};

use half::{bf16, f16};
use rayon::prelude::*;
use safetensors::Dtype;
use safetensors::tensor::TensorView;
use serde_json::Value;

use super::{BLOCK, Int4Tensor, MAX_CODE, SYM_ZERO, pack_row};
use crate::fp8::{OneGroup, Refusal, one_config_group, want};
use crate::loader::LoadError;

/// AWQ's interleave: nibble `i` of a packed word holds column `8j + AWQ_ORDER[i]`.
const AWQ_ORDER: [usize; 8] = [0, 2, 4, 6, 1, 3, 5, 7];
/// Codes per packed I32 word.
const PER_WORD: usize = 8;

/// Which hub layout a 4-bit checkpoint has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Int4Layout {
    Awq,
    Gptq {
        /// `checkpoint_format: "gptq"`: stored zeros are the zeros minus 1.
        v1: bool,
        /// `desc_act`: columns grouped by `g_idx`.
        desc_act: bool,
    },
    CompressedTensors,
}

/// A 4-bit checkpoint's `quantization_config` (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Int4Scheme {
    pub layout: Int4Layout,
    /// Input columns per group; `None`: a whole row.
    pub group: Option<usize>,
    /// Symmetric codes (zero 8).
    pub sym: bool,
}

/// The 4-bit scheme of `q` (a `quantization_config`), `None` when `q` is
/// no 4-bit layout's (another quantisation, for the FP8 reader).
pub fn int4_scheme(q: &Value) -> Option<Result<Int4Scheme, Refusal>> {
    match q.get("quant_method").and_then(Value::as_str) {
        Some("awq") => Some(awq(q)),
        Some("gptq") => Some(gptq(q)),
        Some("compressed-tensors") if is_pack_quantized(q) => Some(pack_quantized(q)),
        _ => None,
    }
}

fn group_of(v: &Value, field: &str) -> Result<Option<usize>, Refusal> {
    match v.get(field).and_then(Value::as_i64) {
        Some(-1) => Ok(None),
        Some(g) if g > 0 => Ok(Some(g as usize)),
        _ => Err((
            field.into(),
            format!(
                "is {}; lamina runs a positive group size or -1",
                v.get(field).unwrap_or(&Value::Null)
            ),
        )),
    }
}

fn awq(q: &Value) -> Result<Int4Scheme, Refusal> {
    want(q, "bits", |b| b == 4, "4")?;
    let gemm = |v: &Value| v.as_str().is_some_and(|s| s.eq_ignore_ascii_case("gemm"));
    want(q, "version", gemm, "\"gemm\" (AutoAWQ's GEMM packing)")?;
    want(q, "zero_point", |z| z == true, "true")?;
    Ok(Int4Scheme {
        layout: Int4Layout::Awq,
        group: group_of(q, "group_size")?,
        sym: false,
    })
}

fn gptq(q: &Value) -> Result<Int4Scheme, Refusal> {
    want(q, "bits", |b| b == 4, "4")?;
    let flag = |f: &str, default: bool| match q.get(f) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err((f.to_string(), format!("is {other}; expected true or false"))),
    };
    let v1 = match q.get("checkpoint_format").and_then(Value::as_str) {
        None | Some("gptq") => true,
        Some("gptq_v2") => false,
        Some(other) => {
            return Err((
                "checkpoint_format".into(),
                format!("is \"{other}\"; lamina runs \"gptq\" or \"gptq_v2\""),
            ));
        }
    };
    Ok(Int4Scheme {
        layout: Int4Layout::Gptq {
            v1,
            desc_act: flag("desc_act", false)?,
        },
        group: group_of(q, "group_size")?,
        sym: flag("sym", true)?,
    })
}

fn is_pack_quantized(q: &Value) -> bool {
    let pack = |v: &Value| v.get("format").is_some_and(|f| f == "pack-quantized");
    pack(q)
        || (q.get("config_groups").and_then(Value::as_object)).is_some_and(|g| g.values().any(pack))
}

fn pack_quantized(q: &Value) -> Result<Int4Scheme, Refusal> {
    let OneGroup {
        group,
        weights: w,
        at,
    } = one_config_group(q)?;
    if group.get("input_activations").is_some_and(|a| !a.is_null()) {
        return Err((
            at("input_activations"),
            "quantises activations; lamina runs 4-bit weights with 16-bit activations (W4A16)"
                .into(),
        ));
    }
    let sub = |r: Refusal| (at(&format!("weights.{}", r.0)), r.1);
    want(w, "type", |t| t == "int", "\"int\"").map_err(sub)?;
    want(w, "num_bits", |b| b == 4, "4").map_err(sub)?;
    let sym = w.get("symmetric").and_then(Value::as_bool).unwrap_or(true);
    let group = match w.get("strategy").and_then(Value::as_str) {
        Some("group") => group_of(w, "group_size").map_err(sub)?,
        Some("channel") => None,
        other => {
            return Err((
                at("weights.strategy"),
                format!("is {other:?}; lamina runs \"group\" or \"channel\" 4-bit scales"),
            ));
        }
    };
    Ok(Int4Scheme {
        layout: Int4Layout::CompressedTensors,
        group,
        sym,
    })
}

/// A tensor of the checkpoint with the file that holds it.
pub(crate) type Found<'a> = (&'a Path, TensorView<'a>);

/// The names of the packed tensor of projection `name` (`….weight`) in
/// `layout`: whether the checkpoint quantised it.
pub(crate) fn packed_name(name: &str, layout: Int4Layout) -> String {
    let prefix = name.strip_suffix(".weight").unwrap_or(name);
    match layout {
        Int4Layout::CompressedTensors => format!("{prefix}.weight_packed"),
        _ => format!("{prefix}.qweight"),
    }
}

/// One tensor of a projection, checked: its file, its values.
struct Part<'a> {
    path: PathBuf,
    name: String,
    view: TensorView<'a>,
}

impl Part<'_> {
    fn bad(&self, reason: String) -> LoadError {
        LoadError::Quantized {
            path: self.path.clone(),
            tensor: self.name.clone(),
            reason,
        }
    }

    fn shape(&self, want: &[usize]) -> Result<(), LoadError> {
        if self.view.shape() != want {
            return Err(LoadError::Shape {
                path: self.path.clone(),
                tensor: self.name.clone(),
                found: self.view.shape().to_vec(),
                expected: want.to_vec(),
            });
        }
        Ok(())
    }

    /// The values of an I32 tensor of shape `want`.
    fn words(&self, want: &[usize]) -> Result<Vec<u32>, LoadError> {
        self.shape(want)?;
        if self.view.dtype() != Dtype::I32 {
            return Err(self.bad(format!("has dtype {:?}, expected I32", self.view.dtype())));
        }
        let b = self.view.data();
        Ok(b.chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// The values of a float tensor of shape `want`, every one finite.
    fn floats(&self, want: &[usize]) -> Result<Vec<f32>, LoadError> {
        self.shape(want)?;
        let b = self.view.data();
        let two = |c: &[u8]| u16::from_le_bytes([c[0], c[1]]);
        let v: Vec<f32> = match self.view.dtype() {
            Dtype::F16 => b
                .chunks_exact(2)
                .map(|c| f16::from_bits(two(c)).to_f32())
                .collect(),
            Dtype::BF16 => b
                .chunks_exact(2)
                .map(|c| bf16::from_bits(two(c)).to_f32())
                .collect(),
            Dtype::F32 => (b.chunks_exact(4))
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            other => {
                return Err(self.bad(format!("has dtype {other:?}, expected F16, BF16 or F32")));
            }
        };
        if let Some((i, x)) = v.iter().enumerate().find(|(_, x)| !x.is_finite()) {
            return Err(self.bad(format!("holds {x} at index {i}; scales must be finite")));
        }
        Ok(v)
    }

    /// The integers of a `[2]` I32 or I64 tensor.
    fn pair(&self) -> Result<[i64; 2], LoadError> {
        self.shape(&[2])?;
        let b = self.view.data();
        let v: Vec<i64> = match self.view.dtype() {
            Dtype::I32 => (b.chunks_exact(4))
                .map(|c| i64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                .collect(),
            Dtype::I64 => (b.chunks_exact(8))
                .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect(),
            other => return Err(self.bad(format!("has dtype {other:?}, expected I32 or I64"))),
        };
        Ok([v[0], v[1]])
    }
}

/// Projection `name` (`[n, k]` = `shape`) of a checkpoint in `scheme`,
/// `None` when the checkpoint left it unquantised; `find` returns a tensor
/// with its file, `dir` names the checkpoint in a refusal of the config.
pub(crate) fn read_projection<'a>(
    dir: &Path,
    name: &str,
    shape: [usize; 2],
    scheme: Int4Scheme,
    find: impl Fn(&str) -> Option<Found<'a>>,
) -> Result<Option<Int4Tensor>, LoadError> {
    let prefix = name.strip_suffix(".weight").unwrap_or(name);
    let part = |suffix: &str| {
        let full = format!("{prefix}.{suffix}");
        match find(&full) {
            Some((path, view)) => Ok(Part {
                path: path.to_path_buf(),
                name: full,
                view,
            }),
            None => Err(LoadError::MissingTensor {
                path: dir.to_path_buf(),
                tensor: full,
            }),
        }
    };
    if find(&packed_name(name, scheme.layout)).is_none() {
        return Ok(None);
    }
    let [n, k] = shape;
    let g = scheme.group.unwrap_or(k);
    if g == 0 || !k.is_multiple_of(g) || !g.is_multiple_of(BLOCK) || !n.is_multiple_of(PER_WORD) {
        return Err(LoadError::Quantization {
            path: dir.join("config.json"),
            field: "quantization_config.group_size".into(),
            reason: format!(
                "is {g}, which does not divide `{name}` ([{n}, {k}]) into groups of whole blocks \
                 of {BLOCK} columns (and its {n} rows must be whole words of {PER_WORD})"
            ),
        });
    }
    let t = match scheme.layout {
        Int4Layout::Awq => awq_tensors(name, n, k, g, part)?,
        Int4Layout::Gptq { v1, desc_act } => gptq_tensors(name, n, k, g, v1, desc_act, part)?,
        Int4Layout::CompressedTensors => ct_tensors(name, n, k, g, scheme.sym, &find, part)?,
    };
    if scheme.sym
        && let Some(i) = t.zero.iter().position(|&z| z != SYM_ZERO)
    {
        return Err(LoadError::Quantized {
            path: dir.to_path_buf(),
            tensor: t.name.clone(),
            reason: format!(
                "has zero point {} at group {i}; a symmetric checkpoint's are all {SYM_ZERO}",
                t.zero[i]
            ),
        });
    }
    Ok(Some(t))
}

/// Nibble `i` of `w`.
fn nib(w: u32, i: usize) -> u8 {
    ((w >> (4 * i)) & 0xF) as u8
}

/// Packs `n` rows of `k` codes, `code(o, c)` the code of row `o`, stored
/// column `c` (rows on rayon).
fn pack(n: usize, k: usize, code: impl Fn(usize, usize) -> u8 + Sync) -> Vec<u8> {
    let mut data = vec![0u8; n * k / 2];
    data.par_chunks_mut(k / 2).enumerate().for_each(|(o, dst)| {
        let codes: Vec<u8> = (0..k).map(|c| code(o, c)).collect();
        let mut row = Vec::with_capacity(k / 2);
        pack_row(&codes, &mut row);
        dst.copy_from_slice(&row);
    });
    data
}

/// `f(o, g)` for every row and group, `[n, groups]`.
fn per_group<T>(n: usize, groups: usize, f: impl Fn(usize, usize) -> T) -> Vec<T> {
    (0..n)
        .flat_map(|o| (0..groups).map(move |g| (o, g)))
        .map(|(o, g)| f(o, g))
        .collect()
}

fn awq_tensors<'a>(
    name: &str,
    n: usize,
    k: usize,
    g: usize,
    part: impl Fn(&str) -> Result<Part<'a>, LoadError>,
) -> Result<Int4Tensor, LoadError> {
    let (w8, groups) = (n / PER_WORD, k / g);
    let qw = part("qweight")?.words(&[k, w8])?; // [k, n / 8]
    let qz = part("qzeros")?.words(&[groups, w8])?; // [k / g, n / 8]
    let s = part("scales")?.floats(&[groups, n])?; // [k / g, n]
    let nibble_of = |o: usize| {
        AWQ_ORDER
            .iter()
            .position(|&c| c == o % PER_WORD)
            .unwrap_or(0)
    };
    let data = pack(n, k, |o, c| nib(qw[c * w8 + o / PER_WORD], nibble_of(o)));
    Ok(Int4Tensor {
        name: name.to_string(),
        rows: n,
        cols: k,
        group: g,
        data,
        scale: per_group(n, groups, |o, gi| s[gi * n + o]),
        zero: per_group(n, groups, |o, gi| {
            nib(qz[gi * w8 + o / PER_WORD], nibble_of(o))
        }),
        perm: None,
    })
}

#[allow(clippy::too_many_arguments)]
fn gptq_tensors<'a>(
    name: &str,
    n: usize,
    k: usize,
    g: usize,
    v1: bool,
    desc_act: bool,
    part: impl Fn(&str) -> Result<Part<'a>, LoadError>,
) -> Result<Int4Tensor, LoadError> {
    let groups = k / g;
    let qw = part("qweight")?.words(&[k / PER_WORD, n])?; // [k / 8, n]
    let zp = part("qzeros")?;
    let qz = zp.words(&[groups, n / PER_WORD])?; // [k / g, n / 8]
    let s = part("scales")?.floats(&[groups, n])?; // [k / g, n]
    let perm = if desc_act {
        let gi = part("g_idx")?;
        let idx = gi.words(&[k])?;
        perm_of(&idx, k, g).map_err(|r| gi.bad(r))?
    } else {
        None
    };
    let col = |c: usize| perm.as_ref().map_or(c, |p| p[c] as usize);
    let data = pack(n, k, |o, c| {
        let i = col(c);
        nib(qw[(i / PER_WORD) * n + o], i % PER_WORD)
    });
    let zero = per_group(n, groups, |o, gi| {
        nib(qz[gi * (n / PER_WORD) + o / PER_WORD], o % PER_WORD) + u8::from(v1)
    });
    if let Some(i) = zero.iter().position(|&z| z > MAX_CODE) {
        return Err(zp.bad(format!(
            "holds zero point {} (stored {} + 1, checkpoint_format \"gptq\") for row {}, group {}; \
             zero points lie in 0..={MAX_CODE}",
            zero[i],
            zero[i] - 1,
            i / groups,
            i % groups
        )));
    }
    Ok(Int4Tensor {
        name: name.to_string(),
        rows: n,
        cols: k,
        group: g,
        data,
        scale: per_group(n, groups, |o, gi| s[gi * n + o]),
        zero,
        perm,
    })
}

#[allow(clippy::too_many_arguments)]
fn ct_tensors<'a>(
    name: &str,
    n: usize,
    k: usize,
    g: usize,
    sym: bool,
    find: &impl Fn(&str) -> Option<Found<'a>>,
    part: impl Fn(&str) -> Result<Part<'a>, LoadError>,
) -> Result<Int4Tensor, LoadError> {
    let groups = k / g;
    let ws = part("weight_shape")?;
    let dims = ws.pair()?;
    if dims != [n as i64, k as i64] {
        return Err(ws.bad(format!("is {dims:?}, expected [{n}, {k}]")));
    }
    let wp = part("weight_packed")?.words(&[n, k / PER_WORD])?; // [n, k / 8]
    let s = part("weight_scale")?.floats(&[n, groups])?; // [n, k / g]
    let zero = if sym {
        vec![SYM_ZERO; n * groups]
    } else {
        let zp = part("weight_zero_point")?.words(&[n.div_ceil(PER_WORD), groups])?;
        per_group(n, groups, |o, gi| {
            nib(zp[(o / PER_WORD) * groups + gi], o % PER_WORD)
        })
    };
    let prefix = name.strip_suffix(".weight").unwrap_or(name);
    let perm = match find(&format!("{prefix}.weight_g_idx")) {
        Some(_) => {
            let gi = part("weight_g_idx")?;
            let idx = gi.words(&[k])?;
            perm_of(&idx, k, g).map_err(|r| gi.bad(r))?
        }
        None => None,
    };
    let col = |c: usize| perm.as_ref().map_or(c, |p| p[c] as usize);
    let data = pack(n, k, |o, c| {
        let i = col(c);
        nib(wp[o * (k / PER_WORD) + i / PER_WORD], i % PER_WORD)
    });
    Ok(Int4Tensor {
        name: name.to_string(),
        rows: n,
        cols: k,
        group: g,
        data,
        scale: s,
        zero,
        perm,
    })
}

/// The stored column order of a `g_idx` (`[k]`, each input column's
/// group): the columns sorted by group (stably), `None` when that is
/// `0..k`; refused unless every group holds exactly `g` columns.
fn perm_of(g_idx: &[u32], k: usize, g: usize) -> Result<Option<Vec<u32>>, String> {
    let groups = k / g;
    let mut count = vec![0usize; groups];
    for (i, &gi) in g_idx.iter().enumerate() {
        let gi = gi as usize;
        if gi >= groups {
            return Err(format!(
                "gives column {i} group {gi}; there are {groups} groups"
            ));
        }
        count[gi] += 1;
    }
    if let Some(gi) = count.iter().position(|&c| c != g) {
        return Err(format!(
            "gives group {gi} {} columns; each group must hold group_size = {g}",
            count[gi]
        ));
    }
    let mut perm: Vec<u32> = (0..k as u32).collect();
    perm.sort_by_key(|&i| g_idx[i as usize]);
    let identity = perm.iter().enumerate().all(|(c, &i)| c == i as usize);
    Ok((!identity).then_some(perm))
}
