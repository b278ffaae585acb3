//! LoRA adapters in the engine: the registry of loaded adapters (by name)
//! and the backend's adapter slots (at most `EngineConfig::max_loras`
//! resident at once).
//!
//! Contract:
//! - [`LoraRegistry`] holds the loaded adapters, at most
//!   [`LoraLimits::max_loaded`] of them taking at most
//!   [`LoraLimits::max_bytes`] together (an adapter loaded under several
//!   names, one `Arc`, counts once); a load past either is refused naming
//!   the flag. Unloading drops the registry's reference: once no request
//!   or slot holds the adapter, its memory is freed. Each has a key unique
//!   for the engine's life (never reused, so an adapter reloaded under the
//!   same name is another adapter: its K/V never meets the old one's in the
//!   prefix cache, whose namespace the key is). `submit` resolves a
//!   request's adapter name here once; the request then holds the adapter
//!   itself, so unloading never changes what a submitted request runs.
//! - [`LoraSlots`] (the scheduler's) gives a sequence a slot when it is
//!   admitted: the slot already holding its adapter, else an empty one,
//!   else the least recently used slot no running sequence uses (its
//!   adapter evicted). With every slot in use the sequence stays waiting.
//!   A slot is released when its sequence finishes or is preempted; a
//!   released slot whose adapter was unloaded is emptied. Slot changes are
//!   queued ([`LoraSlots::take_loads`]) for the loop to hand the backend
//!   (`Backend::set_lora`) before the step that needs them.
//!
//! Costs: O(slots) per admission or release of an adapter sequence, O(1)
//! for the base model's; memory: the adapters, shared (`Arc`) between the
//! registry, the requests and the backend's slots.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use contract::LoraAdapter;

/// The adapter a request runs with, resolved at submit.
#[derive(Debug, Clone)]
pub struct SeqLora {
    pub name: Arc<str>,
    /// Unique for the engine's life (the prefix-cache namespace).
    pub key: u64,
    pub adapter: Arc<LoraAdapter>,
}

/// Why an adapter could not be loaded or unloaded.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LoraRegistryError {
    #[error(
        "{loaded} LoRA adapters are loaded, as many as --max-loaded-loras {limit} allows; unload one first or raise the flag"
    )]
    TooMany { loaded: usize, limit: usize },
    #[error(
        "LoRA adapter `{name}` takes {need} MiB; with {used} MiB of adapters loaded that passes --max-lora-memory-mib {limit_mib}; unload one first or raise the flag"
    )]
    TooLarge {
        name: String,
        need: u64,
        used: u64,
        limit_mib: u64,
    },
    #[error("a LoRA adapter named `{0}` is already loaded")]
    AlreadyLoaded(String),
    #[error("no LoRA adapter named `{0}` is loaded")]
    NotLoaded(String),
    #[error("the LoRA adapter name `{0}` is taken by the base model")]
    BaseName(String),
    #[error("the LoRA adapter name must not be empty")]
    EmptyName,
    #[error("LoRA adapter `{name}`: {reason}")]
    Invalid { name: String, reason: String },
    #[error(
        "LoRA adapters are off on this engine (--max-loras 0); start it with --max-loras N or --lora NAME=PATH"
    )]
    Disabled,
}

/// Default `--max-loaded-loras`.
pub const DEFAULT_MAX_LOADED_LORAS: usize = 32;
/// Default `--max-lora-memory-mib`.
pub const DEFAULT_MAX_LORA_MEMORY_MIB: u64 = 4096;

/// Bounds on the loaded adapters (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoraLimits {
    /// Adapters loaded at once (`--max-loaded-loras`).
    pub max_loaded: usize,
    /// Bytes they take together (`--max-lora-memory-mib`).
    pub max_bytes: u64,
}

impl Default for LoraLimits {
    fn default() -> Self {
        LoraLimits {
            max_loaded: DEFAULT_MAX_LOADED_LORAS,
            max_bytes: DEFAULT_MAX_LORA_MEMORY_MIB << 20,
        }
    }
}

/// The bytes `a`'s weights take (f32).
pub fn adapter_bytes(a: &LoraAdapter) -> u64 {
    a.layers
        .iter()
        .flat_map(|l| l.pairs.iter().flatten())
        .map(|p| (p.a.len() + p.b.len()) as u64 * 4)
        .sum()
}

