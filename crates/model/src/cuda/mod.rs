//! The CUDA backend: the Llama forward pass on an NVIDIA GPU through our own
//! kernels (crate `kernels`) and cuBLAS (crate `gpu`).
//!
//! Contract: [`CudaBackend`] implements [`Backend`] exactly like the CPU
//! backend: any [`StepBatch`] passing [`CudaBackend::check_batch`] runs;
//! anything else is a [`BackendError::InvalidBatch`] naming the field, never a
//! panic; device failures are [`BackendError::Device`] naming the operation.
//! Weights are uploaded once as bf16 (Q/K/V and gate/up fused, tied head =
//! embedding); the KV pool is bf16 on the device, or FP8 e4m3 at the
//! checkpoint's per-layer K/V scales (`CudaOptions::kv_cache_dtype`). Logits are computed only
//! for the rows that are sampled (gathered before the LM head;
//! [`Backend::hidden`] stops at the final norm of every row instead), and sampling
//! runs on the GPU with the procedure of [`contract::sampling`]. A pure-decode
//! step is replayed from a CUDA graph captured once per bucket of batch size
//! (powers of two up to [`MAX_GRAPH_BATCH`]) and block-table row length
//! (powers of two from 16 blocks to the longest context); padded rows write to a scratch
//! KV block no sequence reads. [`CudaOptions`] holds the tuning knobs the
//! caller sets (graphs on or off, where the fused GEMVs and the narrow
//! attention tiling take over). [`available`] says why CUDA cannot be used,
//! without panicking.
//!
//! The backend is split by concern, one file each: `weights` (the model
//! on the device), `workspace` (step buffers and their growth), `staging`
//! (packing a step's metadata), `plan` (which kernels a step runs),
//! `forward` (running a plan), `lora` (the LoRA adapter slots and their
//! deltas), `graphs` (captured decode graphs), `run`
//! (eager steps), `pipeline` (steps in flight) and `verify` (speculative
//! decoding's verify rows run as decode rows).
//!
//! Steps are pipelined (`pipeline`): a launch enqueues a step and the
//! copy of its samples, a collect waits for that copy alone, and tokens
//! carried from the previous launch are read on the device. A held launch
//! enqueues the forward pass alone (a decode graph without the sampler);
//! its release stages the final sampling parameters and grammar masks and
//! enqueues the sampler.
//!
//! Costs: one host-to-device copy of the packed metadata, the kernels (or one
//! graph launch) and one device-to-host copy of the sampled tokens per step,
//! with one fence wait per collect. Memory: see `weights` and `forward`.

mod errors;
mod forward;
mod gguf;
mod graphs;
mod int4;
mod invariant;
mod linear;
mod lora;
mod pipeline;
mod plan;
mod run;
mod staging;
mod verify;
mod weights;
mod workspace;

#[cfg(test)]
mod tests;

use std::sync::Arc;

use gpu::{Blas, Gpu};
pub use kernels::KernelOptions;
use kernels::{DecodePlan, HeadShape, Kernels, SampleParams};

use checkpoint::weights::ModelWeights;
use contract::backend::{
    Backend, BackendError, KvShape, SampleRequest, SampledToken, StepBatch, check_rows_call,
};
use contract::config::{KvCacheDtype, ModelConfig};
pub(crate) use errors::dev_err;
pub use gguf::KEPT_GGML_TYPES;
use graphs::DecodeGraphs;
pub use invariant::DetGemm;
pub use lora::lora_pool_bytes;
use pipeline::Pipe;
use plan::Tuning;
use weights::DeviceModel;
use workspace::{Caps, Workspace};

