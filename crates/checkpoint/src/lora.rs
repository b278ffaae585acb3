//! LoRA adapters in the PEFT layout: `adapter_config.json` (`r`,
//! `lora_alpha`, `target_modules`, optional `use_rslora`) and
//! `adapter_model.safetensors` (`base_model.model.model.layers.{i}.{self_attn|mlp}.{target}.lora_A.weight`
//! `[r, in]` and `lora_B.weight` `[out, r]`, F32, BF16 or F16), read into a
//! checked [`contract::LoraAdapter`].
//!
//! Contract: [`load_adapter`] refuses, naming the file and the field or
//! tensor, an adapter whose config is missing or malformed, whose
//! `target_modules` name a module other than the seven Llama projections,
//! whose tensors name another module, layer or target than the config's
//! (a layer written in one canonical decimal form only: `01` is refused),
//! name one tensor twice, do not fit the model, hold values that are not
//! finite, or whose rank is above `max_rank` (`--max-lora-rank`). Errors
//! never echo a value read from the files (only field and tensor names).
//! Both files must be regular files ([`crate::files`]: a FIFO, device or
//! directory is refused at once); the config is read up to
//! [`MAX_CONFIG_BYTES`], the weights are mapped, not read, and refused
//! unless no larger than the largest adapter the model admits at
//! `max_rank`, and unless the tensors the header declares fit
//! [`LoadLimits::max_memory`] in f32, before any tensor is converted.
//! [`LoadLimits::deadline`] bounds the time spent. [`LoraLoadError::public`]
//! is the message for a remote caller: a path that cannot be reached as an
//! adapter gets one message whatever the reason (missing, not permitted,
//! not a directory, not a regular file), so it tells nothing of what
//! exists. [`resolve_adapter`] maps a `--lora` path or Hugging Face repo id
//! to a directory through the same hub cache the models use.
//! [`AdapterCache`] shares one adapter between loads of identical files.
//! [`write_peft_adapter`] writes an adapter in exactly that layout.
//!
//! Costs: the tensors' pages read once; memory = the adapter in f32.

mod cache;
mod config;
mod header;
mod writer;

use crate::files::{self, FileError};
use crate::store::{StoreError, hub};
use contract::config::ModelConfig;
use contract::lora::{LoraAdapter, LoraError, LoraLayer, LoraPair, LoraTarget, lora_scale};
use half::{bf16, f16};
use safetensors::Dtype;
use std::path::{Path, PathBuf};
use std::time::Instant;

pub use cache::AdapterCache;
pub use writer::{PeftSpec, write_peft_adapter};

/// The adapter's configuration file.
pub const ADAPTER_CONFIG: &str = "adapter_config.json";
/// The adapter's weights.
pub const ADAPTER_WEIGHTS: &str = "adapter_model.safetensors";
/// The largest `adapter_config.json` read.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;
/// Room for the safetensors header beyond the tensors (safetensors' own
/// header limit).
const MAX_HEADER_BYTES: u64 = 100 << 20;
const PREFIX: &str = "base_model.model.model.layers.";

/// At most this many characters of a tensor name go into an error.
const SHOWN_NAME_CHARS: usize = 200;

/// A tensor name as errors show it: control characters escaped, cut at
/// [`SHOWN_NAME_CHARS`].
pub(crate) fn shown(name: &str) -> String {
    let mut s: String = name.chars().take(SHOWN_NAME_CHARS).collect();
    if s.len() < name.len() {
        s.push('…');
    }
    s.escape_debug().to_string()
}

