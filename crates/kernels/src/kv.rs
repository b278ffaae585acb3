//! One layer's paged K/V caches as every kernel that writes or reads them
//! takes them: bf16 elements, or FP8 e4m3 bytes with one scale for K and
//! one for V (`contract::KvScales`, the layer's entry). A writer stores
//! `e4m3(x / scale)` (round to nearest even, saturating at ±448, the codec
//! of `ops::fp8::encode`), a reader widens `decode(byte) * scale`; the
//! layout is the same `[slots, kv_heads, head_dim]` in either type, so an
//! FP8 pool holds twice the slots of a bf16 one in the same bytes.
//! FP8 caches may hold their keys Hadamard-rotated (`rotate`, set by the
//! backend from `ops::hadamard::rotates_keys`): the writers (`rope_kv_write`,
//! the `gemv_norm_rope` epilogue) then rotate every q and k head after RoPE
//! (`cu/hadamard.cuh`, `ops::hadamard::rotate_heads`' arithmetic), and the
//! readers need nothing, since rotated scores equal the plain ones.
//! Costs: none (a view).

use gpu::DevSlice;
use half::bf16;

use crate::consts::HADAMARD_MAX_DIM;

/// One layer's K and V caches, `[slots, kv_heads, head_dim]` each.
#[derive(Debug, Clone, Copy)]
pub enum KvCaches<'a> {
    /// bf16 elements.
    Bf16 {
        k: DevSlice<'a, bf16>,
        v: DevSlice<'a, bf16>,
    },
    /// FP8 e4m3 bytes: the value of byte `b` is `decode(b) * scale`;
    /// `rotate`: q and k heads are Hadamard-rotated after RoPE.
    Fp8 {
        k: DevSlice<'a, u8>,
        v: DevSlice<'a, u8>,
        k_scale: f32,
        v_scale: f32,
        rotate: bool,
    },
}

impl<'a> KvCaches<'a> {
    /// bf16 caches.
    pub fn bf16(k: DevSlice<'a, bf16>, v: DevSlice<'a, bf16>) -> Self {
        KvCaches::Bf16 { k, v }
    }

    /// Whether the caches hold e4m3 bytes.
    pub fn is_fp8(&self) -> bool {
        matches!(self, KvCaches::Fp8 { .. })
    }

    /// The kernels' `kv_fp8` flag: 1 for e4m3 bytes, 0 for bf16.
    pub(crate) fn flag(&self) -> u32 {
        u32::from(self.is_fp8())
    }

    /// Whether q and k heads are Hadamard-rotated after RoPE.
    pub fn rotates(&self) -> bool {
        matches!(self, KvCaches::Fp8 { rotate: true, .. })
    }

    /// The writers' `kv_rotate` flag for heads of `head_dim`: 1 when the
    /// caches rotate, which needs a power of two up to `HADAMARD_MAX_DIM`
    /// (the error names the kernel).
    pub(crate) fn rotate_flag(
        &self,
        kernel: &'static str,
        head_dim: usize,
    ) -> Result<u32, crate::KernelError> {
        if !self.rotates() {
            return Ok(0);
        }
        if !head_dim.is_power_of_two() || !(2..=HADAMARD_MAX_DIM).contains(&head_dim) {
            return Err(crate::KernelError::Unsupported {
                kernel,
                reason: format!(
                    "a Hadamard-rotated K cache needs a power-of-two head_dim in 2..={HADAMARD_MAX_DIM}, got {head_dim}"
                ),
            });
        }
        Ok(1)
    }

    /// Device addresses of K and V.
    pub(crate) fn ptrs(&self) -> (u64, u64) {
        match self {
            KvCaches::Bf16 { k, v } => (k.ptr(), v.ptr()),
            KvCaches::Fp8 { k, v, .. } => (k.ptr(), v.ptr()),
        }
    }

    /// Elements of the shorter of K and V.
    pub(crate) fn len(&self) -> usize {
        match self {
            KvCaches::Bf16 { k, v } => k.len().min(v.len()),
            KvCaches::Fp8 { k, v, .. } => k.len().min(v.len()),
        }
    }

    /// `(k_scale, v_scale)`: 1 for bf16.
    pub(crate) fn scales(&self) -> (f32, f32) {
        match self {
            KvCaches::Bf16 { .. } => (1.0, 1.0),
            KvCaches::Fp8 {
                k_scale, v_scale, ..
            } => (*k_scale, *v_scale),
        }
    }

    /// Checks both caches hold at least `need` elements; the error names
    /// the kernel.
    pub(crate) fn need(&self, kernel: &'static str, need: usize) -> Result<(), crate::KernelError> {
        if self.len() < need {
            return Err(crate::KernelError::Shape {
                kernel,
                reason: format!(
                    "operand `k_cache` / `v_cache` needs {need} elements, views hold {}",
                    self.len()
                ),
            });
        }
        let (ks, vs) = self.scales();
        if !(ks.is_finite() && ks > 0.0 && vs.is_finite() && vs > 0.0) {
            return Err(crate::KernelError::Shape {
                kernel,
                reason: format!("FP8 K/V scales must be finite and positive, got {ks} / {vs}"),
            });
        }
        Ok(())
    }
}
