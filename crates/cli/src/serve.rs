//! `lamina serve`: the OpenAI-compatible HTTP server (`server` crate) over
//! the engine, on 127.0.0.1:8000 unless told otherwise.
//!
//! `--devices 0,1` / `all` (or `--data-parallel-size N`, also CPU replicas)
//! runs one engine per GPU behind the one server (`server::Replicas`).
//!
//! Binds the port first (a port in use fails at once, before the model
//! loads, with one line naming the cause and the fix), loads the model
//! (fetching it on first use), prints how long start-up took and what it
//! sized (backend, KV blocks, batch limits, CUDA graphs), the address and
//! the sampling settings in effect to stderr, warms every step shape up
//! (`--warmup-secs`, `engine::warmup`) so the first requests are as fast
//! as the rest, and serves until Ctrl-C / SIGTERM; then stops
//! accepting, lets in-flight requests finish for `--grace` seconds, cancels
//! the rest and exits 0.

use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::setup::ModelArgs;

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on; the default only accepts local clients.
    #[arg(long, default_value = "127.0.0.1", env = "LAMINA_HOST")]
    pub host: String,
    /// Port to listen on.
    #[arg(long, default_value_t = 8000, env = "LAMINA_PORT")]
    pub port: u16,
    /// Require `Authorization: Bearer <KEY>` on /v1/*, /models*, /tokenize
    /// and /detokenize (repeatable: any of the keys is accepted). Prefer the
    /// environment variable or `--api-key-file`: a flag shows in `ps`.
    /// Several keys in the variable are separated by commas.
    #[arg(
        long,
        env = "LAMINA_API_KEY",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub api_key: Vec<String>,
    /// Read API keys from this file, one per line (blank lines and lines
    /// starting with `#` are skipped); added to `--api-key`.
    #[arg(long, env = "LAMINA_API_KEY_FILE")]
    pub api_key_file: Option<std::path::PathBuf>,
    /// Origins allowed to call the API from a browser (CORS), e.g.
    /// `https://app.example.com`; repeatable or comma-separated, `*` for
    /// any. None by default: no CORS headers are sent.
    #[arg(long, env = "LAMINA_ALLOWED_ORIGINS", value_delimiter = ',')]
    pub allowed_origins: Vec<String>,
    /// Host names (or addresses) clients may reach the server by, besides
    /// loopback (`localhost`, 127.0.0.0/8, `[::1]`) and the `--host`
    /// address; repeatable or comma-separated, `*` for any. Other `Host`
    /// headers get 403, which stops DNS-rebinding pages. Without this flag,
    /// a server on every interface (`--host 0.0.0.0`) serves any Host only
    /// when an API key is set, and otherwise loopback names alone: pass the
    /// names clients use (or `*`). Without an API key, browser requests
    /// that change state from another origin than the server's own page,
    /// a loopback or allowed host, or `--allowed-origins` get 403.
    /// `GET /health` and `/metrics` answer any Host (Kubernetes probes).
    #[arg(long, env = "LAMINA_ALLOWED_HOSTS", value_delimiter = ',')]
    pub allowed_hosts: Vec<String>,
    /// Seconds without an event after which a streamed response sends an
    /// SSE keep-alive comment (also while the request waits in the queue).
    #[arg(long, env = "LAMINA_SSE_KEEP_ALIVE", default_value_t = 15.0)]
    pub sse_keep_alive: f64,
    /// Most requests waiting for admission; more get 429 (0 = unbounded).
    #[arg(long, default_value_t = 1024, env = "LAMINA_MAX_QUEUE")]
    pub max_queue: usize,
    /// Largest request body in bytes; larger ones get 413.
    #[arg(long, default_value_t = server::DEFAULT_BODY_LIMIT, env = "LAMINA_BODY_LIMIT")]
    pub body_limit: usize,
    /// Seconds in-flight requests may run after Ctrl-C / SIGTERM before being cancelled.
    #[arg(long, default_value_t = 10.0, env = "LAMINA_GRACE")]
    pub grace: f64,
    /// Most connections open at once (each holds a file descriptor: raise
    /// `ulimit -n` with it). When all are taken, the one idle the longest is
    /// closed to make room, else the one that has spent the longest reading
    /// a request's head or body; with neither, new ones are closed as they
    /// arrive.
    #[arg(long, default_value_t = server::DEFAULT_MAX_CONNECTIONS, env = "LAMINA_MAX_CONNECTIONS")]
    pub max_connections: usize,
    /// Requests in flight per client address before 429 (0: no cap).
    #[arg(long, default_value_t = server::DEFAULT_MAX_CLIENT_REQUESTS, env = "LAMINA_MAX_CLIENT_REQUESTS")]
    pub max_client_requests: usize,
    /// Seconds to receive a request's headers; also how long a keep-alive
    /// connection may sit idle between requests.
    #[arg(long, default_value_t = 10.0, env = "LAMINA_HEADER_TIMEOUT")]
    pub header_timeout: f64,
    /// Seconds a request body may stall between two chunks (then 408).
    #[arg(long, default_value_t = 30.0, env = "LAMINA_BODY_TIMEOUT")]
    pub body_timeout: f64,
    /// Data parallelism: one engine (weights, KV pool, step loop) per listed
    /// GPU behind this one server, e.g. `0,1` or `all` (default: GPU 0 only).
    /// The router sends a request to the replica holding the longest cached
    /// prefix of its prompt unless that one is overloaded, else to the least
    /// loaded. Each replica gets `--kv-memory-gib` / `--kv-blocks` and
    /// `--max-queue` of its own. A GPU listed twice (`0,0`) hosts two
    /// replicas that share its SMs and memory: more throughput only where
    /// one engine leaves the GPU idle (small batches).
    #[arg(long, env = "LAMINA_DEVICES", conflicts_with = "data_parallel_size")]
    pub devices: Option<String>,
    /// Number of replicas (vLLM's `--data-parallel-size`): GPUs 0..N with
    /// CUDA; on the CPU (`--device cpu`) N CPU engines, for testing the
    /// routing without a GPU.
    #[arg(long, short = 'd', env = "LAMINA_DATA_PARALLEL_SIZE")]
    pub data_parallel_size: Option<usize>,
    /// Most tokens a reply gets when the request sets no `max_tokens` (or
    /// `max_completion_tokens` / `max_output_tokens`): the rest of the
    /// context when that is less. llama-server's `-n`; vLLM's default is
    /// the rest of the context. A request that sets one is held only to
    /// the context.
    #[arg(long, default_value_t = server::params::DEFAULT_MAX_TOKENS, env = "LAMINA_MAX_TOKENS_DEFAULT",
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_tokens_default: usize,
    /// Seconds the start-up warm-up may take: every step shape the engine
    /// will use (prefill token counts and decode batch sizes in powers of
    /// two) runs once on dummy tokens before the first request, so no
    /// request pays a shape's first-use cost (CUDA graph capture, kernel
    /// loading); then its KV and counters are dropped. Shapes left when
    /// the time is up are skipped; 0 turns the warm-up off [default: 30 on
    /// CUDA, 2 on the CPU].
    #[arg(long, env = "LAMINA_WARMUP_SECS")]
    pub warmup_secs: Option<f64>,
    /// Name clients use for the model (default: the --model id or directory name).
    #[arg(long, env = "LAMINA_SERVED_MODEL_NAME")]
    pub served_model_name: Option<String>,
    /// MiB the Responses API's in-memory store of responses (`store`,
    /// `previous_response_id`, `GET /v1/responses/{id}`) may hold; past it
    /// the oldest go first.
    #[arg(long, default_value_t = server::response_store::DEFAULT_STORE_BYTES >> 20, env = "LAMINA_RESPONSES_STORE_MIB")]
    pub responses_store_mib: usize,
    /// Seconds a stored response is kept.
    #[arg(long, default_value_t = server::response_store::DEFAULT_STORE_TTL.as_secs_f64(), env = "LAMINA_RESPONSES_STORE_TTL_SECS")]
    pub responses_store_ttl_secs: f64,
    /// Seconds `load_lora_adapter` may spend reading an adapter (a Hugging
    /// Face download included) before the request is refused.
    #[arg(long, default_value_t = server::DEFAULT_LORA_LOAD_TIMEOUT.as_secs_f64(), env = "LAMINA_LORA_LOAD_TIMEOUT_SECS")]
    pub lora_load_timeout_secs: f64,
    /// Split a chat reply's reasoning from its answer, as vLLM's flag of
    /// the same name: `qwen3` returns the text before `</think>` as
    /// `reasoning_content` (streamed: `delta.reasoning_content`) and the
    /// rest as `content`; a request turns thinking off with
    /// `chat_template_kwargs: {"enable_thinking": false}`. Unset: replies
    /// are returned as the model wrote them.
    #[arg(long, env = "LAMINA_REASONING_PARSER")]
    pub reasoning_parser: Option<server::reasoning::ReasoningParser>,
    /// How `/v1/embeddings` pools a text's final hidden states into one
    /// vector (then L2-normalised): `last` (the last token's state) or
    /// `mean` (the mean over every token).
    #[arg(long, default_value = "last", env = "LAMINA_POOLING")]
    pub pooling: engine::Pooling,
    #[command(flatten)]
    pub limits: crate::serve_limits::LimitArgs,
    #[command(flatten)]
    pub log: crate::serve_log::LogArgs,
    /// A models file (TOML when it ends in `.toml`, else JSON): a list of
    /// models (`[[models]]` tables), each with `source` and optionally
    /// `name`, `share` (its part of the KV budget), `device`, `lora`
    /// (`NAME=PATH` list), `max_model_len` and `preload`; instead of the
    /// model words.
    #[arg(long, env = "LAMINA_MODELS_FILE")]
    pub models_file: Option<std::path::PathBuf>,
    /// Most models loaded at once (0: no cap; llama-server's
    /// `--models-max`). A request naming an unloaded model past it first
    /// unloads the least recently used idle one.
    #[arg(
        long,
        visible_alias = "models-max",
        default_value_t = 0,
        env = "LAMINA_MAX_LOADED_MODELS"
    )]
    pub max_loaded_models: usize,
    /// How long a model stays loaded after its last request when the
    /// request sets no `keep_alive` (ollama's): seconds or a duration like
    /// `5m`, `0` to unload at once, negative to keep it [default: until
    /// unloaded].
    #[arg(long, env = "LAMINA_KEEP_ALIVE", allow_hyphen_values = true)]
    pub keep_alive: Option<String>,
    /// Do not load a model a request names when it is not loaded (409
    /// naming it instead); `POST /models/load` still loads.
    #[arg(long, env = "LAMINA_NO_MODELS_AUTOLOAD", value_parser = clap::builder::BoolishValueParser::new())]
    pub no_models_autoload: bool,
    /// The model (as `--model`; vLLM's `vllm serve MODEL`); more words
    /// serve more models from one server, each with its own engines and
    /// KV pool (`--kv-memory-gib` split evenly among them).
    #[arg(value_name = "MODEL")]
    pub model_word: Vec<String>,
}

