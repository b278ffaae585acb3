//! The safetensors loader under fuzzing: a valid micro model's file with
//! its JSON header edited (dtypes, shapes, offsets overlapping or out of
//! range, names), its length prefix lying, its data cut or extended, and
//! as mutated bytes.
//!
//! Property: `load_weights` never panics and allocates in proportion to the
//! file; an error names the file (or the directory); a load that succeeds
//! returns tensors of exactly the shapes the config implies.

use checkpoint::loader::{SINGLE_FILE, SafetensorsWriter, load_weights, tensor_specs};
use contract::config::ModelConfig;
use fuzzkit::alloc::largest_allocation;
use half::bf16;
use proptest::prelude::*;
use serde_json::Value;

/// hidden 4, one layer, 2 heads of 2, one KV head, vocabulary 8, tied.
pub const MICRO_CONFIG: &str = r#"{"hidden_size": 4, "intermediate_size": 8,
  "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
  "vocab_size": 8, "tie_word_embeddings": true}"#;

fn micro() -> ModelConfig {
    ModelConfig::from_json(MICRO_CONFIG, "micro").expect("micro config")
}

/// The micro model's weights as one BF16 safetensors file.
pub fn micro_safetensors() -> Vec<u8> {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join(SINGLE_FILE);
    let specs = tensor_specs(&micro(), false);
    let mut w = SafetensorsWriter::create(&path, specs.clone()).expect("create");
    for (k, s) in specs.iter().enumerate() {
        let data: Vec<bf16> = (0..s.numel())
            .map(|i| bf16::from_f32(((i + k) % 5) as f32 * 0.25))
            .collect();
        w.write_chunk(&data).expect("write");
    }
    w.finish().expect("finish");
    std::fs::read(&path).expect("read back")
}

/// Loads `file` as the micro model's weights, checking the contract.
pub fn safetensors_input(file: &[u8]) {
    let ((), largest) = largest_allocation(|| run(file));
    let bound = 256 * file.len() + (64 << 20);
    assert!(
        largest <= bound,
        "{} bytes made a {largest}-byte allocation",
        file.len()
    );
}

fn run(file: &[u8]) {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join(SINGLE_FILE), file).expect("write");
    let cfg = micro();
    match load_weights(dir.path(), &cfg) {
        Ok(w) => {
            assert_eq!(w.embed.shape, [cfg.vocab_size, cfg.hidden_size]);
            assert_eq!(w.layers.len(), cfg.num_layers);
            for l in &w.layers {
                assert_eq!(l.q_proj.shape(), [cfg.q_dim(), cfg.hidden_size]);
                let down = [cfg.hidden_size, cfg.intermediate_size];
                assert!(l.down_proj.check(down).is_ok());
            }
        }
        Err(e) => {
            let msg = e.to_string();
            let d = dir.path().display().to_string();
            assert!(msg.contains(&d), "error without the file: {msg}");
        }
    }
}

/// `(header JSON, data)` of a safetensors file.
fn split(file: &[u8]) -> (Value, Vec<u8>) {
    let n = u64::from_le_bytes(file[..8].try_into().expect("8 bytes")) as usize;
    let header = serde_json::from_slice(&file[8..8 + n]).expect("header JSON");
    (header, file[8 + n..].to_vec())
}

fn join(header: &Value, prefix: Option<u64>, data: &[u8]) -> Vec<u8> {
    let h = header.to_string();
    let mut out = prefix.unwrap_or(h.len() as u64).to_le_bytes().to_vec();
    out.extend(h.as_bytes());
    out.extend(data);
    out
}

/// A header value a tensor entry may be given: dtypes, shapes and offsets
/// that do not fit, besides arbitrary JSON.
fn entry_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        proptest::sample::select(vec![
            "BF16", "F16", "F32", "F64", "I8", "U8", "BOOL", "F8_E4M3", "bf16", ""
        ])
        .prop_map(Value::from),
        proptest::collection::vec(
            prop_oneof![
                Just(0u64),
                Just(1),
                Just(4),
                Just(8),
                Just(1 << 32),
                Just(u64::MAX)
            ],
            0..4
        )
        .prop_map(Value::from),
        fuzzkit::arb_json(),
    ]
}

fn seeds() -> Vec<Vec<u8>> {
    let mut s: Vec<Vec<u8>> = fuzzkit::corpus("safetensors")
        .into_iter()
        .map(|(_, b)| b)
        .collect();
    s.push(micro_safetensors());
    s
}

proptest! {
    #![proptest_config(fuzzkit::config(fuzzkit::DEFAULT_CASES))]

    #[test]
    fn safetensors_with_edited_header(
        header in fuzzkit::mutated_json(split(&micro_safetensors()).0),
        entry in proptest::option::of((any::<proptest::sample::Index>(), 0usize..3, entry_value())),
        prefix in proptest::option::weighted(0.2, prop_oneof![0u64..400, Just(u64::MAX), Just(100_000_001)]),
        cut in proptest::option::weighted(0.2, 0usize..600),
    ) {
        let (_, mut data) = split(&micro_safetensors());
        let mut header = header;
        // one field of one tensor entry replaced by a value that does not fit
        if let (Some((i, field, v)), Some(m)) = (entry, header.as_object_mut()) {
            let keys: Vec<String> = m.keys().cloned().collect();
            if !keys.is_empty() {
                let k = i.get(&keys);
                if let Some(e) = m.get_mut(k).and_then(Value::as_object_mut) {
                    e.insert(["dtype", "shape", "data_offsets"][field].into(), v);
                }
            }
        }
        if let Some(c) = cut {
            data.truncate(c);
        }
        safetensors_input(&join(&header, prefix, &data));
    }

    #[test]
    fn safetensors_with_mutated_bytes(buf in fuzzkit::mutated_from(seeds())) {
        safetensors_input(&buf);
    }
}

/// Writes the safetensors seeds into `tests/fuzz-corpus/safetensors`.
#[test]
#[ignore = "rewrites the committed seed corpus"]
fn regen_safetensors_corpus() {
    let dir = fuzzkit::corpus_dir("safetensors");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("micro-bf16.safetensors"), micro_safetensors()).unwrap();
    let (h, data) = split(&micro_safetensors());
    let mut overlap = h.clone();
    overlap["model.norm.weight"]["data_offsets"] = serde_json::json!([0, 8]);
    std::fs::write(
        dir.join("overlapping-offsets.safetensors"),
        join(&overlap, None, &data),
    )
    .unwrap();
    std::fs::write(
        dir.join("truncated.safetensors"),
        join(&h, None, &data[..data.len() / 2]),
    )
    .unwrap();
}

#[test]
fn micro_model_loads() {
    let buf = micro_safetensors();
    let ((), _) = largest_allocation(|| run(&buf));
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(SINGLE_FILE), &buf).unwrap();
    load_weights(dir.path(), &micro()).unwrap();
}
