//! Reading PEFT LoRA adapters (a local directory or a Hugging Face repo
//! id) for [`LoraOptions::adapters`] at start and for a server's loads
//! later ([`adapter_loader`]), within the options' rank and memory bounds;
//! loads of identical files share one adapter.

use std::sync::Arc;
use std::time::{Duration, Instant};

use checkpoint::lora::{AdapterCache, LoadLimits, LoraLoadError};
use contract::{LoraAdapter, ModelConfig};

use crate::error::{Context, RuntimeError};
use crate::options::LoraOptions;

/// A loader of adapters by path, for a server's `load_lora_adapter`.
pub type AdapterLoader = Arc<dyn Fn(&str) -> Result<Arc<LoraAdapter>, String> + Send + Sync>;

/// Reads every adapter of `opts` for model `c`; an error names the adapter.
pub(crate) fn load_all(
    opts: &LoraOptions,
    c: &ModelConfig,
) -> Result<Vec<(String, Arc<LoraAdapter>)>, RuntimeError> {
    let cache = AdapterCache::default();
    let limits = load_limits(opts, None);
    (opts.adapters.iter())
        .map(|(name, path)| {
            let a = load_adapter(&cache, path, c, &limits)
                .with_context(|| format!("`--lora {name}={path}`"))?;
            Ok((name.clone(), a))
        })
        .collect()
}

/// The adapter loader for model `c`: identical files share one adapter,
/// each load gets `timeout`, and errors are one line that tells nothing of
/// paths it cannot read ([`LoraLoadError::public`]).
pub fn adapter_loader(opts: &LoraOptions, c: ModelConfig, timeout: Duration) -> AdapterLoader {
    let cache = Arc::new(AdapterCache::default());
    let opts = opts.clone();
    Arc::new(move |path: &str| {
        load_adapter(&cache, path, &c, &load_limits(&opts, Some(timeout)))
            .map_err(|e| e.public(path))
    })
}

/// The loader's bounds, `deadline` from now.
fn load_limits(opts: &LoraOptions, deadline: Option<Duration>) -> LoadLimits {
    LoadLimits {
        max_rank: opts.max_lora_rank,
        max_memory: opts.limits().max_bytes,
        deadline: deadline.map(|d| Instant::now() + d),
    }
}

/// Reads the PEFT adapter at `path` (a directory or a Hugging Face repo id)
/// checked against model `c` within `limits`, through `cache`.
fn load_adapter(
    cache: &AdapterCache,
    path: &str,
    c: &ModelConfig,
    limits: &LoadLimits,
) -> Result<Arc<LoraAdapter>, LoraLoadError> {
    let dir = checkpoint::lora::resolve_adapter(path)?;
    cache.load(&dir, c, limits)
}
