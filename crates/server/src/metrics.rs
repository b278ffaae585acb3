//! Prometheus metrics in the text exposition format (`GET /metrics`).
//!
//! Gauges and token counters are read from each replica's
//! [`engine::EngineStats`] at scrape time, written once per replica (label
//! `engine="<i>"`) and once summed (no `engine` label, last in its family);
//! the latency histograms (time to first token, inter-token latency,
//! end-to-end latency, queue time) and the finished-request counter are
//! recorded by the server as tokens stream out. Every series carries
//! `model_name`. The gateway's series (requests running and waiting, KV
//! cache usage, `cache_config_info` with `block_size` / `num_gpu_blocks`)
//! are also written under vLLM's names (`vllm:num_requests_running`,
//! `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`,
//! `vllm:cache_config_info`), so the Kubernetes inference gateway's
//! endpoint picker and llm-d read them without a mapping. With several
//! models, each model's exposition is rendered alone and [`merge`]d: one
//! family, every model's samples (`model_name` tells them apart). Recording is lock-free (atomics), O(buckets)
//! per observation; a scrape is O(buckets) per histogram.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use engine::EngineStats;

mod merge;
pub use merge::merge;

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

    /// Writes the histogram with `labels` (`k="v",...`, may be empty) on every series.
    fn render(&self, out: &mut String, name: &str, help: &str, labels: &str) {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} histogram");
        let (bucket_pre, plain) = if labels.is_empty() {
            (String::new(), String::new())
        } else {
            (format!("{labels},"), format!("{{{labels}}}"))
        };
        let mut cum = 0u64;
        for (i, b) in self.bounds.iter().enumerate() {
            cum += self.counts[i].load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{bucket_pre}le=\"{b}\"}} {cum}");
        }
        cum += self.counts[self.bounds.len()].load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{bucket_pre}le=\"+Inf\"}} {cum}");
        let sum = self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum{plain} {sum}");
        let _ = writeln!(out, "{name}_count{plain} {cum}");
    }
}

/// Finish reasons counted in `lamina_requests_finished_total`.
const REASONS: [&str; 4] = ["stop", "length", "cancelled", "error"];

/// Upper bounds in seconds of the queue-time buckets.
const QUEUE_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0,
];

/// The server's own metrics.
#[derive(Debug)]
pub struct Metrics {
    pub ttft: Histogram,
    pub itl: Histogram,
    pub e2e: Histogram,
    /// Time from submission to the first admission (`Finished::queue_time`).
    pub queue: Histogram,
    finished: [AtomicU64; 4],
    /// Uses of fields accepted and ignored on purpose, by field name.
    ignored: Mutex<BTreeMap<&'static str, u64>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            ttft: Histogram::new(TTFT_BUCKETS),
            itl: Histogram::new(ITL_BUCKETS),
            e2e: Histogram::new(E2E_BUCKETS),
            queue: Histogram::new(QUEUE_BUCKETS),
            finished: Default::default(),
            ignored: Mutex::default(),
        }
    }
}

/// What the scrape reads from one replica besides its [`EngineStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplicaView {
    pub stats: EngineStats,
    /// Out of rotation (its engine failed).
    pub failed: bool,
    /// Requests the router placed on it by prefix affinity and by load.
    pub routed_prefix: u64,
    pub routed_load: u64,
    /// Tokens per KV block.
    pub block_size: u64,
    /// Its backend runs in deterministic mode (`--deterministic`).
    pub deterministic: bool,
}

/// One engine-derived series: name, type, help, value from the stats.
type EngineSeries = (
    &'static str,
    &'static str,
    &'static str,
    fn(&EngineStats) -> f64,
);

