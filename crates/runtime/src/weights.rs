//! The weights in the format [`WeightOptions`] asks. [`WeightFormat::Auto`]
//! keeps the blocks of the GGUF the model was imported from
//! (`checkpoint::store::source_gguf`) in the types the backend reads
//! (`model::cpu::KEPT_GGML_TYPES` on the CPU's fast kernels), so the
//! store's default model runs from its 4-bit weights as llama.cpp does;
//! CUDA runs them widened to BF16.
//!
//! Costs: loading reads every weight once (the safetensors files are memory
//! mapped and converted to BF16; with GGUF blocks the GGUF's kept tensors
//! too).

use std::path::PathBuf;

use checkpoint::loader::LoadedModel;
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
    // CUDA's block GEMVs (`model::cuda::gguf`) are not yet the default: the
    // GPU run that checks them against the CPU has not passed on this tree
    let blocks = opts.format == WeightFormat::Auto && !cuda && path == CpuPath::Fast;
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
    let qt = match format {
        // the CPU runs FP8 weights widened, GGUF blocks as they are
        WeightFormat::Auto | WeightFormat::Bf16 | WeightFormat::Fp8 => {
            return Ok(CpuWeights::Stored);
        }
        WeightFormat::Q8_0 => QuantType::Q8_0,
        WeightFormat::Q4_1 => QuantType::Q4_1,
        WeightFormat::Q4_K => QuantType::Q4_K,
    };
    let name = qt.name().to_lowercase();
    if cuda {
        invalid!(
            "invalid `--dtype {name}`: the CUDA backend runs BF16 and FP8 weights (use `--dtype bf16`, `fp8` or `auto`, or `--device cpu`)"
        );
    }
    if path == CpuPath::Reference {
        invalid!(
            "invalid `--dtype {name}`: the reference CPU kernels run BF16 weights only (use `--cpu-kernels fast`)"
        );
    }
    Ok(CpuWeights::Quantize(qt))
}
