//! [`TokenMask`]: the tokens a grammar allows at one sampling position, as a
//! bitset both backends apply to the logits before sampling.
//!
//! Contract: bit `i % 32` of word `i / 32` set means token `i` may be
//! sampled; a token past the mask's words is forbidden. A backend applies the
//! mask after the penalties and `logit_bias` (sampling step 3) by setting
//! every forbidden logit to `-inf`, so greedy, top-k, top-p and min-p only
//! ever see allowed tokens; the returned log-probability stays the raw
//! model's (it is read before any step, like the penalties). The engine
//! builds one per constrained row per step and hands it over in an `Arc`
//! ([`crate::SampleRequest::allowed`]); unconstrained rows carry `None` and
//! pay nothing. A mask that allows no token is never sent: the engine ends
//! that request first.
//!
//! Costs: `V / 32` words (6 KiB for a 49k vocabulary); [`TokenMask::allows`]
//! O(1); [`TokenMask::apply`] O(V).

/// Allowed tokens, one bit each (module doc).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenMask {
    words: Vec<u32>,
}

impl TokenMask {
    /// A mask from its words (bit `i % 32` of word `i / 32` is token `i`).
    pub fn from_words(words: Vec<u32>) -> Self {
        TokenMask { words }
    }

    /// A mask allowing exactly `ids` (ids past `vocab` are dropped).
    pub fn from_ids(vocab: usize, ids: &[u32]) -> Self {
        let mut words = vec![0u32; vocab.div_ceil(32)];
        for &id in ids {
            if (id as usize) < vocab {
                words[id as usize / 32] |= 1 << (id % 32);
            }
        }
        TokenMask { words }
    }

    /// The words, low token ids first.
    pub fn words(&self) -> &[u32] {
        &self.words
    }

    /// Whether token `id` may be sampled.
    pub fn allows(&self, id: u32) -> bool {
        self.words
            .get(id as usize / 32)
            .is_some_and(|w| w >> (id % 32) & 1 == 1)
    }

    /// Number of allowed tokens.
    pub fn count(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Sets every forbidden entry of `logits` (`[V]`) to `-inf`.
    pub fn apply(&self, logits: &mut [f32]) {
        for (i, v) in logits.iter_mut().enumerate() {
            if !self.allows(i as u32) {
                *v = f32::NEG_INFINITY;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_follow_ids_and_apply_forbids_the_rest() {
        let m = TokenMask::from_ids(70, &[0, 31, 32, 69, 70, 1000]);
        assert_eq!(m.words().len(), 3);
        assert_eq!(m.count(), 4);
        assert!(m.allows(31) && m.allows(32) && m.allows(69));
        assert!(!m.allows(1) && !m.allows(70) && !m.allows(5000));
        let mut z = vec![1.0f32; 72];
        m.apply(&mut z);
        assert_eq!(z[0], 1.0);
        assert_eq!(z[1], f32::NEG_INFINITY);
        assert_eq!(z[69], 1.0);
        // past the mask's bits: forbidden
        assert_eq!(z[71], f32::NEG_INFINITY);
    }
}
