//! `y = x @ W^T` for weights kept in ggml's quantised blocks (Q8_0, Q4_1,
//! Q4_K, Q6_K) and f32 activations: the CPU backend's quantised
//! projections.
//!
//! Contract: a weight matrix `[out, inp]` is `out` rows of `inp /
//! block_len` blocks each, in ggml's byte layout, exactly as a GGUF file
//! stores them (nothing is converted at load):
//! - Q8_0: 34 bytes per 32 weights: f16 scale `d`, 32 × i8 `q`; `w = d·q`.
//! - Q4_1: 20 bytes per 32 weights: f16 `d`, f16 `m`, 16 bytes of nibbles
//!   (weight `j < 16` the low nibble of byte `j`, weight `j + 16` its high
//!   nibble); `w = d·q + m`.
//! - Q4_K: 144 bytes per super-block of 256 weights ([`q4k`]): f16 `d` and
//!   `dmin`, eight 6-bit scales `sc` and minimums `mn` packed in 12 bytes,
//!   128 bytes of nibbles; sub-block `s` of 32 weights is `w = d·sc_s·q −
//!   dmin·mn_s`, so per 32 weights it is Q4_1 with `(d·sc_s, −dmin·mn_s)`
//!   for `(d, m)`, and every kernel below treats it so.
//! - Q6_K: 210 bytes per super-block of 256 weights ([`q6k`]): 6-bit
//!   values `q` in low and high bit planes, an i8 scale `sc` per 16, f16
//!   `d`; `w = d·sc·(q − 32)`.
//!
//! [`matmul_quant`] works as llama.cpp does, with 16-bit activations where
//! llama.cpp uses 8: each activation row is first quantised per block of 32
//! (per 256 for Q4_K; [`QuantActs`]: scale `dx = max|x| / 32767`, `qx =
//! round(x / dx)` in i16, and per 32 `sx = dx · Σ qx` for the offset
//! term), then every output is a sum over blocks of integer dot products,
//! `Σ_b dw·dx·(Σ q·qx) (+ m·sx)`, with f32 accumulation (Q4_K sums a whole
//! super-block in integers first: [`q4k`]). (8-bit activations moved
//! SmolLM2's teacher-forced log-probabilities by up to 0.23 nats from the
//! f32 product; 16-bit ones keep them within the BF16 path's error, for
//! twice the integer multiplies: Q8_0 and Q4_1 decode, bound by the
//! weights' memory traffic, does not notice; Q4_K's row kernel is
//! compute-bound at about 3/4 of the memory's rate.) The integer dot products run on the best
//! path the processor has ([`Kernel`]: AVX-512 VNNI `vpdpwssd`, else AVX2
//! `vpmaddwd`, else portable code); every path computes the same integer
//! sums and differs from the portable one only in the order of the f32
//! additions. The result differs from the product with the exact
//! activations by the activations' 16-bit rounding (`1.5e-5` of a
//! group's largest value per element at most).
//!
//! Every token row is computed the same way whatever else its step holds
//! (no regime switch at a token count, unlike the BF16 product): the
//! activations' rounding turns any difference in the last bits into one of
//! about `1e-5`, enough to change a sampled token, so a sequence's logits
//! must not depend on its batch (a request's `n` choices equal single
//! requests).
//!
//! [`gemm::matmul_quant_gemm`] computes the same integer sums as a GEMM
//! (outputs in the vector lanes, each block's weights unpacked once per
//! call for every token): 4x faster for many tokens, with another order of
//! the f32 additions, so the CPU backend runs it for prompt tokens only
//! (every prompt token, whatever its step holds).
//!
//! [`x16`] holds Q4_1 and Q8_0 matrices in 16-row panels for AVX-512 VNNI:
//! its row product (`x16::matmul_x16`) takes the generated rows' place,
//! and the GEMM reads the panels too (`gemm::matmul_panels_gemm`, the same
//! bits as over the blocks), so a model keeps one copy of its weights.
//!
//! Costs: `T * inp` quantisations per call (in parallel for long steps),
//! then `T * out * inp` 16-bit multiply-adds; the weights are read once per
//! call (a weight row is reused from L1 for every token). Work is split
//! over weight rows on rayon. No allocation except the growth of the
//! caller's [`QuantActs`].

