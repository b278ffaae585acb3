//! [`StepBuilder`]: the one way a [`StepBatch`] is built, by the engine's
//! scheduler and by the hand-driven test and reference helpers alike.
//!
//! Contract: [`StepBuilder::begin`] forgets the previous step; each
//! [`StepBuilder::push`] adds the next sequence of the step: its tokens run
//! this step (`tokens`, at positions `start..start + tokens.len()`), its block
//! table (at least `ceil((start + tokens.len()) / block_size)` blocks) and its
//! optional sample request. [`StepBuilder::finish`] pads every block-table
//! row with 0 to the longest (`max_blocks`) and returns the batch, which then
//! satisfies [`StepBatch::validate`] for any pool holding the tables' blocks.
//! [`StepBuilder::carry_last`] marks the last token pushed as a sample of
//! the previously launched step ([`StepBatch::carried`]);
//! [`StepBuilder::set_prompt_len`] gives the last sequence's prompt length
//! ([`StepBatch::prompt_lens`], 0 otherwise); [`StepBuilder::set_drafts`]
//! marks its last tokens as drafts to verify ([`StepBatch::drafts`]) and
//! [`StepBuilder::set_draft_masks`] gives their rows grammar masks.
//! A rejected push adds nothing. Between `begin` and `finish` the block tables
//! are unpadded: read the batch only after `finish`.
//!
//! Costs: `push` is O(tokens + blocks) appends; `finish` O(S x max_blocks)
//! (rows are moved to their padded place in the same buffer). Every buffer is
//! kept across steps, so a warm builder allocates nothing per step.

use std::sync::Arc;

use crate::backend::{Carried, SampleRequest, StepBatch};
use crate::mask::TokenMask;

/// Why [`StepBuilder::push`] refused a sequence (`seq` = its index in the step).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StepBuildError {
    #[error("sequence {seq}: no tokens to run")]
    EmptyRun { seq: usize },
    #[error(
        "sequence {seq}: {blocks} blocks of {block_size} do not cover positions {start}..{end}"
    )]
    TableTooShort {
        seq: usize,
        blocks: usize,
        block_size: usize,
        start: usize,
        end: usize,
    },
    #[error("sequence {seq}: slot or position past u32 (positions {start}..{end})")]
    Overflow {
        seq: usize,
        start: usize,
        end: usize,
    },
}

/// Builds step batches into reused buffers.
#[derive(Debug, Clone)]
pub struct StepBuilder {
    block_size: usize,
    batch: StepBatch,
    /// `[S]` end of each unpadded row in `batch.block_tables` while building.
    row_ends: Vec<usize>,
}

impl StepBuilder {
    /// A builder for a pool of `block_size`-token blocks (at least 1).
    pub fn new(block_size: usize) -> Self {
        let mut batch = StepBatch::default();
        batch.cu_seqlens.push(0);
        StepBuilder {
            block_size: block_size.max(1),
            batch,
            row_ends: Vec::new(),
        }
    }

    /// Tokens per KV block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Starts a new step: empties the batch, keeping its buffers (and dropping
    /// the previous step's sample requests, with their history references).
    pub fn begin(&mut self) {
        let b = &mut self.batch;
        b.tokens.clear();
        b.positions.clear();
        b.cu_seqlens.clear();
        b.cu_seqlens.push(0);
        b.slot_mapping.clear();
        b.context_lens.clear();
        b.block_tables.clear();
        b.max_blocks = 0;
        b.samples.clear();
        b.prompt_lens.clear();
        b.carried.clear();
        b.drafts.clear();
        b.draft_masks.clear();
        b.loras.clear();
        self.row_ends.clear();
    }

    /// Marks the last token pushed so far as the sample of sequence row
    /// `from` of the previously launched step (its pushed id is a
    /// placeholder). Does nothing before the first push.
    pub fn carry_last(&mut self, from: u32) {
        let b = &mut self.batch;
        if let Some(last) = b.tokens.len().checked_sub(1) {
            b.carried.push(Carried {
                token: last as u32,
                from,
            });
        }
    }

