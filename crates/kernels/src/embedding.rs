//! Launchers for `cu/embedding.cu`: embedding gather into the f32 residual
//! stream (ids from the step's tokens, or from the previous step's samples
//! on the device for carried tokens: [`Carry`]), and row gather (the rows to sample, before the LM head). Each
//! kernel takes one argument struct ([`EmbeddingGatherArgs`],
//! [`GatherRowsArgs`]). CPU references: `ops::embedding::{embed, gather_rows}`.
//! Costs: one launch each, `rows * width` element copies.

use gpu::{DevSlice, LaunchConfig};
use half::bf16;

use crate::abi::{EmbeddingGatherArgs, GatherRowsArgs};
use crate::consts::ROW_THREADS;
use crate::{KernelError, Kernels, need, u32_of};

/// Where the ids of carried tokens are (see [`Kernels::embedding_gather`]).
#[derive(Debug, Clone, Copy)]
pub struct Carry<'a> {
    /// `[T]` index into `prev` for a carried token, anything `>= prev.len()` otherwise.
    pub rows: DevSlice<'a, u32>,
    /// The previous step's sampled ids.
    pub prev: DevSlice<'a, u32>,
}

impl Kernels {
    /// `out[t, :] = table[id, :] * scale` as f32, for `tokens` ids: `id = ids[t]`,
    /// or with `carry`, `prev[carry.rows[t]]` where `carry.rows[t] <
    /// carry.prev.len()` (a token the previous step sampled, never copied to
    /// the host).
    ///
    /// # Safety
    /// Every id in `ids[..tokens]` and every `prev` entry a carried row
    /// names is below `vocab` (out-of-range ids give NaN rows, but the caller
    /// validates them to report the token).
    #[allow(clippy::too_many_arguments)] // the kernel's inputs, named one by one
    pub unsafe fn embedding_gather(
        &self,
        out: DevSlice<'_, f32>,    // [T, hidden]
        table: DevSlice<'_, bf16>, // [vocab, hidden]
        ids: DevSlice<'_, u32>,    // [T]
        carry: Option<Carry<'_>>,
        tokens: usize,
        hidden: usize,
        vocab: usize,
        scale: f32,
    ) -> Result<(), KernelError> {
        const K: &str = "embedding_gather";
        need(K, "out", &out, tokens * hidden)?;
        need(K, "table", &table, vocab * hidden)?;
        need(K, "ids", &ids, tokens)?;
        if let Some(c) = &carry {
            need(K, "carry.rows", &c.rows, tokens)?;
        }
        if tokens == 0 {
            return Ok(());
        }
        let args = EmbeddingGatherArgs {
            out: out.ptr(),
            table: table.ptr(),
            ids: ids.ptr(),
            hidden: u32_of(K, "hidden", hidden)?,
            vocab: u32_of(K, "vocab", vocab)?,
            carry: carry.map_or(0, |c| c.rows.ptr()),
            prev: carry.map_or(0, |c| c.prev.ptr()),
            num_prev: u32_of(K, "carry.prev", carry.map_or(0, |c| c.prev.len()))?,
            scale,
        };
        let cfg = LaunchConfig::linear(u32_of(K, "tokens", tokens)?, ROW_THREADS as u32);
        // SAFETY: views checked above for [T, hidden], [vocab, hidden], [T]
        // (and [T] carry rows; a row reads `prev` only below its length);
        // ids are in range by this function's contract; the kernel takes
        // `EmbeddingGatherArgs` (layout asserted against the C++ struct).
        unsafe { self.launch(&self.embedding_gather, cfg, &args)? };
        Ok(())
    }

    /// `out[r, :] = src[rows[r], :]` (bf16), for `num_rows` rows of `width`.
    ///
    /// # Safety
    /// Every index in `rows[..num_rows]` is below `src_rows`.
    pub unsafe fn gather_rows(
        &self,
        out: DevSlice<'_, bf16>, // [R, width]
        src: DevSlice<'_, bf16>, // [src_rows, width]
        rows: DevSlice<'_, u32>, // [R]
        num_rows: usize,
        width: usize,
        src_rows: usize,
    ) -> Result<(), KernelError> {
        const K: &str = "gather_rows_bf16";
        need(K, "out", &out, num_rows * width)?;
        need(K, "src", &src, src_rows * width)?;
        need(K, "rows", &rows, num_rows)?;
        if num_rows == 0 {
            return Ok(());
        }
        let args = GatherRowsArgs {
            out: out.ptr(),
            src: src.ptr(),
            rows: rows.ptr(),
            width: u32_of(K, "width", width)?,
            num_src_rows: u32_of(K, "src_rows", src_rows)?,
        };
        let cfg = LaunchConfig::linear(u32_of(K, "rows", num_rows)?, ROW_THREADS as u32);
        // SAFETY: views checked above; row indices in range by contract; the
        // kernel takes `GatherRowsArgs`.
        unsafe { self.launch(&self.gather_rows_bf16, cfg, &args)? };
        Ok(())
    }
}
