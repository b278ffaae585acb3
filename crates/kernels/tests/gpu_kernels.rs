//! Kernel tests on the GPU: each kernel against its CPU reference on random
//! non-zero inputs, with the output poisoned (NaN bytes) first, at several
//! sizes including non-powers of two and lengths above 1024. Attention and
//! RoPE are in `gpu_attention.rs`.
//! They need a CUDA device and are `#[ignore]`d: `scripts/gpu/kernels.sh` runs
//! them (the release test binaries with `--ignored`).

mod common;

use common::*;
use gpu::{Blas, GemmDims, Gpu, Graph};
use half::bf16;
use kernels::SampleParams;
use kernels::sampling::{SampleOutputs, SampleScratch, sample_ref};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

#[test]
#[ignore = "needs a CUDA GPU"]
fn embedding_and_row_gather() {
    let (gpu, k) = setup();
    let mut rng = StdRng::seed_from_u64(1);
    for (vocab, hidden, tokens) in [(1000, 576, 7), (3001, 2048, 1500)] {
        let table = rand_bf16(&mut rng, vocab * hidden, 1.0);
        let ids: Vec<u32> = (0..tokens)
            .map(|_| rng.random_range(0..vocab as u32))
            .collect();
        let d_table = gpu.upload(&table).unwrap();
        let d_ids = gpu.upload(&ids).unwrap();
        let out = gpu.alloc::<f32>(tokens * hidden).unwrap();
        gpu.fill_bytes(out.view(), POISON).unwrap();
        // SAFETY: ids drawn below vocab.
        unsafe {
            k.embedding_gather(
                out.view(),
                d_table.view(),
                d_ids.view(),
                tokens,
                hidden,
                vocab,
            )
        }
        .unwrap();
        let got = gpu.to_host(out.view()).unwrap();
        assert_eq!(got, ops::embedding::embed(&table, &ids, hidden));

        let rows: Vec<u32> = (0..tokens.div_ceil(3))
            .map(|_| rng.random_range(0..vocab as u32))
            .collect();
        let d_rows = gpu.upload(&rows).unwrap();
        let g = gpu.alloc::<bf16>(rows.len() * hidden).unwrap();
        gpu.fill_bytes(g.view(), POISON).unwrap();
        // SAFETY: rows drawn below vocab (the source row count).
        unsafe {
            k.gather_rows(
                g.view(),
                d_table.view(),
                d_rows.view(),
                rows.len(),
                hidden,
                vocab,
            )
        }
        .unwrap();
        let rows: Vec<usize> = rows.iter().map(|&r| r as usize).collect();
        assert_eq!(
            gpu.to_host(g.view()).unwrap(),
            ops::embedding::gather_rows(&table, &rows, hidden)
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn add_rmsnorm_matches_reference() {
    let (gpu, k) = setup();
    let mut rng = StdRng::seed_from_u64(2);
    for (tokens, hidden, with_delta) in [(3, 576, false), (1100, 2048, true), (17, 2050, true)] {
        let mut resid: Vec<f32> = (0..tokens * hidden)
            .map(|_| rng.random_range(-2.0..2.0))
            .collect();
        let delta = rand_bf16(&mut rng, tokens * hidden, 1.5);
        let weight = rand_bf16(&mut rng, hidden, 1.0);
        let d_res = gpu.upload(&resid).unwrap();
        let d_delta = gpu.upload(&delta).unwrap();
        let d_w = gpu.upload(&weight).unwrap();
        let out = gpu.alloc::<bf16>(tokens * hidden).unwrap();
        gpu.fill_bytes(out.view(), POISON).unwrap();
        let dv = with_delta.then(|| d_delta.view());
        k.add_rmsnorm(
            d_res.view(),
            dv,
            d_w.view(),
            out.view(),
            tokens,
            hidden,
            1e-5,
        )
        .unwrap();
        if with_delta {
            ops::linear::add_assign(&mut resid, &f32s(&delta));
        }
        let want = ops::norm::rms_norm(&resid, &f32s(&weight), 1e-5);
        let got = f32s(&gpu.to_host(out.view()).unwrap());
        let e = rel_err(&got, &want);
        assert!(e < 5e-3, "rmsnorm T={tokens} H={hidden}: rel err {e}");
        let e = rel_err(&gpu.to_host(d_res.view()).unwrap(), &resid);
        assert!(e < 1e-6, "residual update: rel err {e}");
    }
}

/// `ops::activation::silu_mul` over fused `[gate | up]` rows (`[T, 2 inter]`).
fn silu_mul_ref(gu: &[bf16], inter: usize) -> Vec<f32> {
    let (mut gate, up) = ops::activation::split_gate_up(&f32s(gu), inter);
    ops::activation::silu_mul(&mut gate, &up);
    gate
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn silu_mul_matches_reference() {
    let (gpu, k) = setup();
    let mut rng = StdRng::seed_from_u64(3);
    for (tokens, inter) in [(5, 1536), (1025, 8192), (3, 777)] {
        let gu = rand_bf16(&mut rng, tokens * 2 * inter, 4.0);
        let d_gu = gpu.upload(&gu).unwrap();
        let out = gpu.alloc::<bf16>(tokens * inter).unwrap();
        gpu.fill_bytes(out.view(), POISON).unwrap();
        k.silu_mul(out.view(), d_gu.view(), tokens, inter).unwrap();
        let e = rel_err(
            &f32s(&gpu.to_host(out.view()).unwrap()),
            &silu_mul_ref(&gu, inter),
        );
        assert!(e < 5e-3, "silu T={tokens}: rel err {e}");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn sampling_matches_reference() {
    let (gpu, k) = setup();
    let mut rng = StdRng::seed_from_u64(7);
    let max_lp = 20;
    for vocab in [1000usize, 7, 3001, 128_256] {
        let mut params = Vec::new();
        let mut hist_all = Vec::new();
        let mut hists = Vec::new();
        let kinds = 12;
        for i in 0..kinds {
            let mut p = SampleParams::greedy();
            p.u = rng.random_range(0.0..1.0);
            p.n_logprobs = (i % 4 * 5) as u32;
            match i % 6 {
                0 => {}
                1 => p.temperature = 0.8,
                2 => (p.temperature, p.top_k) = (1.0, 40),
                3 => (p.temperature, p.top_p) = (0.7, 0.9),
                4 => (p.temperature, p.min_p, p.top_k) = (1.3, 0.05, 200),
                _ => (p.temperature, p.repetition_penalty, p.top_p) = (0.0, 1.3, 0.95),
            }
            if i >= 6 {
                p.repetition_penalty = 1.2;
            }
            let mut h: Vec<u32> = (0..vocab as u32).collect();
            h.shuffle(&mut rng);
            h.truncate(rng.random_range(1..300));
            p.hist_off = hist_all.len() as u32;
            p.hist_len = h.len() as u32;
            hist_all.extend_from_slice(&h);
            hists.push(h);
            params.push(p);
        }
        let rows = params.len();
        let logits: Vec<f32> = (0..rows * vocab)
            .map(|_| rng.random_range(-8.0f32..8.0))
            .collect();
        let mut logits = logits;
        if vocab > 3000 {
            // equal maxima in two blocks: the lowest id wins, and lists first
            for r in 0..rows {
                logits[r * vocab + 2999] = 9.5;
                logits[r * vocab + 1500] = 9.5;
            }
        }
        let d_logits = gpu.upload(&logits).unwrap();
        let work = gpu.alloc::<f32>(rows * vocab).unwrap();
        let stats = gpu
            .alloc::<f32>(SampleScratch::stats_len(rows, vocab))
            .unwrap();
        let keys = gpu
            .alloc::<u64>(SampleScratch::keys_len(rows, vocab, max_lp))
            .unwrap();
        gpu.fill_bytes(stats.view(), POISON).unwrap();
        gpu.fill_bytes(keys.view(), POISON).unwrap();
        let scratch = SampleScratch {
            work: work.view(),
            stats: stats.view(),
            keys: keys.view(),
        };
        let d_params = gpu.upload(&params).unwrap();
        let d_hist = gpu.upload(&hist_all).unwrap();
        let (tok, lp) = (
            gpu.alloc::<u32>(rows).unwrap(),
            gpu.alloc::<f32>(rows).unwrap(),
        );
        let (tid, tlp) = (
            gpu.alloc::<u32>(rows * max_lp).unwrap(),
            gpu.alloc::<f32>(rows * max_lp).unwrap(),
        );
        gpu.fill_bytes(tok.view(), POISON).unwrap();
        gpu.fill_bytes(lp.view(), POISON).unwrap();
        let out = SampleOutputs {
            tokens: tok.view(),
            logprobs: lp.view(),
            top_ids: tid.view(),
            top_lps: tlp.view(),
        };
        // SAFETY: history ranges lie inside the uploaded history, ids distinct.
        unsafe {
            k.sample_rows(
                d_logits.view(),
                scratch,
                d_params.view(),
                d_hist.view(),
                out,
                rows,
                vocab,
                max_lp,
            )
        }
        .unwrap();
        let (gt, gl) = (
            gpu.to_host(tok.view()).unwrap(),
            gpu.to_host(lp.view()).unwrap(),
        );
        let (gti, gtl) = (
            gpu.to_host(tid.view()).unwrap(),
            gpu.to_host(tlp.view()).unwrap(),
        );
        for r in 0..rows {
            let (t, l, top) = sample_ref(&logits[r * vocab..][..vocab], &params[r], &hists[r]);
            assert_eq!(gt[r], t, "row {r} ({:?}) token", params[r]);
            assert!((gl[r] - l).abs() < 1e-3, "row {r} logprob {} vs {l}", gl[r]);
            for (j, (id, v)) in top.iter().enumerate() {
                assert_eq!(gti[r * max_lp + j], *id, "row {r} top {j}");
                assert!((gtl[r * max_lp + j] - v).abs() < 1e-3);
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gemm_matches_reference_and_rejects_bad_layouts() {
    let gpu = Gpu::new(0).unwrap();
    let blas = Blas::new(&gpu).unwrap();
    let mut rng = StdRng::seed_from_u64(8);
    for (m, n, kk) in [
        (1, 1000, 576),
        (7, 3072, 2048),
        (300, 577, 64),
        (1100, 256, 1536),
    ] {
        let x = rand_bf16(&mut rng, m * kk, 1.0);
        let w = rand_bf16(&mut rng, n * kk, 1.0);
        let (dx, dw) = (gpu.upload(&x).unwrap(), gpu.upload(&w).unwrap());
        let y = gpu.alloc::<f32>(m * n).unwrap();
        let yb = gpu.alloc::<bf16>(m * n).unwrap();
        gpu.fill_bytes(y.view(), POISON).unwrap();
        gpu.fill_bytes(yb.view(), POISON).unwrap();
        let d = GemmDims { m, n, k: kk };
        blas.matmul_nt(dx.view(), dw.view(), y.view(), d).unwrap();
        blas.matmul_nt(dx.view(), dw.view(), yb.view(), d).unwrap();
        let (xf, wf) = (f32s(&x), f32s(&w));
        let want: Vec<f32> = (0..m * n)
            .map(|i| {
                let (r, c) = (i / n, i % n);
                (0..kk)
                    .map(|j| xf[r * kk + j] as f64 * wf[c * kk + j] as f64)
                    .sum::<f64>() as f32
            })
            .collect();
        let e = rel_err(&gpu.to_host(y.view()).unwrap(), &want);
        assert!(e < 1e-4, "gemm f32 out {m}x{n}x{kk}: {e}");
        let e = rel_err(&f32s(&gpu.to_host(yb.view()).unwrap()), &want);
        assert!(e < 1e-2, "gemm bf16 out: {e}");
        let err = blas
            .matmul_nt(
                dx.view(),
                dw.view(),
                y.view(),
                GemmDims { m: m + 1, n, k: kk },
            )
            .unwrap_err();
        assert!(err.to_string().contains("x [m, k]"), "{err}");
        let err = blas
            .matmul_nt(dx.view(), dw.view(), y.view(), GemmDims { m, n, k: 0 })
            .unwrap_err();
        assert!(err.to_string().contains("dimension k"), "{err}");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn captured_graph_replays_with_new_inputs() {
    let (gpu, k) = setup();
    let mut rng = StdRng::seed_from_u64(9);
    let (tokens, inter) = (4, 1000);
    let gu = gpu.alloc::<bf16>(tokens * 2 * inter).unwrap();
    let out = gpu.alloc::<bf16>(tokens * inter).unwrap();
    gpu.synchronize().unwrap();
    let graph = Graph::capture(&gpu, || {
        k.silu_mul(out.view(), gu.view(), tokens, inter)
            .map_err(|e| gpu::GpuError::Buffer {
                what: "silu_mul capture".into(),
                reason: e.to_string(),
            })
    })
    .unwrap();
    for _ in 0..3 {
        let h = rand_bf16(&mut rng, tokens * 2 * inter, 3.0);
        gpu.copy_to_device(&h, gu.view()).unwrap();
        gpu.fill_bytes(out.view(), POISON).unwrap();
        graph.launch(&gpu).unwrap();
        let e = rel_err(
            &f32s(&gpu.to_host(out.view()).unwrap()),
            &silu_mul_ref(&h, inter),
        );
        assert!(e < 5e-3, "graph replay: {e}");
    }
}

/// Prints sampling times at a 128,256-token vocabulary: one greedy row, one
/// greedy row with 20 log-probabilities, 64 greedy rows. Informational.
#[test]
#[ignore = "needs a CUDA GPU"]
fn sampling_timing() {
    let (gpu, k) = setup();
    let mut rng = StdRng::seed_from_u64(17);
    let (vocab, max_lp) = (128_256usize, 20usize);
    for (rows, n_lp) in [(1usize, 0u32), (1, 20), (64, 0)] {
        let logits: Vec<f32> = (0..rows * vocab)
            .map(|_| rng.random_range(-8.0f32..8.0))
            .collect();
        let mut p = SampleParams::greedy();
        p.n_logprobs = n_lp;
        let d_logits = gpu.upload(&logits).unwrap();
        let d_params = gpu.upload(&vec![p; rows]).unwrap();
        let d_hist = gpu.alloc::<u32>(1).unwrap();
        let work = gpu.alloc::<f32>(rows * vocab).unwrap();
        let stats = gpu
            .alloc::<f32>(SampleScratch::stats_len(rows, vocab))
            .unwrap();
        let keys = gpu
            .alloc::<u64>(SampleScratch::keys_len(rows, vocab, max_lp))
            .unwrap();
        let (tok, lp) = (
            gpu.alloc::<u32>(rows).unwrap(),
            gpu.alloc::<f32>(rows).unwrap(),
        );
        let (tid, tlp) = (
            gpu.alloc::<u32>(rows * max_lp).unwrap(),
            gpu.alloc::<f32>(rows * max_lp).unwrap(),
        );
        let run = || {
            let scratch = SampleScratch {
                work: work.view(),
                stats: stats.view(),
                keys: keys.view(),
            };
            let out = SampleOutputs {
                tokens: tok.view(),
                logprobs: lp.view(),
                top_ids: tid.view(),
                top_lps: tlp.view(),
            };
            // SAFETY: empty histories.
            unsafe {
                k.sample_rows(
                    d_logits.view(),
                    scratch,
                    d_params.view(),
                    d_hist.view(),
                    out,
                    rows,
                    vocab,
                    max_lp,
                )
            }
            .unwrap()
        };
        // time a captured graph of `per` calls, as a decode step replays them
        let per = 20;
        let graph = gpu::Graph::capture(&gpu, || {
            for _ in 0..per {
                run();
            }
            Ok(())
        })
        .unwrap();
        graph.launch(&gpu).unwrap();
        let reps = 10;
        let t = gpu.timer().unwrap();
        t.start().unwrap();
        for _ in 0..reps {
            graph.launch(&gpu).unwrap();
        }
        let us = t.stop_ms().unwrap() as f64 * 1000.0 / (reps * per) as f64;
        println!("sampling rows={rows} logprobs={n_lp}: {us:.1} us/call");
    }
}

/// Every GEMV variant against `gemv_ref`: odd output counts, inputs an odd
/// multiple of 8, 1 to 16 rows, a Llama-1B-sized projection; outputs poisoned.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gemv_matches_reference() {
    use kernels::gemv::{GemvKind, GemvOp, gemv_ref};
    let (gpu, k) = setup();
    let mut rng = StdRng::seed_from_u64(18);
    let kinds = [
        GemvKind::Bf16,
        GemvKind::Resid,
        GemvKind::Norm,
        GemvKind::NormSilu,
        GemvKind::F32,
    ];
    for (n, kk) in [(37usize, 264usize), (1001, 8), (3072, 2048)] {
        for m in [1usize, 3, 16, 5] {
            for kind in kinds {
                let wrows = if kind == GemvKind::NormSilu { 2 * n } else { n };
                let w = rand_bf16(&mut rng, wrows * kk, 0.5);
                let norm_w = rand_bf16(&mut rng, kk, 1.0);
                let xb = rand_bf16(&mut rng, m * kk, 1.0);
                let xf: Vec<f32> = (0..m * kk)
                    .map(|_| rng.random_range(-3.0f32..3.0))
                    .collect();
                let resid: Vec<f32> = (0..m * n).map(|_| rng.random_range(-2.0f32..2.0)).collect();
                let norm_in = matches!(kind, GemvKind::Norm | GemvKind::NormSilu);
                let x_ref = if norm_in { xf.clone() } else { f32s(&xb) };
                let mut want = if kind == GemvKind::Resid {
                    resid.clone()
                } else {
                    vec![0f32; m * n]
                };
                gemv_ref(
                    kind,
                    &x_ref,
                    &f32s(&norm_w),
                    1e-5,
                    &f32s(&w),
                    &mut want,
                    m,
                    n,
                    kk,
                );
                let (d_w, d_g) = (gpu.upload(&w).unwrap(), gpu.upload(&norm_w).unwrap());
                let (d_xb, d_xf) = (gpu.upload(&xb).unwrap(), gpu.upload(&xf).unwrap());
                let d_res = gpu.upload(&resid).unwrap();
                let yb = gpu.alloc::<bf16>(m * n).unwrap();
                let yf = gpu.alloc::<f32>(m * n).unwrap();
                gpu.fill_bytes(yb.view(), POISON).unwrap();
                gpu.fill_bytes(yf.view(), POISON).unwrap();
                let op = match kind {
                    GemvKind::Bf16 => GemvOp::Bf16 {
                        x: d_xb.view(),
                        y: yb.view(),
                    },
                    GemvKind::Resid => GemvOp::Resid {
                        x: d_xb.view(),
                        residual: d_res.view(),
                    },
                    GemvKind::Norm => GemvOp::Norm {
                        residual: d_xf.view(),
                        norm_w: d_g.view(),
                        eps: 1e-5,
                        y: yb.view(),
                    },
                    GemvKind::NormSilu => GemvOp::NormSilu {
                        residual: d_xf.view(),
                        norm_w: d_g.view(),
                        eps: 1e-5,
                        y: yb.view(),
                    },
                    GemvKind::F32 => GemvOp::F32 {
                        x: d_xb.view(),
                        y: yf.view(),
                    },
                };
                k.gemv(op, d_w.view(), m, n, kk).unwrap();
                let got = match kind {
                    GemvKind::Resid => gpu.to_host(d_res.view()).unwrap(),
                    GemvKind::F32 => gpu.to_host(yf.view()).unwrap(),
                    _ => f32s(&gpu.to_host(yb.view()).unwrap()),
                };
                let e = rel_err(&got, &want);
                assert!(e < 1e-2, "gemv {kind:?} m={m} n={n} k={kk}: rel err {e}");
            }
        }
    }
    // shapes the kernels refuse: k not a multiple of 8, too many rows
    let (x, w, y) = (
        gpu.alloc::<bf16>(17 * 12).unwrap(),
        gpu.alloc::<bf16>(12 * 4).unwrap(),
        gpu.alloc::<bf16>(17 * 4).unwrap(),
    );
    let op = GemvOp::Bf16 {
        x: x.view(),
        y: y.view(),
    };
    assert!(k.gemv(op, w.view(), 1, 4, 12).is_err());
    assert!(k.gemv(op, w.view(), 17, 4, 8).is_err());
}

/// Prints GEMV times and bandwidth for Llama-3.2-1B's decode projections at
/// 1 and 16 rows (graph-captured). Informational.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gemv_timing() {
    use kernels::gemv::GemvOp;
    let (gpu, k) = setup();
    let mut rng = StdRng::seed_from_u64(19);
    let (h, inter, qkv, vocab) = (2048usize, 8192usize, 3072usize, 128_256usize);
    let x = gpu.upload(&rand_bf16(&mut rng, 16 * inter, 1.0)).unwrap();
    let xf = gpu.upload(&vec![0.5f32; 16 * h]).unwrap();
    let g = gpu.upload(&rand_bf16(&mut rng, h, 1.0)).unwrap();
    let yb = gpu.alloc::<bf16>(16 * 2 * inter).unwrap();
    let yf = gpu.alloc::<f32>(16 * vocab).unwrap();
    let resid = gpu.alloc::<f32>(16 * h).unwrap();
    for (name, n, kk, wrows) in [
        ("qkv (norm)", qkv, h, qkv),
        ("o (resid)", h, h, h),
        ("gate/up (norm+silu)", inter, h, 2 * inter),
        ("down (resid)", h, inter, h),
        ("lm head (f32)", vocab, h, vocab),
    ] {
        let w = gpu.alloc::<bf16>(wrows * kk).unwrap();
        for m in [1usize, 2, 4, 8, 16] {
            let op = match name {
                "qkv (norm)" => GemvOp::Norm {
                    residual: xf.view(),
                    norm_w: g.view(),
                    eps: 1e-5,
                    y: yb.view(),
                },
                "gate/up (norm+silu)" => GemvOp::NormSilu {
                    residual: xf.view(),
                    norm_w: g.view(),
                    eps: 1e-5,
                    y: yb.view(),
                },
                "lm head (f32)" => GemvOp::F32 {
                    x: x.view(),
                    y: yf.view(),
                },
                _ => GemvOp::Resid {
                    x: x.view(),
                    residual: resid.view(),
                },
            };
            let run = || k.gemv(op, w.view(), m, n, kk).unwrap();
            run();
            let per = 20;
            let graph = gpu::Graph::capture(&gpu, || {
                for _ in 0..per {
                    run();
                }
                Ok(())
            })
            .unwrap();
            graph.launch(&gpu).unwrap();
            let reps = 10;
            let t = gpu.timer().unwrap();
            t.start().unwrap();
            for _ in 0..reps {
                graph.launch(&gpu).unwrap();
            }
            let us = t.stop_ms().unwrap() as f64 * 1000.0 / (reps * per) as f64;
            let gbs = (wrows * kk * 2) as f64 / us / 1e3;
            println!("gemv {name} m={m}: {us:.1} us, {gbs:.0} GB/s of weights");
        }
    }
}

/// The RoPE + KV-write reference on `ops`: returns the rotated q rows
/// `[T, heads * D]`; rotated k and raw v land in their cache slots.
fn rope_kv_want(
    qkv: &[bf16],
    positions: &[u32],
    slots: &[u32],
    rope: &ops::Rope,
    shape: kernels::HeadShape,
    k_cache: &mut [f32],
    v_cache: &mut [f32],
) -> Vec<f32> {
    let (w, qw, kvw) = (
        shape.qkv_width(),
        shape.num_heads * shape.head_dim,
        shape.kv_width(),
    );
    let mut q = Vec::with_capacity(positions.len() * qw);
    let (mut k_new, mut v_new) = (Vec::new(), Vec::new());
    for (t, &pos) in positions.iter().enumerate() {
        let mut row = f32s(&qkv[t * w..(t + 1) * w]);
        rope.apply(&mut row[..qw + kvw], pos as usize);
        q.extend_from_slice(&row[..qw]);
        k_new.extend_from_slice(&row[qw..qw + kvw]);
        v_new.extend_from_slice(&row[qw + kvw..]);
    }
    ops::kv_write(k_cache, v_cache, &k_new, &v_new, slots, kvw);
    q
}

/// `gemv_qkv_rope` against `gemv_ref` (Norm) followed by the RoPE + KV-write reference:
/// q rotated in qkv, k/v in scrambled cache slots, GQA shapes, 1 to 16 rows.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gemv_qkv_rope_matches_reference() {
    use kernels::gemv::{GemvKind, RopeKv, gemv_ref};
    let (gpu, k) = setup();
    let mut rng = StdRng::seed_from_u64(20);
    let max_pos = 512;
    for shape in SHAPES {
        let (hidden, n, d) = (200usize, shape.qkv_width(), shape.head_dim);
        let table = common::rope(max_pos, d);
        let (cos, sin) = (table.cos().to_vec(), table.sin().to_vec());
        for m in [1usize, 3, 16] {
            let w = rand_bf16(&mut rng, n * hidden, 0.5);
            let g = rand_bf16(&mut rng, hidden, 1.0);
            let x: Vec<f32> = (0..m * hidden)
                .map(|_| rng.random_range(-3.0f32..3.0))
                .collect();
            let positions: Vec<u32> = (0..m)
                .map(|_| rng.random_range(0..max_pos as u32))
                .collect();
            let num_slots = m + 7;
            let mut slots: Vec<u32> = (0..num_slots as u32).collect();
            slots.shuffle(&mut rng);
            slots.truncate(m);
            let mut qkv_want = vec![0f32; m * n];
            gemv_ref(
                GemvKind::Norm,
                &x,
                &f32s(&g),
                1e-5,
                &f32s(&w),
                &mut qkv_want,
                m,
                n,
                hidden,
            );
            let qkv_b: Vec<bf16> = qkv_want.iter().map(|&v| bf16::from_f32(v)).collect();
            let mut kr = vec![0f32; num_slots * shape.kv_width()];
            let mut vr = kr.clone();
            let q_want = rope_kv_want(&qkv_b, &positions, &slots, &table, shape, &mut kr, &mut vr);
            let (d_w, d_g, d_x) = (
                gpu.upload(&w).unwrap(),
                gpu.upload(&g).unwrap(),
                gpu.upload(&x).unwrap(),
            );
            let (d_pos, d_slots) = (gpu.upload(&positions).unwrap(), gpu.upload(&slots).unwrap());
            let (d_cos, d_sin) = (gpu.upload(&cos).unwrap(), gpu.upload(&sin).unwrap());
            let kc = gpu.alloc::<bf16>(num_slots * shape.kv_width()).unwrap();
            let vc = gpu.alloc::<bf16>(num_slots * shape.kv_width()).unwrap();
            let qkv = gpu.alloc::<bf16>(m * n).unwrap();
            for b in [&kc, &vc, &qkv] {
                gpu.fill_bytes(b.view(), POISON).unwrap();
            }
            let rope = RopeKv {
                positions: d_pos.view(),
                slots: d_slots.view(),
                cos: d_cos.view(),
                sin: d_sin.view(),
                k_cache: kc.view(),
                v_cache: vc.view(),
                shape,
                max_pos,
            };
            // SAFETY: slots below num_slots, positions below max_pos.
            unsafe {
                k.gemv_qkv_rope(
                    d_x.view(),
                    d_g.view(),
                    1e-5,
                    d_w.view(),
                    qkv.view(),
                    rope,
                    m,
                    hidden,
                )
            }
            .unwrap();
            let got = f32s(&gpu.to_host(qkv.view()).unwrap());
            let qw = shape.num_heads * d;
            let q_got: Vec<f32> = (0..m).flat_map(|t| got[t * n..][..qw].to_vec()).collect();
            let e = rel_err(&q_got, &q_want);
            assert!(e < 1e-2, "{shape:?} m={m}: q rel err {e}");
            let kvw = shape.kv_width();
            let pick = |c: &[f32]| -> Vec<f32> {
                slots
                    .iter()
                    .flat_map(|&s| c[s as usize * kvw..][..kvw].to_vec())
                    .collect()
            };
            let (kg, vg) = (
                f32s(&gpu.to_host(kc.view()).unwrap()),
                f32s(&gpu.to_host(vc.view()).unwrap()),
            );
            let e = rel_err(&pick(&kg), &pick(&kr));
            assert!(e < 1e-2, "{shape:?} m={m}: k rel err {e}");
            let e = rel_err(&pick(&vg), &pick(&vr));
            assert!(e < 1e-2, "{shape:?} m={m}: v rel err {e}");
        }
    }
}
