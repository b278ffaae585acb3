//! Kernel tests on the GPU: each kernel against its CPU reference on random
//! non-zero inputs, with the output poisoned (NaN bytes) first, at several
//! sizes including non-powers of two and lengths above 1024. Attention and
//! RoPE are in `gpu_attention.rs`.
//! They need a CUDA device and are `#[ignore]`d: `scripts/gpu/kernels.sh` runs
//! them (the release test binaries with `--ignored`).

mod common;
mod gemv;
mod invariant_gemm;
mod layer_extras;
mod lora;
mod qgemm;

use common::*;
use gpu::{Blas, GemmDims, Gpu, Graph};
use half::bf16;
use kernels::sampling::{SampleOutputs, SampleScratch};
use kernels::{Kernels, SampleParams};
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
                None,
                tokens,
                hidden,
                vocab,
                1.0,
            )
        }
        .unwrap();
        let got = gpu.to_host(out.view()).unwrap();
        assert_eq!(got, ops::embedding::embed(&table, &ids, hidden));

        // carried tokens: every third id comes from `prev` (a previous
        // step's samples), the rest from `ids` (rows >= prev.len() included)
        let prev: Vec<u32> = (0..5).map(|_| rng.random_range(0..vocab as u32)).collect();
        let rows: Vec<u32> = (0..tokens as u32)
            .map(|t| match t % 3 {
                0 => t % 5,
                1 => u32::MAX,
                _ => 5 + t,
            })
            .collect();
        let want_ids: Vec<u32> = (0..tokens)
            .map(|t| match rows[t] {
                r if r < 5 => prev[r as usize],
                _ => ids[t],
            })
            .collect();
        let (d_prev, d_rows) = (gpu.upload(&prev).unwrap(), gpu.upload(&rows).unwrap());
        let scale = (hidden as f32).sqrt();
        gpu.fill_bytes(out.view(), POISON).unwrap();
        let carry = kernels::embedding::Carry {
            rows: d_rows.view(),
            prev: d_prev.view(),
        };
        // SAFETY: ids and prev drawn below vocab.
        unsafe {
            k.embedding_gather(
                out.view(),
                d_table.view(),
                d_ids.view(),
                Some(carry),
                tokens,
                hidden,
                vocab,
                scale,
            )
        }
        .unwrap();
        let got = gpu.to_host(out.view()).unwrap();
        // scaled as the CPU scales an embedding row (Gemma's sqrt(hidden))
        let mut want = ops::embedding::embed(&table, &want_ids, hidden);
        want.iter_mut().for_each(|v| *v *= scale);
        assert_eq!(got, want);

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
    // the gain is offset + weight: 1 for Gemma's (1 + w) norms
    for (tokens, hidden, with_delta, offset) in [
        (3, 576, false, 0.0),
        (1100, 2048, true, 0.0),
        (17, 2050, true, 1.0),
    ] {
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
            offset,
        )
        .unwrap();
        if with_delta {
            ops::linear::add_assign(&mut resid, &f32s(&delta));
        }
        let gain: Vec<f32> = f32s(&weight).iter().map(|w| offset + w).collect();
        let want = ops::norm::rms_norm(&resid, &gain, 1e-5);
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
    // a view one element in: not 16-byte aligned, the element-wise path
    let (tokens, inter) = (7, 1024);
    let gu = rand_bf16(&mut rng, tokens * 2 * inter + 1, 4.0);
    let d_gu = gpu.upload(&gu).unwrap();
    let out = gpu.alloc::<bf16>(tokens * inter + 1).unwrap();
    let (src, dst) = (
        d_gu.view().sub(1, tokens * 2 * inter).unwrap(),
        out.view().sub(1, tokens * inter).unwrap(),
    );
    k.silu_mul(dst, src, tokens, inter).unwrap();
    let got = f32s(&gpu.to_host(out.view()).unwrap()[1..]);
    let e = rel_err(&got, &silu_mul_ref(&gu[1..], inter));
    assert!(e < 5e-3, "silu unaligned: rel err {e}");
}

