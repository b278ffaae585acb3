//! FP8 e4m3 (OCP "e4m3fn": 1 sign, 4 exponent bits of bias 7, 3 mantissa
//! bits; no infinities, NaN only at `S.1111.111`, largest finite 448): the
//! codec and the per-output-channel quantisation every FP8 path shares (the
//! checkpoint loader and converter, the CPU backend's dequantisation, the
//! CUDA kernels' CPU references).
//!
//! Contract: [`decode`] is exact (every e4m3 value is an f32);
//! [`encode`] rounds to the nearest value, ties to an even mantissa, and
//! saturates at ±448 (the clamp every FP8 quantiser applies before its
//! cast), NaN to `0x7F`. [`quantize_rows`] gives each row of a `[n, k]`
//! matrix the scale `max|w| / 448` (1 for an all-zero row), so
//! `w ≈ decode(q) * scale` with a relative error of at most 2^-4 per value;
//! [`round_rows`] is the same round trip in place (FP8 activations).
//!
//! Costs: `decode` is a 256-entry table lookup; `encode` a few integer
//! operations; `quantize_rows` two passes over the matrix, rows in parallel.

use rayon::prelude::*;

/// Largest finite e4m3 value.
pub const E4M3_MAX: f32 = 448.0;
/// The bits of +448 (the saturated encoding).
const MAX_BITS: u8 = 0x7E;
/// The canonical NaN.
const NAN_BITS: u8 = 0x7F;

/// The f32 value of e4m3 bits `b`.
pub fn decode(b: u8) -> f32 {
    TABLE[b as usize]
}

/// Every e4m3 value by its bits.
static TABLE: [f32; 256] = table();

const fn table() -> [f32; 256] {
    let mut t = [0f32; 256];
    let mut b = 0;
    while b < 256 {
        let (e, m) = ((b >> 3) & 0xF, b & 7);
        let mag = if e == 0xF && m == 7 {
            f32::NAN
        } else if e == 0 {
            // subnormal: m * 2^-9
            m as f32 / 512.0
        } else {
            // (1 + m / 8) * 2^(e - 7), built from the exponent bits
            f32::from_bits((((e + 120) as u32) << 23) | ((m as u32) << 20))
        };
        t[b] = if b & 0x80 != 0 { -mag } else { mag };
        b += 1;
    }
    t
}

/// The e4m3 bits nearest to `x` (ties to even), saturating at ±448.
pub fn encode(x: f32) -> u8 {
    if x.is_nan() {
        return NAN_BITS;
    }
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = x.abs();
    if a >= E4M3_MAX {
        return sign | MAX_BITS;
    }
    let exp = ((a.to_bits() >> 23) & 0xFF) as i32 - 127;
    let bits = if exp < -6 {
        // subnormal range (units of 2^-9; 8 units is the smallest normal,
        // whose bits are 8 too); the scaling is exact, so is the rounding
        (a * 512.0).round_ties_even() as u8
    } else {
        // (1 + m / 8) * 2^exp: m from the exact mantissa scaled by 8
        let m = (a / f32::from_bits(((exp + 127) as u32) << 23) * 8.0 - 8.0).round_ties_even();
        let (e, m) = if m >= 8.0 {
            (exp + 1, 0)
        } else {
            (exp, m as i32)
        };
        (((e + 7) << 3) | m).min(MAX_BITS as i32) as u8
    };
    sign | bits
}

/// A row's e4m3 scale: `max|row| / 448`, 1 for an all-zero or non-finite row.
fn row_scale(row: &[f32]) -> f32 {
    let amax = row.iter().fold(0f32, |m, v| m.max(v.abs()));
    if amax > 0.0 && amax.is_finite() {
        amax / E4M3_MAX
    } else {
        1.0
    }
}

/// Per-row e4m3 quantisation of `w` (`[n, k]`, row-major): the bits
/// (`[n, k]`) and each row's scale (`[n]`, `max|w| / 448`, 1 for a zero row),
/// as llm-compressor's min-max observer sets it. (Trying other scales per
/// row, which shift where the values fall between the format's steps, cut
/// SmolLM2's FP8 perplexity loss only from 1.9% to 1.6% for eight times the
/// work at load: e4m3's relative precision does not depend on the scale.)
pub fn quantize_rows(w: &[f32], n: usize, k: usize) -> (Vec<u8>, Vec<f32>) {
    assert_eq!(w.len(), n * k, "quantize_rows: w is not [n, k]");
    let scales: Vec<f32> = w.par_chunks(k.max(1)).map(row_scale).collect();
    let mut q = vec![0u8; n * k];
    q.par_chunks_mut(k.max(1))
        .zip(w.par_chunks(k.max(1)))
        .zip(&scales)
        .for_each(|((qr, wr), &s)| {
            for (o, &v) in qr.iter_mut().zip(wr) {
                *o = encode(v / s);
            }
        });
    (q, scales)
}

