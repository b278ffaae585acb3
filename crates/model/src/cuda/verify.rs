//! Verify rows (speculative decoding) as decode rows.
//!
//! Contract: a step whose every sequence runs one token, except drafted
//! ones running exactly their `1 + K` sampled rows, is [`expand`]ed into a
//! pure-decode step: row `j` of a drafted segment becomes a one-token
//! sequence at its own position, over the same block table, attending to
//! `position + 1` keys, sampled with the request's `step + j`. Within each
//! layer every row writes its K/V before attention reads, so row `j` sees
//! the drafts before it exactly as a prefill chunk would; the step then
//! replays the decode graph of its batch bucket instead of running eagerly.
//! Token indices are unchanged (so are carried tokens); [`fold`] maps the
//! sampler rows back to the drafted sequences, whose rows stay consecutive.
//! A step that also holds prefill chunks expands the same way, its chunks
//! whole: a mixed step, run eagerly, each verify row still with its own
//! history. Steps [`expand`] cannot take (a drafted segment that is not
//! exactly its sampled rows) run as they are, one history and one mask per
//! sequence ([`check_unexpanded`]: refused when a drafted sequence has a
//! penalty history or a grammar mask, which its rows would share). The
//! expansion gives each row its own grammar mask too
//! (`StepBatch::row_request`), so the backend claims
//! `Backend::verifies_masks`: the engine's drafted segments are exactly
//! their sampled rows, and its prefill chunks carry no token.
//!
//! Costs: O(T + S x max_blocks) host work for a step that drafted.

use contract::backend::{BackendError, StepBatch};
use contract::step_builder::StepBuilder;

use super::workspace::OutRow;

/// `batch` with every drafted segment's rows as one-token sequences
/// (module doc): a pure-decode step when every other segment is one token,
/// else a mixed step whose other segments (prefill chunks) stay whole.
/// `None` when it has no drafts, a drafted segment that is not exactly its
/// sampled rows, or a carried token inside a chunk.
pub(super) fn expand(batch: &StepBatch, block_size: usize) -> Option<StepBatch> {
    if batch.drafts.iter().all(|&k| k == 0) {
        return None;
    }
    let s = batch.num_seqs();
    let len = |q: usize| (batch.cu_seqlens[q + 1] - batch.cu_seqlens[q]) as usize;
    if (0..s).any(|q| batch.drafts_of(q) > 0 && len(q) != 1 + batch.drafts_of(q)) {
        return None;
    }
    let mut sb = StepBuilder::new(block_size);
    let mut carried = batch.carried.iter().peekable();
    for q in 0..s {
        let first = batch.cu_seqlens[q] as usize;
        let table = batch.block_table(q);
        // a drafted segment row by row, any other segment whole
        let runs: Vec<(usize, usize)> = match batch.drafts_of(q) {
            0 => vec![(first, first + len(q))],
            _ => (first..first + len(q)).map(|i| (i, i + 1)).collect(),
        };
        for (a, b) in runs {
            let req = match batch.drafts_of(q) {
                0 => batch.samples[q].clone(),
                _ => batch.row_request(q, a),
            };
            let pos = batch.positions[a] as usize;
            sb.push(&batch.tokens[a..b], pos, table, req).ok()?;
            while let Some(&&c) = carried.peek()
                && (c.token as usize) < b
            {
                // only a run's last token can be carried
                if c.token as usize != b - 1 {
                    return None;
                }
                sb.carry_last(c.from);
                carried.next();
            }
            if let Some(&p) = batch.prompt_lens.get(q) {
                sb.set_prompt_len(p as usize);
            }
            sb.set_lora(batch.lora_of(q));
        }
    }
    sb.finish();
    Some(sb.take())
}

/// A drafted step that [`expand`] leaves as it is runs eagerly with one
/// history and one mask per sequence: refused when a drafted sequence has
/// a penalty history or a grammar mask (its rows would share it).
pub(super) fn check_unexpanded(batch: &StepBatch) -> Result<(), BackendError> {
    let shared = (0..batch.num_seqs()).find_map(|s| {
        let r = batch.samples[s]
            .as_ref()
            .filter(|_| batch.drafts_of(s) > 0)?;
        match (r.history.is_some(), r.allowed.is_some()) {
            (true, _) => Some((s, "a penalty history")),
            (_, true) => Some((s, "a grammar mask")),
            _ => None,
        }
    });
    match shared {
        Some((s, what)) => Err(BackendError::InvalidBatch(format!(
            "drafts[{s}] = {}: the CUDA backend verifies drafts of a sequence with {what} only in a step whose drafted segments are exactly their sampled rows and whose other segments are one token",
            batch.drafts_of(s)
        ))),
        None => Ok(()),
    }
}

