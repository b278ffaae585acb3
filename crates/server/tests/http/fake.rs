//! A deterministic fake model for the server's tests: over the synthetic
//! `tiny` preset's byte-level vocabulary (byte `b` is id `b`), the next
//! token after a letter `a`..`x` is the following letter, after `y` it is
//! EOS, after anything else `a`. So a prompt ending in `a` continues
//! "bcdefghijklmnopqrstuvwxy" and stops; with `ignore_eos` it cycles.
//! With a `script`, every reply is instead the script's tokens, then EOS.
//! Each chosen token has logprob -0.5; the k alternatives follow it.

use std::sync::Arc;
use std::time::Duration;

use contract::presets::Preset;
use contract::{BackendError, HostPipeline, KvShape, ModelConfig, SampledToken, StepBatch};
use engine::testing::fake_hidden;
use engine::{Engine, EngineConfig};
use tokenizer::Tokenizer;
use tokenizer::byte_level::{tokenizer_config_json, tokenizer_json};

pub const BLOCK_SIZE: usize = 16;

pub struct LetterBackend {
    config: ModelConfig,
    shape: KvShape,
    eos: u32,
    delay: Duration,
    fail_on: Option<u32>,
    script: Option<Vec<u32>>,
    pipe: HostPipeline,
}

impl LetterBackend {
    pub fn next(&self, last: u32) -> u32 {
        match u8::try_from(last) {
            Ok(b) if (b'a'..=b'x').contains(&b) => u32::from(b + 1),
            Ok(b'y') => self.eos,
            _ => u32::from(b'a'),
        }
    }
}

impl contract::HostCompute for LetterBackend {
    fn name(&self) -> String {
        "letters".into()
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

    /// One step's samples (a resolved batch).
    fn compute(&mut self, batch: &StepBatch) -> Result<Vec<Option<SampledToken>>, BackendError> {
        batch.validate(self.shape.num_blocks, self.shape.block_size)?;
        if let Some(bad) = self.fail_on
            && batch.tokens.contains(&bad)
        {
            return Err(BackendError::Device(format!(
                "injected device fault on token {bad}"
            )));
        }
        if !self.delay.is_zero() {
            std::thread::sleep(self.delay);
        }
        let out = (0..batch.num_seqs())
            .map(|s| {
                let req = batch.samples[s].as_ref()?;
                let last = batch.tokens[batch.cu_seqlens[s + 1] as usize - 1];
                let token = match (&self.script, batch.prompt_lens.get(s)) {
                    (Some(script), Some(&prompt)) => {
                        let k = (batch.context_lens[s] - prompt) as usize;
                        script.get(k).copied().unwrap_or(self.eos)
                    }
                    _ => self.next(last),
                };
                let top = (0..req.params.logprobs as u32)
                    .map(|i| ((token + i) % self.config.vocab_size as u32, -0.5 - i as f32))
                    .collect();
                Some(SampledToken {
                    token,
                    logprob: -0.5,
                    top_logprobs: top,
                    draft_rows: Vec::new(),
                })
            })
            .collect();
        Ok(out)
    }

    fn logits(&mut self, _batch: &StepBatch, _rows: &[usize]) -> Result<Vec<f32>, BackendError> {
        Err(BackendError::Device("the letter fake has no logits".into()))
    }

    /// A row's state is `fake_hidden` of its (token, position): the same
    /// however the row is batched.
    fn hidden(&mut self, batch: &StepBatch, rows: &[usize]) -> Result<Vec<f32>, BackendError> {
        contract::check_rows_call(0, batch, rows, "a hidden-state call")?;
        batch.validate(self.shape.num_blocks, self.shape.block_size)?;
        if let Some(bad) = self.fail_on
            && batch.tokens.contains(&bad)
        {
            return Err(BackendError::Device(format!(
                "injected device fault on token {bad}"
            )));
        }
        let h = self.config.hidden_size;
        Ok(rows
            .iter()
            .flat_map(|&r| fake_hidden(&[batch.tokens[r], batch.positions[r]], h))
            .collect())
    }
}

/// Knobs of a test engine.
pub struct Setup {
    pub delay: Duration,
    pub max_num_seqs: usize,
    pub max_queue: usize,
    pub num_blocks: usize,
    /// A step holding this token id fails (an injected device fault).
    pub fail_on: Option<u32>,
    pub halt_on_backend_error: bool,
    /// Every reply is these token ids (a byte is its own id), then EOS.
    pub script: Option<Vec<u32>>,
    /// The first filler token is named `<|python_tag|>` (Llama 3's call marker).
    pub call_marker: bool,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            delay: Duration::ZERO,
            max_num_seqs: 8,
            max_queue: 0,
            num_blocks: 64,
            fail_on: None,
            halt_on_backend_error: false,
            script: None,
            call_marker: false,
        }
    }
}

/// An engine over the letter fake and its tokenizer.
pub fn engine(setup: Setup) -> (Engine, Arc<Tokenizer>) {
    let mut config = Preset::Tiny.config().expect("tiny preset config");
    if setup.script.is_some() {
        // room for the tools' system text (one token per byte)
        config.max_position_embeddings = 4096;
    }
    let bos = config.bos_token_id.expect("tiny preset has a BOS");
    let eos = config.eos_token_ids[0];
    let mut json = tokenizer_json(config.vocab_size, bos, eos);
    if setup.call_marker {
        json = json.replace("<|filler_0|>", server::tools::CALL_MARKER);
    }
    let tok = Tokenizer::from_json(
        &json,
        Some(&tokenizer_config_json(config.max_position_embeddings)),
        "letters",
    )
    .expect("byte tokenizer");
    let tok = Arc::new(tok);
    let backend = LetterBackend {
        shape: KvShape {
            num_blocks: setup.num_blocks,
            block_size: BLOCK_SIZE,
        },
        config,
        eos,
        delay: setup.delay,
        fail_on: setup.fail_on,
        script: setup.script,
        pipe: HostPipeline::default(),
    };
    let engine = Engine::start(
        Box::new(backend),
        tok.clone(),
        vec![eos],
        EngineConfig {
            max_num_seqs: setup.max_num_seqs,
            max_batch_tokens: 512,
            enable_prefix_cache: true,
            max_queue: setup.max_queue,
            max_step_time: None,
            halt_on_backend_error: setup.halt_on_backend_error,
            async_steps: true,
            speculative: None,
            ..EngineConfig::default()
        },
    )
    .expect("engine starts");
    (engine, tok)
}
