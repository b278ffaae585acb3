//! A spinner on stderr while a prompt is being processed, with the prompt
//! tokens done so far: a long prompt on the CPU takes tens of seconds before
//! the first token, and silence there reads as a hang.
//!
//! Only on a terminal, only for one request at a time (`generate`, `chat`),
//! and only once the prompt has taken longer than [`SHOW_AFTER`]. Tokens done
//! are counted from the engine's steps: with one request running, each step
//! computes `min(left, max_batch_tokens)` prompt tokens (chunked prefill),
//! after the prefix-cache hit.

use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use engine::Engine;
use indicatif::{ProgressBar, ProgressStyle};

/// Prompts done sooner than this show nothing.
const SHOW_AFTER: Duration = Duration::from_millis(300);
const TICK: Duration = Duration::from_millis(100);

/// The running spinner; [`PrefillSpinner::finish`] (or drop) clears it.
pub struct PrefillSpinner {
    stop: Arc<AtomicBool>,
    join: Option<JoinHandle<()>>,
}

impl PrefillSpinner {
    /// Starts watching a request of `prompt_len` tokens just submitted to
    /// `engine` (steps of at most `chunk` tokens); `None` off a terminal.
    pub fn start(engine: &Engine, prompt_len: usize, chunk: usize) -> Option<Self> {
        if !std::io::stderr().is_terminal() {
            return None;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let engine = engine.clone();
        let before = engine.stats();
        let join = std::thread::Builder::new()
            .name("lamina-progress".into())
            .spawn(move || {
                let t0 = Instant::now();
                let mut bar: Option<ProgressBar> = None;
                while !flag.load(Ordering::Acquire) {
                    std::thread::sleep(TICK);
                    if t0.elapsed() < SHOW_AFTER || flag.load(Ordering::Acquire) {
                        continue;
                    }
                    let now = engine.stats();
                    let cached = (now.cached_tokens_total - before.cached_tokens_total) as usize;
                    let steps = (now.steps_total - before.steps_total) as usize;
                    let done = cached
                        .saturating_add(steps.saturating_mul(chunk))
                        .min(prompt_len);
                    let b = bar.get_or_insert_with(spinner);
                    b.set_message(format!("processing the prompt: {done}/{prompt_len} tokens"));
                }
                if let Some(b) = bar {
                    b.finish_and_clear();
                }
            })
            .ok()?;
        Some(PrefillSpinner {
            stop,
            join: Some(join),
        })
    }

    /// Clears the spinner (at the first token or the end).
    pub fn finish(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(j) = self.join.take() {
            let _ = j.join();
        }
    }
}

impl Drop for PrefillSpinner {
    fn drop(&mut self) {
        self.stop_now();
    }
}

fn spinner() -> ProgressBar {
    let bar = ProgressBar::new_spinner();
    if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
        bar.set_style(style);
    }
    bar.enable_steady_tick(TICK);
    bar
}