/// Largest pure-decode batch replayed from a captured graph.
pub const MAX_GRAPH_BATCH: usize = 256;
/// Block-table row length [`CudaBackend::reserve_steps`] sizes the staging for.
const RESERVE_BLOCKS: usize = 128;
/// `u32` words of history a graph bucket can stage: repetition-penalty ids,
/// additive terms and grammar masks (`V / 32` words per constrained row:
/// 256 rows of a 128k vocabulary fit). 4 MiB of staging, of which a step
/// copies only the used prefix.
const GRAPH_HISTORY: usize = 1 << 20;
/// Steps of at most this many tokens use the fused GEMV projections by
/// default: at more rows the GEMVs (which re-read their inputs per warp) lose
/// to cuBLAS plus the unfused norm / SiLU kernels (H200, Llama-3.2-1B).
pub const DEFAULT_GEMV_ROWS: usize = 2;
/// Fewest keys a decode attention split takes unless set
/// ([`CudaOptions::decode_min_chunk`]), and the rule a setting must meet.
pub use kernels::decode_attention::{
    check_min_chunk as check_decode_min_chunk, default_min_chunk as default_decode_min_chunk,
};
/// Most tokens a fused GEMV launch takes.
pub const MAX_GEMV_ROWS: usize = kernels::gemv::MAX_ROWS;

/// The CUDA backend's tuning knobs, set by its caller (the CLI's hidden
/// tuning flags). The defaults are the measured best on an H200.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaOptions {
    /// The kernels' own choices (the Hopper prefill tiling, programmatic
    /// dependent launch).
    pub kernels: KernelOptions,
    /// Replay pure-decode steps from captured CUDA graphs.
    pub graphs: bool,
    /// Largest step run on the fused GEMV projections (0: cuBLAS always;
    /// at most [`MAX_GEMV_ROWS`]).
    pub gemv_rows: usize,
    /// Decode steps of at least this many sequences run attention on the
    /// narrow flash tiling (0: never; `None`: from the point where the
    /// decode kernel stops splitting keys, `seqs * kv_heads >= 2 * SMs`).
    pub narrow_decode_seqs: Option<usize>,
    /// FP8 weights: steps past the GEMV path quantise each GEMM's input
    /// rows to e4m3 (one scale per token) and run cuBLASLt's FP8 tensor
    /// cores (W8A8); off, they widen the weights to bf16 (W8A16).
    pub fp8_activations: bool,
    /// How the KV pool stores K and V (`--kv-cache-dtype`): BF16 or FP8
    /// e4m3 at the checkpoint's per-layer scales; f32 is refused at
    /// construction.
    pub kv_cache_dtype: KvCacheDtype,
    /// Deterministic mode (`--deterministic`, see
    /// [`contract::Backend::deterministic`]): batch-invariant GEMMs and
    /// attention for every row (`plan`, `invariant`).
    pub deterministic: bool,
    /// Deterministic mode: which batch-invariant products the GEMM shapes
    /// may be pinned to.
    pub det_gemm: DetGemm,
    /// LoRA adapter slots (`--max-loras`; 0: none, nothing allocated).
    pub max_loras: usize,
    /// Highest LoRA rank a slot holds (`--max-lora-rank`).
    pub max_lora_rank: usize,
    /// Run the layers of captured one-token decode steps on the persistent
    /// decode kernel where it covers them (`plan`).
    pub persistent_decode: bool,
    /// Fewest keys a decode attention split takes (a positive multiple of
    /// [`check_decode_min_chunk`]; `None`: [`default_decode_min_chunk`] of
    /// the head size): smaller splits run short contexts on more blocks,
    /// each with a shorter chain of loads, and more partials to merge.
    pub decode_min_chunk: Option<usize>,
    /// Its launches stamp each op's timings, read back by
    /// [`CudaBackend::persistent_trace`]: a profiling aid of the tests,
    /// with no flag of its own.
    pub persistent_trace: bool,
}

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions {
            kernels: KernelOptions::default(),
            graphs: true,
            gemv_rows: DEFAULT_GEMV_ROWS,
            narrow_decode_seqs: None,
            fp8_activations: false,
            kv_cache_dtype: KvCacheDtype::Bf16,
            deterministic: false,
            det_gemm: DetGemm::Auto,
            max_loras: 0,
            max_lora_rank: contract::lora::DEFAULT_MAX_LORA_RANK,
            persistent_decode: false,
            decode_min_chunk: None,
            persistent_trace: false,
        }
    }
}

