//! Modules form layers: inside a crate, no two modules import each other,
//! directly or around a longer loop.
//!
//! Contract ([`check_crate`]):
//! - **Modules.** A module is a file (`foo.rs`, `foo/mod.rs`, the crate
//!   root) or an inline `mod x { .. }`, found by following the `mod`
//!   declarations from the crate root. Test code is not part of the graph:
//!   items under `#[cfg(test)]` (so `mod tests;` and the `*_tests.rs` files it
//!   brings in) are skipped whole.
//! - **Edges.** Module A refers to module B when A's code or `use` trees
//!   name a path that resolves into B: `crate::b::..`, `super::b::..`,
//!   `self::b::..`, or `b::..` where `b` is a module A declares. A path that
//!   stops at an item a module imports (`super::Foo` where the parent has
//!   `use b::Foo`, a `pub use` at the crate root) is followed to where the
//!   import leads, so a re-export does not hide an edge. Paths outside the
//!   crate, and paths in comments and strings, are not edges.
//! - **Rule.** Among the children of one module, each child taken with all
//!   its descendants, the references form an acyclic graph. A module and its
//!   own ancestors or descendants may refer to each other freely (the parent
//!   declares the child: `super::CudaBackend` from a child, `child::f` from
//!   the parent).
//! - **Report.** One violation per knot of siblings that reach each other: a
//!   shortest cycle through it as files in order (`a.rs -> b.rs -> a.rs`),
//!   each step with the `file:line` and the path that makes it, and the
//!   knot's other members. A `mod x;` whose file cannot be found is a
//!   violation too (the check would be blind to it).
//! - **Where.** Every crate of the workspace ([`crate_roots`]) except
//!   those listed in [`NOT_YET_LAYERED`].
//! - **Limits.** The names a glob import (`use b::*`) brings are not
//!   followed (the glob itself is an edge to `b`); paths a macro builds
//!   from pieces, and `#[path]` attributes, are not seen (a module declared
//!   with one is reported as having no file).
//!
//! Costs: one lexing pass per file; the graph per parent is tiny (its
//! children), so reachability is a search from every child.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::Path;

use anyhow::{Context, Result};

use super::Violation;

mod source;

use source::PathRef;

/// A module of one crate.
struct Module {
    /// Segments from the crate root (`["generate", "sse"]`).
    path: Vec<String>,
    /// Its file, and `::name` for inline modules (for messages).
    shown: String,
    parent: Option<usize>,
    children: BTreeMap<String, usize>,
    /// Names its `use` trees bind, as absolute paths (filled after loading).
    imports: BTreeMap<String, Vec<String>>,
    refs: Vec<(PathRef, String)>,
}

/// One reference, resolved: from module, to module, where and what.
struct Edge {
    from: usize,
    to: usize,
    at: String,
    text: String,
}

/// The module tree of one crate.
struct Tree {
    mods: Vec<Module>,
    missing: Vec<Violation>,
}

impl Tree {
    /// Loads the crate whose root file is `root_file`; `read` gives a file's
    /// text by its path (`/`-separated, as shown in messages).
    fn load(root_file: &str, read: &dyn Fn(&str) -> Option<String>) -> Self {
        let mut tree = Tree {
            mods: Vec::new(),
            missing: Vec::new(),
        };
        tree.add(Vec::new(), root_file.to_string(), None);
        let Some(text) = read(root_file) else {
            tree.missing.push(Violation {
                rule: "the crate root cannot be read for the layering check".into(),
                at: root_file.to_string(),
            });
            return tree;
        };
        tree.load_file(0, root_file, true, &text, read);
        tree.resolve_imports();
        tree
    }

    fn add(&mut self, path: Vec<String>, shown: String, parent: Option<usize>) -> usize {
        let idx = self.mods.len();
        if let (Some(p), Some(name)) = (parent, path.last()) {
            self.mods[p].children.insert(name.clone(), idx);
        }
        self.mods.push(Module {
            path,
            shown,
            parent,
            children: BTreeMap::new(),
            imports: BTreeMap::new(),
            refs: Vec::new(),
        });
        idx
    }

