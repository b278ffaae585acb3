//! The public handles: [`Engine`] (submit, stats, shutdown) and
//! [`RequestHandle`] (a request's event stream).
//!
//! Contract: `Engine` is a cheap `Clone + Send + Sync` handle; the step loop
//! runs on its own thread (see [`crate::worker`]). `submit` validates in the
//! caller's thread and never disturbs other requests: an empty prompt, a
//! token outside the vocabulary, bad sampling parameters, `max_tokens` 0,
//! prompt + max_tokens beyond the context, a prompt needing more KV blocks
//! than the whole pool, a constraint `llguidance` cannot compile (see
//! [`crate::grammar`]), a full queue or a shutdown are refused with a
//! [`SubmitError`] naming the numbers. Events go through an unbounded tokio
//! channel, so async code awaits [`RequestHandle::next`] and threads call
//! [`RequestHandle::blocking_next`]. Dropping a handle (or `cancel`) ends the
//! request at the next step and frees its blocks. Dropping the last `Engine`
//! clone shuts the loop down like [`Engine::shutdown`].
//!
//! Costs: `submit` is O(prompt) (the vocabulary check) plus one channel send;
//! `stats` is a handful of relaxed atomic loads.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use contract::sampling::choice_seed;
use contract::{Backend, ParamError};
use paged_kv::KvConfig;
use tokenizer::Tokenizer;
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use crate::embed::{EmbedError, EmbedHandle, EmbedJob, EmbedRequest};
use crate::grammar::{Constraint, GrammarCompiler, GrammarError};
use crate::lora::{LoraRegistry, LoraRegistryError, LoraSlots};
use crate::scheduler::{Scheduler, VerifyCaps};
use crate::speculate::SpecConfig;
use crate::types::{
    EngineConfig, EngineError, EngineStats, Event, FinishReason, GenerateRequest, SubmitError,
    Usage,
};
use crate::worker::{Msg, NewRequest, Shared, Worker};
use contract::LoraAdapter;

/// Handle to a running engine.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

struct Inner {
    tx: Sender<Msg>,
    shared: Arc<Shared>,
    join: Mutex<Option<JoinHandle<()>>>,
    cfg: EngineConfig,
    max_context: usize,
    vocab_size: usize,
    num_blocks: usize,
    block_size: usize,
    next_id: AtomicU64,
    /// Compiles the constraints of constrained requests (built lazily).
    grammar: GrammarCompiler,
    /// The loaded LoRA adapters (`crate::lora`).
    loras: Arc<LoraRegistry>,
    /// The model, to check adapters against.
    model: contract::ModelConfig,
    /// The backend's [`contract::Backend::deterministic`].
    deterministic: bool,
}

