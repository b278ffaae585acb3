//! The engine loop: one std::thread owning the backend, the scheduler and
//! every request's output state.
//!
//! Contract: the loop sleeps on the submission channel while nothing is
//! queued or running; otherwise each iteration drains the channel (submits,
//! cancels, shutdown), plans a step, runs it on the backend, commits the
//! results and streams them.
//!
//! Output work is kept off the critical path: the text of step N's tokens
//! (detokenization, stop strings, events) is processed on a scoped helper
//! thread while the backend runs step N + 1. Endings decided by token id
//! alone (EOS, `max_tokens`) are applied at commit, so such a sequence is
//! never scheduled again; a stop string found in step N's text ends its
//! request after step N + 1, whose extra token is dropped unseen (usage counts
//! what was sent). Output is therefore identical to processing in line. A backend failure ends the requests of that
//! step with `FinishReason::Error` (their blocks freed); the others go on. A
//! scheduler invariant failure (a bug) ends every request with an error
//! rather than panicking. Shutdown (or every sender gone) cancels all requests
//! and returns.
//!
//! Costs per iteration: the scheduler's O(batch) plus O(sampled tokens) of
//! output work and O(messages) of channel work; counters are published to
//! [`Shared`] with relaxed atomic stores.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::Instant;

use contract::{Backend, SampledToken};
use tokenizer::Tokenizer;
use tokio::sync::mpsc::UnboundedSender;

use crate::output::{Output, Verdict};
use crate::scheduler::{SchedError, Scheduler};
use crate::types::{EngineStats, Event, FinishReason, GenerateRequest, Usage};

/// Messages from handles to the loop.
pub(crate) enum Msg {
    Submit(Box<NewRequest>),
    Cancel(u64),
    Shutdown,
}

pub(crate) struct NewRequest {
    pub id: u64,
    pub req: GenerateRequest,
    pub tx: UnboundedSender<Event>,
}

/// State shared between the loop and the handles.
#[derive(Default)]
pub(crate) struct Shared {
    /// Requests submitted and not yet admitted once nor finished.
    pub queued: AtomicUsize,
    pub shutting_down: AtomicBool,
    running: AtomicU64,
    waiting: AtomicU64,
    kv_blocks_used: AtomicU64,
    kv_blocks_total: AtomicU64,
    prompt_tokens_total: AtomicU64,
    cached_tokens_total: AtomicU64,
    generation_tokens_total: AtomicU64,
    steps_total: AtomicU64,
    preemptions_total: AtomicU64,
    backend_ns_total: AtomicU64,
    schedule_ns_total: AtomicU64,
    host_ns_total: AtomicU64,
}

impl Shared {
    pub(crate) fn snapshot(&self) -> EngineStats {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        EngineStats {
            running: l(&self.running),
            waiting: l(&self.waiting),
            kv_blocks_used: l(&self.kv_blocks_used),
            kv_blocks_total: l(&self.kv_blocks_total),
            prompt_tokens_total: l(&self.prompt_tokens_total),
            cached_tokens_total: l(&self.cached_tokens_total),
            generation_tokens_total: l(&self.generation_tokens_total),
            steps_total: l(&self.steps_total),
            preemptions_total: l(&self.preemptions_total),
            backend_ns_total: l(&self.backend_ns_total),
            schedule_ns_total: l(&self.schedule_ns_total),
            host_ns_total: l(&self.host_ns_total),
        }
    }
}

/// Everything the loop owns.
pub(crate) struct Worker {
    pub backend: Box<dyn Backend>,
    pub sched: Scheduler,
    pub tokenizer: Arc<Tokenizer>,
    pub eos: Vec<u32>,
    pub shared: Arc<Shared>,
    pub rx: Receiver<Msg>,
    outputs: HashMap<u64, Output>,
    /// Tokens of the last step whose text is not processed yet.
    pending: Vec<(u64, SampledToken)>,
    /// Requests retired from the scheduler at commit (EOS / max_tokens) whose
    /// last token's text is still pending: their reason and usage.
    closing: HashMap<u64, (FinishReason, Usage)>,
}

/// Below this many pending tokens the text is processed in line: a helper
/// thread costs more than it saves.
const OVERLAP_MIN_TOKENS: usize = 16;

