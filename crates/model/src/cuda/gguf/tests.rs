//! The device layout against the GGUF reader: on any machine, the packed
//! blocks of every format decoded as `cu/gemv_formats.cuh` reads them equal
//! `checkpoint::gguf::dequantize`; on a GPU (`#[ignore]`d), the widening
//! kernel and every GEMV variant (the fused QKV + RoPE + KV write too) of
//! every block format against the CPU reference on the dequantised weights.

use super::*;
use checkpoint::gguf::dequantize;
use checkpoint::synth::splitmix64;

/// Every block format with its ggml type.
pub(crate) const FORMATS: [(WeightFormat, GgmlType); 6] = [
    (WeightFormat::Q8_0, GgmlType::Q8_0),
    (WeightFormat::Q4_0, GgmlType::Q4_0),
    (WeightFormat::Q4_1, GgmlType::Q4_1),
    (WeightFormat::Q4K, GgmlType::Q4_K),
    (WeightFormat::Q5K, GgmlType::Q5_K),
    (WeightFormat::Q6K, GgmlType::Q6_K),
];

/// `rows` rows of `cols` random ggml blocks of `ty` whose f16 scales are
/// finite and small (the rest of each block random bits), as a tensor.
pub(crate) fn random_blocks(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> QuantTensor {
    let group = if matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K) {
        256
    } else {
        32
    };
    let bb = ty.byte_size(group).unwrap();
    let n = rows * cols / group;
    let mut data: Vec<u8> = (0..n * bb)
        .map(|i| splitmix64(i as u64 ^ seed) as u8)
        .collect();
    for (b, block) in data.chunks_exact_mut(bb).enumerate() {
        let s = |k: u64, scale: f32| {
            let v = (splitmix64(seed ^ (b as u64 * 8 + k)) % 1000) as f32 / 1000.0 - 0.5;
            half::f16::from_f32(v * scale).to_le_bytes()
        };
        match ty {
            GgmlType::Q8_0 => block[..2].copy_from_slice(&s(0, 0.01)),
            GgmlType::Q4_0 => block[..2].copy_from_slice(&s(0, 0.1)),
            GgmlType::Q4_1 | GgmlType::Q4_K | GgmlType::Q5_K => {
                block[..2].copy_from_slice(&s(0, 0.02));
                block[2..4].copy_from_slice(&s(1, 0.02));
            }
            GgmlType::Q6_K => block[bb - 2..].copy_from_slice(&s(0, 0.002)),
            _ => unreachable!("not a block format"),
        }
    }
    QuantTensor {
        name: format!("test.{}", ty.name()),
        rows,
        cols,
        ty,
        data,
    }
}

fn f16_at(b: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// The 32 codes of nibble chunk `c` (the kernels' `nibbles32`).
fn nibbles(c: &[u8]) -> [u32; 32] {
    let mut q = [0u32; 32];
    for i in 0..16 {
        q[i] = u32::from(c[i] & 0xF);
        q[i + 16] = u32::from(c[i] >> 4);
    }
    q
}

/// Scale and min `j` of a K block's 16-byte head (`k4_scale_min`).
fn k4(hdr: &[u8], j: usize) -> (f32, f32) {
    let s = &hdr[4..16];
    let (a, b) = if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    };
    (f32::from(a), f32::from(b))
}

/// The 32 (or 16) weights of the chunk at column `kk` of a row, read from
/// the packed `q` / `side` of that row as `cu/gemv_formats.cuh` reads them.
fn widen_chunk(f: WeightFormat, q: &[u8], side: &[u8], kk: usize) -> Vec<f32> {
    let l = f.layout().unwrap();
    let c = &q[kk / l.cols * 16..][..16];
    let rec = &side[kk / l.group * l.side..][..l.side];
    let j = (kk % l.group) / l.cols;
    match f {
        WeightFormat::Q8_0 => {
            let d = f16_at(rec, 0);
            c.iter().map(|&b| f32::from(b as i8) * d).collect()
        }
        WeightFormat::Q4_0 => {
            let d = f16_at(rec, 0);
            nibbles(c)
                .iter()
                .map(|&v| (v as i32 - 8) as f32 * d)
                .collect()
        }
        WeightFormat::Q4_1 => {
            let (d, m) = (f16_at(rec, 0), f16_at(rec, 2));
            nibbles(c).iter().map(|&v| v as f32 * d + m).collect()
        }
        WeightFormat::Q4K | WeightFormat::Q5K => {
            let (sc, mn) = k4(rec, j);
            let (d1, m1) = (f16_at(rec, 0) * sc, f16_at(rec, 2) * mn);
            let qh = match f {
                WeightFormat::Q5K => u32::from_le_bytes(rec[16 + 4 * j..][..4].try_into().unwrap()),
                _ => 0,
            };
            let codes = nibbles(c);
            (0..32)
                .map(|i| d1 * (codes[i] + 16 * ((qh >> i) & 1)) as f32 - m1)
                .collect()
        }
        WeightFormat::Q6K => {
            let d = f16_at(rec, GGUF_Q6_K_D_AT);
            let sc = |h: usize| d * f32::from(rec[GGUF_Q6_K_SCALES_AT + 2 * j + h] as i8);
            let codes = nibbles(c);
            (0..32)
                .map(|i| {
                    let hi = (rec[8 * j + i % 8] >> (2 * (i / 8))) & 3;
                    sc(i / 16) * ((codes[i] | (u32::from(hi) << 4)) as i32 - 32) as f32
                })
                .collect()
        }
        WeightFormat::Int4 => {
            let at = |o: usize| f32::from_le_bytes(rec[o..o + 4].try_into().unwrap());
            nibbles(c)
                .iter()
                .map(|&v| (v as f32 - at(4)) * at(0))
                .collect()
        }
        WeightFormat::Bf16 | WeightFormat::Fp8Row => unreachable!("not a block format"),
    }
}

