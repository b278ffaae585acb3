//! `lamina quantize`: writes a BF16 (or F16 / F32) model as an FP8
//! checkpoint in one of the layouts on the Hugging Face hub
//! (compressed-tensors `float-quantized`, or `quant_method: "fp8"`), or
//! with `--format int4` as a symmetric 4-bit GPTQ-layout checkpoint
//! (`--group-size` columns a scale, `desc_act: false`:
//! `checkpoint::int4::write`), which lamina, vLLM and SGLang load as they
//! are. The weights are rounded to nearest, or with `--calibration`
//! quantised by GPTQ against the model's activations on that text
//! (`model::gptq`, on the FP8 or the 4-bit grid). The model is a directory, a
//! store id or a .gguf file (imported into the store once, as `--model`
//! is). Refuses a non-empty `--out`; every flag and the calibration text
//! are checked before the weights load.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use checkpoint::fp8::{
    Fp8Layout, Fp8Options, WeightsOut, scheme_of, write_checkpoint, write_fp8_checkpoint,
    write_quantized_checkpoint,
};
use checkpoint::progress::{Progress, Unit};
use checkpoint::weights::ModelWeights;
use contract::config::ModelConfig;
use model::gptq::{GptqOptions, ScaleRule, Target, quantize_model};
use model::kv_calib::kv_amax;
use tokenizer::Tokenizer;

use crate::files::TextFile;

/// The fewest calibration tokens GPTQ runs on (a text shorter than this is
/// refused): below it a 576-wide Hessian is barely of full rank.
pub const MIN_CALIBRATION_TOKENS: usize = 256;
/// The most `--calibration-tokens` takes: the activations of every token
/// of a layer are held at once.
pub const MAX_CALIBRATION_TOKENS: usize = 65_536;
/// Tokens per calibration window (each a sequence from position 0).
const WINDOW: usize = 512;

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayoutArg {
    /// `quant_method: "compressed-tensors"`, `format: "float-quantized"`
    /// (llm-compressor's `FP8` / `FP8_DYNAMIC` schemes).
    CompressedTensors,
    /// `quant_method: "fp8"` with per-tensor scales (AutoFP8).
    Fp8,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum FormatArg {
    /// FP8 e4m3 in `--layout`.
    Fp8,
    /// 4-bit integers, symmetric, `--group-size` columns a scale, in
    /// GPTQ's layout (`quant_method: "gptq"`, `desc_act: false`), rounded
    /// to nearest or, with `--calibration`, quantised by GPTQ.
    Int4,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightDtypeArg {
    /// FP8 e4m3 projections in `--layout`.
    Fp8,
    /// The weights as BF16, unquantised (with `--kv-scales`: a BF16 model
    /// that carries FP8 KV cache scales).
    Bf16,
}

#[derive(clap::Args, Debug)]
pub struct QuantizeArgs {
    /// The model to quantise: a directory in Hugging Face layout, a model
    /// id in the store, or a .gguf file (dequantised to BF16 first).
    pub model: String,
    /// Output directory (created; must be empty).
    #[arg(long)]
    pub out: PathBuf,
    /// The weight format to write.
    #[arg(long, value_enum, default_value = "fp8")]
    pub format: FormatArg,
    /// `--format int4`: input columns per scale (a multiple of 32 that
    /// divides every projection's input width).
    #[arg(long, default_value_t = 128)]
    pub group_size: usize,
    /// The checkpoint layout to write (FP8).
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
    /// A UTF-8 text to calibrate on (a regular file of at most 1 GiB, read
    /// only as far as `--calibration-tokens` needs): the weights are quantised by GPTQ
    /// (each column's rounding error compensated in the columns after it,
    /// against the model's activations on this text) instead of rounded
    /// to nearest. Use a text unlike the ones you evaluate on.
    #[arg(long)]
    pub calibration: Option<PathBuf>,
    /// Tokens of the calibration text to run (its first ones; all of a
    /// shorter text, at least 256).
    #[arg(long, default_value_t = 2048, requires = "calibration",
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new()
              .range(MIN_CALIBRATION_TOKENS as u64..=MAX_CALIBRATION_TOKENS as u64))]
    pub calibration_tokens: usize,
    /// GPTQ's dampening: this share of the Hessian's mean diagonal is
    /// added to its diagonal (larger: closer to rounding to nearest, less
    /// fitted to the calibration text).
    #[arg(long, default_value_t = 0.1, requires = "calibration", value_parser = dampening)]
    pub dampening: f64,
    /// GPTQ's activation order: columns quantised from the largest input
    /// energy down instead of in order (with `--format int4` a group is a
    /// run of that order: the checkpoint has `desc_act: true` and a
    /// `g_idx` per projection).
    #[arg(long, requires = "calibration")]
    pub act_order: bool,
    /// Also write calibrated FP8 KV cache scales: the model (with the
    /// weights written) runs over the `--calibration` text, and each
    /// layer's largest |K| (after RoPE) and |V| divided by 448 (e4m3's
    /// largest value) becomes `model.layers.N.self_attn.k_scale` /
    /// `v_scale`, as llm-compressor writes them (compressed-tensors' static
    /// `kv_cache_scheme`). `--kv-cache-dtype fp8` then stores K and V at
    /// those scales instead of 1, below which small values fall into
    /// e4m3's subnormals; what remains is e4m3's 3-bit mantissa, which no
    /// scale moves (docs/performance.md).
    #[arg(long, requires = "calibration")]
    pub kv_scales: bool,
    /// The weights written: FP8 (the default), or BF16 as they are (only
    /// with `--kv-scales`: the model plus its KV cache scales).
    #[arg(long, value_enum, default_value = "fp8")]
    pub weight_dtype: WeightDtypeArg,
}

