//! The LoRA flags every engine-building command shares: `--lora` (an
//! adapter to load at start, `NAME=PATH` or `PATH`), `--max-loras`
//! (adapter slots resident at once), `--max-loaded-loras` and
//! `--max-lora-memory-mib` (adapters held in memory) and `--max-lora-rank`,
//! and the loader that reads a PEFT adapter (local directory or Hugging
//! Face repo id) for them and for the server's `load_lora_adapter`, loads
//! of identical files sharing one adapter. A bad value is refused at start
//! naming the flag. Both backends run adapters; on CUDA the slots are a
//! device pool sized from `--max-loras` and `--max-lora-rank` at start.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use checkpoint::lora::{AdapterCache, LoadLimits, LoraLoadError};
use engine::lora::{DEFAULT_MAX_LOADED_LORAS, DEFAULT_MAX_LORA_MEMORY_MIB, LoraLimits};

use anyhow::{Context, Result, bail};
use contract::LoraAdapter;
use contract::ModelConfig;
use contract::lora::DEFAULT_MAX_LORA_RANK;

/// LoRA flags.
#[derive(clap::Args, Clone, Debug)]
pub struct LoraArgs {
    /// A LoRA adapter to load at start, in the PEFT layout
    /// (`adapter_config.json` + `adapter_model.safetensors`): `NAME=PATH`,
    /// PATH a directory or a Hugging Face repo id; requests pick it by
    /// `model: NAME` (`generate` runs its one adapter; a bare PATH is named
    /// by its last component). Repeatable, or comma-separated.
    #[arg(
        long = "lora",
        value_name = "NAME=PATH",
        env = "LAMINA_LORA",
        value_delimiter = ','
    )]
    pub lora: Vec<String>,
    /// LoRA adapters resident at once (backend slots); a request whose
    /// adapter finds every slot busy waits. [default: the number of
    /// --lora adapters; 0 without any: LoRA off, `load_lora_adapter`
    /// refused]
    #[arg(long, env = "LAMINA_MAX_LORAS")]
    pub max_loras: Option<usize>,
    /// Highest LoRA rank accepted (`r` of `adapter_config.json`).
    #[arg(long, default_value_t = DEFAULT_MAX_LORA_RANK, env = "LAMINA_MAX_LORA_RANK",
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=4096))]
    pub max_lora_rank: usize,
    /// LoRA adapters held in memory at once (`--lora` and
    /// `load_lora_adapter` together); a load past it is refused (vLLM's
    /// --max-cpu-loras, which evicts instead).
    #[arg(long, default_value_t = DEFAULT_MAX_LOADED_LORAS, env = "LAMINA_MAX_LOADED_LORAS")]
    pub max_loaded_loras: usize,
    /// MiB the loaded LoRA adapters may take together (their f32 weights;
    /// an adapter loaded under several names from identical files counts
    /// once); a load past it is refused.
    #[arg(long, default_value_t = DEFAULT_MAX_LORA_MEMORY_MIB, env = "LAMINA_MAX_LORA_MEMORY_MIB")]
    pub max_lora_memory_mib: u64,
}

impl Default for LoraArgs {
    fn default() -> Self {
        LoraArgs {
            lora: Vec::new(),
            max_loras: None,
            max_lora_rank: DEFAULT_MAX_LORA_RANK,
            max_loaded_loras: DEFAULT_MAX_LOADED_LORAS,
            max_lora_memory_mib: DEFAULT_MAX_LORA_MEMORY_MIB,
        }
    }
}

impl LoraArgs {
    /// Adapter slots for the engine.
    pub fn slots(&self) -> usize {
        self.max_loras.unwrap_or(self.lora.len())
    }

    /// The engine's bounds on loaded adapters.
    pub fn limits(&self) -> LoraLimits {
        LoraLimits {
            max_loaded: self.max_loaded_loras,
            max_bytes: self.max_lora_memory_mib.saturating_mul(1 << 20),
        }
    }

    /// The loader's bounds, `deadline` from now.
    fn load_limits(&self, deadline: Option<Duration>) -> LoadLimits {
        LoadLimits {
            max_rank: self.max_lora_rank,
            max_memory: self.limits().max_bytes,
            deadline: deadline.map(|d| Instant::now() + d),
        }
    }

