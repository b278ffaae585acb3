//! [`RuntimeOptions`]: everything [`crate::Runtime::open`] is told, as
//! plain structs with `Default` (one sub-struct per concern, no builders).
//! The defaults are those of `lamina`'s flags, which map onto these fields
//! one to one; errors name a setting by its flag (docs/settings.md lists
//! each with its environment variable).
//!
//! The default limits are written here once; the CLI's flags show them.

use contract::KvCacheDtype;
use contract::lora::DEFAULT_MAX_LORA_RANK;
use engine::lora::{DEFAULT_MAX_LOADED_LORAS, DEFAULT_MAX_LORA_MEMORY_MIB, LoraLimits};
use engine::speculate::{CPU_SPEC_MAX_BATCH, DEFAULT_SPEC_MAX_BATCH, DraftModel};
use engine::{SpecConfig, SpecMethod};
use model::cpu::CpuPath;
use model::cuda::{DEFAULT_GEMV_ROWS, DetGemm, KernelOptions};

/// Tokens per KV block.
pub const BLOCK_SIZE: usize = paged_kv::DEFAULT_BLOCK_SIZE;
/// Most sequences running at once, by default.
pub const DEFAULT_MAX_NUM_SEQS: usize = 256;
/// Default step budget on CUDA. H200, synthetic Llama-3.2-1B, `lamina bench`
/// b3 (256 x 512 in, 256 out), two runs each: 2,048 -> 36.6k / 37.1k output
/// tok/s, 4,096 -> 39.7k / 40.0k, 8,192 -> 40.4k / 38.8k, 16,384 -> 40.1k /
/// 42.0k (fewer mixed steps, each reading the weights once for more tokens);
/// `bench-serve` at 32 req/s: ITL p99 6.8 ms at 2,048, 8.5 ms at 8,192, TTFT
/// p50 unchanged. 8,192 is also vLLM's serving default.
pub const CUDA_MAX_BATCH_TOKENS: usize = 8192;
/// Default step budget on the CPU: a prefill chunk stalls every other stream
/// for its whole duration there, so chunks stay short.
pub const CPU_MAX_BATCH_TOKENS: usize = 512;
/// Default step time target on the CPU: while one prompt prefills, every
/// other stream still gets a token about twice a second.
pub const CPU_MAX_STEP_MS: u64 = 500;
/// The KV pool's memory on the CPU when no block count or size is given.
pub const CPU_KV_MEMORY_GIB: f64 = 2.0;
/// vLLM's default share of the device's memory (`--gpu-memory-utilization`).
pub const DEFAULT_GPU_MEMORY_UTILIZATION: f64 = 0.9;
/// Most tokens drafted per sequence and step, by default.
pub const DEFAULT_NUM_SPECULATIVE_TOKENS: usize = 4;

/// Everything [`crate::Runtime::open`] needs besides the model's name.
#[derive(Debug, Clone, Default)]
pub struct RuntimeOptions {
    /// Longest sequence in tokens, at most the model's
    /// `max_position_embeddings` (`None`: the model's).
    pub max_model_len: Option<usize>,
    /// Where the model runs.
    pub device: Device,
    /// Which engines to start.
    pub replicas: ReplicaPlan,
    /// Deterministic mode on either backend
    /// (`contract::Backend::deterministic`).
    pub deterministic: bool,
    pub weights: WeightOptions,
    pub kv: KvOptions,
    pub engine: EngineOptions,
    pub cpu: CpuOptions,
    pub cuda: CudaOptions,
    pub speculative: SpecOptions,
    pub lora: LoraOptions,
}

/// Where the model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Device {
    /// The CPU backend.
    Cpu,
    /// The CUDA backend (an error when CUDA is unavailable).
    Cuda,
    /// CUDA when it is available, else the CPU.
    #[default]
    Auto,
}

/// Which engines to start: one per listed CUDA device (data parallelism),
/// or one per CPU replica; [`ReplicaPlan::ONE`] is one engine on the device
/// [`Device`] picks (GPU 0 on CUDA).
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

impl Default for ReplicaPlan {
    fn default() -> Self {
        ReplicaPlan::ONE
    }
}