/// `Ok` for a KV cache dtype the CUDA backend stores (BF16, FP8), else
/// the error naming `--kv-cache-dtype` and the value.
pub fn check_kv_cache_dtype(dtype: KvCacheDtype) -> Result<(), BackendError> {
    match dtype {
        KvCacheDtype::Bf16 | KvCacheDtype::Fp8 => Ok(()),
        other => Err(BackendError::Device(format!(
            "invalid `--kv-cache-dtype {other}`: the CUDA backend stores K/V in bf16 or fp8 (use `--kv-cache-dtype bf16`, `fp8` or `auto`, or `--device cpu`)"
        ))),
    }
}

/// `Ok` when this binary carries CUDA kernels and a CUDA driver with a
/// device is present; otherwise the reason and how to fix it.
pub fn available() -> Result<(), String> {
    if let Some(why) = kernels::unavailable_reason() {
        return Err(why);
    }
    gpu::driver_available().map_err(|e| format!("no CUDA driver found: {e}"))
}

/// How many CUDA devices can run the backend (after [`available`]'s checks).
pub fn device_count() -> Result<usize, String> {
    available()?;
    gpu::device_count()
}

/// Free and total memory of CUDA device `device` in bytes (what the KV
/// pool's sizing starts from).
pub fn memory_info(device: usize) -> Result<(usize, usize), String> {
    available()?;
    let gpu = Gpu::new(device).map_err(|e| format!("opening device {device}: {e}"))?;
    gpu.mem_info()
        .map_err(|e| format!("reading device {device}'s memory: {e}"))
}

/// The device-to-device copy rate of CUDA device `device` in bytes a
/// second, read plus write ([`Gpu::copy_bandwidth`]: two buffers of
/// `bytes`, freed on return; `warmups` untimed copies, then `reps` timed).
pub fn copy_bandwidth(
    device: usize,
    bytes: usize,
    warmups: usize,
    reps: usize,
) -> Result<f64, String> {
    available()?;
    let gpu = Gpu::new(device).map_err(|e| format!("opening device {device}: {e}"))?;
    gpu.copy_bandwidth(bytes, warmups, reps)
        .map_err(|e| format!("timing device {device}'s copies: {e}"))
}

/// Whether the fused GEMV layer runs model `c`: Llama's layer under any
/// attention rule (scale, soft-cap, sliding window: attention is its own
/// kernel, which takes the layer's rule) and RoPE, with a norm weight
/// offset, the QKV bias (Qwen2's) and QK-norm (Qwen3's, Gemma's) where the
/// QKV GEMV's epilogue normalises whole heads (a power-of-two head_dim up
/// to `HADAMARD_MAX_DIM`), output norms (Gemma's) and either gated
/// activation; embedding scale and final soft-cap are outside the layer.
/// Any other spec (an O or MLP bias, heads too wide to norm in a warp)
/// runs the GEMM layer.
fn gemv_layer_runs(c: &ModelConfig) -> bool {
    let d = c.head_dim;
    let qk_norm_fits = d.is_power_of_two() && d <= kernels::consts::HADAMARD_MAX_DIM;
    let mut gemv = c.llama_spec();
    gemv.norm_weight_offset = c.spec.norm_weight_offset;
    gemv.embed_scale = c.spec.embed_scale;
    gemv.final_logit_softcap = c.spec.final_logit_softcap;
    for (r, l) in gemv.layers.iter_mut().zip(&c.spec.layers) {
        let (ra, la) = (&mut r.attention, &l.attention);
        (ra.scale, ra.window, ra.logit_softcap) = (la.scale, la.window, la.logit_softcap);
        ra.qkv_bias = la.qkv_bias;
        ra.qk_norm = la.qk_norm && qk_norm_fits;
        r.rope = l.rope.clone();
        r.mlp.activation = l.mlp.activation;
        (r.post_attention_norm, r.post_mlp_norm) = (l.post_attention_norm, l.post_mlp_norm);
    }
    gemv.first_difference(&c.spec).is_none()
}

