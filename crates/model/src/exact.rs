//! An f64 forward pass over given weight values: the exact reference the
//! tests hold the backends to (for tests only: `cfg(test)` or the
//! `testing` feature).
//!
//! Contract: [`forward`] returns the `[position][vocab]` logits of `tokens`
//! run as one sequence from position 0, by the textbook formulas in f64
//! (RMSNorm, RoPE with `c.rope_inv_freq()` on rotate-half pairs, causal
//! softmax attention over grouped KV heads, SwiGLU), over [`ExactWeights`]
//! in Hugging Face layout. Every dot product sums in increasing index
//! order.
//!
//! Costs: `O(T² · layers · hidden)` plus `O(T · parameters)`, with a copy
//! of every weight in f64: for tiny models.

use checkpoint::weights::{ModelWeights, Tensor};
use contract::ModelConfig;
use contract::lora::{LoraAdapter, LoraTarget};

/// One decoder layer's tensors, row-major.
pub struct ExactLayer {
    pub input_norm: Vec<f64>,
    pub q: Vec<f64>,
    pub k: Vec<f64>,
    pub v: Vec<f64>,
    pub o: Vec<f64>,
    pub post_norm: Vec<f64>,
    pub gate: Vec<f64>,
    pub up: Vec<f64>,
    pub down: Vec<f64>,
}

/// A whole model's tensors, row-major.
pub struct ExactWeights {
    pub embed: Vec<f64>,
    pub layers: Vec<ExactLayer>,
    pub norm: Vec<f64>,
    /// `[vocab, hidden]` (the embedding again when tied).
    pub head: Vec<f64>,
}

impl ExactWeights {
    /// `w`'s tensors through `values` (e.g. their BF16 values widened).
    pub fn from_weights(w: &ModelWeights, values: impl Fn(&Tensor) -> Vec<f64>) -> Self {
        ExactWeights {
            embed: values(&w.embed),
            layers: w
                .layers
                .iter()
                .map(|l| ExactLayer {
                    input_norm: values(&l.input_norm),
                    q: values(&l.q_proj),
                    k: values(&l.k_proj),
                    v: values(&l.v_proj),
                    o: values(&l.o_proj),
                    post_norm: values(&l.post_norm),
                    gate: values(&l.gate_proj),
                    up: values(&l.up_proj),
                    down: values(&l.down_proj),
                })
                .collect(),
            norm: values(&w.norm),
            head: values(w.head()),
        }
    }

    /// The tensors `values` gives for `c`'s Hugging Face names (the head
    /// as `lm_head.weight`).
    pub fn from_names(c: &ModelConfig, values: impl Fn(&str) -> Vec<f64>) -> Self {
        ExactWeights {
            embed: values("model.embed_tokens.weight"),
            layers: (0..c.num_layers)
                .map(|l| {
                    let w = |n: &str| values(&format!("model.layers.{l}.{n}.weight"));
                    ExactLayer {
                        input_norm: w("input_layernorm"),
                        q: w("self_attn.q_proj"),
                        k: w("self_attn.k_proj"),
                        v: w("self_attn.v_proj"),
                        o: w("self_attn.o_proj"),
                        post_norm: w("post_attention_layernorm"),
                        gate: w("mlp.gate_proj"),
                        up: w("mlp.up_proj"),
                        down: w("mlp.down_proj"),
                    }
                })
                .collect(),
            norm: values("model.norm.weight"),
            head: values("lm_head.weight"),
        }
    }

