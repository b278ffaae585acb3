//! Warm-up at start: every step shape the scheduler will use runs once, on
//! dummy tokens, before the first real request, so no real request pays a
//! shape's first-use work (a CUDA graph's capture, a kernel module's lazy
//! load, a GEMM's algorithm choice, a buffer's growth).
//!
//! Contract: [`Engine::warm_up`] submits requests of its own through the
//! ordinary path and waits for them, in this order: one request per
//! prefill bucket ([`WarmupPlan::prefills`]: token counts in powers of two
//! up to the step budget, and the budget itself), then, per decode batch
//! bucket ([`WarmupPlan::decode_batches`]: powers of two up to
//! `max_num_seqs`, ascending, so each bucket's graph is captured rather
//! than served padded by a larger one), one request of that many choices
//! (queued at once, so they decode together). Every other shape samples
//! greedily, the others with top-k / top-p / min-p, so both sampler paths
//! run. Once `budget` has passed, the shape
//! running is cancelled and the rest skipped. Then the engine forgets it: the prefix cache is
//! emptied (no dummy block is ever matched) and every counter of
//! [`Engine::stats`] starts from zero. Outputs of later requests are those
//! of an engine that never warmed up (warm-up changes no state a request
//! reads).
//!
//! Costs: the plan's steps, `log2(max_batch_tokens) + log2(max_num_seqs)`
//! shapes of a few steps each; bounded by `budget`.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use contract::SamplingParams;

use crate::engine::{Canceller, Engine, RequestHandle};
use crate::types::{GenerateRequest, SubmitError};

/// Tokens each request of a decode batch generates: its decode steps
/// (enough that the batch decodes together for several steps even when
/// its last choice joins a step or two after the first).
const DECODE_STEPS: usize = 8;
/// Prompt tokens of each request of a decode batch.
const DECODE_PROMPT: usize = 4;

/// The step shapes a warm-up runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WarmupPlan {
    /// Prompt lengths, one request each: a prefill step of that many tokens.
    pub prefills: Vec<usize>,
    /// Decode batches: this many requests at once.
    pub decode_batches: Vec<usize>,
}

impl WarmupPlan {
    /// The plan for an engine of these limits: prefills up to
    /// `max_batch_tokens` that fit `max_sequence` and the pool of
    /// `pool_tokens`, decode batches up to `max_num_seqs` whose sequences
    /// the pool holds at once.
    pub fn new(
        max_batch_tokens: usize,
        max_num_seqs: usize,
        max_sequence: usize,
        pool_tokens: usize,
        block_size: usize,
    ) -> WarmupPlan {
        let longest = max_batch_tokens
            .min(max_sequence.saturating_sub(DECODE_STEPS))
            .min(pool_tokens.saturating_sub(block_size + DECODE_STEPS));
        let mut prefills = powers_up_to(longest);
        if longest > 0 && prefills.last() != Some(&longest) {
            prefills.push(longest);
        }
        let per_seq = (DECODE_PROMPT + DECODE_STEPS).div_ceil(block_size.max(1)) + 1;
        let most = max_num_seqs.min(pool_tokens / block_size.max(1) / per_seq);
        let decode_batches = if DECODE_PROMPT + DECODE_STEPS <= max_sequence {
            powers_up_to(most)
        } else {
            Vec::new()
        };
        WarmupPlan {
            prefills,
            decode_batches,
        }
    }

    /// Shapes in the plan.
    pub fn len(&self) -> usize {
        self.prefills.len() + self.decode_batches.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// 1, 2, 4, ... up to `n`.
fn powers_up_to(n: usize) -> Vec<usize> {
    std::iter::successors(Some(1usize), |p| p.checked_mul(2))
        .take_while(|&p| p <= n)
        .collect()
}

/// What [`Engine::warm_up`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WarmupReport {
    /// Shapes the plan holds.
    pub planned: usize,
    /// Shapes run before the budget ran out.
    pub warmed: usize,
    pub elapsed: Duration,
}

impl std::fmt::Display for WarmupReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "warmed up {} of {} step shapes in {:.2}s",
            self.warmed,
            self.planned,
            self.elapsed.as_secs_f64()
        )
    }
}

