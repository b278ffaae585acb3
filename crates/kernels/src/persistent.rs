//! Launcher for `cu/persistent.cu`: the persistent decode kernel, which runs
//! a recorded run of GEMV and decode attention launches as one launch.
//!
//! Contract: [`Kernels::record_persistent`] runs a closure with every launch
//! of these kernels recorded instead of made. Each must be one the kernel
//! runs: a GEMV of one row of the kinds `consts::PERSIST_GEMV_*` in bf16 or
//! FP8 weights without LoRA deltas, or decode attention over bf16 caches of
//! a head size in [`HEAD_DIMS`] and group cap [`GROUP_CAP`]; all GEMVs of
//! one format. Otherwise the recording names the first launch it cannot run
//! ([`Recorded::refused`]). The closure must reach the GPU through these
//! kernels alone (a cuBLAS call, copy or memset would run at once, out of
//! order); nothing it records runs. [`Kernels::persistent_program`] uploads
//! the ops (a blocking copy: never inside a graph capture) with their
//! counters; [`Kernels::launch_persistent`] enqueues a program (capturable).
//! The ops' argument structs point where the recorded launches pointed, so
//! a program is valid while those buffers are, and runs what those
//! launches would have: the same bodies over the same blocks.
//! Costs: recording is host work; the upload one blocking copy of a
//! `PersistentOp` record an op; a launch one cooperative launch of as many blocks as are resident.

use std::any::Any;
use std::sync::MutexGuard;

use gpu::{DeviceBuffer, Function, LaunchConfig};

use crate::abi::{ArgWords, DecodeArgs, GemvArgs, PersistentArgs, PersistentOp};
use crate::consts::{
    PERSIST_ATTENTION, PERSIST_GEMV_NORM_GATED, PERSIST_GEMV_NORM_ROPE, PERSIST_GEMV_RESID,
    PERSIST_THREADS,
};
use crate::gemv::{self, WeightFormat};
use crate::{KernelError, Kernels};

/// Weight formats the kernel is built for (`persistent_{prefix}_d*`).
pub const FORMATS: [WeightFormat; 2] = [WeightFormat::Bf16, WeightFormat::Fp8Row];
/// Head sizes the kernel is built for.
pub const HEAD_DIMS: [usize; 3] = [64, 128, 256];
/// The decode attention group cap the kernel is built for.
pub const GROUP_CAP: usize = 4;
/// The GEMV kinds the kernel runs (indices into `gemv::VARIANTS`).
const GEMV_KINDS: [usize; 3] = [
    PERSIST_GEMV_RESID,
    PERSIST_GEMV_NORM_GATED,
    PERSIST_GEMV_NORM_ROPE,
];

/// The entry point for weight `format`, head size `d` and group cap `c`.
pub(crate) fn entry(format: WeightFormat, d: usize, c: usize) -> String {
    format!("persistent_{}_d{d}_g{c}", format.prefix())
}

/// What a recorded kernel is to the persistent kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OpKind {
    Gemv { format: WeightFormat, kind: usize },
    Attention { d: usize },
}

/// The kernels the persistent kernel runs, by entry-point name.
pub(crate) fn op_kinds() -> Vec<(String, OpKind)> {
    let mut v = Vec::new();
    for format in FORMATS {
        for kind in GEMV_KINDS {
            v.push((gemv::entry(kind, format, 1), OpKind::Gemv { format, kind }));
        }
    }
    for d in HEAD_DIMS {
        let name = format!("decode_attention_d{d}_g{GROUP_CAP}");
        v.push((name, OpKind::Attention { d }));
    }
    v
}

/// One persistent entry point and what it runs.
pub(crate) struct Entry {
    pub format: WeightFormat,
    pub d: usize,
    pub func: Function,
}

/// What a recording captured: the ops in stream order, or why the
/// persistent kernel cannot run them.
#[derive(Debug, Default)]
pub struct Recorded {
    ops: Vec<PersistentOp>,
    /// The first launch the kernel cannot run, and why.
    pub refused: Option<String>,
    format: Option<WeightFormat>,
    head_dim: Option<usize>,
    smem: u32,
}