/// Processes tokens' text in order; returns the requests that a verdict ends.
fn process_text(
    outputs: &mut HashMap<u64, Output>,
    tokens: Vec<(u64, SampledToken)>,
    eos: &[u32],
) -> Vec<(u64, FinishReason, Option<String>)> {
    let mut ended = Vec::new();
    for (id, tok) in tokens {
        let Some(out) = outputs.get_mut(&id) else {
            continue; // ended meanwhile: the token is dropped unseen
        };
        if let Verdict::Finish(reason, err) = out.on_token(tok, eos) {
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
    ) -> Self {
        Worker {
            backend,
            sched,
            tokenizer,
            eos,
            shared,
            rx,
            outputs: HashMap::new(),
            pending: Vec::new(),
            closing: HashMap::new(),
        }
    }

    /// Runs until shutdown or until every sender is gone.
    pub(crate) fn run(mut self) {
        self.publish();
        loop {
            if self.sched.is_idle() {
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
            let backend_ns = match self.step() {
                Ok(ns) => ns,
                Err(e) => {
                    tracing::error!(error = %e, "scheduler invariant broken; failing every request");
                    self.fail_all(
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
        self.drain_pending();
        self.fail_all(FinishReason::Cancelled, None);
        // requests submitted after the last drain
        while let Ok(msg) = self.rx.try_recv() {
            if let Msg::Submit(r) = msg {
                self.shared.queued.fetch_sub(1, Ordering::Relaxed);
                let _ = r.tx.send(Event::Done(crate::types::Finished {
                    reason: FinishReason::Cancelled,
                    usage: Usage {
                        prompt_tokens: r.req.prompt.len(),
                        ..Usage::default()
                    },
                    error: None,
                }));
            }
        }
        self.publish();
    }

    /// Applies one message; false on shutdown.
    fn handle(&mut self, msg: Msg) -> bool {
        match msg {
            Msg::Submit(r) => {
                let NewRequest { id, req, tx } = *r;
                let out = Output::new(
                    tx,
                    self.tokenizer.clone(),
                    &req.stop,
                    req.max_tokens,
                    req.ignore_eos,
                );
                self.outputs.insert(id, out);
                self.sched.add(id, req.prompt, req.sampling);
            }
            Msg::Cancel(id) => {
                if self.outputs.contains_key(&id) {
                    self.end(id, FinishReason::Cancelled, None);
                }
            }
            Msg::Shutdown => return false,
        }
        true
    }

    /// Plans, runs and commits one step; returns the nanoseconds spent in the backend.
    fn step(&mut self) -> Result<u64, SchedError> {
        let t_plan = Instant::now();
        self.sched.schedule()?;
        self.add_schedule_ns(t_plan);
        let first: Vec<u64> = self.sched.first_admitted().to_vec();
        for id in first {
            self.shared.queued.fetch_sub(1, Ordering::Relaxed);
            if let Some(seq) = self.sched.seq(id) {
                let (p, c) = (seq.prompt_len as u64, seq.cached_tokens as u64);
                self.shared
                    .prompt_tokens_total
                    .fetch_add(p, Ordering::Relaxed);
                self.shared
                    .cached_tokens_total
                    .fetch_add(c, Ordering::Relaxed);
            }
        }
        let aborted: Vec<u64> = self.sched.aborted().to_vec();
        for id in aborted {
            let why = self.sched.seq(id).map(|s| s.tokens.len()).unwrap_or(0);
            tracing::warn!(seq = id, tokens = why, "sequence outgrew the whole KV pool");
            self.end(id, FinishReason::Length, None);
        }
        if self.sched.batch().num_seqs() == 0 {
            self.drain_pending();
            return Ok(0);
        }
        let pending = std::mem::take(&mut self.pending);
        let timed_step = |backend: &mut Box<dyn Backend>, batch| {
            let t0 = Instant::now();
            let r = backend.step(batch);
            (r, t0.elapsed().as_nanos() as u64)
        };
        let ((result, backend_ns), ended) = if pending.len() < OVERLAP_MIN_TOKENS {
            let ended = process_text(&mut self.outputs, pending, &self.eos);
            (timed_step(&mut self.backend, self.sched.batch()), ended)
        } else {
            let (outputs, eos) = (&mut self.outputs, &self.eos);
            let (backend, batch) = (&mut self.backend, self.sched.batch());
            std::thread::scope(|scope| {
                let text = scope.spawn(move || process_text(outputs, pending, eos));
                let result = timed_step(backend, batch);
                // the helper only detokenizes and sends events: it cannot panic on user input
                let ended = text.join().unwrap_or_else(|_| Vec::new());
                (result, ended)
            })
        };
        self.shared
            .backend_ns_total
            .fetch_add(backend_ns, Ordering::Relaxed);
        self.shared.steps_total.fetch_add(1, Ordering::Relaxed);
        let results = match result {
            Ok(r) => r,
            Err(e) => {
                self.apply_endings(ended);
                let ids: Vec<u64> = self.sched.planned_ids().collect();
                tracing::error!(error = %e, seqs = ids.len(), "backend step failed");
                for id in ids {
                    self.end(
                        id,
                        FinishReason::Error,
                        Some(format!("backend step failed: {e}")),
                    );
                }
                return Ok(backend_ns);
            }
        };
        let mut sampled = Vec::new();
        let t_commit = Instant::now();
        self.sched.commit(results, &mut sampled)?;
        self.add_schedule_ns(t_commit);
        // after the commit: a request a stop string ended leaves the scheduler
        // with this step's token, which is never shown
        self.apply_endings(ended);
        sampled.retain(|(id, _)| self.outputs.contains_key(id));
        self.shared
            .generation_tokens_total
            .fetch_add(sampled.len() as u64, Ordering::Relaxed);
        for (id, tok) in &sampled {
            let generated = self.sched.seq(*id).map(|s| s.generated()).unwrap_or(0);
            let ends = self
                .outputs
                .get(id)
                .and_then(|out| out.ends_on(tok.token, generated, &self.eos));
            if let Some(reason) = ends {
                self.retire(*id, reason);
            }
        }
        self.pending = sampled;
        Ok(backend_ns)
    }

    /// Processes every pending token's text now and closes what it ends.
    fn drain_pending(&mut self) {
        let pending = std::mem::take(&mut self.pending);
        let ended = process_text(&mut self.outputs, pending, &self.eos);
        self.apply_endings(ended);
        let closing: Vec<u64> = self.closing.keys().copied().collect();
        for id in closing {
            if let Some((reason, usage)) = self.closing.remove(&id)
                && let Some(out) = self.outputs.remove(&id)
            {
                out.finish(reason, usage, None);
            }
        }
    }

    /// Ends the requests whose text processing returned a verdict.
    fn apply_endings(&mut self, ended: Vec<(u64, FinishReason, Option<String>)>) {
        for (id, reason, err) in ended {
            self.end(id, reason, err);
        }
    }

    /// Takes a sequence out of the scheduler at commit (its blocks freed) while
    /// its last token's text is still pending; `Done` follows that text.
    fn retire(&mut self, id: u64, reason: FinishReason) {
        match self.sched.finish(id) {
            Ok(seq) => {
                let usage = Usage {
                    prompt_tokens: seq.prompt_len,
                    cached_tokens: seq.cached_tokens,
                    completion_tokens: seq.generated(),
                };
                self.closing.insert(id, (reason, usage));
            }
            Err(e) => tracing::error!(seq = id, error = %e, "retiring an unknown sequence"),
        }
    }

    /// Ends one request: frees its blocks and sends `Done`.
    fn end(&mut self, id: u64, reason: FinishReason, error: Option<String>) {
        let out = self.outputs.remove(&id);
        if let Some((_, usage)) = self.closing.remove(&id) {
            // already out of the scheduler (EOS / max_tokens at commit)
            if let Some(out) = out {
                out.finish(reason, usage, error);
            }
            return;
        }
        let sent = out.as_ref().map(Output::generated);
        let usage = match self.sched.finish(id) {
            Ok(seq) => {
                if !seq.admitted_once {
                    self.shared.queued.fetch_sub(1, Ordering::Relaxed);
                }
                Usage {
                    prompt_tokens: seq.prompt_len,
                    cached_tokens: seq.cached_tokens,
                    // tokens computed but never shown (after a stop string) do not count
                    completion_tokens: sent.unwrap_or(seq.generated()).min(seq.generated()),
                }
            }
            Err(e) => {
                tracing::error!(seq = id, error = %e, "finishing an unknown sequence");
                Usage::default()
            }
        };
        if let Some(out) = out {
            out.finish(reason, usage, error);
        }
    }

    fn fail_all(&mut self, reason: FinishReason, error: Option<String>) {
        let closing: Vec<u64> = self.closing.keys().copied().collect();
        for id in self.sched.ids().into_iter().chain(closing) {
            self.end(id, reason, error.clone());
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
        st(&s.running, self.sched.num_running());
        st(&s.waiting, self.sched.num_waiting());
        st(&s.kv_blocks_used, self.sched.kv().num_used_blocks());
        st(&s.kv_blocks_total, self.sched.kv().num_blocks());
        s.preemptions_total
            .store(self.sched.preemptions_total, Ordering::Relaxed);
    }
}
