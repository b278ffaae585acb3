//! GGUF tests: dequantisation of hand-made blocks for every supported type,
//! a hand-built file through the parser (all value types, arrays, alignment),
//! corruption errors, name mapping and the Q/K row un-permutation.

use super::import::unpermute_rows;

fn hf_name(name: &str) -> Option<String> {
    Arch::Llama.hf_name(name)
}
use super::*;
use half::{bf16, f16};

fn h(x: f32) -> [u8; 2] {
    f16::from_f32(x).to_le_bytes()
}

#[test]
fn dequant_q8_0_block() {
    let mut b = h(0.5).to_vec();
    let qs: Vec<i8> = (0..32).map(|i| i as i8 - 16).collect();
    b.extend(qs.iter().map(|&q| q as u8));
    let out = dequantize(GgmlType::Q8_0, &b, 32).unwrap();
    let want: Vec<f32> = qs.iter().map(|&q| 0.5 * f32::from(q)).collect();
    assert_eq!(out, want);
}

#[test]
fn dequant_q4_0_block() {
    let mut b = h(0.25).to_vec();
    // byte j: low nibble j, high nibble 15 - j
    b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
    let out = dequantize(GgmlType::Q4_0, &b, 32).unwrap();
    for j in 0..16 {
        assert_eq!(out[j], 0.25 * (j as f32 - 8.0), "low {j}");
        assert_eq!(out[j + 16], 0.25 * ((15 - j) as f32 - 8.0), "high {j}");
    }
}

#[test]
fn dequant_q4_1_two_blocks() {
    let mut b = Vec::new();
    for (d, m) in [(0.5f32, -1.0f32), (2.0, 3.0)] {
        b.extend(h(d));
        b.extend(h(m));
        b.extend((0..16u8).map(|j| (j % 16) | (((j + 3) % 16) << 4)));
    }
    let out = dequantize(GgmlType::Q4_1, &b, 64).unwrap();
    for (blk, (d, m)) in [(0.5f32, -1.0f32), (2.0, 3.0)].into_iter().enumerate() {
        for j in 0..16 {
            assert_eq!(out[blk * 32 + j], d * j as f32 + m);
            assert_eq!(out[blk * 32 + 16 + j], d * ((j + 3) % 16) as f32 + m);
        }
    }
}

#[test]
fn dequant_float_types() {
    let xs = [1.5f32, -2.25, 0.0, 65504.0];
    let f32b: Vec<u8> = xs.iter().flat_map(|x| x.to_le_bytes()).collect();
    assert_eq!(dequantize(GgmlType::F32, &f32b, 4).unwrap(), xs);
    let f16b: Vec<u8> = xs.iter().flat_map(|&x| h(x)).collect();
    assert_eq!(dequantize(GgmlType::F16, &f16b, 4).unwrap(), xs);
    let bf = [1.5f32, -2.25, 0.0, 3.0e38];
    let bfb: Vec<u8> = bf
        .iter()
        .flat_map(|&x| bf16::from_f32(x).to_le_bytes())
        .collect();
    let out = dequantize(GgmlType::BF16, &bfb, 4).unwrap();
    assert_eq!(&out[..3], &bf[..3]);
    assert!((out[3] / 3.0e38 - 1.0).abs() < 0.01);
}

#[test]
fn dequant_rejects_bad_sizes_and_types() {
    assert!(
        dequantize(GgmlType::Q8_0, &[0; 34], 31)
            .unwrap_err()
            .contains("whole number")
    );
    assert!(
        dequantize(GgmlType::Q4_1, &[0; 19], 32)
            .unwrap_err()
            .contains("need 20 bytes")
    );
    // an id ggml names is named; an unknown one by its number
    let err = dequantize(GgmlType::Other(16), &[0; 66], 256).unwrap_err();
    assert!(err.contains("IQ2_XXS") && err.contains("Q4_K"), "{err}");
    let err = dequantize(GgmlType::Other(99), &[0; 4], 1).unwrap_err();
    assert!(err.contains("type 99"), "{err}");
    assert_eq!(GgmlType::from_u32(12), GgmlType::Q4_K);
    assert_eq!(GgmlType::from_u32(14).name(), "Q6_K");
}

