//! GPU tests of the GEMV projections (`kernels::gemv`) against `gemv_ref`
//! (composed of `ops`' norm and SiLU·up) and of the fused QKV + RoPE + KV
//! write against `ops`' RoPE and KV write; part of the `gpu_kernels` binary.

use crate::common::*;
use half::bf16;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// `w` (`[rows, k]`) on the device as bf16 and as FP8 (one scale per row),
/// and the values the kernels multiply by in the chosen format (FP8: the
/// dequantised ones).
pub(crate) struct DevWeights {
    w: gpu::DeviceBuffer<bf16>,
    q: gpu::DeviceBuffer<u8>,
    scale: gpu::DeviceBuffer<f32>,
    fp8: bool,
    pub(crate) values: Vec<f32>,
}

impl DevWeights {
    pub(crate) fn new(gpu: &gpu::Gpu, w: &[bf16], rows: usize, k: usize, fp8: bool) -> Self {
        let (q, scale) = ops::fp8::quantize_rows(&f32s(w), rows, k);
        let values = if fp8 {
            ops::fp8::dequantize_rows(&q, &scale, k)
        } else {
            f32s(w)
        };
        DevWeights {
            w: gpu.upload(w).unwrap(),
            q: gpu.upload(&q).unwrap(),
            scale: gpu.upload(&scale).unwrap(),
            fp8,
            values,
        }
    }

    pub(crate) fn gemv(&self) -> kernels::gemv::GemvWeights<'_> {
        use kernels::gemv::GemvWeights;
        if self.fp8 {
            GemvWeights::Fp8 {
                q: self.q.view(),
                scale: self.scale.view(),
            }
        } else {
            GemvWeights::Bf16(self.w.view())
        }
    }
}