/// The series every replica reports (with `engine="<i>"`) and the server
/// reports summed (no `engine` label, written last in each family so a
/// scraper that takes the last sample of a family, like the inference
/// gateway's endpoint picker, reads the server's total). The three the
/// Gateway API Inference Extension's model-server protocol asks for are
/// `lamina_num_requests_waiting`, `lamina_num_requests_running` and
/// `lamina_kv_cache_usage_perc`, also written under vLLM's names
/// ([`VLLM_NAMES`]).
const ENGINE_SERIES: &[EngineSeries] = &[
    (
        "lamina_num_requests_running",
        "gauge",
        "Requests being generated.",
        |s| s.running as f64,
    ),
    (
        "lamina_num_requests_waiting",
        "gauge",
        "Requests queued for admission.",
        |s| s.waiting as f64,
    ),
    (
        "lamina_kv_cache_usage_perc",
        "gauge",
        "Fraction of the KV cache blocks referenced by a sequence (0-1).",
        kv_usage,
    ),
    (
        "lamina_kv_blocks_used",
        "gauge",
        "KV cache blocks referenced by a sequence (prefix-cached blocks excluded).",
        |s| s.kv_blocks_used as f64,
    ),
    (
        "lamina_kv_blocks_total",
        "gauge",
        "KV cache blocks in the pool.",
        |s| s.kv_blocks_total as f64,
    ),
    (
        "lamina_queued_prompt_tokens",
        "gauge",
        "Prompt tokens of the requests waiting for their first admission.",
        |s| s.queued_prompt_tokens as f64,
    ),
    (
        "lamina_prompt_tokens_total",
        "counter",
        "Prompt tokens admitted.",
        |s| s.prompt_tokens_total as f64,
    ),
    (
        "lamina_cached_prompt_tokens_total",
        "counter",
        "Prompt tokens served from the prefix cache.",
        |s| s.cached_tokens_total as f64,
    ),
    (
        "lamina_prefix_cache_queries_total",
        "counter",
        "Prompt tokens looked up in the prefix cache.",
        |s| s.prompt_tokens_total as f64,
    ),
    (
        "lamina_prefix_cache_hits_total",
        "counter",
        "Prompt tokens found in the prefix cache.",
        |s| s.cached_tokens_total as f64,
    ),
    (
        "lamina_generation_tokens_total",
        "counter",
        "Tokens generated.",
        |s| s.generation_tokens_total as f64,
    ),
    (
        "lamina_num_preemptions_total",
        "counter",
        "Sequences preempted (KV blocks freed, recomputed later).",
        |s| s.preemptions_total as f64,
    ),
    (
        "lamina_spec_decode_draft_tokens_total",
        "counter",
        "Speculative decoding (the server's --speculative method): tokens drafted and verified.",
        |s| s.spec_drafted_total as f64,
    ),
    (
        "lamina_spec_decode_accepted_tokens_total",
        "counter",
        "Speculative decoding: drafted tokens accepted.",
        |s| s.spec_accepted_total as f64,
    ),
    (
        "lamina_spec_decode_verifies_total",
        "counter",
        "Speculative decoding: sequence steps that verified drafts (accepted / verifies is the mean accepted length).",
        |s| s.spec_verifies_total as f64,
    ),
];

/// The series also written under vLLM's name: lamina's name -> vLLM's.
const VLLM_NAMES: [(&str, &str); 4] = [
    ("lamina_num_requests_running", "vllm:num_requests_running"),
    ("lamina_num_requests_waiting", "vllm:num_requests_waiting"),
    ("lamina_kv_cache_usage_perc", "vllm:kv_cache_usage_perc"),
    ("lamina_cache_config_info", "vllm:cache_config_info"),
];

fn kv_usage(s: &EngineStats) -> f64 {
    if s.kv_blocks_total == 0 {
        0.0
    } else {
        s.kv_blocks_used as f64 / s.kv_blocks_total as f64
    }
}

