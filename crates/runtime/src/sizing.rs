//! [`Sizing`]: what a runtime sized at start (KV pool, limits, replicas),
//! in one line for the log.

use contract::KvCacheDtype;

use crate::kv_sizing::{GIB, full_contexts};
use crate::options::BLOCK_SIZE;

/// What [`crate::Runtime::open`] sized, as `lamina serve` logs it.
#[derive(Debug, Clone, Copy)]
pub struct Sizing {
    pub kv_blocks: usize,
    /// How the pool stores K and V (its bytes per token follow).
    pub kv_dtype: KvCacheDtype,
    pub kv_bytes: usize,
    pub max_num_seqs: usize,
    pub max_batch_tokens: usize,
    pub cuda: bool,
    /// Engines started (one per GPU, or CPU replicas), each sized as above.
    pub replicas: usize,
    /// The model's context length (a full-context sequence's tokens).
    pub max_context: usize,
}

impl Sizing {
    /// Tokens the KV pool holds.
    pub fn pool_tokens(&self) -> usize {
        self.kv_blocks * BLOCK_SIZE
    }

    /// Sequences of the full context the pool holds at once.
    pub fn full_contexts(&self) -> usize {
        full_contexts(self.pool_tokens(), self.max_context)
    }
}

impl std::fmt::Display for Sizing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}{} backend; KV pool ({} K/V) {} blocks of {BLOCK_SIZE} tokens ({} tokens, {:.2} GiB: {} concurrent sequences of the full {}-token context); at most {} sequences and {} tokens a step",
            if self.replicas > 1 {
                format!("{} replicas, each: ", self.replicas)
            } else {
                String::new()
            },
            if self.cuda { "CUDA" } else { "CPU" },
            self.kv_dtype,
            self.kv_blocks,
            self.pool_tokens(),
            self.kv_bytes as f64 / GIB,
            self.full_contexts(),
            self.max_context,
            self.max_num_seqs,
            self.max_batch_tokens,
        )?;
        if self.cuda {
            write!(
                f,
                "; decode CUDA graphs captured on first use of each (batch, context) bucket (batches in powers of two up to {})",
                model::cuda::MAX_GRAPH_BATCH
            )?;
        }
        Ok(())
    }
}
