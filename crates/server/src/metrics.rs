//! Prometheus metrics in the text exposition format (`GET /metrics`).
//!
//! Gauges and token counters are read from [`engine::EngineStats`] at scrape
//! time; the latency histograms (time to first token, inter-token latency,
//! end-to-end latency) and the finished-request counter are recorded by the
//! server as tokens stream out. Recording is lock-free (atomics), O(buckets)
//! per observation; a scrape is O(buckets) per histogram.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use engine::EngineStats;

/// Upper bounds in seconds of the latency buckets (`+Inf` is implicit).
const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
];
const ITL_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
    0.4, 0.5, 0.75, 1.0, 2.5,
];
const E2E_BUCKETS: &[f64] = &[
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
];

/// A fixed-bucket histogram of durations.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// `[bounds.len() + 1]` non-cumulative counts; the last is the overflow.
    counts: Vec<AtomicU64>,
    sum_nanos: AtomicU64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_nanos: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let i = self.bounds.partition_point(|&b| b < secs);
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// Number of observations.
    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} histogram");
        let mut cum = 0u64;
        for (i, b) in self.bounds.iter().enumerate() {
            cum += self.counts[i].load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cum}");
        }
        cum += self.counts[self.bounds.len()].load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cum}");
        let sum = self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum {sum}");
        let _ = writeln!(out, "{name}_count {cum}");
    }
}

/// Finish reasons counted in `lamina_requests_finished_total`.
const REASONS: [&str; 4] = ["stop", "length", "cancelled", "error"];

/// The server's own metrics.
#[derive(Debug)]
pub struct Metrics {
    pub ttft: Histogram,
    pub itl: Histogram,
    pub e2e: Histogram,
    finished: [AtomicU64; 4],
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            ttft: Histogram::new(TTFT_BUCKETS),
            itl: Histogram::new(ITL_BUCKETS),
            e2e: Histogram::new(E2E_BUCKETS),
            finished: Default::default(),
        }
    }
}

impl Metrics {
    /// Counts a finished request under its reason (`stop`, `length`, `cancelled`, `error`).
    pub fn finished(&self, reason: &str) {
        if let Some(i) = REASONS.iter().position(|r| *r == reason) {
            self.finished[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The full exposition text: the engine's gauges and counters, then ours.
    pub fn render(&self, stats: &EngineStats, model: &str) -> String {
        let mut out = String::new();
        let label = format!("model_name=\"{}\"", escape(model));
        let mut one = |name: &str, kind: &str, help: &str, v: u64| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            let _ = writeln!(out, "{name}{{{label}}} {v}");
        };
        one(
            "lamina_num_requests_running",
            "gauge",
            "Requests being generated.",
            stats.running,
        );
        one(
            "lamina_num_requests_waiting",
            "gauge",
            "Requests queued for admission.",
            stats.waiting,
        );
        one(
            "lamina_kv_blocks_used",
            "gauge",
            "KV cache blocks referenced by a sequence (prefix-cached blocks excluded).",
            stats.kv_blocks_used,
        );
        one(
            "lamina_kv_blocks_total",
            "gauge",
            "KV cache blocks in the pool.",
            stats.kv_blocks_total,
        );
        one(
            "lamina_prompt_tokens_total",
            "counter",
            "Prompt tokens admitted.",
            stats.prompt_tokens_total,
        );
        one(
            "lamina_cached_prompt_tokens_total",
            "counter",
            "Prompt tokens served from the prefix cache.",
            stats.cached_tokens_total,
        );
        one(
            "lamina_generation_tokens_total",
            "counter",
            "Tokens generated.",
            stats.generation_tokens_total,
        );
        let name = "lamina_requests_finished_total";
        let _ = writeln!(out, "# HELP {name} Requests finished, by finish reason.");
        let _ = writeln!(out, "# TYPE {name} counter");
        for (reason, n) in REASONS.iter().zip(&self.finished) {
            let n = n.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}{{finished_reason=\"{reason}\"}} {n}");
        }
        self.ttft.render(
            &mut out,
            "lamina_time_to_first_token_seconds",
            "Time from request arrival to its first generated token.",
        );
        self.itl.render(
            &mut out,
            "lamina_inter_token_latency_seconds",
            "Time between consecutive generated tokens of a request.",
        );
        self.e2e.render(
            &mut out,
            "lamina_e2e_request_latency_seconds",
            "Time from request arrival to its last token.",
        );
        out
    }
}

/// Escapes a Prometheus label value.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::new(&[0.1, 1.0]);
        h.observe(Duration::from_millis(50));
        h.observe(Duration::from_millis(100)); // on the bound: le="0.1"
        h.observe(Duration::from_millis(500));
        h.observe(Duration::from_secs(3));
        let mut s = String::new();
        h.render(&mut s, "x", "help");
        assert!(s.contains("x_bucket{le=\"0.1\"} 2\n"), "{s}");
        assert!(s.contains("x_bucket{le=\"1\"} 3\n"), "{s}");
        assert!(s.contains("x_bucket{le=\"+Inf\"} 4\n"), "{s}");
        assert!(s.contains("x_sum 3.65\n"), "{s}");
        assert!(s.contains("x_count 4\n"), "{s}");
        assert_eq!(h.count(), 4);
    }

    #[test]
    fn finished_counts_by_reason() {
        let m = Metrics::default();
        m.finished("stop");
        m.finished("stop");
        m.finished("length");
        let s = m.render(&EngineStats::default(), "m\"x");
        assert!(s.contains("lamina_requests_finished_total{finished_reason=\"stop\"} 2"));
        assert!(s.contains("lamina_requests_finished_total{finished_reason=\"length\"} 1"));
        assert!(s.contains("lamina_num_requests_running{model_name=\"m\\\"x\"} 0"));
    }
}
