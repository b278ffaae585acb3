//! [`KvManager::check_invariants`]: verifies the crate-level invariants in
//! O(num_blocks + total table entries). For tests and debug assertions; a
//! failure is a bug in this crate, reported with the block or sequence at fault.

use crate::{KvError, KvManager};

impl KvManager {
    /// Checks every invariant of the crate doc: pool structure (free stack,
    /// LRU, hash index), free + in use + cached-evictable = total, refcounts
    /// equal table references, writable blocks exclusive and uncached,
    /// table sizes match sequence lengths, recorded tokens of cached blocks
    /// match every sequence sharing them, and under a window exactly the
    /// blocks wholly before every window still read are released (their
    /// stale entries hold no reference).
    pub fn check_invariants(&self) -> Result<(), KvError> {
        let bad = |m: String| Err(KvError::InvariantViolated(m));
        if let Err(m) = self.pool.check() {
            return bad(m);
        }
        let n = self.num_blocks();
        let bs = self.block_size;
        let mut refs = vec![0u32; n]; // [N]
        for (&id, s) in &self.seqs {
            if s.table.len() != self.blocks_for(s.tokens.len()) {
                return bad(format!(
                    "seq {id}: {} blocks for {} tokens",
                    s.table.len(),
                    s.tokens.len()
                ));
            }
            let window_ok = match self.window {
                None => s.released == 0,
                Some(w) => s.released == crate::window::dead_blocks(s.computed, w, bs),
            };
            if !window_ok {
                return bad(format!(
                    "seq {id}: {} blocks released with {} tokens computed under window {:?}",
                    s.released, s.computed, self.window
                ));
            }
            if s.computed > s.tokens.len()
                || s.registered > s.computed / bs
                || s.hashes.len() < s.registered
            {
                return bad(format!(
                    "seq {id}: computed {} / registered {} / hashes {} inconsistent with length {}",
                    s.computed,
                    s.registered,
                    s.hashes.len(),
                    s.tokens.len()
                ));
            }
            for (i, &b) in s.table.iter().enumerate().skip(s.released) {
                let Some(r) = refs.get_mut(b as usize) else {
                    return bad(format!("seq {id}: block {b} out of range"));
                };
                *r += 1;
                if let Some(rec) = self.pool.recorded_tokens(b)
                    && (i >= s.computed / bs || rec != &s.tokens[i * bs..(i + 1) * bs])
                {
                    return bad(format!(
                        "seq {id}: cached block {b} at index {i} is writable or records other tokens"
                    ));
                }
            }
        }
        let mut in_use = 0;
        for (b, &r) in refs.iter().enumerate() {
            if self.pool.ref_count(b as u32) != Some(r) {
                return bad(format!(
                    "block {b}: refcount {:?} but {r} table references",
                    self.pool.ref_count(b as u32)
                ));
            }
            in_use += usize::from(r > 0);
        }
        if in_use + self.pool.num_allocatable() != n {
            return bad(format!(
                "{in_use} in use + {} allocatable != {n} blocks",
                self.pool.num_allocatable()
            ));
        }
        for (&id, s) in &self.seqs {
            for &b in &s.table[(s.computed / bs).min(s.table.len())..] {
                if refs[b as usize] != 1 {
                    return bad(format!(
                        "seq {id}: writable block {b} has {} holders",
                        refs[b as usize]
                    ));
                }
            }
        }
        Ok(())
    }
}