    /// Merges LoRA `adapter` into the weights: `W += scale * B A` in f64
    /// for every pair it has (the reference a backend's per-row deltas
    /// are held to).
    pub fn merge_lora(&mut self, c: &ModelConfig, adapter: &LoraAdapter) {
        let r = adapter.rank;
        for (layer, la) in self.layers.iter_mut().zip(&adapter.layers) {
            for t in LoraTarget::ALL {
                let Some(p) = la.pair(t) else { continue };
                let (i, o) = t.dims(c);
                let w = match t {
                    LoraTarget::Q => &mut layer.q,
                    LoraTarget::K => &mut layer.k,
                    LoraTarget::V => &mut layer.v,
                    LoraTarget::O => &mut layer.o,
                    LoraTarget::Gate => &mut layer.gate,
                    LoraTarget::Up => &mut layer.up,
                    LoraTarget::Down => &mut layer.down,
                };
                for row in 0..o {
                    for col in 0..i {
                        let d: f64 = (0..r)
                            .map(|k| p.b[row * r + k] as f64 * p.a[k * i + col] as f64)
                            .sum();
                        w[row * i + col] += adapter.scale as f64 * d;
                    }
                }
            }
        }
    }
}

/// The logits of `tokens` (see the module doc).
pub fn forward(c: &ModelConfig, w: &ExactWeights, tokens: &[u32]) -> Vec<Vec<f64>> {
    let mm = |x: &[f64], m: &[f64]| -> Vec<f64> {
        m.chunks_exact(x.len())
            .map(|r| (0..x.len()).map(|k| x[k] * r[k]).sum())
            .collect()
    };
    let rms = |x: &[f64], g: &[f64]| -> Vec<f64> {
        let inv = 1.0
            / (x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64 + c.rms_norm_eps as f64)
                .sqrt();
        x.iter().zip(g).map(|(v, g)| v * inv * g).collect()
    };
    let (hd, nh, nkv) = (c.head_dim, c.num_heads, c.num_kv_heads);
    let inv = c.rope_inv_freq();
    let rope = |x: &mut [f64], p: usize| {
        for head in x.chunks_mut(hd) {
            for i in 0..hd / 2 {
                let (s, co) = (p as f64 * inv[i]).sin_cos();
                let (a, b) = (head[i], head[i + hd / 2]);
                head[i] = a * co - b * s;
                head[i + hd / 2] = b * co + a * s;
            }
        }
    };
    let h = c.hidden_size;
    let mut xs: Vec<Vec<f64>> = tokens
        .iter()
        .map(|&t| w.embed[t as usize * h..][..h].to_vec())
        .collect();
    for lw in &w.layers {
        let mut ks = Vec::new();
        let mut vs = Vec::new();
        let mut qs = Vec::new();
        for (p, x) in xs.iter().enumerate() {
            let n = rms(x, &lw.input_norm);
            let (mut q, mut k) = (mm(&n, &lw.q), mm(&n, &lw.k));
            rope(&mut q, p);
            rope(&mut k, p);
            qs.push(q);
            ks.push(k);
            vs.push(mm(&n, &lw.v));
        }
        for (p, x) in xs.iter_mut().enumerate() {
            let mut o = vec![0f64; nh * hd];
            for hh in 0..nh {
                let g = hh / (nh / nkv);
                let sc: Vec<f64> = (0..=p)
                    .map(|j| {
                        (0..hd)
                            .map(|d| qs[p][hh * hd + d] * ks[j][g * hd + d])
                            .sum::<f64>()
                            / (hd as f64).sqrt()
                    })
                    .collect();
                let m = sc.iter().copied().fold(f64::MIN, f64::max);
                let e: Vec<f64> = sc.iter().map(|s| (s - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for (j, ej) in e.iter().enumerate() {
                    for d in 0..hd {
                        o[hh * hd + d] += ej / z * vs[j][g * hd + d];
                    }
                }
            }
            for (a, b) in x.iter_mut().zip(mm(&o, &lw.o)) {
                *a += b;
            }
            let n = rms(x, &lw.post_norm);
            let (gt, up) = (mm(&n, &lw.gate), mm(&n, &lw.up));
            let act: Vec<f64> = gt
                .iter()
                .zip(&up)
                .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                .collect();
            for (a, b) in x.iter_mut().zip(mm(&act, &lw.down)) {
                *a += b;
            }
        }
    }
    xs.iter().map(|x| mm(&rms(x, &w.norm), &w.head)).collect()
}
