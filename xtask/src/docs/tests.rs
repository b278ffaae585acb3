use std::collections::BTreeSet;

use serde_json::json;

use super::env::{OTHER_VARS, Read, check, scan};
use super::refs::{self, Target};
use super::settings::{env_names, render};

#[test]
fn scan_finds_every_form_of_read() {
    // written with `'` for `"`, so the check's own scan finds nothing here
    let src = "
let a = std::env::var('LAMINA_A');
let b = std::env::var_os('LAMINA_B').is_some();
let c = env('HF_C');
#[arg(long, env = 'LAMINA_D')]
pub const CAP_ENV: &str = 'LAMINA_E';
// std::env::var('IN_A_COMMENT')
cmd.env('SET_FOR_A_CHILD', '1');
let d = env!('CARGO_PKG_VERSION');
let e = std::env::var('CARGO');
let f = std::env::var('OUT_DIR');
let g = std::env::var(key);
"
    .replace('\'', "\"");
    let names: Vec<String> = scan("f.rs", &src).into_iter().map(|r| r.name).collect();
    assert_eq!(
        names,
        ["LAMINA_A", "LAMINA_B", "HF_C", "LAMINA_D", "LAMINA_E"]
    );
    assert_eq!(scan("f.rs", &src)[0].at, "f.rs:2");
}

#[test]
fn an_unlisted_read_and_a_stale_entry_are_reported() {
    let mut reads: Vec<Read> = OTHER_VARS
        .iter()
        .filter(|v| v.in_sources)
        .map(|v| Read {
            name: v.name.into(),
            at: "x.rs:1".into(),
        })
        .collect();
    let listed: BTreeSet<String> = OTHER_VARS.iter().map(|v| v.name.to_string()).collect();
    assert!(check(&reads, &listed).is_empty());
    reads.push(Read {
        name: "LAMINA_NEW".into(),
        at: "new.rs:7".into(),
    });
    let problems = check(&reads, &listed);
    assert_eq!(problems.len(), 1);
    assert!(problems[0].starts_with("new.rs:7: reads `LAMINA_NEW`"));
    reads.retain(|r| r.name != "LAMINA_HOME");
    assert!(
        check(&reads, &listed)
            .iter()
            .any(|p| p.contains("`LAMINA_HOME` is listed"))
    );
}

fn dump() -> serde_json::Value {
    let arg = |long: &str, env: Option<&str>, hidden: bool| {
        json!({"id": long, "long": long, "short": null, "aliases": [], "short_aliases": [],
               "positional": false, "takes_value": true, "repeatable": false,
               "value_names": ["N"], "choices": [], "defaults": ["1"], "env": env,
               "hidden": hidden, "required": false, "help": "Some\nhelp | text."})
    };
    json!({"name": "lamina", "about": "", "args": [], "subcommands": [
        {"name": "run", "aliases": [], "about": "Run.", "args": [
            arg("model", Some("LAMINA_MODEL"), false), arg("prompt-only", None, false)]},
        {"name": "serve", "aliases": ["s"], "about": "Serve.", "args": [
            arg("model", Some("LAMINA_MODEL"), false), arg("tune", Some("LAMINA_TUNE"), true)]},
    ]})
}

#[test]
fn shared_flags_are_listed_once_and_hidden_ones_are_marked() {
    let md = render(&dump()).unwrap();
    assert_eq!(md.matches("\n| `--model` | `N` |").count(), 1, "{md}");
    assert!(md.contains("### `run`, `serve`"));
    assert!(md.contains("Also the flags of `run`, `serve` (below)."));
    assert!(md.contains("| `--tune` (hidden) | `N` | `1` | `LAMINA_TUNE` | Some help \\| text. |"));
    assert!(md.contains("| `LAMINA_MODEL` | `--model` | `run`, `serve` |"));
    assert!(md.contains("Also spelled `s`."));
    let names = env_names(&dump());
    assert!(names.contains("LAMINA_TUNE") && names.contains("LAMINA_HOME"));
}

#[test]
fn dead_paths_and_symbols_are_reported() {
    let md = "\
1. `crates/server/src/api.rs` `fn chat_completions`: the handler.
2. `crates/server/src/api.rs` `fn gone`.
3. `crates/nowhere.rs` and `tests/golden/*.json` (a pattern, not checked).
4. `crates/engine/src/worker.rs`
   `Worker::step` across a line break; `crates/engine` a folder.
```
`crates/in/a/fence.rs`
```
";
    let open = |p: &str| match p {
        "crates/server/src/api.rs" => Some(Target::File("pub async fn chat_completions(".into())),
        "crates/engine/src/worker.rs" => Some(Target::File("impl Worker { fn stepper".into())),
        "crates/engine" => Some(Target::Dir),
        _ => None,
    };
    let problems = refs::check(md, open);
    assert_eq!(
        problems,
        [
            "2: `fn gone` does not occur in `crates/server/src/api.rs`",
            "3: `crates/nowhere.rs` does not exist",
            "4: `Worker::step` does not occur in `crates/engine/src/worker.rs`",
        ]
    );
}
