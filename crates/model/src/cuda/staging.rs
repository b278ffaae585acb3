//! Host-side packing of a step's metadata into one `u32` staging buffer,
//! copied to the device with a single asynchronous copy per step.
//!
//! Contract: a [`Layout`] fixes where each array lives for a given
//! `(T, S, max_blocks, R, history)` capacity. Eager steps use the exact
//! sizes; a captured decode graph uses its bucket's fixed layout (the graph
//! bakes the offsets in), with rows past the real batch padded to a scratch
//! slot/block that no sequence reads. Sampling parameters are laid out as
//! [`SampleParams`] words at a 16-byte aligned offset.
//! [`CudaBackend::stage`] packs a step into the pinned buffer once the
//! previous step's copy of it has run (a fence) and copies the used prefix
//! to the device; a held step's final sampling settings are staged apart
//! ([`CudaBackend::stage_sampling`]).
//! Costs: O(T + S * max_blocks + R + history) host writes and one
//! host-to-device copy per step.

use kernels::SampleParams;

use contract::backend::{BackendError, SampleRequest, StepBatch};
use contract::history::additive_terms;
use contract::sampling::{MAX_LOGPROBS, uniform};

use super::CudaBackend;
use super::errors::dev_err;

/// `u32` words of one [`SampleParams`].
pub(super) const PARAM_WORDS: usize = std::mem::size_of::<SampleParams>() / 4;

/// Offsets (in `u32` words) of each array in the staging buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Layout {
    pub t: usize,
    pub s: usize,
    pub max_blocks: usize,
    pub r: usize,
    pub hist_cap: usize,
    pub tokens: usize,       // [T]
    pub positions: usize,    // [T]
    pub slots: usize,        // [T]
    pub carry: usize,        // [T] sampler row of the previous step, or NO_CARRY
    pub cu_seqlens: usize,   // [S + 1]
    pub context_lens: usize, // [S]
    pub tables: usize,       // [S, max_blocks]
    pub rows: usize,         // [R] token rows to sample / return
    pub loras: usize,        // [T] each token's LoRA slot (0: the base model)
    pub params: usize,       // [R, PARAM_WORDS]
    pub history: usize,      // [hist_cap]
    pub total: usize,
}

impl Layout {
    pub fn new(t: usize, s: usize, max_blocks: usize, r: usize, hist_cap: usize) -> Layout {
        let tokens = 0;
        let positions = tokens + t;
        let slots = positions + t;
        let carry = slots + t;
        let cu_seqlens = carry + t;
        let context_lens = cu_seqlens + s + 1;
        let tables = context_lens + s;
        let rows = tables + s * max_blocks;
        let loras = rows + r;
        let params = (loras + t).next_multiple_of(4);
        let history = params + r * PARAM_WORDS;
        Layout {
            t,
            s,
            max_blocks,
            r,
            hist_cap,
            tokens,
            positions,
            slots,
            carry,
            cu_seqlens,
            context_lens,
            tables,
            rows,
            loras,
            params,
            history,
            total: history + hist_cap.max(1),
        }
    }
}

/// The `carry` entry of a token that is not carried.
pub(super) const NO_CARRY: u32 = u32::MAX;

/// Where padded rows of a graph bucket write and read.
#[derive(Debug, Clone, Copy)]
pub(super) struct Pad {
    pub block: u32,
    pub block_size: u32,
}

