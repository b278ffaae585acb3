//! The executor's half of LoRA (`lora`'s module doc says where each delta
//! lands): the GEMM path's deltas after a product, the operands the GEMV
//! path's fused shrink and expand read, and the counters it zeroes.

use gpu::{DevSlice, GemmDims};
use half::bf16;
use kernels::gemv::GemvLora;
use kernels::lora::LoraShape;

use contract::backend::BackendError;

use super::Exec;
use crate::cuda::errors::{dev_err, ge, ke};
use crate::cuda::lora::{Group, wide_rows};

impl Exec<'_> {
    /// Adds group `g`'s delta of layer `l` to `y` for the first `m` rows of
    /// input `x`, each row's slot in `rows` (`[m]`): the GEMM path (module
    /// doc).
    pub(super) fn lora_delta(
        &self,
        l: usize,
        g: Group,
        x: DevSlice<'_, bf16>,
        y: DevSlice<'_, bf16>,
        rows: DevSlice<'_, u32>,
        m: usize,
    ) -> Result<(), BackendError> {
        let (sh, a, b, scales) = self.lora_operands(l, g, m)?;
        let e = ke("LoRA delta");
        let chunk = wide_rows(m, self.tuning.lora_wide);
        if chunk == 0 {
            let h = self.lora_h(m * sh.hw())?;
            self.k.lora_shrink(x, a, rows, h, &sh).map_err(e)?;
            return self.k.lora_expand(h, b, scales, rows, y, &sh).map_err(e);
        }
        let (k, n, wide) = (sh.k, sh.n, sh.slots * sh.hw());
        let (gm, gv) = (ge("LoRA delta (GEMM)"), ge("LoRA views"));
        for r0 in (0..m).step_by(chunk) {
            let c = chunk.min(m - r0);
            let h = self.ws.lora_wide.view().sub(0, c * wide).map_err(gv)?;
            let hb = self.ws.lora_wide_b.view().sub(0, c * wide).map_err(gv)?;
            let x_c = x.sub(r0 * k, c * k).map_err(gv)?;
            let rows_c = rows.sub(r0, c).map_err(gv)?;
            let at = |m, n, k| GemmDims { m, n, k };
            // h[c, slots * hw] = x · A_allᵀ; hb: each row's own slot, scaled
            self.blas.matmul_nt(x_c, a, h, at(c, wide, k)).map_err(gm)?;
            let shc = LoraShape { tokens: c, ..sh };
            self.k.lora_select(h, scales, rows_c, hb, &shc).map_err(e)?;
            // y[c, n] += hb · Bᵀ, B `[n, slots * hw]`
            let y_c = y.sub(r0 * n, c * n).map_err(gv)?;
            self.blas
                .matmul_nt_add(hb, b, y_c, at(c, n, wide))
                .map_err(gm)?;
        }
        Ok(())
    }

    /// What group `g`'s GEMV of layer `l` needs to add the deltas of the
    /// first `m` rows (the GEMV path), each row's slot in `rows`.
    pub(super) fn gemv_lora<'a>(
        &'a self,
        l: usize,
        g: Group,
        rows: DevSlice<'a, u32>,
        m: usize,
    ) -> Result<GemvLora<'a>, BackendError> {
        let (sh, a, b, scales) = self.lora_operands(l, g, m)?;
        let ready = self
            .ws
            .lora_ready
            .view()
            .sub(l * Group::ALL.len() + g.index(), 1)
            .map_err(ge("LoRA view"))?;
        Ok(GemvLora {
            a,
            b,
            scales,
            slot_of: rows,
            h: self.lora_h(m * sh.hw())?,
            ready,
            shape: sh,
        })
    }

    /// Zeroes the GEMV path's shrink counters (before a step's first GEMV).
    pub(super) fn reset_lora_counters(&self) -> Result<(), BackendError> {
        self.k
            .gpu()
            .fill_bytes(self.ws.lora_ready.view(), 0)
            .map_err(ge("resetting the LoRA counters"))
    }

    /// Group `g`'s launch shape over `m` rows and layer `l`'s A, B and the
    /// slots' scales.
    #[allow(clippy::type_complexity)]
    fn lora_operands(
        &self,
        l: usize,
        g: Group,
        m: usize,
    ) -> Result<
        (
            LoraShape,
            DevSlice<'_, bf16>,
            DevSlice<'_, bf16>,
            DevSlice<'_, f32>,
        ),
        BackendError,
    > {
        let (pool, gi) = (&self.lora, g.index());
        let (a, b) = (pool.a_of(gi, l)?, pool.b_of(gi, l)?);
        Ok((pool.shape(gi, m), a, b, pool.scales.view()))
    }

    /// The first `len` values of the shrink's output buffer.
    fn lora_h(&self, len: usize) -> Result<DevSlice<'_, f32>, BackendError> {
        self.ws
            .lora_h
            .view()
            .sub(0, len)
            .map_err(|err| dev_err("LoRA view", err))
    }
}
