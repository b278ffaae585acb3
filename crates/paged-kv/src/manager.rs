//! [`KvManager`]: per-sequence block tables over a [`BlockPool`], with the
//! scheduler's check/act pairs (`can_admit`/`admit`, `can_append`/`append`).
//! Each `can_*` answers exactly whether the act succeeds.
//! Acts either fully succeed or change nothing. Prefix-cache operations live
//! in `prefix.rs`, the invariant checker in `check.rs`; costs are listed in
//! the crate doc.

use std::collections::HashMap;

use crate::hash::{BlockHasher, default_block_hash};
use crate::pool::BlockPool;
use crate::{KvConfig, KvError, SeqId};

/// Bookkeeping of one sequence.
#[derive(Debug, Clone)]
pub(crate) struct Seq {
    /// `[len]` every known token (prompt and generated).
    pub(crate) tokens: Vec<u32>,
    /// `[ceil(len / B)]` physical block of each logical block.
    pub(crate) table: Vec<u32>,
    /// Leading tokens whose KV is written (or reused from the prefix cache).
    pub(crate) computed: usize,
    /// Chained hashes of leading full blocks (computed lazily, never stale:
    /// tokens are immutable once known).
    pub(crate) hashes: Vec<u64>,
    /// Leading full computed blocks already offered to the prefix cache.
    pub(crate) registered: usize,
    /// The prefix-cache namespace of its K/V (0: the base model; else a
    /// LoRA adapter's key): blocks are shared only within one namespace.
    pub(crate) ns: u64,
    /// Leading table entries whose blocks went back to the pool, wholly
    /// before the window of every position still to be computed (`window`);
    /// their ids are stale and never read. 0 without a window.
    pub(crate) released: usize,
}

/// The KV bookkeeping of one pool: allocator, block tables, prefix cache.
/// See the crate doc for invariants and costs.
#[derive(Debug, Clone)]
pub struct KvManager {
    pub(crate) block_size: usize,
    pub(crate) prefix_cache: bool,
    pub(crate) hasher: BlockHasher,
    pub(crate) pool: BlockPool,
    pub(crate) seqs: HashMap<SeqId, Seq>,
    /// The window every layer attends within (`window`), `None`: blocks
    /// are held for a sequence's whole life.
    pub(crate) window: Option<usize>,
}

impl KvManager {
    /// A manager over `cfg.num_blocks` free blocks.
    ///
    /// # Panics
    /// When the config is invalid (see [`KvManager::try_new`], which reports
    /// it instead; use that one for user-supplied sizes).
    pub fn new(cfg: KvConfig) -> Self {
        match Self::try_new(cfg) {
            Ok(m) => m,
            Err(e) => panic!("{e}"),
        }
    }

    /// A manager over `cfg.num_blocks` free blocks; errors when
    /// `block_size` is 0 or the pool's slots (`num_blocks x block_size`)
    /// do not fit the `u32` slot numbers the backends use.
    pub fn try_new(cfg: KvConfig) -> Result<Self, KvError> {
        Self::with_block_hasher(cfg, default_block_hash)
    }

    /// Like [`KvManager::try_new`] with a custom block hash; tests use a
    /// degenerate one to show that hash collisions never serve wrong KV.
    pub fn with_block_hasher(cfg: KvConfig, hasher: BlockHasher) -> Result<Self, KvError> {
        if cfg.block_size == 0 {
            return Err(KvError::InvalidConfig {
                field: "block_size",
                value: 0,
                reason: "a block holds at least one token",
            });
        }
        let slots = cfg.num_blocks.checked_mul(cfg.block_size);
        if cfg.num_blocks >= u32::MAX as usize || slots.is_none_or(|s| s > u32::MAX as usize + 1) {
            return Err(KvError::InvalidConfig {
                field: "num_blocks",
                value: cfg.num_blocks,
                reason: "num_blocks x block_size slots must be addressable by u32",
            });
        }
        Ok(Self {
            block_size: cfg.block_size,
            prefix_cache: cfg.enable_prefix_cache,
            hasher,
            pool: BlockPool::new(cfg.num_blocks, cfg.block_size, cfg.enable_prefix_cache),
            seqs: HashMap::new(),
            window: None,
        })
    }