/// The weights' format (`--dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[allow(non_camel_case_types)]
pub enum WeightFormat {
    /// A GGUF model's own blocks (the CPU's fast kernels: Q8_0 / Q4_1 /
    /// Q4_K / Q6_K; CUDA: those and Q4_0 / Q5_K), an FP8 checkpoint's FP8
    /// weights, else BF16.
    #[default]
    Auto,
    /// The BF16 weights.
    Bf16,
    /// Every projection quantised to Q8_0 at load (CPU fast kernels only).
    Q8_0,
    /// Every projection quantised to Q4_1 at load (CPU fast kernels only).
    Q4_1,
    /// Every projection quantised to Q4_K where its rows are whole
    /// super-blocks, else Q4_1 (CPU fast kernels only).
    Q4_K,
    /// Every projection in FP8 e4m3, one scale per output row.
    Fp8,
}

/// How the weights are held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WeightOptions {
    pub format: WeightFormat,
    /// With FP8 weights: the LM head in FP8 too, per vocabulary row.
    pub quantize_lm_head: bool,
    /// With FP8 weights: projection inputs rounded to FP8 per token (W8A8).
    pub fp8_activations: bool,
}

/// What a one-shot use (one prompt, one conversation) will ask of the KV
/// pool; the pool is sized to it when neither a block count nor a size is
/// given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OneShot {
    /// Tokens of the longest sequence (an upper bound of prompt plus
    /// reply); `None`: up to the context (a conversation).
    pub tokens: Option<usize>,
    /// Sequences running at once.
    pub sequences: usize,
}

/// The KV pool of each engine.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvOptions {
    /// Blocks of [`BLOCK_SIZE`] tokens (wins over every other size).
    pub blocks: Option<usize>,
    /// GiB for the pool when `blocks` is not given [default: on CUDA what
    /// `gpu_memory_utilization` leaves, [`CPU_KV_MEMORY_GIB`] on the CPU].
    pub memory_gib: Option<f64>,
    /// Share of each GPU's total memory the engines may use, in (0, 1].
    pub gpu_memory_utilization: f64,
    /// How the pool stores K and V.
    pub dtype: KvCacheDtype,
    /// A one-shot use's needs, which cap the pool.
    pub one_shot: Option<OneShot>,
}

impl Default for KvOptions {
    fn default() -> Self {
        KvOptions {
            blocks: None,
            memory_gib: None,
            gpu_memory_utilization: DEFAULT_GPU_MEMORY_UTILIZATION,
            dtype: KvCacheDtype::default(),
            one_shot: None,
        }
    }
}

/// Each engine's scheduling limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineOptions {
    /// Most sequences running at once.
    pub max_num_seqs: usize,
    /// Most tokens in one step [default: [`CUDA_MAX_BATCH_TOKENS`] on
    /// CUDA, [`CPU_MAX_BATCH_TOKENS`] on the CPU].
    pub max_batch_tokens: Option<usize>,
    /// Target time of one step in milliseconds, 0 off [default:
    /// [`CPU_MAX_STEP_MS`] on the CPU, off on CUDA].
    pub max_step_ms: Option<u64>,
    /// Reuse cached prompt prefixes.
    pub prefix_cache: bool,
    /// Launch step N + 1 while step N runs (`false`: one at a time).
    pub async_steps: bool,
    /// Requests waiting beyond the running ones (0: unbounded).
    pub max_queue: usize,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            max_num_seqs: DEFAULT_MAX_NUM_SEQS,
            max_batch_tokens: None,
            max_step_ms: None,
            prefix_cache: true,
            async_steps: true,
            max_queue: 0,
        }
    }
}

/// The CPU backend's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuOptions {
    /// The kernels: fast (SIMD) or the reference operations.
    pub path: CpuPath,
    /// Caps the instruction set of every CPU kernel of the process
    /// (`None`: leave the process's cap as it is; see
    /// `cpu_kernels::isa::set_cap`).
    pub isa_cap: Option<cpu_kernels::IsaCap>,
}

impl Default for CpuOptions {
    fn default() -> Self {
        CpuOptions {
            path: CpuPath::Fast,
            isa_cap: None,
        }
    }
}

