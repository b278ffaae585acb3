//! Test support: a deterministic fake [`Backend`] that really uses the paged
//! metadata, and a matching byte-level tokenizer. For the engine's tests and
//! benchmark, and for other crates' tests (the server's) that need an engine
//! without a model.
//!
//! Contract: a step ([`Backend::step`], or [`Backend::launch`] with its
//! carried tokens resolved by [`HostPipeline`]; [`FakeBackend::unpipelined`]
//! turns launches off) validates the batch, stores every token id
//! into its KV slot (`slot_mapping`), and for each sampled sequence reads its
//! whole context back through its block table and returns
//! [`fake_next_token`] of that context. A wrong slot, a wrong block table, a
//! prefix-cache hit on stale blocks or a wrong preemption recompute therefore
//! changes the tokens (or fails the step on a never-written slot). Tokens are
//! a pure function of (context, seed, step), so [`reference_generate`]
//! predicts what any correct engine must produce, however it batches.
//!
//! [`Backend::hidden`] stores the tokens the same way and returns
//! [`fake_hidden`] of each asked row's context, read back likewise.
//!
//! Costs: O(T) writes plus O(context) reads per sampled sequence per step; the
//! `cheap` variant skips the context read (O(T + S)) for overhead benchmarks.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use contract::presets::Preset;
use contract::sampling::splitmix64;
use contract::{
    Backend, BackendError, HostPipeline, KvShape, ModelConfig, SampleRequest, SampledToken,
    StepBatch,
};
use tokenizer::byte_level::{tokenizer_config_json, tokenizer_json};
use tokenizer::{Tokenizer, TokenizerError};

/// Marks a KV slot no step has written.
const EMPTY: u32 = u32::MAX;

/// The configuration the fake imitates: the synthetic `tiny` preset.
pub fn fake_config() -> Result<ModelConfig, contract::ConfigError> {
    Preset::Tiny.config()
}

/// The byte-level tokenizer matching [`fake_config`] (its vocabulary, BOS and EOS).
pub fn fake_tokenizer(config: &ModelConfig) -> Result<Tokenizer, TokenizerError> {
    let bos = config.bos_token_id.unwrap_or(0);
    let eos = config.eos_token_ids.first().copied().unwrap_or(1);
    Tokenizer::from_json(
        &tokenizer_json(config.vocab_size, bos, eos),
        Some(&tokenizer_config_json(config.max_position_embeddings)),
        "fake tokenizer",
    )
}

/// The token the fake model produces after `context` (prompt + generated so
/// far) for the sample request `req`: a hash of the context, mixed with the
/// seed and step unless greedy; under a grammar's mask that the hash's token
/// breaks, the allowed token of rank `hash % allowed count`.
pub fn fake_next_token(context: &[u32], vocab: usize, req: &SampleRequest) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &t in context {
        h = (h ^ u64::from(t)).wrapping_mul(0x100_0000_01b3);
    }
    if !req.params.is_greedy() {
        h = splitmix64(h ^ splitmix64(req.params.seed ^ splitmix64(req.step)));
    }
    let h = splitmix64(h);
    let token = (h % vocab as u64) as u32;
    match &req.allowed {
        Some(m) if !m.allows(token) && m.count() > 0 => {
            let rank = (h % m.count() as u64) as usize;
            (0..vocab as u32)
                .filter(|&t| m.allows(t))
                .nth(rank)
                .unwrap_or(token)
        }
        _ => token,
    }
}

/// The fake model's final hidden state after `context`: `hidden` values
/// in [-1, 1), a hash of the context and the index (what
/// `Backend::hidden` returns at that context's last token).
pub fn fake_hidden(context: &[u32], hidden: usize) -> Vec<f32> {
    let mut h: u64 = 0x9e37_79b9_7f4a_7c15;
    for &t in context {
        h = splitmix64(h ^ u64::from(t));
    }
    (0..hidden as u64)
        .map(|j| (splitmix64(h ^ j) >> 40) as f32 / (1u64 << 23) as f32 - 1.0)
        .collect()
}

/// What a correct engine generates for `prompt`: up to `max_tokens` tokens,
/// stopping after the first of `eos` unless `ignore_eos`.
pub fn reference_generate(
    prompt: &[u32],
    vocab: usize,
    params: &contract::SamplingParams,
    max_tokens: usize,
    eos: &[u32],
    ignore_eos: bool,
) -> Vec<u32> {
    let mut ctx = prompt.to_vec();
    let mut out = Vec::new();
    while out.len() < max_tokens {
        let req = SampleRequest {
            params: params.clone(),
            step: out.len() as u64,
            history: None,
            allowed: None,
        };
        let t = fake_next_token(&ctx, vocab, &req);
        ctx.push(t);
        out.push(t);
        if !ignore_eos && eos.contains(&t) {
            break;
        }
    }
    out
}

