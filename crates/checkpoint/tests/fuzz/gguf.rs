//! GGUF reader and importer under fuzzing: the micro llama with its header
//! fields edited (version, lying counts, value types and payloads, dims,
//! tensor types, offsets, names), seed files with mutated bytes, and random
//! bytes.
//!
//! Property: parsing, dequantising every tensor and importing never panic
//! and allocate in proportion to the file; errors name the file, tensor or
//! key; a dequantised tensor has exactly the elements its dims promise; an
//! import that succeeds yields a directory whose config loads.

use checkpoint::gguf::{Gguf, GgufError, import_to_dir};
use fuzzkit::{Mutation, alloc::largest_allocation};
use proptest::prelude::*;
use proptest::sample::Index;

use crate::writer::{GgufDesc, TensorDesc, micro_llama};

const PATH: &str = "fuzz.gguf";

/// Parses, dequantises and imports `buf`, checking the contract.
pub fn gguf_input(buf: &[u8]) {
    let ((), largest) = largest_allocation(|| run(buf));
    let bound = 256 * buf.len() + (64 << 20);
    assert!(
        largest <= bound,
        "a {}-byte file made a {largest}-byte allocation",
        buf.len()
    );
}

fn run(buf: &[u8]) {
    let g = match Gguf::parse(buf, PATH) {
        Ok(g) => g,
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.contains(PATH), "parse error without the file: {msg}");
            if let GgufError::Truncated { offset, .. } = e {
                assert!(offset <= buf.len(), "{msg}");
            }
            return;
        }
    };
    let mut names = std::collections::HashSet::new();
    for t in &g.tensors {
        assert!(
            names.insert(&t.name),
            "duplicate tensor `{}` accepted",
            t.name
        );
        match g.dequantize(buf, t) {
            Ok(v) => {
                let want: u128 = t.dims.iter().map(|&d| u128::from(d)).product();
                assert_eq!(v.len() as u128, want, "tensor `{}` {:?}", t.name, t.dims);
            }
            Err(e) => {
                let msg = e.to_string();
                assert!(msg.contains(&t.name), "error without the tensor: {msg}");
            }
        }
    }
    let dir = tempfile::tempdir().expect("temp dir");
    match import_to_dir(&g, buf, dir.path(), None) {
        Ok(()) => {
            let m = checkpoint::loader::load_config(dir.path())
                .unwrap_or_else(|e| panic!("imported config does not load: {e}"));
            metadata_is_kept(&g, &m.config);
            if let Err(e) = checkpoint::loader::load_weights(dir.path(), &m.config) {
                assert!(
                    matches!(
                        e,
                        checkpoint::loader::LoadError::NonFinite { .. }
                            | checkpoint::loader::LoadError::Implausible { .. }
                    ),
                    "imported weights do not load: {e}"
                );
            }
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
}

/// An imported config holds the GGUF's own values: none was replaced by a
/// default, and its special tokens are in the vocabulary.
fn metadata_is_kept(g: &Gguf, c: &contract::config::ModelConfig) {
    let meta = |k: &str| g.metadata.get(k).and_then(|v| v.as_f64());
    if let Some(theta) = meta("llama.rope.freq_base") {
        assert_eq!(c.rope().theta as f32, theta as f32, "rope.freq_base");
    }
    if let Some(eps) = meta("llama.attention.layer_norm_rms_epsilon") {
        assert_eq!(c.rms_norm_eps, eps as f32, "layer_norm_rms_epsilon");
    }
    for id in c.eos_token_ids.iter().chain(&c.bos_token_id) {
        assert!((*id as usize) < c.vocab_size, "token id {id}");
    }
}

/// One edit of the structured file.
#[derive(Debug, Clone)]
enum Edit {
    Version(u32),
    TensorCount(u64),
    KvCount(u64),
    KvType(Index, u32),
    KvPayload(Index, Mutation),
    KvNumber(Index, u64),
    KvFloat(Index, f32),
    DropKv(Index),
    Dims(Index, Vec<u64>),
    TensorType(Index, u32),
    Offset(Index, u64),
    Rename(Index, Index),
    DupTensor(Index),
    DropTensor(Index),
}

fn wild() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(u64::from(u32::MAX)),
        Just(1 << 32),
        Just(1 << 60),
        Just(u64::MAX),
        0u64..64,
    ]
}