#[derive(Default)]
struct RegistryInner {
    loaded: BTreeMap<String, SeqLora>,
    /// Requests submitted per adapter name (kept across unloads).
    requests: BTreeMap<String, u64>,
}

impl RegistryInner {
    /// Bytes of the loaded adapters, each `Arc` once.
    fn bytes(&self) -> u64 {
        let mut seen: Vec<*const LoraAdapter> = Vec::with_capacity(self.loaded.len());
        let mut total = 0;
        for l in self.loaded.values() {
            let p = Arc::as_ptr(&l.adapter);
            if !seen.contains(&p) {
                seen.push(p);
                total += adapter_bytes(&l.adapter);
            }
        }
        total
    }

    fn check_count(&self, limits: &LoraLimits) -> Result<(), LoraRegistryError> {
        if self.loaded.len() >= limits.max_loaded {
            return Err(LoraRegistryError::TooMany {
                loaded: self.loaded.len(),
                limit: limits.max_loaded,
            });
        }
        Ok(())
    }
}

/// The loaded adapters (see the module doc).
#[derive(Default)]
pub struct LoraRegistry {
    inner: Mutex<RegistryInner>,
    next_key: AtomicU64,
    limits: LoraLimits,
}

impl LoraRegistry {
    /// An empty registry bounded by `limits`.
    pub fn with_limits(limits: LoraLimits) -> Self {
        LoraRegistry {
            limits,
            ..Default::default()
        }
    }

    /// Refuses when no further adapter may be loaded (the count): checked
    /// before reading an adapter's files.
    pub fn check_room(&self) -> Result<(), LoraRegistryError> {
        self.lock().check_count(&self.limits)
    }

    /// Bytes the loaded adapters take, each shared adapter once.
    pub fn bytes(&self) -> u64 {
        self.lock().bytes()
    }

    fn lock(&self) -> MutexGuard<'_, RegistryInner> {
        match self.inner.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Registers `adapter` as `name` (checked by the caller); returns its key.
    pub(crate) fn insert(
        &self,
        name: &str,
        adapter: Arc<LoraAdapter>,
    ) -> Result<u64, LoraRegistryError> {
        let mut g = self.lock();
        if g.loaded.contains_key(name) {
            return Err(LoraRegistryError::AlreadyLoaded(name.into()));
        }
        g.check_count(&self.limits)?;
        let shared = g.loaded.values().any(|l| Arc::ptr_eq(&l.adapter, &adapter));
        let need = if shared { 0 } else { adapter_bytes(&adapter) };
        let used = g.bytes();
        if used.saturating_add(need) > self.limits.max_bytes {
            return Err(LoraRegistryError::TooLarge {
                name: name.into(),
                need: need.div_ceil(1 << 20),
                used: used.div_ceil(1 << 20),
                limit_mib: self.limits.max_bytes >> 20,
            });
        }
        let key = self.next_key.fetch_add(1, Ordering::Relaxed) + 1;
        g.loaded.insert(
            name.into(),
            SeqLora {
                name: name.into(),
                key,
                adapter,
            },
        );
        Ok(key)
    }

    /// Unregisters `name`.
    pub(crate) fn remove(&self, name: &str) -> Result<SeqLora, LoraRegistryError> {
        self.lock()
            .loaded
            .remove(name)
            .ok_or_else(|| LoraRegistryError::NotLoaded(name.into()))
    }

    /// The adapter named `name`, counted as one more request.
    pub(crate) fn resolve(&self, name: &str) -> Option<SeqLora> {
        let mut g = self.lock();
        let l = g.loaded.get(name).cloned()?;
        *g.requests.entry(name.into()).or_default() += 1;
        Some(l)
    }

    /// Whether the adapter with `key` is still loaded.
    pub(crate) fn is_loaded(&self, key: u64) -> bool {
        self.lock().loaded.values().any(|l| l.key == key)
    }

    /// The loaded adapters' names, sorted.
    pub fn names(&self) -> Vec<String> {
        self.lock().loaded.keys().cloned().collect()
    }