/// A deterministic backend over a KV pool of token ids.
pub struct FakeBackend {
    config: ModelConfig,
    shape: KvShape,
    /// `[num_blocks * block_size]` token id stored in each slot.
    kv: Vec<u32>,
    read_context: bool,
    step_delay: Option<Duration>,
    fail_on_token: Option<u32>,
    nan_on_token: Option<u32>,
    context: Vec<u32>,
    /// Launched steps (computed at launch).
    pipe: HostPipeline,
    /// Steps launched held (`Backend::launch_held`), counted for tests.
    held_steps: Arc<AtomicUsize>,
    /// `(tokens, sequences)` of every step computed, in order, for tests.
    shapes: Arc<std::sync::Mutex<Vec<(usize, usize)>>>,
}

impl FakeBackend {
    /// A validated step's bookkeeping: the injected failure, the recorded
    /// shape, its tokens stored in their KV slots.
    fn store(&mut self, batch: &StepBatch) -> Result<(), BackendError> {
        if let Some(bad) = self.fail_on_token
            && batch.tokens.contains(&bad)
        {
            return Err(BackendError::Device(format!(
                "injected failure on token {bad}"
            )));
        }
        if let Ok(mut shapes) = self.shapes.lock() {
            shapes.push((batch.tokens.len(), batch.num_seqs()));
        }
        for (&slot, &tok) in batch.slot_mapping.iter().zip(&batch.tokens) {
            self.kv[slot as usize] = tok;
        }
        Ok(())
    }

    /// A fake that reads each sampled sequence's context back through its block table.
    pub fn new(config: ModelConfig, shape: KvShape) -> Self {
        FakeBackend {
            config,
            shape,
            kv: vec![EMPTY; shape.num_blocks * shape.block_size],
            read_context: true,
            step_delay: None,
            fail_on_token: None,
            nan_on_token: None,
            context: Vec::new(),
            pipe: HostPipeline::default(),
            held_steps: Arc::new(AtomicUsize::new(0)),
            shapes: Arc::default(),
        }
    }

    /// `(tokens, sequences)` of every step computed so far (shared: read it
    /// after the backend moved into an engine).
    pub fn step_shapes(&self) -> Arc<std::sync::Mutex<Vec<(usize, usize)>>> {
        self.shapes.clone()
    }

    /// The count of steps launched held so far (shared: read it after the
    /// backend moved into an engine).
    pub fn held_steps(&self) -> Arc<AtomicUsize> {
        self.held_steps.clone()
    }

    /// A fake that only hashes the last token and its position (O(T + S) per
    /// step), for measuring the engine's own overhead.
    pub fn cheap(config: ModelConfig, shape: KvShape) -> Self {
        FakeBackend {
            read_context: false,
            ..Self::new(config, shape)
        }
    }

    /// Sleeps this long in every step (to make timing-dependent tests robust).
    pub fn with_step_delay(mut self, d: Duration) -> Self {
        self.step_delay = Some(d);
        self
    }

    /// Fails every step whose batch contains `token` (to test error paths).
    pub fn with_fail_on_token(mut self, token: u32) -> Self {
        self.fail_on_token = Some(token);
        self
    }

    /// Samples with a NaN log-probability (what non-finite logits give) for
    /// every sequence whose context holds `token` (needs a context-reading fake).
    pub fn with_nan_on_token(mut self, token: u32) -> Self {
        self.nan_on_token = Some(token);
        self
    }
}

impl contract::HostCompute for FakeBackend {
    fn name(&self) -> String {
        "fake".into()
    }

    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn kv_shape(&self) -> KvShape {
        self.shape
    }

    fn pipeline(&self) -> &HostPipeline {
        &self.pipe
    }

    fn pipeline_mut(&mut self) -> &mut HostPipeline {
        &mut self.pipe
    }

