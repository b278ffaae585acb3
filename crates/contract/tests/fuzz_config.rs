//! Fuzzing `config.json` and `generation_config.json` resolution: the seed
//! corpus (`tests/fuzz-corpus/config`, `.../generation-config`) with fields
//! removed or replaced by arbitrary JSON (wrong types, negative, huge,
//! fractional and subnormal numbers), and as mutated bytes.
//!
//! Contract checked: no input panics; an error names the file, and the
//! field whenever one is at fault; a config that validates can be used
//! without overflow (every size product fits, `rms_norm_eps` is a positive
//! f32, RoPE frequencies are finite and positive). `LAMINA_FUZZ_CASES` sets
//! the number of cases.

use contract::config::{ConfigError, GenerationConfig, ModelConfig};
use proptest::prelude::*;
use serde_json::Value;

const PATH: &str = "fuzz/config.json";

fn seeds(target: &str) -> Vec<Value> {
    fuzzkit::corpus(target)
        .into_iter()
        .map(|(name, b)| serde_json::from_slice(&b).unwrap_or_else(|e| panic!("seed {name}: {e}")))
        .collect()
}

fn raw_seeds(target: &str) -> Vec<Vec<u8>> {
    fuzzkit::corpus(target)
        .into_iter()
        .map(|(_, b)| b)
        .collect()
}

/// The error contract: the file is named, the field whenever the error is
/// about one.
fn check_error(e: &ConfigError, path: &str) {
    let msg = e.to_string();
    assert!(msg.contains(path), "error does not name the file: {msg}");
    match e {
        ConfigError::Invalid { field, .. } => {
            assert!(msg.contains(field), "error does not name `{field}`: {msg}")
        }
        // a wrong value names its field; at the top level, the missing field
        // or the document that is not an object
        ConfigError::Parse { field, source, .. } if source.is_data() => assert!(
            !field.is_empty() && field != "."
                || msg.contains("missing field")
                || msg.contains("expected struct"),
            "type error without its field: {msg}"
        ),
        _ => {}
    }
}

/// What every validated config guarantees to the code that sizes buffers.
fn check_valid(c: &ModelConfig) {
    let dims = [
        c.hidden_size,
        c.intermediate_size,
        c.num_layers,
        c.num_heads,
        c.num_kv_heads,
        c.head_dim,
        c.vocab_size,
        c.max_position_embeddings,
    ];
    assert!(dims.iter().all(|&d| d > 0), "{c:?}");
    assert_eq!(c.num_heads % c.num_kv_heads, 0, "{c:?}");
    assert_eq!(c.head_dim % 2, 0, "{c:?}");
    let q = c
        .num_heads
        .checked_mul(c.head_dim)
        .expect("q_dim overflows");
    for rows in [c.vocab_size, q, c.intermediate_size] {
        let n = rows
            .checked_mul(c.hidden_size)
            .expect("tensor size overflows");
        assert!(n.checked_mul(4).is_some_and(|b| b <= isize::MAX as usize));
    }
    assert_eq!((c.q_dim(), c.kv_dim()), (q, c.num_kv_heads * c.head_dim));
    assert!(c.rms_norm_eps > 0.0 && c.rms_norm_eps.is_finite(), "{c:?}");
    assert!(c.rope().theta >= 1.0 && c.rope().theta.is_finite(), "{c:?}");
    if c.head_dim <= 1 << 14 {
        let inv = c.rope_inv_freq();
        assert!(
            inv.iter().all(|f| f.is_finite() && *f > 0.0),
            "non-finite RoPE frequency for {c:?}: {inv:?}"
        );
    }
}

fn config_text(text: &str) {
    match ModelConfig::from_json(text, PATH) {
        Ok(c) => check_valid(&c),
        Err(e) => check_error(&e, PATH),
    }
}

fn generation_text(text: &str) {
    let path = "fuzz/generation_config.json";
    match GenerationConfig::from_json(text, path) {
        Ok(g) => {
            if let Some(t) = g.temperature {
                assert!(t >= 0.0 && t.is_finite(), "{g:?}");
            }
            if let Some(p) = g.top_p {
                assert!(p > 0.0 && p <= 1.0, "{g:?}");
            }
        }
        Err(e) => check_error(&e, path),
    }
}

proptest! {
    #![proptest_config(fuzzkit::config(fuzzkit::DEFAULT_CASES))]

    #[test]
    fn config_with_mutated_fields(
        v in proptest::sample::select(seeds("config")).prop_flat_map(fuzzkit::mutated_json)
    ) {
        config_text(&v.to_string());
    }

    #[test]
    fn config_as_mutated_bytes(b in fuzzkit::mutated_from(raw_seeds("config"))) {
        config_text(&String::from_utf8_lossy(&b));
    }

    #[test]
    fn config_arbitrary_json(v in fuzzkit::arb_json()) {
        config_text(&v.to_string());
    }

    #[test]
    fn generation_config_with_mutated_fields(
        v in proptest::sample::select(seeds("generation-config"))
            .prop_flat_map(fuzzkit::mutated_json)
    ) {
        generation_text(&v.to_string());
    }

    #[test]
    fn generation_config_as_mutated_bytes(
        b in fuzzkit::mutated_from(raw_seeds("generation-config"))
    ) {
        generation_text(&String::from_utf8_lossy(&b));
    }
}

// Regression tests: inputs the fuzzer found, minimal.

fn tiny_with(field: &str, value: Value) -> String {
    let mut v = seeds("config")
        .into_iter()
        .find(|v| v["hidden_size"] == 64)
        .expect("tiny seed");
    match field.split_once('.') {
        None => v[field] = value,
        Some((outer, inner)) => v[outer][inner] = value,
    }
    v.to_string()
}

fn invalid_field(text: &str) -> String {
    match ModelConfig::from_json(text, PATH) {
        Err(ConfigError::Invalid { field, .. }) => field.to_string(),
        other => panic!("expected an invalid field, got {other:?}"),
    }
}

#[test]
fn heads_times_head_dim_overflow_is_refused() {
    let text = tiny_with("num_attention_heads", (1u64 << 62).into());
    let text = text.replace("\"num_key_value_heads\":2", "\"num_key_value_heads\":1");
    assert_eq!(invalid_field(&text), "head_dim");
}

#[test]
fn embedding_larger_than_memory_is_refused() {
    let text = tiny_with("vocab_size", (1u64 << 60).into());
    assert_eq!(invalid_field(&text), "vocab_size");
}

#[test]
fn rms_norm_eps_that_is_zero_or_infinite_in_f32_is_refused() {
    for eps in [1e-50, 1e39] {
        let text = tiny_with("rms_norm_eps", eps.into());
        assert_eq!(invalid_field(&text), "rms_norm_eps", "{eps}");
    }
}

#[test]
fn llama3_factor_below_one_is_refused() {
    // 1e-320 made every low frequency infinite
    for f in [1e-320, 0.5] {
        let text = tiny_with("rope_scaling.factor", f.into());
        assert_eq!(invalid_field(&text), "rope_scaling.factor", "{f}");
    }
}

#[test]
fn type_errors_name_the_field() {
    let text = tiny_with("rope_scaling.factor", "big".into());
    let e = ModelConfig::from_json(&text, PATH).unwrap_err().to_string();
    assert!(e.contains("rope_scaling.factor") && e.contains(PATH), "{e}");
    let e = GenerationConfig::from_json(r#"{"top_k": -1}"#, "g.json")
        .unwrap_err()
        .to_string();
    assert!(e.contains("`top_k`") && e.contains("g.json"), "{e}");
}