    /// Requests submitted per adapter name since start, sorted by name.
    pub fn requests(&self) -> Vec<(String, u64)> {
        self.lock()
            .requests
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect()
    }
}

/// One backend slot.
#[derive(Debug, Clone, Default)]
struct Slot {
    held: Option<SeqLora>,
    /// Running sequences using it.
    users: usize,
    /// When it was last acquired (a counter).
    last_used: u64,
}

/// The backend's adapter slots, as the scheduler assigns them.
pub(crate) struct LoraSlots {
    slots: Vec<Slot>,
    clock: u64,
    /// Slot changes for the backend, in order.
    loads: Vec<(u32, Option<Arc<LoraAdapter>>)>,
    registry: Arc<LoraRegistry>,
}

impl LoraSlots {
    pub(crate) fn new(n: usize, registry: Arc<LoraRegistry>) -> Self {
        LoraSlots {
            slots: vec![Slot::default(); n],
            clock: 0,
            loads: Vec::new(),
            registry,
        }
    }

    /// The slot (1-based) for a sequence of adapter `l`, or `None` when
    /// every slot is used by running sequences of other adapters.
    pub(crate) fn acquire(&mut self, l: &SeqLora) -> Option<u32> {
        self.clock += 1;
        let k = match self
            .slots
            .iter()
            .position(|s| s.held.as_ref().is_some_and(|h| h.key == l.key))
        {
            Some(k) => k,
            None => {
                let k = self
                    .slots
                    .iter()
                    .position(|s| s.held.is_none())
                    .or_else(|| {
                        (0..self.slots.len())
                            .filter(|&k| self.slots[k].users == 0)
                            .min_by_key(|&k| self.slots[k].last_used)
                    })?;
                self.slots[k].held = Some(l.clone());
                self.loads.push((k as u32 + 1, Some(l.adapter.clone())));
                k
            }
        };
        let s = &mut self.slots[k];
        s.users += 1;
        s.last_used = self.clock;
        Some(k as u32 + 1)
    }

    /// Whether [`LoraSlots::acquire`] would give `l` a slot now.
    pub(crate) fn can_acquire(&self, l: &SeqLora) -> bool {
        self.slots
            .iter()
            .any(|s| s.users == 0 || s.held.as_ref().is_some_and(|h| h.key == l.key))
    }

    /// A sequence stops using slot `slot` (finished or preempted).
    pub(crate) fn release(&mut self, slot: u32) {
        let Some(s) = (slot as usize)
            .checked_sub(1)
            .and_then(|k| self.slots.get_mut(k))
        else {
            return;
        };
        s.users = s.users.saturating_sub(1);
        if s.users == 0
            && let Some(h) = &s.held
            && !self.registry.is_loaded(h.key)
        {
            s.held = None;
            self.loads.push((slot, None));
        }
    }

    /// Empties every idle slot whose adapter is no longer loaded (after an
    /// unload).
    pub(crate) fn sweep(&mut self) {
        for (k, s) in self.slots.iter_mut().enumerate() {
            if s.users == 0
                && let Some(h) = &s.held
                && !self.registry.is_loaded(h.key)
            {
                s.held = None;
                self.loads.push((k as u32 + 1, None));
            }
        }
    }

    /// The slot changes since the last call, for `Backend::set_lora`.
    pub(crate) fn take_loads(&mut self) -> Vec<(u32, Option<Arc<LoraAdapter>>)> {
        std::mem::take(&mut self.loads)
    }

    /// Slots.
    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    /// Slots holding an adapter.
    pub(crate) fn resident(&self) -> usize {
        self.slots.iter().filter(|s| s.held.is_some()).count()
    }

