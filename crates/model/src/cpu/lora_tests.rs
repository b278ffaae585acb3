//! LoRA on the CPU backend: a row with an adapter equals the f64 pass over
//! the weights with that adapter merged in, on both paths; a step mixing
//! adapters and the base model gives every row what it gives alone; bad
//! slots are errors naming the field.

use std::sync::Arc;

use super::batch::{build_step, contiguous_blocks};
use super::tests::{BS, LONG_PROMPT, PROMPT, backend_on, chunk, config, rel_err, weights};
use super::*;
use contract::Backend;
use contract::lora::{LoraAdapter, LoraTarget};

/// A random adapter of rank `r` on `targets`.
fn adapter(c: &ModelConfig, r: usize, targets: &[LoraTarget], seed: u64) -> LoraAdapter {
    contract::testing::random_adapter(c, r, targets, seed, 0.3, 0.7)
}

/// Four adapters of different ranks and target sets.
fn adapters(c: &ModelConfig) -> Vec<Arc<LoraAdapter>> {
    use LoraTarget::*;
    [
        (1, vec![Q, V]),
        (4, LoraTarget::ALL.to_vec()),
        (8, vec![O, Down]),
        (2, vec![K, Gate, Up]),
    ]
    .into_iter()
    .enumerate()
    .map(|(k, (r, t))| Arc::new(adapter(c, r, &t, k as u64 + 1)))
    .collect()
}

/// The exact logits of `prompt` with `lora` merged (or the base model).
fn merged(c: &ModelConfig, lora: Option<&LoraAdapter>, prompt: &[u32]) -> Vec<Vec<f64>> {
    let w = weights(c, false);
    let mut ex = crate::exact::ExactWeights::from_weights(&w, |t| {
        t.data.iter().map(|v| v.to_f32() as f64).collect()
    })
    .unwrap();
    if let Some(a) = lora {
        ex.merge_lora(c, a);
    }
    crate::exact::forward(c, &ex, prompt)
}

fn log_softmax(z: &[f64]) -> Vec<f64> {
    let m = z.iter().cloned().fold(f64::MIN, f64::max);
    let lse = m + z.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
    z.iter().map(|v| v - lse).collect()
}

#[test]
fn adapter_rows_equal_the_merged_model_and_mixing_changes_nothing() {
    let c = config(false);
    let ads = adapters(&c);
    let prompts: [&[u32]; 5] = [
        &PROMPT,
        &LONG_PROMPT,
        &PROMPT[2..],
        &LONG_PROMPT[3..],
        &PROMPT[..7],
    ];
    // slot of each sequence: base, then the four adapters
    let slots = [0u32, 1, 2, 3, 4];
    for path in [CpuPath::Reference, CpuPath::Fast] {
        let mut b = backend_on(path, false, 64).with_max_loras(4);
        assert_eq!(b.max_loras(), 4);
        for (k, a) in ads.iter().enumerate() {
            b.set_lora(k as u32 + 1, Some(a.clone())).unwrap();
        }
        let mut first = 0u32;
        let chunks: Vec<_> = prompts
            .iter()
            .map(|p| {
                let blocks = contiguous_blocks(first, p.len(), BS);
                first += blocks.len() as u32;
                chunk(p, 0, blocks)
            })
            .collect();
        let mut mixed = build_step(&chunks, BS).unwrap();
        mixed.loras = slots.to_vec();
        let rows: Vec<usize> = (0..mixed.num_tokens()).collect();
        let got = b.logits(&mixed, &rows).unwrap();
        let v = c.vocab_size;
        for (s, p) in prompts.iter().enumerate() {
            let lora = (slots[s] > 0).then(|| &*ads[slots[s] as usize - 1]);
            let want = merged(&c, lora, p);
            let base = merged(&c, None, p);
            let a = mixed.cu_seqlens[s] as usize;
            let mut moved = 0f64;
            for (r, w) in want.iter().enumerate() {
                let g = &got[(a + r) * v..(a + r + 1) * v];
                let e = rel_err(g, w);
                assert!(e < 1e-5, "{path:?} seq {s} row {r}: rel err {e}");
                let lg = log_softmax(&g.iter().map(|&x| x as f64).collect::<Vec<_>>());
                let lw = log_softmax(w);
                let d = lg
                    .iter()
                    .zip(&lw)
                    .map(|(x, y)| (x - y).abs())
                    .fold(0.0, f64::max);
                assert!(d < 1e-4, "{path:?} seq {s} row {r}: logprob diff {d}");
                moved = moved.max(rel_err(g, &base[r]));
            }
            // the adapter changes the output (the test could fail)
            if lora.is_some() {
                assert!(
                    moved > 1e-3,
                    "{path:?} seq {s}: adapter had no effect ({moved})"
                );
            }
            // alone, in a step of its own: the same bits on the reference
            // path; on the fast path the step's size picks the product's
            // summation order (GEMM from 16 rows), so up to rounding
            let mut alone = build_step(&chunks[s..s + 1], BS).unwrap();
            alone.loras = vec![slots[s]];
            let n = alone.num_tokens();
            let one = b.logits(&alone, &(0..n).collect::<Vec<_>>()).unwrap();
            let mix = &got[a * v..(a + n) * v];
            match path {
                CpuPath::Reference => assert!(one == mix, "{path:?} seq {s} alone differs"),
                CpuPath::Fast => {
                    let d = one
                        .iter()
                        .zip(mix)
                        .map(|(x, y)| (x - y).abs())
                        .fold(0.0, f32::max);
                    assert!(d < 1e-4, "{path:?} seq {s} alone differs by {d}");
                }
            }
        }
    }
}

#[test]
fn bad_slots_are_errors_naming_the_field() {
    let c = config(false);
    let mut b = backend_on(CpuPath::Reference, false, 8).with_max_loras(2);
    let a = Arc::new(adapter(&c, 2, &[LoraTarget::Q], 1));
    let e = b.set_lora(0, Some(a.clone())).unwrap_err().to_string();
    assert!(e.contains("--max-loras 2"), "{e}");
    let e = b.set_lora(3, Some(a.clone())).unwrap_err().to_string();
    assert!(e.contains("slot 3"), "{e}");
    let mut bad = (*a).clone();
    bad.layers[1].pairs[0].as_mut().unwrap().a.pop();
    let e = b.set_lora(1, Some(Arc::new(bad))).unwrap_err().to_string();
    assert!(e.contains("layer 1 q_proj"), "{e}");
    let mut batch = build_step(
        &[chunk(&PROMPT, 0, contiguous_blocks(0, PROMPT.len(), BS))],
        BS,
    )
    .unwrap();
    batch.loras = vec![2];
    let e = b.logits(&batch, &[0]).unwrap_err().to_string();
    assert!(e.contains("loras[0] = 2"), "{e}");
    batch.loras = vec![1, 0];
    let e = b.logits(&batch, &[0]).unwrap_err().to_string();
    assert!(e.contains("loras has 2 entries"), "{e}");
    // a slot emptied again is refused again
    b.set_lora(2, Some(a)).unwrap();
    batch.loras = vec![2];
    b.logits(&batch, &[0]).unwrap();
    b.set_lora(2, None).unwrap();
    assert!(b.logits(&batch, &[0]).is_err());
    // a backend without slots refuses naming the flag
    let mut none = backend_on(CpuPath::Reference, false, 8);
    assert_eq!(none.max_loras(), 0);
    let e = none
        .set_lora(1, Some(Arc::new(adapter(&c, 1, &[LoraTarget::Q], 2))))
        .unwrap_err()
        .to_string();
    assert!(e.contains("--max-loras 0"), "{e}");
}
