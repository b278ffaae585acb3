//! The projection type: each format's shape, bytes and values against the
//! format's own decoder, the checks, and the refusal naming the tensor.

use super::*;
use crate::synth::splitmix64;

/// `[n, k]` BF16 values in `[-0.5, 0.5)` from `seed`.
fn tensor(name: &str, n: usize, k: usize, seed: u64) -> Tensor {
    let data = (0..(n * k) as u64)
        .map(|i| bf16::from_f32((splitmix64(i ^ seed) >> 40) as f32 / (1u64 << 24) as f32 - 0.5))
        .collect();
    Tensor {
        name: name.into(),
        shape: vec![n, k],
        data,
    }
}

/// Q8_0 blocks of `rows` rows of 32 weights: scale `d`, values `i - 16`.
fn q8_0(rows: usize, d: f32) -> QuantTensor {
    let mut data = Vec::new();
    for _ in 0..rows {
        data.extend(half::f16::from_f32(d).to_le_bytes());
        data.extend((0..32).map(|i| (i as i8 - 16) as u8));
    }
    QuantTensor {
        name: "model.layers.0.mlp.up_proj.weight".into(),
        rows,
        cols: 32,
        ty: GgmlType::Q8_0,
        data,
    }
}

#[test]
fn bf16_is_borrowed_as_it_is() {
    let t = tensor("w", 3, 8, 1);
    let p = Projection::Bf16(t.clone());
    assert_eq!(p.shape(), [3, 8]);
    assert_eq!(
        (p.format(), p.format().to_string()),
        (Format::Bf16, "bf16".into())
    );
    assert_eq!(p.bytes(), 48);
    assert!(matches!(p.dense().unwrap(), Cow::Borrowed(d) if *d == t));
    assert_eq!(p.to_f32_rows().unwrap(), t.to_f32());
}

/// FP8's dense values are the old dequantiser's (`Fp8Tensor::dequantize`,
/// `bf16(decode(q) * scale)`), its exact values `decode(q) * scale`.
#[test]
fn fp8_dense_is_the_dequantised_bf16() {
    let t = tensor("model.layers.0.self_attn.q_proj.weight", 4, 16, 2);
    let f = Fp8Tensor::quantize(&t);
    let p = Projection::Fp8(f.clone());
    assert_eq!(p.shape(), [4, 16]);
    assert_eq!(p.format().to_string(), "fp8");
    assert_eq!(p.bytes(), 4 * 16 + 4 * 4);
    assert_eq!(*p.dense().unwrap(), f.dequantize());
    let exact = ops::fp8::dequantize_rows(&f.data, &f.scale, 16);
    assert_eq!(p.to_f32_rows().unwrap(), exact);
    // rounding to e4m3 moved the values, a little
    let moved = t.to_f32().iter().zip(&exact).any(|(a, b)| a != b);
    let close = t
        .to_f32()
        .iter()
        .zip(&exact)
        .all(|(a, b)| (a - b).abs() < 0.05);
    assert!(moved && close);
}

/// Blocks decode through the GGUF reader's dequantiser; dense rounds
/// those values to BF16.
#[test]
fn blocks_dense_is_the_gguf_dequantiser_rounded_to_bf16() {
    let q = q8_0(3, 0.25);
    let p = Projection::Blocks(q.clone());
    assert_eq!(p.shape(), [3, 32]);
    assert_eq!(p.format().to_string(), "q8_0");
    assert_eq!(p.bytes(), 3 * 34);
    let want = crate::gguf::dequantize(GgmlType::Q8_0, &q.data, 96).unwrap();
    assert_eq!(p.to_f32_rows().unwrap(), want);
    let dense = p.dense().unwrap();
    assert_eq!(dense.shape, vec![3, 32]);
    assert_eq!(dense.name, q.name);
    let widened: Vec<f32> = want.iter().map(|&x| bf16::from_f32(x).to_f32()).collect();
    assert_eq!(dense.to_f32(), widened);
}

#[test]
fn checks_name_the_tensor_and_its_format() {
    let p = Projection::Bf16(tensor("w", 3, 8, 1));
    assert!(p.check([3, 8]).is_ok());
    let e = p.check([8, 3]).unwrap_err().to_string();
    assert!(
        e.contains("`w`") && e.contains("bf16") && e.contains("[8, 3]"),
        "{e}"
    );
    let mut short = q8_0(2, 0.1);
    short.data.pop();
    let e = Projection::Blocks(short).check([2, 32]).unwrap_err();
    assert_eq!(e.format, Format::Ggml(GgmlType::Q8_0));
    let mut f = Fp8Tensor::quantize(&tensor("f", 2, 4, 3));
    f.scale.pop();
    assert!(Projection::Fp8(f).check([2, 4]).is_err());
    let e = Projection::Blocks(q8_0(1, 0.1)).refuse("the CUDA backend");
    let msg = e.to_string();
    assert!(
        msg.contains("model.layers.0.mlp.up_proj.weight")
            && msg.contains("q8_0")
            && msg.contains("the CUDA backend"),
        "{msg}"
    );
}

#[test]
fn implausible_weights_are_found_in_every_format() {
    let mut t = tensor("w", 2, 32, 4);
    assert_eq!(Projection::Bf16(t.clone()).first_implausible(), None);
    t.data[37] = bf16::NAN;
    let (i, v) = Projection::Bf16(t).first_implausible().unwrap();
    assert!(i == 37 && v.is_nan());
    let mut f = Fp8Tensor::quantize(&tensor("f", 2, 32, 5));
    assert_eq!(Projection::Fp8(f.clone()).first_implausible(), None);
    f.data[40] = 0x7f; // e4m3's NaN
    assert_eq!(
        Projection::Fp8(f).first_implausible().map(|(i, _)| i),
        Some(40)
    );
    assert_eq!(Projection::Blocks(q8_0(2, 0.1)).first_implausible(), None);
    // a scale of 1000 puts weight 0 of row 1 at -16000
    let mut q = q8_0(2, 0.1);
    q.data[34..36].copy_from_slice(&half::f16::from_f32(1000.0).to_le_bytes());
    assert_eq!(
        Projection::Blocks(q).first_implausible(),
        Some((32, -16000.0))
    );
}
