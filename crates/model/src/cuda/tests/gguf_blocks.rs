//! A model in GGUF blocks on CUDA against the CPU backend on the same
//! blocks, by teacher-forced log-probabilities: three layers mixing every
//! block format the CUDA backend reads (fused QKV in Q4_K and in Q8_0, a
//! Q4_K_M-like QKV of Q4_K q/k and a Q6_K v, which runs widened), an LM
//! head tied to the embedding in Q6_K. Prompts of 7 and 40 tokens run on
//! the GEMM path (the block GEMM), decode on the GEMVs (both read the
//! blocks as they are). The bound is the same model's error in BF16 on
//! both backends (`quantised_vs_cpu_within_bf16`).

use super::*;
use checkpoint::gguf::GgmlType;
use checkpoint::projection::Projection;
use checkpoint::quantized::QuantTensor;
use checkpoint::weights::Tensor;
use cpu_kernels::quant::{QuantType, quantize_row};

/// Hidden 256, intermediate 512, 4 heads of 64: every projection's rows
/// are whole super-blocks.
fn config() -> ModelConfig {
    let text = r#"{"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300,
        "rms_norm_eps": 1e-5, "max_position_embeddings": 512, "rope_theta": 10000.0,
        "tie_word_embeddings": true}"#;
    ModelConfig::from_json(text, "test").unwrap()
}

fn rows(t: &Tensor) -> impl Iterator<Item = Vec<f32>> + '_ {
    (t.data.chunks_exact(t.shape[1])).map(|r| r.iter().map(|v| v.to_f32()).collect())
}

/// Q4_0 blocks of one row: `d = amax / 7`, codes `round(x / d) + 8`.
fn q4_0_row(row: &[f32], out: &mut Vec<u8>) {
    for b in row.chunks_exact(32) {
        let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = half::f16::from_f32(amax / 7.0);
        let inv = if d.to_f32() == 0.0 {
            0.0
        } else {
            1.0 / d.to_f32()
        };
        let code = |x: f32| ((x * inv).round() + 8.0).clamp(0.0, 15.0) as u8;
        out.extend_from_slice(&d.to_le_bytes());
        out.extend((0..16).map(|i| code(b[i]) | (code(b[i + 16]) << 4)));
    }
}

/// A Q5_K block from a Q4_K one: codes `2q + bit` (the bit from `seed`) at
/// half the scale `d`, so the weights stay near the Q4_K ones.
fn q5_k_of(q4: &[u8], seed: u64) -> Vec<u8> {
    let d = half::f16::from_le_bytes([q4[0], q4[1]]).to_f32() / 2.0;
    let mut out = half::f16::from_f32(d).to_le_bytes().to_vec();
    out.extend_from_slice(&q4[2..16]);
    let (mut qh, mut qs) = ([0u8; 32], [0u8; 128]);
    for (g, q) in q4[16..144].chunks_exact(32).enumerate() {
        for (l, &byte) in q.iter().enumerate() {
            for (half, nib) in [(0, byte & 0xF), (1, byte >> 4)] {
                let bit = (splitmix64(seed ^ (g * 64 + half * 32 + l) as u64) & 1) as u8;
                let code = 2 * nib + bit;
                qs[32 * g + l] |= (code & 0xF) << (4 * half);
                qh[l] |= (code >> 4) << (2 * g + half);
            }
        }
    }
    out.extend_from_slice(&qh);
    out.extend_from_slice(&qs);
    out
}

