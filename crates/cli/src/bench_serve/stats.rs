//! The figures of one `bench-serve` run: throughput and latency percentiles.
//!
//! Definitions (as `vllm bench serve`): TTFT = first text chunk - send;
//! TPOT = (last chunk - first chunk) / (output tokens - 1), per request with
//! more than one token; ITL = every gap between consecutive text chunks of a
//! request; E2E = finish - send. Percentiles are nearest-rank over the
//! successful requests. Throughputs divide by the run's wall time, from the
//! first send to the last finish, and count the successful requests' tokens
//! only (a refused request's prompt was never processed).

use std::io::Write;
use std::time::Duration;

use serde_json::{Value, json};

use super::Rate;
use super::client::Outcome;

/// Mean and percentiles of one latency, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Summary {
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
}

impl Summary {
    /// Of `ms` (any order); all zero when empty.
    pub fn of(mut ms: Vec<f64>) -> Summary {
        if ms.is_empty() {
            return Summary::default();
        }
        ms.sort_by(f64::total_cmp);
        let rank = |p: f64| {
            let i = ((p / 100.0) * ms.len() as f64).ceil() as usize;
            ms[i.clamp(1, ms.len()) - 1]
        };
        Summary {
            mean: ms.iter().sum::<f64>() / ms.len() as f64,
            p50: rank(50.0),
            p90: rank(90.0),
            p99: rank(99.0),
        }
    }

    fn to_json(self) -> Value {
        json!({"mean": self.mean, "p50": self.p50, "p90": self.p90, "p99": self.p99})
    }
}

/// The report of one run at one arrival rate.
#[derive(Debug, Clone)]
pub struct RunReport {
    pub rate: Rate,
    pub completed: usize,
    pub failed: usize,
    pub first_error: Option<String>,
    pub duration_s: f64,
    /// The successful requests' prompt tokens.
    pub prompt_tokens: usize,
    pub output_tokens: usize,
    pub output_tokens_requested: usize,
    pub request_throughput: f64,
    pub output_throughput: f64,
    pub total_throughput: f64,
    pub ttft: Summary,
    pub tpot: Summary,
    pub itl: Summary,
    pub e2e: Summary,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

impl RunReport {
    pub fn new(
        rate: Rate,
        outcomes: &[Outcome],
        duration: Duration,
        output_tokens_requested: usize,
    ) -> RunReport {
        let ok: Vec<&Outcome> = outcomes.iter().filter(|o| o.error.is_none()).collect();
        let (mut ttft, mut tpot, mut itl, mut e2e) = (vec![], vec![], vec![], vec![]);
        for o in &ok {
            let (Some(sent), Some(done)) = (o.sent, o.finished) else {
                continue;
            };
            e2e.push(ms(done - sent));
            if let (Some(first), Some(last)) = (o.chunks.first(), o.chunks.last()) {
                ttft.push(ms(*first - sent));
                if o.output_tokens > 1 {
                    tpot.push(ms(*last - *first) / (o.output_tokens - 1) as f64);
                }
            }
            itl.extend(o.chunks.windows(2).map(|w| ms(w[1] - w[0])));
        }
        let secs = duration.as_secs_f64().max(1e-9);
        let prompt_tokens: usize = ok.iter().map(|o| o.prompt_tokens).sum();
        let output_tokens: usize = ok.iter().map(|o| o.output_tokens).sum();
        RunReport {
            rate,
            completed: ok.len(),
            failed: outcomes.len() - ok.len(),
            first_error: outcomes.iter().find_map(|o| o.error.clone()),
            duration_s: duration.as_secs_f64(),
            prompt_tokens,
            output_tokens,
            output_tokens_requested,
            request_throughput: ok.len() as f64 / secs,
            output_throughput: output_tokens as f64 / secs,
            total_throughput: (output_tokens + prompt_tokens) as f64 / secs,
            ttft: Summary::of(ttft),
            tpot: Summary::of(tpot),
            itl: Summary::of(itl),
            e2e: Summary::of(e2e),
        }
    }

