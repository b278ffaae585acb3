//! The LoRA deltas a GEMV launch adds in its epilogue ([`GemvLora`]): its
//! operands, checked, and the launch fields and shrink blocks they add.

use gpu::{DevSlice, LaunchConfig};
use half::bf16;

use super::{WARPS, aligned};
use crate::abi::GemvArgs;
use crate::lora::LoraShape;
use crate::{KernelError, need, u32_of};

/// The LoRA deltas a GEMV adds in its epilogue (`cu/gemv.cu`'s module
/// doc): one layer's A of every slot over the GEMV's input (`shape.k`
/// columns) and B for this projection's weight rows (`shape.n` = the
/// weight rows: `2n` for [`GemvOp::NormGated`], with its segments' first
/// rows), each row's slot, `h` for the shrink the launch computes in blocks
/// of its own, and a counter that must be zero when the launch starts.
#[derive(Debug, Clone, Copy)]
pub struct GemvLora<'a> {
    pub a: DevSlice<'a, bf16>,      // [slots, segs * rank, k]
    pub b: DevSlice<'a, bf16>,      // [rows, slots, segs * rank]
    pub scales: DevSlice<'a, f32>,  // [slots]
    pub slot_of: DevSlice<'a, u32>, // [m]
    pub h: DevSlice<'a, f32>,       // [m, segs * rank]
    pub ready: DevSlice<'a, u32>,   // [1], zero at launch
    pub shape: LoraShape,
}

impl GemvLora<'_> {
    /// Checks the operands for `m` rows of a projection with `rows` weight
    /// rows and `k` inputs, fills the LoRA fields of `args` and adds the
    /// shrink blocks in front of the launch's grid.
    pub(super) fn fill(
        &self,
        kernel: &'static str,
        (m, rows, k): (usize, usize, usize),
        args: &mut GemvArgs,
        cfg: &mut LaunchConfig,
    ) -> Result<(), KernelError> {
        let sh = &self.shape;
        sh.check(kernel)?;
        if sh.n != rows || sh.tokens < m || sh.k != k {
            return Err(KernelError::Shape {
                kernel,
                reason: format!(
                    "LoRA over {} x {} of {} tokens for a projection of {rows} x {k} and {m} tokens",
                    sh.n, sh.k, sh.tokens
                ),
            });
        }
        need(kernel, "lora a", &self.a, sh.slots * sh.hw() * k)?;
        need(kernel, "lora h", &self.h, m * sh.hw())?;
        need(kernel, "lora ready", &self.ready, 1)?;
        need(kernel, "lora b", &self.b, sh.slots * rows * sh.hw())?;
        need(kernel, "lora scales", &self.scales, sh.slots)?;
        need(kernel, "lora slot_of", &self.slot_of, m)?;
        aligned(kernel, "lora b", self.b.ptr())?;
        aligned(kernel, "lora a", self.a.ptr())?;
        let blocks = m * sh.hw().div_ceil(WARPS);
        args.lora_shrink_blocks = u32_of(kernel, "LoRA shrink blocks", blocks)?;
        cfg.grid.0 = u32_of(kernel, "blocks", cfg.grid.0 as usize + blocks)?;
        args.lora_a = self.a.ptr();
        args.lora_ready = self.ready.ptr();
        args.lora_h = self.h.ptr();
        args.lora_b = self.b.ptr();
        args.lora_scales = self.scales.ptr();
        args.lora_slot_of = self.slot_of.ptr();
        args.lora_rank = u32_of(kernel, "rank", sh.rank)?;
        args.lora_hw = u32_of(kernel, "segs * rank", sh.hw())?;
        args.lora_seg1 = u32_of(kernel, "segment 1", sh.seg_starts[0])?;
        args.lora_seg2 = u32_of(kernel, "segment 2", sh.seg_starts[1])?;
        args.lora_slots = u32_of(kernel, "slots", sh.slots)?;
        Ok(())
    }
}