impl Engine {
    /// Starts the step loop on its own thread with a KV manager sized from
    /// `backend.kv_shape()`. `eos_ids` end a request unless it ignores EOS.
    pub fn start(
        backend: Box<dyn Backend>,
        tokenizer: Arc<Tokenizer>,
        eos_ids: Vec<u32>,
        cfg: EngineConfig,
    ) -> Result<Engine, EngineError> {
        let bad = |field, reason: String| Err(EngineError::InvalidConfig { field, reason });
        if cfg.max_num_seqs == 0 {
            return bad("max_num_seqs", "must be at least 1".into());
        }
        if cfg.max_batch_tokens < cfg.max_num_seqs {
            return bad(
                "max_batch_tokens",
                format!(
                    "must be at least max_num_seqs ({}) so every running decode fits a step, got {}",
                    cfg.max_num_seqs, cfg.max_batch_tokens
                ),
            );
        }
        let shape = backend.kv_shape();
        if shape.num_blocks == 0 || shape.block_size == 0 {
            return bad(
                "kv_shape",
                format!(
                    "the backend's KV pool must have blocks of at least one token, got {} blocks of {}",
                    shape.num_blocks, shape.block_size
                ),
            );
        }
        let max_context = backend.config().max_position_embeddings;
        let vocab_size = backend.config().vocab_size;
        let sched = Scheduler::new(
            KvConfig {
                num_blocks: shape.num_blocks,
                block_size: shape.block_size,
                enable_prefix_cache: cfg.enable_prefix_cache,
            },
            cfg.max_num_seqs,
            cfg.max_batch_tokens,
        )
        .and_then(|s| s.with_kv_window(backend.config().spec.kv_window()))
        .map_err(|e| EngineError::InvalidConfig {
            field: "kv_shape",
            reason: e.to_string(),
        })?;
        let mut sched = sched;
        if let Some(spec) = &cfg.speculative {
            if let Err((field, reason)) = spec.validate() {
                let _ = field; // the one checked field
                return Err(EngineError::InvalidConfig {
                    field: "speculative.num_tokens",
                    reason,
                });
            }
            let most = backend.max_drafts();
            if most == 0 {
                tracing::warn!(backend = %backend.name(), "the backend verifies no drafts: speculative decoding is off");
            } else {
                let spec = SpecConfig {
                    num_tokens: spec.num_tokens.min(most),
                    ..spec.clone()
                };
                let drafter = spec.drafter(backend.config()).map_err(|reason| {
                    EngineError::InvalidConfig {
                        field: "speculative.method",
                        reason,
                    }
                })?;
                tracing::info!(
                    method = spec.method.name(),
                    k = spec.num_tokens,
                    max_batch = spec.max_batch,
                    "speculative decoding on"
                );
                let caps = VerifyCaps {
                    penalties: backend.verifies_penalties(),
                    masks: backend.verifies_masks(),
                    overlap: backend.steps_overlap(),
                };
                sched.set_speculation(spec, drafter, caps);
            }
        }
        if cfg.max_loras > 0 {
            let slots = backend.max_loras();
            if slots < cfg.max_loras {
                return bad(
                    "max_loras",
                    match slots {
                        0 => contract::backend::no_lora(&backend.name()).to_string(),
                        n => format!(
                            "{} holds {n} LoRA adapter slots, fewer than --max-loras {}",
                            backend.name(),
                            cfg.max_loras
                        ),
                    },
                );
            }
        }
        let loras = Arc::new(LoraRegistry::with_limits(cfg.lora_limits));
        sched.set_lora_slots(LoraSlots::new(cfg.max_loras, loras.clone()));
        let model = backend.config().clone();
        let deterministic = backend.deterministic();
        let (tx, rx) = mpsc::channel();
        let shared = Arc::new(Shared::default());
        tracing::info!(
            backend = %backend.name(),
            kv_blocks = shape.num_blocks,
            block_size = shape.block_size,
            max_num_seqs = cfg.max_num_seqs,
            max_batch_tokens = cfg.max_batch_tokens,
            deterministic,
            "engine starting"
        );
        let mut backend = backend;
        if let Err(e) = backend.reserve(cfg.max_batch_tokens, cfg.max_num_seqs) {
            tracing::warn!(error = %e, "could not size the step buffers up front; they grow on demand");
        }
        let pipelined = cfg.async_steps;
        let clock = crate::step_time::StepClock::new(cfg.max_step_time);
        let grammar = GrammarCompiler::new(tokenizer.clone(), eos_ids.clone(), vocab_size);
        let mut worker = Worker::new(
            backend,
            sched,
            tokenizer,
            eos_ids,
            shared.clone(),
            rx,
            clock,
        );
        worker.halt_on_backend_error = cfg.halt_on_backend_error;
        worker.pipelined = pipelined;
        let join = std::thread::Builder::new()
            .name("lamina-engine".into())
            .spawn(move || worker.run())?;
        Ok(Engine {
            inner: Arc::new(Inner {
                tx,
                shared,
                join: Mutex::new(Some(join)),
                cfg,
                max_context,
                vocab_size,
                num_blocks: shape.num_blocks,
                block_size: shape.block_size,
                next_id: AtomicU64::new(0),
                grammar,
                loras,
                model,
                deterministic,
            }),
        })
    }

