//! How much memory the KV pool gets: `--kv-blocks` (a block count) wins,
//! then `--kv-memory-gib`; otherwise on the CPU a fixed
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
//! The one-shot commands (`run`, `generate`, `chat`) size the pool to what
//! they will ask ([`OneShot`], [`one_shot_blocks`]) when no flag sizes it:
//! allocating the serving default for one short reply costs start-up time.
//!
//! The rules are pure arithmetic over the numbers given
//! ([`gpu_kv_budget`], [`reserve_bytes`]), tested without a GPU; only
//! [`gpu_memory_at_start`] reads the devices.

/// The KV pool's memory on the CPU when neither `--kv-blocks` nor
/// `--kv-memory-gib` is given.
pub const CPU_KV_MEMORY_GIB: f64 = 2.0;
/// vLLM's default share of the device's memory (`--gpu-memory-utilization`).
pub const DEFAULT_GPU_MEMORY_UTILIZATION: f64 = 0.9;
/// Fixed part of the reserve: the CUDA context's own allocations, cuBLAS
/// workspaces and the decode graphs of every batch bucket.
const FIXED_RESERVE: usize = 1 << 30;

const GIB: f64 = (1u64 << 30) as f64;

use anyhow::{Result, bail};

use crate::setup::{BLOCK_SIZE, CUDA_MAX_BATCH_TOKENS, ModelArgs};

/// Tokens a one-shot pool holds beyond the estimate of each sequence: the
/// chat template's own tokens, speculative drafts, a block's rounding.
pub const ONE_SHOT_SLACK_TOKENS: usize = 256;

