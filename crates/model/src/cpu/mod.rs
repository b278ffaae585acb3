//! The CPU backend: the numerical reference implementation of [`Backend`],
//! and its fast path.
//!
//! Contract: [`CpuBackend`] runs any [`StepBatch`] that passes
//! [`StepBatch::check`] against its vocabulary, RoPE table and KV pool
//! ([`CpuBackend::check_batch`]: token ids inside the vocabulary, positions
//! inside the RoPE table, every block-table entry attention will read inside
//! the pool, slots matching the tables); anything else is a
//! [`BackendError::InvalidBatch`] naming the field, never a panic. BF16
//! weights are converted to f32 on the fly, arithmetic is f32, RoPE tables
//! are built once, and the KV cache lives in a paged pool (see
//! [`attention::KvPool`]) addressed only through the batch's slots and block
//! tables. Every operation (matmul, RMSNorm, RoPE, attention, SwiGLU,
//! embedding) is the `ops` crate's, and the KV pool stores K/V as
//! [`CpuBackend::with_kv_cache_dtype`] says: f32 unless asked (the
//! constructors' default: the exact reference the golden tests hold to
//! the oracle), BF16 (the CLI's default) or FP8 e4m3 at the weights'
//! per-layer scales; the write rounds to the stored type and attention
//! widens each row as it reads it (`ops::kv`), never the whole cache. The
//! reference path's operations are the same code the CUDA kernels' tests
//! use as their reference ([`CpuPath::Reference`], what [`CpuBackend::new`]
//! builds and the golden tests hold to the oracle). [`CpuPath::Fast`]
//! ([`CpuBackend::with_path`], what the CLI runs) computes the same step
//! with the `cpu-kernels` crate: SIMD chosen at run time, fused Q/K/V and
//! gate/up products over weights packed once at construction, a blocked
//! GEMM for prefill and reused activation buffers (see `fast`). Logits are computed only for sampled rows (or the rows
//! [`Backend::logits`] asks for); sampling is [`ops::sampling::sample`].
//! [`Backend::hidden`] runs the same pass and stops after the final norm.
//!
//! Both paths run the layer the model's spec describes (`layer`: biases,
//! QK-norm, norm-gain offset, activation, output norms, embedding scale,
//! final soft-cap, each layer's RoPE table, attention scale, soft-cap and
//! sliding window): every spec field runs on both.
//! A windowed layer's KV rows outside its window stay in the pool (the
//! scheduler frees blocks by sequence, not by layer).
//!
//! Costs: memory = the weights as the path holds them (BF16, FP8
//! projections widened to BF16, ggml blocks at their size; see `packed`)
//! (+ one byte per projection weight for
//! the prompt products' 8-bit copy, on processors with AVX-512 BF16 and
//! VNNI) + `2 * layers * num_blocks * block_size *
//! kv_dim * dtype.bytes()` bytes of KV pool + RoPE tables `min(max_position_embeddings,
//! pool slots) * head_dim * 4` bytes per distinct RoPE of the layers. Per step, see `forward`. Parallel with
//! rayon's global pool.

pub mod attention;
pub mod batch;
mod decode;
mod fast;
mod forward;
mod layer;
mod lora;
mod packed;

pub(crate) use packed::int4_matrix;
pub use packed::{CpuWeights, KEPT_GGML_TYPES};

#[cfg(test)]
mod det_tests;
#[cfg(test)]
mod fp8_tests;
#[cfg(test)]
mod int4_tests;
#[cfg(test)]
mod k_quant_tests;
#[cfg(test)]
mod kv_tests;
#[cfg(test)]
mod lora_tests;
#[cfg(test)]
mod spec_tests;
#[cfg(test)]
mod split_tests;
#[cfg(test)]
pub(crate) mod tests;
#[cfg(test)]
mod variant_tests;

