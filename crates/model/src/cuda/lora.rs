//! LoRA on the CUDA backend: the adapter slot pool on the device and the
//! per-layer deltas `y += scale * B (A x)` of a step's adapter rows.
//!
//! Contract: [`LoraPool`] is allocated once at construction for
//! `CudaOptions::max_loras` slots of rank up to `CudaOptions::max_lora_rank`
//! (padded to a multiple of `kernels::consts::LORA_RANK_STEP`) and never
//! grows; [`lora_pool_bytes`] is its size, which the KV pool's budget leaves
//! out. Per layer and per [`Group`] it holds every slot's A (the targets of
//! a fused projection stacked: q, k, v; gate, up) and B (`[out, slots,
//! segs * rank]`, each output row set in its own target's `rank` values:
//! `kernels::lora`'s layout), bf16, zero where an adapter has no pair or a
//! smaller rank, and one f32 scale per slot.
//! [`Backend::set_lora`](contract::Backend::set_lora) uploads an adapter
//! into its slot (stream-ordered after the steps already launched, which
//! the engine guarantees do not read that slot); emptying a slot only marks
//! it free. Each token row's slot is staged with the step (`Layout::loras`,
//! 0 = the base model), so the kernels read it on the device and a captured
//! graph replays with any mix of adapters.
//!
//! Placement (where each delta lands): on the Q/K/V output before RoPE and
//! the KV write, on the gate/up output before SiLU·up, on the O and down
//! outputs before the residual add. GEMM path: after each targeted product
//! (into `delta` for O and down) a GEMM of its input by every slot's A,
//! `lora_select` keeping each row's own slot, and a GEMM of that by B added
//! to the output (tensor cores; in row chunks of at most [`WIDE_VALUES`]
//! values); in deterministic mode the CUDA-core shrink and expand instead,
//! whose per-row reductions do not depend on the batch. GEMV path: each
//! group's fused GEMV computes the shrink in blocks of its own (norming the
//! residual itself for Q/K/V and gate/up) and adds the expand in its
//! epilogue ([`kernels::gemv::GemvLora`]), so RoPE + KV write, SiLU·up and
//! the residual add stay fused and LoRA adds no launch; the step zeroes
//! the GEMVs' shrink counters (`Workspace::lora_ready`, one per layer and
//! group) first. A step without adapter rows runs exactly the base model's
//! kernels; graphs with LoRA are captured apart (`graphs`).
//!
//! Costs: device memory [`lora_pool_bytes`]; per step with adapter rows one
//! memset on the GEMV path, per layer 12 launches on the GEMM path (8 in
//! deterministic mode); the GEMM path multiplies every row by every slot's
//! A and B (`slots` times the work of its own adapter, on tensor cores).

use gpu::{DevSlice, DeviceBuffer, Gpu};
use half::bf16;
use kernels::consts::LORA_RANK_STEP;
use kernels::lora::LoraShape;

use contract::backend::{BackendError, StepBatch};
use contract::config::ModelConfig;
use contract::lora::{LoraAdapter, LoraTarget};

use super::errors::dev_err;

/// The projections that share one shrink (their input is the same).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Group {
    Qkv,
    O,
    GateUp,
    Down,
}

impl Group {
    pub(super) const ALL: [Group; 4] = [Group::Qkv, Group::O, Group::GateUp, Group::Down];

    /// This group's place in [`Group::ALL`].
    pub(super) fn index(self) -> usize {
        self as usize
    }

    /// The targets stacked in this group, in output-column order.
    fn targets(self) -> &'static [LoraTarget] {
        match self {
            Group::Qkv => &[LoraTarget::Q, LoraTarget::K, LoraTarget::V],
            Group::O => &[LoraTarget::O],
            Group::GateUp => &[LoraTarget::Gate, LoraTarget::Up],
            Group::Down => &[LoraTarget::Down],
        }
    }

    /// `(in, out)` features of the fused projection and the first output
    /// column of each stacked target.
    fn dims(self, c: &ModelConfig) -> (usize, usize, Vec<usize>) {
        let mut starts = Vec::new();
        let mut out = 0;
        for t in self.targets() {
            starts.push(out);
            out += t.dims(c).1;
        }
        (self.targets()[0].dims(c).0, out, starts)
    }
}

/// Cap on the values of each tensor-core LoRA buffer (f32 and bf16): a
/// step of more rows runs its deltas in row chunks.
pub(super) const WIDE_VALUES: usize = 1 << 22;

