//! Model weights in Hugging Face names and layout, held as BF16.
//!
//! Contract: a [`LlamaWeights`] exists only after every expected tensor was
//! found and checked for dtype and shape against the [`LlamaConfig`]
//! (see `loader`), so backends index it without further checks. Matrices are
//! row-major `[out_features, in_features]`, exactly as in the safetensors
//! files (Q/K rows in Hugging Face's rotate-half order).

use half::bf16;

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

/// One decoder layer.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerWeights {
    pub input_norm: Tensor, // [hidden]
    pub q_proj: Tensor,     // [heads * head_dim, hidden]
    pub k_proj: Tensor,     // [kv_heads * head_dim, hidden]
    pub v_proj: Tensor,     // [kv_heads * head_dim, hidden]
    pub o_proj: Tensor,     // [hidden, heads * head_dim]
    pub post_norm: Tensor,  // [hidden]
    pub gate_proj: Tensor,  // [intermediate, hidden]
    pub up_proj: Tensor,    // [intermediate, hidden]
    pub down_proj: Tensor,  // [hidden, intermediate]
}

/// The whole model.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaWeights {
    pub embed: Tensor, // [vocab, hidden]
    pub layers: Vec<LayerWeights>,
    pub norm: Tensor, // [hidden]
    /// `[vocab, hidden]`; `None` when the head is tied to `embed`.
    pub lm_head: Option<Tensor>,
}

impl LlamaWeights {
    /// The LM head matrix: `lm_head` or, when tied, the embedding.
    pub fn head(&self) -> &Tensor {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }
}