/// Every GEMV variant, with bf16 and with FP8 weights (against the
/// reference on the dequantised weights), against `gemv_ref`: odd output
/// counts, inputs an odd multiple of 8 (FP8: of 16, and refused at a
/// multiple of 8 only), 1 to 16 rows, a Llama-1B-sized projection, and
/// 8,200 / 8,208 inputs (column ranges split over 4 warps, two register
/// passes each); outputs poisoned. The gated variant with SiLU and with
/// GELU-tanh, the residual add through an output norm (its counter left
/// zero), Gemma's norm offset 1 on the GELU and output-norm cases. Norm
/// variants whose inputs exceed the shared memory budget must be refused.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gemv_matches_reference() {
    use contract::Activation;
    use kernels::gemv::{GemvKind, GemvOp, OutNorm, RowNorm, gemv_ref};
    let (gpu, k) = setup();
    let mut rng = StdRng::seed_from_u64(18);
    let kinds = [
        GemvKind::Bf16,
        GemvKind::Resid,
        GemvKind::ResidNormed,
        GemvKind::Norm,
        GemvKind::NormGated(Activation::Silu),
        GemvKind::NormGated(Activation::GeluTanh),
        GemvKind::F32,
    ];
    let ready = gpu.alloc::<u32>(1).unwrap();
    gpu.fill_bytes(ready.view(), 0).unwrap();
    let shapes = [
        (37usize, 264usize),
        (37, 272),
        (1001, 8),
        (1001, 16),
        (3072, 2048),
        (67, 8200),
        (67, 8208),
    ];
    for (n, kk) in shapes {
        for m in [1usize, 3, 16, 5] {
            for (kind, fp8) in kinds.into_iter().flat_map(|k| [(k, false), (k, true)]) {
                let gated = matches!(kind, GemvKind::NormGated(_));
                let wrows = if gated { 2 * n } else { n };
                let w = rand_bf16(&mut rng, wrows * kk, 0.5);
                let dw = DevWeights::new(&gpu, &w, wrows, kk, fp8);
                let out_norm = kind == GemvKind::ResidNormed;
                let norm_w = rand_bf16(&mut rng, if out_norm { n } else { kk }, 1.0);
                let offset = match kind {
                    GemvKind::ResidNormed | GemvKind::NormGated(Activation::GeluTanh) => 1.0,
                    _ => 0.0,
                };
                let gains: Vec<f32> = f32s(&norm_w).iter().map(|g| offset + g).collect();
                let xb = rand_bf16(&mut rng, m * kk, 1.0);
                let xf: Vec<f32> = (0..m * kk)
                    .map(|_| rng.random_range(-3.0f32..3.0))
                    .collect();
                let resid: Vec<f32> = (0..m * n).map(|_| rng.random_range(-2.0f32..2.0)).collect();
                let norm_in = matches!(kind, GemvKind::Norm | GemvKind::NormGated(_));
                let x_ref = if norm_in { xf.clone() } else { f32s(&xb) };
                let mut want = if matches!(kind, GemvKind::Resid | GemvKind::ResidNormed) {
                    resid.clone()
                } else {
                    vec![0f32; m * n]
                };
                gemv_ref(kind, &x_ref, &gains, 1e-5, &dw.values, &mut want, m, n, kk);
                let d_g = gpu.upload(&norm_w).unwrap();
                let weights = dw.gemv();
                let (d_xb, d_xf) = (gpu.upload(&xb).unwrap(), gpu.upload(&xf).unwrap());
                let d_res = gpu.upload(&resid).unwrap();
                let yb = gpu.alloc::<bf16>(m * n).unwrap();
                let yf = gpu.alloc::<f32>(m * n).unwrap();
                let rows = gpu.alloc::<bf16>(m * n).unwrap();
                let norm = RowNorm {
                    w: d_g.view(),
                    eps: 1e-5,
                    offset,
                };
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
                    GemvKind::ResidNormed => GemvOp::ResidNormed {
                        x: d_xb.view(),
                        residual: d_res.view(),
                        norm: OutNorm {
                            norm,
                            rows: rows.view(),
                            ready: ready.view(),
                        },
                    },
                    GemvKind::Norm => GemvOp::Norm {
                        residual: d_xf.view(),
                        norm,
                        y: yb.view(),
                    },
                    GemvKind::NormGated(act) => GemvOp::NormGated {
                        residual: d_xf.view(),
                        norm,
                        act,
                        y: yb.view(),
                    },
                    GemvKind::F32 => GemvOp::F32 {
                        x: d_xb.view(),
                        y: yf.view(),
                    },
                };
                let fp8_refused = fp8 && !kk.is_multiple_of(kernels::gemv::FP8_K_MULTIPLE);
                if fp8_refused || (norm_in && !kernels::gemv::fits(m, kk)) {
                    assert!(k.gemv(op, weights, m, n, kk).is_err());
                    continue;
                }
                k.gemv(op, weights, m, n, kk).unwrap();
                let got = match kind {
                    GemvKind::Resid | GemvKind::ResidNormed => gpu.to_host(d_res.view()).unwrap(),
                    GemvKind::F32 => gpu.to_host(yf.view()).unwrap(),
                    _ => f32s(&gpu.to_host(yb.view()).unwrap()),
                };
                let e = rel_err(&got, &want);
                assert!(
                    e < 1e-2,
                    "gemv {kind:?} (fp8 {fp8}) m={m} n={n} k={kk}: rel err {e}"
                );
                let left = gpu.to_host(ready.view()).unwrap();
                assert_eq!(left, [0], "{kind:?} m={m} n={n}: output norm counter left");
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

/// The RoPE + KV-write reference on `ops`: returns the rotated q rows
/// `[T, heads * D]`; rotated k and raw v land in their cache slots. With
/// `hadamard`, q and k heads are Hadamard-rotated after RoPE.
#[allow(clippy::too_many_arguments)]
fn rope_kv_want(
    qkv: &[bf16],
    positions: &[u32],
    slots: &[u32],
    rope: &ops::Rope,
    shape: kernels::HeadShape,
    hadamard: bool,
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
        if hadamard {
            ops::hadamard::rotate_heads(&mut row[..qw + kvw], shape.head_dim);
        }
        q.extend_from_slice(&row[..qw]);
        k_new.extend_from_slice(&row[qw..qw + kvw]);
        v_new.extend_from_slice(&row[qw + kvw..]);
    }
    ops::kv_write(k_cache, v_cache, &k_new, &v_new, slots, kvw);
    q
}

/// Per-head RMSNorm of the q and k heads of `qkv` rows in place, as
/// `head_rmsnorm` computes it: bf16(x * rsqrt(mean(x²) + 1e-5) * (offset + gain)).
fn head_norm_ref(qkv: &mut [bf16], shape: kernels::HeadShape, gq: &[f32], gk: &[f32], offset: f32) {
    let (w, d) = (shape.qkv_width(), shape.head_dim);
    for row in qkv.chunks_mut(w) {
        for (h, head) in row[..(shape.num_heads + shape.num_kv_heads) * d]
            .chunks_mut(d)
            .enumerate()
        {
            let g = if h < shape.num_heads { gq } else { gk };
            let ss: f32 = head.iter().map(|v| v.to_f32() * v.to_f32()).sum();
            let inv = 1.0 / (ss / d as f32 + 1e-5).sqrt();
            for (v, g) in head.iter_mut().zip(g) {
                *v = bf16::from_f32(v.to_f32() * inv * (offset + g));
            }
        }
    }
}

/// `gemv_qkv_rope` against `gemv_ref` (Norm) followed by the RoPE + KV-write reference:
/// q rotated in qkv, k/v in scrambled cache slots, GQA shapes, 1 to 16 rows,
/// one or two warps per row pair, bf16 and FP8 weights, bf16 and FP8 caches,
/// FP8 caches with Hadamard-rotated keys, QK-norm before RoPE (the head
/// counters left zero), a QKV bias before all of it, Gemma's 256-wide
/// heads.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gemv_qkv_rope_matches_reference() {
    use kernels::gemv::{GemvKind, RopeKv, gemv_ref};
    let (gpu, k) = setup();
    let mut rng = StdRng::seed_from_u64(20);
    let max_pos = 512;
    for shape in SHAPES.into_iter().chain([D256]) {
        let (n, d) = (shape.qkv_width(), shape.head_dim);
        let table = rope(max_pos, d);
        let (cos, sin) = (table.cos().to_vec(), table.sin().to_vec());
        // 2,056 inputs at 3 rows: column ranges split over two warps per
        // row pair (FP8 weights take the next multiple of 16)
        let cases = [(1usize, 200usize), (3, 2056), (16, 200)];
        for (m, hidden, fp8, kv8, rot, qk) in cases.iter().flat_map(|&(m, h)| {
            let h8 = h.next_multiple_of(kernels::gemv::FP8_K_MULTIPLE);
            [
                (m, h, false, false, false, false),
                (m, h8, true, false, false, false),
                (m, h, false, true, false, false),
                (m, h8, true, true, false, false),
                (m, h, false, true, true, false),
                (m, h8, true, true, true, false),
                (m, h, false, false, false, true),
                (m, h8, true, true, true, true),
            ]
        }) {
            let w = rand_bf16(&mut rng, n * hidden, 0.5);
            let dw = DevWeights::new(&gpu, &w, n, hidden, fp8);
            let bias = kv8 && (qk || !rot);
            let b = rand_bf16(&mut rng, n, 1.0);
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
                &dw.values,
                &mut qkv_want,
                m,
                n,
                hidden,
            );
            let mut qkv_b: Vec<bf16> = qkv_want.iter().map(|&v| bf16::from_f32(v)).collect();
            if bias {
                for row in qkv_b.chunks_mut(n) {
                    for (v, b) in row.iter_mut().zip(&b) {
                        *v = bf16::from_f32(v.to_f32() + b.to_f32());
                    }
                }
            }
            // QK-norm gains (Gemma's offset 1 on the rotating case)
            let qk_offset = if rot { 1.0 } else { 0.0 };
            let (gq, gk) = (rand_bf16(&mut rng, d, 1.0), rand_bf16(&mut rng, d, 1.0));
            if qk {
                head_norm_ref(&mut qkv_b, shape, &f32s(&gq), &f32s(&gk), qk_offset);
            }
            let mut kr = vec![0f32; num_slots * shape.kv_width()];
            let mut vr = kr.clone();
            let q_want = rope_kv_want(
                &qkv_b, &positions, &slots, &table, shape, rot, &mut kr, &mut vr,
            );
            let (d_g, d_x) = (gpu.upload(&g).unwrap(), gpu.upload(&x).unwrap());
            let weights = dw.gemv();
            let (d_pos, d_slots) = (gpu.upload(&positions).unwrap(), gpu.upload(&slots).unwrap());
            let (d_cos, d_sin) = (gpu.upload(&cos).unwrap(), gpu.upload(&sin).unwrap());
            let cache = TestKv::poisoned(&gpu, num_slots * shape.kv_width(), kv8).rotating(rot);
            let ready = gpu
                .alloc::<u32>(shape.num_heads + shape.num_kv_heads)
                .unwrap();
            let qkv = gpu.alloc::<bf16>(m * n).unwrap();
            gpu.fill_bytes(qkv.view(), POISON).unwrap();
            let (d_gq, d_gk) = (gpu.upload(&gq).unwrap(), gpu.upload(&gk).unwrap());
            let d_b = gpu.upload(&b).unwrap();
            let rope = RopeKv {
                positions: d_pos.view(),
                slots: d_slots.view(),
                cos: d_cos.view(),
                sin: d_sin.view(),
                kv: cache.caches(),
                shape,
                max_pos,
                ready: Some(ready.view()),
                qk_norm: qk.then(|| kernels::gemv::QkNorm {
                    q: d_gq.view(),
                    k: d_gk.view(),
                    offset: qk_offset,
                }),
                bias: bias.then(|| d_b.view()),
            };
            let norm = kernels::gemv::RowNorm {
                w: d_g.view(),
                eps: 1e-5,
                offset: 0.0,
            };
            // SAFETY: slots below num_slots, positions below max_pos.
            unsafe {
                k.gemv_qkv_rope(d_x.view(), norm, weights, qkv.view(), rope, None, m, hidden)
            }
            .unwrap();
            let left = gpu.to_host(ready.view()).unwrap();
            assert!(left.iter().all(|&c| c == 0), "head counters left {left:?}");
            let got = f32s(&gpu.to_host(qkv.view()).unwrap());
            let qw = shape.num_heads * d;
            let q_got: Vec<f32> = (0..m).flat_map(|t| got[t * n..][..qw].to_vec()).collect();
            let e = rel_err(&q_got, &q_want);
            assert!(
                e < 1e-2,
                "{shape:?} m={m} rotated {rot} qk-norm {qk} bias {bias}: q rel err {e}"
            );
            let kvw = shape.kv_width();
            let pick = |c: &[f32]| -> Vec<f32> {
                slots
                    .iter()
                    .flat_map(|&s| c[s as usize * kvw..][..kvw].to_vec())
                    .collect()
            };
            let (kg, vg) = cache.read(&gpu);
            let e = rel_err(&pick(&kg), &kv_rounded(&pick(&kr), kv8, FP8_K_SCALE));
            assert!(
                e < 1e-2,
                "{shape:?} m={m} fp8 KV {kv8} rotated {rot} qk-norm {qk} bias {bias}: k rel err {e}"
            );
            let e = rel_err(&pick(&vg), &kv_rounded(&pick(&vr), kv8, FP8_V_SCALE));
            assert!(e < 1e-2, "{shape:?} m={m} fp8 KV {kv8}: v rel err {e}");
        }
    }
}
