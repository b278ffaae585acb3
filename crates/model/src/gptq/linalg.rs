//! Dense f64 algebra of the GPTQ solver: the Cholesky factor of a
//! symmetric positive definite matrix, the inverse of a lower triangular
//! one, and from both the upper Cholesky factor of an inverse.
//!
//! Contract: matrices are row-major `[k, k]`. [`cholesky_lower`] reads the
//! lower triangle only and fails with the first column whose pivot is not
//! positive and finite. [`inverse_upper_cholesky`] returns the upper
//! triangular `U` with positive diagonal and `U^T U = H^-1` (what GPTQ
//! calls `cholesky(cholesky_inverse(cholesky(H)), upper=True)`), computed
//! as `U = R^-1` for `H = R R^T`, `R` upper: the Cholesky factor of `H`
//! with rows and columns reversed, reversed back.
//!
//! Costs: each routine `k^3 / 3` multiply-adds, almost all in
//! [`cpu_kernels::dense::gemm_f64`] over blocks of [`BLOCK`] columns;
//! `O(k^2)` extra memory.

use cpu_kernels::dense::{View, gemm_f64};

/// Columns of one block of the blocked factorisations.
const BLOCK: usize = 128;

/// `sum a[i] b[i]` with independent partial sums (vectorised).
fn dot(a: &[f64], b: &[f64]) -> f64 {
    let mut acc = [0f64; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f64 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f64>() + tail
}

/// The lower Cholesky factor `L` (`[k, k]`, `L L^T = a`) of `a` (`[k, k]`,
/// lower triangle read); `Err(j)` at the first column `j` whose pivot is not
/// positive and finite.
pub(crate) fn cholesky_lower(a: &[f64], k: usize) -> Result<Vec<f64>, usize> {
    assert_eq!(a.len(), k * k, "a is not [{k}, {k}]");
    let mut l = vec![0f64; k * k]; // [k, k]
    for j0 in (0..k).step_by(BLOCK) {
        let j1 = (j0 + BLOCK).min(k);
        let b = j1 - j0;
        // the panel: rows j0..k, columns j0..j1 of `a`, less the columns
        // already factored: P -= L[j0.., ..j0] L[j0..j1, ..j0]^T
        let mut p: Vec<f64> = (j0..k)
            .flat_map(|i| a[i * k + j0..i * k + j1].iter().copied())
            .collect(); // [k - j0, b]
        let done = View::rows(&l[j0 * k..], k - j0, j0, k);
        let top = View::rows(&l[j0 * k..], b, j0, k);
        gemm_f64(&mut p, b, done, top.t(), -1.0);
        factor_panel(&mut p, b)?;
        for (i, row) in (j0..k).zip(p.chunks_exact(b)) {
            l[i * k + j0..i * k + j1].copy_from_slice(row);
        }
    }
    Ok(l)
}

/// Factors panel `p` (`[rows, b]`, its top `b x b` block symmetric) in
/// place: the top block into its lower Cholesky factor `T`, the rows below
/// into `row T^-T` (one product with `T`'s inverse); `Err(j)` for a pivot
/// that is not positive.
fn factor_panel(p: &mut [f64], b: usize) -> Result<(), usize> {
    let (top, below) = p.split_at_mut(b * b);
    for j in 0..b {
        let (done, rest) = top.split_at_mut(j * b);
        let row = &mut rest[..b];
        for c in 0..j {
            let lc = &done[c * b..c * b + c];
            row[c] = (row[c] - dot(&row[..c], lc)) / done[c * b + c];
        }
        let d = row[j] - dot(&row[..j], &row[..j]);
        if !(d > 0.0 && d.is_finite()) {
            return Err(j);
        }
        row[j] = d.sqrt();
        row[j + 1..].fill(0.0);
    }
    if !below.is_empty() {
        let inv = lower_inverse(top, b); // [b, b]
        let rows = below.len() / b;
        let mut out = vec![0f64; below.len()]; // [rows, b]
        let bv = View::rows(below, rows, b, b);
        gemm_f64(&mut out, b, bv, View::rows(&inv, b, b, b).t(), 1.0);
        below.copy_from_slice(&out);
    }
    Ok(())
}

/// `L^-1` (`[k, k]`, lower triangular) of lower triangular `l` with a
/// non-zero diagonal: forward substitution on the identity, block rows at
/// a time.
pub(crate) fn lower_inverse(l: &[f64], k: usize) -> Vec<f64> {
    assert_eq!(l.len(), k * k, "l is not [{k}, {k}]");
    let mut x = vec![0f64; k * k]; // [k, k]
    for i0 in (0..k).step_by(BLOCK) {
        let i1 = (i0 + BLOCK).min(k);
        let (done, rows) = x.split_at_mut(i0 * k);
        // rows i0..i1: e_r - L[r, ..i0] X[..i0, ..i0], by column blocks
        // (X is lower triangular: block J needs X's rows j0.. only)
        for r in i0..i1 {
            rows[(r - i0) * k + r] = 1.0;
        }
        for j0 in (0..i0).step_by(BLOCK) {
            let bj = BLOCK.min(i0 - j0);
            let lv = View::rows(&l[i0 * k + j0..], i1 - i0, i0 - j0, k);
            let xv = View::rows(&done[j0 * k + j0..], i0 - j0, bj, k);
            gemm_f64(&mut rows[j0..], k, lv, xv, -1.0);
        }
        solve_block(l, k, i0, i1, rows);
    }
    x
}

/// Solves `L[I, I] Y = B` in place for the block rows `I = i0..i1` of `l`
/// (`[k, k]`), `B` the first `i1` columns of `rows` (`[i1 - i0, k]`):
/// column by column in parallel, each a forward substitution.
fn solve_block(l: &[f64], k: usize, i0: usize, i1: usize, rows: &mut [f64]) {
    use rayon::prelude::*;
    let b = i1 - i0;
    // [i1, b] the block's columns, each contiguous
    let mut cols: Vec<f64> = (0..i1)
        .flat_map(|c| (0..b).map(move |r| (r, c)))
        .map(|(r, c)| rows[r * k + c])
        .collect();
    cols.par_chunks_mut(b).with_min_len(8).for_each(|y| {
        for r in 0..b {
            let lr = &l[(i0 + r) * k + i0..(i0 + r) * k + i0 + r];
            y[r] = (y[r] - dot(lr, &y[..r])) / l[(i0 + r) * k + i0 + r];
        }
    });
    for (c, y) in cols.chunks_exact(b).enumerate() {
        for (r, v) in y.iter().enumerate() {
            rows[r * k + c] = *v;
        }
    }
}

/// The upper triangular `U` (`[k, k]`) with `U^T U = h^-1` (see the module
/// doc); `Err(j)` when `h` is not positive definite (`j` a column of `h`).
pub(crate) fn inverse_upper_cholesky(h: &[f64], k: usize) -> Result<Vec<f64>, usize> {
    assert_eq!(h.len(), k * k, "h is not [{k}, {k}]");
    let rev = |m: &[f64]| -> Vec<f64> { m.iter().rev().copied().collect() };
    // reversing the flat array reverses rows and columns at once
    let l = cholesky_lower(&rev(h), k).map_err(|j| k - 1 - j)?;
    Ok(rev(&lower_inverse(&l, k)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A symmetric positive definite `[k, k]` matrix: `B B^T / k + I / 10`.
    fn spd(k: usize, seed: u64) -> Vec<f64> {
        let b: Vec<f64> = (0..(k * k) as u64)
            .map(|i| (((i + seed) * 2654435761) % 10007) as f64 / 10007.0 - 0.5)
            .collect();
        let mut h = vec![0f64; k * k];
        for i in 0..k {
            for j in 0..k {
                h[i * k + j] = dot(&b[i * k..(i + 1) * k], &b[j * k..(j + 1) * k]) / k as f64;
            }
            h[i * k + i] += 0.1;
        }
        h
    }

    fn matmul(a: &[f64], b: &[f64], k: usize) -> Vec<f64> {
        let mut c = vec![0f64; k * k];
        gemm_f64(
            &mut c,
            k,
            View::rows(a, k, k, k),
            View::rows(b, k, k, k),
            1.0,
        );
        c
    }

    fn transpose(a: &[f64], k: usize) -> Vec<f64> {
        (0..k * k).map(|i| a[(i % k) * k + i / k]).collect()
    }

    /// Factors across block boundaries (`k` not a multiple of the block).
    #[test]
    fn the_factors_reproduce_the_matrix_and_its_inverse() {
        for k in [1, 5, 64, 150] {
            let h = spd(k, k as u64);
            let l = cholesky_lower(&h, k).unwrap();
            let llt = matmul(&l, &transpose(&l, k), k);
            let x = lower_inverse(&l, k);
            let lx = matmul(&l, &x, k);
            let u = inverse_upper_cholesky(&h, k).unwrap();
            // U^T U h = I
            let uh = matmul(&matmul(&transpose(&u, k), &u, k), &h, k);
            for i in 0..k {
                for j in 0..k {
                    let eye = if i == j { 1.0 } else { 0.0 };
                    let at = i * k + j;
                    assert!((llt[at] - h[at]).abs() < 1e-12, "k {k} L L^T ({i}, {j})");
                    assert!((lx[at] - eye).abs() < 1e-10, "k {k} L X ({i}, {j})");
                    assert!((uh[at] - eye).abs() < 1e-9, "k {k} U^T U H ({i}, {j})");
                    if j < i {
                        assert_eq!(u[at], 0.0, "U is upper");
                        assert_eq!(l[j * k + i], 0.0, "L is lower");
                    }
                }
                assert!(u[i * k + i] > 0.0);
            }
        }
    }

    #[test]
    fn a_matrix_that_is_not_positive_definite_names_its_column() {
        let k = 4;
        let mut h = spd(k, 3);
        h[2 * k + 2] = -1.0;
        assert_eq!(cholesky_lower(&h, k), Err(2));
        // the reversed factorisation meets the last column first
        let mut h = spd(k, 3);
        h[3 * k + 3] = -1.0;
        assert_eq!(inverse_upper_cholesky(&h, k), Err(3));
    }
}