/// Copies each scalar sampling parameter marked `kernel` in
/// `contract::sampling_params!` into the kernel record's field of the same
/// name (`$kernel` only selects the marked entries).
macro_rules! copy_to_kernel {
    (
        { $out:ident $p:ident }
        $( $(#[doc = $doc:literal])* $name:ident : f32 = $default:literal, $range:expr $(, $kernel:ident)? ; )*
    ) => {
        $( $( let _ = stringify!($kernel); $out.$name = $p.$name; )? )*
    };
}

/// Kernel parameters for one sample request; its distinct history ids (only
/// when the repetition penalty is active; kept sorted and distinct by the
/// engine, so copied without a sort), then its additive terms (presence /
/// frequency penalties, `logit_bias`: `(id, f32 bits)` word pairs from
/// `contract::history::additive_terms`), then the grammar's allowed-token
/// mask words (`contract::mask`, when constrained) are appended to `history`.
/// The mask words are left out unless `masks` (a held step's launch: its
/// masks are not final; its release stages them itself).
pub(super) fn sample_params(
    req: Option<&SampleRequest>,
    history: &mut Vec<u32>,
    masks: bool,
) -> SampleParams {
    let Some(req) = req else {
        return SampleParams::greedy();
    };
    let p = &req.params;
    let mut out = SampleParams {
        top_k: u32::try_from(p.top_k).unwrap_or(u32::MAX),
        u: uniform(p.seed, req.step),
        hist_off: history.len() as u32,
        n_logprobs: p.logprobs.min(MAX_LOGPROBS) as u32,
        ..SampleParams::greedy()
    };
    contract::sampling_params!(copy_to_kernel { out p });
    if p.is_greedy() {
        // the kernels' encoding of greedy
        out.temperature = 0.0;
    }
    if let Some(h) = &req.history
        && p.repetition_penalty != 1.0
    {
        // already sorted and distinct (`PenaltyHistory`): copied as is
        out.hist_len = h.len() as u32;
        history.extend_from_slice(h.as_slice());
    }
    let mut adds = Vec::new();
    additive_terms(p, req.history.as_deref(), &mut adds);
    out.add_off = history.len() as u32;
    out.add_len = adds.len() as u32;
    for (id, d) in adds {
        history.extend_from_slice(&[id, d.to_bits()]);
    }
    if let Some(mask) = req.allowed.as_ref().filter(|_| masks) {
        out.mask_off = history.len() as u32;
        out.mask_len = mask.words().len() as u32;
        history.extend_from_slice(mask.words());
    }
    out
}

/// Fills `buf[..lay.total]` for `batch`; `rows` are the token rows to
/// sample (or return), `params` their settings; `carry` the `(token,
/// sampler row of the previous step)` pairs of carried tokens. Sequences and
/// rows past the batch (graph padding) get one token at position 0 in
/// `pad`'s block.
#[allow(clippy::too_many_arguments)]
pub(super) fn pack(
    buf: &mut [u32],
    lay: &Layout,
    batch: &StepBatch,
    rows: &[u32],
    params: &[SampleParams],
    history: &[u32],
    carry: &[(u32, u32)],
    pad: Option<Pad>,
) {
    let (t, s) = (batch.num_tokens(), batch.num_seqs());
    buf[lay.tokens..lay.tokens + t].copy_from_slice(&batch.tokens);
    buf[lay.positions..lay.positions + t].copy_from_slice(&batch.positions);
    buf[lay.slots..lay.slots + t].copy_from_slice(&batch.slot_mapping);
    buf[lay.carry..lay.carry + lay.t].fill(NO_CARRY);
    for &(tok, row) in carry {
        buf[lay.carry + tok as usize] = row;
    }
    buf[lay.cu_seqlens..lay.cu_seqlens + s + 1].copy_from_slice(&batch.cu_seqlens);
    buf[lay.context_lens..lay.context_lens + s].copy_from_slice(&batch.context_lens);
    let w = batch.max_blocks.min(lay.max_blocks);
    for q in 0..s {
        let dst = lay.tables + q * lay.max_blocks;
        buf[dst..dst + w].copy_from_slice(&batch.block_table(q)[..w]);
        buf[dst + w..dst + lay.max_blocks].fill(0);
    }
    buf[lay.rows..lay.rows + rows.len()].copy_from_slice(rows);
    buf[lay.loras..lay.loras + lay.t].fill(0);
    if batch.loras.iter().any(|&k| k != 0) {
        for (q, w) in batch.cu_seqlens.windows(2).enumerate() {
            let (a, b) = (lay.loras + w[0] as usize, lay.loras + w[1] as usize);
            buf[a..b].fill(batch.lora_of(q));
        }
    }
    for (i, p) in params.iter().enumerate() {
        let dst = lay.params + i * PARAM_WORDS;
        buf[dst..dst + PARAM_WORDS].copy_from_slice(bytemuck::cast_slice(std::slice::from_ref(p)));
    }
    buf[lay.history..lay.history + history.len()].copy_from_slice(history);
    if let Some(pad) = pad {
        let slot = pad.block * pad.block_size;
        for i in t..lay.t {
            buf[lay.tokens + i] = 0;
            buf[lay.positions + i] = 0;
            buf[lay.slots + i] = slot;
        }
        for q in s..lay.s {
            buf[lay.cu_seqlens + q + 1] = buf[lay.cu_seqlens + q] + 1;
            buf[lay.context_lens + q] = 1;
            let dst = lay.tables + q * lay.max_blocks;
            buf[dst..dst + lay.max_blocks].fill(pad.block);
        }
        for i in rows.len()..lay.r {
            buf[lay.rows + i] = i as u32;
        }
        let greedy = SampleParams::greedy();
        for i in params.len()..lay.r {
            let dst = lay.params + i * PARAM_WORDS;
            buf[dst..dst + PARAM_WORDS]
                .copy_from_slice(bytemuck::cast_slice(std::slice::from_ref(&greedy)));
        }
    }
}

impl CudaBackend {
    /// Stages `batch` at `lay` and copies the staging buffer to the device.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn stage(
        &mut self,
        lay: &Layout,
        batch: &StepBatch,
        rows: &[u32],
        params: &[SampleParams],
        hist: &[u32],
        carry: &[(u32, u32)],
        pad: bool,
    ) -> Result<(), BackendError> {
        let pad = pad.then_some(Pad {
            block: self.kv.num_blocks as u32,
            block_size: self.kv.block_size as u32,
        });
        // the previous step's copy of the pinned buffer must have run
        self.ws
            .meta_fence
            .wait()
            .map_err(|e| dev_err("waiting for the last staging copy", e))?;
        pack(
            self.ws.host_meta.as_mut_slice(),
            lay,
            batch,
            rows,
            params,
            hist,
            carry,
            pad,
        );
        // Only the used prefix: a graph bucket's history capacity is mostly empty.
        let used = lay.history + hist.len().max(1);
        let dst = self
            .ws
            .meta
            .slice(0..used)
            .map_err(|e| dev_err("staging", e))?;
        self.gpu
            .copy_to_device(&self.ws.host_meta.as_slice()[..used], dst)
            .map_err(|e| dev_err("copying step metadata", e))?;
        self.ws
            .meta_fence
            .record()
            .map_err(|e| dev_err("copying step metadata", e))
    }

    /// Stages the final sampling parameters and history of a held step
    /// laid out at `lay` (`params` of its first rows, padded rows keeping
    /// theirs; the history words `hist`, then each of `masks` in turn, as
    /// the params' offsets say) and copies them to the device behind its
    /// forward pass.
    pub(super) fn stage_sampling(
        &mut self,
        lay: &Layout,
        params: &[SampleParams],
        hist: &[u32],
        masks: &[&[u32]],
    ) -> Result<(), BackendError> {
        let words = hist.len() + masks.iter().map(|m| m.len()).sum::<usize>();
        if words > lay.hist_cap || params.len() > lay.r {
            return Err(BackendError::InvalidBatch(format!(
                "release: {} sampler rows and {words} history words where the held step laid out {} and {}",
                params.len(),
                lay.r,
                lay.hist_cap
            )));
        }
        // the last release's copy must have run (long since: a step ago)
        self.ws
            .release_fence
            .wait()
            .map_err(|e| dev_err("waiting for the last sampling copy", e))?;
        // params, padded rows' params (as the launch staged them) and
        // history are contiguous: one copy of `from..to`
        let (from, to) = (lay.params, lay.history + words.max(1));
        let buf = self.ws.host_release.as_mut_slice();
        buf[from..lay.history].copy_from_slice(&self.ws.host_meta.as_slice()[from..lay.history]);
        for (i, p) in params.iter().enumerate() {
            let dst = lay.params + i * PARAM_WORDS;
            buf[dst..dst + PARAM_WORDS]
                .copy_from_slice(bytemuck::cast_slice(std::slice::from_ref(p)));
        }
        let mut at = lay.history;
        for part in std::iter::once(hist).chain(masks.iter().copied()) {
            buf[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
        let dst = self
            .ws
            .meta
            .slice(from..to)
            .map_err(|e| dev_err("staging", e))?;
        self.gpu
            .copy_to_device(&self.ws.host_release.as_slice()[from..to], dst)
            .map_err(|e| dev_err("copying sampling parameters", e))?;
        self.ws
            .release_fence
            .record()
            .map_err(|e| dev_err("copying sampling parameters", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use contract::sampling::SamplingParams;

    #[test]
    fn layout_is_dense_and_aligned() {
        let l = Layout::new(5, 2, 3, 2, 7);
        assert_eq!(l.positions, 5);
        assert_eq!(l.carry, 15);
        assert_eq!(l.cu_seqlens, 20);
        assert_eq!(l.tables, 20 + 3 + 2);
        assert_eq!(l.params % 4, 0);
        assert_eq!(l.total, l.history + 7);
    }

    #[test]
    fn pads_graph_rows_to_the_scratch_block() {
        let batch = StepBatch {
            tokens: vec![9, 8],
            positions: vec![4, 0],
            cu_seqlens: vec![0, 1, 2],
            slot_mapping: vec![4, 16],
            context_lens: vec![5, 1],
            block_tables: vec![0, 1],
            max_blocks: 1,
            samples: vec![None, None],
            prompt_lens: Vec::new(),
            carried: Vec::new(),
            drafts: Vec::new(),
            draft_masks: Vec::new(),
            loras: vec![0, 3],
        };
        let lay = Layout::new(4, 4, 2, 4, 4);
        let mut buf = vec![u32::MAX; lay.total];
        let params = vec![SampleParams::greedy(); 2];
        pack(
            &mut buf,
            &lay,
            &batch,
            &[0, 1],
            &params,
            &[],
            &[(1, 3)],
            Some(Pad {
                block: 7,
                block_size: 16,
            }),
        );
        assert_eq!(&buf[lay.slots..lay.slots + 4], &[4, 16, 112, 112]);
        assert_eq!(
            &buf[lay.carry..lay.carry + 4],
            &[NO_CARRY, 3, NO_CARRY, NO_CARRY]
        );
        assert_eq!(&buf[lay.cu_seqlens..lay.cu_seqlens + 5], &[0, 1, 2, 3, 4]);
        assert_eq!(&buf[lay.context_lens..lay.context_lens + 4], &[5, 1, 1, 1]);
        assert_eq!(&buf[lay.tables..lay.tables + 8], &[0, 0, 1, 0, 7, 7, 7, 7]);
        assert_eq!(&buf[lay.rows..lay.rows + 4], &[0, 1, 2, 3]);
        // each token's LoRA slot; padded rows run the base model
        assert_eq!(&buf[lay.loras..lay.loras + 4], &[0, 3, 0, 0]);
    }

    #[test]
    fn sample_params_follow_the_request() {
        let mut hist = Vec::new();
        let req = SampleRequest {
            params: SamplingParams {
                temperature: 0.7,
                top_k: 5,
                repetition_penalty: 1.2,
                seed: 3,
                logprobs: 99,
                ..SamplingParams::default()
            },
            step: 4,
            history: Some(std::sync::Arc::new(
                contract::history::PenaltyHistory::from_tokens(&[5, 3, 5, 1]),
            )),
            allowed: None,
        };
        let p = sample_params(Some(&req), &mut hist, true);
        assert_eq!(hist, vec![1, 3, 5]);
        assert_eq!((p.hist_off, p.hist_len, p.top_k), (0, 3, 5));
        assert_eq!((p.add_off, p.add_len), (3, 0));
        // additive terms follow as (id, f32 bits) pairs
        let mut h = contract::history::PenaltyHistory::from_tokens(&[2]);
        h.push_generated(6);
        h.push_generated(6);
        let biased = SampleRequest {
            params: SamplingParams {
                frequency_penalty: 0.5,
                logit_bias: std::sync::Arc::from(vec![(1, -100.0)]),
                ..SamplingParams::default()
            },
            step: 0,
            history: Some(std::sync::Arc::new(h)),
            allowed: None,
        };
        let q = sample_params(Some(&biased), &mut hist, true);
        assert_eq!((q.hist_len, q.add_off, q.add_len), (0, 3, 2));
        assert_eq!(
            &hist[3..],
            &[1, (-100.0f32).to_bits(), 6, (-1.0f32).to_bits()]
        );
        assert_eq!(p.u, uniform(3, 4));
        // the grammar's mask words follow the additive terms
        let masked = SampleRequest {
            allowed: Some(std::sync::Arc::new(contract::TokenMask::from_ids(
                40,
                &[2, 33],
            ))),
            ..biased.clone()
        };
        let before = hist.len();
        let m = sample_params(Some(&masked), &mut hist, true);
        assert_eq!((m.mask_off as usize, m.mask_len), (before + 4, 2));
        assert_eq!(&hist[before + 4..], &[1 << 2, 1 << 1]);
        assert_eq!(q.mask_len, 0);
        assert_eq!(p.n_logprobs as usize, MAX_LOGPROBS);
        assert_eq!(sample_params(None, &mut hist, true).temperature, 0.0);
    }
}
