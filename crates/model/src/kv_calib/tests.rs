//! The calibration pass: its maxima are those of the K and V the model
//! computes (layer 0 recomputed by hand), the scales llm-compressor's
//! `amax / 448` per layer, and bad input is refused by name.

use super::*;
use crate::cpu::tests::{config, weights};

const TOKENS: [u32; 12] = [1, 7, 3, 9, 42, 5, 11, 2, 30, 8, 17, 4];

/// `x W^T` in f32 over BF16 `w` (`[out, inp]`), plainly.
fn plain_project(x: &[f32], w: &Projection, inp: usize) -> Vec<f32> {
    let wf = w.to_f32_rows().unwrap();
    let out = w.shape()[0];
    x.chunks(inp)
        .flat_map(|r| (0..out).map(|o| (0..inp).map(|i| r[i] * wf[o * inp + i]).sum::<f32>()))
        .collect()
}

#[test]
fn layer_zeros_maxima_are_those_of_its_k_and_v() {
    let c = config(false);
    let w = weights(&c, false);
    // windows of 5: positions restart, as the pass runs them
    let got = kv_amax(&c, &w, &TOKENS, 5).unwrap();
    let (hd, kv_dim) = (c.head_dim, c.kv_dim());
    let x = embed(&w.embed.data, &TOKENS, c.hidden_size);
    let h = rms_norm(&x, &w.layers[0].input_norm.to_f32(), c.rms_norm_eps);
    let mut k = plain_project(&h, &w.layers[0].k_proj, c.hidden_size);
    let v = plain_project(&h, &w.layers[0].v_proj, c.hidden_size);
    let positions: Vec<u32> = (0..TOKENS.len() as u32).map(|i| i % 5).collect();
    Rope::new(&c, 5).apply_rows(&mut k, kv_dim, &positions);
    // K's maximum covers the keys plain and Hadamard-rotated
    let mut rotated = k.clone();
    ops::hadamard::rotate_heads(&mut rotated, hd);
    let head_max = |rows: &[f32], head: usize| {
        rows.chunks(kv_dim)
            .flat_map(|r| &r[head * hd..(head + 1) * hd])
            .fold(0f32, |m, x| m.max(x.abs()))
    };
    for (rows, amax, what) in [(&k, &got.k[0], "k"), (&v, &got.v[0], "v")] {
        assert_eq!(amax.len(), c.num_kv_heads);
        for (head, &a) in amax.iter().enumerate() {
            let want = match what {
                "k" => head_max(rows, head).max(head_max(&rotated, head)),
                _ => head_max(rows, head),
            };
            assert!(
                want > 0.0 && (a - want).abs() <= 1e-4 * want,
                "{what} head {head}: {a} vs {want}"
            );
        }
    }
    assert_eq!(got.k.len(), c.num_layers);
    assert!(
        got.k
            .iter()
            .chain(&got.v)
            .all(|l| l.len() == c.num_kv_heads)
    );
    // every layer is measured: the second layer's maxima differ from the first's
    assert_ne!(got.k[0], got.k[1]);
}

#[test]
fn scales_are_each_layers_largest_head_over_448() {
    let amax = KvAmax {
        k: vec![vec![2.0, 44.8], vec![0.0, 0.0]],
        v: vec![vec![0.448, 0.1], vec![8.96, 1.0]],
    };
    let s = amax.scales();
    assert_eq!(s.k, vec![0.1, 1.0], "a layer that saw only zeros keeps 1");
    assert_eq!(s.v, vec![0.001, 0.02]);
}

#[test]
fn bad_input_is_refused_naming_the_cause() {
    let c = config(false);
    let w = weights(&c, false);
    assert_eq!(kv_amax(&c, &w, &[], 8), Err(GptqError::NoTokens));
    assert_eq!(
        kv_amax(&c, &w, &[1, 50], 8),
        Err(GptqError::Token {
            at: 1,
            id: 50,
            vocab: 50
        })
    );
    let e = kv_amax(&c, &w, &TOKENS, 65).unwrap_err().to_string();
    assert!(e.contains("65") && e.contains("64"), "{e}");
    let mut big = w.clone();
    for x in big.layers[1].v_proj.as_bf16_mut().unwrap().data.iter_mut() {
        *x = half::bf16::from_f32(3e38);
    }
    assert_eq!(
        kv_amax(&c, &big, &TOKENS, 8),
        Err(GptqError::NonFiniteOutput { tensor: "v".into() })
    );
}
