//! `lamina quantize`: writes a BF16 (or F16 / F32) model directory as an
//! FP8 checkpoint in one of the layouts on the Hugging Face hub
//! (compressed-tensors `float-quantized`, or `quant_method: "fp8"`), which
//! lamina, vLLM and SGLang load as they are. Refuses a non-empty `--out`.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use checkpoint::fp8::{Fp8Layout, Fp8Options, write_fp8_checkpoint};

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayoutArg {
    /// `quant_method: "compressed-tensors"`, `format: "float-quantized"`
    /// (llm-compressor's `FP8` / `FP8_DYNAMIC` schemes).
    CompressedTensors,
    /// `quant_method: "fp8"` with per-tensor scales (AutoFP8).
    Fp8,
}

#[derive(clap::Args, Debug)]
pub struct QuantizeArgs {
    /// The model directory to quantise (Hugging Face layout).
    pub model: PathBuf,
    /// Output directory (created; must be empty).
    #[arg(long)]
    pub out: PathBuf,
    /// The checkpoint layout to write.
    #[arg(long, value_enum, default_value = "compressed-tensors")]
    pub layout: LayoutArg,
    /// One scale per tensor instead of one per output channel (the `fp8`
    /// layout always has one per tensor).
    #[arg(long)]
    pub per_tensor: bool,
    /// Write static activation scales of this value (`input_scale`), as a
    /// calibrated checkpoint has; activations are dynamic without it.
    #[arg(long, value_parser = positive_scale, allow_hyphen_values = true)]
    pub input_scale: Option<f32>,
}

fn positive_scale(s: &str) -> Result<f32, String> {
    match s.parse::<f32>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("`{s}` is not a finite positive number")),
    }
}

pub fn run(args: QuantizeArgs) -> Result<()> {
    if std::fs::read_dir(&args.out).is_ok_and(|mut d| d.next().is_some()) {
        bail!("{} is not empty: choose another --out", args.out.display());
    }
    let layout = match args.layout {
        LayoutArg::CompressedTensors => Fp8Layout::CompressedTensors,
        LayoutArg::Fp8 => Fp8Layout::Fp8,
    };
    let opts = Fp8Options {
        layout,
        channel: layout == Fp8Layout::CompressedTensors && !args.per_tensor,
        input_scale: args.input_scale,
    };
    write_fp8_checkpoint(&args.model, &args.out, opts)
        .with_context(|| format!("quantising {} to FP8", args.model.display()))?;
    println!("{}", args.out.display());
    Ok(())
}
