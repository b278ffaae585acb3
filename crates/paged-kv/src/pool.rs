//! The physical block pool: refcounts, a free stack, and the prefix-cache
//! index with its LRU of cached-evictable blocks.
//!
//! States (see the crate doc): free (refcount 0, on `free`), in use
//! (refcount >= 1), cached-evictable (refcount 0, registered, on `lru`).
//! A block is registered iff `index[entry.hash] == block`. Registration
//! bumps the block's generation, so a [`BlockRef`] names one exact content
//! instance of a block id; children store their parent's `BlockRef`.
//!
//! Costs: `allocate`, `incref`, `decref`, `lookup`, `register`,
//! `unregister`: O(1) (plus O(B) token copy/compare). `clear_cache`:
//! O(cached). `check`: O(N). Memory: O(N x B) `u32` for recorded tokens
//! when the prefix cache is on.

use std::collections::HashMap;

use crate::lru::LruList;

/// One content instance of a physical block: its id and the generation it
/// had when that content was registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BlockRef {
    pub(crate) id: u32,
    pub(crate) generation: u64,
}

/// Prefix-cache identity of a registered block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CacheEntry {
    hash: u64,
    parent: Option<BlockRef>,
    /// The namespace of its K/V (see `prefix.rs`).
    ns: u64,
}

#[derive(Debug, Clone)]
pub(crate) struct BlockPool {
    block_size: usize,
    ref_count: Vec<u32>,            // [N]
    generation: Vec<u64>,           // [N]
    entry: Vec<Option<CacheEntry>>, // [N], Some while registered
    tokens: Vec<u32>,               // [N * B] recorded tokens (empty when caching is off)
    free: Vec<u32>,                 // free stack
    lru: LruList,                   // cached-evictable blocks, least recent first
    index: HashMap<u64, u32>,       // hash -> registered block
}

impl BlockPool {
    /// `num_blocks` (< `u32::MAX`) free blocks of `block_size` tokens. Block 0
    /// is handed out first.
    pub(crate) fn new(num_blocks: usize, block_size: usize, cache: bool) -> Self {
        Self {
            block_size,
            ref_count: vec![0; num_blocks],
            generation: vec![0; num_blocks],
            entry: vec![None; num_blocks],
            tokens: if cache {
                vec![0; num_blocks * block_size]
            } else {
                Vec::new()
            },
            free: (0..num_blocks as u32).rev().collect(),
            lru: LruList::new(num_blocks),
            index: HashMap::new(),
        }
    }

    pub(crate) fn num_blocks(&self) -> usize {
        self.ref_count.len()
    }

    /// Free plus cached-evictable: what can be allocated now.
    pub(crate) fn num_allocatable(&self) -> usize {
        self.free.len() + self.lru.len()
    }

    pub(crate) fn num_evictable(&self) -> usize {
        self.lru.len()
    }

    pub(crate) fn ref_count(&self, b: u32) -> Option<u32> {
        self.ref_count.get(b as usize).copied()
    }

    pub(crate) fn is_cached(&self, b: u32) -> bool {
        matches!(self.entry.get(b as usize), Some(Some(_)))
    }

    pub(crate) fn block_ref(&self, b: u32) -> BlockRef {
        BlockRef {
            id: b,
            generation: self.generation[b as usize],
        }
    }

    /// Recorded token ids of a registered block.
    pub(crate) fn recorded_tokens(&self, b: u32) -> Option<&[u32]> {
        self.is_cached(b).then(|| self.block_tokens(b))
    }

    fn block_tokens(&self, b: u32) -> &[u32] {
        let start = b as usize * self.block_size;
        &self.tokens[start..start + self.block_size]
    }

    /// Takes a free block, else evicts the least recently used cached one.
    /// The block comes back with refcount 1. `None` when neither exists.
    pub(crate) fn allocate(&mut self) -> Option<u32> {
        let b = match self.free.pop() {
            Some(b) => b,
            None => {
                let b = self.lru.pop_front()?;
                self.forget(b);
                b
            }
        };
        self.ref_count[b as usize] = 1;
        Some(b)
    }

    /// Adds a reference; a cached-evictable block is revived (leaves the LRU).
    /// Must not be called on a free (unregistered, unreferenced) block.
    pub(crate) fn incref(&mut self, b: u32) {
        let k = b as usize;
        if self.ref_count[k] == 0 {
            let revived = self.lru.remove(b);
            debug_assert!(revived, "incref of free block {b}");
        }
        self.ref_count[k] += 1;
    }