use attention::KvPool;
use checkpoint::projection::Projection;
use checkpoint::weights::{ModelWeights, Tensor};
use contract::HostPipeline;
use contract::backend::{BackendError, KvShape, SampledToken, StepBatch};
use contract::config::ModelConfig;
use contract::{KvCacheDtype, KvScales};
use cpu_kernels::Isa;
use fast::{FastWeights, Workspace};
use ops::rope::LayerRopes;
use ops::sampling::sample;
use rayon::prelude::*;

/// Which arithmetic the CPU backend runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CpuPath {
    /// The `ops` reference operations, op by op (the golden tests' path).
    #[default]
    Reference,
    /// The `cpu-kernels` operations: the same arithmetic, reordered sums,
    /// run-time SIMD, fused projections, no per-step buffers.
    Fast,
}

/// What a forward pass returns for its output rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Out {
    /// `[R, vocab]`: the LM head's logits (soft-capped where the spec says).
    Logits,
    /// `[R, hidden]`: the hidden states after the final norm.
    Hidden,
}

/// The CPU backend (see the module doc).
pub struct CpuBackend {
    config: ModelConfig,
    /// The projections' buffers are empty (moved into `fast` or
    /// `reference`); embedding and norms stay.
    weights: ModelWeights,
    kv: KvShape,
    /// Each layer's norm gains and biases ([`layer::LayerVecs`]).
    norms: Vec<layer::LayerVecs>,
    final_norm: Vec<f32>, // [hidden] gain (the spec's offset folded in)
    /// Each layer's RoPE table.
    rope: LayerRopes,
    pool: KvPool,
    /// FP8 K/V's per-layer scales (the checkpoint's, else 1).
    kv_scales: KvScales,
    /// The packed projections of the fast path (`None`: reference path).
    fast: Option<FastWeights>,
    /// The reference path's projections (`None`: fast path).
    reference: Option<forward::RefWeights>,
    ws: Workspace,
    isa: Isa,
    /// Pipelined steps: computed at launch, collected in order.
    pipe: HostPipeline,
    /// How the fast path holds its weights ([`CpuWeights::describe`]).
    weights_name: String,
    /// LoRA adapter slots (none unless [`CpuBackend::with_max_loras`]).
    lora: lora::LoraSlots,
    /// Deterministic mode ([`CpuBackend::with_deterministic`]).
    deterministic: bool,
    /// FP8 activations ([`CpuBackend::with_fp8_activations`]).
    fp8_activations: bool,
}

impl CpuBackend {
    /// The reference backend ([`CpuPath::Reference`]): see [`Self::with_path`].
    pub fn new(
        config: ModelConfig,
        weights: ModelWeights,
        kv: KvShape,
    ) -> Result<Self, BackendError> {
        Self::with_path(config, weights, kv, CpuPath::Reference)
    }

    /// [`Self::with_weights`] with the weights as stored.
    pub fn with_path(
        config: ModelConfig,
        weights: ModelWeights,
        kv: KvShape,
        path: CpuPath,
    ) -> Result<Self, BackendError> {
        Self::with_weights(config, weights, kv, path, CpuWeights::Stored)
    }