mod dot;
pub mod gemm;
pub mod q4k;
pub mod q6k;
pub mod x16;

use crate::OutPtr;
use crate::isa::Isa;
use half::f16;
use rayon::prelude::*;

pub use dot::Kernel;
use dot::TILE;

/// Weights per block of Q8_0 and Q4_1, per sub-block of Q4_K, and per
/// block of quantised activations.
pub const QK: usize = 32;
/// The largest quantised activation value.
const ACT_MAX: f32 = 32767.0;

/// The largest rounding of one activation by [`QuantActs`], relative to its
/// group's largest value (`0.5 / 32767`): what every quantised product
/// may move an input by, whichever path computes it.
pub const ACT_ROUNDING: f64 = 0.5 / ACT_MAX as f64;
/// `1.5 * 2^23`: adding and subtracting it rounds an f32 of magnitude below
/// `2^22` to the nearest integer.
const ROUNDER: f32 = 12_582_912.0;
/// Below this many multiply-adds a product runs on the calling thread.
const PARALLEL_MIN_WORK: usize = 1 << 16;
/// From this many activations [`QuantActs::quantize`] runs on rayon.
const PARALLEL_QUANTIZE: usize = 1 << 14;

/// A quantised block format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum QuantType {
    /// 8-bit weights with one f16 scale per 32.
    Q8_0,
    /// 4-bit weights with an f16 scale and an f16 minimum per 32.
    Q4_1,
    /// 4-bit weights in super-blocks of 256: 6-bit scales and minimums per
    /// 32 under two f16 ones.
    Q4_K,
    /// 6-bit weights in super-blocks of 256: an i8 scale per 16 under an
    /// f16 one.
    Q6_K,
}

impl QuantType {
    /// Weights per block (a row is a whole number of blocks).
    pub const fn block_len(self) -> usize {
        match self {
            QuantType::Q8_0 | QuantType::Q4_1 => QK,
            QuantType::Q4_K => q4k::QK_K,
            QuantType::Q6_K => q6k::QK_K,
        }
    }

    /// Bytes of one block of [`Self::block_len`] weights.
    pub const fn block_bytes(self) -> usize {
        match self {
            QuantType::Q8_0 => 34,
            QuantType::Q4_1 => 20,
            QuantType::Q4_K => q4k::BLOCK_BYTES,
            QuantType::Q6_K => q6k::BLOCK_BYTES,
        }
    }

    /// Bytes of a `[rows, cols]` matrix (`cols` a multiple of
    /// [`Self::block_len`]).
    pub const fn matrix_bytes(self, rows: usize, cols: usize) -> usize {
        rows * (cols / self.block_len()) * self.block_bytes()
    }

    /// Whether weights are `d·q + m` (Q4_1, Q4_K) rather than `d·q`: the
    /// product then adds `m·sx` per block of [`QK`].
    pub const fn has_min(self) -> bool {
        matches!(self, QuantType::Q4_1 | QuantType::Q4_K)
    }

    /// ggml's name of the type.
    pub fn name(self) -> &'static str {
        match self {
            QuantType::Q8_0 => "Q8_0",
            QuantType::Q4_1 => "Q4_1",
            QuantType::Q4_K => "Q4_K",
            QuantType::Q6_K => "Q6_K",
        }
    }
}

/// Activation rows quantised to 16 bits (ggml's Q8_1 with i16 values,
/// held as three arrays), one scale per group of [`QK`] values, or of 256
/// for Q4_K ([`QuantType::act_group`]); reused call after call.
#[derive(Default)]
pub struct QuantActs {
    /// `[T, inp]` the 16-bit values.
    q: Vec<i16>,
    /// `[T, inp / QK]` each block's scale `d` (its group's) and `d · Σ q`.
    ds: Vec<[f32; 2]>,
    /// `[T, inp / QK]` each block's `d · Σ q` again, contiguous: the K
    /// types' row kernels load eight at once (taking them out of `ds`'s
    /// pairs cost them 10 % in shuffles).
    sx: Vec<f32>,
    blocks: usize,
    group: usize,
}

