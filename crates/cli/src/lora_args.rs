//! The LoRA flags every engine-building command shares: `--lora` (an
//! adapter to load at start, `NAME=PATH` or `PATH`), `--max-loras`
//! (adapter slots resident at once), `--max-loaded-loras` and
//! `--max-lora-memory-mib` (adapters held in memory) and `--max-lora-rank`,
//! mapped onto `runtime::LoraOptions` (the runtime reads the PEFT adapters,
//! at start and for the server's `load_lora_adapter`). A bad value is
//! refused at start naming the flag. Both backends run adapters; on CUDA the slots are a
//! device pool sized from `--max-loras` and `--max-lora-rank` at start.

use std::path::Path;
use std::time::Duration;

use anyhow::{Result, bail};
use contract::ModelConfig;
use contract::lora::DEFAULT_MAX_LORA_RANK;
use engine::lora::{DEFAULT_MAX_LOADED_LORAS, DEFAULT_MAX_LORA_MEMORY_MIB};
use runtime::LoraOptions;

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
        let d = LoraOptions::default();
        LoraArgs {
            lora: Vec::new(),
            max_loras: d.max_loras,
            max_lora_rank: d.max_lora_rank,
            max_loaded_loras: d.max_loaded_loras,
            max_lora_memory_mib: d.max_lora_memory_mib,
        }
    }
}

impl LoraArgs {
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
        if self.max_loras == Some(0) && !out.is_empty() {
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

    /// The runtime's LoRA options; an error naming the flag refused.
    pub fn options(&self) -> Result<LoraOptions> {
        Ok(LoraOptions {
            adapters: self.specs()?,
            max_loras: self.max_loras,
            max_lora_rank: self.max_lora_rank,
            max_loaded_loras: self.max_loaded_loras,
            max_lora_memory_mib: self.max_lora_memory_mib,
        })
    }

    /// The server's adapter loader (`load_lora_adapter`) for model `c`,
    /// each load within `timeout` (`runtime::adapter_loader`).
    pub fn loader(&self, c: ModelConfig, timeout: Duration) -> Result<server::LoraLoader> {
        Ok(runtime::adapter_loader(&self.options()?, c, timeout))
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
        assert_eq!(a.options().unwrap().slots(), 3);
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