/// The plan's fixed inputs for model `c` (projections in weight format
/// `format`) on a device of `sms` SMs.
fn tuning(
    c: &ModelConfig,
    kv: KvShape,
    opts: &CudaOptions,
    sms: usize,
    format: kernels::gemv::WeightFormat,
) -> Result<Tuning, BackendError> {
    let shape = HeadShape {
        num_heads: c.num_heads,
        num_kv_heads: c.num_kv_heads,
        head_dim: c.head_dim,
    };
    // two waves of blocks: enough to hide the latency of short contexts
    let mut decode = DecodePlan::new(shape, 2 * sms)
        .and_then(|p| match opts.decode_min_chunk {
            Some(keys) => p.with_min_chunk(keys),
            None => Ok(p),
        })
        .map_err(|e| dev_err("planning decode attention", e))?;
    if opts.deterministic {
        decode = decode.invariant();
    }
    // input widths the GEMVs cannot take run every step on the GEMMs
    let fits = [c.hidden_size, c.q_dim(), c.intermediate_size]
        .iter()
        .all(|&k| kernels::gemv::width_fits(k, format));
    let gemv_rows = if fits && gemv_layer_runs(c) && !opts.deterministic {
        opts.gemv_rows.min(MAX_GEMV_ROWS)
    } else {
        0
    };
    let narrow_decode_seqs = match opts.narrow_decode_seqs {
        Some(0) => usize::MAX,
        Some(n) => n,
        None => (2 * sms).div_ceil(c.num_kv_heads.max(1)),
    };
    Ok(Tuning {
        shape,
        decode,
        block_size: kv.block_size,
        hidden: c.hidden_size,
        vocab: c.vocab_size,
        num_layers: c.num_layers,
        gemv_rows,
        narrow_decode_seqs,
        lora_h: 0,
        lora_wide: 0,
        deterministic: opts.deterministic,
        persistent: opts.persistent_decode && !opts.deterministic,
        persistent_trace: opts.persistent_trace,
    })
}

/// The CUDA backend (see the module doc).
pub struct CudaBackend {
    config: ModelConfig,
    kv: KvShape,
    device: usize,
    tuning: Tuning,
    model: DeviceModel,
    /// The LoRA adapter slots (`lora`).
    lora: lora::LoraPool,
    ws: Workspace,
    graphs: DecodeGraphs,
    pipe: Pipe,
    blas: Blas,
    /// The GEMM path's products: the fast ones, or deterministic mode's
    /// pinned ones (`linear`, `invariant`).
    products: Box<dyn linear::Products>,
    k: Kernels,
    gpu: Arc<Gpu>,
}

/// Refuses a spec with a field the CUDA layers do not run, naming it: the
/// GEMM layer runs Llama's plus the Q/K/V, O and MLP biases, QK-norm, the
/// output norms, each layer's RoPE, one gated
/// activation for every layer, the norms' weight offset, the embedding
/// scale and the final soft-cap; both run each layer's attention scale and
/// sliding window (the attention kernels take the layer's rule). The
/// attention soft-cap is not run yet (`kernels::rule_args` refuses it too).
fn check_spec(c: &ModelConfig) -> Result<(), BackendError> {
    let mut runs = c.llama_spec();
    let act = c.spec.layers[0].mlp.activation;
    for (r, l) in runs.layers.iter_mut().zip(&c.spec.layers) {
        let (a, b) = (&mut r.attention, &l.attention);
        (a.qkv_bias, a.o_bias, a.qk_norm) = (b.qkv_bias, b.o_bias, b.qk_norm);
        (a.scale, a.window) = (b.scale, b.window);
        (r.mlp.bias, r.mlp.activation) = (l.mlp.bias, act);
        (r.post_attention_norm, r.post_mlp_norm) = (l.post_attention_norm, l.post_mlp_norm);
        r.rope = l.rope.clone();
    }
    runs.norm_weight_offset = c.spec.norm_weight_offset;
    runs.embed_scale = c.spec.embed_scale;
    runs.final_logit_softcap = c.spec.final_logit_softcap;
    match c.spec.first_difference(&runs) {
        None => Ok(()),
        Some(field) => Err(BackendError::Device(format!(
            "cuda: the model's `{field}` is not supported by the CUDA backend yet; run it on the CPU (`--device cpu`)"
        ))),
    }
}

