//! `cargo xtask check-arch`: the architecture invariants of ARCHITECTURE.md,
//! checked mechanically (run by `cargo xtask test` before the tests).
//!
//! Contract:
//! - **Dependencies** ([`check_deps`]): reads `cargo metadata --format-version 1`
//!   and follows the resolve graph's *normal* edges (dev and build edges are
//!   ignored). It fails, naming the shortest path, when
//!   - a CUDA-free crate ([`CUDA_FREE`]) reaches one of [`CUDA_CRATES`];
//!   - `engine` or `server` reaches `checkpoint`, `ureq` or `zip`;
//!   - anything depends on `cli` (the binary sits on top of everything);
//!   - `runtime` reaches `server` or `cli`, or a crate it composes
//!     ([`RUNTIME_COMPOSES`]) reaches `runtime` (it sits below the binary,
//!     beside the server);
//!   - any crate but `gpu` depends on `cudarc` directly.
//! - **Unsafe** ([`check_unsafe_source`]): in every `.rs` file under `crates/`,
//!   `xtask/` and `tests/`, each `unsafe { .. }` block, `unsafe impl` and
//!   `unsafe extern` block needs a `// SAFETY:` comment on its line or in the
//!   comment lines right above it (the walk up may cross the start of its
//!   statement: lines ending in `=`, `(`, `[`, `,` or `=>`); each `unsafe fn`
//!   needs a `# Safety` section in its doc comment. Comments, strings and
//!   char literals are lexed out first, so `unsafe` in them is ignored.
//!
//! - **Architecture names** (`names`): a model family's name as a string
//!   literal only in config parsing (the spec is what the rest reads).
//! - **Module layers** (`layers`): inside a crate, the children of a module
//!   import one another without cycles (the rule and its exceptions are in
//!   that module's doc).
//!
//! The checks are pure functions over in-memory input (a metadata JSON, a
//! source text), unit-tested on planted violations.
//! Costs: one `cargo metadata` run (under a second with a warm cache), then a
//! breadth-first search per rule (graph size) and one pass per source file.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// Crates that must build without CUDA.
pub const CUDA_FREE: [&str; 5] = ["engine", "server", "paged-kv", "contract", "tokenizer"];
/// The crates that bring in CUDA.
pub const CUDA_CRATES: [&str; 4] = ["cudarc", "gpu", "kernels", "model"];
/// Crates that must not load checkpoints or touch the network for weights.
pub const NO_CHECKPOINT: [&str; 2] = ["engine", "server"];
/// What [`NO_CHECKPOINT`] crates may not reach.
pub const CHECKPOINT_CRATES: [&str; 3] = ["checkpoint", "ureq", "zip"];
/// The crates `runtime` composes (or that lie under them): none may depend
/// on it.
pub const RUNTIME_COMPOSES: [&str; 11] = [
    "server",
    "engine",
    "model",
    "kernels",
    "gpu",
    "ops",
    "cpu-kernels",
    "checkpoint",
    "contract",
    "tokenizer",
    "paged-kv",
];
/// What `runtime` may not reach: the HTTP layer beside it, the binary above.
pub const ABOVE_RUNTIME: [&str; 2] = ["server", "cli"];
/// Folders (from the repository root) whose `.rs` files are scanned for `unsafe`.
pub const SCANNED_DIRS: [&str; 3] = ["crates", "xtask", "tests"];

/// One broken rule, with what to look at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The rule, in words.
    pub rule: String,
    /// Where: a dependency path (`engine -> model -> gpu`) or `file:line`.
    pub at: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.at, self.rule)
    }
}

/// Runs both checks on the repository and fails listing every violation.
pub fn run() -> Result<()> {
    let root = crate::repo::repo_root();
    let meta = cargo_metadata(&root)?;
    let mut violations = check_deps(&meta)?;
    let (files, unsafe_violations) = check_unsafe_tree(&root)?;
    violations.extend(unsafe_violations);
    violations.extend(check_names_tree(&root)?);
    let (crates, layer_violations) = layers::check_tree(&root)?;
    violations.extend(layer_violations);
    if violations.is_empty() {
        println!(
            "check-arch: dependency rules hold; {files} .rs files scanned, every unsafe has its SAFETY note, architecture names only in config parsing; the modules of {crates} crates form layers"
        );
        return Ok(());
    }
    for v in &violations {
        eprintln!("check-arch: {v}");
    }
    bail!("{} architecture violation(s)", violations.len())
}

