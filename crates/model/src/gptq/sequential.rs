//! The calibration pass of [`quantize_model`]: the model run one layer at
//! a time over every calibration token, each projection quantised against
//! the inputs it sees once the projections before it are quantised (see
//! the parent module).

use checkpoint::fp8::Fp8Tensor;
use checkpoint::int4::{BLOCK, Int4Tensor, SYM_ZERO};
use checkpoint::projection::Projection;
use checkpoint::weights::{LayerWeights, ModelWeights, Tensor};
use contract::config::ModelConfig;
use cpu_kernels::int4::{Int4Scratch, matmul_int4};
use cpu_kernels::{Isa, Scratch, matmul_bf16};
use ops::activation::silu_mul;
use ops::embedding::embed;
use ops::linear::add_assign;
use ops::norm::rms_norm;
use ops::{AttnDims, Rope};

use super::attention::causal_attention;
use super::solve::{self, Factor};
use super::{GptqError, GptqOptions, Hessian, Target};

/// Quantises every projection of `weights` (BF16) to `opts.target` (FP8
/// or 4 bits) with GPTQ over the calibration `tokens` (cut into windows of
/// `opts.window`), calling `on_layer(done, layers)` after each layer: the
/// model with its projections quantised (each layer's BF16 buffers
/// dropped once it is done). The embedding, norms and LM head are left as
/// they are.
pub fn quantize_model(
    config: &ModelConfig,
    mut weights: ModelWeights,
    tokens: &[u32],
    opts: &GptqOptions,
    on_layer: &mut dyn FnMut(usize, usize),
) -> Result<ModelWeights, GptqError> {
    check(config, &weights, tokens, opts)?;
    let pass = Pass::new(config, tokens, *opts);
    // [N, hidden] the residual stream of every calibration token
    let mut x = embed(&weights.embed.data, tokens, config.hidden_size);
    let layers = weights.layers.len();
    for (l, lw) in weights.layers.iter_mut().enumerate() {
        let quantised = pass.layer(lw, &mut x)?;
        for (p, q) in lw.projections_mut().into_iter().zip(quantised) {
            *p = q;
        }
        on_layer(l + 1, layers);
    }
    Ok(weights)
}

/// Everything checked before any work.
fn check(
    config: &ModelConfig,
    weights: &ModelWeights,
    tokens: &[u32],
    opts: &GptqOptions,
) -> Result<(), GptqError> {
    for p in weights.layers.iter().flat_map(|l| l.projections()) {
        match p {
            Projection::Bf16(_) => {}
            Projection::Fp8(_) => return Err(GptqError::AlreadyFp8),
            Projection::Blocks(_) | Projection::Int4(_) => {
                return Err(p.refuse("GPTQ calibration").into());
            }
        }
    }
    crate::cpu::check_weights(config, weights).map_err(|e| GptqError::Weights(e.to_string()))?;
    // the calibration pass runs Llama's layer
    if let Some(field) = config.spec.first_difference(&config.llama_spec()) {
        return Err(GptqError::Weights(format!(
            "the model's `{field}` is not supported by GPTQ calibration (it runs Llama's layer)"
        )));
    }
    check_tokens(config, tokens, opts.window)?;
    check_target(config, opts)?;
    if !(opts.damp.is_finite() && opts.damp >= 0.0) || opts.block == 0 {
        return Err(GptqError::Options(format!(
            "dampening {} and block {}: need a finite dampening >= 0 and a block >= 1",
            opts.damp, opts.block
        )));
    }
    Ok(())
}

/// A 4-bit target's group fits every projection's input width (hidden,
/// attention output, intermediate) in whole blocks.
fn check_target(config: &ModelConfig, opts: &GptqOptions) -> Result<(), GptqError> {
    let Target::Int4 { group } = opts.target else {
        return Ok(());
    };
    let widths = [config.hidden_size, config.q_dim(), config.intermediate_size];
    if group == 0 || !group.is_multiple_of(BLOCK) || widths.iter().any(|w| !w.is_multiple_of(group))
    {
        return Err(GptqError::Options(format!(
            "a 4-bit group of {group} columns: it must be a multiple of {BLOCK} dividing every \
             projection's input width ({widths:?})"
        )));
    }
    Ok(())
}

