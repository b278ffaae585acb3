//! References from Markdown into the repository: a code span naming a path
//! must exist, and a code span right after it names a symbol of that file.

/// What a referenced path is.
pub enum Target {
    Dir,
    /// A file, with its text.
    File(String),
}

/// The folders (from the repository root) whose paths are checked.
pub const ROOTS: [&str; 7] = [
    "crates/", "xtask/", "tests/", "scripts/", "deploy/", "docs/", ".ci/",
];

/// Words that open a symbol span (`fn name`, `struct Name`, ...).
const KEYWORDS: [&str; 10] = [
    "fn",
    "struct",
    "enum",
    "trait",
    "impl",
    "mod",
    "const",
    "static",
    "type",
    "macro_rules!",
];

/// The problems of one Markdown text (`line: what`); `open` answers what a
/// repository path is, or `None` when it does not exist.
pub fn check(md: &str, open: impl Fn(&str) -> Option<Target>) -> Vec<String> {
    let spans = code_spans(md);
    let mut out = Vec::new();
    for (i, (line, span, end)) in spans.iter().enumerate() {
        let Some(path) = repo_path(span) else {
            continue;
        };
        let Some(target) = open(path) else {
            out.push(format!("{line}: `{span}` does not exist"));
            continue;
        };
        // the next span, when only blanks separate the two
        let Some((_, symbol, _)) = spans.get(i + 1) else {
            continue;
        };
        let next_start = md[*end..].find('`').map(|k| end + k);
        if next_start.is_none_or(|s| !md[*end..s].trim().is_empty()) || repo_path(symbol).is_some()
        {
            continue;
        }
        match target {
            Target::File(text) if !has_symbol(&text, symbol) => {
                out.push(format!("{line}: `{symbol}` does not occur in `{path}`"));
            }
            _ => {}
        }
    }
    out
}

/// The code spans of `md` outside fenced blocks: (line, text, byte offset
/// just past the closing backtick).
fn code_spans(md: &str) -> Vec<(usize, &str, usize)> {
    let mut out = Vec::new();
    let mut offset = 0;
    let mut fenced = false;
    let mut open: Option<(usize, usize)> = None;
    for (n, line) in md.split_inclusive('\n').enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            open = None;
        } else if !fenced {
            for (k, c) in line.char_indices() {
                if c != '`' {
                    continue;
                }
                let at = offset + k;
                match open.take() {
                    None => open = Some((n + 1, at + 1)),
                    Some((l, s)) => out.push((l, &md[s..at], at + 1)),
                }
            }
        }
        offset += line.len();
    }
    out
}

/// The span as a repository path to check: under one of [`ROOTS`], with
/// no pattern or placeholder in it.
fn repo_path(span: &str) -> Option<&str> {
    let span = span.trim();
    let checked = ROOTS.iter().any(|r| span.starts_with(r))
        && !span.contains(|c: char| "*<>{}$ |,".contains(c));
    checked.then_some(span.trim_end_matches('/'))
}

/// Whether `symbol` occurs in `text`: `fn name` (and the other keyword
/// forms) as those words in that order; otherwise every `::` segment as a
/// whole word.
fn has_symbol(text: &str, symbol: &str) -> bool {
    let words: Vec<&str> = symbol.split_whitespace().collect();
    match words.as_slice() {
        [kw, name] if KEYWORDS.contains(kw) => {
            let name = name.trim_end_matches("()");
            text.match_indices(kw).any(|(at, _)| {
                let before = text[..at].chars().next_back();
                let rest = &text[at + kw.len()..];
                let trimmed = rest.trim_start();
                before.is_none_or(|c| !is_ident(c))
                    && trimmed.len() < rest.len()
                    && trimmed.starts_with(name)
                    && trimmed[name.len()..]
                        .chars()
                        .next()
                        .is_none_or(|c| !is_ident(c))
            })
        }
        _ => symbol
            .trim_end_matches("()")
            .split("::")
            .all(|seg| has_word(text, seg)),
    }
}

fn has_word(text: &str, word: &str) -> bool {
    !word.is_empty()
        && text.match_indices(word).any(|(at, _)| {
            let before = text[..at].chars().next_back();
            let after = text[at + word.len()..].chars().next();
            before.is_none_or(|c| !is_ident(c)) && after.is_none_or(|c| !is_ident(c))
        })
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}
