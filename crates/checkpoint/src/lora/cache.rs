//! Loads of identical adapter files share one adapter in memory.
//!
//! Contract: [`AdapterCache::load`] hashes the two files' bytes (SHA-256 of
//! the config and the weights); while an adapter loaded from files of the
//! same hash is alive (held by anyone), a load returns that same `Arc`
//! without converting anything again. The cache holds only weak
//! references: an adapter dropped by everyone else is freed, and its entry
//! goes at the next load.
//!
//! Costs: one hash of the files per load; O(entries) to prune.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, Weak};

use contract::LoraAdapter;
use contract::config::ModelConfig;
use sha2::{Digest, Sha256};

use super::{LoadLimits, LoraLoadError, open_files, parse_files};

/// Adapters by the hash of their files (see the module doc).
#[derive(Default)]
pub struct AdapterCache {
    entries: Mutex<HashMap<[u8; 32], Weak<LoraAdapter>>>,
}

impl AdapterCache {
    /// The adapter in `dir` for model `c` within `limits`, shared with any
    /// live adapter read from identical files.
    pub fn load(
        &self,
        dir: &Path,
        c: &ModelConfig,
        limits: &LoadLimits,
    ) -> Result<Arc<LoraAdapter>, LoraLoadError> {
        let files = open_files(dir, c, limits.max_rank)?;
        let mut h = Sha256::new();
        h.update((files.config.len() as u64).to_le_bytes());
        h.update(files.config.as_bytes());
        h.update(&files.weights[..]);
        let key: [u8; 32] = h.finalize().into();
        if let Some(a) = self.get(&key) {
            return Ok(a);
        }
        let adapter = Arc::new(parse_files(&files, c, limits)?);
        let mut g = self.lock();
        g.retain(|_, w| w.strong_count() > 0);
        // another load of the same files may have won the race: share its
        if let Some(a) = g.get(&key).and_then(Weak::upgrade) {
            return Ok(a);
        }
        g.insert(key, Arc::downgrade(&adapter));
        Ok(adapter)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Weak<LoraAdapter>>> {
        match self.entries.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    fn get(&self, key: &[u8; 32]) -> Option<Arc<LoraAdapter>> {
        self.lock().get(key).and_then(Weak::upgrade)
    }

    /// Entries whose adapter is still alive.
    pub fn live(&self) -> usize {
        self.lock()
            .values()
            .filter(|w| w.strong_count() > 0)
            .count()
    }
}
