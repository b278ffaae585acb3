//! Sliding-window freeing: on a model whose every layer attends within a
//! window of `W` positions (Mistral-style), a token at position `p` reads
//! keys `p + 1 - W ..= p` only, so once a sequence's KV is computed up to
//! `c` (the next position to compute is `c`), no position still to be
//! computed reads a key before `c + 1 - W`. Every block wholly before that
//! key goes back to the pool as decoding proceeds ([`KvManager::with_window`]),
//! after the prefix cache has registered it: a cached block becomes
//! cached-evictable (a later prompt may still reuse it), an uncached one free.
//! Its table entry stays in place (positions still index the table by
//! `p / B`) as a stale id that the backends never read
//! ([`KvManager::released_blocks`] counts them).
//!
//! A model with some layer that sees the whole context (Gemma 3's global
//! layers among its local ones) frees nothing: one pool serves every layer,
//! and the global layers read every block. Freeing the local layers' blocks
//! alone would take a pool per layer group, which this crate does not have.
//!
//! A sequence with released blocks shares nothing by [`KvManager::fork`]
//! (its leading entries are stale); a prompt that hits a cached prefix
//! longer than the window revives its blocks, and its first
//! `mark_computed` releases those before its window again.
//! Costs: O(released blocks) inside `mark_computed`.

use crate::manager::Seq;
use crate::pool::BlockPool;
use crate::{KvError, KvManager, SeqId};

impl KvManager {
    /// The same manager freeing blocks outside a sliding window of `window`
    /// positions (module doc): `Some(W)` only when every layer of the model
    /// attends within at most `W` positions, `None` (nothing freed) when
    /// some layer sees the whole context. Set before any sequence is
    /// admitted; a window of 0 positions is refused.
    pub fn with_window(mut self, window: Option<usize>) -> Result<Self, KvError> {
        if window == Some(0) {
            return Err(KvError::InvalidConfig {
                field: "window",
                value: 0,
                reason: "a window holds at least the token itself",
            });
        }
        self.window = window;
        Ok(self)
    }

    /// [`release_outside`] for sequence `seq` (after an admission or a fork
    /// whose reused prefix reaches past the window).
    pub(crate) fn release_seq(&mut self, seq: SeqId) {
        if let Some(s) = self.seqs.get_mut(&seq) {
            release_outside(s, &mut self.pool, self.window, self.block_size);
        }
    }

    /// The sliding window blocks are freed outside (`None`: never).
    pub fn window(&self) -> Option<usize> {
        self.window
    }

    /// Leading entries of `seq`'s block table whose blocks went back to the
    /// pool (stale ids, never read).
    pub fn released_blocks(&self, seq: SeqId) -> Option<usize> {
        self.seqs.get(&seq).map(|s| s.released)
    }
}

/// Blocks of a sequence computed up to `computed` that no position still to
/// be computed reads under a window of `window` positions: those wholly
/// before key `computed + 1 - window`.
pub(crate) fn dead_blocks(computed: usize, window: usize, block_size: usize) -> usize {
    (computed + 1).saturating_sub(window) / block_size
}

/// Gives `s`'s blocks wholly outside the window back to the pool (module doc).
pub(crate) fn release_outside(s: &mut Seq, pool: &mut BlockPool, window: Option<usize>, bs: usize) {
    let Some(w) = window else { return };
    let dead = dead_blocks(s.computed, w, bs).min(s.table.len());
    for &b in &s.table[s.released.min(dead)..dead] {
        pool.decref(b);
    }
    s.released = s.released.max(dead);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_is_dead_once_the_next_position_cannot_see_it() {
        // window 4, blocks of 2: after computing 0..c, position c sees c-3..=c
        let dead = |c| dead_blocks(c, 4, 2);
        assert_eq!(dead(0), 0);
        assert_eq!(dead(4), 0); // position 4 sees 1..=4: block 0 (0, 1) still read
        assert_eq!(dead(5), 1); // position 5 sees 2..=5: block 0 dead
        assert_eq!(dead(6), 1);
        assert_eq!(dead(7), 2);
        // the definition, against every position's first key
        for (c, w, b) in [
            (0, 1, 1),
            (9, 1, 1),
            (37, 5, 4),
            (100, 37, 16),
            (16, 17, 16),
        ] {
            let first = (c + 1usize).saturating_sub(w);
            let d = dead_blocks(c, w, b);
            assert!(
                d * b <= first,
                "c {c} w {w} b {b}: a dead block holds a key still read"
            );
            assert!(
                (d + 1) * b > first,
                "c {c} w {w} b {b}: a block wholly before {first} kept"
            );
        }
    }
}
