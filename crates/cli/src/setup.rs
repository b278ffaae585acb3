//! Opening a model for a command: resolve the id or directory (fetching on
//! first use), load config, tokenizer and weights, pick the device, size the
//! KV pool and start the engine. On the CPU, `--dtype` picks the weight
//! format: `auto` keeps the Q8_0 / Q4_1 / Q4_K / Q6_K blocks of the GGUF the model was
//! imported from (`checkpoint::store::source_gguf`), so the default model
//! runs from its 4-bit weights as llama.cpp does.
//!
//! Costs: loading reads every weight once (the safetensors files are memory
//! mapped and converted to BF16; with GGUF blocks the GGUF's kept tensors
//! too); the KV pool is allocated once, here.

use std::borrow::Cow;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use checkpoint::loader::LoadedModel;
use clap::ValueEnum;
use contract::{Backend, KvCacheDtype, KvShape};
use cpu_kernels::quant::QuantType;
use engine::speculate::DraftModel;
use engine::{Engine, EngineConfig, SpecConfig, SpecMethod};
use model::cpu::CpuWeights;

use crate::kv_sizing::{Companion, GpuMemoryPlan, gpu_kv_bytes, gpu_memory_at_start, kv_pool};
use tokenizer::Tokenizer;

const GIB: f64 = (1u64 << 30) as f64;

/// Physical memory of this machine (`MemTotal`), when it can be read.
fn host_memory_bytes() -> Option<usize> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Tokens per KV block.
pub const BLOCK_SIZE: usize = paged_kv::DEFAULT_BLOCK_SIZE;

/// Where the model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DeviceArg {
    /// The CPU reference backend.
    Cpu,
    /// The CUDA backend on GPU 0.
    Cuda,
    /// CUDA when it is available, else the CPU.
    Auto,
}

/// Which CPU kernels the CPU backend runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CpuKernelsArg {
    /// SIMD kernels chosen at run time (the default).
    Fast,
    /// The reference operations the golden tests hold to the oracle.
    Reference,
}

/// How the CPU backend holds the weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[allow(non_camel_case_types)]
pub enum DtypeArg {
    /// A GGUF model's own Q8_0 / Q4_1 / Q4_K / Q6_K blocks (the default model's
    /// 4-bit weights), BF16 for every other model and tensor, and on CUDA.
    Auto,
    /// The BF16 weights (a GGUF dequantised by the store's import).
    Bf16,
    /// Every projection quantised to Q8_0 at load (LM head Q8_0).
    #[value(name = "q8_0")]
    Q8_0,
    /// Every projection quantised to Q4_1 at load (LM head Q8_0).
    #[value(name = "q4_1")]
    Q4_1,
    /// Every projection quantised to Q4_K at load where its rows are whole
    /// super-blocks of 256, else Q4_1 (LM head Q8_0).
    #[value(name = "q4_k")]
    Q4_K,
    /// Every projection in FP8 (e4m3, one scale per output row), quantised
    /// at load unless the checkpoint is FP8 already; embedding and LM head
    /// stay BF16. CUDA runs the FP8 bytes; the CPU runs their dequantised
    /// values.
    Fp8,
}

