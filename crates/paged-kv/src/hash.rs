//! Chained block hashes for the prefix cache: block `i` of a prompt is keyed
//! by `hash(hash of block i-1, token ids of block i)`, the first block by
//! `hash(None, tokens)`, so equal keys mean (barring collisions) equal whole
//! prefixes. Collisions are harmless: every hit is verified against the
//! stored token ids and parent link (see `pool.rs`). O(B) per block.

use std::hash::{DefaultHasher, Hasher};

/// A block hash function: (parent block's hash, this block's token ids) -> key.
/// Replaceable (see [`crate::KvManager::with_block_hasher`]) so tests can force
/// collisions.
pub type BlockHasher = fn(parent: Option<u64>, tokens: &[u32]) -> u64;

/// The default chained hash (SipHash-1-3 with fixed keys, deterministic
/// within a build). O(tokens).
pub fn default_block_hash(parent: Option<u64>, tokens: &[u32]) -> u64 {
    let mut h = DefaultHasher::new();
    match parent {
        Some(p) => {
            h.write_u8(1);
            h.write_u64(p);
        }
        None => h.write_u8(0),
    }
    for &t in tokens {
        h.write_u32(t);
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chaining_distinguishes_parents_and_roots() {
        let a = default_block_hash(None, &[1, 2]);
        assert_eq!(a, default_block_hash(None, &[1, 2]));
        assert_ne!(a, default_block_hash(None, &[2, 1]));
        assert_ne!(
            default_block_hash(Some(a), &[3, 4]),
            default_block_hash(Some(a ^ 1), &[3, 4])
        );
        assert_ne!(
            default_block_hash(Some(0), &[3]),
            default_block_hash(None, &[3])
        );
    }
}
