//! What every way of opening a model does first: check the settings that
//! need no model, resolve the name to a directory (a store id fetched on
//! first use, a Hugging Face repo, a directory in Hugging Face layout, a
//! GGUF imported into the store once), read its config (capped by
//! `max_model_len`) and tokenizer, and pick the device.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use checkpoint::loader::LoadedModel;
use tokenizer::Tokenizer;

use crate::error::{Context, RuntimeError, invalid};
use crate::options::{Device, RuntimeOptions};

/// A model resolved and read, weights not yet loaded.
pub(crate) struct Resolved {
    /// The model directory (Hugging Face layout).
    pub dir: PathBuf,
    pub loaded: LoadedModel,
    pub tokenizer: Arc<Tokenizer>,
    /// Whether it runs on the CUDA backend.
    pub cuda: bool,
}

/// Checks the settings, applies the CPU's instruction-set cap, and reads
/// the model `source` names.
pub(crate) fn resolve(
    source: &str,
    opts: &RuntimeOptions,
    tokenizer: Option<Arc<Tokenizer>>,
) -> Result<Resolved, RuntimeError> {
    check_settings(opts)?;
    if let Some(cap) = opts.cpu.isa_cap {
        cpu_kernels::isa::set_cap(cap).context("applying `--cpu-isa`")?;
    }
    let dir = model_dir(source)?;
    let mut loaded = checkpoint::loader::load_config(&dir)?;
    cap_context(&mut loaded.config, opts.max_model_len)?;
    let tokenizer = match tokenizer {
        Some(t) => t,
        None => Arc::new(Tokenizer::from_dir(&dir)?),
    };
    let cuda = use_cuda(opts.device)?;
    Ok(Resolved {
        dir,
        loaded,
        tokenizer,
        cuda,
    })
}

/// The settings that are wrong whatever the model: refused before
/// anything loads.
fn check_settings(opts: &RuntimeOptions) -> Result<(), RuntimeError> {
    if opts.engine.max_num_seqs == 0 {
        invalid!("invalid `--max-num-seqs`: must be at least 1");
    }
    if opts.engine.max_batch_tokens == Some(0) {
        invalid!("invalid `--max-batch-tokens`: must be at least 1");
    }
    let u = opts.kv.gpu_memory_utilization;
    if !(u > 0.0 && u <= 1.0) {
        invalid!("invalid `--gpu-memory-utilization`: must be in (0, 1], got {u}");
    }
    let (rows, most) = (opts.cuda.gemv_rows, model::cuda::MAX_GEMV_ROWS);
    if rows > most {
        invalid!("invalid `--gemv-rows`: {rows} is more than the GEMV kernels take ({most})");
    }
    if let Some(Err(e)) = opts
        .cuda
        .decode_min_chunk
        .map(model::cuda::check_decode_min_chunk)
    {
        invalid!("invalid `--decode-min-chunk`: {e}");
    }
    if opts.cuda.det_gemm != model::cuda::DetGemm::Auto && !opts.deterministic {
        invalid!(
            "invalid `--deterministic-gemm`: it chooses the products of `--deterministic`, which is off"
        );
    }
    Ok(())
}

/// Resolves a model name to a directory, fetching a known id on first use.
pub fn model_dir(model: &str) -> Result<PathBuf, RuntimeError> {
    Ok(checkpoint::store::resolve(model, true)?)
}

/// The name a model is shown under: a directory's last component, the
/// store id a short name or another case names, else the id as given.
pub fn display_name(model: &str) -> String {
    let path = Path::new(model);
    if path.is_dir()
        && let Some(name) = path.file_name()
    {
        return name.to_string_lossy().into_owned();
    }
    let store = checkpoint::store::Store::default_home();
    if let Some(id) = store.stored_id(model) {
        return id;
    }
    checkpoint::store::canonical_id(model).map_or_else(|| model.to_string(), str::to_string)
}

/// Lowers the model's context to `max_model_len`; longer than the model
/// was trained for is refused.
pub(crate) fn cap_context(
    cfg: &mut contract::ModelConfig,
    max_model_len: Option<usize>,
) -> Result<(), RuntimeError> {
    let Some(n) = max_model_len else {
        return Ok(());
    };
    let trained = cfg.max_position_embeddings;
    if n > trained {
        invalid!(
            "invalid `--max-model-len {n}`: the model's context is {trained} tokens (max_position_embeddings); give at most {trained}"
        );
    }
    cfg.max_position_embeddings = n;
    Ok(())
}

/// Whether `device` resolves to the CUDA backend (an error when CUDA is
/// asked for and unavailable).
pub(crate) fn use_cuda(device: Device) -> Result<bool, RuntimeError> {
    Ok(match device {
        Device::Cpu => false,
        Device::Cuda => {
            if let Err(why) = model::cuda::available() {
                return Err(RuntimeError::Device(format!(
                    "--device cuda is unavailable: {why}"
                )));
            }
            true
        }
        Device::Auto => model::cuda::available().is_ok(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decode_split_that_is_not_a_positive_multiple_of_the_granule_is_refused_by_name() {
        let mut opts = RuntimeOptions::default();
        assert!(check_settings(&opts).is_ok());
        for bad in [0, 24, 100] {
            opts.cuda.decode_min_chunk = Some(bad);
            let e = check_settings(&opts).unwrap_err().to_string();
            assert!(
                e.contains("`--decode-min-chunk`") && e.contains(&bad.to_string()),
                "{e}"
            );
        }
        opts.cuda.decode_min_chunk = Some(32);
        assert!(check_settings(&opts).is_ok());
    }
}
