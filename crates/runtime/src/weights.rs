//! The weights in the format [`WeightOptions`] asks. [`WeightFormat::Auto`]
//! keeps the blocks of the GGUF the model was imported from
//! (`checkpoint::store::source_gguf`) in the types the backend reads
//! (`model::cpu::KEPT_GGML_TYPES` on the CPU's fast kernels), so the
//! store's default model runs from its 4-bit weights as llama.cpp does.
//! `--dtype q8_0 | q4_1 | q4_k` quantises at load: the CPU packs its own
//! blocks ([`CpuWeights::Quantize`]). CUDA's block and int4 GEMVs are
//! behind [`CUDA_RUNS_BLOCKS`] (ggml blocks from [`quantize_blocks`] for
//! the Q formats, `model::cuda::KEPT_GGML_TYPES` of a GGUF), on since the
//! block and int4 whole-model tests passed on a GPU; off, CUDA would run
//! GGUF and int4 models widened to BF16.
//!
//! Costs: loading reads every weight once (the safetensors files are memory
//! mapped and converted to BF16; with GGUF blocks the GGUF's kept tensors
//! too).

use std::path::PathBuf;

use checkpoint::Projection;
use checkpoint::loader::LoadedModel;
use checkpoint::quantized::QuantTensor;
use cpu_kernels::quant::QuantType;
use model::cpu::{CpuPath, CpuWeights};

use crate::error::{Context, RuntimeError, invalid};
use crate::options::{WeightFormat, WeightOptions};

/// The weights of `loaded` in the format asked, each projection a
/// `checkpoint::Projection` in its stored format: FP8 quantised at load
/// for [`WeightFormat::Fp8`]; an FP8 checkpoint keeps its FP8 weights
/// unless a BF16 or Q format is asked (which starts from the dequantised
/// values); on the CPU's fast kernels, [`WeightFormat::Auto`] replaces the
/// projections the source GGUF holds in blocks the CPU multiplies by those
/// blocks (returned: the GGUF's path). The CPU backend widens FP8
/// projections to their BF16 values itself.
pub(crate) fn load_weights(
    opts: &WeightOptions,
    path: CpuPath,
    loaded: &LoadedModel,
    cuda: bool,
) -> Result<(checkpoint::ModelWeights, Option<PathBuf>), RuntimeError> {
    let mut w = checkpoint::loader::load_weights(&loaded.dir, &loaded.config)?;
    match opts.format {
        WeightFormat::Fp8 => w.quantize_fp8(),
        WeightFormat::Auto => {}
        _ => w.widen_fp8(),
    }
    // (quantize_lm_head_fp8 rounds the head: it runs first, when asked)
    let needs_fp8 = [
        (
            "--quantize-lm-head",
            opts.quantize_lm_head && w.quantize_lm_head_fp8().is_none(),
        ),
        ("--fp8-activations", opts.fp8_activations && !w.is_fp8()),
    ];
    if let Some((flag, _)) = needs_fp8.iter().find(|(_, missing)| *missing) {
        invalid!(
            "{flag} needs FP8 weights: add --dtype fp8 (or use an FP8 checkpoint with --dtype auto)"
        );
    }
    if cuda && !CUDA_RUNS_BLOCKS {
        widen_int4(&mut w)?;
    }
    if let Some(qt) = quant_type(opts.format).filter(|_| cuda) {
        quantize_blocks(&mut w, qt)?;
        return Ok((w, None));
    }
    let blocks = opts.format == WeightFormat::Auto
        && match cuda {
            true => CUDA_RUNS_BLOCKS,
            false => path == CpuPath::Fast,
        };
    let gguf = match blocks {
        true => checkpoint::store::source_gguf(&loaded.dir)?,
        false => None,
    };
    let Some(gguf) = gguf else {
        return Ok((w, None));
    };
    let cfg = &loaded.config;
    let keep: &[_] = match cuda {
        true => &model::cuda::KEPT_GGML_TYPES,
        false => &model::cpu::KEPT_GGML_TYPES,
    };
    let kept = checkpoint::quantized::keep_blocks(&gguf, cfg, &mut w, keep)
        .with_context(|| format!("reading the quantised weights of {}", gguf.display()))?;
    Ok((w, (kept > 0).then_some(gguf)))
}

/// How the CPU backend packs the weights for `format` on kernels `path`;
/// an error for a quantised format on CUDA or on the reference kernels.
pub(crate) fn cpu_weights(
    format: WeightFormat,
    path: CpuPath,
    cuda: bool,
) -> Result<CpuWeights, RuntimeError> {
    // the CPU runs FP8 weights widened, GGUF blocks as they are; CUDA's
    // blocks come from `load_weights`
    let Some(qt) = quant_type(format) else {
        return Ok(CpuWeights::Stored);
    };
    let name = qt.name().to_lowercase();
    if cuda && !CUDA_RUNS_BLOCKS {
        invalid!(
            "invalid `--dtype {name}`: the CUDA backend runs BF16 and FP8 weights (use `--dtype bf16`, `fp8` or `auto`, or `--device cpu`)"
        );
    }
    if cuda {
        return Ok(CpuWeights::Stored);
    }
    if path == CpuPath::Reference {
        invalid!(
            "invalid `--dtype {name}`: the reference CPU kernels run BF16 weights only (use `--cpu-kernels fast`)"
        );
    }
    Ok(CpuWeights::Quantize(qt))
}

