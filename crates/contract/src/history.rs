//! [`PenaltyHistory`]: the distinct tokens a request has seen (prompt +
//! generated), the set the repetition penalty applies to.
//!
//! Contract: the ids are kept sorted ascending and distinct, so a backend
//! uses them as they are (no sort, no dedup per step). The engine keeps one
//! per sequence whose `repetition_penalty != 1`, built from the prompt once and
//! updated as each token is appended; each step hands the backend an
//! `Arc` of it (a reference-count bump, never a copy of the history). The
//! owner updates it in place through [`std::sync::Arc::get_mut`] /
//! [`std::sync::Arc::make_mut`] once the step's batch has dropped its clones.
//!
//! Costs: building from `n` tokens is O(n log n); [`PenaltyHistory::insert`]
//! is O(log d) for a token already seen and O(d) (a `memmove` of `u32`s) for a
//! new one, `d` = distinct tokens so far; memory O(d).

/// Sorted distinct token ids.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PenaltyHistory {
    ids: Vec<u32>,
}

impl PenaltyHistory {
    /// The distinct ids of `tokens`.
    pub fn from_tokens(tokens: &[u32]) -> Self {
        let mut ids = tokens.to_vec();
        ids.sort_unstable();
        ids.dedup();
        PenaltyHistory { ids }
    }

    /// Adds `token`; returns whether it was new.
    pub fn insert(&mut self, token: u32) -> bool {
        match self.ids.binary_search(&token) {
            Ok(_) => false,
            Err(at) => {
                self.ids.insert(at, token);
                true
            }
        }
    }

    /// The ids, ascending and distinct.
    pub fn as_slice(&self) -> &[u32] {
        &self.ids
    }

    /// Distinct tokens seen.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// True when no token was seen.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorted_distinct_and_incremental() {
        let mut h = PenaltyHistory::from_tokens(&[5, 3, 5, 1]);
        assert_eq!(h.as_slice(), &[1, 3, 5]);
        assert!(!h.insert(3));
        assert!(h.insert(4));
        assert!(h.insert(0));
        assert_eq!(h.as_slice(), &[0, 1, 3, 4, 5]);
        assert_eq!(h.len(), 5);
        assert!(PenaltyHistory::default().is_empty());
    }
}
