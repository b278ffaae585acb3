//! Weights and KV pool on the device.
//!
//! Contract: every tensor is uploaded once as bf16 and checked against the
//! config first (the error names the tensor). Q/K/V are fused into one
//! `[(heads + 2 kv_heads) * head_dim, hidden]` matrix and gate/up into one
//! `[2 * intermediate, hidden]`, so a layer runs four large GEMMs; a tied LM
//! head reuses the embedding buffer. The KV pool holds one extra block past
//! the engine's `num_blocks`: the scratch block padded rows of a captured
//! decode graph write to, never read by a real sequence.
//! Costs: device memory = weights (2 bytes/param) plus
//! `2 * layers * (num_blocks + 1) * block_size * kv_dim * 2` bytes of KV pool;
//! host memory during upload = one fused layer at a time.

use gpu::{DeviceBuffer, Gpu};
use half::bf16;

use checkpoint::weights::{LlamaWeights, Tensor};
use contract::backend::{BackendError, KvShape};
use contract::config::LlamaConfig;

use super::dev_err;

/// One decoder layer on the device.
pub(super) struct DeviceLayer {
    pub input_norm: DeviceBuffer<bf16>, // [hidden]
    pub post_norm: DeviceBuffer<bf16>,  // [hidden]
    pub qkv: DeviceBuffer<bf16>,        // [(heads + 2 kv_heads) * head_dim, hidden]
    pub o: DeviceBuffer<bf16>,          // [hidden, heads * head_dim]
    pub gate_up: DeviceBuffer<bf16>,    // [2 * intermediate, hidden]
    pub down: DeviceBuffer<bf16>,       // [hidden, intermediate]
}

/// The whole model on the device.
pub(super) struct DeviceWeights {
    pub embed: DeviceBuffer<bf16>,           // [vocab, hidden]
    pub lm_head: Option<DeviceBuffer<bf16>>, // [vocab, hidden]; None = tied to embed
    pub norm: DeviceBuffer<bf16>,            // [hidden]
    pub layers: Vec<DeviceLayer>,
}

impl DeviceWeights {
    /// The LM head matrix (the embedding when tied).
    pub fn head(&self) -> &DeviceBuffer<bf16> {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }
}

fn check(t: &Tensor, shape: &[usize]) -> Result<(), BackendError> {
    if t.shape != shape || t.data.len() != shape.iter().product::<usize>() {
        return Err(BackendError::Device(format!(
            "cuda: tensor {} has shape {:?} ({} values), expected {shape:?}",
            t.name,
            t.shape,
            t.data.len()
        )));
    }
    Ok(())
}

fn upload(gpu: &Gpu, t: &Tensor, shape: &[usize]) -> Result<DeviceBuffer<bf16>, BackendError> {
    check(t, shape)?;
    gpu.upload(&t.data)
        .map_err(|e| dev_err(&format!("uploading {}", t.name), e))
}

fn upload_fused(
    gpu: &Gpu,
    parts: &[(&Tensor, &[usize])],
    what: &str,
) -> Result<DeviceBuffer<bf16>, BackendError> {
    let mut data = Vec::with_capacity(parts.iter().map(|(t, _)| t.data.len()).sum());
    for (t, shape) in parts {
        check(t, shape)?;
        data.extend_from_slice(&t.data);
    }
    gpu.upload(&data)
        .map_err(|e| dev_err(&format!("uploading fused {what}"), e))
}