/// Whether CUDA multiplies ggml blocks and int4 projections as they are
/// (`model::cuda`'s block and int4 GEMVs: a GGUF's own blocks with `--dtype
/// auto`, an int4 checkpoint's, `--dtype q8_0 | q4_1 | q4_k`); while off it
/// widens a GGUF's blocks and an int4 checkpoint to BF16 and refuses the Q
/// formats. On: `cuda::tests::gguf_blocks` and `cuda::tests::int4` pass on
/// a GPU (within 1.5x of the same model's BF16 error).
const CUDA_RUNS_BLOCKS: bool = true;

/// Widens every int4 projection (the LM head too) to its BF16 values.
fn widen_int4(w: &mut checkpoint::ModelWeights) -> Result<(), RuntimeError> {
    for p in w.projections_mut() {
        if matches!(p.format(), checkpoint::Format::Int4 { .. }) {
            let t = p
                .dense()
                .map_err(|e| RuntimeError::Invalid(e.to_string()))?;
            *p = Projection::Bf16(t.into_owned());
        }
    }
    Ok(())
}

/// The block type `--dtype` asks to quantise to at load, if any.
fn quant_type(format: WeightFormat) -> Option<QuantType> {
    match format {
        WeightFormat::Auto | WeightFormat::Bf16 | WeightFormat::Fp8 => None,
        WeightFormat::Q8_0 => Some(QuantType::Q8_0),
        WeightFormat::Q4_1 => Some(QuantType::Q4_1),
        WeightFormat::Q4_K => Some(QuantType::Q4_K),
    }
}

/// CUDA's `--dtype q8_0 | q4_1 | q4_k`: every BF16 layer projection in
/// ggml blocks of `qt` (Q4_K only where its rows are whole super-blocks,
/// else Q4_1, as the CPU does), quantised as ggml's reference quantisers
/// do (`cpu_kernels::quant::quantize_row`), and the LM head in Q8_0 (a
/// 4-bit head costs more accuracy than it saves; a tied head gets its own
/// copy). Projections in another format (FP8, a GGUF's blocks) stay.
fn quantize_blocks(w: &mut checkpoint::ModelWeights, qt: QuantType) -> Result<(), RuntimeError> {
    let quantized =
        |e: String| RuntimeError::Invalid(format!("--dtype {}: {e}", qt.name().to_lowercase()));
    for l in &mut w.layers {
        for p in l.projections_mut() {
            if let Projection::Bf16(t) = p {
                *p = Projection::Blocks(blocks_of(t, qt).map_err(quantized)?);
            }
        }
    }
    if !matches!(w.lm_head, Some(Projection::Fp8(_) | Projection::Blocks(_))) {
        let head = w.head_dense().map_err(|e| quantized(e.to_string()))?;
        let mut head = blocks_of(head.as_ref(), QuantType::Q8_0).map_err(quantized)?;
        head.name = "lm_head.weight".into();
        w.lm_head = Some(Projection::Blocks(head));
    }
    Ok(())
}

