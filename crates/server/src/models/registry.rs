//! The registry's state machine (see the parent module's doc): entries by
//! name, leases counting running requests, loads and unloads on tasks of
//! the async runtime, waits on one watch channel.

use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::{LoadError, Loader, Memory, Policy, Registration, Served, State};
use crate::error::ApiError;
use crate::keep_alive::KeepAlive;
use crate::metrics::Metrics;

/// The models of one server (cheap to clone: one shared registry).
#[derive(Clone)]
pub struct Models {
    shared: Arc<Shared>,
}

struct Shared {
    inner: Mutex<Vec<Entry>>,
    /// Bumped at every state change; waiters subscribe before they look.
    changed: watch::Sender<u64>,
    policy: Policy,
    /// The runtime that runs loads, unloads and keep-alive timers (the first
    /// caller's).
    rt: OnceLock<tokio::runtime::Handle>,
}

enum Slot {
    Loaded(Arc<Served>),
    Loading,
    Unloading,
    Unloaded,
}

struct Entry {
    name: String,
    owned_by: String,
    slot: Slot,
    loader: Option<Loader>,
    /// Its latency histograms and counters, kept across reloads.
    metrics: Arc<Metrics>,
    /// Leases alive (requests running or being prepared).
    running: usize,
    last_used: Instant,
    keep_alive: KeepAlive,
    /// Bumped when the model goes idle: a keep-alive timer acts only if
    /// this is still its stamp.
    idle_stamp: u64,
    /// Load attempts; the last failed one's number and error.
    loads: u64,
    failed: Option<(u64, LoadError)>,
    /// The last loaded instance's context and memory, for cards of an
    /// unloaded model.
    max_context: usize,
    memory: Memory,
}

/// What `/v1/models`, `/models` and `lamina ps` show of one model.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    pub name: String,
    pub owned_by: String,
    pub state: State,
    /// Requests running on it.
    pub running: usize,
    /// Time since its last request ended (zero while one runs).
    pub idle: Duration,
    /// Bytes held (zero unless loaded), or of the last load.
    pub memory: Memory,
    pub max_context: usize,
    /// Its LoRA adapters (while loaded).
    pub loras: Vec<String>,
    /// Its engines' replicas (while loaded).
    pub replicas: usize,
    /// The keep-alive in effect: seconds, `None` forever.
    pub keep_alive: Option<f64>,
}

/// A request's hold on a loaded model: the model is not shut down before
/// every lease (and clone) is dropped.
#[derive(Clone)]
pub struct Lease {
    inner: Arc<LeaseInner>,
}

struct LeaseInner {
    served: Arc<Served>,
    name: String,
    lora: Option<String>,
    metrics: Arc<Metrics>,
    registry: Models,
}

impl Lease {
    /// The model's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The LoRA adapter the request named, if it named one.
    pub fn lora(&self) -> Option<String> {
        self.inner.lora.clone()
    }

    /// The model's metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }
}

impl std::ops::Deref for Lease {
    type Target = Served;
    fn deref(&self) -> &Served {
        &self.inner.served
    }
}

impl Drop for LeaseInner {
    fn drop(&mut self) {
        self.registry.release(&self.name);
    }
}

impl Models {
    /// A registry with `policy` and the models of `list`, in order (the
    /// first is the default). Fails on a name given twice, an empty name,
    /// or a model that is neither loaded nor loadable.
    pub fn new(policy: Policy, list: Vec<Registration>) -> Result<Models, String> {
        let models = Models {
            shared: Arc::new(Shared {
                inner: Mutex::new(Vec::new()),
                changed: watch::Sender::new(0),
                policy,
                rt: OnceLock::new(),
            }),
        };
        for r in list {
            models.register(r)?;
        }
        Ok(models)
    }

    /// A registry of one loaded model that is never unloaded.
    pub fn single(name: String, served: Served) -> Models {
        let entry = entry(name, "lamina".into(), Some(served), None);
        Models {
            shared: Arc::new(Shared {
                inner: Mutex::new(vec![entry]),
                changed: watch::Sender::new(0),
                policy: Policy::default(),
                rt: OnceLock::new(),
            }),
        }
    }