/// `ops::sampling::sample_row` (the CPU backend's sampler) on one row as
/// the kernel reads it: `(token, logprob, top logprobs)`. `history` holds
/// distinct ids, `adds` the row's additive `(id, delta)` terms.
fn sample_ref(
    logits: &[f32],
    p: &SampleParams,
    history: &[u32],
    adds: &[(u32, f32)],
) -> (u32, f32, Vec<(u32, f32)>) {
    let row = ops::sampling::RowSampling {
        temperature: p.temperature,
        top_k: p.top_k as usize,
        top_p: p.top_p,
        min_p: p.min_p,
        repetition_penalty: p.repetition_penalty,
        history,
        adds,
        allowed: None,
        u: p.u,
        logprobs: p.n_logprobs as usize,
    };
    let s = ops::sampling::sample_row(logits, &row);
    (s.token, s.logprob, s.top_logprobs)
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
        let mut adds_all = Vec::new();
        // rows 12..18 add presence / frequency / logit_bias terms
        let kinds = 18;
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
            let mut adds: Vec<(u32, f32)> = Vec::new();
            if i >= 12 {
                let mut ids: Vec<u32> = (0..vocab as u32).collect();
                ids.shuffle(&mut rng);
                ids.truncate(rng.random_range(1..200usize).min(vocab));
                for (j, id) in ids.into_iter().enumerate() {
                    let d = match j {
                        0 => -100.0,
                        1 if i == 17 => 100.0,
                        _ => rng.random_range(-3.0f32..3.0),
                    };
                    adds.push((id, d));
                }
                p.add_off = hist_all.len() as u32;
                p.add_len = adds.len() as u32;
                for &(id, d) in &adds {
                    hist_all.extend_from_slice(&[id, d.to_bits()]);
                }
            }
            adds_all.push(adds);
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
            let (t, l, top) = sample_ref(
                &logits[r * vocab..][..vocab],
                &params[r],
                &hists[r],
                &adds_all[r],
            );
            assert_eq!(gt[r], t, "row {r} ({:?}) token", params[r]);
            assert!((gl[r] - l).abs() < 1e-3, "row {r} logprob {} vs {l}", gl[r]);
            for (j, (id, v)) in top.iter().enumerate() {
                assert_eq!(gti[r * max_lp + j], *id, "row {r} top {j}");
                assert!((gtl[r * max_lp + j] - v).abs() < 1e-3);
            }
        }
    }
}

/// Runs the GPU sampler (no history, no top logprobs) on `rows` rows of
/// `logits`; returns the tokens and log-probabilities.
fn sample_on_gpu(
    gpu: &Gpu,
    k: &Kernels,
    logits: &[f32],
    params: &[SampleParams],
    vocab: usize,
) -> (Vec<u32>, Vec<f32>) {
    let (rows, max_lp) = (params.len(), 1usize);
    let d_logits = gpu.upload(logits).unwrap();
    let work = gpu.alloc::<f32>(rows * vocab).unwrap();
    let stats = gpu
        .alloc::<f32>(SampleScratch::stats_len(rows, vocab))
        .unwrap();
    let keys = gpu
        .alloc::<u64>(SampleScratch::keys_len(rows, vocab, max_lp))
        .unwrap();
    let scratch = SampleScratch {
        work: work.view(),
        stats: stats.view(),
        keys: keys.view(),
    };
    let d_params = gpu.upload(params).unwrap();
    let d_hist = gpu.upload(&[0u32]).unwrap();
    let (tok, lp) = (
        gpu.alloc::<u32>(rows).unwrap(),
        gpu.alloc::<f32>(rows).unwrap(),
    );
    let (tid, tlp) = (
        gpu.alloc::<u32>(rows * max_lp).unwrap(),
        gpu.alloc::<f32>(rows * max_lp).unwrap(),
    );
    let out = SampleOutputs {
        tokens: tok.view(),
        logprobs: lp.view(),
        top_ids: tid.view(),
        top_lps: tlp.view(),
    };
    // SAFETY: no history (every hist_len is 0).
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
    (
        gpu.to_host(tok.view()).unwrap(),
        gpu.to_host(lp.view()).unwrap(),
    )
}