fn wild_float() -> impl Strategy<Value = f32> {
    prop_oneof![
        Just(f32::NAN),
        Just(f32::INFINITY),
        Just(f32::NEG_INFINITY),
        Just(0.0),
        Just(-1.0),
        Just(1e-40),
        Just(1e30),
        any::<f32>(),
    ]
}

fn edit() -> impl Strategy<Value = Edit> {
    let i = any::<Index>;
    prop_oneof![
        prop_oneof![Just(1u32), Just(2), Just(4), any::<u32>()].prop_map(Edit::Version),
        wild().prop_map(Edit::TensorCount),
        wild().prop_map(Edit::KvCount),
        (i(), 0u32..14).prop_map(|(k, t)| Edit::KvType(k, t)),
        (i(), any::<Mutation>()).prop_map(|(k, m)| Edit::KvPayload(k, m)),
        (i(), wild()).prop_map(|(k, v)| Edit::KvNumber(k, v)),
        (i(), wild_float()).prop_map(|(k, v)| Edit::KvFloat(k, v)),
        i().prop_map(Edit::DropKv),
        (i(), proptest::collection::vec(wild(), 0..6)).prop_map(|(t, d)| Edit::Dims(t, d)),
        (
            i(),
            prop_oneof![0u32..4, 6u32..9, 10u32..15, Just(30), any::<u32>()]
        )
            .prop_map(|(t, ty)| Edit::TensorType(t, ty)),
        (i(), wild()).prop_map(|(t, o)| Edit::Offset(t, o)),
        (i(), i()).prop_map(|(a, b)| Edit::Rename(a, b)),
        i().prop_map(Edit::DupTensor),
        i().prop_map(Edit::DropTensor),
    ]
}

impl Edit {
    fn apply(&self, d: &mut GgufDesc) {
        let (nk, nt) = (d.kvs.len(), d.tensors.len());
        match self {
            Edit::Version(v) => d.version = *v,
            Edit::TensorCount(n) => d.n_tensors = Some(*n),
            Edit::KvCount(n) => d.n_kv = Some(*n),
            Edit::KvType(k, t) if nk > 0 => d.kvs[k.index(nk)].ty = *t,
            Edit::KvPayload(k, m) if nk > 0 => m.apply(&mut d.kvs[k.index(nk)].payload),
            Edit::KvNumber(k, v) if nk > 0 => {
                let kv = &mut d.kvs[k.index(nk)];
                kv.payload = match kv.ty {
                    4 | 5 => (*v as u32).to_le_bytes().to_vec(),
                    _ => v.to_le_bytes().to_vec(),
                };
            }
            Edit::KvFloat(k, v) if nk > 0 => {
                let kv = &mut d.kvs[k.index(nk)];
                kv.ty = 6;
                kv.payload = v.to_le_bytes().to_vec();
            }
            Edit::DropKv(k) if nk > 0 => {
                d.kvs.remove(k.index(nk));
            }
            Edit::Dims(t, dims) if nt > 0 => d.tensors[t.index(nt)].dims = dims.clone(),
            Edit::TensorType(t, ty) if nt > 0 => d.tensors[t.index(nt)].ty = *ty,
            Edit::Offset(t, o) if nt > 0 => d.tensors[t.index(nt)].offset = Some(*o),
            Edit::Rename(a, b) if nt > 0 => {
                let name = d.tensors[b.index(nt)].name.clone();
                d.tensors[a.index(nt)].name = name;
            }
            Edit::DupTensor(t) if nt > 0 => {
                let copy = d.tensors[t.index(nt)].clone();
                d.tensors.push(copy);
            }
            Edit::DropTensor(t) if nt > 0 => {
                d.tensors.remove(t.index(nt));
            }
            _ => {}
        }
    }
}

fn seeds() -> Vec<Vec<u8>> {
    let mut s: Vec<Vec<u8>> = fuzzkit::corpus("gguf")
        .into_iter()
        .map(|(_, b)| b)
        .collect();
    s.push(micro_llama().bytes());
    s
}

