//! The model description on the GPU: layers that differ from Llama's only
//! in their spec (Q/K/V and O biases with QK-norm as in the `tiny-extras`
//! preset, MLP biases, GeGLU, and Gemma's norms: `(1 + w)` gains, output
//! norms, the embedding scale, the final soft-cap and a RoPE per layer;
//! Gemma 3's attention: head_dim 256, its query scale and sliding windows
//! shorter than the prompts and the generation)
//! run the GEMM layer and match the CPU backend (which the f64 reference
//! holds), in prefill and in decode, in the default and the deterministic
//! mode; a field CUDA does not run is refused naming it.

use super::*;
use crate::cpu::CpuBackend;
use checkpoint::weights::{Extra, Tensor};
use contract::spec::{Activation, ModelSpec};
use half::bf16;

/// `w` with small random MLP biases on every layer (the spec says so too).
fn with_mlp_bias(c: &mut ModelConfig, w: &mut ModelWeights) {
    let dims = c.clone();
    for (i, (ls, lw)) in c.spec.layers.iter_mut().zip(&mut w.layers).enumerate() {
        ls.mlp.bias = true;
        for e in [Extra::GateBias, Extra::UpBias, Extra::DownBias] {
            let shape = e.shape(&dims);
            let data = (0..shape[0])
                .map(|j| {
                    let u = splitmix64((i * 100_000 + j) as u64 ^ ((e as u64) << 40)) >> 40;
                    bf16::from_f32(0.1 * (u as f32 / (1u64 << 24) as f32 - 0.5))
                })
                .collect();
            let name = format!("model.layers.{i}.{}", e.hf_suffix());
            lw.extras.insert(e, Tensor { name, shape, data });
        }
    }
}

/// Small random values around 0, seeded by (layer, tensor, index).
fn small(i: usize, e: Extra, n: usize, amp: f32) -> Vec<bf16> {
    (0..n)
        .map(|j| {
            let u = splitmix64((i * 100_000 + j) as u64 ^ ((e as u64) << 40) ^ 0x9e37) >> 40;
            bf16::from_f32(amp * (u as f32 / (1u64 << 24) as f32 - 0.5))
        })
        .collect()
}

/// Gemma 3's layer recipe without its window: gains `1 + w` (every norm
/// re-drawn around 0), output norms after attention and the MLP, the
/// embedding scaled by sqrt(hidden), a final soft-cap and a local RoPE
/// base on every other layer.
fn gemma_like(c: &mut ModelConfig, w: &mut ModelWeights) {
    let dims = c.clone();
    c.spec.norm_weight_offset = 1.0;
    c.spec.embed_scale = (c.hidden_size as f32).sqrt();
    c.spec.final_logit_softcap = Some(30.0);
    let h = c.hidden_size;
    for (i, (ls, lw)) in c.spec.layers.iter_mut().zip(&mut w.layers).enumerate() {
        (ls.post_attention_norm, ls.post_mlp_norm) = (true, true);
        if i % 2 == 0 {
            ls.rope.theta = 10_000.0;
        }
        for e in [Extra::AttnOutNorm, Extra::MlpOutNorm] {
            let name = format!("model.layers.{i}.{}", e.hf_suffix());
            let data = small(i, e, h, 0.4);
            lw.extras.insert(
                e,
                Tensor {
                    name,
                    shape: e.shape(&dims),
                    data,
                },
            );
        }
        for (t, e) in [
            (&mut lw.input_norm, Extra::QBias),
            (&mut lw.post_norm, Extra::KBias),
        ] {
            t.data = small(i, e, h, 0.4);
        }
        for e in [Extra::QNorm, Extra::KNorm] {
            if let Some(t) = lw.extras.get_mut(&e) {
                t.data = small(i, e, t.data.len(), 0.4);
            }
        }
    }
    w.norm.data = small(99, Extra::OBias, h, 0.4);
}