    /// One step's samples (see the module doc) of a batch with no carried tokens.
    fn compute(&mut self, batch: &StepBatch) -> Result<Vec<Option<SampledToken>>, BackendError> {
        let bs = self.shape.block_size;
        batch.validate(self.shape.num_blocks, bs)?;
        if let Some(d) = self.step_delay {
            std::thread::sleep(d);
        }
        self.store(batch)?;
        let mut out = Vec::with_capacity(batch.num_seqs());
        for (s, sample) in batch.samples.iter().enumerate() {
            let Some(req) = sample else {
                out.push(None);
                continue;
            };
            let rows = batch.sampled_rows(s);
            let mut first = self.sample_row(batch, s, rows.start, req)?;
            for row in rows.skip(1) {
                let r = batch.row_request(s, row).unwrap_or_else(|| req.clone());
                first.draft_rows.push(self.sample_row(batch, s, row, &r)?);
            }
            out.push(Some(first));
        }
        Ok(out)
    }

    fn max_drafts(&self) -> usize {
        contract::backend::MAX_DRAFTS
    }

    fn verifies_penalties(&self) -> bool {
        true
    }

    fn verifies_masks(&self) -> bool {
        true
    }

    fn held(&mut self) {
        self.held_steps.fetch_add(1, Ordering::Relaxed);
    }

    /// [`fake_hidden`] of each row's context, read back through its block
    /// table after the step's tokens are stored.
    fn hidden(&mut self, batch: &StepBatch, rows: &[usize]) -> Result<Vec<f32>, BackendError> {
        contract::check_rows_call(self.pipe.in_flight(), batch, rows, "a hidden-state call")?;
        batch.validate(self.shape.num_blocks, self.shape.block_size)?;
        self.store(batch)?;
        let hidden = self.config.hidden_size;
        let mut out = Vec::with_capacity(rows.len() * hidden);
        for &row in rows {
            let s = batch.cu_seqlens.partition_point(|&c| c as usize <= row) - 1;
            self.read_row_context(batch, s, row)?;
            out.extend(fake_hidden(&self.context, hidden));
        }
        Ok(out)
    }

    fn logits(&mut self, batch: &StepBatch, rows: &[usize]) -> Result<Vec<f32>, BackendError> {
        // one-hot logits of the tokens `step` would sample at those rows
        let vocab = self.config.vocab_size;
        let sampled = self.step(batch)?;
        let mut out = vec![0.0; rows.len() * vocab];
        for (r, &row) in rows.iter().enumerate() {
            let seq = batch.cu_seqlens.iter().position(|&c| c as usize == row + 1);
            let tok = seq.and_then(|s| sampled.get(s.checked_sub(1)?)?.as_ref());
            match tok {
                Some(t) => out[r * vocab + t.token as usize] = 1.0,
                None => {
                    return Err(BackendError::InvalidBatch(format!(
                        "row {row} is not a sampled sequence's last token"
                    )));
                }
            }
        }
        Ok(out)
    }
}

impl FakeBackend {
    /// The context of token row `row` of sequence `s` (its positions up to
    /// that row's) read back through the block table into `self.context`.
    fn read_row_context(
        &mut self,
        batch: &StepBatch,
        s: usize,
        row: usize,
    ) -> Result<(), BackendError> {
        let bs = self.shape.block_size;
        let ctx = batch.positions[row] as usize + 1;
        let table = batch.block_table(s);
        self.context.clear();
        for p in 0..ctx {
            let v = self.kv[table[p / bs] as usize * bs + p % bs];
            if v == EMPTY {
                return Err(BackendError::InvalidBatch(format!(
                    "sequence {s} reads position {p}, whose slot was never written"
                )));
            }
            self.context.push(v);
        }
        Ok(())
    }

    /// The fake's sample at token row `row` of sequence `s` (its context:
    /// the positions up to that row's).
    fn sample_row(
        &mut self,
        batch: &StepBatch,
        s: usize,
        row: usize,
        req: &SampleRequest,
    ) -> Result<SampledToken, BackendError> {
        let vocab = self.config.vocab_size;
        let ctx = batch.positions[row] as usize + 1;
        let token = if self.read_context {
            self.read_row_context(batch, s, row)?;
            fake_next_token(&self.context, vocab, req)
        } else {
            fake_next_token(&[batch.tokens[row], ctx as u32], vocab, req)
        };
        let top = (0..req.params.logprobs)
            .map(|i| ((token + i as u32) % vocab as u32, -(i as f32)))
            .collect();
        let poisoned = self.read_context
            && self
                .nan_on_token
                .is_some_and(|bad| self.context.contains(&bad));
        Ok(SampledToken {
            token,
            logprob: if poisoned {
                f32::NAN
            } else {
                -((token % 10) as f32) / 10.0
            },
            top_logprobs: top,
            draft_rows: Vec::new(),
        })
    }
}
