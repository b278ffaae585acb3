//! The weights in the format [`WeightOptions`] asks. [`WeightFormat::Auto`]
//! keeps the blocks of the GGUF the model was imported from
//! (`checkpoint::store::source_gguf`) in the types the backend reads
//! (`model::cpu::KEPT_GGML_TYPES` on the CPU, `model::cuda::KEPT_GGML_TYPES`
//! on CUDA), so the store's default model runs from its 4-bit weights as
//! llama.cpp does.
//!
//! Costs: loading reads every weight once (the safetensors files are memory
//! mapped and converted to BF16; with GGUF blocks the GGUF's kept tensors
//! too).

use std::path::{Path, PathBuf};

use checkpoint::loader::LoadedModel;
use cpu_kernels::quant::QuantType;
use model::cpu::{CpuPath, CpuWeights};

use crate::error::{Context, RuntimeError, invalid};
use crate::options::{WeightFormat, WeightOptions};

/// The weights of `loaded` in the format asked: FP8 quantised at load for
/// [`WeightFormat::Fp8`]; an FP8 checkpoint keeps its FP8 weights unless a
/// BF16 or Q format is asked (which starts from the dequantised values).
/// The CPU keeps only the dequantised values.
pub(crate) fn load_weights(
    opts: &WeightOptions,
    loaded: &LoadedModel,
    cuda: bool,
) -> Result<checkpoint::ModelWeights, RuntimeError> {
    let mut w = checkpoint::loader::load_weights(&loaded.dir, &loaded.config)?;
    match opts.format {
        WeightFormat::Fp8 => w.quantize_fp8(),
        WeightFormat::Auto => {}
        _ => w.fp8 = None,
    }
    // (quantize_lm_head_fp8 rounds the head: it runs first, when asked)
    let needs_fp8 = [
        (
            "--quantize-lm-head",
            opts.quantize_lm_head && w.quantize_lm_head_fp8().is_none(),
        ),
        ("--fp8-activations", opts.fp8_activations && w.fp8.is_none()),
    ];
    if let Some((flag, _)) = needs_fp8.iter().find(|(_, missing)| *missing) {
        invalid!(
            "{flag} needs FP8 weights: add --dtype fp8 (or use an FP8 checkpoint with --dtype auto)"
        );
    }
    if !cuda {
        w.fp8 = None;
    }
    Ok(w)
}

/// The CPU backend's weight format for `format` on kernels `path`, with the
/// GGUF whose blocks it keeps (on CUDA, `cuda`: the blocks the CUDA backend
/// runs, for [`WeightFormat::Auto`]); an error for a quantised format on
/// CUDA or on the reference kernels.
pub(crate) fn cpu_weights(
    format: WeightFormat,
    path: CpuPath,
    dir: &Path,
    cfg: &contract::ModelConfig,
    cuda: bool,
) -> Result<(CpuWeights, Option<PathBuf>), RuntimeError> {
    let reference = path == CpuPath::Reference;
    let quantize = match format {
        WeightFormat::Auto if reference && !cuda => return Ok((CpuWeights::Bf16, None)),
        // the CPU runs FP8 weights dequantised (see `load_weights`)
        WeightFormat::Bf16 | WeightFormat::Fp8 => return Ok((CpuWeights::Bf16, None)),
        WeightFormat::Auto => None,
        WeightFormat::Q8_0 => Some(QuantType::Q8_0),
        WeightFormat::Q4_1 => Some(QuantType::Q4_1),
        WeightFormat::Q4_K => Some(QuantType::Q4_K),
    };
    if let Some(qt) = quantize {
        let name = qt.name().to_lowercase();
        if cuda {
            invalid!(
                "invalid `--dtype {name}`: the CUDA backend runs BF16 and FP8 weights (use `--dtype bf16`, `fp8` or `auto`, or `--device cpu`)"
            );
        }
        if reference {
            invalid!(
                "invalid `--dtype {name}`: the reference CPU kernels run BF16 weights only (use `--cpu-kernels fast`)"
            );
        }
        return Ok((CpuWeights::Quantize(qt), None));
    }
    let Some(gguf) = checkpoint::store::source_gguf(dir)? else {
        return Ok((CpuWeights::Bf16, None));
    };
    let keep: &[_] = match cuda {
        true => &model::cuda::KEPT_GGML_TYPES,
        false => &model::cpu::KEPT_GGML_TYPES,
    };
    let q = checkpoint::quantized::load_quantized(&gguf, cfg, keep)
        .with_context(|| format!("reading the quantised weights of {}", gguf.display()))?;
    if q.tensors().next().is_none() {
        return Ok((CpuWeights::Bf16, None));
    }
    Ok((CpuWeights::Blocks(q), Some(gguf)))
}
