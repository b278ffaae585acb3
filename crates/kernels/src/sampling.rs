//! Launcher for `cu/sampling.cu`: sampling on the GPU with the procedure of
//! `ops::sampling` (the draw `u` is computed on the host with
//! `contract::sampling::uniform(seed, step)` and passed in, and so are the
//! additive terms of the presence / frequency penalties and `logit_bias`,
//! merged per row by `contract::history::additive_terms`). Its tests compare
//! each row against `ops::sampling::sample_row`, the CPU backend's sampler.
//! Costs: two launches. `sample_partials` reads each row once over
//! `ceil(vocab / SLICE)` blocks (logsumexp, greedy argmax, the penalty, the
//! blocks' top log-probability candidates); `sample_rows` merges them with
//! one block per row: a few microseconds for greedy rows at a 128k
//! vocabulary. Sampled rows add one write of the row and up to ~260
//! single-block passes (binary searches over the key space).

use bytemuck::{Pod, Zeroable};
use gpu::{DevSlice, LaunchConfig};

use crate::{KernelError, Kernels, need, u32_of};

pub use crate::abi::SampleParams;
use crate::abi::{SamplePartialArgs, SampleRowsArgs};

// SAFETY: `SampleParams` is `repr(C)` with only `f32` / `u32` / `[u32; 3]`
// fields, and `abi.rs` const-asserts its size (64) equal to the sum of its
// fields' sizes at consecutive offsets: no padding, every bit pattern valid,
// all zeros a valid value.
unsafe impl Zeroable for SampleParams {}
// SAFETY: as for `Zeroable` above; the type is `Copy` and `'static`.
unsafe impl Pod for SampleParams {}
const _: () = assert!(size_of::<SampleParams>() == 16 * size_of::<u32>());

impl SampleParams {
    /// Greedy, no penalty, no log-probabilities.
    pub fn greedy() -> Self {
        SampleParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            u: 0.0,
            hist_off: 0,
            hist_len: 0,
            n_logprobs: 0,
            add_off: 0,
            add_len: 0,
            mask_off: 0,
            mask_len: 0,
            _pad: [0; 3],
        }
    }
}

// The kernels take these from the generated lamina_consts.cuh.
const THREADS: u32 = crate::consts::SAMPLE_THREADS as u32;
const PART_THREADS: u32 = crate::consts::SAMPLE_PART_THREADS as u32;
/// Vocabulary ids each `sample_partials` block owns.
pub use crate::consts::SAMPLE_SLICE as SLICE;

/// Scratch of [`Kernels::sample_rows`] (sizes from [`SampleScratch::stats_len`] / [`SampleScratch::keys_len`]).
#[derive(Debug, Clone, Copy)]
pub struct SampleScratch<'a> {
    pub work: DevSlice<'a, f32>,  // [R, vocab]
    pub stats: DevSlice<'a, f32>, // [R, NB, 2]
    pub keys: DevSlice<'a, u64>,  // [R, NB, 1 + max_logprobs]
}

impl SampleScratch<'_> {
    /// Blocks per row: `ceil(vocab / SLICE)`.
    pub fn blocks(vocab: usize) -> usize {
        vocab.div_ceil(SLICE).max(1)
    }
    /// Elements of `stats` for `rows` rows.
    pub fn stats_len(rows: usize, vocab: usize) -> usize {
        rows * Self::blocks(vocab) * 2
    }
    /// Elements of `keys` for `rows` rows.
    pub fn keys_len(rows: usize, vocab: usize, max_logprobs: usize) -> usize {
        rows * Self::blocks(vocab) * (1 + max_logprobs)
    }
}

/// Output views of [`Kernels::sample_rows`].
#[derive(Debug, Clone, Copy)]
pub struct SampleOutputs<'a> {
    pub tokens: DevSlice<'a, u32>,   // [R]
    pub logprobs: DevSlice<'a, f32>, // [R]
    pub top_ids: DevSlice<'a, u32>,  // [R, max_logprobs]
    pub top_lps: DevSlice<'a, f32>,  // [R, max_logprobs]
}

impl Kernels {
    /// Samples one token for each of `rows` rows of `logits`.
    ///
    /// # Safety
    /// Each row's history range `hist_off..hist_off + hist_len` and additive
    /// range `add_off..add_off + 2 * add_len` lie inside `history`; the ids
    /// of each are distinct (ids >= vocab are ignored).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn sample_rows(
        &self,
        logits: DevSlice<'_, f32>, // [R, vocab]
        scratch: SampleScratch<'_>,
        params: DevSlice<'_, SampleParams>, // [R]
        history: DevSlice<'_, u32>,
        out: SampleOutputs<'_>,
        rows: usize,
        vocab: usize,
        max_logprobs: usize,
    ) -> Result<(), KernelError> {
        const K: &str = "sample_rows";
        need(K, "logits", &logits, rows * vocab)?;
        need(K, "work", &scratch.work, rows * vocab)?;
        need(
            K,
            "stats",
            &scratch.stats,
            SampleScratch::stats_len(rows, vocab),
        )?;
        need(
            K,
            "keys",
            &scratch.keys,
            SampleScratch::keys_len(rows, vocab, max_logprobs),
        )?;
        need(K, "params", &params, rows)?;
        need(K, "tokens", &out.tokens, rows)?;
        need(K, "logprobs", &out.logprobs, rows)?;
        need(K, "top_ids", &out.top_ids, rows * max_logprobs)?;
        need(K, "top_lps", &out.top_lps, rows * max_logprobs)?;
        if rows == 0 {
            return Ok(());
        }
        let (v, nb) = (u32_of(K, "vocab", vocab)?, SampleScratch::blocks(vocab));
        let max_lp = u32_of(K, "max_logprobs", max_logprobs)?;
        let nb32 = u32_of(K, "blocks", nb)?;
        let r32 = u32_of(K, "rows", rows)?;
        let pa = SamplePartialArgs {
            logits: logits.ptr(),
            work: scratch.work.ptr(),
            params: params.ptr(),
            history: history.ptr(),
            stats: scratch.stats.ptr(),
            keys: scratch.keys.ptr(),
            v,
            max_lp,
            nb: nb32,
            pad: 0,
        };
        let cfg = LaunchConfig {
            grid: (nb32, r32, 1),
            block: (PART_THREADS, 1, 1),
            shared_bytes: 0,
        };
        // SAFETY: views checked above for [R, ...]; history ranges by contract;
        // the struct mirrors the kernel's (asserted on both sides).
        unsafe { self.launch_pdl(&self.sample_partials, cfg, &pa)? };
        let ra = SampleRowsArgs {
            logits: logits.ptr(),
            work: scratch.work.ptr(),
            params: params.ptr(),
            stats: scratch.stats.ptr(),
            keys: scratch.keys.ptr(),
            out_tok: out.tokens.ptr(),
            out_lp: out.logprobs.ptr(),
            out_top_ids: out.top_ids.ptr(),
            out_top_lp: out.top_lps.ptr(),
            v,
            max_lp,
            nb: nb32,
            pad: 0,
        };
        // SAFETY: as above; reads only what sample_partials wrote for these rows.
        unsafe { self.launch_pdl(&self.sample_rows, LaunchConfig::linear(r32, THREADS), &ra)? };
        Ok(())
    }
}
