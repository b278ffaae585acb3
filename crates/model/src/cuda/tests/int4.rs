//! A model in int4 (the stored form of AWQ / GPTQ / compressed-tensors
//! checkpoints) on CUDA against the CPU backend on the same codes, by
//! teacher-forced log-probabilities: symmetric and asymmetric grids,
//! groups of 32, 64 and whole rows, and one layer's Q/K/V in a column
//! order (GPTQ desc_act), which goes up widened. Prompts of 7 and 40
//! tokens run on the GEMM path (the block GEMM), decode on the int4 GEMVs
//! (both read the codes as they are). The bound is the same model's error
//! in BF16 on both backends (`quantised_vs_cpu_within_bf16`).

use super::*;
use checkpoint::int4::Int4Tensor;
use checkpoint::projection::Projection;

/// Hidden 256, intermediate 512, 4 heads of 64.
fn config() -> ModelConfig {
    let text = r#"{"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300,
        "rms_norm_eps": 1e-5, "max_position_embeddings": 512, "rope_theta": 10000.0,
        "tie_word_embeddings": true}"#;
    ModelConfig::from_json(text, "test").unwrap()
}

/// The test model with int4 projections (see the module doc).
fn model() -> (ModelConfig, ModelWeights) {
    let c = config();
    let mut w = crate::cpu::tests::weights(&c, true);
    let h = c.hidden_size as u32;
    let perm: Vec<u32> = (0..h).map(|i| (i * 7 + 3) % h).collect();
    for (l, lw) in w.layers.iter_mut().enumerate() {
        for (i, p) in lw.projections_mut().into_iter().enumerate() {
            let mut t = p.as_bf16().expect("BF16 test weights").clone();
            let k = t.shape[1];
            let group = [32, 64, k][(l + i) % 3];
            let ordered = l == 2 && i < 3;
            if ordered {
                let src = t.data.clone();
                for (dst, row) in t.data.chunks_exact_mut(k).zip(src.chunks_exact(k)) {
                    for (c, &j) in perm.iter().enumerate() {
                        dst[c] = row[j as usize];
                    }
                }
            }
            let mut q = Int4Tensor::round_to_nearest(&t, group, i % 2 == 0);
            q.perm = ordered.then(|| perm.clone());
            *p = Projection::Int4(q);
        }
    }
    (c, w)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_int4_matches_the_cpu_on_the_same_codes() {
    let (cfg, w) = model();
    // the CPU multiplies the exact int4 values in f32; CUDA rounds its
    // activations to bf16, as it does for the BF16 control
    let name = quantised_vs_cpu_within_bf16(&cfg, &w, w.clone(), "int4");
    assert!(name.contains("int4"), "{name}");
}
