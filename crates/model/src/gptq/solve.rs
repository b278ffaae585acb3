//! GPTQ's column-by-column FP8 quantisation of one weight matrix against
//! the Hessian of its inputs.
//!
//! Contract: [`gptq`] quantises `W` (`[n, k]`) column by column; each
//! column is rounded to the nearest e4m3 value of its row's scale
//! (`encode(w / scale)`, saturating at 448), and its rounding error,
//! divided by `U[i][i]`, is spread over the columns not yet quantised with
//! the weights `U[i][j]` of the upper Cholesky factor of `H^-1`
//! (`linalg::inverse_upper_cholesky`): inside a block of `block` columns
//! at once, past it in one product per block (GPTQ's lazy batch updates).
//! This minimises `||X W^T - X Q^T||` greedily, column by column. As GPTQ
//! does: `H` is dampened by `damp` times the mean of its diagonal on the
//! diagonal; a column whose diagonal is zero (an input that was zero on
//! every calibration row) gets diagonal 1 and its weights set to zero
//! before rounding; with `act_order` columns are taken in order of
//! decreasing diagonal. The Hessian is prepared once per input
//! ([`Factor`]) and shared by the matrices fed by it. The scales are the
//! caller's ([`scales`]: each
//! row's or the tensor's largest magnitude over 448, optionally rounded up
//! to a BF16 value so that a BF16 `weight_scale` is exact).
//!
//! With `H` the identity (or any diagonal `H`) no error is spread and
//! the result is [`round_to_nearest`], column for column.
//!
//! Costs: `n k^2` multiply-adds for the updates (nearly all in
//! [`cpu_kernels::dense::gemm_f64`]), `2 k^3 / 3` for the factor; rows in
//! parallel inside a block; `8 (n k + k^2)` bytes of f64 copies.

use cpu_kernels::dense::{View, gemm_f64};
use half::bf16;
use ops::fp8::{E4M3_MAX, decode, encode};
use rayon::prelude::*;

use super::Hessian;
use super::linalg::inverse_upper_cholesky;

/// How a matrix's FP8 scales are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScaleRule {
    /// One scale per output row (else one for the whole tensor).
    pub per_channel: bool,
    /// Each scale rounded up to the nearest BF16 value (the layout stores
    /// BF16 scales), so that it is stored exactly.
    pub bf16: bool,
}

/// The Hessian of one input prepared for [`gptq`]: dampened, dead
/// columns marked, the column order, and the upper Cholesky factor of its
/// inverse in that order. Every matrix fed by that input (Q, K and V;
/// gate and up) shares one.
#[derive(Debug, Clone, PartialEq)]
pub struct Factor {
    k: usize,
    u: Vec<f64>,      // [k, k] upper, rows and columns in the order of `perm`
    perm: Vec<usize>, // [k] the column taken at each step
    dead: Vec<usize>, // columns whose diagonal was zero
}

impl Factor {
    /// `h` dampened by `damp` times its mean diagonal, in order of
    /// decreasing diagonal with `act_order`, and factored; `Err(j)` when
    /// that is not positive definite (`j` a column of `h`).
    pub fn new(h: &Hessian, damp: f64, act_order: bool) -> Result<Factor, usize> {
        let k = h.k();
        let mut hm = h.matrix().to_vec(); // [k, k]
        let dead: Vec<usize> = (0..k).filter(|&i| hm[i * k + i] == 0.0).collect();
        for &i in &dead {
            hm[i * k + i] = 1.0;
        }
        let mean = (0..k).map(|i| hm[i * k + i]).sum::<f64>() / k.max(1) as f64;
        (0..k).for_each(|i| hm[i * k + i] += damp * mean);
        let perm = order(&hm, k, act_order);
        let u = inverse_upper_cholesky(&permute(&hm, k, k, &perm, true), k).map_err(|j| perm[j])?;
        Ok(Factor { k, u, perm, dead })
    }
}

/// Every row's scale (`[n]`) of `w` (`[n, k]`) under `rule`: the largest
/// magnitude (of the row, or of the tensor) over 448, 1 where it is zero.
pub fn scales(w: &[f32], n: usize, k: usize, rule: ScaleRule) -> Vec<f32> {
    assert_eq!(w.len(), n * k, "w is not [{n}, {k}]");
    let amax = |v: &[f32]| v.iter().fold(0f32, |m, x| m.max(x.abs()));
    let of = |a: f32| {
        let s = if a > 0.0 && a.is_finite() {
            a / E4M3_MAX
        } else {
            1.0
        };
        if rule.bf16 { bf16_at_least(s) } else { s }
    };
    if rule.per_channel {
        w.chunks(k.max(1)).map(|r| of(amax(r))).collect()
    } else {
        vec![of(amax(w)); n]
    }
}