/// Warm-up request `shape`: `len` dummy tokens no other warm-up request
/// shares a block with; greedy for even `shape`, sampled for odd.
fn dummy(shape: usize, len: usize, vocab: usize, max_tokens: usize) -> GenerateRequest {
    let vocab = vocab.max(1) as u64;
    let prompt = (0..len)
        .map(|i| {
            let x = ((shape as u64) << 32) ^ i as u64;
            (contract::sampling::splitmix64(x) % vocab) as u32
        })
        .collect();
    let sampling = if shape.is_multiple_of(2) {
        SamplingParams {
            temperature: 0.0,
            ..Default::default()
        }
    } else {
        SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            seed: shape as u64,
            ..Default::default()
        }
    };
    GenerateRequest {
        prompt,
        sampling,
        max_tokens,
        stop: Vec::new(),
        ignore_eos: true,
        stop_token_ids: Vec::new(),
        constraint: None,
        speculative: true,
        lora: None,
    }
}

/// Waits for every request to end, cancelling them all once `left` has
/// passed; true when they ended in time.
fn collect_within(handles: Vec<RequestHandle>, left: Duration) -> bool {
    let cancellers: Vec<Canceller> = handles.iter().map(RequestHandle::canceller).collect();
    let (done, wait) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        let watchdog = s.spawn(move || {
            let late = matches!(wait.recv_timeout(left), Err(RecvTimeoutError::Timeout));
            if late {
                for c in &cancellers {
                    c.cancel();
                }
            }
            late
        });
        for h in handles {
            h.blocking_collect();
        }
        // (the watchdog may be gone already: it timed out)
        let _ = done.send(());
        !watchdog.join().unwrap_or(true)
    })
}

impl Engine {
    /// The warm-up plan of this engine ([`WarmupPlan::new`]).
    pub fn warmup_plan(&self) -> WarmupPlan {
        let (block_size, blocks) = self.kv_shape();
        let cfg = self.config();
        // (all of a batch is queued at once: within `max_queue`)
        let queue = if cfg.max_queue == 0 {
            usize::MAX
        } else {
            cfg.max_queue
        };
        WarmupPlan::new(
            cfg.max_batch_tokens,
            cfg.max_num_seqs.min(queue),
            self.max_sequence(),
            blocks.saturating_mul(block_size),
            block_size,
        )
    }

    /// Runs every shape of [`Engine::warmup_plan`] once within `budget`,
    /// then forgets it (module doc). Call it before serving: the warm-up
    /// requests queue like any other.
    pub fn warm_up(&self, budget: Duration) -> Result<WarmupReport, SubmitError> {
        let start = Instant::now();
        let plan = self.warmup_plan();
        let vocab = self.vocab_size();
        let mut warmed = 0;
        // (request, choices): a decode batch is one request of that many
        // choices, queued at once, its prompt computed once and forked
        let mut shapes: Vec<(GenerateRequest, usize)> = plan
            .prefills
            .iter()
            .enumerate()
            .map(|(k, &len)| (dummy(k, len, vocab, 2), 1))
            .collect();
        for (k, &b) in plan.decode_batches.iter().enumerate() {
            let shape = plan.prefills.len() + k;
            shapes.push((dummy(shape, DECODE_PROMPT, vocab, DECODE_STEPS), b));
        }
        for (req, n) in shapes {
            let Some(left) = budget.checked_sub(start.elapsed()) else {
                break;
            };
            if !collect_within(self.submit_n(req, n)?, left) {
                break;
            }
            warmed += 1;
        }
        self.forget_warm_up();
        Ok(WarmupReport {
            planned: plan.len(),
            warmed,
            elapsed: start.elapsed(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_covers_every_bucket_within_the_limits() {
        let p = WarmupPlan::new(512, 256, 8192, 1 << 20, 16);
        assert_eq!(p.prefills, [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]);
        assert_eq!(p.decode_batches, [1, 2, 4, 8, 16, 32, 64, 128, 256]);
        // a step budget that is no power of two is warmed itself too
        let p = WarmupPlan::new(600, 3, 8192, 1 << 20, 16);
        assert_eq!(p.prefills.last(), Some(&600));
        assert_eq!(p.decode_batches, [1, 2]);
        // a short context and a small pool cap both
        let p = WarmupPlan::new(8192, 256, 100, 1 << 20, 16);
        assert_eq!(p.prefills.last(), Some(&(100 - DECODE_STEPS)));
        let p = WarmupPlan::new(8192, 256, 8192, 64 * 16, 16);
        assert_eq!(p.decode_batches.last(), Some(&32));
        assert!(p.prefills.iter().all(|&l| l + DECODE_STEPS <= 63 * 16));
    }
}