/// Errors reading an adapter.
#[derive(Debug, thiserror::Error)]
pub enum LoraLoadError {
    #[error("LoRA adapter {path}: cannot read it: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("LoRA adapter: {0}")]
    File(#[from] FileError),
    #[error("LoRA adapter {path}: `{field}` {reason}")]
    Config {
        path: PathBuf,
        field: String,
        reason: String,
    },
    #[error("LoRA adapter {path}: tensor `{}` {reason}", shown(.tensor))]
    Tensor {
        path: PathBuf,
        tensor: String,
        reason: String,
    },
    #[error("LoRA adapter {path}: {reason}")]
    Limit { path: PathBuf, reason: String },
    #[error("LoRA adapter {path}: {source}")]
    Fit { path: PathBuf, source: LoraError },
    #[error("LoRA adapter {0}: {1}")]
    Store(String, StoreError),
}

impl LoraLoadError {
    /// Whether the adapter's files could not be reached at all.
    pub fn is_access(&self) -> bool {
        match self {
            LoraLoadError::Io { .. } => true,
            LoraLoadError::File(e) => e.is_access(),
            _ => false,
        }
    }

    /// The message for a caller who named `spec` remotely (see the module
    /// doc): access failures in one form, everything else as is.
    pub fn public(&self, spec: &str) -> String {
        if self.is_access() {
            format!(
                "LoRA adapter `{spec}`: no adapter can be read there (expected a directory \
                 holding the regular files {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS}, or a \
                 Hugging Face repo id)"
            )
        } else {
            self.to_string()
        }
    }
}

/// Bounds on one adapter load.
#[derive(Debug, Clone, Copy)]
pub struct LoadLimits {
    /// Highest rank accepted (`--max-lora-rank`).
    pub max_rank: usize,
    /// Most bytes the adapter may take in f32.
    pub max_memory: u64,
    /// When the load gives up.
    pub deadline: Option<Instant>,
}

impl LoadLimits {
    /// Ranks up to `max_rank`, no other bound.
    pub fn rank(max_rank: usize) -> Self {
        LoadLimits {
            max_rank,
            max_memory: u64::MAX,
            deadline: None,
        }
    }
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

/// An adapter's two files: the config's text and the weights mapped.
pub(crate) struct AdapterFiles {
    dir: PathBuf,
    config: String,
    weights: memmap2::Mmap,
}

/// The largest weights file an adapter of model `c` at rank `max_rank`
/// can be: every projection targeted, F32, and the largest header.
fn max_weights_bytes(c: &ModelConfig, max_rank: usize) -> u64 {
    let per_layer: u64 = LoraTarget::ALL
        .iter()
        .map(|t| {
            let (i, o) = t.dims(c);
            (max_rank as u64).saturating_mul((i + o) as u64)
        })
        .sum();
    per_layer
        .saturating_mul(c.num_layers as u64)
        .saturating_mul(4)
        .saturating_add(MAX_HEADER_BYTES + 8)
}

/// Opens the adapter's files in `dir` (see the module doc for the checks).
fn open_files(dir: &Path, c: &ModelConfig, max_rank: usize) -> Result<AdapterFiles, LoraLoadError> {
    let config = files::read_regular_string(&dir.join(ADAPTER_CONFIG), MAX_CONFIG_BYTES)?;
    let weights = files::map_regular(&dir.join(ADAPTER_WEIGHTS), max_weights_bytes(c, max_rank))?;
    Ok(AdapterFiles {
        dir: dir.to_path_buf(),
        config,
        weights,
    })
}

/// Reads and checks the PEFT adapter in `dir` against model `c` with ranks
/// up to `max_rank` (see the module doc).
pub fn load_adapter(
    dir: &Path,
    c: &ModelConfig,
    max_rank: usize,
) -> Result<LoraAdapter, LoraLoadError> {
    load_adapter_within(dir, c, &LoadLimits::rank(max_rank))
}

/// [`load_adapter`] within `limits`.
pub fn load_adapter_within(
    dir: &Path,
    c: &ModelConfig,
    limits: &LoadLimits,
) -> Result<LoraAdapter, LoraLoadError> {
    parse_files(&open_files(dir, c, limits.max_rank)?, c, limits)
}

/// `(layer, target, 'A' | 'B')` of a PEFT tensor name; the layer in
/// canonical decimal (no sign, no leading zero).
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
    let l: usize = layer.parse().ok()?;
    (l.to_string() == layer).then_some((l, module, which))
}

/// The checks that need only the header: the adapter's size in f32 within
/// `limits`, before any tensor is converted.
fn check_declared(
    path: &Path,
    st: &safetensors::SafeTensors<'_>,
    limits: &LoadLimits,
) -> Result<(), LoraLoadError> {
    let f32_bytes: u64 = st
        .tensors()
        .iter()
        .map(|(_, v)| v.shape().iter().map(|&d| d as u64).product::<u64>())
        .fold(0u64, |acc, n| acc.saturating_add(n.saturating_mul(4)));
    if f32_bytes > limits.max_memory {
        return Err(LoraLoadError::Limit {
            path: path.to_path_buf(),
            reason: format!(
                "its tensors take {f32_bytes} bytes in f32, above the limit of {} bytes \
                 (--max-lora-memory-mib)",
                limits.max_memory
            ),
        });
    }
    Ok(())
}

/// Checks and converts the adapter in `files` (see the module doc).
fn parse_files(
    files: &AdapterFiles,
    c: &ModelConfig,
    limits: &LoadLimits,
) -> Result<LoraAdapter, LoraLoadError> {
    let dir = &files.dir;
    let cfg = config::parse_config(&dir.join(ADAPTER_CONFIG), &files.config)?;
    let max_rank = limits.max_rank;
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
    let path = dir.join(ADAPTER_WEIGHTS);
    let st = header::parse(&path, &files.weights)?;
    check_declared(&path, &st, limits)?;
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
        if limits.deadline.is_some_and(|d| Instant::now() > d) {
            return Err(LoraLoadError::Limit {
                path: path.clone(),
                reason: "reading it took longer than the adapter load time limit".into(),
            });
        }
        let (l, module, which) = parse_name(&name).ok_or_else(|| {
            bad(format!(
                "is not a LoRA weight of a layer projection (expected `{PREFIX}{{i}}.{{self_attn|mlp}}.{{module}}.lora_{{A|B}}.weight`, the layer in plain decimal)"
            ))
        })?;
        let t = LoraTarget::from_name(module)
            .filter(|t| name.contains(&format!(".{}.{}.", t.block(), t.name())))
            .ok_or_else(|| bad("targets a module LoRA cannot target here".into()))?;
        if !cfg.targets.contains(&t) {
            return Err(bad(format!(
                "targets `{}`, which is not among the config's target_modules",
                t.name()
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
        let half = &mut halves[l][t.index()];
        let seen = if which == 'A' {
            &mut half.0
        } else {
            &mut half.1
        };
        if std::mem::replace(seen, true) {
            return Err(bad(format!(
                "is a second lora_{which} of layer {l}'s {}",
                t.name()
            )));
        }
        let data = to_f32(view.dtype(), view.data()).ok_or_else(|| {
            bad(format!(
                "has dtype {:?}, expected F32, BF16 or F16",
                view.dtype()
            ))
        })?;
        if let Some(k) = data.iter().position(|x| !x.is_finite()) {
            return Err(bad(format!("holds a non-finite value (at flat index {k})")));
        }
        let pair = layers[l].pairs[t.index()].get_or_insert_with(|| LoraPair {
            a: Vec::new(),
            b: Vec::new(),
        });
        if which == 'A' {
            pair.a = data;
        } else {
            pair.b = data;
        }
    }
    check_halves(&path, &halves)?;
    let adapter = LoraAdapter {
        rank: cfg.rank,
        scale: lora_scale(cfg.alpha, cfg.rank, cfg.rslora),
        layers,
    };
    adapter
        .check(c, max_rank)
        .map_err(|source| LoraLoadError::Fit {
            path: dir.to_path_buf(),
            source,
        })?;
    Ok(adapter)
}

/// Every projection with one half has the other.
fn check_halves(path: &Path, halves: &[[(bool, bool); 7]]) -> Result<(), LoraLoadError> {
    for (l, hs) in halves.iter().enumerate() {
        for t in LoraTarget::ALL {
            let (a, b) = hs[t.index()];
            if a != b {
                return Err(LoraLoadError::Tensor {
                    path: path.to_path_buf(),
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
    Ok(())
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

#[cfg(test)]
mod tests;
