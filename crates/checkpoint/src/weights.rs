//! Model weights in Hugging Face names and layout: embedding, norms and
//! biases as BF16, each projection (and an untied LM head) a
//! [`Projection`] in the format it was stored or quantised in.
//!
//! Contract: a [`ModelWeights`] exists only after every expected tensor was
//! found and checked for dtype and shape against the [`contract::ModelConfig`]
//! and its spec (see `loader`), so backends index it without further
//! checks: a layer holds the nine tensors every layer has and exactly the
//! [`Extra`] ones its spec asks for (biases, QK-norm, output norms). Matrices are
//! row-major `[out_features, in_features]`, exactly as in the safetensors
//! files (Q/K rows in Hugging Face's rotate-half order).

use contract::ModelConfig;
use contract::spec::LayerSpec;
use half::bf16;
use std::borrow::Cow;
use std::collections::BTreeMap;

use crate::projection::{FormatError, Projection};

/// The largest magnitude a plausible weight has. Trained Llama-family
/// checkpoints stay within a few hundred (norm gains and the rare outlier
/// weight included); a value past this is damage or an attack, and runs
/// the activations out of range (every logit equal). Checked at load with
/// NaN and the infinities.
pub const MAX_ABS_WEIGHT: f32 = 1e4;

/// Whether `x` is NaN, infinite or beyond [`MAX_ABS_WEIGHT`].
pub fn implausible(x: f32) -> bool {
    x.is_nan() || x.abs() > MAX_ABS_WEIGHT
}

/// A dense row-major BF16 tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    /// Hugging Face tensor name, e.g. `model.layers.0.self_attn.q_proj.weight`.
    pub name: String,
    pub shape: Vec<usize>,
    pub data: Vec<bf16>,
}

impl Tensor {
    /// Number of elements (product of `shape`).
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Copies the tensor to f32 (for norms and small vectors).
    pub fn to_f32(&self) -> Vec<f32> {
        self.data.iter().map(|x| x.to_f32()).collect()
    }
}

/// A layer tensor beyond the nine every layer has, present exactly when
/// the layer's [`LayerSpec`] asks for it. The one table of these roles:
/// their Hugging Face names, shapes and the spec field that asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Extra {
    QBias,
    KBias,
    VBias,
    OBias,
    /// Per-head RMSNorm gains of Q, `[head_dim]`.
    QNorm,
    KNorm,
    GateBias,
    UpBias,
    DownBias,
    /// RMSNorm of the attention output before the residual add.
    AttnOutNorm,
    /// RMSNorm of the MLP output before the residual add.
    MlpOutNorm,
}

impl Extra {
    pub const ALL: [Extra; 11] = [
        Extra::QBias,
        Extra::KBias,
        Extra::VBias,
        Extra::OBias,
        Extra::QNorm,
        Extra::KNorm,
        Extra::GateBias,
        Extra::UpBias,
        Extra::DownBias,
        Extra::AttnOutNorm,
        Extra::MlpOutNorm,
    ];

    /// Whether layer spec `l` has this tensor.
    pub fn wanted(self, l: &LayerSpec) -> bool {
        match self {
            Extra::QBias | Extra::KBias | Extra::VBias => l.attention.qkv_bias,
            Extra::OBias => l.attention.o_bias,
            Extra::QNorm | Extra::KNorm => l.attention.qk_norm,
            Extra::GateBias | Extra::UpBias | Extra::DownBias => l.mlp.bias,
            Extra::AttnOutNorm => l.post_attention_norm,
            Extra::MlpOutNorm => l.post_mlp_norm,
        }
    }

