//! Unit tests for the allocator's edges (block size 1, exactly-full
//! blocks, zero free blocks, a prompt that is a strict prefix of a cached
//! one) and for the documented behaviours (LRU eviction order, collision
//! safety, dedup, config validation, error reporting).

use paged_kv::{KvConfig, KvError, KvManager};

fn kv(num_blocks: usize, block_size: usize) -> KvManager {
    let m = KvManager::try_new(KvConfig {
        num_blocks,
        block_size,
        enable_prefix_cache: true,
    });
    m.unwrap_or_else(|e| panic!("config: {e}"))
}

fn ok<T>(r: Result<T, KvError>) -> T {
    r.unwrap_or_else(|e| panic!("unexpected error: {e}"))
}

fn checked(m: &KvManager) {
    ok(m.check_invariants());
}

/// Admits `tokens` as `seq`, computes them all, returns the cached count.
fn run_prompt(m: &mut KvManager, seq: u64, tokens: &[u32]) -> usize {
    let cached = ok(m.admit(seq, tokens));
    ok(m.mark_computed(seq, tokens.len()));
    checked(m);
    cached
}

#[test]
fn block_size_one() {
    let mut m = kv(8, 1);
    assert_eq!(run_prompt(&mut m, 1, &[5, 6, 7]), 0);
    assert_eq!(m.block_table(1).map(<[u32]>::len), Some(3));
    let t = m.block_table(1).unwrap_or_default().to_vec();
    for (pos, &b) in t.iter().enumerate() {
        assert_eq!(m.slot(1, pos), Some(b));
    }
    ok(m.free(1));
    assert_eq!(m.num_evictable_blocks(), 3);
    // Extension of the cached prompt reuses all three blocks...
    assert_eq!(run_prompt(&mut m, 2, &[5, 6, 7, 8]), 3);
    // ...the same prompt again reuses all but its last token.
    assert_eq!(run_prompt(&mut m, 3, &[5, 6, 7]), 2);
    // Once computed, its last block equals the cached one and is deduplicated.
    assert_eq!(m.block_table(3), Some(&t[..]));
    assert_eq!(m.ref_count(t[0]), Some(2));
    ok(m.append(3, &[9]));
    assert_eq!(m.block_table(3).map(<[u32]>::len), Some(4));
}

#[test]
fn exactly_full_blocks() {
    let mut m = kv(4, 4);
    let prompt: Vec<u32> = (0..8).collect();
    assert_eq!(run_prompt(&mut m, 1, &prompt), 0);
    assert_eq!(
        m.num_used_blocks(),
        2,
        "8 tokens fill exactly 2 blocks of 4"
    );
    // A full last block: the next token needs a new block, more tokens up to B do not.
    ok(m.append(1, &[8]));
    assert_eq!(m.num_used_blocks(), 3);
    ok(m.append(1, &[9, 10, 11]));
    assert_eq!(m.num_used_blocks(), 3);
    assert!(m.can_append(1, 4) && !m.can_append(1, 9));
    // The same block-aligned prompt again: the last block is not reused, so
    // the last token is computed in a block of its own.
    assert_eq!(m.admit(2, &prompt), Ok(4));
    let (a, b) = (
        m.block_table(1).unwrap_or_default().to_vec(),
        m.block_table(2).unwrap_or_default().to_vec(),
    );
    assert_eq!(a[0], b[0]);
    assert_ne!(a[1], b[1]);
    assert_eq!(m.ref_count(b[1]), Some(1));
    checked(&m);
}

#[test]
fn zero_free_blocks() {
    let mut m = kv(0, 16);
    assert!(m.can_admit(&[]));
    assert_eq!(m.admit(1, &[]), Ok(0));
    assert!(!m.can_admit(&[1]));
    assert_eq!(
        m.admit(2, &[1]),
        Err(KvError::OutOfBlocks { needed: 1, free: 0 })
    );
    assert!(!m.can_append(1, 1));
    assert_eq!(
        m.append(1, &[1]),
        Err(KvError::OutOfBlocks { needed: 1, free: 0 })
    );
    assert_eq!(m.seq_len(1), Some(0), "a failed append changes nothing");
    assert!(m.can_append(1, 0));
    checked(&m);

    // A full pool: every act that needs a block fails and changes nothing.
    let mut m = kv(2, 2);
    run_prompt(&mut m, 1, &[1, 2, 3]);
    assert_eq!(m.num_free_blocks(), 0);
    assert!(!m.can_admit(&[7]) && !m.can_append(1, 2));
    assert!(m.can_append(1, 1), "room left in the partial last block");
    assert_eq!(
        m.admit(2, &[7]),
        Err(KvError::OutOfBlocks { needed: 1, free: 0 })
    );
    assert_eq!(
        m.append(1, &[4, 5]),
        Err(KvError::OutOfBlocks { needed: 1, free: 0 })
    );
    assert_eq!(
        (m.num_seqs(), m.seq_len(1), m.num_used_blocks()),
        (1, Some(3), 2)
    );
    checked(&m);
}

