//! The reference forward pass of one step on the CPU.
//!
//! Contract: [`CpuBackend::forward`] runs every token of a validated
//! [`StepBatch`] through all layers as the model's spec describes
//! (embedding and its scale, then per layer RMSNorm, Q/K/V projections and
//! biases, QK-norm, the layer's RoPE, KV write at `slot_mapping`, paged
//! causal attention under the layer's scale, soft-cap and window, output
//! projection and bias, output norm, residual, RMSNorm,
//! the gated MLP with its activation and biases, output norm, residual),
//! then the final norm, LM head and soft-cap for the requested token rows
//! only. It follows the oracle's
//! textbook order of operations in f32; a row with a LoRA adapter adds its
//! delta after each targeted projection (`lora`, from the unrounded input
//! where FP8 activations round the projections' inputs).
//!
//! The projections it multiplies are [`RefWeights`]: BF16 values taken
//! from the weights at construction (moved, or widened from FP8 and kept
//! here, `bf16(decode(q) * scale)`; int4 decoded likewise,
//! `bf16((q - zero) * scale)`); ggml blocks are refused naming the
//! tensor (the fast path multiplies them).
//!
//! Costs per step of `T` tokens and `R` output rows: one pass over every
//! layer's weights (each row converted once and applied to all `T` tokens),
//! `R * vocab * hidden` multiply-adds for the head (not `T`), attention as in
//! [`ops::attention`]. Scratch memory O(T * max(intermediate, q_dim)).
//! Every operation is the `ops` crate's (shared with the kernels' tests).

use super::fast::product_input;
use super::lora::delta;
use super::{CpuBackend, Out};
use checkpoint::projection::Projection;
use checkpoint::weights::Extra as X;
use checkpoint::weights::ModelWeights;
use contract::backend::BackendError;
use contract::backend::StepBatch;
use contract::lora::LoraTarget as L;
use half::bf16;
use ops::activation::gate_mul;
use ops::embedding::{embed, gather_rows};
use ops::linear::{add_assign, matmul_bf16};
use ops::norm::{add_rows, rms_norm, rms_norm_in_place, softcap};
use ops::{AttnDims, ScoreRule};

/// One layer's projections as the reference multiplies them, BF16
/// `[out, in]` row-major.
pub(super) struct RefLayer {
    q: Vec<bf16>,
    k: Vec<bf16>,
    v: Vec<bf16>,
    o: Vec<bf16>,
    gate: Vec<bf16>,
    up: Vec<bf16>,
    down: Vec<bf16>,
}

/// The reference path's projections (see the module doc).
pub(super) struct RefWeights {
    layers: Vec<RefLayer>,
    /// `[vocab, hidden]`; `None`: tied, the embedding is read.
    head: Option<Vec<bf16>>,
}

/// `p`'s BF16 values (the reference's one match on the stored formats),
/// its stored buffers released.
fn take_dense(p: &mut Projection) -> Result<Vec<bf16>, BackendError> {
    let data = match p {
        Projection::Bf16(t) => std::mem::take(&mut t.data),
        Projection::Fp8(_) | Projection::Int4(_) => {
            p.dense()
                .map_err(|e| BackendError::Device(format!("cpu: {e}")))?
                .into_owned()
                .data
        }
        Projection::Blocks(_) => {
            let e = p.refuse("the reference CPU kernels (use the fast kernels for ggml blocks)");
            return Err(BackendError::Device(format!("cpu: {e}")));
        }
    };
    p.release();
    Ok(data)
}

impl RefWeights {
    /// Bytes of the layers' projections, and of the LM head's own matrix
    /// (`None`: tied, the embedding is read).
    pub(super) fn bytes(&self) -> (usize, Option<usize>) {
        let layers = (self.layers.iter())
            .flat_map(|l| [&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down])
            .map(|w| w.len() * 2)
            .sum();
        (layers, self.head.as_ref().map(|h| h.len() * 2))
    }

    /// Takes every projection of `w` (shape-checked), releasing its stored
    /// buffers.
    pub(super) fn take(w: &mut ModelWeights) -> Result<Self, BackendError> {
        let layers = (w.layers.iter_mut())
            .map(|l| {
                Ok(RefLayer {
                    q: take_dense(&mut l.q_proj)?,
                    k: take_dense(&mut l.k_proj)?,
                    v: take_dense(&mut l.v_proj)?,
                    o: take_dense(&mut l.o_proj)?,
                    gate: take_dense(&mut l.gate_proj)?,
                    up: take_dense(&mut l.up_proj)?,
                    down: take_dense(&mut l.down_proj)?,
                })
            })
            .collect::<Result<_, BackendError>>()?;
        let head = w.lm_head.as_mut().map(take_dense).transpose()?;
        Ok(RefWeights { layers, head })
    }
}

