//! How much memory the KV pool gets ([`crate::KvOptions`]): a block count
//! (`--kv-blocks`) wins, then a size (`--kv-memory-gib`); otherwise on the CPU a fixed
//! [`CPU_KV_MEMORY_GIB`], and on CUDA what the device has left, as vLLM
//! sizes it: `--gpu-memory-utilization` (default 0.9) of the device's total
//! memory, less what was already in use on it when the server started
//! (other processes, earlier engines' contexts), less the model's weights,
//! the LoRA slot pool (`--max-loras` x `--max-lora-rank`,
//! `model::cuda::lora_pool_bytes`) and a reserve for the step workspace,
//! the sampler's logits, cuBLAS and the CUDA graphs ([`reserve_bytes`]). Engines sharing one GPU split what
//! is left evenly. The pool never exceeds `--max-num-seqs` full contexts
//! (the caller's cap).
//!
//! A one-shot use (`lamina run`, `generate`, `chat`) sizes the pool to what
//! it will ask ([`OneShot`], [`one_shot_blocks`]) when nothing else does:
//! allocating the serving default for one short reply costs start-up time.
//!
//! The rules are pure arithmetic over the numbers given
//! ([`gpu_kv_budget`], [`reserve_bytes`]), tested without a GPU; only
//! [`gpu_memory_at_start`] reads the devices.

/// Fixed part of the reserve: the CUDA context's own allocations, cuBLAS
/// workspaces and the decode graphs of every batch bucket.
const FIXED_RESERVE: usize = 1 << 30;

/// Bytes in a GiB, for the settings given in GiB.
pub(crate) const GIB: f64 = (1u64 << 30) as f64;

use crate::error::{RuntimeError, invalid};
use crate::options::{
    BLOCK_SIZE, CPU_KV_MEMORY_GIB, CUDA_MAX_BATCH_TOKENS, OneShot, RuntimeOptions,
};

/// Tokens a one-shot pool holds beyond the estimate of each sequence: the
/// chat template's own tokens, speculative drafts, a block's rounding.
pub const ONE_SHOT_SLACK_TOKENS: usize = 256;

/// The blocks a one-shot pool needs: `sequences` sequences of `tokens`
/// plus [`ONE_SHOT_SLACK_TOKENS`], each at most the context.
pub fn one_shot_blocks(shot: OneShot, context: usize) -> usize {
    let per_seq = shot
        .tokens
        .map_or(context, |t| t.saturating_add(ONE_SHOT_SLACK_TOKENS))
        .min(context.max(1));
    shot.sequences
        .max(1)
        .saturating_mul(per_seq.div_ceil(BLOCK_SIZE))
        .max(1)
}

/// What the device and the model say about memory (bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuMemory {
    /// The device's total memory.
    pub total: usize,
    /// Free memory measured before any engine of this server loaded.
    pub free_at_start: usize,
}

/// The model's side of the budget (bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineNeeds {
    /// The weights as the device holds them (BF16).
    pub weights: usize,
    /// Step workspace, logits and graphs ([`reserve_bytes`]).
    pub reserve: usize,
}

/// Bytes an engine needs besides its weights and KV pool: activations of
/// a full step of `max_batch_tokens` (the residual stream, Q/K/V, attention
/// output, gate/up and SwiGLU in BF16 with f32 accumulations, counted
/// twice for the two steps in flight), the f32 logits of `max_num_seqs`
/// sampled rows (and the sampler's copy), plus [`FIXED_RESERVE`].
pub fn reserve_bytes(
    hidden: usize,
    intermediate: usize,
    q_dim: usize,
    kv_dim: usize,
    vocab: usize,
    max_batch_tokens: usize,
    max_num_seqs: usize,
) -> usize {
    let per_token = (3 * hidden + q_dim + 2 * kv_dim + 3 * intermediate) * 4;
    let activations = max_batch_tokens.saturating_mul(per_token).saturating_mul(2);
    let logits = max_num_seqs.saturating_mul(vocab).saturating_mul(4 * 2);
    FIXED_RESERVE
        .saturating_add(activations)
        .saturating_add(logits)
}