    /// Builds the backend on `path`, checking every tensor's shape against
    /// `config` and allocating a zeroed KV pool of `kv.num_blocks *
    /// kv.block_size` slots; the fast path packs the layer projections here
    /// in `format`. The reference path runs BF16 values only: FP8
    /// projections are widened, ggml blocks and a quantised `format` are
    /// an error naming them.
    pub fn with_weights(
        config: ModelConfig,
        mut weights: ModelWeights,
        kv: KvShape,
        path: CpuPath,
        format: CpuWeights,
    ) -> Result<Self, BackendError> {
        check_weights(&config, &weights)?;
        if path == CpuPath::Reference && format != CpuWeights::Stored {
            return Err(BackendError::Device(format!(
                "cpu: the reference kernels run BF16 weights only, not {}; use the fast kernels for quantised weights",
                format.describe(&weights)
            )));
        }
        let weights_name = format.describe(&weights);
        if kv.num_blocks == 0 || kv.block_size == 0 {
            return Err(BackendError::Device(format!(
                "cpu: KV pool needs num_blocks > 0 and block_size > 0, got {kv:?}"
            )));
        }
        let slots = kv.num_blocks * kv.block_size;
        let rope = LayerRopes::new(&config, config.max_position_embeddings.min(slots));
        let kv_scales = weights.kv_scales_or_ones();
        let pool = KvPool::new(
            config.num_layers,
            slots,
            (config.kv_dim(), config.head_dim),
            kv.block_size,
            KvCacheDtype::F32,
            &kv_scales,
        );
        let offset = config.spec.norm_weight_offset;
        let norms = (weights.layers.iter())
            .map(|l| layer::LayerVecs::of(l, offset))
            .collect();
        let final_norm = layer::gain(&weights.norm, offset);
        let (fast, reference) = match path {
            CpuPath::Fast => {
                let panels = Isa::best() == Isa::Avx512;
                let layout = packed::Layout {
                    panels,
                    split: panels && cpu_kernels::isa::split_products(),
                };
                (Some(FastWeights::pack(&mut weights, format, layout)?), None)
            }
            CpuPath::Reference => (None, Some(forward::RefWeights::take(&mut weights)?)),
        };
        Ok(CpuBackend {
            config,
            weights,
            kv,
            norms,
            final_norm,
            rope,
            pool,
            kv_scales,
            fast,
            reference,
            ws: Workspace::default(),
            isa: Isa::best(),
            pipe: HostPipeline::default(),
            weights_name,
            lora: lora::LoraSlots::default(),
            deterministic: false,
            fp8_activations: false,
        })
    }

    /// The backend with FP8 activations (`--fp8-activations`) when `on`:
    /// every projection's input (not the LM head's) rounded to e4m3 with
    /// one scale per token (`ops::fp8::round_rows`), the values the CUDA
    /// backend's FP8 GEMMs multiply by; LoRA deltas read the unrounded
    /// input, as on CUDA. No faster here: the CPU reference of W8A8.
    pub fn with_fp8_activations(mut self, on: bool) -> Self {
        self.fp8_activations = on;
        self
    }

    /// The backend with its KV pool (zeroed) storing K and V as `dtype`
    /// (`--kv-cache-dtype`; FP8 at the weights' per-layer scales, else 1).
    /// The constructors store f32, the exact reference's.
    pub fn with_kv_cache_dtype(mut self, dtype: KvCacheDtype) -> Self {
        if dtype != self.pool.dtype() {
            let c = &self.config;
            let slots = self.kv.num_blocks * self.kv.block_size;
            // the old pool goes first: the two are never held together
            self.pool = KvPool::new(0, 0, (0, 0), self.kv.block_size, dtype, &self.kv_scales);
            self.pool = KvPool::new(
                c.num_layers,
                slots,
                (c.kv_dim(), c.head_dim),
                self.kv.block_size,
                dtype,
                &self.kv_scales,
            );
        }
        self
    }

    /// The backend with `n` empty LoRA adapter slots (`--max-loras`; the
    /// constructors have none).
    pub fn with_max_loras(mut self, n: usize) -> Self {
        self.lora = lora::LoraSlots::new(n);
        self
    }

    /// The backend in deterministic mode (`--deterministic`, see
    /// [`contract::Backend::deterministic`]) when `on`: the fast path runs
    /// every row, prompt or generated, on the products whose reduction order
    /// per row is fixed at any row count and thread count, and every
    /// token's attention on the decode kernel (see `fast`'s module doc for
    /// the list). The reference path is so already and does not change.
    /// The split products' 8-bit copies, which the mode never runs, are
    /// dropped.
    pub fn with_deterministic(mut self, on: bool) -> Self {
        self.deterministic = on;
        if on && let Some(f) = &mut self.fast {
            f.drop_split();
        }
        self
    }

    /// How the KV pool stores K and V.
    pub fn kv_cache_dtype(&self) -> KvCacheDtype {
        self.pool.dtype()
    }