/// One Q4_K block by hand: scale/min pairs 0..3 in the low 6 bits, 4..7
/// split over the high bits (ggml's `get_scale_min_k4`).
#[test]
fn dequant_q4_k_block() {
    let mut b = Vec::new();
    b.extend(h(0.5)); // d
    b.extend(h(0.25)); // dmin
    // scales 1..4 and mins 5..8 for sub-blocks 0..3; sub-blocks 4..7: scale 2, min 3
    let mut sc = [0u8; 12];
    for j in 0..4 {
        sc[j] = (j + 1) as u8;
        sc[j + 4] = (j + 5) as u8;
        sc[j + 8] = 2 | (3 << 4);
    }
    b.extend(sc);
    // byte l of group g: low nibble l % 16, high nibble 15 - l % 16
    for _g in 0..4 {
        b.extend((0..32u8).map(|l| (l % 16) | ((15 - l % 16) << 4)));
    }
    let out = dequantize(GgmlType::Q4_K, &b, 256).unwrap();
    for g in 0..4 {
        let (s1, m1, s2, m2) = if g < 2 {
            (2 * g + 1, 2 * g + 5, 2 * g + 2, 2 * g + 6)
        } else {
            (2, 3, 2, 3)
        };
        for l in 0..32 {
            let lo = (l % 16) as f32;
            let hi = (15 - l % 16) as f32;
            assert_eq!(
                out[g * 64 + l],
                0.5 * s1 as f32 * lo - 0.25 * m1 as f32,
                "g{g} l{l}"
            );
            assert_eq!(
                out[g * 64 + 32 + l],
                0.5 * s2 as f32 * hi - 0.25 * m2 as f32
            );
        }
    }
}

/// A little GGUF writer for tests.
#[derive(Default)]
pub(super) struct Builder {
    kv: Vec<u8>,
    n_kv: u64,
}

