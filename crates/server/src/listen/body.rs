//! A request body held to a minimum rate and a total read deadline.
//!
//! Contract: [`Metered`] passes the body through; once its first bytes
//! have arrived, the body must keep arriving at `min_rate` bytes per second
//! on average (after a [`RATE_GRACE`] allowance), and the whole request
//! must be read within `deadline` of its headers; otherwise the next poll
//! fails with [`SlowBody`] (a 408, naming the limit), even while no byte
//! arrives (a timer wakes it). While it reads, the connection is marked
//! reading (what the accept loop evicts first when the cap is full of
//! connections that are not idle).
//!
//! Costs: O(1) per chunk (one timer reset).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::time::{Instant, Sleep};

use super::{Conn, Shared};

/// Time after the first body bytes before the rate applies.
pub const RATE_GRACE: Duration = Duration::from_secs(2);

/// A body that arrived too slowly (see the module doc).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct SlowBody(pub String);

/// The request body of one request (module doc).
pub(super) struct Metered {
    inner: Incoming,
    shared: Arc<Shared>,
    conn: Arc<Conn>,
    /// When the headers arrived.
    start: Instant,
    /// When the first body bytes arrived.
    first: Option<Instant>,
    received: u64,
    timer: Pin<Box<Sleep>>,
    done: bool,
}

impl Metered {
    pub(super) fn new(inner: Incoming, shared: Arc<Shared>, conn: Arc<Conn>) -> Metered {
        let start = Instant::now();
        let done = inner.is_end_stream();
        if !done {
            conn.reading_since
                .store(shared.now_ms().max(1), Ordering::Release);
        }
        let deadline = start + shared.limits.read_deadline;
        Metered {
            inner,
            shared,
            conn,
            start,
            first: None,
            received: 0,
            timer: Box::pin(tokio::time::sleep_until(deadline)),
            done,
        }
    }

    /// When the next bytes are due: the total deadline, or earlier the
    /// time the rate says `received` bytes should have arrived by.
    fn due(&self) -> Instant {
        let lim = &self.shared.limits;
        let mut due = self.start + lim.read_deadline;
        if let (Some(first), true) = (self.first, lim.min_body_rate > 0) {
            let rate_due = first
                + RATE_GRACE
                + Duration::from_secs_f64(self.received as f64 / lim.min_body_rate as f64);
            due = due.min(rate_due);
        }
        due
    }

    fn finish(&mut self) {
        if !self.done {
            self.done = true;
            self.conn.reading_since.store(0, Ordering::Release);
        }
    }

    fn too_slow(&self) -> SlowBody {
        let lim = &self.shared.limits;
        SlowBody(format!(
            "The request body arrived too slowly: {} bytes in {:.1} s (this server wants at least \
             {} bytes/s after the first bytes, `--min-body-rate`, and the whole request within \
             {:.0} s, `--request-read-timeout`).",
            self.received,
            self.start.elapsed().as_secs_f64(),
            lim.min_body_rate,
            lim.read_deadline.as_secs_f64()
        ))
    }
}

impl Drop for Metered {
    fn drop(&mut self) {
        self.finish();
    }
}

impl Body for Metered {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.first.get_or_insert_with(Instant::now);
                    this.received += data.len() as u64;
                    let due = this.due();
                    this.timer.as_mut().reset(due);
                }
                if this.inner.is_end_stream() {
                    this.finish();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.finish();
                Poll::Ready(Some(Err(e.into())))
            }
            Poll::Ready(None) => {
                this.finish();
                Poll::Ready(None)
            }
            Poll::Pending => match this.timer.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    this.finish();
                    Poll::Ready(Some(Err(this.too_slow().into())))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
