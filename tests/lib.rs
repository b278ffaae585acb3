//! Shared helpers for the end-to-end tests.

/// `z - logsumexp(z)`: a row of logits as log-probabilities, in f64.
pub fn log_softmax(z: impl IntoIterator<Item = f64>) -> Vec<f64> {
    let z: Vec<f64> = z.into_iter().collect();
    let m = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let lse = m + z.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
    z.into_iter().map(|v| v - lse).collect()
}