/// Degenerate logits (a NaN, an infinity, a NaN row, every logit equal)
/// give a NaN log-probability for the sampled token, greedy or sampled: the
/// flag the engine ends such a request on. Clean rows beside them, one
/// flat but for a single logit, stay finite, as the CPU reference says.
#[test]
#[ignore = "needs a CUDA GPU"]
fn sampling_flags_degenerate_logits_with_a_nan_logprob() {
    let (gpu, k) = setup();
    let mut rng = StdRng::seed_from_u64(9);
    let vocab = 3001usize;
    let mut logits: Vec<f32> = (0..8 * vocab)
        .map(|_| rng.random_range(-8.0f32..8.0))
        .collect();
    logits[17] = f32::NAN; // row 0: one NaN, greedy
    logits[vocab + 2000] = f32::NAN; // row 1: one NaN, sampled
    logits[2 * vocab + 5] = f32::INFINITY; // row 2: +inf, greedy
    logits[3 * vocab..4 * vocab].fill(f32::NAN); // row 3: all NaN
    logits[4 * vocab..5 * vocab].fill(0.0); // row 4: all equal, greedy
    logits[5 * vocab..6 * vocab].fill(3.25); // row 5: all equal, sampled
    logits[6 * vocab..7 * vocab].fill(1.0); // row 6: flat but one: clean
    logits[6 * vocab + 2500] = 1.0 + 1e-3;
    let mut params = vec![SampleParams::greedy(); 8]; // row 7: clean
    (params[1].temperature, params[1].top_p, params[1].u) = (1.0, 0.9, 0.5);
    (params[5].temperature, params[5].u) = (0.7, 0.25);
    let (gt, gl) = sample_on_gpu(&gpu, &k, &logits, &params, vocab);
    for r in 0..8 {
        let row = &logits[r * vocab..][..vocab];
        assert_eq!(
            contract::sampling::is_degenerate(row),
            r < 6,
            "row {r}: the CPU rule disagrees with the test's intent"
        );
    }
    for r in 0..6 {
        assert!(
            gl[r].is_nan(),
            "row {r}: logprob {} (token {})",
            gl[r],
            gt[r]
        );
        assert!(
            (gt[r] as usize) < vocab,
            "row {r}: token {} outside the vocabulary",
            gt[r]
        );
    }
    for (r, lp) in gl.iter().enumerate().skip(6).take(2) {
        assert!(lp.is_finite(), "clean row {r}: logprob {lp}");
    }
    assert_eq!(gt[6], 2500, "the one higher logit of a nearly flat row");
}

/// Candidates rank by logit, so `top_k = 1` (or a tiny `top_p`) is greedy at
/// any temperature, even where every probability ties in f32 (T = 1e8; the
/// API refuses T > 100).
#[test]
#[ignore = "needs a CUDA GPU"]
fn sampling_top_k_one_is_greedy_at_any_temperature() {
    let (gpu, k) = setup();
    let mut rng = StdRng::seed_from_u64(10);
    let vocab = 128_256usize;
    let cases: [(f32, u32, f32); 5] = [
        (0.7, 1, 1.0),
        (100.0, 1, 1.0),
        (1e8, 1, 1.0),
        (1e10, 1, 1.0),
        (1e8, 0, 1e-7),
    ];
    let logits: Vec<f32> = (0..cases.len() * vocab)
        .map(|_| rng.random_range(-4.0f32..4.0))
        .collect();
    let params: Vec<SampleParams> = cases
        .iter()
        .enumerate()
        .map(|(i, &(t, top_k, top_p))| {
            let mut p = SampleParams::greedy();
            (p.temperature, p.top_k, p.top_p, p.u) = (t, top_k, top_p, 0.37 + 0.1 * i as f32);
            p
        })
        .collect();
    let (gt, _) = sample_on_gpu(&gpu, &k, &logits, &params, vocab);
    for (r, case) in cases.iter().enumerate() {
        let row = &logits[r * vocab..][..vocab];
        let best = (0..vocab).fold(0, |b, i| if row[i] > row[b] { i } else { b });
        assert_eq!(gt[r] as usize, best, "(T, top_k, top_p) = {case:?}");
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
