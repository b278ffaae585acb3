//! Prefix-cache side of [`KvManager`]: planning an admission (longest
//! verified chain of cached full blocks), registering full computed blocks
//! (`mark_computed`), lookups, eviction and clearing. Every sequence lives
//! in a namespace (`admit_in`: 0 for the base model, a LoRA adapter's key
//! otherwise): a first block's hash chains from the namespace and every
//! cached block records it, so a hit is verified within one namespace.
//!
//! Registration walks a sequence's newly full computed blocks in order. A
//! block whose (hash, parent link, tokens) already names another cached
//! block is replaced in the table by that block (dedup: same KV content,
//! the duplicate goes back to the pool), so every registered block's parent
//! link names the block the cache holds for the preceding prefix.
//! Costs: planning O(len) hashing + O(hits x B) comparisons; registration
//! O(new full blocks x B); clearing O(cached + sequences).

use crate::manager::{KvManager, Seq};
use crate::pool::{BlockPool, BlockRef};
use crate::{BlockHasher, KvError, SeqId};

/// What admitting a prompt would take.
#[derive(Debug, Default)]
pub(crate) struct AdmitPlan {
    /// Reused cached blocks with their chained hashes, in prompt order.
    pub(crate) hits: Vec<(u32, u64)>,
    /// Hits that are currently unreferenced (reviving takes them off the
    /// allocatable count).
    pub(crate) revived: usize,
    /// Fresh blocks to allocate.
    pub(crate) new_blocks: usize,
}

impl AdmitPlan {
    /// Allocatable blocks the admission consumes.
    pub(crate) fn needed(&self) -> usize {
        self.new_blocks + self.revived
    }
}

impl KvManager {
    /// The admission plan for `tokens`; `can_admit` and `admit` both use it.
    pub(crate) fn plan_admit(&self, tokens: &[u32], ns: u64) -> AdmitPlan {
        let mut plan = AdmitPlan::default();
        if self.prefix_cache {
            let bs = self.block_size;
            // Only blocks wholly inside tokens[..len - 1]: the last token is always computed.
            let limit = tokens.len().saturating_sub(1) / bs;
            let mut parent: Option<(u64, BlockRef)> = None;
            for chunk in tokens.chunks_exact(bs).take(limit) {
                let h = (self.hasher)(parent.map(|p| p.0).or(root(ns)), chunk);
                let Some(b) = self.pool.lookup(h, parent.map(|p| p.1), chunk, ns) else {
                    break;
                };
                if self.pool.ref_count(b) == Some(0) {
                    plan.revived += 1;
                }
                plan.hits.push((b, h));
                parent = Some((h, self.pool.block_ref(b)));
            }
        }
        plan.new_blocks = self.blocks_for(tokens.len()) - plan.hits.len();
        plan
    }

    /// Tokens of `tokens` that [`KvManager::admit`] would reuse from the
    /// prefix cache now (a multiple of `B`, at most `len - 1`). Read-only.
    pub fn cached_prefix_len(&self, tokens: &[u32]) -> usize {
        self.plan_admit(tokens, 0).hits.len() * self.block_size
    }

    /// The cached blocks [`KvManager::admit`] would reuse for `tokens` now,
    /// in order (each verified: recorded tokens and parent link). Read-only.
    pub fn cached_prefix_blocks(&self, tokens: &[u32]) -> Vec<u32> {
        self.plan_admit(tokens, 0)
            .hits
            .into_iter()
            .map(|(b, _)| b)
            .collect()
    }

    /// Records that the KV of `seq`'s first `num_computed` tokens is written
    /// (a smaller count than already known is ignored). With the prefix
    /// cache on, newly full computed blocks enter it; a block whose content
    /// the cache already holds in another block is swapped for that block
    /// in `seq`'s table (re-read tables after this call; the step metadata
    /// is rebuilt every step anyway).
    pub fn mark_computed(&mut self, seq: SeqId, num_computed: usize) -> Result<(), KvError> {
        let Self {
            seqs,
            pool,
            block_size,
            prefix_cache,
            hasher,
            window,
        } = self;
        let s = seqs.get_mut(&seq).ok_or(KvError::UnknownSeq(seq))?;
        if num_computed > s.tokens.len() {
            return Err(KvError::ComputedBeyondLength {
                seq,
                computed: num_computed,
                len: s.tokens.len(),
            });
        }
        s.computed = s.computed.max(num_computed);
        if *prefix_cache {
            register_full_blocks(s, pool, *hasher, *block_size);
        }
        // after registration: a released block is cached (evictable) first
        crate::window::release_outside(s, pool, *window, *block_size);
        Ok(())
    }

    /// Evicts up to `max` cached-evictable blocks (least recently freed
    /// first) to the free list; returns how many. O(evicted).
    pub fn evict_cached(&mut self, max: usize) -> usize {
        self.pool.evict(max)
    }

    /// Empties the prefix cache: unreferenced cached blocks become free,
    /// blocks in use stay with their sequences (their full computed blocks
    /// are offered to the cache again at their next `mark_computed`, but for
    /// a sequence that released blocks outside its window: its chain from
    /// the first block is gone, so only its later blocks are offered, and
    /// no lookup reaches them).
    pub fn clear_prefix_cache(&mut self) {
        self.pool.clear_cache();
        let (bs, cache) = (self.block_size, self.prefix_cache);
        for s in self.seqs.values_mut() {
            s.registered = if cache && s.released > 0 {
                s.computed / bs
            } else {
                0
            };
        }
    }
}

/// Offers `s`'s full computed blocks past `s.registered` to the cache.
fn register_full_blocks(s: &mut Seq, pool: &mut BlockPool, hasher: BlockHasher, bs: usize) {
    let full = s.computed / bs;
    while s.registered < full {
        let i = s.registered;
        let chunk = &s.tokens[i * bs..(i + 1) * bs];
        let h = match s.hashes.get(i) {
            Some(&h) => h,
            None => {
                let h = hasher(i.checked_sub(1).map(|j| s.hashes[j]).or(root(s.ns)), chunk);
                s.hashes.push(h);
                h
            }
        };
        let b = s.table[i];
        if !pool.is_cached(b) {
            let parent = i.checked_sub(1).map(|j| pool.block_ref(s.table[j]));
            match pool.lookup(h, parent, chunk, s.ns) {
                Some(c) => {
                    pool.incref(c);
                    pool.decref(b);
                    s.table[i] = c;
                }
                None => pool.register(b, h, parent, chunk, s.ns),
            }
        }
        s.registered += 1;
    }
}

/// The parent hash of a first block in namespace `ns` (none for the base
/// model's, so its keys are the plain chain).
fn root(ns: u64) -> Option<u64> {
    (ns != 0).then_some(ns)
}