/// Uploads `w`, fusing Q/K/V and gate/up, checking every shape against `c`.
fn upload_weights(
    gpu: &Gpu,
    c: &LlamaConfig,
    w: &LlamaWeights,
) -> Result<DeviceWeights, BackendError> {
    let (h, i, v) = (c.hidden_size, c.intermediate_size, c.vocab_size);
    if w.layers.len() != c.num_layers {
        return Err(BackendError::Device(format!(
            "cuda: weights hold {} layers, config.num_hidden_layers is {}",
            w.layers.len(),
            c.num_layers
        )));
    }
    let progress = checkpoint::progress::Progress::new(
        "uploading weights to the GPU",
        checkpoint::progress::Unit::Items("layers"),
        c.num_layers as u64 + 1,
        0,
    );
    let mut layers = Vec::with_capacity(c.num_layers);
    for l in &w.layers {
        progress.inc(1);
        layers.push(DeviceLayer {
            input_norm: upload(gpu, &l.input_norm, &[h])?,
            post_norm: upload(gpu, &l.post_norm, &[h])?,
            qkv: upload_fused(
                gpu,
                &[
                    (&l.q_proj, &[c.q_dim(), h]),
                    (&l.k_proj, &[c.kv_dim(), h]),
                    (&l.v_proj, &[c.kv_dim(), h]),
                ],
                &l.q_proj.name,
            )?,
            o: upload(gpu, &l.o_proj, &[h, c.q_dim()])?,
            gate_up: upload_fused(
                gpu,
                &[(&l.gate_proj, &[i, h]), (&l.up_proj, &[i, h])],
                &l.gate_proj.name,
            )?,
            down: upload(gpu, &l.down_proj, &[h, i])?,
        });
    }
    let out = DeviceWeights {
        embed: upload(gpu, &w.embed, &[v, h])?,
        lm_head: match &w.lm_head {
            Some(t) => Some(upload(gpu, t, &[v, h])?),
            None => None,
        },
        norm: upload(gpu, &w.norm, &[h])?,
        layers,
    };
    progress.inc(1);
    progress.finish();
    Ok(out)
}

/// The paged KV pool: per layer K and V of `[(num_blocks + 1) * block_size, kv_heads, head_dim]`.
pub(super) struct KvCache {
    pub k: Vec<DeviceBuffer<bf16>>,
    pub v: Vec<DeviceBuffer<bf16>>,
}

impl KvCache {
    pub fn new(gpu: &Gpu, c: &LlamaConfig, kv: KvShape) -> Result<KvCache, BackendError> {
        let slots = (kv.num_blocks + 1) * kv.block_size;
        let mut k = Vec::with_capacity(c.num_layers);
        let mut v = Vec::with_capacity(c.num_layers);
        for _ in 0..c.num_layers {
            k.push(
                gpu.alloc::<bf16>(slots * c.kv_dim())
                    .map_err(|e| dev_err("allocating the K cache", e))?,
            );
            v.push(
                gpu.alloc::<bf16>(slots * c.kv_dim())
                    .map_err(|e| dev_err("allocating the V cache", e))?,
            );
        }
        Ok(KvCache { k, v })
    }
}

/// Everything of the model on the device: weights, the KV pool and the
/// RoPE table.
pub(super) struct DeviceModel {
    pub w: DeviceWeights,
    pub cache: KvCache,
    pub rope_cos: DeviceBuffer<f32>, // [rope_rows, head_dim / 2]
    pub rope_sin: DeviceBuffer<f32>, // [rope_rows, head_dim / 2]
    /// Rows of the RoPE table = longest context:
    /// min(max_position_embeddings, pool slots).
    pub rope_rows: usize,
}

impl DeviceModel {
    /// Uploads `w` and the RoPE table and allocates the KV pool `kv`.
    pub fn upload(
        gpu: &Gpu,
        c: &LlamaConfig,
        w: &LlamaWeights,
        kv: KvShape,
    ) -> Result<DeviceModel, BackendError> {
        let rope_rows = c.max_position_embeddings.min(kv.num_blocks * kv.block_size);
        let (cos, sin) = c.rope_table(rope_rows);
        let table = |t: &[f32]| {
            gpu.upload(t)
                .map_err(|e| dev_err("uploading the RoPE table", e))
        };
        Ok(DeviceModel {
            rope_cos: table(&cos)?,
            rope_sin: table(&sin)?,
            w: upload_weights(gpu, c, w)?,
            cache: KvCache::new(gpu, c, kv)?,
            rope_rows,
        })
    }
}
