//! GPTQ on the 4-bit grid: a clearly lower output error than rounding to
//! nearest on the same group-scale rule, rounding to nearest itself when
//! the Hessian is the identity, 4-bit codes around zero 8, and the
//! sequential pass over a tiny model (the GPTQ layout's form, closer to
//! BF16's logits than rounding, bad options refused).

use checkpoint::Projection;
use checkpoint::int4::{self, Int4Tensor, MAX_CODE, SYM_ZERO};
use checkpoint::weights::{ModelWeights, Tensor};
use contract::sampling::splitmix64;
use half::bf16;

use super::solve::{Factor, gptq_int4};
use super::tests::{inputs, logit_distance, logits, uniform};
use super::*;
use crate::cpu::tests::{config_with, weights};

/// `||x w^T - x v^T||^2` for `x` `[t, k]`, `w` and the values `v` `[n, k]`.
fn output_error(x: &[f32], w: &[f32], v: &[f32], k: usize) -> f64 {
    let mut sum = 0.0;
    for xr in x.chunks(k) {
        for (wr, vr) in w.chunks(k).zip(v.chunks(k)) {
            let d: f64 = (0..k)
                .map(|c| xr[c] as f64 * (wr[c] as f64 - vr[c] as f64))
                .sum();
            sum += d * d;
        }
    }
    sum
}

/// The values of `codes` (`[n, k]`) at `scale` (`[n, k / group]`), zero 8.
fn values(codes: &[u8], scale: &[f32], k: usize, group: usize) -> Vec<f32> {
    let groups = k / group;
    (codes.iter().enumerate())
        .map(|(i, &q)| int4::decode(q, scale[i / k * groups + i % k / group], SYM_ZERO))
        .collect()
}

/// Rounding to nearest with each group's scale from the weights as they
/// are: the codes and the scales.
fn rounded(w: &[f32], n: usize, k: usize, group: usize) -> (Vec<u8>, Vec<f32>) {
    let (scale, _) = int4::grids(w, n, k, group, true);
    let groups = k / group;
    let codes = (w.iter().enumerate())
        .map(|(i, &v)| int4::encode(v, scale[i / k * groups + i % k / group], SYM_ZERO))
        .collect();
    (codes, scale)
}

#[test]
fn gptq_int4_has_a_clearly_lower_output_error_than_rounding_to_nearest() {
    let (t, n, k) = (256, 24, 128);
    let x = inputs(t, k, 1);
    let w: Vec<f32> = uniform(n * k, 9).iter().map(|v| v * 0.05).collect();
    let f = Factor::new(&Hessian::of(&x, k), 0.01, false).unwrap();
    for (group, block) in [(32, 16), (32, 64), (64, 128), (128, 128)] {
        let (rc, rs) = rounded(&w, n, k, group);
        let rtn = output_error(&x, &w, &values(&rc, &rs, k, group), k);
        let (codes, scale, perm) = gptq_int4(&w, n, k, &f, group, block);
        assert_eq!((scale.len(), perm), (n * k / group, None));
        assert!(
            codes.iter().all(|&q| q <= MAX_CODE),
            "a code outside 0..=15"
        );
        let e = output_error(&x, &w, &values(&codes, &scale, k, group), k);
        assert!(
            e < 0.5 * rtn,
            "group {group}, block {block}: gptq {e} vs round-to-nearest {rtn}"
        );
    }
}

#[test]
fn with_the_identity_hessian_gptq_int4_is_rounding_to_nearest() {
    let (n, k, group) = (8, 96, 32);
    // BF16 weights, so that the writer's rounding sees the same values
    let t = Tensor {
        name: "w".into(),
        shape: vec![n, k],
        data: uniform(n * k, 3)
            .iter()
            .map(|v| bf16::from_f32(v * 0.3))
            .collect(),
    };
    let w = t.to_f32();
    let mut eye = vec![0f64; k * k];
    (0..k).for_each(|i| eye[i * k + i] = 1.0);
    let f = Factor::new(&Hessian::from_matrix(k, eye), 0.01, false).unwrap();
    let (codes, scale, _) = gptq_int4(&w, n, k, &f, group, 64);
    assert_eq!((codes.clone(), scale.clone()), rounded(&w, n, k, group));
    // and that is the writer's rounding, scales included
    let zero = vec![SYM_ZERO; scale.len()];
    let got = Int4Tensor::from_codes("w", n, k, group, &codes, scale, zero);
    assert_eq!(got, Int4Tensor::round_to_nearest(&t, group, true));
}

