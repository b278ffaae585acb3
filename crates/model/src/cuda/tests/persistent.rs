//! The persistent decode kernel against the per-kernel path it replaces: it
//! runs the same bodies over the same blocks with the same reductions, so
//! every greedy token and its log-probability must come out bit for bit the
//! same, at a short context (one key split) and a long one (split keys and
//! their merge), in bf16 and FP8 weights.

use super::*;

/// Greedy tokens after `prompt` and their log-probabilities' bits, one
/// decode step at a time through `step` (graphs on).
fn decode_bits(b: &mut dyn Backend, prompt: &[u32], blocks: &[u32], n: usize) -> Vec<(u32, u32)> {
    (generate_sampled(b, prompt, blocks, n).into_iter())
        .map(|t| (t.token, t.logprob.to_bits()))
        .collect()
}

fn same_bits_as_per_kernel(preset: Preset, fp8: bool) {
    let (cfg, mut w) = load(&synth_dir(preset));
    if fp8 {
        w.quantize_fp8();
    }
    let kv = KvShape {
        num_blocks: 256,
        block_size: BS,
    };
    let on = persistent_on();
    let mut layered = CudaBackend::new(cfg.clone(), &w, kv, 0, CudaOptions::default()).unwrap();
    let mut persistent = CudaBackend::new(cfg.clone(), &w, kv, 0, on).unwrap();
    drop(w);
    let mut pool = Pool::new(kv.num_blocks);
    for (len, n) in [(20usize, 24usize), (700, 24)] {
        let prompt = tokens(len as u64, len, cfg.vocab_size);
        let blocks = pool.take(len + n);
        let want = decode_bits(&mut layered, &prompt, &blocks, n);
        let got = decode_bits(&mut persistent, &prompt, &blocks, n);
        assert!(
            persistent.num_persistent_graphs() >= 1,
            "{}: no decode graph ran the persistent kernel",
            preset.name()
        );
        assert_eq!(layered.num_persistent_graphs(), 0);
        assert_eq!(
            got,
            want,
            "{} (fp8 {fp8}), prompt {len}: persistent and per-kernel decode differ",
            preset.name()
        );
        pool.free.extend(blocks);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_persistent_decode_gives_the_per_kernel_bits() {
    // head size 64 with groups of 3 and 4 query heads a KV head
    same_bits_as_per_kernel(Preset::Smollm2_135m, false);
    same_bits_as_per_kernel(Preset::Llama3_2_1b, false);
    same_bits_as_per_kernel(Preset::Smollm2_135m, true);
    // head size 256, a sliding window the 700-token prompt passes, Gemma's
    // norms and GELU in the GEMV epilogues
    same_bits_as_per_kernel(Preset::Gemma3_270m, false);
}

/// A short persistent run (smollm2-135m, 4 decode steps): what the
/// compute-sanitizer runs check.
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_persistent_decode_short() {
    let (cfg, w) = load(&synth_dir(Preset::Smollm2_135m));
    let kv = KvShape {
        num_blocks: 16,
        block_size: BS,
    };
    let on = persistent_on();
    let mut gpu = CudaBackend::new(cfg.clone(), &w, kv, 0, on).unwrap();
    let mut pool = Pool::new(kv.num_blocks);
    let prompt = tokens(5, 20, cfg.vocab_size);
    let out = decode_bits(&mut gpu, &prompt, &pool.take(20 + 4), 4);
    assert_eq!(gpu.num_persistent_graphs(), 1);
    assert!(
        out.iter().all(|&(t, _)| (t as usize) < cfg.vocab_size),
        "{out:?}"
    );
}

/// The backend options that run batch-1 decode on the persistent kernel.
fn persistent_on() -> CudaOptions {
    CudaOptions {
        persistent_decode: true,
        ..CudaOptions::default()
    }
}

/// The number in environment variable `name`, else `default`.
fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The persistent kernel's op timings on the Llama-3.2-1B shape (bf16, a
/// 128-token prompt, the trace of the last of 32 decode steps), printed as
/// a table per op and per kind against each op's weight bytes at the copy
/// bandwidth `LAMINA_COPY_GBS` (default 3,000 GB/s), decode attention's
/// splits at least `LAMINA_DECODE_MIN_CHUNK` keys (default: the head size's): the profile of the
/// kernel (docs/performance.md). Checks that every op of the program was
/// stamped.
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_persistent_trace_of_the_1b() {
    let (cfg, w) = load(&synth_dir(Preset::Llama3_2_1b));
    let kv = KvShape {
        num_blocks: 64,
        block_size: BS,
    };
    let on = CudaOptions {
        persistent_trace: true,
        decode_min_chunk: std::env::var("LAMINA_DECODE_MIN_CHUNK")
            .ok()
            .and_then(|v| v.parse().ok()),
        ..persistent_on()
    };
    let mut gpu = CudaBackend::new(cfg.clone(), &w, kv, 0, on).unwrap();
    let mut pool = Pool::new(kv.num_blocks);
    let prompt = tokens(9, 128, cfg.vocab_size);
    generate_sampled(&mut gpu, &prompt, &pool.take(128 + 32), 32);
    let ops = gpu
        .persistent_trace()
        .unwrap()
        .expect("a traced persistent graph");
    assert_eq!(ops.len(), 5 * cfg.num_layers, "ops of the program");
    for (n, op) in ops.iter().enumerate() {
        assert!(
            op.done.is_finite() && op.done > 0.0,
            "op {n} not stamped: {op:?}"
        );
    }
    print_trace(&cfg, &ops, env("LAMINA_COPY_GBS", 3000.0));
}

/// An op kind's name in the trace table.
fn kind_name(kind: u32) -> &'static str {
    use kernels::consts::{
        PERSIST_ATTENTION, PERSIST_GEMV_NORM_GATED, PERSIST_GEMV_NORM_ROPE, PERSIST_GEMV_RESID,
    };
    match kind as usize {
        PERSIST_GEMV_NORM_ROPE => "norm+QKV+RoPE",
        PERSIST_GEMV_NORM_GATED => "norm+gate/up",
        PERSIST_GEMV_RESID => "O / down",
        PERSIST_ATTENTION => "attention",
        _ => "?",
    }
}

/// The weight bytes of an op of `kind` (`next`: the kind after it, which
/// tells O from down) in a bf16 model shaped `cfg`.
fn op_bytes(cfg: &ModelConfig, kind: u32, next: Option<u32>) -> f64 {
    use kernels::consts::{PERSIST_GEMV_NORM_GATED, PERSIST_GEMV_NORM_ROPE, PERSIST_GEMV_RESID};
    let (h, i) = (cfg.hidden_size as f64, cfg.intermediate_size as f64);
    let kvw = (cfg.num_kv_heads * cfg.head_dim) as f64;
    2.0 * match kind as usize {
        PERSIST_GEMV_NORM_ROPE => h * (h + 2.0 * kvw),
        PERSIST_GEMV_NORM_GATED => 2.0 * h * i,
        PERSIST_GEMV_RESID if next == Some(PERSIST_GEMV_NORM_GATED as u32) => h * h,
        PERSIST_GEMV_RESID => i * h,
        _ => 0.0,
    }
}

/// The trace as a table per op, then sums per kind, floors at `gbs` GB/s.
fn print_trace(cfg: &ModelConfig, ops: &[kernels::persistent::OpTime], gbs: f64) {
    eprintln!(
        "op  kind            vblocks  done_us  span_us  floor_us  ready_lag_us  work_med  work_max"
    );
    let mut per_kind: std::collections::BTreeMap<&str, (f64, f64, usize)> = Default::default();
    let mut prev_done = 0.0;
    for (n, op) in ops.iter().enumerate() {
        let next = ops.get(n + 1).map(|o| o.kind);
        let floor = op_bytes(cfg, op.kind, next) / (gbs * 1e3);
        let (span, lag) = (op.done - prev_done, op.first_ready - prev_done);
        eprintln!(
            "{n:3} {:15} {:7} {:8.1} {span:8.2} {floor:9.2} {lag:13.2} {:9.2} {:9.2}",
            kind_name(op.kind),
            op.blocks,
            op.done,
            op.work_median,
            op.work_max
        );
        let e = per_kind.entry(kind_name(op.kind)).or_default();
        (e.0, e.1, e.2) = (e.0 + span, e.1 + floor, e.2 + 1);
        prev_done = op.done;
    }
    for (kind, (span, floor, n)) in &per_kind {
        eprintln!(
            "kind {kind:15} ops {n:3} span {span:8.1} us  floor {floor:8.1} us  ({:.0}% of floor speed)",
            100.0 * floor / span.max(1e-9)
        );
    }
    eprintln!("layers: {prev_done:.1} us a step");
}
