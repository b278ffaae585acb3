//! Data parallelism in one process: the engines (replicas) behind one
//! server, one per GPU, each with its own weights, KV pool and step loop,
//! and the router that places every request on one of them.
//!
//! Routing, per request (`submit_n`):
//! 1. prefix affinity: the prompt's leading full KV blocks are hashed like
//!    the engines' prefix cache keys them (chained over the parent block);
//!    the router remembers which replica it last sent each block hash to
//!    (a bounded index, as many entries as the replicas have KV blocks, oldest
//!    forgotten first). The replica that was sent the longest prefix of this
//!    prompt gets it, unless it is overloaded: its load is more than twice the
//!    least loaded replica's plus [`AFFINITY_SLACK`];
//! 2. otherwise least outstanding work: the replica with the least queued
//!    prompt tokens + running sequences (ties rotate).
//!
//! A replica whose queue is full is passed over for the next least loaded
//! (429 only when every replica refuses); a replica whose engine failed
//! (`EngineConfig::halt_on_backend_error`: its requests ended with an error
//! naming the failure) or is shutting down is out of rotation; when none is
//! left the request is refused with the first failure. Cancelling (dropping
//! a handle) reaches the replica that runs it: each handle talks to its own
//! engine.
//!
//! Costs: O(prompt) hashing outside the lock, then under one mutex
//! O(replicas + prompt blocks) to decide, the engine's O(prompt) submit and
//! O(prompt blocks) to record the placement. The index holds at most the
//! replicas' total KV blocks entries.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use engine::{
    EmbedError, EmbedHandle, EmbedRequest, Engine, EngineStats, GenerateRequest, RequestHandle,
    SubmitError,
};

/// Prompt tokens of load an affinity replica may carry beyond twice the
/// least loaded replica's before requests go by load instead: about one
/// long prompt's prefill, so a shared prefix stays on its replica under
/// moderate load and spreads when that replica falls behind.
pub const AFFINITY_SLACK: u64 = 2048;

/// Why a request went where it went (counted per replica).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// The replica sent the longest prefix of the prompt.
    Prefix,
    /// The least loaded replica.
    Load,
}

/// Where a request was placed, and its handles (one per choice).
pub struct Placement {
    pub replica: usize,
    pub route: Route,
    /// Leading full blocks of the prompt the router believes the replica holds.
    pub matched_blocks: usize,
    pub handles: Vec<RequestHandle>,
}

/// The engines behind the server and the router over them.
pub struct Replicas {
    engines: Vec<Engine>,
    block_size: usize,
    index: Mutex<PrefixIndex>,
    /// Requests placed by prefix / by load, per replica.
    routed: Vec<[AtomicU64; 2]>,
    rotate: AtomicUsize,
}

impl Replicas {
    /// The replicas, in the order their `engine` labels number them. Fails
    /// on an empty list or engines whose KV blocks differ in size (one
    /// model, one router).
    pub fn new(engines: Vec<Engine>) -> Result<Replicas, String> {
        let Some(first) = engines.first() else {
            return Err("at least one engine is needed".into());
        };
        let block_size = first.kv_shape().0;
        if let Some((i, e)) = engines
            .iter()
            .enumerate()
            .find(|(_, e)| e.kv_shape().0 != block_size)
        {
            return Err(format!(
                "engine {i} has KV blocks of {} tokens, engine 0 of {block_size}: replicas must share one block size",
                e.kv_shape().0
            ));
        }
        let capacity = engines.iter().map(|e| e.kv_shape().1).sum();
        let routed = engines.iter().map(|_| Default::default()).collect();
        Ok(Replicas {
            engines,
            block_size,
            index: Mutex::new(PrefixIndex::new(capacity)),
            routed,
            rotate: AtomicUsize::new(0),
        })
    }

