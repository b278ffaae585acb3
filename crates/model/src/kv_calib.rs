//! Calibrated FP8 KV cache scales: the largest magnitude of each layer's
//! K (after RoPE) and V over calibration text, per KV head.
//!
//! Contract: [`kv_amax`] runs the model as given (each projection's BF16
//! values, `checkpoint::Projection::dense`: an FP8 one's dequantised
//! values, which is what the CPU backend runs; f32 arithmetic, the CPU backend's operations and
//! the calibration pass of [`crate::gptq`]) over calibration tokens cut
//! into windows, each a sequence from position 0, and returns for every
//! layer and KV head the largest `|k|` and `|v|` the cache would store
//! (`|k|` plain or Hadamard-rotated, whichever is larger).
//! [`KvAmax::scales`] turns them into the checkpoint's scales as
//! llm-compressor's min-max observer does: `amax / 448` (e4m3's largest
//! value), so the largest value seen is stored at e4m3's top and the
//! smallest ones stay above its subnormal range. Bad input (no tokens, a
//! token outside the vocabulary, a window beyond the model's context,
//! weights that do not match the config, a spec other than Llama's layer,
//! activations that are not finite)
//! is a [`GptqError`] naming the cause, never a panic.
//!
//! Costs: one forward pass over the `N` tokens (the projections' `2 N
//! (hidden (q + 2 kv + 2 inter) + q hidden + inter hidden)` flops and
//! attention); memory: the activations of one layer of all `N` tokens.

use checkpoint::projection::Projection;
use checkpoint::weights::{LayerWeights, ModelWeights};
use contract::KvScales;
use contract::config::ModelConfig;
use cpu_kernels::{Isa, Scratch, matmul_bf16};
use ops::activation::silu_mul;
use ops::embedding::embed;
use ops::linear::add_assign;
use ops::norm::rms_norm;
use ops::{AttnDims, Rope};

use crate::gptq::GptqError;
use crate::gptq::attention::causal_attention;
use crate::gptq::sequential::{check_tokens, windows};

/// e4m3's largest finite value: the stored magnitude of the largest
/// calibrated value.
pub const E4M3_MAX: f32 = 448.0;

/// The largest `|k|` (after RoPE) and `|v|` per layer and KV head.
#[derive(Debug, Clone, PartialEq)]
pub struct KvAmax {
    pub k: Vec<Vec<f32>>, // [layers][kv_heads]
    pub v: Vec<Vec<f32>>, // [layers][kv_heads]
}

impl KvAmax {
    /// The FP8 KV cache scales `amax / 448`, one per layer (the largest
    /// over its heads); a layer whose values are all zero gets scale 1.
    pub fn scales(&self) -> KvScales {
        let per_layer = |a: &[Vec<f32>]| -> Vec<f32> {
            a.iter()
                .map(|heads| scale_of(heads.iter().copied().fold(0.0, f32::max)))
                .collect()
        };
        KvScales {
            k: per_layer(&self.k),
            v: per_layer(&self.v),
        }
    }
}

/// `amax / 448`, or 1 when nothing was seen.
fn scale_of(amax: f32) -> f32 {
    if amax > 0.0 && amax.is_finite() {
        amax / E4M3_MAX
    } else {
        1.0
    }
}

/// The largest K and V magnitudes of `weights` over `tokens`, cut into
/// windows of `window` tokens.
pub fn kv_amax(
    config: &ModelConfig,
    weights: &ModelWeights,
    tokens: &[u32],
    window: usize,
) -> Result<KvAmax, GptqError> {
    crate::cpu::check_weights(config, weights).map_err(|e| GptqError::Weights(e.to_string()))?;
    // the calibration pass runs Llama's layer
    if let Some(field) = config.spec.first_difference(&config.llama_spec()) {
        return Err(GptqError::Weights(format!(
            "the model's `{field}` is not supported by KV-scale calibration (it runs Llama's layer)"
        )));
    }
    check_tokens(config, tokens, window)?;
    let (positions, cu_seqlens) = windows(tokens.len(), window);
    let pass = Pass {
        config,
        rope: Rope::new(config, window.min(tokens.len())),
        positions,
        cu_seqlens,
        isa: Isa::best(),
    };
    let mut x = embed(&weights.embed.data, tokens, config.hidden_size); // [N, hidden]
    let mut amax = KvAmax {
        k: Vec::with_capacity(weights.layers.len()),
        v: Vec::with_capacity(weights.layers.len()),
    };
    for lw in &weights.layers {
        let (k, v) = pass.layer(lw, &mut x)?;
        amax.k.push(k);
        amax.v.push(v);
    }
    Ok(amax)
}

