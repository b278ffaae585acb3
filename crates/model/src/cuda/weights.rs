//! Weights and KV pool on the device.
//!
//! Contract: every tensor is uploaded once and checked against the config
//! first (the error names the tensor): bf16, each projection in its stored
//! format ([`checkpoint::Projection`]: BF16, or FP8 as e4m3 bytes with one
//! f32 scale per row, or a GGUF's own blocks in a format the GEMVs read,
//! `gguf`; int4 codes with their groups' scales and zeros, `int4`, a
//! checkpoint's column order widened to bf16) as a [`Projection`], the `linear` implementation of that
//! format, made in [`linear_of`] (the upload's one match on the stored
//! formats; parts of different formats in one fused projection, as a
//! Q4_K_M file's Q4_K Q and K beside a Q6_K V, go up as their BF16
//! values). Q/K/V are fused into one
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

use checkpoint::projection::Projection as Stored;
use checkpoint::quantized::QuantTensor;
use checkpoint::weights::{Extra, LayerWeights, ModelWeights, Tensor};
use contract::backend::{BackendError, KvShape};
use contract::config::{KvCacheDtype, KvScales, ModelConfig};
use kernels::KvCaches;

use super::errors::dev_err;
use super::gguf::{self, GgufLinear};
use super::int4::Int4Linear;
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

    /// The bytes of the weights as uploaded (the widening buffer, scratch,
    /// left out).
    pub fn bytes(&self) -> crate::WeightBytes {
        let b = |t: &DeviceBuffer<bf16>| t.view().num_bytes();
        let layers = (self.layers.iter())
            .map(|l| {
                let projections = [&l.qkv, &l.o, &l.gate_up, &l.down];
                let p: usize = projections.iter().map(|p| p.gemv().bytes()).sum();
                let e = &l.extras;
                let vectors = [
                    &e.qkv_bias,
                    &e.o_bias,
                    &e.gate_up_bias,
                    &e.down_bias,
                    &e.attn_out_norm,
                    &e.mlp_out_norm,
                ];
                let v: usize = vectors.into_iter().flatten().map(b).sum();
                let qk: usize = e.qk_norm.iter().flatten().map(b).sum();
                p + v + qk + b(&l.input_norm) + b(&l.post_norm)
            })
            .sum();
        crate::WeightBytes {
            layers,
            final_norm: b(&self.norm),
            embed: b(&self.embed),
            lm_head: self.lm_head.as_ref().map(|p| p.gemv().bytes()),
        }
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

/// The GEMV kernels' format of `p`: its block format where the GEMVs read
/// it (`gguf::format_of`), else the BF16 it goes up as.
fn gemv_format(p: &Stored) -> WeightFormat {
    match p {
        Stored::Bf16(_) => WeightFormat::Bf16,
        Stored::Fp8(_) => WeightFormat::Fp8Row,
        Stored::Blocks(t) => gguf::format_of(t.ty).unwrap_or(WeightFormat::Bf16),
        // a column order (GPTQ desc_act): widened, the GEMVs read x in input order
        Stored::Int4(t) if t.perm.is_some() => WeightFormat::Bf16,
        Stored::Int4(_) => WeightFormat::Int4,
    }
}

/// The GEMV kernels' format of the layer projections of `w` (the first
/// one's), for the plan's tuning before the upload.
pub(super) fn projection_format(w: &ModelWeights) -> WeightFormat {
    w.layers
        .first()
        .map_or(WeightFormat::Bf16, |l| gemv_format(&l.q_proj))
}

/// The stored projections `parts`, each checked against its `[out, in]`,
/// row-stacked into one device projection of their format; parts of
/// different formats (a Q4_K_M file's Q4_K Q and K beside a Q6_K V), and
/// blocks the GEMVs do not read, go up as their BF16 values, widened here
/// one fused projection at a time.
fn linear_of(gpu: &Gpu, parts: &[(&Stored, [usize; 2])]) -> Result<Projection, BackendError> {
    let Some(&(first, _)) = parts.first() else {
        return Err(BackendError::Device("cuda: an empty projection".into()));
    };
    let err = |e: checkpoint::FormatError| BackendError::Device(format!("cuda: {e}"));
    for (p, want) in parts {
        p.check(*want).map_err(err)?;
    }
    let format = gemv_format(first);
    let mixed =
        (parts.iter()).any(|(p, _)| p.format() != first.format() || gemv_format(p) != format);
    let widened =
        matches!(first, Stored::Blocks(_) | Stored::Int4(_)) && format == WeightFormat::Bf16;
    if mixed || widened {
        let dense = (parts.iter())
            .map(|(p, _)| p.dense().map_err(err))
            .collect::<Result<Vec<_>, _>>()?;
        let ts: Vec<&Tensor> = dense.iter().map(|t| t.as_ref()).collect();
        return Ok(Box::new(Bf16Linear::upload(gpu, &ts)?));
    }
    // the upload's one match on the stored formats (all parts share one)
    Ok(match first {
        Stored::Bf16(_) => {
            let ts: Vec<&Tensor> = parts.iter().filter_map(|(p, _)| p.as_bf16()).collect();
            Box::new(Bf16Linear::upload(gpu, &ts)?)
        }
        Stored::Fp8(_) => {
            let fs: Vec<_> = (parts.iter())
                .filter_map(|(p, _)| match p {
                    Stored::Fp8(f) => Some(f),
                    _ => None,
                })
                .collect();
            Box::new(Fp8RowLinear::upload(gpu, &fs)?)
        }
        Stored::Blocks(_) => {
            let qs: Vec<(&QuantTensor, &[usize])> = (parts.iter())
                .filter_map(|(p, want)| match p {
                    Stored::Blocks(t) => Some((t, &want[..])),
                    _ => None,
                })
                .collect();
            Box::new(GgufLinear::upload(gpu, format, &qs)?)
        }
        Stored::Int4(_) => {
            let ts: Vec<_> = (parts.iter())
                .filter_map(|(p, _)| match p {
                    Stored::Int4(t) => Some(t),
                    _ => None,
                })
                .collect();
            Box::new(Int4Linear::upload(gpu, &ts)?)
        }
    })
}

/// The four fused projections of layer `l`.
fn upload_projections(
    gpu: &Gpu,
    c: &ModelConfig,
    l: &LayerWeights,
) -> Result<[Projection; 4], BackendError> {
    let (h, i) = (c.hidden_size, c.intermediate_size);
    let (q, kv) = (c.q_dim(), c.kv_dim());
    Ok([
        linear_of(
            gpu,
            &[
                (&l.q_proj, [q, h]),
                (&l.k_proj, [kv, h]),
                (&l.v_proj, [kv, h]),
            ],
        )?,
        linear_of(gpu, &[(&l.o_proj, [h, q])])?,
        linear_of(gpu, &[(&l.gate_proj, [i, h]), (&l.up_proj, [i, h])])?,
        linear_of(gpu, &[(&l.down_proj, [h, i])])?,
    ])
}

/// Uploads `w`, fusing Q/K/V and gate/up, checking every shape against `c`.
fn upload_weights(
    gpu: &Gpu,
    c: &ModelConfig,
    w: &ModelWeights,
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
        let [qkv, o, gate_up, down] = upload_projections(gpu, c, l)?;
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
    let lm_head = (w.lm_head.as_ref())
        .map(|p| linear_of(gpu, &[(p, [v, h])]))
        .transpose()?;
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
            w: upload_weights(gpu, c, w)?,
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
