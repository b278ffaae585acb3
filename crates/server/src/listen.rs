//! The accept loop: connection limits and timeouts, per-client request caps,
//! and a drain that keeps answering.
//!
//! Contract: [`Listener::spawn`] accepts connections until [`Listener::stop`]
//! and serves each with hyper (HTTP/1.1), with
//! - at most `max_connections` open at once, and at most
//!   `max_client_connections` from one client address. When all are taken
//!   (all of that address's, for the second), the connection idle the
//!   longest (no request in flight, no byte of a new one) is asked to
//!   close to make room, else the one that has spent the longest reading a
//!   request's head or body is closed, so neither idle sockets, slow
//!   headers nor slow bodies can lock new clients out; with
//!   neither, the new connection is closed before any byte is read (the
//!   process never runs out of file descriptors). Requests whose response
//!   is under way (a stream) are never evicted;
//! - `header_timeout` to receive a request's headers, also between the
//!   requests of a keep-alive connection (idle and slow-header connections
//!   are closed);
//! - `body_timeout` between two chunks of a request body, and once a body
//!   has started, at least `min_body_rate` bytes per second and the whole
//!   request within `read_deadline` (408, `listen/body.rs`);
//! - at most `max_client_requests` requests in flight per client address
//!   (a streamed response counts until its last byte); more get 429;
//! - half-closed connections served (a client that shuts its write side
//!   after sending still gets the response), while a client that goes away
//!   (reset, or a normal close) is noticed within ~100 ms, also while a
//!   non-streamed response is pending (`listen/io.rs`: an end of stream is
//!   told apart from a closed socket by a `103` interim response): the
//!   connection is dropped with its request, which the engine cancels,
//!   freeing its KV.
//!
//! [`Listener::begin_drain`] (shutdown) asks every open connection to close
//! once its in-flight request is done; the listener stays open, so `/health`
//! answers 503 while the server drains, and connections accepted meanwhile
//! serve one request (keep-alive off). [`Listener::drained`] resolves when
//! every connection accepted before the drain has closed.
//!
//! One file past the usual size: the accept loop, the connection table and
//! the eviction policy are one state machine; the body meter and the
//! socket watcher are in `listen/`.
//!
//! Costs: one tokio task per connection; O(1) per request (two short mutex
//! sections); O(open connections) only when the cap is full.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::response::{IntoResponse, Response};
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tower::ServiceExt;
use tower_http::timeout::RequestBodyTimeoutLayer;

use crate::error::ApiError;

/// Limits of the accept loop.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    /// Requests in flight per client address (0: no cap).
    pub max_client_requests: usize,
    /// Open connections per client address (0: no cap).
    pub max_client_connections: usize,
    /// Bytes per second a request body must keep up once started (0: none).
    pub min_body_rate: u64,
    /// Time from a request's headers to the end of its body.
    pub read_deadline: Duration,
}

/// How long a new connection waits for an evicted one to close before
/// evicting another (at most [`EVICT_TRIES`] in all): an idle connection
/// asked to close may have started a request meanwhile.
const EVICT_WAIT: Duration = Duration::from_millis(50);
const EVICT_TRIES: usize = 4;
/// New connections waiting for room at once; more are closed at once.
const MAX_MAKING_ROOM: usize = 64;

/// One open connection, as the accept loop sees it.
struct Conn {
    close: Notify,
    /// Closes the connection at once, dropping its request.
    kill: Notify,
    ip: IpAddr,
    /// Milliseconds since the listener started (at least 1) when the
    /// request body now being read began; 0 when none is.
    reading_since: AtomicU64,
    /// Milliseconds since the listener started (at least 1) when the first
    /// byte of a request head not yet complete arrived; 0 when none did.
    head_since: AtomicU64,
    /// Milliseconds since the listener started, at the last request's start.
    last_active: AtomicU64,
    in_flight: AtomicUsize,
    /// HTTP/1.1 requests whose response has not started (`io::gone`).
    owed: AtomicUsize,
    /// Asked to close (never picked as an idle victim twice).
    closing: AtomicBool,
    /// Closed at once (never picked again); a connection asked to close
    /// that starts reading a body instead may still be.
    killed: AtomicBool,
    /// Accepted before the drain began ([`Listener::drained`] waits for these).
    before_drain: bool,
}

impl Conn {
    /// When the head or body this connection is reading began (ms since
    /// the listener started), if it is reading one. A connection asked to
    /// close that is still open with no request in flight counts as reading
    /// a head since it was last active: hyper closes only a connection
    /// between two requests, not one that has yet to complete its first.
    fn reading_for(&self) -> Option<u64> {
        let body = self.reading_since.load(Ordering::Acquire);
        if body > 0 {
            return Some(body);
        }
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let head = self.head_since.load(Ordering::Acquire);
        if head > 0 {
            return Some(head);
        }
        self.closing
            .load(Ordering::Acquire)
            .then(|| self.last_active.load(Ordering::Relaxed).max(1))
    }