/// The tiny model with an intermediate width of 64 (whole groups of 32).
fn tiny() -> (contract::ModelConfig, ModelWeights) {
    let c = config_with(false, 64);
    let w = weights(&c, false);
    (c, w)
}

/// `w` with every layer projection rounded to nearest in groups of `group`.
fn rounded_model(w: &ModelWeights, group: usize) -> ModelWeights {
    let mut rtn = w.clone();
    for (p, b) in (rtn.layers.iter_mut().flat_map(|l| l.projections_mut()))
        .zip(w.layers.iter().flat_map(|l| l.projections()))
    {
        *p = Projection::Int4(Int4Tensor::round_to_nearest(
            b.as_bf16().unwrap(),
            group,
            true,
        ));
    }
    rtn
}

fn int4_opts(group: usize) -> GptqOptions {
    GptqOptions {
        window: 48,
        block: 8,
        target: Target::Int4 { group },
        ..GptqOptions::default()
    }
}

#[test]
fn the_int4_pass_writes_the_gptq_form_and_beats_rounding_on_the_logits() {
    let (c, w) = tiny();
    let tokens: Vec<u32> = (0..48u64).map(|i| (splitmix64(i) % 50) as u32).collect();
    let q = quantize_model(&c, w.clone(), &tokens, &int4_opts(32), &mut |_, _| {}).unwrap();
    let rtn = rounded_model(&w, 32);
    for (p, b) in (q.layers.iter().flat_map(|l| l.projections()))
        .zip(w.layers.iter().flat_map(|l| l.projections()))
    {
        let Projection::Int4(t) = p else {
            panic!("`{}` is {}, not int4", p.name(), p.format());
        };
        assert_eq!(t.layout_error(), None, "`{}`", t.name);
        assert_eq!([t.rows, t.cols], b.shape(), "`{}`", t.name);
        assert_eq!((t.group, t.perm.as_ref()), (32, None));
        assert!(t.zero.iter().all(|&z| z == SYM_ZERO), "`{}`", t.name);
        assert!(
            (t.scale.iter()).all(|&s| s > 0.0 && half::f16::from_f32(s).to_f32() == s),
            "`{}`: scales are f16 values",
            t.name
        );
    }
    let want = logits(&c, &w, &tokens);
    let dist = |other: &ModelWeights| logit_distance(&c, other, &tokens, &want);
    let (g, r) = (dist(&q), dist(&rtn));
    assert!(g < 0.8 * r, "gptq {g} vs round-to-nearest {r}");
}

#[test]
fn int4_groups_that_do_not_fit_are_refused() {
    let (c, w) = tiny();
    let run = |opts: &GptqOptions| quantize_model(&c, w.clone(), &[1, 2], opts, &mut |_, _| {});
    for group in [0, 48, 128] {
        let err = run(&int4_opts(group)).map(|_| ()).unwrap_err();
        assert!(
            matches!(&err, GptqError::Options(m) if m.contains(&format!("group of {group}"))),
            "{err}"
        );
    }
}

/// With activation order a 4-bit group is a run of the solver's columns:
/// each projection carries that order (GPTQ's `desc_act`), its groups hold
/// the columns the solver took together, and it still beats rounding to
/// nearest on the logits.
#[test]
fn int4_with_activation_order_carries_the_column_order() {
    let (c, w) = tiny();
    let tokens: Vec<u32> = (0..48u64).map(|i| (splitmix64(i) % 50) as u32).collect();
    let opts = GptqOptions {
        act_order: true,
        ..int4_opts(32)
    };
    let q = quantize_model(&c, w.clone(), &tokens, &opts, &mut |_, _| {}).unwrap();
    let mut ordered = 0;
    for p in q.layers.iter().flat_map(|l| l.projections()) {
        let Projection::Int4(t) = p else {
            panic!("`{}` is {}, not int4", p.name(), p.format());
        };
        assert_eq!(t.layout_error(), None, "`{}`", t.name);
        ordered += usize::from(t.perm.is_some());
    }
    assert!(ordered > 0, "no projection was quantised out of order");
    let rtn = rounded_model(&w, 32);
    let want = logits(&c, &w, &tokens);
    let dist = |other: &ModelWeights| logit_distance(&c, other, &tokens, &want);
    let (g, r) = (dist(&q), dist(&rtn));
    assert!(g < 0.8 * r, "gptq {g} vs round-to-nearest {r}");
}