/// Rows per chunk of the tensor-core LoRA path for steps of up to `t`
/// tokens with `wide` values a row (`slots * segs * rank`; 0: no such
/// path, no rows).
pub(super) fn wide_rows(t: usize, wide: usize) -> usize {
    match wide {
        0 => 0,
        w => t.min((WIDE_VALUES / w).max(1)),
    }
}

/// The pool's rank for `--max-lora-rank` `max_rank`.
fn padded_rank(max_rank: usize) -> usize {
    max_rank.max(1).next_multiple_of(LORA_RANK_STEP)
}

/// Device bytes of a pool of `slots` adapters of rank up to `max_rank`
/// for model `c` (0 without slots).
pub fn lora_pool_bytes(c: &ModelConfig, slots: usize, max_rank: usize) -> usize {
    if slots == 0 {
        return 0;
    }
    let r = padded_rank(max_rank);
    let per_layer: usize = Group::ALL
        .iter()
        .map(|g| {
            let (k, n, starts) = g.dims(c);
            starts.len() * r * (k + n)
        })
        .sum();
    slots * c.num_layers * per_layer * 2 + slots * 4
}

/// The adapter slots on the device (module doc).
pub(super) struct LoraPool {
    slots: usize,
    rank: usize,
    layers: usize,
    /// Per group: A `[layers, slots, segs * rank, in]`, B `[layers, out, slots, segs * rank]`.
    a: Vec<DeviceBuffer<bf16>>,
    b: Vec<DeviceBuffer<bf16>>,
    pub(super) scales: DeviceBuffer<f32>, // [slots]
    loaded: Vec<bool>,
    /// `(in, out, first columns)` of each group.
    dims: Vec<(usize, usize, Vec<usize>)>,
}

impl LoraPool {
    /// A pool of `slots` empty slots of rank up to `max_rank` (nothing
    /// allocated without slots).
    pub fn new(
        gpu: &Gpu,
        c: &ModelConfig,
        slots: usize,
        max_rank: usize,
    ) -> Result<LoraPool, BackendError> {
        let rank = padded_rank(max_rank);
        let dims: Vec<_> = Group::ALL.iter().map(|g| g.dims(c)).collect();
        let e = |err| dev_err("allocating the LoRA pool", err);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for (k, n, starts) in &dims {
            let per = c.num_layers * slots;
            let da = gpu
                .alloc::<bf16>(per * starts.len() * rank * k)
                .map_err(e)?;
            let db = gpu
                .alloc::<bf16>(per * n * starts.len() * rank)
                .map_err(e)?;
            // zero: a slot never loaded contributes nothing even if read
            gpu.fill_bytes(da.view(), 0).map_err(e)?;
            gpu.fill_bytes(db.view(), 0).map_err(e)?;
            a.push(da);
            b.push(db);
        }
        let scales = gpu.upload(&vec![0f32; slots.max(1)]).map_err(e)?;
        Ok(LoraPool {
            slots,
            rank,
            layers: c.num_layers,
            a,
            b,
            scales,
            loaded: vec![false; slots],
            dims,
        })
    }

    pub fn slots(&self) -> usize {
        self.slots
    }

    /// The columns of the shrink's output a step needs per token.
    pub fn h_width(&self) -> usize {
        3 * self.rank
    }

    /// Every sequence's slot in `batch` holds an adapter (or is 0).
    pub fn check(&self, batch: &StepBatch) -> Result<(), BackendError> {
        for (s, &k) in batch.loras.iter().enumerate() {
            let ok = k == 0 || self.loaded.get(k as usize - 1).copied().unwrap_or(false);
            if !ok {
                return Err(BackendError::InvalidBatch(format!(
                    "loras[{s}] = {k}: no LoRA adapter is loaded in that slot ({} slots)",
                    self.slots
                )));
            }
        }
        Ok(())
    }