proptest! {
    #![proptest_config(fuzzkit::config(fuzzkit::DEFAULT_CASES))]

    #[test]
    fn gguf_with_edited_header(edits in proptest::collection::vec(edit(), 0..4)) {
        let mut d = micro_llama();
        for e in &edits {
            e.apply(&mut d);
        }
        gguf_input(&d.bytes());
    }

    #[test]
    fn gguf_with_mutated_bytes(buf in fuzzkit::mutated_from(seeds())) {
        gguf_input(&buf);
    }

    #[test]
    fn gguf_random_bytes(tail in proptest::collection::vec(any::<u8>(), 0..256), magic: bool) {
        let mut buf = if magic { b"GGUF\x03\0\0\0".to_vec() } else { Vec::new() };
        buf.extend(tail);
        gguf_input(&buf);
    }
}

/// Writes the GGUF seeds into `tests/fuzz-corpus/gguf` (run by hand after
/// changing the writer: `cargo test -p checkpoint --test fuzz -- --ignored`).
#[test]
#[ignore = "rewrites the committed seed corpus"]
fn regen_gguf_corpus() {
    let dir = fuzzkit::corpus_dir("gguf");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("micro-llama.gguf"), micro_llama().bytes()).unwrap();
    let mut v2 = micro_llama();
    v2.version = 2;
    v2.tensors.truncate(2);
    std::fs::write(dir.join("v2-two-tensors.gguf"), v2.bytes()).unwrap();
    let mut meta_only = micro_llama();
    meta_only.tensors.clear();
    std::fs::write(dir.join("metadata-only.gguf"), meta_only.bytes()).unwrap();
    std::fs::write(dir.join("every-quant-type.gguf"), every_quant_type()).unwrap();
}

/// One 256-element tensor of each block type (Q4_0 .. Q6_K) with patterned
/// bytes and finite f16 scales, so mutations reach every dequantiser.
fn every_quant_type() -> Vec<u8> {
    let mut d = micro_llama();
    d.kvs.truncate(1);
    // (type id, bytes per block, byte offsets of the f16 scales in a block)
    let types: [(u32, usize, &[usize]); 9] = [
        (2, 18, &[0]),
        (3, 20, &[0, 2]),
        (6, 22, &[0]),
        (7, 24, &[0, 2]),
        (10, 84, &[80, 82]),
        (11, 110, &[108]),
        (12, 144, &[0, 2]),
        (13, 176, &[0, 2]),
        (14, 210, &[208]),
    ];
    d.tensors = types
        .iter()
        .map(|&(ty, block, scales)| {
            let blocks = if block < 84 { 8 } else { 1 };
            let mut data: Vec<u8> = (0..block * blocks).map(|i| (i * 37 % 251) as u8).collect();
            for b in 0..blocks {
                for &o in scales {
                    data[b * block + o..b * block + o + 2]
                        .copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
                }
            }
            TensorDesc {
                name: format!("t.{ty}"),
                dims: vec![256],
                ty,
                data,
                offset: None,
            }
        })
        .collect();
    d.bytes()
}

#[test]
fn every_quant_type_seed_dequantises() {
    let buf = every_quant_type();
    let g = Gguf::parse(&buf, PATH).unwrap();
    for t in &g.tensors {
        let v = g.dequantize(&buf, t).unwrap();
        assert_eq!(v.len(), 256, "{}", t.name);
        assert!(
            v.iter().all(|x| x.is_finite()) && v.iter().any(|&x| x != 0.0),
            "{}",
            t.name
        );
    }
}

// Regression tests: inputs the fuzzer found, minimal.

fn one_tensor(dims: &[u64], ty: u32) -> Vec<u8> {
    let mut d = micro_llama();
    d.kvs.truncate(1);
    d.tensors.truncate(1);
    d.tensors[0].dims = dims.to_vec();
    d.tensors[0].ty = ty;
    d.bytes()
}

#[test]
fn element_count_overflow_is_refused() {
    // 2^32 x 2^32 F32 elements wrapped to 0: an empty tensor that "fit"
    let buf = one_tensor(&[1 << 32, 1 << 32], 0);
    let e = Gguf::parse(&buf, PATH).unwrap_err().to_string();
    assert!(
        e.contains("token_embd.weight") && e.contains("overflow"),
        "{e}"
    );
}

