//! Launcher for `cu/gguf.cu`: a GGUF block format's weights (in the device
//! layout of [`WeightFormat::layout`]) widened to bf16 for the GEMM path.
//! Contract: `out[r, c]` = the weight the GEMV of the same format
//! multiplies by, rounded to bf16; `k` a multiple of the format's block.
//! Costs: one launch; reads the blocks once and writes `n * k * 2` bytes.

use gpu::{DevSlice, Function, LaunchConfig};
use half::bf16;

use crate::abi::GgufDequantArgs;
use crate::consts::{ROW_THREADS, SILU_MAX_BLOCKS};
use crate::gemv::WeightFormat;
use crate::weight_format::BlockLayout;
use crate::{KernelError, Kernels, need, u32_of};

/// The widening entry point of block format `f` (`None` for bf16 and FP8).
pub(crate) fn entry(f: WeightFormat) -> Option<String> {
    f.block_entry("gguf_dequant")
}

/// A launch's block-format weights `q` / `side` (`n` rows of `k`
/// columns) and the pointers that must be 16-byte aligned.
pub(crate) struct BlockOperands<'a, 'b> {
    pub q: &'a DevSlice<'b, u8>,
    pub side: &'a DevSlice<'b, u8>,
    pub ptrs: &'a [u64],
    pub n: usize,
    pub k: usize,
    /// What `k` must be a multiple of beside the format's group.
    pub k_multiple: usize,
}

impl BlockOperands<'_, '_> {
    /// The layout of `format` and its entry in `funcs` (one per
    /// `WeightFormat`), after checking `k`, the alignment and the sizes of
    /// the chunks and records; `kernel` names the launcher in errors.
    pub(crate) fn check<'f>(
        &self,
        kernel: &'static str,
        format: WeightFormat,
        funcs: &'f [Option<Function>],
    ) -> Result<(BlockLayout, &'f Function), KernelError> {
        let (Some(l), Some(Some(func))) = (format.layout(), funcs.get(format as usize)) else {
            return Err(KernelError::Unsupported {
                kernel,
                reason: format!("{format:?} is not a block format"),
            });
        };
        let k = self.k;
        // whole groups and whole multiples: both powers of two, the larger rules
        let multiple = l.group.max(self.k_multiple);
        if !k.is_multiple_of(multiple) || self.ptrs.iter().any(|p| !p.is_multiple_of(16)) {
            return Err(KernelError::Unsupported {
                kernel,
                reason: format!(
                    "k = {k} (a multiple of {multiple}), every operand 16-byte aligned"
                ),
            });
        }
        need(kernel, "q", self.q, self.n * l.row_bytes(k))?;
        need(kernel, "side", self.side, self.n * l.side_bytes(k))?;
        Ok((l, func))
    }
}

impl Kernels {
    /// `out = bf16(w)` for the block-format weights `q` / `side` of `n`
    /// rows of `k` columns.
    pub fn gguf_dequant(
        &self,
        format: WeightFormat,
        q: DevSlice<'_, u8>,     // [n, layout.row_bytes(k)]
        side: DevSlice<'_, u8>,  // [n, layout.side_bytes(k)]
        out: DevSlice<'_, bf16>, // [n, k]
        n: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        const K: &str = "gguf_dequant";
        let ptrs = [q.ptr(), side.ptr(), out.ptr()];
        let blocks = BlockOperands {
            q: &q,
            side: &side,
            ptrs: &ptrs,
            n,
            k,
            k_multiple: 1,
        };
        let (l, func) = blocks.check(K, format, &self.gguf_dequant)?;
        need(K, "out", &out, n * k)?;
        if n == 0 || k == 0 {
            return Ok(());
        }
        let blocks = (n * k / l.cols).div_ceil(ROW_THREADS).min(SILU_MAX_BLOCKS);
        let args = GgufDequantArgs {
            q: q.ptr(),
            side: side.ptr(),
            out: out.ptr(),
            n: u32_of(K, "n", n)?,
            k: u32_of(K, "k", k)?,
        };
        let cfg = LaunchConfig::linear(blocks as u32, ROW_THREADS as u32);
        // SAFETY: views checked for the format's [n, k] chunks, records and
        // bf16 output and their alignment; the kernel takes `GgufDequantArgs`
        // and touches only rows < n, columns < k.
        unsafe { self.launch(func, cfg, &args)? };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_formats_name_their_widening() {
        assert_eq!(
            entry(WeightFormat::Q4K).as_deref(),
            Some("gguf_dequant_q4_k")
        );
        assert_eq!(
            entry(WeightFormat::Q8_0).as_deref(),
            Some("gguf_dequant_q8_0")
        );
        assert_eq!(entry(WeightFormat::Fp8Row), None);
        assert_eq!(entry(WeightFormat::Bf16), None);
    }
}
