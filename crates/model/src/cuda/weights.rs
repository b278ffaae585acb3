//! Weights and KV pool on the device.
//!
//! Contract: every tensor is uploaded once and checked against the config
//! first (the error names the tensor). Each fused projection is a
//! [`Projection`], the `linear` implementation of the format
//! [`projection_format`] picks: e4m3 bytes with one f32 scale per row for
//! a model with FP8 weights (`ModelWeights::fp8`), a GGUF's own blocks
//! (`gguf`) where the backend was given them and every part of the
//! projection shares one block format, else bf16. Q/K/V are fused into one
//! `[(heads + 2 kv_heads) * head_dim, hidden]` matrix and gate/up into one
//! `[2 * intermediate, hidden]`, so a layer runs four large GEMMs; a tied LM
//! head reuses the embedding buffer unless it is in FP8 (`--quantize-lm-head`)
//! or GGUF blocks, when it has its own copy and the embedding stays bf16.
//! With any projection not in bf16 the model also holds one bf16 buffer of
//! the largest such projection (`widened`), where a GEMM step widens each
//! FP8 or block matrix before cuBLAS reads it. The KV pool holds one extra block past
//! the engine's `num_blocks`: the scratch block padded rows of a captured
//! decode graph write to, never read by a real sequence.
//! The pool stores bf16 or, with `--kv-cache-dtype fp8`, e4m3 bytes at
//! the checkpoint's per-layer K/V scales (`ModelWeights::kv_scales_or_ones`),
//! which every kernel that writes or reads K/V takes (`kernels::KvCaches`).
//! Costs: device memory = weights (2 bytes/param; 1 for FP8 projections,
//! plus 4 bytes per row; GGUF blocks their size, see `gguf`; and the
//! largest widened projection in bf16) plus
//! `2 * layers * (num_blocks + 1) * block_size * kv_dim * e` bytes of KV
//! pool (`e` = 2 for bf16, 1 for FP8: `KvCacheDtype::bytes`);
//! host memory during upload = one fused layer at a time.

use gpu::{DeviceBuffer, Gpu};
use half::bf16;
use kernels::gemv::{GemvWeights, WeightFormat};

use checkpoint::fp8::{Fp8Layer, Fp8Tensor};
use checkpoint::quantized::{QuantLayer, QuantTensor, QuantWeights};
use checkpoint::weights::{Extra, LayerWeights, ModelWeights, Tensor};
use contract::backend::{BackendError, KvShape};
use contract::config::{KvCacheDtype, KvScales, ModelConfig};
use kernels::KvCaches;

use super::errors::dev_err;
use super::gguf::{self, GgufLinear};
use super::linear::{Bf16Linear, Fp8RowLinear, Linear, check};

/// A projection in whichever weight format it was loaded in.
pub(super) type Projection = Box<dyn Linear>;

/// One decoder layer on the device.
pub(super) struct DeviceLayer {
    pub input_norm: DeviceBuffer<bf16>, // [hidden]
    pub post_norm: DeviceBuffer<bf16>,  // [hidden]
    pub qkv: Projection,                // [(heads + 2 kv_heads) * head_dim, hidden]
    pub o: Projection,                  // [hidden, heads * head_dim]
    pub gate_up: Projection,            // [2 * intermediate, hidden]
    pub down: Projection,               // [hidden, intermediate]
    /// The spec's extra tensors the CUDA layer runs (all `None` for Llama).
    pub extras: DevExtras,
}

/// A layer's biases, QK-norm and output-norm gains on the device, fused
/// like the projections they follow.
#[derive(Default)]
pub(super) struct DevExtras {
    pub qkv_bias: Option<DeviceBuffer<bf16>>, // [q_dim + 2 kv_dim]
    pub qk_norm: Option<[DeviceBuffer<bf16>; 2]>, // Q and K gains, [head_dim] each
    pub o_bias: Option<DeviceBuffer<bf16>>,   // [hidden]
    pub gate_up_bias: Option<DeviceBuffer<bf16>>, // [2 intermediate]
    pub down_bias: Option<DeviceBuffer<bf16>>, // [hidden]
    pub attn_out_norm: Option<DeviceBuffer<bf16>>, // [hidden]
    pub mlp_out_norm: Option<DeviceBuffer<bf16>>, // [hidden]
}

