//! Hand-built step batches and a greedy driver, for tests, reference
//! comparisons and benchmarks that run a [`Backend`] without the engine.
//!
//! Contract: [`build_step`] turns per-sequence chunks (tokens, first
//! position, block table, optional sample request) into a [`StepBatch`] that
//! satisfies [`StepBatch::validate`] whenever the tables cover the positions
//! (otherwise an error naming the sequence). [`generate_greedy`] prefills
//! several prompts in one step and then decodes them together, one token per
//! sequence per step, returning each sequence's greedy tokens.
//!
//! Costs: O(T + S * max_blocks) to build a step; the driver runs
//! `1 + steps - 1` backend steps.

use contract::backend::{Backend, BackendError, SampleRequest, StepBatch};
use contract::sampling::SamplingParams;

/// One sequence's share of a hand-built step.
#[derive(Debug, Clone, PartialEq)]
pub struct SeqChunk {
    /// Tokens run this step.
    pub tokens: Vec<u32>,
    /// Position of `tokens[0]` in the sequence.
    pub start: usize,
    /// The sequence's block table; must cover positions `0..start + tokens.len()`.
    pub blocks: Vec<u32>,
    /// Sample the chunk's last token.
    pub sample: Option<SampleRequest>,
}

/// The block table `[first, first + 1, ...]` covering `tokens` positions.
pub fn contiguous_blocks(first: u32, tokens: usize, block_size: usize) -> Vec<u32> {
    (0..tokens.div_ceil(block_size) as u32)
        .map(|b| first + b)
        .collect()
}

/// Packs `chunks` into one [`StepBatch`] for a pool of `block_size`-token blocks.
pub fn build_step(chunks: &[SeqChunk], block_size: usize) -> Result<StepBatch, BackendError> {
    let max_blocks = chunks.iter().map(|c| c.blocks.len()).max().unwrap_or(0);
    let mut b = StepBatch {
        cu_seqlens: vec![0],
        max_blocks,
        ..StepBatch::default()
    };
    for (s, c) in chunks.iter().enumerate() {
        let end = c.start + c.tokens.len();
        if c.tokens.is_empty() || end.div_ceil(block_size) > c.blocks.len() {
            return Err(BackendError::InvalidBatch(format!(
                "chunk {s}: {} blocks of {block_size} do not cover positions {}..{end} (or no tokens)",
                c.blocks.len(),
                c.start
            )));
        }
        for (i, &tok) in c.tokens.iter().enumerate() {
            let p = c.start + i;
            b.tokens.push(tok);
            b.positions.push(p as u32);
            b.slot_mapping
                .push(c.blocks[p / block_size] * block_size as u32 + (p % block_size) as u32);
        }
        b.cu_seqlens.push(b.tokens.len() as u32);
        b.context_lens.push(end as u32);
        b.block_tables.extend(&c.blocks);
        b.block_tables.resize((s + 1) * max_blocks, 0);
        b.samples.push(c.sample.clone());
    }
    Ok(b)
}

/// Greedy-decodes `steps` tokens after each prompt, all sequences batched
/// together: one prefill step of every prompt, then `steps - 1` decode
/// steps. `tables[i]` is prompt `i`'s block table and must cover
/// `prompts[i].len() + steps` positions. Returns `[S][steps]` token ids.
pub fn generate_greedy(
    backend: &mut dyn Backend,
    prompts: &[&[u32]],
    tables: &[Vec<u32>],
    steps: usize,
) -> Result<Vec<Vec<u32>>, BackendError> {
    let block_size = backend.kv_shape().block_size;
    let req = |step: u64| {
        Some(SampleRequest {
            params: SamplingParams::greedy(),
            step,
            history: Vec::new(),
        })
    };
    let mut out: Vec<Vec<u32>> = vec![Vec::with_capacity(steps); prompts.len()];
    if steps == 0 {
        return Ok(out);
    }
    let mut chunks: Vec<SeqChunk> = prompts
        .iter()
        .zip(tables)
        .map(|(p, t)| SeqChunk {
            tokens: p.to_vec(),
            start: 0,
            blocks: t.clone(),
            sample: req(0),
        })
        .collect();
    for step in 0..steps {
        let batch = build_step(&chunks, block_size)?;
        let sampled = backend.step(&batch)?;
        for ((c, o), s) in chunks.iter_mut().zip(out.iter_mut()).zip(sampled) {
            let tok = s.ok_or_else(|| BackendError::Device("backend returned no sample".into()))?;
            o.push(tok.token);
            c.start += c.tokens.len();
            c.tokens = vec![tok.token];
            c.sample = req(step as u64 + 1);
        }
    }
    Ok(out)
}