/// `cargo metadata --format-version 1` of the workspace at `root`.
pub fn cargo_metadata(root: &Path) -> Result<Value> {
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(root)
        .args(["metadata", "--format-version", "1"])
        .output()
        .context("running cargo metadata")?;
    if !out.status.success() {
        bail!(
            "cargo metadata failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    serde_json::from_slice(&out.stdout).context("parsing cargo metadata")
}

/// Normal-dependency graph of the resolve: package id -> (name, dependency ids).
struct Graph {
    names: HashMap<String, String>,
    edges: BTreeMap<String, Vec<String>>,
}

impl Graph {
    fn from_metadata(meta: &Value) -> Result<Self> {
        let mut names = HashMap::new();
        for p in meta["packages"]
            .as_array()
            .context("cargo metadata: no `packages` array")?
        {
            let id = p["id"]
                .as_str()
                .context("cargo metadata: package without id")?;
            let name = p["name"]
                .as_str()
                .context("cargo metadata: package without name")?;
            names.insert(id.to_string(), name.to_string());
        }
        let mut edges = BTreeMap::new();
        for node in meta["resolve"]["nodes"]
            .as_array()
            .context("cargo metadata: no `resolve.nodes` (run without --no-deps)")?
        {
            let id = node["id"]
                .as_str()
                .context("cargo metadata: node without id")?;
            let mut deps = Vec::new();
            for d in node["deps"].as_array().into_iter().flatten() {
                let normal = d["dep_kinds"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|k| k["kind"].is_null());
                if normal {
                    let pkg = d["pkg"]
                        .as_str()
                        .context("cargo metadata: dep without pkg")?;
                    deps.push(pkg.to_string());
                }
            }
            edges.insert(id.to_string(), deps);
        }
        Ok(Self { names, edges })
    }

    fn name<'a>(&'a self, id: &'a str) -> &'a str {
        self.names.get(id).map_or(id, String::as_str)
    }

    fn ids_named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.edges
            .keys()
            .map(String::as_str)
            .filter(move |id| self.name(id) == name)
    }

    /// Shortest normal-dependency path from `from` to a package named
    /// `target`, as package names.
    fn path_to(&self, from: &str, target: &str) -> Option<Vec<String>> {
        let mut parent: HashMap<&str, &str> = HashMap::new();
        let mut queue = VecDeque::from([from]);
        parent.insert(from, from);
        while let Some(id) = queue.pop_front() {
            if id != from && self.name(id) == target {
                let mut path = vec![self.name(id).to_string()];
                let mut cur = id;
                while cur != from {
                    cur = parent[cur];
                    path.push(self.name(cur).to_string());
                }
                path.reverse();
                return Some(path);
            }
            for next in self.edges.get(id).into_iter().flatten() {
                if !parent.contains_key(next.as_str()) {
                    parent.insert(next, id);
                    queue.push_back(next);
                }
            }
        }
        None
    }
}

/// The dependency rules over a `cargo metadata --format-version 1` document.
pub fn check_deps(meta: &Value) -> Result<Vec<Violation>> {
    let g = Graph::from_metadata(meta)?;
    let mut out = Vec::new();
    let mut forbid = |sources: &[&str], targets: &[&str], rule: &str| {
        for src in sources {
            for id in g.ids_named(src) {
                for t in targets {
                    if let Some(path) = g.path_to(id, t) {
                        out.push(Violation {
                            rule: format!("{src} must not depend on {t} ({rule})"),
                            at: path.join(" -> "),
                        });
                    }
                }
            }
        }
    };
    forbid(&CUDA_FREE, &CUDA_CRATES, "it must build without CUDA");
    forbid(
        &NO_CHECKPOINT,
        &CHECKPOINT_CRATES,
        "checkpoint loading and fetching stay out of the engine and server",
    );
    forbid(
        &["runtime"],
        &ABOVE_RUNTIME,
        "the runtime starts engines; serving them is the server's, beside it",
    );
    forbid(
        &RUNTIME_COMPOSES,
        &["runtime"],
        "the runtime composes the crates below the binary",
    );
    for (id, deps) in &g.edges {
        let from = g.name(id);
        for d in deps {
            let to = g.name(d);
            if to == "cli" {
                out.push(Violation {
                    rule: "nothing may depend on cli (the binary is the top of the graph)".into(),
                    at: format!("{from} -> cli"),
                });
            }
            if to == "cudarc" && from != "gpu" {
                out.push(Violation {
                    rule: "only gpu may depend on cudarc directly".into(),
                    at: format!("{from} -> cudarc"),
                });
            }
        }
    }
    Ok(out)
}

/// Scans every `.rs` file under [`SCANNED_DIRS`] of `root`; returns the
/// number of files scanned and the violations.
pub fn check_unsafe_tree(root: &Path) -> Result<(usize, Vec<Violation>)> {
    scan(root, &SCANNED_DIRS, check_unsafe_source)
}

/// [`names::check_source`] over every `.rs` file of the crates.
pub fn check_names_tree(root: &Path) -> Result<Vec<Violation>> {
    Ok(scan(root, &["crates"], names::check_source)?.1)
}

/// `check(path from the root, text)` over every `.rs` file under `dirs`
/// of `root`, in path order: the number of files and the violations.
fn scan(
    root: &Path,
    dirs: &[&str],
    check: fn(&str, &str) -> Vec<Violation>,
) -> Result<(usize, Vec<Violation>)> {
    let mut files = Vec::new();
    for dir in dirs {
        collect_rs(&root.join(dir), &mut files)?;
    }
    files.sort();
    let mut out = Vec::new();
    for f in &files {
        let text =
            std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        let shown = f.strip_prefix(root).unwrap_or(f).display().to_string();
        out.extend(check(&shown, &text));
    }
    Ok((files.len(), out))
}

pub fn collect_rs(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    if !dir.is_dir() {
        return Ok(());
    }
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() {
            if name != "target" && !name.starts_with('.') {
                collect_rs(&path, out)?;
            }
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
    Ok(())
}

/// One source line split into its code (string and char literal contents
/// blanked) and its comment text.
#[derive(Debug, Default, Clone)]
struct Line {
    code: String,
    comment: String,
}

/// Splits `src` into lines of code and comment text.
fn lex(src: &str) -> Vec<Line> {
    #[derive(Clone, Copy, PartialEq)]
    enum State {
        Code,
        LineComment,
        Block(usize),
        Str,
        RawStr(usize),
        Char,
    }
    let chars: Vec<char> = src.chars().collect();
    let mut lines = vec![Line::default()];
    let mut state = State::Code;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '\n' {
            lines.push(Line::default());
            if state == State::LineComment {
                state = State::Code;
            }
            i += 1;
            continue;
        }
        let Some(line) = lines.last_mut() else { break };
        match state {
            State::Code => {
                let prev_ident = i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_');
                if c == '/' && next == Some('/') {
                    state = State::LineComment;
                    i += 2;
                    continue;
                }
                if c == '/' && next == Some('*') {
                    state = State::Block(1);
                    i += 2;
                    continue;
                }
                if c == '"' {
                    state = State::Str;
                } else if !prev_ident && (c == 'r' || (c == 'b' && next == Some('r'))) {
                    // raw string r"..", r#".."#, br".."
                    let start = if c == 'b' { i + 2 } else { i + 1 };
                    let hashes = chars[start.min(chars.len())..]
                        .iter()
                        .take_while(|&&h| h == '#')
                        .count();
                    if chars.get(start + hashes) == Some(&'"') {
                        line.code.push('"');
                        state = State::RawStr(hashes);
                        i = start + hashes + 1;
                        continue;
                    }
                } else if c == '\'' {
                    // a char literal ('x', '\n', '\u{..}') or a lifetime ('a)
                    if next == Some('\\') || chars.get(i + 2) == Some(&'\'') {
                        state = State::Char;
                    }
                }
                line.code.push(c);
            }
            State::LineComment => line.comment.push(c),
            State::Block(depth) => {
                if c == '*' && next == Some('/') {
                    state = if depth == 1 {
                        State::Code
                    } else {
                        State::Block(depth - 1)
                    };
                    i += 2;
                    continue;
                }
                if c == '/' && next == Some('*') {
                    state = State::Block(depth + 1);
                    i += 2;
                    continue;
                }
                line.comment.push(c);
            }
            State::Str | State::Char => {
                let close = if state == State::Str { '"' } else { '\'' };
                if c == '\\' {
                    line.code.push(' ');
                    if next.is_some_and(|n| n != '\n') {
                        line.code.push(' ');
                        i += 2;
                        continue;
                    }
                } else if c == close {
                    line.code.push(c);
                    state = State::Code;
                } else {
                    line.code.push(' ');
                }
            }
            State::RawStr(hashes) => {
                let closes = c == '"' && (1..=hashes).all(|k| chars.get(i + k) == Some(&'#'));
                if closes {
                    line.code.push('"');
                    state = State::Code;
                    i += 1 + hashes;
                    continue;
                }
                line.code.push(' ');
            }
        }
        i += 1;
    }
    lines
}

/// What follows an `unsafe` keyword.
#[derive(Debug, PartialEq)]
enum UnsafeKind {
    /// `unsafe {`, `unsafe impl`, `unsafe extern .. {`: needs `// SAFETY:`.
    Needs,
    /// `unsafe fn name` (also `unsafe extern "C" fn name`): needs `# Safety`.
    Fn,
    /// Anything else (`unsafe fn(..)` pointer types, `#[unsafe(..)]`, `unsafe trait`).
    Other,
}

/// The code tokens after line `l`, column `col`: identifiers and single
/// punctuation characters (string literals as `"`).
fn tokens_after(lines: &[Line], l: usize, col: usize) -> impl Iterator<Item = String> + '_ {
    let first = lines[l].code.get(col..).unwrap_or("").to_string();
    std::iter::once(first)
        .chain(lines[l + 1..].iter().map(|x| x.code.clone()))
        .flat_map(|code| {
            let mut toks = Vec::new();
            let mut word = String::new();
            for ch in code.chars() {
                if ch.is_alphanumeric() || ch == '_' {
                    word.push(ch);
                    continue;
                }
                if !word.is_empty() {
                    toks.push(std::mem::take(&mut word));
                }
                if !ch.is_whitespace() {
                    toks.push(ch.to_string());
                }
            }
            if !word.is_empty() {
                toks.push(word);
            }
            toks
        })
}