/// The KV pool's bytes for one of `engines_on_device` engines on a device
/// at `utilization` (in (0, 1]); an error saying what to change when
/// nothing is left.
pub fn gpu_kv_budget(
    mem: GpuMemory,
    utilization: f64,
    engines_on_device: usize,
    needs: EngineNeeds,
) -> Result<usize, String> {
    if !(utilization > 0.0 && utilization <= 1.0) {
        return Err(format!(
            "invalid `--gpu-memory-utilization`: must be in (0, 1], got {utilization}"
        ));
    }
    let allowed = (mem.total as f64 * utilization) as usize;
    let in_use = mem.total.saturating_sub(mem.free_at_start);
    let engines = engines_on_device.max(1);
    let share = allowed.saturating_sub(in_use) / engines;
    let need = needs.weights.saturating_add(needs.reserve);
    if share <= need {
        return Err(format!(
            "no GPU memory left for the KV cache: {utilization} of {:.1} GiB is {:.1} GiB, \
             {:.1} GiB were in use at start{}, and the weights ({:.1} GiB) and workspace \
             ({:.1} GiB) need {:.1} GiB; raise `--gpu-memory-utilization`, free the GPU, or \
             size the pool with `--kv-memory-gib` / `--kv-blocks`",
            mem.total as f64 / GIB,
            allowed as f64 / GIB,
            in_use as f64 / GIB,
            if engines > 1 {
                format!(" (what remains is split between {engines} engines)")
            } else {
                String::new()
            },
            needs.weights as f64 / GIB,
            needs.reserve as f64 / GIB,
            need as f64 / GIB,
        ));
    }
    Ok(share - need)
}

/// How many sequences of the full context `max_context` the pool of
/// `pool_tokens` holds at once.
pub fn full_contexts(pool_tokens: usize, max_context: usize) -> usize {
    pool_tokens / max_context.max(1)
}

/// Each CUDA device's memory before any engine loads, with the number of
/// engines it will host, when the KV pool is to be sized from it (neither
/// `--kv-blocks` nor `--kv-memory-gib` given).
pub(crate) type GpuMemoryPlan = Vec<(usize, GpuMemory, usize)>;

pub(crate) fn gpu_memory_at_start(
    opts: &RuntimeOptions,
    devices: &[Option<usize>],
) -> Result<GpuMemoryPlan, RuntimeError> {
    if opts.kv.blocks.is_some() || opts.kv.memory_gib.is_some() {
        return Ok(Vec::new());
    }
    let mut plan: GpuMemoryPlan = Vec::new();
    for ordinal in devices.iter().flatten() {
        if let Some(entry) = plan.iter_mut().find(|(o, _, _)| o == ordinal) {
            entry.2 += 1;
            continue;
        }
        let (free, total) = model::cuda::memory_info(*ordinal).map_err(RuntimeError::Device)?;
        let mem = GpuMemory {
            total,
            free_at_start: free,
        };
        plan.push((*ordinal, mem, 1));
    }
    Ok(plan)
}

/// The KV pool of one replica: bytes per block and blocks, from
/// `--kv-blocks`, `--kv-memory-gib`, or (`gpu_budget`, CUDA) the device
/// memory left ([`gpu_kv_budget`]), else [`CPU_KV_MEMORY_GIB`];
/// never more than `--max-num-seqs` full contexts. A block's bytes are
/// those of `--kv-cache-dtype`'s element, so an FP8 pool holds twice the
/// tokens of a BF16 one in the same memory.
pub(crate) fn kv_pool(
    opts: &RuntimeOptions,
    cfg: &contract::ModelConfig,
    gpu_budget: Option<usize>,
) -> Result<(usize, usize), RuntimeError> {
    let per_block = block_bytes(opts, cfg);
    let num_blocks = match opts.kv.blocks {
        Some(0) => invalid!("invalid `--kv-blocks`: must be at least 1"),
        Some(n) => n,
        None => {
            let budget = match (opts.kv.memory_gib, gpu_budget) {
                (Some(gib), _) => {
                    if !(gib > 0.0 && gib.is_finite()) {
                        invalid!("invalid `--kv-memory-gib`: must be positive, got {gib}");
                    }
                    (gib * GIB) as usize
                }
                (None, Some(bytes)) => bytes,
                (None, None) => (CPU_KV_MEMORY_GIB * GIB) as usize,
            };
            // never more than the context of max_num_seqs sequences, nor
            // than a one-shot command will ask
            let mut useful = opts
                .engine
                .max_num_seqs
                .saturating_mul(cfg.max_position_embeddings.div_ceil(BLOCK_SIZE));
            if let Some(shot) = opts.kv.one_shot {
                useful = useful.min(one_shot_blocks(shot, cfg.max_position_embeddings));
            }
            paged_kv::blocks_for_budget(budget, per_block)
                .min(useful)
                .max(1)
        }
    };
    Ok((per_block, num_blocks))
}

