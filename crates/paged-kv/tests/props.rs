//! Property tests: random sequences of admit / append / truncate / mark_computed / free
//! / prefix-lookup / evict / clear against a shadow model of what KV
//! each physical block holds. After every step: the crate's own invariant
//! checker, free + in use (+ cached-evictable) = total, refcounts equal table
//! references, writable blocks exclusive, every computed position of every
//! sequence reads KV computed from exactly its own token prefix, prefix hits
//! return blocks whose recorded tokens equal the prompt's, check/act pairs
//! agree, and failed acts change nothing. At the end, freeing everything and
//! clearing the cache frees every block. Run with the real block hash and
//! with a degenerate one where almost every block collides.

use std::collections::BTreeMap;

use paged_kv::{KvConfig, KvError, KvManager, SeqId, default_block_hash};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Admit(SeqId, Vec<u32>),
    Append(SeqId, Vec<u32>),
    Truncate(SeqId, usize),
    Compute(SeqId, usize),
    Free(SeqId),
    Lookup(Vec<u32>),
    Evict(usize),
    Clear,
}

fn tokens(max_len: usize) -> impl Strategy<Value = Vec<u32>> {
    prop::collection::vec(0u32..3, 0..max_len)
}

fn op() -> impl Strategy<Value = Op> {
    let id = 0u64..6;
    prop_oneof![
        4 => (id.clone(), tokens(14)).prop_map(|(s, t)| Op::Admit(s, t)),
        3 => (id.clone(), tokens(5)).prop_map(|(s, t)| Op::Append(s, t)),
        2 => (id.clone(), any::<usize>()).prop_map(|(s, n)| Op::Truncate(s, n)),
        5 => (id.clone(), any::<usize>()).prop_map(|(s, n)| Op::Compute(s, n)),
        3 => id.prop_map(Op::Free),
        2 => tokens(14).prop_map(Op::Lookup),
        1 => (0usize..4).prop_map(Op::Evict),
        1 => Just(Op::Clear),
    ]
}

/// Almost every block hashes to one of two keys.
fn colliding_hash(_parent: Option<u64>, tokens: &[u32]) -> u64 {
    u64::from(tokens.first().copied().unwrap_or(0) % 2)
}

struct Harness {
    kv: KvManager,
    /// Per physical block: the token prefix whose KV it holds, through its
    /// last written position (what a real backend would have computed).
    shadow: Vec<Vec<u32>>,
    live: BTreeMap<SeqId, ()>,
}

/// Everything an act may change, to show a failed act changed nothing.
/// (free, used, evictable, per sequence: tokens, table, computed).
type Snapshot = (
    usize,
    usize,
    usize,
    BTreeMap<SeqId, (Vec<u32>, Vec<u32>, usize)>,
);

fn snapshot(kv: &KvManager) -> Snapshot {
    let seqs = kv
        .seq_ids()
        .map(|s| {
            let t = kv.seq_tokens(s).map(<[u32]>::to_vec).unwrap_or_default();
            let b = kv.block_table(s).map(<[u32]>::to_vec).unwrap_or_default();
            (s, (t, b, kv.num_computed(s).unwrap_or(0)))
        })
        .collect();
    (
        kv.num_free_blocks(),
        kv.num_used_blocks(),
        kv.num_evictable_blocks(),
        seqs,
    )
}