pub(super) fn gstr(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

impl Builder {
    pub(super) fn kv(&mut self, key: &str, ty: u32, payload: &[u8]) -> &mut Self {
        gstr(&mut self.kv, key);
        self.kv.extend(ty.to_le_bytes());
        self.kv.extend(payload);
        self.n_kv += 1;
        self
    }

    /// Header + tensors (name, dims fastest-first, type, data), data aligned to `align`.
    pub(super) fn build(
        &self,
        version: u32,
        align: usize,
        tensors: &[(&str, Vec<u64>, u32, Vec<u8>)],
    ) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(version.to_le_bytes());
        out.extend((tensors.len() as u64).to_le_bytes());
        out.extend(self.n_kv.to_le_bytes());
        out.extend(&self.kv);
        let mut offset = 0u64;
        let mut offsets = Vec::new();
        for (name, dims, ty, data) in tensors {
            gstr(&mut out, name);
            out.extend((dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(ty.to_le_bytes());
            out.extend(offset.to_le_bytes());
            offsets.push(offset);
            offset = (offset + data.len() as u64).div_ceil(align as u64) * align as u64;
        }
        while !out.len().is_multiple_of(align) {
            out.push(0);
        }
        let start = out.len();
        for ((_, _, _, data), off) in tensors.iter().zip(offsets) {
            out.resize(start + off as usize, 0);
            out.extend(data);
        }
        out
    }
}

fn sample_file(align: usize) -> Vec<u8> {
    let mut b = Builder {
        kv: Vec::new(),
        n_kv: 0,
    };
    let mut arr = 8u32.to_le_bytes().to_vec(); // array of strings
    arr.extend(2u64.to_le_bytes());
    gstr(&mut arr, "a b");
    gstr(&mut arr, "Ġ t");
    let mut nested = 9u32.to_le_bytes().to_vec(); // array of arrays of i32
    nested.extend(1u64.to_le_bytes());
    nested.extend(5u32.to_le_bytes());
    nested.extend(2u64.to_le_bytes());
    nested.extend((-3i32).to_le_bytes());
    nested.extend(7i32.to_le_bytes());
    let mut s = Vec::new();
    gstr(&mut s, "llama");
    b.kv("general.architecture", 8, &s)
        .kv("u8", 0, &[200])
        .kv("i8", 1, &(-5i8).to_le_bytes())
        .kv("u16", 2, &600u16.to_le_bytes())
        .kv("i16", 3, &(-600i16).to_le_bytes())
        .kv("u32", 4, &70000u32.to_le_bytes())
        .kv("i32", 5, &(-70000i32).to_le_bytes())
        .kv("f32", 6, &1.5f32.to_le_bytes())
        .kv("bool", 7, &[1])
        .kv("u64", 10, &(1u64 << 40).to_le_bytes())
        .kv("i64", 11, &(-1i64 << 40).to_le_bytes())
        .kv("f64", 12, &0.125f64.to_le_bytes())
        .kv("merges", 9, &arr)
        .kv("nested", 9, &nested);
    if align != 32 {
        b.kv("general.alignment", 4, &(align as u32).to_le_bytes());
    }
    let f32data: Vec<u8> = (0..6).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let mut q8 = h(2.0).to_vec();
    q8.extend((0..32).map(|i| i as u8));
    b.build(
        3,
        align,
        &[
            ("a.weight", vec![3, 2], 0, f32data),
            ("b.weight", vec![32, 1], 8, q8),
        ],
    )
}

#[test]
fn parses_all_value_types_and_tensors() {
    for align in [32, 64] {
        let buf = sample_file(align);
        let g = Gguf::parse(&buf, "t.gguf").unwrap();
        assert_eq!((g.version, g.alignment), (3, align));
        let m = &g.metadata;
        assert_eq!(m["u8"], Value::U8(200));
        assert_eq!(m["i8"].as_i64(), Some(-5));
        assert_eq!(m["u16"].as_u64(), Some(600));
        assert_eq!(m["i16"], Value::I16(-600));
        assert_eq!(g.get_u64("u32").unwrap(), 70000);
        assert_eq!(m["i32"].as_i64(), Some(-70000));
        assert_eq!(g.get_f64("f32").unwrap(), 1.5);
        assert_eq!(m["bool"].as_bool(), Some(true));
        assert_eq!(m["u64"].as_u64(), Some(1 << 40));
        assert_eq!(m["i64"].as_i64(), Some(-1 << 40));
        assert_eq!(m["f64"].as_f64(), Some(0.125));
        assert_eq!(g.get_str("general.architecture").unwrap(), "llama");
        let merges: Vec<_> = m["merges"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert_eq!(merges, ["a b", "Ġ t"]);
        assert_eq!(
            m["nested"],
            Value::Array(vec![Value::Array(vec![Value::I32(-3), Value::I32(7)])])
        );
        assert!(
            g.get_u64("general.architecture")
                .unwrap_err()
                .to_string()
                .contains("general.architecture")
        );
        assert_eq!(g.data_start % align, 0);
        let a = g.tensor("a.weight").unwrap();
        assert_eq!((a.shape(), a.ty), (vec![2, 3], GgmlType::F32));
        assert_eq!(
            g.dequantize(&buf, a).unwrap(),
            [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
        );
        let b = g.tensor("b.weight").unwrap();
        assert_eq!(b.offset as usize % align, 0);
        let out = g.dequantize(&buf, b).unwrap();
        assert_eq!(out[31], 62.0);
    }
}

#[test]
fn corrupt_files_are_errors_not_panics() {
    let buf = sample_file(32);
    // every truncation point gives an error (header) or a tensor error (data)
    for cut in [0, 3, 7, 20, 60, 200, buf.len() - 40] {
        let short = &buf[..cut];
        match Gguf::parse(short, "t.gguf") {
            Err(e) => assert!(e.to_string().contains("t.gguf"), "{e}"),
            Ok(g) => {
                let t = g.tensor("b.weight").unwrap();
                let e = g.dequantize(short, t).unwrap_err().to_string();
                assert!(e.contains("b.weight") && e.contains("truncated"), "{e}");
            }
        }
    }
    let mut bad = buf.clone();
    bad[..4].copy_from_slice(b"GGUX");
    assert!(matches!(
        Gguf::parse(&bad, "t"),
        Err(GgufError::Magic { .. })
    ));
    let mut v1 = buf.clone();
    v1[4..8].copy_from_slice(&1u32.to_le_bytes());
    assert!(
        Gguf::parse(&v1, "t")
            .unwrap_err()
            .to_string()
            .contains("version 1")
    );
    let mut huge = buf;
    huge[16..24].copy_from_slice(&u64::MAX.to_le_bytes()); // kv count
    assert!(
        Gguf::parse(&huge, "t")
            .unwrap_err()
            .to_string()
            .contains("exceeds")
    );
}

#[test]
fn maps_llama_cpp_names() {
    assert_eq!(
        hf_name("token_embd.weight").unwrap(),
        "model.embed_tokens.weight"
    );
    assert_eq!(hf_name("output.weight").unwrap(), "lm_head.weight");
    assert_eq!(
        hf_name("blk.12.attn_k.weight").unwrap(),
        "model.layers.12.self_attn.k_proj.weight"
    );
    assert_eq!(
        hf_name("blk.0.ffn_norm.weight").unwrap(),
        "model.layers.0.post_attention_layernorm.weight"
    );
    assert_eq!(
        hf_name("blk.3.ffn_down.weight").unwrap(),
        "model.layers.3.mlp.down_proj.weight"
    );
    assert!(hf_name("rope_freqs.weight").is_none());
    assert!(hf_name("blk.x.attn_q.weight").is_none());
}

#[test]
fn unpermute_inverts_llama_cpp_permute() {
    // convert_hf_to_gguf: w.reshape(heads, 2, hd/2, cols).swapaxes(1, 2)
    let (heads, hd, cols) = (3, 8, 5);
    let rows = heads * hd;
    let hf: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
    let mut gguf = vec![0f32; hf.len()];
    for h in 0..heads {
        for j in 0..2 {
            for i in 0..hd / 2 {
                let src = h * hd + j * hd / 2 + i;
                let dst = h * hd + 2 * i + j;
                gguf[dst * cols..(dst + 1) * cols]
                    .copy_from_slice(&hf[src * cols..(src + 1) * cols]);
            }
        }
    }
    assert_ne!(gguf, hf);
    assert_eq!(unpermute_rows(&gguf, rows, cols, heads).unwrap(), hf);
    assert!(unpermute_rows(&gguf, rows, cols, 5).is_err());
}

#[test]
fn tensors_whose_data_overlap_are_refused_naming_both() {
    let mut buf = sample_file(32);
    // b.weight's offset field: after its name, n_dims, two dims and type
    let at = buf
        .windows(8)
        .position(|w| w == b"b.weight")
        .expect("b.weight's name")
        + 8
        + 4
        + 16
        + 4;
    buf[at..at + 8].copy_from_slice(&8u64.to_le_bytes()); // inside a.weight's 24 bytes
    let e = Gguf::parse(&buf, "t.gguf").unwrap_err().to_string();
    assert!(
        e.contains("t.gguf")
            && e.contains("a.weight")
            && e.contains("b.weight")
            && e.contains("overlap"),
        "{e}"
    );
}

/// Gemma 3's tensors as llama.cpp names them: `ffn_norm` is the pre-MLP
/// norm (Llama's `post_attention_layernorm` is Gemma's attention output
/// norm), the QK-norms and output norms map, norm gains carry the
/// converter's `+ 1`, and Q/K rows are not permuted.
#[test]
fn maps_gemma3_names_and_shifts() {
    let g = Arch::Gemma3;
    for (gguf, hf) in [
        (
            "blk.2.ffn_norm.weight",
            "model.layers.2.pre_feedforward_layernorm.weight",
        ),
        (
            "blk.2.post_attention_norm.weight",
            "model.layers.2.post_attention_layernorm.weight",
        ),
        (
            "blk.2.post_ffw_norm.weight",
            "model.layers.2.post_feedforward_layernorm.weight",
        ),
        (
            "blk.0.attn_q_norm.weight",
            "model.layers.0.self_attn.q_norm.weight",
        ),
        (
            "blk.0.attn_k_norm.weight",
            "model.layers.0.self_attn.k_norm.weight",
        ),
        (
            "blk.0.attn_norm.weight",
            "model.layers.0.input_layernorm.weight",
        ),
        ("token_embd.weight", "model.embed_tokens.weight"),
    ] {
        assert_eq!(g.hf_name(gguf).as_deref(), Some(hf), "{gguf}");
    }
    assert_eq!(
        Arch::Llama.hf_name("blk.2.ffn_norm.weight").as_deref(),
        Some("model.layers.2.post_attention_layernorm.weight")
    );
    assert!(Arch::Llama.hf_name("blk.0.post_ffw_norm.weight").is_none());
    assert_eq!(g.value_shift("output_norm.weight"), 1.0);
    assert_eq!(g.value_shift("blk.0.attn_k_norm.weight"), 1.0);
    assert_eq!(g.value_shift("blk.0.attn_q.weight"), 0.0);
    assert_eq!(Arch::Llama.value_shift("output_norm.weight"), 0.0);
    assert!(Arch::Llama.permutes_qk() && !g.permutes_qk());
}
