//! The block formats' kernels on the GPU (`#[ignore]`d: they need a CUDA
//! device): the widening kernel equal to the GGUF reader's values rounded
//! to bf16, every GEMV variant against `gemv_ref` on the dequantised
//! weights, and the fused QKV + RoPE + KV write reading blocks against the
//! same launch on those weights widened (whose epilogue the kernels' own
//! tests hold to `ops`).

use std::sync::Arc;

use super::*;
use ::gpu::DeviceBuffer;
use kernels::gemv::{GemvKind, GemvOp, RopeKv, gemv_ref};
use kernels::{HeadShape, KernelOptions, Kernels, KvCaches};

fn setup() -> (Arc<Gpu>, Kernels) {
    let gpu = Gpu::new(0).expect("a CUDA device");
    let k = Kernels::load(&gpu, KernelOptions::default()).expect("kernels load");
    (gpu, k)
}

/// A tensor's blocks packed and on the device, with their exact values.
struct DevBlocks {
    w: GgufLinear,
    values: Vec<f32>,
}

fn dev_blocks(gpu: &Gpu, f: WeightFormat, t: &QuantTensor) -> DevBlocks {
    DevBlocks {
        w: GgufLinear::upload(gpu, f, &[(t, &[t.rows, t.cols])]).unwrap(),
        values: dequantize(t.ty, &t.data, t.rows * t.cols).unwrap(),
    }
}

fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    assert!(
        a.iter().all(|x| x.is_finite()),
        "non-finite output (unwritten?)"
    );
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

fn f32s(v: &[bf16]) -> Vec<f32> {
    v.iter().map(|x| x.to_f32()).collect()
}

/// Deterministic values in [-scale, scale).
fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|i| ((splitmix64(seed ^ i as u64) % 20_000) as f32 / 10_000.0 - 1.0) * scale)
        .collect()
}

fn bf16s(v: &[f32]) -> Vec<bf16> {
    v.iter().map(|&x| bf16::from_f32(x)).collect()
}

/// Every format widened to bf16 equals the GGUF reader's values rounded to
/// bf16, bit for bit; 2,560 columns (ten K super-blocks) and odd rows.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gguf_widening_matches_the_gguf_reader() {
    let (gpu, k) = setup();
    for (f, ty) in FORMATS {
        let (n, cols) = (37, 2560);
        let d = dev_blocks(&gpu, f, &random_blocks(ty, n, cols, 11));
        let out = gpu.alloc::<bf16>(n * cols).unwrap();
        gpu.fill_bytes(out.view(), 0xFF).unwrap();
        let GemvWeights::Blocks { q, side, .. } = d.w.gemv() else {
            unreachable!("a block format");
        };
        k.gguf_dequant(f, q, side, out.view(), n, cols).unwrap();
        let got = gpu.to_host(out.view()).unwrap();
        let want = bf16s(&d.values);
        let bad = got
            .iter()
            .zip(&want)
            .position(|(g, w)| g.to_bits() != w.to_bits());
        assert!(bad.is_none(), "{f:?}: weight {bad:?} differs");
    }
}

/// Every GEMV variant of every block format against `gemv_ref` on the
/// dequantised weights: 1 to 16 rows, one block row of columns, column
/// ranges split over warps (4,608 columns), outputs poisoned.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gguf_gemv_matches_reference() {
    let (gpu, k) = setup();
    let kinds = [
        GemvKind::Bf16,
        GemvKind::Resid,
        GemvKind::Norm,
        GemvKind::NormGated(contract::Activation::Silu),
        GemvKind::F32,
    ];
    let mut seed = 100;
    for (f, ty) in FORMATS {
        for (n, kk) in [(37usize, 256usize), (67, 4608), (1001, 512)] {
            for m in [1usize, 3, 16] {
                for kind in kinds {
                    seed += 1;
                    let gated = matches!(kind, GemvKind::NormGated(_));
                    let wrows = if gated { 2 * n } else { n };
                    let d = dev_blocks(&gpu, f, &random_blocks(ty, wrows, kk, seed));
                    let norm_in = matches!(kind, GemvKind::Norm | GemvKind::NormGated(_));
                    if norm_in && !kernels::gemv::fits(m, kk) {
                        continue;
                    }
                    gemv_case(&gpu, &k, &d, kind, (m, n, kk), seed);
                }
            }
        }
    }
}

