//! [`Runtime::open`]: a model name to started engines. Resolve the model,
//! plan memory (the draft model's share, LoRA adapters, each replica's KV
//! pool), open one backend per replica and start an engine on each.
//! [`BackendAlone::open`] stops at the backend, for tools that drive it
//! directly (perplexity).

use std::borrow::Cow;
use std::path::PathBuf;
use std::sync::Arc;

use checkpoint::loader::LoadedModel;
use contract::{Backend, LoraAdapter};
use engine::speculate::DraftModel;
use engine::{Engine, EngineConfig, SpecConfig, SpecMethod};
use tokenizer::Tokenizer;

use crate::backend::{OpenBackend, check_cpu_replicas, open_backend};
use crate::draft::DraftPlan;
use crate::error::{Context, RuntimeError, invalid};
use crate::kv_sizing::{GpuMemoryPlan, gpu_memory_at_start};
use crate::options::{
    CPU_MAX_BATCH_TOKENS, CPU_MAX_STEP_MS, CUDA_MAX_BATCH_TOKENS, ReplicaPlan, RuntimeOptions,
};
use crate::resolve::{Resolved, display_name, resolve};
use crate::sizing::Sizing;
use crate::weights::{cpu_weights, load_weights};

/// A model opened and its engines started, ready for requests.
pub struct Runtime {
    pub engine: Engine,
    /// The further replicas of a data-parallel plan (none for one engine).
    pub replicas: Vec<Engine>,
    pub tokenizer: Arc<Tokenizer>,
    pub model: LoadedModel,
    /// The name shown to API clients (the id, or the directory's name).
    pub model_id: String,
    /// Most tokens in one engine step (the prefill chunk of a lone request).
    pub max_batch_tokens: usize,
    /// Whether the model runs on the CUDA backend.
    pub cuda: bool,
    /// The GGUF whose quantised blocks the CPU backend multiplies, if any.
    pub weights_gguf: Option<PathBuf>,
    /// The backend's name (device, kernels, weight format).
    pub backend_name: String,
    /// What was sized at start-up, for the log.
    pub sizing: Sizing,
    /// The weights' bytes as the (first) backend holds them.
    pub weight_bytes: model::WeightBytes,
}

/// The backends of a runtime before their engines start.
struct Backends {
    /// Each backend with its speculative decoding setting.
    each: Vec<(Box<dyn Backend>, Option<SpecConfig>)>,
    /// The GGUF whose quantised blocks the CPU backends multiply, if any.
    gguf: Option<PathBuf>,
    /// The last one's name, KV pool and weights' bytes (every replica is
    /// sized alike).
    name: String,
    kv_blocks: usize,
    kv_bytes: usize,
    weights: model::WeightBytes,
}

impl Runtime {
    /// Opens the model `source` names (a store id, fetched on first use; a
    /// Hugging Face repo `org/name[@revision]`; a directory in Hugging Face
    /// layout; a .gguf file, imported into the store once) and starts one
    /// engine per replica of `opts.replicas`, each with its own backend
    /// and step loop. With several, an engine whose backend fails halts
    /// (`EngineConfig::halt_on_backend_error`) so a server takes it out of
    /// rotation.
    pub fn open(source: &str, opts: RuntimeOptions) -> Result<Runtime, RuntimeError> {
        Self::open_reusing(source, opts, None)
    }

    /// [`Runtime::open`] with the tokenizer an earlier open of the same
    /// model returned (a server reloading a model it unloaded), so its
    /// files are not read and parsed again.
    pub fn open_reusing(
        source: &str,
        opts: RuntimeOptions,
        tokenizer: Option<Arc<Tokenizer>>,
    ) -> Result<Runtime, RuntimeError> {
        let t0 = std::time::Instant::now();
        let r = resolve(source, &opts, tokenizer)?;
        let resolved = t0.elapsed();
        let draft = crate::draft::plan(&opts, &r.loaded, &r.tokenizer)?;
        // the adapters are read (and refused) before the weights load
        let adapters = crate::lora::load_all(&opts.lora, &r.loaded.config)?;
        let devices = devices(&opts, &r)?;
        let backends = open_backends(&opts, &r, &devices, draft.as_ref())?;
        let opened = t0.elapsed();
        let max_batch_tokens = (opts.engine.max_batch_tokens).unwrap_or(if r.cuda {
            CUDA_MAX_BATCH_TOKENS
        } else {
            CPU_MAX_BATCH_TOKENS
        });
        let replicas = backends.each.len();
        let sizing = Sizing {
            kv_blocks: backends.kv_blocks,
            kv_dtype: opts.kv.dtype,
            kv_bytes: backends.kv_bytes,
            max_num_seqs: opts.engine.max_num_seqs,
            max_batch_tokens,
            cuda: r.cuda,
            replicas,
            max_context: r.loaded.config.max_position_embeddings,
        };
        let (backend_name, weights_gguf) = (backends.name, backends.gguf);
        let weight_bytes = backends.weights;
        let engines = start_engines(&opts, &r, backends.each, max_batch_tokens, &adapters)?;
        tracing::info!(
            model = %display_name(source),
            resolve_s = resolved.as_secs_f64(),
            backends_s = (opened - resolved).as_secs_f64(),
            engines_s = (t0.elapsed() - opened).as_secs_f64(),
            "model opened"
        );
        let mut engines = engines.into_iter();
        let Some(engine) = engines.next() else {
            invalid!("no engine started: the replica plan lists no device");
        };
        Ok(Runtime {
            engine,
            replicas: engines.collect(),
            tokenizer: r.tokenizer,
            model: r.loaded,
            model_id: display_name(source),
            max_batch_tokens,
            cuda: r.cuda,
            weights_gguf,
            backend_name,
            sizing,
            weight_bytes,
        })
    }

