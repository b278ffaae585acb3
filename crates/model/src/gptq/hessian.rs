//! The Hessian of a projection's squared output error over its input rows,
//! `H = sum_t x_t x_t^T`, summed in f64.
//!
//! Contract: [`Hessian::add`] adds rows `x` (`[T, k]` f32) exactly widened
//! to f64, the products summed by [`cpu_kernels::dense::gemm_f64`] in
//! chunks of [`CHUNK`] rows, only the blocks of [`BLOCK`] columns on and
//! below the diagonal; the matrix is symmetric to the last bit (the lower
//! triangle is mirrored up after each call). Non-finite inputs are
//! counted, never summed silently ([`Hessian::finite`]).
//!
//! Costs: about `T * k * (k + BLOCK) / 2` multiply-adds per
//! [`Hessian::add`]; `8 k^2` bytes held, plus `8 * CHUNK * k` bytes of
//! scratch per call.

use cpu_kernels::dense::{View, gemm_f64};

/// Rows widened and multiplied at once.
const CHUNK: usize = 1024;
/// Columns of one block product.
const BLOCK: usize = 192;

/// `sum x x^T` over the rows seen (see the module doc).
#[derive(Debug, Clone, PartialEq)]
pub struct Hessian {
    k: usize,
    sum: Vec<f64>, // [k, k]
    rows: usize,
    finite: bool,
}

impl Hessian {
    /// The empty sum over inputs of width `k`.
    pub fn new(k: usize) -> Self {
        Hessian {
            k,
            sum: vec![0.0; k * k],
            rows: 0,
            finite: true,
        }
    }

    /// A given matrix (`[k, k]`, symmetric) as if summed from data.
    pub fn from_matrix(k: usize, sum: Vec<f64>) -> Self {
        assert_eq!(sum.len(), k * k, "the matrix is not [{k}, {k}]");
        let finite = sum.iter().all(|v| v.is_finite());
        Hessian {
            k,
            sum,
            rows: 0,
            finite,
        }
    }

    /// The sum over the rows of `x` (`[T, k]`).
    pub fn of(x: &[f32], k: usize) -> Self {
        let mut h = Hessian::new(k);
        h.add(x);
        h
    }

    /// Adds the rows of `x` (`[T, k]`).
    pub fn add(&mut self, x: &[f32]) {
        let k = self.k;
        assert!(k > 0 && x.len().is_multiple_of(k), "x is not [T, {k}]");
        self.finite &= x.iter().all(|v| v.is_finite());
        for rows in x.chunks(CHUNK * k) {
            let t = rows.len() / k;
            let wide: Vec<f64> = rows.iter().map(|&v| v as f64).collect(); // [t, k]
            for i0 in (0..k).step_by(BLOCK) {
                let bi = BLOCK.min(k - i0);
                // rows i0..i0 + bi, columns ..i0 + bi: X[:, i]^T X[:, ..]
                let xi = View::rows(&wide[i0..], t, bi, k);
                let xj = View::rows(&wide, t, i0 + bi, k);
                gemm_f64(&mut self.sum[i0 * k..], k, xi.t(), xj, 1.0);
            }
            self.rows += t;
        }
        self.symmetrise();
    }

    /// Copies the lower triangle over the upper one.
    fn symmetrise(&mut self) {
        let k = self.k;
        for i in 0..k {
            for j in 0..i {
                self.sum[j * k + i] = self.sum[i * k + j];
            }
        }
    }

    /// The input width `k`.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Rows summed so far.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Whether every row added was finite.
    pub fn finite(&self) -> bool {
        self.finite
    }

    /// The matrix, `[k, k]` row-major.
    pub fn matrix(&self) -> &[f64] {
        &self.sum
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sum_is_x_transpose_x_in_any_number_of_calls() {
        let (t, k) = (300, 200); // two blocks of columns
        let x: Vec<f32> = (0..t * k)
            .map(|i| ((i * 31 % 17) as f32 - 8.0) / 8.0)
            .collect();
        let mut h = Hessian::new(k);
        h.add(&x[..100 * k]);
        h.add(&x[100 * k..]);
        assert_eq!(h.rows(), t);
        assert!(h.finite());
        for i in 0..k {
            for j in 0..k {
                let want: f64 = (0..t)
                    .map(|r| x[r * k + i] as f64 * x[r * k + j] as f64)
                    .sum();
                let got = h.matrix()[i * k + j];
                assert!((got - want).abs() < 1e-9 * want.abs().max(1.0), "{i} {j}");
                assert_eq!(got, h.matrix()[j * k + i]);
            }
        }
        let mut bad = Hessian::new(2);
        bad.add(&[1.0, f32::NAN]);
        assert!(!bad.finite());
    }
}