/// Uploads layer `l`'s extra tensors, concatenating those of one fused
/// projection (Q/K/V, gate/up).
fn upload_extras(gpu: &Gpu, l: &LayerWeights) -> Result<DevExtras, BackendError> {
    let fused = |parts: &[Extra]| -> Result<Option<DeviceBuffer<bf16>>, BackendError> {
        let Some(ts) = parts
            .iter()
            .map(|&e| l.extra(e))
            .collect::<Option<Vec<_>>>()
        else {
            return Ok(None);
        };
        let data: Vec<bf16> = ts.iter().flat_map(|t| t.data.iter().copied()).collect();
        let what = ts.first().map_or("", |t| t.name.as_str());
        gpu.upload(&data)
            .map(Some)
            .map_err(|e| dev_err(&format!("uploading {what}"), e))
    };
    let qk_norm = match (fused(&[Extra::QNorm])?, fused(&[Extra::KNorm])?) {
        (Some(q), Some(k)) => Some([q, k]),
        _ => None,
    };
    Ok(DevExtras {
        qkv_bias: fused(&[Extra::QBias, Extra::KBias, Extra::VBias])?,
        qk_norm,
        o_bias: fused(&[Extra::OBias])?,
        gate_up_bias: fused(&[Extra::GateBias, Extra::UpBias])?,
        down_bias: fused(&[Extra::DownBias])?,
        attn_out_norm: fused(&[Extra::AttnOutNorm])?,
        mlp_out_norm: fused(&[Extra::MlpOutNorm])?,
    })
}

/// The whole model on the device.
pub(super) struct DeviceWeights {
    pub embed: DeviceBuffer<bf16>,   // [vocab, hidden]
    pub lm_head: Option<Projection>, // [vocab, hidden]; None = tied to embed
    pub norm: DeviceBuffer<bf16>,    // [hidden]
    pub layers: Vec<DeviceLayer>,
    /// FP8 models only: room for the largest projection in bf16 (see the
    /// module doc), `[max rows * k]`.
    pub widened: Option<DeviceBuffer<bf16>>,
}

impl DeviceWeights {
    /// Every projection of the layers, then the LM head's own.
    pub fn projections(&self) -> impl Iterator<Item = &Projection> {
        (self.layers.iter())
            .flat_map(|l| [&l.qkv, &l.o, &l.gate_up, &l.down])
            .chain(self.lm_head.as_ref())
    }

    /// The LM head as the GEMV kernels take it (the embedding when tied).
    pub fn head_gemv(&self) -> GemvWeights<'_> {
        match &self.lm_head {
            Some(p) => p.gemv(),
            None => GemvWeights::Bf16(self.embed.view()),
        }
    }
}

fn upload(gpu: &Gpu, t: &Tensor, shape: &[usize]) -> Result<DeviceBuffer<bf16>, BackendError> {
    check(t, shape)?;
    gpu.upload(&t.data)
        .map_err(|e| dev_err(&format!("uploading {}", t.name), e))
}

/// The weight format a fused projection of `w` goes up in: FP8 when the
/// model has FP8 copies; else the GGUF block format of its parts' `blocks`
/// when all share one the GEMVs read (`gguf::shared_format`); else bf16
/// (also for parts of mixed block formats, as Q4_K_M mixes Q4_K and Q6_K:
/// they run from the store's dequantised copy). With no `blocks`, the
/// model's dense format (what its input widths must fit).
pub(super) fn projection_format(w: &ModelWeights, blocks: &[Option<&QuantTensor>]) -> WeightFormat {
    match (&w.fp8, gguf::shared_format(blocks)) {
        (Some(_), _) => WeightFormat::Fp8Row,
        (None, Some(f)) => f,
        (None, None) => WeightFormat::Bf16,
    }
}

/// One part of a fused projection: its bf16 tensor, its FP8 copy and GGUF
/// blocks where the model has them, and its shape.
struct Part<'a> {
    dense: &'a Tensor,
    fp8: Option<&'a Fp8Tensor>,
    blocks: Option<&'a QuantTensor>,
    shape: [usize; 2],
}

impl<'a> Part<'a> {
    fn new(
        dense: &'a Tensor,
        fp8: Option<&'a Fp8Tensor>,
        blocks: Option<&'a QuantTensor>,
        shape: [usize; 2],
    ) -> Self {
        Part {
            dense,
            fp8,
            blocks,
            shape,
        }
    }
}

