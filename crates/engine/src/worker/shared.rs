//! [`Shared`]: the counters and gauges the loop publishes and the handles
//! read (`Engine::stats`), plus the queue count and shutdown flag `submit`
//! checks, and the failure of a halted engine. Every access is one relaxed
//! (or acquire/release) atomic operation, but the failure's (a mutex taken
//! only when reading or setting it).

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use crate::types::{EngineStats, LoraGauge};

/// State shared between the loop and the handles.
#[derive(Default)]
pub(crate) struct Shared {
    /// Requests submitted and not yet admitted once nor finished.
    pub queued: AtomicUsize,
    pub shutting_down: AtomicBool,
    /// Prompt tokens of the `queued` requests (added at submit, removed at
    /// the first admission or the end of a request never admitted).
    pub queued_prompt_tokens: AtomicU64,
    /// Why the engine failed (`EngineConfig::halt_on_backend_error`); set once.
    failure: Mutex<Option<String>>,
    /// The LoRA adapters in use (published only with slots).
    lora: Mutex<LoraGauge>,
    pub(super) running: AtomicU64,
    pub(super) waiting: AtomicU64,
    pub(super) kv_blocks_used: AtomicU64,
    pub(super) kv_blocks_total: AtomicU64,
    pub(super) prompt_tokens_total: AtomicU64,
    pub(super) cached_tokens_total: AtomicU64,
    pub(super) generation_tokens_total: AtomicU64,
    pub(super) steps_total: AtomicU64,
    pub(super) preemptions_total: AtomicU64,
    pub(super) backend_ns_total: AtomicU64,
    pub(super) schedule_ns_total: AtomicU64,
    pub(super) host_ns_total: AtomicU64,
    pub(super) spec_drafted_total: AtomicU64,
    pub(super) spec_accepted_total: AtomicU64,
    pub(super) spec_verifies_total: AtomicU64,
}

impl Shared {
    pub(crate) fn snapshot(&self) -> EngineStats {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        EngineStats {
            running: l(&self.running),
            waiting: l(&self.waiting),
            queued_prompt_tokens: l(&self.queued_prompt_tokens),
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
            spec_drafted_total: l(&self.spec_drafted_total),
            spec_accepted_total: l(&self.spec_accepted_total),
            spec_verifies_total: l(&self.spec_verifies_total),
        }
    }

    /// Why the engine failed, once it has.
    pub(crate) fn failure(&self) -> Option<String> {
        match self.failure.lock() {
            Ok(f) => f.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// The LoRA adapters in use, as last published.
    pub(crate) fn lora_gauge(&self) -> LoraGauge {
        match self.lora.lock() {
            Ok(g) => g.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Publishes the LoRA adapters in use.
    pub(super) fn set_lora_gauge(&self, g: LoraGauge) {
        match self.lora.lock() {
            Ok(mut l) => *l = g,
            Err(poisoned) => *poisoned.into_inner() = g,
        }
    }

    /// Records the engine's failure (the first one is kept).
    pub(super) fn set_failure(&self, why: String) {
        let mut f = match self.failure.lock() {
            Ok(f) => f,
            Err(poisoned) => poisoned.into_inner(),
        };
        f.get_or_insert(why);
    }

    /// Adds `n` to a counter.
    /// Zeroes the running totals (the gauges are published each step).
    pub(super) fn reset_totals(&self) {
        for c in [
            &self.prompt_tokens_total,
            &self.cached_tokens_total,
            &self.generation_tokens_total,
            &self.steps_total,
            &self.preemptions_total,
            &self.backend_ns_total,
            &self.schedule_ns_total,
            &self.host_ns_total,
            &self.spec_drafted_total,
            &self.spec_accepted_total,
            &self.spec_verifies_total,
        ] {
            c.store(0, Ordering::Relaxed);
        }
    }

    pub(super) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}