    /// Queues a request; its events arrive on the returned handle.
    pub fn submit(&self, req: GenerateRequest) -> Result<RequestHandle, SubmitError> {
        let mut handles = self.submit_n(req, 1)?;
        handles.pop().ok_or(SubmitError::ShuttingDown)
    }

    /// Queues `n` choices of one request (OpenAI's `n`, `best_of`), one
    /// handle each, in choice order. Choice `i` is sampled with the seed
    /// `contract::sampling::choice_seed(req.sampling.seed, i)`, so it equals
    /// a single request with that seed; the prompt is computed once (choices
    /// after the first fork its KV, see the scheduler), and each choice's
    /// `Usage::prompt_tokens` is the whole prompt (count it once per
    /// request). All or none are queued: `n` counts against `max_queue`.
    pub fn submit_n(
        &self,
        req: GenerateRequest,
        n: usize,
    ) -> Result<Vec<RequestHandle>, SubmitError> {
        let inner = &*self.inner;
        if inner.shared.shutting_down.load(Ordering::Acquire) {
            return Err(SubmitError::ShuttingDown);
        }
        if let Some(why) = inner.shared.failure() {
            return Err(SubmitError::EngineFailed(why));
        }
        if n == 0 {
            return Err(SubmitError::InvalidParams(ParamError {
                param: "n",
                reason: "must be at least 1, got 0".into(),
            }));
        }
        inner.validate(&req)?;
        let lora = match &req.lora {
            Some(name) => Some(
                inner
                    .loras
                    .resolve(name)
                    .ok_or_else(|| SubmitError::UnknownLora(name.clone()))?,
            ),
            None => None,
        };
        let mut grammar = match &req.constraint {
            Some(c) => Some(inner.grammar.compile(c).map_err(SubmitError::Grammar)?),
            None => None,
        };
        let max_queue = inner.cfg.max_queue;
        let admitted = inner
            .shared
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                (max_queue == 0 || q.saturating_add(n) <= max_queue).then_some(q + n)
            });
        if admitted.is_err() {
            return Err(SubmitError::QueueFull);
        }
        let prompt_tokens = (req.prompt.len() as u64).saturating_mul(n as u64);
        inner
            .shared
            .queued_prompt_tokens
            .fetch_add(prompt_tokens, Ordering::AcqRel);
        let first = inner.next_id.fetch_add(n as u64, Ordering::Relaxed);
        let mut handles = Vec::with_capacity(n);
        for i in 0..n as u64 {
            let id = first + i;
            let mut choice = req.clone();
            choice.sampling.seed = choice_seed(req.sampling.seed, i);
            let (etx, erx) = unbounded_channel();
            let msg = Msg::Submit(Box::new(NewRequest {
                id,
                req: choice,
                tx: etx,
                fork_of: (i > 0).then_some(first),
                // the last choice takes the compiled state, the others a copy
                grammar: if i + 1 == n as u64 {
                    grammar.take()
                } else {
                    grammar.as_ref().map(|g| g.fork())
                },
                lora: lora.clone(),
            }));
            if inner.tx.send(msg).is_err() {
                // the loop is gone: nothing of this request was queued
                // beyond what the handles dropped here cancel
                let left = n - i as usize;
                inner.shared.queued.fetch_sub(left, Ordering::AcqRel);
                inner
                    .shared
                    .queued_prompt_tokens
                    .fetch_sub(req.prompt.len() as u64 * left as u64, Ordering::AcqRel);
                return Err(SubmitError::ShuttingDown);
            }
            handles.push(RequestHandle {
                id,
                rx: erx,
                tx: inner.tx.clone(),
                done: false,
            });
        }
        Ok(handles)
    }

    /// Queues an embedding request ([`crate::embed`]): every input is
    /// checked here (the one check of its limits), then embedded on the
    /// loop between steps; the handle yields the vectors.
    pub fn embed(&self, req: EmbedRequest) -> Result<EmbedHandle, EmbedError> {
        let inner = &*self.inner;
        if inner.shared.shutting_down.load(Ordering::Acquire) {
            return Err(EmbedError::ShuttingDown);
        }
        if let Some(why) = inner.shared.failure() {
            return Err(EmbedError::EngineFailed(why));
        }
        crate::embed::check(&req.inputs, inner.vocab_size, self.max_sequence())?;
        let first = (inner.next_id).fetch_add(req.inputs.len() as u64, Ordering::Relaxed);
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job = EmbedJob { first, req, tx };
        match inner.tx.send(Msg::Embed(Box::new(job))) {
            Ok(()) => Ok(EmbedHandle { rx }),
            Err(_) => Err(EmbedError::ShuttingDown),
        }
    }

    /// The size of the hidden states: the length of every embedding.
    pub fn hidden_size(&self) -> usize {
        self.inner.model.hidden_size
    }

    /// Compiles `c` as a submit would and drops it: whether the grammar
    /// engine accepts it (for definitions checked before they are used).
    pub fn check_constraint(&self, c: &Constraint) -> Result<(), GrammarError> {
        self.inner.grammar.compile(c).map(drop)
    }

    /// Loads LoRA `adapter` as `name` for later requests (`GenerateRequest::lora`):
    /// checked against the model and `max_lora_rank` here.
    pub fn load_lora(
        &self,
        name: &str,
        adapter: Arc<LoraAdapter>,
    ) -> Result<(), LoraRegistryError> {
        let inner = &*self.inner;
        if inner.cfg.max_loras == 0 {
            return Err(LoraRegistryError::Disabled);
        }
        if name.is_empty() {
            return Err(LoraRegistryError::EmptyName);
        }
        adapter
            .check(&inner.model, inner.cfg.max_lora_rank)
            .map_err(|e| LoraRegistryError::Invalid {
                name: name.into(),
                reason: e.to_string(),
            })?;
        inner.loras.insert(name, adapter).map(drop)
    }

    /// Unloads LoRA adapter `name`: later requests naming it are refused;
    /// requests submitted before finish with it, and its slot is emptied
    /// once no running request uses it.
    pub fn unload_lora(&self, name: &str) -> Result<(), LoraRegistryError> {
        self.inner.loras.remove(name)?;
        let _ = self.inner.tx.send(Msg::LorasChanged);
        Ok(())
    }

    /// The loaded LoRA adapters and the requests counted per adapter.
    pub fn loras(&self) -> &LoraRegistry {
        &self.inner.loras
    }

    /// The LoRA adapters running and waiting, as of the end of the last step.
    pub fn lora_gauge(&self) -> crate::types::LoraGauge {
        self.inner.shared.lora_gauge()
    }

    /// `EngineConfig::max_loras`: adapter slots (0: LoRA off).
    pub fn max_loras(&self) -> usize {
        self.inner.cfg.max_loras
    }

    /// Whether the backend runs in deterministic mode
    /// ([`contract::Backend::deterministic`]): each request's output is
    /// bitwise the same however it is batched, chunked, cached or preempted.
    pub fn deterministic(&self) -> bool {
        self.inner.deterministic
    }

    /// Counters and gauges, as of the end of the last step.
    pub fn stats(&self) -> EngineStats {
        self.inner.shared.snapshot()
    }

    /// Why the engine failed (`EngineConfig::halt_on_backend_error`), once it has.
    pub fn failure(&self) -> Option<String> {
        self.inner.shared.failure()
    }

    /// The model's context length: prompt + max_tokens may not exceed it.
    pub fn max_context(&self) -> usize {
        self.inner.max_context
    }

    /// The longest sequence (prompt + max_tokens) this engine can finish:
    /// the model's context, or what the whole KV pool holds when that is
    /// less (the `max_model_len` to advertise and to default `max_tokens` from).
    pub fn max_sequence(&self) -> usize {
        self.inner.max_context.min(self.inner.pool_tokens())
    }

    /// Tokens per KV block and blocks in the pool.
    pub fn kv_shape(&self) -> (usize, usize) {
        (self.inner.block_size, self.inner.num_blocks)
    }

    /// The limits the engine was started with.
    pub fn config(&self) -> &EngineConfig {
        &self.inner.cfg
    }

    /// The model's vocabulary size.
    pub(crate) fn vocab_size(&self) -> usize {
        self.inner.vocab_size
    }

    /// Empties the prefix cache and zeroes the counters of [`Engine::stats`]
    /// once every request before it has ended (the warm-up's end); waits
    /// until the loop has done it.
    pub(crate) fn forget_warm_up(&self) {
        let (tx, rx) = mpsc::channel();
        if self.inner.tx.send(Msg::ForgetWarmUp(tx)).is_ok() {
            // (an error: the loop is gone, nothing left to forget)
            let _ = rx.recv();
        }
    }

    /// Stops accepting requests, cancels those in flight and joins the loop.
    /// Idempotent; later submits fail with [`SubmitError::ShuttingDown`].
    pub fn shutdown(&self) {
        self.inner.shutdown();
    }
}

