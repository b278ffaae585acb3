//! What one source file says about the module graph: the modules it
//! declares (`mod x;`, `mod x { .. }`), its `use` trees, and the paths its
//! code writes (`crate::a::f`, `super::b::T`, `self::c`, `child::g`).
//!
//! Contract: [`scan`] works on the lexed code (comments and string contents
//! gone, see `super::super::lex`), so paths in docs and strings are not
//! references. Items under `#[cfg(test)]` (a `mod tests;` declaration, an
//! inline test module, a test-only `use` or function) are skipped whole; a
//! file whose first inner attribute is `#![cfg(test)]` yields nothing.
//! Paths are returned as written; resolving them needs the module tree.

use super::super::lex;

/// A code token: an identifier, `::`, or one punctuation character.
#[derive(Debug, Clone, PartialEq)]
struct Tok {
    text: String,
    line: usize,
}

/// A module declaration, inside the inline modules `scope` of the file.
#[derive(Debug, Clone, PartialEq)]
pub struct ModDecl {
    pub scope: Vec<String>,
    pub name: String,
    /// `mod x { .. }` (true) or `mod x;` (false).
    pub inline: bool,
    pub line: usize,
}

/// A path the code refers to, with the inline module `scope` it is written in.
#[derive(Debug, Clone, PartialEq)]
pub struct PathRef {
    pub scope: Vec<String>,
    /// Segments as written (`["super", "state", "AppState"]`).
    pub segs: Vec<String>,
    /// The name a `use` binds (`as` alias or the last segment); `None` for
    /// code paths and glob imports.
    pub binds: Option<String>,
    pub line: usize,
}

/// Everything [`scan`] finds in one file.
#[derive(Debug, Default)]
pub struct Items {
    pub mods: Vec<ModDecl>,
    pub refs: Vec<PathRef>,
}

fn tokenize(src: &str) -> Vec<Tok> {
    let mut out = Vec::new();
    for (n, line) in lex(src).iter().enumerate() {
        let chars: Vec<char> = line.code.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            let ident = |c: char| c.is_alphanumeric() || c == '_';
            if ident(c) {
                let start = i;
                while i < chars.len() && ident(chars[i]) {
                    i += 1;
                }
                let text = chars[start..i].iter().collect();
                out.push(Tok { text, line: n + 1 });
                continue;
            }
            if c == ':' && chars.get(i + 1) == Some(&':') {
                out.push(Tok {
                    text: "::".into(),
                    line: n + 1,
                });
                i += 2;
                continue;
            }
            if !c.is_whitespace() {
                out.push(Tok {
                    text: c.to_string(),
                    line: n + 1,
                });
            }
            i += 1;
        }
    }
    out
}

fn is_ident(t: &str) -> bool {
    t.chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_')
}

/// The walk over one file's tokens.
struct Walk {
    toks: Vec<Tok>,
    i: usize,
    /// Open inline modules: (name, brace depth inside their body).
    open: Vec<(String, usize)>,
    depth: usize,
    items: Items,
}

impl Walk {
    fn at(&self, k: usize) -> &str {
        self.toks.get(k).map_or("", |t| t.text.as_str())
    }

    fn line(&self, k: usize) -> usize {
        self.toks.get(k).map_or(0, |t| t.line)
    }

    fn scope(&self) -> Vec<String> {
        self.open.iter().map(|(n, _)| n.clone()).collect()
    }

    /// The attribute starting at `#`: its end and whether it is `cfg(test)`.
    fn attribute(&self, k: usize) -> (usize, bool) {
        let open = if self.at(k + 1) == "!" { k + 2 } else { k + 1 };
        let mut depth = 0;
        let mut j = open;
        while j < self.toks.len() {
            match self.at(j) {
                "[" => depth += 1,
                "]" => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                _ => {}
            }
            j += 1;
        }
        let body: Vec<&str> = (open + 1..j).map(|x| self.at(x)).collect();
        (j + 1, body == ["cfg", "(", "test", ")"])
    }

    /// The end of the item (or field, arm, statement) starting at `k`:
    /// its `;` or `,` outside brackets and generics, or its `{ .. }` body.
    fn item_end(&self, k: usize) -> usize {
        let mut nest = 0usize;
        let mut j = k;
        while j < self.toks.len() {
            let arrow = j > 0 && matches!(self.at(j - 1), "-" | "=");
            match self.at(j) {
                "(" | "[" | "<" => nest += 1,
                ")" | "]" => nest = nest.saturating_sub(1),
                ">" if !arrow => nest = nest.saturating_sub(1),
                ";" | "," if nest == 0 => return j + 1,
                "}" if nest == 0 => return j,
                "{" if nest == 0 => {
                    let mut braces = 0;
                    while j < self.toks.len() {
                        match self.at(j) {
                            "{" => braces += 1,
                            "}" => {
                                braces -= 1;
                                if braces == 0 {
                                    return j + 1;
                                }
                            }
                            _ => {}
                        }
                        j += 1;
                    }
                }
                _ => {}
            }
            j += 1;
        }
        j
    }

