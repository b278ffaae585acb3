//! `lamina serve`: the OpenAI-compatible HTTP server (`server` crate) over
//! the engine, on 127.0.0.1:8000 unless told otherwise.
//!
//! Binds the port first (a port in use fails at once, before the model
//! loads, with one line naming the cause and the fix), loads the model
//! (fetching it on first use), prints how long start-up took and what it
//! sized (backend, KV blocks, batch limits, CUDA graphs), the address and
//! the sampling settings in effect to stderr, and serves until Ctrl-C / SIGTERM; then stops
//! accepting, lets in-flight requests finish for `--grace` seconds, cancels
//! the rest and exits 0.

use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::setup::{self, ModelArgs};

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on; the default only accepts local clients.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on.
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Require `Authorization: Bearer <KEY>` on /v1/* and /tokenize.
    #[arg(long)]
    pub api_key: Option<String>,
    /// Most requests waiting for admission; more get 429 (0 = unbounded).
    #[arg(long, default_value_t = 1024)]
    pub max_queue: usize,
    /// Largest request body in bytes; larger ones get 413.
    #[arg(long, default_value_t = server::DEFAULT_BODY_LIMIT)]
    pub body_limit: usize,
    /// Seconds in-flight requests may run after Ctrl-C / SIGTERM before being cancelled.
    #[arg(long, default_value_t = 10.0)]
    pub grace: f64,
    /// Most connections open at once (each holds a file descriptor: raise
    /// `ulimit -n` with it). When all are taken, the one idle the longest is
    /// closed to make room; with none idle, new ones are closed as they arrive.
    #[arg(long, default_value_t = server::DEFAULT_MAX_CONNECTIONS)]
    pub max_connections: usize,
    /// Requests in flight per client address before 429 (0: no cap).
    #[arg(long, default_value_t = server::DEFAULT_MAX_CLIENT_REQUESTS)]
    pub max_client_requests: usize,
    /// Seconds to receive a request's headers; also how long a keep-alive
    /// connection may sit idle between requests.
    #[arg(long, default_value_t = 10.0)]
    pub header_timeout: f64,
    /// Seconds a request body may stall between two chunks (then 408).
    #[arg(long, default_value_t = 30.0)]
    pub body_timeout: f64,
    /// Name clients use for the model (default: the --model id or directory name).
    #[arg(long)]
    pub served_model_name: Option<String>,
}

pub fn run(args: ServeArgs) -> Result<()> {
    if !(args.grace >= 0.0 && args.grace.is_finite()) {
        bail!(
            "invalid `--grace`: must be a non-negative number of seconds, got {}",
            args.grace
        );
    }
    if args.body_limit == 0 {
        bail!("invalid `--body-limit`: must be at least 1 byte");
    }
    if args.max_connections == 0 {
        bail!("invalid `--max-connections`: must be at least 1");
    }
    for (flag, v) in [
        ("--header-timeout", args.header_timeout),
        ("--body-timeout", args.body_timeout),
    ] {
        if !(v > 0.0 && v.is_finite() && v <= 86_400.0) {
            bail!(
                "invalid `{flag}`: must be a positive number of seconds (at most a day), got {v}"
            );
        }
    }
    if let Some(Err(why)) = args.api_key.as_deref().map(server::check_api_key) {
        bail!("invalid `--api-key`: {why}");
    }
    let addr = if args.host.contains(':') {
        format!("[{}]:{}", args.host, args.port)
    } else {
        format!("{}:{}", args.host, args.port)
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("lamina-http")
        .build()
        .context("cannot start the async runtime")?;
    let listener = runtime
        .block_on(server::bind(&addr))
        .map_err(|e| bind_error(e, &args))?;
    let t0 = std::time::Instant::now();
    let loaded = setup::open(&args.model, args.max_queue)?;
    eprintln!(
        "lamina: started in {:.1}s: {}",
        t0.elapsed().as_secs_f64(),
        loaded.sizing
    );
    let model_id = args.served_model_name.clone().unwrap_or(loaded.model_id);
    let cfg = server::ServerConfig {
        model_id: model_id.clone(),
        api_key: args.api_key.clone(),
        body_limit: args.body_limit,
        grace: Duration::from_secs_f64(args.grace),
        max_connections: args.max_connections,
        header_timeout: Duration::from_secs_f64(args.header_timeout),
        body_timeout: Duration::from_secs_f64(args.body_timeout),
        max_client_requests: args.max_client_requests,
        defaults: loaded.model.generation.clone(),
    };
    let defaults = loaded.model.generation.sampling_defaults();
    let state = server::AppState::new(loaded.engine, loaded.tokenizer, cfg);
    runtime.block_on(async move {
        let local = listener.local_addr().map(|a| a.to_string()).unwrap_or(addr);
        eprintln!("lamina: serving `{model_id}` on http://{local} (Ctrl-C to stop)");
        eprintln!("lamina: requests that set no sampling fields get {defaults}");
        server::serve(state, listener, server::shutdown_signal()).await
    })?;
    eprintln!("lamina: server stopped");
    Ok(())
}

/// The bind failure as one line: the address, the cause and what to do.
fn bind_error(e: server::ServerError, args: &ServeArgs) -> anyhow::Error {
    let server::ServerError::Bind { addr, source } = e else {
        return e.into();
    };
    let fix = match source.kind() {
        std::io::ErrorKind::AddrInUse => format!(
            "another program (another `lamina serve`?) is listening on port {}: stop it or choose another `--port`",
            args.port
        ),
        std::io::ErrorKind::PermissionDenied => {
            "ports below 1024 need privileges: choose a `--port` above 1024".to_string()
        }
        std::io::ErrorKind::AddrNotAvailable => format!(
            "`--host {}` is not an address of this machine: use 127.0.0.1 (local) or 0.0.0.0 (every interface)",
            args.host
        ),
        _ => "check `--host` and `--port`".to_string(),
    };
    anyhow::anyhow!("cannot listen on {addr}: {source}; {fix}")
}
