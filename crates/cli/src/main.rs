//! `lamina`: run, generate, chat, serve, bench, tokenize, embed, synth-model and
//! the model store (pull, list / ls, show, rm; ps asks a running server).
//!
//! Errors reach the user as one line, `error: <cause>: <detail>`, and a
//! non-zero exit status; nothing the user can type makes it panic.
//! `serve` logs one line per finished request and a throughput line while
//! busy (`serve_log`); `-v` turns on info logs (model loading, every HTTP
//! response), `-vv` debug logs; `RUST_LOG` overrides both.

mod bench;
mod bench_floor;
mod bench_lora;
mod bench_serve;
mod bench_spec;
mod chat;
mod chat_set;
mod embed;
mod files;
mod generate;
mod habits;
mod llama_bench;
mod lora_args;
mod model_info;
mod models;
mod perplexity;
mod progress;
mod quantize;
mod repl;
mod run;
mod sampling_args;
mod serve;
mod serve_limits;
mod serve_log;
mod serve_models;
mod settings_json;
mod setup;
mod spec_args;
mod synth;
mod timings;
mod tokenize;
mod tuning;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "lamina",
    version,
    about = "Fast inference for small open models (Llama 3.2, Gemma 3, Qwen3, Qwen2.5)"
)]
struct Cli {
    /// Log more (-v: info, with one line per served request and the
    /// sampling settings; -vv: debug); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Chat with a model: one streamed reply to PROMPT, or the chat REPL
    /// without one (ollama's `run`).
    Run(run::RunArgs),
    /// Generate a continuation of a prompt (or of every line of a file).
    Generate(generate::GenerateArgs),
    /// Chat interactively with the model's chat template.
    Chat(chat::ChatArgs),
    /// Serve an OpenAI-compatible HTTP API.
    Serve(Box<serve::ServeArgs>),
    /// Measure decode speed, time to first token and throughput.
    Bench(bench::BenchArgs),
    /// Load-test a running OpenAI-compatible server (Poisson arrivals, streamed).
    BenchServe(bench_serve::BenchServeArgs),
    /// Print the token ids of a text.
    Tokenize(tokenize::TokenizeArgs),
    /// Print one embedding per text (arguments, or stdin lines) as JSON lines.
    Embed(embed::EmbedArgs),
    /// Write a model with deterministic random weights in Hugging Face layout.
    SynthModel(synth::SynthArgs),
    /// Write a model as an FP8 checkpoint (compressed-tensors or `fp8` layout) or a 4-bit GPTQ one.
    Quantize(quantize::QuantizeArgs),
    /// The model's perplexity on a text file, as llama.cpp's
    /// `llama-perplexity` computes it.
    ///
    /// Matches llama-perplexity's default mode (`-c 512`, no `--ppl-stride`),
    /// so the two figures compare on the same GGUF and text: the text is
    /// tokenized with BOS when the model adds one and cut into chunks of
    /// exactly `-c` tokens (the rest dropped; a text under 2 chunks is
    /// refused), each chunk starts with BOS (when the model adds one) and
    /// runs from position 0, and only its second half is scored (`c - 1 -
    /// c/2` tokens a chunk). The figure is exp of the mean negative
    /// log-likelihood over every scored token. `--score-all` scores every
    /// token instead, to compare weight formats on a short text.
    Perplexity(perplexity::PerplexityArgs),
    /// Fetch a known model or a Hugging Face repo, or import a .gguf file into the store.
    Pull(models::PullArgs),
    /// List the models in the store (id, size on disk, source, path).
    #[command(visible_alias = "ls")]
    List(models::ListArgs),
    /// A model's details: architecture, parameters, context, weight format,
    /// chat template, files and sizes.
    Show(model_info::ShowArgs),
    /// The models of a running `lamina serve` (asks it at --url): each
    /// one's state, memory, idle time and running requests.
    Ps(model_info::PsArgs),
    /// Delete a model from the store, with its downloads.
    Rm(models::RmArgs),
    /// Print every command's flags and environment variables as JSON
    /// (what `cargo xtask gen-docs` renders into docs/settings.md).
    #[command(hide = true)]
    SettingsJson,
}