    /// Tokens per block (`B`).
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Physical blocks in the pool.
    pub fn num_blocks(&self) -> usize {
        self.pool.num_blocks()
    }

    /// Blocks allocatable now: free plus cached-evictable.
    pub fn num_free_blocks(&self) -> usize {
        self.pool.num_allocatable()
    }

    /// Blocks referenced by some sequence.
    pub fn num_used_blocks(&self) -> usize {
        self.num_blocks() - self.pool.num_allocatable()
    }

    /// Unreferenced blocks still kept by the prefix cache (part of
    /// [`KvManager::num_free_blocks`]).
    pub fn num_evictable_blocks(&self) -> usize {
        self.pool.num_evictable()
    }

    /// Whether the prefix cache is on.
    pub fn prefix_cache_enabled(&self) -> bool {
        self.prefix_cache
    }

    /// Sequences held.
    pub fn num_seqs(&self) -> usize {
        self.seqs.len()
    }

    /// Ids of the sequences held, in no particular order.
    pub fn seq_ids(&self) -> impl Iterator<Item = SeqId> + '_ {
        self.seqs.keys().copied()
    }

    /// Known tokens of `seq`.
    pub fn seq_len(&self, seq: SeqId) -> Option<usize> {
        self.seqs.get(&seq).map(|s| s.tokens.len())
    }

    /// Known tokens of `seq` (prompt and appended).
    pub fn seq_tokens(&self, seq: SeqId) -> Option<&[u32]> {
        self.seqs.get(&seq).map(|s| s.tokens.as_slice())
    }

    /// Leading tokens of `seq` whose KV is computed or reused.
    pub fn num_computed(&self, seq: SeqId) -> Option<usize> {
        self.seqs.get(&seq).map(|s| s.computed)
    }

    /// `[ceil(len / B)]` physical blocks of `seq`. Under a window
    /// ([`KvManager::with_window`]) the first [`KvManager::released_blocks`]
    /// entries name blocks given back to the pool: stale ids that lie before
    /// every window still read, which the backends never read.
    pub fn block_table(&self, seq: SeqId) -> Option<&[u32]> {
        self.seqs.get(&seq).map(|s| s.table.as_slice())
    }

    /// Physical slot (`block * B + offset`) of position `pos < len` of `seq`.
    pub fn slot(&self, seq: SeqId, pos: usize) -> Option<u32> {
        let s = self.seqs.get(&seq)?;
        if pos >= s.tokens.len() {
            return None;
        }
        let block = *s.table.get(pos / self.block_size)? as usize;
        u32::try_from(block * self.block_size + pos % self.block_size).ok()
    }

    /// References held on `block` (`None` past the pool).
    pub fn ref_count(&self, block: u32) -> Option<u32> {
        self.pool.ref_count(block)
    }

    /// Whether `block` is registered in the prefix cache.
    pub fn is_cached(&self, block: u32) -> bool {
        self.pool.is_cached(block)
    }

    /// The token ids recorded for a cached block (`None` if not cached).
    pub fn cached_block_tokens(&self, block: u32) -> Option<&[u32]> {
        self.pool.recorded_tokens(block)
    }

    pub(crate) fn blocks_for(&self, len: usize) -> usize {
        len.div_ceil(self.block_size)
    }

    /// Exact: whether [`KvManager::admit`] of `tokens` would succeed (ignoring
    /// an id clash): blocks needed after prefix reuse, counting revived
    /// cached blocks, fit the allocatable blocks.
    pub fn can_admit(&self, tokens: &[u32]) -> bool {
        self.can_admit_in(tokens, 0)
    }

    /// [`KvManager::can_admit`] in prefix-cache namespace `ns`
    /// ([`KvManager::admit_in`]).
    pub fn can_admit_in(&self, tokens: &[u32], ns: u64) -> bool {
        let plan = self.plan_admit(tokens, ns);
        plan.needed() <= self.pool.num_allocatable()
    }

    /// Admits `seq` holding `tokens`: reuses the longest verified cached
    /// chain of full blocks among `tokens[..len - 1]`, allocates the rest.
    /// Returns the tokens reused (a multiple of `B`, at most `len - 1`, so
    /// the last token is always computed and lands in an unshared block).
    pub fn admit(&mut self, seq: SeqId, tokens: &[u32]) -> Result<usize, KvError> {
        self.admit_in(seq, tokens, 0)
    }

    /// [`KvManager::admit`] in prefix-cache namespace `ns`: the sequence
    /// reuses and offers cached blocks of `ns` only (0 is the base model's;
    /// a LoRA adapter's K/V differ from the base's for the same tokens, so
    /// each adapter has its own).
    pub fn admit_in(&mut self, seq: SeqId, tokens: &[u32], ns: u64) -> Result<usize, KvError> {
        if self.seqs.contains_key(&seq) {
            return Err(KvError::SeqExists(seq));
        }
        let plan = self.plan_admit(tokens, ns);
        let free = self.pool.num_allocatable();
        if plan.needed() > free {
            return Err(KvError::OutOfBlocks {
                needed: plan.needed(),
                free,
            });
        }
        let mut table = Vec::with_capacity(plan.hits.len() + plan.new_blocks);
        let mut hashes = Vec::with_capacity(plan.hits.len());
        for &(b, h) in &plan.hits {
            self.pool.incref(b);
            table.push(b);
            hashes.push(h);
        }
        allocate_into(&mut self.pool, &mut table, plan.new_blocks, 0)?;
        let cached = plan.hits.len() * self.block_size;
        let registered = plan.hits.len();
        self.seqs.insert(
            seq,
            Seq {
                tokens: tokens.to_vec(),
                table,
                computed: cached,
                hashes,
                registered,
                ns,
                released: 0,
            },
        );
        self.release_seq(seq);
        Ok(cached)
    }

    /// Exact: whether [`KvManager::admit_fresh`] of `len` tokens would
    /// succeed (ignoring an id clash). O(1).
    pub fn can_admit_fresh(&self, len: usize) -> bool {
        self.blocks_for(len) <= self.pool.num_allocatable()
    }

    /// Admits `seq` holding `tokens` in newly allocated blocks only: no
    /// cached block is reused, and while nothing marks its tokens computed
    /// none of its blocks enters the prefix cache, so [`KvManager::free`]
    /// returns them all to the free stack (a scratch sequence computed in
    /// one pass and freed: embeddings). Evicts cached blocks when the free
    /// stack runs short, like any allocation. O(len + blocks).
    pub fn admit_fresh(&mut self, seq: SeqId, tokens: &[u32]) -> Result<(), KvError> {
        if self.seqs.contains_key(&seq) {
            return Err(KvError::SeqExists(seq));
        }
        let needed = self.blocks_for(tokens.len());
        let free = self.pool.num_allocatable();
        if needed > free {
            return Err(KvError::OutOfBlocks { needed, free });
        }
        let mut table = Vec::with_capacity(needed);
        allocate_into(&mut self.pool, &mut table, needed, 0)?;
        self.seqs.insert(
            seq,
            Seq {
                tokens: tokens.to_vec(),
                table,
                computed: 0,
                hashes: Vec::new(),
                registered: 0,
                ns: 0,
                released: 0,
            },
        );
        Ok(())
    }

    /// Full blocks `fork(parent, _, tokens)` would share: the leading
    /// blocks of `parent` that are computed, lie within `tokens[..len - 1]`
    /// and hold the same token ids. O(shared tokens).
    fn fork_shared_blocks(&self, parent: &Seq, tokens: &[u32]) -> usize {
        let bs = self.block_size;
        if parent.released > 0 {
            return 0;
        }
        let limit = parent.computed.min(tokens.len().saturating_sub(1)) / bs;
        (0..limit)
            .take_while(|&b| {
                parent.tokens.get(b * bs..(b + 1) * bs) == Some(&tokens[b * bs..(b + 1) * bs])
            })
            .count()
    }

    /// Exact: whether [`KvManager::fork`] of `parent` into a sequence of
    /// `tokens` would succeed (ignoring an id clash): the blocks it does not
    /// share fit the allocatable blocks.
    pub fn can_fork(&self, parent: SeqId, tokens: &[u32]) -> bool {
        self.seqs.get(&parent).is_some_and(|p| {
            self.blocks_for(tokens.len()) - self.fork_shared_blocks(p, tokens)
                <= self.pool.num_allocatable()
        })
    }

    /// Admits `child` holding `tokens` (typically `parent`'s prompt, for
    /// another choice of the same request) sharing `parent`'s leading full
    /// computed blocks whose token ids match, at most `len - 1` tokens
    /// (reference counts bumped, no KV copied), and allocating the rest. The
    /// last, partial block is never shared: the child recomputes its fewer
    /// than `B + 1` tokens into a block of its own, so both stay writable
    /// without a device-side copy. Works with the prefix cache on or off.
    /// A parent that released blocks outside its window shares nothing (its
    /// leading entries are stale). Returns the tokens shared (a multiple of
    /// `B`). O(len).
    pub fn fork(&mut self, parent: SeqId, child: SeqId, tokens: &[u32]) -> Result<usize, KvError> {
        if self.seqs.contains_key(&child) {
            return Err(KvError::SeqExists(child));
        }
        let p = self.seqs.get(&parent).ok_or(KvError::UnknownSeq(parent))?;
        let shared = self.fork_shared_blocks(p, tokens);
        let table_head: Vec<u32> = p.table[..shared].to_vec();
        let hashes: Vec<u64> = p.hashes[..shared.min(p.hashes.len())].to_vec();
        let registered = shared.min(p.registered);
        let ns = p.ns;
        let new_blocks = self.blocks_for(tokens.len()) - shared;
        let free = self.pool.num_allocatable();
        if new_blocks > free {
            return Err(KvError::OutOfBlocks {
                needed: new_blocks,
                free,
            });
        }
        let mut table = Vec::with_capacity(shared + new_blocks);
        for &b in &table_head {
            self.pool.incref(b);
            table.push(b);
        }
        if let Err(e) = allocate_into(&mut self.pool, &mut table, new_blocks, shared) {
            for &b in &table_head {
                self.pool.decref(b);
            }
            return Err(e);
        }
        self.seqs.insert(
            child,
            Seq {
                tokens: tokens.to_vec(),
                table,
                computed: shared * self.block_size,
                hashes,
                registered,
                ns,
                released: 0,
            },
        );
        self.release_seq(child);
        Ok(shared * self.block_size)
    }

    /// Exact: whether `append` of `n` tokens to `seq` would succeed.
    pub fn can_append(&self, seq: SeqId, n: usize) -> bool {
        self.seqs.get(&seq).is_some_and(|s| {
            self.blocks_for(s.tokens.len() + n) - s.table.len() <= self.pool.num_allocatable()
        })
    }

    /// Appends `tokens` to `seq`, allocating a block only when the last one fills.
    pub fn append(&mut self, seq: SeqId, tokens: &[u32]) -> Result<(), KvError> {
        let Self {
            seqs,
            pool,
            block_size,
            ..
        } = self;
        let s = seqs.get_mut(&seq).ok_or(KvError::UnknownSeq(seq))?;
        let needed = (s.tokens.len() + tokens.len()).div_ceil(*block_size) - s.table.len();
        let free = pool.num_allocatable();
        if needed > free {
            return Err(KvError::OutOfBlocks { needed, free });
        }
        let keep = s.table.len();
        allocate_into(pool, &mut s.table, needed, keep)?;
        s.tokens.extend_from_slice(tokens);
        Ok(())
    }

    /// Replaces the token at `pos` of `seq`, a position whose KV is not
    /// computed yet (so no block holding it is hashed or cached): how a token
    /// appended before its value was known (a pipelined step's sample) gets
    /// its value. O(1).
    pub fn set_token(&mut self, seq: SeqId, pos: usize, token: u32) -> Result<(), KvError> {
        let s = self.seqs.get_mut(&seq).ok_or(KvError::UnknownSeq(seq))?;
        if pos < s.computed || pos >= s.tokens.len() {
            return Err(KvError::NotRewritable {
                seq,
                pos,
                computed: s.computed,
                len: s.tokens.len(),
            });
        }
        s.tokens[pos] = token;
        Ok(())
    }

    /// Exact: whether [`KvManager::truncate`] of `seq` to `len` tokens
    /// would succeed: `len` lies between its computed tokens and its length.
    pub fn can_truncate(&self, seq: SeqId, len: usize) -> bool {
        self.seqs
            .get(&seq)
            .is_some_and(|s| len >= s.computed && len <= s.tokens.len())
    }

    /// Drops `seq`'s tokens past `len` and releases the blocks no longer
    /// covered, last first: how a speculative step's rejected drafts roll
    /// back. Only uncomputed tokens can go (`len` at least the computed
    /// count, like [`KvManager::set_token`]): a computed block may be hashed
    /// or cached under its tokens, an uncomputed one never is, so drafts
    /// stay uncomputed until verified and the prefix cache never holds an
    /// unverified token. The released blocks are writable ones (past the
    /// computed blocks: exclusive, uncached), so they go straight back to
    /// the free list. O(dropped tokens + released blocks).
    pub fn truncate(&mut self, seq: SeqId, len: usize) -> Result<(), KvError> {
        let Self {
            seqs,
            pool,
            block_size,
            ..
        } = self;
        let s = seqs.get_mut(&seq).ok_or(KvError::UnknownSeq(seq))?;
        if len < s.computed || len > s.tokens.len() {
            return Err(KvError::NotTruncatable {
                seq,
                len,
                computed: s.computed,
                held: s.tokens.len(),
            });
        }
        s.tokens.truncate(len);
        let keep = len.div_ceil(*block_size);
        for b in s.table.drain(keep..).rev() {
            pool.decref(b);
        }
        Ok(())
    }

    /// Releases `seq`'s blocks, last block first, so that its cached tail
    /// is evicted before its (more shareable) head.
    pub fn free(&mut self, seq: SeqId) -> Result<(), KvError> {
        let s = self.seqs.remove(&seq).ok_or(KvError::UnknownSeq(seq))?;
        for &b in s.table[s.released..].iter().rev() {
            self.pool.decref(b);
        }
        Ok(())
    }
}

/// Allocates `n` blocks onto `table`; on failure releases the entries past
/// `keep` and reports `OutOfBlocks` (callers check first, so this is a
/// guard, not a path).
fn allocate_into(
    pool: &mut BlockPool,
    table: &mut Vec<u32>,
    n: usize,
    keep: usize,
) -> Result<(), KvError> {
    let free = pool.num_allocatable();
    for _ in 0..n {
        match pool.allocate() {
            Some(b) => table.push(b),
            None => {
                for b in table.drain(keep..).rev() {
                    pool.decref(b);
                }
                return Err(KvError::OutOfBlocks { needed: n, free });
            }
        }
    }
    Ok(())
}