    /// A table like `vllm bench serve`'s.
    pub fn print(&self, w: &mut impl Write) -> std::io::Result<()> {
        writeln!(
            w,
            "============ serving benchmark, rate {} req/s ============",
            self.rate
        )?;
        writeln!(w, "{:<34}{}", "successful requests:", self.completed)?;
        writeln!(w, "{:<34}{}", "failed requests:", self.failed)?;
        writeln!(w, "{:<34}{:.2}", "duration (s):", self.duration_s)?;
        writeln!(w, "{:<34}{}", "prompt tokens:", self.prompt_tokens)?;
        writeln!(w, "{:<34}{}", "output tokens:", self.output_tokens)?;
        writeln!(
            w,
            "{:<34}{:.2}",
            "request throughput (req/s):", self.request_throughput
        )?;
        writeln!(
            w,
            "{:<34}{:.1}",
            "output throughput (tok/s):", self.output_throughput
        )?;
        writeln!(
            w,
            "{:<34}{:.1}",
            "total throughput (tok/s):", self.total_throughput
        )?;
        for (name, s) in [
            ("TTFT", self.ttft),
            ("TPOT", self.tpot),
            ("ITL", self.itl),
            ("E2E latency", self.e2e),
        ] {
            writeln!(
                w,
                "{:<34}mean {:.2}  p50 {:.2}  p90 {:.2}  p99 {:.2}",
                format!("{name} (ms):"),
                s.mean,
                s.p50,
                s.p90,
                s.p99
            )?;
        }
        Ok(())
    }

    pub fn to_json(&self) -> Value {
        json!({
            "request_rate": if self.rate.0.is_finite() { json!(self.rate.0) } else { json!("inf") },
            "completed": self.completed,
            "failed": self.failed,
            "first_error": self.first_error,
            "duration_s": self.duration_s,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "output_tokens_requested": self.output_tokens_requested,
            "request_throughput": self.request_throughput,
            "output_throughput": self.output_throughput,
            "total_throughput": self.total_throughput,
            "ttft_ms": self.ttft.to_json(),
            "tpot_ms": self.tpot.to_json(),
            "itl_ms": self.itl.to_json(),
            "e2e_ms": self.e2e.to_json(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn percentiles_are_nearest_rank() {
        let s = Summary::of((1..=100).rev().map(f64::from).collect());
        assert_eq!((s.p50, s.p90, s.p99), (50.0, 90.0, 99.0));
        assert!((s.mean - 50.5).abs() < 1e-9);
        assert_eq!(Summary::of(vec![7.0]).p99, 7.0);
        assert_eq!(Summary::of(vec![]), Summary::default());
    }

    #[test]
    fn latencies_follow_the_chunk_times() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let ok = Outcome {
            sent: Some(t0),
            chunks: vec![at(100), at(110), at(130)],
            finished: Some(at(140)),
            prompt_tokens: 10,
            output_tokens: 3,
            error: None,
        };
        let bad = Outcome {
            prompt_tokens: 7,
            ..Outcome::failed("HTTP 500".into())
        };
        let r = RunReport::new(Rate(1.0), &[ok, bad], Duration::from_secs(2), 6);
        assert_eq!((r.completed, r.failed), (1, 1));
        // the refused request's 7 prompt tokens count nowhere
        assert_eq!(r.prompt_tokens, 10);
        assert!((r.total_throughput - 6.5).abs() < 1e-9);
        assert_eq!(r.first_error.as_deref(), Some("HTTP 500"));
        assert!((r.ttft.p50 - 100.0).abs() < 1e-6);
        assert!((r.tpot.mean - 15.0).abs() < 1e-6);
        assert!((r.itl.p99 - 20.0).abs() < 1e-6 && (r.itl.p50 - 10.0).abs() < 1e-6);
        assert!((r.e2e.mean - 140.0).abs() < 1e-6);
        assert!((r.output_throughput - 1.5).abs() < 1e-9);
    }
}