/// Options every model-running command shares.
#[derive(clap::Args, Clone, Debug)]
pub struct ModelArgs {
    /// Model id in the store (fetched on first use; `lamina list`), a
    /// Hugging Face repo `org/name[@revision]` (downloaded into the Hugging
    /// Face cache on first use; `HF_TOKEN` for gated repos), a model
    /// directory in Hugging Face layout or a .gguf file (imported into the
    /// store once). Also the first positional word of `run`, `serve`,
    /// `chat` and `generate`.
    #[arg(long, short = 'm', default_value = checkpoint::store::DEFAULT_MODEL, env = "LAMINA_MODEL")]
    pub model: String,
    /// Longest sequence (prompt and reply) in tokens, at most the model's
    /// `max_position_embeddings` [default: the model's]. llama.cpp's `-c`.
    #[arg(long, short = 'c', visible_alias = "ctx-size", env = "LAMINA_MAX_MODEL_LEN",
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_model_len: Option<usize>,
    /// Threads of the CPU kernels [default: one per physical core;
    /// `RAYON_NUM_THREADS` also sets it].
    #[arg(long, short = 't', env = "LAMINA_THREADS",
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=4096))]
    pub threads: Option<usize>,
    /// Device to run on.
    #[arg(long, value_enum, default_value = "auto", env = "LAMINA_DEVICE")]
    pub device: DeviceArg,
    /// Cap the KV pool at this many blocks of 16 tokens (default: sized from memory).
    #[arg(long, env = "LAMINA_KV_BLOCKS")]
    pub kv_blocks: Option<usize>,
    /// Memory for the KV pool in GiB when --kv-blocks is not given
    /// [default: on CUDA what --gpu-memory-utilization leaves after the
    /// weights and workspace; 2 on the CPU; `run`, `generate` and `chat`
    /// take only what their prompts, replies and context need].
    #[arg(long, env = "LAMINA_KV_MEMORY_GIB")]
    pub kv_memory_gib: Option<f64>,
    /// Share of each GPU's total memory the server may use (weights,
    /// workspace and KV pool; vLLM's flag): the KV pool gets what is left,
    /// unless --kv-memory-gib or --kv-blocks sizes it.
    #[arg(long, default_value_t = crate::kv_sizing::DEFAULT_GPU_MEMORY_UTILIZATION, env = "LAMINA_GPU_MEMORY_UTILIZATION")]
    pub gpu_memory_utilization: f64,
    /// Most sequences running at once.
    #[arg(long, default_value_t = 256, env = "LAMINA_MAX_NUM_SEQS")]
    pub max_num_seqs: usize,
    /// Most tokens in one step (decodes plus prefill chunks) [default: 8192
    /// on CUDA, 512 on the CPU].
    #[arg(long, env = "LAMINA_MAX_BATCH_TOKENS")]
    pub max_batch_tokens: Option<usize>,
    /// Disable reuse of cached prompt prefixes.
    #[arg(long, env = "LAMINA_NO_PREFIX_CACHE", value_parser = clap::builder::BoolishValueParser::new())]
    pub no_prefix_cache: bool,
    /// Target time of one engine step in milliseconds: prefill chunks are
    /// cut to what the backend is measured to run in that time, so a long
    /// prompt cannot stall other streams for longer; 0 turns the cap off
    /// [default: 500 on the CPU, off on CUDA].
    #[arg(long, env = "LAMINA_MAX_STEP_MS")]
    pub max_step_ms: Option<u64>,
    /// CPU backend kernels.
    #[arg(long, value_enum, default_value = "fast", env = "LAMINA_CPU_KERNELS")]
    pub cpu_kernels: CpuKernelsArg,
    /// Run every engine step to completion before planning the next, instead
    /// of launching step N + 1 while step N runs (same output; for comparison).
    #[arg(long, env = "LAMINA_SYNC_STEPS", value_parser = clap::builder::BoolishValueParser::new())]
    pub sync_steps: bool,
    /// Weight format (`auto`: a GGUF's own Q8_0 / Q4_1 / Q4_K / Q6_K blocks
    /// on the CPU's fast kernels, an FP8 checkpoint's FP8 weights, else BF16;
    /// the Q formats run on the CPU's fast kernels only).
    #[arg(long, value_enum, default_value = "auto", env = "LAMINA_DTYPE")]
    pub dtype: DtypeArg,
    /// How the KV cache stores K and V: `auto` (bf16), `bf16`, `f32`, or
    /// `fp8` (e4m3 with a scale per layer for K and for V: the checkpoint's
    /// `k_scale` / `v_scale`, else 1), which holds twice the tokens of bf16
    /// in the same memory. The CUDA backend stores bf16 and fp8.
    #[arg(long, default_value = "auto", env = "LAMINA_KV_CACHE_DTYPE",
          value_parser = kv_cache_dtype_parser())]
    pub kv_cache_dtype: KvCacheDtype,
    /// With FP8 weights (`--dtype fp8` or an FP8 checkpoint): the LM head
    /// in FP8 too, per vocabulary row (half its bytes a decode step, a
    /// little more perplexity); it stays BF16 otherwise.
    #[arg(long, env = "LAMINA_QUANTIZE_LM_HEAD", value_parser = clap::builder::BoolishValueParser::new())]
    pub quantize_lm_head: bool,
    /// Deterministic mode: a request's tokens and log-probabilities are
    /// bitwise the same alone or in any batch, with any prefill chunking,
    /// prefix-cache hit or miss, or recompute after preemption (every
    /// kernel reduces a row in one fixed order). Slower prompt processing
    /// on both backends; on CUDA slower batch-1 decode too (README,
    /// "Deterministic mode").
    #[arg(long, env = "LAMINA_DETERMINISTIC", value_parser = clap::builder::BoolishValueParser::new())]
    pub deterministic: bool,
    #[command(flatten)]
    pub tuning: crate::tuning::TuningArgs,
    #[command(flatten)]
    pub spec: crate::spec_args::SpecArgs,
    #[command(flatten)]
    pub lora: crate::lora_args::LoraArgs,
    /// What a one-shot command (`run`, `generate`, `chat`) will ask of the
    /// KV pool, set by that command (no flag): the pool is sized to it.
    #[arg(skip)]
    pub one_shot: Option<crate::kv_sizing::OneShot>,
}

