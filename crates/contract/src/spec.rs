//! The model description: what each decoder layer computes, beyond its
//! dimensions. A [`ModelSpec`] is part of every validated
//! [`ModelConfig`](crate::ModelConfig); backends, the weight loader and the
//! references read these fields and never an architecture's name (only
//! config parsing maps `architectures` / `model_type` to a spec).
//!
//! The layer every spec describes, for a residual stream `x`:
//!
//! ```text
//! h = norm(x) * (offset + w_in)                        input norm
//! q, k, v = h Wq (+bq), h Wk (+bk), h Wv (+bv)         attention.qkv_bias
//! q, k = norm_head(q), norm_head(k)                    attention.qk_norm (per head)
//! q, k = rope(q), rope(k)                              rope (per layer)
//! a = softmax(cap(q k^T * scale) + window mask) v      attention.{scale, logit_softcap, window}
//! o = a Wo (+bo)                                       attention.o_bias
//! x += post_attn_norm ? norm(o) : o                    post_attention_norm
//! h = norm(x)                                          pre-MLP norm
//! m = (act(h Wg) * (h Wu)) Wd  (+biases)               mlp
//! x += post_mlp_norm ? norm(m) : m                     post_mlp_norm
//! ```
//!
//! then `logits = cap(norm(x) * head)` with `final_logit_softcap`; the
//! embedding rows are multiplied by `embed_scale` first. Every norm is an
//! RMSNorm of the model's epsilon whose gain is `offset + w`
//! ([`ModelSpec::norm_weight_offset`]: 0 for Llama's `x * w`, 1 for
//! Gemma's `x * (1 + w)`). Llama 3.x is [`ModelSpec::llama`].

use crate::config::RopeScaling;

/// The MLP's activation (applied to the gate product, times the up product).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `x * sigmoid(x)` (SwiGLU).
    Silu,
    /// GELU with the tanh approximation (GeGLU, `gelu_pytorch_tanh`).
    GeluTanh,
}

impl Activation {
    /// The activation of a Hugging Face `hidden_act` / `hidden_activation`
    /// name, `None` when it is not one lamina runs.
    pub fn from_hf(name: &str) -> Option<Self> {
        match name {
            "silu" | "swish" => Some(Activation::Silu),
            "gelu_pytorch_tanh" | "gelu_tanh" => Some(Activation::GeluTanh),
            _ => None,
        }
    }

    /// The activation at `x`, in f64 (the references' definition).
    pub fn eval(self, x: f64) -> f64 {
        match self {
            Activation::Silu => x / (1.0 + (-x).exp()),
            Activation::GeluTanh => {
                let c = (2.0 / std::f64::consts::PI).sqrt();
                0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
            }
        }
    }
}

/// RoPE of one layer: its base and frequency scaling.
#[derive(Debug, Clone, PartialEq)]
pub struct Rope {
    pub theta: f64,
    pub scaling: RopeScaling,
}

/// A layer's attention.
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionSpec {
    /// Biases on the Q, K and V projections (Qwen2).
    pub qkv_bias: bool,
    /// A bias on the output projection.
    pub o_bias: bool,
    /// RMSNorm over each head of Q and of K before RoPE, with gains
    /// `[head_dim]` (Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// The scores' scale: `1 / sqrt(head_dim)` unless the model says
    /// otherwise (Gemma's `query_pre_attn_scalar`).
    pub scale: f64,
    /// `cap * tanh(score / cap)` on the scaled scores.
    pub logit_softcap: Option<f64>,
    /// Sliding window: a token sees itself and the `window - 1` positions
    /// before it; `None` sees the whole context.
    pub window: Option<usize>,
}

/// A layer's MLP: `down(act(gate(h)) * up(h))`.
#[derive(Debug, Clone, PartialEq)]
pub struct MlpSpec {
    pub activation: Activation,
    /// Biases on gate, up and down.
    pub bias: bool,
}

/// One decoder layer.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerSpec {
    pub attention: AttentionSpec,
    pub rope: Rope,
    pub mlp: MlpSpec,
    /// An RMSNorm on the attention output before the residual add (Gemma's
    /// `post_attention_layernorm`; the pre-MLP norm is separate then).
    pub post_attention_norm: bool,
    /// An RMSNorm on the MLP output before the residual add.
    pub post_mlp_norm: bool,
}

/// The whole model's description (see the module doc).
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSpec {
    /// The RMSNorm gain is `offset + w`.
    pub norm_weight_offset: f32,
    /// The embedding rows are multiplied by this (1: not scaled).
    pub embed_scale: f32,
    /// `cap * tanh(logit / cap)` on the final logits.
    pub final_logit_softcap: Option<f64>,
    pub layers: Vec<LayerSpec>,
}

