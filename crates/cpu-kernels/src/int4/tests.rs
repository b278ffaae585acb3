//! Every path the processor has against a plain reference on the
//! dequantised weights.

use super::*;

/// A deterministic pseudo-random stream (xorshift).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn f32(&mut self) -> f32 {
        (self.next() % 2001) as f32 / 1000.0 - 1.0
    }
}

/// A random matrix's owned fields.
struct Owned {
    rows: usize,
    cols: usize,
    group: usize,
    data: Vec<u8>,
    scale: Vec<f32>,
    zero: Vec<u8>,
    perm: Option<Vec<u32>>,
}

impl Owned {
    fn new(rows: usize, cols: usize, group: usize, shuffled: bool, seed: u64) -> Owned {
        let mut r = Rng(seed);
        let groups = rows * (cols / group);
        let perm = shuffled.then(|| (0..cols).map(|c| ((c * 7 + 3) % cols) as u32).collect());
        Owned {
            rows,
            cols,
            group,
            data: (0..rows * cols / 2).map(|_| r.next() as u8).collect(),
            scale: (0..groups).map(|_| r.f32().abs() / 8.0 + 1e-3).collect(),
            zero: (0..groups).map(|_| (r.next() % 16) as u8).collect(),
            perm,
        }
    }

    fn matrix(&self) -> Int4Matrix<'_> {
        Int4Matrix {
            rows: self.rows,
            cols: self.cols,
            group: self.group,
            data: &self.data,
            scale: &self.scale,
            zero: &self.zero,
            perm: self.perm.as_deref(),
        }
    }

    /// The weights in input order, by the layout's definition, written out.
    fn dense(&self) -> Vec<f32> {
        let (k, groups) = (self.cols, self.cols / self.group);
        let mut w = vec![0f32; self.rows * k];
        for r in 0..self.rows {
            for c in 0..k {
                let (b, j) = (c / 32, c % 32);
                let byte = self.data[r * k / 2 + b * 16 + j % 16];
                let q = if j < 16 { byte & 0xF } else { byte >> 4 };
                let g = r * groups + c / self.group;
                let col = self.perm.as_ref().map_or(c, |p| p[c] as usize);
                w[r * k + col] = (q as f32 - self.zero[g] as f32) * self.scale[g];
            }
        }
        w
    }
}

#[test]
fn widening_is_the_same_on_every_path() {
    let o = Owned::new(3, 64, 32, false, 9);
    let want = o.dense();
    for isa in Isa::available() {
        let mut row = vec![0f32; 64];
        for r in 0..3 {
            o.matrix().widen_row(isa, r, &mut row);
            assert_eq!(row, want[r * 64..][..64], "{isa:?} row {r}");
        }
    }
}

#[test]
fn products_match_the_reference_on_every_path() {
    // (rows, cols, group, shuffled): groups of one block, of two, a whole
    // row; a column order; rows not a whole chunk
    let shapes = [
        (40, 64, 32, false),
        (33, 128, 64, true),
        (70, 96, 96, false),
        (64, 256, 32, true),
    ];
    for (i, &(n, k, g, shuffled)) in shapes.iter().enumerate() {
        let o = Owned::new(n, k, g, shuffled, 100 + i as u64);
        let w = o.dense();
        for t in [1, 3, GEMM_MIN_TOKENS - 1, GEMM_MIN_TOKENS, 37] {
            let mut r = Rng(7 + t as u64);
            let x: Vec<f32> = (0..t * k).map(|_| r.f32()).collect();
            for isa in Isa::available() {
                let mut y = vec![f32::NAN; t * n];
                matmul_int4(isa, &x, &o.matrix(), &mut y, &mut Int4Scratch::default());
                for ti in 0..t {
                    for j in 0..n {
                        let (xr, wr) = (&x[ti * k..][..k], &w[j * k..][..k]);
                        let want: f64 = xr.iter().zip(wr).map(|(a, b)| *a as f64 * *b as f64).sum();
                        let mag: f64 = xr
                            .iter()
                            .zip(wr)
                            .map(|(a, b)| (*a as f64 * *b as f64).abs())
                            .sum();
                        let got = y[ti * n + j] as f64;
                        assert!(
                            (got - want).abs() <= 1e-6 * mag + 1e-7,
                            "{isa:?} [{n}, {k}] g{g} t{t}: y[{ti}][{j}] = {got}, want {want}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn a_tokens_bits_do_not_depend_on_the_others_below_the_gemm() {
    let o = Owned::new(50, 128, 32, true, 3);
    let mut r = Rng(11);
    let x: Vec<f32> = (0..5 * 128).map(|_| r.f32()).collect();
    let isa = Isa::best();
    let mut all = vec![0f32; 5 * 50];
    matmul_int4(isa, &x, &o.matrix(), &mut all, &mut Int4Scratch::default());
    let mut one = vec![0f32; 50];
    matmul_int4(
        isa,
        &x[2 * 128..3 * 128],
        &o.matrix(),
        &mut one,
        &mut Int4Scratch::default(),
    );
    assert_eq!(one, all[2 * 50..3 * 50]);
}