/// One GEMV launch of `kind` against its reference.
fn gemv_case(
    gpu: &Gpu,
    k: &Kernels,
    d: &DevBlocks,
    kind: GemvKind,
    (m, n, kk): (usize, usize, usize),
    seed: u64,
) {
    let norm_w = bf16s(&values(kk, seed ^ 1, 1.0));
    let xb = bf16s(&values(m * kk, seed ^ 2, 1.0));
    let xf = values(m * kk, seed ^ 3, 3.0);
    let resid = values(m * n, seed ^ 4, 2.0);
    let norm_in = matches!(kind, GemvKind::Norm | GemvKind::NormGated(_));
    let x_ref = if norm_in { xf.clone() } else { f32s(&xb) };
    let mut want = match kind {
        GemvKind::Resid => resid.clone(),
        _ => vec![0f32; m * n],
    };
    gemv_ref(
        kind,
        &x_ref,
        &f32s(&norm_w),
        1e-5,
        &d.values,
        &mut want,
        m,
        n,
        kk,
    );
    let up = |v: &[bf16]| gpu.upload(v).unwrap();
    let (d_g, d_xb) = (up(&norm_w), up(&xb));
    let (d_xf, d_res) = (gpu.upload(&xf).unwrap(), gpu.upload(&resid).unwrap());
    let yb = gpu.alloc::<bf16>(m * n).unwrap();
    let yf = gpu.alloc::<f32>(m * n).unwrap();
    gpu.fill_bytes(yb.view(), 0xFF).unwrap();
    gpu.fill_bytes(yf.view(), 0xFF).unwrap();
    let (x, y, residual) = (d_xb.view(), yb.view(), d_xf.view());
    let norm = kernels::gemv::RowNorm {
        w: d_g.view(),
        eps: 1e-5,
        offset: 0.0,
    };
    let op = match kind {
        GemvKind::Bf16 => GemvOp::Bf16 { x, y },
        GemvKind::Resid => GemvOp::Resid {
            x,
            residual: d_res.view(),
        },
        GemvKind::Norm => GemvOp::Norm { residual, norm, y },
        GemvKind::NormGated(act) => GemvOp::NormGated {
            residual,
            norm,
            act,
            y,
        },
        GemvKind::F32 => GemvOp::F32 { x, y: yf.view() },
        GemvKind::ResidNormed => unreachable!("not among the cases"),
    };
    k.gemv(op, d.w.gemv(), m, n, kk).unwrap();
    let got = match kind {
        GemvKind::Resid => gpu.to_host(d_res.view()).unwrap(),
        GemvKind::F32 => gpu.to_host(yf.view()).unwrap(),
        _ => f32s(&gpu.to_host(yb.view()).unwrap()),
    };
    let e = rel_err(&got, &want);
    let f = d.w.format();
    assert!(e < 1e-2, "{f:?} {kind:?} m={m} n={n} k={kk}: rel err {e}");
}

/// The fused QKV + RoPE + KV write reading each block format against the
/// same launch on the weights widened to bf16 by `gguf_dequant`: q, k and
/// v within the bf16 rounding of the weights.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gguf_gemv_qkv_rope_matches_the_widened_weights() {
    let (gpu, k) = setup();
    let shape = HeadShape {
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 64,
    };
    let (n, hidden, max_pos, slots) = (shape.qkv_width(), 512, 64, 8);
    let half_d = shape.head_dim / 2;
    let cos: Vec<f32> = values(max_pos * half_d, 5, 1.0);
    let sin: Vec<f32> = cos.iter().map(|c| (1.0 - c * c).sqrt()).collect();
    let (d_cos, d_sin) = (gpu.upload(&cos).unwrap(), gpu.upload(&sin).unwrap());
    for (f, ty) in FORMATS {
        for m in [1usize, 3] {
            let d = dev_blocks(&gpu, f, &random_blocks(ty, n, hidden, 40 + m as u64));
            let wide = gpu.alloc::<bf16>(n * hidden).unwrap();
            let GemvWeights::Blocks { q, side, .. } = d.w.gemv() else {
                unreachable!("a block format");
            };
            k.gguf_dequant(f, q, side, wide.view(), n, hidden).unwrap();
            let x = gpu.upload(&values(m * hidden, 6, 3.0)).unwrap();
            let g = gpu.upload(&bf16s(&values(hidden, 7, 1.0))).unwrap();
            let positions: Vec<u32> = (0..m as u32).map(|t| 5 + 7 * t).collect();
            let slot_ids: Vec<u32> = (0..m as u32).map(|t| slots as u32 - 1 - t).collect();
            let (d_pos, d_slots) = (
                gpu.upload(&positions).unwrap(),
                gpu.upload(&slot_ids).unwrap(),
            );
            let run = |w: GemvWeights<'_>| -> Vec<Vec<f32>> {
                let qkv = gpu.alloc::<bf16>(m * n).unwrap();
                let kc: DeviceBuffer<bf16> = gpu.alloc(slots * shape.kv_width()).unwrap();
                let vc: DeviceBuffer<bf16> = gpu.alloc(slots * shape.kv_width()).unwrap();
                gpu.fill_bytes(kc.view(), 0).unwrap();
                gpu.fill_bytes(vc.view(), 0).unwrap();
                let rope = RopeKv {
                    positions: d_pos.view(),
                    slots: d_slots.view(),
                    cos: d_cos.view(),
                    sin: d_sin.view(),
                    kv: KvCaches::bf16(kc.view(), vc.view()),
                    shape,
                    max_pos,
                    ready: None,
                    qk_norm: None,
                    bias: None,
                };
                let norm = kernels::gemv::RowNorm {
                    w: g.view(),
                    eps: 1e-5,
                    offset: 0.0,
                };
                // SAFETY: slots below `slots`, positions below max_pos.
                unsafe { k.gemv_qkv_rope(x.view(), norm, w, qkv.view(), rope, None, m, hidden) }
                    .unwrap();
                [qkv, kc, vc]
                    .iter()
                    .map(|b| f32s(&gpu.to_host(b.view()).unwrap()))
                    .collect()
            };
            let (got, want) = (run(d.w.gemv()), run(GemvWeights::Bf16(wide.view())));
            for (what, (g, w)) in ["qkv", "k cache", "v cache"]
                .iter()
                .zip(got.iter().zip(&want))
            {
                let e = rel_err(g, w);
                assert!(e < 1e-2, "{f:?} m={m} {what}: rel err {e}");
            }
        }
    }
}
