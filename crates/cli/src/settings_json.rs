//! `lamina settings-json` (hidden): the whole command line as JSON, every
//! subcommand with every argument, hidden ones included (name, short and
//! alias spellings, value names and choices, defaults, environment
//! variable, help text).
//!
//! Contract: the output is read from clap's `Command`, the same definition
//! that parses the command line, so it cannot disagree with it.
//! `cargo xtask gen-docs` renders it into `docs/settings.md` and
//! `cargo xtask check-docs` fails when that file differs. The order is the
//! definition's order, so the output is stable.

use clap::{Arg, Command};
use serde_json::{Value, json};

/// The JSON document of `cmd`: `{"name", "about", "args", "subcommands"}`.
pub fn dump(cmd: &Command) -> Value {
    let subcommands: Vec<Value> = cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set())
        .map(|s| {
            json!({
                "name": s.get_name(),
                "aliases": s.get_visible_aliases().collect::<Vec<_>>(),
                "about": text(s.get_about()),
                "args": args(s),
            })
        })
        .collect();
    json!({
        "name": cmd.get_name(),
        "about": text(cmd.get_about()),
        "args": args(cmd),
        "subcommands": subcommands,
    })
}

fn args(cmd: &Command) -> Vec<Value> {
    cmd.get_arguments()
        .filter(|a| !matches!(a.get_id().as_str(), "help" | "version"))
        .map(arg)
        .collect()
}

fn arg(a: &Arg) -> Value {
    let choices: Vec<String> = a
        .get_possible_values()
        .into_iter()
        .filter(|p| !p.is_hide_set())
        .map(|p| p.get_name().to_string())
        .collect();
    let defaults: Vec<String> = a
        .get_default_values()
        .iter()
        .map(|v| v.to_string_lossy().into_owned())
        .collect();
    json!({
        "id": a.get_id().as_str(),
        "long": a.get_long(),
        "short": a.get_short().map(String::from),
        "aliases": a.get_visible_aliases().unwrap_or_default(),
        "short_aliases": a.get_visible_short_aliases().unwrap_or_default()
            .into_iter().map(String::from).collect::<Vec<_>>(),
        "positional": a.is_positional(),
        "takes_value": a.get_action().takes_values(),
        "repeatable": matches!(a.get_action(), clap::ArgAction::Append | clap::ArgAction::Count),
        "value_names": a.get_value_names().unwrap_or_default()
            .iter().map(|n| n.as_str()).collect::<Vec<_>>(),
        "choices": choices,
        "defaults": defaults,
        "env": a.get_env().map(|e| e.to_string_lossy().into_owned()),
        "hidden": a.is_hide_set(),
        "required": a.is_required_set(),
        "help": text(a.get_long_help().or(a.get_help())),
    })
}

fn text(s: Option<&clap::builder::StyledStr>) -> String {
    s.map(ToString::to_string).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Hidden flags are listed too (they are settings all the same), each
    /// with its environment variable.
    #[test]
    fn hidden_flags_are_dumped_with_their_variables() {
        let doc = super::dump(&crate::Cli::command());
        let serve = doc["subcommands"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == "serve")
            .expect("serve");
        let gemm = serve["args"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["long"] == "deterministic-gemm")
            .expect("--deterministic-gemm");
        assert_eq!(gemm["hidden"], true);
        assert_eq!(gemm["env"], "LAMINA_DETERMINISTIC_GEMM");
        assert_eq!(gemm["defaults"][0], "auto");
        assert!(
            doc["subcommands"]
                .as_array()
                .unwrap()
                .iter()
                .all(|s| s["name"] != "settings-json")
        );
    }
}