/// Every packed weight of every format, read as the kernels read it,
/// equals the GGUF reader's value bit for bit; rows stay rows (two tensors
/// stacked), and a tensor of the wrong shape, type or size is refused
/// naming it.
#[test]
fn packed_blocks_read_as_the_gguf_reader_dequantises() {
    for (f, ty) in FORMATS {
        let (rows, cols) = (3, 512);
        let a = random_blocks(ty, rows, cols, 7);
        let b = random_blocks(ty, 2, cols, 8);
        let (mut q, mut side) = (Vec::new(), Vec::new());
        pack(&a, &[rows, cols], f, &mut q, &mut side).unwrap();
        pack(&b, &[2, cols], f, &mut q, &mut side).unwrap();
        let l = f.layout().unwrap();
        assert_eq!(q.len(), 5 * l.row_bytes(cols), "{f:?}");
        assert_eq!(side.len(), 5 * l.side_bytes(cols), "{f:?}");
        let mut want = dequantize(ty, &a.data, rows * cols).unwrap();
        want.extend(dequantize(ty, &b.data, 2 * cols).unwrap());
        for r in 0..5 {
            let (qr, sr) = (
                &q[r * l.row_bytes(cols)..][..l.row_bytes(cols)],
                &side[r * l.side_bytes(cols)..][..l.side_bytes(cols)],
            );
            for kk in (0..cols).step_by(l.cols) {
                let got = widen_chunk(f, qr, sr, kk);
                let w = &want[r * cols + kk..][..l.cols];
                assert_eq!(got, w, "{f:?} row {r} columns {kk}..");
            }
        }
        let e = pack(&a, &[rows, 256], f, &mut q, &mut side).unwrap_err();
        assert!(
            e.to_string().contains("test.") && e.to_string().contains("shape"),
            "{e}"
        );
        let short = QuantTensor {
            data: a.data[1..].to_vec(),
            ..a.clone()
        };
        let e = pack(&short, &[rows, cols], f, &mut q, &mut side).unwrap_err();
        assert!(e.to_string().contains("bytes of blocks"), "{e}");
    }
    let a = random_blocks(GgmlType::Q8_0, 1, 64, 1);
    let e = pack(
        &a,
        &[1, 64],
        WeightFormat::Q4K,
        &mut Vec::new(),
        &mut Vec::new(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("Q8_0"), "{e}");
}

#[cfg(test)]
mod device;

/// The int4 format (`cuda::int4`): the codes as stored, each chunk's
/// record its group's scale and zero, read back to the stored values.
#[test]
fn packed_int4_reads_as_its_stored_values() {
    let cols = 256;
    for (group, sym) in [(32, true), (64, false), (cols, false)] {
        let data: Vec<half::bf16> = (0..3 * cols)
            .map(|i| half::bf16::from_f32(((splitmix64(i as u64) % 2001) as f32 - 1000.0) * 1e-4))
            .collect();
        let t = checkpoint::weights::Tensor {
            name: "w".into(),
            shape: vec![3, cols],
            data,
        };
        let q4 = checkpoint::int4::Int4Tensor::round_to_nearest(&t, group, sym);
        let (mut q, mut side) = (Vec::new(), Vec::new());
        crate::cuda::int4::pack(&q4, &mut q, &mut side).unwrap();
        let f = WeightFormat::Int4;
        let l = f.layout().unwrap();
        let want = q4.to_f32_rows();
        for r in 0..3 {
            let qr = &q[r * l.row_bytes(cols)..][..l.row_bytes(cols)];
            let sr = &side[r * l.side_bytes(cols)..][..l.side_bytes(cols)];
            for kk in (0..cols).step_by(l.cols) {
                let got = widen_chunk(f, qr, sr, kk);
                assert_eq!(
                    got,
                    want[r * cols + kk..][..l.cols],
                    "g{group} row {r} columns {kk}.."
                );
            }
        }
        let mut ordered = q4.clone();
        ordered.perm = Some((0..cols as u32).rev().collect());
        assert!(crate::cuda::int4::pack(&ordered, &mut q, &mut side).is_err());
    }
}
