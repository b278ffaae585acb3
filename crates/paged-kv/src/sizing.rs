//! Memory sizing of the KV pool. A block holds, for every layer, a K and a V
//! vector of `num_kv_heads x head_dim` elements for each of its `block_size`
//! tokens: `layers x 2 x kv_heads x head_dim x dtype_bytes x block_size` bytes.
//! Both helpers are O(1) and never panic (overflow saturates).

/// Bytes one block takes across all layers (K and V). Takes the model's
/// numbers (e.g. `ModelConfig::{num_layers, num_kv_heads, head_dim}`);
/// saturates at `usize::MAX` instead of overflowing, which no budget fits.
pub fn bytes_per_block(
    num_layers: usize,
    num_kv_heads: usize,
    head_dim: usize,
    dtype_bytes: usize,
    block_size: usize,
) -> usize {
    [num_kv_heads, head_dim, dtype_bytes, block_size]
        .into_iter()
        .fold(num_layers.saturating_mul(2), usize::saturating_mul)
}

/// How many whole blocks of `bytes_per_block` fit in `budget_bytes`;
/// 0 when `bytes_per_block` is 0 (a degenerate model has nothing to size).
pub fn blocks_for_budget(budget_bytes: usize, bytes_per_block: usize) -> usize {
    budget_bytes.checked_div(bytes_per_block).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_3_2_1b_block_is_512_kib_in_bf16() {
        // 16 layers, 8 KV heads, head_dim 64, BF16, 16 tokens.
        let per = bytes_per_block(16, 8, 64, 2, 16);
        assert_eq!(per, 16 * 2 * 8 * 64 * 2 * 16);
        assert_eq!(per, 512 * 1024);
        assert_eq!(blocks_for_budget(10 * per + per - 1, per), 10);
    }

    #[test]
    fn degenerate_sizes_do_not_panic() {
        assert_eq!(blocks_for_budget(1 << 30, 0), 0);
        assert_eq!(bytes_per_block(usize::MAX, 2, 2, 2, 2), usize::MAX);
        assert_eq!(blocks_for_budget(1 << 40, usize::MAX), 0);
        assert_eq!(bytes_per_block(0, 8, 64, 2, 16), 0);
    }
}
