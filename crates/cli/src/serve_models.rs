//! The models of one `lamina serve`: the positional list
//! (`lamina serve A B ...`) or a models file (`--models-file`, TOML or
//! JSON: each model's `name`, `source` and own options), their memory plan
//! and the loader the server calls to load each one (again) at run time.
//!
//! Memory plan: every model has its own KV pool. The KV budget (on the
//! CPU `--kv-memory-gib`, default 2 GiB; on CUDA `--gpu-memory-utilization`
//! of the GPU, or `--kv-memory-gib` when given) is split by each model's
//! `share`: the shares a models file gives, the rest split evenly among
//! the models that give none. Before a load, the model's weights (the
//! size of its files) and KV pool are checked against the memory free
//! (the host's `MemAvailable` on the CPU); a model that does not fit is
//! refused naming both.

mod gpu_share;

pub use gpu_share::GpuShare;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use serde::Deserialize;

use crate::setup::{DeviceArg, ModelArgs};

/// One model of a models file (or of the positional list).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// The name requests use (default: the source's display name).
    #[serde(default)]
    pub name: Option<String>,
    /// What to open: a store id, a Hugging Face repo, a directory or a .gguf.
    pub source: String,
    /// Its part of the KV budget (0-1].
    #[serde(default)]
    pub share: Option<f64>,
    /// `cpu`, `cuda` or `auto` (default: `--device`).
    #[serde(default)]
    pub device: Option<String>,
    /// LoRA adapters loaded with it, `NAME=PATH` as `--lora`.
    #[serde(default)]
    pub lora: Vec<String>,
    /// Its longest sequence (default: `--max-model-len`).
    #[serde(default)]
    pub max_model_len: Option<usize>,
    /// Load it at start-up (default: true, within `--max-loaded-models`).
    #[serde(default)]
    pub preload: Option<bool>,
}

impl ModelSpec {
    fn of(source: &str) -> ModelSpec {
        ModelSpec {
            name: None,
            source: source.to_string(),
            share: None,
            device: None,
            lora: Vec::new(),
            max_model_len: None,
            preload: None,
        }
    }
}

/// Reads a models file: TOML when its name ends in `.toml`, else JSON.
/// The models are a `models` list (TOML's `[[models]]` tables) or, in
/// JSON, the list alone; an error names the model's unknown or wrong field.
pub fn read_file(path: &Path) -> Result<Vec<ModelSpec>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read `--models-file` {}", path.display()))?;
    let toml = path.extension().is_some_and(|e| e == "toml");
    let mut value = if toml {
        toml_to_json(&text)
            .with_context(|| format!("`--models-file` {} is not TOML", path.display()))?
    } else {
        serde_json::from_str(&text)
            .with_context(|| format!("`--models-file` {} is not JSON", path.display()))?
    };
    let list = match value.get_mut("models") {
        Some(models) => models.take(),
        None => value,
    };
    let specs: Vec<ModelSpec> = serde_json::from_value(list).with_context(|| {
        format!(
            "`--models-file` {}: expected a list of models, each with `source` and optionally \
             `name`, `share`, `device`, `lora`, `max_model_len`, `preload`",
            path.display()
        )
    })?;
    if specs.is_empty() {
        bail!("`--models-file` {} lists no model", path.display());
    }
    Ok(specs)
}

/// A TOML document as the JSON value of the same tree.
fn toml_to_json(text: &str) -> Result<serde_json::Value> {
    let doc: toml_edit::DocumentMut = text.parse()?;
    Ok(item_json(doc.as_item()))
}

fn item_json(item: &toml_edit::Item) -> serde_json::Value {
    use serde_json::Value;
    match item {
        toml_edit::Item::None => Value::Null,
        toml_edit::Item::Value(v) => value_json(v),
        toml_edit::Item::Table(t) => Value::Object(
            t.iter()
                .map(|(k, v)| (k.to_string(), item_json(v)))
                .collect(),
        ),
        toml_edit::Item::ArrayOfTables(a) => Value::Array(
            a.iter()
                .map(|t| {
                    Value::Object(
                        t.iter()
                            .map(|(k, v)| (k.to_string(), item_json(v)))
                            .collect(),
                    )
                })
                .collect(),
        ),
    }
}

fn value_json(v: &toml_edit::Value) -> serde_json::Value {
    use serde_json::{Value, json};
    match v {
        toml_edit::Value::String(s) => json!(s.value()),
        toml_edit::Value::Integer(i) => json!(i.value()),
        toml_edit::Value::Float(f) => json!(f.value()),
        toml_edit::Value::Boolean(b) => json!(b.value()),
        toml_edit::Value::Datetime(d) => json!(d.value().to_string()),
        toml_edit::Value::Array(a) => Value::Array(a.iter().map(value_json).collect()),
        toml_edit::Value::InlineTable(t) => Value::Object(
            t.iter()
                .map(|(k, v)| (k.to_string(), value_json(v)))
                .collect(),
        ),
    }
}