    /// `(name, path)` of each `--lora`.
    pub fn specs(&self) -> Result<Vec<(String, String)>> {
        let mut out: Vec<(String, String)> = Vec::new();
        for spec in &self.lora {
            let (name, path) = split_spec(spec);
            if name.is_empty() || path.is_empty() {
                bail!("invalid `--lora {spec}`: expected NAME=PATH or PATH");
            }
            if out.iter().any(|(n, _)| *n == name) {
                bail!("invalid `--lora {spec}`: the name `{name}` is given twice");
            }
            out.push((name, path));
        }
        if self.slots() == 0 && !out.is_empty() {
            bail!("invalid `--max-loras 0` with --lora adapters: give at least 1 slot");
        }
        if out.len() > self.max_loaded_loras {
            bail!(
                "{} --lora adapters, more than --max-loaded-loras {} allows",
                out.len(),
                self.max_loaded_loras
            );
        }
        Ok(out)
    }

    /// Reads every `--lora` adapter for model `c`, errors naming the flag.
    pub fn load_all(&self, c: &ModelConfig) -> Result<Vec<(String, Arc<LoraAdapter>)>> {
        let cache = AdapterCache::default();
        let limits = self.load_limits(None);
        self.specs()?
            .into_iter()
            .map(|(name, path)| {
                let a = load_adapter(&cache, &path, c, &limits)
                    .with_context(|| format!("`--lora {name}={path}`"))?;
                Ok((name, a))
            })
            .collect()
    }

    /// The server's adapter loader (`load_lora_adapter`) for model `c`:
    /// identical files share one adapter, each load gets `timeout`, and
    /// errors are one line that tells nothing of paths it cannot read
    /// ([`LoraLoadError::public`]).
    pub fn loader(&self, c: ModelConfig, timeout: Duration) -> server::LoraLoader {
        let cache = Arc::new(AdapterCache::default());
        let args = self.clone();
        Arc::new(move |path: &str| {
            load_adapter(&cache, path, &c, &args.load_limits(Some(timeout)))
                .map_err(|e| e.public(path))
        })
    }
}

/// The adapter a one-request command (`generate`, `chat`) runs: the one
/// `--lora` loaded, or the base model.
pub fn single(engine: &engine::Engine) -> Option<String> {
    let names = engine.loras().names();
    match names.as_slice() {
        [one] => Some(one.clone()),
        _ => None,
    }
}

/// `(name, path)` of a `--lora` value: `NAME=PATH` when the part before the
/// first `=` names no path, else the whole value as the path, named by its
/// last component.
fn split_spec(spec: &str) -> (String, String) {
    match spec.split_once('=') {
        Some((n, p)) if !n.contains('/') && !n.contains(std::path::MAIN_SEPARATOR) => {
            (n.to_string(), p.to_string())
        }
        _ => {
            let name = Path::new(spec.trim_end_matches('/'))
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            (name, spec.to_string())
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_split_names_and_paths() {
        let a = LoraArgs {
            lora: vec![
                "sql=/a/b".into(),
                "/x/y/z-adapter/".into(),
                "org/repo".into(),
            ],
            ..LoraArgs::default()
        };
        let s = a.specs().unwrap();
        assert_eq!(s[0], ("sql".into(), "/a/b".into()));
        assert_eq!(s[1], ("z-adapter".into(), "/x/y/z-adapter/".into()));
        assert_eq!(s[2], ("repo".into(), "org/repo".into()));
        assert_eq!(a.slots(), 3);
        let dup = LoraArgs {
            lora: vec!["a=/p".into(), "a=/q".into()],
            ..LoraArgs::default()
        };
        assert!(dup.specs().unwrap_err().to_string().contains("given twice"));
        let zero = LoraArgs {
            lora: vec!["a=/p".into()],
            max_loras: Some(0),
            ..LoraArgs::default()
        };
        assert!(
            zero.specs()
                .unwrap_err()
                .to_string()
                .contains("--max-loras 0")
        );
    }
}
