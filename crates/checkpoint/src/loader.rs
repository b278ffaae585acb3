//! Loading a Hugging Face model directory: `config.json`,
//! `generation_config.json` and safetensors weights.
//!
//! Contract: [`load_weights`] returns a [`ModelWeights`] only after every
//! tensor the [`ModelConfig`] implies was found and checked for dtype, shape
//! and finite values; a missing, misshapen, wrongly typed or truncated
//! tensor, or one holding a NaN or an infinity, is a [`LoadError`] naming the
//! file (or directory) and the tensor. The finiteness scan is one parallel
//! pass over the bf16 bits (about a quarter second for 1B parameters on two
//! cores). Weights come from a single
//! `model.safetensors` or from the shards listed in
//! `model.safetensors.index.json`; BF16, F16 and F32 on disk are all converted
//! to BF16; FP8 projections of a pre-quantised checkpoint are read with
//! their scales ([`crate::fp8`]) and held as [`Projection::Fp8`] (those the
//! checkpoint left in BF16 are quantised here); the packed projections of
//! an AWQ, GPTQ or compressed-tensors `pack-quantized` checkpoint are
//! read into [`Projection::Int4`] ([`crate::int4`]; those it left in BF16
//! stay BF16, and GPTQ's all-zero biases are dropped). Extra tensors (e.g. old `rotary_emb.inv_freq` buffers) are ignored,
//! except layers past `num_hidden_layers` (a config that undercounts the
//! file's layers is an error naming both).
//! `lm_head.weight` is used whenever present; when absent the head is tied to
//! the embedding, which is an error unless `tie_word_embeddings` is set.
//!
//! Costs: files are memory-mapped (no read of unused bytes); every needed
//! tensor is copied once into an owned BF16 buffer (the model's size in BF16),
//! converted in parallel with rayon. The maps are dropped before returning.

#[cfg(test)]
mod tests;
mod writer;

pub use writer::{SafetensorsWriter, TensorSpec};

use crate::fp8::QuantScheme;
use crate::progress::{Progress, Unit};
use crate::projection::Projection;
use crate::weights::{Extra, LayerWeights, ModelWeights, Tensor, mlp_norm_suffix};
use contract::config::{ConfigError, GenerationConfig, ModelConfig};
use half::{bf16, f16};
use memmap2::Mmap;
use rayon::prelude::*;
use safetensors::{Dtype, SafeTensors};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// Name of the single-file weights.
pub const SINGLE_FILE: &str = "model.safetensors";
/// Name of the shard index.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// A model directory's configuration, without weights.
#[derive(Debug, Clone)]
pub struct LoadedModel {
    pub dir: PathBuf,
    pub config: ModelConfig,
    pub generation: GenerationConfig,
    /// EOS ids of `config.json` extended by those of `generation_config.json`.
    pub eos_ids: Vec<u32>,
}

/// Errors loading a model directory.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("model directory {0} does not exist")]
    MissingDir(PathBuf),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("no weights in {dir}: expected {SINGLE_FILE} or {INDEX_FILE}")]
    NoWeights { dir: PathBuf },
    #[error("malformed shard index {path}: {reason}")]
    Index { path: PathBuf, reason: String },
    #[error("invalid safetensors file {path}: {reason}")]
    Safetensors { path: PathBuf, reason: String },
    #[error(
        "truncated safetensors file {path}: tensor `{tensor}` ends at byte {end} but the file has {len} data bytes"
    )]
    Truncated {
        path: PathBuf,
        tensor: String,
        end: usize,
        len: usize,
    },
    #[error(
        "tensor `{tensor}` of the model in {path} holds a non-finite value ({value} at flat index {index}); \
         the weights are damaged"
    )]
    NonFinite {
        path: PathBuf,
        tensor: String,
        index: usize,
        value: f32,
    },
    #[error(
        "tensor `{tensor}` of the model in {path} holds {value} at flat index {index}, beyond the \
         ±{limit} any trained weight stays within; the weights are damaged"
    )]
    Implausible {
        path: PathBuf,
        tensor: String,
        index: usize,
        value: f32,
        limit: f32,
    },
    #[error(
        "the weights in {dir} hold {layers} layers but config.json's `num_hidden_layers` is {config}"
    )]
    ExtraLayers {
        dir: PathBuf,
        layers: usize,
        config: usize,
    },
    #[error(
        "tensor `{tensor}` in {dir} is not part of the model its config.json describes (the layer's `{field}` is off)"
    )]
    Unexpected {
        dir: PathBuf,
        tensor: String,
        field: &'static str,
    },
    #[error("tensor `{tensor}` not found in {path}")]
    MissingTensor { path: PathBuf, tensor: String },
    #[error(transparent)]
    Format(#[from] crate::projection::FormatError),
    #[error("tensor `{tensor}` in {path} has shape {found:?}, expected {expected:?}")]
    Shape {
        path: PathBuf,
        tensor: String,
        found: Vec<usize>,
        expected: Vec<usize>,
    },
    #[error("`{field}` of {path} {reason}")]
    Quantization {
        path: PathBuf,
        field: String,
        reason: String,
    },
    #[error("tensor `{tensor}` in {path} {reason}")]
    Scale {
        path: PathBuf,
        tensor: String,
        reason: String,
    },
    #[error("tensor `{tensor}` in {path} {reason}")]
    Quantized {
        path: PathBuf,
        tensor: String,
        reason: String,
    },
    #[error("tensor `{tensor}` in {path} has dtype {dtype}, expected BF16, F16 or F32")]
    Dtype {
        path: PathBuf,
        tensor: String,
        dtype: String,
    },
}