    /// One engine alone (nothing to route).
    pub fn single(engine: Engine) -> Replicas {
        let capacity = engine.kv_shape().1;
        Replicas {
            block_size: engine.kv_shape().0,
            engines: vec![engine],
            index: Mutex::new(PrefixIndex::new(capacity)),
            routed: vec![Default::default()],
            rotate: AtomicUsize::new(0),
        }
    }

    /// Number of replicas.
    pub fn len(&self) -> usize {
        self.engines.len()
    }

    /// Always false: there is at least one replica.
    pub fn is_empty(&self) -> bool {
        self.engines.is_empty()
    }

    /// Tokens per KV block (every replica's).
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The engine of replica `i`.
    pub fn engine(&self, i: usize) -> Option<&Engine> {
        self.engines.get(i)
    }

    /// Each replica's stats, in replica order.
    pub fn per_engine_stats(&self) -> Vec<EngineStats> {
        self.engines.iter().map(Engine::stats).collect()
    }

    /// The replicas' stats summed (gauges and counters alike).
    pub fn stats(&self) -> EngineStats {
        sum_stats(&self.per_engine_stats())
    }

    /// Requests replica `i` got by prefix affinity and by load.
    pub fn routed(&self, i: usize) -> (u64, u64) {
        self.routed.get(i).map_or((0, 0), |r| {
            (r[0].load(Ordering::Relaxed), r[1].load(Ordering::Relaxed))
        })
    }

    /// `(replica, why)` of every failed replica.
    pub fn failures(&self) -> Vec<(usize, String)> {
        self.engines
            .iter()
            .enumerate()
            .filter_map(|(i, e)| e.failure().map(|f| (i, f)))
            .collect()
    }

    /// The longest prompt + completion every replica can finish.
    pub fn max_sequence(&self) -> usize {
        self.engines
            .iter()
            .map(Engine::max_sequence)
            .min()
            .unwrap_or(0)
    }

    /// The model's hidden size (every replica runs the same model).
    pub fn hidden_size(&self) -> usize {
        self.engines.first().map_or(0, Engine::hidden_size)
    }

    /// Queues an embedding request on the least loaded healthy replica
    /// (no prefix to match: embeddings reuse no cached KV); a replica that
    /// refuses for its own state (shutting down, failed) passes it on.
    pub fn embed(&self, req: EmbedRequest) -> Result<EmbedHandle, EmbedError> {
        let mut order: Vec<(u64, usize)> = (self.engines.iter().enumerate())
            .filter(|(_, e)| e.failure().is_none())
            .map(|(i, e)| {
                let s = e.stats();
                (s.queued_prompt_tokens + s.running, i)
            })
            .collect();
        order.sort_unstable();
        let mut refusal = EmbedError::EngineFailed("every replica has failed".into());
        for (_, i) in order {
            match self.engines[i].embed(req.clone()) {
                Ok(h) => return Ok(h),
                Err(e @ (EmbedError::ShuttingDown | EmbedError::EngineFailed(_))) => refusal = e,
                Err(e) => return Err(e),
            }
        }
        Err(refusal)
    }

    /// Shuts every engine down (cancelling what they run); blocking.
    pub fn shutdown(&self) {
        for e in &self.engines {
            e.shutdown();
        }
    }

