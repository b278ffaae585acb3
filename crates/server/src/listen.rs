//! The accept loop: connection limits and timeouts, then graceful shutdown.
//!
//! Contract: [`run`] accepts connections on the listener until `shutdown`
//! resolves and serves each with hyper (HTTP/1.1), with
//! - at most `max_connections` open at once: a connection accepted beyond
//!   that is closed at once, before any byte is read (the listener never
//!   runs the process out of file descriptors);
//! - `header_timeout` to receive a request's headers, also between the
//!   requests of a keep-alive connection (so idle and slow-header
//!   connections are closed);
//! - `body_timeout` between two chunks of a request body (a client that
//!   stalls mid-body gets 408, never holds the handler).
//!
//! After `shutdown` it stops accepting, asks every connection to close once
//! its in-flight request is done, and returns when all are closed.
//!
//! Costs: one tokio task per connection; the limits are O(1) per connection.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower_http::timeout::RequestBodyTimeoutLayer;

/// Limits of [`run`].
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub body_timeout: Duration,
}

/// Serves `app` on `listener` under `limits` until `shutdown`, then returns
/// a graceful-shutdown handle whose `shutdown()` resolves once every
/// connection has closed.
pub async fn run(
    app: Router,
    listener: TcpListener,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) -> GracefulShutdown {
    let app = tower::ServiceBuilder::new()
        .layer(RequestBodyTimeoutLayer::new(limits.body_timeout))
        .service(app);
    // HTTP/1.1 only: the auto-detecting builder waits for the first bytes
    // (the HTTP/2 preface) without any timeout, which a silent client holds
    // forever.
    let mut builder = Builder::new(TokioExecutor::new()).http1_only();
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let graceful = GracefulShutdown::new();
    let open = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            _ = &mut shutdown => break,
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // EMFILE and the like: back off instead of spinning
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = open.clone().try_acquire_owned() else {
            tracing::debug!(%peer, max = limits.max_connections, "connection limit reached: closing");
            drop(tcp);
            continue;
        };
        // Streamed tokens are small writes: without TCP_NODELAY, Nagle's
        // algorithm holds each one until the client's delayed ACK (~40 ms).
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "could not set TCP_NODELAY");
        }
        let conn = builder
            .serve_connection(TokioIo::new(tcp), TowerToHyperService::new(app.clone()))
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _permit = permit;
            if let Err(e) = conn.await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    graceful
}