/// The models to serve: the file's, else the positional words (the
/// first is `--model`'s).
pub fn specs(first: &str, more: &[String], file: Option<&PathBuf>) -> Result<Vec<ModelSpec>> {
    match file {
        Some(path) => {
            if !more.is_empty() {
                bail!(
                    "give the models either as words after `serve` or in `--models-file`, not both"
                );
            }
            read_file(path)
        }
        None => Ok(std::iter::once(first)
            .chain(more.iter().map(String::as_str))
            .map(ModelSpec::of)
            .collect()),
    }
}

/// Each model's share of the KV budget: its own, or an even split of
/// what the others leave. Errors name the model and the value.
pub fn shares(specs: &[ModelSpec]) -> Result<Vec<f64>> {
    let mut given = 0.0;
    for s in specs {
        if let Some(v) = s.share {
            if !(v > 0.0 && v <= 1.0) {
                bail!(
                    "invalid `share` {v} of model `{}`: must be in (0, 1]",
                    s.source
                );
            }
            given += v;
        }
    }
    if given > 1.0 + 1e-9 {
        bail!("the models' `share`s add up to {given:.3}, more than 1");
    }
    let unset = specs.iter().filter(|s| s.share.is_none()).count();
    if unset > 0 && given >= 1.0 - 1e-9 {
        bail!(
            "the given `share`s take the whole KV budget: nothing is left for the models without one"
        );
    }
    let rest = if unset == 0 {
        0.0
    } else {
        (1.0 - given) / unset as f64
    };
    Ok(specs.iter().map(|s| s.share.unwrap_or(rest)).collect())
}

/// The flags of model `spec` (the `index`th of `count`) with share
/// `share`: `base` with its source, device, adapters, context and KV
/// budget. `--lora` adapters go with the first model only (their names
/// would clash on the others).
pub fn model_args(
    base: &ModelArgs,
    spec: &ModelSpec,
    share: f64,
    (index, count): (usize, usize),
) -> Result<ModelArgs> {
    use clap::ValueEnum;
    let several = count > 1;
    let mut args = base.clone();
    args.model = spec.source.clone();
    if index > 0 {
        args.lora.lora.clear();
    }
    if let Some(d) = &spec.device {
        args.device = DeviceArg::from_str(d, true).map_err(|_| {
            anyhow::anyhow!(
                "invalid `device` `{d}` of model `{}`: expected cpu, cuda or auto",
                spec.source
            )
        })?;
    }
    if !spec.lora.is_empty() {
        args.lora.lora = spec.lora.clone();
    }
    if spec.max_model_len.is_some() {
        args.max_model_len = spec.max_model_len;
    }
    if several && args.kv_blocks.is_none() {
        match args.kv_memory_gib {
            Some(g) => args.kv_memory_gib = Some(g * share),
            None if args.device == DeviceArg::Cpu || model::cuda::available().is_err() => {
                args.kv_memory_gib = Some(runtime::CPU_KV_MEMORY_GIB * share);
            }
            None => args.gpu_memory_utilization *= share,
        }
    }
    Ok(args)
}

/// Bytes of a model's weights: the size of its weight files in the store.
pub fn weights_bytes(source: &str) -> u64 {
    let Ok(dir) = runtime::model_dir(source) else {
        return 0;
    };
    let files = if dir.is_file() {
        vec![dir]
    } else {
        std::fs::read_dir(&dir)
            .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default()
    };
    files
        .iter()
        .filter(|p| {
            p.extension()
                .is_some_and(|e| e == "safetensors" || e == "gguf" || e == "bin")
        })
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum()
}

/// Bytes of memory the host has free (`MemAvailable`), if it says.
pub fn host_free_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Refuses a model whose weights and KV pool need more memory than is
/// free: on the CPU the host's, on CUDA (with the pool sized by
/// `--kv-memory-gib`) each GPU's its engines go on. A pool sized from
/// `--gpu-memory-utilization` is checked by the runtime's memory plan.
pub fn check_fits(
    name: &str,
    args: &ModelArgs,
    replicas: &runtime::ReplicaPlan,
) -> Result<(), server::LoadError> {
    let cpu = args.device == DeviceArg::Cpu || model::cuda::available().is_err();
    let weights = weights_bytes(&args.model);
    let engine = |kv_gib: f64| weights.saturating_add((kv_gib * (1u64 << 30) as f64) as u64);
    if cpu {
        let Some(free) = host_free_bytes() else {
            return Ok(());
        };
        let needed = engine(args.kv_memory_gib.unwrap_or(runtime::CPU_KV_MEMORY_GIB));
        return fits(name, "host", needed, free, HOST_HINT);
    }
    let Some(kv) = args.kv_memory_gib.filter(|_| args.kv_blocks.is_none()) else {
        return Ok(());
    };
    for (ordinal, engines) in gpu_engines(replicas) {
        // a device that cannot be read is reported when its engine opens
        let Ok((free, _)) = model::cuda::memory_info(ordinal) else {
            continue;
        };
        let needed = engine(kv).saturating_mul(engines as u64);
        fits(name, "GPU", needed, free as u64, GPU_HINT)?;
    }
    Ok(())
}

