//! Per-request timings, as llama-cli and `ollama run --verbose` print them:
//! prompt tokens and prompt tok/s, generated tokens and tok/s, time to first
//! token. Measured around the request's event stream (submission to first
//! token, first to last token), so they include queueing and detokenizing.

use std::time::{Duration, Instant};

use serde::Serialize;

/// The instants of one request, filled while its events arrive.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    submitted: Instant,
    first: Option<Instant>,
    last: Option<Instant>,
}

impl Clock {
    pub fn start() -> Self {
        Clock {
            submitted: Instant::now(),
            first: None,
            last: None,
        }
    }

    /// A token arrived.
    pub fn token(&mut self) {
        let now = Instant::now();
        self.first.get_or_insert(now);
        self.last = Some(now);
    }

    /// The timings once the request ended with these counts (`cached`: prompt
    /// tokens whose KV came from the prefix cache).
    pub fn finish(&self, prompt: usize, cached: usize, generated: usize) -> Timings {
        let end = Instant::now();
        let first = self.first.unwrap_or(end);
        let ttft = first - self.submitted;
        let decode = self.last.unwrap_or(end) - first;
        let computed = prompt.saturating_sub(cached);
        Timings {
            prompt_tokens: prompt,
            cached_tokens: cached,
            prompt_tok_s: rate(computed, ttft),
            generated_tokens: generated,
            // the first token comes with the prompt; the rest are decode steps
            gen_tok_s: rate(generated.saturating_sub(1), decode),
            ttft_ms: ttft.as_secs_f64() * 1e3,
            total_ms: (end - self.submitted).as_secs_f64() * 1e3,
        }
    }
}

fn rate(n: usize, d: Duration) -> Option<f64> {
    let s = d.as_secs_f64();
    (n > 0 && s > 0.0).then(|| n as f64 / s)
}

/// What one request cost.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Timings {
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    /// Prompt tokens computed (not cached) per second until the first token.
    pub prompt_tok_s: Option<f64>,
    pub generated_tokens: usize,
    /// Tokens per second after the first.
    pub gen_tok_s: Option<f64>,
    pub ttft_ms: f64,
    pub total_ms: f64,
}

impl std::fmt::Display for Timings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let r = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.1}"));
        write!(f, "prompt {} tokens", self.prompt_tokens)?;
        if self.cached_tokens > 0 {
            write!(f, " ({} cached)", self.cached_tokens)?;
        }
        write!(
            f,
            ", {} tok/s | generated {} tokens, {} tok/s | first token {:.0} ms | total {:.2} s",
            r(self.prompt_tok_s),
            self.generated_tokens,
            r(self.gen_tok_s),
            self.ttft_ms,
            self.total_ms / 1e3
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_count_computed_prompt_tokens_and_tokens_after_the_first() {
        let t0 = Instant::now();
        let clock = Clock {
            submitted: t0,
            first: Some(t0 + Duration::from_millis(500)),
            last: Some(t0 + Duration::from_millis(1500)),
        };
        let t = clock.finish(110, 10, 11);
        assert!((t.prompt_tok_s.unwrap() - 200.0).abs() < 1e-6, "{t:?}");
        assert!((t.gen_tok_s.unwrap() - 10.0).abs() < 1e-6, "{t:?}");
        assert!((t.ttft_ms - 500.0).abs() < 1e-6);
        let line = t.to_string();
        assert!(line.starts_with("prompt 110 tokens (10 cached), 200.0 tok/s | generated 11 tokens, 10.0 tok/s | first token 500 ms"), "{line}");
        // one token: no decode rate to speak of
        let one = Clock::start().finish(3, 0, 1);
        assert_eq!(one.gen_tok_s, None);
        assert!(one.to_string().contains("generated 1 tokens, - tok/s"));
    }
}