fn main() -> ExitCode {
    let cli = match parse() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    // one rayon pool for the CPU backend and the loader, one thread a core
    // unless `--threads` says otherwise
    cpu_kernels::threads::init_pool_with(cli.command.threads());
    let level = match (cli.verbose, &cli.command) {
        // the request and throughput lines of `serve_log`
        (0, Command::Serve(a)) => format!("warn{}", a.log.directives()),
        // a request that fails ends the command with its own error line;
        // the engine's warning about it is for server logs
        (0, _) => "warn,engine::worker=error".into(),
        (1, _) => "info".into(),
        _ => "debug".into(),
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let result = match cli.command {
        Command::Run(a) => run::run(a, cli.verbose),
        Command::Generate(a) => generate::run(a),
        Command::Chat(a) => chat::run(a, cli.verbose),
        Command::Serve(a) => serve::run(*a),
        Command::Bench(a) => bench::run(a),
        Command::BenchServe(a) => bench_serve::run(a),
        Command::Tokenize(a) => tokenize::run(a),
        Command::Embed(a) => embed::run(a),
        Command::SynthModel(a) => synth::run(a),
        Command::Quantize(a) => quantize::run(a),
        Command::Perplexity(a) => perplexity::run(a),
        Command::Pull(a) => models::pull(a),
        Command::List(a) => models::list(a),
        Command::Show(a) => model_info::show(a),
        Command::Ps(a) => model_info::ps(a),
        Command::Rm(a) => models::rm(a),
        Command::SettingsJson => settings_json(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // `lamina generate ... | head`: the reader has all it wanted
        Err(e) if broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) if e.is::<generate::Interrupted>() => ExitCode::from(130),
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}

/// The command line, with negative numbers taken as values and a
/// neighbour's flag answered with lamina's; a bad one is printed (exit 2).
fn parse() -> Result<Cli, ExitCode> {
    use clap::{CommandFactory, FromArgMatches};
    let raw: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    // before clap, which reads `-ngl 99` as `-n gl`
    if let Some(msg) = habits::neighbour_flag(&raw) {
        eprintln!("{msg}");
        return Err(ExitCode::from(2));
    }
    let parsed = habits::negative_numbers(Cli::command())
        .try_get_matches_from(&raw)
        .and_then(|m| Cli::from_arg_matches(&m));
    parsed.map_err(|err| {
        if let Some(msg) = habits::explain(&err, &raw) {
            eprintln!("{msg}");
            return ExitCode::from(2);
        }
        let code = err.exit_code();
        let _ = err.print();
        ExitCode::from(u8::try_from(code).unwrap_or(2))
    })
}

impl Command {
    /// The `--threads` of a model-running command.
    fn threads(&self) -> Option<usize> {
        let model = match self {
            Command::Run(a) => &a.model,
            Command::Generate(a) => &a.model,
            Command::Chat(a) => &a.model,
            Command::Serve(a) => &a.model,
            Command::Bench(a) => &a.model,
            Command::Embed(a) => &a.model,
            _ => return None,
        };
        model.threads
    }
}

/// `lamina settings-json`: the command line's definition, for the docs.
fn settings_json() -> anyhow::Result<()> {
    use clap::CommandFactory;
    use std::io::Write;
    let doc = settings_json::dump(&Cli::command());
    // a closed pipe is an error here, not a panic (exit 0, see `main`)
    writeln!(
        std::io::stdout().lock(),
        "{}",
        serde_json::to_string_pretty(&doc)?
    )?;
    Ok(())
}

/// Whether the error is a write to a closed pipe.
fn broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// The error and its causes on one line, `a: b: c`, leaving out a cause
/// whose text the line already holds (an error that prints its source).
fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

#[cfg(test)]
mod tests {
    #[test]
    fn causes_already_printed_are_not_repeated() {
        let io = std::io::Error::new(std::io::ErrorKind::AddrInUse, "Address in use");
        let e = anyhow::Error::new(io).context("cannot bind :80: Address in use");
        assert_eq!(super::one_line(&e), "cannot bind :80: Address in use");
        let e = anyhow::anyhow!("inner").context("outer");
        assert_eq!(super::one_line(&e), "outer: inner");
    }

    /// clap's own checks (no two flags share a short or long name), which
    /// release builds skip.
    #[test]
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory;
        super::habits::negative_numbers(super::Cli::command()).debug_assert();
    }

    /// No flag that gets a neighbour's tip (caught before clap) is a
    /// lamina flag of any command.
    #[test]
    fn tip_flags_are_no_lamina_flags() {
        use clap::CommandFactory;
        let cli = super::Cli::command();
        for sub in cli.get_subcommands() {
            for arg in sub.get_arguments() {
                let long = arg.get_long().map(|l| format!("--{l}"));
                let short = arg.get_short().map(|s| format!("-{s}"));
                let aliases = arg
                    .get_visible_aliases()
                    .unwrap_or_default()
                    .into_iter()
                    .map(|a| format!("--{a}"));
                for name in long.into_iter().chain(short).chain(aliases) {
                    assert!(
                        !super::habits::tip_flags().any(|f| f == name),
                        "`{name}` of `{}` has a tip",
                        sub.get_name()
                    );
                }
            }
        }
    }

    /// Every `serve` flag (the model flags included) can come from a
    /// `LAMINA_<FLAG>` environment variable, and the API key's value is
    /// never printed by `--help`.
    #[test]
    fn every_serve_flag_has_an_environment_variable() {
        use clap::CommandFactory;
        let cli = super::Cli::command();
        let serve = cli.find_subcommand("serve").expect("a serve subcommand");
        let mut flags = 0;
        for arg in serve.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            if matches!(long, "help" | "version" | "verbose") {
                continue;
            }
            flags += 1;
            let want = format!("LAMINA_{}", long.to_uppercase().replace('-', "_"));
            let env = arg.get_env().and_then(|e| e.to_str());
            assert_eq!(env, Some(want.as_str()), "--{long}");
        }
        assert!(flags >= 20, "only {flags} serve flags seen");
        let key = serve
            .get_arguments()
            .find(|a| a.get_long() == Some("api-key"))
            .expect("--api-key");
        assert!(key.is_hide_env_values_set());
    }
}