impl CudaBackend {
    /// Uploads `weights` to device `device` (each projection in its stored
    /// format: `weights` module doc) and allocates a KV pool of
    /// `kv.num_blocks` blocks of `kv.block_size` tokens.
    pub fn new(
        config: ModelConfig,
        weights: &ModelWeights,
        kv: KvShape,
        device: usize,
        opts: CudaOptions,
    ) -> Result<CudaBackend, BackendError> {
        check_kv_cache_dtype(opts.kv_cache_dtype)?;
        check_spec(&config)?;
        available().map_err(BackendError::Device)?;
        if kv.num_blocks == 0 || kv.block_size == 0 {
            return Err(BackendError::Device(format!(
                "cuda: KV pool needs num_blocks > 0 and block_size > 0, got {kv:?}"
            )));
        }
        let gpu = Gpu::new(device).map_err(|e| dev_err(&format!("opening device {device}"), e))?;
        let k = Kernels::load(&gpu, opts.kernels).map_err(|e| dev_err("loading kernels", e))?;
        let blas = Blas::new(&gpu).map_err(|e| dev_err("creating the cuBLAS handle", e))?;
        let sms = gpu
            .sm_count()
            .map_err(|e| dev_err("querying the SM count", e))?;
        let format = weights::projection_format(weights);
        let mut tuning = tuning(&config, kv, &opts, sms, format)?;
        let lora = lora::LoraPool::new(&gpu, &config, opts.max_loras, opts.max_lora_rank)?;
        if opts.max_loras > 0 {
            // the LoRA kernels' 16-byte loads need input widths that are multiples of 8
            let widths = [config.hidden_size, config.q_dim(), config.intermediate_size];
            if widths.iter().any(|k| !k.is_multiple_of(8)) {
                return Err(BackendError::Device(format!(
                    "invalid `--max-loras {}`: the CUDA backend runs LoRA adapters only on models whose hidden, attention and MLP widths ({widths:?}) are multiples of 8; run them on the CPU (`--device cpu`)",
                    opts.max_loras
                )));
            }
            tuning.lora_h = lora.h_width();
            if !opts.deterministic {
                tuning.lora_wide = lora.slots() * lora.h_width();
            }
        }
        let model = DeviceModel::upload(&gpu, &config, weights, kv, opts.kv_cache_dtype)?;
        let caps = Caps {
            tokens: 16,
            rows: 1,
            decode_seqs: 1,
            meta: 1024,
        };
        let lt = match model.w.widened {
            Some(_) if opts.fp8_activations => match gpu::BlasLt::new(&gpu) {
                Ok(lt) => Some(lt),
                Err(e) => {
                    tracing::warn!("FP8 GEMMs widen to bf16: cuBLASLt unavailable ({e})");
                    None
                }
            },
            _ => None,
        };
        let ws = Workspace::new(&gpu, &config, &tuning, caps, lt.is_some())?;
        let pipe = Pipe::new(&gpu)?;
        let fp8_acts = lt.is_some();
        gpu.synchronize().map_err(|e| dev_err("initialising", e))?;
        let mut made = CudaBackend {
            graphs: DecodeGraphs::new(opts.graphs, model.rope_rows.div_ceil(kv.block_size)),
            config,
            kv,
            device,
            tuning,
            model,
            lora,
            ws,
            pipe,
            blas,
            products: Box::new(linear::Fast { lt }),
            k,
            gpu,
        };
        if opts.deterministic {
            let inv = gpu::InvariantGemm::new(&made.gpu)
                .map_err(|e| dev_err("creating the deterministic GEMMs", e))?;
            made.products = Box::new(made.pin_invariant(inv, opts.det_gemm, fp8_acts)?);
        }
        Ok(made)
    }