    fn run(mut self) -> Items {
        let mut test_only = false;
        while self.i < self.toks.len() {
            let k = self.i;
            let t = self.at(k).to_string();
            if t == "#" && matches!(self.at(k + 1), "[" | "!") {
                let (end, is_test) = self.attribute(k);
                if is_test && self.at(k + 1) == "!" {
                    return Items::default();
                }
                test_only |= is_test;
                self.i = end;
                continue;
            }
            if test_only {
                test_only = false;
                self.i = self.item_end(k);
                continue;
            }
            self.i = match t.as_str() {
                "{" => {
                    self.depth += 1;
                    k + 1
                }
                "}" => {
                    if self.open.last().is_some_and(|(_, d)| *d == self.depth) {
                        self.open.pop();
                    }
                    self.depth = self.depth.saturating_sub(1);
                    k + 1
                }
                "mod" if is_ident(self.at(k + 1)) => self.module(k),
                "use" if self.at(k + 1) != "<" => self.use_item(k),
                _ => self.path(k),
            };
        }
        self.items
    }

    fn module(&mut self, k: usize) -> usize {
        let name = self.at(k + 1).to_string();
        let inline = self.at(k + 2) == "{";
        self.items.mods.push(ModDecl {
            scope: self.scope(),
            name: name.clone(),
            inline,
            line: self.line(k),
        });
        if inline {
            self.depth += 1;
            self.open.push((name, self.depth));
            k + 3
        } else {
            k + 2
        }
    }

    fn use_item(&mut self, k: usize) -> usize {
        let mut j = k + 1;
        if self.at(j) != "::" {
            self.use_tree(&mut j, Vec::new(), self.line(k));
        }
        while j < self.toks.len() && self.at(j) != ";" {
            j += 1;
        }
        j + 1
    }

    /// One use tree at `*j` under `prefix` (recursive over `{ .. }` groups).
    fn use_tree(&mut self, j: &mut usize, prefix: Vec<String>, line: usize) {
        let t = self.at(*j).to_string();
        let push = |w: &mut Self, segs: Vec<String>, binds: Option<String>| {
            let scope = w.scope();
            w.items.refs.push(PathRef {
                scope,
                segs,
                binds,
                line,
            });
        };
        if t == "{" {
            *j += 1;
            while *j < self.toks.len() && !matches!(self.at(*j), "}" | ";") {
                let before = *j;
                self.use_tree(j, prefix.clone(), line);
                if self.at(*j) == "," || *j == before {
                    *j += 1;
                }
            }
            *j += 1;
        } else if t == "*" {
            *j += 1;
            if !prefix.is_empty() {
                push(self, prefix, None);
            }
        } else if is_ident(&t) {
            *j += 1;
            if self.at(*j) == "::" {
                *j += 1;
                let mut p = prefix;
                p.push(t);
                self.use_tree(j, p, line);
                return;
            }
            let (segs, last) = if t == "self" {
                let last = prefix.last().cloned().unwrap_or_default();
                (prefix, last)
            } else {
                let mut p = prefix;
                p.push(t.clone());
                (p, t)
            };
            let binds = if self.at(*j) == "as" {
                *j += 2;
                self.at(*j - 1).to_string()
            } else {
                last
            };
            if !segs.is_empty() {
                push(self, segs, Some(binds));
            }
        }
    }

    /// A code path starting at `k` (`crate::`, `super::`, `self::`, `x::`).
    fn path(&mut self, k: usize) -> usize {
        let t = self.at(k);
        let prev = if k > 0 { self.at(k - 1) } else { "" };
        let visibility = prev == "in" && k > 1 && self.at(k - 2) == "(";
        let continues = matches!(prev, "::" | "." | "$") && t != "crate";
        if !is_ident(t) || self.at(k + 1) != "::" || visibility || continues {
            return k + 1;
        }
        let mut segs = vec![t.to_string()];
        let mut j = k + 1;
        while self.at(j) == "::" && is_ident(self.at(j + 1)) {
            segs.push(self.at(j + 1).to_string());
            j += 2;
        }
        let scope = self.scope();
        self.items.refs.push(PathRef {
            scope,
            segs,
            binds: None,
            line: self.line(k),
        });
        j
    }
}

/// The module declarations and references of one source text.
pub fn scan(src: &str) -> Items {
    Walk {
        toks: tokenize(src),
        i: 0,
        open: Vec::new(),
        depth: 0,
        items: Items::default(),
    }
    .run()
}
