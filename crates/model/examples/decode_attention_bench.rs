//! Times the CPU fast path's decode step at a long context, per KV cache
//! dtype, on a model of SmolLM2-135M's attention shapes (9 query heads, 3
//! KV heads of 64) with few layers and a small vocabulary, so the step is
//! mostly attention: `cargo run --release -p model --example
//! decode_attention_bench -- CONTEXT [LAYERS]`. Prints the fastest and the
//! median of 30 decode steps for each of f32, bf16 and fp8 K/V (the
//! fastest is the figure on a shared machine).

use checkpoint::Projection;
use checkpoint::weights::{LayerWeights, ModelWeights, Tensor};
use contract::backend::KvShape;
use contract::{Backend, KvCacheDtype, ModelConfig};
use half::bf16;
use model::cpu::batch::{SeqChunk, build_step, contiguous_blocks};
use model::cpu::{CpuBackend, CpuPath};
use std::time::Instant;

fn tensor(shape: &[usize], seed: u64) -> Tensor {
    let n: usize = shape.iter().product();
    let data = (0..n as u64)
        .map(|i| {
            let u = contract::sampling::splitmix64(i ^ seed.wrapping_mul(0x9E37)) >> 40;
            bf16::from_f32((u as f32 / (1u32 << 24) as f32 - 0.5) * 0.1)
        })
        .collect();
    Tensor {
        name: format!("t{seed}"),
        shape: shape.to_vec(),
        data,
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse())
        .collect::<Result<_, _>>()?;
    let ctx = args.first().copied().unwrap_or(4096);
    let layers = args.get(1).copied().unwrap_or(4);
    let c = ModelConfig::from_json(
        &format!(
            r#"{{"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": {layers},
            "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 256,
            "rms_norm_eps": 1e-5, "max_position_embeddings": {}, "rope_theta": 100000.0,
            "tie_word_embeddings": true}}"#,
            ctx + 64
        ),
        "bench",
    )?;
    let (h, q, kv, i) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
    let w = ModelWeights {
        embed: tensor(&[c.vocab_size, h], 1),
        layers: (0..layers as u64)
            .map(|l| LayerWeights {
                input_norm: tensor(&[h], 10 * l + 2),
                q_proj: Projection::Bf16(tensor(&[q, h], 10 * l + 3)),
                k_proj: Projection::Bf16(tensor(&[kv, h], 10 * l + 4)),
                v_proj: Projection::Bf16(tensor(&[kv, h], 10 * l + 5)),
                o_proj: Projection::Bf16(tensor(&[h, q], 10 * l + 6)),
                post_norm: tensor(&[h], 10 * l + 7),
                gate_proj: Projection::Bf16(tensor(&[i, h], 10 * l + 8)),
                up_proj: Projection::Bf16(tensor(&[i, h], 10 * l + 9)),
                down_proj: Projection::Bf16(tensor(&[h, i], 10 * l + 10)),
                extras: Default::default(),
            })
            .collect(),
        norm: tensor(&[h], 3),
        lm_head: None,
        kv_scales: None,
    };
    let bs = 16;
    let kv_shape = KvShape {
        num_blocks: (ctx + 64).div_ceil(bs),
        block_size: bs,
    };
    let blocks = contiguous_blocks(0, ctx + 64, bs);
    let chunk = |tokens: Vec<u32>, start: usize| SeqChunk {
        prompt_len: 0,
        tokens,
        start,
        blocks: blocks.clone(),
        sample: None,
    };
    for dtype in [KvCacheDtype::F32, KvCacheDtype::Bf16, KvCacheDtype::Fp8] {
        let mut b = CpuBackend::with_path(c.clone(), w.clone(), kv_shape, CpuPath::Fast)?
            .with_kv_cache_dtype(dtype);
        for start in (0..ctx).step_by(512) {
            let toks = (start..(start + 512).min(ctx)).map(|p| (p % 256) as u32);
            b.logits(&build_step(&[chunk(toks.collect(), start)], bs)?, &[])?;
        }
        let mut times = Vec::new();
        for s in 0..30 {
            let step = build_step(&[chunk(vec![7], ctx + s)], bs)?;
            let t0 = Instant::now();
            b.logits(&step, &[0])?;
            times.push(t0.elapsed().as_secs_f64() * 1e3);
        }
        times.sort_by(f64::total_cmp);
        println!(
            "context {ctx}, {layers} layers, {dtype} K/V: decode step {:.3} ms fastest, {:.3} ms median",
            times[0], times[15]
        );
    }
    Ok(())
}
