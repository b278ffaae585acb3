//! The backends' tuning knobs as (hidden) command-line flags: the
//! runtime takes them as typed options from here, never from the
//! environment. The defaults are the measured best; the flags exist for
//! measurements and comparisons (`docs/performance.md`).

use clap::ValueEnum;
use cpu_kernels::IsaCap;
use model::cuda::{DEFAULT_GEMV_ROWS, DetGemm, KernelOptions};
use runtime::CudaOptions;

/// Tuning flags of the CPU kernels and the CUDA backend.
#[derive(clap::Args, Clone, Debug)]
pub struct TuningArgs {
    /// Most capable instruction set the CPU kernels may use (for comparing
    /// paths): portable, avx2, avx512 (AVX-512F without the BF16 / VNNI
    /// prompt products) or avx512bf16 (everything the processor has).
    #[arg(
        long,
        value_enum,
        default_value = "avx512bf16",
        env = cpu_kernels::isa::CAP_ENV,
        hide = true
    )]
    pub cpu_isa: CpuIsaArg,
    /// Prefill on the Hopper warpgroup-MMA flash kernels where the GPU has
    /// them (`false`: the mma.sync kernels everywhere).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, env = "LAMINA_WGMMA",
          value_parser = clap::builder::BoolishValueParser::new(), hide = true)]
    pub wgmma: bool,
    /// Launch kernels with programmatic dependent launch where the GPU
    /// supports it (`false`: plain launches).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, env = "LAMINA_PDL",
          value_parser = clap::builder::BoolishValueParser::new(), hide = true)]
    pub pdl: bool,
    /// Run pure-decode steps eagerly instead of replaying captured CUDA graphs.
    #[arg(long, hide = true, env = "LAMINA_NO_CUDA_GRAPHS", value_parser = clap::builder::BoolishValueParser::new())]
    pub no_cuda_graphs: bool,
    /// Largest CUDA step (tokens) run on the fused GEMV projections; 0:
    /// cuBLAS always.
    #[arg(long, hide = true, default_value_t = DEFAULT_GEMV_ROWS, env = "LAMINA_GEMV_ROWS")]
    pub gemv_rows: usize,
    /// CUDA decode steps of at least this many sequences run attention on
    /// the narrow flash tiling; 0: never [default: from the SM count].
    #[arg(long, hide = true, env = "LAMINA_NARROW_DECODE_SEQS")]
    pub narrow_decode_seqs: Option<usize>,
    /// Fewest keys a CUDA decode attention split takes (a multiple of 16):
    /// smaller runs short contexts on more blocks [default: one batch of a
    /// block's key loads: 64 at head size 64, 32 at 128, 16 at 256].
    #[arg(long, hide = true, env = "LAMINA_DECODE_MIN_CHUNK")]
    pub decode_min_chunk: Option<usize>,
    /// With FP8 weights (refused without): on CUDA, prefill and large
    /// batches quantise each projection's input to FP8 per token and run
    /// FP8 tensor cores (W8A8: faster, a little more rounding); without it
    /// they widen the weights to BF16 (W8A16); small decode steps read FP8
    /// weights either way. On the CPU every row's projection inputs are
    /// rounded the same way (the reference of W8A8; no faster).
    #[arg(long, env = "LAMINA_FP8_ACTIVATIONS", value_parser = clap::builder::BoolishValueParser::new())]
    pub fp8_activations: bool,
    /// With `--deterministic` on CUDA: which batch-invariant products the
    /// GEMMs may run on: auto (the fastest per shape, timed at start),
    /// cublaslt (cuBLASLt's algorithms that keep K whole) or own (lamina's
    /// invariant_gemm for every shape with bf16 weights).
    #[arg(
        long,
        value_enum,
        default_value = "auto",
        env = "LAMINA_DETERMINISTIC_GEMM",
        hide = true
    )]
    pub deterministic_gemm: DetGemmArg,
    /// Run the layers of batch-1 decode steps on CUDA as one persistent
    /// kernel (ops ordered by counters, not launches) where it covers them
    /// (bf16 or FP8 weights, bf16 K/V, head size 64, 128 or 256, no LoRA rows,
    /// not with `--deterministic`); else the per-kernel path.
    #[arg(long, hide = true, env = "LAMINA_PERSISTENT_DECODE",
          value_parser = clap::builder::BoolishValueParser::new())]
    pub persistent_decode: bool,
}

/// The `--deterministic-gemm` choice (see `model::cuda::DetGemm`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DetGemmArg {
    #[value(name = "auto")]
    Auto,
    #[value(name = "cublaslt")]
    Cublaslt,
    #[value(name = "own")]
    Own,
}

/// The `--cpu-isa` cap (see `cpu_kernels::IsaCap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CpuIsaArg {
    #[value(name = "portable")]
    Portable,
    #[value(name = "avx2")]
    Avx2,
    #[value(name = "avx512")]
    Avx512,
    #[value(name = "avx512bf16")]
    Avx512bf16,
}

impl TuningArgs {
    /// The CPU kernels' instruction-set cap.
    pub fn isa_cap(&self) -> IsaCap {
        match self.cpu_isa {
            CpuIsaArg::Portable => IsaCap::Portable,
            CpuIsaArg::Avx2 => IsaCap::Avx2,
            CpuIsaArg::Avx512 => IsaCap::Avx512,
            CpuIsaArg::Avx512bf16 => IsaCap::Avx512Bf16,
        }
    }

    /// The CUDA backend's own options (the runtime checks their ranges).
    pub fn cuda(&self) -> CudaOptions {
        CudaOptions {
            kernels: KernelOptions {
                wgmma: self.wgmma,
                pdl: self.pdl,
            },
            graphs: !self.no_cuda_graphs,
            gemv_rows: self.gemv_rows,
            narrow_decode_seqs: self.narrow_decode_seqs,
            det_gemm: match self.deterministic_gemm {
                DetGemmArg::Auto => DetGemm::Auto,
                DetGemmArg::Cublaslt => DetGemm::CublasLt,
                DetGemmArg::Own => DetGemm::Own,
            },
            persistent_decode: self.persistent_decode,
            decode_min_chunk: self.decode_min_chunk,
        }
    }
}