/// Reads `config.json` and `generation_config.json` of `dir` (no weights).
pub fn load_config(dir: &Path) -> Result<LoadedModel, LoadError> {
    if !dir.is_dir() {
        return Err(LoadError::MissingDir(dir.to_path_buf()));
    }
    let config = ModelConfig::from_dir(dir)?;
    let generation = GenerationConfig::from_dir(dir)?;
    let eos_ids = generation.eos_ids(&config.eos_token_ids);
    Ok(LoadedModel {
        dir: dir.to_path_buf(),
        config,
        generation,
        eos_ids,
    })
}

/// The tensors a model with config `cfg` stores, in Hugging Face names and
/// shapes, sorted by name. `lm_head.weight` is listed when `with_lm_head`.
pub fn tensor_specs(cfg: &ModelConfig, with_lm_head: bool) -> Vec<TensorSpec> {
    let h = cfg.hidden_size;
    let spec = |name: String, shape: Vec<usize>| TensorSpec { name, shape };
    let mut out = vec![
        spec("model.embed_tokens.weight".into(), vec![cfg.vocab_size, h]),
        spec("model.norm.weight".into(), vec![h]),
    ];
    if with_lm_head {
        out.push(spec("lm_head.weight".into(), vec![cfg.vocab_size, h]));
    }
    for (i, ls) in cfg.spec.layers.iter().enumerate() {
        let p = format!("model.layers.{i}.");
        let extras = Extra::ALL.into_iter().filter(|e| e.wanted(ls));
        out.extend(extras.map(|e| spec(format!("{p}{}", e.hf_suffix()), e.shape(cfg))));
        out.extend([
            spec(format!("{p}input_layernorm.weight"), vec![h]),
            spec(format!("{p}self_attn.q_proj.weight"), vec![cfg.q_dim(), h]),
            spec(format!("{p}self_attn.k_proj.weight"), vec![cfg.kv_dim(), h]),
            spec(format!("{p}self_attn.v_proj.weight"), vec![cfg.kv_dim(), h]),
            spec(format!("{p}self_attn.o_proj.weight"), vec![h, cfg.q_dim()]),
            spec(format!("{p}{}", mlp_norm_suffix(ls)), vec![h]),
            spec(
                format!("{p}mlp.gate_proj.weight"),
                vec![cfg.intermediate_size, h],
            ),
            spec(
                format!("{p}mlp.up_proj.weight"),
                vec![cfg.intermediate_size, h],
            ),
            spec(
                format!("{p}mlp.down_proj.weight"),
                vec![h, cfg.intermediate_size],
            ),
        ]);
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// One memory-mapped safetensors file.
struct Shard {
    path: PathBuf,
    map: Mmap,
}

/// Loads and checks every weight of `dir` against `cfg`.
pub fn load_weights(dir: &Path, cfg: &ModelConfig) -> Result<ModelWeights, LoadError> {
    if !dir.is_dir() {
        return Err(LoadError::MissingDir(dir.to_path_buf()));
    }
    let (shards, placement) = open_shards(dir)?;
    let parsed = shards
        .iter()
        .map(parse_shard)
        .collect::<Result<Vec<_>, _>>()?;
    // name -> shard index: from the index file, or every tensor of the single file
    let placement: HashMap<String, usize> = match placement {
        Some(p) => p,
        None => parsed[0]
            .names()
            .into_iter()
            .map(|n| (n.to_string(), 0))
            .collect(),
    };
    // a file with more layers than the config says: the config is wrong
    if let Some(extra) = placement
        .keys()
        .filter_map(|n| {
            n.strip_prefix("model.layers.")?
                .split('.')
                .next()?
                .parse::<usize>()
                .ok()
        })
        .filter(|&l| l >= cfg.num_layers)
        .max()
    {
        return Err(LoadError::ExtraLayers {
            dir: dir.to_path_buf(),
            layers: extra + 1,
            config: cfg.num_layers,
        });
    }
    // a tensor the spec has no use for would be silently ignored: refuse
    // the model instead, naming the spec field that would ask for it
    let wanted: std::collections::HashSet<String> = tensor_specs(cfg, true)
        .into_iter()
        .map(|t| t.name)
        .collect();
    let scheme = crate::fp8::scheme_of(dir)?;
    let int4 = match scheme {
        Some(QuantScheme::Int4(s)) => Some(s),
        _ => None,
    };
    // GPTQ's packers save a bias of zeros beside every projection of a
    // model without biases: no bias at all
    let zero_bias = |n: &str| {
        int4.is_some()
            && n.ends_with(".bias")
            && placement.get(n).is_some_and(|&i| {
                (parsed[i].tensor(n)).is_ok_and(|v| v.data().iter().all(|&b| b == 0))
            })
    };
    let unwanted = |n: &&String| {
        !wanted.contains(n.as_str())
            && (n.ends_with(".bias") || Extra::ALL.iter().any(|e| n.ends_with(e.hf_suffix())))
            && !zero_bias(n)
    };
    if let Some(tensor) = placement.keys().filter(unwanted).min() {
        let field = Extra::ALL
            .iter()
            .find(|e| tensor.ends_with(e.hf_suffix()))
            .map_or("a bias", |e| e.field());
        return Err(LoadError::Unexpected {
            dir: dir.to_path_buf(),
            tensor: tensor.clone(),
            field,
        });
    }
    let extras: usize = cfg
        .spec
        .layers
        .iter()
        .map(|l| Extra::ALL.iter().filter(|e| e.wanted(l)).count())
        .sum();
    let total = 2
        + 9 * cfg.num_layers
        + extras
        + usize::from(placement.contains_key("lm_head.weight") || !cfg.tie_word_embeddings);
    let progress = Progress::new(
        format!("loading weights from {}", dir.display()),
        Unit::Items("tensors"),
        total as u64,
        0,
    );
    let get = |name: &str, shape: Vec<usize>| -> Result<Tensor, LoadError> {
        progress.inc(1);
        let Some(&i) = placement.get(name) else {
            let path = match shards.len() {
                1 => shards[0].path.clone(),
                _ => dir.join(INDEX_FILE),
            };
            return Err(LoadError::MissingTensor {
                path,
                tensor: name.to_string(),
            });
        };
        read_tensor(&shards[i].path, &parsed[i], name, shape)
    };
    let fp8 = match scheme {
        Some(QuantScheme::Fp8(s)) => Some(s),
        _ => None,
    };
    let find = |n: &str| {
        let &j = placement.get(n)?;
        Some((shards[j].path.as_path(), parsed[j].tensor(n).ok()?))
    };
    // a projection: BF16 (or F16 / F32), F8_E4M3 with its scales, or the
    // packed tensors of a 4-bit checkpoint
    let proj = |name: &str, shape: Vec<usize>| -> Result<Projection, LoadError> {
        if let Some(s) = int4
            && let Some(t) =
                crate::int4::read::read_projection(dir, name, [shape[0], shape[1]], s, find)?
        {
            progress.inc(1);
            return Ok(Projection::Int4(t));
        }
        let fp8_view = placement.get(name).and_then(|&i| {
            let v = parsed[i].tensor(name).ok()?;
            (v.dtype() == Dtype::F8_E4M3).then_some((i, v))
        });
        let Some((i, view)) = fp8_view else {
            return Ok(Projection::Bf16(get(name, shape)?));
        };
        progress.inc(1);
        let path = &shards[i].path;
        let Some(scheme) = fp8 else {
            return Err(LoadError::Quantization {
                path: dir.join("config.json"),
                field: "quantization_config".into(),
                reason: format!(
                    "{}, yet tensor `{name}` is stored as F8_E4M3",
                    if int4.is_some() {
                        "describes 4-bit weights"
                    } else {
                        "is missing"
                    }
                ),
            });
        };
        if view.shape() != shape.as_slice() {
            return Err(LoadError::Shape {
                path: path.clone(),
                tensor: name.to_string(),
                found: view.shape().to_vec(),
                expected: shape,
            });
        }
        let sibling = |n: &str| {
            let &j = placement.get(n)?;
            parsed[j].tensor(n).ok()
        };
        let f = crate::fp8::read_projection(path, name, &view, scheme, sibling)?;
        Ok(Projection::Fp8(f))
    };
    let h = cfg.hidden_size;
    let embed = get("model.embed_tokens.weight", vec![cfg.vocab_size, h])?; // [vocab, hidden]
    let norm = get("model.norm.weight", vec![h])?; // [hidden]
    let lm_head = if placement.contains_key("lm_head.weight") || !cfg.tie_word_embeddings {
        Some(Projection::Bf16(get(
            "lm_head.weight",
            vec![cfg.vocab_size, h],
        )?)) // [vocab, hidden]
    } else {
        None
    };
    let inter = cfg.intermediate_size;
    let layers = (cfg.spec.layers.iter().enumerate())
        .map(|(i, ls)| {
            let p = format!("model.layers.{i}.");
            let t = |suffix: &str, shape: Vec<usize>| get(&format!("{p}{suffix}"), shape);
            let pr = |suffix: &str, shape: Vec<usize>| proj(&format!("{p}{suffix}"), shape);
            Ok(LayerWeights {
                input_norm: t("input_layernorm.weight", vec![h])?,
                q_proj: pr("self_attn.q_proj.weight", vec![cfg.q_dim(), h])?,
                k_proj: pr("self_attn.k_proj.weight", vec![cfg.kv_dim(), h])?,
                v_proj: pr("self_attn.v_proj.weight", vec![cfg.kv_dim(), h])?,
                o_proj: pr("self_attn.o_proj.weight", vec![h, cfg.q_dim()])?,
                post_norm: t(mlp_norm_suffix(ls), vec![h])?,
                gate_proj: pr("mlp.gate_proj.weight", vec![inter, h])?,
                up_proj: pr("mlp.up_proj.weight", vec![inter, h])?,
                down_proj: pr("mlp.down_proj.weight", vec![h, inter])?,
                extras: Extra::ALL
                    .into_iter()
                    .filter(|e| e.wanted(ls))
                    .map(|e| Ok((e, t(e.hf_suffix(), e.shape(cfg))?)))
                    .collect::<Result<_, LoadError>>()?,
            })
        })
        .collect::<Result<Vec<_>, LoadError>>()?;
    let kv_scales = crate::fp8::read_kv_scales(dir, cfg.num_layers, find)?;
    let mut weights = ModelWeights {
        embed,
        layers,
        norm,
        lm_head,
        kv_scales,
    };
    // NaN, infinite or absurdly large weights give garbage silently:
    // refuse them here
    if let Some((t, index, value)) = weights.first_implausible() {
        let (path, tensor) = (dir.to_path_buf(), t.to_string());
        return Err(if value.is_finite() {
            LoadError::Implausible {
                path,
                tensor,
                index,
                value,
                limit: crate::weights::MAX_ABS_WEIGHT,
            }
        } else {
            LoadError::NonFinite {
                path,
                tensor,
                index,
                value,
            }
        });
    }
    if fp8.is_some() {
        // the projections an FP8 checkpoint left in BF16 (checked above)
        weights.quantize_fp8();
    }
    progress.finish();
    Ok(weights)
}

/// Maps the weight files of `dir`; with an index, also returns its name -> shard placement.
#[allow(clippy::type_complexity)]
fn open_shards(dir: &Path) -> Result<(Vec<Shard>, Option<HashMap<String, usize>>), LoadError> {
    let index_path = dir.join(INDEX_FILE);
    let single = dir.join(SINGLE_FILE);
    if index_path.is_file() {
        let text = std::fs::read_to_string(&index_path).map_err(|source| LoadError::Io {
            path: index_path.clone(),
            source,
        })?;
        #[derive(serde::Deserialize)]
        struct Index {
            weight_map: BTreeMap<String, String>,
        }
        let index: Index = serde_json::from_str(&text).map_err(|e| LoadError::Index {
            path: index_path.clone(),
            reason: e.to_string(),
        })?;
        let mut files: Vec<&String> = index.weight_map.values().collect();
        files.sort();
        files.dedup();
        if files.is_empty() {
            return Err(LoadError::Index {
                path: index_path,
                reason: "weight_map is empty".into(),
            });
        }
        let mut shards = Vec::with_capacity(files.len());
        for f in &files {
            if Path::new(f).components().count() != 1 {
                return Err(LoadError::Index {
                    path: index_path,
                    reason: format!("shard name `{f}` is not a plain file name"),
                });
            }
            shards.push(map_file(&dir.join(f))?);
        }
        let placement = index
            .weight_map
            .iter()
            .filter_map(|(name, f)| {
                files
                    .iter()
                    .position(|x| *x == f)
                    .map(|i| (name.clone(), i))
            })
            .collect();
        Ok((shards, Some(placement)))
    } else if single.is_file() {
        Ok((vec![map_file(&single)?], None))
    } else {
        Err(LoadError::NoWeights {
            dir: dir.to_path_buf(),
        })
    }
}

fn map_file(path: &Path) -> Result<Shard, LoadError> {
    let io = |source| LoadError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    // SAFETY: the map is read-only and private to this load; the model files are
    // not expected to change while loading (as with every mmap-based loader). A
    // concurrent truncation could fault, which no file API can rule out.
    let map = unsafe { Mmap::map(&file) }.map_err(io)?;
    Ok(Shard {
        path: path.to_path_buf(),
        map,
    })
}

/// Parses a shard's header; a file shorter than its header promises is a
/// [`LoadError::Truncated`] naming the first tensor that does not fit.
fn parse_shard(shard: &Shard) -> Result<SafeTensors<'_>, LoadError> {
    SafeTensors::deserialize(&shard.map).map_err(|e| {
        if let Some((tensor, end, len)) = first_truncated(&shard.map) {
            return LoadError::Truncated {
                path: shard.path.clone(),
                tensor,
                end,
                len,
            };
        }
        LoadError::Safetensors {
            path: shard.path.clone(),
            reason: format!("{e} (truncated or corrupt)"),
        }
    })
}

/// For a file whose header parses but whose data is short: the first tensor
/// (by offset) extending past the end, its end offset and the data length.
fn first_truncated(buf: &[u8]) -> Option<(String, usize, usize)> {
    let n = usize::try_from(u64::from_le_bytes(buf.get(..8)?.try_into().ok()?)).ok()?;
    let header = buf.get(8..8usize.checked_add(n)?)?;
    let len = buf.len() - 8 - n;
    #[derive(serde::Deserialize)]
    struct Info {
        data_offsets: (usize, usize),
    }
    let map: BTreeMap<String, serde_json::Value> = serde_json::from_slice(header).ok()?;
    map.into_iter()
        .filter(|(k, _)| k != "__metadata__")
        .filter_map(|(k, v)| {
            serde_json::from_value::<Info>(v)
                .ok()
                .map(|i| (k, i.data_offsets))
        })
        .filter(|(_, (_, end))| *end > len)
        .min_by_key(|(_, (start, _))| *start)
        .map(|(k, (_, end))| (k, end, len))
}

/// Little-endian bf16 `bytes` as values, on a little-endian host: a
/// parallel copy of megabyte chunks into fresh zero pages (the largest
/// tensors of a model are most of its load).
fn bf16_le(bytes: &[u8]) -> Vec<bf16> {
    const CHUNK: usize = 1 << 20;
    let mut data: Vec<bf16> = bytemuck::zeroed_vec(bytes.len() / 2);
    let dst: &mut [u8] = bytemuck::cast_slice_mut(&mut data);
    (dst.par_chunks_mut(CHUNK).zip(bytes.par_chunks(CHUNK)))
        .for_each(|(d, s)| d.copy_from_slice(s));
    data
}

/// Reads one tensor, checking dtype and shape, converting to BF16.
fn read_tensor(
    path: &Path,
    st: &SafeTensors<'_>,
    name: &str,
    shape: Vec<usize>,
) -> Result<Tensor, LoadError> {
    let view = st.tensor(name).map_err(|_| LoadError::MissingTensor {
        path: path.to_path_buf(),
        tensor: name.to_string(),
    })?;
    if view.shape() != shape.as_slice() {
        return Err(LoadError::Shape {
            path: path.to_path_buf(),
            tensor: name.to_string(),
            found: view.shape().to_vec(),
            expected: shape,
        });
    }
    let bytes = view.data();
    let data: Vec<bf16> = match view.dtype() {
        Dtype::BF16 if cfg!(target_endian = "little") => bf16_le(bytes),
        Dtype::BF16 => bytes
            .par_chunks_exact(2)
            .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])))
            .collect(),
        Dtype::F16 => bytes
            .par_chunks_exact(2)
            .map(|c| bf16::from_f32(f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32()))
            .collect(),
        Dtype::F32 => bytes
            .par_chunks_exact(4)
            .map(|c| bf16::from_f32(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
            .collect(),
        other => {
            return Err(LoadError::Dtype {
                path: path.to_path_buf(),
                tensor: name.to_string(),
                dtype: format!("{other:?}"),
            });
        }
    };
    Ok(Tensor {
        name: name.to_string(),
        shape,
        data,
    })
}