/// Uploads `parts` stacked into one projection in their
/// [`projection_format`].
fn upload_fused(
    gpu: &Gpu,
    w: &ModelWeights,
    parts: &[Part<'_>],
) -> Result<Projection, BackendError> {
    let blocks: Vec<_> = parts.iter().map(|p| p.blocks).collect();
    let format = projection_format(w, &blocks);
    if format.layout().is_some() {
        let qs: Vec<(&QuantTensor, &[usize])> = (parts.iter())
            .filter_map(|p| Some((p.blocks?, &p.shape[..])))
            .collect();
        return Ok(Box::new(GgufLinear::upload(gpu, format, &qs)?));
    }
    if format == WeightFormat::Fp8Row {
        let fs = parts
            .iter()
            .map(|p| match p.fp8 {
                Some(f) => Ok((f, &p.shape[..])),
                None => Err(BackendError::Device(format!(
                    "cuda: {} has no FP8 copy in an FP8 model",
                    p.dense.name
                ))),
            })
            .collect::<Result<Vec<_>, _>>()?;
        return Ok(Box::new(Fp8RowLinear::upload(gpu, &fs)?));
    }
    let ds: Vec<(&Tensor, &[usize])> = parts.iter().map(|p| (p.dense, &p.shape[..])).collect();
    Ok(Box::new(Bf16Linear::upload(gpu, &ds)?))
}

/// The four fused projections of layer `n`: each in its
/// [`projection_format`].
fn upload_projections(
    gpu: &Gpu,
    c: &ModelConfig,
    w: &ModelWeights,
    blocks: Option<&QuantWeights>,
    n: usize,
) -> Result<[Projection; 4], BackendError> {
    let (h, i) = (c.hidden_size, c.intermediate_size);
    let (q, kv) = (c.q_dim(), c.kv_dim());
    let l = &w.layers[n];
    let f = w.fp8.as_ref().map(|f| &f.layers[n]);
    let b = blocks.and_then(|b| b.layers.get(n));
    let fp = |g: fn(&Fp8Layer) -> &Fp8Tensor| f.map(g);
    let bq = |g: fn(&QuantLayer) -> &Option<QuantTensor>| b.and_then(|b| g(b).as_ref());
    Ok([
        upload_fused(
            gpu,
            w,
            &[
                Part::new(&l.q_proj, fp(|f| &f.q_proj), bq(|b| &b.q_proj), [q, h]),
                Part::new(&l.k_proj, fp(|f| &f.k_proj), bq(|b| &b.k_proj), [kv, h]),
                Part::new(&l.v_proj, fp(|f| &f.v_proj), bq(|b| &b.v_proj), [kv, h]),
            ],
        )?,
        upload_fused(
            gpu,
            w,
            &[Part::new(
                &l.o_proj,
                fp(|f| &f.o_proj),
                bq(|b| &b.o_proj),
                [h, q],
            )],
        )?,
        upload_fused(
            gpu,
            w,
            &[
                Part::new(
                    &l.gate_proj,
                    fp(|f| &f.gate_proj),
                    bq(|b| &b.gate_proj),
                    [i, h],
                ),
                Part::new(&l.up_proj, fp(|f| &f.up_proj), bq(|b| &b.up_proj), [i, h]),
            ],
        )?,
        upload_fused(
            gpu,
            w,
            &[Part::new(
                &l.down_proj,
                fp(|f| &f.down_proj),
                bq(|b| &b.down_proj),
                [h, i],
            )],
        )?,
    ])
}

/// The LM head's own projection: its FP8 copy; else its GGUF blocks (the
/// embedding's when tied, the embedding staying bf16 for the lookup) in a
/// format the GEMVs read; else an untied bf16 head; else `None` (tied to
/// the embedding).
fn upload_head(
    gpu: &Gpu,
    c: &ModelConfig,
    w: &ModelWeights,
    blocks: Option<&QuantWeights>,
) -> Result<Option<Projection>, BackendError> {
    let shape = [c.vocab_size, c.hidden_size];
    let head8 = w.fp8.as_ref().and_then(|f| f.lm_head.as_ref());
    let blocks = (blocks.and_then(|b| b.head.as_ref()))
        .filter(|_| w.fp8.is_none())
        .and_then(|b| Some((b, gguf::format_of(b.ty)?)));
    let p: Projection = match (head8, blocks, &w.lm_head) {
        (Some(f), _, _) => Box::new(Fp8RowLinear::upload(gpu, &[(f, &shape)])?),
        (None, Some((b, format)), _) => Box::new(GgufLinear::upload(gpu, format, &[(b, &shape)])?),
        (None, None, Some(t)) => Box::new(Bf16Linear::upload(gpu, &[(t, &shape)])?),
        (None, None, None) => return Ok(None),
    };
    Ok(Some(p))
}

/// Uploads `w`, fusing Q/K/V and gate/up, checking every shape against `c`.
fn upload_weights(
    gpu: &Gpu,
    c: &ModelConfig,
    w: &ModelWeights,
    blocks: Option<&QuantWeights>,
) -> Result<DeviceWeights, BackendError> {
    let (h, i, v) = (c.hidden_size, c.intermediate_size, c.vocab_size);
    let counts = [
        ("weights", Some(w.layers.len())),
        ("FP8 weights", w.fp8.as_ref().map(|f| f.layers.len())),
        ("GGUF blocks", blocks.map(|b| b.layers.len())),
    ];
    for (what, n) in counts {
        if let Some(n) = n
            && n != c.num_layers
        {
            return Err(BackendError::Device(format!(
                "cuda: {what} hold {n} layers, config.num_hidden_layers is {}",
                c.num_layers
            )));
        }
    }
    let progress = checkpoint::progress::Progress::new(
        "uploading weights to the GPU",
        checkpoint::progress::Unit::Items("layers"),
        c.num_layers as u64 + 1,
        0,
    );
    let mut layers = Vec::with_capacity(c.num_layers);
    for (n, l) in w.layers.iter().enumerate() {
        progress.inc(1);
        let [qkv, o, gate_up, down] = upload_projections(gpu, c, w, blocks, n)?;
        layers.push(DeviceLayer {
            input_norm: upload(gpu, &l.input_norm, &[h])?,
            post_norm: upload(gpu, &l.post_norm, &[h])?,
            qkv,
            o,
            gate_up,
            down,
            extras: upload_extras(gpu, l)?,
        });
    }
    let lm_head = upload_head(gpu, c, w, blocks)?;
    let wide = |p: &Projection| p.format() != WeightFormat::Bf16;
    let any_wide = lm_head.as_ref().is_some_and(wide)
        || (layers.iter()).any(|l| [&l.qkv, &l.o, &l.gate_up, &l.down].into_iter().any(wide));
    // rows * k of the largest fused projection (the LM head's when widened)
    let widest = [
        (c.q_dim() + 2 * c.kv_dim()) * h,
        h * c.q_dim(),
        2 * i * h,
        h * i,
        lm_head.as_ref().filter(|p| wide(p)).map_or(0, |_| v * h),
    ]
    .into_iter()
    .max()
    .unwrap_or(0);
    let widened = match any_wide {
        true => Some(
            gpu.alloc::<bf16>(widest)
                .map_err(|e| dev_err("allocating the widened projection", e))?,
        ),
        false => None,
    };
    let out = DeviceWeights {
        embed: upload(gpu, &w.embed, &[v, h])?,
        lm_head,
        norm: upload(gpu, &w.norm, &[h])?,
        layers,
        widened,
    };
    progress.inc(1);
    progress.finish();
    Ok(out)
}

/// The paged KV pool: per layer K and V of `[(num_blocks + 1) * block_size,
/// kv_heads, head_dim]`, bf16 or FP8 e4m3 bytes at the layer's scales.
pub(super) enum KvCache {
    Bf16 {
        k: Vec<DeviceBuffer<bf16>>,
        v: Vec<DeviceBuffer<bf16>>,
    },
    Fp8 {
        k: Vec<DeviceBuffer<u8>>,
        v: Vec<DeviceBuffer<u8>>,
        scales: KvScales,
        /// Keys (and queries) Hadamard-rotated after RoPE
        /// (`ops::hadamard::rotates_keys`).
        rotate: bool,
    },
}

/// `layers` zeroed K (or V) caches of `len` elements of `T`.
fn alloc_caches<T: bytemuck::Pod>(
    gpu: &Gpu,
    layers: usize,
    len: usize,
    what: &str,
) -> Result<Vec<DeviceBuffer<T>>, BackendError> {
    (0..layers)
        .map(|_| {
            gpu.alloc::<T>(len)
                .map_err(|e| dev_err(&format!("allocating the {what} cache"), e))
        })
        .collect()
}

impl KvCache {
    /// The pool of `kv` in `dtype` (BF16 or FP8; FP8 at `scales`).
    pub fn new(
        gpu: &Gpu,
        c: &ModelConfig,
        kv: KvShape,
        dtype: KvCacheDtype,
        scales: KvScales,
    ) -> Result<KvCache, BackendError> {
        let len = (kv.num_blocks + 1) * kv.block_size * c.kv_dim();
        let layers = c.num_layers;
        match dtype {
            KvCacheDtype::Fp8 => Ok(KvCache::Fp8 {
                k: alloc_caches(gpu, layers, len, "K")?,
                v: alloc_caches(gpu, layers, len, "V")?,
                rotate: ops::hadamard::rotates_keys(dtype, &scales, c.head_dim),
                scales,
            }),
            KvCacheDtype::Bf16 => Ok(KvCache::Bf16 {
                k: alloc_caches(gpu, layers, len, "K")?,
                v: alloc_caches(gpu, layers, len, "V")?,
            }),
            KvCacheDtype::F32 => Err(BackendError::Device(
                "cuda: an f32 KV cache is not built (`--kv-cache-dtype bf16` or `fp8`)".into(),
            )),
        }
    }

    /// Layer `l`'s K and V as the kernels take them.
    pub fn layer(&self, l: usize) -> KvCaches<'_> {
        match self {
            KvCache::Bf16 { k, v } => KvCaches::bf16(k[l].view(), v[l].view()),
            KvCache::Fp8 {
                k,
                v,
                scales,
                rotate,
            } => {
                let (k_scale, v_scale) = scales.layer(l);
                KvCaches::Fp8 {
                    k: k[l].view(),
                    v: v[l].view(),
                    k_scale,
                    v_scale,
                    rotate: *rotate,
                }
            }
        }
    }

    /// The stored element type.
    pub fn dtype(&self) -> KvCacheDtype {
        match self {
            KvCache::Bf16 { .. } => KvCacheDtype::Bf16,
            KvCache::Fp8 { .. } => KvCacheDtype::Fp8,
        }
    }
}

