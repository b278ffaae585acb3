//! ggml's "K" quantisations: 256-element super-blocks (`ggml-common.h`,
//! `dequantize_row_q*_K` in `ggml-quants.c`), one function per type taking
//! one block's bytes and its 256 outputs.
//!
//! Layouts (bytes in order, f16 little-endian):
//! - Q2_K (84): `scales[16]` (low nibble scale, high nibble min, per 16
//!   elements), `qs[64]` (2-bit), `d`, `dmin`; `x = d·sc·q − dmin·m`.
//! - Q3_K (110): `hmask[32]` (third bit), `qs[64]` (low 2 bits),
//!   `scales[12]` (16 packed 6-bit scales, offset 32), `d`;
//!   `x = d·(s − 32)·(q − 4·!hbit)`.
//! - Q4_K (144): `d`, `dmin`, `scales[12]` (8 packed 6-bit scale/min pairs
//!   per 32 elements), `qs[128]` (nibbles); `x = d·sc·q − dmin·m`.
//! - Q5_K (176): as Q4_K with `qh[32]` (fifth bit) before `qs`.
//! - Q6_K (210): `ql[128]` (low 4 bits), `qh[64]` (high 2 bits),
//!   `scales[16]` (i8 per 16 elements), `d`; `x = d·s·(q − 32)`.
//!
//! The arithmetic follows ggml's order of operations in f32, so results
//! equal the `gguf` Python package's `gguf.quants.dequantize` exactly.
//!
//! Costs: a few integer operations and one or two multiplies per element.

use super::dequant::f16_at;

/// Elements in a K super-block.
pub(super) const QK_K: usize = 256;
pub(super) const Q2_K_BYTES: usize = 84;
pub(super) const Q3_K_BYTES: usize = 110;
pub(super) const Q4_K_BYTES: usize = 144;
pub(super) const Q5_K_BYTES: usize = 176;
pub(super) const Q6_K_BYTES: usize = 210;

pub(super) fn q2_k(b: &[u8], y: &mut [f32]) {
    let (scales, qs) = (&b[..16], &b[16..80]);
    let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
    let mut is = 0;
    for (half, q) in qs.chunks_exact(32).enumerate() {
        for j in 0..4 {
            let shift = 2 * j;
            for part in 0..2 {
                let sc = scales[is];
                is += 1;
                let dl = d * f32::from(sc & 0xF);
                let ml = dmin * f32::from(sc >> 4);
                let base = half * 128 + j * 32 + part * 16;
                for l in 0..16 {
                    let q = (q[l + part * 16] >> shift) & 3;
                    y[base + l] = dl * f32::from(q) - ml;
                }
            }
        }
    }
}

/// The 16 signed 6-bit scales of a Q3_K block (ggml's `kmask` unpacking).
fn q3_k_scales(packed: &[u8]) -> [i8; 16] {
    let word =
        |i: usize| u32::from_le_bytes([packed[i], packed[i + 1], packed[i + 2], packed[i + 3]]);
    let (a0, a1, tmp) = (word(0), word(4), word(8));
    const KMASK1: u32 = 0x0303_0303;
    const KMASK2: u32 = 0x0f0f_0f0f;
    let aux = [
        (a0 & KMASK2) | ((tmp & KMASK1) << 4),
        (a1 & KMASK2) | (((tmp >> 2) & KMASK1) << 4),
        ((a0 >> 4) & KMASK2) | (((tmp >> 4) & KMASK1) << 4),
        ((a1 >> 4) & KMASK2) | (((tmp >> 6) & KMASK1) << 4),
    ];
    let mut out = [0i8; 16];
    for (o, byte) in out.iter_mut().zip(aux.iter().flat_map(|w| w.to_le_bytes())) {
        *o = byte as i8 - 32;
    }
    out
}

pub(super) fn q3_k(b: &[u8], y: &mut [f32]) {
    let (hmask, qs) = (&b[..32], &b[32..96]);
    let scales = q3_k_scales(&b[96..108]);
    let d = f16_at(b, 108);
    let mut is = 0;
    let mut m = 1u8;
    for (half, q) in qs.chunks_exact(32).enumerate() {
        for j in 0..4 {
            let shift = 2 * j;
            for part in 0..2 {
                let dl = d * f32::from(scales[is]);
                is += 1;
                let base = half * 128 + j * 32 + part * 16;
                for l in 0..16 {
                    let i = l + part * 16;
                    let low = ((q[i] >> shift) & 3) as i8;
                    let q = low - if hmask[i] & m != 0 { 0 } else { 4 };
                    y[base + l] = dl * f32::from(q);
                }
            }
            m <<= 1;
        }
    }
}

/// Scale and min `j` (0..8) of Q4_K / Q5_K's 12 packed bytes (`get_scale_min_k4`).
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Q4_K (`qh` None) and Q5_K (`qh` the 32 fifth-bit bytes).
fn q45_k(b: &[u8], y: &mut [f32], qh: Option<&[u8]>, qs: &[u8]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let scales = &b[4..16];
    for (g, q) in qs.chunks_exact(32).enumerate() {
        let (sc1, m1) = scale_min_k4(2 * g, scales);
        let (sc2, m2) = scale_min_k4(2 * g + 1, scales);
        let (d1, m1) = (d * f32::from(sc1), dmin * f32::from(m1));
        let (d2, m2) = (d * f32::from(sc2), dmin * f32::from(m2));
        let (u1, u2) = (1u8 << (2 * g), 2u8 << (2 * g));
        for l in 0..32 {
            let (hi1, hi2) = match qh {
                Some(h) => (
                    if h[l] & u1 != 0 { 16 } else { 0 },
                    if h[l] & u2 != 0 { 16 } else { 0 },
                ),
                None => (0, 0),
            };
            y[g * 64 + l] = d1 * f32::from((q[l] & 0xF) + hi1) - m1;
            y[g * 64 + 32 + l] = d2 * f32::from((q[l] >> 4) + hi2) - m2;
        }
    }
}

pub(super) fn q4_k(b: &[u8], y: &mut [f32]) {
    q45_k(b, y, None, &b[16..144]);
}

pub(super) fn q5_k(b: &[u8], y: &mut [f32]) {
    q45_k(b, y, Some(&b[16..48]), &b[48..176]);
}

pub(super) fn q6_k(b: &[u8], y: &mut [f32]) {
    let (ql, qh, sc) = (&b[..128], &b[128..192], &b[192..208]);
    let d = f16_at(b, 208);
    for n in 0..2 {
        let (ql, qh, sc) = (&ql[n * 64..], &qh[n * 32..], &sc[n * 8..]);
        let y = &mut y[n * 128..];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i8 - 32;
            let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
            let s = |k: usize| d * f32::from(sc[is + k] as i8);
            y[l] = s(0) * f32::from(q1);
            y[l + 32] = s(2) * f32::from(q2);
            y[l + 64] = s(4) * f32::from(q3);
            y[l + 96] = s(6) * f32::from(q4);
        }
    }
}