#[test]
fn prompt_strictly_prefix_of_cached_one() {
    let mut m = kv(16, 4);
    let long: Vec<u32> = (100..112).collect(); // 3 full blocks
    run_prompt(&mut m, 1, &long);
    ok(m.free(1));
    assert_eq!(m.cached_prefix_len(&long[..9]), 8);
    assert_eq!(
        m.cached_prefix_len(&long[..8]),
        4,
        "last token of a block-aligned prefix is recomputed"
    );
    assert_eq!(m.cached_prefix_len(&long[..5]), 4);
    assert_eq!(m.cached_prefix_len(&long[..4]), 0);
    assert_eq!(m.cached_prefix_len(&long[..1]), 0);
    assert_eq!(m.cached_prefix_len(&[]), 0);
    assert_eq!(run_prompt(&mut m, 2, &long[..9]), 8);
    for (i, &b) in m.block_table(2).unwrap_or_default()[..2].iter().enumerate() {
        assert_eq!(m.cached_block_tokens(b), Some(&long[i * 4..(i + 1) * 4]));
    }
    // A prompt diverging inside block 1 reuses only block 0.
    let mut other = long.clone();
    other[6] = 0;
    assert_eq!(m.cached_prefix_len(&other), 4);
}

#[test]
fn lru_evicts_least_recently_freed_tail_first() {
    let mut m = kv(4, 2);
    run_prompt(&mut m, 1, &[1, 2, 3, 4, 5]); // blocks: [1,2] [3,4] [5]
    ok(m.free(1));
    assert_eq!(m.num_evictable_blocks(), 2);
    // Needs 3 blocks, 2 truly free: evicts one cached block, the tail [3,4].
    run_prompt(&mut m, 2, &[9, 9, 9, 9, 9]);
    assert_eq!(m.num_evictable_blocks(), 1);
    assert_eq!(
        m.cached_prefix_len(&[1, 2, 3, 4, 5]),
        2,
        "head survives, tail evicted"
    );
    assert_eq!(m.evict_cached(5), 1);
    assert_eq!(m.cached_prefix_len(&[1, 2, 3]), 0);
    checked(&m);
}

#[test]
fn colliding_hashes_never_serve_wrong_kv() {
    let all_collide = |_: Option<u64>, _: &[u32]| 7;
    let cfg = KvConfig {
        num_blocks: 8,
        block_size: 2,
        enable_prefix_cache: true,
    };
    let mut m = ok(KvManager::with_block_hasher(cfg, all_collide));
    run_prompt(&mut m, 1, &[1, 2, 3, 4, 5]);
    assert_eq!(
        m.cached_prefix_len(&[1, 9, 3]),
        0,
        "same hash, other tokens"
    );
    assert_eq!(
        m.cached_prefix_len(&[3, 4, 3, 4, 1]),
        0,
        "block [3,4] cached, but after another parent"
    );
    ok(m.free(1));
    checked(&m);
}

#[test]
fn identical_prompts_computed_together_are_deduplicated() {
    let mut m = kv(8, 2);
    let p = [1, 2, 3, 4, 5];
    assert_eq!(m.admit(1, &p), Ok(0));
    assert_eq!(m.admit(2, &p), Ok(0), "nothing cached yet");
    assert_eq!(m.num_used_blocks(), 6);
    ok(m.mark_computed(1, 5));
    ok(m.mark_computed(2, 5));
    let (a, b) = (
        m.block_table(1).unwrap_or_default(),
        m.block_table(2).unwrap_or_default(),
    );
    assert_eq!(
        a[..2],
        b[..2],
        "full computed blocks are shared after dedup"
    );
    assert_ne!(a[2], b[2]);
    assert_eq!(m.num_used_blocks(), 4);
    checked(&m);
}