/// `t` in ggml type `ty` (from its BF16 values), and `t` holding the
/// blocks' values (as the store's import would hold them).
fn to_blocks(t: &Tensor, ty: GgmlType) -> (QuantTensor, Tensor) {
    let mut data = Vec::new();
    for (r, row) in rows(t).enumerate() {
        match ty {
            GgmlType::Q4_0 => q4_0_row(&row, &mut data),
            GgmlType::Q5_K => {
                let mut k4 = Vec::new();
                quantize_row(QuantType::Q4_K, &row, &mut k4);
                for (b, block) in k4.chunks_exact(144).enumerate() {
                    data.extend(q5_k_of(block, (r * 64 + b) as u64));
                }
            }
            _ => {
                let qt = match ty {
                    GgmlType::Q8_0 => QuantType::Q8_0,
                    GgmlType::Q4_1 => QuantType::Q4_1,
                    GgmlType::Q4_K => QuantType::Q4_K,
                    _ => QuantType::Q6_K,
                };
                quantize_row(qt, &row, &mut data);
            }
        }
    }
    let (r, c) = (t.shape[0], t.shape[1]);
    let values = checkpoint::gguf::dequantize(ty, &data, r * c).unwrap();
    let mut dense = t.clone();
    dense.data = values.iter().map(|&v| half::bf16::from_f32(v)).collect();
    let q = QuantTensor {
        name: t.name.clone(),
        rows: r,
        cols: c,
        ty,
        data,
    };
    (q, dense)
}

/// `p` (BF16) in blocks of `ty`: as blocks for CUDA; for the CPU as blocks
/// where it keeps `ty`, else as the blocks' BF16 values.
fn split(p: &Projection, ty: GgmlType) -> (Projection, Projection) {
    let t = p.as_bf16().expect("the test model starts in BF16");
    let (q, dense) = to_blocks(t, ty);
    let cpu = match crate::cpu::KEPT_GGML_TYPES.contains(&ty) {
        true => Projection::Blocks(q.clone()),
        false => Projection::Bf16(dense),
    };
    (Projection::Blocks(q), cpu)
}

/// The model's weights with its projections and head in blocks: CUDA's
/// (every projection in blocks) and the CPU's (blocks where it keeps the
/// type, else the blocks' values in BF16).
fn model() -> (ModelConfig, ModelWeights, ModelWeights) {
    use GgmlType::*;
    let c = config();
    let base = crate::cpu::tests::weights(&c, true);
    let (mut gpu, mut cpu) = (base.clone(), base);
    // per layer: q, k, v, o, gate, up, down
    let plan = [
        [Q4_K, Q4_K, Q4_K, Q5_K, Q6_K, Q6_K, Q4_K],
        [Q4_K, Q4_K, Q6_K, Q8_0, Q4_0, Q4_0, Q6_K],
        [Q8_0, Q8_0, Q8_0, Q4_1, Q5_K, Q5_K, Q4_1],
    ];
    for ((g, c), tys) in gpu.layers.iter_mut().zip(&mut cpu.layers).zip(plan) {
        let gs = [
            &mut g.q_proj,
            &mut g.k_proj,
            &mut g.v_proj,
            &mut g.o_proj,
            &mut g.gate_proj,
            &mut g.up_proj,
            &mut g.down_proj,
        ];
        let cs = [
            &mut c.q_proj,
            &mut c.k_proj,
            &mut c.v_proj,
            &mut c.o_proj,
            &mut c.gate_proj,
            &mut c.up_proj,
            &mut c.down_proj,
        ];
        for ((g, c), ty) in gs.into_iter().zip(cs).zip(tys) {
            (*g, *c) = split(g, ty);
        }
    }
    // a tied head in blocks is its own copy; the embedding keeps the
    // blocks' values
    let (head, embed) = to_blocks(&gpu.embed, Q6_K);
    for w in [&mut gpu, &mut cpu] {
        w.lm_head = Some(Projection::Blocks(head.clone()));
        w.embed = embed.clone();
    }
    (c, gpu, cpu)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_gguf_blocks_match_the_cpu_on_the_same_blocks() {
    let (cfg, gpu_w, cpu_w) = model();
    let name = quantised_vs_cpu_within_bf16(&cfg, &gpu_w, cpu_w, "gguf blocks");
    assert!(
        name.contains("gguf") && name.contains("q4k") && name.contains("q5k"),
        "{name}"
    );
}