impl Harness {
    fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        let bs = self.kv.block_size();
        let before = snapshot(&self.kv);
        let unchanged = |kv: &KvManager| -> Result<(), TestCaseError> {
            prop_assert_eq!(&snapshot(kv), &before, "a failed act changed state");
            Ok(())
        };
        match op {
            Op::Admit(s, t) => {
                let can = self.kv.can_admit(t);
                let expect_hits = self.kv.cached_prefix_blocks(t);
                match self.kv.admit(*s, t) {
                    Ok(cached) => {
                        prop_assert!(can, "admit succeeded but can_admit said no");
                        prop_assert!(!self.live.contains_key(s));
                        prop_assert_eq!(cached % bs, 0);
                        prop_assert!(cached < t.len().max(1), "whole prompt reported cached");
                        prop_assert_eq!(cached, expect_hits.len() * bs);
                        let table = self.kv.block_table(*s).unwrap_or_default();
                        prop_assert_eq!(&table[..expect_hits.len()], &expect_hits[..]);
                        for (i, &b) in expect_hits.iter().enumerate() {
                            let rec = self.kv.cached_block_tokens(b);
                            prop_assert_eq!(
                                rec,
                                Some(&t[i * bs..(i + 1) * bs]),
                                "hit records other tokens"
                            );
                        }
                        self.live.insert(*s, ());
                    }
                    Err(KvError::SeqExists(x)) => {
                        prop_assert!(self.live.contains_key(&x));
                        unchanged(&self.kv)?;
                    }
                    Err(KvError::OutOfBlocks { .. }) => {
                        prop_assert!(!can, "admit failed but can_admit said yes");
                        unchanged(&self.kv)?;
                    }
                    Err(e) => prop_assert!(false, "unexpected admit error {e}"),
                }
            }
            Op::Append(s, t) => {
                let can = self.kv.can_append(*s, t.len());
                match self.kv.append(*s, t) {
                    Ok(()) => prop_assert!(can),
                    Err(KvError::UnknownSeq(_)) => {
                        prop_assert!(!self.live.contains_key(s) && !can);
                        unchanged(&self.kv)?;
                    }
                    Err(KvError::OutOfBlocks { .. }) => {
                        prop_assert!(!can);
                        unchanged(&self.kv)?;
                    }
                    Err(e) => prop_assert!(false, "unexpected append error {e}"),
                }
            }
            Op::Truncate(s, pick) => {
                let Some(len) = self.kv.seq_len(*s) else {
                    prop_assert!(!self.kv.can_truncate(*s, 0));
                    prop_assert_eq!(self.kv.truncate(*s, 0), Err(KvError::UnknownSeq(*s)));
                    return unchanged(&self.kv);
                };
                let n = pick % (len + 2);
                let can = self.kv.can_truncate(*s, n);
                let computed = self.kv.num_computed(*s).unwrap_or(0);
                prop_assert_eq!(can, n >= computed && n <= len);
                let toks = self.kv.seq_tokens(*s).unwrap_or_default().to_vec();
                let table = self.kv.block_table(*s).unwrap_or_default().to_vec();
                match self.kv.truncate(*s, n) {
                    Ok(()) => {
                        prop_assert!(can);
                        prop_assert_eq!(self.kv.seq_tokens(*s), Some(&toks[..n]));
                        prop_assert_eq!(self.kv.block_table(*s), Some(&table[..n.div_ceil(bs)]));
                        prop_assert_eq!(self.kv.num_computed(*s), Some(computed));
                        for &b in &table[n.div_ceil(bs)..] {
                            prop_assert_eq!(self.kv.ref_count(b), Some(0), "block {} kept", b);
                            prop_assert!(!self.kv.is_cached(b), "released block {} cached", b);
                        }
                    }
                    Err(KvError::NotTruncatable { .. }) => {
                        prop_assert!(!can);
                        unchanged(&self.kv)?;
                    }
                    Err(e) => prop_assert!(false, "unexpected truncate error {e}"),
                }
            }
            Op::Compute(s, pick) => {
                let Some(len) = self.kv.seq_len(*s) else {
                    prop_assert_eq!(self.kv.mark_computed(*s, 0), Err(KvError::UnknownSeq(*s)));
                    return Ok(());
                };
                let n = pick % (len + 2);
                if n > len {
                    let e = self.kv.mark_computed(*s, n);
                    prop_assert_eq!(
                        e,
                        Err(KvError::ComputedBeyondLength {
                            seq: *s,
                            computed: n,
                            len
                        })
                    );
                    return unchanged(&self.kv);
                }
                // The "backend" writes positions computed..n; each must be writable by this sequence alone.
                let done = self.kv.num_computed(*s).unwrap_or(0);
                let toks = self.kv.seq_tokens(*s).unwrap_or_default().to_vec();
                for pos in done..n {
                    let b = self.kv.block_table(*s).unwrap_or_default()[pos / bs];
                    prop_assert_eq!(
                        self.kv.ref_count(b),
                        Some(1),
                        "write into shared block {}",
                        b
                    );
                    prop_assert!(!self.kv.is_cached(b), "write into cached block {}", b);
                    self.shadow[b as usize] = toks[..=pos].to_vec();
                }
                prop_assert_eq!(self.kv.mark_computed(*s, n), Ok(()));
                prop_assert_eq!(self.kv.num_computed(*s), Some(n.max(done)));
            }
            Op::Free(s) => match self.kv.free(*s) {
                Ok(()) => {
                    prop_assert!(self.live.remove(s).is_some());
                }
                Err(e) => {
                    prop_assert_eq!(e, KvError::UnknownSeq(*s));
                    unchanged(&self.kv)?;
                }
            },
            Op::Lookup(t) => {
                let hits = self.kv.cached_prefix_blocks(t);
                prop_assert_eq!(self.kv.cached_prefix_len(t), hits.len() * bs);
                prop_assert!(hits.len() * bs < t.len().max(1));
                for (i, &b) in hits.iter().enumerate() {
                    let want = &t[..(i + 1) * bs];
                    prop_assert_eq!(self.kv.cached_block_tokens(b), Some(&want[i * bs..]));
                    // The KV held is that of exactly this prefix (not just these tokens).
                    prop_assert_eq!(
                        &self.shadow[b as usize][..],
                        want,
                        "hit block {} holds other KV",
                        b
                    );
                }
                unchanged(&self.kv)?;
            }
            Op::Evict(n) => {
                let ev = self.kv.num_evictable_blocks();
                prop_assert_eq!(self.kv.evict_cached(*n), ev.min(*n));
                prop_assert_eq!(self.kv.num_evictable_blocks(), ev - ev.min(*n));
            }
            Op::Clear => {
                self.kv.clear_prefix_cache();
                prop_assert_eq!(self.kv.num_evictable_blocks(), 0);
            }
        }
        self.check()
    }

    fn check(&self) -> Result<(), TestCaseError> {
        let kv = &self.kv;
        let bs = kv.block_size();
        if let Err(e) = kv.check_invariants() {
            prop_assert!(false, "{}", e);
        }
        let n = kv.num_blocks();
        let mut refs = vec![0u32; n];
        for &s in self.live.keys() {
            for &b in kv.block_table(s).unwrap_or_default() {
                refs[b as usize] += 1;
            }
        }
        prop_assert_eq!(kv.num_seqs(), self.live.len());
        let used = refs.iter().filter(|&&r| r > 0).count();
        let evictable = (0..n as u32)
            .filter(|&b| refs[b as usize] == 0 && kv.is_cached(b))
            .count();
        prop_assert_eq!(kv.num_used_blocks(), used);
        prop_assert_eq!(kv.num_evictable_blocks(), evictable);
        prop_assert_eq!(kv.num_free_blocks() + kv.num_used_blocks(), n);
        for (b, &r) in refs.iter().enumerate() {
            prop_assert_eq!(kv.ref_count(b as u32), Some(r), "refcount of block {}", b);
        }
        for &s in self.live.keys() {
            let toks = kv.seq_tokens(s).unwrap_or_default();
            let table = kv.block_table(s).unwrap_or_default();
            let done = kv.num_computed(s).unwrap_or(0);
            prop_assert_eq!(table.len(), toks.len().div_ceil(bs));
            for &b in &table[done / bs..] {
                prop_assert_eq!(refs[b as usize], 1, "seq {} writable block {} shared", s, b);
                prop_assert!(!kv.is_cached(b));
            }
            for pos in 0..done {
                let held = &self.shadow[table[pos / bs] as usize];
                prop_assert!(
                    held.len() > pos && held[..=pos] == toks[..=pos],
                    "seq {} position {} reads KV of {:?}, wants prefix {:?}",
                    s,
                    pos,
                    held,
                    &toks[..=pos]
                );
                prop_assert_eq!(
                    kv.slot(s, pos),
                    Some(table[pos / bs] * bs as u32 + (pos % bs) as u32)
                );
            }
            prop_assert_eq!(kv.slot(s, toks.len()), None);
        }
        Ok(())
    }

    fn drain(mut self) -> Result<(), TestCaseError> {
        let ids: Vec<SeqId> = self.live.keys().copied().collect();
        for s in ids {
            prop_assert_eq!(self.kv.free(s), Ok(()));
            self.live.remove(&s);
            self.check()?;
        }
        self.kv.clear_prefix_cache();
        self.check()?;
        prop_assert_eq!(self.kv.num_free_blocks(), self.kv.num_blocks());
        prop_assert_eq!(self.kv.num_used_blocks(), 0);
        prop_assert_eq!(self.kv.num_evictable_blocks(), 0);
        prop_assert!(
            (0..self.kv.num_blocks() as u32)
                .all(|b| !self.kv.is_cached(b) && self.kv.ref_count(b) == Some(0))
        );
        Ok(())
    }
}

fn run(cfg: KvConfig, colliding: bool, ops: &[Op]) -> Result<(), TestCaseError> {
    let hasher = if colliding {
        colliding_hash
    } else {
        default_block_hash
    };
    let kv = KvManager::with_block_hasher(cfg, hasher)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let mut h = Harness {
        shadow: vec![Vec::new(); cfg.num_blocks],
        kv,
        live: BTreeMap::new(),
    };
    h.check()?;
    for op in ops {
        h.apply(op)?;
    }
    h.drain()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn random_ops_keep_every_invariant(
        block_size in 1usize..5,
        num_blocks in 0usize..24,
        cache in prop::bool::weighted(0.85),
        colliding in prop::bool::weighted(0.3),
        ops in prop::collection::vec(op(), 1..80),
    ) {
        run(KvConfig { num_blocks, block_size, enable_prefix_cache: cache }, colliding, &ops)?;
    }
}