/// A second model an engine runs on its device beside the target (the
/// draft model), its KV pool as many blocks as the target's: its bytes are
/// taken from the target's share before the pool is sized.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Companion {
    /// Its weights on the device (BF16: two bytes a parameter).
    pub weights: usize,
    /// Its step workspace ([`reserve_bytes`]).
    pub reserve: usize,
    /// Its KV bytes per block of [`BLOCK_SIZE`] tokens.
    pub per_block: usize,
}

impl Companion {
    /// The device bytes of the model of `cfg` run with `opts`'s limits.
    pub(crate) fn of(opts: &RuntimeOptions, cfg: &contract::ModelConfig) -> Self {
        let params = engine::speculate::draft_model::num_params(cfg) as usize;
        Companion {
            weights: params.saturating_mul(2),
            reserve: engine_reserve(opts, cfg),
            per_block: block_bytes(opts, cfg),
        }
    }
}

/// Bytes of one KV block of `cfg` in `--kv-cache-dtype`'s element.
fn block_bytes(opts: &RuntimeOptions, cfg: &contract::ModelConfig) -> usize {
    paged_kv::bytes_per_block(
        cfg.num_layers,
        cfg.num_kv_heads,
        cfg.head_dim,
        opts.kv.dtype.bytes(),
        BLOCK_SIZE,
    )
}

/// [`reserve_bytes`] for the model of `cfg` under `opts`'s limits.
fn engine_reserve(opts: &RuntimeOptions, cfg: &contract::ModelConfig) -> usize {
    reserve_bytes(
        cfg.hidden_size,
        cfg.intermediate_size,
        cfg.q_dim(),
        cfg.kv_dim(),
        cfg.vocab_size,
        opts.engine
            .max_batch_tokens
            .unwrap_or(CUDA_MAX_BATCH_TOKENS),
        opts.engine.max_num_seqs,
    )
}

/// The KV bytes CUDA device `ordinal` leaves one of its engines
/// ([`gpu_kv_budget`]), or `None` when the pool is sized by a flag. With a
/// `companion`, its weights and workspace come off the share first and the
/// rest is split in proportion to the two models' bytes per block, so the
/// target's pool and the companion's pool of as many blocks both fit.
pub(crate) fn gpu_kv_bytes(
    opts: &RuntimeOptions,
    cfg: &contract::ModelConfig,
    weights: &checkpoint::ModelWeights,
    ordinal: usize,
    memory: &GpuMemoryPlan,
    companion: Option<&Companion>,
) -> Result<Option<usize>, RuntimeError> {
    let Some((_, mem, engines)) = memory.iter().find(|(o, _, _)| *o == ordinal) else {
        return Ok(None);
    };
    // every weight counted as BF16: an upper bound of the device's (an FP8
    // projection holds a byte a weight, plus one widening buffer)
    let dense = weights.tensors().iter().map(|t| t.numel()).sum::<usize>();
    let projections = (weights.projections().iter())
        .map(|p| p.numel())
        .sum::<usize>();
    let weights_bytes = (dense + projections) * 2;
    let c = companion.copied().unwrap_or_default();
    // the LoRA slot pool is allocated at start, fixed in size
    let lora = model::cuda::lora_pool_bytes(cfg, opts.lora.slots(), opts.lora.max_lora_rank);
    let needs = EngineNeeds {
        weights: weights_bytes.saturating_add(c.weights),
        reserve: engine_reserve(opts, cfg)
            .saturating_add(c.reserve)
            .saturating_add(lora),
    };
    let both = gpu_kv_budget(*mem, opts.kv.gpu_memory_utilization, *engines, needs)
        .map_err(|e| RuntimeError::Invalid(format!("GPU {ordinal}: {e}")))?;
    Ok(Some(split_pool(both, block_bytes(opts, cfg), c.per_block)))
}

/// The target's part of `both` KV bytes when a companion of `theirs` bytes
/// a block keeps as many blocks as a target of `ours`.
fn split_pool(both: usize, ours: usize, theirs: usize) -> usize {
    let blocks = both / ours.saturating_add(theirs).max(1);
    blocks.saturating_mul(ours)
}

#[cfg(test)]
mod tests;