fn classify(lines: &[Line], l: usize, col: usize) -> UnsafeKind {
    let toks: Vec<String> = tokens_after(lines, l, col).take(8).collect();
    let at = |k: usize| toks.get(k).map(String::as_str);
    let is_named_fn = |k: usize| at(k) == Some("fn") && at(k + 1).is_some_and(|t| t != "(");
    match at(0) {
        Some("{") | Some("impl") => UnsafeKind::Needs,
        Some("fn") if is_named_fn(0) => UnsafeKind::Fn,
        Some("extern") => {
            // unsafe extern "C" fn name / unsafe extern "C" { .. } / unsafe extern { .. }
            let k = if at(1) == Some("\"") { 3 } else { 1 };
            if is_named_fn(k) {
                UnsafeKind::Fn
            } else if at(k) == Some("{") {
                UnsafeKind::Needs
            } else {
                UnsafeKind::Other
            }
        }
        _ => UnsafeKind::Other,
    }
}

fn is_attribute(code: &str) -> bool {
    let t = code.trim();
    t.starts_with("#[") || t.starts_with("#![")
}

/// Whether a `SAFETY:` comment covers the `unsafe` on line `l`: on the line,
/// or in the comment lines right above (crossing attribute lines and the
/// lines that open the statement, see the module doc).
fn has_safety_comment(lines: &[Line], l: usize) -> bool {
    if lines[l].comment.contains("SAFETY:") {
        return true;
    }
    let mut in_comment_block = false;
    for line in lines[..l].iter().rev() {
        let code = line.code.trim();
        if code.is_empty() && line.comment.is_empty() {
            return false; // a blank line ends the search
        }
        if code.is_empty() {
            if line.comment.contains("SAFETY:") {
                return true;
            }
            in_comment_block = true;
            continue;
        }
        if line.comment.contains("SAFETY:") {
            return true;
        }
        if is_attribute(code) {
            continue;
        }
        let continues = ["=", "(", "[", ",", "=>"]
            .iter()
            .any(|end| code.ends_with(end));
        if in_comment_block || !continues {
            return false;
        }
    }
    false
}