/// `orig`'s sampler rows from those of its [`expand`]ed step (`rows`, one
/// per expanded sequence): a drafted sequence's first row, owning the
/// `K` rows after it.
pub(super) fn fold(orig: &StepBatch, rows: &[Option<OutRow>]) -> Vec<Option<OutRow>> {
    let mut next = 0;
    (0..orig.num_seqs())
        .map(|q| {
            let k = orig.drafts_of(q);
            let own = rows.get(next).copied().flatten();
            next += 1 + k;
            own.map(|(row, n, _)| (row, n, k))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use contract::SamplingParams;
    use contract::backend::SampleRequest;

    fn req(step: u64) -> Option<SampleRequest> {
        Some(SampleRequest {
            params: SamplingParams::default(),
            step,
            history: None,
            allowed: None,
        })
    }

    /// A one-token sequence (carried) beside a drafted one of 1 + 2 rows.
    fn drafted() -> StepBatch {
        let mut sb = StepBuilder::new(4);
        sb.push(&[7], 9, &[3, 4, 5], req(1)).unwrap();
        sb.carry_last(0);
        sb.push(&[1, 2, 3], 5, &[6, 8], req(10)).unwrap();
        sb.set_drafts(2);
        sb.finish();
        sb.take()
    }

    /// A prefill chunk beside a drafted sequence with a penalty history:
    /// the chunk stays whole, the drafted rows become one-token sequences,
    /// each with the history of the drafts before it.
    #[test]
    fn a_step_with_a_prefill_chunk_expands_its_drafted_rows_only() {
        use contract::history::PenaltyHistory;
        use std::sync::Arc;
        let mut sb = StepBuilder::new(4);
        sb.push(&[40, 41, 42, 43, 44], 0, &[1, 2], req(0)).unwrap();
        let mut r = req(10);
        if let Some(r) = r.as_mut() {
            r.history = Some(Arc::new(PenaltyHistory::from_tokens(&[50])));
        }
        sb.push(&[1, 2, 3], 5, &[6, 8], r).unwrap();
        sb.set_drafts(2);
        sb.finish();
        let b = sb.take();
        assert!(
            check_unexpanded(&b).is_err(),
            "the eager form shares the history"
        );
        let e = expand(&b, 4).expect("expanded");
        assert!(!e.is_pure_decode());
        assert_eq!(e.num_seqs(), 4);
        assert_eq!(e.cu_seqlens, vec![0, 5, 6, 7, 8]);
        assert_eq!(e.tokens, b.tokens);
        assert_eq!(e.positions, b.positions);
        assert_eq!(e.slot_mapping, b.slot_mapping);
        assert!(e.drafts.iter().all(|&k| k == 0));
        let steps: Vec<u64> = e.samples.iter().map(|r| r.as_ref().unwrap().step).collect();
        assert_eq!(steps, vec![0, 10, 11, 12]);
        let hist: Vec<bool> = e
            .samples
            .iter()
            .map(|r| r.as_ref().unwrap().history.is_some())
            .collect();
        assert_eq!(hist, vec![false, true, true, true]);
        let kv = contract::backend::KvShape {
            num_blocks: 16,
            block_size: 4,
        };
        e.check(kv, 100, 64).unwrap();
        // fold: the chunk's row, then the drafted sequence owning 2 more
        let rows: Vec<Option<OutRow>> = (0..4).map(|i| Some((i, 1, 0))).collect();
        let f = fold(&b, &rows);
        assert_eq!(f, vec![Some((0, 1, 0)), Some((1, 1, 2))]);
    }

    #[test]
    fn drafted_rows_become_decode_rows_at_their_own_positions() {
        let b = drafted();
        let e = expand(&b, 4).unwrap();
        assert!(e.is_pure_decode());
        assert_eq!(e.num_seqs(), 4);
        assert_eq!(e.tokens, b.tokens);
        assert_eq!(e.positions, b.positions);
        assert_eq!(e.slot_mapping, b.slot_mapping);
        assert_eq!(e.context_lens, vec![10, 6, 7, 8]);
        assert_eq!(e.carried, b.carried);
        assert!(e.drafts.iter().all(|&k| k == 0));
        let steps: Vec<u64> = e.samples.iter().map(|r| r.as_ref().unwrap().step).collect();
        assert_eq!(steps, vec![1, 10, 11, 12]);
        for q in 1..4 {
            assert_eq!(&e.block_table(q)[..2], &[6, 8]);
        }
        let kv = contract::backend::KvShape {
            num_blocks: 16,
            block_size: 4,
        };
        e.check(kv, 100, 64).unwrap();
    }

    #[test]
    fn each_verify_row_gets_the_history_with_the_drafts_before_it() {
        use contract::history::PenaltyHistory;
        use std::sync::Arc;
        let mut sb = StepBuilder::new(4);
        let mut r = req(10);
        if let Some(r) = r.as_mut() {
            r.history = Some(Arc::new(PenaltyHistory::from_tokens(&[50])));
        }
        sb.push(&[1, 2, 3], 5, &[6, 8], r).unwrap();
        sb.set_drafts(2);
        sb.finish();
        let b = sb.take();
        assert!(check_unexpanded(&b).is_err());
        let e = expand(&b, 4).unwrap();
        let counts: Vec<Vec<(u32, u32)>> = e
            .samples
            .iter()
            .map(|r| {
                r.as_ref()
                    .unwrap()
                    .history
                    .as_ref()
                    .unwrap()
                    .generated_counts()
                    .to_vec()
            })
            .collect();
        // row 0 before any draft; rows 1 and 2 after drafts 2, then 2 and 3
        assert_eq!(counts[0], vec![]);
        assert_eq!(counts[1], vec![(2, 1)]);
        assert_eq!(counts[2], vec![(2, 1), (3, 1)]);
        assert!(check_unexpanded(&drafted()).is_ok());
    }

    #[test]
    fn each_verify_row_gets_its_own_grammar_mask() {
        use contract::TokenMask;
        use std::sync::Arc;
        let mask = |id: u32| Arc::new(TokenMask::from_ids(64, &[id]));
        let mut sb = StepBuilder::new(4);
        let mut r = req(10);
        if let Some(r) = r.as_mut() {
            r.allowed = Some(mask(1));
        }
        sb.push(&[1, 2, 3], 5, &[6, 8], r).unwrap();
        sb.set_drafts(2);
        sb.set_draft_masks(vec![mask(2), mask(3)]);
        sb.finish();
        let b = sb.take();
        assert!(check_unexpanded(&b).is_err());
        let e = expand(&b, 4).unwrap();
        let allowed: Vec<Option<u32>> = e
            .samples
            .iter()
            .map(|r| {
                let m = r.as_ref().unwrap().allowed.as_ref().unwrap();
                (0..64).find(|&t| m.allows(t))
            })
            .collect();
        assert_eq!(allowed, vec![Some(1), Some(2), Some(3)]);
    }

    #[test]
    fn fold_gives_each_drafted_sequence_its_first_row_and_draft_count() {
        let b = drafted();
        let rows = vec![
            Some((0, 1, 0)),
            Some((1, 3, 0)),
            Some((2, 3, 0)),
            Some((3, 3, 0)),
        ];
        assert_eq!(fold(&b, &rows), vec![Some((0, 1, 0)), Some((1, 3, 2))]);
    }

    #[test]
    fn steps_without_drafts_are_left_alone() {
        let mut sb = StepBuilder::new(4);
        sb.push(&[1, 2, 3, 4], 0, &[1, 2], req(0)).unwrap();
        sb.push(&[1], 5, &[6, 8], req(10)).unwrap();
        sb.finish();
        assert!(expand(sb.batch(), 4).is_none());
        sb.begin();
        sb.push(&[1], 5, &[6, 8], req(10)).unwrap();
        sb.finish();
        assert!(expand(sb.batch(), 4).is_none());
    }
}
