//! Flat per-step KV metadata for the backends (the `slot_mapping`,
//! `context_lens` and `block_tables` fields of `model::StepBatch`).
//!
//! A step runs, for each of its `S` sequences, a run of consecutive
//! positions `start..end`. For each token, `slot_mapping` gives the physical
//! slot its K/V is written to (`block * B + offset`); for each sequence,
//! `context_lens` is `end` (tokens attention reads) and its block-table row
//! holds its first `ceil(end / B)` blocks, padded to the batch's longest row
//! with **0**. Padding is never read (attention stops at `context_len`);
//! 0 is chosen because it is always a valid block index, so a kernel that
//! prefetches a row never reads out of bounds.
//!
//! Cost: O(tokens + S x max_blocks) time and output memory; the builder
//! can be reused across steps (`clear`) to keep its buffers.

use std::ops::Range;

use crate::{KvError, KvManager, SeqId};

/// The KV part of one step batch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepMetadata {
    /// `[T]` physical slot each token writes.
    pub slot_mapping: Vec<u32>,
    /// `[S]` tokens in each sequence's cache once the step has written.
    pub context_lens: Vec<u32>,
    /// `[S, max_blocks]` row-major block tables, padded with 0.
    pub block_tables: Vec<u32>,
    /// Row length of `block_tables` (the longest sequence's block count).
    pub max_blocks: usize,
}

/// Accumulates runs of positions, one per sequence, into a [`StepMetadata`].
#[derive(Debug, Clone, Default)]
pub struct StepMetadataBuilder {
    slot_mapping: Vec<u32>, // [T]
    context_lens: Vec<u32>, // [S]
    rows: Vec<u32>,         // concatenated unpadded rows
    row_ends: Vec<usize>,   // [S] end of each row in `rows`
    max_blocks: usize,      // longest row so far
}

impl StepMetadataBuilder {
    /// An empty builder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Forgets what was pushed, keeping the buffers.
    pub fn clear(&mut self) {
        self.slot_mapping.clear();
        self.context_lens.clear();
        self.rows.clear();
        self.row_ends.clear();
        self.max_blocks = 0;
    }

    /// Sequences pushed (`S`).
    pub fn num_seqs(&self) -> usize {
        self.context_lens.len()
    }

    /// Tokens pushed (`T`).
    pub fn num_tokens(&self) -> usize {
        self.slot_mapping.len()
    }

    /// Adds the run `positions` (non-empty, within the sequence's known
    /// tokens) of `seq` as the next sequence of the step. On error nothing
    /// is added.
    pub fn push(
        &mut self,
        kv: &KvManager,
        seq: SeqId,
        positions: Range<usize>,
    ) -> Result<(), KvError> {
        let (start, end) = (positions.start, positions.end);
        let len = kv.seq_len(seq).ok_or(KvError::UnknownSeq(seq))?;
        let table = kv.block_table(seq).ok_or(KvError::UnknownSeq(seq))?;
        if start >= end {
            return Err(KvError::EmptyRun { seq, start });
        }
        let out_of_range = KvError::PositionOutOfRange {
            seq,
            start,
            end,
            len,
        };
        if end > len {
            return Err(out_of_range);
        }
        let ctx = u32::try_from(end).map_err(|_| out_of_range)?;
        let bs = kv.block_size();
        let row = &table[..end.div_ceil(bs)];
        // Slots fit u32: KvManager guarantees num_blocks x B <= 2^32.
        self.slot_mapping
            .extend((start..end).map(|p| (row[p / bs] as usize * bs + p % bs) as u32));
        self.context_lens.push(ctx);
        self.rows.extend_from_slice(row);
        self.max_blocks = self.max_blocks.max(row.len());
        self.row_ends.push(self.rows.len());
        Ok(())
    }

    /// The padded metadata of everything pushed so far.
    pub fn build(&self) -> StepMetadata {
        let max_blocks = self.max_blocks;
        let mut block_tables = vec![0u32; self.row_ends.len() * max_blocks]; // [S, max_blocks]
        let mut start = 0;
        for (dst, &end) in block_tables
            .chunks_exact_mut(max_blocks.max(1))
            .zip(&self.row_ends)
        {
            dst[..end - start].copy_from_slice(&self.rows[start..end]);
            start = end;
        }
        StepMetadata {
            slot_mapping: self.slot_mapping.clone(),
            context_lens: self.context_lens.clone(),
            block_tables,
            max_blocks,
        }
    }
}

/// Builds the metadata of a step running `runs` (one `(seq, positions)`
/// per sequence, in batch order).
pub fn build_step_metadata(
    kv: &KvManager,
    runs: &[(SeqId, Range<usize>)],
) -> Result<StepMetadata, KvError> {
    let mut b = StepMetadataBuilder::new();
    for (seq, positions) in runs {
        b.push(kv, *seq, positions.clone())?;
    }
    Ok(b.build())
}