    /// Puts `adapter` in slot `slot` (1-based; checked against the model by
    /// the caller) or marks the slot free.
    pub fn set(
        &mut self,
        gpu: &Gpu,
        slot: u32,
        adapter: Option<&LoraAdapter>,
    ) -> Result<(), BackendError> {
        let n = self.slots;
        let Some(k) = (slot as usize).checked_sub(1).filter(|&k| k < n) else {
            return Err(BackendError::InvalidBatch(format!(
                "LoRA slot {slot} is outside 1..={n} (--max-loras {n})"
            )));
        };
        let Some(ad) = adapter else {
            self.loaded[k] = false;
            return Ok(());
        };
        if ad.rank > self.rank || ad.layers.len() != self.layers {
            return Err(BackendError::InvalidBatch(format!(
                "LoRA adapter of rank {} and {} layers does not fit the pool (rank up to {}, {} layers)",
                ad.rank,
                ad.layers.len(),
                self.rank,
                self.layers
            )));
        }
        self.loaded[k] = false;
        for (gi, g) in Group::ALL.iter().enumerate() {
            for l in 0..self.layers {
                let (ha, hb) = self.host_group(ad, *g, gi, l);
                let (da, db) = (self.a_of(gi, l)?, self.b_of(gi, l)?);
                let (la, hw) = (ha.len(), self.h_width_of(gi));
                let e = |err| dev_err("uploading a LoRA adapter", err);
                gpu.copy_to_device(&ha, da.sub(k * la, la).map_err(e)?)
                    .map_err(e)?;
                let db = db.sub(k * hw, db.len() - k * hw).map_err(e)?;
                gpu.copy_rows_to_device(&hb, hw, db, self.slots * hw)
                    .map_err(e)?;
            }
        }
        let e = |err| dev_err("uploading a LoRA scale", err);
        gpu.copy_to_device(&[ad.scale], self.scales.view().sub(k, 1).map_err(e)?)
            .map_err(e)?;
        self.loaded[k] = true;
        Ok(())
    }

    /// One slot's A `[segs * rank, in]` and B `[out, segs * rank]` (row
    /// `c` set in its target's `rank` values) of group `g` (index `gi`) in
    /// layer `l`, bf16, zero-padded.
    fn host_group(
        &self,
        ad: &LoraAdapter,
        g: Group,
        gi: usize,
        l: usize,
    ) -> (Vec<bf16>, Vec<bf16>) {
        let (k, n, starts) = &self.dims[gi];
        let (r, ar) = (self.rank, ad.rank);
        let mut a = vec![bf16::ZERO; starts.len() * r * k];
        let hw = self.h_width_of(gi);
        let mut b = vec![bf16::ZERO; n * hw];
        for (j, t) in g.targets().iter().enumerate() {
            let Some(p) = ad.layers[l].pair(*t) else {
                continue;
            };
            for (q, row) in p.a.chunks_exact(*k).enumerate() {
                let dst = (j * r + q) * k;
                for (d, &v) in a[dst..dst + k].iter_mut().zip(row) {
                    *d = bf16::from_f32(v);
                }
            }
            for (o, row) in p.b.chunks_exact(ar).enumerate() {
                let dst = (starts[j] + o) * hw + j * r;
                for (d, &v) in b[dst..dst + ar].iter_mut().zip(row) {
                    *d = bf16::from_f32(v);
                }
            }
        }
        (a, b)
    }

    /// Layer `l`'s A of group `gi`, every slot.
    pub(super) fn a_of(&self, gi: usize, l: usize) -> Result<DevSlice<'_, bf16>, BackendError> {
        let (k, _, starts) = &self.dims[gi];
        let len = self.slots * starts.len() * self.rank * k;
        self.a[gi]
            .view()
            .sub(l * len, len)
            .map_err(|e| dev_err("LoRA view", e))
    }

    /// Columns of group `gi`'s shrink: `segs * rank`.
    pub(super) fn h_width_of(&self, gi: usize) -> usize {
        self.dims[gi].2.len() * self.rank
    }

    /// Layer `l`'s B of group `gi`, every slot.
    pub(super) fn b_of(&self, gi: usize, l: usize) -> Result<DevSlice<'_, bf16>, BackendError> {
        let len = self.dims[gi].1 * self.slots * self.h_width_of(gi);
        self.b[gi]
            .view()
            .sub(l * len, len)
            .map_err(|e| dev_err("LoRA view", e))
    }

    /// The launch shape of group `gi` over `m` rows.
    pub(super) fn shape(&self, gi: usize, m: usize) -> LoraShape {
        let (k, n, starts) = &self.dims[gi];
        let at = |i: usize| starts.get(i).copied().unwrap_or(*n);
        LoraShape {
            tokens: m,
            k: *k,
            n: *n,
            rank: self.rank,
            segs: starts.len(),
            seg_starts: [at(1), at(2)],
            slots: self.slots,
        }
    }
}
