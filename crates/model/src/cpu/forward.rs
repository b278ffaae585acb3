//! The Llama forward pass of one step on the CPU.
//!
//! Contract: [`CpuBackend::forward`] runs every token of a validated
//! [`StepBatch`] through all layers (embedding, then per layer RMSNorm, Q/K/V
//! projections, RoPE, KV write at `slot_mapping`, paged causal attention,
//! output projection, residual, RMSNorm, SwiGLU MLP, residual), then the final
//! norm and LM head for the requested token rows only. It follows the oracle's
//! textbook order of operations in f32; a row with a LoRA adapter adds its
//! delta after each targeted projection (`lora`, from the unrounded input
//! where FP8 activations round the projections' inputs).
//!
//! Costs per step of `T` tokens and `R` output rows: one pass over every
//! layer's weights (each row converted once and applied to all `T` tokens),
//! `R * vocab * hidden` multiply-adds for the head (not `T`), attention as in
//! [`ops::attention`]. Scratch memory O(T * max(intermediate, q_dim)).
//! Every operation is the `ops` crate's (shared with the kernels' tests).

use super::CpuBackend;
use super::fast::product_input;
use super::lora::delta;
use contract::backend::StepBatch;
use contract::lora::LoraTarget as L;
use ops::AttnDims;
use ops::activation::silu_mul;
use ops::embedding::{embed, gather_rows};
use ops::linear::{add_assign, matmul_bf16};
use ops::norm::rms_norm;

impl CpuBackend {
    /// Runs `batch` (already validated) and returns the logits of token rows
    /// `rows`, `[rows.len(), vocab]` row-major.
    pub(super) fn forward(&mut self, batch: &StepBatch, rows: &[usize]) -> Vec<f32> {
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
        let mut x = embed(&self.weights.embed.data, &batch.tokens, hidden);
        debug_assert_eq!(x.len(), t * hidden);
        let lrows = self.lora.rows(batch); // [T] each row's adapter
        let lr = lrows.as_deref();
        let fp8a = self.fp8_activations;
        let mut fp8_in = Vec::new(); // a product's input rounded to e4m3
        for (l, lw) in self.weights.layers.iter().enumerate() {
            let norms = &self.norms[l];
            let h = rms_norm(&x, &norms.input, eps); // [T, hidden]
            let hq = product_input(fp8a, &h, hidden, &mut fp8_in);
            let mut q = matmul_bf16(hq, &lw.q_proj.data, hidden, q_dim); // [T, q_dim]
            let mut k = matmul_bf16(hq, &lw.k_proj.data, hidden, kv_dim); // [T, kv_dim]
            let mut v = matmul_bf16(hq, &lw.v_proj.data, hidden, kv_dim); // [T, kv_dim]
            delta(lr, l, L::Q, &h, hidden, &mut q, q_dim, 0);
            delta(lr, l, L::K, &h, hidden, &mut k, kv_dim, 0);
            delta(lr, l, L::V, &h, hidden, &mut v, kv_dim, 0);
            self.rope.apply_rows(&mut q, q_dim, &batch.positions);
            self.rope.apply_rows(&mut k, kv_dim, &batch.positions);
            self.pool.rotate_qk(&mut q, c.head_dim);
            self.pool.rotate_qk(&mut k, c.head_dim);
            self.pool.write(l, &k, &v, &batch.slot_mapping);
            let o = self.pool.attention(&q, l, batch, dims); // [T, q_dim]
            let oq = product_input(fp8a, &o, q_dim, &mut fp8_in);
            let mut proj = matmul_bf16(oq, &lw.o_proj.data, q_dim, hidden); // [T, hidden]
            delta(lr, l, L::O, &o, q_dim, &mut proj, hidden, 0);
            add_assign(&mut x, &proj);
            let h = rms_norm(&x, &norms.post, eps); // [T, hidden]
            let hq = product_input(fp8a, &h, hidden, &mut fp8_in);
            let mut gate = matmul_bf16(hq, &lw.gate_proj.data, hidden, inter); // [T, inter]
            let mut up = matmul_bf16(hq, &lw.up_proj.data, hidden, inter); // [T, inter]
            delta(lr, l, L::Gate, &h, hidden, &mut gate, inter, 0);
            delta(lr, l, L::Up, &h, hidden, &mut up, inter, 0);
            silu_mul(&mut gate, &up);
            let gq = product_input(fp8a, &gate, inter, &mut fp8_in);
            let mut down = matmul_bf16(gq, &lw.down_proj.data, inter, hidden); // [T, hidden]
            delta(lr, l, L::Down, &gate, inter, &mut down, hidden, 0);
            add_assign(&mut x, &down);
        }
        // [R, hidden] only the rows whose logits are wanted
        let picked = gather_rows(&x, rows, hidden);
        let h = rms_norm(&picked, &self.final_norm, eps);
        matmul_bf16(&h, &self.weights.head().data, hidden, c.vocab_size) // [R, vocab]
    }
}