    /// Notes bytes read: the start of a head when no request is in flight.
    fn bytes_read(&self, now_ms: u64) {
        if self.in_flight.load(Ordering::Acquire) == 0 {
            let _ = self.head_since.compare_exchange(
                0,
                now_ms.max(1),
                Ordering::AcqRel,
                Ordering::Relaxed,
            );
        }
    }

    fn ask_close(&self) {
        self.closing.store(true, Ordering::Release);
        self.close.notify_one();
    }
}

/// What the accept loop shares with its connections.
struct Shared {
    limits: Limits,
    epoch: Instant,
    next_id: AtomicU64,
    conns: Mutex<HashMap<u64, Arc<Conn>>>,
    /// Requests in flight per client address.
    clients: Mutex<HashMap<IpAddr, usize>>,
    /// Open connections per client address.
    open_per_ip: Mutex<HashMap<IpAddr, usize>>,
    draining: AtomicBool,
    /// New connections waiting for an evicted one to close.
    making_room: AtomicUsize,
    /// Signalled whenever a connection closes.
    closed: Notify,
}

impl Shared {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn conns(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Conn>>> {
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn clients(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, usize>> {
        self.clients.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn ask_all_close(&self) {
        for c in self.conns().values() {
            c.ask_close();
        }
    }

    /// Resolves once no open connection matches `which`.
    async fn closed_all(&self, which: impl Fn(&Conn) -> bool) {
        loop {
            let notified = self.closed.notified();
            tokio::pin!(notified);
            // registered before the check, so a close in between is not missed
            notified.as_mut().enable();
            if !self.conns().values().any(|c| which(c)) {
                return;
            }
            notified.await;
        }
    }

    /// Makes room among the connections of `ip` (all when `None`): asks
    /// the one idle the longest to close, else closes the one that has
    /// been reading a request's head or body the longest; false when every
    /// one has a response under way.
    fn evict(&self, ip: Option<IpAddr>) -> bool {
        let conns = self.conns();
        // ties (connections accepted in the same millisecond) go to the
        // older id, so the order never depends on the map's
        let open = || {
            conns.iter().filter(|(_, c)| {
                !c.closing.load(Ordering::Acquire) && ip.is_none_or(|ip| c.ip == ip)
            })
        };
        let idle = open()
            .filter(|(_, c)| {
                c.in_flight.load(Ordering::Acquire) == 0
                    && c.head_since.load(Ordering::Acquire) == 0
            })
            .min_by_key(|(id, c)| (c.last_active.load(Ordering::Relaxed), **id))
            .map(|(_, c)| c);
        if let Some(c) = idle {
            c.ask_close();
            return true;
        }
        let reading = conns
            .iter()
            .filter(|(_, c)| !c.killed.load(Ordering::Acquire) && ip.is_none_or(|ip| c.ip == ip))
            .filter_map(|(id, c)| c.reading_for().map(|since| (since, *id, c)))
            .min_by_key(|(since, id, _)| (*since, *id))
            .map(|(_, _, c)| c);
        match reading {
            Some(c) => {
                c.closing.store(true, Ordering::Release);
                c.killed.store(true, Ordering::Release);
                c.kill.notify_one();
                true
            }
            None => false,
        }
    }

    fn open_per_ip(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, usize>> {
        self.open_per_ip.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Room for one more connection of `ip` under `max_client_connections`
    /// (evicting one of its own, see [`Shared::evict`]).
    fn client_room(&self, ip: IpAddr) -> bool {
        let cap = self.limits.max_client_connections;
        let n = self.open_per_ip().get(&ip).copied().unwrap_or(0);
        cap == 0 || n < cap || self.evict(Some(ip))
    }

    /// Counts a request of `ip` in flight, or None when it already has the most allowed.
    fn admit(self: &Arc<Self>, ip: IpAddr, conn: &Arc<Conn>) -> Option<RequestGuard> {
        let cap = self.limits.max_client_requests;
        let mut clients = self.clients();
        let n = clients.entry(ip).or_insert(0);
        if cap > 0 && *n >= cap {
            return None;
        }
        *n += 1;
        conn.in_flight.fetch_add(1, Ordering::AcqRel);
        Some(RequestGuard {
            shared: self.clone(),
            conn: conn.clone(),
            ip,
        })
    }
}

/// A request in flight: released when its response body is done or dropped.
struct RequestGuard {
    shared: Arc<Shared>,
    conn: Arc<Conn>,
    ip: IpAddr,
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.conn
            .last_active
            .store(self.shared.now_ms(), Ordering::Relaxed);
        self.conn.in_flight.fetch_sub(1, Ordering::AcqRel);
        let mut clients = self.shared.clients();
        if let Some(n) = clients.get_mut(&self.ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                clients.remove(&self.ip);
            }
        }
    }
}

/// A response body that holds its request's [`RequestGuard`] until it ends.
struct Guarded {
    inner: Body,
    _guard: RequestGuard,
}

impl http_body::Body for Guarded {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The running accept loop (see the module doc).
pub struct Listener {
    shared: Arc<Shared>,
    stop: Arc<Notify>,
    task: JoinHandle<()>,
}

impl Listener {
    /// Starts accepting on `listener`, serving `app` under `limits`.
    pub fn spawn(app: Router, listener: TcpListener, limits: Limits) -> Listener {
        let shared = Arc::new(Shared {
            limits,
            epoch: Instant::now(),
            next_id: AtomicU64::new(0),
            conns: Mutex::new(HashMap::new()),
            clients: Mutex::new(HashMap::new()),
            open_per_ip: Mutex::new(HashMap::new()),
            draining: AtomicBool::new(false),
            making_room: AtomicUsize::new(0),
            closed: Notify::new(),
        });
        let stop = Arc::new(Notify::new());
        let task = tokio::spawn(accept_loop(app, listener, shared.clone(), stop.clone()));
        Listener { shared, stop, task }
    }

    /// Starts the drain: every open connection closes once its in-flight
    /// request is done; new ones serve a single request.
    pub fn begin_drain(&self) {
        self.shared.draining.store(true, Ordering::Release);
        self.shared.ask_all_close();
    }

    /// Resolves once every connection accepted before the drain has closed.
    pub async fn drained(&self) {
        self.shared.closed_all(|c| c.before_drain).await;
    }

    /// Stops accepting and asks every connection to close; resolves once
    /// all have closed (callers bound the wait).
    pub async fn stop(self) {
        self.stop.notify_one();
        // once the accept loop has returned, no connection is added
        let _ = self.task.await;
        self.shared.ask_all_close();
        self.shared.closed_all(|_| true).await;
    }
}

async fn accept_loop(app: Router, listener: TcpListener, shared: Arc<Shared>, stop: Arc<Notify>) {
    let limits = shared.limits;
    let app = tower::ServiceBuilder::new()
        .layer(RequestBodyTimeoutLayer::new(limits.body_timeout))
        .service(app);
    // HTTP/1.1 only: the auto-detecting builder waits for the first bytes
    // (the HTTP/2 preface) without any timeout, which a silent client holds
    // forever. Connections accepted while draining serve one request.
    let mut builder = Builder::new(TokioExecutor::new()).http1_only();
    // half_close: a client may shut its write side after the request and
    // still read the response (hyper otherwise drops the connection on EOF).
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .half_close(true);
    let mut closing = builder.clone();
    closing.http1().keep_alive(false);
    let open = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    loop {
        let (tcp, peer) = tokio::select! {
            _ = stop.notified() => break,
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
        if !shared.client_room(peer.ip()) {
            tracing::debug!(%peer, max = limits.max_client_connections, "per-client connection limit reached: closing");
            drop(tcp);
            continue;
        }
        let draining = shared.draining.load(Ordering::Acquire);
        let b = if draining { &closing } else { &builder };
        if let Ok(permit) = open.clone().try_acquire_owned() {
            serve(b, tcp, peer.ip(), permit, &app, &shared, !draining);
            continue;
        }
        // the cap is full: making room waits for a victim to close, off
        // this loop, so a flood of connections never delays the next accept
        if shared.making_room.fetch_add(1, Ordering::AcqRel) >= MAX_MAKING_ROOM {
            shared.making_room.fetch_sub(1, Ordering::AcqRel);
            tracing::debug!(%peer, "connection limit reached, room already being made: closing");
            continue;
        }
        let (b, app, sh, open) = (b.clone(), app.clone(), shared.clone(), open.clone());
        tokio::spawn(async move {
            let permit = connection_permit(&open, &sh).await;
            sh.making_room.fetch_sub(1, Ordering::AcqRel);
            match permit {
                Some(p) => serve(&b, tcp, peer.ip(), p, &app, &sh, !draining),
                None => {
                    tracing::debug!(%peer, max = sh.limits.max_connections, "connection limit reached: closing")
                }
            }
        });
    }
}

/// A connection slot freed by evicting (see [`Shared::evict`]).
async fn connection_permit(
    open: &Arc<Semaphore>,
    shared: &Arc<Shared>,
) -> Option<OwnedSemaphorePermit> {
    for _ in 0..EVICT_TRIES {
        if !shared.evict(None) {
            return None;
        }
        if let Ok(Ok(p)) = tokio::time::timeout(EVICT_WAIT, open.clone().acquire_owned()).await {
            return Some(p);
        }
    }
    None
}

type App = tower_http::timeout::RequestBodyTimeout<Router>;

mod body;
mod io;

use body::Metered;
pub use body::SlowBody;
use io::SharedTcp;

/// An HTTP/1.1 request whose response has not started (see `io::gone`).
struct Owed(Arc<Conn>);

impl Owed {
    fn new(conn: &Arc<Conn>) -> Self {
        conn.owed.fetch_add(1, Ordering::AcqRel);
        Owed(conn.clone())
    }
}

impl Drop for Owed {
    fn drop(&mut self) {
        self.0.owed.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Spawns the task serving one connection.
fn serve(
    builder: &Builder<TokioExecutor>,
    tcp: TcpStream,
    ip: IpAddr,
    permit: OwnedSemaphorePermit,
    app: &App,
    shared: &Arc<Shared>,
    before_drain: bool,
) {
    // Streamed tokens are small writes: without TCP_NODELAY, Nagle's
    // algorithm holds each one until the client's delayed ACK (~40 ms).
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!(error = %e, "could not set TCP_NODELAY");
    }
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let conn = Arc::new(Conn {
        close: Notify::new(),
        kill: Notify::new(),
        ip,
        reading_since: AtomicU64::new(0),
        head_since: AtomicU64::new(0),
        last_active: AtomicU64::new(shared.now_ms()),
        in_flight: AtomicUsize::new(0),
        owed: AtomicUsize::new(0),
        closing: AtomicBool::new(false),
        killed: AtomicBool::new(false),
        before_drain,
    });
    shared.conns().insert(id, conn.clone());
    *shared.open_per_ip().entry(ip).or_insert(0) += 1;
    let (sh, c, app) = (shared.clone(), conn.clone(), app.clone());
    let service = tower::service_fn(move |req: hyper::Request<Incoming>| {
        let (sh, c, app) = (sh.clone(), c.clone(), app.clone());
        async move {
            // the head is complete
            c.head_since.store(0, Ordering::Release);
            let Some(guard) = sh.admit(ip, &c) else {
                return Ok::<_, Infallible>(too_many_requests(sh.limits.max_client_requests));
            };
            let owed = (req.version() == hyper::Version::HTTP_11).then(|| Owed::new(&c));
            let req = req.map(|b| Metered::new(b, sh.clone(), c.clone()));
            let resp = match app.oneshot(req).await {
                Ok(r) => r,
                Err(never) => match never {},
            };
            drop(owed);
            Ok(resp.map(|inner| {
                Body::new(Guarded {
                    inner,
                    _guard: guard,
                })
            }))
        }
    });
    let tcp = Arc::new(tcp);
    let (sh, c) = (shared.clone(), conn.clone());
    let on_read = Box::new(move || c.bytes_read(sh.now_ms()));
    let hyper_conn = builder
        .serve_connection(
            TokioIo::new(SharedTcp(tcp.clone(), on_read)),
            TowerToHyperService::new(service),
        )
        .into_owned();
    let shared = shared.clone();
    tokio::spawn(async move {
        let _permit = permit;
        tokio::pin!(hyper_conn);
        let ended = tokio::select! {
            r = hyper_conn.as_mut() => r,
            _ = conn.close.notified() => {
                tokio::select! {
                    r = async {
                        hyper_conn.as_mut().graceful_shutdown();
                        hyper_conn.await
                    } => r,
                    _ = conn.kill.notified() => Ok(()),
                    _ = io::gone(&tcp, &conn.owed) => Ok(()),
                }
            }
            // dropping the connection drops its request (the engine cancels it)
            _ = conn.kill.notified() => {
                tracing::debug!(%ip, "reading a request head or body the longest when the cap was full: closed");
                Ok(())
            }
            _ = io::gone(&tcp, &conn.owed) => {
                tracing::debug!(%ip, "the client has gone: connection closed with its request");
                Ok(())
            }
        };
        if let Err(e) = ended {
            tracing::debug!(%ip, error = %e, "connection ended with an error");
        }
        shared.conns().remove(&id);
        {
            let mut per_ip = shared.open_per_ip();
            if let Some(n) = per_ip.get_mut(&ip) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    per_ip.remove(&ip);
                }
            }
        }
        drop(_permit);
        shared.closed.notify_waiters();
    });
}

fn too_many_requests(cap: usize) -> Response {
    ApiError::from_status(
        axum::http::StatusCode::TOO_MANY_REQUESTS,
        format!(
            "too many requests in flight from this client address (at most {cap}: \
             `--max-client-requests`); retry when one has finished"
        ),
    )
    .into_response()
}
