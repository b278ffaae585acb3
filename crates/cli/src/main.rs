//! `lamina`: generate, chat, serve, bench, tokenize and synth-model.
//!
//! Errors reach the user as one line, `error: <cause>: <detail>`, and a
//! non-zero exit status; nothing the user can type makes it panic.

mod bench;
mod bench_serve;
mod chat;
mod generate;
mod sampling_args;
mod serve;
mod setup;
mod synth;
mod tokenize;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "lamina",
    version,
    about = "Fast inference for Llama-family models"
)]
struct Cli {
    /// Log more (-v: info, -vv: debug); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Generate a continuation of a prompt (or of every line of a file).
    Generate(generate::GenerateArgs),
    /// Chat interactively with the model's chat template.
    Chat(chat::ChatArgs),
    /// Serve an OpenAI-compatible HTTP API.
    Serve(serve::ServeArgs),
    /// Measure decode speed, time to first token and throughput.
    Bench(bench::BenchArgs),
    /// Load-test a running OpenAI-compatible server (Poisson arrivals, streamed).
    BenchServe(bench_serve::BenchServeArgs),
    /// Print the token ids of a text.
    Tokenize(tokenize::TokenizeArgs),
    /// Write a model with deterministic random weights in Hugging Face layout.
    SynthModel(synth::SynthArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let serving = matches!(cli.command, Command::Serve(_));
    let level = match cli.verbose {
        // a server logs each request (with its id) by default
        0 if serving => "info",
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let result = match cli.command {
        Command::Generate(a) => generate::run(a),
        Command::Chat(a) => chat::run(a),
        Command::Serve(a) => serve::run(a),
        Command::Bench(a) => bench::run(a),
        Command::BenchServe(a) => bench_serve::run(a),
        Command::Tokenize(a) => tokenize::run(a),
        Command::SynthModel(a) => synth::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
