//! The three hub layouts, written here by encoders of their own (from the
//! layouts' documented packing, not through the reader), load into the
//! values their codes mean; bad fields and tensors are refused by name.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use safetensors::{Dtype, SafeTensors};
use serde_json::{Value, json};
use tempfile::TempDir;

use super::write::write_int4_checkpoint;
use super::*;
use crate::fp8::convert::{Entry, save};
use crate::loader::{LoadError, load_config, load_weights};
use crate::projection::Projection;
use crate::synth::{Preset, synth_model};
use crate::weights::ModelWeights;

/// The tiny preset's widths (64, 160) are whole groups of 32.
const G: usize = 32;

/// One projection's codes in input order, as a layout means them.
struct Codes {
    n: usize,
    k: usize,
    q: Vec<u8>,      // [n, k]
    z: Vec<u8>,      // [n, k / G]
    s: Vec<f32>,     // [n, k / G]
    g_idx: Vec<u32>, // [k] each input column's group
}

/// A counter hash (splitmix64) of `(seed, i)`.
fn hash(seed: u64, i: usize) -> u64 {
    let mut x = seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

impl Codes {
    /// Deterministic codes of `[n, k]`: zeros 8 when `sym`, else in
    /// `1..=15`; groups `i / G`,
    /// or with `shuffled` the groups of a permutation of the columns.
    fn new(n: usize, k: usize, seed: u64, sym: bool, shuffled: bool) -> Codes {
        let groups = k / G;
        let q = (0..n * k).map(|i| (hash(seed, i) % 16) as u8).collect();
        let z = (0..n * groups)
            // 1..=15: GPTQ v1 stores zero - 1
            .map(|i| {
                if sym {
                    8
                } else {
                    (1 + hash(seed + 1, i) % 15) as u8
                }
            })
            .collect();
        // scales exact in F16 and BF16 alike
        let s = (0..n * groups)
            .map(|i| (1 + hash(seed + 2, i) % 8) as f32 / 1024.0)
            .collect();
        // 7 is prime to both widths: i -> 7i mod k is a permutation
        let g_idx = (0..k)
            .map(|i| (if shuffled { i * 7 % k } else { i } / G) as u32)
            .collect();
        Codes {
            n,
            k,
            q,
            z,
            s,
            g_idx,
        }
    }

    /// The weights the codes mean, `[n, k]` input order.
    fn dense(&self) -> Vec<f32> {
        let groups = self.k / G;
        let mut w = vec![0f32; self.n * self.k];
        for o in 0..self.n {
            for i in 0..self.k {
                let at = o * groups + self.g_idx[i] as usize;
                w[o * self.k + i] =
                    (self.q[o * self.k + i] as f32 - self.z[at] as f32) * self.s[at];
            }
        }
        w
    }
}

/// Eight 4-bit values into one word, value `i` at bits `4i`.
fn word(v: impl Iterator<Item = u8>) -> u32 {
    v.enumerate()
        .fold(0, |w, (i, x)| w | u32::from(x) << (4 * i))
}

fn i32s(words: Vec<u32>, shape: Vec<usize>) -> Entry {
    (
        Dtype::I32,
        shape,
        words.into_iter().flat_map(u32::to_le_bytes).collect(),
    )
}

fn f16s(v: Vec<f32>, shape: Vec<usize>) -> Entry {
    let b = v
        .into_iter()
        .flat_map(|x| f16::from_f32(x).to_bits().to_le_bytes());
    (Dtype::F16, shape, b.collect())
}

/// AutoAWQ's GEMM tensors: columns interleaved 0, 2, 4, 6, 1, 3, 5, 7 in
/// each word (nibble `i` holds column `ORDER[i]`).
fn awq(c: &Codes) -> Vec<(&'static str, Entry)> {
    const ORDER: [usize; 8] = [0, 2, 4, 6, 1, 3, 5, 7];
    let (n, k, ng) = (c.n, c.k, c.k / G);
    let qweight = (0..k)
        .flat_map(|i| (0..n / 8).map(move |j| (i, j)))
        .map(|(i, j)| word(ORDER.iter().map(|&o| c.q[(8 * j + o) * k + i])))
        .collect();
    let qzeros = (0..ng)
        .flat_map(|g| (0..n / 8).map(move |j| (g, j)))
        .map(|(g, j)| word(ORDER.iter().map(|&o| c.z[(8 * j + o) * ng + g])))
        .collect();
    let scales = (0..ng)
        .flat_map(|g| (0..n).map(move |o| c.s[o * ng + g]))
        .collect();
    vec![
        ("qweight", i32s(qweight, vec![k, n / 8])),
        ("qzeros", i32s(qzeros, vec![ng, n / 8])),
        ("scales", f16s(scales, vec![ng, n])),
    ]
}

/// GPTQ's tensors: codes packed along the input, zeros along the output
/// (stored minus 1 in v1).
fn gptq(c: &Codes, v1: bool) -> Vec<(&'static str, Entry)> {
    let (n, k, ng) = (c.n, c.k, c.k / G);
    let qweight = (0..k / 8)
        .flat_map(|j| (0..n).map(move |o| (j, o)))
        .map(|(j, o)| word((0..8).map(|i| c.q[o * k + 8 * j + i])))
        .collect();
    let qzeros = (0..ng)
        .flat_map(|g| (0..n / 8).map(move |j| (g, j)))
        .map(|(g, j)| {
            word((0..8).map(|i| c.z[(8 * j + i) * ng + g].wrapping_sub(u8::from(v1)) & 0xF))
        })
        .collect();
    let scales = (0..ng)
        .flat_map(|g| (0..n).map(move |o| c.s[o * ng + g]))
        .collect();
    vec![
        ("qweight", i32s(qweight, vec![k / 8, n])),
        ("qzeros", i32s(qzeros, vec![ng, n / 8])),
        ("scales", f16s(scales, vec![ng, n])),
        ("g_idx", i32s(c.g_idx.clone(), vec![k])),
    ]
}

/// compressed-tensors' `pack-quantized`: codes along the input (signed + 8),
/// BF16 scales, zeros (asymmetric) packed along the output rows.
fn pack_quantized(c: &Codes, sym: bool) -> Vec<(&'static str, Entry)> {
    let (n, k, ng) = (c.n, c.k, c.k / G);
    let packed = (0..n)
        .flat_map(|o| (0..k / 8).map(move |j| (o, j)))
        .map(|(o, j)| word((0..8).map(|i| c.q[o * k + 8 * j + i])))
        .collect();
    let scale =
        c.s.iter()
            .flat_map(|x| bf16::from_f32(*x).to_bits().to_le_bytes());
    let shape = [n as i64, k as i64].into_iter().flat_map(i64::to_le_bytes);
    let mut out = vec![
        ("weight_packed", i32s(packed, vec![n, k / 8])),
        ("weight_scale", (Dtype::BF16, vec![n, ng], scale.collect())),
        ("weight_shape", (Dtype::I64, vec![2], shape.collect())),
    ];
    if !sym {
        let zp = (0..n.div_ceil(8))
            .flat_map(|j| (0..ng).map(move |g| (j, g)))
            .map(|(j, g)| word((0..8).map(|i| c.z[(8 * j + i) * ng + g])))
            .collect();
        out.push(("weight_zero_point", i32s(zp, vec![n.div_ceil(8), ng])));
    }
    out
}

/// Which layout a test checkpoint has.
#[derive(Clone, Copy)]
enum Layout {
    Awq,
    Gptq { v1: bool, desc_act: bool, sym: bool },
    Ct { sym: bool },
}

impl Layout {
    fn config(self) -> Value {
        match self {
            Layout::Awq => json!({
                "quant_method": "awq", "bits": 4, "group_size": G, "version": "gemm",
                "zero_point": true
            }),
            Layout::Gptq { v1, desc_act, sym } => json!({
                "quant_method": "gptq", "bits": 4, "group_size": G, "desc_act": desc_act,
                "sym": sym, "checkpoint_format": if v1 { "gptq" } else { "gptq_v2" }
            }),
            Layout::Ct { sym } => json!({
                "quant_method": "compressed-tensors", "format": "pack-quantized",
                "config_groups": {"group_0": {
                    "targets": ["Linear"], "input_activations": null,
                    "weights": {"num_bits": 4, "type": "int", "symmetric": sym,
                                "strategy": "group", "group_size": G, "dynamic": false}
                }},
                "ignore": ["lm_head"]
            }),
        }
    }

    fn codes(self, n: usize, k: usize, seed: u64) -> Codes {
        match self {
            Layout::Awq => Codes::new(n, k, seed, false, false),
            Layout::Gptq { desc_act, sym, .. } => Codes::new(n, k, seed, sym, desc_act),
            Layout::Ct { sym } => Codes::new(n, k, seed, sym, false),
        }
    }

    fn tensors(self, c: &Codes) -> Vec<(&'static str, Entry)> {
        match self {
            Layout::Awq => awq(c),
            Layout::Gptq { v1, .. } => gptq(c, v1),
            Layout::Ct { sym } => pack_quantized(c, sym),
        }
    }
}

/// The tiny model (seed 3) in `layout`, with the weights each projection's
/// codes mean (by name).
fn checkpoint(layout: Layout) -> (TempDir, PathBuf, HashMap<String, Vec<f32>>) {
    let d = TempDir::new().unwrap();
    let dir = d.path().join("int4");
    synth_model(Preset::Tiny, 3, &dir).unwrap();
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut all: HashMap<String, Entry> = HashMap::new();
    let mut want = HashMap::new();
    for (seed, (name, v)) in st.tensors().into_iter().enumerate() {
        let is_proj = name.contains("_proj.weight");
        if !is_proj {
            all.insert(name, (v.dtype(), v.shape().to_vec(), v.data().to_vec()));
            continue;
        }
        let (n, k) = (v.shape()[0], v.shape()[1]);
        let c = layout.codes(n, k, seed as u64 * 10);
        let prefix = name.strip_suffix(".weight").unwrap();
        for (suffix, e) in layout.tensors(&c) {
            all.insert(format!("{prefix}.{suffix}"), e);
        }
        want.insert(name, c.dense());
    }
    save(&all, &dir).unwrap();
    reconfigure(&dir, |q| *q = layout.config());
    (d, dir, want)
}

fn reconfigure(dir: &Path, edit: impl FnOnce(&mut Value)) {
    let path = dir.join("config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut v["quantization_config"]);
    std::fs::write(&path, v.to_string()).unwrap();
}

/// Rewrites `dir`'s weights through `edit`.
fn rewrite(dir: &Path, edit: impl FnOnce(&mut HashMap<String, Entry>)) {
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut all: HashMap<String, Entry> = (st.tensors().into_iter())
        .map(|(n, v)| (n, (v.dtype(), v.shape().to_vec(), v.data().to_vec())))
        .collect();
    drop(st);
    edit(&mut all);
    save(&all, dir).unwrap();
}

fn load(dir: &Path) -> Result<ModelWeights, LoadError> {
    load_weights(dir, &load_config(dir)?.config)
}

fn int4_of(p: &Projection) -> &Int4Tensor {
    match p {
        Projection::Int4(t) => t,
        other => panic!("`{}` is {}, not int4", other.name(), other.format()),
    }
}

#[test]
fn nibble_blocks_hold_code_j_low_and_j_plus_16_high() {
    let codes: Vec<u8> = (0..64).map(|i| (i % 16) as u8).collect();
    let mut out = Vec::new();
    pack_row(&codes, &mut out);
    // byte 0: code 0 low, code 16 (= 0) high; byte 1: 1 and 1; block 2's byte 0: 32 and 48
    assert_eq!(out.len(), 32);
    assert_eq!(&out[..3], &[0x00, 0x11, 0x22]);
    assert_eq!(nibble_at(17), (1, true));
    assert_eq!(nibble_at(33), (17, false));
    let t = Int4Tensor::from_codes("w", 1, 64, 32, &codes, vec![0.5, 2.0], vec![8, 0]);
    assert_eq!(t.to_f32_rows()[..3], [-4.0, -3.5, -3.0]);
    assert_eq!(t.to_f32_rows()[33], 2.0);
}

#[test]
fn every_layout_loads_the_values_its_codes_mean() {
    let layouts = [
        Layout::Awq,
        Layout::Gptq {
            v1: true,
            desc_act: false,
            sym: true,
        },
        Layout::Gptq {
            v1: true,
            desc_act: true,
            sym: true,
        },
        Layout::Gptq {
            v1: false,
            desc_act: true,
            sym: false,
        },
        Layout::Ct { sym: true },
        Layout::Ct { sym: false },
    ];
    for layout in layouts {
        let (_d, dir, want) = checkpoint(layout);
        let w = load(&dir).unwrap();
        let mut seen = 0;
        for p in w.projections() {
            let Some(values) = want.get(p.name()) else {
                assert!(p.as_bf16().is_some(), "`{}` stays BF16", p.name());
                continue;
            };
            let t = int4_of(p);
            assert_eq!(t.layout_error(), None);
            let shuffled = matches!(layout, Layout::Gptq { desc_act: true, .. });
            assert_eq!(t.perm.is_some(), shuffled, "`{}`", p.name());
            assert_eq!(&p.to_f32_rows().unwrap(), values, "`{}`", p.name());
            seen += 1;
        }
        assert_eq!(seen, 21, "every layer projection is int4");
    }
}

/// Loads `layout` after `edit` and expects a refusal naming each needle.
fn refused(layout: Layout, edit: impl FnOnce(&Path), needles: &[&str]) {
    let (_d, dir, _) = checkpoint(layout);
    edit(&dir);
    let err = load(&dir).expect_err("must be refused").to_string();
    for n in needles {
        assert!(err.contains(n), "`{err}` should name `{n}`");
    }
}

const Q: &str = "model.layers.1.self_attn.q_proj";
const GPTQ: Layout = Layout::Gptq {
    v1: true,
    desc_act: false,
    sym: true,
};

#[test]
fn other_schemes_are_refused_naming_the_field() {
    let set = |f: &'static str, v: Value| move |d: &Path| reconfigure(d, |q| q[f] = v);
    refused(
        Layout::Awq,
        set("bits", json!(8)),
        &["quantization_config.bits", "8"],
    );
    refused(
        Layout::Awq,
        set("version", json!("gemv")),
        &["version", "gemv"],
    );
    refused(
        Layout::Awq,
        set("zero_point", json!(false)),
        &["zero_point"],
    );
    refused(
        GPTQ,
        set("checkpoint_format", json!("marlin")),
        &["checkpoint_format", "marlin"],
    );
    refused(
        GPTQ,
        set("group_size", json!(48)),
        &["group_size", "48", "config.json"],
    );
    refused(GPTQ, set("group_size", json!(0)), &["group_size"]);
    let ct_bits = |d: &Path| {
        reconfigure(d, |q| {
            q["config_groups"]["group_0"]["weights"]["num_bits"] = json!(8)
        })
    };
    refused(
        Layout::Ct { sym: true },
        ct_bits,
        &["config_groups.group_0.weights.num_bits"],
    );
    let ct_acts = |d: &Path| {
        reconfigure(d, |q| {
            q["config_groups"]["group_0"]["input_activations"] = json!({"num_bits": 8})
        })
    };
    refused(
        Layout::Ct { sym: true },
        ct_acts,
        &["input_activations", "W4A16"],
    );
}

#[test]
fn bad_tensors_are_refused_naming_the_file_and_tensor() {
    let edit = |f: fn(&mut HashMap<String, Entry>)| move |d: &Path| rewrite(d, f);
    // a shape off by a word
    refused(
        GPTQ,
        edit(|a| {
            let e = a.get_mut(&format!("{Q}.qweight")).unwrap();
            e.1[0] -= 1;
            e.2.truncate(e.2.len() - 4 * e.1[1]);
        }),
        &[&format!("{Q}.qweight"), "model.safetensors", "shape"],
    );
    // codes as I64
    refused(
        Layout::Awq,
        edit(|a| {
            let e = a.get_mut(&format!("{Q}.qzeros")).unwrap();
            e.0 = Dtype::U32;
        }),
        &[&format!("{Q}.qzeros"), "dtype"],
    );
    // a NaN scale
    refused(
        GPTQ,
        edit(|a| {
            let e = a.get_mut(&format!("{Q}.scales")).unwrap();
            e.2[2..4].copy_from_slice(&f16::NAN.to_bits().to_le_bytes());
        }),
        &[&format!("{Q}.scales"), "NaN", "finite"],
    );
    // v1 zeros of 15 mean 16: out of range
    refused(
        Layout::Gptq {
            v1: true,
            desc_act: false,
            sym: false,
        },
        edit(|a| {
            let e = a.get_mut(&format!("{Q}.qzeros")).unwrap();
            e.2[0] = 0x0F;
        }),
        &[&format!("{Q}.qzeros"), "zero point 16"],
    );
    // a symmetric checkpoint with another zero
    refused(
        GPTQ,
        edit(|a| {
            let e = a.get_mut(&format!("{Q}.qzeros")).unwrap();
            e.2[0] = 0x06;
        }),
        &[&format!("{Q}.weight"), "zero point 7"],
    );
    // a g_idx whose groups are uneven
    refused(
        Layout::Gptq {
            v1: true,
            desc_act: true,
            sym: true,
        },
        edit(|a| {
            let e = a.get_mut(&format!("{Q}.g_idx")).unwrap();
            e.2[..4].copy_from_slice(&1u32.to_le_bytes());
        }),
        &[&format!("{Q}.g_idx"), "columns"],
    );
    // a missing tensor
    refused(
        Layout::Ct { sym: false },
        edit(|a| {
            a.remove(&format!("{Q}.weight_zero_point"));
        }),
        &[&format!("{Q}.weight_zero_point"), "not found"],
    );
    refused(
        Layout::Ct { sym: true },
        edit(|a| {
            let e = a.get_mut(&format!("{Q}.weight_shape")).unwrap();
            e.2[..8].copy_from_slice(&7i64.to_le_bytes());
        }),
        &[&format!("{Q}.weight_shape"), "[7, 64]"],
    );
}

#[test]
fn a_truncated_file_is_refused_naming_the_tensor() {
    let (_d, dir, _) = checkpoint(GPTQ);
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 100]).unwrap();
    let err = load(&dir).expect_err("truncated").to_string();
    assert!(err.contains("truncated"), "{err}");
}