/// `decode(q) * scale[row]` for `q` (`[n, k]`) and per-row `scales` (`[n]`).
pub fn dequantize_rows(q: &[u8], scales: &[f32], k: usize) -> Vec<f32> {
    assert_eq!(
        q.len(),
        scales.len() * k,
        "dequantize_rows: q is not [n, k]"
    );
    let mut out = vec![0f32; q.len()];
    out.par_chunks_mut(k.max(1))
        .zip(q.par_chunks(k.max(1)))
        .zip(scales)
        .for_each(|((o, qr), &s)| {
            for (v, &b) in o.iter_mut().zip(qr) {
                *v = decode(b) * s;
            }
        });
    out
}

/// Each row of `x` (`[n, k]`) replaced by its e4m3 rounding at the row's
/// [`quantize_rows`] scale: the values an FP8-activation product (W8A8)
/// multiplies by, where the CUDA GEMMs quantise their inputs per token.
pub fn round_rows(x: &mut [f32], k: usize) {
    x.par_chunks_mut(k.max(1)).for_each(|row| {
        let s = row_scale(row);
        for v in row {
            *v = decode(encode(*v / s)) * s;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_rows_in_place_is_quantising_then_dequantising() {
        let (n, k) = (3, 40);
        let x: Vec<f32> = (0..n * k)
            .map(|i| ((i * 53 % 97) as f32 - 48.0) * (0.01 + (i / k) as f32))
            .collect();
        let (q, s) = quantize_rows(&x, n, k);
        let mut got = x.clone();
        round_rows(&mut got, k);
        assert_eq!(got, dequantize_rows(&q, &s, k));
        assert_ne!(got, x, "nothing was rounded");
    }

    #[test]
    fn the_table_has_the_format_s_landmarks() {
        assert_eq!(decode(0x00), 0.0);
        assert_eq!(decode(0x01), 2f32.powi(-9)); // smallest subnormal
        assert_eq!(decode(0x08), 2f32.powi(-6)); // smallest normal
        assert_eq!(decode(0x38), 1.0);
        assert_eq!(decode(0x7E), 448.0);
        assert_eq!(decode(0xFE), -448.0);
        assert!(decode(0x7F).is_nan() && decode(0xFF).is_nan());
        assert_eq!(decode(0x80), 0.0);
        assert!(decode(0x80).is_sign_negative());
    }

    #[test]
    fn encoding_every_value_gives_its_bits_back() {
        for b in 0..=255u8 {
            let v = decode(b);
            if !v.is_nan() {
                assert_eq!(encode(v), b, "{b:#04x} = {v}");
            }
        }
    }

    /// Rounding is to the nearest value, ties to the even mantissa, and
    /// saturates; checked against a search over the whole table.
    #[test]
    fn encoding_rounds_to_nearest_even_and_saturates() {
        let nearest = |x: f32| -> u8 {
            let mut best = 0u8;
            for b in 0..=255u8 {
                let (v, w) = (decode(b), decode(best));
                if v.is_nan() || (v.is_sign_negative() != x.is_sign_negative() && v != 0.0) {
                    continue;
                }
                let (dv, dw) = ((v - x).abs(), (w - x).abs());
                if dv < dw || (dv == dw && b & 1 == 0 && best & 1 == 1) {
                    best = b;
                }
            }
            best
        };
        let mut x = 1e-4f32;
        while x < 440.0 {
            for v in [x, -x] {
                let want = nearest(v);
                assert_eq!(decode(encode(v)), decode(want), "{v}");
            }
            x *= 1.0137;
        }
        // exact midpoints go to the even mantissa
        assert_eq!(encode(1.0625), 0x38); // between 1.0 (even) and 1.125
        assert_eq!(encode(1.1875), 0x3A); // between 1.125 and 1.25 (even)
        assert_eq!(encode(1e6), 0x7E);
        assert_eq!(encode(-460.0), 0xFE);
        assert_eq!(encode(f32::NAN), 0x7F);
    }

    #[test]
    fn row_quantisation_is_within_the_format_s_precision() {
        let (n, k) = (5, 64);
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * (1.0 + (i / k) as f32) * 1e-3)
            .collect();
        let mut w0 = w.clone();
        w0[2 * k..3 * k].fill(0.0); // a zero row keeps scale 1
        let (q, s) = quantize_rows(&w0, n, k);
        assert_eq!(s[2], 1.0);
        let back = dequantize_rows(&q, &s, k);
        for (i, (a, b)) in w0.iter().zip(&back).enumerate() {
            // half a step: 2^-4 relative, or half the subnormal step
            let tol = a.abs() / 16.0 + s[i / k] * 2f32.powi(-10);
            assert!((a - b).abs() <= tol * 1.0001, "{i}: {a} vs {b}");
        }
    }
}
