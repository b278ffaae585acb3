//! GPU tests of the layer extras a model spec asks for (`kernels::
//! layer_extras`: row biases, per-head RMSNorm) and the GeGLU activation,
//! each against its CPU reference in `ops`, outputs poisoned or inputs
//! random; part of the `gpu_kernels` binary.

use crate::common::*;
use contract::Activation;
use half::bf16;
use kernels::layer_extras::HeadNorm;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[test]
#[ignore = "needs a CUDA GPU"]
fn bias_rows_and_head_rmsnorm_match_the_reference() {
    let (gpu, k) = setup();
    let mut rng = StdRng::seed_from_u64(11);
    // offset 1: Gemma's (1 + w) gains
    for (tokens, heads, kv_heads, head_dim, offset) in [
        (1, 9, 3, 64, 0.0),
        (37, 32, 8, 64, 0.0),
        (5, 16, 8, 128, 1.0),
    ] {
        let row = (heads + 2 * kv_heads) * head_dim;
        let x = rand_bf16(&mut rng, tokens * row, 3.0);
        let bias = rand_bf16(&mut rng, row, 1.0);
        let (gq, gk) = (
            rand_bf16(&mut rng, head_dim, 1.5),
            rand_bf16(&mut rng, head_dim, 1.5),
        );
        let d_x = gpu.upload(&x).unwrap();
        let d_b = gpu.upload(&bias).unwrap();
        k.bias_rows(d_x.view(), d_b.view(), tokens, row).unwrap();
        let mut want = f32s(&x);
        ops::norm::add_rows(&mut want, &f32s(&bias));
        let got = f32s(&gpu.to_host(d_x.view()).unwrap());
        let e = rel_err(&got, &want);
        assert!(e < 5e-3, "bias T={tokens}: rel err {e}");
        // QK-norm over the biased rows (the V heads untouched)
        let (d_gq, d_gk) = (gpu.upload(&gq).unwrap(), gpu.upload(&gk).unwrap());
        let n = HeadNorm {
            q_heads: heads,
            k_heads: kv_heads,
            head_dim,
            eps: 1e-6,
            offset,
        };
        k.head_rmsnorm(d_x.view(), d_gq.view(), d_gk.view(), tokens, row, n)
            .unwrap();
        let mut want = got.clone();
        let (q, kk) = (heads * head_dim, kv_heads * head_dim);
        let plus = |g: &[bf16]| -> Vec<f32> { f32s(g).iter().map(|w| offset + w).collect() };
        for r in want.chunks_exact_mut(row) {
            ops::norm::rms_norm_in_place(&mut r[..q], &plus(&gq), 1e-6);
            ops::norm::rms_norm_in_place(&mut r[q..q + kk], &plus(&gk), 1e-6);
        }
        let got = f32s(&gpu.to_host(d_x.view()).unwrap());
        let e = rel_err(&got, &want);
        assert!(e < 5e-3, "head norm T={tokens} d={head_dim}: rel err {e}");
        let v = |r: &[f32]| r[q + kk..].to_vec();
        let untouched = got.chunks_exact(row).zip(want.chunks_exact(row));
        assert!(
            untouched.into_iter().all(|(a, b)| v(a) == v(b)),
            "V changed"
        );
    }
    // heads that do not fit the row are refused
    let d = gpu.alloc::<bf16>(64).unwrap();
    let n = HeadNorm {
        q_heads: 2,
        k_heads: 1,
        head_dim: 32,
        eps: 1e-6,
        offset: 0.0,
    };
    let g = gpu.alloc::<bf16>(32).unwrap();
    assert!(
        k.head_rmsnorm(d.view(), g.view(), g.view(), 1, 64, n)
            .is_err()
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn whole_row_norm_and_softcap_match_the_reference() {
    let (gpu, k) = setup();
    let mut rng = StdRng::seed_from_u64(13);
    // an output norm: each row one head as wide as the row, gains 1 + w
    for (tokens, width) in [(1, 640), (300, 2048)] {
        let x = rand_bf16(&mut rng, tokens * width, 3.0);
        let g = rand_bf16(&mut rng, width, 0.5);
        let (d_x, d_g) = (gpu.upload(&x).unwrap(), gpu.upload(&g).unwrap());
        let n = HeadNorm {
            q_heads: 1,
            k_heads: 0,
            head_dim: width,
            eps: 1e-6,
            offset: 1.0,
        };
        k.head_rmsnorm(d_x.view(), d_g.view(), d_g.view(), tokens, width, n)
            .unwrap();
        let gain: Vec<f32> = f32s(&g).iter().map(|w| 1.0 + w).collect();
        let mut want = f32s(&x);
        for r in want.chunks_exact_mut(width) {
            ops::norm::rms_norm_in_place(r, &gain, 1e-6);
        }
        let e = rel_err(&f32s(&gpu.to_host(d_x.view()).unwrap()), &want);
        assert!(e < 5e-3, "row norm T={tokens} w={width}: rel err {e}");
    }
    let n = 3 * 50_000 + 7;
    let y: Vec<f32> = (0..n).map(|_| rng.random_range(-80.0..80.0)).collect();
    let d_y = gpu.upload(&y).unwrap();
    k.softcap_rows(d_y.view(), n, 30.0).unwrap();
    let mut want = y.clone();
    ops::norm::softcap(&mut want, 30.0);
    let e = rel_err(&gpu.to_host(d_y.view()).unwrap(), &want);
    assert!(e < 1e-5, "softcap: rel err {e}");
    assert!(k.softcap_rows(d_y.view(), n, 0.0).is_err());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gelu_tanh_mul_matches_the_reference() {
    let (gpu, k) = setup();
    let mut rng = StdRng::seed_from_u64(12);
    for (tokens, inter) in [(5, 1536), (3, 777), (129, 2048)] {
        let gu = rand_bf16(&mut rng, tokens * 2 * inter, 4.0);
        let d_gu = gpu.upload(&gu).unwrap();
        let out = gpu.alloc::<bf16>(tokens * inter).unwrap();
        gpu.fill_bytes(out.view(), POISON).unwrap();
        k.gate_mul(Activation::GeluTanh, out.view(), d_gu.view(), tokens, inter)
            .unwrap();
        let (mut gate, up) = ops::activation::split_gate_up(&f32s(&gu), inter);
        ops::activation::gate_mul(Activation::GeluTanh, &mut gate, &up);
        let got = f32s(&gpu.to_host(out.view()).unwrap());
        let e = rel_err(&got, &gate);
        assert!(
            e < 5e-3,
            "gelu T={tokens}: rel err {e}: got {:?} want {:?}",
            &got[..4],
            &gate[..4]
        );
    }
}
