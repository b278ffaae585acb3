//! Progress of the start-up work a user waits for (downloads, GGUF
//! conversion, loading weights, uploading them to a GPU, graph capture):
//! an indicatif bar on stderr when stderr is a terminal, otherwise plain
//! `lamina: <what>: 50% (...)` lines at each quarter (once the work has
//! taken a second) and a `done` line at the end (for downloads of 1 MiB or
//! more and for work that took a second), so logs of a server started by a supervisor still show where
//! start-up is.
//!
//! Contract: every method takes `&self` and may be called from several
//! threads; counts past the total are clamped; [`Progress::finish`] prints
//! the final line (plain) or clears the bar. `LAMINA_PROGRESS=plain` forces
//! the plain lines (tests use it), `off` silences both.
//!
//! Costs: an atomic add per update; a line or a redraw at most a few times a
//! second.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};

/// What is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Bytes,
    /// Items named by the string (`tensors`, `graphs`).
    Items(&'static str),
}

enum Sink {
    Bar(ProgressBar),
    Plain { quarter: AtomicU64 },
    Off,
}

/// One piece of start-up work being watched.
pub struct Progress {
    what: String,
    unit: Unit,
    total: u64,
    done: AtomicU64,
    start: Instant,
    sink: Sink,
    ended: AtomicBool,
}

/// Plain quarter lines start once the work has taken this long.
const PLAIN_AFTER_S: f64 = 1.0;

fn mode() -> &'static str {
    match std::env::var("LAMINA_PROGRESS").as_deref() {
        Ok("plain") => "plain",
        Ok("off") => "off",
        _ if std::io::stderr().is_terminal() => "bar",
        _ => "plain",
    }
}

fn human_bytes(n: u64) -> String {
    indicatif::HumanBytes(n).to_string()
}

impl Progress {
    /// Starts watching `what` (`downloading org/name/model.safetensors`)
    /// of `total` units, `already` of them done (a resumed download).
    pub fn new(what: impl Into<String>, unit: Unit, total: u64, already: u64) -> Self {
        let what = what.into();
        let sink = match mode() {
            "bar" => {
                let bar = ProgressBar::new(total);
                let template = match unit {
                    Unit::Bytes => {
                        "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} ({eta})".to_string()
                    }
                    Unit::Items(name) => {
                        format!("{{msg}} [{{bar:30}}] {{pos}}/{{len}} {name} ({{elapsed}})")
                    }
                };
                if let Ok(style) = ProgressStyle::with_template(&template) {
                    bar.set_style(style.progress_chars("=> "));
                }
                bar.set_message(what.clone());
                bar.set_position(already.min(total));
                Sink::Bar(bar)
            }
            "off" => Sink::Off,
            _ => Sink::Plain {
                quarter: AtomicU64::new(already.saturating_mul(4) / total.max(1)),
            },
        };
        Progress {
            what,
            unit,
            total,
            done: AtomicU64::new(already.min(total)),
            start: Instant::now(),
            sink,
            ended: AtomicBool::new(false),
        }
    }

    fn amount(&self, n: u64) -> String {
        match self.unit {
            Unit::Bytes => human_bytes(n),
            Unit::Items(name) => format!("{n} {name}"),
        }
    }

    /// Whether the plain final line is worth printing: for downloads of
    /// 1 MiB or more (not configs and tokenizers) and for anything that
    /// took a second.
    fn worth_a_line(&self) -> bool {
        (self.unit == Unit::Bytes && self.total >= 1 << 20)
            || self.start.elapsed().as_secs_f64() >= PLAIN_AFTER_S
    }

    /// Adds `n` done units.
    pub fn inc(&self, n: u64) {
        let done = self
            .done
            .fetch_add(n, Ordering::Relaxed)
            .saturating_add(n)
            .min(self.total);
        match &self.sink {
            Sink::Bar(bar) => bar.set_position(done),
            Sink::Plain { quarter } => {
                let q = done.saturating_mul(4) / self.total.max(1);
                // quarters 1..3 print here, the last one in finish()
                let slow = self.start.elapsed().as_secs_f64() >= PLAIN_AFTER_S;
                if q < 4 && quarter.fetch_max(q, Ordering::Relaxed) < q && slow {
                    eprintln!(
                        "lamina: {}: {}% ({} of {}, {:.1}s)",
                        self.what,
                        q * 25,
                        self.amount(done),
                        self.amount(self.total),
                        self.start.elapsed().as_secs_f64()
                    );
                }
            }
            Sink::Off => {}
        }
    }

    /// Sets the done count back to `n` (a download restarted from byte `n`).
    pub fn set(&self, n: u64) {
        self.done.store(n.min(self.total), Ordering::Relaxed);
        if let Sink::Bar(bar) = &self.sink {
            bar.set_position(n.min(self.total));
        }
    }

    /// Ends the watch: the bar is cleared, a plain line says how long it took.
    pub fn finish(self) {
        self.end(true);
    }

    fn end(&self, done: bool) {
        if self.ended.swap(true, Ordering::Relaxed) {
            return;
        }
        match &self.sink {
            Sink::Bar(bar) => bar.finish_and_clear(),
            Sink::Plain { .. } if done && self.worth_a_line() => eprintln!(
                "lamina: {}: done ({} in {:.1}s)",
                self.what,
                self.amount(self.done.load(Ordering::Relaxed)),
                self.start.elapsed().as_secs_f64()
            ),
            Sink::Plain { .. } | Sink::Off => {}
        }
    }
}

/// A watch dropped unfinished (an error) clears its bar and prints nothing.
impl Drop for Progress {
    fn drop(&mut self) {
        self.end(false);
    }
}
