//! The engine loop: one std::thread owning the backend, the scheduler and
//! every request's output state.
//!
//! Contract: the loop sleeps on the submission channel while nothing is
//! queued or running; otherwise each iteration drains the channel (submits,
//! cancels, shutdown), plans a step, runs it on the backend, commits the
//! results and streams them. A backend failure ends the requests of that
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

use model::tokenizer::Tokenizer;
use model::{Backend, SampledToken};
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
    sampled: Vec<(u64, SampledToken)>,
    finished: Vec<(u64, FinishReason, Option<String>)>,
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
            sampled: Vec::new(),
            finished: Vec::new(),
        }
    }

    /// Runs until shutdown or until every sender is gone.
    pub(crate) fn run(mut self) {
        self.publish();
        loop {
            if self.sched.is_idle() {
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
            return Ok(0);
        }
        let t0 = Instant::now();
        let result = self.backend.step(self.sched.batch());
        let backend_ns = t0.elapsed().as_nanos() as u64;
        self.shared
            .backend_ns_total
            .fetch_add(backend_ns, Ordering::Relaxed);
        self.shared.steps_total.fetch_add(1, Ordering::Relaxed);
        let results = match result {
            Ok(r) => r,
            Err(e) => {
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
        let mut sampled = std::mem::take(&mut self.sampled);
        let t_commit = Instant::now();
        self.sched.commit(results, &mut sampled)?;
        self.add_schedule_ns(t_commit);
        self.shared
            .generation_tokens_total
            .fetch_add(sampled.len() as u64, Ordering::Relaxed);
        for (id, tok) in sampled.drain(..) {
            let Some(out) = self.outputs.get_mut(&id) else {
                continue;
            };
            if let Verdict::Finish(reason, err) = out.on_token(tok, &self.eos) {
                self.finished.push((id, reason, err));
            }
        }
        self.sampled = sampled;
        let mut finished = std::mem::take(&mut self.finished);
        for (id, reason, err) in finished.drain(..) {
            self.end(id, reason, err);
        }
        self.finished = finished;
        Ok(backend_ns)
    }

    /// Ends one request: frees its blocks and sends `Done`.
    fn end(&mut self, id: u64, reason: FinishReason, error: Option<String>) {
        let out = self.outputs.remove(&id);
        let usage = match self.sched.finish(id) {
            Ok(seq) => {
                if !seq.admitted_once {
                    self.shared.queued.fetch_sub(1, Ordering::Relaxed);
                }
                Usage {
                    prompt_tokens: seq.prompt_len,
                    cached_tokens: seq.cached_tokens,
                    completion_tokens: seq.generated(),
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
        for id in self.sched.ids() {
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