/// The calibration tokens checked: some, each inside the vocabulary, in
/// windows of `window` tokens (at least 1, within the model's context).
pub(crate) fn check_tokens(
    config: &ModelConfig,
    tokens: &[u32],
    window: usize,
) -> Result<(), GptqError> {
    if tokens.is_empty() {
        return Err(GptqError::NoTokens);
    }
    let vocab = config.vocab_size;
    if let Some((at, &id)) = tokens
        .iter()
        .enumerate()
        .find(|(_, t)| **t as usize >= vocab)
    {
        return Err(GptqError::Token { at, id, vocab });
    }
    let max = config.max_position_embeddings;
    if window == 0 || window > max {
        return Err(GptqError::Options(format!(
            "a calibration window of {window} tokens: the model's context is {max}"
        )));
    }
    Ok(())
}

/// `n` tokens cut into windows of `window`: each token's position in its
/// window (`[n]`) and the windows' offsets (`[S + 1]`).
pub(crate) fn windows(n: usize, window: usize) -> (Vec<u32>, Vec<u32>) {
    let (mut positions, mut cu_seqlens) = (Vec::new(), vec![0u32]);
    for start in (0..n).step_by(window) {
        let len = window.min(n - start);
        positions.extend(0..len as u32);
        cu_seqlens.push((start + len) as u32);
    }
    (positions, cu_seqlens)
}

/// `p`'s BF16 tensor; GPTQ quantises nothing else (refused naming it).
fn bf16_of(p: &Projection) -> Result<&Tensor, GptqError> {
    p.as_bf16()
        .ok_or_else(|| p.refuse("GPTQ calibration").into())
}

/// The calibration tokens' layout, shared by every layer.
struct Pass<'a> {
    config: &'a ModelConfig,
    opts: GptqOptions,
    rope: Rope,
    positions: Vec<u32>,  // [N] position of each token in its window
    cu_seqlens: Vec<u32>, // [S + 1] window offsets
    isa: Isa,
}

impl<'a> Pass<'a> {
    fn new(config: &'a ModelConfig, tokens: &[u32], opts: GptqOptions) -> Self {
        let n = tokens.len();
        let (positions, cu_seqlens) = windows(n, opts.window);
        Pass {
            config,
            opts,
            rope: Rope::new(config, opts.window.min(n)),
            positions,
            cu_seqlens,
            isa: Isa::best(),
        }
    }

    /// Quantises layer `lw` (BF16 projections) against its inputs `x`
    /// (`[N, hidden]`) and replaces `x` by the quantised layer's output:
    /// the seven projections in checkpoint order.
    fn layer(&self, lw: &LayerWeights, x: &mut [f32]) -> Result<[Projection; 7], GptqError> {
        let [wq, wk, wv, wo, wg, wu, wd] = lw.projections().map(bf16_of);
        let (wq, wk, wv, wo, wg, wu, wd) = (wq?, wk?, wv?, wo?, wg?, wu?, wd?);
        let c = self.config;
        let (hidden, q_dim, kv_dim) = (c.hidden_size, c.q_dim(), c.kv_dim());
        let (inter, eps) = (c.intermediate_size, c.rms_norm_eps);
        let h = rms_norm(x, &lw.input_norm.to_f32(), eps); // [N, hidden]
        let f = self.factor(&h, hidden, wq)?;
        let [q_proj, k_proj, v_proj] = [wq, wk, wv].map(|t| self.quantize(t, &f));
        let mut q = self.project(&h, &q_proj, hidden, q_dim)?; // [N, q_dim]
        let mut k = self.project(&h, &k_proj, hidden, kv_dim)?; // [N, kv_dim]
        let v = self.project(&h, &v_proj, hidden, kv_dim)?; // [N, kv_dim]
        self.rope.apply_rows(&mut q, q_dim, &self.positions);
        self.rope.apply_rows(&mut k, kv_dim, &self.positions);
        let o = self.attention(&q, &k, &v); // [N, q_dim]
        let o_proj = self.quantize(wo, &self.factor(&o, q_dim, wo)?);
        add_assign(x, &self.project(&o, &o_proj, q_dim, hidden)?);
        let h = rms_norm(x, &lw.post_norm.to_f32(), eps); // [N, hidden]
        let f = self.factor(&h, hidden, wg)?;
        let [gate_proj, up_proj] = [wg, wu].map(|t| self.quantize(t, &f));
        let mut gate = self.project(&h, &gate_proj, hidden, inter)?; // [N, inter]
        let up = self.project(&h, &up_proj, hidden, inter)?; // [N, inter]
        silu_mul(&mut gate, &up);
        let down_proj = self.quantize(wd, &self.factor(&gate, inter, wd)?);
        add_assign(x, &self.project(&gate, &down_proj, inter, hidden)?);
        Ok([
            q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj,
        ])
    }