/// `--kv-cache-dtype`'s parser: the spellings of [`KvCacheDtype::CHOICES`].
fn kv_cache_dtype_parser() -> impl clap::builder::TypedValueParser<Value = KvCacheDtype> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(KvCacheDtype::CHOICES)
        .try_map(|s| s.parse::<KvCacheDtype>())
}

/// Which engines to start: one per listed CUDA device (data parallelism),
/// or one per CPU replica; [`ReplicaPlan::ONE`] is one engine on the device
/// `--device` picks (GPU 0 on CUDA).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplicaPlan {
    /// These CUDA device ordinals, one engine each (an ordinal listed
    /// twice hosts two engines, which share that GPU).
    Gpus(Vec<usize>),
    /// This many engines: on GPUs 0..n with CUDA, else on the CPU.
    Count(usize),
}

impl ReplicaPlan {
    pub const ONE: ReplicaPlan = ReplicaPlan::Count(1);
}

/// A model opened for serving requests.
pub struct Loaded {
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
}

/// What [`open`] sized, as `serve` logs it.
#[derive(Debug, Clone, Copy)]
pub struct Sizing {
    pub kv_blocks: usize,
    /// How the pool stores K and V (its bytes per token follow).
    pub kv_dtype: KvCacheDtype,
    pub kv_bytes: usize,
    pub max_num_seqs: usize,
    pub max_batch_tokens: usize,
    pub cuda: bool,
    /// Engines started (one per GPU, or CPU replicas), each sized as above.
    pub replicas: usize,
    /// The model's context length (a full-context sequence's tokens).
    pub max_context: usize,
}

impl Sizing {
    /// Tokens the KV pool holds.
    pub fn pool_tokens(&self) -> usize {
        self.kv_blocks * BLOCK_SIZE
    }

    /// Sequences of the full context the pool holds at once.
    pub fn full_contexts(&self) -> usize {
        crate::kv_sizing::full_contexts(self.pool_tokens(), self.max_context)
    }
}

