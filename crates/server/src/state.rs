//! The state every handler shares: the models ([`Models`]: each one's
//! engines, tokenizer, defaults and metrics), the configuration, the work
//! pool, the request-id counter and the draining flag set when shutdown
//! begins.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use contract::GenerationConfig;
use engine::Engine;
use tokenizer::Tokenizer;
use tokio::sync::watch;

use crate::limits::InputLimits;
use crate::metrics::ReplicaView;
pub use crate::models::LoraLoader;
use crate::models::{Models, Served};
use crate::replicas::Replicas;
use crate::response_store::ResponseStore;
use crate::work::WorkPool;

/// Request bodies larger than this are refused with 413 unless configured otherwise.
pub const DEFAULT_BODY_LIMIT: usize = 4 << 20;
/// Default cap on open connections (each holds a file descriptor; raise the
/// process's descriptor limit with it).
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// Default cap on requests in flight per client address (`--max-client-requests`):
/// the engine's default queue, so one client alone can still fill it.
pub const DEFAULT_MAX_CLIENT_REQUESTS: usize = 1024;

/// Default minimum body rate in bytes per second (`--min-body-rate`): a
/// 4 MiB body at this rate takes about an hour, a slow-body attack's one
/// byte every few seconds is closed within seconds.
pub const DEFAULT_MIN_BODY_RATE: u64 = 1024;

/// Default interval of SSE keep-alive comments (`--sse-keep-alive-secs`).
pub const DEFAULT_SSE_KEEP_ALIVE: Duration = Duration::from_secs(15);

/// How the server is set up.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The name clients address the model by (`/v1/models`, `model` fields)
    /// when the state is built over one model ([`AppState::with_replicas`]).
    pub model_id: String,
    /// When not empty, `/v1/*`, `/models*`, `/tokenize` and `/detokenize` require
    /// `Authorization: Bearer <key>` with one of these keys (check each with
    /// [`crate::check_api_key`] first: a key no header can carry would lock
    /// its clients out).
    pub api_keys: Vec<String>,
    /// Origins allowed by CORS (`*` allows any); empty: no CORS headers, so
    /// browsers refuse cross-origin calls.
    pub allowed_origins: Vec<String>,
    /// Host names served besides loopback and the bound address (`*`: any;
    /// empty with API keys set: any), see [`crate::guard`].
    pub allowed_hosts: Vec<String>,
    /// A streamed response sends an SSE comment after this long without an
    /// event (also while the request waits in the queue), so proxies and
    /// clients do not time the connection out.
    pub sse_keep_alive: Duration,
    /// Largest accepted request body in bytes (413 above).
    pub body_limit: usize,
    /// After a shutdown signal, how long in-flight requests may run before being cancelled.
    pub grace: Duration,
    /// Most connections open at once; more are closed as they are accepted.
    pub max_connections: usize,
    /// Time to receive a request's headers, also the idle limit between the
    /// requests of a keep-alive connection.
    pub header_timeout: Duration,
    /// Longest wait between two chunks of a request body (408 after it).
    pub body_timeout: Duration,
    /// Requests in flight per client address before 429 (0: no cap).
    pub max_client_requests: usize,
    /// Open connections per client address (0: no cap); one more makes
    /// room among that address's own connections (`listen`).
    pub max_client_connections: usize,
    /// Bytes per second a request body must keep up once its first bytes
    /// arrived (0: no minimum).
    pub min_body_rate: u64,
    /// Time from a request's headers to the end of its body (408 after it).
    pub read_deadline: Duration,
    /// Sampling defaults (`generation_config.json`) for fields a request
    /// leaves out, of the one model of [`AppState::with_replicas`] (each
    /// model of [`AppState::with_models`] has its own, [`Served::defaults`]).
    pub defaults: GenerationConfig,
    /// Most tokens a reply gets when the request sets no `max_tokens`
    /// (less when the rest of the context is less).
    pub default_max_tokens: usize,
    /// Size and depth limits on what a request carries ([`InputLimits`]).
    pub limits: InputLimits,
    /// Requests waiting for the work pool before 429 ([`crate::work`]).
    pub work_queue: usize,
    /// Time one request's preparation (checks, template, tokenization,
    /// grammar compilation) may take on the work pool.
    pub work_budget: Duration,
    /// Bytes the Responses API's store of responses may hold
    /// ([`crate::response_store`]).
    pub responses_store_bytes: usize,
    /// How long a stored response is kept.
    pub responses_store_ttl: Duration,
    /// How long `load_lora_adapter` waits for the adapter's files
    /// (`--lora-load-timeout-secs`).
    pub lora_load_timeout: Duration,
    /// Splits chat replies' reasoning into `reasoning_content`
    /// (`--reasoning-parser`, [`crate::reasoning`]); `None`: replies are
    /// returned as the model wrote them. For the one model of
    /// [`AppState::with_replicas`], like `defaults`.
    pub reasoning_parser: Option<crate::reasoning::ReasoningParser>,
    /// How `/v1/embeddings` pools a sequence's hidden states (`--pooling`).
    pub pooling: engine::Pooling,
}

/// Default `--lora-load-timeout-secs`.
pub const DEFAULT_LORA_LOAD_TIMEOUT: Duration = Duration::from_secs(300);