/// The CUDA backend's own settings (those it shares with the CPU sit in
/// [`RuntimeOptions`]: KV element, deterministic mode, LoRA slots, FP8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaOptions {
    /// The kernels' own choices (Hopper prefill tiling, dependent launch).
    pub kernels: KernelOptions,
    /// Replay pure-decode steps from captured CUDA graphs.
    pub graphs: bool,
    /// Largest step run on the fused GEMV projections (0: cuBLAS always).
    pub gemv_rows: usize,
    /// Decode steps of at least this many sequences run attention on the
    /// narrow flash tiling (0: never; `None`: from the SM count).
    pub narrow_decode_seqs: Option<usize>,
    /// Deterministic mode's products (only with
    /// [`RuntimeOptions::deterministic`]).
    pub det_gemm: DetGemm,
    /// Run the layers of captured batch-1 decode steps on the persistent
    /// decode kernel where it covers them.
    pub persistent_decode: bool,
    /// Fewest keys a decode attention split takes (`None`: the head size's
    /// default, `model::cuda::default_decode_min_chunk`).
    pub decode_min_chunk: Option<usize>,
}

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions {
            kernels: KernelOptions::default(),
            graphs: true,
            gemv_rows: DEFAULT_GEMV_ROWS,
            narrow_decode_seqs: None,
            det_gemm: DetGemm::Auto,
            persistent_decode: false,
            decode_min_chunk: None,
        }
    }
}

/// How speculative decoding drafts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Drafting {
    /// Prompt lookup.
    Ngram,
    /// The most frequent continuation over recent requests' tokens.
    Suffix,
    /// A smaller model sharing the target's tokenizer, resolved as the
    /// target is (store name, directory, GGUF, hub repo).
    Draft(String),
}

/// Speculative decoding (off by default).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecOptions {
    /// The method; `None`: off.
    pub method: Option<Drafting>,
    /// Most tokens drafted per sequence and step.
    pub num_tokens: usize,
    /// Steps with more running sequences draft nothing [default:
    /// `engine::speculate::DEFAULT_SPEC_MAX_BATCH` on CUDA,
    /// `CPU_SPEC_MAX_BATCH` on the CPU].
    pub max_batch: Option<usize>,
}

impl Default for SpecOptions {
    fn default() -> Self {
        SpecOptions {
            method: None,
            num_tokens: DEFAULT_NUM_SPECULATIVE_TOKENS,
            max_batch: None,
        }
    }
}

impl SpecOptions {
    /// The draft model's name, when a model drafts.
    pub fn draft_model(&self) -> Option<&str> {
        match &self.method {
            Some(Drafting::Draft(name)) => Some(name),
            _ => None,
        }
    }

    /// The engine's setting on a CUDA (`cuda`) or CPU backend (`None`:
    /// off). A draft model is named, not loaded, here.
    pub fn config(&self, cuda: bool) -> Option<SpecConfig> {
        let method = match self.method.as_ref()? {
            Drafting::Ngram => SpecMethod::Ngram,
            Drafting::Suffix => SpecMethod::Suffix,
            Drafting::Draft(model) => SpecMethod::Draft(DraftModel::named(model)),
        };
        Some(SpecConfig {
            method,
            num_tokens: self.num_tokens,
            max_batch: self.max_batch.unwrap_or(match cuda {
                true => DEFAULT_SPEC_MAX_BATCH,
                false => CPU_SPEC_MAX_BATCH,
            }),
        })
    }
}

/// LoRA adapters and their slots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraOptions {
    /// Adapters loaded at start: `(name, path)`, the path a PEFT directory
    /// or a Hugging Face repo id.
    pub adapters: Vec<(String, String)>,
    /// Adapters resident at once [default: as many as `adapters`].
    pub max_loras: Option<usize>,
    /// Highest rank accepted.
    pub max_lora_rank: usize,
    /// Adapters held in memory at once.
    pub max_loaded_loras: usize,
    /// MiB the loaded adapters may take together.
    pub max_lora_memory_mib: u64,
}

impl Default for LoraOptions {
    fn default() -> Self {
        LoraOptions {
            adapters: Vec::new(),
            max_loras: None,
            max_lora_rank: DEFAULT_MAX_LORA_RANK,
            max_loaded_loras: DEFAULT_MAX_LOADED_LORAS,
            max_lora_memory_mib: DEFAULT_MAX_LORA_MEMORY_MIB,
        }
    }
}

impl LoraOptions {
    /// Adapter slots of each backend and engine.
    pub fn slots(&self) -> usize {
        self.max_loras.unwrap_or(self.adapters.len())
    }

    /// The engine's bounds on loaded adapters.
    pub fn limits(&self) -> LoraLimits {
        LoraLimits {
            max_loaded: self.max_loaded_loras,
            max_bytes: self.max_lora_memory_mib.saturating_mul(1 << 20),
        }
    }
}
