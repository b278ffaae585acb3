//! [`PenaltyHistory`]: the distinct tokens a request has seen (prompt +
//! generated), the set the repetition penalty applies to, and how often each
//! generated token occurred, what the presence and frequency penalties read.
//!
//! Contract: the ids are kept sorted ascending and distinct, so a backend
//! uses them as they are (no sort, no dedup per step); so are the
//! `(id, count)` pairs of generated tokens. The engine keeps one per
//! sequence that has a penalty on (`SamplingParams::needs_history`), built
//! from the prompt once and updated as each generated token is appended
//! ([`PenaltyHistory::push_generated`]); each step hands the backend an
//! `Arc` of it (a reference-count bump, never a copy of the history). The
//! owner updates it in place through [`std::sync::Arc::get_mut`] /
//! [`std::sync::Arc::make_mut`] once the step's batch has dropped its clones.
//!
//! Costs: building from `n` tokens is O(n log n); [`PenaltyHistory::insert`]
//! is O(log d) for a token already seen and O(d) (a `memmove` of `u32`s) for a
//! new one, `d` = distinct tokens so far; `push_generated` adds the same for
//! the counts; memory O(d).

use crate::sampling::SamplingParams;

/// Sorted distinct token ids, and counts of the generated ones.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PenaltyHistory {
    ids: Vec<u32>,
    /// `(id, times generated)`, ids ascending and distinct, counts >= 1.
    generated: Vec<(u32, u32)>,
}

impl PenaltyHistory {
    /// The distinct ids of `tokens`.
    pub fn from_tokens(tokens: &[u32]) -> Self {
        let mut ids = tokens.to_vec();
        ids.sort_unstable();
        ids.dedup();
        PenaltyHistory {
            ids,
            generated: Vec::new(),
        }
    }

    /// Records one generated token: seen (for the repetition penalty) and
    /// counted (for presence and frequency). Returns whether it was new to
    /// the seen set.
    pub fn push_generated(&mut self, token: u32) -> bool {
        match self.generated.binary_search_by_key(&token, |&(id, _)| id) {
            Ok(at) => self.generated[at].1 = self.generated[at].1.saturating_add(1),
            Err(at) => self.generated.insert(at, (token, 1)),
        }
        self.insert(token)
    }

    /// `(id, times generated)` of the tokens generated so far, ids ascending.
    pub fn generated_counts(&self) -> &[(u32, u32)] {
        &self.generated
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

/// The additive step of the sampling procedure (`sampling` step 3) as
/// `(id, delta)` pairs appended to `out`, ids ascending and distinct:
/// `delta = bias - (c * frequency_penalty + presence_penalty)` for a token
/// generated `c > 0` times (`bias` 0 when not listed), `delta = bias` for a
/// listed token not generated. Both backends add exactly these f32 values,
/// so they agree bit for bit. O(generated distinct + biased), a merge of two
/// sorted lists; nothing when no penalty or bias is set.
pub fn additive_terms(
    params: &SamplingParams,
    history: Option<&PenaltyHistory>,
    out: &mut Vec<(u32, f32)>,
) {
    let (fp, pp) = (params.frequency_penalty, params.presence_penalty);
    let counts: &[(u32, u32)] = match history {
        Some(h) if fp != 0.0 || pp != 0.0 => h.generated_counts(),
        _ => &[],
    };
    let bias = &params.logit_bias[..];
    let penalty = |c: u32| c as f32 * fp + pp;
    let (mut i, mut j) = (0, 0);
    while i < counts.len() || j < bias.len() {
        let c = counts.get(i).copied();
        let b = bias.get(j).copied();
        match (c, b) {
            (Some((ci, n)), Some((bi, bv))) if ci == bi => {
                out.push((ci, bv - penalty(n)));
                i += 1;
                j += 1;
            }
            (Some((ci, n)), Some((bi, _))) if ci < bi => {
                out.push((ci, 0.0 - penalty(n)));
                i += 1;
            }
            (Some((ci, n)), None) => {
                out.push((ci, 0.0 - penalty(n)));
                i += 1;
            }
            (_, Some((bi, bv))) => {
                out.push((bi, bv));
                j += 1;
            }
            (None, None) => break,
        }
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

    #[test]
    fn generated_tokens_are_counted_apart_from_the_prompt() {
        let mut h = PenaltyHistory::from_tokens(&[5, 3]);
        assert!(h.generated_counts().is_empty());
        assert!(!h.push_generated(5));
        assert!(h.push_generated(9));
        assert!(!h.push_generated(5));
        assert_eq!(h.generated_counts(), &[(5, 2), (9, 1)]);
        assert_eq!(h.as_slice(), &[3, 5, 9]);
    }

    #[test]
    fn additive_terms_merge_penalties_and_bias() {
        let mut h = PenaltyHistory::from_tokens(&[1, 2]);
        for t in [4, 4, 4, 8] {
            h.push_generated(t);
        }
        let p = SamplingParams {
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            logit_bias: std::sync::Arc::from(vec![(2, 3.0), (4, 1.0), (9, -100.0)]),
            ..Default::default()
        };
        let mut out = Vec::new();
        additive_terms(&p, Some(&h), &mut out);
        // prompt tokens 1, 2 are not penalised; 4 three times, 8 once
        assert_eq!(
            out,
            vec![(2, 3.0), (4, 1.0 - 1.25), (8, -0.75), (9, -100.0)]
        );
        out.clear();
        additive_terms(&SamplingParams::default(), Some(&h), &mut out);
        assert!(out.is_empty());
    }
}