#[test]
fn gptq_zero_biases_are_dropped_and_others_refused() {
    let (_d, dir, _) = checkpoint(GPTQ);
    let bias = |v: f32| {
        move |a: &mut HashMap<String, Entry>| {
            let b = (0..64).flat_map(|_| f16::from_f32(v).to_bits().to_le_bytes());
            a.insert(format!("{Q}.bias"), (Dtype::F16, vec![64], b.collect()));
        }
    };
    rewrite(&dir, bias(0.0));
    load(&dir).unwrap();
    rewrite(&dir, bias(0.5));
    let err = load(&dir).expect_err("a real bias").to_string();
    assert!(err.contains(&format!("{Q}.bias")), "{err}");
}

#[test]
fn the_gptq_writer_round_trips_through_the_loader() {
    let d = TempDir::new().unwrap();
    let src = d.path().join("bf16");
    synth_model(Preset::Tiny, 5, &src).unwrap();
    let w = load(&src).unwrap();
    let out = d.path().join("int4");
    write_int4_checkpoint(&src, &w, &out, G).unwrap();
    let back = load(&out).unwrap();
    for (p, q) in w.projections().into_iter().zip(back.projections()) {
        if p.name() == "lm_head.weight" {
            assert_eq!(p, q, "the head stays BF16");
            continue;
        }
        let want = Int4Tensor::round_to_nearest(p.as_bf16().unwrap(), G, true);
        assert_eq!(int4_of(q), &want, "`{}`", p.name());
        // round to nearest: within half a step of the weights
        let (dense, src) = (q.to_f32_rows().unwrap(), p.to_f32_rows().unwrap());
        for (i, (a, b)) in dense.iter().zip(&src).enumerate() {
            let s = want.scale[i / want.cols * want.groups() + i % want.cols / G];
            assert!(
                (a - b).abs() <= s * 0.5 + 1e-6 || b.abs() >= 7.0 * s,
                "{a} vs {b}"
            );
        }
    }
    // written again from its own int4 projections: the same bytes
    let again = d.path().join("again");
    write_int4_checkpoint(&out, &back, &again, G).unwrap();
    let read = |p: &Path| std::fs::read(p.join("model.safetensors")).unwrap();
    assert_eq!(read(&out), read(&again));
    let err = write_int4_checkpoint(&src, &w, &d.path().join("bad"), 64).unwrap_err();
    assert!(err.to_string().contains("160 input columns"), "{err}");
}