/// The names a series is written under: its own, then vLLM's if it has one.
fn names(name: &'static str) -> impl Iterator<Item = &'static str> {
    std::iter::once(name).chain(
        VLLM_NAMES
            .iter()
            .filter(move |(ours, _)| *ours == name)
            .map(|(_, theirs)| *theirs),
    )
}

impl Metrics {
    /// Counts one use of a field accepted and ignored on purpose.
    pub fn ignored(&self, field: &'static str) {
        if let Ok(mut m) = self.ignored.lock() {
            *m.entry(field).or_insert(0) += 1;
        }
    }

    /// Counts a finished request under its reason (`stop`, `length`, `cancelled`, `error`).
    pub fn finished(&self, reason: &str) {
        if let Some(i) = REASONS.iter().position(|r| *r == reason) {
            self.finished[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The full exposition text: each replica's gauges and counters
    /// (`engine` label) and their sums, then the server's own series. Every
    /// series carries `model_name`.
    pub fn render(&self, replicas: &[ReplicaView], model: &str) -> String {
        let mut out = String::new();
        let label = format!("model_name=\"{}\"", escape(model));
        let stats: Vec<EngineStats> = replicas.iter().map(|r| r.stats).collect();
        let total = crate::replicas::sum_stats(&stats);
        for &(own, kind, help, value) in ENGINE_SERIES {
            for name in names(own) {
                let _ = writeln!(out, "# HELP {name} {help}");
                let _ = writeln!(out, "# TYPE {name} {kind}");
                for (i, s) in stats.iter().enumerate() {
                    let _ = writeln!(out, "{name}{{{label},engine=\"{i}\"}} {}", value(s));
                }
                let _ = writeln!(out, "{name}{{{label}}} {}", value(&total));
            }
        }
        let block_size = replicas.first().map_or(0, |r| r.block_size);
        for name in names("lamina_cache_config_info") {
            let _ = writeln!(
                out,
                "# HELP {name} KV cache configuration of the server (labels; value 1): tokens per block and blocks of all replicas."
            );
            let _ = writeln!(out, "# TYPE {name} gauge");
            let _ = writeln!(
                out,
                "{name}{{{label},block_size=\"{block_size}\",num_gpu_blocks=\"{}\"}} 1",
                total.kv_blocks_total
            );
        }
        let name = "lamina_ignored_fields_total";
        let _ = writeln!(
            out,
            "# HELP {name} Requests that gave a field accepted and ignored on purpose, by field."
        );
        let _ = writeln!(out, "# TYPE {name} counter");
        if let Ok(m) = self.ignored.lock() {
            for (field, n) in m.iter() {
                let _ = writeln!(out, "{name}{{{label},field=\"{}\"}} {n}", escape(field));
            }
        }
        let name = "lamina_engine_healthy";
        let _ = writeln!(
            out,
            "# HELP {name} 1 while the replica serves, 0 once its engine failed (out of rotation)."
        );
        let _ = writeln!(out, "# TYPE {name} gauge");
        for (i, r) in replicas.iter().enumerate() {
            let v = u8::from(!r.failed);
            let _ = writeln!(out, "{name}{{{label},engine=\"{i}\"}} {v}");
        }
        let name = "lamina_deterministic";
        let _ = writeln!(
            out,
            "# HELP {name} 1 when the replica runs in deterministic mode (--deterministic: a request's output is bitwise the same in any batch), else 0; unlabelled: every replica."
        );
        let _ = writeln!(out, "# TYPE {name} gauge");
        for (i, r) in replicas.iter().enumerate() {
            let v = u8::from(r.deterministic);
            let _ = writeln!(out, "{name}{{{label},engine=\"{i}\"}} {v}");
        }
        let all = !replicas.is_empty() && replicas.iter().all(|r| r.deterministic);
        let _ = writeln!(out, "{name}{{{label}}} {}", u8::from(all));
        let name = "lamina_router_requests_total";
        let _ = writeln!(
            out,
            "# HELP {name} Requests the router placed on each replica, by prefix affinity or by load."
        );
        let _ = writeln!(out, "# TYPE {name} counter");
        for (i, r) in replicas.iter().enumerate() {
            for (route, v) in [("prefix", r.routed_prefix), ("load", r.routed_load)] {
                let _ = writeln!(
                    out,
                    "{name}{{{label},engine=\"{i}\",route=\"{route}\"}} {v}"
                );
            }
        }
        let name = "lamina_requests_finished_total";
        let _ = writeln!(out, "# HELP {name} Requests finished, by finish reason.");
        let _ = writeln!(out, "# TYPE {name} counter");
        for (reason, n) in REASONS.iter().zip(&self.finished) {
            let n = n.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}{{{label},finished_reason=\"{reason}\"}} {n}");
        }
        self.ttft.render(
            &mut out,
            "lamina_time_to_first_token_seconds",
            "Time from request arrival to its first generated token.",
            &label,
        );
        self.itl.render(
            &mut out,
            "lamina_inter_token_latency_seconds",
            "Time between consecutive generated tokens of a request.",
            &label,
        );
        self.e2e.render(
            &mut out,
            "lamina_e2e_request_latency_seconds",
            "Time from request arrival to its last token.",
            &label,
        );
        self.queue.render(
            &mut out,
            "lamina_request_queue_time_seconds",
            "Time a request waited in its replica's queue before its first admission.",
            &label,
        );
        out
    }
}

/// The LoRA adapters as `/metrics` shows them ([`render_lora`]).
#[derive(Debug, Clone, Default)]
pub struct LoraView {
    /// Adapter slots (`--max-loras`).
    pub max_loras: usize,
    /// Adapters loaded.
    pub loaded: usize,
    /// Backend slots holding an adapter (over every replica).
    pub resident: usize,
    /// Adapters of running / waiting requests (over every replica).
    pub running: Vec<String>,
    pub waiting: Vec<String>,
    /// Requests submitted per adapter name since start.
    pub requests: Vec<(String, u64)>,
    /// Seconds since the Unix epoch (the gauge's value, as vLLM's).
    pub now: f64,
}

/// Appends the LoRA series: vLLM's `lora_requests_info` gauge (the
/// Kubernetes inference gateway's, value = the time of the scrape) with
/// `running_lora_adapters`, `waiting_lora_adapters` (comma-separated) and
/// `max_lora`; `lamina_lora_adapters_loaded`; and
/// `lamina_lora_requests_total` per adapter (`lora_name` label).
pub fn render_lora(out: &mut String, model: &str, v: &LoraView) {
    let m = escape(model);
    let join = |names: &[String]| escape(&names.join(","));
    let _ = writeln!(
        out,
        "# HELP vllm:lora_requests_info Running and waiting LoRA adapters (value: unix time of the scrape)."
    );
    for name in ["vllm:lora_requests_info", "lamina_lora_requests_info"] {
        if name != "vllm:lora_requests_info" {
            let _ = writeln!(
                out,
                "# HELP {name} Running and waiting LoRA adapters (value: unix time of the scrape)."
            );
        }
        let _ = writeln!(out, "# TYPE {name} gauge");
        let _ = writeln!(
            out,
            "{name}{{model_name=\"{m}\",running_lora_adapters=\"{}\",waiting_lora_adapters=\"{}\",max_lora=\"{}\"}} {}",
            join(&v.running),
            join(&v.waiting),
            v.max_loras,
            v.now
        );
    }
    let gauge = |out: &mut String, name: &str, help: &str, value: usize| {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} gauge");
        let _ = writeln!(out, "{name}{{model_name=\"{m}\"}} {value}");
    };
    gauge(
        out,
        "lamina_lora_adapters_loaded",
        "LoRA adapters loaded.",
        v.loaded,
    );
    gauge(
        out,
        "lamina_lora_slots_resident",
        "LoRA adapter slots holding an adapter.",
        v.resident,
    );
    let _ = writeln!(
        out,
        "# HELP lamina_lora_requests_total Requests submitted per LoRA adapter."
    );
    let _ = writeln!(out, "# TYPE lamina_lora_requests_total counter");
    for (name, n) in &v.requests {
        let _ = writeln!(
            out,
            "lamina_lora_requests_total{{model_name=\"{m}\",lora_name=\"{}\"}} {n}",
            escape(name)
        );
    }
}

/// Escapes a Prometheus label value.
pub fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lora_series_carry_the_gateway_labels() {
        let mut out = String::new();
        let v = LoraView {
            max_loras: 2,
            loaded: 3,
            resident: 1,
            running: vec!["a".into(), "b".into()],
            waiting: vec![],
            requests: vec![("a".into(), 4), ("q\"x".into(), 1)],
            now: 1700000000.5,
        };
        render_lora(&mut out, "m", &v);
        assert!(out.contains(
            "vllm:lora_requests_info{model_name=\"m\",running_lora_adapters=\"a,b\",waiting_lora_adapters=\"\",max_lora=\"2\"} 1700000000.5\n"
        ), "{out}");
        assert!(out.contains("lamina_lora_adapters_loaded{model_name=\"m\"} 3\n"));
        assert!(out.contains("lamina_lora_slots_resident{model_name=\"m\"} 1\n"));
        assert!(out.contains("lamina_lora_requests_total{model_name=\"m\",lora_name=\"a\"} 4\n"));
        assert!(out.contains("lora_name=\"q\\\"x\"} 1\n"));
    }

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::new(&[0.1, 1.0]);
        h.observe(Duration::from_millis(50));
        h.observe(Duration::from_millis(100)); // on the bound: le="0.1"
        h.observe(Duration::from_millis(500));
        h.observe(Duration::from_secs(3));
        let mut s = String::new();
        h.render(&mut s, "x", "help", "");
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
        let s = m.render(&[ReplicaView::default()], "m\"x");
        let l = "model_name=\"m\\\"x\"";
        assert!(
            s.contains(&format!(
                "lamina_requests_finished_total{{{l},finished_reason=\"stop\"}} 2"
            )),
            "{s}"
        );
        assert!(s.contains(&format!(
            "lamina_requests_finished_total{{{l},finished_reason=\"length\"}} 1"
        )));
        assert!(s.contains(&format!("lamina_num_requests_running{{{l}}} 0")));
        assert!(s.contains(&format!(
            "lamina_time_to_first_token_seconds_count{{{l}}} 0"
        )));
    }

    #[test]
    fn replicas_are_labelled_and_summed_with_the_total_last() {
        let m = Metrics::default();
        let view = |running, used, failed| ReplicaView {
            stats: EngineStats {
                running,
                kv_blocks_used: used,
                kv_blocks_total: 10,
                preemptions_total: running,
                spec_accepted_total: used,
                ..EngineStats::default()
            },
            failed,
            routed_prefix: 3,
            routed_load: 1,
            block_size: 16,
            deterministic: !failed,
        };
        let s = m.render(&[view(2, 5, false), view(3, 0, true)], "m");
        let lines: Vec<&str> = s
            .lines()
            .filter(|l| l.starts_with("lamina_num_requests_running{"))
            .collect();
        assert_eq!(
            lines,
            [
                "lamina_num_requests_running{model_name=\"m\",engine=\"0\"} 2",
                "lamina_num_requests_running{model_name=\"m\",engine=\"1\"} 3",
                "lamina_num_requests_running{model_name=\"m\"} 5",
            ]
        );
        assert!(
            s.contains("lamina_kv_cache_usage_perc{model_name=\"m\",engine=\"0\"} 0.5\n"),
            "{s}"
        );
        assert!(s.contains("lamina_kv_cache_usage_perc{model_name=\"m\"} 0.25\n"));
        assert!(s.contains("lamina_num_preemptions_total{model_name=\"m\"} 5\n"));
        assert!(s.contains(
            "lamina_spec_decode_accepted_tokens_total{model_name=\"m\",engine=\"0\"} 5\n"
        ));
        assert!(s.contains("lamina_engine_healthy{model_name=\"m\",engine=\"1\"} 0\n"));
        assert!(s.contains("lamina_deterministic{model_name=\"m\",engine=\"0\"} 1\n"));
        assert!(s.contains("lamina_deterministic{model_name=\"m\",engine=\"1\"} 0\n"));
        assert!(s.contains("lamina_deterministic{model_name=\"m\"} 0\n"));
        assert!(s.contains(
            "lamina_cache_config_info{model_name=\"m\",block_size=\"16\",num_gpu_blocks=\"20\"} 1\n"
        ));
        // the gateway's series under vLLM's names too, total last
        assert!(s.contains(
            "vllm:cache_config_info{model_name=\"m\",block_size=\"16\",num_gpu_blocks=\"20\"} 1\n"
        ));
        assert!(s.contains("vllm:num_requests_running{model_name=\"m\"} 5\n# HELP"));
        assert!(s.contains("vllm:num_requests_waiting{model_name=\"m\"} 0\n"));
        assert!(s.contains("vllm:kv_cache_usage_perc{model_name=\"m\"} 0.25\n"));
        assert!(s.contains(
            "lamina_router_requests_total{model_name=\"m\",engine=\"1\",route=\"prefix\"} 3\n"
        ));
        // every sample carries the model name
        for l in s.lines().filter(|l| !l.starts_with('#')) {
            assert!(l.contains("model_name=\"m\""), "{l}");
        }
        m.ignored("store");
        m.ignored("store");
        let s = m.render(&[view(2, 5, false)], "m");
        assert!(s.contains("lamina_ignored_fields_total{model_name=\"m\",field=\"store\"} 2\n"));
    }
}