    /// Every engine: the first, then the replicas.
    pub fn engines(&self) -> impl Iterator<Item = &Engine> {
        std::iter::once(&self.engine).chain(&self.replicas)
    }
}

/// The device of each replica of `opts.replicas` (`None`: the CPU).
fn devices(opts: &RuntimeOptions, r: &Resolved) -> Result<Vec<Option<usize>>, RuntimeError> {
    let gpus = || model::cuda::device_count().map_err(RuntimeError::Device);
    Ok(match (&opts.replicas, r.cuda) {
        (ReplicaPlan::Gpus(_), false) => invalid!(
            "`--devices` lists CUDA devices but the model runs on the CPU (`--device cpu`, or no CUDA here); use `--data-parallel-size N` for CPU replicas"
        ),
        (ReplicaPlan::Gpus(ids), true) => {
            if ids.is_empty() {
                invalid!("invalid `--devices`: it lists no GPU");
            }
            let count = gpus()?;
            if let Some(bad) = ids.iter().find(|&&i| i >= count) {
                invalid!(
                    "invalid `--devices`: GPU {bad} does not exist; this machine has {count} (0..{count})"
                );
            }
            ids.iter().copied().map(Some).collect()
        }
        (ReplicaPlan::Count(0), _) => {
            invalid!("invalid `--data-parallel-size`: must be at least 1")
        }
        (ReplicaPlan::Count(n), true) => {
            let count = gpus()?;
            if *n > count {
                invalid!("invalid `--data-parallel-size {n}`: this machine has {count} GPUs");
            }
            (0..*n).map(Some).collect()
        }
        (ReplicaPlan::Count(n), false) => {
            check_cpu_replicas(opts, &r.loaded.config, *n)?;
            vec![None; *n]
        }
    })
}

/// One backend per device (with the draft model's beside it), the weights
/// loaded once: the last replica takes the host copy, earlier CPU replicas
/// clone it.
fn open_backends(
    opts: &RuntimeOptions,
    r: &Resolved,
    devices: &[Option<usize>],
    draft: Option<&DraftPlan>,
) -> Result<Backends, RuntimeError> {
    let Some((last, first)) = devices.split_last() else {
        invalid!("no device to open the model on: the replica plan lists none");
    };
    let speculative = opts.speculative.config(r.cuda);
    // on CUDA the draft model's weights, workspace and pool (as many blocks
    // as the target's) come off the target's share of the device
    let companion = draft.map(|d| d.companion(opts));
    let gpu_memory = gpu_memory_at_start(opts, devices)?;
    let (format, path) = (opts.weights.format, opts.cpu.path);
    let cpu = cpu_weights(format, path, r.cuda)?;
    let t0 = std::time::Instant::now();
    let (weights, gguf) = load_weights(&opts.weights, path, &r.loaded, r.cuda)?;
    tracing::info!(secs = t0.elapsed().as_secs_f64(), "weights read");
    let mut out = Backends {
        each: Vec::with_capacity(devices.len()),
        gguf,
        name: String::new(),
        kv_blocks: 0,
        kv_bytes: 0,
        weights: model::WeightBytes::default(),
    };
    let mut open_on = |device: Option<usize>, w: Cow<'_, checkpoint::ModelWeights>| {
        let OpenBackend {
            backend,
            kv_blocks,
            kv_bytes,
            weights: weight_bytes,
        } = open_backend(
            opts,
            &r.loaded,
            device,
            w,
            &cpu,
            &gpu_memory,
            companion.as_ref(),
        )?;
        (out.name, out.kv_blocks, out.kv_bytes) = (backend.name(), kv_blocks, kv_bytes);
        out.weights = weight_bytes;
        let spec = draft_spec(
            opts,
            draft,
            &speculative,
            &*backend,
            device,
            kv_blocks,
            &gpu_memory,
        )?;
        out.each.push((backend, spec));
        Ok::<_, RuntimeError>(())
    };
    for device in first {
        open_on(*device, Cow::Borrowed(&weights))?;
    }
    open_on(*last, Cow::Owned(weights))?;
    Ok(out)
}

