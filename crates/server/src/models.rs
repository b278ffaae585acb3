//! The models behind one server: each with its own engines (replicas), KV
//! pool, tokenizer and sampling defaults ([`Served`]), registered by name in
//! one [`Models`] registry that loads and unloads them at run time.
//!
//! A request's `model` picks its model ([`Models::acquire`]): a model's
//! name, or a LoRA adapter loaded on one (adapter and model names share one
//! namespace: a clash is refused by name at registration, at a model's load
//! and at an adapter's load); no `model` is the first model registered.
//! The request holds a [`Lease`] while it runs; the model is not shut down
//! before every lease is gone.
//!
//! States: `loaded`, `loading`, `unloading` (its running requests finish,
//! then its engines shut down and its memory is freed) and `unloaded`. A
//! request naming an unloaded model loads it when [`Policy::autoload`] is
//! on (it waits for the load), else gets a 409 naming the model. At most
//! [`Policy::max_loaded`] models hold memory at once: a load past it first
//! unloads the least recently used idle model (waiting for one to become
//! idle when all are busy). A model is unloaded once idle for its
//! keep-alive (ollama's `keep_alive`, [`crate::keep_alive`]): the last
//! request's, else [`Policy::keep_alive`].
//!
//! The server reads no files: a model is loaded by the [`Loader`] the
//! binary registers with it (run on the blocking pool), which opens the
//! model from the local store and starts its engines.
//!
//! Costs: every acquire and release takes one mutex for O(models) work;
//! waits are on one watch channel bumped at every state change.

mod registry;

use std::sync::Arc;

use contract::{GenerationConfig, LoraAdapter};
use tokenizer::Tokenizer;

use crate::error::ApiError;
use crate::keep_alive::KeepAlive;
use crate::reasoning::ReasoningParser;
use crate::replicas::Replicas;

pub use registry::{Lease, ModelInfo, Models};

/// Reads an adapter from a `lora_path` (a directory or a Hugging Face repo
/// id), checked against the model; the error is one line naming the
/// problem.
pub type LoraLoader = Arc<dyn Fn(&str) -> Result<Arc<LoraAdapter>, String> + Send + Sync>;

/// Loads a model and starts its engines (blocking; run off the async
/// workers).
pub type Loader = Arc<dyn Fn() -> Result<Served, LoadError> + Send + Sync>;

/// One loaded model: what its requests need.
pub struct Served {
    /// Its engines and the router over them.
    pub replicas: Replicas,
    pub tokenizer: Arc<Tokenizer>,
    /// Sampling defaults (`generation_config.json`) for fields a request leaves out.
    pub defaults: GenerationConfig,
    /// Splits chat replies' reasoning into `reasoning_content`.
    pub reasoning_parser: Option<ReasoningParser>,
    /// Reads adapters for `load_lora_adapter` (none: adapters cannot be
    /// loaded at run time on this model).
    pub lora_loader: Option<LoraLoader>,
    /// What it holds in memory.
    pub memory: Memory,
}

impl Served {
    /// A model of `replicas` with nothing else set beyond its tokenizer.
    pub fn new(replicas: Replicas, tokenizer: Arc<Tokenizer>) -> Served {
        Served {
            replicas,
            tokenizer,
            defaults: GenerationConfig::default(),
            reasoning_parser: None,
            lora_loader: None,
            memory: Memory::default(),
        }
    }

    /// The longest prompt + completion a request may have (on every replica).
    pub fn max_context(&self) -> usize {
        self.replicas.max_sequence()
    }

    /// The LoRA adapters loaded on it (every replica holds the same ones).
    pub fn loras(&self) -> Vec<String> {
        self.replicas
            .engine(0)
            .map(|e| e.loras().names())
            .unwrap_or_default()
    }
}

/// Bytes a loaded model holds (over all its replicas).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Memory {
    pub weights: u64,
    pub kv: u64,
}

impl Memory {
    pub fn total(&self) -> u64 {
        self.weights.saturating_add(self.kv)
    }
}

/// Why a model could not be loaded.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LoadError {
    /// Its weights and KV pool need more memory than is free.
    #[error(
        "model `{model}` does not fit: it needs {} of {where_} memory and {} is free{hint}",
        mib(*needed),
        mib(*free)
    )]
    DoesNotFit {
        model: String,
        where_: &'static str,
        needed: u64,
        free: u64,
        /// What to do about it (starts with `; `), or empty.
        hint: String,
    },
    /// Anything else, in one line.
    #[error("cannot load model `{model}`: {reason}")]
    Failed { model: String, reason: String },
}

impl LoadError {
    /// The HTTP error a request naming the model gets.
    pub fn to_api(&self) -> ApiError {
        match self {
            LoadError::DoesNotFit { .. } => ApiError {
                code: Some("model_does_not_fit"),
                ..ApiError::from_status(
                    axum::http::StatusCode::INSUFFICIENT_STORAGE,
                    self.to_string(),
                )
            },
            LoadError::Failed { .. } => ApiError {
                code: Some("model_load_failed"),
                ..ApiError::internal(self.to_string())
            },
        }
    }
}

/// Bytes as MiB, for messages.
pub fn mib(bytes: u64) -> String {
    format!("{:.0} MiB", bytes as f64 / (1u64 << 20) as f64)
}

/// How the registry loads and unloads.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    /// Most models holding memory at once (loaded, loading or unloading);
    /// 0: no cap.
    pub max_loaded: usize,
    /// A request naming an unloaded model loads it (else: 409).
    pub autoload: bool,
    /// How long a model stays loaded after its last request when the
    /// request gave no `keep_alive`.
    pub keep_alive: KeepAlive,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            max_loaded: 0,
            autoload: true,
            keep_alive: KeepAlive::Forever,
        }
    }
}

/// A model's state as `/v1/models` and `/models` show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Loaded,
    Loading,
    Unloading,
    Unloaded,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Loaded => "loaded",
            State::Loading => "loading",
            State::Unloading => "unloading",
            State::Unloaded => "unloaded",
        }
    }
}

/// A model to register: its name, owner, loader and whether to load it now.
pub struct Registration {
    pub name: String,
    /// `owned_by` in `/v1/models`.
    pub owned_by: String,
    /// Already loaded (started by the binary before serving), if so.
    pub served: Option<Served>,
    /// Loads it again after an unload; `None`: it cannot be unloaded.
    pub loader: Option<Loader>,
}

/// Appends the models' own series: `lamina_model_loaded` (1 loaded, 0
/// not), `lamina_model_requests_running` (leases held) and
/// `lamina_model_memory_bytes` (weights and KV pool while loaded), each
/// labelled `model_name`.
pub fn render_state(out: &mut String, models: &[ModelInfo]) {
    use std::fmt::Write;
    type Value = fn(&ModelInfo) -> u64;
    let series: [(&str, &str, Value); 3] = [
        (
            "lamina_model_loaded",
            "1 while the model is loaded, else 0.",
            |m| u64::from(m.state == State::Loaded),
        ),
        (
            "lamina_model_requests_running",
            "Requests holding the model (running or being prepared).",
            |m| m.running as u64,
        ),
        (
            "lamina_model_memory_bytes",
            "Bytes the loaded model holds: weights and KV pool of every replica.",
            |m| {
                if m.state == State::Loaded {
                    m.memory.total()
                } else {
                    0
                }
            },
        ),
    ];
    for (name, help, value) in series {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} gauge");
        for m in models {
            let label = crate::metrics::escape(&m.name);
            let _ = writeln!(out, "{name}{{model_name=\"{label}\"}} {}", value(m));
        }
    }
}