/// Everything of the model on the device: weights, the KV pool and the
/// RoPE tables.
pub(super) struct DeviceModel {
    pub w: DeviceWeights,
    pub cache: KvCache,
    /// Each distinct RoPE of the layers: cos and sin, `[rope_rows, head_dim / 2]` each.
    ropes: Vec<[DeviceBuffer<f32>; 2]>,
    /// `[layers]` index into `ropes`.
    rope_of: Vec<usize>,
    /// Rows of the RoPE tables = longest context:
    /// min(max_position_embeddings, pool slots).
    pub rope_rows: usize,
}

impl DeviceModel {
    /// Uploads `w` and the RoPE tables and allocates the KV pool `kv` in
    /// `kv_dtype` (FP8 at the weights' per-layer K/V scales, 1 without).
    pub fn upload(
        gpu: &Gpu,
        c: &ModelConfig,
        w: &ModelWeights,
        blocks: Option<&QuantWeights>,
        kv: KvShape,
        kv_dtype: KvCacheDtype,
    ) -> Result<DeviceModel, BackendError> {
        let rope_rows = c.max_position_embeddings.min(kv.num_blocks * kv.block_size);
        let tables = ops::rope::LayerRopes::new(c, rope_rows);
        let up = |t: &[f32]| {
            gpu.upload(t)
                .map_err(|e| dev_err("uploading the RoPE table", e))
        };
        let ropes = (tables.distinct().iter())
            .map(|r| Ok([up(r.cos())?, up(r.sin())?]))
            .collect::<Result<_, BackendError>>()?;
        Ok(DeviceModel {
            ropes,
            rope_of: tables.of_layers().to_vec(),
            w: upload_weights(gpu, c, w, blocks)?,
            cache: KvCache::new(gpu, c, kv, kv_dtype, w.kv_scales_or_ones())?,
            rope_rows,
        })
    }

    /// Layer `l`'s RoPE cosines, `[rope_rows, head_dim / 2]`.
    pub fn rope_cos(&self, l: usize) -> gpu::DevSlice<'_, f32> {
        self.ropes[self.rope_of[l]][0].view()
    }

    /// Layer `l`'s RoPE sines, `[rope_rows, head_dim / 2]`.
    pub fn rope_sin(&self, l: usize) -> gpu::DevSlice<'_, f32> {
        self.ropes[self.rope_of[l]][1].view()
    }
}