    /// The spec field that asks for it (for errors).
    pub fn field(self) -> &'static str {
        match self {
            Extra::QBias | Extra::KBias | Extra::VBias => "attention.qkv_bias",
            Extra::OBias => "attention.o_bias",
            Extra::QNorm | Extra::KNorm => "attention.qk_norm",
            Extra::GateBias | Extra::UpBias | Extra::DownBias => "mlp.bias",
            Extra::AttnOutNorm => "post_attention_norm",
            Extra::MlpOutNorm => "post_mlp_norm",
        }
    }

    /// The name after `model.layers.N.`.
    pub fn hf_suffix(self) -> &'static str {
        match self {
            Extra::QBias => "self_attn.q_proj.bias",
            Extra::KBias => "self_attn.k_proj.bias",
            Extra::VBias => "self_attn.v_proj.bias",
            Extra::OBias => "self_attn.o_proj.bias",
            Extra::QNorm => "self_attn.q_norm.weight",
            Extra::KNorm => "self_attn.k_norm.weight",
            Extra::GateBias => "mlp.gate_proj.bias",
            Extra::UpBias => "mlp.up_proj.bias",
            Extra::DownBias => "mlp.down_proj.bias",
            // (Gemma's names: its pre-MLP norm is then `pre_feedforward_layernorm`)
            Extra::AttnOutNorm => "post_attention_layernorm.weight",
            Extra::MlpOutNorm => "post_feedforward_layernorm.weight",
        }
    }

    /// Its shape in a model of config `c`.
    pub fn shape(self, c: &ModelConfig) -> Vec<usize> {
        match self {
            Extra::QBias => vec![c.q_dim()],
            Extra::KBias | Extra::VBias => vec![c.kv_dim()],
            Extra::QNorm | Extra::KNorm => vec![c.head_dim],
            Extra::GateBias | Extra::UpBias => vec![c.intermediate_size],
            Extra::OBias | Extra::DownBias | Extra::AttnOutNorm | Extra::MlpOutNorm => {
                vec![c.hidden_size]
            }
        }
    }

    /// Whether it is a norm's gain (else a bias).
    pub fn is_norm(self) -> bool {
        matches!(
            self,
            Extra::QNorm | Extra::KNorm | Extra::AttnOutNorm | Extra::MlpOutNorm
        )
    }
}

/// The name after `model.layers.N.` of the pre-MLP norm of a layer of
/// spec `l` (`post_norm`): Llama's `post_attention_layernorm`, or
/// `pre_feedforward_layernorm` when that name is the attention output's norm.
pub fn mlp_norm_suffix(l: &LayerSpec) -> &'static str {
    match l.post_attention_norm {
        false => "post_attention_layernorm.weight",
        true => "pre_feedforward_layernorm.weight",
    }
}

/// One decoder layer.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerWeights {
    pub input_norm: Tensor,    // [hidden]
    pub q_proj: Projection,    // [heads * head_dim, hidden]
    pub k_proj: Projection,    // [kv_heads * head_dim, hidden]
    pub v_proj: Projection,    // [kv_heads * head_dim, hidden]
    pub o_proj: Projection,    // [hidden, heads * head_dim]
    pub post_norm: Tensor,     // [hidden]
    pub gate_proj: Projection, // [intermediate, hidden]
    pub up_proj: Projection,   // [intermediate, hidden]
    pub down_proj: Projection, // [hidden, intermediate]
    /// The layer's [`Extra`] tensors, exactly those its spec asks for.
    pub extras: BTreeMap<Extra, Tensor>,
}

impl LayerWeights {
    /// The extra tensor `e`, when the layer has it.
    pub fn extra(&self, e: Extra) -> Option<&Tensor> {
        self.extras.get(&e)
    }

    /// The seven projections, in checkpoint order (Q, K, V, O, gate, up,
    /// down).
    pub fn projections(&self) -> [&Projection; 7] {
        [
            &self.q_proj,
            &self.k_proj,
            &self.v_proj,
            &self.o_proj,
            &self.gate_proj,
            &self.up_proj,
            &self.down_proj,
        ]
    }

    /// [`Self::projections`], mutable.
    pub fn projections_mut(&mut self) -> [&mut Projection; 7] {
        [
            &mut self.q_proj,
            &mut self.k_proj,
            &mut self.v_proj,
            &mut self.o_proj,
            &mut self.gate_proj,
            &mut self.up_proj,
            &mut self.down_proj,
        ]
    }
}

/// Index of the first NaN, infinity or value beyond [`MAX_ABS_WEIGHT`] of
/// `data`: branch-free passes over 4,096-element chunks (vectorised), a
/// search only inside a bad chunk.
pub(crate) fn first_bad(data: &[bf16]) -> Option<usize> {
    // magnitudes order like their bit patterns, NaN and the infinities
    // (exponent all ones) above every finite value
    let limit = bf16::from_f32(MAX_ABS_WEIGHT).to_bits();
    let bad = |x: &bf16| x.to_bits() & 0x7fff > limit;
    const CHUNK: usize = 4096;
    data.chunks(CHUNK).enumerate().find_map(|(c, chunk)| {
        let any = chunk.iter().fold(false, |acc, x| acc | bad(x));
        any.then(|| chunk.iter().position(bad).map(|i| c * CHUNK + i))
            .flatten()
    })
}