    fn register(&self, r: Registration) -> Result<(), String> {
        if r.name.is_empty() {
            return Err("a model's name is empty".into());
        }
        if r.served.is_none() && r.loader.is_none() {
            return Err(format!("model `{}` is neither loaded nor loadable", r.name));
        }
        let mut inner = self.lock();
        if let Some(owner) = owner_of(&inner, &r.name) {
            return Err(clash(&r.name, &owner));
        }
        if let Some(s) = &r.served {
            check_adapters(&inner, &r.name, s)?;
        }
        inner.push(entry(r.name, r.owned_by, r.served, r.loader));
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Entry>> {
        // a panic while holding the lock leaves the entries consistent
        // (each change is one assignment), so a poisoned lock is used as is
        self.shared.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn bump(&self) {
        self.shared.changed.send_modify(|v| *v = v.wrapping_add(1));
    }

    fn runtime(&self) -> Option<tokio::runtime::Handle> {
        if let Some(h) = self.shared.rt.get() {
            return Some(h.clone());
        }
        let h = tokio::runtime::Handle::try_current().ok()?;
        Some(self.shared.rt.get_or_init(|| h).clone())
    }

    /// The registered names, in order.
    pub fn names(&self) -> Vec<String> {
        self.lock().iter().map(|e| e.name.clone()).collect()
    }

    /// The model a name belongs to: itself, or the model one of whose
    /// loaded adapters it names.
    pub fn owner_of(&self, name: &str) -> Option<String> {
        owner_of(&self.lock(), name)
    }

    /// The loaded instance of `name` (the default model with `None`), if
    /// loaded, without holding it.
    pub fn loaded(&self, name: Option<&str>) -> Option<Arc<Served>> {
        let inner = self.lock();
        let e = match name {
            None => inner.first(),
            Some(n) => inner.iter().find(|e| e.name == n),
        }?;
        match &e.slot {
            Slot::Loaded(s) => Some(s.clone()),
            _ => None,
        }
    }

    /// Every loaded model with its name and metrics, in order.
    pub fn all_loaded(&self) -> Vec<(String, Arc<Served>)> {
        self.lock()
            .iter()
            .filter_map(|e| match &e.slot {
                Slot::Loaded(s) => Some((e.name.clone(), s.clone())),
                _ => None,
            })
            .collect()
    }

    /// Every model's name, metrics and loaded instance (if loaded).
    pub fn metrics(&self) -> Vec<(String, Arc<Metrics>, Option<Arc<Served>>)> {
        self.lock()
            .iter()
            .map(|e| {
                let s = match &e.slot {
                    Slot::Loaded(s) => Some(s.clone()),
                    _ => None,
                };
                (e.name.clone(), e.metrics.clone(), s)
            })
            .collect()
    }

    /// What `/models` shows.
    pub fn info(&self) -> Vec<ModelInfo> {
        let now = Instant::now();
        self.lock()
            .iter()
            .map(|e| {
                let (state, served) = match &e.slot {
                    Slot::Loaded(s) => (State::Loaded, Some(s)),
                    Slot::Loading => (State::Loading, None),
                    Slot::Unloading => (State::Unloading, None),
                    Slot::Unloaded => (State::Unloaded, None),
                };
                ModelInfo {
                    name: e.name.clone(),
                    owned_by: e.owned_by.clone(),
                    state,
                    running: e.running,
                    idle: if e.running > 0 {
                        Duration::ZERO
                    } else {
                        now.saturating_duration_since(e.last_used)
                    },
                    memory: e.memory,
                    max_context: e.max_context,
                    loras: served.map(|s| s.loras()).unwrap_or_default(),
                    replicas: served.map_or(0, |s| s.replicas.len()),
                    keep_alive: match e.keep_alive {
                        KeepAlive::For(d) => Some(d.as_secs_f64()),
                        KeepAlive::Forever => None,
                    },
                }
            })
            .collect()
    }

    /// A lease on the model `model` names (module doc), loading it first
    /// when allowed; `keep_alive` is the request's.
    pub async fn acquire(
        &self,
        model: Option<&str>,
        keep_alive: Option<KeepAlive>,
    ) -> Result<Lease, ApiError> {
        let mut seen_load: Option<u64> = None;
        loop {
            let mut rx = self.shared.changed.subscribe();
            {
                let mut inner = self.lock();
                let (i, lora) = self.find(&inner, model)?;
                let e = &mut inner[i];
                match &e.slot {
                    Slot::Loaded(s) => {
                        let served = s.clone();
                        e.running += 1;
                        e.keep_alive = keep_alive.unwrap_or(self.shared.policy.keep_alive);
                        return Ok(Lease {
                            inner: Arc::new(LeaseInner {
                                served,
                                name: e.name.clone(),
                                lora,
                                metrics: e.metrics.clone(),
                                registry: self.clone(),
                            }),
                        });
                    }
                    Slot::Loading => seen_load = Some(e.loads),
                    Slot::Unloading | Slot::Unloaded if !self.shared.policy.autoload => {
                        return Err(not_loaded(&e.name, &e.slot));
                    }
                    Slot::Unloading => {}
                    Slot::Unloaded => seen_load = self.load_unloaded(&mut inner, i, seen_load)?,
                }
            }
            if rx.changed().await.is_err() {
                return Err(ApiError::shutting_down());
            }
        }
    }

    /// The entry `model` names (and the adapter, when it names one), or the
    /// 404 listing what is served.
    fn find(
        &self,
        inner: &[Entry],
        model: Option<&str>,
    ) -> Result<(usize, Option<String>), ApiError> {
        let Some(m) = model else {
            return if inner.is_empty() {
                Err(unknown(inner, "(none)"))
            } else {
                Ok((0, None))
            };
        };
        if let Some(i) = inner.iter().position(|e| e.name == m) {
            return Ok((i, None));
        }
        for (i, e) in inner.iter().enumerate() {
            if let Slot::Loaded(s) = &e.slot
                && s.loras().iter().any(|n| n == m)
            {
                return Ok((i, Some(m.to_string())));
            }
        }
        Err(unknown(inner, m))
    }

    /// Loads `model` (explicitly: with autoload off too) and waits until it
    /// is loaded.
    pub async fn load(&self, model: &str) -> Result<(), ApiError> {
        let mut seen_load: Option<u64> = None;
        loop {
            let mut rx = self.shared.changed.subscribe();
            {
                let mut inner = self.lock();
                let Some(i) = inner.iter().position(|e| e.name == model) else {
                    return Err(unknown(&inner, model));
                };
                let e = &inner[i];
                match &e.slot {
                    Slot::Loaded(_) => return Ok(()),
                    Slot::Loading => seen_load = Some(e.loads),
                    Slot::Unloading => {}
                    Slot::Unloaded => seen_load = self.load_unloaded(&mut inner, i, seen_load)?,
                }
            }
            if rx.changed().await.is_err() {
                return Err(ApiError::shutting_down());
            }
        }
    }

    /// Starts loading entry `i` when a place is free (else starts evicting
    /// the least recently used idle model, or waits for one to idle);
    /// returns the load's number once started.
    /// For an unloaded entry `i` a waiter has seen loading (load number
    /// `seen_load`): that load's error if it failed, else a new load begun.
    fn load_unloaded(
        &self,
        inner: &mut [Entry],
        i: usize,
        seen_load: Option<u64>,
    ) -> Result<Option<u64>, ApiError> {
        if let (Some(seen), Some((n, err))) = (seen_load, &inner[i].failed)
            && *n == seen
        {
            return Err(err.to_api());
        }
        self.begin_load(inner, i)
    }

    fn begin_load(&self, inner: &mut [Entry], i: usize) -> Result<Option<u64>, ApiError> {
        let Some(loader) = inner[i].loader.clone() else {
            return Err(not_loaded(&inner[i].name, &inner[i].slot));
        };
        let Some(rt) = self.runtime() else {
            return Err(ApiError::internal("no async runtime to load the model on"));
        };
        let max = self.shared.policy.max_loaded;
        let held = inner
            .iter()
            .filter(|e| !matches!(e.slot, Slot::Unloaded))
            .count();
        if max > 0 && held >= max {
            let victim = inner
                .iter()
                .enumerate()
                .filter(|(_, e)| e.running == 0 && e.loader.is_some())
                .filter(|(_, e)| matches!(e.slot, Slot::Loaded(_)))
                .min_by_key(|(_, e)| e.last_used)
                .map(|(j, _)| j);
            if let Some(j) = victim {
                tracing::info!(model = %inner[j].name, for_model = %inner[i].name, "evicting the least recently used model");
                self.begin_unload(inner, j);
            }
            return Ok(None);
        }
        let e = &mut inner[i];
        e.slot = Slot::Loading;
        e.loads += 1;
        let load = e.loads;
        let name = e.name.clone();
        self.bump();
        let me = self.clone();
        rt.spawn(async move {
            let t0 = Instant::now();
            let result = tokio::task::spawn_blocking(move || loader())
                .await
                .unwrap_or_else(|e| {
                    Err(LoadError::Failed {
                        model: name.clone(),
                        reason: format!("the loader panicked: {e}"),
                    })
                });
            me.finish_load(i, load, result, t0.elapsed());
        });
        Ok(Some(load))
    }

    fn finish_load(&self, i: usize, load: u64, result: Result<Served, LoadError>, took: Duration) {
        let mut inner = self.lock();
        let result = result.and_then(|s| {
            check_adapters(&inner, &inner[i].name, &s).map_err(|reason| {
                s.replicas.shutdown();
                LoadError::Failed {
                    model: inner[i].name.clone(),
                    reason,
                }
            })?;
            Ok(s)
        });
        let e = &mut inner[i];
        match result {
            Ok(s) => {
                tracing::info!(model = %e.name, secs = took.as_secs_f64(), "model loaded");
                e.max_context = s.max_context();
                e.memory = s.memory;
                e.slot = Slot::Loaded(Arc::new(s));
                e.last_used = Instant::now();
                e.failed = None;
            }
            Err(err) => {
                tracing::warn!(model = %e.name, error = %err, "model load failed");
                e.slot = Slot::Unloaded;
                e.failed = Some((load, err));
            }
        }
        drop(inner);
        self.bump();
    }

    /// Unloads `model`: later requests wait for a reload or get a 409; its
    /// running requests finish first. Returns its state after the call
    /// (`unloading` while requests finish).
    pub fn unload(&self, model: &str) -> Result<State, ApiError> {
        let mut inner = self.lock();
        let Some(i) = inner.iter().position(|e| e.name == model) else {
            return Err(unknown(&inner, model));
        };
        let e = &inner[i];
        match &e.slot {
            _ if e.loader.is_none() => Err(ApiError {
                code: Some("model_pinned"),
                ..ApiError::from_status(
                    axum::http::StatusCode::CONFLICT,
                    format!(
                        "Model `{model}` cannot be unloaded: this server has no way to load it again."
                    ),
                )
            }),
            Slot::Loading => Err(conflict(model, "is loading; unload it once it has loaded")),
            Slot::Unloading => Ok(State::Unloading),
            Slot::Unloaded => Ok(State::Unloaded),
            Slot::Loaded(_) => {
                self.begin_unload(&mut inner, i);
                Ok(if inner[i].running == 0 {
                    State::Unloaded
                } else {
                    State::Unloading
                })
            }
        }
    }

    /// Marks entry `i` unloading and, on a task, waits for its requests to
    /// end, shuts its engines down and frees it. Without a runtime it is
    /// done here (no request can be running then).
    fn begin_unload(&self, inner: &mut [Entry], i: usize) {
        let Slot::Loaded(served) = std::mem::replace(&mut inner[i].slot, Slot::Unloading) else {
            return;
        };
        tracing::info!(model = %inner[i].name, running = inner[i].running, "unloading model");
        self.bump();
        let me = self.clone();
        match self.runtime() {
            Some(rt) => {
                rt.spawn(async move { me.finish_unload(i, served).await });
            }
            None => {
                served.replicas.shutdown();
                drop(served);
                inner[i].slot = Slot::Unloaded;
                self.bump();
            }
        }
    }

    async fn finish_unload(&self, i: usize, served: Arc<Served>) {
        loop {
            let mut rx = self.shared.changed.subscribe();
            if self.lock()[i].running == 0 {
                break;
            }
            if rx.changed().await.is_err() {
                break;
            }
        }
        let done = tokio::task::spawn_blocking(move || {
            served.replicas.shutdown();
            drop(served);
        })
        .await;
        if done.is_err() {
            tracing::error!("shutting an unloaded model's engines down panicked");
        }
        let mut inner = self.lock();
        inner[i].slot = Slot::Unloaded;
        tracing::info!(model = %inner[i].name, "model unloaded");
        drop(inner);
        self.bump();
    }

    /// A lease ended: the model may go idle (and its keep-alive start).
    fn release(&self, name: &str) {
        let mut inner = self.lock();
        let Some(i) = inner.iter().position(|e| e.name == name) else {
            return;
        };
        let e = &mut inner[i];
        e.running = e.running.saturating_sub(1);
        e.last_used = Instant::now();
        if e.running == 0 && e.loader.is_some() && matches!(e.slot, Slot::Loaded(_)) {
            e.idle_stamp += 1;
            if let KeepAlive::For(after) = e.keep_alive {
                if after.is_zero() {
                    self.begin_unload(&mut inner, i);
                } else if let Some(rt) = self.runtime() {
                    let (me, stamp) = (self.clone(), e.idle_stamp);
                    rt.spawn(async move {
                        tokio::time::sleep(after).await;
                        me.expire(i, stamp);
                    });
                }
            }
        }
        drop(inner);
        self.bump();
    }

    /// A keep-alive ran out: unloads entry `i` if it stayed idle since.
    fn expire(&self, i: usize, stamp: u64) {
        let mut inner = self.lock();
        let e = &inner[i];
        if e.running == 0 && e.idle_stamp == stamp && matches!(e.slot, Slot::Loaded(_)) {
            tracing::info!(model = %e.name, "keep-alive over");
            self.begin_unload(&mut inner, i);
        }
    }

    /// Shuts every loaded model's engines down (blocking), for the
    /// server's shutdown.
    pub fn shutdown(&self) {
        for (_, s) in self.all_loaded() {
            s.replicas.shutdown();
        }
    }
}

fn entry(name: String, owned_by: String, served: Option<Served>, loader: Option<Loader>) -> Entry {
    let (max_context, memory) = served
        .as_ref()
        .map_or((0, Memory::default()), |s| (s.max_context(), s.memory));
    Entry {
        name,
        owned_by,
        slot: served.map_or(Slot::Unloaded, |s| Slot::Loaded(Arc::new(s))),
        loader,
        metrics: Arc::default(),
        running: 0,
        last_used: Instant::now(),
        keep_alive: KeepAlive::Forever,
        idle_stamp: 0,
        loads: 0,
        failed: None,
        max_context,
        memory,
    }
}

/// The model `name` belongs to (itself, or the one holding an adapter of
/// that name).
fn owner_of(inner: &[Entry], name: &str) -> Option<String> {
    inner.iter().find_map(|e| {
        let adapter = match &e.slot {
            Slot::Loaded(s) => s.loras().iter().any(|n| n == name),
            _ => false,
        };
        (e.name == name || adapter).then(|| e.name.clone())
    })
}

/// Refuses a model whose adapters' names are taken by another model or
/// its adapters.
fn check_adapters(inner: &[Entry], model: &str, s: &Served) -> Result<(), String> {
    for a in s.loras() {
        if a == model {
            return Err(format!("LoRA adapter `{a}` has the name of its own model"));
        }
        if let Some(owner) = owner_of(inner, &a).filter(|o| o != model) {
            return Err(clash(&a, &owner));
        }
    }
    Ok(())
}

fn clash(name: &str, owner: &str) -> String {
    if name == owner {
        format!("the name `{name}` is taken: a model of that name is already served")
    } else {
        format!("the name `{name}` is taken: it names a LoRA adapter of model `{owner}`")
    }
}

fn unknown(inner: &[Entry], model: &str) -> ApiError {
    let names: Vec<String> = inner.iter().map(|e| format!("`{}`", e.name)).collect();
    ApiError {
        message: format!(
            "The model `{model}` does not exist. This server serves {}.",
            names.join(", ")
        ),
        ..ApiError::unknown_model(model)
    }
}

fn conflict(model: &str, why: &str) -> ApiError {
    ApiError {
        param: Some("model".into()),
        code: Some("model_not_loaded"),
        ..ApiError::from_status(
            axum::http::StatusCode::CONFLICT,
            format!("Model `{model}` {why}."),
        )
    }
}

fn not_loaded(model: &str, slot: &Slot) -> ApiError {
    let now = match slot {
        Slot::Unloading => "is being unloaded",
        _ => "is not loaded",
    };
    conflict(
        model,
        &format!(
            "{now} and this server does not load models on demand: load it with `POST /models/load`"
        ),
    )
}