impl Recorded {
    /// The ops recorded so far.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    fn take<T: ArgWords + 'static>(
        &mut self,
        kind: Option<OpKind>,
        name: &str,
        cfg: &LaunchConfig,
        args: &T,
    ) {
        if self.refused.is_some() {
            return;
        }
        if let Err(why) = self.push(kind, cfg, args) {
            self.refused = Some(format!("`{name}`: {why}"));
        }
    }

    fn push<T: ArgWords + 'static>(
        &mut self,
        kind: Option<OpKind>,
        cfg: &LaunchConfig,
        args: &T,
    ) -> Result<(), String> {
        let any = args as &dyn Any;
        let code = match kind.ok_or("not a kernel the persistent decode kernel runs")? {
            OpKind::Gemv { format, kind } => {
                let a = any.downcast_ref::<GemvArgs>().ok_or("not GEMV arguments")?;
                if a.lora_slots != 0 || a.lora_shrink_blocks != 0 {
                    return Err("LoRA deltas".into());
                }
                let first = *self.format.get_or_insert(format);
                if first != format {
                    return Err(format!("{format:?} weights after {first:?} ones"));
                }
                kind
            }
            OpKind::Attention { d } => {
                any.downcast_ref::<DecodeArgs>()
                    .ok_or("not decode attention arguments")?;
                let first = *self.head_dim.get_or_insert(d);
                if first != d {
                    return Err(format!("head size {d} after {first}"));
                }
                PERSIST_ATTENTION
            }
        };
        if cfg.block != (PERSIST_THREADS as u32, 1, 1) {
            return Err(format!("blocks of {:?} threads", cfg.block));
        }
        let (gx, gy, gz) = cfg.grid;
        let blocks = gx
            .checked_mul(gy)
            .and_then(|b| b.checked_mul(gz))
            .ok_or("a grid of more than 2^32 blocks")?;
        let mut op = PersistentOp {
            kind: code as u32,
            blocks,
            grid_x: gx,
            grid_y: gy,
            args: [0; 70],
        };
        if T::WORDS > op.args.len() {
            return Err(format!("{} words of arguments", T::WORDS));
        }
        args.write_words(&mut op.args);
        self.smem = self.smem.max(cfg.shared_bytes);
        self.ops.push(op);
        Ok(())
    }
}

/// Recorded ops on the device, ready to launch (module doc).
pub struct PersistentProgram {
    entry: usize,
    ops: DeviceBuffer<u32>,           // [n_ops, PersistentOp words]
    counters: DeviceBuffer<u32>,      // [n_ops + 2] (PersistentArgs)
    trace: Option<DeviceBuffer<u64>>, // [n_ops, grid, 3] (PersistentArgs)
    kinds: Vec<u32>,
    virtual_blocks: Vec<u32>,
    n_ops: u32,
    grid: u32,
    smem: u32,
}

/// One op of a traced launch ([`PersistentProgram::trace`]): microseconds
/// from the launch's first block start.
#[derive(Debug, Clone, PartialEq)]
pub struct OpTime {
    /// `consts::PERSIST_*`: which body.
    pub kind: u32,
    /// Its virtual blocks.
    pub blocks: u32,
    /// When its last block arrived: the op complete.
    pub done: f64,
    /// When the first block saw the op before it complete.
    pub first_ready: f64,
    /// The median and the longest time of a block from the end of its
    /// wait to its arrival (its virtual blocks' work).
    pub work_median: f64,
    pub work_max: f64,
}

impl PersistentProgram {
    /// The ops it runs.
    pub fn ops(&self) -> usize {
        self.n_ops as usize
    }

    /// The blocks it launches (all resident at once).
    pub fn blocks(&self) -> usize {
        self.grid as usize
    }

