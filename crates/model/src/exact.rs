//! An f64 forward pass over given weight values: the exact reference the
//! tests hold the backends to (for tests only: `cfg(test)` or the
//! `testing` feature).
//!
//! Contract: [`forward`] returns the `[position][vocab]` logits of `tokens`
//! run as one sequence from position 0, by the textbook formulas in f64
//! for the layer the config's [`ModelSpec`](contract::ModelSpec) describes
//! (RMSNorm with the spec's gain offset, biases, per-head QK-norm, each
//! layer's RoPE on rotate-half pairs, causal softmax attention over grouped
//! KV heads with the spec's scale, soft-cap and window, the gated MLP's
//! activation, output norms, embedding scale and final soft-cap), over
//! [`ExactWeights`] in Hugging Face layout. Deliberately independent of the
//! backends: it reads the spec's fields directly. Every dot product sums in
//! increasing index order.
//!
//! Costs: `O(T² · layers · hidden)` plus `O(T · parameters)`, with a copy
//! of every weight in f64: for tiny models.

use checkpoint::projection::{FormatError, Projection};
use checkpoint::weights::{Extra, ModelWeights, Tensor};
use contract::ModelConfig;
use contract::lora::{LoraAdapter, LoraTarget};
use std::collections::BTreeMap;

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
    /// The spec's extra tensors (biases, QK-norm and output-norm gains).
    pub extras: BTreeMap<Extra, Vec<f64>>,
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
    /// `w`'s tensors through `values` (e.g. their BF16 values widened),
    /// each projection as its BF16 values ([`Projection::dense`]: an error
    /// naming it when its blocks do not decode).
    pub fn from_weights(
        w: &ModelWeights,
        values: impl Fn(&Tensor) -> Vec<f64>,
    ) -> Result<Self, FormatError> {
        let p = |p: &Projection| p.dense().map(|t| values(&t));
        Ok(ExactWeights {
            embed: values(&w.embed),
            layers: w
                .layers
                .iter()
                .map(|l| {
                    Ok(ExactLayer {
                        input_norm: values(&l.input_norm),
                        q: p(&l.q_proj)?,
                        k: p(&l.k_proj)?,
                        v: p(&l.v_proj)?,
                        o: p(&l.o_proj)?,
                        post_norm: values(&l.post_norm),
                        gate: p(&l.gate_proj)?,
                        up: p(&l.up_proj)?,
                        down: p(&l.down_proj)?,
                        extras: l.extras.iter().map(|(&e, t)| (e, values(t))).collect(),
                    })
                })
                .collect::<Result<_, FormatError>>()?,
            norm: values(&w.norm),
            head: values(w.head_dense()?.as_ref()),
        })
    }

    /// The tensors `values` gives for `c`'s Hugging Face names (the head
    /// as `lm_head.weight`).
    pub fn from_names(c: &ModelConfig, values: impl Fn(&str) -> Vec<f64>) -> Self {
        ExactWeights {
            embed: values("model.embed_tokens.weight"),
            layers: (c.spec.layers.iter().enumerate())
                .map(|(l, ls)| {
                    let w = |n: &str| values(&format!("model.layers.{l}.{n}"));
                    ExactLayer {
                        input_norm: w("input_layernorm.weight"),
                        q: w("self_attn.q_proj.weight"),
                        k: w("self_attn.k_proj.weight"),
                        v: w("self_attn.v_proj.weight"),
                        o: w("self_attn.o_proj.weight"),
                        post_norm: w(checkpoint::weights::mlp_norm_suffix(ls)),
                        gate: w("mlp.gate_proj.weight"),
                        up: w("mlp.up_proj.weight"),
                        down: w("mlp.down_proj.weight"),
                        extras: (Extra::ALL.into_iter().filter(|e| e.wanted(ls)))
                            .map(|e| (e, w(e.hf_suffix())))
                            .collect(),
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

/// `x W^T (+ b)` for row-major `m` (`[out, x.len()]`).
fn mm(x: &[f64], m: &[f64], bias: Option<&Vec<f64>>) -> Vec<f64> {
    let mut y: Vec<f64> = m
        .chunks_exact(x.len())
        .map(|r| (0..x.len()).map(|k| x[k] * r[k]).sum())
        .collect();
    if let Some(b) = bias {
        y.iter_mut().zip(b).for_each(|(y, b)| *y += b);
    }
    y
}

/// RMSNorm of `x` with gains `offset + g`.
fn rms(x: &[f64], g: &[f64], eps: f64, offset: f64) -> Vec<f64> {
    let inv = 1.0 / (x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64 + eps).sqrt();
    x.iter()
        .zip(g)
        .map(|(v, g)| v * inv * (offset + g))
        .collect()
}

/// `cap * tanh(v / cap)`, or `v` without a cap.
fn softcap(v: f64, cap: Option<f64>) -> f64 {
    cap.map_or(v, |c| c * (v / c).tanh())
}

/// The logits of `tokens` (see the module doc).
pub fn forward(c: &ModelConfig, w: &ExactWeights, tokens: &[u32]) -> Vec<Vec<f64>> {
    let spec = &c.spec;
    let (eps, offset) = (c.rms_norm_eps as f64, spec.norm_weight_offset as f64);
    let norm = |x: &[f64], g: &[f64]| rms(x, g, eps, offset);
    let (hd, nh, nkv) = (c.head_dim, c.num_heads, c.num_kv_heads);
    let h = c.hidden_size;
    let mut xs: Vec<Vec<f64>> = tokens
        .iter()
        .map(|&t| {
            let row = &w.embed[t as usize * h..][..h];
            row.iter().map(|v| v * spec.embed_scale as f64).collect()
        })
        .collect();
    for (lw, ls) in w.layers.iter().zip(&spec.layers) {
        let at = &ls.attention;
        let x_of = |e: Extra| lw.extras.get(&e);
        let inv = ls.rope.inv_freq(hd);
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
        let head_norm = |x: &mut Vec<f64>, e: Extra| {
            if let Some(g) = x_of(e) {
                *x = x.chunks(hd).flat_map(|head| norm(head, g)).collect();
            }
        };
        let mut ks = Vec::new();
        let mut vs = Vec::new();
        let mut qs = Vec::new();
        for (p, x) in xs.iter().enumerate() {
            let n = norm(x, &lw.input_norm);
            let mut q = mm(&n, &lw.q, x_of(Extra::QBias));
            let mut k = mm(&n, &lw.k, x_of(Extra::KBias));
            head_norm(&mut q, Extra::QNorm);
            head_norm(&mut k, Extra::KNorm);
            rope(&mut q, p);
            rope(&mut k, p);
            qs.push(q);
            ks.push(k);
            vs.push(mm(&n, &lw.v, x_of(Extra::VBias)));
        }
        for (p, x) in xs.iter_mut().enumerate() {
            let first = at.window.map_or(0, |win| (p + 1).saturating_sub(win));
            let mut o = vec![0f64; nh * hd];
            for hh in 0..nh {
                let g = hh / (nh / nkv);
                let sc: Vec<f64> = (first..=p)
                    .map(|j| {
                        let dot = (0..hd)
                            .map(|d| qs[p][hh * hd + d] * ks[j][g * hd + d])
                            .sum::<f64>();
                        softcap(dot * at.scale, at.logit_softcap)
                    })
                    .collect();
                let m = sc.iter().copied().fold(f64::MIN, f64::max);
                let e: Vec<f64> = sc.iter().map(|s| (s - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for (j, ej) in (first..=p).zip(&e) {
                    for d in 0..hd {
                        o[hh * hd + d] += ej / z * vs[j][g * hd + d];
                    }
                }
            }
            let mut attn = mm(&o, &lw.o, x_of(Extra::OBias));
            if let Some(g) = x_of(Extra::AttnOutNorm) {
                attn = norm(&attn, g);
            }
            x.iter_mut().zip(&attn).for_each(|(a, b)| *a += b);
            let n = norm(x, &lw.post_norm);
            let gt = mm(&n, &lw.gate, x_of(Extra::GateBias));
            let up = mm(&n, &lw.up, x_of(Extra::UpBias));
            let act: Vec<f64> = gt
                .iter()
                .zip(&up)
                .map(|(&g, u)| ls.mlp.activation.eval(g) * u)
                .collect();
            let mut down = mm(&act, &lw.down, x_of(Extra::DownBias));
            if let Some(g) = x_of(Extra::MlpOutNorm) {
                down = norm(&down, g);
            }
            x.iter_mut().zip(&down).for_each(|(a, b)| *a += b);
        }
    }
    xs.iter()
        .map(|x| {
            let logits = mm(&norm(x, &w.norm), &w.head, None);
            logits
                .into_iter()
                .map(|v| softcap(v, spec.final_logit_softcap))
                .collect()
        })
        .collect()
}
