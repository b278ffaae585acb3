//! The rounding rules [`super::solve::solve`] compensates: FP8 e4m3 at
//! given row scales, and GPTQ's symmetric 4-bit grid with a scale per
//! group of a row found as the solver reaches the group.
//!
//! Contract: a [`Grid`] rounds one weight of one row at a time, given the
//! row's current (error-compensated) weights in the order the solver takes
//! the columns: the code and its dequantised value, from which the solver
//! computes the error it spreads. A row carries its own state from column
//! to column ([`Grid::Row`]: the scales found so far), so rows run in
//! parallel. [`Grid::span`] columns (a group) are rounded against one
//! scale found from all of them; the solver makes its blocks whole spans
//! so that every column of a group holds the errors of all the columns
//! before it when the scale is found.
//!
//! [`Int4Grid`] follows AutoGPTQ / GPTQModel with `static_groups: false`:
//! the scale of a group is fixed when the solver reaches its first column,
//! from the group's weights at that moment ([`checkpoint::int4::grid_of`]:
//! `2 max|w| / 15` rounded to f16, zero 8). They read those weights from
//! the matrix updated only up to the current block; here a group inside a
//! block also holds the updates of the block's earlier columns (with the
//! default group and block of 128 the two agree).

use checkpoint::int4::{self, SYM_ZERO};
use ops::fp8;

/// A rounding rule of the GPTQ solver (see the module doc).
pub trait Grid: Sync {
    /// What a row carries from column to column (and gives back at the end).
    type Row: Send;
    /// Columns rounded against one scale found from all of them (1: none).
    fn span(&self) -> usize {
        1
    }
    /// Row `r`'s state before its first column.
    fn start(&self, r: usize) -> Self::Row;
    /// Column `i` of a row whose current weights are `w` (`[k]`, in the
    /// solver's order): its code and that code's value.
    fn round(&self, row: &mut Self::Row, w: &[f64], i: usize) -> (u8, f64);
}

/// FP8 e4m3 at one scale per row (`[n]`), saturating at 448.
pub struct Fp8Grid<'a> {
    pub scales: &'a [f32],
}

impl Grid for Fp8Grid<'_> {
    type Row = f32;

    fn start(&self, r: usize) -> f32 {
        self.scales[r]
    }

    fn round(&self, s: &mut f32, w: &[f64], i: usize) -> (u8, f64) {
        let q = fp8::encode(w[i] as f32 / *s);
        (q, fp8::decode(q) as f64 * *s as f64)
    }
}

/// GPTQ's symmetric 4-bit grid, `group` columns a scale (codes `0..=15`
/// around zero 8): a row's state is its scales so far, `[k / group]` at
/// the end.
pub struct Int4Grid {
    pub group: usize,
}

impl Grid for Int4Grid {
    type Row = Vec<f32>;

    fn span(&self) -> usize {
        self.group
    }

    fn start(&self, _r: usize) -> Vec<f32> {
        Vec::new()
    }

    fn round(&self, scales: &mut Vec<f32>, w: &[f64], i: usize) -> (u8, f64) {
        if i.is_multiple_of(self.group) {
            let g: Vec<f32> = w[i..(i + self.group).min(w.len())]
                .iter()
                .map(|&v| v as f32)
                .collect();
            scales.push(int4::grid_of(&g, true).0);
        }
        let s = scales.last().copied().unwrap_or(1.0);
        let q = int4::encode(w[i] as f32, s, SYM_ZERO);
        (q, int4::decode(q, s, SYM_ZERO) as f64)
    }
}
