//! The time budget of a step: how many prefill tokens fit the target step
//! time on this backend, learned from the steps already run.
//!
//! Contract: [`StepClock::observe`] takes each step's token count and
//! backend time; steps of at least [`SAMPLE_MIN_TOKENS`] tokens (prefill
//! dominated) update an exponential moving average of the time per token
//! (weight [`EMA_WEIGHT`] for the newest). [`StepClock::prefill_cap`] is the
//! number of tokens expected to take the target time, at least
//! [`MIN_CHUNK`] so a long prompt always progresses, and unlimited until a
//! first sample exists or when no target is set. The scheduler gives prefill
//! chunks no more than that in a step while another sequence is running or
//! waiting (decodes are never cut; a lone prompt runs whole chunks), so on a slow
//! backend a long prompt is cut into chunks of about the target time and
//! every other stream gets a token at least that often.
//! Costs: O(1) per step.

use std::time::Duration;

/// Steps with fewer tokens (decodes) say little about prefill speed.
pub const SAMPLE_MIN_TOKENS: usize = 16;
/// The newest sample's weight in the average: adapts within a few steps to
/// the cost growing with the context.
pub const EMA_WEIGHT: f64 = 0.5;
/// The smallest prefill chunk the cap allows.
pub const MIN_CHUNK: usize = 16;

/// The learned time per prefill token against a target step time.
#[derive(Debug, Clone)]
pub struct StepClock {
    target: Option<Duration>,
    ns_per_token: Option<f64>,
}

impl StepClock {
    /// A clock aiming at `target` per step (`None`: no time cap).
    pub fn new(target: Option<Duration>) -> Self {
        StepClock {
            target,
            ns_per_token: None,
        }
    }

    /// Records a step of `tokens` tokens that took `backend_ns` in the backend.
    pub fn observe(&mut self, tokens: usize, backend_ns: u64) {
        if self.target.is_none() || tokens < SAMPLE_MIN_TOKENS {
            return;
        }
        let sample = backend_ns as f64 / tokens as f64;
        self.ns_per_token = Some(match self.ns_per_token {
            Some(avg) => avg + EMA_WEIGHT * (sample - avg),
            None => sample,
        });
    }

    /// Most prefill tokens for the next step (see the module doc).
    pub fn prefill_cap(&self) -> usize {
        match (self.target, self.ns_per_token) {
            (Some(t), Some(ns)) if ns > 0.0 => {
                let n = t.as_nanos() as f64 / ns;
                (n as usize).max(MIN_CHUNK)
            }
            _ => usize::MAX,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_follows_the_measured_speed_and_never_starves_prefill() {
        let mut c = StepClock::new(Some(Duration::from_millis(200)));
        assert_eq!(c.prefill_cap(), usize::MAX, "unlimited before any sample");
        c.observe(4, 1_000_000_000);
        assert_eq!(c.prefill_cap(), usize::MAX, "decode steps are not samples");
        c.observe(100, 1_000_000_000); // 10 ms a token
        assert_eq!(c.prefill_cap(), 20);
        c.observe(100, 200_000_000); // 2 ms a token: the average halves the gap
        assert_eq!(c.prefill_cap(), 33); // 200 ms / 6 ms
        c.observe(50, 50_000_000_000); // 1 s a token
        assert_eq!(c.prefill_cap(), MIN_CHUNK);
        let mut off = StepClock::new(None);
        off.observe(100, 1_000_000_000);
        assert_eq!(off.prefill_cap(), usize::MAX);
    }
}