/// The whole model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelWeights {
    pub embed: Tensor, // [vocab, hidden]
    pub layers: Vec<LayerWeights>,
    pub norm: Tensor, // [hidden]
    /// `[vocab, hidden]`; `None` when the head is tied to `embed`.
    pub lm_head: Option<Projection>,
    /// The FP8 KV cache's per-layer K and V scales from the checkpoint
    /// (`None`: it has none, and an FP8 KV cache uses scale 1).
    pub kv_scales: Option<contract::KvScales>,
}

impl ModelWeights {
    /// The FP8 KV cache's per-layer scales: the checkpoint's, else 1 for
    /// every layer.
    pub fn kv_scales_or_ones(&self) -> contract::KvScales {
        self.kv_scales
            .clone()
            .unwrap_or_else(|| contract::KvScales::ones(self.layers.len()))
    }

    /// The LM head's values as BF16 ([`Projection::dense`]): the
    /// embedding when tied.
    pub fn head_dense(&self) -> Result<Cow<'_, Tensor>, FormatError> {
        match &self.lm_head {
            Some(p) => p.dense(),
            None => Ok(Cow::Borrowed(&self.embed)),
        }
    }

    /// Every BF16 tensor that is not a projection: embedding, each layer's
    /// norms and extras, final norm.
    pub fn tensors(&self) -> Vec<&Tensor> {
        let mut all = vec![&self.embed];
        for l in &self.layers {
            all.extend([&l.input_norm, &l.post_norm]);
            all.extend(l.extras.values());
        }
        all.push(&self.norm);
        all
    }

    /// Every projection: the layers' in order, then an untied LM head.
    pub fn projections(&self) -> Vec<&Projection> {
        let mut all: Vec<&Projection> = self.layers.iter().flat_map(|l| l.projections()).collect();
        all.extend(self.lm_head.as_ref());
        all
    }

    /// [`Self::projections`], mutable.
    pub fn projections_mut(&mut self) -> Vec<&mut Projection> {
        let mut all: Vec<&mut Projection> = (self.layers.iter_mut())
            .flat_map(|l| l.projections_mut())
            .collect();
        all.extend(self.lm_head.as_mut());
        all
    }

    /// The stored formats of the projections, each once, in order of first
    /// appearance.
    pub fn formats(&self) -> Vec<crate::projection::Format> {
        let mut out = Vec::new();
        for p in self.projections() {
            if !out.contains(&p.format()) {
                out.push(p.format());
            }
        }
        out
    }

    /// The first implausible element (NaN, an infinity, or beyond
    /// [`MAX_ABS_WEIGHT`]): `(tensor name, flat index, value)`, in order:
    /// the [`Self::tensors`], the BF16 projections, then the others
    /// ([`Projection::first_implausible`], decoded). The BF16 ones in one
    /// pass over their bits, spread over the machine's cores (tensors dealt
    /// out by size).
    pub fn first_implausible(&self) -> Option<(&str, usize, f32)> {
        let projections = self.projections();
        let mut all: Vec<&Tensor> = self.tensors();
        all.extend(projections.iter().filter_map(|p| p.as_bf16()));
        if let Some((t, i, v)) = first_implausible_of(&all) {
            return Some((t.name.as_str(), i, v));
        }
        (projections.into_iter())
            .filter(|p| p.as_bf16().is_none())
            .find_map(|p| p.first_implausible().map(|(i, v)| (p.name(), i, v)))
    }
}

/// The first implausible element of `all` (see
/// [`ModelWeights::first_implausible`]).
fn first_implausible_of<'a>(all: &[&'a Tensor]) -> Option<(&'a Tensor, usize, f32)> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    // deal the tensors (largest first) to the least loaded worker
    let mut order: Vec<usize> = (0..all.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(all[i].data.len()));
    let mut work: Vec<(usize, Vec<usize>)> = vec![(0, Vec::new()); threads.min(all.len()).max(1)];
    for i in order {
        if let Some(w) = work.iter_mut().min_by_key(|w| w.0) {
            w.0 += all[i].data.len();
            w.1.push(i);
        }
    }
    let found: Vec<(usize, usize)> = std::thread::scope(|s| {
        let jobs: Vec<_> = work
            .iter()
            .map(|(_, mine)| {
                s.spawn(move || {
                    mine.iter()
                        .filter_map(|&t| first_bad(&all[t].data).map(|i| (t, i)))
                        .min()
                })
            })
            .collect();
        jobs.into_iter()
            .filter_map(|j| j.join().ok().flatten())
            .collect()
    });
    let (t, i) = found.into_iter().min()?;
    Some((all[t], i, all[t].data[i].to_f32()))
}