#[test]
fn a_column_order_is_written_as_desc_act_and_read_back() {
    let d = TempDir::new().unwrap();
    let src = d.path().join("bf16");
    synth_model(Preset::Tiny, 5, &src).unwrap();
    let mut w = load(&src).unwrap();
    // layer 0's first projection, its input columns stored in another
    // order (GPTQ's act_order): stored column c is input column perm[c]
    let [p, ..] = w.layers[0].projections_mut();
    let t = Int4Tensor::round_to_nearest(p.as_bf16().unwrap(), G, true);
    let (n, k) = (t.rows, t.cols);
    let perm: Vec<u32> = (0..k as u32).map(|c| (c * 7 + 3) % k as u32).collect();
    let stored: Vec<u8> = (0..n)
        .flat_map(|r| {
            perm.iter()
                .map(|&c| t.code(r, c as usize))
                .collect::<Vec<_>>()
        })
        .collect();
    let base = Int4Tensor::from_codes(&t.name, n, k, G, &stored, t.scale.clone(), t.zero.clone());
    let q = Int4Tensor {
        perm: Some(perm),
        ..base
    };
    assert_eq!(q.layout_error(), None);
    let (name, want) = (q.name.clone(), q.to_f32_rows());
    *p = Projection::Int4(q);
    let out = d.path().join("int4");
    write_int4_checkpoint(&src, &w, &out, G).unwrap();
    let cfg: Value =
        serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(cfg["quantization_config"]["desc_act"], json!(true));
    let back = load(&out).unwrap();
    let got = (back.projections().into_iter())
        .find(|p| p.name() == name)
        .expect("the projection");
    assert!(
        int4_of(got).perm.is_some(),
        "`{name}` read without its order"
    );
    assert_eq!(got.to_f32_rows().unwrap(), want, "`{name}`");
    // the rest as without an order; written again: the same bytes
    let again = d.path().join("again");
    write_int4_checkpoint(&out, &back, &again, G).unwrap();
    let read = |p: &Path| std::fs::read(p.join("model.safetensors")).unwrap();
    assert_eq!(read(&out), read(&again));
}
