//! Shared helpers for the end-to-end tests.

/// `z - logsumexp(z)`: a row of logits as log-probabilities, in f64.
pub fn log_softmax(z: impl IntoIterator<Item = f64>) -> Vec<f64> {
    let z: Vec<f64> = z.into_iter().collect();
    let m = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let lse = m + z.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
    z.into_iter().map(|v| v - lse).collect()
}

/// The fast CPU backend over the weights in `dir` with `blocks` kept as
/// they are, its KV pool sized for one sequence of `tokens` tokens in
/// blocks of `block_size`.
pub fn fast_blocks_backend(
    dir: &std::path::Path,
    cfg: &contract::LlamaConfig,
    blocks: checkpoint::quantized::QuantWeights,
    tokens: usize,
    block_size: usize,
) -> model::cpu::CpuBackend {
    let weights = checkpoint::loader::load_weights(dir, cfg).unwrap_or_else(|e| panic!("{e}"));
    let kv = contract::KvShape {
        num_blocks: tokens.div_ceil(block_size),
        block_size,
    };
    model::cpu::CpuBackend::with_weights(
        cfg.clone(),
        weights,
        kv,
        model::cpu::CpuPath::Fast,
        model::cpu::CpuWeights::Blocks(blocks),
    )
    .unwrap_or_else(|e| panic!("{e}"))
}
