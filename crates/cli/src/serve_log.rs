//! What `lamina serve` logs at the default level: one line per finished
//! request (the server's `lamina::requests` target: id, prompt and output
//! tokens, time to first token, total time, finish reason; `--log-requests
//! false` turns it off), and while the engines are busy a throughput and
//! queue line every `--log-stats-interval` seconds (`lamina::stats`).

use std::time::{Duration, Instant};

use engine::{Engine, EngineStats};

/// The log target of the throughput lines.
const STATS_LOG: &str = "lamina::stats";

/// The log flags of `serve`.
#[derive(clap::Args, Debug)]
pub struct LogArgs {
    /// Log one line per finished request (id, prompt and output tokens,
    /// time to first token, total time, finish reason) without `-v`.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, env = "LAMINA_LOG_REQUESTS",
          value_parser = clap::builder::BoolishValueParser::new())]
    pub log_requests: bool,
    /// Seconds between throughput / queue lines while requests run (0: none).
    #[arg(long, default_value_t = 10.0, env = "LAMINA_LOG_STATS_INTERVAL")]
    pub log_stats_interval: f64,
}

impl LogArgs {
    /// The log filter directives these flags add to the default level.
    pub fn directives(&self) -> String {
        let mut d = String::new();
        if self.log_requests {
            d.push_str(&format!(",{}=info", server::generate::REQUEST_LOG));
        }
        if self.log_stats_interval > 0.0 {
            d.push_str(&format!(",{STATS_LOG}=info"));
        }
        d
    }

    /// Checks the interval (before the model loads).
    pub fn check(&self) -> anyhow::Result<()> {
        let v = self.log_stats_interval;
        if !(0.0..=86_400.0).contains(&v) {
            anyhow::bail!(
                "invalid `--log-stats-interval`: must be a number of seconds from 0 to 86400 (a day), got {v}"
            );
        }
        Ok(())
    }

    /// Starts the throughput logger over `engines` (a detached thread that
    /// sleeps between lines and logs only when something ran or waits).
    pub fn start_stats(&self, engines: Vec<Engine>) {
        if self.log_stats_interval <= 0.0 {
            return;
        }
        let every = Duration::from_secs_f64(self.log_stats_interval);
        std::thread::Builder::new()
            .name("lamina-stats".into())
            .spawn(move || {
                let mut prev = Totals::of(&engines);
                let mut since = Instant::now();
                loop {
                    std::thread::sleep(every);
                    let now = Totals::of(&engines);
                    if let Some(line) = now.line_since(&prev, since.elapsed()) {
                        tracing::info!(target: STATS_LOG, "{line}");
                    }
                    (prev, since) = (now, Instant::now());
                }
            })
            .map(drop)
            .unwrap_or_else(|e| tracing::warn!("cannot start the stats logger: {e}"));
    }
}

/// The engines' counters summed.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct Totals {
    running: u64,
    waiting: u64,
    kv_used: u64,
    kv_total: u64,
    prompt: u64,
    generated: u64,
}

impl Totals {
    fn of(engines: &[Engine]) -> Totals {
        engines
            .iter()
            .map(Engine::stats)
            .fold(Totals::default(), |t, s| t.add(&s))
    }

    fn add(self, s: &EngineStats) -> Totals {
        Totals {
            running: self.running + s.running,
            waiting: self.waiting + s.waiting,
            kv_used: self.kv_used + s.kv_blocks_used,
            kv_total: self.kv_total + s.kv_blocks_total,
            prompt: self.prompt + s.prompt_tokens_total,
            generated: self.generated + s.generation_tokens_total,
        }
    }

    /// The line for the `dt` since `prev`; `None` when idle throughout.
    fn line_since(&self, prev: &Totals, dt: Duration) -> Option<String> {
        let prompt = self.prompt.saturating_sub(prev.prompt);
        let generated = self.generated.saturating_sub(prev.generated);
        if prompt == 0 && generated == 0 && self.running == 0 && self.waiting == 0 {
            return None;
        }
        let s = dt.as_secs_f64().max(1e-9);
        let kv = if self.kv_total > 0 {
            100.0 * self.kv_used as f64 / self.kv_total as f64
        } else {
            0.0
        };
        Some(format!(
            "prompt {:.1} tok/s, generation {:.1} tok/s | running {}, waiting {} | KV cache {kv:.1}% used",
            prompt as f64 / s,
            generated as f64 / s,
            self.running,
            self.waiting
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_lines_report_rates_and_stay_quiet_when_idle() {
        let a = Totals {
            prompt: 100,
            generated: 50,
            kv_total: 10,
            ..Totals::default()
        };
        let b = Totals {
            running: 2,
            waiting: 1,
            kv_used: 5,
            kv_total: 10,
            prompt: 300,
            generated: 150,
        };
        let line = b.line_since(&a, Duration::from_secs(2)).unwrap();
        assert_eq!(
            line,
            "prompt 100.0 tok/s, generation 50.0 tok/s | running 2, waiting 1 | KV cache 50.0% used"
        );
        assert_eq!(a.line_since(&a, Duration::from_secs(2)), None);
    }
}
