//! `cargo xtask gen-docs` and `cargo xtask check-docs`: the documentation
//! parts that are generated or checked against the code.
//!
//! Contract:
//! - **Settings** ([`settings::render`]): `docs/settings.md` is rendered from
//!   `lamina settings-json` (clap's own definition of every command, hidden
//!   flags included) plus [`env::OTHER_VARS`], the variables no flag
//!   declares. `gen-docs` writes it; `check-docs` fails when the file
//!   differs from what would be written.
//! - **Environment** ([`env::scan`]): every variable the Rust sources read
//!   (`env::var("X")`, `var_os("X")`, the hub's `env("X")`, clap's
//!   `env = "X"`, `const *_ENV: &str = "X"`) must be in the table, and
//!   every entry of [`env::OTHER_VARS`] marked as read in the sources must
//!   still be read there. Cargo's own variables (`CARGO*`, `OUT_DIR`) are
//!   left out.
//! - **References** ([`refs::check`]): in the project's Markdown files, a
//!   code span naming a repository path (`crates/...`, `xtask/...`,
//!   `tests/...`, `scripts/...`, `deploy/...`, `docs/...`, `.ci/...`) must
//!   exist, and a code span right after it (`` `fn chat_completions` ``,
//!   `` `Worker::step` ``) must occur in that file: the hops of
//!   ARCHITECTURE.md cannot go stale.
//!
//! Costs: the settings need the `lamina` binary (`cargo run --release -p
//! cli`, the build the tests use); the scans are one pass over each source
//! and Markdown file.

pub mod env;
pub mod refs;
pub mod settings;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// Where the generated settings go, from the repository root.
pub const SETTINGS_MD: &str = "docs/settings.md";

/// The Markdown files whose references are checked: these, and every
/// `.md` file under `docs/`.
pub const CHECKED_MD: [&str; 4] = [
    "README.md",
    "ARCHITECTURE.md",
    "DEVELOPERS.md",
    "scripts/gpu/README.md",
];

/// `cargo xtask gen-docs`: writes `docs/settings.md`.
pub fn generate() -> Result<()> {
    let root = crate::repo::repo_root();
    let text = settings::render(&settings_json(&root)?)?;
    let path = root.join(SETTINGS_MD);
    std::fs::write(&path, &text).with_context(|| format!("writing {}", path.display()))?;
    println!(
        "gen-docs: wrote {SETTINGS_MD} ({} lines)",
        text.lines().count()
    );
    Ok(())
}

/// `cargo xtask check-docs`: the references, then the settings and the
/// environment table. Fails listing every problem.
pub fn check() -> Result<()> {
    let root = crate::repo::repo_root();
    let mut problems = check_refs(&root)?;
    let json = settings_json(&root)?;
    let want = settings::render(&json)?;
    let have = std::fs::read_to_string(root.join(SETTINGS_MD)).unwrap_or_default();
    if have != want {
        problems.push(format!(
            "{SETTINGS_MD} differs from the command line's definition: run `cargo xtask gen-docs`{}",
            first_difference(&have, &want)
        ));
    }
    let listed = settings::env_names(&json);
    let (reads, files) = env::scan_tree(&root)?;
    problems.extend(env::check(&reads, &listed));
    if problems.is_empty() {
        println!(
            "check-docs: {SETTINGS_MD} is current; {} variables read in {files} .rs files, all listed; references hold",
            reads
                .iter()
                .map(|r| &r.name)
                .collect::<std::collections::BTreeSet<_>>()
                .len()
        );
        return Ok(());
    }
    for p in &problems {
        eprintln!("check-docs: {p}");
    }
    bail!("{} documentation problem(s)", problems.len())
}

/// The reference check alone (no build): every checked Markdown file.
pub fn check_refs(root: &Path) -> Result<Vec<String>> {
    let mut files: Vec<PathBuf> = CHECKED_MD.iter().map(|f| root.join(f)).collect();
    let docs = root.join("docs");
    if docs.is_dir() {
        let mut md: Vec<PathBuf> = std::fs::read_dir(&docs)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "md"))
            .collect();
        md.sort();
        files.extend(md);
    }
    let mut out = Vec::new();
    for f in files.iter().filter(|f| f.is_file()) {
        let text =
            std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        let shown = f.strip_prefix(root).unwrap_or(f).display().to_string();
        let found = refs::check(&text, |p| {
            let path = root.join(p);
            if path.is_dir() {
                Some(refs::Target::Dir)
            } else {
                std::fs::read_to_string(path).ok().map(refs::Target::File)
            }
        });
        out.extend(found.into_iter().map(|p| format!("{shown}:{p}")));
    }
    Ok(out)
}

/// `lamina settings-json`, through `cargo run --release -p cli` (the
/// build `cargo xtask test` and the README's run command share).
fn settings_json(root: &Path) -> Result<Value> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    crate::repo::clear_run_env(&mut cmd);
    let out = cmd
        .current_dir(root)
        .args(["run", "--release", "-q", "-p", "cli", "--", "settings-json"])
        .output()
        .context("running cargo run -p cli -- settings-json")?;
    if !out.status.success() {
        bail!(
            "lamina settings-json failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    serde_json::from_slice(&out.stdout).context("parsing lamina settings-json")
}

/// ` (first difference at line N: ...)`, or nothing.
fn first_difference(have: &str, want: &str) -> String {
    let mut h = have.lines();
    let mut w = want.lines();
    for n in 1.. {
        match (h.next(), w.next()) {
            (None, None) => return String::new(),
            (a, b) if a == b => continue,
            (a, b) => {
                return format!(
                    " (first difference at line {n}: has {:?}, generated {:?})",
                    a.unwrap_or("<end>"),
                    b.unwrap_or("<end>")
                );
            }
        }
    }
    String::new()
}
