//! The model description carries: layers that differ from Llama's only in
//! their spec (biases, QK-norm, norm-gain offset, embedding scale, GeGLU,
//! output norms, final soft-cap, attention scale, soft-cap and sliding
//! window, per-layer RoPE; Gemma 3's config as parsed) run on both CPU
//! paths and match the f64 reference taught the same fields, in prefill
//! (a chunk long enough for the GEMM attention) and decode.

use super::batch::{build_step, contiguous_blocks};
use super::tests::{BS, LONG_PROMPT, PROMPT, chunk, naive, rel_err, weights};
use super::*;
use contract::spec::Activation;
use contract::{Backend, ModelSpec};

/// The test config (`tests::config`) with its architecture fields replaced.
fn parsed(fields: &str) -> ModelConfig {
    let text = format!(
        r#"{{{fields} "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 50,
        "rms_norm_eps": 1e-5, "max_position_embeddings": 64, "rope_theta": 10000.0,
        "tie_word_embeddings": false}}"#
    );
    ModelConfig::from_json(&text, "variant").unwrap()
}

/// Every field the spec has that a config file cannot yet ask for, on.
fn everything(mut c: ModelConfig) -> ModelConfig {
    let s: &mut ModelSpec = &mut c.spec;
    s.norm_weight_offset = 1.0;
    s.embed_scale = (c.hidden_size as f32).sqrt();
    s.final_logit_softcap = Some(3.0);
    for l in &mut s.layers {
        l.mlp.activation = Activation::GeluTanh;
        l.post_attention_norm = true;
        l.post_mlp_norm = true;
    }
    c
}

/// Windows shorter than the test prompts on layer 0 (with an attention
/// soft-cap and scale of its own) and layer 1 (with its own RoPE base).
fn windowed(mut c: ModelConfig) -> ModelConfig {
    let (a, b) = c.spec.layers.split_at_mut(1);
    a[0].attention.window = Some(3);
    a[0].attention.logit_softcap = Some(1.5);
    a[0].attention.scale = 0.7;
    b[0].attention.window = Some(6);
    b[0].rope.theta = 50.0;
    c
}

fn variants() -> Vec<(&'static str, ModelConfig)> {
    let qwen3 = r#""architectures": ["Qwen3ForCausalLM"], "attention_bias": true,"#;
    // layer 0 local (window 5, RoPE base 100), layer 1 global
    let gemma3 = r#""architectures": ["Gemma3ForCausalLM"], "sliding_window": 5,
        "sliding_window_pattern": 2, "query_pre_attn_scalar": 10, "rope_local_base_freq": 100.0,
        "final_logit_softcapping": 4.0,"#;
    vec![
        ("qwen3 + attention biases", parsed(qwen3)),
        ("qwen2", parsed(r#""architectures": ["Qwen2ForCausalLM"],"#)),
        ("llama + mlp bias", parsed(r#""mlp_bias": true,"#)),
        ("every field", everything(parsed(qwen3))),
        (
            "windows, soft-caps, per-layer RoPE",
            windowed(everything(parsed(qwen3))),
        ),
        ("gemma 3", parsed(gemma3)),
    ]
}

#[test]
fn each_variant_matches_the_reference_on_both_paths() {
    for (name, c) in variants() {
        assert!(
            c.spec
                .first_difference(&ModelSpec::llama(2, 8, c.rope().clone()))
                .is_some()
        );
        let w = weights(&c, false);
        for path in [CpuPath::Reference, CpuPath::Fast] {
            for prompt in [&PROMPT[..], &LONG_PROMPT[..]] {
                let want = naive(&c, &w, prompt);
                let kv = KvShape {
                    num_blocks: 8,
                    block_size: BS,
                };
                let mut b = CpuBackend::with_path(c.clone(), w.clone(), kv, path).unwrap();
                let n = prompt.len();
                let blocks = contiguous_blocks(0, n, BS);
                // the prompt but its last token, then the last one decoded
                let first = build_step(&[chunk(&prompt[..n - 1], 0, blocks.clone())], BS).unwrap();
                let rows: Vec<usize> = (0..n - 1).collect();
                let got = b.logits(&first, &rows).unwrap();
                let last = build_step(&[chunk(&prompt[n - 1..], n - 1, blocks)], BS).unwrap();
                let got = [got, b.logits(&last, &[0]).unwrap()].concat();
                for (r, want) in want.iter().enumerate() {
                    let e = rel_err(&got[r * 50..(r + 1) * 50], want);
                    assert!(e < 1e-5, "{name} {path:?} {n} tokens, row {r}: rel err {e}");
                }
            }
        }
    }
}