#[test]
fn cache_disabled_shares_nothing_and_clear_frees_everything() {
    let cfg = KvConfig {
        num_blocks: 4,
        block_size: 2,
        enable_prefix_cache: false,
    };
    let mut m = ok(KvManager::try_new(cfg));
    run_prompt(&mut m, 1, &[1, 2, 3]);
    ok(m.free(1));
    assert_eq!((m.num_evictable_blocks(), m.num_free_blocks()), (0, 4));
    assert_eq!(run_prompt(&mut m, 2, &[1, 2, 3]), 0);

    let mut m = kv(4, 2);
    run_prompt(&mut m, 1, &[1, 2, 3]);
    run_prompt(&mut m, 2, &[1, 2, 4]);
    ok(m.free(1));
    m.clear_prefix_cache();
    assert_eq!(m.num_evictable_blocks(), 0);
    assert!(!m.is_cached(m.block_table(2).unwrap_or_default()[0]));
    // A running sequence re-offers its blocks at its next mark_computed.
    ok(m.mark_computed(2, 3));
    assert_eq!(m.cached_prefix_len(&[1, 2, 9]), 2);
    ok(m.free(2));
    m.clear_prefix_cache();
    assert_eq!((m.num_free_blocks(), m.num_used_blocks()), (4, 0));
    checked(&m);
}

#[test]
fn errors_name_what_is_wrong() {
    let mut m = kv(4, 2);
    assert_eq!(m.append(3, &[1]), Err(KvError::UnknownSeq(3)));
    assert_eq!(m.free(3), Err(KvError::UnknownSeq(3)));
    assert_eq!(m.mark_computed(3, 0), Err(KvError::UnknownSeq(3)));
    ok(m.admit(1, &[1, 2]));
    assert_eq!(m.admit(1, &[1]), Err(KvError::SeqExists(1)));
    let e = m.mark_computed(1, 3);
    assert_eq!(
        e,
        Err(KvError::ComputedBeyondLength {
            seq: 1,
            computed: 3,
            len: 2
        })
    );
    assert_eq!(m.slot(1, 2), None);
    assert!(!m.can_append(3, 0));
    let msg = KvError::OutOfBlocks { needed: 3, free: 1 }.to_string();
    assert_eq!(msg, "out of KV blocks: 3 needed, 1 allocatable");

    let bad = KvManager::try_new(KvConfig {
        num_blocks: 4,
        block_size: 0,
        enable_prefix_cache: true,
    });
    assert!(matches!(
        bad,
        Err(KvError::InvalidConfig {
            field: "block_size",
            ..
        })
    ));
    let huge = KvManager::try_new(KvConfig {
        num_blocks: 1 << 29,
        block_size: 16,
        enable_prefix_cache: false,
    });
    assert!(matches!(
        huge,
        Err(KvError::InvalidConfig {
            field: "num_blocks",
            ..
        })
    ));
    let max = KvManager::try_new(KvConfig {
        num_blocks: 2,
        block_size: 1 << 31,
        enable_prefix_cache: false,
    });
    assert!(max.is_ok(), "exactly 2^32 slots are addressable");
    let over = KvManager::try_new(KvConfig {
        num_blocks: 3,
        block_size: 1 << 31,
        enable_prefix_cache: false,
    });
    assert!(over.is_err());
}

/// `n > 1` choices: a fork shares the parent's full computed blocks (never
/// the last token's), with or without the prefix cache, and `can_fork`
/// agrees with `fork`.
#[test]
fn fork_shares_full_computed_blocks() {
    for cache in [false, true] {
        let mut m = KvManager::try_new(KvConfig {
            num_blocks: 8,
            block_size: 4,
            enable_prefix_cache: cache,
        })
        .unwrap_or_else(|e| panic!("config: {e}"));
        let prompt: Vec<u32> = (0..10).collect();
        ok(m.admit(1, &prompt));
        // nothing computed yet: nothing to share
        assert!(m.can_fork(1, &prompt));
        ok(m.mark_computed(1, 10));
        ok(m.append(1, &[77]));
        checked(&m);
        let parent: Vec<u32> = m.block_table(1).unwrap_or_default().to_vec();
        assert_eq!(ok(m.fork(1, 2, &prompt)), 8, "cache {cache}");
        checked(&m);
        let child = m.block_table(2).unwrap_or_default().to_vec();
        assert_eq!(&child[..2], &parent[..2]);
        assert_ne!(child[2], parent[2]);
        assert_eq!(m.ref_count(parent[0]), Some(2));
        assert_eq!(m.num_computed(2), Some(8));
        // an exact multiple of B: the last block is recomputed, not shared
        assert_eq!(ok(m.fork(1, 3, &prompt[..8])), 4);
        checked(&m);
        assert!(matches!(m.fork(1, 3, &prompt), Err(KvError::SeqExists(3))));
        assert!(matches!(m.fork(9, 4, &prompt), Err(KvError::UnknownSeq(9))));
        // 8 blocks: parent 3, child 2 has 1 new, child 3 has 1 new; 3 left
        assert_eq!(m.num_free_blocks(), 3);
        let long: Vec<u32> = (0..30).collect();
        assert_eq!(m.can_fork(1, &long), m.fork(1, 5, &long).is_ok());
        checked(&m);
        for s in [1, 2, 3] {
            ok(m.free(s));
        }
        checked(&m);
        assert_eq!(m.num_free_blocks(), 8);
    }
}

