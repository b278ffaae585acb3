//! Embedding lookup and row gather.
//! Costs: one copy (and BF16 widening) per gathered element.

use half::bf16;
use half::slice::HalfFloatSliceExt;

/// `out[t, :] = table[ids[t], :]` widened to f32: `table` `[vocab, hidden]`,
/// `ids` `[T]` (each below `vocab`; checked by the caller), result `[T, hidden]`.
pub fn embed(table: &[bf16], ids: &[u32], hidden: usize) -> Vec<f32> {
    let mut out = vec![0f32; ids.len() * hidden];
    for (row, &id) in out.chunks_exact_mut(hidden).zip(ids) {
        table[id as usize * hidden..][..hidden].convert_to_f32_slice(row);
    }
    out
}

/// `out[r, :] = src[rows[r], :]`: `src` `[*, width]`, result `[rows.len(), width]`.
pub fn gather_rows<T: Copy>(src: &[T], rows: &[usize], width: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(rows.len() * width);
    for &r in rows {
        out.extend_from_slice(&src[r * width..(r + 1) * width]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embed_and_gather() {
        let table: Vec<bf16> = (0..6).map(|i| bf16::from_f32(i as f32)).collect();
        assert_eq!(embed(&table, &[2, 0], 2), vec![4.0, 5.0, 0.0, 1.0]);
        assert_eq!(
            gather_rows(&[1, 2, 3, 4, 5, 6], &[2, 2, 0], 2),
            vec![5, 6, 5, 6, 1, 2]
        );
    }
}
