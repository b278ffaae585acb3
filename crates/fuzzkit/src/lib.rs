//! fuzzkit: what the parsers' property tests share: the seed corpus
//! (`tests/fuzz-corpus/<target>/` at the repository root), the number of
//! cases (`LAMINA_FUZZ_CASES`), byte-level mutations of a seed and arbitrary
//! or mutated JSON values, nested schemas, grammars and tool lists of a
//! chosen size ([`nested_schema`]), and an allocator that measures the largest
//! allocation a parse makes ([`alloc`]).
//!
//! Contract: every strategy is deterministic under proptest's seed, produces
//! inputs of bounded size (a few KiB over the seed) and shrinks towards the
//! unmutated seed, so a failure reports a small mutation of a known input.
//! A property test runs [`cases`] cases: [`DEFAULT_CASES`] unless
//! `LAMINA_FUZZ_CASES` asks for more (or fewer) for a longer local run.
//!
//! Costs: the corpus is read once per test (small files); mutations copy the
//! seed once.

pub mod alloc;
mod bytes;
mod json;
mod structures;

pub use bytes::{Mutation, mutated, mutated_from};
pub use json::{arb_json, mutated_json, wild_number};
pub use structures::{lark_grammar, nested_schema, tool_list};

use proptest::test_runner::{Config, FileFailurePersistence};
use std::path::PathBuf;

/// Cases per property in the normal test command (keeps the whole fuzz
/// suite within about a minute on two cores).
pub const DEFAULT_CASES: u32 = 256;

/// Cases per property: `LAMINA_FUZZ_CASES` when set to a number, else
/// `default`.
pub fn cases(default: u32) -> u32 {
    std::env::var("LAMINA_FUZZ_CASES")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

/// A proptest config of [`cases`]`(default)` cases; failures are not
/// persisted to files (regression inputs are named tests instead).
pub fn config(default: u32) -> Config {
    Config {
        cases: cases(default),
        failure_persistence: Some(Box::new(FileFailurePersistence::Off)),
        ..Config::default()
    }
}

/// `tests/fuzz-corpus/<target>` at the repository root.
pub fn corpus_dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fuzz-corpus")
        .join(target)
}

/// The seed files of `target`, sorted by name: `(file name, bytes)`.
/// Panics (failing the test) when the directory is missing or empty, so a
/// moved corpus cannot silently turn a fuzz test into a no-op.
pub fn corpus(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = corpus_dir(target);
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("fuzz corpus {}: {e}", dir.display()))
        .map(|e| {
            let path = e.expect("corpus entry").path();
            let bytes = std::fs::read(&path)
                .unwrap_or_else(|e| panic!("fuzz corpus {}: {e}", path.display()));
            let name = path
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into();
            (name, bytes)
        })
        .collect();
    out.sort();
    assert!(!out.is_empty(), "fuzz corpus {} is empty", dir.display());
    out
}