struct Pass<'a> {
    config: &'a ModelConfig,
    rope: Rope,
    positions: Vec<u32>,  // [N]
    cu_seqlens: Vec<u32>, // [S + 1]
    isa: Isa,
}

impl Pass<'_> {
    /// Runs layer `lw` on `x` (`[N, hidden]`, replaced by the layer's
    /// output); returns its per-head K and V maxima.
    fn layer(&self, lw: &LayerWeights, x: &mut [f32]) -> Result<(Vec<f32>, Vec<f32>), GptqError> {
        let c = self.config;
        let (hidden, q_dim, kv_dim) = (c.hidden_size, c.q_dim(), c.kv_dim());
        let (inter, eps) = (c.intermediate_size, c.rms_norm_eps);
        let h = rms_norm(x, &lw.input_norm.to_f32(), eps);
        let mut q = self.project(&h, &lw.q_proj, hidden, q_dim)?;
        let mut k = self.project(&h, &lw.k_proj, hidden, kv_dim)?;
        let v = self.project(&h, &lw.v_proj, hidden, kv_dim)?;
        self.rope.apply_rows(&mut q, q_dim, &self.positions);
        self.rope.apply_rows(&mut k, kv_dim, &self.positions);
        let amax = (self.key_amax(&k, lw)?, self.head_amax(&v, &lw.v_proj)?);
        let dims = AttnDims {
            heads: c.num_heads,
            kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
        };
        let o = causal_attention(self.isa, &q, &k, &v, &self.cu_seqlens, dims);
        add_assign(x, &self.project(&o, &lw.o_proj, q_dim, hidden)?);
        let h = rms_norm(x, &lw.post_norm.to_f32(), eps);
        let mut gate = self.project(&h, &lw.gate_proj, hidden, inter)?;
        let up = self.project(&h, &lw.up_proj, hidden, inter)?;
        silu_mul(&mut gate, &up);
        add_assign(x, &self.project(&gate, &lw.down_proj, inter, hidden)?);
        Ok(amax)
    }

    /// The largest `|k|` of each KV head over `k` (`[N, kv_dim]`, after
    /// RoPE) as stored plain or Hadamard-rotated (an FP8 cache at
    /// calibrated scales may rotate its keys, [`ops::hadamard`]): the scale
    /// holds either way without saturating.
    fn key_amax(&self, k: &[f32], lw: &LayerWeights) -> Result<Vec<f32>, GptqError> {
        let plain = self.head_amax(k, &lw.k_proj)?;
        let hd = self.config.head_dim;
        if !ops::hadamard::rotatable(hd) {
            return Ok(plain);
        }
        let mut rotated = k.to_vec();
        ops::hadamard::rotate_heads(&mut rotated, hd);
        let rotated = self.head_amax(&rotated, &lw.k_proj)?;
        Ok(plain.iter().zip(&rotated).map(|(a, b)| a.max(*b)).collect())
    }

    /// The largest magnitude of each KV head's columns of `rows`
    /// (`[N, kv_dim]`, the output of `t`); refused when one is not finite.
    fn head_amax(&self, rows: &[f32], t: &Projection) -> Result<Vec<f32>, GptqError> {
        let (kv_heads, hd) = (self.config.num_kv_heads, self.config.head_dim);
        let mut amax = vec![0f32; kv_heads];
        for row in rows.chunks_exact(kv_heads * hd) {
            for (m, head) in amax.iter_mut().zip(row.chunks_exact(hd)) {
                for &x in head {
                    if !x.is_finite() {
                        return Err(GptqError::NonFiniteOutput {
                            tensor: t.name().to_string(),
                        });
                    }
                    *m = m.max(x.abs());
                }
            }
        }
        Ok(amax)
    }

    /// `x W^T` (`x` `[N, inp]`, result `[N, out]`) over `w`'s BF16 values.
    fn project(
        &self,
        x: &[f32],
        w: &Projection,
        inp: usize,
        out: usize,
    ) -> Result<Vec<f32>, GptqError> {
        let w = w.dense()?;
        let mut y = vec![0f32; x.len() / inp * out];
        matmul_bf16(
            self.isa,
            x,
            &w.data,
            inp,
            out,
            &mut y,
            &mut Scratch::default(),
        );
        Ok(y)
    }
}

#[cfg(test)]
mod tests;
