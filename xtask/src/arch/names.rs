//! Architecture names are read in one place: config parsing turns
//! `architectures` / `model_type` (and a GGUF's `general.architecture`)
//! into a model spec, and nothing downstream branches on a family's name.
//!
//! Contract: [`check_source`] reports every string literal that is a model
//! family's name (a Hugging Face `model_type` from [`FAMILY_NAMES`], or a
//! class name ending in `ForCausalLM` / `ForConditionalGeneration`) in a
//! file outside [`ALLOWED`], ignoring comments and test code (files under
//! `tests/`, `*tests.rs`, and everything after a `#[cfg(test)]` module).

use super::Violation;

/// Where architecture names may appear (paths or folders): config
/// parsing, the GGUF reader's metadata mapping (its tokenizer models share
/// the names), the model presets' config files, and two places where a
/// name of another kind is spelled like a family: llama.cpp's
/// pre-tokenizer names (`tokenizer.ggml.pre`) and the reasoning parsers
/// a user picks by vLLM's names (`--reasoning-parser qwen3`).
pub const ALLOWED: [&str; 5] = [
    "crates/contract/src/config/family.rs",
    "crates/checkpoint/src/gguf/",
    "crates/contract/src/presets.rs",
    "crates/tokenizer/src/bpe_from_gguf.rs",
    "crates/server/src/reasoning.rs",
];

/// Hugging Face `model_type` values of decoder families.
pub const FAMILY_NAMES: [&str; 16] = [
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "gemma",
    "gemma2",
    "gemma3",
    "gemma3_text",
    "phi",
    "phi3",
    "granite",
    "olmo2",
    "smollm3",
];

/// Whether `file` (relative to the repository root) is test code as a whole.
fn is_test_file(file: &str) -> bool {
    file.contains("/tests/") || file.starts_with("tests/") || file.ends_with("tests.rs")
}

/// Whether literal `s` names a model family.
fn is_family_name(s: &str) -> bool {
    FAMILY_NAMES.contains(&s)
        || s.ends_with("ForCausalLM")
        || s.ends_with("ForConditionalGeneration")
}

/// The violations of `src` (the text of `file`, relative to the root).
pub fn check_source(file: &str, src: &str) -> Vec<Violation> {
    if ALLOWED.iter().any(|a| file.starts_with(a)) || is_test_file(file) {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut cfg_test = false;
    for (n, line) in src.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        if line.trim_start().starts_with("#[cfg(test)]") {
            cfg_test = true;
        }
        if cfg_test && line.trim_start().starts_with("mod ") {
            break; // the test module: the rest of the file is test code
        }
        if !line.trim_start().starts_with("#[") {
            cfg_test = cfg_test && line.trim().is_empty();
        }
        // the quoted pieces are at odd indices
        let named = code
            .split('"')
            .skip(1)
            .step_by(2)
            .find(|s| is_family_name(s));
        if let Some(name) = named {
            out.push(Violation {
                rule: format!(
                    "the architecture name \"{name}\" outside config parsing: read the model's spec instead"
                ),
                at: format!("{file}:{}", n + 1),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_planted_name_check_fails_and_allowed_places_pass() {
        let planted = "fn f(c: &Config) -> bool {\n    c.model_type == \"llama\"\n}\n";
        let v = check_source("crates/model/src/cuda/forward.rs", planted);
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].at, "crates/model/src/cuda/forward.rs:2");
        let class = "let a = \"Gemma3ForCausalLM\";";
        assert_eq!(check_source("crates/server/src/api.rs", class).len(), 1);
        for ok in [
            "let s = \"llama.cpp\"; // \"llama\" in a comment",
            "#[cfg(test)]\nmod tests {\n    const A: &str = \"llama\";\n}",
        ] {
            assert!(check_source("crates/cli/src/x.rs", ok).is_empty(), "{ok}");
        }
        assert!(check_source(ALLOWED[0], planted).is_empty());
        assert!(check_source("crates/model/src/cpu/tests.rs", planted).is_empty());
    }
}
