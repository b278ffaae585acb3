//! Launchers for `cu/lora.cu`: the LoRA deltas of many adapters in one
//! step (BGMV), `y[t] += scale_s * B_s (A_s x[t])` with `s` the slot row
//! `t` names in a device table (0: the base model, nothing runs for it).
//! Each kernel takes one argument struct of [`crate::abi`].
//! CPU reference: [`lora_ref`] (the same layout, f64; the delta is
//! `contract::LoraAdapter::apply_row`'s).
//!
//! Layout ([`LoraShape`]): one layer's A of every slot `[slots, segs *
//! rank, k]` (a fused projection stacks its targets' rows: q, k, v or gate,
//! up; `hw = segs * rank` rows a slot), B `[n, slots, hw]` (output column
//! `c` belongs to segment 0, 1 or 2 by `seg_starts`; its row holds, per
//! slot, only that segment's `rank` values, zeros elsewhere), the shrink's
//! output `h` `[T, hw]` f32. `rank` is a multiple of [`LORA_RANK_STEP`]
//! (smaller adapters padded with zeros), `k` a multiple of 8, operands
//! 16-byte aligned. The kernels ignore a slot past `slots`, so no table
//! value can index outside the pool.
//!
//! Two ways to a delta on the GEMM path: [`Kernels::lora_shrink`] then
//! [`Kernels::lora_expand`] (CUDA cores, each row's reduction order fixed
//! whatever the batch), or a GEMM of the input by every slot's A (`[T,
//! slots * hw]`), [`Kernels::lora_select`] keeping each row's own slot
//! (scaled, bf16), and a GEMM of that by B accumulated into `y` (tensor
//! cores; B's layout makes the second product one plain GEMM).
//!
//! A GEMV step (a few rows) runs none of these: the GEMV launch computes
//! the shrink in blocks of its own and the expand in its epilogue
//! ([`crate::gemv::GemvLora`]), so the fused GEMV epilogues (RoPE + KV
//! write, SiLU·up, the residual add) stay whole.
//!
//! Costs: shrink `T x ceil(hw / 8)` blocks of 8 warps, each warp one dot of
//! length `k`; expand `T x ceil(n / 128)` blocks, each thread one dot of
//! length `rank`; select one pass over `T x slots x hw`. Rows of the base
//! model exit at once.

use gpu::{DevSlice, LaunchConfig};
use half::bf16;

use crate::abi::{LoraExpandArgs, LoraSelectArgs, LoraShrinkArgs};
use crate::consts::{
    LORA_EXPAND_THREADS, LORA_RANK_STEP, LORA_SELECT_MAX_BLOCKS, LORA_SELECT_THREADS,
    LORA_SHRINK_WARPS,
};
use crate::{KernelError, Kernels, need, u32_of};

/// The shape of one LoRA launch pair (module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoraShape {
    pub tokens: usize,
    /// Input features of the projection.
    pub k: usize,
    /// Output features (all segments).
    pub n: usize,
    /// Rank of one segment (padded, a multiple of [`LORA_RANK_STEP`]).
    pub rank: usize,
    /// Targets stacked: 1, 2 or 3.
    pub segs: usize,
    /// First output column of segments 1 and 2 (`n` where absent).
    pub seg_starts: [usize; 2],
    /// Slots in the pool.
    pub slots: usize,
}

impl LoraShape {
    /// Columns of `h`: `segs * rank`.
    pub fn hw(&self) -> usize {
        self.segs * self.rank
    }

    pub(crate) fn check(&self, kernel: &'static str) -> Result<(), KernelError> {
        let bad = |reason: String| Err(KernelError::Shape { kernel, reason });
        if !self.rank.is_multiple_of(LORA_RANK_STEP) || self.rank == 0 {
            return bad(format!(
                "rank {} is not a positive multiple of {LORA_RANK_STEP}",
                self.rank
            ));
        }
        if !self.k.is_multiple_of(8) {
            return bad(format!("k = {} is not a multiple of 8", self.k));
        }
        let [s1, s2] = self.seg_starts;
        let used = 1 + usize::from(s1 < self.n) + usize::from(s2 < self.n);
        if !(1..=3).contains(&self.segs) || s1 > s2 || s2 > self.n || used > self.segs {
            return bad(format!(
                "segments {:?} of {} columns do not fit {} segments",
                self.seg_starts, self.n, self.segs
            ));
        }
        Ok(())
    }
}

