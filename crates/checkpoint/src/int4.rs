//! Group-wise 4-bit integer projections (W4A16): the one stored form of
//! the hub's AWQ, GPTQ and compressed-tensors `pack-quantized` checkpoints.
//!
//! Contract of [`Int4Tensor`] (what every consumer reads):
//! - `[rows, cols]` = `[out, in]`, Hugging Face's row order; `cols` a
//!   multiple of [`BLOCK`], `group` a multiple of [`BLOCK`] that divides
//!   `cols` (a whole row is one group for GPTQ's `group_size: -1` and
//!   compressed-tensors' `channel` strategy).
//! - `data` `[rows, cols / 2]`: each row in blocks of [`BLOCK`] codes of
//!   16 bytes, byte `j` of a block holding the block's code `j` in its low
//!   nibble and code `j + 16` in its high one (ggml's Q4 order, which the
//!   CPU and CUDA kernels widen with two masks and no shuffle).
//! - `scale`, `zero` `[rows, cols / group]`: a stored column `c` of row
//!   `r` is `w = (q - zero[r][c / group]) * scale[r][c / group]` in f32
//!   (one rounding: `q - zero` is exact); `zero` in `0..=15` (8 for the
//!   symmetric schemes, whose signed codes are `q - 8`).
//! - `perm` (GPTQ's `desc_act`, whose groups are not contiguous in the
//!   input): stored column `c` is input column `perm[c]`, `perm` a
//!   permutation of `0..cols` sorting the input columns by group, so that
//!   every group is contiguous in the stored order. A product multiplies
//!   the *permuted activation*: `y[r] = sum_c w[r][c] * x[perm[c]]` (the
//!   CPU gathers `x` once per call; the CUDA upload permutes it the same
//!   way before the GEMV). Without `perm` stored column `c` is input
//!   column `c`.
//!
//! [`Int4Tensor::to_f32_rows`] gives the weights in input-column order,
//! `W[r][perm[c]] = w[r][c]`, exactly.
//!
//! Reading the three layouts is [`read`] (the refusals name the file, the
//! tensor and the field or value); writing one (GPTQ's) is [`write`].
//!
//! Costs: 0.5 byte per weight plus 5 bytes per group of a row (f32 scale,
//! u8 zero), and 4 bytes per input column with `perm`.

pub mod read;
pub mod write;

pub use read::{Int4Layout, Int4Scheme, int4_scheme};

use crate::weights::Tensor;

/// Codes per nibble block (16 bytes): a row and a group are whole blocks.
pub const BLOCK: usize = 32;
/// The largest 4-bit code.
pub const MAX_CODE: u8 = 15;
/// The zero of a symmetric scheme (signed codes `q - 8`).
pub const SYM_ZERO: u8 = 8;

/// One projection in group-wise 4-bit codes (see the module doc).
#[derive(Debug, Clone, PartialEq)]
pub struct Int4Tensor {
    /// Hugging Face name (`….weight`).
    pub name: String,
    pub rows: usize,
    pub cols: usize,
    /// Stored columns per scale and zero.
    pub group: usize,
    pub data: Vec<u8>,   // [rows, cols / 2] nibble blocks
    pub scale: Vec<f32>, // [rows, cols / group]
    pub zero: Vec<u8>,   // [rows, cols / group] 0..=15
    /// `[cols]` the input column of each stored column (GPTQ `desc_act`).
    pub perm: Option<Vec<u32>>,
}

/// Where code `c` of a row sits: its byte in the row and whether it is
/// the high nibble (the module doc's block order).
pub fn nibble_at(c: usize) -> (usize, bool) {
    let (b, j) = (c / BLOCK, c % BLOCK);
    (b * BLOCK / 2 + j % (BLOCK / 2), j >= BLOCK / 2)
}

/// `codes` (one row, each `0..=15`, a whole number of blocks) packed into
/// nibble blocks, appended to `out`.
pub fn pack_row(codes: &[u8], out: &mut Vec<u8>) {
    for block in codes.chunks_exact(BLOCK) {
        let (lo, hi) = block.split_at(BLOCK / 2);
        out.extend(lo.iter().zip(hi).map(|(l, h)| (l & 0xF) | (h << 4)));
    }
}

impl Int4Tensor {
    /// Groups per row.
    pub fn groups(&self) -> usize {
        self.cols / self.group.max(1)
    }

    /// Code `c` (stored order) of row `r`.
    pub fn code(&self, r: usize, c: usize) -> u8 {
        let (byte, high) = nibble_at(c);
        let b = self.data[r * self.cols / 2 + byte];
        if high { b >> 4 } else { b & 0xF }
    }

    /// Why the fields do not make the module doc's layout, if they do not.
    pub fn layout_error(&self) -> Option<String> {
        let (n, k, g) = (self.rows, self.cols, self.group);
        if k == 0 || !k.is_multiple_of(BLOCK) {
            return Some(format!("{k} input columns are not whole blocks of {BLOCK}"));
        }
        if g == 0 || !g.is_multiple_of(BLOCK) || !k.is_multiple_of(g) {
            return Some(format!(
                "a group of {g} columns does not divide {k} columns in whole blocks of {BLOCK}"
            ));
        }
        let groups = n * (k / g);
        if self.data.len() != n * k / 2 || self.scale.len() != groups || self.zero.len() != groups {
            return Some(format!(
                "{} code bytes, {} scales and {} zeros do not make [{n}, {k}] in groups of {g}",
                self.data.len(),
                self.scale.len(),
                self.zero.len()
            ));
        }
        if let Some(z) = self.zero.iter().find(|&&z| z > MAX_CODE) {
            return Some(format!("holds zero point {z}, outside 0..={MAX_CODE}"));
        }
        if let Some(p) = &self.perm
            && !is_permutation(p, k)
        {
            return Some(format!("its column order is not a permutation of 0..{k}"));
        }
        None
    }