/// The longest any duration flag may be, in seconds (a day): longer is a
/// typo, and past about 1.8e19 seconds no `Duration` holds it.
const MAX_FLAG_SECONDS: f64 = 86_400.0;

pub fn run(mut args: ServeArgs) -> Result<()> {
    // models load and unload here: their host buffers go back when freed
    runtime::tune_host_allocator();
    let mut words = std::mem::take(&mut args.model_word).into_iter();
    crate::habits::positional_model(&mut args.model, words.next())?;
    let more: Vec<String> = words.collect();
    if !(args.grace >= 0.0 && args.grace <= MAX_FLAG_SECONDS) {
        bail!(
            "invalid `--grace`: must be a number of seconds from 0 to {MAX_FLAG_SECONDS} (a day), got {}",
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
        ("--sse-keep-alive", args.sse_keep_alive),
        ("--responses-store-ttl-secs", args.responses_store_ttl_secs),
        ("--lora-load-timeout-secs", args.lora_load_timeout_secs),
    ] {
        if !(v > 0.0 && v <= MAX_FLAG_SECONDS) {
            bail!(
                "invalid `{flag}`: must be a positive number of seconds (at most {MAX_FLAG_SECONDS}, a day), got {v}"
            );
        }
    }
    if let Some(w) = args.warmup_secs
        && !(0.0..=MAX_FLAG_SECONDS).contains(&w)
    {
        bail!(
            "invalid `--warmup-secs`: must be a number of seconds from 0 to {MAX_FLAG_SECONDS} (a day), got {w}"
        );
    }
    args.limits.check()?;
    args.log.check()?;
    let api_keys = api_keys(&args)?;
    for origin in &args.allowed_origins {
        if let Err(why) = server::check_origin(origin) {
            bail!("invalid `--allowed-origins`: {why}");
        }
    }
    for host in &args.allowed_hosts {
        if let Err(why) = server::guard::check_allowed_host(host) {
            bail!("invalid `--allowed-hosts`: {why}");
        }
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
    let plan = replica_plan(&args)?;
    let policy = server::Policy {
        max_loaded: args.max_loaded_models,
        autoload: !args.no_models_autoload,
        keep_alive: match &args.keep_alive {
            Some(k) => server::keep_alive::parse(k)
                .map_err(|why| anyhow::anyhow!("invalid `--keep-alive`: {why}"))?,
            None => server::keep_alive::KeepAlive::Forever,
        },
    };
    let specs = crate::serve_models::specs(&args.model.model, &more, args.models_file.as_ref())?;
    let shares = crate::serve_models::shares(&specs)?;
    let several = specs.len() > 1;
    // read before any model loads: the models' shares of the GPU
    let gpu_budget = crate::serve_models::gpu_budget_at_start(&args.model, &plan, several);
    let mut registrations = Vec::new();
    let mut started: Vec<engine::Engine> = Vec::new();
    let (mut cuda, mut first_defaults) = (false, None);
    for (i, (spec, share)) in specs.iter().zip(shares).enumerate() {
        let model_args =
            crate::serve_models::model_args(&args.model, spec, share, (i, specs.len()))?;
        let gpu_share = crate::serve_models::gpu_share(gpu_budget, &model_args, share);
        let name = match (&spec.name, i) {
            (Some(n), _) => n.clone(),
            (None, 0) => args
                .served_model_name
                .clone()
                .unwrap_or_else(|| runtime::display_name(&spec.source)),
            (None, _) => runtime::display_name(&spec.source),
        };
        let load_plan = std::sync::Arc::new(crate::serve_models::LoadPlan {
            name: name.clone(),
            args: model_args,
            max_queue: args.max_queue,
            replicas: plan.clone(),
            reasoning_parser: args.reasoning_parser,
            lora_timeout: Duration::from_secs_f64(args.lora_load_timeout_secs),
            gpu_share,
            tokenizer: Default::default(),
        });
        let room = policy.max_loaded == 0 || i < policy.max_loaded;
        let served = if spec.preload.unwrap_or(true) && room {
            let rt = crate::serve_models::open(&load_plan)?;
            eprintln!(
                "lamina: `{name}` started in {:.1}s: {}",
                t0.elapsed().as_secs_f64(),
                rt.sizing
            );
            cuda |= rt.cuda;
            first_defaults.get_or_insert(rt.model.generation.sampling_defaults());
            let served = crate::serve_models::served(&load_plan, rt)?;
            (0..served.replicas.len())
                .filter_map(|r| served.replicas.engine(r).cloned())
                .for_each(|e| started.push(e));
            Some(served)
        } else {
            None
        };
        let loader = several.then(|| crate::serve_models::loader(load_plan));
        registrations.push(server::Registration {
            name,
            owned_by: "lamina".into(),
            served,
            loader,
        });
    }
    let warmup = args.warmup_secs.unwrap_or(if cuda {
        CUDA_WARMUP_SECS
    } else {
        CPU_WARMUP_SECS
    });
    warm_up(started.iter(), Duration::from_secs_f64(warmup))?;
    let count = started.len();
    let det = if !started.is_empty() && started.iter().all(|e| e.deterministic()) {
        " in deterministic mode (--deterministic)"
    } else {
        ""
    };
    if !several {
        args.log.start_stats(started.clone());
    }
    drop(started);
    let models =
        server::Models::new(policy, registrations).map_err(|why| anyhow::anyhow!("{why}"))?;
    let names = models.names();
    let mut cfg = server::ServerConfig {
        api_keys,
        allowed_origins: args.allowed_origins.clone(),
        allowed_hosts: args.allowed_hosts.clone(),
        sse_keep_alive: Duration::from_secs_f64(args.sse_keep_alive),
        body_limit: args.body_limit,
        grace: Duration::from_secs_f64(args.grace),
        max_connections: args.max_connections,
        header_timeout: Duration::from_secs_f64(args.header_timeout),
        body_timeout: Duration::from_secs_f64(args.body_timeout),
        max_client_requests: args.max_client_requests,
        responses_store_bytes: args.responses_store_mib.saturating_mul(1 << 20),
        responses_store_ttl: Duration::from_secs_f64(args.responses_store_ttl_secs),
        lora_load_timeout: Duration::from_secs_f64(args.lora_load_timeout_secs),
        default_max_tokens: args.max_tokens_default,
        reasoning_parser: args.reasoning_parser,
        pooling: args.pooling,
        ..server::ServerConfig::new(names.first().cloned().unwrap_or_default())
    };
    args.limits.apply(&mut cfg);
    let state = server::AppState::with_models(models, cfg);
    let model_id = names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ");
    runtime.block_on(async move {
        let local = listener.local_addr().map(|a| a.to_string()).unwrap_or(addr);
        let on = if count > 1 && !several {
            format!(" with {count} replicas")
        } else {
            String::new()
        };
        eprintln!("lamina: serving {model_id}{on}{det} on http://{local} (Ctrl-C to stop)");
        if let (Some(defaults), false) = (first_defaults, several) {
            eprintln!("lamina: requests that set no sampling fields get {defaults}");
        }
        server::serve(state, listener, server::shutdown_signal()).await
    })?;
    eprintln!("lamina: server stopped");
    Ok(())
}

/// `--warmup-secs` on CUDA when not given: graph captures and first
/// launches of every bucket take a few seconds at most.
const CUDA_WARMUP_SECS: f64 = 30.0;
/// `--warmup-secs` on the CPU when not given (its shapes have little
/// first-use cost; the warm-up checks them all the same).
const CPU_WARMUP_SECS: f64 = 2.0;

/// Warms every engine up at once, within `budget` (0: off), and says what
/// it did.
fn warm_up<'a>(engines: impl Iterator<Item = &'a engine::Engine>, budget: Duration) -> Result<()> {
    if budget.is_zero() {
        return Ok(());
    }
    let engines: Vec<&engine::Engine> = engines.collect();
    let reports = std::thread::scope(|s| {
        let joins: Vec<_> = engines
            .iter()
            .map(|e| s.spawn(move || e.warm_up(budget)))
            .collect();
        joins
            .into_iter()
            .map(|j| {
                j.join()
                    .map_err(|_| anyhow::anyhow!("the warm-up thread panicked"))
            })
            .collect::<Result<Vec<_>>>()
    })?;
    for (i, r) in reports.into_iter().enumerate() {
        let r = r.context("warming the engine up")?;
        let which = if engines.len() > 1 {
            format!(" (replica {i})")
        } else {
            String::new()
        };
        let cut = if r.warmed < r.planned {
            " (`--warmup-secs` ran out: raise it to warm the rest)"
        } else {
            ""
        };
        eprintln!("lamina: {r}{which}{cut}");
    }
    Ok(())
}

/// The replicas `--devices` / `--data-parallel-size` ask for (one engine by default).
fn replica_plan(args: &ServeArgs) -> Result<runtime::ReplicaPlan> {
    if let Some(n) = args.data_parallel_size {
        return Ok(runtime::ReplicaPlan::Count(n));
    }
    let Some(list) = args.devices.as_deref() else {
        return Ok(runtime::ReplicaPlan::ONE);
    };
    parse_devices(list, || {
        model::cuda::device_count().map_err(|why| anyhow::anyhow!("`--devices all`: {why}"))
    })
}

/// `all` (every GPU `count` reports) or a comma-separated list of GPU
/// ordinals; a GPU listed `k` times hosts `k` replicas (`0,0`).
fn parse_devices(
    list: &str,
    count: impl FnOnce() -> Result<usize>,
) -> Result<runtime::ReplicaPlan> {
    if list.trim() == "all" {
        return Ok(runtime::ReplicaPlan::Gpus((0..count()?).collect()));
    }
    let mut ids = Vec::new();
    for item in list.split(',') {
        let item = item.trim();
        let id: usize = item.parse().map_err(|_| {
            anyhow::anyhow!(
                "invalid `--devices {list}`: `{item}` is not a GPU number; use `all` or a list like `0,1`"
            )
        })?;
        ids.push(id);
    }
    Ok(runtime::ReplicaPlan::Gpus(ids))
}

/// The API keys of `--api-key` and `--api-key-file`, each checked; the
/// error names the flag (and the file's line), never the key.
fn api_keys(args: &ServeArgs) -> Result<Vec<String>> {
    let mut keys = Vec::new();
    for k in &args.api_key {
        if let Err(why) = server::check_api_key(k) {
            bail!("invalid `--api-key` (or LAMINA_API_KEY): {why}");
        }
        keys.push(k.clone());
    }
    if let Some(path) = &args.api_key_file {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read `--api-key-file` {}", path.display()))?;
        for (i, line) in text.lines().enumerate() {
            let k = line.trim();
            if k.is_empty() || k.starts_with('#') {
                continue;
            }
            if let Err(why) = server::check_api_key(k) {
                bail!(
                    "invalid key on line {} of `--api-key-file` {}: {why}",
                    i + 1,
                    path.display()
                );
            }
            keys.push(k.to_string());
        }
        if keys.is_empty() {
            bail!(
                "`--api-key-file` {} holds no key: the server would run without one",
                path.display()
            );
        }
    }
    Ok(keys)
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

#[cfg(test)]
mod tests {
    use super::*;
    use runtime::ReplicaPlan;

    #[test]
    fn devices_parse_lists_and_all() {
        let none = || -> Result<usize> { bail!("no GPU here") };
        assert_eq!(
            parse_devices("0,1", none).unwrap(),
            ReplicaPlan::Gpus(vec![0, 1])
        );
        assert_eq!(
            parse_devices(" 2 ", none).unwrap(),
            ReplicaPlan::Gpus(vec![2])
        );
        assert_eq!(
            parse_devices("all", || Ok(3)).unwrap(),
            ReplicaPlan::Gpus(vec![0, 1, 2])
        );
        let err = |s: &str| parse_devices(s, none).unwrap_err().to_string();
        assert!(
            err("0,x").contains("`x` is not a GPU number"),
            "{}",
            err("0,x")
        );
        assert_eq!(
            parse_devices("0,0,1", none).unwrap(),
            ReplicaPlan::Gpus(vec![0, 0, 1])
        );
        assert!(err("all").contains("no GPU here"));
        assert!(err("").contains("is not a GPU number"));
    }
}