    /// Slots in use by running sequences, per adapter name.
    pub(crate) fn users(&self) -> HashMap<Arc<str>, usize> {
        let mut m = HashMap::new();
        for s in &self.slots {
            if let (Some(h), true) = (&s.held, s.users > 0) {
                *m.entry(h.name.clone()).or_default() += s.users;
            }
        }
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ad(reg: &LoraRegistry, name: &str) -> SeqLora {
        let a = Arc::new(LoraAdapter {
            rank: 1,
            scale: 1.0,
            layers: vec![],
        });
        reg.insert(name, a).unwrap();
        reg.resolve(name).unwrap()
    }

    fn sized(floats: usize) -> Arc<LoraAdapter> {
        let mut layer = contract::lora::LoraLayer::default();
        layer.pairs[0] = Some(contract::lora::LoraPair {
            a: vec![0.0; floats / 2],
            b: vec![0.0; floats - floats / 2],
        });
        Arc::new(LoraAdapter {
            rank: 1,
            scale: 1.0,
            layers: vec![layer],
        })
    }

    #[test]
    fn loads_past_the_count_or_memory_limit_are_refused_naming_the_flag() {
        let reg = LoraRegistry::with_limits(LoraLimits {
            max_loaded: 3,
            max_bytes: 3 << 20,
        });
        let mib = sized(1 << 18); // 1 MiB of f32
        reg.insert("a", mib.clone()).unwrap();
        // the same adapter under another name costs nothing more
        reg.insert("a2", mib.clone()).unwrap();
        assert_eq!(reg.bytes(), 1 << 20);
        let e = reg.insert("big", sized(3 << 18)).unwrap_err();
        assert!(e.to_string().contains("--max-lora-memory-mib 3"), "{e}");
        reg.insert("b", sized(1 << 18)).unwrap();
        assert!(reg.check_room().is_err());
        let e = reg.insert("c", sized(1)).unwrap_err();
        assert!(e.to_string().contains("--max-loaded-loras 3"), "{e}");
        assert_eq!(reg.names(), ["a", "a2", "b"]);
        // unloading frees the room and drops the registry's reference
        let weak = Arc::downgrade(&mib);
        drop(mib);
        reg.remove("a").unwrap();
        reg.remove("a2").unwrap();
        assert!(weak.upgrade().is_none(), "the unloaded adapter is freed");
        assert_eq!(reg.bytes(), 1 << 20);
        reg.insert("c", sized(1)).unwrap();
    }

    #[test]
    fn slots_are_shared_evicted_lru_when_idle_and_refused_when_busy() {
        let reg = Arc::new(LoraRegistry::default());
        let (a, b, c) = (ad(&reg, "a"), ad(&reg, "b"), ad(&reg, "c"));
        let mut s = LoraSlots::new(2, reg.clone());
        assert_eq!(s.acquire(&a), Some(1));
        assert_eq!(s.acquire(&a), Some(1)); // shared, loaded once
        assert_eq!(s.acquire(&b), Some(2));
        assert_eq!(s.take_loads().len(), 2);
        assert!(!s.can_acquire(&c));
        assert_eq!(s.acquire(&c), None);
        s.release(2); // b idle: evicted for c
        assert!(s.can_acquire(&c));
        assert_eq!(s.acquire(&c), Some(2));
        let loads = s.take_loads();
        assert_eq!(loads.len(), 1);
        assert_eq!(loads[0].0, 2);
        // least recently used idle slot goes first
        s.release(1);
        s.release(1);
        s.release(2);
        assert_eq!(s.acquire(&b), Some(1));
        assert_eq!(s.resident(), 2);
        assert_eq!(
            reg.requests(),
            vec![("a".into(), 1), ("b".into(), 1), ("c".into(), 1)]
        );
        // unloading: an idle slot empties at the sweep, a busy one at release
        reg.remove("c").unwrap();
        reg.remove("b").unwrap();
        s.take_loads();
        s.sweep();
        assert_eq!(
            s.take_loads()
                .iter()
                .map(|l| (l.0, l.1.is_some()))
                .collect::<Vec<_>>(),
            vec![(2, false)]
        );
        assert_eq!(s.resident(), 1);
        s.release(1);
        assert_eq!(
            s.take_loads()
                .iter()
                .map(|l| (l.0, l.1.is_some()))
                .collect::<Vec<_>>(),
            vec![(1, false)]
        );
        assert_eq!(s.resident(), 0);
        assert_eq!(reg.names(), vec!["a".to_string()]);
        assert!(matches!(
            reg.remove("b"),
            Err(LoraRegistryError::NotLoaded(_))
        ));
        assert!(matches!(
            reg.insert("a", a.adapter.clone()),
            Err(LoraRegistryError::AlreadyLoaded(_))
        ));
    }
}