    /// Adds what `file` (module `idx`) declares and refers to, then loads
    /// the files of the modules it declares.
    fn load_file(
        &mut self,
        idx: usize,
        file: &str,
        mod_rs: bool,
        text: &str,
        read: &dyn Fn(&str) -> Option<String>,
    ) {
        let items = source::scan(text);
        let dir = match file.rsplit_once('/') {
            Some((d, name)) if !mod_rs => format!("{d}/{}", name.trim_end_matches(".rs")),
            Some((d, _)) => d.to_string(),
            None => String::new(),
        };
        let mut scopes: BTreeMap<Vec<String>, usize> = BTreeMap::from([(Vec::new(), idx)]);
        for m in items.mods {
            let Some(&parent) = scopes.get(&m.scope) else {
                continue;
            };
            let mut path = self.mods[parent].path.clone();
            path.push(m.name.clone());
            if m.inline {
                let mut scope = m.scope.clone();
                scope.push(m.name.clone());
                let shown = format!("{file}::{}", scope.join("::"));
                scopes.insert(scope, self.add(path, shown, Some(parent)));
                continue;
            }
            let sub: String = m.scope.iter().map(|s| format!("/{s}")).collect();
            let flat = format!("{dir}{sub}/{}.rs", m.name);
            let nested = format!("{dir}{sub}/{}/mod.rs", m.name);
            let found = [(flat, false), (nested, true)]
                .into_iter()
                .find_map(|(f, is_mod)| read(&f).map(|t| (f, is_mod, t)));
            let Some((child_file, is_mod, child_text)) = found else {
                self.missing.push(Violation {
                    rule: format!(
                        "module `{}` has no file {dir}{sub}/{0}.rs or {dir}{sub}/{0}/mod.rs the layering check can read",
                        m.name
                    ),
                    at: format!("{file}:{}", m.line),
                });
                continue;
            };
            let child = self.add(path, child_file.clone(), Some(parent));
            self.load_file(child, &child_file, is_mod, &child_text, read);
        }
        for r in items.refs {
            if let Some(&m) = scopes.get(&r.scope) {
                self.mods[m].refs.push((r, file.to_string()));
            }
        }
    }

    /// `segs` as written in module `m`, made absolute (segments from the
    /// crate root); `None` for paths outside the crate.
    fn absolute(&self, m: usize, segs: &[String]) -> Option<Vec<String>> {
        let here = &self.mods[m].path;
        let (base, rest): (&[String], &[String]) = match segs.first()?.as_str() {
            "crate" => (&[], &segs[1..]),
            "self" => (here, &segs[1..]),
            "super" => {
                let ups = segs.iter().take_while(|s| *s == "super").count();
                (here.get(..here.len().checked_sub(ups)?)?, &segs[ups..])
            }
            name if self.mods[m].children.contains_key(name) => (here, segs),
            _ => return None,
        };
        Some(base.iter().chain(rest).cloned().collect())
    }

    fn resolve_imports(&mut self) {
        for m in 0..self.mods.len() {
            let binds: Vec<(String, Vec<String>)> = self.mods[m]
                .refs
                .iter()
                .filter_map(|(r, _)| {
                    let name = r.binds.clone().filter(|b| b != "_")?;
                    Some((name, self.absolute(m, &r.segs)?))
                })
                .collect();
            self.mods[m].imports.extend(binds);
        }
    }

    /// The module an absolute path leads into, following imports.
    fn target(&self, abs: &[String]) -> usize {
        let mut segs = abs.to_vec();
        let (mut m, mut k, mut hops) = (0, 0, 0);
        while k < segs.len() {
            if let Some(&c) = self.mods[m].children.get(&segs[k]) {
                m = c;
                k += 1;
                continue;
            }
            match self.mods[m].imports.get(&segs[k]) {
                Some(to) if hops < 8 && to.as_slice() != &segs[..=k] => {
                    segs = to.iter().chain(&segs[k + 1..]).cloned().collect();
                    (m, k, hops) = (0, 0, hops + 1);
                }
                _ => break,
            }
        }
        m
    }

    fn edges(&self) -> Vec<Edge> {
        let mut out = Vec::new();
        for (from, module) in self.mods.iter().enumerate() {
            for (r, file) in &module.refs {
                if let Some(abs) = self.absolute(from, &r.segs) {
                    out.push(Edge {
                        from,
                        to: self.target(&abs),
                        at: format!("{file}:{}", r.line),
                        text: r.segs.join("::"),
                    });
                }
            }
        }
        out
    }

    /// `m`'s ancestor (or itself) at depth `d`.
    fn at_depth(&self, mut m: usize, d: usize) -> usize {
        while self.mods[m].path.len() > d {
            m = self.mods[m].parent.unwrap_or(0);
        }
        m
    }
}

/// The sibling graph under one parent: child -> child -> first evidence.
type Siblings = BTreeMap<usize, BTreeMap<usize, (String, String)>>;

fn sibling_graphs(tree: &Tree) -> BTreeMap<usize, Siblings> {
    let mut graphs: BTreeMap<usize, Siblings> = BTreeMap::new();
    for e in tree.edges() {
        let (a, b) = (&tree.mods[e.from].path, &tree.mods[e.to].path);
        let common = a.iter().zip(b).take_while(|(x, y)| x == y).count();
        if common == a.len() || common == b.len() {
            continue; // a module and its ancestor or descendant
        }
        let (sa, sb) = (
            tree.at_depth(e.from, common + 1),
            tree.at_depth(e.to, common + 1),
        );
        let parent = tree.mods[sa].parent.unwrap_or(0);
        graphs
            .entry(parent)
            .or_default()
            .entry(sa)
            .or_default()
            .entry(sb)
            .or_insert((e.at, e.text));
    }
    graphs
}

