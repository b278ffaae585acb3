//! Causal attention of the calibration windows as two small GEMMs per
//! (window, head): the calibration pass's attention.
//!
//! Contract: [`causal_attention`] computes what [`ops::paged_attention`]
//! does for windows laid out one after another (token `i` of a window
//! attends to tokens `0..=i` of its window; GQA, scale `1 / sqrt(head_dim)`,
//! f32 softmax), up to the order of the additions: the scores `Q K^T` and
//! the sums `P V` by [`cpu_kernels::matmul::gemm_nt_f32`], the softmax by
//! [`cpu_kernels::vector::softmax_scaled`].
//!
//! Costs: per (window of `L` tokens, head) `L^2 head_dim` multiply-adds
//! twice (the masked half of the scores included), `4 L^2` bytes of
//! scores; tasks in parallel on rayon.

use cpu_kernels::Isa;
use cpu_kernels::matmul::gemm_nt_f32;
use cpu_kernels::vector::softmax_scaled;
use ops::AttnDims;
use rayon::prelude::*;

/// Attention of `q` (`[N, heads * head_dim]`) over `k`, `v` (`[N, kv_heads
/// * head_dim]`), RoPE applied, for windows `cu_seqlens` (`[S + 1]`
/// offsets): `[N, heads * head_dim]`.
pub(crate) fn causal_attention(
    isa: Isa,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    cu_seqlens: &[u32],
    dims: AttnDims,
) -> Vec<f32> {
    let (heads, hd) = (dims.heads, dims.head_dim);
    let (q_dim, kv_dim) = (heads * hd, dims.kv_heads * hd);
    let group = heads / dims.kv_heads;
    let tasks: Vec<(usize, usize)> = (0..cu_seqlens.len().saturating_sub(1))
        .flat_map(|s| (0..heads).map(move |h| (s, h)))
        .collect();
    let outs: Vec<Vec<f32>> = tasks
        .par_iter()
        .map(|&(s, h)| {
            let (start, end) = (cu_seqlens[s] as usize, cu_seqlens[s + 1] as usize);
            let len = end - start;
            let g = h / group;
            let qh = &q[start * q_dim + h * hd..];
            let kh = &k[start * kv_dim + g * hd..];
            let mut p = vec![0f32; len * len]; // [len, len] scores, then weights
            gemm_nt_f32(isa, qh, q_dim, len, kh, kv_dim, hd, len, &mut p, len);
            let scale = 1.0 / (hd as f32).sqrt();
            for (i, row) in p.chunks_exact_mut(len).enumerate() {
                softmax_scaled(isa, &mut row[..=i], scale);
                row[i + 1..].fill(0.0);
            }
            // [hd, len] this head's values, transposed
            let vt: Vec<f32> = (0..hd)
                .flat_map(|d| (start..end).map(move |j| v[j * kv_dim + g * hd + d]))
                .collect();
            let mut out = vec![0f32; len * hd]; // [len, hd]
            gemm_nt_f32(isa, &p, len, len, &vt, len, len, hd, &mut out, hd);
            out
        })
        .collect();
    let mut o = vec![0f32; q.len()]; // [N, q_dim]
    for (&(s, h), out) in tasks.iter().zip(&outs) {
        let start = cu_seqlens[s] as usize;
        for (i, row) in out.chunks_exact(hd).enumerate() {
            o[(start + i) * q_dim + h * hd..][..hd].copy_from_slice(row);
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use ops::PagedSeqs;

    #[test]
    fn equals_the_paged_reference() {
        let dims = AttnDims {
            heads: 4,
            kv_heads: 2,
            head_dim: 8,
        };
        let n = 37;
        let cu = [0u32, 16, 30, 37];
        let val = |i: usize, s: usize| ((i * 7919 + s) % 101) as f32 / 50.0 - 1.0;
        let q: Vec<f32> = (0..n * 32).map(|i| val(i, 1)).collect();
        let k: Vec<f32> = (0..n * 16).map(|i| val(i, 2)).collect();
        let v: Vec<f32> = (0..n * 16).map(|i| val(i, 3)).collect();
        let positions: Vec<u32> = (0..3).flat_map(|s| 0..cu[s + 1] - cu[s]).collect();
        let mut tables = vec![0u32; 3 * 16];
        for s in 0..3 {
            for j in 0..(cu[s + 1] - cu[s]) as usize {
                tables[s * 16 + j] = cu[s] + j as u32;
            }
        }
        let seqs = PagedSeqs {
            cu_seqlens: &cu,
            positions: &positions,
            block_tables: &tables,
            max_blocks: 16,
            block_size: 1,
        };
        let want = ops::paged_attention(&q, &k, &v, seqs, dims);
        for isa in [Isa::Portable, Isa::best()] {
            let got = causal_attention(isa, &q, &k, &v, &cu, dims);
            for (a, b) in got.iter().zip(&want) {
                assert!((a - b).abs() < 1e-5, "{isa:?}: {a} vs {b}");
            }
        }
    }
}