fn aligned(kernel: &'static str, what: &str, ptr: u64) -> Result<(), KernelError> {
    if !ptr.is_multiple_of(16) {
        return Err(KernelError::Unsupported {
            kernel,
            reason: format!("operand `{what}` not 16-byte aligned"),
        });
    }
    Ok(())
}

impl Kernels {
    /// `h[t, j] = x[t] . a[slot(t), j]` for every row with an adapter.
    pub fn lora_shrink(
        &self,
        x: DevSlice<'_, bf16>,      // [T, k]
        a: DevSlice<'_, bf16>,      // [slots, segs * rank, k]
        slot_of: DevSlice<'_, u32>, // [T]
        h: DevSlice<'_, f32>,       // [T, segs * rank]
        sh: &LoraShape,
    ) -> Result<(), KernelError> {
        const K: &str = "lora_shrink";
        sh.check(K)?;
        let (t, hw) = (sh.tokens, sh.hw());
        need(K, "x", &x, t * sh.k)?;
        need(K, "a", &a, sh.slots * hw * sh.k)?;
        need(K, "slot_of", &slot_of, t)?;
        need(K, "h", &h, t * hw)?;
        if t == 0 || sh.slots == 0 {
            return Ok(());
        }
        aligned(K, "x", x.ptr())?;
        aligned(K, "a", a.ptr())?;
        let args = LoraShrinkArgs {
            x: x.ptr(),
            a: a.ptr(),
            h: h.ptr(),
            slot_of: slot_of.ptr(),
            tokens: u32_of(K, "tokens", t)?,
            n: u32_of(K, "segs * rank", hw)?,
            k: u32_of(K, "k", sh.k)?,
            slots: u32_of(K, "slots", sh.slots)?,
        };
        let cfg = LaunchConfig {
            grid: (args.tokens, hw.div_ceil(LORA_SHRINK_WARPS) as u32, 1),
            block: ((32 * LORA_SHRINK_WARPS) as u32, 1, 1),
            shared_bytes: 0,
        };
        // SAFETY: views checked for their shapes above; the kernel reads
        // slot entries < `slots` only and takes `LoraShrinkArgs`.
        unsafe { self.launch(&self.lora_shrink, cfg, &args)? };
        Ok(())
    }

    /// `y[t, c] += scales[slot(t)] * h[t, seg(c)] . b[c, slot(t), seg(c)]`
    /// for every row with an adapter.
    pub fn lora_expand(
        &self,
        h: DevSlice<'_, f32>,       // [T, segs * rank]
        b: DevSlice<'_, bf16>,      // [n, slots, segs * rank]
        scales: DevSlice<'_, f32>,  // [slots]
        slot_of: DevSlice<'_, u32>, // [T]
        y: DevSlice<'_, bf16>,      // [T, n]
        sh: &LoraShape,
    ) -> Result<(), KernelError> {
        const K: &str = "lora_expand";
        sh.check(K)?;
        let t = sh.tokens;
        need(K, "h", &h, t * sh.hw())?;
        need(K, "b", &b, sh.n * sh.slots * sh.hw())?;
        need(K, "scales", &scales, sh.slots)?;
        need(K, "slot_of", &slot_of, t)?;
        need(K, "y", &y, t * sh.n)?;
        if t == 0 || sh.slots == 0 || sh.n == 0 {
            return Ok(());
        }
        aligned(K, "b", b.ptr())?;
        let args = LoraExpandArgs {
            h: h.ptr(),
            b: b.ptr(),
            scales: scales.ptr(),
            slot_of: slot_of.ptr(),
            y: y.ptr(),
            n: u32_of(K, "n", sh.n)?,
            rank: u32_of(K, "rank", sh.rank)?,
            hw: u32_of(K, "segs * rank", sh.hw())?,
            slots: u32_of(K, "slots", sh.slots)?,
            seg1: u32_of(K, "segment 1", sh.seg_starts[0])?,
            seg2: u32_of(K, "segment 2", sh.seg_starts[1])?,
        };
        let cfg = LaunchConfig {
            grid: (
                u32_of(K, "tokens", t)?,
                sh.n.div_ceil(LORA_EXPAND_THREADS) as u32,
                1,
            ),
            block: (LORA_EXPAND_THREADS as u32, 1, 1),
            shared_bytes: 0,
        };
        // SAFETY: views checked for their shapes above; the kernel reads
        // slot entries < `slots` only and takes `LoraExpandArgs`.
        unsafe { self.launch(&self.lora_expand, cfg, &args)? };
        Ok(())
    }

