//! Dense building blocks: BF16-weight matmul, dot product and the residual
//! add, all in f32 arithmetic.
//!
//! Contract: [`matmul_bf16`] computes `y = x @ W^T` for a row-major BF16
//! weight `W` `[out, in]` and f32 activations `x` `[T, in]`, returning
//! `[T, out]`. Each weight row is converted to f32 exactly once per call and
//! used for all `T` tokens (no per-token re-materialisation), in tiles of
//! [`ROWS_PER_TASK`] rows so that one activation row is reused across the
//! tile while it is in cache. Work is split over output rows with rayon.
//!
//! Costs: `T * out * in` multiply-adds; memory traffic one pass over `W`
//! (2 bytes per weight), `ceil(out / ROWS_PER_TASK)` passes over `x`, plus a
//! `[out, T]` scratch transposed into the result.

use half::bf16;
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

/// Weight rows converted and processed together by one rayon task.
pub const ROWS_PER_TASK: usize = 16;

/// `a · b` with eight independent f32 accumulators (vectorisable).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; 8];
    let mut ca = a.chunks_exact(8);
    let mut cb = b.chunks_exact(8);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut tail = 0f32;
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        tail += x * y;
    }
    let s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    s + tail
}

/// `x @ W^T`: `x` `[T, in]` f32, `w` `[out, in]` BF16 row-major, result `[T, out]`.
pub fn matmul_bf16(x: &[f32], w: &[bf16], inp: usize, out: usize) -> Vec<f32> {
    debug_assert_eq!(w.len(), out * inp);
    let t = x.len() / inp;
    if t == 0 || out == 0 {
        return Vec::new();
    }
    // [out, T]: each task owns ROWS_PER_TASK contiguous weight rows' outputs
    let mut yt = vec![0f32; out * t];
    yt.par_chunks_mut(ROWS_PER_TASK * t)
        .zip(w.par_chunks(ROWS_PER_TASK * inp))
        .for_each(|(ychunk, wchunk)| {
            let rows = wchunk.len() / inp;
            // [rows, in] f32 copy of this tile of weights
            let mut wf = vec![0f32; wchunk.len()];
            wchunk.convert_to_f32_slice(&mut wf);
            for (ti, xrow) in x.chunks_exact(inp).enumerate() {
                for r in 0..rows {
                    ychunk[r * t + ti] = dot(&wf[r * inp..(r + 1) * inp], xrow);
                }
            }
        });
    transpose(&yt, out, t)
}

/// Row-major `[rows, cols]` to `[cols, rows]`.
fn transpose(a: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    if cols == 1 || rows == 1 {
        return a.to_vec();
    }
    let mut b = vec![0f32; a.len()];
    b.par_chunks_mut(rows).enumerate().for_each(|(c, brow)| {
        for (r, v) in brow.iter_mut().enumerate() {
            *v = a[r * cols + c];
        }
    });
    b
}

/// `x += y`, elementwise (residual connection).
pub fn add_assign(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matmul_matches_naive_for_ragged_sizes() {
        let (t, inp, out) = (3, 37, ROWS_PER_TASK * 2 + 5);
        let x: Vec<f32> = (0..t * inp)
            .map(|i| ((i * 7 % 13) as f32 - 6.0) / 5.0)
            .collect();
        let w: Vec<bf16> = (0..out * inp)
            .map(|i| bf16::from_f32(((i * 5 % 11) as f32 - 5.0) / 8.0))
            .collect();
        let y = matmul_bf16(&x, &w, inp, out);
        assert_eq!(y.len(), t * out);
        for ti in 0..t {
            for o in 0..out {
                let want: f32 = (0..inp)
                    .map(|i| x[ti * inp + i] * w[o * inp + i].to_f32())
                    .sum();
                assert!(
                    (y[ti * out + o] - want).abs() < 1e-4,
                    "({ti},{o}) {} vs {want}",
                    y[ti * out + o]
                );
            }
        }
        // a single token takes the no-transpose path
        let y1 = matmul_bf16(&x[..inp], &w, inp, out);
        assert_eq!(&y1[..], &y[..out]);
    }

    #[test]
    fn dot_with_a_tail() {
        assert!((dot(&[1.0; 19], &[2.0; 19]) - 38.0).abs() < 1e-6);
        let mut x = vec![1.0, 2.0];
        add_assign(&mut x, &[0.5, 0.25]);
        assert_eq!(x, vec![1.5, 2.25]);
    }
}