/// One quantised activation row, as the dot products read it.
#[derive(Clone, Copy)]
pub struct ActsRow<'a> {
    /// `[blocks * QK]`
    pub q: &'a [i16],
    /// `[blocks]` each block's scale `d` and `d · Σ q`.
    pub ds: &'a [[f32; 2]],
    /// `[blocks]` each block's `d · Σ q` (as in `ds`).
    pub sx: &'a [f32],
    /// Values sharing one scale (a multiple of [`QK`]).
    pub group: usize,
}

impl QuantType {
    /// Activation values per scale for products with this type: 256 for
    /// Q4_K (its kernels then sum a whole super-block in integers, each
    /// sub-block's weights times its 6-bit scale), else [`QK`].
    pub const fn act_group(self) -> usize {
        match self {
            QuantType::Q4_K | QuantType::Q6_K => q4k::QK_K,
            QuantType::Q8_0 | QuantType::Q4_1 => QK,
        }
    }

    /// Weights per scale in the prompt GEMM's panels: 16 for Q6_K (its
    /// scales are per 16), else [`QK`].
    pub const fn scale_len(self) -> usize {
        match self {
            QuantType::Q6_K => 16,
            _ => QK,
        }
    }
}

impl QuantActs {
    /// Quantises `x` (`[T, inp]`, `inp` a multiple of [`QK`]) into `self`,
    /// one scale per block of [`QK`].
    pub fn quantize(&mut self, x: &[f32], inp: usize) {
        self.quantize_grouped(x, inp, QK);
    }

    /// Quantises `x` (`[T, inp]`, `inp` a multiple of `group`, itself a
    /// multiple of [`QK`]) into `self`, one scale per `group` values: `d =
    /// max|x| / 32767` over the group, `q = round(x / d)`, and per block of
    /// [`QK`] `d · Σ q`.
    pub fn quantize_grouped(&mut self, x: &[f32], inp: usize, group: usize) {
        assert!(
            group > 0
                && group.is_multiple_of(QK)
                && inp > 0
                && inp.is_multiple_of(group)
                && x.len().is_multiple_of(inp),
            "x is not [T, {inp}] with {inp} a multiple of {group} (a multiple of {QK})"
        );
        let blocks = x.len() / QK;
        self.q.resize(x.len(), 0);
        self.ds.resize(blocks, [0.0; 2]);
        self.sx.resize(blocks, 0.0);
        self.blocks = inp / QK;
        self.group = group;
        // one group: its values, 16-bit values, block scales and sums
        type Group<'a> = (
            ((&'a [f32], &'a mut [i16]), &'a mut [[f32; 2]]),
            &'a mut [f32],
        );
        let one = |(((xg, qg), dg), sg): Group<'_>| {
            let amax = xg.iter().fold(0f32, |m, v| m.max(v.abs()));
            let scale = amax / ACT_MAX;
            let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
            let blocks = xg.chunks_exact(QK).zip(qg.chunks_exact_mut(QK));
            for (((xb, qb), ds), sx) in blocks.zip(dg).zip(sg) {
                let mut sum = 0i32;
                for (q, &v) in qb.iter_mut().zip(xb) {
                    // round to nearest (ties to even) by the 1.5 * 2^23
                    // trick: branch-free and vectorised, exact for |v *
                    // inv| <= 32767
                    let r = ((v * inv + ROUNDER) - ROUNDER) as i32;
                    *q = r as i16;
                    sum += r;
                }
                *ds = [scale, scale * sum as f32];
                *sx = ds[1];
            }
        };
        // each group on its own: the same values on any number of threads
        let per = group / QK;
        if x.len() >= PARALLEL_QUANTIZE {
            x.par_chunks_exact(group)
                .zip(self.q.par_chunks_exact_mut(group))
                .zip(self.ds.par_chunks_exact_mut(per))
                .zip(self.sx.par_chunks_exact_mut(per))
                .with_min_len(64 / per)
                .for_each(one);
        } else {
            x.chunks_exact(group)
                .zip(self.q.chunks_exact_mut(group))
                .zip(self.ds.chunks_exact_mut(per))
                .zip(self.sx.chunks_exact_mut(per))
                .for_each(one);
        }
    }

    /// Row `n` of the last quantisation.
    pub fn row(&self, n: usize) -> ActsRow<'_> {
        let b = self.blocks;
        ActsRow {
            q: &self.q[n * b * QK..(n + 1) * b * QK],
            ds: &self.ds[n * b..(n + 1) * b],
            sx: &self.sx[n * b..(n + 1) * b],
            group: self.group,
        }
    }
}