    /// The weights in input-column order, f32 `[rows * cols]` (module doc).
    pub fn to_f32_rows(&self) -> Vec<f32> {
        let (k, groups) = (self.cols, self.groups());
        let mut out = vec![0f32; self.rows * k];
        for (r, row) in out.chunks_exact_mut(k.max(1)).enumerate() {
            for c in 0..k {
                let at = r * groups + c / self.group;
                let q = f32::from(self.code(r, c)) - f32::from(self.zero[at]);
                let col = self.perm.as_ref().map_or(c, |p| p[c] as usize);
                row[col] = q * self.scale[at];
            }
        }
        out
    }

    /// `t` (`[n, k]`) rounded to nearest on GPTQ's 4-bit grid, `group`
    /// columns a scale ([`grid_of`]), scales rounded to f16 (the layout's
    /// storage) first.
    pub fn round_to_nearest(t: &Tensor, group: usize, sym: bool) -> Int4Tensor {
        let (n, k) = (t.shape[0], t.shape[1]);
        let w = t.to_f32();
        let (scale, zero) = grids(&w, n, k, group, sym);
        let groups = k / group;
        let mut codes = vec![0u8; n * k];
        for (r, row) in codes.chunks_exact_mut(k).enumerate() {
            for (c, q) in row.iter_mut().enumerate() {
                let at = r * groups + c / group;
                *q = encode(w[r * k + c], scale[at], zero[at]);
            }
        }
        Int4Tensor::from_codes(&t.name, n, k, group, &codes, scale, zero)
    }

    /// A tensor from one code per byte (`codes` `[n, k]`, input order) and
    /// its grids (`[n, k / group]`).
    pub fn from_codes(
        name: &str,
        n: usize,
        k: usize,
        group: usize,
        codes: &[u8],
        scale: Vec<f32>,
        zero: Vec<u8>,
    ) -> Int4Tensor {
        let mut data = Vec::with_capacity(n * k / 2);
        for row in codes.chunks_exact(k) {
            pack_row(row, &mut data);
        }
        Int4Tensor {
            name: name.to_string(),
            rows: n,
            cols: k,
            group,
            data,
            scale,
            zero,
            perm: None,
        }
    }
}

/// Whether `p` is a permutation of `0..k`.
fn is_permutation(p: &[u32], k: usize) -> bool {
    let mut seen = vec![false; k];
    p.len() == k
        && p.iter().all(|&i| {
            let i = i as usize;
            i < k && !std::mem::replace(&mut seen[i], true)
        })
}

/// GPTQ's 4-bit grid of the values `v` (one group): `(scale, zero)`, the
/// scale rounded to f16. Symmetric: `scale = 2 max|v| / 15`, zero 8 (codes
/// `-8..=7` around it); asymmetric: the range `[min(v, 0), max(v, 0)]`
/// over 15 steps, zero `round(-min / scale)`. An all-zero group gets scale 1.
pub fn grid_of(v: &[f32], sym: bool) -> (f32, u8) {
    let (lo, hi) = v
        .iter()
        .fold((0f32, 0f32), |(l, h), &x| (l.min(x), h.max(x)));
    let (lo, hi) = if sym {
        let m = hi.max(-lo);
        (-m, m)
    } else {
        (lo, hi)
    };
    let step = (hi - lo) / f32::from(MAX_CODE);
    let scale = if step > 0.0 && step.is_finite() {
        half::f16::from_f32(step)
            .to_f32()
            .max(f32::from(half::f16::MIN_POSITIVE))
    } else {
        1.0
    };
    let zero = if sym {
        SYM_ZERO
    } else {
        (-lo / scale).round().clamp(0.0, f32::from(MAX_CODE)) as u8
    };
    (scale, zero)
}

/// The grids of every group of `w` (`[n, k]`, `group` columns each):
/// `scale`, `zero` `[n, k / group]`.
pub fn grids(w: &[f32], n: usize, k: usize, group: usize, sym: bool) -> (Vec<f32>, Vec<u8>) {
    let (mut scale, mut zero) = (Vec::with_capacity(n * k / group), Vec::new());
    for g in w[..n * k].chunks_exact(group) {
        let (s, z) = grid_of(g, sym);
        scale.push(s);
        zero.push(z);
    }
    (scale, zero)
}

/// `x` on the grid `(scale, zero)`: the nearest code, clamped to `0..=15`.
pub fn encode(x: f32, scale: f32, zero: u8) -> u8 {
    ((x / scale).round() + f32::from(zero)).clamp(0.0, f32::from(MAX_CODE)) as u8
}

/// The value of code `q` on the grid `(scale, zero)`.
pub fn decode(q: u8, scale: f32, zero: u8) -> f32 {
    (f32::from(q) - f32::from(zero)) * scale
}

#[cfg(test)]
mod tests;
