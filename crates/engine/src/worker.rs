//! The engine loop: one std::thread owning the backend, the scheduler and
//! every request's output state.
//!
//! Contract: the loop sleeps on the submission channel while nothing is
//! queued or running; otherwise each iteration drains the channel (submits,
//! cancels, shutdown), plans a step, runs it on the backend, commits the
//! results and streams them.
//!
//! One loop, over the backend's one step protocol (`launch` / `collect`):
//! each iteration plans step N + 1, launches it while step N still runs,
//! then lands step N (waits for its samples, commits them, processes their
//! text while the device runs N + 1) and records N + 1 as launched (see the
//! scheduler's contract point 6). A step whose samples feed a penalty
//! history lands before the next plan. A step N + 1 whose grammar masks
//! wait for step N's samples is launched held: step N lands (the grammars
//! advance and compute their masks while the device runs N + 1's forward
//! pass), N + 1 is released with the masks, then N's text is processed. A
//! failed launch ends its step's requests; a failed step ends its own and
//! the one launched after it. With `EngineConfig::async_steps` off the
//! same loop runs at depth one: each step lands in the iteration that
//! launched it, and its text is processed after the next launch.
//!
//! Endings decided by token id alone (EOS, `max_tokens`) are applied when a
//! step lands, so such a sequence is never scheduled again; a stop string
//! found in step N's text ends its request after step N + 1, whose extra
//! token is dropped unseen (usage counts what was sent). Output is
//! therefore identical to processing in line, at either depth.
//! A backend failure ends the requests of that
//! step with `FinishReason::Error` (their blocks freed); the others go on,
//! unless the engine halts on backend errors: then every request ends with
//! the failure, which is recorded in [`Shared`], and every request accepted
//! later ends with it at once. A
//! scheduler invariant failure (a bug) ends every request with an error
//! rather than panicking. Shutdown (or every sender gone) cancels all requests
//! and returns.
//!
//! After each step the backend time and token count feed the step clock
//! ([`crate::step_time`]), whose prefill cap the scheduler applies to the
//! next steps.
//!
//! Every request follows one state machine (`Queued -> Running ->
//! Finishing -> Done`, see [`request`]); `Worker::end` is the only way a
//! request ends and usage is counted there. Counters live in [`shared`].
//!
//! A sequence that verified drafts lands several tokens in one step: they
//! are committed in order, each judged at its own count (EOS, stop ids,
//! `max_tokens`, stop strings), and those after the one that ends the
//! request are dropped unseen and uncounted.
//!
//! One file past the usual size on purpose: the loop's steps (plan,
//! launch, land, commit) share its state; the request state machine and
//! the counters are in [`request`] and [`shared`].
//!
//! Embedding requests run in passes between steps (`crate::embed`): an
//! iteration with embedding work lands the step in flight, runs one pass,
//! then plans its step as usual.
//!
//! Costs per iteration: the scheduler's O(batch) plus O(sampled tokens) of
//! output work and O(messages) of channel work; counters are published to
//! [`Shared`] with relaxed atomic stores.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::Instant;

use contract::{Backend, BackendError, SampledToken};
use tokenizer::Tokenizer;
use tokio::sync::mpsc::UnboundedSender;

use crate::embed::{EmbedError, EmbedJob, EmbedQueue};
use crate::grammar::SeqGrammar;
use crate::lora::SeqLora;
use crate::output::{Output, Verdict};
use crate::scheduler::{NewSeq, SchedError, Scheduler};
use crate::step_time::StepClock;
use crate::types::{Event, FinishReason, GenerateRequest, LoraGauge};

mod request;
mod shared;

use request::{Phase, Request};
pub(crate) use shared::Shared;

/// Messages from handles to the loop.
pub(crate) enum Msg {
    Submit(Box<NewRequest>),
    /// An embedding request ([`crate::embed`]).
    Embed(Box<EmbedJob>),
    Cancel(u64),
    /// A LoRA adapter was unloaded: empty the idle slots holding it.
    LorasChanged,
    /// The warm-up ended: empty the prefix cache, zero the counters, then
    /// answer.
    ForgetWarmUp(std::sync::mpsc::Sender<()>),
    Shutdown,
}