#[test]
fn duplicate_tensor_and_key_are_refused() {
    let mut d = micro_llama();
    let copy = d.tensors[1].clone();
    d.tensors.push(copy);
    let e = Gguf::parse(&d.bytes(), PATH).unwrap_err().to_string();
    assert!(
        e.contains("output_norm.weight") && e.contains("twice"),
        "{e}"
    );
    let mut d = micro_llama();
    let copy = d.kvs[1].clone();
    d.kvs.push(copy);
    let e = Gguf::parse(&d.bytes(), PATH).unwrap_err().to_string();
    assert!(
        e.contains("llama.embedding_length") && e.contains("twice"),
        "{e}"
    );
}

#[test]
fn huge_counts_fail_before_allocating() {
    for (tensors, kvs) in [(Some(1u64 << 60), None), (None, Some(u64::MAX))] {
        let mut d = micro_llama();
        d.n_tensors = tensors;
        d.n_kv = kvs;
        let buf = d.bytes();
        let (r, largest) = largest_allocation(|| Gguf::parse(&buf, PATH).map(|_| ()));
        assert!(r.unwrap_err().to_string().contains("exceeds"));
        assert!(largest < 1 << 20, "{largest} bytes allocated");
    }
}

#[test]
fn huge_block_count_is_refused_before_allocating() {
    // block_count 2^32 - 1 built 9 tensor specs a layer: a 4.4 GB allocation
    let mut d = micro_llama();
    let kv = d
        .kvs
        .iter_mut()
        .find(|k| k.key == "llama.block_count")
        .unwrap();
    kv.payload = u32::MAX.to_le_bytes().to_vec();
    let buf = d.bytes();
    let g = Gguf::parse(&buf, PATH).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (r, largest) = largest_allocation(|| import_to_dir(&g, &buf, dir.path(), None));
    let e = r.unwrap_err().to_string();
    assert!(
        e.contains("llama.block_count") && e.contains("4294967295"),
        "{e}"
    );
    assert!(largest < 1 << 20, "{largest} bytes allocated");
}

#[test]
fn micro_llama_imports_and_loads() {
    let buf = micro_llama().bytes();
    let g = Gguf::parse(&buf, PATH).unwrap();
    let dir = tempfile::tempdir().unwrap();
    import_to_dir(&g, &buf, dir.path(), None).unwrap();
    let m = checkpoint::loader::load_config(dir.path()).unwrap();
    checkpoint::loader::load_weights(dir.path(), &m.config).unwrap();
    tokenizer::Tokenizer::from_dir(dir.path()).unwrap();
}

/// The imported `add_bos_token` is llama.cpp's decision: with no key, by
/// the pre-tokenizer (`llama-bpe` adds BOS, `smollm` does not); a key wins.
#[test]
fn add_bos_token_is_decided_as_llama_cpp_decides_it() {
    let imported = |pre: &str, key: Option<bool>| {
        let mut d = micro_llama();
        d.kvs.retain(|k| k.key != "tokenizer.ggml.add_bos_token");
        if let Some(b) = key {
            d.kvs.push(crate::writer::kv(
                "tokenizer.ggml.add_bos_token",
                7,
                vec![u8::from(b)],
            ));
        }
        let kv = d
            .kvs
            .iter_mut()
            .find(|k| k.key == "tokenizer.ggml.pre")
            .unwrap();
        kv.payload = crate::writer::string(pre);
        let buf = d.bytes();
        let g = Gguf::parse(&buf, PATH).unwrap();
        let dir = tempfile::tempdir().unwrap();
        import_to_dir(&g, &buf, dir.path(), None).unwrap();
        let tc: serde_json::Value = serde_json::from_slice(
            &std::fs::read(dir.path().join("tokenizer_config.json")).unwrap(),
        )
        .unwrap();
        let tok = tokenizer::Tokenizer::from_dir(dir.path()).unwrap();
        let with_bos = tok.encode("a", true).unwrap().first() == Some(&5);
        assert_eq!(tc["add_bos_token"].as_bool(), Some(with_bos), "{pre}");
        with_bos
    };
    assert!(imported("llama-bpe", None));
    assert!(!imported("smollm", None));
    assert!(!imported("llama-bpe", Some(false)));
    assert!(imported("smollm", Some(true)));
}