    /// Sets the prompt length of the last sequence pushed (0 until set:
    /// every token generated; see [`StepBatch::prompt_lens`]). Does nothing
    /// before the first push.
    pub fn set_prompt_len(&mut self, len: usize) {
        if let Some(last) = self.batch.prompt_lens.last_mut() {
            *last = u32::try_from(len).unwrap_or(u32::MAX);
        }
    }

    /// Marks the last `k` tokens of the last sequence pushed as drafted
    /// tokens to verify ([`StepBatch::drafts`]; 0 until set). Does nothing
    /// before the first push; [`StepBatch::check`] judges `k`.
    pub fn set_drafts(&mut self, k: usize) {
        let s = self.num_seqs();
        if s == 0 {
            return;
        }
        let b = &mut self.batch;
        if k > 0 && b.drafts.len() < s {
            b.drafts.resize(s, 0);
        }
        if let Some(last) = b.drafts.get_mut(s - 1) {
            *last = u32::try_from(k).unwrap_or(u32::MAX);
        }
    }

    /// Gives the draft rows of the last sequence pushed their grammar
    /// masks ([`StepBatch::draft_masks`]; none until set). Does nothing
    /// before the first push; [`StepBatch::check`] judges them.
    pub fn set_draft_masks(&mut self, masks: Vec<Arc<TokenMask>>) {
        let s = self.num_seqs();
        if s == 0 {
            return;
        }
        let b = &mut self.batch;
        if !masks.is_empty() && b.draft_masks.len() < s {
            b.draft_masks.resize(s, Vec::new());
        }
        if let Some(last) = b.draft_masks.get_mut(s - 1) {
            *last = masks;
        }
    }

    /// Sets the LoRA slot of the last sequence pushed ([`StepBatch::loras`];
    /// 0, the base model, until set). Does nothing before the first push.
    pub fn set_lora(&mut self, slot: u32) {
        let s = self.num_seqs();
        if s == 0 {
            return;
        }
        let b = &mut self.batch;
        if slot > 0 && b.loras.len() < s {
            b.loras.resize(s, 0);
        }
        if let Some(last) = b.loras.get_mut(s - 1) {
            *last = slot;
        }
    }

    /// Sequences pushed since [`StepBuilder::begin`].
    pub fn num_seqs(&self) -> usize {
        self.batch.samples.len()
    }

    /// Adds the next sequence of the step (see the module doc).
    pub fn push(
        &mut self,
        tokens: &[u32],
        start: usize,
        table: &[u32],
        sample: Option<SampleRequest>,
    ) -> Result<(), StepBuildError> {
        let (seq, bs) = (self.num_seqs(), self.block_size);
        let end = start + tokens.len();
        if tokens.is_empty() {
            return Err(StepBuildError::EmptyRun { seq });
        }
        let blocks = end.div_ceil(bs);
        if blocks > table.len() {
            return Err(StepBuildError::TableTooShort {
                seq,
                blocks: table.len(),
                block_size: bs,
                start,
                end,
            });
        }
        let row = &table[..blocks];
        let max_slot = row.iter().map(|&b| b as u64).max().unwrap_or(0) * bs as u64 + bs as u64;
        let total = self.batch.tokens.len() + tokens.len();
        if u32::try_from(end).is_err() || u32::try_from(total).is_err() || max_slot > 1 << 32 {
            return Err(StepBuildError::Overflow { seq, start, end });
        }
        let b = &mut self.batch;
        b.tokens.extend_from_slice(tokens);
        b.positions.extend((start..end).map(|p| p as u32));
        b.slot_mapping
            .extend((start..end).map(|p| (row[p / bs] as usize * bs + p % bs) as u32));
        b.cu_seqlens.push(total as u32);
        b.context_lens.push(end as u32);
        b.block_tables.extend_from_slice(row);
        b.max_blocks = b.max_blocks.max(blocks);
        b.samples.push(sample);
        b.prompt_lens.push(0);
        if !b.drafts.is_empty() {
            b.drafts.push(0);
        }
        if !b.draft_masks.is_empty() {
            b.draft_masks.push(Vec::new());
        }
        if !b.loras.is_empty() {
            b.loras.push(0);
        }
        self.row_ends.push(b.block_tables.len());
        Ok(())
    }