/// A token appended before its value is known (a pipelined step's sample)
/// gets its value while uncomputed; the block it fills is cached under the
/// real value; computed positions cannot be rewritten.
#[test]
fn set_token_rewrites_only_uncomputed_positions() {
    let mut m = kv(4, 2);
    assert_eq!(run_prompt(&mut m, 1, &[5, 6, 7]), 0);
    ok(m.append(1, &[0])); // placeholder at position 3
    ok(m.set_token(1, 3, 8));
    assert_eq!(m.seq_tokens(1), Some(&[5, 6, 7, 8][..]));
    assert!(matches!(
        m.set_token(1, 2, 9),
        Err(KvError::NotRewritable {
            pos: 2,
            computed: 3,
            len: 4,
            ..
        })
    ));
    assert!(matches!(
        m.set_token(1, 4, 9),
        Err(KvError::NotRewritable { pos: 4, .. })
    ));
    assert!(matches!(m.set_token(9, 0, 1), Err(KvError::UnknownSeq(9))));
    ok(m.mark_computed(1, 4));
    checked(&m);
    ok(m.free(1));
    // the second block was cached under [7, 8], not the placeholder
    assert_eq!(run_prompt(&mut m, 2, &[5, 6, 7, 8, 1]), 4);
}

#[test]
fn namespaces_never_share_cached_blocks() {
    // the same prompt under the base model (0) and two LoRA adapters (7, 9)
    let mut m = kv(32, 4);
    let prompt: Vec<u32> = (1..14).collect(); // 3 full blocks + 1
    assert_eq!(run_prompt(&mut m, 1, &prompt), 0);
    assert_eq!(
        ok(m.admit_in(2, &prompt, 7)),
        0,
        "adapter 7 reused base K/V"
    );
    ok(m.mark_computed(2, prompt.len()));
    checked(&m);
    assert!(m.can_admit_in(&prompt, 9));
    assert_eq!(ok(m.admit_in(3, &prompt, 9)), 0, "adapter 9 reused K/V");
    ok(m.mark_computed(3, prompt.len()));
    // within a namespace the cache serves as before
    assert_eq!(ok(m.admit_in(4, &prompt, 7)), 12);
    assert_eq!(ok(m.admit(5, &prompt)), 12);
    let (t2, t4) = (
        m.block_table(2).unwrap()[..3].to_vec(),
        m.block_table(4).unwrap()[..3].to_vec(),
    );
    assert_eq!(t2, t4);
    assert!(t2.iter().all(|b| !m.block_table(1).unwrap().contains(b)));
    assert!(t2.iter().all(|b| !m.block_table(3).unwrap().contains(b)));
    // a fork keeps its parent's namespace
    ok(m.fork(4, 6, &prompt));
    ok(m.mark_computed(6, prompt.len()));
    checked(&m);
    for s in 1..=6 {
        ok(m.free(s));
    }
    checked(&m);
    assert_eq!(ok(m.admit_in(7, &prompt, 9)), 12);
}

#[test]
fn fresh_admission_reuses_and_caches_nothing() {
    let mut m = kv(4, 2);
    let prompt = [1, 2, 3, 4, 5];
    run_prompt(&mut m, 1, &prompt);
    ok(m.free(1));
    // the prompt's two full blocks are cached; a fresh admission takes none
    assert!(m.num_evictable_blocks() >= 2);
    assert!(m.can_admit_fresh(prompt.len()));
    ok(m.admit_fresh(2, &prompt));
    assert_eq!(m.num_computed(2), Some(0));
    let table = m.block_table(2).unwrap_or_default().to_vec();
    assert_eq!(table.len(), 3);
    assert!(table.iter().all(|&b| !m.is_cached(b)));
    checked(&m);
    // out of blocks: refused exactly when can_admit_fresh says so
    assert!(!m.can_admit_fresh(3));
    assert!(matches!(
        m.admit_fresh(3, &[1, 2, 3]),
        Err(KvError::OutOfBlocks { needed: 2, free: 1 })
    ));
    assert!(matches!(m.admit_fresh(2, &[1]), Err(KvError::SeqExists(2))));
    ok(m.free(2));
    checked(&m);
    // nothing of the fresh sequence entered the prefix cache
    assert_eq!(m.num_free_blocks(), 4);
    assert!(m.num_evictable_blocks() <= 2);
}