pub(crate) struct NewRequest {
    pub id: u64,
    pub req: GenerateRequest,
    pub tx: UnboundedSender<Event>,
    /// The first choice of the same request (`n > 1`), to fork from.
    pub fork_of: Option<u64>,
    /// The compiled constraint's state, for a constrained request.
    pub grammar: Option<SeqGrammar>,
    /// Its LoRA adapter, resolved at submit.
    pub lora: Option<SeqLora>,
}

/// Everything the loop owns.
pub(crate) struct Worker {
    pub backend: Box<dyn Backend>,
    pub sched: Scheduler,
    pub tokenizer: Arc<Tokenizer>,
    pub eos: Vec<u32>,
    pub shared: Arc<Shared>,
    pub rx: Receiver<Msg>,
    /// The step time budget: the prefill cap handed to the scheduler.
    clock: StepClock,
    /// Every live request (see [`request`] for the state machine).
    requests: HashMap<u64, Request>,
    /// Tokens of the last step whose text is not processed yet.
    pending: Vec<(u64, SampledToken)>,
    /// `EngineConfig::halt_on_backend_error`.
    pub halt_on_backend_error: bool,
    /// Why the engine halted: every request accepted since ends at once with it.
    halted: Option<String>,
    /// Steps are pipelined, two in flight (`EngineConfig::async_steps`);
    /// off, one.
    pub pipelined: bool,
    /// The launched step not landed yet (pipelined).
    in_flight: Option<InFlight>,
    /// When the last step landed: the device's start of the next one.
    last_landed: Option<Instant>,
    /// Embedding work, run in passes between steps.
    embeds: EmbedQueue,
}

/// What the loop keeps of a launched step until it lands.
struct InFlight {
    launched: Instant,
    tokens: usize,
    seqs: usize,
    /// Its sequences, ended with an error if it fails.
    ids: Vec<u64>,
}

/// Processes tokens' text in order; returns the requests that a verdict ends.
fn process_text(
    requests: &mut HashMap<u64, Request>,
    tokens: Vec<(u64, SampledToken)>,
    eos: &[u32],
) -> Vec<(u64, FinishReason, Option<String>)> {
    let mut ended: Vec<(u64, FinishReason, Option<String>)> = Vec::new();
    for (id, tok) in tokens {
        let Some(req) = requests.get_mut(&id) else {
            continue; // ended meanwhile: the token is dropped unseen
        };
        if ended.iter().any(|e| e.0 == id) {
            continue; // after its ending token (verified drafts): unseen
        }
        if let Verdict::Finish(reason, err) = req.out.on_token(tok, eos) {
            ended.push((id, reason, err));
        }
    }
    ended
}

impl Worker {
    pub(crate) fn new(
        backend: Box<dyn Backend>,
        sched: Scheduler,
        tokenizer: Arc<Tokenizer>,
        eos: Vec<u32>,
        shared: Arc<Shared>,
        rx: Receiver<Msg>,
        clock: StepClock,
    ) -> Self {
        Worker {
            backend,
            sched,
            clock,
            tokenizer,
            eos,
            shared,
            rx,
            requests: HashMap::new(),
            pending: Vec::new(),
            halt_on_backend_error: false,
            halted: None,
            pipelined: false,
            in_flight: None,
            last_landed: None,
            embeds: EmbedQueue::default(),
        }
    }