    /// The op timings of its latest launch, when it was built to trace
    /// them (`persistent_program(.., true)`); blocking (synchronises).
    pub fn trace(&self, gpu: &gpu::Gpu) -> Result<Option<Vec<OpTime>>, KernelError> {
        let Some(buf) = &self.trace else {
            return Ok(None);
        };
        gpu.synchronize()?;
        let t = gpu.to_host(buf.view())?;
        Ok(Some(op_times(
            &t,
            self.grid as usize,
            &self.kinds,
            &self.virtual_blocks,
        )))
    }
}

/// [`OpTime`]s from a trace `t` of `[ops, grid, 3]` stamps.
fn op_times(t: &[u64], grid: usize, kinds: &[u32], virtual_blocks: &[u32]) -> Vec<OpTime> {
    let per_op: Vec<&[u64]> = t.chunks_exact(grid * 3).collect();
    let origin = per_op
        .first()
        .and_then(|op| op.chunks_exact(3).map(|b| b[0]).min())
        .unwrap_or(0);
    let us = |ns: u64| ns.saturating_sub(origin) as f64 / 1e3;
    let mut out = Vec::with_capacity(per_op.len());
    for (i, op) in per_op.iter().enumerate() {
        let blocks: Vec<&[u64]> = op.chunks_exact(3).collect();
        let mut work: Vec<f64> = (blocks.iter())
            .map(|b| b[2].saturating_sub(b[1]) as f64 / 1e3)
            .collect();
        work.sort_by(f64::total_cmp);
        out.push(OpTime {
            kind: kinds.get(i).copied().unwrap_or(u32::MAX),
            blocks: virtual_blocks.get(i).copied().unwrap_or(0),
            done: us(blocks.iter().map(|b| b[2]).max().unwrap_or(0)),
            first_ready: us(blocks.iter().map(|b| b[1]).min().unwrap_or(0)),
            work_median: work.get(work.len() / 2).copied().unwrap_or(0.0),
            work_max: work.last().copied().unwrap_or(0.0),
        });
    }
    out
}

