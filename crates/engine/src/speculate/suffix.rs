//! [`SuffixDrafter`]: suffix decoding over this sequence's tokens and the
//! tokens of recently finished sequences (prompt + output).
//!
//! A proposal finds every earlier place where the longest suffix of the
//! sequence (at least [`SuffixDrafter::min_match`], at most
//! [`SuffixDrafter::max_match`] tokens) occurred, then walks forward from
//! all of them at once: at each depth the most frequent next token among
//! the places still agreeing is drafted (lowest id on ties), and the places
//! that continue otherwise drop out. The draft's confidence is the product
//! of each chosen token's share; drafting stops when it falls below
//! [`SuffixDrafter::min_confidence`], so a draft is long where the history
//! agrees and short where it is split: the draft length adapts to the
//! match. This is what a suffix tree's frequency-weighted walk proposes,
//! computed by a scan instead of a tree.
//!
//! Memory is bounded: finished sequences are kept newest first up to
//! [`SuffixDrafter::max_corpus_tokens`] tokens in all (a longer sequence
//! keeps its last tokens), the oldest evicted first.
//!
//! Costs: a proposal is O(C + len) comparisons for a corpus of C tokens
//! (plus O(matches x max_match) to measure the matches); finishing a
//! sequence O(its tokens + evicted sequences).

use std::collections::{HashMap, VecDeque};

use super::Drafter;

/// Suffix-decoding drafter (module doc).
#[derive(Debug, Clone)]
pub struct SuffixDrafter {
    /// Shortest suffix match that drafts.
    pub min_match: usize,
    /// Longest suffix compared.
    pub max_match: usize,
    /// Drafting stops below this confidence (product of the chosen tokens'
    /// shares among the matching places).
    pub min_confidence: f64,
    /// Most tokens of finished sequences kept.
    pub max_corpus_tokens: usize,
    corpus: VecDeque<Vec<u32>>,
    corpus_tokens: usize,
}

impl Default for SuffixDrafter {
    fn default() -> Self {
        SuffixDrafter {
            min_match: 2,
            max_match: 32,
            min_confidence: 0.4,
            max_corpus_tokens: 1 << 16,
            corpus: VecDeque::new(),
            corpus_tokens: 0,
        }
    }
}

/// A place whose preceding tokens match the sequence's suffix: document
/// (`None`: the sequence itself) and the index of the token after the match.
type Place = (Option<usize>, usize);

impl SuffixDrafter {
    /// Tokens of finished sequences kept now.
    pub fn corpus_tokens(&self) -> usize {
        self.corpus_tokens
    }

    fn doc<'a>(&'a self, d: Option<usize>, own: &'a [u32]) -> &'a [u32] {
        match d {
            Some(i) => &self.corpus[i],
            None => own,
        }
    }

    /// The places matching the longest suffix of `tokens`.
    fn longest_matches(&self, tokens: &[u32]) -> Vec<Place> {
        let len = tokens.len();
        let (mut best, mut places) = (self.min_match.max(1), Vec::new());
        let own = &tokens[..len - 1]; // a match must end before the suffix itself
        let docs = std::iter::once((None, own)).chain(
            self.corpus
                .iter()
                .enumerate()
                .map(|(i, d)| (Some(i), d.as_slice())),
        );
        for (d, doc) in docs {
            for p in 1..=doc.len() {
                if doc[p - 1] != tokens[len - 1] {
                    continue;
                }
                let limit = self.max_match.min(p).min(len);
                let l = (0..limit)
                    .take_while(|&i| doc[p - 1 - i] == tokens[len - 1 - i])
                    .count();
                if l > best {
                    best = l;
                    places.clear();
                }
                if l == best {
                    places.push((d, p));
                }
            }
        }
        places
    }
}

impl Drafter for SuffixDrafter {
    fn propose(&mut self, _seq: u64, tokens: &[u32], max: usize, out: &mut Vec<u32>) {
        if max == 0 || tokens.is_empty() {
            return;
        }
        let mut places = self.longest_matches(tokens);
        let mut confidence = 1.0;
        let mut counts: HashMap<u32, usize> = HashMap::new();
        for depth in 0..max {
            counts.clear();
            let mut live = 0;
            for &(d, p) in &places {
                if let Some(&t) = self.doc(d, tokens).get(p + depth) {
                    *counts.entry(t).or_default() += 1;
                    live += 1;
                }
            }
            let Some((&tok, &n)) = counts.iter().max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
            else {
                return;
            };
            confidence *= n as f64 / live as f64;
            if confidence < self.min_confidence {
                return;
            }
            out.push(tok);
            places.retain(|&(d, p)| self.doc(d, tokens).get(p + depth) == Some(&tok));
        }
    }

    fn finished(&mut self, _seq: u64, tokens: &[u32]) {
        let keep = tokens.len().min(self.max_corpus_tokens);
        if keep == 0 {
            return;
        }
        self.corpus
            .push_back(tokens[tokens.len() - keep..].to_vec());
        self.corpus_tokens += keep;
        while self.corpus_tokens > self.max_corpus_tokens {
            match self.corpus.pop_front() {
                Some(d) => self.corpus_tokens -= d.len(),
                None => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draft(s: &mut SuffixDrafter, tokens: &[u32], max: usize) -> Vec<u32> {
        let mut out = Vec::new();
        s.propose(0, tokens, max, &mut out);
        out
    }

    #[test]
    fn a_finished_sequence_is_drafted_again() {
        let mut s = SuffixDrafter::default();
        let first: Vec<u32> = (0..40).map(|i| (i * 7 % 13) as u32 + 100).collect();
        s.finished(1, &first);
        // the same prompt start: the rest of the first run is proposed
        assert_eq!(draft(&mut s, &first[..10], 5), first[10..15].to_vec());
        assert!(draft(&mut s, &[1, 2, 3], 5).is_empty());
    }

    #[test]
    fn the_most_frequent_continuation_wins_and_splits_cut_the_draft() {
        let mut s = SuffixDrafter::default();
        s.finished(1, &[5, 6, 7, 8, 1]);
        s.finished(2, &[5, 6, 7, 8, 2]);
        s.finished(3, &[5, 6, 7, 9, 3]);
        // 7 follows in all three; then 8 in two of three (confidence 2/3),
        // then a split 1 / 2 (confidence 1/3, below 0.4: stops)
        assert_eq!(draft(&mut s, &[4, 5, 6], 4), vec![7, 8]);
    }

    #[test]
    fn the_corpus_is_bounded_oldest_out() {
        let mut s = SuffixDrafter {
            max_corpus_tokens: 10,
            ..SuffixDrafter::default()
        };
        s.finished(1, &[1, 2, 3, 4, 5, 6]);
        s.finished(2, &[7, 8, 9, 10, 11, 12]);
        assert_eq!(s.corpus_tokens(), 6);
        assert!(draft(&mut s, &[1, 2], 2).is_empty());
        assert_eq!(draft(&mut s, &[7, 8], 2), vec![9, 10]);
        s.finished(3, &(0..30).collect::<Vec<u32>>());
        assert_eq!(s.corpus_tokens(), 10);
        assert_eq!(draft(&mut s, &[21, 22], 3), vec![23, 24, 25]);
    }
}
