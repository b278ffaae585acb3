//! Launchers for `cu/embedding.cu`: embedding gather into the f32 residual
//! stream, and row gather (the rows to sample, before the LM head). Each
//! kernel takes one argument struct ([`EmbeddingGatherArgs`],
//! [`GatherRowsArgs`]). CPU references: `ops::embedding::{embed, gather_rows}`.
//! Costs: one launch each, `rows * width` element copies.

use gpu::{DevSlice, LaunchConfig};
use half::bf16;

use crate::abi::{EmbeddingGatherArgs, GatherRowsArgs};
use crate::consts::ROW_THREADS;
use crate::{KernelError, Kernels, need, u32_of};

impl Kernels {
    /// `out[t, :] = table[ids[t], :]` as f32, for `tokens` ids.
    ///
    /// # Safety
    /// Every id in `ids[..tokens]` is below `vocab` (out-of-range ids give
    /// NaN rows, but the caller validates them to report the token).
    pub unsafe fn embedding_gather(
        &self,
        out: DevSlice<'_, f32>,    // [T, hidden]
        table: DevSlice<'_, bf16>, // [vocab, hidden]
        ids: DevSlice<'_, u32>,    // [T]
        tokens: usize,
        hidden: usize,
        vocab: usize,
    ) -> Result<(), KernelError> {
        const K: &str = "embedding_gather";
        need(K, "out", &out, tokens * hidden)?;
        need(K, "table", &table, vocab * hidden)?;
        need(K, "ids", &ids, tokens)?;
        if tokens == 0 {
            return Ok(());
        }
        let args = EmbeddingGatherArgs {
            out: out.ptr(),
            table: table.ptr(),
            ids: ids.ptr(),
            hidden: u32_of(K, "hidden", hidden)?,
            vocab: u32_of(K, "vocab", vocab)?,
        };
        let cfg = LaunchConfig::linear(u32_of(K, "tokens", tokens)?, ROW_THREADS as u32);
        // SAFETY: views checked above for [T, hidden], [vocab, hidden], [T];
        // ids are in range by this function's contract; the kernel takes
        // `EmbeddingGatherArgs` (layout asserted against the C++ struct).
        unsafe { self.gpu.launch_struct(&self.embedding_gather, cfg, &args)? };
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
        unsafe { self.gpu.launch_struct(&self.gather_rows_bf16, cfg, &args)? };
        Ok(())
    }
}
