//! A connection's socket shared between hyper and a watcher that notices
//! a client gone while hyper is not reading (a request in flight).
//!
//! Contract: [`SharedTcp`] is the I/O hyper serves the connection on;
//! [`gone`] resolves when the client has gone away, whether or not hyper is
//! reading: with half-close served, hyper reads nothing while a response is
//! pending, so without the watcher a client leaving during a non-streamed
//! request went unnoticed until the response was written.
//! - A reset (or a failed socket) is noticed at once.
//! - An end of stream is ambiguous: the client either shut its write side
//!   and still wants the response, or closed the socket. TCP tells the two
//!   apart only when data reaches the peer, so while an HTTP/1.1 response
//!   is owed the watcher writes one interim response, [`PROBE`]
//!   (`103 Early Hints` with no hints: HTTP/1.1 clients must accept and
//!   skip 1xx responses before the final one). A closed socket answers it
//!   with a reset, which the watcher then sees; a half-closed client reads
//!   it and gets its response after it. The probe goes out at most once per
//!   connection, and only between two of hyper's writes: the check and the
//!   write happen in one poll of the connection's task, which is also the
//!   task that runs the request's handler, so no response byte can be
//!   under way.
//! - Bytes the client sent ahead (a pipelined request) are left for hyper.
//!
//! Costs: the watcher waits on the socket's readiness (no polling) except
//! while unread bytes sit in the socket or after an end of stream, when it
//! looks again every [`PEEK_BACKOFF`].

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// How often the watcher looks again while unread bytes wait for hyper,
/// and after an end of stream.
const PEEK_BACKOFF: Duration = Duration::from_millis(50);

/// The interim response that tells a closed socket from a half-closed one.
pub(super) const PROBE: &[u8] = b"HTTP/1.1 103 Early Hints\r\n\r\n";

/// A TCP stream hyper reads and writes while [`gone`] watches it; `.1`
/// is called after every read that brought bytes (the connection table
/// notes when a request's head began).
pub(super) struct SharedTcp(
    pub(super) Arc<TcpStream>,
    pub(super) Box<dyn Fn() + Send + Sync>,
);

impl AsyncRead for SharedTcp {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            ready!(self.0.poll_read_ready(cx))?;
            match self.0.try_read(buf.initialize_unfilled()) {
                Ok(n) => {
                    buf.advance(n);
                    if n > 0 {
                        (self.1)();
                    }
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl AsyncWrite for SharedTcp {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.0.poll_write_ready(cx))?;
            match self.0.try_write(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                r => return Poll::Ready(r),
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let sock = socket2::SockRef::from(&*self.0);
        Poll::Ready(match sock.shutdown(std::net::Shutdown::Write) {
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(()),
            r => r,
        })
    }
}

/// Resolves when the client is gone (see the module doc). `owed` counts
/// the connection's HTTP/1.1 requests whose response has not started.
pub(super) async fn gone(tcp: &TcpStream, owed: &AtomicUsize) {
    let mut b = [0u8; 1];
    loop {
        match tcp.peek(&mut b).await {
            Ok(0) => break,
            Ok(_) => tokio::time::sleep(PEEK_BACKOFF).await,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
    // end of stream: a half-closed client, or a closed socket
    let sock = socket2::SockRef::from(tcp);
    let mut probed = false;
    loop {
        if !matches!(sock.take_error(), Ok(None)) {
            return;
        }
        if !probed && owed.load(Ordering::Acquire) > 0 {
            probed = true;
            match tcp.try_write(PROBE) {
                Ok(n) if n == PROBE.len() => {}
                // a part written, or a full send buffer: the response
                // could not follow intact; treat the client as gone
                _ => return,
            }
        }
        tokio::time::sleep(PEEK_BACKOFF).await;
    }
}