/// The smallest BF16 value at least `s` (positive, finite).
fn bf16_at_least(s: f32) -> f32 {
    let b = bf16::from_f32(s);
    if b.to_f32() >= s {
        b.to_f32()
    } else {
        bf16::from_bits(b.to_bits() + 1).to_f32()
    }
}

/// Each weight of `w` (`[n, k]`) rounded to the nearest e4m3 value of its
/// row's scale (`scales` `[n]`): the bits, `[n, k]`.
pub fn round_to_nearest(w: &[f32], n: usize, k: usize, scales: &[f32]) -> Vec<u8> {
    assert_eq!(w.len(), n * k, "w is not [{n}, {k}]");
    assert_eq!(scales.len(), n, "scales is not [{n}]");
    w.chunks(k.max(1))
        .zip(scales)
        .flat_map(|(row, &s)| row.iter().map(move |&v| encode(v / s)))
        .collect()
}

/// The GPTQ quantisation of `w` (`[n, k]`) against the factored Hessian
/// `f` at `scales` (`[n]`), `block` columns a lazy update: the e4m3 bits,
/// `[n, k]`.
pub fn gptq(w: &[f32], n: usize, k: usize, f: &Factor, scales: &[f32], block: usize) -> Vec<u8> {
    assert_eq!(w.len(), n * k, "w is not [{n}, {k}]");
    assert_eq!(f.k, k, "the Hessian is not [{k}, {k}]");
    assert_eq!(scales.len(), n, "scales is not [{n}]");
    if n == 0 || k == 0 {
        return Vec::new();
    }
    let mut wd: Vec<f64> = w.iter().map(|&v| v as f64).collect(); // [n, k]
    for &i in &f.dead {
        wd.iter_mut().skip(i).step_by(k).for_each(|v| *v = 0.0);
    }
    let (u, perm) = (&f.u, &f.perm);
    let mut wd = permute(&wd, n, k, perm, false); // [n, k] in the order of `perm`
    let mut q = vec![0u8; n * k]; // [n, k] in the order of `perm`
    let block = block.max(1);
    let mut err = vec![0f64; n * block]; // [n, b] each row's scaled errors
    for i1 in (0..k).step_by(block) {
        let i2 = (i1 + block).min(k);
        let b = i2 - i1;
        wd.par_chunks_mut(k)
            .zip(q.par_chunks_mut(k))
            .zip(err.par_chunks_mut(b))
            .zip(scales)
            .for_each(|(((wr, qr), er), &s)| {
                for i in i1..i2 {
                    let x = wr[i];
                    qr[i] = encode(x as f32 / s);
                    let e = (x - decode(qr[i]) as f64 * s as f64) / u[i * k + i];
                    er[i - i1] = e;
                    let ui = &u[i * k + i + 1..i * k + i2];
                    wr[i + 1..i2]
                        .iter_mut()
                        .zip(ui)
                        .for_each(|(v, f)| *v -= e * f);
                }
            });
        if i2 < k {
            // W[:, i2..] -= E U[i1..i2, i2..]
            let e = View::rows(&err, n, b, b);
            let ub = View::rows(&u[i1 * k + i2..], b, k - i2, k);
            gemm_f64(&mut wd[i2..], k, e, ub, -1.0);
        }
    }
    unpermute(&q, n, k, perm)
}

/// The order columns are taken in: by decreasing diagonal of `h` with
/// `act_order` (ties in column order), else `0..k`.
fn order(h: &[f64], k: usize, act_order: bool) -> Vec<usize> {
    let mut perm: Vec<usize> = (0..k).collect();
    if act_order {
        perm.sort_by(|&a, &b| h[b * k + b].total_cmp(&h[a * k + a]));
    }
    perm
}

/// `m` (`[r, c]`) with its columns (and with `rows_too` its rows, for a
/// square `m`) taken in the order `perm`.
fn permute(m: &[f64], r: usize, c: usize, perm: &[usize], rows_too: bool) -> Vec<f64> {
    (0..r)
        .flat_map(|i| {
            let src = if rows_too { perm[i] } else { i };
            perm.iter().map(move |&j| m[src * c + j])
        })
        .collect()
}

/// `q` (`[n, k]`, columns in the order `perm`) back in column order.
fn unpermute(q: &[u8], n: usize, k: usize, perm: &[usize]) -> Vec<u8> {
    let mut out = vec![0u8; n * k];
    for (dst, src) in out.chunks_exact_mut(k.max(1)).zip(q.chunks_exact(k.max(1))) {
        for (a, &j) in perm.iter().enumerate() {
            dst[j] = src[a];
        }
    }
    out
}
