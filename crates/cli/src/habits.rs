//! The command-line shapes people bring from ollama, llama.cpp and vLLM:
//! a model given as the first positional word (`lamina serve MODEL`),
//! negative numbers read as values (so `--temperature -1` gets the allowed
//! range rather than clap's `-- -1` hint), and a tip naming lamina's flag
//! when a neighbour's flag that has no exact equivalent here is typed.
//! (The exact equivalents — `-m -p -n -c -t`, `--max-model-len`,
//! `--ctx-size`, `--n-predict`, `--threads` — are aliases on the flags.)

use anyhow::{Result, bail};
use clap::error::{ContextKind, ContextValue, ErrorKind};

use crate::setup::ModelArgs;

/// Sets the model from a positional `MODEL`: it replaces the default and a
/// `LAMINA_MODEL` value, and must agree with an explicit `--model`.
pub fn positional_model(args: &mut ModelArgs, positional: Option<String>) -> Result<()> {
    let Some(model) = positional else {
        return Ok(());
    };
    let from_env = std::env::var("LAMINA_MODEL").ok().as_deref() == Some(args.model.as_str());
    let defaulted = args.model == checkpoint::store::DEFAULT_MODEL;
    if !from_env && !defaulted && args.model != model {
        bail!(
            "the model is given twice, `--model {}` and `{model}`: give one",
            args.model
        );
    }
    args.model = model;
    Ok(())
}

/// Whether `word` names a model: an existing path, a known id or short
/// name, a model in the store (any case) or a Hugging Face repo id.
pub fn names_a_model(word: &str) -> bool {
    use checkpoint::store;
    std::path::Path::new(word).exists()
        || store::canonical_id(word).is_some()
        || store::Store::default_home().stored_id(word).is_some()
        || store::hub::RepoRef::parse(word).is_some()
}

/// Lets every subcommand take negative numbers as flag values; the flags'
/// own checks then name the allowed range.
pub fn negative_numbers(cmd: clap::Command) -> clap::Command {
    cmd.allow_negative_numbers(true)
        .mut_subcommands(|sub| sub.allow_negative_numbers(true))
}

/// Neighbours' flags with no exact equivalent, and what to use instead.
const TIPS: &[(&str, &str)] = &[
    (
        "--n-gpu-layers",
        "lamina runs the whole model on one device: `--device cuda` or `--device cpu`",
    ),
    (
        "-ngl",
        "lamina runs the whole model on one device: `--device cuda` or `--device cpu`",
    ),
    (
        "--gpu-layers",
        "lamina runs the whole model on one device: `--device cuda` or `--device cpu`",
    ),
    (
        "--tensor-parallel-size",
        "lamina splits work across GPUs by replicas: `--devices 0,1` or `--data-parallel-size N`",
    ),
    (
        "--max-num-batched-tokens",
        "the step budget is `--max-batch-tokens N`",
    ),
    ("--batch-size", "the step budget is `--max-batch-tokens N`"),
    (
        "--ctx",
        "the context length is `--max-model-len N` (or `-c N`)",
    ),
    (
        "--num-ctx",
        "the context length is `--max-model-len N` (or `-c N`)",
    ),
    (
        "--num-predict",
        "the reply length is `--max-tokens N` (or `-n N`)",
    ),
    ("--system-prompt", "the system message is `--system TEXT`"),
    (
        "--interactive",
        "for a conversation use `lamina run MODEL` or `lamina chat`",
    ),
    (
        "-i",
        "for a conversation use `lamina run MODEL` or `lamina chat`",
    ),
    (
        "-cnv",
        "for a conversation use `lamina run MODEL` or `lamina chat`",
    ),
    ("--repeat-penalty", "use `--repetition-penalty X`"),
];

/// Flags some lamina commands have and others not: a tip only once clap
/// has refused one ([`explain`]), never before it parses.
const LATE_TIPS: &[(&str, &str)] = &[
    (
        "--keep-alive",
        "`--keep-alive` is `lamina serve`'s (how long a model stays loaded once idle); `run` / `generate` / `chat` load the model for one command",
    ),
    (
        "--keepalive",
        "`lamina serve --keep-alive` sets how long a model stays loaded once idle; `run` / `generate` / `chat` load the model for one command",
    ),
];