    /// Pads the block tables (`[S, max_blocks]`, 0 past each row) and returns the batch.
    pub fn finish(&mut self) -> &StepBatch {
        let b = &mut self.batch;
        let (s, w) = (self.row_ends.len(), b.max_blocks);
        b.block_tables.resize(s * w, 0);
        // last row first: a row's padded place never starts before its unpadded one
        for q in (0..s).rev() {
            let from = if q == 0 { 0 } else { self.row_ends[q - 1] };
            let len = self.row_ends[q] - from;
            b.block_tables.copy_within(from..from + len, q * w);
            b.block_tables[q * w + len..(q + 1) * w].fill(0);
        }
        self.row_ends.clear();
        self.row_ends.extend((1..=s).map(|q| q * w));
        &self.batch
    }

    /// The batch as of the last [`StepBuilder::finish`].
    pub fn batch(&self) -> &StepBatch {
        &self.batch
    }

    /// The finished batch's sample requests, to change in place (a held
    /// step's final grammar masks, `Backend::release`).
    pub fn samples_mut(&mut self) -> &mut [Option<SampleRequest>] {
        &mut self.batch.samples
    }

    /// Takes the finished batch out, leaving an empty one (for one-shot use).
    pub fn take(&mut self) -> StepBatch {
        let out = std::mem::take(&mut self.batch);
        self.begin();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::SamplingParams;

    fn greedy() -> Option<SampleRequest> {
        Some(SampleRequest {
            params: SamplingParams::greedy(),
            step: 0,
            history: None,
            allowed: None,
        })
    }

    #[test]
    fn mixed_prefill_chunk_and_decode_padded_with_zero() {
        let mut b = StepBuilder::new(4);
        let (a, c) = ([7u32, 3, 9], [5u32]);
        // a prefill chunk at positions 3..6 (context 6 -> 2 blocks), a decode at position 2
        b.push(&[10, 11, 12], 3, &a, None).unwrap();
        b.push(&[20], 2, &c, greedy()).unwrap();
        let batch = b.finish().clone();
        assert_eq!(batch.positions, vec![3, 4, 5, 2]);
        assert_eq!(
            batch.slot_mapping,
            vec![7 * 4 + 3, 3 * 4, 3 * 4 + 1, 5 * 4 + 2]
        );
        assert_eq!(batch.cu_seqlens, vec![0, 3, 4]);
        assert_eq!(batch.context_lens, vec![6, 3]);
        assert_eq!(batch.max_blocks, 2);
        assert_eq!(batch.block_tables, vec![7, 3, 5, 0]);
        batch.validate(10, 4).unwrap();

        // reuse: a shorter row first, then a longer one
        b.begin();
        b.push(&[1, 2, 3], 0, &c, None).unwrap();
        b.push(&[1; 10], 0, &a, greedy()).unwrap();
        let batch = b.finish();
        assert_eq!((batch.num_seqs(), batch.num_tokens()), (2, 13));
        assert_eq!(batch.block_tables, vec![5, 0, 0, 7, 3, 9]);
        b.begin();
        assert_eq!(
            b.finish(),
            &StepBatch {
                cu_seqlens: vec![0],
                ..StepBatch::default()
            }
        );
    }

    #[test]
    fn drafts_mark_the_last_rows_as_sampled_with_advancing_steps() {
        let mut b = StepBuilder::new(4);
        b.push(&[1, 2, 3], 0, &[0], None).unwrap();
        // a decode token followed by two drafts, sampled from step 5
        let mut req = greedy();
        req.as_mut().unwrap().step = 5;
        b.push(&[7, 8, 9], 4, &[1, 2], req).unwrap();
        b.set_drafts(2);
        b.push(&[4], 3, &[3], greedy()).unwrap();
        let batch = b.finish().clone();
        assert_eq!(batch.drafts, vec![0, 2, 0]);
        batch.validate(4, 4).unwrap();
        assert_eq!(batch.sampled_rows(0), 0..0);
        assert_eq!(batch.sampled_rows(1), 3..6);
        assert_eq!(batch.sampled_rows(2), 6..7);
        let steps: Vec<u64> = (3..6)
            .map(|r| batch.row_request(1, r).unwrap().step)
            .collect();
        assert_eq!(steps, vec![5, 6, 7]);
        assert!(batch.row_request(1, 2).is_none());
        // more drafts than the segment's tokens before them
        b.begin();
        b.push(&[7, 8], 4, &[1, 2], greedy()).unwrap();
        b.set_drafts(2);
        let err = b.finish().validate(4, 4).unwrap_err().to_string();
        assert!(err.contains("drafts[0] = 2"), "{err}");
        // the next step starts without drafts
        b.begin();
        b.push(&[7], 4, &[1, 2], greedy()).unwrap();
        assert!(b.finish().drafts.is_empty());
    }

    /// A constrained sequence's draft rows each take their own mask, its
    /// first sampled row the request's; masks must be one per draft, of
    /// the request's length, and only on a sequence with a mask.
    #[test]
    fn draft_masks_follow_their_rows_and_are_checked() {
        let mask = |ids: &[u32]| Arc::new(TokenMask::from_ids(64, ids));
        let masked = || {
            let mut r = greedy();
            r.as_mut().unwrap().allowed = Some(mask(&[1]));
            r
        };
        let mut b = StepBuilder::new(4);
        b.push(&[5], 2, &[0], greedy()).unwrap();
        b.push(&[7, 8, 9], 4, &[1, 2], masked()).unwrap();
        b.set_drafts(2);
        b.set_draft_masks(vec![mask(&[2]), mask(&[3])]);
        let batch = b.finish().clone();
        batch.validate(4, 4).unwrap();
        assert_eq!(batch.draft_masks.len(), 2);
        let allowed = |r: usize| {
            let req = batch.row_request(1, r).unwrap();
            (0..64).find(|&t| req.allowed.as_ref().unwrap().allows(t))
        };
        assert_eq!(
            [allowed(1), allowed(2), allowed(3)],
            [Some(1), Some(2), Some(3)]
        );
        let bad = |drafts: usize, masks: Vec<Arc<TokenMask>>, req: Option<SampleRequest>| {
            let mut b = StepBuilder::new(4);
            b.push(&[7, 8, 9], 4, &[1, 2], req).unwrap();
            b.set_drafts(drafts);
            b.set_draft_masks(masks);
            b.finish().validate(4, 4).unwrap_err().to_string()
        };
        assert!(bad(2, vec![mask(&[2])], masked()).contains("not one per draft"));
        let short = Arc::new(TokenMask::from_ids(32, &[2]));
        assert!(bad(1, vec![short], masked()).contains("mask length"));
        assert!(bad(1, vec![mask(&[2])], greedy()).contains("without a grammar mask"));
        // the next step starts without masks
        b.begin();
        b.push(&[7], 4, &[1, 2], masked()).unwrap();
        assert!(b.finish().draft_masks.is_empty());
    }

    #[test]
    fn bad_pushes_are_reported_and_add_nothing() {
        let mut b = StepBuilder::new(2);
        assert_eq!(
            b.push(&[], 2, &[0], None),
            Err(StepBuildError::EmptyRun { seq: 0 })
        );
        assert!(matches!(
            b.push(&[1, 2], 1, &[0], None),
            Err(StepBuildError::TableTooShort { seq: 0, end: 3, .. })
        ));
        assert!(matches!(
            b.push(&[1], 0, &[u32::MAX], None),
            Err(StepBuildError::Overflow { .. })
        ));
        assert_eq!(b.num_seqs(), 0);
        assert_eq!(b.finish().num_tokens(), 0);
    }
}