fn positive_scale(s: &str) -> Result<f32, String> {
    match s.parse::<f32>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("`{s}` is not a finite positive number")),
    }
}

fn dampening(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("`{s}` is not a number in [0, 1]")),
    }
}

pub fn run(args: QuantizeArgs) -> Result<()> {
    if std::fs::read_dir(&args.out).is_ok_and(|mut d| d.next().is_some()) {
        bail!("{} is not empty: choose another --out", args.out.display());
    }
    if args.weight_dtype == WeightDtypeArg::Bf16 && !args.kv_scales {
        bail!("--weight-dtype bf16 writes the weights unquantised: it needs --kv-scales");
    }
    if args.format == FormatArg::Int4 {
        return int4(&args);
    }
    // the text is checked before the model is resolved (which may import)
    let text = args.calibration.as_deref().map(open_text).transpose()?;
    let layout = match args.layout {
        LayoutArg::CompressedTensors => Fp8Layout::CompressedTensors,
        LayoutArg::Fp8 => Fp8Layout::Fp8,
    };
    let opts = Fp8Options {
        layout,
        channel: layout == Fp8Layout::CompressedTensors && !args.per_tensor,
        input_scale: args.input_scale,
    };
    let dir = runtime::model_dir(&args.model)?;
    let what = || format!("quantising {} to FP8", dir.display());
    match (text, &args.calibration) {
        (Some(mut text), Some(file)) => {
            calibrated(&args, &dir, file, &mut text, opts).with_context(what)?
        }
        _ => write_fp8_checkpoint(&dir, &args.out, opts).with_context(what)?,
    }
    println!("{}", args.out.display());
    Ok(())
}

/// `--format int4`: the model on GPTQ's 4-bit grid, rounded to nearest or,
/// with `--calibration`, quantised by GPTQ.
fn int4(args: &QuantizeArgs) -> Result<()> {
    check_int4_flags(args)?;
    // the text is checked before the model is resolved (which may import)
    let text = args.calibration.as_deref().map(open_text).transpose()?;
    let dir = runtime::model_dir(&args.model)?;
    let what = || format!("quantising {} to int4", dir.display());
    if scheme_of(&dir).with_context(what)?.is_some() {
        bail!(
            "{} is quantised already; quantise its BF16 checkpoint",
            dir.display()
        );
    }
    let tokens = match (text, &args.calibration) {
        (Some(mut text), Some(file)) => Some(calibration_tokens(
            &dir,
            file,
            &mut text,
            args.calibration_tokens,
        )?),
        _ => None,
    };
    let loaded = checkpoint::loader::load_config(&dir).with_context(what)?;
    let mut weights = checkpoint::loader::load_weights(&dir, &loaded.config).with_context(what)?;
    if let Some(tokens) = tokens {
        let target = Target::Int4 {
            group: args.group_size,
        };
        weights = gptq(args, &loaded.config, weights, &tokens, target).with_context(what)?;
    }
    checkpoint::int4::write::write_int4_checkpoint(&dir, &weights, &args.out, args.group_size)
        .with_context(what)?;
    println!("{}", args.out.display());
    Ok(())
}