impl ServerConfig {
    pub fn new(model_id: impl Into<String>) -> Self {
        ServerConfig {
            model_id: model_id.into(),
            api_keys: Vec::new(),
            allowed_origins: Vec::new(),
            allowed_hosts: Vec::new(),
            sse_keep_alive: DEFAULT_SSE_KEEP_ALIVE,
            body_limit: DEFAULT_BODY_LIMIT,
            grace: Duration::from_secs(10),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            max_client_requests: DEFAULT_MAX_CLIENT_REQUESTS,
            max_client_connections: DEFAULT_MAX_CONNECTIONS / 4,
            min_body_rate: DEFAULT_MIN_BODY_RATE,
            read_deadline: Duration::from_secs(60),
            defaults: GenerationConfig::default(),
            default_max_tokens: crate::params::DEFAULT_MAX_TOKENS,
            limits: InputLimits::default(),
            work_queue: crate::work::DEFAULT_QUEUE,
            work_budget: crate::work::DEFAULT_BUDGET,
            responses_store_bytes: crate::response_store::DEFAULT_STORE_BYTES,
            responses_store_ttl: crate::response_store::DEFAULT_STORE_TTL,
            lora_load_timeout: DEFAULT_LORA_LOAD_TIMEOUT,
            reasoning_parser: None,
            pooling: engine::Pooling::default(),
        }
    }
}

/// Shared by all handlers behind an `Arc`.
pub struct AppState {
    /// The models served, loaded or not.
    pub models: Models,
    pub cfg: ServerConfig,
    /// SHA-256 of each of `cfg.api_keys` (what requests are compared against).
    pub api_key_digests: Vec<[u8; 32]>,
    /// Unix time the server started (the model's `created`).
    pub started: u64,
    /// The threads preparing requests ([`AppState::work_threads`] of them).
    pub work: WorkPool,
    /// Stored Responses API responses (`store`, `previous_response_id`).
    pub responses: ResponseStore,
    next_id: AtomicU64,
    draining: watch::Sender<bool>,
    /// The address [`crate::serve`] listens on, when it is one address (not
    /// `0.0.0.0` / `::`): a `Host` naming it is served ([`crate::guard`]).
    pub bind: std::sync::OnceLock<std::net::IpAddr>,
}

/// SHA-256 of an API key: keys are compared as fixed-length digests, so the
/// comparison's time says nothing about the key's length either.
pub(crate) fn key_digest(key: &[u8]) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    Sha256::digest(key).into()
}

impl AppState {
    /// The state over one engine.
    pub fn new(engine: Engine, tokenizer: Arc<Tokenizer>, cfg: ServerConfig) -> Arc<Self> {
        Self::with_replicas(Replicas::single(engine), tokenizer, cfg)
    }

    /// The state over several replicas of one model (data parallelism),
    /// named `cfg.model_id`, with `cfg.defaults` and `cfg.reasoning_parser`.
    pub fn with_replicas(
        replicas: Replicas,
        tokenizer: Arc<Tokenizer>,
        cfg: ServerConfig,
    ) -> Arc<Self> {
        let served = Served {
            defaults: cfg.defaults.clone(),
            reasoning_parser: cfg.reasoning_parser,
            ..Served::new(replicas, tokenizer)
        };
        Self::with_models(Models::single(cfg.model_id.clone(), served), cfg)
    }

    /// The state over the models of `models`.
    pub fn with_models(models: Models, cfg: ServerConfig) -> Arc<Self> {
        let api_key_digests = cfg
            .api_keys
            .iter()
            .map(|k| key_digest(k.as_bytes()))
            .collect();
        Arc::new(AppState {
            models,
            api_key_digests,
            started: unix_now(),
            work: WorkPool::new(Self::work_threads(), cfg.work_queue, cfg.work_budget),
            responses: ResponseStore::new(cfg.responses_store_bytes, cfg.responses_store_ttl),
            cfg,
            next_id: AtomicU64::new(1),
            draining: watch::Sender::new(false),
            bind: std::sync::OnceLock::new(),
        })
    }

    /// How many requests are prepared at once: all cores but one (at least
    /// one), so preparing never takes every core from the engine thread.
    pub fn work_threads() -> usize {
        std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .saturating_sub(1)
            .max(1)
    }

    /// The default (first) model, when loaded.
    pub fn served(&self) -> Option<Arc<Served>> {
        self.models.loaded(None)
    }

    /// A fresh request id (unique for this server's lifetime).
    pub fn next_request_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// True once shutdown has begun: new generation requests get 503.
    pub fn is_draining(&self) -> bool {
        *self.draining.borrow()
    }

    /// Starts draining (idempotent).
    pub fn begin_drain(&self) {
        self.draining.send_replace(true);
    }

    /// Resolves once draining has begun.
    pub async fn drained(&self) {
        let mut rx = self.draining.subscribe();
        // the sender lives in `self`, so this only errs if `self` is gone
        let _ = rx.wait_for(|d| *d).await;
    }

    /// What `/metrics` reads from each replica of `served`.
    pub fn replica_views(served: &Served) -> Vec<ReplicaView> {
        let replicas = &served.replicas;
        let failed = replicas.failures();
        replicas
            .per_engine_stats()
            .into_iter()
            .enumerate()
            .map(|(i, stats)| {
                let (routed_prefix, routed_load) = replicas.routed(i);
                ReplicaView {
                    block_size: replicas.block_size() as u64,
                    deterministic: replicas.engine(i).is_some_and(|e| e.deterministic()),
                    stats,
                    failed: failed.iter().any(|(j, _)| *j == i),
                    routed_prefix,
                    routed_load,
                }
            })
            .collect()
    }
}

/// Seconds since the Unix epoch (0 if the clock is before it).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
