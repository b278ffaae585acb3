//! f64 matrix products over strided views: the arithmetic of the GPTQ
//! quantiser (`model::gptq`), whose Hessian sums `X^T X` and lazy column
//! updates are dense products in double precision.
//!
//! Contract: [`gemm_f64`] adds `alpha * a b` to `c` for any row and column
//! strides of `a`, `b` (a transpose is a view with its strides swapped) and
//! a row-major `c`; every index a view forms is checked against its slice
//! before the product runs (a bad view panics: a caller bug). The sums run
//! in the `gemm` crate's order (cache-blocked, SIMD chosen at run time).
//!
//! Costs: `m * n * k` multiply-adds on rayon's pool (the calling thread
//! below [`PARALLEL_MIN_WORK`]); no allocation but the `gemm` crate's
//! packing buffers.

/// Below this many multiply-adds a product runs on the calling thread.
const PARALLEL_MIN_WORK: usize = 1 << 18;

/// A read-only `rows x cols` matrix inside `data`: element `(i, j)` at
/// `i * row_stride + j * col_stride`.
#[derive(Clone, Copy, Debug)]
pub struct View<'a> {
    data: &'a [f64],
    rows: usize,
    cols: usize,
    row_stride: usize,
    col_stride: usize,
}

impl<'a> View<'a> {
    /// The view; panics if an element it names lies outside `data`.
    pub fn new(
        data: &'a [f64],
        rows: usize,
        cols: usize,
        row_stride: usize,
        col_stride: usize,
    ) -> Self {
        if rows > 0 && cols > 0 {
            let last = (rows - 1) * row_stride + (cols - 1) * col_stride;
            assert!(last < data.len(), "view past its slice");
        }
        View {
            data,
            rows,
            cols,
            row_stride,
            col_stride,
        }
    }

    /// A row-major `rows x cols` block starting at `data[0]`, rows `stride` apart.
    pub fn rows(data: &'a [f64], rows: usize, cols: usize, stride: usize) -> Self {
        View::new(data, rows, cols, stride, 1)
    }

    /// The transpose (no copy).
    pub fn t(self) -> Self {
        View {
            rows: self.cols,
            cols: self.rows,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
            ..self
        }
    }
}

/// `c[i][j] += alpha * sum_p a(i, p) b(p, j)` for `a` `[m, k]`, `b` `[k, n]`
/// and `c` `[m, n]` row-major, rows `c_stride` apart. Panics if the shapes
/// disagree or `c` is too short.
pub fn gemm_f64(c: &mut [f64], c_stride: usize, a: View<'_>, b: View<'_>, alpha: f64) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert_eq!(b.rows, k, "a is [{m}, {k}] but b has {} rows", b.rows);
    if m == 0 || n == 0 || k == 0 {
        return;
    }
    assert!(n <= c_stride, "c's rows overlap");
    assert!((m - 1) * c_stride + n <= c.len(), "c is not [{m}, {n}]");
    let threads = rayon::current_num_threads();
    let parallelism = if threads > 1 && m * n * k >= PARALLEL_MIN_WORK {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: dst is `c` [m, n] at row stride c_stride, column stride 1;
    // lhs is `a` and rhs is `b` at their own strides. `View::new` checked
    // that every element of `a` and `b` lies in its slice and the asserts
    // above that every element of `c` does; `c` is borrowed mutably, so it
    // aliases neither input. With read_dst, dst = 1 * dst + alpha * a b.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            c_stride as isize,
            true,
            a.data.as_ptr(),
            a.col_stride as isize,
            a.row_stride as isize,
            b.data.as_ptr(),
            b.col_stride as isize,
            b.row_stride as isize,
            1.0,
            alpha,
            false,
            false,
            false,
            parallelism,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The textbook triple loop.
    fn naive(c: &mut [f64], cs: usize, a: View<'_>, b: View<'_>, alpha: f64) {
        for i in 0..a.rows {
            for j in 0..b.cols {
                let mut s = 0.0;
                for p in 0..a.cols {
                    s += a.data[i * a.row_stride + p * a.col_stride]
                        * b.data[p * b.row_stride + j * b.col_stride];
                }
                c[i * cs + j] += alpha * s;
            }
        }
    }

    fn values(n: usize, seed: u64) -> Vec<f64> {
        (0..n as u64)
            .map(|i| ((i * 2654435761 + seed) % 1009) as f64 / 1009.0 - 0.5)
            .collect()
    }

    #[test]
    fn products_over_strided_views_match_the_triple_loop() {
        // a^T a over a [t, k] block (the Hessian), and a block update
        // c[:, 3..] -= e b[.., 3..] with c rows wider than the block
        let (t, k) = (37, 70);
        let x = values(t * k, 1);
        let xv = View::rows(&x, t, k, k);
        let mut h = values(k * k, 2);
        let mut want = h.clone();
        gemm_f64(&mut h, k, xv.t(), xv, 1.0);
        naive(&mut want, k, xv.t(), xv, 1.0);
        for (a, b) in h.iter().zip(&want) {
            assert!((a - b).abs() < 1e-12 * t as f64, "{a} vs {b}");
        }
        let (n, bk, w) = (9, 5, 40);
        let e = values(n * bk, 3);
        let u = values(bk * w, 4);
        let mut c = values(n * w, 5);
        let mut want = c.clone();
        let (ev, uv) = (View::rows(&e, n, bk, bk), View::rows(&u[3..], bk, w - 3, w));
        gemm_f64(&mut c[3..], w, ev, uv, -1.0);
        naive(&mut want[3..], w, ev, uv, -1.0);
        assert_eq!(c[..3], want[..3]);
        for (a, b) in c.iter().zip(&want) {
            assert!((a - b).abs() < 1e-12, "{a} vs {b}");
        }
    }

    #[test]
    #[should_panic(expected = "view past its slice")]
    fn a_view_past_its_slice_is_refused() {
        let x = [0.0; 10];
        let _ = View::rows(&x, 3, 4, 4);
    }
}
