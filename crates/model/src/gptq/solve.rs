//! GPTQ's column-by-column quantisation of one weight matrix against the
//! Hessian of its inputs, on a rounding rule given as a [`Grid`]: FP8
//! e4m3 at row scales ([`gptq`]) or GPTQ's symmetric 4-bit grid with group
//! scales ([`gptq_int4`]).
//!
//! Contract: [`solve`] quantises `W` (`[n, k]`) column by column; the grid
//! gives each weight's code and dequantised value from the row's current
//! weights (FP8: the nearest e4m3 value of the row's scale,
//! `encode(w / scale)`, saturating at 448; 4-bit: the nearest of the 16
//! steps of the group's scale, found when the solver reaches the group's
//! first column, see [`super::grid`]), and its rounding error,
//! divided by `U[i][i]`, is spread over the columns not yet quantised with
//! the weights `U[i][j]` of the upper Cholesky factor of `H^-1`
//! (`linalg::inverse_upper_cholesky`): inside a block of `block` columns
//! (rounded up to whole groups) at once, past it in one product per block
//! (GPTQ's lazy batch updates).
//! This minimises `||X W^T - X Q^T||` greedily, column by column. As GPTQ
//! does: `H` is dampened by `damp` times the mean of its diagonal on the
//! diagonal; a column whose diagonal is zero (an input that was zero on
//! every calibration row) gets diagonal 1 and its weights set to zero
//! before rounding; with `act_order` columns are taken in order of
//! decreasing diagonal (FP8 only: 4-bit groups are runs of input columns).
//! The Hessian is prepared once per input
//! ([`Factor`]) and shared by the matrices fed by it. The FP8 scales are
//! the caller's ([`scales`]: each
//! row's or the tensor's largest magnitude over 448, optionally rounded up
//! to a BF16 value so that a BF16 `weight_scale` is exact).
//!
//! With `H` the identity (or any diagonal `H`) no error is spread and
//! the result is rounding to nearest, column for column ([`round_to_nearest`]
//! for FP8; for 4 bits, [`checkpoint::int4::Int4Tensor::round_to_nearest`]'s
//! codes and scales).
//!
//! Costs: `n k^2` multiply-adds for the updates (nearly all in
//! [`cpu_kernels::dense::gemm_f64`]), `2 k^3 / 3` for the factor; rows in
//! parallel inside a block; `8 (n k + k^2)` bytes of f64 copies.

use cpu_kernels::dense::{View, gemm_f64};
use half::bf16;
use ops::fp8::{E4M3_MAX, encode};
use rayon::prelude::*;

use super::Hessian;
use super::grid::{Fp8Grid, Grid, Int4Grid};
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

    /// Whether the columns are taken in order (no `act_order`, or an
    /// order that changed nothing).
    pub fn in_order(&self) -> bool {
        self.perm.iter().enumerate().all(|(a, &j)| a == j)
    }

    /// The input column taken at each step, or `None` when in order.
    pub fn order(&self) -> Option<&[usize]> {
        (!self.in_order()).then_some(self.perm.as_slice())
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
    assert_eq!(scales.len(), n, "scales is not [{n}]");
    solve(w, n, k, f, &Fp8Grid { scales }, block).0
}

/// The GPTQ quantisation of `w` (`[n, k]`) on the symmetric 4-bit grid,
/// `group` columns a scale found from the group's weights as the solver
/// reaches it ([`Int4Grid`]), so a group is `group` consecutive columns in
/// the solver's order: the codes (`[n, k]`, `0..=15` around zero 8) in that
/// order, the scales (`[n, k / group]`) and, when `f` takes the columns out
/// of order (`act_order`), the input column of each stored one (GPTQ's
/// `desc_act`: `Int4Tensor::perm`). Panics unless `group` divides `k`
/// (checked by the callers).
pub fn gptq_int4(
    w: &[f32],
    n: usize,
    k: usize,
    f: &Factor,
    group: usize,
    block: usize,
) -> (Vec<u8>, Vec<f32>, Option<Vec<u32>>) {
    assert!(
        group > 0 && k.is_multiple_of(group),
        "a group of {group} does not divide {k}"
    );
    let (codes, rows) = solve(w, n, k, f, &Int4Grid { group }, block); // [n, k] input order
    let Some(order) = f.order() else {
        return (codes, rows.concat(), None);
    };
    let stored = (codes.chunks(k))
        .flat_map(|row| order.iter().map(move |&c| row[c]))
        .collect();
    let perm = order.iter().map(|&c| c as u32).collect();
    (stored, rows.concat(), Some(perm))
}

/// The GPTQ solve of `w` (`[n, k]`) against the factored Hessian `f` on
/// `grid`, in blocks of `block` columns rounded up to whole
/// [`Grid::span`]s: the codes (`[n, k]`, input order) and each row's final
/// state.
pub fn solve<G: Grid>(
    w: &[f32],
    n: usize,
    k: usize,
    f: &Factor,
    grid: &G,
    block: usize,
) -> (Vec<u8>, Vec<G::Row>) {
    assert_eq!(w.len(), n * k, "w is not [{n}, {k}]");
    assert_eq!(f.k, k, "the Hessian is not [{k}, {k}]");
    let mut rows: Vec<G::Row> = (0..n).map(|r| grid.start(r)).collect();
    if n == 0 || k == 0 {
        return (Vec::new(), rows);
    }
    let mut wd: Vec<f64> = w.iter().map(|&v| v as f64).collect(); // [n, k]
    for &i in &f.dead {
        wd.iter_mut().skip(i).step_by(k).for_each(|v| *v = 0.0);
    }
    let (u, perm) = (&f.u, &f.perm);
    let mut wd = permute(&wd, n, k, perm, false); // [n, k] in the order of `perm`
    let mut q = vec![0u8; n * k]; // [n, k] in the order of `perm`
    let span = grid.span().max(1);
    let block = block.max(1).div_ceil(span) * span;
    let mut err = vec![0f64; n * block]; // [n, b] each row's scaled errors
    for i1 in (0..k).step_by(block) {
        let i2 = (i1 + block).min(k);
        let b = i2 - i1;
        wd.par_chunks_mut(k)
            .zip(q.par_chunks_mut(k))
            .zip(err.par_chunks_mut(b))
            .zip(rows.par_iter_mut())
            .for_each(|(((wr, qr), er), row)| {
                for i in i1..i2 {
                    let (code, value) = grid.round(row, wr, i);
                    qr[i] = code;
                    let e = (wr[i] - value) / u[i * k + i];
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
    (unpermute(&q, n, k, perm), rows)
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
