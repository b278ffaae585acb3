//! [`NgramDrafter`]: prompt lookup decoding. The last `n` tokens of a
//! sequence, for `n` from [`NgramDrafter::max_n`] down to
//! [`NgramDrafter::min_n`], are searched among its earlier tokens (prompt
//! and output); the tokens that followed the latest earlier occurrence of
//! the longest matching `n` are the draft. Nothing is kept between calls.
//!
//! Costs: O(len x max_n) comparisons per proposal (a backward scan per `n`,
//! stopping at the first hit), no allocation.

use super::Drafter;

/// Prompt-lookup drafter (module doc).
#[derive(Debug, Clone, Copy)]
pub struct NgramDrafter {
    /// Shortest suffix looked up (at least 1).
    pub min_n: usize,
    /// Longest suffix looked up.
    pub max_n: usize,
}

impl Default for NgramDrafter {
    fn default() -> Self {
        NgramDrafter { min_n: 2, max_n: 4 }
    }
}

impl Drafter for NgramDrafter {
    fn propose(&mut self, _seq: u64, tokens: &[u32], max: usize, out: &mut Vec<u32>) {
        let len = tokens.len();
        if max == 0 {
            return;
        }
        for n in (self.min_n.max(1)..=self.max_n).rev() {
            if n >= len {
                continue;
            }
            let tail = &tokens[len - n..];
            // latest earlier occurrence: starts at i < len - n
            let hit = (0..len - n).rev().find(|&i| &tokens[i..i + n] == tail);
            if let Some(i) = hit {
                let from = i + n;
                let to = (from + max).min(len);
                out.extend_from_slice(&tokens[from..to]);
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draft(tokens: &[u32], max: usize) -> Vec<u32> {
        let mut out = Vec::new();
        NgramDrafter::default().propose(0, tokens, max, &mut out);
        out
    }

    #[test]
    fn continues_the_latest_longest_match() {
        // "1 2 3" occurs earlier followed by 4 5 6; the longer "9 1 2 3" too,
        // followed by 7 8: the longest match wins
        let t = [9, 1, 2, 3, 7, 8, 0, 1, 2, 3, 4, 5, 6, 9, 1, 2, 3];
        assert_eq!(draft(&t, 2), vec![7, 8]);
        // only "2 3" matches (twice): the latest occurrence's continuation
        let t = [2, 3, 5, 2, 3, 6, 7, 1, 2, 3];
        assert_eq!(draft(&t, 3), vec![6, 7, 1]);
        // the draft stops at the end of the sequence
        let t = [5, 6, 5, 6];
        assert_eq!(draft(&t, 8), vec![5, 6]);
    }

    #[test]
    fn proposes_nothing_without_a_match() {
        assert!(draft(&[1, 2, 3, 4, 5], 4).is_empty());
        assert!(draft(&[1], 4).is_empty());
        assert!(draft(&[1, 2, 1, 2], 0).is_empty());
    }
}