    /// `hb[t, s, j] = scales[s] * h[t, s, j]` where row `t` is on slot
    /// `s + 1`, 0 elsewhere: every slot's shrink narrowed to each row's own
    /// (the left operand of the tensor-core expand).
    pub fn lora_select(
        &self,
        h: DevSlice<'_, f32>,       // [T, slots, segs * rank]
        scales: DevSlice<'_, f32>,  // [slots]
        slot_of: DevSlice<'_, u32>, // [T]
        hb: DevSlice<'_, bf16>,     // [T, slots, segs * rank]
        sh: &LoraShape,
    ) -> Result<(), KernelError> {
        const K: &str = "lora_select";
        sh.check(K)?;
        let (t, width) = (sh.tokens, sh.slots * sh.hw());
        need(K, "h", &h, t * width)?;
        need(K, "scales", &scales, sh.slots)?;
        need(K, "slot_of", &slot_of, t)?;
        need(K, "hb", &hb, t * width)?;
        if t == 0 || width == 0 {
            return Ok(());
        }
        let args = LoraSelectArgs {
            h: h.ptr(),
            scales: scales.ptr(),
            slot_of: slot_of.ptr(),
            hb: hb.ptr(),
            tokens: u32_of(K, "tokens", t)?,
            hw: u32_of(K, "segs * rank", sh.hw())?,
            slots: u32_of(K, "slots", sh.slots)?,
            ..Default::default()
        };
        let blocks = (t * width).div_ceil(LORA_SELECT_THREADS);
        let cfg = LaunchConfig {
            grid: (blocks.min(LORA_SELECT_MAX_BLOCKS) as u32, 1, 1),
            block: (LORA_SELECT_THREADS as u32, 1, 1),
            shared_bytes: 0,
        };
        // SAFETY: views checked for their shapes above; the kernel reads and
        // writes `tokens x slots x hw` values and takes `LoraSelectArgs`.
        unsafe { self.launch(&self.lora_select, cfg, &args)? };
        Ok(())
    }
}

/// The CPU reference of a shrink + expand pair over the same layout, in
/// f64: `y[t] + scale * B (A x[t])` for adapter rows, `y[t]` for base rows.
#[allow(clippy::too_many_arguments)]
pub fn lora_ref(
    x: &[f32],       // [T, k]
    a: &[f32],       // [slots, segs * rank, k]
    b: &[f32],       // [n, slots, segs * rank]
    scales: &[f32],  // [slots]
    slot_of: &[u32], // [T]
    y: &[f32],       // [T, n]
    sh: &LoraShape,
) -> Vec<f32> {
    let (k, n, r, hw) = (sh.k, sh.n, sh.rank, sh.hw());
    let mut out = y.to_vec();
    for (t, &s) in slot_of.iter().enumerate().take(sh.tokens) {
        if s == 0 || s as usize > sh.slots {
            continue;
        }
        let s = s as usize - 1;
        let xr = &x[t * k..(t + 1) * k];
        let h: Vec<f64> = (0..hw)
            .map(|j| {
                let ar = &a[(s * hw + j) * k..(s * hw + j + 1) * k];
                ar.iter().zip(xr).map(|(&p, &q)| p as f64 * q as f64).sum()
            })
            .collect();
        for c in 0..n {
            let seg = usize::from(c >= sh.seg_starts[0]) + usize::from(c >= sh.seg_starts[1]);
            let at = (c * sh.slots + s) * hw + seg * r;
            let br = &b[at..at + r];
            let d: f64 = br
                .iter()
                .zip(&h[seg * r..(seg + 1) * r])
                .map(|(&p, &q)| p as f64 * q)
                .sum();
            out[t * n + c] = (out[t * n + c] as f64 + scales[s] as f64 * d) as f32;
        }
    }
    out
}