/// Gemma 3's layers at head_dim 256 (4 query heads, 1 KV head, scale
/// `256^-1/2`) on a small width: local layers (even ones) with a window
/// of 37 keys (shorter than the 300-token prompt and than the 52 positions
/// of the decode check; not a multiple of any block or key tile), global
/// odd layers; norm gains `1 + w` re-drawn around 0.
fn gemma3_d256() -> (ModelConfig, ModelWeights) {
    let text = r#"{"architectures": ["Gemma3ForCausalLM"], "head_dim": 256,
        "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 128,
        "intermediate_size": 192, "max_position_embeddings": 512,
        "num_attention_heads": 4, "num_hidden_layers": 4, "num_key_value_heads": 1,
        "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-6,
        "rope_local_base_freq": 10000.0, "rope_theta": 1000000.0,
        "sliding_window": 37, "sliding_window_pattern": 2, "vocab_size": 300,
        "bos_token_id": 2, "eos_token_id": 1, "tie_word_embeddings": true}"#;
    let c = ModelConfig::from_json(text, "gemma3-d256").unwrap();
    assert_eq!(c.spec.layers[0].attention.window, Some(37));
    assert_eq!(c.spec.layers[1].attention.window, None);
    let mut w = crate::cpu::tests::weights(&c, true);
    for (i, lw) in w.layers.iter_mut().enumerate() {
        lw.input_norm.data = small(i, Extra::QBias, c.hidden_size, 0.4);
        lw.post_norm.data = small(i, Extra::KBias, c.hidden_size, 0.4);
        for (e, t) in lw.extras.iter_mut().filter(|(e, _)| e.is_norm()) {
            t.data = small(i, *e, t.data.len(), 0.4);
        }
    }
    w.norm.data = small(99, Extra::OBias, c.hidden_size, 0.4);
    (c, w)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_model_variants_match_the_cpu() {
    let (base, w0) = load(&synth_dir(Preset::TinyExtras));
    let kv = KvShape {
        num_blocks: 128,
        block_size: BS,
    };
    let mut gelu = base.clone();
    gelu.spec
        .layers
        .iter_mut()
        .for_each(|l| l.mlp.activation = Activation::GeluTanh);
    let (mut biased, mut wb) = (gelu.clone(), w0.clone());
    with_mlp_bias(&mut biased, &mut wb);
    let (mut gemma, mut wg) = (gelu.clone(), w0.clone());
    gemma_like(&mut gemma, &mut wg);
    let (gemma3, w3) = gemma3_d256();
    let cases = [
        ("qkv/o bias + qk-norm", base, w0.clone()),
        ("+ geglu", gelu, w0),
        ("+ mlp bias", biased, wb),
        ("+ gemma norms, scale, soft-cap, per-layer rope", gemma, wg),
        ("gemma 3: head_dim 256, windows, query scale", gemma3, w3),
    ];
    for (name, c, w) in cases {
        for deterministic in [false, true] {
            let opts = CudaOptions {
                deterministic,
                ..CudaOptions::default()
            };
            let mut gpu = CudaBackend::new(c.clone(), &w, kv, 0, opts).unwrap();
            let mut cpu = CpuBackend::new(c.clone(), w.clone(), kv).unwrap();
            let vocab = c.vocab_size;
            let mut pool = Pool::new(kv.num_blocks);
            let mut worst = (0.0f64, 0.0f64);
            for n in [7usize, 300] {
                let toks = tokens(n as u64 + 5, n, vocab);
                let blocks = pool.take(n);
                let (g, k) = (
                    chunk_logits(&mut gpu, &toks, 0, &blocks),
                    chunk_logits(&mut cpu, &toks, 0, &blocks),
                );
                worst = (
                    worst.0.max(rel_err(&g, &k)),
                    worst.1.max(max_lp_diff(&g, &k, vocab)),
                );
            }
            let prompt = tokens(99, 20, vocab);
            let blocks = pool.take(20 + 32);
            let (e, d) = generated_vs_cpu(&mut gpu, &mut cpu, &prompt, &blocks, 32, vocab);
            worst = (worst.0.max(e), worst.1.max(d));
            println!(
                "RESULT variant {name} (deterministic {deterministic}): rel err {:.3e}, max |dlogprob| {:.3}",
                worst.0, worst.1
            );
            assert!(worst.0 <= 3e-2 && worst.1 <= 0.2, "{name}: {worst:?}");
        }
    }
    // a field CUDA does not run is refused naming it, before the device opens
    let (mut c, w) = load(&synth_dir(Preset::TinyExtras));
    c.spec.layers[2].attention.logit_softcap = Some(50.0);
    let err = CudaBackend::new(c, &w, kv, 0, CudaOptions::default())
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("layers[2].attention.logit_softcap"), "{err}");
}

/// A Llama layer under a sliding window and a scale of its own runs the
/// fused GEMV layer (attention is its own kernel), and so do the fields
/// its epilogues take: QK-norm at heads the QKV GEMV's epilogue
/// normalises whole, the QKV bias, a norm weight offset, output norms and
/// GELU; only an O or MLP bias (or QK-norm of wider heads) sends a model
/// to the GEMM layer.
#[test]
fn family_fields_keep_the_gemv_layer() {
    use contract::Activation;
    let c = crate::cpu::tests::config(false);
    assert_eq!(c.spec.first_difference(&c.llama_spec()), None);
    let mut w = c.clone();
    let spec: &mut ModelSpec = &mut w.spec;
    spec.layers[1].attention.window = Some(9);
    spec.layers[1].attention.scale = 0.3;
    assert!(gemv_layer_runs(&c) && gemv_layer_runs(&w));
    w.spec.layers[1].attention.qk_norm = true;
    assert!(gemv_layer_runs(&w), "QK-norm at head_dim {}", w.head_dim);
    let mut wide = w.clone();
    wide.head_dim = 2 * kernels::consts::HADAMARD_MAX_DIM;
    assert!(!gemv_layer_runs(&wide));
    w.spec.layers[1].attention.qkv_bias = true;
    w.spec.norm_weight_offset = 1.0;
    w.spec.layers[0].mlp.activation = Activation::GeluTanh;
    (
        w.spec.layers[1].post_attention_norm,
        w.spec.layers[1].post_mlp_norm,
    ) = (true, true);
    assert!(gemv_layer_runs(&w));
    for change in [
        |s: &mut ModelSpec| s.layers[0].attention.o_bias = true,
        |s: &mut ModelSpec| s.layers[1].mlp.bias = true,
    ] {
        let mut b = w.clone();
        change(&mut b.spec);
        assert!(!gemv_layer_runs(&b));
    }
}
