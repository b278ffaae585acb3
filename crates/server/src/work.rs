//! The bounded pool that runs a request's CPU work off the async workers.
//!
//! Contract: [`WorkPool::run`] hands a closure to one of a fixed number of
//! threads with a known, large stack ([`STACK_BYTES`]), so checking and
//! compiling a request's schema, grammar or tools, rendering its template
//! and tokenizing its prompt never run on (or overflow the stack of) a
//! thread that serves `/health` or another client's stream. At most
//! `queue` jobs wait for a thread; one more is refused at once with 429.
//! Once a job starts it has `budget` to finish: past it the caller gets a
//! 400 naming the request's parameter, and what the job later returns is
//! dropped (an engine handle in it cancels its request). A job that panics
//! is a 500.
//!
//! Costs: two channel hops per job; the threads idle on a channel.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::StatusCode;
use tokio::sync::oneshot;

use crate::error::{ApiError, RETRY_AFTER_SECS};

/// Stack of each pool thread: room for the grammar engine's and the
/// template's recursion over inputs within [`crate::limits::InputLimits`]
/// (reserved address space; only the pages used are committed).
pub const STACK_BYTES: usize = 256 << 20;

/// Default jobs waiting for a thread before 429 (`--work-queue`).
pub const DEFAULT_QUEUE: usize = 256;
/// Default time one job may run (`--work-budget-secs`).
pub const DEFAULT_BUDGET: Duration = Duration::from_secs(10);

type Task = Box<dyn FnOnce() + Send + 'static>;

/// The pool (see the module doc).
pub struct WorkPool {
    tx: SyncSender<Task>,
    budget: Duration,
    queue: usize,
    waiting: Arc<AtomicUsize>,
}

impl WorkPool {
    /// `threads` threads, `queue` waiting jobs at most, `budget` per job.
    pub fn new(threads: usize, queue: usize, budget: Duration) -> WorkPool {
        let (tx, rx) = sync_channel::<Task>(queue.max(1));
        let rx = Arc::new(Mutex::new(rx));
        let waiting = Arc::new(AtomicUsize::new(0));
        for i in 0..threads.max(1) {
            let rx = rx.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("lamina-work-{i}"))
                .stack_size(STACK_BYTES)
                .spawn(move || worker(&rx));
            if let Err(e) = spawned {
                tracing::error!(error = %e, "cannot start a work-pool thread");
            }
        }
        WorkPool {
            tx,
            budget,
            queue,
            waiting,
        }
    }

    /// Runs `f` on the pool (module doc); errors name `param`.
    pub async fn run<R: Send + 'static>(
        &self,
        param: &'static str,
        f: impl FnOnce() -> R + Send + 'static,
    ) -> Result<R, ApiError> {
        let (started_tx, started) = oneshot::channel::<()>();
        let (done_tx, done) = oneshot::channel::<std::thread::Result<R>>();
        let waiting = self.waiting.clone();
        let task: Task = Box::new(move || {
            waiting.fetch_sub(1, Ordering::AcqRel);
            if started_tx.send(()).is_err() {
                return; // the caller is gone: nothing to do
            }
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
            let _ = done_tx.send(r);
        });
        self.waiting.fetch_add(1, Ordering::AcqRel);
        match self.tx.try_send(task) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                self.waiting.fetch_sub(1, Ordering::AcqRel);
                return Err(self.busy());
            }
            Err(TrySendError::Disconnected(_)) => {
                self.waiting.fetch_sub(1, Ordering::AcqRel);
                return Err(ApiError::internal("The work pool has stopped."));
            }
        }
        if started.await.is_err() {
            return Err(ApiError::internal("The work pool has stopped."));
        }
        match tokio::time::timeout(self.budget, done).await {
            Ok(Ok(Ok(r))) => Ok(r),
            Ok(Ok(Err(_))) => Err(ApiError::internal(format!(
                "Preparing the request failed unexpectedly (`{param}`)."
            ))),
            Ok(Err(_)) => Err(ApiError::internal("The work pool has stopped.")),
            Err(_) => Err(ApiError::invalid_param(
                param,
                format!(
                    "Preparing this request took longer than this server's budget of {:.1} s \
                     (`--work-budget-secs`): its schema, grammar, tools or prompt are too costly.",
                    self.budget.as_secs_f64()
                ),
            )),
        }
    }

    /// Jobs waiting for a thread now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }

    fn busy(&self) -> ApiError {
        ApiError {
            code: Some("server_busy"),
            ..ApiError::from_status(
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "The server is busy: {} requests are already waiting to be prepared \
                     (`--work-queue`); retry in {RETRY_AFTER_SECS} s.",
                    self.queue
                ),
            )
        }
    }
}

fn worker(rx: &Mutex<Receiver<Task>>) {
    loop {
        let task = {
            let rx = rx.lock().unwrap_or_else(|p| p.into_inner());
            rx.recv()
        };
        match task {
            Ok(t) => t(),
            Err(_) => return, // the pool is gone
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn jobs_run_past_the_queue_get_429_and_the_budget_holds() {
        let pool = WorkPool::new(1, 1, Duration::from_millis(300));
        assert_eq!(pool.run("p", || 2 + 2).await.unwrap(), 4);
        // deep recursion that would overflow a 2 MiB stack runs fine here
        fn depth(n: u64) -> u64 {
            let pad = std::hint::black_box([0u8; 512]);
            if n == 0 {
                pad[0] as u64
            } else {
                1 + depth(n - 1)
            }
        }
        assert_eq!(pool.run("p", || depth(100_000)).await.unwrap(), 100_000);
        let slow = pool.run("p", || std::thread::sleep(Duration::from_millis(600)));
        let queued = pool.run("p", || ());
        let third = pool.run("p", || ());
        let (a, b, c) = tokio::join!(slow, queued, third);
        assert_eq!(a.unwrap_err().param.as_deref(), Some("p"), "over budget");
        let statuses =
            [b.map(|_| 200), c.map(|_| 200)].map(|r| r.unwrap_or_else(|e| e.status.as_u16()));
        assert!(statuses.contains(&429), "{statuses:?}");
        // a panic is a 500 (on a pool with time to spare: printing the
        // panic's backtrace can take longer than the budget above)
        let roomy = WorkPool::new(1, 1, Duration::from_secs(60));
        let e = roomy.run("p", || panic!("boom")).await.unwrap_err();
        assert_eq!(e.status.as_u16(), 500);
    }
}