impl Inner {
    /// Tokens the whole KV pool holds.
    fn pool_tokens(&self) -> usize {
        self.num_blocks.saturating_mul(self.block_size)
    }

    /// The one check of a request's limits (the server and the CLI map its
    /// errors to their own names): sampling ranges, `max_tokens`, token ids
    /// (prompt, `logit_bias`, `stop_token_ids`) against the vocabulary, the
    /// context and the KV pool. A prompt that fills the context is refused
    /// as too long before `max_tokens` is looked at, so a caller that gives
    /// "the rest of the context" (0 when none is left) gets that error.
    fn validate(&self, req: &GenerateRequest) -> Result<(), SubmitError> {
        let prompt = req.prompt.len();
        if prompt == 0 {
            return Err(SubmitError::EmptyPrompt);
        }
        req.sampling
            .validate()
            .map_err(SubmitError::InvalidParams)?;
        if let Some(&(token, _)) = req
            .sampling
            .logit_bias
            .iter()
            .find(|(t, _)| *t as usize >= self.vocab_size)
        {
            return Err(SubmitError::InvalidParams(ParamError {
                param: "logit_bias",
                reason: format!(
                    "token id {token} is outside the vocabulary (size {})",
                    self.vocab_size
                ),
            }));
        }
        if let Some(&token) = req
            .stop_token_ids
            .iter()
            .find(|t| **t as usize >= self.vocab_size)
        {
            return Err(SubmitError::InvalidParams(ParamError {
                param: "stop_token_ids",
                reason: format!(
                    "token id {token} is outside the vocabulary (size {})",
                    self.vocab_size
                ),
            }));
        }
        if let Some((position, &token)) = req
            .prompt
            .iter()
            .enumerate()
            .find(|(_, t)| **t as usize >= self.vocab_size)
        {
            return Err(SubmitError::TokenOutOfVocab {
                token,
                position,
                vocab: self.vocab_size,
            });
        }
        let limit = self.max_context;
        if prompt >= limit {
            return Err(SubmitError::PromptTooLong { prompt, limit });
        }
        if req.max_tokens == 0 {
            return Err(SubmitError::InvalidParams(ParamError {
                param: "max_tokens",
                reason: "must be at least 1, got 0".into(),
            }));
        }
        if prompt.saturating_add(req.max_tokens) > limit {
            return Err(SubmitError::ContextExceeded {
                prompt,
                max_tokens: req.max_tokens,
                limit,
            });
        }
        let needed_blocks = prompt.div_ceil(self.block_size);
        if needed_blocks > self.num_blocks {
            return Err(SubmitError::ExceedsKvPool {
                prompt,
                needed_blocks,
                block_size: self.block_size,
                pool_blocks: self.num_blocks,
            });
        }
        // Alone in the pool (every other sequence preempted) a request can
        // always finish unless it needs more than the pool holds.
        let pool_tokens = self.pool_tokens();
        if prompt.saturating_add(req.max_tokens) > pool_tokens {
            return Err(SubmitError::NeverFitsKvPool {
                prompt,
                max_tokens: req.max_tokens,
                pool_tokens,
            });
        }
        Ok(())
    }