    /// Places `n` choices of `req` on one replica (module doc) and submits them there.
    pub fn submit_n(&self, req: GenerateRequest, n: usize) -> Result<Placement, SubmitError> {
        let hashes = block_hashes(&req.prompt, self.block_size);
        let mut index = match self.index.lock() {
            Ok(i) => i,
            Err(poisoned) => poisoned.into_inner(),
        };
        let loads: Vec<Option<u64>> = self
            .engines
            .iter()
            .map(|e| {
                e.failure().is_none().then(|| {
                    let s = e.stats();
                    s.queued_prompt_tokens + s.running
                })
            })
            .collect();
        let matched = index.matched(&hashes, self.engines.len());
        let order = self.order(&loads, &matched);
        let mut refusal = None;
        for (replica, route) in order {
            match self.engines[replica].submit_n(req.clone(), n) {
                Ok(handles) => {
                    index.record(&hashes, replica);
                    let slot = usize::from(route == Route::Load);
                    self.routed[replica][slot].fetch_add(1, Ordering::Relaxed);
                    return Ok(Placement {
                        replica,
                        route,
                        matched_blocks: matched[replica],
                        handles,
                    });
                }
                // this replica cannot take it now: try the next
                Err(
                    e @ (SubmitError::QueueFull
                    | SubmitError::EngineFailed(_)
                    | SubmitError::ShuttingDown),
                ) => {
                    // a full queue says more than a replica that is gone
                    if !matches!(refusal, Some(SubmitError::QueueFull)) {
                        refusal = Some(e);
                    }
                }
                // the request itself is at fault: every replica would refuse it
                Err(e) => return Err(e),
            }
        }
        Err(refusal.unwrap_or_else(|| {
            let why = self
                .failures()
                .into_iter()
                .map(|(i, f)| format!("engine {i}: {f}"))
                .collect::<Vec<_>>()
                .join("; ");
            SubmitError::EngineFailed(format!("every replica is out of rotation ({why})"))
        }))
    }

    /// Replicas in the order to try: the affinity replica first when it is
    /// not overloaded, then every live replica by load.
    fn order(&self, loads: &[Option<u64>], matched: &[usize]) -> Vec<(usize, Route)> {
        let n = loads.len();
        let start = self.rotate.fetch_add(1, Ordering::Relaxed) % n.max(1);
        // live replicas by load, ties in rotating order
        let mut by_load: Vec<(usize, u64)> = (0..n)
            .map(|k| (start + k) % n)
            .filter_map(|i| loads[i].map(|l| (i, l)))
            .collect();
        by_load.sort_by_key(|&(_, l)| l);
        let Some(&(_, least)) = by_load.first() else {
            return Vec::new();
        };
        let affinity = by_load
            .iter()
            .filter(|&&(i, _)| matched[i] > 0)
            .max_by_key(|&&(i, l)| (matched[i], std::cmp::Reverse(l)))
            .copied();
        let mut order = Vec::with_capacity(by_load.len());
        if let Some((i, load)) = affinity
            && load <= least.saturating_mul(2).saturating_add(AFFINITY_SLACK)
        {
            order.push((i, Route::Prefix));
        }
        for (i, _) in by_load {
            if !order.iter().any(|&(j, _)| j == i) {
                order.push((i, Route::Load));
            }
        }
        order
    }
}

/// The chained hashes of `prompt`'s full blocks of `block_size` tokens.
pub fn block_hashes(prompt: &[u32], block_size: usize) -> Vec<u64> {
    let mut parent = None;
    prompt
        .chunks_exact(block_size.max(1))
        .map(|block| {
            let h = paged_kv::default_block_hash(parent, block);
            parent = Some(h);
            h
        })
        .collect()
}

/// Sums stats field by field.
pub fn sum_stats(all: &[EngineStats]) -> EngineStats {
    let mut t = EngineStats::default();
    for s in all {
        t.running += s.running;
        t.waiting += s.waiting;
        t.queued_prompt_tokens += s.queued_prompt_tokens;
        t.kv_blocks_used += s.kv_blocks_used;
        t.kv_blocks_total += s.kv_blocks_total;
        t.prompt_tokens_total += s.prompt_tokens_total;
        t.cached_tokens_total += s.cached_tokens_total;
        t.generation_tokens_total += s.generation_tokens_total;
        t.steps_total += s.steps_total;
        t.preemptions_total += s.preemptions_total;
        t.backend_ns_total += s.backend_ns_total;
        t.schedule_ns_total += s.schedule_ns_total;
        t.host_ns_total += s.host_ns_total;
        t.spec_drafted_total += s.spec_drafted_total;
        t.spec_accepted_total += s.spec_accepted_total;
        t.spec_verifies_total += s.spec_verifies_total;
    }
    t
}

