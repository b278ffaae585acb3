//! The per-request state machine of the loop, and the one function that ends
//! a request.
//!
//! ```text
//! submit ─> Queued ──first admission──> Running ──EOS / max_tokens at commit──> Finishing
//!             │                           │                                        │
//!             └──────── cancel, stop string, abort, error, shutdown ───────────────┴─> Done
//! ```
//! - `Queued`: in the scheduler, never admitted; counted in `Shared::queued`.
//! - `Running`: in the scheduler, admitted at least once (a preempted request
//!   waits again but stays `Running`: its prompt is already counted).
//! - `Finishing`: taken out of the scheduler at commit (blocks freed, never
//!   scheduled again) because its last token ends it by id; that token's text
//!   is still pending, and `Done` follows it.
//! - `Done`: [`Worker::end`] removed it and sent [`crate::Event::Done`]; it is
//!   no longer in the map.
//!
//! Usage is computed in one place ([`usage`]) from the scheduler's counts;
//! prompt and cached totals are counted at the `Queued -> Running` transition,
//! `Shared::queued` is decremented exactly once (at that transition, or at the
//! end of a request that never got there), and so is its share of
//! `Shared::queued_prompt_tokens`.
//!
//! Costs: each transition is O(1) plus the scheduler's `finish` (O(running)).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::Worker;
use super::shared::Shared;
use crate::output::Output;
use crate::scheduler::SeqSummary;
use crate::types::{FinishReason, Usage};

/// Where a request is in its life (module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    Queued,
    Running,
    Finishing {
        reason: FinishReason,
        counts: SeqSummary,
    },
}

/// One live request: its phase and its output side.
pub(super) struct Request {
    pub phase: Phase,
    pub out: Output,
    /// Prompt tokens, counted in `Shared::queued_prompt_tokens` while `Queued`.
    pub prompt_len: usize,
    /// When the loop accepted it.
    pub accepted: Instant,
    /// Time from acceptance to the first admission, once admitted.
    pub queue_time: Option<Duration>,
}

/// A request's usage: `counts` from the scheduler; `shown` caps the
/// completion tokens at what was sent (tokens computed after a stop string
/// are never shown and do not count), `None` counts every sampled token.
fn usage(counts: Option<SeqSummary>, shown: Option<usize>) -> Usage {
    let Some(c) = counts else {
        return Usage::default();
    };
    Usage {
        prompt_tokens: c.prompt_len,
        cached_tokens: c.cached_tokens,
        completion_tokens: shown.map_or(c.generated, |s| s.min(c.generated)),
    }
}

impl Worker {
    /// `Queued -> Running` at the first admission: the prompt is counted.
    pub(super) fn on_admitted(&mut self, id: u64) {
        let Some(req) = self.requests.get_mut(&id) else {
            return;
        };
        if req.phase != Phase::Queued {
            return;
        }
        req.phase = Phase::Running;
        req.queue_time = Some(req.accepted.elapsed());
        self.shared.queued.fetch_sub(1, Ordering::Relaxed);
        self.shared
            .queued_prompt_tokens
            .fetch_sub(req.prompt_len as u64, Ordering::Relaxed);
        if let Some(c) = self.sched.summary(id) {
            Shared::add(&self.shared.prompt_tokens_total, c.prompt_len as u64);
            Shared::add(&self.shared.cached_tokens_total, c.cached_tokens as u64);
        }
    }

    /// `Running -> Finishing`: the token committed last ends the request by
    /// id; it leaves the scheduler now and `Done` follows its text.
    pub(super) fn retire(&mut self, id: u64, reason: FinishReason) {
        match self.sched.finish(id) {
            Ok(counts) => {
                if let Some(req) = self.requests.get_mut(&id) {
                    req.phase = Phase::Finishing { reason, counts };
                }
            }
            Err(e) => tracing::error!(seq = id, error = %e, "retiring an unknown sequence"),
        }
    }

    /// [`Worker::retire`] by a token that is the request's `generated`-th:
    /// tokens landed after it (verified drafts) are not counted.
    pub(super) fn retire_at(&mut self, id: u64, reason: FinishReason, generated: usize) {
        self.retire(id, reason);
        if let Some(Request {
            phase: Phase::Finishing { counts, .. },
            ..
        }) = self.requests.get_mut(&id)
        {
            counts.generated = counts.generated.min(generated);
        }
    }

    /// Any phase `-> Done`: leaves the scheduler if still there (blocks
    /// freed), counts usage and sends `Done`. The only way a request ends.
    pub(super) fn end(&mut self, id: u64, reason: FinishReason, error: Option<String>) {
        let Some(req) = self.requests.remove(&id) else {
            return;
        };
        let (counts, shown) = match req.phase {
            Phase::Finishing { counts, .. } => (Some(counts), None),
            Phase::Queued | Phase::Running => {
                if req.phase == Phase::Queued {
                    self.shared.queued.fetch_sub(1, Ordering::Relaxed);
                    self.shared
                        .queued_prompt_tokens
                        .fetch_sub(req.prompt_len as u64, Ordering::Relaxed);
                }
                match self.sched.finish(id) {
                    Ok(c) => (Some(c), Some(req.out.generated())),
                    Err(e) => {
                        tracing::error!(seq = id, error = %e, "finishing an unknown sequence");
                        (None, None)
                    }
                }
            }
        };
        req.out
            .finish(reason, usage(counts, shown), error, req.queue_time);
    }

    /// Ends every `Finishing` request whose last text produced no verdict of
    /// its own, with the reason decided at commit.
    pub(super) fn end_finishing(&mut self) {
        let finishing: Vec<(u64, FinishReason)> = self
            .requests
            .iter()
            .filter_map(|(&id, r)| match r.phase {
                Phase::Finishing { reason, .. } => Some((id, reason)),
                _ => None,
            })
            .collect();
        for (id, reason) in finishing {
            self.end(id, reason, None);
        }
    }

    /// Ends every live request.
    pub(super) fn end_all(&mut self, reason: FinishReason, error: Option<String>) {
        let ids: Vec<u64> = self.requests.keys().copied().collect();
        for id in ids {
            self.end(id, reason, error.clone());
        }
    }
}