    /// Runs until shutdown or until every sender is gone.
    pub(crate) fn run(mut self) {
        self.publish();
        loop {
            if self.sched.is_idle() && self.embeds.is_empty() {
                // every sequence of a step in flight ended: it lands unseen
                self.land();
                self.last_landed = None;
                self.drain_pending();
                self.publish();
                match self.rx.recv() {
                    Ok(msg) => {
                        if !self.handle(msg) {
                            break;
                        }
                    }
                    Err(_) => break,
                }
            }
            let start = Instant::now();
            let mut open = true;
            loop {
                match self.rx.try_recv() {
                    Ok(msg) => {
                        if !self.handle(msg) {
                            open = false;
                            break;
                        }
                    }
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        open = false;
                        break;
                    }
                }
            }
            if !open {
                break;
            }
            if !self.embeds.is_empty() {
                self.embed_pass();
            }
            let backend_ns = match self.step() {
                Ok(ns) => ns,
                Err(e) => {
                    tracing::error!(error = %e, "scheduler invariant broken; failing every request");
                    self.end_all(
                        FinishReason::Error,
                        Some(format!("internal engine error: {e}")),
                    );
                    0
                }
            };
            let host = (start.elapsed().as_nanos() as u64).saturating_sub(backend_ns);
            self.shared.host_ns_total.fetch_add(host, Ordering::Relaxed);
            self.publish();
        }
        self.land();
        self.drain_pending();
        // requests submitted after the last drain are accepted to be cancelled
        while let Ok(msg) = self.rx.try_recv() {
            if let Msg::Submit(r) = msg {
                self.accept(*r);
            }
        }
        self.end_all(FinishReason::Cancelled, None);
        let (kv, _) = self.sched.kv_for_pass();
        self.embeds.fail_all(kv, &EmbedError::ShuttingDown);
        self.publish();
    }

    /// One embedding pass ([`crate::embed`]): the step in flight lands
    /// first, as the backend's hidden-state call needs it idle.
    fn embed_pass(&mut self) {
        self.land();
        let (kv, budget) = self.sched.kv_for_pass();
        self.embeds.pass(self.backend.as_mut(), kv, budget);
    }

    /// Applies one message; false on shutdown.
    fn handle(&mut self, msg: Msg) -> bool {
        match msg {
            Msg::Submit(r) => self.accept(*r),
            Msg::Embed(job) => {
                let hidden = self.backend.config().hidden_size;
                self.embeds.push(*job, hidden);
                if let Some(why) = self.halted.clone() {
                    let (kv, _) = self.sched.kv_for_pass();
                    self.embeds.fail_all(kv, &EmbedError::EngineFailed(why));
                }
            }
            Msg::Cancel(id) => self.end(id, FinishReason::Cancelled, None),
            Msg::LorasChanged => {
                self.sched.lora_mut().sweep();
                if let Err(e) = self.apply_lora_loads() {
                    tracing::error!(error = %e, "could not empty a LoRA adapter slot");
                }
            }
            Msg::ForgetWarmUp(done) => {
                self.sched.forget_history();
                self.shared.reset_totals();
                self.publish();
                let _ = done.send(());
            }
            Msg::Shutdown => return false,
        }
        true
    }

    /// A submitted request enters the scheduler, `Queued`.
    fn accept(&mut self, r: NewRequest) {
        let NewRequest {
            id,
            req,
            tx,
            fork_of,
            grammar,
            lora,
        } = r;
        let out = Output::new(
            tx,
            self.tokenizer.clone(),
            &req.stop,
            req.max_tokens,
            req.ignore_eos,
            req.stop_token_ids,
        );
        let phase = Phase::Queued;
        let prompt_len = req.prompt.len();
        let request = Request {
            phase,
            out,
            prompt_len,
            accepted: Instant::now(),
            queue_time: None,
        };
        self.requests.insert(id, request);
        let seq = NewSeq {
            prompt: req.prompt,
            params: req.sampling,
            max_tokens: Some(req.max_tokens),
            fork_of,
            grammar,
            speculative: req.speculative,
            lora,
        };
        self.sched.add(id, seq);
        if let Some(why) = self.halted.clone() {
            self.end(id, FinishReason::Error, Some(why));
        }
    }

    /// One iteration of the step loop (module doc): lands the step in
    /// flight first when the next plan needs its samples on the host
    /// (penalty histories), plans the next step and launches it, then lands
    /// the step before it (its text processed while the new one runs) and
    /// records the new one as launched; at depth one (`pipelined` off) it
    /// lands at once. Returns the device time of the steps that landed.
    fn step(&mut self) -> Result<u64, SchedError> {
        let mut landed_ns = 0;
        if self.in_flight.is_some() && self.sched.landing_needs_host() {
            landed_ns += self.land().unwrap_or(0);
        }
        if !self.plan()? {
            match self.in_flight.is_some() {
                true => landed_ns += self.land().unwrap_or(0),
                false => self.drain_pending(),
            }
            return Ok(landed_ns);
        }
        let batch = self.sched.batch();
        let step = InFlight {
            launched: Instant::now(),
            tokens: batch.num_tokens(),
            seqs: batch.num_seqs(),
            ids: self.sched.planned_ids().collect(),
        };
        let held = self.sched.batch_held();
        let launched = match held {
            true => self.backend.launch_held(batch),
            false => self.backend.launch(batch),
        };
        if let Err(e) = launched {
            // nothing of this step runs; the step in flight still lands
            self.sched.abandon_plan();
            self.fail_step(step.ids, &e);
            if self.in_flight.is_some() {
                landed_ns += self.land().unwrap_or(0);
            }
            return Ok(landed_ns);
        }
        if self.in_flight.is_some() {
            match self.land_samples() {
                Some(ns) => landed_ns += ns,
                None => {
                    // the backend dropped this step with the failed one; a
                    // held step it may still hold (the landing failed in the
                    // scheduler, not the backend) is run and discarded, so
                    // the next launch finds the backend free
                    if held && self.backend.release(&self.sched.batch().samples).is_ok() {
                        let _ = self.backend.collect();
                    }
                    self.sched.abandon_plan();
                    self.fail_step(
                        step.ids,
                        &BackendError::Device("the step before it failed".into()),
                    );
                    return Ok(landed_ns);
                }
            }
        }
        if held {
            // the grammars have seen the landed tokens: sample with their masks
            let t = Instant::now();
            self.sched.finalize_samples();
            self.add_schedule_ns(t);
            // (a host backend runs the whole step here)
            if let Err(e) = self.backend.release(&self.sched.batch().samples) {
                self.sched.abandon_plan();
                self.fail_step(step.ids, &e);
                self.drain_pending();
                return Ok(landed_ns);
            }
        }
        // the device is busy with the next step: the landed text is processed now
        self.drain_pending();
        let t = Instant::now();
        self.in_flight = Some(step);
        self.sched.launched()?;
        self.add_schedule_ns(t);
        if !self.pipelined {
            // depth one: the step lands before the next is planned
            landed_ns += self.land_samples().unwrap_or(0);
        }
        Ok(landed_ns)
    }

    /// Lands the step in flight ([`Worker::land_samples`]) and processes
    /// its text.
    fn land(&mut self) -> Option<u64> {
        let ns = self.land_samples();
        self.drain_pending();
        ns
    }

    /// Waits for the step in flight and commits its samples (their text is
    /// left pending); returns its device time, or `None` when it failed
    /// (its requests ended).
    fn land_samples(&mut self) -> Option<u64> {
        let step = self.in_flight.take()?;
        let result = self.backend.collect();
        let now = Instant::now();
        // the device ran it from its launch or from the end of the one before
        let began = self
            .last_landed
            .map_or(step.launched, |t| t.max(step.launched));
        let ns = now.duration_since(began).as_nanos() as u64;
        self.last_landed = Some(now);
        self.observe_step(step.tokens, ns);
        tracing::trace!(
            seqs = step.seqs,
            tokens = step.tokens,
            us = ns / 1000,
            "step landed"
        );
        let results = match result {
            Ok(r) => r,
            Err(e) => {
                self.sched.abandon_landing();
                self.fail_step(step.ids, &e);
                return None;
            }
        };
        let mut sampled = Vec::new();
        let t = Instant::now();
        if let Err(e) = self.sched.land(results, &mut sampled) {
            self.sched.abandon_landing();
            tracing::error!(error = %e, "scheduler invariant broken; failing every request");
            self.end_all(
                FinishReason::Error,
                Some(format!("internal engine error: {e}")),
            );
            return None;
        }
        self.add_schedule_ns(t);
        self.pending = self.accept_samples(sampled);
        Some(ns)
    }

    /// Schedules the next step and handles its first admissions and
    /// aborts; false when it runs nothing.
    fn plan(&mut self) -> Result<bool, SchedError> {
        let t_plan = Instant::now();
        self.sched.schedule()?;
        self.add_schedule_ns(t_plan);
        if let Err(e) = self.apply_lora_loads() {
            // the step's adapter rows cannot run: nothing of it runs
            let ids: Vec<u64> = self.sched.planned_ids().collect();
            self.sched.abandon_plan();
            self.fail_step(ids, &e);
            return Ok(false);
        }
        let first: Vec<u64> = self.sched.first_admitted().to_vec();
        for id in first {
            self.on_admitted(id);
        }
        let aborted: Vec<u64> = self.sched.aborted().to_vec();
        for id in aborted {
            let len = self
                .sched
                .summary(id)
                .map_or(0, |c| c.prompt_len + c.generated);
            let kv = self.sched.kv();
            let (blocks, bs) = (kv.num_blocks(), kv.block_size());
            tracing::warn!(seq = id, tokens = len, "sequence outgrew the whole KV pool");
            self.end(
                id,
                FinishReason::Error,
                Some(format!(
                    "the KV cache ran out: the sequence reached {len} tokens and the whole KV pool holds {} ({blocks} blocks of {bs}); \
                     give the server more KV memory or ask for fewer tokens",
                    blocks * bs
                )),
            );
        }
        Ok(self.sched.batch().num_seqs() > 0)
    }

    /// Hands the backend the LoRA slot changes the scheduler made.
    fn apply_lora_loads(&mut self) -> Result<(), BackendError> {
        for (slot, adapter) in self.sched.lora_mut().take_loads() {
            self.backend.set_lora(slot, adapter)?;
        }
        Ok(())
    }

    /// Counts a step that ran `tokens` tokens in `backend_ns` and updates
    /// the prefill cap from the step clock.
    fn observe_step(&mut self, tokens: usize, backend_ns: u64) {
        self.shared
            .backend_ns_total
            .fetch_add(backend_ns, Ordering::Relaxed);
        self.shared.steps_total.fetch_add(1, Ordering::Relaxed);
        self.clock.observe(tokens, backend_ns);
        self.sched.set_prefill_cap(self.clock.prefill_cap());
    }

    /// Ends the requests of a failed step (or every request, when the
    /// engine halts on backend errors).
    fn fail_step(&mut self, ids: Vec<u64>, e: &BackendError) {
        tracing::error!(error = %e, seqs = ids.len(), "backend step failed");
        if self.halt_on_backend_error {
            let why = format!("the engine failed: backend step failed: {e}");
            tracing::error!("engine halted: every request ends with the failure");
            self.shared.set_failure(why.clone());
            self.halted = Some(why.clone());
            let (kv, _) = self.sched.kv_for_pass();
            self.embeds
                .fail_all(kv, &EmbedError::EngineFailed(why.clone()));
            self.end_all(FinishReason::Error, Some(why));
            return;
        }
        for id in ids {
            self.end(
                id,
                FinishReason::Error,
                Some(format!("backend step failed: {e}")),
            );
        }
    }

    /// Checks committed samples: a NaN log-probability or an id outside
    /// the vocabulary ends its request with an error; the rest are counted,
    /// and those ending by id (EOS, `max_tokens`) retire their request.
    /// Returns the samples whose text is still to be processed.
    fn accept_samples(
        &mut self,
        mut sampled: Vec<(u64, SampledToken)>,
    ) -> Vec<(u64, SampledToken)> {
        sampled.retain(|(id, _)| self.requests.contains_key(id));
        // A NaN log-probability is the backends' sign of degenerate logits
        // (non-finite or all equal; `contract::sampling::is_degenerate`):
        // that token means nothing, and the sequence cannot recover. It ends with an error; the others go on.
        // (A token outside the vocabulary, which no backend should return,
        // is treated alike rather than poisoning the next step's batch.)
        let vocab = self.backend.config().vocab_size;
        let poisoned: Vec<(u64, String)> = sampled
            .iter()
            .filter_map(|(id, t)| {
                if t.logprob.is_nan() {
                    Some((
                        *id,
                        "the model produced degenerate logits for this sequence (not all finite, \
                         or all equal): its weights or activations overflowed or collapsed"
                            .to_string(),
                    ))
                } else if t.token as usize >= vocab {
                    Some((
                        *id,
                        format!(
                            "the backend sampled token {} outside the vocabulary of {vocab}",
                            t.token
                        ),
                    ))
                } else {
                    None
                }
            })
            .collect();
        for (id, why) in poisoned {
            tracing::error!(seq = id, reason = %why, "unusable sample");
            self.end(id, FinishReason::Error, Some(why));
        }
        // a grammar that refused its token or now allows none ends its request
        for (id, why) in self.sched.take_grammar_failures() {
            tracing::debug!(seq = id, reason = %why, "constrained sequence cannot go on");
            self.end(id, FinishReason::Error, Some(why));
        }
        sampled.retain(|(id, _)| self.requests.contains_key(id));
        // a sequence that verified drafts lands several tokens, in order:
        // each is judged at its own count, and those after the one that
        // ends the request are dropped unseen
        let mut later: HashMap<u64, usize> = HashMap::new();
        for (id, _) in &sampled {
            *later.entry(*id).or_default() += 1;
        }
        let mut ended: Vec<u64> = Vec::new();
        sampled.retain(|(id, tok)| {
            if ended.contains(id) {
                return false;
            }
            let left = later.get_mut(id).map_or(0, |n| {
                *n -= 1;
                *n
            });
            let generated = self.sched.summary(*id).map_or(0, |c| c.generated) - left;
            let ends = self
                .requests
                .get(id)
                .and_then(|r| r.out.ends_on(tok.token, generated, &self.eos));
            if let Some(reason) = ends {
                self.retire_at(*id, reason, generated);
                ended.push(*id);
            }
            true
        });
        Shared::add(&self.shared.generation_tokens_total, sampled.len() as u64);
        sampled
    }

    /// Processes every pending token's text now and ends what it ends,
    /// then the `Finishing` requests whose text is now all sent.
    fn drain_pending(&mut self) {
        let pending = std::mem::take(&mut self.pending);
        let ended = process_text(&mut self.requests, pending, &self.eos);
        self.apply_endings(ended);
        self.end_finishing();
    }

    /// Ends the requests whose text processing returned a verdict.
    fn apply_endings(&mut self, ended: Vec<(u64, FinishReason, Option<String>)>) {
        for (id, reason, err) in ended {
            self.end(id, reason, err);
        }
    }

    fn add_schedule_ns(&self, since: Instant) {
        let ns = since.elapsed().as_nanos() as u64;
        self.shared
            .schedule_ns_total
            .fetch_add(ns, Ordering::Relaxed);
    }

    fn publish(&self) {
        let s = &self.shared;
        let st = |a: &AtomicU64, v: usize| a.store(v as u64, Ordering::Relaxed);
        let (running, waiting) = self.sched.counts();
        st(&s.running, running);
        st(&s.waiting, waiting);
        st(&s.kv_blocks_used, self.sched.kv().num_used_blocks());
        st(&s.kv_blocks_total, self.sched.kv().num_blocks());
        s.preemptions_total
            .store(self.sched.preemptions_total, Ordering::Relaxed);
        if let Some(spec) = self.sched.spec_stats() {
            st(&s.spec_drafted_total, spec.drafted as usize);
            st(&s.spec_accepted_total, spec.accepted as usize);
            st(&s.spec_verifies_total, spec.verifies as usize);
        }
        let slots = self.sched.lora();
        if slots.len() > 0 {
            let names = |m: HashMap<Arc<str>, usize>| {
                let mut v: Vec<String> = m.into_keys().map(|k| k.to_string()).collect();
                v.sort();
                v
            };
            s.set_lora_gauge(LoraGauge {
                running: names(slots.users()),
                waiting: names(self.sched.waiting_loras()),
                resident: slots.resident(),
            });
        }
    }
}