/// `micro_llama` with the metadata `key` set to `ty` / `payload`, imported.
fn import_with(key: &str, ty: u32, payload: Vec<u8>) -> Result<(), String> {
    let mut d = micro_llama();
    let kv = d.kvs.iter_mut().find(|k| k.key == key).unwrap();
    kv.ty = ty;
    kv.payload = payload;
    let buf = d.bytes();
    let g = Gguf::parse(&buf, PATH).map_err(|e| e.to_string())?;
    let dir = tempfile::tempdir().unwrap();
    import_to_dir(&g, &buf, dir.path(), None).map_err(|e| e.to_string())
}

#[test]
fn non_finite_float_metadata_is_refused_naming_the_key() {
    for key in [
        "llama.rope.freq_base",
        "llama.attention.layer_norm_rms_epsilon",
    ] {
        for v in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -f32::NAN] {
            let e = import_with(key, 6, v.to_le_bytes().to_vec()).unwrap_err();
            assert!(e.contains(key) && e.contains("finite"), "{key} = {v}: {e}");
        }
    }
    // out-of-range finite values are refused by the config's own checks
    let e = import_with("llama.rope.freq_base", 6, 0.5f32.to_le_bytes().to_vec()).unwrap_err();
    assert!(e.contains("rope_theta"), "{e}");
}

#[test]
fn special_token_ids_outside_the_vocabulary_are_refused_naming_the_key() {
    // the micro vocabulary has 8 tokens
    for key in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.bos_token_id"] {
        for id in [8u32, 9, 1000, 1_000_000_000, u32::MAX] {
            let e = import_with(key, 4, id.to_le_bytes().to_vec()).unwrap_err();
            assert!(
                e.contains(key) && e.contains(&id.to_string()),
                "{key} = {id}: {e}"
            );
        }
        // and a value that is no unsigned integer is refused, not skipped
        let e = import_with(key, 6, 3.5f32.to_le_bytes().to_vec()).unwrap_err();
        assert!(e.contains(key), "{e}");
    }
    import_with(
        "tokenizer.ggml.eos_token_id",
        4,
        7u32.to_le_bytes().to_vec(),
    )
    .unwrap();
}

/// A GGUF whose weights changed after the store imported it (a NaN, an
/// infinity, an absurd value) is refused when its tensors are read for the
/// quantised path, naming the tensor; the clean file reads.
#[test]
fn weights_changed_after_import_are_checked_when_read() {
    use checkpoint::gguf::GgmlType;
    use checkpoint::quantized::keep_blocks;
    // the micro rows are too short for blocks: its float tensors stand in
    // (the check decodes every kept type alike)
    let keep = [GgmlType::F32, GgmlType::F16, GgmlType::BF16];
    let dir = tempfile::tempdir().unwrap();
    let clean = micro_llama().bytes();
    let g = Gguf::parse(&clean, PATH).unwrap();
    import_to_dir(&g, &clean, dir.path(), None).unwrap();
    let cfg = checkpoint::loader::load_config(dir.path()).unwrap().config;
    let path = dir.path().join("model.gguf");
    std::fs::write(&path, &clean).unwrap();
    let weights = checkpoint::loader::load_weights(dir.path(), &cfg).unwrap();
    let kept = keep_blocks(&path, &cfg, &mut weights.clone(), &keep).unwrap();
    assert!(kept > 0);
    for (name, value) in [
        ("blk.0.attn_q.weight", f32::NAN),
        ("blk.0.attn_output.weight", 1e7),
        ("blk.0.attn_k.weight", f32::INFINITY),
        ("blk.0.attn_k.weight", -30000.0),
        ("blk.0.attn_v.weight", 2e4),
    ] {
        let mut d = micro_llama();
        let t = d.tensors.iter_mut().find(|t| t.name == name).unwrap();
        let bytes = match t.ty {
            0 => value.to_le_bytes().to_vec(),
            1 => half::f16::from_f32(value).to_le_bytes().to_vec(),
            _ => half::bf16::from_f32(value).to_le_bytes().to_vec(),
        };
        t.data[..bytes.len()].copy_from_slice(&bytes);
        std::fs::write(&path, d.bytes()).unwrap();
        let e = keep_blocks(&path, &cfg, &mut weights.clone(), &keep)
            .unwrap_err()
            .to_string();
        assert!(e.contains(name) && e.contains("damaged"), "{name}: {e}");
    }
}