/// Which replica each block hash was last sent to; bounded, the oldest
/// placement forgotten first (a block re-sent is refreshed).
struct PrefixIndex {
    /// hash -> (replica, tick of the last placement).
    owner: HashMap<u64, (usize, u64)>,
    /// Placements in tick order; entries superseded by a later tick are skipped.
    order: VecDeque<(u64, u64)>,
    capacity: usize,
    tick: u64,
}

impl PrefixIndex {
    fn new(capacity: usize) -> Self {
        PrefixIndex {
            owner: HashMap::new(),
            order: VecDeque::new(),
            capacity: capacity.max(1),
            tick: 0,
        }
    }

    /// Per replica: how many leading blocks of `hashes` it was sent.
    fn matched(&self, hashes: &[u64], replicas: usize) -> Vec<usize> {
        let mut m = vec![0; replicas];
        for (depth, h) in hashes.iter().enumerate() {
            let Some(&(r, _)) = self.owner.get(h) else {
                break; // a chain hash missing: no deeper block can match
            };
            if let Some(slot) = m.get_mut(r) {
                *slot = depth + 1;
            }
        }
        m
    }

    /// `hashes` were sent to `replica`.
    fn record(&mut self, hashes: &[u64], replica: usize) {
        for &h in hashes {
            self.tick += 1;
            self.owner.insert(h, (replica, self.tick));
            self.order.push_back((h, self.tick));
        }
        // forget the oldest placements beyond capacity; the queue also
        // drops superseded entries so it stays O(capacity) long
        while self.owner.len() > self.capacity || self.order.len() > 2 * self.capacity {
            let Some((h, t)) = self.order.pop_front() else {
                break;
            };
            if self.owner.get(&h).is_some_and(|&(_, tick)| tick == t) {
                self.owner.remove(&h);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_matches_the_longest_prefix_per_replica() {
        let mut ix = PrefixIndex::new(100);
        let a = block_hashes(&[1, 2, 3, 4, 5, 6, 7, 8], 2); // 4 blocks
        let b = block_hashes(&[1, 2, 3, 4, 9, 9], 2); // shares 2 blocks
        ix.record(&a, 0);
        assert_eq!(ix.matched(&b, 2), vec![2, 0]);
        ix.record(&b, 1);
        // the shared blocks were last sent to 1; 0 still holds the deeper ones
        assert_eq!(ix.matched(&a, 2), vec![4, 2]);
        assert_eq!(ix.matched(&block_hashes(&[7, 7], 2), 2), vec![0, 0]);
    }

    #[test]
    fn index_forgets_the_oldest_beyond_capacity() {
        let mut ix = PrefixIndex::new(3);
        let old = block_hashes(&[1, 1, 2, 2], 2);
        ix.record(&old, 0);
        let new = block_hashes(&[5, 5, 6, 6], 2);
        ix.record(&new, 1);
        assert!(ix.owner.len() <= 3);
        assert_eq!(
            ix.matched(&old, 2),
            vec![0, 0],
            "the oldest block went first"
        );
        assert_eq!(ix.matched(&new, 2), vec![0, 2]);
        // refreshing keeps a block: re-sending `new` many times never grows the queue unboundedly
        for _ in 0..100 {
            ix.record(&new, 1);
        }
        assert!(ix.order.len() <= 6);
        assert_eq!(ix.matched(&new, 2), vec![0, 2]);
    }

    #[test]
    fn hashes_cover_full_blocks_only() {
        assert_eq!(block_hashes(&[1, 2, 3], 2).len(), 1);
        assert!(block_hashes(&[1], 2).is_empty());
        // chained: the same block after different parents hashes differently
        let x = block_hashes(&[1, 2, 3, 4], 2);
        let y = block_hashes(&[9, 9, 3, 4], 2);
        assert_ne!(x[1], y[1]);
    }
}
