//! Every GGUF tensor type lamina dequantises, checked against the reference:
//! `tests/python/gguf_types.py` writes one GGUF tensor per type with the
//! `gguf` Python package (pinned and installed by `cargo xtask test`) from
//! synthetic weights, and that package's `gguf.quants.dequantize` of each;
//! our dequantisation must equal it exactly (both follow ggml's f32 order of
//! operations). A type we do not dequantise is refused with an error naming
//! the tensor and the type.
//!
//! Needs `python3` with `gguf` importable (`cargo xtask test` installs it
//! into `.cache/pydeps` and puts that on `PYTHONPATH`).

use checkpoint::gguf::{GgmlType, Gguf};
use checkpoint::synth::splitmix64;
use std::path::Path;
use std::process::Command;

const ROWS: usize = 8;
/// A multiple of 256, the K types' super-block.
const COLS: usize = 512;
const TYPES: [&str; 13] = [
    "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
    "Q6_K",
];

/// Synthetic weights ~U(-0.5, 0.5) with a few large outliers, row-major.
fn weights() -> Vec<f32> {
    (0..ROWS * COLS)
        .map(|i| {
            let u = (splitmix64(0x9e37 ^ i as u64) >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            if i % 97 == 0 { u * 8.0 } else { u }
        })
        .collect()
}

fn read_f32(path: &Path) -> Vec<f32> {
    std::fs::read(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn gguf_py(args: &[&std::ffi::OsStr]) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/python/gguf_types.py");
    let out = Command::new("python3")
        .arg(&script)
        .args(args)
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "{} failed ({}): {}\n(needs the `gguf` Python package: run `cargo xtask test`, which installs it into .cache/pydeps)",
        script.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

fn write_with_gguf_py(dir: &Path) {
    let w = dir.join("w.f32");
    let bytes: Vec<u8> = weights().iter().flat_map(|x| x.to_le_bytes()).collect();
    std::fs::write(&w, bytes).unwrap();
    let (rows, cols) = (ROWS.to_string(), COLS.to_string());
    gguf_py(&[w.as_os_str(), rows.as_ref(), cols.as_ref(), dir.as_os_str()]);
}

#[test]
fn every_type_matches_the_gguf_package() {
    let dir = tempfile::TempDir::new().unwrap();
    write_with_gguf_py(dir.path());
    let buf = std::fs::read(dir.path().join("types.gguf")).unwrap();
    let g = Gguf::parse(&buf, "types.gguf").unwrap();
    assert_eq!(g.tensors.len(), TYPES.len());
    let w = weights();
    for name in TYPES {
        let t = g.tensor(&format!("w.{name}")).unwrap();
        assert_eq!(t.ty.name(), name, "{name}: type read back");
        assert!(!matches!(t.ty, GgmlType::Other(_)), "{name} is supported");
        assert_eq!(t.dims, [COLS as u64, ROWS as u64], "{name}: dims");
        let ours = g.dequantize(&buf, t).unwrap();
        let reference = read_f32(&dir.path().join(format!("{name}.f32")));
        assert_eq!(ours.len(), reference.len(), "{name}");
        for (i, (a, b)) in ours.iter().zip(&reference).enumerate() {
            assert!(
                a.to_bits() == b.to_bits(),
                "{name}: element {i}: ours {a}, gguf.quants.dequantize {b}"
            );
        }
        // the ones quantised from the weights are close to them (the K types
        // carry random bits, so only their finiteness says anything)
        assert!(ours.iter().all(|x| x.is_finite()), "{name}: finite");
        if !name.ends_with("_K") {
            let err = ours
                .iter()
                .zip(&w)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(err < 0.6, "{name}: max error {err} against the weights");
        }
    }
}

#[test]
fn unsupported_types_name_tensor_and_type() {
    let dir = tempfile::TempDir::new().unwrap();
    write_with_gguf_py(dir.path());
    let buf = std::fs::read(dir.path().join("unsupported.gguf")).unwrap();
    let g = Gguf::parse(&buf, "unsupported.gguf").unwrap();
    let t = g.tensor("w.unsupported").unwrap();
    let err = g.dequantize(&buf, t).unwrap_err().to_string();
    assert!(
        err.contains("w.unsupported") && err.contains("TQ2_0") && err.contains("Q4_K"),
        "{err}"
    );
}

#[test]
fn a_llama_of_every_type_imports_and_matches() {
    let dir = tempfile::TempDir::new().unwrap();
    gguf_py(&["model".as_ref(), dir.path().as_os_str()]);
    let store = checkpoint::store::Store::new(dir.path().join("store"));
    let (id, model) = store.import_gguf(&dir.path().join("llama.gguf")).unwrap();
    assert_eq!(id, "llama");
    let m = checkpoint::loader::load_config(&model).unwrap();
    assert_eq!((m.config.hidden_size, m.config.num_layers), (256, 2));
    let w = checkpoint::loader::load_weights(&model, &m.config).unwrap();
    let projections = w.projections();
    let dense = projections.iter().map(|p| p.dense().unwrap());
    let tensors: Vec<checkpoint::Tensor> = (w.tensors().into_iter().cloned())
        .chain(dense.map(|t| t.into_owned()))
        .collect();
    assert_eq!(tensors.len(), 2 + 1 + 2 * 9);
    for t in &tensors {
        let reference = read_f32(&dir.path().join("ref").join(format!("{}.f32", t.name)));
        assert_eq!(reference.len(), t.numel(), "{}", t.name);
        for (i, (got, want)) in t.data.iter().zip(&reference).enumerate() {
            assert_eq!(
                got.to_bits(),
                half::bf16::from_f32(*want).to_bits(),
                "{} element {i}: {got} vs bf16({want})",
                t.name
            );
        }
    }
    let listed = store.list().unwrap();
    assert!(
        listed[0].source.contains("Q4_K") && listed[0].source.contains("Q2_K"),
        "{}",
        listed[0].source
    );
}