/// Whether the doc comment above the `unsafe fn` on line `l` has `# Safety`.
fn has_safety_doc(lines: &[Line], l: usize) -> bool {
    for line in lines[..l].iter().rev() {
        let code = line.code.trim();
        if code.is_empty() && line.comment.is_empty() {
            return false;
        }
        if !code.is_empty() && !is_attribute(code) {
            return false;
        }
        if line.comment.trim_start_matches('/').trim() == "# Safety" {
            return true;
        }
    }
    false
}

/// The unsafe rules over one source text; `file` names it in the violations.
pub fn check_unsafe_source(file: &str, src: &str) -> Vec<Violation> {
    let lines = lex(src);
    let mut out = Vec::new();
    for (l, line) in lines.iter().enumerate() {
        let code = &line.code;
        let mut from = 0;
        while let Some(pos) = code[from..].find("unsafe").map(|p| p + from) {
            from = pos + "unsafe".len();
            let before = code[..pos].chars().next_back();
            let after = code[from..].chars().next();
            let ident = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
            if ident(before) || ident(after) {
                continue;
            }
            let (ok, rule) = match classify(&lines, l, from) {
                UnsafeKind::Needs => (
                    has_safety_comment(&lines, l),
                    "unsafe block or impl without a `// SAFETY:` comment right before it",
                ),
                UnsafeKind::Fn => (
                    has_safety_doc(&lines, l),
                    "unsafe fn without a `# Safety` section in its doc comment",
                ),
                UnsafeKind::Other => (true, ""),
            };
            if !ok {
                out.push(Violation {
                    rule: rule.into(),
                    at: format!("{file}:{}", l + 1),
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;

mod layers;
mod names;