    /// Runs every row of the fast path's BF16 products in f32, prompt rows
    /// too (drops the 8-bit copies [`cpu_kernels::gemm_split`] multiplies
    /// prompt rows with): for comparisons of the two.
    pub fn without_split_products(mut self) -> Self {
        if let Some(f) = &mut self.fast {
            f.drop_split();
        }
        self
    }

    /// The bytes of the weights as this path holds them, by the part of a
    /// step that reads them (the split products' 8-bit copies, which only
    /// prompt rows read, left out).
    pub fn weight_bytes(&self) -> crate::WeightBytes {
        let (projections, lm_head) = match (&self.fast, &self.reference) {
            (Some(f), _) => f.bytes(),
            (None, Some(r)) => r.bytes(),
            (None, None) => (0, None),
        };
        let norms: usize = self.norms.iter().map(layer::LayerVecs::bytes).sum();
        crate::WeightBytes {
            layers: projections + norms,
            final_norm: self.final_norm.len() * 4,
            embed: self.weights.embed.data.len() * 2,
            lm_head,
        }
    }

    /// The path this backend runs.
    pub fn path(&self) -> CpuPath {
        if self.fast.is_some() {
            CpuPath::Fast
        } else {
            CpuPath::Reference
        }
    }

    /// The step's logits (or hidden states, per `out`) of token rows
    /// `rows` on this backend's path.
    fn run(
        &mut self,
        batch: &StepBatch,
        rows: &[usize],
        out: Out,
    ) -> Result<Vec<f32>, BackendError> {
        if let Some(fast) = self.fast.take() {
            // the whole step on a pool thread: the products' parallel
            // loops then split work without a cold hand-off each
            let logits = rayon::scope(|_| self.forward_fast(&fast, batch, rows, out));
            self.fast = Some(fast);
            return Ok(logits);
        }
        let rw = self.reference.take().ok_or_else(|| {
            BackendError::Device("cpu: the backend holds no packed weights".into())
        })?;
        let logits = self.forward(&rw, batch, rows, out);
        self.reference = Some(rw);
        Ok(logits)
    }

    /// [`StepBatch::check`] with what this backend indexes with: token ids
    /// below the vocabulary, positions below the RoPE table, and every block
    /// attention reads (`ceil(context_len / block_size)` per sequence) in the pool.
    pub fn check_batch(&self, batch: &StepBatch) -> Result<(), BackendError> {
        batch.check(self.kv, self.config.vocab_size, self.rope.positions())?;
        self.lora.check(batch)
    }
}

impl contract::HostCompute for CpuBackend {
    fn name(&self) -> String {
        let mut det = String::new();
        for (on, tag) in [
            (self.deterministic, ", deterministic"),
            (self.fp8_activations, ", fp8 activations"),
        ] {
            if on {
                det += tag;
            }
        }
        match self.path() {
            CpuPath::Reference => format!("cpu (reference{det})"),
            CpuPath::Fast => {
                let split = match &self.fast {
                    Some(f) if f.splits() && !self.deterministic => "+bf16/vnni prompts",
                    _ => "",
                };
                format!(
                    "cpu ({}{split}, {}, {} KV{det})",
                    self.isa.name(),
                    self.weights_name,
                    self.pool.dtype()
                )
            }
        }
    }

    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn kv_shape(&self) -> KvShape {
        self.kv
    }

    fn pipeline(&self) -> &HostPipeline {
        &self.pipe
    }

    fn pipeline_mut(&mut self) -> &mut HostPipeline {
        &mut self.pipe
    }

