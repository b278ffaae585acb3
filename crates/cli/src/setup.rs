//! The model flags every model-running command shares ([`ModelArgs`]),
//! mapped onto the runtime library's options; opening a model is
//! `runtime::Runtime::open`'s (resolve, plan memory, open backends, start
//! engines).

use anyhow::Result;
use clap::ValueEnum;
use contract::KvCacheDtype;
use runtime::{
    BackendAlone, CpuOptions, Device, EngineOptions, KvOptions, ReplicaPlan, Runtime,
    RuntimeOptions, WeightFormat, WeightOptions,
};

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
    /// 4-bit weights; on CUDA Q4_0 and Q5_K too), BF16 for every other model
    /// and tensor.
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
    #[arg(long, default_value_t = runtime::DEFAULT_GPU_MEMORY_UTILIZATION, env = "LAMINA_GPU_MEMORY_UTILIZATION")]
    pub gpu_memory_utilization: f64,
    /// Most sequences running at once.
    #[arg(long, default_value_t = runtime::DEFAULT_MAX_NUM_SEQS, env = "LAMINA_MAX_NUM_SEQS")]
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
    /// on the CPU's fast kernels, an FP8 checkpoint's FP8 weights, else
    /// BF16; the Q formats quantise at load on the CPU's fast kernels only).
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
    pub one_shot: Option<runtime::OneShot>,
}

/// `--kv-cache-dtype`'s parser: the spellings of [`KvCacheDtype::CHOICES`].
fn kv_cache_dtype_parser() -> impl clap::builder::TypedValueParser<Value = KvCacheDtype> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(KvCacheDtype::CHOICES)
        .try_map(|s| s.parse::<KvCacheDtype>())
}

impl ModelArgs {
    /// The runtime's options for these flags (`max_queue`: requests
    /// waiting beyond the running ones, 0 unbounded; `replicas`: the
    /// engines to start); an error naming a flag whose value is refused
    /// before anything loads.
    pub fn runtime_options(
        &self,
        max_queue: usize,
        replicas: ReplicaPlan,
    ) -> Result<RuntimeOptions> {
        let cpu_path = match self.cpu_kernels {
            CpuKernelsArg::Fast => model::cpu::CpuPath::Fast,
            CpuKernelsArg::Reference => model::cpu::CpuPath::Reference,
        };
        Ok(RuntimeOptions {
            max_model_len: self.max_model_len,
            device: self.device.runtime(),
            replicas,
            deterministic: self.deterministic,
            weights: WeightOptions {
                format: self.dtype.format(),
                quantize_lm_head: self.quantize_lm_head,
                fp8_activations: self.tuning.fp8_activations,
            },
            kv: KvOptions {
                blocks: self.kv_blocks,
                memory_gib: self.kv_memory_gib,
                gpu_memory_utilization: self.gpu_memory_utilization,
                dtype: self.kv_cache_dtype,
                one_shot: self.one_shot,
            },
            engine: EngineOptions {
                max_num_seqs: self.max_num_seqs,
                max_batch_tokens: self.max_batch_tokens,
                max_step_ms: self.max_step_ms,
                prefix_cache: !self.no_prefix_cache,
                async_steps: !self.sync_steps,
                max_queue,
            },
            cpu: CpuOptions {
                path: cpu_path,
                isa_cap: Some(self.tuning.isa_cap()),
            },
            cuda: self.tuning.cuda(),
            speculative: self.spec.options()?,
            lora: self.lora.options()?,
        })
    }
}

impl DeviceArg {
    /// The runtime's device.
    pub fn runtime(self) -> Device {
        match self {
            DeviceArg::Cpu => Device::Cpu,
            DeviceArg::Cuda => Device::Cuda,
            DeviceArg::Auto => Device::Auto,
        }
    }
}

impl DtypeArg {
    /// The runtime's weight format.
    pub fn format(self) -> WeightFormat {
        match self {
            DtypeArg::Auto => WeightFormat::Auto,
            DtypeArg::Bf16 => WeightFormat::Bf16,
            DtypeArg::Q8_0 => WeightFormat::Q8_0,
            DtypeArg::Q4_1 => WeightFormat::Q4_1,
            DtypeArg::Q4_K => WeightFormat::Q4_K,
            DtypeArg::Fp8 => WeightFormat::Fp8,
        }
    }
}

/// Opens the model and starts one engine.
pub fn open(args: &ModelArgs, max_queue: usize) -> Result<Runtime> {
    open_replicas(args, max_queue, ReplicaPlan::ONE)
}

/// Opens the model and starts one engine per replica of `plan`.
pub fn open_replicas(args: &ModelArgs, max_queue: usize, plan: ReplicaPlan) -> Result<Runtime> {
    let opts = args.runtime_options(max_queue, plan)?;
    Ok(Runtime::open(&args.model, opts)?)
}

/// Opens the model of `args` as [`open`] does, with no engine.
pub fn open_backend_alone(args: &ModelArgs) -> Result<BackendAlone> {
    let opts = args.runtime_options(0, ReplicaPlan::ONE)?;
    Ok(BackendAlone::open(&args.model, &opts)?)
}