/// The flags `--format int4` takes: a group of whole blocks; not the
/// FP8-only ones that would change what is written.
fn check_int4_flags(args: &QuantizeArgs) -> Result<()> {
    if args.group_size == 0 || !args.group_size.is_multiple_of(checkpoint::int4::BLOCK) {
        bail!(
            "--group-size {} is not a positive multiple of {}",
            args.group_size,
            checkpoint::int4::BLOCK
        );
    }
    if args.kv_scales {
        bail!("--kv-scales: FP8 KV cache scales are written with --format fp8 only");
    }
    Ok(())
}

/// The calibration text, refused when unreadable, not a regular file, over
/// [`crate::files::MAX_TEXT_BYTES`] or blank.
fn open_text(file: &Path) -> Result<TextFile> {
    let mut text = TextFile::open(file, "--calibration")?;
    if text.is_blank()? {
        bail!("--calibration {} is empty", file.display());
    }
    Ok(text)
}

/// GPTQ over `text`'s tokens (FP8 weights), the KV cache scales with
/// `--kv-scales`, then the checkpoint.
fn calibrated(
    args: &QuantizeArgs,
    dir: &Path,
    file: &Path,
    text: &mut TextFile,
    opts: Fp8Options,
) -> Result<()> {
    if scheme_of(dir)?.is_some() {
        bail!(
            "--calibration: {} is a quantised checkpoint already; GPTQ quantises BF16, F16 or F32 weights",
            dir.display()
        );
    }
    let tokens = calibration_tokens(dir, file, text, args.calibration_tokens)?;
    let loaded = checkpoint::loader::load_config(dir)?;
    let weights = checkpoint::loader::load_weights(dir, &loaded.config)?;
    let (weights, how) = match args.weight_dtype {
        WeightDtypeArg::Fp8 => (
            gptq(args, &loaded.config, weights, &tokens, fp8_target(opts))?,
            WeightsOut::Fp8(opts),
        ),
        WeightDtypeArg::Bf16 => (weights, WeightsOut::Bf16),
    };
    if !args.kv_scales {
        write_quantized_checkpoint(dir, &weights, &args.out, opts)?;
        return Ok(());
    }
    // the model as the checkpoint will run it: FP8 weights dequantised
    let window = WINDOW.min(loaded.config.max_position_embeddings);
    eprintln!(
        "lamina: measuring the KV cache over {} calibration tokens",
        tokens.len()
    );
    let kv = kv_amax(&loaded.config, &weights, &tokens, window)?.scales();
    write_checkpoint(dir, &weights, how, &kv, &args.out)?;
    Ok(())
}

/// The FP8 grid GPTQ rounds to for the layout of `opts`.
fn fp8_target(opts: Fp8Options) -> Target {
    Target::Fp8(ScaleRule {
        per_channel: opts.channel,
        // compressed-tensors stores BF16 scales: chosen exact in BF16
        bf16: opts.layout == Fp8Layout::CompressedTensors,
    })
}

/// GPTQ over `tokens`: the model with its projections on `target`'s grid.
fn gptq(
    args: &QuantizeArgs,
    config: &ModelConfig,
    weights: ModelWeights,
    tokens: &[u32],
    target: Target,
) -> Result<ModelWeights> {
    let gptq = GptqOptions {
        damp: args.dampening,
        act_order: args.act_order,
        target,
        window: WINDOW.min(config.max_position_embeddings),
        ..GptqOptions::default()
    };
    let layers = config.num_layers as u64;
    let bar = Progress::new(
        format!("GPTQ over {} calibration tokens", tokens.len()),
        Unit::Items("layers"),
        layers,
        0,
    );
    let quantised = quantize_model(config, weights, tokens, &gptq, &mut |_, _| bar.inc(1))?;
    bar.finish();
    Ok(quantised)
}

/// The first `want` tokens of `text` (no BOS; read no further than
/// needed); at least [`MIN_CALIBRATION_TOKENS`], all of them when the text
/// has fewer than `want`.
fn calibration_tokens(
    dir: &Path,
    file: &Path,
    text: &mut TextFile,
    want: usize,
) -> Result<Vec<u32>> {
    let mut ids = crate::files::tokenize(text, &Tokenizer::from_dir(dir)?, None, want)?;
    if ids.len() < MIN_CALIBRATION_TOKENS {
        bail!(
            "--calibration {} holds {} tokens; GPTQ needs at least {MIN_CALIBRATION_TOKENS}",
            file.display(),
            ids.len()
        );
    }
    if ids.len() < want {
        eprintln!(
            "lamina: --calibration {} holds {} tokens, fewer than --calibration-tokens {want}: calibrating on all of them",
            file.display(),
            ids.len()
        );
    }
    ids.truncate(want);
    Ok(ids)
}