    /// The bytes of the weights as uploaded, by the part of a step that
    /// reads them.
    pub fn weight_bytes(&self) -> crate::WeightBytes {
        self.model.w.bytes()
    }

    /// Turns graph capture/replay of pure-decode steps on or off (tests compare both).
    pub fn set_graphs(&mut self, enabled: bool) {
        self.graphs.set_enabled(enabled);
    }

    /// Number of captured decode graphs (one per bucket seen).
    pub fn num_graphs(&self) -> usize {
        self.graphs.len()
    }

    /// Why a failed capture turned decode graphs off, if one did.
    pub fn graph_failure(&self) -> Option<&str> {
        self.graphs.failure.as_deref()
    }

    /// Captured decode graphs whose layers run on the persistent kernel.
    pub fn num_persistent_graphs(&self) -> usize {
        self.graphs.persistent()
    }

    /// The op timings of the latest launch of the persistent kernel in
    /// the one-sequence decode graph, when traced
    /// ([`CudaOptions::persistent_trace`]); blocking.
    pub fn persistent_trace(
        &self,
    ) -> Result<Option<Vec<kernels::persistent::OpTime>>, BackendError> {
        let Some(p) = self.graphs.persistent_program(1) else {
            return Ok(None);
        };
        p.trace(self.k.gpu()).map_err(|e| {
            BackendError::Device(format!("reading the persistent kernel's trace: {e}"))
        })
    }

