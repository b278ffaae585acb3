//! Hand-built step batches and a greedy driver, for tests, reference
//! comparisons and benchmarks that run a [`Backend`] without the engine.
//!
//! Contract: [`build_step`] turns per-sequence chunks (tokens, first
//! position, block table, optional sample request, prompt length) into a [`StepBatch`]
//! through the one batch builder ([`contract::step_builder::StepBuilder`],
//! the scheduler's too); it satisfies [`StepBatch::validate`] whenever the
//! tables cover the positions (otherwise an error naming the sequence). [`generate_greedy`] prefills
//! several prompts in one step and then decodes them together, one token per
//! sequence per step, returning each sequence's greedy tokens.
//!
//! Costs: O(T + S * max_blocks) to build a step; the driver runs
//! `1 + steps - 1` backend steps, reusing one builder's buffers.

use contract::backend::{Backend, BackendError, SampleRequest, StepBatch};
use contract::sampling::SamplingParams;
use contract::step_builder::StepBuilder;

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
    /// The sequence's prompt length: tokens at positions below it are
    /// prompt tokens ([`StepBatch::prompt_lens`]; 0: every token generated).
    pub prompt_len: usize,
}

/// The block table `[first, first + 1, ...]` covering `tokens` positions.
pub fn contiguous_blocks(first: u32, tokens: usize, block_size: usize) -> Vec<u32> {
    (0..tokens.div_ceil(block_size) as u32)
        .map(|b| first + b)
        .collect()
}

/// Packs `chunks` into one [`StepBatch`] for a pool of `block_size`-token blocks.
pub fn build_step(chunks: &[SeqChunk], block_size: usize) -> Result<StepBatch, BackendError> {
    let mut b = StepBuilder::new(block_size);
    push_chunks(&mut b, chunks)?;
    b.finish();
    Ok(b.take())
}

/// Pushes `chunks` as one step into `b` (after `begin`); errors name the chunk.
fn push_chunks(b: &mut StepBuilder, chunks: &[SeqChunk]) -> Result<(), BackendError> {
    b.begin();
    for c in chunks {
        b.push(&c.tokens, c.start, &c.blocks, c.sample.clone())
            .map_err(|e| BackendError::InvalidBatch(e.to_string()))?;
        b.set_prompt_len(c.prompt_len);
    }
    Ok(())
}

/// Greedy-decodes `steps` tokens after each prompt, all sequences batched
/// together: one prefill step of every prompt, then `steps - 1` decode
/// steps (the prompts' tokens run as prompt tokens, the generated ones as
/// generated). `tables[i]` is prompt `i`'s block table and must cover
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
            history: None,
            allowed: None,
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
            prompt_len: p.len(),
            tokens: p.to_vec(),
            start: 0,
            blocks: t.clone(),
            sample: req(0),
        })
        .collect();
    // one builder for every step: its buffers are reused
    let mut builder = StepBuilder::new(block_size);
    for step in 0..steps {
        push_chunks(&mut builder, &chunks)?;
        let sampled = backend.step(builder.finish())?;
        for ((c, o), s) in chunks.iter_mut().zip(out.iter_mut()).zip(sampled) {
            let tok = s.ok_or_else(|| BackendError::Device("backend returned no sample".into()))?;
            o.push(tok.token);
            c.start += c.tokens.len();
            c.tokens.clear();
            c.tokens.push(tok.token);
            c.sample = req(step as u64 + 1);
        }
    }
    Ok(out)
}
