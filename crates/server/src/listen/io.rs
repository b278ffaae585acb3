//! A connection's socket shared between hyper and a watcher that notices
//! a reset while hyper is not reading (a request in flight).
//!
//! Contract: [`SharedTcp`] is the I/O hyper serves the connection on;
//! [`reset`] resolves when the peer resets the connection (or the socket
//! fails), whether or not hyper is reading: with half-close served, hyper
//! reads nothing while a response is pending, so without the watcher a
//! reset during a non-streamed request went unnoticed until the response
//! was written. An end of stream (the client shut its write side) is not a
//! reset: the response is still owed. Bytes the client sent ahead (a
//! pipelined request) are left for hyper.
//!
//! Costs: the watcher waits on the socket's readiness (no polling) except
//! while unread bytes sit in the socket, when it looks again every
//! [`PEEK_BACKOFF`].

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// How often the watcher looks again while unread bytes wait for hyper.
const PEEK_BACKOFF: Duration = Duration::from_millis(50);

/// A TCP stream hyper reads and writes while [`reset`] watches it.
pub(super) struct SharedTcp(pub(super) Arc<TcpStream>);

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

/// Resolves when the peer resets `tcp` (see the module doc); never after
/// an end of stream.
pub(super) async fn reset(tcp: &TcpStream) {
    let mut b = [0u8; 1];
    loop {
        match tcp.peek(&mut b).await {
            Ok(0) => std::future::pending::<()>().await,
            Ok(_) => tokio::time::sleep(PEEK_BACKOFF).await,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}