impl ModelSpec {
    /// Llama 3.x (and Mistral without a window): plain RMSNorm, no biases,
    /// no QK-norm, SwiGLU, one RoPE for every layer.
    pub fn llama(num_layers: usize, head_dim: usize, rope: Rope) -> Self {
        let layer = LayerSpec {
            attention: AttentionSpec {
                qkv_bias: false,
                o_bias: false,
                qk_norm: false,
                scale: 1.0 / (head_dim as f64).sqrt(),
                logit_softcap: None,
                window: None,
            },
            rope,
            mlp: MlpSpec {
                activation: Activation::Silu,
                bias: false,
            },
            post_attention_norm: false,
            post_mlp_norm: false,
        };
        ModelSpec {
            norm_weight_offset: 0.0,
            embed_scale: 1.0,
            final_logit_softcap: None,
            layers: vec![layer; num_layers],
        }
    }

    /// The RoPE every layer shares, `None` when layers differ.
    pub fn uniform_rope(&self) -> Option<&Rope> {
        let first = &self.layers.first()?.rope;
        self.layers
            .iter()
            .all(|l| &l.rope == first)
            .then_some(first)
    }

    /// The window every layer attends within (the largest of the layers'
    /// windows), `None` when some layer sees the whole context (Gemma 3's
    /// global layers) or there are no layers: how far back a KV pool shared
    /// by all layers must keep a sequence's keys.
    pub fn kv_window(&self) -> Option<usize> {
        let windows = self.layers.iter().map(|l| l.attention.window);
        windows.collect::<Option<Vec<_>>>()?.into_iter().max()
    }

    /// The first field (by its path, e.g. `layers[3].attention.window`)
    /// where this spec differs from `other`, `None` when they are equal.
    pub fn first_difference(&self, other: &ModelSpec) -> Option<String> {
        if self.layers.len() != other.layers.len() {
            return Some("layers".into());
        }
        if self.norm_weight_offset != other.norm_weight_offset {
            return Some("norm_weight_offset".into());
        }
        if self.embed_scale != other.embed_scale {
            return Some("embed_scale".into());
        }
        if self.final_logit_softcap != other.final_logit_softcap {
            return Some("final_logit_softcap".into());
        }
        self.layers
            .iter()
            .zip(&other.layers)
            .enumerate()
            .find_map(|(i, (a, b))| layer_difference(a, b).map(|f| format!("layers[{i}].{f}")))
    }
}

/// The first field where layer `a` differs from `b`.
fn layer_difference(a: &LayerSpec, b: &LayerSpec) -> Option<&'static str> {
    let (x, y) = (&a.attention, &b.attention);
    [
        (x.qkv_bias != y.qkv_bias, "attention.qkv_bias"),
        (x.o_bias != y.o_bias, "attention.o_bias"),
        (x.qk_norm != y.qk_norm, "attention.qk_norm"),
        (x.scale != y.scale, "attention.scale"),
        (
            x.logit_softcap != y.logit_softcap,
            "attention.logit_softcap",
        ),
        (x.window != y.window, "attention.window"),
        (a.rope != b.rope, "rope"),
        (a.mlp.activation != b.mlp.activation, "mlp.activation"),
        (a.mlp.bias != b.mlp.bias, "mlp.bias"),
        (
            a.post_attention_norm != b.post_attention_norm,
            "post_attention_norm",
        ),
        (a.post_mlp_norm != b.post_mlp_norm, "post_mlp_norm"),
    ]
    .into_iter()
    .find_map(|(differs, field)| differs.then_some(field))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rope() -> Rope {
        Rope {
            theta: 10000.0,
            scaling: RopeScaling::None,
        }
    }

    #[test]
    fn llama_is_llama_and_each_field_is_named() {
        let l = ModelSpec::llama(3, 64, rope());
        let diff = |s: &ModelSpec| s.first_difference(&l);
        assert_eq!(diff(&l), None);
        assert!(l.uniform_rope().is_some());
        let mut b = l.clone();
        b.layers[2].attention.qkv_bias = true;
        assert_eq!(diff(&b).as_deref(), Some("layers[2].attention.qkv_bias"));
        let mut w = l.clone();
        w.layers[1].attention.window = Some(512);
        w.layers[1].rope.theta = 1e6;
        assert_eq!(diff(&w).as_deref(), Some("layers[1].attention.window"));
        assert!(w.uniform_rope().is_none());
        assert_eq!(w.kv_window(), None, "a global layer keeps every key");
        w.layers
            .iter_mut()
            .enumerate()
            .for_each(|(i, l)| l.attention.window = Some(10 + i));
        assert_eq!(w.kv_window(), Some(12));
        let mut g = l.clone();
        g.norm_weight_offset = 1.0;
        assert_eq!(diff(&g).as_deref(), Some("norm_weight_offset"));
    }

    #[test]
    fn activations_match_their_definitions() {
        assert!((Activation::Silu.eval(1.0) - 0.7310585786300049).abs() < 1e-15);
        // torch.nn.functional.gelu(torch.tensor(1.0, dtype=torch.float64), approximate="tanh")
        assert!((Activation::GeluTanh.eval(1.0) - 0.8411919906082768).abs() < 1e-15);
        assert_eq!(Activation::from_hf("silu"), Some(Activation::Silu));
        assert_eq!(
            Activation::from_hf("gelu_pytorch_tanh"),
            Some(Activation::GeluTanh)
        );
        assert_eq!(Activation::from_hf("relu"), None);
    }
}
