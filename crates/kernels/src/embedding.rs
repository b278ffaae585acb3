//! Launchers for `cu/embedding.cu`: embedding gather into the f32 residual
//! stream, and row gather (the rows to sample, before the LM head).
//! Costs: one launch each, `rows * width` element copies.

use gpu::{DevSlice, LaunchArgs, LaunchConfig};
use half::bf16;

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
        let mut a = LaunchArgs::new();
        a.ptr(out)
            .ptr(table)
            .ptr(ids)
            .u32(u32_of(K, "hidden", hidden)?)
            .u32(u32_of(K, "vocab", vocab)?);
        // SAFETY: views checked above for [T, hidden], [vocab, hidden], [T];
        // ids are in range by this function's contract; args match the signature.
        unsafe {
            self.gpu.launch(
                &self.embedding_gather,
                LaunchConfig::linear(u32_of(K, "tokens", tokens)?, 256),
                &mut a,
            )?
        };
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
        let mut a = LaunchArgs::new();
        a.ptr(out)
            .ptr(src)
            .ptr(rows)
            .u32(u32_of(K, "width", width)?)
            .u32(u32_of(K, "src_rows", src_rows)?);
        // SAFETY: views checked above; row indices in range by contract.
        unsafe {
            self.gpu.launch(
                &self.gather_rows_bf16,
                LaunchConfig::linear(u32_of(K, "rows", num_rows)?, 256),
                &mut a,
            )?
        };
        Ok(())
    }
}

/// CPU reference of [`Kernels::embedding_gather`].
pub fn embedding_gather_ref(table: &[bf16], ids: &[u32], hidden: usize) -> Vec<f32> {
    ids.iter()
        .flat_map(|&id| {
            table[id as usize * hidden..(id as usize + 1) * hidden]
                .iter()
                .map(|x| x.to_f32())
        })
        .collect()
}

/// CPU reference of [`Kernels::gather_rows`].
pub fn gather_rows_ref(src: &[bf16], rows: &[u32], width: usize) -> Vec<bf16> {
    rows.iter()
        .flat_map(|&r| {
            src[r as usize * width..(r as usize + 1) * width]
                .iter()
                .copied()
        })
        .collect()
}