/// The tip for an unknown flag of a neighbouring tool, if there is one.
pub fn tip(flag: &str) -> Option<&'static str> {
    let name = name_of(flag);
    TIPS.iter().find(|(f, _)| *f == name).map(|(_, t)| *t)
}

/// [`tip`], or the tip for a flag another lamina command has.
fn late_tip(flag: &str) -> Option<&'static str> {
    let name = name_of(flag);
    tip(flag).or_else(|| LATE_TIPS.iter().find(|(f, _)| *f == name).map(|(_, t)| *t))
}

/// The message for a neighbour's flag typed anywhere before `--`, looked
/// up before clap parses: clap reads a single-dash word such as `-ngl 99`
/// as lamina's `-n` with the value `gl`, and a long one as a value where
/// a flag takes one. The word must be exactly a flag of [`TIPS`] (or
/// `FLAG=VALUE`); no lamina command has a flag of those names (a test
/// holds the command line to that).
pub fn neighbour_flag(raw: &[String]) -> Option<String> {
    let flag = raw
        .iter()
        .skip(1)
        .take_while(|w| w.as_str() != "--")
        .find(|w| w.starts_with('-') && tip(w).is_some())?;
    Some(message(flag, tip(flag)?))
}

/// The flags that get a tip (a test checks none is a lamina flag).
#[cfg(test)]
pub fn tip_flags() -> impl Iterator<Item = &'static str> {
    TIPS.iter().map(|(f, _)| *f)
}

fn name_of(flag: &str) -> &str {
    flag.split_once('=').map_or(flag, |(n, _)| n)
}

fn message(flag: &str, tip: &str) -> String {
    format!(
        "error: unexpected argument '{flag}' found\n\n  tip: {tip}\n\nFor more information, try '--help'."
    )
}

/// The message for a neighbour's flag that clap does not know, naming
/// lamina's flag instead of clap's "similar argument" guess; `None` for
/// every other error. `raw` is the command line: clap reports `-ngl` as
/// its first letter, so the word the user typed is looked up there.
pub fn explain(err: &clap::Error, raw: &[String]) -> Option<String> {
    if err.kind() != ErrorKind::UnknownArgument {
        return None;
    }
    let Some(ContextValue::String(bad)) = err.get(ContextKind::InvalidArg) else {
        return None;
    };
    let (flag, t) = std::iter::once(bad.as_str())
        .chain(
            raw.iter()
                .map(String::as_str)
                .filter(|w| w.starts_with(bad.as_str())),
        )
        .find_map(|w| Some((w, late_tip(w)?)))?;
    Some(message(flag, t))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tips_name_lamina_flags() {
        assert!(
            tip("--max-num-batched-tokens=8192")
                .unwrap()
                .contains("--max-batch-tokens")
        );
        assert!(tip("-ngl").unwrap().contains("--device"));
        assert_eq!(tip("--frobnicate"), None);
    }

    /// `-ngl 99` is llama.cpp's flag, not `-n gl`; after `--` it is a word.
    #[test]
    fn neighbour_flags_are_caught_before_clap() {
        let raw = |w: &[&str]| w.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let m = neighbour_flag(&raw(&["lamina", "run", "-ngl", "99", "hi"])).unwrap();
        assert!(m.contains("'-ngl'") && m.contains("--device cuda"), "{m}");
        let m = neighbour_flag(&raw(&["lamina", "serve", "--gpu-layers=99"])).unwrap();
        assert!(m.contains("--device cuda"), "{m}");
        let m = neighbour_flag(&raw(&["lamina", "run", "--repeat-penalty", "1.1"])).unwrap();
        assert!(m.contains("--repetition-penalty"), "{m}");
        // a lamina flag (`serve --keep-alive`) is never a neighbour's
        assert!(neighbour_flag(&raw(&["lamina", "serve", "--keep-alive", "5m"])).is_none());
        assert!(neighbour_flag(&raw(&["lamina", "run", "-n", "9", "hi"])).is_none());
        assert!(neighbour_flag(&raw(&["lamina", "generate", "--", "-ngl"])).is_none());
    }
}
