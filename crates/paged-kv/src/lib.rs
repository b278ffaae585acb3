//! paged-kv: all KV-cache bookkeeping of lamina, for both backends and the
//! scheduler. No CUDA, no tensors: it hands out block ids and slot numbers;
//! the backends own the memory those numbers index.
//!
//! # Model
//! The KV pool is `num_blocks` physical blocks of `block_size` (`B`) token
//! slots each; token position `p` of a sequence lives in slot
//! `table[p / B] * B + p % B`. A [`KvManager`] keeps, for every sequence, its
//! known tokens, its block table and how many of its tokens have their KV
//! computed. Every block is in exactly one of three states:
//! - **free**: refcount 0, not in the prefix cache, on the free stack;
//! - **in use**: refcount >= 1, held by that many block-table entries;
//! - **cached-evictable**: refcount 0 but still registered in the prefix
//!   cache, on an LRU list; it can be revived by a prefix hit, or evicted
//!   (least recently freed first) when an allocation finds the free stack empty.
//!
//! # Invariants (checked by [`KvManager::check_invariants`] and the property tests)
//! 1. free + in use + cached-evictable = `num_blocks`.
//! 2. Every block's refcount equals the number of block-table entries holding
//!    it (but a sequence's released leading entries, under a sliding window:
//!    stale ids that hold nothing).
//! 3. A sequence's *writable* blocks (those holding positions at or past its
//!    computed count) have refcount 1 and are not in the prefix cache, so no
//!    block is ever writable by two sequences. Only full, computed blocks are
//!    shared (by prefix hits).
//! 4. A block is registered in the prefix cache iff the hash index maps its
//!    hash to it; a registered block records its `B` token ids and a link to
//!    the exact parent block instance (`id`, generation) whose KV preceded it.
//!    A hit must match the tokens *and* the parent link, so a hash collision
//!    can never serve wrong KV.
//! 5. With every sequence freed and the cache cleared, every block is free.
//!
//! # Costs (`n` = tokens passed, `b` = blocks of the sequence)
//! - allocate / free one block, revive a cached block, evict one: O(1)
//!   (free stack + intrusive LRU list + hash index).
//! - [`KvManager::can_admit`] / [`KvManager::admit`]: O(n) hashing plus one
//!   hash lookup and one `B`-token comparison per full prompt block; they share
//!   one planning routine, so they agree exactly.
//! - [`KvManager::can_append`] O(1); [`KvManager::append`] O(n + new blocks).
//! - [`KvManager::can_truncate`] O(1); [`KvManager::truncate`] O(dropped
//!   tokens + released blocks).
//! - [`KvManager::mark_computed`]: O(newly full blocks x `B`).
//! - freeing a sequence ([`KvManager::free`]): O(b).
//! - a slot lookup ([`KvManager::slot`]): O(1).
//! - [`KvManager::clear_prefix_cache`]: O(cached blocks + sequences).
//! - Memory: O(num_blocks) per-block state, plus `num_blocks x B` recorded
//!   token ids when the prefix cache is on; each sequence keeps its tokens.
//!
//! # Scheduler usage
//! 1. `can_admit(tokens)` then `admit(seq, tokens)`: returns the tokens reused
//!    from the prefix cache (whole blocks, never the last token); run the
//!    positions from there to `len`, in one step or in chunks.
//! 2. After each step, `mark_computed(seq, tokens_now_written)`. Newly full
//!    computed blocks enter the cache; one whose content is already cached in
//!    another block is swapped for it (dedup), so read tables again before
//!    building the next step (the engine's batch builder,
//!    `contract::StepBuilder`, takes each table from [`KvManager::block_table`]).
//! 3. Decode: `can_append(seq, 1)` then `append(seq, &[token])`; when out of
//!    blocks, preempt (`free`, re-`admit` prompt + generated tokens later).
//! 4. Speculative decoding: `append(seq, drafts)`, run them, then
//!    `truncate(seq, verified_len)` drops the rejected ones (only tokens not
//!    yet marked computed can go, so no block hashed into the prefix cache
//!    ever holds an unverified token) and `mark_computed` the verified ones.
//! 5. `free(seq)` when done.
//!
//! # Sliding windows
//! A manager built [`KvManager::with_window`] (every layer of the model
//! attends within the window) gives a sequence's blocks wholly before the
//! window of its next position back to the pool at each `mark_computed`, so
//! a long generation holds O(window) blocks; a model with some global layer
//! frees nothing (the `window` module's doc says why and what stays true).

mod check;
mod error;
mod hash;
mod lru;
mod manager;
mod pool;
mod prefix;
mod sizing;
mod window;

pub use error::KvError;
pub use hash::{BlockHasher, default_block_hash};
pub use manager::KvManager;
pub use sizing::{blocks_for_budget, bytes_per_block};

/// Identifies a sequence; chosen by the caller (the engine's request id).
pub type SeqId = u64;

/// Tokens per block when the configuration does not say otherwise.
pub const DEFAULT_BLOCK_SIZE: usize = 16;

/// Shape and policy of a KV pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvConfig {
    /// Physical blocks in the pool.
    pub num_blocks: usize,
    /// Token slots per block (`B`); at least 1.
    pub block_size: usize,
    /// Whether full computed blocks are kept for reuse by later prompts.
    pub enable_prefix_cache: bool,
}

impl KvConfig {
    /// `num_blocks` blocks of [`DEFAULT_BLOCK_SIZE`] tokens, prefix cache on.
    pub fn new(num_blocks: usize) -> Self {
        Self {
            num_blocks,
            block_size: DEFAULT_BLOCK_SIZE,
            enable_prefix_cache: true,
        }
    }
}