/// A backend's speculative setting: with a draft model, the draft opened
/// beside it (a backend that verifies no drafts gets the plain setting,
/// and the engine warns).
fn draft_spec(
    opts: &RuntimeOptions,
    draft: Option<&DraftPlan>,
    speculative: &Option<SpecConfig>,
    backend: &dyn Backend,
    device: Option<usize>,
    blocks: usize,
    gpu_memory: &GpuMemoryPlan,
) -> Result<Option<SpecConfig>, RuntimeError> {
    Ok(match (draft, speculative) {
        (Some(d), Some(cfg)) if backend.max_drafts() > 0 => {
            let model = d.open(opts, device, blocks, gpu_memory)?;
            Some(SpecConfig {
                method: SpecMethod::Draft(DraftModel::loaded(d.name(), model)),
                ..cfg.clone()
            })
        }
        _ => speculative.clone(),
    })
}

/// Starts an engine on each backend and loads the adapters into each.
fn start_engines(
    opts: &RuntimeOptions,
    r: &Resolved,
    backends: Vec<(Box<dyn Backend>, Option<SpecConfig>)>,
    max_batch_tokens: usize,
    adapters: &[(String, Arc<LoraAdapter>)],
) -> Result<Vec<Engine>, RuntimeError> {
    let mut eos = r.loaded.eos_ids.clone();
    for id in r.tokenizer.eos_ids() {
        if !eos.contains(&id) {
            eos.push(id);
        }
    }
    let e = &opts.engine;
    let max_step_time = match e
        .max_step_ms
        .unwrap_or(if r.cuda { 0 } else { CPU_MAX_STEP_MS })
    {
        0 => None,
        ms => Some(std::time::Duration::from_millis(ms)),
    };
    let halt = backends.len() > 1;
    let mut engines = Vec::with_capacity(backends.len());
    for (backend, speculative) in backends {
        let cfg = EngineConfig {
            max_num_seqs: e.max_num_seqs,
            max_batch_tokens,
            enable_prefix_cache: e.prefix_cache,
            max_queue: e.max_queue,
            max_step_time,
            halt_on_backend_error: halt,
            async_steps: e.async_steps,
            speculative,
            max_loras: opts.lora.slots(),
            max_lora_rank: opts.lora.max_lora_rank,
            lora_limits: opts.lora.limits(),
        };
        engines.push(Engine::start(
            backend,
            r.tokenizer.clone(),
            eos.clone(),
            cfg,
        )?);
    }
    for engine in &engines {
        for (name, a) in adapters {
            (engine.load_lora(name, a.clone())).with_context(|| format!("`--lora {name}`"))?;
        }
    }
    Ok(engines)
}

/// A model's backend without an engine: on GPU 0 with CUDA, else the CPU.
pub struct BackendAlone {
    pub backend: Box<dyn Backend>,
    pub tokenizer: Arc<Tokenizer>,
    /// The model directory (Hugging Face layout).
    pub dir: PathBuf,
}

impl BackendAlone {
    /// Opens the model `source` names as [`Runtime::open`] does, with no
    /// engine, replicas, draft model or adapters.
    pub fn open(source: &str, opts: &RuntimeOptions) -> Result<BackendAlone, RuntimeError> {
        let r = resolve(source, opts, None)?;
        let (format, path) = (opts.weights.format, opts.cpu.path);
        let cpu = cpu_weights(format, path, r.cuda)?;
        let (weights, _) = load_weights(&opts.weights, path, &r.loaded, r.cuda)?;
        let device = r.cuda.then_some(0);
        let gpu_memory = gpu_memory_at_start(opts, &[device])?;
        let opened = open_backend(
            opts,
            &r.loaded,
            device,
            Cow::Owned(weights),
            &cpu,
            &gpu_memory,
            None,
        )?;
        Ok(BackendAlone {
            backend: opened.backend,
            tokenizer: r.tokenizer,
            dir: r.dir,
        })
    }
}