impl std::fmt::Display for Sizing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}{} backend; KV pool ({} K/V) {} blocks of {BLOCK_SIZE} tokens ({} tokens, {:.2} GiB: {} concurrent sequences of the full {}-token context); at most {} sequences and {} tokens a step",
            if self.replicas > 1 {
                format!("{} replicas, each: ", self.replicas)
            } else {
                String::new()
            },
            if self.cuda { "CUDA" } else { "CPU" },
            self.kv_dtype,
            self.kv_blocks,
            self.pool_tokens(),
            self.kv_bytes as f64 / GIB,
            self.full_contexts(),
            self.max_context,
            self.max_num_seqs,
            self.max_batch_tokens,
        )?;
        if self.cuda {
            write!(
                f,
                "; decode CUDA graphs captured on first use of each (batch, context) bucket (batches in powers of two up to {})",
                model::cuda::MAX_GRAPH_BATCH
            )?;
        }
        Ok(())
    }
}

/// Resolves `args.model` to a directory, fetching a known id on first use.
pub fn model_dir(model: &str) -> Result<PathBuf> {
    Ok(checkpoint::store::resolve(model, true)?)
}

/// The name a model is shown under: a directory's last component, the
/// store id a short name or another case names, else the id as given.
pub fn display_name(model: &str) -> String {
    let path = std::path::Path::new(model);
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

/// Opens the model and starts the engine.
pub fn open(args: &ModelArgs, max_queue: usize) -> Result<Loaded> {
    open_replicas(args, max_queue, &ReplicaPlan::ONE)
}

/// A model's backend without an engine (for commands that drive the
/// backend directly, like `perplexity`): on GPU 0 with CUDA, else the CPU.
pub struct Opened {
    pub backend: Box<dyn Backend>,
    pub tokenizer: Arc<Tokenizer>,
    /// The model directory (Hugging Face layout).
    pub dir: PathBuf,
}

/// What every way of opening a model does first: apply the tuning flags,
/// resolve the model, read its config (capped by `--max-model-len`) and
/// tokenizer, and pick the device (`true`: CUDA).
fn resolve(args: &ModelArgs) -> Result<(PathBuf, LoadedModel, Arc<Tokenizer>, bool)> {
    args.tuning.apply()?;
    let dir = model_dir(&args.model)?;
    let mut loaded = checkpoint::loader::load_config(&dir)?;
    cap_context(&mut loaded.config, args.max_model_len)?;
    let tokenizer = Arc::new(Tokenizer::from_dir(&dir)?);
    let cuda = use_cuda(args.device)?;
    Ok((dir, loaded, tokenizer, cuda))
}

/// Opens the model of `args` as [`open`] does, with no engine.
pub fn open_backend_alone(args: &ModelArgs) -> Result<Opened> {
    let (dir, loaded, tokenizer, cuda) = resolve(args)?;
    let (cpu_weights, _) = cpu_weights(args, &dir, &loaded.config, cuda)?;
    let weights = load_weights(args, &loaded, cuda)?;
    let device = cuda.then_some(0);
    let gpu_memory = gpu_memory_at_start(args, &[device])?;
    let (backend, _, _) = open_backend(
        args,
        &loaded,
        device,
        Cow::Owned(weights),
        &cpu_weights,
        &gpu_memory,
        None,
    )?;
    Ok(Opened {
        backend,
        tokenizer,
        dir,
    })
}

/// Opens the model and starts one engine per replica of `plan`, each with
/// its own backend (weights, KV pool of the configured size) and step loop.
/// With several, an engine whose backend fails halts
/// (`EngineConfig::halt_on_backend_error`) so the server takes it out of
/// rotation.
pub fn open_replicas(args: &ModelArgs, max_queue: usize, plan: &ReplicaPlan) -> Result<Loaded> {
    if args.max_num_seqs == 0 {
        bail!("invalid `--max-num-seqs`: must be at least 1");
    }
    if args.max_batch_tokens == Some(0) {
        bail!("invalid `--max-batch-tokens`: must be at least 1");
    }
    // before anything loads: a bad setting is refused at once
    args.spec.config(true)?;
    let u = args.gpu_memory_utilization;
    if !(u > 0.0 && u <= 1.0) {
        bail!("invalid `--gpu-memory-utilization`: must be in (0, 1], got {u}");
    }
    let (dir, loaded, tokenizer, cuda) = resolve(args)?;
    // (the draft cut-off's default depends on the device)
    let speculative = args.spec.config(cuda)?;
    let draft = crate::draft_model::plan(args, &loaded, &tokenizer)?;
    // on CUDA the draft model's weights, workspace and pool (as many blocks
    // as the target's) come off the target's share of the device
    let companion = draft.as_ref().map(|d| d.companion(args));
    // the adapters are read (and refused) before the weights load
    let adapters = args.lora.load_all(&loaded.config)?;
    let devices: Vec<Option<usize>> = match (plan, cuda) {
        (ReplicaPlan::Gpus(_), false) => bail!(
            "`--devices` lists CUDA devices but the model runs on the CPU (`--device cpu`, or no CUDA here); use `--data-parallel-size N` for CPU replicas"
        ),
        (ReplicaPlan::Gpus(ids), true) => {
            let count = model::cuda::device_count().map_err(anyhow::Error::msg)?;
            if let Some(bad) = ids.iter().find(|&&i| i >= count) {
                bail!(
                    "invalid `--devices`: GPU {bad} does not exist; this machine has {count} (0..{count})"
                );
            }
            ids.iter().copied().map(Some).collect()
        }
        (ReplicaPlan::Count(0), _) => bail!("invalid `--data-parallel-size`: must be at least 1"),
        (ReplicaPlan::Count(n), true) => {
            let count = model::cuda::device_count().map_err(anyhow::Error::msg)?;
            if *n > count {
                bail!("invalid `--data-parallel-size {n}`: this machine has {count} GPUs");
            }
            (0..*n).map(Some).collect()
        }
        (ReplicaPlan::Count(n), false) => {
            check_cpu_replicas(args, &loaded.config, *n)?;
            vec![None; *n]
        }
    };
    let gpu_memory = gpu_memory_at_start(args, &devices)?;
    let (cpu_weights, weights_gguf) = cpu_weights(args, &dir, &loaded.config, cuda)?;
    let mut weights = Some(load_weights(args, &loaded, cuda)?);
    let mut backends = Vec::with_capacity(devices.len());
    let (mut kv_blocks, mut kv_bytes) = (0, 0);
    let mut backend_name = String::new();
    for (i, device) in devices.iter().enumerate() {
        // the last replica takes the host copy; earlier CPU replicas clone it
        let w = match (i + 1 == devices.len(), &weights) {
            (false, Some(w)) => Cow::Borrowed(w),
            _ => Cow::Owned(
                weights
                    .take()
                    .context("the weights were already handed over")?,
            ),
        };
        let (backend, blocks, bytes) = open_backend(
            args,
            &loaded,
            *device,
            w,
            &cpu_weights,
            &gpu_memory,
            companion.as_ref(),
        )?;
        backend_name = backend.name();
        (kv_blocks, kv_bytes) = (blocks, bytes);
        let spec = match (&draft, &speculative) {
            (Some(d), Some(cfg)) if backend.max_drafts() > 0 => {
                let model = d.open(args, *device, blocks, &gpu_memory)?;
                Some(SpecConfig {
                    method: SpecMethod::Draft(DraftModel::loaded(d.name(), model)),
                    ..cfg.clone()
                })
            }
            // (a backend that verifies no drafts: the engine warns)
            _ => speculative.clone(),
        };
        backends.push((backend, spec));
    }
    let mut eos = loaded.eos_ids.clone();
    for id in tokenizer.eos_ids() {
        if !eos.contains(&id) {
            eos.push(id);
        }
    }
    let max_batch_tokens = args.max_batch_tokens.unwrap_or(if cuda {
        CUDA_MAX_BATCH_TOKENS
    } else {
        CPU_MAX_BATCH_TOKENS
    });
    let halt = backends.len() > 1;
    let replicas = backends.len();
    let max_step_time = match args
        .max_step_ms
        .unwrap_or(if cuda { 0 } else { CPU_MAX_STEP_MS })
    {
        0 => None,
        ms => Some(std::time::Duration::from_millis(ms)),
    };
    let mut engines = Vec::with_capacity(backends.len());
    for (backend, speculative) in backends {
        engines.push(Engine::start(
            backend,
            tokenizer.clone(),
            eos.clone(),
            EngineConfig {
                max_num_seqs: args.max_num_seqs,
                max_batch_tokens,
                enable_prefix_cache: !args.no_prefix_cache,
                max_queue,
                max_step_time,
                halt_on_backend_error: halt,
                async_steps: !args.sync_steps,
                speculative: speculative.clone(),
                max_loras: args.lora.slots(),
                max_lora_rank: args.lora.max_lora_rank,
                lora_limits: args.lora.limits(),
            },
        )?);
    }
    for e in &engines {
        for (name, a) in &adapters {
            e.load_lora(name, a.clone())
                .with_context(|| format!("`--lora {name}`"))?;
        }
    }
    let engine = engines.remove(0);
    let max_context = loaded.config.max_position_embeddings;
    Ok(Loaded {
        engine,
        replicas: engines,
        tokenizer,
        model: loaded,
        model_id: display_name(&args.model),
        max_batch_tokens,
        cuda,
        weights_gguf,
        backend_name,
        sizing: Sizing {
            kv_blocks,
            kv_dtype: args.kv_cache_dtype,
            kv_bytes,
            max_num_seqs: args.max_num_seqs,
            max_batch_tokens,
            cuda,
            replicas,
            max_context,
        },
    })
}

/// The weights of `loaded` in the format `--dtype` asks: FP8 quantised at
/// load for `fp8`; an FP8 checkpoint keeps its FP8 weights unless a BF16 or
/// Q format is asked (which starts from the dequantised values). The CPU
/// keeps only the dequantised values.
pub(crate) fn load_weights(
    args: &ModelArgs,
    loaded: &LoadedModel,
    cuda: bool,
) -> Result<checkpoint::ModelWeights> {
    let mut w = checkpoint::loader::load_weights(&loaded.dir, &loaded.config)?;
    match args.dtype {
        DtypeArg::Fp8 => w.quantize_fp8(),
        DtypeArg::Auto => {}
        _ => w.fp8 = None,
    }
    // (quantize_lm_head_fp8 rounds the head: it runs first, when asked)
    let needs_fp8 = [
        (
            "--quantize-lm-head",
            args.quantize_lm_head && w.quantize_lm_head_fp8().is_none(),
        ),
        (
            "--fp8-activations",
            args.tuning.fp8_activations && w.fp8.is_none(),
        ),
    ];
    if let Some((flag, _)) = needs_fp8.iter().find(|(_, missing)| *missing) {
        bail!(
            "{flag} needs FP8 weights: add --dtype fp8 (or use an FP8 checkpoint with --dtype auto)"
        );
    }
    if !cuda {
        w.fp8 = None;
    }
    Ok(w)
}

/// Lowers the model's context to `--max-model-len`; longer than the model
/// was trained for is refused.
pub(crate) fn cap_context(
    cfg: &mut contract::ModelConfig,
    max_model_len: Option<usize>,
) -> Result<()> {
    let Some(n) = max_model_len else {
        return Ok(());
    };
    let trained = cfg.max_position_embeddings;
    if n > trained {
        bail!(
            "invalid `--max-model-len {n}`: the model's context is {trained} tokens (max_position_embeddings); give at most {trained}"
        );
    }
    cfg.max_position_embeddings = n;
    Ok(())
}

/// Default step budget on CUDA. H200, synthetic Llama-3.2-1B, `lamina bench`
/// b3 (256 x 512 in, 256 out), two runs each: 2,048 -> 36.6k / 37.1k output
/// tok/s, 4,096 -> 39.7k / 40.0k, 8,192 -> 40.4k / 38.8k, 16,384 -> 40.1k /
/// 42.0k (fewer mixed steps, each reading the weights once for more tokens);
/// `bench-serve` at 32 req/s: ITL p99 6.8 ms at 2,048, 8.5 ms at 8,192, TTFT
/// p50 unchanged. 8,192 is also vLLM's serving default.
pub(crate) const CUDA_MAX_BATCH_TOKENS: usize = 8192;
/// Default step budget on the CPU: a prefill chunk stalls every other stream
/// for its whole duration there, so chunks stay short.
const CPU_MAX_BATCH_TOKENS: usize = 512;
/// Default step time target on the CPU (`--max-step-ms`): while one prompt
/// prefills, every other stream still gets a token about twice a second.
const CPU_MAX_STEP_MS: u64 = 500;

/// The CPU backend's weight format for `args.dtype` (see [`DtypeArg`]),
/// with the GGUF whose blocks it keeps; an error for a quantised format on
/// CUDA or on the reference kernels.
pub(crate) fn cpu_weights(
    args: &ModelArgs,
    dir: &std::path::Path,
    cfg: &contract::ModelConfig,
    cuda: bool,
) -> Result<(CpuWeights, Option<PathBuf>)> {
    let reference = args.cpu_kernels == CpuKernelsArg::Reference;
    let quantize = match args.dtype {
        DtypeArg::Auto if cuda || reference => return Ok((CpuWeights::Bf16, None)),
        // the CPU runs FP8 weights dequantised (see `load_weights`)
        DtypeArg::Bf16 | DtypeArg::Fp8 => return Ok((CpuWeights::Bf16, None)),
        DtypeArg::Auto => None,
        DtypeArg::Q8_0 => Some(QuantType::Q8_0),
        DtypeArg::Q4_1 => Some(QuantType::Q4_1),
        DtypeArg::Q4_K => Some(QuantType::Q4_K),
    };
    if let Some(qt) = quantize {
        if cuda {
            bail!(
                "invalid `--dtype {}`: the CUDA backend runs BF16 and FP8 weights (use `--dtype bf16`, `fp8` or `auto`, or `--device cpu`)",
                qt.name().to_lowercase()
            );
        }
        if reference {
            bail!(
                "invalid `--dtype {}`: the reference CPU kernels run BF16 weights only (use `--cpu-kernels fast`)",
                qt.name().to_lowercase()
            );
        }
        return Ok((CpuWeights::Quantize(qt), None));
    }
    let Some(gguf) = checkpoint::store::source_gguf(dir)? else {
        return Ok((CpuWeights::Bf16, None));
    };
    let q = checkpoint::quantized::load_quantized(&gguf, cfg, &model::cpu::KEPT_GGML_TYPES)
        .with_context(|| format!("reading the quantised weights of {}", gguf.display()))?;
    if q.tensors().next().is_none() {
        return Ok((CpuWeights::Bf16, None));
    }
    Ok((CpuWeights::Blocks(q), Some(gguf)))
}

/// Whether `device` resolves to the CUDA backend (an error when CUDA is
/// asked for and unavailable).
fn use_cuda(device: DeviceArg) -> Result<bool> {
    Ok(match device {
        DeviceArg::Cpu => false,
        DeviceArg::Cuda => {
            if let Err(why) = model::cuda::available() {
                bail!("--device cuda is unavailable: {why}");
            }
            true
        }
        DeviceArg::Auto => model::cuda::available().is_ok(),
    })
}

/// Refuses more CPU replicas than the machine can run, before anything is
/// loaded: each runs its own step loop (more than the cores only contend)
/// and holds its own KV pool (together they must fit in memory).
fn check_cpu_replicas(args: &ModelArgs, cfg: &contract::ModelConfig, n: usize) -> Result<()> {
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    if n > cores {
        bail!(
            "invalid `--data-parallel-size {n}`: more CPU replicas than this machine's {cores} cores"
        );
    }
    let (per_block, blocks) = kv_pool(args, cfg, None)?;
    let need = per_block.saturating_mul(blocks).saturating_mul(n);
    if let Some(total) = host_memory_bytes()
        && need > total
    {
        bail!(
            "invalid `--data-parallel-size {n}`: {n} CPU replicas of {blocks} KV blocks each need {:.1} GiB of KV cache, more than this machine's {:.1} GiB (lower `--kv-memory-gib` or `--kv-blocks`)",
            need as f64 / GIB,
            total as f64 / GIB
        );
    }
    Ok(())
}

/// Puts `weights` on CUDA device `device` or (`None`) the CPU with a KV
/// pool sized from the options; returns it with the pool's blocks and bytes.
pub(crate) fn open_backend(
    args: &ModelArgs,
    loaded: &LoadedModel,
    device: Option<usize>,
    weights: Cow<'_, checkpoint::ModelWeights>,
    cpu_weights: &CpuWeights,
    gpu_memory: &GpuMemoryPlan,
    companion: Option<&Companion>,
) -> Result<(Box<dyn Backend>, usize, usize)> {
    let cuda = device.is_some();
    let mut cuda_options = args.tuning.cuda_options()?;
    cuda_options.kv_cache_dtype = args.kv_cache_dtype;
    cuda_options.deterministic = args.deterministic;
    if cuda_options.det_gemm != model::cuda::DetGemm::Auto && !args.deterministic {
        bail!(
            "invalid `--deterministic-gemm`: it chooses the products of `--deterministic`, which is off"
        );
    }
    cuda_options.max_loras = args.lora.slots();
    cuda_options.max_lora_rank = args.lora.max_lora_rank;
    let cfg = &loaded.config;
    let gpu_budget = match device {
        Some(ordinal) => gpu_kv_bytes(args, cfg, &weights, ordinal, gpu_memory, companion)?,
        None => None,
    };
    let (per_block, num_blocks) = kv_pool(args, cfg, gpu_budget)?;
    if !cuda {
        let need = per_block.saturating_mul(num_blocks);
        if let Some(total) = host_memory_bytes()
            && need > total
        {
            bail!(
                "invalid `--kv-blocks`: {num_blocks} blocks need {:.1} GiB of KV cache, more than this machine's {:.1} GiB",
                need as f64 / GIB,
                total as f64 / GIB
            );
        }
    }
    let kv = KvShape {
        num_blocks,
        block_size: BLOCK_SIZE,
    };
    let backend: Box<dyn Backend> = match device {
        Some(ordinal) => Box::new(
            model::cuda::CudaBackend::new(cfg.clone(), &weights, kv, ordinal, cuda_options)
                .with_context(|| format!("starting the CUDA backend on GPU {ordinal}"))?,
        ),
        None => {
            let path = match args.cpu_kernels {
                CpuKernelsArg::Fast => model::cpu::CpuPath::Fast,
                CpuKernelsArg::Reference => model::cpu::CpuPath::Reference,
            };
            Box::new(
                model::cpu::CpuBackend::with_weights(
                    cfg.clone(),
                    weights.into_owned(),
                    kv,
                    path,
                    cpu_weights.clone(),
                )?
                .with_kv_cache_dtype(args.kv_cache_dtype)
                .with_max_loras(args.lora.slots())
                .with_deterministic(args.deterministic)
                .with_fp8_activations(args.tuning.fp8_activations),
            )
        }
    };
    tracing::info!(
        backend = %backend.name(),
        device = ?device,
        kv_blocks = num_blocks,
        block_size = BLOCK_SIZE,
        kv_cache_dtype = %args.kv_cache_dtype,
        deterministic = backend.deterministic(),
        "model loaded"
    );
    Ok((backend, num_blocks, per_block.saturating_mul(num_blocks)))
}