/// `t` (`[rows, cols]`) in ggml blocks of `qt` (Q4_K falling back to Q4_1
/// for rows that are not whole super-blocks), rows quantised in parallel.
fn blocks_of(t: &checkpoint::Tensor, qt: QuantType) -> Result<QuantTensor, String> {
    use checkpoint::gguf::GgmlType;
    use rayon::prelude::*;
    let &[rows, cols] = &t.shape[..] else {
        return Err(format!(
            "tensor `{}` has shape {:?}, not [rows, cols]",
            t.name, t.shape
        ));
    };
    let qt = match qt {
        QuantType::Q4_K if !cols.is_multiple_of(QuantType::Q4_K.block_len()) => QuantType::Q4_1,
        q => q,
    };
    if !cols.is_multiple_of(qt.block_len()) {
        return Err(format!(
            "tensor `{}`: its rows of {cols} are not whole {} blocks of {}",
            t.name,
            qt.name(),
            qt.block_len()
        ));
    }
    let data: Vec<u8> = (t.data.par_chunks(cols))
        .flat_map_iter(|row| {
            let f: Vec<f32> = row.iter().map(|v| v.to_f32()).collect();
            let mut out = Vec::with_capacity(qt.matrix_bytes(1, cols));
            cpu_kernels::quant::quantize_row(qt, &f, &mut out);
            out
        })
        .collect();
    let ty = match qt {
        QuantType::Q8_0 => GgmlType::Q8_0,
        QuantType::Q4_1 => GgmlType::Q4_1,
        QuantType::Q4_K => GgmlType::Q4_K,
        QuantType::Q6_K => GgmlType::Q6_K,
    };
    let name = t.name.clone();
    Ok(QuantTensor {
        name,
        rows,
        cols,
        ty,
        data,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use checkpoint::gguf::GgmlType;
    use checkpoint::{LayerWeights, ModelWeights, Tensor};
    use half::bf16;

    fn tensor(name: &str, rows: usize, cols: usize, seed: usize) -> Tensor {
        let data = (0..rows * cols)
            .map(|i| bf16::from_f32((((i * 7919 + seed * 104729) % 1000) as f32 - 500.0) / 1000.0))
            .collect();
        Tensor {
            name: name.into(),
            shape: vec![rows, cols],
            data,
        }
    }

    /// A one-layer model whose down projection's rows (192) are not whole
    /// Q4_K super-blocks; the head tied to the embedding.
    fn model() -> ModelWeights {
        let (h, i) = (256, 192);
        let p = |n: &str, r, c, s| Projection::Bf16(tensor(n, r, c, s));
        let layer = LayerWeights {
            input_norm: tensor("in", 1, h, 0),
            q_proj: p("q", h, h, 1),
            k_proj: p("k", 64, h, 2),
            v_proj: p("v", 64, h, 3),
            o_proj: p("o", h, h, 4),
            post_norm: tensor("post", 1, h, 5),
            gate_proj: p("gate", i, h, 6),
            up_proj: p("up", i, h, 7),
            down_proj: p("down", h, i, 8),
            extras: Default::default(),
        };
        ModelWeights {
            embed: tensor("embed", 40, h, 9),
            layers: vec![layer],
            norm: tensor("norm", 1, h, 10),
            lm_head: None,
            kv_scales: None,
        }
    }

    #[test]
    fn quantised_blocks_decode_near_the_bf16_values_in_the_asked_types() {
        for (qt, want, tol) in [
            (QuantType::Q8_0, GgmlType::Q8_0, 0.005),
            (QuantType::Q4_1, GgmlType::Q4_1, 0.04),
            (QuantType::Q4_K, GgmlType::Q4_K, 0.04),
        ] {
            let bf = model();
            let mut w = model();
            quantize_blocks(&mut w, qt).expect("quantises");
            let (l, l0) = (&w.layers[0], &bf.layers[0]);
            for (p, p0) in l.projections().into_iter().zip(l0.projections()) {
                let Projection::Blocks(q) = p else {
                    panic!("{} not in blocks", p.name())
                };
                // down's rows of 192 are not whole super-blocks: Q4_1
                let ty = if q.name == "down" && want == GgmlType::Q4_K {
                    GgmlType::Q4_1
                } else {
                    want
                };
                assert_eq!((q.name.as_str(), q.ty), (p0.name(), ty));
                let (got, exact) = (p.to_f32_rows().unwrap(), p0.to_f32_rows().unwrap());
                let err = got
                    .iter()
                    .zip(&exact)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f32, f32::max);
                assert!(err <= tol, "{qt:?} {}: max error {err}", q.name);
            }
            // the tied head gets its own Q8_0 copy; the embedding stays
            let Some(Projection::Blocks(head)) = &w.lm_head else {
                panic!("head not in blocks")
            };
            assert_eq!(
                (head.ty, head.name.as_str()),
                (GgmlType::Q8_0, "lm_head.weight")
            );
            assert_eq!(w.embed, bf.embed);
        }
    }

    #[test]
    fn int4_projections_widen_to_their_decoded_values() {
        let mut w = model();
        let q = checkpoint::int4::Int4Tensor::round_to_nearest(&tensor("o", 256, 256, 4), 32, true);
        w.layers[0].o_proj = Projection::Int4(q);
        let want = w.layers[0].o_proj.to_f32_rows().unwrap();
        widen_int4(&mut w).unwrap();
        let Projection::Bf16(t) = &w.layers[0].o_proj else {
            panic!("o_proj not widened")
        };
        assert_eq!(t.shape, [256, 256]);
        // the decoded values rounded to bf16, nothing else
        for (a, b) in t.data.iter().zip(&want) {
            assert_eq!(*a, bf16::from_f32(*b));
        }
        assert!(matches!(w.layers[0].q_proj, Projection::Bf16(_)));
    }

    #[test]
    fn rows_that_are_not_whole_blocks_are_refused_naming_the_tensor() {
        let mut w = model();
        w.layers[0].down_proj =
            Projection::Bf16(tensor("model.layers.0.mlp.down_proj.weight", 256, 200, 1));
        let err = quantize_blocks(&mut w, QuantType::Q8_0)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("down_proj") && err.contains("200") && err.contains("q8_0"),
            "{err}"
        );
    }
}