    fn shutdown(&self) {
        self.shared.shutting_down.store(true, Ordering::Release);
        let _ = self.tx.send(Msg::Shutdown);
        let join = match self.join.lock() {
            Ok(mut j) => j.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        if let Some(j) = join
            && j.join().is_err()
        {
            tracing::error!("the engine thread panicked");
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// One request's event stream. Dropping it cancels the request.
pub struct RequestHandle {
    pub id: u64,
    rx: UnboundedReceiver<Event>,
    tx: Sender<Msg>,
    done: bool,
}

/// Cancels one request from any thread; see [`RequestHandle::canceller`].
#[derive(Clone)]
pub struct Canceller {
    id: u64,
    tx: Sender<Msg>,
}

impl Canceller {
    /// Like [`RequestHandle::cancel`]; a no-op once the request has ended.
    pub fn cancel(&self) {
        let _ = self.tx.send(Msg::Cancel(self.id));
    }
}

/// Everything a request produced, collected by [`RequestHandle::blocking_collect`].
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    pub tokens: Vec<u32>,
    pub text: String,
    /// Per token: its log-probability and the requested alternatives.
    pub logprobs: Vec<(f32, Vec<(u32, f32)>)>,
    pub reason: FinishReason,
    pub usage: Usage,
    pub error: Option<String>,
}

impl RequestHandle {
    /// The next event; `None` after `Done` (or if the engine is gone).
    pub async fn next(&mut self) -> Option<Event> {
        if self.done {
            return None;
        }
        let ev = self.rx.recv().await;
        self.note(&ev);
        ev
    }

    /// Like [`RequestHandle::next`] for threads outside an async runtime
    /// (panics when called from inside one, like tokio's `blocking_recv`).
    pub fn blocking_next(&mut self) -> Option<Event> {
        if self.done {
            return None;
        }
        let ev = self.rx.blocking_recv();
        self.note(&ev);
        ev
    }

    /// Drains the request to its end (blocking; not from async code).
    pub fn blocking_collect(mut self) -> Completion {
        let mut c = Completion {
            tokens: Vec::new(),
            text: String::new(),
            logprobs: Vec::new(),
            reason: FinishReason::Error,
            usage: Usage::default(),
            error: Some("the engine stopped before the request finished".into()),
        };
        while let Some(ev) = self.blocking_next() {
            match ev {
                Event::Token(t) => {
                    c.tokens.push(t.token);
                    c.text.push_str(&t.text);
                    c.logprobs.push((t.logprob, t.top_logprobs));
                }
                Event::Done(f) => {
                    c.reason = f.reason;
                    c.usage = f.usage;
                    c.error = f.error;
                }
            }
        }
        c
    }

    /// Stops the request at the next step; a `Done(Cancelled)` event follows
    /// unless it finished first.
    pub fn cancel(&self) {
        let _ = self.tx.send(Msg::Cancel(self.id));
    }

    /// A handle that cancels this request from another thread (a Ctrl-C
    /// handler) while this one waits on its events.
    pub fn canceller(&self) -> Canceller {
        Canceller {
            id: self.id,
            tx: self.tx.clone(),
        }
    }

    fn note(&mut self, ev: &Option<Event>) {
        if matches!(ev, None | Some(Event::Done(_))) {
            self.done = true;
        }
    }
}

impl Drop for RequestHandle {
    fn drop(&mut self) {
        if !self.done {
            self.cancel();
        }
    }
}