/// What a one-shot command will ask of the KV pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OneShot {
    /// Tokens of the longest sequence (an upper bound of prompt plus
    /// reply); `None`: up to the context (a conversation).
    pub tokens: Option<usize>,
    /// Sequences running at once.
    pub sequences: usize,
}

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
    args: &ModelArgs,
    devices: &[Option<usize>],
) -> Result<GpuMemoryPlan> {
    if args.kv_blocks.is_some() || args.kv_memory_gib.is_some() {
        return Ok(Vec::new());
    }
    let mut plan: GpuMemoryPlan = Vec::new();
    for ordinal in devices.iter().flatten() {
        if let Some(entry) = plan.iter_mut().find(|(o, _, _)| o == ordinal) {
            entry.2 += 1;
            continue;
        }
        let (free, total) = model::cuda::memory_info(*ordinal).map_err(anyhow::Error::msg)?;
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
    args: &ModelArgs,
    cfg: &contract::ModelConfig,
    gpu_budget: Option<usize>,
) -> Result<(usize, usize)> {
    let per_block = block_bytes(args, cfg);
    let num_blocks = match args.kv_blocks {
        Some(0) => bail!("invalid `--kv-blocks`: must be at least 1"),
        Some(n) => n,
        None => {
            let budget = match (args.kv_memory_gib, gpu_budget) {
                (Some(gib), _) => {
                    if !(gib > 0.0 && gib.is_finite()) {
                        bail!("invalid `--kv-memory-gib`: must be positive, got {gib}");
                    }
                    (gib * GIB) as usize
                }
                (None, Some(bytes)) => bytes,
                (None, None) => (CPU_KV_MEMORY_GIB * GIB) as usize,
            };
            // never more than the context of max_num_seqs sequences, nor
            // than a one-shot command will ask
            let mut useful = args
                .max_num_seqs
                .saturating_mul(cfg.max_position_embeddings.div_ceil(BLOCK_SIZE));
            if let Some(shot) = args.one_shot {
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
    /// The device bytes of the model of `cfg` run with `args`'s limits.
    pub(crate) fn of(args: &ModelArgs, cfg: &contract::ModelConfig) -> Self {
        let params = engine::speculate::draft_model::num_params(cfg) as usize;
        Companion {
            weights: params.saturating_mul(2),
            reserve: engine_reserve(args, cfg),
            per_block: block_bytes(args, cfg),
        }
    }
}

/// Bytes of one KV block of `cfg` in `--kv-cache-dtype`'s element.
fn block_bytes(args: &ModelArgs, cfg: &contract::ModelConfig) -> usize {
    paged_kv::bytes_per_block(
        cfg.num_layers,
        cfg.num_kv_heads,
        cfg.head_dim,
        args.kv_cache_dtype.bytes(),
        BLOCK_SIZE,
    )
}

/// [`reserve_bytes`] for the model of `cfg` under `args`'s limits.
fn engine_reserve(args: &ModelArgs, cfg: &contract::ModelConfig) -> usize {
    reserve_bytes(
        cfg.hidden_size,
        cfg.intermediate_size,
        cfg.q_dim(),
        cfg.kv_dim(),
        cfg.vocab_size,
        args.max_batch_tokens.unwrap_or(CUDA_MAX_BATCH_TOKENS),
        args.max_num_seqs,
    )
}

/// The KV bytes CUDA device `ordinal` leaves one of its engines
/// ([`gpu_kv_budget`]), or `None` when the pool is sized by a flag. With a
/// `companion`, its weights and workspace come off the share first and the
/// rest is split in proportion to the two models' bytes per block, so the
/// target's pool and the companion's pool of as many blocks both fit.
pub(crate) fn gpu_kv_bytes(
    args: &ModelArgs,
    cfg: &contract::ModelConfig,
    weights: &checkpoint::ModelWeights,
    ordinal: usize,
    memory: &GpuMemoryPlan,
    companion: Option<&Companion>,
) -> Result<Option<usize>> {
    let Some((_, mem, engines)) = memory.iter().find(|(o, _, _)| *o == ordinal) else {
        return Ok(None);
    };
    let weights_bytes = weights
        .tensors()
        .iter()
        .map(|t| t.numel() * 2)
        .sum::<usize>();
    let c = companion.copied().unwrap_or_default();
    // the LoRA slot pool is allocated at start, fixed in size
    let lora = model::cuda::lora_pool_bytes(cfg, args.lora.slots(), args.lora.max_lora_rank);
    let needs = EngineNeeds {
        weights: weights_bytes.saturating_add(c.weights),
        reserve: engine_reserve(args, cfg)
            .saturating_add(c.reserve)
            .saturating_add(lora),
    };
    let both = gpu_kv_budget(*mem, args.gpu_memory_utilization, *engines, needs)
        .map_err(|e| anyhow::anyhow!("GPU {ordinal}: {e}"))?;
    Ok(Some(split_pool(both, block_bytes(args, cfg), c.per_block)))
}

/// The target's part of `both` KV bytes when a companion of `theirs` bytes
/// a block keeps as many blocks as a target of `ours`.
fn split_pool(both: usize, ours: usize, theirs: usize) -> usize {
    let blocks = both / ours.saturating_add(theirs).max(1);
    blocks.saturating_mul(ours)
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: usize = 1 << 30;

    #[test]
    fn the_pool_gets_what_the_utilization_leaves() {
        // an H200 (139 GiB usable), nothing else on it, a 2.5 GiB model
        let mem = GpuMemory {
            total: 139 * G,
            free_at_start: 139 * G - G / 2,
        };
        let needs = EngineNeeds {
            weights: 5 * G / 2,
            reserve: 2 * G,
        };
        let kv = gpu_kv_budget(mem, 0.9, 1, needs).unwrap();
        let allowed = (139.0 * 0.9 * G as f64) as usize;
        assert_eq!(kv, allowed - G / 2 - 5 * G / 2 - 2 * G);
        // a lower utilization leaves less, proportionally to the total
        let less = gpu_kv_budget(mem, 0.5, 1, needs).unwrap();
        assert!(kv - less > (139.0 * 0.39 * G as f64) as usize);
        // two engines on one device split what is left
        let two = gpu_kv_budget(mem, 0.9, 2, needs).unwrap();
        assert_eq!(two, (allowed - G / 2) / 2 - 5 * G / 2 - 2 * G);
    }

    #[test]
    fn no_room_is_an_error_naming_the_flags() {
        let mem = GpuMemory {
            total: 16 * G,
            free_at_start: 4 * G,
        };
        let needs = EngineNeeds {
            weights: 2 * G,
            reserve: G,
        };
        let e = gpu_kv_budget(mem, 0.9, 1, needs).unwrap_err();
        assert!(
            e.contains("--gpu-memory-utilization") && e.contains("--kv-memory-gib"),
            "{e}"
        );
        for bad in [0.0, -0.5, 1.5, f64::NAN] {
            let e = gpu_kv_budget(mem, bad, 1, needs).unwrap_err();
            assert!(e.contains("(0, 1]"), "{e}");
        }
    }

    #[test]
    fn the_reserve_grows_with_the_step_and_the_batch() {
        // Llama-3.2-1B's shapes at the CUDA defaults: a few GiB at most
        let r = reserve_bytes(2048, 8192, 2048, 512, 128_256, 8192, 256);
        assert!(r > FIXED_RESERVE + G / 2 && r < 4 * G, "{r}");
        assert!(reserve_bytes(2048, 8192, 2048, 512, 128_256, 16384, 256) > r);
        assert!(reserve_bytes(2048, 8192, 2048, 512, 128_256, 8192, 512) > r);
    }

    #[test]
    fn an_fp8_pool_holds_twice_the_tokens_of_bf16_in_the_same_memory() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cmd {
            #[command(flatten)]
            m: ModelArgs,
        }
        let cfg = contract::presets::Preset::Smollm2_135m.config().unwrap();
        let blocks = |dtype: &str| {
            let args =
                Cmd::try_parse_from(["t", "--kv-memory-gib", "1", "--kv-cache-dtype", dtype])
                    .unwrap()
                    .m;
            let (per_block, n) = kv_pool(&args, &cfg, None).unwrap();
            // 30 layers x K and V x 3 heads x 64 x 16 tokens of the element
            assert_eq!(
                per_block,
                30 * 2 * 3 * 64 * 16 * args.kv_cache_dtype.bytes()
            );
            n
        };
        let (bf16, fp8, f32) = (blocks("bf16"), blocks("fp8"), blocks("f32"));
        assert_eq!(blocks("auto"), bf16);
        // whole blocks of the budget: twice the blocks, less the odd one
        assert!(fp8 >= 2 * bf16 && fp8 / 2 == bf16, "fp8 {fp8}, bf16 {bf16}");
        assert!(bf16 >= 2 * f32 && bf16 / 2 == f32, "bf16 {bf16}, f32 {f32}");
        assert!(Cmd::try_parse_from(["t", "--kv-cache-dtype", "int4"]).is_err());
    }

    /// A one-shot command's pool follows its request: prompt and reply
    /// plus the slack, per sequence, at most the context; a conversation
    /// gets one context; a flag still wins, and serving keeps the default.
    #[test]
    fn a_one_shot_pool_follows_the_request() {
        let shot = |tokens, sequences| OneShot { tokens, sequences };
        assert_eq!(
            one_shot_blocks(shot(Some(100), 1), 8192),
            (100 + 256usize).div_ceil(16)
        );
        assert_eq!(one_shot_blocks(shot(Some(100), 4), 8192), 4 * 23);
        assert_eq!(one_shot_blocks(shot(Some(1_000_000), 1), 8192), 512);
        assert_eq!(one_shot_blocks(shot(None, 1), 8192), 512);
        assert!(
            one_shot_blocks(shot(Some(5000), 1), 8192) > one_shot_blocks(shot(Some(50), 1), 8192)
        );

        use clap::Parser;
        #[derive(Parser)]
        struct Cmd {
            #[command(flatten)]
            m: ModelArgs,
        }
        let cfg = contract::presets::Preset::Smollm2_135m.config().unwrap();
        let blocks = |argv: &[&str], one: Option<OneShot>| {
            let mut args = Cmd::try_parse_from(argv).unwrap().m;
            args.one_shot = one;
            kv_pool(&args, &cfg, None).unwrap().1
        };
        // serving: the CPU default of 2 GiB (capped by the full contexts)
        let serve = blocks(&["t"], None);
        let one = blocks(&["t"], Some(shot(Some(300), 1)));
        assert_eq!(one, (300 + 256usize).div_ceil(16));
        assert!(serve > 20 * one, "serve {serve}, one-shot {one}");
        // an explicit size wins
        assert_eq!(
            blocks(&["t", "--kv-blocks", "999"], Some(shot(Some(300), 1))),
            999
        );
    }

    #[test]
    fn a_companion_keeps_as_many_blocks_as_the_target() {
        // 10 blocks of both fit; the target keeps its 10 blocks' bytes
        assert_eq!(split_pool(10 * (300 + 100) + 99, 300, 100), 10 * 300);
        assert_eq!(split_pool(1000, 300, 0), 900);
        assert_eq!(split_pool(0, 300, 100), 0);
    }

    #[test]
    fn full_contexts_of_a_pool() {
        assert_eq!(full_contexts(65_536, 131_072), 0);
        assert_eq!(full_contexts(65_536, 8192), 8);
        assert_eq!(full_contexts(100, 0), 100);
    }
}