    /// The factored Hessian of `x` (`[N, k]`), the inputs of `t` (and of
    /// the projections beside it); refused when the inputs are not finite
    /// or the dampened Hessian is not positive definite.
    fn factor(&self, x: &[f32], k: usize, t: &Tensor) -> Result<Factor, GptqError> {
        let h = Hessian::of(x, k); // [k, k]
        if !h.finite() {
            return Err(GptqError::NonFinite {
                tensor: t.name.clone(),
            });
        }
        let damp = self.opts.damp;
        Factor::new(&h, damp, self.opts.act_order).map_err(|column| {
            GptqError::NotPositiveDefinite {
                tensor: t.name.clone(),
                column,
                damp,
            }
        })
    }

    /// `t` (`[n, k]`) quantised by GPTQ against the factored Hessian `f`.
    fn quantize(&self, t: &Tensor, f: &Factor) -> Projection {
        let (n, k) = (t.shape[0], t.shape[1]);
        let w = t.to_f32(); // [n, k]
        let block = self.opts.block;
        match self.opts.target {
            Target::Fp8(rule) => {
                let scale = solve::scales(&w, n, k, rule); // [n]
                let data = solve::gptq(&w, n, k, f, &scale, block);
                Projection::Fp8(Fp8Tensor {
                    name: t.name.clone(),
                    shape: t.shape.clone(),
                    data,
                    scale,
                    input_scale: None,
                })
            }
            Target::Int4 { group } => {
                let (codes, scale, perm) = solve::gptq_int4(&w, n, k, f, group, block);
                let zero = vec![SYM_ZERO; scale.len()];
                let q = Int4Tensor::from_codes(&t.name, n, k, group, &codes, scale, zero);
                Projection::Int4(Int4Tensor { perm, ..q })
            }
        }
    }

    /// `x W^T` (`x` `[N, inp]`, result `[N, out]`) over `w`'s weights as
    /// the CPU backend runs them (4 bits widened to f32, FP8 and the rest
    /// as BF16 values).
    fn project(
        &self,
        x: &[f32],
        w: &Projection,
        inp: usize,
        out: usize,
    ) -> Result<Vec<f32>, GptqError> {
        let mut y = vec![0f32; x.len() / inp * out];
        let wd = match w {
            Projection::Int4(t) => {
                let m = crate::cpu::int4_matrix(t);
                matmul_int4(self.isa, x, &m, &mut y, &mut Int4Scratch::default());
                return Ok(y);
            }
            Projection::Fp8(t) => std::borrow::Cow::Owned(t.dequantize()),
            other => other.dense()?,
        }; // [out, inp]
        let mut scratch = Scratch::default();
        matmul_bf16(self.isa, x, &wd.data, inp, out, &mut y, &mut scratch);
        Ok(y)
    }

    /// Causal attention of every window (`q` `[N, q_dim]`, `k`, `v`
    /// `[N, kv_dim]`, RoPE applied): `[N, q_dim]`.
    fn attention(&self, q: &[f32], k: &[f32], v: &[f32]) -> Vec<f32> {
        let c = self.config;
        let dims = AttnDims {
            heads: c.num_heads,
            kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
        };
        causal_attention(self.isa, q, k, v, &self.cu_seqlens, dims)
    }
}
