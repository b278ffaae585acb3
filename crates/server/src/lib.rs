//! lamina's OpenAI-compatible HTTP server over the continuous-batching engine.
//!
//! Endpoints: `POST /v1/chat/completions`, `POST /v1/completions` (streamed
//! as SSE or whole), Anthropic's `POST /v1/messages` and
//! `POST /v1/messages/count_tokens` ([`anthropic`]), OpenAI's Responses API
//! `POST /v1/responses`, `GET` / `DELETE /v1/responses/{id}`
//! ([`oairesponses`]), `GET /v1/models[/{id}]`, `GET /models`,
//! `POST /models/load`, `POST /models/unload` ([`model_admin`]; several
//! models behind one server, [`models`]), `POST /tokenize`,
//! `POST /detokenize` (all behind the API keys when some are set), and
//! `GET /`, `GET /health`, `GET /version`, `GET /metrics` (Prometheus
//! text), `GET /openapi.json` and `GET /docs` (the generated OpenAPI
//! document, [`openapi`]). Errors use OpenAI's JSON shape
//! ([`error::ApiError`]). CORS headers are sent only for the configured
//! `allowed_origins` (none by default). Before any route, [`guard`] refuses
//! Hosts that are not loopback, bound or allowed, foreign origins changing
//! state without an API key, and bodies that are not JSON.
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
//! Costs: the server adds one JSON parse per request on the async workers;
//! checks, template, tokenisation and grammar compilation run on the work
//! pool ([`work`]), within the limits of [`limits`]; O(1) work per streamed token;
//! generation itself runs on the engine thread.

pub mod anthropic;
pub mod api;
pub mod body;
pub mod embeddings;
pub mod encode;
pub mod error;
pub mod generate;
pub mod guard;
pub mod keep_alive;
pub mod limits;
pub mod listen;
pub mod logprobs;
pub mod lora;
pub mod messages;
pub mod metrics;
pub mod middleware;
pub mod misc;
pub mod model_admin;
pub mod models;
pub mod oairesponses;
pub mod openapi;
pub mod page;
pub mod params;
pub mod protocol;
pub mod reasoning;
pub mod replicas;
pub mod response_store;
pub mod responses;
pub mod state;
pub mod structured;
pub mod tools;
mod wire;
pub mod work;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;

pub use error::ApiError;
pub use limits::InputLimits;
pub use middleware::check_api_key;
pub use models::{LoadError, Loader, Memory, Models, Policy, Registration, Served};
pub use replicas::Replicas;
pub use state::{
    AppState, DEFAULT_BODY_LIMIT, DEFAULT_LORA_LOAD_TIMEOUT, DEFAULT_MAX_CLIENT_REQUESTS,
    DEFAULT_MAX_CONNECTIONS, DEFAULT_MIN_BODY_RATE, LoraLoader, ServerConfig,
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

/// The whole application for `state`. The routes are the ones
/// [`openapi::api_doc`] documents (the same lists build both).
pub fn router(state: Arc<AppState>) -> Router {
    let (guarded, _) = openapi::guarded_routes().split_for_parts();
    let guarded = guarded.route_layer(axum::middleware::from_fn_with_state(
        state.clone(),
        middleware::require_api_key,
    ));
    let (open, _) = openapi::open_routes().split_for_parts();
    let app = open
        .merge(guarded)
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(state.cfg.body_limit))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            guard::check_request,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            middleware::request_context,
        ));
    let app = match cors(&state.cfg.allowed_origins) {
        Some(layer) => app.layer(layer),
        None => app,
    };
    app.with_state(state)
}

/// The CORS layer for `origins` (`*` alone: any origin), or `None` when
/// the list is empty (no CORS headers: browsers refuse cross-origin calls).
/// Origins are checked at start-up by [`check_origins`].
fn cors(origins: &[String]) -> Option<tower_http::cors::CorsLayer> {
    use tower_http::cors::{AllowOrigin, Any, CorsLayer};
    if origins.is_empty() {
        return None;
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::from(Any)
    } else {
        AllowOrigin::list(
            origins
                .iter()
                .filter_map(|o| axum::http::HeaderValue::from_str(o).ok()),
        )
    };
    Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods(Any)
            .allow_headers(Any),
    )
}

/// Why an `--allowed-origins` entry cannot be used: `*`, or an origin
/// `scheme://host[:port]` without a path, printable ASCII.
pub fn check_origin(origin: &str) -> Result<(), String> {
    if origin == "*" {
        return Ok(());
    }
    let Some((scheme, rest)) = origin.split_once("://") else {
        return Err(format!(
            "`{origin}` is not an origin like `https://example.com`"
        ));
    };
    if !matches!(scheme, "http" | "https") || rest.is_empty() || rest.contains('/') {
        return Err(format!(
            "`{origin}` is not an origin (`http(s)://host[:port]`, no path)"
        ));
    }
    axum::http::HeaderValue::from_str(origin)
        .map(|_| ())
        .map_err(|_| format!("`{origin}` has characters an HTTP header cannot carry"))
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
    tracing::info!(%addr, models = ?state.models.names(), "listening");
    note_bind(&state, &listener);
    let limits = listen::Limits {
        max_connections: state.cfg.max_connections,
        header_timeout: state.cfg.header_timeout,
        body_timeout: state.cfg.body_timeout,
        max_client_requests: state.cfg.max_client_requests,
        max_client_connections: state.cfg.max_client_connections,
        min_body_rate: state.cfg.min_body_rate,
        read_deadline: state.cfg.read_deadline,
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

/// Records the bound address for the Host check ([`guard`]) and says, when
/// the server listens on every interface, which Hosts it serves.
fn note_bind(state: &AppState, listener: &tokio::net::TcpListener) {
    let Ok(local) = listener.local_addr() else {
        return;
    };
    if !local.ip().is_unspecified() {
        let _ = state.bind.set(local.ip());
    } else if !guard::any_host(state) {
        tracing::warn!(
            "listening on every interface without an API key: requests whose Host is not a \
             loopback name or one of `--allowed-hosts` are refused (403); pass \
             `--allowed-hosts NAME` (or `*`) to serve other names"
        );
    }
}

/// Shuts every loaded model's engines down (joins their threads) off the
/// async workers.
async fn stop_engine(state: &Arc<AppState>) {
    let st = state.clone();
    if tokio::task::spawn_blocking(move || st.models.shutdown())
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