/// Checks the shapes of a quantised product (`x` `[T, inp]`, `w` `[out,
/// inp]` in `qt` blocks, `y` `[T, out]`, `inp` a whole number of blocks),
/// panicking on a caller bug; `Some((T, bytes per weight row))` unless the
/// product is empty.
fn check_shapes(
    x: &[f32],
    w: &[u8],
    qt: QuantType,
    inp: usize,
    out: usize,
    y: &[f32],
) -> Option<(usize, usize)> {
    let bl = qt.block_len();
    assert!(
        inp > 0 && inp.is_multiple_of(bl) && x.len().is_multiple_of(inp),
        "x is not [T, {inp}] with {inp} a multiple of {bl} ({qt:?})"
    );
    let t = x.len() / inp;
    let row_bytes = qt.matrix_bytes(1, inp);
    assert_eq!(
        w.len(),
        out * row_bytes,
        "w is not [{out}, {inp}] of {qt:?}"
    );
    assert_eq!(y.len(), t * out, "y is not [{t}, {out}]");
    (t > 0 && out > 0).then_some((t, row_bytes))
}

/// `y = x @ W^T` (see the module doc): `x` `[T, inp]`, `w` `[out, inp]` in
/// `qt` blocks, `y` `[T, out]`. Panics if the lengths disagree or `inp` is
/// not a whole number of blocks (a caller bug: loaders check shapes).
#[allow(clippy::too_many_arguments)]
pub fn matmul_quant(
    isa: Isa,
    x: &[f32],
    w: &[u8],
    qt: QuantType,
    inp: usize,
    out: usize,
    y: &mut [f32],
    acts: &mut QuantActs,
) {
    let Some((t, row_bytes)) = check_shapes(x, w, qt, inp, out, y) else {
        return;
    };
    acts.quantize_grouped(x, inp, qt.act_group());
    let acts = &*acts;
    let kernel = Kernel::pick(isa); // supported by construction
    let threads = rayon::current_num_threads();
    let per_task = if t * out * inp < PARALLEL_MIN_WORK || threads == 1 {
        out
    } else {
        out.div_ceil(threads * 8).max(1)
    };
    let tasks = out.div_ceil(per_task);
    let yp = OutPtr(y.as_mut_ptr());
    let run = |task: usize| {
        let (r0, r1) = (task * per_task, ((task + 1) * per_task).min(out));
        let wr = &w[r0 * row_bytes..r1 * row_bytes];
        // SAFETY: n < t and r0 <= r1 <= out, so the range is inside `y`
        // [t, out]; rows r0..r1 belong to this task only (see OutPtr),
        // and each token's range is taken once per pass.
        let y_of = |n: usize| unsafe {
            std::slice::from_raw_parts_mut(yp.get().add(n * out + r0), r1 - r0)
        };
        let mut n = 0;
        while n + TILE <= t {
            let a: [ActsRow<'_>; TILE] = std::array::from_fn(|j| acts.row(n + j));
            let mut ys: [&mut [f32]; TILE] = std::array::from_fn(|j| y_of(n + j));
            kernel.tile_supported(qt, wr, &a, &mut ys);
            n += TILE;
        }
        for n in n..t {
            kernel.rows_supported(qt, wr, acts.row(n), y_of(n));
        }
    };
    if tasks == 1 {
        run(0);
    } else {
        (0..tasks).into_par_iter().for_each(run);
    }
}

/// `f(u, d, m)` for every scale unit `u` ([`QuantType::scale_len`]
/// weights) of `row`, in order: Q4_K's sub-blocks, Q6_K's groups of 16
/// (`m` is 0 for Q8_0 and Q6_K): weight `i` of the unit is `d·q_i + m`
/// (Q6_K: `q − 32`). A super-block's scales are unpacked once.
fn for_each_unit(qt: QuantType, row: &[u8], mut f: impl FnMut(usize, f32, f32)) {
    let f16_at = |b: &[u8], i: usize| f16::from_le_bytes([b[i], b[i + 1]]).to_f32();
    let per = qt.block_len() / qt.scale_len();
    for (b, wb) in row.chunks_exact(qt.block_bytes()).enumerate() {
        match qt {
            QuantType::Q8_0 => f(b, f16_at(wb, 0), 0.0),
            QuantType::Q4_1 => f(b, f16_at(wb, 0), f16_at(wb, 2)),
            QuantType::Q4_K => {
                let (d, dmin) = (f16_at(wb, 0), f16_at(wb, 2));
                let (sc, mn) = q4k::scales_mins(&wb[4..16]);
                for s in 0..per {
                    f(b * per + s, d * sc[s] as f32, -dmin * mn[s] as f32);
                }
            }
            QuantType::Q6_K => {
                for h in 0..per {
                    f(b * per + h, q6k::half_scale(wb, h), 0.0);
                }
            }
        }
    }
}

/// Quantises `row` (a whole number of `qt` blocks) into `qt` blocks
/// appended to `out`, as ggml's reference quantisers do (Q8_0: `d =
/// max|x| / 127`, `q = round(x / d)`; Q4_1: `d = (max - min) / 15`, `m =
/// min`, `q = round((x - m) / d)` clamped to 15; Q4_K: see
/// [`q4k::quantize_block`]).
pub fn quantize_row(qt: QuantType, row: &[f32], out: &mut Vec<u8>) {
    let bl = qt.block_len();
    assert!(row.len().is_multiple_of(bl), "row is not whole blocks");
    for b in row.chunks_exact(bl) {
        match qt {
            QuantType::Q8_0 => {
                let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
                let d = amax / 127.0;
                let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
                out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
                out.extend(b.iter().map(|&v| (v * inv).round() as i8 as u8));
            }
            QuantType::Q4_1 => {
                let min = b.iter().copied().fold(f32::INFINITY, f32::min);
                let max = b.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let d = (max - min) / 15.0;
                let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
                out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
                out.extend_from_slice(&f16::from_f32(min).to_le_bytes());
                let q = |v: f32| (((v - min) * inv + 0.5) as u8).min(15);
                out.extend((0..QK / 2).map(|j| q(b[j]) | (q(b[j + QK / 2]) << 4)));
            }
            QuantType::Q4_K => q4k::quantize_block(b, out),
            QuantType::Q6_K => q6k::quantize_block(b, out),
        }
    }
}

/// Dequantises one row of `qt` blocks into `out` (`blocks * block_len`
/// values).
pub fn dequantize_row(qt: QuantType, row: &[u8], out: &mut [f32]) {
    let (bb, bl) = (qt.block_bytes(), qt.block_len());
    assert_eq!(row.len() / bb * bl, out.len(), "row and output disagree");
    let f16_at = |b: &[u8], i: usize| f16::from_le_bytes([b[i], b[i + 1]]).to_f32();
    for (b, o) in row.chunks_exact(bb).zip(out.chunks_exact_mut(bl)) {
        match qt {
            QuantType::Q8_0 => {
                let d = f16_at(b, 0);
                for (o, &q) in o.iter_mut().zip(&b[2..]) {
                    *o = d * q as i8 as f32;
                }
            }
            QuantType::Q4_1 => {
                let (d, m) = (f16_at(b, 0), f16_at(b, 2));
                for j in 0..QK / 2 {
                    o[j] = d * (b[4 + j] & 15) as f32 + m;
                    o[j + QK / 2] = d * (b[4 + j] >> 4) as f32 + m;
                }
            }
            QuantType::Q4_K => q4k::dequantize_block(b, o),
            QuantType::Q6_K => q6k::dequantize_block(b, o),
        }
    }
}

#[cfg(test)]
mod tests;