    /// Drops a reference; at zero the block becomes cached-evictable (most
    /// recent) if registered, else free.
    pub(crate) fn decref(&mut self, b: u32) {
        let k = b as usize;
        debug_assert!(self.ref_count[k] > 0, "decref of unreferenced block {b}");
        self.ref_count[k] = self.ref_count[k].saturating_sub(1);
        if self.ref_count[k] == 0 {
            if self.entry[k].is_some() {
                self.lru.push_back(b);
            } else {
                self.free.push(b);
            }
        }
    }

    /// The registered block under `hash` if its recorded tokens, parent
    /// link and namespace equal `tokens`, `parent` and `ns` (a verified
    /// hit), else `None`.
    pub(crate) fn lookup(
        &self,
        hash: u64,
        parent: Option<BlockRef>,
        tokens: &[u32],
        ns: u64,
    ) -> Option<u32> {
        let &c = self.index.get(&hash)?;
        let e = self.entry[c as usize]?;
        (e.parent == parent && e.ns == ns && self.block_tokens(c) == tokens).then_some(c)
    }

    /// Registers in-use block `b` as holding `tokens` after `parent`, under
    /// `hash`. A different block already under `hash` (which then failed
    /// verification) is unregistered first. Bumps `b`'s generation.
    pub(crate) fn register(
        &mut self,
        b: u32,
        hash: u64,
        parent: Option<BlockRef>,
        tokens: &[u32],
        ns: u64,
    ) {
        debug_assert!(
            self.ref_count[b as usize] > 0,
            "register of unreferenced block {b}"
        );
        if let Some(&c) = self.index.get(&hash) {
            self.unregister(c);
        }
        self.unregister(b);
        let k = b as usize;
        self.generation[k] += 1;
        self.entry[k] = Some(CacheEntry { hash, parent, ns });
        self.tokens[k * self.block_size..(k + 1) * self.block_size].copy_from_slice(tokens);
        self.index.insert(hash, b);
    }

    /// Removes `b` from the prefix cache; if it was cached-evictable it becomes free.
    pub(crate) fn unregister(&mut self, b: u32) {
        if self.forget(b) && self.lru.remove(b) {
            self.free.push(b);
        }
    }

    /// Clears `b`'s cache entry and index slot; returns whether it had one.
    fn forget(&mut self, b: u32) -> bool {
        let Some(e) = self.entry[b as usize].take() else {
            return false;
        };
        if self.index.get(&e.hash) == Some(&b) {
            self.index.remove(&e.hash);
        }
        true
    }

    /// Evicts up to `max` cached-evictable blocks, least recent first; returns how many.
    pub(crate) fn evict(&mut self, max: usize) -> usize {
        let mut n = 0;
        while n < max {
            let Some(b) = self.lru.pop_front() else { break };
            self.forget(b);
            self.free.push(b);
            n += 1;
        }
        n
    }

    /// Unregisters every cached block (in-use ones stay in use, uncached).
    pub(crate) fn clear_cache(&mut self) {
        let cached: Vec<u32> = self.index.values().copied().collect();
        for b in cached {
            self.unregister(b);
        }
    }

    /// Checks the pool's internal structure; O(N). The message names the block.
    pub(crate) fn check(&self) -> Result<(), String> {
        let n = self.num_blocks();
        let mut on_free = vec![false; n];
        for &b in &self.free {
            let k = b as usize;
            if k >= n || on_free[k] {
                return Err(format!(
                    "block {b} is on the free stack twice or out of range"
                ));
            }
            on_free[k] = true;
            if self.ref_count[k] != 0 || self.entry[k].is_some() || self.lru.contains(b) {
                return Err(format!(
                    "free block {b} is referenced, cached or on the LRU"
                ));
            }
        }
        let lru: Vec<u32> = self.lru.iter().collect();
        if lru.len() != self.lru.len() {
            return Err(format!(
                "LRU length {} but {} linked",
                self.lru.len(),
                lru.len()
            ));
        }
        for &b in &lru {
            if self.ref_count[b as usize] != 0 || self.entry[b as usize].is_none() {
                return Err(format!("LRU block {b} is referenced or not cached"));
            }
        }
        for (k, &is_free) in on_free.iter().enumerate() {
            let b = k as u32;
            if self.ref_count[k] == 0 && !is_free && !self.lru.contains(b) {
                return Err(format!(
                    "unreferenced block {b} is neither free nor cached-evictable"
                ));
            }
            if let Some(e) = self.entry[k]
                && self.index.get(&e.hash) != Some(&b)
            {
                return Err(format!("cached block {b} is not indexed under its hash"));
            }
        }
        for (&h, &b) in &self.index {
            if self
                .entry
                .get(b as usize)
                .copied()
                .flatten()
                .map(|e| e.hash)
                != Some(h)
            {
                return Err(format!(
                    "index maps hash {h:#x} to block {b}, which is not cached under it"
                ));
            }
        }
        Ok(())
    }
}