    /// One step's samples (`[S]`, `Some` where requested).
    fn compute(&mut self, batch: &StepBatch) -> Result<Vec<Option<SampledToken>>, BackendError> {
        self.check_batch(batch)?;
        // [R] (sequence, token row) of every sampled row: a sequence's
        // last row, and with drafts the rows before it up to its drafts' first
        let sampled: Vec<(usize, usize)> = (0..batch.num_seqs())
            .flat_map(|s| batch.sampled_rows(s).map(move |r| (s, r)))
            .collect();
        let rows: Vec<usize> = sampled.iter().map(|&(_, r)| r).collect();
        let logits = self.run(batch, &rows, Out::Logits)?; // [R, vocab]
        let vocab = self.config.vocab_size;
        let tokens: Vec<(usize, SampledToken)> = sampled
            .par_iter()
            .zip(logits.par_chunks(vocab))
            .filter_map(|(&(s, r), z)| batch.row_request(s, r).map(|req| (s, sample(z, &req))))
            .collect();
        let mut out: Vec<Option<SampledToken>> = vec![None; batch.num_seqs()];
        // rows in order: a sequence's first sampled row, then its draft rows
        for (s, tok) in tokens {
            match &mut out[s] {
                Some(first) => first.draft_rows.push(tok),
                slot => *slot = Some(tok),
            }
        }
        Ok(out)
    }

    fn max_drafts(&self) -> usize {
        contract::backend::MAX_DRAFTS
    }

    fn verifies_penalties(&self) -> bool {
        true // each row samples with `StepBatch::row_request`'s history
    }

    fn verifies_masks(&self) -> bool {
        true // and with its grammar mask (`StepBatch::draft_masks`)
    }

    fn max_loras(&self) -> usize {
        self.lora.len()
    }

    fn deterministic(&self) -> bool {
        self.deterministic
    }

    fn set_lora(
        &mut self,
        slot: u32,
        adapter: Option<std::sync::Arc<contract::LoraAdapter>>,
    ) -> Result<(), BackendError> {
        if let Some(a) = &adapter {
            // the rank limit is the caller's (--max-lora-rank); shapes are ours
            a.check(&self.config, usize::MAX)
                .map_err(|e| BackendError::InvalidBatch(format!("LoRA adapter: {e}")))?;
        }
        self.lora.set(slot, adapter)
    }

    fn logits(&mut self, batch: &StepBatch, rows: &[usize]) -> Result<Vec<f32>, BackendError> {
        contract::check_rows_call(self.pipe.in_flight(), batch, rows, "a logits call")?;
        self.check_batch(batch)?;
        self.run(batch, rows, Out::Logits)
    }

    fn hidden(&mut self, batch: &StepBatch, rows: &[usize]) -> Result<Vec<f32>, BackendError> {
        contract::check_rows_call(self.pipe.in_flight(), batch, rows, "a hidden-state call")?;
        self.check_batch(batch)?;
        self.run(batch, rows, Out::Hidden)
    }
}

/// Checks every tensor's shape against the config (weights built in memory
/// bypass the loader's checks).
pub(crate) fn check_weights(c: &ModelConfig, w: &ModelWeights) -> Result<(), BackendError> {
    let (h, q, kv, i) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
    let shape = |t: &Tensor, want: &[usize]| {
        if t.shape != want || t.data.len() != t.numel() {
            Err(BackendError::Device(format!(
                "cpu: tensor `{}` has shape {:?} ({} values), expected {want:?}",
                t.name,
                t.shape,
                t.data.len()
            )))
        } else {
            Ok(())
        }
    };
    if w.layers.len() != c.num_layers {
        return Err(BackendError::Device(format!(
            "cpu: weights have {} layers, config has {}",
            w.layers.len(),
            c.num_layers
        )));
    }
    shape(&w.embed, &[c.vocab_size, h])?;
    shape(&w.norm, &[h])?;
    let proj = |p: &Projection, want: [usize; 2]| {
        p.check(want)
            .map_err(|e| BackendError::Device(format!("cpu: {e}")))
    };
    if let Some(head) = &w.lm_head {
        proj(head, [c.vocab_size, h])?;
    }
    for l in &w.layers {
        shape(&l.input_norm, &[h])?;
        shape(&l.post_norm, &[h])?;
        for (p, want) in l.projections().into_iter().zip([
            [q, h],
            [kv, h],
            [kv, h],
            [h, q],
            [i, h],
            [i, h],
            [h, i],
        ]) {
            proj(p, want)?;
        }
        for (&e, t) in &l.extras {
            shape(t, &e.shape(c))?;
        }
    }
    Ok(())
}