const HOST_HINT: &str = "; unload another model, lower its `share` or `--kv-memory-gib`";
const GPU_HINT: &str =
    "; unload another model, lower its `share` or `--kv-memory-gib`, or free the GPU";

/// `DoesNotFit` naming `needed` and `free` when `needed` is more.
fn fits(
    name: &str,
    where_: &'static str,
    needed: u64,
    free: u64,
    hint: &str,
) -> Result<(), server::LoadError> {
    if needed <= free {
        return Ok(());
    }
    Err(server::LoadError::DoesNotFit {
        model: name.to_string(),
        where_,
        needed,
        free,
        hint: hint.into(),
    })
}

/// Each CUDA device of `replicas` with the number of engines it hosts.
fn gpu_engines(replicas: &runtime::ReplicaPlan) -> Vec<(usize, usize)> {
    let ordinals: Vec<usize> = match replicas {
        runtime::ReplicaPlan::Gpus(g) => g.clone(),
        runtime::ReplicaPlan::Count(n) => (0..*n).collect(),
    };
    let mut out: Vec<(usize, usize)> = Vec::new();
    for o in ordinals {
        match out.iter_mut().find(|(d, _)| *d == o) {
            Some(entry) => entry.1 += 1,
            None => out.push((o, 1)),
        }
    }
    out
}

/// Everything a model's (re)load needs, shared by its loader calls.
pub struct LoadPlan {
    pub name: String,
    pub args: ModelArgs,
    pub max_queue: usize,
    pub replicas: runtime::ReplicaPlan,
    pub reasoning_parser: Option<server::reasoning::ReasoningParser>,
    pub lora_timeout: std::time::Duration,
    /// Its part of a GPU shared with the server's other models, when its
    /// KV pool is sized from `--gpu-memory-utilization`.
    pub gpu_share: Option<GpuShare>,
    /// The tokenizer of its first load, kept for every reload.
    pub tokenizer: std::sync::OnceLock<Arc<tokenizer::Tokenizer>>,
}

/// The server's GPU budget before any model loads, as a share of 1 (each
/// model's [`GpuShare`] is this with its own `share`): `None` with one
/// model, on the CPU, or when a flag sizes the KV pools.
pub fn gpu_budget_at_start(
    base: &ModelArgs,
    replicas: &runtime::ReplicaPlan,
    several: bool,
) -> Option<GpuShare> {
    let sized = base.kv_blocks.is_some() || base.kv_memory_gib.is_some();
    if !several || sized || base.device == DeviceArg::Cpu {
        return None;
    }
    let (device, _) = *gpu_engines(replicas).first()?;
    GpuShare::at_start(device, 1.0, base.gpu_memory_utilization)
}

/// A model's own [`GpuShare`] of the server's `budget` (none on the CPU).
pub fn gpu_share(budget: Option<GpuShare>, args: &ModelArgs, share: f64) -> Option<GpuShare> {
    let on_gpu = args.device != DeviceArg::Cpu;
    budget.filter(|_| on_gpu).map(|b| GpuShare { share, ..b })
}

/// Opens `plan`'s model: its fit checked; on a GPU shared with the
/// server's other models, with the utilization that leaves it its share.
pub fn open(plan: &LoadPlan) -> Result<runtime::Runtime, server::LoadError> {
    let failed = |e: anyhow::Error| server::LoadError::Failed {
        model: plan.name.clone(),
        reason: format!("{e:#}"),
    };
    check_fits(&plan.name, &plan.args, &plan.replicas)?;
    let mut args = plan.args.clone();
    if let Some(u) = plan.gpu_share.and_then(|s| s.utilization_now()) {
        args.gpu_memory_utilization = u;
    }
    let opts = (args.runtime_options(plan.max_queue, plan.replicas.clone())).map_err(failed)?;
    let kept = plan.tokenizer.get().cloned();
    let rt =
        runtime::Runtime::open_reusing(&args.model, opts, kept).map_err(|e| failed(e.into()))?;
    plan.tokenizer.get_or_init(|| rt.tokenizer.clone());
    Ok(rt)
}

