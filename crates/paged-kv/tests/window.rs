//! Sliding-window freeing: on a pool whose every layer is windowed, blocks
//! wholly before the window of a sequence's next position go back to the
//! pool as it decodes (a long generation holds O(window) blocks); without a
//! window (a model with global layers) nothing is freed; the prefix cache
//! still serves a prefix longer than the window, and forks, frees and the
//! invariants hold throughout.

use paged_kv::{KvConfig, KvError, KvManager};

fn kv(num_blocks: usize, block_size: usize, window: Option<usize>, cache: bool) -> KvManager {
    KvManager::try_new(KvConfig {
        num_blocks,
        block_size,
        enable_prefix_cache: cache,
    })
    .and_then(|m| m.with_window(window))
    .unwrap_or_else(|e| panic!("config: {e}"))
}

fn ok<T>(r: Result<T, KvError>) -> T {
    r.unwrap_or_else(|e| panic!("unexpected error: {e}"))
}

/// Admits `prompt` as `seq`, computes it, then decodes `n` tokens one at a
/// time (appended, then computed), checking the invariants after each; returns
/// the most blocks the sequence held at once.
fn decode(m: &mut KvManager, seq: u64, prompt: &[u32], n: usize) -> usize {
    ok(m.admit(seq, prompt));
    ok(m.mark_computed(seq, prompt.len()));
    ok(m.check_invariants());
    let mut most = 0;
    for i in 0..n {
        ok(m.append(seq, &[1000 + i as u32]));
        let len = m.seq_len(seq).unwrap();
        ok(m.mark_computed(seq, len));
        ok(m.check_invariants());
        let held = m.block_table(seq).unwrap().len() - m.released_blocks(seq).unwrap();
        most = most.max(held);
    }
    most
}

#[test]
fn a_windowed_pool_frees_blocks_behind_the_window() {
    for cache in [false, true] {
        // window 5, blocks of 2: position p reads p-4..=p
        let mut m = kv(8, 2, Some(5), cache);
        let most = decode(&mut m, 1, &[1, 2, 3], 40);
        // 43 tokens in 22 blocks, only those of the window (and the block
        // being written) held: ceil(5 / 2) + 1
        assert_eq!(m.block_table(1).unwrap().len(), 22);
        assert!(most <= 4, "held {most} blocks at once");
        // computed 43: position 43 reads 39..=43, so blocks 0..=18 are gone
        assert_eq!(m.released_blocks(1), Some(19));
        assert_eq!(m.num_used_blocks(), 3);
        // what was released is allocatable by another sequence
        ok(m.admit(2, &[7; 9]));
        ok(m.check_invariants());
        ok(m.free(1));
        ok(m.free(2));
        m.clear_prefix_cache();
        ok(m.check_invariants());
        assert_eq!(m.num_free_blocks(), 8);
    }
}

#[test]
fn without_a_window_nothing_is_freed() {
    // a model with global layers (Gemma 3): every block stays with its sequence
    let mut m = kv(64, 2, None, true);
    decode(&mut m, 1, &[1, 2, 3], 40);
    assert_eq!(m.released_blocks(1), Some(0));
    assert_eq!(m.num_used_blocks(), 22);
}

#[test]
fn a_cached_prefix_longer_than_the_window_is_reused() {
    let mut m = kv(32, 2, Some(5), true);
    let prompt: Vec<u32> = (0..20).collect();
    ok(m.admit(1, &prompt));
    ok(m.mark_computed(1, 20));
    // blocks before position 20's window went back, cached (evictable)
    assert_eq!(m.released_blocks(1), Some(8));
    assert_eq!(m.num_evictable_blocks(), 8);
    ok(m.free(1));
    ok(m.check_invariants());
    // the same prefix and one more token: every full block is a hit, the
    // ones before the new position's window released again at once
    let mut longer = prompt.clone();
    longer.push(99);
    assert_eq!(m.cached_prefix_len(&longer), 20);
    assert_eq!(ok(m.admit(2, &longer)), 20);
    assert_eq!(m.released_blocks(2), Some(8));
    ok(m.check_invariants());
    ok(m.mark_computed(2, 21));
    assert_eq!(m.released_blocks(2), Some(8));
    ok(m.check_invariants());
}

#[test]
fn a_parent_with_released_blocks_forks_nothing() {
    let mut m = kv(32, 2, Some(5), true);
    let prompt: Vec<u32> = (0..12).collect();
    ok(m.admit(1, &prompt));
    ok(m.mark_computed(1, 12));
    assert!(m.released_blocks(1).unwrap() > 0);
    assert!(m.can_fork(1, &prompt));
    assert_eq!(ok(m.fork(1, 2, &prompt)), 0);
    ok(m.check_invariants());
    // without a window, the same fork shares the full computed blocks
    let mut plain = kv(32, 2, None, true);
    ok(plain.admit(1, &prompt));
    ok(plain.mark_computed(1, 12));
    assert_eq!(ok(plain.fork(1, 2, &prompt)), 10);
}

#[test]
fn truncation_and_preemption_keep_the_window_rule() {
    let mut m = kv(32, 2, Some(5), false);
    decode(&mut m, 1, &[1, 2, 3], 10);
    let len = m.seq_len(1).unwrap();
    // drafts appended and rejected: released entries untouched
    ok(m.append(1, &[5, 6, 7]));
    ok(m.truncate(1, len));
    ok(m.check_invariants());
    // preempted: every held block back, the released ones not twice
    ok(m.free(1));
    ok(m.check_invariants());
    assert_eq!(m.num_free_blocks(), 32);
}

#[test]
fn a_window_of_zero_is_refused_by_name() {
    let m = KvManager::try_new(KvConfig::new(4)).unwrap();
    let e = m.with_window(Some(0)).unwrap_err().to_string();
    assert!(e.contains("window") && e.contains('0'), "{e}");
}