    /// [`StepBatch::check`] with what this backend indexes with: token ids
    /// below the vocabulary, positions below the RoPE table (the longest
    /// context), and every block attention reads inside the pool.
    pub fn check_batch(&self, batch: &StepBatch) -> Result<(), BackendError> {
        batch.check(self.kv, self.config.vocab_size, self.model.rope_rows)?;
        self.lora.check(batch)
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> String {
        use kernels::gemv::WeightFormat;
        let w = &self.model.w;
        let mut notes: Vec<String> = Vec::new();
        let head_fp8 = w
            .lm_head
            .as_ref()
            .is_some_and(|p| p.format() == WeightFormat::Fp8Row);
        let fp8 = w.projections().any(|p| p.format() == WeightFormat::Fp8Row);
        let note = self.products.note();
        match (fp8, head_fp8) {
            (true, true) => notes.push(format!("fp8 weights and LM head{note}")),
            (true, false) => notes.push(format!("fp8 weights{note}")),
            (false, _) => {}
        }
        let mut blocks: Vec<String> = (w.projections())
            .filter(|p| p.format().layout().is_some())
            .map(|p| format!("{:?}", p.format()).to_lowercase())
            .collect();
        blocks.sort_unstable();
        blocks.dedup();
        if !blocks.is_empty() {
            notes.push(format!("gguf {} weights", blocks.join("+")));
        }
        if self.model.cache.dtype() != KvCacheDtype::Bf16 {
            notes.push("fp8 KV".into());
        }
        if self.tuning.deterministic {
            notes.push("deterministic".into());
        }
        match notes.is_empty() {
            true => format!("cuda:{}", self.device),
            false => format!("cuda:{} ({})", self.device, notes.join(", ")),
        }
    }

    fn deterministic(&self) -> bool {
        self.tuning.deterministic
    }

    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn kv_shape(&self) -> KvShape {
        self.kv
    }

    fn reserve(&mut self, max_tokens: usize, max_seqs: usize) -> Result<(), BackendError> {
        self.reserve_steps(max_tokens, max_seqs)
    }

    fn launch(&mut self, batch: &StepBatch) -> Result<(), BackendError> {
        self.launch_step(batch, false)
    }

    fn launch_held(&mut self, batch: &StepBatch) -> Result<(), BackendError> {
        self.launch_step(batch, true)
    }

    fn release(&mut self, samples: &[Option<SampleRequest>]) -> Result<(), BackendError> {
        self.release_step(samples)
    }

    fn collect(&mut self) -> Result<Vec<Option<SampledToken>>, BackendError> {
        self.collect_step()
    }

    fn in_flight(&self) -> usize {
        self.pipe.in_flight()
    }

    /// Verify rows run eager on the GEMM path and plain decode rows on the
    /// GEMVs, so where logits are flat a seeded draw can land on another
    /// token of the same probability: `cuda::tests::spec` holds greedy rows
    /// and sampled rows' distributions, not sampled tokens.
    fn max_drafts(&self) -> usize {
        contract::backend::MAX_DRAFTS
    }

    /// A drafted sequence's verify rows become sequences of their own
    /// (`verify`), each staged with its own history.
    fn verifies_penalties(&self) -> bool {
        true
    }

    /// Likewise each with its own grammar mask (`StepBatch::row_request`).
    fn verifies_masks(&self) -> bool {
        true
    }

    fn max_loras(&self) -> usize {
        self.lora.slots()
    }

    fn set_lora(
        &mut self,
        slot: u32,
        adapter: Option<Arc<contract::LoraAdapter>>,
    ) -> Result<(), BackendError> {
        if let Some(a) = &adapter {
            // the rank limit is the pool's (--max-lora-rank); shapes are checked here
            a.check(&self.config, usize::MAX)
                .map_err(|e| BackendError::InvalidBatch(format!("LoRA adapter: {e}")))?;
        }
        self.lora.set(&self.gpu, slot, adapter.as_deref())
    }

    /// Every row runs to the final norm (no pruning; the bf16 `xn` rows
    /// are read back and the asked ones widened to f32).
    fn hidden(&mut self, batch: &StepBatch, rows: &[usize]) -> Result<Vec<f32>, BackendError> {
        check_rows_call(self.pipe.in_flight(), batch, rows, "a hidden-state call")?;
        self.check_batch(batch)?;
        self.run_hidden(batch)?;
        let h = self.config.hidden_size;
        let n = batch.num_tokens() * h;
        let view = (self.ws.xn.slice(0..n)).map_err(|e| dev_err("reading hidden states", e))?;
        let all = (self.gpu.to_host(view)).map_err(|e| dev_err("reading hidden states", e))?;
        let mut out = Vec::with_capacity(rows.len() * h);
        for &r in rows {
            out.extend(all[r * h..(r + 1) * h].iter().map(|v| v.to_f32()));
        }
        Ok(out)
    }

    fn logits(&mut self, batch: &StepBatch, rows: &[usize]) -> Result<Vec<f32>, BackendError> {
        check_rows_call(self.pipe.in_flight(), batch, rows, "a logits call")?;
        self.check_batch(batch)?;
        let greedy = [SampleParams::greedy()];
        if rows.is_empty() {
            self.run_eager(batch, &[0], &run::Sampling::none(&greedy), &[])?;
            self.gpu
                .synchronize()
                .map_err(|e| dev_err("running a step", e))?;
            return Ok(Vec::new());
        }
        let rows32: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
        let params = vec![SampleParams::greedy(); rows.len()];
        self.run_eager(batch, &rows32, &run::Sampling::none(&params), &[])?;
        let n = rows.len() * self.config.vocab_size;
        let view = self
            .ws
            .logits
            .slice(0..n)
            .map_err(|e| dev_err("reading logits", e))?;
        self.gpu
            .to_host(view)
            .map_err(|e| dev_err("reading logits", e))
    }
}