/// The server's loader of `plan`'s model.
pub fn loader(plan: Arc<LoadPlan>) -> server::Loader {
    Arc::new(move || load(&plan))
}

/// Opens the model of `plan` and wraps its engines for the server.
pub fn load(plan: &LoadPlan) -> Result<server::Served, server::LoadError> {
    let failed = |e: anyhow::Error| server::LoadError::Failed {
        model: plan.name.clone(),
        reason: format!("{e:#}"),
    };
    // (no malloc_trim around it: what an unload frees under the allocator's
    // mmap threshold stays in its arenas for the next load, which would
    // fault it in again; `runtime::tune_host_allocator`)
    let rt = open(plan)?;
    served(plan, rt).map_err(failed)
}

/// A started runtime as the server's model.
pub fn served(plan: &LoadPlan, rt: runtime::Runtime) -> Result<server::Served> {
    let lora_loader = plan
        .args
        .lora
        .loader(rt.model.config.clone(), plan.lora_timeout)?;
    let kv = (rt.sizing.kv_bytes as u64).saturating_mul(rt.sizing.replicas as u64);
    let weights = weights_bytes(&plan.args.model).saturating_mul(rt.sizing.replicas as u64);
    let mut engines = vec![rt.engine];
    engines.extend(rt.replicas);
    // each engine's grammar engine (the token trie) built in the background,
    // so the first constrained request does not build it on an async worker
    for e in &engines {
        let e = e.clone();
        std::thread::spawn(move || {
            if let Err(why) = e.check_constraint(&engine::Constraint::JsonObject) {
                tracing::warn!(%why, "constrained decoding is unavailable for this model");
            }
        });
    }
    let replicas = server::Replicas::new(engines).map_err(anyhow::Error::msg)?;
    Ok(server::Served {
        defaults: rt.model.generation.clone(),
        reasoning_parser: plan.reasoning_parser,
        lora_loader: Some(lora_loader),
        memory: server::Memory { weights, kv },
        ..server::Served::new(replicas, rt.tokenizer)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_split_what_is_left_evenly() {
        let mut a = ModelSpec::of("a");
        a.share = Some(0.5);
        let (b, c) = (ModelSpec::of("b"), ModelSpec::of("c"));
        assert_eq!(shares(&[a.clone(), b, c]).unwrap(), [0.5, 0.25, 0.25]);
        a.share = Some(1.5);
        let e = shares(&[a]).unwrap_err().to_string();
        assert!(e.contains("`share` 1.5 of model `a`"), "{e}");
    }

    #[test]
    fn a_model_past_the_free_memory_is_refused_naming_both() {
        assert!(fits("m", "GPU", 10, 10, "").is_ok());
        let e = fits("big", "GPU", 3 << 30, 1 << 30, GPU_HINT)
            .unwrap_err()
            .to_string();
        assert!(e.contains("model `big` does not fit"), "{e}");
        assert!(e.contains("of GPU memory") && e.contains("is free"), "{e}");
        assert!(e.contains("3072") && e.contains("1024"), "{e}");
    }

    #[test]
    fn engines_are_counted_per_gpu() {
        use runtime::ReplicaPlan;
        assert_eq!(gpu_engines(&ReplicaPlan::Count(2)), [(0, 1), (1, 1)]);
        assert_eq!(
            gpu_engines(&ReplicaPlan::Gpus(vec![0, 0, 1])),
            [(0, 2), (1, 1)]
        );
    }

    #[test]
    fn toml_and_json_files_read_alike() {
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path().join("m.toml");
        std::fs::write(
            &t,
            "[[models]]\nname = \"small\"\nsource = \"llama-tiny\"\nshare = 0.25\nlora = [\"a=/x\"]\n\n[[models]]\nsource = \"smollm2-135m\"\n",
        )
        .unwrap();
        let j = dir.path().join("m.json");
        std::fs::write(
            &j,
            r#"[{"name": "small", "source": "llama-tiny", "share": 0.25, "lora": ["a=/x"]}, {"source": "smollm2-135m"}]"#,
        )
        .unwrap();
        for p in [t, j] {
            let s = read_file(&p).unwrap();
            assert_eq!(s.len(), 2);
            assert_eq!(s[0].name.as_deref(), Some("small"));
            assert_eq!(s[0].share, Some(0.25));
            assert_eq!(s[0].lora, ["a=/x"]);
            assert_eq!(s[1].source, "smollm2-135m");
        }
        let bad = dir.path().join("bad.json");
        std::fs::write(&bad, r#"[{"source": "x", "colour": "red"}]"#).unwrap();
        let e = format!("{:#}", read_file(&bad).unwrap_err());
        assert!(e.contains("colour"), "{e}");
    }
}