impl CpuBackend {
    /// Runs `batch` (already validated) over `rw` and returns the logits of
    /// token rows `rows`, `[rows.len(), vocab]` row-major (or with
    /// [`Out::Hidden`] their final-normed hidden states, `[rows.len(), hidden]`).
    pub(super) fn forward(
        &mut self,
        rw: &RefWeights,
        batch: &StepBatch,
        rows: &[usize],
        out: Out,
    ) -> Vec<f32> {
        let c = &self.config;
        let (hidden, q_dim, kv_dim) = (c.hidden_size, c.q_dim(), c.kv_dim());
        let dims = AttnDims {
            heads: c.num_heads,
            kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
        };
        let (inter, eps) = (c.intermediate_size, c.rms_norm_eps);
        let t = batch.num_tokens();
        // [T, hidden] residual stream
        let spec = &c.spec;
        let mut x = embed(&self.weights.embed.data, &batch.tokens, hidden);
        debug_assert_eq!(x.len(), t * hidden);
        if spec.embed_scale != 1.0 {
            x.iter_mut().for_each(|v| *v *= spec.embed_scale);
        }
        let lrows = self.lora.rows(batch); // [T] each row's adapter
        let lr = lrows.as_deref();
        let fp8a = self.fp8_activations;
        let mut fp8_in = Vec::new(); // a product's input rounded to e4m3
        for (l, lw) in rw.layers.iter().enumerate() {
            let norms = &self.norms[l];
            let h = rms_norm(&x, &norms.input, eps); // [T, hidden]
            let hq = product_input(fp8a, &h, hidden, &mut fp8_in);
            let mut q = matmul_bf16(hq, &lw.q, hidden, q_dim); // [T, q_dim]
            let mut k = matmul_bf16(hq, &lw.k, hidden, kv_dim); // [T, kv_dim]
            let mut v = matmul_bf16(hq, &lw.v, hidden, kv_dim); // [T, kv_dim]
            delta(lr, l, L::Q, &h, hidden, &mut q, q_dim, 0);
            delta(lr, l, L::K, &h, hidden, &mut k, kv_dim, 0);
            delta(lr, l, L::V, &h, hidden, &mut v, kv_dim, 0);
            for (y, e) in [(&mut q, X::QBias), (&mut k, X::KBias), (&mut v, X::VBias)] {
                if let Some(b) = norms.get(e) {
                    add_rows(y, b);
                }
            }
            if let Some(g) = norms.get(X::QNorm) {
                rms_norm_in_place(&mut q, g, eps);
            }
            if let Some(g) = norms.get(X::KNorm) {
                rms_norm_in_place(&mut k, g, eps);
            }
            let rope = self.rope.layer(l);
            rope.apply_rows(&mut q, q_dim, &batch.positions);
            rope.apply_rows(&mut k, kv_dim, &batch.positions);
            self.pool.rotate_qk(&mut q, c.head_dim);
            self.pool.rotate_qk(&mut k, c.head_dim);
            self.pool.write(l, &k, &v, &batch.slot_mapping);
            let rule = ScoreRule::of(&spec.layers[l].attention);
            let o = self.pool.attention(&q, l, batch, dims, rule); // [T, q_dim]
            let oq = product_input(fp8a, &o, q_dim, &mut fp8_in);
            let mut proj = matmul_bf16(oq, &lw.o, q_dim, hidden); // [T, hidden]
            delta(lr, l, L::O, &o, q_dim, &mut proj, hidden, 0);
            if let Some(b) = norms.get(X::OBias) {
                add_rows(&mut proj, b);
            }
            if let Some(g) = norms.get(X::AttnOutNorm) {
                rms_norm_in_place(&mut proj, g, eps);
            }
            add_assign(&mut x, &proj);
            let h = rms_norm(&x, &norms.post, eps); // [T, hidden]
            let hq = product_input(fp8a, &h, hidden, &mut fp8_in);
            let mut gate = matmul_bf16(hq, &lw.gate, hidden, inter); // [T, inter]
            let mut up = matmul_bf16(hq, &lw.up, hidden, inter); // [T, inter]
            delta(lr, l, L::Gate, &h, hidden, &mut gate, inter, 0);
            delta(lr, l, L::Up, &h, hidden, &mut up, inter, 0);
            if let Some(b) = norms.get(X::GateBias) {
                add_rows(&mut gate, b);
            }
            if let Some(b) = norms.get(X::UpBias) {
                add_rows(&mut up, b);
            }
            gate_mul(spec.layers[l].mlp.activation, &mut gate, &up);
            let gq = product_input(fp8a, &gate, inter, &mut fp8_in);
            let mut down = matmul_bf16(gq, &lw.down, inter, hidden); // [T, hidden]
            delta(lr, l, L::Down, &gate, inter, &mut down, hidden, 0);
            if let Some(b) = norms.get(X::DownBias) {
                add_rows(&mut down, b);
            }
            if let Some(g) = norms.get(X::MlpOutNorm) {
                rms_norm_in_place(&mut down, g, eps);
            }
            add_assign(&mut x, &down);
        }
        // [R, hidden] only the rows whose logits are wanted
        let picked = gather_rows(&x, rows, hidden);
        let h = rms_norm(&picked, &self.final_norm, eps);
        if out == Out::Hidden {
            return h;
        }
        let head = rw.head.as_deref().unwrap_or(&self.weights.embed.data);
        let mut logits = matmul_bf16(&h, head, hidden, c.vocab_size); // [R, vocab]
        if let Some(cap) = spec.final_logit_softcap {
            softcap(&mut logits, cap as f32);
        }
        logits
    }
}