impl Kernels {
    fn recording(&self) -> MutexGuard<'_, Option<Recorded>> {
        // A poisoned lock only means a recording closure panicked; the
        // state it guards is still a valid (perhaps partial) recording.
        self.recording.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records `args` for `f` when a recording is active; true when it did
    /// (the launch must then not be made).
    pub(crate) fn record<T: ArgWords + 'static>(
        &self,
        f: &Function,
        cfg: &LaunchConfig,
        args: &T,
    ) -> bool {
        let mut guard = self.recording();
        let Some(rec) = guard.as_mut() else {
            return false;
        };
        let kind = self.persist_kinds.get(f.name()).copied();
        rec.take(kind, f.name(), cfg, args);
        true
    }

    /// Runs `f` with this module's launches recorded, not made (module doc).
    pub fn record_persistent<E>(&self, f: impl FnOnce() -> Result<(), E>) -> Result<Recorded, E> {
        *self.recording() = Some(Recorded::default());
        let r = f();
        let rec = self.recording().take().unwrap_or_default();
        r.map(|()| rec)
    }

    /// The program that runs `rec`, or why none can (a refused recording,
    /// no persistent entry for its format and head size, no room for a
    /// block on a multiprocessor). Uploads, blocking. `trace`: each launch
    /// stamps its ops' timings ([`PersistentProgram::trace`]).
    pub fn persistent_program(
        &self,
        rec: Recorded,
        trace: bool,
    ) -> Result<Result<PersistentProgram, String>, KernelError> {
        if let Some(why) = rec.refused {
            return Ok(Err(why));
        }
        let Some(most) = rec.ops.iter().map(|o| o.blocks).max() else {
            return Ok(Err("no launches were recorded".into()));
        };
        let format = rec.format.unwrap_or(WeightFormat::Bf16);
        let d = rec.head_dim.unwrap_or(HEAD_DIMS[0]);
        let Some(entry) = (self.persistent.iter()).position(|e| e.format == format && e.d == d)
        else {
            return Ok(Err(format!(
                "no persistent kernel for {format:?} weights at head size {d}"
            )));
        };
        let per_sm = self.persistent[entry]
            .func
            .max_active_blocks_per_sm(PERSIST_THREADS as u32, rec.smem)?;
        if per_sm == 0 {
            return Ok(Err(format!(
                "no block fits a multiprocessor with {} bytes of shared memory",
                rec.smem
            )));
        }
        let grid = (per_sm * self.sms).min(most as usize) as u32;
        let words = PersistentOp::WORDS;
        let mut host = vec![0u32; rec.ops.len() * words];
        for (op, out) in rec.ops.iter().zip(host.chunks_exact_mut(words)) {
            op.write_words(out);
        }
        let trace = match trace {
            true => Some(self.gpu.alloc(rec.ops.len() * grid as usize * 3)?),
            false => None,
        };
        Ok(Ok(PersistentProgram {
            entry,
            ops: self.gpu.upload(&host)?,
            counters: self.gpu.alloc(rec.ops.len() + 2)?,
            trace,
            kinds: rec.ops.iter().map(|o| o.kind).collect(),
            virtual_blocks: rec.ops.iter().map(|o| o.blocks).collect(),
            n_ops: rec.ops.len() as u32,
            grid,
            smem: rec.smem,
        }))
    }

    /// Enqueues `p`: one cooperative launch of the persistent kernel.
    pub fn launch_persistent(&self, p: &PersistentProgram) -> Result<(), KernelError> {
        let args = PersistentArgs {
            ops: p.ops.view().ptr(),
            counters: p.counters.view().ptr(),
            n_ops: p.n_ops,
            pad: 0,
            trace: p.trace.as_ref().map_or(0, |t| t.view().ptr()),
        };
        let cfg = LaunchConfig {
            grid: (p.grid, 1, 1),
            block: (PERSIST_THREADS as u32, 1, 1),
            shared_bytes: p.smem,
        };
        let func = &self.persistent[p.entry].func;
        // SAFETY: `args` is the kernel's parameter struct (abi.rs); the ops
        // hold the argument structs of launches the kernels' own launchers
        // checked and built, whose buffers the caller keeps alive (module
        // doc); the counters hold one word an op and two more; the grid is at most the
        // resident blocks, as the cooperative launch requires.
        unsafe { self.gpu.launch_struct_cooperative(func, cfg, &args)? };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consts::PERSIST_THREADS;

    fn cfg(grid: (u32, u32, u32)) -> LaunchConfig {
        LaunchConfig {
            grid,
            block: (PERSIST_THREADS as u32, 1, 1),
            shared_bytes: 4096,
        }
    }

    #[test]
    fn kinds_name_the_gemv_variants_they_run() {
        assert_eq!(gemv::VARIANTS[PERSIST_GEMV_RESID], "resid");
        assert_eq!(gemv::VARIANTS[PERSIST_GEMV_NORM_GATED], "norm_gated");
        assert_eq!(gemv::VARIANTS[PERSIST_GEMV_NORM_ROPE], "norm_rope");
        let names: Vec<String> = op_kinds().into_iter().map(|(n, _)| n).collect();
        assert!(names.contains(&"gemv_norm_rope_m1".to_string()));
        assert!(names.contains(&"gemv8_resid_m1".to_string()));
        assert!(names.contains(&"decode_attention_d64_g4".to_string()));
        assert_eq!(
            entry(WeightFormat::Fp8Row, 128, 4),
            "persistent_gemv8_d128_g4"
        );
    }

    #[test]
    fn a_trace_gives_each_op_its_completion_readiness_and_work() {
        // two ops over a grid of two blocks: [op, block, (start, ready, arrival)] in ns
        #[rustfmt::skip]
        let t = [
            1_000, 1_500, 4_000, 2_000, 2_500, 3_000, // op 0
            4_100, 6_000, 9_000, 3_100, 5_000, 7_000, // op 1
        ];
        let ops = op_times(&t, 2, &[5, 6], &[384, 264]);
        assert_eq!(ops.len(), 2);
        assert_eq!((ops[0].kind, ops[0].blocks), (5, 384));
        assert_eq!(ops[0].done, 3.0); // the last arrival, from the first start
        assert_eq!(ops[0].first_ready, 0.5);
        assert_eq!((ops[0].work_median, ops[0].work_max), (2.5, 2.5));
        assert_eq!((ops[1].done, ops[1].first_ready), (8.0, 4.0));
        assert_eq!((ops[1].work_median, ops[1].work_max), (3.0, 3.0));
    }

    #[test]
    fn a_recording_keeps_ops_in_order_with_their_words() {
        let mut r = Recorded::default();
        let gemv = OpKind::Gemv {
            format: WeightFormat::Bf16,
            kind: PERSIST_GEMV_NORM_ROPE,
        };
        let a = GemvArgs {
            m: 1,
            n: 3072,
            y: 0x1234_5678_9abc,
            ..Default::default()
        };
        r.take(Some(gemv), "gemv_norm_rope_m1", &cfg((384, 1, 1)), &a);
        let d = DecodeArgs {
            n_heads: 32,
            ..Default::default()
        };
        r.take(
            Some(OpKind::Attention { d: 64 }),
            "decode_attention_d64_g4",
            &cfg((4, 1, 8)),
            &d,
        );
        assert_eq!(r.refused, None);
        assert_eq!(r.len(), 2);
        assert_eq!(
            (r.ops[0].kind, r.ops[0].blocks),
            (PERSIST_GEMV_NORM_ROPE as u32, 384)
        );
        assert_eq!(r.ops[0].args[8], 1); // m at byte 32
        assert_eq!((r.ops[0].args[6], r.ops[0].args[7]), (0x5678_9abc, 0x1234)); // y at 24
        assert_eq!(
            (r.ops[1].kind, r.ops[1].blocks),
            (PERSIST_ATTENTION as u32, 32)
        );
        assert_eq!((r.ops[1].grid_x, r.ops[1].grid_y), (4, 1));
        assert_eq!(r.ops[1].args[76 / 4], 32); // n_heads
        assert_eq!(r.smem, 4096);
    }

    #[test]
    fn a_recording_names_the_first_launch_it_cannot_run() {
        let mut r = Recorded::default();
        let lora = GemvArgs {
            lora_slots: 2,
            ..Default::default()
        };
        let gemv = |format| OpKind::Gemv {
            format,
            kind: PERSIST_GEMV_RESID,
        };
        r.take(
            Some(gemv(WeightFormat::Bf16)),
            "gemv_resid_m1",
            &cfg((1, 1, 1)),
            &lora,
        );
        r.take(None, "add_rmsnorm", &cfg((1, 1, 1)), &GemvArgs::default());
        assert_eq!(r.refused.as_deref(), Some("`gemv_resid_m1`: LoRA deltas"));
        let mut r = Recorded::default();
        r.take(None, "add_rmsnorm", &cfg((1, 1, 1)), &GemvArgs::default());
        assert!(
            r.refused
                .unwrap()
                .starts_with("`add_rmsnorm`: not a kernel")
        );
        let mut r = Recorded::default();
        let plain = GemvArgs::default();
        r.take(Some(gemv(WeightFormat::Bf16)), "a", &cfg((1, 1, 1)), &plain);
        r.take(
            Some(gemv(WeightFormat::Fp8Row)),
            "b",
            &cfg((1, 1, 1)),
            &plain,
        );
        assert_eq!(
            r.refused.as_deref(),
            Some("`b`: Fp8Row weights after Bf16 ones")
        );
        let mut r = Recorded::default();
        let wide = LaunchConfig {
            block: (256, 1, 1),
            ..cfg((1, 1, 1))
        };
        r.take(Some(gemv(WeightFormat::Bf16)), "c", &wide, &plain);
        assert_eq!(
            r.refused.as_deref(),
            Some("`c`: blocks of (256, 1, 1) threads")
        );
    }
}
