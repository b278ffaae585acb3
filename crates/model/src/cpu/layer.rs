//! What the CPU backend reads of the model's spec beyond the projections:
//! each layer's small vectors in f32 (norm gains with the spec's offset
//! folded in, biases, QK-norm gains).
//!
//! Contract: both CPU paths run every field of a [`contract::ModelSpec`]
//! (the per-layer RoPE, attention scale, soft-cap and window included), so
//! no spec is refused here; [`LayerVecs::of`] holds a layer's gains as
//! `offset + w` so a norm is one multiply whatever the spec.

use checkpoint::weights::{Extra, LayerWeights, Tensor};
use std::collections::BTreeMap;

/// One layer's vectors, converted to f32 once.
pub(super) struct LayerVecs {
    pub input: Vec<f32>, // [hidden] gain of the input norm
    pub post: Vec<f32>,  // [hidden] gain of the pre-MLP norm
    /// `[q_dim + 2 kv_dim]`: the Q, K and V biases side by side (the fast
    /// path's fused QKV row), when the layer has them.
    pub qkv_bias: Option<Vec<f32>>,
    /// `[2 intermediate]`: the gate and up biases side by side (the fast
    /// path's fused gate/up row), when the layer has them.
    pub gate_up_bias: Option<Vec<f32>>,
    /// The other extras: biases as stored, norm gains with the offset.
    extras: BTreeMap<Extra, Vec<f32>>,
}

impl LayerVecs {
    /// The vectors of layer `l`, norm gains as `offset + w`.
    pub fn of(l: &LayerWeights, offset: f32) -> Self {
        let extras: BTreeMap<Extra, Vec<f32>> = l
            .extras
            .iter()
            .map(|(&e, t)| {
                (
                    e,
                    if e.is_norm() {
                        gain(t, offset)
                    } else {
                        t.to_f32()
                    },
                )
            })
            .collect();
        let fused = |parts: &[Extra]| {
            (parts.iter().map(|e| extras.get(e).cloned()))
                .collect::<Option<Vec<_>>>()
                .map(|parts| parts.concat())
        };
        let qkv_bias = fused(&[Extra::QBias, Extra::KBias, Extra::VBias]);
        let gate_up_bias = fused(&[Extra::GateBias, Extra::UpBias]);
        LayerVecs {
            input: gain(&l.input_norm, offset),
            post: gain(&l.post_norm, offset),
            qkv_bias,
            gate_up_bias,
            extras,
        }
    }

    /// Bytes a step reads of these: the norm gains and each extra once
    /// (the fused biases are copies of the extras).
    pub fn bytes(&self) -> usize {
        let extras: usize = self.extras.values().map(Vec::len).sum();
        (self.input.len() + self.post.len() + extras) * 4
    }

    /// Extra `e`'s vector (a norm's gain with the offset), when the layer has it.
    pub fn get(&self, e: Extra) -> Option<&[f32]> {
        self.extras.get(&e).map(Vec::as_slice)
    }
}

/// A norm's gain, `offset + w` (the final norm's too).
pub(super) fn gain(norm: &Tensor, offset: f32) -> Vec<f32> {
    norm.to_f32().into_iter().map(|w| offset + w).collect()
}

/// Per-head RMSNorm of the Q and K parts of a row that starts with Q
/// (`[q_dim]`) then K (`[kv_dim]`), when the layer has QK-norm.
pub(super) fn qk_norm(v: &LayerVecs, row: &mut [f32], q_dim: usize, kv_dim: usize, eps: f32) {
    if let (Some(gq), Some(gk)) = (v.get(Extra::QNorm), v.get(Extra::KNorm)) {
        ops::norm::rms_norm_in_place(&mut row[..q_dim], gq, eps);
        ops::norm::rms_norm_in_place(&mut row[q_dim..q_dim + kv_dim], gk, eps);
    }
}
