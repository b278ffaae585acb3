//! The LoRA flags every engine-building command shares: `--lora` (an
//! adapter to load at start, `NAME=PATH` or `PATH`), `--max-loras`
//! (adapter slots resident at once) and `--max-lora-rank`, and the loader
//! that reads a PEFT adapter (local directory or Hugging Face repo id) for
//! them and for the server's `load_lora_adapter`. A bad value is refused at
//! start naming the flag. Both backends run adapters; on CUDA the slots are
//! a device pool sized from `--max-loras` and `--max-lora-rank` at start.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use contract::LlamaConfig;
use contract::LoraAdapter;
use contract::lora::DEFAULT_MAX_LORA_RANK;

/// LoRA flags.
#[derive(clap::Args, Clone, Debug, Default)]
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
}

impl LoraArgs {
    /// Adapter slots for the engine.
    pub fn slots(&self) -> usize {
        self.max_loras.unwrap_or(self.lora.len())
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
        Ok(out)
    }

    /// Reads every `--lora` adapter for model `c`, errors naming the flag.
    pub fn load_all(&self, c: &LlamaConfig) -> Result<Vec<(String, Arc<LoraAdapter>)>> {
        self.specs()?
            .into_iter()
            .map(|(name, path)| {
                let a = load_adapter(&path, c, self.max_lora_rank)
                    .with_context(|| format!("`--lora {name}={path}`"))?;
                Ok((name, a))
            })
            .collect()
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
/// checked against model `c` with ranks up to `max_rank`.
pub fn load_adapter(path: &str, c: &LlamaConfig, max_rank: usize) -> Result<Arc<LoraAdapter>> {
    let dir = checkpoint::lora::resolve_adapter(path)?;
    Ok(Arc::new(checkpoint::lora::load_adapter(&dir, c, max_rank)?))
}

/// The server's adapter loader (`load_lora_adapter`): [`load_adapter`]
/// for model `c`, errors as one line.
pub fn loader(c: LlamaConfig, max_rank: usize) -> server::LoraLoader {
    Arc::new(move |path: &str| load_adapter(path, &c, max_rank).map_err(|e| format!("{e:#}")))
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
