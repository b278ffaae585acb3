//! One backend: the weights on a CUDA device or the CPU, with a KV pool
//! sized by [`crate::kv_sizing`]. The one place the backends' own
//! configurations are built from [`RuntimeOptions`] (the CPU's builder
//! calls, the CUDA backend's options struct).
//!
//! Costs: the KV pool is allocated here, once per backend.

use std::borrow::Cow;

use checkpoint::loader::LoadedModel;
use contract::{Backend, KvShape};
use model::cpu::CpuWeights;

use crate::error::{Context, RuntimeError, invalid};
use crate::kv_sizing::{Companion, GIB, GpuMemoryPlan, gpu_kv_bytes, kv_pool};
use crate::options::{BLOCK_SIZE, RuntimeOptions};

/// A backend with its KV pool's blocks and bytes, and its weights' bytes.
pub(crate) struct OpenBackend {
    pub backend: Box<dyn Backend>,
    pub kv_blocks: usize,
    pub kv_bytes: usize,
    pub weights: model::WeightBytes,
}

/// Puts `weights` on CUDA device `device` or (`None`) the CPU with a KV
/// pool sized from the options (a `companion`'s bytes taken off a GPU's
/// share first).
pub(crate) fn open_backend(
    opts: &RuntimeOptions,
    loaded: &LoadedModel,
    device: Option<usize>,
    weights: Cow<'_, checkpoint::ModelWeights>,
    cpu_weights: &CpuWeights,
    gpu_memory: &GpuMemoryPlan,
    companion: Option<&Companion>,
) -> Result<OpenBackend, RuntimeError> {
    let cfg = &loaded.config;
    let gpu_budget = match device {
        Some(ordinal) => gpu_kv_bytes(opts, cfg, &weights, ordinal, gpu_memory, companion)?,
        None => None,
    };
    let (per_block, num_blocks) = kv_pool(opts, cfg, gpu_budget)?;
    if device.is_none() {
        let need = per_block.saturating_mul(num_blocks);
        if let Some(total) = host_memory_bytes()
            && need > total
        {
            invalid!(
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
    let (backend, weight_bytes): (Box<dyn Backend>, _) = match device {
        Some(ordinal) => {
            let b = model::cuda::CudaBackend::new(
                cfg.clone(),
                &weights,
                kv,
                ordinal,
                cuda_options(opts),
            )
            .with_context(|| format!("starting the CUDA backend on GPU {ordinal}"))?;
            let bytes = b.weight_bytes();
            (Box::new(b), bytes)
        }
        None => {
            let b = model::cpu::CpuBackend::with_weights(
                cfg.clone(),
                weights.into_owned(),
                kv,
                opts.cpu.path,
                *cpu_weights,
            )?
            .with_kv_cache_dtype(opts.kv.dtype)
            .with_max_loras(opts.lora.slots())
            .with_deterministic(opts.deterministic)
            .with_fp8_activations(opts.weights.fp8_activations);
            let bytes = b.weight_bytes();
            (Box::new(b), bytes)
        }
    };
    tracing::info!(
        backend = %backend.name(),
        device = ?device,
        kv_blocks = num_blocks,
        block_size = BLOCK_SIZE,
        kv_cache_dtype = %opts.kv.dtype,
        deterministic = backend.deterministic(),
        "model loaded"
    );
    Ok(OpenBackend {
        backend,
        kv_blocks: num_blocks,
        kv_bytes: per_block.saturating_mul(num_blocks),
        weights: weight_bytes,
    })
}

/// The CUDA backend's options: its own, and those it shares with the CPU.
fn cuda_options(opts: &RuntimeOptions) -> model::cuda::CudaOptions {
    let c = &opts.cuda;
    model::cuda::CudaOptions {
        kernels: c.kernels,
        graphs: c.graphs,
        gemv_rows: c.gemv_rows,
        narrow_decode_seqs: c.narrow_decode_seqs,
        fp8_activations: opts.weights.fp8_activations,
        kv_cache_dtype: opts.kv.dtype,
        deterministic: opts.deterministic,
        det_gemm: c.det_gemm,
        persistent_decode: c.persistent_decode,
        persistent_trace: false,
        decode_min_chunk: c.decode_min_chunk,
        max_loras: opts.lora.slots(),
        max_lora_rank: opts.lora.max_lora_rank,
    }
}

/// Refuses more CPU replicas than the machine can run, before anything is
/// loaded: each runs its own step loop (more than the cores only contend)
/// and holds its own KV pool (together they must fit in memory).
pub(crate) fn check_cpu_replicas(
    opts: &RuntimeOptions,
    cfg: &contract::ModelConfig,
    n: usize,
) -> Result<(), RuntimeError> {
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    if n > cores {
        invalid!(
            "invalid `--data-parallel-size {n}`: more CPU replicas than this machine's {cores} cores"
        );
    }
    let (per_block, blocks) = kv_pool(opts, cfg, None)?;
    let need = per_block.saturating_mul(blocks).saturating_mul(n);
    if let Some(total) = host_memory_bytes()
        && need > total
    {
        invalid!(
            "invalid `--data-parallel-size {n}`: {n} CPU replicas of {blocks} KV blocks each need {:.1} GiB of KV cache, more than this machine's {:.1} GiB (lower `--kv-memory-gib` or `--kv-blocks`)",
            need as f64 / GIB,
            total as f64 / GIB
        );
    }
    Ok(())
}

/// Physical memory of this machine (`MemTotal`), when it can be read.
fn host_memory_bytes() -> Option<usize> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}
