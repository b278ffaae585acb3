//! lamina's OpenAI-compatible HTTP server over the continuous-batching engine.
//!
//! Endpoints: `POST /v1/chat/completions`, `POST /v1/completions` (streamed
//! as SSE or whole), `GET /v1/models[/{id}]`, `POST /tokenize` (all behind
//! the API key when one is set), and `GET /health`, `GET /metrics`
//! (Prometheus text). Errors use OpenAI's JSON shape ([`error::ApiError`]).
//!
//! Contract:
//! - [`router`] builds the whole app for a shared [`AppState`] (used in
//!   process by tests); [`serve`] runs it on a listener until `shutdown`
//!   resolves, then drains: in-flight requests run for the configured grace
//!   period while new ones get 503 (`/health` too), what is left is
//!   cancelled (engine shutdown), the listener closes and `serve` returns `Ok`.
//! - A client that disconnects mid-stream cancels its request: the engine
//!   handle lives in the response stream and cancels on drop.
//! - Every request runs in a tracing span carrying its request id, which is
//!   echoed in `x-request-id`.
//!
//! Costs: the server adds one JSON parse and one tokenisation per request
//! (on the blocking pool, [`encode`]) and O(1) work per streamed token;
//! generation itself runs on the engine thread.

pub mod api;
pub mod encode;
pub mod error;
pub mod generate;
pub mod listen;
pub mod logprobs;
pub mod metrics;
pub mod middleware;
pub mod misc;
pub mod params;
pub mod protocol;
pub mod state;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};

pub use error::ApiError;
pub use middleware::check_api_key;
pub use state::{
    AppState, DEFAULT_BODY_LIMIT, DEFAULT_MAX_CLIENT_REQUESTS, DEFAULT_MAX_CONNECTIONS,
    ServerConfig,
};

/// After the grace period the engine is shut down; connections get this much
/// longer to close before `serve` returns anyway.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Errors running the server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot bind {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("server I/O error on {addr}: {source}")]
    Io {
        addr: String,
        source: std::io::Error,
    },
}

/// The whole application for `state`.
pub fn router(state: Arc<AppState>) -> Router {
    let guarded = Router::new()
        .route("/v1/chat/completions", post(api::chat_completions))
        .route("/v1/completions", post(api::completions))
        .route("/v1/models", get(misc::list_models))
        .route("/v1/models/{id}", get(misc::get_model))
        .route("/tokenize", post(misc::tokenize))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            middleware::require_api_key,
        ));
    Router::new()
        .route("/", get(misc::root))
        .route("/health", get(misc::health))
        .route("/metrics", get(misc::metrics))
        .merge(guarded)
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(state.cfg.body_limit))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            middleware::request_context,
        ))
        .with_state(state)
}

async fn not_found(uri: axum::http::Uri) -> ApiError {
    ApiError::from_status(
        axum::http::StatusCode::NOT_FOUND,
        format!("No route for `{}`.", uri.path()),
    )
}

/// Binds `addr` (`host:port`).
pub async fn bind(addr: &str) -> Result<tokio::net::TcpListener, ServerError> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Bind {
            addr: addr.to_string(),
            source,
        })
}

/// Serves `state` on `listener` until `shutdown` resolves, then drains
/// (see the module doc) and shuts the engine down. Returns `Ok` on a clean
/// or grace-limited shutdown.
pub async fn serve(
    state: Arc<AppState>,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    let addr = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "?".into());
    tracing::info!(%addr, model = %state.cfg.model_id, "listening");
    let limits = listen::Limits {
        max_connections: state.cfg.max_connections,
        header_timeout: state.cfg.header_timeout,
        body_timeout: state.cfg.body_timeout,
        max_client_requests: state.cfg.max_client_requests,
    };
    let listen = listen::Listener::spawn(router(state.clone()), listener, limits);
    shutdown.await;
    tracing::info!(
        "shutdown requested: draining (new requests get 503); finishing in-flight requests"
    );
    state.begin_drain();
    listen.begin_drain();
    let grace = state.cfg.grace;
    tokio::select! {
        _ = listen.drained() => {}
        _ = tokio::time::sleep(grace) => {
            tracing::warn!(grace_s = grace.as_secs_f64(), "grace period over: cancelling in-flight requests");
            stop_engine(&state).await;
            if tokio::time::timeout(CLOSE_TIMEOUT, listen.drained()).await.is_err() {
                tracing::warn!("connections still open after cancellation; exiting anyway");
            }
        }
    }
    stop_engine(&state).await;
    if tokio::time::timeout(CLOSE_TIMEOUT, listen.stop())
        .await
        .is_err()
    {
        tracing::warn!("connections opened during the drain still open; exiting anyway");
    }
    tracing::info!(%addr, "server stopped");
    Ok(())
}

/// Shuts the engine down (joins its thread) off the async workers.
async fn stop_engine(state: &Arc<AppState>) {
    let st = state.clone();
    if tokio::task::spawn_blocking(move || st.engine.shutdown())
        .await
        .is_err()
    {
        tracing::error!("engine shutdown panicked");
    }
}

/// Resolves on Ctrl-C or (on Unix) SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!("cannot listen for Ctrl-C: {e}");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!("cannot listen for SIGTERM: {e}");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => tracing::info!("received Ctrl-C"),
        _ = term => tracing::info!("received SIGTERM"),
    }
}