/// The nodes reachable from `from` in `g` (not `from` itself unless on a cycle).
fn reach(g: &Siblings, from: usize) -> BTreeSet<usize> {
    let mut seen = BTreeSet::new();
    let mut queue: VecDeque<usize> = g
        .get(&from)
        .into_iter()
        .flat_map(|s| s.keys().copied())
        .collect();
    while let Some(n) = queue.pop_front() {
        if seen.insert(n) {
            queue.extend(g.get(&n).into_iter().flat_map(|s| s.keys().copied()));
        }
    }
    seen
}

/// A shortest cycle from `start` back to it, inside `knot`.
fn shortest_cycle(g: &Siblings, start: usize, knot: &BTreeSet<usize>) -> Vec<usize> {
    let mut prev: BTreeMap<usize, usize> = BTreeMap::new();
    let mut queue = VecDeque::from([start]);
    while let Some(n) = queue.pop_front() {
        for &next in g.get(&n).into_iter().flat_map(|s| s.keys()) {
            if next == start {
                let mut cycle = vec![start, n];
                let mut cur = n;
                while cur != start {
                    cur = prev[&cur];
                    cycle.push(cur);
                }
                cycle.reverse();
                return cycle;
            }
            if knot.contains(&next) && !prev.contains_key(&next) {
                prev.insert(next, n);
                queue.push_back(next);
            }
        }
    }
    vec![start, start]
}

fn cycle_violation(tree: &Tree, g: &Siblings, knot: &BTreeSet<usize>, start: usize) -> Violation {
    let cycle = shortest_cycle(g, start, knot);
    let shown = |m: usize| tree.mods[m].shown.clone();
    let steps: Vec<String> = cycle
        .windows(2)
        .map(|w| {
            let (at, text) = &g[&w[0]][&w[1]];
            format!("{at} `{text}`")
        })
        .collect();
    let mut rule = format!(
        "modules import each other (siblings must form layers): {}",
        steps.join("; ")
    );
    let others: Vec<String> = knot
        .iter()
        .filter(|m| !cycle.contains(m))
        .map(|&m| shown(m))
        .collect();
    if !others.is_empty() {
        rule.push_str(&format!("; the knot also holds {}", others.join(", ")));
    }
    Violation {
        rule,
        at: cycle
            .iter()
            .map(|&m| shown(m))
            .collect::<Vec<_>>()
            .join(" -> "),
    }
}

/// The layering violations of the crate whose root file is `root_file`
/// (`read` gives a file's text by its `/`-separated path).
pub fn check_crate(root_file: &str, read: &dyn Fn(&str) -> Option<String>) -> Vec<Violation> {
    let tree = Tree::load(root_file, read);
    let mut out = tree.missing.clone();
    for g in sibling_graphs(&tree).values() {
        let mut done = BTreeSet::new();
        for &n in g.keys() {
            let from_n = reach(g, n);
            if done.contains(&n) || !from_n.contains(&n) {
                continue;
            }
            let knot: BTreeSet<usize> = from_n
                .iter()
                .copied()
                .filter(|&m| reach(g, m).contains(&n))
                .collect();
            done.extend(knot.iter().copied());
            out.push(cycle_violation(&tree, g, &knot, n));
        }
    }
    out
}

/// Crates (folders under `crates/`) whose modules do not form layers yet:
/// the check skips them. Every other crate, and xtask, is checked.
pub const NOT_YET_LAYERED: [&str; 4] = ["checkpoint", "cli", "contract", "cpu-kernels"];

/// The crate roots under `root`: `src/lib.rs`, `src/main.rs` and
/// `src/bin/*.rs` of xtask and of every crate in `crates/` but
/// [`NOT_YET_LAYERED`] (paths relative to `root`).
pub fn crate_roots(root: &Path) -> Result<Vec<String>> {
    let mut dirs = vec!["xtask".to_string()];
    let crates = root.join("crates");
    for entry in
        std::fs::read_dir(&crates).with_context(|| format!("listing {}", crates.display()))?
    {
        let name = entry?.file_name().to_string_lossy().to_string();
        if !NOT_YET_LAYERED.contains(&name.as_str()) {
            dirs.push(format!("crates/{name}"));
        }
    }
    let mut out = Vec::new();
    for d in dirs {
        for f in ["src/lib.rs", "src/main.rs"] {
            if root.join(&d).join(f).is_file() {
                out.push(format!("{d}/{f}"));
            }
        }
        let bin = root.join(&d).join("src/bin");
        let mut bins = Vec::new();
        super::collect_rs(&bin, &mut bins)?;
        for b in bins.iter().filter(|b| b.parent() == Some(bin.as_path())) {
            let name = b.file_name().unwrap_or_default().to_string_lossy();
            out.push(format!("{d}/src/bin/{name}"));
        }
    }
    out.sort();
    Ok(out)
}

/// [`check_crate`] over every crate of [`crate_roots`]: the number of
/// crates and the violations.
pub fn check_tree(root: &Path) -> Result<(usize, Vec<Violation>)> {
    let roots = crate_roots(root)?;
    let read = |p: &str| std::fs::read_to_string(root.join(p)).ok();
    let out = roots.iter().flat_map(|r| check_crate(r, &read)).collect();
    Ok((roots.len(), out))
}
